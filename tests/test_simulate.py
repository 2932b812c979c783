"""The simulator (tiering/simulate): the model's arithmetic on cases worked by
hand, the vectorised policies against the event engine, the commands, and the
published Scenario 2 totals of the HDMLP study."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tiering.cli import main
from tiering.simulate import baselines
from tiering.simulate.config import ConfigError, Table, config_from_dict, load_config
from tiering.simulate.engine import Pipeline, run
from tiering.simulate.rates import Rates
from tiering.simulate.runner import PUBLISHED, simulate
from tiering.simulate.streams import build_streams
from tiering.simulate.sweep import Sweep, run_sweep

SCENARIO2 = {
    "nodes": 4, "epochs": 10, "batch_size": 100, "drop_last": True, "seed": 0,
    "files": {"count": 150000, "size_mb": {"mean": 1.0, "std": 0.1}},
    "compute_mb_s": 100, "preprocess_mb_s": 200, "network_mb_s": 10000, "pfs_link_mb_s": 2000,
    "pfs_mb_s": {1: 66, 2: 86, 4: 146, 8: 326, 16: 324, 32: 324, 64: 324, 128: 324},
    "storage": [
        {"capacity_mb": 1024, "threads": 2, "read_mb_s": {1: 16550, 2: 21164, 3: 21186, 4: 21415}},
        {"capacity_mb": 51200, "threads": 2, "read_mb_s": {1: 16550, 2: 21164, 3: 21186, 4: 21415}},
        {"capacity_mb": 102400, "threads": 2, "read_mb_s": {1: 66, 2: 86, 3: 129, 4: 146}},
    ],
}
# the thesis's published totals for Scenario 2 (seconds)
PUBLISHED_S2 = {"lower-bound": 3825.66, "hdmlp": 3836.12, "lbann-dynamic": 4051.12,
                "deepio-opportunistic": 4432.90, "deepio-ordered": 4433.27, "lbann-preload": 4433.27,
                "locality-aware": 4433.27, "parallel-staging": 4972.65, "staging-pool": 4982.27,
                "naive": 15130.54}


def small(**over: object) -> dict:
    cfg = {"nodes": 2, "epochs": 3, "batch_size": 8, "seed": 1,
           "files": {"count": 400, "size_mb": {"mean": 1.0, "std": 0.2}},
           "compute_mb_s": 100, "preprocess_mb_s": 200, "network_mb_s": 10000, "pfs_link_mb_s": 2000,
           "pfs_mb_s": {1: 66, 2: 86, 4: 146},
           "storage": [{"capacity_mb": 16, "threads": 2, "read_mb_s": 20000},
                       {"capacity_mb": 100, "threads": 2, "read_mb_s": 20000},
                       {"capacity_mb": 200, "threads": 2, "read_mb_s": {1: 66, 2: 86}}]}
    cfg.update(over)
    return cfg


def test_tables_interpolate_and_hold_past_the_ends() -> None:
    t = Table.parse({1: 66, 2: 86, 4: 146}, "pfs_mb_s")
    assert (t(1), t(2), t(3), t(4)) == (66, 86, 116, 146)
    assert t(64) == 146 and t(0.5) == 66
    assert Table.parse(500, "x")(7) == 500


@pytest.mark.parametrize("change, key", [
    ({"nodes": 0}, "nodes"), ({"storage": []}, "storage"), ({"pfs_mb_s": {"a": 1}}, "pfs_mb_s"),
    ({"bogus": 1}, "bogus"), ({"files": {"count": 10, "size_mb": "big"}}, "files.size_mb"),
    ({"storage": [{"capacity_mb": 1, "threads": 1, "read_mb_s": 5, "speed": 3}]}, "storage[0]"),
])
def test_bad_config_names_the_key(change: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        config_from_dict(small(**change))


def test_missing_key_and_unreadable_file(tmp_path: Path) -> None:
    raw = small()
    del raw["storage"]
    with pytest.raises(ConfigError, match="storage: missing"):
        config_from_dict(raw)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")


def test_streams_are_distributed_sampler_shares() -> None:
    cfg = config_from_dict(small(files={"count": 40, "size_mb": 1.0}, epochs=2, batch_size=4))
    st = build_streams(cfg)
    # each epoch the two nodes read disjoint halves of all 40 files
    for e in range(2):
        a = st.files[0][e * 20:(e + 1) * 20]
        b = st.files[1][e * 20:(e + 1) * 20]
        assert sorted(np.concatenate([a, b]).tolist()) == list(range(40))
    assert st.batches == 20 and np.diff(st.starts[0]).tolist() == [2] * 20


def test_lower_bound_by_hand() -> None:
    # 2 nodes, 1 MB files, 2 per node per batch, 100 MB/s: 0.02 s per batch
    cfg = config_from_dict(small(files={"count": 40, "size_mb": 1.0}, epochs=2, batch_size=4))
    rep = simulate(cfg, ["lower-bound"])
    r = rep.policies["lower-bound"]
    assert r.seconds == pytest.approx(20 * 0.02)
    assert r.epochs == pytest.approx([0.2, 0.2])
    assert r.pfs_bytes == 0


def test_staging_threads_by_hand() -> None:
    # one node, 100 files of 1 MB read from a 10 MB/s PFS by 2 threads into a
    # buffer that holds them all, compute and preprocessing free: 50 reads of
    # 0.1 s per thread
    cfg = config_from_dict(small(nodes=1, epochs=1, batch_size=1, files={"count": 100, "size_mb": 1.0},
                                 compute_mb_s=1e9, preprocess_mb_s=1e12, pfs_mb_s={1: 10},
                                 storage=[{"capacity_mb": 1000, "threads": 2, "read_mb_s": 1e9}]))
    r = simulate(cfg, ["staging-pool"]).policies["staging-pool"]
    assert r.seconds == pytest.approx(5.0, rel=1e-6)
    assert r.pfs_bytes == 100 * 1_000_000


def test_pfs_latency_is_charged_per_file() -> None:
    base = simulate(config_from_dict(small(nodes=1)), ["naive"]).policies["naive"]
    slow = simulate(config_from_dict(small(nodes=1, pfs_latency_ms=10)), ["naive"]).policies["naive"]
    assert slow.seconds - base.seconds == pytest.approx(3 * 400 * 0.010, rel=1e-6)


@pytest.mark.parametrize("nodes", [1, 3, 4])
def test_vectorised_naive_equals_the_engine(nodes: int) -> None:
    cfg = config_from_dict(small(nodes=nodes, batch_size=4 * nodes, pfs_latency_ms=0.5))
    st = build_streams(cfg)
    rates = Rates.of(cfg)
    fast = baselines.naive(st, rates)
    slow = run(Pipeline(st, staging=False), rates, 16, 2)
    np.testing.assert_allclose(fast.barriers, slow.barriers, rtol=1e-12)
    assert fast.pfs_mb == pytest.approx(slow.pfs_mb)


def test_every_policy_runs_and_none_beats_the_lower_bound() -> None:
    rep = simulate(config_from_dict(small()))
    lb = rep.policies["lower-bound"].seconds
    assert set(rep.policies) | set(rep.skipped) == set(PUBLISHED) | {"first-touch", "lru", "stage", "clairvoyant",
                                                                      "clairvoyant-peer"}
    assert set(rep.skipped) == {"lbann-preload", "lbann-dynamic"}   # 400 MB > 2 x 100 MB of memory
    for name, r in rep.policies.items():
        assert r.seconds >= lb - 1e-9, name
        assert len(r.epochs) == 3 and sum(r.epochs) == pytest.approx(r.seconds), name
    st = build_streams(config_from_dict(small()))
    read = float(sum(st.sizes[f].sum() for f in st.files))
    assert rep.policies["naive"].pfs_bytes == round(read * 1_000_000)   # every access from the PFS


def test_clairvoyant_with_room_for_everything_reaches_the_bound_after_epoch_one() -> None:
    cfg = config_from_dict(small(storage=[{"capacity_mb": 16, "threads": 2, "read_mb_s": 20000},
                                          {"capacity_mb": 1000, "threads": 4, "read_mb_s": 20000}]))
    rep = simulate(cfg, ["lower-bound", "naive", "clairvoyant", "clairvoyant-peer"])
    lb, cv = rep.policies["lower-bound"], rep.policies["clairvoyant"]
    assert cv.epochs[1:] == pytest.approx(lb.epochs[1:], rel=0.01)
    assert cv.local_bytes > 0 and cv.seconds < rep.policies["naive"].seconds
    # with the peer tier part of what one node needs comes from the other
    assert rep.policies["clairvoyant-peer"].peer_bytes > 0


def test_sweep_changes_one_setting() -> None:
    cfg = config_from_dict(small())
    sw = Sweep.parse("storage[1].capacity_mb=10, 400")
    assert sw.values == (10, 400)
    runs = run_sweep(cfg, sw, ["first-touch"])
    small_ram, big_ram = (r.policies["first-touch"] for _, r in runs)
    assert big_ram.local_bytes > small_ram.local_bytes
    assert cfg.with_value("nodes", 3).nodes == 3
    with pytest.raises(ConfigError, match="storage"):
        cfg.with_value("storage[9].capacity_mb", 1)
    with pytest.raises(ConfigError, match="SETTING=V1"):
        Sweep.parse("nodes")


def test_simulate_command_json_and_text(tmp_path: Path) -> None:
    import yaml
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(small()))
    r = CliRunner().invoke(main, ["simulate", "--config", str(f), "--policy", "lower-bound", "--policy", "hdmlp",
                                  "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert list(d["policies"]) == ["lower-bound", "hdmlp"]
    h, lb = d["policies"]["hdmlp"], d["policies"]["lower-bound"]
    assert isinstance(h["pfs_bytes"], int) and h["pfs_bytes"] > 0 and len(h["epochs"]) == 3
    assert h["seconds"] == pytest.approx(sum(h["epochs"])) and h["seconds"] >= lb["seconds"] * (1 - 1e-9)
    r = CliRunner().invoke(main, ["simulate", "--config", str(f), "--sweep", "nodes=1,2", "--policy", "naive"])
    assert r.exit_code == 0 and "nodes" in r.stdout and r.stdout.count("\n") >= 3
    r = CliRunner().invoke(main, ["simulate"])
    assert r.exit_code != 0 and "--config" in r.output
    f.write_text("nodes: [")
    r = CliRunner().invoke(main, ["simulate", "--config", str(f)])
    assert r.exit_code != 0 and "not valid YAML" in r.output


def test_profile_path_uses_real_sizes_latency_and_order(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    for c in range(2):
        (data / f"c{c}").mkdir(parents=True)
        for k in range(10):
            (data / f"c{c}" / f"{k}.jpg").write_bytes(b"x" * (1000 * (k + 1)))
    (tmp_path / "ram").mkdir()
    prof = tmp_path / "p.yaml"
    base = ("name: t\ntiers:\n  - {name: ram, kind: filesystem, path: %s, capacity: 1MB, bandwidth: {1: 1000}}\n"
            "pfs: {read_threads: 4, bandwidth: {1: 100}%s}\n")
    args = ["simulate", "--profile", str(prof), "--data", str(data), "--sampler", "distributed", "--seed", "0",
            "--epochs", "2", "--nodes", "2", "--policy", "naive", "--json"]
    out = []
    for lat in ("", ", latency_ms: 5"):
        prof.write_text(base % (tmp_path / "ram", lat))
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        out.append(json.loads(r.stdout)["policies"]["naive"])
    # 20 files of 1..10 kB over 2 nodes: every byte read once per epoch
    assert out[0]["pfs_bytes"] == 2 * 2 * sum(1000 * (k + 1) for k in range(10))
    # each node pays 5 ms on each of its 10 reads per epoch (the nodes' overlap,
    # and so the PFS clients they see, shifts a little too)
    assert 2 * 10 * 0.005 - 1e-9 <= out[1]["seconds"] - out[0]["seconds"] < 2 * 10 * 0.005 * 1.05


def test_plan_prints_predicted_epochs(tmp_path: Path) -> None:
    data = tmp_path / "ds" / "c0"
    data.mkdir(parents=True)
    for k in range(20):
        (data / f"{k}.jpg").write_bytes(b"y" * 5000)
    prof = tmp_path / "p.yaml"
    (tmp_path / "ram").mkdir()
    prof.write_text(f"name: t\ntiers:\n  - {{name: ram, kind: memory, path: {tmp_path / 'ram'}, capacity: 2MB}}\n"
                    "pfs: {read_threads: 4, bandwidth: {1: 50}, latency_ms: 2}\n")
    r = CliRunner().invoke(main, ["plan", "--profile", str(prof), "--data", str(tmp_path / "ds"), "--sampler",
                                  "random", "--seed", "1", "--epochs", "2"])
    assert r.exit_code == 0, r.output
    assert "predicted seconds per epoch" in r.stdout and "reading the PFS directly" in r.stdout


def test_plan_predicts_from_the_files_read_as_from_the_whole_catalog(tmp_path: Path) -> None:
    """`tiering plan` gives the model only the files its epochs read (a
    distributed sampler's share): the same seconds as the whole catalog."""
    from tiering.cli import _predict
    from tiering.profile import load_profile
    from tiering.simulate.fromprofile import plan_prediction
    rng = np.random.default_rng(3)
    sizes = rng.integers(1_000, 60_000, 400).astype(np.int64)
    prof = tmp_path / "p.yaml"
    (tmp_path / "ram").mkdir()
    prof.write_text(f"name: t\ntiers:\n  - {{name: ram, kind: memory, path: {tmp_path / 'ram'}, capacity: 2MB}}\n"
                    "pfs: {read_threads: 4, bandwidth: {1: 50}, latency_ms: 2}\n")
    profile = load_profile(str(prof))
    # two epochs of a quarter of the files each, overlapping, ids spread over the catalog
    first = [rng.permutation(400)[:100], rng.permutation(400)[:100]]
    assert len(np.unique(np.concatenate(first))) < 200
    whole = plan_prediction(profile, sizes.tolist(), [e.tolist() for e in first], 8)
    ours = _predict(profile, sizes, first, 8, 2)
    assert ours is not None and ours["modelled_epochs"] == 2
    assert ours["clairvoyant_epochs"] == whole["clairvoyant_epochs"]
    assert ours["pfs_epochs"] == whole["pfs_epochs"]
    assert whole["clairvoyant_seconds"] < whole["pfs_seconds"]   # the tier changed something


@pytest.mark.slow
def test_scenario2_reproduces_the_published_totals() -> None:
    rep = simulate(config_from_dict(SCENARIO2), PUBLISHED)
    for name, published in PUBLISHED_S2.items():
        got = rep.policies[name].seconds
        assert abs(got / published - 1) < 0.02, f"{name}: {got:.2f} s, published {published} s"
