"""Per-command cost of the spawner: ``.venv/bin/python -m tests.runtime.bench_overhead [N]``.

Median wall time of N runs of ``/bin/true`` (output captured) with plain
``subprocess.run``, then ``Spawner.run`` under NoSandbox and Bubblewrap.
Not a test: figures depend on the machine.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evaluations.runtime import Bubblewrap, Limits, NoSandbox, Spawner, probe_bwrap, sandbox_uid
from tests.runtime.support import give_to_sandbox_uid

LIMITS = Limits(timeout_secs=60, memory_bytes=2**30, disk_quota_bytes=2**30, max_processes=512, max_output_bytes=2**20)


def median_ms(call, runs: int) -> float:
    call()  # warm up
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main(runs: int) -> None:
    uid = sandbox_uid()
    owner = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
    env = {"PATH": "/usr/bin:/bin"}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        session = give_to_sandbox_uid(Path(tmp))
        plain = median_ms(lambda: subprocess.run(["/bin/true"], capture_output=True), runs)
        plain_uid = median_ms(lambda: subprocess.run(["/bin/true"], capture_output=True, **owner), runs)
        print(f"subprocess.run(['/bin/true'])            {plain:6.2f} ms")
        print(f"subprocess.run(..., user={uid})          {plain_uid:6.2f} ms")
        runtimes = [NoSandbox(uid)]
        if probe_bwrap(uid)[0]:
            runtimes.append(Bubblewrap(uid))
        for runtime in runtimes:
            spawner = Spawner(eval_id="bench", session_dir=session, runtime=runtime, uid=uid)

            def run(spawner=spawner):
                result = spawner.run(["/bin/true"], cwd=session, env=env, limits=LIMITS, writable=[session])
                assert result.exit_code == 0, result

            cost = median_ms(run, runs)
            print(f"Spawner.run, runtime {runtime.name:5}            {cost:6.2f} ms  (+{cost - plain:.2f} ms)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
