"""Repair stage: bytes that one capture point lost are taken from another point that captured them.

Two captures of one TCP connection carry the same bytes under the same sequence numbers. Where the reassembler of
one point (the lossy point) found a hole — bytes its peer acknowledged, or that a FIN proves were sent, but that
never reached this capture (`tcp.HalfStream.holes`) — the other point of a matched connection pair usually has
them. This stage, between the pairing of connections and that of exchanges (match.Pairing), before the clock:

1. plans the repairs: paired connections where one side has holes (`plan`);
2. reads the other point's capture once and keeps just the bytes that fill those holes (`borrow`);
3. reads the lossy capture once more and runs the sans-IO core (read/tcp.py, read/flows.py, mysql/) on just those
   connections, with each borrowed piece put into the stream where it belongs (`reread`): before the first
   segment of the lossy point that acknowledges it, or that follows it in the same direction;
4. replaces those connections' exchange rows and pairs the exchanges, once (`repair_losses`; with nothing to
   repair the exchanges are paired inside the same connection pairs, which are not made again).

Steps 2 and 3 are native where the fast lane reads the captures (fastlane.excerpt_scan / excerpt_copy /
ExcerptPlan): Python sees the keys of those connections' segments, not the segments, and the re-read is an
extraction by the lane of those connections' segments with the pieces put in, read straight from the capture (no
file is written: "reread natively" below). Where the lane cannot read a capture, Python reads it segment by
segment, with the same outcome.

A borrowed piece was seen at the other point, not here, so its time at the lossy point is unknown; it is bounded
by causality, at this point alone: it passed after the reverse-direction byte its ACK field acknowledges (its
sender had received that byte) and before the first reverse segment that acknowledges it (its receiver had it).
An exchange time that falls on a borrowed piece is never presented as a measurement: it is null in the exchange
row, its frame is 0, and explain/bounds.py's `apply_bounds` turns the bounds — tightened by the other point through the fitted clock
(the request reached the DB after the app sent it, the response left the DB before the app received it) — into
the decomposition's *_lo/*_hi columns, with `bounded` naming the points. Bytes lost at both points stay holes:
those exchanges keep their `gap` problems.

Cost: whole connections are re-read, not windows around the holes. A window would need the core's state at
its start (phase, prepared statements and their parameter types from earlier executes, EOF convention, exchange
ordinal, the connection's counters), which neither the lane nor the core can hand over or restore. With several
processes the lossy capture is scanned (`prescan`) while a worker borrows from the other one; with both points
lossy and giving to each other, each capture is scanned once for both its passes (`_scan_giving`), one here and
one in a worker that keeps its scan for its re-read (`_borrow_and_reread`): a capture is not scanned twice, and
two scans of two files overlap.

Limits: a connection that moved 2 GiB or more in either capture is not repaired (its sequence numbers may wrap,
and a byte range would then be ambiguous); at most tcp.HalfStream.MAX_HOLES holes per direction are remembered;
borrowed bytes are capped at MAX_BORROWED_BYTES per run (the rest stay holes, counted).
"""

from __future__ import annotations

import bisect
import gc
import os
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core.endpoints import split_endpoint
from ..core.memory import release_memory
from ..core.tables import concat
from ..core.times import timestamp_ns, ts_ns
from ..core.window import Window
from ..read import fastlane
from ..read.capture import open_capture
from ..read.exchanges import Extraction, extract
from ..read.tcp import SEQ_MOD
from .match import Matching, Pairing, connection_keys, first_rows, match_exchanges

HALF = 1 << 31
ACK = 0x10
MAX_BORROWED_BYTES = 256 << 20
WRAP_GUARD_BYTES = 1 << 31  # a connection that moved this much may wrap its sequence numbers: not repaired
HISTORY = 4096  # segments per direction remembered to find the time of an acknowledged byte

Flow4 = tuple[str, int, str, int]  # (client ip, client port, server ip, server port) as seen at one point


@dataclass(frozen=True)
class Job:
    """One connection to repair at one capture point (`lossy`), from its twin at the other point."""

    job: int
    lossy: str  # 'app' | 'db'
    capture: str  # the lossy point's capture file
    conn_index: int  # of the connection in that capture
    first_frame: int  # its first frame there
    last_ts: int  # its last frame's time there
    flow: Flow4  # at the lossy point
    other_capture: str
    other_flow: Flow4  # at the other point (differs behind NAT)
    other_first_ts: int
    other_last_ts: int
    holes: tuple[list, list]  # (client→server, server→client) [(raw seq, length, ts)] at the lossy point


@dataclass
class Piece:
    """Bytes of a hole as the other point captured them."""

    direction: int  # 0 client→server, 1 server→client
    seq: int  # raw sequence number of the first byte
    payload: bytes
    ack: int  # the ACK field of the segment that carried them (valid when flags has ACK)
    flags: int
    other_ts: int
    other_frame: int


@dataclass
class RepairStats:
    connections: int = 0  # connections re-read with borrowed bytes
    holes: int = 0  # holes at the lossy points of those connections
    pieces: int = 0  # borrowed pieces put into the streams
    bytes_borrowed: int = 0  # bytes taken from the other point
    bytes_unrepaired: int = 0  # hole bytes the other point did not have either (lost at both points), or beyond caps
    skipped_wrap: int = 0  # connections not repaired: 2 GiB or more (sequence numbers may wrap)
    exchanges_replaced: int = 0  # exchange rows of the repaired connections, before
    exchanges_repaired: int = 0  # exchange rows of the repaired connections, after
    exchanges_with_borrowed: int = 0  # of those, rows with borrowed bytes
    bounded_times: int = 0  # exchange times (first/last request/response byte) that are bounds

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def warnings(self) -> list[str]:
        out = []
        if self.bytes_borrowed:
            out.append(f"{self.bytes_borrowed} bytes one capture point lost were taken from the other "
                       f"({self.connections} connections re-read, {self.exchanges_with_borrowed} exchanges); "
                       f"{self.bounded_times} of their times are bounds, not measurements (column bounded)")
        if self.bytes_unrepaired:
            out.append(f"{self.bytes_unrepaired} bytes were lost at both capture points: the exchanges they belong "
                       "to are marked (problems gap) and not repaired")
        if self.skipped_wrap:
            out.append(f"{self.skipped_wrap} connections with holes moved 2 GiB or more: not repaired (their "
                       "sequence numbers may wrap)")
        return out


@dataclass
class PairTables:
    """The two points' tables and their pairing, handed to `repair_losses` by their only holder: it takes them out
    (`take`) and lets them go once it has replaced them, so that they are not held under the pairing's peak."""

    app_ex: pd.DataFrame | None
    db_ex: pd.DataFrame | None
    app_conns: pd.DataFrame | None
    db_conns: pd.DataFrame | None
    pairing: Pairing | Matching | None  # the connection pairs, the exchange pairs not made yet

    def take(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame, Pairing]:
        """The tables and the pairing, still held here until `let_go`."""
        return self.app_ex, self.db_ex, self.app_conns, self.db_conns, self.pairing

    def let_go(self) -> None:
        self.app_ex = self.db_ex = self.app_conns = self.db_conns = self.pairing = None


@dataclass
class Repair:
    """What `repair_losses` changed. Positions are rows of the returned app / DB exchange tables."""

    app_ex: pd.DataFrame
    db_ex: pd.DataFrame
    app_conns: pd.DataFrame
    db_conns: pd.DataFrame
    matching: Matching
    stats: RepairStats
    # bounds: one row per exchange time that is a bound: side ('app'|'db'), row (position in that side's table),
    # point ('req_first'|'req_last'|'resp_first'|'resp_last'), lo_ns, hi_ns (NaN when unknown), on that point's clock
    bounds: pd.DataFrame = field(default_factory=lambda: _no_bounds())
    # per side ('app'|'db'): the first row of each re-read capture's rows in that side's table, in the order they
    # were appended after the kept rows (match.row_key's repair job: the rows from reread_starts[side][j] on, up to
    # the next start, are job j's)
    reread_starts: dict = field(default_factory=dict)


def skipped(lossy: list[Extraction], why: str) -> dict:
    """summary.json → repair of a pair whose loss repair was not done (`why`, in words), rather than null (which says
    nothing was lost): the points that lost frames (`lossy`, their extractions), and of their holes
    (Extraction.holes: what the repair would have been given) the connections, the holes and their bytes, all left
    holes: the exchanges on them keep their `gap` problems, as bytes lost at both points do."""
    sides = [side for x in lossy for both in x.holes.values() for side in both]
    return {"skipped": True, "reason": why, "lossy_points": [x.capture for x in lossy],
            "connections": sum(len(x.holes) for x in lossy), "holes": sum(len(side) for side in sides),
            "bytes_unrepaired": sum(length for side in sides for _, length, _ in side)}


def _no_bounds() -> pd.DataFrame:
    return pd.DataFrame({"side": [], "row": np.array([], dtype=np.int64), "point": [], "lo_ns": [], "hi_ns": []})


# --- plan ------------------------------------------------------------------------------------------------------


def _flow4(client: str, server: str) -> Flow4:
    ci, cp = split_endpoint(client)
    si, sp = split_endpoint(server)
    return ci, cp, si, sp


def _conn_pairs(app_ex: pd.DataFrame, db_ex: pd.DataFrame, app_conns: pd.DataFrame, db_conns: pd.DataFrame,
                matching: Matching | Pairing, lossy: set[tuple[str, int]]) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """(app capture, conn_index) ↔ (DB capture, conn_index) of the same connection: matching's pairs, and for a
    connection with holes that matching could not pair (no exchange read at one point: its login was lost there),
    the one connection at the other point with the same greeting scramble."""
    def keyed(ex: pd.DataFrame, row_keys: np.ndarray) -> dict[int, tuple[str, int]]:
        first = first_rows(row_keys)  # one row per connection (np.unique's first rows, without its sort)
        captures = ex["capture"].iloc[first].astype(str).to_numpy()
        return {int(k): (c, int(i)) for k, c, i in zip(row_keys[first], captures, ex["conn_index"].to_numpy()[first])}

    if isinstance(matching, Pairing):  # the keys it made of these rows
        row_keys = matching.row_connections(app_ex, db_ex)
    else:
        row_keys = (connection_keys(app_ex).to_numpy(), connection_keys(db_ex).to_numpy())
    a_keys, d_keys = keyed(app_ex, row_keys[0]), keyed(db_ex, row_keys[1])
    del row_keys
    pairs = [(a_keys[int(a)], d_keys[int(d)]) for a, d in zip(matching.connections["app_conn"],
                                                             matching.connections["db_conn"])]
    paired = {p for pair in pairs for p in pair}
    if lossy - paired:
        def scrambles(conns: pd.DataFrame) -> dict[str, list[tuple[str, int]]]:
            out: dict[str, list[tuple[str, int]]] = {}
            for c, i, s in zip(conns["capture"].astype(str), conns["conn_index"], conns["scramble"]):
                if isinstance(s, str) and s:
                    out.setdefault(s, []).append((c, int(i)))
            return out

        a_scr, d_scr = scrambles(app_conns), scrambles(db_conns)
        for scramble, mine in a_scr.items():
            theirs = d_scr.get(scramble, [])
            if len(mine) == 1 and len(theirs) == 1 and (mine[0] in lossy or theirs[0] in lossy) \
                    and mine[0] not in paired and theirs[0] not in paired:
                pairs.append((mine[0], theirs[0]))
    return pairs


def plan(app_x: list[Extraction], db_x: Extraction, app_ex: pd.DataFrame, db_ex: pd.DataFrame,
         app_conns: pd.DataFrame, db_conns: pd.DataFrame, matching: Matching | Pairing) -> tuple[list[Job], int]:
    """The repairs to make: for every pair of twin connections, each side that has holes. Returns (jobs,
    connections skipped by the wrap guard)."""
    db_xs = db_x if isinstance(db_x, list) else [db_x]  # several DB points (servers) come as a list
    holes = {(x.capture, i): ("app", h) for x in app_x for i, h in x.holes.items()}
    holes.update({(x.capture, i): ("db", h) for x in db_xs for i, h in x.holes.items()})
    if not holes:
        return [], 0
    first_frames = {(x.capture, i): f for x in [*app_x, *db_xs] for i, f in x.flow_first_frames.items()}
    rows = {}
    for conns in (app_conns, db_conns):
        for r in conns.assign(capture=conns["capture"].astype(str)).to_dict("records"):
            rows[(r["capture"], int(r["conn_index"]))] = r
    jobs: list[Job] = []
    skipped = 0
    for a, d in _conn_pairs(app_ex, db_ex, app_conns, db_conns, matching, set(holes)):
        wanted = [(mine, other) for mine, other in ((a, d), (d, a)) if mine in holes]
        if not wanted or a not in rows or d not in rows:
            continue
        moved = max(int(r["mysql_bytes"] + r["unparsed_bytes"] + r["tls_bytes"] + r["gap_bytes"])
                    for r in (rows[a], rows[d]))
        if moved >= WRAP_GUARD_BYTES:
            skipped += 1
            continue
        for mine, other in wanted:
            m, o = rows[mine], rows[other]
            side, hole_list = holes[mine]
            jobs.append(Job(
                job=len(jobs), lossy=side, capture=mine[0], conn_index=mine[1], first_frame=first_frames[mine],
                last_ts=timestamp_ns(m["last_ts"]), flow=_flow4(m["client"], m["server"]), other_capture=other[0],
                other_flow=_flow4(o["client"], o["server"]), other_first_ts=timestamp_ns(o["first_ts"]),
                other_last_ts=timestamp_ns(o["last_ts"]), holes=hole_list))
    return jobs, skipped


# --- borrow: the other point's bytes for the holes ---------------------------------------------------------------


class _HoleSet:
    """The holes of one direction of one connection, as sorted intervals relative to an anchor (so that sequence
    numbers that wrap stay ordered: the connection moved less than 2 GiB, see WRAP_GUARD_BYTES)."""

    def __init__(self, holes: list):
        self.anchor = (holes[0][0] - HALF) % SEQ_MOD if holes else 0
        spans = sorted((self.rel(seq), self.rel(seq) + length) for seq, length, _ in holes if length > 0)
        self.starts = [a for a, _ in spans]
        self.ends = [b for _, b in spans]

    def rel(self, seq: int) -> int:
        return (seq - self.anchor) % SEQ_MOD

    def overlaps(self, seq: int, length: int) -> list[tuple[int, int]]:
        """The parts (relative start, end) of [seq, seq + length) that fall in a hole."""
        start = self.rel(seq)
        end = start + length
        i = bisect.bisect_right(self.starts, start) - 1
        i = max(i, 0)
        out = []
        while i < len(self.starts) and self.starts[i] < end:
            a, b = max(start, self.starts[i]), min(end, self.ends[i])
            if a < b:
                out.append((a, b))
            i += 1
        return out


def borrow(path: str | os.PathLike, wants: list[tuple[int, Flow4, int, int, tuple[list, list]]],
           budget: int = MAX_BORROWED_BYTES, scanned: list | None = None) -> dict[int, list[Piece]]:
    """One pass over the capture at `path`: for each (job, flow there, first_ts, last_ts, holes), the pieces of
    that connection's segments that fill its holes at the other point. A byte seen several times here keeps its
    first copy. At most `budget` bytes in all.

    Read natively where the lane can (fastlane.excerpt_scan: the keys of those connections' segments, then
    excerpt_copy: the payloads of just the segments that overlap a hole), else in Python; the same pieces.
    `scanned`: [keys, columns], an excerpt_scan of this capture for keys that include these connections'
    (_scan_giving), taken instead of a scan of its own."""
    by_four = _by_four(wants)
    taker = _Taker(budget)
    segments = _overlapping_segments(path, by_four, scanned)
    if segments is None:  # the lane cannot read this capture: every segment in Python
        with open_capture(path) as reader:
            segments = reader.segment_fields()
            for frame, ts, src_ip, src_port, dst_ip, dst_port, seq, ack, flags, payload, _ in segments:
                if payload:
                    entries = by_four.get((src_ip, src_port, dst_ip, dst_port))
                    if entries is not None:
                        taker.take(entries, frame, ts, seq, ack, flags, payload)
    else:
        for entries, frame, ts, seq, ack, flags, payload in segments:
            taker.take(entries, frame, ts, seq, ack, flags, payload)
    release_memory()
    return taker.found


def _by_four(wants: list) -> dict[tuple, list[tuple[int, int, int, int, tuple[_HoleSet, _HoleSet]]]]:
    """borrow's wants by address pair (each connection's two directions): (job, direction, first_ts, last_ts,
    hole sets)."""
    by_four: dict[tuple, list[tuple[int, int, int, int, tuple[_HoleSet, _HoleSet]]]] = {}
    for job, (ci, cp, si, sp), first_ts, last_ts, holes in wants:
        sets = (_HoleSet(holes[0]), _HoleSet(holes[1]))
        by_four.setdefault((ci, cp, si, sp), []).append((job, 0, first_ts, last_ts, sets))
        by_four.setdefault((si, sp, ci, cp), []).append((job, 1, first_ts, last_ts, sets))
    return by_four


class _Taker:
    """borrow's bookkeeping: the pieces found so far per job, the ranges already taken, the budget used."""

    def __init__(self, budget: int):
        self.budget = budget
        self.found: dict[int, list[Piece]] = {}
        self.kept: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (job, direction) -> relative ranges taken
        self.used = 0

    def take(self, entries: list, frame: int, ts: int, seq: int, ack: int, flags: int, payload: bytes) -> None:
        """A segment with payload of a wanted connection, in capture order: the parts of it that fill holes."""
        for job, direction, first_ts, last_ts, sets in entries:
            if not first_ts <= ts <= last_ts:
                continue
            holes = sets[direction]
            for a, b in holes.overlaps(seq, len(payload)):
                taken = self.kept.setdefault((job, direction), [])
                for a2, b2 in _minus(a, b, taken):
                    if self.used + (b2 - a2) > self.budget:
                        continue
                    offset = a2 - holes.rel(seq)
                    self.found.setdefault(job, []).append(Piece(
                        direction, (holes.anchor + a2) % SEQ_MOD, payload[offset:offset + b2 - a2], ack, flags,
                        ts, frame))
                    bisect.insort(taken, (a2, b2))
                    self.used += b2 - a2


def _overlapping_segments(path, by_four: dict[tuple, list], scanned: list | None = None) -> list[tuple] | None:
    """The segments of the capture at `path` that `by_four`'s connections carry and that overlap one of their
    holes (a superset of what borrow takes), in capture order: (entries, frame, ts, seq, ack, flags, payload).
    Read natively: the keys of every segment of those connections (`scanned`: a scan made for more keys), then
    the payloads of just these. None when the lane cannot read the capture."""
    keys = list(by_four)
    if scanned is not None:
        position = {k: i for i, k in enumerate(keys)}
        columns = list(scanned[1])
        # the scan's key numbers -> these keys' (-1: a connection the scan was also made for, not wanted here)
        columns[0] = np.array([position.get(k, -1) for k in scanned[0]], dtype=np.int64)[columns[0]]
    else:
        columns = fastlane.excerpt_scan(path, keys)
    if columns is None:
        return None
    key, frame, ts, seq, ack, flags, length, _ = columns
    wanted = np.zeros(len(key), dtype=bool)
    for k, entries in enumerate(by_four.values()):
        mine = np.flatnonzero((key == k) & (length > 0))
        for _, direction, first_ts, last_ts, sets in entries:
            holes = sets[direction]
            if not holes.starts or not len(mine):
                continue
            rows = mine[(ts[mine] >= first_ts) & (ts[mine] <= last_ts)]
            start = (seq[rows] - holes.anchor) % SEQ_MOD
            end = start + length[rows]
            below = np.searchsorted(np.asarray(holes.starts, dtype=np.int64), end, side="left")  # holes before end
            reach = np.maximum.accumulate(np.asarray(holes.ends, dtype=np.int64))
            wanted[rows[(below > 0) & (reach[np.maximum(below - 1, 0)] > start)]] = True
    rows = np.flatnonzero(wanted)
    if not len(rows):
        return []
    records = bytearray()
    copied = fastlane.excerpt_copy(path, keys, frame[rows], np.zeros(0, dtype=np.int64), [], records.extend)
    if copied != len(rows):
        return None
    payloads = fastlane.excerpt_payloads(bytes(records))
    entries = list(by_four.values())
    return [(entries[int(key[r])], int(frame[r]), int(ts[r]), int(seq[r]), int(ack[r]), int(flags[r]), p)
            for r, p in zip(rows, payloads, strict=True)]


def _minus(a: int, b: int, taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[a, b) without the sorted, non-overlapping ranges in `taken`."""
    out, cursor = [], a
    i = max(bisect.bisect_right(taken, (a, a)) - 1, 0)
    while i < len(taken) and taken[i][0] < b:
        x, y = taken[i]
        if y > cursor and x > cursor:
            out.append((cursor, min(x, b)))
        cursor = max(cursor, y)
        i += 1
    if cursor < b:
        out.append((cursor, b))
    return out


# --- reread: the lossy point's connections again, with the borrowed pieces -----------------------------------------


class _Direction:
    """One direction of a connection at the lossy point during the re-read: its relative sequence space, the
    pieces still to put in, and the recent segments (to time an acknowledged byte)."""

    def __init__(self, holes: list, pieces: list[Piece], ends: tuple[str, int, str, int]):
        self.ends = ends  # (src ip, src port, dst ip, dst port) of this direction at the lossy point
        self.anchor = (holes[0][0] - HALF) % SEQ_MOD if holes else None
        self.pending: deque[tuple[int, int, Piece]] = deque()
        self.recent: deque = deque(maxlen=HISTORY)  # (rel start, rel end, ts, borrowed id or -1)
        if self.anchor is not None:
            self.pending.extend(sorted(((self.rel(p.seq), self.rel(p.seq) + len(p.payload), p) for p in pieces),
                                       key=lambda e: e[0]))

    def rel(self, seq: int) -> int:
        return (seq - self.anchor) % SEQ_MOD

    def anchor_at(self, seq: int) -> None:
        if self.anchor is None:
            self.anchor = (seq - HALF) % SEQ_MOD


class _Connection:
    def __init__(self, job: Job, pieces: list[Piece]):
        ci, cp, si, sp = job.flow
        self.job = job
        self.dirs = (_Direction(job.holes[0], [p for p in pieces if p.direction == 0], (ci, cp, si, sp)),
                     _Direction(job.holes[1], [p for p in pieces if p.direction == 1], (si, sp, ci, cp)))
        self.awaiting: list[tuple[int, int, int]] = []  # (direction, rel end, borrowed id): upper bound not yet seen
        self.last_ts = 0
        self.put_in = 0  # pieces put in (segments that are not frames of this capture)
        self.borrowed: list[tuple[int, int, int]] = []  # (direction, raw seq, length) of the pieces put in


FIN, SYN, RST, PSH = 0x01, 0x02, 0x04, 0x08


def _reread_segments(path, jobs: list[Job], pieces: dict[int, list[Piece]], info: list[list],
                     conns: list[_Connection]):
    """The field tuples of the jobs' connections at the lossy point, in capture order, with the borrowed pieces put
    in. A piece goes in as a segment with frame number −(id + 1) and no ACK flag (what it acknowledges was seen at
    the other point, not here); `info[id]` = [lo_ns, hi_ns, piece] is filled in as its bounds become known."""
    by_four: dict[tuple, list[tuple[_Connection, int]]] = {}
    conns.extend(_Connection(job, pieces.get(job.job, [])) for job in jobs)
    for conn in conns:
        for direction in (0, 1):
            by_four.setdefault(conn.dirs[direction].ends, []).append((conn, direction))
    with open_capture(path) as reader:
        for fields in reader.segment_fields():
            frame, ts, src_ip, src_port, dst_ip, dst_port, seq, ack, flags, payload, missing = fields
            entries = by_four.get((src_ip, src_port, dst_ip, dst_port))
            if entries is None:
                continue
            for conn, direction in entries:
                if conn.job.first_frame <= frame and ts <= conn.job.last_ts:
                    break
            else:
                continue
            conn.last_ts = ts
            mine, other = conn.dirs[direction], conn.dirs[1 - direction]
            mine.anchor_at(seq)
            # pieces that must come first: the reverse direction's bytes this segment acknowledges (else the
            # reassembler would declare them a gap), and this direction's bytes before this segment's
            if other.pending and flags & ACK:
                yield from _put_in(conn, 1 - direction, other.rel(ack), ts, info)
            if mine.pending:
                if flags & RST:
                    yield from _put_in(conn, direction, SEQ_MOD * 2, ts, info)
                elif payload or flags & FIN:
                    yield from _put_in(conn, direction, mine.rel(seq) + 1, ts, info)
            if conn.awaiting and flags & ACK and other.anchor is not None:
                _upper_bounds(conn, 1 - direction, other.rel(ack), ts, info)
            if payload:
                start = mine.rel(seq)
                mine.recent.append((start, start + len(payload) + missing, ts, -1))
            yield fields
        for conn in conns:  # pieces nothing here acknowledged or followed: at the end, unbounded above
            for direction in (0, 1):
                yield from _put_in(conn, direction, SEQ_MOD * 2, conn.last_ts, info)


def _put_in(conn: _Connection, direction: int, before: int, ts: int, info: list[list]):
    """Yield, as segments, the pending pieces of `direction` that start before relative position `before`."""
    d, reverse = conn.dirs[direction], conn.dirs[1 - direction]
    while d.pending and d.pending[0][0] < before:
        start, end, piece = d.pending.popleft()
        if piece.flags & ACK and reverse.pending:
            # the reverse-direction pieces this one acknowledges were there before it (a response after its request)
            yield from _put_in(conn, 1 - direction, reverse.rel(piece.ack), ts, info)
        lo = _acknowledged_at(reverse, piece) if piece.flags & ACK else None
        ident = len(info)
        info.append([lo, None, piece])
        conn.awaiting.append((direction, end, ident))
        conn.put_in += 1
        conn.borrowed.append((direction, piece.seq, len(piece.payload)))
        d.recent.append((start, end, lo, ident))
        yield (-(ident + 1), ts, *d.ends, piece.seq, piece.ack, PSH, piece.payload, 0)


def _acknowledged_at(reverse: _Direction, piece: Piece) -> int | None:
    """When the reverse-direction byte that `piece` acknowledges (ack − 1) passed the lossy point: its sender had
    received it before sending `piece`. For a byte that was itself borrowed, that one's lower bound. None when the
    byte was not seen here recently."""
    if reverse.anchor is None:
        return None
    byte = reverse.rel((piece.ack - 1) % SEQ_MOD)
    for start, end, seen_ts, _ in reversed(reverse.recent):
        if start <= byte < end:
            return seen_ts
    return None


def _upper_bounds(conn: _Connection, direction: int, acked: int, ts: int, info: list[list]) -> None:
    """A segment acknowledging `direction` up to relative position `acked` passed at `ts`: every borrowed piece of
    that direction that it fully acknowledges had reached its receiver, so had passed here, before."""
    still = []
    for d, end, ident in conn.awaiting:
        if d == direction and end <= acked:
            info[ident][1] = ts
        else:
            still.append((d, end, ident))
    conn.awaiting = still


# --- reread natively: the same segments, through the lane -------------------------------------------------------
#
# _reread_segments reads the whole lossy capture in Python and feeds the jobs' connections, pieces put in, to the
# Python core: on a busy server, where every connection has some hole, that is both whole captures at Python's
# speed. The native re-read makes the same stream of segments without Python touching each one:
# 1. fastlane.excerpt_scan gives the keys (seq, ack, flags, lengths, time, frame) of the jobs' segments;
# 2. where each piece goes, and its bounds, follow from those keys (_Placement): a piece can only go in at a
#    segment whose own condition puts it in (its reverse ACK passes the piece's start, its direction's data
#    reaches it, an RST), so _reread_segments' steps are replayed at just those segments, and the causality bounds
#    are looked up in the keys;
# 3. extract reads those segments, pieces put in, with the lane (fastlane.ExcerptPlan: the records excerpt_copy
#    would write, read from the capture itself, so no temporary file of them, written and read again at the size
#    of the connections re-read); its frame numbers are mapped back (a piece's to −(id + 1), as
#    _reread_segments numbers them).
# The one difference in order: the pieces nothing acknowledged or followed go in right after their connection's
# last segment, not after the capture's last (the connections are independent, and so their times stay in order).
# Step 3 is not shared with the idle second process of --jobs 2 by connection (each half an excerpt plan of its
# own, the halves' tables joined as exchanges.merge_parts joins parts): both halves read the whole capture, and
# joining the halves and sending one back cost more than the half saved (docs/speed.md).


class _Keys:
    """The segments of one connection at the lossy point, in capture order, as arrays (excerpt_scan's columns)."""

    def __init__(self, rows: np.ndarray, direction: np.ndarray, columns: list[np.ndarray]):
        _, frame, ts, seq, ack, flags, length, missing = columns
        self.rows = rows  # positions in the scan
        self.direction = direction
        self.ts, self.seq, self.ack, self.flags = ts[rows], seq[rows], ack[rows], flags[rows]
        self.length, self.missing = length[rows], missing[rows]
        self.n = len(rows)


class _Placement:
    """_reread_segments' bookkeeping for one connection, replayed on its keys: where each piece goes (the position
    of the segment it goes in before; n: after the last) and its bounds (in `info`)."""

    def __init__(self, conn: _Connection, keys: _Keys, info: list[list]):
        self.conn, self.keys, self.info = conn, keys, info
        self.put: list[tuple[int, int, Piece]] = []  # (position, id, piece) in the order put in
        self.emitted: tuple[list, list] = ([], [])  # per direction: (position, rel start, rel end, lo, id) put in
        self.emitted_at: tuple[list, list] = ([], [])  # their positions (put in in position order: sorted)
        k = keys
        self.first_of = []  # per direction: the position of its first segment (anchor_at), n when none
        self.anchored = [conn.dirs[d].anchor is not None for d in (0, 1)]  # from its holes: from the start
        self.real = []  # per direction: positions, rel starts, rel ends, times of the segments with payload
        for d in (0, 1):
            mine = np.flatnonzero(k.direction == d)
            self.first_of.append(int(mine[0]) if len(mine) else k.n)
            direction = conn.dirs[d]
            if direction.anchor is None and len(mine):
                direction.anchor_at(int(k.seq[mine[0]]))
            with_payload = mine[k.length[mine] > 0]
            if direction.anchor is None:
                self.real.append(None)
                continue
            start = (k.seq[with_payload] - direction.anchor) % SEQ_MOD
            self.real.append((with_payload, start, start + k.length[with_payload] + k.missing[with_payload],
                              k.ts[with_payload]))

    def triggers(self) -> list[int]:
        """The positions where _reread_segments would put a piece in (a superset): for each piece, the first segment
        whose ACK passes its start (reverse direction), whose data or FIN reaches it, or an RST (its direction)."""
        k, out = self.keys, set()
        for d in (0, 1):
            direction = self.conn.dirs[d]
            if not direction.pending:
                continue
            starts = np.fromiter((start for start, _, _ in direction.pending), dtype=np.int64)
            first = np.full(len(starts), k.n, dtype=np.int64)
            acks = np.flatnonzero((k.direction == 1 - d) & (k.flags & ACK != 0))
            if len(acks):
                reach = np.maximum.accumulate((k.ack[acks] - direction.anchor) % SEQ_MOD)
                at = np.searchsorted(reach, starts, side="right")
                first = np.minimum(first, np.where(at < len(acks), acks[np.minimum(at, len(acks) - 1)], k.n))
            data = np.flatnonzero((k.direction == d) & ((k.length > 0) | (k.flags & FIN != 0)))
            if len(data):
                reach = np.maximum.accumulate((k.seq[data] - direction.anchor) % SEQ_MOD)
                at = np.searchsorted(reach, starts, side="left")
                first = np.minimum(first, np.where(at < len(data), data[np.minimum(at, len(data) - 1)], k.n))
            resets = np.flatnonzero((k.direction == d) & (k.flags & RST != 0))
            if len(resets):
                first = np.minimum(first, resets[0])
            out.update(int(p) for p in first if p < k.n)
        return sorted(out)

    def run(self) -> None:
        conn, k = self.conn, self.keys
        for p in self.triggers():
            direction = int(k.direction[p])
            mine, other = conn.dirs[direction], conn.dirs[1 - direction]
            flags, ts = int(k.flags[p]), int(k.ts[p])
            if other.pending and flags & ACK:
                self.put_in(1 - direction, other.rel(int(k.ack[p])), p, ts)
            if mine.pending:
                if flags & RST:
                    self.put_in(direction, SEQ_MOD * 2, p, ts)
                elif k.length[p] or flags & FIN:
                    self.put_in(direction, mine.rel(int(k.seq[p])) + 1, p, ts)
        conn.last_ts = int(k.ts[-1])
        for direction in (0, 1):
            self.put_in(direction, SEQ_MOD * 2, k.n, conn.last_ts)
        self.upper_bounds()

    def put_in(self, direction: int, before: int, at: int, ts: int) -> None:
        """_put_in at the segment at position `at`."""
        conn = self.conn
        d, reverse = conn.dirs[direction], conn.dirs[1 - direction]
        while d.pending and d.pending[0][0] < before:
            start, end, piece = d.pending.popleft()
            if piece.flags & ACK and reverse.pending:
                self.put_in(1 - direction, reverse.rel(piece.ack), at, ts)
            lo = self.acknowledged_at(1 - direction, piece, at) if piece.flags & ACK else None
            ident = len(self.info)
            self.info.append([lo, None, piece])
            conn.put_in += 1
            conn.borrowed.append((direction, piece.seq, len(piece.payload)))
            self.emitted[direction].append((at, start, end, lo, ident))
            self.emitted_at[direction].append(at)
            self.put.append((at, ident, piece))

    def acknowledged_at(self, r: int, piece: Piece, at: int) -> int | None:
        """_acknowledged_at: the time of the latest of direction r's last HISTORY entries (its segments with payload
        before position `at`, and its pieces put in so far) that holds the byte `piece` acknowledges."""
        reverse = self.conn.dirs[r]
        if reverse.anchor is None or (not self.anchored[r] and self.first_of[r] > at):
            return None
        byte = reverse.rel((piece.ack - 1) % SEQ_MOD)
        positions, starts, ends, times = self.real[r]
        n_real = int(np.searchsorted(positions, at, side="left"))
        pieces = self.emitted[r]
        total = n_real + len(pieces)
        oldest = total - HISTORY  # entries at this ordinal or later are remembered
        best_ordinal, best = -1, None
        low = max(n_real - HISTORY, 0)
        # the latest segment that holds the byte: almost always among the last few (the byte just before the
        # piece's ACK), so those are looked at first
        near = max(n_real - 32, low)
        hit = np.flatnonzero((starts[near:n_real] <= byte) & (byte < ends[near:n_real]))
        if len(hit):
            hit += near - low
        elif near > low:
            hit = np.flatnonzero((starts[low:near] <= byte) & (byte < ends[low:near]))
        if len(hit):
            j = low + int(hit[-1])
            ordinal = j + bisect.bisect_right(self.emitted_at[r], int(positions[j]))  # pieces before it
            if ordinal >= oldest:
                best_ordinal, best = ordinal, int(times[j])
        for i in range(len(pieces) - 1, -1, -1):
            # piece i's ordinal is at most n_real + i, and falls with i: once that cannot beat the best (or is
            # forgotten), no earlier piece can
            if n_real + i <= best_ordinal or n_real + i < oldest:
                break
            p_at, start, end, lo, _ = pieces[i]
            if start <= byte < end:
                ordinal = int(np.searchsorted(positions, p_at, side="left")) + i
                if ordinal >= oldest and ordinal > best_ordinal:
                    best_ordinal, best = ordinal, lo
                break
        return best

    def upper_bounds(self) -> None:
        """_upper_bounds: a piece's upper bound is the time of the first segment, from the one it went in before,
        whose ACK (reverse direction) covers its end."""
        k = self.keys
        for d in (0, 1):
            if not self.emitted[d]:
                continue
            anchor = self.conn.dirs[d].anchor
            acks = np.flatnonzero((k.direction == 1 - d) & (k.flags & ACK != 0))
            reach = (k.ack[acks] - anchor) % SEQ_MOD
            # the first ACK at or after a piece's position that covers its end is the first of all ACKs whose
            # running maximum covers it, unless an ACK before the piece already did (then: searched for)
            most = np.maximum.accumulate(reach) if len(reach) else reach
            emitted = self.emitted[d]
            since = np.searchsorted(acks, np.fromiter((e[0] for e in emitted), np.int64, len(emitted)), side="left")
            first = np.searchsorted(most, np.fromiter((e[2] for e in emitted), np.int64, len(emitted)), side="left")
            for (at, _, end, _, ident), i, f in zip(emitted, since.tolist(), first.tolist()):
                if f >= i:
                    if f < len(acks):
                        self.info[ident][1] = int(k.ts[acks[f]])
                    continue
                step = 64
                while i < len(acks):
                    hit = np.flatnonzero(reach[i:i + step] >= end)
                    if len(hit):
                        self.info[ident][1] = int(k.ts[acks[i + int(hit[0])]])
                        break
                    i += step
                    step *= 2


def _reread_keys(jobs: list[Job]) -> list[Flow4] | None:
    """The address pairs _reread_natively scans for the jobs, in its order; None when two jobs share one."""
    keys = []
    for job in jobs:
        ci, cp, si, sp = job.flow
        keys += [(ci, cp, si, sp), (si, sp, ci, cp)]
    return keys if len(set(keys)) == len(keys) else None


def prescan(path: str | os.PathLike, jobs: list[Job]) -> list | None:
    """[keys, columns]: fastlane.excerpt_scan of the jobs' connections in the capture at `path`, made before their
    pieces are known (while another process borrows them, repair_losses) for reread to take. None when the lane
    cannot read the capture or two jobs share an address pair."""
    keys = _reread_keys(jobs)
    if keys is None:
        return None
    columns = fastlane.excerpt_scan(path, keys)
    return None if columns is None else [keys, columns]


def _scan_giving(path: str | os.PathLike, wants: list, jobs: list[Job]) -> tuple[list | None, list | None]:
    """A capture that is lossy and gives to the other point (both points lossy): one excerpt_scan for both passes
    over it, (for borrow of `wants`, for reread of `jobs` as prescan makes it), where each pass scanned it
    (a scan reads the whole capture). (None, None) when the lane cannot read it; the second None
    when two jobs share an address pair."""
    taking = _reread_keys(jobs)
    keys = list(taking or [])
    known = set(keys)
    keys += [k for k in _by_four(wants) if k not in known]
    columns = fastlane.excerpt_scan(path, keys)
    if columns is None:
        return None, None
    if taking is None:
        return [keys, columns], None
    if len(keys) == len(taking):
        return [keys, columns], [taking, columns]
    mine = columns[0] < len(taking)  # the re-read's keys come first: their numbers are the same
    return [keys, columns], [taking, [c[mine] for c in columns]]


def _give_and_scan(path: str | os.PathLike, wants: list, jobs: list[Job]) -> tuple[dict[int, list[Piece]], list | None]:
    """borrow from the capture at `path`, and the scan for its own reread (_scan_giving)."""
    giving, taking = _scan_giving(path, wants, jobs)
    return borrow(path, wants, scanned=giving), taking


_KEPT: dict[str | os.PathLike, list | None] = {}  # in a worker: the scan _give_and_keep made, for its _reread_kept


def _give_and_keep(path: str | os.PathLike, wants: list, jobs: list[Job]) -> dict[int, list[Piece]]:
    """_give_and_scan in a worker that keeps the scan for the reread it is given next (core.workers.Worker)."""
    found, _KEPT[path] = _give_and_scan(path, wants, jobs)
    return found


def _reread_kept(path: str | os.PathLike, jobs: list[Job], pieces: dict[int, list[Piece]], servers: set | None,
                 max_sql_bytes: int, tls_secrets=None, window: Window | None = None):
    """reread, in the worker that scanned the capture (_give_and_keep)."""
    return reread(path, jobs, pieces, servers, max_sql_bytes, _KEPT.pop(path, None), tls_secrets, window)


def _reread_natively(path: str | os.PathLike, jobs: list[Job], pieces: dict[int, list[Piece]], servers: set, max_sql_bytes: int,
                     info: list[list], conns: list[_Connection], scanned: list | None = None,
                     tls_secrets=None, window: Window | None = None) -> Extraction | None:
    """reread's extraction through the lane (see above): the jobs' connections of the capture at `path` with the
    pieces put in, frames numbered as _reread_segments numbers them. None when the lane cannot read the capture,
    or in a case this does not make the same stream: several jobs on one address pair (a port reused), a job with
    no segment here, damage before the last chosen segment. (The times are the capture's, checked once as
    extraction checks them, as in _reread_segments.) `scanned`: prescan's answer, taken (emptied) when it is of the
    same connections."""
    conns.extend(_Connection(job, pieces.get(job.job, [])) for job in jobs)
    by_four: dict[tuple, tuple[_Connection, int]] = {}
    for conn in conns:
        for direction in (0, 1):
            if conn.dirs[direction].ends in by_four:
                return None
            by_four[conn.dirs[direction].ends] = (conn, direction)
    keys = list(by_four)
    if scanned and scanned[0] == keys:
        columns = scanned[1]
    else:
        columns = fastlane.excerpt_scan(path, keys)
    if scanned:
        scanned.clear()  # the columns are let go below: not kept alive by the caller's list
    if columns is None:
        return None
    key, frame, ts = columns[:3]
    kept = np.zeros(len(key), dtype=bool)
    placements = []
    for i in range(0, len(keys), 2):
        conn = by_four[keys[i]][0]
        rows = np.flatnonzero(((key == i) | (key == i + 1)) & (frame >= conn.job.first_frame)
                              & (ts <= conn.job.last_ts))
        if not len(rows):
            return None
        kept[rows] = True
        placements.append(_Placement(conn, _Keys(rows, (key[rows] == i + 1).astype(np.int8), columns), info))
    for placement in placements:
        placement.run()
    rows = np.flatnonzero(kept)
    ordinal = np.full(len(key), -1, dtype=np.int64)
    ordinal[rows] = np.arange(len(rows))
    inserts = []  # (ordinal of the segment it goes before, 0 after a connection's last segment / 1 before, id, record)
    for placement in placements:
        k, ends = placement.keys, placement.conn.dirs
        for at, ident, piece in placement.put:
            if at < k.n:
                where, rank, when = int(ordinal[k.rows[at]]), 1, int(k.ts[at])
            else:
                where, rank, when = int(ordinal[k.rows[-1]]) + 1, 0, placement.conn.last_ts
            # a segment with PSH alone (no ACK: what its ACK field acknowledges was seen at the other point)
            record = fastlane.excerpt_record(ends[piece.direction].ends, when, piece.seq, piece.ack, PSH,
                                             piece.payload)
            inserts.append((where, rank, ident, record))
    inserts.sort(key=lambda e: e[:2])  # stable: the pieces of one place in the order put in
    insert_at = np.fromiter((e[0] for e in inserts), dtype=np.int64, count=len(inserts))
    pieces_ids = np.fromiter((e[2] for e in inserts), dtype=np.int64, count=len(inserts))
    # The scan's columns and the placements' copies of them are done with: let them go before the excerpt is
    # extracted (kept, they would lie under that extraction's own peak, which is the run's peak with --jobs 1).
    plan = fastlane.ExcerptPlan(keys, frame[rows], insert_at, [e[3] for e in inserts])
    del columns, key, frame, ts, kept, ordinal, placements, placement, k, ends, inserts
    x = extract(path, servers=servers, max_sql_bytes=max_sql_bytes, excerpt=plan, tls_secrets=tls_secrets,
                window=window)
    # the excerpt's frame numbers (from 1) -> the capture's, a piece's −(id + 1)
    n_frames = len(plan.frames)
    numbers = np.empty(n_frames + len(insert_at), dtype=np.int64)
    numbers[np.arange(n_frames) + np.searchsorted(insert_at, np.arange(n_frames), side="right")] = plan.frames
    numbers[insert_at + np.arange(len(insert_at))] = -(pieces_ids + 1)
    del plan
    if x.stats.frames != len(numbers) or x.stats.damaged:  # a chosen frame not met (damage before it)
        return None
    for _, _, column in TIME_COLUMNS:
        values = x.exchanges[column]
        raw = values.to_numpy(dtype="float64", na_value=np.nan)
        ok = np.flatnonzero(raw >= 1)
        mapped = raw.copy()
        mapped[ok] = numbers[raw[ok].astype(np.int64) - 1]
        x.exchanges[column] = pd.Series(mapped, index=values.index).astype(values.dtype)
    x.flow_first_frames = {i: int(numbers[f - 1]) if f >= 1 else f for i, f in x.flow_first_frames.items()}
    return x


TIME_COLUMNS = (("req_first", "req_first_ts", "req_first_frame"), ("req_last", "req_last_ts", "req_last_frame"),
                ("resp_first", "resp_first_ts", "resp_first_frame"), ("resp_last", "resp_last_ts", "resp_last_frame"))


def reread(path: str | os.PathLike, jobs: list[Job], pieces: dict[int, list[Piece]], servers: set | None,
           max_sql_bytes: int, scanned: list | None = None, tls_secrets=None,
           window: Window | None = None) -> tuple[Extraction, pd.DataFrame, int]:
    """Extract the jobs' connections from the lossy capture again, holes filled with the borrowed pieces.
    `scanned`: prescan's answer for this capture, when there is one. `tls_secrets`: the key log, so a TLS
    connection is decrypted again as its first reading was (the borrowed bytes are the same TLS records).
    `window` (analyze --since/--until): the exchanges kept, as the first reading kept them.

    Returns the extraction (conn_index as in the first extraction), the bounds of the exchange times that fell on
    borrowed pieces (rows: row position in the extraction's exchanges, point, lo_ns, hi_ns; those times are null
    and their frames 0 in the table), and how many borrowed bytes were put in."""
    info: list[list] = []
    conns: list[_Connection] = []
    endpoints = {(job.flow[2], job.flow[3]) for job in jobs}
    x = _reread_natively(path, jobs, pieces, servers or endpoints, max_sql_bytes, info, conns, scanned, tls_secrets,
                         window)
    if x is None:  # the lane cannot read this capture (or an odd case): the segments in Python
        info.clear()
        conns.clear()
        x = extract(path, servers=servers or endpoints, max_sql_bytes=max_sql_bytes, tls_secrets=tls_secrets,
                    segments=_reread_segments(path, jobs, pieces, info, conns), window=window)
    by_first = {job.first_frame: job for job in jobs}
    put_in = {c.job.conn_index: c.put_in for c in conns}
    index_of = {index: by_first[frame].conn_index for index, frame in x.flow_first_frames.items() if frame in by_first}
    ex = _renumbered(x.exchanges, index_of)
    table = _renumbered(x.connections, index_of)
    table["frames"] -= table["conn_index"].map(put_in).fillna(0).astype("int64")  # pieces are not frames here
    x.exchanges, x.connections = ex, table
    bounds = _take_bounds(ex, info)
    x.holes = {index_of[i]: h for i, h in x.holes.items() if i in index_of}
    touched = _with_pieces(ex, conns)
    return x, bounds, touched, (len(info), sum(len(p.payload) for _, _, p in info))


def _renumbered(table: pd.DataFrame, index_of: dict[int, int]) -> pd.DataFrame:
    """The rows of `table` whose conn_index is a key of `index_of`, numbered by it. (The re-read file holds just the
    jobs' connections, so usually every row: then the rows are not copied.)"""
    index = table["conn_index"].to_numpy()
    if not len(index_of):
        lookup = np.zeros(0, dtype=np.int64)
    else:
        lookup = np.full(max(max(index_of), int(index.max()) if len(index) else 0) + 1, -1, dtype=np.int64)
        lookup[list(index_of)] = list(index_of.values())
    renumbered = lookup[index] if len(index) else np.zeros(0, dtype=np.int64)
    mine = renumbered >= 0
    out = table.reset_index(drop=True) if mine.all() else table[mine].reset_index(drop=True)
    out["conn_index"] = renumbered[mine]
    return out


def _with_pieces(ex: pd.DataFrame, conns: list[_Connection]) -> np.ndarray:
    """Positions of the rows of `ex` whose request or response bytes include a borrowed piece."""
    hit = np.zeros(len(ex), dtype=bool)
    index = ex["conn_index"].to_numpy()
    spans = ((0, ex["req_tcp_seq"].to_numpy(dtype="float64"), ex["bytes_req"].to_numpy(dtype="float64")),
             (1, ex["resp_tcp_seq"].to_numpy(dtype="float64", na_value=np.nan),
              ex["resp_tcp_end"].to_numpy(dtype="float64", na_value=np.nan)
              - ex["resp_tcp_seq"].to_numpy(dtype="float64", na_value=np.nan)))
    for c in conns:
        mine = np.flatnonzero(index == c.job.conn_index)
        for direction, seq, length in spans:
            d = c.dirs[direction]
            borrowed = sorted((d.rel(s), d.rel(s) + n) for dd, s, n in c.borrowed if dd == direction)
            if not borrowed or not len(mine):
                continue
            starts = np.array([a for a, _ in borrowed], dtype=np.int64)
            ends = np.array([b for _, b in borrowed], dtype=np.int64)
            ok = ~np.isnan(seq[mine]) & ~np.isnan(length[mine])
            rows = mine[ok]
            a = (seq[rows].astype(np.int64) - d.anchor) % SEQ_MOD
            b = a + length[rows].astype(np.int64) % SEQ_MOD
            last = np.searchsorted(starts, b, side="left") - 1
            hit[rows] |= (last >= 0) & (ends[np.maximum(last, 0)] > a)
    return np.flatnonzero(hit)


def _take_bounds(ex: pd.DataFrame, info: list[list]) -> pd.DataFrame:
    """Times of `ex` that fell on a borrowed piece (negative frame): set null (frame 0), bounds returned."""
    rows, points, los, his = [], [], [], []
    touched = np.zeros(len(ex), dtype=bool)
    for point, ts_col, frame_col in TIME_COLUMNS:
        frames = ex[frame_col].to_numpy(dtype="float64", na_value=np.nan)
        hit = np.flatnonzero(frames < 0)
        if not len(hit):
            continue
        touched[hit] = True
        for r, f in zip(hit, frames[hit]):
            lo, hi, _ = info[int(-f) - 1]
            rows.append(int(r))
            points.append(point)
            los.append(np.nan if lo is None else float(lo))
            his.append(np.nan if hi is None else float(hi))
        ts = ex[ts_col].copy()
        ts.iloc[hit] = pd.NaT
        ex[ts_col] = ts
        fr = ex[frame_col].copy()
        fr.iloc[hit] = 0
        ex[frame_col] = fr
    if touched.any():
        req_first, rf_ok = ts_ns(ex["req_first_ts"])
        req_last, rl_ok = ts_ns(ex["req_last_ts"])
        resp_first, sf_ok = ts_ns(ex["resp_first_ts"])
        resp_last, sl_ok = ts_ns(ex["resp_last_ts"])
        ex["response_s"] = np.where(rf_ok & sl_ok, (resp_last - req_first) / 1e9, np.nan)
        ex["ttfb_s"] = np.where(rl_ok & sf_ok, (resp_first - req_last) / 1e9, np.nan)
    return pd.DataFrame({"row": np.asarray(rows, dtype=np.int64), "point": points,
                         "lo_ns": np.asarray(los, dtype=np.float64), "hi_ns": np.asarray(his, dtype=np.float64)})


# --- the stage ----------------------------------------------------------------------------------------------------


def _borrow_and_reread(todo: list[Job], where: dict, servers: set | None, max_sql_bytes: int, jobs: int,
                       tls_secrets=None, window: Window | None = None) -> tuple[list[Job], list[str], list]:
    """repair_losses' passes over the captures: 1. the other points' bytes for the jobs' holes (`borrow`, one pass
    per capture that has some to give), 2. the lossy points' connections again with them (`reread`, one pass per
    lossy capture). `where`: capture name -> what reads it (Extraction.source: a capture point of several files is
    read as one stream). Returns the jobs that got bytes, the captures re-read and reread's results for them."""
    from ..core.workers import Worker, run_all, run_beside

    givers = sorted({j.other_capture for j in todo})
    wants = {c: [(j.job, j.other_flow, j.other_first_ts, j.other_last_ts, j.holes) for j in todo
                 if j.other_capture == c] for c in givers}
    lossy = sorted({j.capture for j in todo})

    def of(capture: str, among: list[Job]) -> list[Job]:
        return [j for j in among if j.capture == capture]

    with ExitStack() as stack:
        kept: dict[str, list | None] = {}  # per lossy capture, a scan of its jobs' connections for its reread here
        there = None  # the lossy capture the worker scanned and keeps the scan of
        if len(lossy) == 1 and jobs > 1:
            # the one lossy capture's connections are scanned here while workers borrow (two passes over two files
            # overlap; its reread runs in this process then, below)
            kept[lossy[0]], found_all = run_beside(borrow, [(where[c], w) for c, w in wants.items()], jobs,
                                                   lambda: prescan(where[lossy[0]], todo))
        elif len(lossy) == 2 and lossy == givers and jobs > 1:
            # both points lossy, each a giver too: each capture is scanned once for what it gives and its own
            # reread, one here and one in a worker that keeps its scan until it rereads
            here, there = lossy
            worker = stack.enter_context(Worker())
            future = worker.submit(_give_and_keep, where[there], wants[there], of(there, todo))
            found_here, kept[here] = _give_and_scan(where[here], wants[here], of(here, todo))
            found_all = [found_here, future.result()]
            del found_here
        else:
            found_all = run_all(borrow, [(where[c], w) for c, w in wants.items()], jobs)
        pieces: dict[int, list[Piece]] = {}
        for found in found_all:
            pieces.update(found)
        del found_all
        # A connection the other point has none of the missing bytes of (lost at both points) would be read again,
        # in Python and whole, into the rows it already has: only connections with pieces are read again. (When a
        # busy server's tcpdumps drop packets at both points, that would be every connection at both points: the
        # whole of both captures read again at Python's speed.)
        todo = [j for j in todo if pieces.get(j.job)]
        takers = sorted({j.capture for j in todo})
        calls = [(where[c], of(c, todo), {j.job: pieces[j.job] for j in of(c, todo)}, servers, max_sql_bytes,
                  kept.pop(c, None), tls_secrets, window)
                 for c in takers]  # a worker is sent the pieces of its own jobs only
        kept.clear()
        del pieces
        if there in takers:
            mine = next(call for call in calls if call[0] == where[there])
            future = worker.submit(_reread_kept, *mine[:5], tls_secrets, window)
            del mine
            done = {call[0]: reread(*call) for call in calls if call[0] != where[there]}
            calls.clear()
            done[where[there]] = future.result()
            results = [done.pop(where[c]) for c in takers]
        elif len(calls) > 1 and jobs > 1:
            # several lossy points (each re-read is a whole extraction): the first here while workers take the
            # others, so one result less is pickled across
            here_call = calls.pop(0)
            first, others = run_beside(reread, calls, jobs, lambda: reread(*here_call))
            results = [first, *others]
            del here_call, first, others
        else:
            results = run_all(reread, calls, jobs)
        del calls
    return todo, takers, results


def repair_losses(app_x: list[Extraction], db_x: Extraction, handed: PairTables, servers: set | None,
                  max_sql_bytes: int, jobs: int = 1, tls_secrets=None, window: Window | None = None
                  ) -> Repair | None:
    """Fill each matched connection's holes at one point with the other point's bytes, re-read those connections,
    replace their rows and pair their exchanges. None when there is nothing to repair. `handed`: the tables and
    their pairing (PairTables), emptied when they are replaced, so the replaced tables are let go before the
    exchanges are paired. The exchanges are paired once: after the repair, or from the pairing when nothing was
    repaired. `window` (analyze --since/--until): the re-read connections keep its exchanges alone, as their first
    reading did (which gave the repair only the holes found in the window and its margin)."""
    app_ex, db_ex, app_conns, db_conns, pairing = handed.take()
    todo, skipped = plan(app_x, db_x, app_ex, db_ex, app_conns, db_conns, pairing)
    if not todo:
        return None if not skipped else Repair(app_ex, db_ex, app_conns, db_conns, pairing.complete(),
                                               RepairStats(skipped_wrap=skipped))
    pairing.release(tables=False)  # what it made of the rows, beside the passes below (made again if unrepaired)
    hole_bytes = sum(length for j in todo for side in j.holes for _, length, _ in side)
    where = {x.capture: x.source for x in [*app_x, *(db_x if isinstance(db_x, list) else [db_x])]}
    todo, takers, results = _borrow_and_reread(todo, where, servers, max_sql_bytes, jobs, tls_secrets, window)
    stats = RepairStats(skipped_wrap=skipped, connections=len(todo),
                        holes=sum(len(j.holes[0]) + len(j.holes[1]) for j in todo))
    if not todo:
        stats.bytes_unrepaired = hole_bytes
        return Repair(app_ex, db_ex, app_conns, db_conns, pairing.complete(), stats)
    pairing.release()  # its tables are replaced below
    del pairing
    release_memory()
    sides = {"app": [app_ex, app_conns], "db": [db_ex, db_conns]}
    bounds, marks = [], []
    reread_starts: dict[str, list[int]] = {}
    lossy_side = {j.capture: j.lossy for j in todo}
    for side, (table, conns) in sides.items():
        mine = [(capture, result) for capture, result in zip(takers, results) if lossy_side[capture] == side]
        if not mine:
            continue
        stale = np.zeros(len(table), dtype=bool)
        stale_c = np.zeros(len(conns), dtype=bool)
        for capture, _ in mine:
            again = {j.conn_index for j in todo if j.capture == capture}
            stale |= _named_as(table["capture"], capture) & table["conn_index"].isin(again).to_numpy()
            stale_c |= _named_as(conns["capture"], capture) & conns["conn_index"].isin(again).to_numpy()
        kept = table[~stale]
        offset = len(kept)
        new_rows, new_conns = [], []
        for _, (x, b, touched, (n_pieces, used)) in mine:
            stats.exchanges_repaired += len(x.exchanges)
            stats.bytes_borrowed += used
            stats.pieces += n_pieces
            stats.exchanges_with_borrowed += len(touched)
            bounds.append(b.assign(side=side, row=b["row"].to_numpy() + offset))
            marks.append((side, touched + offset))
            reread_starts.setdefault(side, []).append(offset)
            offset += len(x.exchanges)
            new_rows.append(_like(x.exchanges, table))
            new_conns.append(_like(x.connections, conns))
        stats.exchanges_replaced += int(stale.sum())
        sides[side] = [concat([kept, *new_rows]), concat([conns[~stale_c], *new_conns])]
        del kept, new_rows, new_conns, table, conns, x
    stats.bytes_unrepaired = max(hole_bytes - stats.bytes_borrowed, 0)
    (app_ex, app_conns), (db_ex, db_conns) = sides["app"], sides["db"]
    bound_rows = pd.concat(bounds, ignore_index=True) if bounds else _no_bounds()
    stats.bounded_times = len(bound_rows)
    # The re-read's tables, their copies and the kept rows are in the new tables now: let them go before the match
    # builds its own (else they are part of the run's peak).
    del results, mine, sides
    handed.let_go()
    gc.collect()  # the re-read's frames sit in reference cycles: counting alone does not free them
    release_memory()
    matching = match_exchanges(app_ex, db_ex, app_conns, db_conns)
    for side, rows in marks:  # say which exchanges hold bytes taken from the other point
        mine = matching.app_row if side == "app" else matching.db_row
        # np.isin(mine, rows) & (mine >= 0) by a mask of the table's rows: isin sorts both (150 s pair: 3.3 M)
        taken = np.zeros(max(len(app_ex if side == "app" else db_ex), int(rows.max(initial=-1)) + 1), dtype=bool)
        taken[rows] = True
        marked = (mine >= 0) & taken[np.maximum(mine, 0)]
        del taken
        note = f"repaired-at-{side}"
        matching.notes[marked] = [f"{n},{note}" if n else note for n in matching.notes[marked]]
    return Repair(app_ex, db_ex, app_conns, db_conns, matching, stats, bound_rows, reread_starts)


def _named_as(column: pd.Series, capture: str) -> np.ndarray:
    """Rows whose `capture` is `capture` (compared on the column as it is: no text made per row)."""
    return (column == capture).to_numpy(dtype=bool, na_value=False)


def _like(new: pd.DataFrame, old: pd.DataFrame) -> pd.DataFrame:
    """`new` with `old`'s column dtypes (the extraction's own tables hold the same columns)."""
    out = new[list(old.columns)]  # copy-on-write: the selection copies nothing, and concat copies it once after
    for c in old.columns:
        if str(out[c].dtype) != str(old[c].dtype) and not isinstance(old[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].astype(old[c].dtype)
    return out
