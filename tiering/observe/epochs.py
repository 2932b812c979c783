"""Opens per epoch of the reader, as the clairvoyant policy attributes them.

The policy matches each open to a position of the stream it plans; the
position says the epoch (`EpochLog.opened`).  An open that matches no
position counts in the epoch the reader is in; opens made before the first
epoch's order was known (the hook's order and the first opens race) count
in the first epoch (in the one before it when the first order known is of a
later epoch: a learnt mapping); after the reads stopped following the order,
nothing is attributed (the totals of the summary still count them).  The
epochs the policy gives are its plan's, numbered as their DataLoader numbers
them; `number_from` shifts them so that each new DataLoader's epochs come
after those counted (docs/design.md, NOTE [epoch rows]).  The bytes read
through a descriptor, known when it is closed (NOTE [read counters]), count
in the epoch its file's last open counted in.

Called on the daemon's event thread, read from any thread: one small lock.
"""
from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class EpochCount:
    epoch: int                 # the policy's number (0 for the first epoch)
    opens: int = 0
    from_tiers: int = 0
    pfs_bytes: int = 0         # sizes of the files opened from the PFS (an upper bound of the bytes read)
    pfs_read: int = 0          # bytes read through the descriptors opened on the PFS (file position at close)
    tier_read: int = 0         # ... on tier copies
    first: float = 0.0         # time.monotonic() of the first and the last open
    last: float = 0.0
    lead_sum: int = 0          # prefetch lead (samples) summed over the opens that saw one
    lead_n: int = 0


# where a file's last open counted (EpochLog._last): an epoch >= 0, or
NOWHERE = -2                # no open of it counted (or after the reads stopped following)
PENDING = -1                # with the opens before the first order


class EpochLog:
    def __init__(self, clock: Any = time.monotonic):
        self._lock = threading.Lock()
        self._epochs: dict[int, EpochCount] = {}
        self._pending = EpochCount(-1)      # before any epoch was known
        self._pending_into: int | None = None   # the epoch the pending opens went to
        self._last = np.zeros(0, np.int32)  # by catalog id: where its last open counted
        self.unattributed = 0               # opens after the reads stopped following
        self.unattributed_read = 0          # bytes read through them
        self._base = 0                      # an epoch given is counted as epoch + _base (number_from)
        self._clock = clock

    def opened(self, epoch: int | None, from_tier: bool, size: int, lead: int | None = None,
               file: int | None = None) -> None:
        files = None if file is None else np.array([file], np.int64)
        self.opened_many(None if epoch is None else np.array([epoch]), np.array([from_tier]), np.array([size]),
                         lead, files)

    def opened_many(self, epochs: np.ndarray | None, from_tier: np.ndarray, sizes: np.ndarray,
                    lead: int | None = None, files: np.ndarray | None = None) -> None:
        """opened() for a batch of opens (the policy's batches, from_tier a
        bool array; files their catalog ids, for closed_many), one update
        per epoch in it."""
        if not len(from_tier):
            return
        now = self._clock()
        with self._lock:
            if epochs is None:
                rec = self._before_order()
                if rec is None:
                    self.unattributed += len(from_tier)
                else:
                    self._count(rec, now, len(from_tier), int(from_tier.sum()), int(sizes[~from_tier].sum()), lead)
                self._remember(files, None, NOWHERE if rec is None else PENDING)
                return
            epochs = epochs + self._base
            for e in np.unique(epochs).tolist():
                sel = epochs == e
                tier = from_tier[sel]
                self._count(self._epoch(e), now, int(sel.sum()), int(tier.sum()),
                            int(sizes[sel][~tier].sum()), lead)
            self._remember(files, epochs, 0)

    def _remember(self, files: np.ndarray | None, epochs: np.ndarray | None, where: int) -> None:
        """Notes where the opens of files counted (epochs, else where)."""
        if files is None or not len(files):
            return
        need = int(files.max()) + 1
        if need > len(self._last):
            grown = np.full(max(need, 2 * len(self._last)), NOWHERE, np.int32)
            grown[:len(self._last)] = self._last
            self._last = grown
        self._last[files] = where if epochs is None else epochs

    def closed_many(self, files: np.ndarray, from_tier: np.ndarray, nbytes: np.ndarray) -> None:
        """Descriptors of files closed (a batch of close events: catalog ids,
        opened on a tier or not, bytes read through them): the bytes count
        in the epoch where the file's last open counted."""
        if not len(files):
            return
        with self._lock:
            where = np.full(len(files), NOWHERE, np.int64)
            known = files < len(self._last)
            where[known] = self._last[files[known]]
            for e in np.unique(where).tolist():
                sel = where == e
                rec = self._closed_in(e)
                if rec is None:
                    self.unattributed_read += int(nbytes[sel].sum())
                    continue
                tier = from_tier[sel]
                rec.pfs_read += int(nbytes[sel][~tier].sum())
                rec.tier_read += int(nbytes[sel][tier].sum())

    def _closed_in(self, where: int) -> EpochCount | None:
        if where == NOWHERE:
            return None
        if where == PENDING:
            return self._pending if self._pending_into is None else self._epochs.get(self._pending_into)
        return self._epochs.get(where)

    def _epoch(self, epoch: int) -> EpochCount:
        return self._epochs.get(epoch) or self._new(epoch)

    def _before_order(self) -> EpochCount | None:
        """Where an open of no epoch counts: with the opens before the first
        order, or nowhere (None) once an epoch is known."""
        return None if self._epochs else self._pending

    @staticmethod
    def _count(rec: EpochCount, now: float, n: int, from_tiers: int, pfs_bytes: int, lead: int | None) -> None:
        if not rec.opens:
            rec.first = now
        rec.last = now
        rec.opens += n
        rec.from_tiers += from_tiers
        rec.pfs_bytes += pfs_bytes
        if lead is not None:
            rec.lead_sum += lead * n
            rec.lead_n += n

    def _new(self, epoch: int) -> EpochCount:
        rec = self._epochs[epoch] = EpochCount(epoch)
        if not [e for e in self._epochs if e != epoch] and self._pending.opens:
            # the opens that came before the first order belong to it; when
            # that order is of a later epoch (a mapping learnt in the epoch
            # before: NOTE [learnt mapping]), they belong to the epoch before it
            p = self._pending
            into = rec if epoch == 0 else self._epochs.setdefault(epoch - 1, EpochCount(epoch - 1))
            into.opens, into.from_tiers, into.pfs_bytes = p.opens, p.from_tiers, p.pfs_bytes
            into.pfs_read, into.tier_read = p.pfs_read, p.tier_read
            into.first, into.last = p.first, p.last
            self._pending = EpochCount(-1)
            self._pending_into = into.epoch
        return rec

    def number_from(self, epoch: int, after_pending: bool = False) -> None:
        """The policy's epoch `epoch` (of a new DataLoader) and those after
        it are counted after every epoch counted so far; after_pending: after
        the opens made before the first order too (another DataLoader's,
        which taught the mapping: they get the row before it)."""
        with self._lock:
            if self._epochs:
                row = max(self._epochs) + 1
            else:
                row = 1 if after_pending or self._pending.opens else 0
            self._base = row - epoch

    def records(self) -> list[dict[str, Any]]:
        """One dict per epoch with an open, in epoch order (times are
        time.monotonic() values; the report makes them relative)."""
        with self._lock:
            return [{"epoch": r.epoch, "opens": r.opens, "from_tiers": r.from_tiers, "pfs_bytes": r.pfs_bytes,
                     "pfs_read": r.pfs_read, "tier_read": r.tier_read, "first": r.first, "last": r.last,
                     "lead": round(r.lead_sum / r.lead_n, 1) if r.lead_n else None}
                    for _, r in sorted(self._epochs.items())]


def _at(t: list[float], values: list[int], x: float) -> float:
    """values (cumulative, sampled at times t) at time x, linearly between samples."""
    if not t:
        return 0.0
    if x <= t[0]:
        return values[0] * (x / t[0]) if t[0] > 0 and x > 0 else (0.0 if x <= 0 else float(values[0]))
    if x >= t[-1]:
        return float(values[-1])
    k = bisect.bisect_right(t, x)
    t0, t1, v0, v1 = t[k - 1], t[k], values[k - 1], values[k]
    return v0 + (v1 - v0) * (x - t0) / (t1 - t0) if t1 > t0 else float(v1)


def _mean_within(t: list[float], values: list[float | None], start: float, end: float,
                 last: bool) -> float | None:
    """The mean of the values sampled at times from start to end (end
    itself only for the last epoch: it begins the next one), None ones left
    out; None without any: the epoch's prefetch lead in seconds as it was
    measured at each tick (series.lead_seconds), not its lead in samples
    scaled by the epoch's rate."""
    inside = [v for x, v in zip(t, values) if v is not None and start <= x and (x < end or last and x == end)]
    return round(sum(inside) / len(inside), 2) if inside else None


def epoch_records(per_epoch: list[dict[str, Any]], t0: float | None, series: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's per-epoch records (epochs numbered from 1, times in
    seconds since COMMAND started).  COMMAND's opens are the policy's
    counts, its bytes those read through its descriptors (NOTE [read
    counters]); the daemon's PFS opens and bytes come from the time series,
    split at the epochs' first opens (what it read before the first epoch
    counts in the first, after the last in the last)."""
    if not per_epoch or t0 is None:
        return []
    t = series.get("t", [])
    copy_bytes = series.get("copy_bytes", [])
    lead_s = series.get("prefetch_lead_s") or []
    daemon_opens = [p - (o - f) for p, o, f in zip(series.get("pfs_opens", []), series.get("opens", []),
                                                   series.get("from_tiers", []))]
    starts = [e["first"] - t0 for e in per_epoch]
    bounds = [float("-inf")] + starts[1:] + [float("inf")]
    out = []
    for k, e in enumerate(per_epoch):
        end = starts[k + 1] if k + 1 < len(per_epoch) else e["last"] - t0
        lo, hi = bounds[k], bounds[k + 1]
        d_bytes = round(_at(t, copy_bytes, hi) - _at(t, copy_bytes, lo)) if copy_bytes else 0
        d_opens = round(_at(t, daemon_opens, hi) - _at(t, daemon_opens, lo)) if daemon_opens else 0
        job_pfs = e["opens"] - e["from_tiers"]
        seconds = max(0.0, end - starts[k])
        out.append({
            "epoch": e["epoch"] + 1,
            "start": round(starts[k], 3),
            "seconds": round(seconds, 3),
            "opens": e["opens"],
            "from_tiers": e["from_tiers"],
            "hit_ratio": round(e["from_tiers"] / e["opens"], 4) if e["opens"] else None,
            "pfs_opens": job_pfs + d_opens,
            "pfs_bytes": e["pfs_read"] + d_bytes,
            "pfs_opens_by_job": job_pfs,
            "pfs_bytes_read_by_job": e["pfs_read"],
            "tier_bytes_read_by_job": e["tier_read"],
            "pfs_bytes_of_files_opened_by_job": e["pfs_bytes"],
            "pfs_bytes_read_by_daemon": d_bytes,
            "prefetch_lead": e["lead"],
            "prefetch_lead_seconds": _mean_within(t, lead_s, starts[k], end, k + 1 == len(per_epoch)),
        })
    return out
