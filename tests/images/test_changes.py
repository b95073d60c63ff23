"""What the agent changed outside its working directory, and the isolated verifier's root (SPEC §17).

The image is the suite's Debian tree under a small layer of the test's own (a WorkingDir
``/work/proj`` with files, a folder ``/opt/tool``); the agent's commands run as the image's root
through the real Spawner and bubblewrap on a real overlay (tests/images/rootfs_support.py);
system_changes reads the evaluation's layer against the image's own root (rootfs.image_base).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from evaluations.images import rootfs
from evaluations.images.changes import system_changes
from evaluations.images.diff import OPAQUE, is_opaque
from evaluations.images.errors import ImageError
from evaluations.images.isolate import ISOLATED, isolate_workdir, verifier_commands
from tests.images.rootfs_support import RANGE, run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="an image's root needs root (mounts)")

WORKDIR = "/work/proj"
PATH_DIRS = ("/usr/local/bin", "/usr/bin", "/bin")
EXCLUDE = ("tmp", "proc", "dev", "sys", "run/term-executor", "var/cache/executor")


def write(path: Path, text: str, mode: int = 0o644, owner: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    os.chown(path, owner, owner)


@pytest.fixture(scope="module")
def layers(debian_environment):
    """The Debian tree, and on top a layer of the image's ids (as the store keeps layers)."""
    top = Path(tempfile.mkdtemp(prefix="te-changes-layer-", dir="/tmp"))
    os.chmod(top, 0o755)
    write(top / "work/proj/main.py", "print('hello')\n", owner=1000)
    write(top / "work/proj/gone.txt", "old\n", owner=1000)
    write(top / "work/proj/data/a.txt", "a\n", owner=1000)
    write(top / "work/proj/data/b.txt", "b\n", owner=1000)
    write(top / "work/other.txt", "beside the working directory\n")
    write(top / "opt/tool/a", "a\n")
    write(top / "opt/tool/b", "b\n")
    write(top / "other/proj/file2", "image's file2\n")
    write(top / "other/proj/file3", "image's file3\n")
    for folder in ("work/proj", "work/proj/data"):
        os.chown(top / folder, 1000, 1000)
    os.chown(top / "work", 1000, 1000)
    os.chmod(top / "work", 0o750)
    yield [debian_environment.root, top]
    shutil.rmtree(top)


def python_dir(layers) -> str:
    found = sorted(p.name for p in (layers[0] / "usr/lib").glob("python3.*") if p.name[len("python3.") :].isdigit())
    assert found, "the Debian tree has no /usr/lib/python3.N"
    return f"/usr/lib/{found[-1]}"


AGENT = """set -e
cd {workdir}
echo edited > main.py && rm gone.txt && rm -rf data && mkdir data && echo c > data/c.txt && echo n > new.txt
rm /etc/motd
echo hi > /etc/new.conf
rm -rf /opt/tool && mkdir /opt/tool && echo y > /opt/tool/y
mkdir -p /srv/data/sub && echo z > /srv/data/sub/z
rm -f {python}/sitecustomize.py && echo 'import os' > {python}/sitecustomize.py
echo x > /usr/lib/python3/dist-packages/hook.pth
printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/pytest && chmod 755 /usr/local/bin/pytest
chmod 700 /var/backups
mkdir -p /logs/agent && echo '{{}}' > /logs/agent/trajectory.json
mkdir -p /var/cache/executor && echo mine > /var/cache/executor/made
"""


def agent(image_session, layers, script=AGENT):
    spawner, root, session = image_session(layers=layers)
    result = run(spawner, root, script.format(workdir=WORKDIR, python=python_dir(layers)))
    assert result.exit_code == 0, result.output
    return spawner, root, session


def changes(session, layers, idmap, **overrides):
    arguments = {"workdir": WORKDIR, "exclude": EXCLUDE, "path_dirs": PATH_DIRS, **overrides}
    with rootfs.image_base(layers, session) as base:
        return system_changes(rootfs.upper_of(session), base, idmap, **arguments)


def test_what_the_agent_changed_outside_its_folder_is_listed_and_the_hooks_flagged(image_session, layers):
    _, root, session = agent(image_session, layers)
    python = python_dir(layers)
    found = changes(session, layers, root.idmap)
    expected = sorted(
        [
            "/etc/motd",  # removed
            "/etc/new.conf",
            "/opt/tool",  # replaced (opaque)
            "/opt/tool/y",
            "/srv/data",  # new folders
            "/srv/data/sub",
            "/srv/data/sub/z",
            f"{python}/sitecustomize.py",
            "/usr/lib/python3/dist-packages/hook.pth",
            "/usr/local/bin/pytest",
            "/var/backups",  # its mode changed
        ]
    )
    # Not there: the working directory, /logs/agent (nor /logs, made for it), the excluded folder,
    # and every folder copied up only because something below it changed (/etc, /usr/lib, /var).
    assert found == {
        "count": len(expected),
        "paths": expected,
        "suspicious": [
            f"{python}/sitecustomize.py",
            "/usr/lib/python3/dist-packages/hook.pth",
            "/usr/local/bin/pytest",
        ],
    }


def test_the_paths_are_capped_but_all_counted(image_session, layers):
    script = "mkdir -p /srv/many && cd /srv/many && for i in $(seq 1 250); do echo $i > f$i; done; echo h > /etc/zz"
    _, root, session = agent(image_session, layers, script)
    found = changes(session, layers, root.idmap)
    every = sorted(["/srv/many", "/etc/zz", *(f"/srv/many/f{i}" for i in range(1, 251))])
    assert found["count"] == 252
    assert found["paths"] == every[:200]
    assert changes(session, layers, root.idmap, limit=3)["paths"] == every[:3]
    assert found["suspicious"] == []


def test_a_working_directory_of_root_leaves_nothing_outside_it(image_session, layers):
    _, root, session = agent(image_session, layers)
    found = changes(session, layers, root.idmap, workdir="/")
    # What it put on the verifier's PATH is still named (SPEC §21): every PATH folder is inside it.
    assert found == {"count": 0, "paths": [], "suspicious": ["/usr/local/bin/pytest"]}


def test_the_isolated_verifier_sees_the_image_and_only_the_working_directory(image_session, layers):
    spawner, root, session = agent(image_session, layers)
    python = python_dir(layers)
    before = changes(session, layers, root.idmap)
    isolated = isolate_workdir(session, layers, root.idmap, WORKDIR)
    assert isolated.rootfs == root.rootfs
    merged = isolated.rootfs
    # The working directory as the agent left it: edits, a new file, a removal, a folder replaced.
    assert (merged / "work/proj/main.py").read_text() == "edited\n"
    assert (merged / "work/proj/new.txt").read_text() == "n\n"
    assert not os.path.lexists(merged / "work/proj/gone.txt")
    assert sorted(os.listdir(merged / "work/proj/data")) == ["c.txt"]
    # Everything else is the image's again.
    assert (layers[1] / "work/other.txt").read_text() == (merged / "work/other.txt").read_text()
    assert (merged / "etc/motd").read_bytes() == (layers[0] / "etc/motd").read_bytes()
    for planted in ("etc/new.conf", "usr/local/bin/pytest", "usr/lib/python3/dist-packages/hook.pth", "srv/data"):
        assert not os.path.lexists(merged / planted), planted
    assert os.readlink(merged / python.lstrip("/") / "sitecustomize.py") == os.readlink(
        layers[0] / python.lstrip("/") / "sitecustomize.py"
    )
    assert sorted(os.listdir(merged / "opt/tool")) == ["a", "b"]
    assert stat.S_IMODE(os.lstat(merged / "var/backups").st_mode) == stat.S_IMODE(
        os.lstat(layers[0] / "var/backups").st_mode
    )
    # The parent made for the working directory has the image's owner and mode.
    work = os.lstat(merged / "work")
    assert (work.st_uid, work.st_gid, stat.S_IMODE(work.st_mode)) == (RANGE + 1000, RANGE + 1000, 0o750)
    # The verifier's commands see it so too, and write to the new layer only.
    seen = run(
        spawner,
        isolated,
        f"cd {WORKDIR} && cat main.py && ls data && test ! -e /etc/new.conf && test ! -e gone.txt"
        " && test -e /etc/motd && echo ok > /work/proj/verified && echo VERIFIED",
    )
    assert seen.exit_code == 0 and seen.output.split() == ["edited", "c.txt", "VERIFIED"], seen.output
    new_upper = session / rootfs.IMAGE_DIR / ISOLATED / "upper"
    assert (new_upper / "work/proj/verified").is_file()
    # The agent's layer keeps what it changed outside the folder (the record was read before).
    agent_layer = rootfs.upper_of(session)
    assert (agent_layer / "etc/new.conf").is_file() and not os.path.lexists(agent_layer / "work/proj")
    assert before["count"] == 11
    rootfs.unmount_root(session, remove=True)
    assert not (session / rootfs.IMAGE_DIR).exists()


def test_isolation_keeps_what_the_agent_saw_through_a_replaced_or_renamed_parent(image_session, layers):
    # /work replaced whole: the image's /work/proj files are gone for the agent, and stay gone.
    _, root, session = agent(
        image_session, layers, "rm -rf /work && mkdir -p /work/proj && echo only > /work/proj/only"
    )
    isolated = isolate_workdir(session, layers, root.idmap, WORKDIR)
    assert sorted(os.listdir(isolated.rootfs / "work/proj")) == ["only"]
    assert (isolated.rootfs / "work/other.txt").is_file()  # outside the folder: the image's
    assert is_opaque(session / rootfs.IMAGE_DIR / ISOLATED / "upper/work/proj")

    # /other renamed to /work: the agent's /work/proj is the image's /other/proj, file2 edited.
    _, root, session = agent(
        image_session, layers, "mv /work /work-old && mv /other /work && echo edited > /work/proj/file2"
    )
    isolated = isolate_workdir(session, layers, root.idmap, WORKDIR)
    assert sorted(os.listdir(isolated.rootfs / "work/proj")) == ["file2", "file3"]
    assert (isolated.rootfs / "work/proj/file2").read_text() == "edited\n"
    assert (isolated.rootfs / "other/proj/file2").read_text() == "image's file2\n"
    assert (isolated.rootfs / "work/other.txt").is_file()

    # Moved in from outside the folder: what the image has there is the image's again, beside them.
    _, root, session = agent(image_session, layers, "mv /opt/tool/a /work/proj/a2 && mv /other/proj /work/proj/moved")
    isolated = isolate_workdir(session, layers, root.idmap, WORKDIR)
    assert (isolated.rootfs / "work/proj/a2").read_text() == "a\n"
    assert (isolated.rootfs / "opt/tool/a").read_text() == "a\n"
    assert sorted(os.listdir(isolated.rootfs / "work/proj/moved")) == ["file2", "file3"]
    assert (isolated.rootfs / "other/proj/file2").read_text() == "image's file2\n"
    assert (isolated.rootfs / "work/proj/moved/file3").read_text() == "image's file3\n"

    # The same rename, the folder itself untouched: still the image's /other/proj.
    _, root, session = agent(image_session, layers, "mv /work /work-old && mv /other /work")
    isolated = isolate_workdir(session, layers, root.idmap, WORKDIR)
    assert (isolated.rootfs / "work/proj/file2").read_text() == "image's file2\n"


def test_isolation_keeps_a_working_directory_the_agent_removed_removed(image_session, layers):
    for script in ("rm -rf /work/proj", "rm -rf /work && ln -s /etc /work", "rm -rf /work && echo f > /work"):
        _, root, session = agent(image_session, layers, script)
        isolated = isolate_workdir(session, layers, root.idmap, WORKDIR)
        assert not os.path.lexists(isolated.rootfs / "work/proj"), script
        assert (isolated.rootfs / "work/other.txt").is_file(), script


def test_a_working_directory_the_agent_never_touched_is_the_images(image_session, layers):
    _, root, session = agent(image_session, layers, "echo hi > /etc/new.conf")
    isolated = isolate_workdir(session, layers, root.idmap, WORKDIR)
    assert (isolated.rootfs / "work/proj/main.py").read_text() == "print('hello')\n"
    assert os.listdir(session / rootfs.IMAGE_DIR / ISOLATED / "upper") == []
    assert not os.path.lexists(isolated.rootfs / "etc/new.conf")


# -- the layer read by hand (overlayfs' format made by root; no mount) -------------------------


def whiteout(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(0, 0))


def test_folders_copied_up_are_no_change_and_stale_whiteouts_hide_nothing(tmp_path):
    from evaluations.runtime.idmap import IdMap

    idmap = IdMap(lease=0, base=0)  # host ids are the image's: the hand-made tree's owners compare as they are
    base, upper = tmp_path / "base", tmp_path / "upper"
    write(base / "etc/keep.conf", "k\n")
    write(base / "usr/bin/python3", "#!elf\n", 0o755)
    write(base / "usr/lib/x86_64-linux-gnu/libc.so.6", "elf\n")
    (upper / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)  # copied up, nothing changed below
    write(upper / "etc/keep.conf", "k\n", 0o600)  # a metadata-only copy-up is still a change
    whiteout(upper / "etc/never-there")  # a whiteout over nothing of the image
    whiteout(upper / "usr/bin/python3")
    write(upper / "home/u/.bashrc", "alias ls=evil\n")
    write(upper / "etc/ld.so.preload", "/tmp/evil.so\n")
    write(upper / "etc/ld.so.conf.d/evil.conf", "/tmp\n")
    write(upper / "usr/share/perl5/Evil.pm", "1;\n")
    write(upper / "opt/notes.txt", "fine\n")
    os.setxattr(upper / "etc", OPAQUE, b"n")  # not "y": not opaque
    found = system_changes(upper, base, idmap, workdir="/app", exclude=(), path_dirs=("/usr/bin", "/bin"))
    assert found["paths"] == [
        "/etc/keep.conf",
        "/etc/ld.so.conf.d",
        "/etc/ld.so.conf.d/evil.conf",
        "/etc/ld.so.preload",
        "/home",
        "/home/u",
        "/home/u/.bashrc",
        "/opt",
        "/opt/notes.txt",
        "/usr/bin/python3",
        "/usr/share",
        "/usr/share/perl5",
        "/usr/share/perl5/Evil.pm",
    ]
    assert found["count"] == 13
    assert found["suspicious"] == [
        "/etc/ld.so.conf.d",
        "/etc/ld.so.conf.d/evil.conf",
        "/etc/ld.so.preload",
        "/home/u/.bashrc",
        "/usr/bin/python3",
        "/usr/share/perl5",
        "/usr/share/perl5/Evil.pm",
    ]
    # Capped: the startup hooks and the PATH come before an interpreter's library files.
    capped = system_changes(upper, base, idmap, workdir="/app", exclude=(), path_dirs=("/usr/bin",), limit=2)
    assert capped["count"] == 13 and capped["paths"] == ["/etc/keep.conf", "/etc/ld.so.conf.d"]
    assert capped["suspicious"] == ["/etc/ld.so.conf.d", "/etc/ld.so.conf.d/evil.conf"]
    many = system_changes(upper, base, idmap, workdir="/app", exclude=("etc",), path_dirs=("/usr/bin",), limit=3)
    assert many["suspicious"] == ["/home/u/.bashrc", "/usr/bin/python3", "/usr/share/perl5"]


def test_a_link_in_the_layer_is_never_followed(tmp_path):
    from evaluations.runtime.idmap import IdMap

    base, upper = tmp_path / "base", tmp_path / "upper"
    (base / "etc").mkdir(parents=True)
    outside = tmp_path / "outside"
    write(outside / "a/b/c", "host\n")
    upper.mkdir()
    os.symlink(outside, upper / "etc")  # the image's /etc replaced by a link to a host folder
    found = system_changes(upper, base, IdMap(lease=0, base=0), workdir="/app", exclude=(), path_dirs=("/usr/bin",))
    assert found == {"count": 1, "paths": ["/etc"], "suspicious": []}


def test_what_the_agent_put_on_a_path_folder_inside_its_working_directory_is_suspicious(tmp_path):
    """SPEC §21: ``ENV PATH=/app/bin:$PATH`` and ``WORKDIR /app``; the folder is the agent's, not a
    system change, but what it left there is what a verifier finds first by name."""
    from evaluations.runtime.idmap import IdMap

    idmap = IdMap(lease=0, base=0)
    base, upper = tmp_path / "base", tmp_path / "upper"
    write(base / "app/bin/tool", "#!/bin/sh\n", 0o755)
    write(base / "app/bin/gone", "#!/bin/sh\n", 0o755)
    write(base / "usr/bin/bash", "elf\n", 0o755)
    write(upper / "app/bin/bash", "#!/bin/sh\n", 0o755)  # planted
    write(upper / "app/bin/tool", "#!/bin/sh\nexit 0\n", 0o755)  # changed
    whiteout(upper / "app/bin/gone")  # removed: nothing there to run
    (upper / "app/bin/sub").mkdir()  # a folder: no PATH lookup runs it
    write(upper / "app/notes.txt", "n\n")  # the working directory, not on PATH
    path_dirs = ("/app/bin", "/usr/bin")
    found = system_changes(upper, base, idmap, workdir="/app", exclude=(), path_dirs=path_dirs)
    assert found == {"count": 0, "paths": [], "suspicious": ["/app/bin/bash", "/app/bin/tool"]}
    # The PATH folder replaced by a link (a lookup would follow it): the folder itself is named.
    linked = tmp_path / "linked"
    (linked / "app").mkdir(parents=True)
    os.symlink("/tmp", linked / "app/bin")
    found = system_changes(linked, base, idmap, workdir="/app", exclude=(), path_dirs=path_dirs)
    assert found == {"count": 0, "paths": [], "suspicious": ["/app/bin"]}
    # The working directory /: every PATH folder is inside it.
    write(upper / "usr/bin/python3", "#!/bin/sh\n", 0o755)
    found = system_changes(upper, base, idmap, workdir="/", exclude=(), path_dirs=path_dirs)
    assert found == {"count": 0, "paths": [], "suspicious": ["/app/bin/bash", "/app/bin/tool", "/usr/bin/python3"]}


def isolated_image(root: Path) -> Path:
    """An image's root by hand: bash and sh in /usr/bin (/bin a link to it), a bash of its own in its
    WorkingDir /app, a link into /app from /srv, a library folder in /opt."""
    write(root / "usr/bin/bash", "elf\n", 0o755)
    write(root / "usr/bin/sh", "elf\n", 0o755)
    os.symlink("usr/bin", root / "bin")
    write(root / "app/bin/bash", "#!/bin/sh\n", 0o755)
    (root / "srv").mkdir()
    os.symlink("/app", root / "srv/app")
    write(root / "opt/lib/libx.so", "elf\n")
    return root


def test_an_isolated_verifiers_commands_resolve_only_outside_the_working_directory(tmp_path):
    """images/isolate.py 4-6: PATH without entries in /app (through a link, relative, empty, a missing
    one resolved as far as the image has it), the image's bash by its resolved path, and the shell's and
    the loader's start hooks without what names /app."""
    base = isolated_image(tmp_path / "image")
    env = {
        "PATH": "/app/bin:/srv/app/bin::.:bin:/bin:/usr/bin:/opt/tool/bin:/srv/app/../../app/x",
        "BASH_ENV": "/app/.bashrc",
        "ENV": "production",  # only an interactive sh reads it: the task's to use
        "LD_LIBRARY_PATH": "/app/lib;/opt/lib",
        "LD_PRELOAD": "/srv/app/x.so /opt/lib/libx.so",
        "LD_AUDIT": "/app/audit.so",
        "APP_HOME": "/app/bin",  # not a variable that runs or loads anything: the task's to use
    }
    shell, found = verifier_commands(base, "/app", env, "bash")
    assert shell == "/usr/bin/bash"
    assert found == {
        "PATH": "/bin:/usr/bin:/opt/tool/bin",
        "ENV": "production",
        "LD_LIBRARY_PATH": "/opt/lib",
        "LD_PRELOAD": "/opt/lib/libx.so",
        "APP_HOME": "/app/bin",
    }
    # The image's own bash only in its working directory: none to run.
    with pytest.raises(ImageError, match="has no bash outside the working directory /app on PATH"):
        verifier_commands(base, "/app", {"PATH": "/app/bin:/srv/app/bin"}, "bash")
    # A working directory of /: everything is the agent's.
    with pytest.raises(ImageError, match="has no bash outside the working directory /"):
        verifier_commands(base, "/", {"PATH": "/usr/bin:/bin"}, "bash")


def test_the_pipelines_calls_read_the_image_from_the_store_and_the_path_from_its_env(
    image_session, build_store, debian_image
):
    """imageenv.system_changes and imageenv.isolate, as the pipeline calls them after the agent."""
    from types import SimpleNamespace

    from evaluations.environments import kinds
    from evaluations.pipeline import imageenv
    from tests.helpers.images import image_config

    layers = [build_store.layer_tree(layer) for layer in debian_image.layers]
    spawner, root, session = image_session(layers=layers)
    script = (
        "mkdir -p /srv/app && echo mine > /srv/app/f && printf '#!/bin/sh\\n' > /opt/runner && chmod 755 /opt/runner"
    )
    assert run(spawner, root, script).exit_code == 0
    image = kinds.Image(
        SimpleNamespace(root=session),
        spawner,
        ref="debian",
        digest=debian_image.digest,
        config={"Env": ["PATH=/opt:/usr/bin:relative"], "WorkingDir": "/srv/app"},
        mounted=root,
        store=build_store,
        in_workdir=True,
    )
    ctx = SimpleNamespace(
        config=image_config(IMAGES_DIR=str(build_store.root)),
        session=SimpleNamespace(root=session),
        env=image,
        trusted_ca=None,
        task=None,  # no task, no compose services (executor_made, isolate read them)
        services={},
    )
    assert imageenv.system_changes(ctx) == {"count": 1, "paths": ["/opt/runner"], "suspicious": ["/opt/runner"]}
    imageenv.isolate(ctx)
    assert image.mounted.rootfs == root.rootfs
    assert (root.rootfs / "srv/app/f").read_text() == "mine\n"
    assert not os.path.lexists(root.rootfs / "opt/runner")


def test_a_tree_deeper_than_path_max_is_compared_from_handles(tmp_path):
    """1500 folders in the image and the same in the layer (copied up for the file at the bottom):
    6 KB of path, over PATH_MAX. Only the file is a change; each folder is compared with the
    image's, which no path string could reach."""
    from evaluations.runtime.idmap import IdMap
    from evaluations.safefs import remove_tree_nofollow

    base, upper = tmp_path / "base", tmp_path / "upper"
    try:
        for top in (base, upper):
            top.mkdir()
            fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
            for _ in range(1500):
                os.mkdir("ddd", 0o755, dir_fd=fd)
                child = os.open("ddd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = child
            if top == upper:
                os.close(os.open("new.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
            os.close(fd)
        found = system_changes(upper, base, IdMap(lease=0, base=0), workdir="/app", exclude=(), path_dirs=())
        assert found["count"] == 1 and found["paths"] == ["/" + "ddd/" * 1500 + "new.txt"]
    finally:
        remove_tree_nofollow(base)
        remove_tree_nofollow(upper)


def test_isolation_moves_a_tree_deeper_than_path_max(image_session, layers):
    """The agent's 1500 new folders below its working directory (6 KB of path): isolated from
    handles, the file at the bottom is the verifier's; no path string could reach it."""
    deep = (  # relative chdir: a shell's cd stops at PATH_MAX
        'python3 -c \'import os\nos.chdir("/work/proj")\nfor _ in range(1500): os.mkdir("ddd"); os.chdir("ddd")\n'
        'open("bottom", "w").write("deep\\n")\''
    )
    _, root, session = agent(image_session, layers, deep)
    try:
        isolated = isolate_workdir(session, layers, root.idmap, WORKDIR)
        fd = os.open(isolated.rootfs / "work/proj", os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(1500):
            child = os.open("ddd", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
        bottom = os.open("bottom", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        assert os.read(bottom, 100) == b"deep\n"
        os.close(bottom)
    finally:
        rootfs.unmount_root(session, remove=True)  # (from handles: the fixture's rmtree recurses)
