"""The node-aware plan: which other node of a job holds a file now, computed
on every node without a message (NOTE [node-aware plan] in docs/design.md).

Every node computes every node's stream from the sampler's parameters
(DistributedSampler: the global shuffle split by rank; node n runs the ranks
n*L .. n*L+L-1 under block placement, as torchrun and Slurm place them) and
runs on it the planner that node's daemon runs (planner.py, with the
clairvoyant policy's capacities and window), its reader moving in lockstep
with this node's (same epoch, same offset in it: data-parallel ranks read
one batch per step).  The fetches and evictions of each simulated plan set
and clear that node's bit in one bit word per file ("held"); a second word
per file has the bit of each node that read the file while its plan held it
("read": the copy surely landed there).  Only those are asked; the copy
workers read the words without a lock.

When the other nodes' streams cannot be computed (the order is known only
from each node's hook, or an order file), there is no node-aware plan and no
peer fetch: ``plans_from_options`` returns None.
"""
from __future__ import annotations

import bisect
import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..catalog import Catalog, dataset_order
from .options import OrderOptions, _layout, _specs
from .planner import FETCH, Actions, Planner
from .policy import Clairvoyant
from .samplers import SamplerSpec, _batch_cut, _distributed_sizes, epoch_order_array, interleave, node_stream_array

MAX_NODES = 64   # one bit per node in a uint64 word per file

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
    ranks of all the nodes (each rank's sampler draws the same one)."""

    def __init__(self, spec: SamplerSpec, local_world: int, mapping: np.ndarray):
        self.spec, self.local_world, self.mapping = spec, local_world, mapping
        self._perm: tuple[int, np.ndarray] | None = None    # (epoch, its permutation)

    @property
    def nodes(self) -> int:
        return node_count(self.spec.num_replicas, self.local_world)

    def specs(self, node: int) -> list[SamplerSpec]:
        return [dataclasses.replace(self.spec, rank=r)
                for r in node_ranks(self.spec.num_replicas, self.local_world, node)]

    def __call__(self, node: int, epoch: int) -> np.ndarray:
        specs, n = self.specs(node), len(self.mapping)
        if self.spec.kind != "distributed":
            return self.mapping[node_stream_array(specs, n, epoch)]
        perm = self._permutation(epoch)
        per_rank, _ = _distributed_sizes(self.spec, n)
        steps = np.arange(per_rank, dtype=np.int64) * self.spec.num_replicas
        return self.mapping[interleave([_batch_cut(s, perm[(steps + s.rank) % n]) for s in specs])]

    def _permutation(self, epoch: int) -> np.ndarray:
        """The epoch's shuffle, as rank 0 of one replica sees it whole."""
        if self._perm is None or self._perm[0] != epoch:
            whole = SamplerSpec("distributed", seed=self.spec.seed, shuffle=self.spec.shuffle)
            self._perm = (epoch, epoch_order_array(whole, len(self.mapping), epoch))
        return self._perm[1]


def stream_time(policy: object) -> tuple[int, int] | None:
    """Where the clairvoyant policy's reader is: (epoch, offset in its
    stream of that epoch); None when it follows no order."""
    planner = getattr(policy, "planner", None)
    starts, epochs = getattr(policy, "epoch_starts", None), getattr(policy, "epochs", None)
    if planner is None or not starts or not epochs or not getattr(policy, "following", False):
        return None
    reader = int(planner.reader)
    k = max(0, bisect.bisect_right(starts, reader) - 1)
    return int(epochs[k]), reader - int(starts[k])


@dataclass
class _Peer:
    node: int
    bit: np.uint64
    planner: Planner
    epochs: list[int] = field(default_factory=list)   # epoch numbers made known, in order
    starts: list[int] = field(default_factory=list)   # stream position where each begins
    ends: list[int] = field(default_factory=list)


class NodePlans:
    """The plans of the other nodes of a job, following this node's reader."""

    ahead = Clairvoyant.ahead     # epochs known beyond the reader's, as the policy keeps them

    def __init__(self, streams: Streams, nodes: int, me: int, sizes: Sequence[int] | np.ndarray,
                 capacities: Sequence[int], window: int = 64, margin: float = Clairvoyant.margin,
                 epochs: int | None = None):
        if not 1 <= nodes <= MAX_NODES or not 0 <= me < nodes:
            raise ValueError(f"node {me} of {nodes}: the node-aware plan covers 1 to {MAX_NODES} nodes")
        self.streams, self.nodes, self.me = streams, nodes, me
        self.sizes = np.asarray(sizes, np.int64)
        self.capacities = [int(c * margin) for c in capacities]   # as Clairvoyant plans
        self.window = window
        self.epochs = epochs                                     # the run's epochs (None: no end)
        self._held = np.zeros(len(self.sizes), np.uint64)       # bit n: node n's plan holds the file
        self._read = np.zeros(len(self.sizes), np.uint64)       # bit n: and node n has read it since
        self._lock = threading.Lock()
        self._peers: list[_Peer] = []
        self._first: int | None = None                           # the epoch the plans began with
        self.time: tuple[int, int] | None = None                 # None: no answer (not following)
        self.resets = 0

    # -- following this node's reader ---------------------------------------------
    def follow(self, policy: object) -> None:
        """Called by the daemon's event thread after each batch of events."""
        self.move_to(stream_time(policy))

    def move_to(self, when: tuple[int, int] | None) -> None:
        """Moves every other node's reader to (epoch, offset); None: this node
        follows no order, so nothing is answered until it does again."""
        if when == self.time:
            return
        if when is None:
            self.time = None
            return
        epoch, offset = when
        with self._lock:
            if self._first is None or epoch < self._first or (self.time is not None and when < self.time):
                self._start(epoch)   # the first call, or this node planned anew from an earlier point
            for peer in self._peers:
                self._step(peer, epoch, offset)
            self.time = when

    def _start(self, epoch: int) -> None:
        self._first = epoch
        self._held[:] = 0
        self._read[:] = 0
        self.resets += 1
        self._peers = [_Peer(n, np.uint64(1) << np.uint64(n),
                             Planner(self.sizes, self.capacities, window=self.window))
                       for n in range(self.nodes) if n != self.me]
        for peer in self._peers:   # as the policy begins: the epochs known, then a first advance
            self._extend(peer, epoch)
            self._known(peer, epoch)
            self._apply(peer.bit, peer.planner.advance())

    def _extend(self, peer: _Peer, epoch: int) -> None:
        order = self.streams(peer.node, epoch)
        start = peer.planner.end
        peer.planner.extend(order)
        peer.epochs.append(epoch)
        peer.starts.append(start)
        peer.ends.append(start + len(order))

    def _known(self, peer: _Peer, epoch: int) -> None:
        """The epochs the policy knows when its reader is in `epoch`."""
        while peer.epochs[-1] < epoch + self.ahead and (self.epochs is None or peer.epochs[-1] + 1 < self.epochs):
            self._extend(peer, peer.epochs[-1] + 1)

    def _step(self, peer: _Peer, epoch: int, offset: int) -> None:
        self._known(peer, epoch)
        k = min(epoch - peer.epochs[0], len(peer.epochs) - 1)
        target = min(peer.starts[k] + offset, peer.ends[k])   # that node's epoch may be shorter
        p = peer.planner
        if target > p.reader:
            read = p.stream[p.reader - p.base:target - p.base].astype(np.int64)
            read = read[(self._held[read] & peer.bit) != 0]
            self._read[read] |= peer.bit
            p.consume_range(p.reader, target)
        self._apply(peer.bit, p.advance())

    def _apply(self, bit: np.uint64, acts: Actions) -> None:
        """Each file's last action of the batch decides whether the node holds it."""
        if not len(acts):
            return
        files, kinds = acts.file[::-1], acts.kind[::-1]
        uniq, last = np.unique(files, return_index=True)
        fetched = kinds[last] == FETCH
        self._read[uniq] &= ~bit   # evicted, or fetched anew: not read since
        self._held[uniq[fetched]] |= bit
        self._held[uniq[~fetched]] &= ~bit

    # -- answers (any thread) ----------------------------------------------------------
    def holders(self, f: int) -> list[int]:
        """The other nodes whose plan holds file f now."""
        return self._nodes(self._held, f)

    def readers(self, f: int) -> list[int]:
        """The other nodes whose plan holds file f now and that have read it
        since it was fetched there."""
        return self._nodes(self._read, f)

    def _nodes(self, words: np.ndarray, f: int) -> list[int]:
        if self.time is None:
            return []
        bits = int(words[f])
        return [n for n in range(self.nodes) if bits >> n & 1 and n != self.me]

    def holder(self, f: int) -> int | None:
        """The node to ask for f: the first reader after this node in rank
        order (so that the nodes ask different peers), None if no node has
        read f while its plan holds it (a copy only planned there may not
        have landed yet: the PFS is read)."""
        if self.time is None:
            return None
        bits = int(self._read[f])
        if not bits:
            return None
        for k in range(1, self.nodes):
            n = (self.me + k) % self.nodes
            if bits >> n & 1:
                return n
        return None

    def held(self, node: int) -> np.ndarray:
        """The files node's plan holds now (sorted)."""
        return np.flatnonzero(self._held & (np.uint64(1) << np.uint64(node)))


def plans_from_options(opts: OrderOptions, catalog: Catalog, nodes: int, node_rank: int,
                       capacities: Sequence[int], window: int = 64,
                       env: Mapping[str, str] | None = None) -> NodePlans | None:
    """The node-aware plan of a job whose sampler is given on the command line
    (``--sampler distributed``, world size and local world size from the
    launcher or the options); None when the other nodes' streams cannot be
    computed here (hook or order file: each node knows only its own order) or
    the ranks do not match the job's nodes."""
    if opts.sampler != "distributed" or opts.order_file is not None or nodes < 2:
        return None
    import os
    specs = _specs(opts, os.environ if env is None else env)
    world, local_world = specs[0].num_replicas, len(specs)
    if node_count(world, local_world) != nodes or specs[0].rank // local_world != node_rank:
        return None
    streams = NodeStreams(specs[0], local_world, np.asarray(dataset_order(catalog, _layout(opts)), np.int64))
    return NodePlans(streams, nodes, node_rank, [f.size for f in catalog.files], capacities, window,
                     epochs=opts.epochs)
