"""Hand-built captures for hostile-input tests: Ethernet/IPv4/TCP frames written as a classic pcap (ns), fast
enough for hundreds of thousands of frames (scapy builds one frame in ~100 µs; this in ~2 µs).

A `Conversation` is one TCP connection between a client and a MySQL server; its methods append frames with
increasing timestamps and correct sequence/acknowledgement numbers. The MySQL bytes of the handshake are a
protocol-10 greeting, a HandshakeResponse41 and an OK, as a MariaDB server and client exchange them.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import zstandard

SYN, FIN, RST, PSH, ACK = 0x02, 0x01, 0x04, 0x08, 0x10
T0 = 1_790_000_000 * 10**9  # 2026-09-21, ns

_ETH = b"\x02\x00\x00\x00\x00\x01\x02\x00\x00\x00\x00\x02\x08\x00"


def write_lenenc_int(value: int) -> bytes:
    """A length-encoded integer, the inverse of wire.read_lenenc_int."""
    if value < 0xFB:
        return bytes([value])
    if value < 1 << 16:
        return b"\xfc" + value.to_bytes(2, "little")
    if value < 1 << 24:
        return b"\xfd" + value.to_bytes(3, "little")
    return b"\xfe" + value.to_bytes(8, "little")


def pkt(seq: int, payload: bytes) -> bytes:
    """A MySQL packet: 3-byte length, sequence id, payload."""
    return len(payload).to_bytes(3, "little") + bytes([seq & 0xFF]) + payload


def greeting(conn_id: int = 7, caps: int = 0xF7FE | (0x81BF << 16)) -> bytes:
    """A protocol-10 server greeting (MariaDB's capability bits; CLIENT_DEPRECATE_EOF off)."""
    scramble = b"abcdefgh"
    return (b"\x0a" + b"10.11.6-MariaDB\x00" + struct.pack("<I", conn_id) + scramble + b"\x00"
            + struct.pack("<H", caps & 0xFFFF) + b"\x21" + struct.pack("<H", 0x0002) + struct.pack("<H", caps >> 16)
            + b"\x15" + b"\x00" * 10 + b"ijklmnopqrst\x00" + b"mysql_native_password\x00")


def login(user: bytes = b"app", caps: int = 0x000FA685) -> bytes:
    """HandshakeResponse41 (CLIENT_PROTOCOL_41 | SECURE_CONNECTION | PLUGIN_AUTH, no CLIENT_DEPRECATE_EOF)."""
    return (struct.pack("<IIB", caps, 1 << 24, 0x21) + b"\x00" * 23 + user + b"\x00" + b"\x14" + b"p" * 20
            + b"mysql_native_password\x00")


OK = b"\x00\x00\x00\x02\x00\x00\x00"


def ip_tcp(src: str, sport: int, dst: str, dport: int, seq: int, ack: int, flags: int, payload: bytes) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags, 65535, 0, 0)
    total = 20 + len(tcp) + len(payload)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, 6, 0, socket.inet_aton(src),
                     socket.inet_aton(dst))
    return _ETH + ip + tcp + payload


class Capture:
    """Frames (ts_ns, bytes) in capture order, written as a nanosecond pcap."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, bytes]] = []
        self.ts = T0

    def add(self, frame: bytes, ts: int | None = None, step: int = 1000) -> None:
        if ts is None:
            self.ts += step
            ts = self.ts
        self.frames.append((ts, frame))

    def pcap_bytes(self) -> bytes:
        out = [struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, 1)]
        for ts, frame in self.frames:
            out.append(struct.pack("<IIII", ts // 10**9, ts % 10**9, len(frame), len(frame)))
            out.append(frame)
        return b"".join(out)

    def write(self, path: Path) -> Path:
        path.write_bytes(self.pcap_bytes())
        return path


class Conversation:
    """One TCP connection inside a Capture; client and server sequence numbers tracked."""

    def __init__(self, cap: Capture, client: tuple[str, int] = ("10.0.0.1", 40000),
                 server: tuple[str, int] = ("10.0.0.2", 3306), isn: tuple[int, int] = (1000, 5000)):
        self.cap, self.client, self.server = cap, client, server
        self.cseq, self.sseq = isn

    def _frame(self, from_client: bool, flags: int, payload: bytes = b"", seq: int | None = None,
               ack: int | None = None, ts: int | None = None) -> None:
        (src, sport), (dst, dport) = (self.client, self.server) if from_client else (self.server, self.client)
        own = self.cseq if from_client else self.sseq
        other = self.sseq if from_client else self.cseq
        self.cap.add(ip_tcp(src, sport, dst, dport, own if seq is None else seq, other if ack is None else ack,
                            flags, payload), ts)

    def open(self) -> Conversation:
        self._frame(True, SYN, seq=self.cseq - 1, ack=0)
        self._frame(False, SYN | ACK, seq=self.sseq - 1)
        self._frame(True, ACK)
        return self

    def client_sends(self, data: bytes, ts: int | None = None) -> None:
        self._frame(True, PSH | ACK, data, ts=ts)
        self.cseq += len(data)

    def server_sends(self, data: bytes, ts: int | None = None) -> None:
        self._frame(False, PSH | ACK, data, ts=ts)
        self.sseq += len(data)

    def client_ack(self, ts: int | None = None) -> None:
        self._frame(True, ACK, ts=ts)

    def login(self, conn_id: int = 7) -> Conversation:
        self.server_sends(pkt(0, greeting(conn_id)))
        self.client_sends(pkt(1, login()))
        self.server_sends(pkt(2, OK))
        return self

    def query(self, sql: bytes, answer: bytes | None = OK) -> None:
        self.client_sends(pkt(0, b"\x03" + sql))
        if answer is not None:
            self.server_sends(pkt(1, answer))

    def close(self) -> None:
        self._frame(True, FIN | ACK)
        self.cseq += 1
        self._frame(False, FIN | ACK)
        self.sseq += 1
        self._frame(True, ACK)


def packed_commands(path: Path, n: int) -> Path:
    """zstd-compressed protocol; one compressed packet carrying n empty COM_QUERYs (the 2 KB capture of issue 16
    that ran for 400 s had one such packet)."""
    zstd = 1 << 26
    cap = Capture()
    conn = Conversation(cap).open()
    conn.server_sends(pkt(0, greeting(caps=0xF7FE | (0x81BF << 16) | zstd)))
    conn.client_sends(pkt(1, login(caps=0x000FA685 | zstd) + b"\x03"))
    conn.server_sends(pkt(2, b"\x00\x00\x00\x02\x00\x00\x00"))
    inner = pkt(0, b"\x03") * n
    packed = zstandard.ZstdCompressor(level=3).compress(inner)
    conn.client_sends(len(packed).to_bytes(3, "little") + b"\x00" + len(inner).to_bytes(3, "little") + packed)
    conn.close()
    return cap.write(path)


def stall(path: Path, culprit_sql: bytes, victims: list[int], victim_sql: bytes = b"SELECT 1",
          seconds: float = 3.7) -> Path:
    """A DB capture of one thread-group stall: connection 8 (10.0.0.8) runs `culprit_sql` for `seconds`; each
    victim connection (10.0.0.9) sends `victim_sql` just after it and is answered just after it ends."""
    cap = Capture()
    culprit = Conversation(cap, client=("10.0.0.8", 40008)).open().login(8)
    others = [Conversation(cap, client=("10.0.0.9", 41000 + v)).open().login(v) for v in victims]
    start = T0 + 10**8
    culprit.client_sends(pkt(0, b"\x03" + culprit_sql), ts=start)
    for i, conn in enumerate(others):
        conn.client_sends(pkt(0, b"\x03" + victim_sql), ts=start + (i + 1) * 10**6)
    end = start + int(seconds * 10**9)
    culprit.server_sends(pkt(1, OK), ts=end)
    for i, conn in enumerate(others):
        conn.server_sends(pkt(1, OK), ts=end + (i + 1) * 10**6)
    return cap.write(path)
