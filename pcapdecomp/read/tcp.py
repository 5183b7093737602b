"""TCP reassembly, sans-IO: segments in, in-order byte chunks and gaps out, per direction.

Each `Chunk` carries the capture timestamp and frame of the segment that first carried its bytes, and its stream
offset (bytes since the start of the direction), so the protocol layer can time every packet to the first moment
its bytes were seen. Retransmissions and overlaps are dropped (first copy wins; a copy whose bytes differ from the
first, as an insertion attack or a rewriting middlebox makes, is counted in `conflicts` — compared with what waits
out of order and with the chunks delivered since the exchange began, the last RECENT_CHUNKS of them); out-of-order
segments wait for the
hole before them to fill. A hole becomes a `Gap` (bytes never captured) when the peer acknowledges data beyond it,
when too much data waits behind it, or when the connection ends.

What waits is bounded three ways, each a cap that declares the hole a gap when it bites (counted in
`StreamStats.forced_gaps` and `HeldBudget.forced_gaps`): bytes per direction (`max_buffered`), segments per
direction (`max_segments`: one-byte segments would otherwise make the sorted list of held offsets the cost), and
bytes across all the connections of a capture (`HeldBudget`, shared by the tracker's half-streams).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

SEQ_MOD = 1 << 32
HALF = 1 << 31
RECENT_CHUNKS = 8  # delivered chunks kept (references, no copy) to compare a retransmitted copy with


@dataclass(frozen=True, slots=True)
class Chunk:
    offset: int
    data: bytes
    ts_ns: int
    frame: int
    ack: int | None = None  # raw ACK number of the segment that carried the bytes (None without the ACK flag)


@dataclass(frozen=True, slots=True)
class Gap:
    offset: int
    length: int
    ts_ns: int  # when the gap was declared


@dataclass
class StreamStats:
    segments: int = 0
    bytes_delivered: int = 0
    retransmitted_bytes: int = 0  # exact or overlapping copies of bytes already seen
    out_of_order_segments: int = 0
    gaps: int = 0
    gap_bytes: int = 0
    discontinuities: int = 0  # sequence jumps no window explains
    forced_gaps: int = 0  # of `gaps`: declared because a cap on held data bit, not because the peer acknowledged
    conflicts: int = 0  # copies of bytes that differ from the first copy (which is the one kept)


class HeldBudget:
    """Out-of-order bytes held by all the half-streams that share it (one capture's), with a cap: a half-stream
    that holds data while the total is over the cap declares its holes gaps until it holds nothing (so the total
    never exceeds the cap by more than one segment)."""

    def __init__(self, limit: int = 64 << 20):
        self.limit = limit
        self.held = 0
        self.forced_gaps = 0


class HalfStream:
    """One direction of a TCP connection."""

    WINDOW_AHEAD = 1 << 30  # the largest TCP window (scale 14)
    WINDOW_BEHIND = 64 << 20  # retransmissions older than this are not plausible
    MAX_HOLES = 4096  # holes remembered for the repair stage (pcapdecomp/pair/repair.py); the rest are only counted

    def __init__(self, max_buffered: int = 4 << 20, max_segments: int = 4096, budget: HeldBudget | None = None):
        self.base: int | None = None  # raw sequence number of stream offset 0
        self.next = 0  # next expected stream offset
        self.max_buffered = max_buffered
        self.max_segments = max_segments
        self.budget = budget
        self.stats = StreamStats()
        self.syn_seen = False
        self.fin_offset: int | None = None
        # sorted offsets of buffered out-of-order segments; those before _first were drained (dropped in bulk,
        # not one by one from the front: that copies the list each time)
        self._holes_starts: list[int] = []
        self._first = 0
        self._held: dict[int, Chunk] = {}
        self._held_bytes = 0
        # Byte ranges this capture point never saw, as (raw sequence number, length, ts_ns when found): the gaps,
        # and bytes before a FIN that never arrived. Another capture point of the connection may have them.
        self.holes: list[tuple[int, int, int]] = []
        self.holes_dropped = 0
        self._recent: deque[tuple[int, bytes]] = deque(maxlen=RECENT_CHUNKS)  # (offset, bytes) delivered last
        self.new_conflicts = 0  # conflicts found since the reader last looked (FlowTracker marks the exchange)

    @property
    def position(self) -> tuple[int, int] | None:
        """(raw sequence number of stream offset 0, next expected offset) while the stream is plainly in order:
        started, nothing held out of order. Where a reader that follows the stream on its own (the native fast
        lane, read/fastlane.py) may continue it; FlowTracker.take_back moves `next` past what it read. None otherwise."""
        if self.base is None or self._held:
            return None
        return self.base, self.next

    def raw_seq(self, offset: int) -> int:
        """The TCP sequence number of the byte at a stream offset (for matching across capture points)."""
        return ((self.base or 0) + offset) % SEQ_MOD

    def offset_of(self, seq: int) -> int | None:
        """The stream offset of raw sequence number `seq` (taken near the current position); None before any segment."""
        return None if self.base is None else self._offset(seq)

    def _offset(self, seq: int) -> int:
        delta = (seq - self.base - self.next + HALF) % SEQ_MOD - HALF
        return self.next + delta

    def syn(self, seq: int) -> None:
        if self.base is None or (self.next == 0 and not self._held):
            self.base = (seq + 1) % SEQ_MOD
            self.syn_seen = True

    def segment(self, seq: int, payload: bytes, ts_ns: int, frame: int, fin: bool = False,
                ack: int | None = None) -> list:
        """Add a segment (`ack`: its raw ACK number, kept with its bytes); return the chunks (and gaps) that became
        deliverable, in order."""
        if self.base is None:
            self.base = seq
        offset = self._offset(seq)
        if payload and not (self.next - self.WINDOW_BEHIND <= offset <= self.next + self.WINDOW_AHEAD):
            # A jump no TCP window explains (a capture stitched from two sessions, a sequence-shifting middlebox
            # restarted): start over at this segment, with a zero-length gap so the protocol layer resynchronises.
            self.stats.discontinuities += 1
            out = self.flush(ts_ns) + [Gap(self.next, 0, ts_ns)]
            self.base = (seq - self.next) % SEQ_MOD
            return out + self.segment(seq, payload, ts_ns, frame, fin, ack)
        if fin:
            self.fin_offset = offset + len(payload)
        if not payload:
            return []
        self.stats.segments += 1
        end = offset + len(payload)
        if end <= self.next:
            self.stats.retransmitted_bytes += len(payload)
            self._compare(offset, payload)
            return []
        if offset < self.next:
            self.stats.retransmitted_bytes += self.next - offset
            self._compare(offset, payload[: self.next - offset])
            payload = payload[self.next - offset :]
            offset = self.next
        if offset > self.next:
            self.stats.out_of_order_segments += 1
            self._hold(Chunk(offset, payload, ts_ns, frame, ack))
            return self._within_caps(ts_ns)
        if self._held:  # bytes already held were seen first: only the rest of this segment is new
            self._hold(Chunk(offset, payload, ts_ns, frame, ack))
            return self._drain()
        out = [Chunk(offset, payload, ts_ns, frame, ack)]
        self.next = end
        self.stats.bytes_delivered += len(payload)
        self._recent.append((offset, payload))
        return out

    def forget_delivered(self) -> None:
        """Between two exchanges: a later copy is compared with the bytes of the exchange it belongs to only (the
        same bytes whichever reader delivered the earlier exchanges: read/fastlane.py)."""
        self._recent.clear()

    def delivered(self, offset: int, payload: bytes) -> None:
        """`payload` at `offset` was delivered by the caller after `in_order` accepted it: kept to compare."""
        self._recent.append((offset, payload))

    def _compare(self, offset: int, data: bytes, held: bool = False) -> None:
        """A second copy of bytes already seen: count a conflict when its bytes differ from the first copy's (those
        delivered lately, or, with `held`, those waiting out of order)."""
        end = offset + len(data)
        if held:
            starts = self._holes_starts
            i = max(bisect.bisect_right(starts, offset, self._first) - 1, self._first)
            copies = []
            while i < len(starts) and starts[i] < end:
                chunk = self._held[starts[i]]
                copies.append((chunk.offset, chunk.data))
                i += 1
        else:
            copies = self._recent
        for first, seen in copies:
            a, b = max(first, offset), min(first + len(seen), end)
            if a < b and seen[a - first : b - first] != data[a - offset : b - offset]:
                self.stats.conflicts += 1
                self.new_conflicts += 1
                return

    def in_order(self, seq: int, length: int) -> int | None:
        """Fast path for the common case: `length` (> 0) payload bytes at `seq`, exactly the next expected byte,
        while nothing waits out of order. Accepts them as `segment` would (the caller delivers them as one chunk)
        and returns their stream offset; returns None, changing nothing, in every other case (then call
        `segment`)."""
        if self._held or self.base is None or (self.base + self.next - seq) & 0xFFFFFFFF:
            return None
        offset = self.next
        self.next = offset + length
        stats = self.stats
        stats.segments += 1
        stats.bytes_delivered += length
        return offset

    def ack(self, ack: int, ts_ns: int) -> list:
        """The peer acknowledged up to `ack`: a hole below it was received by the peer, so the capture lost it."""
        if self.base is None or not self._held:
            return []
        if self._offset(ack) > self.next:
            return self._declare_gap(ts_ns, upto=self._offset(ack))
        return []

    def flush(self, ts_ns: int) -> list:
        """The connection or the capture ended: every hole is final."""
        out = []
        while self._held:
            out += self._declare_gap(ts_ns)
        if self.fin_offset is not None and self.fin_offset > self.next:
            self._remember(self.next, self.fin_offset - self.next, ts_ns)  # the FIN proves these bytes were sent
        return out

    def cut_by_snaplen(self, seq: int, captured: int, missing: int, ts_ns: int) -> list:
        """The segment at `seq` had `missing` more bytes on the wire than were captured: if it was just delivered
        in order, those bytes are a gap now (rather than a hole waiting for an ACK)."""
        if self.base is None or self._offset(seq) + captured != self.next:
            return []
        gap = Gap(self.next, missing, ts_ns)
        self.stats.gaps += 1
        self.stats.gap_bytes += missing
        self._remember(self.next, missing, ts_ns)
        self.next += missing
        return [gap] + self._drain()

    @property
    def buffered(self) -> int:
        return self._held_bytes

    def _over_caps(self) -> bool:
        budget = self.budget
        return (self._held_bytes > self.max_buffered or len(self._held) > self.max_segments
                or (budget is not None and budget.held > budget.limit))

    def _within_caps(self, ts_ns: int) -> list:
        """Declare holes gaps while a cap on held data is exceeded (and this direction holds anything)."""
        out = []
        while self._held and self._over_caps():
            out += self._declare_gap(ts_ns)
            self.stats.forced_gaps += 1
            if self.budget is not None:
                self.budget.forced_gaps += 1
        return out

    def _held_delta(self, delta: int) -> None:
        self._held_bytes += delta
        if self.budget is not None:
            self.budget.held += delta

    def _hold(self, chunk: Chunk) -> None:
        """Keep the bytes of `chunk` that no held chunk already has (the first copy of every byte wins), so held
        chunks never overlap and each byte keeps the timestamp and frame of the segment that first carried it."""
        start, end = chunk.offset, chunk.offset + len(chunk.data)
        starts = self._holes_starts
        first = self._first
        i = bisect.bisect_right(starts, start, first)
        cursor = start
        if i > first:
            before = self._held[starts[i - 1]]
            cursor = max(cursor, before.offset + len(before.data))
        pieces = []
        while i < len(starts) and starts[i] < end:
            if starts[i] > cursor:
                pieces.append((cursor, starts[i]))
            held = self._held[starts[i]]
            cursor = max(cursor, held.offset + len(held.data))
            i += 1
        if cursor < end:
            pieces.append((cursor, end))
        kept = sum(b - a for a, b in pieces)
        self.stats.retransmitted_bytes += len(chunk.data) - kept
        if kept < len(chunk.data):
            self._compare(start, chunk.data, held=True)
        for a, b in pieces:
            piece = chunk if (a, b) == (start, end) else Chunk(a, chunk.data[a - start : b - start], chunk.ts_ns,
                                                               chunk.frame, chunk.ack)
            if len(starts) == first or a > starts[-1]:  # the usual order: data after a hole arrives in sequence
                starts.append(a)
            else:
                bisect.insort(starts, a, first)
            self._held[a] = piece
            self._held_delta(b - a)

    def _drain(self) -> list:
        out = []
        starts = self._holes_starts
        i = self._first
        while i < len(starts) and starts[i] <= self.next:
            start = starts[i]
            i += 1
            chunk = self._held.pop(start)
            self._held_delta(-len(chunk.data))
            end = start + len(chunk.data)
            if end <= self.next:
                self.stats.retransmitted_bytes += len(chunk.data)
                self._compare(start, chunk.data)
                continue
            if start < self.next:
                self.stats.retransmitted_bytes += self.next - start
                self._compare(start, chunk.data[: self.next - start])
                chunk = Chunk(self.next, chunk.data[self.next - start :], chunk.ts_ns, chunk.frame, chunk.ack)
            out.append(chunk)
            self.next = end
            self.stats.bytes_delivered += len(chunk.data)
            self._recent.append((chunk.offset, chunk.data))
        if i == len(starts):
            starts.clear()
            i = 0
        elif i > 64 and 2 * i > len(starts):
            del starts[:i]
            i = 0
        self._first = i
        return out

    def _declare_gap(self, ts_ns: int, upto: int | None = None) -> list:
        first_held = self._holes_starts[self._first] if self._held else None
        target = first_held if upto is None or (first_held is not None and first_held < upto) else upto
        if target is None or target <= self.next:
            return self._drain()
        gap = Gap(self.next, target - self.next, ts_ns)
        self.stats.gaps += 1
        self.stats.gap_bytes += gap.length
        self._remember(self.next, gap.length, ts_ns)
        self.next = target
        return [gap] + self._drain()

    def _remember(self, offset: int, length: int, ts_ns: int) -> None:
        if len(self.holes) < self.MAX_HOLES:
            self.holes.append((self.raw_seq(offset), length, ts_ns))
        else:
            self.holes_dropped += 1
