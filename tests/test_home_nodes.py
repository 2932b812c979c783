"""The home rule of a multi-node job (NOTE [home nodes]): each file has at
most one home node, the node that reads it first in the first epoch, within
that node's share of its tiers; every node computes the same homes; a
node's planner never evicts a home file (for a file that is not one), in C
as in Python."""
from __future__ import annotations

import numpy as np
import pytest
from test_node_plans import held

from tiering.clairvoyant.nodes import (
    WINDOW_FILES,
    WINDOW_MAX_SHARE,
    WINDOW_SHARE,
    NodePlans,
    NodeStreams,
    home_budget,
    home_nodes,
)
from tiering.clairvoyant.planner import EVICT, FETCH, Planner, allocations
from tiering.clairvoyant.policy import Clairvoyant
from tiering.clairvoyant.samplers import SamplerSpec

N = 600
L = 2
SIZES = (4096 * (1 + np.arange(N) % 3)).astype(np.int64)   # allocations 4, 8 and 12 KiB


def streams_for(nodes: int, n: int = N, seed: int = 7) -> NodeStreams:
    spec = SamplerSpec("distributed", seed=seed, num_replicas=nodes * L, rank=0)
    return NodeStreams(spec, L, np.arange(n, dtype=np.int64))


def test_home_rule_by_hand() -> None:
    """The earlier read wins (then the lower node); each node takes the files
    it reads first in that order while their allocations fit its budget
    (a prefix: a later small file that would fit is not taken)."""
    first = [np.array([0, 1, 2, 3, 9]), np.array([4, 0, 5, 6, 7, 8])]
    allocs = np.full(10, 4096, np.int64)
    allocs[2] = 3 * 4096
    home, offset = home_nodes(first, allocs, [4 * 4096, 3 * 4096])
    # node 0: 0 (4K), 1 (8K), 2 (20K > 16K: stop) -> 3 and 9 have no home though they would fit
    # node 1: 4, 5, 6 (0 is node 0's: read at offset 0 there, 1 here); 7 and 8 beyond its budget
    assert home.tolist() == [0, 0, -1, -1, 1, 1, 1, -1, -1, -1]
    assert offset.tolist() == [0, 1, -1, -1, 0, 2, 3, -1, -1, -1]
    tie, _ = home_nodes([np.array([5, 1]), np.array([1, 5])], np.full(6, 4096, np.int64), [1 << 20] * 2)
    assert tie[[1, 5]].tolist() == [1, 0]   # each read at offset 0 by one node, at 1 by the other
    assert tie[[0, 2, 3, 4]].tolist() == [-1] * 4   # read by nobody


@pytest.mark.parametrize("nodes", [2, 3, 4])
@pytest.mark.parametrize("capacity_share", [0.3, 0.6, 1.5])   # of what a node reads per epoch
def test_the_home_rule_partitions_the_data_set_the_same_on_every_node(nodes: int, capacity_share: float) -> None:
    per_node = int(SIZES.sum()) // nodes
    capacity = int(per_node * capacity_share)
    streams = streams_for(nodes)
    budgets = [home_budget([capacity // 2, capacity - capacity // 2])] * nodes
    plans = [NodePlans.of_streams(streams_for(nodes), nodes, me, SIZES, budgets) for me in range(nodes)]
    home = plans[0].home
    for p in plans[1:]:
        assert np.array_equal(p.home, home)   # the same answer on every node, without a message
    room = int(capacity // 2 * Clairvoyant.margin) + int((capacity - capacity // 2) * Clairvoyant.margin)
    budget = int(room * (1 - WINDOW_SHARE))
    allocs = allocations(SIZES)
    homed = 0
    for n in range(nodes):
        mine = np.flatnonzero(home == n)
        first = streams(n, 0)
        assert int(allocs[mine].sum()) <= budget                 # capacity respected
        assert np.isin(mine, first).all()                       # a node's home files are files it reads first
        # in the order it reads them: a prefix of what it reads first
        order = first[np.sort(np.unique(first, return_index=True)[1])]
        assert np.array_equal(np.sort(order[:len(mine)]), mine)
        assert np.array_equal(plans[n].pinned(), home == n) and np.array_equal(plans[0].pinned(n), home == n)
        homed += len(mine)
    assert ((home >= -1) & (home < nodes)).all()              # at most one home each
    if capacity_share < 1 / (1 - WINDOW_SHARE):    # the budget is below a node's share: some have no home
        assert 0 < homed < N and int(allocs[home >= 0].sum()) <= nodes * budget
    else:                                       # the aggregate holds the data set: every file has a home
        assert homed == N


def test_the_budget_leaves_a_window_of_a_share_of_the_tiers_and_at_least_some_files() -> None:
    """The home budget is the tiers after the margin less the window: WINDOW_SHARE
    of them, or room for WINDOW_FILES files of the mean allocation when that is
    more, but never more than WINDOW_MAX_SHARE of them."""
    tiers = [3 << 30, 1 << 30]
    room = int((3 << 30) * Clairvoyant.margin) + int((1 << 30) * Clairvoyant.margin)
    assert home_budget(tiers) == int(room - room * WINDOW_SHARE)
    small = 4096 * 10                                      # the share is larger than WINDOW_FILES of these
    assert WINDOW_FILES * small < room * WINDOW_SHARE
    assert home_budget(tiers, small) == int(room - room * WINDOW_SHARE)
    middle = room // 256                                   # WINDOW_FILES of these take 1/32 of the room
    assert room * WINDOW_SHARE < WINDOW_FILES * middle < room * WINDOW_MAX_SHARE
    assert home_budget(tiers, middle) == room - WINDOW_FILES * middle
    for large in (room // 16, room):                       # a few large files: the window stops at its largest
        assert home_budget(tiers, large) == int(room - room * WINDOW_MAX_SHARE)
    assert 0 < home_budget([4096]) <= 4096                 # never below nothing, never above the tiers


def test_capacity_weighted_budgets() -> None:
    """Nodes with unequal budgets home different amounts of what they read first."""
    streams = streams_for(2)
    first = [streams(0, 0), streams(1, 0)]
    allocs = allocations(SIZES)
    home, _ = home_nodes(first, allocs, [int(allocs.sum()) // 2, int(allocs.sum()) // 8])
    assert int(allocs[home == 0].sum()) > 3 * int(allocs[home == 1].sum())
    assert int(allocs[home == 1].sum()) <= int(allocs.sum()) // 8


def test_holder_is_the_home_and_held_what_the_home_has_read() -> None:
    streams = streams_for(2)
    plans = NodePlans.of_streams(streams, 2, 0, SIZES, [int(SIZES.sum())] * 2)   # every file has a home
    f1, f0 = int(streams(1, 0)[5]), int(streams(0, 0)[5])
    assert plans.home[f1] == 1 and plans.home[f0] == 0
    assert plans.holder(f1) == 1 and plans.holder(f0) is None   # asked of its home; f0 is this node's own
    assert len(held(plans, 1, None)) == 0                       # not following
    assert f1 not in held(plans, 1, (0, 5)).tolist() and len(held(plans, 1, (0, 5))) == 5   # read at offset 5
    assert f1 in held(plans, 1, (0, 6)).tolist() and len(held(plans, 1, (0, 6))) == 6
    assert len(held(plans, 1, (3, 0))) == N // 2


@pytest.mark.parametrize("nodes", [2, 3])
def test_nodes_with_different_tiers_agree_on_the_homes_given_the_published_budgets(nodes: int) -> None:
    """Each node's budget comes from its own tiers (RAM ``auto``, another
    profile); given every node's budget (the rendezvous publishes them) all
    nodes compute the same homes, and each node's home files fit its own
    budget: the node with the smaller tiers homes fewer bytes."""
    streams = streams_for(nodes)
    per_node = int(SIZES.sum()) // nodes
    tiers = [[int(per_node * (0.4 + 0.5 * n)) // 2, int(per_node * (0.4 + 0.5 * n)) // 2] for n in range(nodes)]
    budgets = [home_budget(t) for t in tiers]
    assert len(set(budgets)) == nodes
    plans = [NodePlans.of_streams(streams, nodes, me, SIZES, budgets) for me in range(nodes)]
    for p in plans[1:]:
        assert np.array_equal(p.home, plans[0].home) and np.array_equal(p.offset, plans[0].offset)
    allocs = allocations(SIZES)
    homed = [int(allocs[plans[0].home == n].sum()) for n in range(nodes)]
    assert all(h <= b for h, b in zip(homed, budgets)) and homed[0] < homed[1]
    for me, p in enumerate(plans):   # each node names the same holder for every file, itself excepted
        named = np.array([-1 if p.holder(f) is None else p.holder(f) for f in range(N)])
        mine = p.home == me
        assert (named[mine] == -1).all() and np.array_equal(named[~mine], p.home[~mine])


def run_pinned(engine: str, monkeypatch: pytest.MonkeyPatch, pinned: np.ndarray | None, capacity: int,
               epochs: list[np.ndarray], step: int = 17,
               ahead: int = 1) -> tuple[list[tuple[int, int, int]], Planner]:
    """The planner driven as the daemon drives it: extend (`ahead` epochs
    beyond the reader's known), advance, the reader reads `step` positions,
    and so on; the actions (kind, file, tier)."""
    with monkeypatch.context() as m:
        if engine == "python":
            m.setenv("TIERING_PLANNER", "python")
        else:
            m.delenv("TIERING_PLANNER", raising=False)
        p = Planner(SIZES, [capacity // 3, capacity - capacity // 3], window=64, pinned=pinned)
        acts: list[tuple[int, int, int]] = []
        known = 0
        for e in range(len(epochs)):
            while known < min(len(epochs), e + 1 + ahead):
                p.extend(epochs[known])
                known += 1
            stop = p.reader + len(epochs[e])
            while p.reader < stop:
                a = p.advance()
                acts += list(zip(a.kind.tolist(), a.file.tolist(), a.tier.tolist()))
                p.consume_range(p.reader, min(stop, p.reader + step))
        return acts, p


@pytest.mark.parametrize("ahead", [1, 3])
@pytest.mark.parametrize("engine", ["c", "python"])
def test_home_files_are_never_evicted_for_files_that_are_not(engine: str, ahead: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 0's planner on its own stream, its tiers 60% of what it reads per
    epoch, its home files pinned, the next epoch known or all of them: each
    home file is fetched once and never evicted, while the other files come
    and go in the rest of the tiers."""
    streams = streams_for(2)
    capacity = int(SIZES.sum() * 0.6 / 2)
    plans = NodePlans.of_streams(streams, 2, 0, SIZES, [home_budget([capacity // 3, capacity - capacity // 3])] * 2)
    home = plans.pinned()
    epochs = [streams(0, e) for e in range(4)]
    acts, p = run_pinned(engine, monkeypatch, home, capacity, epochs, ahead=ahead)
    fetched = [f for k, f, _ in acts if k == FETCH]
    evicted = [f for k, f, _ in acts if k == EVICT]
    assert home.sum() > 50 and len(evicted) > 100        # homes, and a window that is busy
    assert not home[evicted].any()                       # no home file is ever evicted
    homes_fetched = [f for f in fetched if home[f]]
    assert sorted(homes_fetched) == np.flatnonzero(home).tolist()   # each fetched once
    assert all(f in p.resident for f in np.flatnonzero(home).tolist())   # and held at the end
    # without pins the same planner evicts some of them: the pins decide
    free_acts, _ = run_pinned(engine, monkeypatch, None, capacity, epochs, ahead=ahead)
    assert home[[f for k, f, _ in free_acts if k == EVICT]].any()


def test_pins_make_the_same_decisions_in_c_and_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    streams = streams_for(3)
    capacity = int(SIZES.sum() * 0.5 / 3)
    home = NodePlans.of_streams(streams, 3, 1, SIZES, [home_budget([capacity // 3, capacity - capacity // 3])] * 3).pinned()
    epochs = [streams(1, e) for e in range(3)]
    c_acts, c_p = run_pinned("c", monkeypatch, home, capacity, epochs, step=5, ahead=2)
    py_acts, py_p = run_pinned("python", monkeypatch, home, capacity, epochs, step=5, ahead=2)
    assert c_acts == py_acts and len(c_acts) > 200
    assert c_p.resident == py_p.resident


def run_pinned_late(engine: str, monkeypatch: pytest.MonkeyPatch,
                    home: np.ndarray) -> tuple[list[tuple[int, int, int]], Planner, set[int]]:
    """Node 0's planner started without pins (the nodes have not met), its
    first fetches made and 40 positions read, then pinned (the homes known)
    and driven on over four epochs: the actions after the pins, the planner,
    and the home files it held when pinned."""
    streams = streams_for(2)
    capacity = int(SIZES.sum() * 0.6 / 2)
    epochs = [streams(0, e) for e in range(4)]
    with monkeypatch.context() as m:
        if engine == "python":
            m.setenv("TIERING_PLANNER", "python")
        else:
            m.delenv("TIERING_PLANNER", raising=False)
        p = Planner(SIZES, [capacity // 3, capacity - capacity // 3], window=64)
        p.extend(epochs[0])
        p.extend(epochs[1])
        assert len(p.advance().file) > 0
        p.consume_range(0, 40)
        held_then = {f for f in p.resident if home[f]}
        p.pin(home)
        acts: list[tuple[int, int, int]] = []
        for e in range(4):
            if e + 2 < len(epochs):
                p.extend(epochs[e + 2])
            stop = (e + 1) * len(epochs[0])
            while p.reader < stop:
                a = p.advance()
                acts += list(zip(a.kind.tolist(), a.file.tolist(), a.tier.tolist()))
                p.consume_range(p.reader, min(stop, p.reader + 17))
    return acts, p, held_then


def test_pins_given_mid_run_keep_the_home_files_from_then_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The homes are known once the nodes met, after the planner started:
    pinned then, the home files held at that moment are never evicted nor
    fetched again, every other home file is fetched once and kept; the same
    decisions in C and in Python."""
    capacity = int(SIZES.sum() * 0.6 / 2)
    home = NodePlans.of_streams(streams_for(2), 2, 0, SIZES,
                     [home_budget([capacity // 3, capacity - capacity // 3])] * 2).pinned()
    c_acts, c_p, held_then = run_pinned_late("c", monkeypatch, home)
    evicted = [f for k, f, _ in c_acts if k == EVICT]
    assert held_then and len(evicted) > 100 and not home[evicted].any()   # no home file evicted once pinned
    assert all(f in c_p.resident for f in np.flatnonzero(home).tolist())   # every home file held at the end
    fetched = [f for k, f, _ in c_acts if k == FETCH and home[f]]
    assert not set(fetched) & held_then and len(fetched) == len(set(fetched))
    assert set(fetched) | held_then == set(np.flatnonzero(home).tolist())
    py_acts, py_p, py_held = run_pinned_late("python", monkeypatch, home)
    assert (py_acts, py_held) == (c_acts, held_then) and py_p.resident == c_p.resident
