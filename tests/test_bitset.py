"""The planner's 64-ary bit trees (tiering/clairvoyant/bitset.py): any mix of
single and bulk additions and removals leaves the members, the smallest and
the largest those of a plain set; distinct_small is np.unique for small ids."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiering.clairvoyant.bitset import BitSet, distinct_small

SIZES = st.sampled_from([1, 63, 64, 65, 4096, 4097, 300_000])


@pytest.mark.slow
@settings(max_examples=200, deadline=None, derandomize=True)
@given(size=SIZES, data=st.data())
def test_a_bit_tree_holds_what_a_set_holds(size: int, data: st.DataObject) -> None:
    bs, ref = BitSet(size), set()
    member = st.integers(0, size - 1)
    for _ in range(data.draw(st.integers(1, 12))):
        op = data.draw(st.sampled_from(["add", "discard", "add_many", "discard_many"]))
        if op in ("add", "discard"):
            i = data.draw(member)
            getattr(bs, op)(i)
            ref.add(i) if op == "add" else ref.discard(i)
        else:
            n = data.draw(st.sampled_from([1, 5, 70, 5000]))
            picks = np.asarray(data.draw(st.lists(member, min_size=1, max_size=8)), np.int64)
            many = np.concatenate([picks, np.random.default_rng(len(ref)).integers(0, size, n)])
            getattr(bs, op)(many)
            ref.update(many.tolist()) if op == "add_many" else ref.difference_update(many.tolist())
        assert bs.members().tolist() == sorted(ref)
        assert (bs.min(), bs.max()) == ((min(ref), max(ref)) if ref else (-1, -1))
        assert bool(bs) == bool(ref)


@given(values=st.lists(st.integers(0, 99), max_size=50))
def test_distinct_small_is_unique(values: list[int]) -> None:
    for dtype in (np.int8, np.int32, np.int64):
        a = np.asarray(values, dtype)
        assert distinct_small(a, 100).tolist() == np.unique(a).tolist()
