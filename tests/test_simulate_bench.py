"""The simulator's prediction of the benchmark (bench/predict.py) and the model
changes it needs: tier-run's copy pool, its lru, the clairvoyant plan
following the opens of the loader's read-ahead, the copies' head start.
Times are predicted and checked for consistency, never measured against a
bound (the comparison with measurements is bench/results/summary.md)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.predict import POLICY_OF, Probe, predict
from helpers import BENCH_TIMEOUT, PYTHON, REPO
from tiering.simulate.config import FileSpec, SimConfig, StorageClass, Table
from tiering.simulate.runner import simulate

CONFIGS = ["pfs", "off", "first-touch", "stage", "lru", "clairvoyant", "lower-bound"]
MB = 1_000_000


def one_node(files: int = 300, epochs: int = 2, tiers: tuple[float, ...] = (16.0, 22.0), staging_mb: float = 14.0,
             **over: Any) -> SimConfig:
    rng = np.random.default_rng(0)
    sizes = tuple(float(s) for s in rng.normal(0.11, 0.01, files))
    orders = tuple(tuple(int(i) for i in rng.permutation(files)) for _ in range(epochs))
    cfg = SimConfig(nodes=1, epochs=epochs, batch_size=32, drop_last=False, files=FileSpec(count=files, sizes_mb=sizes),
                    compute_mb_s=75.0, preprocess_mb_s=1e12, network_mb_s=1e12, pfs_link_mb_s=1e12,
                    pfs=Table(((1, 400.0),)),
                    storage=(StorageClass(staging_mb, 2, Table(((1, 600.0),))),
                             *(StorageClass(c, 4, Table(((1, 600.0),))) for c in tiers)),
                    pfs_latency_ms=10.0, copy_latency_ms=9.0, copy_threads=16, orders=(orders,))
    return SimConfig(**{**vars(cfg), **over})


def test_lru_is_tier_runs_the_first_tier_a_file_fits_in_evicting_there() -> None:
    # 16 + 22 MB of tiers hold the 33 MB: first-touch fills both and reads nothing
    # from the PFS in epoch 2; tier-run's lru keeps to the 16 MB tier (evicting)
    rep = simulate(one_node(), ["first-touch", "lru"])
    sizes = np.asarray(one_node().files.sizes_mb)
    assert rep.policies["first-touch"].pfs_bytes == pytest.approx(2 * sizes.sum() * MB, abs=1)
    lru_pfs = rep.policies["lru"].pfs_bytes
    assert lru_pfs > 2 * (2 * sizes.sum() * MB) - 16 * MB * 2   # most of epoch 2 read (and copied) again
    assert rep.policies["lru"].epochs[1] > 2 * rep.policies["first-touch"].epochs[1]


def test_clairvoyant_follows_the_opens_of_the_read_ahead() -> None:
    # the loader reads 128 files ahead, twice the planner's window: copies issued when
    # the reader consumes a position would come after the read-ahead opened it
    rep = simulate(one_node(), ["lower-bound", "clairvoyant"])
    lb, cv = rep.policies["lower-bound"].epochs, rep.policies["clairvoyant"].epochs
    assert cv[0] <= 1.05 * lb[0] and cv[1] <= 1.01 * lb[1]


def test_copies_share_tier_runs_pfs_threads_and_start_ahead_of_the_reader() -> None:
    sizes = np.asarray(one_node().files.sizes_mb)
    per_class = simulate(one_node(copy_threads=0), ["stage"]).policies["stage"]
    pooled = simulate(one_node(), ["stage"]).policies["stage"]
    ahead = simulate(one_node(head_start_s=10.0), ["stage"]).policies["stage"]
    lb = simulate(one_node(), ["lower-bound"]).policies["lower-bound"]
    assert pooled.epochs[0] < per_class.epochs[0]          # 16 threads copy faster than 4 per tier
    assert ahead.epochs == pytest.approx(lb.epochs, rel=0.01)   # everything copied before the reader starts
    assert ahead.pfs_bytes == pytest.approx(sizes.sum() * MB, abs=1)   # each file once, by the copies


def result_dict(files: int, compute_ms: float, workers: int) -> dict[str, Any]:
    data = int(files * 110_000)
    lb_epochs = [{"seconds": 0.5}, {"seconds": 0.5}]
    return {"dataset": {"files": files, "bytes": data},
            "tiers": [{"name": "ram", "capacity": data // 2}, {"name": "ssd", "capacity": data // 2}],
            "pfs": {"meta_latency_ms": 1.0, "read_latency_ms": 0.5, "bandwidth_mbps": 400.0, "max_inflight": 16},
            "workload": {"reader": "dataloader", "workers": workers, "batch_size": 32,
                         "compute_ms_per_batch": compute_ms, "epochs": 2},
            "configurations": [{"name": n, "wall_seconds": 7.0 if n == "lower-bound" else 30.0,
                                "epochs": [{"seconds": 1.2}, {"seconds": 1.3}] if n == "pfs" else
                                [dict(e) for e in lb_epochs]} for n in CONFIGS]}


def check_predictions(res: dict[str, Any], sizes: list[int]) -> None:
    """Every configuration predicted with its policy, ratios = measured / predicted,
    naive = files x latency + bytes / bandwidth (+ the compute), clairvoyant <= naive,
    the lower bound under everything."""
    pred, cfg = res["prediction"], res["prediction"]["config"]
    for c in res["configurations"]:
        p = c["predicted"]
        assert p["policy"] == POLICY_OF[c["name"]]
        assert len(p["epochs"]) == len(c["epochs"]) and all(x > 0 for x in p["epochs"])
        for e, x, r in zip(c["epochs"], p["epochs"], p["ratio"]):
            assert r == pytest.approx(e["seconds"] / x, abs=6e-4)   # ratios kept to 3 decimals: off by <= 5e-4
    by = {c["name"]: c["predicted"]["epochs"] for c in res["configurations"]}
    assert by["pfs"] == by["off"]
    bw = next(iter(cfg["pfs_mb_s"].values()))   # one point: slowfs's bandwidth
    total_mb = sum(sizes) / MB
    naive = len(sizes) * cfg["pfs_latency_ms"] / 1000 + total_mb / bw + total_mb / cfg["compute_mb_s"]
    assert pred["naive_epochs"] == pytest.approx([naive] * len(by["pfs"]), rel=1e-3)
    for name, epochs in by.items():
        for k, x in enumerate(epochs):
            assert by["lower-bound"][k] <= x + 1e-6, name
    assert all(cv <= nv + 1e-6 for cv, nv in zip(by["clairvoyant"], pred["naive_epochs"]))


def test_predict_fills_every_configuration_from_the_settings() -> None:
    files = 200
    res = result_dict(files, 30.0, 2)
    sizes = [110_000] * files
    orders = [list(np.random.default_rng(e).permutation(files)) for e in range(2)]
    pr = Probe(files=64, readers=2, read_ms=9.0, read_mean_ms=9.5, copy_ms=8.0, mean_bytes=110_000, meta_ops_per_read=7, reads_per_read=1.3,
               meta_ops_per_copy=6, reads_per_copy=1.3)
    res["prediction"] = predict(res, sizes, orders, pr, {"ram": 600.0, "ssd": 250.0})
    check_predictions(res, sizes)
    cfg = res["prediction"]["config"]
    # the probe: 9 ms per file less the transfer at 400 MB/s; the PFS's latency calibrated
    # on the pfs configuration's 1.25 s epochs, a copy's by the same factor; the lower
    # bound's 0.5 s epochs as compute; 7 x 1 + 1.3 x 0.5 + 0.275 ms from slowfs's settings alone
    probed = 9.0 - 0.11 / 400 * 1000
    assert res["prediction"]["probed_pfs_latency_ms"] == pytest.approx(probed, abs=1e-3)
    by = {c["name"]: c["predicted"]["epochs"] for c in res["configurations"]}
    assert sum(by["pfs"]) / 2 == pytest.approx(1.25, rel=0.01)
    assert cfg["pfs_latency_ms"] > probed
    assert cfg["copy_latency_ms"] / (8.0 - 0.275) == pytest.approx(cfg["pfs_latency_ms"] / probed, rel=1e-3)
    assert cfg["compute_mb_s"] == pytest.approx(files * 0.11 / 0.5, rel=1e-6)
    assert cfg["settings_compute_mb_s"] == pytest.approx(files * 0.11 / (7 * 0.030), rel=1e-6)
    assert cfg["head_start_s"] == pytest.approx(6.0)
    assert cfg["copy_threads"] == 16 and cfg["staging_threads"] == 2
    assert cfg["staging_mb"] == pytest.approx(2 * 2 * 32 * 0.11)
    assert res["prediction"]["probe"]["settings_read_ms"] == pytest.approx(7 + 0.65 + 0.275, abs=1e-3)
    # from the probe alone, the PFS directly: 200 files at 9 ms by 2 loader threads
    pfs = next(c for c in res["configurations"] if c["name"] == "pfs")
    assert pfs["predicted"]["probed_epochs"][1] == pytest.approx(files * 9.0 / 1000 / 2, rel=0.05)


@pytest.mark.slow
@pytest.mark.fuse
def test_the_bench_stores_a_prediction_beside_every_configuration(tmp_path: Path) -> None:
    out = tmp_path / "results"
    r = subprocess.run([PYTHON, "-m", "bench.run", "--quick", "--scenario", "ram+ssd", "--scenario", "twice",
                        "--out", str(out), "--work", str(tmp_path / "work")],
                       cwd=REPO, capture_output=True, text=True, timeout=BENCH_TIMEOUT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for scenario in ("ram+ssd", "twice"):
        res = json.loads((out / f"{scenario}.json").read_text())
        assert [c["name"] for c in res["configurations"]] == CONFIGS
        src = tmp_path / "work" / f"source-{res['dataset']['files']}"
        sizes = sorted((str(p.relative_to(src)), p.stat().st_size) for p in src.rglob("*")
                        if p.is_file() and not p.name.startswith("."))
        assert len(sizes) == res["dataset"]["files"]
        check_predictions(res, [s for _, s in sizes])
        probe = res["prediction"]["probe"]
        assert probe["files"] > 0 and probe["meta_ops_per_read"] > 0 and probe["reads_per_read"] > 0
        # --quick reads in the main process (no workers): no read-ahead, so the PFS
        # directly is the naive policy
        by = {c["name"]: c["predicted"]["epochs"] for c in res["configurations"]}
        assert by["pfs"] == pytest.approx(res["prediction"]["naive_epochs"], rel=1e-3)
    summary = (out / "summary.md").read_text()
    assert summary.count("(staging-pool) |") == 4 and summary.count("(clairvoyant) |") == 2
    assert "Predicted by `tiering simulate`'s model" in summary


def test_the_copy_settings_are_read_from_the_config() -> None:
    from tiering.simulate.config import ConfigError, config_from_dict
    base = {"nodes": 1, "epochs": 1, "batch_size": 4, "files": {"count": 10, "size_mb": 1.0}, "compute_mb_s": 100,
            "pfs_mb_s": 100, "storage": [{"capacity_mb": 4, "threads": 1, "read_mb_s": 1000}]}
    cfg = config_from_dict({**base, "copy_threads": 16, "copy_latency_ms": 2.5, "head_start_s": 3})
    assert (cfg.copy_threads, cfg.copy_latency_ms, cfg.head_start_s) == (16, 2.5, 3.0)
    plain = config_from_dict(base)
    assert (plain.copy_threads, plain.copy_latency_ms, plain.head_start_s) == (0, None, 0.0)
    with pytest.raises(ConfigError, match="copy_threads: must be an integer >= 0"):
        config_from_dict({**base, "copy_threads": 1.5})
