"""An evaluation's root in an image for the tests (tests/images/conftest.py's ``image_session``):
the root mounted in a session folder of its own, a command run in it through the real Spawner."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

from evaluations.cache import mounts
from evaluations.images import rootfs
from evaluations.runtime import SandboxPolicy, Spawner
from evaluations.runtime.idmap import ID_COUNT, IdMap
from tests.runtime.support import DEFAULT_LIMITS, UID

# A range far from every uid of the suite, one per xdist worker.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
RANGE = 400_000_000 + _WORKER * 4 * ID_COUNT


def image_sessions(bwrap_runtime):
    """A factory: make(user=0, base=RANGE, layers=...) -> (spawner, ImageRoot, session folder);
    everything it made is taken down when the generator ends."""
    made = []

    def make(user=0, group=None, base=RANGE, layers=None):
        session = Path(tempfile.mkdtemp(prefix="te-image-", dir="/tmp"))
        os.chmod(session, 0o710)
        os.chown(session, 0, UID)
        idmap = IdMap(lease=UID, base=base, user=user, group=user if group is None else group)
        root = rootfs.mount_root(layers, session, idmap)
        spawner = Spawner(eval_id=f"img-{uuid.uuid4().hex[:8]}", session_dir=session, runtime=bwrap_runtime, uid=UID)
        made.append((spawner, session))
        return spawner, root, session

    yield make
    for spawner, session in made:
        spawner.close()
        mounts.unmount_below(session)
        shutil.rmtree(session)


def run(spawner, root, script, **env):
    """``sh -c script`` as the image's user in ``root`` (an ImageRoot), from /."""
    policy = SandboxPolicy(image=root)
    return spawner.run(
        ["/bin/sh", "-c", script],
        cwd=Path("/"),
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **env},
        limits=DEFAULT_LIMITS,
        policy=policy,
    )
