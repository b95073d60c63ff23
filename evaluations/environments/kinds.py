"""What a task's commands run in: one object per kind of environment, one interface (SPEC §11, §16, §21).

Modelled on Harbor's ``BaseEnvironment`` subclasses (one per backend: start, exec, upload, download,
stop): the pipeline holds one (``Context.env``) and asks it, never which kind it is.

- ``Host``: the host's system folders and the runtime's language runtimes (no ``environment:``).
- ``Named``: a root filesystem under ENVIRONMENTS_ROOT (``resolve`` in this package), bound as ``/``.
- ``Image``: an image's layers mounted in the session under the evaluation's own writable layer
  (images/rootfs.py); its ``Env`` and ``WorkingDir`` are the commands'.

1. Every kind binds the session's repo/, home/ and tmp/ at their own paths, writable; the host and a
   named environment also the task's venv (SPEC §11). An image has none (§21): its python, pip and
   PATH are its own, and what an install writes lands in its writable layer.
2. The working directory is the session's repo/, a folder the executor made (opened ``O_NOFOLLOW``),
   except for an image task without a repository (SPEC §16): the image's WorkingDir, resolved in the
   image's root by the one resolver (images/inroot.py), never through a host path.
3. A command runs through the evaluation's spawner from the working directory (``exec``); ``close``
   gives back what the environment holds (an image's mounted root). The step ``preparing_environment``
   (pipeline/imageenv.py) makes the evaluation's; until then it is the host's. The live sandboxes
   of issue 37 hold one of these too.
4. Nothing here imports the pipeline: the session is any object with its folders (``toolchains.Folders``);
   what cannot be used raises ``BadEnvironment``, which the pipeline turns into a step's failure.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

from evaluations.environments import BadEnvironment, Environment, find_interpreter, toolchains
from evaluations.images import inroot, rootfs
from evaluations.images.errors import ImageError
from evaluations.images.isolate import isolate_workdir
from evaluations.images.store import ImageStore
from evaluations.runtime import CommandResult, Limits, Mount, SandboxPolicy, Spawner
from evaluations.runtime.idmap import IdMap
from evaluations.runtime.policy import DISTRIBUTION_CA_BUNDLE
from evaluations.runtime.sandbox import SYSTEM_PATH
from evaluations.runtime.types import ImageRoot
from evaluations.safefs import SafeFSError, open_parent, open_root_dir

ROOT_USERS = ("root", "0", "0:0", "root:root")  # an image's User that is its root: no lookup
# Whose user a command of an image runs as (SPEC §23): the agent's is the map's (the lease's).
AGENT_USER, VERIFIER_USER, IMAGE_USER = "agent", "verifier", "image"


class BaseEnvironment(ABC):
    """The root filesystem, working directory, variables and sandbox of one evaluation's commands."""

    install_kept: ClassVar[bool] = True  # what install commands write, a workspace cache entry keeps (SPEC §13)
    # Harbor's /logs/agent for the agent (SPEC §17), kept after it with what it changed in the root
    # outside its working directory: a root with a writable layer of its own, an image's.
    agent_logs: ClassVar[bool] = False

    def __init__(self, session: toolchains.Folders, spawner: Spawner):
        self.session = session
        self.spawner = spawner
        self.repo_view: Path | None = None  # ``view_repo``'s

    def view_repo(self, folder: Path | None) -> None:
        """From now on its commands find ``folder`` at the repository's path, and the executor writes
        there: the tests' view of the repository (pipeline/repoview.py); None: the repository again."""
        self.repo_view = folder

    # -- what it is ---------------------------------------------------------------------------

    @property
    @abstractmethod
    def root(self) -> Path:
        """Its `/` on the host (the host's own `/` for the host)."""

    @property
    @abstractmethod
    def label(self) -> str:
        """How an error sentence names it: ``environment NAME``, ``image REF``."""

    def cache_key(self) -> list[str] | None:
        """What of it an install step's snapshot depends on (SPEC §13): its name and identity."""
        return None

    @property
    def command_path(self) -> str:
        """The system PATH of its commands."""
        return SYSTEM_PATH

    def find_program(self, name: str) -> str | None:
        """The absolute path of ``name`` as its PATH finds it, links resolved inside its root; None if absent."""
        return find_interpreter(self.root, name)

    def check_programs(self, needed: dict[str, str]) -> None:
        """Each program (name -> its role) is there, or BadEnvironment names the first missing."""
        for program, role in needed.items():
            if self.find_program(program) is None:
                raise BadEnvironment(f"{self.label} has no {program} ({role})")

    def python(self) -> toolchains.Python | None:
        """The python3 its commands find (a venv is made from it), or None."""
        return toolchains.find_python(self.command_path, self.root)

    # -- the working directory ----------------------------------------------------------------

    @property
    def workdir(self) -> str:
        """Where its commands start, as they see it."""
        return str(self.session.repo)

    def open_workdir(self) -> int:
        """A handle of ``workdir`` (``O_RDONLY | O_DIRECTORY``) for ``*at`` writes that follow no link;
        the caller closes it."""
        return os.open(self.repo_view or self.session.repo, inroot.DIR_FLAGS)

    def workdir_owner(self) -> int | None:
        """The host uid of what the executor writes there for its commands (the evaluation's lease)."""
        return self.session.uid

    def verifier_owner(self) -> tuple[int, int] | None:
        """The host uid and gid the verifier runs as, for its /logs/verifier (the lease, but in an
        image whose verifier is another user than the agent's)."""
        return None if self.session.uid is None else (self.session.uid, self.session.uid)

    def mount_point(self, target: str) -> None:
        """A folder at ``target`` for a bind of the executor's (/tests, /logs/verifier), where the
        sandbox would otherwise follow what the agent put there: only an image's root is writable."""
        return None

    # -- its commands -------------------------------------------------------------------------

    def variables(self) -> dict[str, str]:
        """Its own variables, under the executor's (an image's ``Env``)."""
        return {}

    def toolchain_env(self, ca: toolchains.CaBundle | None) -> dict[str, str]:
        """SPEC §11: PATH with the venv first, caches and prefixes in HOME, the host's CAs."""
        return toolchains.command_env(self.session, self.command_path, ca)

    def command_env(self, ca: toolchains.CaBundle | None) -> dict[str, str]:
        """The clean environment every command starts from: nothing of the service's."""
        session = self.session
        return {
            **self.variables(),
            "PATH": self.command_path,
            "HOME": str(session.home),
            "LANG": "C.UTF-8",
            "TZ": "UTC",
            "PYTHONHASHSEED": "0",
            # A .pyc written by the install step stays "valid" after a same-size edit within the
            # same second (mtime resolution), and the tests would run the old code.
            "PYTHONDONTWRITEBYTECODE": "1",
            "TMPDIR": str(session.tmp),
            **self.toolchain_env(ca),
        }

    def make_venv(self) -> None:
        """The session's venv, from the python its commands find (none without one)."""
        toolchains.make_session_venv(self.session, self.python())

    def writable(self) -> tuple[Path, ...]:
        """The session's folders its commands write, bound at their own paths."""
        session = self.session
        return (session.repo, session.home, session.tmp, session.venv)

    def sandbox_policy(
        self,
        *,
        network: bool,
        mounts: Sequence[Mount] = (),
        ca_bundle: Path | None = None,
        user: str = AGENT_USER,
        **egress,
    ) -> SandboxPolicy:
        """What a task's command may reach in it (``egress``: the proxy's socket and relay, when on);
        ``user``: whose user it runs as in an image (SPEC §23): the agent's (``[agent] user``, else the
        image's User), the verifier's (``[verifier] user``, else the image's User) or the image's."""
        writable, mounts = self.writable(), tuple(mounts)
        if self.repo_view is not None:  # bound where the repository is, as the repository would be
            writable = tuple(path for path in writable if path != self.session.repo)
            mounts = (Mount(self.repo_view, str(self.session.repo), writable=True), *mounts)
        return SandboxPolicy(
            network=network,
            writable=writable,
            mounts=mounts,
            ca_bundle=ca_bundle,
            **self._root_fields(user),
            **egress,
        )

    def _root_fields(self, user: str) -> dict:
        return {"root": self.root}

    def exec(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        limits: Limits,
        policy: SandboxPolicy,
        stdin_data=None,
        meanwhile: Callable[[], None] | None = None,
    ) -> CommandResult:
        """One command, from the working directory, through the evaluation's spawner (``meanwhile``:
        the caller's work while it runs, ``Spawner.run``)."""
        return self.spawner.run(
            argv,
            cwd=Path(self.workdir),
            env=env,
            limits=limits,
            policy=policy,
            stdin_data=stdin_data,
            meanwhile=meanwhile,
        )

    def close(self) -> None:
        """Give back what it holds: nothing, for a root the evaluation only reads."""
        return None


class Host(BaseEnvironment):
    """The host's system folders, its language runtimes bound read-only by the spawner."""

    @property
    def root(self) -> Path:
        return Path("/")

    @property
    def label(self) -> str:
        return "the host"

    @property
    def command_path(self) -> str:
        return self.spawner.runtime.command_path()

    def find_program(self, name: str) -> str | None:
        return shutil.which(name, path=self.command_path)

    def check_programs(self, needed: dict[str, str]) -> None:
        """The host's programs are the operator's; the agent's interpreter is looked for on its own."""

    def _root_fields(self, user: str) -> dict:
        return {}


class Named(BaseEnvironment):
    """A root filesystem under ENVIRONMENTS_ROOT, as ``resolve`` found it."""

    def __init__(self, session: toolchains.Folders, spawner: Spawner, environment: Environment):
        super().__init__(session, spawner)
        self.environment = environment

    @property
    def root(self) -> Path:
        return self.environment.root

    @property
    def label(self) -> str:
        return f"environment {self.environment.name}"

    def cache_key(self) -> list[str] | None:
        return [self.environment.name, self.environment.identity]


class Image(BaseEnvironment):
    """An image's root, mounted in the session (``mounted``), pinned in the store while the evaluation runs.

    ``config`` is the image's (``Env``, ``WorkingDir``, ``User``), with the task's workdir over its
    WorkingDir; ``in_workdir``: the task has no repository, and its commands work in WorkingDir.
    """

    install_kept = False  # apt and pip write the image's layer, which no cache entry keeps (SPEC §21)
    agent_logs = True

    def __init__(
        self,
        session: toolchains.Folders,
        spawner: Spawner,
        *,
        ref: str,
        digest: str,
        config: dict,
        mounted: ImageRoot,
        store: ImageStore,
        in_workdir: bool,
        users: dict[str, tuple[int, int]] | None = None,
        folder: Path | None = None,
    ):
        super().__init__(session, spawner)
        self.ref = ref
        self.digest = digest
        self.config = config
        self.mounted = mounted
        self.store = store
        self.in_workdir = in_workdir
        # VERIFIER_USER, IMAGE_USER -> the uid and gid inside, for those that are not the map's user (the
        # agent's): Harbor's [verifier] user, else the image's User when [agent] user named another (SPEC §23).
        self.users = users or {}
        self.folder = folder or session.root  # where its root is mounted (images/rootfs.py: <folder>/rootfs)
        # Its compose volumes (SPEC §23, pipeline/services.py): folders of the session bound in every sandbox of it
        self.volumes: tuple[Mount, ...] = ()

    @property
    def root(self) -> Path:
        return self.mounted.rootfs

    @property
    def label(self) -> str:
        return f"image {self.ref}"

    def cache_key(self) -> list[str] | None:
        return [self.ref, self.digest.removeprefix("sha256:")[:24]]

    @property
    def working_dir(self) -> str:
        """The image's WorkingDir (``/`` when it names none)."""
        return self.config.get("WorkingDir") or "/"

    @property
    def workdir(self) -> str:
        return self.working_dir if self.in_workdir else super().workdir

    def open_workdir(self) -> int:
        """WorkingDir resolved in the image's root: a link anywhere on it, the image's or the agent's,
        is followed as if the root were ``/``; no host path through it is ever built."""
        if not self.in_workdir:
            return super().open_workdir()
        root_fd = inroot.open_root(self.root)
        try:
            return inroot.open_in(root_fd, self.working_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise BadEnvironment(f"the image's WorkingDir {self.working_dir} is gone ({exc.strerror})") from None
        finally:
            os.close(root_fd)

    def mount_point(self, target: str) -> None:
        make_mount_point(self.mounted, target)

    @property
    def command_path(self) -> str:
        return self.variables().get("PATH") or SYSTEM_PATH

    def variables(self) -> dict[str, str]:
        """The image's ``Env`` ("NAME=value" items) as a mapping."""
        items = self.config.get("Env") or []
        return dict(item.split("=", 1) for item in items if isinstance(item, str) and "=" in item)

    def toolchain_env(self, ca: toolchains.CaBundle | None) -> dict[str, str]:
        """SPEC §21: the image's PATH as it is, no venv or prefix of ours; caches in HOME, the host's CAs."""
        return toolchains.image_command_env(self.session.home, self.command_path, ca)

    def make_venv(self) -> None:
        """None: an image task runs with the image's own python (SPEC §21)."""

    def writable(self) -> tuple[Path, ...]:
        session = self.session
        return (session.repo, session.home, session.tmp)

    def sandbox_policy(self, *, mounts: Sequence[Mount] = (), **fields) -> SandboxPolicy:
        """As every kind's, with its compose volumes bound too (``bind_volumes``)."""
        return super().sandbox_policy(mounts=[*mounts, *self.bind_volumes()], **fields)

    def bind_volumes(self) -> tuple[Mount, ...]:
        """Its compose volumes, each on a real folder of its root made now (``mount_points``)."""
        return mount_points(self.mounted, self.volumes, self.label)

    def _root_fields(self, user: str) -> dict:
        if user in self.users:
            return {"image": dataclasses.replace(self.mounted, run_as=self.users[user])}
        return {"image": self.mounted}

    def verifier_owner(self) -> tuple[int, int] | None:
        idmap = self.mounted.idmap
        uid, gid = self.users.get(VERIFIER_USER) or (idmap.user, idmap.group)
        return idmap.host_uid(uid), idmap.host_gid(gid)

    def layers(self) -> list[Path]:
        """The image's layers in the store, lowest first."""
        return [self.store.layer_tree(layer) for layer in self.store.image(self.digest).layers]

    def isolate(self) -> None:
        """``[verifier] isolated``: the image plus only the working directory as the agent left it."""
        self.mounted = isolate_workdir(self.folder, self.layers(), self.mounted.idmap, self.workdir)

    def close(self) -> None:
        rootfs.unmount_root(self.folder)


class VerifierImage(Image):
    """A separate verifier's root (Harbor's ``environment_mode = "separate"``, SPEC §23): an image's,
    mounted in a folder of the session of its own, never the agent's root. Its commands get the
    session's HOME and /tmp (reset for the tests, as a shared verifier's) and its working directory
    in the image, but not the session's repo/, which the agent could write: nothing of the agent's
    reaches it but the artifacts the executor copies in."""

    def writable(self) -> tuple[Path, ...]:
        return (self.session.home, self.session.tmp)


class ServiceImage(Image):
    """A compose service's root (SPEC §23, pipeline/services.py): an image's, mounted in a folder of
    the session of its own, as a container of its own: nothing of the session bound in it, its /tmp
    its own root's."""

    def writable(self) -> tuple[Path, ...]:
        return ()

    def sandbox_policy(self, **fields) -> SandboxPolicy:
        return dataclasses.replace(super().sandbox_policy(**fields), image_tmp=True)


def mount_image(
    store: ImageStore,
    record,
    session_root: Path,
    *,
    lease: int,
    id_base: int,
    workdir: str,
    ca_host: Path | None,
    as_root: bool = False,
    agent_user: str | None = None,
    user_key: str = "task.toml: [agent] user",
) -> ImageRoot:
    """An image's root in ``session_root``: its layers idmapped onto ``lease`` and ``id_base``
    (runtime/idmap.py) under a writable layer of its own, its ``User`` the lease (``agent_user``,
    Harbor's [agent] user, instead when given; ``as_root``: its root, as a live sandbox's init,
    which starts each exec as the user it names; ``user_key`` names where ``agent_user`` was given,
    for its error: a compose service's ``user``), the host's CAs trusted in it, its ``workdir``
    made. ImageError says what is wrong with the image."""
    layers = [store.layer_tree(layer) for layer in record.layers]
    root = rootfs.mount_root(layers, session_root, IdMap(lease=lease, base=id_base))
    user = agent_user or (record.config or {}).get("User") or ""
    if not as_root and user and user not in ROOT_USERS:
        try:
            uid, gid = rootfs.resolve_user(root.rootfs, user)
        except ImageError as exc:  # the root is unmounted with the session, as after any failure here
            if agent_user:
                raise ImageError(f"{user_key} {agent_user!r} cannot run in the image: {exc}") from None
            raise
        if (uid, gid) != (0, 0):
            rootfs.unmount_root(session_root, remove=True)
            root = rootfs.mount_root(layers, session_root, IdMap(lease=lease, base=id_base, user=uid, group=gid))
    if ca_host is not None:
        trust_host_ca(root, ca_host)
    try:
        make_workdir(root, workdir)
    except OSError as exc:
        raise ImageError(f"the image's WorkingDir {workdir} cannot be a folder: {exc.strerror or exc}") from None
    return root


def user_ids(root: ImageRoot, user: str) -> tuple[int, int]:
    """``user`` (a name, a uid, with ``:group``) as ids inside ``root``, as Docker reads them."""
    return (0, 0) if user in ROOT_USERS else rootfs.resolve_user(root.rootfs, user)


def trust_host_ca(root: ImageRoot, ca_host: Path) -> None:
    """The image's CA bundle, if it has one where Debian-like systems keep it, becomes the host's
    (written into the root's own layer, owned by the image's root): tools that read only that
    file trust what the host trusts, and ``update-ca-certificates`` may still replace it."""
    try:  # the image's own file at that very path: no link on the way or at the end (SPEC §21)
        folder, name = open_parent(root.rootfs, DISTRIBUTION_CA_BUNDLE.lstrip("/"), create=False)
    except SafeFSError:
        return
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            return
        data = Path(ca_host).read_bytes()
        fd = os.open(name, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except FileNotFoundError:
        return
    finally:
        os.close(folder)
    try:  # copied up into the root's own layer
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchown(fd, root.idmap.host_uid(0), root.idmap.host_gid(0))
    finally:
        os.close(fd)


def make_workdir(root: ImageRoot, workdir: str) -> None:
    """WorkingDir exists, as a container runtime makes it (owned by the image's root): resolved in
    the image's root (its links followed as if it were ``/``, SPEC §21), the missing folders made.
    OSError says why it cannot be a folder."""
    root_fd = inroot.open_root(root.rootfs)
    try:
        os.close(inroot.mkdirs_in(root_fd, workdir, root.idmap.host_uid(0), root.idmap.host_gid(0), 0o755))
    finally:
        os.close(root_fd)


def mount_points(root: ImageRoot, mounts: tuple[Mount, ...], label: str) -> tuple[Mount, ...]:
    """``mounts`` (compose volumes), each on a real folder of ``root`` made now (``make_mount_point``:
    what a command left at that path is replaced, never followed); BadEnvironment says why not."""
    for mount in mounts:
        try:
            make_mount_point(root, mount.target)
        except (OSError, SafeFSError) as exc:
            raise BadEnvironment(f"could not make {mount.target} in {label} for its volume: {exc}") from None
    return mounts


def make_mount_point(root: ImageRoot, target: str) -> None:
    """A real folder at ``target`` in the image's root, made by the executor, nothing followed: an agent
    root in its image may have put a link where /logs goes; bwrap would follow it on the host. Walked
    from the root's handle one name at a time (SPEC §21): a link, a file or a FIFO on the way is
    replaced by a folder (the image's root's, 0755), never followed. OSError or SafeFSError says why not."""
    owner = root.idmap.host_uid(0), root.idmap.host_gid(0)
    fd = open_root_dir(root.rootfs)
    try:
        for name in target.strip("/").split("/"):
            try:
                mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                mode = None
            made = mode is None or not stat.S_ISDIR(mode)
            if made:
                if mode is not None:
                    os.unlink(name, dir_fd=fd)
                os.mkdir(name, 0o755, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child
            if made:
                os.fchown(fd, *owner)
    finally:
        os.close(fd)
