"""An ext4 file system on a loop device whose image lives in /dev/shm: ext4's
own costs (journal, directories, renames) without a device's noise, for the
copy benchmarks (bench.publish, bench.scale's copies-small-ext4).  Root only."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

INODE_BYTES = 256    # what each inode takes of the image (mkfs.ext4's default inode size)


def unavailable() -> str | None:
    """Why an ext4 in memory cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "not root (mount needs it)"
    if not shutil.which("mkfs.ext4"):
        return "mkfs.ext4 is not installed (Debian: e2fsprogs)"
    if not Path("/dev/shm").is_dir():
        return "no /dev/shm"
    return None


@contextlib.contextmanager
def ext4_in_memory(mountpoint: Path, size: int, inodes: int) -> Iterator[Path]:
    """Mounts a fresh ext4 of `size` bytes with `inodes` inodes (a sparse
    image in /dev/shm, mounted with discard so that removed files give their
    memory back) on `mountpoint` and yields it; unmounts and removes the image
    at the end.  The inode tables and the journal are written by mkfs, not
    by the kernel in the background while a copy is measured.  Raises
    RuntimeError saying what failed."""
    why = unavailable()
    if why:
        raise RuntimeError(f"no ext4 in memory: {why}")
    fd, name = tempfile.mkstemp(prefix="tiering-bench-", suffix=".ext4", dir="/dev/shm")
    os.close(fd)
    image = Path(name)
    mountpoint.mkdir(parents=True, exist_ok=True)
    mounted = False
    try:
        os.truncate(image, size)
        r = subprocess.run(["mkfs.ext4", "-q", "-F", "-N", str(inodes), "-E", "lazy_itable_init=0,lazy_journal_init=0",
                            str(image)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"mkfs.ext4 failed: {r.stderr.strip()}")
        r = subprocess.run(["mount", "-o", "loop,discard", str(image), str(mountpoint)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"mount -o loop failed: {r.stderr.strip()}")
        mounted = True
        yield mountpoint
    finally:
        if mounted:
            subprocess.run(["umount", str(mountpoint)], check=False)
        image.unlink(missing_ok=True)
