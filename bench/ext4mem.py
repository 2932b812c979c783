"""An ext4 file system on a loop device whose image lives in /dev/shm: ext4's
own costs (journal, directories, renames) without a device's noise, for the
copy benchmarks (bench.publish, bench.scale's copies-small-ext4).  Root only."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

INODE_BYTES = 256    # what each inode takes of the image (mkfs.ext4's default inode size)
BLOCK = 4096
UMOUNT_TRIES = 5


def unavailable() -> str | None:
    """Why an ext4 in memory cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "not root (mount needs it)"
    if not shutil.which("mkfs.ext4"):
        return "mkfs.ext4 is not installed (Debian: e2fsprogs)"
    if not Path("/dev/shm").is_dir():
        return "no /dev/shm"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control)"
    return None


def _unmount(mountpoint: Path) -> None:
    """Unmounts, retrying a busy file system for a while, then lazily (the
    mount goes once its last user does); says so when it had to."""
    for k in range(UMOUNT_TRIES):
        if subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode == 0:
            return
        time.sleep(0.2 * (k + 1))
    r = subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, text=True)
    print(f"ext4mem: {mountpoint} was busy; " + ("detached lazily" if r.returncode == 0 else
          f"still mounted: {r.stderr.strip()} (umount it by hand)"), file=sys.stderr)


@contextlib.contextmanager
def ext4_in_memory(mountpoint: Path, files: int, file_size: int) -> Iterator[Path]:
    """Mounts a fresh ext4 with room for `files` files of `file_size` bytes
    (a sparse image in /dev/shm, twice what they take with their inodes and
    512 MiB more, mounted with discard so that removed files give their
    memory back) on `mountpoint` and yields it; unmounts and removes the image
    at the end.  The inode tables and the journal are written by mkfs, not
    by the kernel in the background while a copy is measured.  Raises
    RuntimeError saying what failed."""
    inodes = files * 5 // 4 + 10_000
    size = (files * -(-file_size // BLOCK) * BLOCK + inodes * INODE_BYTES) * 2 + (512 << 20)
    why = unavailable()
    if why:
        raise RuntimeError(f"no ext4 in memory: {why}")
    fd, name = tempfile.mkstemp(prefix="tiering-bench-", suffix=".ext4", dir="/dev/shm")
    os.close(fd)
    image = Path(name)
    try:
        mountpoint.mkdir(parents=True, exist_ok=True)
        os.truncate(image, size)
        r = subprocess.run(["mkfs.ext4", "-q", "-F", "-N", str(inodes), "-E", "lazy_itable_init=0,lazy_journal_init=0",
                            str(image)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"mkfs.ext4 failed: {r.stderr.strip()}")
        r = subprocess.run(["mount", "-o", "loop,discard", str(image), str(mountpoint)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"mount -o loop failed: {r.stderr.strip()}")
        yield mountpoint
    finally:
        if os.path.ismount(mountpoint):
            _unmount(mountpoint)
        image.unlink(missing_ok=True)   # a lazily detached mount keeps the image's memory until it goes
