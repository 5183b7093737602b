"""The connection story: what setting connections up cost the clients, how fast they came and went, who closed
them and after how long idle, how many were open at once, and refusals (ERR 1040).

Read from the connections table of the capture point whose exchanges the analysis reports (the app's when there
is one: the clients' view) and the exchanges. A connection closed by the server after an idle gap, whose next
statement then went unanswered, is the wait_timeout storm: the server (MariaDB silently, MySQL 8.0.24+ after ERR
4031) closes connections a client pool still holds, and the client's next statement fails ("server has gone
away"). Idle closes are steady when their idle times agree within IDLE_SPREAD: a timer, not chance."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.exact import masked_sums
from ..core.formats import plural, seconds_rounded, share
from ..core.groups import codes
from ..core.times import ts_ns_float

IDLE_SPREAD = 0.1  # idle-before-close times within ±10 % of their median (or 100 ms) are one timer
SERIES_POINTS = 200  # open connections over time: at most this many samples in summary.json
CHURN_SHARE = 0.5  # connections per statement from which connecting is the workload's pattern, not an accident
CHURN_MIN = 20  # … and at least this many new connections, at least CHURN_PER_S a second
CHURN_PER_S = 10
REFUSED = 1040  # ER_CON_COUNT_ERROR: Too many connections


def tell(x: pd.DataFrame, conns: pd.DataFrame | None) -> dict | None:
    """summary.json → connections (None without a connections table with handshakes or closes to tell)."""
    if conns is None or not len(conns):
        return None
    facts = row_facts(x, server_closes(conns, captures_of(x)))
    return told(facts, masked_sums(terms(x)), conns)


def captures_of(x: pd.DataFrame) -> set:
    """The captures whose exchanges the table (or a chunk of it) holds."""
    return set(codes(x["capture"])[1].tolist()) if len(x) else set()


def server_closes(conns: pd.DataFrame, captures: set) -> dict[tuple, float]:
    """The connections the server closed (of `captures`, every one when none): (capture, conn_index) → the close's
    time (float ns)."""
    c = conns[conns["capture"].astype(object).isin(captures)] if captures else conns
    if "closed_by" not in c.columns:
        return {}
    server = c[(c["closed_by"].astype(object) == "server").fillna(False).to_numpy(dtype=bool)]
    return dict(zip(zip(server["capture"].astype(object), server["conn_index"].astype("int64").tolist()),
                    ts_ns_float(server["close_ts"]).tolist()))


def terms(x: pd.DataFrame):
    """The story's sum as a (name, rows, values) term (core.exact.masked_sums: NaN as 0, in row order): the
    statements' time on the wire."""
    wire = x["total_s"].fillna(x["server_s"]) if "server_s" in x.columns else x["total_s"]
    wire = wire.fillna(x["response_s"]).to_numpy(dtype="float64", na_value=np.nan)
    yield "statements_time", ~x["command"].isin(NOT_STATEMENTS).to_numpy(dtype=bool), wire


def row_facts(x: pd.DataFrame, closes: dict[tuple, float]) -> dict:
    """What the story reads of the rows of `x` (the table or a chunk of it), reduced over chunks by combine_facts:
    the captures, the statements, the connections that sent COM_QUIT or were refused (ERR 1040), and per
    connection the server closed (`closes`) what its rows say of the close (_idle_closes)."""
    quit = (x["command"] == "COM_QUIT").fillna(False).to_numpy(dtype=bool) if len(x) else np.zeros(0, dtype=bool)
    refused = set()
    if "error_code" in x.columns:
        hit = (x["error_code"] == REFUSED).fillna(False).to_numpy(dtype=bool)
        refused = set(zip(x["capture"].astype(object)[hit], x["conn_index"].astype("int64")[hit]))
    return {"captures": captures_of(x), "statements": _statements(x),
            "quits": set(zip(x["capture"].astype(object).to_numpy()[quit].tolist(),
                             x["conn_index"].to_numpy()[quit].tolist())),
            "refused": refused, "closed": _closed_rows(x, closes)}


def combine_facts(parts: list[dict]) -> dict:
    """row_facts of the chunks' union: sets unite, counts add, per closed connection its flags or, its latest
    answer before the close the greatest."""
    out = {"captures": set(), "statements": 0, "quits": set(), "refused": set(), "closed": {}}
    for part in parts:
        for name in ("captures", "quits", "refused"):
            out[name] |= part[name]
        out["statements"] += part["statements"]
        for key, (quit, login_error, before, late) in part["closed"].items():
            have = out["closed"].get(key)
            out["closed"][key] = (quit, login_error, before, late) if have is None else (
                have[0] or quit, have[1] or login_error, float(np.fmax(have[2], before)), have[3] or late)
    return out


def told(facts: dict, sums: dict[str, tuple[int, float]], conns: pd.DataFrame) -> dict | None:
    """summary.json → connections from the rows' facts (row_facts, combined), the sums (terms') and the
    connections table."""
    captures = facts["captures"]
    c = conns[conns["capture"].astype(object).isin(captures)] if captures else conns
    if not len(c):
        return None
    first = ts_ns_float(c["first_ts"])
    last = ts_ns_float(c["last_ts"])
    span = (np.nanmax(last) - np.nanmin(first)) / 1e9 if len(c) else 0.0
    span = max(float(span), 1e-9)
    setup = c["handshake_s"].to_numpy(dtype="float64", na_value=np.nan)
    has_setup = ~np.isnan(setup)
    statements = facts["statements"]
    new = int(has_setup.sum())
    out = {
        "connections": int(len(c)),
        "new": new,
        "span_s": span,
        "new_per_s": new / span,
        "statements": statements,
        "statements_per_s": statements / span,
        "setup_sum_s": float(setup[has_setup].sum()) if new else 0.0,
        "setup_median_s": float(np.median(setup[has_setup])) if new else None,
        "setup_max_s": float(setup[has_setup].max()) if new else None,
        "statements_sum_s": sums["statements_time"][1],
    }
    out.update(_open_series(first, last))
    out["closes"] = _closes(facts["quits"], c)
    out["idle_closes"] = _idle_closes(facts["closed"], c)
    out["refused"] = _refused(facts["refused"], c)
    return out


NOT_STATEMENTS = ("COM_QUIT", "CONNECT")  # the goodbye, and the login (its time is the set-up's)


def _statements(x: pd.DataFrame) -> int:
    return int((~x["command"].isin(NOT_STATEMENTS)).sum())


def _open_series(first: np.ndarray, last: np.ndarray) -> dict:
    """Open connections over time (a sweep of first → last frame): the peak and when, and a sampled series."""
    ok = ~np.isnan(first) & ~np.isnan(last)
    if not ok.any():
        return {"open_max": None, "open_max_at": None, "open_series": []}
    times = np.concatenate([first[ok], last[ok]])
    steps = np.concatenate([np.ones(int(ok.sum())), -np.ones(int(ok.sum()))])
    order = np.lexsort((-steps, times))  # an opening before a closing at the same instant
    level = np.cumsum(steps[order])
    at = times[order]
    peak = int(np.argmax(level))
    lo, hi = at[0], at[-1]
    edges = np.linspace(lo, hi, min(SERIES_POINTS, max(len(at), 2)))
    idx = np.searchsorted(at, edges, side="right") - 1
    series = [{"t": pd.Timestamp(int(t), tz="UTC").isoformat(), "open": int(level[i]) if i >= 0 else 0}
              for t, i in zip(edges.tolist(), idx.tolist())]
    return {"open_max": int(level[peak]), "open_max_at": pd.Timestamp(int(at[peak]), tz="UTC").isoformat(),
            "open_series": series}


def _closed_rows(x: pd.DataFrame, closes: dict[tuple, float]) -> dict[tuple, tuple]:
    """Per connection the server closed that has rows in `x`: (did the client send COM_QUIT, was its login
    refused, the end of its last answered exchange at or before the close (NaN: none), did a statement start
    after the close or go unanswered before it)."""
    if not closes or not len(x):
        return {}
    mine = x[pd.MultiIndex.from_arrays([x["capture"].astype(object), x["conn_index"].astype("int64")]).isin(
        pd.MultiIndex.from_tuples(list(closes)))]
    if not len(mine):
        return {}
    end = ts_ns_float(mine["resp_last_ts"]) if "resp_last_ts" in mine.columns else np.full(len(mine), np.nan)
    ex = pd.DataFrame({"capture": mine["capture"].astype(object).to_numpy(),
                       "conn_index": mine["conn_index"].to_numpy(),
                       "quit": (mine["command"].astype(object) == "COM_QUIT").fillna(False).to_numpy(dtype=bool),
                       "login_error": ((mine["command"].astype(object) == "CONNECT") & mine["error_code"].notna()
                                       ).fillna(False).to_numpy(dtype=bool) if "error_code" in mine.columns
                       else np.zeros(len(mine), dtype=bool),
                       "end": end,
                       "start": ts_ns_float(mine["req_first_ts"])})
    out = {}
    for (cap, index), rows in ex.groupby(["capture", "conn_index"]):
        close = closes[(cap, int(index))]
        before = rows["end"][rows["end"] <= close]
        late = bool((rows["start"] > close).any() or ((rows["start"] <= close) & rows["end"].isna()).any())
        out[(cap, int(index))] = (bool(rows["quit"].any()), bool(rows["login_error"].any()),
                                  float(before.max()) if len(before) else np.nan, late)
    return out


def _closes(quits: set, c: pd.DataFrame) -> dict:
    """Who closed each connection: client COM_QUIT, client FIN/RST (no COM_QUIT), server, open at the end."""
    keys = list(zip(c["capture"].astype(object), c["conn_index"].astype("int64")))
    by = (c["closed_by"].astype(object).where(c["closed_by"].notna(), None).to_numpy() if "closed_by" in c.columns
          else np.full(len(c), None))
    out = {"client_quit": 0, "client_fin_rst": 0, "server": 0, "open": 0}
    for key, side in zip(keys, by):
        if key in quits:
            out["client_quit"] += 1
        elif side == "client":
            out["client_fin_rst"] += 1
        elif side == "server":
            out["server"] += 1
        else:
            out["open"] += 1
    return out


def _idle_closes(closed: dict[tuple, tuple], c: pd.DataFrame) -> dict:
    """The connections the server closed: idle before the close (from the last answered response), how many had
    a statement after it that went unanswered (failed), and whether the idle times are one timer (steady).
    `closed`: what their rows say (_closed_rows)."""
    if "closed_by" not in c.columns:
        return {"count": 0, "steady": False}
    server = c[(c["closed_by"].astype(object) == "server").fillna(False).to_numpy(dtype=bool)]
    if not len(server):
        return {"count": 0, "steady": False}
    idle, failed, reset = [], 0, 0
    rsts = server["close_rst"].fillna(False).to_numpy(dtype=bool) if "close_rst" in server.columns else np.zeros(
        len(server), dtype=bool)
    for cap, index, close, rst in zip(server["capture"].astype(object), server["conn_index"].astype("int64"),
                                      ts_ns_float(server["close_ts"]), rsts):
        rows = closed.get((cap, int(index)))
        if rows is None or np.isnan(close) or rows[0]:
            continue  # after a COM_QUIT the server closes first: the client's goodbye, not an idle close
        if rows[1]:
            continue  # a refused login (ERR 1040, 1045 …) is closed at once: a refusal, not an idle close
        if not np.isnan(rows[2]):
            idle.append((close - rows[2]) / 1e9)
            reset += bool(rst)
        if rows[3]:
            failed += 1
    if not idle:
        return {"count": 0, "steady": False, "failed": failed}
    v = np.array(idle)
    median = float(np.median(v))
    steady = len(v) >= 2 and float(v.max() - v.min()) <= max(0.1, 2 * IDLE_SPREAD * median)
    return {"count": int(len(v)), "measured": int(len(v)), "idle_min_s": float(v.min()),
            "idle_median_s": median, "idle_max_s": float(v.max()), "failed": failed, "reset": reset,
            "steady": bool(steady)}


def _refused(from_rows: set, c: pd.DataFrame) -> int:
    """Connections refused with ERR 1040 (Too many connections): in place of the greeting, or as the login's answer
    (MariaDB checks max_connections after authentication); each connection once. `from_rows`: those the exchanges
    show refused."""
    keys = set(from_rows)
    if "close_error" in c.columns:
        hit = (c["close_error"] == REFUSED).fillna(False).to_numpy(dtype=bool)
        keys |= set(zip(c["capture"].astype(object)[hit], c["conn_index"].astype("int64")[hit]))
    return len(keys)


def churning(story: dict | None) -> bool:
    """Connecting is the workload's pattern: CHURN_MIN or more new connections, CHURN_PER_S or more a second, and
    either one for every other statement or more, or their set-up cost half the statements' time or more."""
    if not story:
        return False
    new = story["new"]
    return new >= CHURN_MIN and story["new_per_s"] >= CHURN_PER_S and (
        new >= CHURN_SHARE * max(story["statements"], 1) or story["setup_sum_s"] >= 0.5 * story["statements_sum_s"])


def bullets(story: dict | None) -> tuple[list[dict], list[str]]:
    """The verdict's connection bullets and findings: set-up time against the statements' time, churn, idle
    closes by the server with failed statements, refusals."""
    if not story:
        return [], []
    out, findings = [], []
    new, statements = story["new"], story["statements"]
    if churning(story):
        findings.append("connection_churn")
        ratio = story["setup_sum_s"] / story["statements_sum_s"] if story["statements_sum_s"] > 0 else None
        waited = story["setup_sum_s"] + story["statements_sum_s"]
        times = (f", {ratio:.1f} times the {seconds_rounded(story['statements_sum_s'])} the statements took "
                 f"({share(story['setup_sum_s'] / waited)} of the {seconds_rounded(waited)} they waited in all, set-up "
                 "included)" if ratio else "")
        out.append({"topic": "connections", "text": (
            f"Connection churn: {new} new {plural(new, 'connection', 'connections')} for {statements} statements "
            f"({story['new_per_s']:.0f}/s against {story['statements_per_s']:.0f} statements/s); setting them up "
            f"(SYN → login OK, median {seconds_rounded(story['setup_median_s'])}, max "
            f"{seconds_rounded(story['setup_max_s'])}) cost the clients {seconds_rounded(story['setup_sum_s'])} in "
            f"all{times}.")})
    idle = story.get("idle_closes") or {}
    if idle.get("count") and idle.get("measured"):
        steady = idle.get("steady")
        if steady:
            findings.append("idle_closes")
        what = (f"after {seconds_rounded(idle['idle_min_s'])}–{seconds_rounded(idle['idle_max_s'])} idle each"
                + (" (one timer: wait_timeout)" if steady else ""))
        fail = ("; the client had not closed them (no COM_QUIT), so its next statement on each fails (\"MySQL "
                "server has gone away\", 2006/2013)")
        if idle.get("failed"):
            fail += f": {idle['failed']} such {plural(idle['failed'], 'statement', 'statements')} went unanswered here"
        elif idle.get("reset") == idle["measured"]:
            fail += ": after a reset the client's driver cannot even send it, so the capture shows none"
        out.append({"topic": "connections", "text": f"The server closed {idle['count']} idle "
                                                    f"{plural(idle['count'], 'connection', 'connections')} {what}{fail}."})
    closes = story.get("closes") or {}
    if findings or closes.get("client_fin_rst") or closes.get("server"):
        out.append({"topic": "connections", "text": (
            f"Connections closed by: the client's COM_QUIT {closes['client_quit']}, the client without COM_QUIT "
            f"(FIN/RST) {closes['client_fin_rst']}, the server {closes['server']}; open at the end "
            f"{closes['open']}; at most {story.get('open_max')} open at once.")})
    if story.get("refused"):
        findings.append("refused")
        out.append({"topic": "connections", "text": (
            f"{story['refused']} connection {plural(story['refused'], 'attempt was', 'attempts were')} refused with "
            "ERR 1040 (Too many connections): max_connections was reached.")})
    return out, findings
