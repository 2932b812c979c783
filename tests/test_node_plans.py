"""The node-aware plan: every node computes which other node holds a file
now, and its answer is the other node's own plan."""
from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

from helpers import PlaceEach
from tiering.clairvoyant.feeds import ListFeed
from tiering.clairvoyant.nodes import NodePlans, NodeStreams, home_budget, node_ranks, planning_from_options
from tiering.clairvoyant.options import OrderOptions, rank_specs
from tiering.clairvoyant.policy import Clairvoyant
from tiering.clairvoyant.samplers import SamplerSpec, epoch_permutation, node_stream_array, rank_share
from tiering.placement.api import NOT_PLACED

N = 600          # data-set samples (catalog ids 0..N-1, mapped in reverse to test the mapping)
L = 2            # ranks per node
MAPPING = np.arange(N, dtype=np.int64)[::-1].copy()
SIZES = (4096 * (1 + np.arange(N) % 3)).tolist()


def stream_time(policy: Clairvoyant) -> tuple[int, int] | None:
    """Where the clairvoyant policy's reader is: (epoch, offset in its
    stream of that epoch); None when it follows no order."""
    planner, starts, epochs = policy.planner, policy.epoch_starts, policy.epochs
    if planner is None or not starts or not policy.following:
        return None
    k = max(0, bisect.bisect_right(starts, int(planner.reader)) - 1)
    return int(epochs[k]), int(planner.reader) - int(starts[k])


def held(plans: NodePlans, node: int, when: tuple[int, int] | None) -> np.ndarray:
    """The files `node` surely holds for the others when the readers of
    every node (in lockstep) are at `when`: its home files it has read
    (sorted; none when no order is followed)."""
    mine = np.flatnonzero(plans.home == node)
    if when is None:
        return mine[:0]
    epoch, offset = when
    return mine if epoch > plans.first_epoch else mine[plans.offset[mine] < offset]


def budgets(nodes: int, capacities: list[int]) -> list[int]:
    """Every node's budget when every node has these tiers."""
    return [home_budget(capacities)] * nodes


def env_of(node: int, nodes: int, local_rank: int = 0) -> dict[str, str]:
    """The launcher environment of a rank on `node` (torchrun)."""
    return {"WORLD_SIZE": str(nodes * L), "RANK": str(node * L + local_rank), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(L), "GROUP_RANK": str(node)}


def streams_for(nodes: int, seed: int = 7) -> NodeStreams:
    spec = SamplerSpec("distributed", seed=seed, num_replicas=nodes * L, rank=0)
    return NodeStreams(spec, L, MAPPING)


def own_stream(node: int, nodes: int, epoch: int, seed: int = 7) -> np.ndarray:
    """What node computes for itself from its own launcher environment, as
    options.py does for its ListFeed."""
    specs = rank_specs(OrderOptions(sampler="distributed", seed=seed), env_of(node, nodes, local_rank=1))
    return MAPPING[node_stream_array(specs, N, epoch)]


@pytest.mark.parametrize("nodes", [2, 3])
def test_every_node_computes_each_node_s_own_stream(nodes):
    streams = streams_for(nodes)
    assert streams.nodes == nodes
    for node in range(nodes):
        assert node_ranks(nodes * L, L, node) == [node * L, node * L + 1]
        for epoch in (0, 1, 5):
            assert np.array_equal(streams(node, epoch), own_stream(node, nodes, epoch))
    # the nodes split the shuffle: each sample read by exactly one node per epoch (N divisible by nodes*L)
    together = np.concatenate([streams(n, 3) for n in range(nodes)])
    assert sorted(together.tolist()) == list(range(N))


@pytest.mark.parametrize("n, options", [
    (N, {}), (601, {}), (601, {"drop_last": True}), (607, {"batch_size": 4, "batch_drop_last": True}),
    (601, {"shuffle": False}), (5, {}), (5, {"drop_last": True})])
def test_one_permutation_per_epoch_gives_every_rank_s_order(n, options):
    """The shared permutation sliced per rank is each rank's DistributedSampler
    order (padding, drop_last, a batch's dropped tail, no shuffle, fewer
    samples than ranks)."""
    spec = SamplerSpec("distributed", seed=9, num_replicas=6, rank=0, **options)
    streams = NodeStreams(spec, 2, np.arange(n, dtype=np.int64))
    for epoch in (0, 3):
        for node in range(3):
            specs = [SamplerSpec("distributed", seed=9, num_replicas=6, rank=r, **options)
                     for r in node_ranks(6, 2, node)]
            assert np.array_equal(streams(node, epoch), node_stream_array(specs, n, epoch))


def test_an_epoch_s_permutation_is_drawn_once_and_sliced_per_rank():
    spec = SamplerSpec("distributed", seed=3, num_replicas=4, rank=0)
    perm = epoch_permutation(spec, 10, 2)
    assert epoch_permutation(dataclasses.replace(spec, rank=3), 10, 2) is perm and not perm.flags.writeable
    assert sorted(perm.tolist()) == list(range(10))
    padded = np.concatenate([perm, perm[:2]])      # 4 ranks x 3: padded cyclically
    shares = [rank_share(dataclasses.replace(spec, rank=r), perm) for r in range(4)]
    assert [s.tolist() for s in shares] == [padded[r::4].tolist() for r in range(4)]
    cut = dataclasses.replace(spec, rank=1, drop_last=True)   # 4 x 2: the last two dropped
    assert rank_share(cut, perm).tolist() == perm[:8][1::4].tolist()


class InstantPlacement(PlaceEach):
    """Copies land when the test lands them; every place is accepted."""

    def __init__(self, capacity: int):
        self.sizes = SIZES
        self.capacities = [capacity]
        self.stopping = False
        self.pending: list[tuple[int, int]] = []
        self.placed: dict[int, int] = {}

    def where(self, i: int) -> int:
        return self.placed.get(i, NOT_PLACED)

    def place(self, i: int, tier: int) -> bool:
        self.pending.append((i, tier))
        return True

    def evict(self, i: int) -> bool:
        return self.placed.pop(i, None) is not None

    def placements(self) -> Iterator[tuple[int, int]]:
        return iter(list(self.placed.items()))

    def copies_in_flight(self) -> int:
        return len(self.pending)

    def land(self, policy: Clairvoyant) -> None:
        while self.pending:
            landed, self.pending = self.pending, []
            for i, tier in landed:
                self.placed[i] = tier
                policy.on_placed(i, tier)


def own_policy(node: int, nodes: int, capacity: int, epochs: int,
               pinned: np.ndarray) -> tuple[Clairvoyant, InstantPlacement]:
    place = InstantPlacement(capacity)
    feed = ListFeed(iter([own_stream(node, nodes, e) for e in range(epochs)]))
    policy = Clairvoyant(place, feed, pinned=pinned)   # type: ignore[arg-type]
    policy.start()
    place.land(policy)
    return policy, place


@pytest.mark.parametrize("nodes", [2, 3])
def test_node_0_names_a_node_only_for_files_that_node_s_own_plan_holds(nodes):
    """Each other node runs its real clairvoyant policy on its own stream,
    its home files pinned; node 0 computes the homes from the sampler's
    parameters alone and, at every point of the run, names node n for a file
    only while node n holds it, and names it for every home file node n has
    read (held from then to the end)."""
    epochs = 4
    capacity = int(sum(SIZES) * 0.6 / nodes)      # a node's tiers hold 60% of what it reads per epoch
    mine = NodePlans.of_streams(streams_for(nodes), nodes, 0, SIZES, budgets(nodes, [capacity]))
    others = {n: own_policy(n, nodes, capacity, epochs, mine.pinned(n)) for n in range(1, nodes)}
    when = stream_time(others[1][0])
    per_epoch = N // nodes
    named = evicted = 0
    for pos in range(0, epochs * per_epoch, 23):
        times = set()
        for n, (policy, place) in others.items():
            stop = min(pos + 23, epochs * per_epoch)
            files = np.concatenate([own_stream(n, nodes, e) for e in range(epochs)])[pos:stop]
            policy.on_opens(files, np.ones(len(files), bool), np.full(len(files), 100 + n))
            place.land(policy)
            times.add(stream_time(policy))
            evicted += policy.evictions
        assert len(times) == 1                     # the nodes are in lockstep
        when = times.pop()
        for n, (policy, place) in others.items():
            has = held(mine, n, when).tolist()
            assert set(has) <= set(policy.planner.resident) and set(has) <= set(place.placed)
            assert all(mine.holder(f) == n for f in has)
            named += len(has)
    for n, (policy, _) in others.items():
        # every home file of node n was read there in epoch 0, named from then on, and is still held
        assert held(mine, n, when).tolist() == np.flatnonzero(mine.home == n).tolist()
        assert set(held(mine, n, when).tolist()) <= set(policy.planner.resident)
    assert named > epochs * per_epoch and evicted > 0   # the plans did hold files, and evicted others


def test_the_home_is_named_whether_this_node_follows_its_order_or_not():
    """The homes hold their files from the start to the end: held() follows
    the readers, holder() does not need them."""
    mine = NodePlans.of_streams(streams_for(2), 2, 0, SIZES, [sum(SIZES)] * 2)
    f = int(streams_for(2)(1, 0)[0])
    assert mine.holder(f) == 1 and len(held(mine, 1, None)) == 0    # nothing followed
    assert f in held(mine, 1, (0, 10)).tolist() and len(held(mine, 1, (0, 10))) == 10
    assert mine.holder(int(streams_for(2)(0, 0)[0])) is None    # node 0's own home file


def test_the_reader_s_time_is_the_epoch_and_offset_of_the_policy_s_reader():
    place = InstantPlacement(sum(SIZES))
    policy = Clairvoyant(place, ListFeed(iter([own_stream(0, 2, e) for e in range(2)])))  # type: ignore[arg-type]
    assert stream_time(policy) is None             # not started: no order followed
    policy.start()
    place.land(policy)
    files = own_stream(0, 2, 0)[:40]
    policy.on_opens(files, np.ones(len(files), bool), np.full(len(files), 7))
    assert stream_time(policy) == (0, 40)


def test_plans_only_from_a_sampler_every_node_can_compute(tmp_path):
    from helpers import make_data
    from tiering.catalog import scan
    make_data(tmp_path / "d", {f"c{k % 2}/f{k:03d}.jpg": 10 for k in range(12)})
    cat = scan([str(tmp_path / "d")])
    env = env_of(1, 2)
    dist = OrderOptions(sampler="distributed", seed=3)
    planning = planning_from_options(dist, cat, 2, 1, env=env)
    assert planning is not None and planning.nodes == 2 and planning.me == 1
    assert planning_from_options(OrderOptions(), cat, 2, 1, env=env) is None         # the hook's orders
    assert planning_from_options(OrderOptions(sampler="distributed", order_file=tmp_path / "o"), cat, 2, 1,
                                 env=env) is None                                     # an order file
    assert planning_from_options(dist, cat, 3, 1, env=env) is None    # ranks of another node count
    assert planning_from_options(dist, cat, 2, 0, env=env) is None    # this rank is on node 1
    assert planning_from_options(dist, cat, 1, 0, env={}) is None     # one node: no peers


def test_the_planning_homes_the_catalog_s_files_by_their_sizes(tmp_path):
    """The homes of planning_from_options are those of the catalog's
    files with their own sizes (a budget that binds: the sizes decide)."""
    from helpers import make_data
    from tiering.catalog import dataset_ids, scan
    from tiering.clairvoyant.options import layout_of
    make_data(tmp_path / "d", {f"c{k % 3}/f{k:03d}.jpg": 5000 * (1 + k % 4) for k in range(90)})
    cat = scan([str(tmp_path / "d")])
    dist = OrderOptions(sampler="distributed", seed=3)
    caps = [60_000]
    planning = planning_from_options(dist, cat, 2, 1, env=env_of(1, 2))
    assert planning is not None
    plans = planning.plans(budgets(2, caps))
    spec = rank_specs(dist, env_of(1, 2))[0]
    streams = NodeStreams(spec, L, dataset_ids(cat, layout_of(dist)))
    by_hand = NodePlans.of_streams(streams, 2, 1, [f.size for f in cat.files], budgets(2, caps))
    assert np.array_equal(plans.home, by_hand.home)
    assert 0 < int((plans.home >= 0).sum()) < 90        # some files homed, the budget cut the rest
