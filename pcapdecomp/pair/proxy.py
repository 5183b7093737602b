"""Proxy stage: pair exchanges through a proxy between app and DB, and measure the proxy's share of the time.

Three capture points: the app host (A), the proxy host (P, both its client side, "front", and its server side,
"back", in one or more captures) and the DB host (D). Any two are enough.

* **L4 proxy** (HAProxy in TCP mode, a cloud load balancer): every front connection has its own back connection and
  the bytes pass unchanged, the greeting included (same connection id, same scramble), but the TCP sequence
  numbers differ. A front/back (or app/DB) connection pair is found by its scramble; the difference between the
  two connections' sequence numbers is constant along a stream, so the back side's numbers are shifted into the
  front's and pair/match.py pairs the exchanges exactly as it does at one TCP connection.
* **L7 pooling proxy** (ProxySQL, MaxScale, Gaea, vtgate): statements of many client connections run on fewer
  server connections, possibly rewritten. A request is keyed by its canonical text (comments, whitespace and
  identifier quotes dropped, case folded outside literals); a prepared statement executed at the front is keyed
  with its parameters written in, so a proxy that runs it as a text query (Gaea, MaxScale's binlog router...) or
  re-prepares it (ProxySQL) still pairs. A back request is a candidate for a front request when their keys agree
  and its times fit inside the front one (sent after the front request arrived, answered before the front answer
  left). A pair is made only when it is forced: the front request has a single candidate that no other front
  request is forced onto; taken candidates leave the others' lists and the rule is applied again. Front requests
  left with several candidates are marked `ambiguous` with their count, never guessed; back requests no front
  request can have sent are `proxy-own` (the proxy's own SET NAMES, autocommit, health checks).

Assumption of the L7 rule: a client statement the proxy answered from the DB was seen at the back once (with the
capture intact). A front request whose only fitting back request was lost from a capture can be paired with
another client's identical statement only when that one also fits in time; such pairs are the rule's residual risk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..core.schema import TS
from ..core.tables import null_column
from ..core.times import to_ts, ts_ns_or
from ..mysql.params import split_params
from ..read.tcp import SEQ_MOD
from .match import Matching, MatchStats, Pairing, connection_keys, match_exchanges

if TYPE_CHECKING:
    from .clock import ClockModel  # imported where a clock is made (constant_clock): a run without a proxy makes none

BIG = np.iinfo(np.int64).max  # a time that was not seen
SAME_HOST_TOL_NS = 50_000  # front and back on one host's clock: ordering is exact up to timestamping noise
# commands a pooling proxy answers or handles on its own: never forwarded as such
PROXY_HANDLED = frozenset({"CONNECT", "COM_QUIT", "COM_STMT_PREPARE", "COM_STMT_CLOSE", "COM_STMT_RESET",
                           "COM_INIT_DB", "COM_PING", "COM_CHANGE_USER", "COM_RESET_CONNECTION",
                           "COM_STMT_SEND_LONG_DATA", "COM_SET_OPTION"})
PAIRED_KINDS = ("l4", "l7-text", "l7-rewritten", "l7-params")
MAX_CANDIDATES = 64  # a front request with more fitting back requests is ambiguous without listing them
# P1 … P4 on the app clock: the request's first byte and the response's last at the proxy's client side (front),
# the same at its server side (back)
PROXY_TIME_COLUMNS = ("proxy_front_req_ts", "proxy_back_req_ts", "proxy_back_resp_ts", "proxy_front_resp_ts")


# --- canonical statement text ----------------------------------------------------------------------------------

_TOKEN_RE = re.compile(
    r"'(?:[^'\\]|\\.|'')*'?"  # single-quoted literal (kept as is)
    r'|"(?:[^"\\]|\\.|"")*"?'  # double-quoted literal
    r"|`([^`]*)`?"  # quoted identifier: the name without its quotes
    r"|/\*(?!!).*?(?:\*/|$)"  # comment (not a /*! executable comment */)
    r"|(?:--\s|#)[^\n]*"  # one-line comment
    r"|\s+"  # whitespace
    r"|[^'\"`/#\s?-]+|.",
    re.S)


# without a proxy capture, a pair is searched for a proxy between its points when fewer of its exchanges pair
# directly than this share of the smaller point's (run.spilled leaves such a pair to the in-memory run)
PROXY_SIGN = 0.5

def canonical(sql: str | None) -> str | None:
    """The statement as a key: literals kept byte for byte, everything else without comments, whitespace and
    identifier quotes, ASCII-lowercased ("SELECT 1 AS tag, SLEEP(0.15)" and "select 1 as `tag`,sleep(0.15)" agree)."""
    if sql is None:
        return None
    out = []
    for m in _TOKEN_RE.finditer(sql):
        tok = m.group(0)
        c = tok[0]
        if c in "'\"":
            out.append(tok)
        elif c == "`":
            out.append((m.group(1) or "").lower())
        elif tok.isspace() or tok.startswith(("/*", "--", "#")) and not tok.startswith("/*!"):
            continue
        else:
            out.append(tok.lower())
    return "".join(out).rstrip(";")


def with_params(sql: str, params: str) -> str | None:
    """The prepared text with each `?` placeholder (outside literals and comments) replaced by its value."""
    values = split_params(params) if params else []
    if values is None:  # a value cut short: the text cannot be rebuilt
        return None
    out, used = [], 0
    for m in _TOKEN_RE.finditer(sql):
        tok = m.group(0)
        if tok == "?":
            if used >= len(values):
                return None
            out.append(values[used])
            used += 1
        else:
            out.append(tok)
    return "".join(out) if used == len(values) else None


def request_keys(ex: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(key per row or None, how it was made: 'text' | 'params' | '') for an exchanges table."""
    n = len(ex)
    keys = np.full(n, None, dtype=object)
    how = np.full(n, "", dtype=object)
    if n == 0:
        return keys, how
    command = ex["command"].astype(object).to_numpy()
    sql = ex["sql"]
    if isinstance(sql.dtype, pd.CategoricalDtype):  # one canonical text per distinct statement, not per row
        cats = np.array([canonical(s) for s in sql.cat.categories] + [None], dtype=object)
        text_keys = cats[sql.cat.codes.to_numpy()]
    else:
        text_keys = np.array([canonical(s) if isinstance(s, str) else None for s in sql], dtype=object)
    query = command == "COM_QUERY"
    keys[query] = text_keys[query]
    how[query] = "text"
    execute = np.flatnonzero(command == "COM_STMT_EXECUTE")
    if len(execute):
        sql_obj = sql.astype(object).to_numpy()
        params = ex["params"].astype(object).to_numpy()
        for i in execute:
            s, p = sql_obj[i], params[i]
            if isinstance(s, str) and isinstance(p, str):
                filled = with_params(s, p)
                if filled is not None:
                    keys[i] = canonical(filled)
                    how[i] = "params"
    return keys, how


# --- which side of the proxy a connection is on -------------------------------------------------------------------


def split_sides(ex: pd.DataFrame, conns: pd.DataFrame, db_servers: set[str],
                proxy_servers: set[str]) -> tuple[np.ndarray, str]:
    """Boolean per row of a proxy capture's exchanges: True on its client side (front), False on its server side
    (back); and how that was decided. Known addresses decide first (the DB's address, or the proxy's own);
    else an L4 proxy's scramble pairs (the back connection gets the greeting first); else the statement order
    (a statement reaches the front before it leaves at the back)."""
    server = ex["server"].astype(object).to_numpy()
    if len(ex) == 0:
        return np.zeros(0, dtype=bool), "empty"
    if proxy_servers:
        return np.isin(server, list(proxy_servers)), "proxy address"
    if db_servers and np.isin(server, list(db_servers)).any():
        return ~np.isin(server, list(db_servers)), "DB address"
    endpoints = pd.unique(server)
    if len(endpoints) == 1:
        return np.ones(len(ex), dtype=bool), "one server endpoint (taken as the client side)"
    # L4: a scramble seen on two connections; the one whose greeting came first is the back one
    c = conns.dropna(subset=["scramble"])
    dup = c[c.duplicated("scramble", keep=False)]
    if len(dup):
        first = dup.sort_values("greeting_ts").drop_duplicates("scramble")
        back_servers = set(first["server"].astype(str))
        return ~np.isin(server, list(back_servers)), "scramble pairs (greeting order)"
    # L7: per server endpoint, how late its statements are after the same statement's first sighting anywhere
    keys, _ = request_keys(ex)
    t = ex["req_first_ts"].to_numpy(dtype="datetime64[ns]").astype(np.int64)
    frame = pd.DataFrame({"key": keys, "t": t, "server": server}).dropna(subset=["key"])
    if frame.empty:
        return np.ones(len(ex), dtype=bool), "no statements (taken as the client side)"
    frame["lag"] = frame["t"] - frame.groupby("key")["t"].transform("min")
    lag = frame.groupby("server")["lag"].median()
    front_servers = set(lag[lag <= lag.min()].index)
    return np.isin(server, list(front_servers)), "statement order"


# --- L4 ------------------------------------------------------------------------------------------------------------


def l4_shift(front: pd.DataFrame, front_conns: pd.DataFrame, back: pd.DataFrame,
             back_conns: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The back table with its TCP sequence numbers moved into the front connections' numbering, per pair of
    connections that share a greeting scramble; and how many pairs were found. Rows of unpaired connections get
    sequence numbers that match nothing (shifted by half the space)."""
    fk = pd.DataFrame({"f_conn": connection_keys(front).to_numpy(), "capture": front["capture"].to_numpy(),
                       "conn_index": front["conn_index"].to_numpy()}).drop_duplicates("f_conn")
    bk = pd.DataFrame({"b_conn": connection_keys(back).to_numpy(), "capture": back["capture"].to_numpy(),
                       "conn_index": back["conn_index"].to_numpy()}).drop_duplicates("b_conn")
    fs = fk.merge(front_conns[["capture", "conn_index", "scramble"]], on=["capture", "conn_index"]).dropna(subset=["scramble"])
    bs = bk.merge(back_conns[["capture", "conn_index", "scramble"]], on=["capture", "conn_index"]).dropna(subset=["scramble"])
    pairs = fs[["f_conn", "scramble"]].merge(bs[["b_conn", "scramble"]], on="scramble")
    pairs = pairs.drop_duplicates("f_conn").drop_duplicates("b_conn")
    shifted = back.copy()
    if pairs.empty:
        return shifted, 0
    f = pd.DataFrame({"f_conn": connection_keys(front).to_numpy(), "seq": front["seq"].to_numpy(),
                      "command": front["command"].astype(object).to_numpy(), "sql": front["sql"].astype(object).to_numpy(),
                      "f_req": front["req_tcp_seq"].to_numpy(), "f_resp": front["resp_tcp_seq"].to_numpy(dtype="float64", na_value=np.nan)})
    b_conn = connection_keys(back).to_numpy()
    b = pd.DataFrame({"b_conn": b_conn, "seq": back["seq"].to_numpy(),
                      "command": back["command"].astype(object).to_numpy(), "sql": back["sql"].astype(object).to_numpy(),
                      "b_req": back["req_tcp_seq"].to_numpy(), "b_resp": back["resp_tcp_seq"].to_numpy(dtype="float64", na_value=np.nan)})
    # rows aligned by their ordinal where command and text agree: each votes for its pair's two deltas
    aligned = f.merge(pairs[["f_conn", "b_conn"]], on="f_conn").merge(b, on=["b_conn", "seq"], suffixes=("", "_b"))
    aligned = aligned[(aligned["command"] == aligned["command_b"])
                      & ((aligned["sql"] == aligned["sql_b"]) | (aligned["sql"].isna() & aligned["sql_b"].isna()))]
    aligned = aligned.assign(d_req=(aligned["f_req"] - aligned["b_req"]) % SEQ_MOD,
                             d_resp=(aligned["f_resp"] - aligned["b_resp"]) % SEQ_MOD)
    d_req = aligned.groupby("b_conn")["d_req"].agg(lambda s: s.mode().iloc[0])
    d_resp = aligned.dropna(subset=["d_resp"]).groupby("b_conn")["d_resp"].agg(lambda s: s.mode().iloc[0])
    half = SEQ_MOD // 2
    req_delta = pd.Series(b_conn).map(d_req).fillna(half).to_numpy(dtype=np.int64)
    resp_delta = pd.Series(b_conn).map(d_resp).fillna(half).to_numpy(dtype=np.int64)
    shifted["req_tcp_seq"] = (back["req_tcp_seq"].to_numpy() + req_delta) % SEQ_MOD
    for col in ("resp_tcp_seq", "resp_tcp_end"):
        values = back[col].astype("Int64")
        shifted[col] = ((values + resp_delta) % SEQ_MOD).astype("Int64")
    return shifted, int(len(d_req))


def match_l4(front, front_conns, back, back_conns) -> tuple[Matching, int]:
    shifted, pairs = l4_shift(front, front_conns, back, back_conns)
    return match_exchanges(front, shifted, front_conns, back_conns), pairs


# --- L7 ------------------------------------------------------------------------------------------------------------


@dataclass
class L7Pairs:
    front_row: np.ndarray  # int64 rows of the front table, paired
    back_row: np.ndarray  # int64 rows of the back table, paired with front_row
    how: np.ndarray  # 'l7-text' | 'l7-rewritten' | 'l7-params' per pair
    front_status: np.ndarray  # per front row: paired | ambiguous | unmatched | proxy-handled | unkeyed
    front_candidates: np.ndarray  # per front row: fitting back requests (0 when none)
    back_status: np.ndarray  # per back row: paired | proxy-own | unpaired
    stats: dict = field(default_factory=dict)
    work: int = 0  # elementary steps taken (rows, candidate edges, rounds): what tests/test_proxy.py scales


def match_l7(front: pd.DataFrame, back: pd.DataFrame, offset_ns: float = 0.0, tol_ns: float = SAME_HOST_TOL_NS) -> L7Pairs:
    """Pair front requests with back requests of the same canonical text that fit inside them in time.

    offset_ns: back clock − front clock; tol_ns: how far the ordering may be off (clock uncertainty)."""
    fk, fhow = request_keys(front)
    bk, _ = request_keys(back)
    f_cmd = front["command"].astype(object).to_numpy() if len(front) else np.zeros(0, dtype=object)
    f_req, f_resp = ts_ns_or(front["req_first_ts"], BIG), ts_ns_or(front["resp_last_ts"], BIG)
    shift = np.int64(round(offset_ns))
    b_req = ts_ns_or(back["req_first_ts"], BIG) - shift
    b_resp_raw = ts_ns_or(back["resp_last_ts"], BIG)
    b_resp = np.where(b_resp_raw == np.iinfo(np.int64).max, b_resp_raw, b_resp_raw - shift)
    tol = np.int64(round(tol_ns))
    front_status = np.where(np.isin(f_cmd, list(PROXY_HANDLED)), "proxy-handled", "unkeyed").astype(object)
    back_status = np.full(len(back), "unpaired", dtype=object)
    edges = _candidates(fk, bk, f_req, f_resp, b_req, b_resp, tol, front_status, back_status)
    pf, pb, front_candidates, work = _forced_pairs(edges, len(front), len(back), front_status)
    front_status[pf] = "paired"
    back_status[pb] = "paired"
    f_sql = front["sql"].astype(object).to_numpy() if len(front) else np.zeros(0, dtype=object)
    b_sql = back["sql"].astype(object).to_numpy() if len(back) else np.zeros(0, dtype=object)
    how = np.where(fhow[pf] == "params", "l7-params",
                   np.where(f_sql[pf] == b_sql[pb], "l7-text", "l7-rewritten")).astype(object) if len(pf) else \
        np.zeros(0, dtype=object)
    stats = {
        "paired": int(len(pf)),
        "paired_by": {k: int((how == k).sum()) for k in ("l7-text", "l7-rewritten", "l7-params")},
        "ambiguous": int((front_status == "ambiguous").sum()),
        "unmatched": int((front_status == "unmatched").sum()),
        "proxy_handled": int((front_status == "proxy-handled").sum()),
        "proxy_own": int((back_status == "proxy-own").sum()),
        "back_unpaired": int((back_status == "unpaired").sum()),
    }
    return L7Pairs(pf, pb, how, front_status, front_candidates, back_status, stats, work)


@dataclass
class _Edges:
    """Candidate pairs (front row, back row), grouped by front row, of the front rows `fronts` (keyed, their key
    seen at the back); `crowded`: front rows with more than MAX_CANDIDATES back requests in their time span, and
    how many (ambiguous without listing them)."""

    fronts: np.ndarray
    front: np.ndarray
    back: np.ndarray
    crowded: np.ndarray
    crowded_count: np.ndarray
    work: int


def _candidates(fk: np.ndarray, bk: np.ndarray, f_req: np.ndarray, f_resp: np.ndarray, b_req: np.ndarray,
                b_resp: np.ndarray, tol: np.int64, front_status: np.ndarray, back_status: np.ndarray) -> _Edges:
    """Every (front, back) request pair with the same key where the back request fits inside the front one; marks
    back requests whose key no front request has (proxy-own) and keyed front requests whose key no back request
    has (unmatched). Sorting and binary search over all keys at once: O((F + B) log(F + B) + edges)."""
    nf, nb = len(fk), len(bk)
    codes, uniques = pd.factorize(np.concatenate([fk, bk]).astype(object), use_na_sentinel=True)
    fc, bc = codes[:nf], codes[nf:]
    k = len(uniques)
    in_front = np.zeros(k + 1, dtype=bool)
    in_front[fc[fc >= 0]] = True
    in_back = np.zeros(k + 1, dtype=bool)
    in_back[bc[bc >= 0]] = True
    back_status[(bc >= 0) & ~in_front[bc]] = "proxy-own"
    keyed = np.flatnonzero(fc >= 0)
    front_status[keyed[~in_back[fc[keyed]]]] = "unmatched"
    fr = keyed[in_back[fc[keyed]]]  # keyed front rows whose key the back side has
    br = np.flatnonzero((bc >= 0) & in_front[np.maximum(bc, 0)])
    if len(fr) == 0 or len(br) == 0:
        none = np.zeros(0, np.int64)
        return _Edges(fr.astype(np.int64), none, none, none, none, nf + nb)
    # times as dense ranks, so that (key, time) is one int64 and one searchsorted finds every front's range
    answered = f_resp[fr] != BIG
    lo_t = f_req[fr] - tol
    hi_t = np.where(answered, f_resp[fr] + np.where(answered, tol, 0), BIG)
    times, inverse = np.unique(np.concatenate([b_req[br], lo_t, hi_t]), return_inverse=True)
    span = np.int64(len(times) + 1)
    rank_b, rank_lo, rank_hi = np.split(inverse.astype(np.int64), [len(br), len(br) + len(fr)])
    comp_b = bc[br].astype(np.int64) * span + rank_b
    order = np.argsort(comp_b, kind="stable")
    comp_b, brows = comp_b[order], br[order]
    key_f = fc[fr].astype(np.int64) * span
    lo = np.searchsorted(comp_b, key_f + rank_lo, side="left")
    hi = np.where(answered, np.searchsorted(comp_b, key_f + rank_hi, side="right"),
                  np.searchsorted(comp_b, key_f + span - 1, side="left"))
    count = np.maximum(hi - lo, 0)
    crowded = count > MAX_CANDIDATES
    fr_ok, lo_ok, count_ok = fr[~crowded], lo[~crowded], count[~crowded]
    total = int(count_ok.sum())
    f_edge = np.repeat(fr_ok, count_ok)
    starts = np.repeat(lo_ok - np.concatenate([[0], np.cumsum(count_ok)[:-1]]), count_ok)
    b_edge = brows[starts + np.arange(total, dtype=np.int64)]
    fits = (b_resp[b_edge] <= np.where(f_resp[f_edge] != BIG, f_resp[f_edge] + tol, BIG)) | (b_resp[b_edge] == BIG)
    fits |= f_resp[f_edge] == BIG
    work = nf + nb + len(times) + total
    return _Edges(fr_ok, f_edge[fits], b_edge[fits], fr[crowded], count[crowded], work)


def _forced_pairs(edges: _Edges, nf: int, nb: int, front_status: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The forced pairs among the candidate edges, in rounds: a front request with one live candidate is forced onto
    it; a back request that exactly one front request is forced onto is paired with it, and leaves the other front
    requests' candidates (some of which are forced in the next round). Two front requests forced onto one back
    request stay unpaired (ambiguous). Each round touches only the front requests that became forced and the
    candidates of the back requests just taken: O(edges) in all (plus a constant per round).

    Returns (paired front rows, their back rows, candidates per front row, work done). Sets front_status to
    ambiguous / unmatched for the keyed front requests left unpaired."""
    f_edge, b_edge = edges.front, edges.back
    candidates = np.zeros(nf, dtype=np.int64)
    candidates[edges.crowded] = edges.crowded_count
    front_status[edges.crowded] = "ambiguous"
    initial = np.bincount(f_edge, minlength=nf)
    live = initial.copy()
    keyed = np.zeros(nf, dtype=bool)
    keyed[edges.fronts] = True
    # front → its edges (grouped already), back → its edges
    f_start = np.searchsorted(f_edge, np.arange(nf + 1))
    by_b = np.argsort(b_edge, kind="stable")
    b_start = np.searchsorted(b_edge[by_b], np.arange(nb + 1))
    taken = np.zeros(nb, dtype=bool)
    closed = np.zeros(nf, dtype=bool)
    forced_on = np.zeros(nb, dtype=np.int64)  # front requests forced onto each back request
    forced_by = np.full(nb, -1, dtype=np.int64)
    pairs_f, pairs_b = [], []
    work = edges.work
    frontier = np.flatnonzero(live == 1)
    while len(frontier):
        e = _ranges(f_start[frontier], f_start[frontier + 1])
        e = e[~taken[b_edge[e]]]  # the one live candidate of each forced front request
        f_now, b_now = f_edge[e], b_edge[e]
        np.add.at(forced_on, b_now, 1)
        forced_by[b_now] = f_now
        touched = np.unique(b_now)
        won = touched[forced_on[touched] == 1]
        winners = forced_by[won]
        pairs_f.append(winners)
        pairs_b.append(won)
        taken[won] = True
        closed[winners] = True
        others = f_edge[by_b[_ranges(b_start[won], b_start[won + 1])]]
        others = others[~closed[others]]
        np.subtract.at(live, others, 1)
        frontier = np.unique(others)
        frontier = frontier[live[frontier] == 1]
        work += 1 + 2 * len(e) + len(others) + len(frontier)
    pf = np.concatenate(pairs_f) if pairs_f else np.zeros(0, np.int64)
    pb = np.concatenate(pairs_b) if pairs_b else np.zeros(0, np.int64)
    left = keyed & ~closed
    front_status[left] = np.where(live[left] > 0, "ambiguous", "unmatched")
    candidates[left] = live[left]
    candidates[pf] = np.maximum(initial[pf], 1)
    return pf.astype(np.int64), pb.astype(np.int64), candidates, int(work)


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The concatenation of arange(s, e) for each pair."""
    n = ends - starts
    total = int(n.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(n)[:-1]]), n)
    return offsets + np.arange(total, dtype=np.int64)


def order_bounds(pairs: L7Pairs, front: pd.DataFrame, back: pd.DataFrame) -> tuple[float, float] | None:
    """Bounds on (back clock − front clock) from the order of paired requests: the back request left after the
    front one arrived, and its answer came back before the front answer left."""
    return pair_bounds(pairs.front_row, pairs.back_row, front, back)


def pair_bounds(front_row: np.ndarray, back_row: np.ndarray, front: pd.DataFrame,
                back: pd.DataFrame) -> tuple[float, float] | None:
    if len(front_row) == 0:
        return None
    f_req = ts_ns_or(front["req_first_ts"], BIG)[front_row]
    f_resp = ts_ns_or(front["resp_last_ts"], BIG)[front_row]
    b_req = ts_ns_or(back["req_first_ts"], BIG)[back_row]
    b_resp = ts_ns_or(back["resp_last_ts"], BIG)[back_row]
    big = np.iinfo(np.int64).max
    ok = (f_resp != big) & (b_resp != big)
    upper = float(np.min(b_req - f_req))
    lower = float(np.max(b_resp[ok] - f_resp[ok])) if ok.any() else -np.inf
    return lower, upper


def constant_clock(offset_ns: float, lower_ns: float, upper_ns: float, at_ns: int, n: int) -> ClockModel:
    """A clock model with one constant offset (no skew) and its bounds, for points that share no TCP segment."""
    from .clock import ClockModel, ClockSegment

    seg = ClockSegment(start_ns=int(at_ns), end_ns=np.iinfo(np.int64).max, ref_ns=int(at_ns), offset_ns=float(offset_ns),
                       skew_ppm=0.0, lower_ns=float(lower_ns), upper_ns=float(upper_ns), skew_lower_ppm=float("nan"),
                       skew_upper_ppm=float("nan"), n_fwd=n, n_rev=n, n_excluded=0)
    return ClockModel(segments=(seg,), quality="statement-order")


def match_l7_across_hosts(front: pd.DataFrame, back: pd.DataFrame) -> tuple[L7Pairs, ClockModel | None, dict]:
    """L7 pairing when front and back were captured on two hosts whose clocks differ by an unknown offset: a first
    pass with a wide tolerance (1 s) pairs what is forced even then; the order of those pairs bounds the offset;
    a second pass uses the middle of the bounds and their half-width as the tolerance."""
    first = match_l7(front, back, 0.0, 1e9)
    bounds = order_bounds(first, front, back)
    if bounds is None or not np.isfinite(bounds[0]) or bounds[0] > bounds[1]:
        info = {"offset_s": None, "offset_bounds_s": [None, None], "quality": "none",
                "note": "no statement pairs bound the clocks' offset; times assumed on one clock"}
        return first, None, info
    lower, upper = bounds
    middle = (lower + upper) / 2
    second = match_l7(front, back, middle, (upper - lower) / 2 + SAME_HOST_TOL_NS)
    bounds2 = order_bounds(second, front, back) or bounds
    lower, upper = (bounds2 if np.isfinite(bounds2[0]) and bounds2[0] <= bounds2[1] else bounds)
    middle = (lower + upper) / 2
    at = int(ts_ns_or(front["req_first_ts"], BIG).min()) if len(front) else 0
    model = constant_clock(middle, lower, upper, at, len(second.front_row))
    info = {"offset_s": middle / 1e9, "offset_bounds_s": [lower / 1e9, upper / 1e9], "quality": "statement-order",
            "pairs": int(len(second.front_row))}
    return second, model, info


# --- three capture points --------------------------------------------------------------------------------------

NONE = -1


@dataclass
class Side:
    """One capture point's exchanges and connections (several captures concatenated)."""

    ex: pd.DataFrame
    conns: pd.DataFrame

    def __len__(self) -> int:
        return len(self.ex)


@dataclass
class ProxyResult:
    """What analysis.py needs to run build_table through a proxy, and the proxy's own columns afterwards."""

    client: Side  # the client side of the decomposition: the app capture, else the proxy's front
    server: Side  # the server side: the DB capture, else the proxy's back
    matching: Matching  # client rows ↔ server rows
    clocks: dict[str, ClockModel]  # per client capture: server clock as build_table expects it
    server_raw: tuple[np.ndarray, np.ndarray]  # the server side's own req_first/resp_last (ns) before conversion
    columns: dict[str, np.ndarray]  # proxy columns per matching row (PROXY_COLUMNS), times already in seconds
    summary: dict
    warnings: list[str]
    client_is_front: bool  # no app capture: the proxy's front is the client side
    server_is_back: bool  # no DB capture: the proxy's back is the server side


@dataclass
class NoProxy:
    """A proxy capture whose traffic shows no proxy: its connections do not continue from a client side to a server
    side. The analysis leaves the proxy stage out (the capture stands in for the app capture when there is none)."""

    warning: str  # what the analysis says, after the capture's name
    summary: dict


def _rows_map(matching: Matching, n_left: int) -> np.ndarray:
    """left row -> right row (or -1) from a Matching."""
    out = np.full(n_left, NONE, dtype=np.int64)
    both = (matching.app_row >= 0) & (matching.db_row >= 0)
    out[matching.app_row[both]] = matching.db_row[both]
    return out


def _take(values: np.ndarray, rows: np.ndarray, fill) -> np.ndarray:
    out = np.full(len(rows), fill, dtype=values.dtype if len(values) else np.asarray([fill]).dtype)
    ok = rows >= 0
    if len(values):
        out[ok] = values[rows[ok]]
    return out


def _subset(side: Side, mask: np.ndarray) -> Side:
    ex = side.ex[mask].reset_index(drop=True)
    keys = set(zip(ex["capture"].astype(str), ex["conn_index"]))
    c = side.conns
    keep = np.array([(str(a), b) in keys for a, b in zip(c["capture"], c["conn_index"])], dtype=bool) if len(c) else \
        np.zeros(0, dtype=bool)
    return Side(ex, c[keep].reset_index(drop=True))


def _flows_of(side: Side, keys: np.ndarray) -> dict[str, set]:
    """capture -> {(client ip, port, server ip, port)} of the connections (connection_keys values) given."""
    from ..core.endpoints import split_endpoint

    ck = connection_keys(side.ex).to_numpy()
    sel = np.isin(ck, keys)
    out: dict[str, set] = {}
    for cap, client, server in zip(side.ex["capture"].astype(str).to_numpy()[sel],
                                   side.ex["client"].astype(str).to_numpy()[sel],
                                   side.ex["server"].astype(str).to_numpy()[sel]):
        ci, cp = split_endpoint(client)
        si, sp = split_endpoint(server)
        out.setdefault(cap, set()).add((ci, cp, si, sp))
    return out


def _hops(app: Side | None, front: Side, back: Side, db: Side | None, points: dict) -> tuple[tuple, tuple]:
    """The two hops that are one TCP connection seen at two points: app ↔ the proxy's client side, the proxy's
    server side ↔ DB (a hop without its outer capture is the identity). Per hop: near rows -> far rows, the
    matching's counts, and far clock − near clock per near capture from the TCP segments seen at both points. Each
    capture is read once for the segments of both hops (the proxy capture holds both); `points`: through_proxy's."""
    from .clock import estimate_clock
    from .clocks import pair_segments, read_segments_of

    hops = [(app, front), (back, db)]
    matched = [match_exchanges(near.ex, far.ex, near.conns, far.conns) if near is not None and far is not None
               else None for near, far in hops]
    flows: dict[str, set] = {}
    for (near, far), m in zip(hops, matched):
        if m is None or len(m.connections) == 0:
            continue
        for side, col in ((near, "app_conn"), (far, "db_conn")):
            for cap, f in _flows_of(side, m.connections[col].to_numpy()).items():
                flows.setdefault(cap, set()).update(f)
    segments = {cap: read_segments_of(points.get(cap, cap), f) for cap, f in flows.items()}
    out = []
    for (near, far), m in zip(hops, matched):
        if m is None:
            side = near if near is not None else far
            out.append((np.arange(len(side), dtype=np.int64), None, {}))
            continue
        models = {}
        if len(m.connections):
            far_caps = list(_flows_of(far, m.connections["db_conn"].to_numpy()))
            for cap in _flows_of(near, m.connections["app_conn"].to_numpy()):
                best = None
                for far_cap in far_caps:
                    samples = pair_segments(segments[cap], segments[far_cap])
                    if best is None or (len(samples.fwd_app) + len(samples.rev_app)
                                        > len(best.fwd_app) + len(best.rev_app)):
                        best = samples
                if best is not None:
                    models[cap] = estimate_clock(best.fwd_app, best.fwd_db, best.rev_db, best.rev_app)
        out.append((_rows_map(m, len(near)), m.stats.as_dict(), models))
    return out[0], out[1]


def _front_back(front: Side, back: Side) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str, dict]:
    """Front rows -> back rows through the proxy on one clock: (map, how per front row, candidates per front row,
    back status per back row, kind, stats)."""
    m4, l4_pairs = match_l4(front.ex, front.conns, back.ex, back.conns) if len(front) and len(back) else (None, 0)
    if l4_pairs:
        fb = _rows_map(m4, len(front))
        how = np.where(fb >= 0, "l4", None).astype(object)
        status = np.full(len(back), "unpaired", dtype=object)
        status[fb[fb >= 0]] = "paired"
        stats = {"kind": "l4", "connection_pairs": l4_pairs, "paired": int((fb >= 0).sum()),
                 "unpaired_front": int((fb < 0).sum()), "unpaired_back": int((status != "paired").sum())}
        return fb, how, np.where(fb >= 0, 1, 0), status, "l4", stats
    pairs = match_l7(front.ex, back.ex)
    return (*_l7_arrays(pairs, len(front)), pairs.back_status, "l7", {"kind": "l7", **pairs.stats})


def _l7_arrays(pairs: L7Pairs, n_front: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    fb = np.full(n_front, NONE, dtype=np.int64)
    fb[pairs.front_row] = pairs.back_row
    how = pairs.front_status.copy()
    how[pairs.front_row] = pairs.how
    how[how == "unkeyed"] = None
    return fb, how, pairs.front_candidates


def through_proxy(app: Side | None, db: Side | None, proxy: Side | None, db_servers: set[str],
                  proxy_servers: set[str], direct: Matching | Pairing | None = None, points: dict | None = None
                  ) -> ProxyResult | NoProxy | None:
    """Pair app and DB exchanges through a proxy. With a proxy capture whenever its traffic shows a proxy (a client
    side and a server side, statements or connections that continue from one to the other), else NoProxy;
    without one (app + DB) only when the direct pairing found little and the captures show a proxy: an L4 one by
    shared scrambles, an L7 one by statements that pair by text. None: no proxy found (the direct pairing
    stands). `direct`: that pairing of app and DB, when made already (its number of exchanges paired is asked).
    `points`: capture name -> its sources.CapturePoint, for the points of several files (read again as one stream
    for the clocks; a name not there is a file)."""
    warnings: list[str] = []
    summary: dict = {}
    clocks: dict[str, ClockModel] = {}
    summary["points"] = {"app": app is not None, "proxy": proxy is not None, "db": db is not None}
    if proxy is not None:
        front_mask, decided = split_sides(proxy.ex, proxy.conns, db_servers, proxy_servers)
        front, back = _subset(proxy, front_mask), _subset(proxy, ~front_mask)
        summary["sides"] = {"decided_by": decided, "front_exchanges": len(front), "back_exchanges": len(back),
                            "front_servers": sorted(set(front.ex["server"].astype(str))),
                            "back_servers": sorted(set(back.ex["server"].astype(str)))}
        if not len(front) or not len(back):
            ends = summary["sides"]["front_servers" if len(front) else "back_servers"]
            return _no_proxy(summary, app, "no MySQL exchange" if not len(proxy) else
                             f"one side only: all its connections go to {', '.join(ends[:3])}"
                             + (f" and {len(ends) - 3} more" if len(ends) > 3 else ""))
        fb, how_f, cand_f, back_status, kind, fb_stats = _front_back(front, back)
        summary["through"] = fb_stats
        if kind == "l7" and not fb_stats["paired"] and not fb_stats["ambiguous"]:
            return _no_proxy(summary, app, "no statement of its client side was sent on at its server side")
        client, server = (app if app is not None and len(app) else front), (db if db is not None and len(db) else back)
        # client -> front and back -> server: the same TCP connections seen at two points
        (cf, summary["app_proxy"], proxy_to_app), (bs, summary["proxy_db"], db_to_proxy) = _hops(
            app if client is not front else None, front, back, db if server is not back else None, points or {})
        c_f = cf
        c_b = _take(fb, c_f, NONE)
        c_s = _take(bs, c_b, NONE)
        how_c = _take(how_f, c_f, None).astype(object)
        cand_c = _take(cand_f, c_f, 0)
        how_c[(c_f < 0)] = "unseen-at-proxy" if client is not front else None
        # proxy-side times per client row, proxy clock
        p1 = _take(ts_ns_or(front.ex["req_first_ts"], BIG), c_f, BIG)
        p4 = _take(ts_ns_or(front.ex["resp_last_ts"], BIG), c_f, BIG)
        p2 = _take(ts_ns_or(back.ex["req_first_ts"], BIG), c_b, BIG)
        p3 = _take(ts_ns_or(back.ex["resp_last_ts"], BIG), c_b, BIG)
        front_conn_id = _take(front.ex["conn_id"].to_numpy(dtype="float64", na_value=np.nan), c_f, np.nan)
        s_status = np.full(len(server), None, dtype=object)
        if server is back:
            s_status[:] = back_status
        else:
            sb = np.full(len(server), NONE, dtype=np.int64)
            sb[bs[bs >= 0]] = np.flatnonzero(bs >= 0)
            s_status[sb >= 0] = back_status[sb[sb >= 0]]
            s_status[sb < 0] = "unseen-at-proxy"
        # clocks: server times onto the client clock; proxy times onto the client clock
        single_proxy_db = next(iter(db_to_proxy.values()), None)
        single_proxy_app = proxy_to_app
        server_ex = server.ex
        server_raw = (ts_ns_or(server.ex["req_first_ts"], BIG), ts_ns_or(server.ex["resp_last_ts"], BIG))
        if server is not back and single_proxy_db is not None:
            if client is front:
                for cap in set(front.ex["capture"].astype(str)):
                    clocks[cap] = single_proxy_db
            else:  # DB -> proxy here, proxy -> app in build_table
                server_ex = server.ex.copy()
                for col in ("req_first_ts", "resp_last_ts"):
                    raw = ts_ns_or(server.ex[col], BIG)
                    ok = raw != BIG
                    conv = raw.copy()
                    conv[ok] = np.asarray(single_proxy_db.db_to_app(raw[ok]))
                    server_ex[col] = pd.Series(np.where(ok, conv, 0).astype("datetime64[ns]")).dt.tz_localize("UTC").where(ok).array
        if client is not front:
            clocks.update(single_proxy_app)
            model = next(iter(single_proxy_app.values()), None)
            if model is not None:
                for arr in (p1, p2, p3, p4):
                    ok = arr != BIG
                    arr[ok] = np.asarray(model.db_to_app(arr[ok]))
        summary["clocks"] = {
            "app_proxy": {k: v.summary(int(ts_ns_or(front.ex["req_first_ts"], BIG).min())) for k, v in proxy_to_app.items()}
            if client is not front else None,
            "proxy_db": {k: v.summary(int(server_raw[0][server_raw[0] != BIG].min())) for k, v in db_to_proxy.items()}
            if server is not back and len(server) else None,
        }
        client_is_front, server_is_back = client is front, server is back
        server = Side(server_ex, server.conns)
    else:
        client_is_front = server_is_back = False
        if app is None or db is None or not len(app) or not len(db):
            return None
        direct = direct if direct is not None else match_exchanges(app.ex, db.ex, app.conns, db.conns)
        if direct.matched_at_least(PROXY_SIGN * min(len(app), len(db))):
            return None
        m4, l4_pairs = match_l4(app.ex, app.conns, db.ex, db.conns)
        client, server = app, db
        server_raw = (ts_ns_or(db.ex["req_first_ts"], BIG), ts_ns_or(db.ex["resp_last_ts"], BIG))
        if l4_pairs and m4.stats.matched > direct.matched:
            kind = "l4"
            c_s = _rows_map(m4, len(app))
            how_c = np.where(c_s >= 0, "l4", None).astype(object)
            cand_c = np.where(c_s >= 0, 1, 0)
            s_status = np.full(len(db), "unpaired", dtype=object)
            s_status[c_s[c_s >= 0]] = "paired"
            bounds = pair_bounds(np.flatnonzero(c_s >= 0), c_s[c_s >= 0], app.ex, db.ex)
            summary["through"] = {"kind": "l4", "connection_pairs": l4_pairs, "paired": int((c_s >= 0).sum())}
            clock_info = None
        else:
            pairs, model, clock_info = match_l7_across_hosts(app.ex, db.ex)
            if len(pairs.front_row) == 0:
                return None
            kind = "l7"
            c_s, how_c, cand_c = _l7_arrays(pairs, len(app))
            s_status = pairs.back_status
            bounds = None
            summary["through"] = {"kind": "l7", **pairs.stats}
            if model is not None:
                clocks = {cap: model for cap in set(app.ex["capture"].astype(str))}
        if bounds is not None and np.isfinite(bounds[0]) and bounds[0] <= bounds[1]:
            at = int(ts_ns_or(app.ex["req_first_ts"], BIG).min())
            model = constant_clock((bounds[0] + bounds[1]) / 2, bounds[0], bounds[1], at, int((c_s >= 0).sum()))
            clocks = {cap: model for cap in set(app.ex["capture"].astype(str))}
            clock_info = {"offset_s": (bounds[0] + bounds[1]) / 2e9, "offset_bounds_s": [bounds[0] / 1e9, bounds[1] / 1e9],
                          "quality": "statement-order"}
        summary["clocks"] = {"app_db": clock_info}
        warnings.append(f"app and DB captures are of different TCP connections: paired through an {kind.upper()} "
                        "proxy; without a capture on the proxy host its time is part of network_s")
        n = len(app)
        p1 = p2 = p3 = p4 = np.full(n, BIG, dtype=np.int64)
        front_conn_id = app.ex["conn_id"].to_numpy(dtype="float64", na_value=np.nan)
    summary["kind"] = kind

    # --- the Matching between client and server rows
    n_c, n_s = len(client), len(server)
    paired_c = np.flatnonzero(c_s >= 0)
    paired_s = c_s[paired_c]
    only_c = np.flatnonzero(c_s < 0)
    only_s = np.setdiff1d(np.arange(n_s, dtype=np.int64), paired_s)
    app_row = np.concatenate([paired_c, only_c, np.full(len(only_s), NONE, dtype=np.int64)])
    db_row = np.concatenate([paired_s, np.full(len(only_c), NONE, dtype=np.int64), only_s])
    how_rows = np.concatenate([how_c[paired_c], how_c[only_c], s_status[only_s]]).astype(object)
    server_only = how_rows[len(paired_c) + len(only_c):]
    server_only[server_only == "paired"] = "unseen-at-app"  # paired at the proxy, but the app capture missed it
    notes = np.array(["" if not isinstance(h, str) or h in PAIRED_KINDS else (h if h.startswith("proxy-") else f"proxy-{h}")
                      for h in how_rows], dtype=object)
    stats = MatchStats(app_exchanges=n_c, db_exchanges=n_s, matched=len(paired_c), app_only=len(only_c),
                       db_only=len(only_s), conflicts=0, connections_matched=0, connections_by_scramble=0,
                       connections_nat=0, connections_vetoed=0)
    matching = Matching(app_row, db_row, notes, pd.DataFrame(columns=["app_conn", "db_conn", "nat", "by_scramble"]),
                        stats)

    # --- the proxy's share per row (seconds); needs the client- and server-side points, filled in by finish()
    rows_c = np.concatenate([paired_c, only_c, np.full(len(only_s), NONE, dtype=np.int64)])
    cand = _take(np.asarray(cand_c, dtype=np.int64), rows_c, 0)
    columns = {
        "proxy_match": how_rows,
        "proxy_candidates": np.where(np.isin(how_rows.astype(str), ["l7-text", "l7-rewritten", "l7-params", "ambiguous"]),
                                     cand, -1),
        "front_conn_id": _take(front_conn_id, rows_c, np.nan),
        "_p1": _take(p1, rows_c, BIG), "_p2": _take(p2, rows_c, BIG),
        "_p3": _take(p3, rows_c, BIG), "_p4": _take(p4, rows_c, BIG),
    }
    counts = pd.Series(how_rows).value_counts(dropna=True)
    summary["exchanges"] = {str(k): int(v) for k, v in counts.items()}
    return ProxyResult(client, server, matching, clocks, server_raw, columns, summary, warnings, client_is_front,
                       server_is_back)


def _no_proxy(summary: dict, app: Side | None, why: str) -> NoProxy:
    role = "left out (the app capture is the client side)" if app is not None else "analysed as the app capture"
    summary.update(kind=None, note=f"no proxy in its traffic ({why}): {role}")
    return NoProxy(summary["note"], summary)


def finish(table: pd.DataFrame, result: ProxyResult) -> pd.DataFrame:
    """After build_table: the DB side's connection id where the DB saw the exchange (the thread pool's key; behind an
    L7 proxy the app's is the proxy's own), the DB clock times the slow-log join reads, and the proxy's columns."""
    dr = result.matching.db_row
    has_d = dr >= 0
    s_conn = _take(result.server.ex["conn_id"].to_numpy(dtype="float64", na_value=np.nan), dr, np.nan)
    conn = table["conn_id"].to_numpy(dtype="float64", na_value=np.nan)
    conn = np.where(has_d & ~np.isnan(s_conn), s_conn, conn)
    if result.summary.get("kind") == "l7":
        # the client side's id is the proxy's own (front_conn_id), no thread of the DB: a request not paired to a
        # server request has no server connection, and so no thread group
        conn = np.where(has_d, conn, np.nan)
    table["conn_id"] = pd.array(np.where(np.isnan(conn), 0, conn).astype(np.int64), dtype="Int64")
    table.loc[np.isnan(conn), "conn_id"] = pd.NA
    d1_raw, d4_raw = result.server_raw
    d1 = _take(d1_raw, dr, BIG)
    d4 = _take(d4_raw, dr, BIG)
    ok = has_d & (d1 != BIG) & (d4 != BIG)
    table["_d1_raw"] = np.where(ok, d1, table["_d1_raw"].to_numpy())
    table["_d4_raw"] = np.where(ok, d4, table["_d4_raw"].to_numpy())
    cols = result.columns
    p1, p2, p3, p4 = (cols[k] for k in ("_p1", "_p2", "_p3", "_p4"))
    a1, a4 = (ts_ns_or(table[c], BIG) for c in ("app_req_ts", "app_resp_ts"))
    q1, q4 = (ts_ns_or(table[c], BIG) for c in ("db_req_ts", "db_resp_ts"))

    def seconds(x: np.ndarray, valid: np.ndarray) -> pd.Series:
        return pd.Series(np.where(valid, x / 1e9, np.nan), dtype="float64")

    have_p = (p1 != BIG) & (p2 != BIG) & (p3 != BIG) & (p4 != BIG)
    front_only = (p1 != BIG) & (p4 != BIG)  # seen at the proxy's client side (paired across it or not)
    handled = np.asarray(pd.Series(cols["proxy_match"], dtype=object) == "proxy-handled") & front_only
    table["proxy_match"] = pd.Categorical(pd.Series(cols["proxy_match"], dtype=object).where(
        pd.notna(cols["proxy_match"]), None))
    table["proxy_candidates"] = pd.array(np.where(cols["proxy_candidates"] < 0, 0, cols["proxy_candidates"]), dtype="Int64")
    table.loc[cols["proxy_candidates"] < 0, "proxy_candidates"] = pd.NA
    fc = cols["front_conn_id"]
    table["front_conn_id"] = pd.array(np.where(np.isnan(fc), 0, fc).astype(np.int64), dtype="Int64")
    table.loc[np.isnan(fc), "front_conn_id"] = pd.NA
    a_ok = (a1 != BIG) & (a4 != BIG) & front_only & (not result.client_is_front)
    d_ok = (q1 != BIG) & (q4 != BIG) & have_p & (not result.server_is_back)
    for col, ns in zip(PROXY_TIME_COLUMNS, (p1, p2, p3, p4)):
        table[col] = to_ts(ns, ns != BIG)
    table["net_app_proxy_s"] = seconds((p1 - a1) + (a4 - p4), a_ok)
    # a command the proxy answers itself spends all of P1 → P4 inside it
    table["proxy_s"] = seconds(np.where(handled, p4 - p1, (p2 - p1) + (p4 - p3)), have_p | handled)
    table["proxy_wait_s"] = seconds(p2 - p1, have_p)
    table["net_proxy_db_s"] = seconds((q1 - p2) + (p3 - q4), d_ok)
    return table


def empty_columns(table: pd.DataFrame) -> pd.DataFrame:
    """The proxy columns, all null, for an analysis without a proxy."""
    n = len(table)
    # (as pd.Categorical([None] * n) and pd.array([pd.NA] * n, dtype="Int64") make them, without n objects)
    table["proxy_match"] = pd.Categorical.from_codes(np.full(n, -1, dtype=np.int8),
                                                     dtype=pd.CategoricalDtype(pd.Index([], dtype="float64")))
    for col in ("proxy_candidates", "front_conn_id"):  # null in every row: no bytes per row (tables.null_column)
        table[col] = null_column(n, "Int64")
    for col in ("net_app_proxy_s", "proxy_s", "proxy_wait_s", "net_proxy_db_s"):
        table[col] = null_column(n, "float64")
    for col in PROXY_TIME_COLUMNS:
        table[col] = null_column(n, TS)
    return table


def sentence(table: pd.DataFrame, summary: dict) -> str:
    """One line for the verdict: where the time went through the proxy, from the columns that were measured."""
    kind = summary.get("kind", "")
    paired = table["proxy_match"].isin(PAIRED_KINDS).to_numpy()
    client = table["app_req_ts"].notna().to_numpy()
    text = (f"Through an {kind.upper()} proxy: {int(paired.sum())} of the {int(client.sum())} client exchanges paired "
            "across it")
    amb = int((table["proxy_match"] == "ambiguous").sum())
    if amb:
        text += f" ({amb} ambiguous, left unpaired)"
    wait = table["proxy_wait_s"].dropna()
    if len(wait):
        total = table["total_s"].where(paired).sum()
        parts = []
        for col, label in (("net_app_proxy_s", "app-proxy network"), ("proxy_s", "inside the proxy"),
                           ("net_proxy_db_s", "proxy-DB network"), ("server_s", "inside the DB")):
            v = table[col].where(paired).dropna()
            if len(v) and total > 0:
                parts.append(f"{label} {100 * v.sum() / total:.1f} %")
        text += (f"; statements waited inside the proxy up to {wait.max():.3f} s (p50 {wait.median():.3f} s) before "
                 f"it sent them on")
        if parts:
            text += f"; of the time clients waited on the paired ones: {', '.join(parts)}"
    elif not (summary.get("points") or {}).get("proxy"):
        text += "; without a capture on the proxy host its time is part of network_s"
    return text + "."
