"""The replay of torch's CPU generator (tiering/clairvoyant/torchrng.py, torchrng.c) against the real torch: the same
words, permutations and integers over many seeds and sizes (1.28 M included), the samplers' orders equal with and without
the replay, torch not imported when the installed version is replayed, and imported (saying so) when it is not."""
from __future__ import annotations

import itertools
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from test_order import IndexDataset  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler  # noqa: E402

from tiering.clairvoyant import samplers, torchrng  # noqa: E402
from tiering.clairvoyant.samplers import OrderError, SamplerSpec, epoch_order_array  # noqa: E402

IMAGENET = 1_281_167
SEEDS = (0, 1, 2, 5, 42, 1234, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40 + 3, 2**63 - 1, 2**64 - 1, -1, -7, -(2**63))


def pair(seed: int) -> tuple[torchrng.Generator, torch.Generator]:
    return torchrng.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)


def test_the_installed_torch_is_replayed() -> None:
    # the tests below prove the replay for this version; the others fall back to torch
    assert torchrng.torch_version() == torch.__version__.split("+")[0]
    assert torchrng.replayable()


@pytest.mark.parametrize("n", (1, 2, 3, 5, 7, 10, 31, 32, 33, 100, 623, 624, 625, 1001, 65_537))
def test_randperm_and_the_draws_after_it(n: int) -> None:
    for seed in SEEDS:
        ours, real = pair(seed)
        for _ in range(3):   # several permutations in a row: the state carries over
            assert np.array_equal(ours.randperm(n), torch.randperm(n, generator=real).numpy()), (seed, n)
        ours.random64()
        torch.empty((), dtype=torch.int64).random_(generator=real)
        for size in (0, 1, 31, 32, 33):
            assert np.array_equal(ours.randint(n, size),
                                  torch.randint(high=n, size=(size,), dtype=torch.int64, generator=real).numpy())
        ours.skip_randperm(n)
        torch.randperm(n, generator=real)
        ours.skip_randint(5)
        torch.randint(high=n, size=(5,), dtype=torch.int64, generator=real)
        assert np.array_equal(ours.randperm(n), torch.randperm(n, generator=real).numpy()), (seed, n, "after skips")


def test_randperm_at_imagenet_size() -> None:
    for seed in (0, 17, 2**35 + 1):
        ours, real = pair(seed)
        for _ in range(2):
            assert np.array_equal(ours.randperm(IMAGENET), torch.randperm(IMAGENET, generator=real).numpy())
        ours.skip_randperm(IMAGENET)
        torch.randperm(IMAGENET, generator=real)
        assert np.array_equal(ours.randint(IMAGENET, 1000),
                              torch.randint(high=IMAGENET, size=(1000,), dtype=torch.int64, generator=real).numpy())


def test_default_seed_and_state_round_trip() -> None:
    ours = torchrng.Generator()
    assert np.array_equal(ours.randperm(50), torch.randperm(50, generator=torch.Generator()).numpy())
    state = ours.get_state()
    first = ours.randperm(40)
    ours.randperm(40)
    ours.set_state(state)
    assert np.array_equal(ours.randperm(40), first)


def test_out_of_range_arguments_are_refused() -> None:
    g = torchrng.Generator()
    for bad in (2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match="outside"):
            g.manual_seed(bad)
        with pytest.raises((RuntimeError, ValueError)):   # torch refuses them too
            torch.Generator().manual_seed(bad)
        with pytest.raises(OrderError, match="manual_seed accepts"):
            epoch_order_array(SamplerSpec("random", seed=bad), 10, 0)
    with pytest.raises(ValueError):
        g.randperm(torchrng.RANDPERM_MAX)
    with pytest.raises(ValueError):
        g.randint(2**32, 1)


# ------------------------------------------------------------ the samplers: replay, torch, real classes

SPECS = [
    SamplerSpec("random", seed=3),
    SamplerSpec("random", seed=3, dataloader=False),
    SamplerSpec("random", seed=9, persistent_workers=True),
    SamplerSpec("random", seed=4, replacement=True),
    SamplerSpec("random", seed=4, replacement=True, num_samples=70),
    SamplerSpec("random", seed=4, num_samples=25),
    SamplerSpec("random", seed=4, num_samples=3, batch_size=2, batch_drop_last=True),
    SamplerSpec("random", seed=8, batch_size=7, batch_drop_last=True),
    SamplerSpec("distributed", seed=5, num_replicas=3, rank=2),
    SamplerSpec("distributed", seed=5, num_replicas=8, rank=0, drop_last=True),
    SamplerSpec("distributed", num_replicas=8, rank=7, batch_size=4, batch_drop_last=True),
    SamplerSpec("distributed", seed=1, num_replicas=2, rank=1, shuffle=False),
    SamplerSpec("sequential", batch_size=3, batch_drop_last=True),
]


def torch_orders(spec: SamplerSpec, n: int, epochs: int, monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    with monkeypatch.context() as m:
        m.setattr(samplers, "replayed", lambda n: False)
        return list(samplers.epoch_arrays(spec, n, epochs))


@pytest.mark.parametrize("n", (1, 2, 3, 9, 10, 101))
def test_every_sampler_kind_replays_as_torch_draws_it(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    for spec in SPECS:
        replayed = list(samplers.epoch_arrays(spec, n, 4))
        expected = torch_orders(spec, n, 4, monkeypatch)
        assert [a.tolist() for a in replayed] == [a.tolist() for a in expected], (spec, n)
        # epochs out of order: the state cache holds the replay's own states
        for e in (3, 1, 2):
            assert np.array_equal(epoch_order_array(spec, n, e), expected[e]), (spec, n, e)


@pytest.mark.slow
def test_imagenet_epochs_against_the_real_samplers() -> None:
    n, world = IMAGENET, 8
    for rank, drop in itertools.product((0, 5), (False, True)):
        sampler = DistributedSampler(IndexDataset(n), num_replicas=world, rank=rank, seed=11, drop_last=drop)
        spec = SamplerSpec("distributed", seed=11, num_replicas=world, rank=rank, drop_last=drop)
        for epoch in (0, 1, 89):
            sampler.set_epoch(epoch)
            assert np.array_equal(epoch_order_array(spec, n, epoch), np.array(list(sampler), np.int64))
    g = torch.Generator().manual_seed(7)
    alone = RandomSampler(range(n), generator=g)
    real = [np.array(list(alone), np.int64) for _ in range(3)]   # to the end: the trailing draw
    spec = SamplerSpec("random", seed=7, dataloader=False)
    assert all(np.array_equal(a, b) for a, b in zip(samplers.epoch_arrays(spec, n, 3), real, strict=True))
    assert np.array_equal(epoch_order_array(spec, n, 2), real[2])


def test_dataloader_epochs_against_the_real_loader() -> None:
    n = 2_001
    loader = DataLoader(IndexDataset(n), batch_size=64, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(2024))
    real = [[i for b in loader for i in b.tolist()] for _ in range(4)]
    spec = SamplerSpec("random", seed=2024, batch_size=64, batch_drop_last=True)
    assert [a.tolist() for a in samplers.epoch_arrays(spec, n, 4)] == real


# ------------------------------------------------------------ which torch, and torch not imported

PROGRAM = """
import logging, sys
import importlib.metadata as md
VERSION = {version!r}
if VERSION:
    real = md.version
    md.version = lambda name: VERSION if name == "torch" else real(name)
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from tiering.clairvoyant.samplers import SamplerSpec, epoch_order_array
r = epoch_order_array(SamplerSpec("random", seed=3), 1000, 5)
d = epoch_order_array(SamplerSpec("distributed", seed=3, num_replicas=8, rank=1), 1000, 5)
print("torch imported:", "torch" in sys.modules)
print("orders:", r[:5].tolist(), d[:5].tolist())
"""


def run_program(version: str | None) -> str:
    code = textwrap.dedent(PROGRAM.format(version=version))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout


@pytest.mark.slow
def test_orders_without_importing_torch_for_a_replayed_version() -> None:
    out = run_program(None)
    assert "torch imported: False" in out
    assert "replayed without importing torch" in out
    other = run_program("2.99.0")   # a version whose algorithms are not known: torch itself
    assert "torch imported: True" in other
    assert "torch 2.99.0 is not a version whose generator tiering replays" in other
    orders = [line for line in out.splitlines() if line.startswith("orders:")]
    assert orders and orders == [line for line in other.splitlines() if line.startswith("orders:")]


def test_no_replay_without_torch_installed(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(torchrng, "torch_version", lambda: None)
    torchrng.replayable.cache_clear()
    try:
        with caplog.at_level(logging.INFO):
            assert not torchrng.replayable()
    finally:
        torchrng.replayable.cache_clear()
