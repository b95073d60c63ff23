"""Building images from Dockerfiles with no daemon (SPEC §16): real RUNs in bubblewrap, root in
name only, on the suite's Debian tree as the base image; layers in a real store.

Whether a RUN ran is read from the builder's progress lines ("line N: RUN ..."), written only
when a command is started; a cache hit writes "(cached)" instead.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from evaluations.images.build import build
from evaluations.images.errors import ImageError
from tests.helpers.httpserver import TestHTTPServer
from tests.images.build_support import BASE_REF, config_for, environment, write_context

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds mount image roots: root only")


def image_path(store, record, path: str) -> Path | None:
    """Where ``path`` of the built image is, in its topmost layer that has it (no whiteouts here)."""
    for layer in reversed(record.layers):
        candidate = store.layer_tree(layer) / path.lstrip("/")
        if os.path.lexists(candidate):
            return candidate
    return None


def read(store, record, path: str) -> str:
    found = image_path(store, record, path)
    assert found is not None, f"{path} is not in the image"
    return found.read_text()


@pytest.fixture
def store(build_store):
    return build_store


@pytest.fixture
def builder(bwrap_runtime, build_store, build_images_dir, debian_image, tmp_path):
    """builder(files, build_args=None, target=None, tag=None) -> (BuildResult, progress lines)."""
    config = config_for(build_images_dir)

    def run(files: dict, build_args=None, target=None, tag=None, folder="ctx", links=None):
        context = write_context(tmp_path / folder, files)
        for name, link_target in (links or {}).items():
            os.symlink(link_target, context / name)
        env = environment(bwrap_runtime, config)
        result = build(context / "Dockerfile", context, build_args, target, store=build_store, env=env, tag=tag)
        return result, env.progress

    return run


APP = f"""\
FROM {BASE_REF}
ARG GREETING=hello
ENV APP_HOME=/srv/app NAME="two words"
WORKDIR $APP_HOME
COPY app/ ./
RUN echo "$GREETING $NAME" > greeting.txt && useradd -u 1000 -m builder && chown builder /srv/app
USER builder
RUN id -u > whoami && id -gn >> whoami && rm greeting.txt && echo "$HOME" > home
LABEL org.example.role="the app" version=1
EXPOSE 8000 53/udp
CMD ["python3", "main.py"]
"""


def test_a_dockerfile_builds_with_run_copy_env_arg_workdir_user_and_its_config(builder, store):
    files = {"Dockerfile": APP, "app/main.py": "print('hi')\n", "app/lib/util.py": "X = 1\n"}
    result, progress = builder(files, build_args={"GREETING": "hi", "UNKNOWN": "ignored"}, tag="example/app:1")
    record = result.record
    assert not result.cached and record.source == "build" and record.refs == ["docker.io/example/app:1"]
    assert store.resolve_tag("docker.io/example/app:1") == record.digest
    config = record.config
    assert "APP_HOME=/srv/app" in config["Env"] and "NAME=two words" in config["Env"]
    assert not any(item.startswith("GREETING=") for item in config["Env"])  # an ARG is not kept
    assert config["WorkingDir"] == "/srv/app" and config["User"] == "builder"
    assert config["Cmd"] == ["python3", "main.py"]
    assert config["Labels"] == {"org.example.role": "the app", "version": "1"}
    assert config["ExposedPorts"] == {"8000/tcp": {}, "53/udp": {}}
    # The files, as the layers hold them: owners are the image's own ids.
    assert read(store, record, "/srv/app/main.py") == "print('hi')\n"
    assert read(store, record, "/srv/app/lib/util.py") == "X = 1\n"
    assert read(store, record, "/srv/app/whoami") == "1000\nbuilder\n"
    assert read(store, record, "/srv/app/home") == "/home/builder\n"
    whoami = os.lstat(image_path(store, record, "/srv/app/whoami"))
    assert (whoami.st_uid, whoami.st_gid) == (1000, 1000)
    assert os.lstat(image_path(store, record, "/srv/app/main.py")).st_uid == 0  # COPY: root's, as Docker
    # The deleted file is a whiteout (char 0/0) in the second RUN's layer; the first RUN's has the file.
    whiteout = os.lstat(store.layer_tree(record.layers[-1]) / "srv/app/greeting.txt")
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == 0
    assert (store.layer_tree(record.layers[-2]) / "srv/app/greeting.txt").read_text() == "hi two words\n"
    assert len(progress.ran()) == 2
    assert "build args not used by the Dockerfile: UNKNOWN" in progress.lines
    for layer in record.layers[1:]:  # no overlayfs bookkeeping left in a layer
        for folder, dirs, names in os.walk(store.layer_tree(layer)):
            for name in [*dirs, *names]:
                attrs = os.listxattr(os.path.join(folder, name), follow_symlinks=False)
                assert all(a == "trusted.overlay.opaque" for a in attrs if a.startswith("trusted.overlay."))


def test_a_rebuild_is_all_cache_hits_and_a_changed_line_reruns_it_and_what_follows(builder):
    files = {"Dockerfile": APP, "app/main.py": "print('hi')\n"}
    first, progress = builder(files)
    assert len(progress.ran()) == 2
    again, progress = builder(files)
    assert again.cached and progress.ran() == [] and again.record.digest == first.record.digest
    assert sum("(cached)" in line for line in progress.lines) == 4  # WORKDIR, COPY, RUN, RUN
    changed, progress = builder({**files, "Dockerfile": APP.replace("> home", "> home2")})
    assert not changed.cached and [line.split(": ", 1)[1] for line in progress.ran()] == [
        'RUN id -u > whoami && id -gn >> whoami && rm greeting.txt && echo "$HOME" > home2'
    ]
    assert changed.record.layers[:-1] == first.record.layers[:-1]
    # A changed file in the context re-runs the COPY and every RUN after it.
    edited, progress = builder({**files, "app/main.py": "print('bye')\n"})
    assert len(progress.ran()) == 2 and edited.record.layers[:2] == first.record.layers[:2]
    # So does a build arg the RUN sees.
    _, progress = builder(files, build_args={"GREETING": "hey"})
    assert len(progress.ran()) == 2


def test_dockerignore_chown_chmod_and_add_of_local_tars(builder, store, tmp_path):
    def tar_bytes(mode: str) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode=mode) as tar:
            for name, data, uid in (("inner/file.txt", b"from the tar\n", 1234), ("inner/other", b"x", 0)):
                info = tarfile.TarInfo(name)
                info.size, info.uid, info.gid, info.mode = len(data), uid, uid, 0o640
                tar.addfile(info, io.BytesIO(data))
        return out.getvalue()

    dockerfile = f"""\
FROM {BASE_REF}
COPY --chown=nobody:nogroup . /ctx/
COPY --chown=1000 --chmod=0750 tool.sh /usr/local/bin/
ADD data.tar.gz /unpacked/
ADD data.tar.xz /xz/
ADD plain.tar /plain
ADD data.tar.bz2 notes.txt /mixed/
COPY *.md /docs/
"""
    files = {
        "Dockerfile": dockerfile,
        ".dockerignore": "# comments are ignored\n*.log\nsecret/\n!secret/keep.txt\n**/*.tmp\n/build\n",
        "a.txt": "a\n",
        "b.log": "log\n",
        "secret/other": "hidden\n",
        "secret/keep.txt": "kept\n",
        "sub/deep/x.tmp": "tmp\n",
        "sub/deep/y.txt": "y\n",
        "build/out": "ignored\n",
        "tool.sh": "#!/bin/sh\n",
        "notes.txt": "notes\n",
        "README.md": "readme\n",
        "CHANGES.md": "changes\n",
        "data.tar.gz": tar_bytes("w:gz"),
        "data.tar.xz": tar_bytes("w:xz"),
        "data.tar.bz2": tar_bytes("w:bz2"),
        "plain.tar": tar_bytes("w"),
    }
    result, _ = builder(files)
    record = result.record

    def present(path):
        return image_path(store, record, path) is not None

    assert read(store, record, "/ctx/a.txt") == "a\n" and read(store, record, "/ctx/secret/keep.txt") == "kept\n"
    assert read(store, record, "/ctx/sub/deep/y.txt") == "y\n"
    for excluded in ("/ctx/b.log", "/ctx/secret/other", "/ctx/sub/deep/x.tmp", "/ctx/build"):
        assert not present(excluded), excluded
    copied = os.lstat(image_path(store, record, "/ctx/a.txt"))
    assert (copied.st_uid, copied.st_gid) == (65534, 65534)  # nobody:nogroup in Debian's files
    tool = os.lstat(image_path(store, record, "/usr/local/bin/tool.sh"))
    assert (tool.st_uid, tool.st_gid, stat.S_IMODE(tool.st_mode)) == (1000, 1000, 0o750)
    for folder in ("/unpacked", "/xz", "/plain", "/mixed"):
        assert read(store, record, f"{folder}/inner/file.txt") == "from the tar\n", folder
        unpacked = os.lstat(image_path(store, record, f"{folder}/inner/file.txt"))
        assert (unpacked.st_uid, stat.S_IMODE(unpacked.st_mode)) == (1234, 0o640)
    assert read(store, record, "/mixed/notes.txt") == "notes\n"
    assert (
        read(store, record, "/docs/README.md") == "readme\n" and read(store, record, "/docs/CHANGES.md") == "changes\n"
    )


def test_a_second_stage_copies_from_the_first_and_only_needed_stages_are_built(builder, store):
    dockerfile = f"""\
ARG BASE={BASE_REF}
FROM $BASE AS compile
RUN mkdir -p /out && echo built > /out/artifact && ln -s artifact /out/link
FROM $BASE AS unused
RUN echo never
FROM scratch
COPY --from=compile /out/ /app/
COPY --from=0 /etc/debian_version /
ENV PATH=/app
"""
    result, progress = builder({"Dockerfile": dockerfile})
    record = result.record
    assert progress.ran() == ["line 3: RUN mkdir -p /out && echo built > /out/artifact && ln -s artifact /out/link"]
    assert len(record.layers) == 2  # scratch + two COPYs: nothing of Debian's
    assert read(store, record, "/app/artifact") == "built\n"
    assert os.readlink(image_path(store, record, "/app/link")) == "artifact"
    assert read(store, record, "/debian_version").strip()
    assert record.config == {"Env": ["PATH=/app"]}
    target, progress = builder({"Dockerfile": dockerfile}, target="unused")
    assert [line.split(": ", 1)[1] for line in progress.ran()] == ["RUN echo never"]
    assert read(store, target.record, "/etc/debian_version") == read(store, record, "/debian_version")


def test_exec_form_shell_and_the_recorded_only_instructions(builder, store):
    dockerfile = f"""\
FROM {BASE_REF}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN echo "$BASH_VERSION" | cut -c1 > /shell
RUN ["/bin/sh", "-c", "echo exec > /exec"]
ENTRYPOINT ["/entry"]
HEALTHCHECK --interval=30s --retries=3 CMD curl -f http://localhost/ || exit 1
STOPSIGNAL SIGTERM
VOLUME ["/data"]
ONBUILD RUN echo later
"""
    result, progress = builder({"Dockerfile": dockerfile})
    record = result.record
    assert read(store, record, "/shell").strip().isdigit() and read(store, record, "/exec") == "exec\n"
    config = record.config
    assert config["Entrypoint"] == ["/entry"] and "Cmd" not in config  # a new ENTRYPOINT drops CMD
    assert config["Shell"] == ["/bin/bash", "-o", "pipefail", "-c"]
    assert config["Healthcheck"] == {"Test": ["CMD-SHELL", "curl -f http://localhost/ || exit 1"],
                                     "Interval": 30 * 10**9, "Retries": 3}  # fmt: skip
    assert config["StopSignal"] == "SIGTERM" and config["Volumes"] == {"/data": {}}
    assert config["OnBuild"] == ["RUN echo later"]
    assert not any("later" in line for line in progress.lines)


# -- what a Dockerfile gets wrong, each with its sentence ---------------------------------------------

BAD = [
    ("FROM {base}\nFROBNICATE now\n", {}, "Dockerfile line 2 (FROBNICATE): FROBNICATE is not a Dockerfile instruction"),
    ("RUN true\nFROM {base}\n", {}, "Dockerfile line 1 (RUN): only ARG may come before the first FROM."),
    ("FROM {base}\nENV A=\"open\n", {}, "Dockerfile line 2 (ENV): a \" quote is not closed."),
    ("FROM {base}\nCOPY missing.txt /x\n", {}, "Dockerfile line 2 (COPY): the source 'missing.txt' is not in the build context."),
    ("FROM {base}\nCOPY ../outside /x\n", {}, "Dockerfile line 2 (COPY): the source '../outside' leads outside the build context."),
    ("FROM {base}\nCOPY escape/passwd /x\n", {"escape": Path("/etc")}, "Dockerfile line 2 (COPY): the source 'escape/passwd' leads outside the build context."),
    ("FROM {base}\nCOPY a b /x\n", {"a": "a", "b": "b"}, "Dockerfile line 2 (COPY): with several sources, the destination must be a folder ending in /."),
    ("FROM {base}\nCOPY --chown=nosuchuser a /x\n", {"a": "a"}, "Dockerfile line 2 (COPY): the image's user 'nosuchuser' is not in its /etc/passwd."),
    ("FROM {base}\nCOPY --link a /x\n", {"a": "a"}, "Dockerfile line 2 (COPY): the flag --link is not supported."),
    ("FROM {base}\nADD --from=0 a /x\n", {"a": "a"}, "Dockerfile line 2 (ADD): the flag --from is not supported."),
    ("FROM --platform=linux/s390x {base}\n", {}, "Dockerfile line 1 (FROM): the platform linux/s390x is not this machine's"),
    ("FROM {base}\nSHELL /bin/bash -c\n", {}, "Dockerfile line 2 (SHELL): SHELL takes the JSON form"),
    ("FROM {base}\nUSER nobody\nRUN true\nUSER ghost\nRUN true\n", {}, "Dockerfile line 5 (RUN): the image's user 'ghost' is not in its /etc/passwd."),
    ("FROM {base}\nRUN echo first && echo 'it broke' >&2 && exit 3\n", {},
     "Dockerfile line 2 (RUN): the command \"echo first && echo 'it broke' >&2 && exit 3\" exited with status 3; its output ends: first\nit broke"),
    ("FROM {base} AS first\nCOPY --from=later /x /y\nFROM {base} AS later\nCOPY --from=first /x /y\n", {},
     "Dockerfile line 2 (COPY): the stage 'later' comes after this line: a stage can only use earlier ones."),
    ("# only a comment\n", {}, "The Dockerfile has no FROM instruction."),
]  # fmt: skip


@pytest.mark.parametrize(("dockerfile", "extra", "sentence"), BAD, ids=[f"bad{n}" for n in range(len(BAD))])
def test_each_bad_dockerfile_fails_with_its_sentence(builder, tmp_path, dockerfile, extra, sentence):
    files = {"Dockerfile": dockerfile.format(base=BASE_REF)}
    files.update({name: value for name, value in extra.items() if not isinstance(value, Path)})
    links = {name: value for name, value in extra.items() if isinstance(value, Path)}
    (tmp_path / "outside").write_text("no\n")
    with pytest.raises(ImageError) as caught:
        builder(files, links=links)
    assert caught.value.kind == "task_invalid"
    assert str(caught.value).startswith(sentence), str(caught.value)


def test_add_of_a_url_is_fetched_under_the_url_rules_and_kept_as_a_file(
    bwrap_runtime, build_store, build_images_dir, debian_image, tmp_path
):
    www = tmp_path / "www"
    www.mkdir()
    (www / "tool.tar.gz").write_bytes(b"\x1f\x8b not unpacked: a URL's file is kept as it is")
    with TestHTTPServer(www) as server:
        dockerfile = f"FROM {BASE_REF}\nADD {server.url('/tool.tar.gz')} /downloads/\n"
        context = write_context(tmp_path / "ctx", {"Dockerfile": dockerfile})
        allowed = environment(bwrap_runtime, config_for(build_images_dir, ALLOWED_PRIVATE_HOSTS="127.0.0.1"))
        record = build(context / "Dockerfile", context, None, None, store=build_store, env=allowed).record
        with pytest.raises(ImageError) as caught:
            refused = environment(bwrap_runtime, config_for(build_images_dir))
            build(context / "Dockerfile", context, None, None, store=build_store, env=refused)
    fetched = image_path(build_store, record, "/downloads/tool.tar.gz")
    assert (
        fetched.read_bytes().startswith(b"\x1f\x8b not unpacked") and stat.S_IMODE(os.lstat(fetched).st_mode) == 0o600
    )
    assert str(caught.value).startswith("Dockerfile line 2 (ADD): ADD URL host 127.0.0.1 resolves to a loopback"), str(
        caught.value
    )


def test_a_build_past_build_timeout_secs_is_stopped_in_its_run(
    bwrap_runtime, build_store, build_images_dir, debian_image, tmp_path
):
    context = write_context(tmp_path / "ctx", {"Dockerfile": f"FROM {BASE_REF}\nRUN echo started && sleep 600\n"})
    env = environment(bwrap_runtime, config_for(build_images_dir, BUILD_TIMEOUT_SECS="2"))
    with pytest.raises(ImageError) as caught:
        build(context / "Dockerfile", context, None, None, store=build_store, env=env)
    assert str(caught.value) == "Dockerfile line 2 (RUN): the build took longer than BUILD_TIMEOUT_SECS (2 s)."
    assert not list((build_images_dir / "builds").iterdir())  # the build folder and its lock went with it


def test_links_in_the_image_and_in_a_tar_never_lead_the_builder_onto_the_host(builder, store):
    """The builder writes as host root through the step's mount: an image's absolute link is
    resolved inside the image, a tar member with '..' is refused, and one through the tar's own
    link to /etc lands in the image's /etc (resolved in the image, as Docker's chroot does)."""
    marker = f"te-build-{os.getpid()}"
    dockerfile = f"FROM {BASE_REF}\nRUN ln -s /etc /x && ln -s ../../../../tmp /etc/up\nCOPY {marker} /x/up/\n"
    result, _ = builder({"Dockerfile": dockerfile, marker: "inside\n"})
    assert read(store, result.record, f"/tmp/{marker}") == "inside\n"  # the image's /tmp, via its /etc/up
    assert not os.path.lexists(f"/tmp/{marker}") and not os.path.lexists(f"/etc/{marker}")

    def tar_bytes(*members) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for name, kind, target in members:
                info = tarfile.TarInfo(name)
                if kind == "link":
                    info.type, info.linkname = tarfile.SYMTYPE, target
                    tar.addfile(info)
                else:
                    info.size = 2
                    tar.addfile(info, io.BytesIO(b"x\n"))
        return out.getvalue()

    files = {"Dockerfile": f"FROM {BASE_REF}\nADD evil.tar /unpacked/\n",
             "evil.tar": tar_bytes(("../../escape", "file", ""))}  # fmt: skip
    with pytest.raises(ImageError) as caught:
        builder(files)
    assert (
        str(caught.value)
        == "Dockerfile line 2 (ADD): the archive evil.tar has a member outside its folder: ../../escape."
    )
    files["evil.tar"] = tar_bytes(("lnk", "link", "/etc"), (f"lnk/{marker}", "file", ""))
    result, _ = builder(files)
    assert read(store, result.record, f"/etc/{marker}") == "x\n"
    assert os.readlink(image_path(store, result.record, "/unpacked/lnk")) == "/etc"
    assert not os.path.lexists(f"/etc/{marker}")
