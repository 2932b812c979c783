"""Accuracy of partial local shuffling (PLS): a small CNN trained on
scikit-learn's digits (8x8 images, 1,797 samples, shipped inside the wheel)
by 16 data-parallel ranks, each reading its own samples through
PartialLocalShuffleSampler at a fraction Q, against DistributedSampler
(global shuffling), several seeds each.

The setting is the one where local shuffling can hurt: the training set is
sorted by label before it becomes the data set (as an ImageFolder lists it,
classes in order) and the sampler's initial partition is contiguous, so at
Q = 0 each rank holds one or two classes for the whole training.  The test
set is a fixed, seeded, stratified 30% of the samples.

Two models, the same CNN (two 3x3 convolutions, a max-pool, a linear layer)
with and without BatchNorm:

    cnn-bn  BatchNorm as DDP runs it by default: each rank normalises with its
            own batch's statistics, and the running statistics used for testing
            are rank 0's (DDP broadcasts rank 0's buffers before every forward)
    cnn     no normalisation layer: the averaged gradient is that of the union
            of the ranks' batches

Training: SGD with momentum 0.9, a per-rank batch of 8 (global 128), a fixed
learning rate and number of epochs; the model's initial weights and the
sampler's seed are the run's seed.  The test accuracy is measured after every
epoch.

The 16 ranks are emulated, one after another in one process: per step, each
rank's forward and backward on its batch (the sampler's next 8 indices of
that rank, exactly the DataLoader's batch) from the same weights and from the
buffers rank 0 broadcast, the gradients averaged as DDP averages them (each
divided by the world size, then summed), one optimizer step, the buffers
rank 0's.  --check-gloo N runs one configuration for N epochs as a real
torch.distributed gloo job too (torch.multiprocessing.spawn, 16 processes,
DistributedDataParallel, a DataLoader over the sampler) and compares its
final weights and buffers with the emulation's: the emulation is what DDP
computes, up to the order in which floats are added.

    python -m bench.pls_accuracy [--quick] [--out DIR] [--epochs E] [--seeds S]
                                 [--check-gloo N] [--report-only]

Writes OUT/pls-accuracy.json, OUT/pls-accuracy.md and OUT/pls-accuracy.png.
--quick: 2 seeds, 8 epochs, a 4-rank gloo check of 1 epoch, OUT bench/results/quick.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tiering.samplers import PartialLocalShuffleSampler

REPO = Path(__file__).resolve().parent.parent
FRACTIONS = (0.0, 0.1, 0.3, 1.0)
SAMPLERS = ("global",) + tuple(f"pls-{q:g}" for q in FRACTIONS)
MODELS = ("cnn-bn", "cnn")
SPLIT_SEED = 0
TEST_SHARE = 0.3


@dataclass
class Setup:
    world: int = 16
    batch: int = 8            # per rank
    lr: float = 0.05
    momentum: float = 0.9
    epochs: int = 20
    target: float = 0.95      # test accuracy
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])


def load() -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    """The training set sorted by label (stable: file order within a class),
    and the test images and labels; images scaled to [0, 1], 1 x 8 x 8."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=TEST_SHARE, random_state=SPLIT_SEED, stratify=y)
    order = np.argsort(y_tr, kind="stable")
    train = TensorDataset(torch.from_numpy(x_tr[order]), torch.from_numpy(y_tr[order]))
    return train, torch.from_numpy(x_te), torch.from_numpy(y_te)


class Net(nn.Module):
    def __init__(self, bn: bool) -> None:
        super().__init__()
        norm = nn.BatchNorm2d if bn else (lambda c: nn.Identity())
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), norm(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), norm(32), nn.ReLU(),
            nn.MaxPool2d(2))
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def make_model(model: str, seed: int) -> Net:
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, not {model!r}")
    torch.manual_seed(seed)
    return Net(bn=model == "cnn-bn")


def make_sampler(sampler: str, dataset: TensorDataset, world: int, rank: int,
                 seed: int) -> DistributedSampler[Any] | PartialLocalShuffleSampler:
    """DistributedSampler ("global") or PartialLocalShuffleSampler ("pls-Q"),
    contiguous initial partition."""
    if sampler == "global":
        return DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    if not sampler.startswith("pls-"):
        raise ValueError(f"sampler must be 'global' or 'pls-Q', not {sampler!r}")
    return PartialLocalShuffleSampler(dataset, num_replicas=world, rank=rank, fraction=float(sampler[4:]),
                                      seed=seed, partition="contiguous")


def make_optimizer(model: nn.Module, setup: Setup) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=setup.lr, momentum=setup.momentum)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    was = model.training
    model.eval()
    acc = (model(x).argmax(1) == y).float().mean().item()
    model.train(was)
    return acc


def train(model_name: str, sampler_name: str, seed: int, setup: Setup,
          data: tuple[TensorDataset, torch.Tensor, torch.Tensor] | None = None,
          record: bool = False) -> dict[str, Any]:
    """One emulated data-parallel training: the test accuracy after each
    epoch, and with `record` the indices each rank trained on, per epoch, in
    the order it read them (trained[epoch][rank])."""
    train_set, x_te, y_te = data if data is not None else load()
    x_tr, y_tr = train_set.tensors
    model = make_model(model_name, seed)
    opt = make_optimizer(model, setup)
    params = [p for p in model.parameters() if p.requires_grad]
    buffers = list(model.buffers())
    samplers = [make_sampler(sampler_name, train_set, setup.world, r, seed) for r in range(setup.world)]
    accs: list[float] = []
    trained: list[list[list[int]]] = []
    model.train()
    for epoch in range(setup.epochs):
        orders = []
        for s in samplers:
            s.set_epoch(epoch)
            orders.append(list(iter(s)))
        if record:
            trained.append([[] for _ in range(setup.world)])
        steps = math.ceil(len(orders[0]) / setup.batch)
        for step in range(steps):
            start = [b.detach().clone() for b in buffers]     # what rank 0 broadcast before this forward
            rank0: list[torch.Tensor] = []
            grads = [torch.zeros_like(p) for p in params]
            for r in range(setup.world):
                idx = orders[r][step * setup.batch:(step + 1) * setup.batch]
                if record:
                    trained[-1][r].extend(idx)
                for b, s0 in zip(buffers, start):
                    b.copy_(s0)
                for p in params:
                    p.grad = None
                F.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
                for g, p in zip(grads, params):
                    assert p.grad is not None
                    g.add_(p.grad / setup.world)
                if r == 0:
                    rank0 = [b.detach().clone() for b in buffers]
            for b, b0 in zip(buffers, rank0):
                b.copy_(b0)
            for p, g in zip(params, grads):
                p.grad = g
            opt.step()
        accs.append(accuracy(model, x_te, y_te))
    out: dict[str, Any] = {"accuracy": accs, "state": model.state_dict()}
    if record:
        out["trained"] = trained
    return out


def _gloo_worker(rank: int, world: int, init_file: str, model_name: str, sampler_name: str, seed: int,
                 setup: Setup, out: str) -> None:
    """One rank of the real job: DDP on gloo, a DataLoader over the sampler;
    rank 0 saves the final state."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        train_set, _, _ = load()
        model = make_model(model_name, seed)
        ddp = DistributedDataParallel(model)
        opt = make_optimizer(ddp, setup)
        sampler = make_sampler(sampler_name, train_set, world, rank, seed)
        loader = DataLoader(train_set, batch_size=setup.batch, sampler=sampler)
        ddp.train()
        for epoch in range(setup.epochs):
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(ddp(xb), yb).backward()
                opt.step()
        if rank == 0:
            torch.save(model.state_dict(), out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def gloo_check(model_name: str, sampler_name: str, seed: int, setup: Setup,
               data: tuple[TensorDataset, torch.Tensor, torch.Tensor]) -> dict[str, Any]:
    """The same training as a real gloo job and emulated: the largest
    difference of their final weights and buffers."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="pls-gloo-") as tmp:
        out = os.path.join(tmp, "state.pt")
        t0 = time.monotonic()
        mp.spawn(_gloo_worker, args=(setup.world, os.path.join(tmp, "init"), model_name, sampler_name, seed,
                                     setup, out), nprocs=setup.world, join=True)
        seconds = time.monotonic() - t0
        real = torch.load(out)
    emulated = train(model_name, sampler_name, seed, setup, data)["state"]
    floats = [k for k, v in emulated.items() if v.is_floating_point()]
    counts_equal = all(torch.equal(real[k], v) for k, v in emulated.items() if k not in floats)
    diff = max(float((real[k].double() - emulated[k].double()).abs().max()) for k in floats)
    scale = max(float(emulated[k].abs().max()) for k in floats)
    return {"model": model_name, "sampler": sampler_name, "seed": seed, "world": setup.world,
            "epochs": setup.epochs, "max_abs_diff": diff, "max_abs_weight": scale, "float_tensors": len(floats),
            "integer_tensors_equal": counts_equal, "seconds": round(seconds, 1)}


def first_reaching(accs: list[float], target: float) -> int | None:
    """The first epoch (1-based) whose test accuracy is at least target."""
    return next((e + 1 for e, a in enumerate(accs) if a >= target), None)


def summarise(accs: list[list[float]], target: float) -> dict[str, Any]:
    final = [a[-1] for a in accs]
    reach = [first_reaching(a, target) for a in accs]
    hit = [r for r in reach if r is not None]
    return {"final_mean": statistics.fmean(final), "final_std": statistics.pstdev(final),
            "final_min": min(final), "final_max": max(final), "epochs_to_target": reach,
            "reached": len(hit), "epochs_to_target_median": statistics.median(hit) if hit else None}


def run(setup: Setup, models: list[str], samplers: list[str], check: int, check_world: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    data = load()
    res: dict[str, Any] = {"setup": asdict(setup), "data": {
        "set": "sklearn digits", "train": len(data[0]), "test": len(data[1]), "split_seed": SPLIT_SEED,
        "order": "training set sorted by label (stable), partition contiguous"},
        "versions": {"torch": torch.__version__, "numpy": np.__version__}, "runs": []}
    t0 = time.monotonic()
    for model in models:
        for sampler in samplers:
            t1 = time.monotonic()
            accs = [train(model, sampler, seed, setup, data)["accuracy"] for seed in setup.seeds]
            row = {"model": model, "sampler": sampler, "accuracy": accs, **summarise(accs, setup.target),
                   "seconds": round(time.monotonic() - t1, 1)}
            res["runs"].append(row)
            print(f"{model:7} {sampler:8} final {row['final_mean']:.4f} [{row['final_min']:.4f}, "
                  f"{row['final_max']:.4f}] to {setup.target:.0%}: {row['epochs_to_target']}  "
                  f"({row['seconds']} s)", flush=True)
    res["emulation_seconds"] = round(time.monotonic() - t0, 1)
    if check:
        small = Setup(**{**asdict(setup), "epochs": check, "world": check_world})
        res["gloo_check"] = gloo_check(models[0], "pls-0.3", setup.seeds[0], small, data)
        print(f"gloo check: {res['gloo_check']}", flush=True)
    return res


def _epochs(r: dict[str, Any], n: int) -> str:
    if not r["reached"]:
        return "not reached"
    lo = min(e for e in r["epochs_to_target"] if e is not None)
    hi = max(e for e in r["epochs_to_target"] if e is not None)
    span = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return f"{r['epochs_to_target_median']:g} ({span}), {r['reached']}/{n} seeds"


def table(res: dict[str, Any]) -> str:
    s = res["setup"]
    n = len(s["seeds"])
    lines = [f"| model | sampler | final test accuracy, mean ± std (min-max), {n} seeds | "
             f"epochs to {s['target']:.0%}: median (range), seeds reaching it |",
             "|---|---|---|---|"]
    for r in res["runs"]:
        name = "DistributedSampler (global)" if r["sampler"] == "global" else f"PLS Q = {r['sampler'][4:]}"
        lines.append(f"| {r['model']} | {name} | {100 * r['final_mean']:.1f}% ± {100 * r['final_std']:.1f} "
                     f"({100 * r['final_min']:.1f}-{100 * r['final_max']:.1f}) | {_epochs(r, n)} |")
    lines.append("")
    lines.append(f"{s['world']} ranks, per-rank batch {s['batch']}, SGD lr {s['lr']} momentum {s['momentum']}, "
                 f"{s['epochs']} epochs; {res['data']['train']} training and {res['data']['test']} test images.")
    g = res.get("gloo_check")
    if g:
        lines.append(f"Emulation against a real gloo job ({g['model']}, {g['sampler']}, {g['world']} ranks, "
                     f"{g['epochs']} epoch{'s' if g['epochs'] > 1 else ''}): largest weight difference "
                     f"{g['max_abs_diff']:.1e} (weights and BatchNorm statistics up to {g['max_abs_weight']:.2f}), "
                     f"batch counts {'equal' if g['integer_tensors_equal'] else 'DIFFERENT'}.")
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(dict.fromkeys(r["model"] for r in res["runs"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False, sharey=True)
    for ax, model in zip(axes[0], models):
        for r in (r for r in res["runs"] if r["model"] == model):
            a = np.array(r["accuracy"]) * 100
            epochs = np.arange(1, a.shape[1] + 1)
            label = "DistributedSampler" if r["sampler"] == "global" else f"PLS Q = {r['sampler'][4:]}"
            line, = ax.plot(epochs, a.mean(0), label=label, ls="--" if r["sampler"] == "global" else "-")
            ax.fill_between(epochs, a.min(0), a.max(0), color=line.get_color(), alpha=0.2)
        ax.axhline(res["setup"]["target"] * 100, color="grey", lw=0.8, ls=":")
        ax.set_title(f"{model}, {res['setup']['world']} ranks, classes sorted")
        ax.set_xlabel("epoch")
        ax.set_ylim(50, 100)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel(f"test accuracy, %  (mean, band min-max of {len(res['setup']['seeds'])} seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 seeds, 8 epochs, a 4-rank gloo check of 1 epoch")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--seeds", type=int, help="seeds 0..S-1")
    ap.add_argument("--models", default=",".join(MODELS), type=lambda s: s.split(","))
    ap.add_argument("--samplers", default=",".join(SAMPLERS), type=lambda s: s.split(","))
    ap.add_argument("--check-gloo", type=int, help="epochs of the real gloo job compared (0: none)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--report-only", action="store_true", help="the table and plot again from OUT/pls-accuracy.json")
    args = ap.parse_args()
    out = args.out or REPO / "bench" / "results" / ("quick" if args.quick else "")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pls-accuracy.json"
    if args.report_only:
        res = json.loads(path.read_text())
    else:
        setup = Setup()
        if args.quick:
            setup.epochs, setup.seeds = 8, [0, 1]
        if args.epochs:
            setup.epochs = args.epochs
        if args.seeds:
            setup.seeds = list(range(args.seeds))
        check = args.check_gloo if args.check_gloo is not None else (1 if args.quick else 3)
        t0 = time.monotonic()
        res = run(setup, args.models, args.samplers, check, 4 if args.quick else setup.world)
        res["seconds"] = round(time.monotonic() - t0, 1)
        path.write_text(json.dumps(res, indent=1))
    (out / "pls-accuracy.md").write_text(table(res))
    plot(res, out / "pls-accuracy.png")
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
