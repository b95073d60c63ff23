"""What keeps the service's memory down (issue 7): the figures are in bench/, the behaviour here.

* an evaluation's cancel is a byte on a pipe, so no resource tracker process runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from multiprocessing.connection import Connection

import pytest

from evaluations.worker.child import CancelFlag
from tests.helpers.service import PROJECT, FreshDatabase


def run_probe(call: str, env: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", f"from tests.worker import probes; probes.{call}"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_env(tmp_path, database_url: str) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "PYTEST_", "PROMETHEUS_"))}
    env.update({"DATA_DIR": str(tmp_path / "data"), "DATABASE_URL": database_url, "WORKSPACE_BASE": str(tmp_path)})
    return env


@pytest.mark.slow
def test_a_cancel_reaches_the_evaluation_process_and_no_resource_tracker_runs(tmp_path):
    database = FreshDatabase(tmp_path)
    try:
        report = run_probe("pool_cancel()", probe_env(tmp_path, database.url))
    finally:
        database.drop()
    assert report["finished"] == [["probe", 0]]  # exit 0: the target saw the cancel byte
    assert report["children"] == ["te-forkserver"]  # the evaluation process is the forkserver's child
    assert report["tracker_pid"] is None
    assert not [cmdline for cmdline in report["descendants"] if "resource_tracker" in cmdline]


def reader_and_writer() -> tuple[Connection, int]:
    read_fd, write_fd = os.pipe()
    return Connection(read_fd, writable=False), write_fd


def test_the_cancel_byte_sets_the_flag_for_good_and_end_of_file_does_not():
    channel, write_fd = reader_and_writer()
    flag = CancelFlag(channel)
    assert not flag.is_set()
    os.write(write_fd, b"c")
    assert flag.is_set() and flag.is_set()  # read once, seen from then on
    os.close(write_fd)

    channel, write_fd = reader_and_writer()
    flag = CancelFlag(channel)
    os.close(write_fd)  # the worker died: PR_SET_PDEATHSIG says so (flag.lost), not the pipe
    assert not flag.is_set()
    flag.lost = True
    assert flag.is_set()
