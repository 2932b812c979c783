"""The catalog: every regular file under the data roots, with size and mtime,
and the directories and directory aliases the scan saw."""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, overload

import numpy as np


class CatalogError(Exception):
    pass


class ScanError(CatalogError):
    pass


class ReleasedColumn(CatalogError):
    """A column of the catalog read after FileTable.release_indexed let it go."""


@dataclass(frozen=True)
class CatalogFile:
    root: int        # index into Catalog.roots
    rel: str         # path relative to the root, "/"-separated
    size: int
    mtime_ns: int
    dev: int = 0     # identity (st_dev, st_ino; symlinks followed), 0: unknown
    ino: int = 0
    link: bool = False   # the catalogued path itself was a symlink (copies follow it; others are opened O_NOFOLLOW)
    # the rest of the scan's stat (symlinks followed), which the shim answers
    # stat from (NOTE [stat from the index] in docs/design.md)
    mode: int = 0
    uid: int = 0
    gid: int = 0
    nlink: int = 0
    atime_ns: int = 0
    ctime_ns: int = 0
    blocks: int = 0
    blksize: int = 0


class FileRef(Protocol):
    """What names a catalogued file's source: a CatalogFile, or the lighter
    record a copy is made from (placement/tiers.py's CopyOf)."""

    @property
    def root(self) -> int: ...
    @property
    def rel(self) -> str: ...


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


# Per-file columns of a FileTable (NOTE [catalog arrays] in docs/design.md),
# after root and rel, in CatalogFile order, with their dtypes.
FILE_COLUMNS: dict[str, str] = {
    "size": "<i8", "mtime_ns": "<i8", "dev": "<u8", "ino": "<u8", "link": "?",
    "mode": "<u4", "uid": "<u4", "gid": "<u4", "nlink": "<u8", "atime_ns": "<i8", "ctime_ns": "<i8",
    "blocks": "<i8", "blksize": "<i8"}
# A per-file column as callers give it: a list, or an array of the catalog.
IntColumn: TypeAlias = Sequence[int] | np.ndarray
STAT_FIELDS = ("mode", "uid", "gid", "nlink", "atime_ns", "ctime_ns", "blocks", "blksize")
INDEXED_ONLY = ("dev", "ino", *STAT_FIELDS)    # columns nothing reads once the index is written
TERMINATE_BLOCK = 1 << 16     # files per block of FileTable.terminated


def encode_rel(rel: str) -> bytes:
    return rel.encode("utf-8", "surrogateescape")


def decode_rel(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


class Columns(dict[str, np.ndarray]):
    """A FileTable's columns by name; a released one cannot be read."""

    def __missing__(self, name: str) -> np.ndarray:
        if name in FILE_COLUMNS:
            raise ReleasedColumn(f"the catalog's {name} column was released once the shared index held it "
                                 "(FileTable.release_indexed): read it from the index, or before the release")
        raise KeyError(name)


class FileTable(Sequence[CatalogFile]):
    """The catalogued files as arrays, one entry per file (NOTE [catalog
    arrays]): the relative paths in one blob (`paths`, UTF-8 with surrogate
    escapes) cut by `offsets` (n + 1), the root and directory ids (`dir`: an
    index into Catalog.dirs, -1 when unknown) and one array per column of
    FILE_COLUMNS but the `released` ones (release_indexed).  ``table[i]``
    builds the CatalogFile of file i when asked."""

    def __init__(self, paths: np.ndarray, offsets: np.ndarray, root: np.ndarray, dir: np.ndarray,
                 columns: dict[str, np.ndarray], released: frozenset[str] = frozenset()):
        self.paths = np.ascontiguousarray(paths, np.uint8)
        self.offsets = np.ascontiguousarray(offsets, np.int64)
        n = len(self.offsets) - 1
        self.root = np.ascontiguousarray(root, np.int32)
        self.dir = np.ascontiguousarray(dir, np.int32)
        self.released = released
        self.columns = Columns({k: np.ascontiguousarray(columns[k], dt) for k, dt in FILE_COLUMNS.items()
                                if k not in released})
        if n < 0 or len(self.root) != n or len(self.dir) != n or any(len(c) != n for c in self.columns.values()):
            raise ValueError("the columns of a file table differ in length")

    # -- construction ------------------------------------------------------
    @classmethod
    def empty(cls) -> FileTable:
        return cls(np.zeros(0, np.uint8), np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32),
                   {k: np.zeros(0, dt) for k, dt in FILE_COLUMNS.items()})

    @classmethod
    def from_rows(cls, rels: Sequence[str], root: Iterable[int], dirs: Iterable[int],
                  columns: dict[str, Sequence[Any]]) -> FileTable:
        """From Python values (a scan's rows, CatalogFiles built by hand)."""
        data = [encode_rel(r) for r in rels]
        offsets = np.zeros(len(data) + 1, np.int64)
        np.cumsum([len(d) for d in data], out=offsets[1:])
        paths = np.frombuffer(b"".join(data), np.uint8).copy()
        n = len(data)
        return cls(paths, offsets, np.fromiter(root, np.int32, n), np.fromiter(dirs, np.int32, n),
                   {k: np.asarray(columns[k], dt) if n else np.zeros(0, dt) for k, dt in FILE_COLUMNS.items()})

    @classmethod
    def from_files(cls, files: Sequence[CatalogFile]) -> FileTable:
        return cls.from_rows([f.rel for f in files], (f.root for f in files), (-1 for _ in files),
                             {k: [getattr(f, k) for f in files] for k in FILE_COLUMNS})

    @classmethod
    def concat(cls, parts: Sequence[FileTable], roots: Sequence[int], dir_bases: Sequence[int]) -> FileTable:
        """The tables of several roots as one: part k gets root id roots[k]
        and its directory ids shifted by dir_bases[k]."""
        if not parts:
            return cls.empty()
        if len(parts) == 1 and dir_bases[0] == 0:
            # one root (the usual case): its arrays as they are, not a copy of
            # the whole table at the peak of the scan's memory
            p = parts[0]
            root = p.root if not p.root.any() and roots[0] == 0 else np.full(len(p), roots[0], np.int32)
            return cls(p.paths, p.offsets, root, p.dir, p.columns, p.released)
        sizes = np.cumsum([0] + [len(p.paths) for p in parts[:-1]])
        offsets = np.concatenate([parts[0].offsets[:1]] + [p.offsets[1:] + s for p, s in zip(parts, sizes)])
        root = np.concatenate([np.full(len(p), r, np.int32) for p, r in zip(parts, roots)])
        dirs = np.concatenate([np.where(p.dir >= 0, p.dir + b, -1) for p, b in zip(parts, dir_bases)])
        return cls(np.concatenate([p.paths for p in parts]), offsets, root, dirs,
                   {k: np.concatenate([p.columns[k] for p in parts]) for k in FILE_COLUMNS})

    def take(self, ids: np.ndarray) -> FileTable:
        """The files ids (in that order) as a table of their own."""
        ids = np.asarray(ids, np.int64)
        starts, lengths = self.offsets[ids], self.lengths()[ids]
        offsets = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return FileTable(self.paths[spans(starts, lengths)], offsets, self.root[ids], self.dir[ids],
                         {k: c[ids] for k, c in self.columns.items()}, self.released)

    def release_indexed(self) -> int:
        """Lets go of the columns only the shared index needs, the identity
        and the STAT_FIELDS, once the index holds them (NOTE [catalog
        arrays]); returns the bytes released.  Reading such a column from
        now on raises ReleasedColumn; the CatalogFile of one file says 0
        (unknown) for them, as one built without them does."""
        freed = sum(self.columns.pop(k).nbytes for k in INDEXED_ONLY if k in self.columns)
        self.released = self.released | frozenset(INDEXED_ONLY)
        return freed

    # -- columns ------------------------------------------------------------
    def __getattr__(self, name: str) -> np.ndarray:
        columns = self.__dict__.get("columns")
        if columns is not None and name in FILE_COLUMNS:
            return columns[name]
        raise AttributeError(name)

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def nbytes(self) -> int:
        return int(self.paths.nbytes + self.offsets.nbytes + self.root.nbytes + self.dir.nbytes
                   + sum(c.nbytes for c in self.columns.values()))

    def blob(self) -> bytes:
        """The paths as one bytes object (a copy: for slicing many at once)."""
        return self.paths.tobytes()

    def rel_bytes(self, i: int) -> bytes:
        return self.paths[int(self.offsets[i]):int(self.offsets[i + 1])].tobytes()

    def rel(self, i: int) -> str:
        return decode_rel(self.rel_bytes(i))

    def rels(self) -> list[str]:
        blob, o = self.blob(), self.offsets.tolist()
        return [decode_rel(blob[o[k]:o[k + 1]]) for k in range(len(self))]

    def terminated(self) -> bytearray:
        """Every path followed by a NUL byte, in one buffer (made in blocks of
        files: no temporary array as large as the blob)."""
        n = len(self)
        out = bytearray(len(self.paths) + n)
        view = np.frombuffer(out, np.uint8)
        for a in range(0, n, TERMINATE_BLOCK):
            b = min(n, a + TERMINATE_BLOCK)
            o = self.offsets[a:b + 1]
            part = view[o[0] + a:o[-1] + b]
            keep = np.ones(len(part), bool)
            keep[o[1:] - o[0] + np.arange(b - a)] = False       # where the NULs go
            part[keep] = self.paths[o[0]:o[-1]]
        return out

    # -- the Sequence of CatalogFile ------------------------------------------
    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> CatalogFile: ...
    @overload
    def __getitem__(self, i: slice) -> list[CatalogFile]: ...

    def __getitem__(self, i: int | slice) -> CatalogFile | list[CatalogFile]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        k = int(i)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"file {i} of {n}")
        c = self.columns
        known = {name: int(c[name][k]) for name in INDEXED_ONLY if name in c}
        return CatalogFile(int(self.root[k]), self.rel(k), int(c["size"][k]), int(c["mtime_ns"][k]),
                           link=bool(c["link"][k]), **known)

    def __iter__(self) -> Iterator[CatalogFile]:
        return (self[k] for k in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FileTable):
            return (len(self) == len(other) and self.released == other.released
                    and np.array_equal(self.offsets, other.offsets)
                    and np.array_equal(self.paths, other.paths) and np.array_equal(self.root, other.root)
                    and all(np.array_equal(c, other.columns[k]) for k, c in self.columns.items()))
        if isinstance(other, (list, tuple)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"FileTable({len(self)} files)"


def spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices of every element of the ranges [starts[k], starts[k] + lengths[k]), in order."""
    first = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts - first, lengths)


@dataclass
class Catalog:
    roots: list[str]                      # absolute, normalised data roots
    files: FileTable                      # also given as a list of CatalogFile (converted)
    dir_links: list[bool] = field(default_factory=list)  # per root: contains a symlinked dir
    dirs: list[CatalogDir] = field(default_factory=list)
    aliases: list[DirAlias] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (root, rel) not regular files
    from_cache: bool = False              # every root came from the scan cache
    cached: list[bool] = field(default_factory=list)  # per root: from the scan cache, not scanned now
    deferred: DeferredStats | None = None  # files known by name only, so far (NOTE [names first])

    def __post_init__(self) -> None:
        if not isinstance(self.files, FileTable):
            self.files = FileTable.from_files(list(self.files))

    @property
    def total_bytes(self) -> int:
        return int(self.files.size.sum())

    def source_path(self, f: FileRef) -> str:
        return os.path.join(self.roots[f.root], f.rel)


@dataclass
class DeferredStats:
    """Files a scan listed by name whose stat is still to take (NOTE [names
    first] in docs/design.md): per directory part its absolute path, the
    names (NUL-terminated) and their file ids; `pending` marks them per
    file, and `saves` are the cache writes that wait for their stats."""
    parts: list[tuple[str, bytes, np.ndarray]]
    pending: np.ndarray
    saves: list[Any] = field(default_factory=list)


@dataclass
class RootScan:
    """One root, before root ids are assigned (also what the cache holds):
    its files as a FileTable (root ids 0, directory ids into `dirs`)."""
    files: FileTable = field(default_factory=FileTable.empty)
    dirs: list[tuple[str, int, int, int]] = field(default_factory=list)    # rel, ino, dev, mtime_ns
    aliases: list[tuple[str, str]] = field(default_factory=list)           # rel, target rel
    skipped: list[str] = field(default_factory=list)
    links: bool = False
    errors: list[str] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)   # directories not listed: path, why
    scanned_ns: int = 0                                                    # wall clock at start
    deferred: list[tuple[str, bytes, np.ndarray]] = field(default_factory=list)   # DeferredStats.parts
