"""The job's private directories (the index's, one per tier), the owner
record in each, and the sweep of directories that dead jobs left behind.

A private directory is made with a random name and mode 0700 under its
parent: tiering-<user>-<pid>-<random>.  Its owner.json says which process
made it, on which host and in which PID namespace; the next tier-run of the
same user removes the directories of processes that are gone.
"""
from __future__ import annotations

import getpass
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import psutil

from .placement.tiers import remove_tree

OWNER_FILE = "owner.json"


def current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _prefix(user: str) -> str:
    return f"tiering-{user}-{os.getpid()}-"


def _where() -> dict[str, object]:
    """The host and PID namespace a pid is valid in: a tier path on a shared
    file system, or a /dev/shm shared between containers, may hold the
    directories of jobs whose pids mean nothing here."""
    try:
        pidns: object = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = None
    return {"host": socket.gethostname(), "pidns": pidns}


def make_private_dir(parent: str, user: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=_prefix(user), dir=parent))  # 0700, random name
    me = psutil.Process()
    (path / OWNER_FILE).write_text(json.dumps({"pid": me.pid, "create_time": me.create_time(), **_where()}))
    return path


def _owner_alive(path: Path) -> bool:
    """False only when the job that made path is known to be gone: a
    directory of another host or PID namespace counts as alive."""
    try:
        owner = json.loads((path / OWNER_FILE).read_text())
        here = _where()
        if any(k in owner and owner[k] != here[k] for k in here):
            return True
        proc = psutil.Process(int(owner["pid"]))
        return abs(proc.create_time() - float(owner["create_time"])) < 1.0
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        pass
    # no readable owner file: trust the pid in the name for a minute
    try:
        pid = int(path.name.split("-")[-2])
        young = time.time() - path.stat().st_mtime < 60
        return young and psutil.pid_exists(pid)
    except (ValueError, IndexError, OSError):
        return False


def sweep_leftovers(parents: list[str], user: str) -> list[Path]:
    """Removes private directories of this user's dead jobs."""
    removed = []
    for parent in dict.fromkeys(parents):
        try:
            candidates = list(Path(parent).glob(f"tiering-{user}-*"))
        except OSError:
            continue
        for p in candidates:
            try:
                if not p.is_dir() or p.is_symlink() or p.stat().st_uid != os.getuid():
                    continue
            except OSError:
                continue
            if not _owner_alive(p):
                remove_tree(p)
                removed.append(p)
    return removed


def index_parent() -> str:
    return "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else tempfile.gettempdir()
