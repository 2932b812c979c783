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
moment the home node has read it.  From the third epoch on, a file is held
by the node that read it in the epoch before, until its next reader has
fetched it (the relay rule, NOTE [relay]: `Relay`, `NodePlans.holder(f,
epoch)`).  Only those are asked.

When the other nodes' streams cannot be computed (the order is known only
from each node's hook, or an order file), there is no node-aware plan and no
peer fetch: ``planning_from_options`` returns None.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..catalog import Catalog, dataset_ids
from ..placement.api import allocations
from .options import OrderOptions, layout_of, rank_specs
from .policy import Clairvoyant
from .samplers import SamplerSpec, node_stream_array

MAX_NODES = 127   # a file's home node is an int8
WINDOW_SHARE = 1 / 64   # of a node's tiers (after the margin): the least room its window keeps ...
WINDOW_FILES = 8        # ... and room for at least this many of the data set's files ...
WINDOW_MAX_SHARE = 1 / 16   # ... as long as those take at most this share (NOTE [home nodes])

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


def home_budget(capacities: Sequence[int], mean_allocation: int = 0) -> int:
    """The bytes of this node's tiers its home files (and the relay's holds)
    may take (NOTE [home nodes]): the tiers after the clairvoyant margin less
    the node's window, the room where it fetches ahead of its reader:
    WINDOW_SHARE of them, and room for WINDOW_FILES files of `mean_allocation`
    bytes (the data set's mean allocation on a tier) when that is more, up
    to WINDOW_MAX_SHARE of them (tiers of a few large files keep their
    holds).  Each node computes its own (RAM ``auto`` and the profile may
    differ between nodes) and publishes it at the rendezvous."""
    room = sum(Clairvoyant.plan_capacities(capacities))
    files = min(WINDOW_FILES * mean_allocation, room * WINDOW_MAX_SHARE)
    return int(room - max(room * WINDOW_SHARE, files))


class NodePlans:
    """Who holds which file of a job's data set, on every node without a
    message: each file's home node (home_nodes over every node's first epoch
    and every node's published budget), which keeps it from its first epoch
    on, and from the third epoch on the node that read it in the epoch
    before, which keeps it for its next reader (NOTE [relay]).  Every node
    given the same budgets computes the same answers.  5 bytes a file, and
    one a file per prepared epoch."""

    def __init__(self, planning: HomePlanning, budgets: Sequence[int]):
        """The homes of `planning`'s first readers within `budgets`."""
        self.nodes, self.me, self.first_epoch = planning.nodes, planning.me, planning.first_epoch
        self.budgets = [int(b) for b in budgets]
        if len(self.budgets) != self.nodes:
            raise ValueError(f"{len(self.budgets)} budgets for {self.nodes} nodes")
        # per file: its home node (-1: none) and the offset of its first read in its home's first epoch
        self.sizes = planning.sizes   # the catalog's column (not copied)
        self.home, self.offset = cut_to_budgets(planning.readers, planning.offset,
                                                allocations(np.asarray(self.sizes, np.int64)), self.budgets)
        self.streams = planning.streams
        self._readers: dict[int, np.ndarray] = {}   # epoch -> each file's first reader in it (NOTE [relay])

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

    def holder(self, f: int, epoch: int | None = None) -> int | None:
        """The node to ask for f (any thread) for this node's read of it in
        `epoch` (None: not known).  In the first two epochs (or not known):
        its home, which keeps it from the start of the job (it fetches its
        home files first: one still in flight there is answered "absent",
        and the PFS is read).  Later: the node that read it in the epoch
        before, which keeps it for the next reader (the relay rule, NOTE
        [relay]); not known yet (prepare): None.  None also for this node's
        own files and files with no home or no reader."""
        if epoch is None or epoch < self.first_epoch + 2:
            h = int(self.home[f])
        else:
            readers = self._readers.get(epoch - 1)
            h = -1 if readers is None else int(readers[f])
        return None if h < 0 or h == self.me else h

    def readers(self, epoch: int) -> np.ndarray | None:
        """Each file's first reader in `epoch` (int8, -1: none) once prepared, else None."""
        return self._readers.get(epoch)

    def prepare(self, epochs: Sequence[int]) -> None:
        """Computes the readers of these epochs (the others are let go): the
        daemon's event thread, at most once per epoch; holder() only looks."""
        have = self._readers
        nodes = range(self.nodes)
        self._readers = {e: have[e] if e in have else
                         first_readers([self.streams(n, e) for n in nodes], len(self.home))[0]
                         for e in epochs if e >= self.first_epoch}


Keep = Callable[[np.ndarray, bool], None]   # (files, on): pin or unpin them in this node's plan


class Relay:
    """This node's holds under the relay rule (NOTE [relay]): the files it
    keeps for the node that reads them next.  Its home files are held from
    the start (the home rule).  A file this node reads in an epoch after
    the first, whose reader in the next epoch is this node or another node
    that would ask a peer for it, is held from that read, within the
    budget, until that node fetches it (the server reports it: `served`),
    this node reads it again, or this node's reader is two epochs further.
    The event thread's, except `served` (any thread appends).  5 bytes a
    file."""

    def __init__(self, plans: NodePlans, budget: int, asked: np.ndarray | None = None):
        """asked: a bool per file, whether another node would ask a peer for
        it (the network is faster than the PFS for its size; None: every
        file); the others are held for this node's own next read only."""
        n = len(plans.home)
        self.plans, self.budget = plans, int(budget)
        self.asked = np.ones(n, bool) if asked is None else np.asarray(asked, bool)
        self.kept_in = np.full(n, -1, np.int16)   # the epoch whose read holds the file here (-1: not held)
        self.given = np.full(n, -1, np.int16)     # the reader's epoch when the server handed out a file not held
        self._sizes = np.asarray(plans.sizes, np.int64)   # the catalog's column: not copied
        homes = np.flatnonzero(plans.pinned())
        self.kept_in[homes] = plans.first_epoch
        self.kept_bytes = int(self._allocs(homes).sum())
        self.served: deque[int] = deque()          # files the server handed out, not looked at yet
        self._held: dict[int, list[np.ndarray]] = {plans.first_epoch: [homes]}
        self.holds = self.handed = self.expired = 0   # for the report
        self.over_budget = 0     # files read that were not held: the budget was taken

    def _allocs(self, files: np.ndarray) -> np.ndarray:
        return allocations(self._sizes[files])

    def drop_served(self) -> None:
        """The plan is not followed: what the server hands out is not looked at."""
        self.served.clear()

    def step(self, files: np.ndarray, epochs: np.ndarray, held: np.ndarray, reader_epoch: int,
             keep: Keep) -> None:
        """One turn: `files` were read (matched to the plan, in `epochs`;
        `held`: planned into a tier when read), the reader is in
        `reader_epoch`.  Lets go of the files the server handed out, holds
        the ones read for their next reader, lets go of holds nobody came
        for, and prepares the readers the holder answers need."""
        plans = self.plans
        plans.prepare(range(reader_epoch - 1, reader_epoch + 2))
        n = len(self.served)
        if n:
            out = np.fromiter((self.served.popleft() for _ in range(n)), np.int64, n)
            held_here = self.kept_in[out] >= 0
            self.handed += self._let_go(out[held_here], keep)
            self.given[out[~held_here]] = reader_epoch
        for e in np.unique(epochs).tolist():
            mine = files[(epochs == e) & held]
            kept = self.kept_in[mine]
            self._let_go(mine[(kept >= 0) & (kept < e)], keep)   # held for this node's own read: done
            nxt = plans.readers(e + 1) if e > plans.first_epoch else None
            if nxt is None:
                continue
            w = nxt[mine]   # the next epoch's readers: another node (that would ask), or this one
            f = np.unique(mine[(w == plans.me) | ((w >= 0) & self.asked[mine])])
            f = f[self.kept_in[f] < 0]
            given = self.given[f] >= e - 1    # handed out ahead of this read: its next reader has it
            self.given[f] = -1
            f = f[~given]
            allocs = self._allocs(f)
            fits = self.kept_bytes + np.cumsum(allocs) <= self.budget
            self.over_budget += int(len(f) - np.count_nonzero(fits))
            f = f[fits]
            if f.size:
                keep(f, True)
                self.kept_in[f] = e
                self.kept_bytes += int(allocs[fits].sum())
                self._held.setdefault(e, []).append(f)
                self.holds += len(f)
        for e in [e for e in self._held if e <= reader_epoch - 2]:
            for f in self._held.pop(e):
                self.expired += self._let_go(f[self.kept_in[f] == e], keep)

    def _let_go(self, files: np.ndarray, keep: Keep) -> int:
        files = np.unique(files)
        if files.size:
            keep(files, False)
            self.kept_in[files] = -1
            self.kept_bytes -= int(self._allocs(files).sum())
        return len(files)

    def report(self) -> dict[str, int]:
        return {"holds": self.holds, "handed": self.handed, "expired": self.expired,
                "over_budget": self.over_budget, "held": int((self.kept_in >= 0).sum()),
                "held_bytes": self.kept_bytes}


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
