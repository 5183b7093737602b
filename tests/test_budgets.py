"""The budget of what an input may cost: past it, the input is cut, and the cut is a counted violation ('budget: …'
in the connection's violation notes), never hours and gigabytes. Crafted captures (tests/craft.py)."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import zstandard
from craft import OK, Capture, Conversation, greeting, login, pkt
from lanes import assert_same

from pcapdecomp.mysql.framing import (
    MAX_COMMANDS_PER_COMPRESSED,
    MAX_INFLATION,
    MIN_ROW_BUDGET,
    ROWS_PER_INPUT_BYTE,
    SQL_BUDGET_PREFIX,
)
from pcapdecomp.read import fastlane
from pcapdecomp.read.exchanges import extract

ROOT = Path(__file__).resolve().parent.parent
needs_lane = pytest.mark.skipif(not fastlane.NATIVE, reason="the native lane is not built (no C compiler)")


def pipelined_in_one_compressed_packet(path: Path, n: int) -> Path:
    """zstd-compressed protocol; one compressed packet carrying n distinct COM_QUERYs (within deflate's 1032:1, so
    the ratio check lets it through), as a client that pipelines would send them, only many more."""
    zstd = 1 << 26
    cap = Capture()
    conn = Conversation(cap).open()
    conn.server_sends(pkt(0, greeting(caps=0xF7FE | (0x81BF << 16) | zstd)))
    conn.client_sends(pkt(1, login(caps=0x000FA685 | zstd) + b"\x03"))
    conn.server_sends(pkt(2, b"\x00\x00\x00\x02\x00\x00\x00"))
    inner = b"".join(pkt(0, b"\x03" + f"SELECT {i * 7919 % 1000003}".encode()) for i in range(n))
    packed = zstandard.ZstdCompressor(level=3).compress(inner)
    assert len(inner) <= MAX_INFLATION * len(packed)
    conn.client_sends(len(packed).to_bytes(3, "little") + b"\x00" + len(inner).to_bytes(3, "little") + packed)
    conn.close()
    return cap.write(path)


def test_commands_past_the_budget_of_a_compressed_packet_are_cut_and_counted(tmp_path):
    n = 3 * MAX_COMMANDS_PER_COMPRESSED
    x = extract(pipelined_in_one_compressed_packet(tmp_path / "db.pcap", n))
    c = x.connections.iloc[0]
    queries = x.exchanges[x.exchanges["command"] == "COM_QUERY"]
    assert len(queries) == MAX_COMMANDS_PER_COMPRESSED  # the first ones, read in order
    assert list(queries["sql"].astype(str)[:2]) == ["SELECT 0", "SELECT 7919"]
    assert c["violations"] >= 1 and "budget: a compressed packet carries more than" in c["violation_notes"]


def test_a_pipelined_batch_within_the_budget_is_read_whole(tmp_path):
    x = extract(pipelined_in_one_compressed_packet(tmp_path / "db.pcap", 300))
    assert int((x.exchanges["command"] == "COM_QUERY").sum()) == 300
    assert "budget" not in str(x.connections.iloc[0]["violation_notes"])


class _GzipCapture(Capture):
    """A Capture written as it is made, into a gzip pcap: a capture of hundreds of MiB costs the test no memory."""

    def __init__(self, out) -> None:
        super().__init__()
        self.out = out
        out.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, 1))

    def add(self, frame: bytes, ts: int | None = None, step: int = 1000) -> None:
        if ts is None:
            self.ts += step
            ts = self.ts
        self.out.write(struct.pack("<IIII", ts // 10**9, ts % 10**9, len(frame), len(frame)) + frame)


def distinct_long_statements(path: Path, n: int, size: int, connections: int = 1) -> list[bytes]:
    """n distinct statements of about `size` bytes, round robin over `connections`, each answered by an OK; sent in
    segments of 60000 bytes; a gzip pcap (repeated bytes: 150 of 1 MB fit in 280 KB). Returns the statements in
    the order sent."""
    sent = []
    with gzip.open(path, "wb", compresslevel=6) as out:
        cap = _GzipCapture(out)
        conns = [Conversation(cap, client=("10.0.0.1", 40000 + k)).open().login(conn_id=7 + k)
                 for k in range(connections)]
        for i in range(n):
            sql = b"SELECT '" + b"x" * size + f"' AS n{i}".encode()
            data = pkt(0, b"\x03" + sql)
            conn = conns[i % connections]
            for at in range(0, len(data), 60000):
                conn.client_sends(data[at : at + 60000])
            conn.server_sends(pkt(1, OK))
            sent.append(sql)
        for conn in conns:
            conn.close()
    return sent


def test_statement_text_past_the_input_budget_keeps_a_prefix_and_is_counted_alike_in_both_lanes(tmp_path):
    sent = distinct_long_statements(tmp_path / "db.pcap.gz", 40, 3000, connections=3)
    budget = 10 * 3000
    x = assert_same(tmp_path / "db.pcap.gz", sql_budget=budget)  # the native lane and Python: the same rows
    q = x.exchanges[x.exchanges["command"] == "COM_QUERY"].sort_values("req_first_ts")
    assert len(q) == len(sent)
    whole = [s.decode() for s in sent]
    kept = q["sql"].astype(str).tolist()
    cut = q["problems"].astype(str).str.contains("sql-cut").tolist()
    # statements are kept whole in the order sent while the budget lasts; then each keeps its first bytes only
    n_whole = budget // len(sent[0])
    assert kept[:n_whole] == whole[:n_whole] and not any(cut[:n_whole])
    assert all(cut[n_whole:])
    assert kept[n_whole:] == [w[:SQL_BUDGET_PREFIX] for w in whole[n_whole:]]
    # every cut a violation of its connection, told as a budget
    c = x.connections
    assert int(c["violations"].sum()) == len(sent) - n_whole
    assert all("budget: statement text" in str(v) for v in c["violation_notes"])


def test_without_a_cut_the_budget_changes_nothing(tmp_path):
    sent = distinct_long_statements(tmp_path / "db.pcap.gz", 12, 3000, connections=2)
    x = assert_same(tmp_path / "db.pcap.gz", sql_budget=sum(map(len, sent)))
    assert x.exchanges["sql"].dropna().astype(str).tolist()[-12:] == [s.decode() for s in sent]
    assert int(x.connections["violations"].sum()) == 0


# The child's own peak is VmHWM, the high-water mark of its memory map since exec: getrusage's ru_maxrss keeps the
# peak of the process image before exec, which for a child spawned by a big test process (a worker that ran the
# whole analyses first) is the parent's size, not the child's.
_PEAK = """
import sys
from pcapdecomp.read.exchanges import extract
x = extract(sys.argv[1], sql_budget=int(sys.argv[2]))
cut = int(x.exchanges["problems"].astype(str).str.contains("sql-cut").sum())
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(len(x.exchanges), cut, int(x.connections["violations"].sum()), peak)
"""


def test_the_budget_bounds_the_memory_of_distinct_long_statements(tmp_path):
    """150 distinct statements of 1 MB (a 280 KB gzip capture) cost 1.2 GB read whole; with an 8 MiB budget the
    peak stays far below (measured in a child process: its own maximum resident set)."""
    path = tmp_path / "db.pcap.gz"
    n = 150
    distinct_long_statements(path, n, 1_000_000)
    budget = 8 << 20
    done = subprocess.run([sys.executable, "-c", _PEAK, str(path), str(budget)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows, cut, violations, peak_kb = map(int, done.stdout.split())
    assert rows == n + 1  # the login and every statement
    assert cut == violations == n - budget // 1_000_010
    assert peak_kb < 600 * 1024  # 150 MB of text read whole would take over 1 GB


def many_short_exchanges(path: Path, n: int) -> Path:
    """n distinct short COM_QUERYs, each answered by an OK, on one connection: the native lane's common path."""
    with gzip.open(path, "wb", compresslevel=1) as out:
        conn = Conversation(_GzipCapture(out)).open().login()
        pad = b"x" * 150
        for i in range(n):
            conn.query(b"SELECT %d /* %s */" % (i, pad))
        conn.close()
    return path


_SHORT_OF_MEMORY = """
import os, resource, sys
from pcapdecomp import cli
from pcapdecomp.read import exchanges, fastlane  # imported before the limit
import pandas, pyarrow
size = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:")) * 1024
limit = size + (int(sys.argv[1]) << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
sys.argv = ["pcapdecomp", "exchanges", sys.argv[2]]
cli.main()
"""


@needs_lane
def test_the_native_lane_stops_cleanly_when_memory_runs_out(tmp_path):
    """An address-space limit a few tens of MB above what the imports take: the allocation that fails is the lane's
    (its column buffers and texts) or another's; every run ends with one line and exit 70, never SystemError (an
    exception set while the lane went on) or a traceback."""
    path = many_short_exchanges(tmp_path / "db.pcap.gz", 50_000)
    places = []
    for margin in (16, 32, 40):
        done = subprocess.run([sys.executable, "-c", _SHORT_OF_MEMORY, str(margin), str(path)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 70 and len(lines) == 1, done.stderr[-2000:]
        assert lines[0].startswith("pcapdecomp: internal error: MemoryError"), lines[0]
        assert "SystemError" not in done.stderr and "Traceback" not in done.stderr
        places.append(lines[0])
    assert any(", in read.fastlane." in line for line in places), places  # the lane's own allocations failed


def test_exchanges_past_the_row_budget_are_cut_alike_in_both_lanes(tmp_path):
    path = many_short_exchanges(tmp_path / "db.pcap.gz", 3000)
    x = assert_same(path, row_budget=1000)  # the native lane and Python: the same rows, the same counts
    assert len(x.exchanges) == 1000  # the login and the first 999 statements, in the order sent
    q = x.exchanges[x.exchanges["command"] == "COM_QUERY"]
    assert q["sql"].astype(str).str.startswith("SELECT ").all()
    assert sorted(int(s.split()[1]) for s in q["sql"].astype(str)) == list(range(999))
    c = x.connections.iloc[0]
    # every request past the budget is counted (its answer then finds no request: counted too, as it is read)
    assert c["violations"] >= 3001 - 1000 and "budget: exchanges past the input's 1000" in c["violation_notes"]


def compressed_pings(path: Path, packets: int) -> Path:
    """zlib-compressed protocol; `packets` compressed packets of 4096 COM_PINGs each (within the budget of one
    compressed packet, and within deflate's 1032:1), never answered: each one an exchange."""
    cap = Capture()
    conn = Conversation(cap).open()
    conn.server_sends(pkt(0, greeting(caps=0xF7FE | (0x81BF << 16) | 0x20)))
    conn.client_sends(pkt(1, login(caps=0x000FA685 | 0x20)))
    conn.server_sends(pkt(2, b"\x00\x00\x00\x02\x00\x00\x00"))
    inner = pkt(0, b"\x0e") * MAX_COMMANDS_PER_COMPRESSED
    packed = zlib.compress(inner, 9)
    assert len(inner) <= MAX_INFLATION * len(packed)
    one = len(packed).to_bytes(3, "little") + b"\x00" + len(inner).to_bytes(3, "little") + packed
    for _ in range(packets):
        conn.client_sends(one)
    conn.close()
    return cap.write(path)


def test_small_compressed_packets_cannot_give_more_exchanges_than_the_rows_per_byte_budget(tmp_path):
    """Each compressed packet within its own budget, but together a few KB giving 80 thousand exchanges: the input's
    row budget (ROWS_PER_INPUT_BYTE per byte, at least MIN_ROW_BUDGET) writes that many and counts the rest."""
    path = compressed_pings(tmp_path / "db.pcap", 20)
    size = path.stat().st_size
    sent = 20 * MAX_COMMANDS_PER_COMPRESSED
    budget = max(MIN_ROW_BUDGET, ROWS_PER_INPUT_BYTE * size)
    assert sent > budget  # the crafted input claims more than its size allows
    x = extract(path)
    assert len(x.exchanges) == budget
    assert (x.exchanges["command"] == "COM_PING").sum() == budget - 1  # after the login
    c = x.connections.iloc[0]
    assert c["violations"] == sent + 1 - budget and "budget: exchanges past the input's" in c["violation_notes"]
