"""Partial local shuffling (NOTE [partial local shuffling]): the sampler, the
order functions tier-run computes from, and what the hook publishes are one
order, every rank, every epoch, resumed or not; the partitions keep their
balance and move the share asked for; bad arguments are clear errors."""
from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import tiering
from helpers import PYTHON, dataset, profile, tier_run
from tiering import samplers as pls
from tiering.catalog import scan
from tiering.clairvoyant.feeds import HookFeed
from tiering.clairvoyant.samplers import OrderError, SamplerSpec, epoch_order_array, node_stream_array
from tiering.cli import main
from tiering.samplers import PartialLocalShuffleSampler

REPO = Path(tiering.__file__).resolve().parent.parent
HOOK_DIR = REPO / "tiering" / "hook"
TRAIN = Path(__file__).resolve().parent / "workloads" / "train_pls.py"


def forget() -> None:
    """Empty the module's caches: what follows computes every epoch from (seed, epoch) alone."""
    pls._OFFSETS = pls._OffsetCache()
    pls._base.cache_clear()
    pls._fresh.cache_clear()


def spec(m: int, rank: int, q: float, seed: int, **kw) -> SamplerSpec:
    return SamplerSpec("pls", seed=seed, num_replicas=m, rank=rank, fraction=q, **kw)


# -- exactness ------------------------------------------------------------------

CASES = [  # n, world, fraction, options
    (100, 4, 0.3, {}),
    (103, 4, 0.5, {"partition": "random"}),
    (103, 4, 0.25, {"drop_last": True}),
    (37, 8, 1.0, {}),
    (40, 5, 0.0, {"partition": "random"}),
    (5, 8, 0.6, {}),                         # fewer samples than ranks: padded
    (64, 4, 0.4, {"shuffle": False}),
    (30, 1, 0.3, {}),
    (50, 2, 0.99, {"drop_last": True, "partition": "random"}),
]


@pytest.mark.parametrize("n, world, q, kw", CASES, ids=[f"n{c[0]}-m{c[1]}-q{c[2]}-{c[3]}" for c in CASES])
def test_the_sampler_the_order_functions_and_a_resumed_sampler_agree(n, world, q, kw):
    epochs, seed = 6, 11
    data = list(range(n))
    running = [PartialLocalShuffleSampler(data, num_replicas=world, rank=r, fraction=q, seed=seed, **kw)
               for r in range(world)]
    read = {}
    for e in range(epochs):
        for r, s in enumerate(running):
            s.set_epoch(e)
            read[e, r] = list(s)
            assert len(read[e, r]) == len(s) == pls.per_rank(n, world, kw.get("drop_last", False))
    forget()
    # backwards, from empty caches: each epoch computed on its own
    for e in reversed(range(epochs)):
        for r in range(world):
            assert epoch_order_array(spec(world, r, q, seed, **kw), n, e).tolist() == read[e, r]
            assert pls.rank_order(seed, e, world, r, n, q, **kw).tolist() == read[e, r]
            forget()
            fresh = PartialLocalShuffleSampler(data, num_replicas=world, rank=r, fraction=q, seed=seed, **kw)
            fresh.set_epoch(e)                   # a restart at epoch e
            assert list(fresh) == read[e, r]
    # the ranks' rows of the partition are the samples they read
    for e in range(epochs):
        rows = pls.partition_rows(seed, e, world, n, q, kw.get("partition", "contiguous"), kw.get("drop_last", False))
        for r in range(world):
            assert sorted(rows[r].tolist()) == sorted(read[e, r])


def test_epoch_0_splits_like_distributed_sampler_in_blocks():
    """Padding repeats the list from its start, drop_last cuts its tail (DistributedSampler's rules)."""
    rows = pls.partition_rows(0, 0, 4, 10, 0.3)
    assert rows.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 1]]
    assert pls.partition_rows(0, 0, 4, 10, 0.3, drop_last=True).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    random = pls.partition_rows(5, 0, 4, 12, 0.3, "random")
    assert sorted(random.ravel().tolist()) == list(range(12)) and random.tolist() != rows.tolist()
    s = PartialLocalShuffleSampler(list(range(10)), num_replicas=4, rank=3, shuffle=False)
    assert list(s) == [9, 0, 1] and s.total_size == 12


def test_node_streams_interleave_the_ranks_orders():
    specs = [spec(6, r, 0.3, 2) for r in (2, 3)]
    want = np.stack([pls.rank_order(2, 4, 6, r, 60, 0.3) for r in (2, 3)], axis=1).ravel()
    assert node_stream_array(specs, 60, 4).tolist() == want.tolist()


# -- without tier-run -------------------------------------------------------------

def test_a_list_and_torch_dataloader():
    from torch.utils.data import DataLoader, Sampler
    data = [f"sample-{i}" for i in range(23)]
    s = PartialLocalShuffleSampler(data, num_replicas=3, rank=2, fraction=0.5, seed=4)
    assert isinstance(s, Sampler)
    ids = list(range(23))
    loader = DataLoader(ids, sampler=s, batch_size=4)
    for e in range(3):
        s.set_epoch(e)
        got = [i for b in loader for i in b.tolist()]
        assert got == list(s) and len(got) == 8
    loader = DataLoader(ids, sampler=s, batch_size=4, num_workers=2)
    assert [i for b in loader for i in b.tolist()] == list(s)


def test_the_orders_need_no_torch(tmp_path):
    """The functions, the clairvoyant side and the sampler class itself without torch."""
    code = """
import sys
sys.modules["torch"] = None                      # import torch fails
import tiering.samplers as pls
from tiering.clairvoyant.samplers import SamplerSpec, epoch_order_array
from tiering.samplers import PartialLocalShuffleSampler
s = PartialLocalShuffleSampler(list(range(50)), num_replicas=4, rank=1, fraction=0.3, seed=9)
s.set_epoch(7)
assert list(s) == epoch_order_array(SamplerSpec("pls", seed=9, num_replicas=4, rank=1), 50, 7).tolist()
assert list(s) == pls.rank_order(9, 7, 4, 1, 50, 0.3).tolist()
print(len(list(s)))
"""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "13"


def test_world_and_rank_from_the_environment_and_torch_distributed(tmp_path, monkeypatch):
    data = list(range(40))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    s = PartialLocalShuffleSampler(data)
    assert (s.num_replicas, s.rank, len(s)) == (1, 0, 40)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    s = PartialLocalShuffleSampler(data)
    assert (s.num_replicas, s.rank, len(s)) == (4, 3, 10)
    assert PartialLocalShuffleSampler(data, rank=1).rank == 1
    monkeypatch.setenv("RANK", "three")
    with pytest.raises(ValueError, match="RANK='three' is not an integer"):
        PartialLocalShuffleSampler(data)
    monkeypatch.setenv("RANK", "3")
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        s = PartialLocalShuffleSampler(data)         # the process group wins over the environment
        assert (s.num_replicas, s.rank) == (1, 0)
    finally:
        dist.destroy_process_group()


# -- properties ---------------------------------------------------------------------

def moved(rows: list[np.ndarray]) -> list[list[int]]:
    """Per epoch after the first, per rank: how many of its samples were on another rank before."""
    return [[len(b) - len(set(a.tolist()) & set(b.tolist())) for a, b in zip(before, now)]
            for before, now in zip(rows, rows[1:])]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(world=st.integers(1, 9), k=st.integers(1, 30), q=st.floats(0, 1), seed=st.integers(0, 2**64 - 1),
       partition=st.sampled_from(pls.PARTITIONS), epochs=st.integers(2, 6))
def test_balance_and_the_share_moved(world, k, q, seed, partition, epochs):
    n = world * k
    rows = [pls.partition_rows(seed, e, world, n, q, partition) for e in range(epochs)]
    for p in rows:
        assert p.shape == (world, k)                               # each rank keeps its count
        assert sorted(p.ravel().tolist()) == list(range(n))        # every index once per epoch
    m = pls.moved_per_rank(k, world, q)
    if world > 1 and q < 1:
        assert abs(m / k - q) <= 1 / (2 * k) + 1e-12               # Q within rounding
        for counts in moved(rows):
            assert counts == [m] * world                             # exactly m, each to another rank
    if q == 0 or world == 1:
        assert all(np.array_equal(p, rows[0]) for p in rows)         # nothing ever moves


@settings(max_examples=30, deadline=None, derandomize=True)
@given(world=st.integers(1, 7), n=st.integers(1, 60), q=st.floats(0, 1), seed=st.integers(0, 1000),
       drop_last=st.booleans(), e=st.integers(0, 12))
def test_an_epoch_is_computed_from_seed_and_epoch_alone(world, n, q, seed, drop_last, e):
    if drop_last and n < world:
        return
    forget()
    direct = pls.partition_rows(seed, e, world, n, q, drop_last=drop_last)
    forget()
    for t in range(e + 1):
        walked = pls.partition_rows(seed, t, world, n, q, drop_last=drop_last)
    assert np.array_equal(direct, walked)
    k = pls.per_rank(n, world, drop_last)
    padded = np.arange(world * k) % n                               # the same multiset every epoch
    assert sorted(direct.ravel().tolist()) == sorted(padded.tolist())


def overlap(rows: list[np.ndarray]) -> float:
    """The mean share of a rank's samples that it held in the epoch before."""
    return 1 - float(np.mean(moved(rows))) / len(rows[0][0])


@settings(max_examples=40, deadline=None, derandomize=True)
@given(world=st.integers(4, 16), k=st.integers(16, 64), seed=st.integers(0, 2**32))
def test_fraction_one_draws_each_partition_afresh(world, k, seed):
    """A fresh uniform partition shares 1/M of a rank's samples with the one
    before on average; the tolerance (5 standard deviations of the mean of
    M ranks over 4 epochs) is far from what Q = 0.5 keeps (1/2)."""
    n, epochs = world * k, 5
    sd = math.sqrt((1 / world) * (1 - 1 / world) / k / (world * (epochs - 1)))
    tolerance = 5 * sd
    fresh = overlap([pls.partition_rows(seed, e, world, n, 1.0) for e in range(epochs)])
    half = overlap([pls.partition_rows(seed, e, world, n, 0.5) for e in range(epochs)])
    assert abs(fresh - 1 / world) < tolerance
    assert abs(half - 1 / world) > tolerance


# -- bad arguments ---------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    ({"fraction": -0.1}, "fraction must be a number from 0 to 1"),
    ({"fraction": 1.5}, "fraction must be a number from 0 to 1"),
    ({"fraction": float("nan")}, "fraction must be a number from 0 to 1"),
    ({"fraction": "0.3"}, "fraction must be a number from 0 to 1"),
    ({"rank": 4}, "rank 4 is outside num_replicas 4: ranks go from 0 to 3"),
    ({"rank": -1}, "rank -1 is outside num_replicas 4"),
    ({"num_replicas": 0, "rank": 0}, "num_replicas .* must be an integer >= 1"),
    ({"partition": "strided"}, "partition must be one of 'contiguous', 'random', not 'strided'"),
    ({"seed": -1}, "seed must be an integer >= 0"),
])
def test_bad_arguments_are_value_errors(kw, match):
    args = dict({"num_replicas": 4, "rank": 0}, **kw)
    with pytest.raises(ValueError, match=match):
        PartialLocalShuffleSampler(list(range(10)), **args)


def test_bad_data_sets_and_epochs():
    with pytest.raises(ValueError, match="the data set has 0 samples"):
        PartialLocalShuffleSampler([], num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="fewer than the 4 ranks: with drop_last no rank gets a sample"):
        PartialLocalShuffleSampler([1, 2, 3], num_replicas=4, rank=0, drop_last=True)
    s = PartialLocalShuffleSampler([1, 2, 3], num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        s.set_epoch(-1)
    with pytest.raises(OrderError, match="fraction must be a number from 0 to 1"):
        spec(4, 0, 2.0, 0)
    with pytest.raises(OrderError, match="rank 4 is outside"):
        spec(4, 4, 0.3, 0)
    with pytest.raises(OrderError, match="with drop_last no rank"):
        epoch_order_array(spec(4, 0, 0.3, 0, drop_last=True), 3, 0)


@pytest.mark.parametrize("args, message", [
    (["--sampler", "distributed", "--fraction", "0.3"], "--fraction is an option of --sampler pls"),
    (["--fraction", "0.3"], "--fraction is an option of --sampler pls"),
    (["--sampler", "random", "--partition", "random"], "--partition is an option of --sampler pls"),
    (["--sampler", "pls", "--fraction", "1.5"], "--fraction 1.5 is outside 0 to 1"),
    (["--sampler", "pls", "--fraction", "-0.5"], "--fraction -0.5 is outside 0 to 1"),
    (["--sampler", "pls", "--fraction", "nan"], "--fraction nan is outside 0 to 1"),
])
@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_fraction_without_pls_or_outside_0_1_is_a_usage_error(tmp_path, command, args, message):
    data = tmp_path / "ds"
    dataset(data, n=12)
    r = CliRunner().invoke(main, [command, "--profile", str(profile(tmp_path)), "--data", str(data), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output


def test_tier_run_refuses_a_fraction_without_pls(tmp_path):
    data = tmp_path / "ds"
    dataset(data, n=12)
    r = tier_run(["--profile", str(profile(tmp_path)), "--data", str(data), "--sampler", "distributed",
                  "--fraction", "0.3", "--", "true"])
    assert r.returncode == 2 and "--fraction is an option of --sampler pls" in r.stderr


def test_plan_and_simulate_take_the_sampler(tmp_path):
    data = tmp_path / "ds"
    dataset(data, n=40)
    prof = profile(tmp_path, bandwidth="{1: 200}")
    order = ["--sampler", "pls", "--fraction", "0.5", "--seed", "3", "--epochs", "3", "--world-size", "4",
             "--rank", "1", "--local-world-size", "2", "--layout", "sorted"]
    r = CliRunner().invoke(main, ["plan", "--profile", str(prof), "--data", str(data), "--json", *order])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [e["accesses"] for e in out["epochs"]] == [20, 20, 20]   # 2 ranks of 10
    r = CliRunner().invoke(main, ["simulate", "--profile", str(prof), "--data", str(data), "--json",
                                  "--policy", "clairvoyant", *order])
    assert r.exit_code == 0, r.output


def test_simulate_gives_each_node_its_ranks_streams(tmp_path):
    from tiering.clairvoyant.options import OrderOptions
    from tiering.simulate.fromprofile import node_streams
    data = tmp_path / "ds"
    dataset(data, n=40)
    cat = scan([str(data)])
    opts = OrderOptions(sampler="pls", seed=3, epochs=2, world_size=4, local_world_size=2, fraction=0.5,
                        partition="random", layout="sorted")
    streams = node_streams(opts, cat, 2)
    rel = sorted(cat.files.rel(i) for i in range(len(cat.files)))
    for node in range(2):
        specs = [spec(4, r, 0.5, 3, partition="random") for r in (2 * node, 2 * node + 1)]
        for e in range(2):
            want = [rel[i] for i in node_stream_array(specs, 40, e).tolist()]
            assert [cat.files.rel(c) for c in streams[node][e]] == want


# -- the hook ----------------------------------------------------------------------

def hooked(data: Path, tmp: Path, rank: int, world: int, *args: str) -> tuple[dict, list[dict]]:
    out, orders = tmp / f"out-{rank}.json", tmp / f"orders-{rank}"
    orders.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TIERING_ORDER_DIR")}
    env.update(PYTHONPATH=f"{HOOK_DIR}{os.pathsep}{REPO}", TIERING_ORDER_DIR=str(orders),
               WORLD_SIZE=str(world), RANK=str(rank))
    r = subprocess.run([PYTHON, str(TRAIN), "--data", str(data), "--out", str(out), *args],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()), [json.loads(p.read_text()) for p in sorted(orders.glob("*.json"))]


@pytest.mark.slow
@pytest.mark.parametrize("args", [("--workers", "0"), ("--workers", "2", "--resume-at", "2", "--partition", "random")],
                         ids=["plain", "workers-resumed"])
def test_the_hook_publishes_every_ranks_order(tmp_path, args):
    data = tmp_path / "ds"
    dataset(data, n=45)
    world, q, seed, epochs = 3, 0.4, 7, 4
    partition = "random" if "random" in args else "contiguous"
    opts = ("--fraction", str(q), "--seed", str(seed), "--epochs", str(epochs), *args)
    runs = [hooked(data, tmp_path, r, world, *opts) for r in range(world)]
    all_msgs = []
    for rank, (result, msgs) in enumerate(runs):
        assert result["rank"] == rank and result["world"] == world
        epochs_msgs = [m for m in msgs if m["kind"] == "epoch"]
        assert not [m for m in msgs if m["kind"] == "error"]
        assert len(epochs_msgs) == epochs
        for e, (m, ep) in enumerate(zip(epochs_msgs, result["epochs"])):
            want = pls.rank_order(seed, e, world, rank, 45, q, partition).tolist()
            assert ep["indices"] == want                       # the sampler reads the order function's
            assert m["indices"] == want and m["rank"] == rank  # the hook published it
            nxt = pls.rank_order(seed, e + 1, world, rank, 45, q, partition).tolist()
            assert m["next"] == nxt                            # and the next epoch's, set_epoch(e + 1)
        all_msgs += msgs
    # the node serving all three ranks plans their interleaved streams
    cat = scan([str(data)])
    feed_dir = tmp_path / "feed"
    feed_dir.mkdir()
    for k, m in enumerate(all_msgs):
        (feed_dir / f"{k:04d}.json").write_text(json.dumps(m))
    got = HookFeed(feed_dir, cat).poll()
    rel = sorted(os.path.relpath(p, data) for p in data.rglob("*") if p.is_file())
    specs = [spec(world, r, q, seed, partition=partition) for r in range(world)]
    if "--resume-at" in args:      # the new loader of epoch 2 starts its own count
        assert sorted(eo.epoch for _, eo in got) == [0, 0, 1, 1]
        got = sorted(got, key=lambda ke: (ke[0], ke[1].epoch))
    for e, (_, eo) in enumerate(got):
        want = node_stream_array(specs, 45, e).tolist()
        assert [cat.files.rel(int(c)) for c in eo.order] == [rel[i] for i in want]


# -- tier-run end to end -------------------------------------------------------------

def run_pls(tmp: Path, data: Path, *order: str) -> tuple[dict, dict, subprocess.CompletedProcess[str]]:
    stats, out = tmp / "stats.json", tmp / "train.json"
    env = dict(os.environ, WORLD_SIZE="2", RANK="1")
    r = tier_run(["--profile", str(profile(tmp)), "--data", str(data), "--stats-json", str(stats), *order, "--",
                  PYTHON, str(TRAIN), "--data", str(data), "--out", str(out), "--fraction", "0.5", "--seed", "3",
                  "--epochs", "3", "--workers", "2", "--epoch-pause", "0.3"], env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(stats.read_text()), json.loads(out.read_text()), r


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftovers")
@pytest.mark.parametrize("order", [
    ("--sampler", "pls", "--fraction", "0.5", "--seed", "3", "--epochs", "3", "--world-size", "2", "--rank", "1",
     "--local-world-size", "1", "--layout", "sorted"),
    (),
], ids=["options", "hook"])
def test_tier_run_follows_the_order(tmp_path, order):
    data = tmp_path / "pfs"
    dataset(data, n=120)
    stats, result, r = run_pls(tmp_path, data, *order)
    assert stats["policy"] == "clairvoyant", r.stderr
    got = stats["order"]
    assert got["following"] and not got["diverged"], r.stderr
    share = 60
    assert got["matched_opens"] >= 0.95 * 3 * share
    for e, ep in enumerate(result["epochs"]):
        assert ep["indices"] == pls.rank_order(3, e, 2, 1, 120, 0.5).tolist()
    local = [ep["local"] for ep in result["epochs"]]
    assert local[1] + local[2] >= 0.95 * 2 * share, local
    assert stats["opens"]["total"] == 3 * share
