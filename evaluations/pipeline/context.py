"""What the steps of one evaluation share, and the one way they run a command."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from assets import AssetView
from evaluations.models import Evaluation
from evaluations.pipeline import toolchains
from evaluations.pipeline.session import Session
from evaluations.pipeline.taskspec import TaskSpec
from evaluations.runtime.spawner import CommandResult, Limits, Mount, Spawner
from executor_project.config import Config


class StepFailed(Exception):
    """The evaluation fails; the message is the cause (the step name is added)."""


class Cancelled(Exception):
    """The evaluation is cancelled (DELETE, TTL, agent timeout, shutdown)."""


class WorkerLost(Exception):
    """The worker that owns this evaluation died; the evaluation fails."""


@dataclass
class Context:
    eval_id: str
    config: Config
    evaluation: Evaluation
    session: Session
    spawner: Spawner
    command_path: str
    cancel_reason: callable
    task: TaskSpec | None = None
    base_sha: str = ""
    step: str = "queued"
    asset_excludes: list[str] = field(default_factory=list)
    static_assets: AssetView | None = None  # set by downloading_task (pipeline/static.py)

    def limits(self, timeout_secs: float) -> Limits:
        config = self.config
        return Limits(
            timeout_secs=max(0.001, timeout_secs),
            memory_bytes=config.memory_limit_bytes,
            disk_quota_bytes=config.disk_quota_bytes,
            max_processes=config.max_processes,
            max_output_bytes=config.max_output_bytes,
            monitor_interval_ms=config.monitor_interval_ms,
        )

    def base_env(self) -> dict[str, str]:
        """The clean environment every command starts from: nothing of the service's."""
        return {
            "PATH": self.command_path,
            "HOME": str(self.session.home),
            "LANG": "C.UTF-8",
            "TZ": "UTC",
            "PYTHONHASHSEED": "0",
            # A .pyc written by the install step stays "valid" after a same-size edit within the
            # same second (mtime resolution), and the tests would run the old code.
            "PYTHONDONTWRITEBYTECODE": "1",
            "TMPDIR": str(self.session.tmp),
            # SPEC §11: PATH with the venv first, caches and prefixes in HOME, the host's CAs.
            **toolchains.command_env(self.session, self.command_path, toolchains.host_ca(self.config)),
        }

    def run(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        timeout_secs: float,
        network: bool,
        mounts: list[Mount] = (),
        writable: list | None = None,
    ) -> CommandResult:
        """Run one command of this evaluation through the spawner; a cancel raises Cancelled."""
        session = self.session
        result = self.spawner.run(
            argv,
            cwd=session.repo,
            env=env,
            limits=self.limits(timeout_secs),
            network=network,
            writable=writable if writable is not None else [session.repo, session.home, session.tmp, session.venv],
            mounts=list(mounts),
        )
        if result.limit == "cancelled":
            self.raise_cancelled()
        return result

    def raise_cancelled(self):
        reason = self.cancel_reason()
        if reason == WORKER_LOST:
            raise WorkerLost(reason)
        raise Cancelled(reason)

    def check_cancelled(self) -> None:
        if self.spawner_cancelled():
            self.raise_cancelled()

    def spawner_cancelled(self) -> bool:
        event = self.spawner.cancel_event
        return event is not None and event.is_set()


WORKER_LOST = "executor worker lost"


def deadline_in(seconds: float) -> float:
    return time.monotonic() + seconds


def remaining(deadline: float) -> float:
    return deadline - time.monotonic()
