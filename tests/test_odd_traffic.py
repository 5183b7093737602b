"""Odd but legal traffic is told for what it is: a client that pipelines (sends its next request before the answer
to the one before) waits in its connection, not in the thread pool: never queueing, never a stall, never hidden
slow. Crafted DB captures (tests/craft.py) with the slow log a MariaDB writes for them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from craft import OK, T0, Capture, Conversation, pkt

REPO = Path(__file__).resolve().parent.parent
S = 10**9
MS = 10**6


def slow_entry(thread: int, ip: str, query_time: float, sql: str, start_ns: int) -> str:
    when = time.strftime("%y%m%d %H:%M:%S", time.gmtime(start_ns // S))
    return (f"# Time: {when}\n# User@Host: app[app] @  [{ip}]\n# Thread_id: {thread}  Schema:   QC_hit: No\n"
            f"# Query_time: {query_time:.6f}  Lock_time: 0.000000  Rows_sent: 1  Rows_examined: 0\n"
            f"# Rows_affected: 0  Bytes_sent: 60\nSET timestamp={start_ns // S};\n{sql};\n")


def pipelining_capture(tmp: Path) -> tuple[Path, Path]:
    """Connection 8 sends SELECT SLEEP(3) and, 1 ms later, SELECT 1 before the first answer (answered 3 s later,
    in order); connection 10 of the same thread group (thread_pool_size 1) sends SELECT 1 every 100 ms and is
    answered in 1 ms each time: the pool was free all along."""
    cap = Capture()
    piper = Conversation(cap, client=("10.0.0.8", 40008)).open().login(8)
    other = Conversation(cap, client=("10.0.0.10", 40010)).open().login(10)
    start = T0 + S // 10
    events = [(start, piper.client_sends, pkt(0, b"\x03SELECT SLEEP(3)")),
              (start + MS, piper.client_sends, pkt(0, b"\x03SELECT 1")),
              (start + 3 * S, piper.server_sends, pkt(1, OK)),
              (start + 3 * S + MS // 2, piper.server_sends, pkt(1, OK))]
    for i in range(35):
        at = start + 2 * MS + i * 100 * MS
        events += [(at, other.client_sends, pkt(0, b"\x03SELECT 1")), (at + MS, other.server_sends, pkt(1, OK))]
    for at, send, data in sorted(events, key=lambda e: e[0]):
        send(data, ts=at)
    db = cap.write(tmp / "db.pcap")
    log = tmp / "slow.log"
    log.write_text(slow_entry(8, "10.0.0.8", 3.0, "SELECT SLEEP(3)", start))
    return db, log


def test_a_pipelined_request_waits_in_its_connection_not_in_the_pool(tmp_path):
    db, log = pipelining_capture(tmp_path)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", "--db", str(db), "--slow-log", str(log),
                           "--long-query-time", "1", "--thread-pool-size", "1", "--out", str(out), "-q"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    x = pd.read_parquet(out / "exchanges.parquet")
    x = x[x["command"] == "COM_QUERY"]
    piped = x[(x["conn_id"] == 8) & (x["sql"] == "SELECT 1")].iloc[0]
    assert piped["server_s"] > 2.9  # on the wire it took 3 s ...
    assert abs(piped["pipelined_s"] - (3 - 0.001)) < 0.01  # ... behind SLEEP(3) on its own connection
    assert piped["queue_min_s"] == 0 and not bool(piped["hidden_slow"]) and pd.isna(piped["stall"])
    assert (x.loc[x["conn_id"] == 10, "pipelined_s"] == 0).all()
    assert (pd.read_parquet(out / "exchanges.parquet")["pipelined_s"].fillna(0) < 3).all()  # logins too
    s = json.loads((out / "summary.json").read_text())
    assert s["groups"]["stalls"] == [] and s["exchanges"]["hidden_slow"] == 0
    assert "pipelined" in s["verdict"] and "stalled" not in s["verdict"]


SLOW_OK = b"\x00\x00\x00\x02\x08\x00\x00"  # OK with SERVER_QUERY_WAS_SLOW (0x0800) in its status flags


def two_servers_capture(tmp: Path) -> Path:
    """One DB capture point seeing two servers, A (10.0.0.2) and B (10.0.0.3). On A, connection 8's SELECT 1 waits
    3.6 s with nothing long running on A; on B, connection 10 (the same thread group, conn_id mod 2) runs a
    statement the server flags slow over that time. B's statement cannot hold A's thread pool."""
    cap = Capture()
    a = Conversation(cap, client=("10.0.0.8", 40008), server=("10.0.0.2", 3306)).open().login(8)
    b = Conversation(cap, client=("10.0.0.10", 40010), server=("10.0.0.3", 3306)).open().login(10)
    start = T0 + S // 10
    b.client_sends(pkt(0, b"\x03SELECT SLEEP(3.7)"), ts=start)
    a.client_sends(pkt(0, b"\x03SELECT 1"), ts=start + MS)
    a.server_sends(pkt(1, OK), ts=start + 3600 * MS)
    b.server_sends(pkt(1, SLOW_OK), ts=start + 3700 * MS)
    return cap.write(tmp / "db.pcap")


def test_a_statement_on_another_server_is_never_the_culprit(tmp_path):
    db = two_servers_capture(tmp_path)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", "--db", str(db), "--long-query-time", "1",
                           "--thread-pool-size", "2", "--out", str(out), "-q"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    x = pd.read_parquet(out / "exchanges.parquet")
    x = x[x["command"] == "COM_QUERY"]
    victim = x[x["conn_id"] == 8].iloc[0]
    assert victim["queue_min_s"] > 2.5 and victim["stall_role"] == "victim"  # it certainly waited, on A
    s = json.loads((out / "summary.json").read_text())
    stalls = s["groups"]["stalls"]
    assert len(stalls) == 1 and stalls[0]["culprits_total"] == 0  # nothing on A held it
    assert (x["stall_role"] == "culprit").sum() == 0 and "SLEEP" not in s["verdict"].split("\n")[0]


def conflicting_retransmission(path: Path, second: bytes) -> Path:
    """A client's COM_QUERY sent twice at the same sequence number, the second copy with `second` as its text (an
    insertion: the bytes an IDS and the server may take differently), answered once."""
    from craft import ACK, PSH

    cap = Capture()
    conn = Conversation(cap).open().login(7)
    first = pkt(0, b"\x03SELECT 1")
    conn.client_sends(first)
    conn._frame(True, PSH | ACK, pkt(0, b"\x03" + second), seq=conn.cseq - len(first))
    conn.server_sends(pkt(1, OK))
    conn.close()
    return cap.write(path)


def test_two_copies_of_a_request_that_differ_are_a_counted_conflict(tmp_path):
    from pcapdecomp.read.exchanges import extract

    x = extract(conflicting_retransmission(tmp_path / "db.pcap", b"SELECT 2"))
    query = x.exchanges[x.exchanges["command"] == "COM_QUERY"].iloc[0]
    assert query["sql"] == "SELECT 1"  # the first copy is the one read, as before
    assert "retransmission-conflict" in query["problems"]
    assert x.quality()["retransmission_conflicts"] == 1
    same = extract(conflicting_retransmission(tmp_path / "same.pcap", b"SELECT 1"))  # a plain retransmission
    assert same.quality()["retransmission_conflicts"] == 0 and same.quality()["retransmitted_bytes"] > 0


def _lane_and_python(path: Path, monkeypatch) -> list[pd.DataFrame]:
    """The COM_QUERY rows of `path` as the fast lane reads it and as Python alone does (the same, or a bug)."""
    from pcapdecomp.read.exchanges import extract

    tables = []
    for no_lane in ("", "1"):
        monkeypatch.setenv("PCAPDECOMP_NO_LANE", no_lane)
        x = extract(path).exchanges
        tables.append(x[x["command"] == "COM_QUERY"].reset_index(drop=True))
    monkeypatch.delenv("PCAPDECOMP_NO_LANE")
    return tables


def test_a_conflict_in_an_answer_marks_the_exchange_it_finishes(tmp_path, monkeypatch):
    """The answer's tail arrives first (out of order), then the whole answer with other bytes there: the copies
    differ inside the answer to SELECT 1, and the whole answer finishes that exchange. Found by fuzzing: the mark
    was put after the bytes were delivered, so it went to the next request (SELECT 2), and the fast lane, which took
    the connection between the two, left it to the one after."""
    from craft import ACK, PSH

    cap = Capture()
    conn = Conversation(cap).open().login(7)
    conn.client_sends(pkt(0, b"\x03SELECT 1"))
    answer = pkt(1, b"\x00\x00\x00\x02\x00\x00\x00")
    forged = answer[:6] + b"\x01\x01\x01\x01\x01"
    conn._frame(False, PSH | ACK, forged[6:], seq=conn.sseq + 6)  # the tail first, as another copy has it
    conn.server_sends(answer)
    conn.query(b"SELECT 2")
    conn.query(b"SELECT 3")
    conn.close()
    lane, python = _lane_and_python(cap.write(tmp_path / "db.pcap"), monkeypatch)
    pd.testing.assert_frame_equal(lane, python)
    marked = python.loc[python["problems"].astype(str).str.contains("retransmission-conflict"), "sql"].tolist()
    assert marked == ["SELECT 1"]


def test_a_conflict_in_a_request_being_read_marks_that_request(tmp_path, monkeypatch):
    """SELECT 1 waits for its answer; the first bytes of the next request come twice, differently, before its
    rest: the copies differ inside SELECT 2, not inside SELECT 1 (which was marked before)."""
    from craft import ACK, PSH

    cap = Capture()
    conn = Conversation(cap).open().login(7)
    conn.client_sends(pkt(0, b"\x03SELECT 1"))
    second = pkt(0, b"\x03SELECT 2")
    conn.client_sends(second[:6])
    conn._frame(True, PSH | ACK, second[:5] + b"s", seq=conn.cseq - 6)  # another copy of them: 's' for 'S'
    conn.client_sends(second[6:])
    conn.server_sends(pkt(1, OK))
    conn.server_sends(pkt(1, OK))
    conn.close()
    lane, python = _lane_and_python(cap.write(tmp_path / "db.pcap"), monkeypatch)
    pd.testing.assert_frame_equal(lane, python)
    marked = python.loc[python["problems"].astype(str).str.contains("retransmission-conflict"), "sql"].tolist()
    assert marked == ["SELECT 2"]
