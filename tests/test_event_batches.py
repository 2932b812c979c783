"""The event path in batches (NOTE [event batches]): the ring sized from the
catalog and drained into numpy arrays, the daemon handing opens to its policy
as arrays in order, and the clairvoyant policy handing a large plan to the
daemon a bounded number of copies at a time."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import PYTHON, PlaceEach, make_data, private_dir, wait_for
from tiering.catalog import scan
from tiering.clairvoyant.feeds import ListFeed
from tiering.clairvoyant.planner import EVICT, FETCH, Actions
from tiering.clairvoyant.policy import Clairvoyant
from tiering.placement import index as index_mod
from tiering.placement.api import NOT_PLACED, Policy
from tiering.placement.daemon import Daemon
from tiering.placement.index import (
    BATCH_EVENTS,
    DRAIN,
    EVENT_DTYPE,
    RING_MAX,
    RING_MIN,
    Event,
    Root,
    SharedIndex,
    ffi,
    lib,
    ring_events,
)
from tiering.placement.tiers import TierState


def test_ring_size_follows_the_catalog() -> None:
    assert ring_events(0) == ring_events(1000) == RING_MIN == 1 << 16
    assert ring_events(100_000) == 1 << 19          # two epochs' opens and closes
    assert ring_events(200_000) == 1 << 20
    assert ring_events(1_281_167) == RING_MAX == 1 << 20     # 32 MiB at most
    assert ring_events(14_000_000) == RING_MAX
    for n in (5, 40_000, 70_000, 300_000):
        r = ring_events(n)
        assert r & (r - 1) == 0 and r >= min(4 * n, RING_MAX)


def make_index(tmp: Path, files: int, ring_size: int | None = None) -> tuple[SharedIndex, list[int]]:
    data = tmp / "pfs"
    make_data(data, {f"f{i:05d}": 10 for i in range(files)})
    cat = scan([str(data)])
    run = private_dir(tmp / "run")
    return SharedIndex.create(run / "index", [Root(cat.roots[0], 0)], [str(tmp / "tier")],
                              [f.rel for f in cat.files], [0] * files, [f.size for f in cat.files],
                              [f.mtime_ns for f in cat.files], ring_size=ring_size)


def post(index: SharedIndex, records: list[tuple[int, int, int, int]]) -> None:
    """Appends records (kind, slot, pid, tier) the way the shim does (seqlock)."""
    h = index.header
    ring = ffi.cast("struct tiering_event *", ffi.cast("char *", index.base) + h.ring_offset)
    for kind, slot, pid, tier in records:
        pos = int(h.ring_head)
        ev = ring[pos & (h.nevents - 1)]
        ev.seq = 0
        ev.entry, ev.pid, ev.kind, ev.tier = slot, pid, kind, tier
        ev.seq = pos + 1
        h.ring_head = pos + 1


def test_state_words_swapped_many_at_once_as_one_by_one(tmp_path: Path) -> None:
    """SharedIndex.cas_states (a batch's publication): each slot swapped
    only from the expected state, a flag per slot, the others untouched."""
    index, slots = make_index(tmp_path, 12)
    try:
        assert index.cas_state(slots[3], lib.TIERING_STATE_NONE, lib.TIERING_STATE_INVALID)
        assert index.cas_state(slots[5], lib.TIERING_STATE_NONE, 2)
        picked = np.array([slots[k] for k in (0, 3, 5, 7, 9)], np.int64)
        got = index.cas_states(picked, lib.TIERING_STATE_NONE, 1)
        assert got.dtype == bool and got.tolist() == [True, False, False, True, True]
        assert [index.state(s) for s in slots] == [1, 0, 0, lib.TIERING_STATE_INVALID, 0, 2, 0, 1, 0, 1, 0, 0]
        assert index.cas_states(np.array(picked[:2]), 1, 0).tolist() == [True, False]
        assert index.state(slots[0]) == 0 and index.cas_states(np.zeros(0, np.int64), 0, 1).tolist() == []
    finally:
        index.close()


def test_index_rings_by_catalog_and_drains_in_batches(tmp_path: Path) -> None:
    index, slots = make_index(tmp_path / "default", 40)
    assert int(index.header.nevents) == RING_MIN
    index.close()
    index, slots = make_index(tmp_path, 40, ring_size=1 << 17)
    n = DRAIN + 1000                                 # more than one call of the C helper
    records = [(lib.TIERING_EV_OPEN_TIER, slots[k % 40], 1000 + k % 7, 0) for k in range(n)]
    post(index, records)
    got = index.drain_batch()
    assert len(got) == n and got.dtype.names[:5] == ("seq", "entry", "pid", "kind", "tier")
    assert got["entry"].tolist() == [r[1] for r in records]
    assert got["pid"].tolist() == [r[2] for r in records]
    assert (got["seq"] == np.arange(1, n + 1)).all()
    assert len(index.drain_batch()) == 0 and index.counters()["events_dropped"] == 0
    # lapped: the oldest records are gone and counted, the rest come in order
    records = records * 2
    post(index, records[:(1 << 17) + 500])
    got = index.drain_batch()
    assert len(got) == 1 << 17 and index.counters()["events_dropped"] == 500
    assert got["entry"].tolist() == [r[1] for r in records[500:(1 << 17) + 500]]
    # a batch holds at most `limit` events (BATCH_EVENTS by default): the rest at the next drain
    post(index, records[:DRAIN + 3000])
    first = index.drain_batch(limit=DRAIN + 1000)
    assert len(first) == DRAIN + 1000 and index.pending_events() == 2000
    rest = index.drain_batch(limit=DRAIN + 1000)
    assert np.array_equal(np.r_[first["entry"], rest["entry"]], [r[1] for r in records[:DRAIN + 3000]])
    assert index.pending_events() == 0 and index.counters()["events_dropped"] == 500
    assert BATCH_EVENTS * EVENT_DTYPE.itemsize <= 8 << 20
    index.close()
    with pytest.raises(ValueError, match="power of two"):
        make_index(tmp_path / "other", 3, ring_size=1000)


class Recorder(Policy):
    name = "recorder"

    def __init__(self, placement: Any) -> None:
        super().__init__(placement)
        self.calls: list[tuple[list[int], list[bool], list[int], bool]] = []

    def on_opens(self, files: np.ndarray, from_tier: np.ndarray, pids: np.ndarray) -> None:
        d = self.placement
        self.calls.append((files.tolist(), from_tier.tolist(), pids.tolist(), 3 in d._invalid))


def test_daemon_hands_opens_to_the_policy_as_arrays_in_order(tmp_path: Path) -> None:
    index, slots = make_index(tmp_path, 8)
    data = tmp_path / "pfs"
    cat = scan([str(data)])
    root = private_dir(tmp_path / "tier")   # as tier-run makes it
    d = Daemon(index, cat, slots, [TierState("ram", "memory", root, 1 << 20, 1)], 1, Recorder)
    k = lib
    events = [Event(k.TIERING_EV_OPEN_PFS, slots[0], 11, 0), Event(k.TIERING_EV_CLOSE, slots[0], 11, 0),
              Event(k.TIERING_EV_OPEN_TIER, slots[1], 12, 0), Event(k.TIERING_EV_OPEN_PFS, 1 << 30, 12, 0),
              Event(k.TIERING_EV_WRITE, slots[3], 13, 0), Event(k.TIERING_EV_OPEN_PFS, slots[2], 11, 0)]
    d._handle(events)
    rec = d.policy
    assert isinstance(rec, Recorder)
    # the write splits the batch: the open after it sees file 3 invalidated, the ones before do not
    assert rec.calls == [([0, 1], [False, True], [11, 12], False), ([2], [False], [11], True)]
    assert d.stats.events == 6
    index.close()


class Patient(Policy):
    """A policy that says whether it is patient, and notes its landings."""

    def __init__(self, placement: Any):
        super().__init__(placement)
        self.is_patient = True
        self.landed: list[list[int]] = []

    def patient(self) -> bool:
        return self.is_patient

    def on_landed(self, files: np.ndarray, tier: int, published: np.ndarray) -> None:
        self.landed.append(files.tolist())


def ram_daemon(tmp_path: Path, policy: Callable[[Any], Policy]) -> tuple[Daemon, SharedIndex, list[int]]:
    """A daemon over make_index's 8 files with one memory tier."""
    index, slots = make_index(tmp_path, 8)
    cat = scan([str(tmp_path / "pfs")])
    tier = TierState("ram", "memory", private_dir(tmp_path / "tier"), 1 << 20, 1)
    return Daemon(index, cat, slots, [tier], 1, policy), index, slots


def test_a_patient_policy_hears_of_its_landed_copies_at_its_next_turn_unwoken(tmp_path: Path) -> None:
    """A landing wakes the event thread unless the policy is patient; a
    patient policy is told at the turn that comes by itself."""
    d, index, slots = ram_daemon(tmp_path, Patient)
    policy = d.policy
    assert isinstance(policy, Patient)
    d._land([1], 0, [True])
    assert not d._wake.is_set() and policy.landed == []
    policy.is_patient = False
    d._land([2], 0, [True])
    assert d._wake.is_set()
    d.start()
    try:
        wait_for(lambda: policy.landed == [[1], [2]], "the landings told")
        policy.is_patient = True
        d._land([3], 0, [False])
        wait_for(lambda: policy.landed == [[1], [2], [3]], "a landing told at the next turn")
    finally:
        d.stop()
        index.close()


def test_a_backlog_reaches_the_policy_in_bounded_batches_and_all_of_it_by_the_stop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [event batches]: a turn drains at most BATCH_EVENTS events (here
    1,000): a backlog of 4,500 is handed over in turns of at most that many,
    in order, and what is left when the daemon stops is drained then."""
    monkeypatch.setattr(index_mod, "BATCH_EVENTS", 1000)
    for started in (True, False):     # not started: all of it drained by the stop
        index, slots = make_index(tmp_path / str(started), 8, ring_size=1 << 13)
        cat = scan([str(tmp_path / str(started) / "pfs")])
        d = Daemon(index, cat, slots, [TierState("ram", "memory", private_dir(tmp_path / f"tier{started}"),
                                                 1 << 20, 1)], 1, Recorder)
        rec = d.policy
        assert isinstance(rec, Recorder)
        post(index, [(lib.TIERING_EV_OPEN_PFS, slots[k % 8], 100 + k, 0) for k in range(4500)])
        if started:
            d.start()
        try:
            if started:
                wait_for(lambda r=rec: sum(len(c[0]) for c in r.calls) == 4500, "the backlog handed over")
        finally:
            d.stop()
            index.close()
        assert [p for c in rec.calls for p in c[2]] == list(range(100, 4600))
        assert max(len(c[0]) for c in rec.calls) <= 1000 and len(rec.calls) >= 5 and d.stats.events == 4500


def test_the_patient_turn_is_shorter_for_a_ring_that_holds_less(tmp_path: Path) -> None:
    """NOTE [event batches]: a patient turn comes every PATIENT_TICK, or
    sooner when a quarter of the ring holds less than that long of
    PEAK_EVENTS a second (a small data set's ring), never sooner than
    IDLE_TICK."""
    from tiering.placement import daemon as dm
    for nevents, tick in ((1 << 20, dm.PATIENT_TICK), (1 << 16, (1 << 16) / 4 / dm.PEAK_EVENTS),
                          (1 << 10, dm.IDLE_TICK)):
        index, slots = make_index(tmp_path / str(nevents), 8, ring_size=nevents)
        cat = scan([str(tmp_path / str(nevents) / "pfs")])
        d = Daemon(index, cat, slots, [TierState("ram", "memory", private_dir(tmp_path / str(nevents) / "tier"),
                                                 1 << 20, 1)], 1, Patient)
        assert int(index.header.nevents) == nevents and d._patient_tick == pytest.approx(tick)
        index.close()
    assert dm.IDLE_TICK < (1 << 16) / 4 / dm.PEAK_EVENTS < dm.PATIENT_TICK


def test_simple_policies_get_each_open() -> None:
    seen: list[tuple[int, bool, int]] = []

    class One(Policy):
        def on_open(self, i: int, from_tier: bool, pid: int = 0) -> None:
            seen.append((i, from_tier, pid))

    One(None).on_opens(np.array([4, 2]), np.array([True, False]), np.array([7, 8]))  # type: ignore[arg-type]
    assert seen == [(4, True, 7), (2, False, 8)]


class FakePlacement(PlaceEach):
    """Copies that land only when the test says so."""

    def __init__(self, files: int, capacity: int):
        self.sizes = [4096] * files
        self.capacities = [capacity]
        self.stopping = False
        self.pending: list[int] = []
        self.placed: list[int] = []

    def where(self, i: int) -> int:
        return 0 if i in self.placed else NOT_PLACED

    def place(self, i: int, tier: int) -> bool:
        self.pending.append(i)
        return True

    def evict(self, i: int) -> bool:
        return False

    def placements(self) -> Iterator[tuple[int, int]]:
        return iter([])

    def copies_in_flight(self) -> int:
        return len(self.pending)


def test_a_large_plan_reaches_the_daemon_a_bounded_number_of_copies_at_a_time() -> None:
    n = 5000
    order = np.random.default_rng(1).permutation(n)
    fake = FakePlacement(n, 10 * 4096 * n)
    policy = Clairvoyant(fake, ListFeed(iter([order, order[::-1].copy()])))  # type: ignore[arg-type]
    policy.start()
    assert len(fake.pending) == policy.in_flight                # not 5000 copies queued at once
    while fake.pending:
        landed = fake.pending[:300]
        del fake.pending[:300]
        for f in landed:
            fake.placed.append(f)
            policy.on_placed(f, 0)
        assert len(fake.pending) <= policy.in_flight
    assert fake.placed == order.tolist()                         # every fetch, in the plan's order
    assert policy.report()["planned_not_issued"] == 0 and policy.fetches == n


def test_copies_landed_together_leave_the_plan_as_landed_one_by_one() -> None:
    """The daemon hands a batch's copies to the policy together (on_landed):
    the plan, what is handed out and what is dropped are those of on_placed
    and on_failed called for each (NOTE [batch copy])."""
    n = 3000
    order = np.random.default_rng(5).permutation(n)
    runs = []
    for together in (False, True):
        fake = FakePlacement(n, 10 * 4096 * n)
        policy = Clairvoyant(fake, ListFeed(iter([order])))  # type: ignore[arg-type]
        policy.start()
        handed: list[int] = []
        k = 0
        while fake.pending:
            batch = np.array(fake.pending[:200], np.int64)
            del fake.pending[:200]
            handed.extend(batch.tolist())
            ok = np.arange(k, k + len(batch)) % 17 != 3       # every 17th copy fails
            k += len(batch)
            fake.placed.extend(batch[ok].tolist())
            if together:
                policy.on_landed(batch, 0, ok)
            else:
                for f, good in zip(batch.tolist(), ok.tolist()):
                    policy.on_placed(f, 0) if good else policy.on_failed(f)
        assert policy.planner is not None
        runs.append((handed, policy.fetches, policy.refused, sorted(policy.planner.resident.items())))
    assert runs[0] == runs[1]
    assert len(runs[0][0]) == n and runs[0][1] == n


class TwoTiers(FakePlacement):
    """Two tiers, and evictions recorded."""

    def __init__(self, files: int, capacity: int):
        super().__init__(files, capacity)
        self.capacities = [capacity, capacity]
        self.evicted: list[int] = []

    def evict(self, i: int) -> bool:
        self.evicted.append(i)
        return True


class Recording(TwoTiers):
    """Every evict and every place_many in order; the files in `refuse` are not placed."""

    def __init__(self, files: int, capacity: int):
        super().__init__(files, capacity)
        self.calls: list[tuple] = []
        self.refuse: set[int] = set()

    def evict(self, i: int) -> bool:
        self.calls.append(("evict", i))
        return True

    def place_many(self, files: np.ndarray, tier: int) -> np.ndarray:
        self.calls.append(("place", files.tolist(), tier))
        return np.array([int(f) not in self.refuse for f in files], bool)


def test_the_plan_is_handed_out_in_its_order_each_run_of_fetches_to_a_tier_in_one_call() -> None:
    """Evictions one by one, each run of fetches to one tier in one
    place_many, in the plan's order; a refused fetch is dropped from the plan
    and counted, as when each fetch was placed on its own."""
    from tiering.clairvoyant.planner import EVICT, FETCH, Actions
    fake = Recording(40, 1 << 30)
    policy = Clairvoyant(fake, ListFeed(iter([np.arange(40)])))  # type: ignore[arg-type]
    policy.start()
    assert policy.planner is not None
    dropped: list[int] = []
    policy.planner.drop = dropped.append   # type: ignore[method-assign]
    fake.calls.clear()
    fetches, evictions, refused = policy.fetches, policy.evictions, policy.refused
    plan = [(FETCH, 1, 0), (FETCH, 2, 0), (FETCH, 3, 1), (EVICT, 4, 0), (EVICT, 5, 1), (FETCH, 6, 1),
            (FETCH, 7, 1), (FETCH, 8, 0), (EVICT, 9, 0), (FETCH, 10, 0)]
    kind, file, tier = (np.array(c, dt) for c, dt in zip(zip(*plan), (np.int8, np.int64, np.int8)))
    fake.refuse = {2, 7, 10}
    policy._hand_out(Actions(kind, file, tier, np.arange(len(plan)), np.arange(len(plan))))
    assert fake.calls == [("place", [1, 2], 0), ("place", [3], 1), ("evict", 4), ("evict", 5),
                          ("place", [6, 7], 1), ("place", [8], 0), ("evict", 9), ("place", [10], 0)]
    assert dropped == [2, 7, 10]
    assert (policy.fetches - fetches, policy.evictions - evictions, policy.refused - refused) == (4, 3, 3)
    fake.calls.clear()
    policy._hand_out(Actions(*(np.array([c], dt) for c, dt in zip((EVICT, 11, 0, 0, 0), (
        np.int8, np.int64, np.int8, np.int64, np.int64)))))
    assert fake.calls == [("evict", 11)]


@pytest.mark.parametrize("following", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_copies_landed_anywhere_together_leave_the_plan_as_landed_one_by_one(seed: int, following: bool) -> None:
    """on_landed skips the published copies its plan holds where they
    landed; the rest (failed, landed on the other tier, copies the plan did
    not ask for) go one by one: the plan, evictions and fetches are those
    of _landed called for each copy, on two tiers, followed or not."""
    n = 2000
    order = np.random.default_rng(seed).permutation(n)
    runs = []
    for together in (False, True):
        rng = np.random.default_rng(100 + seed)
        fake = TwoTiers(n, 4096 * n // 3)
        policy = Clairvoyant(fake, ListFeed(iter([order])))  # type: ignore[arg-type]
        policy.start()
        handed: list[int] = []
        for _ in range(200):
            if not fake.pending:
                break
            batch = np.array(fake.pending[:150], np.int64)
            del fake.pending[:150]
            extra = np.setdiff1d(rng.integers(0, n, 20), batch)   # copies the plan did not ask for
            rng.shuffle(extra)
            batch = np.concatenate([batch, extra])
            handed.extend(batch.tolist())
            ok = rng.random(len(batch)) > 0.1
            tier = int(rng.integers(0, 2))
            policy.diverged = not following
            if together:
                policy.on_landed(batch, tier, ok)
            else:
                for f, good in zip(batch.tolist(), ok.tolist()):
                    policy._landed(f, tier, good)
                policy._refill()
        assert policy.planner is not None
        runs.append((handed, fake.evicted, policy.fetches, sorted(policy.planner.resident.items()),
                     list(policy.planner.used)))
    assert runs[0] == runs[1]
    assert runs[0][1] if following else not runs[0][1]     # evictions happen only while followed


def test_a_late_drain_spanning_several_epochs_is_followed() -> None:
    """A daemon starved of CPU drains opens of several epochs at once, more
    than the plan knew ahead: the next epochs become known as the reader
    gets to them, and the reads are still followed."""
    n = 3000
    rng = np.random.default_rng(2)
    orders = [rng.permutation(n) for _ in range(5)]
    fake = FakePlacement(n, 10 * 4096 * n)
    policy = Clairvoyant(fake, ListFeed(iter(orders)))  # type: ignore[arg-type]
    policy.start()
    assert policy.report()["epochs_known"] == 2
    files = np.concatenate(orders)
    policy.on_opens(files, np.ones(len(files), bool), np.full(len(files), 9))
    report = policy.report()
    assert report["following"] and report["epochs_known"] == 5
    assert report["matched_opens"] == 5 * n and report["unmatched_opens"] == 0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def on_a_clock(order: np.ndarray, horizon: float,
               clock: Clock | None = None) -> tuple[FakePlacement, Clairvoyant, Callable[..., None]]:
    """A policy over `order` on a fake clock, and land(most): the first `most`
    copies it handed out land, in order."""
    fake = FakePlacement(len(order), 10 * 4096 * len(order))
    policy = Clairvoyant(fake, ListFeed(iter([order])))  # type: ignore[arg-type]
    policy.clock = clock or Clock()   # type: ignore[assignment]
    policy.horizon, policy.lead_floor, policy.in_flight, policy.rate_span = horizon, 1000, 512, 0.5

    def land(most: int = len(order)) -> None:
        for _ in range(most):
            if not fake.pending:
                return
            f = fake.pending.pop(0)
            fake.placed.append(f)
            policy.on_placed(f, 0)

    return fake, policy, land


def test_copies_are_issued_at_most_a_horizon_of_reading_ahead_of_a_reading_reader() -> None:
    """NOTE [prefetch horizon]: before the reader reads, the plan is issued as
    fast as copies land; once it reads at 1,000 positions/s, no copy is issued
    for a position more than 5 s of its reading ahead of it; when it pauses,
    the rest goes out."""
    n = 40_000
    order = np.random.default_rng(3).permutation(n)
    clock = Clock()
    fake, policy, land = on_a_clock(order, 5.0, clock)
    policy.start()
    land()                                                  # no reader yet: everything goes out
    assert len(fake.placed) == n and policy.report()["held_by_horizon"] == 0
    # the same with a reader: a fresh policy over the same order
    fake, policy, land = on_a_clock(order, 5.0, clock)
    policy.start()
    read = 0
    for _ in range(30):                                     # 3 s at 1,000 positions/s, in 0.1 s steps
        policy.on_opens(order[read:read + 100], np.ones(100, bool), np.full(100, 7))
        read += 100
        clock.now += 0.1
        land(2000)                                          # copies land at 20,000/s
    # the reader's 5 s: 5,000 positions ahead of it, and nothing beyond (but
    # for the rest of a chunk of actions); fewer while its rate was not known
    furthest = max(np.flatnonzero(np.isin(order, fake.placed)))
    assert read + 5000 - 1 <= furthest < read + 5000 + policy.chunk
    assert policy.report()["held_by_horizon"] > 0
    assert policy._rate() is not None
    assert policy.lead() == furthest - read + 1                # the copies handed out and landed, not the plan
    assert policy.patient()                                  # held by the horizon: its next turn can wait
    clock.now += 1.0                                        # the reader pauses
    policy.poll()
    land()
    assert sorted(fake.placed) == list(range(n))             # the rest went out, each file once
    assert not policy.patient()
    policy.on_opens(order[read:read + 100], np.ones(100, bool), np.full(100, 7))
    assert policy._rate() is not None                        # reading again
    policy._reset(0, [order])                               # a new plan: its reader's rate is not known yet
    assert policy._rate() is None


def test_with_every_fetch_handed_out_and_a_long_lead_the_policy_is_patient() -> None:
    """NOTE [event batches]: a plan whose fetches were all handed out and
    landed, lead_min_floor positions or more ahead of the reader (a data set
    in the tiers), needs no quick turn; a shorter lead, or fetches still to
    hand out, does."""
    for n, patient in ((20_000, True), (4_000, False)):
        fake, policy, land = on_a_clock(np.arange(n), 30.0)
        policy.lead_min_floor = 8192
        policy.start()
        policy.poll()
        assert not policy.patient()                          # its copies have not landed: no lead yet
        land()
        policy.poll()
        assert len(fake.placed) == n and policy.lead() == n
        assert policy.patient() is patient
        clock = policy.clock
        policy.on_opens(np.arange(100), np.ones(100, bool), np.full(100, 7))
        assert not policy.patient()                          # begun, its rate not known: not yet
        clock.now += 1.0                                     # type: ignore[attr-defined]
        policy.poll()                                        # it stands still, n - 100 ahead
        assert policy._rate() is None and policy.patient() is patient
    fake, policy, land = on_a_clock(np.arange(20_000), 30.0)
    policy.lead_min_floor, policy.in_flight = 8192, 100
    policy.start()
    for _ in range(100):                                     # 10,000 landed, 10,000 still to hand out
        land()
        policy.poll()
    assert policy.lead() == 10_000 and policy._actions and not policy.patient()


def test_a_reader_that_eats_into_the_lead_ends_the_patience_at_lead_min_of_its_reading() -> None:
    """NOTE [event batches]: every fetch handed out and landed; a reader at
    2,000 positions/s, lead_min 5 s: its lead must be 10,000 positions,
    more than lead_min_floor (1,000).  Its opens alone (no turn between)
    end the patience once the lead is shorter; a re-plan with fetches to
    hand out ends it at once."""
    n = 40_000
    clock = Clock()
    fake, policy, land = on_a_clock(np.arange(n), 30.0, clock)
    policy.lead_min_floor, policy.lead_min = 1000, 5.0
    policy.start()
    land()
    policy.poll()
    assert policy.lead() == n and policy.patient()
    seen = {}
    for read in range(0, 34_000, 200):                      # 200 positions each 0.1 s
        clock.now += 0.1
        policy.on_opens(np.arange(read, read + 200), np.ones(200, bool), np.full(200, 7))
        seen[read + 200] = policy.patient()
    assert policy._rate() == pytest.approx(2000, rel=0.01)
    assert seen[28_000] and policy.lead() == n - 34_000 < 10_000
    assert not seen[32_000] and not seen[34_000]            # 8,000 and 6,000 ahead: > floor, < 5 s of reading
    # patient from the 4th step (its rate known after rate_span / 2 of opens: 0.3 s) while
    # more than 10,000 ahead (not at 10,000 itself: its measured rate is 2,000 and a hair)
    assert [r for r, p in seen.items() if p] == [r for r in seen if 800 <= r < 30_000]
    policy.poll()
    clock.now += 5.0                                        # it stops: 6,000 ahead of a reader standing still
    policy.poll()
    assert policy.patient()
    policy._reset(0, [np.arange(n)])                        # planned anew over a placement that lost its copies
    assert not policy._long_lead and not policy._held_back   # the last plan's patience is gone with it
    policy._pump()
    assert policy._actions and not policy.patient()
    policy._long_lead = True                                # as a copy worker may find it before the next turn:
    assert not policy.patient()                              # fetches are left to hand out


def test_once_the_lead_is_reached_it_grows_at_a_bounded_pace_up_to_the_horizon() -> None:
    """NOTE [prefetch horizon]: a reader at 1,000 positions/s, copies that
    could land at 6,000/s.  Until its rate is known, and then up to the
    minimum lead (2 s of its reading), fetches go out as fast as they land;
    from there at most (1 + growth) x its rate, so the lead grows by 500
    positions/s and still reaches the 20 s horizon; a pause lifts the pace.
    Paced fetches go out in batches (the copy workers sleep between them),
    and a landed copy does not make the policy look at the pace again before
    the next batch is due."""
    n = 70_000
    order = np.random.default_rng(4).permutation(n)
    clock = Clock()
    fake, policy, land = on_a_clock(order, 20.0, clock)
    policy.lead_min, policy.lead_min_floor, policy.growth, policy.pace_batch = 2.0, 500, 0.5, 300
    looks = [0]
    paced = policy._paced

    def counted(part: Any, rate: float | None) -> Any:
        looks[0] += 1
        return paced(part, rate)

    policy._paced = counted   # type: ignore[method-assign]
    policy.start()
    read, paced_from, leads, handed = 0, None, [], 0
    for step in range(450):                                 # 45 s at 1,000 positions/s, in 0.1 s steps
        policy.on_opens(order[read:read + 100], np.ones(100, bool), np.full(100, 7))
        read += 100
        clock.now += 0.1
        land(600)
        before, handed = handed, policy._handed_to()
        if paced_from is None and read >= 400 and handed - read >= 2000:   # its rate is known by then
            paced_from = (clock.now, handed, step, looks[0])    # the minimum lead is reached
        elif paced_from is not None:
            t0, h0, s0, _ = paced_from
            assert handed - h0 <= 1500 * (clock.now - t0) + policy.chunk   # (1 + growth) x its rate
            assert step < s0 + 20 or handed == before or handed - before >= 300   # in batches
        leads.append(handed - read)
    assert paced_from is not None and paced_from[0] < 101.0  # the minimum lead came at once
    assert looks[0] - paced_from[3] <= 3 * (450 - paced_from[2])   # a few looks a step, not one per copy
    assert leads[150] < 12_000                              # 15 s on: still growing ...
    assert 20_000 <= leads[-1] <= 20_000 + policy.chunk      # ... and then at the horizon
    report = policy.report()
    assert report["held_by_pace"] > 0 and report["held_by_horizon"] > 0
    clock.now += 1.0                                        # the reader pauses: no pace, no horizon
    policy.poll()
    land()
    assert sorted(fake.placed) == list(range(n))             # the rest went out, each file once


def test_a_reader_that_has_begun_gets_the_minimum_lead_until_its_rate_is_known() -> None:
    """NOTE [prefetch horizon]: once the reader has opened files, and until
    its rate is known, the fetches go out up to the minimum lead
    (lead_min_floor positions ahead of it), not as far as copies can go;
    once the rate is known the pace and the horizon take over."""
    n = 40_000
    order = np.random.default_rng(6).permutation(n)
    clock = Clock()
    fake, policy, land = on_a_clock(order, 20.0, clock)
    policy.lead_min_floor = 2000
    policy.start()
    policy.on_opens(order[:100], np.ones(100, bool), np.full(100, 7))    # it has begun
    land()                                                   # copies land as fast as they are handed out
    assert policy._rate() is None
    furthest = max(np.flatnonzero(np.isin(order, fake.placed)))
    assert 100 + 2000 - 1 <= furthest < 100 + 2000 + policy.chunk
    clock.now += 0.3                                         # more than half of rate_span later
    policy.on_opens(order[100:400], np.ones(300, bool), np.full(300, 7))
    land()
    assert policy._rate() is not None
    assert max(np.flatnonzero(np.isin(order, fake.placed))) > furthest
    clock.now += 1.0                                         # a pause: everything goes out
    policy.poll()
    land()
    assert sorted(fake.placed) == list(range(n))


def test_a_reader_standing_still_gets_its_minimum_lead_and_no_more() -> None:
    """A rate of 0 (matched opens that did not move the reader) lets out the
    fetches within the minimum lead only, and looks again after pace_wait."""
    n = 5000
    order = np.random.default_rng(5).permutation(n)
    fake, policy, _ = on_a_clock(order, 20.0)
    policy.in_flight, policy.lead_min_floor = n, 1000
    policy.planner = None
    policy._extend_from_list()
    assert policy.planner is not None
    head = policy.planner.advance()
    out = policy._paced(head[:policy.chunk], 0.0)
    out = policy._paced(head[:policy.chunk], 0.0)            # no tokens come with a rate of 0
    assert len(out) == 1000 and out.need.max() < 1000
    assert policy._resume_at == policy.clock() + policy.pace_wait


class StoppingPlacement(FakePlacement):
    """Refuses every copy once stopping, as the daemon does after COMMAND exited."""

    def place(self, i: int, tier: int) -> bool:
        return not self.stopping and super().place(i, tier)


def test_a_stopping_daemon_is_handed_no_more_of_the_plan() -> None:
    """When COMMAND exits while the plan is being handed over, the policy
    stops at once instead of offering (and dropping from the plan) every
    planned copy one by one: at 1.28 M files that took the job's exit 4-9 s."""
    n = 20_000
    fake = StoppingPlacement(n, 10 * 4096 * n)
    policy = Clairvoyant(fake, ListFeed(iter([np.arange(n)])))  # type: ignore[arg-type]
    policy.start()
    assert len(fake.pending) == policy.in_flight
    fake.stopping = True
    fake.pending.clear()
    policy.on_placed(0, 0)
    policy.poll()
    report = policy.report()
    assert report["refused"] == 0 and report["fetches"] == policy.in_flight
    assert report["planned_not_issued"] == n - policy.in_flight


class Watched(np.ndarray):
    """An action kind array that counts the elements compared."""
    compared = 0

    def __eq__(self, other: object) -> Any:   # type: ignore[override]
        Watched.compared += self.size
        return np.asarray(self) == other


def test_the_lead_does_not_compare_the_whole_held_plan() -> None:
    """The plan held back by the horizon or the pace is one array of up to an
    epoch's actions, and the lead (at every batch of opens) asks it for its
    first fetch: found by looking at its head, not by comparing all of it
    (at 1.28 M files that was a fifth of the daemon's CPU while prefetching)."""
    n = 2_000_000
    fake = FakePlacement(10, 1 << 30)
    policy = Clairvoyant(fake, ListFeed(iter([np.arange(10)])))  # type: ignore[arg-type]
    policy.start()
    assert policy.planner is not None
    for evictions in (0, 3, 100, 5000):
        kind = np.full(n, FETCH, np.int8)
        kind[:evictions] = EVICT
        need = np.arange(n, dtype=np.int64) + 7
        policy._actions.clear()
        policy._actions.append(Actions(kind.view(Watched), np.zeros(n, np.int64), np.zeros(n, np.int8),
                                       np.zeros(n, np.int64), need))
        Watched.compared = 0
        assert policy._handed_to() == evictions + 7             # the first fetch's position
        assert Watched.compared <= 8 * max(64, evictions)
    only = Actions(np.full(5, EVICT, np.int8), np.zeros(5, np.int64), np.zeros(5, np.int8), np.zeros(5, np.int64),
                   np.full(5, -1, np.int64))
    policy._actions.clear()
    policy._actions.append(only)
    assert policy._handed_to() == policy.planner.cursor          # no fetch held: the plan's cursor


def test_opens_counted_from_the_events_are_what_the_entries_count(shimenv) -> None:
    """NOTE [open counters]: the shim posts one event for each open it
    counts, so the daemon's count of the opens it drained gives the same
    counters as the sum over the entries and the tiers' counters."""
    rels = sorted(shimenv.contents)
    placed = rels[:len(rels) // 2]
    for rel in placed:
        shimenv.place(rel)
    script = "import sys\nfor p in sys.argv[1:]:\n    for _ in range(3):\n        open(p, 'rb').read()\n"
    r = shimenv.run([PYTHON, "-c", script, *(str(shimenv.root / rel) for rel in rels)])
    assert r.returncode == 0, r.stderr
    cat = scan([str(shimenv.root)])
    slots = np.array([shimenv.slots[f.rel] for f in cat.files], np.int64)
    d = Daemon(shimenv.index, cat, slots, [TierState("ram", "memory", shimenv.tier, 1 << 20, 1)], 1, Recorder)
    d.start()
    try:
        wait_for(lambda: (s := d.opens_seen()) is not None and int(s.sum()) == 3 * len(rels), "the opens drained")
        seen = d.opens_seen()
    finally:
        d.stop()
    exact = shimenv.index.counters()
    assert exact["events_dropped"] == 0
    assert exact["opens_tier"] == [3 * len(placed)] and exact["opens_pfs"] == 3 * (len(rels) - len(placed))
    assert seen is not None and shimenv.index.counters(seen) == exact


def test_the_daemon_counts_opens_from_its_events_while_none_is_lost(tmp_path: Path) -> None:
    """Daemon.opens_seen: [from the PFS, per tier] of the opens drained,
    only while the event thread runs and no event was lost."""
    d, index, slots = ram_daemon(tmp_path, Recorder)
    k = lib
    assert d.opens_seen() is None                     # not started
    d.start()
    try:
        post(index, [(k.TIERING_EV_OPEN_PFS, slots[0], 11, 0), (k.TIERING_EV_CLOSE, slots[0], 11, 0),
                     (k.TIERING_EV_OPEN_TIER, slots[1], 12, 0), (k.TIERING_EV_OPEN_TIER, slots[2], 12, 0),
                     (k.TIERING_EV_WRITE, slots[3], 13, 0), (k.TIERING_EV_OPEN_PFS, slots[4], 11, 0)])
        wait_for(lambda: d.stats.events == 6, "the events drained")
        assert (seen := d.opens_seen()) is not None and seen.tolist() == [2, 2]
        index.header.counters.events_dropped = 1       # one lost: only the entries' counters are right
        assert d.opens_seen() is None
    finally:
        d.stop()
        index.close()
    assert d.opens_seen() is None                     # stopped
