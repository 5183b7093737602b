"""The decomposition per partition (explain/partitioned_decompose.py, docs/partitioned.md step 7b): step 7a's runs
with decompose's columns added, merged by row key, equal today's decomposed table (explain.decompose.decompose on
explain.servers.joined_table, without a slow log): pipelined_s, exec_s, exec_source, queue_s, queue_source,
queue_min_s, in_slow_log, slow_log_line, hidden_slow, understated, thread_group, and the joined columns unchanged.
For P = 1, 3 and 16 partitions (each with another long_query_time and thread_pool_size: none; 0.01 s and 2; 0.05 s
and 4), on every bundled pair without a proxy, the test captures' pair and the 10 s recordings (skipped when absent), each
without its slow log (the joined table does not read it; decompose is given none). A slow log is refused; pieces of a connection that
interleave are refused, never a different pipelined_s."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcapdecomp.analysis import capture_set
from pcapdecomp.core.outputs import SortedRun
from pcapdecomp.core.tables import as_declared
from pcapdecomp.explain.decompose import decompose
from pcapdecomp.explain.partitioned import NotPartitionable, PairedPartitions
from pcapdecomp.explain.partitioned_decompose import DecomposedPartitions
from pcapdecomp.pair.match import spilled_connection_step
from pcapdecomp.read import connids
from partitioning import CAPTURES, PAIRS, PROXY_SETS, RECORDED, merged, partitionable_recording, spilled, today

# per P: (long_query_time, thread_pool_size)
SETTINGS = {1: (None, None), 3: (0.01, 2), 16: (0.05, 4)}
ADDED = ["pipelined_s", "exec_s", "exec_source", "queue_s", "queue_source", "queue_min_s", "in_slow_log",
         "slow_log_line", "hidden_slow", "understated", "thread_group"]


def partitioned_rows(cs, work: Path):
    """What the partitions need of `cs` (7a's inputs, as test_partitioned_pass makes them) and today's joined
    table: (table, a function of P giving the PairedPartitions)."""
    table, (clocks, _, id_sources, db_conns, _) = today(cs)
    x = spilled(cs, work / "spill")
    step = spilled_connection_step(x.app, x.db)
    named = {}
    if "conn_id_source" in db_conns:
        mine = db_conns[db_conns["conn_id_source"].isin([connids.ANSWER, connids.PROCESSLIST]).to_numpy()]
        named = dict(zip(zip(mine["capture"].astype(str), mine["conn_index"].astype(int)), mine["conn_id"].astype(int)))
    return table, lambda p: PairedPartitions(x.app, x.db, step, clocks, id_sources=id_sources, named=named, parts=p)


def assert_decomposed_as_today(cs, work: Path, parts=tuple(SETTINGS)) -> dict:
    table, paired = partitioned_rows(cs, work)
    seen = {}
    for p in parts:
        lqt, size = SETTINGS[p]
        expected, _ = decompose(table, None, lqt, size)
        rows = DecomposedPartitions(paired(p), lqt, size, work / f"narrow-{p}")
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
                   "groups": int(expected["thread_group"].notna().sum())}
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


def test_a_slow_log_is_refused(tmp_path):
    slow = pd.DataFrame({"line": [1]})
    with pytest.raises(NotPartitionable, match="slow log"):
        DecomposedPartitions([], 0.01, None, tmp_path, slow=slow)


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
    assert found[1]["rows"] > 100_000 and found[1]["estimated"] > 0
