"""Per-command cost of the process spawner, against a plain ``subprocess.run``.

    .venv/bin/python -m bench.spawner [RUNS]     # prints JSON

Median wall time of RUNS runs of ``/bin/true`` (output captured): plain
``subprocess.run``, the same as the unprivileged uid, the bare ``bwrap``
argv the sandbox builds (what bubblewrap itself costs), then
``Spawner.run`` with no sandbox, with bubblewrap, and as an exec in a phase's
sandbox (SPEC §25: the phase's bubblewrap started by the warm-up), and one kill sweep
(``Spawner.sweep``, six per evaluation without the sandbox). Run in a process of
its own: the spawner makes its host a child subreaper and treats every
child as a command.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")

from evaluations.runtime import (  # noqa: E402
    Bubblewrap,
    Limits,
    NoSandbox,
    SandboxPolicy,
    Spawner,
    killer,  # noqa: E402
    probe_bwrap,
    sandbox_uid,
)
from evaluations.runtime.killer import TAG_VAR  # noqa: E402
from evaluations.runtime.sandbox import usable_language_runtimes  # noqa: E402

LIMITS = Limits(
    timeout_secs=60,
    memory_bytes=2**30,
    disk_quota_bytes=2**30,
    max_processes=512,
    max_output_bytes=2**20,
    max_files=10**6,
)


def median_ms(call, runs: int) -> float:
    for _ in range(3):
        call()  # warm up
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def give_to(path: Path, uid: int | None) -> Path:
    os.chmod(path, 0o711)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def measure(runs: int) -> dict[str, float]:
    uid = sandbox_uid()
    owner = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
    env = {"PATH": "/usr/bin:/bin"}
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="te-bench-spawner-", dir="/tmp") as tmp:
        session = give_to(Path(tmp), uid)
        figures["plain"] = median_ms(lambda: subprocess.run(["/bin/true"], capture_output=True), runs)
        figures["plain_uid"] = median_ms(lambda: subprocess.run(["/bin/true"], capture_output=True, **owner), runs)
        reachable = usable_language_runtimes(uid)
        runtimes = [NoSandbox(reachable)]
        if probe_bwrap(uid)[0]:
            bwrap = Bubblewrap(reachable)
            runtimes.append(bwrap)
            policy = SandboxPolicy(namespaces=True, writable=(session,), runtimes=reachable)
            launch = bwrap.launch(["/bin/true"], policy, cwd=session, env={**env, TAG_VAR: f"bench-{os.getpid()}"})
            launch.close()  # bwrap alone: without the report on its pid 1 the spawner reads
            at = launch.argv.index("--info-fd")
            bare = launch.argv[:at] + launch.argv[at + 2 :]
            figures["bwrap_bare"] = median_ms(
                lambda: subprocess.run(bare, env=launch.env, cwd=launch.cwd, capture_output=True, **owner), runs
            )
        for runtime in runtimes:
            spawner = Spawner(eval_id=f"bench-{os.getpid()}", session_dir=session, runtime=runtime, uid=uid)

            def run(spawner=spawner):
                policy = SandboxPolicy(writable=(session,))
                result = spawner.run(["/bin/true"], cwd=session, env=env, limits=LIMITS, policy=policy)
                if result.exit_code != 0:
                    raise RuntimeError(f"spawner bench command failed: {result}")

            figures[f"spawner_{runtime.name}"] = median_ms(run, runs)
        if len(runtimes) > 1:  # a phase's sandbox (SPEC §25): each command an exec in one bubblewrap
            spawner = Spawner(eval_id=f"bench-phase-{os.getpid()}", session_dir=session, runtime=runtimes[1], uid=uid)
            with spawner.phase("bench", init_base=session.parent):

                def exec_in_phase(spawner=spawner):
                    policy = SandboxPolicy(writable=(session,))
                    result = spawner.run(["/bin/true"], cwd=session, env=env, limits=LIMITS, policy=policy)
                    if result.exit_code != 0:
                        raise RuntimeError(f"spawner bench command failed: {result}")

                figures["spawner_phase"] = median_ms(exec_in_phase, runs)
        # What the pipeline adds around commands: a kill sweep with nothing left to kill, one scan
        # of /proc (the evaluation's descendants and its own uid's processes). Timed read-only:
        # here the uid is shared (nobody, or the pool's first uid), and a real sweep by uid would
        # kill other people's processes.
        eval_id = f"bench-sweep-{os.getpid()}"
        figures["sweep"] = median_ms(lambda: killer.evaluation_processes(eval_id, uid=uid), runs)
        figures["processes"] = sum(name.isdigit() for name in os.listdir("/proc"))
    return figures


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 100)))
