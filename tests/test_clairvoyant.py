"""The clairvoyant policy end to end: an unchanged training script with a
seeded, shuffled DataLoader under tier-run; the daemon follows the real order
and the opens served from the tiers match what the plan predicts."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import N_FILES, PYTHON, READER, dataset, digest, profile, tier_run

pytestmark = pytest.mark.usefixtures("no_leftovers")

SAMPLER = ["--sampler", "random", "--seed", "0", "--epochs", "3", "--layout", "sorted"]


def run(tmp: Path, data: Path, prof: Path, *opts: str, reader_seed: int = 0, workers: int = 2,
        pause: str = "0.3", delay: str = "0") -> tuple[dict, dict, subprocess.CompletedProcess[str]]:
    stats, out = tmp / "stats.json", tmp / "reader.json"
    r = tier_run(["--profile", str(prof), "--data", str(data), "--stats-json", str(stats), *opts, "--",
                  PYTHON, str(READER), "--data", str(data), "--epochs", "3", "--out", str(out),
                  "--workers", str(workers), "--seed", str(reader_seed), "--epoch-pause", pause,
                  "--sample-delay", delay])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(stats.read_text()), json.loads(out.read_text()), r


def plan(data: Path, prof: Path, *opts: str) -> dict:
    r = subprocess.run([PYTHON, "-m", "tiering", "plan", "--profile", str(prof), "--data", str(data),
                        "--json", *opts], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_unchanged_script_is_followed_through_the_hook(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data)
    stats, rd, r = run(tmp_path, data, profile(tmp_path))
    assert stats["policy"] == "clairvoyant", r.stderr
    order = stats["order"]
    assert order["following"] and not order["diverged"], r.stderr
    assert order["epochs_known"] == 4          # the three read, and the next one predicted
    assert order["matched_opens"] >= 0.95 * 3 * N_FILES
    assert "no longer follow" not in r.stderr
    assert "3 epochs known" not in r.stderr and "4 epochs known" in r.stderr
    ep = rd["epochs"]
    assert ep[1]["local"] + ep[2]["local"] >= 0.99 * 2 * N_FILES
    assert stats["opens"]["by_tier"]["ram"] == sum(e["local"] for e in ep)
    assert rd["digest"] == digest(contents)


@pytest.mark.slow
def test_sampler_options_match_the_plan(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data)
    prof = profile(tmp_path)
    predicted = plan(data, prof, *SAMPLER)
    stats, rd, r = run(tmp_path, data, prof, *SAMPLER)
    order = stats["order"]
    assert stats["policy"] == "clairvoyant" and order["following"] and not order["diverged"], r.stderr
    hits = [sum(e["hits_by_tier"]) for e in predicted["epochs"]]
    assert hits == [N_FILES] * 3                       # it all fits: every access a hit
    local = [e["local"] for e in rd["epochs"]]
    # known before COMMAND starts: even epoch 1 is mostly prefetched
    assert local[0] >= 0.5 * N_FILES
    assert local[1] + local[2] >= 0.99 * (hits[1] + hits[2])
    assert rd["digest"] == digest(contents)


@pytest.mark.slow
def test_data_twice_the_tiers_streams_within_capacity(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data)
    total = sum(map(len, contents.values()))
    cap = total // 2
    prof = profile(tmp_path, capacity=str(cap))
    predicted = plan(data, prof, *SAMPLER)
    # 2 ms of compute per sample: the daemon, copying ahead, keeps up with the reader
    stats, rd, r = run(tmp_path, data, prof, *SAMPLER, "--window", "16", delay="0.002")
    order = stats["order"]
    assert order["following"] and not order["diverged"], r.stderr
    assert stats["tiers"][0]["used"] <= cap
    assert order["evictions"] > 0
    assert stats["placement"]["evictions"] > 0
    hits = sum(sum(e["hits_by_tier"]) for e in predicted["epochs"])
    served = stats["opens"]["by_tier"]["ram"]
    assert served >= 0.8 * hits, (served, hits)
    assert stats["opens"]["total"] == 3 * N_FILES
    assert rd["digest"] == digest(contents)


@pytest.mark.slow
def test_a_different_seed_is_noticed_and_first_touch_takes_over(tmp_path):
    data = tmp_path / "pfs"
    contents = dataset(data)
    stats, rd, r = run(tmp_path, data, profile(tmp_path), "--sampler", "random", "--seed", "99",
                       "--epochs", "3", "--layout", "sorted", reader_seed=0, workers=0)
    order = stats["order"]
    assert order["diverged"] and not order["following"]
    assert r.stderr.count("no longer follow") == 1
    assert "stopped following the order" in r.stderr
    # first touch placed what was read, so the later epochs are still served locally
    assert rd["epochs"][2]["local"] >= 0.9 * N_FILES
    assert rd["digest"] == digest(contents)


@pytest.mark.slow
def test_order_file(tmp_path):
    from tiering.clairvoyant.samplers import SamplerSpec, epoch_orders
    data = tmp_path / "pfs"
    contents = dataset(data)
    rels = sorted(contents)
    lines = []
    for e, order in enumerate(epoch_orders(SamplerSpec(kind="random", seed=0), len(rels), 3)):
        if e:
            lines.append("")
        lines += [rels[i] for i in order]
    f = tmp_path / "order.txt"
    f.write_text("\n".join(lines) + "\n")
    stats, rd, r = run(tmp_path, data, profile(tmp_path), "--order-file", str(f), "--layout", "sorted")
    order = stats["order"]
    assert order["following"] and not order["diverged"], r.stderr
    assert order["matched_opens"] >= 0.95 * 3 * N_FILES
    assert rd["digest"] == digest(contents)


def test_plan_command_prints_a_table(tmp_path):
    data = tmp_path / "pfs"
    dataset(data, n=50)
    r = subprocess.run([PYTHON, "-m", "tiering", "plan", "--profile",
                        str(profile(tmp_path, capacity="600KiB", bandwidth="{1: 200, 4: 600}")),
                        "--data", str(data), "--sampler", "random", "--seed", "3", "--epochs", "2",
                        "--layout", "sorted"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("50 files")
    assert "ram hits" in lines[1] and "PFS bytes" in lines[1]
    assert [ln.split()[0] for ln in lines[2:4]] == ["1", "2"]
    assert lines[4].startswith("predicted seconds per epoch") and "reading the PFS directly" in lines[5]
    r = subprocess.run([PYTHON, "-m", "tiering", "plan", "--data", str(data)], capture_output=True, text=True)
    assert r.returncode == 2 and "give the order" in r.stderr


def test_plan_with_a_profile_that_gives_no_pfs_speed_says_the_seconds_are_not_modelled(tmp_path):
    """Without pfs.bandwidth the model would take a default speed for the
    PFS and predict the same seconds with and without tiering ("1.00x")."""
    data = tmp_path / "pfs"
    dataset(data, n=50)
    args = ["plan", "--profile", str(profile(tmp_path, bandwidth=None)), "--data", str(data), "--sampler", "random",
            "--seed", "3", "--epochs", "2", "--layout", "sorted"]
    r = subprocess.run([PYTHON, "-m", "tiering", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    why = ("the profile test gives no PFS speed (pfs.bandwidth: MB/s by reader threads; README, \"Writing a "
           "profile for a new cluster\", says how to measure it)")
    assert r.stdout.splitlines()[4:] == [f"predicted seconds per epoch: not modelled: {why}"]
    assert "faster" not in r.stdout and "1.00x" not in r.stdout
    r = subprocess.run([PYTHON, "-m", "tiering", *args, "--json"], capture_output=True, text=True, timeout=120)
    out = json.loads(r.stdout)
    assert out["predicted"] is None and out["not_modelled"] == why and len(out["epochs"]) == 2


BAD_ORDER_FILES = {
    "huge index.txt": (b"0\n1\n99999999999999999999999\n", "index 99999999999999999999999 is too large"),
    "a later epoch out of range.txt": (b"0\n1\n\n0\n50\n", "epoch 2 names index 50, but the data set has 50 samples"),
    "damaged header.npy": (b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', 'fortran_order': False, 'shape': (9999999999,)}"
                           .ljust(127) + b"\n" + b"\0" * 24, "its header says 9999999999 values of int64"),
    "junk header.npy": (b"\x93NUMPY\x01\x00\x10\x00{'descr': '<i8'\n" + b"\0" * 8, "a damaged .npy header"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BAD_ORDER_FILES))
def test_a_bad_order_file_stops_tier_run_and_plan_with_exit_2(tmp_path, name, reliability):
    data = tmp_path / "pfs"
    dataset(data, n=50)
    content, message = BAD_ORDER_FILES[name]
    order = tmp_path / name
    order.write_bytes(content)
    args = ["--profile", str(profile(tmp_path)), "--data", str(data), "--layout", "sorted", "--order-file", str(order)]
    marker = tmp_path / "ran"
    r = tier_run([*args, "--", PYTHON, "-c", f"open({str(marker)!r}, 'w')"])
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not marker.exists()
    reliability.survived(f"a bad order file ({name}): exit 2 before COMMAND")
    r = subprocess.run([PYTHON, "-m", "tiering", "plan", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
