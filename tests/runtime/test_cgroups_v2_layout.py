"""The cgroup v2 path, as far as it goes without a v2 memory controller on this machine.

A temporary folder laid out as the kernel lays out a delegated v2 cgroup stands
in for it: these tests check which files are written with what, and how the
kernel's files are read. They cannot check what only the kernel does (EBUSY
from ``subtree_control`` before the service's processes move, ``cgroup.kill``
killing, ``rmdir`` of a cgroup): that is for a v2 host. Also the mount table
parsing, on texts of real hosts. No root needed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluations.runtime import cgroups
from evaluations.runtime.cgroupfs import Mounts, favors_dynmods, probe, read_mounts, setup_v2

MIB = 1024 * 1024
ALL_FEATURES = ("memory.swap.max", "memory.oom.group", "memory.peak", "pids.peak", "cgroup.kill")

PURE_V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
# This machine: v1 controllers, and a cgroup2 mount with none.
HYBRID = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


@pytest.mark.parametrize(
    ("own", "root"),
    [
        ("0::/system.slice/te.service\n", "/sys/fs/cgroup/system.slice/te.service"),
        # A process started after the service's processes moved into the leaf: the same root.
        ("0::/system.slice/te.service/service\n", "/sys/fs/cgroup/system.slice/te.service"),
        ("0::/\n", "/sys/fs/cgroup"),  # a container with its own cgroup namespace
    ],
)
def test_the_v2_root_is_the_services_own_cgroup(own, root):
    assert read_mounts(PURE_V2, own) == Mounts(Path(root), {})


def test_a_hybrid_host_offers_its_v1_hierarchies_and_an_empty_v2():
    mounts = read_mounts(HYBRID, "8:pids:/\n4:memory:/process_api/x\n0::/\n")
    assert mounts.v2_root == Path("/sys/fs/cgroup/unified")
    assert mounts.v1 == {name: Path(f"/sys/fs/cgroup/{name}") for name in ("cpuacct", "memory", "freezer", "pids")}


def test_co_mounted_and_escaped_mount_points():
    text = (
        "1 0 0:1 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "2 0 0:2 / /mnt/my\\040cgroups rw - cgroup cgroup rw,memory,pids\n"
    )
    assert read_mounts(text, "") == Mounts(
        None,
        {
            "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct"),
            "memory": Path("/mnt/my cgroups"),
            "pids": Path("/mnt/my cgroups"),
        },
    )


def test_a_cgroup_outside_what_the_mount_shows_is_not_ours():
    text = "30 23 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert read_mounts(text, "0::/system.slice/other.service\n").v2_root is None
    assert read_mounts(text, "0::/docker/abc/inner\n").v2_root == Path("/sys/fs/cgroup/inner")


def lay_out_v2(root: Path, controllers="cpuset cpu io memory pids", features=ALL_FEATURES) -> Path:
    """A delegated v2 cgroup with our parent folder in it, as the kernel would show them."""
    root.mkdir(exist_ok=True)
    for name, text in {
        "cgroup.controllers": controllers,
        "cgroup.subtree_control": "",
        "cgroup.type": "domain",
        "cgroup.procs": "",
    }.items():
        (root / name).write_text(text)
    parent = root / "term-executor"
    parent.mkdir()
    for name in ("cgroup.subtree_control", "memory.max", "pids.max", *features):
        (parent / name).write_text("")
    return root


def test_setup_enables_memory_and_pids_for_our_parent_and_its_children(tmp_path):
    support = probe(Mounts(lay_out_v2(tmp_path / "te.service"), {}), "term-executor")
    root = tmp_path / "te.service"
    assert support.mode is cgroups.CgroupMode.V2
    assert support.parents == {"unified": root / "term-executor"}
    assert support.features == frozenset(ALL_FEATURES)
    assert support.status() == {"memory": "cgroup v2", "processes": "cgroup v2"}
    assert (root / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (root / "term-executor" / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert not (root / "service").exists()  # nothing was busy: no process had to move


def test_controllers_already_enabled_are_left_as_they_are(tmp_path):
    root = lay_out_v2(tmp_path / "te.service")
    (root / "cgroup.subtree_control").write_text("cpu memory pids\n")
    setup_v2(root, "term-executor")
    assert (root / "cgroup.subtree_control").read_text() == "cpu memory pids\n"


def test_a_v2_root_without_the_controllers_is_refused_with_the_reason(tmp_path):
    root = lay_out_v2(tmp_path / "te.service", controllers="cpu memory")
    support = probe(Mounts(root, {}), "term-executor")
    assert support.mode is cgroups.CgroupMode.MONITOR
    assert f"cgroup v2 at {root}: controller(s) pids not delegated to it" in support.detail
    assert "cgroup v1: no memory and no pids hierarchy" in support.warning


def v2_cgroup(tmp_path, features=ALL_FEATURES) -> cgroups.EvalCgroup:
    support = setup_v2(lay_out_v2(tmp_path / "te.service", features=features), "term-executor")
    return cgroups.EvalCgroup.create("e1", 256 * MIB, 50, support=support)


def test_create_writes_the_limits_swap_zero_and_group_oom(tmp_path):
    cgroup = v2_cgroup(tmp_path)
    folder = tmp_path / "te.service" / "term-executor" / "e1"
    written = {
        name: (folder / name).read_text() for name in ("memory.max", "memory.swap.max", "memory.oom.group", "pids.max")
    }
    assert written == {"memory.max": str(256 * MIB), "memory.swap.max": "0", "memory.oom.group": "1", "pids.max": "50"}
    assert cgroup.procs_files() == [folder / "cgroup.procs"]
    assert cgroup.join_prefix()[-2:] == [str(folder / "cgroup.procs"), "--"]


def test_the_kernels_figures_are_read(tmp_path):
    cgroup = v2_cgroup(tmp_path)
    folder = cgroup.dirs["unified"]
    for name, text in {
        "memory.current": "1000\n",
        "pids.current": "3\n",
        "memory.peak": f"{300 * MIB - 1}\n",
        "pids.peak": "7\n",
        "memory.events": "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 1\n",
        "pids.events": "max 4\n",
        "cpu.stat": "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
    }.items():
        (folder / name).write_text(text)
    assert cgroup.usage() == cgroups.Usage(1000, 3)
    assert cgroup.figures() == cgroups.Figures(300 * MIB - 1, 1.5, 7, 2)
    assert cgroup.oom_killed() and cgroup.process_limit_hits() == 4
    assert cgroup.oom_message() == "memory limit exceeded (peak 300 MiB > 256 MiB)"


def test_a_kernel_without_the_optional_files_gets_sampled_peaks_and_no_writes_to_them(tmp_path):
    cgroup = v2_cgroup(tmp_path, features=())
    folder = cgroup.dirs["unified"]
    assert not (folder / "memory.swap.max").exists() and not (folder / "memory.oom.group").exists()
    for memory, processes in ((5000, 2), (9000, 1), (7000, 4)):
        (folder / "memory.current").write_text(f"{memory}\n")
        (folder / "pids.current").write_text(f"{processes}\n")
        cgroup.usage()
    assert (cgroup.peak_memory_bytes(), cgroup.peak_processes()) == (9000, 4)


def test_kill_goes_through_cgroup_kill_and_waits_for_populated_0(tmp_path):
    cgroup = v2_cgroup(tmp_path)
    folder = cgroup.dirs["unified"]
    (folder / "cgroup.procs").write_text("4194305\n")  # above any pid_max: no real process is at risk
    (folder / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    assert cgroup.kill() == 1
    assert (folder / "cgroup.kill").read_text() == "1"


def test_stale_cgroups_are_the_folders_not_the_parents_files(tmp_path):
    cgroup = v2_cgroup(tmp_path)
    assert cgroups.stale_cgroups([], support=cgroup.support) == ["e1"]
    assert cgroups.stale_cgroups(["e1"], support=cgroup.support) == []


def test_favordynmods_is_read_off_any_cgroup_mount():
    assert not favors_dynmods(HYBRID) and not favors_dynmods(PURE_V2)
    assert favors_dynmods(PURE_V2.replace("rw,nsdelegate", "rw,nsdelegate,favordynmods"))
    assert favors_dynmods(HYBRID.replace("cgroup rw,memory", "cgroup rw,memory,favordynmods"))
    assert not favors_dynmods(HYBRID.replace("tmpfs rw,mode=755", "tmpfs rw,mode=755,favordynmods"))  # not a cgroup's
