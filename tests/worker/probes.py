"""Code that test_memory.py runs in a process of its own (``python -c``), printing one JSON line.

Each probe starts from a fresh interpreter, as ``manage.py serve`` does, so what it
reports about imports and helper processes is not muddled by the test runner's own.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time

import django


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")
    django.setup()


def _get(app, path: str) -> str:
    statuses = []
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "probe",
        "SERVER_PORT": "80",
        "wsgi.input": io.BytesIO(),
        "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http",
    }
    b"".join(app(environ, lambda status, headers, exc_info=None: statuses.append(status)))
    return statuses[0]


def first_use(task_file: str) -> None:
    """After serve's preload: the modules a first query, the API's reads and a task file import."""
    _setup()
    from evaluations.management.commands.serve import preload

    preload()
    before = set(sys.modules)
    from django.core.handlers.wsgi import WSGIHandler

    from evaluations.models import Evaluation, Status, Step

    row = Evaluation.objects.create(
        task_url="http://127.0.0.1/task.tar.gz", agent_code="print(1)", status=Status.PENDING, step=Step.QUEUED
    )
    Evaluation.objects.filter(id=row.id).update(agent_output="done")
    app = WSGIHandler()
    statuses = [_get(app, path) for path in ("/health", "/status", f"/evaluate/{row.id}", "/evaluations", "/metrics")]
    with open(task_file, encoding="utf-8-sig") as handle:
        handle.read()
    from executor_project.memory import POSTGRESQL_DRIVERS

    drivers = [name for name in POSTGRESQL_DRIVERS if sys.modules.get(name) is not None]
    print(json.dumps({"statuses": statuses, "imported": sorted(set(sys.modules) - before), "drivers": drivers}))


def wait_for_worker_loss(eval_id: str, runtime, channel) -> None:
    """A Pool target: exit 0 once its liveness pipe says the worker is gone (3 if it never does)."""
    from evaluations.pipeline.cancel import CancelState, Stop
    from evaluations.worker.child import start_watching_worker

    state = CancelState()
    start_watching_worker(channel, state)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if state.stop is Stop.WORKER_LOST:
            sys.exit(0)
        time.sleep(0.05)
    sys.exit(3)


def pool_worker_loss() -> None:
    """A real Pool (forkserver and all): start an evaluation process, drop the worker's end of its
    liveness pipe (as the worker's death would), report what ran."""
    _setup()
    import multiprocessing.resource_tracker
    from multiprocessing.connection import wait

    import psutil

    from evaluations.worker.pool import Pool

    pool = Pool(1, None, target=wait_for_worker_loss)
    pool.start("probe")
    helpers = [child.name() for child in psutil.Process().children()]
    pool.running["probe"].alive.close()
    wait(pool.sentinels(), timeout=60)
    finished = pool.reap()
    tracker = multiprocessing.resource_tracker._resource_tracker
    print(
        json.dumps(
            {
                "finished": finished,
                "children": helpers,
                "tracker_pid": tracker._pid,
                "descendants": [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)],
            }
        )
    )


def write_pid(path: str, runtime, channel) -> None:
    """A Pool target: write this process's pid to ``path`` (the id it was given)."""
    with open(path, "w") as out:
        out.write(str(os.getpid()))


def write_note(path: str, runtime, channel, note: str = "NONE") -> None:
    """A Pool target: write the note it was given beside the id (``path``), NONE without one."""
    with open(path, "w") as out:
        out.write(note)


def pool_notes(folder: str) -> None:
    """A real Pool: ids with a note (one holding a space and a line break) and one without, handed
    to a spare and to processes forked for them; report what each target was given."""
    _setup()
    from multiprocessing.connection import wait

    from evaluations.worker.pool import Pool

    report = {}
    for kind, pool in (
        ("spare", Pool(1, None, target=write_note, spare=True)),
        ("fork", Pool(1, None, target=write_note)),
    ):
        for name, note in (("noted", "12 2026-12-01T04:00:00.123456+00:00"), ("lines", "a\nb"), ("plain", "")):
            pool.keep_spare()
            path = os.path.join(folder, f"{kind}-{name}")
            pool.start(path, note=note)
            finished = []
            while not finished:
                wait(pool.sentinels(), timeout=60)
                finished = pool.reap()
            with open(path) as written:
                report[f"{kind}-{name}"] = [written.read(), [os.path.basename(eval_id) for eval_id, _ in finished]]
        pool.end_spare()
    print(json.dumps(report))


def pool_spare(folder: str) -> None:
    """A real Pool keeping a spare: an id handed to the spare, one started after the spare died, the
    spare at capacity and at the pool's end; report the pids and what each process ended with."""
    _setup()
    import signal
    from multiprocessing.connection import wait

    from evaluations.worker.pool import Pool

    pool = Pool(1, None, target=write_pid, spare=True)

    def run(name: str) -> tuple[list, int]:
        path = os.path.join(folder, name)
        pool.start(path)
        finished = []
        while not finished:  # (its report pipe's end may wake the wait before its exit)
            wait(pool.sentinels(), timeout=60)
            finished = [[os.path.basename(eval_id), code] for eval_id, code in pool.reap()]
        with open(path) as written:
            return finished, int(written.read())

    report = {}
    pool.keep_spare()
    report["spare"] = pool.spare.process.pid
    report["handed"], report["handed_pid"] = run("handed")
    pool.keep_spare()
    dead = pool.spare
    os.kill(dead.process.pid, signal.SIGKILL)
    wait([dead.pidfd], timeout=60)  # dead, and not yet reaped by the pool: start finds it so
    report["dead_spare"] = dead.process.pid
    report["after_death"], report["after_death_pid"] = run("after_death")
    pool.keep_spare()
    pool.start(os.path.join(folder, "full"))  # the spare takes it: the pool is full
    pool.keep_spare()
    report["spare_when_full"] = pool.spare is not None
    while not pool.reap():
        wait(pool.sentinels(), timeout=60)
    pool.keep_spare()
    ended = pool.spare
    pool.end_spare()
    report["ended_exitcode"] = ended.process.exitcode
    report["left"] = [child.pid for child in _forkserver_children()]
    print(json.dumps(report))


def _forkserver_children():
    import psutil

    forkservers = [child for child in psutil.Process().children() if child.name() == "te-forkserver"]
    return [
        child for forkserver in forkservers for child in forkserver.children() if child.status() != psutil.STATUS_ZOMBIE
    ]


def leave_behind(path: str, runtime, channel) -> None:
    """A Pool target: write this process's pid to ``path`` (the id); the id's name says what it also
    leaves behind: ``thread`` a thread still running, ``env`` a variable, ``fd`` an open pipe,
    ``child`` a child process, ``cwd`` another working folder, ``umask``, ``nice``, ``limit`` (a
    lower soft limit of open files), ``signal`` a handler, ``raise`` an exception; ``clean`` nothing."""
    import resource
    import signal
    import threading

    with open(path, "w") as out:
        out.write(str(os.getpid()))
    kind = os.path.basename(path).split("-")[0]
    if kind == "thread":
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    elif kind == "env":
        os.environ["LEFT_BEHIND"] = "1"
    elif kind == "fd":
        os.pipe()
    elif kind == "child":
        import subprocess

        child = subprocess.Popen(["sleep", "30"])
        with open(f"{path}.child", "w") as out:
            out.write(str(child.pid))
    elif kind == "cwd":
        os.chdir(os.path.dirname(path))
    elif kind == "umask":
        os.umask(0)
    elif kind == "nice":
        os.nice(1)
    elif kind == "limit":
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 1, hard))
    elif kind == "signal":
        signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    elif kind == "raise":
        raise RuntimeError("the target failed")


def pool_reuse(folder: str, names: list[str], reuses: int) -> None:
    """A real Pool with a spare and ``reuses``: each id of ``names`` run in turn (leave_behind);
    report the pid each ran in, the spare's pid after it, and whether that spare ran one already."""
    _setup()
    from multiprocessing.connection import wait

    from evaluations.worker import pool as pool_module
    from evaluations.worker.pool import Pool

    pool_module.THREADS_END_SECS = 0.5  # the thread left behind sleeps 30 s: not waited for
    pool = Pool(2, None, target=leave_behind, spare=True, reuses=reuses)
    pool.keep_spare()
    runs = []
    for name in names:
        path = os.path.join(folder, name)
        pool.start(path)
        finished = []
        while not finished:
            wait(pool.sentinels(), timeout=60)
            finished = pool.reap()
        pool.keep_spare()
        with open(path) as written:
            ran_in = int(written.read())
        if os.path.exists(f"{path}.child"):
            with open(f"{path}.child") as written:
                os.kill(int(written.read()), 9)
        spare = pool.spare
        runs.append(
            {
                "name": name,
                "finished": [[os.path.basename(eval_id), code] for eval_id, code in finished],
                "pid": ran_in,
                "spare": spare.process.pid,
                "spare_warm": spare.warm,
                "alive": [child.pid for child in _forkserver_children()],
            }
        )
    pool.end_spare()
    print(json.dumps({"runs": runs, "left": [child.pid for child in _forkserver_children()]}))


def tidy_after_report(wait: bool = False) -> None:
    """A Pool ``tidy``: blocks on the FIFO named by TIDY_FIFO until the pool's holder has read the
    evaluation's report and opened it (``wait``, at the process's end: appends a line, no FIFO)."""
    if wait:
        with open(os.environ["TIDY_LOG"], "a") as log:
            log.write("wait\n")
        return
    with open(os.environ["TIDY_FIFO"]) as fifo:
        line = fifo.readline()
    with open(os.environ["TIDY_LOG"], "a") as log:
        log.write(line)


def pool_tidy(folder: str) -> None:
    """A real Pool keeping its process (reuses 2), whose ``tidy`` waits until the report was read:
    two ids run one after the other in the same process, then the pool ends; report the pids, what
    the tidies logged, and whether the report came while the tidy still waited."""
    _setup()
    from multiprocessing.connection import wait

    from evaluations.worker.pool import Pool

    fifo, log = os.path.join(folder, "tidy.fifo"), os.path.join(folder, "tidy.log")
    os.mkfifo(fifo)
    os.environ.update(TIDY_FIFO=fifo, TIDY_LOG=log)  # the forkserver, started below, hands them on
    pool = Pool(1, None, target=write_pid, spare=True, reuses=2, tidy=tidy_after_report)
    pool.keep_spare()
    pids = []
    for name in ("first", "second"):
        path = os.path.join(folder, name)
        pool.start(path)
        finished = []
        while not finished:  # a tidy before the report would block forever: no report, a timeout
            if not wait(pool.sentinels(), timeout=60):
                print(json.dumps({"error": f"no report of {name}"}))
                pool.kill_all()
                return
            finished = pool.reap()
        with open(path) as written:
            pids.append(int(written.read()))
        if name == "first":
            with open(fifo, "w") as go:  # the kept process's tidy has it open: it waits for this line
                go.write(f"tidied {name}\n")
    pool.end_spare()  # the second reached its reuses: it tidied (wait) before it exited
    with open(log) as written:
        print(json.dumps({"pids": pids, "log": written.read().splitlines()}))
