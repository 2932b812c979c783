"""Test workload: read every file of a tree once per epoch, in shuffled order, and check
that every epoch sees the same bytes.

    python tests/workloads/reader.py --data DIR --epochs 3 [--workers 2]
        [--mp-context fork|spawn|forkserver] [--seed 0] [--batch-size 8]
        [--mode dataloader|plain] [--out FILE.json] [--epoch-pause S] [--sample-delay S] [--head N]

* Files: every regular file under DIR (symlinks followed), skipping names that start
  with "." (files and directories), in sorted order of their path relative to DIR.
* Each read is Python's ``open(path, "rb")`` + ``read()``, in a Dataset's __getitem__;
  with --head N, ``open(path, "rb", buffering=0)`` + one ``read(N)``: the first N bytes
  only (their checksum is the one kept).
* dataloader mode: torch DataLoader(shuffle=True, generator seeded with --seed,
  num_workers, multiprocessing_context). plain mode: the same order in-process, without
  DataLoader: per epoch one int64 draw from the generator (the DataLoader iterator's base
  seed) then a RandomSampler on that generator, so both modes read in the same order
  (checked against torch 2.13's DataLoader; see order_sha256).
* Output JSON: {"files": N, "epochs": [{"opens", "bytes", "seconds", "order_sha256", "local",
  "local_files"}],
  "sha256": {relpath: hex}, "digest": hex}; digest = sha256 over the sorted pairs,
  each encoded as relpath + "\\0" + hex + "\\n" (UTF-8). order_sha256 hashes the
  relpaths in the order they were delivered (same encoding, relpath + "\\n"). "local"
  counts the opens whose descriptor points outside the data root (a tier copy, as
  /proc/self/fd shows) and "local_files" lists them.
* Exit status: 0; 3 if a file's checksum differs between epochs (or a file was not
  read exactly once in an epoch); 2 for bad arguments or an empty tree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler


def list_files(root: str) -> list[str]:
    """Relative paths of the regular files under root, sorted; dot names skipped."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith("."):
                continue
            path = os.path.join(dirpath, name)
            if os.path.isfile(path):
                found.append(os.path.relpath(path, root))
    return sorted(found)


class FileDataset(Dataset):
    def __init__(self, root: str, relpaths: list[str], head: int = 0) -> None:
        self.root = root
        self.head = head
        self.real_root = os.path.realpath(root)
        self.relpaths = relpaths
        self.files = [os.path.join(root, r) for r in relpaths]  # what the order hook maps indices with

    def __len__(self) -> int:
        return len(self.relpaths)

    def __getitem__(self, index: int) -> tuple[int, int, str, bool]:
        path = os.path.join(self.root, self.relpaths[index])
        with (open(path, "rb", buffering=0) if self.head else open(path, "rb")) as f:
            data = f.read(self.head) if self.head else f.read()
            # where the descriptor really points: under the data root, or a local copy
            local = not os.readlink(f"/proc/self/fd/{f.fileno()}").startswith(self.real_root + "/")
        return index, len(data), hashlib.sha256(data).hexdigest(), local


def collate(batch: list[tuple[int, int, str, bool]]) -> list[tuple[int, int, str, bool]]:
    return batch


def digest_of(sha: dict[str, str]) -> str:
    h = hashlib.sha256()
    for rel, hexd in sorted(sha.items()):
        h.update(f"{rel}\0{hexd}\n".encode())
    return h.hexdigest()


def epoch_items(args: argparse.Namespace, dataset: FileDataset,
                generator: torch.Generator,
                loader: DataLoader | None) -> Iterator[tuple[int, int, str, bool]]:
    if loader is not None:
        for batch in loader:
            yield from batch
        return
    # plain: the draws DataLoader(shuffle=True, generator=g) makes, without the loader:
    # its iterator's base seed, then a RandomSampler run to exhaustion (which draws one
    # more, unused, permutation at its end).
    torch.empty((), dtype=torch.int64).random_(generator=generator)
    for i in RandomSampler(dataset, generator=generator):
        yield dataset[i]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="read every file once per epoch, shuffled")
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--mp-context", choices=["fork", "spawn", "forkserver"], default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--mode", choices=["dataloader", "plain"], default="dataloader")
    p.add_argument("--out", help="write the JSON result here (default: stdout only summary)")
    p.add_argument("--sample-delay", type=float, default=0.0,
                   help="seconds of 'compute' per sample in the main process")
    p.add_argument("--epoch-pause", type=float, default=0.0,
                   help="seconds to sleep after each epoch (a validation phase)")
    p.add_argument("--head", type=int, default=0, help="read only the first N bytes of each file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = os.path.abspath(args.data)
    if not os.path.isdir(root):
        print(f"reader: {args.data} is not a directory", file=sys.stderr)
        return 2
    relpaths = list_files(root)
    if not relpaths:
        print(f"reader: no files under {args.data}", file=sys.stderr)
        return 2
    dataset = FileDataset(root, relpaths, args.head)
    generator = torch.Generator()
    generator.manual_seed(args.seed)
    loader = None
    if args.mode == "dataloader":
        kwargs: dict[str, Any] = {}
        if args.workers > 0 and args.mp_context:
            kwargs["multiprocessing_context"] = args.mp_context
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                            num_workers=args.workers, generator=generator,
                            collate_fn=collate, **kwargs)

    sha: dict[str, str] = {}
    epochs: list[dict[str, Any]] = []
    status = 0
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        opens = nbytes = 0
        seen = [0] * len(relpaths)
        order = hashlib.sha256()
        local_files: list[str] = []
        for index, length, hexd, local in epoch_items(args, dataset, generator, loader):
            rel = relpaths[index]
            if local:
                local_files.append(rel)
            if args.sample_delay:
                time.sleep(args.sample_delay)
            opens += 1
            nbytes += length
            seen[index] += 1
            order.update(f"{rel}\n".encode())
            old = sha.setdefault(rel, hexd)
            if old != hexd:
                print(f"reader: {rel}: checksum changed in epoch {epoch + 1}: "
                      f"{old} -> {hexd}", file=sys.stderr)
                status = 3
        dt = time.perf_counter() - t0
        bad = [relpaths[i] for i, n in enumerate(seen) if n != 1]
        if bad:
            print(f"reader: epoch {epoch + 1}: {len(bad)} files not read exactly once, "
                  f"e.g. {bad[0]}", file=sys.stderr)
            status = 3
        epochs.append({"opens": opens, "bytes": nbytes, "seconds": round(dt, 6),
                       "order_sha256": order.hexdigest(), "local": len(local_files),
                       "local_files": sorted(local_files)})
        print(f"reader: epoch {epoch + 1}/{args.epochs}: {opens} opens, {nbytes} bytes, "
              f"{dt:.3f} s", flush=True)
        time.sleep(args.epoch_pause)

    result = {"files": len(relpaths), "epochs": epochs, "sha256": sha,
              "digest": digest_of(sha)}
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, args.out)
    print(f"reader: {len(relpaths)} files, digest {result['digest']}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
