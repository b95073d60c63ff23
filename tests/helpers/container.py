"""The official image run with docs/operating.md's `docker run` line (podman for docker), for the container
tests (tests/ops/test_container_image.py) and the bench inside the container (bench/container.py).

The service in the container shares the host's uids (rootful podman has no user namespace), so it gets
uid and image id ranges of its own (OWN_IDS): the services on the host use the defaults.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
OPERATING = (PROJECT / "docs" / "operating.md").read_text()
# Away from the host services' defaults (SANDBOX_UID 60000.., IMAGE_UID_BASE 100000000..).
OWN_IDS = {"SANDBOX_UID": "61000", "SANDBOX_UID_COUNT": "64", "IMAGE_UID_BASE": "300000000"}
CGROUP_V1 = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists()


def docs_run_line(engine: str) -> list[str]:
    """docs/operating.md's `docker run` line (its "Docker" section), as argv with ``engine`` for docker."""
    lines = re.findall(r"^docker run (?:[^\n]*\\\n)*[^\n]*", OPERATING, re.M)
    assert len(lines) == 1, lines
    argv = shlex.split(lines[0].replace("\\\n", " "))
    assert argv[:2] == ["docker", "run"] and argv[-1] == "term-executor", argv
    return [engine, *argv[1:]]


def cgroup_flags(name: str) -> list[str]:
    """docs/operating.md's flags for kernel limits in the container, on this host's cgroup version."""
    if CGROUP_V1:  # the host's hierarchies, and a DATA_DIR (which names the cgroup folder) of its own
        return ["-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "-e", f"DATA_DIR=/data/{name}"]
    return ["--cgroupns=private", "--security-opt", "unmask=/sys/fs/cgroup"]


def run_argv(image: str, name: str, env: dict[str, str], token: str) -> tuple[list[str], list[str]]:
    """The docs' line for ``image``, named ``name``, with volumes of its own (te-data:/data ->
    te-data-<name>:/data), AUTH_TOKEN ``token``, the host's network for -p, and ``env`` added: (argv, volumes)."""
    argv = docs_run_line("podman")
    volumes = []
    for i, word in enumerate(argv):
        if word == "-v" and ":" in argv[i + 1]:
            volume, _, target = argv[i + 1].partition(":")
            volumes.append(f"{volume}-{name}")
            argv[i + 1] = f"{volumes[-1]}:{target}"
    argv = [w.replace("AUTH_TOKEN=change-me", f"AUTH_TOKEN={token}") for w in argv]
    assert argv.count("-p") == 1 and argv.count("--name") == 1
    at = argv.index("-p")
    argv[at : at + 2] = ["--network", "host"]
    argv[argv.index("--name") + 1] = name
    argv[-1:-1] = [word for key, value in env.items() for word in ("-e", f"{key}={value}")]
    argv[-1] = image
    return argv, volumes


def remove(name: str, volumes: list[str]) -> None:
    subprocess.run(["podman", "rm", "-f", "-t", "30", name], capture_output=True, timeout=120)
    subprocess.run(["podman", "volume", "rm", "-f", *volumes], capture_output=True, timeout=120)
