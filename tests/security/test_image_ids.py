"""IMAGE_UID_BASE checked at start (SPEC §21; issue 34, item 9).

The hole: the image id ranges (IMAGE_UID_BASE on, 65536 ids per uid of the pool) were never
compared with the host's: set over a ``/etc/subuid`` or ``/etc/subgid`` range (another user's
rootless containers) or an account's uid or gid, an image's root would own that user's files and
could signal its processes. Now ``serve`` and ``run_worker`` refuse to start (exit 2) with one
line naming the range and each entry it meets. The host's own files are never edited: the checks
read temporary copies, and the commands run in a mount namespace of their own where a copy is
bound over ``/etc/passwd``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evaluations.runtime.hostids import HostIdFiles, overlaps
from evaluations.worker.startup import StartupError, check_image_ids
from executor_project.config import Config
from tests.helpers.service import PROJECT, free_port

BASE = 200_000_000
CONFIG = dataclasses.replace(Config(), image_uid_base=BASE, sandbox_uid_count=4)  # 200000000-200262143
RANGE = f"({BASE}-{BASE + 4 * 65536 - 1}, SANDBOX_UID_COUNT x 65536 ids)"


@pytest.fixture
def etc(tmp_path) -> HostIdFiles:
    """Copies of the host's id files (an absent one stays absent), which a test may add lines to."""
    folder = tmp_path / "etc"
    folder.mkdir()
    files = HostIdFiles(*(folder / name for name in ("subuid", "subgid", "passwd", "group")))
    for name in ("subuid", "subgid", "passwd", "group"):
        if os.path.exists(f"/etc/{name}"):
            shutil.copyfile(f"/etc/{name}", folder / name)
    return files


def add(path: Path, line: str) -> None:
    with open(path, "a") as handle:
        handle.write(line + "\n")


def refusal(files: HostIdFiles) -> str:
    with pytest.raises(StartupError) as info:
        check_image_ids(CONFIG, files)
    return str(info.value)


def test_the_hosts_files_as_they_are_pass(etc):
    check_image_ids(CONFIG, etc)
    check_image_ids(Config())  # the defaults, against this host's own /etc


@pytest.mark.parametrize(
    "name, line, named",
    [
        ("subuid", f"rootless:{BASE + 65536 * 3}:65536", f"subuid: rootless:{BASE + 196608}:65536 ({BASE + 196608}-"),
        ("subuid", f"early:{BASE - 10}:11", f"subuid: early:{BASE - 10}:11 ({BASE - 10}-{BASE})"),  # its last id
        ("subgid", f"1000:{BASE + 5}:1", f"subgid: 1000:{BASE + 5}:1 ({BASE + 5}-{BASE + 5})"),
        ("passwd", f"svc:x:{BASE + 7}:100::/home/svc:/bin/sh", f"passwd: svc (uid {BASE + 7})"),
        ("passwd", f"svc:x:1234:{BASE + 70000}::/home/svc:/bin/sh", f"passwd: svc (gid {BASE + 70000})"),
        ("group", f"staff2:x:{BASE + 4 * 65536 - 1}:", f"group: staff2 (gid {BASE + 262143})"),
    ],
)
def test_an_overlap_stops_start_up_naming_the_range_and_the_entry(etc, name, line, named):
    add(getattr(etc, name), line)
    said = refusal(etc)
    assert said.startswith(f"IMAGE_UID_BASE: the image id ranges {RANGE} overlap "), said
    assert f"{etc.passwd.parent}/{named}" in said, said


@pytest.mark.parametrize(
    "name, line",
    [
        ("subuid", f"below:{BASE - 65536}:65536"),  # ends just before the first id
        ("subgid", f"above:{BASE + 4 * 65536}:65536"),  # starts just after the last
        ("subuid", f"empty:{BASE}:0"),
        ("passwd", f"svc:x:{BASE - 1}:{BASE + 4 * 65536}::/:/bin/sh"),
        ("group", f"g:x:{BASE + 4 * 65536}:"),
        ("subuid", "# a comment naming 200000001"),
        ("subuid", f"not-a-range:{BASE}"),
    ],
)
def test_no_overlap_starts(etc, name, line):
    add(getattr(etc, name), line)
    check_image_ids(CONFIG, etc)


def test_every_overlap_is_named_five_at_most(etc):
    for n in range(7):
        add(etc.group, f"g{n}:x:{BASE + n}:")
    assert len(overlaps(BASE, BASE + 4 * 65536, etc)) == 7
    assert refusal(etc).endswith(
        f"g4 (gid {BASE + 4}) and 2 more: set IMAGE_UID_BASE to ids nothing else on this host uses"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace of its own needs root")
@pytest.mark.parametrize("command", ["run_worker", "serve"])
def test_the_worker_and_serve_refuse_to_start(etc, tmp_path, workspace_base, command):
    """The commands themselves, with an account in the range: /etc/passwd is a copy bound over the
    host's in a mount namespace only this command lives in."""
    add(etc.passwd, f"intruder:x:{BASE + 65536}:{BASE + 65536}::/nonexistent:/usr/sbin/nologin")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env.update(
        DATA_DIR=str(tmp_path / "data"),
        WORKSPACE_BASE=str(workspace_base),
        IMAGE_UID_BASE=str(BASE),
        SANDBOX_UID_COUNT="4",
        MAX_CONCURRENT_EVALS="2",
        GUNICORN_BIND=f"127.0.0.1:{free_port()}",  # should serve start after all: not on 8080
    )
    script = f'mount --make-rprivate / && mount --bind "$1" /etc/passwd && exec "$2" manage.py {command}'
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", str(etc.passwd), sys.executable],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines()[-1] == (
        f"term-executor: configuration error: IMAGE_UID_BASE: the image id ranges {RANGE} overlap /etc/passwd: "
        f"intruder (uid {BASE + 65536}); /etc/passwd: intruder (gid {BASE + 65536}): set IMAGE_UID_BASE to ids "
        "nothing else on this host uses"
    )
    assert "started" not in done.stderr + done.stdout
    assert "intruder" not in Path("/etc/passwd").read_text()  # the host's own file never changed
