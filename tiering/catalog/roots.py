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
    """Absolute paths -> catalog file ids (-1: not a catalogued file)."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.roots = RootMap(catalog.roots)
        self._ids: dict[tuple[int, str], int] | None = None

    def id_of(self, path: str) -> int:
        where = self.roots.split(path)
        if where is None:
            return -1
        if self._ids is None:
            self._ids = {(f.root, f.rel): k for k, f in enumerate(self.catalog.files)}
        return self._ids.get(where, -1)
