"""The job's time series: one sample a second, in bounded memory
(NOTE [time series] in docs/design.md).

A sample holds cumulative counters (opens, opens from tiers, PFS bytes and
opens) and gauges (bytes in each tier).  Rates are differences of cumulative
counters between kept samples, so dropping samples never makes a rate wrong,
only coarser: when the series reaches its cap, every other sample is dropped
and from then on only every second tick is kept (the resolution halves; a
week-long job keeps at most `cap` samples).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .view import MIB

CAP = 2048          # samples kept (1 s each for the first 34 minutes, then 2 s, 4 s, ...)
RECENT = 60         # one-second samples kept for windows ("hit ratio over the last N s")


@dataclass(frozen=True)
class Sample:
    t: float                   # seconds since COMMAND started
    tier_bytes: tuple[int, ...]
    opens: int                 # opens of data-set files by COMMAND, cumulative
    from_tiers: int            # of which served from a tier
    pfs_opens: int             # PFS opens of COMMAND and the daemon, cumulative
    pfs_bytes: int             # PFS bytes read by the daemon and by COMMAND (NOTE [read counters])
    copies: int                # copies published, cumulative
    copy_bytes: int            # bytes the daemon read from the PFS, cumulative
    events_dropped: int = 0    # events the ring lost before the daemon drained them, cumulative
    lead_s: float | None = None   # the prefetch lead in seconds, measured (lead_seconds), None when not


@dataclass
class Series:
    cap: int = CAP
    samples: list[Sample] = field(default_factory=list)
    stride: int = 1            # ticks per kept sample
    recent: deque[Sample] = field(default_factory=lambda: deque(maxlen=RECENT))
    _ticks: int = 0

    def add(self, s: Sample) -> None:
        self.recent.append(s)
        self._ticks += 1
        if (self._ticks - 1) % self.stride:
            return
        self.samples.append(s)
        if len(self.samples) >= self.cap:
            self.samples = self.samples[::2]
            self.stride *= 2

    def finish(self, s: Sample) -> None:
        """The last sample, kept whatever the stride (the totals end the series)."""
        self.recent.append(s)
        if not self.samples or self.samples[-1].t < s.t:
            self.samples.append(s)

    @property
    def last(self) -> Sample | None:
        return self.recent[-1] if self.recent else None

    def window(self, seconds: float) -> tuple[Sample, Sample] | None:
        """The recent samples `seconds` apart (or as close as kept), None
        with fewer than two."""
        if len(self.recent) < 2:
            return None
        return self.recent[window_start([s.t for s in self.recent], seconds)], self.recent[-1]

    def to_json(self, tier_names: list[str]) -> dict[str, Any]:
        return series_json(self.samples, tier_names, self.stride)


def window_start(t: list[float], seconds: float) -> int:
    """The index in t (times, ascending, at least two) of the first within
    `seconds` of the last, and at least one before the last."""
    k = next((i for i, x in enumerate(t) if t[-1] - x <= seconds), len(t) - 2)
    return min(k, len(t) - 2)


def rate(a: Sample, b: Sample, what: str) -> float:
    dt = b.t - a.t
    return (getattr(b, what) - getattr(a, what)) / dt if dt > 0 else 0.0


def hit_ratio(a: Sample | None, b: Sample) -> float | None:
    """Share of the opens between a and b (a None: since the start) served from tiers."""
    opens = b.opens - (a.opens if a else 0)
    return (b.from_tiers - (a.from_tiers if a else 0)) / opens if opens > 0 else None


def series_json(samples: list[Sample], tier_names: list[str], stride: int) -> dict[str, Any]:
    """Columns: t, bytes in each tier, and per interval (from the sample
    before; the first from COMMAND's start) opens/s, hit ratio, PFS MiB/s."""
    t: list[float] = []
    opens_s: list[float] = []
    hits: list[float | None] = []
    pfs: list[float] = []
    prev = Sample(0.0, tuple(0 for _ in tier_names), 0, 0, 0, 0, 0, 0)
    for s in samples:
        t.append(round(s.t, 2))
        opens_s.append(round(rate(prev, s, "opens"), 2))
        h = hit_ratio(prev, s)
        hits.append(None if h is None else round(h, 4))
        pfs.append(round(rate(prev, s, "pfs_bytes") / MIB, 6))
        prev = s
    return {
        "interval": float(stride),
        "t": t,
        "tier_bytes": {n: [s.tier_bytes[k] for s in samples] for k, n in enumerate(tier_names)},
        "opens_per_s": opens_s,
        "hit_ratio": hits,
        "pfs_mib_per_s": pfs,
        "opens": [s.opens for s in samples],
        "from_tiers": [s.from_tiers for s in samples],
        "pfs_bytes": [s.pfs_bytes for s in samples],
        "pfs_opens": [s.pfs_opens for s in samples],
        "copy_bytes": [s.copy_bytes for s in samples],
        "events_dropped": [s.events_dropped for s in samples],
        "prefetch_lead_s": [s.lead_s for s in samples],
    }


def lead_seconds(readers: Sequence[tuple[float, int]], lead: int) -> tuple[float, bool]:
    """The prefetch lead in seconds, measured: how long the reader took to
    read its last `lead` positions, from readers, its (time, stream
    position) at each tick, the latest last.  (seconds, True) when it has
    not read that many since the oldest tick kept or since its plan began
    (a position that went back): the lead is then at least those seconds.
    Never lead / rate: a reader that pauses (an evaluation, the end of an
    epoch) would turn a lead of a few seconds of reading into hours."""
    t, reader = readers[-1]
    target = reader - lead
    after = readers[-1]          # the oldest tick seen so far, walking back
    for tk, rk in reversed(readers):
        if rk > after[1]:
            break                # the plan began anew after this tick
        if rk <= target:
            t1, r1 = after
            cross = tk + (t1 - tk) * (target - rk) / (r1 - rk) if r1 > rk else t1
            return t - cross, False
        after = (tk, rk)
    return t - after[0], True
