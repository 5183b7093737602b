"""The decomposition per partition (explain/partitioned_decompose.py, docs/partitioned.md step 7b): step 7a's runs
with decompose's columns added, merged by row key, equal today's decomposed table (explain.decompose.decompose on
explain.servers.joined_table): pipelined_s, exec_s, exec_source, queue_s, queue_source, queue_min_s, in_slow_log,
slow_log_line, hidden_slow, understated, thread_group, and the joined columns (sql, fingerprint, query_id of
ENCRYPTED rows from the slow log) as today. For P = 1, 3 and 16 partitions (each with another long_query_time and
thread_pool_size: none; 0.01 s and 2; 0.05 s and 4), on every bundled pair without a proxy without its slow log
and with it (read as explain.servers reads it), the test captures' pair and the 10 s recordings (skipped when
absent) without and with their slow log, as pairs and as DB captures alone. With a slow log the join runs per
connection (explain/partitioned_join.py): its per-row answer is join_slow_log's, the undecided marks' budget
included (cut on purpose). Refused, with the reason, never a different value: pieces of a connection that
interleave; rows without a connection id joined to an entry (midstream-join: explain.servers names them by the
log's Thread_id after the decomposition); entries without a thread id inside the capture."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcapdecomp.analysis import Options, capture_set
from pcapdecomp.core.outputs import SortedRun
from pcapdecomp.core.tables import as_declared
from pcapdecomp.explain.decompose import decompose
from pcapdecomp.explain.partitioned import NotPartitionable, PairedPartitions
from pcapdecomp.explain.partitioned_decompose import DecomposedPartitions
from pcapdecomp.explain.partitioned_join import PartitionedJoin
from pcapdecomp.pair.match import spilled_connection_step
from pcapdecomp.read import connids
from pcapdecomp.read.captureset import time_zone
from pcapdecomp.slowlog import join as slowjoin
from pcapdecomp.slowlog.reader import read_slow_log
from partitioning import (CAPTURES, PAIRS, PROXY_SETS, RECORDED, db_alone, merged, partitionable_recording, spilled,
                          today)

# per P: (long_query_time, thread_pool_size)
SETTINGS = {1: (None, None), 3: (0.01, 2), 16: (0.05, 4)}
ADDED = ["pipelined_s", "exec_s", "exec_source", "queue_s", "queue_source", "queue_min_s", "in_slow_log",
         "slow_log_line", "hidden_slow", "understated", "thread_group"]


def partitioned_rows(cs, work: Path):
    """What the partitions need of `cs` (7a's inputs, as test_partitioned_pass makes them) and today's joined
    table: (table, a function of P giving the PairedPartitions)."""
    table, (clocks, _, id_sources, db_conns, _) = today(cs)
    x = spilled(cs, work / "spill")
    step = spilled_connection_step(x.app, x.db) if x.app else None  # a DB capture alone: nothing to pair
    named = {}
    if "conn_id_source" in db_conns:
        mine = db_conns[db_conns["conn_id_source"].isin([connids.ANSWER, connids.PROCESSLIST]).to_numpy()]
        named = dict(zip(zip(mine["capture"].astype(str), mine["conn_index"].astype(int)), mine["conn_id"].astype(int)))
    return table, lambda p: PairedPartitions(x.app, x.db, step, clocks, id_sources=id_sources, named=named, parts=p)


def slow_log_of(cs, table: pd.DataFrame) -> pd.DataFrame | None:
    """`cs`'s slow log as explain.servers.explain_server reads it (the wire's statements for its header checks)."""
    if cs.slow_log is None:
        return None
    slow, _ = read_slow_log(cs.slow_log, tz=time_zone(None), max_sql_bytes=Options(quiet=True).max_sql_bytes,
                            wire=slowjoin.wire_statements(table))
    return slow


def assert_decomposed_as_today(cs, work: Path, parts=tuple(SETTINGS), with_slow_log: bool = False,
                               slow: pd.DataFrame | None = None) -> dict:
    """The runs merged equal decompose's table for each P; with `with_slow_log`, `slow` (else the set's own log)
    joined by both."""
    table, paired = partitioned_rows(cs, work)
    if with_slow_log and slow is None:
        slow = slow_log_of(cs, table)
    seen = {}
    for p in parts:
        lqt, size = SETTINGS[p]
        expected, join = decompose(table, slow if with_slow_log else None, lqt, size)
        rows = DecomposedPartitions(paired(p), lqt, size, work / f"narrow-{p}", slow=slow if with_slow_log else None)
        runs = list(rows)
        assert 1 <= len(runs) <= p
        got = merged(runs, {c: expected[c].cat.categories for c in expected.columns
                            if isinstance(expected[c].dtype, pd.CategoricalDtype)})
        assert list(got.columns) == list(expected.columns)
        pd.testing.assert_frame_equal(as_declared(got), as_declared(expected), check_exact=True)
        seen[p] = {"rows": len(expected), "runs": len(runs),
                   "pipelined": int((expected["pipelined_s"].fillna(0) > 0).sum()),
                   "estimated": int((expected["exec_source"] == "fingerprint_median").sum()),
                   "likely": int((expected["queue_source"] == "likely").sum()),
                   "hidden": int(expected["hidden_slow"].fillna(False).sum()),
                   "groups": int(expected["thread_group"].notna().sum()),
                   "in_log": int(expected["in_slow_log"].fillna(False).sum()),
                   "undecided": int((expected["in_slow_log"].isna() & join.used).sum()),
                   "understated": int(expected["understated"].fillna(False).sum()),
                   "encrypted": int((table["command"] == "ENCRYPTED").sum())}
    return seen


@pytest.mark.parametrize("name", [n for n in PAIRS if n not in PROXY_SETS])
def test_the_partitions_decompose_as_today(name, tmp_path):
    found = assert_decomposed_as_today(capture_set(CAPTURES / name), tmp_path)
    assert found[1]["rows"] > 0
    assert found[1]["groups"] == 0  # thread_pool_size not given: no thread group


def test_the_test_captures_pair(tmp_path):
    field = Path(__file__).resolve().parent / "data" / "field"
    cs = capture_set(app=[field / "one-connection-app.pcap"], db=field / "one-connection-db.pcap")
    assert assert_decomposed_as_today(cs, tmp_path)[1]["rows"] > 0


def test_the_estimates_and_waits_are_exercised(tmp_path):
    """The bundled sets the equality runs on hold what the global state is for: estimates per class, pipelined
    likely waits, hidden slow statements, thread groups (each in at least one set). No bundled pair pipelines its
    requests: test_a_pipelined_connection_across_partitions carries a D4 across partitions."""
    totals = {"estimated": 0, "likely": 0, "hidden": 0, "groups": 0}
    for name in ("group-stall", "oltp-hogs"):
        found = assert_decomposed_as_today(capture_set(CAPTURES / name), tmp_path / name, parts=(3, 16))
        for k in totals:
            totals[k] += max(f[k] for f in found.values())
    assert all(v > 0 for v in totals.values()), totals


WITH_SLOW_LOG = [n for n in PAIRS if n not in PROXY_SETS and capture_set(CAPTURES / n).slow_log is not None]
NAMED_BY_THE_LOG = ["midstream-join"]  # its connections have no id: the log's Thread_id names them after the join


@pytest.mark.parametrize("name", [n for n in WITH_SLOW_LOG if n not in NAMED_BY_THE_LOG])
def test_the_partitions_decompose_as_today_with_the_slow_log(name, tmp_path):
    found = assert_decomposed_as_today(capture_set(CAPTURES / name), tmp_path, with_slow_log=True)
    assert found[1]["rows"] > 0


def test_the_slow_log_columns_are_exercised(tmp_path):
    """The sets with a slow log hold what the join per connection is for: rows in the log (their exec_s, queue_s
    and slow_log_line from it), undecided rows (in_slow_log null), understated rows, and ENCRYPTED rows
    (oltp-prepared-tls12: a key log that misses part of the capture), which give every entry the key of any text.
    No bundled entry joins an ENCRYPTED row (whose text would come from the log: decompose._texts_from_slow_log,
    called by both paths through with_join_columns)."""
    totals = {"in_log": 0, "undecided": 0, "understated": 0, "encrypted": 0}
    for name in ("slowlog-forms", "maxthreads", "oltp-prepared-tls12"):
        found = assert_decomposed_as_today(capture_set(CAPTURES / name), tmp_path / name, parts=(3,),
                                           with_slow_log=True)
        for k in totals:
            totals[k] += found[3][k]
    assert all(v > 0 for v in totals.values()), totals


def partition_join(cs, work: Path, slow: pd.DataFrame, parts: int) -> tuple[pd.DataFrame, PartitionedJoin, dict]:
    """The partitioned join of `cs`'s runs (P = `parts`) with `slow`: today's joined table, the finished
    PartitionedJoin, and per row of the table (merged by key) its Joined's entry, Query_time and undecided."""
    table, paired = partitioned_rows(cs, work)
    join = PartitionedJoin(slow, work / "join")
    runs = list(paired(parts))
    for p, run in enumerate(runs):
        join.add(p, run.table, run.key)
    join.finish()
    got = {"entry": [], "qt": [], "undecided": []}
    for p, run in enumerate(runs):
        j = join.joined(p, run.table)
        got["entry"].append(j.entry)
        got["qt"].append(j.query_time_ns)
        got["undecided"].append(j.undecided)
    order = np.lexsort(np.concatenate([r.key for r in runs]).T[::-1])
    return table, join, {k: np.concatenate(v)[order] for k, v in got.items()}


def assert_counts_as_today(join: PartitionedJoin, today_join) -> None:
    """The partitioned join's summary.json counts and warnings (`summarize`) are join_slow_log's, as JSON text."""
    join.summarize("the log")
    assert json.dumps(join.stats) == json.dumps(today_join.stats)
    assert join.warnings == today_join.warnings and join.used == today_join.used


@pytest.mark.parametrize("name", [n for n in WITH_SLOW_LOG if n not in NAMED_BY_THE_LOG])
def test_the_join_counts_are_join_slow_logs(name, tmp_path):
    """summary.json's slow_log counts (entries in the capture's window, joined by which rule and key, unjoined by
    reason with examples, undecided rows of both kinds, marks cut) and the join's warnings, from the parts'
    answers (slowlog.join.join_stats, one rule for both), for P = 3 and 16."""
    cs = capture_set(CAPTURES / name)
    table, _ = partitioned_rows(cs, tmp_path / "probe")
    slow = slow_log_of(cs, table)
    if not len(slow):
        pytest.skip(f"{name}: its slow log holds no entry (DecomposedPartitions joins nothing)")
    today_join = slowjoin.join_slow_log(slowjoin.rows_for_join(table), slow, "the log")
    for parts in (3, 16):
        _, join, _ = partition_join(cs, tmp_path / f"p{parts}", slow, parts)  # every partition's rows joined
        assert_counts_as_today(join, today_join)


def test_rows_without_an_id_join_as_today_and_are_refused(tmp_path):
    """midstream-join: no connection has an id (the capture began mid-connection), so every entry searches the
    rows without an id (the global view of those rows: here all) and names connections by MIN_ANCHORS entries.
    The partitioned join's answer per row is join_slow_log's; the decomposition is refused, saying why (the
    connection ids the log gives are filled after it)."""
    cs = capture_set(CAPTURES / "midstream-join")
    table, _ = partitioned_rows(cs, tmp_path / "probe")
    slow = slow_log_of(cs, table)
    today_join = slowjoin.join_slow_log(slowjoin.rows_for_join(table), slow, "the log")
    assert today_join.stats["connections_identified"] > 0 and today_join.stats["exchanges_undecided"] > 0
    _, join, got = partition_join(cs, tmp_path / "three", slow, 3)
    assert np.array_equal(got["entry"], today_join.entry) and np.array_equal(got["qt"], today_join.query_time_ns)
    assert np.array_equal(got["undecided"], today_join.undecided)
    assert_counts_as_today(join, today_join)
    with pytest.raises(NotPartitionable, match="rows without a connection id joined to slow-log entries"):
        join.refuse_named_by_log()
    _, paired = partitioned_rows(cs, tmp_path / "refused")
    with pytest.raises(NotPartitionable, match="Thread_id"):
        DecomposedPartitions(paired(3), 0.01, 2, tmp_path / "narrow", slow=slow)


@pytest.mark.parametrize("steps", [0, 0.05, 0.2])  # a float: a budget that runs out part way
def test_the_marks_budget_is_spent_in_entry_order(steps, tmp_path, monkeypatch):
    """The undecided marks' global budget (MARK_STEPS × (rows + entries)) made small, so that it runs out part way:
    the partitioned join replays it over the groups' recorded steps in entry order and marks the rows
    join_slow_log marks (midstream-join: 18 rows undecided with the whole budget)."""
    monkeypatch.setattr(slowjoin, "MARK_STEPS", steps)
    cs = capture_set(CAPTURES / "midstream-join")
    table, _ = partitioned_rows(cs, tmp_path / "probe")
    slow = slow_log_of(cs, table)
    today_join = slowjoin.join_slow_log(slowjoin.rows_for_join(table), slow, "the log")
    assert today_join.stats["undecided_search_cut"] > 0  # the budget cut …
    assert today_join.stats["exchanges_undecided"] < 18  # … some marks (8 and 11 of the 18 at 0.05 and 0.2)
    _, join, got = partition_join(cs, tmp_path / "sixteen", slow, 16)
    assert np.array_equal(got["undecided"], today_join.undecided)
    assert_counts_as_today(join, today_join)


def test_entries_of_threads_the_capture_never_saw(tmp_path):
    """group-stall's log with every Thread_id moved out of the capture's connection ids: the entries search the
    rows without an id (none here), so nothing joins and nothing is marked — as join_slow_log decides."""
    cs = capture_set(CAPTURES / "group-stall")
    table, _ = partitioned_rows(cs, tmp_path / "probe")
    slow = slow_log_of(cs, table)
    slow["thread_id"] = slow["thread_id"].astype("Int64") + 1_000_000
    found = assert_decomposed_as_today(cs, tmp_path, parts=(1, 3), with_slow_log=True, slow=slow)
    assert found[3]["in_log"] == 0 and found[3]["rows"] > 0
    # its reason (no-time-fit: its text is on a connection with an id) is not gathered: the counts are refused
    _, join, _ = partition_join(cs, tmp_path / "counts", slow, 3)
    assert join.unsure
    with pytest.raises(NotPartitionable, match="threads no connection is known by"):
        join.summarize("the log")


def test_an_empty_slow_log(tmp_path):
    """A slow log without an entry: nothing to join, as without one."""
    cs = capture_set(CAPTURES / "group-stall")
    table, _ = partitioned_rows(cs, tmp_path / "probe")
    slow = slow_log_of(cs, table).iloc[:0]
    found = assert_decomposed_as_today(cs, tmp_path, parts=(3,), with_slow_log=True, slow=slow)
    assert found[3]["in_log"] == 0


def test_entries_without_a_thread_id_are_refused(tmp_path):
    """An entry without a thread id inside the capture's time would search every connection's rows: refused,
    naming its line; the same log with the entry moved before the capture is decomposed as today."""
    cs = capture_set(CAPTURES / "group-stall")
    table, paired = partitioned_rows(cs, tmp_path / "probe")
    slow = slow_log_of(cs, table)
    slow["thread_id"] = slow["thread_id"].astype("Int64").mask(np.arange(len(slow)) == 0)
    with pytest.raises(NotPartitionable, match=f"without a thread id \\(line {int(slow['line'].iloc[0])} the first"):
        DecomposedPartitions(paired(3), 0.01, 2, tmp_path / "narrow", slow=slow)
    early = slow.copy()
    for column in ("start", "end", "timestamp", "time"):
        if column in early.columns:
            early[column] = early[column].mask(np.arange(len(early)) == 0, early[column].min() - pd.Timedelta(days=1))
    found = assert_decomposed_as_today(cs, tmp_path / "early", parts=(3,), with_slow_log=True, slow=early)
    assert found[3]["rows"] > 0


def _run(rows: dict, key: list[int]) -> SortedRun:
    return SortedRun(pd.DataFrame(rows), np.asarray(key, dtype=np.int64).reshape(-1, 1))


def _rows(d1, d4, seq) -> dict:
    """A partition's joined rows (the columns the decomposition reads) of one connection: requests at D1, answered
    at D4, in the piece of req_tcp_seq `seq`."""
    n = len(d1)
    d1, d4 = np.asarray(d1, dtype=np.int64), np.asarray(d4, dtype=np.int64)
    return {"command": pd.Categorical(["COM_QUERY"] * n), "fingerprint": pd.Categorical(["select ?"] * n),
            "_d1_raw": d1, "_d4_raw": d4, "_t_valid": np.ones(n, dtype=bool), "server_s": (d4 - d1) / 1e9,
            "db_client": pd.Categorical(["10.0.0.1:5000"] * n), "server": pd.Categorical(["10.0.0.2:3306"] * n),
            "req_tcp_seq": np.full(n, seq, dtype=np.int64), "server_flag_slow": pd.array([False] * n, "boolean"),
            "conn_id": pd.array([7] * n, "Int64")}


def test_a_pipelined_connection_across_partitions(tmp_path):
    """A connection that pipelines: its second piece's first request (D1 55) came before the first piece's last
    answer (D4 60), in another partition: its pipelined_s is the carried 5 ns, as decompose.pipelined_s gives on
    the rows together."""
    from pcapdecomp.explain.decompose import pipelined_s

    runs = [_run(_rows([0, 10], [50, 60], 0), [0, 1]), _run(_rows([55, 70], [80, 90], 1 << 16), [2, 3])]
    whole = pd.concat([r.table for r in runs], ignore_index=True)
    expected = pipelined_s(whole)
    assert expected[2] == 5e-9  # the carry
    got = np.concatenate([r.table["pipelined_s"].to_numpy() for r in DecomposedPartitions(runs, None, None, tmp_path)])
    assert np.array_equal(got, expected)


def test_interleaving_pieces_are_refused(tmp_path):
    """Two pieces of one connection (req_tcp_seq >> 16 apart) in two partitions whose rows interleave in (D1, D4)
    order: the carry per piece would not be exact, so NotPartitionable names the connection."""
    def rows(d1, seq):
        return _rows(d1, np.asarray(d1) + 5, seq)
    apart = [_run(rows([0, 100], 0), [0, 1]), _run(rows([200, 300], 1 << 16), [2, 3])]
    ok = list(DecomposedPartitions(apart, None, None, tmp_path / "apart"))
    assert [len(r.table) for r in ok] == [2, 2]
    woven = [_run(rows([0, 200], 0), [0, 2]), _run(rows([100, 300], 1 << 16), [1, 3])]
    with pytest.raises(NotPartitionable, match="10.0.0.1:5000 → 10.0.0.2:3306: its pieces"):
        DecomposedPartitions(woven, None, None, tmp_path / "woven")


@pytest.mark.parametrize("folder", RECORDED, ids=lambda p: p.name)
def test_the_10s_recordings_without_their_slow_log(folder, tmp_path):
    cs = partitionable_recording(folder, tmp_path / "probe")
    found = assert_decomposed_as_today(cs, tmp_path)
    # a 10 s recording: its size varies with the machine's load (90,562–101,856 exchanges a point, 2026-12-02)
    assert found[1]["rows"] > 50_000 and found[1]["estimated"] > 0


@pytest.mark.parametrize("folder", RECORDED, ids=lambda p: p.name)
def test_the_10s_recordings_with_their_slow_log(folder, tmp_path):
    cs = partitionable_recording(folder, tmp_path / "probe")
    assert cs.slow_log is not None
    found = assert_decomposed_as_today(cs, tmp_path, with_slow_log=True)
    # the read-write recording's log joins (46 entries); the read-only one's holds none (its header only)
    assert found[1]["rows"] > 50_000 and (found[1]["in_log"] > 0) == (folder.name == "sysbench-rw-10s"), found


@pytest.mark.parametrize("folder", RECORDED, ids=lambda p: p.name)
def test_the_10s_recordings_db_capture_alone_with_their_slow_log(folder, tmp_path):
    """analyze --db F/db.pcap --slow-log F/slow.log's decomposition, partitioned."""
    if not (folder / "db.pcap").exists():
        pytest.skip(f"{folder} is not here")
    found = assert_decomposed_as_today(db_alone(capture_set(folder)), tmp_path, parts=(1, 3), with_slow_log=True)
    assert found[3]["rows"] > 50_000 and (found[3]["in_log"] > 0) == (folder.name == "sysbench-rw-10s"), found
