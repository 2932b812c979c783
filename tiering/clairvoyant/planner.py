"""The clairvoyant planner: from the access stream, the file sizes and the tier
capacities, decide which file lives in which tier and when.

The stream is the sequence of catalog file ids the job will open, epoch after
epoch, as far as it is known.  The planner is used in two ways:

- offline (`simulate`, `tiering plan`): it runs the whole stream with a
  reader that never waits, and predicts hits per tier and PFS bytes;
- online (the daemon's clairvoyant policy): `extend` appends each epoch's
  order as it becomes known, `consume` reports what the reader has used and
  `advance` returns the fetches to issue now.

Rules (Belady's rule with prefetching):

- Fetch ahead in stream order: into free room as far as the tiers hold,
  and, within `window` positions of the reader, also by evicting.  A file is
  put in the fastest tier with free room.
- When no tier has room, make room by evicting the resident files whose next
  use is farthest in the future, across all tiers (the tier whose farthest
  file is farthest goes first), but only files needed later than the one
  being fetched; if that is not possible, prefetching pauses until the
  reader moves on.  A prefetched file that has not been read yet is never
  evicted for a later one.
- A file with no further known use is the first to go; among those, the one
  this node reads least often over the known stream (HDMLP's frequency rule)
  goes first, then the lowest file id.  Such files are evicted lazily, when
  room is needed, so a data set that fits stays in place from one epoch to
  the next even when the next epoch's order is only published when it starts.
- Nothing is ever scheduled beyond a tier's capacity.
- Pinned files (a node's home files in a multi-node job, NOTE [home
  nodes]) are kept once held: never a victim.  Without pins every decision
  is the rule above.

State (NOTE [planner arrays] in docs/design.md): per file, numpy arrays of its
tier, its next unconsumed use ("need") and its uses; per known stream position,
arrays of the file, the next position of the same file and a consumed flag,
trimmed as the reader moves on.  The victims are found in bit sets: per tier,
the need positions of its files, and per tier and number of uses, the files
with no known next use.  Work per position is done with numpy over runs of
positions (placing into free room, consuming, accounting); only a fetch that
must evict is decided one at a time.

The one-at-a-time loops (advance, simulate's reading, extend's links) run in
C when libtierplan.so is built (NOTE [planner core]): the same rules over the
same arrays, the Python code below being the fallback and the reference.
"""
from __future__ import annotations

import ctypes
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import cffi
import numpy as np

from ..placement.api import allocation, allocations
from .bitset import BitSet, distinct_small

INF = 1 << 62
TRIM_MIN = 1 << 16   # consumed positions kept before the stream's head is trimmed
FETCH, EVICT = 0, 1
KINDS = ("fetch", "evict")
SCAN = 64            # positions looked at one by one before a scan switches to numpy
BULK = 4096          # changes to the victim sets beyond which they are rebuilt when next needed ...
REBUILD_SHARE = 0.5  # ... when they are also more than this share of the placed files (a rebuild
                     # walks all of them: an epoch of a node's share moves an eighth of the data set)
CORE_LOG = 1 << 18   # actions the C core logs before simulate() takes them
LOG_KEEP = 1 << 16   # log entries whose buffers the C core keeps after a take; larger ones are let go


# -- the C core (NOTE [planner core] in docs/design.md) ---------------------------

_HERE = Path(__file__).resolve().parent
_ffi = cffi.FFI()
_ffi.cdef((_HERE / "plancore.h").read_text().split("/* BEGIN CDEF */", 1)[1].split("/* END CDEF */", 1)[0])
_lib: Any = None
_P, _I64 = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {"tp_advance": (ctypes.c_int, [_P]), "tp_run": (_I64, [_P, _I64, _I64, _I64]),
               "tp_free": (None, [_P]), "tp_link": (_I64, [_P, _I64, _I64, _P, _P]),
               "tp_count": (None, [_P, _P, _I64]), "tp_plan_size": (ctypes.c_size_t, [])}


def _open_core() -> Any:
    """libtierplan.so through ctypes.PyDLL: its calls keep the GIL, so that no
    other thread of the daemon runs Planner code in the middle of one (as
    with the Python code).  cffi gives the struct's layout (from plancore.h)."""
    lib = ctypes.PyDLL(str(_HERE / "libtierplan.so"))
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    if lib.tp_plan_size() != _ffi.sizeof("tp_plan"):
        raise OSError("libtierplan.so does not match plancore.h: rebuild it (`make build`)")
    return lib


def core_available() -> bool:
    """Whether libtierplan.so (built by setup.py, or `make`) can be loaded;
    TIERING_PLANNER=python turns the C core off."""
    global _lib
    if os.environ.get("TIERING_PLANNER") == "python":
        return False
    if _lib is None:
        try:
            _lib = _open_core()
        except (OSError, AttributeError):
            _lib = False
    return _lib is not False


def _ptr(ctype: str, a: np.ndarray) -> Any:
    return _ffi.cast(ctype, a.ctypes.data)


def _records(n: int) -> np.ndarray:
    """n records of 4 int64 (tp_file), each within one 64-byte cache line:
    the array starts at a multiple of 32 bytes (numpy only promises 16)."""
    raw = np.empty(4 * n + 4, np.int64)
    skip = (-raw.ctypes.data % 32) // 8
    return raw[skip:skip + 4 * n].reshape(n, 4)


class _Core:
    """The tp_plan the C core works on: pointers to the Planner's arrays, its
    counters copied in before a call and back after it."""

    def __init__(self, planner: Planner) -> None:
        p = planner
        self.c = _ffi.new("tp_plan *")
        self.addr = int(_ffi.cast("uintptr_t", self.c))   # what the C functions are given
        self.used = np.zeros(len(p.capacities), np.int64)
        self.idle_n = np.zeros(len(p.capacities), np.int64)
        self.cap = np.asarray(p.capacities, np.int64)
        self.hits = np.zeros(len(p.capacities), np.int64)
        c = self.c
        c.window = -1 if p.window is None else p.window
        c.keep_log = 1
        c.tiers = len(p.capacities)
        c.cap, c.used, c.idle_n, c.hits = (_ptr("int64_t *", a) for a in (self.cap, self.used, self.idle_n, self.hits))
        self.sets: tuple[Any, ...] | None = None   # the victim sets as C sees them (rebuilt when they change)

    def __del__(self) -> None:
        if _lib:
            _lib.tp_free(self.addr)

    @staticmethod
    def _bits(b: Any, s: BitSet) -> None:
        b.levels = len(s._levels)
        for k, a in enumerate(s._levels):
            b.lv[k] = _ptr("uint64_t *", a)

    def _describe_sets(self, p: Planner) -> tuple[Any, ...]:
        values = np.flatnonzero(np.bincount(p._uses)).tolist() or [0]
        for t in range(len(p.capacities)):
            for u in values:
                p._idle_set(t, u)
        tiers = len(p.capacities)
        by_need = _ffi.new("tp_bits[]", tiers)
        idle = _ffi.new("tp_bits[]", tiers * len(values))
        for t in range(tiers):
            self._bits(by_need[t], p._by_need[t])
            for k, u in enumerate(values):
                self._bits(idle[t * len(values) + k], p._idle[t][u])
        uses = np.asarray(values, np.int32)
        slot = np.full(int(uses[-1]) + 1, -1, np.int32)
        slot[uses] = np.arange(len(uses), dtype=np.int32)
        return by_need, idle, uses, slot, len(values)

    def arrays(self, p: Planner) -> Any:
        """The C struct with the Planner's arrays and stream (not its victim sets)."""
        c = self.c
        c.tier, c.file, c.uses = _ptr("int8_t *", p._tier), _ptr("tp_file *", p._files), _ptr("int32_t *", p._uses)
        c.size = _ptr("int64_t *", p._size)
        c.pin = _ffi.NULL if p._pin is None else _ptr("uint8_t *", p._pin)
        c.stream, c.next, c.cons = _ptr("int32_t *", p._stream), _ptr("int64_t *", p._next), _ptr("uint8_t *", p._cons)
        c.base, c.n, c.cursor, c.reader, c.pos0 = p.base, p._n, p.cursor, p.reader, p._pos0
        return c

    def load(self, p: Planner) -> Any:
        """The C struct with the Planner's state; call store() after the C call."""
        if p._stale:
            p._rebuild_victims()
        if self.sets is None or p._sets_changed:
            self.sets = self._describe_sets(p)
            p._sets_changed = False
        by_need, idle, uses, slot, n_uses = self.sets
        c = self.arrays(p)
        c.by_need, c.idle, c.n_uses = by_need, idle, n_uses
        c.idle_uses, c.uses_slot = _ptr("int32_t *", uses), _ptr("int32_t *", slot)
        c.trim_min, c.n_resident = TRIM_MIN, p.n_resident
        self.used[:] = p.used
        self.idle_n[:] = p._idle_n
        return c

    def store(self, p: Planner) -> None:
        c = self.c
        p.base, p._n, p.cursor, p.reader, p.n_resident = c.base, c.n, c.cursor, c.reader, c.n_resident
        p.used = self.used.tolist()
        p._idle_n = self.idle_n.tolist()

    def take_log(self) -> Actions:
        """The actions the C code logged since the last call (the log is emptied)."""
        c = self.c
        n = c.log_n
        c.log_n = 0
        if n == 0:
            return _EMPTY

        def arr(ptr: Any, dtype: type) -> np.ndarray:
            return np.frombuffer(_ffi.buffer(ptr, n * np.dtype(dtype).itemsize), dtype).copy()

        taken = Actions(arr(c.log_kind, np.int8), arr(c.log_file, np.int64), arr(c.log_tier, np.int8),
                        arr(c.log_position, np.int64), arr(c.log_need, np.int64))
        if c.log_cap > LOG_KEEP:
            # an epoch's fetches at once (26 B each, the buffers doubled past
            # them): copied out, so the C buffers go; the core grows them anew
            _lib.tp_free(self.addr)
        return taken


@dataclass(frozen=True)
class Action:
    kind: str        # "fetch" or "evict"
    file: int        # catalog file id
    tier: int        # tier it goes to (fetch) or leaves (evict)
    position: int    # reader position when the action is taken
    need: int = -1   # fetch: the stream position that needs the file


class Actions(Sequence[Action]):
    """Actions in arrays; indexing or iterating gives Action objects."""

    def __init__(self, kind: np.ndarray, file: np.ndarray, tier: np.ndarray, position: np.ndarray,
                 need: np.ndarray):
        self.kind, self.file, self.tier, self.position, self.need = kind, file, tier, position, need

    @classmethod
    def concat(cls, parts: Sequence[Actions]) -> Actions:
        if not parts:
            return _EMPTY
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, n) for p in parts])
                     for n in ("kind", "file", "tier", "position", "need")))

    def __len__(self) -> int:
        return len(self.kind)

    @overload
    def __getitem__(self, i: int) -> Action: ...
    @overload
    def __getitem__(self, i: slice | np.ndarray) -> Actions: ...

    def __getitem__(self, i: int | slice | np.ndarray) -> Action | Actions:
        if isinstance(i, (slice, np.ndarray)):
            return Actions(self.kind[i], self.file[i], self.tier[i], self.position[i], self.need[i])
        return Action(KINDS[int(self.kind[i])], int(self.file[i]), int(self.tier[i]), int(self.position[i]),
                      int(self.need[i]))

    def __iter__(self) -> Iterator[Action]:
        for k, f, t, p, n in zip(self.kind.tolist(), self.file.tolist(), self.tier.tolist(),
                                 self.position.tolist(), self.need.tolist()):
            yield Action(KINDS[k], f, t, p, n)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Actions({list(self)!r})"

    @property
    def fetches(self) -> np.ndarray:
        return self.kind == FETCH


_EMPTY = Actions(np.zeros(0, np.int8), np.zeros(0, np.int64), np.zeros(0, np.int8), np.zeros(0, np.int64),
                 np.zeros(0, np.int64))


class _Log:
    """Actions in the order they are taken: single ones in lists, runs as arrays."""

    def __init__(self) -> None:
        self.parts: list[Actions] = []
        self._reset()

    def _reset(self) -> None:
        self.kind: list[int] = []
        self.file: list[int] = []
        self.tier: list[int] = []
        self.position: list[int] = []
        self.need: list[int] = []

    def one(self, kind: int, f: int, tier: int, position: int, need: int = -1) -> None:
        self.kind.append(kind)
        self.file.append(f)
        self.tier.append(tier)
        self.position.append(position)
        self.need.append(need)

    def run(self, files: np.ndarray, tiers: np.ndarray, position: int, needs: np.ndarray) -> None:
        self._flush()
        n = len(files)
        self.parts.append(Actions(np.full(n, FETCH, np.int8), files.astype(np.int64), tiers.astype(np.int8),
                                  np.full(n, position, np.int64), needs.astype(np.int64)))

    def __len__(self) -> int:
        return len(self.kind) + sum(len(p) for p in self.parts)

    def _flush(self) -> None:
        if self.kind:
            self.parts.append(Actions(np.array(self.kind, np.int8), np.array(self.file, np.int64),
                                      np.array(self.tier, np.int8), np.array(self.position, np.int64),
                                      np.array(self.need, np.int64)))
            self._reset()

    def take(self) -> Actions:
        """The actions logged so far (the log is emptied)."""
        self._flush()
        out = Actions.concat(self.parts)
        self.parts = []
        return out


class _Resident(Mapping[int, int]):
    """file -> tier of the files the plan holds, over the planner's tier array."""

    def __init__(self, planner: Planner):
        self._p = planner

    def __getitem__(self, f: int) -> int:
        if not 0 <= f < len(self._p._tier):
            raise KeyError(f)
        t = self._p._tier_mv[f]
        if t < 0:
            raise KeyError(f)
        return t

    def __contains__(self, f: object) -> bool:
        return bool(isinstance(f, (int, np.integer)) and 0 <= f < len(self._p._tier) and self._p._tier_mv[int(f)] >= 0)

    def __iter__(self) -> Iterator[int]:
        return iter(np.flatnonzero(self._p._tier >= 0).tolist())

    def __len__(self) -> int:
        return self._p.n_resident

    def as_dict(self) -> dict[int, int]:
        held = np.flatnonzero(self._p._tier >= 0)
        return dict(zip(held.tolist(), self._p._tier[held].tolist()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(other) == len(self) and self.as_dict() == dict(other)

    __hash__ = None  # type: ignore[assignment]


class _Need:
    """file -> its next unconsumed use (INF: none known)."""

    def __init__(self, planner: Planner):
        self._p = planner

    def get(self, f: int, default: int = INF) -> int:
        p = self._p
        if not 0 <= f < len(p._need):
            return default
        n = p._need_mv[f]
        return n if n != INF or p._uses_mv[f] else default

    def __getitem__(self, f: int) -> int:
        return self._p._need_mv[f]


def _greedy_take(allocs: np.ndarray, room: int) -> np.ndarray:
    """Which of these files, offered in order, a tier with this free room
    takes: each one that still fits."""
    take = np.zeros(len(allocs), bool)
    idx = np.flatnonzero(allocs <= room)
    while idx.size:
        c = np.cumsum(allocs[idx])
        j = int(np.searchsorted(c, room, side="right"))
        take[idx[:j]] = True
        if j == idx.size:
            break
        room -= int(c[j - 1]) if j else 0
        rest = idx[j + 1:]
        idx = rest[allocs[rest] <= room]
    return take


def _as_ids(order: Iterable[int] | np.ndarray) -> np.ndarray:
    if isinstance(order, np.ndarray):
        return order.astype(np.int64, copy=False).ravel()
    if not isinstance(order, (list, tuple, range)):
        order = list(order)
    return np.asarray(order, dtype=np.int64).ravel()


class Planner:
    def __init__(self, sizes: Sequence[int] | np.ndarray, capacities: Sequence[int], *,
                 window: int | None = None, alloc: Callable[[int], int] = allocation,
                 pinned: np.ndarray | None = None):
        """pinned: a bool per file, the files kept once held (never evicted)."""
        self.sizes = sizes
        self.capacities = [int(c) for c in capacities]
        self.window = window
        self.alloc = alloc
        self._size = np.ascontiguousarray(sizes, dtype=np.int64)
        n = len(self._size)
        # need, done (the latest position of each file consumed or skipped),
        # last (its latest position known) and allocation: one record per file
        # (tp_file of plancore.h, NOTE [planner records]), a column each
        self._files = _records(n)
        self._need, self._done, self._last, self._alloc = (self._files[:, k] for k in range(4))
        self._need[:], self._done[:], self._last[:] = INF, -1, -1
        if alloc is allocation:
            self._alloc[:] = allocations(self._size)
        else:
            self._alloc[:] = np.fromiter((alloc(int(s)) for s in self._size), np.int64, n)
        self._fits = self._alloc <= max(self.capacities, default=-1)   # some tier can hold it
        self._pin: np.ndarray | None = None
        self._set_pin(pinned)
        self._tier = np.full(n, -1, np.int8)
        self._uses = np.zeros(n, np.int32)
        self._tier_mv = self._tier.data
        self._need_mv = self._need.data
        self._done_mv = self._done.data
        self._uses_mv = self._uses.data
        self._alloc_mv = self._alloc.data
        self._size_mv = self._size.data
        self._fits_mv = self._fits.data
        self.used = [0] * len(self.capacities)
        self.n_resident = 0
        # stream positions are absolute (they count from the start of the run);
        # the arrays hold positions base.. only: consumed ones are trimmed away
        self.base = 0
        self._n = 0
        self._set_buffers(np.zeros(1024, np.int32), np.full(1024, INF, np.int64), np.zeros(1024, bool))
        self.cursor = 0                       # next stream position to consider fetching
        self.reader = 0                       # every position below is consumed or skipped
        # victims: need positions (relative to _pos0) of the files of each tier,
        # and per tier and number of uses the files with no known next use
        self._pos0 = 0
        self._by_need = [BitSet(4096) for _ in self.capacities]
        self._idle: list[dict[int, BitSet]] = [{} for _ in self.capacities]
        self._idle_n = [0] * len(self.capacities)   # files in each tier's idle sets
        self._stale = False                          # the victim sets are to be rebuilt
        self._candidates: dict[int, list[int]] = {}  # allocation -> tiers it fits
        self.resident: Mapping[int, int] = _Resident(self)
        self.need = _Need(self)
        self._sets_changed = True                    # the C core's view of the victim sets is out of date
        self._core: _Core | None = None

    def _set_pin(self, pinned: np.ndarray | None) -> None:
        pin = None if pinned is None or not np.any(pinned) else np.array(pinned, dtype=bool)   # its own copy
        if pin is not None and len(pin) != len(self._size):
            raise ValueError(f"pinned has {len(pin)} flags for {len(self._size)} files")
        self._pin = pin

    def pin(self, pinned: np.ndarray | None) -> None:
        """The files kept once held from now on (instead of those given
        before): the held ones among them leave the victim sets, the others
        stay in them."""
        self._set_pin(pinned)
        self._stale = True        # the victim sets are rebuilt when next needed
        self._sets_changed = True

    def keep(self, files: np.ndarray, on: bool) -> None:
        """Pins (on) or unpins these files from now on, the others as they
        were (the relay rule's holds, NOTE [relay]): a held file that is
        pinned leaves the victim sets, one unpinned enters them."""
        files = np.asarray(files, np.int64)
        if self._pin is None:
            if not on:
                return
            self._pin = np.zeros(len(self._size), bool)
        files = np.unique(files[self._pin[files] != on])
        if not files.size:
            return
        held = files[self._tier[files] >= 0]
        if on:
            self._move(held, self._tier[held], self._need[held], False)   # out of the sets while not pinned
            self._pin[files] = True
        else:
            self._pin[files] = False
            self._move(held, self._tier[held], self._need[held], True)

    def held(self, files: np.ndarray) -> np.ndarray:
        """A bool per file: planned into a tier now (placed or in flight)."""
        return self._tier[files] >= 0

    def _set_buffers(self, stream: np.ndarray, nxt: np.ndarray, cons: np.ndarray) -> None:
        self._stream, self._next, self._cons = stream, nxt, cons
        self._stream_mv = stream.data
        self._next_mv = nxt.data
        self._cons_mv = cons.data

    # -- the stream ----------------------------------------------------------
    @property
    def end(self) -> int:
        """The position after the last one known."""
        return self.base + self._n

    @property
    def stream(self) -> np.ndarray:
        """File ids of the positions held (base..end)."""
        return self._stream[:self._n]

    @property
    def next_pos(self) -> np.ndarray:
        """Next position of the same file, per position held (INF if unknown)."""
        return self._next[:self._n]

    def file_at(self, pos: int) -> int:
        """The file at stream position pos (not yet trimmed: pos >= base)."""
        return self._stream_mv[pos - self.base]

    def uses_of(self, files: np.ndarray) -> np.ndarray:
        """Known uses of each file (0: not in the stream)."""
        return self._uses[files]

    def need_of(self, files: np.ndarray) -> np.ndarray:
        """Next unconsumed use of each file (INF: none known)."""
        return self._need[files]

    def done_of(self, files: np.ndarray) -> np.ndarray:
        """The latest position of each file consumed or skipped (-1: none)."""
        return self._done[files]

    def _reserve(self, k: int) -> None:
        n = self._n
        if n + k <= len(self._stream):
            return
        head = self.reader - self.base
        if head >= TRIM_MIN and n - head + k <= len(self._stream):
            self._drop_head(head)     # room without growing: the consumed head goes first
            return
        size = max(2 * len(self._stream), n + k)
        stream, nxt, cons = np.zeros(size, np.int32), np.full(size, INF, np.int64), np.zeros(size, bool)
        stream[:n], nxt[:n], cons[:n] = self._stream[:n], self._next[:n], self._cons[:n]
        self._set_buffers(stream, nxt, cons)

    def extend(self, order: Iterable[int] | np.ndarray) -> None:
        """Appends the next part of the stream (usually one epoch)."""
        files = _as_ids(order)
        k = len(files)
        if k == 0:
            return
        start, base = self.end, self.base
        self._grow_victims(start + k)
        self._reserve(k)               # may drop the consumed head: base moves, the end does not
        base = self.base
        rel = self._n
        self._stream[rel:rel + k] = files
        self._next[rel:rel + k] = INF
        self._cons[rel:rel + k] = False
        if core_available():
            self._link_in_core(start, k)
            return
        counts = np.bincount(files, minlength=0)
        if counts.max() <= 1:    # each file once (an epoch of a permutation)
            first = last = files
            first_pos = last_pos = np.arange(start, start + k, dtype=np.int64)
            per_file = np.ones(k, np.int32)
        else:
            by_file = np.argsort(files, kind="stable")
            sf, sp = files[by_file], by_file.astype(np.int64) + start
            same = sf[1:] == sf[:-1]
            self._next[sp[:-1][same] - base] = sp[1:][same]
            heads = np.ones(k, bool)
            heads[1:] = ~same
            tails = np.ones(k, bool)
            tails[:-1] = ~same
            first, first_pos, last, last_pos = sf[heads], sp[heads], sf[tails], sp[tails]
            per_file = np.diff(np.append(np.flatnonzero(heads), k)).astype(np.int32)
        prev = self._last[first]
        linked = prev >= base
        self._next[prev[linked] - base] = first_pos[linked]
        self._last[last] = last_pos
        # files with no known use get one: the resident ones leave the idle sets
        fresh = self._need[first] == INF
        ff, fp = first[fresh], first_pos[fresh]
        self._n += k
        self._set_needs(ff, np.full(len(ff), INF, np.int64), fp)
        self._uses[first] += per_file
        self._sets_changed = True   # (new numbers of uses)

    def _link_in_core(self, start: int, k: int) -> None:
        """extend()'s links, needs and uses for the k positions from start, in C."""
        fresh_file, fresh_pos = np.empty(k, np.int64), np.empty(k, np.int64)
        if self._core is None:
            self._core = _Core(self)
        self._n += k
        self._core.arrays(self)
        m = _lib.tp_link(self._core.addr, start, k, fresh_file.ctypes.data, fresh_pos.ctypes.data)
        self._set_needs(fresh_file[:m], np.full(m, INF, np.int64), fresh_pos[:m])
        _lib.tp_count(self._uses.ctypes.data, self._stream[start - self.base:].ctypes.data, k)
        self._sets_changed = True   # (new numbers of uses)

    # -- the reader's progress ---------------------------------------------------
    def consume(self, pos: int) -> None:
        """The reader has read stream position pos."""
        if pos < self.reader or pos >= self.end:
            return
        base = self.base
        cons = self._cons_mv
        if cons[pos - base]:
            return
        cons[pos - base] = True
        f = self._stream_mv[pos - base]
        if self._done_mv[f] < pos:
            self._done_mv[f] = pos
        if self._need_mv[f] == pos:
            nxt = self._next_mv
            q = nxt[pos - base]
            while q != INF and cons[q - base]:
                q = nxt[q - base]
            self._set_need(f, pos, q)
        if pos == self.reader:
            end = self.end
            r = pos + 1
            while r < end and cons[r - base]:
                r += 1
            self.reader = r
            self._trim()

    def consume_many(self, positions: np.ndarray) -> None:
        """consume() of each position, in one pass."""
        p = np.unique(np.asarray(positions, np.int64))
        self._consume_sorted(p[(p >= self.reader) & (p < self.end)])

    def consume_range(self, start: int, stop: int) -> None:
        """consume() of positions start..stop."""
        start, stop = max(start, self.reader), min(stop, self.end)
        if start >= stop:
            return
        self._consume_sorted(np.arange(start, stop, dtype=np.int64))

    def _consume_sorted(self, p: np.ndarray) -> None:
        """p: distinct known positions at or after the reader, ascending."""
        if p.size == 0:
            return
        base = self.base
        lo, hi = int(p[0]) - base, int(p[-1]) + 1 - base
        if hi - lo == len(p) and not self._cons[lo:hi].any():   # a run: slices
            self._cons[lo:hi] = True
            f = self._stream[lo:hi].astype(np.int64)
        else:
            p = p[~self._cons[p - base]]
            self._cons[p - base] = True
            f = self._stream[p - base].astype(np.int64)
        self._done[f] = np.maximum(self._done[f], p)   # p ascending: a file's last p wins
        hit = self._need[f] == p
        hf, old = f[hit], p[hit]
        q = self._next[old - base]
        while True:
            live = np.flatnonzero(q != INF)
            walk = live[self._cons[q[live] - base]]
            if walk.size == 0:
                break
            q[walk] = self._next[q[walk] - base]
        self._set_needs(hf, old, q)
        if self.reader < self.end and self._cons_mv[self.reader - base]:
            self.reader = self._first_unconsumed(self.reader)
            self._trim()

    def _first_unconsumed(self, pos: int) -> int:
        base, end = self.base, self.end
        step = SCAN
        while pos < end:
            chunk = self._cons[pos - base:min(end, pos + step) - base]
            free = np.flatnonzero(~chunk)
            if free.size:
                return pos + int(free[0])
            pos += len(chunk)
            step *= 4
        return end

    def _trim(self) -> None:
        """Drops the consumed head of the stream once it outweighs the rest,
        so that memory follows the known future, not the whole run."""
        k = self.reader - self.base
        if k >= TRIM_MIN and k >= self._n - k:
            self._drop_head(k)

    def _drop_head(self, k: int) -> None:
        """Forgets the first k positions held (all consumed or skipped)."""
        n = self._n - k
        self._stream[:n] = self._stream[k:self._n]
        self._next[:n] = self._next[k:self._n]
        self._cons[:n] = self._cons[k:self._n]
        self._n = n
        self.base += k

    def skip_to(self, pos: int) -> int:
        """Treats every position below pos as consumed (lost events, a jump);
        returns how many were not consumed yet.  Positions not known yet
        cannot be skipped: pos is taken at most to the end of the known stream."""
        pos = min(pos, self.end)
        if pos <= self.reader:
            return 0
        base = self.base
        rng = np.arange(self.reader, pos, dtype=np.int64)
        rng = rng[~self._cons[rng - base]]
        self._consume_sorted(rng)
        return len(rng)

    # -- the victims ---------------------------------------------------------------
    def _grow_victims(self, end: int) -> None:
        """The need sets cover positions _pos0 .. end: rebuilt further on when not."""
        if not self._stale and self._by_need and end - self._pos0 > self._by_need[0].size:
            self._stale = True

    def _rebuild_victims(self) -> None:
        """The victim sets from the arrays, after changes too many to apply one
        by one (a whole epoch read or made known at once)."""
        self._pos0 = self.reader & ~63
        size = max(4096, 2 * (self.end - self._pos0))
        self._by_need = [BitSet(size) for _ in self.capacities]
        self._idle = [{} for _ in self.capacities]
        self._idle_n = [0] * len(self.capacities)
        self._stale = False
        self._sets_changed = True
        held = np.flatnonzero(self._tier >= 0)
        self._move(held, self._tier[held], self._need[held], True, rebuild=True)

    def _idle_set(self, tier: int, uses: int) -> BitSet:
        s = self._idle[tier].get(uses)
        if s is None:
            s = self._idle[tier][uses] = BitSet(len(self._tier))
            self._sets_changed = True
        return s

    def _mark(self, f: int, tier: int, need: int, add: bool) -> None:
        """Puts file f of this tier into the victim set its need gives it
        (add), or takes it out: _move for one file.  A pinned file is in none."""
        if self._stale or (self._pin is not None and self._pin[f]):
            return
        if need != INF:
            s, member = self._by_need[tier], need - self._pos0
        else:
            s, member = self._idle_set(tier, self._uses_mv[f]), f
            self._idle_n[tier] += 1 if add else -1
        if add:
            s.add(member)
        else:
            s.discard(member)

    def _set_need(self, f: int, old: int, new: int) -> None:
        t = self._tier_mv[f]
        if t >= 0:
            self._mark(f, t, old, False)
            self._mark(f, t, new, True)
        self._need_mv[f] = new

    def _set_needs(self, files: np.ndarray, old: np.ndarray, new: np.ndarray) -> None:
        """_set_need for many files (each once)."""
        tiers = self._tier[files]
        held = tiers >= 0
        if held.any():
            self._move(files[held], tiers[held], old[held], False)
            self._need[files] = new
            self._move(files[held], tiers[held], new[held], True)
        else:
            self._need[files] = new

    def _move(self, files: np.ndarray, tiers: np.ndarray, needs: np.ndarray, add: bool,
              rebuild: bool = False) -> None:
        if self._stale:
            return
        if not rebuild and len(files) > max(BULK, REBUILD_SHARE * self.n_resident):
            self._stale = True   # rebuilt when a victim is next needed
            return
        if self._pin is not None:   # never victims
            free = ~self._pin[files]
            files, tiers, needs = files[free], tiers[free], needs[free]
        known = needs != INF
        for t in distinct_small(tiers, len(self.capacities)).tolist():
            mine = tiers == t
            at = needs[mine & known] - self._pos0
            bs = self._by_need[t]
            bs.add_many(at) if add else bs.discard_many(at)
            idle = files[mine & ~known]
            if idle.size:
                uses = self._uses[idle]
                for u in distinct_small(uses, int(uses.max()) + 1).tolist():
                    s = self._idle_set(t, u)
                    group = idle[uses == u]
                    s.add_many(group) if add else s.discard_many(group)
                self._idle_n[t] += len(idle) if add else -len(idle)

    def _victim(self, tiers: list[int]) -> tuple[int, int, int] | None:
        """(file, tier, need) of the file to evict first among these tiers:
        no known next use (fewest uses, then lowest id), else the farthest need."""
        if self._stale:
            self._rebuild_victims()
        best: tuple[int, int, int] | None = None
        for t in tiers:
            if not self._idle_n[t]:
                continue
            for u in sorted(self._idle[t]):
                f = self._idle[t][u].min()
                if f >= 0:
                    if best is None or (u, f) < best[:2]:
                        best = (u, f, t)
                    break
        if best is not None:
            return best[1], best[2], INF
        far, far_tier = -1, -1
        for t in tiers:
            q = self._by_need[t].max()
            if q > far:
                far, far_tier = q, t
        if far < 0:
            return None
        pos = far + self._pos0
        return self._stream_mv[pos - self.base], far_tier, pos

    def _enter(self, f: int, tier: int) -> None:
        self._tier_mv[f] = tier
        self.used[tier] += self._alloc_mv[f]
        self.n_resident += 1
        self._mark(f, tier, self._need_mv[f], True)

    def _leave(self, f: int) -> int:
        tier = self._tier_mv[f]
        self._mark(f, tier, self._need_mv[f], False)
        self._tier_mv[f] = -1
        self.used[tier] -= self._alloc_mv[f]
        self.n_resident -= 1
        return tier

    # -- placement ---------------------------------------------------------------
    def advance(self) -> Actions:
        """Fetches to issue now, in the order they are needed (each after the
        evictions that make its room)."""
        if core_available():
            core = self._load_core()
            failed = _lib.tp_advance(core.addr)
            core.store(self)
            if failed:
                raise MemoryError("planner: out of memory")
            return core.take_log()
        log = _Log()
        self._advance(log)
        return log.take()

    def _load_core(self) -> _Core:
        if self._core is None:
            self._core = _Core(self)
        self._core.load(self)
        return self._core

    def _advance(self, log: _Log) -> None:
        self.cursor = max(self.cursor, self.reader)
        window_end = INF if self.window is None else self.reader + self.window
        while self.cursor < self.end:
            pos = self._fill_free(self.cursor, log)
            self.cursor = pos
            if pos >= self.end or pos >= window_end:
                return  # beyond the window, fetch only into free room
            f = self._stream_mv[pos - self.base]
            tier = self._make_room(f, pos, log)
            if tier is None:
                return  # every resident file is needed sooner: wait for the reader
            self._enter(f, tier)
            log.one(FETCH, f, tier, self.reader, pos)
            self.cursor = pos + 1

    def _next_wanted(self, pos: int) -> int:
        """The first position from pos on whose file is to be fetched: not
        held, not consumed there, and fits some tier."""
        base, end = self.base, self.end
        stream, cons, tier, fits = self._stream_mv, self._cons_mv, self._tier_mv, self._fits_mv
        stop = min(end, pos + SCAN)
        while pos < stop:
            f = stream[pos - base]
            if tier[f] < 0 and not cons[pos - base] and fits[f]:
                return pos
            pos += 1
        step = 4096
        while pos < end:
            hi = min(end, pos + step)
            files = self._stream[pos - base:hi - base]
            wanted = np.flatnonzero((self._tier[files] < 0) & ~self._cons[pos - base:hi - base] & self._fits[files])
            if wanted.size:
                return pos + int(wanted[0])
            pos = hi
            step *= 4
        return end

    def _room_for(self, a: int) -> int:
        """The fastest tier with a bytes free, -1 if none."""
        for k, (cap, u) in enumerate(zip(self.capacities, self.used)):
            if cap - u >= a:
                return k
        return -1

    def _fill_free(self, pos: int, log: _Log) -> int:
        """Fetches into free room from pos on, in stream order, each file into
        the fastest tier with room; returns the first position to fetch for
        whose file has no free room (or end).  The first few one by one, then
        runs with numpy."""
        base, end = self.base, self.end
        for _ in range(SCAN // 4):
            pos = self._next_wanted(pos)
            if pos >= end:
                return end
            f = self._stream_mv[pos - base]
            tier = self._room_for(self._alloc_mv[f])
            if tier < 0:
                return pos
            self._enter(f, tier)
            log.one(FETCH, f, tier, self.reader, pos)
            pos += 1
        step = 256
        while True:
            pos = self._next_wanted(pos)
            if pos >= end:
                return end
            if self._room_for(self._alloc_mv[self._stream_mv[pos - base]]) < 0:
                return pos
            hi = min(end, pos + step)
            files = self._stream[pos - base:hi - base].astype(np.int64)
            wanted = np.flatnonzero((self._tier[files] < 0) & ~self._cons[pos - base:hi - base] & self._fits[files])
            files = files[wanted]
            _, first = np.unique(files, return_index=True)
            first.sort()
            files, wanted = files[first], wanted[first]
            allocs = self._alloc[files]
            tiers = np.full(len(files), -1, np.int8)
            left = np.arange(len(files))
            for t, (cap, u) in enumerate(zip(self.capacities, self.used)):
                if left.size == 0:
                    break
                take = _greedy_take(allocs[left], cap - u)
                tiers[left[take]] = t
                left = left[~take]
            stop = int(left[0]) if left.size else len(files)
            if stop:
                self._enter_many(files[:stop], tiers[:stop])
                log.run(files[:stop], tiers[:stop], self.reader, pos + wanted[:stop])
            if stop < len(files):
                return pos + int(wanted[stop])
            pos = hi
            step *= 4

    def _enter_many(self, files: np.ndarray, tiers: np.ndarray) -> None:
        if files.size == 0:
            return
        self._tier[files] = tiers
        allocs = self._alloc[files]
        for t in range(len(self.used)):
            self.used[t] += int(allocs[tiers == t].sum())
        self.n_resident += len(files)
        self._move(files, tiers, self._need[files], True)

    def adopt(self, f: int, tier: int) -> None:
        """Records a copy that already exists (placed before the plan began)."""
        if self._tier_mv[f] >= 0:
            return
        self._enter(f, tier)

    def adopt_if_room(self, f: int, tier: int) -> bool:
        """Whether a copy that landed on tier is held by the plan there: a
        copy the plan did not ask for (copied on first touch, or left out by
        a new plan while it was copied) is adopted when the plan has room for
        it on that tier (a victim like any other later); False: it is held
        elsewhere or does not fit."""
        if self._tier_mv[f] >= 0:
            return int(self._tier_mv[f]) == tier
        if self.capacities[tier] - self.used[tier] < self._alloc_mv[f]:
            return False
        self._enter(f, tier)
        return True

    def held_on(self, files: np.ndarray, tier: int) -> np.ndarray:
        """Which of files the plan holds on tier."""
        return self._tier[files] == tier

    def adopt_many(self, files: np.ndarray, tiers: np.ndarray) -> None:
        """adopt() of each (file, tier), the first of a file only, in one pass."""
        files, first = np.unique(np.asarray(files, np.int64), return_index=True)
        tiers = np.asarray(tiers, np.int8)[first]
        fresh = self._tier[files] < 0
        self._enter_many(files[fresh], tiers[fresh])

    def drop(self, f: int) -> None:
        """Forgets a resident file (its copy failed or was invalidated)."""
        if self._tier_mv[f] >= 0:
            self._leave(f)

    def used_later(self, needs: np.ndarray) -> np.ndarray:
        """Per known stream position: whether its file has a known use after it."""
        needs = np.asarray(needs, np.int64)
        out = np.zeros(len(needs), bool)
        held = (needs >= self.base) & (needs < self.end)
        out[held] = self._next[needs[held] - self.base] != INF
        return out

    def pass_over(self, files: np.ndarray, needs: np.ndarray, reach: int) -> None:
        """Planned fetches not made (NOTE [skip ahead]): each file's use at
        its need is left to the reader, which reads it before reach; the
        file is no longer held, and the cursor goes back to its next use
        after that one, no further back than reach (a use before reach
        would be passed over again), so that it is planned there."""
        files, needs = np.asarray(files, np.int64), np.asarray(needs, np.int64)
        back = INF
        for f, need in zip(files.tolist(), needs.tolist()):
            self.drop(f)
            if self.base <= need < self.end:
                nxt = int(self._next[need - self.base])
                if nxt != INF:
                    back = min(back, nxt)
        if back != INF:
            self.cursor = min(self.cursor, max(back, reach, self.reader))

    def _make_room(self, f: int, need: int, log: _Log) -> int | None:
        size = self._alloc_mv[f]
        caps, used = self.capacities, self.used
        candidates = self._candidates.get(size)
        if candidates is None:
            candidates = self._candidates[size] = [k for k, cap in enumerate(caps) if size <= cap]
        victims: list[tuple[int, int]] = []
        while True:
            for k in candidates:
                if caps[k] - used[k] >= size:
                    for v, t in victims:
                        if t == k:
                            log.one(EVICT, v, t, self.reader)
                        else:  # it made no room where f goes: it stays
                            self._enter(v, t)
                    return k
            # evict the file needed farthest in the future, across tiers, if it
            # is needed after `need`; otherwise undo and wait for the reader.
            # (A prefetched file not read yet is never the victim.  Belady
            # would sometimes rather wait for the reader to read it and evict
            # it then; that saves PFS bytes only when the window is a large
            # share of the tier, and costs the prefetch its lead.)
            best = self._victim(candidates)
            if best is None or best[2] <= need:
                for v, t in victims:
                    self._enter(v, t)
                return None
            victims.append((best[0], self._leave(best[0])))

    # -- offline: how long nothing can happen ------------------------------------
    def _quiet_until(self, stop: int) -> int:
        """With the reader reading in order from self.reader and advance()
        just called: the first reader position after it at which advance()
        may act again (at most stop)."""
        r, c = self.reader, self.cursor
        if c >= self.end:
            return stop      # everything known is placed
        if self.window is not None and c >= r + self.window:
            return max(r + 1, min(stop, c - self.window + 1))   # the window reaches c
        # making room for c failed: it may succeed once a held file read
        # before c is next needed after c (or never), and does at c at the latest
        hi = min(stop, c, r + SCAN)    # (an earlier answer only costs a call of advance)
        base = self.base
        stream, tier, nxt = self._stream_mv, self._tier_mv, self._next_mv
        q = r
        while q < hi:
            if nxt[q - base] > c and tier[stream[q - base]] >= 0:
                return q + 1
            q += 1
        return max(hi, r + 1)


# -- offline simulation -----------------------------------------------------------

@dataclass
class EpochReport:
    accesses: int = 0
    hits: list[int] = field(default_factory=list)   # per tier
    pfs_reads: int = 0          # accesses served from the PFS
    pfs_bytes: int = 0          # bytes read from the PFS: fetches + misses
    fetches: int = 0
    evictions: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"accesses": self.accesses, "hits_by_tier": self.hits, "pfs_reads": self.pfs_reads,
                "pfs_bytes": self.pfs_bytes, "fetches": self.fetches, "evictions": self.evictions}


def _account(p: Planner, r: EpochReport, acts: Actions, kept: list[Actions] | None) -> None:
    if len(acts) == 0:
        return
    if kept is not None:
        kept.append(acts)
    fetched = acts.file[acts.fetches]
    r.fetches += len(fetched)
    r.evictions += len(acts) - len(fetched)
    r.pfs_bytes += int(p._size[fetched].sum())


def _read(p: Planner, r: EpochReport, start: int, stop: int) -> None:
    """The reader reads positions start..stop (nothing is placed meanwhile)."""
    base = p.base
    if stop - start <= SCAN:
        stream, tier, size = p._stream_mv, p._tier_mv, p._size_mv
        for pos in range(start, stop):
            f = stream[pos - base]
            t = tier[f]
            if t < 0:
                r.pfs_reads += 1
                r.pfs_bytes += size[f]
            else:
                r.hits[t] += 1
            p.consume(pos)
        r.accesses += stop - start
        return
    _count_reads(p, r, p._stream[start - base:stop - base])
    p.consume_range(start, stop)


def _count_reads(p: Planner, r: EpochReport, files: np.ndarray) -> None:
    """Counts reads of these files where they are placed now."""
    tiers = p._tier[files]
    missed = tiers < 0
    r.accesses += len(files)
    r.pfs_reads += int(missed.sum())
    r.pfs_bytes += int(p._size[files[missed]].sum())
    for t, h in enumerate(np.bincount(tiers[~missed], minlength=len(r.hits)).tolist()):
        r.hits[t] += h


def _run_python(p: Planner, r: EpochReport, pos: int, stop: int, kept: list[Actions] | None, log: _Log) -> None:
    """The loop of simulate() over positions pos..stop in Python: advance,
    read until advance may act again, and so on."""
    while pos < stop:
        p._advance(log)
        quiet = p._quiet_until(stop)
        _read(p, r, pos, quiet)
        pos = quiet
        if len(log.kind) >= 1 << 16:
            _account(p, r, log.take(), kept)
    _account(p, r, log.take(), kept)


def _run_core(p: Planner, r: EpochReport, pos: int, stop: int, kept: list[Actions] | None) -> None:
    """The loop of simulate() over positions pos..stop in the C core; the
    actions are counted there, and kept only when kept is a list."""
    while pos < stop:
        core = p._load_core()
        c = core.c
        c.accesses = c.pfs_reads = c.pfs_bytes = c.fetches = c.evictions = c.fetch_bytes = 0
        c.keep_log = kept is not None
        core.hits[:] = 0
        try:
            pos = _lib.tp_run(core.addr, pos, stop, CORE_LOG)
        finally:
            core.store(p)
            c.keep_log = 1
        if pos < 0:
            raise MemoryError("planner: out of memory")
        r.accesses += c.accesses
        r.pfs_reads += c.pfs_reads
        r.pfs_bytes += c.pfs_bytes + c.fetch_bytes
        r.fetches += c.fetches
        r.evictions += c.evictions
        r.hits = [h + int(k) for h, k in zip(r.hits, core.hits)]
        if kept is not None:
            kept.append(core.take_log())


def simulate(epochs: Iterable[Sequence[int] | np.ndarray], sizes: Sequence[int] | np.ndarray,
             capacities: Sequence[int], *, window: int | None = 64, known_ahead: int = 1,
             schedule: bool = True) -> tuple[list[EpochReport], Actions]:
    """Runs the planner over the epochs with a reader that never waits for a
    fetch (unlimited PFS bandwidth).  known_ahead: how many epochs beyond the
    current one are known (1: the next epoch's order is known while the
    current one runs; 0: each epoch's order arrives when it starts).  Epochs
    are taken from the iterable as they become known, so that at most
    1 + known_ahead of them are held; schedule=False keeps no actions.
    Once every file a tier can hold is placed, the epochs left are counted
    from their orders (docs/design.md, NOTE [plan fast-forward])."""
    p = Planner(sizes, capacities, window=window)
    reports: list[EpochReport] = []
    kept: list[Actions] = []
    source = iter(epochs)
    known: deque[int] = deque()      # lengths of the epochs extended and not yet read
    exhausted = False
    log = _Log()
    fitting = int(np.count_nonzero(p._fits))   # files some tier can hold
    while True:
        while len(known) < 1 + known_ahead and not exhausted:
            order = next(source, None)
            if order is None:
                exhausted = True
                break
            ids = _as_ids(order)
            p.extend(ids)
            known.append(len(ids))
        if not known:
            break
        if p.n_resident == fitting:
            _all_placed(p, reports, known, source)
            break
        r = EpochReport(hits=[0] * len(p.capacities))
        reports.append(r)
        pos = p.reader
        stop = pos + known.popleft()
        if core_available():
            _run_core(p, r, pos, stop, kept if schedule else None)
        else:
            _run_python(p, r, pos, stop, kept if schedule else None, log)
    return reports, Actions.concat(kept)


def _all_placed(p: Planner, reports: list[EpochReport], known: deque[int], source: Iterator[Any]) -> None:
    """The epochs left once every file some tier can hold is placed (a data
    set that fits, read once): the plan has nothing left to do, since it
    only fetches files not placed and evicts only to make room for such a
    fetch, so each read is a hit where the file is, or a PFS read of a file
    no tier can hold.  Counted from the orders, without the planner's walk
    over each position (NOTE [plan fast-forward])."""
    pos = p.reader
    for n in known:
        r = EpochReport(hits=[0] * len(p.capacities))
        _count_reads(p, r, p._stream[pos - p.base:pos + n - p.base])
        reports.append(r)
        pos += n
    known.clear()
    for order in source:
        r = EpochReport(hits=[0] * len(p.capacities))
        _count_reads(p, r, _as_ids(order))
        reports.append(r)


__all__ = ["INF", "Action", "Actions", "EpochReport", "Planner", "allocation", "allocations", "simulate"]
