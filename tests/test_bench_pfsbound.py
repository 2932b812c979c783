"""The PFS-bound benchmark's smoke test: `python -m bench.pfsbound --quick`
on a tiny data set has every configuration of both scenarios, every
configuration read the same bytes, and reading the PFS directly moves the
data set once per epoch.  Times are reported, never asserted."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import BENCH_TIMEOUT, PYTHON, REPO

pytestmark = [pytest.mark.slow, pytest.mark.fuse]

CONFIGS = ["pfs", "pfs-parallel", "stage", "clairvoyant", "first-touch", "lower-bound"]


def test_quick_pfsbound_has_every_configuration(tmp_path: Path):
    out = tmp_path / "results"
    r = subprocess.run([PYTHON, "-m", "bench.pfsbound", "--quick", "--files", "200", "--epochs", "2",
                        "--out", str(out), "--work", str(tmp_path / "work")],
                       cwd=REPO, capture_output=True, text=True, timeout=BENCH_TIMEOUT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "pfsbound.json").read_text())
    assert [s["scenario"] for s in res["scenarios"]] == ["pfs-fits", "pfs-half"]
    for sc in res["scenarios"]:
        d, files = sc["dataset"]["bytes"], sc["dataset"]["files"]
        assert files == 200 and d > 0
        assert [c["name"] for c in sc["configurations"]] == CONFIGS
        assert len({c["checksum"] for c in sc["configurations"]}) == 1
        by = {c["name"]: c for c in sc["configurations"]}
        for c in sc["configurations"]:
            assert len(c["epochs"]) == (1 if c["name"] == "pfs-parallel" else 2)
            for e in c["epochs"]:
                assert e["seconds"] > 0 and sum(e["opens_by_tier"].values()) == files
        assert by["pfs-parallel"]["threads"] == sc["pfs"]["max_inflight"]
        # the direct reader's first epoch reads D from the PFS, no more, no less
        assert abs(by["pfs"]["epochs"][0]["pfs_bytes"] - d) <= 0.02 * d
        assert all(e["pfs_bytes"] == 0 for e in by["lower-bound"]["epochs"])
        assert by["clairvoyant"]["tier_run"]["policy"] == "clairvoyant"
        b = sc["bounds"]
        assert set(b["ratios"]) == set(CONFIGS) and b["pfs_parallel_s"] > 0
        assert ("spill_bound_s" in b) == (sc["scenario"] == "pfs-half")
    md = (out / "pfsbound.md").read_text()
    assert md.count("| clairvoyant |") == 2 and "failed" not in md
