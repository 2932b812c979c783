"""Following the reader: out-of-order opens, repeated opens, lost events,
divergence; and the hook feed's merge of several ranks."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

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


# -- batches and lost events ------------------------------------------------------

def reader_events(order: list[int], threads: int = 8, chunk: int = 64, seed: int = 0) -> tuple[list[int], list[int]]:
    """Opens as `threads` DataLoader-like workers make them: each takes the
    next `chunk` positions and reads them in order, the workers interleaved
    at random; returns (files, pids)."""
    rng = random.Random(seed)
    chunks = [order[k:k + chunk] for k in range(0, len(order), chunk)]
    files, pids = [], []
    running: dict[int, list[int]] = {}
    nxt = 0
    while nxt < len(chunks) or running:
        for t in range(threads):
            if t not in running and nxt < len(chunks):
                running[t] = list(chunks[nxt])
                nxt += 1
        t = rng.choice(sorted(running))
        files.append(running[t].pop(0))
        pids.append(100 + t)
        if not running[t]:
            del running[t]
    return files, pids


def feed(pr: Progress, files: list[int], pids: list[int], batch: int) -> None:
    for k in range(0, len(files), batch):
        pr.on_opens(np.array(files[k:k + batch]), np.array(pids[k:k + batch]))


@pytest.mark.slow
def test_batches_match_like_single_opens():
    rng = random.Random(3)
    order = list(range(3000))
    rng.shuffle(order)
    second = rng.sample(order, len(order))
    files, pids = reader_events(order + second)
    one = tracker([order, second], window=1024)
    for f, pid in zip(files, pids):
        one.on_open(f, pid)
    batched = tracker([order, second], window=1024)
    feed(batched, files, pids, 500)
    for pr in (one, batched):
        assert pr.matched == 6000 and pr.mismatched == 0 and pr.planner.reader == 6000


def test_a_repeated_file_in_one_batch_matches_its_next_use():
    pr = tracker([[0, 1, 2, 0, 3]])
    got = pr.on_opens(np.array([0, 1, 2, 0, 3]), np.array([1, 2, 3, 4, 5]))
    assert got.tolist() == [0, 1, 2, 3, 4] and pr.planner.reader == 5
    pr = tracker([[0, 1, 2]])
    got = pr.on_opens(np.array([0, 0, 1, 2]), np.array([7, 7, 7, 7]))   # the same sample read twice
    assert got.tolist() == [0, -1, 1, 2] and pr.duplicates == 1


@pytest.mark.parametrize("lost", [0.3, 0.6])
def test_events_lost_at_random_never_lose_the_reader(lost: float):
    """(A batch's matches may run ahead about DENSITY positions per open
    delivered: up to 3 in 4 opens lost one by one; a ring that laps loses
    runs of events, which the resync handles.)"""
    rng = random.Random(5)
    n = 20_000
    orders = [rng.sample(range(n), n) for _ in range(2)]
    files, pids = reader_events(orders[0] + orders[1])
    keep = [k for k in range(len(files)) if rng.random() >= lost]
    pr = tracker(orders, window=1024)
    feed(pr, [files[k] for k in keep], [pids[k] for k in keep], 1000)
    assert not pr.diverged
    assert pr.planner.reader >= 2 * n - 1024 - 64 * 8
    assert pr.matched >= 0.95 * len(keep)


@pytest.mark.parametrize("burst", [5_000, 60_000])
def test_a_ring_overwritten_again_and_again_never_loses_the_reader(burst: int):
    """Bursts of lost events (the ring lapped by a fast reader): the reader
    reappears far beyond the window, and the tracker skips to it."""
    rng = random.Random(6)
    n = 100_000
    orders = [rng.sample(range(n), n) for _ in range(2)]
    files, pids = reader_events(orders[0] + orders[1])
    pr = tracker(orders, window=1024)
    k, delivered = 0, 0
    while k < len(files):
        take = rng.randint(2_000, 20_000)
        feed(pr, files[k:k + take], pids[k:k + take], 1000)
        delivered += len(files[k:k + take])
        k += take + burst                          # then a burst is lost
        assert not pr.diverged, (k, pr.matched, pr.mismatched)
    assert pr.resyncs > 0
    assert pr.planner.reader >= 2 * n - burst - 1024 - 64 * 8
    assert pr.matched >= 0.95 * delivered


@pytest.mark.parametrize("lost", [0.0, 0.5])
def test_another_order_is_noticed_in_batches_and_with_lost_events(lost: float):
    rng = random.Random(7)
    n = 50_000
    announced = rng.sample(range(n), n)
    actual = rng.sample(range(n), n)
    files, pids = reader_events(actual)
    keep = [k for k in range(len(files)) if rng.random() >= lost][:1000]
    pr = tracker([announced], window=1024)
    for k in range(0, len(keep), 100):
        feed(pr, [files[i] for i in keep[k:k + 100]], [pids[i] for i in keep[k:k + 100]], 100)
        if pr.diverged:
            break
    assert pr.diverged and pr.resyncs == 0 and pr.matched < 50


@pytest.mark.parametrize("batch", [5_000, 30_000, 80_000])
def test_big_batches_across_an_epoch_boundary(batch: int):
    """A daemon that drains late gets a batch spanning two epochs, with files
    opened in both: their second opens match the next epoch's positions (the
    low-water mark moves on only after the whole batch)."""
    rng = random.Random(8)
    n = 20_000
    orders = [rng.sample(range(n), n) for _ in range(2)]
    files, pids = reader_events(orders[0] + orders[1], seed=2)
    pr = tracker(orders, window=1024)
    feed(pr, files, pids, batch)
    assert pr.matched == 2 * n and pr.mismatched == 0 and pr.skipped == 0
    assert pr.planner.reader == 2 * n and not pr.diverged


@pytest.mark.slow
def test_a_worker_lagging_far_behind_is_late_not_another_order():
    """One of 8 workers stalls (its process descheduled) while the others
    read three windows further: its opens arrive for positions already
    passed.  They are late, not evidence of another order."""
    rng = random.Random(9)
    n = 50_000
    orders = [rng.sample(range(n), n) for _ in range(2)]
    files, pids = reader_events(orders[0] + orders[1], seed=3)
    lag = [k for k in range(30_000, 33_000) if pids[k] == 100]        # worker 0 stalls here
    rest = [k for k in range(len(files)) if k not in set(lag)]
    at = rest.index(36_000)                                             # ... and resumes later
    order = rest[:at] + lag + rest[at:]
    pr = tracker(orders, window=1024)
    feed(pr, [files[k] for k in order], [pids[k] for k in order], 1000)
    assert not pr.diverged and pr.late > 0.3 * len(lag)
    assert pr.matched + pr.late >= 0.99 * len(files)
    assert pr.planner.reader >= 2 * n - 1024 - 64 * 8
