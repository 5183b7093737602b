"""report.html: one self-contained page (plotly.js inlined once, no network) that shows where the time went.

Sections follow the order an investigator reads: verdict and inputs, where the time went, the timeline of every
statement on its connection's lane, thread groups and their stalls, the waterfall of the slowest exchanges, the
query profile (pt-query-digest's, with the split of each fingerprint's time), the hidden-slow and understated
statements by stall with their culprits, connections, method and columns. All time charts share one x axis: a zoom
in one (or a stall's "zoom" button) moves them all.

Every text from a capture, a log or a file name is attacker-controlled. Here it is escaped for where it lands:
`esc` for HTML text and attribute values (always quoted), `Html` marks the few strings this module built itself
from escaped parts, `_script_json` for the figures' JSON inside <script> (`<`, `>`, `&` and every non-ASCII
character, U+2028/2029 included, as \\u escapes), and render.figures.plain for plotly labels."""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .. import __version__
from ..core.formats import cell, clip, clock, count, integer, seconds, share
from ..core.groups import aggregated, nearest_rank
from ..core.memory import release_memory
from ..core.outputs import write_atomically, write_text
from ..core.schema import ANALYSIS_COLUMNS, CAPTURE_PROBLEM_KEYS, EXCHANGE_COLUMNS, GROUP_COLUMNS, Column
from ..explain.decompose import network_parts
from ..explain.digest import HeldColumns, bounded_part, overhead_part, profile, queue_parts
from ..pair.proxy import PAIRED_KINDS
from .evidence import display_filter
from .figures import (
    COLORS,
    TimeAxis,
    Times,
    connection_times,
    culprit_mask,
    exchange_times,
    figure_specs,
    layer_sums,
    time_axis,
    visible,
)

_STATEMENT_COLUMNS = ("seen", "client", "req_first_frame", "resp_last_frame", "db_client", "db_req_first_frame",
                      "db_resp_last_frame", "server", "sql", "command", "conn_id", "thread_group", "total_s",
                      "server_s", "queue_s", "queue_min_s", "exec_s", "exec_source")  # what _statement_row reads
# what _proxy_servers and _proxy_waits read of the rows they show (read at those rows alone)
_PROXY_SERVER_COLUMNS = ("client", "db_client", "conn_id", "server_s", "proxy_wait_s")
_PROXY_WAIT_COLUMNS = ("app_req_ts", "client", "front_conn_id", "conn_id", "sql", "command", "proxy_match",
                       "proxy_wait_s", "proxy_s", "server_s", "total_s")
HIDDEN_ROWS = 200  # hidden-slow (and understated) rows listed in the page; the rest are counted
PROFILE_ROWS = 20
STALL_ROWS = 100
PROXY_ROWS = 20  # server connections of a proxy, and its longest waits, listed in the page
NS = 1_000_000_000


class Html(str):
    """Markup this module built from escaped parts: inserted as is. Any other str is escaped where it lands."""


def esc(text) -> Html:
    return Html(html.escape("" if text is None else visible(text), quote=True))


@dataclass(frozen=True)
class Page:
    """A rendered report.html as the text before and after plotly.js, which is most of a small capture's page:
    written (`write_page`) as the UTF-8 of the three parts in turn, it is the file of the whole page as one string,
    without copying plotly.js into that string and encoding it back each time."""

    head: str
    tail: str

    def text(self) -> str:
        return self.head + plotly_js().decode("utf-8") + self.tail


@functools.cache
def plotly_js() -> bytes:
    """plotly.js in UTF-8, read once per process: the file plotly.offline.get_plotlyjs() reads (the package's
    package_data/plotly.min.js), read without importing plotly and decoded only to check it is UTF-8; where it is
    not there, get_plotlyjs()'s text."""
    import importlib.util

    spec = importlib.util.find_spec("plotly")  # finds, does not import
    for place in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(place) / "package_data" / "plotly.min.js"
        if path.is_file():
            js = path.read_bytes()
            js.decode("utf-8")  # as get_plotlyjs() decodes it: not UTF-8 is an error there too
            return js
    import plotly.offline

    return plotly.offline.get_plotlyjs().encode("utf-8")


def write_page(path: Path, page: Page | str) -> None:
    """report.html written atomically (core.outputs.write_atomically): a Page, or the page as one string."""
    if isinstance(page, str):
        write_text(path, page)
        return

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(page.head.encode("utf-8"))
            f.write(plotly_js())
            f.write(page.tail.encode("utf-8"))

    write_atomically(path, write)


def render(summary: dict, exchanges: pd.DataFrame, groups: pd.DataFrame, command_line: str | None = None,
           connections: dict | None = None, pool: pd.DataFrame | None = None,
           profiled: Callable[[], pd.DataFrame] | None = None,
           components: Callable[[], list[list[str]]] | None = None, columns=None) -> str:
    """The whole page as one string (render_page's Page as text)."""
    return render_page(summary, exchanges, groups, command_line, connections, pool, profiled, components,
                       columns).text()


def render_page(summary: dict, exchanges: pd.DataFrame, groups: pd.DataFrame, command_line: str | None = None,
                connections: dict | None = None, pool: pd.DataFrame | None = None,
                profiled: Callable[[], pd.DataFrame] | None = None,
                components: Callable[[], list[list[str]]] | None = None, columns=None) -> Page:
    """The whole page, as the parts around plotly.js. connections: {"app": table, "db": table} of CONNECTION_COLUMNS
    (the extraction's), for connection set-up latencies; pool: pool.parquet's table when the analysis wrote one;
    profiled: returns `unspanned_profile(exchanges)` when the page reaches the query profile (made beside the
    rendering, in another process: analysis.py), else it is made here; components: likewise, returns
    `component_rows(exchanges)`; columns: where the columns read at a few rows alone are read (the listed
    statements', the samples', the timeline's: run.spilled.ROW_COLUMNS), a digest.HeldColumns or what gives the same
    (run.spilled.StoredColumns, from the file: `exchanges` then holds the columns read of every row alone), else
    `exchanges`' own."""
    x = exchanges
    columns = columns if columns is not None else HeldColumns(x)
    if profiled is None:  # made first, before the page's per-exchange times: its arrays and theirs never at once
        unspanned = unspanned_profile(x, columns=columns)
        profiled = lambda: unspanned  # noqa: E731
    # what the profile freed (made here or before, as run.spilled makes it) back before the per-exchange times:
    # its blocks under the mmap threshold stay in the heap otherwise (at 560,745 rows, 19 MiB)
    release_memory()
    t = exchange_times(x)
    conns = connection_times(connections, summary)
    axis = time_axis(t, [conns["t_ns"].to_numpy(dtype=np.int64)] if conns is not None else [])
    figures = figure_specs(summary, x, groups, t, axis, conns, pool, columns)
    release_memory()  # the figures' per-row transients, back before the sections make theirs
    page = _Page(summary, x, t, axis, figures, profiled, components, columns)
    sections = [  # the picture first: the sentence, what to change, the timeline; the inputs further down
        page.verdict(),
        page.timeline(),
        page.decomposition(),
        page.groups_section(),
        page.proxy(),
        page.waterfall(),
        page.profile(),
        page.statements("hidden", "Hidden-slow statements"),
        page.statements("understated", "Statements the slow log understates"),
        page.connections(connections, conns),
        page.inputs(),
        _method(command_line),
    ]
    # the exchanges' times and what the sections freed, back before the page's text is joined: the stage's RSS was
    # highest at its end, the text beside the heap the sections left (at 1,157,984 rows of the partitioned run)
    del page, t
    release_memory()
    specs = {name: spec for name, spec in figures.items() if spec is not None}
    title = f"pcapdecomp — {summary['set']}"
    return Page(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width'><title>{esc(title)}</title><style>{_STYLE}</style>"
        f"<script>{_ERRORS}</script><script>",
        "</script></head>"
        f"<body data-rendered='no'><header><h1>{esc(title)}</h1><nav>{_nav(bool(summary.get('proxy')))}</nav></header>"
        + "".join(sections) + f"<script>{_BOOT.replace('__SPECS__', _script_json(specs))}</script></body></html>\n"
    )


def _script_json(value) -> str:
    """JSON that can sit inside <script>: no `</script`, `<!--` or `]]>` can form, and no line terminator that
    JavaScript would treat differently from JSON."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


COMPONENTS = (("total_s", "client (A4 − A1)"), ("server_s", "server (D4 − D1)"), ("network_s", "network"),
              ("net_req_s", "request leg"), ("net_resp_s", "response leg"), ("net_app_proxy_s", "app ↔ proxy network"),
              ("proxy_s", "inside the proxy"), ("proxy_wait_s", "waiting in the proxy (P2 − P1)"),
              ("net_proxy_db_s", "proxy ↔ DB network"), ("queue_s", "queueing"), ("exec_s", "execution"))


def component_rows(x: pd.DataFrame) -> list[list[str]]:
    """The rows of "Where the time went"'s table: per duration column of COMPONENTS that `x` has (and that has a
    value), its label, count, p50, p95, p99, max and sum as the page shows them. What `render` takes made elsewhere
    (`components`): it reads only the decomposition's columns."""
    rows = []
    for col, label in COMPONENTS:
        if col not in x.columns:
            continue
        v = _f(x, col)
        v = v[~np.isnan(v)]
        if len(v):
            q = nearest_rank(v, [0.5, 0.95, 0.99])
            rows.append([label, str(len(v)), *(seconds(s) for s in q), seconds(v.max()), f"{v.sum():.3f} s"])
    return rows


def unspanned_profile(x: pd.DataFrame, params=None, columns=None) -> pd.DataFrame:
    """digest.profile of the exchanges before the time axis is known (QPS left null): what `render` takes made
    elsewhere (`profiled`), its QPS set by `spanned`. params, columns: digest.profile's (where `x` holds no params
    column, and not the columns read at the samples alone)."""
    return profile(x, None, params=params, columns=columns)


def by_client_time(p: pd.DataFrame) -> pd.DataFrame:
    """A digest.profile ranked by what the clients waited (client_sum: A4 − A1, else D4 − D1), execution breaking
    ties; as it was when no class has a client time."""
    client = p["client_sum"].to_numpy(dtype="float64", na_value=np.nan)
    if np.isnan(client).all():
        return p
    order = np.lexsort((-np.nan_to_num(p["exec_sum"].to_numpy(dtype="float64", na_value=np.nan), nan=-1.0),
                        -np.nan_to_num(client, nan=-1.0)))
    out = p.iloc[order].reset_index(drop=True)
    out["rank"] = np.arange(1, len(out) + 1)
    return out


def spanned(p: pd.DataFrame, span_s: float | None) -> pd.DataFrame:
    """An unspanned profile with the QPS digest.profile(x, span_s) gives: calls per second of capture."""
    return p.assign(qps=p["calls"] / span_s if span_s else np.nan)


class _Page:
    """The sections that need the exchanges, their times and the shared time axis."""

    def __init__(self, summary: dict, x: pd.DataFrame, t: Times, axis: TimeAxis | None, figures: dict,
                 profiled: Callable[[], pd.DataFrame] | None = None,
                 components: Callable[[], list[list[str]]] | None = None, columns=None):
        self.summary, self.x, self.t, self.axis, self.figures = summary, x, t, axis, figures
        self.profiled, self.components = profiled, components
        self.columns = columns if columns is not None else HeldColumns(x)  # the columns read at a few rows alone
        self.stalls = list((summary.get("groups") or {}).get("stalls") or [])
        self.proxied = "proxy_s" in x.columns and bool(x["proxy_s"].notna().any())  # the proxy's own times known
        self.dated = axis is not None and pd.Timestamp(axis.lo_ns).date() != pd.Timestamp(axis.hi_ns).date()

    def when(self, ns) -> str:
        return clock(ns, date=self.dated)

    # -------------------------------------------------------------- verdict

    def verdict(self) -> str:
        s = self.summary
        story = s.get("story") or {}
        if story.get("sentence"):
            bullets = "".join(f"<li>{esc(b.get('text') if isinstance(b, dict) else b)}</li>"
                              for b in story.get("bullets") or [])
            head = f"<p class='verdict'>{esc(story['sentence'])}</p>" + (f"<ul class='bullets'>{bullets}</ul>" if bullets else "")
        else:
            head = f"<p class='verdict'>{esc(s.get('verdict') or '')}</p>"
        if story.get("sentence") and (s.get("tls") or {}).get("sentence"):  # how much could be read comes first
            head = f"<p class='verdict'>{esc(s['tls']['sentence'])}</p>" + head
        return f"<section id='verdict'><h2>Verdict</h2>{head}{_playbook(s)}</section>"

    def inputs(self) -> str:
        s = self.summary
        inputs = s["inputs"]
        rows = [("app captures", ", ".join(inputs["app"]) or "none"), ("DB capture", inputs["db"] or "none"),
                ("slow log", _slow_log_text(s)), ("long_query_time", _or_unknown(inputs["long_query_time"], " s")),
                ("thread_pool_size", _pool_size_text(s))]
        window = s.get("window")
        if window is not None:  # analyze --since/--until
            rows.append(("time window", f"{window['since'] or 'the captures’ start'} … {window['until'] or 'their end'}"
                         " (UTC): the exchanges whose request began in it, each point by its own clock; the captures "
                         "were read whole for their connections' state"))
        for side, q in _captures(s):
            rows.append((f"{side} span", self._span_text(q)))
        if self.axis is not None and self.axis.outside:
            rows.append(("time outliers", self.outliers_text()))
        clock_ = s.get("clock")
        if clock_ and clock_.get("offset_s") is not None:
            lo, hi = clock_["offset_bounds_s"]
            rows.append(("clock (DB − app)", f"{_signed(clock_['offset_s'])} (bounds {_signed(lo)} … {_signed(hi)}), "
                         f"skew {clock_['skew_ppm']:+.2f} ppm, {clock_['quality']}, "
                         f"{clock_['samples']['forward']} + {clock_['samples']['reverse']} samples"))
        else:
            rows.append(("clock (DB − app)", "not estimated (needs both an app and a DB capture of the same traffic)"))
        m = s["match"]
        rows.append(("matching", f"{m['matched']} matched, {m['app_only']} app only, {m['db_only']} DB only, "
                     f"{m['conflicts']} conflicts, {m['connections_nat']} NAT connections"))
        warn = "".join(f"<li>{esc(w)}</li>" for w in s.get("warnings", []))
        return ("<section id='inputs'><h2>Inputs and capture quality</h2>" + _kv_table(rows) + "<h3>Capture quality</h3>"
                + _quality(s) + (f"<h3>Warnings</h3><ul class='warn'>{warn}</ul>" if warn else "") + "</section>")

    def _span_text(self, q: dict) -> str:
        first, last = q.get("first_ts"), q.get("last_ts")
        if not first or not last:
            return f"? ({q.get('file')})"
        a, b = pd.Timestamp(first), pd.Timestamp(last)
        same_day = a.date() == b.date()
        return (f"{a.strftime('%Y-%m-%d')} {clock(a)} … {clock(b, date=not same_day)} UTC "
                f"({seconds((b.value - a.value) / NS)}) — {q.get('file')}")

    def outliers_text(self) -> str:
        a = self.axis
        return (f"{a.outside} exchanges or connections have timestamps far outside the capture's time range "
                f"(between {clock(a.outside_first_ns, date=True)} and {clock(a.outside_last_ns, date=True)}): "
                "a clock glitch or a damaged frame. They are left out of the time charts (the charts show "
                f"{clock(a.lo_ns, date=True)} … {clock(a.hi_ns, date=True)}); their rows are in exchanges.parquet.")

    # -------------------------------------------------------------- where the time went

    def decomposition(self) -> str:
        x = self.x
        both = (x["seen"] == "both").fillna(False).to_numpy(dtype=bool)
        parts = []
        total = float(np.nansum(_f(x, "total_s")[both]))
        if total > 0:
            certain, likely, q_est = layer_sums(x, both)
            overhead = float(overhead_part(x)[both].sum())
            shares = [*network_parts(x, both), ("queueing", certain - overhead),
                      ("server overhead (server time − Query_time under 1 ms: parsing, the network stack)", overhead),
                      ("queueing likely (not proven: above the statement's typical execution while a long statement "
                       "ran)", likely),
                      ("execution", float(np.nansum(_f(x, "exec_s")[both]))),
                      ("execution or waiting, not told apart (execution only bounded)",
                       float(bounded_part(x)[both].sum()))]
            text = " · ".join(f"{label} <b>{100 * v / total:.1f} %</b>" for label, v in shares
                              if v > 0 or label in ("queueing", "execution"))
            if q_est > 0:
                text += (f" · queueing estimated from other runs of the same statement <b>{100 * q_est / total:.1f} "
                         "%</b> (apart: an estimate is never evidence of a queue)")
            parts.append(f"<p>Of the {total:.3f} s clients waited on the {int(both.sum())} exchanges seen at both "
                         f"points: {text}.</p>")
        elif len(x):
            parts.append("<p>No exchange was seen at both points: only one side's view is available, so the split "
                         "into network and server time is not possible.</p>")
        rows = self.components() if self.components is not None else component_rows(x)
        table = (_table(["component", "count", "p50", "p95", "p99", "max", "sum"], rows, numeric=range(1, 7))
                 if rows else "<p>no latencies</p>")
        fig = "<div id='fig-shares' class='fig small'></div>" if self.figures.get("shares") else ""
        return f"<section id='decomposition'><h2>Where the time went</h2>{''.join(parts)}{fig}{table}</section>"

    # -------------------------------------------------------------- timeline

    def timeline(self) -> str:
        head = "<section id='timeline'><h2>Timeline</h2>"
        if self.figures.get("timeline") is None:
            return head + "<p>nothing to show</p></section>"
        meta = self.figures["_timeline"]
        text = ("Every statement from the app sending it (A1) to the app receiving the answer (A4), on its "
                "connection's lane (D1 to D4 when only the DB capture saw it; connections that follow each other "
                "share a lane); lanes are ordered by thread group. "
                "Red: queueing before execution (lighter: likely, above the statement's typical execution while a "
                "long statement ran; pale: estimated from other runs of the statement); green: execution; light "
                "grey: execution or waiting where execution is only bounded (below long_query_time); grey: the rest of the client's wait (network). Stalled stretches of a thread group are "
                "shaded over its lanes. Markers at the end of a statement: ◆ culprit of a stall, ▲ hidden slow, "
                "■ understated by the slow log, ● in the slow log. Drag to zoom (every time chart follows), "
                "double-click to zoom out; the stalls table has a zoom button per stall.")
        if self.proxied:
            text += (" Pink: inside the proxy, from the request's arrival at its client side until it left at its "
                     "server side, and from the answer's arrival there until it left to the client; "
                     + ("lanes are the client connections (the ids the proxy gave them); the server connection "
                        "that ran each statement is in its tooltip." if (self.summary.get("proxy") or {}).get("kind")
                        == "l7" else "lanes are the connections, the same ids on both sides of the proxy."))
        if meta.get("sampled"):
            text += (f" {meta['shown']} of {meta['total']} statements drawn: every culprit, hidden-slow, understated, "
                     "slow-logged or slow one, and a uniform sample of the rest.")
        if self.axis is not None and self.axis.outside:
            text += f" {self.axis.outside} exchanges or connections with far-off timestamps are left out (see Verdict)."
        return head + f"<p class='caption'>{esc(text)}</p><div id='fig-timeline' class='fig'></div></section>"

    # -------------------------------------------------------------- thread groups

    def stall_id(self, i: int) -> int:
        return int(self.stalls[i].get("id", i + 1))

    def groups_section(self) -> str:
        head = "<section id='groups'><h2>Thread groups and the pool</h2>"
        s = self.summary
        parts = []
        size = _pool_size_value(s)
        pool_fig = "<div id='fig-pool' class='fig short'></div>" if self.figures.get("pool") else ""
        pool_text = ("Statements executing and queued at once, the whole server together (most at once and mean per "
                     "bucket). A pool at thread_pool_max_threads shows as executing flat at the cap while statements "
                     "queue.")
        cap = (s.get("pool") or {}).get("cap")
        if cap and cap.get("threads"):
            pool_text += (f" The wire shows the cap: {cap['threads']} statements executed at once for "
                          f"{seconds(cap.get('duration_s'))} while {cap.get('waiting', '?')} waited for a thread.")
        if size is None:
            parts.append("<p>thread_pool_size unknown (no capture.toml, no --thread-pool-size, and not inferred): no "
                         "per-group view.</p>")
        else:
            bucket = (s.get("groups") or {}).get("bucket_s")
            parts.append(f"<p class='caption'>Queueing seconds per thread group and time bucket ({esc(bucket)} s in "
                         "groups.parquet, merged to fit the chart). A stalled stretch is a run of queueing ≥ 0.1 s in "
                         "one group; its culprits are statements of that group that executed meanwhile.</p>")
            if self.figures.get("heatmap"):
                parts.append("<div id='fig-heatmap' class='fig'></div>")
        if pool_fig:
            parts.append(f"<p class='caption'>{esc(pool_text)}</p>{pool_fig}")
        if size is not None:
            parts.append("<h3>Stalls</h3>" + self._stall_table())
        return head + "".join(parts) + "</section>"

    def _stall_table(self) -> str:
        if not self.stalls:
            return "<p>No group stalled (no queueing of 0.1 s or more).</p>"
        rows = []
        for i, st in enumerate(self.stalls[:STALL_ROWS]):
            sid = self.stall_id(i)
            start, end = pd.Timestamp(st["start"]).value, pd.Timestamp(st["end"]).value
            culprits = [Html(f"conn {esc(integer(c.get('conn_id')))}: <code>{esc(clip(c.get('sql'), 160))}</code> "
                             f"executed {esc(seconds(c.get('exec_s')))} ({esc(c.get('exec_source') or '?')})")
                        for c in st.get("culprits") or []]
            more = st.get("culprits_more") or 0
            if more:
                culprits.append(Html(f"… and {esc(more)} more"))
            pad = max((end - start) // 5, 50_000_000)
            zoom = Html(f"<button class='zoom' data-zoom-from='{(start - pad) / 1e6:.3f}' "
                        f"data-zoom-to='{(end + pad) / 1e6:.3f}'>zoom</button>")
            rows.append(_Row([Html(f"<span id='stall-{sid}'>{sid}</span>"), f"group {st['thread_group']}",
                              self.when(start), seconds(st["duration_s"]), str(st["queued"]), seconds(st["max_queue_s"]),
                              Html("<br>".join(culprits)) if culprits else "none found", zoom]))
        more = len(self.stalls) - STALL_ROWS
        return (_table(["stall", "group", "from", "stalled for", "queued", "max queue", "culprits (executing meanwhile)",
                        ""], rows, numeric=(3, 4, 5))
                + (f"<p>… and {more} more stalls (summary.json → groups.stalls).</p>" if more > 0 else ""))

    # -------------------------------------------------------------- waterfall

    def waterfall(self) -> str:
        head = "<section id='waterfall'><h2>Waterfall of the slowest exchanges</h2>"
        spec = self.figures.get("waterfall")
        if spec is None:
            return head + "<p>nothing to show</p></section>"
        shown = len(spec["data"][-1]["text"])
        text = ("Each bar is one exchange from A1 (app sends) to A4 (app receives): request leg, "
                + ("its wait inside the proxy (pink, P2 − P1), " if self.proxied else "") +
                "queueing (pale: estimated), execution, response leg; its client time at the end. Exchanges seen at "
                "the DB only "
                f"start at D1. The {shown} slowest are shown")
        text += "; faster ones would be empty bars at this scale." if shown < min(30, len(self.x)) else "."
        return head + f"<p class='caption'>{esc(text)}</p><div id='fig-waterfall' class='fig'></div></section>"

    # -------------------------------------------------------------- profile

    def profile(self) -> str:
        head = "<section id='profile'><h2>Query profile</h2>"
        span = self.axis.span_s if self.axis is not None else None
        p = profile(self.x, span) if self.profiled is None else spanned(self.profiled(), span)
        if p.empty:
            return head + "<p>no statements</p></section>"
        p = by_client_time(p)
        client_total = float(np.nansum(p["client_sum"].to_numpy(dtype="float64", na_value=np.nan)))
        shown = p.head(PROFILE_ROWS)
        rows = []
        for r in shown.itertuples(index=False):
            measured = "–" if pd.isna(r.exec_measured) else f"{100 * r.exec_measured:.0f} %"
            user = r.user_db + (f" (+{r.user_db_more})" if r.user_db_more else "")
            exec_cell = Html(f"{esc(_sum_s(r.exec_sum))}<div class='sub'>{esc(share(r.exec_share))}</div>")
            client_share = r.client_sum / client_total if client_total > 0 and not pd.isna(r.client_sum) else None
            client_cell = Html(f"{esc(_sum_s(r.client_sum))}<div class='sub'>{esc(share(client_share))}</div>")
            rows.append(_Row([str(r.rank), Html(f"<code class='qid'>{esc(r.query_id or '')}</code>"), count(r.calls),
                              client_cell, _qps(r.qps), exec_cell, measured, seconds(r.exec_avg), seconds(r.exec_min),
                              seconds(r.exec_max), seconds(r.exec_p95), _vm(r.exec_vm), count(r.rows_sum),
                              _bytes(r.bytes_sum), user, _split_bar(r), count(r.hidden_slow)]))
            rows.append(_Row([Html(f"<div class='sample'><code>{esc(clip(r.sample, 600))}</code>"
                                   f"<div class='fp'>{esc(r.commands)} · fingerprint: {esc(clip(r.fingerprint, 300))}"
                                   "</div></div>")], span=17))
        more = len(p) - len(shown)
        text = ("In the manner of pt-query-digest's profile: one row per fingerprint (Query ID as pt-query-digest and "
                "PMM print it), ranked by what its clients waited (A4 − A1; with a DB capture alone the server's "
                "D4 − D1, as pt-query-digest --type tcpdump ranks it), with execution beside it: a class that "
                "queued is first here and last by execution. Execution is the slow log's Query_time where the statement "
                "was logged, else an estimate from the wire (\"logged\" says which share of calls was measured so). "
                "avg/min/max/p95 and V/M (variance-to-mean) are of execution per call; QPS is calls per second of "
                f"capture ({seconds(span)}); rows and bytes are what the server sent. The split is where the clients' "
                "time went for that fingerprint: network, queueing (pale: estimated), execution. Below each row the "
                "slowest call as the server ran it (with its parameter values), the commands of the fingerprint and the "
                "fingerprint.")
        return (head + f"<p class='caption'>{esc(text)}</p>"
                + _table(["rank", "Query ID", "calls", "clients' time, share", "QPS", "exec, share", "logged", "avg",
                          "min", "max", "p95", "V/M", "rows", "bytes", "user@db", "client time: net · queue · exec",
                          "hidden slow"], rows, numeric=(2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16), cls="profile")
                + (f"<p>… and {more} more fingerprints.</p>" if more > 0 else "") + "</section>")

    # -------------------------------------------------------------- hidden slow / understated

    def statements(self, kind: str, title: str) -> str:
        head = f"<section id='{kind}'><h2>{esc(title)}</h2>"
        x = self.x
        col = "hidden_slow" if kind == "hidden" else "understated"
        if kind == "understated" and col not in x.columns:
            return ""
        if self.summary["inputs"]["long_query_time"] is None and kind == "hidden":
            return head + "<p>long_query_time unknown: hidden slow not decided.</p></section>"
        flagged = np.flatnonzero(x[col].fillna(False).to_numpy(dtype=bool))
        if len(flagged) == 0:
            none = ("None: no statement was slower than long_query_time on the wire without being slow-logged."
                    if kind == "hidden" else
                    "None: no slow-logged statement waited 0.1 s or more before it executed.")
            return head + f"<p>{esc(none)}</p></section>"
        stall = self._stall_of(flagged)
        order = np.lexsort((self.t.start[flagged], stall))  # by stall (none last), then by time
        rows_at = flagged[order][:HIDDEN_ROWS]
        culprits = culprit_mask(x, self.summary, self.t)
        # the listed rows taken once, in the columns a row shows: a row taken at a time from the whole table
        # would copy all of its columns for each row
        listed = self.columns.at(rows_at, _STATEMENT_COLUMNS)
        estimated = queue_parts(listed)[1]
        table_rows, current = [], None
        for pos, r, est in zip(rows_at, listed.to_dict("records"), estimated):
            sid = stall[np.searchsorted(flagged, pos)]
            if sid != current:
                current = sid
                table_rows.append(_Row([self._stall_header(sid)], span=10, cls="stallhead"))
            table_rows.append(self._statement_row(pos, r, est, sid, culprits))
        more = len(flagged) - len(rows_at)
        intro = (f"{len(flagged)} statements took longer than long_query_time between D1 and D4 but are not in the "
                 "slow log: the time went before execution." if kind == "hidden" else
                 f"{len(flagged)} statements are in the slow log, yet waited 0.1 s or more before executing: the slow "
                 "log's Query_time understates what their clients waited.")
        intro += (" Grouped by the stall they queued in, each with the statement that held its thread group; the "
                  "frames and a display filter (Wireshark's filter bar, or tshark -Y) select each one in its capture.")
        return (head + f"<p>{esc(intro)}</p>"
                + _table(["request sent", "conn", "group", "SQL", "client", "server", "queue", "exec", "held by",
                          "frames"], table_rows, numeric=(4, 5, 6), cls="statements")
                + (f"<p>… and {more} more (all are in exchanges.parquet: <code>{col} == true</code>).</p>"
                   if more > 0 else "") + "</section>")

    def _stall_of(self, rows: np.ndarray) -> np.ndarray:
        """Stall position (index into self.stalls) of each row, len(stalls) when it queued in none."""
        none = len(self.stalls)
        x = self.x
        if "stall" in x.columns:
            ids = {self.stall_id(i): i for i in range(len(self.stalls))}
            got = x["stall"].to_numpy(dtype="float64", na_value=np.nan)[rows]
            return np.array([none if np.isnan(v) else ids.get(int(v), none) for v in got], dtype=np.int64)
        out = np.full(len(rows), none, dtype=np.int64)
        group = self.columns.at(rows, ("thread_group",))["thread_group"].to_numpy(dtype="float64", na_value=np.nan)
        d1, has = self.t.d1[rows], self.t.has_d1[rows]
        for i, st in enumerate(self.stalls):
            inside = (has & (group == st["thread_group"]) & (d1 >= pd.Timestamp(st["start"]).value)
                      & (d1 <= pd.Timestamp(st["end"]).value) & (out == none))
            out[inside] = i
        return out

    def _stall_header(self, i: int) -> Html:
        if i >= len(self.stalls):
            return Html("Not in a stalled stretch of a thread group")
        st = self.stalls[i]
        sid = self.stall_id(i)
        culprits = st.get("culprits") or []
        more = len(culprits) - 1 + (st.get("culprits_more") or 0)
        if self._at_thread_limit(st):
            cap = self.summary["pool"]["cap"]
            conns = ", ".join(integer(c.get("conn_id")) for c in culprits)
            held = (f" — the pool was at its thread limit ({esc(cap['threads'])} executing: connections "
                    f"{esc(conns)}{esc(f' and {more - len(culprits) + 1} more') if more >= len(culprits) else ''})")
        elif culprits:
            c = culprits[0]
            held = (f" — held by conn {esc(integer(c.get('conn_id')))} <code>{esc(clip(c.get('sql'), 120))}</code> "
                    f"executing {esc(seconds(c.get('exec_s')))}" + (f" (and {more} more executing)" if more else ""))
        else:
            held = " — no culprit found"
        return Html(f"<a href='#stall-{sid}'>Stall {sid}</a>: thread group {esc(st['thread_group'])}, "
                    f"{esc(self.when(pd.Timestamp(st['start']).value))} for {esc(seconds(st['duration_s']))}, "
                    f"{esc(st['queued'])} queued{held}")

    def _at_thread_limit(self, st: dict) -> bool:
        """The stall lies in a stretch where the whole pool was at thread_pool_max_threads (summary pool.cap)."""
        cap = (self.summary.get("pool") or {}).get("cap")
        if not cap or not cap.get("start") or not cap.get("end"):
            return False
        return (pd.Timestamp(st["start"]) <= pd.Timestamp(cap["end"])
                and pd.Timestamp(st["end"]) >= pd.Timestamp(cap["start"]))

    def _statement_row(self, pos: int, r: dict, estimated: float, stall: int, culprits: np.ndarray) -> "_Row":
        """Row `pos` of the table, `r` its values (_STATEMENT_COLUMNS), `estimated` the estimated part of its
        queue (queue_parts)."""
        frames = []
        if str(r["seen"]) in ("both", "app") and pd.notna(r["resp_last_frame"]):
            frames.append(("app", r["client"], r["req_first_frame"], r["resp_last_frame"]))
        if pd.notna(r["db_req_first_frame"]) and pd.notna(r.get("db_resp_last_frame")):
            frames.append(("db", r["db_client"], r["db_req_first_frame"], r["db_resp_last_frame"]))
        cells = [f"{label} {int(a)}–{int(b)}" for label, _, a, b in frames]
        filters = [display_filter(str(c), str(r["server"]), int(a), int(b)) for _, c, a, b in frames
                   if pd.notna(c) and pd.notna(r["server"])]
        frame_cell = Html(esc(" · ".join(cells)) + (
            "<details><summary>filters</summary>" + "".join(f"<code class='filter'>{esc(f)}</code>" for f in filters)
            + "</details>" if filters else ""))
        if stall < len(self.stalls) and (self.stalls[stall].get("culprits") or []):
            st = self.stalls[stall]
            c = st["culprits"][0]
            more = len(st["culprits"]) - 1 + (st.get("culprits_more") or 0)
            label = "thread limit" if self._at_thread_limit(st) else f"conn {integer(c.get('conn_id'))}" + (
                f" +{more}" if more else "")
            held = Html(f"<a href='#stall-{self.stall_id(stall)}'>{esc(label)}</a>")
        else:
            held = "–"
        queue = seconds(r["queue_s"]) + (f" ({seconds(estimated)} estimated)" if estimated > 0 else "")
        sql = r["sql"] if isinstance(r["sql"], str) else r["command"]
        return _Row([self.when(self.t.start[pos]), integer(r["conn_id"]), integer(r["thread_group"]),
                     Html(f"<code title='{esc(clip(sql, 2000))}'>{esc(clip(sql, 160))}</code>"),
                     seconds(r["total_s"]), seconds(r["server_s"]), queue,
                     f"{seconds(r['exec_s'])} ({r['exec_source'] if isinstance(r['exec_source'], str) else '?'})",
                     held, frame_cell], cls="culprit" if culprits[pos] else "")

    # -------------------------------------------------------------- through a proxy

    def proxy(self) -> str:
        """How exchanges were paired through the proxy, its clocks, its pool at work, and the statements that waited
        longest inside it; nothing without a proxy."""
        p = self.summary.get("proxy")
        if not p or "proxy_match" not in self.x.columns:
            return ""
        kinds = p.get("exchanges") or {}
        through = p.get("through") or {}
        sides = p.get("sides") or {}
        points = p.get("points") or {}
        kind = str(p.get("kind") or "?")
        rows = [("kind", f"{kind.upper()}: " + (
                    "one server connection per client connection, bytes passed through (HAProxy in TCP mode, a TCP "
                    "load balancer)" if kind == "l4" else
                    "statements of many client connections on fewer server connections (a pooling MySQL proxy)"
                    if kind == "l7" else "not decided")),
                ("capture points", ", ".join(f"{n} {'yes' if points.get(n) else 'no'}" for n in ("app", "proxy", "db"))),
                ("client exchanges paired across it", _paired_text(through, kinds))]
        for key, label in (("ambiguous", "ambiguous (several server requests fit: not paired, never guessed)"),
                           ("unmatched", "unmatched (no server request fits)"),
                           ("proxy-handled", "answered by the proxy itself (login, PREPARE, PING, …)"),
                           ("proxy-own", "sent by the proxy on its own (SET NAMES, health checks, …)")):
            if kinds.get(key):
                rows.append((label, integer(kinds[key])))
        if through.get("back_unpaired"):
            rows.append(("server-side requests not paired to a client request", integer(through["back_unpaired"])))
        if sides:
            rows.append(("proxy capture's sides told apart by", f"{sides.get('decided_by', '?')}: client side "
                         f"{', '.join(sides.get('front_servers') or []) or '?'}, server side "
                         f"{', '.join(sides.get('back_servers') or []) or '?'}"))
        for hop, label in (("app_proxy", "app ↔ proxy"), ("proxy_db", "proxy ↔ DB")):
            m = p.get(hop)
            if m:
                rows.append((f"matching {label}", f"{m['matched']} matched, {m['app_only']} only at the first, "
                             f"{m['db_only']} only at the second, {m['connections_matched']} connections"))
        for hop, models in (p.get("clocks") or {}).items():
            for name, c in (models or {}).items():
                if isinstance(c, dict) and c.get("offset_s") is not None:
                    lo, hi = c.get("offset_bounds_s") or (None, None)
                    bounds = f" (bounds {_signed(lo)} … {_signed(hi)})" if lo is not None else ""
                    rows.append((f"clock {hop.replace('_', ' ↔ ')}", f"{_signed(c['offset_s'])}{bounds}, "
                                 f"{c.get('quality', '?')} — {name}"))
        parts = [f"<p class='verdict'>{esc(p.get('sentence') or '')}</p>", _kv_table(rows)]
        if self.figures.get("proxy"):
            parts.append("<p class='caption'>Statements waiting inside the proxy (from their arrival at its client "
                         "side until it sent them on) and statements it had sent on to the DB and not yet seen "
                         "answered, most at once per time bucket; each statement's wait at its arrival (right axis). "
                         "A pool smaller than its clients: a flat line of statements sent on, with waiting ones "
                         "above it.</p><div id='fig-proxy' class='fig short'></div>")
        parts.append(self._proxy_servers())
        parts.append(self._proxy_waits())
        if kinds.get("ambiguous"):
            parts.append(f"<p>{integer(kinds['ambiguous'])} client statements had several server-side requests of the "
                         "same text inside their time: they are not paired (proxy_match = ambiguous, proxy_candidates "
                         "says how many fit), so their time inside the proxy and inside the DB is not told apart; "
                         "they count in neither.</p>")
        return "<section id='proxy'><h2>Through the proxy</h2>" + "".join(parts) + "</section>"

    def _proxy_servers(self) -> str:
        """The server connections the proxy used, with what ran on them: a pool's size and its load."""
        x = self.x
        paired = x["proxy_match"].isin(PAIRED_KINDS).to_numpy(dtype=bool, na_value=False)
        own = (x["proxy_match"] == "proxy-own").to_numpy(dtype=bool, na_value=False)
        back = self.columns.at(np.flatnonzero(paired | own), _PROXY_SERVER_COLUMNS)
        if not len(back):
            return ""
        g = back.assign(paired=paired[paired | own], own=own[paired | own],
                        front=back["client"].where(paired[paired | own])).groupby(
            back["db_client"].astype(object).fillna("?"), sort=False)
        table = pd.DataFrame({"conn": g["conn_id"].first(), "paired": g["paired"].sum(), "own": g["own"].sum(),
                              "clients": g["front"].nunique(), "busy": g["server_s"].sum(min_count=1),
                              "wait": g["proxy_wait_s"].sum(min_count=1)})
        table = table.sort_values(["paired", "busy"], ascending=False)
        shown = table.head(PROXY_ROWS)
        rows = [[k, integer(r.conn), integer(r.paired), integer(r.clients), integer(r.own), _sum_s(r.busy), _sum_s(r.wait)]
                for k, r in shown.iterrows()]
        more = f"<p>{len(table) - len(shown)} more server connections in exchanges.parquet.</p>" \
            if len(table) > len(shown) else ""
        fronts = int(self.columns.at(np.flatnonzero(x["app_req_ts"].notna().to_numpy()), ("client",))["client"]
                     .nunique()) if "app_req_ts" in x.columns else 0
        return (f"<h3>Server connections of the proxy</h3><p>{len(table)} server connections carried the "
                f"{int(paired.sum())} paired statements of {fronts} client connections.</p>"
                + _table(["server connection (proxy side)", "conn_id", "client statements", "client connections",
                          "proxy's own", "time inside the DB", "their wait inside the proxy"], rows,
                         numeric=range(1, 7)) + more)

    def _proxy_waits(self) -> str:
        x = self.x
        wait = _f(x, "proxy_wait_s")
        rows_ = np.flatnonzero(~np.isnan(wait))
        if not len(rows_):
            return ""
        top = rows_[np.argsort(-wait[rows_], kind="stable")][:PROXY_ROWS]
        top = top[wait[top] > 0]
        if not len(top):
            return "<p>No statement waited inside the proxy.</p>"
        rows = []
        waited = self.columns.at(top, _PROXY_WAIT_COLUMNS)
        for i in range(len(top)):
            r = waited.iloc[i]
            rows.append([self.when(r["app_req_ts"]) if pd.notna(r["app_req_ts"]) else "?",
                         f"{r['client']} (id {integer(r['front_conn_id'])})", integer(r["conn_id"]),
                         Html(f"<code>{esc(clip(r['sql'] if pd.notna(r['sql']) else r['command'], 120))}</code>"),
                         str(r["proxy_match"]), seconds(r["proxy_wait_s"]), seconds(r["proxy_s"]), seconds(r["server_s"]),
                         seconds(r["total_s"])])
        return ("<h3>Longest waits inside the proxy</h3>"
                + _table(["sent (A1)", "client connection", "server conn_id", "statement", "paired by",
                          "waited in the proxy (P2 − P1)", "inside the proxy", "inside the DB (D4 − D1)",
                          "client (A4 − A1)"], rows, numeric=range(5, 9)))

    # -------------------------------------------------------------- connections

    def connections(self, connections: dict | None, conns: pd.DataFrame | None) -> str:
        head = "<section id='connections'><h2>Connections</h2>"
        parts = []
        if conns is not None:
            point = conns["point"].iloc[0] if len(conns) else ("db" if connections.get("db") is not None else "app")
            raw = connections.get(point)
            n_all = 0 if raw is None else len(raw)
            mid = 0 if raw is None else int(raw["midstream"].fillna(False).sum())
            tls = 0 if raw is None else int(raw["tls"].fillna(False).sum())
            modes = {} if raw is None or "tls_mode" not in raw else raw["tls_mode"].dropna().astype(str).value_counts()
            how = "; ".join(f"{int(modes[m])} {w}" for m, w in (("decrypted", "decrypted with the key log"),
                                                                ("timed", "timed without their text"),
                                                                ("unreadable", "unreadable")) if m in modes)
            where = "DB capture (the server's view)" if point == "db" else "app capture"
            parts.append(f"<p>At the {esc(where)}: {n_all} MySQL connections, {len(conns)} of them opened during the "
                         f"capture ({mid} were already open when it began), {tls} switched to TLS"
                         f"{f' ({esc(how)})' if how else ''}.</p>")
            rows = []
            for col, label, meaning in (
                    ("syn_greeting_s", "SYN → greeting",
                     "TCP set-up and the server creating (or taking from its cache) a thread and sending its greeting"),
                    ("greeting_ok_s", "greeting → OK", "authentication, from the greeting to the OK that ends it"),
                    ("syn_ok_s", "SYN → OK", "the whole set-up the client waits for")):
                v = conns[col].to_numpy(dtype=np.float64)
                v = v[~np.isnan(v)]
                if len(v):
                    q = nearest_rank(v, [0.5, 0.95, 0.99])
                    rows.append([label, str(len(v)), *(seconds(s) for s in q), seconds(v.max()), meaning])
            parts.append(_table(["set-up", "connections", "p50", "p95", "p99", "max", "what it covers"], rows,
                                numeric=range(1, 6)) if rows else "<p>No connection set-up was captured.</p>")
        else:
            logins = (self.x["command"] == "CONNECT").to_numpy(dtype=bool, na_value=False)
            connect = self.columns.at(np.flatnonzero(logins), ("response_s",))
            v = connect["response_s"].dropna().to_numpy(dtype=float)
            if len(v):
                q = nearest_rank(v, [0.5, 0.95, 0.99])
                parts.append(f"<p>{len(connect)} logins in the capture; login packet → OK p50 {seconds(q[0])}, p95 "
                             f"{seconds(q[1])}, p99 {seconds(q[2])}, max {seconds(v.max())}.</p>")
            else:
                parts.append("<p>No connection handshake in the capture (connections were already open when it "
                             "began).</p>")
        parts.append(_connection_story(self.summary.get("connections")))
        if self.figures.get("connrate"):
            parts.append("<p class='caption'>New connections per time bucket over the whole capture (TLS stacked on "
                         "plain), and each connection's set-up latencies at its SYN (right axis). A connection storm "
                         "with a growing SYN → greeting is the thread cache or the pool's login queue.</p>"
                         "<div id='fig-connrate' class='fig short'></div>")
        if self.figures.get("openconns"):
            parts.append("<p class='caption'>Open connections over time (the capture point the exchanges come from: "
                         "each connection from its first to its last frame; sampled, the most at once marked). Against "
                         "max_connections and thread_cache_size: a plateau at max_connections is refusals (ERR 1040), "
                         "a saw-tooth is churn.</p><div id='fig-openconns' class='fig short'></div>")
        x = self.x
        login_errors = int(((x["command"] == "CONNECT") & (x["result"] == "error")).fillna(False).sum())
        errors = self.columns.at(np.flatnonzero((x["result"] == "error").fillna(False).to_numpy(dtype=bool)),
                                 ("error_code", "error_message", "command"))
        if len(errors):
            g = aggregated(errors.groupby(errors["error_code"].astype("Int64"), dropna=False),
                           count=("command", "size"), message=("error_message", "first"))
            rows = [[integer(code), str(row["count"]), clip(row["message"], 200)] for code, row in g.iterrows()]
            parts.append(f"<h3>Errors</h3><p>{login_errors} of them at login.</p>"
                         + _table(["error code", "count", "first message"], rows, numeric=(1,)))
        else:
            parts.append("<p>No error responses.</p>")
        return head + "".join(parts) + "</section>"


# ------------------------------------------------------------------ small sections and helpers


def _connection_story(story: dict | None) -> str:
    """summary.json → connections as a table: churn, set-up against the statements, who closed, idle closes, the
    most open at once, refusals."""
    if not story:
        return ""
    closes = story.get("closes") or {}
    idle = story.get("idle_closes") or {}
    rows = [
        ("new connections", f"{story['new']:,} in {seconds(story['span_s'])} ({story['new_per_s']:.1f}/s) for "
                            f"{story['statements']:,} statements ({story['statements_per_s']:.1f}/s)"),
        ("set-up (SYN → login OK), summed", f"{seconds(story['setup_sum_s'])} against {seconds(story['statements_sum_s'])}"
                                           " of the statements' own time"),
        ("closed by", f"the client's COM_QUIT {closes.get('client_quit', 0)}, the client's FIN/RST without it "
                      f"{closes.get('client_fin_rst', 0)}, the server {closes.get('server', 0)}, open at the end "
                      f"{closes.get('open', 0)}"),
        ("idle closes by the server", "none" if not idle.get("measured") else
         f"{idle['count']} after {seconds(idle['idle_min_s'])} … {seconds(idle['idle_max_s'])} idle"
         + (" (one timer: wait_timeout)" if idle.get("steady") else "")
         + (f", {idle['failed']} with a statement after it, unanswered" if idle.get("failed") else "")),
        ("most open at once", f"{story.get('open_max')}" + (f" at {clock(story['open_max_at'])} UTC"
                                                            if story.get("open_max_at") else "")),
        ("refused (ERR 1040)", str(story.get("refused") or 0)),
    ]
    return "<h3>The connection story</h3>" + _kv_table(rows)


def _captures(summary: dict) -> list[tuple[str, dict]]:
    caps = summary.get("captures", {})
    out = [("app", q) for q in caps.get("app") or []]
    if caps.get("db"):
        out.append(("DB", caps["db"]))
    return out


def _quality(summary: dict) -> str:
    caps = _captures(summary)
    if not caps:
        return "<p>no capture</p>"
    keys = list(dict.fromkeys(k for _, q in caps for k in q if k not in ("file", "first_ts", "last_ts")))
    # counters that are zero everywhere are named in one line, so that the problems stand out
    always = ("format", "frames", "frames_tcp_mysql", "mysql_connections", "exchanges")
    quiet = [k for k in keys if k not in always and all(q.get(k) in (None, 0, False, "") for _, q in caps)]
    keys = [k for k in keys if k not in quiet]
    head = "<tr><th></th>" + "".join(f"<th>{esc(side)}: {esc(q.get('file'))}</th>" for side, q in caps) + "</tr>"
    body = []
    for k in keys:
        cells = []
        for _, q in caps:
            v = q.get(k)
            bad = k in CAPTURE_PROBLEM_KEYS and v not in (None, 0, False, "")
            cells.append(f"<td class='{'bad' if bad else ''}'>{esc(cell(v))}</td>")
        body.append(f"<tr><th>{esc(k)}</th>{''.join(cells)}</tr>")
    zero = f"<p class='caption'>Zero or empty in every capture: {esc(', '.join(quiet))}.</p>" if quiet else ""
    return f"<table class='quality'>{head}{''.join(body)}</table>{zero}"


def _method(command_line: str | None) -> str:
    def columns(cols: tuple[Column, ...]) -> str:
        return _table(["column", "dtype", "meaning"], [[c.name, c.dtype, c.meaning] for c in cols])

    return (
        "<section id='method'><h2>Method and columns</h2><ul>"
        "<li><b>A1, A4</b>: first request byte and last response byte at the app capture; <b>D1, D4</b>: the same "
        "bytes at the DB capture, matched by TCP sequence number per connection and put on the app clock with the "
        "fitted offset and skew (convex hulls of one-way delays from every segment seen at both points). Every time "
        "on this page is UTC on the app capture's clock.</li>"
        "<li><b>client</b> = A4 − A1; <b>server</b> = D4 − D1 (DB clock, skew-corrected); <b>network</b> = client − "
        "server, split into the request leg D1 − A1 and the response leg A4 − D4.</li>"
        "<li><b>execution</b>: the slow log's Query_time when the statement is in it; otherwise an estimate or a "
        "bound named in exec_source. <b>queueing</b> = server − execution (≥ 0): time before a worker ran it. "
        "Queueing is <i>measured</i> when execution comes from the slow log, a <i>lower bound</i> when execution is "
        "known to be shorter than long_query_time, <i>likely</i> when the server time is far above the statement's "
        "typical execution while a long statement executed on its thread group (told as likely, with what would "
        "prove it), and <i>estimated</i> when execution is estimated from other "
        "runs of the statement; an estimate is shown pale and never counts as evidence of a queue. A statement "
        "known faster than long_query_time with nothing better known has no execution time, only its bound.</li>"
        "<li><b>hidden slow</b>: server time above long_query_time, yet not in the slow log and not flagged "
        "SERVER_QUERY_WAS_SLOW on the wire. <b>understated</b>: in the slow log, yet it waited ≥ 0.1 s before "
        "executing. <b>thread group</b> = connection id mod thread_pool_size.</li>"
        "<li>Streaming (time to send a large result) is part of execution in the slow log's Query_time and of the "
        "server time; it is not split out.</li></ul>"
        f"<p>pcapdecomp {esc(__version__)}" + (f"; command: <code>{esc(command_line)}</code>" if command_line else "")
        + "</p><details><summary>Exchanges columns</summary>" + columns(EXCHANGE_COLUMNS) + "</details>"
        "<details><summary>Columns added by analyze</summary>" + columns(ANALYSIS_COLUMNS) + "</details>"
        "<details><summary>groups.parquet columns</summary>" + columns(GROUP_COLUMNS) + "</details></section>"
    )


def _nav(proxied: bool) -> str:
    links = (("verdict", "Verdict"), ("timeline", "Timeline"), ("decomposition", "Split"), ("groups", "Groups"),
             *((("proxy", "Proxy"),) if proxied else ()), ("waterfall", "Waterfall"), ("profile", "Profile"), ("hidden", "Hidden slow"),
             ("understated", "Understated"), ("connections", "Connections"), ("inputs", "Inputs"),
             ("method", "Method"))
    return " · ".join(f"<a href='#{a}'>{t}</a>" for a, t in links)


def _playbook(summary: dict) -> str:
    """What to change (summary.json → playbook): one line per finding, with the SQL that makes the change or
    fetches an unknown setting."""
    lines = summary.get("playbook") or []
    if not lines:
        return ""
    items = "".join(f"<li>{esc(line.get('text'))}" + (f" <code>{esc(line['sql'])}</code>" if line.get("sql") else "")
                    + "</li>" for line in lines)
    return f"<h3>What to change</h3><ul class='playbook'>{items}</ul>"


def _slow_log_text(summary: dict) -> str:
    s = summary.get("slow_log") or {}
    if not s.get("file"):
        return "none"
    if not s.get("used"):
        return f"{s['file']} (not used: see warnings)"
    return (f"{s['file']} ({s.get('flavor', '?')}; {s.get('entries', '?')} entries, {s.get('matched', '?')} joined, "
            f"{s.get('unparsed_lines', 0)} unparsed lines)")


def _pool_size_value(summary: dict):
    tps = summary.get("thread_pool_size")
    if isinstance(tps, dict):
        return tps.get("value")
    return summary["inputs"].get("thread_pool_size")


def _pool_size_text(summary: dict) -> str:
    tps = summary.get("thread_pool_size")
    if not isinstance(tps, dict):
        return _or_unknown(summary["inputs"].get("thread_pool_size"))
    inferred = tps.get("inferred") or {}
    if tps.get("value") is None:
        text = "unknown"
    elif tps.get("source") == "inferred":
        text = f"{tps['value']} (inferred from the wire, {inferred.get('confidence', '?')})"
    else:
        text = f"{tps['value']} (given)"
    if tps.get("source") != "inferred" and inferred.get("value") is not None:
        text += f"; the wire suggests {inferred['value']} ({inferred.get('confidence', '?')})"
    if tps.get("warning"):
        text += f" — {tps['warning']}"
    return text


class _Row(list):
    """A table row with a class, or one cell spanning `span` columns."""

    def __init__(self, cells, span: int = 0, cls: str = ""):
        super().__init__(cells)
        self.span, self.cls = span, cls


def _paired_text(through: dict, kinds: dict) -> str:
    paired = through.get("paired")
    if paired is None:
        paired = sum(int(kinds.get(k) or 0) for k in PAIRED_KINDS)
    by = through.get("paired_by") or {k: kinds[k] for k in PAIRED_KINDS if kinds.get(k)}
    return f"{integer(paired)}" + (" (" + ", ".join(f"{k} {integer(v)}" for k, v in by.items()) + ")" if by else "")


def _kv_table(rows: list[tuple[str, str]]) -> str:
    return "<table class='kv'>" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows) + "</table>"


def _table(headers: list[str], rows: list, numeric=(), cls: str = "") -> str:
    """Cells are escaped unless they are Html; `numeric` columns are right-aligned."""
    numeric = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for r in rows:
        span = getattr(r, "span", 0)
        cells = []
        for i, c in enumerate(r):
            attrs = f" colspan='{span}'" if span else " class='num'" if i in numeric else ""
            cells.append(f"<td{attrs}>{c if isinstance(c, Html) else esc(c)}</td>")
        row_cls = getattr(r, "cls", "")
        body.append(f"<tr class='{esc(row_cls)}'>" if row_cls else "<tr>")
        body.append("".join(cells) + "</tr>")
    return f"<table class='{esc(cls)}'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _split_bar(r) -> Html:
    """The fingerprint's client time as a bar: network, queueing (measured or bound), queueing (estimated),
    execution; the numbers in words beside it."""
    net = 0.0 if pd.isna(r.network_sum) else max(float(r.network_sum), 0.0)
    q_all = 0.0 if pd.isna(r.queue_sum) else max(float(r.queue_sum), 0.0)
    q_est = 0.0 if pd.isna(r.queue_estimated_sum) else min(max(float(r.queue_estimated_sum), 0.0), q_all)
    ex = 0.0 if pd.isna(r.exec_sum) else max(float(r.exec_sum), 0.0)
    parts = (("network", net), ("queueing", q_all - q_est), ("queueing (estimated)", q_est), ("execution", ex))
    total = sum(v for _, v in parts)
    if total <= 0:
        return Html("–")
    spans = "".join(f"<span style='width:{100 * v / total:.2f}%;background:{COLORS[label]}'></span>"
                    for label, v in parts if v > 0)
    words = " · ".join(f"{label} {100 * v / total:.1f} %" for label, v in parts if v > 0)
    short_words = f"net {100 * net / total:.0f} · queue {100 * q_all / total:.0f} · exec {100 * ex / total:.0f} %"
    return Html(f"<div class='split' title='{esc(words)}'>{spans}</div><div class='splitnum'>{esc(short_words)}</div>")


def _f(x: pd.DataFrame, col: str) -> np.ndarray:
    return x[col].to_numpy(dtype="float64", na_value=np.nan)


def _qps(v) -> str:
    return "–" if v is None or pd.isna(v) else (f"{v:.2f}" if v < 100 else f"{v:,.0f}")


def _sum_s(v) -> str:
    return "–" if v is None or pd.isna(v) else f"{v:.3f} s" if v >= 0.001 else seconds(v)


def _vm(v) -> str:
    return "–" if v is None or pd.isna(v) else f"{v:.2f}"


def _bytes(v) -> str:
    if v is None or pd.isna(v):
        return "–"
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if v >= k:
            return f"{v / k:.1f} {unit}"
    return f"{int(v)} B"


def _or_unknown(v, unit: str = "") -> str:
    return "unknown" if v is None else f"{v}{unit}"


def _signed(v: float) -> str:
    return f"{v * 1e3:+.3f} ms" if abs(v) >= 1e-3 else f"{v * 1e6:+.3f} µs"


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:0 2em 3em;max-width:110em;color:#222}"
    "header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:.3em 0;z-index:5}"
    "h1{font-size:1.4em;margin:.3em 0}h2{border-bottom:2px solid #446;padding-top:.8em}"
    "nav a{color:#335;text-decoration:none}.verdict{font-size:1.2em;background:#f5f5fa;padding:.8em;"
    "border-left:4px solid #c33;margin-bottom:.3em}.bullets{margin-top:.2em}"
    "table{border-collapse:collapse;font-size:88%;margin:.5em 0}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}th{background:#f0f0f4}"
    "td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}"
    "td.bad{background:#fdd;font-weight:bold}.caption{color:#555;max-width:80em}.fig{width:100%;height:420px}"
    ".fig.short{height:300px}.fig.small{height:200px;max-width:60em}code{font-size:90%}"
    "code.filter{user-select:all;color:#135;display:block;margin:.2em 0}details summary{cursor:pointer;color:#335}"
    ".warn li{color:#a40}details{margin:.2em 0}tr.stallhead td{background:#fbeaea;font-weight:600}"
    "tr.culprit td{background:#eee}table.statements code{word-break:break-all}"
    "code.qid{font-size:75%}.sub{font-size:85%;color:#555}table.profile td{padding:2px 4px}"
    ".split{display:flex;width:9em;height:.9em;border:1px solid #bbb}.split span{display:block;height:100%}"
    ".splitnum{font-size:85%;color:#555}.sample{padding-left:2em}.sample .fp{color:#777;font-size:85%}"
    "button.zoom{font-size:85%;cursor:pointer}.tip{position:fixed;display:none;z-index:10;background:#fff;"
    "border:1px solid #888;padding:.3em .5em;font-size:85%;white-space:pre-wrap;max-width:40em;pointer-events:none;"
    "box-shadow:0 1px 4px rgba(0,0,0,.3)}"
)

# window.onerror first, so that errors thrown while plotly.js loads are recorded too
_ERRORS = ("window.__errors=[];window.addEventListener('error',function(e){window.__errors.push(String(e.message));"
           "document.documentElement.setAttribute('data-errors',window.__errors.join(' | '));});")

# The figures, then the shared time axis: a zoom or pan in one time chart is applied to the others; a stall's zoom
# button sets all of them.
_BOOT = """
(function(){
  var specs = __SPECS__;
  var timeFigs = specs._time || [];
  var names = Object.keys(specs).filter(function(n){ return n.charAt(0) !== '_'; });
  var last = '';
  function timeEls(){
    return timeFigs.map(function(n){ return document.getElementById('fig-' + n); })
                   .filter(function(el){ return el && el._fullLayout; });
  }
  function setRange(r, except){
    last = JSON.stringify(r);
    return Promise.all(timeEls().filter(function(el){ return el !== except; }).map(function(el){
      return Plotly.relayout(el, {'xaxis.range': r.slice(), 'xaxis.autorange': false});
    }));
  }
  function follow(el){
    el.on('plotly_relayout', function(ev){
      if (!('xaxis.range[0]' in ev || 'xaxis.range' in ev || 'xaxis.autorange' in ev)) { return; }
      var r = el._fullLayout.xaxis.range.slice();
      if (JSON.stringify(r) === last) { return; }
      setRange(r, el);
    });
  }
  var done = names.map(function(n){
    var el = document.getElementById('fig-' + n);
    if (!el) { return Promise.resolve(); }
    if (specs[n].layout && specs[n].layout.height) { el.style.height = specs[n].layout.height + 'px'; }
    return Plotly.newPlot(el, specs[n].data, specs[n].layout, {responsive: true, displaylogo: false})
      .then(function(){
        if (timeFigs.indexOf(n) >= 0) { follow(el); }
        if (n === 'timeline' && hover) { tooltip(el); }
      });
  });
  document.addEventListener('click', function(ev){
    var b = ev.target.closest ? ev.target.closest('button[data-zoom-from]') : null;
    if (!b) { return; }
    setRange([Number(b.getAttribute('data-zoom-from')), Number(b.getAttribute('data-zoom-to'))], null);
    var tl = document.getElementById('timeline');
    if (tl) { tl.scrollIntoView(); }
  });
  window.pcapdecompSetRange = setRange;
  // the timeline's tooltip: built from the hover table as text (textContent), never parsed as markup
  var hover = specs._timeline && specs._timeline.hover, table = null;
  function typed(a){
    if (!a || !a.bdata) { return a; }
    var bin = atob(a.bdata), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { bytes[i] = bin.charCodeAt(i); }
    return new ({f8: Float64Array, f4: Float32Array, i4: Int32Array, u1: Uint8Array}[a.dtype])(bytes.buffer);
  }
  function secs(v){
    if (!(v === v)) { return '\\u2013'; }
    var a = Math.abs(v);
    return a >= 1 ? v.toFixed(3) + ' s' : a >= 1e-3 ? (v * 1e3).toFixed(2) + ' ms' : (v * 1e6).toFixed(0) + ' \\u00b5s';
  }
  function clock(ms){
    var whole = Math.floor(ms), d = new Date(whole), us = Math.round((ms - whole) * 1000);
    function two(n){ return (n < 10 ? '0' : '') + n; }
    return two(d.getUTCHours()) + ':' + two(d.getUTCMinutes()) + ':' + two(d.getUTCSeconds()) + '.' +
      String(d.getUTCMilliseconds() * 1000 + Math.min(us, 999)).padStart(6, '0');
  }
  function statementText(i){
    if (!table) {
      table = {};
      Object.keys(hover).forEach(function(k){ table[k] = typed(hover[k]); });
    }
    var t = table, est = t.estimated[i], src = t.sources[t.source[i]] || '?', who = function(v){ return v < 0 ? '?' : String(v); };
    return [t.texts[t.sql[i]],
            'conn ' + who(t.conn[i]) + ', group ' + who(t.group[i]) + ', sent ' + clock(t.start[i]),
            'client ' + secs(t.total[i]) + ', server ' + secs(t.server[i]),
            'queue ' + secs(t.queue[i] + est) + (est > 0 ? ' (' + secs(est) + ' estimated)' : '') + ', exec ' +
              secs(t.exec[i]) + ' (' + src + '), network ' + secs(t.network[i])]
      .concat(t.proxy ? ['inside the proxy ' + secs(t.proxy[i]) + ' (waited ' + secs(t.proxywait[i]) +
                         ' before it sent the request on), client connection ' + who(t.front[i]) + ' at the proxy']
                      : []).join('\\n');
  }
  function tooltip(el){
    var box = document.createElement('div');
    box.className = 'tip';
    box.id = 'timeline-tip';
    document.body.appendChild(box);
    el.on('plotly_hover', function(ev){
      var p = ev.points && ev.points[0];
      if (!p || typeof p.data.meta !== 'number') { return; }
      box.textContent = statementText(p.data.meta + p.pointNumber);
      var e = ev.event || {};
      box.style.left = ((e.clientX || 0) + 14) + 'px';
      box.style.top = ((e.clientY || 0) + 14) + 'px';
      box.style.display = 'block';
    });
    el.on('plotly_unhover', function(){ box.style.display = 'none'; });
  }
  Promise.all(done).then(function(){
    document.body.setAttribute('data-rendered', names.length + ' figures');
  }, function(err){
    window.__errors.push(String(err));
    document.documentElement.setAttribute('data-errors', window.__errors.join(' | '));
  });
})();
"""
