"""Real recorded traffic as the stages see it, and the changes a capture point can make to it, for tests.

`recorded(name)` gives each TCP connection of a bundled recording's db.pcap (in capture order) and
`lab_segments(name)` all its segments; `track` runs them through a FlowTracker. The perturbations keep each
segment's own timestamp and frame, as a capture point would record them: `resplit` (a smaller MSS, GRO undone),
`merge_runs` (TSO/GRO super segments), `reorder` (never past SYN/FIN/RST or an ACK of the bytes moved) and
`duplicate` (retransmissions, exact and overlapping, later in the capture). The recordings are on a veth pair with
no loss, so their captured order is the truth.
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from pathlib import Path

from pcapdecomp.read.capture import TcpSegment, open_capture
from pcapdecomp.read.flows import FlowTracker
from pcapdecomp.read.tcp import SEQ_MOD

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
SYN, FIN, RST, ACK = 0x02, 0x01, 0x04, 0x10


# ---- real streams ------------------------------------------------------------------------------------------------
def connections(path: Path) -> dict[tuple, list[TcpSegment]]:
    """Segments of each TCP connection of a capture, in capture order, keyed by (client, server)."""
    by_key: dict[tuple, list[TcpSegment]] = defaultdict(list)
    with open_capture(path) as reader:
        for seg in reader:
            a, b = (seg.src_ip, seg.src_port), (seg.dst_ip, seg.dst_port)
            by_key[tuple(sorted((a, b)))].append(seg)
    out = {}
    for segs in by_key.values():
        syn = next(s for s in segs if s.flags & SYN and not s.flags & ACK)
        out[((syn.src_ip, syn.src_port), (syn.dst_ip, syn.dst_port))] = segs
    return out


_CACHE: dict[str, dict] = {}


def recorded(name: str) -> dict[tuple, list[TcpSegment]]:
    if name not in _CACHE:
        _CACHE[name] = connections(CAPTURES / name / "db.pcap")
    return _CACHE[name]


# ---- perturbations (each keeps a segment's own timestamp and frame, as a capture point would record them) -------------
def resplit(seg: TcpSegment, cuts: list[int]) -> list[TcpSegment]:
    """Cut one segment's payload at the given offsets (GRO undone, or a path with a smaller MSS)."""
    n = len(seg.payload)
    points = sorted({c for c in cuts if 0 < c < n})
    pieces = []
    start = 0
    for end in points + [n]:
        last = end == n
        pieces.append(
            dataclasses.replace(
                seg,
                seq=(seg.seq + start) % SEQ_MOD,
                payload=seg.payload[start:end],
                flags=seg.flags if last else seg.flags & ~FIN,
            )
        )
        start = end
    return pieces


def merge_runs(segs: list[TcpSegment], src: tuple, rng: random.Random) -> list[TcpSegment]:
    """TSO/GRO-like super segments: adjacent contiguous data segments of one direction joined into one (with the
    first one's timestamp and frame, as a capture of the super segment would show them)."""
    out: list[TcpSegment] = []
    for seg in segs:
        prev = out[-1] if out else None
        if (
            prev is not None
            and (seg.src_ip, seg.src_port) == src == (prev.src_ip, prev.src_port)
            and prev.payload
            and seg.payload
            and not (prev.flags | seg.flags) & (SYN | FIN | RST)
            and (prev.seq + len(prev.payload)) % SEQ_MOD == seg.seq
            and rng.random() < 0.7
        ):
            out[-1] = dataclasses.replace(prev, payload=prev.payload + seg.payload, ack=seg.ack)
        else:
            out.append(seg)
    return out


def is_barrier(seg: TcpSegment) -> bool:
    return bool(seg.flags & (SYN | FIN | RST))


def acknowledges(later: TcpSegment, earlier: TcpSegment) -> bool:
    """Does `later` (from the peer) acknowledge some byte of `earlier`? Then a capture cannot show it first."""
    if (later.src_ip, later.src_port) == (earlier.src_ip, earlier.src_port) or not later.flags & ACK:
        return False
    return (later.ack - earlier.seq) % SEQ_MOD - 1 < (1 << 31) and later.ack != earlier.seq


def reorder(segs: list[TcpSegment], rng: random.Random, window: int, swaps: int) -> list[TcpSegment]:
    """Random adjacent swaps within a window, never moving a segment past SYN/FIN/RST or past a peer segment that
    acknowledges its bytes (causality: no capture point sees an ACK before the data it acknowledges)."""
    out = list(segs)
    for _ in range(swaps):
        i = rng.randrange(len(out) - 1)
        for j in range(i, min(i + window, len(out) - 1)):
            a, b = out[j], out[j + 1]
            if is_barrier(a) or is_barrier(b) or acknowledges(b, a) or acknowledges(a, b):
                break
            out[j], out[j + 1] = b, a
    return out


def duplicate(segs: list[TcpSegment], rng: random.Random, count: int) -> list[TcpSegment]:
    """Retransmissions: exact copies and overlapping re-cuts of earlier data, later in the capture (with their own,
    later timestamp and frame, which must not win). A copy always comes after every original it repeats."""
    out = list(segs)
    for _ in range(count):
        i = rng.choice([k for k, s in enumerate(out) if s.payload])
        seg = out[i]
        src = (seg.src_ip, seg.src_port)
        after = i
        copy = seg
        if rng.random() < 0.5:  # an overlapping retransmission: part of this segment plus the start of the next one
            k = next((k for k in range(i + 1, len(out)) if (out[k].src_ip, out[k].src_port) == src and out[k].payload), None)
            tail = b""
            if k is not None and out[k].seq == (seg.seq + len(seg.payload)) % SEQ_MOD:
                tail = out[k].payload[: rng.randrange(len(out[k].payload) + 1)]
                after = k
            start = rng.randrange(len(seg.payload))
            copy = dataclasses.replace(seg, seq=(seg.seq + start) % SEQ_MOD, payload=seg.payload[start:] + tail)
        j = rng.randrange(after + 1, min(after + 12, len(out)) + 1)
        copy = dataclasses.replace(copy, ts_ns=out[j - 1].ts_ns + 1, frame=10**6 + len(out), flags=copy.flags & ~(SYN | FIN))
        out.insert(j, copy)
    return out


# ---- through the connection tracker ----------------------------------------------------------------------------


def segments(path: Path) -> list[TcpSegment]:
    with open_capture(path) as reader:
        return list(reader)


_SEGMENTS: dict[str, list[TcpSegment]] = {}


def lab_segments(name: str) -> list[TcpSegment]:
    if name not in _SEGMENTS:
        _SEGMENTS[name] = segments(CAPTURES / name / "db.pcap")
    return _SEGMENTS[name]


def track(segs, servers=None):
    """Run a FlowTracker; return (rows of (connection index, server, Exchange), the tracker, closed flows)."""
    rows, closed = [], []
    tracker = FlowTracker(lambda flow, ex: rows.append((flow.index, flow.server, ex)), closed.append, servers=servers)
    for seg in segs:
        tracker.segment(seg)
    tracker.finish()
    return rows, tracker, closed


def table(rows, drop=frozenset()):
    return sorted((index, server, tuple(v for k, v in _fields(ex) if k not in drop)) for index, server, ex in rows)


def _fields(ex):
    return [(f.name, getattr(ex, f.name)) for f in dataclasses.fields(ex)]
