"""The narrow views' functions as they were before they read arrays (main 03fbd4e): the thread-pool view's rows
read column by column from the table, the likely waits with their classes numbered inside, the slow-log join's
slots made row by row. tests/test_views.py compares today's functions with these on real captures."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pcapdecomp.core.groups import equals
from pcapdecomp.core.times import ts_ns
from pcapdecomp.explain.decompose import (FINGERPRINT_MIN_SAMPLES, LIKELY_COVER, LIKELY_MIN_WAIT_S, LIKELY_SPREAD, NS,
                                          STALL_MIN_QUEUE_S, _group_quantiles, _text_codes, covered_ns,
                                          interval_union)
from pcapdecomp.explain.threadpool import robust_span
from pcapdecomp.slowlog import join as slowjoin


def class_codes_before(command: pd.Series, fingerprint: pd.Series) -> tuple[np.ndarray, int]:
    command_codes = _text_codes(command)
    fingerprint_codes = _text_codes(fingerprint)
    if len(command_codes) == 0:
        return command_codes, 0
    codes, uniques = pd.factorize(command_codes * (int(fingerprint_codes.max()) + 1) + fingerprint_codes)
    return codes, len(uniques)


def likely_waits_before(t: pd.DataFrame, server, exec_s, measured, open_) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, exec_s, p90) as decompose.likely_waits gave them."""
    n = len(t)
    out = [np.zeros(n, dtype=bool), np.full(n, np.nan), np.full(n, np.nan)]
    if n == 0 or "_d1_raw" not in t.columns:
        return tuple(out)
    d1 = np.asarray(t["_d1_raw"], dtype=np.int64)
    d4 = np.asarray(t["_d4_raw"], dtype=np.int64)
    valid = np.asarray(t["_t_valid"], dtype=bool) & ~np.isnan(server) & (d4 >= d1)
    codes, groups = class_codes_before(t["command"], t["fingerprint"])
    runs = open_ & valid & (codes >= 0)
    if not runs.any():
        return tuple(out)
    sizes = np.bincount(codes[runs], minlength=groups)
    (median_all,) = _group_quantiles(codes[runs], server[runs], groups, (0.5,))
    row_size = np.where(codes >= 0, sizes[np.maximum(codes, 0)], 0)
    row_median_all = np.where(codes >= 0, median_all[np.maximum(codes, 0)], np.nan)
    long_open = runs & (server >= STALL_MIN_QUEUE_S) & ((row_size < FINGERPRINT_MIN_SAMPLES)
                                                       | (np.nan_to_num(row_median_all) >= STALL_MIN_QUEUE_S))
    long_measured = measured & valid & (np.nan_to_num(exec_s) >= STALL_MIN_QUEUE_S)
    long_ = long_open | long_measured
    x_start = np.where(long_measured, np.maximum(d4 - np.rint(np.nan_to_num(exec_s) * NS).astype(np.int64), d1), d1)
    lo, hi = interval_union(x_start[long_], d4[long_])
    clean = runs & ~long_ & (covered_ns(lo, hi, d1, d4) == 0)
    if not clean.any():
        return tuple(out)
    counts = np.bincount(codes[clean], minlength=groups)
    median, p90 = _group_quantiles(codes[clean], server[clean], groups, (0.5, 0.9))
    has = counts >= FINGERPRINT_MIN_SAMPLES
    median[~has] = np.nan
    c = np.maximum(codes, 0)
    typical = np.where(codes >= 0, median[c], np.nan)
    spread = np.where(codes >= 0, p90[c], np.nan) - typical
    known = runs & ~long_open & ~np.isnan(typical)
    wait = np.where(known, server - np.nan_to_num(typical), 0.0)
    far = known & (wait >= np.maximum(LIKELY_MIN_WAIT_S, LIKELY_SPREAD * np.nan_to_num(spread)))
    wait_ns = np.rint(wait * NS).astype(np.int64)
    held = covered_ns(lo, hi, d1, d1 + wait_ns) >= LIKELY_COVER * wait_ns
    return far & held, np.where(known, typical, np.nan), np.where(known, typical + spread, np.nan)


def _ns_of(seconds: np.ndarray) -> np.ndarray:
    out = np.nan_to_num(seconds)
    out *= NS
    return np.rint(out, out=out)


def rows_before(t: pd.DataFrame, threshold_ns: int) -> tuple[dict, np.ndarray, int, int]:
    """threadpool._rows' arrays (a dict by field name), outlier rows, t0, t1, as they were made."""
    d1_all, v1 = ts_ns(t["db_req_ts"])
    d4_all, v4 = ts_ns(t["db_resp_ts"])
    valid = v1 & v4
    every = bool(valid.all())
    pos = np.flatnonzero(valid)
    d1, d4 = (d1_all, d4_all) if every else (d1_all[pos], d4_all[pos])
    keep, t0, t1 = robust_span(d1, d4)
    outliers = pos[~keep]
    if not keep.all():
        every = False
        pos, d1, d4 = pos[keep], d1[keep], d4[keep]

    def of_pos(values):
        return values if every else values[pos]

    def col(name):
        return of_pos(t[name].to_numpy(dtype="float64", na_value=np.nan))

    exec_s, queue_s, qmin = col("exec_s"), col("queue_s"), col("queue_min_s")
    upper_bound = of_pos(equals(t["exec_source"], "below_long_query_time"))
    server = d4 - d1
    fill = np.isnan(exec_s) & upper_bound
    if fill.any():
        exec_s = exec_s.copy()
        exec_s[fill] = server[fill] / NS - np.nan_to_num(qmin[fill])
    exec_known = ~np.isnan(exec_s)
    exec_ns = _ns_of(exec_s)
    np.copyto(exec_ns, server, where=~exec_known)
    exec_ns = exec_ns.astype(np.int64)
    long_exec = exec_known & (exec_ns >= threshold_ns)
    xs = np.maximum(d4 - exec_ns, d1)
    q_end = np.minimum(_ns_of(queue_s).astype(np.int64) + d1, d4)
    q_min = _ns_of(qmin).astype(np.int64)
    conn = of_pos(t["conn_id"].astype("Int64").to_numpy(dtype="int64", na_value=-1))
    likely = of_pos(equals(t["queue_source"], "likely"))
    told = np.where(likely, q_end - d1, q_min)
    victim = told >= threshold_ns
    culprit_ok = long_exec & (~upper_bound | ~victim)
    measured = of_pos(equals(t["queue_source"], "measured"))
    srv = of_pos(pd.factorize(t["server"])[0].astype(np.int64))
    return ({"pos": pos, "d1": d1, "d4": d4, "xs": xs, "exec_known": exec_known, "q_end": q_end, "q_min": q_min,
             "server": server, "conn": conn, "measured": measured, "likely": likely, "culprit_ok": culprit_ok,
             "srv": srv}, outliers, t0, t1)


class SlotsBefore(slowjoin._Slots):
    """_Slots with its exchanges' slots made row by row, each text put in its logged form and split for every row
    (the executes of whole prepared texts as _Slots makes them)."""

    def __init__(self, rows, templates, wanted):
        self.row = slowjoin.array.array("q")
        self.k, self.keys, self.text_of = [], [], []
        self.by_key = slowjoin.defaultdict(list)
        self.template_parts = templates.parts
        self.cut_prefixes = set()
        command_of = [rows.commands[c] if c >= 0 else None for c in rows.command_code.tolist()]
        sql_of = [rows.sqls[c] if c >= 0 else None for c in rows.sql_code.tolist()]
        others = np.ones(rows.n, dtype=bool)
        others[templates.rows] = False
        for r in np.flatnonzero(rows.timed & others).tolist():
            command, sql = command_of[r], sql_of[r]
            if command == slowjoin.ENCRYPTED:
                self._add(r, 0, (slowjoin.ANY_TEXT,), None)
                continue
            if command in slowjoin.ADMIN_NAMES:
                self._add(r, 0, (("c", slowjoin.ADMIN_NAMES[command]),), None)
                continue
            if sql is None or command in slowjoin.EXECUTES:
                continue
            if rows.sql_cut[r]:
                text = slowjoin._LEFT(sql).rstrip("\ufffd")
                parts = slowjoin.statements(text)
                for k, part in enumerate(parts[:-1]):
                    self._add(r, k, (("t", part),), part)
                prefix = parts[-1] if len(parts) > 1 else text
                if len(prefix) >= slowjoin.MIN_PREFIX_CHARS:
                    self.cut_prefixes.add(prefix)
                    self._add(r, len(parts) - 1, (("p", prefix),), prefix)
                continue
            text = slowjoin.logged_form(sql)
            parts = slowjoin.statements(text)
            if len(parts) == 1:
                self._add(r, 0, (("t", text),), text)
            else:
                for k, part in enumerate(parts):
                    self._add(r, k, tuple([("t", part)] + ([("t", text)] if k == 0 else [])), part)
        chosen = np.flatnonzero(wanted.select(rows.conn_id[templates.rows], templates.tid))
        keys, code = slowjoin._execute_keys(rows, templates.rows[chosen], templates.tid[chosen], wanted.could_be)
        asked = np.array([key in wanted.keys for key in keys] + [False], dtype=bool)[code]
        self._add_executes(templates.rows[chosen[asked]], keys, code[asked])
