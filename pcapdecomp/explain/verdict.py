"""The verdict: what happened in the thread pool, told in one sentence with its measured numbers, details in
bullets below it; and the summary.json parts a reader starts from (victims grouped by stall, queueing by how it
is known).

The sentence names the most important story the capture holds, in this order: the pool at its thread limit
(thread_pool_max_threads), a thread group stalled by a long statement, statements that queued with no culprit
found, an idle pool. Hidden-slow statements (slow on the wire, absent from the slow log) and statements the slow log
understates (in it, but they queued first) are counted in the same sentence. Every claim of queueing rests on
`queue_min_s` (measured, or bounded by the slow log / SERVER_QUERY_WAS_SLOW); an estimate is named as one and never
the basis of a claim.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.formats import clock_ms, plural, seconds_rounded
from ..core.groups import equals
from ..core.times import ts_ns
from ..pair.proxy import PAIRED_KINDS
from ..pair.proxy import sentence as proxy_sentence
from .decompose import STALL_MIN_QUEUE_S, network_parts
from .digest import SERVER_OVERHEAD_S, overhead_part
from .threadpool import MAX_CULPRITS, PoolView, Refs, json_value, robust_span
from .wording import (at_least, connection, execution, queue_source, quoted, span, span_of, statements,
                      thread_groups, up_to)

VICTIMS_LISTED = 50  # hidden-slow / understated statements listed in summary.json (the rest counted)
STALLS_TOLD = 5  # stall bullets (the rest counted)


def tell(summary: dict, x: pd.DataFrame, view: PoolView) -> dict:
    """summary.json's verdict, story, hidden_slow, understated and queueing, from the other summary parts (inputs,
    exchanges, clock, groups, pool, thread_pool_size) and the exchanges table (with thread_group, stall and
    stall_role set)."""
    sane = _sane(x, view)
    hidden = x["hidden_slow"].to_numpy(dtype=bool, na_value=False) & sane
    understated = x["understated"].to_numpy(dtype=bool, na_value=False) & sane
    parts = {
        "queueing": _queueing(x, sane),
        "hidden_slow": _victims(x, hidden, view),
        "understated": {**_victims(x, understated, view), "threshold_s": STALL_MIN_QUEUE_S},
    }
    story = _story(summary, x, view, hidden, understated, sane)
    parts["story"] = story
    parts["verdict"] = "\n".join([story["sentence"], *(f"- {b['text']}" for b in story["bullets"])])
    return parts


TLS_MODES = ("decrypted", "timed", "unreadable")


def tls_part(qualities: dict) -> dict | None:
    """summary.json → tls: how the TLS connections were read, counted at the DB points (every client's
    connections), else the app points, else the proxy's; None without TLS. Its sentence opens the verdict."""
    points = qualities["dbs"] or qualities["app"] or qualities["proxy"] or []
    total = lambda key: sum(int(q.get(key) or 0) for q in points)  # noqa: E731
    tls = total("tls_connections")
    if not tls:
        return None
    counts = {mode: total(f"tls_{mode}_connections") for mode in TLS_MODES}
    words = {"decrypted": "decrypted with the key log",
             "timed": "timed without their text (no key log for them; how to get one: docs/tls.md): statement text "
                      "only where the slow log has it",
             "unreadable": "unreadable (no application data seen, a gap, or a key that does not decrypt)"}
    told = [(mode, n) for mode, n in counts.items() if n]
    if len(told) == 1:
        how = words[told[0][0]]
    else:
        how = "; ".join(f"{n} {words[mode]}" for mode, n in told)
    sentence = (f"{tls} of {total('mysql_connections')} {plural(total('mysql_connections'), 'connection', 'connections')} "
                f"{'is' if tls == 1 else 'are'} TLS: {how}.")
    return {"connections": tls, "of": total("mysql_connections"), **counts,
            "bytes": {mode: total(f"tls_{mode}_bytes") for mode in TLS_MODES}, "sentence": sentence}


def tell_proxy(summary: dict, x: pd.DataFrame) -> dict:
    """The verdict through a proxy (summary.json's story, verdict and proxy.sentence, from `tell`'s and the
    exchanges table with the proxy columns): the proxy's line is a bullet; when statements certainly waited inside
    the proxy (its capture shows P1 and P2: STALL_MIN_QUEUE_S or more before it sent them on) for longer in all than
    any certain queueing in the DB, the proxy is where the time went and leads the story."""
    story = dict(summary["story"])
    line = proxy_sentence(x, summary["proxy"])
    bullets = [*story["bullets"], {"topic": "proxy", "text": line}]
    findings = list(story["findings"])
    lead = _proxy_lead(summary, x)
    if lead:
        findings.insert(0, "proxy_queue")
        bullets.insert(0, {"topic": "db", "text": f"On the DB: {story['sentence']}"})
        story["sentence"] = lead
    story.update(bullets=bullets, findings=findings)
    return {"story": story, "proxy": {**summary["proxy"], "sentence": line},
            "verdict": "\n".join([story["sentence"], *(f"- {b['text']}" for b in bullets)])}


def _proxy_lead(summary: dict, x: pd.DataFrame) -> str | None:
    paired = x["proxy_match"].isin(PAIRED_KINDS).to_numpy(dtype=bool, na_value=False)
    wait = _values(x, "proxy_wait_s")
    waited = paired & (np.nan_to_num(wait) >= STALL_MIN_QUEUE_S)
    db_queue = float(np.nansum(_values(x, "queue_min_s")))
    if not waited.any() or float(wait[waited].sum()) <= db_queue:
        return None
    kind = str((summary["proxy"] or {}).get("kind") or "").upper()
    client = x["app_req_ts"].notna().to_numpy()
    fronts = x.loc[client, "client"].nunique()
    backs = x.loc[paired, "db_client"].nunique()
    total = float(np.nansum(_values(x, "total_s")[paired]))
    inside = float(np.nansum(_values(x, "proxy_s")[paired]))
    share = f", {100 * inside / total:.1f} % of the time clients waited on the paired statements" if total > 0 else ""
    pool = (f"; its {fronts} client {plural(fronts, 'connection', 'connections')} shared {backs} server "
            f"{plural(backs, 'connection', 'connections')}" if backs < fronts else "")
    return (f"The time went inside the {kind} proxy, not the DB: {int(waited.sum())} of the {int(paired.sum())} "
            f"statements paired through it waited {seconds_rounded(STALL_MIN_QUEUE_S)} or more there before it sent them on "
            f"({up_to(np.nanmax(wait[waited]))}, {seconds_rounded(wait[waited].sum())} in all{share}){pool}.")


def _sane(x: pd.DataFrame, view: PoolView) -> np.ndarray:
    """Rows whose times are not damage: DB-side times inside the capture's robust span (the pool view's outliers
    left out) and app-side times likewise."""
    sane = np.ones(len(x), dtype=bool)
    sane[view.outliers] = False
    a1, v1 = ts_ns(x["app_req_ts"])
    a4, v4 = ts_ns(x["app_resp_ts"])
    both = np.flatnonzero(v1 & v4)
    keep, _, _ = robust_span(a1[both], a4[both])
    sane[both[~keep]] = False
    return sane


# --- summary.json parts -------------------------------------------------------------------------------------------


def _queueing(x: pd.DataFrame, rows: np.ndarray) -> dict:
    """summary.json → queueing: queue_s of `rows` seen at both points, summed per queue_source."""
    both = rows & equals(x["seen"], "both")
    queue = _values(x, "queue_s")
    by = {source: _sum(queue[both & equals(x["queue_source"], source)])
          for source in ("measured", "estimated", "lower_bound", "likely")}
    return {"measured_s": by["measured"], "estimated_s": by["estimated"], "lower_bound_s": by["lower_bound"],
            "likely_s": by["likely"], "certain_s": _sum(_values(x, "queue_min_s")[both])}


def _victims(x: pd.DataFrame, mask: np.ndarray, view: PoolView) -> dict:
    """Statements of `mask`, the slowest VICTIMS_LISTED of them grouped by the stall they queued in."""
    idx = np.flatnonzero(mask)
    server = x["server_s"].iloc[idx].to_numpy(dtype="float64", na_value=np.nan)
    listed = idx[np.argsort(-np.nan_to_num(server, nan=-1.0), kind="stable")][:VICTIMS_LISTED]
    stall = x["stall"].iloc[listed].to_numpy(dtype="float64", na_value=np.nan)  # of the listed rows alone
    role = x["stall_role"].iloc[listed].astype(object).to_numpy()
    groups: dict = {}
    for i, stall_i, role_i in zip(listed, stall, role):
        sid = int(stall_i) if role_i == "victim" and not np.isnan(stall_i) else None
        groups.setdefault(sid, []).append(int(i))
    culprits_of = {sid: [int(c) for c in view.stall_members[sid][1][:MAX_CULPRITS]] for sid in groups
                   if sid is not None and sid < len(view.stall_members)}
    refs = _refs(x, [*listed, *(c for cs in culprits_of.values() for c in cs)])
    by_stall = []
    for sid in sorted(groups, key=lambda s: (s is None, s if s is not None else 0)):
        culprits = []
        group = None
        if sid in culprits_of:
            culprits = [refs[c] for c in culprits_of[sid]]
            group = json_value(x["thread_group"].iloc[groups[sid][0]])
        by_stall.append({"stall": sid, "thread_group": group, "culprits": culprits,
                         "victims": [refs[i] for i in groups[sid]]})
    return {"count": int(len(idx)), "listed": int(len(listed)), "more": int(len(idx) - len(listed)),
            "by_stall": by_stall}


def _refs(x: pd.DataFrame, positions) -> dict[int, dict]:
    """summary.json's references (threadpool.Refs) to the exchanges at `positions`, read from those rows alone: Refs
    over the whole table converts every row of the columns it reads."""
    rows = np.unique(np.asarray(list(positions), dtype=np.int64))
    refs = Refs(x.iloc[rows])
    return {int(p): refs.ref(i) for i, p in enumerate(rows)}


# The parts read a few columns over some rows each: boolean masks over the whole table and one column's values at a
# time, never a row filter of the table (it copies every column of it: the run's peak).


def _values(x: pd.DataFrame, col: str, only: np.ndarray | None = None) -> np.ndarray:
    """A float column's values, null as NaN (also outside `only`, a row mask, when given: then an array of its
    own; without it, possibly the column's own, to be read only)."""
    values = x[col].to_numpy(dtype="float64", na_value=np.nan, copy=only is not None)
    if only is not None:
        values[~only] = np.nan
    return values


def _filled(values: np.ndarray) -> np.ndarray:
    """NaN as 0 (as a column's fillna(0))."""
    return np.where(np.isnan(values), 0.0, values)


def _sum(values: np.ndarray) -> float:
    """The sum as a column's sum() takes it: NaN as 0, then one numpy sum of the values in their order."""
    return float(_filled(values).sum())


# --- the story ----------------------------------------------------------------------------------------------------


def _story(summary: dict, x: pd.DataFrame, view: PoolView, hidden: np.ndarray, understated: np.ndarray,
           sane: np.ndarray) -> dict:
    bullets: list[dict] = []
    findings: list[str] = []
    c = summary["exchanges"]
    lqt = summary["inputs"]["long_query_time"]
    server, total, qmin, queue = (_values(x, col, only=sane) for col in ("server_s", "total_s", "queue_min_s", "queue_s"))
    certain = np.nan_to_num(qmin) >= STALL_MIN_QUEUE_S
    likely = (equals(x["queue_source"], "likely") & sane
              & (np.nan_to_num(queue) >= STALL_MIN_QUEUE_S) & ~certain)
    cap = (summary.get("pool") or {}).get("cap")
    stalls = (summary.get("groups") or {}).get("stalls") or []
    slow_info = summary.get("slow_log") or {}
    disagrees = int(slow_info.get("unverified_entries") or 0)
    if disagrees:  # a log the wire cannot check may carry forged times: none of its claims names a culprit
        stalls = [{**s, "culprits": [], "culprits_total": 0} for s in stalls]
    size = summary.get("thread_pool_size") or {}
    n_h, n_u = int(hidden.sum()), int(understated.sum())

    if c["total"] == 0:
        findings.append("no_exchanges")
        sentence = "No MySQL exchange was found in the captures, so there is nothing to tell about the thread pool."
    elif np.isnan(server).all():
        findings.append("no_server_view")
        sentence = (f"Only the app side was captured: clients waited {up_to(np.nanmax(total))} on "
                    f"{c['total']} exchanges, but without the DB capture queueing and execution cannot be told apart."
                    if (~np.isnan(total)).any() else
                    f"{c['total']} {plural(c['total'], 'exchange was', 'exchanges were')} read, but no response "
                    "was seen: no time can be split.")
    elif cap:
        findings.append("max_threads")
        sentence = _cap_sentence(cap, x, view, hidden, understated)
        bullets += _cap_bullets(cap, x, view)
    elif certain.any():
        told = any(s["culprits_total"] for s in stalls)
        findings.append("group_stall" if told else "queueing_unexplained")
        sentence = _stall_sentence(x, stalls, view, certain, hidden, understated, queue, server, total, size,
                                   bool(slow_info.get("used")), disagrees)
    elif likely.any():
        findings.append("likely_group_stall" if any(s["culprits_total"] for s in stalls) else "likely_queueing")
        sentence = _likely_sentence(summary, x, stalls, view, likely, queue, lqt)
    else:
        sentence = _quiet_sentence(summary, x, server, lqt)
        findings.append("idle" if sentence.startswith("No statement waited") else "undecided")
    if n_u:
        findings.append("understated")
    if n_h:
        findings.append("hidden_slow")
    if disagrees:
        findings.append("slow_log_disagrees")
        bullets.append({"topic": "slow_log", "text": f"The slow log disagrees with the capture: {disagrees} "
                        f"{plural(disagrees, 'entry', 'entries')} may begin inside a statement the capture shows cut "
                        "(its text holds slow-log header lines), so the log may hold forged entries and no culprit "
                        "is named from it."})
    forged = int(slow_info.get("wire_sql_entries") or 0)
    if forged:
        bullets.append({"topic": "slow_log", "text": f"{forged} slow-log header {plural(forged, 'block lies', 'blocks lie')} "
                        "inside the text of a statement the capture shows: read as that statement's SQL, not as "
                        f"{plural(forged, 'an entry', 'entries')}."})

    told_by_cap = set(map(int, view.cap_members[1])) if cap else set()
    bullets += _stall_bullets([s for s, (victims, _) in zip(stalls, view.stall_members)
                               if not set(map(int, victims)) <= told_by_cap], x)
    if n_u:
        bullets.append(_understated_bullet(x, understated))
    if n_h:
        bullets.append(_hidden_bullet(x, hidden, lqt, bool(slow_info.get("used"))))
    bullets += _size_bullets(size)
    piped = _pipelined_bullet(x, sane)
    if piped:
        bullets.append(piped)
    relief = (summary.get("groups") or {}).get("stall_limit")
    if relief:
        bullets.append(_stall_limit_bullet(relief))
    split = _split_bullet(x, sane)
    if split:
        bullets.append(split)
    est = _estimate_bullet(x, sane)
    if est:
        bullets.append(est)
    if c["total"]:
        window = summary.get("window")  # analyze --since/--until: the counts are the window's
        within = (f" in the time window {window['since'] or 'from the start'} … {window['until'] or 'to the end'}"
                  if window is not None else "")
        bullets.append({"topic": "counts", "text": f"{c['total']} {plural(c['total'], 'exchange', 'exchanges')}"
                                                    f"{within} ({c['seen_both']} seen at both points, "
                                                    f"{c['seen_app']} only at the app, {c['seen_db']} only at the DB)."})
    clock = summary.get("clock")
    if clock and clock.get("offset_s") is not None:
        lo, hi = clock["offset_bounds_s"]
        unit, k = ("ms", 1e3) if max(abs(lo), abs(hi)) >= 1e-3 else ("µs", 1e6)
        bullets.append({"topic": "clock", "text": f"DB clock − app clock: {k * clock['offset_s']:+.3f} {unit} "
                                                  f"(bounds {k * lo:+.3f} … {k * hi:+.3f} {unit}), skew "
                                                  f"{clock['skew_ppm']:+.2f} ppm."})
    outliers = int((~sane).sum())
    if outliers:
        bullets.append({"topic": "outliers", "text": f"{outliers} {plural(outliers, 'exchange has', 'exchanges have')} times far outside the "
                                                     "capture's span (or end before they start): their times are damage, left out of the pool "
                                                     "and group views and of this verdict."})
    return {"sentence": sentence, "findings": findings, "bullets": bullets}


def _cap_sentence(cap: dict, x: pd.DataFrame, view: PoolView, hidden, understated) -> str:
    executing, waiting = view.cap_members
    shape = _one_shape(x, np.concatenate([executing, waiting]))
    waits = _values(x, "queue_s")[waiting]
    longest = float(np.nanmax(waits))
    each = np.nanmax(waits) - np.nanmin(waits) < 0.05 * np.nanmax(waits)
    if cap.get("wait_source") == "lower_bound":  # execution only bounded by long_query_time: the wait is a bound
        wait_text = at_least(longest) + (" each" if each else "")
    else:
        wait_text = f"{seconds_rounded(longest)} each" if each else up_to(longest)
    who = (f"{len(waiting)} of the {shape[1]} {quoted(shape[0])}" if shape else
           f"{len(waiting)} more {plural(len(waiting), 'statement', 'statements')}")
    text = (f"The thread pool was at its thread limit: exactly {cap['threads']} statements executed at once for "
            f"{seconds_rounded(cap['duration_s'])} while {who} waited {wait_text} for a thread "
            f"(thread_pool_max_threads = {cap['threads']}, inferred from the wire)")
    u, h = understated[waiting].sum(), hidden[waiting].sum()
    total = _values(x, "total_s")[waiting]
    exec_s = _values(x, "exec_s")[waiting]
    saw = f" (clients saw {seconds_rounded(float(np.nanmax(total)))})" if (~np.isnan(total)).any() else ""
    if u == len(waiting):
        text += f"; the slow log shows their {seconds_rounded(float(np.nanmax(exec_s)))} of execution, not the wait{saw}"
    elif h == len(waiting):
        text += f"; the slow log shows none of them{saw}"
    elif u or h:
        text += f"; the slow log understates {u} of them and misses {h}{saw}"
    return text + "."


def _cap_bullets(cap: dict, x: pd.DataFrame, view: PoolView) -> list[dict]:
    executing, waiting = view.cap_members
    return [{"topic": "cap", "text": f"At the limit from {clock_ms(cap['start'])} to {clock_ms(cap['end'])}: executing "
                                     + _who(x, executing) + "; waiting " + _who(x, waiting)
                                     + f" ({seconds_rounded(cap['total_wait_s'])} of waiting in all, "
                                       f"{queue_source(cap['wait_source'])})."}]


def _stall_sentence(x, stalls, view, certain, hidden, understated, queue, server, total, size, logged: bool,
                    disagrees: int = 0) -> str:
    """`certain`: the rows that certainly queued (at least one: the caller tells a stall only then)."""
    victims = hidden | understated
    told = [s for s in stalls if s["culprits_total"]]
    in_told = np.zeros(len(x), dtype=bool)
    for s, (members, _) in zip(stalls, view.stall_members):
        if s["culprits_total"]:
            in_told[members] = True
    h, u = hidden & in_told, understated & in_told
    n_h, n_u = int(h.sum()), int(u.sum())
    no_id = x["conn_id"].isna().to_numpy()
    rest = int((victims & ~in_told & ~no_id).sum())
    rest_no_id = int((victims & ~in_told & no_id).sum())
    if told and (n_h or n_u):
        where = thread_groups(sorted({s["thread_group"] for s in told}))
        behind = _culprit_words(told)
        if n_h:
            text = (f"{n_h} {plural(n_h, 'statement was', 'statements were')} slow only because "
                    f"{plural(n_h, 'it', 'they')} waited in {where} behind {behind}: "
                    f"{up_to(np.nanmax(server[h]))} inside the server, and "
                    + (f"the slow log does not show {plural(n_h, 'it', 'them')}" if logged else
                       f"the server did not flag {plural(n_h, 'it', 'them')} slow (no slow log given)"))
            if n_u:
                text += (f"; {n_u} more in the slow log waited {up_to(np.nanmax(queue[u]))}, which its "
                         "Query_time leaves out")
        else:
            saw = f" (clients saw {up_to(np.nanmax(total[u]))})" if (~np.isnan(total[u])).any() else ""
            text = (f"{statements(n_u)} in the slow log waited "
                    f"{up_to(np.nanmax(queue[u]))} in {where} behind {behind} before executing: the slow "
                    f"log's Query_time leaves the wait out{saw}")
        if rest:
            text += f"; {rest} more waited with no culprit found on their group"
        if rest_no_id:
            text += f"; {rest_no_id} more waited {_no_id_words(rest_no_id)}"
        if size.get("warning"):
            text += f" — if thread_pool_size {size['value']} is right; the capture suggests otherwise"
        return text + "."
    # queued, but no culprit named (or queued behind one, with no statement the slow log misses or understates)
    waited = victims if victims.any() else certain  # the victims; else the statements that certainly queued
    n_h, n_u = int(hidden.sum()), int(understated.sum())
    n = int(waited.sum())
    unknown = int((waited & no_id).sum())
    if disagrees:
        why = "the slow log disagrees with the capture, so no culprit is named"
    elif told:
        why = f"they waited behind {_culprit_words(told)}"
    elif unknown == n:
        why = (f"{plural(n, 'its connection id is', 'their connection ids are')} unknown"
               + _no_id_words(n).removeprefix("with no known connection id"))
    elif not size.get("value"):
        why = "thread_pool_size is unknown and the capture does not show it, so no culprit can be named"
    else:
        why = (f"no statement of their thread group (thread_pool_size {size['value']}, {size.get('source')}) "
               "executed long meanwhile (is thread_pool_size right, or was the whole pool busy?)")
        if unknown:
            why = f"{n - unknown} of them: {why}; the other {unknown} " + _no_id_words(unknown).removeprefix("with ")
    what = []
    if n_h:
        what.append(f"{n_h} slow on the wire but " + ("not in the slow log" if logged else "not flagged slow"))
    if n_u:
        what.append(f"{n_u} in the slow log, which understates them")
    qmin = np.nan_to_num(_values(x, "queue_min_s"))
    longest = np.where(waited, np.fmax(queue, qmin), np.nan)  # finite on every `certain` row
    return (f"{statements(n)} waited {up_to(np.nanmax(longest))} before "
            f"executing" + (f" ({', '.join(what)})" if what else "") + f"; {why}.")


def _likely_sentence(summary: dict, x: pd.DataFrame, stalls: list[dict], view: PoolView, likely: np.ndarray,
                     queue: np.ndarray, lqt) -> str:
    """Statements the slow log cannot show waiting, but whose server time is far above their statement's typical
    execution while a long statement executed on their thread group (on the server when the groups are unknown):
    told as likely, with what would prove it."""
    told = [(s, members) for s, (members, _) in zip(stalls, view.stall_members) if s["culprits_total"]]
    in_told = np.zeros(len(x), dtype=bool)
    for _, members in told:
        in_told[members] = True
    held = likely & in_told
    idx = np.flatnonzero(held if held.any() else likely)
    n = len(idx)
    shape = _one_shape(x, idx)
    texts = set(x["sql"].astype(object).iloc[idx])
    who = (statements(n) if not shape else
           f"{n} {plural(n, 'run', 'runs')} of "
           + quoted(shape[0] if len(texts) == 1 else str(x['fingerprint'].iloc[idx[0]])))
    text = f"{who} likely waited {span_of(queue[idx])} in the thread pool"
    if held.any():
        where = thread_groups(sorted({s["thread_group"] for s, _ in told}))
        text = f"{who} likely waited {span_of(queue[idx])} in {where} behind {_culprit_words([s for s, _ in told])}"
    else:
        long_ = _longest_meanwhile(x, idx)
        text += f" while {long_} executed on the server; " if long_ else " while a long statement executed on the server; "
        no_id = x["conn_id"].isna().to_numpy()[idx]
        text += (f"{plural(n, 'its connection id is', 'their connection ids are')} unknown (no greeting in the "
                 "capture), so their thread group cannot be told — give --processlist, or a slow log with Thread_id"
                 if no_id.all() else "thread_pool_size is unknown, so their thread group cannot be told")
    no_id = x["conn_id"].isna().to_numpy()
    rest = int((likely & ~held & ~no_id).sum()) if held.any() else 0
    if rest:
        text += f"; {rest} more likely waited with no culprit found on their group"
    rest_no_id = int((likely & ~held & no_id).sum()) if held.any() else 0
    if rest_no_id:
        text += f"; {rest_no_id} more likely waited {_no_id_words(rest_no_id)}"
    logged = bool(summary["slow_log"].get("used"))
    if lqt is not None and (logged or x["server_flag_slow"].notna().any()):
        text += (f"; long_query_time = {seconds_rounded(lqt)} cannot prove it (their execution is below it) — set "
                 "long_query_time = 0 for the capture window to prove it")
    elif lqt is not None:
        text += ("; without a slow log nothing proves it — capture the slow log with long_query_time = 0 to prove it")
    else:
        text += (f"; long_query_time is unknown{_lqt_bound_words(x)}, so nothing proves it — capture the slow log "
                 "with long_query_time = 0 to prove it")
    return text + "."


def _longest_meanwhile(x: pd.DataFrame, rows: np.ndarray) -> str | None:
    """`SQL` (connection N, executing …) of the statement that executed longest during the waits of `rows`: what
    ran on the server while they waited, when their thread group is not known."""
    d1, v1 = ts_ns(x["db_req_ts"])
    d4, v4 = ts_ns(x["db_resp_ts"])
    server = _values(x, "server_s")
    bound = server - np.nan_to_num(_values(x, "queue_min_s"))
    exec_s = _values(x, "exec_s")
    likely = equals(x["queue_source"], "likely")
    held = np.where(np.isnan(exec_s), np.where(x["exec_source"].astype(object).to_numpy() == "below_long_query_time",
                                               bound, np.nan), exec_s)
    long_ = np.flatnonzero(v1 & v4 & ~likely & (np.nan_to_num(held) >= STALL_MIN_QUEUE_S))
    if not len(long_):
        return None
    queue = np.nan_to_num(_values(x, "queue_s"))
    w0, w1 = d1[rows], d1[rows] + np.rint(queue[rows] * 1e9).astype(np.int64)
    xs = d4[long_] - np.rint(held[long_] * 1e9).astype(np.int64)
    overlap = np.clip(np.minimum(w1[:, None], d4[long_][None, :]) - np.maximum(w0[:, None], xs[None, :]), 0, None)
    total = overlap.sum(axis=0)
    if not total.max() > 0:
        return None
    best = int(long_[int(np.argmax(total))])
    ref = _refs(x, [best])[best]
    return f"{quoted(ref['sql'] or ref['command'])} ({connection(ref.get('conn_id'))}, {execution(ref)})"


def _no_id_words(n: int) -> str:
    """What is told of statements whose connection id is unknown: nothing about their thread group."""
    return (f"with no known connection id ({plural(n, 'its', 'their')} connection opened before the capture began: "
            "no greeting), so nothing is said of " + plural(n, "its", "their") + " thread group or culprit — give "
            "--processlist, or a slow log with Thread_id, to name the connections")


def _lqt_bound_words(x: pd.DataFrame) -> str:
    """What the slow log and the wire say of an unknown long_query_time: at most the shortest execution the slow log
    holds, and at most the shortest server time the server flagged slow (SERVER_QUERY_WAS_SLOW: execution ≥
    long_query_time); '' when neither says anything."""
    bounds = []
    logged = x["exec_s"].where(x["exec_source"] == "slow_log").dropna()
    if len(logged):
        bounds.append((float(logged.min()), "the shortest Query_time in the slow log"))
    flagged = x["server_s"].where(x["server_flag_slow"].astype("boolean").fillna(False)).dropna()
    if len(flagged):
        bounds.append((float(flagged.min()), "the shortest statement the server flagged slow"))
    if not bounds:
        return ""
    value, how = min(bounds)
    return f" (at most {seconds_rounded(value)}: {how})"


def _stall_limit_bullet(relief: dict) -> dict:
    after = span(relief["min_s"], relief["max_s"], alike_as_lo=True)
    n = relief["relieved"]
    return {"topic": "stall_limit", "text": f"{n} of {relief['of_stalls']} stalled "
                                            f"{plural(relief['of_stalls'], 'group was', 'groups were')} relieved "
                                            f"{after} after their long statement began, while it still ran (the pool "
                                            f"woke another worker): thread_pool_stall_limit ≈ "
                                            f"{seconds_rounded(relief['stall_limit_at_most_s'])} or a little less "
                                            "(a group is found stalled one to two stall limits after it stopped)."}


def _quiet_sentence(summary: dict, x: pd.DataFrame, server: np.ndarray, lqt) -> str:
    worst = float(np.nanmax(server))
    n = int((~np.isnan(server)).sum())
    slow_logged = int(x["in_slow_log"].fillna(False).sum())
    if worst < STALL_MIN_QUEUE_S:
        return (f"No statement waited in the thread pool: the slowest of the {n} exchanges seen at the DB took "
                f"{seconds_rounded(worst)} inside the server.")
    evidence = lqt is not None and (summary["slow_log"].get("used") or x["server_flag_slow"].notna().any())
    if evidence:
        slow = (f"; {slow_logged} {plural(slow_logged, 'was', 'were')} slow executing (in the slow log, "
                f"{up_to(float(np.nanmax(x['exec_s'].where(x['exec_source'] == 'slow_log'))))})"
                if slow_logged else "")
        return (f"No statement waited in the thread pool as far as the slow log and the wire show: none of the {n} "
                f"exchanges was slow on the wire without being in it or waited {seconds_rounded(STALL_MIN_QUEUE_S)} or more "
                f"before executing{slow}.")
    why = (f"long_query_time is unknown{_lqt_bound_words(x)} (give --long-query-time or capture.toml)" if lqt is None else
           "there is no slow log and the server does not flag slow statements on the wire (MySQL does not)")
    return (f"Queueing cannot be told from execution here: {why}; the slowest of the {n} exchanges took "
            f"{seconds_rounded(worst)} inside the server.")


def _stall_bullets(stalls: list[dict], x: pd.DataFrame) -> list[dict]:
    out = []
    for s in stalls[:STALLS_TOLD]:
        n_likely = (s.get("queue_sources") or {}).get("likely", 0)
        stalled = "likely stalled" if s["max_queue_certain_s"] < STALL_MIN_QUEUE_S else "stalled"
        text = (f"Thread group {s['thread_group']} {stalled} {seconds_rounded(s['duration_s'])} from "
                f"{clock_ms(s['start'])}: {statements(s['queued'])} "
                + ("likely " if n_likely == s["queued"] else "") + f"queued {up_to(s['max_queue_s'])}")
        if s["max_queue_certain_s"] < s["max_queue_s"] - 1e-6:
            text += (f" ({at_least(s['max_queue_certain_s'])} certain" if s["max_queue_certain_s"] > 0
                     else " (none of it proven by the slow log")
            text += f"; {n_likely} likely)" if 0 < n_likely < s["queued"] else ")"
        if s["culprits"]:
            first = s["culprits"][0]
            text += f" behind {quoted(first['sql'])} (connection {first['conn_id']}, {execution(first)})"
            others = s["culprits_total"] - 1
            if others:
                text += f" and {others} other long {plural(others, 'statement', 'statements')}"
        else:
            text += "; no statement of this group executed long meanwhile (no culprit found)"
        out.append({"topic": "stall", "text": text + "."})
    if len(stalls) > STALLS_TOLD:
        rest = len(stalls) - STALLS_TOLD
        out.append({"topic": "stall", "text": f"… and {rest} more {plural(rest, 'stall', 'stalls')} "
                                              "(summary.json → groups.stalls)."})
    return out


def _understated_bullet(x: pd.DataFrame, mask: np.ndarray) -> dict:
    q = _values(x, "queue_s")[mask]
    lines = _values(x, "slow_log_line")[mask]
    listed = ", ".join(str(int(v)) for v in sorted(lines[~np.isnan(lines)])[:10])
    n = int(mask.sum())
    return {"topic": "understated", "text": f"{statements(n)} in the slow log waited "
                                            f"{span_of(q)} before executing (measured: server time − Query_time), "
                                            "which the slow log does not show"
                                            + (f"; slow-log lines {listed}" + (" …" if n > 10 else "") if listed else "")
                                            + "."}


def _hidden_bullet(x: pd.DataFrame, mask: np.ndarray, lqt, logged: bool) -> dict:
    """`logged`: the slow log was joined. Without it the evidence is the server's SERVER_QUERY_WAS_SLOW flag alone,
    and the bullet says so rather than that the statements are not in a slow log nothing was compared with."""
    server = _values(x, "server_s")[mask]
    qmin = _values(x, "queue_min_s")[mask]
    n = int(mask.sum())
    evidence = ("yet not in the slow log and not flagged slow" if logged else
                "yet not flagged slow by the server; no slow log was joined to compare")
    return {"topic": "hidden_slow", "text": f"{n} hidden-slow {plural(n, 'statement', 'statements')} (slower than "
                                            f"long_query_time = {seconds_rounded(lqt)} inside the server, {evidence}): "
                                            f"server time {span_of(server)}; as "
                                            f"{plural(n, 'it', 'they')} executed in under {seconds_rounded(lqt)}, at least "
                                            f"{span_of(qmin)} of it was waiting."}


def _size_bullets(size: dict) -> list[dict]:
    if not size:
        return []
    inf = size.get("inferred") or {}
    value, given = size.get("value"), size.get("given")
    if given:
        if inf.get("value") == given:
            text = f"thread_pool_size = {given} (given); the capture agrees ({inf['confidence']}: {inf['note']})."
        elif inf.get("value"):
            text = f"thread_pool_size = {given} (given); the capture suggests {inf['value']} ({inf['note']})."
        else:
            text = f"thread_pool_size = {given} (given); the capture alone does not show it ({inf.get('note')})."
    elif value:
        text = (f"thread_pool_size = {value}, inferred from the capture ({inf['confidence']}): {inf['note']}; give "
                "--thread-pool-size to override.")
    else:
        text = (f"thread_pool_size unknown: not given, and the capture does not show it ({inf.get('note')}); "
                "thread groups are not computed.")
    out = [{"topic": "thread_pool_size", "text": text}]
    if size.get("warning"):
        out.append({"topic": "thread_pool_size", "text": f"Warning: {size['warning']}."})
    return out


def _split_bullet(x: pd.DataFrame, rows: np.ndarray) -> dict | None:
    """Where the clients' time went, over `rows`."""
    total = _values(x, "total_s")
    # only exchanges whose client time is measured: one with a bounded end point (capture loss, pair/repair.py) has a
    # server split but no total, and would push the shares past 100 %
    both = rows & equals(x["seen"], "both") & ~np.isnan(total)
    tot = _sum(total[both])
    del total
    if not both.any() or tot <= 0:
        return None
    pct = lambda v: f"{100 * v / tot:.1f} %"  # noqa: E731
    net = ", ".join(f"{label} {pct(v)}" for label, v in network_parts(x, both))
    queue_s, qmin = _values(x, "queue_s"), _values(x, "queue_min_s")
    q_all = _sum(queue_s[both])
    q_meas = _sum(queue_s[both & equals(x["queue_source"], "measured")])
    q_cert = _sum(qmin[both])
    is_likely = both & equals(x["queue_source"], "likely")
    q_likely = _sum(queue_s[is_likely] - _filled(qmin[is_likely]))  # beyond the certain part
    q_est = _sum(queue_s[both & equals(x["queue_source"], "estimated")])
    del qmin, is_likely
    exec_s = _values(x, "exec_s")
    e_all = _sum(exec_s[both])
    e_meas = _sum(exec_s[both & equals(x["exec_source"], "slow_log")])
    q_over = float(overhead_part(x)[both].sum())  # measured, but the server's own overhead: not queueing
    unknown = both & np.isnan(queue_s)
    piped_rows = _filled(_values(x, "pipelined_s"))
    server = _values(x, "server_s")
    unsplit = _sum(server[unknown]) - _sum(piped_rows[unknown])
    bounded = both & np.isnan(exec_s) & ~np.isnan(queue_s)
    unsplit_bounded = _sum(server[bounded] - piped_rows[bounded] - queue_s[bounded])
    piped = _sum(piped_rows[both])
    del queue_s, exec_s, server, piped_rows, unknown, bounded
    q_all, q_meas, q_cert = q_all - q_over, q_meas - q_over, q_cert - q_over
    if q_est < 0.0005 * tot:  # estimates too small to show beside the rest
        q_all -= q_est
        q_est = 0.0
    likely_words = f", {pct(q_likely)} likely" if q_likely > 0 else ""
    if q_cert <= 1e-12:
        queue = (f"queueing none certain ({pct(q_likely)} likely, not proven)" if q_likely > 0 and q_est <= 0 else
                 f"queueing none certain ({pct(q_all)} by estimates, which claim nothing)" if q_all > 0 and q_likely <= 0
                 else f"queueing none certain ({pct(q_likely)} likely, {pct(q_est)} by estimates, which claim nothing)"
                 if q_all > 0 else "queueing none")
    elif abs(q_all - q_meas) < 1e-9 and q_meas > 0:
        queue = f"queueing {pct(q_all)} (measured)"
    elif abs(q_all - q_cert) < 1e-9:
        queue = f"queueing {pct(q_all)} (certain: measured or bounded by the slow log)"
    else:
        queue = (f"queueing {pct(q_all)} ({pct(q_cert)} certain{likely_words}"
                 + (", the rest estimated)" if q_est > 0 else ")"))
    execution = f"execution {pct(e_all)}" + (f" ({pct(e_meas)} measured in the slow log)" if e_meas > 0 else "")
    rest = f", not split (execution unknown) {pct(unsplit)}" if unsplit >= 0.0005 * tot else ""
    if q_over >= 0.0005 * tot:
        rest += (f", server overhead {pct(q_over)} (server time − Query_time under {seconds_rounded(SERVER_OVERHEAD_S)} "
                 "a statement: parsing and the network stack, not queueing)")
    if unsplit_bounded >= 0.0005 * tot:
        rest += (f", execution or waiting, not told apart (execution below long_query_time, only bounded) "
                 f"{pct(unsplit_bounded)}")
    behind = (f", pipelined {pct(piped)} (requests sent before the answer to the one before them on their "
              "connection: waiting there, not queueing)" if piped >= 0.0005 * tot else "")
    return {"topic": "split", "text": f"Of the {seconds_rounded(tot)} the clients waited: {net}{behind}, {queue}, "
                                      f"{execution}{rest}."}


def _pipelined_bullet(x: pd.DataFrame, rows: np.ndarray) -> dict | None:
    wait = _values(x, "pipelined_s")[rows]
    waited = np.nan_to_num(wait) >= STALL_MIN_QUEUE_S
    n = int(waited.sum())
    if not n:
        return None
    return {"topic": "pipelined", "text": f"{n} {plural(n, 'request was', 'requests were')} pipelined (sent before the "
                                          "answer to the one before on the same connection) and waited there "
                                          f"{up_to(float(np.nanmax(wait[waited])))}: the connection's own "
                                          "wait, not the thread pool's: not queueing, not a stall."}


def _estimate_bullet(x: pd.DataFrame, rows: np.ndarray) -> dict | None:
    est = ((x["exec_source"] == "fingerprint_median") & (x["queue_source"] != "likely")).to_numpy(dtype=bool) & rows
    n = int(est.sum())
    if not n:
        return None
    q = _sum(_values(x, "queue_s")[est])
    return {"topic": "estimates", "text": f"Execution of {statements(n)} is estimated "
                                          "from other runs of the same command and statement (exec_source "
                                          f"fingerprint_median); the queueing it implies, {seconds_rounded(q)} in all, is "
                                          "labelled as an estimate and claims nothing."}


# --- words --------------------------------------------------------------------------------------------------------


def _culprit_words(told: list[dict]) -> str:
    """`SQL` (connection N, executing T) for the main culprit; its other runs and other culprits counted."""
    first = [s["culprits"][0] for s in told if s["culprits"]]
    main = max(first, key=lambda c: c.get("overlap_s") or 0)
    runs = [c for c in first if c["sql"] == main["sql"] and c["conn_id"] == main["conn_id"]]
    if len(runs) > 1:
        lo = min(c["exec_s"] or 0 for c in runs)
        hi = max(c["exec_s"] or 0 for c in runs)
        how = f"{len(runs)} runs of {span(lo, hi, '–')}"
        how += "" if all(c["exec_source"] == "slow_log" for c in runs) else " (not all measured)"
    else:
        how = execution(main)
    # the other long runs, each counted once however many stalls it held (a run is its exchange)
    runs_all = {(c["capture"], c["conn_index"], c["seq"]): c for s in told for c in s["culprits"]}
    others = [c for c in runs_all.values() if (c["sql"], c["conn_id"]) != (main["sql"], main["conn_id"])]
    text = f"{quoted(main['sql'])} (connection {main['conn_id']}, {how})"
    if others:
        text += f" and {len(others)} other long {plural(len(others), 'run', 'runs')}"
    return text


def _who(x: pd.DataFrame, rows: np.ndarray) -> str:
    """`SQL` ×n (connections a, b, c), per distinct statement text."""
    part = x.iloc[rows]
    texts = []
    for sql, g in part.groupby(part["sql"].astype(object).fillna(part["command"].astype(object)), sort=False):
        conns = ", ".join(str(int(c)) for c in sorted(g["conn_id"].dropna().astype(int))[:12])
        more = " …" if g["conn_id"].notna().sum() > 12 else ""
        texts.append(f"{quoted(sql)} ×{len(g)} (connection{'s' if len(g) > 1 else ''} {conns}{more})")
    return "; ".join(texts[:5]) + (f" and {len(texts) - 5} other statements" if len(texts) > 5 else "")


def _one_shape(x: pd.DataFrame, rows: np.ndarray) -> tuple[str, int] | None:
    """(statement text, how many exchanges of that fingerprint there are) when all `rows` share one fingerprint."""
    fps = set(x["fingerprint"].astype(object).iloc[rows])
    if len(fps) != 1:
        return None
    fp = fps.pop()
    sql = x["sql"].astype(object).iloc[rows[0]]
    return (sql if isinstance(sql, str) else str(fp)), int((x["fingerprint"].astype(object) == fp).sum())
