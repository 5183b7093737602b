"""The thread-pool view's step functions and bucket sums (threadpool._count_steps, _step_extremes, _Intervals,
_histogram, _bucket_max) against their definitions, counted one interval and one bucket at a time: the vectorised
forms (one plain sort with the kind in the lowest bit, slices reduced at once, sorted ends shared by the views)
must give what the definitions give, ties, empty intervals and times far apart included."""

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from pcapdecomp.explain.threadpool import _bucket_max, _count_steps, _Intervals, _occupancy, _step_extremes

BASES = st.sampled_from([0, 1_764_000_000 * 10**9, -(2**62), 2**62])


@st.composite
def intervals(draw):
    base = draw(BASES)
    n = draw(st.integers(0, 40))
    starts = np.array(draw(st.lists(st.integers(0, 60), min_size=n, max_size=n)), dtype=np.int64) + base
    lengths = np.array(draw(st.lists(st.integers(-2, 25), min_size=n, max_size=n)), dtype=np.int64)
    edges = np.unique(np.array(draw(st.lists(st.integers(-5, 90), min_size=2, max_size=9)), dtype=np.int64)) + base
    return starts, np.minimum(starts + lengths, 2**63 - 1), edges


def counted(starts, ends, t):
    live = ends > starts
    return int(((starts[live] <= t) & (t < ends[live])).sum())


@settings(max_examples=300, deadline=None)
@given(intervals())
def test_count_steps_is_the_count_at_every_start_and_end(case):
    starts, ends, _ = case
    times, counts = _count_steps(starts, ends)
    live = ends > starts
    assert times.tolist() == sorted(set(starts[live].tolist()) | set(ends[live].tolist()))
    assert counts.tolist() == [counted(starts, ends, t) for t in times.tolist()]
    assert times.dtype == counts.dtype == np.int64


def test_count_steps_far_apart_times():
    """Times more than 2⁶² ns apart take the stable-sort path: the same counts."""
    starts = np.array([-(2**62), 0, 5, 2**62 - 10], dtype=np.int64)
    ends = np.array([10, 2**62, 5, 2**62], dtype=np.int64)
    times, counts = _count_steps(starts, ends)
    assert times.tolist() == [-(2**62), 0, 10, 2**62 - 10, 2**62]
    assert counts.tolist() == [counted(starts, ends, t) for t in times.tolist()]


@settings(max_examples=300, deadline=None)
@given(intervals())
def test_step_extremes_are_the_min_and_max_over_each_bucket(case):
    starts, ends, edges = case
    times, counts = _count_steps(starts, ends)
    lo, hi = _step_extremes(times, counts, edges)
    for k in range(len(edges) - 1):
        a, b = int(edges[k]), int(edges[k + 1])
        seen = [counted(starts, ends, a)] + [counted(starts, ends, t) for t in times.tolist() if a <= t < b]
        assert (int(lo[k]), int(hi[k])) == (min(seen), max(seen))


@settings(max_examples=200, deadline=None)
@given(intervals())
def test_shared_sorted_ends_give_occupancy_and_histogram(case):
    starts, ends, edges = case
    if not len(edges) >= 2 or (ends < starts).any():
        return
    shared = _Intervals(edges)
    shared.put("s", starts)
    shared.put("e", ends)
    shared.put("e2", None, same_as="e")
    assert np.array_equal(shared.occupancy("s", "e"), _occupancy(starts, ends, edges))
    assert np.array_equal(shared.occupancy("s", "e2"), _occupancy(starts, ends, edges))
    assert np.array_equal(shared.counts("s"), np.histogram(starts, bins=edges)[0])
    assert np.array_equal(shared.counts("e2"), np.histogram(ends, bins=edges)[0])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 8), st.floats(0, 1e6)), max_size=40), st.integers(1, 7))
def test_bucket_max_is_groupby_max(pairs, nb):
    bucket = np.array([b for b, _ in pairs], dtype=np.int64)
    values = np.array([v for _, v in pairs], dtype=np.float64)
    expected = pd.Series(values).groupby(bucket).max().reindex(range(nb)).to_numpy()
    assert np.array_equal(_bucket_max(values, bucket, nb), expected, equal_nan=True)


def core_by_sorting(points: np.ndarray) -> tuple[int, int]:
    """core_range's definition: the biggest run without a CLUSTER_GAP_NS silence, sorted, less 1 % at each end."""
    from pcapdecomp.explain.threadpool import CLUSTER_GAP_NS

    p = np.sort(points)
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(p) > CLUSTER_GAP_NS) + 1, [len(p)]])
    biggest = int(np.argmax(np.diff(bounds)))
    c = p[bounds[biggest]:bounds[biggest + 1]]
    k = max(1, len(c) // 100) if len(c) >= 3 else 0
    return int(c[k]), int(c[len(c) - 1 - k])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 400), min_size=1, max_size=350), BASES,
       st.sampled_from([1, 10**6, 30 * 86400 * 10**9 // 400, 30 * 86400 * 10**9 // 400 + 1]))
def test_core_range_by_order_statistics_is_the_sorted_one(offsets, base, scale):
    from pcapdecomp.explain.threadpool import core_range

    points = np.array(offsets, dtype=np.int64) * scale + min(base, 2**62 - 400 * scale)
    assert core_range(points) == core_by_sorting(points)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-1, 70), max_size=80))
def test_rows_by_group_are_each_groups_mask(groups):
    from pcapdecomp.explain.threadpool import _rows_by_group

    group = np.array(groups, dtype=np.int64)
    got = _rows_by_group(group)
    expected = [(gid, np.flatnonzero(group == gid)) for gid in np.unique(group[group >= 0])]
    assert [int(g) for g, _ in got] == [int(g) for g, _ in expected]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got, expected))


def _rows_by_their_definitions(x: pd.DataFrame, threshold_ns: int) -> dict[str, np.ndarray]:
    """threadpool._rows' arrays as the formulas read, one numpy expression each (every row inside the span)."""
    from pcapdecomp.core.times import ts_ns
    from pcapdecomp.explain.decompose import NS

    d1, _ = ts_ns(x["db_req_ts"])
    d4, _ = ts_ns(x["db_resp_ts"])
    exec_s, queue_s, qmin = (x[c].to_numpy(dtype="float64", na_value=np.nan) for c in ("exec_s", "queue_s",
                                                                                      "queue_min_s"))
    exec_ns = np.where(~np.isnan(exec_s), np.rint(np.nan_to_num(exec_s) * NS), d4 - d1).astype(np.int64)
    q_min = np.rint(np.nan_to_num(qmin) * NS).astype(np.int64)
    upper = (x["exec_source"] == "below_long_query_time").to_numpy(dtype=bool, na_value=False)
    return {"xs": np.maximum(d4 - exec_ns, d1), "server": d4 - d1, "q_min": q_min,
            "q_end": np.minimum(d1 + np.rint(np.nan_to_num(queue_s) * NS).astype(np.int64), d4),
            "culprit_ok": ~np.isnan(exec_s) & (exec_ns >= threshold_ns) & (~upper | (q_min < threshold_ns))}


def test_rows_times_are_their_definitions_on_a_real_recording(bundled_analysis):
    """_rows makes its arrays in place (fewer temporaries of every row): the same values as the formulas written
    plainly, on two recordings' decomposed exchanges (a thread limit, a group stall), and with half of the
    executions unknown."""
    from pcapdecomp.explain.threadpool import _rows

    for name in ("maxthreads", "group-stall"):
        x = bundled_analysis(name).exchanges
        x = x[x["db_req_ts"].notna() & x["db_resp_ts"].notna()].reset_index(drop=True)
        half = x.assign(exec_s=x["exec_s"].where(np.arange(len(x)) % 2 == 0))
        for table in (x, half):
            r, outliers, _, _ = _rows(table, 100_000_000)
            assert len(outliers) == 0 and len(r.pos) == len(table) > 20
            want = _rows_by_their_definitions(table, 100_000_000)
            assert r.exec_known.sum() < len(table) or table is x
            assert (r.xs > r.d1).any() and (r.culprit_ok.any() or table is half)
            for column, values in want.items():
                assert np.array_equal(getattr(r, column), values), (name, column)
