"""The job's private directories (the index's, one per tier), the owner
record in each, and the sweep of directories that dead jobs left behind.

A private directory is made with a random name and mode 0700 under its
parent: tiering-<user>-<pid>-<random>.  The parent must be one that no other
user can rename entries in (NOTE [tier directories] in docs/design.md:
`parent_problem`).  The directory's owner.json, written before anything else
in it, is the mark that tier-run made it (the directory's own name and inode
in it) and says which process did (its pid and its start time in clock ticks
since boot, exact and immune to clock changes), on which host, in which boot
and in which PID namespace; the next tier-run of the same user removes the
marked directories of processes that are gone, and nothing else.
"""
from __future__ import annotations

import getpass
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

OWNER_FILE = "owner.json"
MARKER = "tier-run"     # an owner record's made_by: tier-run made the directory (NOTE [tier directories])
RECORD_MAX = 4096       # bytes of an owner record read at most
MAX_LINKS = 40          # symlinks followed while checking a parent (the kernel's limit)


class UnsafeParent(OSError):
    """A private directory must not be made in this parent; the message says why and what to do."""


def current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


# -- who may rename entries in a parent (NOTE [tier directories]) ---------------

def _who(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _dir_problem(path: str, st: os.stat_result) -> str | None:
    if st.st_uid not in (os.getuid(), 0):
        return f"{path} belongs to {_who(st.st_uid)}"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"{path} is writable by other users and has no sticky bit (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def parent_problem(path: str) -> str | None:
    """Why a private directory must not be made in `path`, or None.

    Safe means no other user can rename or replace what the path leads to:
    every directory the path is resolved through, from / to `path` itself
    (symlinks followed, as the kernel does), belongs to this user or root and
    is not writable by group or others unless it has the sticky bit, and every
    symlink on the way belongs to this user or root."""
    todo = [c for c in reversed(os.path.abspath(path).split("/")) if c]
    cur = "/"
    problem = _dir_problem("/", os.stat("/"))
    links = 0
    while todo and problem is None:
        name = todo.pop()
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except OSError as e:
            return f"{nxt}: {e.strerror}"
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if st.st_uid not in (os.getuid(), 0):
                return f"{nxt} is a symlink that belongs to {_who(st.st_uid)}"
            if links > MAX_LINKS:
                return f"{path}: too many symlinks"
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            todo.extend(c for c in reversed(target.split("/")) if c)
            continue
        if not stat.S_ISDIR(st.st_mode):
            return f"{nxt} is not a directory"
        problem = _dir_problem(nxt, st)
        cur = nxt
    return problem


SAFE_PARENT_FIX = ("another user could rename the directory tier-run makes there and put one of their own "
                   "in its place; use a sticky directory such as /tmp or /dev/shm, or a directory only you "
                   "can write to (e.g. mkdir -m 700 /local/$USER)")


# -- owner records -------------------------------------------------------------

def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start) of process pid from /proc/PID/stat (fields 3 and 22;
    start in clock ticks after boot), None when it is gone."""
    text = _read(f"/proc/{pid}/stat")
    try:
        fields = text.rpartition(")")[2].split() if text else []
        return (fields[0], int(fields[19])) if fields else None
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """When process pid started, in clock ticks after boot: exact, unlike a
    wall-clock time derived from it."""
    st = _proc_stat(pid)
    return st[1] if st else None


def still_runs(pid: int, start: object) -> bool:
    """Process pid is the one that started at `start` (start_ticks: not a
    reused pid) and has not exited (a zombie nobody reaped yet has)."""
    st = _proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X") and st[1] == start


def _where() -> dict[str, object]:
    """The host, boot and PID namespace a pid is valid in: a tier path on a
    shared file system, or a /dev/shm shared between containers, may hold the
    directories of jobs whose pids mean nothing here."""
    try:
        pidns: object = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = None
    return {"host": socket.gethostname(), "boot": _read("/proc/sys/kernel/random/boot_id"), "pidns": pidns}


def owner_record(path: Path) -> dict[str, object]:
    """The owner record of private directory path for this process: the
    marker (made by tier-run, path's name and inode: a copy of the directory
    or a renamed one is not it) and who owns it."""
    pid = os.getpid()
    return {"made_by": MARKER, "name": path.name, "inode": path.lstat().st_ino,
            "pid": pid, "start": start_ticks(pid), **_where()}


def _write_owner(path: Path) -> None:
    """path's owner record for this process, under a temporary name and
    renamed: a reader finds the whole record or none."""
    tmp = path / f".{OWNER_FILE}.tmp"
    tmp.write_text(json.dumps(owner_record(path)))
    tmp.rename(path / OWNER_FILE)


def make_private_dir(parent: str, user: str) -> Path:
    """A new 0700 directory with a random name in parent, its owner record
    (the mark that tier-run made it) written before anything else in it."""
    problem = parent_problem(parent)
    if problem is not None:
        raise UnsafeParent(f"{parent}: {problem}: {SAFE_PARENT_FIX}")
    path = Path(tempfile.mkdtemp(prefix=f"tiering-{user}-{os.getpid()}-", dir=parent))  # 0700, random name
    try:
        _write_owner(path)
    except BaseException:      # a signal too: nothing marks the directory as tier-run's yet
        remove_tree(path)
        raise
    return path


def proven_owner(path: Path) -> dict[str, Any] | None:
    """path's owner record when it proves that tier-run made path: a plain
    file of at most RECORD_MAX bytes holding a whole record with the marker,
    path's name and path's inode.  None for anything else (no record, one
    being written, of an older version, a copy of another directory's): such
    a directory is never removed (NOTE [tier directories])."""
    try:
        st = path.lstat()
        fd = os.open(path / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        owner = json.loads(os.read(fd, RECORD_MAX))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if (not isinstance(owner, dict) or owner.get("made_by") != MARKER or owner.get("name") != path.name
            or owner.get("inode") != st.st_ino or not isinstance(owner.get("pid"), int)):
        return None
    return owner


def _owner_alive(owner: dict[str, Any]) -> bool:
    """False only when the job of this owner record is known to be gone: a
    directory of another host or PID namespace counts as alive."""
    pid = owner["pid"]
    here = _where()
    if owner.get("host", here["host"]) != here["host"]:
        return True
    if owner.get("boot") and here["boot"] and owner["boot"] != here["boot"]:
        return False                     # made before this machine last booted
    if owner.get("pidns", here["pidns"]) != here["pidns"]:
        return True
    if owner.get("start") is None:       # a record without a start time (no /proc): the pid alone
        return psutil.pid_exists(pid)
    return start_ticks(pid) == owner["start"]


def _my_dirs(parents: list[str], pattern: str) -> list[Path]:
    """The directories (not symlinks) of this user named by pattern in parents."""
    found = []
    for parent in dict.fromkeys(parents):
        try:
            candidates = list(Path(parent).glob(pattern))
        except OSError:
            continue
        for p in candidates:
            try:
                st = p.lstat()
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                found.append(p)
    return found


def relation(path: str, other: str) -> str | None:
    """How path stands to other once symlinks are resolved: "is", "is
    inside", "holds", or None when neither holds the other."""
    a, b = os.path.realpath(path), os.path.realpath(other)
    if a == b:
        return "is"
    if a.startswith(b.rstrip("/") + "/"):
        return "is inside"
    if b.startswith(a.rstrip("/") + "/"):
        return "holds"
    return None


def sweep_leftovers(parents: list[str], user: str, data: Sequence[str] = ()) -> list[Path]:
    """Removes private directories of this user's dead jobs: only those
    tier-run provably made (`proven_owner`), and none that is, is inside or
    holds a data root (data)."""
    removed = []
    for p in _my_dirs(parents, f"tiering-{user}-*"):
        if any(relation(str(p), root) for root in data):
            continue
        owner = proven_owner(p)
        if owner is not None and not _owner_alive(owner):
            remove_tree(p)
            removed.append(p)
    return removed


def own_unheld(parents: list[str], user: str, held: list[Path]) -> list[Path]:
    """This process's private directories in parents that its job does not
    hold: made by a set-up that a signal cut short between making one and
    recording it (the set-up's signal interrupts the main thread wherever it
    is, command.SetupWatch).  Names carry the maker's pid, and the owner
    record must name this process, so another job's directory (or one that
    tier-run did not make) is never among them."""
    names, me = {p.name for p in held}, (os.getpid(), start_ticks(os.getpid()))
    found = []
    for p in _my_dirs(parents, f"tiering-{user}-{os.getpid()}-*"):
        owner = proven_owner(p)
        if p.name not in names and owner is not None and (owner["pid"], owner.get("start")) == me:
            found.append(p)
    return found


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# -- background removal (NOTE [background teardown] in docs/design.md) ---------

def remove_in_background(paths: list[Path]) -> subprocess.Popen[bytes] | None:
    """Hands private directories to a detached remover process (its own
    session, niced) and returns at once; None when it cannot start (the
    caller then removes them itself).  The remover takes each directory's
    owner record over, so that other jobs' sweeps leave it alone while it
    runs and remove what a killed remover left (`sweep_leftovers`)."""
    if not paths:
        return None
    try:
        return subprocess.Popen([sys.executable, "-m", "tiering.rundirs", *map(str, paths)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)
    except OSError:
        return None


def _take_over(path: Path) -> bool:
    """Rewrites path's owner record for this process; False when path is not
    a private directory of this user's that tier-run made (then it is left
    alone)."""
    try:
        st = path.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or proven_owner(path) is None:
            return False
        _write_owner(path)
    except OSError:
        return False
    return True


def remove_private_dir(path: Path) -> None:
    """Everything in path but its owner record, then the record and path:
    killed on the way, what is left still carries the record (of a process
    that is gone) for the next sweep."""
    try:
        names = [n for n in os.listdir(path) if n != OWNER_FILE]
    except OSError:
        return
    rm = shutil.which("rm")
    if rm and names:
        subprocess.run([rm, "-rf", "--", *(str(path / n) for n in names)], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    for n in names:                     # without rm, or what it could not remove
        if (path / n).is_dir() and not (path / n).is_symlink():
            remove_tree(path / n)
        else:
            _unlink(path / n)
    _unlink(path / OWNER_FILE)
    try:
        path.rmdir()
    except OSError:
        remove_tree(path)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _remover(args: list[str]) -> None:
    try:
        os.nice(19)
    except OSError:
        pass
    paths = [Path(a) for a in args]
    mine = [p for p in paths if _take_over(p)]
    for p in mine:
        remove_private_dir(p)


if __name__ == "__main__":
    _remover(sys.argv[1:])


def index_parent() -> str:
    """Where the index's private directory goes: /dev/shm, else the temporary
    directory, whichever is writable and safe (the first writable one when
    neither is safe: make_private_dir then says why)."""
    candidates = [p for p in dict.fromkeys(["/dev/shm", tempfile.gettempdir(), "/tmp"])
                  if os.access(p, os.W_OK | os.X_OK)]
    for p in candidates:
        if parent_problem(p) is None:
            return p
    return candidates[0] if candidates else tempfile.gettempdir()
