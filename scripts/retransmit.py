#!/usr/bin/env python3
"""Make one request segment of a recorded capture set retransmitted after a timeout, as a path that lost it would
(this kernel has no netem to lose it live).

    python3 scripts/retransmit.py IN_SET OUT_SET --client-port PORT --nth N [--delay-ms 250]

IN_SET is a capture set with app.pcap and db.pcap (classic pcap, Ethernet, IPv4); OUT_SET is written with the two
captures changed and every other file of the set copied. On the connection whose client port is PORT, the N-th
(1-based) client → server segment with payload is the lost one:
- app.pcap (the client's side of the loss) keeps it where it was and gets a copy of it DELAY later: the
  retransmission. Every later frame of that connection moves DELAY later too (nothing came before the retransmission
  got through).
- db.pcap (beyond the loss) never saw the first copy: that segment and every later frame of the connection move
  DELAY later.
The other connections are untouched; frames are written in time order. The exchange's network time grows by DELAY
(A1 stays, A4, D1 and D4 move by DELAY); the server's time does not change. Prints one JSON line: the connection,
the segment's payload length (the bytes retransmitted), its original time and the delay.

Used by tests/test_stories.py (retransmissions and likely RTO stalls in the network story).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lose_frames import MAGICS, _open  # noqa: E402

NS_MAGICS = (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")


def _tcp(data: bytes) -> tuple[str, int, str, int, int] | None:
    """(src, sport, dst, dport, payload length) of an Ethernet/IPv4/TCP frame, else None."""
    pos, ethertype = 14, data[12:14]
    while ethertype in (b"\x81\x00", b"\x88\xa8") and len(data) >= pos + 4:
        ethertype, pos = data[pos + 2:pos + 4], pos + 4
    if ethertype != b"\x08\x00" or len(data) < pos + 20 or data[pos + 9] != 6:
        return None
    ihl = (data[pos] & 0x0F) * 4
    total = struct.unpack("!H", data[pos + 2:pos + 4])[0]
    tcp = pos + ihl
    if len(data) < tcp + 20:
        return None
    sport, dport = struct.unpack("!HH", data[tcp:tcp + 4])
    offset = (data[tcp + 12] >> 4) * 4
    return (socket.inet_ntoa(data[pos + 12:pos + 16]), sport, socket.inet_ntoa(data[pos + 16:pos + 20]), dport,
            max(total - ihl - offset, 0))


def _read(path: Path) -> tuple[bytes, str, int, list[list]]:
    with _open(path) as f:
        header = f.read(24)
        if len(header) < 24 or header[:4] not in MAGICS:
            raise ValueError(f"{path}: not a classic pcap")
        order = MAGICS[header[:4]]
        per_s = 10**9 if header[:4] in NS_MAGICS else 10**6
        frames = []
        while True:
            record = f.read(16)
            if len(record) < 16:
                break
            sec, frac, incl, orig = struct.unpack(order + "IIII", record)
            data = f.read(incl)
            if len(data) < incl:
                break
            frames.append([sec * per_s + frac, orig, data])
    return header, order, per_s, frames


def _write(path: Path, header: bytes, order: str, per_s: int, frames: list[list]) -> None:
    frames.sort(key=lambda f: f[0])  # stable: frames of one instant keep their order
    with open(path, "wb") as out:
        out.write(header)
        for ts, orig, data in frames:
            out.write(struct.pack(order + "IIII", ts // per_s, ts % per_s, len(data), orig))
            out.write(data)


def retransmit(src: Path, dst: Path, point: str, client_port: int, nth: int, delay_ns: int) -> dict:
    """Rewrite one capture (point "app": the first copy kept and a retransmission added; "db": the first copy lost)."""
    header, order, per_s, frames = _read(src)
    unit = 10**9 // per_s
    lost = None
    seen = 0
    conn = None
    for i, (ts, _, data) in enumerate(frames):
        tcp = _tcp(data)
        if tcp is None or client_port not in (tcp[1], tcp[3]):
            continue
        if tcp[1] == client_port and tcp[4] > 0:
            seen += 1
            if seen == nth:
                lost, conn = i, tcp
                break
    if lost is None:
        raise ValueError(f"{src}: no client segment #{nth} with payload from port {client_port} ({seen} seen)")
    shift = delay_ns // unit
    for ts_frame in frames[lost:]:
        tcp = _tcp(ts_frame[2])
        if tcp is not None and client_port in (tcp[1], tcp[3]) and conn[2] in (tcp[0], tcp[2]):
            ts_frame[0] += shift
    original_ns = (frames[lost][0] - shift) * unit
    if point == "app":
        frames.append([frames[lost][0] - shift, frames[lost][1], frames[lost][2]])  # the first copy, where it was
    _write(dst, header, order, per_s, frames)
    return {"client": f"{conn[0]}:{conn[1]}", "server": f"{conn[2]}:{conn[3]}", "bytes": conn[4],
            "original_ns": original_ns, "delay_ns": shift * unit}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="capture set with app.pcap and db.pcap")
    parser.add_argument("dst", type=Path, help="capture set to write")
    parser.add_argument("--client-port", type=int, required=True)
    parser.add_argument("--nth", type=int, required=True, help="the client's N-th segment with payload (1-based)")
    parser.add_argument("--delay-ms", type=float, default=250.0, help="retransmission this long after the original")
    args = parser.parse_args(argv)
    if args.nth < 1 or args.delay_ms <= 0:
        parser.error("--nth must be 1 or more and --delay-ms positive")
    try:
        args.dst.mkdir(parents=True, exist_ok=True)
        for f in args.src.iterdir():
            if f.is_file() and f.name not in ("app.pcap", "db.pcap"):
                shutil.copy2(f, args.dst / f.name)
        delay_ns = int(args.delay_ms * 1e6)
        app = retransmit(args.src / "app.pcap", args.dst / "app.pcap", "app", args.client_port, args.nth, delay_ns)
        retransmit(args.src / "db.pcap", args.dst / "db.pcap", "db", args.client_port, args.nth, delay_ns)
    except (OSError, ValueError) as err:
        print(f"retransmit: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(app))
    return 0


if __name__ == "__main__":
    sys.exit(main())
