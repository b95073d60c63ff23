"""``python -m bench.harbor [--runs N] [--json FILE]``: ``verify_tasks`` on the example datasets (issue 26).

Every figure is measured in this run, on this machine, and printed; none is judged by an assertion.

1. ``manage.py verify_tasks examples/harbor examples/terminal-bench --out DIR`` as a subprocess on a
   scratch DATA_DIR (a migrated SQLite database, or a fresh PostgreSQL one when the run uses it, and
   a WORKSPACE_BASE under /tmp, tests/helpers/cli.py's EvaluateCli): once cold (an empty image store:
   the Debian base pulled, each Dockerfile built, apt-get and pip included), then ``--runs`` times
   warm (the images in the store, every instruction from the build cache). ``FROM debian:bookworm``
   resolves through IMAGE_REGISTRY_MIRRORS to Debian's docker-registry on 127.0.0.1, which serves
   the suite's Debian tree (bench.images.debian_layer) as ``library/debian:bookworm``; the Debian
   and PyPI registries the builds use are allowed by name (EGRESS_ALLOW), as the tests do.
   Per task and run: the evaluation's duration_ms (verification.json), the wall time of its
   ``manage.py evaluate`` process (verify_tasks' progress line), the reward, and where the time
   went (the evaluation's transitions' duration_ms per step, read from the scratch database).
2. The baseline: the same solution and verifier as plain processes on the image the executor
   built, taken from its image store: an overlay of the image's layers (top first) with a fresh
   upper folder, /proc and /dev bound into it, the task's /tests copied in, an empty
   /logs/verifier; then ``chroot`` as the image's user, from its working directory: ``bash
   /solution/<script>`` (the solution files copied to /solution) and ``bash /tests/<script>``
   (test.sh; Terminal-Bench's run-tests.sh with TEST_DIR=/tests), each timed; the reward read or
   pytest's summary graded as the executor grades them; unmounted. The no-op baseline is the
   verifier alone on a fresh overlay. ``--runs`` repeats of each.
3. The executor's share of a run: (executor - plain) / executor, the executor's figure being the
   warm evaluation's duration_ms (median over the warm runs) and the plain one solve + verify
   (median); the cold build is the cold solution run's preparing_environment step.

Traffic goes to 127.0.0.1 only (and to the package registries through the executor's egress
proxy in the cold builds); the registry and the scratch folders go with the run, and every mount
the baseline makes is taken down in a ``finally``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "executor_project.settings")
django.setup()  # the task reader and the graders below are the executor's own

from bench.common import PROJECT, bench_folder, load_average, machine  # noqa: E402
from bench.images import PATH_ENV, cpu_model, debian_layer  # noqa: E402
from evaluations.grading import reward_file  # noqa: E402
from evaluations.grading.parsers.pytest_summary import grade_pytest  # noqa: E402
from evaluations.images.rootfs import resolve_user  # noqa: E402
from evaluations.images.store import ImageStore, read_counts  # noqa: E402
from evaluations.importers.collect import solution_files  # noqa: E402
from evaluations.tasks.registry import load_task  # noqa: E402
from evaluations.tasks.spec import TaskSpec  # noqa: E402
from tests.helpers.cli import EvaluateCli  # noqa: E402
from tests.helpers.images import RegistryServer, push_image  # noqa: E402

DATASETS = (PROJECT / "examples" / "harbor", PROJECT / "examples" / "terminal-bench")
# What the examples' Dockerfiles download from (apt-get, pip): allowed by name, as the tests do
# (tests/pipeline/test_harbor_e2e.py); here they resolve to a TEST-NET address the default rules refuse.
REGISTRIES = ("deb.debian.org", "security.debian.org", "pypi.org", "files.pythonhosted.org")
STEPS = ("downloading_task", "preparing_environment", "running_agent", "running_tests", "cleanup")
RUNS = ("solution", "noop")
VERIFY_TIMEOUT_SECS = 1800  # the cold run builds three images (apt-get, pip) on a shared 2-CPU machine
PLAIN_TIMEOUT_SECS = 300  # one solve.sh or test.sh
PROGRESS = re.compile(r"^\[\d+/\d+\] (?P<task>.+) (?P<run>solution|noop): .* \((?P<secs>[\d.]+) s\)$", re.M)


# -- 1. verify_tasks ---------------------------------------------------------------------------------


@contextlib.contextmanager
def debian_registry() -> Iterator[RegistryServer]:
    """Debian's docker-registry on 127.0.0.1 serving the suite's Debian tree as ``library/debian:bookworm``."""
    tarball = debian_layer()
    with RegistryServer() as registry:
        push_image(registry, "library/debian:bookworm", layers=[tarball.read_bytes()], config={"Env": [PATH_ENV]})
        yield registry


def scratch_cli(root: Path, registry: RegistryServer) -> EvaluateCli:
    """A data folder, a migrated database and a workspace (0711, under /tmp) of the bench's own."""
    return EvaluateCli(
        root / "cli",
        IMAGE_REGISTRY_MIRRORS=f"docker.io={registry.host}",
        IMAGE_INSECURE_REGISTRIES=registry.host,
        ALLOWED_PRIVATE_HOSTS="127.0.0.1",
        EGRESS_ALLOW=",".join(REGISTRIES),
    ).migrate()


@dataclass
class Pass:
    """One ``verify_tasks`` of the datasets: its wall time and what it wrote."""

    label: str  # "cold" or "warm N"
    wall_secs: float
    tasks: list[dict]  # verification.json
    run_secs: dict[tuple[str, str], float]  # (task, run) -> its manage.py evaluate's wall time (progress line)
    store_counts: dict[str, int]  # what the image store counted in this pass: pulls, builds, cache_hits


def verify_pass(cli: EvaluateCli, root: Path, images: Path, label: str) -> Pass:
    out = root / f"out-{label.replace(' ', '-')}"
    before = read_counts(images)
    started = time.monotonic()
    done = cli.manage("verify_tasks", *map(str, DATASETS), "--out", str(out), timeout=VERIFY_TIMEOUT_SECS)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"verify_tasks ({label}) exited {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}")
    tasks = json.loads((out / "verification.json").read_text())
    run_secs = {(m["task"], m["run"]): float(m["secs"]) for m in PROGRESS.finditer(done.stdout)}
    counts = {name: value - before.get(name, 0) for name, value in read_counts(images).items()}
    print(f"  verify_tasks {label}: {wall:.1f} s, {len(tasks)} task(s) verified, image store {counts} "
          f"(load {load_average()})", file=sys.stderr, flush=True)  # fmt: skip
    return Pass(label, wall, tasks, run_secs, counts)


@dataclass
class Stored:
    """What the scratch database says of an evaluation: its image and its time per step."""

    digest: str | None
    steps_ms: dict[str, int]  # step -> the sum of its transitions' duration_ms


def stored_evaluations(cli: EvaluateCli) -> dict[str, Stored]:
    """Every evaluation of the scratch database, by id (``dumpdata``: SQLite or PostgreSQL alike)."""
    done = cli.manage("dumpdata", "evaluations.Evaluation", "evaluations.Transition", timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"manage.py dumpdata failed: {done.stderr[-2000:]}")
    stored: dict[str, Stored] = {}
    rows = json.loads(done.stdout)
    for row in rows:
        if row["model"] == "evaluations.evaluation":
            environment = row["fields"].get("environment") or {}
            stored[str(row["pk"])] = Stored(environment.get("digest"), {})
    for row in rows:
        if row["model"] == "evaluations.transition" and row["fields"]["duration_ms"] is not None:
            steps = stored[str(row["fields"]["evaluation"])].steps_ms
            step = row["fields"]["step"]
            steps[step] = steps.get(step, 0) + row["fields"]["duration_ms"]
    return stored


# -- 2. the same solution and verifier as plain processes --------------------------------------------


@dataclass
class PlainRun:
    setup_ms: float  # the overlay mounted, /proc and /dev bound, /tests (and /solution) copied
    solve_ms: float | None  # None: the no-op run (the verifier alone)
    verify_ms: float
    teardown_ms: float
    reward: float | None
    detail: str  # why the reward is what it is, when it is not 1

    @property
    def total_ms(self) -> float:
        return (self.solve_ms or 0) + self.verify_ms


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mount {' '.join(args)}: {done.stderr.strip()}")


def _umount(target: Path) -> None:
    if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "--lazy", str(target)], capture_output=True)


@contextlib.contextmanager
def overlay(layers: list[Path]) -> Iterator[Path]:
    """``layers`` (bottom first) as an overlay with a fresh upper folder, /proc and /dev bound into it;
    everything unmounted when the block ends, however it ends. The folder (under /tmp, apart from the
    bench's scratch folder) is bound onto itself and made private first, so nothing mounted below it
    propagates to other mount namespaces; it is removed only once nothing is mounted below it (a
    removal through a bound /dev would reach the host's), else a RuntimeError names it."""
    base = Path(tempfile.mkdtemp(prefix="te-bench-plain-", dir="/tmp"))
    mounted: list[Path] = []
    try:
        _mount("--bind", str(base), str(base))
        mounted.append(base)
        _mount("--make-private", str(base))
        merged, upper, work = base / "merged", base / "upper", base / "work"
        for folder in (merged, upper, work):
            folder.mkdir()
        lower = ":".join(str(layer) for layer in reversed(layers))
        _mount("-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged))
        mounted.append(merged)
        for name in ("proc", "dev"):
            (merged / name).mkdir(exist_ok=True)
            _mount("--bind", f"/{name}", str(merged / name))
            mounted.append(merged / name)
        yield merged
    finally:
        for target in reversed(mounted):
            _umount(target)
        still = [str(target) for target in mounted if os.path.ismount(target)]
        if still:
            raise RuntimeError(f"could not unmount {', '.join(still)}: {base} left as it is")
        shutil.rmtree(base, ignore_errors=True)


def _copy_in(root: Path, folder: str, files: dict[str, tuple[bytes, int]], owner: tuple[int, int] | None) -> None:
    """``files`` (relative path -> bytes, mode) written under ``root``/``folder``, root's unless ``owner``."""
    for relpath, (data, mode) in files.items():
        path = root / folder.strip("/") / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
        if owner is not None:
            os.chown(path, *owner)


def _home(root: Path, uid: int) -> str:
    with contextlib.suppress(OSError):
        for line in (root / "etc" / "passwd").read_text().splitlines():
            fields = line.split(":")
            if len(fields) > 5 and fields[2] == str(uid):
                return fields[5]
    return "/"


@dataclass
class PlainTask:
    """What the plain baseline runs of one task: read by the pipeline's own task reader."""

    task: TaskSpec
    layers: list[Path]  # the built image's layer trees in the store, bottom first
    image_config: dict  # its config: Env, WorkingDir, User
    image_bytes: int

    @property
    def workdir(self) -> str:
        return self.task.environment.workdir or self.image_config.get("WorkingDir") or "/"

    def env(self, root: Path, uid: int, extra: dict[str, str]) -> dict[str, str]:
        env = {"HOME": _home(root, uid), "TERM": "dumb"}
        for entry in self.image_config.get("Env") or []:
            name, _, value = entry.partition("=")
            env[name] = value
        return env | dict(self.task.env) | extra

    def chroot(self, root: Path, user: tuple[int, int], script: str, env: dict[str, str]):
        """``bash script`` in ``root`` as ``user`` from the working directory: (ms, exit status, output)."""
        command = f"cd {shlex.quote(self.workdir)} && bash {script}"
        started = time.perf_counter()
        done = subprocess.run(
            ["chroot", f"--userspec={user[0]}:{user[1]}", "--groups=", str(root), "bash", "-c", command],
            env=env, capture_output=True, text=True, timeout=PLAIN_TIMEOUT_SECS, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        return (time.perf_counter() - started) * 1000, done.returncode, done.stdout + done.stderr

    def run(self, *, solve: bool) -> PlainRun:
        started = time.perf_counter()
        with overlay(self.layers) as root:
            user = resolve_user(root, self.image_config["User"]) if self.image_config.get("User") else (0, 0)
            verifier = self.task.verifier
            _copy_in(root, "/tests", {f.relpath: (f.data, f.mode) for f in verifier.files}, None)
            logs = root / "logs" / "verifier"
            logs.mkdir(parents=True)
            os.chown(logs, *user)
            if solve:
                files, executables, script = solution_files(self.task)
                modes = {path: 0o755 if path in executables or path == script else 0o644 for path in files}
                _copy_in(root, "/solution", {path: (data, modes[path]) for path, data in files.items()}, None)
            setup_ms = (time.perf_counter() - started) * 1000
            solve_ms = None
            if solve:
                env = self.env(root, user[0], {"DEBIAN_FRONTEND": "noninteractive"})
                solve_ms, status, output = self.chroot(root, user, f"/solution/{script}", env)
                if status != 0:
                    raise RuntimeError(f"{self.task.root.name}: solution exited {status}: {output[-2000:]}")
            verify_ms, status, output = self.chroot(
                root, user, f"/tests/{verifier.script}", self.env(root, user[0], verifier.env)
            )
            reward, detail = self.grade(logs, status, output)
            ended = time.perf_counter()
        return PlainRun(setup_ms, solve_ms, verify_ms, (time.perf_counter() - ended) * 1000, reward, detail)

    def grade(self, logs: Path, status: int, output: str) -> tuple[float | None, str]:
        """As the executor grades it (evaluations/grading/): the reward file, pytest's summary, or the exit."""
        if self.task.grader == "reward_file":
            try:
                return reward_file.read_reward(logs).reward, ""
            except reward_file.GradeError as exc:
                return None, exc.message
        if self.task.grader == "pytest":
            grade = grade_pytest(output, status)
            return (1.0, "") if grade.passed else (0.0, grade.reason)
        return (1.0, "") if status == 0 else (0.0, f"exit {status}")


def plain_task(task_path: Path, store: ImageStore, digest: str) -> PlainTask:
    record = store.image(digest)
    if record is None:
        raise SystemExit(f"{task_path}: its image {digest} is not in the executor's store {store.root}")
    task = load_task(task_path)
    layers = [store.layer_tree(layer) for layer in record.layers]
    return PlainTask(task, layers, dict(record.config or {}), record.size_bytes)


# -- 3. the report -------------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _name(task: str) -> str:
    return str(Path(task).relative_to(PROJECT / "examples")) if task.startswith(str(PROJECT)) else task


def figures_of(
    passes: list[Pass],
    stored: dict[str, Stored],
    images: dict[str, PlainTask],
    plain: dict[tuple[str, str], list[PlainRun]],
) -> dict:
    cold, warm = passes[0], passes[1:]
    tasks: dict[str, dict] = {}
    for entry in cold.tasks:
        name = entry["task"]
        per_run = {}
        for run in RUNS:

            def one(p: Pass, run=run, name=name) -> dict:
                found = next(t for t in p.tasks if t["task"] == name)[run]
                steps = stored[found["eval_id"]].steps_ms
                return {
                    "duration_ms": found["duration_ms"],
                    "wall_secs": p.run_secs.get((name, run)),
                    "reward": found["reward"],
                    "steps_ms": steps,
                    "other_ms": found["duration_ms"] - sum(steps.get(s, 0) for s in STEPS),
                }

            warm_runs = [one(p) for p in warm]
            runs_plain = plain[name, run]
            executor_ms = _median([r["duration_ms"] for r in warm_runs])
            plain_ms = _median([r.total_ms for r in runs_plain])
            per_run[run] = {
                "cold": one(cold),
                "warm": warm_runs,
                "warm_duration_ms_median": executor_ms,
                "warm_wall_secs_median": _median([r["wall_secs"] for r in warm_runs]),
                "warm_steps_ms_median": {
                    s: _median([r["steps_ms"].get(s, 0) for r in warm_runs]) for s in (*STEPS, "queued")
                }
                | {"other": _median([r["other_ms"] for r in warm_runs])},
                "plain": [r.__dict__ for r in runs_plain],
                "plain_ms_median": plain_ms,
                "plain_solve_ms_median": _median([r.solve_ms for r in runs_plain]),
                "plain_verify_ms_median": _median([r.verify_ms for r in runs_plain]),
                "plain_setup_ms_median": _median([r.setup_ms for r in runs_plain]),
                "plain_rewards": [r.reward for r in runs_plain],
                "executor_share": (executor_ms - plain_ms) / executor_ms if executor_ms else None,
            }
        per_run["format"] = entry.get("format")
        per_run["cold_build_ms"] = per_run["solution"]["cold"]["steps_ms"].get("preparing_environment")
        per_run["image"] = {"layers": len(images[name].layers), "size_bytes": images[name].image_bytes}
        tasks[name] = per_run
    return {
        "verify_tasks_wall_secs": {"cold": cold.wall_secs, "warm": [p.wall_secs for p in warm]},
        "task_count": len(cold.tasks),
        "image_store_counts": {p.label: p.store_counts for p in passes},
        "tasks": tasks,
    }


def _table(rows: list[tuple]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for number, row in enumerate(rows):
        lines.append("| " + " | ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)) + " |")
        if number == 0:
            lines.append("|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _rewards(values: list) -> str:
    return " ".join("-" if v is None else f"{v:g}" for v in values)


def report(figures: dict, runs: int) -> str:
    wall = figures["verify_tasks_wall_secs"]
    count = figures["task_count"]
    warm_wall = _median(wall["warm"])
    out = [
        f"verify_tasks on {count} tasks ({2 * count} evaluations, --jobs 1): cold {wall['cold']:.1f} s "
        f"({wall['cold'] / count:.1f} s a task); warm, median of {runs}: {warm_wall:.1f} s "
        f"({warm_wall / count:.1f} s a task; each {', '.join(f'{w:.1f}' for w in wall['warm'])} s)",
        "image store, what each pass counted: "
        + "; ".join(
            f"{label} " + ", ".join(f"{name} {value}" for name, value in counts.items())
            for label, counts in figures["image_store_counts"].items()
        ),
        "",
        "Per task and run: the evaluation's duration_ms (verification.json) and the wall time of its "
        "`manage.py evaluate` process (the progress line); rewards cold, then each warm run.",
        "",
    ]
    rows = [("task", "run", "cold: evaluation / process", f"warm (median of {runs}): evaluation / process",
             "rewards cold; warm")]  # fmt: skip
    for name, task in figures["tasks"].items():
        for run in RUNS:
            r = task[run]
            rows.append((
                _name(name), run,
                f"{_ms(r['cold']['duration_ms'])} / {_secs(r['cold']['wall_secs'])}",
                f"{_ms(r['warm_duration_ms_median'])} / {_secs(r['warm_wall_secs_median'])}",
                f"{_rewards([r['cold']['reward']])}; {_rewards([w['reward'] for w in r['warm']])}",
            ))  # fmt: skip
    out += [_table(rows), "", "Where the time goes: the transitions' duration_ms per step (cold; warm median).", ""]
    rows = [("task", "run", *STEPS, "queued + other")]
    for name, task in figures["tasks"].items():
        for run in RUNS:
            r = task[run]
            cold_steps, warm_steps = r["cold"]["steps_ms"], r["warm_steps_ms_median"]
            cells = [f"{_ms(cold_steps.get(s, 0))}; {_ms(warm_steps[s])}" for s in STEPS]
            cold_other = r["cold"]["other_ms"]
            rows.append((_name(name), run, *cells, f"{_ms(cold_other)}; {_ms(warm_steps['other'])}"))
    out += [_table(rows), ""]
    out += [
        "The executor against the same solution and verifier as plain processes (an overlay of the built "
        "image's layers mounted by root; chroot as the image's user, from its working directory), "
        f"median of {runs}; executor's share = (executor - plain) / executor.",
        "",
    ]
    rows = [("task", "run", "executor (warm evaluation)", "plain: solve + verify", "executor's share",
             "plain overlay set-up", "plain rewards", "cold build (preparing_environment)", "image")]  # fmt: skip
    for name, task in figures["tasks"].items():
        for run in RUNS:
            r = task[run]
            plain = (
                f"{_ms(r['plain_solve_ms_median'])} + {_ms(r['plain_verify_ms_median'])} = {_ms(r['plain_ms_median'])}"
                if run == "solution"
                else f"verify {_ms(r['plain_ms_median'])}"
            )
            share = "-" if r["executor_share"] is None else f"{r['executor_share'] * 100:.0f} %"
            build = _ms(task["cold_build_ms"]) if run == "solution" else ""
            image = task["image"]
            shown = f"{image['layers']} layers, {image['size_bytes'] / 1e6:.0f} MB" if run == "solution" else ""
            rows.append((_name(name), run, _ms(r["warm_duration_ms_median"]), plain, share,
                         _ms(r["plain_setup_ms_median"]), _rewards(r["plain_rewards"]), build, shown))  # fmt: skip
    out.append(_table(rows))
    return "\n".join(out)


# -- main ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="warm verify_tasks runs and plain repeats (default 3)")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if os.geteuid() != 0:
        parser.error("needs root: the executor's image tasks and the plain baseline's overlay mounts")
    info = machine()
    print(f"machine: {info['nproc']} CPUs ({cpu_model()}), {info['ram']} RAM, Linux {info['kernel']}, "
          f"Python {info['python']}; commit {info['commit']}; load {info['load']}", flush=True)  # fmt: skip
    started = time.monotonic()
    with bench_folder() as root, debian_registry() as registry:
        cli = scratch_cli(root, registry)
        try:
            images = Path(cli.env["DATA_DIR"]) / "images"  # IMAGES_DIR's default
            passes = [verify_pass(cli, root, images, "cold")]
            passes += [verify_pass(cli, root, images, f"warm {number + 1}") for number in range(args.runs)]
            stored = stored_evaluations(cli)
            store = ImageStore(images)
            plain_tasks = {}
            for entry in passes[-1].tasks:
                digest = stored[entry["solution"]["eval_id"]].digest
                plain_tasks[entry["task"]] = plain_task(Path(entry["task"]), store, digest)
            plain: dict[tuple[str, str], list[PlainRun]] = {}
            for number in range(args.runs):
                for name, task in plain_tasks.items():
                    for run in RUNS:
                        plain.setdefault((name, run), []).append(task.run(solve=run == "solution"))
                print(f"  plain baseline {number + 1}/{args.runs} (load {load_average()})", file=sys.stderr, flush=True)
        finally:
            cli.close()
    figures = figures_of(passes, stored, plain_tasks, plain)
    figures["machine"] = info
    print(report(figures, args.runs))
    print(f"\nload average at the end {load_average()}; bench took {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
