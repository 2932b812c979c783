"""Scan cache
----------
``scan(dirs, threads, cache_dir)`` keeps one file per data root in cache_dir
(named by a hash of the root path, written to a temporary name and renamed)
and reuses it when the root has not changed. The file is an uncompressed numpy
``.npz`` of the catalog's arrays (NOTE [catalog cache format] in
docs/design.md): 1.28 M files load in a fraction of a second. "Not changed" is decided
with one stat per directory, not per file: every catalogued directory must
still be a directory with the same inode and mtime (a directory's mtime changes
whenever an entry in it is added, removed or renamed), and every alias must
still lead to the same directory. ImageNet's train set is ~1000 directories for
1.28 M files. st_dev is not compared: a network file system's device number
differs between the nodes that share a cache in $HOME. The catalog records
each file's identity (st_dev, st_ino; the shim uses it to invalidate every
path of a written file, NOTE [alias invalidation] in docs/design.md), so the
devices of a reused catalog are re-derived: the check's stat of each
directory maps the device recorded for it to the device it has here, and
every file takes the device of its directory's mapping. A file on a device
that no catalogued directory is on (a symlink to a file on another file
system) is stat'ed itself. A recorded device seen on two devices here makes
the catalog rescanned. Not covered: a file system whose directories keep
their inode numbers across nodes while its files do not.

What this does not see: a file rewritten in place under the same name (its
size or mtime changes, no directory's mtime does). The catalog's size and mtime
of such a file are stale, which can only mislead the planner: the daemon
re-checks the source's size and mtime against the catalog before it publishes
a copy, so a stale cache never serves wrong bytes (such a file is counted as a
changed source and not placed; `drop_cache` makes the next run rescan). For
the same reason the shim answers no stat from a catalog taken from the cache
(`Catalog.cached`; NOTE [stat from the index] in docs/design.md). A scan
in which a directory
was modified less than `RACY_SECONDS` before the scan began (mtimes have coarse
granularity, and clocks of PFS clients and servers differ), or which met an
unreadable directory, is not saved. A cache that cannot be read or parsed is
ignored with a log line, and replaced (a damaged zip directory or .npy header
too, NOTE [untrusted arrays]); so is one with an entry that is not a
plain relative path below its root (an absolute path, an empty, "." or ".."
component) or a file named twice or out of the scan's order.

Only the user's own cache is trusted: when the cache directory or a cache file
does not belong to the user or is writable by group or others (or the file is
a symlink), it is refused with a log line and the scan runs without writing
there (NOTE [tier directories] in docs/design.md).
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import stat
import tempfile
import threading
import time
import warnings
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import psutil

from ..npyfile import read_npy
from ..shimlib import ffi, lib
from .model import FILE_COLUMNS, FileTable, RootScan

log = logging.getLogger("tiering")

CACHE_FORMAT = "tiering-catalog"
CACHE_VERSION = 5         # 2: files carry dev and ino; 3: and link (the catalogued path was a symlink);
                          # 4: and the rest of their stat (STAT_FIELDS); 5: numpy arrays in an .npz
RACY_SECONDS = 10         # directories modified this shortly before a scan make it unsaveable
SUFFIX = ".npz"
OLD_SUFFIX = ".json.gz"   # format versions up to 4: removed when found


def default_cache_dir() -> Path:
    """${XDG_CACHE_HOME:-~/.cache}/tiering/catalogs"""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tiering" / "catalogs"


def _stem(root: str) -> str:
    return hashlib.sha256(os.fsencode(root)).hexdigest()[:32]


def cache_file(cache_dir: Path, root: str) -> Path:
    return cache_dir / (_stem(root) + SUFFIX)


# the arrays of the file (besides "meta", a JSON document as bytes), with their dtypes
ARRAYS: dict[str, str] = {"paths": "|u1", "offsets": "<i8", "dir": "<i4", **FILE_COLUMNS}


def _encode(root: str, p: RootScan) -> dict[str, np.ndarray]:
    meta = {
        "format": CACHE_FORMAT, "version": CACHE_VERSION, "root": root,
        "scanned_ns": p.scanned_ns, "dir_links": p.links, "files": len(p.files),
        "dirs": {"rel": [d[0] for d in p.dirs], "ino": [d[1] for d in p.dirs],
                 "dev": [d[2] for d in p.dirs], "mtime_ns": [d[3] for d in p.dirs]},
        "aliases": {"rel": [a[0] for a in p.aliases], "target": [a[1] for a in p.aliases]},
        "skipped": p.skipped,
    }
    # ensure_ascii keeps undecodable names (surrogate escapes) round-tripping
    text = json.dumps(meta, separators=(",", ":")).encode("ascii")
    out: dict[str, np.ndarray] = {"meta": np.frombuffer(text, np.uint8)}
    t = p.files
    out.update(paths=t.paths, offsets=t.offsets, dir=t.dir, **t.columns)
    return out


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


class CacheRefused(Exception):
    """The cache is not the user's own: not read, not written."""


def _foreign(st: os.stat_result) -> str | None:
    if st.st_uid != os.getuid():
        return f"belongs to uid {st.st_uid}"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def cache_dir_problem(cache_dir: Path) -> str | None:
    """Why the cache directory is not the user's own, or None (also when it does not exist yet)."""
    try:
        st = os.stat(cache_dir)
    except (FileNotFoundError, NotADirectoryError):
        return None                 # made when it is written (or that fails, with a log line)
    except OSError as e:
        return f"{cache_dir}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{cache_dir} is not a directory"
    why = _foreign(st)
    return f"{cache_dir} {why}" if why else None


def _open_own(path: Path) -> BinaryIO:
    """A cache file the user owns and no one else can write, open for
    reading; CacheRefused otherwise (a symlink too)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CacheRefused(f"{path} is a symlink") from None
        raise
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    why = "is not a regular file" if not stat.S_ISREG(st.st_mode) else _foreign(st)
    if why:
        f.close()
        raise CacheRefused(f"{path} {why}")
    return f


def _check_rel(rel: str, what: str) -> None:
    """A plain relative path below the root: no absolute path, no empty, "."
    or ".." component (a cache that says otherwise is not used)."""
    if not rel or rel.startswith("/") or "\0" in rel or any(c in ("", ".", "..") for c in rel.split("/")):
        raise ValueError(f"{what} {rel!r} is not a relative path below the root")


def _check_paths(p: RootScan) -> None:
    if not p.dirs or p.dirs[0][0] != "":
        raise ValueError("the root directory is missing")
    _check_file_paths(p.files)
    for rel, *_ in p.dirs[1:]:
        _check_rel(rel, "directory")
    for rel, target in p.aliases:
        _check_rel(rel, "alias")
        if target:                                  # "" is the root itself
            _check_rel(target, "alias target")
    for rel in p.skipped:
        _check_rel(rel, "skipped entry")


def _check_file_paths(t: FileTable) -> None:
    """_check_rel of every file at once, on the path blob: no empty path, no
    NUL byte, no "/" first or last, no empty, "." or ".." component (in
    blocks of files: the masks stay small)."""
    o = t.offsets
    if len(o) and (o[0] != 0 or o[-1] != len(t.paths) or np.any(o[1:] < o[:-1])):
        raise ValueError("file path offsets out of order")
    for a in range(0, len(t), CHECK_BLOCK):
        _check_block(t, a, min(len(t), a + CHECK_BLOCK))


CHECK_BLOCK = 1 << 16     # files per block of _check_file_paths


def _check_block(t: FileTable, first_file: int, end_file: int) -> None:
    o = t.offsets[first_file:end_file + 1]
    starts, ends, b = o[:-1] - o[0], o[1:] - o[0], t.paths[o[0]:o[-1]]
    if np.any(ends == starts) or np.any(b == 0):
        bad = np.flatnonzero(ends == starts)
        raise ValueError(f"file {t.rel(first_file + int(bad[0])) if len(bad) else '(with a NUL byte)'!r} "
                         "is not a relative path below the root")
    slash, dot = b == ord("/"), b == ord(".")
    first = np.zeros(len(b), bool)           # where a component begins
    first[starts] = True
    first[1:] |= slash[:-1]
    after = np.zeros(len(b) + 2, bool)       # where a component ends (the end of a path, or a "/")
    after[ends] = True
    after[:len(b)] |= slash
    wrong = first & dot & after[1:len(b) + 1]                    # "."
    wrong |= first & dot & np.append(dot[1:], False) & after[2:]  # ".."
    wrong |= first & slash                                       # "" (a leading, doubled or trailing "/")
    wrong[ends - 1] |= slash[ends - 1]
    at = np.flatnonzero(wrong)
    if len(at):
        k = first_file + int(np.searchsorted(ends, at[0], "right"))
        raise ValueError(f"file {t.rel(k)!r} is not a relative path below the root")


def _check_ascending(t: FileTable) -> None:
    """The files in the order the scan writes them, none twice (a duplicate
    would stop the index, NOTE [catalog cache format]): bytes ascending, in C
    (one memcmp per file); a table with a name that is not UTF-8 sorts as
    str (surrogate escapes), checked in Python when the bytes do not ascend."""
    n = len(t)
    if n < 2:
        return
    k = -2
    try:
        k = int(lib.tiering_scan_ascending(ffi.from_buffer("uint8_t[]", t.paths),
                                           ffi.from_buffer("int64_t[]", t.offsets), n))
    except (OSError, AttributeError):      # the library is not built
        pass
    if k == -1:
        return
    if k >= 0:
        try:
            t.paths.tobytes().decode("utf-8")
        except UnicodeDecodeError:
            k = -2
    if k == -2:
        rels = t.rels()
        k = next((i for i in range(n - 1) if not rels[i] < rels[i + 1]), -1)
        if k == -1:
            return
    raise ValueError(f"file {t.rel(k + 1)!r} is out of path order or named twice")


def _read_arrays(f: BinaryIO) -> dict[str, np.ndarray]:
    """The arrays of the .npz, each checked before it is read (a damaged zip
    directory or .npy header is a ValueError or BadZipFile, NOTE [untrusted
    arrays]): stored (np.savez compresses nothing), within the file."""
    size = os.fstat(f.fileno()).st_size
    out = {}
    with zipfile.ZipFile(f) as z:
        for name in ["meta", *ARRAYS]:
            info = z.getinfo(name + ".npy")
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1 or \
                    info.file_size != info.compress_size or info.header_offset + info.compress_size > size:
                raise ValueError(f"member {name} is compressed, encrypted or beyond the file")
            with z.open(info) as m:
                out[name] = read_npy(cast(io.BufferedIOBase, m), info.file_size)
    return out


def _decode(f: BinaryIO, root: str) -> RootScan:
    arrays = _read_arrays(f)
    meta = arrays["meta"]
    if meta.dtype != np.uint8 or meta.ndim != 1:
        raise ValueError("not a catalog cache")
    try:
        doc = json.loads(meta.tobytes())
    except RecursionError:
        raise ValueError("meta is nested too deeply") from None
    if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT:
        raise ValueError("not a catalog cache")
    if doc.get("version") != CACHE_VERSION:
        raise ValueError(f"format version {doc.get('version')!r}, expected {CACHE_VERSION}")
    if doc.get("root") != root:
        raise ValueError(f"written for {doc.get('root')!r}")
    skipped = doc["skipped"]
    if not isinstance(skipped, list) or not all(isinstance(s, str) for s in skipped):
        raise ValueError("skipped is not a list of paths")
    n = doc["files"]
    for name, dtype in ARRAYS.items():
        a = arrays[name]
        want = n + 1 if name == "offsets" else None if name == "paths" else n
        if a.dtype != np.dtype(dtype) or a.ndim != 1 or (want is not None and len(a) != want):
            raise ValueError(f"array {name} is not {want} values of {np.dtype(dtype)}")
    dirs = _columns(doc["dirs"], {"rel": str, "ino": int, "dev": int, "mtime_ns": int})
    d = arrays["dir"]
    if len(d) and (d.min() < -1 or d.max() >= len(dirs)):
        raise ValueError("a file's directory is not in the table")
    files = FileTable(arrays["paths"], arrays["offsets"], np.zeros(n, np.int32), d,
                      {k: arrays[k] for k in FILE_COLUMNS})
    if not all(0 <= ino < 1 << 64 and 0 <= dev < 1 << 64 and -(1 << 63) <= mt < 1 << 63 for _, ino, dev, mt in dirs):
        raise ValueError("a directory's inode, device or mtime is out of range")
    p = RootScan(files=files, dirs=dirs, aliases=_columns(doc["aliases"], {"rel": str, "target": str}),
                 skipped=skipped, links=bool(doc["dir_links"]), scanned_ns=int(doc["scanned_ns"]))
    _check_paths(p)
    _check_ascending(files)       # after _check_paths: the offsets are within the blob
    return p


def _same_dir(path: str, ino: int, mtime_ns: int | None) -> int | None:
    """The directory's device here when it is still the one recorded, else None."""
    try:
        s = os.stat(path)
    except OSError:
        return None
    same = stat.S_ISDIR(s.st_mode) and s.st_ino == ino and (mtime_ns is None or s.st_mtime_ns == mtime_ns)
    return s.st_dev if same else None


def _unchanged(root: str, p: RootScan, pool: ThreadPoolExecutor) -> dict[int, int] | None:
    """One stat per directory and per alias (in parallel), none per file.
    Returns the recorded device -> device here of the directories, or None
    when the tree changed."""
    ino_of = {rel: ino for rel, ino, _, _ in p.dirs}
    checks: list[tuple[str, int, int | None]] = [
        (os.path.join(root, rel), ino, mt) for rel, ino, _, mt in p.dirs]
    checks += [(os.path.join(root, rel), ino_of.get(target, -1), None) for rel, target in p.aliases]
    found = list(pool.map(lambda c: _same_dir(*c), checks, chunksize=16))
    devs = [d for d in found if d is not None]
    if len(devs) != len(found):
        return None
    mapping: dict[int, int] = {}
    for (_, _, recorded, _), here in zip(p.dirs, devs):
        if mapping.setdefault(recorded, here) != here:
            log.info("%s: one device of the cached catalog is two devices here; scanning", root)
            return None
    return mapping


def _rederive_devices(root: str, p: RootScan, mapping: dict[int, int], pool: ThreadPoolExecutor) -> bool:
    """Gives every file of a reused catalog its device here (module doc);
    False when a file whose device no directory maps cannot be stat'ed."""
    t = p.files
    dev = t.columns["dev"]
    recorded = np.fromiter(mapping, np.uint64, len(mapping))
    lost = np.flatnonzero(~np.isin(dev, recorded)).tolist()

    def here(k: int) -> tuple[int, int] | None:
        try:
            s = os.stat(os.path.join(root, t.rel(k)))
        except OSError:
            return None
        return (s.st_dev, s.st_ino) if stat.S_ISREG(s.st_mode) else None

    found = list(pool.map(here, lost, chunksize=16))
    if any(ident is None for ident in found):
        return False
    new_dev = dev.copy()
    for was, now in mapping.items():
        new_dev[dev == was] = now
    for k, ident in zip(lost, found):
        assert ident is not None
        new_dev[k], t.columns["ino"][k] = ident
    t.columns["dev"] = new_dev
    return True


def load_cache(cache_dir: Path, root: str, pool: ThreadPoolExecutor) -> RootScan | None:
    """The cached catalog of root if it is still valid, else None; raises
    CacheRefused when the cache file is not the user's own."""
    path = cache_file(cache_dir, root)
    try:
        f = _open_own(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        log.warning("ignoring the catalog cache %s of %s (%s); scanning", path, root, e)
        return None
    try:
        with f:
            part = _decode(f, root)
    except (ValueError, KeyError, TypeError, OSError, EOFError, zipfile.BadZipFile) as e:
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


def save_cache(cache_dir: Path, root: str, p: RootScan) -> None:
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
        problem = cache_dir_problem(cache_dir)
        if problem is not None:
            log.warning("not writing the catalog cache of %s: %s", root, problem)
            return
        _sweep_temporaries(cache_dir)
        _remove_old_format(cache_dir, root)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=cache_dir)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **cast(dict[str, Any], _encode(root, p)))     # not compressed: loading is the point
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


@dataclass
class PendingSave:
    """A root's fresh catalog, to be written to the cache."""

    cache_dir: Path
    root: str
    part: RootScan


SaveFn = Callable[[list[PendingSave]], None]


def save_now(saves: list[PendingSave]) -> None:
    """Writes each catalog to the cache, one after another (scan's default)."""
    for s in saves:
        save_cache(s.cache_dir, s.root, s.part)


WRITER_NICE = 10          # the cache writer yields the CPU to COMMAND's start


def save_in_child(saves: list[PendingSave], prepare: Callable[[], None] | None = None,
                  output: Path | None = None, first: Callable[[], bool] | None = None) -> int | None:
    """Writes the catalogs to the cache in a forked child, and returns its
    pid at once (None: nothing to write, or written here because fork
    failed), NOTE [cache written aside].  The child sees the catalogs as
    they were at the fork whatever the caller does with them next; it reads
    nothing from stdin, writes its stdout and stderr to `output` (a new
    file; /dev/null without one), never to the caller's terminal, calls
    prepare() (the caller's signal settings undone), writes each catalog to
    a temporary file and renames it (a writer killed on the way leaves a
    temporary, never a half cache) and exits with _exit (no handler of the
    caller's runs twice).  first, when given, runs in the child before the
    write (the stats a names-first scan still lacks, NOTE [names first]);
    nothing is written unless it returns True, and nothing at all when fork
    fails."""
    if not saves:
        return None
    try:
        pid = _fork()
    except OSError as e:
        if first is not None:
            log.info("cannot start the catalog cache writer (%s); no cache this time", e)
            return None
        log.info("cannot start the catalog cache writer (%s); writing the cache now", e)
        save_now(saves)
        return None
    if pid:
        return pid
    code = 1
    try:
        _output_to(output)
        if prepare is not None:
            prepare()
        os.nice(WRITER_NICE)
        if first is None or first():
            save_now(saves)
        code = 0
    except BaseException:    # noqa: BLE001 - a child never returns into the caller
        log.debug("the catalog cache writer failed", exc_info=True)
    finally:
        os._exit(code)


def _fork() -> int:
    """os.fork, called where no Python thread but the caller's runs.  Python
    3.12 warns of a fork in a process with threads and counts the threads of
    native libraries too (OpenBLAS's idle workers, started by numpy's
    import): with no other Python thread that warning is silenced, never
    otherwise (NOTE [cache written aside])."""
    with warnings.catch_warnings():
        if threading.active_count() == 1:
            warnings.filterwarnings("ignore", r"This process .* is multi-threaded, use of fork\(\)",
                                    DeprecationWarning)
        return os.fork()


def _output_to(path: Path | None) -> None:
    """In the writer: stdin from /dev/null, stdout and stderr to path (made
    new, 0600, never through a symlink) or to /dev/null."""
    null = os.open(os.devnull, os.O_RDWR)
    out = null
    if path is not None:
        try:
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError:
            pass
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)


def wait_writer(pid: int, timeout: float) -> bool:
    """Waits up to timeout seconds for the cache writer (a child of this
    process) to end and reaps it; False when it still runs (it then ends on
    its own, an orphan)."""
    try:
        psutil.Process(pid).wait(timeout)   # a child of this process: reaped by waitpid
    except psutil.TimeoutExpired:
        return False
    except psutil.NoSuchProcess:
        pass                                # reaped already
    return True


def drop_cache(cache_dir: Path, roots: list[str]) -> None:
    """Forgets the cached catalogs of these (normalised) roots, e.g. after the
    daemon found a source whose size or mtime differs from the catalog."""
    for r in roots:
        try:
            cache_file(Path(cache_dir), r).unlink()
        except OSError:
            pass
        _remove_old_format(Path(cache_dir), r)


def _remove_old_format(cache_dir: Path, root: str) -> None:
    try:
        (cache_dir / (_stem(root) + OLD_SUFFIX)).unlink()
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
