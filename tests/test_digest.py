"""The query profile (pcapdecomp/explain/digest.py) against pt-query-digest on the same slow log, and the samples with their
parameter values against the statements' own fingerprints."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pcapdecomp.core.fingerprint import fingerprint
from pcapdecomp.explain.digest import profile, sample_statement
from pcapdecomp.mysql.params import _quote, split_params
from pcapdecomp.slowlog.sqltext import placeholders

CAPTURES = Path(__file__).resolve().parents[1] / "captures"


@pytest.fixture(scope="module")
def analysed(bundled_analysis):
    return {name: bundled_analysis(name) for name in ("group-stall", "maxthreads", "oltp-hogs", "features")}


def pt_query_digest(slow_log: Path) -> dict:
    proc = subprocess.run(["pt-query-digest", "--output", "json", "--no-version-check", "--limit", "100%:1000",
                           str(slow_log)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {"0x" + c["checksum"]: c for c in json.loads(proc.stdout)["classes"]}


@pytest.mark.parametrize("name", ["group-stall", "maxthreads", "oltp-hogs"])
def test_profile_of_the_slow_logged_statements_is_pt_query_digests(analysed, name):
    """On the statements the slow log holds, the profile is pt-query-digest's: same Query IDs, calls, execution
    sum/min/max/avg, rows and bytes sent, user and db, and the same worst sample."""
    res = analysed[name]
    x = res.exchanges
    logged = x[x["in_slow_log"].fillna(False)]
    assert len(logged) == res.summary["slow_log"]["entries"] > 0  # every entry joined: the same statements
    ours = profile(logged, None).set_index("query_id")
    theirs = pt_query_digest(CAPTURES / name / "slow.log")
    assert set(ours.index) == set(theirs)
    for qid, c in theirs.items():
        r = ours.loc[qid]
        m = c["metrics"]
        assert r["calls"] == c["query_count"], qid
        for ours_col, key in (("exec_sum", "sum"), ("exec_min", "min"), ("exec_max", "max"), ("exec_avg", "avg")):
            assert r[ours_col] == pytest.approx(float(m["Query_time"][key]), abs=1e-6), (qid, key)
        assert r["exec_min"] <= r["exec_p95"] <= r["exec_max"]  # pt's p95 is bucketed: not compared
        assert r["exec_measured"] == 1.0
        assert r["rows_sum"] == float(m["Rows_sent"]["sum"]), qid
        assert r["bytes_sum"] == float(m["Bytes_sent"]["sum"]), qid  # MariaDB's Bytes_sent: packets with headers
        assert r["user_db"] == f"{m['user']['value']}@{m['db']['value']}"
        worst = logged[logged["query_id"] == qid].sort_values("exec_s").iloc[-1]
        assert float(c["example"]["Query_time"]) == pytest.approx(worst["exec_s"], abs=1e-6)
        assert r["sample"] == c["example"]["query"]


def test_profile_ranks_by_execution_and_counts_every_call(analysed):
    res = analysed["group-stall"]
    x = res.exchanges
    p = profile(x, 6.0)
    assert p["calls"].sum() == x["fingerprint"].notna().sum()
    assert list(p["rank"]) == list(range(1, len(p) + 1))
    sums = p["exec_sum"].fillna(-1).to_list()
    assert sums == sorted(sums, reverse=True)
    # the culprit first, although the victims' `select ?` waited longer in total
    assert p.iloc[0]["fingerprint"].startswith("select benchmark")
    probes = p[p["fingerprint"] == "select ?"].iloc[0]
    assert probes["client_sum"] > p.iloc[0]["client_sum"] and probes["hidden_slow"] == 3
    assert probes["qps"] == pytest.approx(probes["calls"] / 6.0)
    split = probes["network_sum"] + probes["queue_sum"] + probes["exec_sum"]
    both = x[(x["fingerprint"] == "select ?") & (x["seen"] == "both")]
    assert split == pytest.approx(float(both["total_s"].sum()), rel=1e-6)


@pytest.mark.parametrize("name", ["oltp-hogs", "features"])
def test_samples_carry_the_parameter_values_of_prepared_statements(analysed, name):
    """Every EXECUTE with decoded parameters, its values put in place of the `?`: the statement as the server ran
    it has the prepared statement's fingerprint (values where the placeholders were), and no `?` is left."""
    x = analysed[name].exchanges
    ex = x[(x["command"] == "COM_STMT_EXECUTE") & x["params"].notna() & x["sql"].notna()]
    assert len(ex) > 0
    checked = 0
    for sql, params in set(zip(ex["sql"].astype(str), ex["params"].astype(str))):
        if params.startswith("long data") or "<long data" in params:
            continue
        full = sample_statement(sql, params, "COM_STMT_EXECUTE")
        assert "/* parameters:" not in full, (sql, params)
        assert len(placeholders(full)) == 0, full
        assert fingerprint(full) == fingerprint(sql), (sql, params, full)
        checked += 1
    assert checked > 0
    p = profile(ex, 1.0)  # the profile's sample of each prepared statement: with its values
    assert len(p) and all(not placeholders(s) for s in p["sample"] if "long data" not in s)


@given(st.lists(st.one_of(st.integers(-2**63, 2**64).map(str), st.just("NULL"),
                          st.text(max_size=20).map(lambda s: _quote(s.encode("utf-8", "surrogatepass")))),
                min_size=1, max_size=8))
def test_split_params_inverts_the_params_column(values):
    assert split_params(", ".join(values)) == values


def test_placeholders_skip_quotes_and_comments():
    sql = "SELECT '?', \"?\", `?` /* ? */ FROM t WHERE a = ? -- ?\n AND b = ? # ?\n AND c = '\\'?'"
    marks = placeholders(sql)
    assert [sql[i] for i in marks] == ["?", "?"] and len(marks) == 2
    assert sample_statement("SELECT ? + ?", "1, 'a, b'", "COM_STMT_EXECUTE") == "SELECT 1 + 'a, b'"
    assert sample_statement("SELECT ?", "1, 2", "COM_STMT_EXECUTE") == "SELECT ? /* parameters: 1, 2 */"
    assert sample_statement(None, None, "COM_PING") == "COM_PING"


@given(st.lists(st.tuples(st.integers(0, 4), st.one_of(st.floats(0, 10, allow_nan=False), st.just(float("nan")))),
                min_size=1, max_size=60))
def test_per_group_statistics_equal_pandas(rows):
    import numpy as np
    import pandas as pd

    from pcapdecomp.core.groups import group_min_max_p95, group_sum

    k = np.array([r[0] for r in rows], dtype=np.int64)
    v = np.array([r[1] for r in rows])
    lo, hi, p95 = group_min_max_p95(k, v, 5)
    total, count = group_sum(k, v, 5)
    for code in range(5):
        part = pd.Series(v[k == code]).dropna()
        if part.empty:
            assert np.isnan(lo[code]) and np.isnan(total[code]) and count[code] == 0
            continue
        assert (lo[code], hi[code], count[code]) == (part.min(), part.max(), len(part))
        # nearest-rank: the p95 is a value of the group (numpy's inverted_cdf)
        assert p95[code] == pytest.approx(np.quantile(part.to_numpy(), 0.95, method="inverted_cdf"))
        assert total[code] == pytest.approx(part.sum())


def test_a_prepared_statement_shares_its_row_with_its_prepare_and_close_and_the_sample_has_values(analysed):
    """oltp-hogs runs one point select as text and as a prepared statement: one Query ID for the COM_QUERYs, the
    EXECUTEs, the PREPAREs and CLOSEs; the row says so, and its sample is a call that ran with values."""
    x = analysed["oltp-hogs"].exchanges
    fp = "select c from sbtest? where id = ?"
    row = profile(x, 1.0).set_index("fingerprint").loc[fp]
    counts = x.loc[x["fingerprint"] == fp, "command"].astype(str).value_counts()
    assert row["commands"] == ", ".join(f"{c} ×{n:,}" for c, n in sorted(counts.items(), key=lambda p: (-p[1], p[0])))
    assert set(counts.index) == {"COM_QUERY", "COM_STMT_EXECUTE", "COM_STMT_PREPARE", "COM_STMT_CLOSE"}
    assert not placeholders(row["sample"]) and fingerprint(row["sample"]) == fp
