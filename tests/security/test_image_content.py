"""Image content never reaches the host (SPEC §21, issue 34): what the executor reads back from an
image task (the agent patch, ``system_changes``, artifacts, the verifier's mount points) is read
inside the image's root and the evaluation's layer, from handles; a link in either is content,
never a way onto the host.

The end-to-end tests run a real agent in a real image pulled from the suite's registry
(tests/helpers/images.py), as tests/pipeline/test_images_e2e.py does.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from evaluations.images.changes import system_changes
from evaluations.runtime.idmap import IdMap
from tests.helpers.images import layer, member, push_image
from tests.pipeline.test_e2e import evaluate

BASE_CONFIG = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}
SECRET = "root-only host secret 7f3a\n"


@pytest.fixture
def config(image_task_config):
    return image_task_config


@pytest.fixture
def host_secret():
    """A root-only file of the host in a folder of the test's own, and that folder relative to /.
    Under /var/tmp: an image task's /tmp is the sandbox's own, so WorkingDir could not reach one there."""
    top = Path(tempfile.mkdtemp(prefix="te-image-content-", dir="/var/tmp"))
    folder = top / "srv/x"
    folder.mkdir(parents=True)
    secret = folder / "secret.txt"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    os.chown(secret, 0, 0)
    yield secret, str(folder).strip("/")
    shutil.rmtree(top)


# The agent, root in the image: /w (the image's link to /) becomes a real folder, and it writes
# secret.txt at the path WorkingDir names through it: the host file of that path is what the patch
# compared against when it followed the image's link on the host.
REPLACE_THE_LINK = """\
import os
folder = {folder!r}
os.unlink("/w")
os.makedirs("/w/" + folder)
with open("/w/" + folder + "/secret.txt", "w") as handle:
    handle.write("the agent's own\\n")
with open("mine.txt", "w") as handle:  # at the working directory, as the image resolves it
    handle.write("written at the working directory\\n")
print("cwd", os.getcwd())
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_workdir_through_an_image_link_to_the_root_never_shows_a_host_file(
    tasks, config, base_image, base_layer, host_secret
):
    """Issue 34 item 2: ``RUN mkdir -p <folder> && ln -s / /w`` and ``WORKDIR /w/<folder>``."""
    registry, _, _ = base_image
    secret, folder = host_secret
    parts = folder.split("/")
    members = [member("/".join(parts[: n + 1]) + "/", type="dir") for n in range(len(parts))]
    extra = layer(*members, member("w", type="symlink", target="/"))
    image = {**BASE_CONFIG, "WorkingDir": f"/w/{folder}"}
    pushed = push_image(registry, "test/link-to-root:latest", layers=[base_layer, extra], config=image)
    url = tasks.task(workspace="environment: {image: '" + pushed.ref + "'}\n", tests={"fail_to_pass_true.sh": "true\n"})
    evaluation = evaluate(url, REPLACE_THE_LINK.format(folder=folder), config=config, sandbox="bwrap")
    assert evaluation.status == "completed", (evaluation.error, evaluation.agent_output[-2000:])
    assert f"cwd /{folder}" in evaluation.agent_output  # the image's /w/<folder> is its /<folder>
    everything = "\n".join(
        str(value)
        for value in (
            evaluation.agent_patch,
            evaluation.agent_output,
            evaluation.test_output,
            evaluation.log,
            evaluation.error,
            evaluation.system_changes,
        )
    )
    assert SECRET.strip() not in everything
    patch = evaluation.agent_patch
    assert "diff --git a/mine.txt b/mine.txt\nnew file mode 100644\n" in patch
    assert "secret.txt" not in patch  # outside the working directory: a system change
    assert "/w" in evaluation.system_changes["paths"]
    assert secret.read_text() == SECRET and secret.stat().st_mode & 0o777 == 0o600


def test_system_changes_never_look_through_a_link_of_the_image(tmp_path, host_secret):
    """The image's /etc/conf.d is a link to a host folder (/w -> / and every absolute link, read
    on the host, names the host's); the agent replaced it with a folder of the same names, over
    files and a whiteout: what is reported comes from the two trees, never from the host's."""
    secret, _ = host_secret
    host = secret.parent
    (host / "present").mkdir()
    os.chmod(host / "present", 0o700)
    base, upper = tmp_path / "base", tmp_path / "upper"
    (base / "etc").mkdir(parents=True)
    os.symlink(host, base / "etc/conf.d")
    os.symlink("/", base / "w")
    (upper / "etc/conf.d/present").mkdir(parents=True)  # not opaque: compared with the image's
    (upper / "etc/conf.d/secret.txt").write_text("the agent's\n")
    os.mknod(upper / "etc/conf.d/gone", 0o600 | 0o020000, os.makedev(0, 0))
    (upper / "w" / str(host).strip("/")).mkdir(parents=True)
    found = system_changes(upper, base, IdMap(lease=0, base=0), workdir="/app", exclude=(), path_dirs=("/usr/bin",))
    # /etc/conf.d is new (the image had a link there), and so is all below it: the host folder's
    # "present" (0700, not the layer's 0755) is never compared, the whiteout hides nothing.
    assert found["paths"] == [
        "/etc/conf.d",
        "/etc/conf.d/present",
        "/etc/conf.d/secret.txt",
        "/w",
        *[f"/w/{'/'.join(str(host).strip('/').split('/')[: n + 1])}" for n in range(len(host.parts) - 1)],
    ]


def test_the_workdir_of_system_changes_is_resolved_in_the_image(tmp_path, host_secret):
    """WorkingDir /w/<folder> through the image's /w -> /: the agent's files there are its own
    (not system changes), and the host's folder of that path plays no part."""
    secret, folder = host_secret
    base, upper = tmp_path / "base", tmp_path / "upper"
    (base / folder).mkdir(parents=True)
    os.symlink("/", base / "w")
    (upper / folder).mkdir(parents=True)
    (upper / folder / "mine.txt").write_text("mine\n")
    found = system_changes(
        upper, base, IdMap(lease=0, base=0), workdir=f"/w/{folder}", exclude=(), path_dirs=("/usr/bin",)
    )
    assert found == {"count": 0, "paths": [], "suspicious": []}


def test_an_artifact_that_is_a_link_is_never_read_through(tmp_path, settings):
    """/logs/agent/x -> /etc and -> a host file: left out as links, nothing of theirs kept."""
    from evaluations import artifacts

    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    logs = tmp_path / "agent-logs"
    (logs / "sub").mkdir(parents=True)
    os.symlink("/etc", logs / "x")
    os.symlink(secret, logs / "sub/secret.txt")
    (logs / "sub/real.txt").write_text("kept\n")
    config = dataclasses.replace(settings.EXECUTOR, data_dir=tmp_path / "data")
    kept = artifacts.keep("00000000-0000-0000-0000-000000000034", logs, config, owner_uid=None)
    assert [entry["path"] for entry in kept.artifacts] == ["sub/real.txt"]
    assert {(o.path, o.reason) for o in kept.omitted} == {
        ("x", "a symbolic link"),
        ("sub/secret.txt", "a symbolic link"),
    }
    stored = Path(config.data_dir, "artifacts", "00000000-0000-0000-0000-000000000034")
    assert sorted(str(p.relative_to(stored)) for p in stored.rglob("*")) == ["sub", "sub/real.txt"]


def test_the_verifiers_mount_points_replace_what_the_agent_put_on_the_way(tmp_path, host_secret):
    """/logs a link to a host folder, /tests a file, /logs/verifier a link: each becomes a real
    folder of the image's root; the host's folder is neither written nor changed."""
    from evaluations.environments.kinds import make_mount_point
    from evaluations.runtime.types import ImageRoot

    secret, _ = host_secret
    host = secret.parent
    before = sorted(os.listdir(host)), host.stat().st_mode
    root = tmp_path / "rootfs"
    root.mkdir()
    os.symlink(host, root / "logs")
    (root / "tests").write_text("a file where /tests goes\n")
    idmap = IdMap(lease=200_000, base=300_000)
    image = ImageRoot(rootfs=root, idmap=idmap)
    make_mount_point(image, "/logs/verifier")
    make_mount_point(image, "/tests")
    (root / "logs/agent").symlink_to(host)
    make_mount_point(image, "/logs/agent")
    for folder in ("logs", "logs/verifier", "tests", "logs/agent"):
        st = os.lstat(root / folder)
        assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid) == (idmap.host_uid(0), idmap.host_gid(0)), folder
    assert (sorted(os.listdir(host)), host.stat().st_mode) == before


def test_a_workdir_is_made_inside_the_images_root_through_its_links(tmp_path, host_secret):
    """WorkingDir /w/<new> with the image's /w -> /: made as the image's /<new> (as a runtime
    resolves it), owned by the image's root; nothing made on the host."""
    from evaluations.environments.kinds import make_workdir
    from evaluations.runtime.types import ImageRoot

    secret, folder = host_secret
    root = tmp_path / "rootfs"
    root.mkdir()
    os.symlink("/", root / "w")
    idmap = IdMap(lease=200_000, base=300_000)
    make_workdir(ImageRoot(rootfs=root, idmap=idmap), f"/w/{folder}/made")
    made = root / folder / "made"
    st = os.lstat(made)
    assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_mode & 0o777) == (idmap.host_uid(0), 0o755)
    assert not (secret.parent / "made").exists()


def test_the_hosts_ca_bundle_is_written_only_to_the_images_own_file(tmp_path, host_secret):
    """The image's /etc/ssl/certs a link to a host folder holding ca-certificates.crt, then the file
    itself a link: the host's file is never written; the image's own regular file is."""
    from types import SimpleNamespace

    from evaluations.pipeline.imageenv import _trust_host_ca
    from evaluations.runtime.types import ImageRoot

    secret, _ = host_secret
    host = secret.parent
    (host / "ca-certificates.crt").write_text("the host's file\n")
    bundle = tmp_path / "host-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    root = tmp_path / "rootfs"
    (root / "etc/ssl").mkdir(parents=True)
    os.symlink(host, root / "etc/ssl/certs")
    idmap = IdMap(lease=200_000, base=300_000)
    ctx = SimpleNamespace(trusted_ca=SimpleNamespace(host=str(bundle)))
    image = ImageRoot(rootfs=root, idmap=idmap)
    _trust_host_ca(ctx, image)
    os.unlink(root / "etc/ssl/certs")
    (root / "etc/ssl/certs").mkdir()
    os.symlink(host / "ca-certificates.crt", root / "etc/ssl/certs/ca-certificates.crt")
    _trust_host_ca(ctx, image)
    assert (host / "ca-certificates.crt").read_text() == "the host's file\n"
    os.unlink(root / "etc/ssl/certs/ca-certificates.crt")
    (root / "etc/ssl/certs/ca-certificates.crt").write_text("the image's\n")
    _trust_host_ca(ctx, image)
    written = root / "etc/ssl/certs/ca-certificates.crt"
    assert written.read_text() == "-----BEGIN CERTIFICATE-----\n" and written.stat().st_uid == idmap.host_uid(0)
