"""A command runs, and what it gets and gives back is exactly what was asked."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from tests.helpers.polling import wait_for
from tests.runtime.support import UID, give_to_sandbox_uid, tagged_alive


def test_echo(sp):
    result = sp.run("echo hello")
    assert (result.exit_code, result.output, result.output_bytes) == (0, "hello\n", 6)
    assert (result.limit, result.limit_detail, result.timed_out) == (None, None, False)
    assert result.ok


def test_exit_code_is_passed_through(sp):
    assert sp.run("exit 7").exit_code == 7


def test_death_by_signal_reads_128_plus_signal_under_both_runtimes(sp):
    assert sp.run("kill -SEGV $$").exit_code == 128 + 11


def test_stdout_and_stderr_are_merged_in_order(sp):
    result = sp.run("echo one; echo two >&2; echo three")
    assert result.output == "one\ntwo\nthree\n"


def test_environment_is_exactly_the_given_one_plus_the_tag(sp, monkeypatch):
    monkeypatch.setenv("SERVICE_SECRET", "must-not-leak")
    given = sp.env(ODD="a b=c", EMPTY="")
    result = sp.run(["env"], env=given)
    seen = dict(line.split("=", 1) for line in result.output.splitlines())
    expected = {**given, "TERM_EXECUTOR_EVAL": sp.eval_id}
    if sp.sandboxed:
        expected["PWD"] = str(sp.session)  # bwrap always sets PWD to its --chdir folder
    assert seen == expected


def test_runs_as_the_unprivileged_uid(sp):
    expected = UID if UID is not None else os.getuid()
    assert sp.run("id -u; id -G").output == f"{expected}\n{expected}\n"


def test_runs_at_lowered_priority_under_rlimits(sp):
    thread = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, thread)
    result = sp.run("nice; ulimit -f; ulimit -u; ulimit -c", disk_quota_bytes=10 * 1024 * 1024, max_processes=50)
    nice, fsize_blocks, nproc, core = result.output.split()
    assert int(nice) >= 10
    assert os.getpriority(os.PRIO_PROCESS, thread) == before  # the bookkeeping keeps its priority
    assert int(fsize_blocks) * 1024 == 10 * 1024 * 1024  # bash counts 1024-byte blocks
    assert (nproc, core) == ("100", "0")  # twice max_processes: see spawner's docstring


def test_stdin_data_is_fed_without_deadlock(sp):
    data = os.urandom(3 * 1024 * 1024)
    result = sp.run("sha256sum | cut -c1-64", stdin_data=data)
    assert result.output.strip() == hashlib.sha256(data).hexdigest()


def test_stdin_is_empty_without_data(sp):
    assert sp.run("cat; echo end").output == "end\n"


def test_cwd_is_honoured(sp):
    sub = sp.session / "sub"
    sub.mkdir()
    give_to_sandbox_uid(sub)
    assert sp.run(["pwd"], cwd=sub).output == f"{sub}\n"


def test_missing_program_is_a_result_not_an_exception(sp):
    result = sp.run(["no-such-program-here"])
    assert result.exit_code in (1, 127)  # nice says 127; bwrap's execvp failure says 1
    assert "no-such-program-here" in result.output


def test_meanwhile_runs_on_the_callers_thread_while_the_command_runs(sp):
    """SPEC §25: the caller's work overlaps the command. The command says it started and waits
    for the go the caller's work gives: both happen only if that work ran after the start and
    before the end; a command that never got its go says so."""
    started, go = sp.session / "started", sp.session / "go"
    calls = []

    def meanwhile():
        calls.append(threading.current_thread())
        wait_for(started.exists, timeout=60, what="the command's start")
        go.write_text("")

    wait = "for i in $(seq 6000); do [ -e go ] && { echo went; exit 0; }; sleep 0.01; done; echo no-go"
    result = sp.run(f"echo > started; {wait}", meanwhile=meanwhile, timeout_secs=90)
    assert (result.exit_code, result.output) == (0, "went\n")
    assert calls == [threading.current_thread()]


def test_a_meanwhile_that_raises_ends_the_command_and_nothing_of_it_is_left(sp):
    started = sp.session / "started"

    def meanwhile():
        wait_for(started.exists, timeout=60, what="the command's start")
        raise RuntimeError("the caller's work failed")

    with pytest.raises(RuntimeError, match="the caller's work failed"):
        sp.run("echo > started; sleep 600 & sleep 600", meanwhile=meanwhile, timeout_secs=900)
    assert not tagged_alive(sp.eval_id)
    assert sp.run("echo next").output == "next\n"  # the spawner runs on (in a phase: a new sandbox)
