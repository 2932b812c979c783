"""Data-set order
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

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..units import some_of
from .model import Catalog, CatalogError, FileTable
from .roots import RootMap, join

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif",
                                   ".tiff", ".webp")
LAYOUTS = ("imagefolder", "datasetfolder", "sorted", "manifest")


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
    """The directory tree of one root as the catalog saw it: the files of each
    directory as an array of catalog ids in name order (from the scan's
    directory ids; NOTE [catalog arrays] in docs/design.md)."""

    def __init__(self, catalog: Catalog, root: int):
        self.table = catalog.files
        self.ids: dict[str, np.ndarray] = _files_by_dir(catalog, root)   # dir rel -> ids in name order
        self._names: dict[str, dict[str, int]] = {}      # dir rel -> name -> catalog id (made when asked)
        self.skipped: dict[str, set[str]] = {}           # dir rel -> names not catalogued
        self.subdirs: dict[str, dict[str, str]] = {}     # dir rel -> name -> catalogued dir rel
        for r, rel in catalog.skipped:
            if r == root:
                parent, _, name = rel.rpartition("/")
                self.skipped.setdefault(parent, set()).add(name)
        dirs = [d.rel for d in catalog.dirs if d.root == root]
        if not dirs:   # a catalog built by hand: directories from the files' parents
            found = {""}
            for parent in self.ids:
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

    def files(self, rel: str) -> dict[str, int]:
        """name -> catalog id of the files of directory rel."""
        got = self._names.get(rel)
        if got is None:
            ids = self.ids.get(rel, _NONE).tolist()
            got = self._names[rel] = {self.table.rel(k).rpartition("/")[2]: k for k in ids}
        return got

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
        return None if d is None else self.files(d).get(name)

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
                stack.append((join(v, name), target, ancestors + (target,)))
        return out

    def names(self, crel: str) -> list[str]:
        """What os.walk lists as file names: everything but directories."""
        other = self.skipped.get(crel)
        files = self.files(crel)
        return sorted(files.keys() | other if other else files)


_NONE = np.zeros(0, np.int64)


def _files_by_dir(catalog: Catalog, root: int) -> dict[str, np.ndarray]:
    """dir rel -> catalog ids of the root's files in it, in name order."""
    t = catalog.files
    sel = np.flatnonzero(t.root == root)
    if not len(sel):
        return {}
    dirs = t.dir[sel]
    if dirs.min() >= 0:     # from the scan: sorted by path, so by name within a directory
        order = np.argsort(dirs, kind="stable")
        ids, dirs = sel[order], dirs[order]
        cuts = np.flatnonzero(np.diff(dirs)) + 1
        return {catalog.dirs[int(dirs[c])].rel: chunk for c, chunk in zip(np.r_[0, cuts], np.split(ids, cuts))}
    groups: dict[str, list[tuple[str, int]]] = {}    # a catalog built by hand
    for k in sel.tolist():
        parent, _, name = t.rel(k).rpartition("/")
        groups.setdefault(parent, []).append((name, k))
    return {p: np.asarray([k for _, k in sorted(v)], np.int64) for p, v in groups.items()}


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
    where = RootMap(catalog.roots).split(path)
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
        t = catalog.files
        return [(dpath + "/" + t.rel(k).rpartition("/")[2], k)
                for dpath, ids in _folder_parts(catalog, layout) for k in ids.tolist()]
    if layout.kind == "sorted":
        exts = tuple(layout.extensions) if layout.extensions is not None else None
        paths = [(catalog.source_path(f), k) for k, f in enumerate(catalog.files)
                 if exts is None or f.rel.rpartition("/")[2].lower().endswith(exts)]
        paths.sort()
        return paths
    if layout.kind == "manifest":
        return _manifest_samples(catalog, layout)
    raise CatalogError(f"unknown layout {layout.kind!r}: use one of {', '.join(LAYOUTS)}")


def dataset_ids(catalog: Catalog, layout: Layout) -> np.ndarray:
    """Position i of the data set -> index into catalog.files of the file
    sample i reads (module doc), as an int64 array; for ImageFolder without a
    Python step per file."""
    if layout.kind in ("imagefolder", "datasetfolder"):
        parts = [ids for _, ids in _folder_parts(catalog, layout)]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    return np.asarray([k for _, k in dataset_samples(catalog, layout)], np.int64)


def dataset_order(catalog: Catalog, layout: Layout) -> list[int]:
    """dataset_ids as a list."""
    return dataset_ids(catalog, layout).tolist()


def _folder_parts(catalog: Catalog, layout: Layout) -> list[tuple[str, np.ndarray]]:
    """(directory as the training code names it, catalog ids of its samples
    in order) of every directory ImageFolder lists, in its order."""
    exts = _extensions(layout)
    root_id, base, where = _layout_root(catalog, layout)
    tree = _Tree(catalog, root_id)
    classes = sorted(tree.subdirs.get(base, {}))
    if not classes:
        raise CatalogError(f"Couldn't find any class folder in {where}: --layout {layout.kind} "
                           "expects root/<class>/.../<file>")
    prefix = where.rstrip("/") + "/"
    listed: list[tuple[str, str, str, np.ndarray | None]] = []   # class, its directory, rel, files
    for cls in classes:
        crel = tree.subdir(base, cls)
        assert crel is not None
        for vrel, drel in sorted(tree.walk(cls, crel, where)):
            listed.append((cls, prefix + vrel, drel, None if drel in tree.skipped else tree.ids.get(drel, _NONE)))
    # the names of every directory the catalog saw whole are matched at once
    whole = [ids for *_, ids in listed if ids is not None]
    ok = _NameMatch(catalog.files, exts)(np.concatenate(whole)) if whole else np.zeros(0, bool)
    parts: list[tuple[str, np.ndarray]] = []
    counts: dict[str, int] = dict.fromkeys(classes, 0)
    at = 0
    for cls, dpath, drel, ids in listed:
        if ids is None:
            ids = _listed_samples(tree, drel, dpath, exts)
        else:
            ids, at = ids[ok[at:at + len(ids)]], at + len(ids)
        parts.append((dpath, ids))
        counts[cls] += len(ids)
    empty = [cls for cls in classes if not counts[cls]]
    if empty and not layout.allow_empty:
        raise CatalogError(
            f"Found no valid file for the classes {some_of(empty)} in {where}. Supported "
            f"extensions are: {', '.join(exts)} (compared with the lower-cased file name). "
            "torchvision raises FileNotFoundError here; remove the empty class folders or use "
            "allow_empty")
    return parts


def _listed_samples(tree: _Tree, drel: str, dpath: str, exts: tuple[str, ...]) -> np.ndarray:
    """The samples of a directory that also holds entries the catalog skipped
    (one of which ImageFolder would list is an error)."""
    ids = tree.files(drel)
    out: list[int] = []
    for name in tree.names(drel):
        if not name.lower().endswith(exts):
            continue
        if name not in ids:
            raise CatalogError(
                f"{dpath}/{name} is not a regular file (a dangling symlink, a fifo or socket, or it "
                f"cannot be stat'ed), but ImageFolder would list it as a sample by its name; "
                "remove it or give the order as --layout manifest")
        out.append(ids[name])
    return np.asarray(out, np.int64)


_LOWER = np.arange(256, dtype=np.uint8)
_LOWER[ord("A"):ord("Z") + 1] += 32


class _NameMatch:
    """Whether ``name.lower().endswith(exts)`` for catalog files, on the path
    blob: ASCII names at once, others (whose lower() may change the length)
    one by one in Python."""

    def __init__(self, table: FileTable, exts: tuple[str, ...]):
        self.t = table
        self.exts = exts
        self.ascii = all(e.isascii() for e in exts)
        starts = table.offsets[:-1]
        if len(table) and table.lengths().min() > 0:       # a path with a non-ASCII byte
            self.other = np.maximum.reduceat(table.paths, starts) >= 128
        else:
            self.other = np.ones(len(table), bool)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        t = self.t
        if not self.ascii or not len(ids):
            return np.fromiter((t.rel(k).rpartition("/")[2].lower().endswith(self.exts) for k in ids.tolist()),
                               bool, len(ids))
        ends = t.offsets[ids + 1]
        lengths = ends - t.offsets[ids]
        exts = [e.encode("ascii") for e in self.exts if "/" not in e]   # no name ends with a "/"
        # the last (up to) 8 bytes of each path, lower-cased, in one word:
        # byte j from the end at bits 8j; 0 before the path's start (no
        # extension byte is 0)
        width = min(8, max((len(e) for e in exts), default=0))
        tail = np.zeros(len(ids), np.uint64)
        for j in range(width):
            there = lengths > j
            byte = _LOWER[t.paths[np.where(there, ends - 1 - j, 0)]]
            tail |= np.where(there, byte, 0).astype(np.uint64) << np.uint64(8 * j)
        out = np.zeros(len(ids), bool)
        for eb in exts:
            if len(eb) <= width:
                word = sum(c << (8 * j) for j, c in enumerate(reversed(eb)))
                out |= (tail & np.uint64((1 << (8 * len(eb))) - 1)) == np.uint64(word)
                continue
            ok = lengths >= len(eb)            # longer than a word: byte by byte
            for j, c in enumerate(eb):
                ok &= _LOWER[t.paths[np.where(ok, ends - len(eb) + j, 0)]] == c
            out |= ok
        slow = np.flatnonzero(self.other[ids])
        for k in slow.tolist():
            out[k] = t.rel(int(ids[k])).rpartition("/")[2].lower().endswith(self.exts)
        return out


def _read_manifest(path: Path) -> list[tuple[int, str]]:
    """(line or item number, path) of every entry."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CatalogError(f"cannot read the manifest {path}: {e}") from None
    if path.suffix.lower() == ".json":
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise CatalogError(f"manifest {path}: not valid JSON ({str(e)[:200]})") from None
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
    roots = RootMap(catalog.roots)
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
