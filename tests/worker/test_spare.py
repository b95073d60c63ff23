"""The spare evaluation process (evaluations/worker/pool.py): forked ahead while the pool has room,
handed the next claim, replaced after; the worker's stop or death ends it."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import psutil
import pytest

from evaluations.worker.pool import SPARE_NAME
from tests.helpers.database_marks import NO_DATABASE_URL
from tests.helpers.polling import submit, wait_for, wait_terminal
from tests.helpers.tasks import SOLVER
from tests.worker.test_memory import probe_env, run_probe
from tests.worker.test_worker import WAITS_FOR_GO, evaluation_process

pytestmark = pytest.mark.slow


def spares(worker_pid: int) -> list[psutil.Process]:
    """The worker's spares: its descendants named SPARE_NAME (only a waiting spare is), zombies left out."""
    found = []
    for proc in psutil.Process(worker_pid).children(recursive=True):
        try:
            if proc.name() == SPARE_NAME and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.NoSuchProcess:
            pass
    return found


def the_spare(service, other_than: psutil.Process | None = None) -> psutil.Process:
    """Wait for a spare of the worker (one other than ``other_than``); never more than two (a fresh
    one and a warm one, pool.py)."""

    def found():
        waiting = spares(service.worker.pid)
        assert len(waiting) <= 2, waiting
        return next((proc for proc in waiting if other_than is None or proc.pid != other_than.pid), None)

    return wait_for(found, 30, what="a spare evaluation process")


def gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_pool_hands_an_id_to_its_spare_and_forks_when_the_spare_died(tmp_path):
    report = run_probe(f"pool_spare({str(tmp_path)!r})", probe_env(tmp_path, NO_DATABASE_URL))
    assert report["handed"] == [["handed", 0]] and report["handed_pid"] == report["spare"]
    # The dead spare was found dead at the claim: the id ran in a process forked for it.
    assert report["after_death"] == [["after_death", 0]]
    assert report["after_death_pid"] not in (report["dead_spare"], report["spare"])
    assert report["spare_when_full"] is False  # a spare only while the pool has room
    assert report["ended_exitcode"] == 0  # told to go (its pipe closed), it ran nothing
    assert report["left"] == []


def test_the_target_gets_the_note_given_with_the_id_in_a_spare_or_a_process_forked_for_it(tmp_path):
    """The claim's transition goes with the id to the evaluation's process (Pool.start's ``note``)."""
    report = run_probe(f"pool_notes({str(tmp_path)!r})", probe_env(tmp_path, NO_DATABASE_URL))
    for kind in ("spare", "fork"):
        assert report[f"{kind}-noted"] == ["12 2026-12-01T04:00:00.123456+00:00", [f"{kind}-noted"]]
        assert report[f"{kind}-lines"] == ["a\nb", [f"{kind}-lines"]]  # the id is the first line alone
        assert report[f"{kind}-plain"] == ["NONE", [f"{kind}-plain"]]


def test_a_kept_process_tidies_after_its_report_and_waits_for_its_tidy_before_it_exits(tmp_path):
    """The retired session's removal (child.tidy) is off the path to the next claim: the report goes
    first, and a process that ends (its reuses reached) waits for the removal before it exits."""
    report = run_probe(f"pool_tidy({str(tmp_path)!r})", probe_env(tmp_path, NO_DATABASE_URL))
    assert "error" not in report, report
    assert report["pids"][0] == report["pids"][1]  # kept for the second
    assert report["log"] == ["tidied first", "wait"]


def test_a_claim_runs_in_the_spare_and_a_new_spare_takes_its_place(worker_service, tasks):
    service = worker_service()
    spare = the_spare(service)
    eval_id, go = waiting_agent(service, tasks)
    assert evaluation_process(eval_id).pid == spare.pid
    assert spare.name() != SPARE_NAME  # named as a process forked for its evaluation is
    replacement = the_spare(service, other_than=spare)  # one evaluation of two: room for a spare
    let_go(go)
    body = wait_terminal(service, eval_id)
    assert (body["status"], body["passed"]) == ("completed", True), body["error"]
    # The process that ran it waits too, warm, beside the one that never ran: no other is forked.
    wait_for(lambda: {p.pid for p in spares(service.worker.pid)} == {spare.pid, replacement.pid}, 30,
             what="the evaluation's process as a spare beside the fresh one")  # fmt: skip


def test_the_next_evaluation_runs_in_the_process_of_the_last_unless_reuses_is_one(worker_service, tasks):
    service = worker_service()
    first, go = waiting_agent(service, tasks)
    process = evaluation_process(first)
    let_go(go)
    assert wait_terminal(service, first)["status"] == "completed"
    wait_for(lambda: process.pid in {p.pid for p in spares(service.worker.pid)}, 30, what="its process as a spare")
    second, go = waiting_agent(service, tasks)
    assert evaluation_process(second).pid == process.pid
    let_go(go)
    body = wait_terminal(service, second)
    assert (body["status"], body["passed"]) == ("completed", True), body["error"]

    service = worker_service(EVAL_PROCESS_REUSES=1)
    first, go = waiting_agent(service, tasks)
    process = evaluation_process(first)
    let_go(go)
    assert wait_terminal(service, first)["status"] == "completed"
    wait_for(lambda: gone(process), 30, what="the evaluation's process to exit")


def waiting_agent(service, tasks) -> tuple[str, Path]:
    """An evaluation whose agent waits on a FIFO: its id and the FIFO, once the agent runs."""
    eval_id = submit(service, tasks.task(), WAITS_FOR_GO + SOLVER)
    go = Path(service.env["WORKSPACE_BASE"]) / eval_id / "repo" / "go"
    wait_for(lambda: go.is_fifo(), 60, what="the agent's FIFO (it is running)")
    return eval_id, go


def let_go(go: Path) -> None:
    with open(go, "w") as fifo:
        fifo.write("go\n")


def database_handles(proc: psutil.Process, service) -> list:
    """What ``proc`` holds of the service's database: its SQLite file open, or a TCP connection to
    PostgreSQL's port."""
    if service.database.name is None:
        path = service.database.url.removeprefix("sqlite:///")
        return [handle for handle in proc.open_files() if handle.path == path]
    port = int(service.database.url.rsplit(":", 1)[1].split("/", 1)[0])
    return [conn for conn in proc.net_connections(kind="tcp") if conn.raddr and conn.raddr.port == port]


def test_a_spare_connects_to_the_database_before_its_claim_and_runs_on_that_connection(worker_service, tasks):
    """SPEC §25: the connect (and its set-up) is off the claim's path: the waiting spare holds its own
    connection, and the evaluation it is handed runs on it to the end."""
    service = worker_service()
    spare = the_spare(service)
    held = wait_for(lambda: database_handles(spare, service), 30, what="the spare's database connection")
    eval_id = submit(service, tasks.task(), WAITS_FOR_GO + SOLVER)
    go = Path(service.env["WORKSPACE_BASE"]) / eval_id / "repo" / "go"
    wait_for(lambda: go.is_fifo(), 60, what="the agent's FIFO (it is running)")
    assert evaluation_process(eval_id).pid == spare.pid
    assert [handle.fd for handle in database_handles(spare, service)] == [held[0].fd]  # the same connection
    with open(go, "w") as fifo:
        fifo.write("go\n")
    body = wait_terminal(service, eval_id)
    assert (body["status"], body["passed"]) == ("completed", True), body["error"]


def test_a_spare_that_died_is_replaced_and_loses_no_evaluation(worker_service, tasks):
    service = worker_service()
    spare = the_spare(service)
    spare.kill()
    wait_for(lambda: gone(spare), 10, what="the spare to die")
    body = wait_terminal(service, submit(service, tasks.task(), SOLVER))
    assert (body["status"], body["passed"]) == ("completed", True), body["error"]
    the_spare(service, other_than=spare)
    log = (service.folder / "worker.log").read_text()
    assert "the spare evaluation process died (killed by SIGKILL); another replaces it" in log


def test_the_workers_stop_or_death_leaves_no_spare(worker_service):
    service = worker_service()
    spare = the_spare(service)
    service.worker.send_signal(signal.SIGTERM)
    assert service.worker.wait(timeout=60) == 0
    assert gone(spare)  # the worker waited for it
    service.start_worker()
    spare = the_spare(service)
    service.worker.kill()
    service.worker.wait(timeout=60)
    wait_for(lambda: gone(spare), 10, what="the spare to end with its worker (the end of its pipe)")


def test_capacity_one_still_runs_evaluations_one_by_one(worker_service, tasks):
    service = worker_service(MAX_CONCURRENT_EVALS=1)
    the_spare(service)
    forkserver = next(proc for proc in psutil.Process(service.worker.pid).children() if proc.name() == "te-forkserver")
    most, done = [0], threading.Event()

    def count_processes():  # the forkserver's children: evaluation processes and the spare
        while not done.is_set():
            try:
                alive = [proc for proc in forkserver.children() if proc.status() != psutil.STATUS_ZOMBIE]
            except psutil.NoSuchProcess:
                alive = []
            most[0] = max(most[0], len(alive))
            done.wait(0.005)

    counter = threading.Thread(target=count_processes)
    counter.start()
    try:
        ids = [submit(service, tasks.task(), SOLVER) for _ in range(3)]
        bodies = [wait_terminal(service, eval_id) for eval_id in ids]
    finally:
        done.set()
        counter.join()
    assert [(body["status"], body["passed"]) for body in bodies] == [("completed", True)] * 3
    spans = sorted((datetime.fromisoformat(b["started_at"]), datetime.fromisoformat(b["finished_at"])) for b in bodies)
    assert all(finished <= started for (_, finished), (started, _) in pairwise(spans))
    assert most[0] == 1


def test_a_process_that_left_nothing_behind_is_kept_for_the_next_id_and_any_leftover_ends_it(tmp_path):
    leftovers = ["env", "thread", "fd", "child", "cwd", "umask", "nice", "limit", "signal", "raise"]
    # clean-0, clean-1, env-2, clean-3, thread-4, ...: a clean id before each leftover, one at the end.
    groups = [[f"clean-{2 * n}", f"{kind}-{2 * n + 1}"] for n, kind in enumerate(leftovers)]
    groups[0].insert(0, "clean-x")
    groups.append([f"clean-{2 * len(leftovers)}"])
    names = [name for group in groups for name in group]
    report = run_probe(f"pool_reuse({str(tmp_path)!r}, {names!r}, 5)", probe_env(tmp_path, NO_DATABASE_URL))
    runs = {run["name"]: run for run in report["runs"]}
    pid = {name: run["pid"] for name, run in runs.items()}
    # Each leftover ends its process: the next id runs in another, which the one after it runs in too.
    for group in groups:
        assert {pid[name] for name in group} == {pid[group[0]]}, group
    assert len({pid[group[0]] for group in groups}) == len(groups)
    for name, run in runs.items():
        kept = name.startswith("clean")
        assert run["spare_warm"] is kept, name  # a clean process is the spare after its run, warm
        assert (run["spare"] == run["pid"]) is kept, name
        assert run["finished"] == [[name, 1 if name.startswith("raise") else 0]]
        assert run["pid"] not in run["alive"] or kept, name  # a process with leftovers exited
    assert report["left"] == []


def test_a_process_runs_at_most_its_reuses_then_exits(tmp_path):
    names = ["clean-1", "clean-2", "clean-3", "clean-4"]
    report = run_probe(f"pool_reuse({str(tmp_path)!r}, {names!r}, 2)", probe_env(tmp_path, NO_DATABASE_URL))
    pids = [run["pid"] for run in report["runs"]]
    assert pids[0] == pids[1] != pids[2] == pids[3]
    assert [run["spare_warm"] for run in report["runs"]] == [True, False, True, False]
    assert report["left"] == []


def test_a_kept_process_removes_its_retired_sessions_on_a_thread_and_all_before_it_exits(tmp_path, caplog):
    """child.tidy: the folders its evaluations retired, removed on a thread (``wait``: here, the
    thread joined first); a folder it cannot remove (a mount inside: the walk does not cross it)
    is left to the reaper, with a warning, and the others still go."""
    from evaluations.cache import mounts
    from evaluations.pipeline.session import RETIRED_PREFIX
    from evaluations.worker import child

    folders = []
    for number in range(4):
        folder = tmp_path / f"{RETIRED_PREFIX}{number}"
        (folder / "repo" / "deep").mkdir(parents=True)
        (folder / "repo" / "deep" / "file").write_text("x")
        folders.append(folder)
    stuck = folders[2] / "repo" / "deep"
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(stuck)], check=True)
    try:
        child._retired.extend(folders[:2])
        child.tidy()
        assert child._retired == [] and child._removing is not None and child._removing.name == "remove-retired"
        child._retired.extend(folders[2:])
        with caplog.at_level(logging.WARNING, logger="term_executor.worker"):
            child.tidy(wait=True)
        assert child._removing is None and child._retired == []
        assert sorted(tmp_path.iterdir()) == [folders[2]]
        [message] = [record.getMessage() for record in caplog.records]
        assert message.startswith(f"could not remove {folders[2]} (the reaper will): "), message
    finally:
        mounts.unmount(stuck)


def test_a_process_reaped_before_its_pidfd_is_opened_counts_as_exited():
    """A process forked for an id that ends at once may be reaped by the forkserver before the pool
    opens its pidfd (ESRCH: seen once in CI, from ``Pool.start``): it counts as exited, not as a
    start that failed."""
    from evaluations.worker import pool

    process = subprocess.Popen(["true"])
    process.wait()  # reaped: its pid names nothing now
    fd = pool._pidfd(process)
    try:
        assert pool._has_exited(fd)
    finally:
        os.close(fd)
    running = subprocess.Popen(["sleep", "30"])
    fd = pool._pidfd(running)
    try:
        assert not pool._has_exited(fd)
        running.kill()
        running.wait()
        assert pool._has_exited(fd)
    finally:
        os.close(fd)
