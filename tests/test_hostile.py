"""Damaged and hostile input through the whole pipeline: what is intact is analysed, the damage is warned about
once per capture and recorded in summary.json, every MySQL byte is accounted for, huge statements are streamed."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest

from pcapdecomp.exchanges import extract
from pcapdecomp.mysql.connection import CLIENT, SERVER

from pcaptools import rewrite
from test_mysql_core import established, handshake, pkt

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
SETS = ["group-stall", "maxthreads", "oltp-hogs", "features"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcapdecomp.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "COLUMNS": "200"}, timeout=300)


def tshark_payload_bytes(path: Path, flt: str = "tcp.port==3306") -> int:
    proc = subprocess.run(["tshark", "-r", str(path), "-Y", f"({flt}) && tcp.len>0 && !tcp.analysis.retransmission",
                           "-T", "fields", "-e", "tcp.len"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return sum(int(v) for v in proc.stdout.split())


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("side", ["app", "db"])
def test_every_mysql_byte_is_accounted_for(name, side):
    """The MySQL connections' payload bytes (tshark's count) = read by the parser + skipped + TLS + never captured."""
    q = extract(CAPTURES / name / f"{side}.pcap").quality()
    accounted = q["mysql_bytes"] + q["unparsed_bytes"] + q["tls_bytes"]
    assert accounted == tshark_payload_bytes(CAPTURES / name / f"{side}.pcap")
    assert q["frames"] == (q["frames_tcp"] + q["frames_non_ip"] + q["frames_non_tcp"] + q["frames_ip_fragment"]
                           + q["frames_undecodable"] + q["frames_unknown_link"])
    assert q["frames_tcp"] == q["frames_tcp_mysql"] + q["frames_tcp_other"]
    expected_share = 1.0 if q["tls_bytes"] == 0 else q["mysql_bytes"] / accounted
    assert q["understood_share"] == pytest.approx(expected_share, abs=1e-6)


def test_a_capture_cut_mid_connection_accounts_for_the_skipped_bytes(tmp_path):
    """The first 40 % of oltp-hogs' DB capture removed: connections start mid-stream, the bytes before the
    parser could resynchronise are counted as unparsed, and the sum still equals tshark's payload count."""
    src = CAPTURES / "oltp-hogs" / "db.pcap"
    total = sum(1 for _ in open(src, "rb"))  # noqa: SIM115 — any size proxy would do; we use frame indexes below
    frames = extract(src).quality()["frames"]
    rewrite(src, tmp_path / "cut.pcap", keep=lambda i, t: i >= int(frames * 0.4))
    q = extract(tmp_path / "cut.pcap").quality()
    assert q["midstream_connections"] > 0 and q["unparsed_bytes"] > 0 and total > 0
    assert q["mysql_bytes"] + q["unparsed_bytes"] + q["tls_bytes"] == tshark_payload_bytes(tmp_path / "cut.pcap")
    assert 0.9 < q["understood_share"] < 1.0


def _truncated(t: Path) -> Path:
    data = (CAPTURES / "group-stall" / "db.pcap").read_bytes()
    (t / "db.pcap").write_bytes(data[: len(data) * 2 // 3 + 7])  # cut inside a record, as a full disk does
    return t / "db.pcap"


def _insane_length(t: Path) -> Path:
    data = bytearray((CAPTURES / "group-stall" / "db.pcap").read_bytes())
    pos, n = 24, 0
    while n < 500:  # the 501st record header claims 2 GB
        pos += 16 + struct.unpack_from("<I", data, pos + 8)[0]
        n += 1
    struct.pack_into("<I", data, pos + 8, 0x7FFF0000)
    (t / "db.pcap").write_bytes(bytes(data))
    return t / "db.pcap"


def _snaplen(t: Path) -> Path:
    proc = subprocess.run(["editcap", "-s", "80", str(CAPTURES / "group-stall" / "db.pcap"), str(t / "db.pcap")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return t / "db.pcap"


def _unknown_blocks(t: Path) -> Path:
    """pcapng (editcap -F pcapng) with an unknown block (type 0x0BAD) after the interface description."""
    ng = t / "conv.pcapng"
    subprocess.run(["editcap", "-F", "pcapng", str(CAPTURES / "group-stall" / "db.pcap"), str(ng)], check=True,
                   capture_output=True, timeout=60)
    data = ng.read_bytes()
    shb_len = struct.unpack_from("<I", data, 4)[0]
    idb_len = struct.unpack_from("<I", data, shb_len + 4)[0]
    cut = shb_len + idb_len
    unknown = struct.pack("<II", 0x0BAD, 16) + b"junk" + struct.pack("<I", 16)
    (t / "db.pcapng").write_bytes(data[:cut] + unknown + data[cut:])
    return t / "db.pcapng"


DAMAGE = [
    ("truncated mid-record", _truncated, "damaged", "truncated"),
    ("insane record length", _insane_length, "damaged", "record"),
    ("snaplen 80", _snaplen, "frames_truncated", "frames cut by the snaplen"),
    ("unknown pcapng block", _unknown_blocks, "unknown_blocks", "unknown pcapng blocks"),
]


@pytest.mark.parametrize("name,make,key,words", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_db_capture_is_analysed_as_far_as_intact(tmp_path, name, make, key, words):
    capture = make(tmp_path)
    gs = CAPTURES / "group-stall"
    out = tmp_path / "out"
    proc = cli("analyze", "--app", str(gs / "app.pcap"), "--db", str(capture), "--slow-log", str(gs / "slow.log"),
               "--long-query-time", "1", "--thread-pool-size", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    mine = [line for line in proc.stderr.splitlines() if line.startswith(f"warning: {capture}")]
    assert len(mine) == 1 and words in mine[0], proc.stderr  # once per capture, with the counts
    summary = json.loads((out / "summary.json").read_text())
    db = summary["captures"]["db"]
    assert db[key], db
    assert any(w.startswith(str(capture)) for w in summary["warnings"])
    table = pd.read_parquet(out / "exchanges.parquet")
    # what is intact is analysed: exchanges seen at both points up to the damage
    assert summary["match"]["matched"] > 0
    if key == "damaged":
        assert 0 < summary["match"]["matched"] < 352 and (table["seen"] == "app").sum() > 0
    elif key == "unknown_blocks":
        assert summary["match"]["matched"] == 352


def test_capture_without_mysql_says_so_and_writes_empty_outputs(tmp_path):
    """A capture of TCP traffic that is not MySQL (the MySQL payloads replaced by HTTP-looking bytes on port 80)."""
    def not_mysql(p: bytes) -> bytes:
        p = bytearray(p)
        ihl = (p[14] & 0x0F) * 4
        tcp = 14 + ihl
        struct.pack_into(">H", p, tcp, 80) if struct.unpack_from(">H", p, tcp)[0] == 3306 else None
        struct.pack_into(">H", p, tcp + 2, 80) if struct.unpack_from(">H", p, tcp + 2)[0] == 3306 else None
        off = tcp + (p[tcp + 12] >> 4) * 4
        p[off:] = (b"GET / HTTP/1.1\r\n" * 100)[: len(p) - off]
        return bytes(p)

    rewrite(CAPTURES / "maxthreads" / "db.pcap", tmp_path / "web.pcap", packet=not_mysql)
    out = tmp_path / "out"
    proc = cli("analyze", "--db", str(tmp_path / "web.pcap"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"warning: {tmp_path / 'web.pcap'}: no MySQL traffic found" in proc.stderr
    assert len(pd.read_parquet(out / "exchanges.parquet")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["captures"]["db"]["frames_tcp_other"] == summary["captures"]["db"]["frames"] > 0


def test_max_sql_bytes_cuts_and_marks_long_statements(tmp_path):
    out = tmp_path / "out"
    proc = cli("analyze", str(CAPTURES / "group-stall"), "--max-sql-bytes", "20", "--out", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    x = pd.read_parquet(out / "exchanges.parquet")
    bench = x[x["sql"].fillna("").str.startswith("SELECT BENCHM")]
    assert len(bench) == 1 and bench["sql"].iloc[0] == "SELECT BENCHMARK(68" and "sql-cut" in bench["problems"].iloc[0]
    short = x[x["sql"] == "SELECT 1"]
    assert len(short) > 0 and not short["problems"].fillna("").str.contains("sql-cut").any()


def test_a_100_mb_statement_is_streamed_not_stored():
    """A COM_QUERY of 100 MB (seven 16 MiB − 1 packets and a tail) fed in 256 KiB pieces after a real handshake:
    the SQL kept is max_sql_bytes, and peak memory stays far below the statement size."""
    conn, f = established(handshake())
    size = 100 * 2**20
    piece = b"x" * (256 * 1024)
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        payload_left, seq, first = size, 0, True
        while payload_left > 0:
            length = min(payload_left, 0xFFFFFF)
            header = length.to_bytes(3, "little") + bytes([seq])
            body_first = b"\x03SELECT '" if first else b""
            f.send(CLIENT, header + body_first)
            left = length - len(body_first)
            while left > 0:
                chunk = piece[: min(left, len(piece))]
                f.send(CLIENT, chunk)
                left -= len(chunk)
            payload_left -= length
            seq, first = seq + 1, False
            if length < 0xFFFFFF:
                break
        if size % 0xFFFFFF == 0:
            f.send(CLIENT, bytes([0, 0, 0, seq]))
        f.send(SERVER, pkt(seq + 1, b"\x00\x00\x00\x02\x00\x00\x00"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (ex,) = f.take()
    assert ex.command == "COM_QUERY" and ex.result == "ok" and ex.sql_cut
    assert ex.bytes_req == size + 4 * (size // 0xFFFFFF + 1)
    assert peak - base < 8 * 2**20, peak - base  # 100 MB went through; a few MiB were held


def test_garbage_around_a_real_slow_log_is_counted_and_the_entries_still_join(tmp_path):
    gs = CAPTURES / "group-stall"
    log = tmp_path / "slow.log"
    log.write_text("garbage before\n@@@\n" + (gs / "slow.log").read_text() + "garbage one\n@@@ two\n# Query_time: zz\n")
    out = tmp_path / "out"
    proc = cli("analyze", str(gs), "--slow-log", str(log), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "3 lines after the last statement's ';' at the end of the log are not a slow-log entry" in proc.stderr
    s = json.loads((out / "summary.json").read_text())["slow_log"]
    assert s["used"] and s["matched"] == s["entries"] == 1 and s["unparsed_lines"] == 5 and s["cut_entries"] == 0
    x = pd.read_parquet(out / "exchanges.parquet")
    assert int(x["in_slow_log"].fillna(False).sum()) == 1 and int(x["hidden_slow"].fillna(False).sum()) == 3
