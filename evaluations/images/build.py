"""``build``: an image from a Dockerfile, with no container daemon (SPEC §16).

Each stage starts from its ``FROM`` (an image pulled into the store, ``scratch``, or an earlier
stage) and goes instruction by instruction. A state is (layers, config, key):

- ``RUN``, ``COPY``, ``ADD``, ``WORKDIR`` make a layer. The stage's layers are mounted as an image
  root (rootfs.mount_root, without ``redirect_dir``: commit.py says why) in a step folder under
  ``IMAGES_DIR/builds/<id>/``; ``RUN`` runs there through the sandbox as the stage's ``USER``,
  root in name only, with ``BUILD_NETWORK`` deciding its egress (through the caller's proxy);
  ``COPY`` and ``ADD`` write through the mount from the context, another stage or an image;
  then the step's upper folder becomes a layer (commit.py). A step that changes nothing adds none.
- The others only change the config (``Env``, ``User``, ``Cmd``, ...): nothing runs.

The build cache: every instruction's key is the sha256 of its parent state's key, the
instruction after substitution, the ARGs it can see and, for ``COPY``/``ADD``, the hash of
exactly what it copies (context.content_hash; for ``--from`` the source stage's layers). A key
already built names its layer in ``IMAGES_DIR/build-cache/<key>.json``: a hit runs and copies
nothing. A miss holds that key's flock while it builds, so a second process building the same
line waits and then reuses the first's layer instead of running it again.

``IMAGES_DIR/builds/<id>.lock`` is flock'd for the whole build: a build folder whose lock is
free belongs to a dead build, and the reaper removes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import posixpath
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from evaluations import safefs
from evaluations.cache import mounts
from evaluations.images import context as ctx
from evaluations.images import copyin, inroot, rootfs
from evaluations.images import dockerfile as df
from evaluations.images.commit import commit
from evaluations.images.errors import ImageError, ImageUnavailable
from evaluations.images.pull import pull, this_platform
from evaluations.images.reference import parse as parse_reference
from evaluations.images.store import BUILD_REACH, ImageRecord, ImageStore, now_iso
from evaluations.network import urlguard
from evaluations.runtime import SandboxPolicy, Spawner
from evaluations.runtime.idmap import IdMap
from evaluations.runtime.types import CancelEvent, Limit, Limits

MAX_DOCKERFILE_BYTES = 1024 * 1024
OUTPUT_TAIL_CHARS = 2000  # of a failing RUN's output, in its error
_MANIFEST_TYPE = "application/vnd.term-executor.build.manifest.v1+json"
_URL_PREFIXES = ("http://", "https://")


@dataclasses.dataclass(frozen=True)
class BuildEnvironment:
    """What a build needs from whoever runs it (the pipeline's ``preparing_environment``, or
    ``manage.py image build``).

    The builder makes its own Spawner from ``runtime``, over its build folder: the folder is
    what the disk and file limits measure and where the RUNs' /tmp lives, and it goes with the
    build. Its commands run as ``uid`` (the lease) with the ids ``id_base``..+65535 for the
    image's other users, tagged ``eval_id`` (the killer's tag, and the cgroup's name).
    """

    runtime: object  # a runtime.sandbox.Runtime (Bubblewrap): every RUN goes through it
    uid: int  # the lease: the RUN's user on the host
    id_base: int  # idmap.image_id_base: the image's other ids on the host
    config: object  # executor_project.config.Config: limits, BUILD_*, URL rules
    progress: Callable[[str], None] = lambda text: None
    egress_socket: Path | None = None  # the caller's egress proxy (BUILD_NETWORK=on)
    relay_init: Path | None = None  # the init's folder, the egress relay's program (initbin.ensure_init)
    ca_bundle: Path | None = None  # the host's CAs, bound at policy.SANDBOX_CA_BUNDLE
    extra_env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # under the image's Env (CA variables)
    eval_id: str = "build"
    cancel_event: CancelEvent | None = None
    exclusive_uid: bool = False
    ssl_context: object = None  # for pulls (a registry's test CA)


@dataclasses.dataclass
class BuildResult:
    record: ImageRecord
    cached: bool  # every instruction was a cache hit: nothing ran, nothing was copied
    # IMAGE_REWRITES applied to FROM / COPY --from images: ({"ref": pulled, "rewritten_from": as written}, ...)
    rewrites: tuple[dict, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Download(ctx.Source):
    """An ADD URL's file, fetched into the build folder (never unpacked, as Docker)."""

    digest: str = ""


@dataclasses.dataclass
class _State:
    layers: list[str]
    config: dict
    key: str
    args: dict[str, str] = dataclasses.field(default_factory=dict)  # the stage's ARGs with a value

    def env(self) -> dict[str, str]:
        """The variables substitution sees: the stage's ARGs, its ENV over them (Docker's order)."""
        return {**self.args, **_env_dict(self.config)}


def reach_folder(config, build_id: str) -> Path:
    """``WORKSPACE_BASE/.image-builds/<build_id>``, made (root's, 0711 on the way) for one build."""
    parent = Path(config.workspace_base) / BUILD_REACH
    parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    os.chmod(parent, 0o711)
    folder = parent / build_id
    folder.mkdir(mode=0o711)
    return folder


def build(
    dockerfile: Path,
    context: Path,
    build_args: Mapping[str, str] | None = None,
    target: str | None = None,
    *,
    store: ImageStore,
    env: BuildEnvironment,
    tag: str | None = None,
) -> BuildResult:
    """Build ``dockerfile`` with ``context``; the image saved in ``store`` (tagged ``tag``)."""
    try:
        with open(dockerfile, "rb") as handle:
            raw = handle.read(MAX_DOCKERFILE_BYTES + 1)
    except OSError as exc:
        raise ImageError(f"The Dockerfile {dockerfile.name} cannot be read: {exc.strerror}.") from None
    if len(raw) > MAX_DOCKERFILE_BYTES:
        raise ImageError(f"The Dockerfile {dockerfile.name} is over {MAX_DOCKERFILE_BYTES} bytes.")
    parsed = df.parse(raw.decode("utf-8", errors="replace"))
    if not context.is_dir():
        raise ImageError(f"The build context {context.name} is not a folder.")
    with _Builder(parsed, context, dict(build_args or {}), store, env) as builder:
        result = builder.build(target, tag)
    store.count("cache_hits" if result.cached else "builds")  # for /metrics, as pull counts pulls
    return result


class _Builder:
    def __init__(
        self, parsed: df.Dockerfile, context: Path, build_args: dict, store: ImageStore, env: BuildEnvironment
    ):
        self.parsed, self.context, self.build_args, self.store, self.env = parsed, context, build_args, store, env
        self.config = env.config
        self.ignore = ctx.Ignore.read(context)
        self.id = uuid.uuid4().hex[:16]
        self.deadline = time.monotonic() + self.config.build_timeout_secs
        self.all_hits = True
        self.steps = 0
        self.stack = contextlib.ExitStack()
        self.cache_dir = store.root / "build-cache"
        self.global_args = self._global_args()
        self.pinned: set[str] = set()  # the images this build holds pins on
        self.rewrites: dict[str, str] = {}  # IMAGE_REWRITES applied: as written -> pulled
        self.states: dict[int, _State] = {}  # the stages built so far, by index (FROM and COPY --from use them)
        self._spawner: Spawner | None = None

    # -- the build's folder, lock and spawner ----------------------------------------------------

    def __enter__(self) -> _Builder:
        try:
            self._enter()
        except BaseException:
            self.stack.close()
            raise
        return self

    def _enter(self) -> None:
        builds = self.store.root / "builds"
        builds.mkdir(mode=0o711, exist_ok=True)
        self.cache_dir.mkdir(mode=0o700, exist_ok=True)
        lock = os.open(builds / f"{self.id}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.stack.callback(os.close, lock)
        self.stack.callback(_unlink, builds / f"{self.id}.lock")
        fcntl.flock(lock, fcntl.LOCK_EX)
        self.folder = builds / self.id  # the steps' upper folders: in the store, layers by rename
        self.folder.mkdir(mode=0o700)
        self.stack.callback(safefs.remove_tree_nofollow, self.folder)
        self.stack.callback(mounts.unmount_below, self.folder)
        # Where the lease's bwrap reaches each step's root and the RUNs' /tmp: WORKSPACE_BASE, which
        # the sandbox uids can pass through (start-up checks it); IMAGES_DIR may sit in a 0700 DATA_DIR.
        self.reach = reach_folder(self.env.config, self.id)
        self.stack.callback(safefs.remove_tree_nofollow, self.reach)
        self.stack.callback(mounts.unmount_below, self.reach)
        # The RUNs' /tmp (the spawner's private tmp): 1777 as an image's own /tmp, not the lease's
        # 0700, since a RUN's tools switch users (apt verifies signatures as _apt there).
        tmp = self.reach / "tmp"
        tmp.mkdir()
        os.chown(tmp, self.env.uid, self.env.uid)
        os.chmod(tmp, 0o1777)
        self.stack.enter_context(self.store.using())  # no prune between a layer and the record naming it

    def __exit__(self, *exc) -> None:
        if self._spawner is not None:
            self._spawner.close()
        self.stack.close()

    @property
    def spawner(self) -> Spawner:
        if self._spawner is None:
            self._spawner = Spawner(
                eval_id=f"{self.env.eval_id}-build-{self.id[:8]}",
                session_dir=self.reach,
                measured=(self.folder,),  # the layers in the making count against the disk and file limits
                runtime=self.env.runtime,
                uid=self.env.uid,
                cancel_event=self.env.cancel_event,
                exclusive_uid=self.env.exclusive_uid,
            )
        return self._spawner

    # -- stages ---------------------------------------------------------------------------------

    def build(self, target: str | None, tag: str | None) -> BuildResult:
        stages = self.parsed.stages
        last = len(stages) - 1
        if target:
            found = self.parsed.stage_index(target, len(stages))
            if found is None:
                raise ImageError(f"The build target {target!r} is not a stage of the Dockerfile.")
            last = found
        needed = self._needed(last)
        for stage in stages[: last + 1]:
            if stage.index in needed:
                self.states[stage.index] = self._stage(stage)
        unused = sorted(set(self.build_args) - self._declared_args())
        if unused:  # Docker warns and goes on
            self.env.progress(f"build args not used by the Dockerfile: {', '.join(unused)}")
        rewrites = tuple({"ref": ref, "rewritten_from": asked} for asked, ref in self.rewrites.items())
        return BuildResult(self._save(self.states[last], tag), cached=self.all_hits, rewrites=rewrites)

    def _needed(self, last: int) -> set[int]:
        """The stages ``last`` depends on (FROM an earlier stage, COPY --from): only those are built."""
        needed, todo = set(), [last]
        while todo:
            index = todo.pop()
            if index in needed:
                continue
            needed.add(index)
            stage = self.parsed.stages[index]
            refs = [self._from_words(stage)[0]]
            for instruction in stage.instructions:
                if instruction.keyword == "COPY":
                    flags, _ = df.split_flags(instruction)
                    if "from" in flags:
                        refs.append(df.expand(flags["from"], self.global_args, instruction))
            for ref in refs:
                found = self.parsed.stage_index(ref, index)
                if found is not None:
                    todo.append(found)
        return needed

    def _global_args(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for instruction in self.parsed.global_args:
            values.update(self._arg_values(instruction, values, {}))
        return values

    def _declared_args(self) -> set[str]:
        names = set()
        for instruction in [*self.parsed.global_args, *(i for s in self.parsed.stages for i in s.instructions)]:
            if instruction.keyword == "ARG":
                names.update(word.split("=", 1)[0] for word in df.split_words(instruction.value, instruction))
        return names

    def _arg_values(self, instruction: df.Instruction, env: dict, inherited: dict) -> dict[str, str]:
        """ARG NAME[=default] ...: a build arg overrides the default; a bare name takes the global
        ARG's value (Docker's way into a stage); a name with no value at all stays unset."""
        values = {}
        for word in df.split_words(instruction.value, instruction):
            name, equals, default = word.partition("=")
            if not df._NAME.fullmatch(name):
                raise instruction.error(f"{name!r} is not a valid ARG name.")
            if name in self.build_args:
                values[name] = str(self.build_args[name])
            elif equals:
                values[name] = df.expand(default, {**env, **values}, instruction)
            elif name in inherited:
                values[name] = inherited[name]
        return values

    def _from_words(self, stage: df.Stage) -> tuple[str, dict[str, str]]:
        instruction = stage.source
        flags, words = df.split_flags(instruction)
        if len(words) not in (1, 3) or (len(words) == 3 and words[1].lower() != "as"):
            raise instruction.error("expected FROM [--platform=...] IMAGE [AS NAME].")
        return df.expand(words[0], self.global_args, instruction), flags

    def _stage(self, stage: df.Stage) -> _State:
        instruction = stage.source
        ref, flags = self._from_words(stage)
        if "platform" in flags:
            self._check_platform(instruction, df.expand(flags["platform"], self.global_args, instruction))
        state = self._base(instruction, ref, stage.index)
        self.env.progress(f"stage {stage.index} FROM {ref}")
        for instruction in stage.instructions:
            if time.monotonic() > self.deadline:
                raise self._timeout(instruction)
            state = getattr(self, f"_{instruction.keyword.lower()}")(state, instruction)
        return state

    def _check_platform(self, instruction: df.Instruction, platform: str) -> None:
        arch, variant = this_platform()
        accepted = {f"linux/{arch}", *([f"linux/{arch}/{variant}"] if variant else [])}
        if platform.lower() not in accepted:
            raise instruction.error(f"the platform {platform} is not this machine's ({sorted(accepted)[0]}).")

    def _base(self, instruction: df.Instruction, ref: str, index: int) -> _State:
        if ref.lower() == "scratch":
            return _State([], {}, _key("scratch"))
        earlier = self._earlier_stage(instruction, ref, index)
        if earlier is not None:
            base = self.states[earlier]
            return _State(list(base.layers), json.loads(json.dumps(base.config)), base.key)
        record = self._image(instruction, ref)
        config = {k: v for k, v in (record.config or {}).items() if k != "OnBuild"}  # not inherited
        return _State(list(record.layers), config, _key("image", record.digest))

    def _image(self, instruction: df.Instruction, ref: str) -> ImageRecord:
        """An image pulled into the store (or already there) and pinned until the build ends."""
        try:
            cancelled = self.env.cancel_event.is_set if self.env.cancel_event else None
            pulled = pull(ref, store=self.store, config=self.config, progress=self.env.progress,
                          ssl_context=self.env.ssl_context, cancelled=cancelled)  # fmt: skip
        except ImageUnavailable:
            raise
        except ImageError as exc:
            raise instruction.error(str(exc)) from None
        record = pulled.record
        if pulled.rewritten_from is not None:
            self.rewrites[pulled.rewritten_from] = pulled.ref
        if record.digest not in self.pinned:  # one pin per image: a second flock of it would wait on the first
            self.stack.enter_context(self.store.pin(record.digest, f"build-{self.id}"))
            self.pinned.add(record.digest)
        return record

    # -- instructions that only change the config ------------------------------------------------

    def _config_step(self, state: _State, instruction: df.Instruction, spec, change: Callable[[dict], None]) -> _State:
        config = json.loads(json.dumps(state.config))
        change(config)
        key = _key(state.key, instruction.keyword, spec, sorted(state.args.items()))
        return _State(state.layers, config, key, state.args)

    def _env(self, state: _State, instruction: df.Instruction) -> _State:
        pairs = df.key_values(instruction, state.env())

        def change(config: dict) -> None:
            env = _env_dict(config)
            for name, value in pairs:
                env[name] = value
            config["Env"] = [f"{name}={value}" for name, value in env.items()]

        return self._config_step(state, instruction, pairs, change)

    def _arg(self, state: _State, instruction: df.Instruction) -> _State:
        values = self._arg_values(instruction, state.env(), self.global_args)
        args = {**state.args, **values}
        return _State(state.layers, state.config, _key(state.key, "ARG", sorted(args.items())), args)

    def _label(self, state: _State, instruction: df.Instruction) -> _State:
        pairs = df.key_values(instruction, state.env())
        return self._config_step(
            state, instruction, pairs, lambda c: c.setdefault("Labels", {}).update(dict(pairs)) if pairs else None
        )

    def _user(self, state: _State, instruction: df.Instruction) -> _State:
        words = self._words(state, instruction, 1, "USER NAME[:GROUP]")
        return self._config_step(state, instruction, words, lambda c: c.__setitem__("User", words[0]))

    def _workdir(self, state: _State, instruction: df.Instruction) -> _State:
        words = self._words(state, instruction, 1, "WORKDIR PATH")
        path = posixpath.normpath(posixpath.join(state.config.get("WorkingDir") or "/", words[0]))
        state = self._config_step(state, instruction, path, lambda c: c.__setitem__("WorkingDir", path))
        # The folder is made (as root, as Docker) when the image lacks it: a layer, cached like the rest.
        return self._layer_step(
            state, instruction, ["mkdir", path], None, lambda root, idmap: _make_folder(root, path, idmap)
        )

    def _shell(self, state: _State, instruction: df.Instruction) -> _State:
        shell = df.json_form(instruction.value)
        if not shell:
            raise instruction.error('SHELL takes the JSON form, e.g. SHELL ["/bin/bash", "-c"].')
        return self._config_step(state, instruction, shell, lambda c: c.__setitem__("Shell", shell))

    def _cmd(self, state: _State, instruction: df.Instruction) -> _State:
        argv = df.command(instruction, instruction.value, _shell_of(state.config))
        return self._config_step(state, instruction, argv, lambda c: c.__setitem__("Cmd", argv))

    def _entrypoint(self, state: _State, instruction: df.Instruction) -> _State:
        argv = df.command(instruction, instruction.value, _shell_of(state.config))

        def change(config: dict) -> None:
            config["Entrypoint"] = argv
            config.pop("Cmd", None)  # Docker: a new ENTRYPOINT drops the base image's CMD

        return self._config_step(state, instruction, argv, change)

    def _expose(self, state: _State, instruction: df.Instruction) -> _State:
        ports = []
        for word in self._words(state, instruction, None, "EXPOSE PORT[/PROTOCOL]..."):
            port, _, protocol = word.partition("/")
            if not port.isdigit() or protocol not in ("", "tcp", "udp", "sctp"):
                raise instruction.error(f"{word!r} is not a port (PORT or PORT/tcp|udp|sctp).")
            ports.append(f"{int(port)}/{protocol or 'tcp'}")
        return self._config_step(
            state, instruction, ports, lambda c: c.setdefault("ExposedPorts", {}).update({p: {} for p in ports})
        )

    def _volume(self, state: _State, instruction: df.Instruction) -> _State:
        paths = df.json_form(instruction.value)
        if paths is None:
            paths = self._words(state, instruction, None, "VOLUME PATH...")
        else:
            paths = [df.expand(path, state.env(), instruction) for path in paths]
        return self._config_step(
            state, instruction, paths, lambda c: c.setdefault("Volumes", {}).update({p: {} for p in paths})
        )

    def _stopsignal(self, state: _State, instruction: df.Instruction) -> _State:
        words = self._words(state, instruction, 1, "STOPSIGNAL SIGNAL")
        return self._config_step(state, instruction, words, lambda c: c.__setitem__("StopSignal", words[0]))

    def _onbuild(self, state: _State, instruction: df.Instruction) -> _State:
        trigger = instruction.value.split(None, 1)[0].upper()
        if trigger in ("ONBUILD", "FROM", "MAINTAINER"):
            raise instruction.error(f"ONBUILD {trigger} is not allowed.")
        return self._config_step(
            state, instruction, instruction.value, lambda c: c.setdefault("OnBuild", []).append(instruction.value)
        )

    def _maintainer(self, state: _State, instruction: df.Instruction) -> _State:
        return state  # deprecated; Docker keeps it outside the config ("author")

    def _healthcheck(self, state: _State, instruction: df.Instruction) -> _State:
        flags, text = df.rest_after_flags(instruction)
        kind, _, rest = text.partition(" ")
        if kind.upper() == "NONE" and not rest.strip():
            check = {"Test": ["NONE"]}
        elif kind.upper() == "CMD" and rest.strip():
            argv = df.json_form(rest.strip())
            check = {"Test": ["CMD", *argv] if argv is not None else ["CMD-SHELL", rest.strip()]}
            for flag, field in (("interval", "Interval"), ("timeout", "Timeout"), ("start-period", "StartPeriod"),
                                ("start-interval", "StartInterval")):  # fmt: skip
                if flag in flags:
                    check[field] = _duration_ns(instruction, flags[flag])
            if "retries" in flags:
                if not flags["retries"].isdigit():
                    raise instruction.error(f"--retries must be a whole number, got {flags['retries']!r}.")
                check["Retries"] = int(flags["retries"])
        else:
            raise instruction.error("expected HEALTHCHECK [OPTIONS] CMD COMMAND, or HEALTHCHECK NONE.")
        return self._config_step(state, instruction, check, lambda c: c.__setitem__("Healthcheck", check))

    def _words(self, state: _State, instruction: df.Instruction, count: int | None, form: str) -> list[str]:
        words = [df.expand(word, state.env(), instruction) for word in df.split_words(instruction.value, instruction)]
        if not words or (count is not None and len(words) != count):
            raise instruction.error(f"expected {form}.")
        return words

    # -- instructions that make a layer ------------------------------------------------------------

    def _run(self, state: _State, instruction: df.Instruction) -> _State:
        flags, text = df.rest_after_flags(instruction)
        argv = df.command(instruction, text, _shell_of(state.config))
        if not argv or not argv[-1].strip():
            raise instruction.error("RUN needs a command.")

        def action(root: rootfs.ImageRoot, idmap: IdMap) -> None:
            workdir = state.config.get("WorkingDir") or "/"
            _make_folder(root, workdir, idmap)
            self._run_command(instruction, root, idmap, argv, workdir, state)

        return self._layer_step(state, instruction, argv, None, action, user=state.config.get("User") or "")

    def _run_command(self, instruction, root, idmap: IdMap, argv, workdir: str, state: _State) -> None:
        env = {**self.env.extra_env, **state.args, **_env_dict(state.config)}
        env.setdefault("PATH", df.DEFAULT_PATH)
        env.setdefault("HOME", _home(root.rootfs, idmap.user))
        network = self.config.build_network == "on" and self.env.egress_socket is not None
        policy = SandboxPolicy(
            image=root,
            network=network,
            egress_socket=self.env.egress_socket if network else None,
            relay_init=self.env.relay_init if network else None,
            ca_bundle=self.env.ca_bundle,
        )
        shown = _short(" ".join(argv[-1:] if argv[:-1] == _shell_of(state.config) else argv))
        self.env.progress(f"line {instruction.line}: RUN {shown}")
        result = self.spawner.run(argv, cwd=Path(workdir), env=env, limits=self._limits(), policy=policy)
        if result.limit is Limit.CANCELLED:
            raise ImageUnavailable("The build was cancelled.")
        if result.limit is Limit.TIMEOUT:  # each RUN's timeout is what is left of the build's
            raise self._timeout(instruction)
        if result.limit is not None or result.exit_code != 0:
            why = result.limit_detail if result.limit is not None else f"exited with status {result.exit_code}"
            tail = result.output[-OUTPUT_TAIL_CHARS:].strip()
            raise instruction.error(f"the command {shown!r} {why}" + (f"; its output ends: {tail}" if tail else "."))

    def _copy(self, state: _State, instruction: df.Instruction) -> _State:
        return self._copy_or_add(state, instruction, add=False)

    def _add(self, state: _State, instruction: df.Instruction) -> _State:
        return self._copy_or_add(state, instruction, add=True)

    def _copy_or_add(self, state: _State, instruction: df.Instruction, *, add: bool) -> _State:
        flags, text = df.rest_after_flags(instruction)
        env = state.env()
        listed = df.json_form(text)
        words = listed if listed is not None else df.split_words(text, instruction)
        paths = [df.expand(word, env, instruction) for word in words]
        if len(paths) < 2:
            raise instruction.error(f"expected {instruction.keyword} SOURCE... DESTINATION.")
        names, dest = paths[:-1], paths[-1]
        into_folder = dest.endswith(("/", "/.")) or dest in (".", "..")
        dest = posixpath.normpath(posixpath.join(state.config.get("WorkingDir") or "/", dest))
        chown = df.expand(flags["chown"], env, instruction) if "chown" in flags else None
        chmod = _chmod(instruction, flags.get("chmod"))
        if "from" in flags:
            if add:
                raise instruction.error("ADD has no --from; use COPY --from.")
            # Another stage or an image: its layers stand for its content (their ids are content hashes).
            from_layers = self._from_layers(
                instruction, df.expand(flags["from"], {**self.global_args, **env}, instruction)
            )
            content, copies = _key("from", from_layers), None
        else:
            from_layers = None
            copies = self._context_sources(instruction, names, add)
            content = ctx.content_hash(copies)
            content = _key(content, [source.digest for _, source, _ in copies if isinstance(source, _Download)])
        spec = {"sources": names, "dest": dest, "folder": into_folder, "chown": chown, "chmod": chmod}

        def action(root: rootfs.ImageRoot, idmap: IdMap) -> None:
            owner = (*self._owner(instruction, root.rootfs, chown), chmod)
            # What the build's folders hold now (the RUNs' /tmp, the layers in the making), as RUN's monitor.
            budget = copyin.Budget(instruction, self.config, safefs.tree_usage(self.folder))
            with contextlib.ExitStack() as stack:
                found = copies
                if from_layers is not None:
                    read_root = stack.enter_context(self._mounted_read(from_layers))
                    found = self._find(instruction, read_root, names, None, clamp=True)
                several = len(found) > 1 or any(source.wildcard for _, source, _ in found)
                if several and not into_folder:
                    raise instruction.error("with several sources, the destination must be a folder ending in /.")
                root_fd = inroot.open_root(root.rootfs)
                stack.callback(os.close, root_fd)
                for name, source, entries in found:
                    self._place(instruction, root_fd, idmap, name, source, entries, dest, into_folder or several,
                                owner, budget, unpack=add and not isinstance(source, _Download))  # fmt: skip

        return self._layer_step(state, instruction, spec, content, action)

    def _from_layers(self, instruction: df.Instruction, ref: str) -> list[str]:
        """COPY --from: an earlier stage (by name or number), else an image reference."""
        index = self._earlier_stage(instruction, ref, self._stage_of(instruction))
        if index is not None:
            return self.states[index].layers
        return self._image(instruction, ref).layers

    def _earlier_stage(self, instruction: df.Instruction, ref: str, current: int) -> int | None:
        """The stage ``ref`` names, among those before ``current``; None for an image reference."""
        index = self.parsed.stage_index(ref, current)
        if index is None and self.parsed.stage_index(ref, len(self.parsed.stages)) is not None:
            raise instruction.error(f"the stage {ref!r} comes after this line: a stage can only use earlier ones.")
        return index

    def _context_sources(self, instruction: df.Instruction, names: list[str], add: bool) -> list:
        found = []
        for name in names:
            if add and name.startswith(_URL_PREFIXES):
                base = posixpath.basename(name.split("?")[0].rstrip("/"))
                base = "download" if base in ("", ".", "..") else base
                path, digest = self._download(instruction, name, base)
                source = _Download(base, path.parent, wildcard=False, digest=digest)
                found.append((name, source, [ctx.Entry("", "file", 0o600, base, size=path.stat().st_size)]))
            else:
                found += self._find(instruction, self.context, [name], self.ignore, clamp=False)
        return found

    def _find(self, instruction, root: Path, names: list[str], ignore, *, clamp: bool):
        found = []
        for name in names:
            try:
                sources = ctx.sources(root, name, ignore, clamp=clamp)
            except ctx.Escape:
                raise instruction.error(f"the source {name!r} leads outside the build context.") from None
            if not sources:
                where = "the source stage" if clamp else "the build context"
                excluded = " (or .dockerignore excludes it)" if ignore and ignore.patterns else ""
                raise instruction.error(f"the source {name!r} is not in {where}{excluded}.")
            for source in sources:
                try:
                    found.append((name, source, ctx.entries(source, ignore)))
                except ctx.Escape:
                    raise instruction.error(f"the source {name!r} leads outside the build context.") from None
        return found

    def _download(self, instruction, url: str, base: str) -> tuple[Path, str]:
        folder = Path(tempfile.mkdtemp(prefix="download-", dir=self.folder))
        path = folder / base
        try:
            urlguard.fetch(url, path, max_bytes=self.config.max_task_archive_bytes,
                           timeout_secs=self.config.download_timeout_secs,
                           policy=urlguard.URLPolicy.from_config(self.config), label="ADD URL")  # fmt: skip
        except urlguard.FetchError as exc:
            if getattr(exc, "transient", False):
                raise ImageUnavailable(f"Dockerfile line {instruction.line} (ADD): {exc}.") from None
            raise instruction.error(f"{exc}.") from None
        return path, _file_digest(path)

    def _stage_of(self, instruction: df.Instruction) -> int:
        return next(s.index for s in self.parsed.stages if instruction in s.instructions)

    # -- a layer step: cache, mount, action, commit ------------------------------------------------

    def _layer_step(self, state, instruction, spec, content, action, *, user: str = "") -> _State:
        key = _key(state.key, instruction.keyword, spec, sorted(state.args.items()), content)
        entry = self._cached(key)
        if entry is None:
            with self._key_lock(key, instruction):  # a second build of this key waits, then finds the entry
                entry = self._cached(key)
                if entry is None:
                    self.all_hits = False
                    layer = self._make_layer(instruction, state.layers, user, action)
                    entry = {"layer": layer, "created_at": now_iso()}
                    _write_json(self.cache_dir / f"{key}.json", entry)
                    layers = [*state.layers, entry["layer"]] if entry["layer"] else list(state.layers)
                    return _State(layers, state.config, key, state.args)
        self.env.progress(f"line {instruction.line}: {instruction.keyword} (cached)")
        layers = [*state.layers, entry["layer"]] if entry["layer"] else list(state.layers)
        return _State(layers, state.config, key, state.args)

    def _cached(self, key: str) -> dict | None:
        try:
            entry = json.loads((self.cache_dir / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None
        layer = entry.get("layer")
        if layer is not None and not self.store.has_layer(layer):
            return None  # pruned since: build it again
        return entry

    @contextlib.contextmanager
    def _key_lock(self, key: str, instruction: df.Instruction) -> Iterator[None]:
        fd = os.open(self.cache_dir / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.env.progress(f"line {instruction.line}: {instruction.keyword} waits for another build of it")
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _make_layer(self, instruction: df.Instruction, layers: list[str], user: str, action) -> str | None:
        """Mount ``layers`` with a writable upper, run ``action(root, idmap)``, commit the upper.

        The map puts ``user`` (the stage's USER, read from the image's own /etc/passwd once it is
        mounted) at the lease: the root is mounted again under that map when it is not root.
        """
        self.steps += 1
        folder = self.folder / str(self.steps)
        folder.mkdir(mode=0o700)
        target = self.reach / f"{self.steps}-rootfs"
        trees = [self.store.layer_tree(layer) for layer in layers]
        idmap = IdMap(lease=self.env.uid, base=self.env.id_base)
        try:
            try:
                root = rootfs.mount_root(trees, folder, idmap, redirect_dir=False, target=target)
                uid, gid = self._resolve(instruction, root.rootfs, user) if user else (0, 0)
                if (uid, gid) != (0, 0):
                    mounts.unmount(target)
                    target.rmdir()
                    safefs.remove_tree_nofollow(folder / rootfs.IMAGE_DIR)
                    idmap = IdMap(lease=self.env.uid, base=self.env.id_base, user=uid, group=gid)
                    root = rootfs.mount_root(trees, folder, idmap, redirect_dir=False, target=target)
                action(root, idmap)
            finally:
                mounts.unmount_below(target)
                mounts.unmount_below(folder)
            return commit(rootfs.upper_of(folder), idmap, self.store)
        finally:
            safefs.remove_tree_nofollow(folder)
            if target.is_dir():
                target.rmdir()

    @contextlib.contextmanager
    def _mounted_read(self, layers: list[str]) -> Iterator[Path]:
        """Another stage's or image's files, merged, to read from (its upper stays empty)."""
        self.steps += 1
        folder = self.folder / f"{self.steps}-from"
        folder.mkdir(mode=0o700)
        idmap = IdMap(lease=self.env.uid, base=self.env.id_base)
        try:
            root = rootfs.mount_root([self.store.layer_tree(layer) for layer in layers], folder, idmap)
            yield root.rootfs
        finally:
            mounts.unmount_below(folder)
            safefs.remove_tree_nofollow(folder)

    # -- writing into the step's root --------------------------------------------------------------

    def _place(self, instruction, root_fd: int, idmap: IdMap, name: str, source: ctx.Source, entries, dest: str,
               into_folder: bool, owner, budget: copyin.Budget, *, unpack: bool) -> None:  # fmt: skip
        """One source's entries written under ``dest`` in the step's root (its handle), owned
        ``owner`` inside; every path there resolved in the root (copyin.py)."""
        uid, gid, chmod = owner
        ids = (idmap.host_uid(uid), idmap.host_gid(gid))
        if unpack and entries[0].kind == "file":
            with ctx.read_file(source, entries[0]) as handle:
                if copyin.is_archive(handle):
                    os.close(copyin.mkdirs(root_fd, dest, uid, gid, idmap))
                    shown = posixpath.basename(source.relpath) or name
                    copyin.unpack_tar(instruction, handle, shown, root_fd, dest, idmap, budget)
                    return
        if entries[0].kind == "dir":
            base = dest
        else:
            base = posixpath.join(dest, posixpath.basename(source.relpath) or "file") if into_folder else dest
            if not into_folder and _is_folder(root_fd, base):
                base = posixpath.join(dest, posixpath.basename(source.relpath))
        for entry in entries:
            relpath = posixpath.join(base, entry.dest) if entry.dest else base
            mode = entry.mode if chmod is None else chmod
            budget.take(f"copying /{'/'.join(filter(None, (source.relpath, entry.dest)))}", entry.size)
            if entry.kind == "dir":
                os.close(copyin.mkdirs(root_fd, relpath, uid, gid, idmap, mode=mode if entry.dest else None))
                continue
            parent = copyin.mkdirs(root_fd, posixpath.dirname(relpath), uid, gid, idmap)
            last = posixpath.basename(relpath)
            try:
                try:
                    copyin.clear(parent, last, folders=False)
                except IsADirectoryError:
                    raise instruction.error(f"cannot copy {name!r} onto the folder {relpath}.") from None
                if entry.kind == "link":
                    copyin.write_link(entry.target, parent, last, ids)
                else:
                    with ctx.read_file(source, entry) as handle:
                        copyin.write_file(handle, entry.size, parent, last, ids, mode, entry.mtime_ns)
            finally:
                os.close(parent)

    def _owner(self, instruction, root: Path, chown: str | None) -> tuple[int, int]:
        """--chown=user[:group] as ids inside the image, names through its /etc/passwd and /etc/group;
        a user alone is also the group, by its number (Docker's rule)."""
        if not chown:
            return 0, 0
        uid, gid = self._resolve(instruction, root, chown)
        return (uid, gid) if ":" in chown else (uid, uid)

    def _resolve(self, instruction, root: Path, user: str) -> tuple[int, int]:
        try:
            return rootfs.resolve_user(root, user)
        except ImageError as exc:
            raise instruction.error(f"{exc}.") from None

    # -- the end ----------------------------------------------------------------------------------

    def _limits(self) -> Limits:
        return Limits.of(self.config, self.deadline - time.monotonic())

    def _timeout(self, instruction: df.Instruction) -> ImageError:
        return instruction.error(f"the build took longer than BUILD_TIMEOUT_SECS ({self.config.build_timeout_secs} s).")

    def _save(self, state: _State, tag: str | None) -> ImageRecord:
        manifest = json.dumps(
            {"mediaType": _MANIFEST_TYPE, "layers": state.layers, "config": state.config},
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        stamp = now_iso()
        record = ImageRecord(
            digest=digest,
            refs=[],
            config=state.config,
            layers=state.layers,
            size_bytes=sum(self.store.layer_meta(layer)["size_bytes"] for layer in state.layers),
            source="build",
            created_at=stamp,
            last_used_at=stamp,
        )
        refs = [_canonical(tag, self.config)] if tag else []
        return self.store.save_image(record, refs=refs)


# -- helpers ------------------------------------------------------------------------------------


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _env_dict(config: dict) -> dict[str, str]:
    env = {}
    for item in config.get("Env") or []:
        name, _, value = item.partition("=")
        env[name] = value
    return env


def _shell_of(config: dict) -> list[str]:
    return list(config.get("Shell") or df.DEFAULT_SHELL)


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _canonical(tag: str, config) -> str:
    return str(parse_reference(tag, config.image_default_registry))


def _chmod(instruction: df.Instruction, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise instruction.error(f"--chmod takes an octal mode such as 0755, got {text!r}.")
    return mode


def _duration_ns(instruction: df.Instruction, text: str) -> int:
    units = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return int(float(text[: -len(unit)]) * units[unit])
    raise instruction.error(f"{text!r} is not a duration (such as 30s, 5m, 1h).")


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    tmp.write_text(json.dumps(data))
    os.rename(tmp, path)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _make_folder(root: rootfs.ImageRoot, path: str, idmap: IdMap) -> None:
    """WORKDIR's folder (and a RUN's), made as root when the image lacks it, as Docker."""
    root_fd = inroot.open_root(root.rootfs)
    try:
        os.close(copyin.mkdirs(root_fd, path, 0, 0, idmap))
    finally:
        os.close(root_fd)


def _is_folder(root_fd: int, path: str) -> bool:
    """Whether ``path`` is a folder in the root (its links followed there)."""
    try:
        fd = inroot.open_in(root_fd, path, os.O_PATH)
    except OSError:
        return False
    try:
        return stat.S_ISDIR(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def _home(root: Path, uid: int) -> str:
    """HOME for a RUN as ``uid``: its /etc/passwd entry's, as a container runtime sets it."""
    for fields in rootfs.table(root, "/etc/passwd"):
        if len(fields) >= 6 and fields[2] == str(uid) and fields[5]:
            return fields[5]
    return "/root" if uid == 0 else "/"
