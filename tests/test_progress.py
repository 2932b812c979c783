"""Following the reader: out-of-order opens, repeated opens, lost events,
divergence; and the hook feed's merge of several ranks."""
from __future__ import annotations

import json
import random
from pathlib import Path

from helpers import make_data
from tiering.catalog import scan
from tiering.clairvoyant.feeds import HookFeed
from tiering.clairvoyant.planner import Planner
from tiering.clairvoyant.progress import HISTORY, Progress


def tracker(orders: list[list[int]], window: int = 64) -> Progress:
    n = 1 + max(max(o) for o in orders)
    p = Planner([1000] * n, [10**9])
    for o in orders:
        p.extend(o)
    return Progress(p, window=window)


def test_in_order_opens_advance_the_reader():
    order = list(range(100))
    pr = tracker([order])
    for f in order:
        assert pr.on_open(f, pid=1) == f
    assert pr.planner.reader == 100 and pr.matched == 100 and pr.mismatched == 0


def test_workers_reading_out_of_order_within_the_window():
    rng = random.Random(1)
    order = list(range(1000))
    rng.shuffle(order)
    pr = tracker([order, order[::-1]])
    # two workers each take every other batch of 8 and finish them in any order
    seen = []
    for start in range(0, 1000, 32):
        chunk = order[start:start + 32]
        rng.shuffle(chunk)
        seen += chunk
    for k, f in enumerate(seen):
        assert pr.on_open(f, pid=10 + k % 2) is not None
    assert pr.planner.reader == 1000 and pr.mismatched == 0 and not pr.diverged


def test_a_sample_opened_twice_by_one_worker_is_one_position():
    order = list(range(50))
    pr = tracker([order, order])
    for f in order:
        assert pr.on_open(f, pid=7) is not None
        assert pr.on_open(f, pid=7) is None          # the same sample again
    assert pr.duplicates == 50 and pr.planner.reader == 50   # epoch 2 untouched


def test_lost_events_do_not_hold_the_reader_back():
    order = list(range(400))
    pr = tracker([order], window=32)
    for f in order:
        if f % 10 == 3:
            continue                                 # its event was dropped
        pr.on_open(f, pid=1)
    assert pr.planner.reader >= 400 - 32 and pr.skipped > 0


def test_another_order_is_noticed():
    rng = random.Random(2)
    announced = list(range(2000))
    rng.shuffle(announced)
    pr = tracker([announced], window=64)
    actual = list(range(2000))
    rng.shuffle(actual)
    for f in actual[:HISTORY + 10]:
        pr.on_open(f, pid=1)
    assert pr.diverged


def test_hook_feed_interleaves_the_local_ranks(tmp_path: Path):
    data = tmp_path / "d"
    make_data(data, {f"f{i}": 10 for i in range(8)})
    cat = scan([str(data)])
    orders = tmp_path / "orders"
    orders.mkdir()
    paths = [str(data / f"f{i}") for i in range(8)]
    msgs = []
    for rank, idx in ((0, [0, 2, 4, 6]), (1, [1, 3, 5, 7])):
        msgs.append({"kind": "dataset", "loader": 0, "rank": rank, "paths": paths})
        msgs.append({"kind": "epoch", "loader": 0, "rank": rank, "epoch": 0, "indices": idx, "next": None})
    for k, m in enumerate(msgs[:3]):   # rank 1's epoch message is late
        (orders / f"{k:03d}.json").write_text(json.dumps(m))
    feed = HookFeed(orders, cat)
    assert feed.poll(now=0.0) == []     # waiting for rank 1
    (orders / "003.json").write_text(json.dumps(msgs[3]))
    [(key, eo)] = feed.poll(now=0.1)
    assert key == 0 and eo.epoch == 0
    assert [cat.files[i].rel for i in eo.order] == [f"f{i}" for i in range(8)]
    # a rank that never reports does not hold the node forever
    (orders / "004.json").write_text(json.dumps(dict(msgs[1], epoch=1)))
    assert feed.poll(now=0.2) == []
    [(_, eo1)] = feed.poll(now=5.0)
    assert [cat.files[i].rel for i in eo1.order] == ["f0", "f2", "f4", "f6"]
