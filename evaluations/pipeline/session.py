"""The session folder of one evaluation: WORKSPACE_BASE/<eval_id>/.

task/     the extracted archive (root only: hidden tests, original_pr.md)
repo/     the repository; owned by the sandbox uid
base-objects/  root only: the clone's object store as cloned, read by the agent patch (patch.keep_base_objects)
agent/    agent.<ext> and prompt.md, read-only to commands; an agent project's code/ (root's),
          env/ (its venv or node_modules) and home/ (HOME of its install), the sandbox uid's,
          pipeline/agentenv.py
home/     HOME of every command; owned by the sandbox uid
venv/     the task's Python venv (environments/toolchains.py); the sandbox uid's once written
tmp/      /tmp (and TMPDIR) of every command, so it counts against the disk quota
.tmp-tests/  root's while the agent runs: the tests' empty tmp/, made ahead and put in place of the
          agent's by ``reset_tmp`` (``prepare_tmp``)
tests/    test scripts, written by the executor after the agent step
saved/    root only: HOME and venv/ as the install step left them, given back to the tests
agent-logs/  /logs/agent in an image (SPEC §17): the sandbox uid's; what the agent leaves there is kept
agent-artifacts/  /logs/artifacts in an image (SPEC §23): as agent-logs/, collected with the task's artifacts
volumes/  root's, 0711: each compose named volume in <name>/, the sandbox uid's, 0777 (pipeline/volumes.py)
verifier-image/   root's, 0710 as the session's: a separate verifier's root (SPEC §23), mounted there (pipeline/imageenv.py);
                  for a task of [[steps]] (0711), each separate step's in <number>/
verifier/ root's: tests/ (the verifier's /tests) and logs/ (its /logs/verifier, the sandbox uid's),
          written after the agent (pipeline/verifier.py); in an image first the agent's empty
          /logs/verifier, removed with what the agent left there when the verifier's is made
log.txt   the live combined log (GET /evaluate/{id}/logs)

The session folder is root's, mode 0710, group = the evaluation's own uid
(see runtime/uids.py): that uid may pass through to its folders, no other
unprivileged uid may even look inside, so another evaluation's agent cannot
read this one's code, tests or repository even without the sandbox.
Everything the agent may write (repo/, home/, tmp/) is below it; the
entries the service writes later (agent/, tests/, saved/, log.txt) are
root's, so a planted link cannot stand where the service writes.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from evaluations.cache import mounts
from evaluations.safefs import copy_tree_nofollow, remove_tree_nofollow

# A session folder on its way out: WORKSPACE_BASE/.retired-<eval_id> (see Session.retire).
RETIRED_PREFIX = ".retired-"
NEXT_TMP = ".tmp-tests"  # the tests' tmp/, made while the agent runs (``prepare_tmp``)


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
    def base_objects(self) -> Path:
        return self.root / "base-objects"

    @property
    def agent(self) -> Path:
        return self.root / "agent"

    @property
    def agent_code(self) -> Path:
        return self.root / "agent" / "code"

    @property
    def agent_env(self) -> Path:
        return self.root / "agent" / "env"

    @property
    def agent_home(self) -> Path:
        return self.root / "agent" / "home"

    @property
    def agent_logs(self) -> Path:
        return self.root / "agent-logs"

    @property
    def verifier(self) -> Path:
        return self.root / "verifier"

    @property
    def agent_artifacts(self) -> Path:
        return self.root / "agent-artifacts"

    @property
    def verifier_image(self) -> Path:
        return self.root / "verifier-image"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def tests(self) -> Path:
        return self.root / "tests"

    @property
    def saved(self) -> Path:
        return self.root / "saved"

    @property
    def log(self) -> Path:
        return self.root / "log.txt"

    @classmethod
    def create(cls, base: Path, eval_id: str, uid: int | None) -> Session:
        base.mkdir(parents=True, exist_ok=True)
        _check_ours(base)
        os.chmod(base, 0o711)  # commands may traverse to their own session, never list the others
        session = cls(base / str(eval_id), uid)
        if session.root.is_symlink() or session.root.exists():
            _unmount_below(session.root)
            remove_tree_nofollow(session.root)
        session.root.mkdir(mode=0o700)
        if uid is not None:
            os.chown(session.root, os.geteuid(), uid)
            os.chmod(session.root, 0o710)  # only the evaluation's uid (as group) may pass
        session.task.mkdir(mode=0o700)
        session.agent.mkdir(mode=0o755)
        session.venv.mkdir(mode=0o755)  # root's and empty until toolchains.make_venv fills it
        for owned in (session.repo, session.home, session.tmp):
            session.make_folder(owned, owner=session.uid_owner)
        session.log.touch(mode=0o600)
        return session

    @property
    def uid_owner(self) -> tuple[int, int] | None:
        """A folder the evaluation's commands write: the uid's (None without one: the service's)."""
        return None if self.uid is None else (self.uid, self.uid)

    @property
    def root_passed(self) -> tuple[int, int] | None:
        """A folder the evaluation's sandboxes pass or read but never change: root's, the uid its group."""
        return None if self.uid is None else (os.geteuid(), self.uid)

    @staticmethod
    def make_folder(path: Path, mode: int = 0o700, *, owner: tuple[int, int] | None = None) -> None:
        """The one way a folder of the session is made: ``mkdir`` as 0700 (nobody gets in meanwhile), then
        its ``owner`` (``uid_owner``, ``root_passed`` or another id pair; None: the service's) and
        ``mode``, set through a descriptor of the folder itself, never through a link put in its place.
        Raises OSError (FileExistsError when it is there)."""
        path.mkdir(mode=0o700)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if owner is not None:
                os.fchown(fd, *owner)
            if mode != 0o700:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def let_image_users_pass(self, folder: Path) -> None:
        """The session's folder, and ``folder`` in it where an image's root is mounted, traversable
        (not listable) by every id, for an image whose commands run as more users than the agent's
        (SPEC §23): bubblewrap sets a sandbox up as its user's id of the evaluation's range, which is
        not the lease the folders' group lets pass. Only bubblewrap ever looks: no command of any
        evaluation has these host paths in its view."""
        for each in {self.root, Path(folder)}:
            os.chmod(each, 0o711)

    def keep_install_home(self) -> None:
        """After the install step: keep HOME and the venv for the tests (root only), give the agent copies.

        HOME is where Python's user site (``usercustomize``, ``.pth`` files),
        git's global config and many tools' settings live, the venv where
        pytest and the task's packages are: an agent writing there could
        change how the tests behave. Call only once no process of the
        evaluation is left (after the sweep).
        """
        self.saved.mkdir(mode=0o700)
        for folder in (self.home, self.venv):
            with os.scandir(folder) as entries:
                if next(entries, None) is None:
                    continue  # nothing there: the tests get a fresh, empty one
            kept = self.saved / folder.name
            os.rename(folder, kept)
            copy_tree_nofollow(kept, folder, self.uid)

    def restore_install_home(self) -> None:
        """Before the tests: HOME and the venv as the install step left them, whatever the agent did."""
        for folder in (self.home, self.venv):
            kept = self.saved / folder.name
            if folder == self.venv and not kept.exists():
                continue  # no venv was written: the folder is root's and empty, nothing to undo
            remove_tree_nofollow(folder)
            if kept.is_dir() and not kept.is_symlink():
                os.rename(kept, folder)
            else:
                self.make_folder(folder, owner=self.uid_owner)

    def prepare_tmp(self) -> Path:
        """While the agent runs: the tests' empty tmp/, made now as a folder of root's (no command
        reaches the session folder itself, nor writes a folder of root's); ``reset_tmp`` gives it to
        the evaluation's uid in place of the agent's. Raises OSError (FileExistsError when made)."""
        ready = self.root / NEXT_TMP
        self.make_folder(ready)
        return ready

    def reset_tmp(self) -> None:
        """Before the tests: an empty /tmp, so nothing the agent left there is found by a test (the
        one ``prepare_tmp`` made, if any)."""
        remove_tree_nofollow(self.tmp)
        ready = self.root / NEXT_TMP
        try:
            fd = os.open(ready, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            self.make_folder(self.tmp, owner=self.uid_owner)
            return
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                raise PermissionError(f"{ready} is not the executor's")
            if self.uid_owner is not None:
                os.fchown(fd, *self.uid_owner)
        finally:
            os.close(fd)
        os.rename(ready, self.tmp)

    def remove(self) -> None:
        if self.root.is_symlink():
            self.root.unlink()
        elif self.root.exists():
            _unmount_below(self.root)
            remove_tree_nofollow(self.root)

    def retire(self) -> Path | None:
        """Take the session folder out of its place at once; return where it went.

        One rename instead of a tree walk (thousands of unlinks and rmdirs, slow on a busy
        disk), so the final state is not held up: the caller removes the returned folder
        after writing it (``remove_retired``), and the reaper removes what a dead process
        left (``RETIRED_PREFIX``). Closed first to every uid but ours: the evaluation's
        uid goes back to the pool before the folder is gone.
        """
        if self.root.is_symlink():
            self.root.unlink()
            return None
        if not self.root.exists():
            return None
        _unmount_below(self.root)  # the workspace cache's overlays (cache/overlay.py)
        if self.uid is not None:
            os.chown(self.root, -1, 0)
        os.chmod(self.root, 0o700)
        retired = self.root.with_name(RETIRED_PREFIX + self.root.name)
        if retired.is_symlink() or retired.exists():
            remove_tree_nofollow(retired)
        os.rename(self.root, retired)
        return retired


def remove_retired(folder: Path) -> None:
    """Remove a folder ``Session.retire`` moved away (its name starts with RETIRED_PREFIX)."""
    if not folder.name.startswith(RETIRED_PREFIX):
        raise ValueError(f"{folder} is not a retired session folder")
    remove_tree_nofollow(folder)


def _unmount_below(folder: Path) -> None:
    if os.geteuid() == 0:
        mounts.unmount_below(folder)


def _check_ours(base: Path) -> None:
    """WORKSPACE_BASE (by default under the world-writable /tmp) must be a real folder of ours:
    whoever owns it could swap a session folder for a link between our mkdir and chown."""
    st = os.lstat(base)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(
            f"WORKSPACE_BASE {base} is not a folder owned by uid {os.geteuid()} (a link, or made by "
            "another user): refusing to create sessions in it"
        )
