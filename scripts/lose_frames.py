#!/usr/bin/env python3
"""Drop frames from a copy of a capture at random, as a capture point that loses packets would (seeded).

    python3 scripts/lose_frames.py IN.pcap OUT.pcap --rate 0.01 --seed 7 [--dropped DROPPED.txt] [--tcp-only]

Reads a classic pcap (µs or ns timestamps, either byte order, optionally gzip-compressed) record by record and
writes the records it keeps unchanged (same header, same bytes, same timestamps). Each frame is dropped with
probability `--rate`, independently, from `random.Random(seed)`: the same seed drops the same frames. With
`--tcp-only` only frames that carry TCP are candidates (the rest is always kept). `--dropped` writes the
numbers (1-based, as in Wireshark) of the dropped frames, one per line. Prints one line: frames read, dropped.

Used by tests/test_repair.py and for the loss figures in docs/analyze.md (capture loss repaired from the other
point); the repair itself is in pcapdecomp/pair/repair.py.
"""

from __future__ import annotations

import argparse
import gzip
import random
import struct
import sys
from pathlib import Path

MAGICS = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">", b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}


def _open(path: Path):
    with open(path, "rb") as probe:
        head = probe.read(2)
    return gzip.open(path, "rb") if head == b"\x1f\x8b" else open(path, "rb")


def _is_tcp(linktype: int, data: bytes) -> bool:
    """Ethernet (with VLAN tags), Linux SLL/SLL2 or raw IP frames carrying TCP; anything else is not."""
    if linktype == 1:
        pos, ethertype = 14, data[12:14]
        while ethertype in (b"\x81\x00", b"\x88\xa8") and len(data) >= pos + 4:
            ethertype, pos = data[pos + 2:pos + 4], pos + 4
    elif linktype == 113:
        pos, ethertype = 16, data[14:16]
    elif linktype == 276:
        pos, ethertype = 20, data[0:2]
    elif linktype in (101, 228, 229, 12):
        pos, ethertype = 0, b"\x86\xdd" if data[:1] and data[0] >> 4 == 6 else b"\x08\x00"
    else:
        return False
    if ethertype == b"\x08\x00":
        return len(data) > pos + 9 and data[pos + 9] == 6
    if ethertype == b"\x86\xdd":
        return len(data) > pos + 6 and data[pos + 6] == 6
    return False


def lose_frames(src: Path, dst: Path, rate: float, seed: int, tcp_only: bool = False) -> tuple[int, list[int]]:
    """Copy `src` to `dst` without the frames drawn for loss; returns (frames read, dropped frame numbers)."""
    rng = random.Random(seed)
    dropped: list[int] = []
    frames = 0
    with _open(src) as f, open(dst, "wb") as out:
        header = f.read(24)
        if len(header) < 24 or header[:4] not in MAGICS:
            raise ValueError(f"{src}: not a classic pcap (pcapng: convert with `editcap -F pcap` first)")
        order = MAGICS[header[:4]]
        linktype = struct.unpack(order + "I", header[20:24])[0] & 0x0FFFFFFF
        out.write(header)
        while True:
            record = f.read(16)
            if len(record) < 16:
                break
            incl = struct.unpack(order + "I", record[8:12])[0]
            data = f.read(incl)
            if len(data) < incl:
                break  # cut mid-record: the copy ends where the original's intact part ends
            frames += 1
            draw = rng.random()  # drawn for every frame, so the drops of one seed do not depend on --tcp-only
            if draw < rate and (not tcp_only or _is_tcp(linktype, data)):
                dropped.append(frames)
                continue
            out.write(record)
            out.write(data)
    return frames, dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--rate", type=float, required=True, help="probability of dropping each frame (0 … 1)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tcp-only", action="store_true", help="drop only frames that carry TCP")
    parser.add_argument("--dropped", type=Path, help="write the dropped frame numbers here, one per line")
    args = parser.parse_args(argv)
    if not 0 <= args.rate <= 1:
        parser.error(f"--rate must be within 0 … 1, got {args.rate}")
    try:
        frames, dropped = lose_frames(args.src, args.dst, args.rate, args.seed, args.tcp_only)
    except (OSError, ValueError) as err:
        print(f"lose_frames: error: {err}", file=sys.stderr)
        return 2
    if args.dropped:
        args.dropped.write_text("".join(f"{n}\n" for n in dropped))
    print(f"{args.src}: {frames} frames read, {len(dropped)} dropped ({100 * len(dropped) / max(frames, 1):.2f} %) "
          f"-> {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
