"""Facts of the node a profile is resolved on: available memory, the memory
cgroup's headroom, free space, file-system types.

Module-level names (CGROUP_ROOT, available_memory, free_bytes, ...) are looked
up through this module by the resolver, so tests can point them at fakes.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil

# Where the cgroup file systems are mounted and where the kernel says which cgroup
# this process is in.  Module-level so that tests can point them at a fake tree.
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
# cgroup v1 reports "no limit" as a huge page-aligned number (0x7FFFFFFFFFFFF000).
_CGROUP_V1_UNLIMITED = 1 << 62

# File system types that are not a node-local disk: network/parallel file systems and
# memory-backed ones.  A tier marked `local_only: true` must not live on these.
NON_LOCAL_FSTYPES = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "ceph",
        "glusterfs", "panfs", "pvfs2", "orangefs", "wekafs", "afs", "9p", "davfs",
        "tmpfs", "ramfs", "devtmpfs",
    }
)
NON_LOCAL_FSTYPE_PREFIXES = ("fuse",)  # "fuse", "fuse.sshfs", "fuse.gcsfuse", ...


def available_memory() -> int:
    """Bytes of RAM the kernel could give to new allocations (psutil 'available')."""
    return int(psutil.virtual_memory().available)


def _cgroup_relpaths(proc_file: Path) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory-controller path) of this process's cgroup, from /proc/self/cgroup."""
    v2 = v1 = None
    try:
        lines = proc_file.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2 no limit) -> None


def _headroom_along(
    base: Path, rel: str | None, limit_file: str, usage_file: str, unlimited: int | None
) -> int | None:
    """Smallest (limit - usage) over the cgroup at base/rel and its ancestors up to base."""
    dirs = [base]
    if rel:
        current = base
        for part in [p for p in rel.split("/") if p]:
            current = current / part
            dirs.append(current)
    best: int | None = None
    for directory in dirs:
        limit = _read_int(directory / limit_file)
        if limit is None or (unlimited is not None and limit >= unlimited):
            continue
        usage = _read_int(directory / usage_file) or 0
        room = max(0, limit - usage)
        best = room if best is None else min(best, room)
    return best


def cgroup_memory_headroom(root: Path | None = None, proc_file: Path | None = None) -> int | None:
    """Bytes this process's memory cgroup still allows (limit minus usage), None if unlimited.

    cgroup v2: memory.max - memory.current, for the process's cgroup (from
    /proc/self/cgroup; inside a container it is the root) and every ancestor,
    smallest wins.  cgroup v1 (memory controller under ROOT/memory) is read the
    same way with memory.limit_in_bytes - memory.usage_in_bytes, since many HPC
    nodes still run v1.  tmpfs pages count against these limits.
    """
    root = CGROUP_ROOT if root is None else Path(root)
    proc_file = PROC_SELF_CGROUP if proc_file is None else Path(proc_file)
    v2_rel, v1_rel = _cgroup_relpaths(proc_file)
    rooms = [
        _headroom_along(root, v2_rel, "memory.max", "memory.current", None),
        _headroom_along(
            root / "memory", v1_rel, "memory.limit_in_bytes", "memory.usage_in_bytes", _CGROUP_V1_UNLIMITED
        ),
    ]
    known = [r for r in rooms if r is not None]
    return min(known) if known else None


def memory_tier_bound() -> int:
    """Upper bound for memory-tier capacities given as "auto" or "N%".

    Half of the available RAM and, under a cgroup memory limit, half of what that
    limit still leaves (tmpfs pages are charged to the cgroup, so a full RAM tier
    plus the training process must stay under the limit).
    """
    bound = available_memory() // 2
    room = cgroup_memory_headroom()
    if room is not None:
        bound = min(bound, room // 2)
    return bound


SHM_RESERVE_MIN = 1 << 30


def shm_reserve(path: str) -> int:
    """Room "auto" leaves free on a memory tier's file system for the job's own
    shared memory (PyTorch DataLoader workers hand every batch over through
    /dev/shm): a quarter of the file system's size, at least 1 GiB.  On a small
    /dev/shm (64 MiB in a default Docker container) nothing is left for a tier."""
    return max(SHM_RESERVE_MIN, int(shutil.disk_usage(path).total) // 4)


def free_bytes(path: str) -> int:
    """Bytes an unprivileged user may still write on the file system holding path."""
    return int(shutil.disk_usage(path).free)


def filesystem_type(path: str) -> str:
    """Type of the file system holding path ("ext4", "tmpfs", "lustre", ...), "" if unknown."""
    real = os.path.realpath(path)
    best, best_len = "", -1
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint.rstrip("/") or "/"
        inside = real == mount or mount == "/" or real.startswith(mount + "/")
        if inside and len(mount) >= best_len:  # later mounts shadow earlier ones
            best, best_len = part.fstype, len(mount)
    return best


def is_local_fstype(fstype: str) -> bool:
    fstype = fstype.lower()
    if fstype in NON_LOCAL_FSTYPES:
        return False
    return not any(fstype == p or fstype.startswith(p + ".") for p in NON_LOCAL_FSTYPE_PREFIXES)


def usable_dir_problem(path: str) -> str | None:
    """Why tier-run could not create its private directory in path, or None if it can."""
    if not os.path.exists(path):
        return f"path {path} does not exist"
    if not os.path.isdir(path):
        return f"path {path} is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"path {path} is not writable by this user"
    return None
