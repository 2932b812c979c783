"""The planner as it was before it kept its state in arrays (dicts, lists and
heaps, one position at a time): the reference the array planner and its C core
are tested against, decision for decision (tests/test_planner_equivalence.py,
tests/test_planner_core.py).  Its rules are those of the docstring of
tiering/clairvoyant/planner.py; its code is kept as it was, apart from the
epoch walk and accounting of simulate() (`reads`, `Tally`), which the driver
of tests/test_planner.py shares.
"""
from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tiering.placement.api import BLOCK, allocation

INF = 1 << 62
TRIM_MIN = 1 << 16   # consumed positions kept before the stream's head is trimmed


@dataclass(frozen=True)
class Action:
    kind: str        # "fetch" or "evict"
    file: int        # catalog file id
    tier: int        # tier it goes to (fetch) or leaves (evict)
    position: int    # reader position when the action is taken
    need: int = -1   # fetch: the stream position that needs the file


class Planner:
    def __init__(self, sizes: Sequence[int], capacities: Sequence[int], *,
                 window: int | None = None, alloc: Callable[[int], int] = allocation):
        self.sizes = sizes
        self.capacities = list(capacities)
        self.window = window
        self.alloc = alloc
        # stream positions are absolute (they count from the start of the run);
        # the lists hold positions base.. only: consumed ones are trimmed away
        self.base = 0
        self.stream: list[int] = []
        self.next_pos: list[int] = []         # next position of the same file, INF if unknown
        self._last: dict[int, int] = {}       # file -> its last position in the stream so far
        self.remaining: dict[int, int] = {}   # file -> known uses not yet consumed
        self.uses: dict[int, int] = {}        # file -> its uses in the known stream (frequency)
        self.need: dict[int, int] = {}        # file -> next unconsumed use (INF if none known)
        self.resident: dict[int, int] = {}    # file -> tier
        self.used = [0] * len(self.capacities)
        self._heaps: list[list[tuple[int, int, int]]] = [[] for _ in self.capacities]
        self.cursor = 0                       # next stream position to consider fetching
        self.reader = 0                       # every position below is consumed or skipped
        self._consumed: set[int] = set()      # consumed positions at or above self.reader

    # -- the stream ----------------------------------------------------------
    @property
    def end(self) -> int:
        """The position after the last one known."""
        return self.base + len(self.stream)

    def file_at(self, pos: int) -> int:
        """The file at stream position pos (not yet trimmed: pos >= base)."""
        return self.stream[pos - self.base]

    def extend(self, order: Iterable[int]) -> None:
        """Appends the next part of the stream (usually one epoch)."""
        start = self.end
        for pos, f in enumerate(order, start):
            self.stream.append(f)
            self.next_pos.append(INF)
            prev = self._last.get(f)
            if prev is not None and prev >= self.base:
                self.next_pos[prev - self.base] = pos
            self._last[f] = pos
            self.remaining[f] = self.remaining.get(f, 0) + 1
            self.uses[f] = self.uses.get(f, 0) + 1
            if self.need.get(f, INF) == INF:
                self.need[f] = pos
                if f in self.resident:
                    self._push(f)

    # -- the reader's progress ---------------------------------------------------
    def consume(self, pos: int) -> None:
        """The reader has read stream position pos."""
        if pos < self.reader or pos in self._consumed or pos >= self.end:
            return
        self._consumed.add(pos)
        f = self.file_at(pos)
        self.remaining[f] -= 1
        if self.need.get(f) == pos:
            self.need[f] = self._next_unconsumed(pos)
        if f in self.resident:
            self._push(f)  # its key changed
        while self.reader in self._consumed:
            self._consumed.discard(self.reader)
            self.reader += 1
        self._trim()

    def _trim(self) -> None:
        """Drops the consumed head of the stream once it outweighs the rest,
        so that memory follows the known future, not the whole run."""
        k = self.reader - self.base
        if k >= TRIM_MIN and k >= len(self.stream) - k:
            del self.stream[:k]
            del self.next_pos[:k]
            self.base += k

    def skip_to(self, pos: int) -> None:
        """Treats every position below pos as consumed (lost events, a jump)."""
        for q in range(self.reader, min(pos, self.end)):
            if q not in self._consumed:
                self.consume(q)
        self.reader = max(self.reader, pos)

    def _next_unconsumed(self, pos: int) -> int:
        q = self.next_pos[pos - self.base]
        while q != INF and q in self._consumed:
            q = self.next_pos[q - self.base]
        return q

    # -- placement ---------------------------------------------------------------
    def advance(self) -> list[Action]:
        """Fetches to issue now, in the order they are needed."""
        actions: list[Action] = []
        self.cursor = max(self.cursor, self.reader)
        window_end = INF if self.window is None else self.reader + self.window
        while self.cursor < self.end:
            pos = self.cursor
            f = self.file_at(pos)
            if f not in self.resident and pos not in self._consumed:
                if all(self.alloc(self.sizes[f]) > cap for cap in self.capacities):
                    self.cursor += 1
                    continue  # fits no tier: read from the PFS, no reason to pause
                if pos >= window_end and self._free_tier(f) is None:
                    break  # beyond the window, fetch only into free room
                tier = self._make_room(f, pos, actions)
                if tier is None:
                    break  # every resident file is needed sooner: wait for the reader
                self.resident[f] = tier
                self.used[tier] += self.alloc(self.sizes[f])
                self._push(f)
                actions.append(Action("fetch", f, tier, self.reader, pos))
            self.cursor += 1
        return actions

    def adopt(self, f: int, tier: int) -> None:
        """Records a copy that already exists (placed before the plan began)."""
        if f in self.resident:
            return
        self.resident[f] = tier
        self.used[tier] += self.alloc(self.sizes[f])
        self._push(f)

    def drop(self, f: int) -> None:
        """Forgets a resident file (its copy failed or was invalidated)."""
        tier = self.resident.pop(f, None)
        if tier is not None:
            self.used[tier] -= self.alloc(self.sizes[f])

    def _key(self, f: int) -> tuple[int, int]:
        # farthest next use first; among files with none, the least used first
        n = self.need.get(f, INF)
        return (-n, self.uses.get(f, 0) if n == INF else 0)

    def _push(self, f: int) -> None:
        tier = self.resident[f]
        neg, freq = self._key(f)
        heap = self._heaps[tier]
        heapq.heappush(heap, (neg, freq, f))
        if len(heap) > 4 * (self.used[tier] // BLOCK + 16):
            # stale entries pile up when nothing needs room (data that fits):
            # rebuild from what is resident in this tier
            heap[:] = [(*self._key(g), g) for g, t in self.resident.items() if t == tier]
            heapq.heapify(heap)

    def _top(self, tier: int) -> tuple[int, int, int] | None:
        """The valid entry of the tier's heap with the farthest next use."""
        h = self._heaps[tier]
        while h:
            neg, freq, f = h[0]
            if self.resident.get(f) == tier and self._key(f) == (neg, freq):
                return h[0]
            heapq.heappop(h)
        return None

    def _free_tier(self, f: int) -> int | None:
        size = self.alloc(self.sizes[f])
        for k, cap in enumerate(self.capacities):
            if cap - self.used[k] >= size:
                return k
        return None

    def _make_room(self, f: int, need: int, actions: list[Action]) -> int | None:
        size = self.alloc(self.sizes[f])
        candidates = [k for k, cap in enumerate(self.capacities) if size <= cap]
        victims: list[tuple[int, int]] = []
        while True:
            for k in candidates:
                if self.capacities[k] - self.used[k] >= size:
                    for v, t in victims:
                        if t == k:
                            actions.append(Action("evict", v, t, self.reader))
                        else:  # it made no room where f goes: it stays
                            self.resident[v] = t
                            self.used[t] += self.alloc(self.sizes[v])
                            self._push(v)
                    return k
            # evict the file needed farthest in the future, across tiers, if it
            # is needed after `need`; otherwise undo and wait for the reader.
            # (A prefetched file not read yet is never the victim.  Belady
            # would sometimes rather wait for the reader to read it and evict
            # it then; that saves PFS bytes only when the window is a large
            # share of the tier, and costs the prefetch its lead.)
            tops = [t for t in (self._top(k) for k in candidates) if t is not None]
            best = min(tops) if tops else None
            if best is None or -best[0] <= need:
                for v, t in victims:
                    self.resident[v] = t
                    self.used[t] += self.alloc(self.sizes[v])
                    self._push(v)
                return None
            victim = best[2]
            tier = self.resident[victim]
            heapq.heappop(self._heaps[tier])
            self.drop(victim)
            victims.append((victim, tier))


# -- offline simulation -----------------------------------------------------------

@dataclass
class EpochReport:
    accesses: int = 0
    hits: list[int] = field(default_factory=list)   # per tier
    pfs_reads: int = 0          # accesses served from the PFS
    pfs_bytes: int = 0          # bytes read from the PFS: fetches + misses
    fetches: int = 0
    evictions: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"accesses": self.accesses, "hits_by_tier": self.hits, "pfs_reads": self.pfs_reads,
                "pfs_bytes": self.pfs_bytes, "fetches": self.fetches, "evictions": self.evictions}


def reads(p: Any, epochs: Sequence[Sequence[int]], known_ahead: int) -> Iterator[tuple[int, int]]:
    """(epoch, stream position) of each read of simulate(), in order; before
    the reads of an epoch, the planner p is given the epochs simulate() knows
    then (known_ahead beyond it)."""
    known, start = 0, 0
    for e, order in enumerate(epochs):
        while known < min(len(epochs), e + 1 + known_ahead):
            p.extend(epochs[known])
            known += 1
        for pos in range(start, start + len(order)):
            yield e, pos
        start += len(order)


class Tally:
    """simulate()'s accounting, one report per epoch (of the class given):
    the actions in the epoch of the reader's position when they are taken,
    the reads in their own."""

    def __init__(self, epochs: Sequence[Sequence[int]], sizes: Sequence[int], tiers: int,
                 report: Callable[..., Any] = EpochReport):
        self.sizes = sizes
        self.reports = [report(hits=[0] * tiers) for _ in epochs]
        self._starts: list[int] = []
        total = 0
        for ep in epochs:
            self._starts.append(total)
            total += len(ep)

    def action(self, a: Any) -> None:
        r = self.reports[bisect.bisect_right(self._starts, a.position) - 1]
        if a.kind == "fetch":
            r.fetches += 1
            r.pfs_bytes += self.sizes[a.file]
        else:
            r.evictions += 1

    def read(self, epoch: int, f: int, tier: int | None) -> None:
        """File f read in this epoch, from this tier (None: the PFS)."""
        r = self.reports[epoch]
        r.accesses += 1
        if tier is None:
            r.pfs_reads += 1
            r.pfs_bytes += self.sizes[f]
        else:
            r.hits[tier] += 1


def simulate(epochs: Sequence[Sequence[int]], sizes: Sequence[int], capacities: Sequence[int], *,
             window: int | None = 64, known_ahead: int = 1) -> tuple[list[EpochReport], list[Action]]:
    """Runs the planner over the epochs with a reader that never waits for a
    fetch (unlimited PFS bandwidth).  known_ahead: how many epochs beyond the
    current one are known (1: the next epoch's order is known while the
    current one runs; 0: each epoch's order arrives when it starts)."""
    p = Planner(sizes, capacities, window=window)
    tally = Tally(epochs, sizes, len(capacities))
    schedule: list[Action] = []
    for e, pos in reads(p, epochs, known_ahead):
        for a in p.advance():
            schedule.append(a)
            tally.action(a)
        f = p.file_at(pos)
        tally.read(e, f, p.resident.get(f))
        p.consume(pos)
    return tally.reports, schedule
