"""Capture loss into the decomposition: the exchange times that fell on bytes one point borrowed from the other
(pair.repair) are bounds, not measurements. point_bounds finds them; build_table (decompose) leaves them null;
apply_bounds turns the bounds, tightened by the other point through the fitted clock (the request reached the DB
after the app sent it, the response left the DB before the app received it), into the *_lo/*_hi columns, with
`bounded` naming the points."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..core.tables import labelled, null_column
from ..core.times import ts_ns
from ..pair.match import Matching

if TYPE_CHECKING:
    from ..pair.repair import Repair  # imported by a run that repairs (pair.pairing)

POINTS = ("A1", "A4", "D1", "D4")  # request's first byte / response's last byte, at the app and at the DB
_POINT_OF = {("app", "req_first"): 0, ("app", "resp_last"): 1, ("db", "req_first"): 2, ("db", "resp_last"): 3}
BOUND_COLUMNS = ("total_s_lo", "total_s_hi", "server_s_lo", "server_s_hi", "network_s_lo", "network_s_hi")


@dataclass
class PointBounds:
    """Per row of the joined table (matching's pairs), for the rows that have a bounded point: lo/hi (ns, each on
    its own point's clock, NaN when unknown) of A1, A4, D1, D4 that are bounds rather than measurements."""

    rows: np.ndarray  # int64 row positions
    lo: np.ndarray  # float64 [len(rows), 4]
    hi: np.ndarray
    named: np.ndarray  # bool [len(rows), 4]: this point is a bound
    # float64 [len(rows), 4]: the four points' times (app clock, NaN when unknown) before build_table left the
    # bounds null; None: read from the table (apply_bounds of a table made without these bounds)
    measured_ns: np.ndarray | None = None


def point_bounds(app_ex: pd.DataFrame, db_ex: pd.DataFrame, matching: Matching, repair: Repair | None) -> PointBounds:
    """Which of each exchange's four times are bounds: those that fell on borrowed bytes (the repair's bounds), and
    the response end of a response not fully seen at a point (a lower bound: the last byte that was seen).
    Call before build_table consumes the tables."""
    n = len(matching.app_row)
    entries = []  # (row, point, lo, hi)
    for side, table, rows in (("app", app_ex, matching.app_row), ("db", db_ex, matching.db_row)):
        where = np.full(len(table), -1, dtype=np.int64)
        seen = rows >= 0
        where[rows[seen]] = np.flatnonzero(seen)
        if repair is not None and len(repair.bounds):
            b = repair.bounds[repair.bounds["side"] == side]
            for r, point, lo, hi in zip(b["row"], b["point"], b["lo_ns"], b["hi_ns"]):
                k = _POINT_OF.get((side, point))
                if k is not None and where[r] >= 0:
                    entries.append((int(where[r]), k, lo, hi))
        if len(table):
            last, last_ok = ts_ns(table["resp_last_ts"])
            cut = np.flatnonzero(last_ok & table["result"].isna().to_numpy())
            k = _POINT_OF[(side, "resp_last")]
            entries += [(int(where[r]), k, float(last[r]), np.nan) for r in cut if where[r] >= 0]
    if not entries:
        empty = np.zeros((0, 4))
        return PointBounds(np.zeros(0, dtype=np.int64), empty, empty.copy(), empty.astype(bool))
    rows = np.unique(np.fromiter((e[0] for e in entries), dtype=np.int64, count=len(entries)))
    position = {r: i for i, r in enumerate(rows.tolist())}
    lo = np.full((len(rows), 4), np.nan)
    hi = np.full((len(rows), 4), np.nan)
    named = np.zeros((len(rows), 4), dtype=bool)
    for r, k, b_lo, b_hi in entries:
        i = position[r]
        if named[i, k]:  # two bounds on one point (an incomplete response whose last seen byte was borrowed)
            b_lo = np.nanmax([lo[i, k], b_lo]) if not (np.isnan(lo[i, k]) and np.isnan(b_lo)) else np.nan
            b_hi = np.nanmin([hi[i, k], b_hi]) if not (np.isnan(hi[i, k]) and np.isnan(b_hi)) else np.nan
        lo[i, k], hi[i, k], named[i, k] = b_lo, b_hi, True
    assert n >= len(rows)
    return PointBounds(rows, lo, hi, named)


def apply_bounds(table: pd.DataFrame, bounds: PointBounds, clocks: dict, primary_app: str | None,
                 clock_keys: np.ndarray | None = None) -> pd.DataFrame:
    """Add `bounded` and the *_lo/*_hi columns (schema.ANALYSIS_COLUMNS) to build_table's output. A bounded point's
    time and every duration that depends on it are null (a bound is not a measurement); the durations' bounds
    come from the points' bounds, each tightened by causality across the points on the app clock (A1 ≤ D1 ≤ D4 ≤
    A4, widened by the clock's own bounds)."""
    n = len(table)
    label_codes = np.full(n, -1, dtype=np.int64)  # of `labels`, -1: not bounded
    labels: list[str] = []
    columns: dict[str, np.ndarray] = {}  # made for the bounds there are; the others null_column
    if len(bounds.rows):
        rows = bounds.rows
        point_cols = ("app_req_ts", "app_resp_ts", "db_req_ts", "db_resp_ts")
        value = bounds.measured_ns
        if value is None:
            value = np.full((len(rows), 4), np.nan)
            for k, col in enumerate(point_cols):
                v, ok = ts_ns(table[col].iloc[rows])
                value[:, k] = np.where(ok, v.astype(np.float64), np.nan)
        lo, hi, named = bounds.lo.copy(), bounds.hi.copy(), bounds.named
        # D bounds are on the DB clock: onto the app clock of the row's capture, as build_table does for D1/D4
        # the true app time of a DB time lies in [estimate − u, estimate + v]
        u, v = _clock_margins(table, rows, value, lo, hi, named, clocks, primary_app, clock_keys)
        measured = ~named & ~np.isnan(value)
        lo = np.where(measured, value, np.where(named, lo, np.nan))
        hi = np.where(measured, value, np.where(named, hi, np.nan))
        lo = np.where(np.isnan(lo), -np.inf, lo)
        hi = np.where(np.isnan(hi), np.inf, hi)
        for _ in range(2):  # A1 ≤ A4, D1 ≤ D4; A1 ≤ D1 and D4 ≤ A4 across the points, within the clock's bounds
            hi[:, 0] = np.minimum(hi[:, 0], np.minimum(hi[:, 1], hi[:, 2] + v))
            lo[:, 1] = np.maximum(lo[:, 1], np.maximum(lo[:, 0], lo[:, 3] - u))
            lo[:, 2] = np.maximum(lo[:, 2], lo[:, 0] - v)
            hi[:, 2] = np.minimum(hi[:, 2], hi[:, 3])
            lo[:, 3] = np.maximum(lo[:, 3], lo[:, 2])
            hi[:, 3] = np.minimum(hi[:, 3], hi[:, 1] + u)
        total = (lo[:, 1] - hi[:, 0], hi[:, 1] - lo[:, 0])
        server = (np.maximum(lo[:, 3] - hi[:, 2], 0.0), hi[:, 3] - lo[:, 2])
        network = (np.maximum(total[0] - server[1], 0.0), total[1] - server[0])
        total_b = named[:, 0] | named[:, 1]
        server_b = named[:, 2] | named[:, 3]
        for name, (b_lo, b_hi), which in (("total_s", total, total_b), ("server_s", server, server_b),
                                           ("network_s", network, total_b | server_b)):
            if which.any():
                columns.setdefault(f"{name}_lo", np.full(n, np.nan))[rows[which]] = _finite_s(b_lo[which])
                columns.setdefault(f"{name}_hi", np.full(n, np.nan))[rows[which]] = _finite_s(b_hi[which])
        texts, which_text = np.unique([",".join(p for p, on in zip(POINTS, row) if on) for row in named],
                                      return_inverse=True)
        label_codes[rows] = which_text
        labels = list(texts)
        # a bound is not a measurement: the point and what depends on it are null (build_table, given the bounds,
        # made them so: then nothing is copied here)
        nulls = {"app_req_ts": named[:, 0], "app_resp_ts": named[:, 1], "db_req_ts": named[:, 2],
                 "db_resp_ts": named[:, 3], "total_s": total_b, "server_s": server_b, "network_s": total_b | server_b,
                 "net_req_s": named[:, 0] | named[:, 2], "net_resp_s": named[:, 1] | named[:, 3]}
        table = table.copy(deep=False)
        for col, mask in nulls.items():
            if mask.any() and table[col].iloc[rows[mask]].notna().any():
                values = table[col].copy()
                values.iloc[rows[mask]] = pd.NaT if col.endswith("_ts") else np.nan
                table[col] = values
        # the slow-log join and the group view read the DB times from these: not from a bound
        if "_t_valid" in table.columns:
            app_only = (table["seen"].iloc[rows] == "app").to_numpy(dtype=bool, na_value=False)
            unread = rows[server_b | (total_b & app_only)]
            if table["_t_valid"].to_numpy()[unread].any():
                valid = table["_t_valid"].to_numpy().copy()
                valid[unread] = False
                table["_t_valid"] = valid
    else:
        table = table.copy(deep=False)
    # as_category(label) of the labels at `rows` (None elsewhere), from codes: not an object per row
    table["bounded"] = labelled(label_codes, labels)
    for c in BOUND_COLUMNS:  # (a bound column no row has is null in every row: no bytes per row)
        table[c] = columns[c] if c in columns else null_column(n, "float64")
    return table


def _clock_margins(table: pd.DataFrame, rows: np.ndarray, value: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                   named: np.ndarray, clocks: dict, primary_app: str | None,
                   clock_keys: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """apply_bounds' clock step for the bounded rows, by clock model and segment (a DB bound's app time, one call per
    model, not per time: a call per bounded time costs Python's overhead tens of thousands of times). Turns the
    named, known D bounds of `lo` and `hi` (columns 2, 3) into app-clock times in place, and returns (u, v): the
    true app time of a DB time lies in [estimate − u, estimate + v] at the row's first known time (infinite
    without a clock)."""
    n = len(rows)
    u, v = np.full(n, np.inf), np.full(n, np.inf)
    if clock_keys is not None:  # several DB points: the row's own pair of points (build_table)
        names = clock_keys[rows]
        models = [clocks.get(name) for name in names]
    else:
        captures = table["capture"].astype(object).to_numpy()[rows]
        of = {c: clocks.get(c) or clocks.get(primary_app) for c in set(captures.tolist())}
        models = [of[c] for c in captures]
    by_model: dict[int, tuple[object, list[int]]] = {}
    for i, model in enumerate(models):
        if model is not None and model.segments:
            by_model.setdefault(id(model), (model, []))[1].append(i)
    for model, mine in by_model.values():
        mine = np.asarray(mine, dtype=np.int64)
        for k in (2, 3):
            for arr in (lo, hi):
                at = mine[named[mine, k] & ~np.isnan(arr[mine, k])]
                if len(at):
                    arr[at, k] = model.db_to_app(arr[at, k].astype(np.int64)).astype(np.float64)
        known = np.concatenate([value[mine], lo[mine], hi[mine]], axis=1)  # the first time known of each row
        has = ~np.isnan(known)
        first = np.argmax(has, axis=1)
        mine, ref = mine[has.any(axis=1)], known[np.arange(len(mine)), first][has.any(axis=1)].astype(np.int64)
        which = model._segment_index_app(ref)
        for s, seg in enumerate(model.segments):
            sel = which == s
            if not sel.any():
                continue
            at, t = mine[sel], ref[sel]
            theta = np.asarray(seg.offset_at(t), dtype=np.float64)
            delta = (t - seg.ref_ns).astype(np.float64)  # seg.bounds_at, for many times
            if seg.two_sided:
                low, high = seg.skew_lower_ppm * 1e-6 * delta, seg.skew_upper_ppm * 1e-6 * delta
                # min() and max() of the two as Python takes them (the first unless the second is below / above)
                t_lo = seg.lower_ns + np.where(high < low, high, low)
                t_hi = seg.upper_ns + np.where(high > low, high, low)
            else:
                t_lo, t_hi = np.full(len(t), seg.lower_ns), np.full(len(t), seg.upper_ns)
            above, below = t_hi - theta, theta - t_lo
            u[at] = np.where(above < 0.0, 0.0, above)  # max(x, 0.0) as Python takes it (x when not below 0)
            v[at] = np.where(below < 0.0, 0.0, below)
    return u, v


def _finite_s(ns: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(ns), ns / 1e9, np.nan)
