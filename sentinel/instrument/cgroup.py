"""The memory limit this process runs under: its own cgroup's, else the machine's.

Reading ``/sys/fs/cgroup/memory.max`` reads the *root* cgroup's file, which is the
process's own only inside a container whose cgroup namespace puts it at the root. On a
host, under systemd, Slurm or a nested container the process sits deeper, e.g.
``/sys/fs/cgroup/system.slice/job.scope/memory.max``, and every ancestor's limit applies
too. So the limit is found from the process's own entry:

- ``/proc/self/cgroup`` names the process's cgroup per hierarchy: ``0::/a/b`` for cgroup
  v2, ``4:memory:/a/b`` (or ``4:memory,…:/a/b``) for v1's memory controller;
- ``/proc/self/mountinfo`` says where each hierarchy is mounted and which part of it the
  mount shows (its root: ``/`` on a host, the container's own cgroup inside one);
- the limit is the smallest ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1) from the
  process's cgroup up to the top of the mount, nested hierarchies included.

``max`` (v2) and v1's "no limit" (a page-rounded 2**63) mean none. Without a cgroup limit
the machine's physical memory is the limit; the smaller of the two always wins.

The files to read are found once per process (:func:`limit_files`); their values are read
at every call, so a limit changed at runtime is seen. Only the standard library.
"""

from __future__ import annotations

import os
from functools import lru_cache

_NO_LIMIT = 2**60  # v1 writes 2**63 rounded to a page for "unlimited"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _mounts(root: str) -> list[tuple[str, str, str, str]]:
    """``(fstype, super options, mount root, mount point)`` of the cgroup mounts."""
    out = []
    for line in (_read(os.path.join(root, "proc/self/mountinfo")) or "").splitlines():
        left, sep, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if not sep or len(a) < 5 or len(b) < 3 or b[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((b[0], b[2], a[3], a[4]))
    return out


def _chain(mount_point: str, mount_root: str, cgroup: str, name: str, root: str) -> list[str]:
    """The ``name`` files from the process's cgroup up to the top of the mount."""
    cg = cgroup.rstrip("/") or "/"
    mr = mount_root.rstrip("/") or "/"
    if mr != "/" and (cg == mr or cg.startswith(mr + "/")):
        rel = cg[len(mr):]  # the mount shows the hierarchy from mount_root down
    elif mr == "/":
        rel = cg
    else:
        rel = ""  # a namespaced view: the process is at the mount's top
    parts = [p for p in rel.split("/") if p]
    base = os.path.join(root, mount_point.lstrip("/"))
    return [os.path.join(base, *parts[:i], name) for i in range(len(parts), -1, -1)]


@lru_cache(maxsize=8)
def limit_files(root: str = "/") -> tuple[str, ...]:
    """The limit files that apply to this process, innermost first (v2 before v1).

    Args:
        root: where ``proc/`` and the cgroup mounts are found (``/``; a test tree).
    """
    v2: str | None = None
    v1: str | None = None
    for line in (_read(os.path.join(root, "proc/self/cgroup")) or "").splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    files: list[str] = []
    mounts = _mounts(root)
    if v1 is not None:
        for fstype, opts, mroot, mpoint in mounts:
            if fstype == "cgroup" and "memory" in opts.split(","):
                files += _chain(mpoint, mroot, v1, "memory.limit_in_bytes", root)
                break
    if v2 is not None:
        points = [(mroot, mpoint) for fstype, _, mroot, mpoint in mounts if fstype == "cgroup2"]
        if not points and not mounts:  # no mountinfo: the usual place
            points = [("/", "/sys/fs/cgroup")]
        for mroot, mpoint in points:
            files = _chain(mpoint, mroot, v2, "memory.max", root) + files
    return tuple(files)


def cgroup_limit(root: str = "/") -> int | None:
    """The smallest memory limit of this process's cgroups (v1 or v2, any depth), or None."""
    best: int | None = None
    for path in limit_files(root):
        raw = (_read(path) or "").strip()
        if raw.isdigit() and 0 < int(raw) < _NO_LIMIT:
            best = int(raw) if best is None else min(best, int(raw))
    return best


def machine_memory() -> int | None:
    """Physical memory of the machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def effective_limit(root: str = "/") -> tuple[int, str] | None:
    """The memory this process may use and where the figure comes from.

    Returns:
        ``(bytes, "cgroup")`` or ``(bytes, "machine")`` (the smaller when both are known),
        or None.
    """
    cg, machine = cgroup_limit(root), machine_memory()
    if cg is not None and (machine is None or cg <= machine):
        return cg, "cgroup"
    return (machine, "machine") if machine else None
