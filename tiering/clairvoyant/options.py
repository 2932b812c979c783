"""The stream from command-line options: which sampler (or order file) the
training uses and how its data-set indices map to catalog files."""
from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..catalog import Catalog, Layout, PathIndex, dataset_ids
from ..samplers import DEFAULT_FRACTION
from .feeds import ListFeed
from .launcher import local_ranks, ranks_from_env
from .orderfile import read_order_arrays
from .samplers import SamplerSpec, epoch_arrays, epoch_order, node_stream_array

RANKED = ("distributed", "pls")   # samplers whose ranks read shares of their own (a node serves its ranks')
PYTHON_NAMES = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|torchrun|ipython[0-9]*)$")


@dataclass(frozen=True)
class OrderOptions:
    sampler: str | None = None          # random | distributed | sequential | pls
    seed: int | None = None
    epochs: int = 1
    world_size: int | None = None
    rank: int | None = None
    local_world_size: int | None = None
    batch_size: int | None = None
    drop_last: bool = False
    order_file: Path | None = None
    layout: str = "imagefolder"
    manifest: Path | None = None
    extensions: tuple[str, ...] | None = None
    layout_root: Path | None = None
    fraction: float | None = None       # pls: the share moved before each epoch (None: the sampler's 0.3)
    partition: str | None = None        # pls: "contiguous" (None) or "random"

    @property
    def given(self) -> bool:
        return self.sampler is not None or self.order_file is not None


class StreamError(Exception):
    pass


def is_python_command(command: list[str]) -> bool:
    """python, python3, torchrun..., or a script whose shebang names python."""
    if not command:
        return False
    if PYTHON_NAMES.match(os.path.basename(command[0])):
        return True
    if os.path.basename(command[0]) == "env" and len(command) > 1:
        return is_python_command(command[1:])
    from shutil import which
    exe = which(command[0])
    try:
        with open(exe or command[0], "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


_BLOCKERS = {"I": "-I, whose isolated mode ignores PYTHONPATH",
             "E": "-E, which ignores PYTHONPATH",
             "S": "-S, which skips the site module that loads sitecustomize"}


def hook_blocker(command: list[str]) -> str | None:
    """The option of a `python ...` COMMAND that keeps the order hook from
    starting (-I, -E, -S), described; None when there is none."""
    if command and os.path.basename(command[0]) == "env":
        return hook_blocker(command[1:])
    if not command or not re.match(r"^(python[0-9.]*|pypy[0-9.]*)$", os.path.basename(command[0])):
        return None
    args = iter(command[1:])
    for arg in args:
        if arg in ("-", "--") or not arg.startswith("-"):
            return None
        if arg.startswith("--"):     # --check-hash-based-pycs MODE and the like
            next(args, None)
            continue
        for k, ch in enumerate(arg[1:], start=2):
            if ch in _BLOCKERS:
                return f"Python runs with {_BLOCKERS[ch]}"
            if ch in "cm":           # -c CODE, -m MODULE: the interpreter's options end here
                return None
            if ch in "WX":           # -W ARG, -X OPT: the rest, or the next argument, is the value
                if k == len(arg):
                    next(args, None)
                break
    return None


def layout_of(opts: OrderOptions) -> Layout:
    if opts.layout == "manifest" and opts.manifest is None:
        raise StreamError("--layout manifest needs the manifest file: --layout manifest FILE")
    return Layout(opts.layout, extensions=opts.extensions, manifest=opts.manifest, root=opts.layout_root)


def rank_specs(opts: OrderOptions, env: Mapping[str, str]) -> list[SamplerSpec]:
    world, rank, local_world, _ = ranks_from_env(env)
    world = opts.world_size if opts.world_size is not None else world
    rank = opts.rank if opts.rank is not None else rank
    local_world = opts.local_world_size if opts.local_world_size is not None else (
        local_world if opts.world_size is None else 1)
    if not 0 <= rank < world:
        raise StreamError(f"--rank {rank} is outside --world-size {world}: ranks go from 0 to {world - 1}")
    ranked = opts.sampler in RANKED
    ranks = local_ranks(world, rank, local_world) if ranked else [rank]
    if opts.sampler == "random" and opts.seed is None:
        raise StreamError("--sampler random needs --seed N: the seed of the generator given to the "
                          "DataLoader (without one the order cannot be known; use the hook instead)")
    kind = opts.sampler or "sequential"
    return [SamplerSpec(kind=kind, seed=(opts.seed or 0) if ranked else opts.seed,
                        num_replicas=world if ranked else 1, rank=r if ranked else 0,
                        batch_size=opts.batch_size, batch_drop_last=opts.drop_last,
                        fraction=DEFAULT_FRACTION if opts.fraction is None else opts.fraction,
                        partition=opts.partition or "contiguous")
            for r in ranks]


def epoch_arrays_from_options(opts: OrderOptions, catalog: Catalog,
                              env: Mapping[str, str] = os.environ) -> Iterator[np.ndarray]:
    """Catalog file ids (int64 arrays), epoch by epoch, as the options describe
    them; each epoch is computed when it is asked for."""
    if opts.order_file is not None:
        yield from _order_file_epochs(opts, catalog)
        return
    mapping = dataset_ids(catalog, layout_of(opts))
    specs = rank_specs(opts, env)
    n = len(mapping)
    # most often index i reads file i (an ImageFolder tree the catalog lists in
    # its order): the orders are the ids, without a gather of a million
    # random entries per epoch
    ids = _ids_of(mapping)
    if len(specs) == 1:
        for order in epoch_arrays(specs[0], n, opts.epochs):
            yield ids(order)
    else:
        for e in range(opts.epochs):
            yield ids(node_stream_array(specs, n, e))


def _ids_of(mapping: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Data-set indices -> catalog ids through mapping (the identity when it is one)."""
    if np.array_equal(mapping, np.arange(len(mapping))):
        return lambda order: order
    return lambda order: mapping[order]


def _order_file_epochs(opts: OrderOptions, catalog: Catalog) -> Iterator[np.ndarray]:
    """An order file of data-set indices goes through the layout (index i ->
    the file sample i reads); one of file paths names the files themselves
    and needs no layout.  The file is read once (a pipe can be read once
    only): indices as they are, paths resolved as they come."""
    assert opts.order_file is not None
    paths: PathIndex | None = None     # made at the first path (an index file needs none)
    named = 0

    def resolve(token: str) -> int:
        nonlocal paths, named
        if paths is None:
            paths = PathIndex(catalog)
        cid = paths.id_of(token if os.path.isabs(token) else os.path.join(catalog.roots[0], token))
        if cid < 0:
            raise LookupError(f"not a file under the --data directories {', '.join(catalog.roots)}")
        named += 1
        return cid

    epochs = read_order_arrays(opts.order_file, resolve)
    paths = None     # its sorted hashes and ids (16 B a file) go: nothing resolves a path after the file
    if named:
        if named != sum(map(len, epochs)):
            raise StreamError(f"{opts.order_file}: mixes data-set indices and file paths; use one kind: paths "
                              "(each names its file), or indices (mapped to files by --layout)")
        epochs.reverse()
        while epochs:       # each epoch handed over, not kept here too (8 B a position)
            yield epochs.pop()
        return
    mapping = dataset_ids(catalog, layout_of(opts))
    for k, idx in enumerate(epochs):     # every epoch checked before the first is used (before COMMAND)
        bad = np.flatnonzero((idx < 0) | (idx >= len(mapping)))
        if bad.size:
            raise StreamError(f"{opts.order_file}: epoch {k + 1} names index {int(idx[bad[0]])}, but the data "
                              f"set has {len(mapping)} samples (indices 0..{len(mapping) - 1})")
    for k in range(len(epochs)):
        yield mapping[epochs[k]]
        epochs[k] = epochs[k][:0]       # each epoch's indices go once mapped


def epochs_from_options(opts: OrderOptions, catalog: Catalog,
                        env: Mapping[str, str] = os.environ) -> Iterator[list[int]]:
    """epoch_arrays_from_options as lists."""
    return (a.tolist() for a in epoch_arrays_from_options(opts, catalog, env))


def list_feed(opts: OrderOptions, catalog: Catalog, env: Mapping[str, str] = os.environ) -> ListFeed:
    """A feed whose first epoch is already computed, so that bad options fail
    before COMMAND starts; the others are computed as the policy asks for them."""
    epochs = epoch_arrays_from_options(opts, catalog, env)
    first = next(epochs, None)
    return ListFeed(itertools.chain([first] if first is not None else [], epochs), first)


__all__ = ["OrderOptions", "StreamError", "epoch_arrays_from_options", "epoch_order", "epochs_from_options",
           "is_python_command", "list_feed"]
