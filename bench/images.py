"""``python -m bench.images [--runs N] [--trials N] [--pulls N] [--only SECTION,...] [--json FILE]``: images (issue 25).

Every figure beside its baseline, measured in this run, on this machine; printed, never judged
by an assertion. A real registry (Debian's docker-registry) on 127.0.0.1 serves the suite's
Debian tree as ``bench/debian:bookworm`` (one layer, data/cache/images) and the same plus six
generated layers of 4 MB each as ``bench/multi:latest``. Sections:

- ``warm``     claim to the agent's first statement on a warm image (the image in the store; a
               task without a repository): ``--runs`` evaluations, p50 and p95, from the
               evaluation's ``running`` transition to the ``time.time()`` its agent prints first;
               baseline in the same run, interleaved: ``podman run`` of the same image, from the
               moment podman is started to the same statement. Where the time goes: the
               transitions' duration_ms per step.
- ``pull``     a cold pull of ``bench/multi:latest`` into an empty store (images/pull.py, in
               this process) against ``skopeo copy docker://... oci:DIR`` of the same image,
               ``--pulls`` interleaved repeats each; ``skopeo copy`` then ``umoci unpack`` (a
               root filesystem, as ours makes) beside it for reference.
- ``build``    the rebuild of an unchanged small Dockerfile (FROM the base image, ENV, RUN,
               COPY), when ``evaluations.images.build`` exists in this checkout.
- ``podman``   the same test command per trial in a podman-per-trial harness (issue 38: as
               Harbor's docker environment runs a trial, ``podman --runtime runc run --detach
               --network none`` of the image, five ``podman exec`` steps, ``podman rm``; the image
               imported into a podman store of its own under /tmp) against an
               evaluation of a task whose test is that command (its agent a no-op): overhead per
               trial (wall time minus the command's own time, which the command measures itself),
               and ``--trials`` trials two at a time.

Traffic goes to 127.0.0.1 only; the registry, the services and podman's store stop and go with
the run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from bench.common import PROJECT, bench_folder, get_json, live_service, load_average, machine, percentile, submit
from bench.e2e import one_evaluation
from tests.helpers.archives import Exec
from tests.helpers.httpserver import TestHTTPServer
from tests.helpers.images import RegistryServer, image_config, layer, member, push_image
from tests.helpers.tasks import TaskFactory

SECTIONS = ("warm", "pull", "build", "podman")
IMAGE_CACHE = PROJECT / "data" / "cache" / "images"  # where tests/helpers/images.py keeps the Debian layer
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EXTRA_LAYERS, EXTRA_LAYER_BYTES = 6, 4 * 1024 * 1024
# The agent's first statement reads the clock: what the target calls "the first agent command".
FIRST_STATEMENT = "import time; first = time.time()\nprint(f'first-statement {first!r}')\n"
NOOP_AGENT = "pass\n"
# The test command of the podman comparison; it measures its own time (python3 starting and
# hashing 20 MB) so that both sides' overhead is the wall time minus the same figure.
TEST_COMMAND = (
    's=$(date +%s%N); python3 -c "import hashlib; hashlib.sha256(bytes(20 << 20)).hexdigest()"; '
    'e=$(date +%s%N); echo "own-ns $((e - s))"'
)
PODMAN_RUN = ["--runtime", "runc", "run", "--rm", "--network", "none",
              "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]  # fmt: skip
PODMAN_RUN_DETACHED = ["--runtime", "runc", "run", "--detach", "--network", "none",
                       "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]  # fmt: skip


# -- the images ------------------------------------------------------------------------------


def debian_layer() -> Path:
    """The suite's Debian tree as one gzip'd layer (tests/helpers/images.py), built once when missing."""
    cached = sorted(IMAGE_CACHE.glob("*-layer.tar.gz"))
    if cached:
        return cached[-1]
    from tests.helpers import environments
    from tests.helpers.images import base_layer_tarball

    def build_tree() -> Path:
        root = environments.environments_root()
        built = environments.build_real(root)
        if built.returncode != 0:
            raise RuntimeError(f"make_environment failed: {built.stderr[-2000:]}")
        return root / environments.NAME

    return base_layer_tarball(build_tree)


def generated_layers() -> list[bytes]:
    """EXTRA_LAYERS layers of random (incompressible) bytes, 16 files each, in a folder of their own."""
    layers = []
    for number in range(EXTRA_LAYERS):
        files = [member(f"opt/bench/{number}/", type="dir")]
        size = EXTRA_LAYER_BYTES // 16
        files += [member(f"opt/bench/{number}/f{index:02d}.bin", os.urandom(size)) for index in range(16)]
        layers.append(layer(*files))
    return layers


@dataclasses.dataclass
class Images:
    registry: RegistryServer
    layer_tarball: Path
    base: str  # host:port/bench/debian:bookworm
    multi: str  # host:port/bench/multi:latest
    multi_bytes: int  # compressed, all layers
    blobs: list[Path]  # the multi-layer image's layer blobs on disk, bottom first (the tar reference)


@contextlib.contextmanager
def images(root: Path) -> Iterator[Images]:
    tarball = debian_layer()
    with RegistryServer() as registry:
        blob = tarball.read_bytes()
        config = {"Env": [PATH_ENV], "Cmd": ["bash"]}
        base = push_image(registry, "bench/debian:bookworm", layers=[blob], config=config)
        extra = generated_layers()
        multi = push_image(registry, "bench/multi:latest", layers=[blob, *extra], config=config)
        size = len(blob) + sum(len(data) for data in extra)
        blobs = [tarball]
        for number, data in enumerate(extra):
            blobs.append(root / f"layer-{number}.tar.gz")
            blobs[-1].write_bytes(data)
        yield Images(registry, tarball, base.ref, multi.ref, size, blobs)


# -- podman, in a store of its own --------------------------------------------------------------


class Podman:
    """podman with ``--root``/``--runroot`` in a temp folder: the host's own podman store is not touched."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.base = ["podman", "--root", str(folder / "root"), "--runroot", str(folder / "run")]
        self.image = "localhost/bench/debian:bookworm"

    def load(self, tarball: Path) -> float:
        started = time.perf_counter()
        subprocess.run([*self.base, "import", str(tarball), self.image], check=True, capture_output=True)
        return time.perf_counter() - started

    def run(self, *command: str) -> subprocess.CompletedProcess:
        done = subprocess.run([*self.base, *PODMAN_RUN, self.image, *command], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"podman run failed ({done.returncode}): {done.stderr[-1000:]}")
        return done

    def trial(self, test_command: str) -> subprocess.CompletedProcess:
        """One trial as a podman-per-trial harness runs it (issue 38; Harbor's docker environment):
        a container started, five ``podman exec`` steps (set-up, the agent, the tests uploaded,
        the tests run, their result read back), the container removed. Returns the tests' run."""
        started = self._podman(*PODMAN_RUN_DETACHED, self.image, "sleep", "infinity")
        container = started.stdout.strip()
        try:
            self._podman("exec", container, "mkdir", "-p", "/logs/agent", "/logs/verifier", "/tests")
            self._podman("exec", container, "python3", "-c", NOOP_AGENT)
            self._podman("exec", "-i", container, "sh", "-c", "cat > /tests/test.sh", stdin=test_command)
            tests = self._podman(
                "exec", container, "sh", "-c", "sh /tests/test.sh > /logs/verifier/out.txt; cat /logs/verifier/out.txt"
            )
            self._podman("exec", container, "cat", "/logs/verifier/out.txt")
        finally:
            self._podman("rm", "--force", "--time", "0", container)
        return tests

    def _podman(self, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run([*self.base, *argv], input=stdin, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"podman {argv[0]} failed ({done.returncode}): {done.stderr[-1000:]}")
        return done

    def close(self) -> None:
        subprocess.run([*self.base, "rmi", "--all", "--force"], capture_output=True)
        subprocess.run([*self.base, "system", "reset", "--force"], capture_output=True)
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def podman(root: Path, tarball: Path) -> Iterator[Podman | None]:
    if shutil.which("podman") is None or shutil.which("runc") is None:
        print("podman or runc is missing (apt-get install -y podman runc): no podman baseline", flush=True)
        yield None
        return
    tool = Podman(Path(tempfile.mkdtemp(prefix="podman-", dir=root)))
    try:
        took = tool.load(tarball)
        print(f"  podman import of the Debian layer: {took:.1f} s", file=sys.stderr, flush=True)
        yield tool
    finally:
        tool.close()


# -- tasks --------------------------------------------------------------------------------------


def image_task(factory: TaskFactory, ref: str, test: str) -> str:
    """A task without a repository, on ``ref``, whose one test runs ``test``."""
    return factory.task(
        workspace=f"environment: {{image: '{ref}'}}\n",
        tests={"fail_to_pass_command.sh": Exec(f"#!/bin/bash\n{test}\n")},
    )


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _claimed_at(body: dict) -> float:
    return next(_time(t["at"]) for t in body["transitions"] if t["status"] == "running")


def _step_at(body: dict, step: str) -> float:
    return next(_time(t["at"]) for t in body["transitions"] if t["step"] == step)


def _first_statement(output: str) -> float:
    return float(next(line.split()[1] for line in output.splitlines() if line.startswith("first-statement ")))


def _own_secs(output: str) -> float:
    return int(next(line.split()[1] for line in output.splitlines() if line.startswith("own-ns "))) / 1e9


def _steps(body: dict) -> dict[str, int]:
    return {f"{t['step']}/{t['status']}": t["duration_ms"] for t in body["transitions"] if t["duration_ms"] is not None}


def _step_p50(bodies: list[dict]) -> dict[str, float]:
    per: dict[str, list[int]] = {}
    for body in bodies:
        for name, value in _steps(body).items():
            per.setdefault(name, []).append(value)
    return {name: percentile(values, 0.5) for name, values in per.items()}


def _service(root: Path, name: str, registry: RegistryServer, count: int):
    return live_service(
        root, name, worker=True, MAX_CONCURRENT_EVALS=2, MAX_QUEUED_EVALS=max(20, count),
        IMAGES_DIR=root / f"{name}-images", IMAGE_INSECURE_REGISTRIES=registry.host,
    )  # fmt: skip


def _completed(port: int, url: str, agent: str) -> dict:
    elapsed, body = one_evaluation(port, _Submitted(url, agent))
    return body | {"client_secs": elapsed}


@dataclasses.dataclass
class _Submitted:  # what bench.common.submit reads
    url: str
    agent_code: str


# -- 1. claim to the first agent statement -------------------------------------------------------


def warm(root: Path, factory: TaskFactory, imgs: Images, runs: int, tool: Podman | None) -> dict:
    url = image_task(factory, imgs.base, "true")
    executor, podman_secs, bodies, before_agent, in_agent = [], [], [], [], []
    with _service(root, "warm", imgs.registry, runs) as service:
        first = _completed(service.port, url, FIRST_STATEMENT)  # the pull: the image is warm after it
        assert first["environment"]["cached"] is False, first["environment"]
        for _ in range(runs):
            if tool is not None:
                started = time.time()
                done = tool.run("python3", "-c", FIRST_STATEMENT)
                podman_secs.append(_first_statement(done.stdout) - started)
            body = _completed(service.port, url, FIRST_STATEMENT)
            assert body["environment"]["cached"] is True, body["environment"]
            first_statement = _first_statement(body["agent_output"])
            executor.append(first_statement - _claimed_at(body))
            agent_started = _step_at(body, "running_agent")
            before_agent.append(agent_started - _claimed_at(body))
            in_agent.append(first_statement - agent_started)
            bodies.append(body)
    figures = {
        "runs": runs,
        "executor_p50": percentile(executor, 0.5),
        "executor_p95": percentile(executor, 0.95),
        "created_to_first_p50": percentile(
            [_first_statement(b["agent_output"]) - _time(b["created_at"]) for b in bodies], 0.5
        ),
        "claim_to_agent_step_p50": percentile(before_agent, 0.5),
        "agent_step_to_first_p50": percentile(in_agent, 0.5),
        "steps_ms_p50": _step_p50(bodies),
        "executor": executor,
    }
    if podman_secs:
        figures |= {"podman_p50": percentile(podman_secs, 0.5), "podman_p95": percentile(podman_secs, 0.95)}
    return figures


# -- 2. cold pull ----------------------------------------------------------------------------------


def cold_pull(root: Path, imgs: Images, repeats: int) -> dict:
    from evaluations.images.pull import pull
    from evaluations.images.store import ImageStore

    ours, skopeo, skopeo_umoci, tar = [], [], [], []
    have_umoci = shutil.which("umoci") is not None
    sides = ["ours", "skopeo", "tar"]
    for number in range(repeats):
        for side in sides[number % 3 :] + sides[: number % 3]:
            folder = Path(tempfile.mkdtemp(prefix=f"pull-{side}-", dir=root))
            try:
                started = time.perf_counter()
                if side == "ours":
                    config = image_config(imgs.registry, DATA_DIR=str(folder), IMAGES_DIR=str(folder / "images"))
                    result = pull(imgs.multi, store=ImageStore(config.images_root), config=config)
                    ours.append(time.perf_counter() - started)
                    assert not result.cached and len(result.record.layers) == EXTRA_LAYERS + 1
                elif side == "tar":
                    for index, blob in enumerate(imgs.blobs):
                        (folder / str(index)).mkdir()
                        subprocess.run(["tar", "-xzf", str(blob), "-C", str(folder / str(index))], check=True)
                    tar.append(time.perf_counter() - started)
                else:
                    _skopeo_copy(imgs.multi, folder / "oci")
                    skopeo.append(time.perf_counter() - started)
                    if have_umoci:
                        subprocess.run(["umoci", "unpack", "--image", f"{folder / 'oci'}:latest", str(folder / "bundle")],
                                       check=True, capture_output=True)  # fmt: skip
                        skopeo_umoci.append(time.perf_counter() - started)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    figures = {
        "repeats": repeats,
        "layers": EXTRA_LAYERS + 1,
        "compressed_bytes": imgs.multi_bytes,
        "ours_p50": percentile(ours, 0.5),
        "skopeo_p50": percentile(skopeo, 0.5),
        "tar_p50": percentile(tar, 0.5),
        "ours": ours,
        "skopeo": skopeo,
        "tar": tar,
    }
    if skopeo_umoci:
        figures["skopeo_umoci_p50"] = percentile(skopeo_umoci, 0.5)
    return figures


def _skopeo_copy(ref: str, out: Path) -> None:
    done = subprocess.run(
        ["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{ref}", f"oci:{out}:latest"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"skopeo copy failed: {done.stderr[-1000:]}")


# -- 3. rebuild of an unchanged Dockerfile ---------------------------------------------------------


DOCKERFILE = """\
FROM {base}
ENV APP_HOME=/app LANG=C.UTF-8
WORKDIR /app
COPY requirements.txt ./
RUN mkdir -p /app/data && python3 -c "print('deps ready')" > /app/data/deps.txt
COPY src/ ./src/
RUN python3 -m compileall -q src
ENV PYTHONPATH=/app/src
CMD ["python3", "-m", "app"]
"""
BUILD_CONTEXT = {
    "requirements.txt": "requests==2.32.3\n",
    "src/app/__init__.py": "",
    "src/app/__main__.py": "print('hi')\n",
}
BUILD_ID_BASE = 430_000_000  # the image's other ids on the host during a RUN: far from every lease


def rebuild(root: Path, imgs: Images, runs: int, tool: Podman | None) -> dict | None:
    """The small Dockerfile built once, then ``runs`` times unchanged (each a build-cache hit);
    baseline: ``podman build`` of the same Dockerfile and context, its second build (cached)."""
    try:
        from evaluations.images.build import BuildEnvironment, build
    except ImportError:
        return None
    from evaluations.images.store import ImageStore
    from evaluations.runtime import Bubblewrap
    from evaluations.runtime.sandbox import usable_language_runtimes
    from tests.runtime.support import UID

    context = root / "build-context"
    for relpath, text in {"Dockerfile": DOCKERFILE.format(base=imgs.base), **BUILD_CONTEXT}.items():
        (context / relpath).parent.mkdir(parents=True, exist_ok=True)
        (context / relpath).write_text(text)
    images_dir = root / "build-images"
    config = image_config(imgs.registry, IMAGES_DIR=str(images_dir), BUILD_NETWORK="off", BUILD_TIMEOUT_SECS="600")
    store = ImageStore(config.images_root)
    env = BuildEnvironment(
        runtime=Bubblewrap(usable_language_runtimes(UID)), uid=UID, id_base=BUILD_ID_BASE, config=config
    )

    def once() -> tuple[float, bool]:
        started = time.perf_counter()
        result = build(context / "Dockerfile", context, store=store, env=env, tag="bench/app:latest")
        return time.perf_counter() - started, result.cached

    from evaluations.images.pull import pull

    pull(imgs.base, store=store, config=config)  # FROM already in the store, as podman's is
    first, cached = once()
    assert not cached
    times = []
    for _ in range(runs):
        took, cached = once()
        assert cached, "an unchanged Dockerfile was not a build-cache hit"
        times.append(took)
    figures = {"runs": runs, "first_secs": first, "rebuild_p50": percentile(times, 0.5), "rebuild": times}
    if tool is not None:
        figures |= _podman_rebuild(tool, context, imgs, min(runs, 5))
    return figures


def _podman_rebuild(tool: Podman, context: Path, imgs: Images, runs: int) -> dict:
    """``podman build`` of the same Dockerfile FROM the image podman imported: first, then cached."""
    dockerfile = context / "Dockerfile.podman"
    dockerfile.write_text(DOCKERFILE.format(base=tool.image))
    argv = [*tool.base, "--runtime", "runc", "build", "--network", "none", "--ulimit", "nofile=1024:1024",
            "--ulimit", "nproc=1024:1024", "--pull=never", "-f", str(dockerfile), "-t", "localhost/bench/app", str(context)]  # fmt: skip
    times = []
    for _ in range(runs + 1):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"  podman build failed, no baseline: {done.stderr[-500:]}", file=sys.stderr, flush=True)
            return {}
        times.append(time.perf_counter() - started)
    return {"podman_first_secs": times[0], "podman_rebuild_p50": percentile(times[1:], 0.5)}


# -- 4. podman run against an evaluation, same command, same image ---------------------------------


def podman_trials(root: Path, factory: TaskFactory, imgs: Images, trials: int, tool: Podman) -> dict:
    url = image_task(factory, imgs.base, TEST_COMMAND)

    def podman_once() -> tuple[float, float]:
        started = time.perf_counter()
        done = tool.trial(TEST_COMMAND)
        return time.perf_counter() - started, _own_secs(done.stdout)

    pod_wall, pod_own, ex_server, ex_client, ex_own, ex_tests, bodies = [], [], [], [], [], [], []
    with _service(root, "trials", imgs.registry, trials) as service:
        _completed(service.port, url, NOOP_AGENT)  # the pull
        podman_once()
        for _ in range(trials):
            wall, own = podman_once()
            pod_wall.append(wall)
            pod_own.append(own)
            body = _completed(service.port, url, NOOP_AGENT)
            own = _own_secs(body["test_output"])
            ex_client.append(body["client_secs"])
            ex_server.append(_time(body["finished_at"]) - _time(body["created_at"]))
            ex_own.append(own)
            ex_tests.append(_steps(body)["running_tests/running"] / 1000)
            bodies.append(body)
        pod_rate = _podman_rate(podman_once, trials)
        ex_rate = _executor_rate(service.port, url, trials)
    pod_over = [wall - own for wall, own in zip(pod_wall, pod_own, strict=True)]
    ex_over = [wall - own for wall, own in zip(ex_server, ex_own, strict=True)]
    return {
        "trials": trials,
        "podman_wall_p50": percentile(pod_wall, 0.5),
        "podman_own_p50": percentile(pod_own, 0.5),
        "podman_overhead_p50": percentile(pod_over, 0.5),
        "executor_server_p50": percentile(ex_server, 0.5),
        "executor_client_p50": percentile(ex_client, 0.5),
        "executor_own_p50": percentile(ex_own, 0.5),
        "executor_overhead_p50": percentile(ex_over, 0.5),
        "executor_client_overhead_p50": percentile([w - o for w, o in zip(ex_client, ex_own, strict=True)], 0.5),
        "executor_tests_step_overhead_p50": percentile([s - o for s, o in zip(ex_tests, ex_own, strict=True)], 0.5),
        "steps_ms_p50": _step_p50(bodies),
        "podman_rate": pod_rate,
        "executor_rate": ex_rate,
    }


def _podman_rate(podman_once, trials: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: podman_once(), range(trials)))
    return trials / (time.perf_counter() - started)


def _executor_rate(port: int, url: str, trials: int) -> float:
    """``trials`` evaluations posted at once (MAX_CONCURRENT_EVALS=2), until /status counts them all."""
    before = get_json(port, "/status")[1]
    done_before = before["passed"] + before["failed"] + before["cancelled"]
    started = time.perf_counter()
    ids = [submit(port, _Submitted(url, NOOP_AGENT)) for _ in range(trials)]
    while True:
        status = get_json(port, "/status")[1]
        if status["passed"] + status["failed"] + status["cancelled"] - done_before >= trials:
            break
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    if status["passed"] - before["passed"] != trials:
        failed = get_json(port, f"/evaluate/{ids[-1]}")[1]
        raise RuntimeError(f"some bench evaluations did not pass: {failed['error']}")
    return trials / elapsed


# -- the table -------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def table(figures: dict) -> str:
    rows = [("figure", "executor", "baseline", "ratio", "target", "")]
    if "warm" in figures:
        w = figures["warm"]
        for key in ("p50", "p95"):
            base = w.get(f"podman_{key}")
            rows.append((
                f"claim to first agent statement, warm image, {key} (n={w['runs']})",
                ms(w[f"executor_{key}"]),
                f"podman run {ms(base)}" if base else "",
                f"{w[f'executor_{key}'] / base:.2f}x" if base else "",
                "<= 50 ms p50 (issue 38)" if key == "p50" else "",
                ("ok" if w["executor_p50"] <= 0.05 else "MISS") if key == "p50" else "",
            ))  # fmt: skip
        rows.append(("  claim to the running_agent step, p50", ms(w["claim_to_agent_step_p50"]), "", "", "", ""))
        rows.append(("  running_agent step to the first statement (sandbox, python3), p50",
                     ms(w["agent_step_to_first_p50"]), "", "", "", ""))  # fmt: skip
        rows.append(("  created_at (POST) to the first statement, p50", ms(w["created_to_first_p50"]), "", "", "", ""))
    if "pull" in figures:
        p = figures["pull"]
        ratio = p["ours_p50"] / p["skopeo_p50"]
        rows.append((
            f"cold pull, {p['layers']} layers, {p['compressed_bytes'] / 1e6:.0f} MB, p50 of {p['repeats']}",
            f"{p['ours_p50']:.2f} s",
            f"skopeo copy {p['skopeo_p50']:.2f} s",
            f"{ratio:.2f}x",
            "<= 1.2x",
            "ok" if ratio <= 1.2 else "MISS",
        ))  # fmt: skip
        rows.append((
            "  the same, against GNU tar -xzf of its layer files (no download, no digests)",
            f"{p['ours_p50']:.2f} s",
            f"{p['tar_p50']:.2f} s",
            f"{p['ours_p50'] / p['tar_p50']:.2f}x",
            "", "",
        ))  # fmt: skip
        if "skopeo_umoci_p50" in p:
            rows.append((
                "  the same, baseline unpacked too (skopeo copy + umoci unpack)",
                f"{p['ours_p50']:.2f} s",
                f"{p['skopeo_umoci_p50']:.2f} s",
                f"{p['ours_p50'] / p['skopeo_umoci_p50']:.2f}x",
                "", "",
            ))  # fmt: skip
    if "build" in figures:
        b = figures["build"]
        if b is None:
            rows.append(("rebuild of an unchanged Dockerfile", "skipped", "", "", "<= 50 ms", "no builder"))
        else:
            rows.append((
                f"rebuild of an unchanged Dockerfile, p50 of {b['runs']}",
                ms(b["rebuild_p50"]),
                f"podman build {ms(b['podman_rebuild_p50'])}" if "podman_rebuild_p50" in b else "",
                f"{b['podman_rebuild_p50'] / b['rebuild_p50']:.0f}x (podman / executor)" if "podman_rebuild_p50" in b else "",
                "<= 50 ms",
                "ok" if b["rebuild_p50"] <= 0.05 else "MISS",
            ))  # fmt: skip
            rows.append((
                "  first build (the base image in the store)",
                f"{b['first_secs']:.2f} s",
                f"podman build {b['podman_first_secs']:.2f} s" if "podman_first_secs" in b else "",
                "", "", "",
            ))  # fmt: skip
    if "podman" in figures:
        t = figures["podman"]
        ratio = t["podman_overhead_p50"] / t["executor_overhead_p50"]
        rows.append((
            f"overhead per trial, p50 (n={t['trials']}; own time {ms(t['executor_own_p50'])} / {ms(t['podman_own_p50'])})",
            ms(t["executor_overhead_p50"]),
            f"podman trial {ms(t['podman_overhead_p50'])}",
            f"{ratio:.2f}x",
            ">= 3x (podman / executor)",
            "ok" if ratio >= 3 else "MISS",
        ))  # fmt: skip
        rows.append((
            "  executor as a client sees it (POST to terminal, 50 ms polls)",
            ms(t["executor_client_overhead_p50"]), "", "", "", "",
        ))  # fmt: skip
        rows.append((
            "  of which the running_tests step (its duration minus own time)",
            ms(t["executor_tests_step_overhead_p50"]),
            f"podman trial {ms(t['podman_overhead_p50'])}",
            f"{t['podman_overhead_p50'] / t['executor_tests_step_overhead_p50']:.2f}x",
            "", "",
        ))  # fmt: skip
        rows.append((
            f"throughput, {t['trials']} trials, 2 at a time",
            f"{t['executor_rate']:.2f}/s",
            f"podman trials {t['podman_rate']:.2f}/s",
            f"{t['executor_rate'] / t['podman_rate']:.2f}x",
            "", "",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    lines = []
    for number, row in enumerate(rows):
        lines.append("| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |")
        if number == 0:
            lines.append("|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(lines)


def cpu_model() -> str:
    with open("/proc/cpuinfo") as info:
        return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "?")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="warm evaluations (default 20)")
    parser.add_argument("--trials", type=int, default=20, help="trials per side in the podman section (default 20)")
    parser.add_argument("--builds", type=int, default=10, help="rebuilds of the unchanged Dockerfile (default 10)")
    parser.add_argument("--pulls", type=int, default=3, help="cold pulls per side (default 3)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args(argv)
    sections = [name.strip() for name in args.only.split(",") if name.strip()]
    if set(sections) - set(SECTIONS):
        parser.error(f"unknown section(s): {', '.join(sorted(set(sections) - set(SECTIONS)))}")
    info = machine()
    print(f"machine: {info['nproc']} CPUs ({cpu_model()}), {info['ram']} RAM, Linux {info['kernel']}, "
          f"Python {info['python']}; commit {info['commit']}; load {info['load']}", flush=True)  # fmt: skip
    figures: dict = {"machine": info}
    loads = []
    started = time.monotonic()
    with bench_folder() as root, images(root) as imgs:
        www = root / "www"
        www.mkdir()
        with TestHTTPServer(www) as server:
            factory = TaskFactory(www, server.url("/"))
            needs_podman = {"warm", "build", "podman"} & set(sections)
            with podman(root, imgs.layer_tarball) if needs_podman else contextlib.nullcontext() as tool:
                for section in sections:
                    loads.append(f"{section} {load_average()}")
                    print(f"[{time.monotonic() - started:5.0f} s] {section} (load {load_average()})",
                          file=sys.stderr, flush=True)  # fmt: skip
                    if section == "warm":
                        figures["warm"] = warm(root, factory, imgs, args.runs, tool)
                    elif section == "pull":
                        figures["pull"] = cold_pull(root, imgs, args.pulls)
                    elif section == "build":
                        figures["build"] = rebuild(root, imgs, args.builds, tool)
                        if figures["build"] is None:
                            print("build: skipped, this checkout has no evaluations/images/build.py", flush=True)
                    elif section == "podman":
                        if tool is None:
                            print("podman: skipped, podman or runc is missing", flush=True)
                        else:
                            figures["podman"] = podman_trials(root, factory, imgs, args.trials, tool)
    print(table(figures))
    for name in ("warm", "podman"):
        if name in figures:
            steps = ", ".join(f"{step} {value} ms" for step, value in figures[name]["steps_ms_p50"].items())
            print(f"\n{name}: step medians (the stored transitions' duration_ms): {steps}")
    print(f"\nload average (1, 5, 15 min) as each section started: {'; '.join(loads)}; at the end {load_average()}")
    print(f"bench took {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
