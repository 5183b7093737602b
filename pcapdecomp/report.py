"""report.html: one self-contained page (plotly.js inlined once, no network) that shows where the time went.

Sections follow the order an investigator reads: verdict and inputs, decomposition, timeline, thread groups,
waterfall of the slowest exchanges, top fingerprints, hidden-slow table, connections, method and columns.
Figures aggregate or sample (at most TIMELINE_POINTS points); full detail stays in exchanges.parquet."""

from __future__ import annotations

import html
import json

import numpy as np
import pandas as pd

from . import __version__
from .evidence import display_filter
from .report_figures import figure_specs
from .schema import ANALYSIS_COLUMNS, EXCHANGE_COLUMNS, GROUP_COLUMNS, Column

HIDDEN_ROWS = 200  # hidden-slow rows listed in the page; the rest are counted
TOP_FINGERPRINTS = 20
COMPONENTS = (("network_s", "network"), ("queue_s", "queueing"), ("exec_s", "execution"))
esc = html.escape


def render(summary: dict, exchanges: pd.DataFrame, groups: pd.DataFrame, command_line: str | None = None) -> str:
    """The whole page as one string."""
    import plotly.offline

    x = exchanges
    figures = figure_specs(summary, x, groups)
    sections = [
        _verdict(summary),
        _decomposition(summary, x),
        _figure_section("timeline", "Timeline", figures, _timeline_caption(summary, figures)),
        _groups_section(summary, figures),
        _figure_section("waterfall", "Waterfall of the slowest exchanges", figures,
                        "Each bar is one exchange from A1 (app sends) to A4 (app receives): request leg, queueing, "
                        "execution, response leg. Exchanges seen at the DB only start at D1."),
        _fingerprints(x),
        _hidden(summary, x),
        _connections(x, figures),
        _method(summary, command_line),
    ]
    specs = {name: spec for name, spec in figures.items() if spec is not None}
    script = _BOOT.replace("__SPECS__", json.dumps(specs, separators=(",", ":")).replace("</", "<\\/"))
    title = f"pcapdecomp — {summary['set']}"
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width'><title>{esc(title)}</title><style>{_STYLE}</style>"
        f"<script>{_ERRORS}</script><script>{plotly.offline.get_plotlyjs()}</script></head>"
        f"<body data-rendered='no'><header><h1>{esc(title)}</h1><nav>{_nav()}</nav></header>"
        + "".join(sections) + f"<script>{script}</script></body></html>\n"
    )


# ------------------------------------------------------------------ sections


def _verdict(summary: dict) -> str:
    inputs = summary["inputs"]
    rows = [("app captures", ", ".join(inputs["app"]) or "none"), ("DB capture", inputs["db"] or "none"),
            ("slow log", _slow_log_text(summary)),
            ("long_query_time", _or_unknown(inputs["long_query_time"], " s")),
            ("thread_pool_size", _or_unknown(inputs["thread_pool_size"]))]
    for side, q in _captures(summary):
        rows.append((f"{side} span", f"{q.get('first_ts') or '?'} … {q.get('last_ts') or '?'} ({q.get('file')})"))
    clock = summary.get("clock")
    if clock and clock.get("offset_s") is not None:
        lo, hi = clock["offset_bounds_s"]
        rows.append(("clock (DB − app)", f"{_ms(clock['offset_s'])} (bounds {_ms(lo)} … {_ms(hi)}), skew "
                     f"{clock['skew_ppm']:+.2f} ppm, {clock['quality']}, {clock['samples']['forward']} + "
                     f"{clock['samples']['reverse']} samples"))
    else:
        rows.append(("clock (DB − app)", "not estimated (needs both an app and a DB capture of the same traffic)"))
    m = summary["match"]
    rows.append(("matching", f"{m['matched']} matched, {m['app_only']} app only, {m['db_only']} DB only, "
                 f"{m['conflicts']} conflicts, {m['connections_nat']} NAT connections"))
    warn = "".join(f"<li>{esc(w)}</li>" for w in summary.get("warnings", []))
    return (f"<section id='verdict'><h2>Verdict</h2><p class='verdict'>{esc(summary['verdict'])}</p>"
            + _kv_table(rows) + "<h3>Capture quality</h3>" + _quality(summary)
            + (f"<h3>Warnings</h3><ul class='warn'>{warn}</ul>" if warn else "") + "</section>")


def _captures(summary: dict) -> list[tuple[str, dict]]:
    caps = summary.get("captures", {})
    out = [("app", q) for q in caps.get("app") or []]
    if caps.get("db"):
        out.append(("DB", caps["db"]))
    return out


_PROBLEM_KEYS = ("frames_truncated", "frames_ip_fragment", "frames_undecodable", "frames_unknown_link", "if_drops",
                 "damaged", "unknown_blocks", "midstream_connections", "tls_connections", "gaps", "gap_bytes",
                 "unparsed_bytes", "tls_bytes", "violations", "frames_bad_ts", "gaps_forced", "out_of_range")


def _quality(summary: dict) -> str:
    caps = _captures(summary)
    if not caps:
        return "<p>no capture</p>"
    keys = list(dict.fromkeys(k for _, q in caps for k in q if k not in ("file", "first_ts", "last_ts")))
    # counters that are zero everywhere are named in one line, so that the problems stand out
    always = ("format", "frames", "frames_tcp_mysql", "mysql_connections", "exchanges")
    quiet = [k for k in keys if k not in always and all(q.get(k) in (None, 0, False, "") for _, q in caps)]
    keys = [k for k in keys if k not in quiet]
    head = "<tr><th></th>" + "".join(f"<th>{esc(side)}: {esc(str(q.get('file')))}</th>" for side, q in caps) + "</tr>"
    body = []
    for k in keys:
        cells = []
        for _, q in caps:
            v = q.get(k)
            bad = k in _PROBLEM_KEYS and v not in (None, 0, False, "")
            cells.append(f"<td class='{'bad' if bad else ''}'>{esc(_cell(v))}</td>")
        body.append(f"<tr><th>{esc(k)}</th>{''.join(cells)}</tr>")
    zero = f"<p class='caption'>Zero or empty in every capture: {esc(', '.join(quiet))}.</p>" if quiet else ""
    return f"<table class='quality'>{head}{''.join(body)}</table>{zero}"


def _decomposition(summary: dict, x: pd.DataFrame) -> str:
    both = x.loc[x["seen"] == "both", ["total_s", *(col for col, _ in COMPONENTS)]]  # not a whole-table copy
    parts = []
    total = float(both["total_s"].sum()) if len(both) else 0.0
    if total > 0:
        shares = " · ".join(f"{label} <b>{100 * float(both[col].sum()) / total:.1f} %</b>" for col, label in COMPONENTS)
        parts.append(f"<p>Of the {total:.3f} s clients waited on the {len(both)} exchanges seen at both points: "
                     f"{shares}.</p>")
    elif len(x):
        parts.append("<p>No exchange was seen at both points: only one side's view is available, so the split into "
                     "network and server time is not possible.</p>")
    rows = []
    for col, label in (("total_s", "client (A4 − A1)"), ("server_s", "server (D4 − D1)"), ("network_s", "network"),
                       ("net_req_s", "request leg"), ("net_resp_s", "response leg"), ("queue_s", "queueing"),
                       ("exec_s", "execution")):
        v = x[col].dropna().to_numpy(dtype=float)
        if len(v):
            q = np.quantile(v, [0.5, 0.95, 0.99])
            rows.append([label, str(len(v)), *(_secs(s) for s in q), _secs(v.max()), f"{v.sum():.3f} s"])
    table = _table(["component", "count", "p50", "p95", "p99", "max", "sum"], rows) if rows else "<p>no latencies</p>"
    return (f"<section id='decomposition'><h2>Where the time went</h2>{''.join(parts)}"
            f"<div id='fig-shares' class='fig small'></div>{table}</section>")


def _timeline_caption(summary: dict, figures: dict) -> str:
    meta = figures.get("_timeline_meta") or {}
    text = ("Server time (D4 − D1; client time where only the app saw the exchange) of every exchange over wall "
            "time, log scale. Hidden-slow exchanges are red, slow-logged ones orange; the dashed line is "
            "long_query_time.")
    if meta.get("sampled"):
        text += (f" {meta['shown']} of {meta['total']} exchanges shown: every slow, slow-logged or hidden-slow one "
                 "and a uniform sample of the rest.")
    return text


def _figure_section(name: str, title: str, figures: dict, caption: str) -> str:
    if figures.get(name) is None:
        return f"<section id='{name}'><h2>{esc(title)}</h2><p>nothing to show</p></section>"
    return (f"<section id='{name}'><h2>{esc(title)}</h2><p class='caption'>{esc(caption)}</p>"
            f"<div id='fig-{name}' class='fig'></div></section>")


def _groups_section(summary: dict, figures: dict) -> str:
    head = "<section id='groups'><h2>Thread groups</h2>"
    if summary["inputs"]["thread_pool_size"] is None:
        return head + "<p>thread_pool_size unknown (no capture.toml, no --thread-pool-size): no per-group view.</p></section>"
    stalls = summary["groups"]["stalls"]
    rows = []
    for s in stalls:
        culprits = "<br>".join(
            f"connection {esc(_cell(c['conn_id']))}: <code>{esc(c['sql'] or '')}</code> executed "
            f"{esc(_secs(c['exec_s']))} ({esc(c['exec_source'] or '?')})" for c in s["culprits"]) or "none found"
        rows.append([f"thread group {s['thread_group']}", esc(s["start"]), _secs(s["duration_s"]), str(s["queued"]),
                     _secs(s["max_queue_s"]), culprits])
    stall_table = (_table(["group", "start", "stalled for", "queued", "max queue", "culprits (executing meanwhile)"],
                          rows, raw=True) if rows else "<p>No group stalled (no queueing of 0.1 s or more).</p>")
    figs = "".join(f"<div id='fig-{n}' class='fig'></div>" for n in ("heatmap", "inflight") if figures.get(n))
    return (head + f"<p class='caption'>Queueing seconds per thread group and {summary['groups']['bucket_s']} s bucket, "
            "and the mean number of exchanges in flight per group. A stalled stretch is a run of queueing ≥ 0.1 s in "
            "one group; its culprits are statements of that group that executed meanwhile.</p>"
            f"{figs}<h3>Stalls</h3>{stall_table}</section>")


def _fingerprints(x: pd.DataFrame) -> str:
    q = x.loc[x["fingerprint"].notna(), ["fingerprint", "query_id", "total_s", "server_s", "response_s", "network_s",
                                         "queue_s", "exec_s", "hidden_slow"]]
    if q.empty:
        return "<section id='fingerprints'><h2>Top fingerprints</h2><p>no statements</p></section>"
    t = q["total_s"].fillna(q["server_s"]).fillna(q["response_s"])
    f = pd.DataFrame({"fp": q["fingerprint"].array, "qid": q["query_id"].array, "t": t.to_numpy(float),
                      "net": q["network_s"].to_numpy(float), "queue": q["queue_s"].to_numpy(float),
                      "exec": q["exec_s"].to_numpy(float), "hidden": q["hidden_slow"].fillna(False).to_numpy(bool)})
    g = f.groupby("fp", sort=False, observed=True).agg(qid=("qid", "first"), count=("t", "size"), total=("t", "sum"),
                                       net=("net", "sum"), queue=("queue", "sum"), exec=("exec", "sum"),
                                       p95=("t", lambda v: v.quantile(0.95)), hidden=("hidden", "sum"))
    g = g.sort_values("total", ascending=False).head(TOP_FINGERPRINTS)
    grand = float(f["t"].sum()) or 1.0
    rows = [[esc(r.qid or ""), str(r.count), f"{r.total:.3f} s", f"{100 * r.total / grand:.1f} %", f"{r.net:.3f}",
             f"{r.queue:.3f}", f"{r.exec:.3f}", _secs(r.p95), str(int(r.hidden)), f"<code>{esc(_short(fp, 160))}</code>"]
            for fp, r in g.iterrows()]
    return ("<section id='fingerprints'><h2>Top fingerprints</h2><p class='caption'>Grouped as pt-query-digest does "
            "(same fingerprint and Query ID), by total client time (server time where only the DB saw them). "
            "Component columns are seconds.</p>"
            + _table(["Query ID", "count", "time", "share", "network", "queue", "exec", "p95", "hidden slow",
                      "fingerprint"], rows, raw=True) + "</section>")


def _hidden(summary: dict, x: pd.DataFrame) -> str:
    head = "<section id='hidden'><h2>Hidden-slow statements</h2>"
    flagged = x[x["hidden_slow"].fillna(False).astype(bool)]
    if summary["inputs"]["long_query_time"] is None:
        return head + "<p>long_query_time unknown: hidden slow not decided.</p></section>"
    if flagged.empty:
        return head + "<p>None: no statement was slower than long_query_time on the wire without being slow-logged.</p></section>"
    flagged = flagged.sort_values("server_s", ascending=False)
    rows = []
    for _, r in flagged.head(HIDDEN_ROWS).iterrows():
        frames = []
        if r["seen"] in ("both", "app") and pd.notna(r["resp_last_frame"]):
            frames.append(_frames_cell(f"app {r['capture']}", r["client"], r["server"], r["req_first_frame"],
                                       r["resp_last_frame"]))
        if pd.notna(r["db_req_first_frame"]) and pd.notna(r.get("db_resp_last_frame")):
            frames.append(_frames_cell("db", r["db_client"], r["server"], r["db_req_first_frame"],
                                       r["db_resp_last_frame"]))
        when = r["app_req_ts"] if pd.notna(r["app_req_ts"]) else r["db_req_ts"]
        rows.append([esc(_cell(when)), esc(_cell(r["conn_id"])), esc(_cell(r["thread_group"])),
                     f"<code>{esc(_short(r['sql'], 300))}</code>", _secs(r["total_s"]), _secs(r["server_s"]),
                     _secs(r["queue_s"]), f"{_secs(r['exec_s'])} ({esc(_cell(r['exec_source']))})",
                     _secs(r["network_s"]), "".join(frames)])
    more = len(flagged) - HIDDEN_ROWS
    return (head + f"<p>{len(flagged)} statements took longer than long_query_time between D1 and D4 but are not in "
            "the slow log: the time went before execution. The display filters select each exchange's frames in "
            "its capture (Wireshark: paste into the filter bar; tshark: <code>-Y</code>).</p>"
            + _table(["request sent", "connection", "group", "SQL", "client", "server", "queue", "exec", "network",
                      "frames and display filter"], rows, raw=True)
            + (f"<p>… and {more} more (all are in exchanges.parquet: <code>hidden_slow == true</code>).</p>" if more > 0 else "")
            + "</section>")


def _frames_cell(label: str, client, server, first, last) -> str:
    if pd.isna(client) or pd.isna(server):
        return ""
    f = display_filter(str(client), str(server), int(first), int(last))
    return f"<div class='frames'>{esc(label)}: frames {int(first)}–{int(last)}<br><code class='filter'>{esc(f)}</code></div>"


def _connections(x: pd.DataFrame, figures: dict) -> str:
    head = "<section id='connections'><h2>Connections</h2>"
    conn = x[x["command"] == "CONNECT"]
    parts = []
    hs = conn["response_s"].dropna().to_numpy(float)
    if len(hs):
        q = np.quantile(hs, [0.5, 0.95, 0.99])
        parts.append(f"<p>{len(conn)} connections opened in the capture; handshake latency (greeting to the end of "
                     f"authentication) p50 {_secs(q[0])}, p95 {_secs(q[1])}, p99 {_secs(q[2])}, max {_secs(hs.max())}.</p>")
    else:
        parts.append("<p>No connection handshake in the capture (connections were already open when it began).</p>")
    parts += [f"<div id='fig-{n}' class='fig'></div>" for n in ("connrate",) if figures.get(n)]
    errors = x[x["result"] == "error"]
    if len(errors):
        g = errors.groupby(errors["error_code"].astype("Int64"), dropna=False).agg(
            count=("command", "size"), message=("error_message", "first"))
        rows = [[esc(_cell(code)), str(r["count"]), esc(_short(r["message"], 200))] for code, r in g.iterrows()]
        parts.append("<h3>Errors</h3>" + _table(["error code", "count", "first message"], rows, raw=True))
    else:
        parts.append("<p>No error responses.</p>")
    return head + "".join(parts) + "</section>"


def _method(summary: dict, command_line: str | None) -> str:
    def columns(cols: tuple[Column, ...]) -> str:
        return _table(["column", "dtype", "meaning"], [[c.name, c.dtype, c.meaning] for c in cols])

    return (
        "<section id='method'><h2>Method and columns</h2><ul>"
        "<li><b>A1, A4</b>: first request byte and last response byte at the app capture; <b>D1, D4</b>: the same "
        "bytes at the DB capture, matched by TCP sequence number per connection and put on the app clock with the "
        "fitted offset and skew (convex hulls of one-way delays from every segment seen at both points).</li>"
        "<li><b>client</b> = A4 − A1; <b>server</b> = D4 − D1 (DB clock, skew-corrected); <b>network</b> = client − "
        "server, split into the request leg D1 − A1 and the response leg A4 − D4.</li>"
        "<li><b>execution</b>: the slow log's Query_time when the statement is in it; otherwise an estimate named "
        "in exec_source (median of fast executions of the fingerprint, or a bound below long_query_time). "
        "<b>queueing</b> = server − execution (≥ 0): time before a worker ran it.</li>"
        "<li><b>hidden slow</b>: server time above long_query_time, yet not in the slow log and not flagged "
        "SERVER_QUERY_WAS_SLOW on the wire. <b>thread group</b> = connection id mod thread_pool_size.</li>"
        "<li>Streaming (time to send a large result) is part of execution in the slow log's Query_time and of the "
        "server time; it is not split out.</li></ul>"
        f"<p>pcapdecomp {esc(__version__)}" + (f"; command: <code>{esc(command_line)}</code>" if command_line else "")
        + "</p><details><summary>Exchanges columns</summary>" + columns(EXCHANGE_COLUMNS) + "</details>"
        "<details><summary>Columns added by analyze</summary>" + columns(ANALYSIS_COLUMNS) + "</details>"
        "<details><summary>groups.parquet columns</summary>" + columns(GROUP_COLUMNS) + "</details></section>"
    )


# ------------------------------------------------------------------ small helpers


def _nav() -> str:
    links = (("verdict", "Verdict"), ("decomposition", "Split"), ("timeline", "Timeline"), ("groups", "Groups"),
             ("waterfall", "Waterfall"), ("fingerprints", "Fingerprints"), ("hidden", "Hidden slow"),
             ("connections", "Connections"), ("method", "Method"))
    return " · ".join(f"<a href='#{a}'>{t}</a>" for a, t in links)


def _slow_log_text(summary: dict) -> str:
    s = summary.get("slow_log") or {}
    if not s.get("file"):
        return "none"
    if not s.get("used"):
        return f"{s['file']} (not used: see warnings)"
    return (f"{s['file']} ({s.get('flavor', '?')}; {s.get('entries', '?')} entries, {s.get('matched', '?')} joined, "
            f"{s.get('unparsed_lines', 0)} unparsed lines)")


def _kv_table(rows: list[tuple[str, str]]) -> str:
    return "<table class='kv'>" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows) + "</table>"


def _table(headers: list[str], rows: list[list[str]], raw: bool = False) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _or_unknown(v, unit: str = "") -> str:
    return "unknown" if v is None else f"{v}{unit}"


def _secs(v) -> str:
    if v is None or pd.isna(v):
        return "–"
    v = float(v)
    if abs(v) >= 1:
        return f"{v:.3f} s"
    if abs(v) >= 1e-3:
        return f"{v * 1e3:.2f} ms"
    return f"{v * 1e6:.0f} µs"


def _ms(v: float) -> str:
    return f"{v * 1e3:+.3f} ms" if abs(v) >= 1e-3 else f"{v * 1e6:+.3f} µs"


def _cell(v) -> str:
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return ""
    if isinstance(v, pd.Timestamp):
        return v.isoformat()
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _short(text, limit: int) -> str:
    if text is None or (not isinstance(text, str) and pd.isna(text)):
        return ""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:0 2em 3em;max-width:95em;color:#222}"
    "header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:.3em 0;z-index:5}"
    "h1{font-size:1.4em;margin:.3em 0}h2{border-bottom:2px solid #446;padding-top:.8em}"
    "nav a{color:#335;text-decoration:none}.verdict{font-size:1.15em;background:#f5f5fa;padding:.8em;"
    "border-left:4px solid #c33}table{border-collapse:collapse;font-size:88%;margin:.5em 0}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}th{background:#f0f0f4}"
    "td.bad{background:#fdd;font-weight:bold}.caption{color:#555}.fig{width:100%;height:420px}"
    ".fig.small{height:260px;max-width:50em}code{font-size:90%}code.filter{user-select:all;color:#135}"
    ".frames{margin-bottom:.3em}.warn li{color:#a40}details{margin:.4em 0}"
)

# window.onerror first, so that errors thrown while plotly.js loads are recorded too
_ERRORS = ("window.__errors=[];window.addEventListener('error',function(e){window.__errors.push(String(e.message));"
           "document.documentElement.setAttribute('data-errors',window.__errors.join(' | '));});")

_BOOT = """
(function(){
  var specs = __SPECS__;
  var names = Object.keys(specs).filter(function(n){ return n.charAt(0) !== '_'; });
  var done = names.map(function(n){
    var el = document.getElementById('fig-' + n);
    if (!el) { return Promise.resolve(); }
    if (specs[n].layout && specs[n].layout.height) { el.style.height = specs[n].layout.height + 'px'; }
    return Plotly.newPlot(el, specs[n].data, specs[n].layout, {responsive: true, displaylogo: false});
  });
  Promise.all(done).then(function(){
    document.body.setAttribute('data-rendered', names.length + ' figures');
  }, function(err){
    window.__errors.push(String(err));
    document.documentElement.setAttribute('data-errors', window.__errors.join(' | '));
  });
})();
"""
