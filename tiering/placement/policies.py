"""Placement policies that need no knowledge of the order:

- off:         the shim is loaded, nothing is placed (the shim's own cost).
- first-touch: the first open of a file queues a copy into the fastest tier
               with room; nothing is evicted (the Monarch policy).
- stage:       every file that fits is copied from the start, in catalog
               order (what users do by hand with cp or sbcast).
- lru:         first-touch placement that evicts the least recently opened
               copies when a tier is full (what a page cache does).

The clairvoyant policy lives in tiering/clairvoyant/policy.py.  Every hook
runs on the daemon's event thread (placement/api.py).
"""
from __future__ import annotations

from collections import OrderedDict

from .api import Placement, Policy, allocation

STAGE_IN_FLIGHT = 4096  # stage: copies queued at a time (bounded memory, whatever the file count; more than
                        # the workers copy between two turns of the event thread: NOTE [batch copy])


class Off(Policy):
    name = "off"


class FirstTouch(Policy):
    name = "first-touch"

    def on_open(self, i: int, from_tier: bool, pid: int = 0) -> None:
        p = self.placement
        if from_tier or not p.placeable(i):
            return
        tier = p.fastest_with_room(i)
        if tier is not None:
            p.place(i, tier)


class Stage(Policy):
    """Walks the catalog in order, keeping a bounded number of copies queued."""

    name = "stage"

    def __init__(self, placement: Placement):
        super().__init__(placement)
        self.next = 0

    def poll(self) -> None:
        p = self.placement
        n = len(p.sizes)
        while self.next < n and p.copies_in_flight() < STAGE_IN_FLIGHT and not p.stopping:
            tier = p.fastest_with_room(self.next)
            if tier is not None:
                p.place(self.next, tier)
            self.next += 1


class Lru(Policy):
    name = "lru"

    def __init__(self, placement: Placement):
        super().__init__(placement)
        # per tier: placed files, least recently opened first
        self.recency: list[OrderedDict[int, None]] = [OrderedDict() for _ in placement.capacities]

    def _touch(self, i: int, tier: int) -> None:
        lru = self.recency[tier]
        lru.pop(i, None)
        lru[i] = None

    def on_open(self, i: int, from_tier: bool, pid: int = 0) -> None:
        p = self.placement
        tier = p.where(i)
        if tier >= 0:
            self._touch(i, tier)  # also when its on_placed is still on the way
            return
        if not p.placeable(i):
            return  # a copy in flight, or a file written during the job: nothing to make room for
        need = allocation(p.sizes[i])
        for k, cap in enumerate(p.capacities):
            if need <= cap and self._make_room(k, need) and p.place(i, k):
                return

    def _make_room(self, k: int, need: int) -> bool:
        """Evicts least recently opened copies of tier k until need fits."""
        p = self.placement
        lru = self.recency[k]
        while p.free(k) < need and lru:
            victim, _ = lru.popitem(last=False)
            if p.where(victim) == k:
                p.evict(victim)
        return p.free(k) >= need

    def on_placed(self, i: int, tier: int) -> None:
        if self.placement.where(i) == tier:
            self._touch(i, tier)


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Off, FirstTouch, Stage, Lru)}
