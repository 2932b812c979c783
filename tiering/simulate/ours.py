"""tier-run's placement policies as models over the engine (NOTE [simulator]).

The staging buffer stands for the training's own loader (its workers read
ahead); tier-run decides what sits in the local classes 1.. and when:

- first-touch: the first PFS read of a file by a node queues a copy into the
  fastest class with room; nothing is evicted.
- lru: the same, evicting the least recently read copies when full.
- stage: every file that fits is copied at start, in catalog order.
- clairvoyant: the copies and evictions of tier-run's own planner
  (planner.simulate over the node's stream, the same code and window), issued
  when the reader reaches the position the plan took them at.
- clairvoyant-peer: the same plans on every node; a node reads a file a peer's
  plan holds (copy complete) from that peer instead of the PFS.

Copies are read by the receiving class's threads (round robin), from the PFS
as loads (gamma = N) or from a peer, and written at the class's bandwidth."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ._deps import plan_simulate
from .engine import INF, Pipeline, Shards
from .loading import LocalCopies, fill_by_capacity, pfs_bulk, place
from .reference import Built, Context, _need_classes

PLAN_WINDOW = 64           # tier-run's default --window


@dataclass
class Copier:
    """The copy threads of every node's classes 1.. and what they read."""
    ctx: Context
    copies: LocalCopies
    built: Built | None = None
    threads: list[list[list[float]]] = field(default_factory=list)   # [node][class][thread]
    rr: list[list[int]] = field(default_factory=list)
    shards: Shards | None = None                                     # where peers hold copies
    holders: dict[int, set[int]] = field(default_factory=dict)
    where: list[dict[int, int]] = field(default_factory=list)       # [node]: file -> class

    def __post_init__(self) -> None:
        cfg = self.ctx.cfg
        self.where = [{} for _ in range(cfg.nodes)]
        self.threads = [[[0.0] * c.threads for c in cfg.storage] for _ in range(cfg.nodes)]
        self.rr = [[0] * len(cfg.storage) for _ in range(cfg.nodes)]

    def copy(self, node: int, f: int, cls: int, t: float) -> None:
        """Queues a copy of f into class cls of node at time t."""
        rates, s = self.ctx.rates, float(self.ctx.streams.sizes[f])
        thr, k = self.threads[node][cls], self.rr[node][cls]
        start = max(thr[k], t)
        sh = self.shards
        if sh is not None and sh.owner[f] >= 0 and sh.owner[f] != node and sh.avail[f] <= start:
            done = start + s * (sh.inv[f] + rates.classes[cls])
            if self.built is not None:
                self.built.bulk_peer_mb += s
        else:
            done = start + rates.pfs_latency + s * (rates.pfs[rates.nodes] + rates.classes[cls])
            if self.built is not None:
                self.built.bulk_pfs_mb += s
        thr[k] = done
        self.rr[node][cls] = (k + 1) % len(thr)
        self.copies.avail[node][f] = done
        self.copies.inv[node][f] = rates.classes[cls]
        self.copies.used[node][cls] += s
        self.where[node][f] = cls
        if sh is not None:
            self.holders.setdefault(f, set()).add(node)
            if sh.owner[f] < 0:
                sh.owner[f], sh.avail[f], sh.inv[f] = node, done, self.ctx.rates.peers[cls]

    def drop(self, node: int, f: int) -> None:
        cls = self.where[node].pop(f)
        self.copies.avail[node][f] = INF
        self.copies.used[node][cls] -= float(self.ctx.streams.sizes[f])
        sh = self.shards
        if sh is None:
            return
        others = self.holders.get(f, set())
        others.discard(node)
        if sh.owner[f] == node:
            if others:
                k = next(iter(others))
                sh.owner[f], sh.avail[f] = k, self.copies.avail[k][f]
                sh.inv[f] = self.ctx.rates.peers[self.where[k][f]]
            else:
                sh.owner[f], sh.avail[f] = -1, INF

    def room(self, node: int, size: float) -> int | None:
        for j in range(1, len(self.ctx.cfg.storage)):
            if self.copies.used[node][j] + size <= self.ctx.cfg.storage[j].capacity_mb:
                return j
        return None


def first_touch(ctx: Context, evict: bool) -> Built:
    _need_classes(ctx, 1, "first-touch")
    cfg, sizes = ctx.cfg, ctx.streams.sizes
    copies = LocalCopies.empty(cfg.nodes, ctx.n_files, len(cfg.storage))
    cp = Copier(ctx, copies)
    recent: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(cfg.nodes)]
    biggest = max(c.capacity_mb for c in cfg.storage[1:])

    def on_pfs(i: int, f: int, t: float) -> None:
        if f in cp.where[i]:
            return
        s = float(sizes[f])
        j = cp.room(i, s)
        while j is None and evict and recent[i] and s <= biggest:
            victim, _ = recent[i].popitem(last=False)
            cp.drop(i, victim)
            j = cp.room(i, s)
        if j is None:
            return
        if evict:
            recent[i][f] = None
        cp.copy(i, f, j, t)

    def on_access(i: int, pos: int, f: int, t: float) -> None:
        if f in recent[i]:
            recent[i].move_to_end(f)

    built = Built(Pipeline(ctx.streams, local=copies, on_pfs_read=on_pfs, on_access=on_access if evict else None))
    cp.built = built
    return built


def stage(ctx: Context) -> Built:
    _need_classes(ctx, 1, "stage")
    cfg, sizes = ctx.cfg, ctx.streams.sizes
    copies = LocalCopies.empty(cfg.nodes, ctx.n_files, len(cfg.storage))
    order = np.arange(ctx.n_files)
    mb = 0.0
    for i in range(cfg.nodes):
        start = 0
        for j in range(1, len(cfg.storage)):
            k = fill_by_capacity(order[start:], sizes, cfg.storage[j].capacity_mb)
            files = order[start:start + k]
            fin = pfs_bulk(sizes[files], ctx.rates, cfg.storage[j].threads)
            place(copies, i, files, fin, ctx.rates.classes[j], j, sizes)
            mb += float(sizes[files].sum())
            start += k
    return Built(Pipeline(ctx.streams, local=copies), bulk_pfs_mb=mb)


def _plans(ctx: Context) -> list[list[tuple[int, str, int, int]]]:
    """Per node, the planner's actions as (position, kind, file, class)."""
    st, cfg = ctx.streams, ctx.cfg
    size_bytes = [max(1, round(s * 1_000_000)) for s in st.sizes.tolist()]
    caps = [round(c.capacity_mb * 1_000_000) for c in cfg.storage[1:]]
    out = []
    for i in range(st.nodes):
        bounds = st.starts[i][np.searchsorted(st.batch_epoch, np.arange(int(st.batch_epoch.max()) + 2))]
        files = st.files[i]
        epochs = [files[bounds[e]:bounds[e + 1]].tolist() for e in range(len(bounds) - 1)]
        _, schedule = plan_simulate(epochs, size_bytes, caps, window=PLAN_WINDOW)
        out.append([(a.position, a.kind, a.file, a.tier + 1) for a in schedule])
    return out


def clairvoyant(ctx: Context, peers: bool) -> Built:
    _need_classes(ctx, 1, "clairvoyant")
    cfg = ctx.cfg
    copies = LocalCopies.empty(cfg.nodes, ctx.n_files, len(cfg.storage))
    shards = Shards([-1] * ctx.n_files, [INF] * ctx.n_files, [INF] * ctx.n_files) if peers else None
    cp = Copier(ctx, copies, shards=shards)
    plans = _plans(ctx)
    nxt = [0] * cfg.nodes

    def on_access(i: int, pos: int, f: int, t: float) -> None:
        plan, k = plans[i], nxt[i]
        while k < len(plan) and plan[k][0] <= pos + 1:
            _, kind, g, cls = plan[k]
            if kind == "fetch":
                cp.copy(i, g, cls, t)
            else:
                cp.drop(i, g)
            k += 1
        nxt[i] = k

    built = Built(Pipeline(ctx.streams, local=copies, shards=shards, prefetch_peer=peers, on_access=on_access))
    cp.built = built
    return built
