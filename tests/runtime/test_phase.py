"""A phase's sandbox (SPEC §25, runtime/phase.py): one bubblewrap for the commands of a phase.

Every runtime test also runs with its commands in a phase (conftest.py's ``phase`` mode); these are
what only a phase has: which commands share a sandbox, what ends it, and the init's own guard.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest

from evaluations.runtime import SandboxPolicy, initbin, killer
from evaluations.runtime import spawner as spawner_module
from tests.helpers.polling import wait_for
from tests.runtime.conftest import make_harness
from tests.runtime.support import DEFAULT_LIMITS, UID, tagged_alive

# Which sandbox a command ran in: a marker left in its /dev/shm (a tmpfs of each bubblewrap's own)
# counts the commands that ran there before. (A namespace's inode number would not do: the kernel
# reuses it once the namespace is gone.)
PID_NS = ["bash", "-c", "ls /dev/shm | grep -c '^seen-' ; touch /dev/shm/seen-$RANDOM$RANDOM"]


@pytest.fixture
def phased(bwrap_runtime, session):
    """A harness whose commands run in an open phase; after the test the phase ends and no process
    carrying the evaluation's tag may be left (untagged escapees: test_kill.py, in every mode)."""
    harness = make_harness(bwrap_runtime, session, in_phase=True)
    yield harness
    harness.end_phase()
    assert not tagged_alive(harness.eval_id), "a process outlived its phase"


def _run(harness, argv, policy: SandboxPolicy, **limits):
    return harness.spawner.run(
        argv,
        cwd=harness.session,
        env=harness.env(),
        limits=dataclasses.replace(DEFAULT_LIMITS, **limits),
        policy=policy,
    )


def _policy(harness, **fields) -> SandboxPolicy:
    return SandboxPolicy(writable=(harness.session,), **fields)


def test_the_commands_of_a_phase_share_one_sandbox(phased):
    first, second = (phased.run(PID_NS) for _ in range(2))
    assert (first.output, second.output) == ("0\n", "1\n")  # the second saw the first's marker
    assert len(phased.spawner.phase_pids()) >= 3  # bubblewrap, its pid 1, the init


def test_without_a_phase_each_command_has_its_own(bwrap_sp):
    first, second = (bwrap_sp.run(PID_NS) for _ in range(2))
    assert first.output == second.output == "0\n"
    assert bwrap_sp.spawner.phase_pids() == set()


def test_another_policy_gets_another_sandbox_and_the_executors_own_commands_one_each(phased):
    assert [_run(phased, PID_NS, _policy(phased)).output for _ in range(3)] == ["0\n", "1\n", "2\n"]
    assert [_run(phased, PID_NS, _policy(phased, network=True)).output for _ in range(2)] == ["0\n", "1\n"]
    assert [_run(phased, PID_NS, _policy(phased, fresh_tmp=True)).output for _ in range(2)] == ["0\n", "0\n"]
    assert _run(phased, PID_NS, _policy(phased)).output == "3\n"  # the first sandbox, still there


def test_the_phase_ends_its_sandboxes(phased):
    phased.run("sleep 0.1 & echo ok")
    own = phased.spawner.phase_pids()
    assert own and tagged_alive(phased.eval_id)  # the sandbox waits for the next command
    phased.end_phase()
    assert phased.spawner.phase_pids() == set()
    assert not tagged_alive(phased.eval_id)


def test_a_command_cannot_trace_or_read_the_init(phased):
    """The init is not dumpable: the exit statuses it reports are the commands' own."""
    script = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "init = next(int(p) for p in os.listdir('/proc') if p.isdigit() and open(f'/proc/{p}/comm').read().strip() == 'te-init')\n"
        "print('attach', libc.ptrace(16, init, 0, 0), ctypes.get_errno())\n"
        "try:\n"
        "    open(f'/proc/{init}/environ', 'rb').read()\n"
        "    print('environ read')\n"
        "except PermissionError:\n"
        "    print('environ refused')\n"
    )
    result = phased.run(["python3", "-c", script])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["attach -1 1", "environ refused"]  # EPERM


def test_a_timeout_ends_the_sandbox_and_the_next_command_gets_another(phased):
    assert phased.run(PID_NS).output == "0\n"
    result = phased.run("sleep 60 & sleep 60", timeout_secs=1)
    assert result.limit == "timeout" and result.exit_code is None
    assert not tagged_alive(phased.eval_id, phased.own)
    assert phased.run(PID_NS).output == "0\n"  # a new sandbox


def test_a_command_that_kills_the_init_ends_its_own_sandbox_only(phased):
    result = phased.run("kill -9 $(pgrep -x te-init); sleep 5; echo survived")
    assert result.exit_code == 137 and "survived" not in result.output
    assert not tagged_alive(phased.eval_id, phased.own)
    assert phased.run("echo next").output == "next\n"


def test_stdin_and_exit_statuses_pass_through_an_exec(phased):
    assert phased.run("cat", stdin_data=b"fed\n").output == "fed\n"
    assert phased.run("exit 3").exit_code == 3
    assert phased.run("kill -TERM $$").exit_code == 143
    assert phased.run(["no-such-program-here"]).exit_code == 127


def test_phases_do_not_nest(phased):
    with pytest.raises(RuntimeError, match="do not nest"):
        with phased.spawner.phase("inner", init_base=phased.session.parent):
            pass


@pytest.fixture
def broken_init(tmp_path, monkeypatch):
    """An init that exits at once (its sandbox never says it runs)."""
    broken = tmp_path / "init"
    broken.mkdir()
    (broken / initbin.NAME).write_text("#!/bin/false\n")
    (broken / initbin.NAME).chmod(0o755)
    tmp_path.chmod(0o755)
    monkeypatch.setattr(initbin, "ensure_init", lambda base: broken)


@pytest.mark.usefixtures("broken_init")
def test_without_a_usable_init_each_command_runs_in_its_own_sandbox(bwrap_runtime, session):
    harness = make_harness(bwrap_runtime, session, in_phase=True)
    try:
        first, second = (harness.run(PID_NS) for _ in range(2))
        assert first.output == second.output == "0\n"  # no shared sandbox: each its own bubblewrap
    finally:
        harness.end_phase()
    assert not tagged_alive(harness.eval_id)


def test_without_a_compiler_for_the_init_each_command_runs_in_its_own_sandbox(bwrap_runtime, session, monkeypatch):
    def unavailable(base):
        raise initbin.InitUnavailable("live sandboxes need a C compiler to build their init")

    monkeypatch.setattr(initbin, "ensure_init", unavailable)
    harness = make_harness(bwrap_runtime, session, in_phase=True)
    try:
        first, second = (harness.run(PID_NS) for _ in range(2))
        assert first.output == second.output == "0\n"
    finally:
        harness.end_phase()
    assert not tagged_alive(harness.eval_id)


# -- the executor's own phase, and sandboxes started before their phase (Spawner.prestart) -----------


def _prestart(harness, name: str, policy: SandboxPolicy) -> set[int]:
    """Prestart ``name``; the pids of its bubblewrap and init, once /proc shows them carrying the
    evaluation's tag (bounded: read from another test's load, a just-started process's environment
    can be unreadable for a moment)."""
    harness.spawner.prestart(name, policy, DEFAULT_LIMITS, harness.session, init_base=harness.session.parent)

    def started() -> set[int]:
        alive = tagged_alive(harness.eval_id)
        return {proc.pid for proc in alive} if any(proc.name() == "te-init" for proc in alive) else set()

    return wait_for(started, timeout=60, what=f"the sandbox prestarted for {name} and its init")


def _executor_tmps(harness) -> list:
    return sorted(path.name for path in harness.session.glob(".executor-tmp-*"))


def test_an_executor_phase_shares_one_sandbox_and_one_fresh_tmp_among_its_commands(bwrap_sp):
    policy = _policy(bwrap_sp, fresh_tmp=True)
    with bwrap_sp.spawner.phase("patch", init_base=bwrap_sp.session.parent, executor=True):
        first = _run(
            bwrap_sp, [*PID_NS[:2], PID_NS[2] + "; ls -A /tmp | grep -c left-by; touch /tmp/left-by-first"], policy
        )
        second = _run(bwrap_sp, [*PID_NS[:2], PID_NS[2] + "; ls -A /tmp | grep left-by"], policy)
        assert len(_executor_tmps(bwrap_sp)) == 1  # one fresh /tmp, the sandbox's
    assert (first.output, second.output) == ("0\n0\n", "1\nleft-by-first\n")  # one sandbox and its /tmp
    assert _executor_tmps(bwrap_sp) == []  # removed with the sandbox
    assert not tagged_alive(bwrap_sp.eval_id)
    # Outside such a phase, each executor command has a sandbox and a /tmp of its own again.
    assert [_run(bwrap_sp, PID_NS, policy).output for _ in range(2)] == ["0\n", "0\n"]


def test_a_prestarted_sandbox_is_the_one_its_phase_runs_in(bwrap_sp):
    """Started before its phase, while another command runs apart from it (as the agent's patch
    sandbox while the agent runs): that command cannot see it, the phase's commands run in it."""
    policy = _policy(bwrap_sp, fresh_tmp=True)
    own = _prestart(bwrap_sp, "patch", policy)  # its bubblewrap and init, launched before anything else ran
    apart = bwrap_sp.run("ls /proc | grep -c '^[0-9]'; pgrep -x te-init || echo no-init")
    assert apart.exit_code == 0 and apart.output.splitlines()[1] == "no-init", apart.output
    with bwrap_sp.spawner.phase("patch", init_base=bwrap_sp.session.parent, executor=True):
        assert own <= bwrap_sp.spawner.phase_pids()  # taken, alive after the thread that awaited it ended
        assert _run(bwrap_sp, PID_NS, policy).output == "0\n"
        assert _run(bwrap_sp, PID_NS, policy).output == "1\n"
        assert own <= bwrap_sp.spawner.phase_pids()
    assert not tagged_alive(bwrap_sp.eval_id)


def test_a_prestarted_sandbox_no_phase_takes_is_ended(bwrap_sp):
    assert _prestart(bwrap_sp, "patch", _policy(bwrap_sp, fresh_tmp=True)) and len(_executor_tmps(bwrap_sp)) == 1
    bwrap_sp.spawner.end_prestart("patch")
    assert not tagged_alive(bwrap_sp.eval_id) and _executor_tmps(bwrap_sp) == []
    _prestart(bwrap_sp, "tests", _policy(bwrap_sp))
    bwrap_sp.spawner.close()  # the evaluation's end ends any left
    assert not tagged_alive(bwrap_sp.eval_id)


def test_a_prestarted_sandbox_killed_before_its_phase_is_replaced(bwrap_sp):
    """A limit's kill of another command kills every process of the evaluation, the prestarted
    sandbox's too: its phase finds it dead, says so, and its commands get a new one."""
    policy = _policy(bwrap_sp)
    _prestart(bwrap_sp, "tests", policy)
    result = bwrap_sp.run("sleep 60", timeout_secs=1)
    assert result.limit == "timeout"
    with bwrap_sp.spawner.phase("tests", init_base=bwrap_sp.session.parent):
        assert [_run(bwrap_sp, PID_NS, policy).output for _ in range(2)] == ["0\n", "1\n"]
    assert not tagged_alive(bwrap_sp.eval_id)


def test_a_prestarted_sandbox_runs_its_early_commands_in_itself_before_its_phase(bwrap_sp):
    """``then`` (the patch's reading of the base while the agent runs): its commands are execs in the
    prestarted sandbox, awaited by the phase, which then runs in the same sandbox (its /tmp, its
    pid namespace); what an early command left running is cleared before the phase's first exec."""
    policy = _policy(bwrap_sp, fresh_tmp=True)
    early = []

    def then(run):
        early.append(run(["bash", "-c", "touch /tmp/early; sleep 600 & echo started"], cwd=bwrap_sp.session,
                         env=bwrap_sp.env(), timeout_secs=60))  # fmt: skip
        early.append(run(["bash", "-c", "exit 3"], cwd=bwrap_sp.session, env=bwrap_sp.env(), timeout_secs=60))

    bwrap_sp.spawner.prestart(
        "patch", policy, DEFAULT_LIMITS, bwrap_sp.session, init_base=bwrap_sp.session.parent, then=then
    )
    with bwrap_sp.spawner.phase("patch", init_base=bwrap_sp.session.parent, executor=True):
        assert [(r.exit_code, r.output, r.limit) for r in early] == [(0, "started\n", None), (3, "", None)]
        assert (
            _run(bwrap_sp, ["bash", "-c", "ls /tmp | grep -c ^early; pgrep -x sleep || echo none"], policy).output
            == "1\nnone\n"
        )
    assert not tagged_alive(bwrap_sp.eval_id)


def test_an_early_command_past_its_time_is_a_timeout_and_goes_with_the_phase(bwrap_sp):
    policy = _policy(bwrap_sp, fresh_tmp=True)
    early = []
    bwrap_sp.spawner.prestart(
        "patch", policy, DEFAULT_LIMITS, bwrap_sp.session, init_base=bwrap_sp.session.parent,
        then=lambda run: early.append(run(["sleep", "600"], cwd=bwrap_sp.session, env=bwrap_sp.env(), timeout_secs=1)),
    )  # fmt: skip
    with bwrap_sp.spawner.phase("patch", init_base=bwrap_sp.session.parent, executor=True):
        assert early[0].limit == "timeout" and early[0].exit_code is None
        assert _run(bwrap_sp, ["bash", "-c", "pgrep -x sleep || echo none"], policy).output == "none\n"
    assert not tagged_alive(bwrap_sp.eval_id)


def test_work_beside_runs_in_the_prestarted_sandbox_while_another_phase_runs_its_commands(bwrap_sp):
    """``beside`` (the agent's patch while the tests run): its commands run on a thread of their own,
    in the sandbox prestarted for their phase, at the same time as another phase's commands on this
    thread; the phase waits for them, then runs in the same sandbox."""
    executor, tests = _policy(bwrap_sp, fresh_tmp=True), _policy(bwrap_sp)
    folder, early = bwrap_sp.session, []
    bwrap_sp.spawner.prestart("patch", executor, DEFAULT_LIMITS, folder, init_base=folder.parent)
    # Each waits for the other's file: neither ends unless both run at once (bounded: 60 s, then exit 1).
    wait = "for i in $(seq 600); do test -f {0} && break; sleep 0.1; done; test -f {0}"
    beside = f"touch {folder}/beside-runs; {wait.format(f'{folder}/tests-ran')}"

    def work(run):
        early.append(run(["bash", "-c", beside], cwd=folder, env=bwrap_sp.env(), timeout_secs=120))
        early.append(run(["bash", "-c", "touch /tmp/beside; echo $$"], cwd=folder, env=bwrap_sp.env(), timeout_secs=60))

    assert bwrap_sp.spawner.beside("patch", work)
    assert not bwrap_sp.spawner.beside("agent", work)  # nothing prestarted for it: nothing runs
    with bwrap_sp.spawner.phase("tests", init_base=folder.parent):
        ran = _run(
            bwrap_sp, ["bash", "-c", f"{wait.format(f'{folder}/beside-runs')} && touch {folder}/tests-ran"], tests
        )
    assert ran.exit_code == 0, ran.output
    with bwrap_sp.spawner.phase("patch", init_base=folder.parent, executor=True):
        assert [(r.exit_code, r.limit) for r in early] == [(0, None), (0, None)], [r.output for r in early]
        assert _run(bwrap_sp, ["bash", "-c", "ls /tmp/beside"], executor).output == "/tmp/beside\n"  # the same sandbox
    assert not tagged_alive(bwrap_sp.eval_id)


def test_ending_a_prestart_ends_its_work_beside_without_waiting_for_it(bwrap_sp):
    """A cancel, or an evaluation that ends before the phase comes: the sandbox is told to end first,
    and the work's command ends with it, not at its own timeout."""
    folder, early = bwrap_sp.session, []
    bwrap_sp.spawner.prestart(
        "patch", _policy(bwrap_sp, fresh_tmp=True), DEFAULT_LIMITS, folder, init_base=folder.parent
    )
    command = ["bash", "-c", f"touch {folder}/started; sleep 600"]
    bwrap_sp.spawner.beside(
        "patch", lambda run: early.append(run(command, cwd=folder, env=bwrap_sp.env(), timeout_secs=300))
    )
    wait_for(lambda: (folder / "started").exists(), timeout=60)
    bwrap_sp.spawner.end_prestart("patch")
    assert len(early) == 1 and early[0].limit is None and early[0].exit_code != 0  # ended, not timed out
    assert not tagged_alive(bwrap_sp.eval_id)


@pytest.mark.usefixtures("broken_init")
def test_a_prestart_without_a_usable_init_runs_no_early_command(bwrap_sp):
    called = []
    bwrap_sp.spawner.prestart(
        "tests", _policy(bwrap_sp), DEFAULT_LIMITS, bwrap_sp.session, init_base=bwrap_sp.session.parent,
        then=called.append,
    )  # fmt: skip
    bwrap_sp.spawner.end_prestart("tests")
    assert called == []


@pytest.mark.usefixtures("broken_init")
def test_a_prestart_without_a_usable_init_leaves_its_phase_a_bubblewrap_each(bwrap_sp):
    policy = _policy(bwrap_sp)
    bwrap_sp.spawner.prestart("tests", policy, DEFAULT_LIMITS, bwrap_sp.session, init_base=bwrap_sp.session.parent)
    with bwrap_sp.spawner.phase("tests", init_base=bwrap_sp.session.parent):
        assert [_run(bwrap_sp, PID_NS, policy).output for _ in range(2)] == ["0\n", "0\n"]
    assert not tagged_alive(bwrap_sp.eval_id)


def test_a_retired_phase_sandbox_ends_on_its_own_and_is_collected_by_the_next_end(bwrap_sp):
    policy = _policy(bwrap_sp, fresh_tmp=True)
    with bwrap_sp.spawner.phase("patch", init_base=bwrap_sp.session.parent, executor=True, retire=True):
        assert _run(bwrap_sp, ["bash", "-c", "sleep 300.25 & echo started"], policy).output == "started\n"
        assert bwrap_sp.spawner.phase_pids()
    assert bwrap_sp.spawner.phase_pids() == set()  # no command can start in it any more
    wait_for(lambda: not tagged_alive(bwrap_sp.eval_id), timeout=30, what="the retired sandbox to end by itself")
    assert len(_executor_tmps(bwrap_sp)) == 1  # its /tmp goes when its end is collected
    bwrap_sp.spawner.end_phase()
    assert _executor_tmps(bwrap_sp) == []


def test_a_phase_that_raises_ends_its_sandboxes_at_once_even_when_it_would_retire_them(bwrap_sp):
    policy = _policy(bwrap_sp, fresh_tmp=True)
    with pytest.raises(RuntimeError, match="the step failed"):
        with bwrap_sp.spawner.phase("patch", init_base=bwrap_sp.session.parent, executor=True, retire=True):
            _run(bwrap_sp, ["true"], policy)
            raise RuntimeError("the step failed")
    assert not tagged_alive(bwrap_sp.eval_id) and _executor_tmps(bwrap_sp) == []


def test_with_a_cgroup_a_sandbox_is_cleared_looking_only_at_the_evaluations_processes(
    bwrap_runtime, session, support, monkeypatch
):
    """Where the evaluation has a cgroup, what a command left is found among the cgroup's members
    (every process of the sandbox is one) rather than among every process of the host."""
    runtime = copy.copy(bwrap_runtime)
    runtime.cgroups = support
    looked_at = []
    whole_host = killer.processes

    def spy(pids=None):
        looked_at.append(None if pids is None else sorted(pids))
        return whole_host(pids)

    monkeypatch.setattr(killer, "processes", spy)
    harness = make_harness(runtime, session, in_phase=True)
    try:
        left = harness.run("touch /dev/shm/seen-first; setsid sleep 300.75 </dev/null >/dev/null 2>&1 & echo started")
        assert left.output == "started\n"
        assert not [
            p for p in tagged_alive(harness.eval_id, harness.spawner.phase_pids()) if "300.75" in " ".join(p.cmdline())
        ]
        assert harness.run(PID_NS).output == "1\n"  # the same sandbox, its leftover gone
        members = [pids for pids in looked_at if pids is not None]
        assert members and all(len(pids) < 20 for pids in members), looked_at  # the cgroup's few, not the host's
    finally:
        harness.end_phase()
        harness.spawner.close()
    assert not tagged_alive(harness.eval_id)


def _cgroup_dirs(harness, support) -> list:
    return [parent / harness.eval_id for parent in support.parents.values()]


def test_the_cgroup_made_ahead_is_the_one_the_first_command_joins(bwrap_runtime, session, support):
    """``make_cgroup_ahead``: the evaluation's cgroup is made in a thread as it starts (the pipeline's
    download goes on meanwhile); the first command awaits it and runs in it, with its own limits."""
    runtime = copy.copy(bwrap_runtime)
    runtime.cgroups = support
    harness = make_harness(runtime, session)
    try:
        harness.spawner.make_cgroup_ahead(dataclasses.replace(DEFAULT_LIMITS, memory_bytes=300 * 1024 * 1024))
        wait_for(lambda: all(d.is_dir() for d in _cgroup_dirs(harness, support)), what="the cgroup made ahead")
        assert harness.spawner.cgroup is None  # the first command takes it
        assert harness.run("true").exit_code == 0
        made = harness.spawner.cgroup
        assert made is not None and sorted(made.dirs.values()) == sorted(_cgroup_dirs(harness, support))
        assert made.peak_memory_bytes() > 0  # the command was charged there (its namespace shows it "/")
        assert made.memory_limit_bytes == DEFAULT_LIMITS.memory_bytes  # the command's, not 300 MiB
    finally:
        harness.spawner.close()
    assert not any(d.exists() for d in _cgroup_dirs(harness, support))


def test_a_cgroup_made_ahead_for_no_command_is_removed_and_a_failure_is_the_first_commands(
    bwrap_runtime, session, support
):
    runtime = copy.copy(bwrap_runtime)
    runtime.cgroups = support
    unused = make_harness(runtime, session)
    unused.spawner.make_cgroup_ahead(DEFAULT_LIMITS)
    wait_for(lambda: all(d.is_dir() for d in _cgroup_dirs(unused, support)), what="the cgroup made ahead")
    unused.spawner.close()  # the evaluation ended before any command (a task that could not be read)
    assert not any(d.exists() for d in _cgroup_dirs(unused, support))

    failed = make_harness(runtime, session)
    failed.spawner.make_cgroup_ahead(dataclasses.replace(DEFAULT_LIMITS, max_processes=0))
    try:
        with pytest.raises(ValueError, match="limits must be positive"):
            failed.run("true")
    finally:
        failed.spawner.close()
    assert not any(d.exists() for d in _cgroup_dirs(failed, support))


# -- the held launcher (spawner._HeldLaunch): the next command's launcher, in the cgroups already ----


@pytest.fixture
def held(bwrap_runtime, session, support):
    """A harness whose evaluation has a cgroup (so launchers are held); after the test, closed: no
    launcher and no cgroup folder left."""
    runtime = copy.copy(bwrap_runtime)
    runtime.cgroups = support
    harness = make_harness(runtime, session)
    yield harness
    harness.spawner.close()
    assert harness.spawner._held is None
    assert not any(d.exists() for d in _cgroup_dirs(harness, support))


def _uid_and_environ(pid: int) -> tuple[int, bytes]:
    with open(f"/proc/{pid}/status") as status:
        uid = next(int(line.split()[1]) for line in status if line.startswith("Uid:"))
    with open(f"/proc/{pid}/environ", "rb") as environ:
        return uid, environ.read()


def test_the_next_commands_launcher_waits_in_the_cgroups_and_runs_the_next_command(held, monkeypatch):
    """Held once the cgroup is made (``hold_launch``: before any command) and after each launch: in
    every hierarchy of the evaluation's cgroup, as root, without the evaluation's tag; the next
    command is started by it (its pid is the held one's) and runs as any command does."""
    spawner = held.spawner
    used = []
    go = spawner_module._HeldLaunch.go

    def spy(self, *args):
        proc = go(self, *args)
        used.append((self.proc.pid, proc))
        return proc

    monkeypatch.setattr(spawner_module._HeldLaunch, "go", spy)
    spawner.make_cgroup_ahead(DEFAULT_LIMITS)
    spawner.hold_launch()
    first_held = spawner._held
    assert first_held is not None
    wait_for(lambda: first_held.proc.pid in spawner.cgroup.pids(), what="the held launcher in the cgroup")
    uid, environ = _uid_and_environ(first_held.proc.pid)
    assert uid == 0 and killer.TAG_VAR.encode() not in environ  # no sweep of the evaluation's takes it
    first = held.run("id -u; echo $TERM_EXECUTOR_EVAL")
    assert first.exit_code == 0 and first.output.splitlines() == [str(UID), held.eval_id], first.output
    assert used == [(first_held.proc.pid, first_held.proc)]  # the command's process was the held launcher
    assert spawner._held is not None and spawner._held is not first_held  # the next one, held already
    # The evaluation's processes leave it out, and its process limit allows for it.
    wait_for(lambda: spawner._held.proc.pid in spawner.cgroup.pids(), what="the next launcher in the cgroup")
    assert spawner.cgroup.usage().processes == 0
    pids = spawner.cgroup.dirs.get("pids") or spawner.cgroup.dirs["unified"]  # v1, v2
    assert int((pids / "pids.max").read_text()) == DEFAULT_LIMITS.max_processes + 1
    second = held.run("echo second")
    assert second.output == "second\n" and len(used) == 2


def test_a_held_launcher_is_ended_by_close_and_one_killed_with_the_cgroup_is_not_used(held):
    spawner = held.spawner
    assert held.run("true").exit_code == 0
    killed = spawner._held
    assert killed is not None
    spawner.cgroup.kill()  # a verdict over the whole evaluation kills every member of the cgroup
    wait_for(lambda: killed.proc.poll() is not None, what="the held launcher killed with the cgroup")
    after = held.run("echo still runs")
    assert after.exit_code == 0 and after.output == "still runs\n"  # a launcher of its own
    unused = spawner._held
    assert unused is not None and unused is not killed
    spawner.close()
    assert unused.proc.returncode == 0  # told to end (its socket's end of file): exit 0, nothing run


def test_a_command_cannot_signal_the_launcher_held_beside_it(held):
    """The launcher held while a command runs (the next command's) is root's and outside the
    command's pid namespace: the command, told its host pid, can neither see nor kill it."""
    spawner = held.spawner
    assert held.run("true").exit_code == 0
    told = held.session / "held-pid"
    beside = []

    def tell() -> None:
        beside.append(spawner._held)
        told.write_text(str(spawner._held.proc.pid))

    script = f"until [ -s {told} ]; do sleep 0.01; done; kill -9 $(cat {told}) 2>&1; echo kill=$?"
    result = held.run(script, meanwhile=tell)
    assert result.output.endswith("kill=1\n") and "No such process" in result.output, result.output
    assert beside[0] is spawner._held and spawner._held.proc.poll() is None  # still held, alive
