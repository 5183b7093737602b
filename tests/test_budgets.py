"""The budget of what an input may cost: past it, the input is cut, and the cut is a counted violation ('budget: …'
in the connection's violation notes), never hours and gigabytes. Crafted captures (tests/craft.py)."""

from __future__ import annotations

from pathlib import Path

import zstandard
from craft import Capture, Conversation, greeting, login, pkt

from pcapdecomp.exchanges import extract
from pcapdecomp.mysql.framing import MAX_COMMANDS_PER_COMPRESSED, MAX_INFLATION


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
