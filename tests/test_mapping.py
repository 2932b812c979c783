"""Index -> file mappings (NOTE [learnt mapping]): the order hook's search
over a data set's attributes, the daemon's check of what it found, and the
mapping learnt from tagged opens, turned into epoch orders by the feed."""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

import tiering
from helpers import PlaceEach, make_data
from tiering.catalog import scan
from tiering.clairvoyant.feeds import HookFeed
from tiering.clairvoyant.mapping import MAX_FILES, TAG_BITS, IndexMap, Learner, check_attribute

HOOK = Path(tiering.__file__).resolve().parent / "hook" / "sitecustomize.py"


@pytest.fixture(scope="module")
def hook():
    """The hook's module, loaded without an order directory (it patches nothing)."""
    old = os.environ.pop("TIERING_ORDER_DIR", None)
    try:
        spec = importlib.util.spec_from_file_location("tiering_hook_under_test", HOOK)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if old is not None:
            os.environ["TIERING_ORDER_DIR"] = old
    return module


# -- the daemon's side ---------------------------------------------------------

def test_index_map_orders_several_files_per_index_and_skips_unmapped():
    m = IndexMap(np.array([0, 2, 2, 3, 6]), np.array([10, 11, 20, 30, 31, 32]))
    assert len(m) == 4 and m.mapped == 3
    assert m.order(np.array([3, 0, 1, 2, 7, -1])).tolist() == [30, 31, 32, 10, 11, 20]
    one = IndexMap.one_each(np.array([5, -1, 7]))
    assert one.order(np.array([2, 1, 0])).tolist() == [7, 5]


def test_learner_keeps_distinct_files_per_index_in_open_order():
    lr = Learner(4)
    assert lr.learn(np.array([2, 2, 0, 2, 9]), np.array([5, 6, 1, 5, 3])) == 3   # index 9 is out of range
    assert lr.learn(np.array([2, 0]), np.array([5, 1])) == 0                        # known pairs
    assert lr.learnt == 2 and lr.opens == 6
    assert lr.index_map().order(np.array([0, 1, 2, 3])).tolist() == [1, 5, 6]
    lr.learn(np.full(MAX_FILES + 3, 3), np.arange(100, 100 + MAX_FILES + 3))
    assert lr.index_map().order(np.array([3])).tolist() == list(range(100, 100 + MAX_FILES))


def test_a_mapping_read_from_an_attribute_must_name_distinct_catalogued_files():
    assert check_attribute(np.arange(5)) is None
    assert "not catalogued" in check_attribute(np.array([0, 1, -1]))
    assert check_attribute(np.array([0, 1, 1])) == "several indices name the same file"


@pytest.fixture
def catalog(tmp_path):
    root = tmp_path / "data"
    make_data(root, {f"f{i}.bin": 10 for i in range(6)})
    return root, scan([str(root)])


def message(d: Path, name: str, msg: dict) -> None:
    (d / f"{name}.json").write_text(json.dumps(msg))


def feed_of(tmp: Path, cat) -> tuple[HookFeed, Path, dict[str, int]]:
    """A feed over an empty order directory: (it, the directory, catalog id by relative path)."""
    d = tmp / "orders"
    d.mkdir()
    return HookFeed(d, cat), d, {f.rel: k for k, f in enumerate(cat.files)}


def test_feed_learns_the_mapping_in_epoch_1_and_orders_the_next_epochs(tmp_path, catalog):
    root, cat = catalog
    feed, d, ids = feed_of(tmp_path, cat)
    space = 9
    message(d, "0", {"kind": "dataset", "loader": 0, "paths": None, "how": None,
                     "why": "no attribute of X lists one file per index", "learn": {"space": space, "length": 3}})
    message(d, "1", {"kind": "epoch", "loader": 0, "epoch": 0, "indices": [2, 0, 1], "next": [1, 2, 0]})
    assert feed.poll() == []                      # nothing learnt yet: first touch
    # index i opens f{2i}.bin then f{2i+1}.bin
    opened = [(i, f"f{2 * i + k}.bin") for i in (2, 0, 1) for k in (0, 1)]
    files = np.array([ids[rel] for _, rel in opened])
    tags = np.array([(space << TAG_BITS) | (i + 1) for i, _ in opened])
    other = np.array([(3 << TAG_BITS) | 1])       # another data set's tag space: ignored
    assert feed.learn(np.concatenate([files, files[:1]]), np.concatenate([tags, other])) == []
    message(d, "2", {"kind": "epoch", "loader": 0, "epoch": 1, "indices": [1, 2, 0], "next": [0, 1, 2]})
    assert feed.poll() == []                      # waits for the opens drained after it was read
    (key, eo), = feed.learn(np.zeros(0, np.int64), np.zeros(0, np.int64)) or feed.poll()
    rel = [cat.files[i].rel for i in eo.order]
    assert eo.epoch == 1 and rel == ["f2.bin", "f3.bin", "f4.bin", "f5.bin", "f0.bin", "f1.bin"]
    assert [cat.files[i].rel for i in eo.next] == [f"f{i}.bin" for i in range(6)]
    assert feed.main == 0
    assert feed.mapping() == {"source": "learnt in epoch 1", "indices": 3, "mapped": 3, "tagged_opens": 6}


def test_a_mapping_learnt_by_an_earlier_pass_orders_the_next_loaders_first_epoch(tmp_path, catalog):
    """A pass over the data set before training (its mean and std, a sanity
    check) learns the mapping; the training's own DataLoader over the same
    data set then announces its first epoch: known as soon as it is
    announced, and that loader, the one reading now, is followed."""
    root, cat = catalog
    feed, d, ids = feed_of(tmp_path, cat)
    space = 9
    learn = {"space": space, "length": 6}
    message(d, "0", {"kind": "dataset", "loader": 0, "paths": None, "how": None, "why": "no attribute",
                     "learn": learn})
    message(d, "1", {"kind": "epoch", "loader": 0, "epoch": 0, "indices": list(range(6)), "next": list(range(6))})
    assert feed.poll() == []                      # the statistics pass: nothing learnt yet
    files = np.array([ids[f"f{i}.bin"] for i in range(6)])
    feed.learn(files, np.array([(space << TAG_BITS) | (i + 1) for i in range(6)]))
    message(d, "2", {"kind": "dataset", "loader": 1, "paths": None, "how": None, "why": "no attribute",
                     "learn": learn})
    message(d, "3", {"kind": "epoch", "loader": 1, "epoch": 0, "indices": [5, 3, 1, 0, 2, 4], "next": None})
    got = feed.poll() + feed.learn(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert [(key, eo.epoch) for key, eo in got] == [(1, 0)]
    assert [cat.files[i].rel for i in got[0][1].order] == [f"f{i}.bin" for i in (5, 3, 1, 0, 2, 4)]
    assert feed.main == 1
    # the statistics pass again (an evaluation on the training set): it is the one read now
    message(d, "4", {"kind": "epoch", "loader": 0, "epoch": 1, "indices": list(range(6)), "next": None})
    got = feed.poll() + feed.learn(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert [(key, eo.epoch) for key, eo in got] == [(0, 1)] and feed.main == 0


class Tiers(PlaceEach):
    """The daemon's side of placement, for a policy under test: copies land when told."""

    def __init__(self, files: int):
        self.sizes = [4096] * files
        self.capacities = [1 << 30]
        self.stopping = False
        self.pending: list[int] = []
        self.evicted: list[int] = []

    def where(self, i: int) -> int:
        return -1

    def placeable(self, i: int) -> bool:
        return i not in self.pending

    def free(self, tier: int) -> int:
        return 1 << 30

    def fastest_with_room(self, i: int) -> int | None:
        return 0

    def place(self, i: int, tier: int) -> bool:
        self.pending.append(i)
        return True

    def evict(self, i: int) -> bool:
        self.evicted.append(i)
        return False

    def placements(self):
        return iter([(i, 0) for i in self.pending])

    def copies_in_flight(self) -> int:
        return len(self.pending)


def test_an_epoch_planned_from_a_partly_learnt_mapping_copies_the_other_files_on_first_touch(tmp_path, catalog):
    """A short pass before training (a few batches) learnt indices 0 and 1:
    the training's epoch 1 prefetches their files, and the files of the
    indices nobody has read yet are still copied when first opened."""
    from tiering.clairvoyant.policy import Clairvoyant
    root, cat = catalog
    feed, d, ids = feed_of(tmp_path, cat)
    space, learn = 9, {"space": 9, "length": 6}
    tiers = Tiers(6)
    policy = Clairvoyant(tiers, feed)  # type: ignore[arg-type]
    policy._stage_fits = False   # first touch alone here (the staging: tests/test_staging_while_waiting.py)
    message(d, "0", {"kind": "dataset", "loader": 0, "paths": None, "how": None, "why": "-", "learn": learn})
    message(d, "1", {"kind": "epoch", "loader": 0, "epoch": 0, "indices": list(range(6)), "next": None})
    policy.poll()
    f = [ids[f"f{i}.bin"] for i in range(6)]
    tag = [(space << TAG_BITS) | (i + 1) for i in range(6)]
    policy.on_tagged(np.array(f[:2]), np.array(tag[:2]))       # the pass reads indices 0 and 1
    policy.on_opens(np.array(f[:2]), np.zeros(2, bool), np.array([7, 7]))
    assert tiers.pending == f[:2]                               # first touch: no order yet
    message(d, "2", {"kind": "dataset", "loader": 1, "paths": None, "how": None, "why": "-", "learn": learn})
    message(d, "3", {"kind": "epoch", "loader": 1, "epoch": 0, "indices": [5, 3, 1, 0, 2, 4], "next": None})
    policy.poll()
    assert policy.following and policy.report()["epochs_known"] == 1
    for i in (5, 3, 1, 0, 2, 4):                                # the training's epoch 1
        policy.on_tagged(np.array([f[i]]), np.array([tag[i]]))
        policy.on_opens(np.array([f[i]]), np.array([False]), np.array([8]))
    assert sorted(tiers.pending) == sorted(f)                   # every file copied, none twice
    assert len(tiers.pending) == 6
    for i in tiers.pending:                                     # the copies land: the plan keeps them all
        policy.on_placed(i, 0)
    assert tiers.evicted == []
    assert policy.planner is not None and sorted(policy.planner.resident) == sorted(f)


def test_feed_learns_when_the_attribute_names_other_files(tmp_path, catalog):
    root, cat = catalog
    d = tmp_path / "orders"
    d.mkdir()
    feed = HookFeed(d, cat)
    message(d, "0", {"kind": "dataset", "loader": 0, "paths": ["/elsewhere/a", "/elsewhere/b"], "how": "labels",
                     "why": None, "learn": {"space": 4, "length": 2}})
    feed.poll()
    m = feed.mapping()
    assert m["source"].startswith("none: attribute labels: its files (e.g. /elsewhere/a) are not under any --data")
    message(d, "1", {"kind": "dataset", "loader": 1, "paths": [str(root / "f0.bin")], "how": "x",
                     "why": None, "learn": None})
    feed.poll()
    assert feed.errors == []
    assert feed.mapping()["source"] == "attribute x" and feed.main == 1


def test_feed_maps_every_file_an_index_names(tmp_path, catalog):
    """Paths of several files per index (an image and its mask): the mapping
    holds each index's files in order, a file named twice in one index once."""
    root, cat = catalog
    feed, d, ids = feed_of(tmp_path, cat)
    p = [str(root / f"f{i}.bin") for i in range(6)]
    message(d, "0", {"kind": "dataset", "loader": 0, "paths": [[p[0], p[3]], [p[1], p[4], p[1]], p[2]],
                     "how": "images + masks", "why": None, "learn": None})
    feed.poll()
    assert feed.errors == [] and feed.mapping()["source"] == "attribute images + masks"
    m = feed.loaders[0].maps_by_rank[0]
    assert m.offsets.tolist() == [0, 2, 4, 5]
    assert m.files.tolist() == [ids["f0.bin"], ids["f3.bin"], ids["f1.bin"], ids["f4.bin"], ids["f2.bin"]]
    assert m.order(np.array([2, 0])).tolist() == [ids["f2.bin"], ids["f0.bin"], ids["f3.bin"]]


# -- the hook's side -------------------------------------------------------------

class Plain:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)
        self.n = len(next(iter(attrs.values())))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def test_hook_finds_the_one_attribute_that_lists_files(hook, tmp_path):
    paths = [f"/d/img/{i:03d}.jpg" for i in range(300)]
    ds = Plain(records=[{"image": p, "label": i % 3} for i, p in enumerate(paths)], labels=[i % 3 for i in range(300)],
               names=[f"n{i}" for i in range(300)])
    assert hook._paths_of(ds) == ("records", paths)
    ds = Plain(by_index={i: (p, i) for i, p in enumerate(paths)})
    assert hook._paths_of(ds) == ("by_index", paths)
    ds = Plain(samples=[(p, 0) for p in paths], imgs=None)
    ds.imgs = ds.samples                       # ImageFolder: one list under two names
    assert hook._paths_of(ds)[0] == "samples"
    ds = Plain(relpaths=["img/a.png", "img/b.png"], files=["/d/img/a.png", "/d/img/b.png"])
    assert hook._paths_of(ds) == ("files", ["/d/img/a.png", "/d/img/b.png"])   # a known name wins
    class WithProperty(Plain):
        @property
        def paths(self):
            return [f"/d/{i}.jpg" for i in range(self.n)]

    assert hook._paths_of(WithProperty(ids=[1, 2])) == ("paths", ["/d/0.jpg", "/d/1.jpg"])
    ds = Plain(files=["rel/a.png", "rel/b.png"])
    assert hook._paths_of(ds)[1] == [os.path.abspath("rel/a.png"), os.path.abspath("rel/b.png")]


def test_hook_finds_a_dataframe_column(hook):
    import pandas as pd
    df = pd.DataFrame({"label": [1, 2, 3], "file": ["/d/a.jpg", "/d/b.jpg", "/d/c.jpg"]})
    assert hook._paths_of(Plain(df=df)) == ("df['file']", ["/d/a.jpg", "/d/b.jpg", "/d/c.jpg"])
    assert hook._paths_of(Plain(s=df["file"]))[0] == "s"


def test_hook_maps_pairs_of_files_and_parallel_lists_to_every_file_of_an_index(hook):
    """A list (or dict) of (image, mask) tuples and two index-aligned lists:
    each index names both of its files, in the attributes' order."""
    both = [["/d/a.jpg", "/d/a.png"], ["/d/b.jpg", "/d/b.png"]]
    assert hook._paths_of(Plain(images=["/d/a.jpg", "/d/b.jpg"], masks=["/d/a.png", "/d/b.png"])) == (
        "images + masks", both)
    assert hook._paths_of(Plain(pairs=[("/d/a.jpg", "/d/a.png"), ("/d/b.jpg", "/d/b.png")])) == ("pairs", both)
    assert hook._paths_of(Plain(table={0: ("/d/a.jpg", 3, "/d/a.png"), 1: ("/d/b.jpg", 4, "/d/b.png")})) == (
        "table", both)
    assert hook._paths_of(Plain(samples=[("/d/a.jpg", 0), ("/d/b.jpg", 1)])) == ("samples", ["/d/a.jpg", "/d/b.jpg"])


@pytest.mark.parametrize("attrs,why", [
    ({"by_id": {"a": "/d/a.jpg", "b": "/d/b.jpg"}}, "no attribute of Plain lists one file per index"),
    ({"ids": ["n01440764", "n01443537"]}, "no attribute of Plain lists one file per index"),
])
def test_hook_leaves_ambiguous_or_unaligned_attributes_to_learning(hook, attrs, why):
    with pytest.raises(hook._NoMapping, match=why):
        hook._paths_of(Plain(**attrs))


def test_hook_maps_a_subset_and_a_concat_through_their_data_sets(hook):
    from torch.utils.data import ConcatDataset, Subset
    a = Plain(files=["/d/a.jpg", "/d/b.jpg", "/d/c.jpg"])
    b = Plain(paths=["/e/x.jpg", "/e/y.jpg"])
    assert hook._paths_of(Subset(a, [2, 0])) == ("files (Subset)", ["/d/c.jpg", "/d/a.jpg"])
    assert hook._paths_of(ConcatDataset([a, b])) == ("files + paths (ConcatDataset)",
                                                     ["/d/a.jpg", "/d/b.jpg", "/d/c.jpg", "/e/x.jpg", "/e/y.jpg"])


def test_hook_says_why_a_mapping_cannot_be_learnt(hook):
    class Batched(Plain):
        def __getitems__(self, idx):
            return list(idx)

    msg = hook._mapping_message(Batched(ids=[1, 2]))
    assert msg["paths"] is None and msg["learn"] is None
    assert msg["why"] == ("no attribute of Batched lists one file per index; cannot learn it: "
                          "Batched fetches whole batches (__getitems__)")
    # the tag space is the same in every process: from the class and the length
    assert hook._space(Plain(ids=[1, 2]), 2) == hook._space(Plain(other=[3, 4]), 2)


def test_opens_before_a_later_epochs_order_count_in_the_epoch_before():
    from tiering.observe.epochs import EpochLog
    log = EpochLog(clock=lambda: 1.0)
    for _ in range(3):
        log.opened(None, False, 10)                  # epoch 0, learning: no order yet
    log.opened_many(np.array([1, 1]), np.array([True, True]), np.array([10, 10]))
    assert [(r["epoch"], r["opens"], r["from_tiers"]) for r in log.records()] == [(0, 3, 0), (1, 2, 2)]
    log = EpochLog(clock=lambda: 1.0)
    log.opened(None, False, 10)                      # the first epoch's order came late
    log.opened_many(np.array([0]), np.array([True]), np.array([10]))
    assert [(r["epoch"], r["opens"]) for r in log.records()] == [(0, 2)]


def test_the_tag_space_tells_data_sets_of_one_class_apart_by_their_string_attributes(hook):
    """Two data sets of one class and length over other directories (a
    training and a validation set) learn in spaces of their own; a worker's
    copy (fork, or spawn: pickled) computes the same space as the main
    process, with no message between them."""
    import pickle

    import torch.utils.data as tud
    train, val = Plain(ids=[1, 2, 3], root="/pfs/train"), Plain(ids=[1, 2, 3], root=Path("/pfs/val"))
    assert hook._space(train, 3) != hook._space(val, 3)
    assert hook._space(pickle.loads(pickle.dumps(val)), 3) == hook._space(val, 3)
    assert hook._space(tud.Subset(train, [0, 1]), 2) != hook._space(tud.Subset(val, [0, 1]), 2)
    assert hook._space(Plain(ids=[4, 5, 6], root="/pfs/train"), 3) == hook._space(train, 3)   # same files
