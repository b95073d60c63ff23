"""Why an evaluation did not pass (SPEC §14 ``error_kind``), decided from data, never from sentences.

1. The raiser says it when it knows: ``StepFailed(kind=...)``, ``Cancelled(kind=...)``; the
   fetch, archive and git errors carry ``transient`` (the network or the host failed) and
   git's ``limit_exceeded``, turned into a kind here (``of_fetch``, ``of_git``).
2. Otherwise the step's default (``STEP_KINDS``): what a failure there is, as a rule.
3. Anything else that ends a pipeline (WorkerLost, an internal error) is ``infrastructure``.

The "Outcomes" table of ``docs/api.md`` lists which step and cause gives which kind.
"""

from __future__ import annotations

from evaluations import agents
from evaluations.models import ErrorKind, Step
from evaluations.network import urlguard
from evaluations.pipeline import archive, gitrepo
from evaluations.pipeline.context import Cancelled, StepFailed

# A StepFailed without a kind: the task's own steps fail for the task, the agent's install for the
# agent; what is left in the agent's and the tests' steps (a language missing here, a HOME that
# cannot be reset) is the executor's.
STEP_KINDS = {
    Step.QUEUED: ErrorKind.INFRASTRUCTURE,
    Step.DOWNLOADING_TASK: ErrorKind.TASK_INVALID,
    Step.PREPARING_ENVIRONMENT: ErrorKind.TASK_INVALID,
    Step.CLONING_REPO: ErrorKind.TASK_INVALID,
    Step.INSTALLING_DEPS: ErrorKind.TASK_INVALID,
    Step.INSTALLING_AGENT: ErrorKind.AGENT_INVALID,
    Step.RUNNING_AGENT: ErrorKind.INFRASTRUCTURE,
    Step.RUNNING_TESTS: ErrorKind.INFRASTRUCTURE,
}


def of_fetch(exc: urlguard.FetchError | archive.ArchiveError | agents.ProjectError) -> str | None:
    """A download or an extraction (a task's or an agent's): infrastructure when the network or
    the host failed, else the step's rule."""
    return ErrorKind.INFRASTRUCTURE if exc.transient else None


def of_git(exc: gitrepo.GitError | urlguard.FetchError) -> str | None:
    """A clone: a timeout or a network failure is infrastructure, a limit limit_exceeded, else the step's rule."""
    if getattr(exc, "limit_exceeded", False):
        return ErrorKind.LIMIT_EXCEEDED
    return ErrorKind.INFRASTRUCTURE if exc.transient else None


def of_exception(step: str, exc: BaseException) -> str:
    """The error_kind of a pipeline that ended in ``step`` with ``exc``."""
    if isinstance(exc, StepFailed):
        return exc.kind or STEP_KINDS.get(step, ErrorKind.INFRASTRUCTURE)
    if isinstance(exc, Cancelled):
        return exc.kind or ErrorKind.CANCELLED
    return ErrorKind.INFRASTRUCTURE  # WorkerLost, an internal error (a host disk full among them)
