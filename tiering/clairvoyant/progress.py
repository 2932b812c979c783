"""Where the reader is in the stream, from the open events, matched in batches
(NOTE [event batches] in docs/design.md).

DataLoader workers open files out of order within their prefetch window, a
sample may open its file twice, and events are lost when the ring is full.
A worker may also lag behind the others by more than the window: its opens
of positions already passed (read or skipped) are late, neither a match nor
evidence of another order.
Each open is matched to the first unconsumed occurrence of its file at or
after the reader's low-water mark (the planner's `need` of the file), if that
lies within a window ahead of the furthest match; positions clearly left
behind are skipped.  A process opening the file it opened last is reading
the same sample again.

Matches run ahead of the furthest match by at most the window, and a batch's
matches by at most DENSITY positions per open beyond it: unrelated opens
(another order, a worker far behind) must not step from one chance match
to the next through the stream.

Lost events: a reader that goes on while a burst of its events is lost
reappears further on in the stream, beyond the window.  Those opens match
nothing, but they agree with each other: when AGREE of the last RESYNC
unmatched opens fall within a window of one place ahead, they are matched
there, the furthest match moves there (the positions before it are skipped
as the reader goes on) and the divergence history starts anew.  Opens
that agree on no place (another seed, a resumed run from a stream not
announced) make up most of the last HISTORY opens that were not late: the
reads have diverged.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .planner import INF, Planner

HISTORY = 256          # opens looked at to decide divergence
DIVERGED_SHARE = 0.5   # ... of which at least this share did not match
RESYNC = 16            # recent unmatched opens that must agree on one place further on
AGREE = 12             # ... of which at least this many within the window of their median
STRAYS = 8192          # unmatched opens remembered, to be matched after a resync
DENSITY = 4            # positions a batch's matches may advance per matched open, beyond the window


def _running_max(x: np.ndarray, start: int) -> np.ndarray:
    """max(start, x[0..i-1]) for each i."""
    out = np.empty(len(x), np.int64)
    out[0] = start
    if len(x) > 1:
        np.maximum.accumulate(np.maximum(x[:-1], start), out=out[1:])
    return out


@dataclass
class Progress:
    planner: Planner
    window: int = 1024                        # how far ahead of the furthest match an open may match
    late_span: int | None = None              # how far behind the reader an open is late, not foreign (4 windows)
    high: int = 0                             # highest position matched so far
    matched: int = 0
    duplicates: int = 0
    mismatched: int = 0
    skipped: int = 0
    late: int = 0                             # opens of a position already passed (a worker lagging behind)
    resyncs: int = 0
    _recent: np.ndarray = field(default_factory=lambda: np.zeros(HISTORY, np.int8))  # 1 matched, 0 not, -1 late
    _seen: int = 0                            # opens in _recent (at most HISTORY)
    _next: int = 0                            # where the next outcome goes in _recent
    _last_open: dict[int, int] = field(default_factory=dict)   # pid -> file it opened last
    _stray: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # need of recent unmatched opens

    def in_stream(self, files: np.ndarray) -> np.ndarray:
        """Which files the known stream reads at all."""
        return self.planner.uses_of(files) > 0

    def on_open(self, f: int, pid: int = 0) -> int | None:
        """Matches one open of file f by process pid; returns the stream
        position or None."""
        q = int(self.on_opens(np.array([f], np.int64), np.array([pid], np.int64))[0])
        return None if q < 0 else q

    def on_opens(self, files: np.ndarray, pids: np.ndarray) -> np.ndarray:
        """Matches a batch of opens, in the order they happened; returns the
        stream position of each (-1: none: a repeated open or no match)."""
        files = np.asarray(files, np.int64)
        out = np.full(len(files), -1, np.int64)
        if not len(files):
            return out
        fresh = np.flatnonzero(~self._repeats(files, np.asarray(pids, np.int64)))
        self.duplicates += len(files) - len(fresh)
        # opens of files read or skipped a little behind the reader are matched
        # after the others: a worker lagging behind opens positions already
        # passed, and their files' next uses must not lead the matching on
        p = self.planner
        span = 4 * self.window if self.late_span is None else self.late_span
        done = p.done_of(files[fresh])
        recent = (done >= 0) & (done >= p.reader - span)
        first = self._rounds(files, fresh[~recent], out)
        then = self._rounds(files, fresh[recent], out)
        self._catch_up()   # after the whole batch: its later rounds may lie behind its furthest match
        self.late += int((~then).sum())
        self.mismatched -= int((~then).sum())
        strays = p.need_of(files[fresh[~recent][~first]])
        # late opens are no evidence either way
        self._remember(np.r_[first.astype(np.int8), np.where(then, 1, -1).astype(np.int8)],
                       strays[strays < INF])
        return out

    def _rounds(self, files: np.ndarray, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Matches the opens idx (in order) into out; a file opened twice
        among them matches its next use in a second round.  Returns which matched."""
        by_file = np.argsort(files[idx], kind="stable")
        sf = files[idx][by_file]
        rank = np.arange(len(sf)) - np.maximum.accumulate(np.where(np.r_[True, sf[1:] != sf[:-1]],
                                                                   np.arange(len(sf)), 0))
        occurrence = np.empty(len(idx), np.int64)
        occurrence[by_file] = rank
        matched = np.zeros(len(idx), bool)
        for k in range(int(occurrence.max()) + 1 if len(idx) else 0):
            these = idx[occurrence == k]
            got = self._match(self.planner.need_of(files[these]))
            out[these] = got
            matched[occurrence == k] = got >= 0
        return matched

    def _repeats(self, files: np.ndarray, pids: np.ndarray) -> np.ndarray:
        """Opens of the file the same process opened just before."""
        by_pid = np.argsort(pids, kind="stable")
        sp, sf = pids[by_pid], files[by_pid]
        starts = np.r_[True, sp[1:] != sp[:-1]]
        prev = np.r_[-1, sf[:-1]]
        for i in np.flatnonzero(starts).tolist():
            prev[i] = self._last_open.get(int(sp[i]), -1)
        ends = np.r_[sp[1:] != sp[:-1], True]
        for pid, f in zip(sp[ends].tolist(), sf[ends].tolist()):
            self._last_open[pid] = f
        repeat = np.empty(len(files), bool)
        repeat[by_pid] = sf == prev
        return repeat

    def _accept(self, q: np.ndarray, reader: int, high: int) -> np.ndarray:
        """Which positions, offered in order, lie within the window ahead of
        the furthest match before them (the same as one by one)."""
        ok = q < INF
        start = max(reader, high) + self.window
        acc = ok & (q < start)
        for _ in range(32):   # each round accepts what the previous round's matches bring in reach
            furthest = _running_max(np.where(acc, q, -1), high)
            more = ok & (q < np.maximum(reader, furthest) + self.window)
            if (more == acc).all():
                break
            acc = more
        # a reader moves about one position per open: matches that run further
        # ahead than DENSITY positions per match are chance hits of unrelated
        # opens stepping from one to the next (lost events are resync's job)
        return acc & (q < start + DENSITY * int(acc.sum()))

    def _match(self, q: np.ndarray) -> np.ndarray:
        p = self.planner
        acc = self._accept(q, p.reader, self.high)
        got = np.where(acc, q, -1)
        if acc.any():
            positions = q[acc]
            p.consume_many(positions)
            self.high = max(self.high, int(positions.max()))
            self.matched += len(positions)
        self.mismatched += int((~acc).sum())
        return got

    def _catch_up(self) -> None:
        """Lost events must not hold the low-water mark back forever."""
        p = self.planner
        if self.high - p.reader > self.window:
            self.skipped += p.skip_to(self.high - self.window)

    def _remember(self, outcome: np.ndarray, strays: np.ndarray) -> None:
        """outcome: 1 matched, 0 not, -1 late, per open; strays: the next
        uses of the opens that matched nothing."""
        self._stray = np.r_[self._stray, strays][-STRAYS:]
        if not self._resync():
            self._record(outcome)

    def _record(self, outcome: np.ndarray) -> None:
        """outcome: 1 matched, 0 not, -1 late, per open."""
        outcome = outcome[-HISTORY:]
        n = len(outcome)
        idx = (self._next + np.arange(n)) % HISTORY
        self._recent[idx] = outcome
        self._next = (self._next + n) % HISTORY
        self._seen = min(HISTORY, self._seen + n)

    def _resync(self) -> bool:
        """After lost events: when recent unmatched opens agree on a place
        ahead, the reader is there.  Returns True when it moved."""
        p = self.planner
        self._stray = self._stray[self._stray > max(p.reader, self.high)]   # still ahead
        last = self._stray[-RESYNC:]
        if len(last) < RESYNC:
            return False
        mid = int(np.median(last))
        near = last[np.abs(last - mid) <= self.window]
        if len(near) < AGREE:
            return False
        # the unmatched opens around there were the reader's: the run of them
        # without a gap wider than the window is matched now; the positions
        # before it are skipped as the reader moves on (_catch_up)
        ahead = np.unique(self._stray)
        run = np.r_[0, np.cumsum(np.diff(ahead) > self.window)]
        mine = ahead[run == run[min(int(np.searchsorted(ahead, mid)), len(ahead) - 1)]]
        p.consume_many(mine)
        self.high = max(self.high, int(mine.max()))
        self.matched += len(mine)
        self.mismatched -= len(mine)
        self._catch_up()
        self._stray = np.zeros(0, np.int64)
        self._seen = 0       # the divergence history starts anew
        self.resyncs += 1
        return True

    @property
    def diverged(self) -> bool:
        """Most of the last HISTORY opens that were not late matched nothing."""
        if self._seen < HISTORY:
            return False
        missed = int((self._recent == 0).sum())
        judged = missed + int((self._recent == 1).sum())
        return missed >= DIVERGED_SHARE * max(judged, HISTORY // 4)
