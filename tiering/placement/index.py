"""The shared index and event ring, seen from Python.

The layout is defined once, in shim/tiering.h; this module hands the text
between its CDEF markers to cffi and maps the index file with it.  The
helpers that need atomics or speed (fingerprints, table fill, compare-and-swap
of a state word, draining the ring) live in libtiershim.so and are reached
through the same cffi definitions.
"""
from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cffi
import numpy as np

PACKAGE_DIR = Path(__file__).resolve().parent.parent     # tiering/
RING_MIN = 1 << 16        # ring slots at least (1.5 MiB)
RING_MAX = 1 << 21        # ... and at most (48 MiB)
DRAIN = 1 << 16           # events copied out of the ring per call of the C helper


def _first_existing(*candidates: Path) -> Path:
    for c in candidates:
        if c.exists():
            return c
    raise FileNotFoundError(
        f"{candidates[0].name} not found (looked in {', '.join(str(c.parent) for c in candidates)}); "
        "reinstall with `pip install .` or build in place with `make`"
    )


def header_path() -> Path:
    """tiering.h: shipped inside the package, or shim/ in a source checkout."""
    return _first_existing(PACKAGE_DIR / "tiering.h", PACKAGE_DIR.parent / "shim" / "tiering.h")


def library_path() -> Path:
    """libtiershim.so, built into the package by setup.py (or `make`)."""
    return _first_existing(PACKAGE_DIR / "libtiershim.so", PACKAGE_DIR.parent / "shim" / "libtiershim.so")


def _cdef_text() -> str:
    text = header_path().read_text()
    try:
        return text.split("/* BEGIN CDEF */", 1)[1].split("/* END CDEF */", 1)[0]
    except IndexError:
        raise RuntimeError(f"{header_path()}: CDEF markers missing") from None


ffi = cffi.FFI()
ffi.cdef(_cdef_text())


class _Library:
    """libtiershim.so, opened on first use: importing tiering (profiles, the
    catalog, `tiering profile check`) never needs the built library."""

    _lib: Any = None

    def __getattr__(self, name: str) -> Any:
        if _Library._lib is None:
            _Library._lib = ffi.dlopen(str(library_path()))
        return getattr(_Library._lib, name)


lib: Any = _Library()


@dataclass(frozen=True)
class Root:
    """A logical prefix that the shim matches; aliases share the id."""

    path: str
    id: int
    has_dir_links: bool = False


@dataclass(frozen=True)
class Event:
    kind: int
    slot: int
    pid: int
    tier: int


# struct tiering_event as numpy sees it (checked against the header's size below)
EVENT_DTYPE = np.dtype([("seq", "<u8"), ("entry", "<u4"), ("pid", "<u4"), ("kind", "<u2"), ("tier", "<u2"),
                        ("reserved", "<u4")])
assert EVENT_DTYPE.itemsize == ffi.sizeof("struct tiering_event"), "struct tiering_event changed"


def ring_events(files: int) -> int:
    """Ring slots for a catalog of this many files (NOTE [event batches]): a
    power of two that holds two epochs' opens and closes (four events per
    file: a daemon starved of CPU by a fast reader catches up before the ring
    laps), between RING_MIN and RING_MAX."""
    want = min(max(4 * files, RING_MIN), RING_MAX)
    return 1 << (want - 1).bit_length()


def events_array(events: Sequence[Event]) -> np.ndarray:
    """Event records as the ring's drain gives them."""
    out = np.zeros(len(events), EVENT_DTYPE)
    for k, e in enumerate(events):
        out[k] = (0, e.slot, e.pid, e.kind, e.tier, 0)
    return out


def fingerprint(root: int, rel: str) -> tuple[int, int]:
    out = ffi.new("uint64_t[2]")
    data = rel.encode("utf-8", "surrogateescape")
    lib.tiering_fingerprint(root, data, len(data), out)
    return int(out[0]), int(out[1])


def _table_slots(n: int) -> int:
    slots = 1024
    while slots < 2 * n:
        slots *= 2
    return slots


def _set_prefix(dst: Any, path: str, ident: int, flags: int) -> None:
    data = path.encode("utf-8", "surrogateescape")
    if len(data) >= lib.TIERING_PATH_MAX:
        raise ValueError(f"path too long for the index ({len(data)} bytes, at most "
                         f"{lib.TIERING_PATH_MAX - 1}): {path}")
    dst.len = len(data)
    dst.id = ident
    dst.flags = flags
    ffi.memmove(dst.path, data, len(data))


class SharedIndex:
    """One mapped index file.  Create it with `SharedIndex.create`; open an
    existing one (tests, tools) with `SharedIndex.open`."""

    def __init__(self, path: Path, mm: mmap.mmap):
        self.path = path
        self._mm = mm
        self._buf = ffi.from_buffer(mm)
        self.base = ffi.cast("void *", self._buf)
        self.header: Any = ffi.cast("struct tiering_header *", self._buf)
        self.entries: Any = ffi.cast("struct tiering_entry *",
                                     self._buf + self.header.entries_offset)
        self._tail = ffi.new("uint64_t *", 0)
        self._dropped = ffi.new("uint64_t *", 0)
        self._out = ffi.new("struct tiering_event[]", DRAIN)

    # -- creation ---------------------------------------------------------
    @classmethod
    def create(cls, path: Path, roots: Sequence[Root], tiers: Sequence[str],
               rels: Sequence[str], root_ids: Sequence[int], sizes: Sequence[int],
               mtimes: Sequence[int], ring_size: int | None = None) -> tuple[SharedIndex, list[int]]:
        """Writes a new index at path (mode 0600) and returns it with the slot
        of every catalogued file, in the order given.  The ring has ring_size
        slots (a power of two; default: ring_events of the file count)."""
        if len(roots) > lib.TIERING_MAX_ROOTS:
            raise ValueError(f"at most {lib.TIERING_MAX_ROOTS} data roots (with aliases), got {len(roots)}")
        if len(tiers) > lib.TIERING_MAX_TIERS:
            raise ValueError(f"at most {lib.TIERING_MAX_TIERS} tiers, got {len(tiers)}")
        n = len(rels)
        nslots = _table_slots(n)
        ring_size = ring_events(n) if ring_size is None else ring_size
        if ring_size < 1 or ring_size & (ring_size - 1):
            raise ValueError(f"the event ring needs a power of two of slots, not {ring_size}")
        hsize = ffi.sizeof("struct tiering_header")
        esize = ffi.sizeof("struct tiering_entry")
        evsize = ffi.sizeof("struct tiering_event")
        entries_offset = (hsize + 63) // 64 * 64
        ring_offset = (entries_offset + nslots * esize + 63) // 64 * 64
        total = ring_offset + ring_size * evsize
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, total)
            mm = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        buf = ffi.from_buffer(mm)
        h: Any = ffi.cast("struct tiering_header *", buf)
        h.version = lib.TIERING_VERSION
        h.header_size = hsize
        h.entry_size = esize
        h.event_size = evsize
        h.nslots = nslots
        h.nevents = ring_size
        h.entries_offset = entries_offset
        h.ring_offset = ring_offset
        h.total_size = total
        h.daemon_pid = os.getpid()
        h.nroots = len(roots)
        for i, r in enumerate(roots):
            _set_prefix(h.roots[i], r.path, r.id, lib.TIERING_ROOT_HAS_DIR_LINKS if r.has_dir_links else 0)
        h.ntiers = len(tiers)
        for i, t in enumerate(tiers):
            _set_prefix(h.tiers[i], t, i, 0)
        blob = b"".join(r.encode("utf-8", "surrogateescape") + b"\0" for r in rels)
        slots = ffi.new("uint64_t[]", max(n, 1))
        got = lib.tiering_index_fill(
            ffi.cast("void *", buf), blob, len(blob),
            ffi.new("uint32_t[]", list(root_ids) or [0]),
            ffi.new("uint64_t[]", list(sizes) or [0]),
            ffi.new("int64_t[]", list(mtimes) or [0]), n, slots)
        if got <= -2:
            raise ValueError(f"duplicate catalog path: {rels[-2 - got]!r}")
        if got < 0:
            raise RuntimeError("index table overflow (internal error)")
        h.magic = lib.TIERING_MAGIC  # last: a reader trusts nothing before it
        del h, buf
        return cls(path, mm), [int(slots[i]) for i in range(n)]

    @classmethod
    def open(cls, path: Path) -> SharedIndex:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        index = cls(path, mm)
        if index.header.magic != lib.TIERING_MAGIC or index.header.version != lib.TIERING_VERSION:
            index.close()
            raise ValueError(f"{path}: not a tiering index of version {lib.TIERING_VERSION}")
        return index

    # -- state words ------------------------------------------------------
    def state(self, slot: int) -> int:
        return int(self.entries[slot].state)

    def cas_state(self, slot: int, expected: int, desired: int) -> bool:
        return bool(lib.tiering_state_cas(self.base, slot, expected, desired))

    def entry(self, slot: int) -> Any:
        return self.entries[slot]

    def set_disabled(self, disabled: bool) -> None:
        self.header.disabled = 1 if disabled else 0

    # -- counters and ring ------------------------------------------------
    def counters(self) -> dict[str, Any]:
        c = self.header.counters
        tiers = [int(c.opens_tier[i]) for i in range(self.header.ntiers)]
        return {
            "opens": int(c.opens_pfs) + sum(tiers),
            "opens_pfs": int(c.opens_pfs),
            "opens_tier": tiers,
            "bytes_tier": int(c.bytes_tier),
            "fallbacks": int(c.fallbacks),
            "writes": int(c.writes),
            "events_posted": int(self.header.ring_head),
            "events_dropped": int(c.events_dropped),
        }

    def drain_batch(self, force: bool = False) -> np.ndarray:
        """Events posted since the last drain (one consumer only), as an
        EVENT_DTYPE array: the C helper copies complete records out of the
        ring (its seqlock check) into a buffer numpy then reads in place."""
        parts: list[np.ndarray] = []
        while True:
            n = int(lib.tiering_ring_drain(self.base, self._tail, self._out, DRAIN, 1 if force else 0,
                                           self._dropped))
            if n:
                parts.append(np.frombuffer(ffi.buffer(self._out, n * EVENT_DTYPE.itemsize), EVENT_DTYPE).copy())
            if n < DRAIN:
                break
        self.header.counters.events_dropped = self._dropped[0]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, EVENT_DTYPE)

    def drain(self, force: bool = False) -> list[Event]:
        """drain_batch as Event objects (for tests and tools)."""
        return [Event(int(e["kind"]), int(e["entry"]), int(e["pid"]), int(e["tier"]))
                for e in self.drain_batch(force)]

    def pending_events(self) -> int:
        return int(self.header.ring_head) - int(self._tail[0])

    def close(self) -> None:
        del self.entries, self.header, self.base, self._buf
        self._mm.close()
