"""The one mapping of paths onto data roots.

A data root is matched by its path as given (normalised) and, when that
path goes through a symbolic link, by its real path too: both name the same
root id.  The shim matches the same prefixes (the index lists them), the
layouts and the order feeds split paths with `RootMap.split`, and
`PathIndex` turns an absolute path into the catalog id of its file.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from .model import encode_rel

if TYPE_CHECKING:
    from .model import Catalog


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


class RootMap:
    """Absolute paths -> (root id, path relative to that root)."""

    def __init__(self, roots: list[str]):
        # per root: its path, then its real path when that differs (an alias)
        self.prefixes: list[tuple[str, int]] = []
        for i, r in enumerate(roots):
            for prefix in dict.fromkeys((r, os.path.realpath(r))):
                self.prefixes.append((prefix, i))
        self._longest_first = sorted(((p.rstrip("/"), i) for p, i in self.prefixes), key=lambda x: -len(x[0]))

    def split(self, path: str) -> tuple[int, str] | None:
        p = os.path.normpath(path)
        for prefix, i in self._longest_first:
            if p == prefix or (prefix == "" and p == "/"):
                return i, ""
            if p.startswith(prefix + "/"):
                return i, p[len(prefix) + 1:]
        return None


class PathIndex:
    """Absolute paths -> catalog file ids (-1: not a catalogued file): the
    catalog's (root, path) hashes sorted once, found by binary search and
    checked against the path itself (NOTE [catalog arrays] in docs/design.md)."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.roots = RootMap(catalog.roots)
        self._hashes: np.ndarray | None = None
        self._ids: np.ndarray | None = None

    def _build(self) -> tuple[np.ndarray, np.ndarray]:
        t = self.catalog.files
        blob, o, r = t.blob(), t.offsets.tolist(), t.root.tolist()
        h = np.fromiter((hash((r[k], blob[o[k]:o[k + 1]])) for k in range(len(t))), np.int64, len(t))
        ids = np.argsort(h, kind="stable")
        self._hashes, self._ids = h[ids], ids
        return self._hashes, self._ids

    def id_of(self, path: str) -> int:
        where = self.roots.split(path)
        if where is None:
            return -1
        hashes, ids = (self._hashes, self._ids) if self._hashes is not None and self._ids is not None \
            else self._build()
        root, rel = where[0], encode_rel(where[1])
        h = hash((root, rel))
        t = self.catalog.files
        # one search (the array's method: no wrapper), then the run of equal hashes from there
        at, n = int(hashes.searchsorted(h)), len(hashes)
        while at < n and hashes[at] == h:
            k = int(ids[at])
            if t.root[k] == root and t.rel_bytes(k) == rel:
                return k
            at += 1
        return -1
