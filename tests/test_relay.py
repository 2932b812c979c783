"""The relay rule of a multi-node job (NOTE [relay]): from the third epoch
on, a file is asked of the node that read it in the epoch before, which
holds it (pinned) from its read until its next reader has fetched it, or
two epochs at most; the planner pins and unpins single files, in C as in
Python."""
from __future__ import annotations

import os

import numpy as np
import pytest
from test_home_nodes import SIZES, streams_for

from tiering.clairvoyant.nodes import NodePlans, Relay, first_readers, home_budget
from tiering.clairvoyant.planner import EVICT, FETCH, Planner, allocations
from tiering.cluster.links import PeerLinks
from tiering.cluster.peer import PeerServer, Published
from tiering.cluster.peering import PeerTier
from tiering.profile.model import Network

N = len(SIZES)


def engine_env(monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    if engine == "python":
        monkeypatch.setenv("TIERING_PLANNER", "python")
    else:
        monkeypatch.delenv("TIERING_PLANNER", raising=False)


def first_advance(p: Planner) -> list[tuple[int, int]]:
    a = p.advance()
    return list(zip(a.kind.tolist(), a.file.tolist()))


@pytest.mark.parametrize("engine", ["c", "python"])
def test_keep_pins_and_unpins_single_files(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for two of three files, 0 and 1 held, the stream 2, 0, 1: to
    fetch 2 the planner evicts 1 (needed last); with 1 pinned it evicts 0;
    pinned and unpinned again, 1 is the victim once more."""
    engine_env(monkeypatch, engine)

    def planner() -> Planner:
        p = Planner(np.full(3, 4096, np.int64), [8192])
        p.adopt_many(np.array([0, 1]), np.array([0, 0]))
        p.extend(np.array([2, 0, 1]))
        return p

    assert first_advance(planner()) == [(EVICT, 1), (FETCH, 2)]
    p = planner()
    p.keep(np.array([1]), True)
    assert first_advance(p) == [(EVICT, 0), (FETCH, 2)]
    p = planner()
    p.keep(np.array([1, 1]), True)
    p.keep(np.array([1]), False)
    assert first_advance(p) == [(EVICT, 1), (FETCH, 2)]
    p = planner()
    p.keep(np.array([0, 1]), True)    # nothing may go: the fetch waits
    assert first_advance(p) == []
    assert p.held(np.array([0, 1, 2])).tolist() == [True, True, False]


def plans_of(nodes: int, me: int, capacity: int) -> NodePlans:
    return NodePlans.of_streams(streams_for(nodes), nodes, me, SIZES, [home_budget([capacity])] * nodes)


@pytest.mark.parametrize("nodes", [2, 3])
def test_from_the_third_epoch_the_holder_is_the_reader_of_the_epoch_before(nodes: int) -> None:
    streams = streams_for(nodes)
    capacity = int(SIZES.sum()) // nodes
    plans = [plans_of(nodes, me, capacity) for me in range(nodes)]
    for me, p in enumerate(plans):
        home = [p.holder(f) for f in range(N)]
        assert [p.holder(f, 0) for f in range(N)] == home == [p.holder(f, 1) for f in range(N)]
        assert all(p.holder(f, 2) is None for f in range(N))   # epoch 1's readers not prepared
        p.prepare([1, 2])
        for e in (2, 3):
            before, _ = first_readers([streams(n, e - 1) for n in range(nodes)], N)
            want = [None if r in (-1, me) else r for r in before.tolist()]
            assert [p.holder(f, e) for f in range(N)] == want
            assert sum(w is not None for w in want) > N // 3
        p.prepare([3])   # the others are let go
        assert p.readers(1) is None and p.readers(3) is not None
        assert all(p.holder(f, 2) is None for f in range(N))


class Keeps:
    """The policy's side of Relay.step: the pinned files."""

    def __init__(self, pinned: np.ndarray):
        self.pinned = pinned.copy()
        self.calls = 0

    def __call__(self, files: np.ndarray, on: bool) -> None:
        assert len(files) and len(np.unique(files)) == len(files)
        self.pinned[files] = on
        self.calls += 1


def step(relay: Relay, keeps: Keeps, files: np.ndarray, epoch: int, reader_epoch: int | None = None,
         held: np.ndarray | None = None) -> None:
    relay.step(files, np.full(len(files), epoch, np.int64), np.ones(len(files), bool) if held is None else held,
               epoch if reader_epoch is None else reader_epoch, keeps)


def test_a_file_read_after_the_first_epoch_is_held_for_its_next_reader_until_fetched_or_two_epochs() -> None:
    streams = streams_for(2)
    plans = plans_of(2, 0, int(SIZES.sum()))   # room for everything
    relay = Relay(plans, 1 << 40)
    keeps = Keeps(plans.pinned())
    homes = np.flatnonzero(plans.pinned())
    assert (relay.kept_in[homes] == 0).all() and relay.kept_bytes == int(allocations(SIZES)[homes].sum())
    # epoch 0: the homes are held already; nothing else is (the home rule's epoch)
    step(relay, keeps, streams(0, 0), 0)
    assert np.array_equal(np.flatnonzero(keeps.pinned), homes)
    # epoch 1: every file node 0 reads is read again in epoch 2 (by a node): held from its read
    e1 = streams(0, 1)
    step(relay, keeps, e1[:100], 1)
    assert keeps.pinned[e1[:100]].all() and (relay.kept_in[e1[:100]] == 1).all()
    read_again = np.intersect1d(homes, e1[:100])   # a home read by node 0 itself again: held for epoch 2 now
    assert (relay.kept_in[read_again] == 1).all()
    # node 1 fetched two files: they are let go; one node 0 has not read yet is handed out early:
    # it is not held after node 0's read
    gone, early = e1[:2], e1[150]
    relay.served.extend([*gone.tolist(), int(early)])
    step(relay, keeps, e1[100:], 1)
    assert not keeps.pinned[gone].any() and (relay.kept_in[gone] == -1).all()
    assert not keeps.pinned[early] and relay.kept_in[early] == -1 and relay.given[early] == -1
    assert keeps.pinned[np.setdiff1d(e1[100:], [early])].all()
    assert relay.handed == 2
    # a copy handed out epochs before this node's read (a stale ask) does not stop the hold
    relay2, keeps2 = Relay(plans, 1 << 40), Keeps(plans.pinned())
    late = int(np.setdiff1d(e1, homes)[0])
    relay2.served.append(late)
    step(relay2, keeps2, e1[:0], 0, reader_epoch=0)
    step(relay2, keeps2, np.array([late]), 3, reader_epoch=3)
    assert keeps2.pinned[late] and relay2.kept_in[late] == 3
    assert relay.kept_bytes == int(allocations(SIZES)[relay.kept_in >= 0].sum())
    # the homes nobody fetched and node 0 did not read again are let go once the reader is in epoch 2
    stale = np.setdiff1d(homes, e1)
    assert keeps.pinned[stale].all()
    step(relay, keeps, e1[:0], 2)
    assert not keeps.pinned[stale].any() and relay.expired == len(stale)
    # epoch 1's holds last until the reader is in epoch 3
    assert keeps.pinned[np.setdiff1d(e1, [*gone.tolist(), int(early)])].all()
    step(relay, keeps, e1[:0], 3)
    assert not keeps.pinned.any() and relay.kept_bytes == 0 and (relay.kept_in == -1).all()


def test_holds_stay_within_the_budget_and_files_not_held_are_not_pinned() -> None:
    streams = streams_for(2)
    plans = plans_of(2, 0, int(SIZES.sum()))
    allocs = allocations(SIZES)
    homes = np.flatnonzero(plans.pinned())
    budget = int(allocs[homes].sum()) + 40 * 4096
    relay = Relay(plans, budget)
    keeps = Keeps(plans.pinned())
    e1 = streams(0, 1)
    held = np.arange(len(e1)) % 2 == 0          # every other file is not in a tier when read
    step(relay, keeps, e1, 1, held=held)
    assert relay.kept_bytes <= budget and relay.kept_bytes == int(allocs[keeps.pinned].sum())
    assert not keeps.pinned[np.setdiff1d(e1[~held], homes)].any()
    assert budget - relay.kept_bytes < 12288            # full, up to one file's allocation
    new = np.setdiff1d(np.flatnonzero(keeps.pinned), homes)
    assert len(new) and not keeps.pinned[e1[held]].all()   # some held, others beyond the budget
    # every file read from a tier that has a next reader was held or counted as beyond the budget
    read = np.unique(e1[held])
    wanted = read[plans.readers(2)[read] >= 0]
    assert relay.over_budget > 0 and relay.holds + relay.over_budget == len(wanted)
    assert relay.report()["over_budget"] == relay.over_budget


def test_the_server_reports_each_copy_it_hands_out(tmp_path) -> None:
    """PeerServer tells the relay rule (through PeerTier, once the daemon
    set PeerLinks.served) the catalog id of each copy it opened to hand
    out; not a copy it does not have, nor one whose identity is not the one
    asked for."""
    from collections import deque

    from tiering.cluster.identity import NodeIdentity
    from tiering.cluster.peer import FileKey
    (tmp_path / "a").write_bytes(b"x" * 10)
    found = {(0, "a"): Published(str(tmp_path / "a"), 10, 2, 7)}
    tier = PeerTier(NodeIdentity(job_id="j", node_rank=0, node_count=2), Network(),
                    lambda root, rel: found.get((root, rel)))
    server = PeerServer("127.0.0.1", None, tier.lookup)
    server.served = tier._served
    assert isinstance(tier.links, PeerLinks)
    fd = server._open(FileKey(0, "a", 10, 2))   # no relay yet: nothing is kept
    assert fd is not None
    os.close(fd)
    tier.links.served = deque()
    for key, ok in [(FileKey(0, "a", 10, 2), True), (FileKey(0, "b", 10, 2), False),
                    (FileKey(0, "a", 10, 3), False), (FileKey(0, "a", 11, 2), False)]:
        fd = server._open(key)
        assert (fd is not None) == ok
        if fd is not None:
            os.close(fd)
    assert list(tier.links.served) == [7]


def test_a_file_just_read_is_held_before_the_plan_advances() -> None:
    """Node 0's real clairvoyant policy, its tiers 70% of what it reads per
    epoch, the relay attached (no budget); node 1 fetches from node 0, a
    little ahead of its reader, what node 0 holds for it.  Each file node 0
    reads from its tier in epoch 1 is pinned at once, before the plan makes
    room for the next fetches (a file just read has no near use, the plan's
    first victim otherwise): it is held, and still in place after every
    batch of reads, until node 1 fetched it."""
    from test_node_plans import SIZES as SZ
    from test_node_plans import InstantPlacement, budgets, own_stream
    from test_node_plans import streams_for as node_streams

    from tiering.clairvoyant.feeds import ListFeed
    from tiering.clairvoyant.policy import Clairvoyant
    nodes, epochs = 2, 3
    capacity = int(sum(SZ) * 0.7 / nodes)
    plans = NodePlans.of_streams(node_streams(nodes), nodes, 0, SZ, budgets(nodes, [capacity]))
    place = InstantPlacement(capacity)
    policy = Clairvoyant(place, ListFeed(iter([own_stream(0, nodes, e) for e in range(epochs)])),  # type: ignore[arg-type]
                         pinned=plans.pinned())
    policy.start()
    place.land(policy)
    relay = Relay(plans, 1 << 40)   # no budget: every file read from the tier is held
    policy.relay(relay)
    mine = [own_stream(0, nodes, e) for e in range(epochs)]
    theirs = [own_stream(1, nodes, e) for e in range(epochs)]
    step_, lead = 19, 40
    kept_seen = 0
    for e in range(2):
        for pos in range(0, len(mine[e]), step_):
            # node 1 reads in lockstep; it has fetched from node 0 what it reads next
            ahead = theirs[e][:pos + lead] if e else theirs[1][:max(0, pos + lead - len(mine[0]))]
            relay.served.extend(int(f) for f in ahead if relay.kept_in[f] >= 0)
            part = mine[e][pos:pos + step_]
            in_tier = [int(f) for f in part if int(f) in place.placed]
            policy.on_opens(part, np.ones(len(part), bool), np.full(len(part), 7))
            place.land(policy)
            if e == 1:
                assert all(relay.kept_in[f] == 1 or relay.given[f] >= 0 for f in in_tier)
                read = mine[1][:pos + step_]
                kept = read[relay.kept_in[read] == 1]
                assert all(int(f) in place.placed for f in kept)
                assert all(int(f) in policy.planner.resident for f in kept)
                kept_seen = max(kept_seen, len(kept))
    assert relay.holds > len(mine[1]) // 3 and kept_seen > len(mine[1]) // 4
    assert relay.handed > 0


def test_a_file_no_peer_would_be_asked_for_is_held_only_for_this_node_s_own_read() -> None:
    """Where the network is not faster than the PFS for a file's size
    (asked False), the next reader reads the PFS: node 0 holds such a file
    only when it reads it again itself."""
    streams = streams_for(2)
    plans = plans_of(2, 0, int(SIZES.sum()))
    asked = SIZES > 4096                     # the smallest files are not worth a peer fetch
    relay = Relay(plans, 1 << 40, asked)
    keeps = Keeps(plans.pinned())
    e1 = streams(0, 1)
    step(relay, keeps, e1, 1)
    nxt = plans.readers(2)
    assert nxt is not None
    small, large = e1[~asked[e1]], e1[asked[e1]]
    assert keeps.pinned[large].all()
    assert np.array_equal(keeps.pinned[small], nxt[small] == 0)
    assert (nxt[small] == 0).any() and (nxt[small] == 1).any()


def test_peer_is_faster_each_agrees_with_peer_is_faster() -> None:
    from tiering.cluster.peer import peer_is_faster, peer_is_faster_each
    sizes = np.array([0, 1, 4095, 1 << 16, 1 << 20, 123_456_789, 1 << 33], np.int64)
    for net, bw, lat in [(Network(bandwidth=1000, latency_ms=5.0), 100.0, 0.5),   # slow start, faster later
                         (Network(bandwidth=10, latency_ms=0.1), 100.0, 2.0),     # fast start, slower later
                         (Network(bandwidth=1250, latency_ms=0.1), 50.0, 2.0)]:
        each = peer_is_faster_each(sizes, net, bw, lat)
        assert each.tolist() == [peer_is_faster(int(s), net, bw, lat) for s in sizes]
        assert each.dtype == bool
    crossover = peer_is_faster_each(sizes, Network(bandwidth=1000, latency_ms=5.0), 100.0, 0.5)
    assert not crossover[0] and crossover[-1]


def test_the_planner_keeps_its_own_copy_of_the_pins() -> None:
    """Planner.keep changes the planner's pins and victim sets together; the
    array the policy gave is not the planner's (a change to it alone would
    leave pinned files among the victims)."""
    pinned = np.array([False, True, False])
    p = Planner(np.full(3, 4096, np.int64), [8192], pinned=pinned)
    pinned[1] = False        # the caller's array, not the plan's
    p.adopt_many(np.array([0, 1]), np.array([0, 0]))
    p.extend(np.array([2, 0, 1]))
    assert first_advance(p) == [(EVICT, 0), (FETCH, 2)]   # 1 is still pinned


def test_a_step_prepares_the_readers_of_the_epochs_either_side_of_the_reader() -> None:
    plans = plans_of(2, 0, int(SIZES.sum()))
    relay = Relay(plans, 1 << 40)
    keeps = Keeps(plans.pinned())
    step(relay, keeps, np.zeros(0, np.int64), 3)
    assert [plans.readers(e) is not None for e in range(6)] == [False, False, True, True, True, False]
    # node 0 reads in epoch 3 what another node read in epoch 2: asked of that node
    e3 = streams_for(2)(0, 3)
    before = plans.readers(2)
    assert before is not None
    assert [plans.holder(int(f), 3) for f in e3] == [None if before[f] == 0 else 1 for f in e3]


def test_next_epoch_is_the_epoch_of_the_next_planned_read() -> None:
    from test_node_plans import SIZES as SZ
    from test_node_plans import InstantPlacement, own_stream

    from tiering.clairvoyant.feeds import ListFeed
    from tiering.clairvoyant.policy import Clairvoyant
    place = InstantPlacement(sum(SZ))
    epochs = [own_stream(0, 2, e) for e in range(3)]
    policy = Clairvoyant(place, ListFeed(iter(epochs)))  # type: ignore[arg-type]
    assert policy.next_epoch(int(epochs[0][0])) is None   # no plan yet
    policy.start()
    first = int(epochs[0][0])
    assert policy.next_epoch(first) == 0
    only_later = [int(f) for f in epochs[1] if f not in set(epochs[0].tolist())]
    assert only_later and all(policy.next_epoch(f) == 1 for f in only_later)
    policy.on_opens(epochs[0][:1], np.ones(1, bool), np.full(1, 7))
    assert policy.next_epoch(first) == (1 if first in set(epochs[1].tolist()) else 2
                                        if first in set(epochs[2].tolist()) else None)


def test_what_the_server_hands_out_is_dropped_while_the_plan_is_not_followed() -> None:
    """A policy that follows no order never steps the relay's reads: the
    copies handed out are dropped each turn, not kept in a queue that grows."""
    from test_node_plans import SIZES as SZ
    from test_node_plans import InstantPlacement

    from tiering.clairvoyant.policy import Clairvoyant
    plans = NodePlans.of_streams(streams_for(2), 2, 0, SIZES, [1 << 30] * 2)
    policy = Clairvoyant(InstantPlacement(sum(SZ)), None)  # type: ignore[arg-type]
    relay = Relay(plans, 1 << 40)
    policy.relay(relay)
    relay.served.extend(range(100))
    policy.poll()
    assert len(relay.served) == 0 and relay.handed == 0
