"""The user namespaces the executor makes (runtime/idmap.py): by the init's ``--userns`` (a spawn),
else by a fork of the process; either way with the map asked for, owned by the owner asked for,
and no nested namespace possible inside."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
LEASE, BASE = 60997, 3_900_000_000  # outside the pool and the image ranges the other tests use

# In a process of its own (each caches its namespaces): make one, then look at it from a child that
# joins it (setns, as bubblewrap does) and reads its maps and tries a nested namespace.
PROBE = """
import ctypes, json, os, sys
from evaluations.runtime import idmap
if sys.argv[1] == "fork":
    idmap._helper = lambda: None
else:
    real_fork = os.fork
    def no_fork():
        raise AssertionError("forked to make a namespace")
    os.fork = no_fork
m = idmap.IdMap(lease=int(sys.argv[2]), base=int(sys.argv[3]), user=0, group=0)
fd = idmap.image_userns_fd(m)
if sys.argv[1] != "fork":
    os.fork = real_fork
import fcntl, struct
owner = struct.unpack("I", fcntl.ioctl(fd, 0xB704, b"\\0" * 4))[0]  # NS_GET_OWNER_UID
out_r, out_w = os.pipe()
pid = os.fork()
if pid == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    report = {}
    if libc.setns(fd, 0x10000000) != 0:
        report["error"] = os.strerror(ctypes.get_errno())
    else:
        report["uid_map"] = open("/proc/self/uid_map").read().split()
        report["nested"] = libc.unshare(0x10000000) == 0
        report["max"] = open("/proc/sys/user/max_user_namespaces").read().strip()
    report["owner"] = owner
    os.write(out_w, json.dumps(report).encode())
    os._exit(0)
os.close(out_w)
os.waitpid(pid, 0)
print(os.read(out_r, 65536).decode())
"""


@pytest.mark.parametrize("how", ["spawn", "fork"])
def test_a_namespace_has_its_map_and_refuses_a_nested_one(how):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, how, str(LEASE), str(BASE)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(done.stdout)
    assert "error" not in report, report
    # 0 -> the lease, 1..65535 -> the range (runtime/idmap.py _lines), as /proc shows a map
    assert report["uid_map"] == ["0", str(LEASE), "1", "1", str(BASE + 1), "65535"], report
    assert report["nested"] is False and report["max"] == "0", report
    assert report["owner"] == LEASE, report  # bubblewrap, run as the lease, may join it


def test_a_user_namespace_refused_is_a_clear_error():
    """The init's answer to an owner it cannot be: NamespaceError, no fd."""
    script = (
        "from evaluations.runtime import idmap\n"
        "try:\n"
        "    idmap._make('0 1 1\\n', '0 1 1\\n', -1)\n"  # no uid
        "except OSError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=PROJECT, capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("NamespaceError [Errno 1] could not create a user namespace"), done
