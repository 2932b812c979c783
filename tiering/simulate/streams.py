"""Each node's access stream, cut into the global batches the nodes meet at.

From a seed, node i reads rank i's share of a DistributedSampler(seed) epoch
(slots i, i + N, ... of a global shuffle), in local batches of ceil(B / N);
or the streams are given (the real order of `tiering plan`'s options)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._deps import SamplerSpec, epoch_order
from .config import SimConfig


@dataclass
class Streams:
    files: list[np.ndarray]          # per node: catalog file ids, all epochs, in read order
    starts: list[np.ndarray]         # per node: batch b is files[i][starts[i][b]:starts[i][b + 1]]
    batch_epoch: np.ndarray          # epoch of each batch
    sizes: np.ndarray                # MB per catalog file id

    @property
    def nodes(self) -> int:
        return len(self.files)

    @property
    def batches(self) -> int:
        return len(self.batch_epoch)

    def replace_files(self, files: list[np.ndarray]) -> Streams:
        return Streams(files, self.starts, self.batch_epoch, self.sizes)


def file_sizes(cfg: SimConfig) -> np.ndarray:
    """MB per file: the given sizes, or a normal distribution of the config's
    mean and std redrawn where it falls to zero or below."""
    if cfg.files.sizes_mb is not None:
        return np.asarray(cfg.files.sizes_mb, dtype=np.float64)
    rng = np.random.default_rng(cfg.seed)
    n = cfg.files.count
    sizes = rng.normal(cfg.files.mean_mb, cfg.files.std_mb, n)
    bad = sizes <= 0
    while bad.any():
        sizes[bad] = rng.normal(cfg.files.mean_mb, cfg.files.std_mb, int(bad.sum()))
        bad = sizes <= 0
    return sizes


def _epoch_orders(cfg: SimConfig, n_files: int) -> list[list[np.ndarray]]:
    """orders[node][epoch]."""
    if cfg.orders is not None:
        if len(cfg.orders) != cfg.nodes:
            raise ValueError(f"{len(cfg.orders)} node streams given for {cfg.nodes} nodes")
        return [[np.asarray(e, dtype=np.int64) for e in node[:cfg.epochs]] for node in cfg.orders]
    out: list[list[np.ndarray]] = [[] for _ in range(cfg.nodes)]
    for i in range(cfg.nodes):
        spec = SamplerSpec(kind="distributed", seed=cfg.seed, num_replicas=cfg.nodes, rank=i)
        for e in range(cfg.epochs):
            out[i].append(np.asarray(epoch_order(spec, n_files, e), dtype=np.int64))
    return out


def build_streams(cfg: SimConfig, sizes: np.ndarray | None = None) -> Streams:
    sizes = file_sizes(cfg) if sizes is None else sizes
    orders = _epoch_orders(cfg, len(sizes))
    lb = cfg.local_batch
    files: list[list[np.ndarray]] = [[] for _ in range(cfg.nodes)]
    starts: list[list[int]] = [[0] for _ in range(cfg.nodes)]
    epoch_of: list[int] = []
    for e in range(min(len(o) for o in orders)):
        lengths = [len(o[e]) for o in orders]
        longest = max(lengths)
        nb = longest // lb if cfg.drop_last else -(-longest // lb)
        for i, o in enumerate(orders):
            take = o[e][: min(len(o[e]), nb * lb)]
            files[i].append(take)
            for b in range(nb):
                starts[i].append(starts[i][-1] + max(0, min(lb, len(take) - b * lb)))
        epoch_of.extend([e] * nb)
    return Streams([np.concatenate(f) if f else np.zeros(0, np.int64) for f in files],
                   [np.asarray(s, dtype=np.int64) for s in starts], np.asarray(epoch_of, dtype=np.int64), sizes)
