"""Private files and directories of the cluster parts: made 0700/0600, and
checked before they are trusted (they have stable names that another user
could try to plant); and the pause between two looks at them."""
from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path


def pause(seconds: float, stop: threading.Event | None) -> bool:
    """Waits `seconds`, or less when `stop` is set meanwhile: True when it is."""
    if stop is None:
        time.sleep(seconds)
        return False
    return stop.wait(seconds)


class NotPrivate(Exception):
    """A directory or file that should be this user's own is not."""


def ensure_private_dir(path: Path) -> None:
    """Makes path (mode 0700) unless it exists; either way it must be a real
    directory (no symlink) owned by this user with mode 0700."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700:
        raise NotPrivate(f"{path} is not a private directory of this user (owner uid {st.st_uid}, mode "
                         f"{stat.S_IMODE(st.st_mode):o}{', a symlink' if stat.S_ISLNK(st.st_mode) else ''})")


def check_parent(path: Path) -> None:
    """Other users must not be able to rename entries of path (writable by
    them only with the sticky bit, as /tmp)."""
    st = os.stat(path)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise NotPrivate(f"{path} can be written by other users without the sticky bit; "
                         "use a directory only you can write to")


def write_private(path: Path, data: bytes) -> None:
    """Writes path atomically (a temporary name, then rename), mode 0600."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def read_private(path: Path) -> bytes | None:
    """The contents of a regular file of this user that nobody else can read
    or write; None when it does not exist.  Raises NotPrivate otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise NotPrivate(f"{path} cannot be opened as a private file: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise NotPrivate(f"{path} is not a private file of this user (owner uid {st.st_uid}, "
                             f"mode {stat.S_IMODE(st.st_mode):o})")
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
