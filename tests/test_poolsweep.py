"""explain/poolsweep.py against today's in-memory functions: pool.parquet's table (pool_table), groups.parquet's
(group_table) and the stalls (find_stalls) made by the streaming sweep from the timeline cut into P = 1, 3 and 16
random partitions, each sorted by D1 and merged k-way, are the same, to the bit, as those made from the whole
timeline: on the bundled sets with a thread pool, a tests/data capture, the 10 s recordings and synthetic timelines
(ties, empty intervals, two servers, unknown executions and groups, times far enough apart that _area sums in
float64)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcapdecomp.explain import threadpool as tp
from pcapdecomp.explain.poolsweep import _AreaStream, sweep_timeline, timeline_run

FIELD = Path(__file__).parent / "data" / "field"
RECORDINGS = Path("/tmp/pcapdecomp-bench")
THRESHOLD_NS = int(round(tp.STALL_MIN_QUEUE_S * tp.NS))
WITH_A_POOL = ("group-stall", "oltp-hogs", "field-default-stall", "maxthreads", "stall-fix-1-pool")


def same_frame(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """The same columns, dtypes and values, floats compared by their bytes (−0.0 is not 0.0, NaN is NaN)."""
    if list(a.columns) != list(b.columns) or len(a) != len(b) or not a.dtypes.equals(b.dtypes):
        return False
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind == "f" and x.tobytes() != y.tobytes():
            return False
        if x.dtype.kind != "f" and not np.array_equal(x, y):
            return False
    return True


def same_stalls(got: list[dict], want: list[dict]) -> bool:
    return len(got) == len(want) and all(
        a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) and np.asarray(a[k]).dtype == np.asarray(b[k]).dtype
                                     if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a)
        for a, b in zip(got, want))


def check_sweep(r: tp._Rows, group: np.ndarray, edges: np.ndarray, bucket_s: float, seed: int,
                parts=(1, 3, 16), steps=(None, 7)) -> tuple[int, int]:
    """The sweep of `r` cut into each number of partitions (rows dealt at random), merged in windows of each step,
    equals today's three functions of the whole. Returns (groups, stalls) today's make."""
    pool = tp.pool_table(r, edges, bucket_s, THRESHOLD_NS)
    groups = tp.group_table(r, group, edges, bucket_s)
    stalls = tp.find_stalls(r, group, THRESHOLD_NS)
    rng = np.random.default_rng(seed)
    for count in parts:
        part = rng.integers(0, count, len(r.pos))
        runs = [timeline_run(r, group, np.flatnonzero(part == p)) for p in range(count)]
        for step in steps:
            view = sweep_timeline(runs, edges, bucket_s, THRESHOLD_NS, step=step)
            assert same_frame(view.pool, pool), (count, step)
            assert same_frame(view.groups, groups), (count, step)
            assert same_stalls(view.stalls, stalls), (count, step)
    return groups["thread_group"].nunique() if len(groups) else 0, len(stalls)


def timeline_of(table: pd.DataFrame, size: int | None):
    r, _, t0, t1 = tp._rows(table, THRESHOLD_NS)
    bucket_s = tp.auto_bucket_s(t1 - t0)
    return r, r.groups(size), tp._edges(t0, t1, bucket_s), bucket_s


@pytest.mark.parametrize("name", WITH_A_POOL)
def test_the_sweep_of_a_bundled_set_is_the_in_memory_view(bundled_analysis, name):
    result = bundled_analysis(name)
    size = result.summary["thread_pool_size"]["value"]
    assert size
    r, group, edges, bucket_s = timeline_of(result.exchanges, size)
    groups, stalls = check_sweep(r, group, edges, bucket_s, seed=len(name))
    assert groups >= 1 and stalls == len(result.summary["groups"]["stalls"]) >= 1


def test_the_sweep_of_a_timeline_without_groups_and_with_unknown_executions(bundled_analysis):
    """No thread group known: no group table, no stall; half the executions unknown (their xs, D4 left out of the
    executing count and area)."""
    x = bundled_analysis("oltp-hogs").exchanges
    x = x.assign(exec_s=x["exec_s"].where(np.arange(len(x)) % 2 == 0))
    r, group, edges, bucket_s = timeline_of(x, None)
    assert not r.exec_known.all()
    assert check_sweep(r, group, edges, bucket_s, seed=5) == (0, 0)


def test_the_sweep_of_a_tests_data_capture(tmp_path):
    from pcapdecomp.analysis import Options, analyze, capture_set

    cs = capture_set(app=[FIELD / "one-connection-app.pcap"], db=FIELD / "one-connection-db.pcap",
                     slow_log=FIELD / "corners.log", thread_pool_size=2)
    result = analyze(cs, Options(quiet=True, jobs=1), tmp_path / "out")
    r, group, edges, bucket_s = timeline_of(result.exchanges, 2)
    assert len(r.pos) > 0
    check_sweep(r, group, edges, bucket_s, seed=1)


@pytest.mark.parametrize("name", ["sysbench-rw-10s", "sysbench-10s"])
def test_the_sweep_of_a_10_s_recording(tmp_path, name):
    folder = RECORDINGS / name
    if not (folder / "db.pcap").exists():
        pytest.skip(f"{folder} is not on this machine")
    from pcapdecomp.analysis import Options, analyze, capture_set

    cs = capture_set(db=folder / "db.pcap", slow_log=folder / "slow.log", long_query_time=0.01, thread_pool_size=2)
    result = analyze(cs, Options(quiet=True, jobs=1), tmp_path / "out")
    r, group, edges, bucket_s = timeline_of(result.exchanges, 2)
    # a 10 s recording: its size varies with the machine's load (90,562–101,856 exchanges a point, 2026-12-02)
    assert len(r.pos) > 50_000
    assert check_sweep(r, group, edges, bucket_s, seed=2, steps=(None,))[0] == 2


@st.composite
def timelines(draw):
    """A timeline of a few hundred rows: arrivals with ties, queue ends, execution starts and ends drawn from a
    small grid (so that events share times), some executions unknown, some waits past the threshold, two servers,
    groups −1 … 3; `far`: times spread over years, where _area sums in float64."""
    n = draw(st.integers(1, 300))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    far = draw(st.booleans())
    rng = np.random.default_rng(seed)
    unit = 10 ** 15 if far else THRESHOLD_NS // 4
    d1 = np.sort(rng.integers(0, 40, n)) * unit + 1_700_000_000 * tp.NS
    wait = rng.integers(0, 6, n) * unit * rng.integers(0, 2, n)
    d4 = d1 + wait + rng.integers(0, 8, n) * unit
    q_end = np.minimum(d1 + wait, d4)
    exec_known = rng.random(n) < 0.8
    xs = np.where(exec_known, np.maximum(d4 - rng.integers(0, 8, n) * unit, d1), d1)
    q_min = np.where(rng.random(n) < 0.7, q_end - d1, 0)
    likely = (q_min == 0) & (rng.random(n) < 0.5)
    r = tp._Rows(pos=np.arange(n), d1=d1, d4=d4, xs=xs, exec_known=exec_known, q_end=q_end, q_min=q_min,
                 conn=rng.integers(-1, 8, n), measured=rng.random(n) < 0.3, likely=likely,
                 culprit_ok=exec_known & (d4 - xs >= THRESHOLD_NS), srv=rng.integers(0, 2, n))
    bucket_s = float(draw(st.sampled_from([1.0, 10.0]) if not far else st.sampled_from([86400.0 * 30, 86400.0 * 365])))
    edges = tp._edges(int(d1.min()), int(d4.max()), bucket_s)
    return r, r.groups(4), edges, bucket_s, seed


@settings(max_examples=150, deadline=None)
@given(timelines())
def test_the_sweep_of_synthetic_timelines(case):
    r, group, edges, bucket_s, seed = case
    check_sweep(r, group, edges, bucket_s, seed, parts=(1, 3), steps=(1, 7))


def test_the_area_stream_takes_areas_float64_path_as_area_does():
    """Points enough and far enough apart that int64 could overflow: _area sums in float64, one point after the
    other; the stream fed in pieces makes the same floats (and the int64 ones otherwise)."""
    rng = np.random.default_rng(7)
    for spread in (10 ** 9, 10 ** 17):
        points = np.sort(rng.integers(0, spread, 5000)) + 10 ** 18
        edges = np.linspace(points[0] - 5, points[-1] + 5, 40).astype(np.int64)
        stream = _AreaStream(edges)
        for piece in np.array_split(points, [1, 2, 100, 2500, 4999]):
            stream.add(piece)
        want = tp._area(points, edges)
        got = stream.area()
        assert got.dtype == want.dtype == (np.float64 if spread > 10 ** 12 else np.int64)
        assert got.tobytes() == want.tobytes()
        assert np.array_equal(stream.counts(), tp._histogram(points, edges))
