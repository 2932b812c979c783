"""A small training loop whose result depends on every random number drawn:
the batches, dropout (global RNG) and the weights after a few steps.

    train_hooked.py --data DIR --out FILE.json [--sampler random|global|distributed|sequential]
                    [--workers N] [--persistent] [--epochs E] [--batch-size B] [--drop-last]
                    [--no-samples] [--max-batches K]

Prints/writes {"batches": [[indices per batch] per epoch], "weights": sha256, "rng": sha256 of
the global RNG state at the end}."""
from __future__ import annotations

import argparse
import hashlib
import json
import os

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Files(Dataset):
    def __init__(self, root: str, with_samples: bool = True):
        paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
        if with_samples:
            self.samples = [(p, 0) for p in paths]
        # no attribute lists the paths: directories, and (directory, name) per index
        self._dirs = sorted({os.path.dirname(p) for p in paths})
        self._where = [(self._dirs.index(os.path.dirname(p)), *os.path.splitext(os.path.basename(p))) for p in paths]

    def __len__(self) -> int:
        return len(self._where)

    def __getitem__(self, i: int):
        d, stem, ext = self._where[i]
        with open(os.path.join(self._dirs[d], stem + ext), "rb") as f:
            data = f.read()
        x = torch.tensor([len(data) % 97, data[0] if data else 0, i % 13], dtype=torch.float32)
        return i, x


class Shuffled(torch.utils.data.Sampler):
    """A user's own sampler with a Python RNG and state shuffled in place."""

    def __init__(self, n: int):
        import random
        self.rng = random.Random(3)
        self.idx = list(range(n))

    def __len__(self) -> int:
        return len(self.idx)

    def __iter__(self):
        self.rng.shuffle(self.idx)
        return iter(list(self.idx))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sampler", default="random", choices=["random", "global", "distributed", "sequential", "custom"])
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--no-samples", action="store_true")
    p.add_argument("--max-batches", type=int, default=0, help="leave each epoch after this many batches")
    a = p.parse_args()
    torch.manual_seed(1234)
    ds = Files(a.data, not a.no_samples)
    kw = dict(batch_size=a.batch_size, num_workers=a.workers, drop_last=a.drop_last,
              persistent_workers=a.persistent and a.workers > 0)
    sampler = None
    if a.sampler == "random":
        loader = DataLoader(ds, shuffle=True, generator=torch.Generator().manual_seed(7), **kw)
    elif a.sampler == "global":
        loader = DataLoader(ds, shuffle=True, **kw)
    elif a.sampler == "distributed":
        sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=5)
        loader = DataLoader(ds, sampler=sampler, **kw)
    elif a.sampler == "custom":
        loader = DataLoader(ds, sampler=Shuffled(len(ds)), **kw)
    else:
        loader = DataLoader(ds, shuffle=False, **kw)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = []
    for epoch in range(a.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        ep = []
        for idx, x in loader:
            if a.max_batches and len(ep) == a.max_batches:
                break
            ep.append(idx.tolist())
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        batches.append(ep)
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.numpy().tobytes())
    out = {"batches": batches, "weights": h.hexdigest(),
           "rng": hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()}
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
