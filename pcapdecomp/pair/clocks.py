"""The clocks of the capture points: one model per app point and DB point with matched connections, fitted from
the TCP segments both points saw of those connections (match.read_segments_of, match.pair_segments,
clock.estimate_clock). The pass over the captures for the segments starts ahead on the workers as soon as the
extraction is done (start_segment_passes) and is taken by fit_clocks when the connections it read are the matched
ones; else the points are read again for their matched connections."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.endpoints import split_endpoint
from ..core.memory import release_memory
from ..core.workers import Ahead, run_all
from .clock import ClockModel, estimate_clock
from ..read import extract
from ..read.sources import CapturePoint
from .match import ClockSamples, connection_keys, first_rows, pair_segments, read_segments_of


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
               runner, jobs: int, note, read_ahead: dict | None = None
               ) -> tuple[dict[str, ClockModel], dict[str, dict]]:
    """One clock model per app point and DB point with matched connections, keyed by the app point (one DB point)
    or `pair_key` (several), and its summary.json → clocks entry. `read_ahead`: start_segment_passes's passes, used
    for a point whose matched connections are the ones it read."""
    several = len(db_xs) > 1
    clocks: dict[str, ClockModel] = {}
    clock_info: dict[str, dict] = {}
    a_keys = _conn_table(app_ex, app_conns)
    d_keys = _conn_table(db_ex, db_conns)
    pairs = matching.connections.merge(a_keys, left_on="app_conn", right_on="key").merge(
        d_keys, left_on="db_conn", right_on="key", suffixes=("_a", "_d"))
    # one more pass over each capture point for the segments of matched connections: on the workers (--jobs,
    # --scheduler)
    calls, owners = [], []
    for side, pts, xs in (("d", db_pts, db_xs), ("a", app_pts, app_x)):
        for pt, x in zip(pts, xs):
            mine = pairs[pairs[f"capture_{side}"] == x.capture]
            if len(mine):
                calls.append((pt, _flows(mine.rename(columns={f"client_{side}": "client",
                                                              f"server_{side}": "server"}))))
                owners.append((side, x.capture))
    # A pass started ahead read every connection of its point: its keys are these calls' when all of them matched
    # (a key seen in an unmatched connection too would not be unique here); else the point is read again. With one
    # app and one DB point the worker also paired the two and fitted their clock.
    wanted = dict(zip(owners, (flows for _, flows in calls)))
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
    for a_cap, d_cap in pair_list:
        db_x = next(x for x in db_xs if x.capture == d_cap)
        model, entry = fitted.get((a_cap, d_cap)) or _fitted_clock(segments[("a", a_cap)], segments[("d", d_cap)],
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


def _fitted_clock(app, db, db_first_ns: int | None) -> tuple[ClockModel, dict]:
    """The clock of an app point and a DB point from their segments (read_segments_of's), and its summary.json →
    clocks entry (without the points' names)."""
    samples = pair_segments(app, db)
    del app, db
    release_memory()
    model = estimate_clock(samples.fwd_app, samples.fwd_db, samples.rev_db, samples.rev_app)
    return model, clock_entry(model, samples, db_first_ns)


def _clock_ahead(app_pt: CapturePoint, app_flows: set, db_pt: CapturePoint, db_flows: set,
                 db_first_ns: int | None) -> tuple[ClockModel, dict]:
    """fit_clocks' work for one app point and one DB point, in one call (on a worker: start_segment_passes)."""
    db = read_segments_of(db_pt, db_flows)
    return _fitted_clock(read_segments_of(app_pt, app_flows), db, db_first_ns)


def start_segment_passes(ahead: Ahead, app_pts: list[CapturePoint], db_pts: list[CapturePoint], app_x: list,
                         db_xs: list) -> dict[tuple, tuple]:
    """The clock's pass over each app and DB point (read_segments_of), for every connection it holds, started on
    `ahead`'s workers as soon as the extraction is done: it runs while this process pairs the captures and repairs
    their losses, and fit_clocks takes it when the connections it read are the matched ones (the usual case: all
    of them). {("a" or "d", capture): (flows, Future of its segments)}; for one app point and one DB point the
    worker also fits their clock (_clock_ahead), so only the model comes back: {("pair", app capture, DB capture):
    (app flows, DB flows, the DB capture's first time, Future of (model, clocks entry))}. Empty with one job or
    small captures (read as before)."""
    if not app_x or not db_xs or sum(extract.capture_bytes(p) for p in (*app_pts, *db_pts)) < \
            extract.SMALL_CAPTURE_BYTES:
        return {}
    owners, calls = [], []
    for side, pts, xs in (("d", db_pts, db_xs), ("a", app_pts, app_x)):
        for pt, x in zip(pts, xs):
            conns = x.connections[x.connections["client"].notna() & x.connections["server"].notna()]
            if len(conns):
                owners.append((side, x.capture))
                calls.append((pt, _flows(conns)))
    if owners == [("d", db_xs[0].capture), ("a", app_x[0].capture)] and len(app_x) == len(db_xs) == 1:
        (db_pt, db_flows), (app_pt, app_flows) = calls
        first_ns = db_xs[0].stats.first_ts_ns
        futures = ahead.start_all(_clock_ahead, [(app_pt, app_flows, db_pt, db_flows, first_ns)])
        return {} if futures is None else {("pair", app_x[0].capture, db_xs[0].capture): (app_flows, db_flows,
                                                                                          first_ns, futures[0])}
    futures = ahead.start_all(read_segments_of, calls)
    if futures is None:
        return {}
    return {owner: (flows, future) for owner, (_, flows), future in zip(owners, calls, futures)}


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


def _conn_table(ex: pd.DataFrame, conns: pd.DataFrame) -> pd.DataFrame:
    key = connection_keys(ex).to_numpy()
    first = first_rows(key)  # each connection's first row (keys number them as they appear)
    keys = pd.DataFrame({"key": key[first], "capture": ex["capture"].iloc[first].to_numpy(),
                         "conn_index": ex["conn_index"].to_numpy()[first]})
    return keys.merge(conns[["capture", "conn_index", "client", "server"]], on=["capture", "conn_index"])


def clock_entry(model: ClockModel, samples: ClockSamples, db_first_ns: int | None) -> dict:
    """summary.json → clocks entry of one app point and DB point: the model's summary at the DB capture's first
    packet and what it was fitted on."""
    info = model.summary(int(db_first_ns)) if db_first_ns is not None else {}
    info["samples"] = {"forward": len(samples.fwd_app), "reverse": len(samples.rev_app)}
    info["duplicates_dropped"] = samples.duplicates_dropped
    info["segments_read"] = {"app": samples.app_segments, "db": samples.db_segments}
    return info
