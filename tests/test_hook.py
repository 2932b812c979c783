"""The zero-code order hook: the training sees exactly the same batches and
random numbers with it as without it, and the daemon gets the real order."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import tiering
from helpers import PYTHON, make_data
from tiering.catalog import scan
from tiering.clairvoyant.feeds import HookFeed

pytestmark = pytest.mark.slow   # each test trains a small model twice

HOOK_DIR = Path(tiering.__file__).resolve().parent / "hook"

TRAIN = Path(__file__).resolve().parent / "workloads" / "train_hooked.py"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hookdata")
    make_data(root, {f"c{i % 3}/f{i:03d}.bin": 10 + i for i in range(37)})
    return root


def train(data: Path, tmp: Path, hooked: bool, *args: str, extra_env: dict[str, str] | None = None) -> tuple[dict, list[dict]]:
    out = tmp / ("hooked.json" if hooked else "plain.json")
    orders = tmp / "orders"
    orders.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TIERING_ORDER_DIR")}
    if hooked:
        env["PYTHONPATH"] = str(HOOK_DIR)
        env["TIERING_ORDER_DIR"] = str(orders)
    env.update(extra_env or {})
    r = subprocess.run([PYTHON, str(TRAIN), "--data", str(data), "--out", str(out), *args],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    msgs = [json.loads(p.read_text()) for p in sorted(orders.glob("*.json"))] if hooked else []
    return json.loads(out.read_text()), msgs


CASES = [
    ("random", "--workers", "0"),
    ("random", "--workers", "2"),
    ("random", "--workers", "2", "--persistent"),
    ("global", "--workers", "0"),
    ("global", "--workers", "2"),
    ("distributed", "--workers", "0", "--drop-last"),
    ("sequential", "--workers", "0"),
    ("random", "--workers", "0", "--max-batches", "3"),
    ("global", "--workers", "2", "--max-batches", "3"),
]


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c) for c in CASES])
def test_same_batches_weights_and_rng_with_and_without_the_hook(data, tmp_path, case):
    sampler, *rest = case
    args = ["--sampler", sampler, *rest]
    plain, _ = train(data, tmp_path, False, *args)
    hooked, msgs = train(data, tmp_path, True, *args)
    assert hooked == plain                      # batches, weights and global RNG state
    # what was published is what the training read
    datasets = [m for m in msgs if m["kind"] == "dataset"]
    epochs = [m for m in msgs if m["kind"] == "epoch"]
    assert len(datasets) == 1
    paths = datasets[0]["paths"]
    assert paths == sorted(os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs)
    assert [m["epoch"] for m in epochs] == [0, 1, 2]
    early = "--max-batches" in rest
    for m, ep in zip(epochs, plain["batches"]):
        read = [i for b in ep for i in b]
        assert (m["indices"][:len(read)] if early else m["indices"]) == read
    # the next epoch is predicted exactly when no global RNG is involved (and
    # the epoch runs to its end: a sampler left early skips its last draw)
    for m, nxt in zip(epochs, plain["batches"][1:]):
        if sampler == "global":
            assert m["next"] is None
        elif not early:
            assert m["next"] == [i for b in nxt for i in b]


def test_a_dataset_without_a_file_list_is_reported(data, tmp_path):
    plain, _ = train(data, tmp_path, False, "--no-samples")
    hooked, msgs = train(data, tmp_path, True, "--no-samples")
    assert hooked == plain
    # no shim here: the mapping can be neither read nor learnt, and the message says why
    (ds,) = [m for m in msgs if m["kind"] == "dataset"]
    assert ds["paths"] is None and ds["learn"] is None
    assert ds["why"] == ("no attribute of Files lists one file per index; cannot learn it: "
                         "the shim's tiering_set_tag is not loaded in COMMAND")


def test_a_custom_sampler_is_left_alone(data, tmp_path):
    plain, _ = train(data, tmp_path, False, "--sampler", "custom")
    hooked, msgs = train(data, tmp_path, True, "--sampler", "custom")
    assert hooked == plain                      # its RNG and state were not shared with a copy
    errors = [m for m in msgs if m["kind"] == "error"]
    assert len(errors) == 1 and "Shuffled is not one of torch's" in errors[0]["message"]
    assert not [m for m in msgs if m["kind"] == "epoch"]


def test_feed_turns_messages_into_catalog_orders(data, tmp_path):
    _, msgs = train(data, tmp_path, True, "--sampler", "random", "--workers", "0")
    cat = scan([str(data)])
    orders = tmp_path / "feed"
    orders.mkdir()
    for k, m in enumerate(msgs):
        (orders / f"{k:04d}.json").write_text(json.dumps(m))
    feed = HookFeed(orders, cat)
    got = feed.poll()
    assert [eo.epoch for _, eo in got] == [0, 1, 2]
    paths = [m for m in msgs if m["kind"] == "dataset"][0]["paths"]
    rel = {os.path.relpath(p, data): i for i, p in enumerate(paths)}
    for (_, eo), m in zip(got, [m for m in msgs if m["kind"] == "epoch"]):
        assert [cat.files[c].rel for c in eo.order] == [os.path.relpath(paths[i], data) for i in m["indices"]]
    assert feed.main == 0 and list(orders.iterdir()) == []
    assert len(rel) == len(cat.files)


def test_an_existing_sitecustomize_still_runs(data, tmp_path):
    other = tmp_path / "site"
    other.mkdir()
    marker = tmp_path / "marker"
    (other / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    orders = tmp_path / "orders"
    orders.mkdir()
    env = dict(os.environ, PYTHONPATH=f"{HOOK_DIR}{os.pathsep}{other}", TIERING_ORDER_DIR=str(orders))
    r = subprocess.run([PYTHON, "-c", "import sys; print('sitecustomize' in sys.modules)"], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "True"
    assert marker.read_text() == "ran"
