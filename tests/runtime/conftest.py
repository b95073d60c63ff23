"""Fixtures for the runtime tests: real processes under both runtimes.

``sp`` is a harness around one ``Spawner`` with a fresh eval id and session
folder, parametrised over NoSandbox, Bubblewrap, and Bubblewrap within a
phase (SPEC §25: each command an exec in the phase's one sandbox, the phase
ended after the test, so every runtime test holds for both ways a sandboxed
command runs). Its teardown fails the test if any process tagged with that
eval id is still alive. Where
bubblewrap does not work the bwrap half is skipped, or fails when
``REQUIRE_SANDBOX=1`` (as in CI).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from evaluations.runtime import Bubblewrap, NoSandbox, SandboxPolicy, Spawner, cgroups, killer, probe_bwrap
from evaluations.runtime.cgroupfs import probe, read_mounts
from evaluations.runtime.sandbox import usable_language_runtimes
from tests.runtime.support import DEFAULT_LIMITS, UID, give_to_sandbox_uid, tagged_alive


@pytest.fixture(scope="session")
def bwrap_probe():
    """Whether bubblewrap works here: runs ``bwrap ... true`` once per test run; (works, detail)."""
    return probe_bwrap()


def _bwrap_or_skip(bwrap_probe) -> Bubblewrap:
    works, detail = bwrap_probe
    if not works:
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail(f"REQUIRE_SANDBOX=1 but bubblewrap does not work here: {detail}")
        pytest.skip(f"bubblewrap does not work here: {detail}")
    return Bubblewrap(usable_language_runtimes(UID))


@pytest.fixture(params=["none", "bwrap", "phase"])
def runtime_mode(request) -> str:
    """How a harness's commands run: no sandbox, a bubblewrap each, or execs in a phase's sandbox."""
    return request.param


@pytest.fixture
def runtime(runtime_mode, bwrap_probe):
    """NoSandbox, then Bubblewrap (skipped or failed as the module says): a runtime object, starts nothing."""
    if runtime_mode == "none":
        return NoSandbox(usable_language_runtimes(UID))
    return _bwrap_or_skip(bwrap_probe)


@pytest.fixture
def bwrap_runtime(bwrap_probe):
    """The Bubblewrap runtime alone (skipped or failed where it does not work); starts nothing."""
    return _bwrap_or_skip(bwrap_probe)


@pytest.fixture
def session():
    """A session folder the unprivileged uid owns, under a path it can reach (/tmp); removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="te-runtime-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield give_to_sandbox_uid(path)
    shutil.rmtree(path, ignore_errors=True)


@dataclasses.dataclass
class Harness:
    spawner: Spawner
    runtime: object
    session: Path
    phase: contextlib.AbstractContextManager | None = None  # open for the harness's life (``end_phase``)

    def end_phase(self) -> None:
        """End the phase the harness's commands ran in (its sandbox and what is left in it)."""
        if self.phase is not None:
            self.phase.__exit__(None, None, None)
            self.phase = None

    @property
    def eval_id(self) -> str:
        return self.spawner.eval_id

    @property
    def own(self) -> set[int]:
        """The open phase's sandbox (not a command's process): what leftover checks pass over."""
        return self.spawner.phase_pids()

    @property
    def sandboxed(self) -> bool:
        return self.runtime.name == "bwrap"

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": self.runtime.command_path(), "HOME": str(self.session), "LANG": "C.UTF-8", **extra}

    def run(self, command, *, cwd=None, env=None, network=False, mounts=(), stdin_data=None, meanwhile=None, **limits):
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        return self.spawner.run(
            argv,
            cwd=cwd or self.session,
            env=self.env() if env is None else env,
            limits=dataclasses.replace(DEFAULT_LIMITS, **limits),
            policy=SandboxPolicy(network=network, writable=(self.session,), mounts=tuple(mounts)),
            stdin_data=stdin_data,
            meanwhile=meanwhile,
        )


def make_harness(runtime, session, *, in_phase: bool = False, **spawner_kwargs) -> Harness:
    eval_id = f"test-{uuid.uuid4().hex[:12]}"
    spawner = Spawner(eval_id=eval_id, session_dir=session, runtime=runtime, uid=UID, **spawner_kwargs)
    harness = Harness(spawner, runtime, session)
    if in_phase:
        # The init's folder beside the session, under /tmp, which the sandbox uid traverses.
        harness.phase = spawner.phase("test", init_base=session.parent)
        harness.phase.__enter__()
    return harness


@pytest.fixture
def harness_factory(runtime, runtime_mode, session):
    """harness_factory(live_log=..., cancel_event=...) -> Harness around a Spawner; its commands are real
    processes. After the test every harness's spawner sweeps (kills) what is left of its evaluation,
    and any process still alive fails the test."""
    made: list[Harness] = []

    def make(**spawner_kwargs) -> Harness:
        made.append(make_harness(runtime, session, in_phase=runtime_mode == "phase", **spawner_kwargs))
        return made[-1]

    yield make
    for harness in made:
        harness.end_phase()
    leftovers = {h.eval_id: tagged_alive(h.eval_id) for h in made}
    for harness in made:
        harness.spawner.sweep()
    assert not any(leftovers.values()), f"processes still alive after the test: {leftovers}"


@pytest.fixture
def sp(harness_factory) -> Harness:
    """One harness from ``harness_factory`` (both runtimes); its cleanup is the factory's."""
    return harness_factory()


@pytest.fixture
def bwrap_sp(bwrap_runtime, session):
    """A harness on Bubblewrap alone; after the test its spawner sweeps, and a process left alive fails it."""
    harness = make_harness(bwrap_runtime, session)
    yield harness
    leftovers = tagged_alive(harness.eval_id)
    harness.spawner.sweep()
    assert not leftovers, f"processes still alive after the test: {leftovers}"


@pytest.fixture
def support():
    """This host's cgroups under a parent of the test's own (removed after it); as root only."""
    reason = "not root" if os.geteuid() != 0 else None
    parent = f"te-test-{uuid.uuid4().hex[:10]}"
    found = probe(read_mounts(), parent) if reason is None else None
    if found is not None and not found.enforced:
        reason = found.detail
    if reason:
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail(f"REQUIRE_SANDBOX=1 but no cgroup can be made here: {reason}")
        pytest.skip(f"no cgroup can be made here: {reason}")
    yield found
    left = cgroups.remove_stale([], support=found)
    for folder in found.parents.values():
        folder.rmdir()
    killer.reap_orphans()  # escapees reparented to this process if an earlier test made it a subreaper
    assert not left, f"cgroups left by the test: {left}"
