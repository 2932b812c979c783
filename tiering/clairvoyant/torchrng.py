"""torch's CPU generator and the draws its samplers make, replayed without importing
torch (NOTE [torch replay] in docs/design.md): mt19937 and the loops of torch's CPU
kernels in torchrng.c (inside libtierplan.so), bit for bit for the versions of torch
listed in REPLAYED.  Importing torch costs ~200 MiB of a tier-run that holds ~300 B
per file otherwise; samplers.py uses this module when `replayable()` says the
installed torch is one whose algorithms it reproduces, and torch itself otherwise."""
from __future__ import annotations

import ctypes
import importlib.metadata
import logging
from functools import cache
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

# Releases of torch whose CPU mt19937, randperm, randint and random_ torchrng.c
# reproduces, checked by tests/test_torchrng.py against the real torch.  Another
# version may have changed an algorithm (randperm did in the past for large n):
# its orders come from torch itself.
REPLAYED = ("2.13.0",)
# randperm_cpu's Fisher-Yates on 32-bit words is used for n < 2**32 / 20, randint's
# one word per element for a range < 2**32: beyond them torch draws differently
RANDPERM_MAX = 0xFFFFFFFF // 20
RANDINT_MAX = 1 << 32
SEED_MIN, SEED_MAX = -(1 << 63), 1 << 64   # what torch.Generator.manual_seed accepts
STATE_WORDS = 625                           # 624 words of state and the index of the next

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {"tr_seed": [_P, ctypes.c_uint64], "tr_skip": [_P, _I64],
               "tr_randperm": [_P, _I64, _P], "tr_randint": [_P, _I64, _I64, _P]}


def torch_version() -> str | None:
    """The installed torch's release (local label such as +cpu dropped), read from
    the package's metadata: torch is not imported. None: not installed."""
    try:
        return importlib.metadata.version("torch").split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        return None


@cache
def _library() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(str(Path(__file__).resolve().parent / "libtierplan.so"))
        for name, args in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = None, args
    except (OSError, AttributeError):
        return None
    return lib


@cache
def replayable() -> bool:
    """Whether the orders of torch's samplers can be replayed here without torch;
    says why not (-v) when they cannot."""
    version = torch_version()
    if version is None:
        return False       # samplers.py's import of torch says what to do
    if version not in REPLAYED:
        log.info("torch %s is not a version whose generator tiering replays (%s): the sampler's "
                 "orders are computed by importing torch", version, ", ".join(REPLAYED))
        return False
    if _library() is None:
        log.info("libtierplan.so cannot be loaded (rebuild it: `make build`): the sampler's "
                 "orders are computed by importing torch")
        return False
    log.info("torch %s: the sampler's orders are replayed without importing torch", version)
    return True


def _check_randperm(n: int) -> None:
    if not 0 < n < RANDPERM_MAX:
        raise ValueError(f"randperm({n}) is replayed for 0 < n < {RANDPERM_MAX} only")


class Generator:
    """torch.Generator() (CPU) in replay: manual_seed, the draws samplers make,
    and its state as a numpy array (get_state/set_state)."""

    def __init__(self) -> None:
        lib = _library()
        if lib is None:
            raise OSError("libtierplan.so cannot be loaded: rebuild it (`make build`)")
        self._lib = lib
        self._state = np.zeros(STATE_WORDS, np.uint32)
        self.manual_seed(67280421310721)       # torch's default seed

    @property
    def _addr(self) -> int:
        return self._state.ctypes.data

    def manual_seed(self, seed: int) -> Generator:
        if not SEED_MIN <= seed < SEED_MAX:
            raise ValueError(f"seed {seed} is outside what torch accepts [{SEED_MIN}, {SEED_MAX})")
        self._lib.tr_seed(self._addr, seed & 0xFFFFFFFFFFFFFFFF)
        return self

    def get_state(self) -> np.ndarray:
        return self._state.copy()

    def set_state(self, state: np.ndarray) -> None:
        self._state[:] = state

    def random64(self) -> None:
        """torch.empty((), dtype=torch.int64).random_(generator=g): two words (value unused)."""
        self._lib.tr_skip(self._addr, 2)

    def randperm(self, n: int) -> np.ndarray:
        """torch.randperm(n, generator=g)."""
        _check_randperm(n)
        out = np.empty(n, np.int64)
        self._lib.tr_randperm(self._addr, n, out.ctypes.data)
        return out

    def skip_randperm(self, n: int) -> None:
        """The words of torch.randperm(n, generator=g) consumed, nothing computed."""
        _check_randperm(n)
        self._lib.tr_skip(self._addr, n - 1)

    def randint(self, high: int, size: int) -> np.ndarray:
        """torch.randint(high=high, size=(size,), dtype=torch.int64, generator=g)."""
        if not 0 < high < RANDINT_MAX:
            raise ValueError(f"randint(high={high}) is replayed for 0 < high < 2**32 only")
        out = np.empty(size, np.int64)
        if size:
            self._lib.tr_randint(self._addr, high, size, out.ctypes.data)
        return out

    def skip_randint(self, size: int) -> None:
        """The words of randint(high, size) with high < 2**32, consumed."""
        self._lib.tr_skip(self._addr, size)
