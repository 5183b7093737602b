"""The slow-log join (pcapdecomp/slowlog/join.py) on real recordings, checked against the lab's truth.

Oracle: truth.jsonl names each connection by the client's TCP port (`client_port`) and gives performance_schema's
execution time of every statement. An entry joined to an exchange is right when the entry's thread is the
connection of that exchange's client port and its Query_time is that statement's execution time (the server's
two timers of one execution agree within 50 ms; performance_schema's also covers the slow-log write).
The recordings: captures/midstream-join (the captures started after every login: no connection ids on the
wire) and captures/slowlog-forms (every statement logged, in every form)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analysing import explain
from hypothesis import given, settings
from hypothesis import strategies as st
from joininput import exchange_table

from pcapdecomp.analysis import capture_set
from pcapdecomp.explain.decompose import join_slow_log, rows_for_join
from pcapdecomp.slowlog.join import REASONS
from pcapdecomp.slowlog.reader import read_slow_log

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
MIDSTREAM = CAPTURES / "midstream-join"
FORMS = CAPTURES / "slowlog-forms"


def truth_of(set_dir: Path) -> pd.DataFrame:
    return pd.read_json(set_dir / "truth.jsonl", lines=True)


def truth_row(truth: pd.DataFrame, row) -> pd.Series:
    """The client's own record of an exchange: its connection (by client port), the nearest send time."""
    port = int(str(row["client"]).rsplit(":", 1)[1])
    mine = truth[truth["client_port"] == port]
    sent = row["app_req_ts"] if pd.notna(row["app_req_ts"]) else row["db_req_ts"]  # one clock in the lab
    return mine.iloc[int(np.argmin((mine["client_send_ns"] - sent.value).abs().to_numpy()))]


def wrong_joins(r, set_dir: Path) -> list[str]:
    x = r.exchanges
    slow, _ = read_slow_log(set_dir / "slow.log")
    truth = truth_of(set_dir)
    wrong = []
    for i in np.flatnonzero(x["in_slow_log"].fillna(False).to_numpy()):
        row = x.iloc[i]
        t = truth_row(truth, row)
        e = slow[slow["line"] == row["slow_log_line"]].iloc[0]
        if e["thread_id"] != t["conn_id"]:
            wrong.append(f"{row['sql']!r}: entry of thread {e['thread_id']} on connection {t['conn_id']}")
        elif pd.notna(t["exec_s"]) and not t["exec_s"] - 0.05 <= row["exec_s"] <= t["exec_s"] + 0.005:
            wrong.append(f"{row['sql']!r}: Query_time {row['exec_s']} for an execution of {t['exec_s']}")
        m = re.fullmatch(r"params (\d+), '(\w+)'", str(t["note"]))
        if m and not all(v in e["sql"] for v in m.groups()):
            wrong.append(f"{e['sql']!r} joined to the execute of {m.groups()}")
    return wrong


@pytest.fixture(scope="module")
def midstream(bundled_analysis):
    return bundled_analysis(MIDSTREAM.name)


@pytest.fixture(scope="module")
def forms(bundled_analysis):
    return bundled_analysis(FORMS.name)


# --- acceptance: a capture that began after every login ------------------------------------------------------


def test_midstream_recording_has_no_greeting_ids_and_shared_fingerprints(midstream):
    x = midstream.exchanges
    # no greeting was captured: every id there is comes from the slow log's Thread_id (read/connids.py), and is right
    assert not (x["conn_id_source"] == "greeting").any()
    named = x[x["conn_id"].notna()]
    assert (named["conn_id_source"] == "slowlog").all()
    truth = truth_of(MIDSTREAM)
    assert [int(c) for c in named["conn_id"]] == [int(truth_row(truth, r)["conn_id"]) for _, r in named.iterrows()]
    slow, _ = read_slow_log(MIDSTREAM / "slow.log")
    fp = x.loc[x["sql"].astype(str).str.startswith("select benchmark"), "fingerprint"]
    assert fp.nunique() <= 2 and len(fp) >= 20  # many statements, one fingerprint (text and binary protocol)
    logged = slow["sql"].str.startswith("select benchmark").sum()
    assert 0 < logged < len(fp)  # some of them slow-logged, some not


def test_midstream_zero_wrong_joins(midstream):
    s = midstream.summary["slow_log"]
    assert wrong_joins(midstream, MIDSTREAM) == []
    assert s["matched"] >= 25 and s["connections_identified"] >= 5  # not by leaving everything unjoined
    assert s["matched"] + sum(s["unjoined"].values()) == s["entries"] == 37


@pytest.mark.parametrize("side", ["app", "db"])
def test_midstream_one_capture_point_alone(midstream, side):
    # The app capture alone (its clock: a wider tolerance) or the DB capture alone: the same joins, none wrong.
    kw = dict(app=[MIDSTREAM / "app.pcap"], db=None) if side == "app" else dict(app=[], db=MIDSTREAM / "db.pcap")
    r = explain(capture_set(slow_log=MIDSTREAM / "slow.log", long_query_time=0.5, thread_pool_size=2, **kw))
    assert wrong_joins(r, MIDSTREAM) == []
    both = midstream.summary["slow_log"]
    assert r.summary["slow_log"]["matched"] == both["matched"] and r.summary["slow_log"]["unjoined"] == both["unjoined"]


def test_midstream_unjoined_entries_and_why(midstream):
    s = midstream.summary["slow_log"]
    truth = truth_of(MIDSTREAM)
    label = dict(zip(truth["conn_id"], truth["conn_label"]))
    why = {(label[e["thread_id"]], e["reason"]) for e in s["unjoined_examples"]}
    # the twins ran the same statement at the same moment on two connections: nothing tells them apart
    assert {r for lab, r in why if lab.startswith("twin")} == {"ambiguous"}
    # the connection that prepared before the capture: its executes carry no text on the wire
    assert {r for lab, r in why if lab == "prepared-before"} == {"no-text-match"}
    assert s["unjoined"] == {"no-text-match": 2, "ambiguous": 4}
    assert set(s["unjoined"]) <= set(REASONS)
    assert any("4 entries not joined (4 ambiguous)" in w for w in midstream.warnings)


def test_midstream_hidden_slow_never_claims_a_logged_statement(midstream):
    # An exchange that may be the partner of an unjoined entry is undecided (null), never "hidden slow".
    x = midstream.exchanges
    truth = truth_of(MIDSTREAM)
    hidden = x[x["hidden_slow"].fillna(False)]
    assert len(hidden) >= 3
    for _, row in hidden.iterrows():
        assert truth_row(truth, row)["exec_s"] < 0.5, row["sql"]
    undecided = x["in_slow_log"].isna()
    s = midstream.summary["slow_log"]
    assert undecided.sum() == s["exchanges_undecided"] + s["exchanges_of_unlogged_commands"]
    assert s["exchanges_undecided"] > 0 and s["exchanges_of_unlogged_commands"] > 0  # prepares, quits
    assert not x.loc[undecided, "hidden_slow"].fillna(False).any()
    open_question = undecided & x["server_s"].gt(0.5) & ~x["server_flag_slow"].fillna(False)
    assert open_question.any() and x.loc[open_question, "hidden_slow"].isna().all()
    # the twins' exchanges are among them, and so are the executes whose statement is unknown
    ports = truth.loc[truth["conn_label"].str.startswith("twin"), "client_port"].unique()
    twins = x["client"].astype(str).str.rsplit(":", n=1).str[1].astype(int).isin(ports)
    assert undecided[twins & x["server_s"].gt(0.5)].all()


def test_midstream_queueing_of_joined_statements(midstream):
    # Joined: exec from the entry, queueing = the rest of the server time; the 9.37 s / 2.98 s mix-up
    # would show here as execution that is not the statement's own.
    x = midstream.exchanges
    truth = truth_of(MIDSTREAM)
    joined = x[x["in_slow_log"].fillna(False)]
    for _, row in joined.iterrows():
        t = truth_row(truth, row)
        assert abs(row["exec_s"] - t["exec_s"]) < 0.05 and row["exec_s"] <= row["server_s"] + 0.05
        assert abs(row["queue_s"] - max(row["server_s"] - t["exec_s"], 0)) < 0.05


def test_the_fingerprint_join_before_was_wrong_here():
    # What made this necessary: pairing by fingerprint and time gave entries to other statements. The same
    # recording's log with each entry's tag changed (same fingerprint, other text) joins nothing that way now.
    slow, _ = read_slow_log(MIDSTREAM / "slow.log")
    bent = slow.copy()
    bent["sql"] = bent["sql"].str.replace(r"md5\('(\w)(\d\d)'\)", lambda m: f"md5('{m[1]}9{m[2]}')", regex=True)
    table = exchange_table(MIDSTREAM)
    join = join_slow_log(rows_for_join(table), bent)
    changed = (bent["sql"] != slow["sql"]).to_numpy()
    assert changed.sum() >= 15
    assert (join.entry_row[changed] == -1).all()
    assert set(join.reasons[changed]) <= {"no-text-match", "no-time-fit"}


# --- every form a statement takes ------------------------------------------------------------------------------


def test_forms_every_entry_joined_to_its_statement(forms):
    s = forms.summary["slow_log"]
    assert wrong_joins(forms, FORMS) == []
    assert s["matched"] == 44 and s["joined_by"]["order"] == 44
    assert s["joined_on"] == {"text": 37, "params": 6, "template": 1, "prefix": 0, "command": 0, "time": 0}
    # not joined: the lab's own socket connection, and the SQL-level EXECUTE (logged as what it executed)
    assert s["unjoined"] == {"socket": 1, "no-text-match": 1}
    x = forms.exchanges
    assert s["exchanges_undecided"] == 1  # the EXECUTE: the entry it produced reads differently
    unknown = x.loc[x["in_slow_log"].isna()]
    assert "EXECUTE forms_stmt USING @forms_a" in set(unknown["sql"])
    # and the commands MariaDB never writes to its slow log: not being there says nothing about them
    assert set(unknown["command"]) == {"COM_QUERY", "CONNECT", "COM_STMT_PREPARE", "COM_STMT_CLOSE", "COM_STMT_RESET",
                                       "COM_STMT_SEND_LONG_DATA", "COM_PING", "COM_INIT_DB", "COM_STATISTICS",
                                       "COM_RESET_CONNECTION", "COM_QUIT"}
    assert len(unknown) == 1 + s["exchanges_of_unlogged_commands"]
    assert not x["hidden_slow"].fillna(False).any()  # long_query_time=0 and everything logged: nothing hidden


def test_forms_prepared_text_without_a_marker_joins_its_entries(forms):
    # a prepared COMMIT executed without parameters (as sysbench and JDBC's server-side prepared statements send
    # BEGIN and COMMIT) is logged as its text: each of its two entries joins its own execute, in order
    x = forms.exchanges
    truth = truth_of(FORMS)
    executed = truth[truth["note"] == "prepared without parameters"]
    bare = x[(x["command"] == "COM_STMT_EXECUTE") & (x["sql"] == "COMMIT")].sort_values("seq")
    assert len(bare) == len(executed) == 2
    slow, _ = read_slow_log(FORMS / "slow.log")
    entries = slow[slow["sql"].str.strip().str.rstrip(";") == "COMMIT"].sort_values("line")
    assert len(entries) == 2
    assert bare["in_slow_log"].tolist() == [True, True]
    assert bare["slow_log_line"].tolist() == entries["line"].tolist()
    assert bare["exec_source"].tolist() == ["slow_log", "slow_log"]


def test_forms_multi_statement_packet_is_the_sum_of_its_entries(forms):
    x = forms.exchanges
    row = x[x["sql"].astype(str).str.startswith("SELECT 10 AS a;")].iloc[0]
    slow, _ = read_slow_log(FORMS / "slow.log")
    parts = slow[slow["sql"].isin(["SELECT 10 AS a", "SELECT 11 AS b ", "SELECT 'x;y' AS semicolon_in_literal"])]
    assert len(parts) == 3 and forms.summary["slow_log"]["exchanges_with_several_entries"] == 1
    assert row["exec_s"] == pytest.approx(parts["query_time_ns"].sum() / 1e9, abs=1e-9)
    assert row["slow_log_line"] == parts["line"].min()


@pytest.mark.parametrize("cap", [100, 300])
def test_forms_cut_statements_join_by_prefix(cap):
    # --max-sql-bytes cuts the statements on the wire (sql-cut) and in the log (capped, cut): they still join,
    # by the part both kept, and nothing joins wrongly.
    r = explain(FORMS, max_sql_bytes=cap)
    s = r.summary["slow_log"]
    assert wrong_joins(r, FORMS) == []
    assert s["capped_statements"] > 0 and s["joined_on"]["prefix"] >= 1
    long_one = r.exchanges[r.exchanges["sql"].astype(str).str.startswith("SELECT 'xxxx")]
    assert long_one["problems"].astype(str).str.contains("sql-cut").all()
    assert long_one["in_slow_log"].all()
    assert s["matched"] >= 39


def test_forms_without_ids_and_order(tmp_path):
    # The same recording without the connection ids: one connection per statement kind left, times of whole
    # seconds, many statements in the same second — joins only where text and time leave one candidate.
    table = exchange_table(FORMS).copy()
    table["conn_id"] = pd.array([pd.NA] * len(table), dtype="Int64")
    slow, _ = read_slow_log(FORMS / "slow.log")
    join = join_slow_log(rows_for_join(table), slow)
    truth = truth_of(FORMS)
    port_conn = dict(zip(truth["client_port"], truth["conn_id"]))
    for e in np.flatnonzero(join.entry_row >= 0):
        row = table.iloc[int(join.entry_row[e])]
        assert port_conn[int(str(row["client"]).rsplit(":", 1)[1])] == slow["thread_id"].iloc[e]
    assert (join.entry_row >= 0).sum() >= 30
    ambiguous = slow.loc[join.reasons == "ambiguous", "sql"]
    assert ambiguous.str.startswith("SELECT CONNECTION_ID()").all()  # the identify query, on every connection


# --- the bundled recordings keep their joins --------------------------------------------------------------------


@pytest.mark.parametrize("name, joined", [("maxthreads", 8), ("group-stall", 1), ("oltp-hogs", 3)])
def test_bundled_recordings_keep_their_joins(name, joined):
    table = exchange_table(CAPTURES / name)
    slow, _ = read_slow_log(CAPTURES / name / "slow.log")
    join = join_slow_log(rows_for_join(table), slow)
    assert join.stats["matched"] == joined == len(slow)
    rows = table.iloc[join.entry_row]
    assert (rows["conn_id"].to_numpy() == slow["thread_id"].to_numpy()).all()
    assert join.stats["exchanges_undecided"] == 0


def test_changed_text_is_not_joined_and_its_exchange_is_undecided():
    # issue 15's case on group-stall: the entry's statement differs from the exchange's in a value only (same
    # fingerprint): no join, and the exchange is not called "not in the slow log" either.
    table = exchange_table(CAPTURES / "group-stall")
    slow, _ = read_slow_log(CAPTURES / "group-stall" / "slow.log")
    bent = slow.copy()
    bent["sql"] = bent["sql"].str.replace("BENCHMARK(6895237", "BENCHMARK(1800000", regex=False)
    join = join_slow_log(rows_for_join(table), bent)
    assert list(join.reasons) == ["no-text-match"] and not join.used
    hog = table["sql"].astype(str).str.startswith("SELECT BENCHMARK").to_numpy()
    assert join.undecided[hog].all() and join.stats["exchanges_undecided"] == 1
    commands = ~table["command"].isin(["COM_QUERY", "COM_STMT_EXECUTE"]).to_numpy()
    assert (join.undecided == (hog | commands)).all()  # and the logins and quits, never logged by MariaDB


def test_times_that_do_not_fit_are_not_joined():
    table = exchange_table(CAPTURES / "group-stall")
    slow, _ = read_slow_log(CAPTURES / "group-stall" / "slow.log")
    for col, shift, reason in (("timestamp", pd.Timedelta(seconds=-2), "no-time-fit"),
                               ("timestamp", pd.Timedelta(hours=1), "outside-capture")):
        moved = slow.copy()
        moved[col] = moved[col] + shift
        moved["time"] = moved["time"] + shift
        join = join_slow_log(rows_for_join(table), moved)
        assert list(join.reasons) == [reason], (shift, join.reasons)
    longer = slow.copy()
    longer["query_time_ns"] = longer["query_time_ns"] + 200_000_000  # longer than the exchange: cannot be it
    assert list(join_slow_log(rows_for_join(table), longer).reasons) == ["no-time-fit"]
    untimed = slow.copy()
    untimed["timestamp"] = untimed["time"] = pd.NaT
    assert list(join_slow_log(rows_for_join(table), untimed).reasons) == ["no-time"]


def test_summary_json_lists_reasons_and_examples(midstream):
    s = json.loads((midstream.out_dir / "summary.json").read_text())["slow_log"]
    for key in ("entries", "matched", "unjoined", "joined_by", "joined_on", "connections_identified",
                "exchanges_undecided", "unjoined_examples", "damaged_values", "capped_statements"):
        assert key in s, key
    assert len(s["unjoined_examples"]) == sum(s["unjoined"].values())
    assert {"line", "reason", "thread_id", "query_time_s", "sql"} == set(s["unjoined_examples"][0])


# --- cost ---------------------------------------------------------------------------------------------------------


def _count_fits(rows: pd.DataFrame, slow: pd.DataFrame) -> tuple[int, dict]:
    """Pair checks one join makes (exactly: a count, not a time), and its stats."""
    from pcapdecomp.slowlog import join as slowjoin

    calls = [0]
    real_one, real_many = slowjoin._Search.fits_row, slowjoin._Search.fitting_rows

    def one(self, e, r):
        calls[0] += 1
        return real_one(self, e, r)

    def many(self, e, rows):
        calls[0] += len(rows)
        return real_many(self, e, rows)

    slowjoin._Search.fits_row, slowjoin._Search.fitting_rows = one, many
    try:
        stats = join_slow_log(rows, slow).stats
    finally:
        slowjoin._Search.fits_row, slowjoin._Search.fitting_rows = real_one, real_many
    return calls[0], stats


def _identical(n: int, ids: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """n identical statements, 1 ms each, 100 a second, on n/10 connections, every one in the log (whole-second
    times, like MariaDB's); with or without the connection ids on the wire."""
    t0 = 1_795_000_000 * 10**9
    start = t0 + np.arange(n, dtype=np.int64) * 10_000_000
    conns = 1000 + np.arange(n) % max(n // 10, 1)
    rows = pd.DataFrame({"conn_id": pd.array(conns if ids else [pd.NA] * n, dtype="Int64"),
                         "conn_key": [f"c{c}" for c in conns], "command": "COM_QUERY",
                         "sql": "SELECT 1", "params": None, "sql_cut": False, "client_ip": None, "db_clock": True,
                         "start_ns": pd.array(start, dtype="Int64"), "end_ns": pd.array(start + 1_000_000, dtype="Int64")})
    naught = pd.Series(pd.NaT, index=range(n), dtype="datetime64[ns, UTC]")
    slow = pd.DataFrame({"line": np.arange(n) * 5 + 1, "thread_id": pd.array(conns, dtype="Int64"),
                         "query_time_ns": pd.array(np.full(n, 900_000), dtype="Int64"), "sql": "SELECT 1",
                         "admin_command": None, "cut": False, "ip": None, "host": "app",
                         "timestamp": pd.to_datetime(start // 10**9 * 10**9, unit="ns", utc=True),
                         "time": naught, "start": naught, "end": naught, "time_meaning": None,
                         "time_precision_ns": pd.array([10**9] * n, dtype="Int64")})
    return rows, slow


@pytest.mark.parametrize("ids", [False, True], ids=["mid-stream", "with-ids"])
def test_cost_grows_linearly_with_identical_statements(ids):
    # 100 identical statements a second, one-second log times: each entry has about a hundred candidates. The
    # work stays per entry and bounded: 4x the statements, about 4x the checks. Without ids none is joined
    # (every one ambiguous); with them, order joins every one.
    (small, _), (big, s4) = _count_fits(*_identical(1000, ids)), _count_fits(*_identical(4000, ids))
    assert big < 5 * small, (small, big)
    assert s4["matched"] == (4000 if ids else 0)
    assert s4["unjoined"] == ({} if ids else {"ambiguous": 4000})


# --- executes no entry can be ------------------------------------------------------------------------------------


class _Everything:
    def __contains__(self, key) -> bool:
        return True


def _join_everything(rows: pd.DataFrame, slow: pd.DataFrame):
    """The join with a slot (and decoded parameters) for every COM_STMT_EXECUTE, as before _Wanted."""
    from pcapdecomp.slowlog import join as slowjoin

    real = slowjoin._Wanted.__init__, slowjoin._Wanted.select, slowjoin._Wanted.could_be

    def every_key(self, *args):
        real[0](self, *args)
        self.keys = _Everything()

    slowjoin._Wanted.__init__ = every_key
    slowjoin._Wanted.select = lambda self, conn_id, tid: np.ones(len(tid), dtype=bool)
    slowjoin._Wanted.could_be = lambda self, tid, params: True
    try:
        return slowjoin.join_slow_log(rows, slow)
    finally:
        slowjoin._Wanted.__init__, slowjoin._Wanted.select, slowjoin._Wanted.could_be = real


def _threads_moved(slow: pd.DataFrame) -> pd.DataFrame:
    """The log with each entry given the thread of the next entry of another thread: entries of known threads whose
    statements are on other connections (searched there only), the case where an execute elsewhere has no slot."""
    bent = slow.copy()
    threads = bent["thread_id"].dropna().unique().tolist()
    if len(threads) > 1:
        bent["thread_id"] = bent["thread_id"].map(dict(zip(threads, threads[1:] + threads[:1]))).astype("Int64")
    return bent


@pytest.mark.parametrize("name", ["slowlog-forms", "oltp-prepared", "oltp-hogs", "midstream-join", "features"])
@pytest.mark.parametrize("variant", ["as recorded", "threads moved", "without ids"])
def test_executes_without_a_slot_change_no_decision(name, variant):
    # Only the executes some entry can be (its template, on its thread's connection when the wire names it) get a
    # slot and their parameters decoded; every decision must be the one made with all of them.
    from pcapdecomp.slowlog import join as slowjoin

    table = exchange_table(CAPTURES / name)
    slow, _ = read_slow_log(CAPTURES / name / "slow.log")
    if variant == "threads moved":
        slow = _threads_moved(slow)
    if variant == "without ids":
        table = table.copy()
        table["conn_id"] = pd.array([pd.NA] * len(table), dtype="Int64")
    rows = rows_for_join(table)
    lean, full = slowjoin.join_slow_log(rows, slow), _join_everything(rows, slow)
    assert lean.stats == full.stats
    for field in ("entry", "query_time_ns", "undecided", "reasons", "entry_row"):
        assert (getattr(lean, field) == getattr(full, field)).all(), field
    assert lean.used == full.used and lean.warnings == full.warnings


def test_executes_of_templates_no_entry_reads_get_no_slot():
    # oltp-prepared: its slow log holds the hogs only (text queries), so no execute is decoded at all.
    from pcapdecomp.slowlog import join as slowjoin

    table = exchange_table(CAPTURES / "oltp-prepared")
    slow, _ = read_slow_log(CAPTURES / "oltp-prepared" / "slow.log")
    rows = slowjoin._Rows(rows_for_join(table))
    templates = slowjoin._Templates(rows)
    entries = slowjoin._Entries(slow)
    reads = templates.reads(entries)
    command = [rows.commands[c] if c >= 0 else None for c in rows.command_code.tolist()]
    executes = sum(1 for r in range(rows.n) if command[r] == "COM_STMT_EXECUTE" and rows.timed[r])
    assert executes > 100 and not any(reads)
    slots = slowjoin._Slots(rows, templates, slowjoin._Wanted(rows, entries, reads))
    assert not any(command[r] == "COM_STMT_EXECUTE" for r in slots.row)


@pytest.mark.parametrize("name", ["slowlog-forms", "oltp-prepared", "oltp-hogs", "features"])
def test_params_key_of_recorded_executes(name):
    # the integer-only shortcut gives the key the literal reader gives, on every execute's parameters recorded
    from pcapdecomp.slowlog import join as slowjoin
    from pcapdecomp.slowlog.sqltext import WILDCARD, parse_params

    table = exchange_table(CAPTURES / name)
    params = table.loc[table["command"] == "COM_STMT_EXECUTE", "params"].dropna().astype(str).unique()
    assert len(params) > 0
    for text in params:
        values = parse_params(text)
        expected = None if values is None or WILDCARD in values else slowjoin._values_key(values)
        assert slowjoin._params_key(text) == expected, text


_BODY = st.one_of(st.text(alphabet="0123456789:-. +eExX'\\,ab", max_size=24),
                  st.builds(lambda d, f: f"2026-11-27 10:{d:02d}:00" + f, st.integers(0, 59),
                            st.sampled_from(["", ".", ".0", ".000000", ".120", ".5000"])))


@given(st.lists(st.one_of(st.integers(min_value=-10**20, max_value=10**20).map(str),
                          _BODY.map(lambda b: "'" + b + "'")), min_size=1, max_size=5))
@settings(max_examples=400, deadline=None)
def test_an_execute_passed_over_has_no_key_of_a_reading(values):
    # _Wanted.could_be passes over an execute (its parameters not decoded) only when no reading with a text value
    # can have its key: every parameters text whose key has a text is let through by a reading of that key
    from pcapdecomp.slowlog import join as slowjoin

    params = ", ".join(values)
    key = slowjoin._params_key(params)
    if key is None or not any(v[0] == "text" for v in key):
        return
    wanted = slowjoin._Wanted.__new__(slowjoin._Wanted)
    wanted._texts = slowjoin._reading_texts({("x", 3, key), ("x", 3, (("text", "zz"),))})
    assert 3 in wanted._texts
    assert wanted.could_be(3, params)


@given(st.lists(st.integers(min_value=-2**70, max_value=2**70), max_size=6),
       st.lists(st.integers(min_value=0, max_value=3), max_size=6))
@settings(max_examples=300, deadline=None)
def test_params_key_of_integers_is_the_literal_readers(values, zeros):
    from pcapdecomp.slowlog import join as slowjoin
    from pcapdecomp.slowlog.sqltext import parse_params

    texts = [("-" if v < 0 else "") + "0" * (zeros[i] if i < len(zeros) else 0) + str(abs(v))
             for i, v in enumerate(values)]
    text = ", ".join(texts)
    assert slowjoin._params_key(text) == slowjoin._values_key(parse_params(text))
