"""The discrete-event core: N nodes read their streams batch by batch, through
a staging buffer that p_0 threads fill in stream order (NOTE [simulator]).

Time of consuming a file at node i:
    t_i(f) = max(ready_i(f), t_i(f-1) + s(f-1) / c),   every node waits for all
at the end of each global batch.  ready is the staging buffer's copy, or the
node's own read at request time when that is sooner (from a local class
holding the file, a peer holding it, or the PFS).  A staging thread starts a
file when it is free and the buffer has room (room frees when the reader takes
a file); it reads from the fastest local class holding the file, else a peer,
else the PFS, as the policy allows.

PFS clients: nodes are simulated one after the other within a batch, and a
read starting at time tau counts as its clients the reading node and every
other node whose latest stream read from the PFS (the last one simulated)
starts at or after tau.  This is the reference simulator's rule; it is
what the published results were computed with."""
from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .rates import Rates
from .streams import Streams

INF = float("inf")


class Holdings(Protocol):
    """Where copies are: per node, per file, the time the copy is complete (INF:
    none) and seconds per MB to read it."""
    @property
    def avail(self) -> Sequence[Mapping[int, float]]: ...   # avail[node][file]

    @property
    def inv(self) -> Sequence[Mapping[int, float]]: ...     # inv[node][file]


@dataclass
class Shards:
    """One owner per file (a peer's copy)."""
    owner: list[int]
    avail: list[float]
    inv: list[float]              # s per MB from the owner, network included


@dataclass
class Pipeline:
    """What a policy asks of the engine."""
    streams: Streams
    start: float = 0.0                       # the nodes start after this (initial loading)
    staging: bool = True                     # fill a staging buffer ahead of the reader
    prefetch_pfs: bool = True                # staging threads may read the PFS
    prefetch_peer: bool = False              # staging threads may read a peer's copy
    wait_for_peer: bool = False              # ... and stop ahead of one not complete yet
    demand_pfs: bool = True
    local: Holdings | None = None
    shards: Shards | None = None
    on_pfs_read: Callable[[int, int, float], None] | None = None      # (node, file, time)
    on_access: Callable[[int, int, int, float], None] | None = None   # (node, position, file, time)
    # the node opens a position: a staging thread starts on it, or the reader reads it itself
    on_open: Callable[[int, int, int, float], None] | None = None     # (node, position, file, time)


@dataclass
class Outcome:
    barriers: np.ndarray                     # end of each batch (s)
    pfs_mb: float = 0.0
    peer_mb: float = 0.0
    local_mb: float = 0.0
    stall_s: list[float] = field(default_factory=list)


class Frontier:
    """The start of each node's latest stream read from the PFS (in simulation
    order), kept sorted for counting."""

    def __init__(self, nodes: int):
        self.front = [-INF] * nodes
        self.sorted = [-INF] * nodes

    def clients(self, node: int, tau: float) -> int:
        n = len(self.sorted) - bisect.bisect_left(self.sorted, tau)
        return 1 + n - (self.front[node] >= tau)

    def record(self, node: int, tau: float) -> None:
        old = self.front[node]
        if tau == old:
            return
        s = self.sorted
        del s[bisect.bisect_left(s, old)]
        bisect.insort(s, tau)
        self.front[node] = tau


def run(p: Pipeline, rates: Rates, staging_mb: float, staging_threads: int) -> Outcome:
    st = p.streams
    n = st.nodes
    size = st.sizes.tolist()
    files = [f.tolist() for f in st.files]
    starts = [s.tolist() for s in st.starts]
    cinv, winv, pfs_inv, lat = rates.compute, rates.write, rates.pfs, rates.pfs_latency
    fr = Frontier(n)
    avail = [[INF] * len(f) for f in files]      # staging buffer copy of each position
    head = [0] * n                               # first position still in the buffer
    tail = [0] * n                               # next position to prefetch
    used = [0.0] * n
    threads = [[p.start] * staging_threads for _ in range(n)]
    rr = [0] * n
    loc_av = p.local.avail if p.local is not None else None
    loc_inv = p.local.inv if p.local is not None else None
    sh = p.shards
    on_pfs, on_access, on_open = p.on_pfs_read, p.on_access, p.on_open
    opened = [0] * n                             # positions opened so far (on_open)
    mb = [0.0, 0.0, 0.0]                         # read from the PFS, peers, local classes

    def fill(i: int, r: float) -> None:
        """The staging threads of node i, free from time r on, fetch ahead while there is room."""
        fl, av, thr = files[i], avail[i], threads[i]
        la, li = (loc_av[i], loc_inv[i]) if loc_av is not None and loc_inv is not None else (None, None)
        tl, u, k = tail[i], used[i], rr[i]
        end_pos = len(fl)
        for q in range(staging_threads):
            if thr[q] < r:
                thr[q] = r
        while tl < end_pos:
            fq = fl[tl]
            sq = size[fq]
            if u + sq > staging_mb:
                break
            start = thr[k]
            if on_open is not None and tl >= opened[i]:
                on_open(i, tl, fq, start)
                opened[i] = tl + 1
            # the fastest copy, whenever it is complete
            c_av, c_inv, c_src = INF, 0.0, -1
            if la is not None and li is not None and la[fq] < INF:
                c_av, c_inv, c_src = la[fq], li[fq], 2
            if p.prefetch_peer and sh is not None and sh.owner[fq] != i and sh.avail[fq] < INF \
                    and (c_src < 0 or c_inv > sh.inv[fq]):
                if sh.avail[fq] > start and p.wait_for_peer:
                    break
                c_av, c_inv, c_src = sh.avail[fq], sh.inv[fq], 1
            if p.prefetch_pfs:
                x = lat + sq * pfs_inv[min(fr.clients(i, start), n)]
                if c_src < 0 or c_av > start or x < sq * c_inv:
                    c_src = 0
            if c_src == 0:
                done = start + x + sq * winv
                fr.record(i, start)
                mb[0] += sq
                if on_pfs is not None:
                    on_pfs(i, fq, start)
            elif c_src > 0:
                done = (c_av if c_av > start else start) + sq * (c_inv + winv)
                mb[c_src] += sq
            else:
                tl += 1          # nowhere to read it from ahead: the reader will
                continue
            av[tl] = done
            thr[k] = done
            u += sq
            tl += 1
            k += 1
            if k == staging_threads:
                k = 0
        tail[i], used[i], rr[i] = tl, u, k

    if p.staging:
        for i in range(n):
            fill(i, p.start)
    g = p.start
    barriers = np.empty(st.batches)
    for b in range(st.batches):
        gmax = g
        for i in range(n):
            fl, av = files[i], avail[i]
            la, li = (loc_av[i], loc_inv[i]) if loc_av is not None and loc_inv is not None else (None, None)
            t = g
            for pos in range(starts[i][b], starts[i][b + 1]):
                f = fl[pos]
                s = size[f]
                if on_open is not None and pos >= opened[i]:
                    on_open(i, pos, f, t)
                    opened[i] = pos + 1
                a = av[pos]
                if a <= t:
                    r = t
                else:
                    # the node's own read now: local copy, peer copy or the PFS
                    src = 0
                    best = INF
                    if p.demand_pfs:
                        best = lat + s * pfs_inv[min(fr.clients(i, t), n)]
                    if la is not None and li is not None and la[f] <= t:
                        x = s * li[f]
                        if x < best:
                            best, src = x, 2
                    if sh is not None and sh.owner[f] != i and sh.avail[f] <= t:
                        x = s * sh.inv[f]
                        if x < best:
                            best, src = x, 1
                    d = t + best + s * winv
                    if d < a:
                        r = d
                        mb[src] += s
                        if src == 0:
                            fr.record(i, t)
                            if on_pfs is not None:
                                on_pfs(i, f, t)
                    else:
                        r = a
                if on_access is not None:
                    on_access(i, pos, f, r)
                t = r + s * cinv
                # the reader took this position: its room is free again
                h, tl = head[i], tail[i]
                u = used[i]
                while h <= pos:
                    if h < tl:
                        u -= size[fl[h]]
                    h += 1
                head[i], used[i] = h, u
                if tl <= pos:
                    tail[i] = pos + 1
                if p.staging:
                    fill(i, r)
            if t > gmax:
                gmax = t
        g = gmax
        barriers[b] = g
    return Outcome(barriers, mb[0], mb[1], mb[2])
