"""Root without the capabilities root's work takes (a container's root: the engine grants a few) stops
start-up with one line naming each missing one and the `--cap-add` that grants it, instead of image
tasks failing one by one at their mounts (issue 40)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from evaluations.runtime import capabilities
from evaluations.worker.startup import StartupError, check_privileges
from tests.helpers.service import PROJECT, free_port

ALL = "000001ffffffffff"
# Docker's and podman's default sets: neither has CAP_SYS_ADMIN nor CAP_SYS_PTRACE; podman's lacks CAP_MKNOD too.
DOCKER = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
          "CAP_MKNOD")  # fmt: skip
PODMAN = tuple(name for name in DOCKER if name != "CAP_MKNOD")


def status(names=None, *, hexbits: str | None = None) -> str:
    if hexbits is None:
        hexbits = f"{sum(1 << capabilities.NUMBERS[name] for name in set(names)):016x}"
    return f"Name:\tpython3\nCapInh:\t0000000000000000\nCapPrm:\t{hexbits}\nCapEff:\t{hexbits}\n"


def test_a_hosts_root_holds_all_it_needs():
    assert capabilities.missing_as_root(status(hexbits=ALL)) == []
    check_privileges(status(hexbits=ALL), euid=0)
    assert capabilities.effective(status(hexbits=ALL)) == frozenset(capabilities.NUMBERS)


@pytest.mark.parametrize(("granted", "missing"), [(DOCKER, ["CAP_SYS_ADMIN", "CAP_SYS_PTRACE"]),
                                                  (PODMAN, ["CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_MKNOD"])])  # fmt: skip
def test_a_containers_default_root_is_refused_naming_what_to_add(granted, missing):
    assert capabilities.missing_as_root(status(granted)) == missing
    with pytest.raises(StartupError) as refused:
        check_privileges(status(granted), euid=0)
    said = str(refused.value)
    assert said.startswith("the service runs as root without CAP_SYS_ADMIN (mounting an image's layers for image "
                           "tasks, Harbor tasks and live sandboxes)"), said  # fmt: skip
    flags = " ".join(f"--cap-add {name.removeprefix('CAP_')}" for name in missing)
    assert f"({flags}; docs/operating.md, Docker)" in said
    check_privileges(status(granted + ("CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_MKNOD")), euid=0)


def test_another_user_is_not_asked_for_capabilities():
    check_privileges(status(()), euid=10001)


def test_a_status_without_capabilities_is_an_error_not_a_pass():
    with pytest.raises(ValueError):
        capabilities.effective("Name:\tpython3\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping capabilities from root's bounding set needs root")
def test_serve_refuses_to_start_without_cap_sys_admin(tmp_path, workspace_base):
    """The command itself, started by setpriv with CAP_SYS_ADMIN, CAP_SYS_PTRACE and CAP_MKNOD out of its
    bounding set (as `podman run` without the three --cap-add leaves root): exit 2 and one line, before
    anything starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env.update(DATA_DIR=str(tmp_path / "data"), WORKSPACE_BASE=str(workspace_base),
               GUNICORN_BIND=f"127.0.0.1:{free_port()}")  # fmt: skip
    setpriv = shutil.which("setpriv")
    done = subprocess.run(
        [setpriv, "--bounding-set", "-sys_admin,-sys_ptrace,-mknod", "--", sys.executable, "manage.py", "serve"],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("term-executor: configuration error: the service runs as root without CAP_SYS_ADMIN"), last
    assert "CAP_MKNOD (the whiteouts of an image's layers)" in last
    assert "(--cap-add SYS_ADMIN --cap-add SYS_PTRACE --cap-add MKNOD; docs/operating.md, Docker)" in last
    assert "started" not in done.stderr + done.stdout
