"""The slow-log join's search structures, which hold their numbers as machine integers (array.array, numpy views
over the same bytes) to keep the join's memory per exchange small, against the plain definitions they stand for:
the time index lists exactly the items that may overlap a query window, and a chain's positions per key are the
sorted positions in the chain of the key's slots that are in it."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pcapdecomp.slowlog.join import _ChainPositions, _TimeIndex

TIMES = st.integers(min_value=1_790_000_000 * 10**9, max_value=1_790_000_100 * 10**9)
WIDTHS = st.integers(min_value=-5, max_value=3 * 10**9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(TIMES, WIDTHS), max_size=60), TIMES, TIMES)
def test_time_index_lists_every_item_that_may_overlap(items, a, b):
    ids = np.arange(100, 100 + len(items), dtype=np.int64)
    start = np.array([s for s, _ in items], dtype=np.int64)
    width = np.array([w for _, w in items], dtype=np.int64)
    index = _TimeIndex(ids, start, width)
    listed = list(index.query(a, b))
    sliced = [int(i) for part in index.slices(a, b) for i in part]
    assert sorted(listed) == sorted(sliced)
    assert len(set(listed)) == len(listed)
    assert all(isinstance(i, int) for i in listed)
    # every item that overlaps [b, a] is listed (start ≤ a and start + width ≥ b), and none that starts after a
    overlapping = {int(i) for i, s, w in zip(ids, start, np.maximum(width, 0)) if s <= a and s + w >= b}
    assert overlapping <= set(listed)
    assert all(start[i - 100] <= a for i in listed)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=40).flatmap(
    lambda n: st.tuples(st.just(n), st.permutations(range(n)), st.integers(min_value=0, max_value=n),
                        st.dictionaries(st.sampled_from([("t", "a"), ("t", "b"), ("x", 1, ()), ("w", 2)]),
                                        st.lists(st.integers(min_value=0, max_value=max(n - 1, 0)), max_size=12)
                                        if n else st.just([])))))
def test_chain_positions_are_the_positions_of_the_keys_slots_in_the_chain(case):
    n, order, length, by_key = case
    chain = np.array(order[:length], dtype=np.int64)  # a connection's slots, in execution order
    positions = _ChainPositions(chain, by_key)
    where = {int(s): p for p, s in enumerate(chain.tolist())}
    for key, slots in by_key.items():
        expected = sorted(where[s] for s in slots if s in where)
        assert positions.get(key, "none") == (expected or "none")
    assert positions.get(("t", "never"), "none") == "none"
