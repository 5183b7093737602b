"""The report's plotly figures, as JSON-ready {data, layout} specs. Each figure is bounded in size whatever the
number of exchanges: the timeline samples (keeping every slow one), the others aggregate."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go

TIMELINE_POINTS = 20_000
WATERFALL_ROWS = 30
RATE_BINS = 200
COLORS = {"network": "#6a9fd4", "queueing": "#d9534f", "execution": "#5cb85c", "request leg": "#6a9fd4",
          "response leg": "#9cc3ea"}


def figure_specs(summary: dict, x: pd.DataFrame, groups: pd.DataFrame) -> dict:
    specs: dict = {}
    specs["shares"] = _spec(_shares(x))
    timeline, meta = _timeline(summary, x)
    specs["timeline"], specs["_timeline_meta"] = _spec(timeline), meta
    specs["heatmap"] = _spec(_heatmap(groups))
    specs["inflight"] = _spec(_inflight(groups))
    specs["waterfall"] = _spec(_waterfall(x))
    specs["connrate"] = _spec(_connection_rate(x))
    return specs


def _spec(fig: go.Figure | None) -> dict | None:
    return None if fig is None else json.loads(fig.to_json())


def _when(x: pd.DataFrame) -> pd.Series:
    return x["app_req_ts"].fillna(x["db_req_ts"]).fillna(x["req_first_ts"])


def _layout(fig: go.Figure, **kw) -> go.Figure:
    fig.update_layout(margin=dict(l=60, r=20, t=30, b=40), template="plotly_white", **kw)
    return fig


def _shares(x: pd.DataFrame) -> go.Figure | None:
    both = x.loc[x["seen"] == "both", ["total_s", "network_s", "queue_s", "exec_s"]]
    if both.empty or not float(both["total_s"].sum()) > 0:
        return None
    fig = go.Figure()
    for col, label in (("network_s", "network"), ("queue_s", "queueing"), ("exec_s", "execution")):
        total = float(both[col].sum())
        fig.add_bar(y=["client time"], x=[total], name=label, orientation="h", marker_color=COLORS[label],
                    hovertemplate=f"{label}: %{{x:.3f}} s<extra></extra>")
    return _layout(fig, barmode="stack", xaxis_title="seconds, summed over exchanges seen at both points", height=220)


def _timeline(summary: dict, x: pd.DataFrame) -> tuple[go.Figure | None, dict]:
    if x.empty:
        return None, {}
    y = x["server_s"].fillna(x["total_s"]).fillna(x["response_s"])
    ok = y.notna().to_numpy()
    hidden = x["hidden_slow"].fillna(False).to_numpy(bool) & ok
    logged = x["in_slow_log"].fillna(False).to_numpy(bool) & ok & ~hidden
    lqt = summary["inputs"]["long_query_time"]
    slow = (y.to_numpy(float, na_value=np.nan) > lqt) if lqt is not None else np.zeros(len(x), bool)
    rest = ok & ~hidden & ~logged
    keep_rest = np.flatnonzero(rest & slow)
    others = np.flatnonzero(rest & ~slow)
    room = max(TIMELINE_POINTS - int(hidden.sum()) - int(logged.sum()) - len(keep_rest), 0)
    if len(others) > room:
        others = np.sort(np.random.default_rng(0).choice(others, room, replace=False))
    fig = go.Figure()
    shown = 0
    for rows, name, color, size in ((np.concatenate([keep_rest, others]), "exchanges", "#7a8fa6", 4),
                                    (np.flatnonzero(logged), "in the slow log", "#f0ad4e", 7),
                                    (np.flatnonzero(hidden), "hidden slow", "#d62728", 9)):
        if len(rows) == 0:
            continue
        sel = x.iloc[np.sort(rows)]
        shown += len(sel)
        fig.add_scattergl(x=_when(sel).dt.tz_convert(None), y=np.maximum(y.iloc[np.sort(rows)].to_numpy(float), 1e-6),
                          mode="markers", name=name, marker=dict(color=color, size=size),
                          text=_hover(sel), hovertemplate="%{text}<extra></extra>")
    if lqt is not None:
        fig.add_hline(y=max(lqt, 1e-6), line_dash="dash", line_color="#444",
                      annotation_text=f"long_query_time {lqt} s", annotation_position="top left")
    _layout(fig, yaxis_type="log", yaxis_title="server time, s (log)", xaxis_title="request time (UTC, app clock)",
            height=440, legend=dict(orientation="h", y=1.08))
    return fig, {"total": int(ok.sum()), "shown": shown, "sampled": shown < int(ok.sum())}


def _hover(sel: pd.DataFrame) -> list[str]:
    def f(v) -> str:
        return "–" if pd.isna(v) else f"{float(v) * 1e3:.2f} ms"

    out = []
    for r in sel[["sql", "command", "conn_id", "thread_group", "total_s", "server_s", "queue_s", "exec_s",
                  "network_s"]].itertuples(index=False):
        sql = r.sql if isinstance(r.sql, str) else r.command
        sql = sql if len(sql) <= 120 else sql[:119] + "…"
        out.append(f"{_html(sql)}<br>conn {r.conn_id if pd.notna(r.conn_id) else '?'}, group "
                   f"{r.thread_group if pd.notna(r.thread_group) else '?'}<br>client {f(r.total_s)}, server "
                   f"{f(r.server_s)}<br>queue {f(r.queue_s)}, exec {f(r.exec_s)}, network {f(r.network_s)}")
    return out


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _heatmap(groups: pd.DataFrame) -> go.Figure | None:
    if groups is None or groups.empty:
        return None
    pivot = groups.pivot_table(index="thread_group", columns="bucket_start", values="queue_s", aggfunc="sum",
                               fill_value=0.0)
    fig = go.Figure(go.Heatmap(z=pivot.to_numpy(float), x=pd.DatetimeIndex(pivot.columns).tz_convert(None),
                               y=[f"group {g}" for g in pivot.index], colorscale="Reds",
                               colorbar=dict(title="queue s"),
                               hovertemplate="%{y} %{x}<br>queueing %{z:.3f} s<extra></extra>"))
    return _layout(fig, height=max(180, 40 * len(pivot) + 100), xaxis_title="time (UTC, app clock)")


def _inflight(groups: pd.DataFrame) -> go.Figure | None:
    if groups is None or groups.empty:
        return None
    fig = go.Figure()
    for g, part in groups.groupby("thread_group"):
        fig.add_scattergl(x=part["bucket_start"].dt.tz_convert(None), y=part["in_flight"].to_numpy(float),
                          mode="lines", name=f"group {g} in flight", line_shape="hv")
        fig.add_scattergl(x=part["bucket_start"].dt.tz_convert(None), y=part["queued"].to_numpy(float),
                          mode="lines", name=f"group {g} queued", line_shape="hv", line_dash="dot")
    return _layout(fig, height=300, yaxis_title="mean exchanges", xaxis_title="time (UTC, app clock)")


def _waterfall(x: pd.DataFrame) -> go.Figure | None:
    key = x["total_s"].fillna(x["server_s"]).dropna()
    top = x.loc[key.nlargest(WATERFALL_ROWS).index]  # the rows needed, not a sorted copy of the table
    if top.empty:
        return None
    top = top.iloc[::-1]  # slowest at the top
    labels = [f"conn {c if pd.notna(c) else '?'} #{s}: {_short(q if isinstance(q, str) else m)}"
              for c, s, q, m in zip(top["conn_id"], top["seq"], top["sql"], top["command"])]
    parts = [("request leg", top["net_req_s"]), ("queueing", top["queue_s"]), ("execution", top["exec_s"]),
             ("response leg", top["net_resp_s"])]
    fig = go.Figure()
    base = np.zeros(len(top))
    for label, values in parts:
        v = values.to_numpy(float, na_value=np.nan)
        v = np.where(np.isnan(v), 0.0, np.maximum(v, 0.0))
        fig.add_bar(y=labels, x=v, base=base.copy(), orientation="h", name=label, marker_color=COLORS[label],
                    hovertemplate=f"{label}: %{{x:.4f}} s<extra></extra>")
        base += v
    return _layout(fig, barmode="overlay", height=max(300, 22 * len(top) + 80), xaxis_title="seconds from A1",
                   yaxis=dict(automargin=True, tickfont=dict(size=10)))


def _connection_rate(x: pd.DataFrame) -> go.Figure | None:
    conn = x[x["command"] == "CONNECT"]
    if conn.empty:
        return None
    ns = _when(conn).astype("int64").to_numpy()
    lo, hi = int(ns.min()), int(ns.max())
    bins = min(RATE_BINS, max(1, (hi - lo) // 100_000_000 + 1))  # ≥ 100 ms per bin
    # relative to the first login: float64 cannot tell epoch nanoseconds 1 ns apart (one login, or logins sharing a
    # timestamp, made numpy refuse the range); the range spans at least the bins' 100 ms, so the rate is per 100 ms
    span = max(hi - lo + 1, bins * 100_000_000)
    counts, edges = np.histogram(ns - lo, bins=bins, range=(0, span))
    width_s = (edges[1] - edges[0]) / 1e9
    edges = edges.astype("int64") + lo
    fig = go.Figure()
    fig.add_bar(x=pd.to_datetime(edges[:-1].astype("int64"), utc=True).tz_convert(None), y=counts / width_s,
                name="new connections / s", marker_color="#8888cc")
    hs = conn["response_s"].to_numpy(float, na_value=np.nan)
    fig.add_scattergl(x=pd.to_datetime(ns, utc=True).tz_convert(None), y=hs * 1e3, mode="markers",
                      name="handshake ms", yaxis="y2", marker=dict(size=5, color="#cc6600"))
    return _layout(fig, height=300, yaxis_title="connections / s",
                   yaxis2=dict(title="handshake ms", overlaying="y", side="right"), xaxis_title="time (UTC)",
                   legend=dict(orientation="h", y=1.1))


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
