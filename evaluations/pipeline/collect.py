"""Artifacts and the separate verifier (SPEC §23, Harbor's ``ArtifactHandler`` and ``environment_mode =
"separate"``).

1. ``sources`` (after the agent, no process of it alive): what is kept besides /logs/agent's files
   (verifier.after_agent, artifacts.keep_sources): /logs/artifacts (the session's agent-artifacts/,
   bound there for the agent as /logs/agent is), listed as ``artifacts/logs/artifacts/...``, and each
   entry of the task's ``artifacts``, listed as ``artifacts/`` plus its destination or its own path.
   An entry under /logs/agent, /logs/artifacts, /tmp or /var/tmp is read from the session's folder the
   agent saw there, before the tests reset it, never through a link (safefs); any other path in the agent's root through the one resolver (images/inroot.py),
   its links followed only inside that root, the entry itself never: a link the agent left there,
   or anywhere below, is left out. What was kept is capped and listed as /logs/agent's files are.
2. ``enter_separate`` (running_tests, before anything of the verifier's): the separate verifier's
   environment (imageenv._separate_verifiers: the task's, or the running step's) becomes the task's, with its own variables and memory
   limit; the kept copies (the store's, not the agent's files) are written into its root at their
   source paths (``place``), the image's root's, through the same resolver (under /tmp or /var/tmp:
   into the session's tmp/, which its sandbox binds there, after the reset); its /tests is the
   task's (bound by run_verifier) unless its image brings its own (Harbor's bundled tests).
   The agent's root is not touched; nothing else of the agent's reaches the verifier.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from evaluations import artifacts, livelog
from evaluations.images import copyin, inroot
from evaluations.images.errors import ImageError
from evaluations.models import ErrorKind
from evaluations.pipeline.context import Context, StepFailed
from evaluations.safefs import SafeFSError, open_parent, open_root_dir, open_subdir, write_file_nofollow
from evaluations.tasks.compose import MAIN
from evaluations.tasks.spec import AGENT_LOGS, ARTIFACTS_DIR, ARTIFACTS_LISTED

TMP = ("/tmp", "/var/tmp")  # the agent's and the verifier's are the session's tmp/, not their roots'
CONVENTION = (ARTIFACTS_LISTED, *ARTIFACTS_DIR.strip("/").split("/"))  # artifacts/logs/artifacts/...


def sources(ctx: Context) -> list[artifacts.Source]:
    """/logs/agent (its files by their own paths), /logs/artifacts, then the task's entries, in order. For
    a task of [[steps]]: what the earlier steps kept, then the running step's, each listed under its name
    (``<step>/...``, as a task of one step lists its own; its entries the task's then its own)."""
    uid = ctx.session.uid
    step = () if ctx.steps is None else (ctx.steps.current.name,)
    found = []
    if step and ctx.steps.outcomes:  # in the store: kept after each earlier step's agent (the copies, read back)
        found.append(artifacts.Source.folder(artifacts.kept_folder(ctx.eval_id, ctx.config), None, "the earlier steps"))
    found += [
        artifacts.Source.folder(agent_logs(ctx), uid, listed=step),
        artifacts.Source.folder(
            agent_artifacts(ctx), uid, ARTIFACTS_DIR, listed=(*step, *CONVENTION), placed_at=ARTIFACTS_DIR
        ),  # fmt: skip
    ]
    for entry in ctx.task.artifacts:
        opener, owner = _opener(ctx, entry.source, entry.service)
        listed = (*step, *entry.listed.split("/"))
        found.append(artifacts.Source(entry.source, listed, opener, owner, placed_at=entry.source,
                                      exclude=entry.exclude))  # fmt: skip
    return found


def agent_logs(ctx: Context) -> Path:
    """The session's folder at /logs/agent: agent-logs/, or for a task of [[steps]] agent-logs/<step>/,
    new for each step (Harbor empties /logs/agent before each step's agent)."""
    return _for_step(ctx, ctx.session.agent_logs)


def agent_artifacts(ctx: Context) -> Path:
    """The session's folder at /logs/artifacts: agent-artifacts/, or for a task of [[steps]]
    agent-artifacts/<step>/, new for each step (Harbor moves its contents to steps/<name>/artifacts/
    after each step)."""
    return _for_step(ctx, ctx.session.agent_artifacts)


def agent_folders(ctx: Context) -> tuple[Path, Path]:
    """``agent_logs`` and ``agent_artifacts`` (the folders at /logs/agent and /logs/artifacts), made if
    missing (with their step's parent), the sandbox uid's: main's agent, and a compose service's user,
    write them (the root's user in every map)."""
    logs, artifacts_folder = agent_logs(ctx), agent_artifacts(ctx)
    for made in (ctx.session.agent_logs, logs, ctx.session.agent_artifacts, artifacts_folder):
        if not made.exists():
            ctx.session.make_folder(made, 0o755, owner=ctx.session.uid_owner)
    return logs, artifacts_folder


def _for_step(ctx: Context, folder: Path) -> Path:
    return folder if ctx.steps is None else folder / ctx.steps.current.name


def _opener(ctx: Context, path: str, service: str = MAIN):
    """How to reach ``path`` after the agent (the folder holding it, and its name), and whose its files
    must be; ``service``: a compose service's root, read alike (its ids the evaluation's too)."""
    if service != MAIN:
        service_root = ctx.services[service].environment.root
        return (lambda: _in_root(service_root, path)), None
    session = ctx.session
    # The session's own folders the agent saw at these paths (its /tmp and /var/tmp: runtime/sandbox.py)
    bound = ((agent_logs(ctx), AGENT_LOGS), (agent_artifacts(ctx), ARTIFACTS_DIR),
             *((session.tmp, inside) for inside in TMP))  # fmt: skip
    for folder, inside in bound:
        if path == inside or path.startswith(inside + "/"):
            parts = [part for part in path[len(inside) :].split("/") if part]
            return (lambda folder=folder, parts=parts: _in_folder(folder, parts)), ctx.session.uid
    root = ctx.env.root
    return (lambda: _in_root(root, path)), None  # an image's root: every id in it is the evaluation's


def _in_folder(folder, parts: list[str]) -> tuple[int, str]:
    if not parts:
        return open_root_dir(folder.parent), folder.name
    fd = open_root_dir(folder)
    try:
        return open_subdir(fd, parts[:-1], create=False), parts[-1]
    finally:
        os.close(fd)


def _in_root(root, path: str) -> tuple[int, str]:
    root_fd = inroot.open_root(root)
    try:
        return inroot.parent_and_name(root_fd, path)
    finally:
        os.close(root_fd)


def enter_separate(ctx: Context) -> None:
    """A separate verifier's environment becomes the task's, the kept artifacts placed in it."""
    env = ctx.verifier_env
    if env is None:
        return
    separate = ctx.task.verifier.separate
    ctx.env = env
    ctx.task = dataclasses.replace(ctx.task, env=separate.env)  # its environment's variables, not the agent's
    if ctx.verifier_memory_mb is not None:
        ctx.config = dataclasses.replace(ctx.config, memory_limit_mb=ctx.verifier_memory_mb)
    try:
        placed = place(ctx)
    except (OSError, ImageError) as exc:
        raise StepFailed(
            f"could not copy the artifacts into the verifier: {exc}", kind=ErrorKind.INFRASTRUCTURE
        ) from None
    if placed:
        livelog.append_text(ctx.session.log, livelog.executor_line(
            f"artifacts: copied {placed} file{'' if placed == 1 else 's'} into the verifier's environment"))  # fmt: skip
    if separate.bundled and not _has_script(env, ctx.task.verifier.script):
        raise StepFailed(
            f"the verifier's image {separate.environment.ref} has no /tests/{ctx.task.verifier.script}: a tests/Dockerfile "
            "or [verifier.environment] docker_image brings its own tests (Harbor uploads none then)",
            kind=ErrorKind.TASK_INVALID,
        )


def place(ctx: Context) -> int:
    """Each kept artifact with a place (ctx.placed) written at it in the verifier's root, from the
    store's copy; the folders on the way made as the image's root's (0755), what stood at the name
    replaced (a later artifact's file wins, as Harbor's upload). How many were written."""
    env = ctx.verifier_env
    idmap = env.mounted.idmap
    count, failed = 0, []
    root_fd = inroot.open_root(env.root)
    try:
        os.close(copyin.mkdirs(root_fd, ARTIFACTS_DIR, 0, 0, idmap))  # there, empty or not, as Harbor uploads it
        for listed, placement in sorted(ctx.placed.items(), key=lambda item: item[1].path):
            try:
                _write(ctx, root_fd, listed, placement, idmap)
                count += 1
            except (ImageError, SafeFSError) as exc:  # its folder is a file there: another artifact's
                failed.append(f"{placement.path} ({exc})")
    finally:
        os.close(root_fd)
    if failed:
        livelog.append_text(ctx.session.log, livelog.executor_line(
            f"artifacts: not copied into the verifier's environment: {'; '.join(failed[:20])}"))  # fmt: skip
    return count


def _write(ctx: Context, root_fd: int, listed: str, placement, idmap) -> None:
    for inside in TMP:  # the verifier's /tmp is the session's (reset for the tests), bound over its root's
        if placement.path.startswith(inside + "/"):
            relpath = placement.path[len(inside) + 1 :]
            with artifacts.open_artifact(ctx.eval_id, listed, ctx.config) as kept:
                data = kept.read()  # within MAX_ARTIFACT_BYTES
            write_file_nofollow(ctx.session.tmp, relpath, data, placement.mode)
            folder_fd, name = open_parent(ctx.session.tmp, relpath, create=False)
            try:  # the evaluation's, as what its commands write there: the image's root's inside
                os.chown(name, ctx.session.uid, ctx.session.uid, dir_fd=folder_fd, follow_symlinks=False)
            finally:
                os.close(folder_fd)
            return
    with artifacts.open_artifact(ctx.eval_id, listed, ctx.config) as kept:
        st = os.fstat(kept.fileno())
        copyin.put_file(root_fd, placement.path, kept, st.st_size, idmap, placement.mode, st.st_mtime_ns)


def _has_script(env, script: str) -> bool:
    root_fd = inroot.open_root(env.root)
    try:
        return inroot.read_in(root_fd, f"/tests/{script}", 1) is not None
    finally:
        os.close(root_fd)
