"""Where the reader is in the stream, from the open events.

DataLoader workers open files out of order within their prefetch window, a
sample may open its file twice, and events can be lost when the ring is
full.  The tracker matches each open to the nearest unconsumed occurrence of
that file at or after the reader's low-water mark, within a window; it skips
positions that are clearly left behind; and it notices when the opens stop
matching the stream at all (a different seed, a resumed run).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .planner import Planner

HISTORY = 256          # opens looked at to decide divergence
DIVERGED_SHARE = 0.5   # ... of which at least this share did not match


@dataclass
class Progress:
    planner: Planner
    window: int = 1024                        # how far ahead of the furthest match an open may match
    positions: dict[int, deque[int]] = field(default_factory=dict)  # file -> its unconsumed positions
    high: int = 0                             # highest position matched so far
    matched: int = 0
    duplicates: int = 0
    mismatched: int = 0
    skipped: int = 0
    _recent: deque[bool] = field(default_factory=lambda: deque(maxlen=HISTORY))
    _last_open: dict[int, int] = field(default_factory=dict)   # pid -> file it opened last
    _indexed: int = 0                         # stream positions already in `positions`

    def sync(self) -> None:
        """Indexes stream positions the planner gained since the last call."""
        p = self.planner
        for pos in range(max(self._indexed, p.base), p.end):
            self.positions.setdefault(p.file_at(pos), deque()).append(pos)
        self._indexed = p.end

    def in_stream(self, f: int) -> bool:
        return f in self.positions

    def on_open(self, f: int, pid: int = 0) -> int | None:
        """Matches one open of file f by process pid; returns the stream
        position or None.  A process that opens the same file twice in a row
        reads one sample twice (a DataLoader worker handles its samples one
        after the other): the second open is not a new position."""
        self.sync()
        if self._last_open.get(pid) == f:
            self.duplicates += 1
            return None
        self._last_open[pid] = f
        reader = self.planner.reader
        q = self._first_unconsumed(f, reader)
        # within a window ahead of the furthest match (not of the low-water
        # mark: a lost event must not make every later open look foreign)
        if q is not None and q < max(reader, self.high) + self.window:
            self.positions[f].popleft()
            self.planner.consume(q)
            self.high = max(self.high, q)
            self.matched += 1
            self._recent.append(True)
            self._catch_up()
            return q
        self.mismatched += 1
        self._recent.append(False)
        return None

    def _first_unconsumed(self, f: int, reader: int) -> int | None:
        dq = self.positions.get(f)
        if not dq:
            return None
        while dq and dq[0] < reader:  # positions left behind (skipped)
            dq.popleft()
        return dq[0] if dq else None

    def _catch_up(self) -> None:
        """Lost events must not hold the low-water mark back forever."""
        if self.high - self.planner.reader > self.window:
            before = self.planner.reader
            self.planner.skip_to(self.high - self.window)
            self.skipped += self.planner.reader - before

    @property
    def diverged(self) -> bool:
        return (len(self._recent) == HISTORY and
                self._recent.count(False) >= DIVERGED_SHARE * HISTORY)
