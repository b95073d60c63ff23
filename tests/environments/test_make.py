"""`manage.py make_environment`, really run: a Debian tree with a tool the host lacks; failures leave nothing."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import stat
import subprocess

import pytest

from evaluations import environments as envs
from evaluations.environments import build as command
from tests.helpers.environments import (
    HOST_LACKS,
    NAME,
    PACKAGES,
    cached_tarball,
    environments_root,
    fake_environment,
    make_environment,
    remove_root,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def empty_root():
    root = environments_root()
    yield root
    remove_root(root)


def leftovers(root) -> list[str]:
    return sorted(name for name in os.listdir(root) if name != command.LOCK_FILE)


def test_the_built_environment_has_the_tool_the_host_lacks(debian_build, debian_environment):
    root, built = debian_build
    assert shutil.which(HOST_LACKS, path="/usr/local/bin:/usr/bin:/bin") is None
    assert envs.find_interpreter(debian_environment, HOST_LACKS) == f"/usr/bin/{HOST_LACKS}"
    assert envs.find_interpreter(debian_environment, "python3") == "/usr/bin/python3"
    assert envs.find_interpreter(debian_environment, "bash") == "/usr/bin/bash"
    assert envs.find_interpreter(debian_environment, "node") is None
    assert re.fullmatch(r"3\.11\.[0-9]+", debian_environment.python) and debian_environment.node is None
    assert leftovers(root) == [NAME]  # no .building-* left
    assert "localhost" in (debian_environment.root / "etc" / "hosts").read_text()
    apt = debian_environment.root / "var"
    assert not list(apt.glob("cache/apt/archives/*.deb")) and not list(apt.glob("lib/apt/lists/*_Packages"))
    # Progress was shown as debootstrap went, then one summary line.
    assert "I: Base system installed successfully." in built.stdout
    assert built.stdout.strip().splitlines()[-1].startswith(f"environment {NAME}: {root / NAME} (python 3.11.")
    assert cached_tarball().is_file()  # the next run builds from it, offline


def test_the_tree_is_usable_by_the_sandbox_uids(debian_environment):
    st = os.stat(debian_environment.root)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    assert envs.list_environments(debian_environment.root.parent) == [debian_environment]
    run = subprocess.run(
        [
            shutil.which("chroot", path="/usr/sbin:/usr/bin"),
            "--userspec=60000:60000",
            str(debian_environment.root),
            HOST_LACKS,
            "--version",
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0 and run.stdout.startswith(f"{HOST_LACKS} v"), run.stderr


def test_an_existing_name_is_refused_without_replace(debian_environment):
    root = debian_environment.root.parent
    done = make_environment(root, NAME, "--packages", PACKAGES, "--from-tarball", str(cached_tarball()))
    assert done.returncode == 1
    assert (
        done.stderr.strip() == f"CommandError: environment {NAME} already exists in {root}; --replace builds it again"
    )
    assert envs.resolve(root, NAME) == debian_environment  # the same identity: untouched


def test_an_interrupted_replace_leaves_the_old_tree_and_no_partial_one(debian_environment):
    """SIGTERM once the second stage began (dpkg in the chroot, /proc mounted in the tree): unmounted, removed."""
    root = debian_environment.root.parent
    args = (NAME, "--replace", "--packages", PACKAGES, "--from-tarball", str(cached_tarball()))
    process = make_environment(root, *args, background=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    mounted = []
    for line in process.stdout:
        if line.startswith("I: Installing core packages"):
            mounted = command._mounts_beneath(next(root.glob(".building-*")))
            process.send_signal(signal.SIGTERM)
            break
    rest, errors = process.communicate(timeout=120)
    assert mounted, "debootstrap had nothing mounted in the tree when it was stopped"
    assert process.returncode == 128 + signal.SIGTERM
    assert errors.strip().endswith("CommandError: interrupted by SIGTERM; the partial build was removed")
    assert leftovers(root) == [NAME]
    assert command._mounts_beneath(root) == []
    assert envs.resolve(root, NAME) == debian_environment


def test_a_failed_build_leaves_nothing_and_removes_a_killed_runs_leftovers(empty_root):
    stale = fake_environment(empty_root, ".building-old-abc123")  # as a killed make_environment leaves it
    done = make_environment(empty_root, "fresh", "--mirror", "http://127.0.0.1:9/debian")
    assert done.returncode == 1
    assert f"removing {stale} (a killed build)" in done.stdout
    assert re.search(r"CommandError: debootstrap failed \(exit status 1\): .+", done.stderr), done.stderr
    assert leftovers(empty_root) == []


def test_bad_arguments_change_nothing(empty_root):
    fake_environment(empty_root, "kept")
    cases = [
        (("../x",), "CommandError: environment name '../x' must not contain '/'"),
        (("Debian",), "CommandError: environment name 'Debian' is not valid: lowercase letters, digits, '.', '_' "
                      "and '-', starting with a letter or a digit"),
        (("x", "--packages", " , "), "CommandError: --packages: name at least one package"),
        (("x", "--from-tarball", "/nonexistent.tgz"), "CommandError: --from-tarball: no such file /nonexistent.tgz"),
    ]  # fmt: skip
    for args, message in cases:
        done = make_environment(empty_root, *args)
        assert (done.returncode, done.stderr.strip()) == (1, message)
    assert leftovers(empty_root) == ["kept"]


def test_one_build_at_a_time(empty_root):
    with open(empty_root / command.LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = make_environment(empty_root, "x")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"CommandError: another make_environment is building in {empty_root}; try again when it ends"
    )


def test_without_environments_root(empty_root):
    done = make_environment(empty_root, "x", environ={"ENVIRONMENTS_ROOT": ""})
    assert (done.returncode, done.stderr.strip()) == (
        1,
        "CommandError: ENVIRONMENTS_ROOT is not set: it names the folder environments are made in",
    )


def test_replacing_swaps_the_trees_in_one_step_and_retires_the_old_one(empty_root):
    old = fake_environment(empty_root, "env")
    (old / "old-marker").write_text("old")
    new = fake_environment(empty_root, ".building-env-xyz")
    (new / "new-marker").write_text("new")
    retired = command._put_in_place(new, empty_root / "env")
    assert (empty_root / "env" / "new-marker").is_file() and (retired / "old-marker").is_file()
    assert retired.name.startswith(".retired-env-") and not new.exists()
    assert [env.name for env in envs.list_environments(empty_root)] == ["env"]
