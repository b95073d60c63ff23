"""``bench/container [--quick] [--only SECTION,...] [--out DIR] [--wait-idle]``: bench/run inside the
official image and on the host, one after the other, in one table (figure, host, container, ratio).

The container is the image .ci/image builds from this checkout, started with docs/operating.md's line
(tests/helpers/container.py: podman for docker, the host's network for -p, uid and image id ranges of its
own, the kernel-limit flags of this host's cgroup version), its CMD replaced by the bench:

- the checkout is mounted read-only at /src, and its bench/ and tests/ (the bench's code and the helpers
  it shares with the suite) over /app/bench and /app/tests, so that the bench's PROJECT is the image's
  /app: every service it starts is the image's own code (``manage.py serve``, gunicorn and the worker,
  as bin/serve starts them), sandboxing with the container's bubblewrap;
- the bench's interpreter is a venv in the volume te-bench-cache (kept between runs) that sees the
  image's own /app/.venv (a .pth) and adds requirements-dev.txt's tools from PyPI; curl, which
  bench/baseline.sh needs and the image lacks, is installed from Debian with its lists and package kept
  in the same volume, so a second run downloads nothing;
- /tmp (where the bench makes its scratch folder) is a volume of the run's own, as the host's /tmp is a
  disk; /out (DIR on the host) receives the figures. AUTH_TOKEN and the HEALTHCHECK (which asks the
  port bin/serve would listen on) are left out: the bench's services run without a token, as
  bench/run's do on the host.

Then ``python -m bench`` on the host with the same arguments. DIR gets container.json and host.json
(each run's raw figures and table rows), container.txt and host.txt (their tables), side-by-side.md.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

from bench.__main__ import OPTIONAL, SECTIONS
from bench.common import PROJECT, machine
from tests.helpers.container import OWN_IDS, cgroup_flags, remove, run_argv

CACHE_VOLUME = "te-bench-cache"
INNER = r"""
set -euo pipefail
chmod 1777 /tmp
# curl for bench/baseline.sh (the image has none): Debian's, its lists and package kept in the cache volume.
if ! command -v curl >/dev/null; then
  apt=(apt-get -qq -o Dir::State::Lists=/cache/apt/lists -o Dir::Cache::Archives=/cache/apt/archives)
  mkdir -p /cache/apt/lists/partial /cache/apt/archives/partial
  compgen -G '/cache/apt/lists/*Packages*' >/dev/null || "${apt[@]}" update
  "${apt[@]}" install -y --no-install-recommends curl >/dev/null
fi
# The bench's venv: the image's own packages (its /app/.venv, through a .pth) and requirements-dev.txt's tools.
venv="/cache/venv-$({ /usr/bin/python3 -V; cat /app/requirements.txt /src/requirements-dev.txt; } | sha256sum | cut -c1-16)"
if [ ! -f "$venv/.ready" ]; then
  echo "bench/container: installing requirements-dev.txt in $venv (once)" >&2
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  image_site="$(/app/.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  own_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  echo "import site; site.addsitedir('$image_site')" >"$own_site/image-venv.pth"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r /src/requirements-dev.txt
  touch "$venv/.ready"
fi
cd /app
exec "$venv/bin/python" -m bench "$@"
"""


def tee(argv: list[str], path: Path, **kwargs) -> None:
    """Run ``argv``, its stdout shown and written to ``path``; its stderr shown."""
    with open(path, "w") as out, subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, **kwargs) as process:
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            out.write(line)
    if process.returncode != 0:
        raise SystemExit(f"bench/container: {argv[0]} exited {process.returncode}")


def in_container(image: str, bench_args: list[str], out: Path) -> None:
    name = f"te-bench-{uuid.uuid4().hex[:8]}"
    scratch = f"te-bench-scratch-{name}"
    env = {**OWN_IDS, "BENCH_COMMIT": f"{machine()['commit']} (image {image})"}
    argv, volumes = run_argv(image, name, env, token="unused")
    at = argv.index("AUTH_TOKEN=unused")
    del argv[at - 1 : at + 1]  # no token: the bench's services run without one, as on the host
    argv.remove("-d")
    argv.insert(2, "--no-healthcheck")  # the image's HEALTHCHECK asks bin/serve's port, which the bench replaces
    mounts = [f"{PROJECT}:/src:ro", f"{PROJECT}/bench:/app/bench:ro", f"{PROJECT}/tests:/app/tests:ro",
              f"{CACHE_VOLUME}:/cache", f"{scratch}:/tmp", f"{out}:/out"]  # fmt: skip
    argv[-1:-1] = [*cgroup_flags(name), *(word for mount in mounts for word in ("-v", mount))]
    argv += ["bash", "-c", INNER, "bench-in-container", *bench_args, "--json", "/out/container.json"]
    try:
        tee(argv, out / "container.txt")
    finally:
        remove(name, [*volumes, scratch])


def number(cell: str) -> float | None:
    found = re.match(r"\s*([0-9.]+)", cell)
    return float(found.group(1)) if found else None


def keyed(table: list[list[str]], loose: bool) -> dict[tuple[str, int], list[str]]:
    """Rows by (figure, its occurrence: "server CPU per request" comes once per HTTP figure); ``loose``
    with the numbers of the name left out (the kill sweep's row names this side's count of processes)."""
    seen: Counter[str] = Counter()
    rows = {}
    for row in table:
        name = re.sub(r"\d+", "#", row[0]) if loose else row[0]
        rows[(name, seen[name])] = row
        seen[name] += 1
    return rows


def side_by_side(host: dict, container: dict) -> str:
    rows = [("figure", "host", "container", "container / host", "host baseline", "container baseline")]
    exact, loose = keyed(container["table"], False), keyed(container["table"], True)
    for (figure, occurrence), (_, executor, baseline, *_) in keyed(host["table"], False).items():
        other = exact.get((figure, occurrence))
        if other is None:
            other = loose.get((re.sub(r"\d+", "#", figure), occurrence))
            if other is None:
                continue
            figure = f"{figure}; in the container: {other[0].strip()}"
        a, b = number(executor), number(other[1])
        ratio = f"{b / a:.2f}x" if a and b is not None else ""
        rows.append((figure, executor, other[1], ratio, baseline, other[2]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(lines)


def describe(label: str, figures: dict) -> str:
    info = figures["machine"]
    return (
        f"{label}: {info['nproc']} CPUs, {info['ram']} RAM, Linux {info['kernel']}, Python {info['python']}, "
        f"commit {info['commit']}; load as each section started: {'; '.join(figures['loads'])}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/container", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="bench/run --quick on both sides")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    parser.add_argument("--wait-idle", action="store_true", help="before each section, wait until the CPUs are idle")
    parser.add_argument("--out", default="/tmp/te-bench-container", help="folder for the figures (default %(default)s)")
    args = parser.parse_args()
    if any(name.strip() in OPTIONAL for name in args.only.split(",")):
        parser.error(f"{', '.join(OPTIONAL)} need podman inside the container: bench/run --only sandboxes on the host")
    bench_args = ["--only", args.only] + ["--quick"] * args.quick + ["--wait-idle"] * args.wait_idle
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    image = subprocess.run([str(PROJECT / ".ci" / "image")], capture_output=True, text=True)
    if image.returncode != 0:
        raise SystemExit(f"bench/container: .ci/image failed:\n{image.stderr[-3000:]}")
    tag = image.stdout.strip().splitlines()[-1]
    started = time.monotonic()
    print(f"== in the container ({tag}) ==", flush=True)
    in_container(tag, bench_args, out)
    print("\n== on the host ==", flush=True)
    tee([sys.executable, "-m", "bench", *bench_args, "--json", str(out / "host.json")], out / "host.txt", cwd=PROJECT)
    host, container = (json.loads((out / f"{side}.json").read_text()) for side in ("host", "container"))
    lines = [side_by_side(host, container), "", describe("host", host), describe("container", container)]
    text = "\n".join([*lines, f"both took {time.monotonic() - started:.0f} s"])
    (out / "side-by-side.md").write_text(text + "\n")
    print(f"\n== side by side (also in {out / 'side-by-side.md'}) ==\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
