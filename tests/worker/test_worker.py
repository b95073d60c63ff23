"""run_worker with gunicorn, through HTTP: what a platform sees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from evaluations.runtime.killer import TAG_VAR
from tests.helpers.http import request
from tests.helpers.polling import evaluation, submit, wait_for, wait_terminal
from tests.helpers.service import PROJECT, LiveService
from tests.helpers.tasks import NOOP, SOLVER

pytestmark = pytest.mark.slow


def tagged_processes(eval_id: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TAG_VAR) == eval_id:
                found.append(proc)
        except (psutil.Error, OSError):
            pass
    return found


def evaluation_process(eval_id: str) -> psutil.Process:
    """The worker's per-evaluation process: run_worker -> forkserver -> it -> commands."""
    for proc in tagged_processes(eval_id):
        chain = [proc, *proc.parents()]
        # The forkserver and the evaluation processes are forks of run_worker: the same command
        # line. The worker is the outermost of them.
        workers = [index for index, node in enumerate(chain) if "run_worker" in " ".join(node.cmdline())]
        if workers and workers[-1] >= 2:
            return chain[workers[-1] - 2]
    raise AssertionError("no evaluation process found")


def test_a_solving_agent_passes_and_a_noop_fails(worker_service, tasks):
    service = worker_service()
    good = submit(service, tasks.task(), SOLVER)
    bad = submit(service, tasks.task(), NOOP)
    passed, failed = wait_terminal(service, good), wait_terminal(service, bad)
    assert (passed["status"], passed["passed"]) == ("completed", True), passed["error"]
    assert (failed["status"], failed["passed"]) == ("failed", False)
    steps = [t["step"] for t in passed["transitions"]]
    assert steps[:2] == ["queued", "queued"] and steps[-2:] == ["cleanup", "done"]
    assert "running_agent" in steps and "running_tests" in steps
    status = request("GET", service.url("/status")).json()
    assert status["workers"] == 1 and status["total_evals"] == 2 and status["passed"] == 1


def test_the_running_step_is_visible_while_the_agent_runs(worker_service, tasks):
    service = worker_service()
    eval_id = submit(service, tasks.task(), "import time; time.sleep(3)\n" + SOLVER)
    seen = wait_for(lambda: evaluation(service, eval_id)["step"] == "running_agent", 30, what="running_agent")
    assert seen
    assert evaluation(service, eval_id)["status"] == "running"
    assert wait_terminal(service, eval_id)["passed"] is True


def test_delete_kills_a_running_evaluation(worker_service, tasks):
    """The DELETE reaches the sleeping agent: it ends cancelled, its processes gone, long before
    the agent (300 s) would end by itself. How soon is bench/'s figure, not a test's."""
    service = worker_service()
    eval_id = submit(
        service, tasks.task(), "import subprocess, time\nsubprocess.Popen(['sleep', '300'])\ntime.sleep(300)"
    )
    wait_for(lambda: evaluation(service, eval_id)["step"] == "running_agent", 30, what="running_agent")
    wait_for(lambda: tagged_processes(eval_id), 10, what="agent processes")
    reply = request("DELETE", service.url(f"/evaluate/{eval_id}"))
    assert reply.status == 202 and reply.json()["status"] == "running"
    body = wait_terminal(service, eval_id, timeout=60)
    assert (body["status"], body["error"]) == ("cancelled", "running_agent: cancelled by DELETE")
    wait_for(lambda: not tagged_processes(eval_id), 30, what="agent processes to die")
    assert request("DELETE", service.url(f"/evaluate/{eval_id}")).json()["error"] == "already_finished"


def test_a_killed_evaluation_process_fails_its_evaluation_and_the_worker_goes_on(worker_service, tasks, workspace_base):
    service = worker_service()
    victim = submit(service, tasks.task(), "import time; time.sleep(300)")
    wait_for(lambda: evaluation(service, victim)["step"] == "running_agent", 30, what="running_agent")
    wait_for(lambda: tagged_processes(victim), 10, what="agent processes")
    evaluation_process(victim).send_signal(signal.SIGKILL)
    body = wait_terminal(service, victim, timeout=15)
    assert body["status"] == "failed"
    assert body["error"] == "running_agent: executor process died (killed by SIGKILL)"
    wait_for(lambda: not tagged_processes(victim), 10, what="the dead evaluation's processes to be swept")
    # The worker kills them, then removes the folder: the folder can outlive them by a moment.
    wait_for(lambda: not (workspace_base / victim).exists(), 10, what="the dead evaluation's folder to be removed")
    after = submit(service, tasks.task(), SOLVER)
    assert wait_terminal(service, after)["passed"] is True


def test_agent_timeout_from_the_request_cancels(worker_service, tasks):
    service = worker_service()
    eval_id = submit(service, tasks.task(), "import time; time.sleep(60)", timeout_secs=1)
    body = wait_terminal(service, eval_id, timeout=30)
    assert (body["status"], body["error"], body["test_results"]) == (
        "cancelled",
        "running_agent: agent timed out after 1 s",
        [],
    )


def test_session_ttl_cancels_a_long_evaluation(worker_service, tasks):
    service = worker_service(SESSION_TTL_SECS=3)
    eval_id = submit(service, tasks.task(), "import time; time.sleep(60)")
    body = wait_terminal(service, eval_id, timeout=20)
    assert (body["status"], body["error"]) == ("cancelled", "running_agent: session TTL expired")


def test_evaluations_beyond_capacity_queue_and_all_finish(worker_service, tasks):
    service = worker_service(MAX_CONCURRENT_EVALS=2)
    ids = [submit(service, tasks.task(), SOLVER) for _ in range(5)]
    results = [wait_terminal(service, eval_id) for eval_id in ids]
    assert all(r["passed"] for r in results), [r["error"] for r in results]


@pytest.mark.database  # a LiveService of its own, migrated
def test_serve_runs_each_process_once_and_sigterm_stops_them_all(tmp_path, tasks, workspace_base):
    env = {"ALLOWED_PRIVATE_HOSTS": "127.0.0.1", "WORKSPACE_BASE": str(workspace_base)}
    service = LiveService(tmp_path / "svc", env=env)
    service.manage("migrate", "--noinput")
    serve = subprocess.Popen([sys.executable, "manage.py", "serve"], cwd=PROJECT, env=service.env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        service.gunicorn = serve
        service.wait_healthy()
        wait_for(lambda: request("GET", service.url("/status")).json()["workers"] == 1, 20, what="the worker")
        eval_id = submit(service, tasks.task(), SOLVER)
        body = wait_terminal(service, eval_id)
        assert body["passed"] is True, body["error"]  # the pool has started a process
        root = psutil.Process(serve.pid)
        tree = {proc.name(): sorted(child.name() for child in proc.children()) for proc in [root, *root.children()]}
        assert tree == {
            "te-serve": ["te-gunicorn", "te-worker"],
            "te-gunicorn": ["te-gunicorn", "te-gunicorn"],  # the master and its WEB_WORKERS=2 workers
            "te-worker": ["te-forkserver"],
        }
        master = next(proc for proc in root.children() if proc.name() == "te-gunicorn")
        assert master.num_threads() == 1  # no control-socket thread
        everything = root.children(recursive=True)
        assert not [proc for proc in everything if "resource_tracker" in " ".join(proc.cmdline())]
        # serve has exec'd its supervisor (executor_project/supervisor.py): a bare interpreter, not the
        # ~70 MB resident of a Python that imported Django (as each of its children here), with nothing open
        # but its standard descriptors; its children run with no signal blocked.
        assert root.memory_info().rss < 15 << 20, root.memory_info()
        assert min(proc.memory_info().rss for proc in everything) > 40 << 20
        assert sorted(int(fd) for fd in os.listdir(f"/proc/{serve.pid}/fd")) == [0, 1, 2]
        assert [blocked_signals(proc.pid) for proc in root.children()] == [0, 0]
        metrics = service.folder / "data" / "prometheus" / f"serve-{serve.pid}"
        assert metrics.is_dir()
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0
        wait_for(lambda: not running(everything), 30, what="every process of the service to end")
        assert not metrics.exists()
    finally:
        if serve.poll() is None:
            serve.kill()
        service.database.drop()


# The agent blocks on a FIFO in its repository until the test writes to it, so the forkserver dies while
# it runs (bounded by the agent's timeout if the test never writes). The FIFO goes before the solver runs.
WAITS_FOR_GO = """\
import os
go = os.path.join(os.environ["REPO_DIR"], "go")
os.mkfifo(go)
with open(go) as fifo:
    fifo.read()
os.remove(go)
"""


def test_the_forkserver_dying_alone_loses_no_running_evaluation(worker_service, tasks):
    service = worker_service()
    eval_id = submit(service, tasks.task(), WAITS_FOR_GO + SOLVER)
    go = Path(service.env["WORKSPACE_BASE"]) / eval_id / "repo" / "go"
    wait_for(lambda: go.is_fifo(), 60, what="the agent's FIFO (it is running)")
    forkservers = [proc for proc in psutil.Process(service.worker.pid).children() if proc.name() == "te-forkserver"]
    assert len(forkservers) == 1
    forkservers[0].kill()  # the evaluation's parent: the worker, a subreaper, adopts it
    with open(go, "w") as fifo:  # the agent goes on only now (open waits for its reader, which is there)
        fifo.write("go\n")
    body = wait_terminal(service, eval_id, timeout=60)
    assert (body["status"], body["passed"], body["error"]) == ("completed", True, None)
    # And the worker goes on: a new evaluation still runs (multiprocessing starts a forkserver again).
    after = wait_terminal(service, submit(service, tasks.task(), SOLVER), timeout=90)
    assert (after["status"], after["passed"]) == ("completed", True), after["error"]


@pytest.mark.database  # a LiveService of its own, migrated
def test_serve_stops_gunicorn_and_exits_1_naming_the_worker_when_the_worker_dies(tmp_path, workspace_base):
    env = {"ALLOWED_PRIVATE_HOSTS": "127.0.0.1", "WORKSPACE_BASE": str(workspace_base)}
    service = LiveService(tmp_path / "svc", env=env)
    service.manage("migrate", "--noinput")
    log = tmp_path / "serve.log"
    with open(log, "wb") as output:
        serve = subprocess.Popen([sys.executable, "manage.py", "serve"], cwd=PROJECT, env=service.env,
                                 stdout=subprocess.DEVNULL, stderr=output)  # fmt: skip
    try:
        service.gunicorn = serve
        service.wait_healthy()
        wait_for(lambda: request("GET", service.url("/status")).json()["workers"] == 1, 20, what="the worker")
        root = psutil.Process(serve.pid)
        everything = root.children(recursive=True)
        worker = next(proc for proc in root.children() if proc.name() == "te-worker")
        worker.kill()
        assert serve.wait(timeout=60) == 1
        assert log.read_text().splitlines()[-1] == "serve: worker exited with code -9; stopped the rest"
        # gunicorn stopped gracefully (its master and web workers); the worker's forkserver follows its worker.
        wait_for(lambda: not running(everything), 30, what="every process of the service to end")
        assert not (service.folder / "data" / "prometheus" / f"serve-{serve.pid}").exists()
    finally:
        if serve.poll() is None:
            serve.kill()
        service.database.drop()


def running(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``processes`` still running (a zombie, or one gone meanwhile, is not)."""
    alive = []
    for proc in processes:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


def blocked_signals(pid: int) -> int:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["SigBlk"].strip(), 16)
