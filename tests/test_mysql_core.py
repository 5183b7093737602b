"""The sans-IO MySQL core (pcapdecomp.mysql): real connections fed whole, byte by byte and in random splits; wire
format round trips; and the corners no recording has, built from recorded bytes where possible."""

from __future__ import annotations

import dataclasses
import random
import struct
import zlib

import pytest
import zstandard
from craft import pkt, write_lenenc_int
from feeding import Feeder, by_label, chunks_of, chunks_of_cached, established, handshake, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streams import recorded

from pcapdecomp.mysql import detect
from pcapdecomp.mysql.connection import CLIENT, SERVER, MySQLConnection
from pcapdecomp.mysql.framing import CompressedDeframer, PacketFramer
from pcapdecomp.mysql.wire import (
    CLIENT_COMPRESS,
    CLIENT_ZSTD_COMPRESSION,
    MAX_PACKET,
    WireError,
    read_lenenc_bytes,
    read_lenenc_int,
)
from pcapdecomp.read.tcp import Chunk

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def split(events, cut) -> list:
    """Re-cut every chunk where `cut(chunk)` says; each piece keeps its chunk's time and frame (the capture saw
    those bytes at that moment), so the exchanges must be equal field for field."""
    out = []
    for direction, ev in events:
        points = sorted({p for p in cut(ev) if 0 < p < len(ev.data)})
        start = 0
        for end in points + [len(ev.data)]:
            out.append((direction, Chunk(ev.offset + start, ev.data[start:end], ev.ts_ns, ev.frame)))
            start = end
    return out


ALL_CONNECTIONS = [(name, i) for name in ("features", "maxthreads") for i in range(len(recorded(name)))]


@pytest.mark.parametrize("name,index", ALL_CONNECTIONS)
def test_byte_by_byte_equals_whole(name, index):
    key, events = chunks_of(name)[index]
    whole, conn = run(events)
    assert (whole or conn.tls) and conn.counters.violations == 0 and sum(conn.counters.unparsed_bytes) == 0
    single, conn1 = run(split(events, lambda ev: range(1, len(ev.data))))
    assert single == whole
    assert conn1.counters.parsed_bytes == conn.counters.parsed_bytes
    assert conn1.counters.tls_bytes == conn.counters.tls_bytes


@given(seed=st.integers(0, 2**32 - 1), which=st.integers(0, 10**6))
@SETTINGS
def test_random_splits_equal_whole(seed, which):
    rng = random.Random(seed)
    name = "features" if which % 3 else "oltp-hogs"
    connections = chunks_of_cached(name)
    key, events = connections[which % len(connections)]
    whole, _ = run(events)
    got, conn = run(split(events, lambda ev: [rng.randrange(len(ev.data) + 1) for _ in range(rng.randrange(4))]))
    assert got == whole and conn.counters.violations == 0


# ---- wire format -----------------------------------------------------------------------------------------------------------
@given(st.integers(0, 2**64 - 1), st.binary(max_size=8))
def test_lenenc_int_round_trip(value, trailing):
    raw = write_lenenc_int(value)
    assert read_lenenc_int(raw + trailing, 0) == (value, len(raw))
    # the shortest form: 1 byte below 251, then 3, 4 and 9 bytes
    assert len(raw) == (1 if value < 251 else 3 if value < 1 << 16 else 4 if value < 1 << 24 else 9)


@given(st.binary(max_size=70000), st.binary(max_size=4))
@settings(max_examples=60, deadline=None)
def test_lenenc_string_round_trip_and_truncation(body, trailing):
    raw = write_lenenc_int(len(body)) + body
    assert read_lenenc_bytes(raw + trailing, 0) == (body, len(raw))
    if body:
        with pytest.raises(WireError):
            read_lenenc_bytes(raw[:-1], 0)


def test_lenenc_null_and_reserved_prefixes():
    assert read_lenenc_int(b"\xfb", 0) == (None, 1)
    assert read_lenenc_bytes(b"\xfbrest", 0) == (None, 1)
    for bad in (b"\xff", b"\xfc\x01", b"\xfd\x01\x02", b"\xfe" + b"\x00" * 7, b""):
        with pytest.raises(WireError):
            read_lenenc_int(bad, 0)


# ---- crafted corners ---------------------------------------------------------------------------------------------------------
def ok(seq: int, status: int = 0x0002, affected: int = 0) -> bytes:
    return pkt(seq, b"\x00" + write_lenenc_int(affected) + b"\x00" + struct.pack("<HH", status, 0))


def eof(seq: int, status: int = 0x0002) -> bytes:
    return pkt(seq, b"\xfe" + struct.pack("<HH", 0, status))


def column(seq: int, name: bytes) -> bytes:
    def s(x):
        return write_lenenc_int(len(x)) + x

    return pkt(seq, s(b"def") + s(b"") + s(b"") + s(b"") + s(name) + s(b"") + b"\x0c" + struct.pack("<HIBHB", 33, 64, 253, 0, 0) + b"\x00\x00")


def test_16mib_continuation_in_a_request():
    """A COM_QUERY of 16 MiB - 1 + 50 bytes: two packets (0xFFFFFF, then 50 with seq 1); the answer has seq 2."""
    conn, f = established(handshake())
    sql = b"SELECT '" + b"x" * (MAX_PACKET + 50 - 1 - 9) + b"'"
    payload = b"\x03" + sql
    assert len(payload) == MAX_PACKET + 50
    wire = pkt(0, payload[:MAX_PACKET]) + pkt(1, payload[MAX_PACKET:])
    f.send(CLIENT, wire, step=1 << 20)
    f.send(SERVER, ok(2))
    (ex,) = f.take()
    assert ex.command == "COM_QUERY" and ex.result == "ok" and "sequence" not in ex.problems
    assert ex.bytes_req == len(wire) and ex.sql_cut and ex.sql.startswith("SELECT 'xxx")
    assert len(ex.sql) == (1 << 20) - 1  # max_sql_bytes keeps the first MiB of the payload, command byte included


def test_16mib_continuation_in_a_response_row_starting_with_0xfe():
    """A row longer than 16 MiB starts with 0xFE (an 8-byte length) and spans two packets: not an EOF."""
    conn, f = established(handshake())
    f.send(CLIENT, pkt(0, b"\x03SELECT big"))
    value_len = MAX_PACKET + 100
    row = b"\xfe" + value_len.to_bytes(8, "little") + b"r" * value_len
    resp = pkt(1, b"\x01") + column(2, b"big") + eof(3)
    resp += pkt(4, row[:MAX_PACKET]) + pkt(5, row[MAX_PACKET:]) + pkt(6, b"\x01a") + eof(7, 0x0002 | 0x0800)
    f.send(SERVER, resp, step=1 << 20)
    (ex,) = f.take()
    assert (ex.result, ex.rows, ex.result_sets) == ("resultset", 2, 1)
    assert ex.bytes_resp == len(resp) and ex.server_flag_slow and not ex.problems


def test_zstd_compressed_protocol():
    """MariaDB cannot produce zstd, so the recorded zlib connection is re-encoded: each compressed packet's inflated
    bytes are compressed again with zstd (same inner packets, same sequence ids, same segment timing), and the
    capability bits CLIENT_ZSTD_COMPRESSION are set in the greeting and login. Same exchanges, compressed=zstd."""
    key, events, zlib_exchanges, zlib_conn = by_label("REPEAT('compressible '")
    assert zlib_conn.compression == "zlib"
    recoded = []
    offsets = [0, 0]
    seen = [0, 0]
    for direction, ev in events:
        data = ev.data
        seen[direction] += 1
        compressed = seen[direction] > (1 if direction == CLIENT else 2)  # after greeting/login/OK
        if not compressed and seen[direction] == 1:  # greeting (server) and login (client): flag zstd
            # greeting: version NUL, conn id 4, scramble 8, filler 1, caps low 2, charset 1, status 2, caps high 2
            caps_at = data.index(b"\x00", 5) + 20 if direction == SERVER else 4 + 3  # login: caps are bytes 4..7
            data = bytearray(data)
            data[caps_at] |= CLIENT_ZSTD_COMPRESSION >> 24  # bit 26 lives in the 4th capability byte
            data = bytes(data)
        if compressed:
            out = b""
            deframer = CompressedDeframer()
            raw = data
            packets = deframer.feed(raw, 0, 0, 0)
            assert packets and not deframer._buf  # segments hold whole compressed packets in this recording
            pos = 0
            for cp in packets:
                seq = raw[pos + 3]
                pos += 7 + (raw[pos] | raw[pos + 1] << 8 | raw[pos + 2] << 16)
                body = zstandard.ZstdCompressor(level=3).compress(cp.inner)
                out += len(body).to_bytes(3, "little") + bytes([seq]) + len(cp.inner).to_bytes(3, "little") + body
            data = out
        recoded.append((direction, Chunk(offsets[direction], data, ev.ts_ns, ev.frame)))
        offsets[direction] += len(data)
    exchanges, conn = run(recoded)
    assert conn.compression == "zstd" and conn.login.capabilities & CLIENT_ZSTD_COMPRESSION
    assert conn.greeting.capabilities & CLIENT_COMPRESS
    assert conn.counters.violations == 0
    wire_fields = {"bytes_req", "bytes_resp", "req_offset", "resp_offset", "resp_end_offset"}

    def semantic(ex):
        return {k: v for k, v in dataclasses.asdict(ex).items() if k not in wire_fields}

    assert [semantic(e) for e in exchanges] == [semantic(e) for e in zlib_exchanges]
    big = next(e for e in exchanges if "REPEAT" in (e.sql or ""))
    assert big.result == "resultset" and big.rows == 1
    # and byte by byte
    assert run(split(recoded, lambda ev: range(1, len(ev.data))))[0] == exchanges


def test_pipelined_requests_give_the_same_exchanges():
    """Two commands sent before the first answer (recorded bytes, reordered as a pipelining client sends them):
    identical exchanges, timestamps included (they come from the chunks, which keep theirs)."""
    key, events, exchanges, _ = by_label("SELECT CURRENT_USER(), DATABASE()")
    # the last three client commands and their answers: ..., COM_X, SELECT CURRENT_USER(), COM_QUIT
    command_chunks = [i for i, (d, ev) in enumerate(events) if d == CLIENT]
    i, j = command_chunks[-3], command_chunks[-2]
    assert events[i + 1][0] == SERVER and events[j + 1][0] == SERVER
    pipelined = events[: i + 1] + [events[j]] + events[i + 1 : j] + events[j + 1 :]
    got, conn = run(pipelined)
    assert got == exchanges and conn.counters.violations == 0
    # all three at once, in one segment
    merged_data = events[i][1].data + events[j][1].data
    together = events[:i] + [(CLIENT, Chunk(events[i][1].offset, merged_data, events[i][1].ts_ns, events[i][1].frame))]
    together += events[i + 1 : j] + events[j + 1 :]
    got, _ = run(together)
    assert [(e.command, e.sql, e.result, e.rows) for e in got] == [(e.command, e.sql, e.result, e.rows) for e in exchanges]


def _big_result(first_seq: int, rows: int) -> bytes:
    out = pkt(first_seq, b"\x02") + column(first_seq + 1, b"id") + column(first_seq + 2, b"name") + eof(first_seq + 3)
    seq = first_seq + 4
    for r in range(rows):
        name = f"row number {r} " .encode() * 3
        out += pkt(seq, write_lenenc_int(len(str(r))) + str(r).encode() + write_lenenc_int(len(name)) + name)
        seq += 1
    return out + eof(seq)


def test_midstream_start_inside_a_large_result_set():
    """The capture starts in the middle of a 2000-row result: those bytes are skipped (counted), no statement is
    invented from them, and parsing starts at the next command (a recorded COM_QUERY)."""
    key, events, exchanges, _ = by_label("SELEC 1 FROM nowhere")
    query = next(ev.data for d, ev in events if d == CLIENT and ev.data[4:5] == b"\x03" and b"SELEC 1" in ev.data)
    answer = next(events[k + 1][1].data for k, (d, ev) in enumerate(events) if d == CLIENT and ev.data == query)
    big = _big_result(1, 2000)
    conn = MySQLConnection(midstream=True)
    f = Feeder(conn)
    cut = len(big) // 3 + 7  # not at a packet boundary
    f.send(SERVER, big[cut:], step=1448)
    f.send(CLIENT, query)
    f.send(SERVER, answer)
    conn.end()
    (ex,) = f.take()
    assert ex.command == "COM_QUERY" and ex.sql == "SELEC 1 FROM nowhere"
    assert ex.result == "error" and ex.error_code == 1064 and ex.error_state == "42000"
    assert ex.problems == ("midstream",)
    assert conn.counters.unparsed_bytes[SERVER] == len(big) - cut and conn.counters.violations == 0


def test_midstream_start_inside_a_request_then_resync():
    """The capture starts inside a large COM_QUERY and its result: nothing is reported until the next command."""
    conn = MySQLConnection(midstream=True)
    f = Feeder(conn)
    sql = b"INSERT INTO t VALUES " + b",".join(b"(%d,'SELECT 1')" % i for i in range(2000))
    request = pkt(0, b"\x03" + sql)
    f.send(CLIENT, request[5000:], step=1448)
    f.send(SERVER, ok(1, affected=2000))
    f.send(CLIENT, pkt(0, b"\x03SELECT 2"))
    f.send(SERVER, _big_result(1, 3))
    conn.end()
    (ex,) = f.take()
    assert (ex.sql, ex.result, ex.rows) == ("SELECT 2", "resultset", 3)


def test_gap_in_the_middle_of_a_response():
    """Bytes lost inside a result set: that exchange is marked 'gap' with no result; the next one is exact."""
    conn, f = established(handshake())
    f.send(CLIENT, pkt(0, b"\x03SELECT * FROM big"))
    big = _big_result(1, 500)
    f.send(SERVER, big[:4000], step=1448)
    f.gap(SERVER, 3000)
    f.send(SERVER, big[7000:], step=1448)  # the rest of the result, misaligned after the gap
    f.send(CLIENT, pkt(0, b"\x03SELECT 2"))
    f.send(SERVER, _big_result(1, 3))
    first, second = f.take()
    assert first.sql == "SELECT * FROM big" and "gap" in first.problems and first.result is None
    assert (second.sql, second.result, second.rows, second.problems) == ("SELECT 2", "resultset", 3, ())
    assert conn.counters.gaps == 1 and conn.counters.gap_bytes[SERVER] == 3000
    assert conn.counters.unparsed_bytes[SERVER] == len(big) - 7000


def test_gap_in_a_request_keeps_the_captured_part():
    conn, f = established(handshake())
    request = pkt(0, b"\x03SELECT '" + b"y" * 5000 + b"'")
    f.send(CLIENT, request[:1448])
    f.gap(CLIENT, 1448)
    f.send(CLIENT, request[2896:])
    f.send(SERVER, _big_result(1, 1))
    f.send(CLIENT, pkt(0, b"\x0e"))
    f.send(SERVER, ok(1))
    conn.end()
    cut, ping = f.take()
    assert cut.command == "COM_QUERY" and cut.sql_cut and cut.sql.startswith("SELECT 'yyy") and "gap" in cut.problems
    assert (ping.command, ping.result, ping.problems) == ("COM_PING", "ok", ())


def test_server_packet_with_a_wrong_sequence_id():
    conn, f = established(handshake())
    f.send(CLIENT, pkt(0, b"\x03DO 1"))
    f.send(SERVER, ok(5))  # should be 1
    f.send(CLIENT, pkt(0, b"\x0e"))
    f.send(SERVER, ok(1))
    first, second = f.take()
    assert first.result == "ok" and "sequence" in first.problems
    assert second.result == "ok" and second.problems == ()


def test_hostile_length_field_costs_no_memory():
    """A 3-byte length of 0xFFFFFF with little data behind it: the framer keeps at most `keep` bytes, and a 40 MB
    packet chain fed in 64 KiB pieces is counted, not stored."""
    framer = PacketFramer(keep=4096)
    out = framer.feed(b"\xff\xff\xff\x00\x03SELECT", 1, 1, 0)
    assert out == [] and not framer.idle
    partial = framer.partial()
    assert partial.length == 7 and partial.payload == b"\x03SELECT"
    framer = PacketFramer(keep=4096)
    total = 0
    chain = [(MAX_PACKET, 0), (MAX_PACKET, 1), (12345, 2)]
    packets = []
    for length, seq in chain:
        framer_input = length.to_bytes(3, "little") + bytes([seq])
        packets += framer.feed(framer_input, 1, 1, total)
        total += 4
        block = b"z" * 65536
        left = length
        while left:
            piece = block[: min(left, len(block))]
            packets += framer.feed(piece, 2, 2, total)
            total += len(piece)
            left -= len(piece)
            assert sum(len(p) for p in framer._parts) <= 4096
    (p,) = packets
    assert p.length == 2 * MAX_PACKET + 12345 and len(p.payload) == 4096 and p.cut
    assert (p.seq, p.last_seq, p.wire_bytes, p.end_offset) == (0, 2, total, total)
    # and in the connection: a hostile request is reported, cut, with the rest of the stream still read
    conn, f = established(handshake())
    f.send(CLIENT, b"\xff\xff\xff\x00\x03SELECT 1")
    conn.end()
    (ex,) = f.take()
    assert ex.command == "COM_QUERY" and ex.sql == "SELECT 1" and ex.sql_cut
    assert set(ex.problems) == {"incomplete", "unanswered", "sql-cut"} and ex.result is None


@given(st.lists(st.tuples(st.sampled_from([CLIENT, SERVER]), st.binary(max_size=300)), max_size=30),
       st.booleans(), st.sampled_from(["none", "handshake", "gaps"]))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_bytes_never_raise_and_are_accounted(chunks, midstream, prefix):
    conn = MySQLConnection(midstream=midstream)
    f = Feeder(conn)
    fed = [0, 0]
    if prefix == "handshake" and not midstream:
        for direction, ev in handshake()[:3]:
            f.send(direction, ev.data)
            fed[direction] += len(ev.data)
    for k, (direction, data) in enumerate(chunks):
        if prefix == "gaps" and k % 4 == 3:
            f.gap(direction, len(data) + 1)
            continue
        f.send(direction, data)
        fed[direction] += len(data)
    conn.end()
    exchanges = conn.take()
    c = conn.counters
    for d in (CLIENT, SERVER):
        assert c.parsed_bytes[d] + c.unparsed_bytes[d] <= fed[d] + (0 if c.tls_bytes == 0 else fed[d])
    assert all(ex.seq == i for i, ex in enumerate(exchanges))
    assert c.violations >= len(c.violation_notes)


def test_unknown_command_and_no_command_byte_are_kept_not_fatal():
    conn, f = established(handshake())
    f.send(CLIENT, pkt(0, b"\x42\x01\x02"))  # unknown: the response is read as a stream until the next command
    f.send(SERVER, ok(1))
    f.send(CLIENT, pkt(0, b""))  # empty command packet: a violation
    f.send(CLIENT, pkt(0, b"\x0e"))
    f.send(SERVER, ok(1))
    conn.end()
    exchanges = f.take()
    assert exchanges[0].command == "COM_0x42"
    assert exchanges[-1].command == "COM_PING" and exchanges[-1].result == "ok"
    assert conn.counters.violations == 1


def test_detect_refuses_misaligned_text():
    """Resynchronisation accepts only an unambiguous command header: bytes from inside a row or a statement
    do not qualify, a real command does."""
    assert detect.plausible_command(pkt(0, b"\x03SELECT 1"))
    assert detect.plausible_command(pkt(0, b"\x0e"))
    assert not detect.plausible_command(pkt(1, b"\x03SELECT 1"))  # seq 1: a continuation or a response
    assert not detect.plausible_command(pkt(0, b"\x0e\x00"))  # PING carries nothing
    assert not detect.plausible_command(b"row number 12 row number 12 ")
    assert not detect.plausible_command(pkt(0, b"\x03\x01\x02\x03\x04\x05\x06"))
    compressed = zlib.compress(pkt(0, b"\x03SELECT 'hello hello hello hello hello'"))
    inner_len = len(pkt(0, b"\x03SELECT 'hello hello hello hello hello'"))
    framed = len(compressed).to_bytes(3, "little") + b"\x00" + inner_len.to_bytes(3, "little") + compressed
    assert detect.compressed_command(framed) == "zlib"


@pytest.mark.parametrize("step", [None, 1, 7], ids=["whole", "byte-by-byte", "7-byte-pieces"])
def test_mariadb_cached_metadata_sends_no_column_definitions(step):
    """MariaDB (MARIADB_CLIENT_CACHE_METADATA) follows the column count with "metadata follows = 0" and then sends
    no definitions, as sysbench's prepared statements receive: 3 columns, then EOF and the rows. The rows must
    not be taken for definitions (they were: 2 of these 4 rows went missing), whether the response arrives whole
    (the fast path) or in pieces (packet by packet)."""
    conn, f = established(handshake())
    f.send(CLIENT, pkt(0, b"\x03SELECT a, b, c FROM t"))
    rows = b"".join(pkt(3 + i, bytes([1, 65 + i, 1, 66, 1, 67])) for i in range(4))  # text rows: 3 values each
    resp = pkt(1, b"\x03\x00") + eof(2) + rows + eof(7)
    f.send(SERVER, resp, step=step)
    (ex,) = f.take()
    assert (ex.result, ex.rows, ex.result_sets) == ("resultset", 4, 1), ex
    assert ex.bytes_resp == len(resp) and not ex.problems
    # metadata follows = 1: the definitions are there, as without the capability
    f.send(CLIENT, pkt(0, b"\x03SELECT a FROM t"))
    resp = pkt(1, b"\x01\x01") + column(2, b"a") + eof(3) + pkt(4, b"\x01x") + eof(5)
    f.send(SERVER, resp, step=step)
    (ex,) = f.take()
    assert (ex.result, ex.rows) == ("resultset", 1) and not ex.problems
