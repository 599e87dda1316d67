"""The memory limit is the process's own cgroup's, found through /proc/self/cgroup.

The nested hierarchies with limits are file trees under tmp_path shaped like the kernel's
(/proc/self/cgroup, /proc/self/mountinfo, the cgroup mounts): a test cannot move itself
into a limited cgroup of this machine. The last test reads this machine's real files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sentinel.instrument import cgroup

V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
V1_MOUNTS = ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
             "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
             "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
GIB = 2**30


def _tree(root: Path, self_cgroup: str, mountinfo: str, limits: dict[str, str]) -> str:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(self_cgroup)
    (root / "proc/self/mountinfo").write_text(mountinfo)
    for rel, value in limits.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(value + "\n")
    cgroup.limit_files.cache_clear()
    return str(root)


@pytest.mark.parametrize(("limits", "expected"), [
    # the job's own scope has the limit; the root file says max (what was read before)
    ({"sys/fs/cgroup/memory.max": "max",
      "sys/fs/cgroup/system.slice/memory.max": "max",
      "sys/fs/cgroup/system.slice/job.scope/memory.max": str(2 * GIB)}, 2 * GIB),
    # a parent's limit applies to its children: the smallest on the way up wins
    ({"sys/fs/cgroup/system.slice/memory.max": str(3 * GIB),
      "sys/fs/cgroup/system.slice/job.scope/memory.max": "max"}, 3 * GIB),
    ({"sys/fs/cgroup/memory.max": "max"}, None),
])
def test_v2_nested_limit(tmp_path: Path, limits: dict[str, str], expected: int | None) -> None:
    root = _tree(tmp_path, "0::/system.slice/job.scope\n", V2_MOUNTS, limits)
    assert cgroup.cgroup_limit(root) == expected


def test_v1_nested_limit_and_unlimited_marker(tmp_path: Path) -> None:
    root = _tree(tmp_path, "4:memory:/slurm/uid_0/job_7\n3:cpu:/\n0::/\n", V1_MOUNTS, {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
        "sys/fs/cgroup/memory/slurm/memory.limit_in_bytes": "9223372036854771712",
        "sys/fs/cgroup/memory/slurm/uid_0/job_7/memory.limit_in_bytes": str(5 * GIB),
    })
    assert cgroup.cgroup_limit(root) == 5 * GIB
    assert cgroup.effective_limit(root) == (5 * GIB, "cgroup")


def test_container_view_reads_its_own_top(tmp_path: Path) -> None:
    # inside a container with a cgroup namespace: the mount's root is the container's
    # cgroup and /proc/self/cgroup says "/" (or the same path)
    info = "30 23 0:26 /kubepods/pod1/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    root = _tree(tmp_path, "0::/kubepods/pod1/c1\n", info, {"sys/fs/cgroup/memory.max": str(GIB)})
    assert cgroup.cgroup_limit(root) == GIB


def test_no_cgroup_limit_falls_back_to_the_machine(tmp_path: Path) -> None:
    root = _tree(tmp_path, "0::/user.slice\n", V2_MOUNTS, {"sys/fs/cgroup/user.slice/memory.max": "max"})
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert cgroup.effective_limit(root) == (machine, "machine")


def test_a_cgroup_limit_above_the_machine_is_the_machine(tmp_path: Path) -> None:
    root = _tree(tmp_path, "0::/a\n", V2_MOUNTS, {"sys/fs/cgroup/a/memory.max": str(2**50)})
    assert cgroup.effective_limit(root)[1] == "machine"  # type: ignore[index]


def test_this_machines_own_entry_is_walked_to_its_top() -> None:
    cgroup.limit_files.cache_clear()
    files = cgroup.limit_files()
    text = Path("/proc/self/cgroup").read_text()
    own = [ln.split(":", 2)[2] for ln in text.splitlines() if "memory" in ln.split(":")[1].split(",")]
    if own and own[0] != "/":
        # v1 with a nested memory cgroup (this machine): its own file and its parents'
        assert any(own[0].rstrip("/") in f for f in files), files
        assert any(f.endswith("memory/memory.limit_in_bytes") for f in files), files
    assert cgroup.effective_limit() is not None
