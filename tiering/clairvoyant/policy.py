"""The clairvoyant policy: follows the planner (planner.py) over the stream
the job will read, as the feeds (feeds.py) make it known, and tracks the
reader through the open events (progress.py).  First-touch until the stream
is known, and again if the reads stop following it."""
from __future__ import annotations

import bisect
import logging
from typing import Any

from ..observe.epochs import EpochLog
from ..placement.api import Placement, Policy
from ..placement.policies import FirstTouch
from .feeds import EpochOrder, HookFeed, ListFeed
from .planner import Planner
from .progress import Progress

log = logging.getLogger("tiering")


class Clairvoyant(Policy):
    """Places files ahead of the reader, in the order it will read them."""

    name = "clairvoyant"
    margin = 0.98        # of each tier's capacity, for allocation rounding
    ahead = 2            # epochs of a ListFeed kept known beyond the reader's

    def __init__(self, placement: Placement, feed: ListFeed | HookFeed | None = None, window: int = 64):
        super().__init__(placement)
        self.feed = feed
        self.window = window
        self.first_touch = FirstTouch(placement)
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
        self.epoch_log = EpochLog()         # opens per epoch, for the report

    # -- the stream ----------------------------------------------------------
    def start(self) -> None:
        if isinstance(self.feed, ListFeed):
            self._extend_from_list()
            if self.planner is not None:
                self._pump()  # known from the start: begin now

    def _fresh(self) -> None:
        """A new plan over what is placed now."""
        p = self.placement
        caps = [int(c * self.margin) for c in p.capacities]
        self.planner = Planner(p.sizes, caps, window=self.window)
        for i, tier in p.placements():
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
        q = self._follow(i, from_tier, pid)
        # observation: the epoch of the matched position (else the reader's)
        self.epoch_log.opened(self._epoch_at(q), from_tier, self.placement.sizes[i], self.lead())

    def _follow(self, i: int, from_tier: bool, pid: int) -> int | None:
        """The open's stream position, when it matched one."""
        if not self.following:
            self.first_touch.on_open(i, from_tier)
            return None
        assert self.progress is not None
        self.progress.sync()
        if not self.progress.in_stream(i):
            return None  # not part of the planned data set: left on the PFS
        q = self.progress.on_open(i, pid)
        if q is not None:
            if isinstance(self.feed, ListFeed):
                self._extend_from_list()
            self._pump()
        elif self.progress.diverged:
            self._diverge()
        return q

    # -- observation ---------------------------------------------------------------
    def _epoch_at(self, q: int | None) -> int | None:
        """The epoch number of stream position q (None: the reader's), None
        when no order is followed."""
        if not self.following or not self.epochs:
            return None
        assert self.planner is not None
        pos = self.planner.reader if q is None else q
        return self.epochs[max(0, bisect.bisect_right(self.epoch_starts, pos) - 1)]

    def lead(self) -> int | None:
        """Stream positions ahead of the reader whose copies have landed
        (issued less in flight), None when no order is followed."""
        if not self.following:
            return None
        assert self.planner is not None
        return max(0, self.planner.cursor - self.planner.reader - self.placement.copies_in_flight())

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
                self.placement.evict(a.file)  # a copy still in flight is dropped when it lands
            elif self.placement.place(a.file, a.tier):
                self.fetches += 1
            else:
                self.refused += 1
                self.planner.drop(a.file)

    def on_placed(self, i: int, tier: int) -> None:
        if self.following and self.planner is not None and self.planner.resident.get(i) != tier:
            self.placement.evict(i)  # the plan changed while it was copied

    def on_failed(self, i: int) -> None:
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
            "prefetch_lead": self.lead(),
            "per_epoch": self.epoch_log.records(),
        }
