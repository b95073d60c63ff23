"""The step ``preparing_environment`` (SPEC §16): what the task's commands will run in.

1. No ``environment:`` and no DEFAULT_ENVIRONMENT: the host's system folders (kind ``host``).
2. A name: a root filesystem under ENVIRONMENTS_ROOT (SPEC §11, kind ``name``).
3. ``{image: REF}``: pulled into the image store (images/pull.py) unless a fresh copy is there;
   ``{dockerfile: ...}``: built (images/build.py), each instruction from the build cache when it can.
   The image is pinned for the evaluation (no eviction takes it meanwhile) and its root mounted
   in the session (images/rootfs.py): the image's layers, idmapped onto the evaluation's ids,
   under the evaluation's own writable layer. Its ``User`` becomes the evaluation's uid inside.

The evaluation's ``environment`` records ``{kind, ref, digest, cached}``; progress (layers pulled,
instructions built) goes to the live log as it happens. IMAGE_REWRITES (SPEC §22) applies inside
the pull both paths go through (images/reference.py ``rewrite``): an image task's ``ref`` is then the
reference pulled and ``rewritten_from`` the task's; a Dockerfile's record lists its ``rewrites``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from evaluations import environments, languages, livelog
from evaluations.environments import kinds
from evaluations.environments.toolchains import CA_VARIABLES
from evaluations.images import build, changes, diff, rootfs
from evaluations.images.errors import ImageError
from evaluations.images.isolate import verifier_commands as verifier_commands_in
from evaluations.images.pull import pull
from evaluations.images.store import ImageStore
from evaluations.models import ErrorKind
from evaluations.network.egress.relay import RELAY_TARGET, SANDBOX_SOCKET
from evaluations.pipeline import collect, services, volumes
from evaluations.pipeline.agentenv import find_interpreter
from evaluations.pipeline.context import Context, StepFailed, environment_failure, make_session_folder
from evaluations.runtime.idmap import image_id_base
from evaluations.runtime.policy import DISTRIBUTION_CA_BUNDLE
from evaluations.tasks.spec import AGENT_LOGS, ARTIFACTS_DIR, ImageEnvironment
from executor_project.config import Config


def choose_environment(config: Config, task) -> environments.Environment | None:
    """A named environment: the task's ``environment:``, else DEFAULT_ENVIRONMENT, else none."""
    name = task.environment or config.default_environment
    if not name or isinstance(name, ImageEnvironment):
        return None
    return environments.resolve(config.environments_root, name)


def preparing_environment(ctx: Context) -> None:
    spec = ctx.task.environment
    record = _image(ctx, spec) if isinstance(spec, ImageEnvironment) else _named(ctx)
    ctx.stage(environment=record)
    _check_programs(ctx)
    verifiers = _separate_verifiers(ctx)
    if verifiers:  # SPEC §23: the verifier's own image beside the agent's (each step's that has one)
        ctx.stage(environment={**record, **verifiers})
    if isinstance(spec, ImageEnvironment) and ctx.task.services:
        _service_images(ctx)  # SPEC §23: started by starting_environment (pipeline/services.py)
    if isinstance(spec, ImageEnvironment):
        _volumes(ctx)


def _named(ctx: Context) -> dict:
    with environment_failure(kind=None):
        environment = choose_environment(ctx.config, ctx.task)
    if environment is None:
        record = {"kind": "host", "ref": None, "digest": None, "cached": True}
    elif not ctx.runtime.isolated:
        raise StepFailed(
            f"environment {environment.name} needs the sandbox, and this executor runs without one",
            kind=ErrorKind.INFRASTRUCTURE,
        )
    else:
        ctx.env = kinds.Named(ctx.session, ctx.spawner, environment)
        record = {"kind": "name", "ref": environment.name, "digest": None, "cached": True}
    return record


def _image(ctx: Context, spec: ImageEnvironment) -> dict:
    if not ctx.runtime.isolated or ctx.session.uid is None:
        raise StepFailed(
            f"image {spec.ref} needs the sandbox and the service running as root (user namespaces, mounts); "
            "this executor has neither",
            kind=ErrorKind.INFRASTRUCTURE,
        )
    # SPEC §16: no repository, the image's WorkingDir is the workspace
    ctx.env, result = _prepare(ctx, spec, kinds.Image, ctx.config, ctx.session.root, ctx.eval_id, ctx.task.repo is None,
                               agent_user=ctx.task.request.agent_user)  # fmt: skip
    if ctx.steps is not None:
        _step_users(ctx)
    livelog.append_text(ctx.session.log, f"image {spec.ref}: {result.record.digest}{_cached(result)}\n")
    return _record(spec, result)


def _separate_verifiers(ctx: Context) -> dict:
    """Harbor's ``environment_mode = "separate"`` (SPEC §23): the task's verifier's root in
    ``verifier-image/`` (``ctx.verifier_env``), recorded as ``verifier``; for a task of [[steps]], each
    separate step's own root in ``verifier-image/<number>/`` (``ctx.steps.separate``, by name; the same
    image pulled or built once, the store caching it), recorded as ``verifiers`` by step name. Each
    becomes the task's environment as its tests begin (collect.enter_separate), once."""
    if ctx.steps is None:
        separate = ctx.task.verifier.separate if ctx.task.verifier is not None else None
        if separate is None:
            return {}
        folder = ctx.session.verifier_image
        _image_folder(ctx, folder, "the verifier's folder")
        ctx.verifier_env, record = _separate_verifier(ctx, separate, folder, f"{ctx.eval_id}.verifier")
        return {"verifier": record}
    separate = [(number, step) for number, step in enumerate(ctx.task.steps, 1) if step.verifier.separate is not None]
    if not separate:
        return {}
    parent = ctx.session.verifier_image
    _image_folder(ctx, parent, "the verifiers' folder", mode=0o711)  # passed by each root's ids, never listed
    records = {}
    for number, step in separate:
        folder = parent / str(number)
        _image_folder(ctx, folder, f"step {step.name!r}'s verifier's folder")
        user = (step.request.verifier_user, _step_user_key(number, step))
        env, records[step.name] = _separate_verifier(ctx, step.verifier.separate, folder,
                                                     f"{ctx.eval_id}.verifier.{number}", user, step.name)  # fmt: skip
        ctx.steps.separate[step.name] = env
    return {"verifiers": records}


def _separate_verifier(ctx: Context, separate, folder: Path, holder: str, user=None, step: str = ""):
    """One separate verifier's image, pulled or built as the agent's is (the same store, cache and build;
    its environment's build_timeout_sec capped by BUILD_TIMEOUT_SECS), and its root mounted in ``folder``
    (as the agent's is in the session: bound by no sandbox of the agent's), working in its own WorkingDir
    (its environment's workdir over it); ``user``: its verifier's user and where that is from (a step's),
    else [verifier] user. The environment and its record."""
    spec = separate.environment
    asked = separate.build_timeout_secs
    limit = ctx.config.build_timeout_secs
    config = replace(ctx.config, build_timeout_secs=limit if asked is None else max(1, min(limit, math.ceil(asked))))
    prefix = f"step {step!r}: " if step else ""
    env, result = _prepare(ctx, spec, kinds.VerifierImage, config, folder, holder, True,
                           what=f"{prefix}the verifier's image", verifier_user=user)  # fmt: skip
    with environment_failure(kind=None, prefix=f"{prefix}the verifier's "):
        env.check_programs({"bash": "the shell of the verifier's tests/test.sh"})
    shown = f"step {step!r}'s verifier image" if step else "verifier image"
    livelog.append_text(ctx.session.log, f"{shown} {spec.ref}: {result.record.digest}{_cached(result)}\n")
    return env, _record(spec, result)


def _service_images(ctx: Context) -> None:
    """SPEC §23: each compose service's image pulled or built as the agent's is (the same store, cache
    and build), its root mounted in ``services/<name>/`` of the session (bound by no other sandbox),
    working in its ``working_dir`` (else its WorkingDir), its User the service's ``user`` when it names
    one; then /etc/hosts naming every service in each root of the evaluation (services.write_hosts)."""
    parent = ctx.session.root / services.SERVICES_DIR
    _image_folder(ctx, parent, "the services' folder", mode=0o711)  # passed by each service's ids, never listed
    for service in ctx.task.services:
        spec = service.environment
        if service.workdir:
            spec = replace(spec, workdir=service.workdir)
        folder = parent / service.name
        _image_folder(ctx, folder, f"service {service.name!r}'s folder")
        env, result = _prepare(ctx, spec, kinds.ServiceImage, ctx.config, folder, f"{ctx.eval_id}.{service.name}",
                               True, what=f"service {service.name!r}'s image", agent_user=service.user,
                               user_key=f"environment/docker-compose.yaml: service {service.name!r}: 'user'")  # fmt: skip
        livelog.append_text(ctx.session.log, f"service {service.name} image {spec.ref}: "
                            f"{result.record.digest}{_cached(result)}\n")  # fmt: skip
        ctx.services[service.name] = services.Running(service=service, environment=env)
    services.write_all_hosts(ctx)


def _volumes(ctx: Context) -> None:
    """SPEC §23: the compose file's named volumes and a service's Harbor log folders (volumes.py),
    bound at their targets in main (the agent's, its first process's and the verifier's sandboxes) and
    in every service naming them; a service's log folders are the session's own folders main has at
    /logs/agent and /logs/artifacts (collect.agent_folders; a task of [[steps]]: the first step's, the
    one main has when the services start)."""
    task = ctx.task
    made = volumes.make_volumes(
        ctx.session,
        task.volumes,
        task.services,
        lambda: dict(zip((AGENT_LOGS, ARTIFACTS_DIR), collect.agent_folders(ctx), strict=True)),
    )
    if made is None:
        return
    ctx.env.volumes = made.main
    for running in ctx.services.values():
        running.environment.volumes = made.services[running.service.name]


def _image_folder(ctx: Context, folder: Path, shown: str, *, mode: int = 0o710) -> None:
    """A folder of the session for an image's root: root's, its group the lease's (``mode`` 0710: as
    the session's, the sandbox passes to the root and nobody lists it)."""
    make_session_folder(ctx.session, folder, mode, owner=ctx.session.root_passed, shown=shown)


def _prepare(ctx: Context, spec: ImageEnvironment, env_class, config: Config, folder: Path, holder: str,
             in_workdir: bool, *, what: str = "", agent_user: str | None = None,
             user_key: str | None = None, verifier_user: tuple[str | None, str] | None = None,
             ) -> tuple[kinds.Image, object]:  # fmt: skip
    """``spec`` pulled or built into the store, pinned for the evaluation (``holder``: no eviction takes
    it meanwhile), and its root mounted in ``folder`` (``<folder>/rootfs``), the task's workdir over
    its WorkingDir: an environment of ``env_class`` and the pull's or build's result. ``what`` names
    the image in an error sentence when it is not the agent's; ``agent_user``: its map's user (the
    lease) instead of its User ([agent] user, SPEC §23); ``user_key``: where ``agent_user`` comes from
    when it is not [agent] user (a compose service's ``user``: the user all its processes run as);
    ``verifier_user``: its verifier's user and where that is from, when not [verifier] user (a step's)."""
    store = ImageStore.of(config)  # IMAGES_DIR (default DATA_DIR/images), evicting down to IMAGES_MAX_BYTES
    progress = _progress(ctx)
    try:
        if spec.image is not None:
            result = pull(spec.image, store=store, config=config, progress=progress, cancelled=ctx.cancel.is_set)
        else:
            result = _build(ctx, spec, store, progress, config)
        record = result.record
        ctx.closing.enter_context(store.pin(record.digest, holder))
        store.touch(record.digest)
        image_config = dict(record.config or {})
        if spec.workdir:  # Harbor's [environment] workdir: the task's, over the image's
            image_config["WorkingDir"] = spec.workdir
        verifier_user, verifier_key = verifier_user or (ctx.task.request.verifier_user, "task.toml: [verifier] user")
        if user_key is not None:  # a compose service: its user alone, the map's
            image_config["User"] = agent_user or image_config.get("User")
            verifier_user = None
        mounted = _mount(ctx, store, record, image_config.get("WorkingDir") or "/", folder, agent_user, user_key)
        env = env_class(
            ctx.session,
            ctx.spawner,
            ref=spec.ref,
            digest=record.digest,
            config=image_config,
            mounted=mounted,
            store=store,
            in_workdir=in_workdir,
            users=_users(mounted, verifier_user, image_config, verifier_key),
            folder=folder,
        )
        ctx.closing.callback(env.close)
        if env.users:
            ctx.session.let_image_users_pass(folder)
    except ImageError as exc:
        ctx.check_cancelled()  # a pull or build stopped by the evaluation's cancel ends as the cancel does
        raise StepFailed(f"{what}: {exc}" if what else str(exc), kind=exc.kind) from None
    except OSError as exc:
        shown = f"{what} {spec.ref}" if what else f"image {spec.ref}"
        raise StepFailed(f"could not prepare {shown}: {exc}", kind=ErrorKind.INFRASTRUCTURE) from None
    return env, result


def _cached(result) -> str:
    return " (cached)" if result.cached else ""


def _record(spec: ImageEnvironment, result) -> dict:
    """The evaluation's ``environment``, with what IMAGE_REWRITES replaced (absent when nothing was)."""
    record = {"kind": spec.kind, "ref": spec.ref, "digest": result.record.digest, "cached": result.cached}
    if spec.image is not None and result.rewritten_from is not None:
        record.update(ref=result.ref, rewritten_from=result.rewritten_from)
    if spec.image is None and result.rewrites:
        record["rewrites"] = list(result.rewrites)
    return record


def _build(ctx: Context, spec: ImageEnvironment, store: ImageStore, progress, config: Config) -> build.BuildResult:
    """The task's Dockerfile built as ``manage.py image build`` builds one: every RUN through the
    sandbox as this evaluation's uid, root in name only over its id range, egress through this
    evaluation's proxy (BUILD_NETWORK), within BUILD_TIMEOUT_SECS."""
    lease = ctx.session.uid
    network = config.build_network == "on" and ctx.egress is not None
    ca = ctx.trusted_ca
    environment = build.BuildEnvironment(
        runtime=ctx.runtime,
        uid=lease,
        id_base=image_id_base(config.image_uid_base, lease, config.sandbox_uid),
        config=config,
        progress=progress,
        egress_socket=Path(ctx.egress.socket_path) if network else None,
        relay_init=ctx.relay_init() if network else None,
        ca_bundle=ca.host if ca is not None else None,
        extra_env=dict.fromkeys(CA_VARIABLES, ca.sandbox) if ca is not None else {},
        eval_id=ctx.eval_id,
        cancel_event=ctx.cancel,
        exclusive_uid=True,
    )
    root = ctx.task.root
    return build.build(
        root / spec.dockerfile, root / spec.context, spec.build_args, spec.target, store=store, env=environment
    )


def _step_users(ctx: Context) -> None:
    """A task of [[steps]]: each step's verifier's user (``[steps.verifier] user``, else [verifier]'s) as
    ids in the image's root, looked up now, before any agent ran (multistep.TaskSteps sets the step's
    as it begins); a step whose verifier is separate has its own root's."""
    env = ctx.env
    try:
        for number, step in enumerate(ctx.task.steps, 1):
            if step.verifier.separate is not None:
                continue  # its verifier's user is its own root's (_separate_verifiers)
            key = _step_user_key(number, step)
            ctx.steps.users[step.name] = _users(env.mounted, step.request.verifier_user, env.config, key)
    except ImageError as exc:
        raise StepFailed(str(exc), kind=exc.kind) from None
    if any(ctx.steps.users.values()) and not env.users:
        ctx.session.let_image_users_pass(env.folder)


def _step_user_key(number: int, step) -> str:
    return f"task.toml: [[steps]] #{number} ({step.name!r}): [steps.verifier] user"


def _users(mounted, verifier_user: str | None, image_config: dict,
           key: str = "task.toml: [verifier] user") -> dict[str, tuple[int, int]]:  # fmt: skip
    """The uid and gid inside of the verifier (``[verifier] user``, else the image's User, as Harbor
    0.25 runs it) and of the image's User (its entrypoint, its healthcheck), each where it is not
    the agent's user (the map's: the lease). SPEC §23. ``key`` names where ``verifier_user`` is from."""
    image_user = image_config.get("User") or "root"
    ids = {kinds.IMAGE_USER: kinds.user_ids(mounted, image_user)}
    try:
        ids[kinds.VERIFIER_USER] = kinds.user_ids(mounted, verifier_user or image_user)
    except ImageError as exc:
        if verifier_user:
            raise ImageError(f"{key} {verifier_user!r} cannot run in the image: {exc}") from None
        raise
    agent = (mounted.idmap.user, mounted.idmap.group)
    return {name: found for name, found in ids.items() if found != agent}


def _mount(ctx: Context, store, record, workdir: str, folder: Path, agent_user: str | None, user_key: str | None):
    """The image's root for this evaluation in ``folder``, its User (or [agent] user) the evaluation's
    uid (runtime/idmap.py)."""
    config = ctx.config
    ca = ctx.trusted_ca
    return kinds.mount_image(
        store,
        record,
        folder,
        lease=ctx.session.uid,
        id_base=image_id_base(config.image_uid_base, ctx.session.uid, config.sandbox_uid),
        workdir=workdir,
        ca_host=ca.host if ca is not None else None,
        agent_user=agent_user,
        **({"user_key": user_key} if user_key is not None else {}),
    )


def agent_patch(ctx: Context) -> str:
    """For a task without a repository: what the agent changed under WorkingDir, against the image."""
    image = ctx.env
    with rootfs.image_base(image.layers(), ctx.session.root) as base:
        return diff.image_patch(
            rootfs.upper_of(ctx.session.root),
            base,
            image.workdir,
            max_bytes=ctx.config.max_output_bytes * 8,
            exclude=executor_made(ctx),
        )


def system_changes(ctx: Context) -> dict:
    """``{count, paths, suspicious}``: what the agent changed in the image outside its working
    directory and /logs/agent (images/changes.py), the verifier's PATH the image's. Read when no
    process of the agent is alive, before ``isolate``."""
    image = ctx.env
    with rootfs.image_base(image.layers(), ctx.session.root) as base:
        return changes.system_changes(
            rootfs.upper_of(ctx.session.root),
            base,
            image.mounted.idmap,
            workdir=image.workdir,
            exclude=executor_made(ctx),
            path_dirs=tuple(item for item in image.command_path.split(":") if item.startswith("/")),
        )


def isolate(ctx: Context) -> None:
    """``[verifier] isolated``: the image's root becomes the image plus only the agent's working
    directory (images/isolate.py), the host's CAs trusted in it again."""
    ctx.env.isolate()
    _trust_host_ca(ctx, ctx.env.mounted)
    if ctx.services:  # the services' names, in the new root as in the agent's (SPEC §23)
        services.write_hosts(ctx.env.mounted, services.host_names(ctx))


def verifier_commands(ctx: Context, env: dict[str, str], shell: str):
    """``[verifier] isolated``: the absolute path of ``shell`` in the image and ``env`` without what
    names the working directory, decided on the image's layers alone (images/isolate.py, 4-6)."""
    image = ctx.env
    try:
        with rootfs.image_base(image.layers(), ctx.session.root) as base:
            return verifier_commands_in(base, image.workdir, env, shell)
    except ImageError as exc:
        raise StepFailed(str(exc), kind=exc.kind) from None


def executor_made(ctx: Context) -> tuple[str, ...]:
    """What the executor and the sandbox put in the image's root (mount points, the host's CAs),
    relative to the root: not the agent's (/logs/verifier: the mount point of verifier.agent_mounts)."""
    made = ["tmp", "proc", "dev", "sys", "run/term-executor", DISTRIBUTION_CA_BUNDLE, RELAY_TARGET, SANDBOX_SOCKET]
    made += ["logs/verifier", "logs/artifacts"]
    if ctx.task is not None and ctx.task.services:
        made.append("etc/hosts")  # the services' names (pipeline/services.py), as Docker writes it
    if ctx.task is not None:
        made += [volume.target for volume in ctx.task.volumes]  # main's compose volumes' mount points
    made.append(str(ctx.config.workspace_base))
    return tuple(path.strip("/") for path in made)


def _trust_host_ca(ctx: Context, root) -> None:
    ca = ctx.trusted_ca
    if ca is not None:
        kinds.trust_host_ca(root, ca.host)


def _check_programs(ctx: Context) -> None:
    """What the task's commands and the agent need from a root of their own, checked before any runs."""
    language = languages.ALL.get(ctx.evaluation.language)
    needed = {"bash": "the shell of install commands and tests"}
    if language is not None:
        needed.setdefault(language.interpreter, f"the {language.name} agent's interpreter")
    with environment_failure(kind=None):
        ctx.env.check_programs(needed)
    ctx.agent_interpreter = find_interpreter(ctx)  # the executor's, before any folder of the task exists


def _progress(ctx: Context):
    def report(text: str) -> None:
        livelog.append_text(ctx.session.log, text.rstrip("\n") + "\n")
        ctx.check_cancelled()

    return report
