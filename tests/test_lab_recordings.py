"""The bundled lab recordings (captures/*/db.pcap) against their ground truth (truth.jsonl, written by the client
that sent each statement) and against tshark.

truth.jsonl is independent of our parser: the lab's drivers record what they sent, when (client_send_ns /
client_recv_ns on the same clock as the capture: the network namespaces share the host's clock), how many rows
came back and which error. The features set has one connection per protocol feature (captures/features/README.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import pandas as pd
import pytest
from streams import lab_segments, track

from pcapdecomp.read.exchanges import extract

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
LAB = ["features", "group-stall", "maxthreads", "oltp-hogs"]

_RESULTS: dict[str, object] = {}


def result(name: str):
    if name not in _RESULTS:
        _RESULTS[name] = extract(CAPTURES / name / "db.pcap")
    return _RESULTS[name]


def truth(name: str) -> list[dict]:
    with (CAPTURES / name / "truth.jsonl").open() as fh:
        return [json.loads(line) for line in fh]


def matched(name: str) -> list[tuple[dict, dict]]:
    """Pair every truth row with our exchange: same connection id, same command and statement, in order (our table
    also has the driver's own statements — SET NAMES, pings — which truth does not list)."""
    ex = result(name).exchanges
    by_conn: dict[int, list[dict]] = defaultdict(list)
    for row in ex.sort_values(["conn_index", "seq"]).to_dict("records"):
        if row["conn_id"] is not None and row["conn_id"] == row["conn_id"]:
            by_conn[int(row["conn_id"])].append(row)
    tls = set(result(name).connections.query("tls")["conn_id"].dropna().astype(int))
    pairs = []
    for t in truth(name):
        if t["conn_id"] in tls:
            continue
        rows = by_conn[t["conn_id"]]
        while rows and not (rows[0]["command"] == t["command"] and (t["sql"] is None or rows[0]["sql"] == t["sql"])):
            rows.pop(0)
        assert rows, f"no exchange for truth row {t}"
        pairs.append((t, rows.pop(0)))
    return pairs


# ---- every truth row, every recording ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", LAB)
def test_every_statement_sent_is_an_exchange_with_its_rows_error_and_time(name):
    pairs = matched(name)
    assert len(pairs) >= len(truth(name)) - 2  # only the TLS connection's two statements are unreadable
    for t, ex in pairs:
        # the capture saw the request after the client sent it, and the whole answer before the client had it
        last = ex["resp_last_ts"] if ex["resp_last_ts"] == ex["resp_last_ts"] else ex["req_last_ts"]  # no answer
        assert t["client_send_ns"] <= ex["req_first_ts"].value <= last.value <= t["client_recv_ns"], t
        if t["error"]:
            code, _, message = t["error"].partition(": ")
            assert (ex["result"], ex["error_code"], ex["error_message"]) == ("error", int(code), message)
        elif t["rows"] is not None:
            assert ex["rows"] == t["rows"], t
            assert ex["result"] in ("resultset", "ok")
        assert "gap" not in ex["problems"] and "violation" not in ex["problems"]
    q = result(name).quality()
    assert q["violations"] == 0 and q["gaps"] == 0 and q["unparsed_bytes"] == 0 and q["midstream_connections"] == 0


@pytest.mark.parametrize("name", LAB)
def test_connection_ids_and_server_version_from_the_greeting(name):
    conns = result(name).connections
    assert set(t["conn_id"] for t in truth(name)) <= set(conns["conn_id"].dropna().astype(int))
    toml = (CAPTURES / name / "capture.toml").read_text()
    version = next(line.split('"')[1] for line in toml.splitlines() if line.startswith("version"))
    # MariaDB prefixes its version with "5.5.5-" in the greeting so that old replicas accept it
    assert set(conns["server_version"]) == {"5.5.5-" + version}


# ---- the features recording, feature by feature ---------------------------------------------------------------------------
def feature(label: str) -> list[tuple[dict, dict]]:
    return [(t, ex) for t, ex in matched("features") if t["conn_label"] == label]


def connection_of(label: str) -> dict:
    conn_id = next(t["conn_id"] for t in truth("features") if t["conn_label"] == label)
    conns = result("features").connections
    return conns[conns["conn_id"] == conn_id].iloc[0].to_dict()


def exchanges_of(label: str):
    conn_id = next(t["conn_id"] for t in truth("features") if t["conn_label"] == label)
    ex = result("features").exchanges
    return ex[ex["conn_id"] == conn_id].sort_values("seq")


def test_call_and_multi_statement_give_two_result_sets():
    (t, call), = [p for p in feature("multi-results-call") if p[0]["role"] == "query"]
    assert call["sql"] == "CALL two_results()" and call["result_sets"] == 2 and call["rows"] == t["rows"]
    (t, multi), = [p for p in feature("multi-statement") if p[0]["role"] == "query"]
    # SELECT 1; SELECT 2, 3; DO 0 -> two result sets and a final OK, the last without MORE_RESULTS
    assert multi["result_sets"] == 2 and multi["rows"] == 2 and not multi["status_flags"] & 0x0008


def test_local_infile():
    (t, load), = [p for p in feature("local-infile") if p[0]["role"] == "query"]
    rows_in_file = int(t["note"].removeprefix("LOAD DATA LOCAL INFILE, ").removesuffix(" rows"))
    assert load["sql"].startswith("LOAD DATA LOCAL INFILE") and load["result"] == "ok"
    assert load["affected_rows"] == rows_in_file == 200
    assert load["bytes_req"] > len("".join(f"{i},row {i}\n" for i in range(1, 201)))  # the file went up too


def test_cursor_fetch_rows():
    pairs = feature("cursor")
    execute = next(ex for t, ex in pairs if t["command"] == "COM_STMT_EXECUTE")
    fetches = [(t, ex) for t, ex in pairs if t["command"] == "COM_STMT_FETCH"]
    assert execute["rows"] == 0 and execute["result"] == "resultset"
    assert execute["status_flags"] & 0x0040  # SERVER_STATUS_CURSOR_EXISTS: the rows come with COM_STMT_FETCH
    assert [ex["rows"] for _, ex in fetches] == [t["rows"] for t, _ in fetches] == [5, 5, 2]
    assert all(ex["sql"] == "SELECT id, c FROM sbtest1 WHERE id <= ?" for _, ex in fetches)
    assert execute["params"] == "12"
    last = fetches[-1][1]
    assert last["status_flags"] & 0x0080  # SERVER_STATUS_LAST_ROW_SENT: the cursor is exhausted
    close = next(ex for t, ex in pairs if t["command"] == "COM_STMT_CLOSE")
    assert close["result"] == "none" and close["resp_first_ts"] is pd.NaT


def test_send_long_data_has_no_response():
    pairs = feature("long-data")
    long_data = [ex for t, ex in pairs if t["command"] == "COM_STMT_SEND_LONG_DATA"]
    assert len(long_data) == 2
    for ex in long_data:
        assert ex["result"] == "none" and ex["sql"] == "INSERT INTO blobs (b) VALUES (?)"
    execute = next(ex for t, ex in pairs if t["command"] == "COM_STMT_EXECUTE")
    assert execute["result"] == "ok" and execute["affected_rows"] == 1
    assert execute["params"] == "<long data: 6000 bytes>"  # "inserts 6000 bytes" in two chunks of 3000


def test_typed_parameters_decode_to_the_literals_sent():
    """captures/lab/workload.py sends (n, x, s) from the truth note, a DATETIME 2024-05-01 10:00:00.512345 and NULL."""
    pairs = [(t, ex) for t, ex in feature("typed-params") if t["command"] == "COM_STMT_EXECUTE"]
    assert len(pairs) == 2
    for t, ex in pairs:
        n, x, s = t["note"].removeprefix("params ").rsplit(", datetime, NULL")[0].split(", ", 2)
        assert ex["params"] == f"{n}, {x}, {s}, '2024-05-01 10:00:00.512345', NULL"
        assert ex["rows"] == 1
    reset = [ex for t, ex in feature("typed-params") if t["command"] == "COM_STMT_RESET"]
    assert reset and reset[0]["result"] == "ok"


@pytest.mark.parametrize("label,command", [
    ("reset-connection", "COM_RESET_CONNECTION"),
    ("ping", "COM_PING"),
    ("init-db", "COM_INIT_DB"),
    ("statistics", "COM_STATISTICS"),
    ("change-user", "COM_CHANGE_USER"),
])
def test_administrative_commands(label, command):
    pairs = feature(label)
    (t, ex), = [p for p in pairs if p[0]["command"] == command]
    assert ex["result"] == "ok" and ex["resp_last_ts"] is not None
    (t_after, after), = [p for p in pairs if p[0]["role"] == "after"]
    assert after["result"] == "resultset" and after["rows"] == t_after["rows"] == 1
    if command == "COM_INIT_DB":
        assert ex["sql"] == "USE `mysql`"
    if command == "COM_CHANGE_USER":  # the auth switch round trip is inside the exchange: more than one packet back
        assert ex["bytes_resp"] > 11


def test_err_1064_with_sql_state():
    (t, ex), = [p for p in feature("error") if p[0]["role"] == "query"]
    assert (ex["error_code"], ex["error_state"]) == (1064, "42000")
    assert ex["error_message"] == t["error"].split(": ", 1)[1]


def test_tls_connection():
    conn = connection_of("tls")
    assert conn["tls"] and conn["tls_bytes"] > 0 and conn["violations"] == 0
    # no key log was recorded with features: everything after the SSLRequest is read as timed records
    assert conn["tls_mode"] == "timed" and conn["tls_version"] == "1.3"
    assert conn["tls_timed_bytes"] == conn["tls_bytes"]
    ex = exchanges_of("tls")
    assert ex.iloc[0]["command"] == "CONNECT" and ex.iloc[0]["result"] == "encrypted"
    assert set(ex["command"].iloc[1:]) == {"ENCRYPTED"} and ex["sql"].isna().all()
    # each statement the client timed is one flight, inside the client's send … receive on the lab's one clock
    answered = ex[ex["result"] == "encrypted"]
    start = answered["req_first_ts"].astype("int64").to_numpy()
    end = answered["resp_last_ts"].astype("int64").to_numpy()
    for t in (t for t in truth("features") if t["conn_label"] == "tls"):
        inside = (start >= t["client_send_ns"]) & (end <= t["client_recv_ns"])
        assert inside.sum() == 1, t["sql"]
    assert conn["server_version"]  # the greeting is in clear


def test_zlib_compression():
    conn = connection_of("zlib")
    assert conn["compressed"] == "zlib"
    ex = exchanges_of("zlib")
    assert set(ex["compressed"]) == {"zlib"}
    sqls = [t["sql"] for t in truth("features") if t["conn_label"] == "zlib"]
    assert set(sqls) <= set(ex["sql"].dropna())
    (t, big), = [p for p in feature("zlib") if p[0]["role"] == "query"]
    # the row is 5200 bytes of 'compressible ' but travels compressed: the response's TCP byte range is smaller
    # (bytes_resp counts the inflated MySQL packets)
    assert big["rows"] == 1 and big["bytes_resp"] > 400 * len("compressible ")
    assert 0 < (big["resp_tcp_end"] - big["resp_tcp_seq"]) % (1 << 32) < 400 * len("compressible ") // 4


def test_ipv6_endpoint():
    toml = (CAPTURES / "features" / "capture.toml").read_text()
    address = next(line.split('"')[1] for line in toml.splitlines() if line.startswith("address_ipv6"))
    conn = connection_of("ipv6")
    assert conn["server"] == address == "[fd77::2]:3306"
    assert [t["sql"] for t, _ in feature("ipv6")][-1] == "SELECT 'over IPv6'"


# ---- tshark ----------------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed (CI has it)")
@pytest.mark.parametrize("name", LAB)
def test_commands_per_connection_equal_tsharks(name):
    out = subprocess.run(
        ["tshark", "-r", str(CAPTURES / name / "db.pcap"), "-Y", "mysql.command", "-T", "fields",
         "-e", "tcp.srcport", "-e", "tcp.dstport", "-e", "mysql.command", "-e", "mysql.packet_number"],
        capture_output=True, text=True, check=True,
    ).stdout
    theirs: Counter = Counter()
    for line in out.splitlines():
        src, dst, commands, numbers = line.split("\t")
        client = src if dst == "3306" else dst
        # a command is packet number 0; tshark also labels the LOCAL INFILE file contents (packet 2 of the
        # exchange) as a "command" named after the file's first byte. Several pipelined commands share a frame.
        theirs[int(client)] += sum(1 for n in numbers.split(",") if n == "0")
    res = result(name)
    conns = res.connections
    # tshark 4.0 does not inflate the compressed protocol (it reads the compressed header as a MySQL packet and
    # reports garbage commands) and cannot see inside TLS: those connections are left out of the comparison.
    skip = set(conns.loc[conns["compressed"].notna() | conns["tls"], "client"].str.rsplit(":", n=1).str[1].astype(int))
    ours = Counter(
        int(client.rsplit(":", 1)[1])
        for client, command in zip(res.exchanges["client"], res.exchanges["command"])
        if command != "CONNECT"
    )
    for port in skip:
        theirs.pop(port, None)
        ours.pop(port, None)
    assert ours == theirs and sum(ours.values()) > 0


# ---- a real recording with a lost segment -----------------------------------------------------------------------------------
def test_a_lost_response_segment_marks_one_exchange_and_the_rest_stays_exact():
    """Drop one server segment in the middle of oltp-hogs (the client's ACK proves it was sent): the exchange it
    answered is marked 'gap', no statement is invented, and every other exchange is identical."""
    segs = lab_segments("oltp-hogs")
    want = track(segs)[0]
    server = {(s.dst_ip, s.dst_port) for s in segs if s.flags & 0x02 and not s.flags & 0x10}
    candidates = [i for i, s in enumerate(segs) if (s.src_ip, s.src_port) in server and len(s.payload) > 20]
    checked = 0
    for i in candidates[len(candidates) // 3 :: max(1, len(candidates) // 7)][:6]:
        lost = segs[i]
        rows, tracker, _ = track(segs[:i] + segs[i + 1 :])
        got = {(idx, ex.seq): ex for idx, _, ex in rows}
        marked = [ex for ex in got.values() if "gap" in ex.problems]
        assert len(marked) == 1
        hit = marked[0]
        assert hit.resp_first_ts is None or hit.resp_first_ts <= lost.ts_ns or hit.result is None
        for idx, _, ex in want:
            other = got.get((idx, ex.seq))
            if other is hit:
                assert other.sql == ex.sql and other.req_first_ts == ex.req_first_ts
                continue
            assert other == ex
        assert len(got) == len(want)
        checked += 1
    assert checked >= 5
