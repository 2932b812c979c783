"""Scan
----
The scan never reads file contents. It lists directories and stats entries in
parallel: one task lists a directory, and the stats of a large directory are
split into batches run as separate tasks, so a PFS answers many metadata
requests at once instead of one after another (a flat directory of a million
files is not a million serial stats either).

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

import logging
import os
import queue
import stat
import time
from array import array
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .cache import CacheRefused, cache_dir_problem, load_cache, save_cache
from .model import FILE_COLUMNS, Catalog, CatalogDir, DirAlias, FileTable, RootScan, ScanError, decode_rel, encode_rel
from .roots import join

log = logging.getLogger("tiering")

STAT_BATCH = 64           # entries stat'ed by one task


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


_Stat = tuple[str, "os.stat_result | None", bool]     # rel, stat (None: cannot), is a symlink


def _stat_entries(rel: str, entries: list[Any]) -> list[_Stat]:
    out: list[_Stat] = []
    for e in entries:
        try:
            link = e.is_symlink()
            s = e.stat(follow_symlinks=True)
        except OSError:
            out.append((join(rel, e.name), None, False))  # dangling link or vanished file
            continue
        out.append((join(rel, e.name), s, link))
    return out


def _list_dir(path: str, rel: str) -> tuple[list[_Stat], str, list[Any]]:
    """Lists a directory and stats its entries, or, in a large directory,
    returns them for the caller to stat in parallel batches."""
    with os.scandir(path) as it:
        entries = list(it)
    if len(entries) <= STAT_BATCH:
        return _stat_entries(rel, entries), rel, []
    return [], rel, entries


class _Tasks:
    """Runs functions on the pool and hands back their results in completion
    order (a queue: no per-completion cost in the number of tasks pending)."""

    def __init__(self, pool: ThreadPoolExecutor):
        self.pool = pool
        self.done: queue.SimpleQueue[tuple[Any, Any, BaseException | None]] = queue.SimpleQueue()
        self.pending = 0

    def submit(self, tag: Any, fn: Callable[..., Any], *args: Any) -> None:
        def run() -> None:
            try:
                self.done.put((tag, fn(*args), None))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                self.done.put((tag, None, e))
        self.pending += 1
        self.pool.submit(run)

    def results(self) -> Iterator[tuple[Any, Any, BaseException | None]]:
        while self.pending:
            item = self.done.get()
            self.pending -= 1
            yield item


def _walk_root(root: str, pool: ThreadPoolExecutor, progress: ScanProgress | None = None,
               report: ScanCallback = _no_progress) -> RootScan:
    res = RootScan(scanned_ns=time.time_ns())
    rows = _Columns()
    prog = progress if progress is not None else ScanProgress()
    st = os.stat(root)
    seen: dict[tuple[int, int], str] = {}
    tasks = _Tasks(pool)
    later: list[tuple[str, os.stat_result]] = []   # symlinked directories, for the next round

    def add_dir(rel: str, s: os.stat_result) -> None:
        key = (s.st_dev, s.st_ino)
        if key in seen:
            res.aliases.append((rel, seen[key]))
            return
        seen[key] = rel
        res.dirs.append((rel, s.st_ino, s.st_dev, s.st_mtime_ns))
        prog.dirs += 1
        tasks.submit("list", _list_dir, os.path.join(root, rel), rel)

    def take(stats: list[_Stat]) -> None:
        for rel, s, is_link in stats:
            if s is None:
                res.skipped.append(rel)
            elif stat.S_ISDIR(s.st_mode):
                if is_link:
                    res.links = True
                    later.append((rel, s))
                else:
                    add_dir(rel, s)
            elif stat.S_ISREG(s.st_mode):
                rows.add(rel, s, is_link)
                prog.files += 1
                prog.bytes += s.st_size
            else:
                res.skipped.append(rel)

    add_dir("", st)
    while True:
        for kind, out, err in tasks.results():
            if err is not None:
                if not isinstance(err, OSError):
                    raise err
                res.errors.append(str(err))
                continue
            if kind == "list":
                stats, rel, rest = out
                for k in range(0, len(rest), STAT_BATCH):
                    tasks.submit("stat", _stat_entries, rel, rest[k:k + STAT_BATCH])
                take(stats)
            else:
                take(out)
            report(prog)
        if not later:
            break
        round_, later = sorted(later, key=lambda x: x[0]), []
        for rel, s in round_:
            add_dir(rel, s)
    if res.errors and not rows.rels:
        raise ScanError(f"cannot scan {root}: {res.errors[0]}")
    res.dirs.sort()
    res.files = rows.table(res.dirs)
    res.aliases.sort()
    res.skipped.sort()
    return res


class _Columns:
    """The files a scan finds, kept as it goes in C arrays, one per column
    (the path as UTF-8 bytes is the one object per file), then sorted by path
    into a FileTable (NOTE [catalog arrays] in docs/design.md)."""

    _CODES = {"<i8": "q", "<u8": "Q", "<u4": "I", "?": "b"}

    def __init__(self) -> None:
        self.rels: list[bytes] = []
        self.cols = {k: array(self._CODES[dt]) for k, dt in FILE_COLUMNS.items()}
        self.escaped = False      # a name that is not UTF-8: sort by the decoded str

    def add(self, rel: str, s: os.stat_result, link: bool) -> None:
        try:
            data = rel.encode("utf-8")
        except UnicodeEncodeError:
            data = rel.encode("utf-8", "surrogateescape")
            self.escaped = True
        self.rels.append(data)
        c = self.cols
        c["size"].append(s.st_size)
        c["mtime_ns"].append(s.st_mtime_ns)
        c["dev"].append(s.st_dev)
        c["ino"].append(s.st_ino)
        c["link"].append(link)
        c["mode"].append(s.st_mode)
        c["uid"].append(s.st_uid)
        c["gid"].append(s.st_gid)
        c["nlink"].append(s.st_nlink)
        c["atime_ns"].append(s.st_atime_ns)
        c["ctime_ns"].append(s.st_ctime_ns)
        c["blocks"].append(s.st_blocks)
        c["blksize"].append(s.st_blksize)

    def table(self, dirs: list[tuple[str, int, int, int]]) -> FileTable:
        """Sorted by path as str (code points: UTF-8's byte order, unless a
        name is not UTF-8), each file with the id of its directory in dirs."""
        rels = self.rels
        key = (lambda k: decode_rel(rels[k])) if self.escaped else rels.__getitem__
        order = np.fromiter(sorted(range(len(rels)), key=key), np.int64, len(rels))
        dir_id = {encode_rel(d[0]): k for k, d in enumerate(dirs)}
        ordered = [rels[k] for k in order.tolist()]
        self.rels = []
        offsets = np.zeros(len(ordered) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, ordered), np.int64, len(ordered)), out=offsets[1:])
        parents = np.fromiter((dir_id.get(r.rpartition(b"/")[0], -1) for r in ordered), np.int32, len(ordered))
        paths = np.frombuffer(b"".join(ordered), np.uint8)
        del ordered
        cols = {k: np.frombuffer(a, FILE_COLUMNS[k])[order] if len(a) else np.zeros(0, FILE_COLUMNS[k])
                for k, a in self.cols.items()}
        return FileTable(paths, offsets, np.zeros(len(order), np.int32), parents, cols)


def _cached(cache_dir: Path, root: str, pool: ThreadPoolExecutor) -> tuple[RootScan | None, bool]:
    """The root's valid cached catalog or None, and whether a fresh one may be written there."""
    try:
        return load_cache(cache_dir, root, pool), True
    except CacheRefused as e:
        log.warning("not using the catalog cache: %s; scanning without it", e)
        return None, False


def scan(dirs: list[str], threads: int = 16, cache_dir: Path | None = None,
         progress: ScanCallback | None = None) -> Catalog:
    """The catalog of the data roots `dirs`; with cache_dir, each root's
    catalog is reused from there when the root has not changed (module doc);
    progress is called as the scan goes (module doc)."""
    roots = normalise_roots(dirs)
    report = progress or _no_progress
    prog = ScanProgress(roots=len(roots))
    cache = Path(cache_dir) if cache_dir is not None else None
    if cache is not None and (problem := cache_dir_problem(cache)) is not None:
        log.warning("not using the catalog cache: %s; scanning without it", problem)
        cache = None
    parts: list[RootScan] = []
    from_cache: list[bool] = []
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
                part = _walk_root(r, pool, prog, report)
                if cache is not None and writable:
                    save_cache(cache, r, part)
            prog.roots_done += 1
            report(prog)
            parts.append(part)
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
    return cat
