"""The pipeline's side of static assets (SPEC section 6); the rules live in ``assets``.

1. ``prepare`` (end of ``downloading_task``): check the task's group against
   the task folder and the submission's against ``STATIC_ASSETS_ROOT``,
   merge executor < task < submission, and stage them (``assets.view``).
   A bad asset fails the evaluation there, naming it.
2. ``command_env``, ``fill`` and ``fill_tests``: the task ``env``, the
   install commands, test scripts and ``checks.txt`` commands with their
   placeholders replaced; an unknown one fails the step that met it (the
   task ``env`` is met first by ``installing_deps``).
3. ``mounts``: the read-only binds at ``/static/<save_path>`` (sandbox only).
4. ``materialise`` (``running_agent``, before the agent): each asset copied to
   ``repo/<save_path>``, given to the sandbox uid, and excluded from
   ``agent_patch``. The tests get no copy: they read the placeholder path.
"""

from __future__ import annotations

import dataclasses

import assets
from assets.model import resolve_source
from evaluations.models import ErrorKind
from evaluations.pipeline.context import Context, StepFailed
from evaluations.runtime.types import Mount
from evaluations.tasks.spec import TestSpec

STAGING = "static"  # <session>/static


def prepare(ctx: Context) -> None:
    config = ctx.config
    try:
        task_group = assets.resolve(ctx.task.static_assets, ctx.task.root, base_label="the task folder", origin="task")
        submitted = assets.resolve(
            ctx.evaluation.static_assets or {},
            config.static_assets_root,
            base_label="STATIC_ASSETS_ROOT",
            origin="submission",
        )
        executor_group = {a.name: _still_there(a, config.static_assets_root) for a in config.static_assets}
        merged = assets.merge(executor_group, task_group, submitted)
        ctx.static_assets = assets.stage(
            merged,
            ctx.session.root / STAGING,
            isolated=ctx.spawner.runtime.isolated,
            max_bytes=config.disk_quota_bytes,
        )
    except assets.AssetError as exc:
        raise StepFailed(str(exc)) from None


def _still_there(asset: assets.Asset, root) -> assets.Asset:
    """An executor asset was checked at start; its source may have gone or changed since."""
    source, kind = resolve_source(asset.name, asset.path, root, "STATIC_ASSETS_ROOT")
    return dataclasses.replace(asset, source=source, kind=kind)


def view(ctx: Context) -> assets.AssetView:
    if ctx.static_assets is None:  # steps run on their own (tests): no assets
        return assets.AssetView(isolated=ctx.spawner.runtime.isolated, staging=ctx.session.root / STAGING)
    return ctx.static_assets


def fill(ctx: Context, texts: list[str]) -> list[str]:
    """``texts`` with their placeholders replaced; StepFailed names the first unknown one."""
    current = view(ctx)
    try:
        return [current.substitute(text) for text in texts]
    except assets.PlaceholderError as exc:
        # The task's text, whichever step meets it (a test script's in running_tests).
        raise StepFailed(str(exc), kind=ErrorKind.TASK_INVALID) from None


def fill_tests(ctx: Context, tests: list[TestSpec]) -> list[TestSpec]:
    filled = []
    for test in tests:
        if test.script is not None:
            filled.append(dataclasses.replace(test, script=fill(ctx, [test.script])[0]))
        else:
            filled.append(dataclasses.replace(test, command=fill(ctx, [test.command])[0]))
    return filled


def task_env(ctx: Context) -> dict[str, str]:
    """The task's ``env`` with placeholders replaced, then ``STATIC_ASSETS_DIR`` and ``STATIC_ASSET_<NAME>``."""
    names = list(ctx.task.env)
    values = fill(ctx, [ctx.task.env[name] for name in names])
    return {**dict(zip(names, values, strict=True)), **view(ctx).env()}


def mounts(ctx: Context) -> list[Mount]:
    return [Mount(source, target, writable=False) for source, target in view(ctx).binds()]


def materialise(ctx: Context) -> None:
    """Copy every asset into the repository for the agent; keep them out of ``agent_patch``."""
    current = view(ctx)
    budget = ctx.config.disk_quota_bytes
    try:
        with ctx.workdir_handle() as workdir:  # resolved in the image's root, when there is one
            for asset in current.assets:
                budget -= assets.copy_asset(asset, workdir, owner=ctx.workdir_owner(), max_bytes=budget)
                ctx.asset_excludes.append(asset.save_path)
    except assets.AssetError as exc:
        # Before the agent runs, what stands at a save_path is the task's (its base commit, its
        # install step: the agent's install cannot write the repository), the sizes were checked
        # at staging, the sources are the session's staged copies.
        raise StepFailed(str(exc), kind=ErrorKind.TASK_INVALID) from None
