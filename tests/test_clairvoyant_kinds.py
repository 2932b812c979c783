"""Zero-code clairvoyance for the Dataset kinds people write
(tests/workloads/kinds.py): the hook reads the index -> file mapping from an
attribute or learns it from the tagged opens of epoch 1; from then on the
reads are followed, the files are served from the tiers, and the training
reads the same bytes and ends with the same weights and RNG state as without
tier-run.  The HF-style single file is served from RAM with --warm."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import PYTHON, USER, patched_tier_run, profile, read_line, running, tier_run, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftovers")]

KINDS = Path(__file__).resolve().parent / "workloads" / "kinds.py"
N = 80


def make_images(root: Path, masks: bool = False) -> None:
    rng = random.Random(7)
    for k in range(N):
        ident = 1000 + 7 * k
        for d in ("img", "mask") if masks else ("img",):
            (root / d).mkdir(parents=True, exist_ok=True)
            (root / d / f"{ident:08d}.bin").write_bytes(rng.randbytes(rng.randrange(500, 6000)))


def train(tmp: Path, data: Path, kind: str, *opts: str, workers: int = 2,
          extra: tuple[str, ...] = (), copies: int = 0, capacity: int | None = None,
          data_root: Path | None = None) -> tuple[dict, dict | None, str]:
    """The workload (with the workload's options extra) under tier-run (with
    opts) and on its own: (its result under tier-run, the JSON stats,
    tier-run's stderr); asserts the two trainings agree.  capacity: of the
    RAM tier, in bytes (1 GiB by default); data_root: tier-run's --data
    (data by default).  copies: after each
    epoch the workload waits until the RAM tier holds that many (the next
    epoch then shows what was placed, whatever the machine's speed)."""
    plain_out, out, stats = tmp / f"{kind}-plain.json", tmp / f"{kind}.json", tmp / f"{kind}-stats.json"
    args = [str(KINDS), "--kind", kind, "--data", str(data), "--workers", str(workers), "--epoch-pause", "0.5",
            "--epoch-copies", str(copies), *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TIERING_ORDER_DIR", "LD_PRELOAD")}
    r = subprocess.run([PYTHON, *args, "--out", str(plain_out)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    prof = profile(tmp) if capacity is None else profile(tmp, capacity=str(capacity))
    r = tier_run(["--profile", str(prof), "--data", str(data_root or data), "--stats-json", str(stats), *opts, "--",
                  PYTHON, *args, "--out", str(out)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got, plain = json.loads(out.read_text()), json.loads(plain_out.read_text())
    # the same bytes per index, the same weights and the same global RNG state
    for key in ("digest", "weights", "rng", "stats"):
        assert got[key] == plain[key], key
    return got, json.loads(stats.read_text()), r.stderr


def assert_followed(stats: dict, source: str, from_epoch: int, reads_per_epoch: int, err: str) -> None:
    order = stats["order"]
    assert order["mapping"]["source"] == source, err
    assert stats["policy"] == "clairvoyant" and order["following"] and not order["diverged"], err
    # every epoch from from_epoch on (1-based) was known, and the one after the last (predicted);
    # a learning epoch 1 is known too when the daemon re-planned it as its indices were learnt
    # before epoch 2's order came in (a fast reader with no workers may finish it first)
    assert 3 - from_epoch + 2 <= order["epochs_known"] <= 4, order
    # the opens of epochs 2 and 3 were followed (epoch 1's first opens race with its order, and a
    # DataLoader's workers prefetch 32 of these few samples at once)
    assert order["matched_opens"] >= 0.9 * 2 * reads_per_epoch, order
    assert order["unmatched_opens"] <= 0.05 * reads_per_epoch, order
    # the per-epoch table: three epochs, every open in one (those of a learning epoch 1 in epoch 1)
    assert [e["epoch"] for e in stats["epochs"]] == [1, 2, 3], stats["epochs"]
    assert sum(e["opens"] for e in stats["epochs"]) == 3 * reads_per_epoch


def assert_served_from_epoch_2(got: dict, reads_per_epoch: int) -> None:
    """Epochs 2+ read at least 95% from the tiers: the workload waited after
    each epoch until the job's RAM tier held the copies (only its own tier
    counts: a directory of an earlier job with the same pid once made the
    wait end early, docs/design.md NOTE [learnt mapping])."""
    epochs = got["epochs"]
    assert all(e["copies_waited"] for e in epochs[:-1]), epochs
    assert all(e["local"] >= 0.95 * reads_per_epoch for e in epochs[1:]), epochs


@pytest.mark.parametrize("kind,source", [("dicts", "attribute items"),
                                         ("frame", "attribute table['path']"),
                                         ("subset", "attribute items (Subset)")])
def test_a_mapping_read_from_an_attribute_is_followed_from_epoch_1(tmp_path, kind, source):
    data = tmp_path / "pfs"
    make_images(data)
    n = len([i for i in range(N) if i % 3 != 1]) if kind == "subset" else N   # Subset leaves every third out
    got, stats, err = train(tmp_path, data, kind, copies=n)
    assert stats["order"]["mapping"]["indices"] == n and stats["order"]["mapping"]["mapped"] == n
    assert_followed(stats, source, 1, n, err)
    assert_served_from_epoch_2(got, n)


@pytest.mark.parametrize("kind,workers", [("from-id", 2), ("dict-ids", 2), ("from-id", 0), ("subset-ids", 2)])
def test_a_path_built_in_getitem_is_learnt_in_epoch_1_and_followed_after(tmp_path, kind, workers):
    data = tmp_path / "pfs"
    make_images(data)
    n = len([i for i in range(N) if i % 3 != 1]) if kind == "subset-ids" else N
    got, stats, err = train(tmp_path, data, kind, workers=workers, copies=n)
    m = stats["order"]["mapping"]
    assert m["indices"] == n and m["mapped"] == n
    assert m["tagged_opens"] >= 3 * n      # every fetch of every epoch was tagged
    # the data set fits: each file copied once and kept (a copy made on first touch while the
    # learning epoch was planned is the plan's too)
    # every catalogued file once (those a Subset leaves out too: staged while the mapping was learnt,
    # NOTE [staging while waiting])
    assert stats["placement"]["evictions"] == 0 and stats["placement"]["copies"] == N, stats["placement"]
    assert_followed(stats, "learnt in epoch 1", 2, n, err)
    assert_served_from_epoch_2(got, n)


def test_indices_drawn_again_in_the_learning_epoch_are_planned_when_the_data_set_does_not_fit(tmp_path):
    """A sampler with replacement over a path-from-id data set three times
    the RAM tier: the indices learnt in epoch 1 are planned for their later
    positions in epoch 1 (tests/test_learning_epoch.py counts the reads
    served); the training reads the same bytes and ends with the same
    weights and RNG state as without tier-run."""
    data = tmp_path / "pfs"
    make_images(data)
    size = sum(-(-f.stat().st_size // 4096) * 4096 for f in (data / "img").iterdir())
    got, stats, err = train(tmp_path, data, "from-id", workers=0, extra=("--replacement", "--step-pause", "0.2"),
                            capacity=size // 3)
    order = stats["order"]
    assert order["mapping"]["source"] == "learnt in epoch 1", err
    assert stats["policy"] == "clairvoyant" and order["following"] and not order["diverged"], err
    # epoch 1 was planned as indices were learnt: its later opens were followed (a prefetch lead
    # was measured in it; without a plan in the learning epoch there is none)
    assert stats["epochs"][0]["prefetch_lead"] is not None, stats["epochs"]
    assert order["replans"] >= 2 and order["fetches"] >= 1, order


def test_a_validation_set_of_the_same_class_and_length_learns_apart(tmp_path):
    """The training set and a validation set read after each epoch are one
    class, one length, two directories: each learns its own mapping (the
    hook's tag space differs by the root attribute), so the training's
    indices map to its own files only."""
    data = tmp_path / "pfs"
    make_images(data / "train")
    make_images(data / "val")
    got, stats, err = train(tmp_path, data / "train", "from-id", workers=2, extra=("--val", str(data / "val")),
                            data_root=data)
    order = stats["order"]
    m = order["mapping"]
    assert m["source"] == "learnt in epoch 1" and m["mapped"] == N, err
    # the followed loader's space saw its own data set's opens only: one per index and epoch
    assert m["tagged_opens"] == 3 * N, m
    assert not order["gave_up"] and "share a tag space" not in err


def test_two_data_sets_that_nothing_tells_apart_are_not_learnt(tmp_path):
    """Training and validation sets keeping their paths in a dict (no string
    attribute differs) share the hook's tag space: the fetches of an index
    open a file of either directory, never both; the mapping is refused,
    placement falls back to first touch, and the job says why."""
    data = tmp_path / "pfs"
    make_images(data / "train")
    make_images(data / "val")
    got, stats, err = train(tmp_path, data / "train", "dict-ids", "-v", workers=2,
                            extra=("--val", str(data / "val")), data_root=data)
    order = stats["order"]
    assert order["gave_up"].startswith("two data sets share a tag space (one class, one length): index "), order
    assert "/pfs/train/img/" in order["gave_up"] and "/pfs/val/img/" in order["gave_up"]
    assert order["mapping"]["source"] == "none: " + order["gave_up"] and not order["following"]
    assert "policy first-touch (clairvoyant until the mapping was given up: two data sets" in err
    assert "order hook: two data sets share a tag space" in err      # -v


def test_a_mapping_learnt_by_a_pass_before_training_is_followed_from_the_first_training_epoch(tmp_path):
    """A sequential pass over the data set (its statistics) learns the
    mapping; the training's DataLoader over the same data set is then
    followed from its first epoch."""
    data = tmp_path / "pfs"
    make_images(data)
    got, stats, err = train(tmp_path, data, "from-id", extra=("--stats-pass",))
    assert got["stats"] is not None
    order = stats["order"]
    assert order["mapping"]["source"] == "learnt in epoch 1" and order["mapping"]["mapped"] == N, err
    assert stats["policy"] == "clairvoyant" and order["following"] and not order["diverged"], err
    # the three training epochs and the one predicted after them; the pass itself was not known
    assert order["epochs_known"] == 4, order
    # every training epoch's opens were followed, the first one's too
    assert order["matched_opens"] >= 0.9 * 3 * N, json.dumps([order, stats["epochs"]])
    assert order["unmatched_opens"] <= 0.05 * N, order
    # the pass is a row of its own before the three training epochs (NOTE [epoch rows])
    assert [e["opens"] for e in stats["epochs"]] == [N] * 4, stats["epochs"]
    assert f"  mapping  indices to files: learnt in epoch 1 ({N} of {N} indices)" in err


def test_a_dataloader_made_for_each_epoch_is_followed_and_reported_epoch_by_epoch(tmp_path):
    """A training script that makes a new DataLoader for each epoch: each
    one starts at its epoch 0.  The first teaches the mapping, the others
    are followed from their first open, and the report has one row per
    epoch (not one row of every open, as when their numbers were taken as
    they are, NOTE [epoch rows])."""
    data = tmp_path / "pfs"
    make_images(data)
    got, stats, err = train(tmp_path, data, "from-id", extra=("--loader-per-epoch",), copies=N)
    order = stats["order"]
    assert order["mapping"]["source"] == "learnt in epoch 1" and order["mapping"]["mapped"] == N, err
    assert stats["policy"] == "clairvoyant" and order["following"] and not order["diverged"], err
    assert [e["epoch"] for e in stats["epochs"]] == [1, 2, 3], stats["epochs"]
    assert [e["opens"] for e in stats["epochs"]] == [N] * 3, stats["epochs"]
    # the learning epoch: served from the tiers what the staging had copied before the reader came
    # (NOTE [staging while waiting]), by the machine's speed; the staging did copy
    assert order["staged"] > 0, order
    assert all(e["from_tiers"] >= 0.95 * N for e in stats["epochs"][1:]), stats["epochs"]
    assert_served_from_epoch_2(got, N)
    assert "      3 " in err and "... more epochs" not in err, err   # the summary's table has the three rows


@pytest.mark.parametrize("kind,source", [("pair-dict", "attribute table"), ("pair-lists", "attribute images + masks")])
def test_an_image_and_its_mask_read_from_attributes_are_both_followed_from_epoch_1(tmp_path, kind, source):
    """A dict of (image, mask) tuples, and two parallel lists: each index
    maps to both of its files from the attributes, not learnt (issue 34, 4)."""
    data = tmp_path / "pfs"
    make_images(data, masks=True)
    got, stats, err = train(tmp_path, data, kind, copies=2 * N)
    m = stats["order"]["mapping"]
    assert m["indices"] == N and m["mapped"] == N, m
    assert_followed(stats, source, 1, 2 * N, err)
    assert_served_from_epoch_2(got, 2 * N)


def test_an_index_reading_an_image_and_a_mask_maps_to_both(tmp_path):
    data = tmp_path / "pfs"
    make_images(data, masks=True)
    got, stats, err = train(tmp_path, data, "pairs", copies=2 * N)
    m = stats["order"]["mapping"]
    assert m["mapped"] == N
    assert_followed(stats, "learnt in epoch 1", 2, 2 * N, err)
    assert_served_from_epoch_2(got, 2 * N)     # both files of every index


def test_a_big_memory_mapped_file_is_served_from_ram_with_warm(tmp_path):
    data = tmp_path / "pfs"
    data.mkdir()
    (data / "table.arrow").write_bytes(random.Random(3).randbytes(4096 * 300))
    got, stats, err = train(tmp_path, data, "arrow")
    # without --warm: the file is staged in the background (NOTE [staging while waiting]), served from
    # RAM when its copy landed before its open; else the summary says --warm helps
    served = stats["opens"]["by_tier"]["ram"]
    assert got["arrow_local"] is (served == 1) and served + stats["opens"]["pfs"] == 1
    assert stats["warm"] is None
    assert any("none served" in w and "--warm" in w for w in stats["warnings"]) is (served == 0)
    got, stats, err = train(tmp_path, data, "arrow", "--warm")
    assert got["arrow_local"] is True, err
    assert stats["opens"]["by_tier"]["ram"] == 1 and stats["opens"]["pfs"] == 0
    assert stats["warm"]["files"] == 1 and stats["warm"]["bytes"] == 4096 * 300
    assert stats["warm"]["percent"] == 100 and stats["warm"]["order"] == "catalog order"
    assert "warm-up: 1 files (1.2 MiB) in the tiers, catalog order" in err
    assert stats["order"]["mapping"]["source"].startswith("none: no attribute of Arrow lists one file per index")
    # said once, while the job ran, and in the summary
    assert err.count("no catalogued file was opened inside dataset[i] in epoch 1") == 2, err
    assert not stats["warnings"]


def test_ctrl_c_during_the_warm_up_stops_before_command_and_cleans_up(tmp_path):
    """The copies are made to last until the daemon stops (as a copy of a big
    file reads chunk after chunk): SIGINT must end the warm-up, the copies,
    and tier-run, before COMMAND ran."""
    data = tmp_path / "pfs"
    make_images(data)
    driver = patched_tier_run("from tiering.placement.daemon import Daemon\n"
                              "def slow_copy(self, src, f, t):\n"
                              "    sys.stdout.write('copying\\n')   # one write: the copy threads' lines do not mix\n"
                              "    sys.stdout.flush()\n"
                              "    self._stop.wait(600)\n"
                              "    return None\n"
                              "def slow_batch(self, ids, t, done):\n"
                              "    slow_copy(self, None, None, t)\n"
                              "Daemon._copy = slow_copy\n"
                              "Daemon._copy_many = slow_batch\n")
    marker = tmp_path / "ran"
    with running([PYTHON, "-c", driver, "--profile", str(profile(tmp_path)), "--data", str(data),
                  "--warm", "50", "--", "touch", str(marker)]) as p:
        assert read_line(p.stdout) == b"copying\n"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=300)
    assert p.returncode == 130, err
    assert b"tier-run: interrupted by SIGINT before COMMAND started" in err and b"Traceback" not in err
    assert not marker.exists()
    # the tiers are removed in the background after tier-run exits
    wait_for(lambda: not [d for d in os.listdir("/dev/shm") if d.startswith(f"tiering-{USER}-{p.pid}-")],
             "the removal of the job's directories")


def test_the_workload_waits_for_its_own_jobs_copies_only(tmp_path):
    """A directory of an earlier job whose pid was the same (pid numbers are
    reused; a remover takes a dead job's directory over while it deletes it)
    holds copies too: the wait must not count them (epoch 2 would begin
    before this job's copies landed)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("kinds_under_test", KINDS)
    assert spec is not None and spec.loader is not None
    kinds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kinds)
    from tiering.rundirs import start_ticks
    me = os.getpid()
    for name, owner, files in (("mine", {"pid": me, "start": start_ticks(me)}, 3),
                               ("earlier", {"pid": me, "start": -1}, 80),
                               ("removed", {"pid": 1, "start": start_ticks(1)}, 80)):
        d = tmp_path / f"tiering-{USER}-{me}-{name}"
        (d / "data" / "0").mkdir(parents=True)
        (d / "owner.json").write_text(json.dumps(owner))
        for k in range(files):
            (d / "data" / "0" / f"{k}.bin").write_bytes(b"x")
    assert kinds.job_tiers(me, str(tmp_path)) == [str(tmp_path / f"tiering-{USER}-{me}-mine" / "data")]
    assert kinds.wait_copies(3, 0.0, me, str(tmp_path)) is True
    assert kinds.wait_copies(4, 0.0, me, str(tmp_path)) is False
