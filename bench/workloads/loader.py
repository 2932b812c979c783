"""Benchmark workload: a PyTorch DataLoader over every file of a data set
(shuffled, seeded, num_workers, batch size), with a fixed compute time per
batch, or the same order read by a plain Python loop.

    python -m bench.workloads.loader --data DIR --epochs 3 --out FILE.json
        [--mode dataloader|plain] [--workers 2] [--batch-size 32] [--compute-ms 0]
        [--seed 0] [--pfs-stats FILE] [--tier NAME=PATH ...]

Per epoch it reports seconds, samples/s, the opens served by each tier (from
where each descriptor really points: /proc/self/fd) and, with --pfs-stats,
the emulated PFS's operations during the epoch.  The checksum does not
depend on the order: sha256 over the sorted (path, sha256 of content) pairs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler


def list_files(root: str) -> list[str]:
    out: list[str] = []
    for d, dirs, files in os.walk(root, followlinks=True):
        dirs.sort()
        out.extend(os.path.join(d, f) for f in sorted(files) if not f.startswith("."))
    return sorted(out)


class Files(Dataset):
    """Exposes `samples` like ImageFolder, so the tiering hook can map indices to files."""

    def __init__(self, root: str, tiers: dict[str, str]):
        self.samples = [(p, 0) for p in list_files(root)]
        self.tiers = tiers

    def __len__(self) -> int:
        return len(self.samples)

    def where(self, fd: int) -> str:
        target = os.readlink(f"/proc/self/fd/{fd}")
        for name, prefix in self.tiers.items():
            if target.startswith(prefix):
                return name
        return "pfs"

    def __getitem__(self, i: int) -> tuple[int, str, str, int]:
        with open(self.samples[i][0], "rb") as f:
            data = f.read()
            where = self.where(f.fileno())
        return i, hashlib.sha256(data).hexdigest(), where, len(data)


def collate(batch: list) -> list:
    return batch


def pfs_snapshot(stats_file: str | None) -> dict[str, int]:
    if not stats_file:
        return {}
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.slowfs import read_stats
    return read_stats(Path(stats_file), fresh=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--mode", choices=["dataloader", "plain"], default="dataloader")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--compute-ms", type=float, default=0.0, help="compute time per batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pfs-stats")
    p.add_argument("--tier", action="append", default=[], metavar="NAME=PATH")
    a = p.parse_args(argv)
    tiers = dict(t.split("=", 1) for t in a.tier)
    ds = Files(os.path.abspath(a.data), tiers)
    g = torch.Generator().manual_seed(a.seed)
    loader = DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers, generator=g,
                        collate_fn=collate, persistent_workers=False) if a.mode == "dataloader" else None
    digests: dict[int, str] = {}
    epochs = []
    for epoch in range(a.epochs):
        before = pfs_snapshot(a.pfs_stats)
        t0 = time.perf_counter()
        by_where: dict[str, int] = {}
        nbytes = 0
        batches: Iterator[Any]
        if loader is not None:
            batches = iter(loader)
        else:
            order = list(RandomSampler(ds, generator=g))
            batches = (
                [ds[i] for i in order[k:k + a.batch_size]] for k in range(0, len(order), a.batch_size))
        for batch in batches:
            for i, digest, where, n in batch:
                if digests.setdefault(i, digest) != digest:
                    print(f"loader: {ds.samples[i][0]} changed between epochs", file=sys.stderr)
                    return 3
                by_where[where] = by_where.get(where, 0) + 1
                nbytes += n
            if a.compute_ms:
                time.sleep(a.compute_ms / 1000)
        seconds = time.perf_counter() - t0
        after = pfs_snapshot(a.pfs_stats)
        epochs.append({
            "seconds": round(seconds, 4),
            "samples_per_s": round(len(ds) / seconds, 1),
            "bytes": nbytes,
            "pfs_opens": after.get("opens", 0) - before.get("opens", 0),
            "pfs_bytes": after.get("bytes", 0) - before.get("bytes", 0),
            "pfs_meta_ops": after.get("meta_ops", 0) - before.get("meta_ops", 0),
            "opens_by_tier": by_where,
        })
        print(f"epoch {epoch + 1}: {seconds:.2f} s, {by_where}", file=sys.stderr, flush=True)
    h = hashlib.sha256()
    for i in sorted(digests):
        h.update(f"{os.path.relpath(ds.samples[i][0], a.data)}\0{digests[i]}\n".encode())
    Path(a.out).write_text(json.dumps({"files": len(ds), "checksum": h.hexdigest(), "epochs": epochs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
