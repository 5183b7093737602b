"""The report's plotly figures, as JSON-ready {data, layout} dicts.

Every figure's cost is bounded by what it shows, never by the input's size or its timestamps' spread:
- the time charts share one x range (`TimeAxis`): the span of the capture's timestamps without far outliers (a
  frame stamped 1970 in a capture of 2026 is counted and said, not plotted), and a bounded number of buckets;
- the timeline draws at most TIMELINE_STATEMENTS statements on at most TIMELINE_LANES connection lanes, every
  notable one (culprit, hidden slow, understated, slow-logged, slow) first and a uniform sample of the rest;
- the other figures aggregate.

All text that comes from a capture or a log goes through `plain()`: plotly renders a subset of HTML in labels
and hover text (`<a href>`, `<b>`, `<br>`), so `<`, `>` and `&` become entities, which plotly shows as the
characters themselves. Numbers go out as typed arrays ({dtype, bdata}: plotly.js decodes them), times as
milliseconds since the epoch on plotly date axes (UTC, the app capture's clock)."""

from __future__ import annotations

import base64
import heapq
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.formats import clip, integer, seconds
from ..core.groups import aggregated
from ..core.memory import release_memory
from ..core.times import ts_ns
from ..explain.decompose import STALL_MIN_QUEUE_S, network_parts
from ..explain.digest import HeldColumns, bounded_part, likely_queue, overhead_part, queue_layers, queue_parts
from ..explain.threadpool import core_range

NS = 1_000_000_000
TIMELINE_STATEMENTS = 20_000
TIMELINE_LANES = 60
WATERFALL_ROWS = 30
WATERFALL_MIN_SHARE = 0.01  # waterfall rows shorter than this share of the slowest are left out (invisible bars)
TIME_BUCKETS = 400  # at most this many buckets across the time axis in any aggregated time chart
CONNECTION_POINTS = 5_000  # connection latency markers (every slow one, a sample of the rest)
CULPRIT_LABELS = 3
STALL_BANDS = 300
OUTLIER_SLACK = 100  # the core of the time range (threadpool.core_range) widened by this many times its width (at
# least OUTLIER_MIN_SLACK_NS) on both sides
OUTLIER_MIN_SLACK_NS = 3600 * NS
MARGIN = dict(l=170, r=100, t=40, b=40)  # the same plot area on every time chart, so that their axes line up
COLORS = {"network": "#6a9fd4", "request leg": "#6a9fd4", "response leg": "#9cc3ea", "queueing": "#d62728",
          "queueing (estimated)": "#f4a6a6", "queueing (likely)": "#f08080", "execution": "#2ca02c",
          "execution or waiting (bounded)": "#c7c7c7", "server overhead": "#bcbd22", "client wait": "#9aa9bb",
          "hidden slow": "#d62728", "understated": "#9467bd", "in the slow log": "#ff7f0e", "culprit": "#111111",
          "statement": "#7a8fa6", "plain": "#8888cc", "TLS": "#44aa99", "executing": "#2ca02c",
          "queued": "#d62728", "slow": "#1f77b4", "app ↔ proxy network": "#6a9fd4",
          "inside the proxy": "#e377c2", "proxy ↔ DB network": "#9cc3ea", "network (not told apart)": "#9aa9bb"}
_NICE_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800,
                   3600, 7200, 21600, 86400)


# ------------------------------------------------------------------ text and numbers


_UNPRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def visible(text) -> str:
    """Control characters as \\xNN and lone surrogates (bytes that were not UTF-8) as \\xNN / \\uNNNN: a statement's
    binary bytes stay readable, and the page stays valid UTF-8."""
    def code(m: re.Match) -> str:
        c = ord(m.group())
        return f"\\x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"

    return _UNPRINTABLE.sub(code, str(text))


def plain(text) -> str:
    """Text for a plotly label or hover: shown as is, never interpreted as markup."""
    return visible(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _arr(values: np.ndarray) -> dict:
    """A numpy array as plotly.js's typed-array spec."""
    a = np.ascontiguousarray(values)
    code = {np.dtype("float64"): "f8", np.dtype("float32"): "f4", np.dtype("int32"): "i4",
            np.dtype("int16"): "i2", np.dtype("uint8"): "u1"}[a.dtype]
    return {"dtype": code, "bdata": base64.b64encode(a.tobytes()).decode("ascii")}


def _ms(ns: np.ndarray) -> np.ndarray:
    return np.asarray(ns, dtype=np.float64) / 1e6


# ------------------------------------------------------------------ times on the app clock


@dataclass
class Times:
    """Per exchange, int64 ns on the app clock: start (A1, else D1), end (A4, else D4), D1, D4, with valid masks."""

    start: np.ndarray
    end: np.ndarray
    d1: np.ndarray
    d4: np.ndarray
    has_start: np.ndarray
    has_end: np.ndarray
    has_d1: np.ndarray
    has_d4: np.ndarray


def exchange_times(x: pd.DataFrame) -> Times:
    a1, va1 = _column_ns(x["app_req_ts"])
    a4, va4 = _column_ns(x["app_resp_ts"])
    d1, vd1 = _column_ns(x["db_req_ts"])
    d4, vd4 = _column_ns(x["db_resp_ts"])
    # where every exchange has A1 (or none has), start and end are A1 and A4 (D1 and D4): those arrays themselves
    every, none = bool(va1.all()), not va1.any()
    start = a1 if every else d1 if none else np.where(va1, a1, d1)
    end = a4 if every else d4 if none else np.where(va1, a4, d4)
    return Times(start, end, d1, d4, va1 | vd1, np.where(va1, va4, vd4), vd1, vd4)


def _column_ns(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """core.times.ts_ns of a time column: the column's own values (read-only, no copy of every row) where none is
    null, else ts_ns's copy, its nulls 0 — the same values either way."""
    values, valid = ts_ns(col, copy=False)
    return (values, valid) if valid.all() else ts_ns(col)


@dataclass(frozen=True)
class TimeAxis:
    """The x range every time chart shares, and what lies outside it."""

    lo_ns: int  # the charts' range: the timestamps' range, padded
    hi_ns: int
    first_ns: int  # the first and last timestamp inside it
    last_ns: int
    outside: int = 0  # exchanges or connections with a timestamp outside [lo, hi]: left out of the time charts
    outside_first_ns: int | None = None
    outside_last_ns: int | None = None

    @property
    def span_s(self) -> float:
        """The capture's span in seconds (first to last timestamp, outliers left out)."""
        return (self.last_ns - self.first_ns) / NS

    def range_ms(self) -> list[float]:
        return [self.lo_ns / 1e6, self.hi_ns / 1e6]

    def inside(self, ns: np.ndarray) -> np.ndarray:
        return (ns >= self.lo_ns) & (ns <= self.hi_ns)


def time_axis(t: Times, extra: list[np.ndarray] = ()) -> TimeAxis | None:
    """The range of the capture's timestamps without far outliers, padded by 2 %.

    The core is threadpool.core_range's (the biggest run of times without a month of silence, less 1 % at each
    end), as for the thread-pool views; a timestamp more than OUTLIER_SLACK core widths (at least an hour) beyond
    it is an outlier: a clock glitch or a crafted frame. That
    keeps the charts readable; their cost is bounded by bucket counts whatever the range."""
    points = _taken([(t.start, t.has_start), (t.end, t.has_end), *((ns, None) for ns in extra)])
    if len(points) == 0:
        return None
    core_lo, core_hi = core_range(points, mine=True)  # reordered in place: what follows reads them as a set
    slack = max(OUTLIER_SLACK * (core_hi - core_lo), OUTLIER_MIN_SLACK_NS)
    keep = (points >= core_lo - slack) & (points <= core_hi + slack)
    kept = points if keep.all() else points[keep]  # (the usual case: no copy)
    first, last = int(kept.min()), int(kept.max())
    del kept, points
    pad = max((last - first) // 50, 1_000_000)
    lo, hi = first - pad, last + pad
    outside = np.zeros(len(t.start), dtype=bool)
    far = []
    for ns, valid in ((t.start, t.has_start), (t.end, t.has_end), (t.d1, t.has_d1), (t.d4, t.has_d4)):
        beyond = valid & ((ns < lo) | (ns > hi))
        outside |= beyond
        far.append(ns[beyond])
    n_extra = 0
    for ns in extra:
        beyond = (ns < lo) | (ns > hi)
        n_extra += int(beyond.sum())
        far.append(ns[beyond])
    far = np.concatenate(far)
    return TimeAxis(lo, hi, first, last, int(outside.sum()) + n_extra, int(far.min()) if len(far) else None,
                    int(far.max()) if len(far) else None)


def _taken(parts: list[tuple[np.ndarray, np.ndarray | None]]) -> np.ndarray:
    """The values of each (values, mask) at its mask (None: all of them), one after the other in one array: what
    np.concatenate of the parts taken gives, without an array of each part taken beside it."""
    sizes = [len(values) if mask is None else int(np.count_nonzero(mask)) for values, mask in parts]
    out = np.empty(sum(sizes), dtype=np.int64)
    at = 0
    for (values, mask), size in zip(parts, sizes):
        # every value copied as it is where the mask takes them all (np.compress into `out` made two arrays of
        # them first)
        out[at:at + size] = values if mask is None or size == len(values) else values[mask]
        at += size
    return out


def nice_bucket_ns(span_ns: int, buckets: int = TIME_BUCKETS) -> int:
    """The smallest round bucket length giving at most `buckets` buckets over span_ns."""
    for b in _NICE_BUCKETS_S:
        if span_ns / (b * NS) <= buckets:
            return int(b * NS)
    return int(np.ceil(span_ns / buckets / NS)) * NS


def connection_times(connections: dict | None, summary: dict) -> pd.DataFrame | None:
    """One row per connection whose set-up was captured, at the DB capture when there is one (the server's view:
    thread creation and pool queueing show in SYN → greeting), else at the app captures. Columns: point, t_ns
    (SYN, else greeting, on the app clock), syn_greeting_s, greeting_ok_s, syn_ok_s, tls, login_ok (authentication
    ended with OK). Mid-stream connections (opened before the capture) are left out and counted by the caller."""
    if not connections:
        return None
    point = "db" if connections.get("db") is not None and len(connections["db"]) else "app"
    c = connections.get(point)
    if c is None or len(c) == 0:
        return None
    syn, vs = ts_ns(c["syn_ts"])
    greet, vg = ts_ns(c["greeting_ts"])
    ok, vo = ts_ns(c["login_ok_ts"])
    first, vf = ts_ns(c["first_ts"])
    t = np.where(vs, syn, np.where(vg, greet, first))
    has_t = (vs | vg | vf) & ~c["midstream"].fillna(False).to_numpy(dtype=bool)
    if point == "db":
        t = _db_to_app(t, summary)
    return pd.DataFrame({
        "point": point, "t_ns": t[has_t],
        "syn_greeting_s": np.where(vs & vg, (greet - syn) / NS, np.nan)[has_t],
        "greeting_ok_s": np.where(vg & vo, (ok - greet) / NS, np.nan)[has_t],
        "syn_ok_s": np.where(vs & vo, (ok - syn) / NS, np.nan)[has_t],
        "tls": c["tls"].fillna(False).to_numpy(dtype=bool)[has_t],
        "login_ok": vo[has_t],
    })


def _db_to_app(ns: np.ndarray, summary: dict) -> np.ndarray:
    """DB-clock times on the app clock with the fitted offset and skew (θ = DB − app, given at the DB capture's first
    packet). Good to the clock's bound; the connection charts need milliseconds."""
    clock = summary.get("clock") or {}
    if clock.get("offset_s") is None:
        return ns
    first = ((summary.get("captures") or {}).get("db") or {}).get("first_ts")
    ref = pd.Timestamp(first).value if first else int(ns.min()) if len(ns) else 0
    theta = clock["offset_s"] * NS + (clock.get("skew_ppm") or 0.0) * 1e-6 * (ns - ref)
    return ns - np.rint(theta).astype(np.int64)


# ------------------------------------------------------------------ which exchanges matter


def _flag(x: pd.DataFrame, col: str) -> np.ndarray:
    if col not in x.columns:
        return np.zeros(len(x), dtype=bool)
    return x[col].fillna(False).to_numpy(dtype=bool)


def culprit_mask(x: pd.DataFrame, summary: dict, t: Times) -> np.ndarray:
    """The exchanges named as culprits of a stall: stall_role == culprit where the analysis wrote it, else the
    statements summary.json's stalls name (same connection, same D1)."""
    if "stall_role" in x.columns:
        return (x["stall_role"] == "culprit").fillna(False).to_numpy(dtype=bool)
    named = [(c.get("conn_id"), c.get("db_req_ts")) for s in (summary.get("groups") or {}).get("stalls") or []
             for c in s.get("culprits") or []]
    named = [(cid, pd.Timestamp(ts).value) for cid, ts in named if cid is not None and ts]
    out = np.zeros(len(x), dtype=bool)
    if not named:
        return out
    at = np.isin(t.d1, np.array([ns for _, ns in named], dtype=np.int64)) & t.has_d1
    conn = x["conn_id"].to_numpy(dtype="float64", na_value=np.nan)
    wanted = set(named)
    for i in np.flatnonzero(at):
        out[i] = (conn[i], int(t.d1[i])) in wanted
    return out


# ------------------------------------------------------------------ the figures


def figure_specs(summary: dict, x: pd.DataFrame, groups: pd.DataFrame | None, t: Times, axis: TimeAxis | None,
                 conns: pd.DataFrame | None = None, pool: pd.DataFrame | None = None, columns=None) -> dict:
    """{name: {data, layout} or None}; "_time" lists the figures on the shared time axis, "_timeline" says what
    the timeline shows. columns: where the columns read at the drawn statements alone are read (render_page's)."""
    columns = columns if columns is not None else HeldColumns(x)
    specs: dict = {"shares": _shares(x)}
    specs["timeline"], specs["_timeline"] = _timeline(summary, x, t, axis, columns)
    release_memory()  # its statements' small blocks, freed among the ones kept: back before the next figure
    specs["heatmap"] = _heatmap(groups, axis)
    specs["pool"] = _pool(summary, groups, pool, axis)
    specs["waterfall"] = _waterfall(x, columns)
    specs["connrate"] = _connection_rate(conns, axis)
    specs["openconns"] = _open_connections(summary, axis)
    specs["proxy"] = _proxy(x, axis)
    specs["_time"] = [n for n in ("timeline", "heatmap", "pool", "connrate", "openconns", "proxy")
                      if specs[n] is not None]
    return specs


def _layout(height: int, **kw) -> dict:
    base = {"height": height, "margin": dict(MARGIN), "paper_bgcolor": "#fff", "plot_bgcolor": "#fff",
            "font": {"family": "system-ui, sans-serif", "size": 12}, "hovermode": "closest",
            "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "traceorder": "normal"}}
    base.update(kw)
    return base


def _time_xaxis(axis: TimeAxis, title: str = "time (UTC, app clock)") -> dict:
    return {"type": "date", "range": axis.range_ms(), "autorange": False, "title": {"text": title},
            "gridcolor": "#eee", "showline": True, "linecolor": "#999", "tickformat": "%H:%M:%S.%L"}


def _shares(x: pd.DataFrame) -> dict | None:
    both = (x["seen"] == "both").fillna(False).to_numpy(dtype=bool)
    if not both.any():
        return None
    total = float(np.nansum(x["total_s"].to_numpy(dtype="float64", na_value=np.nan)[both]))
    if not total > 0:
        return None
    certain, likely, estimated = layer_sums(x, both)
    overhead = float(overhead_part(x)[both].sum())
    parts = (*network_parts(x, both), ("queueing", certain - overhead), ("server overhead", overhead),
             ("queueing (likely)", likely),
             ("queueing (estimated)", estimated),
             ("execution", float(np.nansum(x["exec_s"].to_numpy(dtype="float64", na_value=np.nan)[both]))),
             ("execution or waiting (bounded)", float(bounded_part(x)[both].sum())))
    optional = ("server overhead", "queueing (likely)", "queueing (estimated)", "execution or waiting (bounded)")
    data = [{"type": "bar", "orientation": "h", "y": ["client time"], "x": [v], "name": label,
             "marker": {"color": COLORS[label]}, "hoverinfo": "text",
             "hovertext": [f"{label}: {v:.3f} s ({100 * v / total:.1f} %)"]}
            for label, v in parts if v > 0 or label not in optional]
    return {"data": data, "layout": _layout(200, barmode="stack", margin=dict(l=80, r=20, t=40, b=40),
                                            xaxis={"title": {"text": "seconds, summed over exchanges seen at both points"}})}


def layer_sums(x: pd.DataFrame, rows: np.ndarray) -> tuple[float, float, float]:
    """digest.queue_layers' (certain, likely, estimated) seconds summed over `rows` (a boolean mask): each part's
    rows taken and summed while the other parts wait, one array of the rows taken at a time. The parts are made one
    after the other in queue_parts' arrays (the likely and the estimated part in the array of the rest, its likely
    rows' values kept aside meanwhile): each the very array queue_layers gives, summed as it is (the same float),
    with one array of every row fewer than the three parts at once (at 1,157,984 rows, 9 MiB)."""
    every = bool(rows.all())  # (the usual case: each part summed as it is, the same sum as of its rows taken)

    def summed(part: np.ndarray) -> float:
        return float((part if every else part[rows]).sum())

    certain, rest = queue_parts(x)
    total_certain = summed(certain)
    del certain  # let go once summed
    likely = likely_queue(x)
    kept = rest[likely]  # the likely part's values (the rows of a likely queue: few)
    rest[likely] = 0.0  # the estimated part: queue_layers' np.where(likely, 0.0, rest)
    total_estimated = summed(rest)
    rest[:] = 0.0
    rest[likely] = kept  # the likely part: queue_layers' rest with its other rows 0
    return total_certain, summed(rest), total_estimated


# what queue_layers and bounded_part read
QUEUE_COLUMNS = ("queue_s", "queue_min_s", "queue_source", "exec_source", "exec_s", "server_s")


def _timeline(summary: dict, x: pd.DataFrame, t: Times, axis: TimeAxis | None,
              columns: HeldColumns) -> tuple[dict | None, dict]:
    """Each statement as a span from A1 to A4 (D1 to D4 when only the DB saw it) on its connection's lane, lanes
    ordered by thread group: queueing red (pale when estimated), execution green; the stalled stretches shaded
    over their group's lanes; culprits, hidden-slow, understated and slow-logged statements marked at their end."""
    if axis is None or len(x) == 0:
        return None, {}
    drawable = t.has_start & t.has_end & axis.inside(t.start) & axis.inside(t.end) & (t.end >= t.start)
    n_drawable = int(drawable.sum())
    if n_drawable == 0:
        return None, {}
    lqt = summary["inputs"].get("long_query_time")
    server = x["server_s"].to_numpy(dtype="float64", na_value=np.nan)
    total = x["total_s"].to_numpy(dtype="float64", na_value=np.nan)
    dur = np.where(np.isnan(server), total, server)
    culprit = culprit_mask(x, summary, t)
    hidden = _flag(x, "hidden_slow")
    understated = _flag(x, "understated")
    logged = _flag(x, "in_slow_log")
    slow = (np.nan_to_num(dur) > lqt) if lqt is not None else np.zeros(len(x), dtype=bool)
    # one byte a row (the classes 0 … 3), in place: no second array of every row
    klass = np.select([culprit, hidden | understated, logged | slow], [np.int8(3), np.int8(2), np.int8(1)], np.int8(0))
    klass *= drawable
    notable = np.flatnonzero(klass > 0)
    notable = notable[np.lexsort((-np.nan_to_num(dur[notable]), -klass[notable]))][:TIMELINE_STATEMENTS]
    rest = np.flatnonzero(drawable & (klass == 0))
    room = TIMELINE_STATEMENTS - len(notable)
    if len(rest) > room:
        rest = np.random.default_rng(0).choice(rest, room, replace=False)
    rows = np.sort(np.concatenate([notable, rest]))
    sel = columns.at(rows, TIMELINE_COLUMNS)  # a row filter of these alone, not of all

    start, end = t.start[rows], t.end[rows]
    lane, labels, lane_group = _lanes(_lane_keys(sel, summary), klass[rows].astype(np.int64),  # as before: int64
                                      np.nan_to_num(dur[rows]), start, end)
    n_lanes = len(labels)
    y = lane.astype(np.float32)
    d1, d4, has_d1, has_d4 = t.d1[rows], t.d4[rows], t.has_d1[rows], t.has_d4[rows]
    # the per-row parts of the statements drawn alone (row by row, the values they have in the whole table)
    drawn = columns.at(rows, QUEUE_COLUMNS)
    certain, likely, estimated = queue_layers(drawn)
    estimated = likely + estimated  # the tooltip's "beyond the certain part"
    exec_s = drawn["exec_s"].to_numpy(dtype="float64", na_value=np.nan)
    is_likely = likely > 0
    q_mid = d1 + np.rint(certain * NS).astype(np.int64)  # certain queueing first, the likely or estimated rest after it
    q_end = q_mid + np.rint(estimated * NS).astype(np.int64)
    x_start = np.maximum(d4 - np.rint(np.nan_to_num(exec_s) * NS).astype(np.int64), d1)
    bounded = bounded_part(drawn) > 0
    del drawn

    data = [_segments("client wait", start, end, y, np.ones(len(rows), dtype=bool), 2)]
    data.append(_proxy_segments(sel, y))
    data.append(_segments("queueing", d1, q_mid, y, has_d1 & (certain > 0), 9))
    data.append(_segments("queueing (likely)", q_mid, q_end, y, has_d1 & is_likely & (estimated > 0), 9))
    data.append(_segments("queueing (estimated)", q_mid, q_end, y, has_d1 & ~is_likely & (estimated > 0), 9))
    data.append(_segments("execution", x_start, d4, y, has_d4 & ~np.isnan(exec_s), 9))
    data.append(_segments("execution or waiting (bounded)", np.minimum(q_end, d4), d4, y, has_d1 & has_d4 & bounded, 9))
    data = [d for d in data if d is not None]

    k = klass[rows]
    order = []
    for label, mask, size, symbol in (
            ("statement", k == 0, 4, "circle"),
            ("in the slow log", (k == 1) & logged[rows], 8, "circle"),
            ("slow", (k == 1) & ~logged[rows], 6, "circle"),
            ("understated", understated[rows] & (k == 2), 10, "square"),
            ("hidden slow", hidden[rows] & (k == 2) & ~understated[rows], 10, "triangle-up"),
            ("culprit", k == 3, 13, "diamond")):
        idx = np.flatnonzero(mask)
        if len(idx) == 0:
            continue
        # hover: the page's own tooltip reads statement meta + pointNumber of the hover table (_hover_table)
        data.append({"type": "scattergl", "mode": "markers", "name": label, "x": _arr(_ms(end[idx])),
                     "y": _arr(y[idx]), "hoverinfo": "none", "meta": sum(len(o) for o in order),
                     "marker": {"color": COLORS[label], "size": size, "symbol": symbol,
                                "line": {"width": 1, "color": "#fff"}}})
        order.append(idx)
    order = np.concatenate(order)
    hover = _hover_table(sel.iloc[order], start[order], certain[order], estimated[order])
    culprits = np.flatnonzero(k == 3)
    annotations = [{"x": float(_ms(x_start[i])), "y": float(y[i]), "text": "culprit", "showarrow": True,
                    "arrowhead": 0, "ax": 0, "ay": -18, "font": {"size": 11, "color": COLORS["culprit"]}}
                   for i in culprits[np.argsort(-np.nan_to_num(dur[rows][culprits]))][:CULPRIT_LABELS]]
    shapes = _stall_bands(summary, lane_group, axis)
    layout = _layout(min(max(24 * n_lanes + 160, 300), 1100), xaxis=_time_xaxis(axis), shapes=shapes,
                     annotations=annotations,
                     yaxis={"tickmode": "array", "tickvals": list(range(n_lanes)), "ticktext": labels,
                            "range": [n_lanes - 0.5, -0.5], "autorange": False, "zeroline": False,
                            "showgrid": False, "title": {"text": ""}})
    meta = {"total": n_drawable, "shown": len(rows), "sampled": len(rows) < n_drawable, "lanes": n_lanes,
            "notable": len(notable), "hover": hover}
    return {"data": data, "layout": layout}, meta


# the columns the timeline reads of its statements (_lane_keys, _lanes, _proxy_segments, _hover_table)
TIMELINE_COLUMNS = ["capture", "conn_index", "conn_id", "front_conn_id", "thread_group", "sql", "command",
                    "exec_source", "total_s", "server_s", "exec_s", "network_s", "proxy_s", "proxy_wait_s",
                    "proxy_front_req_ts", "proxy_back_req_ts", "proxy_back_resp_ts", "proxy_front_resp_ts"]


def _proxy_segments(sel: pd.DataFrame, y: np.ndarray) -> dict | None:
    """Time inside the proxy as segments on the statement's lane: P1 → P2 (waiting before the proxy sent the
    request on) and P3 → P4 (relaying the answer); null without the proxy's capture or a pair across it."""
    if "proxy_back_req_ts" not in sel.columns:
        return None
    (p1, h1), (p2, h2), (p3, h3), (p4, h4) = (ts_ns(sel[c]) for c in (
        "proxy_front_req_ts", "proxy_back_req_ts", "proxy_back_resp_ts", "proxy_front_resp_ts"))
    return _segments("inside the proxy", np.concatenate([p1, p3]), np.concatenate([p2, p4]), np.concatenate([y, y]),
                     np.concatenate([h1 & h2 & (p2 > p1), h3 & h4 & (p4 > p3)]), 9)


def _segments(name: str, a: np.ndarray, b: np.ndarray, y: np.ndarray, mask: np.ndarray, width: int) -> dict | None:
    """Horizontal segments [a, b] at height y as one line trace with gaps (NaN) between them."""
    idx = np.flatnonzero(mask)
    if len(idx) == 0:
        return None
    xs = np.column_stack([_ms(a[idx]), _ms(b[idx]), np.full(len(idx), np.nan)]).ravel()
    ys = np.column_stack([y[idx], y[idx], np.full(len(idx), np.nan, dtype=np.float32)]).ravel()
    return {"type": "scattergl", "mode": "lines", "name": name, "x": _arr(xs), "y": _arr(ys.astype(np.float32)),
            "hoverinfo": "skip", "connectgaps": False, "line": {"color": COLORS[name], "width": width}}


def _lane_keys(sel: pd.DataFrame, summary: dict) -> pd.DataFrame:
    """Behind an L7 proxy a client connection's statements run on whichever pooled server connection is free: its
    statements go on the client connection's lane (front_conn_id, the id the proxy gave it), so that a wait inside
    the proxy lies before its execution instead of under another statement's; only what the proxy sent on its own
    stays on the server connection's lane, in its thread group."""
    if ((summary.get("proxy") or {}).get("kind") != "l7" or "front_conn_id" not in sel.columns
            or not sel["front_conn_id"].notna().any()):
        return sel
    front = sel["front_conn_id"].notna()
    return sel.assign(conn_id=sel["front_conn_id"].where(front, sel["conn_id"]),
                      thread_group=sel["thread_group"].where(~front))


def _lanes(sel: pd.DataFrame, klass: np.ndarray, dur: np.ndarray, start: np.ndarray,
           end: np.ndarray) -> tuple[np.ndarray, list[str], dict]:
    """Lane per row, ordered by thread group: a connection's statements on one lane, and connections that follow
    each other in time (short connections of a pool or a churn) sharing a lane; beyond TIMELINE_LANES the lanes
    with the least notable, least time go into one shared lane. Returns (lane per row, labels, {thread group:
    (first lane, last lane)})."""
    conn = sel["conn_id"].to_numpy(dtype="float64", na_value=np.nan)
    known = ~np.isnan(conn)
    capture = pd.factorize(sel["capture"].astype(object).to_numpy())[0]
    key = pd.DataFrame({"c": np.where(known, conn, -1.0), "f": np.where(known, -1, capture),
                        "i": np.where(known, -1, sel["conn_index"].to_numpy(dtype=np.int64))})
    code = key.groupby(["c", "f", "i"], sort=False).ngroup().to_numpy()
    group = sel["thread_group"].to_numpy(dtype="float64", na_value=np.nan)
    per = pd.DataFrame({"code": code, "k": klass, "d": dur, "g": group, "c": key["c"], "i": key["i"],
                        "cap": sel["capture"].astype(object).to_numpy(), "s": start, "e": end})
    conns = aggregated(per.groupby("code"), k=("k", "max"), d=("d", "sum"), g=("g", "first"), c=("c", "first"),
                       i=("i", "first"), cap=("cap", "first"), s=("s", "min"), e=("e", "max"))
    conns = conns.sort_values(["g", "s", "c"], na_position="last")
    # greedy interval packing per group: a connection takes the lane that fell free first, if it is free
    slot = np.zeros(len(conns), dtype=np.int64)  # per connection code (conns' index: 0 … connections − 1)
    slots: list[dict] = []
    free: dict = {}
    for code_, r in zip(conns.index, conns.itertuples(index=False)):
        g = -1 if np.isnan(r.g) else int(r.g)
        heap = free.setdefault(g, [])
        if heap and heap[0][0] < r.s:
            _, n = heapq.heappop(heap)
        else:
            n = len(slots)
            slots.append({"g": r.g, "k": 0, "d": 0.0, "who": [], "order": len(heap)})
        heapq.heappush(heap, (r.e, n))
        slots[n]["k"] = max(slots[n]["k"], r.k)
        slots[n]["d"] += r.d
        slots[n]["who"].append(f"conn {int(r.c)}" if r.c >= 0 else
                               f"{clip(str(r.cap).rsplit('/', 1)[-1], 24)} #{int(r.i)}")
        slot[code_] = n
    table = pd.DataFrame(slots)
    table["other"] = False
    if len(table) > TIMELINE_LANES:
        ranked = table.sort_values(["k", "d"], ascending=False).index[: TIMELINE_LANES - 1]
        table["other"] = ~table.index.isin(ranked)
    table["n"] = np.arange(len(table))
    order = table.sort_values(["other", "g", "n"], na_position="last")
    shown = order[~order["other"]]
    labels = []
    for r in shown.itertuples():
        who = r.who[0] + (f" + {len(r.who) - 1} after it" if len(r.who) > 1 else "")
        labels.append(plain(who if np.isnan(r.g) else f"g{int(r.g)} · {who}"))
    position = np.full(len(table), len(shown), dtype=np.int64)
    position[shown.index.to_numpy()] = np.arange(len(shown))
    if table["other"].any():
        hidden = sum(len(w) for w in table.loc[table["other"], "who"])
        labels.append(f"{hidden} other connections")
    lane = position[slot[code]]  # ngroup codes are 0 … connections − 1
    shown_g = shown["g"].to_numpy(dtype=np.float64)
    spans = {}
    for g in np.unique(shown_g[~np.isnan(shown_g)]):
        at = np.flatnonzero(shown_g == g)  # ascending: the group's first and last lane
        spans[int(g)] = (int(at[0]), int(at[-1]))
    return lane, labels, spans


EXEC_SOURCES = ("slow_log", "fingerprint_median", "below_long_query_time", "flagged_slow")


def _hover_table(sel: pd.DataFrame, start: np.ndarray, certain: np.ndarray, estimated: np.ndarray) -> dict:
    """What the timeline's tooltip shows per marker, column by column (typed arrays; statement texts once each):
    the page's script writes it into the tooltip as text, so nothing in it is ever read as markup."""
    sql = sel["sql"].astype(object).where(sel["sql"].notna(), sel["command"].astype(object)).to_numpy()
    # each distinct statement made visible once: numbered by first appearance, as the per-row texts would be
    raw_codes, raw = pd.factorize(pd.Series(sql, dtype=object), use_na_sentinel=False)
    text_codes, texts = pd.factorize(pd.Series([visible(clip(v, 300)) for v in raw], dtype=object))
    codes = text_codes[raw_codes] if len(raw_codes) else raw_codes
    source_code = sel["exec_source"].astype(object).map({v: i for i, v in enumerate(EXEC_SOURCES)})
    source_code = source_code.fillna(255).to_numpy(dtype=np.uint8)

    def f4(col: str) -> dict:
        return _arr(sel[col].to_numpy(dtype="float64", na_value=np.nan).astype(np.float32))

    def i4(col: str) -> dict:
        return _arr(sel[col].to_numpy(dtype="float64", na_value=-1).astype(np.int32))

    return {"texts": list(texts), "sources": list(EXEC_SOURCES), "sql": _arr(codes.astype(np.int32)),
            "conn": i4("conn_id"), "group": i4("thread_group"), "start": _arr(_ms(start)),
            "total": f4("total_s"), "server": f4("server_s"), "queue": _arr(certain.astype(np.float32)),
            "estimated": _arr(estimated.astype(np.float32)), "exec": f4("exec_s"), "network": f4("network_s"),
            "source": _arr(source_code),
            **({"proxy": f4("proxy_s"), "proxywait": f4("proxy_wait_s"), "front": i4("front_conn_id")}
               if "proxy_s" in sel.columns and sel["proxy_s"].notna().any() else {})}


def _stall_bands(summary: dict, lane_group: dict, axis: TimeAxis) -> list[dict]:
    shapes = []
    for s in ((summary.get("groups") or {}).get("stalls") or [])[:STALL_BANDS]:
        g = s.get("thread_group")
        if g not in lane_group:
            continue
        lo, hi = lane_group[g]
        shapes.append({"type": "rect", "xref": "x", "yref": "y", "layer": "below", "line": {"width": 0},
                       "fillcolor": "rgba(214,39,40,0.10)", "x0": pd.Timestamp(s["start"]).value / 1e6,
                       "x1": pd.Timestamp(s["end"]).value / 1e6, "y0": lo - 0.5, "y1": hi + 0.5})
    return shapes


def _rebin(starts: np.ndarray, bucket_ns: int, axis: TimeAxis) -> tuple[np.ndarray, int, np.ndarray]:
    """Buckets inside the axis, merged k at a time so that at most TIME_BUCKETS remain. Returns (kept mask, new
    bucket length, new bucket index of each kept bucket)."""
    keep = (starts + bucket_ns > axis.lo_ns) & (starts <= axis.hi_ns)
    k = max(1, int(np.ceil((axis.hi_ns - axis.lo_ns) / bucket_ns / TIME_BUCKETS)))
    first = int(starts[keep].min()) if keep.any() else 0
    return keep, bucket_ns * k, (starts[keep] - first) // (bucket_ns * k)


def _bucketed(frame: pd.DataFrame, axis: TimeAxis | None, means: list[str], maxes: list[str] = (),
              sums: list[str] = (), by: str | None = None) -> pd.DataFrame | None:
    """groups/pool rows inside the axis, re-bucketed to at most TIME_BUCKETS buckets: means stay means (equal
    bucket lengths), maxima maxima, sums sums. Adds start_ns and bucket_ns."""
    if frame is None or len(frame) == 0 or axis is None:
        return None
    starts, _ = ts_ns(frame["bucket_start"])
    bucket_ns = int(round(float(frame["bucket_s"].iloc[0]) * NS))
    keep, new_ns, index = _rebin(starts, bucket_ns, axis)
    if not keep.any():
        return None
    part = frame.loc[keep, [c for c in (by, *means, *maxes, *sums) if c]].copy()
    first = int(starts[keep].min())
    part["b"] = index
    keys = [by, "b"] if by else ["b"]
    functions = {**{c: "mean" for c in means}, **{c: "max" for c in maxes}, **{c: "sum" for c in sums}}
    merged = aggregated(part.groupby(keys, sort=True), **{c: (c, f) for c, f in functions.items()}).reset_index()
    merged["start_ns"] = first + merged["b"].to_numpy(dtype=np.int64) * new_ns
    merged["bucket_ns"] = new_ns
    return merged


def _heatmap(groups: pd.DataFrame | None, axis: TimeAxis | None) -> dict | None:
    b = _bucketed(groups, axis, [], sums=["queue_s"], by="thread_group")
    if b is None:
        return None
    pivot = b.pivot_table(index="thread_group", columns="start_ns", values="queue_s", aggfunc="sum", fill_value=0.0)
    bucket_ns = int(b["bucket_ns"].iloc[0])
    edges = np.append(pivot.columns.to_numpy(dtype=np.int64), int(pivot.columns[-1]) + bucket_ns)
    data = [{"type": "heatmap", "z": pivot.to_numpy(dtype=np.float64).tolist(), "x": _arr(_ms(edges)),
             "y": [f"group {int(g)}" for g in pivot.index], "colorscale": "Reds", "zmin": 0,
             "colorbar": {"title": {"text": "queue s"}, "thickness": 12, "x": 1.01, "xanchor": "left"},
             "hovertemplate": "%{y}, %{x}<br>queueing %{z:.3f} s<extra></extra>"}]
    return {"data": data, "layout": _layout(max(160, 28 * len(pivot) + 90), xaxis=_time_xaxis(axis),
                                            yaxis={"fixedrange": True, "autorange": "reversed"})}


def _pool(summary: dict, groups: pd.DataFrame | None, pool: pd.DataFrame | None, axis: TimeAxis | None) -> dict | None:
    """Statements executing and queued over time, the whole server together (pool.parquet when the analysis wrote
    it, else the sum over thread groups), and the inferred thread_pool_max_threads when there is one."""
    data = []
    if pool is not None and len(pool):
        p = _bucketed(pool, axis, ["executing", "queued"], maxes=[c for c in ("executing_max", "queued_max")
                                                                  if c in pool.columns])
    else:
        g = _bucketed(groups, axis, ["executing", "queued"], by="thread_group")
        p = None if g is None else aggregated(g.groupby("start_ns"), executing=("executing", "sum"),
                                              queued=("queued", "sum"), bucket_ns=("bucket_ns", "first")).reset_index()
    if p is None:
        return None
    xs = _ms(np.append(p["start_ns"].to_numpy(dtype=np.int64), int(p["start_ns"].iloc[-1]) + int(p["bucket_ns"].iloc[0])))
    for col, label, color, dash in (("executing_max", "executing (most at once)", COLORS["executing"], "solid"),
                                    ("executing", "executing (mean)", "#98df8a", "solid"),
                                    ("queued_max", "queued (most at once)", COLORS["queued"], "solid"),
                                    ("queued", "queued (mean)", "#f4a6a6", "dot")):
        if col in p.columns:
            v = p[col].to_numpy(dtype=np.float64)
            data.append({"type": "scatter", "mode": "lines", "name": label, "x": _arr(xs),
                         "y": _arr(np.append(v, v[-1])), "line": {"shape": "hv", "color": color, "dash": dash},
                         "hoverinfo": "x+y+name"})
    shapes, annotations = [], []
    cap = (summary.get("pool") or {}).get("cap")
    if cap and cap.get("threads"):
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": cap["threads"],
                       "y1": cap["threads"], "line": {"dash": "dash", "color": "#444", "width": 1}})
        annotations.append({"xref": "paper", "x": 0, "y": cap["threads"], "yanchor": "bottom", "showarrow": False,
                            "xanchor": "left", "text": f"thread_pool_max_threads = {int(cap['threads'])} (inferred)"})
    return {"data": data, "layout": _layout(260, xaxis=_time_xaxis(axis), shapes=shapes, annotations=annotations,
                                            yaxis={"title": {"text": "statements"}, "rangemode": "tozero",
                                                   "fixedrange": True})}


def _proxy(x: pd.DataFrame, axis: TimeAxis | None) -> dict | None:
    """Through a proxy with its capture: statements waiting inside the proxy (P1 → P2) and statements it had sent on
    and not yet seen answered (P2 → P3), most at once per time bucket — a pool smaller than its clients shows as a
    flat "sent on" line with waiting ones above it — and each paired statement's wait as a marker at its arrival
    (every wait of STALL_MIN_QUEUE_S or more, a sample of the rest)."""
    if axis is None or "proxy_back_req_ts" not in x.columns or not x["proxy_back_req_ts"].notna().any():
        return None  # (none sent on by a proxy, none waited in one: no copy of its times for that)
    (p1, h1), (p2, h2), (p3, h3) = (ts_ns(x[c]) for c in ("proxy_front_req_ts", "proxy_back_req_ts",
                                                          "proxy_back_resp_ts"))
    waiting = h1 & h2 & (p2 >= p1) & axis.inside(p1) & axis.inside(p2)
    onward = h2 & h3 & (p3 >= p2) & axis.inside(p2) & axis.inside(p3)
    if not waiting.any():
        return None
    bucket_ns = nice_bucket_ns(axis.hi_ns - axis.lo_ns)
    data = []
    for label, a, b, color in (("waiting inside the proxy (most at once)", p1[waiting], p2[waiting],
                                COLORS["inside the proxy"]),
                               ("sent on to the DB (most at once)", p2[onward], p3[onward], COLORS["execution"])):
        if len(a):
            edges, most = _most_at_once(a, b, bucket_ns, axis)
            data.append({"type": "scatter", "mode": "lines", "name": label, "x": _arr(_ms(edges)),
                         "y": _arr(np.append(most, most[-1]).astype(np.float64)),
                         "line": {"shape": "hv", "color": color}, "hoverinfo": "x+y+name"})
    wait_s = (p2 - p1) / NS
    rows = np.flatnonzero(waiting)
    long_ = rows[wait_s[rows] >= STALL_MIN_QUEUE_S]
    rest = rows[wait_s[rows] < STALL_MIN_QUEUE_S]
    room = max(CONNECTION_POINTS - len(long_), 0)
    if len(rest) > room:
        rest = np.sort(np.random.default_rng(0).choice(rest, room, replace=False))
    shown = np.sort(np.concatenate([long_[:CONNECTION_POINTS], rest]))
    data.append({"type": "scattergl", "mode": "markers", "name": "one statement's wait, ms (right axis)",
                 "x": _arr(_ms(p1[shown])), "y": _arr(wait_s[shown] * 1e3), "yaxis": "y2",
                 "marker": {"color": COLORS["inside the proxy"], "size": 6, "symbol": "circle-open"},
                 "hovertemplate": "%{x}<br>waited %{y:.3f} ms inside the proxy<extra></extra>"})
    return {"data": data, "layout": _layout(280, xaxis=_time_xaxis(axis),
                                            yaxis={"title": {"text": "statements at once"}, "rangemode": "tozero"},
                                            yaxis2={"title": {"text": "wait, ms"}, "overlaying": "y", "side": "right",
                                                    "rangemode": "tozero", "showgrid": False})}


def _most_at_once(start: np.ndarray, end: np.ndarray, bucket_ns: int, axis: TimeAxis) -> tuple[np.ndarray, np.ndarray]:
    """How many of the intervals [start, end) overlap at most, per bucket of the axis. Returns (bucket edges, most
    per bucket): an interval ending when another starts does not count twice."""
    n = int((axis.hi_ns - axis.lo_ns) // bucket_ns) + 1
    t = np.concatenate([start, end])
    step = np.concatenate([np.ones(len(start), dtype=np.int64), -np.ones(len(end), dtype=np.int64)])
    order = np.lexsort((step, t))  # at one instant the ends first
    t, level = t[order], np.cumsum(step[order])
    edges = axis.lo_ns + bucket_ns * np.arange(n + 1, dtype=np.int64)
    # the level at a bucket's first instant: after every event up to it (ends at that instant included) ...
    before = np.searchsorted(t, edges[:-1], side="right") - 1
    most = np.where(before >= 0, level[np.maximum(before, 0)], 0)
    # ... and every level an event inside the bucket leaves (one between an end and a start at the same instant
    # lies between the level before and after it, both counted)
    k = np.clip((t - axis.lo_ns) // bucket_ns, 0, n - 1)
    inside = t > edges[k]
    np.maximum.at(most, k[inside], level[inside])
    return edges, most


# what the waterfall reads of its rows (queue_layers' and bounded_part's columns among them)
WATERFALL_COLUMNS = ("conn_id", "sql", "command", *QUEUE_COLUMNS, "net_req_s", "proxy_wait_s", "net_resp_s",
                     "total_s")


def _waterfall(x: pd.DataFrame, columns: HeldColumns) -> dict | None:
    """The slowest exchanges, each from A1 (D1 when only the DB saw it): request leg, the wait inside a proxy,
    queueing, execution, response leg; rows under WATERFALL_MIN_SHARE of the slowest would be empty bars and are left out."""
    total = x["total_s"].to_numpy(dtype="float64", na_value=np.nan)
    top = _largest_positive(np.where(np.isnan(total), x["server_s"].to_numpy(dtype="float64", na_value=np.nan),
                                     total), WATERFALL_ROWS)  # by total_s, else server_s
    del total
    if top.empty:
        return None
    top = top[top >= WATERFALL_MIN_SHARE * top.iloc[0]]
    rows = columns.at(top.index.to_numpy()[::-1], WATERFALL_COLUMNS)  # slowest at the top
    labels = [plain(f"conn {integer(c)} · {clip(q if isinstance(q, str) else m, 50)}")
              for c, q, m in zip(rows["conn_id"], rows["sql"], rows["command"])]
    labels = [f"{i + 1}. {lab}" for i, lab in zip(range(len(labels) - 1, -1, -1), labels)]  # unique, ranked
    certain, likely, estimated = queue_layers(rows)
    request = rows["net_req_s"].to_numpy(dtype="float64", na_value=np.nan)
    # through a proxy with its capture the request leg holds the wait inside the proxy (P2 − P1): drawn apart
    wait = (rows["proxy_wait_s"].to_numpy(dtype="float64", na_value=np.nan) if "proxy_wait_s" in rows.columns
            else np.full(len(rows), np.nan))
    waited = ~np.isnan(wait) & ~np.isnan(request)
    parts = [("request leg", np.where(waited, request - np.where(waited, wait, 0.0), request)),
             ("inside the proxy", np.where(waited, wait, np.nan)), ("queueing", certain), ("queueing (likely)", likely),
             ("queueing (estimated)", estimated), ("execution", rows["exec_s"].to_numpy(dtype="float64", na_value=np.nan)),
             ("execution or waiting (bounded)", bounded_part(rows)),
             ("response leg", rows["net_resp_s"].to_numpy(dtype="float64", na_value=np.nan))]
    data, base = [], np.zeros(len(rows))
    for label, v in parts:
        v = np.where(np.isnan(v), 0.0, np.maximum(v, 0.0))
        if v.any():
            data.append({"type": "bar", "orientation": "h", "y": labels, "x": _arr(v), "base": _arr(base.copy()),
                         "name": label, "marker": {"color": COLORS[label]}, "hoverinfo": "text",
                         "hovertext": [f"{label}: {seconds(s)}" for s in v]})
        base += v
    total = rows["total_s"].fillna(rows["server_s"]).to_numpy(dtype="float64")
    data.append({"type": "scatter", "mode": "text", "y": labels, "x": _arr(np.maximum(base, total)),
                 "text": [seconds(v) for v in total], "textposition": "middle right", "showlegend": False,
                 "hoverinfo": "skip", "textfont": {"size": 10}})
    return {"data": data, "layout": _layout(max(220, 24 * len(rows) + 100), barmode="overlay",
                                            margin=dict(l=20, r=60, t=40, b=40),
                                            xaxis={"title": {"text": "seconds from A1"}, "rangemode": "tozero"},
                                            yaxis={"automargin": True, "tickfont": {"size": 10}})}


def _largest_positive(values: np.ndarray, n: int) -> pd.Series:
    """The n largest values above 0 (NaN left out) as a Series of their positions: Series.nlargest(n) of them all
    (largest first, ties in row order), taken among the values at or above the n-th largest alone, without the
    copies of every row (and of its index) nlargest, dropna and a row filter would make."""
    positive = values > 0
    count = int(np.count_nonzero(positive))
    if count > n:
        taken = values[positive]
        taken.partition(count - n)  # in place: the n-th largest at count − n
        positive &= values >= taken[count - n]
        del taken
    at = np.flatnonzero(positive)
    return pd.Series(values[at], index=at, copy=False).nlargest(n)


def _connection_rate(conns: pd.DataFrame | None, axis: TimeAxis | None) -> dict | None:
    """New connections per bucket over the whole capture (plain and TLS stacked), and each connection's set-up
    latencies (SYN → greeting, greeting → OK) at its SYN time, on the shared time axis."""
    if conns is None or axis is None or len(conns) == 0:
        return None
    inside = axis.inside(conns["t_ns"].to_numpy(dtype=np.int64))
    c = conns[inside]
    if len(c) == 0:
        return None
    bucket_ns = nice_bucket_ns(axis.hi_ns - axis.lo_ns)
    first = axis.lo_ns - axis.lo_ns % bucket_ns
    n = int((axis.hi_ns - first) // bucket_ns) + 1
    index = (c["t_ns"].to_numpy(dtype=np.int64) - first) // bucket_ns
    tls = c["tls"].to_numpy(dtype=bool)
    centers = _ms(first + np.arange(n, dtype=np.int64) * bucket_ns + bucket_ns // 2)
    data = []
    for label, mask in (("plain", ~tls), ("TLS", tls)):
        counts = np.bincount(index[mask], minlength=n).astype(np.float64)
        if counts.any() or label == "plain":
            data.append({"type": "bar", "name": f"new connections ({label})", "x": _arr(centers),
                         "y": _arr(counts), "width": bucket_ns / 1e6, "marker": {"color": COLORS[label]},
                         "hoverinfo": "x+y+name"})
    pick = _latency_points(c)
    for col, label, color in (("syn_greeting_s", "SYN → greeting, ms", "#cc6600"),
                              ("greeting_ok_s", "greeting → OK, ms", "#7f3c8d")):
        v = c[col].to_numpy(dtype=np.float64)[pick]
        ok = ~np.isnan(v)
        if ok.any():
            data.append({"type": "scattergl", "mode": "markers", "name": label, "yaxis": "y2",
                         "x": _arr(_ms(c["t_ns"].to_numpy(dtype=np.int64)[pick][ok])), "y": _arr(v[ok] * 1e3),
                         "marker": {"size": 6, "color": color}, "hoverinfo": "x+y+name"})
    width = _round_duration(bucket_ns)
    layout = _layout(300, barmode="stack", xaxis=_time_xaxis(axis),
                     yaxis={"title": {"text": f"new connections per {width}"}, "rangemode": "tozero",
                            "fixedrange": True},
                     yaxis2={"title": {"text": "set-up ms"}, "overlaying": "y", "side": "right", "rangemode": "tozero",
                             "fixedrange": True, "showgrid": False, "tickformat": ".3~g"})
    return {"data": data, "layout": layout}


def _open_connections(summary: dict, axis: TimeAxis | None) -> dict | None:
    """Open connections over time from summary.json (connections.open_series: samples of the sweep, at most
    connstory.SERIES_POINTS) as a step line, with the peak (open_max at open_max_at) put in its place and marked,
    so the line reaches the most open at once even between two samples; on the shared time axis."""
    story = summary.get("connections") or {}
    series = story.get("open_series") or []
    if axis is None or not series:
        return None
    t = np.array([pd.Timestamp(p["t"]).value for p in series], dtype=np.int64)
    level = np.array([p["open"] for p in series], dtype=np.float64)
    peak_at = pd.Timestamp(story["open_max_at"]).value if story.get("open_max_at") and story.get("open_max") else None
    if peak_at is not None:
        at = int(np.searchsorted(t, peak_at, side="right"))
        t = np.insert(t, at, peak_at)
        level = np.insert(level, at, float(story["open_max"]))
    keep = axis.inside(t)
    if not keep.any():
        return None
    data = [{"type": "scatter", "mode": "lines", "name": "open connections", "x": _arr(_ms(t[keep])),
             "y": _arr(level[keep]), "line": {"shape": "hv", "color": COLORS["statement"]},
             "hovertemplate": "%{x}<br>%{y} open<extra></extra>"}]
    if peak_at is not None and axis.inside(np.array([peak_at]))[0]:
        data.append({"type": "scatter", "mode": "markers", "name": f"most at once: {int(story['open_max'])}",
                     "x": _arr(_ms(np.array([peak_at], dtype=np.int64))),
                     "y": _arr(np.array([float(story["open_max"])])),
                     "marker": {"size": 9, "color": COLORS["queued"], "symbol": "diamond"},
                     "hovertemplate": "%{x}<br>most open at once: %{y}<extra></extra>"})
    return {"data": data, "layout": _layout(240, xaxis=_time_xaxis(axis),
                                            yaxis={"title": {"text": "open connections"}, "rangemode": "tozero",
                                                   "fixedrange": True})}


def _round_duration(ns: int) -> str:
    """A bucket length from _NICE_BUCKETS_S in words: 20 ms, 1 s, 10 min."""
    for unit, size in (("h", 3600 * NS), ("min", 60 * NS), ("s", NS), ("ms", 1_000_000)):
        if ns >= size and ns % size == 0:
            return f"{ns // size} {unit}"
    return seconds(ns / NS)


def _latency_points(c: pd.DataFrame) -> np.ndarray:
    """At most CONNECTION_POINTS connections: the slowest tenth of the budget, then a uniform sample."""
    n = len(c)
    if n <= CONNECTION_POINTS:
        return np.arange(n)
    slow = np.nan_to_num(c["syn_ok_s"].fillna(c["greeting_ok_s"]).to_numpy(dtype=np.float64), nan=-1.0)
    worst = np.argsort(-slow)[: CONNECTION_POINTS // 10]
    rest = np.setdiff1d(np.arange(n), worst)
    sample = np.random.default_rng(0).choice(rest, CONNECTION_POINTS - len(worst), replace=False)
    return np.sort(np.concatenate([worst, sample]))
