"""The pipeline's steps, in order; each a function with one job, named as its API `step`."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import logging
import os
import posixpath
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from evaluations import languages, lifecycle, livelog
from evaluations.environments import kinds
from evaluations.grading import registry
from evaluations.grading.base import HostFault
from evaluations.images import copyin, inroot
from evaluations.images.errors import ImageError
from evaluations.models import ErrorKind
from evaluations.network import urlguard
from evaluations.pipeline import (
    archive,
    boundfolder,
    collect,
    gitrepo,
    grading_sandbox,
    imageenv,
    outcome,
    patch,
    services,
    static,
    verifier,
)
from evaluations.pipeline.agentenv import agent_argv, installing_agent, task_env_for_agent
from evaluations.pipeline.agentpatch import PATCH_PHASE, AgentPatch
from evaluations.pipeline.context import (
    Cancelled,
    Context,
    StepFailed,
    deadline_in,
    last_line,
    limit_failure,
    remaining,
)
from evaluations.pipeline.grading_sandbox import GradingSandbox
from evaluations.pipeline.imageenv import preparing_environment
from evaluations.pipeline.multistep import TaskSteps
from evaluations.runtime import Limit, Mount, SandboxPolicy, sandbox
from evaluations.safefs import SafeFSError, clear_way, open_parent, write_file_nofollow
from evaluations.tasks.language import NoToolchain, with_toolchain
from evaluations.tasks.registry import load_task
from evaluations.tasks.spec import SETUP_SCRIPT, TaskError, TaskStep

log = logging.getLogger(__name__)

AGENT_PHASE = "agent"  # the agent's command: a sandbox of its own, prestarted (_prestart_agent)
TESTS_PHASE = "tests"


def _policy(config) -> urlguard.URLPolicy:
    return urlguard.URLPolicy.from_config(config)


def downloading_task(ctx: Context) -> None:
    config = ctx.config
    archive_path = ctx.session.root / "task.archive"
    try:
        urlguard.fetch(
            ctx.evaluation.task_url,
            archive_path,
            max_bytes=config.max_task_archive_bytes,
            timeout_secs=config.download_timeout_secs,
            policy=_policy(config),
        )
        # SPEC §18: what was evaluated, signed with the result; staged now, so a failed extraction's has it too.
        with open(archive_path, "rb") as downloaded:
            task_sha256 = hashlib.file_digest(downloaded, "sha256").hexdigest()
        ctx.stage(task_sha256=task_sha256)
        archive.extract_archive(
            archive_path,
            ctx.session.task,
            max_members=config.max_archive_members,
            max_bytes=config.max_extracted_bytes,
        )
        root = archive.find_task_root(ctx.session.task)
        ctx.task = load_task(
            root,
            allow_file_urls=config.allow_file_urls,
            max_prompt_bytes=config.max_prompt_bytes,
            max_tests=config.max_tests,
        )
    except (urlguard.FetchError, archive.ArchiveError) as exc:
        raise StepFailed(str(exc), kind=outcome.of_fetch(exc)) from None
    except TaskError as exc:
        raise StepFailed(str(exc)) from None
    finally:
        archive_path.unlink(missing_ok=True)
    ctx.stage(task_prompt=ctx.task.prompt, original_pr=ctx.task.original_pr or "")
    operator = ctx.config
    verifier.apply_request(ctx)  # SPEC §17: the task's limits, capped by the operator's
    if ctx.task.steps:  # SPEC §23: each step's request capped by the operator's, as the task's (multistep.py)
        timeout = ctx.evaluation.timeout_secs
        ctx.steps = TaskSteps(
            ctx.task,
            [verifier.capped_config(operator, s.request, timeout) for s in ctx.task.steps],
            [verifier.separate_memory(operator, s.verifier.separate) for s in ctx.task.steps],
        )
    try:  # SPEC §19: the toolchain of the task's language, before anything is cloned
        ctx.task = with_toolchain(ctx.task, config, ctx.command_path)
    except NoToolchain as exc:
        raise StepFailed(str(exc), kind=ErrorKind.INFRASTRUCTURE) from None
    static.prepare(ctx)  # the three asset groups checked, merged and staged
    # The first command's launcher, joining the evaluation's cgroups (made while the task downloaded)
    # while the environment and the repository are made ready: off that command's path.
    ctx.spawner.hold_launch()


def cloning_repo(ctx: Context) -> None:
    if ctx.task.repo is None:  # SPEC §16: the image's WorkingDir is the workspace; nothing to clone or cache
        ctx.cache.clone(ctx, ctx.task, lambda: None, None)  # recorded as "off"
        boundfolder.fill_workdir(ctx)  # SPEC §22: a compose volume of the task's folder, as the agent finds it
        return
    policy = ctx.egress.policy if ctx.egress is not None else None
    try:
        _clone(ctx)
    finally:
        if ctx.egress is not None:
            ctx.egress.policy = policy  # what the clone was let reach, the task's commands are not
    try:  # before any command of the task or the agent: the base's objects as cloned, root's (issue 23)
        patch.keep_base_objects(ctx.session.repo, ctx.session.base_objects)
    except (OSError, SafeFSError) as exc:
        raise StepFailed(f"could not keep the base's git objects: {exc}", kind=ErrorKind.INFRASTRUCTURE) from None


def _clone(ctx: Context) -> None:
    config = ctx.config
    task = ctx.task
    try:
        resolved = urlguard.check_git_url(
            task.repo,
            allow_file=config.allow_file_urls,
            allow_private=config.allow_private_urls,
            allowed_private_hosts=config.allowed_private_hosts,
        )
        pin = urlguard.git_resolve_pin(resolved)  # git connects to the address we checked
        if ctx.egress is not None:  # the proxy lets git reach exactly what the URL guard allowed
            ctx.egress.policy = ctx.egress.policy.allowing(resolved.addresses, resolved.port, "the task's repository")
        cached = ctx.cache.clone(ctx, task, lambda: _cache_material(ctx), pin)
        if cached is not None:  # SPEC §13: from a snapshot, or fetched from the mirror
            ctx.base_sha = cached
            return
        ctx.base_sha = gitrepo.clone_at(
            ctx.command_runner(ctx.executor_policy(network=True)),
            repo_url=task.repo,
            base_commit=task.base_commit,
            dest=ctx.session.repo,
            env=ctx.repository_env(),
            timeout_secs=config.clone_timeout_secs,
            resolve_pin=pin,
        )
    except (urlguard.FetchError, gitrepo.GitError) as exc:
        ctx.check_cancelled()
        raise StepFailed(str(exc), kind=outcome.of_git(exc)) from None


def _cache_material(ctx: Context) -> dict | None:
    """What the install step's result depends on, besides the commit (SPEC §13); None: no cache.

    None for a bad placeholder, and for an image task with install commands: they write the image's
    writable layer (apt, pip: no venv of ours there, §21), which an entry does not keep.
    """
    if ctx.task.install and not ctx.env.install_kept:
        return None
    session = str(ctx.session.root)

    def general(text: str) -> str:  # without the sandbox, asset paths are in the session: rewritten on restore
        return text.replace(session, "<session>")

    try:
        view = static.view(ctx)
        return {
            "repo": ctx.task.repo,
            "install": [general(command) for command in static.fill(ctx, ctx.task.install)],
            "env": {name: general(value) for name, value in static.task_env(ctx).items()},
            "environment": ctx.env.cache_key(),
            "assets": [[a.name, a.save_path, a.kind, _digest(view.host_path(a))] for a in view.assets],
            # Paths the install step may have written into files, and what its commands ran with.
            "workspace_base": str(ctx.config.workspace_base),
            "command_path": ctx.command_path,
            "sandboxed": ctx.runtime.isolated,
        }
    except StepFailed:
        return None  # installing_deps reports it as before


def _digest(path: Path) -> str:
    """A static asset's content, as a digest (its staged copy's mtime changes every evaluation)."""
    digest = hashlib.sha256()
    if path.is_file():
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    for folder, subdirs, files in os.walk(path):
        subdirs.sort()
        for name in sorted(files):
            child = Path(folder) / name
            digest.update(os.fsencode(child.relative_to(path)) + b"\0")
            if child.is_symlink():
                digest.update(b"link:" + os.fsencode(os.readlink(child)))
            elif child.is_file():
                digest.update(_digest(child).encode())
    return digest.hexdigest()


def installing_deps(ctx: Context) -> None:
    config = ctx.config
    services.starting_environment(ctx)  # SPEC §23: the image's first process, its healthcheck, before all else
    if ctx.cache.restore():  # a hit: the venv and HOME the install step left, from the snapshot
        _prestart_agent(ctx)
        return
    deadline = deadline_in(config.install_timeout_secs)
    ctx.env.make_venv()  # SPEC §11; an image task runs with the image's own python (§21)
    env = {**ctx.base_env(), **static.task_env(ctx)}
    policy = ctx.task_policy(network=True, mounts=static.mounts(ctx), loopback=True)
    with ctx.phase("install"):  # the task's install commands: one sandbox (SPEC §25)
        for command, filled in zip(ctx.task.install, static.fill(ctx, ctx.task.install), strict=True):
            result = ctx.run(["bash", "-c", filled], env=env, timeout_secs=remaining(deadline), policy=policy)
            failure = limit_failure(
                result, f"install command {command!r}", "INSTALL_TIMEOUT_SECS", config.install_timeout_secs
            )
            if failure:
                raise failure
            if result.exit_code != 0:
                raise StepFailed(
                    f"install command {command!r} exited with code {result.exit_code}: {last_line(result.output)}"
                )
    ctx.spawner.sweep()
    try:
        ctx.cache.keep()  # stored when this evaluation builds the snapshot; the tests get HOME back as it is now
    except OSError as exc:
        raise StepFailed(
            f"could not keep the install step's HOME for the tests: {exc}", kind=ErrorKind.INFRASTRUCTURE
        ) from None
    _prestart_agent(ctx)


def _prestart_agent(ctx: Context) -> None:
    """The agent's sandbox started now (SPEC §25), so that its bubblewrap, its init and its relay
    start while the agent's install and the agent step's own work go on: once the task's install
    commands are done (nothing of the task's runs between its start and the agent's), with the policy
    the agent will run with (``ctx.agent_policy``), made once: ``verifier.agent_mounts`` makes the
    agent's /logs/verifier afresh. Not for a task of [[steps]] (each step's agent has its own folders).
    Earlier would save a few ms more and change what the task's install commands find in the image
    (the agent's mount points) and the network namespace the agent joins (``starting_environment``)."""
    if ctx.steps is not None:
        return
    ctx.agent_policy = _agent_policy(ctx)
    if ctx.spawner.can_share(ctx.agent_policy):
        ctx.prestart(AGENT_PHASE, ctx.agent_policy, Path(ctx.workdir))


def _agent_policy(ctx: Context) -> SandboxPolicy:
    agent_folder = Mount(ctx.session.agent, str(ctx.session.agent), writable=False)
    mounts = [agent_folder, *static.mounts(ctx), *verifier.agent_mounts(ctx)]  # in an image, /logs/agent
    return ctx.task_policy(network=verifier.agent_network(ctx), mounts=mounts, loopback=True)


def running_agent(ctx: Context) -> None:
    config = ctx.config
    evaluation = ctx.evaluation
    language = languages.ALL.get(evaluation.language)
    if language is None or ctx.agent_interpreter is None:
        raise StepFailed(f"agent language {evaluation.language!r} is not installed on this executor")
    prompt = ctx.task.prompt  # fits one argument: load_task held prompt.md to MAX_INSTRUCTION_BYTES
    prompt_file = ctx.session.agent / "prompt.md"
    # agent/ is root's (no command can plant a link there); written without following one anyway.
    if evaluation.agent_archive_id is None:  # an agent project is in agent/code (installing_agent)
        name = f"agent.{language.extension}"
        write_file_nofollow(ctx.session.agent, name, evaluation.agent_code.encode(), 0o644)
    write_file_nofollow(ctx.session.agent, prompt_file.name, prompt.encode(), 0o644)
    env = {
        **ctx.base_env(),
        **task_env_for_agent(ctx),
        **evaluation.env,  # the agent's own (its secrets): its process tree alone gets them
        "TASK_PROMPT": str(prompt_file),
        "REPO_DIR": ctx.workdir,
        "TASK_ID": ctx.eval_id,
        **(ctx.steps.agent_env() if ctx.steps is not None else {}),  # SPEC §23: TASK_STEP
    }
    static.materialise(ctx)  # the agent's own copy of each asset, in repo/<save_path>
    # The request's own, within AGENT_TIMEOUT_SECS and what the task asked for (verifier.apply_request).
    timeout = min(evaluation.timeout_secs or config.agent_timeout_secs, config.agent_timeout_secs)
    policy, ctx.agent_policy = ctx.agent_policy or _agent_policy(ctx), None  # the prestarted sandbox's
    verifier.phase_egress(ctx, verifier.AGENT)  # the agent's network (SPEC §23), from here on
    agent_patch = AgentPatch(ctx)
    try:
        _run_agent(ctx, agent_argv(ctx, language, prompt), env, timeout, policy, agent_patch)
    except BaseException:
        agent_patch.take()  # one started beside tests that will not run: awaited (a cancel ends it)
        raise
    finally:
        if not agent_patch.pending:  # else made beside the tests, taken at their end
            ctx.spawner.end_prestart(PATCH_PHASE)  # one the patch did not take: the agent failed
            agent_patch.remove()  # the base's reading the patch did not take


def _run_agent(
    ctx: Context, argv: list[str], env: dict[str, str], timeout: int, policy: SandboxPolicy, agent_patch: AgentPatch
) -> None:
    def meanwhile() -> None:
        agent_patch.start()
        _ready_for_tests(ctx)

    with ctx.phase(AGENT_PHASE):  # its own sandbox, ended (every process of it gone) before what follows
        result = ctx.run(argv, env=env, timeout_secs=timeout, policy=policy, meanwhile=meanwhile)
    output = ctx.steps.agent_output(result.output) if ctx.steps is not None else result.output
    produced = {"agent_output": output, "agent_exit_code": result.exit_code}
    failure = None
    try:
        ctx.spawner.sweep()  # the agent's daemons die here, before anything is graded
        if result.limit is Limit.TIMEOUT:  # SPEC §3: cancelled, and the tests do not run
            failure = Cancelled(f"agent timed out after {timeout} s", kind=ErrorKind.AGENT_TIMEOUT)
        elif result.limit is not None:
            failure = StepFailed(result.limit_detail, kind=ErrorKind.LIMIT_EXCEEDED)
        elif ctx.task.repo is None:
            produced["agent_patch"] = imageenv.agent_patch(ctx)  # the changes under WorkingDir, against the image
        else:
            ahead = _TestsAhead(ctx)  # HOME and /tmp reset, the tests' sandbox started, while the patch is made
            if not agent_patch.beside(tests_shared=ahead.shared, ahead=ahead):  # agentpatch.py
                produced["agent_patch"] = agent_patch.now(meanwhile=ahead)
                ahead()  # if the patch ran no command
    finally:  # the output whatever happened, and the patch when there is one
        ctx.stage(**produced)
    services.collect(ctx)  # SPEC §23: [[verifier.collect]], in their services, before the artifacts are read
    try:
        verifier.after_agent(ctx)  # in an image: system_changes and artifacts, whatever the agent's end
    except (OSError, SafeFSError) as exc:
        raise StepFailed(f"could not read what the agent left: {exc}", kind=ErrorKind.INFRASTRUCTURE) from None
    if failure is not None:
        raise failure


class _TestsAhead:
    """After the agent's end, while its patch is made (SPEC §25): HOME and /tmp reset for the tests,
    and their sandbox prestarted with the policy of their scripts. The patch reads only the
    repository and its own scratch folder, with a HOME and /tmp of its own, so the reset can go on
    while the patch's first git script runs (``Spawner.run``'s ``meanwhile``), or while the whole
    patch runs beside the tests (agentpatch.py), and the tests' sandbox starts meanwhile. Made
    before the patch: the scrub, which kills the sandbox uid's processes (the patch's git among
    them), is done then. Called once (the second call does nothing). Only where the tests' sandbox
    can be shared; a reset that fails is left to running_tests to redo and report."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        policy = grading_sandbox.script_policy(ctx)  # made again when called (the view bound by then)
        self.shared = policy.image is None and ctx.spawner.can_share(policy)
        if not self.shared:  # in an image, what the agent left (/logs/agent, artifacts) is read after its patch
            return
        try:
            _scrub(ctx)
        except StepFailed:
            self.shared = False

    def __call__(self) -> None:
        ctx, shared, self.shared = self.ctx, self.shared, False
        if not shared:
            return
        try:
            _reset_for_tests(ctx, scrub=False)
        except StepFailed:
            return
        ctx.reset_for_tests = True
        # Made again: with the tests' view of the repository bound, if the patch runs beside them.
        ctx.prestart(TESTS_PHASE, grading_sandbox.script_policy(ctx), Path(ctx.workdir))


def _ready_for_tests(ctx: Context) -> None:
    """While the agent's command runs (once the patch's sandbox is launched): what the tests' reset
    puts in place made now, so that the reset after the agent's end only swaps it in
    (``_reset_for_tests``): the workspace cache's HOME and venv as overlays attached nowhere
    (warm.py ``prepare_reset``), and an empty /tmp with the mount points of the tests' sandbox, a
    folder of root's until the reset gives it to the evaluation's uid (``Session.prepare_tmp``).
    The agent's sandbox binds none of it (none of it is below a folder the agent has). Only in the
    host's environment, where the reset is the executor's own; what cannot be made here the reset
    makes, as before, and reports (nothing here may end the agent's command)."""
    if ctx.task.repo is None or ctx.steps is not None or not ctx.runtime.isolated or os.geteuid() != 0:
        return
    try:
        policy = grading_sandbox.script_policy(ctx)
        if policy.image is not None:
            return
        ctx.cache.prepare_reset()
        if not _shares_tmp(ctx):
            tmp = ctx.session.prepare_tmp()
            sandbox.prepare_mount_points(dataclasses.replace(policy, private_tmp=tmp))
    except Exception as exc:  # made (or refused, and reported) after the agent's end instead
        log.info("the tests' HOME, venv or /tmp are made after the agent's end: %s", exc)


def _scrub(ctx: Context) -> None:
    """Without the sandbox: what the agent left in the host's /tmp, /dev/shm (Spawner.scrub)."""
    with _resetting():
        ctx.spawner.scrub()


def _reset_for_tests(ctx: Context, *, scrub: bool = True) -> None:
    if scrub:
        _scrub(ctx)
    with _resetting():
        ctx.cache.reset()  # no usercustomize, .pth or .gitconfig the agent planted
        if not _shares_tmp(ctx):
            ctx.session.reset_tmp()


@contextlib.contextmanager
def _resetting() -> Iterator[None]:
    try:
        yield
    except OSError as exc:  # the walks neither follow nor stop at what the agent made: the host's fault
        raise StepFailed(f"could not reset HOME and /tmp for the tests: {exc}", kind=ErrorKind.INFRASTRUCTURE) from None


def _shares_tmp(ctx: Context) -> bool:
    """A Harbor or Terminal-Bench verifier on the agent's image (shared, not isolated) runs where Harbor's
    and Terminal-Bench's run it, in the agent's container: its /tmp is the agent's, as the agent left it
    (a task's tests may read what the agent wrote there). Every other verifier gets an empty one."""
    verifier = ctx.task.verifier
    return bool(ctx.env.agent_logs and verifier is not None and verifier.separate is None and not verifier.isolated)


def running_tests(ctx: Context) -> None:
    try:
        _run_tests(ctx)
    finally:
        if ctx.take_patch is not None:  # made beside the tests (agentpatch.py): staged with their end
            ctx.take_patch()


def _run_tests(ctx: Context) -> None:
    grader = registry.for_task(ctx.task)  # what runs and how it is read (evaluations/grading/)
    tests = static.fill_tests(ctx, ctx.task.tests)
    if not tests and grader.needs_tests(ctx.task):
        raise StepFailed("task defines no tests", kind=ErrorKind.TASK_INVALID)
    ctx.spawner.sweep()
    if not ctx.reset_for_tests:  # else done while the patch was made, the tests' sandbox started then (_TestsAhead)
        _reset_for_tests(ctx)
    collect.enter_separate(ctx)  # SPEC §23: a separate verifier's environment, the artifacts copied in
    try:
        # The task's file wins over whatever the agent left at its path (a folder, a link, a
        # FIFO, a file where a folder goes), as it does over a regular file: the tests run with
        # the task's files and judge the rest. Written from a handle of the working directory
        # (resolved in the image's root), name by name, never through a link (context.py).
        with ctx.workdir_handle() as workdir:
            for support in ctx.task.support_files:
                clear_way(workdir, support.relpath)
                write_file_nofollow(workdir, support.relpath, support.data, support.mode)
                _chown(ctx, workdir, support.relpath)
    except (SafeFSError, OSError) as exc:  # what is left: the host (a full disk)
        raise StepFailed(f"could not write test support files: {exc}", kind=ErrorKind.INFRASTRUCTURE) from None
    env = {**ctx.base_env(), **static.task_env(ctx)}
    try:
        with ctx.phase(TESTS_PHASE):  # the tests' commands: one sandbox (SPEC §25), never the agent's
            ctx.grade = grader.run(GradingSandbox(ctx, env, tests))
    except HostFault as exc:
        raise StepFailed(str(exc), kind=ErrorKind.INFRASTRUCTURE) from None
    # Committed now, not staged (SPEC §25): the verdict (run._verdict) and finish's results hash read the
    # rows back, and an event stream sends them as they commit, before the cleanup step's event.
    results, stored = ctx.steps.stored(ctx.grade) if ctx.steps is not None else (ctx.grade.results, ctx.grade.stored())
    lifecycle.store_test_results(ctx.eval_id, results, **stored)


def _chown(ctx: Context, workdir: int, relpath: str) -> None:
    owner = ctx.workdir_owner()
    if owner is not None:
        folder, name = open_parent(workdir, relpath, create=False)
        try:
            os.chown(name, owner, owner, dir_fd=folder, follow_symlinks=False)
        finally:
            os.close(folder)


# -- a task step's own environment, before its agent (SPEC §23, Harbor's MultiStepTrial._prepare_step) -----


def preparing_step(ctx: Context, step: TaskStep) -> str:
    """As Harbor 0.25 readies the environment for a step, as the agent's user: steps/<name>/workdir/'s
    files copied into WorkingDir, its setup.sh run there (``bash setup.sh``), then the step's own
    healthcheck. "" when all passed; else why not (the step then gives no reward and the rest do not
    run, as Harbor's step exception). A fault of the host's still ends the evaluation."""
    if step.workdir_files:
        _stage_workdir(ctx, step)
    if step.setup:
        error = _run_setup(ctx, step)
        if error:
            return error
    if step.healthcheck is not None:
        env = {**ctx.base_env(), **static.task_env(ctx)}
        policy = ctx.task_policy(network=False, user=kinds.AGENT_USER)  # Harbor: the step's default user
        try:
            services.await_healthy(ctx, step.healthcheck, env, policy=policy, who="the step's environment")
        except StepFailed as exc:
            if exc.kind is not ErrorKind.TASK_INVALID:
                raise
            return str(exc)
    return ""


def _stage_workdir(ctx: Context, step: TaskStep) -> None:
    """Harbor's ``upload_dir`` (``docker compose cp``) into the working directory: each file written in
    the image's root through the one in-root resolver (images/inroot.py, copyin.py), owned by the image's
    root as docker cp leaves them, what stood at its name replaced; the folders on the way made as root's."""
    env = ctx.env
    try:
        root_fd = inroot.open_root(env.root)
        try:
            for file in step.workdir_files:
                path = posixpath.join(env.working_dir, file.relpath)
                copyin.put_file(root_fd, path, io.BytesIO(file.data), len(file.data), env.mounted.idmap, file.mode,
                                time.time_ns())  # fmt: skip
        finally:
            os.close(root_fd)
    except (ImageError, SafeFSError) as exc:  # what the image or an earlier step left on the way (Harbor's cp fails)
        raise StepFailed(
            f"step {step.name!r}: could not copy steps/{step.name}/workdir/ into {env.working_dir}: {exc}",
            kind=ErrorKind.TASK_INVALID,
        ) from None
    except OSError as exc:  # the host's (a full disk)
        raise StepFailed(
            f"step {step.name!r}: could not copy steps/{step.name}/workdir/ into {env.working_dir}: {exc}",
            kind=ErrorKind.INFRASTRUCTURE,
        ) from None


def _run_setup(ctx: Context, step: TaskStep) -> str:
    """``bash setup.sh`` in WorkingDir as the agent's user, with the agent's network, within the step's agent
    timeout (Harbor's has none); a non-zero exit or a timeout is the step's failure."""
    verifier.phase_egress(ctx, verifier.AGENT)
    env = {**ctx.base_env(), **static.task_env(ctx)}
    policy = ctx.task_policy(network=verifier.agent_network(ctx), mounts=static.mounts(ctx))
    timeout = ctx.config.agent_timeout_secs
    script = posixpath.join(ctx.env.working_dir, SETUP_SCRIPT)
    livelog.append_text(ctx.session.log, livelog.executor_line(f"step {step.name!r}: bash {script}"))
    with ctx.phase("setup"):
        result = ctx.run(["bash", script], env=env, timeout_secs=timeout, policy=policy)
    ctx.spawner.sweep()
    if result.output.strip():
        livelog.append_text(
            ctx.session.log, livelog.unmarked(result.output[-services.COLLECT_LOG_BYTES :].rstrip("\n") + "\n")
        )
    if result.limit is Limit.TIMEOUT:
        return f"setup.sh timed out after {timeout} s"
    if result.limit is not None:
        raise StepFailed(f"{result.limit_detail} in step {step.name!r}'s setup.sh", kind=ErrorKind.LIMIT_EXCEEDED)
    if result.exit_code != 0:
        return f"setup.sh exited with code {result.exit_code}: {last_line(result.output)}"
    return ""


def in_order(ctx: Context) -> Iterator[tuple[str, Callable[[Context], None]]]:
    """STEPS in order; for a task of [[steps]] (SPEC §23), running_agent and running_tests once for each
    of its steps, in order, until one stops the rest (pipeline/multistep.py). Lazy: whether the task
    has steps is known once downloading_task has read it."""
    for name, step in STEPS:
        if name == "running_agent" and ctx.steps is not None:
            yield from ctx.steps.rounds(running_agent, running_tests, preparing_step)
            return
        yield name, step


STEPS = (
    ("downloading_task", downloading_task),
    ("preparing_environment", preparing_environment),  # pipeline/imageenv.py
    ("cloning_repo", cloning_repo),
    ("installing_deps", installing_deps),
    ("installing_agent", installing_agent),  # pipeline/agentenv.py
    ("running_agent", running_agent),
    ("running_tests", running_tests),
)
