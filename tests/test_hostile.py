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
from craft import pkt
from feeding import established, handshake
from pcaptools import rewrite

from pcapdecomp.mysql.connection import CLIENT, SERVER
from pcapdecomp.read.exchanges import extract

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
SETS = ["group-stall", "maxthreads", "oltp-hogs", "features", "group-stall-tls13", "oltp-prepared-tls13"]


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
    read = q["mysql_bytes"] + q["tls_decrypted_bytes"] + q["tls_timed_bytes"]
    assert q["tls_decrypted_bytes"] + q["tls_timed_bytes"] + q["tls_unreadable_bytes"] == q["tls_bytes"]
    expected_share = read / accounted
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


# --- issue 16: numbers out of range, broken timestamps, caps that bite --------------------------------------------

from craft import Capture, Conversation, write_lenenc_int  # noqa: E402
from lanes import assert_same  # noqa: E402
from pcaptools import ng_epb, ng_idb, ng_shb  # noqa: E402

from pcapdecomp.mysql.wire import INT64_MAX  # noqa: E402
from pcapdecomp.read.capture import TS_MAX  # noqa: E402


def _affected(path: Path) -> Path:
    """OK packets claiming 2^63 and 2^64 − 1 affected rows between two ordinary queries."""
    cap = Capture()
    conn = Conversation(cap).open().login()
    conn.query(b"SELECT 1")
    conn.query(b"UPDATE t SET a = 1", b"\x00" + write_lenenc_int(2**63) + b"\x00\x02\x00\x00\x00")
    conn.query(b"UPDATE t SET a = 2", b"\x00" + write_lenenc_int(2**64 - 1) + b"\x00\x02\x00\x00\x00")
    conn.query(b"SELECT 2")
    conn.close()
    # a second connection: the report's connection-rate figure fails on a single login (render.figures, not here)
    Conversation(cap, client=("10.0.0.1", 40001)).open().login()
    return cap.write(path)


def test_affected_rows_beyond_int64_is_a_marked_bound(tmp_path):
    """Issue 16: an OK with affected_rows ≥ 2^63 stopped the whole extraction with a traceback, with and without
    the lane. Now the column holds the int64 maximum (a lower bound) and the exchange says out-of-range."""
    capture = _affected(tmp_path / "db.pcap")
    x = assert_same(capture)
    updates = x.exchanges[x.exchanges["sql"].astype(str).str.startswith("UPDATE")]
    assert updates["affected_rows"].tolist() == [INT64_MAX, INT64_MAX]
    assert updates["problems"].astype(str).tolist() == ["out-of-range", "out-of-range"]
    others = x.exchanges[~x.exchanges.index.isin(updates.index)]
    assert len(others) == 4 and (others["affected_rows"] == 0).all()
    assert not others["problems"].astype(str).str.contains("out-of").any()
    assert x.quality()["out_of_range"] == 2
    out = tmp_path / "out"
    proc = cli("analyze", "--db", str(capture), "--out", str(out))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "2 exchanges with a number out of range" in proc.stderr
    assert json.loads((out / "summary.json").read_text())["captures"]["db"]["out_of_range"] == 2


def _pcapng_of(cap: Capture, path: Path, ticks=None) -> Path:
    """The frames of `cap` as a pcapng (microsecond ticks); ticks(i, default) may change frame i's."""
    blocks = [ng_shb(), ng_idb(1)]
    for i, (ts, frame) in enumerate(cap.frames):
        default = ts // 1000
        blocks.append(ng_epb(0, ticks(i, default) if ticks else default, frame))
    path.write_bytes(b"".join(blocks))
    return path


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_pcapng_time_beyond_int64_is_repaired_and_counted(tmp_path, where):
    """Issue 16: pcapng's 64-bit ticks (here 2^64 − 1 µs, year 584,000) gave tracebacks. Such a frame gets its
    neighbour's time and is counted in frames_bad_ts."""
    cap = Capture()
    conn = Conversation(cap).open().login()
    for i in range(5):
        conn.query(b"SELECT %d" % i)
    conn.close()
    n = len(cap.frames)
    broken = {"first": 0, "middle": n // 2, "last": n - 1}[where]
    path = _pcapng_of(cap, tmp_path / "db.pcapng", lambda i, t: (1 << 64) - 1 if i == broken else t)
    x = extract(path)
    q = x.quality()
    assert q["frames_bad_ts"] == 1 and q["exchanges"] == 6  # the login and five queries
    times = [ts for ts, _ in cap.frames]
    assert min(times) <= x.exchanges["req_first_ts"].min().value and x.exchanges["resp_last_ts"].max().value <= max(times)
    proc = cli("exchanges", str(path))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "frames_bad_ts=1" in proc.stdout, proc.stderr


def _retimed(tmp_path: Path, indexes: tuple[int, ...], seconds: int) -> Path:
    """group-stall's DB capture with the records `indexes` set to `seconds` since the epoch (0: the issue's case)."""
    data = bytearray((CAPTURES / "group-stall" / "db.pcap").read_bytes())
    pos, offsets = 24, []
    while pos + 16 <= len(data):
        offsets.append(pos)
        pos += 16 + struct.unpack_from("<I", data, pos + 8)[0]
    for index in indexes:
        struct.pack_into("<II", data, offsets[index], seconds, 0)
    path = tmp_path / "db.pcap"
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("indexes,seconds", [((0,), 0), ((1,), 0), ((500,), 0), ((500,), 4_000_000_000),
                                             ((1098,), 0), ((1098,), 1), ((500, 501), 0), ((600, 601, 602), 0)],
                         ids=["first", "second", "middle", "middle-future", "last", "last-1970", "two", "three"])
def test_a_frame_with_a_wild_time_is_repaired_alike_with_and_without_the_lane(tmp_path, indexes, seconds):
    """Issue 16: one frame at time 0 in the 117 KB group-stall db.pcap used 4.4 GB and wrote a 675 MB report: every
    time span went back to 1970. The frame now gets a neighbour's time (counted); the tables are those of the
    intact capture, time spans included."""
    intact = extract(CAPTURES / "group-stall" / "db.pcap")
    x = assert_same(_retimed(tmp_path, indexes, seconds))
    assert x.stats.frames_bad_ts == len(indexes)
    for column in ("req_first_ts", "resp_last_ts"):
        assert x.exchanges[column].min() >= intact.exchanges[column].min()
        assert x.exchanges[column].max() <= intact.exchanges[column].max()
    assert x.stats.first_ts_ns >= intact.stats.first_ts_ns and x.stats.last_ts_ns <= intact.stats.last_ts_ns


def test_a_wild_time_costs_the_analysis_nothing(tmp_path):
    db = _retimed(tmp_path, (500, 501), 0)
    gs = CAPTURES / "group-stall"
    out = tmp_path / "out"
    proc = cli("analyze", "--app", str(gs / "app.pcap"), "--db", str(db), "--slow-log", str(gs / "slow.log"),
               "--long-query-time", "1", "--thread-pool-size", "2", "--out", str(out))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "2 frames with a broken timestamp" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["captures"]["db"]["frames_bad_ts"] == 2 and summary["match"]["matched"] == 352
    assert (out / "report.html").stat().st_size < 20 << 20
    assert len(pd.read_parquet(out / "groups.parquet")) < 5000


def test_the_lane_looks_ahead_across_its_read_chunks(tmp_path):
    """The lane reads the file in 1 MiB chunks; a record in question needs the next one's time, which may lie in the
    next chunk. Wild times on the records around each chunk boundary of a 1.7 MB capture: same as Python."""
    from pcaptools import rewrite

    big = tmp_path / "big.pcap"
    rewrite(CAPTURES / "oltp-hogs" / "db.pcap", big, repeat=lambda i: True)  # every frame twice: 1.7 MB
    data = bytearray(big.read_bytes())
    offsets, pos = [], 24
    while pos + 16 <= len(data):
        offsets.append(pos)
        pos += 16 + struct.unpack_from("<I", data, pos + 8)[0]
    at = next(i for i, p in enumerate(offsets) if p + 16 + struct.unpack_from("<I", data, p + 8)[0] > 1 << 20)
    for k in (at - 2, at - 1, at, at + 1):
        case = bytearray(data)
        struct.pack_into("<I", case, offsets[k], 0)
        path = tmp_path / f"case{k}.pcap"
        path.write_bytes(bytes(case))
        assert assert_same(path).stats.frames_bad_ts == 1


def test_repaired_times_stay_in_range():
    from pcapdecomp.read.capture import repaired_time

    second = 1_000_000_000
    t = 1_790_000_000 * second
    assert repaired_time(None, t, t + 5, [t + 1, t + 2], False) is None  # ordered
    assert repaired_time(t - 1, t, 0, [t + 1, t + 2], False) == t  # zeroed in the middle
    assert repaired_time(t - 1, t, 0, [0, 0, t + 2], False) == t  # three zeroed in a row
    assert repaired_time(t - 1, t, t + 3 * second, [t + 2], False) == t  # a jump the next frame does not follow
    assert repaired_time(t - 1, t, t + 3 * second, [t + 3 * second + 1], False) is None  # a real jump
    assert repaired_time(t - 1, t, t - 3 * second, [t - 3 * second + 1] * 8, False) is None  # a clock stepped back
    assert repaired_time(None, None, t + 2 * second, [t, t + 1], False) == t  # first frame later than the next two
    assert repaired_time(None, None, t - 30 * second, [t, t + 1], False) is None  # idle after the first frame
    assert repaired_time(None, None, 0, [t, t + 1], False) == t  # first frame decades early
    assert repaired_time(t - 1, t, t + 30 * second, [], True) is None  # idle before the last frame
    assert repaired_time(t - 1, t, 0, [], True) == t  # last frame zeroed
    assert repaired_time(None, None, TS_MAX + 1, [], True) == 0  # alone and out of range
    assert repaired_time(None, t, -5, [], True) == t
    assert repaired_time(None, None, -5, [TS_MAX + 9, t], False) == t


def test_a_compressed_packet_claiming_too_much_is_not_inflated(tmp_path):
    """Issue 16: a 2.3 KB capture with one zstd-compressed packet ran past 400 s and 800 MB. A compressed packet
    that claims more than 1032× its size (deflate's limit) is a counted violation, not 16 MiB of commands."""
    import zstandard
    from craft import packed_commands

    path = packed_commands(tmp_path / "db.pcap", 3_000_000)  # 15 MB of commands in 1.3 KB
    assert path.stat().st_size < 4096
    x = extract(path)
    c = x.connections.iloc[0]
    assert c["violations"] == 1 and "claims 15000000 bytes" in c["violation_notes"]
    assert len(x.exchanges) == 1  # the login; nothing invented from the refused packet
    assert zstandard.ZstdCompressor  # the zstd protocol itself still reads: tests/test_mysql_core.py


def test_the_out_of_order_caps_are_counted_and_warned(tmp_path):
    """5000 one-byte segments wait behind a hole (never filled): the per-direction cap (4096 segments) declares the
    hole a gap, which the capture-quality counts and the warning name."""
    cap = Capture()
    conn = Conversation(cap).open().login()
    conn.query(b"SELECT 1")
    start = conn.cseq
    body = b"\x03SELECT '" + b"x" * 5000 + b"'"
    data = len(body).to_bytes(3, "little") + b"\x00" + body
    for i in range(1, len(data)):  # byte 0 is lost
        conn._frame(True, 0x18, data[i:i + 1], seq=start + i)
    conn.cseq = start + len(data)
    conn.query(b"SELECT 2")
    conn.close()
    # a second connection: the report's connection-rate figure fails on a single login (render.figures, not here)
    Conversation(cap, client=("10.0.0.1", 40001)).open().login()
    path = cap.write(tmp_path / "db.pcap")
    q = extract(path).quality()
    assert q["gaps_forced"] >= 1 and q["gaps"] >= q["gaps_forced"]
    proc = cli("analyze", "--db", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0 and "declared by the out-of-order memory cap" in proc.stderr, proc.stderr
