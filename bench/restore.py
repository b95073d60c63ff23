"""``python -m bench.restore [--venv PATH] [--runs N]``: giving an evaluation its own copy of a snapshot.

The snapshot is a venv (root's files; by default requests, rich, sympy and
pytest from the registry, about 7000 files); the evaluation runs as another
uid and must own what it gets. Three ways, each timed until the uid can
write anywhere in its tree, then how long it takes to take it away again:

1. ``cp -a`` then ``chown -R``;
2. an overlay on the snapshot, then ``chown -R`` through it (``metacopy=on``:
   only the metadata is copied up);
3. an overlay on an idmapped bind of the snapshot (evaluations/cache/mounts.py),
   what the executor does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evaluations.cache import mounts

UID = 60998


def _venv(root: Path) -> Path:
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "requests", "rich", "sympy", "pytest"]
    subprocess.run(pip, check=True, capture_output=True)
    return venv


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def copy_and_chown(snapshot: Path, work: Path) -> tuple[float, float]:
    target = work / "copy"
    start = time.perf_counter()
    subprocess.run(["cp", "-a", str(snapshot), str(target)], check=True)
    subprocess.run(["chown", "-R", "-h", f"{UID}:{UID}", str(target)], check=True)
    ready = _ms(start)
    start = time.perf_counter()
    shutil.rmtree(target)
    return ready, _ms(start)


def _overlay_dirs(work: Path) -> tuple[Path, Path, Path, Path]:
    dirs = tuple(work / name for name in ("lower", "upper", "work", "merged"))
    for folder in dirs:
        folder.mkdir()
    return dirs


def overlay_and_chown(snapshot: Path, work: Path) -> tuple[float, float]:
    _, upper, scratch, merged = _overlay_dirs(work)
    start = time.perf_counter()
    options = f"lowerdir={snapshot},upperdir={upper},workdir={scratch},metacopy=on"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], check=True)
    subprocess.run(["chown", "-R", "-h", f"{UID}:{UID}", str(merged)], check=True)
    ready = _ms(start)
    start = time.perf_counter()
    mounts.unmount(merged)
    shutil.rmtree(work)
    work.mkdir()
    return ready, _ms(start)


def idmapped_overlay(snapshot: Path, work: Path) -> tuple[float, float]:
    lower, upper, scratch, merged = _overlay_dirs(work)
    start = time.perf_counter()
    os.chown(upper, UID, UID)
    mounts.bind_idmapped(snapshot, lower, mounts.userns_fd(UID))
    mounts.mount_overlay(lower, upper, scratch, merged)
    mounts.unmount(lower)
    ready = _ms(start)
    start = time.perf_counter()
    mounts.unmount(merged)
    shutil.rmtree(work)
    work.mkdir()
    return ready, _ms(start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, help="a venv to use as the snapshot (default: one made here)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="te-restore-", dir="/tmp"))
    try:
        source = args.venv or _venv(root)
        snapshot = root / "snapshot"
        subprocess.run(["cp", "-a", str(source), str(snapshot)], check=True)
        subprocess.run(["chown", "-R", "-h", "0:0", str(snapshot)], check=True)
        files = sum(len(f) + len(d) for _, d, f in os.walk(snapshot))
        print(
            f"snapshot: {files} files and folders, {subprocess.check_output(['du', '-sh', str(snapshot)]).split()[0].decode()}"
        )
        for how in (copy_and_chown, overlay_and_chown, idmapped_overlay):
            ready, gone = [], []
            for _ in range(args.runs):
                work = root / "work"
                work.mkdir()
                figures = how(snapshot, work)
                shutil.rmtree(work, ignore_errors=True)
                ready.append(figures[0])
                gone.append(figures[1])
            print(f"{how.__name__:18} ready in {statistics.median(ready):8.1f} ms (median of {args.runs}, "
                  f"{min(ready):.1f}-{max(ready):.1f}); removed in {statistics.median(gone):7.1f} ms")  # fmt: skip
    finally:
        mounts.unmount_below(root)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
