"""Threads, forked processes and a concurrent placer/evictor: every byte read
through the shim must be the source's."""
from __future__ import annotations

import hashlib
import json
import os
import random
import threading
from pathlib import Path

import pytest

from helpers import PYTHON, ShimEnv, build_index, make_data, private_dir
from sanitizers import Flavour
from tiering.placement.index import Root, lib

STRESS = Path(__file__).resolve().parent / "workloads" / "stress.py"


def churn(se: ShimEnv, stop: threading.Event, counts: dict[str, int]) -> None:
    """Places and evicts copies the way the daemon does, as fast as it can."""
    rng = random.Random(7)
    rels = sorted(se.contents)
    staging = se.tier.parent / "staging"
    staging.mkdir(exist_ok=True)
    while not stop.is_set():
        rel = rng.choice(rels)
        slot = se.slots[rel]
        if se.index.state(slot) == 1:
            if se.index.cas_state(slot, 1, 0):        # unpublish, then delete
                (se.tier / "0" / rel).unlink()
                counts["evicted"] += 1
        else:
            tmp = staging / "part"
            tmp.write_bytes(se.contents[rel])
            dst = se.tier / "0" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, dst)                       # complete before it is published
            if se.index.cas_state(slot, 0, 1):
                counts["placed"] += 1


@pytest.mark.slow
@pytest.mark.sanitizers("asan")   # under TSan too slow for the counts it asserts
def test_threads_and_processes_read_the_right_bytes_while_copies_come_and_go(shimenv, tmp_path):
    expected = {str(shimenv.root / r): hashlib.sha256(d).hexdigest() for r, d in shimenv.contents.items()}
    exp_file = tmp_path / "expected.json"
    exp_file.write_text(json.dumps(expected))
    stop = threading.Event()
    counts = {"placed": 0, "evicted": 0}
    t = threading.Thread(target=churn, args=(shimenv, stop, counts))
    t.start()
    try:
        r = shimenv.run([PYTHON, str(STRESS), str(exp_file), "4", "4", "8"])
    finally:
        stop.set()
        t.join()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(r.stdout)
    print(counts, res["reads"], shimenv.index.counters())
    assert res["mismatches"] == [] and res["errors"] == []
    assert res["reads"] > 1000
    c = shimenv.index.counters()
    # both paths were really exercised while the copies churned
    assert counts["placed"] > 50 and counts["evicted"] > 50
    assert c["opens_tier"][0] > 100 and c["opens_pfs"] > 100
    assert c["opens"] == res["reads"]


@pytest.mark.slow
@pytest.mark.sanitizers("asan", "tsan")
def test_events_from_many_processes_are_all_accounted(shimenv, tmp_path):
    shimenv.place_all()
    expected = {str(shimenv.root / r): hashlib.sha256(d).hexdigest() for r, d in shimenv.contents.items()}
    exp_file = tmp_path / "expected.json"
    exp_file.write_text(json.dumps(expected))
    r = shimenv.run([PYTHON, str(STRESS), str(exp_file), "1", "4", "4"])
    assert r.returncode == 0, r.stderr
    reads = json.loads(r.stdout)["reads"]
    events = []
    while True:  # the ring holds 65536 events; drain what is left
        got = shimenv.index.drain(force=True)
        if not got:
            break
        events += got
    dropped = shimenv.index.counters()["events_dropped"]
    opens = sum(e.kind == lib.TIERING_EV_OPEN_TIER for e in events)
    closes = sum(e.kind == lib.TIERING_EV_CLOSE for e in events)
    assert shimenv.index.counters()["opens_tier"] == [reads]
    assert opens + closes + dropped == 2 * reads
    assert len({e.pid for e in events}) == 5


RACE_FILES = 600
RACE_READERS = 4


def racer_env(tmp_path: Path, n: int, flavour: Flavour) -> ShimEnv:
    """n files of 4096 bytes b'o', each with a published copy."""
    root = tmp_path / "pfs" / "data"
    contents = make_data(root, {f"f{i:05d}.bin": 0 for i in range(n)})
    contents = {rel: b"o" * 4096 for rel in contents}
    for rel, data in contents.items():
        (root / rel).write_bytes(data)
    tier = private_dir(tmp_path / "tier")
    index, slots = build_index(tmp_path, [Root(str(root), 0)], root, contents, tier)
    se = ShimEnv(root, tier, index, slots, contents, flavour.env(index.path), flavour)
    se.place_all()
    return se


@pytest.mark.slow
@pytest.mark.sanitizers("asan", "tsan")
def test_no_read_is_served_a_copy_opened_after_a_write_was_done(tmp_path, cbin, flavour):
    """NOTE [linearizable redirect]: a write open invalidates before it
    returns, and a reader re-checks the entry after opening the copy.  A reader
    may keep the old bytes only when its open reached the copy before the
    write; one that began after the write was done always reads the new bytes."""
    se = racer_env(tmp_path, RACE_FILES, flavour)
    r = se.run([str(cbin / "racer"), str(se.root), str(se.tier), str(RACE_FILES), str(RACE_READERS)])
    assert r.returncode == 0, r.stderr
    got = dict(kv.split("=") for kv in r.stdout.split())
    got = {k: int(v) for k, v in got.items()}
    print(got, se.index.counters())
    assert got["poison"] == 0 and got["stale_after_done"] == 0
    # the race really ran: copies served, writes overlapped by reads
    assert got["old"] > 0 and got["new"] > 0 and got["racing"] >= RACE_FILES
    assert se.index.counters()["writes"] == RACE_FILES
    for rel in se.contents:
        assert (se.root / rel).read_bytes() == b"n" * 4096
        assert se.state(rel) == lib.TIERING_STATE_INVALID
