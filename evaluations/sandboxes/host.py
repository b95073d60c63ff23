"""The process that owns one live sandbox (SPEC §24), forked by the worker as an evaluation is.

1. ``prepare``: a uid leased from the pool (as an evaluation's), a session folder, the egress
   proxy, the environment (an image pulled, a Dockerfile built from the uploaded context, or a
   task's own environment), and the image's root mounted with the sandbox's own writable layer,
   its ids mapped onto the lease's range (root in name only, SPEC §16). A compose file's services
   besides main (a task's, or ``environment.compose`` in the context): each image's root mounted
   the same way in ``services/<name>/``, and one network namespace made for them and main; its
   volumes folders of the session, as an evaluation's (pipeline/volumes.py), bound in each root
   naming them, a service's Harbor log folders at main's /logs/* too.
2. ``start``: the sandbox itself, one bubblewrap started by the evaluation's spawner (so its uid,
   rlimits, cgroup, monitor, disk quota and kill are the evaluations' own, unchanged) around our
   init (``runtime/init.c``), whose socket only this process holds. The spawner's monitor watches the whole
   sandbox for its life: a limit crossed (memory, disk, files, processes, lifetime) ends it, and
   says which. Each compose service is a bubblewrap of its own around the same init
   (``Spawner.background``: the same uid, cgroup, tag and kill), in main's network namespace, its
   command its exec 0, its healthcheck awaited (``Sidecar``); an exec or a file request naming it
   goes to its init and its root.
3. ``serve``: requests from the API on the control socket (control.py), one thread each: an exec
   is a message to the init and a fork there, its output on pipes this process reads; files go
   through files.py (a path under a volume in the volume's folder); the network policy is the
   proxy's; ``stop_service`` ends one service's pid namespace and keeps its root. The sandbox ends
   on DELETE, when idle past ``idle_timeout_secs`` or alive past ``max_lifetime_secs`` (expired),
   when the worker dies, or when the sandbox does (its init gone, unless main was stopped alone; a
   limit crossed: failed, with the reason).
4. ``teardown``: as an evaluation's cleanup: every process killed (the pid namespace ends with its
   init), the root unmounted, the image unpinned, the proxy closed, the cgroup removed, the
   session folder gone, the uid scrubbed and given back, then the final status written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import select
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

from django.db import close_old_connections, connections
from django.db.models import F
from django.utils import timezone

from evaluations import lifecycle, livelog
from evaluations.environments import kinds
from evaluations.environments.toolchains import CA_VARIABLES, host_ca
from evaluations.images import build, rootfs
from evaluations.images.errors import ImageError
from evaluations.images.pull import pull
from evaluations.images.store import ImageStore
from evaluations.models import SHUTTING_DOWN, WORKER_LOST, ErrorKind, Sandbox, SandboxExec, SandboxStatus
from evaluations.network import urlguard
from evaluations.network.egress import EgressProxy, egress_policy
from evaluations.pipeline import archive
from evaluations.pipeline.context import StepFailed
from evaluations.pipeline.services import (
    first_process,
)
from evaluations.pipeline.session import Session, remove_retired
from evaluations.runtime import Limits, Mount, SandboxPolicy, Spawner, initbin, killer, uids
from evaluations.runtime.idmap import image_id_base
from evaluations.runtime.initchannel import ExecStartError, InitChannel, InitGone, exec_request
from evaluations.runtime.netns import SharedNetwork
from evaluations.runtime.output import OutputCapture
from evaluations.runtime.sandbox import SYSTEM_PATH
from evaluations.runtime.types import MIB, Limit
from evaluations.safefs import TreeUsage, tree_usage
from evaluations.sandboxes import control, files
from evaluations.sandboxes.boxes import (
    READY_WAIT_SECS,
    Ending,
    Sidecar,
    UnknownService,
    mount_points,
    relay_env,
    resolve_user,
)
from evaluations.sandboxes.compose import ComposeServices
from evaluations.sandboxes.spec import SandboxSpec, SpecError, check_variable, parse, parse_network
from evaluations.tasks.compose import MAIN, harbor_services
from evaluations.tasks.harbor import HARBOR_MAIN_COMMAND, main_first_process
from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import (
    FirstProcess,
    ImageEnvironment,
    Service,
    ServiceVolume,
    TaskError,
)

logger = logging.getLogger("term_executor.sandboxes")

EGRESS_SOCKET = "egress.sock"
EXEC_DRAIN_SECS = 0.05  # after an exec ended: output still coming from what it left running
TIMED_OUT_EXIT = 124
KILLED_EXIT = 137
_SERVE_TICK = 1.0


def session_name(sandbox_id: str) -> str:
    """The sandbox's folder under WORKSPACE_BASE (never a bare uuid: the evaluations' reaper owns those)."""
    return f"sandbox-{sandbox_id}"


def tag(sandbox_id: str) -> str:
    """Its processes' tag (killer.TAG_VAR) and its cgroup's name."""
    return f"sandbox-{sandbox_id}"


def context_path(config, sandbox_id: str) -> Path:
    """Where the API leaves an uploaded build context for the sandbox's process."""
    return config.data_dir / "sandbox-contexts" / f"{sandbox_id}.tar"


class LiveSandbox(ComposeServices):
    def __init__(self, sandbox_id: str, config, runtime):
        self.id = str(sandbox_id)
        self.tag = tag(self.id)
        self.config = config
        self.runtime = runtime
        row = Sandbox.objects.get(id=self.id)
        self.owner = row.owner  # the tenant whose token made it: another's requests are not found
        self.pooled = row.pooled  # made ahead (SANDBOX_WARM_IMAGES): it answers nothing but adopt and stop
        self.lifetime_from = time.monotonic()  # its start, or when a request adopted it
        self.created_at = row.created_at
        self.spec: SandboxSpec = parse(row.spec, has_context=True)
        self.cancel = threading.Event()  # the spawner's: set, the sandbox is killed
        self.closing = contextlib.ExitStack()
        self.lease: uids.UidLease | None = None
        self.session: Session | None = None
        self.spawner: Spawner | None = None
        self.egress: EgressProxy | None = None
        self.name = MAIN  # an exec's, a file's ``service`` (absent: main)
        self.stopped = False  # main stopped alone (``stop_service``): its root still read and written
        self.channel: InitChannel | None = None
        self.root = None  # the ImageRoot
        self.compose: tuple[Service, ...] = ()  # the compose file's services besides main, in start order
        self.main_volumes: tuple[ServiceVolume, ...] = ()  # the compose file's volumes main binds
        self.binds: tuple[Mount, ...] = ()  # main's volumes and shared log folders (``_prepare_volumes``)
        # How main starts (SPEC §23): a compose file's main ``entrypoint``/``command``, else as Harbor's docker
        # backend starts it (the image's ENTRYPOINT, ``sleep infinity`` for its CMD); None: nothing starts.
        self.main_process: FirstProcess | None = FirstProcess(command=HARBOR_MAIN_COMMAND)
        self.task_root: Path | None = None  # where their builds' paths start (a task's root)
        self.sidecars: dict[str, Sidecar] = {}  # each, once its root is mounted
        self.netns: SharedNetwork | None = None  # main's and its services' one loopback (with services only)
        self.environment: dict = {}  # the row's ``environment``, its services' states kept up to date
        # Held for each write of ``environment``: a service's first process may end (its state
        # written by its thread) while the sandbox's ready is written with the same record.
        self.environment_lock = threading.Lock()
        self.image_config: dict = {}
        self.workdir = "/"
        self.users: dict[str, tuple[int, int, str]] = {}
        self.ending: Ending | None = None
        self.ended = threading.Event()
        self.last_active = time.monotonic()
        self.running_execs = 0
        self.exec_count = 0
        self._lock = threading.Lock()
        self._init_thread: threading.Thread | None = None
        self._init_result = None
        self.limits: Limits | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # ``end`` wakes ``serve``
        self.recorder = _Recorder(self.id)

    # -- 1. prepare --------------------------------------------------------------------------

    def prepare(self) -> dict:
        """Everything up to the sandbox's first process; returns its ``environment`` record."""
        config, spec = self.config, self.spec
        if not self.runtime.isolated or os.geteuid() != 0:
            raise Ending(
                SandboxStatus.FAILED,
                "live sandboxes need the sandbox (bubblewrap) and the service running as root",
                ErrorKind.INFRASTRUCTURE,
            )
        self.lease = uids.acquire(config.sandbox_uid, config.sandbox_uid_count, uids.lock_dir(config.data_dir))
        uid = self.lease.uid
        self.session = Session.create(config.workspace_base, session_name(self.id), uid)
        memory_mb = min(spec.memory_mb or config.memory_limit_mb, config.memory_limit_mb)
        storage_mb = min(spec.storage_mb or config.disk_quota_mb, config.disk_quota_mb)
        self.limits = Limits(
            timeout_secs=spec.max_lifetime_secs,
            memory_bytes=memory_mb * MIB,
            disk_quota_bytes=storage_mb * MIB,
            max_processes=config.max_processes,
            max_output_bytes=config.max_output_bytes,
            max_files=config.max_files,
            monitor_interval_ms=config.monitor_interval_ms,
        )
        self.spawner = Spawner(
            eval_id=self.tag,
            session_dir=self.session.root,
            runtime=self.runtime,
            uid=uid,
            live_log=self.session.log,
            cancel_event=self.cancel,
            exclusive_uid=True,
        )
        # The operator's rules during a build (its RUN steps fetch packages, as BUILD_NETWORK says);
        # the sandbox's own from its first process on.
        self.egress = EgressProxy(self.session.root / EGRESS_SOCKET, egress_policy(config), allowed_uid=uid).start()
        self.egress.set_step("sandbox")
        store = ImageStore.of(config)
        record, environment = self._environment(store)
        self.closing.enter_context(store.pin(record.digest, self.tag))  # touched by _environment
        self.image_config = dict(record.config or {})
        self.workdir = self.spec.workdir or self.image_config.get("WorkingDir") or "/"
        ca = host_ca(config, sandboxed=True)
        self.root = kinds.mount_image(
            store,
            record,
            self.session.root,
            lease=uid,
            id_base=image_id_base(config.image_uid_base, uid, config.sandbox_uid),
            workdir=self.workdir,
            ca_host=ca.host if ca is not None else None,
            as_root=True,
        )
        self.closing.callback(rootfs.unmount_root, self.session.root)
        self.default_user = spec.user or self.image_config.get("User") or "root"
        self.user(self.default_user)  # an unknown user fails the sandbox now, not its first exec
        if self.compose:
            environment["services"] = self._prepare_sidecars(store)
        self._prepare_volumes()
        self.egress.policy = spec.network.applied_to(egress_policy(config))
        self.environment = environment
        return environment

    def _environment(self, store: ImageStore):
        """The image's record, and the sandbox's ``environment`` {kind, ref, digest, cached}."""
        spec = self.spec
        root = self._unpack_context() if spec.kind == "dockerfile" or spec.compose is not None else None
        if spec.kind == "image":
            image = ImageEnvironment(image=spec.ref)
        elif spec.kind == "dockerfile":
            image = ImageEnvironment(dockerfile=spec.ref, context=".", build_args=spec.build_args)
        else:
            root, image = self._task_environment()
        result = self._pull_or_build(image, root, store)
        if self.spec.workdir is None and image.workdir:
            self.spec = _with_workdir(self.spec, image.workdir)
        record = {"kind": spec.kind, "ref": spec.ref, "digest": result.record.digest, "cached": result.cached}
        return result.record, record

    def _pull_or_build(self, image: ImageEnvironment, root: Path | None, store: ImageStore):
        """``image`` pulled, or built from ``root`` (its paths start there): the pull's or build's result."""
        if image.image is not None:
            return pull(image.image, store=store, config=self.config, cancelled=self.cancel.is_set)
        result = build.build(
            root / image.dockerfile,
            root / (image.context or str(Path(image.dockerfile).parent)),
            image.build_args,
            image.target,
            store=store,
            env=self._build_environment(),
        )
        store.touch(result.record.digest)  # a pull touches what it found; a build does not
        return result

    def _unpack_context(self) -> Path:
        """The uploaded context, unpacked; with a compose file (``environment.compose``), as a task's
        environment/ folder, whose services it reads (``_read_compose``)."""
        uploaded = context_path(self.config, self.id)
        task_root = self.session.root / "context"
        folder = task_root / "environment" if self.spec.compose is not None else task_root
        if folder != task_root:
            task_root.mkdir(mode=0o700)
        try:
            archive.extract_archive(
                uploaded,
                folder,
                max_members=self.config.max_archive_members,
                max_bytes=self.config.max_context_bytes,
                subject="the build context",
            )
        except archive.ArchiveError as exc:
            raise Ending(SandboxStatus.FAILED, str(exc), ErrorKind.TASK_INVALID) from None
        finally:
            uploaded.unlink(missing_ok=True)
        if self.spec.kind == "dockerfile" and not (folder / self.spec.ref).is_file():
            raise Ending(SandboxStatus.FAILED, f"the build context has no {self.spec.ref}", ErrorKind.TASK_INVALID)
        if self.spec.compose is not None:
            if not (folder / self.spec.compose).is_file():
                raise Ending(
                    SandboxStatus.FAILED, f"the build context has no {self.spec.compose}", ErrorKind.TASK_INVALID
                )
            try:
                compose = harbor_services(task_root)
                main = main_first_process(compose.main)
            except TaskError as exc:
                raise Ending(SandboxStatus.FAILED, f"environment.compose: {exc}", ErrorKind.TASK_INVALID) from None
            self._take_services(compose.services, compose.volumes, task_root)
            self.main_process = main
        return folder

    def _task_environment(self) -> tuple[Path, ImageEnvironment]:
        config = self.config
        downloaded = self.session.root / "task.archive"
        try:
            urlguard.fetch(
                self.spec.ref,
                downloaded,
                max_bytes=config.max_task_archive_bytes,
                timeout_secs=config.download_timeout_secs,
                policy=urlguard.URLPolicy.from_config(config),
            )
            archive.extract_archive(
                downloaded,
                self.session.task,
                max_members=config.max_archive_members,
                max_bytes=config.max_extracted_bytes,
            )
            root = archive.find_task_root(self.session.task)
            task = load_task(
                root,
                allow_file_urls=config.allow_file_urls,
                max_prompt_bytes=config.max_prompt_bytes,
                max_tests=config.max_tests,
            )
        except (urlguard.FetchError, archive.ArchiveError) as exc:
            kind = ErrorKind.INFRASTRUCTURE if exc.transient else ErrorKind.TASK_INVALID
            raise Ending(SandboxStatus.FAILED, str(exc), kind) from None
        except TaskError as exc:
            raise Ending(SandboxStatus.FAILED, str(exc), ErrorKind.TASK_INVALID) from None
        finally:
            downloaded.unlink(missing_ok=True)
        if not isinstance(task.environment, ImageEnvironment):
            raise Ending(
                SandboxStatus.FAILED,
                "environment.task_url: the task's environment is not an image or a Dockerfile "
                "(a live sandbox runs in an image)",
                ErrorKind.TASK_INVALID,
            )
        self._take_services(task.services, task.volumes, task.root)
        self.main_process = task.first_process
        return task.root, task.environment

    def _build_environment(self) -> build.BuildEnvironment:
        config, uid = self.config, self.lease.uid
        network = config.build_network == "on"
        ca = host_ca(config, sandboxed=True)
        return build.BuildEnvironment(
            runtime=self.runtime,
            uid=uid,
            id_base=image_id_base(config.image_uid_base, uid, config.sandbox_uid),
            config=config,
            egress_socket=Path(self.egress.socket_path) if network else None,
            relay_init=self._relay_init() if network else None,
            ca_bundle=ca.host if ca is not None else None,
            extra_env=dict.fromkeys(CA_VARIABLES, ca.sandbox) if ca is not None else {},
            eval_id=self.tag,
            cancel_event=self.cancel,
            exclusive_uid=True,
        )

    def _relay_init(self) -> Path:
        return initbin.ensure_init(self.config.workspace_base)

    # -- 2. start ----------------------------------------------------------------------------

    def start(self) -> None:
        """The sandbox: bubblewrap around our init, through the spawner; returns once the init runs and
        its compose services are up (``_start_sidecars``), main's first process started."""
        ca = host_ca(self.config, sandboxed=True)
        self.channel = InitChannel()
        policy = SandboxPolicy(
            network=True,
            image=self.root,
            image_tmp=True,
            mounts=mount_points(self.root, self.binds, "main"),
            ca_bundle=ca.host if ca is not None else None,
            egress_socket=Path(self.egress.socket_path),
            relay_init=self._relay_init(),
            netns=self.netns.path if self.netns is not None else None,  # its services' too: one loopback
        )
        # The init runs from a descriptor bubblewrap inherits: no mount point for it in the image's layer.
        binary = initbin.open_binary(self.config.workspace_base)
        argv = [initbin.exec_path(binary), str(self.channel.init_fd)]  # the relay listens before it starts
        env = {"PATH": SYSTEM_PATH}

        def run() -> None:
            try:
                self._init_result = self.spawner.run(
                    argv,
                    cwd=Path("/"),
                    env=env,
                    limits=self.limits,
                    policy=policy,
                    pass_fds=(self.channel.init_fd, binary),
                )
            except Exception:
                logger.exception("sandbox %s: the sandbox could not run", self.id)
            finally:
                os.close(binary)
                self.channel.close()  # its end of file wakes every waiting exec
                with contextlib.suppress(OSError):
                    os.write(self._wake_w, b"!")  # and the serve loop, which sees the sandbox gone

        self._init_thread = threading.Thread(target=run, name="sandbox", daemon=True)
        self._init_thread.start()
        if not self.channel.wait_ready(READY_WAIT_SECS) or self.channel.closed:
            self._init_thread.join(timeout=30)
            raise Ending(
                SandboxStatus.FAILED, f"the sandbox did not start: {self._sandbox_end()}", ErrorKind.INFRASTRUCTURE
            )
        self._start_sidecars()  # before main's first process, as an evaluation starts them (services.py)
        if not self.pooled:  # a warm one's starts when a request adopts it, with the request's variables
            self._start_first_process()

    def _start_first_process(self) -> None:
        """The image's ENTRYPOINT in the background, as Harbor's docker backend starts its main container
        (the image's CMD replaced by ``sh -c "sleep infinity"``; a compose file's main ``entrypoint`` and
        ``command`` instead when it names them; SPEC §23-24): exec 0 of the init, as the image's User,
        from the working directory, with the sandbox's variables. Nothing when only a command that keeps
        the container alive would run. It is no exec of the API's: it keeps no
        sandbox from its idle end, and its exit status and output go to the sandbox's log when it ends
        (the sandbox's end ends it)."""
        try:
            argv = first_process(self.image_config, self.main_process) if self.main_process is not None else None
        except StepFailed as exc:
            raise Ending(SandboxStatus.FAILED, str(exc), ErrorKind.TASK_INVALID) from None
        if argv is None:
            return
        self._run_first(self, argv, self.image_config.get("User") or "root", "entrypoint")

    def _run_first(self, box, argv: list[str], user: str, shown: str) -> None:
        """``argv`` as exec 0 of ``box`` (main, or a service) in the background, as ``user``, from its
        working directory, with its variables; its exit status and output go to the sandbox's log."""
        request = {"command": argv, "user": user, "service": box.name}
        try:
            argv, cwd, env, _timeout, user, _box = self._exec_request(request)
        except SpecError as exc:
            raise Ending(SandboxStatus.FAILED, f"{shown}'s first process: {exc}", ErrorKind.TASK_INVALID) from None

        def run() -> None:
            outcome = self._run_exec(0, argv, cwd, env, None, user, box)
            if "status" in outcome:  # it could not start: the sandbox has ended, or the init refused
                how, output = outcome["detail"], ""
            else:
                how, output = f"exit {outcome['exit_code']}", outcome["stdout"] + outcome["stderr"]
                if box is not self:
                    box.first_exit = outcome["exit_code"]
                    if self.ending is None and not box.stopped:
                        self._set_state(box, "exited", outcome["exit_code"])
                        connections.close_all()  # this thread's
            text = f"=== {shown} ({how}) ===\n{output}"
            with contextlib.suppress(OSError):
                livelog.append_text(self.session.log, text if text.endswith("\n") else text + "\n")

        logger.info("sandbox %s: %s: first process %s", self.id, shown, argv)
        threading.Thread(target=run, name="sandbox-first-process", daemon=True).start()

    def _sandbox_end(self) -> str:
        result = self._init_result
        if result is None:
            return "its process did not report"
        if result.limit is not None:
            return result.limit_detail or result.limit.value
        output = (result.output or "").strip().splitlines()
        return f"exit code {result.exit_code}" + (f": {output[-1][:300]}" if output else "")

    # -- 3. serve ----------------------------------------------------------------------------

    def serve(self, listener, alive_fd: int | None) -> Ending:
        """Answer the API on ``listener`` until the sandbox ends; return how it ends."""
        waitables = [listener, self._wake_r] + ([alive_fd] if alive_fd is not None else [])
        while self.ending is None:
            ready, _, _ = select.select(waitables, [], [], _SERVE_TICK)
            if listener in ready:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    conn = None
                if conn is not None:
                    threading.Thread(target=self._handle, args=(conn,), name="sandbox-request", daemon=True).start()
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 64)
            if alive_fd is not None and alive_fd in ready:
                try:
                    data = os.read(alive_fd, 64)
                except OSError:
                    data = b""
                if not data:
                    self.end(Ending(SandboxStatus.FAILED, WORKER_LOST, ErrorKind.INFRASTRUCTURE))
            self._check_clock()
        return self.ending

    def end(self, ending: Ending) -> None:
        """Ask the sandbox to end (the first reason wins)."""
        with self._lock:
            if self.ending is None:
                self.ending = ending
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass  # already woken

    def _check_clock(self) -> None:
        if self.channel.closed and not self.stopped:
            self.end(self._death())
            return
        now = time.monotonic()
        if now - self.lifetime_from > self.spec.max_lifetime_secs:  # an adopted one's, from its adoption
            self.end(Ending(SandboxStatus.EXPIRED, f"alive for {self.spec.max_lifetime_secs} s (max_lifetime_secs)"))
            return
        with self._lock:
            idle = self.running_execs == 0 and now - self.last_active > self.spec.idle_timeout_secs
        if idle:
            self.end(Ending(SandboxStatus.EXPIRED, f"idle for {self.spec.idle_timeout_secs} s (idle_timeout_secs)"))

    def _death(self) -> Ending:
        """How a sandbox that ended by itself ends: its lifetime, a limit, or its init gone."""
        if self._init_thread is not None:
            self._init_thread.join(timeout=30)
        result = self._init_result
        if result is not None and result.limit is Limit.TIMEOUT:
            return Ending(SandboxStatus.EXPIRED, f"alive for {self.spec.max_lifetime_secs} s (max_lifetime_secs)")
        if result is not None and result.limit is not None and result.limit is not Limit.CANCELLED:
            return Ending(SandboxStatus.FAILED, result.limit_detail or result.limit.value, ErrorKind.LIMIT_EXCEEDED)
        return Ending(SandboxStatus.FAILED, f"the sandbox ended: {self._sandbox_end()}", ErrorKind.INFRASTRUCTURE)

    def _handle(self, conn) -> None:
        try:
            if not control.peer_is_us(conn):
                conn.close()
                return
            request = control.Request(conn)
        except (OSError, ValueError):
            conn.close()
            return
        try:
            self._answer(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller went away
        except Exception:
            logger.exception("sandbox %s: request failed", self.id)
            with contextlib.suppress(OSError):
                request.reply({"status": 500, "error": "internal_error", "detail": "the sandbox's process failed"})
        finally:
            request.close()

    def _answer(self, request: control.Request) -> None:
        header = request.header
        op = header.get("op")
        caller = header.get("caller")  # the tenant the API authenticated; None: an operator
        if op == "adopt":
            request.reply(self._adopt(header))
            return
        if (caller is not None and caller != self.owner) or (self.pooled and op != "stop"):
            request.reply({"status": 404, "error": "not_found", "detail": f"no sandbox {self.id}"})
            return
        if op == "stop":
            self.end(Ending(SandboxStatus.STOPPED))
            self.ended.wait(timeout=120)
            request.reply({"status": 204})
            return
        if self.ending is not None or (self.channel.closed and not self.stopped):
            request.reply({"status": 410, "error": "gone", "detail": "the sandbox has ended"})
            return
        with self._lock:
            self.last_active = time.monotonic()
        if op == "exec":
            answer, record = self.exec(header)
            request.reply(answer)
            if record is not None:
                self.recorder.put(record)  # after the answer: the caller does not wait for the database
        elif op == "put":
            request.reply(self._put(header, request))
        elif op == "get":
            self._get(header, request)
        elif op == "network":
            request.reply(self._network(header))
        elif op == "stop_service":
            request.reply(self.stop_service(header))
        else:
            request.reply({"status": 400, "error": "bad_request", "detail": f"unknown op {op!r}"})

    def _adopt(self, header: dict) -> dict:
        """A warm sandbox taken by a request (SANDBOX_WARM_IMAGES): its spec's user, workdir, env and
        network from now on, its owner the request's, its lifetime and idle time from now."""
        with self._lock:
            if not self.pooled or self.ending is not None:
                return {"status": 410, "error": "gone", "detail": "the sandbox is not a warm one any more"}
            self.pooled = False
        try:
            spec = parse(header.get("spec"))
            if spec.kind != "image" or spec.ref != self.spec.ref:
                raise SpecError("environment", f"a warm sandbox of {self.spec.ref} cannot be {spec.ref}")
            default_user = spec.user or self.image_config.get("User") or "root"
            self.user(default_user)
            workdir = spec.workdir or self.image_config.get("WorkingDir") or "/"
            if workdir != self.workdir:
                kinds.make_workdir(self.root, workdir)
        except (SpecError, OSError) as exc:
            self.end(Ending(SandboxStatus.FAILED, str(exc), ErrorKind.TASK_INVALID))
            return {"status": 400, "error": "task_invalid", "detail": str(exc)}
        with self._lock:
            self.spec, self.owner, self.default_user, self.workdir = spec, header.get("owner"), default_user, workdir
            self.lifetime_from = self.last_active = time.monotonic()
        self.egress.policy = spec.network.applied_to(egress_policy(self.config))
        try:
            self._start_first_process()
        except Ending as ending:
            self.end(ending)
            return {"status": 400, "error": "task_invalid", "detail": ending.error}
        return {"status": 200}

    # -- exec --------------------------------------------------------------------------------

    def user(self, name: str) -> tuple[int, int, str]:
        """(uid, gid, home) inside the sandbox for a user name or uid, from the image's /etc/passwd."""
        return resolve_user(self.root, name, self.users)

    def command_env(self, home: str) -> dict[str, str]:
        """An exec's environment before its own: the image's ``Env``, HOME, the proxy's and the CAs'
        variables, the sandbox's ``env``."""
        image_env = dict(
            item.split("=", 1) for item in self.image_config.get("Env") or [] if isinstance(item, str) and "=" in item
        )
        ca = host_ca(self.config, sandboxed=True)
        return {
            "PATH": image_env.get("PATH") or SYSTEM_PATH,
            "HOME": home,
            **image_env,
            **relay_env([*self.sidecars]),
            **(dict.fromkeys(CA_VARIABLES, ca.sandbox) if ca is not None else {}),
            **self.spec.env,
        }

    def box(self, header: dict):
        """Where a request goes: main (no ``service``, or "main"), or the compose service it names;
        ``UnknownService`` for another name."""
        name = header.get("service")
        if name is None or name in ("", MAIN):
            return self
        sidecar = self.sidecars.get(name) if isinstance(name, str) else None
        if sidecar is None:
            raise UnknownService(self.id, name, [MAIN, *self.sidecars])
        return sidecar

    def exec(self, header: dict) -> dict:
        try:
            argv, cwd, env, timeout, user, box = self._exec_request(header)
        except UnknownService as exc:
            return exc.answer(), None
        except SpecError as exc:
            return {"status": 400, "error": "bad_request", "detail": str(exc)}, None
        if box.stopped:
            detail = f"service {box.name!r} of sandbox {self.id} is stopped: its files can still be read"
            return {"status": 409, "error": "service_stopped", "detail": detail}, None
        with self._lock:
            self.exec_count += 1
            number = self.exec_count
            self.running_execs += 1
        started = time.monotonic()
        started_at = timezone.now()
        try:
            outcome = self._run_exec(number, argv, cwd, env, timeout, user, box)
        finally:
            with self._lock:
                self.running_execs -= 1
                self.last_active = time.monotonic()
        if "status" in outcome:
            return outcome, None
        duration_ms = int((time.monotonic() - started) * 1000)
        record = SandboxExec(
            sandbox_id=self.id,
            position=number,
            command=argv,
            cwd=cwd,
            user="" if header.get("user") is None else str(header["user"])[:64],
            service="" if box is self else box.name[:128],
            exit_code=outcome["exit_code"],
            timed_out=outcome["timed_out"],
            oom_killed=outcome["oom_killed"],
            duration_ms=duration_ms,
            started_at=started_at,
        )
        return {"status": 200, **outcome, "duration_ms": duration_ms}, record

    def _exec_request(self, header: dict):
        box = self.box(header)
        command = header.get("command")
        if isinstance(command, str) and command and "\0" not in command:
            argv = ["/bin/sh", "-c", command]
        elif (
            isinstance(command, list)
            and command
            and all(isinstance(item, str) and "\0" not in item for item in command)
            and command[0]
        ):
            argv = list(command)
        else:
            raise SpecError("command", "expected a string for sh -c or a non-empty list of strings")
        user = header.get("user")
        if user is None or user == "":
            user = box.default_user
        elif isinstance(user, int) and not isinstance(user, bool) and 0 <= user < 65536:
            user = str(user)
        elif not isinstance(user, str) or "\0" in user:
            raise SpecError("user", "expected a user name or a uid")
        uid, gid, home = box.user(user)
        cwd = header.get("cwd") or box.workdir
        if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
            raise SpecError("cwd", "expected an absolute path")
        extra = header.get("env") or {}
        if not isinstance(extra, dict):
            raise SpecError("env", "expected an object of strings")
        for key, value in extra.items():
            check_variable(key, value, "env")
        timeout = header.get("timeout_secs")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise SpecError("timeout_secs", "expected a positive number of seconds")
        env = {**box.command_env(home), **extra}
        return argv, cwd, env, timeout, (uid, gid), box

    def _run_exec(self, number: int, argv, cwd, env, timeout, user, box=None) -> dict:
        box = box or self
        channel = box.channel
        exec_tag = f"{self.tag}/exec-{number}" if box is self else f"{self.tag}/{box.name}/exec-{number}"
        env = {**env, killer.TAG_VAR: exec_tag}
        request = exec_request(*user, cwd, argv, env)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        stdin = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        oom_before = self._oom_kills()
        try:
            try:
                entry = channel.start(number, request, stdin, out_w, err_w, wait=False)
            except ExecStartError as exc:
                return {
                    "status": 500,
                    "error": "internal_error",
                    "detail": f"the sandbox could not start the exec: {exc}",
                }
            except InitGone:
                return {"status": 410, "error": "gone", "detail": "the sandbox has ended"}
        finally:
            for fd in (request, stdin, out_w, err_w):
                os.close(fd)
        try:
            stdout, stderr, timed_out = self._collect(channel, entry, out_r, err_r, timeout, exec_tag)
        finally:
            os.close(out_r)
            os.close(err_r)
            channel.forget(entry)
        if entry.start_errno is not None:
            detail = f"the sandbox could not start the exec: {os.strerror(entry.start_errno)}"
            return {"status": 500, "error": "internal_error", "detail": detail}
        if entry.gone and entry.pid is None:
            return {"status": 410, "error": "gone", "detail": "the sandbox has ended"}
        oom = self._oom_kills() > oom_before
        if timed_out:
            code = TIMED_OUT_EXIT
        elif entry.status is None:  # the sandbox ended under it
            code = KILLED_EXIT
        else:
            code = os.waitstatus_to_exitcode(entry.status)
            code = 128 - code if code < 0 else code
        oom_killed = oom and code == KILLED_EXIT
        return {
            "exit_code": code,
            "stdout": stdout.text(),
            "stderr": stderr.text(),
            "timed_out": timed_out,
            "truncated": bool(stdout.truncated or stderr.truncated),
            "oom_killed": oom_killed,
        }

    def _collect(self, channel: InitChannel, entry, out_r: int, err_r: int, timeout, exec_tag: str):
        """Both streams until the exec ended and they closed (or, after it ended, stayed quiet for
        EXEC_DRAIN_SECS: what it left running may hold them); past ``timeout``, its process group
        and every process carrying its tag are killed."""
        cap = self.config.max_output_bytes
        stdout, stderr = OutputCapture(cap), OutputCapture(cap)
        streams = {out_r: stdout, err_r: stderr}
        deadline = None if timeout is None else time.monotonic() + timeout
        timed_out = False
        ended_at = None
        while streams:
            now = time.monotonic()
            if ended_at is None and entry.wait(0):
                ended_at = now
            if deadline is not None and now >= deadline and ended_at is None:
                timed_out = True
                self._kill_exec(channel, entry, exec_tag)
                entry.wait(10)
                ended_at = time.monotonic()
            wait = 0.2 if ended_at is None else EXEC_DRAIN_SECS
            if deadline is not None and ended_at is None:
                wait = max(0.0, min(wait, deadline - now))
            ready, _, _ = select.select(list(streams), [], [], wait)
            if not ready and ended_at is not None:
                break
            for fd in ready:
                chunk = os.read(fd, 65536)
                if chunk:
                    streams[fd].feed(chunk)
                else:
                    del streams[fd]
        if ended_at is None:
            entry.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not entry.wait(0):
                timed_out = True
                self._kill_exec(channel, entry, exec_tag)
                entry.wait(10)
        return stdout, stderr, timed_out

    def _kill_exec(self, channel: InitChannel, entry, exec_tag: str) -> None:
        channel.signal(entry.id, signal.SIGKILL)
        killer.kill_tagged(exec_tag)  # what left its process group keeps the tag (setsid, double fork)

    def _oom_kills(self) -> int:
        cgroup = self.spawner.cgroup if self.spawner is not None else None
        try:
            return cgroup.oom_kills() if cgroup is not None else 0
        except OSError:
            return 0

    # -- files and network -------------------------------------------------------------------

    def _quota(self) -> tuple[files.Quota, TreeUsage]:
        quota = files.Quota(self.limits.disk_quota_bytes, self.limits.max_files)
        return quota, tree_usage(self.session.root)

    def _put(self, header: dict, request: control.Request) -> dict:
        path = header.get("path")
        try:
            box = self.box(header)
            quota, used = self._quota()
            if header.get("extract") == "tar":
                files.put_tar(box.root, path, _Limited(request.reader, request.length), quota, used, box.binds)
            else:
                files.put_file(box.root, path, request.reader, request.length, quota, used, box.binds)
        except UnknownService as exc:
            return exc.answer()
        except files.FileRequestError as exc:
            return {"status": exc.status, "error": exc.code, "detail": exc.sentence}
        return {"status": 204}

    def _get(self, header: dict, request: control.Request) -> None:
        path = header.get("path")
        try:
            box = self.box(header)
            kind, fd = files.open_path(box.root, path, box.binds)
        except UnknownService as exc:
            request.reply(exc.answer())
            return
        except files.FileRequestError as exc:
            request.reply({"status": exc.status, "error": exc.code, "detail": exc.sentence})
            return
        try:
            if kind == "file":
                size = os.fstat(fd).st_size
                request.reply({"status": 200, "kind": "file", "length": size})
                with open(fd, "rb", closefd=False) as source:
                    request.conn.sendfile(source, 0, size)
            else:
                request.reply({"status": 200, "kind": "folder", "stream": True})
                with request.conn.makefile("wb") as out:
                    files.write_folder(fd, out, path, box.binds)
        finally:
            os.close(fd)

    def _network(self, header: dict) -> dict:
        try:
            network = parse_network(header.get("network"), "network")
        except SpecError as exc:
            return {"status": 400, "error": "bad_request", "detail": str(exc)}
        self.egress.policy = network.applied_to(egress_policy(self.config))
        Sandbox.objects.filter(id=self.id).update(network=network.as_dict(), last_active_at=timezone.now())
        connections.close_all()
        return {"status": 200, "network": network.as_dict()}

    # -- 4. teardown -------------------------------------------------------------------------

    def teardown(self, ending: Ending) -> None:
        """Everything the sandbox held, given back; then its final status."""
        self.cancel.set()  # the spawner's monitor kills the sandbox: its pid namespace ends
        if self.channel is not None:
            self.channel.close()
        if self._init_thread is not None:
            self._init_thread.join(timeout=60)
        fields = {}
        if self.spawner is not None:
            self.spawner.sweep()
        try:
            self.closing.close()  # the root unmounted, the image unpinned, the control socket closed
        except OSError as exc:
            logger.warning("sandbox %s: could not unmount its root (the reaper will): %s", self.id, exc)
        if self.egress is not None:
            self.egress.close()
            fields["egress"] = [record.as_dict() for record in self.egress.records()]
        if self.spawner is not None:
            try:
                fields["resources"] = self.spawner.resources()
            except OSError:
                pass
            try:
                self.spawner.close()
            except OSError as exc:
                logger.warning("sandbox %s: could not remove its cgroup (the reaper will): %s", self.id, exc)
        context_path(self.config, self.id).unlink(missing_ok=True)
        retired = None
        if self.session is not None:
            retired = self.session.retire()
        if self.lease is not None:
            clean = False
            try:
                if self.spawner is not None:
                    self.spawner.scrub()
                clean = True
            finally:
                self.lease.release(clean=clean)
        self.recorder.close()
        close_old_connections()
        lifecycle.end_sandbox(self.id, ending.status, error=ending.error, kind=ending.kind, **fields)
        control.announce_ready(self.config.data_dir, self.id)  # a POST still waiting learns it failed
        self.ended.set()
        if retired is not None:
            try:
                remove_retired(retired)
            except OSError as exc:
                logger.warning("sandbox %s: could not remove %s (the reaper will): %s", self.id, retired, exc)


class _Recorder:
    """Writes each exec's row and the sandbox's count, in order, on a thread of its own (one
    database connection), after the exec's answer has gone."""

    def __init__(self, sandbox_id: str):
        self.sandbox_id = sandbox_id
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="sandbox-recorder", daemon=True)
        self.thread.start()

    def put(self, record: SandboxExec) -> None:
        self.queue.put(record)

    def close(self) -> None:
        """Write what is queued, then stop."""
        self.queue.put(None)
        self.thread.join(timeout=60)

    def _run(self) -> None:
        try:
            while (record := self.queue.get()) is not None:
                try:
                    record.save(force_insert=True)
                    Sandbox.objects.filter(id=self.sandbox_id).update(
                        exec_count=F("exec_count") + 1, last_active_at=timezone.now()
                    )
                except Exception:
                    logger.exception("sandbox %s: could not record exec %s", self.sandbox_id, record.position)
        finally:
            connections.close_all()


class _Limited:
    """At most ``length`` bytes of ``reader``: a request's body, never the next request."""

    def __init__(self, reader, length: int):
        self.reader, self.left = reader, length

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        size = self.left if size is None or size < 0 else min(size, self.left)
        data = self.reader.read(size)
        self.left -= len(data)
        return data


def _with_workdir(spec: SandboxSpec, workdir: str) -> SandboxSpec:
    return dataclasses.replace(spec, workdir=workdir)


def run_sandbox(sandbox_id: str, config, runtime, alive_fd: int | None = None) -> None:
    """The whole life of one sandbox, in this process."""
    sandbox = LiveSandbox(sandbox_id, config, runtime)
    ending = None
    # The worker's stop, after its grace period: the sandbox ends as a shutdown ends an evaluation.
    signal.signal(
        signal.SIGTERM,
        lambda signum, frame: sandbox.end(Ending(SandboxStatus.FAILED, SHUTTING_DOWN, ErrorKind.INFRASTRUCTURE)),
    )
    try:
        environment = sandbox.prepare()
        sandbox.start()
        expires = sandbox.created_at + timedelta(seconds=sandbox.spec.max_lifetime_secs)
        listener = control.listen(config.data_dir, sandbox.id)  # before ready: the API may call at once
        sandbox.closing.callback(listener.close)
        with sandbox.environment_lock:
            ready = lifecycle.sandbox_ready(
                sandbox.id, environment=environment, network=sandbox.spec.network.as_dict(), expires_at=expires
            )
        if not ready:
            ending = Ending(SandboxStatus.STOPPED)  # deleted while it started
        else:
            control.announce_ready(config.data_dir, sandbox.id)
            close_old_connections()
            ending = sandbox.serve(listener, alive_fd)
    except Ending as exc:
        ending = exc
    except SpecError as exc:
        ending = Ending(SandboxStatus.FAILED, str(exc), ErrorKind.TASK_INVALID)
    except ImageError as exc:
        ending = Ending(SandboxStatus.FAILED, str(exc), exc.kind)
    except (uids.UidPoolExhausted, initbin.InitUnavailable) as exc:
        ending = Ending(SandboxStatus.FAILED, str(exc), ErrorKind.INFRASTRUCTURE)
    except Exception as exc:
        logger.exception("sandbox %s: internal error", sandbox_id)
        ending = Ending(
            SandboxStatus.FAILED, f"internal error: {exc.__class__.__name__}: {exc}", ErrorKind.INFRASTRUCTURE
        )
    finally:
        sandbox.teardown(ending or Ending(SandboxStatus.FAILED, "internal error", ErrorKind.INFRASTRUCTURE))
