"""The node's placement service of launch form 2 (NOTE [node service]): a
detached process that runs the service part of a job (scan, tiers, index,
daemon, peer tier) for every tier-run of its node, from the first member's
join until the last one leaves or dies.

    python -m tiering.cluster.service NODE_DIR

It reads the job's options from NODE_DIR/job.json (written, private, by the
member that started it), publishes what members need in service.json
(index, order directory, statistics file), writes the job's statistics into
its private run directory when a member asks (SIGUSR1) and every few
seconds, and stops and cleans up when no member is left (or on SIGTERM).
Its output goes to NODE_DIR/service.log: a set-up error there is what the
starting member says.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from ..clairvoyant.options import OrderOptions
from ..console import say, setup_logging
from ..job import Job, JobError, JobOptions, cleanup, job_stats, map_large_blocks, setup, start_service, stop_service
from ..observe.live import Display
from ..profile import ProfileError, load_profile
from ..units import plain_number
from . import nodelock
from .files import NotPrivate, read_private, write_private
from .identity import NodeIdentity

JOB_FILE = nodelock.JOB_FILE
STATS_FILE = "node-stats.json"
STATS_EVERY = 5.0      # seconds between snapshots nobody asked for
TICK = 1.0             # seconds between samples of the status (tiering status, the time series)


# -- the job's options, as the starting member hands them over ----------------------
# Every field of JobOptions (the one definition of a job's options) is either
# handed to the service (PASSED, through job.json), kept by each member for
# itself (MEMBER_ONLY), or refused where the tier-runs of a node share one
# service (REFUSED, checked by form2_refusal before COMMAND starts).

MEMBER_ONLY = {
    "stats_json": "each member writes its own --stats-json from the service's statistics",
    "display": "each member shows its own progress; the service shows none (its log: service.log)",
}
REFUSED = {
    "warm": "run one tier-run per node around the launcher (srun --ntasks-per-node=1 tier-run ... -- "
            "torchrun ...), or leave --warm out",
}


def _path(v: str | None) -> Path | None:
    return Path(v) if v else None


def _order_from(d: dict[str, Any]) -> OrderOptions:
    o = dict(d)
    for k in ("order_file", "manifest", "layout_root"):
        o[k] = _path(o.get(k))
    o["extensions"] = tuple(o["extensions"]) if o.get("extensions") else None
    return OrderOptions(**o)


def _node_from(d: dict[str, Any]) -> NodeIdentity:
    node = dict(d)
    node["node_names"] = tuple(node.get("node_names") or ())
    return NodeIdentity(**node)


# (to JSON, from JSON) of the passed options that are not JSON values as they are
CODECS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "profile": (lambda p: p.source, load_profile),
    "order": (lambda o: {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(o).items()}, _order_from),
    "scan_cache": (lambda p: str(p) if p else None, _path),
    "node": (asdict, _node_from),
}


def passed_options() -> list[str]:
    """The fields of JobOptions the service takes from the starting member."""
    return [f.name for f in fields(JobOptions) if f.name not in MEMBER_ONLY and f.name not in REFUSED]


def form2_refusal(opts: JobOptions) -> str | None:
    """Why these options cannot run where tier-runs share one service, or None."""
    defaults = JobOptions([], [], opts.profile)
    for name, fix in REFUSED.items():
        if getattr(opts, name) != getattr(defaults, name):
            flag = "--" + name.replace("_", "-")
            return (f"{flag} is not supported where {opts.node.local_world} tier-runs of this node share one "
                    f"placement service (one tier-run per rank); {fix}")
    return None


def options_to_json(opts: JobOptions) -> dict[str, Any]:
    return {name: CODECS[name][0](getattr(opts, name)) if name in CODECS else getattr(opts, name)
            for name in passed_options()}


def options_from_json(d: dict[str, Any]) -> JobOptions:
    passed = {name: CODECS[name][1](d[name]) if name in CODECS else d[name] for name in passed_options()}
    return JobOptions(**passed, display=Display("off", 0.0, summary=False))


def write_job_file(directory: Path, opts: JobOptions) -> None:
    write_private(directory / JOB_FILE, json.dumps(options_to_json(opts)).encode())


# -- the statistics members read -------------------------------------------------------

class StatsWriter:
    """Samples the status every TICK and writes {"seq", "stats"} to the
    statistics file when a member asks (SIGUSR1) or every STATS_EVERY s."""

    def __init__(self, job: Job, path: Path):
        self.job, self.path = job, path
        self.wanted = threading.Event()
        self.stop = threading.Event()
        self.seq = 0
        self._thread = threading.Thread(target=self._run, name="tiering-node-stats", daemon=True)

    def start(self) -> None:
        self.write()
        self._thread.start()

    def write(self, stats: dict[str, Any] | None = None) -> None:
        try:
            self.seq += 1
            stats = stats if stats is not None else job_stats(self.job, -1, final=False)
            write_private(self.path, json.dumps({"seq": self.seq, "stats": stats}, default=plain_number).encode())
        except Exception as e:   # never the end of the service
            say(f"tiering service: the statistics cannot be written ({e!r})")

    def _run(self) -> None:
        last = time.monotonic()
        while not self.stop.is_set():
            asked = self.wanted.wait(TICK)
            if self.job.watch is not None:
                self.job.watch.tick()
            if asked or time.monotonic() - last >= STATS_EVERY:
                self.wanted.clear()
                self.write()
                last = time.monotonic()

    def close(self) -> None:
        self.stop.set()
        if self._thread.is_alive():
            self._thread.join()


def read_stats(path: Path) -> tuple[int, dict[str, Any]] | None:
    """(seq, stats) of the statistics file, None when it cannot be read."""
    try:
        data = read_private(path)
        rec = json.loads(data) if data is not None else None
    except (OSError, ValueError, NotPrivate):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("stats"), dict):
        return None
    return int(rec.get("seq", 0)), rec["stats"]


# -- the service ------------------------------------------------------------------------

def serve(directory: Path) -> int:
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda *_: stop.set())
    try:
        data = read_private(directory / JOB_FILE)
        if data is None:
            raise ValueError(f"{directory / JOB_FILE} is missing")
        opts = options_from_json(json.loads(data))
    except ProfileError as e:
        say(f"tier-run: profile error: {e}")
        return 2
    except (OSError, ValueError, KeyError, TypeError, NotPrivate) as e:
        say(f"tiering service: cannot read the job's options: {e}")
        return 2
    setup_logging(opts.verbose)
    job = Job(opts)
    try:
        setup(job)
    except JobError as e:
        say(f"tier-run: {e}")
        cleanup(job)
        return e.exit_code
    job.hook_watch = None      # each member's COMMAND is its own: no check of one hook here
    assert job.run_dir is not None and job.index is not None
    start_service(job)
    if job.watch is not None:
        job.watch.command_started(None)
    writer = StatsWriter(job, job.run_dir / STATS_FILE)
    signal.signal(signal.SIGUSR1, lambda *_: writer.wanted.set())
    writer.start()
    life = nodelock.ServiceLifetime(directory)
    try:
        life.ready({"index": str(job.index.path), "order_dir": str(job.order_dir) if job.order_dir else None,
                    "stats": str(writer.path), "run_dir": str(job.run_dir),
                    "tiers": [str(t.root) for t in job.tiers]})
        life.wait_until_unused(stop=stop)
    finally:
        writer.close()
        stop_service(job)
        writer.write(job_stats(job, -1, final=True))   # what --keep leaves for a look
        cleanup(job)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        say("usage: python -m tiering.cluster.service NODE_DIR (tier-run starts it)")
        return 2
    map_large_blocks()
    return serve(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
