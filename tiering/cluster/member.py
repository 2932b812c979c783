"""Launch form 2 (``srun --ntasks-per-node=K tier-run ... -- python train.py``):
this tier-run is one member of its node's group (NOTE [node service]).

It joins the node's service (starting it, detached, when there is none: the
job's options go to the node directory first), runs its own COMMAND against
the service's index, order directory and tiers, and at the end prints its
COMMAND's exit status with the node's counters, which the service writes
on request.  Its membership ends with it (or with its death): the service
stops and cleans up once the last member is gone.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ..catalog import CatalogError, normalise_roots
from ..command import SetupWatch, block_signals, ignored_at_start, restore_signals
from ..console import say
from ..job import Job, JobError, check_command, child_environment, job_summary, run_command
from ..report import write_stats
from ..shimlib import library_path
from . import nodelock
from .service import read_stats, write_job_file

STATS_WAIT = 10.0        # seconds a member waits for the service's fresh statistics
LEAVE_WAIT = 30.0        # seconds the last member waits for the service's clean-up


def node_key(job: Job) -> nodelock.NodeKey:
    try:
        roots = normalise_roots(job.opts.data)
    except CatalogError as e:
        raise JobError(str(e)) from None
    return nodelock.NodeKey(job.user, job.opts.node.job_id, tuple(roots))


def _starter(job: Job) -> nodelock.Starter:
    spawn = nodelock.spawn_detached([sys.executable, "-m", "tiering.cluster.service"])

    def start(directory: Path) -> int:
        write_job_file(directory, job.opts)
        return spawn(directory)

    return start


def run_member(job: Job) -> int:
    """Runs COMMAND as a member of the node's service; returns its exit status."""
    opts = job.opts
    exe = check_command(opts)
    key = node_key(job)
    ignored = ignored_at_start()
    old_mask = block_signals()   # NOTE [signals and COMMAND]
    member: nodelock.Membership | None = None
    try:
        with SetupWatch(ignored):
            nodelock.sweep_node_dirs(job.user)
            try:
                member = nodelock.join(key, _starter(job))
            except nodelock.NodeLockError as e:
                raise JobError(str(e)) from None
        info = member.info
        index, order_dir = info.get("index"), info.get("order_dir")
        env = child_environment(dict(os.environ), Path(index) if index else None, library_path(),
                                opts.verbose >= 2, Path(order_dir) if order_dir else None)
        if opts.display.mode != "off":
            say(f"tiering: {opts.node.local_world} tier-runs on this node share one service (pid "
                f"{member.service_pid}, {'started by' if member.started else 'joined by'} this one, local rank "
                f"{opts.node.local_rank}); starting COMMAND")
        t0 = time.monotonic()
        code = run_command(opts.command, exe, env, ignored, lambda _pid: None, lambda: None)
        _report(job, member, code, time.monotonic() - t0)
        return code
    finally:
        if member is not None:
            member.leave(wait_service=LEAVE_WAIT)
        restore_signals(old_mask)


def node_stats(member: nodelock.Membership, wait: float = STATS_WAIT) -> dict[str, Any] | None:
    """The node's statistics, fresh from the service (asked with SIGUSR1),
    else the last it wrote; None when there are none (the service is gone)."""
    path = Path(str(member.info.get("stats", "")))
    before = read_stats(path)
    if member.service_alive():
        try:
            os.kill(member.service_pid, signal.SIGUSR1)
        except OSError:
            pass
        else:
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and member.service_alive():
                now = read_stats(path)
                if now is not None and (before is None or now[0] > before[0]):
                    return now[1]
                time.sleep(0.05)
    last = read_stats(path)
    return last[1] if last is not None else None


def _report(job: Job, member: nodelock.Membership, code: int, seconds: float) -> None:
    """This member's COMMAND status with the node's counters; never raises
    (COMMAND's status is the job's)."""
    opts = job.opts
    try:
        stats = node_stats(member)
        if stats is None:
            say(f"tier-run: the node's statistics are gone with its service (pid {member.service_pid}); "
                f"COMMAND exited {code}")
            return
        stats["exit_code"] = code
        stats["command"] = opts.command
        stats.setdefault("seconds", {})["command"] = round(seconds, 3)
        stats["node_service"] = {"pid": member.service_pid, "started_here": member.started,
                                 "local_rank": opts.node.local_rank, "local_world": opts.node.local_world,
                                 "job_id": opts.node.job_id}
        if opts.display.summary:
            say(job_summary(stats))
        if opts.stats_json and (problem := write_stats(opts.stats_json, stats)):
            say(f"tier-run: {problem} (COMMAND exited {code})")
    except Exception as e:
        say(f"tier-run: the summary failed ({e!r}); COMMAND exited {code}")

