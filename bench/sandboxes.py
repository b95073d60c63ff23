"""``python -m bench.sandboxes [--runs N] [--idle N] [--podman-idle N] [--execs N] [--only SECTION,...] [--json FILE]``: live sandboxes (issue 37).

Every figure beside its baseline, measured in this run, on this machine; printed, never judged
by an assertion. A real registry (Debian's docker-registry) on 127.0.0.1 serves the suite's
Debian tree (one layer, data/cache/images) as ``base/debian:bookworm``; a live service (gunicorn as
bin/serve starts it, and its worker; SQLite, SANDBOX=bwrap, AUTH_TOKEN, its DATA_DIR and
WORKSPACE_BASE under /tmp, MAX_SANDBOXES and SANDBOX_UID_COUNT large enough for ``--idle``) makes
the sandboxes; podman (``runc``, the host's containers.conf, a store of its own under /tmp) pulls
the same image from the same registry. Sections:

- ``create``     POST /sandboxes of the image, already pulled, to its 201 (the sandbox ready), then
                 DELETE (not timed), ``--runs`` times; interleaved with ``podman run -d IMAGE sleep
                 infinity`` to its return (the container running), then ``podman rm -f -t 0`` (not
                 timed). p50 and p95; beside them the server's own share (the row's created_at to
                 ready_at) and the DELETE's time.
- ``exec``       POST /sandboxes/{id}/exec of ``["true"]`` to its 200 in one sandbox, ``--runs``
                 times, interleaved with ``podman exec CONTAINER true``; beside it the exec's own
                 duration_ms (the sandbox's process: message to the init, fork, wait).
- ``memory``     the service's memory per idle sandbox: the PSS (/proc/PID/smaps_rollup) of every
                 process of the service and of its sandboxes (gunicorn and its workers, the worker,
                 its forkserver, each sandbox's process, its bubblewraps and init), summed, before
                 and after ``--idle`` sandboxes are made, the difference divided by ``--idle``;
                 beside it ``--podman-idle`` containers ``podman run -d IMAGE sleep infinity``: the
                 PSS of each one's conmon and container processes (podman has no daemon: that is all
                 of it). The host's MemTotal - MemAvailable moves too, kernel memory included, but
                 other work on the machine moves it as well: printed, marked noisy.
- ``concurrent`` ``--execs`` execs of ``["true"]`` in one sandbox from 4 client threads at once:
                 execs per second, against ``podman exec`` from 4 threads.

Traffic goes to 127.0.0.1 only; the registry, the service, its sandboxes and podman's store stop
and go with the run, also when it fails.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import psutil

from bench.common import bench_folder, live_service, load_average, machine, percentile
from bench.images import PATH_ENV, cpu_model, debian_layer
from bench.memory import _rollup
from tests.helpers.images import RegistryServer, push_image

SECTIONS = ("create", "warm", "exec", "memory", "concurrent")
TOKEN = "bench-sandboxes-token"
REPOSITORY = "base/debian:bookworm"
CONCURRENCY = 4
MB = 1024 * 1024


# -- the service's API ----------------------------------------------------------------------------


class Api:
    """The service's sandbox routes, one connection per request (gunicorn's sync workers close it)."""

    def __init__(self, port: int):
        self.port = port

    def call(self, method: str, path: str, body: dict | None = None, timeout: float = 180) -> tuple[int, dict | None]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
            return response.status, (json.loads(raw) if raw else None)
        finally:
            conn.close()

    def create(self, ref: str) -> dict:
        """A ready sandbox (201), or RuntimeError: a warm image is ready within the request."""
        status, body = self.call("POST", "/sandboxes", {"environment": {"image": ref}})
        if status == 202:  # the first one: a pull under way
            deadline = time.monotonic() + 600
            while body["status"] == "starting" and time.monotonic() < deadline:
                time.sleep(0.2)
                status, body = self.call("GET", f"/sandboxes/{body['sandbox_id']}")
        if status not in (200, 201) or body["status"] != "ready":
            raise RuntimeError(f"POST /sandboxes answered {status}: {body}")
        return body

    def delete(self, sandbox_id: str) -> None:
        status, body = self.call("DELETE", f"/sandboxes/{sandbox_id}")
        if status != 204:
            raise RuntimeError(f"DELETE /sandboxes/{sandbox_id} answered {status}: {body}")

    def exec(self, sandbox_id: str, command) -> dict:
        status, body = self.call("POST", f"/sandboxes/{sandbox_id}/exec", {"command": command})
        if status != 200 or body["exit_code"] != 0:
            raise RuntimeError(f"exec answered {status}: {body}")
        return body

    def live(self) -> list[str]:
        status, body = self.call("GET", "/sandboxes")
        return [row["sandbox_id"] for row in body if row["status"] in ("starting", "ready")] if status == 200 else []


@contextlib.contextmanager
def service(
    root: Path, registry: RegistryServer, capacity: int, name: str = "sandboxes", **env
) -> Iterator[tuple[object, Api]]:
    """The service and its worker; every sandbox still live is deleted before they stop."""
    with live_service(
        root, name, worker=True, SANDBOX="bwrap", AUTH_TOKEN=TOKEN,
        IMAGE_INSECURE_REGISTRIES=registry.host, MAX_SANDBOXES=capacity,
        SANDBOX_UID_COUNT=max(128, capacity + 8), SHUTDOWN_GRACE_SECS=5, **env,
    ) as live:  # fmt: skip
        api = Api(live.port)
        try:
            yield live, api
        finally:
            try:
                left = api.live()
            except OSError as exc:  # the service died: live_service still stops what is left of it
                print(f"  could not list the sandboxes left: {exc}", file=sys.stderr, flush=True)
                left = []
            if left:
                print(f"  deleting {len(left)} sandbox(es) left by the run", file=sys.stderr, flush=True)
                with ThreadPoolExecutor(CONCURRENCY) as pool:
                    list(pool.map(lambda sandbox_id: _quietly(api.delete, sandbox_id), left))


def _quietly(function, *args) -> None:
    try:
        function(*args)
    except Exception as exc:  # the run's own error matters more
        print(f"  {function.__name__}{args}: {exc}", file=sys.stderr, flush=True)


# -- the image and podman -------------------------------------------------------------------------


@contextlib.contextmanager
def registry_image() -> Iterator[tuple[RegistryServer, str]]:
    """docker-registry on 127.0.0.1 serving the suite's Debian tree as base/debian:bookworm."""
    tarball = debian_layer()
    with RegistryServer() as registry:
        pushed = push_image(
            registry, REPOSITORY, layers=[tarball.read_bytes()], config={"Env": [PATH_ENV], "Cmd": ["bash"]}
        )
        yield registry, pushed.ref


class Podman:
    """podman with ``--root``/``--runroot`` in a temp folder (the host's own store is not touched);
    the runtime and ulimits are the host's containers.conf (runc, nofile/nproc 1024)."""

    def __init__(self, folder: Path, ref: str):
        self.folder = folder
        self.base = ["podman", "--root", str(folder / "root"), "--runroot", str(folder / "run")]
        self.image = ref

    def __call__(self, *args: str, check: bool = True) -> str:
        done = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=300)
        if check and done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args[:3])} failed ({done.returncode}): {done.stderr[-1000:]}")
        return done.stdout.strip()

    def pull(self) -> float:
        started = time.perf_counter()
        self("pull", "--quiet", "--tls-verify=false", self.image)
        return time.perf_counter() - started

    def run_detached(self) -> str:
        return self("run", "-d", self.image, "sleep", "infinity")

    def remove(self, *containers: str) -> None:
        self("rm", "--force", "--time", "0", *containers)

    def close(self) -> None:
        self("rm", "--all", "--force", "--time", "0", check=False)
        self("rmi", "--all", "--force", check=False)
        self("system", "reset", "--force", check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def podman(root: Path, ref: str) -> Iterator[Podman | None]:
    if shutil.which("podman") is None or shutil.which("runc") is None:
        print("podman or runc is missing (apt-get install -y podman runc): no podman baseline", flush=True)
        yield None
        return
    tool = Podman(Path(tempfile.mkdtemp(prefix="podman-", dir=root)), ref)
    try:
        took = tool.pull()
        print(f"  podman pull of the Debian image: {took:.1f} s", file=sys.stderr, flush=True)
        yield tool
    finally:
        tool.close()


# -- 1. create from a warm image ------------------------------------------------------------------


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def create(api: Api, tool: Podman | None, ref: str, runs: int) -> dict:
    first = api.create(ref)  # the pull: the image is warm after it
    api.delete(first["sandbox_id"])
    if tool is not None:
        tool.remove(tool.run_detached())
    ours, server, deletes, podman_secs, podman_rm = [], [], [], [], []
    for _ in range(runs):
        if tool is not None:
            started = time.perf_counter()
            container = tool.run_detached()
            podman_secs.append(time.perf_counter() - started)
            started = time.perf_counter()
            tool.remove(container)
            podman_rm.append(time.perf_counter() - started)
        started = time.perf_counter()
        body = api.create(ref)
        ours.append(time.perf_counter() - started)
        if body["environment"]["cached"] is not True:
            raise RuntimeError(f"the image was not warm: {body['environment']}")
        server.append(_time(body["ready_at"]) - _time(body["created_at"]))
        started = time.perf_counter()
        api.delete(body["sandbox_id"])
        deletes.append(time.perf_counter() - started)
    figures = {
        "runs": runs,
        "ours_p50": percentile(ours, 0.5),
        "ours_p95": percentile(ours, 0.95),
        "server_p50": percentile(server, 0.5),
        "delete_p50": percentile(deletes, 0.5),
        "ours": ours,
        "server": server,
    }
    if podman_secs:
        figures |= {
            "podman_p50": percentile(podman_secs, 0.5),
            "podman_p95": percentile(podman_secs, 0.95),
            "podman_rm_p50": percentile(podman_rm, 0.5),
            "podman": podman_secs,
        }
    return figures


# -- 1b. create, a warm sandbox taken (SANDBOX_WARM_IMAGES) ---------------------------------------------


def warm_ready(api: Api) -> int:
    """Sandboxes ready on the service, warm ones included (its /metrics; nothing else is live here)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{api.port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    line = next(line for line in text.splitlines() if line.startswith('term_executor_sandboxes{status="ready"}'))
    return int(float(line.split()[-1]))


def warm(root: Path, registry: RegistryServer, ref: str, runs: int) -> dict:
    """POST /sandboxes on a service keeping SANDBOX_WARM_COUNT=2 warm sandboxes of the image: each POST
    takes one (its ready_at is its created_at); before each, the pool is let refill (not timed)."""
    ours, server = [], []
    with service(root, registry, 8, "warm", SANDBOX_WARM_IMAGES=ref, SANDBOX_WARM_COUNT=2) as (_, api):
        for _ in range(runs):
            deadline = time.monotonic() + 300
            while warm_ready(api) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError("the warm sandboxes were not made again within 300 s")
                time.sleep(0.05)
            started = time.perf_counter()
            body = api.create(ref)
            ours.append(time.perf_counter() - started)
            if body["ready_at"] != body["created_at"]:
                raise RuntimeError(f"the POST did not take a warm sandbox: {body}")
            server.append(_time(body["ready_at"]) - _time(body["created_at"]))
            api.delete(body["sandbox_id"])
    return {"runs": runs, "ours_p50": percentile(ours, 0.5), "ours_p95": percentile(ours, 0.95), "ours": ours}


# -- 2. exec round trip ---------------------------------------------------------------------------


def exec_round_trip(api: Api, tool: Podman | None, ref: str, runs: int) -> dict:
    sandbox = api.create(ref)["sandbox_id"]
    container = tool.run_detached() if tool is not None else None
    ours, own, podman_secs = [], [], []
    try:
        api.exec(sandbox, ["true"])
        if container:
            tool("exec", container, "true")
        for _ in range(runs):
            if container:
                started = time.perf_counter()
                tool("exec", container, "true")
                podman_secs.append(time.perf_counter() - started)
            started = time.perf_counter()
            body = api.exec(sandbox, ["true"])
            ours.append(time.perf_counter() - started)
            own.append(body["duration_ms"] / 1000)
    finally:
        api.delete(sandbox)
        if container:
            tool.remove(container)
    figures = {
        "runs": runs,
        "ours_p50": percentile(ours, 0.5),
        "ours_p95": percentile(ours, 0.95),
        "own_p50": percentile(own, 0.5),
        "ours": ours,
    }
    if podman_secs:
        figures |= {
            "podman_p50": percentile(podman_secs, 0.5),
            "podman_p95": percentile(podman_secs, 0.95),
            "podman": podman_secs,
        }
    return figures


# -- 3. memory per idle sandbox -------------------------------------------------------------------


def _role(proc: psutil.Process, parent_role: str | None) -> str:
    """What a process is, from its parent's role and its name: the service's (gunicorn master, web
    worker, worker, forkserver), a sandbox's (its process, its two bubblewraps, the init, the egress
    relay), or podman's (conmon, the container's)."""
    name = proc.name()
    if parent_role is None:
        return "worker" if "run_worker" in " ".join(proc.cmdline()) else "gunicorn master" if name != "conmon" else name
    if parent_role == "gunicorn master":
        return "web worker"
    if parent_role == "worker" and name == "te-forkserver":
        return "forkserver"
    if parent_role == "forkserver":  # the evaluations' spare is one too (te-spare), before and after alike
        return "spare evaluation process" if name == "te-spare" else "sandbox process (python)"
    if name == "bwrap":
        return "bwrap (outer)" if parent_role == "sandbox process (python)" else "bwrap (pid 1)"
    if parent_role == "bwrap (pid 1)":
        return (
            "init"
            if name == "te-init"
            else "egress relay (socat)"
            if "egress-relay" in " ".join(proc.cmdline())
            else f"in the sandbox: {name}"
        )
    if parent_role == "conmon":
        return f"container: {name}"
    return name


def tree_memory(roots: list[int]) -> dict:
    """PSS, RSS and USS summed over ``roots`` and all their descendants, and per role; beside them,
    the private memory of the sandboxes' processes (python) by kind of mapping, KiB per process."""
    totals = {"pss": 0, "rss": 0, "uss": 0, "processes": 0, "cgroups": 0}
    roles: dict[str, dict[str, int]] = {}
    mappings: dict[str, int] = {}
    owners = 0
    cgroups: set[Path] = set()
    todo: list[tuple[int, str | None]] = [(pid, None) for pid in roots]
    while todo:
        pid, parent_role = todo.pop()
        try:
            proc = psutil.Process(pid)
            role = _role(proc, parent_role)
            usage = _rollup(pid)
            children = proc.children()
            if role == "sandbox process (python)":
                for kind, kib in private_by_mapping(pid).items():
                    mappings[kind] = mappings.get(kind, 0) + kib
                owners += 1
            if role in ("bwrap (outer)", "container: sleep"):  # the sandbox's cgroup, the container's
                cgroups.add(memory_cgroup(pid))
        except (psutil.Error, OSError, KeyError):
            continue  # it ended meanwhile
        todo.extend((child.pid, role) for child in children)
        counted = roles.setdefault(role, {"pss": 0, "rss": 0, "uss": 0, "processes": 0})
        for key in ("pss", "rss", "uss"):
            totals[key] += usage[key]
            counted[key] += usage[key]
        totals["processes"] += 1
        counted["processes"] += 1
    per_owner = {kind: kib / owners for kind, kib in mappings.items()} if owners else {}
    totals["cgroups"] = sum(cgroup_usage(folder) for folder in cgroups)
    return totals | {"roles": roles, "sandbox_process_private_kib": per_owner, "cgroup_count": len(cgroups)}


def memory_cgroup(pid: int) -> Path:
    """The folder of a process's memory cgroup (v1's memory controller, else v2's)."""
    with open(f"/proc/{pid}/cgroup") as lines:
        entries = [line.rstrip("\n").split(":", 2) for line in lines]
    for _, controllers, path in entries:
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    path = next(path for number, _, path in entries if number == "0")
    unified = Path("/sys/fs/cgroup/unified")
    return (unified if unified.is_dir() else Path("/sys/fs/cgroup")) / path.lstrip("/")


def cgroup_usage(folder: Path) -> int:
    """A cgroup's memory, bytes: its processes, the kernel memory and page cache charged to it."""
    for name in ("memory.current", "memory.usage_in_bytes"):
        try:
            return int((folder / name).read_text())
        except (OSError, ValueError):
            continue
    return 0


def private_by_mapping(pid: int) -> dict[str, int]:
    """A process's private memory (KiB) by mapping: [heap], [anon] (Python's arenas, thread stacks),
    [stack], shared libraries, other files."""
    found: dict[str, int] = {}
    kind = "?"
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            parts = line.split()
            if parts and not parts[0].endswith(":"):
                path = parts[5] if len(parts) > 5 else "[anon]"
                kind = path if path.startswith("[") else "libraries" if ".so" in path else "files"
            elif parts and parts[0] in ("Private_Dirty:", "Private_Clean:"):
                found[kind] = found.get(kind, 0) + int(parts[1])
    return found


def used_memory() -> int:
    """The host's MemTotal - MemAvailable, bytes (kernel memory included; other work moves it too)."""
    fields = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, _, rest = line.partition(":")
            fields[name] = int(rest.split()[0]) * 1024
    return fields["MemTotal"] - fields["MemAvailable"]


def settle(seconds: float = 3.0) -> None:
    """Let the just-made sandboxes go idle (their threads parked, the records written)."""
    time.sleep(seconds)


def memory(live, api: Api, tool: Podman | None, ref: str, count: int, podman_count: int) -> dict:
    roots = [process.pid for process in live.processes]
    api.delete(api.create(ref)["sandbox_id"])  # the image pulled (when this section runs alone) before "before"
    settle()
    before, host_before = tree_memory(roots), used_memory()
    sandboxes, times = [], []
    started = time.perf_counter()
    try:
        for _ in range(count):
            one = time.perf_counter()
            sandboxes.append(api.create(ref)["sandbox_id"])
            times.append(time.perf_counter() - one)
        made = time.perf_counter() - started
        settle()
        after, host_after = tree_memory(roots), used_memory()
    finally:
        deleting = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(lambda sandbox_id: _quietly(api.delete, sandbox_id), sandboxes))
        deleted = time.perf_counter() - deleting
    figures = {
        "count": count,
        "before": before,
        "after": after,
        "per_sandbox_pss": (after["pss"] - before["pss"]) / count,
        "per_sandbox_rss": (after["rss"] - before["rss"]) / count,
        "per_sandbox_uss": (after["uss"] - before["uss"]) / count,
        "per_sandbox_processes": (after["processes"] - before["processes"]) / count,
        "per_sandbox_cgroup": after["cgroups"] / max(1, after["cgroup_count"]),
        "host_per_sandbox": (host_after - host_before) / count,
        "make_secs": made,
        "create_p50": percentile(times, 0.5),
        "create_last10_p50": percentile(times[-10:], 0.5),
        "delete_all_secs": deleted,
    }
    if tool is not None and podman_count:
        figures |= podman_memory(tool, podman_count)
    return figures


def podman_memory(tool: Podman, count: int) -> dict:
    """``count`` idle containers: the PSS of each one's conmon and everything below it."""
    settle(1.0)
    host_before = used_memory()
    containers = []
    started = time.perf_counter()
    try:
        for _ in range(count):
            containers.append(tool.run_detached())
        made = time.perf_counter() - started
        settle()
        host_after = used_memory()
        conmons = [int(pid) for pid in tool("inspect", "--format", "{{.State.ConmonPid}}", *containers).split()]
        usage = tree_memory(conmons)
    finally:
        removing = time.perf_counter()
        if containers:
            tool.remove(*containers)
        removed = time.perf_counter() - removing
    return {
        "podman_count": count,
        "podman_usage": usage,
        "podman_per_container_pss": usage["pss"] / count,
        "podman_per_container_rss": usage["rss"] / count,
        "podman_per_container_uss": usage["uss"] / count,
        "podman_per_container_processes": usage["processes"] / count,
        "podman_per_container_cgroup": usage["cgroups"] / max(1, usage["cgroup_count"]),
        "podman_host_per_container": (host_after - host_before) / count,
        "podman_make_secs": made,
        "podman_remove_all_secs": removed,
    }


# -- 4. concurrent execs --------------------------------------------------------------------------


def concurrent(api: Api, tool: Podman | None, ref: str, execs: int) -> dict:
    sandbox = api.create(ref)["sandbox_id"]
    container = tool.run_detached() if tool is not None else None
    try:
        api.exec(sandbox, ["true"])
        started = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(lambda _: api.exec(sandbox, ["true"]), range(execs)))
        ours = execs / (time.perf_counter() - started)
        figures = {"execs": execs, "concurrency": CONCURRENCY, "ours_rate": ours}
        if container:
            podman_execs = max(CONCURRENCY, execs // 4)  # ~50x slower each: fewer, for the same order of time
            started = time.perf_counter()
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                list(pool.map(lambda _: tool("exec", container, "true"), range(podman_execs)))
            figures |= {"podman_execs": podman_execs, "podman_rate": podman_execs / (time.perf_counter() - started)}
    finally:
        api.delete(sandbox)
        if container:
            tool.remove(container)
    return figures


# -- leftovers ------------------------------------------------------------------------------------


def leftovers(sessions: Path) -> list[str]:
    """What the run left on the host: bwrap processes, mounts under the service's workspace."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "bwrap" and str(sessions) in " ".join(proc.info["cmdline"] or ()):
            found.append(f"process {proc.pid} bwrap")
    with open("/proc/self/mountinfo") as mounts:
        found += [f"mount {line.split()[4]}" for line in mounts if str(sessions) in line.split()[4]]
    return found


# -- the table ------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds * 1000:.0f} ms"


def mib(value: float) -> str:
    return f"{value / MB:.2f} MiB"


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def rows(figures: dict) -> list[tuple[str, str, str, str, str, str]]:
    """The table's rows (figure, executor, baseline, ratio, target, verdict), also bench/run's."""
    out = []
    if "create" in figures:
        c = figures["create"]
        base = c.get("podman_p50")
        out.append((
            f"create from a warm image, p50 (n={c['runs']})", ms(c["ours_p50"]),
            f"podman run -d {ms(base)}" if base else "", f"{base / c['ours_p50']:.1f}x less" if base else "",
            "<= 20 ms", verdict(c["ours_p50"] <= 0.020),
        ))  # fmt: skip
        out.append((
            "  p95", ms(c["ours_p95"]), f"podman run -d {ms(c['podman_p95'])}" if base else "", "", "", "",
        ))  # fmt: skip
        out.append(("  server side (created_at to ready_at), p50", ms(c["server_p50"]), "", "", "", ""))
    if "warm" in figures:
        w = figures["warm"]
        base = figures.get("create", {}).get("podman_p50")
        out.append((
            f"create, a warm sandbox taken (SANDBOX_WARM_IMAGES), p50 (n={w['runs']})", ms(w["ours_p50"]),
            f"podman run -d {ms(base)}" if base else "", f"{base / w['ours_p50']:.1f}x less" if base else "",
            "<= 20 ms", verdict(w["ours_p50"] <= 0.020),
        ))  # fmt: skip
        out.append(("  p95", ms(w["ours_p95"]), "", "", "", ""))
        out.append((
            "  DELETE (not in the figure), p50", ms(c["delete_p50"]),
            f"podman rm -f -t 0 {ms(c['podman_rm_p50'])}" if base else "", "", "", "",
        ))  # fmt: skip
    if "exec" in figures:
        e = figures["exec"]
        base = e.get("podman_p50")
        out.append((
            f"exec round trip (true), p50 (n={e['runs']})", ms(e["ours_p50"]),
            f"podman exec {ms(base)}" if base else "", f"{base / e['ours_p50']:.0f}x less" if base else "",
            "<= 5 ms", verdict(e["ours_p50"] <= 0.005),
        ))  # fmt: skip
        out.append(("  p95", ms(e["ours_p95"]), f"podman exec {ms(e['podman_p95'])}" if base else "", "", "", ""))
        out.append(("  the exec's own duration_ms (its process), p50", ms(e["own_p50"]), "", "", "", ""))
    if "memory" in figures:
        m = figures["memory"]
        base = m.get("podman_per_container_pss")
        out.append((
            f"memory per idle sandbox, PSS ({m['count']} sandboxes)", mib(m["per_sandbox_pss"]),
            f"podman, {m['podman_count']} containers: {mib(base)}" if base else "",
            f"{m['per_sandbox_pss'] / base:.2f}x" if base else "", "", "",
        ))  # fmt: skip
        out.append((
            "  USS / RSS per sandbox",
            f"{mib(m['per_sandbox_uss'])} / {mib(m['per_sandbox_rss'])}",
            f"{mib(m['podman_per_container_uss'])} / {mib(m['podman_per_container_rss'])}" if base else "",
            "", "", "",
        ))  # fmt: skip
        out.append((
            "  processes per sandbox", f"{m['per_sandbox_processes']:.1f}",
            f"{m['podman_per_container_processes']:.1f}" if base else "", "", "", "",
        ))  # fmt: skip
        out.append((
            "  its cgroup (processes in it, their kernel memory, page cache)", mib(m["per_sandbox_cgroup"]),
            mib(m["podman_per_container_cgroup"]) if base else "", "", "", "",
        ))  # fmt: skip
        out.append((
            "  host MemTotal-MemAvailable per sandbox (noisy)", mib(m["host_per_sandbox"]),
            mib(m["podman_host_per_container"]) if base else "", "", "", "",
        ))  # fmt: skip
        out.append((
            f"  time to make them one after another (create p50 {ms(m['create_p50'])}, last 10 {ms(m['create_last10_p50'])})",
            f"{m['make_secs']:.1f} s", f"{m['podman_make_secs']:.1f} s" if base else "", "", "", "",
        ))  # fmt: skip
        out.append((
            "  time to delete them all (4 at once / one podman rm)", f"{m['delete_all_secs']:.1f} s",
            f"{m['podman_remove_all_secs']:.1f} s" if base else "", "", "", "",
        ))  # fmt: skip
    if "concurrent" in figures:
        k = figures["concurrent"]
        base = k.get("podman_rate")
        out.append((
            f"execs per second, {k['concurrency']} clients at once ({k['execs']} / {k.get('podman_execs', 0)})",
            f"{k['ours_rate']:.0f}/s", f"podman exec {base:.1f}/s" if base else "",
            f"{k['ours_rate'] / base:.0f}x" if base else "", "", "",
        ))  # fmt: skip
    return out


def table(figures: dict) -> str:
    lines_rows = [("figure", "executor", "baseline (same run)", "ratio", "target", ""), *rows(figures)]
    widths = [max(len(row[i]) for row in lines_rows) for i in range(6)]
    lines = []
    for number, row in enumerate(lines_rows):
        lines.append("| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |")
        if number == 0:
            lines.append("|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(lines)


def roles_table(figures: dict) -> str:
    """The memory section's processes by role, before and after, MiB of PSS."""
    m = figures["memory"]
    before, after = m["before"]["roles"], m["after"]["roles"]
    lines = [f"{'role':32} {'n before':>8} {'PSS before':>10} {'n after':>8} {'PSS after':>10} {'per sandbox':>11}"]
    for role in sorted(set(before) | set(after), key=lambda name: -after.get(name, {}).get("pss", 0)):
        b, a = before.get(role, {"pss": 0, "processes": 0}), after.get(role, {"pss": 0, "processes": 0})
        lines.append(
            f"{role:32} {b['processes']:8d} {b['pss'] / MB:10.1f} {a['processes']:8d} {a['pss'] / MB:10.1f} "
            f"{(a['pss'] - b['pss']) / m['count'] / MB:11.2f}"
        )
    if "podman_usage" in m:
        for role, usage in sorted(m["podman_usage"]["roles"].items(), key=lambda item: -item[1]["pss"]):
            lines.append(
                f"{'podman: ' + role:32} {'':8} {'':10} {usage['processes']:8d} {usage['pss'] / MB:10.1f} "
                f"{usage['pss'] / m['podman_count'] / MB:11.2f}"
            )
    private = m["after"]["sandbox_process_private_kib"]
    if private:
        kinds = ", ".join(f"{kind} {kib / 1024:.2f}" for kind, kib in sorted(private.items(), key=lambda kv: -kv[1]))
        lines.append(f"\na sandbox's process (python), private memory by mapping, MiB per process: {kinds}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="creates and execs per side (default 30)")
    parser.add_argument("--idle", type=int, default=100, help="idle sandboxes in the memory section (default 100)")
    parser.add_argument("--podman-idle", type=int, default=100, help="idle podman containers (default 100)")
    parser.add_argument("--execs", type=int, default=200, help="execs at concurrency 4 (default 200)")
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
    with bench_folder() as root, registry_image() as (registry, ref), podman(root, ref) as tool:
        with service(root, registry, max(args.idle, 4)) as (live, api):
            for section in sections:
                loads.append(f"{section} {load_average()}")
                print(f"[{time.monotonic() - started:5.0f} s] {section} (load {load_average()})",
                      file=sys.stderr, flush=True)  # fmt: skip
                if section == "create":
                    figures["create"] = create(api, tool, ref, args.runs)
                elif section == "warm":
                    figures["warm"] = warm(root, registry, ref, args.runs)
                elif section == "exec":
                    figures["exec"] = exec_round_trip(api, tool, ref, args.runs)
                elif section == "memory":
                    figures["memory"] = memory(live, api, tool, ref, args.idle, args.podman_idle)
                elif section == "concurrent":
                    figures["concurrent"] = concurrent(api, tool, ref, args.execs)
            sessions = Path(live.env["WORKSPACE_BASE"])
        left = leftovers(sessions)
    print(table(figures))
    if "memory" in figures:
        print(f"\nPSS by process role, MiB:\n{roles_table(figures)}")
    print(f"\nleft on the host after the service stopped: {', '.join(left) if left else 'nothing'}")
    print(f"load average (1, 5, 15 min) as each section started: {'; '.join(loads)}; at the end {load_average()}")
    print(f"bench took {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
