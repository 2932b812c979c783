"""The array planner makes exactly the decisions of the planner it replaced
(tests/reference_planner.py, kept unchanged): the same schedules and reports
from simulate(), and the same actions and state after every step when driven
like the daemon drives it (out-of-order consumes, skips, dropped and adopted
copies, epochs arriving as the reader goes), over many small random cases."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import reference_planner as ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiering.clairvoyant.planner as new
from tiering.placement.api import allocation

SETTINGS = settings(max_examples=400, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def unit(_: int) -> int:
    return 1


def exact(s: int) -> int:
    return s


ALLOCS: dict[str, Callable[[int], int]] = {"blocks": allocation, "unit": unit, "exact": exact}


@st.composite
def cases(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 12))
    alloc = draw(st.sampled_from(sorted(ALLOCS)))
    if alloc == "blocks":
        sizes = draw(st.lists(st.integers(0, 20_000), min_size=n, max_size=n))
        unit_size = 4096
    else:
        sizes = draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))
        unit_size = 1
    tiers = draw(st.integers(1, 3))
    caps = draw(st.lists(st.integers(0, 6 * unit_size), min_size=tiers, max_size=tiers))
    epochs = draw(st.lists(st.lists(st.integers(0, n - 1), max_size=3 * n), min_size=1, max_size=4))
    window = draw(st.sampled_from([None, 1, 2, 3, 8]))
    return {"sizes": sizes, "caps": caps, "epochs": epochs, "window": window, "alloc": alloc,
            "known_ahead": draw(st.integers(0, 2))}


def report_dicts(reports: list) -> list[dict]:
    return [r.as_dict() for r in reports]


def as_tuples(actions) -> list[tuple]:  # type: ignore[no-untyped-def]
    return [(a.kind, a.file, a.tier, a.position, a.need) for a in actions]


@pytest.fixture(params=[(4096, 0.5), (1, 0.0), (1, 0.5)], ids=["victims-kept", "victims-rebuilt", "victims-by-share"])
def bulk(request: pytest.FixtureRequest) -> object:
    """Changes beyond BULK and beyond REBUILD_SHARE of the placed files make
    the planner rebuild its victim sets when next needed: with BULK 1 and
    share 0 nearly every change goes that way; with share 0.5 those that move
    more than half the placed files."""
    saved = new.BULK, new.REBUILD_SHARE
    new.BULK, new.REBUILD_SHARE = request.param
    yield request.param
    new.BULK, new.REBUILD_SHARE = saved


@pytest.mark.slow
@SETTINGS
@given(c=cases())
def test_simulate_is_the_reference(bulk: object, c: dict) -> None:
    if c["alloc"] != "blocks":
        return  # simulate() uses the block allocation; other rules are driven below
    want, want_sched = ref.simulate(c["epochs"], c["sizes"], c["caps"], window=c["window"],
                                    known_ahead=c["known_ahead"])
    got, got_sched = new.simulate(c["epochs"], c["sizes"], c["caps"], window=c["window"],
                                  known_ahead=c["known_ahead"])
    assert report_dicts(got) == report_dicts(want)
    assert as_tuples(got_sched) == as_tuples(want_sched)
    # epochs given lazily (a generator) and as arrays plan the same
    lazy, lazy_sched = new.simulate((np.asarray(e) for e in c["epochs"]), c["sizes"], c["caps"],
                                    window=c["window"], known_ahead=c["known_ahead"])
    assert report_dicts(lazy) == report_dicts(want) and as_tuples(lazy_sched) == as_tuples(want_sched)


def same_state(a: ref.Planner, b: new.Planner, files: int) -> None:
    assert dict(b.resident) == a.resident
    assert b.used == a.used
    assert (b.reader, b.cursor, b.end) == (a.reader, a.cursor, a.end)
    assert [b.need.get(f, new.INF) for f in range(files)] == [a.need.get(f, ref.INF) for f in range(files)]
    assert [b.file_at(p) for p in range(max(a.base, b.base), a.end)] == \
        [a.file_at(p) for p in range(max(a.base, b.base), a.end)]


OPS = st.lists(st.tuples(st.sampled_from(["advance", "consume", "consume", "consume", "consume_many",
                                          "skip", "drop", "adopt", "extend"]),
                         st.integers(0, 1 << 30)), max_size=120)


@pytest.mark.slow
@SETTINGS
@given(c=cases(), ops=OPS)
def test_driven_like_the_daemon_it_acts_as_the_reference(bulk: object, c: dict, ops: list[tuple[str, int]]) -> None:
    alloc = ALLOCS[c["alloc"]]
    files = len(c["sizes"])
    a = ref.Planner(c["sizes"], c["caps"], window=c["window"], alloc=alloc)
    b = new.Planner(c["sizes"], c["caps"], window=c["window"], alloc=alloc)
    epochs = list(c["epochs"])
    for op, x in [("extend", 0), *ops, ("advance", 0)]:
        if op == "extend":
            if not epochs:
                continue
            order = epochs.pop(0)
            a.extend(order)
            b.extend(np.asarray(order) if x % 2 else order)
        elif op == "advance":
            assert as_tuples(b.advance()) == as_tuples(a.advance())
        elif op == "consume":   # near the reader, out of order, sometimes repeated or beyond the end
            pos = a.reader + x % 6 - 1
            a.consume(pos)
            b.consume(pos)
        elif op == "consume_many":
            rng = np.random.default_rng(x)
            positions = (a.reader + rng.integers(-1, 8, size=rng.integers(1, 6))).tolist()
            for pos in positions:
                a.consume(pos)
            b.consume_many(np.asarray(positions))
        elif op == "skip":      # lost events: positions up to at most the known end are skipped
            pos = a.reader + x % 5
            if pos > a.end:
                continue
            a.skip_to(pos)
            b.skip_to(pos)
        elif op == "drop":      # a copy failed or was invalidated
            f = x % files
            a.drop(f)
            b.drop(f)
        elif op == "adopt":     # a copy the daemon already has
            f, tier = x % files, (x >> 8) % len(c["caps"])
            a.adopt(f, tier)
            b.adopt(f, tier)
        same_state(a, b, files)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_trimming_keeps_the_decisions(monkeypatch: pytest.MonkeyPatch, bulk: object, seed: int) -> None:
    """Longer runs with the stream's head trimmed often: the same plan as the
    reference, with the reference never trimming."""
    monkeypatch.setattr(new, "TRIM_MIN", 7)
    monkeypatch.setattr(ref, "TRIM_MIN", 1 << 62)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 60))
    sizes = rng.integers(1, 30_000, n).tolist()
    caps = [int(c) for c in rng.integers(4096, 25 * 4096, int(rng.integers(1, 4)))]
    epochs = [rng.permutation(n).tolist() if e % 2 else rng.integers(0, n, n).tolist() for e in range(8)]
    for window in (None, 4, 16):
        for ahead in (0, 1, 2):
            want, ws = ref.simulate(epochs, sizes, caps, window=window, known_ahead=ahead)
            got, gs = new.simulate(epochs, sizes, caps, window=window, known_ahead=ahead)
            assert report_dicts(got) == report_dicts(want)
            assert as_tuples(gs) == as_tuples(ws)
