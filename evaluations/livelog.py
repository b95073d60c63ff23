"""The combined log of an evaluation, as GET /evaluate/{id}/logs and the admin show it.

1. While the evaluation runs, the log is the session's ``log.txt``: the
   pipeline writes a ``=== <step> ===`` line as each step starts and the
   spawner appends every command's output as it comes (capped per command).
   The web process reads it from ``WORKSPACE_BASE/<eval_id>/log.txt``, so the
   API and the worker must share that folder (one host, or a shared volume).
2. The session folder is removed when the evaluation ends. From then on the
   log is rebuilt from the row: the agent's stored output, the test results'
   rows and the error. It is a different document from the live file (the clone
   and install outputs are not kept), so a client that tailed the live log
   reads the final one from offset 0 once ``complete`` turns true.
3. The file is opened without following links: with SANDBOX=none and a
   non-root service, commands run as the service's user and could replace
   ``log.txt`` with a link to a secret.
4. The executor's own lines (a step, a test and its verdict, a kill, the end)
   start with ``LOG_MARK`` (U+241E) and a space, at the start of a line. A
   command's output cannot forge one: the capture replaces LOG_MARK in it
   with U+FFFD (runtime/output.py), and so does the rebuilt log. A reader
   (``grep '^␞'``, the admin) takes a line for the executor's by its first
   character only.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from evaluations.models import TERMINAL_STATUSES, Evaluation
from evaluations.runtime.output import LOG_MARK

LOG_NAME = "log.txt"
NOT_MARK = "\ufffd"  # what LOG_MARK in a command's output becomes
MAX_CHUNK_BYTES = 1024 * 1024  # per response; a client asks again from the returned offset


@dataclass(frozen=True)
class LogChunk:
    data: bytes
    next_offset: int
    complete: bool  # the evaluation has ended and this chunk reaches the end of its log


def executor_line(text: str) -> str:
    """One line of the executor's: LOG_MARK, a space, ``text`` kept on one line (a sentence that
    quotes a command's output cannot start a line of its own, marked or not)."""
    flat = " ".join(text.replace(LOG_MARK, NOT_MARK).splitlines())
    return f"{LOG_MARK} {flat}\n"


def unmarked(output: str) -> str:
    """A command's output as it may appear in the log: without LOG_MARK."""
    return output.replace(LOG_MARK, NOT_MARK)


def is_executor_line(line: str) -> bool:
    return line.startswith(LOG_MARK)


def step_marker(step: str) -> bytes:
    return executor_line(f"=== {step} ===").encode()


def test_marker(name: str) -> str:
    return executor_line(f"=== {name} ===")


def test_verdict(name: str, passed: bool, exit_code: int | None, timed_out: bool) -> str:
    how = "timed out" if timed_out else f"exit {'none' if exit_code is None else exit_code}"
    return executor_line(f"--- {name}: {'passed' if passed else 'failed'} ({how}) ---")


def kill_line(detail: str) -> str:
    return executor_line(f"[killed: {detail}]")


def truncation_line(omitted: int) -> str:
    return executor_line(f"[... {omitted} bytes truncated ...]")


def end_block(status: str, error: str) -> str:
    """The last lines of every log: the final status and the error sentence (a cancel names who asked)."""
    return executor_line(f"=== {status} ===") + (executor_line(error) if error else "")


def append_step_marker(log_path: Path, step: str) -> None:
    """Called by the pipeline as a step starts; a missing log (a test's bare session) is no error."""
    append_text(log_path, step_marker(step).decode())


def append_text(log_path: Path, text: str) -> None:
    """A line of the pipeline's own (a test's name, a kill, the end) between the commands' outputs,
    on a line of its own: after a newline when the output before it did not end with one."""
    try:
        fd = os.open(log_path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            text = "\n" + text
        os.write(fd, text.encode("utf-8", errors="replace"))
    finally:
        os.close(fd)


def open_session_log(workspace_base: Path, eval_id) -> int | None:
    """A read fd on the live log, or None when there is no such regular file (links not followed)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dir_fd = os.open(Path(workspace_base) / str(eval_id), flags | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fd = os.open(LOG_NAME, flags | os.O_NONBLOCK, dir_fd=dir_fd)  # O_NONBLOCK: a planted FIFO cannot hang us
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def read_session_log(workspace_base: Path, eval_id, offset: int, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of the live log from ``offset``; None when there is no log file."""
    fd = open_session_log(workspace_base, eval_id)
    if fd is None:
        return None
    try:
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)


def session_log_size(workspace_base: Path, eval_id) -> int | None:
    fd = open_session_log(workspace_base, eval_id)
    if fd is None:
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def final_log(evaluation: Evaluation) -> str:
    """The log of an ended evaluation: the stored live log, or one rebuilt as the live one reads
    from its outputs and test rows (an evaluation that never ran a step, or ended before the log
    was kept)."""
    if evaluation.log:
        return evaluation.log
    parts = []
    if evaluation.agent_output or evaluation.agent_exit_code is not None:
        exit_code = "none" if evaluation.agent_exit_code is None else evaluation.agent_exit_code
        parts.append(executor_line(f"=== running_agent (exit {exit_code}) ===") + unmarked(evaluation.agent_output))
    tests = evaluation.test_results.order_by("position").values_list(
        "name", "passed", "exit_code", "timed_out", "output"
    )
    if tests:
        parts.append(executor_line("=== running_tests ==="))
    for name, passed, exit_code, timed_out, output in tests:
        parts.append(test_marker(name) + unmarked(output))
        parts.append(test_verdict(name, passed, exit_code, timed_out))
    parts.append(end_block(evaluation.status, evaluation.error))
    return "".join(part if part.endswith("\n") else part + "\n" for part in parts)


def read_log(evaluation: Evaluation, workspace_base: Path, offset: int, limit: int) -> LogChunk:
    """The log from ``offset``: the live file while the evaluation runs, the final log once it ended.

    An offset past the end returns nothing and the same offset (a live log may still grow to it).
    """
    if evaluation.status not in TERMINAL_STATUSES:
        data = read_session_log(workspace_base, evaluation.id, offset, limit)
        if data is not None:
            return LogChunk(data, offset + len(data), complete=False)
        # No file: not started yet, on another host, or it ended a moment ago.
        evaluation.refresh_from_db(fields=["status", "agent_output", "agent_exit_code", "error", "log"])
        if evaluation.status not in TERMINAL_STATUSES:
            return LogChunk(b"", offset, complete=False)
    blob = final_log(evaluation).encode("utf-8", errors="replace")
    data = blob[offset : offset + limit]
    next_offset = offset + len(data)
    return LogChunk(data, next_offset, complete=next_offset >= len(blob))


LIVE, STORED, REBUILT, NONE = "live", "stored", "rebuilt", "none"


def log_tail(evaluation: Evaluation, workspace_base: Path, max_bytes: int) -> tuple[str, int, str]:
    """The last ``max_bytes`` of the log as text, how many bytes come before them, and where it came from:
    LIVE (the session's file), STORED (the live log kept at the end), REBUILT (from the stored outputs)
    or NONE (a running evaluation whose log file is not on this host, or not made yet).
    """
    if evaluation.status not in TERMINAL_STATUSES:
        size = session_log_size(workspace_base, evaluation.id)
        if size is None:
            return "", 0, NONE
        skipped = max(0, size - max_bytes)
        data = read_session_log(workspace_base, evaluation.id, skipped, max_bytes) or b""
        return _from_char_start(data).decode("utf-8", errors="replace"), skipped, LIVE
    blob = final_log(evaluation).encode("utf-8", errors="replace")
    skipped = max(0, len(blob) - max_bytes)
    return (
        _from_char_start(blob[skipped:]).decode("utf-8", errors="replace"),
        skipped,
        (STORED if evaluation.log else REBUILT),
    )


def _from_char_start(data: bytes) -> bytes:
    """Without the continuation bytes a cut in the middle of a character left at the start."""
    start = 0
    while start < min(3, len(data)) and data[start] & 0xC0 == 0x80:
        start += 1
    return data[start:]
