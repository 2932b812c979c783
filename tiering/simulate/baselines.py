"""The two policies without a staging buffer, computed a batch position at a
time over all batches at once (NOTE [simulator]):

- lower-bound: every file is ready when asked for; a batch lasts as long as
  the node with the most compute in it.
- naive: every access reads the PFS at request time.  Within a batch node i
  counts as PFS clients itself and the nodes simulated before it that are
  still reading (the engine's client rule, which this reproduces exactly)."""
from __future__ import annotations

import numpy as np

from .engine import Outcome
from .rates import Rates
from .streams import Streams


def _grid(st: Streams) -> tuple[np.ndarray, np.ndarray]:
    """Sizes as [node, batch, slot] (padded with zeros to the longest batch)
    and a mask of the real slots."""
    lb = max(int(np.diff(s).max(initial=0)) for s in st.starts)
    grid = np.zeros((st.nodes, st.batches, lb))
    mask = np.zeros((st.nodes, st.batches, lb), dtype=bool)
    for i in range(st.nodes):
        lens = np.diff(st.starts[i])
        sizes = st.sizes[st.files[i]]
        rows = np.repeat(np.arange(st.batches), lens)
        cols = np.arange(len(sizes)) - np.repeat(st.starts[i][:-1], lens)
        grid[i, rows, cols] = sizes
        mask[i, rows, cols] = True
    return grid, mask


def lower_bound(st: Streams, rates: Rates) -> Outcome:
    grid, _ = _grid(st)
    per_batch = (grid.sum(axis=2) * rates.compute).max(axis=0)
    return Outcome(np.cumsum(per_batch))


def naive(st: Streams, rates: Rates) -> Outcome:
    grid, mask = _grid(st)
    n, nb, lb = grid.shape
    pfs = np.asarray(rates.pfs)
    last = np.full((n, nb), -np.inf)        # latest PFS read start of each node in each batch
    span = np.zeros((n, nb))                # each node's time in each batch
    for i in range(n):
        t = np.zeros(nb)
        for j in range(lb):
            s = grid[i, :, j]
            live = mask[i, :, j]
            gamma = 1 + (last[:i] >= t).sum(axis=0)
            d = rates.pfs_latency + s * (pfs[np.minimum(gamma, n)] + rates.write + rates.compute)
            last[i] = np.where(live, t, last[i])
            t = t + np.where(live, d, 0.0)
        span[i] = t
    out = Outcome(np.cumsum(span.max(axis=0)))
    out.pfs_mb = float(grid.sum())
    return out
