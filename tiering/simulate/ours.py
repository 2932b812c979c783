"""tier-run's placement policies as models over the engine (NOTE [simulator]).

The staging buffer stands for the training's own loader (its workers read
ahead); tier-run decides what sits in the local classes 1.. and when:

- first-touch: the first PFS read of a file by a node queues a copy into the
  fastest class with room; nothing is evicted.
- lru: the same, evicting the least recently read copies when full.
- stage: every file that fits is copied at start, in catalog order.
- clairvoyant: the copies and evictions of tier-run's own planner
  (planner.simulate over the node's stream, the same code and window), issued
  when the node opens the position the plan took them at: tier-run follows the
  opens, which the loader's read-ahead (the staging buffer) makes ahead of
  the consumption.
- clairvoyant-peer: the same plans on every node; a node reads a file a peer's
  plan holds (copy complete) from that peer instead of the PFS.

Copies are read by the receiving class's threads (round robin), or, with
`copy_threads`, by one pool of that many threads for all classes (tier-run's
PFS semaphore, pfs.read_threads), from the PFS as loads (gamma = N, latency
`copy_latency_ms`) or from a peer, and written at the class's bandwidth.  The
threads are free from -head_start_s on: stage's copies run while the reader
starts up.

lru is tier-run's: a file read from the PFS goes to the first class it can
fit in at all, evicting that class's least recently read copies; the slower
classes are used only for files larger than the faster ones."""
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
        t0 = -cfg.head_start_s
        self.rr = [[0] * len(cfg.storage) for _ in range(cfg.nodes)]
        if cfg.copy_threads:   # every class of a node shares one list: the pool
            pool = [[t0] * cfg.copy_threads for _ in range(cfg.nodes)]
            self.threads = [[pool[i]] * len(cfg.storage) for i in range(cfg.nodes)]
        else:
            self.threads = [[[t0] * c.threads for c in cfg.storage] for _ in range(cfg.nodes)]

    def _thread(self, node: int, cls: int) -> tuple[list[float], int]:
        """The thread list a copy into cls uses and the index of the one that takes it:
        the earliest free of the shared pool, or the class's threads round robin."""
        thr = self.threads[node][cls]
        if self.ctx.cfg.copy_threads:
            return thr, min(range(len(thr)), key=thr.__getitem__)
        k = self.rr[node][cls]
        self.rr[node][cls] = (k + 1) % len(thr)
        return thr, k

    def copy(self, node: int, f: int, cls: int, t: float) -> None:
        """Queues a copy of f into class cls of node at time t."""
        rates, s = self.ctx.rates, float(self.ctx.streams.sizes[f])
        thr, k = self._thread(node, cls)
        start = max(thr[k], t)
        sh = self.shards
        if sh is not None and sh.owner[f] >= 0 and sh.owner[f] != node and sh.avail[f] <= start:
            done = start + s * (sh.inv[f] + rates.classes[cls])
            if self.built is not None:
                self.built.bulk_peer_mb += s
        else:
            done = start + rates.copy_latency + s * (rates.pfs[rates.nodes] + rates.classes[cls])
            if self.built is not None:
                self.built.bulk_pfs_mb += s
        thr[k] = done
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
        self.copies.drop(node, f)
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

    def evict_for(self, node: int, size: float, recent: list[OrderedDict[int, None]]) -> int | None:
        """tier-run's lru: the first class the file can fit in at all, its least
        recently read copies (recent[class]) evicted until it does."""
        for j in range(1, len(self.ctx.cfg.storage)):
            cap = self.ctx.cfg.storage[j].capacity_mb
            if size > cap:
                continue
            lru = recent[j]
            while self.copies.used[node][j] + size > cap and lru:
                victim, _ = lru.popitem(last=False)
                self.drop(node, victim)
            if self.copies.used[node][j] + size <= cap:
                return j
        return None


def first_touch(ctx: Context, evict: bool) -> Built:
    _need_classes(ctx, 1, "first-touch")
    cfg, sizes = ctx.cfg, ctx.streams.sizes
    copies = LocalCopies.empty(cfg.nodes, len(cfg.storage))
    cp = Copier(ctx, copies)
    # per node, per class: the copies, least recently read first
    recent = [[OrderedDict[int, None]() for _ in cfg.storage] for _ in range(cfg.nodes)]

    def on_pfs(i: int, f: int, t: float) -> None:
        if f in cp.where[i]:
            return
        s = float(sizes[f])
        j = cp.evict_for(i, s, recent[i]) if evict else cp.room(i, s)
        if j is None:
            return
        if evict:
            recent[i][j][f] = None
        cp.copy(i, f, j, t)

    def on_access(i: int, pos: int, f: int, t: float) -> None:
        j = cp.where[i].get(f)
        if j is not None:
            recent[i][j].move_to_end(f)

    built = Built(Pipeline(ctx.streams, local=copies, on_pfs_read=on_pfs, on_access=on_access if evict else None))
    cp.built = built
    return built


def stage(ctx: Context) -> Built:
    _need_classes(ctx, 1, "stage")
    cfg, sizes = ctx.cfg, ctx.streams.sizes
    copies = LocalCopies.empty(cfg.nodes, len(cfg.storage))
    order = np.arange(ctx.n_files)
    mb = 0.0
    t0 = -cfg.head_start_s
    for i in range(cfg.nodes):
        start = 0
        parts = []
        for j in range(1, len(cfg.storage)):
            k = fill_by_capacity(order[start:], sizes, cfg.storage[j].capacity_mb)
            parts.append((j, order[start:start + k]))
            start += k
        if cfg.copy_threads:   # one pool, the files in catalog order
            fin = pfs_bulk(sizes[np.concatenate([f for _, f in parts])], ctx.rates, cfg.copy_threads, start=t0)
            cuts = np.cumsum([0] + [len(f) for _, f in parts])
            fins = [fin[cuts[k]:cuts[k + 1]] for k in range(len(parts))]
        else:
            fins = [pfs_bulk(sizes[f], ctx.rates, cfg.storage[j].threads, start=t0) for j, f in parts]
        for (j, files), fin in zip(parts, fins):
            place(copies, i, files, fin, ctx.rates.classes[j], j, sizes)
            mb += float(sizes[files].sum())
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
    copies = LocalCopies.empty(cfg.nodes, len(cfg.storage))
    shards = Shards([-1] * ctx.n_files, [INF] * ctx.n_files, [INF] * ctx.n_files) if peers else None
    cp = Copier(ctx, copies, shards=shards)
    plans = _plans(ctx)
    nxt = [0] * cfg.nodes

    def on_open(i: int, pos: int, f: int, t: float) -> None:
        plan, k = plans[i], nxt[i]
        while k < len(plan) and plan[k][0] <= pos + 1:
            _, kind, g, cls = plan[k]
            if kind == "fetch":
                cp.copy(i, g, cls, t)
            else:
                cp.drop(i, g)
            k += 1
        nxt[i] = k

    built = Built(Pipeline(ctx.streams, local=copies, shards=shards, prefetch_peer=peers, on_open=on_open))
    cp.built = built
    return built
