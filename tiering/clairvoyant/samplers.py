"""The access stream, reproduced not guessed: for each epoch, the data-set indices the
training reads, in order.

PyTorch samplers reproduced bit for bit by making the same draws on the same generator:
replayed without torch by torchrng.py for the versions of torch whose algorithms it
reproduces (NOTE [torch replay] in docs/design.md), by torch's own operations on a
torch.Generator for any other.  Order files are read in orderfile.py, the ranks a
launcher (torchrun, Slurm) announces in launcher.py.

torch is imported only when a shuffled order is asked for and the installed version
is not one torchrng.py replays (torch is not a core dependency of tiering); the torch
installed here must be the training's version, since the permutation algorithm behind
torch.randperm is what is being reproduced.

How torch 2.13.0 (CPU generator, mt19937) consumes random numbers -- read in
torch/utils/data/{sampler,distributed,dataloader}.py and checked against the real
classes by tests/test_order.py:

* RandomSampler.__iter__ is a Python generator: nothing is drawn until the first index
  is asked for. With generator=None it seeds a fresh generator from the *global* RNG
  every epoch (unknowable here: spec.seed None -> OrderError).
* Without replacement it yields num_samples // n full torch.randperm(n) and then ALWAYS
  draws one more torch.randperm(n), of which it yields the first num_samples % n.
  With the default num_samples == n that last permutation is drawn and thrown away:
  every epoch consumes two permutations. It is drawn when the consumer asks for the
  element after the last one (a for loop, BatchSampler with or without drop_last, and
  the DataLoader all do); a training that breaks out of an epoch early does not draw it.
* With replacement it draws torch.randint(high=n, size=(32,)) num_samples // 32 times,
  then torch.randint(size=(num_samples % 32,)) (a size-0 draw leaves the state alone).
* torch.randperm(n) consumes n - 1 32-bit words (randperm(1) consumes none);
  torch.randint with a small range one 32-bit word per element;
  torch.empty((), dtype=torch.int64).random_(generator=g) one 64-bit value (two words).
* DataLoader(shuffle=True, generator=g) builds RandomSampler(dataset, generator=g) on
  that same generator. Each iterator (_BaseDataLoaderIter.__init__) first calls
  iter(batch_sampler) -- lazy, draws nothing -- then draws its workers' base seed,
  torch.empty((), dtype=torch.int64).random_(generator=g), whatever num_workers is
  (0 included). So an epoch is: base seed, then the sampler's draws (trailing unused
  permutation included). num_workers=2 consumes exactly as num_workers=0: the main
  process drives the sampler, and its prefetching exhausts it before the epoch ends.
* persistent_workers=True (num_workers > 0): one iterator for the loader's lifetime,
  reset per epoch by _reset(), which does not draw a base seed: only epoch 0 draws one.
* BatchSampler(drop_last=True) reads nothing of the tail that does not fill a batch, but
  the sampler underneath still runs to exhaustion (zip pulls until StopIteration), so
  the generator state after the epoch is the same as without drop_last.
* DistributedSampler: torch.Generator().manual_seed(seed + epoch) (epoch = the value
  of set_epoch, 0 if never called), one randperm(n); without drop_last the list is padded
  to num_replicas * ceil(n / num_replicas) by repeating it from the start (both torch
  branches, padding <= n and padding > n, come to cyclic repetition: padded[i] =
  perm[i % n]); with drop_last and n % R != 0 it keeps the first
  R * ceil((n - R) / R) (0 when n < R); rank r takes padded[r::R].
* SequentialSampler: range(n), no random numbers.
* tiering.samplers.PartialLocalShuffleSampler ("pls"): no torch generator; its
  orders are tiering's own functions (NOTE [partial local shuffling]), called here.
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .. import samplers as pls
from . import torchrng

KINDS = ("random", "distributed", "sequential", "pls")


class OrderError(Exception):
    """The order cannot be reproduced from what was given; the message says what to do."""


@dataclass(frozen=True)
class SamplerSpec:
    """How the training samples its data set, as much as reproducing it needs."""
    kind: str                           # "random" | "distributed" | "sequential" | "pls"
    seed: int | None = None             # random: the torch.Generator seed (None: unknown);
                                        # distributed, pls: the sampler's seed (None means 0)
    replacement: bool = False           # random
    num_samples: int | None = None      # random (None: the data-set length)
    num_replicas: int = 1               # distributed, pls: world size
    rank: int = 0                       # distributed, pls
    shuffle: bool = True                # distributed, pls
    drop_last: bool = False             # distributed, pls: the sampler's drop_last
    batch_size: int | None = None       # the BatchSampler's (DataLoader's) batch size
    batch_drop_last: bool = False       # the DataLoader's drop_last: the tail is not read
    dataloader: bool = True             # random: driven by DataLoader(generator=g), the same g
    persistent_workers: bool = False    # random + dataloader: DataLoader(persistent_workers=True)
    fraction: float = pls.DEFAULT_FRACTION   # pls: the share of each rank's samples moved before an epoch
    partition: str = "contiguous"       # pls: the first epoch's partition, "contiguous" | "random"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise OrderError(f"sampler kind {self.kind!r} is unknown; use one of {', '.join(KINDS)}")
        if self.num_samples is not None and not positive_int(self.num_samples):
            raise OrderError(f"num_samples must be a positive integer, not {self.num_samples!r}")
        if not positive_int(self.num_replicas):
            raise OrderError(f"num_replicas (the world size) must be >= 1, not {self.num_replicas!r}")
        if not 0 <= self.rank < self.num_replicas:
            raise OrderError(f"rank {self.rank} is outside num_replicas {self.num_replicas}: "
                             f"ranks go from 0 to {self.num_replicas - 1}")
        if self.batch_size is not None and not positive_int(self.batch_size):
            raise OrderError(f"batch_size must be a positive integer, not {self.batch_size!r}")
        if self.batch_drop_last and self.batch_size is None:
            raise OrderError("batch_drop_last needs batch_size: the dropped tail is what does not "
                             "fill a batch of that size")
        if self.kind == "pls":
            _pls_call(pls.check, 1, self.num_replicas, self.rank, self.fraction, self.seed or 0,
                      self.partition)


def _pls_call(fn: Any, *args: Any) -> Any:
    """A function of tiering.samplers, its ValueError an OrderError."""
    try:
        return fn(*args)
    except ValueError as e:
        raise OrderError(str(e)) from None


def positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _torch():  # type: ignore[no-untyped-def]
    try:
        import torch
    except ImportError as e:
        raise OrderError("reproducing a shuffled order needs torch (the training's own version); "
                         "install it, or give the order as a file") from e
    return torch


class Draws(Protocol):
    """What the samplers draw from a CPU torch.Generator: torchrng.Generator (the
    replay) or TorchDraws (torch itself); arrays are numpy int64."""

    def manual_seed(self, seed: int) -> Any: ...
    def get_state(self) -> Any: ...
    def set_state(self, state: Any) -> None: ...
    def random64(self) -> None: ...
    def randperm(self, n: int) -> np.ndarray: ...
    def skip_randperm(self, n: int) -> None: ...
    def randint(self, high: int, size: int) -> np.ndarray: ...
    def skip_randint(self, size: int) -> None: ...


class TorchDraws:
    """The draws made by torch itself on a torch.Generator."""

    def __init__(self) -> None:
        self.torch = _torch()
        self.g = self.torch.Generator()

    def manual_seed(self, seed: int) -> TorchDraws:
        self.g.manual_seed(seed)
        return self

    def get_state(self) -> Any:
        return self.g.get_state()

    def set_state(self, state: Any) -> None:
        self.g.set_state(state)

    def random64(self) -> None:
        self.torch.empty((), dtype=self.torch.int64).random_(generator=self.g)

    def randperm(self, n: int) -> np.ndarray:
        return self.torch.randperm(n, generator=self.g).numpy()

    def skip_randperm(self, n: int) -> None:
        self.torch.randperm(n, generator=self.g)

    def randint(self, high: int, size: int) -> np.ndarray:
        return self.torch.randint(high=high, size=(size,), dtype=self.torch.int64, generator=self.g).numpy()

    def skip_randint(self, size: int) -> None:
        self.randint(1, size)


def replayed(n: int) -> bool:
    """Whether draws over n samples are replayed without torch (NOTE [torch replay])."""
    return n < torchrng.RANDPERM_MAX and torchrng.replayable()


def generator(n: int, seed: int) -> Draws:
    """A CPU generator seeded as torch.Generator().manual_seed(seed), for draws over n samples."""
    if not torchrng.SEED_MIN <= seed < torchrng.SEED_MAX:
        raise OrderError(f"seed {seed} is outside the range torch.Generator.manual_seed accepts "
                         f"({torchrng.SEED_MIN} to {torchrng.SEED_MAX - 1})")
    g: Draws = torchrng.Generator() if replayed(n) else TorchDraws()
    g.manual_seed(seed)
    return g


def _check_args(spec: SamplerSpec, dataset_len: int, epoch: int = 0) -> None:
    if not positive_int(dataset_len):
        raise OrderError(f"the data set has {dataset_len!r} samples; a sampler needs at least one")
    if not isinstance(epoch, int) or epoch < 0:
        raise OrderError(f"epoch must be an integer >= 0 (0 is the first epoch), not {epoch!r}")
    if spec.kind == "random" and spec.seed is None:
        raise OrderError("the random sampler's seed is unknown: give the seed of the torch.Generator "
                         "passed to the DataLoader/RandomSampler, or use the hook or an order file")


def _batch_cut(spec: SamplerSpec, order: np.ndarray) -> np.ndarray:
    """The indices actually read: a BatchSampler with drop_last skips the last short batch."""
    if spec.batch_drop_last and spec.batch_size is not None:
        return order[: len(order) - len(order) % spec.batch_size]
    return order


# ---------------------------------------------------------------- random sampler

def _random_epoch(spec: SamplerSpec, n: int, g: Draws, epoch: int, keep: bool = True) -> np.ndarray | None:
    """Run one epoch's draws on g, in torch's own order; return the indices yielded
    (keep False: only the draws, nothing returned)."""
    if spec.dataloader and (epoch == 0 or not spec.persistent_workers):
        g.random64()                                         # the iterator's base seed
    num = spec.num_samples if spec.num_samples is not None else n
    if spec.replacement:
        if not keep:
            g.skip_randint(num)                              # one word per element
            return None
        return g.randint(n, num)      # torch's chunks of 32 and the rest, word after word
    if not keep:
        for _ in range(num // n + 1):
            g.skip_randperm(n)
        return None
    parts = [g.randperm(n) for _ in range(num // n)]
    if num % n:
        parts.append(g.randperm(n)[: num % n])
    else:
        g.skip_randperm(n)                                   # drawn even when num % n == 0
    return np.concatenate(parts)


class _StateCache:
    """Generator states at the start of each epoch, per (spec, n), so that asking for
    epoch k again, or k + 1 after k, does not replay every epoch from the seed."""

    def __init__(self, max_keys: int = 8, max_epochs: int = 1024) -> None:
        self._states: OrderedDict[tuple, list[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.max_keys = max_keys
        self.max_epochs = max_epochs

    @staticmethod
    def key(spec: SamplerSpec, n: int) -> tuple:
        return (spec.seed, spec.replacement, spec.num_samples, spec.dataloader,
                spec.persistent_workers, n, replayed(n))

    def nearest(self, key: tuple, epoch: int) -> tuple[int, Any]:
        """The latest known epoch <= epoch and the state at its start."""
        with self._lock:
            states = self._states.get(key)
            if not states:
                return 0, None
            self._states.move_to_end(key)
            known = min(epoch, len(states) - 1)
            return known, states[known]

    def record(self, key: tuple, epoch: int, state: Any) -> None:
        with self._lock:
            states = self._states.setdefault(key, [])
            self._states.move_to_end(key)
            if epoch == len(states) and epoch < self.max_epochs:
                states.append(state)
            while len(self._states) > self.max_keys:
                self._states.popitem(last=False)


_STATES = _StateCache()


def _generator_at(spec: SamplerSpec, n: int, epoch: int) -> Draws:
    """A generator in the state the training's generator has when `epoch` begins."""
    key = _StateCache.key(spec, n)
    start, state = _STATES.nearest(key, epoch)
    g = generator(n, spec.seed if spec.seed is not None else 0)
    if state is None:
        _STATES.record(key, 0, g.get_state())
    else:
        g.set_state(state)
    for e in range(start, epoch):
        _random_epoch(spec, n, g, e, keep=False)
        _STATES.record(key, e + 1, g.get_state())
    return g


def _random_orders(spec: SamplerSpec, n: int, first: int, epochs: int) -> Iterator[np.ndarray]:
    g = _generator_at(spec, n, first)
    key = _StateCache.key(spec, n)
    for e in range(first, first + epochs):
        order = _random_epoch(spec, n, g, e)
        assert order is not None
        _STATES.record(key, e + 1, g.get_state())
        yield _batch_cut(spec, order)


# ---------------------------------------------------------------- distributed sampler

def _distributed_sizes(spec: SamplerSpec, n: int) -> tuple[int, int]:
    """(num_samples per rank, total_size), DistributedSampler.__init__'s arithmetic done
    in integers (torch uses math.ceil on floats: the same for any realistic n)."""
    per_rank = pls.per_rank(n, spec.num_replicas, spec.drop_last)   # 0 when drop_last and n < r
    return per_rank, per_rank * spec.num_replicas


@functools.lru_cache(maxsize=2)   # the epoch asked and the next: the ranks of all nodes draw it once
def _whole_order(seed: int, shuffle: bool, n: int, epoch: int) -> np.ndarray:
    if not shuffle:
        order = np.arange(n, dtype=np.int64)
    else:
        order = np.asarray(generator(n, seed + epoch).randperm(n), dtype=np.int64)
    order.setflags(write=False)
    return order


# ---------------------------------------------------------------- public API

def epoch_order_array(spec: SamplerSpec, dataset_len: int, epoch: int) -> np.ndarray:
    """The indices read in `epoch` (0-based), in order, exactly as the real sampler
    (through a DataLoader when spec.dataloader) yields them, as an int64 array.

    For a generator-driven random sampler every earlier epoch's draws are replayed
    (states are cached, so asking epoch after epoch costs one epoch each); the training
    must run each epoch to its end with one fresh `for batch in loader` and draw nothing
    else from that generator. For a distributed or PLS sampler `epoch` is the value given
    to set_epoch."""
    _check_args(spec, dataset_len, epoch)
    if spec.kind == "random":
        return next(_random_orders(spec, dataset_len, epoch, 1))
    if spec.kind == "distributed":
        return rank_share(spec, epoch_permutation(spec, dataset_len, epoch))
    if spec.kind == "pls":
        return _batch_cut(spec, _pls_call(pls.rank_order, spec.seed or 0, epoch, spec.num_replicas, spec.rank,
                                          dataset_len, spec.fraction, spec.partition, spec.drop_last,
                                          spec.shuffle))
    return _batch_cut(spec, np.arange(dataset_len, dtype=np.int64))


def epoch_permutation(spec: SamplerSpec, dataset_len: int, epoch: int) -> np.ndarray:
    """A DistributedSampler's order of an epoch before it is split by rank
    (torch.randperm under seed + epoch; range(n) without shuffle), the same
    for every rank: rank_share slices each rank's part.  Read-only; the last
    two epochs asked for are cached."""
    _check_args(spec, dataset_len, epoch)
    return _whole_order(spec.seed or 0, spec.shuffle, dataset_len, epoch)


def rank_share(spec: SamplerSpec, permutation: np.ndarray) -> np.ndarray:
    """What rank spec.rank reads of the epoch's permutation: slots rank,
    rank + R, ... of the list padded cyclically to total_size (or cut, with
    drop_last), less a BatchSampler's dropped tail."""
    n = len(permutation)
    per_rank, _ = _distributed_sizes(spec, n)
    slots = np.arange(per_rank, dtype=np.int64) * spec.num_replicas + spec.rank
    return _batch_cut(spec, permutation[slots % n])


def epoch_order(spec: SamplerSpec, dataset_len: int, epoch: int) -> list[int]:
    """epoch_order_array as a list."""
    return epoch_order_array(spec, dataset_len, epoch).tolist()


def epoch_arrays(spec: SamplerSpec, dataset_len: int, epochs: int) -> Iterator[np.ndarray]:
    """Epochs 0 .. epochs-1, one array each, computed as they are asked for; a random
    sampler's generator runs on from one epoch to the next, as in the training. Bad
    arguments raise here, not at the first next()."""
    _check_args(spec, dataset_len)
    if not isinstance(epochs, int) or epochs < 0:
        raise OrderError(f"epochs must be an integer >= 0, not {epochs!r}")
    if spec.kind == "random":
        return _random_orders(spec, dataset_len, 0, epochs)
    return (epoch_order_array(spec, dataset_len, e) for e in range(epochs))


def epoch_orders(spec: SamplerSpec, dataset_len: int, epochs: int) -> Iterator[list[int]]:
    """epoch_arrays as lists."""
    return (a.tolist() for a in epoch_arrays(spec, dataset_len, epochs))


def node_stream_array(specs: list[SamplerSpec], dataset_len: int, epoch: int) -> np.ndarray:
    """What one node reads in `epoch`: its ranks' orders interleaved by position
    (specs[0][0], specs[1][0], ..., specs[0][1], ...); when one rank's order is shorter,
    the others go on alone. An index read by two ranks appears twice."""
    if not specs:
        raise OrderError("node_stream needs the sampler of at least one rank on this node")
    return interleave([epoch_order_array(s, dataset_len, epoch) for s in specs])


def interleave(streams: list[np.ndarray]) -> np.ndarray:
    """streams[0][0], streams[1][0], ..., streams[0][1], ...; a shorter stream
    drops out when it ends (values are >= 0)."""
    if len(streams) == 1:
        return streams[0]
    grid = np.full((max(map(len, streams)), len(streams)), -1, np.int64)
    for k, o in enumerate(streams):
        grid[:len(o), k] = o
    flat = grid.ravel()
    return flat[flat >= 0]


def node_stream(specs: list[SamplerSpec], dataset_len: int, epoch: int) -> list[int]:
    """node_stream_array as a list."""
    return node_stream_array(specs, dataset_len, epoch).tolist()
