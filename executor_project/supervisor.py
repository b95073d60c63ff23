"""What ``manage.py serve`` becomes once it has forked the gunicorn master and the worker.

serve execs this module (same pid, so both stay its children) in a bare interpreter,
``python -I -S``: no site, no Django, only the standard library and ``process.name_process``.
A process that only waits then holds a few MB instead of an interpreter that imported Django
(bench/RESULTS.md, issue 38: its PSS 32 -> 4-5 MB).

1. SIGTERM, SIGINT and SIGCHLD are blocked before serve forks (each child unblocks them) and
   stay blocked through the exec and to the end: this module takes them with ``sigwaitinfo``,
   so a signal that comes while serve execs is pending, not lost, and no handler runs.
2. It waits for SIGTERM/SIGINT or for a child to exit; then it sends SIGTERM to the children
   still running, and SIGKILL to those still running ``stop_timeout`` seconds later. It reaps
   only its children's pids (``waitpid``).
3. A child that exited on its own: one line on stderr and exit 1, so a supervisor (Docker,
   systemd) restarts the pair; stopped by a signal: exit 0.
4. The metrics folder serve made (PROMETHEUS_MULTIPROC_DIR) is removed at the end.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from executor_project.process import name_process

SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}
_STOP = {signal.SIGTERM, signal.SIGINT}
# -I: no PYTHON* variables, no user site, nothing of the current folder on sys.path; -S: no site
# (the venv's packages stay out). Only the project folder is added, for this package.
_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from executor_project import supervisor; supervisor.main(sys.argv[2:])"


def arguments(children: dict[str, int], stop_timeout: float, metrics_dir: str) -> list[str]:
    """``main``'s arguments: supervise ``children`` (name -> pid)."""
    return [str(stop_timeout), str(metrics_dir), *(f"{name}={pid}" for name, pid in children.items())]


def command(arguments: list[str]) -> list[str]:
    """The argv that runs ``main(arguments)`` in a bare interpreter (serve execs it)."""
    project = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [sys.executable, "-I", "-S", "-c", _BOOT, project, *arguments]


def main(argv: list[str]) -> None:
    """``stop_timeout metrics_dir name=pid...``: supervise, clean up, exit 1 if a child exited first."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)  # serve blocked them already: a no-op then
    name_process("te-serve")
    stop_timeout, metrics_dir, *pairs = argv
    children = {name: int(pid) for name, _, pid in (pair.partition("=") for pair in pairs)}
    try:
        exited, codes = supervise(children, float(stop_timeout))
    finally:
        import shutil  # only now: its imports would stay in memory for the service's whole life

        shutil.rmtree(metrics_dir, ignore_errors=True)
    if exited is not None:
        sys.stderr.write(f"serve: {exited} exited with code {codes[exited]}; stopped the rest\n")
        sys.exit(1)


def supervise(children: dict[str, int], stop_timeout: float) -> tuple[str | None, dict[str, int]]:
    """Wait for a stop signal or a child's exit, then stop the rest; return (the child that exited
    first or None, every child's exit code). ``SIGNALS`` must be blocked."""
    codes: dict[str, int] = {}
    exited = None
    while exited is None:
        if signal.sigwaitinfo(SIGNALS).si_signo != signal.SIGCHLD or _STOP & signal.sigpending():
            break  # a stop signal (one pending beside a SIGCHLD too: Ctrl-C reaches the children as well)
        exited = next(iter(collect(children, codes)), None)
    for name, pid in children.items():
        if name not in codes:
            _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + stop_timeout
    while True:
        collect(children, codes)
        remaining = deadline - time.monotonic()
        if len(codes) == len(children) or remaining <= 0:
            break
        signal.sigtimedwait({signal.SIGCHLD}, remaining)  # a child's exit, or the deadline
    for name, pid in children.items():
        if name not in codes:
            _kill(pid, signal.SIGKILL)
            codes[name] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return exited, codes


def collect(children: dict[str, int], codes: dict[str, int]) -> list[str]:
    """Record the exit codes of children that ended; return their names."""
    ended = []
    for name, pid in children.items():
        if name in codes:
            continue
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            codes[name] = os.waitstatus_to_exitcode(status)
            ended.append(name)
    return ended


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
