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

from ..core.exact import masked_sums
from ..core.formats import clock_ms, plural, seconds_rounded
from ..core.groups import equals
from ..core.times import ts_ns
from ..pair.proxy import PAIRED_KINDS
from ..pair.proxy import sentence as proxy_sentence
from .decompose import STALL_MIN_QUEUE_S, network_parts_of, network_terms
from .digest import SERVER_OVERHEAD_S, overhead_part
from .threadpool import MAX_CULPRITS, PoolView, Refs, json_value, robust_span
from .wording import (at_least, connection, execution, queue_source, quoted, span, span_known, statements,
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
    stalls = told_stalls(summary)
    rows = TableRows(x, view, sane, hidden, understated)
    facts = story_facts(x, sane, hidden, understated, told_mask(len(x), stalls, rows.stall_members()))
    story = _story(summary, facts, masked_sums(story_terms(x, sane)), rows)
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
    by_stall = grouped_by_stall(
        [int(i) for i in listed], x["stall"].iloc[listed].to_numpy(dtype="float64", na_value=np.nan),  # of the
        x["stall_role"].iloc[listed].astype(object).to_numpy(), x["thread_group"].iloc[listed],  # listed rows alone
        lambda sid: [int(c) for c in view.stall_members[sid][1][:MAX_CULPRITS]] if sid < len(view.stall_members)
        else None,
        lambda places: _refs(x, places))
    return {"count": int(len(idx)), "listed": int(len(listed)), "more": int(len(idx) - len(listed)),
            "by_stall": by_stall}


def grouped_by_stall(listed: list, stall: np.ndarray, role: np.ndarray, thread_group: pd.Series, culprits_of,
                     refs_of) -> list[dict]:
    """summary.json's victim lists (hidden_slow, understated → by_stall): the listed rows grouped by the stall they
    queued in (their role 'victim'; else None, listed last), stalls by id, each with its thread group and culprits.
    `listed`: the rows' places in their order (row positions of the table; (run, row) of the partitions' runs,
    explain.summaryruns), `stall`, `role`, `thread_group` their values in that order; `culprits_of(sid)`: the places
    of the stall's first MAX_CULPRITS culprits, None for a stall the view does not know; `refs_of(places)`: place →
    its reference (threadpool.Refs)."""
    groups: dict = {}
    for n, (place, stall_i, role_i) in enumerate(zip(listed, stall, role)):
        sid = int(stall_i) if role_i == "victim" and not np.isnan(stall_i) else None
        groups.setdefault(sid, []).append((place, n))
    culprits_of_stall = {sid: culprits for sid in groups if sid is not None
                         for culprits in [culprits_of(sid)] if culprits is not None}
    refs = refs_of([*listed, *(c for cs in culprits_of_stall.values() for c in cs)])
    by_stall = []
    for sid in sorted(groups, key=lambda s: (s is None, s if s is not None else 0)):
        culprits = []
        group = None
        if sid in culprits_of_stall:
            culprits = [refs[c] for c in culprits_of_stall[sid]]
            group = json_value(thread_group.iloc[groups[sid][0][1]])
        by_stall.append({"stall": sid, "thread_group": group, "culprits": culprits,
                         "victims": [refs[place] for place, _ in groups[sid]]})
    return by_stall


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


# --- what the story reads of the rows ------------------------------------------------------------------------------
#
# The story is told from facts about the rows, each made by one rule over any chunk of them (the whole table, or a
# partition of it: explain/summaryruns.py) and reduced by its kind; the sums from terms summed in row order
# (core.exact.masked_sums here, a PairwiseSum each over the partitions); the few rows it names from `rows`
# (TableRows here).

FACT_KINDS = {"count": "count", "max": "max", "min": "min", "any": "any", "few": "few", "first": "first",
              "least": "least"}
FEW = 2  # distinct values a "few" fact keeps: enough to tell one from several
LINES_LISTED = 10  # slow-log lines of the understated statements named in their bullet


def _kind(name: str) -> str:
    return name.rsplit(":", 1)[-1]


def _max(values: np.ndarray) -> float:
    """np.nanmax of the values, NaN when none is known."""
    values = values[~np.isnan(values)]
    return float(np.max(values)) if len(values) else np.nan


def _min(values: np.ndarray) -> float:
    """np.nanmin of the values, NaN when none is known."""
    values = values[~np.isnan(values)]
    return float(np.min(values)) if len(values) else np.nan


def story_facts(x: pd.DataFrame, sane: np.ndarray, hidden: np.ndarray, understated: np.ndarray, told: np.ndarray,
                keys: np.ndarray | None = None) -> dict:
    """What the story reads of the rows of `x` (the whole table or a chunk of it), as facts named "what:kind",
    each reduced over chunks by combine_facts. `told`: the rows of stalls with a culprit; `keys`: the chunk's row
    keys (None: the positions order the rows), for "first" facts (the value of the first row in row order)."""
    server, total, qmin, queue = (_values(x, col, only=sane) for col in ("server_s", "total_s", "queue_min_s", "queue_s"))
    qmin0 = np.nan_to_num(qmin)
    certain = qmin0 >= STALL_MIN_QUEUE_S
    likely = equals(x["queue_source"], "likely") & sane & (np.nan_to_num(queue) >= STALL_MIN_QUEUE_S) & ~certain
    no_id = x["conn_id"].isna().to_numpy()
    victims = hidden | understated
    h, u = hidden & told, understated & told
    longest = np.fmax(queue, qmin0)
    f = {"outliers:count": int((~sane).sum()),
         "server:count": int((~np.isnan(server)).sum()), "server:max": _max(server),
         "total:count": int((~np.isnan(total)).sum()), "total:max": _max(total),
         "certain:count": int(certain.sum()), "likely:count": int(likely.sum()),
         "hidden:count": int(hidden.sum()), "understated:count": int(understated.sum()),
         "told_hidden:count": int(h.sum()), "told_understated:count": int(u.sum()),
         "told_hidden_server:max": _max(server[h]), "told_understated_queue:max": _max(queue[u]),
         "told_understated_total:count": int((~np.isnan(total[u])).sum()),
         "told_understated_total:max": _max(total[u]),
         "rest:count": int((victims & ~told & ~no_id).sum()), "rest_no_id:count": int((victims & ~told & no_id).sum()),
         "victims:count": int(victims.sum()), "victims_no_id:count": int((victims & no_id).sum()),
         "victims_longest:max": _max(longest[victims]),
         "certain_no_id:count": int((certain & no_id).sum()), "certain_longest:max": _max(longest[certain])}
    held = likely & told
    f["held:count"] = int(held.sum())
    f["likely_rest:count"] = int((likely & ~held & ~no_id).sum())
    f["likely_rest_no_id:count"] = int((likely & ~held & no_id).sum())
    fingerprint, sql = x["fingerprint"].astype(object), x["sql"].astype(object)
    for name, mask in (("held", held), ("likely", likely)):
        rows = np.flatnonzero(mask)
        f[f"{name}_queue:min"], f[f"{name}_queue:max"] = _min(queue[rows]), _max(queue[rows])
        f[f"{name}_no_id:count"] = int(no_id[rows].sum())
        f[f"{name}_fingerprints:few"] = _few(fingerprint.iloc[rows])
        f[f"{name}_texts:few"] = _few(sql.iloc[rows])
        f[f"{name}_first:first"] = (None if not len(rows) else
                                    (_order(keys, rows[0]), (sql.iloc[rows[0]], fingerprint.iloc[rows[0]])))
    in_log = x["in_slow_log"].fillna(False).to_numpy(dtype=bool)
    logged = (x["exec_source"] == "slow_log").fillna(False).to_numpy(dtype=bool)
    exec_s = _values(x, "exec_s")
    flagged = x["server_flag_slow"].astype("boolean").fillna(False).to_numpy(dtype=bool)
    f.update({"in_slow_log:count": int(in_log.sum()), "flag_known:any": bool(x["server_flag_slow"].notna().any()),
              "slow_log_exec:max": _max(exec_s[logged]),
              "slow_log_exec:min": _min(exec_s[logged]),
              "flagged_server:min": _min(_values(x, "server_s")[flagged])})
    all_queue = _values(x, "queue_s")
    lines = _values(x, "slow_log_line")[understated]
    f.update({"understated_queue:min": _min(all_queue[understated]),
              "understated_queue:max": _max(all_queue[understated]),
              "understated_lines:least": sorted(lines[~np.isnan(lines)].tolist())[:LINES_LISTED]})
    all_server, all_qmin = _values(x, "server_s"), _values(x, "queue_min_s")
    for col, values in (("server", all_server), ("qmin", all_qmin)):
        f[f"hidden_{col}:min"] = _min(values[hidden])
        f[f"hidden_{col}:max"] = _max(values[hidden])
    wait = _values(x, "pipelined_s")[sane]
    waited = np.nan_to_num(wait) >= STALL_MIN_QUEUE_S
    f["pipelined:count"], f["pipelined:max"] = int(waited.sum()), _max(wait[waited])
    return f


def _few(values: pd.Series) -> set:
    """Up to FEW distinct values (the set today's code makes of them, cut)."""
    out: set = set()
    for v in pd.unique(values.to_numpy(dtype=object)):
        out.add(v)
        if len(out) >= FEW:
            break
    return out


def _order(keys: np.ndarray | None, at: int):
    return at if keys is None else tuple(int(k) for k in keys[at])


def combine_facts(parts: list[dict]) -> dict:
    """The facts of the chunks' union, each by its kind: counts add, maxima and minima reduce (NaN: none), "any"
    ors, "few" unites (cut to FEW), "first" keeps the least order, "least" keeps the LINES_LISTED smallest."""
    out = dict(parts[0])
    for part in parts[1:]:
        for name, value in part.items():
            kind, have = _kind(name), out[name]
            if kind == "count":
                out[name] = have + value
            elif kind in ("max", "min"):
                pick = np.fmax if kind == "max" else np.fmin
                out[name] = float(pick(have, value))
            elif kind == "any":
                out[name] = have or value
            elif kind == "few":
                out[name] = set(list(have | value)[:FEW]) if len(have | value) > FEW else have | value
            elif kind == "first":
                out[name] = have if value is None or (have is not None and have[0] <= value[0]) else value
            else:
                out[name] = sorted(have + value)[:LINES_LISTED]
    return out


def story_terms(x: pd.DataFrame, rows: np.ndarray):
    """The sums the story reads, as (name, rows, values) terms (core.exact.masked_sums: NaN as 0, in row order):
    the split of the clients' time over `rows` (the sane ones) and the estimates' queueing."""
    total = _values(x, "total_s")
    # only exchanges whose client time is measured: one with a bounded end point (capture loss, pair/repair.py) has a
    # server split but no total, and would push the shares past 100 %
    both = rows & equals(x["seen"], "both") & ~np.isnan(total)
    yield "total", both, total
    del total
    yield from network_terms(x, both)
    queue_s, qmin = _values(x, "queue_s"), _values(x, "queue_min_s")
    yield "queue", both, queue_s
    yield "queue_measured", both & equals(x["queue_source"], "measured"), queue_s
    yield "queue_certain", both, qmin
    yield "queue_likely", both & equals(x["queue_source"], "likely"), queue_s - _filled(qmin)  # beyond the certain part
    yield "queue_estimated", both & equals(x["queue_source"], "estimated"), queue_s
    del qmin
    exec_s = _values(x, "exec_s")
    yield "exec", both, exec_s
    yield "exec_measured", both & equals(x["exec_source"], "slow_log"), exec_s
    yield "overhead", both, overhead_part(x)  # measured, but the server's own overhead: not queueing
    unknown = both & np.isnan(queue_s)
    piped_rows = _filled(_values(x, "pipelined_s"))
    server = _values(x, "server_s")
    yield "unsplit_server", unknown, server
    yield "unsplit_pipelined", unknown, piped_rows
    bounded = both & np.isnan(exec_s) & ~np.isnan(queue_s)
    yield "unsplit_bounded", bounded, server - piped_rows - queue_s
    yield "pipelined", both, piped_rows
    del exec_s, server, piped_rows, unknown, bounded
    est = ((x["exec_source"] == "fingerprint_median") & (x["queue_source"] != "likely")).to_numpy(dtype=bool) & rows
    yield "estimated_exec_queue", est, queue_s


class TableRows:
    """The rows the story names, read from the whole table: the cap's members, a fingerprint's count, the statement
    that executed longest while others likely waited."""

    def __init__(self, x: pd.DataFrame, view: PoolView, sane: np.ndarray, hidden: np.ndarray,
                 understated: np.ndarray):
        self.x, self.view, self.sane, self.hidden, self.understated = x, view, sane, hidden, understated

    def stall_members(self) -> list:
        """Per stall of the view, its members (any hashable ids: positions here)."""
        return [np.asarray(members, dtype=np.int64) for members, _ in self.view.stall_members]

    def cap_members(self) -> tuple[pd.DataFrame, int, set]:
        """(the cap's executing then waiting rows, in the view's order, with their hidden and understated flags;
        how many execute; the waiting rows' ids)."""
        executing, waiting = self.view.cap_members
        rows = np.concatenate([executing, waiting]).astype(np.int64)
        table = self.x.iloc[rows].assign(hidden=self.hidden[rows], understated=self.understated[rows])
        return table, len(executing), set(map(int, waiting))

    def fingerprint_count(self, fingerprint) -> int:
        return int((self.x["fingerprint"].astype(object) == fingerprint).sum())

    def longest_meanwhile(self, mask_of) -> dict | None:
        """The reference of the statement that executed longest during the waits of the rows `mask_of(x, sane)`
        selects."""
        pieces = meanwhile_pieces(self.x, mask_of(self.x, self.sane))
        best = longest_of([pieces])
        return None if best is None else _refs(self.x, [best])[best]


def likely_rows(x: pd.DataFrame, sane: np.ndarray) -> np.ndarray:
    """The rows that likely waited (story_facts' rule, on any chunk): likely, sane, a wait of STALL_MIN_QUEUE_S or
    more, not certain."""
    qmin, queue = _values(x, "queue_min_s", only=sane), _values(x, "queue_s", only=sane)
    certain = np.nan_to_num(qmin) >= STALL_MIN_QUEUE_S
    return equals(x["queue_source"], "likely") & sane & (np.nan_to_num(queue) >= STALL_MIN_QUEUE_S) & ~certain


def meanwhile_pieces(x: pd.DataFrame, rows: np.ndarray, keys: np.ndarray | None = None) -> tuple:
    """What _longest_meanwhile reads of a chunk: the waits (D1, D1 + queue) of `rows`, and the long executions
    (their order in row order, start, end), each by one rule on any chunk."""
    d1, v1 = ts_ns(x["db_req_ts"])
    d4, v4 = ts_ns(x["db_resp_ts"])
    server = _values(x, "server_s")
    bound = server - np.nan_to_num(_values(x, "queue_min_s"))
    exec_s = _values(x, "exec_s")
    likely = equals(x["queue_source"], "likely")
    held = np.where(np.isnan(exec_s), np.where(x["exec_source"].astype(object).to_numpy() == "below_long_query_time",
                                               bound, np.nan), exec_s)
    long_ = np.flatnonzero(v1 & v4 & ~likely & (np.nan_to_num(held) >= STALL_MIN_QUEUE_S))
    queue = np.nan_to_num(_values(x, "queue_s"))
    idx = np.flatnonzero(rows)
    w0, w1 = d1[idx], d1[idx] + np.rint(queue[idx] * 1e9).astype(np.int64)
    xs = d4[long_] - np.rint(held[long_] * 1e9).astype(np.int64)
    order = [_order(keys, i) for i in long_]
    return w0, w1, order, xs, d4[long_]


def longest_of(pieces: list[tuple]):
    """The order (position or row key) of the long execution that overlapped the waits most in all, the first in
    row order among equals; None when none overlapped."""
    w0 = np.concatenate([p[0] for p in pieces])
    w1 = np.concatenate([p[1] for p in pieces])
    longs = sorted((o, s, e) for p in pieces for o, s, e in zip(p[2], p[3].tolist(), p[4].tolist()))
    if not longs:
        return None
    xs = np.array([s for _, s, _ in longs], dtype=np.int64)
    ends = np.array([e for _, _, e in longs], dtype=np.int64)
    overlap = np.clip(np.minimum(w1[:, None], ends[None, :]) - np.maximum(w0[:, None], xs[None, :]), 0, None)
    total = overlap.sum(axis=0)
    if not total.max() > 0:
        return None
    return longs[int(np.argmax(total))][0]


def told_mask(n: int, stalls: list[dict], members: list) -> np.ndarray:
    """The rows (positions) of the stalls that name a culprit."""
    told = np.zeros(n, dtype=bool)
    for s, m in zip(stalls, members):
        if s["culprits_total"]:
            told[m] = True
    return told


def told_stalls(summary: dict) -> list[dict]:
    """groups.stalls as the story tells them: a slow log the wire cannot check names no culprit."""
    stalls = (summary.get("groups") or {}).get("stalls") or []
    if int((summary.get("slow_log") or {}).get("unverified_entries") or 0):
        # a log the wire cannot check may carry forged times: none of its claims names a culprit
        stalls = [{**s, "culprits": [], "culprits_total": 0} for s in stalls]
    return stalls


# --- the story ----------------------------------------------------------------------------------------------------


def _story(summary: dict, f: dict, sums: dict[str, tuple[int, float]], rows) -> dict:
    """The sentence, findings and bullets from the facts (story_facts, combined), the sums (story_terms') and the
    rows it names (`rows`: TableRows, or the partitions' own)."""
    bullets: list[dict] = []
    findings: list[str] = []
    c = summary["exchanges"]
    lqt = summary["inputs"]["long_query_time"]
    cap = (summary.get("pool") or {}).get("cap")
    stalls = told_stalls(summary)
    slow_info = summary.get("slow_log") or {}
    disagrees = int(slow_info.get("unverified_entries") or 0)
    size = summary.get("thread_pool_size") or {}
    n_h, n_u = f["hidden:count"], f["understated:count"]

    if c["total"] == 0:
        findings.append("no_exchanges")
        sentence = "No MySQL exchange was found in the captures, so there is nothing to tell about the thread pool."
    elif not f["server:count"]:
        findings.append("no_server_view")
        sentence = (f"Only the app side was captured: clients waited {up_to(f['total:max'])} on "
                    f"{c['total']} exchanges, but without the DB capture queueing and execution cannot be told apart."
                    if f["total:count"] else
                    f"{c['total']} {plural(c['total'], 'exchange was', 'exchanges were')} read, but no response "
                    "was seen: no time can be split.")
    elif cap:
        findings.append("max_threads")
        members = rows.cap_members()
        sentence = _cap_sentence(cap, members, rows.fingerprint_count)
        bullets += _cap_bullets(cap, members)
    elif f["certain:count"]:
        told = any(s["culprits_total"] for s in stalls)
        findings.append("group_stall" if told else "queueing_unexplained")
        sentence = _stall_sentence(f, stalls, size, bool(slow_info.get("used")), disagrees)
    elif f["likely:count"]:
        findings.append("likely_group_stall" if any(s["culprits_total"] for s in stalls) else "likely_queueing")
        sentence = _likely_sentence(summary, f, stalls, rows, lqt)
    else:
        sentence = _quiet_sentence(summary, f, lqt)
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

    told_by_cap = rows.cap_members()[2] if cap else set()
    bullets += _stall_bullets([s for s, victims in zip(stalls, rows.stall_members())
                               if not set(_ids(victims)) <= told_by_cap])
    if n_u:
        bullets.append(_understated_bullet(f))
    if n_h:
        bullets.append(_hidden_bullet(f, lqt, bool(slow_info.get("used"))))
    bullets += _size_bullets(size)
    piped = _pipelined_bullet(f)
    if piped:
        bullets.append(piped)
    relief = (summary.get("groups") or {}).get("stall_limit")
    if relief:
        bullets.append(_stall_limit_bullet(relief))
    split = _split_bullet(sums)
    if split:
        bullets.append(split)
    est = _estimate_bullet(sums)
    if est:
        bullets.append(est)
    if c["total"]:
        window = summary.get("window")  # analyze --since/--until: the counts are the window's
        within = (f" in the time window {window['since'] or 'from the start'} … {window['until'] or 'to the end'}"
                  if window is not None else "")
        counted = summary.get("counted")  # several DB points: these counts are the first one's (summary._tell)
        whose = f" at server {counted['server']} or at no DB point" if counted else ""
        of_all = (f"; {counted['total']} in all, at {counted['servers']} DB points" if counted else "")
        bullets.append({"topic": "counts", "text": f"{c['total']} {plural(c['total'], 'exchange', 'exchanges')}"
                                                    f"{whose}{within} ({c['seen_both']} seen at both points, "
                                                    f"{c['seen_app']} only at the app, {c['seen_db']} only at the DB)"
                                                    f"{of_all}."})
    clock = summary.get("clock")
    if clock and clock.get("offset_s") is not None:
        lo, hi = clock["offset_bounds_s"]
        unit, k = ("ms", 1e3) if max(abs(lo), abs(hi)) >= 1e-3 else ("µs", 1e6)
        bullets.append({"topic": "clock", "text": f"DB clock − app clock: {k * clock['offset_s']:+.3f} {unit} "
                                                  f"(bounds {k * lo:+.3f} … {k * hi:+.3f} {unit}), skew "
                                                  f"{clock['skew_ppm']:+.2f} ppm."})
    outliers = f["outliers:count"]
    if outliers:
        bullets.append({"topic": "outliers", "text": f"{outliers} {plural(outliers, 'exchange has', 'exchanges have')} times far outside the "
                                                     "capture's span (or end before they start): their times are damage, left out of the pool "
                                                     "and group views and of this verdict."})
    return {"sentence": sentence, "findings": findings, "bullets": bullets}


def _ids(members) -> list:
    """A stall's or the cap's members as hashable ids: positions (ints), or row keys (tuples)."""
    members = np.asarray(members)
    return [tuple(int(v) for v in m) for m in members] if members.ndim == 2 else [int(m) for m in members]


def _cap_sentence(cap: dict, members: tuple[pd.DataFrame, int, set], fingerprint_count) -> str:
    table, n_executing, _ = members
    waiting = table.iloc[n_executing:]
    shape = _one_shape(set(table["fingerprint"].astype(object)), table["sql"].astype(object).iloc[0],
                       fingerprint_count)
    waits = waiting["queue_s"].to_numpy(dtype="float64", na_value=np.nan)
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
    u, h = int(waiting["understated"].sum()), int(waiting["hidden"].sum())
    total = waiting["total_s"].to_numpy(dtype="float64", na_value=np.nan)
    exec_s = waiting["exec_s"].to_numpy(dtype="float64", na_value=np.nan)
    saw = f" (clients saw {seconds_rounded(float(np.nanmax(total)))})" if (~np.isnan(total)).any() else ""
    if u == len(waiting):
        text += f"; the slow log shows their {seconds_rounded(float(np.nanmax(exec_s)))} of execution, not the wait{saw}"
    elif h == len(waiting):
        text += f"; the slow log shows none of them{saw}"
    elif u or h:
        text += f"; the slow log understates {u} of them and misses {h}{saw}"
    return text + "."


def _cap_bullets(cap: dict, members: tuple[pd.DataFrame, int, set]) -> list[dict]:
    table, n_executing, _ = members
    return [{"topic": "cap", "text": f"At the limit from {clock_ms(cap['start'])} to {clock_ms(cap['end'])}: executing "
                                     + _who(table.iloc[:n_executing]) + "; waiting " + _who(table.iloc[n_executing:])
                                     + f" ({seconds_rounded(cap['total_wait_s'])} of waiting in all, "
                                       f"{queue_source(cap['wait_source'])})."}]


def _stall_sentence(f: dict, stalls: list[dict], size: dict, logged: bool, disagrees: int = 0) -> str:
    """Told when some row certainly queued (f["certain:count"] > 0)."""
    told = [s for s in stalls if s["culprits_total"]]
    n_h, n_u = f["told_hidden:count"], f["told_understated:count"]
    rest, rest_no_id = f["rest:count"], f["rest_no_id:count"]
    if told and (n_h or n_u):
        where = thread_groups(sorted({s["thread_group"] for s in told}))
        behind = _culprit_words(told)
        if n_h:
            text = (f"{n_h} {plural(n_h, 'statement was', 'statements were')} slow only because "
                    f"{plural(n_h, 'it', 'they')} waited in {where} behind {behind}: "
                    f"{up_to(f['told_hidden_server:max'])} inside the server, and "
                    + (f"the slow log does not show {plural(n_h, 'it', 'them')}" if logged else
                       f"the server did not flag {plural(n_h, 'it', 'them')} slow (no slow log given)"))
            if n_u:
                text += (f"; {n_u} more in the slow log waited {up_to(f['told_understated_queue:max'])}, which its "
                         "Query_time leaves out")
        else:
            saw = (f" (clients saw {up_to(f['told_understated_total:max'])})" if f["told_understated_total:count"]
                   else "")
            text = (f"{statements(n_u)} in the slow log waited "
                    f"{up_to(f['told_understated_queue:max'])} in {where} behind {behind} before executing: the slow "
                    f"log's Query_time leaves the wait out{saw}")
        if rest:
            text += f"; {rest} more waited with no culprit found on their group"
        if rest_no_id:
            text += f"; {rest_no_id} more waited {_no_id_words(rest_no_id)}"
        if size.get("warning"):
            text += f" — if thread_pool_size {size['value']} is right; the capture suggests otherwise"
        return text + "."
    # queued, but no culprit named (or queued behind one, with no statement the slow log misses or understates)
    waited = "victims" if f["victims:count"] else "certain"  # the victims; else the statements that certainly queued
    n_h, n_u = f["hidden:count"], f["understated:count"]
    n = f[f"{waited}:count"]
    unknown = f[f"{waited}_no_id:count"]
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
    return (f"{statements(n)} waited {up_to(f[f'{waited}_longest:max'])} before "
            f"executing" + (f" ({', '.join(what)})" if what else "") + f"; {why}.")


def _likely_sentence(summary: dict, f: dict, stalls: list[dict], rows, lqt) -> str:
    """Statements the slow log cannot show waiting, but whose server time is far above their statement's typical
    execution while a long statement executed on their thread group (on the server when the groups are unknown):
    told as likely, with what would prove it."""
    told = [s for s in stalls if s["culprits_total"]]
    held = f["held:count"] > 0
    which = "held" if held else "likely"
    n = f[f"{which}:count"]
    first_sql, first_fingerprint = f[f"{which}_first:first"][1]
    shape = _one_shape(f[f"{which}_fingerprints:few"], first_sql, rows.fingerprint_count)
    who = (statements(n) if not shape else
           f"{n} {plural(n, 'run', 'runs')} of "
           + quoted(shape[0] if len(f[f"{which}_texts:few"]) == 1 else str(first_fingerprint)))
    waited = span(f[f"{which}_queue:min"], f[f"{which}_queue:max"])
    text = f"{who} likely waited {waited} in the thread pool"
    if held:
        where = thread_groups(sorted({s["thread_group"] for s in told}))
        text = f"{who} likely waited {waited} in {where} behind {_culprit_words(told)}"
    else:
        long_ = rows.longest_meanwhile(likely_rows)
        if long_ is not None:
            long_ = f"{quoted(long_['sql'] or long_['command'])} ({connection(long_.get('conn_id'))}, {execution(long_)})"
        text += f" while {long_} executed on the server; " if long_ else " while a long statement executed on the server; "
        text += (f"{plural(n, 'its connection id is', 'their connection ids are')} unknown (no greeting in the "
                 "capture), so their thread group cannot be told — give --processlist, or a slow log with Thread_id"
                 if f["likely_no_id:count"] == n else "thread_pool_size is unknown, so their thread group cannot be told")
    rest = f["likely_rest:count"] if held else 0
    if rest:
        text += f"; {rest} more likely waited with no culprit found on their group"
    rest_no_id = f["likely_rest_no_id:count"] if held else 0
    if rest_no_id:
        text += f"; {rest_no_id} more likely waited {_no_id_words(rest_no_id)}"
    logged = bool(summary["slow_log"].get("used"))
    if lqt is not None and (logged or f["flag_known:any"]):
        text += (f"; long_query_time = {seconds_rounded(lqt)} cannot prove it (their execution is below it) — set "
                 "long_query_time = 0 for the capture window to prove it")
    elif lqt is not None:
        text += ("; without a slow log nothing proves it — capture the slow log with long_query_time = 0 to prove it")
    else:
        text += (f"; long_query_time is unknown{_lqt_bound_words(f)}, so nothing proves it — capture the slow log "
                 "with long_query_time = 0 to prove it")
    return text + "."


def _no_id_words(n: int) -> str:
    """What is told of statements whose connection id is unknown: nothing about their thread group."""
    return (f"with no known connection id ({plural(n, 'its', 'their')} connection opened before the capture began: "
            "no greeting), so nothing is said of " + plural(n, "its", "their") + " thread group or culprit — give "
            "--processlist, or a slow log with Thread_id, to name the connections")


def _lqt_bound_words(f: dict) -> str:
    """What the slow log and the wire say of an unknown long_query_time: at most the shortest execution the slow log
    holds, and at most the shortest server time the server flagged slow (SERVER_QUERY_WAS_SLOW: execution ≥
    long_query_time); '' when neither says anything."""
    bounds = []
    if not np.isnan(f["slow_log_exec:min"]):
        bounds.append((f["slow_log_exec:min"], "the shortest Query_time in the slow log"))
    if not np.isnan(f["flagged_server:min"]):
        bounds.append((f["flagged_server:min"], "the shortest statement the server flagged slow"))
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


def _quiet_sentence(summary: dict, f: dict, lqt) -> str:
    worst = f["server:max"]
    n = f["server:count"]
    slow_logged = f["in_slow_log:count"]
    if worst < STALL_MIN_QUEUE_S:
        return (f"No statement waited in the thread pool: the slowest of the {n} exchanges seen at the DB took "
                f"{seconds_rounded(worst)} inside the server.")
    evidence = lqt is not None and (summary["slow_log"].get("used") or f["flag_known:any"])
    if evidence:
        slow = (f"; {slow_logged} {plural(slow_logged, 'was', 'were')} slow executing (in the slow log, "
                f"{up_to(f['slow_log_exec:max'])})"
                if slow_logged else "")
        return (f"No statement waited in the thread pool as far as the slow log and the wire show: none of the {n} "
                f"exchanges was slow on the wire without being in it or waited {seconds_rounded(STALL_MIN_QUEUE_S)} or more "
                f"before executing{slow}.")
    why = (f"long_query_time is unknown{_lqt_bound_words(f)} (give --long-query-time or capture.toml)" if lqt is None else
           "there is no slow log and the server does not flag slow statements on the wire (MySQL does not)")
    return (f"Queueing cannot be told from execution here: {why}; the slowest of the {n} exchanges took "
            f"{seconds_rounded(worst)} inside the server.")


def _stall_bullets(stalls: list[dict]) -> list[dict]:
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


def _understated_bullet(f: dict) -> dict:
    q = span_known(f["understated_queue:min"], f["understated_queue:max"])
    listed = ", ".join(str(int(v)) for v in f["understated_lines:least"])
    n = f["understated:count"]
    return {"topic": "understated", "text": f"{statements(n)} in the slow log waited "
                                            f"{q} before executing (measured: server time − Query_time), "
                                            "which the slow log does not show"
                                            + (f"; slow-log lines {listed}" + (" …" if n > 10 else "") if listed else "")
                                            + "."}


def _hidden_bullet(f: dict, lqt, logged: bool) -> dict:
    """`logged`: the slow log was joined. Without it the evidence is the server's SERVER_QUERY_WAS_SLOW flag alone,
    and the bullet says so rather than that the statements are not in a slow log nothing was compared with."""
    server = span_known(f["hidden_server:min"], f["hidden_server:max"])
    qmin = span_known(f["hidden_qmin:min"], f["hidden_qmin:max"])
    n = f["hidden:count"]
    evidence = ("yet not in the slow log and not flagged slow" if logged else
                "yet not flagged slow by the server; no slow log was joined to compare")
    return {"topic": "hidden_slow", "text": f"{n} hidden-slow {plural(n, 'statement', 'statements')} (slower than "
                                            f"long_query_time = {seconds_rounded(lqt)} inside the server, {evidence}): "
                                            f"server time {server}; as "
                                            f"{plural(n, 'it', 'they')} executed in under {seconds_rounded(lqt)}, at least "
                                            f"{qmin} of it was waiting."}


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


def _split_bullet(sums: dict[str, tuple[int, float]]) -> dict | None:
    """Where the clients' time went, from story_terms' sums over the sane rows."""
    rows, tot = sums["total"]
    if not rows or tot <= 0:
        return None
    pct = lambda v: f"{100 * v / tot:.1f} %"  # noqa: E731
    net = ", ".join(f"{label} {pct(v)}" for label, v in network_parts_of(sums))
    q_all, q_meas, q_cert = sums["queue"][1], sums["queue_measured"][1], sums["queue_certain"][1]
    q_likely, q_est = sums["queue_likely"][1], sums["queue_estimated"][1]
    e_all, e_meas, q_over = sums["exec"][1], sums["exec_measured"][1], sums["overhead"][1]
    unsplit = sums["unsplit_server"][1] - sums["unsplit_pipelined"][1]
    unsplit_bounded, piped = sums["unsplit_bounded"][1], sums["pipelined"][1]
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


def _pipelined_bullet(f: dict) -> dict | None:
    n = f["pipelined:count"]
    if not n:
        return None
    return {"topic": "pipelined", "text": f"{n} {plural(n, 'request was', 'requests were')} pipelined (sent before the "
                                          "answer to the one before on the same connection) and waited there "
                                          f"{up_to(f['pipelined:max'])}: the connection's own "
                                          "wait, not the thread pool's: not queueing, not a stall."}


def _estimate_bullet(sums: dict[str, tuple[int, float]]) -> dict | None:
    n, q = sums["estimated_exec_queue"]
    if not n:
        return None
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


def _who(part: pd.DataFrame) -> str:
    """`SQL` ×n (connections a, b, c), per distinct statement text of the rows `part`."""
    texts = []
    for sql, g in part.groupby(part["sql"].astype(object).fillna(part["command"].astype(object)), sort=False):
        conns = ", ".join(str(int(c)) for c in sorted(g["conn_id"].dropna().astype(int))[:12])
        more = " …" if g["conn_id"].notna().sum() > 12 else ""
        texts.append(f"{quoted(sql)} ×{len(g)} (connection{'s' if len(g) > 1 else ''} {conns}{more})")
    return "; ".join(texts[:5]) + (f" and {len(texts) - 5} other statements" if len(texts) > 5 else "")


def _one_shape(fingerprints: set, first_sql, fingerprint_count) -> tuple[str, int] | None:
    """(statement text, how many exchanges of that fingerprint there are) when the rows share one fingerprint (of
    `fingerprints`, theirs); `first_sql`: the first row's text; `fingerprint_count(fp)`: the table's rows of fp."""
    if len(fingerprints) != 1:
        return None
    fp = next(iter(fingerprints))
    return (first_sql if isinstance(first_sql, str) else str(fp)), fingerprint_count(fp)
