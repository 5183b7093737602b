"""A slow log cannot override the wire: header blocks a statement carries inside its text (the server writes a
statement into its slow log as is, newlines included) are that statement's SQL, not entries; where the capture
cannot check them (its copy of the statement is cut), the verdict says the log disagrees and names no culprit.
Crafted DB captures (tests/craft.py) and the slow logs a MariaDB would write for them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from craft import T0, stall

from pcapdecomp.slowlog.reader import WireStatements, parse_slow_log

S = 10**9
VICTIM_SQL = "SELECT 1"


def _forged_block(thread: int, query_time: float) -> str:
    """The header block a MariaDB 10.11 writes, as an attacker types it into a string literal."""
    when = time.strftime("%y%m%d %H:%M:%S", time.gmtime(T0 // S))
    return (f"# Time: {when}\n# User@Host: app[app] @  [10.0.0.9]\n# Thread_id: {thread}  Schema:   QC_hit: No\n"
            f"# Query_time: {query_time:.6f}  Lock_time: 0.000000  Rows_sent: 1  Rows_examined: 0\n"
            f"# Rows_affected: 0  Bytes_sent: 60\nSET timestamp={T0 // S};\n{VICTIM_SQL}")


def attacker_sql(victims: list[int]) -> str:
    """One statement whose text holds a forged entry for each victim connection."""
    return "SELECT SLEEP(3.7), 'x;\n" + ";\n".join(_forged_block(v, 3.6) for v in victims)


def _entry(thread: int, ip: str, query_time: float, sql: str) -> str:
    when = time.strftime("%y%m%d %H:%M:%S", time.gmtime(T0 // S))
    return (f"# Time: {when}\n# User@Host: app[app] @  [{ip}]\n# Thread_id: {thread}  Schema:   QC_hit: No\n"
            f"# Query_time: {query_time:.6f}  Lock_time: 0.000000  Rows_sent: 1  Rows_examined: 0\n"
            f"# Rows_affected: 0  Bytes_sent: 60\nSET timestamp={T0 // S};\n{sql};\n")


def craft(tmp: Path, victims: list[int]) -> tuple[Path, Path]:
    """DB capture: connection 8 (the attacker) runs 3.7 s; each victim connection sends SELECT 1 just after and
    waits behind it (one thread group); the slow log holds the attacker's entry only, as the server writes it."""
    db = stall(tmp / "db.pcap", attacker_sql(victims).encode(), victims, VICTIM_SQL.encode())
    log = tmp / "slow.log"
    log.write_text(_entry(8, "10.0.0.8", 3.699, attacker_sql(victims)))
    return db, log


def analyze(tmp: Path, db: Path, log: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp / "out"
    proc = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", "--db", str(db), "--slow-log", str(log),
                           "--long-query-time", "1", "--thread-pool-size", "1", "--out", str(out), "--quiet", *extra],
                          capture_output=True, text=True, timeout=300)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return proc, summary


def test_a_header_block_inside_a_statement_the_wire_shows_is_sql():
    text = _entry(8, "10.0.0.8", 3.699, attacker_sql([9]))
    naive, _ = parse_slow_log(text)
    assert len(naive) == 2 and naive[1].thread_id == 9  # what a reader without the wire sees
    wire = WireStatements([attacker_sql([9])])
    entries, stats = parse_slow_log(text, wire=wire)
    assert len(entries) == 1 and entries[0].thread_id == 8
    assert entries[0].sql == attacker_sql([9]) and stats.wire_sql_entries == 1


def test_a_statement_beginning_with_a_header_block_is_sql():
    sql = _forged_block(9, 3.6)
    entries, stats = parse_slow_log(_entry(8, "10.0.0.8", 3.699, sql), wire=WireStatements([sql]))
    assert [e.thread_id for e in entries] == [8] and entries[0].sql == sql and stats.wire_sql_entries == 1


def test_the_forged_entry_blames_no_victim(tmp_path):
    db, log = craft(tmp_path, [9])
    proc, s = analyze(tmp_path, db, log)
    assert proc.returncode == 0, proc.stderr
    assert s["slow_log"]["entries"] == 1 and s["slow_log"]["wire_sql_entries"] == 1
    assert s["slow_log"]["unverified_entries"] == 0
    import pandas as pd
    x = pd.read_parquet(tmp_path / "out" / "exchanges.parquet")
    x = x[x["command"] == "COM_QUERY"]
    victim = x[x["conn_id"] == 9]
    assert len(victim) == 1 and not bool(victim["in_slow_log"].iloc[0])  # the log holds no entry of it
    attacker = x[x["conn_id"] == 8]
    assert bool(attacker["in_slow_log"].iloc[0])  # its entry, whole, joins its exchange
    assert "SLEEP(3.7)" in s["verdict"].split("\n")[0]  # the attacker's statement is the one told as executing


def test_forging_every_victim_neither_crashes_nor_blames_them(tmp_path):
    db, log = craft(tmp_path, [9, 10, 11])
    proc, s = analyze(tmp_path, db, log)
    assert proc.returncode == 0, proc.stderr
    assert s["slow_log"]["entries"] == 1 and s["slow_log"]["wire_sql_entries"] == 3


def test_a_log_the_wire_cannot_check_names_no_culprit(tmp_path):
    db, log = craft(tmp_path, [9])
    proc, s = analyze(tmp_path, db, log, "--max-sql-bytes", "40")  # the wire keeps the statement's first line
    assert proc.returncode == 0, proc.stderr
    assert s["slow_log"]["unverified_entries"] >= 1
    assert "slow_log_disagrees" in s["story"]["findings"]
    assert "disagrees with the capture" in s["verdict"]
    assert "`" not in s["verdict"].split("\n")[0]  # no statement is named as a culprit


def test_the_stall_sentence_needs_no_victim_when_statements_certainly_queued():
    """The crash of issue 34 (np.nanmax of an empty array): every statement that queued was 'executing' by the
    slow log, so none was hidden slow or understated, yet some certainly queued. The sentence tells those. The
    rows go through story_facts, as the verdict reads them (the whole table as its one chunk)."""
    import numpy as np
    import pandas as pd

    from pcapdecomp.explain.verdict import _stall_sentence, story_facts

    nan = np.nan
    x = pd.DataFrame({"queue_min_s": [0.0, 2.5, 0.0], "thread_group": pd.array([0, 1, 0], dtype="Int64"),
                      "conn_id": pd.array([8, 9, 10], dtype="Int64"),
                      "queue_s": [0.0, nan, 0.0],  # the extent unknown: the certain part is what is told
                      "server_s": [0.01, 3.7, 0.01], "total_s": [nan, nan, nan], "exec_s": [0.01, 3.7, 0.01],
                      "queue_source": pd.Categorical(["certain", "certain", "certain"]),
                      "exec_source": pd.Categorical(["slow_log", "slow_log", "slow_log"]),
                      "in_slow_log": pd.array([True, True, True], dtype="boolean"),
                      "server_flag_slow": pd.array([None, None, None], dtype="boolean"),
                      "slow_log_line": [1.0, 2.0, 3.0], "pipelined_s": [nan, nan, nan],
                      "fingerprint": pd.Categorical(["select ?"] * 3), "sql": pd.Categorical(["SELECT 1"] * 3)})
    none = np.zeros(3, dtype=bool)
    facts = story_facts(x, np.ones(3, dtype=bool), none, none, none)
    assert facts["certain:count"] == 1 and facts["victims:count"] == 0
    text = _stall_sentence(facts, [], {"value": 2, "source": "given"}, True)
    assert text.startswith("1 statement waited up to 2.500 s before executing;")
