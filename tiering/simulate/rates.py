"""Seconds per MB of each way a byte can travel (NOTE [simulator]).

- compute:  s / c
- write:    s / min(beta, r_0(p_0) / p_0)   (preprocessing into the staging buffer,
            one of its p_0 threads' share of its bandwidth)
- PFS:      latency + s / min(b_fs, t(gamma) / gamma) with gamma concurrent clients
- class j:  s / r_j(p_j)                    (local)
- peer:     s / min(b_c, r_j(p_j))          (a copy another node holds)
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import SimConfig


@dataclass(frozen=True)
class Rates:
    nodes: int
    compute: float                 # s per MB
    write: float                   # s per MB
    pfs: tuple[float, ...]         # s per MB by gamma (index 0 unused)
    pfs_latency: float             # s per PFS read
    copy_latency: float            # s per PFS read of a copy (bulk loads, tier-run's copies)
    network: float                 # MB/s between nodes
    classes: tuple[float, ...]     # s per MB reading class j locally
    peers: tuple[float, ...]       # s per MB reading class j of a peer

    @staticmethod
    def of(cfg: SimConfig) -> Rates:
        s0 = cfg.storage[0]
        write_mb_s = min(cfg.preprocess_mb_s, s0.rate / s0.threads)
        pfs = [0.0] + [1.0 / min(cfg.pfs_link_mb_s, cfg.pfs(g) / g) for g in range(1, cfg.nodes + 1)]
        return Rates(cfg.nodes, 1.0 / cfg.compute_mb_s, 1.0 / write_mb_s, tuple(pfs), cfg.pfs_latency_ms / 1000,
                     (cfg.pfs_latency_ms if cfg.copy_latency_ms is None else cfg.copy_latency_ms) / 1000,
                     cfg.network_mb_s, tuple(1.0 / c.rate for c in cfg.storage),
                     tuple(1.0 / min(cfg.network_mb_s, c.rate) for c in cfg.storage))

    def pfs_read(self, size_mb: float, gamma: int) -> float:
        """Seconds to read a file from the PFS and preprocess it."""
        return self.pfs_latency + size_mb * (self.pfs[min(max(gamma, 1), self.nodes)] + self.write)
