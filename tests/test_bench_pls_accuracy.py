"""The PLS accuracy benchmark (bench/pls_accuracy.py): its smallest
configuration in-process, the samples each emulated rank trained on against
the sampler's own orders, and the report made again from the committed results."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench import pls_accuracy as acc
from helpers import REPO, report_from_results
from tiering.samplers import PartialLocalShuffleSampler

RESULTS = REPO / "bench" / "results"


@pytest.fixture(scope="module")
def data():
    torch.set_num_threads(1)      # as the benchmark runs: small tensors, one thread is the fastest
    return acc.load()


def test_the_training_set_is_sorted_by_label_and_the_split_is_fixed(data):
    train, x_te, y_te = data
    y = train.tensors[1]
    assert len(train) + len(y_te) == 1797 and len(y_te) == 540
    assert bool((y[1:] >= y[:-1]).all()) and set(y.tolist()) == set(range(10))
    again = acc.load()
    assert torch.equal(again[0].tensors[0], train.tensors[0]) and torch.equal(again[2], y_te)


@pytest.mark.parametrize("sampler", ["pls-0.3", "pls-0", "global"])
def test_each_emulated_rank_trains_on_the_samplers_indices(data, sampler):
    setup = acc.Setup(world=4, epochs=2, seeds=[0])
    out = acc.train("cnn-bn", sampler, 3, setup, data, record=True)
    assert len(out["accuracy"]) == 2 and all(0 <= a <= 1 for a in out["accuracy"])
    train = data[0]
    for epoch, ranks in enumerate(out["trained"]):
        assert len(ranks) == 4
        for rank, seen in enumerate(ranks):
            if sampler == "global":
                s = torch.utils.data.DistributedSampler(train, num_replicas=4, rank=rank, shuffle=True, seed=3)
            else:
                s = PartialLocalShuffleSampler(train, num_replicas=4, rank=rank, fraction=float(sampler[4:]),
                                               seed=3, partition="contiguous")
            s.set_epoch(epoch)
            assert seen == list(s), (epoch, rank)
    if sampler == "pls-0":     # local shuffling: rank 0 holds the first block, the lowest labels, every epoch
        labels = train.tensors[1]
        assert sorted(out["trained"][1][0]) == list(range(len(out["trained"][1][0])))
        assert set(labels[out["trained"][1][0]].tolist()) <= {0, 1, 2}


def test_run_gives_one_row_per_configuration_with_its_summary(data):
    setup = acc.Setup(world=4, epochs=2, seeds=[0, 1], target=0.5)
    res = acc.run(setup, ["cnn"], ["pls-0.1"], 0, 4)
    assert [(r["model"], r["sampler"]) for r in res["runs"]] == [("cnn", "pls-0.1")]
    for r in res["runs"]:
        assert len(r["accuracy"]) == 2 and all(len(a) == 2 for a in r["accuracy"])
        assert r["final_min"] <= r["final_mean"] <= r["final_max"]
        assert r["epochs_to_target"] == [acc.first_reaching(a, 0.5) for a in r["accuracy"]]
        assert r["reached"] == sum(e is not None for e in r["epochs_to_target"])
    assert "gloo_check" not in res and json.loads(json.dumps(res)) == res
    assert "| cnn | PLS Q = 0.1 |" in acc.table(res)


def test_first_reaching_says_not_reached():
    assert acc.first_reaching([0.5, 0.96, 0.9], 0.95) == 2
    assert acc.first_reaching([0.5, 0.9], 0.95) is None
    assert acc._epochs({"reached": 0, "epochs_to_target": [None]}, 1) == "not reached"


def test_the_report_is_made_from_the_results_and_is_the_readme_table(tmp_path: Path):
    res = report_from_results("pls_accuracy", "pls-accuracy", tmp_path)
    assert {(x["model"], x["sampler"]) for x in res["runs"]} == {(m, s) for m in acc.MODELS for s in acc.SAMPLERS}
    assert len(res["setup"]["seeds"]) >= 5 and res["setup"]["world"] == 16
    g = res["gloo_check"]
    assert g["world"] == 16 and g["integer_tensors_equal"] and g["max_abs_diff"] < 1e-4
