"""A Harbor task's ``[[steps]]`` through the pipeline (SPEC §23), as Harbor 0.25's ``MultiStepTrial`` runs
them (``harbor/trial/multi_step.py``): one environment; each step's agent, then that step's verifier, in
order.

1. ``TaskSteps.rounds`` gives the steps ``running_agent`` and ``running_tests`` of each task step, in
   order (steps.in_order puts them where a task of one step has its own): each a transition of the
   evaluation (lifecycle writes them, as for every step), the step named in the live log. Before its
   agent, the task the pipeline sees is the step's (its prompt, verifier, timeouts and networks) and
   the Config the operator's capped by the step's request (verifier.capped_config), the verifier's user
   the step's (``users``, looked up by imageenv), its artifacts the task's then its own, the environment
   the agent's (``agents_env``, kept at the first step: a separate verifier's was the task's since) and the
   verifier's the step's separate one, if any (``separate``: each prepared by imageenv in a root of its
   own, fresh, used once; the artifacts copied in as its tests begin, collect.enter_separate). Then, before the
   agent, the step's environment is readied (``preparing``: steps.preparing_step, its workdir/, setup.sh
   and healthcheck); when that fails the step gives no reward, neither its agent nor its verifier runs
   and the rest do not run (Harbor's step exception in ``_prepare_step``).
2. Between steps nothing of the environment is reset but what a single step resets too: the agent's
   processes are gone before each verifier (running_agent's sweep), /logs/verifier is made empty for each
   verifier, /logs/agent and /logs/artifacts are new folders for each agent (collect.agent_logs, each
   step's artifacts kept under its name); /tmp is treated before each
   verifier as before the one of a task of one step (steps._shares_tmp).
3. After a step's verifier: its outcome (``{name, reward, rewards, passed, duration_ms}``, staged as the
   evaluation's ``steps``). The rest do not run (Harbor's ``_should_stop_after_step``) when the verifier
   gave no reward (none written, unreadable, timed out: Harbor's verifier raised) or when ``min_reward``
   is not met (a number gates the ``reward`` key, a table each of its keys; a key missing counts as
   -inf). The agent's timeout ends the evaluation, as for a task of one step (SPEC §3).
4. The task's reward (Harbor's ``_select_multi_step_reward``): ``mean``, per key the mean over the steps
   that gave a reward (a key a step lacks counts 0), or ``final``, the last step run's rewards as they
   are; ``reward`` is the ``reward`` key, else the only key, else the mean of the steps' headlines.
   ``passed``: that reward is at least 1, as a task of one step; a step whose verifier gave no reward
   fails the evaluation (``tests_failed``, naming the step), as SPEC §17 fails a missing reward.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator

from evaluations import livelog
from evaluations.grading.base import Grade, Verdict
from evaluations.models import ErrorKind, Status, TestResult
from evaluations.tasks.spec import FINAL, TaskSpec, TaskStep
from executor_project.config import Config

# A pipeline step (steps.py): a function of the evaluation's Context. The Context holds a TaskSteps, so
# this module names it only in words: it imports nothing of the pipeline (tests/test_layout.py).
Step = Callable[..., None]


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """One step as the evaluation shows it; ``error``: why its verifier gave no reward ("" if it did)."""

    name: str
    reward: float | None
    rewards: dict | None
    passed: bool
    duration_ms: int
    error: str = ""
    phase: str = "running_tests"  # where ``error`` arose: running_agent when the step's setup or healthcheck failed

    def shown(self) -> dict:
        return {
            "name": self.name,
            "reward": self.reward,
            "rewards": self.rewards,
            "passed": self.passed,
            "duration_ms": self.duration_ms,
        }


class TaskSteps:
    """The run of one task's steps: which is running, each one's outcome, why the rest did not run."""

    def __init__(self, task: TaskSpec, configs: list[Config], verifier_memory: list[int | None] | None = None):
        self.task = task  # as read: every step's, and what a step's spec is made from
        self.configs = configs  # each step's: the operator's capped by its request (verifier.capped_config)
        # Each step's separate verifier's memory limit (verifier.separate_memory), None for a shared one
        self.verifier_memory = verifier_memory or [None] * len(task.steps)
        self.separate: dict = {}  # each separate step's verifier's environment, by name (imageenv, used once)
        self.agents_env = None  # the agent's environment, which each step's agent gets back
        self.current: TaskStep = task.steps[0]
        self.outcomes: list[StepOutcome] = []
        self.outputs: list[str] = []  # each step's agent output under its name
        self.blocks: list[str] = []  # each step's test output under its name
        self.rows = 0  # test_results rows stored so far
        self.stopped = ""  # why the steps after the last one run did not run
        self.users: dict[str, dict] = {}  # each step's ids of its verifier's and the image's users (imageenv)
        self._started = 0.0
        self._unprepared = False  # the step's setup or healthcheck failed: neither its agent nor its verifier runs

    def rounds(
        self, running_agent: Step, running_tests: Step, preparing: Callable[..., str]
    ) -> Iterator[tuple[str, Step]]:
        """(pipeline step name, function) of every task step's agent and verifier, until one stops the rest;
        ``preparing(ctx, step)`` readies the environment for the step before its agent (steps.preparing_step):
        "" when it did, else why not."""
        for index, step in enumerate(self.task.steps):
            yield "running_agent", lambda ctx, i=index, s=step: self._agent(ctx, i, s, running_agent, preparing)
            if not self._unprepared:
                yield "running_tests", lambda ctx, i=index, s=step: self._tests(ctx, i, s, running_tests)
            if self.stopped or self._unprepared:
                return

    def _agent(self, ctx, index: int, step: TaskStep, running_agent: Step, preparing: Callable[..., str]) -> None:
        self.current = step
        self._started = time.monotonic()
        livelog.append_text(
            ctx.session.log, livelog.executor_line(f"step {step.name!r} ({index + 1} of {len(self.task.steps)})")
        )
        ctx.task = dataclasses.replace(
            self.task,
            prompt=step.prompt,
            verifier=step.verifier,
            request=step.request,
            solution=step.solution,
            solution_files=step.solution_files,
            artifacts=(*self.task.artifacts, *step.artifacts),  # Harbor's: the task's, then the step's own
            collect=(*self.task.collect, *step.collect),  # Harbor's _collect_hooks_for: the same order
        )
        ctx.config = self.configs[index]
        if index == 0:
            self.agents_env = ctx.env
        else:  # the way back: the last step's separate verifier's environment was the task's (enter_separate)
            ctx.env = self.agents_env
        ctx.verifier_env = self.separate.get(step.name)  # its verifier's root, fresh, or None: the agent's
        ctx.verifier_memory_mb = self.verifier_memory[index]
        if step.name in self.users:  # its verifier's user ([steps.verifier] user, else [verifier] user)
            ctx.env.users = self.users[step.name]
        error = preparing(ctx, step)
        if error:  # Harbor's step exception before its agent: no verifier, the rest do not run
            self._unprepared = True
            duration = int((time.monotonic() - self._started) * 1000)
            self.outcomes.append(StepOutcome(step.name, None, None, False, duration, error, "running_agent"))
            ctx.stage(steps=[o.shown() for o in self.outcomes])
            livelog.append_text(ctx.session.log, livelog.executor_line(f"step {step.name!r}: {error}"))
            rest = self.task.steps[index + 1 :]
            if rest:
                self.stopped = f"step {step.name!r} gave no reward: {', '.join(repr(s.name) for s in rest)} did not run"
                livelog.append_text(ctx.session.log, livelog.executor_line(self.stopped))
            return
        running_agent(ctx)

    def _tests(self, ctx, index: int, step: TaskStep, running_tests: Step) -> None:
        running_tests(ctx)
        grade = ctx.grade
        duration = int((time.monotonic() - self._started) * 1000)
        if grade.error:
            outcome = StepOutcome(step.name, None, None, False, duration, grade.error)
        else:
            outcome = StepOutcome(step.name, grade.reward, grade.rewards, grade.reward >= 1, duration)
        self.outcomes.append(outcome)
        ctx.stage(steps=[o.shown() for o in self.outcomes])
        rest = self.task.steps[index + 1 :]
        why = _stop(step, outcome) if rest else ""
        if why:
            self.stopped = f"{why}: {', '.join(repr(s.name) for s in rest)} did not run"
            livelog.append_text(ctx.session.log, livelog.executor_line(self.stopped))

    # -- what the steps' commands leave on the evaluation ---------------------------------------------

    def agent_env(self) -> dict[str, str]:
        """For the agent's processes: the step running (a reference solution picks its own by it)."""
        return {"TASK_STEP": self.current.name}

    def agent_output(self, output: str) -> str:
        """agent_output: every step's so far, each under its name."""
        self.outputs.append(f"=== step {self.current.name} ===\n{output}")
        return "\n".join(self.outputs)

    def stored(self, grade: Grade) -> tuple[list[TestResult], dict]:
        """The step's rows, each named ``<step>/<name>`` and placed after the earlier steps' rows, and the
        columns written with them (test_output: every step's so far)."""
        for row in grade.results:
            row.name = f"{self.current.name}/{row.name}"
            row.position += self.rows
        self.rows += len(grade.results)
        self.blocks.append(f"=== step {self.current.name} ===\n{grade.output}")
        return grade.results, {**grade.stored(), "test_output": "\n".join(self.blocks)}

    # -- the task's verdict ---------------------------------------------------------------------------

    def reward(self) -> tuple[float | None, dict | None]:
        """The task's reward and rewards by its strategy (Harbor's ``_select_multi_step_reward``)."""
        if self.task.reward_strategy == FINAL:
            last = self.outcomes[-1] if self.outcomes else None
            return (last.reward, last.rewards) if last is not None else (None, None)
        graded = [o for o in self.outcomes if o.rewards is not None]
        keys = sorted({key for o in graded for key in o.rewards})
        if not keys:
            return None, None
        rewards = {key: math.fsum(o.rewards.get(key, 0.0) for o in graded) / len(graded) for key in keys}
        if "reward" in rewards:
            return rewards["reward"], rewards
        if len(rewards) == 1:
            return next(iter(rewards.values())), rewards
        return math.fsum(o.reward for o in graded) / len(graded), rewards

    def verdict(self) -> Verdict:
        reward, rewards = self.reward()
        fields = {"reward": reward, "rewards": rewards, "steps": [o.shown() for o in self.outcomes]}
        stopped = f"; {self.stopped}" if self.stopped else ""
        broken = next((o for o in self.outcomes if o.error), None)
        if broken is not None:
            error = f"{broken.phase}: step {broken.name!r}: {broken.error}{stopped}"
            return Verdict(Status.FAILED, error, ErrorKind.TESTS_FAILED, fields)
        if reward is None or reward < 1:
            shown = "no reward" if reward is None else f"reward {reward:g} < 1"
            error = f"running_tests: {shown} ({self.task.reward_strategy} of the steps' rewards){stopped}"
            return Verdict(Status.FAILED, error, ErrorKind.TESTS_FAILED, fields)
        return Verdict(Status.COMPLETED, "", None, fields)


def _stop(step: TaskStep, outcome: StepOutcome) -> str:
    """Why the steps after ``step`` do not run (Harbor's ``_should_stop_after_step``); "" when they do."""
    if outcome.error:
        return f"step {step.name!r} gave no reward"
    if step.min_reward is None:
        return ""
    thresholds = step.min_reward if isinstance(step.min_reward, dict) else {"reward": step.min_reward}
    for key, threshold in thresholds.items():
        actual = (outcome.rewards or {}).get(key, -math.inf)
        if actual < threshold:
            return f"step {step.name!r} {key}={actual:g} below min_reward {threshold:g}"
    return ""
