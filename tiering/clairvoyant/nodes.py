"""The node-aware plan: which other node of a job holds a file now, computed
on every node without a message (NOTE [node-aware plan] in docs/design.md).

Every node computes every node's stream from the sampler's parameters
(DistributedSampler: the global shuffle split by rank; node n runs the ranks
n*L .. n*L+L-1 under block placement, as torchrun and Slurm place them).
From every node's first epoch and every node's budget (published at the
rendezvous: the nodes' tiers may differ) it computes each file's home node
(the home rule, NOTE [home nodes]): the node that reads it first, within
that node's budget.  A node's planner keeps its home files once it has them
(they are pinned), so a file another node holds is its home's from the
moment the home node has read it.  Only those are asked.

When the other nodes' streams cannot be computed (the order is known only
from each node's hook, or an order file), there is no node-aware plan and no
peer fetch: ``planning_from_options`` returns None.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..catalog import Catalog, dataset_ids
from .options import OrderOptions, layout_of, rank_specs
from .planner import allocations
from .policy import Clairvoyant
from .samplers import SamplerSpec, node_stream_array

MAX_NODES = 127   # a file's home node is an int8
SHARE = 7 / 8     # of a node's tiers (after the margin) its home files take at most; the rest is its window

Streams = Callable[[int, int], np.ndarray]   # (node rank, epoch) -> the catalog ids that node reads


def node_ranks(world: int, local_world: int, node: int) -> list[int]:
    """The global ranks of node `node` under block placement (fewer on a last, partial node)."""
    return list(range(node * local_world, min((node + 1) * local_world, world)))


def node_count(world: int, local_world: int) -> int:
    return -(-world // local_world)


class NodeStreams:
    """Every node's stream of catalog ids, one epoch at a time, from the
    sampler of one rank (any: the others differ by rank only).  A
    DistributedSampler's permutation of an epoch is drawn once for all the
    ranks of all the nodes (samplers.epoch_permutation keeps it)."""

    def __init__(self, spec: SamplerSpec, local_world: int, mapping: np.ndarray):
        self.spec, self.local_world, self.mapping = spec, local_world, mapping

    @property
    def nodes(self) -> int:
        return node_count(self.spec.num_replicas, self.local_world)

    def specs(self, node: int) -> list[SamplerSpec]:
        return [dataclasses.replace(self.spec, rank=r)
                for r in node_ranks(self.spec.num_replicas, self.local_world, node)]

    def __call__(self, node: int, epoch: int) -> np.ndarray:
        return self.mapping[node_stream_array(self.specs(node), len(self.mapping), epoch)]


def first_readers(first: Sequence[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each file's first reader in the first epoch (`first[k]`: node k's
    stream of catalog ids; the earlier offset wins, then the lower node):
    (node per file, int8, -1: read by none; the offset of that first read,
    int32, -1: none).  The homes before the budgets cut them (home_nodes)."""
    node = np.full(n, -1, np.int8)
    offset = np.full(n, np.iinfo(np.int32).max, np.int64)
    for k, stream in enumerate(first):
        files, at = np.unique(np.asarray(stream, np.int64), return_index=True)
        earlier = at < offset[files]
        node[files[earlier]] = k
        offset[files[earlier]] = at[earlier]
    offset[node < 0] = -1
    return node, offset.astype(np.int32)


def cut_to_budgets(readers: np.ndarray, offset: np.ndarray, allocs: np.ndarray,
                   budgets: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The homes: each first reader keeps the files it reads first, in that
    order, while their allocations' running sum fits its budget; the others
    have no home (-1, offset -1).  New arrays; the inputs are unchanged."""
    home, at = readers.copy(), offset.copy()
    for node, budget in enumerate(budgets):
        mine = np.flatnonzero(home == node)
        mine = mine[np.argsort(at[mine], kind="stable")]
        home[mine[np.cumsum(allocs[mine]) > budget]] = -1
    at[home < 0] = -1
    return home, at


def home_nodes(first: Sequence[np.ndarray], allocs: np.ndarray,
               budgets: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The home rule (NOTE [home nodes]): each file's home is the node whose
    ranks read it first in the first epoch (first_readers), as long as the
    files a node reads first, in that order, fit its budget (cut_to_budgets).
    Returns (home node per file, int8, -1: none; the offset of the file's
    first read in its home node's first epoch, int32, -1: no home)."""
    return cut_to_budgets(*first_readers(first, len(allocs)), allocs, budgets)


def home_budget(capacities: Sequence[int]) -> int:
    """The bytes of this node's tiers its home files may take (NOTE [home
    nodes]): SHARE of the tiers after the clairvoyant margin; the rest is its
    window.  Each node computes its own (RAM ``auto`` and the profile may
    differ between nodes) and publishes it at the rendezvous."""
    return int(sum(Clairvoyant.plan_capacities(capacities)) * SHARE)


class NodePlans:
    """Who holds which file of a job's data set, on every node without a
    message: each file's home node (home_nodes over every node's first epoch
    and every node's published budget), which keeps it from its first epoch
    on.  Every node given the same budgets computes the same homes.  5 bytes
    a file."""

    def __init__(self, planning: HomePlanning, budgets: Sequence[int]):
        """The homes of `planning`'s first readers within `budgets`."""
        self.nodes, self.me, self.first_epoch = planning.nodes, planning.me, planning.first_epoch
        self.budgets = [int(b) for b in budgets]
        if len(self.budgets) != self.nodes:
            raise ValueError(f"{len(self.budgets)} budgets for {self.nodes} nodes")
        # per file: its home node (-1: none) and the offset of its first read in its home's first epoch
        allocs = allocations(np.asarray(planning.sizes, np.int64))
        self.home, self.offset = cut_to_budgets(planning.readers, planning.offset, allocs, self.budgets)

    @classmethod
    def of_streams(cls, streams: Streams, nodes: int, me: int, sizes: Sequence[int] | np.ndarray,
                   budgets: Sequence[int], first_epoch: int = 0) -> NodePlans:
        """The homes straight from every node's stream (HomePlanning.of, then cut)."""
        return cls(HomePlanning.of(streams, nodes, me, sizes, first_epoch), budgets)

    def pinned(self, node: int | None = None) -> np.ndarray:
        """A bool per file: the home files of `node` (this node by default),
        which its planner keeps once held."""
        return self.home == (self.me if node is None else node)

    def counts(self) -> list[int]:
        """The number of home files of each node."""
        return np.bincount(self.home[self.home >= 0], minlength=self.nodes).tolist()

    def holder(self, f: int) -> int | None:
        """The node to ask for f (any thread): its home, which keeps it from
        the start of the job (it fetches its home files first: one still in
        flight there is answered "absent", and the PFS is read); None for
        this node's own files and files with no home."""
        h = int(self.home[f])
        return None if h < 0 or h == self.me else h


@dataclasses.dataclass(frozen=True)
class HomePlanning:
    """What a node knows of the homes before every node's budget is (at the
    rendezvous, NOTE [home nodes]): each file's first reader in the first
    epoch, computed at the start (5 bytes a file; the sizes are the
    catalog's column); plans(budgets) cuts them to the budgets."""
    streams: Streams
    nodes: int
    me: int
    first_epoch: int
    readers: np.ndarray          # int8 per file: its first reader (-1: none)
    offset: np.ndarray           # int32 per file: the offset of that read (-1: none)
    sizes: Sequence[int] | np.ndarray   # per file (not copied)

    @classmethod
    def of(cls, streams: Streams, nodes: int, me: int, sizes: Sequence[int] | np.ndarray,
           first_epoch: int = 0) -> HomePlanning:
        if not 1 <= nodes <= MAX_NODES or not 0 <= me < nodes:
            raise ValueError(f"node {me} of {nodes}: the node-aware plan covers 1 to {MAX_NODES} nodes")
        readers, offset = first_readers([streams(n, first_epoch) for n in range(nodes)], len(sizes))
        return cls(streams, nodes, me, first_epoch, readers, offset, sizes)

    def elsewhere(self, f: int) -> bool:
        """Whether f may have its home at another node (another node reads
        it first): a copy of it is worth waiting for the homes."""
        r = int(self.readers[f])
        return r >= 0 and r != self.me

    def plans(self, budgets: Sequence[int]) -> NodePlans:
        return NodePlans(self, budgets)


def planning_from_options(opts: OrderOptions, catalog: Catalog, nodes: int, node_rank: int,
                          env: Mapping[str, str] | None = None) -> HomePlanning | None:
    """The node-aware plan's inputs for a job whose sampler is given on the
    command line (``--sampler distributed``, world size and local world size
    from the launcher or the options); None when the other nodes' streams
    cannot be computed here (hook or order file: each node knows only its
    own order) or the ranks do not match the job's nodes."""
    if opts.sampler != "distributed" or opts.order_file is not None or nodes < 2:
        return None
    import os
    specs = rank_specs(opts, os.environ if env is None else env)
    world, local_world = specs[0].num_replicas, len(specs)
    if node_count(world, local_world) != nodes or specs[0].rank // local_world != node_rank:
        return None
    streams = NodeStreams(specs[0], local_world, dataset_ids(catalog, layout_of(opts)))
    return HomePlanning.of(streams, nodes, node_rank, catalog.files.size)   # the column: no object per file
