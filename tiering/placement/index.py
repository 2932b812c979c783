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

PACKAGE_DIR = Path(__file__).resolve().parent.parent     # tiering/
RING_EVENTS = 1 << 16


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


def fingerprint(root: int, rel: str) -> tuple[int, int]:
    out = ffi.new("uint64_t[2]")
    data = rel.encode("utf-8", "surrogateescape")
    lib.tiering_fingerprint(root, data, len(data), out)
    return int(out[0]), int(out[1])


def _table_slots(n: int) -> int:
    """Slots of the entry and identity tables: a power of two, at most two
    thirds full (1.28 M files: 2^21 slots of 56 + 4 bytes, 98 bytes a file)."""
    slots = 1024
    while 2 * slots < 3 * n:
        slots *= 2
    if slots > 1 << 31:
        raise ValueError(f"{n} files are more than the index can hold")
    return slots


def dev32(st_dev: int) -> int:
    """The device number an entry records: its low 32 bits (all of it on
    Linux, whose device numbers are 32 bits); the shim compares the same."""
    return st_dev & 0xFFFFFFFF


def _set_prefix(dst: Any, path: str, ident: int, flags: int) -> None:
    data = path.encode("utf-8", "surrogateescape")
    if len(data) >= lib.TIERING_PATH_MAX:
        raise ValueError(f"path too long for the index ({len(data)} bytes, at most "
                         f"{lib.TIERING_PATH_MAX - 1}): {path}")
    dst.len = len(data)
    dst.id = ident
    dst.flags = flags
    ffi.memmove(dst.path, data, len(data))


def _set_tier(dst: Any, path: str, ident: int) -> None:
    """A tier root, with the device and inode of the directory as it is now
    (the shim refuses a tier root that is no longer that directory)."""
    _set_prefix(dst, path, ident, 0)
    try:
        st = os.stat(path)
    except OSError:
        return  # left 0: the shim will not redirect into it
    dst.dev = st.st_dev
    dst.ino = st.st_ino


def _u32s(values: list[int], n: int) -> Any:
    """A uint32_t array of the values, or of n zeros (unknown) when none are given."""
    return ffi.new("uint32_t[]", values) if values else ffi.new("uint32_t[]", max(n, 1))


def _u64s(values: list[int], n: int) -> Any:
    return ffi.new("uint64_t[]", values) if values else ffi.new("uint64_t[]", max(n, 1))


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
        self._out = ffi.new("struct tiering_event[]", 4096)

    # -- creation ---------------------------------------------------------
    @classmethod
    def create(cls, path: Path, roots: Sequence[Root], tiers: Sequence[str],
               rels: Sequence[str], root_ids: Sequence[int], sizes: Sequence[int],
               mtimes: Sequence[int], devs: Sequence[int] | None = None,
               inos: Sequence[int] | None = None,
               ring_events: int = RING_EVENTS) -> tuple[SharedIndex, list[int]]:
        """Writes a new index at path (mode 0600) and returns it with the slot
        of every catalogued file, in the order given.  devs and inos are the
        files' st_dev and st_ino (0: unknown), which link the entries of one
        file (hard links, symlinks) so that a write through any of its paths
        invalidates all of them; tiers are directories that exist now."""
        if len(roots) > lib.TIERING_MAX_ROOTS:
            raise ValueError(f"at most {lib.TIERING_MAX_ROOTS} data roots (with aliases), got {len(roots)}")
        if len(tiers) > lib.TIERING_MAX_TIERS:
            raise ValueError(f"at most {lib.TIERING_MAX_TIERS} tiers, got {len(tiers)}")
        n = len(rels)
        if any(col is not None and len(col) != n for col in (devs, inos)):
            raise ValueError("devs and inos must give one value per file")
        nslots = _table_slots(n)
        hsize = ffi.sizeof("struct tiering_header")
        esize = ffi.sizeof("struct tiering_entry")
        evsize = ffi.sizeof("struct tiering_event")
        entries_offset = (hsize + 63) // 64 * 64
        idents_offset = (entries_offset + nslots * esize + 63) // 64 * 64
        ring_offset = (idents_offset + nslots * 4 + 63) // 64 * 64
        total = ring_offset + ring_events * evsize
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
        h.nevents = ring_events
        h.entries_offset = entries_offset
        h.idents_offset = idents_offset
        h.ring_offset = ring_offset
        h.total_size = total
        h.daemon_pid = os.getpid()
        h.nroots = len(roots)
        for i, r in enumerate(roots):
            _set_prefix(h.roots[i], r.path, r.id, lib.TIERING_ROOT_HAS_DIR_LINKS if r.has_dir_links else 0)
        h.ntiers = len(tiers)
        for i, t in enumerate(tiers):
            _set_tier(h.tiers[i], t, i)
        blob = b"".join(r.encode("utf-8", "surrogateescape") + b"\0" for r in rels)
        slots = ffi.new("uint64_t[]", max(n, 1))
        got = lib.tiering_index_fill(
            ffi.cast("void *", buf), blob, len(blob),
            ffi.new("uint32_t[]", list(root_ids) or [0]),
            ffi.new("uint64_t[]", list(sizes) or [0]),
            ffi.new("int64_t[]", list(mtimes) or [0]),
            _u32s([dev32(d) for d in devs or []], n), _u64s(list(inos or []), n), n, slots)
        if got <= -2:
            raise ValueError(f"duplicate catalog path: {rels[-2 - got]!r}")
        if got < 0:
            raise RuntimeError("index table overflow (internal error)")
        h.magic = lib.TIERING_MAGIC  # last: a reader trusts nothing before it
        del h, buf
        return cls(path, mm), [int(slots[i]) for i in range(n)]

    @classmethod
    def open(cls, path: Path, readonly: bool = False) -> SharedIndex:
        """An existing index; readonly maps it for reading only (`tiering
        status` reads the counters of a running job that way)."""
        fd = os.open(path, (os.O_RDONLY if readonly else os.O_RDWR) | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | (0 if readonly else mmap.PROT_WRITE))
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

    def aliases(self, slot: int) -> list[int]:
        """slot and the slots of every other path of the same file (its
        ring, NOTE [alias invalidation])."""
        out = [slot]
        mask = int(self.header.nslots) - 1
        s = int(self.entries[slot].next_alias) & mask
        while s != slot and len(out) <= mask:
            out.append(s)
            s = int(self.entries[s].next_alias) & mask
        return out

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

    def drain(self, force: bool = False) -> list[Event]:
        """Events posted since the last drain (one consumer only)."""
        events: list[Event] = []
        while True:
            n = lib.tiering_ring_drain(self.base, self._tail, self._out, len(self._out),
                                       1 if force else 0, self._dropped)
            events.extend(Event(int(e.kind), int(e.entry), int(e.pid), int(e.tier))
                          for e in self._out[0:n])
            if n < len(self._out):
                break
        self.header.counters.events_dropped = self._dropped[0]
        return events

    def pending_events(self) -> int:
        return int(self.header.ring_head) - int(self._tail[0])

    def close(self) -> None:
        del self.entries, self.header, self.base, self._buf
        self._mm.close()
