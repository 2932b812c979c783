"""Placement policies: which file goes to which tier, and when.

- off:         the shim is loaded, nothing is placed (the shim's own cost).
- first-touch: the first open of a file queues a copy into the fastest tier
               with room; nothing is evicted (the Monarch policy).
- stage:       every file that fits is copied at start, in catalog order
               (what users do by hand with cp or sbcast).
- lru:         first-touch placement that evicts the least recently opened
               copies when the tier is full (what a page cache does).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .daemon import Daemon


class Policy:
    name = "base"

    def __init__(self, daemon: "Daemon"):
        self.d = daemon

    def start(self) -> None:
        """Called once the tier pools run, before COMMAND starts."""

    def on_open(self, i: int, from_tier: bool) -> None:
        """File i was opened by the job, from a tier or from the PFS."""

    def on_placed(self, i: int, tier: int) -> None:
        """A copy of file i was published on tier."""


class Off(Policy):
    name = "off"


class FirstTouch(Policy):
    name = "first-touch"

    def on_open(self, i: int, from_tier: bool) -> None:
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

    def on_open(self, i: int, from_tier: bool) -> None:
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


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Off, FirstTouch, Stage, Lru)}
