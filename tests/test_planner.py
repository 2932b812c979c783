"""tiering.clairvoyant.planner against an exact optimum on small cases, its invariants on
larger random cases (checked after every step), the PFS bound D - C on large
cases, lazy eviction, the frequency rule, tier order and speed."""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from reference_planner import Tally, reads

from tiering.clairvoyant.planner import INF, Action, EpochReport, Planner, allocation, simulate


def unit(_: int) -> int:
    return 1


def exact(s: int) -> int:
    return s


# -- a driver that runs a Planner like `simulate`, with any allocation, and checks
# -- the invariants after every advance and every consume ---------------------------

@dataclass
class Run:
    planner: Planner
    reports: list[EpochReport]
    schedule: list[Action]


def drive(epochs: Sequence[Sequence[int]], sizes: Sequence[int], capacities: Sequence[int], *,
          window: int | None = None, known_ahead: int = 1,
          alloc: Callable[[int], int] = allocation, check: bool = True) -> Run:
    p = Planner(sizes, capacities, window=window, alloc=alloc)
    tally = Tally(epochs, sizes, len(capacities), EpochReport)
    schedule: list[Action] = []
    run = Run(p, tally.reports, schedule)
    # shadow state, rebuilt from the actions alone
    where: dict[int, int] = {}
    used = [0] * len(capacities)
    unread: dict[int, int] = {}   # prefetched file -> the stream position it was fetched for
    group: list[Action] = []      # evictions since the last fetch (they make room for the next)

    def check_state() -> None:
        assert where == p.resident
        assert used == p.used
        for k, cap in enumerate(capacities):
            assert p.used[k] <= cap
            assert p.used[k] == sum(alloc(sizes[f]) for f, t in p.resident.items() if t == k)

    for e, pos in reads(p, epochs, known_ahead):
        for a in p.advance():
            schedule.append(a)
            tally.action(a)
            if a.kind == "fetch":
                if check:
                    assert a.file not in where, f"fetch of resident file {a.file}"
                    assert 0 <= a.tier < len(capacities)
                    assert a.position == p.reader == pos
                    assert pos <= a.need < p.end and p.file_at(a.need) == a.file
                    if window is not None and a.need >= pos + window:
                        assert not group, "evicted for a fetch beyond the window"
                    group.clear()
                    need = alloc(sizes[a.file])
                    assert all(capacities[j] - used[j] < need for j in range(a.tier)), \
                        f"file {a.file} put in tier {a.tier} while a faster tier has room"
                    where[a.file] = a.tier
                    used[a.tier] += need
                    assert used[a.tier] <= capacities[a.tier], "scheduled beyond capacity"
                    unread[a.file] = a.need
            else:
                assert a.kind == "evict"
                if check:
                    group.append(a)
                    assert where.get(a.file) == a.tier, f"evict of non-resident file {a.file}"
                    assert a.file not in unread, \
                        f"file {a.file} prefetched for {unread.get(a.file)} evicted unread at {pos}"
                    del where[a.file]
                    used[a.tier] -= alloc(sizes[a.file])
        if check:
            check_state()
        f = p.file_at(pos)
        tier = p.resident.get(f)
        if check:
            assert where.get(f) == tier
            if unread.get(f) == pos:
                assert tier is not None
                del unread[f]
        tally.read(e, f, tier)
        p.consume(pos)
        if check:
            check_state()
    if check:
        assert not unread
    return run


def cost(run: Run) -> int:
    return sum(r.pfs_bytes for r in run.reports)


# -- the exact optimum: demand paging (every access served from a tier), fetch
# -- cost = size, exhaustive over the sets of resident files -----------------------

def optimum(stream: Sequence[int], sizes: Sequence[int], capacities: Sequence[int]) -> int:
    """Least total fetch cost of serving `stream` from tiers of these
    capacities in bytes (a file takes exactly its size, one copy at most).
    Prefetching never lowers this cost (any schedule can be made lazy), so
    demand paging searched exhaustively is the optimum.  A state gives each
    file's tier (-1: not resident)."""
    n, tiers = len(sizes), len(capacities)
    best: dict[tuple[int, ...], int] = {(-1,) * n: 0}
    for f in stream:
        nxt: dict[tuple[int, ...], int] = {}
        for state, c in best.items():
            if state[f] >= 0:
                if c < nxt.get(state, INF):
                    nxt[state] = c
                continue
            c += sizes[f]
            resident = [g for g in range(n) if state[g] >= 0]
            for keep in range(1 << len(resident)):   # any residents may go
                s = [-1] * n
                for i, g in enumerate(resident):
                    if keep >> i & 1:
                        s[g] = state[g]
                for k in range(tiers):
                    s[f] = k
                    used = [0] * tiers
                    for g in range(n):
                        if s[g] >= 0:
                            used[s[g]] += sizes[g]
                    if all(u <= cap for u, cap in zip(used, capacities)):
                        t = tuple(s)
                        if c < nxt.get(t, INF):
                            nxt[t] = c
        best = nxt
    return min(best.values())


def random_stream(rng: random.Random, files: int, length: int) -> list[int]:
    return [rng.randrange(files) for _ in range(length)]


def test_optimum_by_hand() -> None:
    # the classic: capacity 3, Belady faults 7 times on this stream
    s = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1]
    assert optimum(s, [1] * 8, [3]) == 9
    assert optimum([0, 1, 0, 1], [1, 1], [1]) == 4
    assert optimum([0, 1, 0, 1], [1, 1], [2]) == 2
    assert optimum([0, 1, 0, 1], [1, 1], [1, 1]) == 2
    # a big file kept beats two small ones: sizes 3, 1, 1, capacity 4
    assert optimum([0, 1, 2, 0, 1, 2, 0], [3, 1, 1], [4]) == 3 + 1 + 1 + 1 + 1
    # two tiers: the big file alone in one, the small ones share the other
    assert optimum([0, 1, 2, 0, 1, 2, 0], [3, 1, 1], [3, 2]) == 5


def small_case(seed: int, *, sized: bool = False) -> tuple[list[int], list[int], int]:
    """A stream over 3-6 files, 6-14 accesses; unit sizes and a capacity of 2-3
    files, or sizes 1-5 and a capacity of 2-3 average files (at least the largest)."""
    rng = random.Random(seed)
    n = rng.randint(3, 6)
    stream = random_stream(rng, n, rng.randint(6, 14))
    if not sized:
        return stream, [1] * n, rng.randint(2, 3)
    sizes = [rng.randint(1, 5) for _ in range(n)]
    return stream, sizes, max(max(sizes), rng.randint(2, 3) * 3)


SMALL = range(300)


def test_belady_equals_optimum_unit_sizes() -> None:
    """One tier, unit sizes, window 1 (evictions just in time): Belady's rule
    is optimal."""
    for seed in SMALL:
        stream, sizes, cap = small_case(seed)
        run = drive([stream], sizes, [cap], window=1, alloc=unit)
        assert run.reports[0].pfs_reads == 0          # every access served from the tier
        assert cost(run) == optimum(stream, sizes, [cap]), (seed, stream, cap)


def test_variable_sizes_within_twice_optimum() -> None:
    worst = 0.0
    for seed in SMALL:
        stream, sizes, cap = small_case(seed, sized=True)
        run = drive([stream], sizes, [cap], window=1, alloc=exact)
        assert run.reports[0].pfs_reads == 0
        opt = optimum(stream, sizes, [cap])
        c = cost(run)
        assert opt <= c <= 2 * opt, (seed, stream, sizes, cap, opt, c)
        worst = max(worst, c / opt)
    print(f"variable sizes, one tier, window 1: worst cost / optimum = {worst:.4f}")


def test_variable_sizes_two_tiers_within_twice_optimum() -> None:
    """The worst case here (1.73) is placement, not eviction: stream 0 1 2 0 1 0
    2 0 0, sizes 3 5 3, tiers 5 and 6: file 0 goes to tier 0 (fastest with
    room), where the optimum puts file 1 and keeps 0 and 2 together in tier 1."""
    worst = 0.0
    for seed in range(100):
        stream, sizes, cap = small_case(seed, sized=True)
        stream = [f for f in stream if f < 5]
        sizes = sizes[:5]
        caps = [max(sizes), cap]
        run = drive([stream], sizes, caps, window=1, alloc=exact)
        assert run.reports[0].pfs_reads == 0
        opt = optimum(stream, sizes, caps)
        assert opt <= cost(run) <= 2 * opt, (seed, stream, sizes, caps)
        worst = max(worst, cost(run) / opt)
    print(f"variable sizes, two tiers, window 1: worst cost / optimum = {worst:.4f}")


def test_two_tiers_unit_sizes_equal_one_tier_optimum() -> None:
    for seed in SMALL:
        rng = random.Random(10_000 + seed)
        stream, sizes, _ = small_case(seed)
        caps = [rng.randint(1, 2), rng.randint(1, 2)]
        opt = optimum(stream, sizes, [sum(caps)])
        if seed < 60:   # the search over two tiers agrees with the one over their sum
            assert optimum(stream, sizes, caps) == opt
        run = drive([stream], sizes, caps, window=1, alloc=unit)
        assert run.reports[0].pfs_reads == 0
        assert cost(run) == opt, (seed, stream, caps)


@pytest.mark.slow
@pytest.mark.parametrize("window", [2, 4, None])
def test_prefetching_ahead_on_small_cases(window: int | None) -> None:
    """Fetching ahead never beats the optimum and stays within 2x of it on these
    cases; the planner with any window on two tiers does what it does on one
    tier of their summed capacity (eviction is across tiers)."""
    worst = 0.0
    for seed in SMALL:
        stream, sizes, cap = small_case(seed)
        run = drive([stream], sizes, [cap], window=window, alloc=unit)
        assert run.reports[0].pfs_reads == 0
        opt = optimum(stream, sizes, [cap])
        assert opt <= cost(run) <= 2 * opt
        worst = max(worst, cost(run) / opt)
        caps = [cap - 1, 1]
        two = drive([stream], sizes, caps, window=window, alloc=unit)
        assert cost(two) == cost(run)
        stream, sizes, cap = small_case(seed, sized=True)
        run = drive([stream], sizes, [cap], window=window, alloc=exact)
        assert run.reports[0].pfs_reads == 0
        assert cost(run) >= optimum(stream, sizes, [cap])
    print(f"window {window}, unit sizes: worst cost / optimum = {worst:.4f}")


@pytest.mark.parametrize("window", [2, None])
def test_prefetching_ahead_trades_a_few_fetches_for_lead(window: int | None) -> None:
    """A prefetched file that is not read yet is never evicted, so fetching
    ahead can cost fetches Belady would save by waiting for the reader (the
    planner keeps the prefetch's lead instead; see _make_room).  E.g.
    [1, 0, 2, 2, 1, 1, 2], one tier of 2 files: at reader 1 the planner fetches
    2 for position 2 and evicts 1 (needed at 4) because 0 is still to be read
    at 1; just in time it would evict 0 (never used again): 4 fetches where 3
    do.  Never fewer than the optimum, never more than twice it."""
    hand = [1, 0, 2, 2, 1, 1, 2]
    assert optimum(hand, [1] * 3, [2]) == 3
    assert cost(drive([hand], [1] * 3, [2], window=window, alloc=unit)) == 4
    for seed in SMALL:
        stream, sizes, cap = small_case(seed)
        run = drive([stream], sizes, [cap], window=window, alloc=unit)
        best = optimum(stream, sizes, [cap])
        assert best <= cost(run) <= 2 * best, (seed, stream, cap)


# -- invariants on larger random cases ------------------------------------------------

KiB = 1024


def random_case(seed: int, files: int = 300, epochs: int = 4, tiers: int = 2,
                share: float = 0.5) -> tuple[list[list[int]], list[int], list[int]]:
    """Sizes 1 KiB - 500 KiB, seeded permutations, tiers splitting share * D at random."""
    rng = random.Random(seed)
    sizes = [rng.randint(KiB, 500 * KiB) for _ in range(files)]
    orders = []
    for _ in range(epochs):
        o = list(range(files))
        rng.shuffle(o)
        orders.append(o)
    total = int(share * sum(sizes))
    cuts = sorted(rng.randint(0, total) for _ in range(tiers - 1))
    caps = [b - a for a, b in zip([0] + cuts, cuts + [total])]
    caps = [max(c, 500 * KiB) for c in caps]   # every file fits every tier
    return orders, sizes, caps


# the first case in the quick loop, the others slow (about a second each)
INVARIANT_CASES = [pytest.param(seed, tiers, window, ahead, marks=() if seed == 0 else pytest.mark.slow)
                   for seed, (tiers, window, ahead) in enumerate(
                       (t, w, a) for t in (1, 2, 3) for w in (1, 8, 64, None) for a in (0, 1))]


@pytest.mark.parametrize("seed,tiers,window,ahead", INVARIANT_CASES)
def test_invariants_random(seed: int, tiers: int, window: int | None, ahead: int) -> None:
    """drive() checks after every advance and consume: used <= capacity, used =
    the allocations of the residents, the actions replay to the planner's state
    (an evict names a resident file, a fetch a file not resident: one tier per
    file), a hit is resident, a prefetched file is read before it is evicted,
    a fetch goes to the fastest tier with room."""
    rng = random.Random(seed)
    for share in (0.3, 0.7, 1.2):
        epochs = rng.randint(3, 5)
        orders, sizes, caps = random_case(1000 * seed + int(10 * share), epochs=epochs,
                                          tiers=tiers, share=share)
        run = drive(orders, sizes, caps, window=window, known_ahead=ahead)
        reps = run.reports
        assert [r.accesses for r in reps] == [len(o) for o in orders]
        for r in reps:
            assert sum(r.hits) + r.pfs_reads == r.accesses
        # the driver is simulate() plus checks
        ref, schedule = simulate(orders, sizes, caps, window=window, known_ahead=ahead)
        assert [r.as_dict() for r in ref] == [r.as_dict() for r in reps]
        assert schedule == run.schedule
        # each file is read from the PFS at least once, in total at most once per access
        assert sum(r.pfs_bytes for r in reps) >= sum(sizes)
        # every file fits every tier: fetched just in time if not before
        assert all(r.pfs_reads == 0 for r in reps)


def test_belady_order_of_victims() -> None:
    """A file evicted to fetch for position q has no use before q, and every
    file that stays in the tier q's file goes to, with no read pending
    before q, is needed no later."""
    for seed, (tiers, window, ahead) in enumerate([(1, 8, 1), (2, 64, 1), (3, None, 0), (2, 1, 0),
                                                   (1, None, 1)]):
        orders, sizes, caps = random_case(77 + seed, files=200, epochs=3, tiers=tiers, share=0.5)
        p = Planner(sizes, caps, window=window)
        pos = 0
        evictions = 0
        for e, order in enumerate(orders):
            if e == 0:
                for k in range(min(len(orders), 1 + ahead)):
                    p.extend(orders[k])
            elif e + ahead < len(orders):
                p.extend(orders[e + ahead])
            for _ in order:
                before = {f: p.need.get(f, INF) for f in p.resident}
                tier_of = dict(p.resident)
                actions = p.advance()
                group: list[Action] = []
                for a in actions:
                    if a.kind == "evict":
                        group.append(a)
                        continue
                    if group:
                        nearest = min(before[v.file] for v in group)
                        assert nearest > a.need
                        assert all(v.tier == a.tier for v in group) or tiers > 1
                        stay = [f for f in before if f in p.resident and tier_of[f] == a.tier and
                                before[f] >= a.need]
                        assert all(before[f] <= nearest for f in stay)
                        evictions += len(group)
                    group = []
                assert not group
                p.consume(pos)
                pos += 1
        assert evictions > 100


# -- the bound on large cases: PFS bytes per epoch near D - C -----------------------

def lognormal_sizes(n: int, seed: int, median: int = 110 * KiB) -> list[int]:
    rng = random.Random(seed)
    return [max(KiB, int(rng.lognormvariate(math.log(median), 0.35))) for _ in range(n)]


def permutations(n: int, epochs: int, seed: int) -> list[list[int]]:
    out = []
    for e in range(epochs):
        o = list(range(n))
        random.Random(seed * 1000 + e).shuffle(o)
        out.append(o)
    return out


BIG_N = 5000


@pytest.fixture(scope="module")
def big() -> tuple[list[int], list[list[int]]]:
    return lognormal_sizes(BIG_N, 5), permutations(BIG_N, 4, 5)


@pytest.mark.parametrize("split", [1, 2])
def test_pfs_bytes_near_d_minus_c(big: tuple[list[int], list[list[int]]], split: int) -> None:
    sizes, orders = big
    D = sum(sizes)
    C = D // 2
    caps = [C] if split == 1 else [C // 3, C - C // 3]
    t = time.perf_counter()
    reps, _ = simulate(orders, sizes, caps, window=16, known_ahead=1)
    took = time.perf_counter() - t
    ratios = [r.pfs_bytes / (D - C) for r in reps]
    print(f"{len(caps)} tier(s): PFS bytes / (D - C) per epoch {[round(x, 4) for x in ratios]}"
          f" ({took:.2f} s)")
    assert reps[0].pfs_bytes >= D                      # everything read once in epoch 1
    for r in reps[1:]:
        assert 0.8 * (D - C) <= r.pfs_bytes <= 1.05 * (D - C)
        assert r.pfs_reads == 0
    # the bytes above D - C are the 4 KiB block rounding: C holds fewer bytes of data
    data_capacity = C * sum(sizes) / sum(allocation(s) for s in sizes)
    for r in reps[1:]:
        assert r.pfs_bytes <= 1.005 * (D - data_capacity)


def test_default_window_pfs_bytes_near_d_minus_c(big: tuple[list[int], list[list[int]]]) -> None:
    """simulate's default window (64, the daemon's) keeps the PFS bytes near
    D - C per epoch.  (Without a window the planner would prefetch so far ahead
    that nearly all the cache holds unread files: it would read D + 4.1 (D - C)
    over 4 epochs.)"""
    sizes, orders = big
    D = sum(sizes)
    C = D // 2
    reps, _ = simulate(orders, sizes, [C], known_ahead=1)
    ratios = [r.pfs_bytes / (D - C) for r in reps]
    print(f"window None: PFS bytes / (D - C) per epoch {[round(x, 4) for x in ratios]}")
    # fetches for epoch e+1 are counted in epoch e: compare the totals
    assert sum(r.pfs_bytes for r in reps) <= D + 1.05 * (len(reps) - 1) * (D - C)


@pytest.mark.parametrize("tiers,window,ahead", [(1, 16, 1), (2, 16, 1), (1, None, 1), (3, 64, 0),
                                                (2, None, 0), (1, 1, 0)])
def test_data_that_fits(big: tuple[list[int], list[list[int]]], tiers: int, window: int | None,
                        ahead: int) -> None:
    """C >= D with slack: epoch 1 reads D from the PFS, later epochs nothing,
    all hits, nothing evicted -- also when each epoch's order only arrives as
    it starts (lazy eviction)."""
    sizes, orders = big
    sizes, orders = sizes[:2000], [[f for f in o if f < 2000] for o in orders]
    A = sum(allocation(s) for s in sizes)
    total = int(A * 1.02)
    caps = [total // tiers] * (tiers - 1) + [total - total // tiers * (tiers - 1)]
    caps = [c + 600 * KiB for c in caps]   # room for the largest file's rounding in each tier
    run = drive(orders, sizes, caps, window=window, known_ahead=ahead, check=False)
    reps = run.reports
    assert reps[0].pfs_bytes == sum(sizes)
    assert reps[0].pfs_reads == 0 and reps[0].fetches == len(sizes)
    for r in reps[1:]:
        assert r.pfs_bytes == 0 and r.fetches == 0 and r.pfs_reads == 0
        assert sum(r.hits) == r.accesses == len(sizes)
    assert all(r.evictions == 0 for r in reps)
    assert not [a for a in run.schedule if a.kind == "evict"]


def test_fits_known_ahead_zero_keeps_everything_between_epochs() -> None:
    """At the end of an epoch every file has no known next use; the next
    epoch's order arrives when it starts, and finds everything in place."""
    sizes = [4096] * 50
    orders = permutations(50, 4, 9)
    run = drive(orders, sizes, [4096 * 50], window=8, known_ahead=0)
    p = run.planner
    assert len(p.resident) == 50
    assert [r.fetches for r in run.reports] == [50, 0, 0, 0]
    assert [r.evictions for r in run.reports] == [0, 0, 0, 0]
    assert [r.hits for r in run.reports] == [[50]] * 4


# -- the frequency rule ----------------------------------------------------------------

def test_frequency_rule_small() -> None:
    """The frequency rule.  Files 0 and 1 are read four times, file 2
    once; then file 3 needs room in a tier of 3 files.  None of 0, 1, 2 has a
    known next use (known_ahead=0, last epoch): the least read, 2, must go.
    The planner evicts 0: `remaining` (uses not yet consumed) is always 0 for
    a file with no known next use, so the rule falls back to the file id."""
    stream = [0, 1, 0, 1, 2, 0, 1, 0, 1, 3]
    run = drive([stream], [1] * 4, [3], window=1, known_ahead=0, alloc=unit)
    evicted = [a.file for a in run.schedule if a.kind == "evict"]
    assert evicted == [2]


def test_frequency_rule_hot_files_survive_into_next_epoch() -> None:
    """The frequency rule.  An oversampled data set: 20 hot files read 5 times per
    epoch, 80 cold files once; the tier holds 40 files; each epoch's order is
    known only when it starts.  With no known next use, cold files go first,
    so every hot file is still resident when epoch 2 starts."""
    hot, cold = list(range(80, 100)), list(range(80))
    orders = []
    for e in range(3):
        o = hot * 5 + cold
        random.Random(e).shuffle(o)
        orders.append(o)
    # with the hot files' ids high, a tie-break on the id alone keeps them too;
    # renamed so that their ids are low, it does not
    for flip in (False, True):
        name = (lambda f: 99 - f) if flip else (lambda f: f)
        named = [[name(f) for f in o] for o in orders]
        hot_ids = {name(f) for f in hot}
        p = Planner([1] * 100, [40], window=8, alloc=unit)
        pos = 0
        for e, order in enumerate(named):
            if e == 1:
                resident = set(p.resident)
                assert hot_ids <= resident, (flip, sorted(hot_ids - resident))
            p.extend(order)
            for _ in order:
                for a in p.advance():
                    if a.kind == "evict" and p.need.get(a.file, INF) == INF:
                        # a victim without a known next use is read least often
                        assert a.file not in hot_ids or all(
                            g in hot_ids for g in p.resident if p.need.get(g, INF) == INF), (flip, a)
                p.consume(pos)
                pos += 1


# -- tiers ----------------------------------------------------------------------------------

def test_fastest_tier_with_room_first() -> None:
    sizes = [10_000] * 30
    caps = [allocation(10_000) * 10, allocation(10_000) * 8, allocation(10_000) * 20]
    orders = permutations(30, 3, 3)
    run = drive(orders, sizes, caps, window=None, known_ahead=1)
    tiers = [a.tier for a in run.schedule if a.kind == "fetch"][:30]
    assert tiers == [0] * 10 + [1] * 8 + [2] * 12          # tier 0 fills, then 1, then 2
    by_file = {a.file: a.tier for a in run.schedule if a.kind == "fetch"}
    assert [by_file[f] for f in orders[0]] == tiers       # in stream order
    assert run.reports[1].hits == [10, 8, 12]
    assert run.planner.used == [caps[0], caps[1], allocation(10_000) * 12]


def test_fastest_tier_with_room_variable_sizes() -> None:
    """A file that does not fit in tier 0's free room goes to tier 1, and a
    later smaller one still goes to tier 0."""
    sizes = [6000, 6000, 9000, 3000]
    p = Planner(sizes, [16384, 100_000], window=None)
    p.extend([0, 1, 2, 3])
    fetches = [(a.file, a.tier) for a in p.advance()]
    assert fetches == [(0, 0), (1, 0), (2, 1), (3, 1)]   # tier 0: 8192 + 8192 = full
    p = Planner(sizes, [20480, 100_000], window=None)
    p.extend([0, 1, 2, 3])
    fetches = [(a.file, a.tier) for a in p.advance()]
    assert fetches == [(0, 0), (1, 0), (2, 1), (3, 0)]   # 4096 left in tier 0 for file 3


def test_eviction_makes_room_only_where_the_file_goes() -> None:
    """Victims only from the tier the file goes to.  Tiers of 10 and 10 bytes, files C=0 (8),
    A=1 (2), B=2 (6), F=3 (6); stream C A B F C B A.  C and A fill tier 0, B
    goes to tier 1.  For F the planner evicts A (farthest, tier 0: frees 2,
    not enough) then B (tier 1): F goes to tier 1 and A was evicted for
    nothing, fetched again at the end: 30 bytes where 28 do."""
    stream, sizes, caps = [0, 1, 2, 3, 0, 2, 1], [8, 2, 6, 6], [10, 10]
    run = drive([stream], sizes, caps, window=1, alloc=exact)
    assert optimum(stream, sizes, caps) == 28
    # every eviction is in the tier of the fetch it makes room for
    pending: list[Action] = []
    for a in run.schedule:
        if a.kind == "evict":
            pending.append(a)
        else:
            assert all(v.tier == a.tier for v in pending), (pending, a)
            pending = []
    assert cost(run) == 28


def test_file_too_large_for_every_tier_does_not_stall_prefetching() -> None:
    """A file that fits no tier does not stop prefetching.  File 0 fits no tier: it can only be
    read from the PFS, but the planner stops at it and fetches nothing ahead
    until the reader has passed it."""
    p = Planner([100_000, 4096, 4096, 4096], [3 * 4096], window=None)
    p.extend([0, 1, 2, 3])
    assert [(a.kind, a.file) for a in p.advance()] == [("fetch", 1), ("fetch", 2), ("fetch", 3)]


# -- size ---------------------------------------------------------------------------------------

def test_simulate_of_20k_files_serves_every_access() -> None:
    """20,000 files x 3 epochs through the planner: every access is served and
    epoch 1 reads the data set from the PFS.  Its time is printed, not
    asserted (speed is the benchmarks' business)."""
    n = 20_000
    sizes = lognormal_sizes(n, 11)
    orders = permutations(n, 3, 11)
    D = sum(sizes)
    for caps, window in (([D // 2], 64), ([D // 4, D // 4], None)):
        t = time.perf_counter()
        reps, schedule = simulate(orders, sizes, caps, window=window)
        took = time.perf_counter() - t
        print(f"simulate {n} files x 3 epochs, {len(caps)} tier(s), window {window}: {took:.2f} s,"
              f" {len(schedule)} actions")
        assert sum(r.accesses for r in reps) == 3 * n
        assert reps[0].pfs_bytes >= D


@pytest.mark.slow
def test_consumed_stream_is_trimmed_without_changing_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner forgets the consumed head of the stream (memory follows the
    known future, not the run's length), and the plan is the same as without."""
    import tiering.clairvoyant.planner as planner_mod

    n, epochs = 300, 12
    sizes = lognormal_sizes(n, 5)
    orders = permutations(n, epochs, 5)
    caps = [sum(sizes) // 3, sum(sizes) // 4]
    monkeypatch.setattr(planner_mod, "TRIM_MIN", INF)
    whole = drive(orders, sizes, caps, window=64)
    assert whole.planner.base == 0 and len(whole.planner.stream) == n * epochs
    monkeypatch.setattr(planner_mod, "TRIM_MIN", 50)
    trimmed = drive(orders, sizes, caps, window=64)
    p = trimmed.planner
    assert p.base > 0 and p.end == n * epochs
    assert len(p.stream) <= 2 * n and len(p.next_pos) == len(p.stream)
    assert trimmed.schedule == whole.schedule
    assert [r.as_dict() for r in trimmed.reports] == [r.as_dict() for r in whole.reports]


def test_adopting_many_copies_at_once_is_adopting_each():
    """A new plan adopts what is placed (tens of thousands of copies) in one
    pass: the same residents, fill and decisions as one at a time."""
    rng = np.random.default_rng(2)
    sizes = rng.integers(1, 20_000, 500)
    files, tiers = rng.integers(0, 500, 300), rng.integers(0, 2, 300)
    one, many = (Planner(sizes, [600_000, 900_000], window=32) for _ in range(2))
    for f, t in zip(files.tolist(), tiers.tolist()):
        one.adopt(f, t)
    many.adopt_many(files, tiers)
    assert one.resident.as_dict() == many.resident.as_dict() and one.used == many.used
    order = rng.permutation(500)
    for p in (one, many):
        p.extend(order)
    assert one.advance() == many.advance()


def test_an_epoch_made_known_reuses_the_room_of_the_consumed_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """Extending the stream drops the consumed head rather than doubling the
    buffers (13 B a position: at 1.28 M files a doubling was ~65 MiB), and
    the plan is unchanged by it."""
    import tiering.clairvoyant.planner as planner_mod

    monkeypatch.setattr(planner_mod, "TRIM_MIN", 50)
    n = 600
    sizes = lognormal_sizes(n, 7)
    orders = permutations(n, 4, 7)
    p = Planner(sizes, [sum(sizes) * 2], window=64)
    for order in orders[:3]:
        p.extend(order)
    room = len(p._stream)
    assert 3 * n <= room < 4 * n
    p.consume_range(0, n + n // 5)                  # 1.2 epochs read: not yet trimmed (less than the rest)
    assert p.base == 0
    p.extend(orders[3])
    assert len(p._stream) == room and p.base == n + n // 5 and p.end == 4 * n
    assert p.stream.tolist() == [f for o in orders for f in o][n + n // 5:]
    assert p.need_of(orders[3][:1])[0] <= 3 * n + n     # the new epoch's uses are linked


def test_the_c_core_lets_go_of_a_large_log_once_taken() -> None:
    """An epoch's fetches planned at once (26 B each in the C core's log,
    its buffers doubled past them) are copied out, and the log's buffers
    released."""
    import tiering.clairvoyant.planner as planner_mod

    if not planner_mod.core_available():
        pytest.skip("libtierplan.so is not built")
    n = planner_mod.LOG_KEEP + 5000
    p = Planner([4096] * n, [4096 * n * 2], window=64)
    p.extend(list(range(n)))
    actions = p.advance()
    assert len(actions) == n and actions.file.tolist() == list(range(n))
    assert p._core is not None and p._core.c.log_cap == 0
    p.consume_range(0, n)                           # and the core goes on: the next epoch is all resident
    p.extend(list(range(n)))
    assert len(p.advance()) == 0 and p.cursor == 2 * n
