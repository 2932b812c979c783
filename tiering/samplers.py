"""Partial local shuffling (PLS): a sampler that keeps most of each rank's
samples on that rank from one epoch to the next, and the pure functions that
compute its orders (NOTE [partial local shuffling] in docs/design.md).

    from tiering.samplers import PartialLocalShuffleSampler
    sampler = PartialLocalShuffleSampler(dataset, fraction=0.3, seed=0)   # instead of DistributedSampler
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in DataLoader(dataset, sampler=sampler, batch_size=...): ...

The orders are defined here, not by torch: numpy's PCG64 generators seeded
through SeedSequence.  The functions need numpy only; torch is imported when
the class is first asked for (it is a torch.utils.data.Sampler when torch is
installed), never by tier-run, which computes the same orders from the same
functions.

The algorithm.  N samples, M ranks, k samples per rank, T = M * k slots:

* k and the padded list L are DistributedSampler's: k = ceil(N / M) and L
  the base list repeated from its start up to T entries; with drop_last and
  N % M != 0, k = floor(N / M) and L the first T entries of the base list.
  The base list is range(N) (partition="contiguous") or the permutation
  ``G(seed, 0).permutation(N)`` (partition="random").
* Slot (r, j), rank r in [0, M), column j in [0, k): at epoch 0 it holds
  ``L[r * k + j]``: rank r holds the r-th block of L.
* Before each epoch t >= 1 with 0 < Q < 1 and M > 1, m = floor(Q * k + 1/2)
  columns move: ``g = G(seed, 1, t)``, ``cols = g.permutation(k)[:m]``,
  ``d = g.integers(1, M, size=m)`` (in that order); in column cols[i] every
  rank's sample goes to rank (r + d[i]) mod M.  Every rank gives m samples
  and receives m, each to (from) a uniformly drawn other rank, and keeps
  its count.  So at epoch e slot (r, j) holds ``L[((r - A[j]) mod M) * k +
  j]`` with A[j] the sum of the offsets column j was given in epochs 1..e:
  epoch e is computed from (seed, e) directly, O(e * k) draws and O(k) per
  rank, whatever was read before (`column_offsets`).
* Q = 0 (or M = 1): nothing moves.  Q = 1: every epoch e >= 1 is a fresh
  uniform random balanced partition: slot s = r * k + j holds
  ``L[G(seed, 2, e).permutation(T)[s]]``.
* Rank r's order in epoch e: its slots' samples in column order (shuffle=False),
  or ``row[G(seed, 3, e, r).permutation(k)]`` (shuffle=True).

``G(seed, *key)`` is ``numpy.random.Generator(PCG64(SeedSequence(seed,
spawn_key=key)))``.  The samples of one column are rotated together: two
samples that start in one column are never on one rank (M - 1 of a sample's
N - 1 companions), the price of computing epoch e without epochs 1..e - 1.
The orders rest on numpy's Generator.permutation and Generator.integers:
the training and tier-run must use a numpy that draws them alike.
"""
from __future__ import annotations

import math
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

PARTITIONS = ("contiguous", "random")
DEFAULT_FRACTION = 0.3     # Q = 0.3 reached the accuracy of global shuffling in the PLS paper's runs
_INITIAL, _EXCHANGE, _FRESH, _SHUFFLE = 0, 1, 2, 3     # the spawn keys' first word: one stream per use


def _generator(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed), spawn_key=key)))


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check(n: int, num_replicas: int, rank: int, fraction: float, seed: int, partition: str,
          drop_last: bool = False) -> None:
    """ValueError with what is wrong, when the arguments describe no sampler."""
    if not _is_int(num_replicas) or num_replicas < 1:
        raise ValueError(f"num_replicas (the world size) must be an integer >= 1, not {num_replicas!r}")
    if not _is_int(rank) or not 0 <= rank < num_replicas:
        raise ValueError(f"rank {rank!r} is outside num_replicas {num_replicas}: ranks go from 0 to "
                         f"{num_replicas - 1}")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.floating)) \
            or not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be a number from 0 to 1 (the share of each rank's samples that "
                         f"moves to other ranks before each epoch), not {fraction!r}")
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {', '.join(map(repr, PARTITIONS))}, not {partition!r}")
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, not {seed!r}")
    if not _is_int(n) or n < 1:
        raise ValueError(f"the data set has {n!r} samples; the sampler needs at least one")
    if drop_last and n < num_replicas:
        raise ValueError(f"the data set has {n} samples, fewer than the {num_replicas} ranks: with "
                         "drop_last no rank gets a sample (leave drop_last off to pad instead)")


def _check_epoch(epoch: int) -> None:
    if not _is_int(epoch) or epoch < 0:
        raise ValueError(f"epoch must be an integer >= 0 (0 is the first epoch), not {epoch!r}")


def per_rank(n: int, num_replicas: int, drop_last: bool = False) -> int:
    """Samples per rank, DistributedSampler's num_samples in integers:
    ceil(n / M), or ceil((n - M) / M) with drop_last when M does not divide n."""
    if drop_last and n % num_replicas:
        return -((num_replicas - n) // num_replicas)
    return -(-n // num_replicas)


def moved_per_rank(k: int, num_replicas: int, fraction: float) -> int:
    """m: the samples each rank gives (and receives) before an epoch, Q * k rounded half up."""
    if num_replicas == 1:
        return 0
    return min(k, math.floor(float(fraction) * k + 0.5))


@lru_cache(maxsize=2)
def _base(seed: int, n: int, partition: str) -> np.ndarray:
    """range(n) or the seeded permutation of the random initial partition; read-only."""
    base = np.arange(n, dtype=np.int64) if partition == "contiguous" else _generator(seed, _INITIAL).permutation(n)
    base.setflags(write=False)
    return base


class _OffsetCache:
    """Column offsets A of recent epochs per (seed, M, k, m), so that epoch
    after epoch costs one epoch's draws, and a resumed epoch e its e epochs once."""

    def __init__(self, max_keys: int = 8, max_epochs: int = 4) -> None:
        self._known: OrderedDict[tuple[int, ...], OrderedDict[int, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self.max_keys, self.max_epochs = max_keys, max_epochs

    def nearest(self, key: tuple[int, ...], epoch: int) -> tuple[int, np.ndarray | None]:
        with self._lock:
            known = self._known.get(key)
            if not known:
                return 0, None
            self._known.move_to_end(key)
            below = [e for e in known if e <= epoch]
            return (max(below), known[max(below)]) if below else (0, None)

    def record(self, key: tuple[int, ...], epoch: int, offsets: np.ndarray) -> None:
        with self._lock:
            known = self._known.setdefault(key, OrderedDict())
            self._known.move_to_end(key)
            known[epoch] = offsets
            known.move_to_end(epoch)
            while len(known) > self.max_epochs:
                known.popitem(last=False)
            while len(self._known) > self.max_keys:
                self._known.popitem(last=False)


_OFFSETS = _OffsetCache()


def column_offsets(seed: int, num_replicas: int, k: int, m: int, epoch: int) -> np.ndarray:
    """A: how far (mod M) each column has been rotated by epochs 1..epoch (int64, k, read-only)."""
    key = (seed, num_replicas, k, m)
    start, known = _OFFSETS.nearest(key, epoch)
    if known is not None and start == epoch:
        return known
    offsets = np.zeros(k, np.int64) if known is None else known.copy()
    if m and num_replicas > 1:
        for t in range(start + 1, epoch + 1):
            g = _generator(seed, _EXCHANGE, t)
            cols = g.permutation(k)[:m]
            offsets[cols] += g.integers(1, num_replicas, size=m)
        offsets %= num_replicas
    offsets.setflags(write=False)
    _OFFSETS.record(key, epoch, offsets)
    return offsets


@lru_cache(maxsize=2)
def _fresh(seed: int, total: int, epoch: int) -> np.ndarray:
    """The slot permutation of a fresh partition (fraction 1); read-only."""
    perm = _generator(seed, _FRESH, epoch).permutation(total)
    perm.setflags(write=False)
    return perm


def partition_rows(seed: int, epoch: int, num_replicas: int, n: int, fraction: float,
                   partition: str = "contiguous", drop_last: bool = False,
                   ranks: list[int] | None = None) -> np.ndarray:
    """The samples of each of `ranks` (default: all) in epoch `epoch`, one
    row per rank in column order (int64, len(ranks) x k)."""
    check(n, num_replicas, 0, fraction, seed, partition, drop_last)
    _check_epoch(epoch)
    k = per_rank(n, num_replicas, drop_last)
    rows = np.arange(num_replicas, dtype=np.int64) if ranks is None else np.asarray(ranks, np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= num_replicas):
        raise ValueError(f"ranks {ranks} are not all within num_replicas {num_replicas}")
    cols = np.arange(k, dtype=np.int64)
    if fraction == 1 and epoch > 0 and num_replicas > 1:
        slots = _fresh(seed, num_replicas * k, epoch)[rows[:, None] * k + cols]
    else:
        a = column_offsets(seed, num_replicas, k, moved_per_rank(k, num_replicas, fraction), epoch)
        slots = (rows[:, None] - a) % num_replicas * k + cols
    return _base(seed, n, partition)[slots % n]       # slot s holds L[s] = base[s % n]


def rank_order(seed: int, epoch: int, num_replicas: int, rank: int, n: int, fraction: float,
               partition: str = "contiguous", drop_last: bool = False, shuffle: bool = True) -> np.ndarray:
    """What rank `rank` reads in epoch `epoch`, in order (int64): what
    PartialLocalShuffleSampler yields after set_epoch(epoch)."""
    check(n, num_replicas, rank, fraction, seed, partition, drop_last)
    row = partition_rows(seed, epoch, num_replicas, n, fraction, partition, drop_last, [rank])[0]
    if not shuffle:
        return row
    return row[_generator(seed, _SHUFFLE, epoch, rank).permutation(len(row))]


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """The world size and rank not given: torch.distributed's when a process
    group is initialised, else WORLD_SIZE and RANK, else 1 and 0."""
    torch = sys.modules.get("torch")       # no process group without torch imported
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        world, me = dist.get_world_size(), dist.get_rank()
    else:
        world, me = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0)
    return (world if num_replicas is None else num_replicas), (me if rank is None else rank)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer; give num_replicas "
                         "and rank instead") from None


class _PartialLocalShuffleSampler:
    """Partial local shuffling (NOTE [partial local shuffling]): like
    torch's DistributedSampler, each rank reads its own samples, but they
    stay on the rank from one epoch to the next except a share `fraction`
    that moves to other ranks before each epoch.  set_epoch(e) before each
    epoch, as with DistributedSampler; the order of an epoch depends on
    (seed, e, world size, data-set length, fraction, partition, drop_last)
    only, so resuming at epoch e reads what an uninterrupted run reads."""

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None,
                 fraction: float = DEFAULT_FRACTION, seed: int = 0, shuffle: bool = True, drop_last: bool = False,
                 partition: str = "contiguous") -> None:
        num_replicas, rank = _world(num_replicas, rank)
        n = len(dataset)
        check(n, num_replicas, rank, fraction, seed, partition, drop_last)
        self.dataset = dataset
        self.num_replicas, self.rank = num_replicas, rank
        self.fraction, self.seed, self.shuffle = float(fraction), int(seed), shuffle
        self.drop_last, self.partition = drop_last, partition
        self.epoch = 0
        self.num_samples = per_rank(n, num_replicas, drop_last)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        _check_epoch(epoch)
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def order(self, epoch: int | None = None) -> np.ndarray:
        """This rank's indices in `epoch` (default: the one set), as an int64 array."""
        return rank_order(self.seed, self.epoch if epoch is None else epoch, self.num_replicas, self.rank,
                          len(self.dataset), self.fraction, self.partition, self.drop_last, self.shuffle)

    def __iter__(self) -> Iterator[int]:
        return iter(self.order().tolist())


if TYPE_CHECKING:
    PartialLocalShuffleSampler = _PartialLocalShuffleSampler

_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    """PartialLocalShuffleSampler, made at the first ask: a
    torch.utils.data.Sampler when torch is installed, so that nothing else
    of this module imports torch."""
    global _CLASS
    if name != "PartialLocalShuffleSampler":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _CLASS is None:
        try:
            from torch.utils.data import Sampler
            bases: tuple[type, ...] = (_PartialLocalShuffleSampler, Sampler)
        except ImportError:
            bases = (_PartialLocalShuffleSampler,)
        _CLASS = type(name, bases, {"__module__": __name__, "__qualname__": name,
                                    "__doc__": _PartialLocalShuffleSampler.__doc__})
    return _CLASS


__all__ = ["DEFAULT_FRACTION", "PARTITIONS", "PartialLocalShuffleSampler", "check", "column_offsets", "moved_per_rank",
           "partition_rows", "per_rank", "rank_order"]
