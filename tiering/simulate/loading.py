"""Copies made by a storage class's own threads: bulk loads before or while
the training runs (NOTE [simulator]).

A class j has p_j threads; files are dealt to them round robin and each
thread reads its files one after the other.  Bulk loads from the PFS assume
all N nodes load at once (gamma = N) and do not count as stream reads."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .engine import INF
from .rates import Rates


class Held(dict[int, float]):
    """file -> value for the files a node holds; a file it does not hold reads as
    INF (no copy) without being added, so a node's table grows with its copies,
    not with the data set (NOTE [simulator], bounded per-node state)."""

    def __missing__(self, key: int) -> float:
        return INF


@dataclass
class LocalCopies:
    """avail[node][file] (INF: no copy) and inv[node][file] (s per MB), kept only
    for the files each node holds; used[node][class] in MB."""
    avail: list[Held]
    inv: list[Held]
    used: list[list[float]] = field(default_factory=list)

    @staticmethod
    def empty(nodes: int, classes: int) -> LocalCopies:
        return LocalCopies([Held() for _ in range(nodes)], [Held() for _ in range(nodes)],
                           [[0.0] * classes for _ in range(nodes)])

    def drop(self, node: int, f: int) -> None:
        self.avail[node].pop(f, None)
        self.inv[node].pop(f, None)


def thread_finish(durations: np.ndarray, threads: int, start: float = 0.0) -> np.ndarray:
    """When each of a sequence of reads dealt round robin to `threads` threads
    (all free at `start`) completes."""
    done = np.empty(len(durations))
    for k in range(threads):
        done[k::threads] = start + np.cumsum(durations[k::threads])
    return done


def pfs_bulk(sizes: np.ndarray, rates: Rates, threads: int, start: float = 0.0) -> np.ndarray:
    """Completion times of a bulk load of these files from the PFS by `threads`
    threads free from `start` on."""
    per = rates.copy_latency + sizes * (rates.pfs[rates.nodes] + rates.write)
    return thread_finish(per, threads, start)


def fill_by_capacity(order: np.ndarray, sizes: np.ndarray, capacity: float) -> int:
    """How many files of `order`, taken in turn, fit in `capacity` MB."""
    return int(np.searchsorted(np.cumsum(sizes[order]), capacity, side="right"))


def place(copies: LocalCopies, node: int, files: np.ndarray, avail: np.ndarray, inv: float, cls: int,
          sizes: np.ndarray) -> None:
    a, v = copies.avail[node], copies.inv[node]
    for f, t in zip(files.tolist(), avail.tolist()):
        a[f] = t
        v[f] = inv
    if copies.used:
        copies.used[node][cls] += float(sizes[files].sum())
