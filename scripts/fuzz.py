#!/usr/bin/env python3
"""Bounded-time mutation fuzzing of the capture reader and of TCP reassembly + the MySQL protocol core.

Seeds are the bundled real recordings. Each round mutates one of them:
  - capture reader: bit flips, byte overwrites, truncation, inserted junk, huge record lengths in the file bytes;
    reading may only end in a PcapdecompError or in normal iteration, never another exception;
  - flows/tcp/mysql: the segments of a real capture with payload bytes flipped, segments dropped, duplicated,
    reordered, split and cut; the tracker must never raise and every exchange must be well-formed;
  - the native fast lane (pcapdecomp/_lane.c): a mutated capture file is extracted with and without the lane;
    both must give the same tables, counters and statistics, or the same error.

    python3 scripts/fuzz.py --seconds 60 [--seed N]

Prints the number of inputs tried per target and exits non-zero on the first failure (with a reproducer seed).
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pcapdecomp.capture import open_capture  # noqa: E402
from pcapdecomp.errors import PcapdecompError  # noqa: E402
from pcapdecomp.flows import FlowTracker  # noqa: E402

SEEDS = [REPO / "captures" / name / side for name in ("features", "group-stall", "maxthreads") for side in ("app.pcap", "db.pcap")]


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(5)
        pos = rng.randrange(len(buf)) if buf else 0
        if op == 0 and buf:
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[pos] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        elif op == 2:
            del buf[rng.randrange(len(buf) + 1) :]
        elif op == 3:
            buf[pos:pos] = os.urandom(rng.randint(1, 64))
        elif op == 4 and len(buf) > pos + 4:
            buf[pos : pos + 4] = rng.choice((b"\xff\xff\xff\x7f", b"\xff\xff\xff\x00", b"\x00\x00\x00\x00"))
    return bytes(buf)


def fuzz_reader(data: bytes, rng: random.Random, tmp: Path) -> None:
    path = tmp / "fuzz.pcap"
    path.write_bytes(mutate_bytes(data, rng))
    try:
        with open_capture(path) as reader:
            for _ in reader:
                pass
    except PcapdecompError:
        pass


def mutate_segments(segments: list, rng: random.Random) -> list:
    segs = list(segments)
    for _ in range(rng.randint(1, 12)):
        if not segs:
            break
        i = rng.randrange(len(segs))
        op = rng.randrange(7)
        seg = segs[i]
        if op == 0 and seg.payload:
            payload = bytearray(seg.payload)
            payload[rng.randrange(len(payload))] ^= 1 << rng.randrange(8)
            segs[i] = replace(seg, payload=bytes(payload))
        elif op == 1:
            del segs[i]
        elif op == 2:
            segs.insert(i, seg)
        elif op == 3 and i + 1 < len(segs):
            segs[i], segs[i + 1] = segs[i + 1], segs[i]
        elif op == 4 and len(seg.payload) > 1:
            cut = rng.randrange(1, len(seg.payload))
            segs[i : i + 1] = [replace(seg, payload=seg.payload[:cut]), replace(seg, seq=(seg.seq + cut) % (1 << 32), payload=seg.payload[cut:])]
        elif op == 5 and seg.payload:
            cut = rng.randrange(len(seg.payload))
            segs[i] = replace(seg, payload=seg.payload[:cut], missing=len(seg.payload) - cut)
        elif op == 6:
            segs[i] = replace(seg, payload=os.urandom(rng.randint(0, 80)))
    return segs


def fuzz_flows(segments: list, rng: random.Random) -> int:
    exchanges = []
    tracker = FlowTracker(lambda flow, ex: exchanges.append(ex), lambda flow: None)
    for seg in mutate_segments(segments, rng):
        tracker.segment(seg)
    tracker.finish()
    for ex in exchanges:
        assert ex.command and ex.req_first_ts is not None, ex
        assert ex.result in (None, "ok", "error", "resultset", "none"), ex
        assert ex.bytes_req >= 0 and ex.bytes_resp >= 0 and ex.rows >= 0, ex
    return len(exchanges)


def _extraction(path: Path, lane: bool):
    """What extract gives, as comparable values, or the error it raised."""
    import dataclasses

    from pcapdecomp.exchanges import extract

    if lane:
        os.environ.pop("PCAPDECOMP_NO_LANE", None)
    else:
        os.environ["PCAPDECOMP_NO_LANE"] = "1"
    try:
        x = extract(path)
    except PcapdecompError as err:
        return ("error", type(err).__name__, str(err))
    finally:
        os.environ.pop("PCAPDECOMP_NO_LANE", None)
    return (x.exchanges, x.connections, dataclasses.asdict(x.stats), x.quality(), dict(x.commands),
            x.other_tcp_frames, x.other_tcp_bytes, x.flow_first_frames)


def fuzz_lane(data: bytes, rng: random.Random, tmp: Path) -> None:
    import pandas as pd

    path = tmp / "lane.pcap"
    buf = bytearray(data)
    if rng.random() < 0.5:  # flips inside the packets (MySQL payloads) rather than anywhere
        for _ in range(rng.randint(1, 6)):
            pos = rng.randrange(24, len(buf))
            buf[pos] ^= 1 << rng.randrange(8)
        mutated = bytes(buf)
    else:
        mutated = mutate_bytes(data, rng)
    path.write_bytes(mutated)
    python, native = _extraction(path, False), _extraction(path, True)
    if isinstance(python[0], str) or isinstance(native[0], str):  # ("error", kind, message)
        assert python == native, (python[:3], native[:3])
        return
    pd.testing.assert_frame_equal(python[0], native[0])
    pd.testing.assert_frame_equal(python[1], native[1])
    assert python[2:] == native[2:], "counters differ with and without the fast lane"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    seeds = [p for p in SEEDS if p.exists()]
    if not seeds:
        print("fuzz: no seed recordings found under captures/", file=sys.stderr)
        return 2
    files = [p.read_bytes() for p in seeds]
    segment_lists = []
    for p in seeds:
        with open_capture(p) as reader:
            segment_lists.append(list(reader))
    from pcapdecomp import fastlane

    tried = {"capture reader": 0, "tcp+mysql": 0, "fast lane": 0}
    deadline = time.monotonic() + args.seconds
    round_no = 0
    with tempfile.TemporaryDirectory() as tmp:
        while time.monotonic() < deadline:
            round_seed = args.seed * 1_000_003 + round_no
            rng = random.Random(round_seed)
            round_no += 1
            try:
                if round_no % 4 == 0:
                    fuzz_reader(rng.choice(files), rng, Path(tmp))
                    tried["capture reader"] += 1
                elif round_no % 4 == 1 and fastlane.NATIVE:
                    fuzz_lane(rng.choice(files), rng, Path(tmp))
                    tried["fast lane"] += 1
                else:
                    fuzz_flows(rng.choice(segment_lists), rng)
                    tried["tcp+mysql"] += 1
            except Exception:
                traceback.print_exc()
                print(f"fuzz: FAILED at round {round_no} (reproduce with --seed {args.seed}, round seed {round_seed})", file=sys.stderr)
                return 1
    total = sum(tried.values())
    print(f"fuzz: {total} inputs tried in {args.seconds:.0f} s (seed {args.seed}): "
          + ", ".join(f"{k} {v}" for k, v in tried.items()) + "; 0 failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
