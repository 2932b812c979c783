"""A data-parallel training across nodes (torchrun, gloo): every rank reads
its DistributedSampler share of a directory of files each epoch, and the
model's gradients are averaged across ranks at every step.

    torchrun --nnodes N --node-rank R --nproc-per-node K ... train_ddp.py \
        --data DIR --out-dir DIR [--epochs E] [--batch-size B] [--seed S] [--step-ms MS]

At the start of each epoch a rank makes the empty file OUT_DIR/epoch<e>-rank<r>
(e from 0): a test can act at that point.

Each rank writes OUT_DIR/rank-<r>.json: {"rank", "world", "epochs": [{"samples",
"digest" (sha256 of every sample's index and bytes, in the order read),
"start", "end" (time.time())}], "weights" (sha256 of the final state dict)}.
Without torchrun's variables (WORLD_SIZE unset) it runs as one rank."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Files(Dataset):
    """Every file under root (sorted paths), as its index and its bytes."""

    def __init__(self, root: str):
        self.paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, bytes]:
        with open(self.paths[i], "rb") as f:
            return i, f.read()


def features(i: int, data: bytes) -> list[float]:
    return [len(data) % 97 / 97.0, (data[0] if data else 0) / 255.0, (data[-1] if data else 0) / 255.0, i % 13 / 13.0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--step-ms", type=float, default=0.0, help="compute time per step (a sleep)")
    a = p.parse_args()
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(1234)
    ds = Files(a.data)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
    loader = DataLoader(ds, batch_size=a.batch_size, sampler=sampler, collate_fn=list)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    epochs = []
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        h, n, start = hashlib.sha256(), 0, time.time()
        open(os.path.join(a.out_dir, f"epoch{epoch}-rank{rank}"), "w").close()
        for batch in loader:
            for i, data in batch:
                h.update(f"{i}\0{len(data)}\0".encode() + data)
                n += 1
            x = torch.tensor([features(i, d) for i, d in batch])
            loss = ddp(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if a.step_ms:
                time.sleep(a.step_ms / 1000)
        epochs.append({"samples": n, "digest": h.hexdigest(), "start": start, "end": time.time()})
    w = hashlib.sha256()
    for t in model.state_dict().values():
        w.update(t.numpy().tobytes())
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    with open(os.path.join(a.out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "epochs": epochs, "weights": w.hexdigest()}, f)


if __name__ == "__main__":
    main()
