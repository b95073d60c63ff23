"""``python -m bench.harbor_trial [--runs N]``: one Harbor trial, our backend against Harbor's podman (issue 37).

Every figure is measured in this run, on this machine, and printed; none is judged by an assertion.

The task is Harbor's ``hello-world`` example as Harbor ships it in shape (``environment/Dockerfile``
with ``WORKDIR /app``, an instruction, ``solution/solve.sh`` writing ``/app/hello.txt``, and
``tests/test.sh`` writing the reward), written here; its ``FROM debian:bookworm`` is the suite's
Debian tree (bench.images.debian_layer), served as ``library/debian:bookworm`` by Debian's
docker-registry on 127.0.0.1 and, for podman, copied into its storage under the same name (skopeo).

1. ``harbor run -p TASK -a oracle -e podman`` (Harbor 0.25, podman with runc, podman-compose beside
   Harbor), ``--runs`` times after one warm-up (its image built once, as a warm harness has it).
2. ``harbor run -p TASK -a oracle -e term_executor_client.harbor:TermExecutorEnvironment --ek url=...
   --ek token=...`` against a live service with its worker on 127.0.0.1 (SQLite, bubblewrap; the
   Dockerfile built once in the warm-up, every instruction from the build cache after), as often.

Per trial: the trial's own time (its ``result.json`` ``started_at`` to ``finished_at``, what Harbor
reports per trial), its phases (environment setup, agent, verifier; the rest is Harbor's own and the
environment's stop), and the wall time of the ``harbor run`` process (Harbor's start-up included). Harbor comes
from the venv tests/helpers/harbor_venv.py makes (podman-compose added to it here when missing).
Everything started is stopped at the end, the jobs folders removed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.common import load_average
from bench.images import PATH_ENV, debian_layer
from tests.helpers.harbor_venv import ensure as ensure_harbor_venv
from tests.helpers.images import RegistryServer, push_image
from tests.helpers.service import LiveService

TOKEN = "bench-token"
PODMAN_NAME = "docker.io/library/debian:bookworm"
TASK = {
    "task.toml": '[task]\nname = "bench/hello-world"\n\n[verifier]\ntimeout_sec = 120.0\n\n'
    "[agent]\ntimeout_sec = 120.0\n\n[environment]\nbuild_timeout_sec = 600.0\ncpus = 1\nmemory_mb = 2048\n"
    "storage_mb = 10240\n",
    "instruction.md": 'Create a file called hello.txt with "Hello, world!" as the content.\n',
    "environment/Dockerfile": "FROM debian:bookworm\nWORKDIR /app\n",
    "solution/solve.sh": '#!/bin/bash\necho "Hello, world!" > hello.txt\n',
    "tests/test.sh": "#!/bin/bash\nif [ \"$(cat /app/hello.txt)\" = 'Hello, world!' ]; then echo 1 > /logs/verifier/reward.txt;"
    " else echo 0 > /logs/verifier/reward.txt; fi\n",
}


def write_task(folder: Path) -> Path:
    task = folder / "hello-world"
    for name, text in TASK.items():
        path = task / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if name.endswith(".sh"):
            path.chmod(0o755)
    return task


def harbor_venv() -> Path:
    venv = ensure_harbor_venv()
    if not (venv / "bin" / "podman-compose").exists():
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "podman-compose"], check=True)
    return venv


def podman_base(registry: RegistryServer) -> None:
    """The Debian tree in podman's storage as docker.io/library/debian:bookworm (no pull from the Hub)."""
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--src-tls-verify=false",
            f"docker://{registry.host}/library/debian:bookworm",
            f"containers-storage:{PODMAN_NAME}",
        ],
        check=True,
        capture_output=True,
    )


@contextlib.contextmanager
def service(root: Path, registry: RegistryServer):
    sessions = Path(tempfile.mkdtemp(prefix="te-bench-trial-", dir="/tmp"))
    os.chmod(sessions, 0o711)
    live = LiveService(
        root / "service",
        worker=True,
        env={
            "AUTH_TOKEN": TOKEN,
            "WORKSPACE_BASE": str(sessions),
            "IMAGE_REGISTRY_MIRRORS": f"docker.io={registry.host}",
            "IMAGE_INSECURE_REGISTRIES": registry.host,
            "ALLOWED_PRIVATE_HOSTS": "127.0.0.1",
            "SANDBOX": "bwrap",
            "DATABASE_URL": "",
        },
    )
    live.env.pop("DATABASE_URL", None)  # SQLite in its data folder, whatever this run's database
    try:
        yield live.start()
    finally:
        live.stop()
        shutil.rmtree(sessions, ignore_errors=True)


def trial(venv: Path, task: Path, jobs: Path, backend: list[str]) -> dict:
    """One ``harbor run`` with the oracle; its wall time, reward and phases."""
    out = Path(tempfile.mkdtemp(prefix="job-", dir=jobs))
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    started = time.monotonic()
    done = subprocess.run(
        [str(venv / "bin" / "harbor"), "run", "-p", str(task), "-a", "oracle", *backend, "-o", str(out), "-y"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.monotonic() - started
    found = [json.loads(path.read_text()) for path in out.rglob("result.json")]
    trial_result = next((result for result in found if "agent_execution" in result), None)  # not the job's
    if done.returncode != 0 or trial_result is None:
        raise RuntimeError(f"harbor run failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    phases = {name: _secs(trial_result.get(name)) for name in ("environment_setup", "agent_execution", "verifier")}
    phases["trial"] = _secs(trial_result)  # the trial's own start to end: Harbor's per-trial time, no CLI start-up
    rewards = (trial_result.get("verifier_result") or {}).get("rewards") or {}
    shutil.rmtree(out, ignore_errors=True)
    return {"wall": wall, "reward": rewards.get("reward"), **phases}


def _secs(phase) -> float | None:
    if not phase or not phase.get("started_at") or not phase.get("finished_at"):
        return None
    start = datetime.fromisoformat(phase["started_at"].replace("Z", "+00:00"))
    end = datetime.fromisoformat(phase["finished_at"].replace("Z", "+00:00"))
    return (end - start).total_seconds()


def _rest(run: dict) -> float | None:
    parts = [run.get(name) for name in ("trial", "environment_setup", "agent_execution", "verifier")]
    return None if None in parts else parts[0] - sum(parts[1:])


def median(runs: list[dict], key: str) -> float | None:
    if key == "rest":
        values = [value for run in runs if (value := _rest(run)) is not None]
        return statistics.median(values) if values else None
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def report(ours: list[dict], podman: list[dict]) -> str:
    rows = [("per trial (the trial's start to end)", "trial"), ("  environment setup", "environment_setup"),
            ("  agent (oracle)", "agent_execution"), ("  verifier", "verifier"),
            ("  the rest (Harbor's own, the environment's stop)", "rest"),
            ("the `harbor run` process, wall (its start-up included)", "wall")]  # fmt: skip
    lines = [
        "| figure (p50) | term-executor backend | `-e podman` | ratio |",
        "|---|---|---|---|",
    ]
    for label, key in rows:
        a, b = median(ours, key), median(podman, key)
        ratio = f"{b / a:.1f}x less" if a and b else ""
        lines.append(f"| {label} | {_fmt(a)} | {_fmt(b)} | {ratio} |")
    lines.append(f"| rewards | {[run['reward'] for run in ours]} | {[run['reward'] for run in podman]} | |")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or not shutil.which("podman") or not shutil.which("skopeo"):
        print("needs root, podman and skopeo", file=sys.stderr)
        return 2
    venv = harbor_venv()
    root = Path(tempfile.mkdtemp(prefix="bench-harbor-trial-"))
    try:
        task = write_task(root)
        jobs = root / "jobs"
        jobs.mkdir()
        with RegistryServer() as registry:
            push_image(
                registry, "library/debian:bookworm", layers=[debian_layer().read_bytes()], config={"Env": [PATH_ENV]}
            )
            podman_base(registry)
            print(f"load before: {load_average()}", flush=True)
            podman = ["-e", "podman"]
            trial(venv, task, jobs, podman)  # warm-up: the image built
            podman_runs = [trial(venv, task, jobs, podman) for _ in range(args.runs)]
            print("podman:", json.dumps(podman_runs), flush=True)
            with service(root, registry) as live:
                ours = ["-e", "term_executor_client.harbor:TermExecutorEnvironment", "--ek", f"url={live.base_url}",
                        "--ek", f"token={TOKEN}"]  # fmt: skip
                trial(venv, task, jobs, ours)  # warm-up: the image built
                our_runs = [trial(venv, task, jobs, ours) for _ in range(args.runs)]
            print("ours:", json.dumps(our_runs), flush=True)
        print(f"load after: {load_average()}")
        print(report(our_runs, podman_runs))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
