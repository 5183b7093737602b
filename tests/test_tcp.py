"""TCP reassembly (pcapdecomp.read.tcp.HalfStream) on real recorded streams, re-segmented, duplicated and reordered.

The reference is the same recording delivered as captured: every perturbation a capture point can produce
(different segmentation by TSO/GRO, retransmissions, overlapping retransmissions, reordering) must give the same
byte stream and, byte for byte, the timestamp and frame of the first copy of each byte. The lab recordings are on
a veth pair with no loss, so the captured order is the truth.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streams import ACK, FIN, SYN, duplicate, merge_runs, recorded, reorder, resplit

from pcapdecomp.read.capture import TcpSegment
from pcapdecomp.read.tcp import SEQ_MOD, Chunk, Gap, HalfStream

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- real streams ------------------------------------------------------------------------------------------------
def busiest(name: str) -> tuple[tuple, list[TcpSegment]]:
    return max(recorded(name).items(), key=lambda kv: sum(len(s.payload) for s in kv[1]))


def one_direction(segs: list[TcpSegment], src: tuple) -> list[TcpSegment]:
    return [s for s in segs if (s.src_ip, s.src_port) == src]


# ---- a reference driver and a byte-level view of its output ---------------------------------------------------------
def reassemble(segs: list[TcpSegment], src: tuple, acks: bool = True) -> tuple[HalfStream, list]:
    """Drive one HalfStream the way FlowTracker does: SYN, the peer's ACKs, the segments, then flush."""
    half = HalfStream()
    events: list = []
    for seg in segs:
        if (seg.src_ip, seg.src_port) == src:
            if seg.flags & SYN:
                half.syn(seg.seq)
            events += half.segment(seg.seq, seg.payload, seg.ts_ns, seg.frame, bool(seg.flags & FIN))
        elif acks and seg.flags & ACK:
            events += half.ack(seg.ack, seg.ts_ns)
    events += half.flush(segs[-1].ts_ns if segs else 0)
    return half, events


def byte_view(events: list) -> tuple[bytes, list[tuple[int, int]], list[Gap]]:
    """(stream bytes, (ts, frame) of every byte, gaps); checks the events tile the stream with no overlap."""
    data = bytearray()
    stamps: list[tuple[int, int]] = []
    gaps = []
    position = None
    for ev in events:
        if position is not None:
            assert ev.offset == position, "events must be contiguous and in order"
        if isinstance(ev, Chunk):
            data += ev.data
            stamps += [(ev.ts_ns, ev.frame)] * len(ev.data)
            position = ev.offset + len(ev.data)
        else:
            gaps.append(ev)
            data += b"\x00" * ev.length
            stamps += [(-1, -1)] * ev.length
            position = ev.offset + ev.length
    return bytes(data), stamps, gaps


# ---- tests -------------------------------------------------------------------------------------------------------------
STREAMS = ["oltp-hogs", "group-stall", "features"]


@pytest.mark.parametrize("name", STREAMS)
def test_captured_stream_is_delivered_whole_and_in_order(name):
    """As captured (no loss on the lab's veth): every payload byte delivered once, no gaps, nothing held."""
    for (client, server), segs in recorded(name).items():
        for src in (client, server):
            half, events = reassemble(segs, src)
            data, stamps, gaps = byte_view(events)
            sent = one_direction(segs, src)
            assert not gaps
            assert data == b"".join(s.payload for s in sent)  # no retransmissions in these recordings
            assert half.stats.bytes_delivered == len(data) and half.buffered == 0
            # the first byte of every segment is stamped with that segment's own time and frame
            offset = 0
            for seg in sent:
                if seg.payload:
                    assert stamps[offset] == (seg.ts_ns, seg.frame)
                    offset += len(seg.payload)
            # raw_seq maps the stream offset back to the wire: the SYN's ISN + 1 is offset 0
            syn = next(s for s in sent if s.flags & SYN)
            assert half.raw_seq(0) == (syn.seq + 1) % SEQ_MOD


def _reference(name: str, which: int = 0):
    key, segs = busiest(name) if which == 0 else sorted(recorded(name).items())[which]
    return key, segs


@pytest.mark.parametrize("name", ["oltp-hogs", "features"])
@given(seed=st.integers(0, 2**32 - 1), side=st.sampled_from([0, 1]))
@SETTINGS
def test_resplit_duplicated_reordered_stream_is_identical(name, seed, side):
    """(b) re-split, (c) duplicates and overlapping retransmissions, (d) causal reordering, all at once: same bytes
    and same first-seen (timestamp, frame) for every byte."""
    rng = random.Random(seed)
    key, segs = _reference(name, which=rng.randrange(len(recorded(name))))
    src = key[side]
    want = byte_view(reassemble(segs, src)[1])
    perturbed: list[TcpSegment] = []
    for seg in segs:
        if len(seg.payload) > 1 and rng.random() < 0.5:
            perturbed += resplit(seg, [rng.randrange(1, len(seg.payload)) for _ in range(rng.randrange(1, 4))])
        else:
            perturbed.append(seg)
    perturbed = reorder(perturbed, rng, window=rng.randrange(2, 8), swaps=rng.randrange(0, 80))
    perturbed = duplicate(perturbed, rng, rng.randrange(0, 12))
    half, events = reassemble(perturbed, src)
    got = byte_view(events)
    assert got[2] == [] and got[0] == want[0]
    assert got[1] == want[1]
    assert half.buffered == 0


@given(seed=st.integers(0, 2**32 - 1), side=st.sampled_from([0, 1]))
@SETTINGS
def test_super_segments_give_the_same_bytes(seed, side):
    """TSO-like merges: the bytes are the same; each merged byte carries the super segment's (earlier) time."""
    rng = random.Random(seed)
    key, segs = busiest("oltp-hogs")
    src = key[side]
    want, want_stamps, _ = byte_view(reassemble(segs, src)[1])
    merged = merge_runs(segs, src, rng)
    got, got_stamps, gaps = byte_view(reassemble(merged, src)[1])
    assert got == want and not gaps
    assert all(g[0] <= w[0] for g, w in zip(got_stamps, want_stamps))


@given(seed=st.integers(0, 2**32 - 1))
@SETTINGS
def test_one_byte_segments_in_reverse_order_within_the_buffer(seed):
    """Worst case for the hole list: a real segment cut into single bytes delivered backwards."""
    rng = random.Random(seed)
    key, segs = busiest("features")
    src = key[1]
    sent = [s for s in one_direction(segs, src)]
    big = max((s for s in sent if s.payload), key=lambda s: len(s.payload))
    pieces = resplit(big, list(range(1, len(big.payload))))
    rng.shuffle(pieces)
    i = segs.index(big)
    half, events = reassemble(segs[:i] + pieces + segs[i + 1 :], src, acks=False)
    want = byte_view(reassemble(segs, src, acks=False)[1])
    got = byte_view(events)
    assert got[0] == want[0] and got[1] == want[1] and not got[2]
    assert half.stats.out_of_order_segments <= len(pieces)


@pytest.mark.parametrize("name", ["oltp-hogs", "group-stall"])
def test_a_lost_segment_the_peer_acknowledged_is_exactly_one_gap(name):
    """Drop a captured data segment; the peer's ACK beyond it proves the bytes existed: one Gap, its exact length,
    declared at the ACK (not at the end of the capture), and every other byte still delivered with its stamp."""
    checked = 0
    rng = random.Random(7)
    for (client, server), segs in sorted(recorded(name).items()):
        for src in (client, server):
            sent = [i for i, s in enumerate(segs) if (s.src_ip, s.src_port) == src and s.payload]
            for i in rng.sample(sent[1:-1], min(3, len(sent) - 2)):
                lost = segs[i]
                half0, events0 = reassemble(segs, src)
                want, want_stamps, _ = byte_view(events0)
                dropped = segs[:i] + segs[i + 1 :]
                half = HalfStream()
                events = []
                for seg in dropped:  # as in reassemble(), but remembering what declared the gap
                    if (seg.src_ip, seg.src_port) == src:
                        if seg.flags & SYN:
                            half.syn(seg.seq)
                        events += half.segment(seg.seq, seg.payload, seg.ts_ns, seg.frame, bool(seg.flags & FIN))
                    elif seg.flags & ACK:
                        events += half.ack(seg.ack, seg.ts_ns)
                tail = half.flush(dropped[-1].ts_ns)
                got, stamps, gaps = byte_view(events + tail)
                start = (lost.seq - half.raw_seq(0)) % SEQ_MOD
                assert [(g.offset, g.length) for g in gaps] == [(start, len(lost.payload))]
                assert not any(isinstance(e, Gap) for e in tail), "the peer's ACK should have declared it"
                assert half.stats.gaps == 1 and half.stats.gap_bytes == len(lost.payload)
                assert gaps[0].ts_ns > lost.ts_ns
                end = start + len(lost.payload)
                assert got[:start] == want[:start] and got[end:] == want[end:]
                assert stamps[:start] == want_stamps[:start] and stamps[end:] == want_stamps[end:]
                checked += 1
    assert checked >= 10


def test_hole_without_an_ack_becomes_a_gap_at_flush_or_when_the_buffer_overflows():
    half = HalfStream(max_buffered=100)
    assert half.segment(1000, b"a" * 10, 1, 1) == [Chunk(0, b"a" * 10, 1, 1)]
    assert half.segment(1020, b"c" * 10, 2, 2) == []  # hole 10..20
    assert half.ack(1010, 3) == []  # the peer has what we delivered: nothing proven lost
    assert half.ack(1015, 3) == [Gap(10, 5, 3)]  # the peer got 5 bytes of the hole: those were lost by the capture
    assert half.buffered == 10
    out = half.flush(4)
    assert out == [Gap(15, 5, 4), Chunk(20, b"c" * 10, 2, 2)]
    assert half.stats.gaps == 2 and half.stats.gap_bytes == 10
    # overflow: more than max_buffered bytes waiting behind a hole
    half = HalfStream(max_buffered=100)
    half.segment(0, b"x", 1, 1)
    assert half.segment(11, b"y" * 60, 2, 2) == []
    out = half.segment(71, b"z" * 60, 3, 3)
    assert out == [Gap(1, 10, 3), Chunk(11, b"y" * 60, 2, 2), Chunk(71, b"z" * 60, 3, 3)]


def test_sequence_wraparound_and_snaplen_cut():
    """Sequence numbers that wrap past 2**32 inside the stream; a segment cut by the snaplen is a gap at once."""
    half = HalfStream()
    half.syn(SEQ_MOD - 3)
    out = half.segment(SEQ_MOD - 2, b"ab", 1, 1)
    out += half.segment(0, b"cd", 2, 2)
    assert out == [Chunk(0, b"ab", 1, 1), Chunk(2, b"cd", 2, 2)]
    assert half.raw_seq(2) == 0
    out = half.segment(2, b"ef", 3, 3)  # 4 more bytes were on the wire
    out += half.cut_by_snaplen(2, 2, 4, 3)
    assert out == [Chunk(4, b"ef", 3, 3), Gap(6, 4, 3)]
    assert half.segment(8, b"gh", 4, 4) == [Chunk(10, b"gh", 4, 4)]  # raw 8 is offset 10 after the wrap


def test_a_jump_no_window_explains_restarts_with_a_zero_gap():
    half = HalfStream()
    half.segment(5000, b"hello", 1, 1)
    out = half.segment(5000 + (1 << 31) + 12345, b"world", 2, 2)
    assert out == [Gap(5, 0, 2), Chunk(5, b"world", 2, 2)]
    assert half.stats.discontinuities == 1


def test_retransmission_counters():
    half = HalfStream()
    half.segment(0, b"0123456789", 1, 1)
    assert half.segment(0, b"0123456789", 2, 2) == []  # exact copy
    assert half.segment(5, b"56789AB", 3, 3) == [Chunk(10, b"AB", 3, 3)]  # overlapping: only the new bytes
    assert half.stats.retransmitted_bytes == 15
    assert half.stats.bytes_delivered == 12


def test_first_copy_wins_among_held_and_in_order_segments():
    """Bytes held out of order keep their first copy's stamp even when a longer retransmission at the same offset,
    or an in-order segment covering them, arrives later (each byte is timed to the first moment it was seen)."""
    half = HalfStream()
    half.segment(0, b"ab", 1, 1)
    assert half.segment(4, b"EF", 2, 2) == []  # held
    assert half.segment(4, b"EFGH", 3, 3) == []  # longer copy at the same offset: only GH is new
    assert half.segment(10, b"K", 4, 4) == []
    out = half.segment(2, b"cdEFGHijK", 5, 5)  # in order, covering everything held
    assert out == [
        Chunk(2, b"cd", 5, 5),
        Chunk(4, b"EF", 2, 2),
        Chunk(6, b"GH", 3, 3),
        Chunk(8, b"ij", 5, 5),
        Chunk(10, b"K", 4, 4),
    ]
    assert half.stats.retransmitted_bytes == 2 + 5  # EF again, then EFGH and K inside the in-order segment
    assert half.stats.bytes_delivered == 11 and half.buffered == 0


def test_holes_are_remembered_with_their_sequence_numbers_for_the_repair_stage():
    """Every gap, a snaplen cut and bytes before a FIN that never arrived are kept as (raw seq, length, ts): another
    capture point may have those bytes (pcapdecomp/pair/repair.py). The ACK number of each segment stays with its bytes."""
    base = SEQ_MOD - 5  # the hole wraps the sequence space
    half = HalfStream()
    half.segment(base, b"a" * 10, 1, 1, ack=77)
    half.segment(base + 20, b"c" * 10, 2, 2, ack=78)
    assert half.ack((base + 20) % SEQ_MOD, 3) == [Gap(10, 10, 3), Chunk(20, b"c" * 10, 2, 2, 78)]
    assert half.holes == [((base + 10) % SEQ_MOD, 10, 3)]
    half.segment(base + 30, b"d" * 4, 4, 4)
    assert half.cut_by_snaplen(base + 30, 4, 6, 4) == [Gap(34, 6, 4)]
    half.segment(base + 50, b"", 5, 5, fin=True)  # the FIN says 10 bytes (40..50) were sent and not captured
    assert half.flush(6) == [] and half.stats.gaps == 2  # not a declared gap: only remembered
    assert half.holes[1:] == [((base + 34) % SEQ_MOD, 6, 4), ((base + 40) % SEQ_MOD, 10, 6)]
    assert half.offset_of((base + 40) % SEQ_MOD) == 40 and HalfStream().offset_of(5) is None
