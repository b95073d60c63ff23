"""The session folder of one evaluation: WORKSPACE_BASE/<eval_id>/.

task/     the extracted archive (root only: hidden tests, original_pr.md)
repo/     the repository; owned by the sandbox uid
agent/    agent.<ext> and prompt.md, read-only to commands
home/     HOME of every command; owned by the sandbox uid
tmp/      /tmp (and TMPDIR) of every command, so it counts against the disk quota
tests/    test scripts, written by the executor after the agent step
log.txt   the live combined log (GET /evaluate/{id}/logs)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from evaluations.pipeline.safefs import remove_tree_nofollow


@dataclass(frozen=True)
class Session:
    root: Path
    uid: int | None

    @property
    def task(self) -> Path:
        return self.root / "task"

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    @property
    def agent(self) -> Path:
        return self.root / "agent"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def tests(self) -> Path:
        return self.root / "tests"

    @property
    def log(self) -> Path:
        return self.root / "log.txt"

    @classmethod
    def create(cls, base: Path, eval_id: str, uid: int | None) -> Session:
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o711)  # commands may traverse to their own session, never list the others
        session = cls(base / str(eval_id), uid)
        if session.root.is_symlink() or session.root.exists():
            remove_tree_nofollow(session.root)
        session.root.mkdir(mode=0o711)
        session.task.mkdir(mode=0o700)
        session.agent.mkdir(mode=0o755)
        for owned in (session.repo, session.home, session.tmp):
            owned.mkdir(mode=0o700)
            if uid is not None:
                os.chown(owned, uid, uid)
        session.log.touch(mode=0o600)
        return session

    def remove(self) -> None:
        if self.root.is_symlink():
            self.root.unlink()
        elif self.root.exists():
            remove_tree_nofollow(self.root)
