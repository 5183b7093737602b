"""The per-group sorts and quantiles behind the execution estimate (decompose.estimate_execution) and the query
profile (digest.profile): core.groups.sorted_by_group and decompose._group_quantiles against what they replaced, a
stable argsort of the values then of the groups, and pandas' groupby quantile: the same numbers, ties, −0.0 and
groups without values included."""

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from pcapdecomp.core.groups import sorted_by_group
from pcapdecomp.explain.decompose import _group_quantiles

VALUES = st.sampled_from([0.0, -0.0, 1.0, 2.5, 1e-3, 7.0, 1e9]) | st.floats(-1e6, 1e6, allow_nan=False)


@st.composite
def grouped(draw):
    n = draw(st.integers(1, 9))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), VALUES), max_size=60))
    return (np.array([k for k, _ in pairs], dtype=np.int64), np.array([v for _, v in pairs], dtype=np.float64), n)


@settings(max_examples=300, deadline=None)
@given(grouped())
def test_sorted_by_group_is_the_two_stable_sorts(case):
    k, v, n = case
    values, start, count = sorted_by_group(k, v, n)
    order = np.argsort(v, kind="stable")
    order = order[np.argsort(k[order], kind="stable")]
    assert np.array_equal(values, v[order])
    assert np.array_equal(np.signbit(values), np.signbit(v[order]))  # −0.0 where it was
    assert count.tolist() == np.bincount(k, minlength=n).tolist()
    assert start.tolist() == [int(count[:g].sum()) for g in range(n)]


@settings(max_examples=300, deadline=None)
@given(grouped())
def test_group_quantiles_are_pandas_groupby_quantiles(case):
    k, v, n = case
    qs = (0.1, 0.5, 0.9)
    got = _group_quantiles(k, v, n, qs)
    table = pd.DataFrame({"k": k, "s": v}).groupby("k")["s"].quantile(list(qs)).unstack() if len(k) else None
    for q, values in zip(qs, got):
        expected = np.full(n, np.nan)
        if table is not None:
            expected[table.index.to_numpy()] = table[q].to_numpy()
        assert np.array_equal(values, expected, equal_nan=True)


@settings(max_examples=300, deadline=None)
@given(grouped(), st.lists(st.booleans(), max_size=60))
def test_group_sum_weighs_nan_rows_zero_as_leaving_them_out(case, holes):
    from pcapdecomp.core.groups import group_sum

    k, v, n = case
    v = v.copy()
    v[np.flatnonzero(np.array(holes[:len(v)] + [False] * (len(v) - len(holes[:len(v)])), dtype=bool))] = np.nan
    sums, count = group_sum(k, v, n)
    ok = ~np.isnan(v)
    expected_count = np.bincount(k[ok], minlength=n)
    expected = np.where(expected_count > 0, np.bincount(k[ok], weights=v[ok], minlength=n), np.nan)
    assert count.tolist() == expected_count.tolist()
    assert np.array_equal(sums, expected, equal_nan=True)
    assert np.array_equal(np.signbit(sums), np.signbit(expected))
