"""Build an environment (a Debian root filesystem) with debootstrap: what `manage.py make_environment NAME` runs.

1. Atomic: the tree is built in ``ENVIRONMENTS_ROOT/.building-NAME-<random>`` and renamed
   to NAME only once debootstrap succeeded, every asked package is installed, apt's
   caches are dropped (as Debian's images do) and the identity stamp is written. A
   failure, Ctrl-C or SIGTERM kills debootstrap, unmounts what it mounted in the tree
   (/proc, /sys) and removes the tree.
2. One build at a time per ENVIRONMENTS_ROOT (a lock file), so a ``.building-*`` found
   while holding the lock is a killed run's, and is removed.
3. ``--replace`` swaps the new tree in with one rename (RENAME_EXCHANGE): an evaluation
   starting at that moment sees the old tree or the new one, never none. The old tree is
   kept as ``.retired-NAME-<random>`` for SESSION_TTL_SECS, as evaluations running on
   it still read it, and removed by a later make_environment.
4. ``--save-tarball FILE`` keeps what debootstrap downloaded (``--make-tarball``), and
   ``--from-tarball FILE`` builds from it without the mirror (``--unpack-tarball``).

debootstrap runs directly, not through the runtime's spawner: it is the operator's tool,
run as root on purpose, not a task's command to contain.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evaluations import environments
from evaluations.images import inroot

DEFAULT_PACKAGES = "python3 python3-venv python3-pip git ca-certificates bash"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BUILDING = ".building-"
RETIRED = ".retired-"
LOCK_FILE = ".make_environment.lock"
RENAME_EXCHANGE = 2  # linux/fs.h
MNT_DETACH = 2
KILL_GRACE_SECS = 10
_OCTAL = re.compile(r"\\([0-7]{3})")


class BuildError(Exception):
    """A build that could not be done or did not succeed; the message says why (and what to do)."""


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class Built:
    environment: environments.Environment
    seconds: float
    retired: Path | None  # the replaced tree, kept for SESSION_TTL_SECS


class Builder:
    """Builds environments into ``root``; ``say`` and ``warn`` take each progress line (the command's
    stdout and stderr). Needs root and debootstrap, which the caller checks."""

    def __init__(self, root: Path, session_ttl_secs: int, say: Callable[[str], None], warn: Callable[[str], None]):
        self.root = root
        self.session_ttl_secs = session_ttl_secs
        self.say = say
        self.warn = warn

    def build(
        self,
        name: str,
        suite: str,
        wanted: list[str],
        mirror: str,
        replace: bool = False,
        save_tarball: str | None = None,
        from_tarball: str | None = None,
    ) -> Built:
        """Build NAME (see the module's numbered list); Interrupted by SIGTERM, SIGINT or SIGHUP."""
        root = self.root
        with _lock(root), _signals_interrupt():
            self._clean_stale(root, self.session_ttl_secs)
            final = root / name
            if os.path.lexists(final) and not replace:
                raise BuildError(f"environment {name} already exists in {root}; --replace builds it again")
            building = Path(tempfile.mkdtemp(prefix=f"{BUILDING}{name}-", dir=root))
            started = time.monotonic()
            try:
                if save_tarball:
                    from_tarball = self._download(building, suite, wanted, mirror, Path(save_tarball).absolute())
                self._build(building, suite, wanted, mirror, from_tarball)
                _slim(building)
                _hosts_file(building)
                _stamp(building, suite, wanted, mirror)
                _check_usable(root, building, name)
                retired = _put_in_place(building, final)
            except BaseException:
                self._give_up(building)
                raise
        return Built(environments.resolve(root, name), time.monotonic() - started, retired)

    # -- the steps --------------------------------------------------------------------------

    def _download(self, building: Path, suite: str, wanted: list[str], mirror: str, tarball: Path) -> Path:
        """debootstrap --make-tarball into a partial file beside FILE, renamed to FILE when complete."""
        work = building.with_name(building.name + ".download")
        partial = tarball.with_name(f".{tarball.name}.partial-{uuid.uuid4().hex[:8]}")
        tarball.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._debootstrap(["--make-tarball", str(partial)], suite, wanted, work, mirror)
            os.replace(partial, tarball)
        finally:
            partial.unlink(missing_ok=True)
            _remove_tree(work)
        return tarball

    def _build(self, building: Path, suite: str, wanted: list[str], mirror: str, tarball: str | Path | None) -> None:
        extra = ["--unpack-tarball", str(Path(tarball).absolute())] if tarball else []
        self._debootstrap(extra, suite, wanted, building, mirror)
        missing = sorted(set(wanted) - _installed_packages(building))
        if missing:
            raise BuildError(f"debootstrap ended but did not install: {', '.join(missing)}")

    def _debootstrap(self, extra: list[str], suite: str, wanted: list[str], target: Path, mirror: str) -> None:
        """Run it in a process group of its own, its lines shown as they come; kill the group on the way out."""
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(wanted)}", *extra, suite, str(target), mirror]
        self.say("$ " + " ".join(argv))
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us alone; we stop the whole group, dpkg in the chroot too
        )
        last = ""
        try:
            for raw in process.stdout:
                last = raw.decode(errors="replace").rstrip()
                self.say(last)
            code = process.wait()
        finally:
            _kill_group(process)
        if code != 0:
            raise BuildError(f"debootstrap failed (exit status {code}): {last}")

    def _clean_stale(self, root: Path, ttl_secs: int) -> None:
        now = time.time()
        for entry in os.scandir(root):
            stale = entry.name.startswith(BUILDING)
            retired = entry.name.startswith(RETIRED) and now - entry.stat(follow_symlinks=False).st_ctime > ttl_secs
            if stale or retired:
                self.say(f"removing {entry.path} ({'a killed build' if stale else 'replaced'})")
                _remove_tree(Path(entry.path))

    def _give_up(self, building: Path) -> None:
        self.warn(f"removing the partial build {building}")
        _remove_tree(building)
        _remove_tree(building.with_name(building.name + ".download"))


# -- helpers -------------------------------------------------------------------------------


@contextlib.contextmanager
def _lock(root: Path):
    with open(root / LOCK_FILE, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BuildError(f"another make_environment is building in {root}; try again when it ends") from None
        yield


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM, SIGINT and SIGHUP raise Interrupted where the build is, so its cleanup runs."""

    def interrupt(signum, frame):
        raise Interrupted(signum)

    caught = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {signum: signal.signal(signum, interrupt) for signum in caught}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _kill_group(process: subprocess.Popen) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(KILL_GRACE_SECS)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # what debootstrap started and left behind
    process.wait()
    if process.stdout:
        process.stdout.close()


def _installed_packages(tree: Path) -> set[str]:
    try:
        text = (tree / environments.DPKG_STATUS).read_text(errors="replace")
    except OSError:
        return set()
    installed = set()
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
        if fields.get("Status", "").endswith(" installed"):
            installed.add(fields.get("Package", ""))
    return installed


def _slim(tree: Path) -> None:
    """Drop what Debian's docker images drop: the downloaded .debs and apt's lists (~110 MB of ~420).

    The tree is read-only to tasks, so apt inside it could not use them; `apt-get update`
    in a chroot brings the lists back for an operator adding packages.
    """
    for folder, pattern in (("var/cache/apt/archives", "*.deb"), ("var/lib/apt/lists", "*_*")):
        for path in (tree / folder).glob(pattern):
            if path.is_file() and not path.is_symlink():
                path.unlink()


def _hosts_file(tree: Path) -> None:
    """debootstrap writes no /etc/hosts (docker mounts one): without it `localhost` goes to DNS."""
    hosts = tree / "etc" / "hosts"
    if not os.path.lexists(hosts):
        hosts.write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
        os.chmod(hosts, 0o644)


def _stamp(building: Path, suite: str, wanted: list[str], mirror: str) -> None:
    """The id that makes a rebuilt environment's identity new, and how it was made, for the operator."""
    stamp = {"id": uuid.uuid4().hex, "suite": suite, "packages": wanted, "mirror": mirror, "built_at": time.time()}
    (building / environments.STAMP_FILE).write_text(json.dumps(stamp, indent=1) + "\n")
    os.chmod(building / environments.STAMP_FILE, 0o644)
    os.chmod(building, 0o755)  # mkdtemp made it 0700; the sandbox uids must enter it


def _check_usable(root: Path, building: Path, name: str) -> None:
    """The checks resolve will apply to NAME, on the tree before it gets the name."""
    try:
        environments.inspect(root, building.name, shown=name)
    except environments.BadEnvironment as exc:
        raise BuildError(f"the built tree is not a usable environment: {exc}") from None


def _put_in_place(building: Path, final: Path) -> Path | None:
    """Rename the build to its name; an existing tree is swapped out in the same step and retired."""
    if not os.path.lexists(final):
        os.rename(building, final)
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    if libc.renameat2(at_fdcwd, os.fsencode(building), at_fdcwd, os.fsencode(final), RENAME_EXCHANGE) != 0:
        errno = ctypes.get_errno()
        raise BuildError(f"could not swap {building} with {final}: {os.strerror(errno)}")
    retired = building.with_name(f"{RETIRED}{final.name}-{uuid.uuid4().hex[:8]}")
    os.rename(building, retired)  # now the old tree
    return retired


def _mounts_beneath(path: Path) -> list[str]:
    """Mount points at or under path (debootstrap mounts /proc and /sys in the tree), deepest first."""
    real = inroot.host_path(path)
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), line.split()[4])  # \040 is a space
            if point == real or point.startswith(real + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def _remove_tree(path: Path) -> None:
    """Unmount what is mounted inside, then remove; never through a mount into the host's /proc or /dev."""
    if not os.path.lexists(path):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for point in _mounts_beneath(path):
        libc.umount2(os.fsencode(point), MNT_DETACH)
    left = _mounts_beneath(path)
    if left:
        raise BuildError(f"could not unmount {', '.join(left)}; remove {path} by hand once they are unmounted")
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)
