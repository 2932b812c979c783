"""The catalog: every regular file under the data roots, with size and mtime,
and the directories and directory aliases the scan saw."""
from __future__ import annotations

import os
from dataclasses import dataclass, field


class CatalogError(Exception):
    pass


class ScanError(CatalogError):
    pass


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
    cached: list[bool] = field(default_factory=list)  # per root: from the scan cache, not scanned now

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def source_path(self, f: CatalogFile) -> str:
        return os.path.join(self.roots[f.root], f.rel)


# One file of a RootScan: the fields of CatalogFile after root, in order.
FileRow = tuple[str, int, int, int, int, bool, int, int, int, int, int, int, int, int]
STAT_FIELDS = ("mode", "uid", "gid", "nlink", "atime_ns", "ctime_ns", "blocks", "blksize")


@dataclass
class RootScan:
    """One root, before root ids are assigned (also what the cache holds)."""
    # rel, size, mtime_ns, dev, ino, link, then mode, uid, gid, nlink, atime_ns, ctime_ns, blocks, blksize
    files: list[FileRow] = field(default_factory=list)
    dirs: list[tuple[str, int, int, int]] = field(default_factory=list)    # rel, ino, dev, mtime_ns
    aliases: list[tuple[str, str]] = field(default_factory=list)           # rel, target rel
    skipped: list[str] = field(default_factory=list)
    links: bool = False
    errors: list[str] = field(default_factory=list)
    scanned_ns: int = 0                                                    # wall clock at start
