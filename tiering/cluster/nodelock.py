"""One placement service per node: the election among the tier-runs of one
(user, job id, data roots) on a node, and the service's lifetime.

NOTE [node service] in docs/design.md.  The service is a detached process
that the first tier-run starts; every tier-run, the first included, is only
a *member*: it holds a shared flock on ``members.lock`` for as long as it
lives.  The kernel drops that lock when a member exits or is killed, so the
service learns that the last member is gone by taking the lock exclusively.
``elect.lock`` serialises joining with the service's decision to stop: a
member takes its shared lock while holding ``elect.lock``, and the service
stops only after seeing no member while holding it.  A member that exits
early, the first one too, changes nothing for the others.

Files in the node directory (0700, owned by the user, under /dev/shm):
``elect.lock``, ``members.lock``, ``starting.json`` (the service process a
member started, until it is ready), ``service.json`` ({"pid", "start",
"ready", "info"}: who serves and what members need to attach; start as
rundirs.start_ticks), ``service.log``.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..rundirs import index_parent, start_ticks, still_runs
from .files import NotPrivate, ensure_private_dir, pause, write_private

POLL = 0.05
LEAVE_LOOK = 5.0               # seconds a leaving member waits for elect.lock to see whether it is the last
SERVICE_FILE = "service.json"
STARTING_FILE = "starting.json"
LOG_FILE = "service.log"
JOB_FILE = "job.json"          # the job's options, written by the member that starts the service
YOUNG_SECONDS = 60             # a node directory without elect.lock is left alone this long (being made)


class NodeLockError(Exception):
    """The node directory cannot be used, or the service did not start."""


@dataclass(frozen=True)
class NodeKey:
    """What tier-runs share one service: the same user, job and data roots."""
    user: str
    job_id: str
    data_roots: tuple[str, ...]

    def digest(self) -> str:
        text = json.dumps([self.user, self.job_id, sorted(self.data_roots)])
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def node_dir(key: NodeKey, parent: str | None = None) -> Path:
    """The node directory: a stable name (every member must find it), so its
    owner and mode are checked before anything in it is trusted."""
    return Path(parent or index_parent()) / f"tiering.node-{key.user}-{key.digest()}"


def _private_dir(path: Path) -> None:
    try:
        ensure_private_dir(path)
    except NotPrivate as e:
        raise NodeLockError(f"{e}: tiering makes this directory for the job; remove it") from None


class _Flock:
    """A flock on a file of the node directory that still names the file
    locked: a lock taken on a file that was removed meanwhile is retried."""

    def __init__(self, path: Path, mode: int, timeout: float | None, what: str, create: bool = True):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if create:
                _private_dir(path.parent)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0), 0o600)
            except FileNotFoundError:
                if not create:
                    raise
                continue    # the directory was withdrawn just now: make it again
            if self._lock(fd, mode, deadline):
                try:
                    same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    self.fd = fd
                    return
            os.close(fd)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{what}: {path} stayed locked for {timeout:.0f} s")

    @staticmethod
    def _lock(fd: int, mode: int, deadline: float | None) -> bool:
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return True
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(POLL)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _try_exclusive(path: Path) -> _Flock | None:
    """The exclusive lock if it is free now; None when it is held or the file is gone."""
    try:
        return _Flock(path, fcntl.LOCK_EX, 0.0, "", create=False)
    except (TimeoutError, FileNotFoundError):
        return None


# -- service.json -----------------------------------------------------------------

def _read_record(directory: Path, name: str = SERVICE_FILE) -> dict[str, Any] | None:
    try:
        rec = json.loads((directory / name).read_text())
        return rec if isinstance(rec, dict) else None
    except (OSError, ValueError):
        return None


def _write_record(directory: Path, rec: dict[str, Any], name: str = SERVICE_FILE) -> None:
    write_private(directory / name, json.dumps(rec).encode())


def _alive(rec: dict[str, Any] | None) -> bool:
    """The recorded process still runs (not a zombie, not a reused pid)."""
    if not rec:
        return False
    try:
        return still_runs(int(rec["pid"]), rec["start"])
    except (KeyError, TypeError, ValueError):
        return False


def _record(pid: int, ready: bool, info: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"pid": pid, "start": start_ticks(pid), "ready": ready, "info": info or {}}


# -- members ----------------------------------------------------------------------

@dataclass
class Membership:
    """One tier-run's place in its node's group, held until ``leave``."""
    directory: Path
    started: bool                     # this tier-run started the service
    service_pid: int
    info: dict[str, Any]              # what the service published (index path, order directory, ...)
    _lock: _Flock | None = field(default=None, repr=False)

    def service_alive(self) -> bool:
        rec = _read_record(self.directory)
        return rec is not None and rec.get("pid") == self.service_pid and _alive(rec)

    def leave(self, wait_service: float = 0.0) -> None:
        """Drops this membership.  The last member out may wait up to
        ``wait_service`` seconds for the service to finish its cleanup (a
        batch system may kill what is left of a step once its tasks exit)."""
        if self._lock is None:
            return
        self._lock.release()
        self._lock = None
        if wait_service > 0 and self._no_member_left():
            try:
                psutil.Process(self.service_pid).wait(wait_service)
            except psutil.Error:   # gone, or still cleaning up after the wait
                pass

    def _no_member_left(self) -> bool:
        """No member holds the lock, or the service withdrew already.  Looked
        at under elect.lock (LEAVE_LOOK seconds at most), which the service
        holds while it takes members.lock to withdraw: without it, the last
        member found members.lock held (by the withdrawing service) and left
        without waiting for the service's clean-up."""
        try:
            elect: _Flock | None = _Flock(self.directory / "elect.lock", fcntl.LOCK_EX, LEAVE_LOOK, "",
                                          create=False)
        except FileNotFoundError:
            return True          # withdrawn: elect.lock is removed last
        except TimeoutError:
            elect = None         # held that long (a service starting): members.lock alone
        try:
            path = self.directory / "members.lock"
            lock = _try_exclusive(path)
            if lock is not None:
                lock.release()
                return True
            return not path.exists()
        finally:
            if elect is not None:
                elect.release()


Starter = Callable[[Path], int]


def spawn_detached(argv: Sequence[str], env: dict[str, str] | None = None) -> Starter:
    """A starter that runs argv + [node directory] as a detached process: a
    session of its own, no terminal, output to service.log, and not a child of
    the tier-run that starts it (a shell starts it in the background and
    exits), so that nobody has to reap it.  Returns its pid."""
    def start(directory: Path) -> int:
        log = os.open(directory / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            sh = subprocess.run(["/bin/sh", "-c", '"$@" >&2 & echo $!', "sh", *argv, str(directory)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                start_new_session=True, close_fds=True, env=env, text=True, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise NodeLockError(f"cannot start the node's tiering service {argv[0]!r}: {e}") from None
        finally:
            os.close(log)
        return int(sh.stdout.strip())
    return start


def join(key: NodeKey, start: Starter, timeout: float | None = None, parent: str | None = None) -> Membership:
    """Joins the node's group: attaches to its running service, or starts one
    with ``start`` when there is none.  ``timeout`` bounds the wait for the
    group's lock and for the service to be ready (None: as long as the
    service starting up is alive).  A start that fails in any way leaves
    nothing in the node directory unless a service or member still uses it."""
    directory = node_dir(key, parent)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        elect = _Flock(directory / "elect.lock", fcntl.LOCK_EX, timeout, "waiting for this node's tiering service")
    except TimeoutError as e:
        raise NodeLockError(str(e)) from None
    started: int | None = None
    starts = 0
    try:
        while True:
            rec = _read_record(directory)
            if rec is not None and rec.get("ready") and _alive(rec):
                break
            starting = _read_record(directory, STARTING_FILE)
            if not _alive(starting):
                starts += 1
                started = start(directory)
                starting = _record(started, False)
                if starting["start"] is None:
                    raise NodeLockError("the node's tiering service exited at once: " + _log_tail(directory))
                _write_record(directory, starting, STARTING_FILE)
            assert starting is not None
            rec = _wait_ready(directory, starting, started, deadline)
            if rec is not None:
                break
        member = _Flock(directory / "members.lock", fcntl.LOCK_SH, None, "")
        return Membership(directory, started == rec["pid"], int(rec["pid"]), dict(rec.get("info") or {}), member)
    except BaseException:
        if starts:
            _remove_if_unused(directory)    # under elect.lock: nothing of a failed start is left
        raise
    finally:
        elect.release()


def _wait_ready(directory: Path, rec: dict[str, Any], started: int | None,
                deadline: float | None) -> dict[str, Any] | None:
    """The service's record once it is ready; None when a service that some
    other tier-run started died before it was ready (start another)."""
    while True:
        now = _read_record(directory)
        if now and now.get("pid") == rec["pid"] and now.get("ready"):
            return now
        if not _alive(rec):
            if started == rec["pid"]:
                raise NodeLockError(f"the node's tiering service exited before it was ready: {_log_tail(directory)}")
            return None
        if deadline is not None and time.monotonic() >= deadline:
            raise NodeLockError(f"the node's tiering service (pid {rec['pid']}) was not ready in time; "
                                f"its log: {_log_tail(directory)}")
        time.sleep(POLL)


def _log_tail(directory: Path, lines: int = 5) -> str:
    try:
        text = (directory / LOG_FILE).read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


# -- the service --------------------------------------------------------------------

class ServiceLifetime:
    """The service's side: publish what members need, then learn when the
    last member is gone (exited or killed)."""

    def __init__(self, directory: Path):
        self.directory = directory

    def ready(self, info: dict[str, Any]) -> None:
        _write_record(self.directory, _record(os.getpid(), True, info))

    def wait_until_unused(self, poll: float = 0.2, stop: threading.Event | None = None) -> bool:
        """Blocks until no member is left, then withdraws the service (no
        tier-run attaches any more; a new one starts a new service) and
        removes the node directory.  Returns False when ``stop`` was set
        first (the directory is withdrawn all the same)."""
        while True:
            rec = _read_record(self.directory)
            if rec is None or rec.get("pid") != os.getpid():
                return True     # withdrawn already, or presumed dead and replaced
            stopping = stop is not None and stop.is_set()
            elect = _try_exclusive(self.directory / "elect.lock")
            if elect is not None:
                try:
                    members = _try_exclusive(self.directory / "members.lock")
                    if members is not None or stopping:
                        self._withdraw()
                        if members is not None:
                            members.release()
                        return members is not None
                finally:
                    elect.release()
            pause(poll, stop)

    def _withdraw(self) -> None:
        """Under elect.lock: a waiting tier-run then finds the lock file gone
        and starts afresh."""
        rec = _read_record(self.directory)
        if rec and rec.get("pid") != os.getpid():
            return      # another service took over (this one was presumed dead)
        _remove_node_dir(self.directory)


def _remove_node_dir(directory: Path) -> None:
    """Under elect.lock: the files of the node directory (elect.lock last),
    then the directory."""
    try:
        names = sorted(os.listdir(directory), key=lambda n: n == "elect.lock")
    except OSError:
        return
    for name in names:
        try:
            os.unlink(directory / name)
        except OSError:
            pass
    try:
        os.rmdir(directory)
    except OSError:
        pass


def sweep_node_dirs(user: str, parent: str | None = None) -> list[Path]:
    """Removes this user's node directories whose service died with no member
    left (a SIGKILLed service, a crashed node): nothing else would, since
    their key may never come again.  A directory is judged under its
    elect.lock, so no tier-run is joining or leaving meanwhile."""
    removed = []
    for d in Path(parent or index_parent()).glob(f"tiering.node-{user}-*"):
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        elect = _try_exclusive(d / "elect.lock")
        if elect is None:
            if not (d / "elect.lock").exists() and time.time() - st.st_mtime > YOUNG_SECONDS:
                _remove_node_dir(d)
                removed.append(d)
            continue
        try:
            if _remove_if_unused(d):
                removed.append(d)
        finally:
            elect.release()
    return removed


def _remove_if_unused(directory: Path) -> bool:
    """Under elect.lock: removes the node directory when no member holds its
    lock and no service (running or starting) is alive."""
    members = _try_exclusive(directory / "members.lock")
    if members is None and (directory / "members.lock").exists():
        return False     # members still run (on copies of a dead service)
    if members is not None:
        members.release()
    if _alive(_read_record(directory)) or _alive(_read_record(directory, STARTING_FILE)):
        return False
    _remove_node_dir(directory)
    return True
