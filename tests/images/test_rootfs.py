"""An evaluation's root in an image (SPEC §16): the layers shared and read-only, the evaluation's own
writable layer in its session, its commands root in name only.

The layer is the suite's Debian tree (owned by host root, as a layer the store unpacked is owned by
the image's root); the commands run through the real Spawner and bubblewrap.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from evaluations.images import rootfs
from evaluations.runtime import SandboxPolicy
from evaluations.runtime.idmap import ID_COUNT, IdMap
from tests.images.rootfs_support import RANGE, run
from tests.runtime.support import DEFAULT_LIMITS, UID

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="an image's root needs root (mounts)")


@pytest.fixture(scope="module")
def layer(debian_environment):
    return [debian_environment.root]


def test_root_in_name_only_can_install_chown_and_switch_users(image_session, layer):
    spawner, root, session = image_session(layers=layer)
    result = run(
        spawner,
        root,
        "id -u; mkdir -p /srv/app && chown 1000:1000 /srv/app && stat -c %u:%g /srv/app;"
        " echo changed > /etc/motd; rm /usr/bin/tree; su -s /bin/sh nobody -c 'id -un';"
        " unshare -U true 2>/dev/null && echo NESTED || echo no-nested",
    )
    assert result.exit_code == 0, result.output
    lines = result.output.split()
    assert lines == ["0", "1000:1000", "nobody", "no-nested"], result.output
    upper = rootfs.upper_of(session)
    # On the host: the image's root is the evaluation's uid, its user 1000 a uid of its range.
    assert os.lstat(upper / "srv/app").st_uid == RANGE + 1000
    assert os.lstat(upper / "etc/motd").st_uid == UID
    # The layer is untouched: the change and the removal are the evaluation's layer only.
    assert (layer[0] / "usr/bin/tree").exists()
    assert (layer[0] / "etc/motd").read_text() != "changed\n"


def test_every_file_written_belongs_to_the_evaluations_ids(image_session, layer):
    spawner, root, session = image_session(layers=layer)
    script = (
        "for u in 0 1 42 100 1000 65534 65535; do mkdir -p /data/$u && chown $u:$u /data/$u &&"
        ' su -s /bin/sh -c "echo x > /data/$u/f" $(getent passwd $u | cut -d: -f1) 2>/dev/null'
        ' || setpriv --reuid=$u --regid=$u --clear-groups sh -c "echo x > /data/$u/f"; done; true'
    )
    result = run(spawner, root, script)
    assert result.exit_code == 0, result.output
    idmap = root.idmap
    owners = set()
    for folder, dirs, files in os.walk(rootfs.upper_of(session)):
        for name in [*dirs, *files]:
            st = os.lstat(os.path.join(folder, name))
            owners.add(st.st_uid)
            # overlayfs makes its whiteouts (character devices 0/0) as the mounter, root: no command's file
            whiteout = stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
            assert idmap.owns_uid(st.st_uid) or whiteout, (folder, name, st.st_uid)
    assert {UID, RANGE + 1, RANGE + 42, RANGE + 65535} <= owners


def test_two_evaluations_on_one_image_never_see_each_others_writes(image_session, layer):
    first, root_a, _ = image_session(layers=layer)
    second, root_b, _ = image_session(layers=layer, base=RANGE + ID_COUNT)
    assert run(first, root_a, "echo mine > /etc/secret && rm /etc/hostname").exit_code == 0
    seen = run(second, root_b, "cat /etc/secret 2>&1; test -e /etc/hostname && echo hostname-there")
    assert "No such file" in seen.output and "hostname-there" in seen.output


def test_a_non_root_user_writes_as_the_lease_and_cannot_change_the_system(image_session, layer):
    spawner, root, session = image_session(layers=layer, user=1000, group=1000)
    result = run(spawner, root, "id -u; touch /usr/bin/planted 2>&1; mkdir /tmp/ok && echo fine")
    assert result.output.splitlines()[0] == "1000"
    assert "Permission denied" in result.output and "fine" in result.output
    assert not os.path.lexists(rootfs.upper_of(session) / "usr/bin/planted")


def test_the_maps_put_the_user_at_the_lease():
    idmap = IdMap(lease=60001, base=1_000_000, user=1000, group=1000)
    assert idmap.uid_lines() == "0 1000000 1000\n1000 60001 1\n1001 1001001 64535\n"
    assert idmap.host_uid(0) == 1_000_000 and idmap.host_uid(1000) == 60001 and idmap.host_uid(1001) == 1_001_001
    assert not idmap.owns_uid(1_001_000) and idmap.owns_uid(60001)
    assert IdMap(lease=5, base=100).uid_lines() == "0 5 1\n1 101 65535\n"
    assert IdMap(lease=5, base=100, user=65535).uid_lines() == "0 100 65535\n65535 5 1\n"


def test_the_evaluations_layer_counts_in_its_disk_quota_and_file_count(image_session, layer):
    """What a command writes anywhere in the image lands in the session, where the limits look."""
    import dataclasses

    from evaluations.runtime import Limit

    spawner, root, session = image_session(layers=layer)
    limits = dataclasses.replace(DEFAULT_LIMITS, disk_quota_bytes=20 * 1024 * 1024, max_files=5000)
    policy = SandboxPolicy(image=root)
    env = {"PATH": "/usr/bin:/bin"}
    disk = spawner.run(
        ["/bin/sh", "-c", "for i in 1 2 3 4 5 6; do head -c 5M /dev/zero > /var/big$i; done; sleep 30"],
        cwd=Path("/"),
        env=env,
        limits=limits,
        policy=policy,
    )
    assert disk.limit is Limit.DISK, disk
    # Removed before the next command starts (as the executor, no command running): a command that
    # removed them itself could be measured, and killed, before its `rm` ran.
    for big in (root.rootfs / "var").glob("big*"):
        big.unlink()
    files = spawner.run(
        ["/bin/sh", "-c", "mkdir -p /srv/many && cd /srv/many && seq 1 8000 | xargs touch; sleep 30"],
        cwd=Path("/"),
        env=env,
        limits=limits,
        policy=policy,
    )
    assert files.limit is Limit.FILES, files
