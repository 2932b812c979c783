"""The generated data: the C helper (scaletool.c), the ImageNet-shaped tree,
the large files, and the file lists the readers follow.

The tree is cached between runs: ``<work>/tree-<N>`` is reused when its
marker ``<work>/tree-<N>.json`` (written last, outside the tree so that the
catalog does not see it) has the same parameters.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).resolve().parent / "scaletool.c"
CLASSES = 1000


def build_tool(work: Path) -> Path:
    """scaletool compiled into the work directory (again when the source is newer)."""
    out = work / "scaletool"
    if out.exists() and out.stat().st_mtime >= SOURCE.stat().st_mtime:
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SystemExit("bench.scale: a C compiler (cc or gcc) is needed")
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-pthread", "-o", str(out), str(SOURCE), "-ldl"], check=True)
    return out


@dataclass(frozen=True)
class Tree:
    root: Path
    files: int
    classes: int
    size: int
    seed: int

    @property
    def bytes(self) -> int:
        return self.files * self.size

    def class_starts(self) -> np.ndarray:
        """Index of each class's first file (ImageNet's spread: the first
        files % classes classes hold one more), and files at the end."""
        c = np.arange(self.classes + 1, dtype=np.int64)
        base, extra = divmod(self.files, self.classes)
        return c * base + np.minimum(c, extra)

    def rel_paths(self, indices: np.ndarray | list[int]) -> list[str]:
        """Data-set index -> path relative to the root (ImageFolder order)."""
        idx = np.asarray(indices, dtype=np.int64)
        cls = np.searchsorted(self.class_starts(), idx, side="right") - 1
        return [f"n{c:08d}/n{c:08d}_{i:07d}.JPEG" for c, i in zip(cls.tolist(), idx.tolist())]


def make_tree(tool: Path, work: Path, files: int, size: int, seed: int, classes: int = CLASSES) -> tuple[Tree, float]:
    """The tree of `files` files (generated, or the cached one); seconds spent generating."""
    tree = Tree(work / f"tree-{files}", files, classes, size, seed)
    marker = work / f"tree-{files}.json"
    want = {k: v for k, v in asdict(tree).items() if k != "root"}
    if marker.exists() and tree.root.is_dir() and json.loads(marker.read_text()) == want:
        return tree, 0.0
    marker.unlink(missing_ok=True)
    t0 = time.monotonic()
    subprocess.run([str(tool), "tree", str(tree.root), str(files), str(classes), str(size), str(seed),
                    str(max(2, os.cpu_count() or 2))], check=True)
    marker.write_text(json.dumps(want) + "\n")
    return tree, time.monotonic() - t0


def make_large(tool: Path, work: Path, count: int, size: int, seed: int) -> Path:
    """`count` files of `size` bytes of real (not sparse) pseudo-random data."""
    root = work / f"large-{count}x{size}"
    subprocess.run([str(tool), "large", str(root), str(count), str(size), str(seed)], check=True)
    return root


def write_lines(path: Path, lines: Iterable[str]) -> Path:
    with path.open("w") as f:
        for line in lines:
            f.write(line + "\n")
    return path


@dataclass(frozen=True)
class SamplerCase:
    """One of the two orders of the benchmark, as tier-run's options and as the
    training would produce it with torch itself."""
    name: str                 # random | distributed
    seed: int = 0
    world_size: int = 8
    rank: int = 0

    def tier_run_args(self, epochs: int) -> list[str]:
        args = ["--sampler", self.name, "--seed", str(self.seed), "--epochs", str(epochs)]
        if self.name == "distributed":
            args += ["--world-size", str(self.world_size), "--rank", str(self.rank), "--local-world-size", "1"]
        return args

    def orders(self, n: int, epochs: int) -> list[list[int]]:
        """The indices the training reads in its first `epochs` epochs:
        DataLoader(shuffle=True, generator=manual_seed(seed)), or
        DistributedSampler(seed, rank of world_size) with set_epoch(e)."""
        import torch
        from torch.utils.data import DataLoader, DistributedSampler
        if self.name == "random":
            g = torch.Generator()
            g.manual_seed(self.seed)
            loader: DataLoader[int] = DataLoader(range(n), batch_size=8192, shuffle=True,  # type: ignore[arg-type]
                                                 generator=g)
            return [torch.cat(list(loader)).tolist() for _ in range(epochs)]
        sampler: DistributedSampler[int] = DistributedSampler(
            range(n), num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=self.seed)  # type: ignore[arg-type]
        out = []
        for e in range(epochs):
            sampler.set_epoch(e)
            out.append(list(sampler))
        return out


def order_lists(tree: Tree, case: SamplerCase, epochs: int, run: Path,
                more: int = 0) -> tuple[Path, Path, int, int]:
    """The reader's list (absolute paths of `epochs` epochs in order, then of
    `more` epochs), the wait list (every file of it once, relative, in order
    of first use), the length of the first `epochs` epochs and of the list."""
    orders = case.orders(tree.files, epochs + more)
    flat = [p for o in orders for p in tree.rel_paths(o)]
    first = sum(len(o) for o in orders[:epochs])
    read_list = write_lines(run / "order.txt", (f"{tree.root}/{p}" for p in flat))
    return read_list, write_lines(run / "wait.txt", dict.fromkeys(flat)), first, len(flat)


def catalog_lists(tree: Tree, run: Path) -> tuple[Path, Path]:
    """Every file in catalog (ImageFolder) order: absolute, and relative."""
    rels = tree.rel_paths(np.arange(tree.files))
    return (write_lines(run / "all.txt", (f"{tree.root}/{p}" for p in rels)), write_lines(run / "rels.txt", rels))
