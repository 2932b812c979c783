"""What a job shows and keeps, without running one: the time series, the
per-epoch records, the watch's lines and status file, the summary's
numbers and warnings, `tiering status`'s choice of job, the scan's progress
callback and the benchmark tables."""
from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from tiering.catalog import ScanProgress, scan
from tiering.observe.epochs import EpochLog, epoch_records
from tiering.observe.live import STATUS_FILE, Display, JobInfo, JobWatch, choose_display, fits_bytes
from tiering.observe.series import Sample, Series, series_json
from tiering.observe.status import StatusError, find_job, fresh
from tiering.observe.view import pct, status_view
from tiering.placement.api import allocation
from tiering.placement.daemon import DaemonSnapshot, DaemonStats, TierFill
from tiering.report import JobRecord, summary_text, to_json

MIB = 1 << 20


def sample(t: float, opens: int = 0, served: int = 0, pfs: int = 0, copy: int = 0, tiers=(0,)) -> Sample:
    return Sample(t, tuple(tiers), opens, served, opens - served, pfs, 0, copy)


# -- the time series ---------------------------------------------------------------

def test_the_series_stays_bounded_and_its_rates_add_up_to_the_totals():
    s = Series(cap=64)
    for k in range(1, 10_001):
        s.add(sample(float(k), opens=10 * k, served=7 * k, pfs=1000 * k))
    s.finish(sample(10_000.5, opens=100_005, served=70_003, pfs=10_000_500))
    assert len(s.samples) <= 65 and s.stride == 256
    assert s.samples[-1].t == 10_000.5            # the last sample is always kept
    js = series_json(s.samples, ["ram"], s.stride)
    t = [0.0] + js["t"]
    opens = sum(r * (t[k + 1] - t[k]) for k, r in enumerate(js["opens_per_s"]))
    assert round(opens) == 100_005                 # coarser, never wrong
    pfs = sum(r * MIB * (t[k + 1] - t[k]) for k, r in enumerate(js["pfs_mib_per_s"]))
    assert abs(pfs - 10_000_500) < 1e-3 * 10_000_500   # rates are rounded to 1 byte/s
    assert js["pfs_bytes"][-1] == 10_000_500 and js["opens"][-1] == 100_005   # the totals, exact
    assert len(s.recent) == 60 and s.recent[-1].t == 10_000.5


def test_the_window_is_the_recent_samples_that_many_seconds_apart():
    s = Series()
    for k in range(30):
        s.add(sample(float(k), opens=k * 10, served=k * 5 if k < 20 else 95 + (k - 19) * 10))
    a, b = s.window(10.0)
    assert (a.t, b.t) == (19.0, 29.0)
    assert (b.from_tiers - a.from_tiers) / (b.opens - a.opens) == 1.0   # all recent opens served


# -- per-epoch records ----------------------------------------------------------------

def test_opens_before_the_first_order_belong_to_the_first_epoch_and_none_after_divergence():
    now = [100.0]
    log = EpochLog(clock=lambda: now[0])
    log.opened(None, False, 10)        # before the order arrived
    log.opened(None, True, 10)
    now[0] = 101.0
    log.opened(0, True, 10, lead=4)
    log.opened(1, False, 30, lead=2)
    log.opened(1, True, 30, lead=0)
    log.opened(None, False, 50)        # the reads stopped following
    recs = log.records()
    assert [(r["epoch"], r["opens"], r["from_tiers"], r["pfs_bytes"]) for r in recs] == [(0, 3, 2, 10), (1, 2, 1, 30)]
    assert recs[0]["first"] == 100.0 and recs[0]["last"] == 101.0
    assert recs[0]["lead"] == 4.0 and recs[1]["lead"] == 1.0
    assert log.unattributed == 1


def test_a_batch_of_opens_of_no_epoch_counts_as_the_same_opens_one_by_one():
    import numpy as np
    from_tier = np.array([True, False, False, True, False])
    sizes = np.array([10, 20, 30, 40, 50], np.int64)
    one, many = EpochLog(clock=lambda: 5.0), EpochLog(clock=lambda: 5.0)
    for log_, batch in ((one, False), (many, True)):
        for epochs in (None, np.array([0, 0, 1, 1, 1]), None):   # before the order, with it, after divergence
            if batch:
                log_.opened_many(epochs, from_tier, sizes, lead=3)
            else:
                for k in range(len(sizes)):
                    log_.opened(None if epochs is None else int(epochs[k]), bool(from_tier[k]), int(sizes[k]), 3)
    assert many.records() == one.records()
    assert [(r["epoch"], r["opens"], r["from_tiers"], r["pfs_bytes"]) for r in many.records()] == \
        [(0, 7, 3, 120), (1, 3, 1, 80)]
    assert many.unattributed == one.unattributed == 5


def test_bytes_read_count_in_the_epoch_of_the_files_last_open():
    import numpy as np
    log = EpochLog(clock=lambda: 1.0)
    log.opened(None, False, 1000, file=7)                        # before the order: pending
    log.closed_many(np.array([7]), np.array([False]), np.array([40]))
    log.opened_many(np.array([0, 0]), np.array([False, True]), np.array([1000, 1000]), files=np.array([3, 4]))
    log.opened(None, False, 1000, file=5)                        # an epoch is known: nowhere
    log.closed_many(np.array([3, 4, 5]), np.array([False, True, False]), np.array([100, 200, 300]))
    log.opened_many(np.array([1]), np.array([False]), np.array([1000]), files=np.array([3]))
    log.closed_many(np.array([3, 9]), np.array([False, False]), np.array([50, 60]))   # 9 never opened
    recs = log.records()
    assert [(r["epoch"], r["pfs_read"], r["tier_read"]) for r in recs] == [(0, 140, 200), (1, 50, 0)]
    assert log.unattributed_read == 360


def test_epoch_records_split_the_daemons_traffic_at_the_epochs_first_opens():
    t0 = 1000.0
    per_epoch = [{"epoch": 0, "opens": 100, "from_tiers": 40, "pfs_bytes": 600, "pfs_read": 250, "tier_read": 90,
                  "first": t0 + 2, "last": t0 + 9, "lead": 5.0},
                 {"epoch": 1, "opens": 100, "from_tiers": 100, "pfs_bytes": 0, "pfs_read": 0, "tier_read": 700,
                  "first": t0 + 10, "last": t0 + 14, "lead": 10.0}]
    # the daemon copied 1000 bytes a second from t=0 to t=12, one file per 100 bytes
    samples = [sample(float(k), copy=min(k, 12) * 1000) for k in range(1, 16)]
    # the lead in seconds as measured at each tick: 0.5 s in epoch 1 (none at t=1: nothing followed yet), 2 s in 2
    leads = {k: 0.5 if k < 10 else 2.0 for k in range(2, 16)}
    samples = [Sample(s.t, s.tier_bytes, s.opens, s.from_tiers, s.copy_bytes // 100, s.pfs_bytes, 0, s.copy_bytes,
                      lead_s=leads.get(int(s.t))) for s in samples]
    recs = epoch_records(per_epoch, t0, series_json(samples, ["ram"], 1))
    assert [r["epoch"] for r in recs] == [1, 2]
    assert [r["start"] for r in recs] == [2.0, 10.0] and [r["seconds"] for r in recs] == [8.0, 4.0]
    assert [r["pfs_bytes_read_by_daemon"] for r in recs] == [10_000, 2_000]   # before epoch 1 counts in it
    assert [r["pfs_opens"] for r in recs] == [60 + 100, 0 + 20]
    assert [r["pfs_bytes"] for r in recs] == [10_250, 2_000]        # what COMMAND read, not the files' sizes
    assert [r["pfs_bytes_of_files_opened_by_job"] for r in recs] == [600, 0]
    assert [r["tier_bytes_read_by_job"] for r in recs] == [90, 700]
    assert [r["hit_ratio"] for r in recs] == [0.4, 1.0]
    # the mean of what was measured at the epoch's ticks, not its lead in samples scaled by its rate
    assert [r["prefetch_lead_seconds"] for r in recs] == [0.5, 2.0]


# -- the watch: lines, phases, status file ------------------------------------------------

class FakeProbe:
    def __init__(self) -> None:
        self.c = {"opens": 0, "opens_pfs": 0, "events_dropped": 0}
        self.tier_bytes = 0
        self.tier_files = 0
        self.copies = 0
        self.rep: dict = {"epochs_known": 0}

    def counters(self):
        return dict(self.c)

    def snapshot(self):
        return DaemonSnapshot([TierFill("ram", 1000 * MIB, self.tier_bytes, self.tier_files, self.tier_bytes)],
                              copies=self.copies, copy_failures=0, evictions=0, in_flight=3, reading=2,
                              pfs_opens=self.copies, pfs_bytes=self.tier_bytes, job_pfs_bytes=0, events=0,
                              invalidated=0, changed_sources=0)

    def report(self):
        return dict(self.rep)


def make_watch(tmp: Path, lines: list[str], monkeypatch, every: float = 10.0) -> tuple[JobWatch, FakeProbe, list]:
    now = [0.0]
    monkeypatch.setattr("tiering.observe.live.say", lines.append)
    w = JobWatch(Display("plain", every), clock=lambda: now[0])
    probe = FakeProbe()
    run_dir = tmp / "run"
    run_dir.mkdir(mode=0o700)
    info = JobInfo("tiering-me-1-abc", 1, "me", ["python", "train.py"], ["/pfs/ds"], "test", "clairvoyant",
                   100, 100 * MIB, 100 * MIB, [("ram", 1000 * MIB)], run_dir)
    w.attach(info, probe, lambda: None)
    w.command_started(4242)
    return w, probe, now


def test_the_watch_says_what_changes_and_a_status_line_at_its_rate(tmp_path, monkeypatch):
    lines: list[str] = []
    w, probe, now = make_watch(tmp_path, lines, monkeypatch)
    assert lines == ["tiering: starting COMMAND; tiers ram 1000 MiB: the data set fits"]
    for k in range(1, 31):
        now[0] = float(k)
        if k >= 3:   # the reader reads 10 positions a second: a lead of 40 is 4 s of its reading
            probe.rep = {"epochs_known": 2, "prefetch_lead": 40, "following": True, "reader_position": 10 * k}
        probe.c = {"opens": 10 * k, "opens_pfs": 10 * min(k, 5), "events_dropped": 0}
        probe.tier_bytes = min(100, 10 * k) * MIB
        probe.tier_files = min(100, 10 * k)
        probe.copies = probe.tier_files
        w.tick()
    said = [ln for ln in lines[1:]]
    assert said[0] == "tiering: order received: prefetching ahead of the reader"
    assert said[1] == "tiering: tiers warm after 10.0 s: 100 files (100 MiB), 100% of what fits"
    status = [ln for ln in said if ln.startswith("tiering 0:")]
    assert [ln.split()[1] for ln in status] == ["0:10", "0:20", "0:30"]
    assert "prefetching 40 samples, 4.0 s ahead of the reader" in status[-1]
    assert "10 opens/s, 100% from tiers (last 10 s; 83% in all)" in status[-1]
    assert len(said) == 5
    st = json.loads((tmp_path / "run" / STATUS_FILE).read_text())
    assert stat.S_IMODE(os.stat(tmp_path / "run" / STATUS_FILE).st_mode) == 0o600
    assert st["opens"] == {"total": 300, "from_tiers": 250, "pfs": 50}
    assert st["command_pid"] == 4242 and st["warm_after"] == 10.0 and st["copies"]["queued"] == 1
    assert st["placed"]["share"] == 1.0 and st["phase_kind"] == "prefetching"
    view = status_view(fresh_from(tmp_path, st))
    assert "tier ram" in view and "100 files" in view and "250 of 300" in view
    assert "2 reading the PFS, 1 queued" in view
    finished = w.finish()
    assert finished["warm_after"] == 10.0 and finished["series"]["t"][-1] == 30.0


def test_the_lead_in_seconds_is_how_long_the_reader_took_for_as_many_positions():
    from tiering.observe.series import lead_seconds
    # 100 positions a second for 3 s, then a pause of 10 s
    ticks = [(float(k), 100 * min(k, 3)) for k in range(14)]
    assert lead_seconds(ticks[:4], 150) == (1.5, False)
    assert lead_seconds(ticks, 150) == (11.5, False)     # measured: the pause is in it, not 150 / (0 opens/s)
    assert lead_seconds(ticks, 400) == (13.0, True)      # more than it read so far: at least the 13 s it ran
    # a new plan (positions from 0 again) at t=10: nothing measured before it
    again = ticks[:10] + [(10.0, 0), (11.0, 50), (12.0, 100)]
    assert lead_seconds(again, 50) == (1.0, False) and lead_seconds(again, 500) == (2.0, True)


def test_a_lead_far_beyond_what_the_reader_read_is_not_extrapolated_from_its_rate(tmp_path, monkeypatch):
    """65,536 positions ahead (the planner's floor) of a reader of 16 opens/s
    was "4,096 s ahead": the status says what was measured, over 60 s."""
    lines: list[str] = []
    w, probe, now = make_watch(tmp_path, lines, monkeypatch, every=60.0)
    for k in range(1, 61):
        now[0] = float(k)
        probe.rep = {"epochs_known": 90, "prefetch_lead": 65536, "following": True, "reader_position": 16 * k}
        probe.c = {"opens": 16 * k, "opens_pfs": 0, "events_dropped": 0}
        st = w.tick()
    assert st is not None and st["prefetch_lead"] == {"samples": 65536, "seconds": 59.0, "at_least": True}
    assert "prefetching 65,536 samples, over 59.0 s ahead of the reader" in lines[-1]
    assert "prefetch lead 65,536 samples (over 59.0 s)" in status_view(fresh_from(tmp_path, st))
    assert w.finish()["series"]["prefetch_lead_s"] == [None] * 60   # never measured: none in the epochs' means


def test_the_placement_log_says_the_policys_decisions_and_what_was_placed_at_the_lines_rate(tmp_path, monkeypatch):
    lines: list[str] = []
    w, probe, now = make_watch(tmp_path, lines, monkeypatch, every=5.0)
    w.display = Display("plain", 5.0, log=True)
    for k in range(1, 13):
        now[0] = float(k)
        if k == 2:
            probe.rep = {"epochs_known": 0, "mapping": {"source": "none: no DataLoader announced a data set"}}
        if k >= 3:
            probe.rep = {"epochs_known": 2 if k < 8 else 3, "following": True, "prefetch_lead": 0, "replans": 1,
                         "stream_length": 200 if k < 8 else 300, "reader_position": 10 * k, "fetches": 5 * k,
                         "mapping": {"source": "attribute samples"}}
        probe.tier_bytes, probe.tier_files, probe.copies = 5 * k * MIB, 5 * k, 5 * k
        w.tick()
    log = [ln for ln in lines if ln.startswith("tiering: placement")]
    assert log == [
        "tiering: placement: the order of 2 epochs known, 200 positions planned, the reader at 30",
        "tiering: placement: indices to files: attribute samples",
        "tiering: placement 0:00-0:05: 25 copies landed (25 MiB read from the PFS): 25 fetched ahead of the reader; "
        "0 evicted, 0 failed; 3 in flight; ram 25 files (25 MiB)",
        "tiering: placement: the order of 3 epochs known, 300 positions planned, the reader at 80",
        "tiering: placement 0:05-0:10: 25 copies landed (25 MiB read from the PFS): 25 fetched ahead of the reader; "
        "0 evicted, 0 failed; 3 in flight; ram 50 files (50 MiB)"]
    probe.rep = dict(probe.rep, replans=2)
    now[0] = 12.5
    w.finish()        # the last line, whatever the rate: the lines add up to the copies made
    assert lines[-2:] == [
        "tiering: placement: planned anew from the reader's position (plan 2)",
        "tiering: placement 0:10-0:12: 10 copies landed (10 MiB read from the PFS): 10 fetched ahead of the reader; "
        "0 evicted, 0 failed; 3 in flight; ram 60 files (60 MiB)"]


def test_the_series_pfs_bytes_are_the_totals_of_the_report_with_events_dropped(tmp_path, monkeypatch):
    """The series' PFS bytes are the copies' and COMMAND's by the shim's read
    counter (NOTE [read counters]), the figure to_json's pfs.bytes adds, not
    what the daemon learnt from close events: with events dropped the
    series still ends on the report's totals."""
    w, probe, now = make_watch(tmp_path, [], monkeypatch)
    for k in range(1, 4):
        now[0] = float(k)
        probe.tier_bytes, probe.copies = 10 * k * MIB, 10 * k
        probe.c = {"opens": 20 * k, "opens_pfs": 20 * k, "events_dropped": 5 * k, "read_pfs": 7 * k * MIB}
        w.tick()
    js = w.finish()["series"]
    assert js["pfs_bytes"][-1] == 30 * MIB + 21 * MIB
    # when they were lost: the ring's drop count as it stood at each tick
    assert js["events_dropped"][-3:] == [5, 10, 15]
    record = JobRecord("clairvoyant", 0, ["x"], "test", ["/pfs/ds"], 100, 100 * MIB, counters=probe.counters(),
                       daemon=DaemonStats(pfs_opens=30, pfs_bytes=30 * MIB, copies=30))
    assert to_json(record)["pfs"]["bytes"] == js["pfs_bytes"][-1]


def test_while_copies_go_on_the_status_line_has_their_rate_and_the_eta(tmp_path, monkeypatch):
    lines: list[str] = []
    w, probe, now = make_watch(tmp_path, lines, monkeypatch, every=1.0)
    for k in range(1, 6):        # 10 files (10 MiB) copied a second; COMMAND opens 20 a second from the PFS
        now[0] = float(k)
        probe.tier_bytes, probe.tier_files, probe.copies = 10 * k * MIB, 10 * k, 10 * k
        probe.c = {"opens": 20 * k, "opens_pfs": 20 * k, "events_dropped": 0}
        w.tick()
    assert lines[-1] == ("tiering 0:05 waiting for the order (first touch meanwhile) | 50% of the data set in tiers | "
                         "copying 10 MiB/s, 10 files/s, ETA 0:05 | 20 opens/s, 0% from tiers (last 4 s; 0% in all) | "
                         "PFS 10 MiB/s")


def test_tiers_that_got_warm_after_the_last_tick_are_warm_in_the_summary(tmp_path, monkeypatch):
    """A short COMMAND (1.5 s) ticked once while half was placed; the rest
    landed before the last sample: the summary says when, not "never"."""
    lines: list[str] = []
    w, probe, now = make_watch(tmp_path, lines, monkeypatch)
    now[0] = 1.0
    probe.tier_bytes, probe.tier_files = 50 * MIB, 50
    w.tick()
    assert w.warm_after is None
    now[0] = 1.6
    probe.tier_bytes, probe.tier_files = 100 * MIB, 100
    finished = w.finish()
    assert finished["warm_after"] == 1.6
    assert not any("tiers warm" in ln for ln in lines)      # COMMAND has ended: the summary says it
    text = summary_text(to_json(record(observed=finished, seconds={"scan": 0.1, "command": 1.5, "total": 2.0})))
    assert "tiers warm after 1.6 s" in text and "never" not in text


def test_tiers_a_warm_up_filled_are_warm_at_its_end_not_at_the_first_tick_after_command_started(tmp_path, monkeypatch):
    from tiering.clairvoyant.warm import WarmResult
    lines: list[str] = []
    now = [0.0]
    monkeypatch.setattr("tiering.observe.live.say", lines.append)
    w = JobWatch(Display("plain", 10.0), clock=lambda: now[0])
    probe = FakeProbe()
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    w.attach(JobInfo("j", 1, "me", ["x"], ["/d"], "p", "clairvoyant", 100, 100 * MIB, 100 * MIB,
                     [("ram", 1000 * MIB)], run_dir), probe, lambda: None)
    probe.tier_bytes, probe.tier_files = 100 * MIB, 100      # the warm-up copied everything
    now[0] = 4.0
    w.warm_done(WarmResult(100, "catalog order", 100, 100 * MIB, 100, 100 * MIB, 0, 4.0))
    now[0] = 4.25
    w.command_started(7)
    now[0] = 5.25
    st = w.tick()
    assert st is not None and st["warm_after"] == -0.25
    assert not any("tiers warm after" in ln for ln in lines), lines     # the warm-up's line said it
    assert "tiers warm before COMMAND started (at the warm-up's end)" in status_view(fresh_from(tmp_path, st))
    finished = w.finish()
    text = summary_text(to_json(record(observed=finished, seconds={"scan": 0.1, "command": 1.0, "total": 5.5})))
    assert "tiers warm before COMMAND started (at the warm-up's end)" in text


def test_a_warm_up_of_part_of_what_fits_leaves_the_warm_moment_to_the_copies_after_it(tmp_path, monkeypatch):
    from tiering.clairvoyant.warm import WarmResult
    w, probe, now = make_watch(tmp_path, [], monkeypatch)
    w.t0 = None
    probe.tier_bytes, probe.tier_files = 30 * MIB, 30        # --warm 30
    w.warm_done(WarmResult(30, "catalog order", 30, 30 * MIB, 30, 30 * MIB, 0, 1.0))
    w.command_started(7)
    now[0] = 1.0
    w.tick()
    assert w.warm_after is None
    probe.tier_bytes, probe.tier_files = 100 * MIB, 100
    now[0] = 3.0
    w.tick()
    assert w.warm_after == 3.0


def test_the_warm_up_in_a_log_is_a_line_every_5_s_with_rate_and_eta_then_what_was_warmed(monkeypatch):
    from tiering.clairvoyant.warm import WarmProgress, WarmResult
    lines: list[str] = []
    monkeypatch.setattr("tiering.observe.live.say", lines.append)
    now = [0.0]
    w = JobWatch(Display("plain", 10.0), clock=lambda: now[0])
    for t in (1.0, 4.0, 5.0, 7.0, 10.0):
        now[0] = t
        done = int(t * 10)
        w.warming(WarmProgress(files=100, bytes=100 * MIB, done_files=done, done_bytes=done * MIB, seconds=t))
    assert lines == ["tiering: warm-up: 50 of 100 files, 10 MiB/s, ETA 0:05",
                     "tiering: warm-up: 100 of 100 files, 10 MiB/s, ETA 0:00"]
    w.warm_done(WarmResult(100, "known order", 98, 98 * MIB, 100, 100 * MIB, 2, 10.0))
    assert lines[-1] == ("tiering: warm-up: 98 files (98 MiB) in the tiers, known order, 10.0 s, 9.8 MiB/s; "
                         "2 not copied")


def fresh_from(tmp: Path, st: dict) -> dict:
    from tiering.observe.status import JobDir
    return fresh(JobDir(tmp / "run", os.getuid(), 1), st, 10.0, now=st["updated"])


def test_quiet_and_off_say_nothing_but_still_write_the_status_file(tmp_path, monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr("tiering.observe.live.say", lines.append)
    w = JobWatch(choose_display("auto", True, 0), clock=lambda: 5.0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    w.attach(JobInfo("j", 1, "me", ["x"], ["/d"], "p", "first-touch", 1, 1, 1, [("ram", 10)], run_dir),
             FakeProbe(), lambda: None)
    w.on_scan(ScanProgress(files=5))
    w.scan_done(5, 5, 1, 0.1, False)
    w.command_started(7)
    w.tick()
    assert lines == [] and (run_dir / STATUS_FILE).exists()


@pytest.mark.parametrize("progress, quiet, verbose, terminal, every, want", [
    ("auto", False, 0, True, None, Display("bar", 30.0)),
    ("auto", False, 0, False, None, Display("plain", 10.0)),
    ("auto", False, 1, False, None, Display("plain", 5.0, log=True)),
    ("plain", False, 0, True, None, Display("plain", 10.0)),
    ("bar", False, 0, False, 2.0, Display("bar", 2.0)),
    ("auto", True, 1, True, None, Display("off", 0.0, summary=False)),
    ("off", False, 0, True, None, Display("off", 0.0, summary=True)),
])
def test_choose_display(progress, quiet, verbose, terminal, every, want):
    assert choose_display(progress, quiet, verbose, every, terminal=terminal) == want


@pytest.mark.parametrize("policy, report, no_order, want", [
    ("clairvoyant", {"epochs_known": 0}, None, ("waiting", "waiting for the order (first touch meanwhile)")),
    ("clairvoyant", {"epochs_known": 0, "staged": 12}, None,
     ("waiting", "waiting for the order (staging the data set meanwhile)")),
    ("clairvoyant", {"epochs_known": 0, "staged": 12, "mapping": {"source": "learnt in epoch 1"}}, None,
     ("learning", "learning which files each index reads (staging the data set meanwhile)")),
    ("clairvoyant", {"epochs_known": 0, "mapping": {"source": "learnt in epoch 1"}}, None,
     ("learning", "learning which files each index reads (first touch meanwhile)")),
    ("clairvoyant", {"epochs_known": 2, "prefetch_lead": 40}, None, ("prefetching", "prefetching ahead of the reader")),
    ("clairvoyant", {"epochs_known": 2, "prefetch_lead": 0}, None,
     ("following", "following the reader, no copy ahead of it")),
    ("clairvoyant", {"epochs_known": 2, "diverged": True}, None,
     ("fallback", "fell back to first-touch: the reads stopped following the order")),
    ("clairvoyant", {"epochs_known": 0, "hook_errors": [
        "the sampler Mine is not one of torch's: the hook does not run it twice; give the order with "
        "--order-file, or prefetching follows first touch"]}, None,
     ("fallback", "first touch: the order hook gave up (the sampler Mine is not one of torch's: the hook does "
                  "not run it twice)")),
    ("clairvoyant", {"epochs_known": 0, "hook_errors": [
        "cannot map the data set to files (Files has no length; cannot learn it: Files has no length); "
        "prefetching follows first touch"]}, None,
     ("fallback", "first touch: the order hook gave up (cannot map the data set to files (Files has no length; "
                  "cannot learn it: Files has no length))")),
    ("clairvoyant", {"epochs_known": 0}, "the order hook did not start in COMMAND",
     ("fallback", "fell back to first-touch: no order (the order hook did not start in COMMAND)")),
    ("first-touch", {}, None, ("first-touch", "copying what COMMAND opens (first touch)")),
    ("stage", {}, None, ("staging", "staging the data set in catalog order")),
])
def test_the_phase_says_what_placement_does_and_why_it_fell_back(policy, report, no_order, want):
    from tiering.observe.live import phase
    assert phase(policy, report, no_order) == want


def test_what_fits_counts_whole_blocks():
    sizes = [1000] * 100                       # 100 KB in 100 blocks of 4 KiB
    assert fits_bytes(sizes, 10 ** 9, allocation) == 100_000
    assert fits_bytes(sizes, 50 * 4096, allocation) == 50_000


def test_percentages_keep_a_decimal_near_the_ends():
    assert [pct(x) for x in (None, 0, 0.004, 0.5, 0.997, 1.0)] == ["-", "0%", "0.4%", "50%", "99.7%", "100%"]


# -- the summary ----------------------------------------------------------------------------

def record(**kw) -> JobRecord:
    r = JobRecord("first-touch", 0, ["python", "train.py"], "test", ["/pfs/ds"], files=100, bytes=100 * MIB,
                  tiers=[{"name": "ram", "kind": "memory", "path": "/dev/shm/x", "capacity": 1 << 30, "files": 100,
                          "bytes": 100 * MIB, "used": 100 * MIB, "copy_failures": 0}],
                  counters={"opens": 300, "opens_pfs": 100, "opens_tier": [200], "bytes_tier": 200 * MIB,
                            "fallbacks": 0, "writes": 0, "events_posted": 600, "events_dropped": 0,
                            "read_pfs": 100 * MIB, "read_tier": 200 * MIB, "closed_at_zero": 0,
                            "closed_at_zero_bytes": 0},
                  daemon=DaemonStats(pfs_opens=100, pfs_bytes=100 * MIB, copies=100, job_pfs_bytes=100 * MIB),
                  seconds={"scan": 1.5, "command": 42.0, "total": 44.0},
                  observed={"warm_after": 12.5, "t0": 0.0, "series": {}})
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_the_summary_says_times_hit_ratio_and_the_net_pfs_traffic():
    s = to_json(record())
    assert s["hit_ratio"] == round(200 / 300, 4)
    assert s["pfs"]["bytes"] == 200 * MIB and s["pfs"]["bytes_without_tiering"] == 300 * MIB
    assert s["pfs"]["bytes_measure"] == "bytes read, by file position at close"
    assert s["seconds"]["warm"] == 12.5 and s["warnings"] == []
    text = summary_text(s)
    assert "  time     COMMAND 42.0 s, scan 1.5 s, tiers warm after 12.5 s" in text
    assert "  hits     67% of 300 opens of data-set files from tiers (ram 200), 100 from the PFS" in text
    assert "PFS traffic: 200 MiB instead of 300 MiB (-33%), 200 opens instead of 300 (-33%)" in text
    assert "saved" not in text and "avoided" not in text
    assert ("bytes read, by file position at close: COMMAND read 100 MiB there (of files of 100 MiB it opened: "
            "an upper bound) and 200 MiB from the tiers, the copies read 100 MiB") in text


def test_the_pfs_traffic_is_what_command_read_and_the_file_sizes_stay_an_upper_bound():
    # a reader of the first 4 KiB of 100 files of 1 MiB, 200 opens from the tiers, 100 from the PFS
    s = to_json(record(counters={"opens": 300, "opens_pfs": 100, "opens_tier": [200], "bytes_tier": 200 * MIB,
                                 "read_pfs": 100 * 4096, "read_tier": 200 * 4096, "closed_at_zero": 3,
                                 "closed_at_zero_bytes": 3 * MIB}))
    p = s["pfs"]
    assert p["bytes_read_by_job"] == 100 * 4096 and p["bytes"] == 100 * 4096 + 100 * MIB
    assert p["bytes_without_tiering"] == 300 * 4096
    assert p["bytes_without_tiering_upper_bound"] == 300 * MIB and p["bytes_of_files_opened_by_job"] == 100 * MIB
    assert s["opens"]["bytes_read_from_tiers"] == 200 * 4096
    text = summary_text(s)
    assert "PFS traffic: 100.4 MiB instead of 1.2 MiB (+8467%), 200 opens instead of 300 (-33%)" in text
    assert ("\n           3 of 300 opens were closed at file position 0 (pread or mmap readers, or nothing read): "
            "not in these figures; their files hold 3 MiB (an upper bound)\n") in text
    assert s["warnings"] == []      # a note on the figures, nothing to act on


@pytest.mark.parametrize("change, warning", [
    ({"files": 0, "bytes": 0}, "the data set is empty: no regular file under /pfs/ds; check --data"),
    ({"counters": {"opens": 0, "opens_pfs": 0, "opens_tier": [0]}},
     "COMMAND opened no file of the data set: does it read from /pfs/ds?"),
    ({"counters": {"opens": 100, "opens_pfs": 100, "opens_tier": [0]}},
     "100 copies made, none served: COMMAND read each file before its copy landed or never again (one epoch?); "
     "--warm fills the tiers before COMMAND starts"),
    ({"counters": {"opens": 300, "opens_pfs": 100, "opens_tier": [200], "fallbacks": 20}},
     "20 opens fell back to the PFS because their copy went away"),
    ({"counters": {"opens": 300, "opens_pfs": 100, "opens_tier": [200], "events_posted": 600,
                   "events_dropped": 7}},
     "7 of 600 events dropped (ring full): the daemon missed opens"),
])
def test_warnings_a_user_needs(change, warning):
    s = to_json(record(**change))
    assert any(w.startswith(warning) for w in s["warnings"]), s["warnings"]
    assert f"  warning  {warning}" in summary_text(s)


# -- tiering status: which job ------------------------------------------------------------------

def job_dir(parent: Path, name: str, pid: int, command_pid: int, uid: int | None = None) -> Path:
    from tiering.rundirs import start_ticks
    d = parent / name
    d.mkdir(mode=0o700)
    (d / "owner.json").write_text(json.dumps({"pid": pid, "start": start_ticks(pid)}))
    (d / STATUS_FILE).write_text(json.dumps({"version": 1, "pid": pid, "command_pid": command_pid,
                                             "command": ["python", name], "started": pid}))
    if uid is not None:
        os.chown(d, uid, uid)
    return d


def test_status_finds_the_only_job_or_the_one_named_and_refuses_another_users(tmp_path):
    me = os.getpid()
    parent = str(tmp_path)
    with pytest.raises(StatusError, match="no tier-run job of user .* is running on this node"):
        find_job(None, [parent])
    job_dir(tmp_path, f"tiering-me-{me}-aaaa1111", me, 777)
    d, st = find_job(None, [parent])
    assert d.name == f"tiering-me-{me}-aaaa1111"
    job_dir(tmp_path, f"tiering-me-{os.getppid()}-bbbb2222", os.getppid(), 888)
    with pytest.raises(StatusError, match="2 tier-run jobs are running; name one"):
        find_job(None, [parent])
    assert find_job("888", [parent])[0].name.endswith("bbbb2222")       # COMMAND's pid
    assert find_job(str(me), [parent])[0].name.endswith("aaaa1111")      # tier-run's pid
    assert find_job("bbbb2222", [parent])[0].name.endswith("bbbb2222")   # the job id
    job_dir(tmp_path, "tiering-other-4321-cccc3333", 4321, 999, uid=54321)
    with pytest.raises(StatusError, match="job 4321 belongs to user .*54321.*: tiering status shows only your own"):
        find_job("4321", [parent])
    with pytest.raises(StatusError, match="no running tier-run job of yours has PID 5"):
        find_job("5", [parent])
    dead = job_dir(tmp_path, "tiering-me-999999-dddd4444", 999999, 1)   # a leftover: not running
    with pytest.raises(StatusError, match="no running tier-run job of yours is called dddd4444"):
        find_job(dead.name.rsplit("-", 1)[-1], [parent])


# -- the scan's progress ---------------------------------------------------------------------

def test_the_scan_reports_what_it_found_and_when_the_cache_served(tmp_path):
    for k in range(150):
        p = tmp_path / "ds" / f"c{k % 3}" / f"f{k}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * k)
    past = time.time() - 3600     # a tree made just now is too recent to be cached
    for d, _, _ in os.walk(tmp_path / "ds"):
        os.utime(d, (past, past))
    seen: list[ScanProgress] = []

    def take(p: ScanProgress) -> None:
        seen.append(ScanProgress(**vars(p)))

    cat = scan([str(tmp_path / "ds")], cache_dir=tmp_path / "cache", progress=take)
    assert len(cat.files) == 150
    assert [p.files for p in seen] == sorted(p.files for p in seen)       # never goes down
    last = seen[-1]
    assert (last.phase, last.files, last.dirs, last.bytes, last.roots_from_cache) == ("done", 150, 4, sum(range(150)), 0)
    assert any(p.phase == "scanning" for p in seen)
    seen.clear()
    cat = scan([str(tmp_path / "ds")], cache_dir=tmp_path / "cache", progress=take)
    assert cat.from_cache and seen[-1].roots_from_cache == 1 and seen[-1].files == 150
    assert not any(p.phase == "scanning" for p in seen)


# -- the benchmark's tables --------------------------------------------------------------------

def test_bench_tables_use_mib_and_name_their_ratios():
    from bench.run import header, table
    def config(name: str, secs: list[float], opens: int) -> dict:
        return {"name": name, "checksum": "x", "epochs": [{"seconds": s, "pfs_opens": opens, "pfs_bytes": 3 * MIB}
                                                           for s in secs]}
    res = {"scenario": "fits-ram", "description": "d", "dataset": {"files": 10, "bytes": 10 * MIB},
           "tiers": [{"name": "ram", "capacity": 13 * MIB}],
           "pfs": {"meta_latency_ms": 1.0, "read_latency_ms": 0.5, "bandwidth_mbps": 400.0, "max_inflight": 16},
           "workload": {"reader": "dataloader", "workers": 2, "batch_size": 32, "compute_ms_per_batch": 30,
                        "epochs": 2},
           "configurations": [config("pfs", [8, 8], 10), config("clairvoyant", [3, 2], 0),
                              config("lower-bound", [2, 2], 0)]}
    text = table(res)
    assert "10 files, 10.0 MiB; tiers: ram 13.0 MiB." in text
    assert "| clairvoyant | prefetch in the sampler's order | 3.00 | 2.00 | 1.50x | 1.00x | 4.00x | 0 | 3.0 |" in text
    assert "x slower than the lower bound" in text and "speed-up over the PFS" in text
    assert " MB" not in text and " MB" not in header([res], "python -m bench.run")
    assert "381 MiB/s" in header([res], "python -m bench.run")


def test_a_job_still_scanning_has_a_status_that_says_how_far_the_scan_got(tmp_path):
    now = [10.0]
    w = JobWatch(Display("off", 0.0), clock=lambda: now[0])
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    w.scanning_in(run_dir, {"job": "tiering-me-1-abc", "pid": 1, "user": "me", "command": ["python", "t.py"],
                            "data": ["/pfs/ds"], "policy": "default"})
    w.on_scan(ScanProgress(files=10, dirs=1))
    now[0] = 10.5
    w.on_scan(ScanProgress(files=5000, dirs=40, bytes=5 * MIB))      # within the second: not written
    st = json.loads((run_dir / STATUS_FILE).read_text())
    assert (st["state"], st["scan"]["files"]) == ("scanning", 10)
    now[0] = 12.0
    w.on_scan(ScanProgress(files=20_000, dirs=400, bytes=2 * 1024 * MIB))
    st = fresh_from(tmp_path, json.loads((run_dir / STATUS_FILE).read_text()))
    assert status_view(st) == ("job tiering-me-1-abc (tier-run pid 1): python t.py\n"
                               "  scanning the data set 0:02: 20,000 files (2 GiB) in 400 directories found so far")


def test_the_watch_says_while_a_mapping_is_learnt_and_how_the_order_came(tmp_path, monkeypatch):
    lines: list[str] = []
    w, probe, now = make_watch(tmp_path, lines, monkeypatch, every=1.0)
    learnt = {"source": "learnt in epoch 1", "indices": 100, "mapped": 40}
    probe.rep = {"epochs_known": 0, "following": False, "mapping": learnt}
    now[0] = 1.0
    st = w.tick()
    assert st["phase_kind"] == "learning" and st["mapping"] == "learnt in epoch 1"
    assert "learning which files each index reads (first touch meanwhile)" in lines[-1]
    probe.rep = {"epochs_known": 2, "prefetch_lead": 40, "following": True, "mapping": learnt}
    now[0] = 2.0
    w.tick()
    assert "tiering: order received (indices to files: learnt in epoch 1): prefetching ahead of the reader" in lines


# -- --warm PERCENT: what is copied ----------------------------------------------------------

class WarmDaemon:
    """Copies that land at once, for warm_up."""

    def __init__(self, sizes: list[int], capacity: int):
        self.sizes, self.capacities = sizes, [capacity]
        self.placed: list[int] = []
        self.pools = "new"

    def snapshot(self) -> DaemonSnapshot:
        b = sum(self.sizes[i] for i in self.placed)
        return DaemonSnapshot([TierFill("ram", self.capacities[0], b, len(self.placed), b)], len(self.placed),
                              0, 0, 0, 0, len(self.placed), b, 0, 0, 0, 0)

    def start_pools(self) -> None:
        self.pools = "started"

    def close_pools(self) -> None:
        self.pools = "closed"

    def copies_in_flight(self) -> int:
        return 0

    def fastest_with_room(self, i: int) -> int:
        return 0

    def place(self, i: int, tier: int) -> bool:
        self.placed.append(i)
        return True


class FailingWarmDaemon(WarmDaemon):
    """The third place() fails (a defect); stop() would end placement for the job."""

    def place(self, i: int, tier: int) -> bool:
        if len(self.placed) == 2:
            raise RuntimeError("a defect")
        return super().place(i, tier)

    def stop(self, timeout: float | None = None) -> bool:
        self.pools = "stopped"
        return True


def test_a_warm_up_that_fails_ends_its_copy_workers_and_leaves_placement_to_the_job() -> None:
    """A failure of the warm-up only means colder tiers: the copy workers end
    (COMMAND is forked from a process without threads) and the daemon is not
    stopped, so placement goes on once COMMAND runs; a signal stops it."""
    from tiering.clairvoyant.warm import warm_up
    from tiering.command import Interrupted
    d = FailingWarmDaemon([allocation(1)] * 8, 20 * allocation(1))
    with pytest.raises(RuntimeError):
        warm_up(d, None, 100, lambda p: None)
    assert d.placed == [0, 1] and d.pools == "closed"

    class Signalled(FailingWarmDaemon):
        def place(self, i: int, tier: int) -> bool:
            raise Interrupted(2)
    d = Signalled([allocation(1)] * 8, 20 * allocation(1))
    with pytest.raises(Interrupted):
        warm_up(d, None, 100, lambda p: None)
    assert d.pools == "stopped"


def test_warm_copies_the_first_percent_of_what_fits_in_the_known_order_each_file_once() -> None:
    import numpy as np

    from tiering.clairvoyant.warm import warm_up
    block = allocation(1)
    sizes = [block] * 8 + [3 * block] * 2          # files 8 and 9 take three blocks each
    d = WarmDaemon(sizes, 20 * block)
    seen: list = []
    order = np.array([9, 3, 9, 0, 8, 5, 1, 2, 4, 6, 7])
    r = warm_up(d, order, 50, seen.append)          # 50% of 98% of 20 blocks: 9.8 blocks
    assert d.placed == [9, 3, 0, 8, 5] and d.pools == "closed"   # 3 + 1 + 1 + 3 + 1 = 9 blocks; the next would be 10
    assert (r.percent, r.order, r.files, r.bytes, r.planned_files, r.failed) == (50, "known order", 5, 9 * block, 5, 0)
    assert seen[-1].done_files == 5 and seen[-1].done_bytes == 9 * block
    d = WarmDaemon(sizes, 12 * block)
    r = warm_up(d, None, 100, seen.append)          # catalog order, 11.76 blocks: all but file 9
    assert d.placed == list(range(9)) and r.order == "catalog order" and r.bytes == 11 * block
