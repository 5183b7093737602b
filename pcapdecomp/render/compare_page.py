"""comparison.html: one self-contained page (plotly.js inlined once) that puts two or more analyses side by side.

Sections: the headline and the notes on comparability, the analyses compared, the overall counts and percentiles,
the components (network, queueing, execution), the thread groups, the Query IDs, method and columns. Every text
that comes from a capture, a log or a folder name is escaped for where it lands (render/report.py's helpers for HTML,
render.figures' for plotly labels, and JSON inside <script> with <, > and & as \\u escapes)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from .. import __version__
from ..core.formats import clip, pct_change, seconds
from ..core.schema import COMPARISON_COLUMNS, COMPARISON_METRICS
from .figures import COLORS
from .figures import plain as _label
from .report import _BOOT, _ERRORS, _STYLE, esc

TOP_QUERY_IDS = 50
STEP_COLORS = ("#7a8fa6", "#f0ad4e", "#5cb85c", "#6a9fd4", "#d9534f", "#9467bd", "#8c564b", "#e377c2")
METRIC_LABELS = {"calls": "exchanges", "slow_wire": "slow on the wire", "hidden_slow": "hidden slow",
                 "in_slow_log": "in the slow log", "understated": "understated", "sum_s": "time, summed",
                 "p50_s": "p50", "p95_s": "p95", "p99_s": "p99", "max_s": "max"}
COMPONENT_LABELS = {"network": "network", "queueing": "queueing", "queueing_certain": "queueing (certain)",
                    "execution": "execution", "inside_the_proxy": "inside the proxy", "proxy_wait": "waiting in the proxy"}


def render(c, command_line: str | None = None) -> str:
    """The whole page as one string; `c` is a compare.Comparison."""
    import plotly.offline

    figures = {"slow": _slow_figure(c), "components": _component_figure(c), "groups": _group_figure(c)}
    specs = {name: _spec(fig) for name, fig in figures.items() if fig is not None}
    sections = [_headline(c), _analyses(c), _overall(c, "slow" in specs), _components(c, "components" in specs),
                _groups(c, "groups" in specs), _query_ids(c), _method(c, command_line)]
    payload = json.dumps(specs, separators=(",", ":"))
    # JSON inside <script>: no "<", ">" or "&" left that an HTML parser could read as markup (only strings hold them)
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    title = "pcapdecomp compare — " + " → ".join(a.label or a.name for a in c.analyses)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width'><title>{esc(title)}</title>"
        f"<style>{_STYLE}{_MORE_STYLE}</style><script>{_ERRORS}</script>"
        f"<script>{plotly.offline.get_plotlyjs()}</script></head>"
        f"<body data-rendered='no'><header><h1>{esc(title)}</h1><nav>{_nav()}</nav></header>"
        + "".join(sections) + f"<script>{_BOOT.replace('__SPECS__', payload)}</script></body></html>\n"
    )


# ------------------------------------------------------------------ sections


def _headline(c) -> str:
    lines = "".join(f"<li>{esc(line)}</li>" for line in c.headline)
    verdict = ("<p class='ok'>The analyses are comparable as far as the captures tell (same statement mix, capture "
               "points, slow log and long_query_time).</p>" if c.comparable else
               "<p class='bad'>Not comparable as they stand: see the notes marked <b>not comparable</b>.</p>")
    notes = "".join(f"<li class='{esc(n.severity.replace(' ', '-'))}'><b>{esc(n.severity)}</b> ({esc(n.kind)}): "
                    f"{esc(n.text)}</li>" for n in c.notes)
    return (f"<section id='headline'><h2>Headline</h2><p class='caption'>Every change is against the first analysis "
            f"named, {esc(c.analyses[0].name)}. Slow on the wire: the client waited longer than {esc(seconds(c.slow_s))} "
            "(A4 − A1; D4 − D1 where only the DB capture saw the exchange).</p>"
            + (f"<p class='verdict'>{esc(c.sentence)}</p>" if c.sentence else "")
            + f"<ul class='headline'>{lines}</ul>{verdict}"
            + (f"<h3>Notes</h3><ul class='notes'>{notes}</ul>" if notes else
               "<p>No differences in what was measured.</p>") + "</section>")


def _analyses(c) -> str:
    rows = []
    for a in c.analyses:
        report = a.folder / "report.html"
        href = (Path("analyses") / a.folder.name / "report.html").as_posix() if a.analysed_here else \
            report.resolve().as_uri()
        link = f"<a href='{esc(href)}'>report</a>" if a.analysed_here or report.is_file() else ""
        n, source = a.thread_pool_size
        settings = ", ".join(f"{k} = {v}" for k, v in (a.settings or {}).items() if k not in ("product",))
        rows.append([str(a.step), esc(a.name if a.label == a.name else f"{a.label} ({a.name})"),
                     f"<code>{esc(str(a.folder))}</code> {link}"
                     + (" (analysed by this run)" if a.analysed_here else ""), esc(a.capture_points),
                     esc(seconds(a.span_s) if a.span_s else "unknown"), f"{a.calls:,}",
                     f"{a.calls / a.span_s:,.1f}" if a.span_s else "–", "yes" if a.slow_log_used else "no",
                     esc(seconds(a.long_query_time) if a.long_query_time is not None else "unknown"),
                     esc(f"{n} ({source})" if n is not None else "none"), esc(settings or "unknown")])
    return ("<section id='analyses'><h2>The analyses</h2>"
            + _table(["step", "name", "analysis folder", "capture points", "length", "exchanges", "exchanges/s",
                      "slow log", "long_query_time", "thread_pool_size", "settings (capture.toml)"], rows)
            + "</section>")


def _overall(c, figure: bool) -> str:
    block = _metric_table(c, "overall", "all", [m.name for m in COMPARISON_METRICS])
    return ("<section id='overall'><h2>Slow exchanges and wire time</h2>"
            "<p class='caption'>All exchanges of each analysis. Counts with their rate per second of capture and "
            "their share of the exchanges; percentiles of the wire time. In parentheses: the change against the "
            "baseline.</p>" + ("<div id='fig-slow' class='fig small'></div>" if figure else "") + block + "</section>")


def _components(c, figure: bool) -> str:
    t = c.table
    comp = t[t["scope"] == "component"]
    if comp.empty:
        return "<section id='components'><h2>Network, queueing, execution</h2><p>no components</p></section>"
    parts = []
    for key in COMPONENT_LABELS:
        if (comp["key"] == key).any():
            parts.append(f"<h3>{esc(COMPONENT_LABELS[key])}</h3>"
                         + _metric_table(c, "component", key, ["calls", "sum_s", "p50_s", "p95_s", "p99_s", "max_s"]))
    return ("<section id='components'><h2>Network, queueing, execution</h2><p class='caption'>Per component, over "
            "the exchanges where it is known: seconds summed (per call: the mean) and percentiles. Queueing (certain) "
            "is queue_min_s: the waiting no estimate enters. Execution estimated from other runs of a statement is "
            "included in execution, as in the analysis.</p>"
            + ("<div id='fig-components' class='fig small'></div>" if figure else "") + "".join(parts) + "</section>")


def _groups(c, figure: bool) -> str:
    t = c.table
    g = t[t["scope"] == "thread_group"]
    head = "<section id='groups'><h2>Thread groups</h2>"
    if g.empty:
        return head + "<p>No analysis has thread groups (thread_pool_size unknown, or no pool).</p></section>"
    keys = sorted(g["key"].unique(), key=int)
    return (head + "<p class='caption'>Per thread group (conn_id mod thread_pool_size, as each analysis grouped "
            "them); empty where an analysis has no groups. In parentheses: the change against the baseline.</p>"
            + ("<div id='fig-groups' class='fig small'></div>" if figure else "")
            + _keyed_table(c, g, keys, ["thread group"], lambda k: [esc(k)]) + "</section>")


def _query_ids(c) -> str:
    t = c.table
    q = t[t["scope"] == "query_id"]
    head = "<section id='queries'><h2>Query IDs</h2>"
    if q.empty:
        return head + "<p>no statements</p></section>"
    time = q[q["metric"] == "sum_s"].groupby("key")["value"].max().sort_values(ascending=False, kind="stable")
    keys = list(time.index[:TOP_QUERY_IDS])
    fingerprints = q.drop_duplicates("key").set_index("key")["fingerprint"]
    more = time.size - len(keys)
    return (head + "<p class='caption'>Grouped as pt-query-digest does; the Query IDs with the most wire time in "
            f"any analysis first ({len(keys)} of {time.size} listed; all are in comparison.parquet). In parentheses: "
            "the change against the baseline.</p>"
            + _keyed_table(c, q, keys, ["Query ID", "fingerprint"], lambda k: [
                f"<code>{esc(k)}</code>", f"<code>{esc(clip(fingerprints.get(k), 160))}</code>"])
            + (f"<p>… and {more} more Query IDs.</p>" if more > 0 else "") + "</section>")


def _keyed_table(c, t: pd.DataFrame, keys: list[str], key_headers: list[str], key_cells) -> str:
    """One row per key and analysis; the key's cells span its analyses' rows."""
    metrics = ["calls", "slow_wire", "hidden_slow", "in_slow_log", "understated", "p50_s", "p95_s", "p99_s"]
    head = "".join(f"<th>{esc(h)}</th>" for h in [*key_headers, "analysis", *(METRIC_LABELS[m] for m in metrics)])
    body = []
    n = len(c.analyses)
    for key in keys:
        rows_of = t[t["key"] == key]
        for a in c.analyses:
            cells = "".join(f"<td rowspan='{n}'>{cell}</td>" for cell in key_cells(key)) if a.step == 0 else ""
            cells += f"<td>{esc(f'{a.step}: {a.label or a.name}')}</td>"
            cells += "".join(f"<td>{_value_cell(rows_of, key, m, a.step)}</td>" for m in metrics)
            body.append(f"<tr class='{'first' if a.step == 0 else ''}'>{cells}</tr>")
    return f"<table class='keyed'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _method(c, command_line: str | None) -> str:
    def columns(cols) -> str:
        return _table(["column", "dtype", "meaning"],
                      [[esc(col.name), esc(col.dtype), esc(col.meaning)] for col in cols])

    return ("<section id='method'><h2>Method and columns</h2><ul>"
            "<li>Each analysis is read from its folder (exchanges.parquet, summary.json); a capture set is analysed "
            "first by the same pipeline as <code>pcapdecomp analyze</code>.</li>"
            "<li><b>Wire time</b> is what the client waited: A4 − A1 where the app capture saw the exchange, else "
            "the server time D4 − D1, else the one capture's response time.</li>"
            "<li><b>Per second</b> divides by the capture's length (the robust span of its exchanges when the "
            "analysis found wild timestamps, else first to last frame); <b>per call</b> by the exchanges of the same "
            "row.</li><li>Every change is against step 0, the first analysis named.</li>"
            "<li><b>Statement mix</b>: the share of calls two analyses have in common by Query ID (Σ of the smaller "
            "share per Query ID); under 80 % the workloads are called not comparable.</li></ul>"
            f"<p>pcapdecomp {esc(__version__)}"
            + (f"; command: <code>{esc(command_line)}</code>" if command_line else "")
            + "</p><details><summary>comparison.parquet columns</summary>" + columns(COMPARISON_COLUMNS)
            + "</details><details><summary>metrics</summary>" + columns(COMPARISON_METRICS) + "</details></section>")


# ------------------------------------------------------------------ tables


def _metric_table(c, scope: str, key: str, metrics: list[str]) -> str:
    t = c.table
    rows_of = t[(t["scope"] == scope) & (t["key"] == key)]
    headers = ["metric"] + [f"{a.step}: {a.label or a.name}" for a in c.analyses]
    rows = []
    for m in metrics:
        sub = rows_of[rows_of["metric"] == m]
        if sub.empty:
            continue
        rows.append([esc(METRIC_LABELS.get(m, m))] + [_value_cell(rows_of, key, m, a.step, detail=True)
                                                      for a in c.analyses])
    return _table(headers, rows)


def _table(headers: list[str], rows: list[list[str]], cls: str = "") -> str:
    """A table of cells that are HTML already (each built here from escaped parts); the headers are escaped."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _value_cell(t: pd.DataFrame, key: str, metric: str, step: int, detail: bool = False) -> str:
    row = t[(t["key"] == key) & (t["metric"] == metric) & (t["step"] == step)]
    if row.empty:
        return ""
    r = row.iloc[0]
    in_seconds = metric.endswith("_s")
    text = esc(_number(r["value"], in_seconds))
    if not pd.isna(r["change"]):
        direction = _direction(r["change"]) if metric != "calls" else "same"  # more calls is neither good nor bad
        text += f" <span class='chg {direction}'>({esc(_change(r['change'], r['change_pct'], in_seconds))})</span>"
    if detail and not pd.isna(r["per_second"]):
        text += f"<br><span class='rate'>{esc(_rate(r['per_second'], in_seconds))}/s"
        if not pd.isna(r["per_call"]):
            text += f", {esc(_per_call(r['per_call'], metric))}"
        text += "</span>"
    return text


def _number(v, in_seconds: bool) -> str:
    if pd.isna(v):
        return "–"
    return seconds(v) if in_seconds else f"{v:,.0f}"


def _change(change: float, pct: float, in_seconds: bool) -> str:
    absolute = (seconds(change) if in_seconds else f"{change:+,.0f}").replace("-", "−")
    if in_seconds and change > 0:
        absolute = "+" + absolute
    return absolute if pd.isna(pct) else f"{absolute}, {pct_change(pct)}"


def _direction(change: float) -> str:
    return "down" if change < 0 else "up" if change > 0 else "same"


def _rate(v: float, in_seconds: bool) -> str:
    return f"{seconds(v)}" if in_seconds else f"{v:,.2f}"


def _per_call(v: float, metric: str) -> str:
    return f"{seconds(v)} per call" if metric == "sum_s" else f"{100 * v:.1f} % of calls"


# ------------------------------------------------------------------ figures


def _step_label(a) -> str:
    return _label(f"{a.step}: {a.label or a.name}")


def _slow_figure(c) -> go.Figure | None:
    t = c.table
    overall = t[(t["scope"] == "overall")]
    metrics = ["slow_wire", "hidden_slow", "in_slow_log", "understated"]
    fig = go.Figure()
    for a in c.analyses:
        values = [_one(overall[(overall["metric"] == m) & (overall["step"] == a.step)]["value"]) for m in metrics]
        fig.add_bar(x=[METRIC_LABELS[m] for m in metrics], y=values,
                    name=_step_label(a), marker_color=STEP_COLORS[a.step % len(STEP_COLORS)],
                    hovertemplate="%{x}: %{y}<extra>" + _step_label(a) + "</extra>")
    return _layout(fig, barmode="group", yaxis_title="exchanges", height=300)


def _component_figure(c) -> go.Figure | None:
    t = c.table
    comp = t[(t["scope"] == "component") & (t["metric"] == "sum_s")]
    if comp.empty:
        return None
    fig = go.Figure()
    labels = [_step_label(a) for a in c.analyses]
    for key, label in (("network", "network"), ("queueing", "queueing"), ("execution", "execution")):
        per_second = [_one(comp[(comp["key"] == key) & (comp["step"] == a.step)]["per_second"]) for a in c.analyses]
        fig.add_bar(y=labels, x=per_second,
                    name=label, orientation="h", marker_color=COLORS[label],
                    hovertemplate=f"{label}: %{{x:.4f}} s per second of capture<extra></extra>")
    return _layout(fig, barmode="stack", xaxis_title="seconds of each component per second of capture",
                   yaxis=dict(autorange="reversed"), height=120 + 40 * len(labels))


def _group_figure(c) -> go.Figure | None:
    t = c.table
    g = t[(t["scope"] == "thread_group") & (t["metric"] == "slow_wire")]
    if g.empty or g["value"].isna().all():
        return None
    fig = go.Figure()
    keys = sorted(g["key"].unique(), key=int)
    for a in c.analyses:
        values = [_one(g[(g["key"] == k) & (g["step"] == a.step)]["value"]) for k in keys]
        fig.add_bar(x=[f"group {k}" for k in keys], y=values,
                    name=_step_label(a), marker_color=STEP_COLORS[a.step % len(STEP_COLORS)],
                    hovertemplate="%{x}: %{y} slow on the wire<extra>" + _step_label(a) + "</extra>")
    return _layout(fig, barmode="group", yaxis_title="exchanges slow on the wire", height=300)


def _spec(fig: go.Figure) -> dict:
    return json.loads(fig.to_json())


def _layout(fig: go.Figure, **kw) -> go.Figure:
    fig.update_layout(margin=dict(l=60, r=20, t=30, b=40), template="plotly_white", **kw)
    return fig


def _one(values: pd.Series) -> float | None:
    """The value of a one-row selection for a figure; None (a gap) when there is none or it is unknown."""
    return None if values.empty or pd.isna(values.iloc[0]) else float(values.iloc[0])


def _nav() -> str:
    links = (("headline", "Headline"), ("analyses", "Analyses"), ("overall", "Slow exchanges"),
             ("components", "Components"), ("groups", "Thread groups"), ("queries", "Query IDs"),
             ("method", "Method"))
    return " · ".join(f"<a href='#{a}'>{t}</a>" for a, t in links)


_MORE_STYLE = (
    "ul.headline{font-size:1.1em;background:#f5f5fa;padding:.6em 2em;border-left:4px solid #446}"
    "p.ok{color:#275}p.bad{color:#a22;font-weight:bold}li.not-comparable{color:#a22}li.caution{color:#a60}"
    "table.keyed tr.first td{border-top:2px solid #889}.chg.down{color:#275}.chg.up{color:#a22}"
    ".rate{color:#666;font-size:90%}"
)
