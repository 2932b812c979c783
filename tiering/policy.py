"""Placement policies: which file goes to which tier, and when.

- off:         the shim is loaded, nothing is placed (the shim's own cost).
- first-touch: the first open of a file queues a copy into the fastest tier
               with room; nothing is evicted (the Monarch policy).
- stage:       every file that fits is copied at start, in catalog order
               (what users do by hand with cp or sbcast).
- lru:         first-touch placement that evicts the least recently opened
               copies when the tier is full (what a page cache does).
- clairvoyant: follows the planner (tiering/planner.py) over the stream the
               job will read; first-touch until the stream is known, and
               again if the reads stop following it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
import logging
from typing import TYPE_CHECKING, Any

from .feed import EpochOrder, HookFeed, ListFeed
from .planner import Planner
from .progress import Progress

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger("tiering")


class Policy:
    name = "base"

    def __init__(self, daemon: "Daemon"):
        self.d = daemon

    def start(self) -> None:
        """Called once the tier pools run, before COMMAND starts."""

    def on_open(self, i: int, from_tier: bool, pid: int = 0) -> None:
        """File i was opened by process pid of the job, from a tier or from the PFS."""

    def on_placed(self, i: int, tier: int) -> None:
        """A copy of file i was published on tier."""

    def on_failed(self, i: int) -> None:
        """A queued copy of file i was not published (failure, change, stop)."""

    def poll(self) -> None:
        """Called by the event loop before each batch of events."""

    def report(self) -> dict[str, Any]:
        """Policy-specific statistics for the summary."""
        return {}


class Off(Policy):
    name = "off"


class FirstTouch(Policy):
    name = "first-touch"

    def on_open(self, i: int, from_tier: bool, pid: int = 0) -> None:
        if from_tier:
            return
        tier = self.d.fastest_with_room(i)
        if tier is not None:
            self.d.place(i, tier)


class Stage(Policy):
    name = "stage"

    def start(self) -> None:
        # queueing a million copies takes a moment: do not hold up COMMAND
        threading.Thread(target=self._queue_all, name="tiering-stage", daemon=True).start()

    def _queue_all(self) -> None:
        for i in range(len(self.d.files)):
            if self.d.stopping:
                return
            tier = self.d.fastest_with_room(i)
            if tier is not None:
                self.d.place(i, tier)


class Lru(Policy):
    name = "lru"

    def __init__(self, daemon: "Daemon"):
        super().__init__(daemon)
        # per tier: placed files, least recently opened first
        self.recency: list[OrderedDict[int, None]] = [OrderedDict() for _ in daemon.tiers]

    def on_open(self, i: int, from_tier: bool, pid: int = 0) -> None:
        with self.d.lock:
            tier = self.d.where[i]
            if tier >= 0:
                self.recency[tier].move_to_end(i)
                return
            need = self.d.files[i].size
            for k, t in enumerate(self.d.tiers):
                if need > t.capacity:
                    continue
                self._make_room(k, need)
                if self.d.place(i, k):
                    return

    def _make_room(self, k: int, size: int) -> None:
        from .daemon import allocation
        t = self.d.tiers[k]
        lru = self.recency[k]
        while t.free() < allocation(size) and lru:
            victim, _ = lru.popitem(last=False)
            self.d.evict(victim)

    def on_placed(self, i: int, tier: int) -> None:
        with self.d.lock:
            if self.d.where[i] == tier:
                self.recency[tier][i] = None
                self.recency[tier].move_to_end(i)


class Clairvoyant(Policy):
    """Places files ahead of the reader, in the order it will read them."""

    name = "clairvoyant"
    margin = 0.98        # of each tier's capacity, for allocation rounding
    ahead = 2            # epochs of a ListFeed kept known beyond the reader's

    def __init__(self, daemon: "Daemon", feed: ListFeed | HookFeed | None = None, window: int = 64):
        super().__init__(daemon)
        self.feed = feed
        self.window = window
        self.first_touch = FirstTouch(daemon)
        self.planner: Planner | None = None
        self.progress: Progress | None = None
        self.epoch_starts: list[int] = []   # stream position where each known epoch begins
        self.epochs: list[int] = []         # their numbers
        self.predicted: dict[int, list[int]] = {}
        self.diverged = False
        self.resets = 0
        self.fetches = 0
        self.evictions = 0
        self.refused = 0
        self._loader: int | None = None
        self._poll_seen = 0

    # -- the stream ----------------------------------------------------------
    def start(self) -> None:
        if isinstance(self.feed, ListFeed):
            with self.d.lock:
                self._extend_from_list()
                if self.planner is not None:
                    self._pump()  # known before COMMAND starts: begin now

    def _fresh(self) -> None:
        """A new plan over what is placed now."""
        caps = [int(t.capacity * self.margin) for t in self.d.tiers]
        self.planner = Planner([f.size for f in self.d.files], caps, window=self.window)
        for i, tier in enumerate(self.d.where):
            if tier >= 0:
                self.planner.adopt(i, tier)
        for i, tier in self.d.pending.items():
            self.planner.adopt(i, tier)
        self.progress = Progress(self.planner, window=max(256, 4 * self.window))
        self.epoch_starts, self.epochs = [], []

    def _add(self, epoch: int, order: list[int]) -> None:
        if self.planner is None:
            self._fresh()
        assert self.planner is not None and self.progress is not None
        if not self.epochs:
            # opens match within this many positions of the reader: more than
            # DataLoader workers read out of order, well under an epoch
            self.progress.window = max(32, min(4 * self.window, len(order) // 4))
        self.epoch_starts.append(self.planner.end)
        self.epochs.append(epoch)
        self.planner.extend(order)

    def _reset(self, epoch: int, orders: list[list[int]]) -> None:
        self.resets += 1
        self.planner = None
        for k, order in enumerate(orders):
            self._add(epoch + k, order)

    def _extend_from_list(self) -> None:
        assert isinstance(self.feed, ListFeed)
        while len(self.epochs) < self._reader_epoch() + 1 + self.ahead:
            order = self.feed.next_epoch()
            if order is None:
                return
            self._add(self.feed.number - 1, order)

    def _reader_epoch(self) -> int:
        """Index (into self.epochs) of the epoch the reader is in."""
        if self.planner is None:
            return -1
        k = 0
        while k + 1 < len(self.epoch_starts) and self.epoch_starts[k + 1] <= self.planner.reader:
            k += 1
        return k

    def poll(self) -> None:
        if not isinstance(self.feed, HookFeed):
            return
        with self.d.lock:
            for key, eo in self.feed.poll():
                self._take(key, eo)

    def _take(self, key: int, eo: EpochOrder) -> None:
        feed = self.feed
        assert isinstance(feed, HookFeed)
        if key != feed.main or self.diverged:
            return
        if key != self._loader:           # a new main loader (e.g. after a validation pass)
            self._loader = key
            self.predicted.clear()
            self._reset(eo.epoch, [eo.order] + ([eo.next] if eo.next else []))
        elif eo.epoch in self.predicted:
            if self.predicted.pop(eo.epoch) != eo.order:
                log.info("epoch %d is not in the predicted order: planning anew", eo.epoch)
                self._reset(eo.epoch, [eo.order] + ([eo.next] if eo.next else []))
            elif eo.next is not None and eo.epoch + 1 not in self.epochs:
                self._add(eo.epoch + 1, eo.next)
        elif not self.epochs or eo.epoch != self.epochs[-1] + 1:
            self._reset(eo.epoch, [eo.order] + ([eo.next] if eo.next else []))
        else:
            self._add(eo.epoch, eo.order)
            if eo.next is not None:
                self._add(eo.epoch + 1, eo.next)
        if eo.next is not None:
            self.predicted[eo.epoch + 1] = eo.next
        self._pump()

    # -- events ------------------------------------------------------------------
    @property
    def following(self) -> bool:
        return self.planner is not None and not self.diverged

    def on_open(self, i: int, from_tier: bool, pid: int = 0) -> None:
        with self.d.lock:
            if not self.following:
                self.first_touch.on_open(i, from_tier)
                return
            assert self.progress is not None
            self.progress.sync()
            if not self.progress.in_stream(i):
                return  # not part of the planned data set: left on the PFS
            if self.progress.on_open(i, pid) is not None:
                if isinstance(self.feed, ListFeed):
                    self._extend_from_list()
                self._pump()
            elif self.progress.diverged:
                self._diverge()

    def _diverge(self) -> None:
        assert self.progress is not None
        self.diverged = True
        log.warning("the reads no longer follow the announced order (%d of the last opens did not "
                    "match: a different seed, a resumed run?); placing by first touch from now on",
                    self.progress.mismatched)

    def _pump(self) -> None:
        assert self.planner is not None
        for a in self.planner.advance():
            if a.kind == "evict":
                self.evictions += 1
                self.d.evict(a.file)  # a copy still in flight is dropped when it lands
            elif self.d.place(a.file, a.tier):
                self.fetches += 1
            else:
                self.refused += 1
                self.planner.drop(a.file)

    def on_placed(self, i: int, tier: int) -> None:
        with self.d.lock:
            if self.following and self.planner is not None and self.planner.resident.get(i) != tier:
                self.d.evict(i)  # the plan changed while it was copied

    def on_failed(self, i: int) -> None:
        with self.d.lock:
            if self.planner is not None:
                self.planner.drop(i)

    def report(self) -> dict[str, Any]:
        p, pr = self.planner, self.progress
        return {
            "following": self.following,
            "diverged": self.diverged,
            "epochs_known": len(self.epochs),
            "stream_length": p.end if p else 0,
            "reader_position": p.reader if p else 0,
            "matched_opens": pr.matched if pr else 0,
            "unmatched_opens": pr.mismatched if pr else 0,
            "duplicate_opens": pr.duplicates if pr else 0,
            "skipped_positions": pr.skipped if pr else 0,
            "fetches": self.fetches,
            "evictions": self.evictions,
            "refused": self.refused,
            "replans": self.resets,
            "hook_errors": list(self.feed.errors) if isinstance(self.feed, HookFeed) else [],
        }


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Off, FirstTouch, Stage, Lru, Clairvoyant)}
