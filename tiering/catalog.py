"""The catalog: every regular file under the data roots, with size and mtime.

The scan walks directories in parallel (a PFS answers many metadata requests
at once much faster than one after another) and never reads file contents.
Symlinked directories are followed once (a loop is walked only once); a root
that contains one is flagged, since the shim then cannot resolve ".." by text.
"""
from __future__ import annotations

import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class CatalogFile:
    root: int        # index into Catalog.roots
    rel: str         # path relative to the root, "/"-separated
    size: int
    mtime_ns: int


@dataclass
class Catalog:
    roots: list[str]                      # absolute, normalised data roots
    files: list[CatalogFile]
    dir_links: list[bool] = field(default_factory=list)  # per root: contains a symlinked dir

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def source_path(self, f: CatalogFile) -> str:
        return os.path.join(self.roots[f.root], f.rel)


class ScanError(Exception):
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


def _walk_root(root_id: int, root: str, pool: ThreadPoolExecutor) -> tuple[list[CatalogFile], bool]:
    files: list[CatalogFile] = []
    seen: set[tuple[int, int]] = set()
    lock = threading.Lock()
    links = [False]
    st = os.stat(root)
    seen.add((st.st_dev, st.st_ino))
    pending = [pool.submit(_scan_dir, root, "")]
    errors: list[str] = []
    while pending:
        fut = pending.pop()
        try:
            entries = fut.result()
        except OSError as e:
            errors.append(str(e))
            continue
        for rel, s, is_link in entries:
            if stat.S_ISDIR(s.st_mode):
                with lock:
                    key = (s.st_dev, s.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                if is_link:
                    links[0] = True
                pending.append(pool.submit(_scan_dir, os.path.join(root, rel), rel))
            elif stat.S_ISREG(s.st_mode):
                files.append(CatalogFile(root_id, rel, s.st_size, s.st_mtime_ns))
    if errors and not files:
        raise ScanError(f"cannot scan {root}: {errors[0]}")
    return files, links[0]


def _scan_dir(path: str, rel: str) -> list[tuple[str, os.stat_result, bool]]:
    out = []
    with os.scandir(path) as it:
        for e in it:
            try:
                s = e.stat(follow_symlinks=True)
            except OSError:
                continue  # dangling link or vanished file: not part of the data set
            out.append((f"{rel}/{e.name}" if rel else e.name, s, e.is_symlink()))
    return out


def scan(dirs: list[str], threads: int = 16) -> Catalog:
    roots = normalise_roots(dirs)
    files: list[CatalogFile] = []
    links: list[bool] = []
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="tiering-scan") as pool:
        for i, r in enumerate(roots):
            f, has_links = _walk_root(i, r, pool)
            files.extend(f)
            links.append(has_links)
    files.sort(key=lambda f: (f.root, f.rel))
    return Catalog(roots, files, links)
