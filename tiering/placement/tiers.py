"""One local tier while the job runs, and how a file is copied onto it.

A copy is written under the tier's staging directory, checked (bytes copied,
source size and mtime unchanged since the scan) and renamed to its final
name; only then may the daemon publish it (NOTE [publish after rename] in
docs/design.md).  A partial or rejected copy is removed.
"""
from __future__ import annotations

import errno
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..catalog import CatalogFile

CHUNK = 8 << 20


@dataclass
class TierState:
    """One local tier while the job runs."""

    name: str
    kind: str
    root: Path          # private directory of this job on the tier
    capacity: int
    threads: int
    used: int = 0       # bytes allocated by published copies + reservations
    files: int = 0      # published copies
    placed_bytes: int = 0  # logical bytes of published copies
    failures: int = 0
    pool: ThreadPoolExecutor | None = None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    def free(self) -> int:
        return self.capacity - self.used

    def copy_path(self, f: CatalogFile) -> Path:
        """Where a file's copy lives: <data>/<data-root id>/<relative path>
        (the shim builds the same path)."""
        return self.data / str(f.root) / f.rel


class SourceChanged(Exception):
    """The source is not what the catalog recorded: nothing to publish."""


def copy_file(src: str, f: CatalogFile, tier: TierState, stop: threading.Event,
              on_read: Callable[[int], None]) -> int | None:
    """Copies one file into the tier under its final name; returns the bytes
    it takes there, or None when `stop` was set halfway.  Raises
    SourceChanged when the source's size or mtime is not the catalog's, and
    OSError when the copy fails; nothing is left behind in either case."""
    dst = tier.copy_path(f)
    tmp = tier.staging / f"{threading.get_ident()}-{os.getpid()}.part"
    try:
        fd_in = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fd_out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                copied = _transfer(fd_in, fd_out, f.size, stop, on_read)
                os.fchmod(fd_out, 0o400)   # a copy is never written through
                st_out = os.fstat(fd_out)
            finally:
                os.close(fd_out)
            st_in = os.fstat(fd_in)
        finally:
            os.close(fd_in)
        if copied < 0:  # stopped halfway
            return None
        if copied != f.size or st_in.st_size != f.size or st_in.st_mtime_ns != f.mtime_ns:
            raise SourceChanged(f"{src} changed since the scan")
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tmp, dst)
        return st_out.st_blocks * 512
    finally:
        unlink_quietly(tmp)  # a partial or rejected copy; gone already after the rename


def _transfer(fd_in: int, fd_out: int, size: int, stop: threading.Event,
              on_read: Callable[[int], None]) -> int:
    copied = 0
    use_sendfile = True
    while not stop.is_set():
        n = 0
        if use_sendfile:
            try:
                n = os.sendfile(fd_out, fd_in, copied, CHUNK)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                use_sendfile = False
                continue
        else:
            data = os.pread(fd_in, CHUNK, copied)
            n = len(data)
            view = memoryview(data)
            while view:
                view = view[os.write(fd_out, view):]
        if n == 0:
            break
        copied += n
        on_read(n)
    if stop.is_set() and copied < size:
        return -1
    return copied


def unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
