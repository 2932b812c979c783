"""The scale benchmark's smoke test: `python -m bench.scale` on 100,000 files
in 1,000 class directories, 4 epochs (about two minutes here) runs every case
and writes complete results, and everything it read or copied is the data
set: same counts, same bytes.  Times are reported, never asserted (`make
bench-scale-quick` is the timed 100 k-file run; the 1.28 M one `make
bench-scale`)."""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from bench import ext4mem
from helpers import BENCH_TIMEOUT, PYTHON, REPO

FILES = 100_000
EPOCHS = 4
LARGE = (2, 4 << 20)
COPY_ROUNDS = 2     # stagings onto the disk (case copies-small)
CASES = ["startup", "plan", "clairvoyant-random", "clairvoyant-distributed", "copies-small", "copies-small-ram",
         "copies-small-ext4", "copies-large"]


def run_bench(tmp_path: Path) -> dict:
    out = tmp_path / "results"
    r = subprocess.run([PYTHON, "-m", "bench.scale", "--files", str(FILES), "--epochs", str(EPOCHS),
                        "--paced-seconds", "1", "--rate", "2000", "--large", f"{LARGE[0]}x{LARGE[1] >> 20}",
                        "--limit", "300", "--copy-rounds", str(COPY_ROUNDS), "--work", str(tmp_path / "work"), "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=BENCH_TIMEOUT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (out / "scale.md").read_text().count("\n|") >= 20
    return json.loads((out / "scale.json").read_text())


def check_tier_run(run: dict, files: int) -> None:
    assert run["status"] == 0 and not run["killed"], run
    assert run["stats_exit_code"] == 0 and run["files"] == files
    # the wall time covers start-up, COMMAND and the teardown after it (stamps of one clock)
    assert run["startup_s"] > 0 and run["teardown_s"] > 0
    assert run["startup_s"] + run["teardown_s"] <= run["seconds"]
    assert run["peak_rss"] > 10 << 20 and run["cpu_s"] > 0


def check_clairvoyant(res: dict, per_epoch: int) -> None:
    check_tier_run(res, FILES)
    # two epochs read; with the random sampler, then the next epoch opened and closed only
    opened = FILES if per_epoch == FILES else 0
    assert res["read_listed"] == 2 * per_epoch and res["listed"] == res["read_listed"] + opened
    reader = res["reader"]
    assert reader["ok"] and reader["files"] == res["listed"] == res["direct"]["files"]
    assert reader["bytes"] == res["direct"]["bytes"] == res["read_listed"] * 1024
    assert res["checksum_equal"]
    # every open the reader made was of a catalogued file and counted by the shim
    assert res["opens"]["total"] == reader["files"]
    assert res["opens"]["total"] == res["opens"]["pfs"] + sum(res["opens"]["by_tier"].values())
    phases = res["phases"]
    assert [p["kind"] for p in reader["phases"]] == ["paced", "wait", "paced", "full"] + ["opens"] * bool(opened)
    assert phases["wait"]["waited"] == res["wait_files"] > 0
    # after the wait every file of the list has a copy: nothing after it reads the source
    assert phases["fits"]["pfs"] == 0 and phases["full"]["pfs"] == 0
    assert phases["full"]["files"] > 0 and phases["full"]["tier"] == phases["full"]["files"]
    if opened:
        assert phases["opens"]["files"] == opened == phases["opens"]["tier"] and phases["opens"]["pfs"] == 0
        assert phases["opens"]["bytes"] == 0 and res["direct"]["opens_only_per_s"] > 0
    assert sum(p["files"] for p in reader["phases"]) == res["listed"]
    assert isinstance(res["events_dropped"], int) and res["events"] > 0
    # each full-speed phase's own drops, from the time series: part of the job's
    for key in ["full"] + ["opens"] * bool(opened):
        assert 0 <= phases[key]["events_dropped"] <= res["events_dropped"]
    # every file of the list was copied (the daemon may have fetched further ahead)
    assert res["placement"]["copies"] >= res["wait_files"] and res["placement"]["copy_failures"] == 0


def check_copies(res: dict, files: int, data_bytes: int, rounds: int = 1) -> None:
    assert len(res["more_rounds"]) == rounds - 1
    for ref in ("cp", "tar"):
        check_reference(res[ref], files, data_bytes)
    dropped = {res[ref]["caches_dropped"] for ref in ("cp", "tar")}
    for r in [res, *res["more_rounds"]]:
        check_reference(r["cp_after"], files, data_bytes)
        check_stage(r["stage"], files, data_bytes)
        dropped |= {r["cp_after"]["caches_dropped"], r["stage"]["caches_dropped"]}
    # each copy started from the same caches (or, where they cannot be dropped, none did)
    assert len(dropped) == 1


def check_reference(ref: dict, files: int, data_bytes: int) -> None:
    assert ref["ok"] and ref["files"] == files and ref["bytes_apparent"] >= data_bytes
    assert ref["files_per_s"] == files / ref["seconds"]


def check_stage(stage: dict, files: int, data_bytes: int) -> None:
    check_tier_run(stage, files)
    assert stage["placement"]["copies"] == files
    # the read-back after staging: every file from its copy (the reader's own view and the shim's counters)
    assert stage["verify"]["files"] == stage["verify"]["tier"] == files and stage["verify"]["bytes"] == data_bytes
    assert sum(stage["opens"]["by_tier"].values()) == stage["opens"]["total"] == files
    assert stage["checksum_equal"] and stage["waited"] == files
    # staging is timed from COMMAND's start to the last copy: inside tier-run's own run
    assert 0 < stage["copy_seconds"] < stage["seconds"] - stage["startup_s"]
    assert stage["files_per_s"] == files / stage["copy_seconds"]


def test_a_phases_drops_are_read_off_the_series_around_it():
    from bench.scale.cases import dropped_during
    series = {"t": [1.0, 2.0, 3.0, 4.0, 5.0], "events_dropped": [0, 0, 10, 10, 30]}
    assert dropped_during(series, 1.5, 3.5) == 10        # the sample after 3.5 less the one before 1.5
    assert dropped_during(series, 3.5, 4.5) == 20        # the second around 3.5 counts on both sides
    assert dropped_during(series, 0.5, 2.0) == 0
    assert dropped_during(series, 4.0, 5.5) is None      # no sample after the phase
    assert dropped_during(series, 4.0, 5.5, final=35) == 25   # the job ended first: its count at the end
    assert dropped_during({"t": [1.0]}, 0.0, 0.5) is None   # a series without the column


@pytest.mark.slow
def test_scale_bench_runs_every_case_on_the_data_set(tmp_path: Path):
    doc = run_bench(tmp_path)
    assert doc["tree"]["files"] == FILES and doc["tree"]["classes"] == 1000
    assert {"cpus", "memory", "kernel", "commit"} <= set(doc["machine"])
    cases = doc["cases"]
    assert list(cases) == CASES and not any("error" in c for c in cases.values())

    st = cases["startup"]
    assert st["find_count"] == FILES and st["find_s"] > 0
    assert st["scan_count"] == FILES and st["scan_s"] > 0
    assert [st["runs"][k]["catalog_cached"] for k in ("cold", "cached", "cached-1-epoch")] == [False, True, True]
    for run in st["runs"].values():
        check_tier_run(run, FILES)

    for name, per_epoch in (("random", FILES), ("distributed", math.ceil(FILES / 8))):
        plan = cases["plan"][name]
        assert plan["status"] == 0 and plan["files"] == FILES and plan["epochs"] == EPOCHS
        assert plan["accesses"] == [per_epoch] and plan["maxrss"] > 10 << 20
        check_clairvoyant(cases[f"clairvoyant-{name}"], per_epoch)

    check_copies(cases["copies-small"], FILES, FILES * 1024, COPY_ROUNDS)
    check_copies(cases["copies-small-ram"], FILES, FILES * 1024)
    assert "/dev/shm/" in cases["copies-small-ram"]["cp"]["script"]
    no_ext4 = ext4mem.unavailable()   # ext4 in memory needs root and mkfs.ext4 (CI has both)
    if no_ext4 is None:
        check_copies(cases["copies-small-ext4"], FILES, FILES * 1024)
        assert "/copies-small-ext4/ext4/copies" in cases["copies-small-ext4"]["cp"]["script"]
    else:
        assert cases["copies-small-ext4"]["error"] == no_ext4
    check_copies(cases["copies-large"], LARGE[0], LARGE[0] * LARGE[1])

    targets = doc["targets"]
    assert len(targets) >= 20
    assert all(t["verdict"] in ("pass", "FAIL", "info") or t["verdict"].startswith("not measured") for t in targets)
    # a figure this run measured is never reported as missing
    measured = {t["target"]: t for t in targets}
    assert measured["start-up to COMMAND, cached catalog"]["value"] > 0
    assert measured["copies, small files: stage vs cp -r"]["ratio"] > 0
    assert measured["copies, small files to /dev/shm: stage vs cp -r"]["ratio"] > 0
    ext4_row = measured["copies, small files to ext4 in memory: stage vs cp -r"]
    assert ext4_row["ratio"] > 0 if no_ext4 is None else ext4_row["verdict"] == f"not measured ({no_ext4})"
