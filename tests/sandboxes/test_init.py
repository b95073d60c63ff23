"""The sandbox's init and the host's end of its socket (runtime/init.c, runtime/initchannel.py), without a
sandbox around them: the protocol itself, good requests and bad."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from evaluations.runtime import initbin
from evaluations.runtime.initchannel import ExecStartError, InitChannel, InitGone


@pytest.fixture
def init(tmp_path):
    binary = initbin.ensure_init(tmp_path) / initbin.NAME
    channel = InitChannel()
    process = subprocess.Popen([str(binary), str(channel.init_fd)], pass_fds=(channel.init_fd,))
    assert channel.wait_ready(30)
    yield channel
    channel.close()
    process.wait(timeout=30)


def request(argv, env=("PATH=/usr/bin:/bin",), cwd="/", uid=None, gid=None) -> int:
    uid = os.getuid() if uid is None else uid
    gid = os.getgid() if gid is None else gid
    fields = [str(uid), str(gid), cwd, str(len(argv)), *argv, str(len(env)), *env]
    fd = os.memfd_create("request")
    os.write(fd, b"".join(field.encode() + b"\0" for field in fields))
    return fd


def run(channel, number, argv, **kwargs):
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    stdin = os.open(os.devnull, os.O_RDONLY)
    fd = request(argv, **kwargs)
    try:
        entry = channel.start(number, fd, stdin, out_w, err_w)
    finally:
        for each in (fd, stdin, out_w, err_w):
            os.close(each)
    assert entry.wait(30)
    out, err = os.read(out_r, 65536), os.read(err_r, 65536)
    os.close(out_r)
    os.close(err_r)
    return entry, out, err


def test_an_exec_runs_with_its_own_argv_env_and_folder(init, tmp_path):
    entry, out, err = run(init, 1, ["sh", "-c", 'echo "$GREETING $(pwd)"; echo oops >&2; exit 7'],
                          env=("PATH=/usr/bin:/bin", "GREETING=hi"), cwd=str(tmp_path))  # fmt: skip
    assert os.waitstatus_to_exitcode(entry.status) == 7
    assert out == f"hi {tmp_path}\n".encode() and err == b"oops\n"


def test_a_missing_program_or_folder_is_the_execs_own_failure(init):
    entry, _, err = run(init, 2, ["no-such-program"])
    assert os.waitstatus_to_exitcode(entry.status) == 127 and b"no-such-program" in err
    entry, _, err = run(init, 3, ["true"], cwd="/no/such/folder")
    assert os.waitstatus_to_exitcode(entry.status) == 126 and b"/no/such/folder" in err


def test_a_signal_reaches_the_execs_process_group(init):
    out_r, out_w = os.pipe()
    stdin = os.open(os.devnull, os.O_RDONLY)
    fd = request(["sh", "-c", "sleep 300 & sleep 301"])
    entry = init.start(4, fd, stdin, out_w, out_w)
    for each in (fd, stdin, out_w):
        os.close(each)
    assert not entry.wait(0.2)
    init.signal(4, signal.SIGKILL)
    assert entry.wait(30) and os.waitstatus_to_exitcode(entry.status) == -signal.SIGKILL
    assert os.read(out_r, 10) == b""  # its background child died with the group: the pipe closed
    os.close(out_r)


def test_malformed_requests_are_refused_and_the_init_goes_on(init):
    devnull = os.open(os.devnull, os.O_RDONLY)
    for payload in (b"", b"0\x000\x00/\x00", b"0\x000\x00/\x005\x00true\x000\x00", b"no nul at the end"):
        fd = os.memfd_create("bad")
        os.write(fd, payload)
        with pytest.raises(ExecStartError):
            init.start(10, fd, devnull, devnull, devnull)
        os.close(fd)
    os.close(devnull)
    entry, out, _ = run(init, 11, ["echo", "still here"])
    assert out == b"still here\n"


def test_the_end_of_the_init_wakes_every_waiting_exec(tmp_path):
    binary = initbin.ensure_init(tmp_path) / initbin.NAME
    channel = InitChannel()
    process = subprocess.Popen([str(binary), str(channel.init_fd)], pass_fds=(channel.init_fd,))
    assert channel.wait_ready(30)
    out_r, out_w = os.pipe()
    stdin = os.open(os.devnull, os.O_RDONLY)
    fd = request(["sleep", "300"])
    entry = channel.start(1, fd, stdin, out_w, out_w)
    for each in (fd, stdin, out_w):
        os.close(each)
    process.kill()
    process.wait(timeout=30)
    assert entry.wait(30) and entry.gone and entry.status is None
    with pytest.raises(InitGone):
        run(channel, 2, ["true"])
    channel.close()
    os.kill(entry.pid, signal.SIGKILL)  # outside a pid namespace the exec outlives its init: ours to end
    os.close(out_r)


def test_closing_the_hosts_end_ends_the_init(tmp_path):
    binary = initbin.ensure_init(tmp_path) / initbin.NAME
    channel = InitChannel()
    process = subprocess.Popen([str(binary), str(channel.init_fd)], pass_fds=(channel.init_fd,))
    assert channel.wait_ready(30)
    channel.close()
    assert process.wait(timeout=30) == 0


# -- "--relay PORT SOCKET -- PROGRAM ...": the egress relay's prefix (tests/network/test_sandbox.py runs it) --


@pytest.mark.parametrize(
    "args",
    [
        ["--relay"],
        ["--relay", "3128", "/run/egress.sock", "--"],  # no program
        ["--relay", "0", "/run/egress.sock", "--", "PROGRAM"],
        ["--relay", "70000", "/run/egress.sock", "--", "PROGRAM"],
        ["--relay", "-1", "/run/egress.sock", "--", "PROGRAM"],
        ["--relay", "3128", "egress.sock", "--", "PROGRAM"],  # not absolute
        ["--relay", "3128", "/" + "s" * 120, "--", "PROGRAM"],  # longer than a Unix socket's path
        ["--relay", "3128", "/run/egress.sock", "PROGRAM"],  # no --
    ],
)
def test_a_bad_relay_line_is_refused_before_anything_listens(tmp_path, args):
    binary = initbin.ensure_init(tmp_path) / initbin.NAME
    marker = tmp_path / "ran"
    argv = [str(binary)] + [part for arg in args for part in (["touch", str(marker)] if arg == "PROGRAM" else [arg])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and not marker.exists()
    assert done.stderr == "egress relay: usage: te-init --relay PORT /SOCKET -- PROGRAM ARGS...\n"


# -- "--as UID GID PROGRAM ...": the switch a background process of a third user starts through ----


def switch(tmp_path, *args, pass_fds=()):
    binary = initbin.ensure_init(tmp_path) / initbin.NAME
    return subprocess.run([str(binary), "--as", *args], capture_output=True, text=True, timeout=30, pass_fds=pass_fds,
                          env={"PATH": "/usr/bin:/bin"})  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root, as the service has")
def test_as_switches_user_and_group_drops_the_others_and_every_descriptor(tmp_path):
    kept_r, kept_w = os.pipe()  # inherited: closed before the program runs
    try:
        done = switch(tmp_path, "65534", "65533", "sh", "-c",
                      f"id -u; id -g; id -G; test -e /proc/self/fd/{kept_w} && echo open || echo closed; "
                      "grep CapEff /proc/self/status", pass_fds=(kept_w,))  # fmt: skip
    finally:
        os.close(kept_r)
        os.close(kept_w)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == ["65534", "65533", "65533", "closed"]
    assert done.stdout.split()[-1] == "0000000000000000"


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (("65534", "65534"), 2, ""),  # no program
        (("x", "65534", "true"), 2, ""),
        (("65534", "", "true"), 2, ""),
        (("65534", "1x", "true"), 2, ""),
        (("65534", "65534", "no-such-program"), 127, "te-init: no-such-program: No such file or directory"),
    ],
)
def test_as_refuses_what_it_cannot_read_and_names_a_missing_program(tmp_path, args, code, said):
    done = switch(tmp_path, *args)
    assert done.returncode == code, done.stderr
    assert said in done.stderr
