"""Output: capped as head + marker + tail, memory flat, live log capped too."""

from __future__ import annotations

import io
import threading
import time

import psutil
import pytest

from evaluations.runtime import output
from evaluations.runtime.output import LOG_MARK, OutputCapture
from tests.runtime.support import MIB


def test_capture_keeps_everything_under_the_cap():
    capture = OutputCapture(10)
    for piece in (b"abc", b"def", b"ghij"):
        capture.feed(piece)
    assert (capture.text(), capture.total, capture.truncated) == ("abcdefghij", 10, 0)


def test_capture_keeps_head_and_tail_of_many_small_pieces():
    capture = OutputCapture(10)
    for index in range(100):
        capture.feed(str(index % 10).encode())
    assert capture.text() == "01234\n[... 90 bytes truncated ...]\n56789"


def test_live_log_is_capped_with_one_line_and_only_when_something_is_dropped():
    exact, over = io.BytesIO(), io.BytesIO()
    OutputCapture(8, exact).feed(b"12345678")
    capture = OutputCapture(8, over)
    for piece in (b"12345", b"6789", b"abc"):
        capture.feed(piece)
    assert exact.getvalue() == b"12345678"
    assert over.getvalue() == "12345678\n␞ [... live log stops after 8 bytes ...]\n".encode()


@pytest.mark.parametrize("cut", range(0, 9))
def test_the_log_mark_never_reaches_the_log_from_output_however_the_reads_split_it(cut):
    printed = "a␞b\n␞ === completed ===\n".encode()  # the mark is 3 bytes: every split of it
    log = io.BytesIO()
    capture = OutputCapture(1024, log)
    capture.feed(printed[:cut])
    capture.feed(printed[cut:])
    capture.end_log()
    assert log.getvalue() == "a\ufffdb\n\ufffd === completed ===\n".encode()
    assert capture.text() == printed.decode()  # the stored output is what was printed


@pytest.mark.parametrize("tail", [b"\xe2", b"\xe2\x90"])
def test_the_start_of_a_mark_left_at_the_end_of_a_command_cannot_join_the_next_one(tail):
    log = io.BytesIO()
    first = OutputCapture(1024, log)
    first.feed(b"x" + tail)
    first.end_log()
    second = OutputCapture(1024, log)
    second.feed(LOG_MARK.encode()[len(tail) :] + b" === completed ===\n")
    second.end_log()
    assert LOG_MARK.encode() not in log.getvalue()


def test_without_pidfd_exit_is_noticed_by_polling(sp, monkeypatch):
    monkeypatch.setattr(output, "_pidfd", lambda pid: None)  # as on kernels before 5.3
    assert sp.run("echo plain").output == "plain\n"
    held = sp.run("sleep 60 & echo held")  # a leftover holds the pipe: exit must still end run()
    assert (held.output, held.duration_ms < 1500) == ("held\n", True)
    sp.spawner.sweep()


def test_output_cap_keeps_head_marker_and_tail(sp):
    script = (
        "head -c 3000 /dev/zero | tr '\\0' H; head -c 5000 /dev/zero | tr '\\0' M; head -c 3000 /dev/zero | tr '\\0' T"
    )
    result = sp.run(script, max_output_bytes=4096)
    assert result.output_bytes == 11000
    assert result.output == "H" * 2048 + "\n[... 6904 bytes truncated ...]\n" + "T" * 2048


def test_invalid_utf8_is_replaced(sp):
    result = sp.run("printf 'ok \\377\\376 end \\xc3\\xa9'")
    assert result.output == "ok \ufffd\ufffd end é"


def test_200mb_flood_without_newlines_keeps_memory_flat(harness_factory, session):
    live_log = session / "live.log"
    sp = harness_factory(live_log=live_log)
    me = psutil.Process()
    before = me.memory_info().rss
    peak = before
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, me.memory_info().rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = sp.run("head -c 200000000 /dev/zero", max_output_bytes=MIB)
    finally:
        done.set()
        sampler.join()
    assert (result.exit_code, result.output_bytes) == (0, 200_000_000)
    assert f"[... {200_000_000 - MIB} bytes truncated ...]" in result.output
    assert len(result.output) < MIB + 100
    growth = max(peak, me.memory_info().rss) - before
    assert growth < 30 * MIB, f"the parent grew by {growth // MIB} MiB"
    logged = live_log.read_bytes()
    assert logged.startswith(b"\0" * MIB)
    assert logged[MIB:] == f"\n␞ [... live log stops after {MIB} bytes ...]\n".encode()


def test_live_log_receives_output_as_it_comes(harness_factory, session):
    live_log = session / "live.log"
    sp = harness_factory(live_log=live_log)
    finished = threading.Event()
    worker = threading.Thread(target=lambda: (sp.run("echo first; sleep 1; echo second"), finished.set()))
    worker.start()
    deadline = time.monotonic() + 0.8
    while time.monotonic() < deadline and b"first" not in (live_log.read_bytes() if live_log.exists() else b""):
        time.sleep(0.02)
    assert live_log.read_bytes() == b"first\n"
    assert not finished.is_set()
    worker.join()
    assert live_log.read_bytes() == b"first\nsecond\n"
