"""The planner's C core (tiering/clairvoyant/plancore.c) makes exactly the
decisions of the Python planner it runs beside, which stays as the fallback
(TIERING_PLANNER=python): both against the reference planner
(tests/reference_planner.py) on random small catalogs, tier sizes and orders,
the same schedules and reports; and, driven step by step like the daemon
drives it, the same actions and the same arrays after every step."""
from __future__ import annotations

import numpy as np
import pytest
import reference_planner as ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiering.clairvoyant.planner as planner
from tiering.clairvoyant.planner import Planner, simulate
from tiering.placement.api import BLOCK

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])   # (each example sets what it patches)


def as_tuples(actions) -> list[tuple]:  # type: ignore[no-untyped-def]
    return [(a.kind, a.file, a.tier, a.position, a.need) for a in actions]


def run(engine: str, monkeypatch: pytest.MonkeyPatch, *args, **kw):  # type: ignore[no-untyped-def]
    with monkeypatch.context() as m:
        if engine == "python":
            m.setenv("TIERING_PLANNER", "python")
        else:
            m.delenv("TIERING_PLANNER", raising=False)
        reports, schedule = simulate(*args, **kw)
    return [r.as_dict() for r in reports], as_tuples(schedule)


def test_the_core_is_built_and_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a built checkout the C core is what simulate() and advance() run
    (the comparisons below would otherwise compare Python with itself)."""
    monkeypatch.delenv("TIERING_PLANNER", raising=False)
    assert planner.core_available()
    p = Planner([1] * 4, [8192])
    p.extend([0, 1, 2, 3, 0])
    assert as_tuples(p.advance()) == [("fetch", 0, 0, 0, 0), ("fetch", 1, 0, 0, 1)]
    assert p._core is not None
    monkeypatch.setenv("TIERING_PLANNER", "python")
    assert not planner.core_available()


@st.composite
def catalogs(draw: st.DrawFn) -> dict:
    """Small catalogs (sizes up to a few blocks), one to three tiers of a few
    blocks, epochs that are permutations, subsets (a node's share) or draws
    with repeats."""
    n = draw(st.integers(1, 16))
    sizes = draw(st.lists(st.integers(0, 3 * 4096), min_size=n, max_size=n))
    caps = draw(st.lists(st.integers(0, 10 * 4096), min_size=1, max_size=3))
    seed = draw(st.integers(0, 1 << 30))
    rng = np.random.default_rng(seed)
    epochs = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["permutation", "share", "repeats"]))
        if kind == "permutation":
            epochs.append(rng.permutation(n).tolist())
        elif kind == "share":
            epochs.append(rng.permutation(n)[:max(1, n // 3)].tolist())
        else:
            epochs.append(rng.integers(0, n, int(rng.integers(0, 2 * n + 1))).tolist())
    return {"sizes": sizes, "caps": caps, "epochs": epochs, "window": draw(st.sampled_from([None, 1, 2, 5, 16])),
            "known_ahead": draw(st.integers(0, 2)), "trim": draw(st.sampled_from([3, 1 << 16]))}


@pytest.mark.slow
@SETTINGS
@given(c=catalogs())
def test_c_core_and_python_plan_as_the_reference(monkeypatch: pytest.MonkeyPatch, c: dict) -> None:
    monkeypatch.setattr(planner, "TRIM_MIN", c["trim"])
    want_r, want_s = ref.simulate(c["epochs"], c["sizes"], c["caps"], window=c["window"],
                                  known_ahead=c["known_ahead"])
    want = ([r.as_dict() for r in want_r], as_tuples(want_s))
    for engine in ("c", "python"):
        got = run(engine, monkeypatch, (np.asarray(e, np.int64) for e in c["epochs"]), c["sizes"], c["caps"],
                  window=c["window"], known_ahead=c["known_ahead"])
        assert got == want, engine
        # without the schedule kept (`tiering plan`): the same reports
        counted = run(engine, monkeypatch, c["epochs"], c["sizes"], c["caps"], window=c["window"],
                      known_ahead=c["known_ahead"], schedule=False)
        assert counted == (want[0], []), engine


def state(p: Planner) -> tuple:
    """Everything the next decision depends on."""
    n = p._n
    return (p.base, n, p.reader, p.cursor, p.used, p.n_resident, p._tier.tolist(), p._need.tolist(),
            p._done.tolist(), p._uses.tolist(), p._stream[:n].tolist(), p._next[:n].tolist(),
            p._cons[:n].tolist())


OPS = st.lists(st.tuples(st.sampled_from(["advance", "advance", "consume", "consume", "consume_range",
                                          "skip", "drop", "adopt", "extend", "read"]),
                         st.integers(0, 1 << 30)), max_size=80)


@pytest.mark.slow
@SETTINGS
@given(c=catalogs(), ops=OPS)
def test_driven_step_by_step_the_core_keeps_the_python_state(monkeypatch: pytest.MonkeyPatch, c: dict,
                                                             ops: list[tuple[str, int]]) -> None:
    """Two planners, one advancing in C and one in Python, fed the same
    steps: the same actions, and the same arrays after every step."""
    monkeypatch.setattr(planner, "TRIM_MIN", c["trim"])
    a = Planner(c["sizes"], c["caps"], window=c["window"])
    b = Planner(c["sizes"], c["caps"], window=c["window"])
    epochs = list(c["epochs"])
    files = len(c["sizes"])

    def advance(p: Planner, engine: str) -> list[tuple]:
        with monkeypatch.context() as m:
            m.setenv("TIERING_PLANNER", engine) if engine == "python" else m.delenv("TIERING_PLANNER", raising=False)
            return as_tuples(p.advance())

    for op, x in [("extend", 0), *ops, ("advance", 0)]:
        r = a.reader
        if op == "extend":
            if epochs:
                order = epochs.pop(0)
                a.extend(order)
                b.extend(order)
        elif op == "advance":
            assert advance(a, "c") == advance(b, "python")
        elif op == "read":
            # simulate()'s loop from the reader, also with positions after it
            # consumed (its reader reads them in order: up to the first one)
            ahead = np.flatnonzero(a._cons[r - a.base:a._n])
            stop = min(a.end, r + x % 20, r + int(ahead[0]) if ahead.size else a.end)
            ra, rb = (planner.EpochReport(hits=[0] * len(c["caps"])) for _ in "ab")
            kept_a: list[planner.Actions] = []
            kept_b: list[planner.Actions] = []
            planner._run_core(a, ra, r, stop, kept_a)
            with monkeypatch.context() as m:
                m.setenv("TIERING_PLANNER", "python")
                planner._run_python(b, rb, r, stop, kept_b, planner._Log())
            assert ra.as_dict() == rb.as_dict()
            assert as_tuples(planner.Actions.concat(kept_a)) == as_tuples(planner.Actions.concat(kept_b))
        elif op == "consume":
            for p in (a, b):
                p.consume(r + x % 6 - 1)
        elif op == "consume_range":
            for p in (a, b):
                p.consume_range(r, r + x % 9)
        elif op == "skip":
            for p in (a, b):
                p.skip_to(r + x % 5)
        elif op == "drop":
            for p in (a, b):
                p.drop(x % files)
        elif op == "adopt":
            for p in (a, b):
                p.adopt(x % files, (x >> 8) % len(c["caps"]))
        assert state(a) == state(b)


@pytest.mark.parametrize("seed", range(4))
def test_a_node_share_over_many_epochs_with_several_tiers(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Larger: 300 files, a node's eighth of a permutation per epoch (most
    resident files without a known next use: the idle sets), two tiers, the
    stream trimmed often; C and Python give the reference's plan."""
    monkeypatch.setattr(planner, "TRIM_MIN", 50)
    rng = np.random.default_rng(seed)
    n = 300
    sizes = rng.integers(1, 9000, n).tolist()
    caps = [20 * 4096, 45 * 4096]
    epochs = [rng.permutation(n)[::8].tolist() for _ in range(12)]
    want_r, want_s = ref.simulate(epochs, sizes, caps, window=16, known_ahead=1)
    want = ([r.as_dict() for r in want_r], as_tuples(want_s))
    assert sum(1 for a in want_s if a.kind == "evict") > 100   # the case evicts
    for engine in ("c", "python"):
        assert run(engine, monkeypatch, epochs, sizes, caps, window=16, known_ahead=1) == want, engine


@pytest.mark.parametrize("core", ["c", "python"])
@pytest.mark.parametrize("case", ["one tier", "two tiers", "a file no tier holds", "a share per epoch"])
def test_simulate_once_all_is_placed_counts_as_the_planner_walks(monkeypatch: pytest.MonkeyPatch, core: str,
                                                                  case: str) -> None:
    """Once every file a tier can hold is placed, simulate() counts the
    epochs left from the orders (NOTE [plan fast-forward]); the same reports
    and actions as the planner's walk over each position, which a file that
    fits and is never read keeps going."""
    if core == "python":
        monkeypatch.setenv("TIERING_PLANNER", "python")
    rng = np.random.default_rng(len(case))
    n = 300
    sizes = rng.integers(1, 5 * BLOCK, n)
    caps = {"one tier": [int(sizes.sum()) * 2], "two tiers": [int(sizes.sum()) // 3, int(sizes.sum()) * 2],
            "a file no tier holds": [int(sizes.sum()) * 2], "a share per epoch": [int(sizes.sum()) * 2]}[case]
    if case == "a file no tier holds":
        sizes[7] = caps[0] * 4
    if case == "a share per epoch":   # each epoch a random half: files keep coming for several epochs
        epochs = [rng.permutation(n)[: n // 2] for _ in range(12)]
    else:
        epochs = [rng.permutation(n) for _ in range(6)]
    walked_sizes = np.r_[sizes, 1]          # file n: fits, never read
    counted: list[int] = []
    real = planner._all_placed

    def spy(p, reports, known, source):  # type: ignore[no-untyped-def]
        counted.append(len(reports))
        real(p, reports, known, source)
    monkeypatch.setattr(planner, "_all_placed", spy)
    fast, fast_acts = simulate(iter(epochs), sizes, caps, window=16)
    assert len(counted) == 1 and 1 <= counted[0] < len(epochs) - 1   # the epochs after it counted
    walked, walked_acts = simulate(iter(epochs), walked_sizes, caps, window=16)
    assert len(counted) == 1
    assert [r.as_dict() for r in fast] == [r.as_dict() for r in walked]
    assert as_tuples(fast_acts) == as_tuples(walked_acts)
    assert len(fast) == len(epochs) and sum(r.accesses for r in fast) == sum(len(e) for e in epochs)
    unplaced = int(np.sum(epochs[-1] == 7)) if case == "a file no tier holds" else 0   # read from the PFS
    assert fast[-1].fetches == 0 and sum(fast[-1].hits) == len(epochs[-1]) - unplaced
