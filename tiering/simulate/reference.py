"""The I/O policies of the HDMLP study, as models over the engine
(NOTE [simulator]).  Each builds the engine's Pipeline: what is copied where
before or while the training runs, and where the staging threads may read.

Class 0 is the staging buffer; "the large class" is the last one, "memory"
is class 1 (the fastest class after the staging buffer)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import SimConfig
from .engine import INF, Pipeline, Shards
from .loading import LocalCopies, fill_by_capacity, pfs_bulk, place, thread_finish
from .rates import Rates
from .streams import Streams


class Unsupported(Exception):
    """The policy does not apply to this configuration (the message says why)."""


@dataclass
class Context:
    cfg: SimConfig
    streams: Streams
    rates: Rates

    @property
    def n_files(self) -> int:
        return len(self.streams.sizes)


@dataclass
class Built:
    pipeline: Pipeline
    bulk_pfs_mb: float = 0.0
    bulk_peer_mb: float = 0.0


def _need_classes(ctx: Context, k: int, name: str) -> None:
    if len(ctx.cfg.storage) < k + 1:
        raise Unsupported(f"{name} needs {k} storage class(es) after the staging buffer")


def staging_pool(ctx: Context) -> Built:
    """Fill the staging buffer from the PFS in stream order."""
    return Built(Pipeline(ctx.streams))


def _shard_ranges(ctx: Context) -> list[np.ndarray]:
    per = ctx.n_files // ctx.cfg.nodes
    return [np.arange(i * per, (i + 1) * per) for i in range(ctx.cfg.nodes)]


def _shards_of(ctx: Context, copies: LocalCopies, holders: list[np.ndarray], cls: int) -> Shards:
    owner = [-1] * ctx.n_files
    avail = [INF] * ctx.n_files
    for i, files in enumerate(holders):
        a = copies.avail[i]
        for f in files.tolist():
            owner[f] = i
            avail[f] = a[f]
    return Shards(owner, avail, [ctx.rates.peers[cls]] * ctx.n_files)


def _load_shards(ctx: Context, cls: int, shards: list[np.ndarray],
                 capacity_check: bool) -> tuple[LocalCopies, list[np.ndarray], float, float]:
    """Each node loads its shard from the PFS into class cls; returns the copies,
    what each node holds, the time the last node is done and the MB read."""
    sizes = ctx.streams.sizes
    copies = LocalCopies.empty(ctx.cfg.nodes, len(ctx.cfg.storage))
    held, done, mb = [], 0.0, 0.0
    threads = ctx.cfg.storage[cls].threads
    for i, files in enumerate(shards):
        if capacity_check:
            files = files[:fill_by_capacity(files, sizes, ctx.cfg.storage[cls].capacity_mb)]
        fin = pfs_bulk(sizes[files], ctx.rates, threads)
        place(copies, i, files, np.zeros(len(files)), ctx.rates.classes[cls], cls, sizes)
        held.append(files)
        done = max(done, float(fin.max(initial=0.0)))
        mb += float(sizes[files].sum())
    return copies, held, done, mb


def lbann(ctx: Context, preload: bool) -> Built:
    """LBANN's in-memory store: the data set is spread over the nodes' memory
    (class 1), each node holding 1/N; preloading loads it all before training,
    dynamic loading lets each node load the files of its own first epoch as
    they are read.  Staging threads read their own copy or a peer's."""
    _need_classes(ctx, 1, "lbann")
    cfg, sizes = ctx.cfg, ctx.streams.sizes
    if sizes.sum() > cfg.storage[1].capacity_mb * cfg.nodes:
        raise Unsupported("the data set does not fit in the nodes' memory (class 1) together")
    if preload:
        copies, held, done, mb = _load_shards(ctx, 1, _shard_ranges(ctx), capacity_check=False)
        shards = _shards_of(ctx, copies, held, 1)
        for s in range(len(shards.avail)):
            shards.avail[s] = 0.0 if shards.owner[s] >= 0 else INF
        return Built(Pipeline(ctx.streams, start=done, prefetch_pfs=False, prefetch_peer=True, local=copies,
                              shards=shards), bulk_pfs_mb=mb)
    per = ctx.n_files // cfg.nodes
    copies = LocalCopies.empty(cfg.nodes, len(cfg.storage))
    held, mb = [], 0.0
    for i in range(cfg.nodes):
        first = ctx.streams.files[i][:per]
        files, idx = np.unique(first, return_index=True)
        files = first[np.sort(idx)]
        fin = pfs_bulk(sizes[files], ctx.rates, cfg.storage[1].threads)
        place(copies, i, files, fin, ctx.rates.classes[1], 1, sizes)
        held.append(files)
        mb += float(sizes[files].sum())
    return Built(Pipeline(ctx.streams, prefetch_pfs=False, prefetch_peer=True, local=copies,
                          shards=_shards_of(ctx, copies, held, 1)), bulk_pfs_mb=mb)


def _deepio_holdings(ctx: Context) -> list[np.ndarray]:
    cfg, sizes = ctx.cfg, ctx.streams.sizes
    if sizes.sum() / cfg.nodes > cfg.storage[1].capacity_mb:
        # hybrid: each node caches what fits of a contiguous run of files
        out, start = [], 0
        for _ in range(cfg.nodes):
            k = fill_by_capacity(np.arange(start, ctx.n_files), sizes, cfg.storage[1].capacity_mb)
            out.append(np.arange(start, start + k))
            start += k
        return out
    per = ctx.n_files // cfg.nodes
    return [np.arange(i * per, (i + 1) * per if i < cfg.nodes - 1 else ctx.n_files) for i in range(cfg.nodes)]


def deepio(ctx: Context, opportunistic: bool, rng: np.random.Generator) -> Built:
    """DeepIO: each node caches a part of the data set in memory before
    training; ordered mode reads the stream as it is (from its own copy or a
    peer's, the PFS for what nobody caches), opportunistic mode replaces each
    access by a cached file (its own with probability 1/N, else a peer's)."""
    _need_classes(ctx, 1, "deepio")
    held = _deepio_holdings(ctx)
    copies, held, done, mb = _load_shards(ctx, 1, held, capacity_check=False)
    shards = _shards_of(ctx, copies, held, 1)
    streams = ctx.streams
    if opportunistic:
        n = ctx.cfg.nodes
        new = []
        for i, files in enumerate(streams.files):
            other = rng.integers(0, n - 1, len(files)) if n > 1 else np.zeros(len(files), np.int64)
            other = other + (other >= i)
            src = np.where(rng.random(len(files)) < 1.0 / n, i, other)
            counts = np.array([len(h) for h in held])
            pick = (rng.random(len(files)) * counts[src]).astype(np.int64)
            offsets = np.concatenate([[0], np.cumsum(counts)])
            pool = np.concatenate(held)
            new.append(pool[offsets[src] + pick])
        streams = streams.replace_files(new)
    return Built(Pipeline(streams, start=done, prefetch_pfs=False, prefetch_peer=True, local=copies,
                          shards=shards), bulk_pfs_mb=mb)


def parallel_staging(ctx: Context, rng: np.random.Generator) -> Built:
    """Parallel data staging: each node loads its 1/N of the files from the PFS
    into the large class, then copies from its peers as many other files as
    fit; training starts when every node is done and each node reads random
    files of its own copy."""
    _need_classes(ctx, 1, "parallel-staging")
    cfg, sizes, rates = ctx.cfg, ctx.streams.sizes, ctx.rates
    cls = len(cfg.storage) - 1
    st = cfg.storage[cls]
    copies = LocalCopies.empty(cfg.nodes, len(cfg.storage))
    held_all, done, pfs_mb, peer_mb = [], 0.0, 0.0, 0.0
    everything = np.arange(ctx.n_files)
    for i, own in enumerate(_shard_ranges(ctx)):
        own = own[:fill_by_capacity(own, sizes, st.capacity_mb)]
        fin = pfs_bulk(sizes[own], rates, st.threads)
        t_pfs = float(fin.max(initial=0.0))
        rest = np.setdiff1d(everything, own, assume_unique=True)
        room = st.capacity_mb - float(sizes[own].sum())
        rest = rest[:fill_by_capacity(rest, sizes, room)]
        peer_fin = thread_finish(sizes[rest] * (rates.peers[cls] + rates.write), st.threads, t_pfs)
        held = np.concatenate([own, rest])
        place(copies, i, held, np.zeros(len(held)), rates.classes[cls], cls, sizes)
        held_all.append(held)
        done = max(done, float(peer_fin.max(initial=t_pfs)))
        pfs_mb += float(sizes[own].sum())
        peer_mb += float(sizes[rest].sum())
    new = [held_all[i][rng.integers(0, max(len(held_all[i]), 1), len(f))] if len(held_all[i]) else f
           for i, f in enumerate(ctx.streams.files)]
    return Built(Pipeline(ctx.streams.replace_files(new), start=done, prefetch_pfs=False, local=copies),
                 bulk_pfs_mb=pfs_mb, bulk_peer_mb=peer_mb)


def locality_aware(ctx: Context) -> Built:
    """Locality-aware loading: each node loads its 1/N of the files into the
    large class before training; within each global batch the files are
    handed to the nodes holding them where possible."""
    _need_classes(ctx, 1, "locality-aware")
    cls = len(ctx.cfg.storage) - 1
    copies, held, done, mb = _load_shards(ctx, cls, _shard_ranges(ctx), capacity_check=True)
    shards = _shards_of(ctx, copies, held, cls)
    st = ctx.streams
    owner = np.full(ctx.n_files, -1)
    for i, h in enumerate(held):
        owner[h] = i
    new = [f.copy() for f in st.files]
    n = st.nodes
    for b in range(st.batches):
        parts = [st.files[i][st.starts[i][b]:st.starts[i][b + 1]] for i in range(n)]
        pool = np.concatenate(parts)
        own = owner[pool]
        taken = np.zeros(len(pool), dtype=bool)
        slots: list[list[int]] = [[] for _ in range(n)]
        for i, part in enumerate(parts):
            mine = np.flatnonzero((own == i) & ~taken)[:len(part)]
            taken[mine] = True
            slots[i] = pool[mine].tolist()
        left = pool[~taken].tolist()
        for i, part in enumerate(parts):
            need = len(part) - len(slots[i])
            slots[i].extend(left[:need])
            del left[:need]
            new[i][st.starts[i][b]:st.starts[i][b + 1]] = slots[i]
    return Built(Pipeline(st.replace_files(new), start=done, prefetch_pfs=True, prefetch_peer=True,
                          wait_for_peer=True, local=copies, shards=shards), bulk_pfs_mb=mb)


def hdmlp(ctx: Context) -> Built:
    """HDMLP: each node ranks the files by how often it will read them (ties by
    first use), fills its classes 1.. with the most frequent ones from the PFS
    (each class with its own threads, in order of first use within the share
    of each class) while training runs, and fills the staging buffer from the
    fastest class that holds a complete copy, else from the PFS."""
    _need_classes(ctx, 1, "hdmlp")
    cfg, sizes, rates = ctx.cfg, ctx.streams.sizes, ctx.rates
    copies = LocalCopies.empty(cfg.nodes, len(cfg.storage))
    mb = 0.0
    caps = [c.capacity_mb for c in cfg.storage]
    for i, stream in enumerate(ctx.streams.files):
        counts = np.bincount(stream, minlength=ctx.n_files)
        first = np.full(ctx.n_files, len(stream))
        first[stream[::-1]] = np.arange(len(stream) - 1, -1, -1)
        ranked = np.lexsort((np.arange(ctx.n_files), -counts))
        # within each class's share, in order of first use
        start = 0
        for cap in caps:
            k = min(len(ranked), start + fill_by_capacity(ranked[start:], sizes, cap) + 1)
            seg = ranked[start:k]
            ranked[start:k] = seg[np.argsort(first[seg], kind="stable")]
            start = k
        start = 0
        for j in range(1, len(caps)):
            k = fill_by_capacity(ranked[start:], sizes, caps[j])
            files = ranked[start:start + k]
            fin = pfs_bulk(sizes[files], rates, cfg.storage[j].threads)
            place(copies, i, files, fin, rates.classes[j], j, sizes)
            mb += float(sizes[files].sum())
            start += k
    return Built(Pipeline(ctx.streams, local=copies), bulk_pfs_mb=mb)
