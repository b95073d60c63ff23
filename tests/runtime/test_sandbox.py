"""What a sandboxed command can and cannot reach, and how the runtime is chosen."""

from __future__ import annotations

import array
import dataclasses
import logging
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from evaluations.network.egress import SANDBOX_SOCKET
from evaluations.runtime import Mount, NoSandbox, SandboxUnavailable, Spawner, initbin, select_runtime
from evaluations.runtime.monitor import folder_usage
from evaluations.runtime.policy import RLimits, SandboxPolicy, Tools, bwrap_flags, render
from tests.runtime.support import UID


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a root-owned file")
def test_a_root_only_file_in_a_writable_folder_is_unreadable(sp):
    secret = sp.session / "secret"
    secret.write_text("top secret\n")
    os.chown(secret, 0, 0)
    os.chmod(secret, 0o600)
    result = sp.run("cat secret")
    assert result.exit_code != 0
    assert "Permission denied" in result.output
    assert "top secret" not in result.output


def test_uid_is_not_root(sp):
    assert sp.run("id -u").output.strip() != "0"


def test_python_on_the_command_path_starts(sp):
    result = sp.run(["python3", "-c", "print(6 * 7)"])
    assert (result.exit_code, result.output) == (0, "42\n")


def test_every_offered_language_runtime_is_reachable(sp):
    for prefix in sp.runtime.language_runtimes:
        assert sp.run(["ls", f"{prefix}/bin"]).exit_code == 0, prefix


def test_host_processes_are_invisible(bwrap_sp):
    result = bwrap_sp.run("ps -eo pid=,comm=; true")
    assert sorted(result.output.split()[1::2]) == ["bash", "bwrap", "ps"]  # the sandbox's own only
    assert sorted(int(pid) for pid in result.output.split()[::2])[0] == 1


def test_only_system_folders_are_visible(bwrap_sp):
    result = bwrap_sp.run("ls /; ls /etc")
    visible = set(result.output.split())
    assert {"usr", "etc", "tmp", "proc", "dev"} <= visible
    assert not visible & {"root", "home", "work", "opt", "shadow", "resolv.conf"}
    assert bwrap_sp.run("ls /var").output == "tmp\n"
    assert bwrap_sp.run("touch /usr/x").exit_code != 0


def test_nothing_in_ram_is_writable_but_a_capped_dev_shm(bwrap_sp):
    # The sandbox root and /dev are tmpfs: files there would be memory that no limit sees.
    assert "Read-only file system" in bwrap_sp.run("touch /x").output
    assert "Read-only file system" in bwrap_sp.run("touch /dev/x").output
    fill = bwrap_sp.run("dd if=/dev/zero of=/dev/shm/fill bs=1M count=100 status=none")
    assert fill.exit_code != 0 and "No space left on device" in fill.output
    semaphore = bwrap_sp.run(["python3", "-c", "import multiprocessing as m; m.Lock(); print('ok')"])
    assert semaphore.output == "ok\n"  # POSIX shared memory still works


def test_tmp_is_the_session_tmp_folder(bwrap_sp):
    assert bwrap_sp.run("echo hi > /tmp/probe").exit_code == 0
    assert (bwrap_sp.session / "tmp" / "probe").read_text() == "hi\n"


@pytest.fixture
def host_listener():
    """A TCP socket listening on the host's loopback."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


def test_no_command_shares_the_hosts_network(bwrap_sp, host_listener):
    connect = f"exec 3<>/dev/tcp/127.0.0.1/{host_listener} && echo connected"
    interfaces = "cat /proc/net/dev | tail -n +3 | cut -d: -f1"
    for network in (False, True):  # "on" without the evaluation's proxy is no network at all: closed
        cut_off = bwrap_sp.run(connect, network=network)
        assert cut_off.exit_code != 0 and "connected" not in cut_off.output
        assert bwrap_sp.run(interfaces, network=network).output.split() == ["lo"]


def test_mounts_are_bound_as_asked(bwrap_sp):
    assets = bwrap_sp.session.parent / f"{bwrap_sp.session.name}-assets"
    assets.mkdir()
    (assets / "corpus.txt").write_text("words\n")  # root's, world-readable, as operators' assets are
    try:
        mounts = [Mount(assets, "/static/corpus")]
        assert bwrap_sp.run("cat /static/corpus/corpus.txt", mounts=mounts).output == "words\n"
        assert bwrap_sp.run("touch /static/corpus/new", mounts=mounts).exit_code != 0
    finally:
        (assets / "corpus.txt").unlink()
        assets.rmdir()


def test_bwrap_argv_is_built_from_data():
    where = dict(cwd=Path("/s/repo"), env={"PATH": "/usr/bin", "A": "1"})
    policy = SandboxPolicy(
        namespaces=True,
        private_tmp=Path("/s/tmp"),
        writable=(Path("/s/repo"),),
        mounts=(Mount(Path("/assets/x"), "/static/x"),),
        runtimes=("/opt/python",),
    )
    closed = bwrap_flags(policy, **where)
    opened = bwrap_flags(dataclasses.replace(policy, network=True), **where)
    pairs = list(zip(closed, closed[1:], strict=False))
    assert "--unshare-net" in closed and "--unshare-net" in opened  # egress goes through the proxy only
    assert "/etc/resolv.conf" not in opened  # nothing resolves names inside: the proxy does
    for flag in ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session"):
        assert flag in closed
    assert ("--bind", "/s/tmp") in pairs and ("/s/tmp", "/tmp") in pairs
    assert ("--bind", "/s/repo") in pairs
    assert ("--ro-bind", "/assets/x") in pairs and ("--ro-bind", "/opt/python") in pairs
    assert ("--chdir", "/s/repo") in pairs
    assert closed[closed.index("--clearenv") + 1 :] == ["--setenv", "PATH", "/usr/bin", "--setenv", "A", "1"]
    assert not any(flag.endswith("bind") and src == "/" for flag, src in pairs)
    with pytest.raises(ValueError, match="bind / as a whole"):
        bwrap_flags(dataclasses.replace(policy, writable=(Path("/"),)), **where)


def test_render_puts_the_cgroup_first_and_the_relay_before_the_command():
    tools = Tools(setpriv="/usr/bin/setpriv", prlimit="/usr/bin/prlimit", bwrap="/usr/bin/bwrap")
    policy = SandboxPolicy(
        namespaces=True,
        network=True,
        uid=60001,
        rlimits=RLimits(fsize_bytes=1024, nproc=10),
        egress_socket=Path("/s/egress.sock"),
        relay_init=Path("/s/.sandbox-init-x"),
        cgroup_procs=(Path("/sys/fs/cgroup/memory/x/e/cgroup.procs"),),
    )
    rendered = render(policy, ["python3", "agent.py"], cwd=Path("/s/repo"), env={"PATH": "/usr/bin"}, tools=tools)
    argv = rendered.argv
    assert argv[:3] == ["/bin/sh", "-c", argv[2]] and "/sys/fs/cgroup/memory/x/e/cgroup.procs" in argv[:6]
    assert argv.index("/usr/bin/setpriv") < argv.index("/usr/bin/prlimit") < argv.index("/usr/bin/bwrap")
    assert argv.index("/sys/fs/cgroup/memory/x/e/cgroup.procs") < argv.index("/usr/bin/setpriv")
    command = argv[argv.index("--", argv.index("/usr/bin/bwrap")) + 1 :]
    relay = ["/run/egress-relay/te-init", "--relay", "3128", SANDBOX_SOCKET, "--"]  # the init, bound below
    assert command == [*relay, "python3", "agent.py"]  # the relay listens, then execs the command
    pairs = list(zip(argv, argv[1:], strict=False))
    assert ("/s/egress.sock", SANDBOX_SOCKET) in pairs and ("/s/.sandbox-init-x", "/run/egress-relay") in pairs
    assert ("HTTPS_PROXY", "http://127.0.0.1:3128") in pairs and ("NO_PROXY", "localhost,127.0.0.1,::1") in pairs
    assert ("--setenv", "PATH") in pairs  # the caller's environment stays
    without_socket = render(
        dataclasses.replace(policy, egress_socket=None), ["true"], cwd=Path("/"), env={}, tools=tools
    )
    assert "--relay" not in without_socket.argv and "HTTPS_PROXY" not in without_socket.argv
    assert "/run/egress-relay" not in without_socket.argv
    with pytest.raises(ValueError, match="relay_init"):  # whatever the root: the relay is ours, never the root's
        render(dataclasses.replace(policy, relay_init=None), ["true"], cwd=Path("/"), env={}, tools=tools)


def test_select_runtime_none_only_when_told(caplog):
    with caplog.at_level(logging.WARNING, logger="evaluations.runtime.sandbox"):
        none = select_runtime("none")
    assert isinstance(none, NoSandbox)
    assert none.warning.startswith("SANDBOX=none: network isolation") and "SANDBOX=none" in caplog.text


@pytest.mark.parametrize("mode", ["auto", "bwrap"])
def test_select_runtime_never_falls_back_when_bubblewrap_is_missing(mode):
    with pytest.raises(SandboxUnavailable) as caught:
        select_runtime(mode, bwrap="/nonexistent/bwrap")
    assert str(caught.value) == (
        f"SANDBOX={mode} but bubblewrap is not installed (/nonexistent/bwrap: not found), and agent code does not "
        "run unsandboxed unless told to: install the bubblewrap package (apt-get install bubblewrap), or set "
        "SANDBOX=none to run it without a sandbox"
    )


@pytest.mark.parametrize("mode", ["auto", "bwrap"])
def test_select_runtime_never_falls_back_when_bubblewrap_does_not_work(mode):
    folder = Path(tempfile.mkdtemp(prefix="te-broken-bwrap-", dir="/tmp"))  # reachable by the sandbox uid
    broken = folder / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    broken.chmod(0o755)
    os.chmod(folder, 0o755)
    try:
        with pytest.raises(SandboxUnavailable) as caught:
            select_runtime(mode, bwrap=str(broken))
    finally:
        shutil.rmtree(folder)
    message = str(caught.value)
    assert message.startswith(f"SANDBOX={mode} but bubblewrap does not work here: {broken} exited 1: ")
    assert "Permission denied" in message and message.endswith(
        "or set SANDBOX=none to run agent code without a sandbox"
    )


def test_select_runtime_bwrap_works_here(bwrap_runtime):
    assert select_runtime("bwrap").name == "bwrap"
    assert select_runtime("auto").name == "bwrap"


def test_folder_usage_counts_blocks_and_files_once_and_follows_no_link(tmp_path):
    (tmp_path / "data").write_bytes(os.urandom(4 * 1024 * 1024))
    os.link(tmp_path / "data", tmp_path / "hardlink")
    with open(tmp_path / "sparse", "wb") as sparse:
        sparse.truncate(100 * 1024**3)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(8 * 1024 * 1024))
    (tmp_path / "link").symlink_to(outside)
    try:
        usage = folder_usage(tmp_path)
        assert 4 * 1024 * 1024 <= usage.bytes < 5 * 1024 * 1024
        assert usage.files == 4  # the folder, data (= hardlink), sparse, link; nothing of outside
    finally:
        (outside / "big").unlink()
        outside.rmdir()


def test_root_needs_an_unprivileged_uid():
    if os.geteuid() != 0:
        pytest.skip("only root must name a uid")
    with pytest.raises(ValueError, match="unprivileged uid"):
        Spawner(eval_id="no-uid", session_dir=Path("/tmp"), runtime=NoSandbox(), uid=None)
    assert UID not in (None, 0)


def test_mount_points_below_tmp_are_real_folders_of_ours_whatever_the_tmp_held(tmp_path):
    """Issue 23: what stands where a bind's mount point goes in the private tmp (a link, a file,
    a folder a command made) is replaced by a real folder of ours; a link's target is untouched."""
    from evaluations.runtime.sandbox import prepare_mount_points

    tmp, outside = tmp_path / "tmp", tmp_path / "outside"
    tmp.mkdir()
    outside.mkdir()
    (tmp / "sessions").symlink_to(outside)  # where /tmp/sessions/... would have been resolved
    (tmp / "other").write_text("in the way\n")
    repo, agent_file = tmp_path / "repo", tmp_path / "prompt.md"
    repo.mkdir()
    agent_file.write_text("x\n")
    policy = SandboxPolicy(
        writable=(repo,),
        mounts=(Mount(repo, "/tmp/sessions/e1/repo"), Mount(agent_file, "/tmp/other/e1/prompt.md")),
        private_tmp=tmp,
    )
    prepare_mount_points(policy)
    for folder in ("sessions", "sessions/e1", "sessions/e1/repo", "other", "other/e1"):
        st = (tmp / folder).lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o755, folder
    assert (tmp / "other/e1/prompt.md").is_file() and not (tmp / "other/e1/prompt.md").is_symlink()
    assert list(outside.iterdir()) == []
    nested = dataclasses.replace(policy, mounts=(Mount(repo, "/tmp/a"), Mount(repo, "/tmp/a/b")))
    with pytest.raises(ValueError, match="inside another bind"):
        prepare_mount_points(nested)


def test_render_with_the_launcher_puts_every_step_before_bwrap_in_one_exec():
    tools = Tools(setpriv="/usr/bin/setpriv", prlimit="/usr/bin/prlimit", bwrap="/usr/bin/bwrap", launcher="/x/te-init")
    policy = SandboxPolicy(
        namespaces=True,
        uid=60001,
        rlimits=RLimits(fsize_bytes=1024, nproc=10),
        cgroup_procs=(Path("/cg/memory/e/cgroup.procs"), Path("/cg/pids/e/cgroup.procs")),
        netns=Path("/run/netns/e"),
    )
    argv = render(policy, ["true"], cwd=Path("/"), env={}, tools=tools).argv
    bwrap = argv.index("/usr/bin/bwrap")
    assert argv[:bwrap] == [
        "/x/te-init", "--launch",
        "--cgroup", "/cg/memory/e/cgroup.procs", "--cgroup", "/cg/pids/e/cgroup.procs",
        "--netns", "/run/netns/e",
        "--uid", "60001",
        "--fsize", "1024", "--nproc", "10", "--core", "0",
        "--",
    ]  # fmt: skip
    assert not {"/usr/bin/setpriv", "/usr/bin/prlimit", "/bin/sh"} & set(argv)
    # Without namespaces: no_new_privs is the launcher's to set (bwrap sets it otherwise); the
    # niceness where the starting thread cannot set it (a tool for it given); nothing to do, no exec.
    plain = dataclasses.replace(policy, namespaces=False, netns=None, cgroup_procs=())
    niced = dataclasses.replace(tools, nice="/usr/bin/nice")
    argv = render(plain, ["true"], cwd=Path("/"), env={}, tools=niced).argv
    assert argv == ["/x/te-init", "--launch", "--uid", "60001", "--no-new-privs",
                    "--fsize", "1024", "--nproc", "10", "--core", "0", "--nice", "10", "--", "true"]  # fmt: skip
    bare = SandboxPolicy(no_new_privs=False)
    assert render(bare, ["true"], cwd=Path("/"), env={}, tools=tools).argv == ["true"]


def test_the_launcher_and_the_system_tools_take_the_same_steps(harness_factory, monkeypatch):
    """The same command, launched by the static init and by the system's tools (a host that cannot
    build the init): the same uid, groups, niceness, rlimits, no_new_privs and cgroups."""
    from evaluations.runtime import sandbox as sandbox_module

    launched = []
    render_as_it_is = sandbox_module.render

    def recording(*args, **kwargs):
        rendered = render_as_it_is(*args, **kwargs)
        launched.append(rendered.argv[0])
        return rendered

    monkeypatch.setattr(sandbox_module, "render", recording)
    probe = (
        "id -u; id -G; nice; ulimit -f; ulimit -u; ulimit -c; "
        "grep NoNewPrivs /proc/self/status; grep -v '^0::' /proc/self/cgroup | sort"
    )
    limits = {"disk_quota_bytes": 10 * 1024 * 1024, "max_processes": 50}
    first = harness_factory()
    by_launcher = first.run(probe, **limits)
    monkeypatch.setattr(sandbox_module, "_launcher", lambda: None)
    second = harness_factory()  # a phase's sandbox of its own, launched the other way
    by_tools = second.run(probe, **limits)
    assert by_launcher.exit_code == by_tools.exit_code == 0, (by_launcher.output, by_tools.output)
    assert len(by_launcher.output.splitlines()) >= 7
    # Each harness is an evaluation of its own: its cgroups' names are its id.
    assert by_launcher.output == by_tools.output.replace(second.eval_id, first.eval_id)
    assert launched[0] == str(initbin.host_binary())
    assert launched[-1] != launched[0]  # the tools: sh (the cgroup's join) or setpriv first


def test_the_launcher_runs_nothing_when_a_step_fails(tmp_path):
    launcher = initbin.host_binary()
    assert launcher is not None, "this host builds the init (.ci/run installs gcc and libc6-dev)"
    marker = tmp_path / "ran"
    command = ["--", "/bin/sh", "-c", f"touch {marker}"]
    cases = [
        (["--cgroup", str(tmp_path / "no-cgroup" / "cgroup.procs"), *command], 125, "cannot join cgroup"),
        (["--netns", str(tmp_path / "no-netns"), *command], 125, "cannot join the network namespace"),
        (["--fsize", "-1", *command], 2, "bad option --fsize -1"),
        (["--nproc", "many", *command], 2, "bad option --nproc many"),
        (["--uid", *command], 2, "bad option --uid --"),
        (["--color", "1", *command], 2, "bad option --color 1"),
        (["--core", "0", "--"], 2, "no program after --"),
        (["--core", "0"], 2, "no program after --"),
    ]
    for options, status, message in cases:
        done = subprocess.run([str(launcher), "--launch", *options], capture_output=True, text=True)
        assert done.returncode == status and message in done.stderr, (options, done.returncode, done.stderr)
        assert not marker.exists(), options
    done = subprocess.run([str(launcher), "--launch", *command], capture_output=True, text=True)
    assert done.returncode == 0 and marker.exists()


def _hold(launcher, tmp_path):
    """A held launcher (``--launch --hold FD``, no cgroup to join here) and the host's end of its socket."""
    host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([str(launcher), "--launch", "--hold", str(child.fileno())], pass_fds=(child.fileno(),),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={}, cwd="/")  # fmt: skip
    child.close()
    return host, proc


def _go(host, fields: list[str], fds: list[int]) -> None:
    request = os.memfd_create("te-launch")
    try:
        os.write(request, b"".join(field.encode() + b"\0" for field in fields))
        host.sendmsg([b"G"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [request, *fds]))])
    finally:
        os.close(request)


def test_a_held_launcher_runs_the_launch_it_is_sent_with_its_descriptors_cwd_and_environment(tmp_path):
    launcher = initbin.host_binary()
    host, proc = _hold(launcher, tmp_path)
    read, write = os.pipe()
    target = 40  # the number the line names: the launcher puts the descriptor there
    script = f"echo $A $(pwd) $(id -u) >&{target}; echo out"
    line = [str(launcher), "--launch", "--uid", str(UID or os.getuid()), "--", "/bin/bash", "-c", script]
    _go(host, [str(tmp_path), "1", "A=held", "1", str(target), str(len(line)), *line], [write])
    os.close(write)
    output, _ = proc.communicate(timeout=30)
    host.close()
    assert (proc.returncode, output) == (0, b"out\n")
    assert os.read(read, 200).decode() == f"held {tmp_path} {UID or os.getuid()}\n"
    os.close(read)


def test_a_held_launcher_runs_nothing_unless_sent_a_whole_launch(tmp_path):
    launcher = initbin.host_binary()
    marker = tmp_path / "ran"
    touch = ["--", "/bin/sh", "-c", f"touch {marker}"]
    host, proc = _hold(launcher, tmp_path)
    host.close()  # ended unused
    assert proc.communicate(timeout=30) == (b"", None) and proc.returncode == 0
    cases = [
        ([str(launcher), "--launch", "--cgroup", str(tmp_path / "cgroup.procs"), *touch], "joins again"),
        ([str(launcher), "--launch", "--hold", "3", *touch], "joins again"),
        ([str(launcher), "--as", "0", "0", "/bin/true"], "is not a launch"),
    ]
    for line, message in cases:
        host, proc = _hold(launcher, tmp_path)
        _go(host, ["/", "0", "0", str(len(line)), *line], [])
        output, _ = proc.communicate(timeout=30)
        host.close()
        assert (proc.returncode, output.decode()) == (125, f"term-executor: launch: the held launch {message}\n")
    host, proc = _hold(launcher, tmp_path)
    _go(
        host, ["/", "0", "1", "40", "4", str(launcher), "--launch", *touch[:1], "true"], []
    )  # one descriptor named, none sent
    assert proc.communicate(timeout=30)[0].decode().endswith("names other descriptors than it sent\n")
    host.close()
    refused = subprocess.run([str(launcher), "--launch", "--hold", "3", *touch], capture_output=True, text=True)
    assert (refused.returncode, refused.stderr) == (2, "term-executor: launch: --hold takes no program\n")
    assert not marker.exists()
