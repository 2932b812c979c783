"""The clairvoyant policy stages while no order is followed (NOTE [staging
while waiting]): where the data set fits, the catalog in order, a bounded
number of copies at a time, but for what the reader opened; nothing where
it does not fit; a plan made later adopts what was staged and copies
nothing twice."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from helpers import PlaceEach
from tiering.clairvoyant.feeds import ListFeed
from tiering.clairvoyant.policy import STAGE_CHUNK, Clairvoyant
from tiering.placement.api import NOT_PLACED, allocation
from tiering.placement.policies import STAGE_IN_FLIGHT

SIZE = 4096


class Tiers(PlaceEach):
    """Tiers with capacities; copies land when the test says so."""

    def __init__(self, files: int, capacities: list[int]):
        self.sizes = [SIZE] * files
        self.capacities = capacities
        self.used = [0] * len(capacities)
        self.stopping = False
        self.pending: list[tuple[int, int]] = []
        self.tier_of: dict[int, int] = {}
        self.copies: list[int] = []          # every copy ever queued, in order

    def where(self, i: int) -> int:
        return self.tier_of.get(i, NOT_PLACED)

    def placeable(self, i: int) -> bool:
        return i not in self.tier_of and all(f != i for f, _ in self.pending)

    def place(self, i: int, tier: int) -> bool:
        if not self.placeable(i) or self.capacities[tier] - self.used[tier] < allocation(SIZE):
            return False
        self.used[tier] += allocation(SIZE)
        self.pending.append((i, tier))
        self.copies.append(i)
        return True

    def fastest_with_room(self, i: int) -> int | None:
        free = [k for k, c in enumerate(self.capacities) if c - self.used[k] >= allocation(SIZE)]
        return free[0] if free else None

    def evict(self, i: int) -> bool:
        return False

    def placements(self) -> Iterator[tuple[int, int]]:
        return iter(list(self.tier_of.items()) + self.pending)

    def copies_in_flight(self) -> int:
        return len(self.pending)

    def land(self, policy: Clairvoyant, n: int | None = None) -> None:
        done, self.pending = self.pending[:n], self.pending[len(self.pending) if n is None else n:]
        for i, t in done:
            self.tier_of[i] = t
        if done:
            policy.on_landed(np.array([i for i, _ in done], np.int64), done[0][1], np.ones(len(done), bool))


@pytest.mark.slow
def test_waiting_for_the_order_the_catalog_is_staged_in_order_but_what_the_reader_opened():
    n = 3 * STAGE_IN_FLIGHT + 100
    fits = Tiers(n, [allocation(SIZE) * n // 2, allocation(SIZE) * n])     # fits in RAM and SSD together
    policy = Clairvoyant(fits, None)  # type: ignore[arg-type]
    opened = np.array([5, 6, STAGE_IN_FLIGHT + 7], np.int64)
    policy.on_opens(opened, np.zeros(3, bool), np.zeros(3, np.int64))
    turns = 0
    assert fits.copies == opened.tolist()       # first touch: what the reader opened
    while len(fits.tier_of) < n:
        policy.poll()
        assert fits.copies_in_flight() <= STAGE_IN_FLIGHT
        fits.land(policy, STAGE_CHUNK)
        turns += 1
        assert turns < 100
    want = [i for i in range(n) if i not in opened.tolist()]
    assert fits.copies == opened.tolist() + want                 # then the rest in catalog order, each once
    assert policy.staged == len(want) and policy.report()["staged"] == len(want)
    ram = sorted(i for i, t in fits.tier_of.items() if t == 0)
    assert len(ram) == n // 2 and ram == sorted(opened.tolist() + want[:len(ram) - len(opened)])   # RAM first


def test_where_the_data_set_does_not_fit_nothing_is_staged():
    n = 2000
    small = Tiers(n, [allocation(SIZE) * n // 2])
    policy = Clairvoyant(small, None)  # type: ignore[arg-type]
    for _ in range(5):
        policy.poll()
        small.land(policy)
    assert small.copies == [] and policy.staged == 0


def test_a_plan_that_arrives_adopts_the_staged_copies_and_copies_nothing_twice():
    n = 3000
    order = np.random.default_rng(3).permutation(n)
    tiers = Tiers(n, [allocation(SIZE) * 2 * n])
    policy = Clairvoyant(tiers, ListFeed(iter([order, order[::-1].copy()])))  # type: ignore[arg-type]
    policy.poll()                         # no order taken yet (start() takes it): staging
    tiers.land(policy, 1000)              # some landed, the rest in flight
    staged = len(tiers.copies)
    assert staged >= 1000
    policy.start()
    assert policy.following
    while tiers.pending:
        tiers.land(policy, 500)
        policy.poll()
    assert sorted(tiers.copies) == list(range(n))                # every file once
    assert policy.fetches == n - staged and policy.staged == staged
    policy.poll()
    assert len(tiers.copies) == n                                # following: no more staging
