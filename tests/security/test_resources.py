"""Resource attacks by the agent, under both runtimes: each is stopped, named, cleaned up,
and the next evaluation passes."""

from __future__ import annotations

import dataclasses
import glob
import re
import uuid

import psutil
import pytest

from tests.helpers.tasks import SOLVER
from tests.security.support import evaluate, still_works

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MIB = 1024 * 1024
FIX = "open('calc.py', 'w').write('def add(a, b):\\n    return a + b\\n')\n"


def failed_with(evaluation, message: str) -> None:
    assert evaluation.status == "failed", (evaluation.status, evaluation.error)
    assert evaluation.error.startswith(f"running_agent: {message}"), evaluation.error
    assert evaluation.test_results.count() == 0


def test_fork_bomb(tasks, e2e_config, sandbox):
    config = dataclasses.replace(e2e_config, max_processes=40)
    bomb = "#!/bin/bash\nbomb() { bomb | bomb & }\nbomb\nsleep 30\n"
    evaluation = evaluate(tasks.task(), bomb, language="bash", config=config, sandbox=sandbox)
    failed_with(evaluation, "process limit exceeded")
    still_works(tasks, e2e_config, sandbox)


def test_zombie_hoard_counts_as_processes(tasks, e2e_config, sandbox):
    # Children that exit and are never waited for hold a pid and an RLIMIT_NPROC slot each.
    hoard = (
        "import os, time\n"
        "for _ in range(500):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            os._exit(0)\n"
        "    except OSError:\n"
        "        break\n"
        "time.sleep(30)\n"
    )
    config = dataclasses.replace(e2e_config, max_processes=40)
    failed_with(evaluate(tasks.task(), hoard, config=config, sandbox=sandbox), "process limit exceeded")
    still_works(tasks, e2e_config, sandbox)


def test_memory_bomb_spread_over_children(tasks, e2e_config, sandbox):
    # Eight children of 40 MiB each: none alone is near the 200 MiB limit, together they are over.
    agent = (
        "import os, time\n"
        "for _ in range(8):\n"
        "    if os.fork() == 0:\n"
        "        data = b'x' * (40 * 1024 * 1024)\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "time.sleep(30)\n"
    )
    config = dataclasses.replace(e2e_config, memory_limit_mb=200)
    failed_with(evaluate(tasks.task(), agent, config=config, sandbox=sandbox), "memory limit exceeded")
    still_works(tasks, e2e_config, sandbox)


SYSV_HOARD = """
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
chunk = 40 * 1024 * 1024
for _ in range(10):  # 400 MiB, never more than 40 MiB attached (in anyone's RSS) at once
    shmid = libc.shmget(0, ctypes.c_size_t(chunk), 0o1600)
    addr = libc.shmat(shmid, None, 0)
    ctypes.memset(addr, 1, chunk)
    libc.shmdt(ctypes.c_void_p(addr))
    time.sleep(0.3)
print('HID 400 MiB', flush=True)
time.sleep(5)
"""


def test_memory_bomb_in_detached_sysv_shared_memory(tasks, e2e_config, sandbox):
    config = dataclasses.replace(e2e_config, memory_limit_mb=200)
    failed_with(evaluate(tasks.task(), SYSV_HOARD, config=config, sandbox=sandbox), "memory limit exceeded")
    pool = range(e2e_config.sandbox_uid, e2e_config.sandbox_uid + e2e_config.sandbox_uid_count)
    rows = [line.split() for line in open("/proc/sysvipc/shm").read().splitlines()[1:]]
    assert not [row for row in rows if int(row[7]) in pool], "a segment of the evaluation outlived it"
    still_works(tasks, e2e_config, sandbox)


def _filler(folder: str, token: str) -> str:
    """Fifteen 20 MiB files (300 MiB; none alone over the 100 MiB file limit), then a pause."""
    return (
        "import time\n"
        "written = 0\n"
        "try:\n"
        "    for i in range(15):\n"
        f"        with open(f'{folder}/te-attack-{token}-{{i}}', 'wb') as f:\n"
        "            for _ in range(20):\n"
        "                f.write(b'x' * (1024 * 1024))\n"
        "                written += 1\n"
        "except OSError as exc:\n"
        "    print('REFUSED errno', exc.errno, 'after', written, 'MiB', flush=True)\n"
        "else:\n"
        "    time.sleep(5)\n" + FIX
    )


def _leftovers(folder: str, token: str) -> list[str]:
    return glob.glob(f"{folder}/te-attack-{token}-*")


def test_dev_shm_fill(tasks, e2e_config, sandbox):
    # bwrap: /dev/shm is a tmpfs of 64 MiB of its own. Without: the host's, counted by owner.
    token = uuid.uuid4().hex[:10]
    config = dataclasses.replace(e2e_config, disk_quota_mb=100)
    evaluation = evaluate(tasks.task(), _filler("/dev/shm", token), config=config, sandbox=sandbox)
    if sandbox == "bwrap":
        assert "REFUSED errno 28 after" in evaluation.agent_output, evaluation.agent_output
        written = int(evaluation.agent_output.split("after ")[1].split()[0])
        assert written <= 64
    else:
        failed_with(evaluation, "disk quota exceeded")
    assert not _leftovers("/dev/shm", token)
    still_works(tasks, e2e_config, sandbox)


def test_tmp_fill(tasks, e2e_config, sandbox):
    # bwrap: /tmp is <session>/tmp. Without: the host's /tmp, counted and removed by owner.
    token = uuid.uuid4().hex[:10]
    config = dataclasses.replace(e2e_config, disk_quota_mb=100)
    evaluation = evaluate(tasks.task(), _filler("/tmp", token), config=config, sandbox=sandbox)
    failed_with(evaluation, "disk quota exceeded")
    assert not _leftovers("/tmp", token) and not _leftovers("/var/tmp", token)
    still_works(tasks, e2e_config, sandbox)


def test_disk_fill_in_the_repository(tasks, e2e_config, sandbox):
    config = dataclasses.replace(e2e_config, disk_quota_mb=100)
    evaluation = evaluate(tasks.task(), _filler(".", "repo"), config=config, sandbox=sandbox)
    failed_with(evaluation, "disk quota exceeded")
    still_works(tasks, e2e_config, sandbox)


def _file_maker(folder: str, token: str, count: int, until_killed: bool = True) -> str:
    """``count`` empty files (no bytes to speak of, one inode each) in a folder of their own; then,
    ``until_killed``, the agent waits for the monitor's kill (its walks meet the files while it
    runs; AGENT_TIMEOUT_SECS bounds the wait, and a timeout fails the test), else it fixes the task."""
    return (
        "import os, signal\n"
        f"folder = os.path.join({folder!r}, 'te-files-{token}')\n"
        "os.makedirs(folder)\n"
        f"for i in range({count}):\n"
        "    open(os.path.join(folder, str(i)), 'w').close()\n"
        f"print('MADE {count}', flush=True)\n" + ("signal.pause()\n" if until_killed else FIX)
    )


def failed_on_file_count(evaluation, max_files: int) -> int:
    """The evaluation ended for the file count at the evaluation level; the count it names."""
    failed_with(evaluation, "file count limit exceeded")
    assert evaluation.error_kind == "limit_exceeded", evaluation.error_kind
    match = re.fullmatch(rf"running_agent: file count limit exceeded \((\d+) > {max_files}\)", evaluation.error)
    assert match, evaluation.error
    assert evaluation.resources["peak_files"] >= int(match[1]) > max_files, evaluation.resources
    return int(match[1])


@pytest.mark.parametrize("where", ["repository", "tmp", "dev_shm"])
def test_empty_files_over_the_file_count(tasks, e2e_config, sandbox, where):
    # 2000 empty files are a few dozen KiB of blocks (the disk quota never sees them) but 2000
    # inodes. bwrap: /tmp is <session>/tmp, /dev/shm a tmpfs of its own (its size caps bytes, not
    # files). Without: the host's /tmp and /dev/shm, counted and removed by owner.
    token = uuid.uuid4().hex[:10]
    folder = {"repository": ".", "tmp": "/tmp", "dev_shm": "/dev/shm"}[where]
    config = dataclasses.replace(e2e_config, max_files=1000, disk_quota_mb=100)
    evaluation = evaluate(tasks.task(), _file_maker(folder, token, 2000), config=config, sandbox=sandbox)
    failed_on_file_count(evaluation, 1000)
    assert not glob.glob(f"/tmp/te-files-{token}") and not glob.glob(f"/dev/shm/te-files-{token}")
    still_works(tasks, e2e_config, sandbox)


def test_an_ordinary_evaluation_reports_its_peak_files(tasks, e2e_config, sandbox):
    # No wait: the files stay, and the walk after the command counts them.
    evaluation = evaluate(
        tasks.task(), SOLVER + _file_maker(".", "few", 300, until_killed=False), config=e2e_config, sandbox=sandbox
    )
    assert (evaluation.status, evaluation.passed) == ("completed", True), evaluation.error
    assert evaluation.resources["peak_files"] > 300, evaluation.resources


def test_sparse_files(tasks, e2e_config, sandbox):
    # A sparse file is counted by the blocks it holds (no false kill), its apparent size is
    # capped by RLIMIT_FSIZE (= the quota): a 50 GiB one is refused.
    agent = (
        "import os, signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "home = os.environ['HOME']\n"
        "with open(f'{home}/small-sparse', 'wb') as f:\n"
        "    f.truncate(90 * 1024 * 1024)\n"
        "try:\n"
        "    with open(f'{home}/huge-sparse', 'wb') as f:\n"
        "        f.truncate(50 * 1024 ** 3)\n"
        "    print('HUGE made')\n"
        "except OSError as exc:\n"
        "    print('HUGE refused errno', exc.errno)\n" + FIX
    )
    config = dataclasses.replace(e2e_config, disk_quota_mb=100)
    evaluation = evaluate(tasks.task(), agent, config=config, sandbox=sandbox)
    assert "HUGE refused errno 27" in evaluation.agent_output, evaluation.agent_output
    assert (evaluation.status, evaluation.passed) == ("completed", True), evaluation.error
    still_works(tasks, e2e_config, sandbox)


def test_output_flood_without_newlines(tasks, e2e_config, sandbox):
    config = dataclasses.replace(e2e_config, max_output_bytes=64 * 1024)
    agent = (
        "import sys\nsys.stdout.write('HEAD')\n"
        "for _ in range(300):\n    sys.stdout.write('x' * 1024 * 1024)\n"
        "sys.stdout.write('TAIL')\nsys.stdout.flush()\n" + FIX
    )
    before = psutil.Process().memory_info().rss
    evaluation = evaluate(tasks.task(), agent, config=config, sandbox=sandbox)
    grown = psutil.Process().memory_info().rss - before
    assert evaluation.agent_output.startswith("HEAD") and evaluation.agent_output.endswith("TAIL")
    assert "bytes truncated ...]" in evaluation.agent_output and len(evaluation.agent_output) < 100 * 1024
    assert grown < 50 * MIB, f"the service grew {grown / MIB:.0f} MiB during a 300 MB flood"
    assert evaluation.passed, evaluation.error
    still_works(tasks, e2e_config, sandbox)


# The agent fixes the bug and leaves processes that break the fix once the tests have started
# (the test makes .tests-running, then waits a little). Every one must be dead by then.
WATCHED_TEST = (
    "#!/bin/bash\ntouch .tests-running; sleep 0.3\n"
    "python3 -c 'from helper_data import expected; from calc import add; assert add(2, 3) == expected(), add(2, 3)'\n"
)
TAMPER = (
    "touch .escaped\nwhile [ ! -e .tests-running ]; do sleep 0.01; done\n"
    "while :; do printf 'def add(a, b):\\n    return 0\\n' > calc.py; sleep 0.02; done\n"
)
ESCAPES = {
    "setsid_double_fork": "setsid bash -c '(bash .tamper.sh) & disown' &",
    "cleared_environment": "env -i /bin/bash -c 'setsid /bin/bash -c \"(/bin/bash .tamper.sh) &\" &'",
    "ignores_term_and_hup": "bash -c 'trap \"\" TERM HUP INT; (bash .tamper.sh) & disown' &",
    "nohup_daemon": "nohup setsid bash .tamper.sh > /dev/null 2>&1 &",
}


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_escaped_processes_die_before_the_tests(tasks, e2e_config, sandbox, escape):
    agent = (
        "#!/bin/bash\nsed -i 's/a - b/a + b/' calc.py\n"
        + f"cat > .tamper.sh <<'EOF'\n{TAMPER}EOF\n"
        + ESCAPES[escape]
        + "\nfor i in $(seq 50); do [ -e .escaped ] && echo ALIVE && break; sleep 0.05; done\n"
    )
    url = tasks.task(tests={"fail_to_pass_add.sh": WATCHED_TEST, "helper_data.py": "def expected(): return 5\n"})
    evaluation = evaluate(url, agent, language="bash", config=e2e_config, sandbox=sandbox)
    assert "ALIVE" in evaluation.agent_output, evaluation.agent_output
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    still_works(tasks, e2e_config, sandbox)


def test_a_daemon_tampering_with_test_files_and_support_files(tasks, e2e_config, sandbox):
    # Once the tests run it rewrites the test scripts beside repo/ (root's: refused anyway) and
    # the support file in repo/ (the executor wrote it after the sweep; the daemon must be dead).
    daemon = (
        "while [ ! -e .tests-running ]; do sleep 0.01; done; while :; do "
        'for f in "$REPO_DIR"/../tests/*.sh; do echo "exit 0" > "$f"; done 2>/dev/null; '
        "echo 'def expected(): return 0' > helper_data.py; sleep 0.02; done"
    )
    command = f'trap "" TERM; ({daemon}) & disown'
    agent = SOLVER + f"import subprocess\nsubprocess.Popen(['setsid', 'bash', '-c', {command!r}])\nprint('STARTED')\n"
    url = tasks.task(tests={"fail_to_pass_add.sh": WATCHED_TEST, "helper_data.py": "def expected(): return 5\n"})
    evaluation = evaluate(url, agent, config=e2e_config, sandbox=sandbox)
    assert "STARTED" in evaluation.agent_output, evaluation.agent_output
    assert (evaluation.status, evaluation.passed) == ("completed", True), (evaluation.error, evaluation.test_output)
    still_works(tasks, e2e_config, sandbox)
