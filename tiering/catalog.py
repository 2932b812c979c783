"""The catalog: every regular file under the data roots, with size and mtime,
and the data-set order (which file sample i of the training data set reads).

Scan
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

Scan cache
----------
``scan(dirs, threads, cache_dir)`` keeps one gzip'ed JSON file per data root in
cache_dir (named by a hash of the root path, written to a temporary name and
renamed) and reuses it when the root has not changed. "Not changed" is decided
with one stat per directory, not per file: every catalogued directory must
still be a directory with the same inode and mtime (a directory's mtime changes
whenever an entry in it is added, removed or renamed), and every alias must
still lead to the same directory. ImageNet's train set is ~1000 directories for
1.28 M files. st_dev is not compared: a network file system's device number
differs between the nodes that share a cache in $HOME. The catalog records
each file's identity (st_dev, st_ino; the shim uses it to invalidate every
path of a written file, NOTE [alias invalidation] in docs/design.md), so the devices of a reused catalog are re-derived:
the check's stat of each directory maps the device recorded for it to the
device it has here, and every file takes the device of its directory's
mapping. A file on a device that no catalogued directory is on (a symlink to
a file on another file system) is stat'ed itself. A recorded device seen on
two devices here makes the catalog rescanned. Not covered: a file system
whose directories keep their inode numbers across nodes while its files do
not.

What this does not see: a file rewritten in place under the same name (its
size or mtime changes, no directory's mtime does). The catalog's size and mtime
of such a file are stale, which can only mislead the planner: the daemon
re-checks the source's size and mtime against the catalog before it publishes
a copy, so a stale cache never serves wrong bytes (such a file is counted as a
changed source and not placed; `drop_cache` makes the next run rescan). A scan
in which a directory
was modified less than `RACY_SECONDS` before the scan began (mtimes have coarse
granularity, and clocks of PFS clients and servers differ), or which met an
unreadable directory, is not saved. A cache that cannot be read or parsed is
ignored with a log line, and replaced.

Data-set order
--------------
`dataset_order(catalog, Layout(kind, ...))` gives, for position i of the
training data set, the index into catalog.files of the file sample i reads:

* ``imagefolder`` / ``datasetfolder``: torchvision's ImageFolder/DatasetFolder
  order, computed from the catalog (no file-system access): classes are the
  entries of the root that are directories (symlinks to directories count),
  sorted by code point; for each class, ``sorted(os.walk(class_dir,
  followlinks=True))`` (walk tuples sorted by directory path string, so
  "x-y" and "x.y" come before "x/deep"), then each directory's file names
  sorted; a name is a sample when ``name.lower().endswith(extensions)`` (dot
  files included; extensions must be given in lower case, as in torchvision).
  Files directly in the root are not samples. A class without samples is an
  error (torchvision's FileNotFoundError) unless ``allow_empty``. The root is
  `Layout.root` (a directory inside a data root), by default the single data
  root; with several data roots it must be given. imagefolder uses
  torchvision's IMG_EXTENSIONS unless `Layout.extensions` is given;
  datasetfolder needs `Layout.extensions`. A DatasetFolder built with
  ``is_valid_file`` cannot be reproduced from names: use a manifest. A symlink
  loop inside a class (os.walk would descend into it until the kernel's ELOOP
  limit) is an error too.
* ``sorted``: every catalogued regular file, sorted by its source path
  (data-root path + "/" + relative path, by code point), optionally only names
  ending with `Layout.extensions` (lower-cased compare): for one root, a
  sorted list of the full paths of its regular files, dot files included.
  Files reached through a second link to one directory are listed once, under
  the catalogued path.
* ``manifest``: `Layout.manifest` lists the samples in order: a ``.json`` file
  holding a list of paths (or of [path, ...] items, like ImageFolder.samples),
  any other file one path per line (UTF-8, line ends stripped, blank lines
  skipped). Paths are absolute, or relative to `Layout.root`, else to the single
  data root. Every path must name a catalogued file under a data root (through
  symlinked directories too); anything else is an error naming the lines.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import queue
import stat
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

log = logging.getLogger("tiering")

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif",
                                   ".tiff", ".webp")
LAYOUTS = ("imagefolder", "datasetfolder", "sorted", "manifest")

STAT_BATCH = 64           # entries stat'ed by one task
CACHE_FORMAT = "tiering-catalog"
CACHE_VERSION = 2         # 2: files carry dev and ino
RACY_SECONDS = 10         # directories modified this shortly before a scan make it unsaveable


@dataclass(frozen=True)
class CatalogFile:
    root: int        # index into Catalog.roots
    rel: str         # path relative to the root, "/"-separated
    size: int
    mtime_ns: int
    dev: int = 0     # identity (st_dev, st_ino; symlinks followed), 0: unknown
    ino: int = 0


@dataclass(frozen=True)
class CatalogDir:
    root: int
    rel: str         # "" for the root itself
    ino: int
    dev: int
    mtime_ns: int


@dataclass(frozen=True)
class DirAlias:
    """A place where an already catalogued directory appears again (through a
    symlinked directory): ``rel`` is the same directory as ``target``."""
    root: int
    rel: str
    target: str


@dataclass
class Catalog:
    roots: list[str]                      # absolute, normalised data roots
    files: list[CatalogFile]
    dir_links: list[bool] = field(default_factory=list)  # per root: contains a symlinked dir
    dirs: list[CatalogDir] = field(default_factory=list)
    aliases: list[DirAlias] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (root, rel) not regular files
    from_cache: bool = False              # every root came from the scan cache

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def source_path(self, f: CatalogFile) -> str:
        return os.path.join(self.roots[f.root], f.rel)


class CatalogError(Exception):
    pass


class ScanError(CatalogError):
    pass


def default_cache_dir() -> Path:
    """${XDG_CACHE_HOME:-~/.cache}/tiering/catalogs"""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tiering" / "catalogs"


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


# -- scanning ------------------------------------------------------------------

@dataclass
class _RootScan:
    """One root, before root ids are assigned (also what the cache holds)."""
    files: list[tuple[str, int, int, int, int]] = field(default_factory=list)  # rel, size, mtime_ns, dev, ino
    dirs: list[tuple[str, int, int, int]] = field(default_factory=list)    # rel, ino, dev, mtime_ns
    aliases: list[tuple[str, str]] = field(default_factory=list)           # rel, target rel
    skipped: list[str] = field(default_factory=list)
    links: bool = False
    errors: list[str] = field(default_factory=list)
    scanned_ns: int = 0                                                    # wall clock at start


_Stat = tuple[str, "os.stat_result | None", bool]     # rel, stat (None: cannot), is a symlink


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def _stat_entries(rel: str, entries: list[Any]) -> list[_Stat]:
    out: list[_Stat] = []
    for e in entries:
        try:
            link = e.is_symlink()
            s = e.stat(follow_symlinks=True)
        except OSError:
            out.append((_join(rel, e.name), None, False))  # dangling link or vanished file
            continue
        out.append((_join(rel, e.name), s, link))
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


def _walk_root(root: str, pool: ThreadPoolExecutor) -> _RootScan:
    res = _RootScan(scanned_ns=time.time_ns())
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
                res.files.append((rel, s.st_size, s.st_mtime_ns, s.st_dev, s.st_ino))
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
        if not later:
            break
        round_, later = sorted(later, key=lambda x: x[0]), []
        for rel, s in round_:
            add_dir(rel, s)
    if res.errors and not res.files:
        raise ScanError(f"cannot scan {root}: {res.errors[0]}")
    res.files.sort()
    res.dirs.sort()
    res.aliases.sort()
    res.skipped.sort()
    return res


def scan(dirs: list[str], threads: int = 16, cache_dir: Path | None = None) -> Catalog:
    """The catalog of the data roots `dirs`; with cache_dir, each root's
    catalog is reused from there when the root has not changed (module doc)."""
    roots = normalise_roots(dirs)
    parts: list[_RootScan] = []
    cached = 0
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="tiering-scan") as pool:
        for r in roots:
            part = _load_cache(Path(cache_dir), r, pool) if cache_dir is not None else None
            if part is not None:
                cached += 1
            else:
                part = _walk_root(r, pool)
                if cache_dir is not None:
                    _save_cache(Path(cache_dir), r, part)
            parts.append(part)
    cat = Catalog(list(roots), [], [], from_cache=cache_dir is not None and cached == len(roots))
    for i, p in enumerate(parts):
        cat.files.extend(CatalogFile(i, rel, size, mt, dev, ino) for rel, size, mt, dev, ino in p.files)
        cat.dirs.extend(CatalogDir(i, rel, ino, dev, mt) for rel, ino, dev, mt in p.dirs)
        cat.aliases.extend(DirAlias(i, rel, target) for rel, target in p.aliases)
        cat.skipped.extend((i, rel) for rel in p.skipped)
        cat.dir_links.append(p.links)
    return cat


# -- scan cache ----------------------------------------------------------------

def cache_file(cache_dir: Path, root: str) -> Path:
    return cache_dir / (hashlib.sha256(os.fsencode(root)).hexdigest()[:32] + ".json.gz")


def _encode(root: str, p: _RootScan) -> bytes:
    doc = {
        "format": CACHE_FORMAT, "version": CACHE_VERSION, "root": root,
        "scanned_ns": p.scanned_ns, "dir_links": p.links,
        "files": {"rel": [f[0] for f in p.files], "size": [f[1] for f in p.files],
                  "mtime_ns": [f[2] for f in p.files], "dev": [f[3] for f in p.files],
                  "ino": [f[4] for f in p.files]},
        "dirs": {"rel": [d[0] for d in p.dirs], "ino": [d[1] for d in p.dirs],
                 "dev": [d[2] for d in p.dirs], "mtime_ns": [d[3] for d in p.dirs]},
        "aliases": {"rel": [a[0] for a in p.aliases], "target": [a[1] for a in p.aliases]},
        "skipped": p.skipped,
    }
    # ensure_ascii keeps undecodable names (surrogate escapes) round-tripping
    return json.dumps(doc, separators=(",", ":")).encode("ascii")


def _columns(table: Any, types: dict[str, type]) -> list[tuple[Any, ...]]:
    if not isinstance(table, dict):
        raise ValueError("table is not an object")
    cols = []
    for name, typ in types.items():
        col = table[name]
        if not isinstance(col, list) or not all(type(v) is typ for v in col):
            raise ValueError(f"column {name} is not a list of {typ.__name__}")
        cols.append(col)
    if len({len(c) for c in cols}) > 1:
        raise ValueError("columns of different lengths")
    return list(zip(*cols))


def _decode(data: bytes, root: str) -> _RootScan:
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT:
        raise ValueError("not a catalog cache")
    if doc.get("version") != CACHE_VERSION:
        raise ValueError(f"format version {doc.get('version')!r}, expected {CACHE_VERSION}")
    if doc.get("root") != root:
        raise ValueError(f"written for {doc.get('root')!r}")
    skipped = doc["skipped"]
    if not isinstance(skipped, list) or not all(isinstance(s, str) for s in skipped):
        raise ValueError("skipped is not a list of paths")
    p = _RootScan(
        files=_columns(doc["files"], {"rel": str, "size": int, "mtime_ns": int, "dev": int,  # type: ignore[arg-type]
                                      "ino": int}),
        dirs=_columns(doc["dirs"], {"rel": str, "ino": int, "dev": int, "mtime_ns": int}),  # type: ignore[arg-type]
        aliases=_columns(doc["aliases"], {"rel": str, "target": str}),  # type: ignore[arg-type]
        skipped=skipped, links=bool(doc["dir_links"]), scanned_ns=int(doc["scanned_ns"]))
    if not p.dirs or p.dirs[0][0] != "":
        raise ValueError("the root directory is missing")
    return p


def _same_dir(path: str, ino: int, mtime_ns: int | None) -> int | None:
    """The directory's device here when it is still the one recorded, else None."""
    try:
        s = os.stat(path)
    except OSError:
        return None
    same = stat.S_ISDIR(s.st_mode) and s.st_ino == ino and (mtime_ns is None or s.st_mtime_ns == mtime_ns)
    return s.st_dev if same else None


def _unchanged(root: str, p: _RootScan, pool: ThreadPoolExecutor) -> dict[int, int] | None:
    """One stat per directory and per alias (in parallel), none per file.
    Returns the recorded device -> device here of the directories, or None
    when the tree changed."""
    ino_of = {rel: ino for rel, ino, _, _ in p.dirs}
    checks: list[tuple[str, int, int | None]] = [
        (os.path.join(root, rel), ino, mt) for rel, ino, _, mt in p.dirs]
    checks += [(os.path.join(root, rel), ino_of.get(target, -1), None) for rel, target in p.aliases]
    devs = list(pool.map(lambda c: _same_dir(*c), checks, chunksize=16))
    if any(d is None for d in devs):
        return None
    mapping: dict[int, int] = {}
    for (_, _, recorded, _), here in zip(p.dirs, devs):
        if mapping.setdefault(recorded, here) != here:
            log.info("%s: one device of the cached catalog is two devices here; scanning", root)
            return None
    return mapping


def _rederive_devices(root: str, p: _RootScan, mapping: dict[int, int], pool: ThreadPoolExecutor) -> bool:
    """Gives every file of a reused catalog its device here (scan cache doc);
    False when a file whose device no directory maps cannot be stat'ed."""
    lost = [k for k, f in enumerate(p.files) if f[3] not in mapping]

    def here(k: int) -> tuple[int, int] | None:
        try:
            s = os.stat(os.path.join(root, p.files[k][0]))
        except OSError:
            return None
        return (s.st_dev, s.st_ino) if stat.S_ISREG(s.st_mode) else None

    found: dict[int, tuple[int, int]] = {}
    for k, ident in zip(lost, pool.map(here, lost, chunksize=16)):
        if ident is None:
            return False
        found[k] = ident
    p.files = [(rel, size, mt, *found[k]) if k in found else (rel, size, mt, mapping[dev], ino)
               for k, (rel, size, mt, dev, ino) in enumerate(p.files)]
    return True


def _load_cache(cache_dir: Path, root: str, pool: ThreadPoolExecutor) -> _RootScan | None:
    path = cache_file(cache_dir, root)
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, EOFError) as e:
        log.warning("ignoring the catalog cache %s of %s (%s); scanning", path, root, e)
        return None
    try:
        part = _decode(data, root)
    except (ValueError, KeyError, TypeError) as e:
        log.warning("ignoring the catalog cache %s of %s (%s); scanning", path, root, e)
        return None
    mapping = _unchanged(root, part, pool)
    if mapping is None:
        log.info("%s changed since its catalog was cached; scanning", root)
        return None
    if not _rederive_devices(root, part, mapping, pool):
        log.info("%s: a file of its cached catalog cannot be stat'ed; scanning", root)
        return None
    log.info("catalog of %s taken from %s (%d files)", root, path, len(part.files))
    return part


def _save_cache(cache_dir: Path, root: str, p: _RootScan) -> None:
    path = cache_file(cache_dir, root)
    racy = p.scanned_ns - RACY_SECONDS * 10**9
    why = None
    if p.errors:
        why = f"parts could not be read ({p.errors[0]})"
    elif any(mt >= racy for _, _, _, mt in p.dirs):
        why = f"a directory changed less than {RACY_SECONDS} s before the scan (a later run caches it)"
    if why is not None:
        log.info("not caching the catalog of %s: %s", root, why)
        try:
            path.unlink()           # stale: spares the next run its check
        except OSError:
            pass
        return
    tmp = None
    try:
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _sweep_temporaries(cache_dir)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json.gz", dir=cache_dir)
        with os.fdopen(fd, "wb") as f:
            with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=6, mtime=0) as gz:
                gz.write(_encode(root, p))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        log.warning("cannot write the catalog cache %s of %s: %s", path, root, e)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def drop_cache(cache_dir: Path, roots: list[str]) -> None:
    """Forgets the cached catalogs of these (normalised) roots, e.g. after the
    daemon found a source whose size or mtime differs from the catalog."""
    for r in roots:
        try:
            cache_file(Path(cache_dir), r).unlink()
        except OSError:
            pass


def _sweep_temporaries(cache_dir: Path, age: float = 3600) -> None:
    """Temporary files left by a process killed while writing."""
    now = time.time()
    for p in cache_dir.glob(".tmp-*"):
        try:
            if now - p.lstat().st_mtime > age:
                p.unlink()
        except OSError:
            pass


# -- data-set order ------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """How the training code numbers its samples (module doc)."""
    kind: str                                   # imagefolder | datasetfolder | sorted | manifest
    extensions: tuple[str, ...] | None = None   # imagefolder default: IMG_EXTENSIONS
    manifest: Path | None = None                # for "manifest": text (one path a line) or .json list
    root: Path | None = None                    # ImageFolder root / base of relative manifest paths
    allow_empty: bool = False                   # ImageFolder(allow_empty=True)

    def __post_init__(self) -> None:
        if isinstance(self.extensions, str):    # torchvision also takes one string
            object.__setattr__(self, "extensions", (self.extensions,))
        elif self.extensions is not None:
            object.__setattr__(self, "extensions", tuple(self.extensions))


class _Tree:
    """The directory tree of one root as the catalog saw it."""

    def __init__(self, catalog: Catalog, root: int):
        self.files: dict[str, dict[str, int]] = {}      # dir rel -> name -> catalog id
        self.skipped: dict[str, set[str]] = {}           # dir rel -> names not catalogued
        self.subdirs: dict[str, dict[str, str]] = {}     # dir rel -> name -> catalogued dir rel
        for k, f in enumerate(catalog.files):
            if f.root == root:
                parent, _, name = f.rel.rpartition("/")
                self.files.setdefault(parent, {})[name] = k
        for r, rel in catalog.skipped:
            if r == root:
                parent, _, name = rel.rpartition("/")
                self.skipped.setdefault(parent, set()).add(name)
        dirs = [d.rel for d in catalog.dirs if d.root == root]
        if not dirs:   # a catalog built by hand: directories from the files' parents
            found = {""}
            for parent in self.files:
                while parent not in found:
                    found.add(parent)
                    parent = parent.rpartition("/")[0]
            dirs = sorted(found)
        for rel in dirs:
            if rel:
                parent, _, name = rel.rpartition("/")
                self.subdirs.setdefault(parent, {})[name] = rel
        for a in catalog.aliases:
            if a.root == root:
                parent, _, name = a.rel.rpartition("/")
                self.subdirs.setdefault(parent, {})[name] = a.target
        self._resolved: dict[str, str | None] = {"": ""}

    def subdir(self, rel: str, name: str) -> str | None:
        return self.subdirs.get(rel, {}).get(name)

    def resolve_dir(self, rel: str) -> str | None:
        """The catalogued directory a path (maybe through aliases) is."""
        if rel in self._resolved:
            return self._resolved[rel]
        parent, _, name = rel.rpartition("/")
        up = self.resolve_dir(parent)
        out = None if up is None else self.subdir(up, name)
        self._resolved[rel] = out
        return out

    def file_id(self, rel: str) -> int | None:
        parent, _, name = rel.rpartition("/")
        d = self.resolve_dir(parent)
        return None if d is None else self.files.get(d, {}).get(name)

    def walk(self, vrel: str, crel: str, where: str) -> list[tuple[str, str]]:
        """(path, catalogued dir) of every directory os.walk(followlinks=True)
        visits from vrel, in walk order (the caller sorts)."""
        out: list[tuple[str, str]] = []
        stack: list[tuple[str, str, tuple[str, ...]]] = [(vrel, crel, (crel,))]
        while stack:
            v, c, ancestors = stack.pop()
            out.append((v, c))
            for name, target in self.subdirs.get(c, {}).items():
                if target in ancestors:
                    raise CatalogError(
                        f"{os.path.join(where, v, name)} is a symlink to a directory that contains "
                        "it: os.walk(followlinks=True), and so ImageFolder, would descend into this "
                        "loop until the kernel's symlink limit and list its files many times; remove "
                        "the link or give the order as --layout manifest")
                stack.append((_join(v, name), target, ancestors + (target,)))
        return out

    def names(self, crel: str) -> list[str]:
        """What os.walk lists as file names: everything but directories."""
        other = self.skipped.get(crel)
        files = self.files.get(crel, {})
        return sorted(files.keys() | other if other else files)


class _Roots:
    """Absolute paths -> (root id, rel), through a symlinked root's realpath too."""

    def __init__(self, catalog: Catalog):
        self.prefixes: list[tuple[str, int]] = []
        for i, r in enumerate(catalog.roots):
            for prefix in {r, os.path.realpath(r)}:
                self.prefixes.append((prefix.rstrip("/"), i))
        self.prefixes.sort(key=lambda x: -len(x[0]))   # longest first

    def split(self, path: str) -> tuple[int, str] | None:
        p = os.path.normpath(path)
        for prefix, i in self.prefixes:
            if p == prefix or (prefix == "" and p == "/"):
                return i, ""
            if p.startswith(prefix + "/"):
                return i, p[len(prefix) + 1:]
        return None


def _layout_root(catalog: Catalog, layout: Layout) -> tuple[int, str, str]:
    """(root id, catalogued dir rel, path as the training code names it) of the
    directory an imagefolder layout starts from / relative manifest paths use."""
    if layout.root is None:
        if len(catalog.roots) != 1:
            raise CatalogError(
                f"--layout {layout.kind} reads one directory, but there are {len(catalog.roots)} data "
                f"roots ({', '.join(catalog.roots)}): say which is the data set's root (Layout.root), "
                "or give a --layout manifest")
        return 0, "", catalog.roots[0]
    path = os.path.abspath(layout.root)
    where = _Roots(catalog).split(path)
    if where is None:
        raise CatalogError(f"{path} is not inside the data roots ({', '.join(catalog.roots)}): "
                           "pass it (or a directory above it) as --data")
    tree = _Tree(catalog, where[0])
    crel = tree.resolve_dir(where[1])
    if crel is None:
        raise CatalogError(f"{path}: no such directory in the catalog of {catalog.roots[where[0]]}")
    return where[0], crel, path


def _extensions(layout: Layout) -> tuple[str, ...]:
    if layout.extensions is not None:
        return layout.extensions
    if layout.kind == "datasetfolder":
        raise CatalogError(
            "--layout datasetfolder needs the extensions the DatasetFolder was given "
            "(its extensions=...); one built with is_valid_file cannot be reproduced from file "
            "names: give the order as --layout manifest")
    return IMG_EXTENSIONS


def dataset_samples(catalog: Catalog, layout: Layout) -> list[tuple[str, int]]:
    """(path the training code opens, catalog file id) of every sample, in
    data-set order. The path differs from the catalog's source path only for
    a file reached through an alias (a second path to a directory)."""
    if layout.kind in ("imagefolder", "datasetfolder"):
        return _folder_samples(catalog, layout)
    if layout.kind == "sorted":
        exts = tuple(layout.extensions) if layout.extensions is not None else None
        paths = [(catalog.source_path(f), k) for k, f in enumerate(catalog.files)
                 if exts is None or f.rel.rpartition("/")[2].lower().endswith(exts)]
        paths.sort()
        return paths
    if layout.kind == "manifest":
        return _manifest_samples(catalog, layout)
    raise CatalogError(f"unknown layout {layout.kind!r}: use one of {', '.join(LAYOUTS)}")


def dataset_order(catalog: Catalog, layout: Layout) -> list[int]:
    """Position i of the data set -> index into catalog.files of the file
    sample i reads (module doc)."""
    return [k for _, k in dataset_samples(catalog, layout)]


def _folder_samples(catalog: Catalog, layout: Layout) -> list[tuple[str, int]]:
    exts = _extensions(layout)
    root_id, base, where = _layout_root(catalog, layout)
    tree = _Tree(catalog, root_id)
    classes = sorted(tree.subdirs.get(base, {}))
    if not classes:
        raise CatalogError(f"Couldn't find any class folder in {where}: --layout {layout.kind} "
                           "expects root/<class>/.../<file>")
    samples: list[tuple[str, int]] = []
    empty: list[str] = []
    prefix = where.rstrip("/") + "/"
    for cls in classes:
        start = len(samples)
        crel = tree.subdir(base, cls)
        assert crel is not None
        for vrel, drel in sorted(tree.walk(cls, crel, where)):
            ids = tree.files.get(drel, {})
            for name in tree.names(drel):
                if not name.lower().endswith(exts):
                    continue
                path = prefix + vrel + "/" + name
                if name not in ids:
                    raise CatalogError(
                        f"{path} is not a regular file (a dangling symlink, a fifo or socket, or it "
                        f"cannot be stat'ed), but ImageFolder would list it as a sample by its name; "
                        "remove it or give the order as --layout manifest")
                samples.append((path, ids[name]))
        if len(samples) == start:
            empty.append(cls)
    if empty and not layout.allow_empty:
        raise CatalogError(
            f"Found no valid file for the classes {', '.join(empty)} in {where}. Supported "
            f"extensions are: {', '.join(exts)} (compared with the lower-cased file name). "
            "torchvision raises FileNotFoundError here; remove the empty class folders or use "
            "allow_empty")
    return samples


def _read_manifest(path: Path) -> list[tuple[int, str]]:
    """(line or item number, path) of every entry."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CatalogError(f"cannot read the manifest {path}: {e}") from None
    if path.suffix.lower() == ".json":
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise CatalogError(f"manifest {path}: not valid JSON ({e})") from None
        if not isinstance(doc, list):
            raise CatalogError(f"manifest {path}: expected a JSON list of paths, got {type(doc).__name__}")
        out = []
        for k, item in enumerate(doc):
            if isinstance(item, list) and item:
                item = item[0]          # [path, class] like ImageFolder.samples
            if not isinstance(item, str):
                raise CatalogError(f"manifest {path}: item {k} is {item!r}, expected a path "
                                   "(or a [path, ...] list)")
            out.append((k, item))
        return out
    text = data.decode("utf-8", "surrogateescape")
    lines = [(n, line.removesuffix("\r")) for n, line in enumerate(text.split("\n"), 1)]
    return [(n, line) for n, line in lines if line.strip()]


def _manifest_samples(catalog: Catalog, layout: Layout) -> list[tuple[str, int]]:
    if layout.manifest is None:
        raise CatalogError("--layout manifest needs the manifest file (Layout.manifest)")
    entries = _read_manifest(Path(layout.manifest))
    if not entries:
        raise CatalogError(f"manifest {layout.manifest} lists no files")
    unit = "item" if Path(layout.manifest).suffix.lower() == ".json" else "line"
    base: str | None = None
    if layout.root is not None or len(catalog.roots) == 1:
        base = _layout_root(catalog, layout)[2]
    roots = _Roots(catalog)
    trees: dict[int, _Tree] = {}
    samples: list[tuple[str, int]] = []
    bad: list[str] = []
    for n, p in entries:
        if os.path.isabs(p):
            path = os.path.normpath(p)
        elif base is None:
            bad.append(f"{unit} {n}: {p!r} is relative, and with several data roots the manifest "
                       "must give absolute paths")
            continue
        else:
            path = os.path.normpath(os.path.join(base, p))
        where = roots.split(path)
        if where is None:
            bad.append(f"{unit} {n}: {path} is outside the data roots")
            continue
        tree = trees.get(where[0]) or trees.setdefault(where[0], _Tree(catalog, where[0]))
        k = tree.file_id(where[1])
        if k is None:
            what = "is not a regular file" if os.path.lexists(path) else "does not exist"
            bad.append(f"{unit} {n}: {path} {what} (not in the catalog)")
            continue
        samples.append((path, k))
    if bad:
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise CatalogError(f"manifest {layout.manifest}: {len(bad)} of {len(entries)} entries are not "
                           f"files of the data set under {', '.join(catalog.roots)}: "
                           + "; ".join(bad[:5]) + more)
    return samples
