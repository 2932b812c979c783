"""The benchmark suite's smoke test: `python -m bench.run --quick` produces
every result file with every field, and all configurations read the same
bytes.  Times are reported, never asserted."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import BENCH_TIMEOUT, PYTHON, REPO

pytestmark = [pytest.mark.slow, pytest.mark.fuse]

CONFIGS = ["pfs", "off", "first-touch", "stage", "lru", "clairvoyant", "lower-bound"]


def test_quick_bench_produces_complete_results(tmp_path: Path):
    out = tmp_path / "results"
    r = subprocess.run([PYTHON, "-m", "bench.run", "--quick", "--out", str(out), "--work", str(tmp_path / "work")],
                       cwd=REPO, capture_output=True, text=True, timeout=BENCH_TIMEOUT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for scenario in ("fits-ram", "ram+ssd", "twice"):
        res = json.loads((out / f"{scenario}.json").read_text())
        assert res["scenario"] == scenario
        assert res["dataset"]["files"] > 0 and res["dataset"]["bytes"] > 0
        assert res["tiers"] and all({"name", "capacity"} <= set(t) for t in res["tiers"])
        assert [c["name"] for c in res["configurations"]] == CONFIGS
        assert len({c["checksum"] for c in res["configurations"]}) == 1
        for c in res["configurations"]:
            assert len(c["epochs"]) == 2
            for e in c["epochs"]:
                assert {"seconds", "samples_per_s", "pfs_opens", "pfs_bytes", "opens_by_tier"} <= set(e)
                assert e["seconds"] > 0 and sum(e["opens_by_tier"].values()) == res["dataset"]["files"]
        by = {c["name"]: c for c in res["configurations"]}
        # the PFS really is in the path: reading it directly opens every file each epoch
        assert all(e["pfs_opens"] >= res["dataset"]["files"] for e in by["pfs"]["epochs"])
        assert all(e["pfs_opens"] == 0 for e in by["lower-bound"]["epochs"])
        assert by["clairvoyant"]["tier_run"]["policy"] == "clairvoyant"
    summary = (out / "summary.md").read_text()
    assert summary.count("| clairvoyant |") == 3 and "DIFFERENT" not in summary
    assert (out / "epochs.png").stat().st_size > 1000
