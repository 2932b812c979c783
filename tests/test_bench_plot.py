"""The benchmark's summary and plot, drawn from the stored results of the
last `make bench` (bench/results/<scenario>.json): each panel says which
scenario, data set and tiers it shows, marks the lower bound and has a
legend for every series; summary.md speaks in one unit family (MiB) and says
which ratio means what."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import run
from helpers import REPO

SCENARIOS = ["fits-ram", "ram+ssd", "twice"]


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return [json.loads((REPO / "bench" / "results" / f"{name}.json").read_text()) for name in SCENARIOS]


def test_each_panel_names_its_tiers_and_marks_the_lower_bound(results: list[dict]) -> None:
    fig = run.figure(results)
    axes = fig.get_axes()
    assert len(axes) == len(results)
    for ax, res in zip(axes, results):
        title = ax.get_title()
        assert title.startswith(res["scenario"] + ":")
        for t in res["tiers"]:
            assert f"{t['name']} {run.mib(t['capacity'])}" in title
        assert f"{res['dataset']['files']} files" in title
        configs = res["configurations"]
        assert [x.get_text() for x in ax.get_xticklabels()] == [c["name"] for c in configs]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        epochs = len(configs[0]["epochs"])
        assert [f"epoch {k + 1}" for k in range(epochs)] == [x for x in labels if x.startswith("epoch")]
        bound = next(c for c in configs if c["name"] == "lower-bound")
        lines = {ln.get_label(): ln.get_ydata()[0] for ln in ax.get_lines()}
        assert lines["lower bound (copy in /dev/shm), epochs 2+"] == pytest.approx(run.later_mean(bound))
        assert "lower bound (copy in /dev/shm), epochs 2+" in labels
        # one bar per configuration and epoch, each as tall as its measured seconds
        heights = sorted(round(p.get_height(), 6) for p in ax.patches)
        assert heights == sorted(round(e["seconds"], 6) for c in configs for e in c["epochs"])


def test_the_summary_uses_mib_and_says_what_each_ratio_means(results: list[dict], tmp_path: Path) -> None:
    md = run.write_summary(results, tmp_path, "python -m bench.run")
    assert (tmp_path / "epochs.png").stat().st_size > 10_000
    units = set(re.findall(r"\b\d[\d.,]*\s*([KMGT]i?B)\b", md))
    assert units and units <= {"KiB", "MiB", "GiB", "TiB"}, units
    assert "x slower than the lower bound" in md and "speed-up over the PFS" in md
    for res in results:
        assert f"### {res['scenario']}: {res['description']}" in md
