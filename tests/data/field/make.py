"""Rebuild the small captures of this folder from the real recordings they were cut from (see README.md).

    python3 tests/data/field/make.py [--corpus /work/shared/corpus]

Deterministic: the same sources give the same bytes. Frames are copied whole; where a file says so, only
timestamps, TCP ports, TCP sequence/ACK numbers or a MySQL sequence id are rewritten (no checksums: pcapdecomp
does not check them, and captures on the sending host carry unfilled ones anyway).
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "tests"))

from pcaptools import records, tcp_ports  # noqa: E402


def write(dst: Path, header: bytes, order: str, unit: int, frames: list[tuple[int, bytes]]) -> None:
    out = [header]
    for ts, pkt in frames:
        out.append(struct.pack(order + "IIII", ts // 1_000_000_000, (ts % 1_000_000_000) // unit, len(pkt), len(pkt)))
        out.append(pkt)
    dst.write_bytes(b"".join(out))
    print(f"{dst.relative_to(REPO)}: {len(frames)} frames, {dst.stat().st_size} bytes")


def frames_of(path: Path) -> tuple[bytes, str, int, list[tuple[int, bytes]]]:
    header, order, unit, recs = records(path)
    return header, order, unit, [(ts, pkt) for ts, pkt, _ in recs]


def _tcp(pkt: bytes) -> int:
    """Offset of the TCP header in an Ethernet/IPv4 frame."""
    assert pkt[12:14] == b"\x08\x00" and pkt[23] == 6
    return 14 + (pkt[14] & 0x0F) * 4


def retcp(pkt: bytes, *, sport: int | None = None, dport: int | None = None, seq: int | None = None,
          ack: int | None = None, mysql_seq: int | None = None) -> bytes:
    b = bytearray(pkt)
    t = _tcp(pkt)
    for value, at, fmt in ((sport, t, ">H"), (dport, t + 2, ">H"), (seq, t + 4, ">I"), (ack, t + 8, ">I")):
        if value is not None:
            struct.pack_into(fmt, b, at, value)
    if mysql_seq is not None:
        b[t + (b[t + 12] >> 4) * 4 + 3] = mysql_seq
    return bytes(b)


def group_stall_cuts() -> None:
    """Degenerate shapes cut from captures/group-stall (the project's own recording). Its first connection is
    client port 40518 (connection id 7): login, SET NAMES, an identify query, the 3.8 s BENCHMARK, COM_QUIT."""
    for side in ("db", "app"):
        header, order, unit, frames = frames_of(REPO / "captures" / "group-stall" / f"{side}.pcap")
        conn = [(i + 1, ts, pkt) for i, (ts, pkt) in enumerate(frames) if 40518 in (tcp_ports(pkt) or ())]
        write(HERE / f"one-connection-{side}.pcap", header, order, unit, [(ts, pkt) for _, ts, pkt in conn])
        if side != "db":
            continue
        by_frame = {n: (ts, pkt) for n, ts, pkt in conn}
        write(HERE / "one-exchange.pcap", header, order, unit, [by_frame[9], by_frame[10]])  # SET NAMES + its OK
        write(HERE / "no-exchange.pcap", header, order, unit, [by_frame[n] for n in range(1, 6)])  # up to the greeting
        write(HERE / "one-frame.pcap", header, order, unit, [by_frame[11]])  # one COM_QUERY, its answer not captured
        write(HERE / "login-unanswered.pcap", header, order, unit, [by_frame[n] for n in range(1, 8)])  # no auth OK
        t0 = conn[0][1]  # every frame of the connection within 21 × 40 ns
        write(HERE / "one-microsecond.pcap", header, order, unit, [(t0 + 40 * i, pkt) for i, (_, _, pkt) in enumerate(conn)])


def unprompted_err(corpus: Path) -> None:
    """zeek/caching_sha2_password.pcap (BSD-3-Clause) holds MySQL 8.0.32's real unsolicited ERR 1158 (frame 10),
    sent during a login that the client left (FIN, then RST). MariaDB, which the lab runs, sends no such ERR, so
    the command-phase case is cut from this capture: connection 2 (frames 12-32, its login and four queries) ends
    with frames 9-11 (FIN, the ERR with its MySQL sequence id 3 set to 0 as after a failed command read, RST)
    instead of its COM_QUIT; connection 3 keeps only those three frames (a connection seen from its end)."""
    header, order, unit, frames = frames_of(corpus / "zeek" / "caching_sha2_password.pcap")
    f = {i + 1: frame for i, frame in enumerate(frames)}
    fin, err, rst = f[9][1], f[10][1], f[11][1]
    out = [f[n] for n in range(12, 33)]
    t = f[33][0]  # when connection 2 sent COM_QUIT
    for port, (c_next, s_next), start in ((49352, (4292046712, 2889739172), t),
                                          (40950, (101326415, 2915846060), f[56][0])):
        gap = [f[10][0] - f[9][0], f[11][0] - f[9][0]]
        out += [(start, retcp(fin, sport=port, seq=c_next, ack=s_next)),
                (start + gap[0], retcp(err, dport=port, seq=s_next, ack=c_next + 1, mysql_seq=0)),
                (start + gap[1], retcp(rst, sport=port, seq=c_next + 1))]
    write(HERE / "unprompted-err.pcap", header, order, unit, out)
    # connection 1 up to the server's Auth Switch Request: a login whose OK/ERR is not in the capture
    write(HERE / "login-incomplete.pcap", header, order, unit, [f[n] for n in range(1, 9)])


def corners_cut() -> None:
    """no-mysql.pcap: the plain-text health check of corners.pcap alone (client port 59816): no MySQL at all."""
    header, order, unit, frames = frames_of(HERE / "corners.pcap")
    write(HERE / "no-mysql.pcap", header, order, unit,
          [(ts, pkt) for ts, pkt in frames if 59816 in (tcp_ports(pkt) or ())])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=Path("/work/shared/corpus"))
    args = parser.parse_args()
    group_stall_cuts()
    unprompted_err(args.corpus)
    corners_cut()
