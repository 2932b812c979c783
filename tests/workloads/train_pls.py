"""A training loop over tiering's PartialLocalShuffleSampler, as a script
that swapped DistributedSampler for it would run: its rank and world size
come from the environment (WORLD_SIZE, RANK), set_epoch(e) before each epoch.

    train_pls.py --data DIR --out FILE.json [--fraction Q] [--seed S] [--epochs E]
                 [--batch-size B] [--workers N] [--partition contiguous|random] [--resume-at E0]
                 [--epoch-pause S]

Each epoch reads every index of the rank's share through a DataLoader (the
file's bytes).  Writes {"rank", "world", "epochs": [{"indices": [...] in
read order, "local": opens served from a tier copy}]}; with --resume-at E0 a
fresh sampler is made for epochs E0.. (a restart from a checkpoint); with
--epoch-pause S it sleeps S seconds after each epoch (a validation phase)."""
from __future__ import annotations

import argparse
import json
import os
import time

from torch.utils.data import DataLoader, Dataset

from tiering.samplers import PartialLocalShuffleSampler


class Files(Dataset):
    """Every file under root (sorted paths): its index and whether the open went to a tier copy."""

    def __init__(self, root: str):
        self.root = os.path.realpath(root)
        self.files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[int, bool]:
        with open(self.files[i], "rb") as f:
            f.read()
            local = not os.readlink(f"/proc/self/fd/{f.fileno()}").startswith(self.root + "/")
        return i, local


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--fraction", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--partition", default="contiguous")
    p.add_argument("--resume-at", type=int, default=None)
    p.add_argument("--epoch-pause", type=float, default=0.0)
    a = p.parse_args()
    ds = Files(a.data)

    def sampler() -> PartialLocalShuffleSampler:
        return PartialLocalShuffleSampler(ds, fraction=a.fraction, seed=a.seed, partition=a.partition)

    s = sampler()
    loader = DataLoader(ds, sampler=s, batch_size=a.batch_size, num_workers=a.workers, collate_fn=list)
    epochs = []
    for epoch in range(a.epochs):
        if epoch == a.resume_at:
            s = sampler()
            loader = DataLoader(ds, sampler=s, batch_size=a.batch_size, num_workers=a.workers, collate_fn=list)
        s.set_epoch(epoch)
        read = [item for batch in loader for item in batch]
        epochs.append({"indices": [i for i, _ in read], "local": sum(local for _, local in read)})
        time.sleep(a.epoch_pause)
    with open(a.out, "w") as f:
        json.dump({"rank": s.rank, "world": s.num_replicas, "epochs": epochs}, f)


if __name__ == "__main__":
    main()
