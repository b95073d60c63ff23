"""Two processes building the same Dockerfile at once run each RUN once: the second waits on the
first's flock for that step, then reuses its layer (SPEC §16).

The RUN holds still until the test lets it go: it waits for a file in its own /tmp, which is the
build folder's ``tmp`` on the host (IMAGES_DIR/builds/<id>/tmp), so the second build is seen
waiting while the first is inside the command: no timing is assumed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers.service import PROJECT
from tests.images.build_support import BASE_REF, config_for, write_context

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds mount image roots: root only")

WORKER = """
import dataclasses, json, sys
from pathlib import Path
from evaluations.images.build import build
from evaluations.images.store import ImageStore
from evaluations.runtime import Bubblewrap
from evaluations.runtime.sandbox import usable_language_runtimes
from tests.images.build_support import config_for, environment
from tests.runtime.support import UID

args = json.loads(sys.argv[1])
images, context = Path(args["images"]), Path(args["context"])
env = environment(Bubblewrap(usable_language_runtimes(UID)), config_for(images))
env = dataclasses.replace(env, progress=lambda text: print(text, flush=True))
result = build(context / "Dockerfile", context, None, None, store=ImageStore(images), env=env)
print("DIGEST", result.record.digest, result.cached, flush=True)
"""


class Builder:
    """One build in its own process; its output lines collected as they come."""

    def __init__(self, images: Path, context: Path):
        args = json.dumps({"images": str(images), "context": str(context)})
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, args], cwd=PROJECT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)  # fmt: skip
        self.lines: list[str] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def wait_for(self, text: str, timeout: float = 120) -> None:
        with self.changed:
            found = self.changed.wait_for(lambda: any(text in line for line in self.lines), timeout)
        assert found, f"no line with {text!r} in {self.lines}"

    def finish(self) -> list[str]:
        assert self.proc.wait(timeout=300) == 0, "\n".join(self.lines)
        return self.lines


def wait_for_path(pattern: str, folder: Path, timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(folder.glob(pattern))
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"nothing matched {pattern} in {folder}")


def test_two_processes_building_one_dockerfile_run_its_run_once(build_images_dir, debian_image, tmp_path):
    token = uuid.uuid4().hex
    dockerfile = f"""\
FROM {BASE_REF}
RUN touch /tmp/started && while [ ! -e /tmp/go ]; do sleep 0.05; done && echo {token} > /stamp
RUN date +%s%N > /after
"""
    context = write_context(tmp_path / "ctx", {"Dockerfile": dockerfile})
    first = Builder(build_images_dir, context)
    # A RUN's /tmp is in WORKSPACE_BASE/.image-builds/<build>/ (what the sandbox uid reaches).
    started = wait_for_path(".image-builds/*/tmp/started", config_for(build_images_dir).workspace_base)
    second = Builder(build_images_dir, context)
    second.wait_for("line 2: RUN waits for another build of it")
    (started.parent / "go").touch()
    first_lines, second_lines = first.finish(), second.finish()
    runs = [line for line in first_lines + second_lines if line.startswith("line 2: RUN touch")]
    assert len(runs) == 1 and runs[0] in first_lines, (first_lines, second_lines)
    assert "line 2: RUN (cached)" in second_lines
    # Line 3 is run once too, by whichever build reaches it first: the second may take its lock as soon
    # as line 2 is stored, before the first does (a race CI met); the other then has it cached.
    third = [line for line in first_lines + second_lines if line.startswith("line 3: RUN date")]
    cached = [line for line in first_lines + second_lines if line == "line 3: RUN (cached)"]
    assert (len(third), len(cached)) == (1, 1), (first_lines, second_lines)
    digests = [line.split()[1] for line in first_lines + second_lines if line.startswith("DIGEST")]
    assert len(digests) == 2 and digests[0] == digests[1]
