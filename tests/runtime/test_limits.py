"""Every limit kills the whole tree, and says which limit with the figures."""

from __future__ import annotations

import multiprocessing
import os
import re
import threading
import time

import pytest

from tests.runtime.support import MIB

HOLD = "import time; time.sleep(60)"


def test_timeout_kills_a_sleeper_that_ignores_term(sp):
    result = sp.run("trap '' TERM; sleep 100", timeout_secs=1)
    assert (result.exit_code, result.timed_out, result.limit) == (None, True, "timeout")
    assert result.limit_detail == "timed out after 1 s"
    assert result.duration_ms < 2500


def test_memory_hog_is_killed(sp):
    result = sp.run(["python3", "-c", f"x = b'x' * (300 * 2**20); {HOLD}"], memory_bytes=100 * MIB)
    assert (result.exit_code, result.limit) == (None, "memory")
    used = int(re.fullmatch(r"memory limit exceeded \((\d+) MiB > 100 MiB\)", result.limit_detail)[1])
    assert used > 100
    assert result.duration_ms < 10_000


def test_memory_spread_over_four_children_each_under_the_limit_is_killed(sp):
    child = f"python3 -c \"x = b'x' * (45 * 2**20); {HOLD}\""
    result = sp.run(f"for i in 1 2 3 4; do {child} & done; wait", memory_bytes=150 * MIB)
    assert result.limit == "memory", result
    used = int(re.fullmatch(r"memory limit exceeded \((\d+) MiB > 150 MiB\)", result.limit_detail)[1])
    assert 150 < used < 4 * 150  # no child alone could have crossed it


def test_disk_filler_is_killed(sp):
    fill = "for i in $(seq 1 20); do dd if=/dev/zero of=fill$i bs=1M count=4 status=none; done; sleep 60"
    result = sp.run(fill, disk_quota_bytes=20 * MIB)
    assert result.limit == "disk", result
    used = int(re.fullmatch(r"disk quota exceeded \((\d+) MiB > 20 MiB\)", result.limit_detail)[1])
    assert 20 <= used <= 82  # at most all 80 MiB it writes, plus the folders' own blocks
    assert result.duration_ms < 30000  # killed, not left to sleep its 60 s


def test_one_file_cannot_outgrow_the_quota(sp):
    # The monitor's first look is after 5 s: this is RLIMIT_FSIZE alone.
    result = sp.run(
        "dd if=/dev/zero of=big bs=1M count=50 status=none", disk_quota_bytes=20 * MIB, monitor_interval_ms=5000
    )
    # The kernel's SIGXFSZ comes back as the disk limit, with the command's own exit code.
    assert (result.exit_code, result.limit) == (128 + 25, "disk")
    assert result.limit_detail == "file size limit exceeded (a single file over 20 MiB)"
    assert (sp.session / "big").stat().st_size == 20 * MIB


def test_a_disk_filled_between_two_walks_is_caught_after_the_command(sp):
    # The monitor's first walk would be after 5 s; the command is over long before.
    result = sp.run(
        "for i in 1 2 3; do dd if=/dev/zero of=f$i bs=1M count=10 status=none; done",
        disk_quota_bytes=20 * MIB,
        monitor_interval_ms=5000,
    )
    assert (result.exit_code, result.limit) == (0, "disk"), result
    assert re.fullmatch(r"disk quota exceeded \(\d+ MiB > 20 MiB\)", result.limit_detail)
    assert not result.ok


def test_empty_files_over_the_file_count_are_killed(sp):
    # 3000 empty files are a few dozen KiB of blocks, far under the disk quota, but 3000 inodes.
    make = "mkdir many && cd many && for i in $(seq 3000); do : > f$i; done; sleep 60"
    result = sp.run(make, disk_quota_bytes=20 * MIB, max_files=1000, timeout_secs=30)
    assert (result.exit_code, result.limit) == (None, "files"), result
    count = int(re.fullmatch(r"file count limit exceeded \((\d+) > 1000\)", result.limit_detail)[1])
    assert 1000 < count <= 3000 + 50  # what it made, plus the session's own folders
    assert result.duration_ms < 25000  # killed, not left to sleep its 60 s


def test_files_made_between_two_walks_are_caught_after_the_command(sp):
    result = sp.run("mkdir many && touch many/f{1..1500}", max_files=1000, monitor_interval_ms=5000)
    assert (result.exit_code, result.limit) == (0, "files"), result
    assert re.fullmatch(r"file count limit exceeded \(\d+ > 1000\)", result.limit_detail)


def test_a_sparse_file_counts_what_it_occupies(sp):
    with open(sp.session / "sparse", "wb") as sparse:
        sparse.truncate(100 * 1024**3)  # 100 GiB apparent, a few blocks real
    result = sp.run("sleep 1.2", disk_quota_bytes=20 * MIB)
    assert (result.exit_code, result.limit) == (0, None)


def test_process_storm_is_killed(sp):
    bomb = "bomb() { bomb & bomb & wait; }; bomb"
    result = sp.run(bomb, max_processes=20, timeout_secs=15)
    assert result.limit == "processes", result
    count = int(re.fullmatch(r"process limit exceeded \((\d+) > 20\)", result.limit_detail)[1])
    assert count > 20


def test_many_sleepers_over_the_process_limit_are_killed(sp):
    result = sp.run("for i in $(seq 100); do sleep 60 & done; wait", max_processes=30)
    assert result.limit == "processes", result


@pytest.mark.parametrize("kind", ["threading", "multiprocessing"])
def test_cancel_from_another_thread_kills_within_a_second(harness_factory, kind):
    event = threading.Event() if kind == "threading" else multiprocessing.get_context("spawn").Event()
    sp = harness_factory(cancel_event=event)
    set_at = []

    def cancel():
        time.sleep(0.3)
        set_at.append(time.monotonic())
        event.set()

    threading.Thread(target=cancel).start()
    result = sp.run("trap '' TERM; sleep 100; echo survived")
    returned_at = time.monotonic()
    assert (result.exit_code, result.limit, result.limit_detail) == (None, "cancelled", "cancelled")
    assert returned_at - set_at[0] < 1.0
    assert "survived" not in result.output


def test_cancelled_before_start_starts_nothing(harness_factory, session):
    event = threading.Event()
    event.set()
    sp = harness_factory(cancel_event=event)
    result = sp.run(f"touch {session}/started")
    assert (result.exit_code, result.limit) == (None, "cancelled")
    assert not os.path.exists(session / "started")
