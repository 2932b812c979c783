"""The shared index and event ring, seen from Python.

The layout is defined once, in shim/tiering.h; this module hands the text
between its CDEF markers to cffi and maps the index file with it.  The
helpers that need atomics or speed (fingerprints, table fill, compare-and-swap
of a state word, draining the ring) live in libtiershim.so and are reached
through the same cffi definitions.
"""
from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..catalog.model import FileTable, IntColumn
from ..shimlib import ffi, lib, numpy_dtype

if TYPE_CHECKING:
    from ..catalog import Catalog

RING_MIN = 1 << 16        # ring slots at least (2 MiB)
RING_MAX = 1 << 20        # ... and at most (32 MiB: 2.6 s of events at 200 k opens/s)
# identities of write opens an index filled from names first can log (16 MiB
# of the index file at most, a sparse file: only the entries logged take pages)
WRITE_LOG = 1 << 20
DRAIN = 1 << 16           # events copied out of the ring per call of the C helper
BATCH_EVENTS = 1 << 18    # events in one drained batch at most (8 MiB; NOTE [event batches])


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
    tag: int = 0     # the posting thread's tag (NOTE [open tags]), 0: none
    bytes: int = 0   # a close: bytes read through the open file (NOTE [read counters])


@dataclass(frozen=True)
class FileStats:
    """The scan's stat of each catalogued path (symlinks followed) beyond
    size, mtime and identity, one value per file, in the order of the paths;
    `exact[i]` says whether stat of path i may be answered from the index
    (the record is this job's own scan: NOTE [stat from the index])."""

    mode: IntColumn
    uid: IntColumn
    gid: IntColumn
    nlink: IntColumn
    atime_ns: IntColumn
    ctime_ns: IntColumn
    blocks: IntColumn
    blksize: IntColumn
    exact: Sequence[bool] | np.ndarray

    @classmethod
    def of(cls, stats: Sequence[os.stat_result], exact: Sequence[bool]) -> FileStats:
        """From stat results (os.stat of each path, symlinks followed)."""
        return cls(mode=[s.st_mode for s in stats], uid=[s.st_uid for s in stats], gid=[s.st_gid for s in stats],
                   nlink=[s.st_nlink for s in stats], atime_ns=[s.st_atime_ns for s in stats],
                   ctime_ns=[s.st_ctime_ns for s in stats], blocks=[s.st_blocks for s in stats],
                   blksize=[s.st_blksize for s in stats], exact=exact)


@dataclass(frozen=True)
class Credentials:
    """Who scanned: the shim answers stat from the index only to processes
    with the same ids and supplementary groups (they reach the same paths)."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    caps: int = 0   # TIERING_CAP_* it holds (NOTE [served descriptors])

    @classmethod
    def current(cls) -> Credentials:
        return cls(os.geteuid(), os.getegid(), tuple(sorted(set(os.getgroups()))), dac_capabilities())


def dac_capabilities() -> int:
    """The TIERING_CAP_* bits of this process's effective capabilities
    (CAP_DAC_OVERRIDE is capability 1, CAP_DAC_READ_SEARCH 2: the kernel's
    bits 1 and 2 of CapEff); 0 when /proc does not say."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    eff = int(line.split()[1], 16)
                    return ((lib.TIERING_CAP_DAC_OVERRIDE if eff >> 1 & 1 else 0)
                            | (lib.TIERING_CAP_DAC_READ_SEARCH if eff >> 2 & 1 else 0))
    except (OSError, ValueError, IndexError):
        pass
    return 0


# struct tiering_event as numpy sees it; events_array fills its fields in
# the header's order
EVENT_DTYPE = numpy_dtype("struct tiering_event")


def ring_events(files: int) -> int:
    """Ring slots for a catalog of this many files (NOTE [event batches]): a
    power of two that holds two epochs' opens and closes (four events per
    file: a daemon starved of CPU by a fast reader catches up before the ring
    laps), between RING_MIN and RING_MAX (NOTE [event batches])."""
    want = min(max(4 * files, RING_MIN), RING_MAX)
    return 1 << (want - 1).bit_length()


def events_array(events: Sequence[Event]) -> np.ndarray:
    """Event records as the ring's drain gives them."""
    out = np.zeros(len(events), EVENT_DTYPE)
    for k, e in enumerate(events):
        out[k] = (0, e.slot, e.pid, e.kind, e.tier, e.tag, e.bytes)
    return out


def fingerprint(root: int, rel: str) -> tuple[int, int]:
    out = ffi.new("uint64_t[2]")
    data = rel.encode("utf-8", "surrogateescape")
    lib.tiering_fingerprint(root, data, len(data), out)
    return int(out[0]), int(out[1])


def _table_slots(n: int) -> int:
    """Slots of the entry and identity tables: a power of two, at most two
    thirds full.  With the file records: 1.28 M files take 2^21 slots of
    40 + 4 bytes and 1.28 M records of 72 bytes, 144 bytes a file."""
    slots = 1024
    while 2 * slots < 3 * n:
        slots *= 2
    if slots > 1 << 31:
        raise ValueError(f"{n} files are more than the index can hold")
    return slots


U32 = 1 << 32


def _column(values: IntColumn | None, n: int, dtype: str) -> np.ndarray:
    return np.zeros(n, dtype) if values is None else np.asarray(values, dtype)


def _write_records(recs: np.ndarray, devs: IntColumn | None, inos: IntColumn | None,
                   mtimes: IntColumn, links: Sequence[bool] | np.ndarray | None, stats: FileStats | None,
                   pending: np.ndarray | None = None) -> None:
    """The file records, but for next_alias (tiering_index_fill links the
    rings): identity, mtime, the scan's stat and the flags; complete but
    for the pending ones (NOTE [names first]), whose records are all 0."""
    n = len(recs)
    dev = _column(devs, n, "u8")
    recs["dev"] = dev & 0xFFFFFFFF
    recs["ino"] = _column(inos, n, "u8")
    recs["mtime_ns"] = _column(mtimes, n, "i8")
    flags = np.zeros(n, "u4")
    if links is not None:
        flags[~np.asarray(links, bool)] |= lib.TIERING_FILE_NO_LINK
    if stats is not None:
        fits = dev < U32
        for name in ("mode", "uid", "gid", "nlink", "blksize"):
            col = _column(getattr(stats, name), n, "u8")
            fits &= col < U32
            recs[name] = col & 0xFFFFFFFF
        for name in ("atime_ns", "ctime_ns", "blocks"):
            recs[name] = _column(getattr(stats, name), n, "i8")
        # a value the record cannot hold whole (a 64-bit device) is never served
        flags[np.asarray(stats.exact, bool) & fits] |= lib.TIERING_FILE_STAT
    flags |= lib.TIERING_FILE_COMPLETE
    recs["flags"] = flags
    if pending is not None:
        recs[np.asarray(pending, bool)] = 0


def file_stats(cat: Catalog, ids: np.ndarray | None = None) -> FileStats:
    """The catalog's stat columns (of the files ids only, when given); exact
    for the roots scanned now, not for those taken from the scan cache (a
    file changed in place since the cache was written does not show in it:
    NOTE [stat from the index])."""
    t = cat.files
    cached = np.asarray(cat.cached or [False] * len(cat.roots), bool)
    pick = (lambda col: col) if ids is None else (lambda col: col[ids])
    return FileStats(mode=pick(t.mode), uid=pick(t.uid), gid=pick(t.gid), nlink=pick(t.nlink),
                     atime_ns=pick(t.atime_ns), ctime_ns=pick(t.ctime_ns), blocks=pick(t.blocks),
                     blksize=pick(t.blksize), exact=~cached[pick(t.root)] if len(cached) else np.zeros(0, bool))


def _aligned(offset: int) -> int:
    return (offset + 63) // 64 * 64


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


class SharedIndex:
    """One mapped index file.  Create it with `SharedIndex.create` (or
    `for_catalog`); open an existing one (tests, tools) with `SharedIndex.open`.

    `opens` is a live numpy view of every entry's open counter, by slot
    (NOTE [open counters]); `files` one of the file records, in catalog order."""

    def __init__(self, path: Path, mm: mmap.mmap):
        self.path = path
        self._mm = mm
        self._buf = ffi.from_buffer(mm)
        self.base = ffi.cast("void *", self._buf)
        self.header: Any = ffi.cast("struct tiering_header *", self._buf)
        h = self.header
        self.entries: Any = ffi.cast("struct tiering_entry *", self._buf + h.entries_offset)
        self.opens: np.ndarray = np.ndarray(
            (int(h.nslots),), "<u4", buffer=mm, strides=(ffi.sizeof("struct tiering_entry"),),
            offset=int(h.entries_offset) + ffi.offsetof("struct tiering_entry", "opens"))
        self._states: np.ndarray = np.ndarray(
            (int(h.nslots),), "<u4", buffer=mm, strides=(ffi.sizeof("struct tiering_entry"),),
            offset=int(h.entries_offset) + ffi.offsetof("struct tiering_entry", "state"))
        self.files: np.ndarray = np.ndarray((int(h.nfiles),), numpy_dtype("struct tiering_file"), buffer=mm,
                                            offset=int(h.files_offset))
        self._tail = ffi.new("uint64_t *", 0)
        self._dropped = ffi.new("uint64_t *", 0)
        self._out = ffi.new("struct tiering_event[]", DRAIN)

    def records(self) -> Any:
        """The file records as a C pointer (struct tiering_file *), by
        catalog id: what the daemon's copies verify (NOTE [served
        descriptors])."""
        return ffi.cast("struct tiering_file *", self._buf + self.header.files_offset)

    # -- creation ---------------------------------------------------------
    @classmethod
    def create(cls, path: Path, roots: Sequence[Root], tiers: Sequence[str],
               rels: Sequence[str] | FileTable, root_ids: IntColumn, sizes: IntColumn,
               mtimes: IntColumn, devs: IntColumn | None = None,
               inos: IntColumn | None = None, links: Sequence[bool] | np.ndarray | None = None,
               stats: FileStats | None = None, scanner: Credentials | None = None,
               ring_size: int | None = None, pending: np.ndarray | None = None) -> tuple[SharedIndex, np.ndarray]:
        """Writes a new index at path (mode 0600) and returns it with the slot (int64 array)
        of every catalogued file, in the order given.  devs and inos are the
        files' st_dev and st_ino (0: unknown), which link the entries of one
        file (hard links, symlinks) so that a write through any of its paths
        invalidates all of them; links[i] says whether path i itself is a
        symlink (None: unknown, so O_NOFOLLOW opens and lstat of every path go
        to the PFS); stats is the rest of the scan's stat (None: no stat is
        answered from the index), scanner who scanned (default: this
        process); tiers are directories that exist now.  The ring has
        ring_size slots (a power of two; default: ring_events of the file
        count).  pending marks the files known by name only (NOTE [names
        first]): their entries are not complete until `complete` fills
        them, and the index is filling until `filled`."""
        if len(roots) > lib.TIERING_MAX_ROOTS:
            raise ValueError(f"at most {lib.TIERING_MAX_ROOTS} data roots (with aliases), got {len(roots)}")
        if len(tiers) > lib.TIERING_MAX_TIERS:
            raise ValueError(f"at most {lib.TIERING_MAX_TIERS} tiers, got {len(tiers)}")
        n = len(rels)
        if any(col is not None and len(col) != n for col in (devs, inos, links)):
            raise ValueError("devs, inos and links must give one value per file")
        if stats is not None and any(len(getattr(stats, k)) != n for k in FileStats.__dataclass_fields__):
            raise ValueError("stats must give one value per file")
        nslots = _table_slots(n)
        ring_size = ring_events(n) if ring_size is None else ring_size
        if ring_size < 1 or ring_size & (ring_size - 1):
            raise ValueError(f"the event ring needs a power of two of slots, not {ring_size}")
        hsize = ffi.sizeof("struct tiering_header")
        esize = ffi.sizeof("struct tiering_entry")
        fsize = ffi.sizeof("struct tiering_file")
        evsize = ffi.sizeof("struct tiering_event")
        entries_offset = _aligned(hsize)
        idents_offset = _aligned(entries_offset + nslots * esize)
        files_offset = _aligned(idents_offset + nslots * 4)
        filling = pending is not None and bool(np.any(pending))
        wlog_size = WRITE_LOG if filling else 0     # only a fill logs write opens
        wlog_offset = _aligned(files_offset + n * fsize)
        ring_offset = _aligned(wlog_offset + wlog_size * ffi.sizeof("struct tiering_written"))
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
        h.file_size = fsize
        h.nslots = nslots
        h.nevents = ring_size
        h.nfiles = n
        h.entries_offset = entries_offset
        h.idents_offset = idents_offset
        h.files_offset = files_offset
        h.ring_offset = ring_offset
        h.wlog_offset = wlog_offset
        h.wlog_size = wlog_size
        h.filling = int(filling)
        h.total_size = total
        h.daemon_pid = os.getpid()
        who = scanner or Credentials.current()
        h.scan_uid, h.scan_gid = who.uid, who.gid
        h.scan_groups = lib.tiering_groups_hash(ffi.new("uint32_t[]", list(who.groups) or [0]), len(who.groups))
        h.scan_caps = who.caps
        h.nroots = len(roots)
        for i, r in enumerate(roots):
            _set_prefix(h.roots[i], r.path, r.id, lib.TIERING_ROOT_HAS_DIR_LINKS if r.has_dir_links else 0)
        h.ntiers = len(tiers)
        for i, t in enumerate(tiers):
            _set_tier(h.tiers[i], t, i)
        recs = np.ndarray((n,), numpy_dtype("struct tiering_file"), buffer=mm, offset=files_offset)
        _write_records(recs, devs, inos, mtimes, links, stats, pending)
        del recs
        blob = ffi.from_buffer(rels.terminated() if isinstance(rels, FileTable) else
                               b"".join(r.encode("utf-8", "surrogateescape") + b"\0" for r in rels))
        slots = np.zeros(max(n, 1), np.uint64)
        root_arr = np.zeros(max(n, 1), np.uint32)
        root_arr[:n] = np.asarray(root_ids, np.int64)
        size_arr = np.zeros(max(n, 1), np.uint64)
        size_arr[:n] = np.asarray(sizes, np.int64)
        got = lib.tiering_index_fill(
            ffi.cast("void *", buf), blob, len(blob), ffi.from_buffer("uint32_t[]", root_arr),
            ffi.from_buffer("uint64_t[]", size_arr), n, ffi.from_buffer("uint64_t[]", slots))
        if got <= -2:
            dup = rels.rel(-2 - got) if isinstance(rels, FileTable) else rels[-2 - got]
            raise ValueError(f"duplicate catalog path: {dup!r}")
        if got < 0:
            raise RuntimeError("index table overflow (internal error)")
        h.magic = lib.TIERING_MAGIC  # last: a reader trusts nothing before it
        del h, buf
        return cls(path, mm), slots[:n].astype(np.int64)

    @classmethod
    def for_catalog(cls, path: Path, roots: Sequence[Root], tiers: Sequence[str],
                    cat: Catalog, pending: np.ndarray | None = None) -> tuple[SharedIndex, np.ndarray]:
        """The index of a catalog: every file with its identity, whether its
        path is a symlink, and its stat (answered from the index for the
        roots this job scanned itself); the pending files by name only
        (NOTE [names first])."""
        t = cat.files
        return cls.create(path, roots, tiers, t, t.root, t.size, t.mtime_ns, devs=t.dev, inos=t.ino,
                          links=t.link, stats=file_stats(cat), pending=pending)

    # -- an index written from names first (NOTE [names first]) -----------
    @property
    def filling(self) -> bool:
        return bool(self.header.filling)

    def complete(self, slots: np.ndarray, cat: Catalog, ids: np.ndarray) -> None:
        """Fills the entries of the catalog's files ids (their slots in
        slots) from the catalog's columns, each record's flags last."""
        if not len(ids):
            return
        t = cat.files
        recs = np.zeros(len(ids), numpy_dtype("struct tiering_file"))
        _write_records(recs, t.dev[ids], t.ino[ids], t.mtime_ns[ids], t.link[ids], file_stats(cat, ids))
        want = np.ascontiguousarray(slots[ids], np.uint64)
        sizes = np.ascontiguousarray(t.size[ids], np.uint64)
        lib.tiering_index_complete(self.base, ffi.from_buffer("uint64_t[]", want),
                                   ffi.cast("struct tiering_file *", ffi.from_buffer(recs)),
                                   ffi.from_buffer("uint64_t[]", sizes), len(ids))

    def filled(self, wait: float = 10.0) -> int:
        """Ends the fill: the files opened for writing during it are
        invalidated under every path (their number is returned); -1 or -2
        when that cannot be known (a writer stuck in its log entry, the log
        overflowed): the caller must then disable the index."""
        return int(lib.tiering_index_filled(self.base, int(wait * 1e9)))

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
        buf = ffi.from_buffer(mm)
        h: Any = ffi.cast("struct tiering_header *", buf)
        good = (len(mm) >= ffi.sizeof("struct tiering_header") and h.magic == lib.TIERING_MAGIC
                and h.version == lib.TIERING_VERSION and h.total_size == len(mm))
        del h, buf
        if not good:
            mm.close()
            raise ValueError(f"{path}: not a tiering index of version {lib.TIERING_VERSION}")
        return cls(path, mm)

    # -- state words ------------------------------------------------------
    def state(self, slot: int) -> int:
        return int(self.entries[slot].state)

    def state_of(self, slots: np.ndarray) -> np.ndarray:
        """The state words of slots, read now (a copy)."""
        return self._states[np.asarray(slots, np.int64)]

    def set_copy_wait(self, seconds: float, queued: float = 0.0) -> None:
        """How long an open waits for a copy in flight (NOTE [one read per
        file]), and for a queued one (NOTE [queued copies])."""
        self.header.queue_wait_ns = max(0, int(queued * 1e9))
        self.header.copy_wait_ns = max(0, int(seconds * 1e9))

    def cas_state(self, slot: int, expected: int, desired: int) -> bool:
        return bool(lib.tiering_state_cas(self.base, slot, expected, desired))

    def cas_states(self, slots: np.ndarray, expected: int, desired: int) -> np.ndarray:
        """cas_state of each slot, in one call: a bool per slot, swapped or not."""
        s = np.ascontiguousarray(slots, dtype=np.uint64)
        swapped = np.zeros(len(s), np.uint8)
        if len(s):
            lib.tiering_state_cas_many(self.base, ffi.cast("const uint64_t *", s.ctypes.data), len(s), expected,
                                       desired, ffi.cast("uint8_t *", swapped.ctypes.data))
        return swapped.view(bool)

    def entry(self, slot: int) -> Any:
        return self.entries[slot]

    def aliases(self, slot: int) -> list[int]:
        """slot and the slots of every other path of the same file (its
        ring, NOTE [alias invalidation])."""
        out = [slot]
        mask = int(self.header.nslots) - 1
        s = self._next_alias(slot) & mask
        while s != slot and len(out) <= mask:
            out.append(s)
            s = self._next_alias(s) & mask
        return out

    def _next_alias(self, slot: int) -> int:
        return int(self.files[int(self.entries[slot].file)]["next_alias"])

    def set_disabled(self, disabled: bool) -> None:
        self.header.disabled = 1 if disabled else 0

    # -- counters and ring ------------------------------------------------
    def counters(self, seen: Sequence[int] | np.ndarray | None = None) -> dict[str, Any]:
        """The job's counters.  seen: the opens counted from the events
        (`Daemon.opens_seen`: from the PFS, then per tier) when none was lost,
        instead of the sum of the entries' counters, which reads the whole
        entry table (NOTE [open counters])."""
        c = self.header.counters
        if seen is not None:
            tiers = [int(x) for x in seen[1:1 + self.header.ntiers]]
            opens = int(seen[0]) + sum(tiers)
        else:
            tiers = [int(c.opens_tier[i]) for i in range(self.header.ntiers)]
            opens = int(self.opens.sum(dtype=np.uint64))   # NOTE [open counters]
        return {
            "opens": opens,
            "opens_pfs": max(0, opens - sum(tiers)),  # read after the tiers: never behind them
            "opens_tier": tiers,
            "bytes_tier": int(c.bytes_tier),
            "fallbacks": int(c.fallbacks),
            "writes": int(c.writes),
            "events_posted": int(self.header.ring_head),
            "events_dropped": int(c.events_dropped),
            # NOTE [read counters]: by the file position at close
            "read_pfs": int(c.read_pfs),
            "read_tier": int(c.read_tier),
            "closed_at_zero": int(c.closed_at_zero),
            "closed_at_zero_bytes": int(c.closed_at_zero_bytes),
            "copy_waits": int(self.header.copy_waits),   # NOTE [one read per file]
        }

    def drain_batch(self, force: bool = False, limit: int | None = None) -> np.ndarray:
        """Events posted since the last drain (one consumer only), at most
        `limit` (the rest at the next call: a reader that posts as fast as
        they are drained does not make one batch of them all), as an
        EVENT_DTYPE array: the C helper copies complete records out of the
        ring (its seqlock check) into a buffer numpy then reads in place."""
        parts: list[np.ndarray] = []
        got, limit = 0, BATCH_EVENTS if limit is None else limit
        while got < limit:
            want = min(DRAIN, limit - got)
            n = int(lib.tiering_ring_drain(self.base, self._tail, self._out, want, 1 if force else 0,
                                           self._dropped))
            if n:
                parts.append(np.frombuffer(ffi.buffer(self._out, n * EVENT_DTYPE.itemsize), EVENT_DTYPE).copy())
                got += n
            if n < want:
                break
        self.header.counters.events_dropped = self._dropped[0]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, EVENT_DTYPE)

    def drain(self, force: bool = False) -> list[Event]:
        """drain_batch as Event objects (for tests and tools)."""
        return [Event(int(e["kind"]), int(e["entry"]), int(e["pid"]), int(e["tier"]), int(e["tag"]), int(e["bytes"]))
                for e in self.drain_batch(force)]

    def pending_events(self) -> int:
        return int(self.header.ring_head) - int(self._tail[0])

    def close(self) -> None:
        del self.entries, self.header, self.base, self._buf, self.opens, self._states, self.files
        self._mm.close()

    def unmap_in_child(self) -> None:
        """In a forked child that never touches the index again and ends
        with os._exit (the catalog cache writer, NOTE [names first]): drops
        the mapping, so that a child outliving the job does not keep the
        removed index's memory (its views are not released: the child
        never returns to them)."""
        munmap = ctypes.CDLL(None, use_errno=True).munmap
        munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        if munmap(int(ffi.cast("uintptr_t", self.base)), len(self._mm)) != 0:
            raise OSError(ctypes.get_errno(), "munmap of the index")
