"""What the per-evaluation Python venv costs (SPEC §11, evaluations/environments/toolchains.py).

    .venv/bin/python -m bench.venv [RUNS]     # a table, then the figures as JSON

Median wall time of RUNS runs of each way to give an evaluation its venv:

- ``make_venv``: the files written directly (what the pipeline does), then given to the uid,
  in a session folder as the pipeline makes it, and on tmpfs (the CPU part alone);
- ``python3 -m venv --without-pip --system-site-packages`` through ``Spawner.run``, with no
  sandbox and with bubblewrap (a process per evaluation, as the pipeline would have to run it);
- ``python3 -m venv`` with ``ensurepip`` (a few runs only: seconds each), for scale;

and what keeping the venv for the tests costs once install filled it (``keep_install_home``
copies it for the agent, ``restore_install_home`` puts the install's back): here with pytest
and its dependencies copied in from this project's .venv, about a thousand files, as
``pip install pytest`` leaves them. Run in a process of its own (the spawner makes its host a
child subreaper).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")

from bench.spawner import LIMITS  # noqa: E402  (the same limits as the spawner's bench)
from evaluations.environments import toolchains  # noqa: E402
from evaluations.pipeline.session import Session  # noqa: E402
from evaluations.runtime import Bubblewrap, NoSandbox, Spawner, probe_bwrap, sandbox_uid  # noqa: E402
from evaluations.runtime.sandbox import SYSTEM_PATH  # noqa: E402

# pytest as `pip install pytest` leaves it: the packages and their metadata.
PYTEST_PARTS = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")


def median_ms(call, runs: int, warm: int = 2) -> float:
    for _ in range(warm):
        call()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def fill_like_pytest(site: Path) -> int:
    """Copy pytest and its dependencies from this interpreter's site-packages; return the file count."""
    source = Path(sysconfig.get_paths()["purelib"])
    for entry in source.iterdir():
        name = entry.name.split("-")[0].lower()
        if entry.name in PYTEST_PARTS or (entry.name.endswith(".dist-info") and name in PYTEST_PARTS):
            if entry.is_dir():
                shutil.copytree(entry, site / entry.name, symlinks=True)
            else:
                shutil.copy2(entry, site / entry.name)
    return sum(len(files) for _, _, files in os.walk(site))


def measure(runs: int) -> dict[str, float]:
    uid = sandbox_uid()
    python = toolchains.find_python(SYSTEM_PATH)
    if python is None:
        raise SystemExit("no python3 on the commands' PATH")
    figures: dict[str, float] = {"python": python.path, "version": python.version}
    base = Path(tempfile.mkdtemp(prefix="te-bench-venv-", dir="/tmp"))
    os.chmod(base, 0o711)
    try:
        figures["find_python"] = median_ms(lambda: toolchains.find_python(SYSTEM_PATH), runs)

        def written():
            session = Session.create(base, str(uuid.uuid4()), uid)
            started = time.perf_counter()
            toolchains.make_session_venv(session, python)
            elapsed = time.perf_counter() - started
            session.remove()
            return elapsed

        figures["make_venv"] = statistics.median(written() for _ in range(runs)) * 1000

        def in_memory():
            with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
                started = time.perf_counter()
                toolchains.make_venv(Path(tmp), python, uid)
                return time.perf_counter() - started

        if os.path.isdir("/dev/shm"):  # the same without the disk: what the files cost in CPU
            figures["make_venv_tmpfs"] = statistics.median(in_memory() for _ in range(runs)) * 1000

        work = base / "spawned"
        work.mkdir(mode=0o711)
        if uid is not None:
            os.chown(work, uid, uid)
        runtimes = [NoSandbox(uid)] + ([Bubblewrap(uid)] if probe_bwrap(uid)[0] else [])
        argv = [python.path, "-m", "venv", "--without-pip", "--system-site-packages"]
        for runtime in runtimes:
            spawner = Spawner(eval_id=f"bench-venv-{os.getpid()}", session_dir=work, runtime=runtime, uid=uid)

            def spawned(spawner=spawner):
                target = work / uuid.uuid4().hex
                result = spawner.run(
                    [*argv, str(target)], cwd=work, env={"PATH": SYSTEM_PATH}, limits=LIMITS, writable=[work]
                )
                if result.exit_code != 0:
                    raise RuntimeError(f"python3 -m venv failed: {result.output}")

            figures[f"m_venv_{runtime.name}"] = median_ms(spawned, runs)

        def ensurepip():
            target = base / uuid.uuid4().hex
            subprocess.run([python.path, "-m", "venv", str(target)], check=True, capture_output=True, env={})

        figures["ensurepip"] = median_ms(ensurepip, 3, warm=0)

        session = Session.create(base, "kept", uid)
        toolchains.make_session_venv(session, python)
        figures["venv_files"] = fill_like_pytest(session.venv / "lib" / f"python{python.version}" / "site-packages")
        if uid is not None:
            for folder, dirs, files in os.walk(session.venv):
                for name in (*dirs, *files):
                    os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)
        keep, restore = [], []
        for _ in range(runs):
            started = time.perf_counter()
            session.keep_install_home()
            keep.append(time.perf_counter() - started)
            started = time.perf_counter()
            session.restore_install_home()
            restore.append(time.perf_counter() - started)
            os.rmdir(session.saved)
        figures["keep"] = statistics.median(keep) * 1000
        figures["restore"] = statistics.median(restore) * 1000
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return figures


def report(figures: dict) -> str:
    rows = [
        ("find_python (the python3 commands see, no process)", figures["find_python"]),
        ("make_venv (files written, given to the uid): what the pipeline does", figures["make_venv"]),
        ("  the same on tmpfs (/dev/shm): without the disk", figures.get("make_venv_tmpfs")),
        ("python3 -m venv --without-pip --system-site-packages, spawner, no sandbox", figures.get("m_venv_none")),
        ("python3 -m venv --without-pip --system-site-packages, spawner, bubblewrap", figures.get("m_venv_bwrap")),
        ("python3 -m venv (with ensurepip), for scale", figures["ensurepip"]),
        (f"keep the venv for the tests, copy for the agent ({figures['venv_files']} files)", figures["keep"]),
        ("restore the install's venv before the tests (remove the agent's copy)", figures["restore"]),
    ]
    lines = [f"python: {figures['python']} ({figures['version']})"]
    lines += [f"{name:<80} {value:9.2f} ms" for name, value in rows if value is not None]
    return "\n".join(lines)


if __name__ == "__main__":
    result = measure(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
    print(report(result))
    print(json.dumps(result))
