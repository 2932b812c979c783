"""Training scripts as people write them, one Dataset kind each, none of which
tiering knows: the order hook must find or learn which files each index reads.

    kinds.py --kind KIND --data DIR --out FILE.json [--epochs 3] [--workers 2] [--epoch-pause S] [--stats-pass]
         [--loader-per-epoch]

KIND:
  dicts      a list of dicts {"image": path, "label": k} (attribute `items`)
  frame      a pandas DataFrame with a "path" column (attribute `table`)
  dict-ids   string ids and a dict id -> path, not index-aligned (learnt)
  from-id    integer ids; the path is built in __getitem__ (learnt)
  subset     a Subset (every third index left out) of a `dicts` data set
  subset-ids the same Subset of a `from-id` data set (learnt)
  pairs      integer ids; __getitem__ opens img/ID.bin then mask/ID.bin (learnt)
  pair-dict  a dict index -> (image, mask) (attribute `table`)
  pair-lists two lists of paths, images and masks (attributes `images` + `masks`)
  arrow      one big file memory-mapped by the main process at start, records
             sliced out of it in __getitem__ (HF datasets' Arrow files)

Data layout (made by the test): DIR/img/ID.bin for ids 1000 + 7 k, DIR/mask/ID.bin,
or DIR/table.arrow. Writes {"epochs": [{"opens", "local"}], "digest": sha256 of
what each index read, "weights": sha256 of the model, "rng": sha256 of the global
RNG state, "arrow_local": whether the big file's descriptor is a tier copy}.
--stats-pass: before training, one pass of a sequential DataLoader over the same
data set (as for its mean and standard deviation).
--replacement: the training's sampler draws with replacement (indices read twice in an epoch).
--loader-per-epoch: each epoch from a DataLoader of its own (each starts at its epoch 0).
--val DIR: after each epoch, a sequential pass over the same kind of data set in DIR (a
validation set: the same class and length, other files).
--epoch-copies K: after each epoch, wait until the tier-run's RAM tier holds K copies;
"copies_waited" in each epoch's record says whether it did (within 60 s)."""
from __future__ import annotations

import argparse
import getpass
import glob
import hashlib
import json
import mmap
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, Subset

RECORD = 4096


def ids_in(root: str) -> list[int]:
    return sorted(int(n[:-4]) for n in os.listdir(os.path.join(root, "img")))


def read(path: str) -> tuple[bytes, bool]:
    with open(path, "rb") as f:
        data = f.read()
        where = os.readlink(f"/proc/self/fd/{f.fileno()}")
    return data, not where.startswith(REAL_ROOT + "/")


REAL_ROOT = ""


def sample(i: int, chunks: list[tuple[bytes, bool]]) -> tuple[int, str, int, torch.Tensor]:
    h = hashlib.sha256(b"".join(c for c, _ in chunks)).hexdigest()
    first = chunks[0][0]
    x = torch.tensor([len(first) % 97, first[0] if first else 0, i % 13], dtype=torch.float32)
    return i, h, sum(local for _, local in chunks), x


class Dicts(Dataset):
    def __init__(self, root: str):
        self.items = [{"image": os.path.join(root, "img", f"{k:08d}.bin"), "label": k % 5} for k in ids_in(root)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return sample(i, [read(self.items[i]["image"])])


class Frame(Dataset):
    def __init__(self, root: str):
        import pandas as pd
        ids = ids_in(root)
        self.table = pd.DataFrame({"label": [k % 5 for k in ids],
                                   "path": [os.path.join(root, "img", f"{k:08d}.bin") for k in ids]})

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int):
        return sample(i, [read(self.table.iloc[i]["path"])])


class DictIds(Dataset):
    def __init__(self, root: str):
        ids = ids_in(root)
        self.id2path = {f"img_{k}": os.path.join(root, "img", f"{k:08d}.bin") for k in reversed(ids)}
        self.keys = [f"img_{k}" for k in ids]

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int):
        return sample(i, [read(self.id2path[self.keys[i]])])


class FromId(Dataset):
    def __init__(self, root: str):
        self.root = root
        self.ids = ids_in(root)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return sample(i, [read(f"{self.root}/img/{self.ids[i]:08d}.bin")])


class Pairs(FromId):
    def __getitem__(self, i: int):
        k = self.ids[i]
        return sample(i, [read(f"{self.root}/img/{k:08d}.bin"), read(f"{self.root}/mask/{k:08d}.bin")])


class PairDict(Dataset):
    def __init__(self, root: str):
        ids = ids_in(root)
        self.table = {i: (f"{root}/img/{k:08d}.bin", f"{root}/mask/{k:08d}.bin") for i, k in enumerate(ids)}

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int):
        return sample(i, [read(p) for p in self.table[i]])


class PairLists(Dataset):
    def __init__(self, root: str):
        ids = ids_in(root)
        self.images = [f"{root}/img/{k:08d}.bin" for k in ids]
        self.masks = [f"{root}/mask/{k:08d}.bin" for k in ids]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return sample(i, [read(self.images[i]), read(self.masks[i])])


class Arrow(Dataset):
    def __init__(self, root: str):
        self.file = open(os.path.join(root, "table.arrow"), "rb")
        self.local = not os.readlink(f"/proc/self/fd/{self.file.fileno()}").startswith(REAL_ROOT + "/")
        self.map = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ)
        self.n = len(self.map) // RECORD

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return sample(i, [(self.map[i * RECORD:(i + 1) * RECORD], self.local)])


def make(kind: str, root: str) -> Dataset:
    if kind in ("subset", "subset-ids"):
        ds = Dicts(root) if kind == "subset" else FromId(root)
        return Subset(ds, [i for i in range(len(ds)) if i % 3 != 1])
    return {"dicts": Dicts, "frame": Frame, "dict-ids": DictIds, "from-id": FromId, "pairs": Pairs,
            "pair-dict": PairDict, "pair-lists": PairLists, "arrow": Arrow}[kind](root)


def collate(batch):  # type: ignore[no-untyped-def]
    return [b[:3] for b in batch], torch.stack([b[3] for b in batch])


def job_tiers(parent: int, shm: str = "/dev/shm") -> list[str]:
    """The data directories of the RAM tiers of the tier-run that is process
    parent: its private directories whose owner record names that process
    (pid and start time).  A directory of an earlier job whose pid was the
    same (pid numbers are reused; a remover takes a dead job's directory
    over while it deletes it) is not this job's."""
    from tiering.rundirs import OWNER_FILE, start_ticks
    start = start_ticks(parent)
    out = []
    for d in glob.glob(f"{shm}/tiering-{getpass.getuser()}-{parent}-*/data"):
        try:
            with open(os.path.join(os.path.dirname(d), OWNER_FILE)) as f:
                owner = json.load(f)
        except (OSError, ValueError):
            continue
        if owner.get("pid") == parent and owner.get("start") == start:
            out.append(d)
    return out


def wait_copies(count: int, timeout: float = 60.0, parent: int | None = None, shm: str = "/dev/shm") -> bool:
    """Until the RAM tier of the tier-run that started this process holds
    count copies (at most timeout seconds); at once without tier-run.
    Whether it got there."""
    tiers = job_tiers(os.getppid() if parent is None else parent, shm)
    deadline = time.monotonic() + timeout
    while count and tiers:
        if sum(len(files) for t in tiers for _, _, files in os.walk(t)) >= count:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return not count


def main() -> None:
    global REAL_ROOT
    p = argparse.ArgumentParser()
    p.add_argument("--kind", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epoch-pause", type=float, default=0.0, help="seconds after each epoch (a validation)")
    p.add_argument("--stats-pass", action="store_true", help="a sequential pass over the data set first")
    p.add_argument("--replacement", action="store_true", help="a RandomSampler with replacement (seeded)")
    p.add_argument("--loader-per-epoch", action="store_true",
                   help="a new DataLoader for each epoch (one generator for all: each epoch its own order)")
    p.add_argument("--val", help="after each epoch, a pass over a data set of the same kind in this directory")
    p.add_argument("--step-pause", type=float, default=0.0, help="seconds per batch (the model's compute)")
    p.add_argument("--epoch-copies", type=int, default=0,
                   help="after each epoch, wait (60 s at most) until the RAM tier of the tier-run running this "
                        "holds this many copies: what the test checks is placement, not the machine's speed")
    a = p.parse_args()
    REAL_ROOT = os.path.realpath(a.data)
    torch.manual_seed(1234)
    ds = make(a.kind, os.path.abspath(a.data))
    stats = None
    if a.stats_pass:
        xs = [x for _, x in DataLoader(ds, batch_size=8, num_workers=a.workers, collate_fn=collate)]
        stats = torch.cat(xs).mean(0).tolist()
        time.sleep(a.epoch_pause)
    generator = torch.Generator().manual_seed(11)

    def new_loader() -> DataLoader:
        if a.replacement:
            sampler = RandomSampler(ds, replacement=True, generator=generator)
            return DataLoader(ds, batch_size=8, sampler=sampler, num_workers=a.workers, collate_fn=collate)
        return DataLoader(ds, batch_size=8, shuffle=True, num_workers=a.workers, collate_fn=collate,
                          generator=generator)
    loader = new_loader()
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: dict[int, str] = {}
    epochs = []
    for _ in range(a.epochs):
        opens = local = 0
        if a.loader_per_epoch and epochs:
            loader = new_loader()
        for meta, x in loader:
            for i, h, n_local in meta:
                assert seen.setdefault(i, h) == h, f"index {i} read different bytes"
                opens += 1
                local += n_local
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(a.step_pause)
        if a.val:
            for _ in DataLoader(make(a.kind, os.path.abspath(a.val)), batch_size=8, num_workers=a.workers,
                                collate_fn=collate):
                pass
        time.sleep(a.epoch_pause)
        epochs.append({"opens": opens, "local": local, "copies_waited": wait_copies(a.epoch_copies)})
    h = hashlib.sha256()
    for i in sorted(seen):
        h.update(f"{i} {seen[i]}\n".encode())
    w = hashlib.sha256()
    for t in model.state_dict().values():
        w.update(t.numpy().tobytes())
    out = {"epochs": epochs, "digest": h.hexdigest(), "weights": w.hexdigest(),
           "rng": hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest(),
           "arrow_local": getattr(ds, "local", None), "stats": stats}
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
