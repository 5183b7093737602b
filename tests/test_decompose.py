"""Decomposition pieces: the slow-log join (real MariaDB log of the maxthreads recording), the execution-time
ladder, the interval occupancy used by the thread-group view (against brute force), and the group view."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pcapdecomp.core.times import ts_ns
from pcapdecomp.explain.decompose import join_slow_log
from pcapdecomp.explain.threadpool import _occupancy, auto_bucket_s, thread_pool_view
from pcapdecomp.read.exchanges import extract
from pcapdecomp.slowlog.reader import read_slow_log

CAPTURES = Path(__file__).resolve().parent.parent / "captures"


@pytest.fixture(scope="module")
def maxthreads():
    db = extract(CAPTURES / "maxthreads" / "db.pcap").exchanges
    slow, _ = read_slow_log(CAPTURES / "maxthreads" / "slow.log")
    truth = pd.read_json(CAPTURES / "maxthreads" / "truth.jsonl", lines=True)
    return db, slow, truth


def join_rows(db: pd.DataFrame, drop_ids: bool = False) -> pd.DataFrame:
    conn = db["conn_id"] if not drop_ids else pd.Series(pd.NA, index=db.index, dtype="Int64")
    return pd.DataFrame({
        "conn_id": conn, "conn_key": db["client"].astype(str), "command": db["command"].astype(object),
        "sql": db["sql"].astype(object), "params": db["params"].astype(object), "sql_cut": False,
        "start_ns": ns(db["req_first_ts"]), "end_ns": ns(db["resp_last_ts"]),
    })


def ns(col: pd.Series) -> pd.Series:
    values, valid = ts_ns(col)
    return pd.Series(values, index=col.index, dtype="Int64").where(valid)


def joined(db, slow, entry) -> pd.DataFrame:
    rows = np.flatnonzero(entry >= 0)
    return pd.DataFrame({"conn_id": db["conn_id"].to_numpy()[rows], "sql": db["sql"].to_numpy()[rows],
                         "thread_id": slow["thread_id"].to_numpy()[entry[rows]],
                         "query_time_s": slow["query_time_s"].to_numpy()[entry[rows]]})


def test_every_entry_joined_to_its_connections_statement(maxthreads):
    db, slow, truth = maxthreads
    join = join_slow_log(join_rows(db), slow)
    j = joined(db, slow, join.entry)
    assert join.used and len(j) == len(slow) == 8
    assert (j["sql"] == "SELECT SLEEP(2)").all() and (j["conn_id"] == j["thread_id"]).all()
    # performance_schema's execution time of that connection's SLEEP agrees with the joined Query_time
    ps = truth[truth["sql"] == "SELECT SLEEP(2)"].set_index("conn_id")["exec_s"]
    assert np.allclose(j.set_index("conn_id")["query_time_s"].sort_index(), ps.sort_index(), atol=0.01)


def test_without_connection_ids_identical_statements_are_not_guessed(maxthreads):
    # Eight SELECT SLEEP(2) at the same second on eight connections, no ids on the wire: each entry fits several
    # exchanges, so none is joined; the eight exchanges are undecided (in the slow log or not: unknown).
    db, slow, _ = maxthreads
    join = join_slow_log(join_rows(db, drop_ids=True), slow)
    assert not join.used and (join.entry == -1).all()
    assert list(join.reasons) == ["ambiguous"] * 8 and join.stats["unjoined"] == {"ambiguous": 8}
    assert set(db.loc[join.undecided & (db["command"] == "COM_QUERY").to_numpy(), "sql"]) == {"SELECT SLEEP(2)"}
    assert join.stats["exchanges_undecided"] == 8


def test_slow_log_from_another_time_is_not_used(maxthreads):
    db, slow, _ = maxthreads
    later = slow.copy()
    for col in ("time", "timestamp"):
        later[col] = later[col] + pd.Timedelta(hours=1)
    join = join_slow_log(join_rows(db), later)
    assert not join.used and (join.entry == -1).all()
    assert join.warnings and "analysed without" in join.warnings[0]


def test_entry_longer_than_the_exchange_is_not_joined(maxthreads):
    # An execution can't outlast the request/response it belongs to.
    db, slow, _ = maxthreads
    longer = slow.copy()
    longer["query_time_ns"] = longer["query_time_ns"] + 3_000_000_000
    assert (join_slow_log(join_rows(db), longer).entry == -1).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), max_size=30), st.integers(1, 200))
def test_occupancy_equals_brute_force(intervals, width):
    starts = np.array([s for s, _ in intervals], dtype=np.int64)
    ends = np.array([s + d for s, d in intervals], dtype=np.int64)
    edges = np.arange(0, 1400, width, dtype=np.int64)
    got = _occupancy(starts, ends, edges)
    want = [sum(max(0, min(e, hi) - max(s, lo)) for s, e in zip(starts, ends)) for lo, hi in zip(edges, edges[1:])]
    assert np.allclose(got, want)


def test_auto_bucket():
    assert auto_bucket_s(6 * 10**9) == 0.01
    assert auto_bucket_s(600 * 10**9) == 1.0
    assert auto_bucket_s(10**9 * 86400 * 7) == 3600.0
    # decades (one wild timestamp): still at most 1000 buckets
    span = 10**9 * 86400 * 365 * 56
    assert span / (auto_bucket_s(span) * 10**9) <= 1000


def test_group_view_on_maxthreads(bundled_analysis):
    r = bundled_analysis("maxthreads")
    view = thread_pool_view(r.exchanges, 1, bucket_s=0.5)
    groups, stalls = view.groups, view.groups_summary["stalls"]
    assert set(groups["thread_group"]) == {0} and (groups["bucket_s"] == 0.5).all()
    # 8 SLEEP(2) at once: eight in flight for the first 2 s, six executing and two queued; then two.
    busy = groups[groups["in_flight"] > 0]
    assert busy["in_flight"].max() == pytest.approx(8, abs=0.1)
    assert busy["queued"].max() == pytest.approx(2, abs=0.1)
    assert busy["executing"].max() == pytest.approx(6, abs=0.1)
    assert groups["queue_s"].sum() == pytest.approx(4.0, abs=0.01)
    # the six SLEEPs that ran meanwhile are all culprits: five listed, the sixth counted, none dropped silently
    assert len(stalls) == 1 and stalls[0]["queued"] == 2
    assert stalls[0]["culprits_total"] == 6 and len(stalls[0]["culprits"]) == 5 and stalls[0]["culprits_more"] == 1
    assert {c["sql"] for c in stalls[0]["culprits"]} == {"SELECT SLEEP(2)"}
    assert (view.stall_role == "culprit").sum() == 6 and (view.stall_role == "victim").sum() == 2


def test_exec_estimates_say_how_they_were_made(bundled_analysis):
    x = bundled_analysis("group-stall").exchanges
    probes = x[x["sql"] == "SELECT 1"]
    assert (probes["exec_source"] == "fingerprint_median").all()
    assert probes["exec_s"].max() < 0.001  # a SELECT 1 executes in microseconds, however long it waited
    assert (x.loc[x["sql"].str.startswith("SELECT BENCHMARK").fillna(False), "exec_source"] == "slow_log").all()
    assert (x["queue_s"].dropna() >= 0).all()
    assert (x["exec_s"].dropna() <= x.loc[x["exec_s"].notna(), "server_s"] + 1e-3).all()


@settings(max_examples=40, deadline=None)
@example(intervals=[(0, 0)] * 9 + [(0, 1)], width=10**8, copies=10**6)  # 10 M points: areas far beyond 2^53
@given(st.lists(st.tuples(st.integers(-5 * 10**9, 60 * 10**9), st.integers(0, 3 * 10**9)), min_size=1, max_size=40),
       st.integers(10**8, 10**10), st.sampled_from([10**3, 3 * 10**4]))
def test_occupancy_is_exact_at_epoch_nanoseconds(intervals, width, copies):
    # Real captures' times are ~1.8e18 ns since the epoch; summed as such in float64 the occupancy came out in steps
    # of ~0.67 of a bucket and below zero. Each interval repeated `copies` times: the sums of a busy capture (up to
    # 1.2 M points: an area then passes 2^53, where a float64 of it would round).
    epoch = 1_764_115_200_000_000_000  # 2025-11-26 UTC
    starts = np.repeat(np.array([epoch + s for s, _ in intervals], dtype=np.int64), copies)
    ends = np.repeat(np.array([epoch + s + d for s, d in intervals], dtype=np.int64), copies)
    edges = epoch + np.arange(0, 60 * 10**9, width, dtype=np.int64)
    got = _occupancy(starts, ends, edges)
    want = [copies * sum(max(0, min(e, hi) - max(s, lo)) for s, e in zip(starts[::copies], ends[::copies]))
            for lo, hi in zip(edges.tolist(), edges[1:].tolist())]
    assert np.array_equal(got, np.array(want, dtype=np.float64))
    assert (got >= 0).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-(1 << 63), (1 << 63) - 1)), max_size=40),
       st.sampled_from([1, 1000, 1 << 40, 1 << 63]))
def test_latest_before_is_the_groups_running_maximum_of_the_rows_before(rows, spread):
    """pipelined_s's running maximum per connection, in one pass over every row, is what a groupby's cummax then
    shift gives: the largest time of the earlier rows of the same group, int64's minimum for a group's first row
    (times of a narrow spread, and of the whole int64 range, where the lift would not fit)."""
    from pcapdecomp.explain.decompose import _latest_before

    rows = sorted(rows, key=lambda r: r[0])
    k = np.array([g for g, _ in rows], dtype=np.int64)
    b = np.array([v % spread if spread < 1 << 63 else v for _, v in rows], dtype=np.int64)
    none = np.iinfo(np.int64).min
    expected = [max([v for g2, v in zip(k[:i], b[:i]) if g2 == g], default=none) for i, g in enumerate(k)]
    assert _latest_before(k, b).tolist() == expected
