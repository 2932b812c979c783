"""`tiering status`: the live view of a running tier-run job of this user
on this node, read-only (NOTE [status file]).

A job is found by its private directory (`tiering-<user>-<pid>-<random>`
under /dev/shm or the temporary directory), which holds the status file the
job rewrites every second and the shared index.  Only directories of the
caller's own user are read: another user's job is refused by name, even for
root, and its directory is private anyway (0700).  The index is mapped
read-only for counters fresher than the status file.
"""
from __future__ import annotations

import json
import os
import pwd
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..rundirs import OWNER_FILE, start_ticks
from .live import STATUS_FILE, STATUS_VERSION
from .series import window_start

STALE = 5.0     # seconds without an update before the view says so


class StatusError(Exception):
    """No job to show; the message says why and what to do."""


@dataclass(frozen=True)
class JobDir:
    path: Path
    uid: int
    pid: int | None          # tier-run's, from the directory's name

    @property
    def name(self) -> str:
        return self.path.name


def parents() -> list[str]:
    """Where tier-run makes the index's directory (rundirs.index_parent)."""
    return list(dict.fromkeys(["/dev/shm", tempfile.gettempdir(), "/tmp"]))


def _pid_of(name: str) -> int | None:
    try:
        return int(name.rsplit("-", 2)[-2])
    except (IndexError, ValueError):
        return None


def job_dirs(where: list[str] | None = None) -> list[JobDir]:
    """Every tier-run directory in the parents, of any user."""
    out = []
    for parent in where or parents():
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for e in entries:
            if not e.name.startswith("tiering-"):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if e.is_dir(follow_symlinks=False):
                out.append(JobDir(Path(e.path), st.st_uid, _pid_of(e.name)))
    return out


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _alive(d: JobDir) -> bool:
    """The tier-run that made d still runs (pid and start time of its owner record)."""
    try:
        owner = json.loads((d.path / OWNER_FILE).read_text())
        ticks = start_ticks(int(owner["pid"]))
        return ticks is not None and ticks == owner.get("start")
    except (OSError, ValueError, KeyError, TypeError):
        return False


def read_status(d: JobDir) -> dict[str, Any] | None:
    try:
        st = json.loads((d.path / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return st if isinstance(st, dict) and st.get("version") == STATUS_VERSION else None


def running_jobs(where: list[str] | None = None) -> list[tuple[JobDir, dict[str, Any]]]:
    """This user's running jobs with a status file, oldest first."""
    me = os.getuid()
    found = []
    for d in job_dirs(where):
        if d.uid != me:
            continue
        st = read_status(d)
        if st is not None and _alive(d):
            found.append((d, st))
    return sorted(found, key=lambda x: x[1].get("started", 0))


def _matches(d: JobDir, st: dict[str, Any] | None, key: str) -> bool:
    if key.isdigit():
        pid = int(key)
        return pid == d.pid or (st is not None and pid in (st.get("pid"), st.get("command_pid")))
    return key in (d.name, d.name.rsplit("-", 1)[-1])


def find_job(key: str | None, where: list[str] | None = None) -> tuple[JobDir, dict[str, Any]]:
    """The job named by key (a PID of tier-run or COMMAND, a job id), or the
    only one running; StatusError otherwise."""
    me = os.getuid()
    jobs = running_jobs(where)
    if key is None:
        if len(jobs) == 1:
            return jobs[0]
        if not jobs:
            raise StatusError(f"no tier-run job of user {_user(me)} is running on this node")
        listing = "\n".join(f"  {d.name}  (pid {st.get('pid')}) {' '.join(st.get('command', []))}"
                            for d, st in jobs)
        raise StatusError(f"{len(jobs)} tier-run jobs are running; name one (a job id or a PID):\n{listing}")
    for d, st in jobs:
        if _matches(d, st, key):
            return d, st
    for d in job_dirs(where):
        if d.uid != me and _matches(d, None, key):
            raise StatusError(f"job {key} belongs to user {_user(d.uid)}: tiering status shows only your own "
                              "jobs (a job's directories are private to its user)")
    if key.isdigit():
        raise StatusError(f"no running tier-run job of yours has PID {key} (neither tier-run's nor COMMAND's); "
                          "`tiering status` without an argument lists them")
    raise StatusError(f"no running tier-run job of yours is called {key}; `tiering status` without an "
                      "argument lists them")


def fresh(d: JobDir, st: dict[str, Any], window: float, now: float | None = None) -> dict[str, Any]:
    """The status with the index's live counters (read-only) and the hit
    ratio and rates over the last `window` seconds of the recent samples."""
    now = time.time() if now is None else now
    out = dict(st)
    age = now - float(st.get("updated", now))
    out["stale_seconds"] = round(age, 1) if age > STALE else None
    out["elapsed"] = round(float(st.get("elapsed", 0.0)) + max(0.0, age), 2)
    if st.get("state") == "scanning":
        return out
    counters = _counters(d.path / "index")
    if counters:
        total = counters["opens"]
        served = total - counters["opens_pfs"]
        out["opens"] = {"total": total, "from_tiers": served, "pfs": counters["opens_pfs"]}
        out["events_dropped"] = counters["events_dropped"]
        out["hit_ratio"] = dict(st["hit_ratio"], total=served / total if total else None)
    rec = st.get("recent") or {}
    t = rec.get("t", [])
    if len(t) >= 2:
        k = window_start(t, window)
        dt = t[-1] - t[k]
        opens = rec["opens"][-1] - rec["opens"][k]
        served_w = rec["from_tiers"][-1] - rec["from_tiers"][k]
        out["hit_ratio"] = dict(out["hit_ratio"], recent=served_w / opens if opens else None, window=round(dt, 1))
        out["rates"] = dict(st["rates"], opens_per_s=round(opens / dt, 2) if dt else 0.0,
                            pfs_bytes_per_s=round((rec["pfs_bytes"][-1] - rec["pfs_bytes"][k]) / dt, 1) if dt else 0.0)
    return out


def _counters(index: Path) -> dict[str, Any] | None:
    try:
        from ..placement.index import SharedIndex
        idx = SharedIndex.open(index, readonly=True)
    except (OSError, ValueError):
        return None
    try:
        return idx.counters()
    finally:
        idx.close()
