"""Scan
----
The scan never reads file contents. It lists directories and stats entries in
parallel: one task lists a directory, and the stats of a large directory are
split into batches run as separate tasks, so a PFS answers many metadata
requests at once instead of one after another (a flat directory of a million
files is not a million serial stats either).

Listing and stat'ing are done in C (NOTE [scan in C] in docs/design.md):
the results are numpy records, not an object per entry.

Symlinked directories are followed, and every directory (by device and inode)
is catalogued once. Which path is kept is deterministic: first everything
reachable without a symlinked directory, then the symlinked directories in
rounds, sorted by path within a round. Every other place where a catalogued
directory appears again (a second link to it, a link to an ancestor) is kept as
a `DirAlias`: `dataset_order` walks an alias the way ``os.walk(followlinks=True)``
does (at every place it appears) and maps each path through it to the one
catalog file. A root that contains a symlinked directory is flagged
(`Catalog.dir_links`): the shim then does not resolve ".." by text.

Entries that are neither regular files nor directories (dangling symlinks,
fifos, sockets, devices, entries that cannot be stat'ed) are not catalogued;
their paths are kept in `Catalog.skipped`, since ImageFolder would list them as
samples when their names match.

Progress: `scan(..., progress=f)` calls f with a `ScanProgress` (files and
directories found so far, over all roots, and whether the catalog came from the
cache) after every batch of results, on the calling thread; f decides what to
show and how often.  The scan itself never prints.
"""
from __future__ import annotations

import functools
import logging
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..shimlib import ffi, lib, numpy_dtype
from ..units import some_of
from .cache import CacheRefused, PendingSave, SaveFn, cache_dir_problem, load_cache, save_now
from .model import (
    FILE_COLUMNS,
    Catalog,
    CatalogDir,
    DeferredStats,
    DirAlias,
    FileTable,
    RootScan,
    ScanError,
    decode_rel,
    encode_rel,
    spans,
)
from .roots import join

log = logging.getLogger("tiering")

STAT_BATCH = 64           # entries stat'ed by one task through os.scandir
C_STAT_BATCH = 2048       # ... and in C (a task costs more than an entry there)
STAT_AT_ONCE = 64         # a names-first listing of at most this many files is stat'ed at once
FORMAT_BITS = 0o170000    # of st_mode: the file type (stat.S_IFMT's mask)
DT_REG = 8                # d_type of a regular file (dirent.h)
DT_UNKNOWN = 0            # ... of an entry of unknown type: lstat'ed, followed only when a symlink


@dataclass
class ScanProgress:
    """What the scan has found so far, over every root."""

    files: int = 0
    dirs: int = 0
    bytes: int = 0
    phase: str = "scanning"      # "checking the cache" | "scanning" | "done"
    roots_from_cache: int = 0
    roots_done: int = 0
    roots: int = 0


ScanCallback = Callable[[ScanProgress], None]


def _no_progress(_p: ScanProgress) -> None:
    pass


def normalise_roots(dirs: list[str]) -> list[str]:
    """Absolute, normalised, without duplicates or roots nested in another."""
    out: list[str] = []
    for d in sorted({os.path.abspath(d) for d in dirs}, key=len):
        if not os.path.isdir(d):
            raise ScanError(f"--data {d}: not a directory; pass the folder that holds the data set")
        real = os.path.realpath(d)
        if any(real == os.path.realpath(o) or real.startswith(os.path.realpath(o).rstrip("/") + "/")
               for o in out):
            continue  # inside a root we already have
        out.append(d)
    return sorted(out)


def _listing(path: str) -> _Listing:
    """The entries of a directory (names and d_type), sorted by name bytes,
    through the C scanner (NOTE [scan in C]) or os.scandir (_c_scanner)."""
    c = _c_scanner()
    if c is None:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: os.fsencode(e.name))   # as the C scanner's qsort
        return _Listing(b"".join(os.fsencode(e.name) + b"\0" for e in entries), np.zeros(len(entries), np.uint8),
                        entries)
    ffi, lib = c
    out = ffi.new("struct tiering_scan_list *")
    err = lib.tiering_scan_list(os.fsencode(path), out)
    if err:
        raise OSError(err, os.strerror(err), path)
    try:
        return _Listing(bytes(ffi.buffer(out.names, out.bytes)),
                        np.frombuffer(ffi.buffer(out.types, out.count), np.uint8).copy())
    finally:
        lib.tiering_scan_list_free(out)


def _stat_names(path: str, listing: _Listing) -> np.ndarray:
    """The stat (symlinks followed) of each entry of a listing, and whether
    the entry itself is a symlink, as STAT_DTYPE records; ok = 0 for an entry
    that cannot be stat'ed (a dangling link, a file gone since the listing)."""
    if listing.entries is not None:
        return _stat_entries(listing.entries)
    return _c_stat(path, listing.names, listing.types)


def _stat_others(path: str, listing: _Listing) -> tuple[np.ndarray, np.ndarray]:
    """Names first (NOTE [names first]): the records of a listing of the C
    scanner where each regular file by d_type is taken as one, unstat'ed (a
    record with ok and S_IFREG only), and the other entries (directories,
    symlinks, entries of unknown type) are stat'ed now; and which entries
    are deferred so."""
    deferred = listing.types == DT_REG
    if deferred.all():      # one record seen through a zero stride: no memory per file
        return np.broadcast_to(_deferred_record(), len(deferred)), deferred
    others = ~deferred
    out = np.zeros(len(deferred), _stat_dtype())
    out[others] = _c_stat(path, _file_names(listing.names, others), np.ascontiguousarray(listing.types[others]))
    out[deferred] = _deferred_record()
    return out, deferred


@functools.cache
def _deferred_record() -> np.ndarray:
    """The record (one, read-only) of a file not stat'ed yet (names first): ok, S_IFREG, zeros."""
    rec = np.zeros(1, _stat_dtype())
    rec["ok"], rec["mode"] = 1, stat.S_IFREG
    rec.flags.writeable = False
    return rec


def _c_stat(path: str, names: bytes, types: np.ndarray) -> np.ndarray:
    """tiering_scan_stat of the NUL-terminated names of directory path."""
    n = len(types)
    c = _c_scanner()
    assert c is not None, "a listing without entries comes from the C scanner"
    ffi, lib = c
    out = np.zeros(n, _stat_dtype())
    if n:
        lib.tiering_scan_stat(os.fsencode(path), names, ffi.from_buffer("uint8_t[]", types), n,
                              ffi.cast("struct tiering_scan_stat *", ffi.from_buffer(out)))
    return out


def _stat_entries(entries: list[Any]) -> np.ndarray:
    """_stat_names through os.scandir's entries."""
    out = np.zeros(len(entries), _stat_dtype())
    for k, e in enumerate(entries):
        try:
            link = e.is_symlink()
            s = e.stat(follow_symlinks=True)
        except OSError:
            continue                    # dangling link or vanished file
        for name in _PY_STAT:
            out[name][k] = getattr(s, "st_" + name)
        out["ok"][k], out["link"][k] = 1, link
    return out


_PY_STAT = ("size", "mtime_ns", "atime_ns", "ctime_ns", "blocks", "blksize", "dev", "ino", "nlink", "mode", "uid",
            "gid")
_C_SCANNER: list[Any] = []
_SCANDIR = os.scandir


def _c_scanner() -> tuple[Any, Any] | None:
    """cffi's ffi and libtiershim.so when the library is built and os.scandir
    is the standard one, else None: the scan then goes through os.scandir
    (a replaced os.scandir, such as an emulated PFS, is used as given)."""
    if os.scandir is not _SCANDIR:
        return None
    if not _C_SCANNER:
        try:
            _C_SCANNER.append((ffi, lib) if lib.tiering_scan_list else None)   # opens the library
        except (OSError, AttributeError):   # not built: os.scandir and os.stat
            _C_SCANNER.append(None)
    return _C_SCANNER[0]


def _stat_dtype() -> np.dtype:
    return numpy_dtype("struct tiering_scan_stat")


@dataclass
class _Listing:
    names: bytes            # NUL-terminated, one after another
    types: np.ndarray       # d_type per entry (0: unknown)
    entries: list[Any] | None = None    # os.scandir's entries (no C scanner)
    first: int = 0          # index in the directory's listing of the first entry (a part of a listing)

    def bounds(self) -> np.ndarray:
        """Where each name ends (its NUL), so name k is names[ends[k-1]+1:ends[k]]."""
        return np.flatnonzero(np.frombuffer(self.names, np.uint8) == 0)

    def part(self, a: int, b: int, ends: np.ndarray) -> _Listing:
        start = int(ends[a - 1]) + 1 if a else 0
        return _Listing(self.names[start:int(ends[b - 1]) + 1], self.types[a:b],
                        self.entries[a:b] if self.entries is not None else None, self.first + a)


@dataclass
class _Batch:
    """Entries of one directory, stat'ed (but the deferred ones)."""
    rel: str
    listing: _Listing
    recs: np.ndarray
    deferred: np.ndarray | None = None    # per entry: a regular file by d_type, not stat'ed (names first)


def _stat_batch(path: str, rel: str, listing: _Listing, defer: bool = False) -> _Batch:
    if defer and listing.entries is None:
        return _Batch(rel, listing, *_stat_others(path, listing))
    return _Batch(rel, listing, _stat_names(path, listing))


def _list_dir(path: str, rel: str, defer: bool = False) -> tuple[_Batch | None, str, list[_Listing]]:
    """Lists a directory and stats its entries, or, in a large directory,
    returns them in parts for the caller to stat in parallel batches; with
    defer, regular files by d_type are only listed (NOTE [names first])."""
    listing = _listing(path)
    n = len(listing.types)
    batch = STAT_BATCH if listing.entries is not None else C_STAT_BATCH
    if defer and listing.entries is None:
        return _stat_batch(path, rel, listing, True), rel, []   # stats of few entries: no parts
    if n <= batch:
        return _stat_batch(path, rel, listing), rel, []
    ends = listing.bounds()
    return None, rel, [listing.part(a, min(n, a + batch), ends) for a in range(0, n, batch)]


class _Tasks:
    """Runs functions on threads of its own (started as tasks come, at most
    `threads`) and hands back their results in completion order.  Two
    queues and nothing else: a ThreadPoolExecutor's submit takes a lock its
    workers take at the end of every task, and the thread that submits the
    1,000 listings of a scan waited on it (0.3 s of a 1 s scan at 1.28 M
    files; NOTE [scan in C])."""

    def __init__(self, threads: int, name: str):
        self.limit = max(1, threads)
        self.name = name
        self.todo: queue.SimpleQueue[tuple[Any, Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[tuple[Any, Any, BaseException | None]] = queue.SimpleQueue()
        self.pending = 0
        self.threads: list[threading.Thread] = []

    def __enter__(self) -> _Tasks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, tag: Any, fn: Callable[..., Any], *args: Any) -> None:
        self.pending += 1
        self.todo.put((tag, fn, args))
        if len(self.threads) < min(self.limit, self.pending):
            t = threading.Thread(target=self._work, name=f"{self.name}_{len(self.threads)}", daemon=True)
            t.start()
            self.threads.append(t)

    def _work(self) -> None:
        while (item := self.todo.get()) is not None:
            tag, fn, args = item
            try:
                self.done.put((tag, fn(*args), None))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                self.done.put((tag, None, e))

    def results(self) -> Iterator[tuple[Any, Any, BaseException | None]]:
        while self.pending:
            item = self.done.get()
            self.pending -= 1
            yield item

    def close(self) -> None:
        """Drops the tasks not started, waits for the running ones; the
        threads end."""
        while True:
            try:
                if self.todo.get_nowait() is not None:
                    self.pending -= 1
            except queue.Empty:
                break
        for _ in self.threads:
            self.todo.put(None)
        for t in self.threads:
            t.join()
        self.threads = []


def _walk_root(root: str, threads: int, progress: ScanProgress | None = None,
               report: ScanCallback = _no_progress, defer: bool = False) -> RootScan:
    res = RootScan(scanned_ns=time.time_ns())
    rows = _Columns()
    prog = progress if progress is not None else ScanProgress()
    st = os.stat(root)
    seen: dict[tuple[int, int], str] = {}
    tasks = _Tasks(threads, "tiering-scan")
    later: list[tuple[str, int, int, int]] = []   # symlinked directories (rel, dev, ino, mtime), for the next round

    def add_dir(rel: str, dev: int, ino: int, mtime_ns: int) -> None:
        key = (dev, ino)
        if key in seen:
            res.aliases.append((rel, seen[key]))
            return
        seen[key] = rel
        res.dirs.append((rel, ino, dev, mtime_ns))
        prog.dirs += 1
        tasks.submit("list", _list_dir, os.path.join(root, rel), rel, defer)

    def take(batch: _Batch) -> None:
        recs = batch.recs
        fmt = recs["mode"] & FORMAT_BITS
        ok = recs["ok"] != 0
        reg = ok & (fmt == stat.S_IFREG)
        if not reg.all():
            names = batch.listing.names.split(b"\0")
            for k in np.flatnonzero(~reg).tolist():
                rel = join(batch.rel, decode_rel(names[k]))
                r = recs[k]
                if ok[k] and fmt[k] == stat.S_IFDIR:
                    d = (rel, int(r["dev"]), int(r["ino"]), int(r["mtime_ns"]))
                    if r["link"]:
                        res.links = True
                        later.append(d)
                    else:
                        add_dir(*d)
                else:
                    res.skipped.append(rel)
        n = rows.add(batch, reg)
        prog.files += n
        prog.bytes += int(recs["size"][reg].sum()) if n else 0

    try:
        add_dir("", st.st_dev, st.st_ino, st.st_mtime_ns)
        while True:
            for kind, out, err in tasks.results():
                if err is not None:
                    if not isinstance(err, OSError):
                        raise err
                    res.errors.append(str(err))
                    res.unreadable.append((os.path.normpath(str(err.filename or root)), err.strerror or str(err)))
                    continue
                if kind == "list":
                    batch, rel, rest = out
                    for part in rest:
                        tasks.submit("stat", _stat_batch, os.path.join(root, rel), rel, part)
                    if batch is not None:
                        take(batch)
                else:
                    take(out)
                report(prog)
            if not later:
                break
            round_, later = sorted(later, key=lambda x: x[0]), []
            for d in round_:
                add_dir(*d)
    finally:
        tasks.close()
    if res.errors and not rows.count and any(path == os.path.normpath(root) for path, _ in res.unreadable):
        raise ScanError(f"cannot scan {root}: {res.errors[0]}")
    res.dirs.sort()
    res.files, deferred = rows.table(res.dirs)
    res.deferred = [(os.path.join(root, rel), names, ids) for rel, names, ids in deferred]
    res.aliases.sort()
    res.skipped.sort()
    return res


class _Columns:
    """The files a scan finds, kept as they come: per batch the listing's
    names, which of them are files, and their stat records (no object per
    file); then sorted by path into a FileTable (NOTE [catalog arrays] in
    docs/design.md)."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, bytes, np.ndarray, np.ndarray]] = []   # rel, names, files, their records
        self.firsts: list[int] = []       # per batch: where in its directory's listing it begins
        self.deferred: list[np.ndarray | None] = []   # per batch: which of its files are not stat'ed yet
        self.count = 0

    def add(self, batch: _Batch, files: np.ndarray) -> int:
        n = int(files.sum())
        if n:
            recs = batch.recs if n == len(files) else batch.recs[files]
            self.batches.append((batch.rel, batch.listing.names, files, recs))
            self.firsts.append(batch.listing.first)
            self.deferred.append(batch.deferred[files] if batch.deferred is not None else None)
            self.count += n
        return n

    def table(self, dirs: list[tuple[str, int, int, int]]) -> tuple[FileTable, list[tuple[str, bytes, np.ndarray]]]:
        """Sorted by path as str (code points: UTF-8's byte order, unless a
        name is not UTF-8), each file with the id of its directory in dirs;
        and the deferred files (names first) per batch: directory, names
        and their ids in the table."""
        batches, self.batches = self.batches, []
        firsts, self.firsts = self.firsts, []
        deferred, self.deferred = self.deferred, []
        if not batches:
            return FileTable.empty(), []
        placed = _batch_order([b[0] for b in batches], firsts, dirs, batches)
        if placed is not None:        # the files in path order already, batch after batch
            batches = [batches[k] for k in placed]
            deferred = [deferred[k] for k in placed]
        dir_id = {rel: k for k, (rel, *_) in enumerate(dirs)}
        parent = np.repeat(np.array([dir_id.get(b[0], -1) for b in batches], np.int32), [len(b[3]) for b in batches])
        paths, offsets = _joined_paths(batches)
        order = None if placed is not None else _path_order(paths, offsets)   # else the general sort
        if order is not None:
            paths, offsets = _gather(paths, offsets, order)
            parent = parent[order]
        later = _deferred_ids(batches, deferred, order)
        cols = _stat_columns([b[3] for b in batches], deferred, order)
        del batches
        return FileTable(paths, offsets, np.zeros(len(offsets) - 1, np.int32), parent, cols), later


def _stat_columns(recs: list[np.ndarray], deferred: list[np.ndarray | None],
                  order: np.ndarray | None) -> dict[str, np.ndarray]:
    """The FILE_COLUMNS of the batches' records, batch after batch (then
    permuted by order).  A batch whose every file is deferred (names first)
    holds zeros but for its mode (a regular file): its rows are left as the
    zeroed columns have them, not copied, which is most of a names-first
    scan's table (NOTE [names first])."""
    n = sum(len(r) for r in recs)
    blank = [d is not None and len(d) == len(r) and bool(d.all()) for r, d in zip(recs, deferred)]
    if not any(blank):
        cols = {k: np.concatenate([r[k] for r in recs]).astype(dt, copy=False) for k, dt in FILE_COLUMNS.items()}
    else:
        cols = {k: np.zeros(n, dt) for k, dt in FILE_COLUMNS.items()}
        first = 0
        for r, skip in zip(recs, blank):
            if skip:
                cols["mode"][first:first + len(r)] = stat.S_IFREG
            else:
                for k in FILE_COLUMNS:
                    cols[k][first:first + len(r)] = r[k]
            first += len(r)
    return {k: c[order] for k, c in cols.items()} if order is not None else cols


def _deferred_ids(batches: list[tuple[str, bytes, np.ndarray, np.ndarray]], deferred: list[np.ndarray | None],
                  order: np.ndarray | None) -> list[tuple[str, bytes, np.ndarray]]:
    """Per batch with deferred files: its directory, their names and their
    ids in the table (order: the table's permutation of the batches' files)."""
    if not any(d is not None and d.any() for d in deferred):
        return []
    where = np.arange(sum(len(b[3]) for b in batches), dtype=np.int64)
    if order is not None:
        where[order] = np.arange(len(order), dtype=np.int64)
    out = []
    first = 0
    for (rel, names, files, recs), d in zip(batches, deferred):
        n = len(recs)
        if d is not None and d.any():
            out.append((rel, _file_names(_file_names(names, files), d), where[first:first + n][d]))
        first += n
    return out


def _file_names(names: bytes, files: np.ndarray) -> bytes:
    """The names (NUL-terminated) of a listing's entries marked in files."""
    if files.all():
        return names
    return b"".join(n + b"\0" for n, f in zip(names.split(b"\0"), files.tolist()) if f)


def _joined_paths(batches: list[tuple[str, bytes, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The files' paths, each its directory's prefix then its name, batch
    after batch, in one blob cut by offsets: a few bytes operations per
    batch, no index array per byte."""
    segs = []
    for rel, names, files, _ in batches:
        prefix = encode_rel(rel) + b"/" if rel else b""
        names = _file_names(names, files)   # a listing with entries other than files: few
        segs.append(prefix + names[:-1].replace(b"\0", b"\0" + prefix) + b"\0")
    blob = b"".join(segs)
    del segs
    ends = np.flatnonzero(np.frombuffer(blob, np.uint8) == 0)
    offsets = np.zeros(len(ends) + 1, np.int64)
    offsets[1:] = ends - np.arange(len(ends))     # without the NULs before it
    return np.frombuffer(blob.replace(b"\0", b""), np.uint8), offsets


def _batch_order(rels: list[str], firsts: list[int], dirs: list[tuple[str, int, int, int]],
                 batches: list[tuple[str, bytes, np.ndarray, np.ndarray]]) -> list[int] | None:
    """The order of the batches that puts their files in path order, when
    each listing is in name order (as _listing gives them) and no directory that
    holds files holds a directory too (ImageNet's classes): then path order
    is the order of the directories (each as "rel/"), and within one, of its
    batches (parts of one sorted listing) (NOTE [scan in C]).  None when that
    does not hold or a name is not UTF-8 (str order is then not byte order)."""
    if not _leaf_dirs(rels, dirs) or not all(_utf8(b[1]) for b in batches):
        return None
    place = {rel: k for k, rel in enumerate(sorted(set(rels), key=lambda r: encode_rel(r) + b"/"))}
    return sorted(range(len(rels)), key=lambda k: (place[rels[k]], firsts[k]))


def _leaf_dirs(rels: list[str], dirs: list[tuple[str, int, int, int]]) -> bool:
    """No directory that holds files (rels) holds a directory too."""
    holding = set(rels)
    return not any(rel.rpartition("/")[0] in holding for rel, *_ in dirs if rel)


def _utf8(blob: bytes) -> bool:
    try:
        blob.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _fixed_width(blob: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Byte strings blob[starts[k]:starts[k] + lengths[k]] as one numpy "S"
    array (padded with NULs, which no path holds: a shorter string sorts
    first, as in str order); in blocks of strings."""
    n = len(starts)
    width = max(1, int(lengths.max()) if n else 1)
    fixed = np.zeros((n, width), np.uint8)
    flat = fixed.reshape(-1)
    for a in range(0, n, JOIN_BLOCK):
        b = min(n, a + JOIN_BLOCK)
        ln = lengths[a:b]
        flat[spans(np.arange(a, b, dtype=np.int64) * width, ln)] = blob[spans(starts[a:b], ln)]
    return fixed.view(f"S{width}").reshape(n)


def _gather(paths: np.ndarray, offsets: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The paths in another order (in blocks of files: the index arrays stay small)."""
    lengths = np.diff(offsets)[order]
    out_offsets = np.zeros(len(order) + 1, np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    out = np.empty(len(paths), np.uint8)
    for a in range(0, len(order), JOIN_BLOCK):
        b = min(len(order), a + JOIN_BLOCK)
        out[out_offsets[a]:out_offsets[b]] = paths[spans(offsets[order[a:b]], lengths[a:b])]
    return out, out_offsets


JOIN_BLOCK = 1 << 16      # files per block of _fixed_width and _gather


def _path_order(paths: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
    """The permutation that sorts the paths as str (None: already sorted).
    UTF-8 sorts as code points byte by byte: one argsort of fixed-width
    byte strings; a name that is not UTF-8 (surrogate escapes) sorts by the
    decoded str, as before the scan kept arrays."""
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    width = int(lengths.max())
    blob = paths.tobytes()
    escaped = not _utf8(blob)
    if escaped or width * n > 8 * len(paths) + (64 << 20):
        o = offsets.tolist()
        key = (lambda k: decode_rel(blob[o[k]:o[k + 1]])) if escaped else (lambda k: blob[o[k]:o[k + 1]])
        order = np.fromiter(sorted(range(n), key=key), np.int64, n)
    else:
        order = np.argsort(_fixed_width(paths, offsets[:-1], lengths), kind="stable")
    if np.all(order[1:] > order[:-1]):
        return None
    return order


def _cached(cache_dir: Path, root: str, pool: ThreadPoolExecutor) -> tuple[RootScan | None, bool]:
    """The root's valid cached catalog or None, and whether a fresh one may be written there."""
    try:
        return load_cache(cache_dir, root, pool), True
    except CacheRefused as e:
        log.warning("not using the catalog cache: %s; scanning without it", e)
        return None, False


def unreadable_text(root: str, unreadable: list[tuple[str, str]]) -> str:
    """The warning for the directories of a data root that could not be
    listed (a mode that shuts this user out, a directory gone meanwhile):
    how many, why and which."""
    paths = sorted({path for path, _ in unreadable})
    why = ", ".join(sorted({reason for _, reason in unreadable}))
    n = len(paths)
    return (f"{n:,} director{'y' if n == 1 else 'ies'} under {root} cannot be read ({why}): {some_of(paths)}; "
            f"the files in {'it' if n == 1 else 'them'} are not catalogued (COMMAND reads them from the PFS, "
            "if it can, never from the tiers)")


def scan(dirs: list[str], threads: int = 16, cache_dir: Path | None = None,
         progress: ScanCallback | None = None, save: SaveFn = save_now, names_first: bool = False) -> Catalog:
    """The catalog of the data roots `dirs`; with cache_dir, each root's
    catalog is reused from there when the root has not changed (module doc);
    progress is called as the scan goes (module doc).  The catalogs of the
    roots scanned are handed to save once the scan is done (default: written
    to the cache before scan returns).  names_first: a single root scanned
    through the C scanner lists its regular files by name only, their stats
    left to `stat_deferred` (Catalog.deferred; the cache write waits in it):
    NOTE [names first] in docs/design.md."""
    roots = normalise_roots(dirs)
    report = progress or _no_progress
    prog = ScanProgress(roots=len(roots))
    cache = Path(cache_dir) if cache_dir is not None else None
    if cache is not None and (problem := cache_dir_problem(cache)) is not None:
        log.warning("not using the catalog cache: %s; scanning without it", problem)
        cache = None
    parts: list[RootScan] = []
    from_cache: list[bool] = []
    saves: list[PendingSave] = []
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="tiering-scan") as pool:
        for r in roots:
            if cache is not None:
                prog.phase = "checking the cache"
                report(prog)
            part, writable = _cached(cache, r, pool) if cache is not None else (None, False)
            from_cache.append(part is not None)
            if part is not None:
                prog.roots_from_cache += 1
                prog.files += len(part.files)
                prog.dirs += len(part.dirs)
                prog.bytes += int(part.files.size.sum())
            else:
                prog.phase = "scanning"
                report(prog)
                defer = names_first and len(roots) == 1 and _c_scanner() is not None
                before = (prog.files, prog.dirs, prog.bytes)
                part = _walk_root(r, threads, prog, report, defer)
                if part.deferred and len(part.files) <= STAT_AT_ONCE:
                    # a small data set is stat'ed before COMMAND (listed again: less than a fill
                    # after COMMAND starts; a few large files are warmed before COMMAND opens
                    # them, NOTE [few large files])
                    prog.files, prog.dirs, prog.bytes = before
                    part = _walk_root(r, threads, prog, report, False)
                if part.unreadable:
                    log.warning(unreadable_text(r, part.unreadable))
                if cache is not None and writable:
                    saves.append(PendingSave(cache, r, part))
            prog.roots_done += 1
            report(prog)
            parts.append(part)
    deferred = parts[0].deferred if len(parts) == 1 else []
    if not deferred:
        save(saves)
    prog.phase = "done"
    report(prog)
    bases = [0]
    for p in parts[:-1]:
        bases.append(bases[-1] + len(p.dirs))
    cat = Catalog(list(roots), FileTable.concat([p.files for p in parts], range(len(parts)), bases), [],
                  from_cache=cache is not None and all(from_cache), cached=from_cache)
    for i, p in enumerate(parts):
        cat.dirs.extend(CatalogDir(i, rel, ino, dev, mt) for rel, ino, dev, mt in p.dirs)
        cat.aliases.extend(DirAlias(i, rel, target) for rel, target in p.aliases)
        cat.skipped.extend((i, rel) for rel in p.skipped)
        cat.dir_links.append(p.links)
    if deferred:    # one root: its table is the catalog's (FileTable.concat)
        pending = np.zeros(len(cat.files), bool)
        for _, _, ids in deferred:
            pending[ids] = True
        cat.deferred = DeferredStats(deferred, pending, saves)
        parts[0].deferred = []
    return cat


def stat_deferred(cat: Catalog, threads: int, done: Callable[[np.ndarray, np.ndarray], None],
                  stopped: Callable[[], bool] = lambda: False) -> bool:
    """Takes the stats a names-first scan left (NOTE [names first]) in
    parallel batches, writes them into the catalog's columns and calls
    done(ids, gone) after each batch (on the calling thread): the files
    filled, and those gone or no longer regular files since the listing
    (they stay as listed, size 0).  Returns False when stopped() said stop
    before the last batch (the catalog then stays deferred)."""
    d = cat.deferred
    if d is None:
        return True
    cols = cat.files.columns

    def work() -> Iterator[tuple[str, _Listing, np.ndarray]]:
        for path, names, ids in d.parts:
            # a regular file when listed, but maybe a symlink by now: lstat'ed
            # first (as cheap as the stat), so a link is never recorded as none
            listing = _Listing(names, np.full(len(ids), DT_UNKNOWN, np.uint8))
            ends = listing.bounds()
            for a in range(0, len(ids), C_STAT_BATCH):
                yield path, listing.part(a, min(len(ids), a + C_STAT_BATCH), ends), ids[a:a + C_STAT_BATCH]
    todo = work()
    with _Tasks(threads, "tiering-stat") as tasks:

        def more() -> None:
            """Tasks out at most a few per thread: their names and records
            are not all held at once (a tenth of the catalog's size at 1.28 M
            files)."""
            while tasks.pending < 4 * max(1, threads):
                item = next(todo, None)
                if item is None:
                    return
                path, part, ids = item
                tasks.submit(ids, _c_stat, path, part.names, part.types)
        more()
        for ids, recs, err in tasks.results():
            if stopped():
                return False     # the tasks not started are dropped, the running ones waited for
            if err is not None:
                raise err
            more()
            ok = (recs["ok"] != 0) & ((recs["mode"] & FORMAT_BITS) == stat.S_IFREG)
            filled = ids[ok]
            for k in FILE_COLUMNS:
                cols[k][filled] = recs[k][ok]
            d.pending[ids] = False
            done(filled, ids[~ok])
    cat.deferred = None
    return True
