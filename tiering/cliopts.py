"""Command-line options shared by several commands (tier-run, plan,
simulate): how the order the training reads the data set in is given."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .clairvoyant.options import OrderOptions


def apply_options(f: Any, opts: list[Any]) -> Any:
    for o in reversed(opts):
        f = o(f)
    return f


def order_options(f: Any) -> Any:
    """How the daemon learns the order the training reads the data set in."""
    return apply_options(f, [
        click.option("--sampler", type=click.Choice(["random", "distributed", "sequential", "pls"]),
                     help="The training's sampler: RandomSampler / DataLoader(shuffle=True) with a seeded "
                          "generator, DistributedSampler, SequentialSampler, or tiering's "
                          "PartialLocalShuffleSampler (pls)."),
        click.option("--seed", type=int, help="Seed of the sampler's generator (DistributedSampler, pls: its seed)."),
        click.option("--fraction", type=float, metavar="Q",
                     help="With --sampler pls: its fraction, the share of each rank's samples that moves to "
                          "other ranks before each epoch (0 to 1; default 0.3)."),
        click.option("--partition", type=click.Choice(["contiguous", "random"]),
                     help="With --sampler pls: its partition, how the first epoch splits the data set "
                          "(default contiguous)."),
        click.option("--epochs", type=click.IntRange(min=1),
                     help="Epochs the training runs (with --sampler; default 1)."),
        click.option("--world-size", type=click.IntRange(min=1),
                     help="Ranks in the job (default: torchrun/Slurm variables)."),
        click.option("--rank", type=click.IntRange(min=0),
                     help="A rank on this node (default: torchrun/Slurm variables)."),
        click.option("--local-world-size", type=click.IntRange(min=1),
                     help="Ranks on this node, which serves all of them (default: torchrun/Slurm variables)."),
        click.option("--batch-size", type=click.IntRange(min=1),
                     help="With --drop-last: the last partial batch is not read."),
        click.option("--drop-last", is_flag=True, help="The DataLoader's drop_last."),
        click.option("--order-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="The order itself: one data-set index or file path per line, epochs separated "
                          "by a blank line or '# epoch'; or a .npy (one row per epoch)."),
        click.option("--layout", nargs=1, default="imagefolder", show_default=True,
                     type=click.Choice(["imagefolder", "datasetfolder", "sorted", "manifest"]),
                     help="How data-set index i maps to a file: torchvision ImageFolder order, DatasetFolder "
                          "order (with --extensions), all files sorted, or a manifest (--manifest FILE)."),
        click.option("--manifest", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="With --layout manifest: the files of the data set, one per line (or a .json list), "
                          "in index order."),
        click.option("--extensions", metavar=".EXT,...",
                     help="File extensions of the samples (DatasetFolder; default for ImageFolder: its image list)."),
        click.option("--layout-root", type=click.Path(file_okay=False, exists=True, path_type=Path),
                     help="The directory the training's ImageFolder is given, when it is not the (only) --data."),
    ])


def order_from(kw: dict[str, Any]) -> OrderOptions:
    ext = kw.pop("extensions")
    epochs = kw.pop("epochs")
    if epochs is not None and kw.get("sampler") is None:
        raise click.UsageError("--epochs counts the epochs of --sampler's order: give --sampler too (an "
                               "--order-file holds its own epochs, and without either the hook follows "
                               "every epoch the training runs)")
    fraction, partition = kw.pop("fraction"), kw.pop("partition")
    for name, value in (("--fraction", fraction), ("--partition", partition)):
        if value is not None and kw.get("sampler") != "pls":
            raise click.UsageError(f"{name} is an option of --sampler pls (PartialLocalShuffleSampler); give "
                                   f"--sampler pls too, or leave {name} out")
    if fraction is not None and not 0 <= fraction <= 1:
        raise click.UsageError(f"--fraction {fraction} is outside 0 to 1: it is the share of each rank's "
                               "samples that moves to other ranks before each epoch")
    return OrderOptions(kw.pop("sampler"), kw.pop("seed"), epochs or 1, kw.pop("world_size"),
                        kw.pop("rank"), kw.pop("local_world_size"), kw.pop("batch_size"), kw.pop("drop_last"),
                        kw.pop("order_file"), kw.pop("layout"), kw.pop("manifest"),
                        tuple(e.strip() for e in ext.split(",") if e.strip()) if ext else None,
                        kw.pop("layout_root"), fraction=fraction, partition=partition)
