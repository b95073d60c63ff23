"""What a grader is given (grading.base.Sandbox): the tests' sandbox of one evaluation, made of its Context.

The grader decides what runs and reads its result (evaluations/grading/); how a command runs here is
the pipeline's: the task's policy with the tests' network (TEST_NETWORK and the task's [verifier] phase,
the evaluation's proxy switched to that phase as the sandbox is made), the session's tests/ folder
read-only and the static assets' mounts, the environment the step computed; the verifier's own
sandbox, folders and shell are pipeline/verifier.py's.
"""

from __future__ import annotations

from pathlib import Path

from evaluations import livelog
from evaluations.environments import kinds
from evaluations.grading.base import VerifierRun
from evaluations.pipeline import static, verifier
from evaluations.pipeline.context import Context
from evaluations.runtime import CommandResult, Mount, SandboxPolicy
from evaluations.safefs import write_file_nofollow
from evaluations.tasks.spec import TestSpec


def script_policy(ctx: Context, logs: Path | None = None) -> SandboxPolicy:
    """The sandbox of a test script: the task's policy with the tests' network (verifier.verifier_network),
    the session's tests/ folder (made here) read-only, the static assets' mounts, and ``logs`` at
    /logs/verifier if given."""
    tests = ctx.session.tests
    tests.mkdir(mode=0o755, exist_ok=True)
    mounts = [Mount(tests, str(tests), writable=False), *static.mounts(ctx)]
    if logs is not None:
        mounts.append(Mount(logs, verifier.VERIFIER_LOGS, writable=True))
    return ctx.task_policy(network=verifier.verifier_network(ctx), mounts=mounts, user=kinds.VERIFIER_USER)


class GradingSandbox:
    """``grading.base.Sandbox`` over ``ctx``; ``env``: every test command's environment."""

    def __init__(self, ctx: Context, env: dict[str, str], tests: list[TestSpec]):
        self._ctx = ctx
        self._env = env
        self.eval_id = ctx.eval_id
        self.task = ctx.task
        self.tests = tests
        self.max_tests = ctx.config.max_tests
        self.timeout_secs = ctx.config.test_timeout_secs
        verifier.phase_egress(ctx, verifier.VERIFIER)  # the tests' network (SPEC §23), not the agent's

    def log(self, text: str) -> None:
        livelog.append_text(self._ctx.session.log, text)

    def sweep(self) -> None:
        self._ctx.spawner.sweep()

    def reward_folder(self) -> Path:
        return verifier.reward_folder(self._ctx)

    def run_script(
        self, name: str, text: str, *, timeout_secs: float, logs: Path | None = None, stdin_data: bytes | None = None
    ) -> CommandResult:
        ctx = self._ctx
        policy = script_policy(ctx, logs)
        write_file_nofollow(ctx.session.tests, name, text.encode(), 0o644)
        argv = ["bash", str(ctx.session.tests / name)]
        return ctx.run(argv, env=self._env, timeout_secs=timeout_secs, policy=policy, stdin_data=stdin_data)

    def run_verifier(self) -> VerifierRun:
        return verifier.run_verifier(self._ctx, self._env)
