"""The clocks of the capture points: one model per app point and DB point with matched connections, fitted from
the TCP segments both points saw of those connections (read_segments_of, pair_segments, clock.estimate_clock:
the model and its fit). The samples are reduced to hulls as they are paired, a chunk of segments at a time
(clock.clock_hulls), and the fit reads the hull of the hulls (clock.fit_hulls); they are held whole only where that
fit is not estimate_clock's (_fitted_clock). The pass over the captures for the segments starts ahead on the
workers as soon as the extraction is done (start_segment_passes) and is taken by fit_clocks when the connections it
read are the matched ones; else the points are read again for their matched connections."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.endpoints import split_endpoint
from ..core.memory import release_memory
from ..core.tables import concat
from ..core.workers import Ahead, run_all
from ..read import extract
from ..read.capture import open_capture
from ..read.fastlane import segment_keys
from ..read.sources import CapturePoint
from .clock import ClockModel, clock_hulls, combined_hulls, estimate_clock, fit_hulls
from .match import SpilledKeys, connection_keys, first_rows


def _flows(conns: pd.DataFrame) -> set[tuple[str, int, str, int]]:
    out = set()
    for client, server in zip(conns["client"], conns["server"]):
        ci, cp = split_endpoint(client)
        si, sp = split_endpoint(server)
        out.add((ci, cp, si, sp))
    return out


def pair_key(app: str, db: str) -> str:
    """The name of the clock between an app point and a DB point (summary.json → clocks, with several DB points)."""
    return f"{app} ↔ {db}"


def fit_clocks(app_pts: list[CapturePoint], db_pts: list[CapturePoint], app_x: list, db_xs: list,
               app_ex: pd.DataFrame, db_ex: pd.DataFrame, app_conns: pd.DataFrame, db_conns: pd.DataFrame, matching,
               runner, jobs: int, note, read_ahead: dict | None = None, around: tuple[int, int] | None = None
               ) -> tuple[dict[str, ClockModel], dict[str, dict]]:
    """One clock model per app point and DB point with matched connections, keyed by the app point (one DB point)
    or `pair_key` (several), and its summary.json → clocks entry. `read_ahead`: start_segment_passes's passes, used
    for a point whose matched connections are the ones it read. `around`: with analyze --since/--until, the
    window with its margin (core.window.Window.around): the samples are taken from it alone."""
    release_memory()  # what the matching freed (its candidates, the completed matching's making), before the passes
    return matched_clocks(app_pts, db_pts, app_x, db_xs, matching.connections, _conn_table(app_ex, app_conns),
                          _conn_table(db_ex, db_conns), runner, jobs, note, read_ahead, around)


def spilled_clocks(app_pts: list[CapturePoint], db_pts: list[CapturePoint], app_x: list, db_xs: list,
                   connections: pd.DataFrame, runner, jobs: int, note, around: tuple[int, int] | None = None
                   ) -> tuple[dict[str, ClockModel], dict[str, dict]]:
    """fit_clocks of points whose exchanges spilled (read/spill.py; the partitioned run, explain/partitioned.py):
    which connections matched is `connections` (match.spilled_connection_step's), each connection's key numbered by
    a pass over the buckets (match.SpilledKeys: as connection_keys numbers the concatenated tables), its endpoints
    from the extractions' connections tables: no exchange table is read. The same models and entries. `around`:
    fit_clocks' (analyze --since/--until: the samples from the window and its margin)."""
    keyed = [SpilledKeys(xs).frame("key").merge(concat([x.connections for x in xs])[list(_CONN_TABLE_COLUMNS)],
                                                  on=["capture", "conn_index"]) for xs in (app_x, db_xs)]
    return matched_clocks(app_pts, db_pts, app_x, db_xs, connections, *keyed, runner, jobs, note, None, around)


def matched_clocks(app_pts: list[CapturePoint], db_pts: list[CapturePoint], app_x: list, db_xs: list,
                   connections: pd.DataFrame, a_keys: pd.DataFrame, d_keys: pd.DataFrame, runner, jobs: int, note,
                   read_ahead: dict | None, around: tuple[int, int] | None = None
                   ) -> tuple[dict[str, ClockModel], dict[str, dict]]:
    """fit_clocks from the matched connection pairs (`connections`: app_conn, db_conn keys) and each side's
    connections by key (`a_keys`, `d_keys`: key, capture, conn_index, client, server); `around`: fit_clocks'."""
    several = len(db_xs) > 1
    clocks: dict[str, ClockModel] = {}
    clock_info: dict[str, dict] = {}
    pairs = connections.merge(a_keys, left_on="app_conn", right_on="key").merge(
        d_keys, left_on="db_conn", right_on="key", suffixes=("_a", "_d"))
    # one more pass over each capture point for the segments of matched connections: on the workers (--jobs,
    # --scheduler)
    calls, owners = [], []
    for side, pts, xs in (("d", db_pts, db_xs), ("a", app_pts, app_x)):
        for pt, x in zip(pts, xs):
            mine = pairs[pairs[f"capture_{side}"] == x.capture]
            if len(mine):
                calls.append((pt, _flows(mine.rename(columns={f"client_{side}": "client",
                                                              f"server_{side}": "server"})), around))
                owners.append((side, x.capture))
    # A pass started ahead read every connection of its point: its keys are these calls' when all of them matched
    # (a key seen in an unmatched connection too would not be unique here); else the point is read again. With one
    # app and one DB point the worker also paired the two and fitted their clock.
    wanted = dict(zip(owners, (flows for _, flows, _ in calls)))
    fitted: dict[tuple[str, str], tuple[ClockModel, dict]] = {}
    ready = {}
    for key, started in (read_ahead or {}).items():
        if key[0] == "pair":
            db_x = next(x for x in db_xs if x.capture == key[2])
            if (wanted.get(("a", key[1])), wanted.get(("d", key[2])), db_x.stats.first_ts_ns) == started[:3]:
                fitted[key[1:]] = started[3].result()
        elif wanted.get(key) == started[0]:
            ready[key] = started[1]
    pair_list = [tuple(p) for p in pairs[["capture_a", "capture_d"]].drop_duplicates().itertuples(index=False)]
    needed = {owner for a_cap, d_cap in pair_list if (a_cap, d_cap) not in fitted
              for owner in (("a", a_cap), ("d", d_cap))}
    todo = [(call, owner) for call, owner in zip(calls, owners) if owner in needed and owner not in ready]
    if runner is not None:
        segment_sets = runner.run(read_segments_of, [call for call, _ in todo]) if todo else []
    else:
        segment_sets = run_all(read_segments_of, [call for call, _ in todo], jobs)
    segments = {owner: future.result() for owner, future in ready.items() if owner in needed}
    segments.update(zip([owner for _, owner in todo], segment_sets))
    del segment_sets, ready
    release_memory()  # with --jobs 1 the reading ran here: its per-packet garbage goes before pairing
    # the last pair that reads a point's segments takes them: they go once its samples are made
    uses = Counter(owner for a_cap, d_cap in pair_list if (a_cap, d_cap) not in fitted
                   for owner in (("a", a_cap), ("d", d_cap)))
    for a_cap, d_cap in pair_list:
        db_x = next(x for x in db_xs if x.capture == d_cap)
        model, entry = fitted.get((a_cap, d_cap)) or _fitted_clock(_taken(segments, uses, ("a", a_cap)),
                                                                    _taken(segments, uses, ("d", d_cap)),
                                                                    db_x.stats.first_ts_ns)
        key = pair_key(a_cap, d_cap) if several else a_cap
        clocks[key] = model
        clock_info[key] = {"app": a_cap, "db": d_cap, **entry}
        if model.quality != "two-sided":
            note(f"clock of {a_cap}{' and ' + d_cap if several else ''}: {model.quality} fit (too few segments "
                 "seen at both points); one-way network times are bounds, not estimates")
    del segments
    release_memory()
    return clocks, clock_info


def _taken(segments: dict, uses: Counter, owner: tuple[str, str]) -> _Segments:
    """`segments[owner]`, popped when this is the last of its `uses`."""
    uses[owner] -= 1
    return segments.pop(owner) if uses[owner] == 0 else segments[owner]


def _fitted_clock(app, db, db_first_ns: int | None) -> tuple[ClockModel, dict]:
    """The clock of an app point and a DB point from their segments (read_segments_of's), and its summary.json →
    clocks entry (without the points' names). The samples are reduced to hulls piece by piece as they are paired
    (never held whole); only where the hulls cannot give estimate_clock's model (fit_hulls: no consistent line at
    once, too few points a way) are they paired again and held, for estimate_clock."""
    sides = [app, db]
    del app, db
    hulls = combined_hulls([clock_hulls(*piece) for piece in _sample_pieces(*sides)])
    model = fit_hulls(hulls)
    if model is not None:
        app, db = sides
        counts = SampleCounts(hulls.n_fwd, hulls.n_rev, app.read, db.read, app.repeated + db.repeated)
        return model, clock_entry(model, counts, db_first_ns)
    samples = _paired(sides)  # lets the segments go as soon as it has read them
    release_memory()
    model = estimate_clock(samples.fwd_app, samples.fwd_db, samples.rev_db, samples.rev_app)
    return model, clock_entry(model, samples.counts, db_first_ns)


def _clock_ahead(app_pt: CapturePoint, app_flows: set, db_pt: CapturePoint, db_flows: set,
                 db_first_ns: int | None, around: tuple[int, int] | None = None) -> tuple[ClockModel, dict]:
    """fit_clocks' work for one app point and one DB point, in one call (on a worker: start_segment_passes)."""
    db = read_segments_of(db_pt, db_flows, around)
    return _fitted_clock(read_segments_of(app_pt, app_flows, around), db, db_first_ns)


def start_segment_passes(ahead: Ahead, app_pts: list[CapturePoint], db_pts: list[CapturePoint], app_x: list,
                         db_xs: list, around: tuple[int, int] | None = None) -> dict[tuple, tuple]:
    """The clock's pass over each app and DB point (read_segments_of), for every connection it holds, started on
    `ahead`'s workers as soon as the extraction is done: it runs while this process pairs the captures and repairs
    their losses, and fit_clocks takes it when the connections it read are the matched ones (the usual case: all
    of them). {("a" or "d", capture): (flows, Future of its segments)}; for one app point and one DB point the
    worker also fits their clock (_clock_ahead), so only the model comes back: {("pair", app capture, DB capture):
    (app flows, DB flows, the DB capture's first time, Future of (model, clocks entry))}. Empty with one job or
    small captures (read as before). `around`: fit_clocks'."""
    if not app_x or not db_xs or sum(extract.capture_bytes(p) for p in (*app_pts, *db_pts)) < \
            extract.SMALL_CAPTURE_BYTES:
        return {}
    owners, calls = [], []
    for side, pts, xs in (("d", db_pts, db_xs), ("a", app_pts, app_x)):
        for pt, x in zip(pts, xs):
            conns = x.connections[x.connections["client"].notna() & x.connections["server"].notna()]
            if len(conns):
                owners.append((side, x.capture))
                calls.append((pt, _flows(conns), around))
    if owners == [("d", db_xs[0].capture), ("a", app_x[0].capture)] and len(app_x) == len(db_xs) == 1:
        (db_pt, db_flows, _), (app_pt, app_flows, _) = calls
        first_ns = db_xs[0].stats.first_ts_ns
        futures = ahead.start_all(_clock_ahead, [(app_pt, app_flows, db_pt, db_flows, first_ns, around)])
        return {} if futures is None else {("pair", app_x[0].capture, db_xs[0].capture): (app_flows, db_flows,
                                                                                          first_ns, futures[0])}
    futures = ahead.start_all(read_segments_of, calls)
    if futures is None:
        return {}
    return {owner: (flows, future) for owner, (_, flows, _), future in zip(owners, calls, futures)}


def clock_keys(app_ex: pd.DataFrame, matching, row_point: np.ndarray, clocks: dict, primary: str | None) -> np.ndarray:
    """Per row, the clock (`pair_key(app point, DB point)`) that converts its DB times onto its app point's clock:
    a row only the DB saw goes on the first app point's clock, else on that of any app point with a clock to its
    DB point."""
    ar = matching.app_row
    a_cap = np.full(len(ar), primary, dtype=object)
    if len(app_ex):
        caps = app_ex["capture"].astype(object).to_numpy()
        a_cap[ar >= 0] = caps[ar[ar >= 0]]
    fallback: dict[str, str | None] = {}
    keys = np.array([pair_key(a, d) if d is not None else None for a, d in zip(a_cap, row_point)], dtype=object)
    missing = {d for k, d in zip(keys, row_point) if d is not None and k not in clocks}
    for d in missing:
        fallback[d] = next((k for k in clocks if k.endswith(" ↔ " + d) and k.startswith(f"{primary} ↔ ")),
                           next((k for k in clocks if k.endswith(" ↔ " + d)), None))
    db_only = matching.app_row < 0
    for i in np.flatnonzero(db_only):
        d = row_point[i]
        if d is not None and keys[i] not in clocks:
            keys[i] = fallback.get(d)
    return keys


_CONN_TABLE_COLUMNS = ("capture", "conn_index", "client", "server")  # what the clock reads of a connection


def _conn_table(ex: pd.DataFrame, conns: pd.DataFrame) -> pd.DataFrame:
    key = connection_keys(ex).to_numpy()
    first = first_rows(key)  # each connection's first row (keys number them as they appear)
    keys = pd.DataFrame({"key": key[first], "capture": ex["capture"].iloc[first].to_numpy(),
                         "conn_index": ex["conn_index"].to_numpy()[first]})
    return keys.merge(conns[list(_CONN_TABLE_COLUMNS)], on=["capture", "conn_index"])


@dataclass(frozen=True)
class SampleCounts:
    """What a clock was fitted on, as summary.json → clocks tells it."""

    forward: int  # samples app→DB
    reverse: int
    app_segments: int  # segments of matched connections read at the app point
    db_segments: int
    duplicates_dropped: int  # keys seen more than once at one point (retransmissions, duplicate ACKs)


def clock_entry(model: ClockModel, counts: SampleCounts, db_first_ns: int | None) -> dict:
    """summary.json → clocks entry of one app point and DB point: the model's summary at the DB capture's first
    packet and what it was fitted on."""
    info = model.summary(int(db_first_ns)) if db_first_ns is not None else {}
    info["samples"] = {"forward": counts.forward, "reverse": counts.reverse}
    info["duplicates_dropped"] = counts.duplicates_dropped
    info["segments_read"] = {"app": counts.app_segments, "db": counts.db_segments}
    return info


@dataclass
class _Segments:
    """Segments of chosen connections at one capture point: the keys seen exactly once there (a retransmission or
    a duplicate ACK has no one time), sorted by key, as three compact arrays."""

    k1: np.ndarray  # uint64: seq << 32 | ack
    k2: np.ndarray  # uint64: payload length << 9 | flags << 1 | direction (0 client→server, 1 server→client)
    ts: np.ndarray  # int64 ns
    read: int = 0  # segments read
    repeated: int = 0  # segments dropped because their key was seen more than once


def _segments_in(columns: list, lo: int, hi: int) -> list:
    """segment_keys' columns (k1, k2, ts as buffers) of the segments whose time is in [lo, hi]; consumed."""
    ts = np.frombuffer(columns[2], dtype=np.int64)
    inside = (ts >= lo) & (ts <= hi)
    del ts
    return [np.frombuffer(columns.pop(0), dtype=dtype)[inside] for dtype in (np.uint64, np.uint64, np.int64)]


def _unique_sorted(columns: list) -> _Segments:
    """k1, k2, ts (given as arrays, consumed: each is freed as soon as its sorted copy exists, which keeps the peak
    at about twice the segments' size) sorted by key, with the keys seen more than once dropped."""
    k1 = np.frombuffer(columns[0], dtype=np.uint64)
    k2 = np.frombuffer(columns[1], dtype=np.uint64)
    order = np.lexsort((k2, k1))
    del k1, k2
    k1, k2, ts = (np.frombuffer(columns.pop(0), dtype=dtype)[order] for dtype in (np.uint64, np.uint64, np.int64))
    del order
    repeat = (k1[1:] == k1[:-1]) & (k2[1:] == k2[:-1])
    once = np.ones(len(k1), dtype=bool)
    once[1:] &= ~repeat
    once[:-1] &= ~repeat
    kept = int(once.sum())
    if kept == len(once):
        return _Segments(k1, k2, ts, read=len(once), repeated=0)
    # one array at a time, each let go as soon as its kept rows are copied (not the three copies beside the three)
    k1 = k1[once]
    k2 = k2[once]
    ts = ts[once]
    return _Segments(k1, k2, ts, read=len(once), repeated=len(once) - kept)


def read_segments_of(path: str | os.PathLike, flows: set[tuple[str, int, str, int]],
                     around: tuple[int, int] | None = None) -> _Segments:
    """Keys and times of the segments of the given connections ((client ip, port, server ip, port) tuples),
    reduced to the keys seen once (in the worker process, with --jobs: only those travel back). The native fast
    lane reads them where it reads the capture (fastlane.segment_keys). `around`: (lo, hi) ns, the segments of
    that time alone (analyze --since/--until: the window and its margin, core.window)."""
    with open_capture(path) as reader:
        columns = segment_keys(reader, flows)
    if around is not None:
        columns = _segments_in(columns, *around)
    segments = _unique_sorted(columns)
    release_memory()  # the per-packet garbage of the pass, before the next capture's pass or the pairing
    return segments


@dataclass(frozen=True)
class ClockSamples:
    fwd_app: np.ndarray  # app→DB: app timestamp a
    fwd_db: np.ndarray  # app→DB: DB timestamp b
    rev_db: np.ndarray  # DB→app: DB timestamp c
    rev_app: np.ndarray  # DB→app: app timestamp e
    app_segments: int  # segments of matched connections read at the app point
    db_segments: int
    duplicates_dropped: int  # keys seen more than once at one point (retransmissions, duplicate ACKs)

    @property
    def counts(self) -> SampleCounts:
        return SampleCounts(len(self.fwd_app), len(self.rev_app), self.app_segments, self.db_segments,
                            self.duplicates_dropped)


def pair_segments(app: _Segments, db: _Segments) -> ClockSamples:
    """The segments seen at both points (same key), as clock samples. Both sides are sorted by (k1, k2) with unique
    keys, so this is a merge join on sorted arrays: no hash table, a few index arrays of memory (of JOIN_CHUNK app
    segments at a time: each app segment's search is its own)."""
    return _paired([app, db])


def _paired(sides: list[_Segments]) -> ClockSamples:
    """pair_segments of the app and DB segments in `sides`, handed over (the list is emptied): they are let go as
    soon as the matched times are taken from them, before those are joined and sorted (the segments of both points
    and the samples' sorting were the clock fit's peak)."""
    app, db = sides
    sides.clear()
    parts: tuple[list, list, list, list] = ([], [], [], [])  # per chunk: forward app, DB times; reverse DB, app
    for piece in _sample_pieces(app, db):
        for part, values in zip(parts, piece):
            part.append(values)
    read_app, read_db, repeated = app.read, db.read, app.repeated + db.repeated
    del app, db  # (the last chunk's arrays are small)
    release_memory()
    fwd_app, fwd_db, rev_db, rev_app = (_joined(part) for part in parts)
    del parts
    order = np.lexsort((fwd_db, fwd_app))  # by app time; equal app times by DB time
    fwd_app, fwd_db = fwd_app[order], fwd_db[order]
    order = np.lexsort((rev_db, rev_app))
    rev_app, rev_db = rev_app[order], rev_db[order]
    del order
    return ClockSamples(fwd_app, fwd_db, rev_db, rev_app, app_segments=read_app, db_segments=read_db,
                        duplicates_dropped=repeated)


JOIN_CHUNK = 1 << 16  # app segments searched at once by pair_segments


def _sample_pieces(app: _Segments, db: _Segments):
    """The samples of the segments seen at both points, JOIN_CHUNK app segments at a time: per chunk (forward app
    times, forward DB times, reverse DB times, reverse app times), in key order."""
    for at in range(0, len(app.k1), JOIN_CHUNK):
        ia, id_ = _matched(app.k1[at:at + JOIN_CHUNK], app.k2[at:at + JOIN_CHUNK], db, at)
        fwd = (app.k2[ia] & np.uint64(1)) == 0
        ts_a, ts_d = app.ts[ia], db.ts[id_]
        yield ts_a[fwd], ts_d[fwd], ts_d[~fwd], ts_a[~fwd]


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """The parts (int64 times) one after the other, each let go as soon as it is copied: a list of them is emptied."""
    out = np.empty(sum(len(p) for p in parts), dtype=np.int64)
    at = 0
    while parts:
        part = parts.pop(0)
        out[at:at + len(part)] = part
        at += len(part)
    return out


def _matched(k1: np.ndarray, k2: np.ndarray, db: _Segments, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions in the app segments, offset added; positions in `db`) of the app keys (k1, k2) that `db` has."""
    lo = np.searchsorted(db.k1, k1, side="left")
    hi = np.searchsorted(db.k1, k1, side="right")
    # Several DB segments may share a seq/ack (a pure ACK, then data; or, in a forged capture, thousands): inside
    # each run k2 is sorted, so every app key bisects its run, all keys at once: log2(longest run) passes.
    ia = np.flatnonzero(hi > lo)
    left, right, end = lo[ia], hi[ia], hi[ia]
    del lo, hi
    want = k2[ia]
    while True:
        open_ = left < right
        if not open_.any():
            break
        mid = (left + right) // 2
        below = db.k2[np.where(open_, mid, 0)] < want
        left = np.where(open_ & below, mid + 1, left)
        right = np.where(open_ & ~below, mid, right)
    hit = left < end
    hit[hit] = db.k2[left[hit]] == want[hit]
    return ia[hit] + offset, left[hit]
