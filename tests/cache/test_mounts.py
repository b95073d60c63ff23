"""The user namespaces of idmapped mounts, made ahead by the worker (cache/mounts.py ``prepare_userns``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
UID = 60998  # outside the sandbox uid pool the other tests lease from

# Made in this process, then used in a fork of it that may not fork (as an evaluation process
# forked after the worker made them): the namespace is there, and maps root's files to the uid.
PROBE = """
import json, os, sys
from pathlib import Path
from evaluations.cache import mounts
uid, folder = int(sys.argv[1]), Path(sys.argv[2])
mounts.prepare_userns([uid])
read_r, read_w = os.pipe()
pid = os.fork()
if pid == 0:
    def no_fork():
        raise AssertionError("forked to make a namespace")
    os.fork = no_fork
    report = {}
    try:
        (folder / "source").mkdir()
        (folder / "source" / "file").write_text("x")
        (folder / "point").mkdir()
        mounts.bind_idmapped(folder / "source", folder / "point", mounts.userns_fd(uid))
        try:
            st = os.stat(folder / "point" / "file")
            report = {"owner": [st.st_uid, st.st_gid]}
        finally:
            mounts.unmount(folder / "point")
    except BaseException as exc:
        report = {"error": repr(exc)}
    os.write(read_w, json.dumps(report).encode())
    os._exit(0)
os.close(read_w)
os.waitpid(pid, 0)
sys.stdout.write(os.read(read_r, 4096).decode())
"""


def test_a_namespace_made_ahead_serves_the_processes_forked_after(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(UID), str(tmp_path)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == {"owner": [UID, UID]}, done.stderr
