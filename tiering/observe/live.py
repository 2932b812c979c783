"""What tier-run shows while it works, and what it keeps for the report.

- The scan: a bar on a terminal (tqdm, redrawn in place), or a plain line
  every few seconds in a log; a last line says what was found and how fast,
  or that the catalog came from the cache.
- While COMMAND runs it shares the terminal with tier-run, and a bar redrawn
  with carriage returns would overwrite or split COMMAND's own lines.  So the
  bar is kept to the phases before COMMAND starts; afterwards tier-run
  prints whole lines only, each in one write: a status line at a low rate
  (every 30 s on a terminal, 10 s in a log, 5 s with -v) and one line when
  something changes (the order arrived, placement fell back to first touch,
  the tiers are warm); with -v also the placement log (what the policy
  decided, and what was placed since the last line).  `tiering status
  --watch` is the live view, in a terminal of its own.
- Every tick (about a second) it samples the counters into the time series
  (series.py) and writes the status file (NOTE [status file]).

Nothing here is on the data path: a failure is logged at debug level and
the job goes on.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..catalog import ScanProgress
from ..catalog.model import IntColumn
from ..clairvoyant.feeds import NO_LOADER
from ..console import Stderr, say, stderr_is_terminal
from ..placement.daemon import DaemonSnapshot
from ..units import human_bytes, plain_number
from .series import Sample, Series, hit_ratio, lead_seconds, rate
from .view import clock, count, pct, status_line

log = logging.getLogger("tiering")

STATUS_FILE = "status.json"
STATUS_VERSION = 1
WARM_SHARE = 0.95        # of what fits: the tiers count as warm from here on
WINDOW = 10.0            # seconds of the "recent" rates and hit ratio
EVERY_TERMINAL = 30.0    # seconds between status lines while COMMAND runs
EVERY_LOG = 10.0
EVERY_VERBOSE = 5.0
SCAN_EVERY_LOG = 5.0     # seconds between plain scan lines
READER_TICKS = 4096      # ticks of the reader's position kept to measure the prefetch lead in seconds


@dataclass(frozen=True)
class Display:
    mode: str            # "bar" (a terminal), "plain" (a log) or "off"
    every: float         # seconds between status lines while COMMAND runs
    summary: bool = True   # the summary at exit (--progress off keeps it, --quiet drops it)
    log: bool = False      # -v: the placement log (JobWatch._log_placement)


def choose_display(progress: str, quiet: bool, verbose: int, every: float | None = None,
                   terminal: bool | None = None) -> Display:
    """--progress auto|bar|plain|off, --quiet, -v and --progress-every."""
    if quiet or progress == "off":
        return Display("off", 0.0, summary=not quiet)
    tty = stderr_is_terminal() if terminal is None else terminal
    mode = progress if progress in ("bar", "plain") else ("bar" if tty else "plain")
    default = EVERY_VERBOSE if verbose else (EVERY_TERMINAL if mode == "bar" else EVERY_LOG)
    return Display(mode, every if every is not None else default, log=verbose > 0)


class Probe(Protocol):
    """Where the numbers come from (the job's index, daemon and policy)."""

    def counters(self) -> dict[str, Any]: ...

    def snapshot(self) -> DaemonSnapshot | None: ...

    def report(self) -> dict[str, Any]: ...


@dataclass
class JobInfo:
    """What does not change while the job runs."""

    job: str
    pid: int
    user: str
    command: list[str]
    data: list[str]
    profile: str
    policy: str                       # asked for (or chosen by default)
    files: int
    bytes: int
    fits_bytes: int                   # what the tiers can hold of the data set
    tiers: list[tuple[str, int]]      # name, capacity
    run_dir: Path | None = None
    command_pid: int | None = None


def warm_line(p: Any) -> str:
    """warm-up: N files, X MB/s, ETA (a WarmProgress)."""
    speed = p.done_bytes / p.seconds if p.seconds > 0 else 0.0
    eta = clock((p.bytes - p.done_bytes) / speed) if speed > 0 else "?"
    return (f"tiering: warm-up: {count(p.done_files)} of {count(p.files)} files, {human_bytes(int(speed))}/s, "
            f"ETA {eta}")


def fits_bytes(sizes: IntColumn, capacity: int, alloc: Callable[[int], int]) -> int:
    """Bytes of the data set the tiers can hold: all of it, or the capacity
    scaled by the data set's bytes per allocated byte (whole blocks; alloc
    is asked once per distinct size)."""
    values, counts = np.unique(np.asarray(sizes, np.int64), return_counts=True)
    total = int((values * counts).sum())
    allocated = sum(alloc(int(v)) * int(c) for v, c in zip(values.tolist(), counts.tolist()))
    if allocated <= capacity or not allocated:
        return total
    return int(capacity * total / allocated)


def phase(policy: str, report: dict[str, Any], no_order: str | None) -> tuple[str, str]:
    """(kind, words) of what placement does now."""
    if policy == "off":
        return "off", "not placing (--policy off)"
    if policy == "stage":
        return "staging", "staging the data set in catalog order"
    if policy == "lru":
        return "first-touch", "copying what COMMAND opens, evicting the least recently opened"
    if policy != "clairvoyant":
        return "first-touch", "copying what COMMAND opens (first touch)"
    if report.get("gave_up"):
        return "fallback", "fell back to first-touch: the data set's mapping was given up"
    if report.get("diverged"):
        return "fallback", "fell back to first-touch: the reads stopped following the order"
    if not report.get("epochs_known"):
        if no_order:
            return "fallback", f"fell back to first-touch: no order ({no_order})"
        source = str((report.get("mapping") or {}).get("source", ""))
        # NOTE [staging while waiting]: a data set that fits is staged in catalog order meanwhile
        meanwhile = "staging the data set meanwhile" if report.get("staged") else "first touch meanwhile"
        if source.startswith("learnt"):   # NOTE [learnt mapping]
            return "learning", f"learning which files each index reads ({meanwhile})"
        errors = report.get("hook_errors") or []
        if errors:   # the hook said why no order comes (a DataLoader without indices, a sampler not torch's)
            return "fallback", f"first touch: the order hook gave up ({hook_reason(errors[-1])})"
        return "waiting", f"waiting for the order ({meanwhile})"
    if report.get("prefetch_lead"):
        return "prefetching", "prefetching ahead of the reader"
    return "following", "following the reader, no copy ahead of it"


def hook_reason(error: str) -> str:
    """A hook error's reason without its advice (what placement does, how
    to give the order), for the status line."""
    return re.split(r";? (?:give the order with|prefetching follows first touch)", error, maxsplit=1)[0]


def write_status(run_dir: Path, status: dict[str, Any]) -> None:
    """Atomically: a reader sees the previous file or this one, whole."""
    tmp = run_dir / f".{STATUS_FILE}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(status, f, default=plain_number)
    os.replace(tmp, run_dir / STATUS_FILE)


def _tiers_text(i: JobInfo) -> str:
    fits = "the data set fits" if i.fits_bytes >= i.bytes else \
        f"{pct(i.fits_bytes / i.bytes if i.bytes else 0)} of the data set fits"
    return "tiers " + ", ".join(f"{n} {human_bytes(c)}" for n, c in i.tiers) + f": {fits}"


@dataclass
class JobWatch:
    display: Display
    clock: Callable[[], float] = time.monotonic
    info: JobInfo | None = None
    probe: Probe | None = None
    no_order: Callable[[], str | None] = lambda: None
    series: Series = field(default_factory=Series)
    t0: float | None = None                  # COMMAND started (clock)
    warm_after: float | None = None
    started_wall: float = field(default_factory=time.time)
    state: str = "scanning"
    _bar: Any = None
    _scan_t0: float | None = None
    _scan_last: float = 0.0
    _last_line: float = 0.0
    _announced: bool = False                 # "starting COMMAND" was said
    _phase: str | None = None
    _scan_dir: Path | None = None
    _scan_head: dict[str, Any] = field(default_factory=dict)
    _scan_written: float | None = None
    _command_pid: int | None = None
    _sizes_later: int = 0                    # files whose sizes are read after COMMAND started (names first)
    _dirs: int = 0
    _readers: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=READER_TICKS))
    _lead_now: tuple[float, bool] | None = None   # the lead in seconds at the last tick, and whether at least
    _warm_end: float | None = None           # the warm-up ended with the tiers warm (clock)
    _logged: dict[str, Any] = field(default_factory=dict)   # what the placement log said last (-v)

    # -- the scan ------------------------------------------------------------------
    def scanning_in(self, run_dir: Path, head: dict[str, Any]) -> None:
        """While scanning, a status file of what the scan found (job, pid,
        user, command, data, policy in head) goes in run_dir."""
        self._scan_dir, self._scan_head = run_dir, head

    def on_scan(self, p: ScanProgress) -> None:
        try:
            self._on_scan(p)
        except Exception:
            log.debug("scan progress failed", exc_info=True)

    def _on_scan(self, p: ScanProgress) -> None:
        now = self.clock()
        if self._scan_t0 is None:
            self._scan_t0 = self._scan_last = now
        if self._scan_dir is not None and (self._scan_written is None or now - self._scan_written >= 1.0):
            self._scan_status(now, {"phase": p.phase, "files": p.files, "dirs": p.dirs, "bytes": p.bytes})
        if self.display.mode == "off" or p.phase == "done":
            return
        if self.display.mode == "bar":
            bar = self._scan_bar()
            bar.set_description_str(f"tiering: {p.phase}", refresh=False)
            bar.set_postfix_str(f"{count(p.dirs)} directories, {human_bytes(p.bytes)}", refresh=False)
            bar.update(p.files - bar.n)
        elif now - self._scan_last >= SCAN_EVERY_LOG:
            self._scan_last = now
            dt = now - self._scan_t0
            say(f"tiering: {p.phase}: {count(p.files)} files, {count(p.dirs)} directories found "
                f"({p.files / dt:,.0f} files/s, {clock(dt)})")

    def _scan_status(self, now: float, scan: dict[str, Any], **more: Any) -> None:
        """The status file while the data set is scanned (or its sizes read)."""
        assert self._scan_dir is not None
        self._scan_written = now
        since = now if self._scan_t0 is None else self._scan_t0
        write_status(self._scan_dir, {
            **self._scan_head, "version": STATUS_VERSION, "state": "scanning", "started": self.started_wall,
            "updated": time.time(), "elapsed": round(now - since, 2), **more, "scan": scan})

    def _scan_bar(self) -> Any:
        if self._bar is None:
            from tqdm import tqdm
            tqdm.monitor_interval = 0    # no monitor thread (NOTE [signals and COMMAND])
            self._bar = tqdm(total=None, desc="tiering: scanning", unit=" files", file=Stderr(),
                             mininterval=0.2, dynamic_ncols=True, leave=False)
        return self._bar

    def close_bar(self) -> None:
        """Ends the scan's bar (its line is cleared); a scan that failed says nothing more."""
        if self._bar is not None:
            try:
                self._bar.close()
            except Exception:
                log.debug("closing the bar failed", exc_info=True)
            self._bar = None

    def scan_done(self, files: int, nbytes: int, dirs: int, seconds: float, from_cache: bool,
                  sizes_later: bool = False) -> None:
        self.close_bar()
        self._sizes_later = files if sizes_later else 0
        self._dirs = dirs
        if self.display.mode == "off":
            return
        rate_text = f", {files / seconds:,.0f} files/s" if seconds > 0 and not from_cache else ""
        how = "catalog from cache" if from_cache else "scanned"
        size = "sizes read while COMMAND starts" if sizes_later else human_bytes(nbytes)
        say(f"tiering: {how}: {count(files)} files ({size}) in {count(dirs)} directories, "
            f"{seconds:.1f} s{rate_text}")

    def note(self, text: str) -> None:
        """One line of what tier-run does, unless the display is off."""
        if self.display.mode != "off":
            say(f"tiering: {text}")

    def sizing(self, done: int, total: int, nbytes: int) -> None:
        """The sizes read so far after a names-first scan (NOTE [names
        first]), on the fill's thread: the status file only (COMMAND has
        the terminal), at most once a second; the watch's own status takes
        over once the daemon runs."""
        try:
            now = self.clock()
            if self._scan_dir is None or (self._scan_written is not None and now - self._scan_written < 1.0
                                          and 0 < done < total):
                return
            self._scan_status(now, {"phase": "reading sizes", "files": total, "dirs": self._dirs, "sized": done,
                                    "bytes": nbytes}, command_pid=self._command_pid)
        except Exception:
            log.debug("fill progress failed", exc_info=True)

    # -- --warm, before COMMAND (NOTE [warm-up]) -----------------------------------
    def warming(self, p: Any) -> None:
        """The warm-up's progress (clairvoyant/warm.py WarmProgress): a bar
        on a terminal, a line every few seconds in a log."""
        try:
            self._warming(p)
        except Exception:
            log.debug("warm-up progress failed", exc_info=True)

    def _warming(self, p: Any) -> None:
        if self.display.mode == "off":
            return
        if self.display.mode == "bar":
            if self._bar is None:
                from tqdm import tqdm
                tqdm.monitor_interval = 0    # no monitor thread (NOTE [signals and COMMAND])
                self._bar = tqdm(total=p.bytes, desc=f"tiering: warm-up: {count(p.files)} files", unit="B",
                                 unit_scale=True, unit_divisor=1024, file=Stderr(), mininterval=0.2,
                                 dynamic_ncols=True, leave=False)
            self._bar.update(p.done_bytes - self._bar.n)
            return
        now = self.clock()
        if now - self._scan_last >= SCAN_EVERY_LOG:
            self._scan_last = now
            say(warm_line(p))

    def warm_done(self, r: Any) -> None:
        self.close_bar()
        self._warm_end = None
        try:
            self._warm_end = self.clock() if self._warmed_up() else None
        except Exception:
            log.debug("warm-up state unknown", exc_info=True)
        if self.display.mode == "off":
            return
        speed = f", {human_bytes(int(r.bytes / r.seconds))}/s" if r.seconds > 0 else ""
        missed = f"; {count(r.failed)} not copied" if r.failed else ""
        say(f"tiering: warm-up: {count(r.files)} files ({human_bytes(r.bytes)}) in the tiers, {r.order}, "
            f"{r.seconds:.1f} s{speed}{missed}")

    def _warmed_up(self) -> bool:
        """Whether the warm-up left the tiers warm (WARM_SHARE of what fits placed)."""
        if self.info is None or self.probe is None or not self.info.files or not self.info.fits_bytes:
            return False
        snap = self.probe.snapshot()
        placed = sum(t.bytes for t in snap.tiers) if snap else 0
        return placed >= WARM_SHARE * self.info.fits_bytes

    # -- while COMMAND runs -------------------------------------------------------
    def attach(self, info: JobInfo, probe: Probe, no_order: Callable[[], str | None]) -> None:
        self.info, self.probe, self.no_order = info, probe, no_order
        if self._command_pid is not None:   # attached after COMMAND started (NOTE [names first])
            info.command_pid = self._command_pid

    def command_starting(self) -> None:
        """Says that COMMAND starts, before it is forked: on a shared terminal
        its first lines then come after this one, however long the daemon
        takes to start once it is forked."""
        if self.info is None and self._sizes_later and self.display.mode != "off" and not self._announced:
            self._announced = True
            say(f"tiering: starting COMMAND; placement starts once the sizes of {count(self._sizes_later)} "
                "files are read")
        if self.info is None or self.display.mode == "off" or self._announced:
            return
        self._announced = True
        say("tiering: starting COMMAND; " + _tiers_text(self.info))

    def sizes_read(self, seconds: float) -> None:
        """The sizes of a names-first scan are read and placement starts
        (NOTE [names first]); after attach."""
        if self.info is None or self.display.mode == "off":
            return
        i = self.info
        say(f"tiering: sizes read in {seconds:.1f} s: {count(i.files)} files ({human_bytes(i.bytes)}); "
            + _tiers_text(i))

    def command_started(self, pid: int | None) -> None:
        self.t0 = self._last_line = self.clock()
        if self._warm_end is not None:   # warm at the warm-up's end, before COMMAND started (<= 0)
            self.warm_after = round(self._warm_end - self.t0, 3)
        self.state = "running"
        self._command_pid = pid
        if self.info is not None:
            self.info.command_pid = pid
        self.command_starting()   # when it was not said before the fork (a node's service)

    def tick(self) -> dict[str, Any] | None:
        """Samples, writes the status file, says what changed; the status
        dict (None before COMMAND starts)."""
        try:
            return self._tick(final=False)
        except Exception:
            log.debug("status tick failed", exc_info=True)
            return None

    def finish(self) -> dict[str, Any]:
        """The last sample (after the daemon stopped); what the report keeps."""
        self.state = "finishing"
        try:
            self._tick(final=True)
        except Exception:
            log.debug("last status tick failed", exc_info=True)
        return self.observed()

    def observed(self) -> dict[str, Any]:
        """What the report keeps, as sampled so far."""
        names = [n for n, _ in self.info.tiers] if self.info else []
        return {"series": self.series.to_json(names), "warm_after": self.warm_after, "t0": self.t0}

    def _sample(self) -> tuple[Sample, DaemonSnapshot | None, dict[str, Any], dict[str, Any]]:
        assert self.probe is not None and self.t0 is not None and self.info is not None
        c = self.probe.counters()
        snap = self.probe.snapshot()
        rep = self.probe.report()
        tiers = tuple(t.bytes for t in snap.tiers) if snap else tuple(0 for _ in self.info.tiers)
        t = self.clock() - self.t0
        self._lead_now = self._lead(t, rep)
        s = Sample(t=t, tier_bytes=tiers, opens=c.get("opens", 0),
                   from_tiers=c.get("opens", 0) - c.get("opens_pfs", 0),
                   pfs_opens=c.get("opens_pfs", 0) + (snap.pfs_opens if snap else 0),
                   # COMMAND's by the shim's counter, as the report's (NOTE [read counters]): exact with events dropped
                   pfs_bytes=c.get("read_pfs", 0) + (snap.pfs_bytes if snap else 0),
                   copies=snap.copies if snap else 0, copy_bytes=snap.pfs_bytes if snap else 0,
                   events_dropped=c.get("events_dropped", 0),
                   lead_s=round(self._lead_now[0], 2) if self._lead_now and not self._lead_now[1] else None)
        return s, snap, rep, c

    def _lead(self, t: float, rep: dict[str, Any]) -> tuple[float, bool] | None:
        """The prefetch lead in seconds at this tick (series.lead_seconds),
        None when no order is followed or nothing is ahead."""
        lead = rep.get("prefetch_lead")
        if lead is None or not rep.get("following", True):
            self._readers.clear()
            return None
        self._readers.append((t, int(rep.get("reader_position", 0))))
        return lead_seconds(self._readers, int(lead)) if lead > 0 else None

    def _tick(self, final: bool) -> dict[str, Any] | None:
        if self.t0 is None or self.probe is None or self.info is None:
            return None
        s, snap, rep, c = self._sample()
        if final:
            self.series.finish(s)
        else:
            self.series.add(s)
        st = self.status(s, snap, rep, c)
        if final:
            self._check_warm(st)   # copies that landed after the last tick (a short COMMAND): said in the summary
        else:
            self._say_changes(st)
        if self.display.log and self.display.mode != "off":
            self._log_placement(st, rep, final)
        if self.info.run_dir is not None:
            try:
                write_status(self.info.run_dir, st)
            except OSError:
                log.debug("status file not written", exc_info=True)
        if not final and self.display.mode != "off" and self.display.every > 0 \
                and self.clock() - self._last_line >= self.display.every:
            self._last_line = self.clock()
            say(status_line(st))
        return st

    def _say_changes(self, st: dict[str, Any]) -> None:
        kind = st["phase_kind"]
        if kind != self._phase:
            before, self._phase = self._phase, kind
            # fallbacks are warned where they happen; the order's arrival is said here
            if self.display.mode != "off" and kind in ("prefetching", "following") \
                    and before not in ("prefetching", "following"):
                how = f" (indices to files: {st['mapping']})" if st.get("mapping") else ""
                say(f"tiering: order received{how}: prefetching ahead of the reader")
        if self._check_warm(st) and self.display.mode != "off":
            p = st["placed"]
            say(f"tiering: tiers warm after {self.warm_after:.1f} s: {count(p['files'])} files "
                f"({human_bytes(p['bytes'])}), {pct(p['share_of_fit'])} of what fits")

    def _log_placement(self, st: dict[str, Any], rep: dict[str, Any], final: bool) -> None:
        """-v: the placement log.  What the policy decided as it happens
        (the order's epochs as they become known, a new plan, the mapping
        from indices to files), and at the status line's rate, when
        anything was placed, evicted or failed since the last such line, what
        (the last one when placement has stopped: the lines add up to the
        summary's copies)."""
        last = self._logged
        if not last:
            last.update(t=0.0, said=0.0, copies=0, bytes=0, failed=0, evictions=0, fetches=0, staged=0,
                        epochs=0, replans=0, mapping=None)
        epochs, replans, mapping = rep.get("epochs_known", 0), rep.get("replans", 0), st.get("mapping")
        if epochs > last["epochs"]:
            say(f"tiering: placement: the order of {count(epochs)} epochs known, {count(rep.get('stream_length', 0))} "
                f"positions planned, the reader at {count(rep.get('reader_position', 0))}")
        if replans > max(1, last["replans"]):   # the first plan is the order's arrival
            say(f"tiering: placement: planned anew from the reader's position (plan {count(replans)})")
        if mapping and mapping != last["mapping"] and mapping != NO_LOADER:
            say(f"tiering: placement: indices to files: {mapping}")
        last.update(epochs=epochs, replans=replans, mapping=mapping)
        c = st["copies"]
        now = {"copies": c["done"], "bytes": c["pfs_bytes"], "failed": c["failed"],
               "evictions": c["evictions"], "fetches": rep.get("fetches", 0), "staged": rep.get("staged", 0)}
        changed = any(now[k] != last[k] for k in ("copies", "failed", "evictions"))
        if not changed or not final and st["elapsed"] - last["said"] < self.display.every:
            return
        plan = [f"{count(now[k] - last[k])} {what}" for k, what in (("fetches", "fetched ahead of the reader"),
                                                                     ("staged", "staged in catalog order"))
                if now[k] > last[k]]
        tiers = ", ".join(f"{t['name']} {count(t['files'])} files ({human_bytes(t['bytes'])})" for t in st["tiers"])
        landed = (f"{count(now['copies'] - last['copies'])} copies landed ({human_bytes(now['bytes'] - last['bytes'])} "
                  "read from the PFS)" + (f": {', '.join(plan)}" if plan else ""))
        say(f"tiering: placement {clock(last['t'])}-{clock(st['elapsed'])}: {landed}; "
            f"{count(now['evictions'] - last['evictions'])} evicted, {count(now['failed'] - last['failed'])} failed; "
            f"{count(c['in_flight'])} in flight; {tiers}")
        last.update(now, t=st["elapsed"], said=st["elapsed"])

    def _check_warm(self, st: dict[str, Any]) -> bool:
        """Whether the tiers became warm at this sample (WARM_SHARE of what
        fits placed); warm_after is then the sample's time, at most one tick
        late."""
        assert self.info is not None
        if self.warm_after is not None or st["placed"]["share_of_fit"] < WARM_SHARE or not self.info.files:
            return False
        self.warm_after = st["elapsed"]
        st["warm_after"] = self.warm_after
        return True

    def status(self, s: Sample, snap: DaemonSnapshot | None, rep: dict[str, Any],
               c: dict[str, Any]) -> dict[str, Any]:
        """The status dict (status file, status line, `tiering status`)."""
        info = self.info
        assert info is not None
        win = self.series.window(WINDOW)
        a, b = win if win else (None, s)
        opens_rate = rate(a, b, "opens") if a else 0.0
        placed_files = sum(t.files for t in snap.tiers) if snap else 0
        placed_bytes = sum(t.bytes for t in snap.tiers) if snap else 0
        copy_rate = rate(a, b, "copy_bytes") if a else 0.0
        kind, words = phase(info.policy, rep, self.no_order())
        lead = rep.get("prefetch_lead")
        eta = None
        if self.warm_after is None and copy_rate > 0:
            eta = max(0.0, info.fits_bytes - placed_bytes) / copy_rate
        in_flight = snap.in_flight if snap else 0
        reading = snap.reading if snap else 0
        recent = self.series.recent       # a deque of RECENT samples at most
        return {
            "version": STATUS_VERSION,
            "job": info.job, "pid": info.pid, "command_pid": info.command_pid, "user": info.user,
            "command": info.command, "data": info.data, "profile": info.profile, "policy": info.policy,
            "started": self.started_wall, "updated": time.time(), "elapsed": round(s.t, 2),
            "state": self.state, "phase": words, "phase_kind": kind,
            "mapping": (rep.get("mapping") or {}).get("source"),
            "dataset": {"files": info.files, "bytes": info.bytes, "fits_bytes": info.fits_bytes},
            "tiers": ([{"name": t.name, "capacity": t.capacity, "used": t.used, "files": t.files, "bytes": t.bytes}
                       for t in snap.tiers] if snap else
                      [{"name": n, "capacity": cap, "used": 0, "files": 0, "bytes": 0} for n, cap in info.tiers]),
            "placed": {"files": placed_files, "bytes": placed_bytes,
                       "share": placed_bytes / info.bytes if info.bytes else 0.0,
                       "share_of_fit": min(1.0, placed_bytes / info.fits_bytes) if info.fits_bytes else 0.0},
            "warm_after": self.warm_after,
            "opens": {"total": s.opens, "from_tiers": s.from_tiers, "pfs": s.opens - s.from_tiers},
            "hit_ratio": {"total": hit_ratio(None, s), "recent": hit_ratio(a, b) if a else None,
                          "window": round(b.t - a.t, 1) if a else 0.0},
            "rates": {"opens_per_s": round(opens_rate, 2),
                      "pfs_bytes_per_s": round(rate(a, b, "pfs_bytes"), 1) if a else 0.0,
                      "copy_bytes_per_s": round(copy_rate, 1),
                      "copy_files_per_s": round(rate(a, b, "copies"), 2) if a else 0.0},
            "copies": {"done": snap.copies if snap else 0, "in_flight": in_flight, "reading": reading,
                       "queued": max(0, in_flight - reading), "failed": snap.copy_failures if snap else 0,
                       "evictions": snap.evictions if snap else 0, "pfs_bytes": s.copy_bytes},
            "prefetch_lead": ({"samples": lead,
                               "seconds": round(self._lead_now[0], 2) if self._lead_now else None,
                               "at_least": bool(self._lead_now and self._lead_now[1])}
                              if lead is not None else None),
            "eta": round(eta, 1) if eta is not None else None,
            "events_dropped": c.get("events_dropped", 0),
            "recent": {"t": [round(r.t, 2) for r in recent], "opens": [r.opens for r in recent],
                       "from_tiers": [r.from_tiers for r in recent], "pfs_bytes": [r.pfs_bytes for r in recent],
                       "copy_bytes": [r.copy_bytes for r in recent], "copies": [r.copies for r in recent]},
        }
