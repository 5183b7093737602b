"""Decomposition stage: one row per exchange with its four points (A1, D1, D4, A4), the split of its latency into
network / queueing / execution (and how each is known), the slow-log join and the hidden-slow flags. The thread-pool
view (groups, stalls, culprits, the thread limit, thread_pool_size inferred) is pcapdecomp/explain/threadpool.py.

Why queue = server − exec: MariaDB's and Percona's thread pools stamp a statement's start (`thd->start_utime`)
only when a worker dequeues it, and the slow log's Query_time counts from there, so the time a request waited in
the pool's queue is inside D4 − D1 and outside Query_time (docs/method notes). A statement that is slow on the
wire but absent from the slow log (and not flagged SERVER_QUERY_WAS_SLOW) spent its time *before* execution:
hidden_slow.

All arithmetic is on int64 ns; seconds are made once, for the output columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..core.fingerprint import digest_fingerprint, fingerprint, query_id
from ..core.exact import masked_sums
from ..core.groups import sorted_by_group
from ..core.tables import (LET_GO_COLUMNS_FROM_ROWS, as_category, concat_column, held, labelled, null_boolean,
                            null_int64)
from ..core.times import to_ts, ts_ns
from ..mysql.connection import ENCRYPTED_COMMAND
from ..pair.match import Matching
from ..slowlog.join import SlowLogJoin, join_slow_log, rows_for_join

if TYPE_CHECKING:
    from ..pair.clock import ClockModel  # imported by a run that fits clocks (pair.pairing)

NS = 1_000_000_000
FINGERPRINT_MIN_SAMPLES = 5  # fast executions of a (command, fingerprint) needed before their median stands for execution
ESTIMATE_MAX_SPREAD = 2.0  # … and they must agree: p90 − p10 at most this many medians
STALL_MIN_QUEUE_S = 0.1  # a request that queued this long counts toward a stalled stretch of its thread group
LIKELY_MIN_WAIT_S = 0.01  # a likely wait is at least this far above its class's typical execution …
LIKELY_SPREAD = 4.0  # … and this many times the class's usual spread above it (p90 − median of its clean runs)
LIKELY_COVER = 0.5  # … and a long statement executed during at least this share of it
ROWS_AT_ONCE = 1 << 16  # row-wise arithmetic of every row is done this many rows at a time where its temporaries
# would otherwise be several arrays of every row (covered_ns, seconds to nanoseconds)
# exec_source's values, and queue_source's (measured: from the slow log; estimated: from the fingerprint's median;
# likely: far above the class's typical execution while a long statement executed, see likely_waits)
EXEC_SOURCES = ["slow_log", "fingerprint_median", "flagged_slow", "below_long_query_time"]
SLOW_LOG, FINGERPRINT_MEDIAN, FLAGGED_SLOW, BELOW_LONG_QUERY_TIME = range(len(EXEC_SOURCES))
QUEUE_SOURCES = ["measured", "estimated", "lower_bound", "likely"]


# --- the decomposed table --------------------------------------------------------------------------------------


def _side_ts(side: pd.DataFrame, col: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps (int64 ns, valid mask) of `side`'s rows at positions `rows` (-1: not seen there)."""
    present = rows >= 0
    if len(side) == 0:
        return np.zeros(len(rows), dtype=np.int64), np.zeros(len(rows), dtype=bool)
    values, valid = ts_ns(side[col].iloc[np.where(present, rows, 0)])
    return values, valid & present


def _seconds(ns: np.ndarray, valid: np.ndarray) -> np.ndarray:
    out = ns / 1e9
    out[~valid] = np.nan
    return out


def _rows_of(app: pd.DataFrame, db: pd.DataFrame, ar: np.ndarray, dr: np.ndarray) -> pd.DataFrame:
    """Row k is app row ar[k] where the app saw exchange k, else DB row dr[k]; built one column at a time, each
    app column dropped from `app` once taken (the caller passes a table it no longer needs), so the peak is the
    tables plus one column, not two copies of the app side."""
    has_a = ar >= 0
    a_rows = ar[has_a]
    all_app = bool(has_a.all())
    if not all_app:  # the app rows then the DB-only rows, put back in exchange order
        order = np.concatenate([np.flatnonzero(has_a), np.flatnonzero(~has_a)])
        position = np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order))
        d_rows = dr[~has_a]
    names = list(app.columns)
    data = {}
    in_order = all_app and len(a_rows) == len(app) and bool((a_rows == np.arange(len(a_rows))).all())
    # no app row (a DB capture alone): the DB rows in their order, taken as they are (concatenated to the empty
    # app column still, for the dtype and categories the two give)
    db_alone = not all_app and not len(a_rows) and len(d_rows) == len(db) and \
        bool((d_rows == np.arange(len(d_rows))).all())
    for c in names:  # each column in the form its values decide (tables.held: a take of a column of one value
        # is a dense copy, a concatenation of int32 and int64 parts int64)
        if in_order:  # every app row, in its order (every exchange matched): the column as it is
            data[c] = app[c].reset_index(drop=True)
        elif all_app:
            data[c] = held(app[c].take(a_rows).reset_index(drop=True))
        elif db_alone:
            data[c] = held(concat_column([app[c].take(a_rows), db[c]]).reset_index(drop=True))
        else:
            data[c] = held(concat_column([app[c].take(a_rows), db[c].take(d_rows)]).take(position)
                           .reset_index(drop=True))
        if len(app) >= LET_GO_COLUMNS_FROM_ROWS:
            del app[c]
    return pd.DataFrame(data, columns=names, copy=False)


STATEMENT_COLUMNS = ("sql", "fingerprint", "query_id", "params")


def _statements_from_db(base: pd.DataFrame, db_column, both: np.ndarray) -> None:
    """Where both points saw an exchange and only the DB knows its statement (an EXECUTE whose PREPARE the app's
    capture did not hold: sent before it began, or lost there and not repaired), the statement's columns from the
    DB side (the app side's are null, or the placeholder fingerprint of an unknown statement). Its problems keep the
    app's `unknown-statement`: that is what the app's capture held."""
    known = db_column("sql").notna().to_numpy()
    take = both & base["sql"].isna().to_numpy() & known
    if not take.any():
        return
    for col in STATEMENT_COLUMNS:
        values = base[col].astype(object).to_numpy(copy=True)
        values[take] = db_column(col).astype(object).to_numpy()[take]
        values[pd.isna(values)] = None
        base[col] = as_category(values) if isinstance(base[col].dtype, pd.CategoricalDtype) else \
            pd.array(values, dtype=base[col].dtype)


def _merged_problems(app_side: pd.Series, db_side: pd.Series, both: np.ndarray) -> pd.Series:
    """Where both points saw the exchange, the problems of both (each listed once); elsewhere the app side's.
    Worked out once per distinct pair of texts, not once per row."""
    if not both.any():
        return app_side
    a, d = app_side.astype("category"), db_side.astype("category")
    a_text, d_text = [""] + list(a.cat.categories), [""] + list(d.cat.categories)  # index 0: null
    width = len(d_text)
    key = (a.cat.codes.to_numpy(np.int64) + 1) * width + (d.cat.codes.to_numpy(np.int64) + 1)
    which, pairs = pd.factorize(key[both])  # the distinct pairs (a hash: few of them, many rows)
    merged = [",".join(dict.fromkeys(p for p in f"{a_text[k // width]},{d_text[k % width]}".split(",") if p))
              for k in pairs]
    out = a.astype(object).to_numpy(copy=True)
    out[both] = np.asarray(merged, dtype=object)[which]
    return as_category(out)


def _clock_rows(capture: pd.Series, has_a: np.ndarray, primary_app: str | None, clock_keys: np.ndarray | None,
                name: str) -> np.ndarray:
    """The rows whose DB times go through clock `name`: with several DB points, those `clock_keys` names (one per
    row: analysis.py); else the rows of app capture `name`, and the DB-only rows when it is the primary one. On
    the capture column's codes when it is categorical, not a string comparison per row."""
    if clock_keys is not None:
        return clock_keys == name
    if isinstance(capture.dtype, pd.CategoricalDtype):
        categories = capture.cat.categories
        code = categories.get_loc(name) if name in categories else -2
        of_capture = capture.cat.codes.to_numpy() == code
    else:
        of_capture = capture.astype(object).to_numpy() == name
    return np.where(has_a, of_capture, primary_app == name)


def build_table(app: pd.DataFrame, db: pd.DataFrame, matching: Matching, clocks: dict[str, ClockModel],
                primary_app: str | None, clock_keys: np.ndarray | None = None, bounds=None) -> pd.DataFrame:
    """One row per exchange: the foundation's columns (from the app side when seen there, else the DB side),
    conn_id / server flag / status from whichever side has them, and the four points on the app clock.
    The app table's columns are consumed (moved into the result): pass a table that is not needed afterwards.
    `bounds`: bounds.point_bounds' PointBounds, whose points bounds.apply_bounds leaves null (a bound is not a
    measurement) with what depends on them: left null here already, as the columns are made, not by a copy of
    each column afterwards (nine columns of every row); the four points' times at its rows
    as they were before go to `bounds.measured_ns` for apply_bounds."""
    ar, dr = matching.app_row, matching.db_row
    has_a, has_d = ar >= 0, dr >= 0
    n = len(ar)
    base = _rows_of(app, db, ar, dr)
    seen_d = pd.Series(has_d)
    d_rows = np.where(has_d, dr, 0)
    every_d = bool(has_d.all()) and len(dr) == len(db) and bool((dr == np.arange(len(dr))).all())

    def db_column(name: str) -> pd.Series:
        """The DB side's `name` for every row; null where the DB did not see the exchange."""
        if every_d:  # every DB row, in its order
            return db[name].reset_index(drop=True)
        return db[name].iloc[d_rows].reset_index(drop=True).where(seen_d)

    if len(db):
        for col in ("conn_id", "status_flags", "server_flag_slow"):
            if base[col].isna().any():
                base[col] = base[col].where(base[col].notna(), db_column(col))
        _statements_from_db(base, db_column, has_a & has_d)
        base["problems"] = _merged_problems(base["problems"], db_column("problems"), has_a & has_d)
        base["db_client"] = db_column("client")
        base["db_req_first_frame"] = held(db_column("req_first_frame").astype("Int64"))
        base["db_resp_last_frame"] = held(db_column("resp_last_frame").astype("Int64"))
    else:
        base["db_client"] = labelled(np.full(n, -1), [])
        base["db_req_first_frame"] = pd.Series(null_int64(n))
        base["db_resp_last_frame"] = pd.Series(null_int64(n))
    seen_codes = np.where(has_a & has_d, 1, np.where(has_a, 0, 2)).astype(np.int8)
    base["seen"] = pd.Categorical.from_codes(seen_codes, categories=["app", "both", "db"])
    notes = np.asarray(matching.notes, dtype=object)
    base["match_notes"] = as_category(np.where(notes == "", None, notes))

    # the app side's times are in base, on the rows the app saw (its columns are gone from `app` by now)
    a1, a1v = ts_ns(base["req_first_ts"])
    a4, a4v = ts_ns(base["resp_last_ts"])
    a1v &= has_a
    a4v &= has_a
    d1_raw, d1v = _side_ts(db, "req_first_ts", dr)
    d4_raw, d4v = _side_ts(db, "resp_last_ts", dr)
    # DB times onto the app clock of the capture that saw the exchange (DB-only rows: the primary app capture's)
    d1, d4 = d1_raw.copy(), d4_raw.copy()
    for name, model in clocks.items():
        sel = _clock_rows(base["capture"], has_a, primary_app, clock_keys, name) & has_d
        if sel.any() and model.segments:
            d1[sel] = np.asarray(model.db_to_app(d1_raw[sel]))
            d4[sel] = np.asarray(model.db_to_app(d4_raw[sel]))
    total_v, server_v = a1v & a4v, d1v & d4v
    net_v = total_v & server_v
    # kept for the slow-log join and the group view (DB-clock times for the former): not written out
    d1_raw_out = np.where(d1v, d1_raw, np.where(a1v, a1, 0))
    d4_raw_out = np.where(d4v, d4_raw, np.where(a4v, a4, 0))
    t_valid = (d1v & d4v) | (~has_d & a1v & a4v)
    req_v, resp_v = net_v & d1v, net_v & d4v
    shown = _unbounded(bounds, n, (a1, a1v), (a4, a4v), (d1, d1v), (d4, d4v))
    if shown is not None:  # apply_bounds' nulls: each point that is a bound and every duration that depends on it
        a1_free, a4_free, d1_free, d4_free = shown
        a1v, a4v, d1v, d4v = a1v & a1_free, a4v & a4_free, d1v & d1_free, d4v & d4_free
        total_free, server_free = a1_free & a4_free, d1_free & d4_free
        total_v, server_v, net_v = total_v & total_free, server_v & server_free, net_v & total_free & server_free
        req_v, resp_v = req_v & a1_free & d1_free, resp_v & a4_free & d4_free
        # the slow-log join and the group view read the DB times from _d*_raw: not from a bound
        t_valid &= server_free & ~(has_a & ~has_d & ~total_free)
    base["app_req_ts"] = to_ts(a1, a1v)
    base["app_resp_ts"] = to_ts(a4, a4v)
    base["db_req_ts"] = to_ts(d1, d1v)
    base["db_resp_ts"] = to_ts(d4, d4v)
    base["total_s"] = _seconds(a4 - a1, total_v)
    base["server_s"] = _seconds(d4 - d1, server_v)  # skew-corrected: both ends went through the clock model
    base["network_s"] = _seconds((a4 - a1) - (d4 - d1), net_v)
    base["net_req_s"] = _seconds(d1 - a1, req_v)
    base["net_resp_s"] = _seconds(a4 - d4, resp_v)
    base["_d1_raw"] = d1_raw_out
    base["_d4_raw"] = d4_raw_out
    base["_t_valid"] = t_valid
    return base.reset_index(drop=True)


def _unbounded(bounds, n: int, *points: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray] | None:
    """Per point (A1, A4, D1, D4 as `points` (int64 ns, valid) give them): the rows where it is not a bound of
    `bounds` (PointBounds); None without bounds. Sets `bounds.measured_ns`: the points' times at `bounds.rows`
    (float64, NaN where unknown), as the table's point columns hold them before the bounds are left null."""
    if bounds is None or not len(bounds.rows):
        return None
    rows = bounds.rows
    bounds.measured_ns = np.stack([np.where(valid[rows], ns[rows].astype(np.float64), np.nan)
                                   for ns, valid in points], axis=1)
    shown = []
    for k in range(len(points)):
        free = np.ones(n, dtype=bool)
        free[rows[bounds.named[:, k]]] = False
        shown.append(free)
    return shown


def decompose(table: pd.DataFrame, slow: pd.DataFrame | None, long_query_time: float | None,
              thread_pool_size: int | None, slow_name: str = "slow log") -> tuple[pd.DataFrame, SlowLogJoin]:
    """Add exec_s / exec_source / queue_s / in_slow_log / hidden_slow / thread_group to build_table's output."""
    t = table
    # The join's view: made only when there is a slow log to join (without one the join reads nothing but the
    # number of rows), and handed over (no name here holds it), so that the join lets it go once it has read it.
    join = join_slow_log(rows_for_join(t) if slow is not None and len(slow) else t.iloc[:, :0], slow, slow_name)
    joined = Joined(join.entry, join.query_time_ns, join.undecided, join.used)
    pipelined = pipelined_s(t)
    # the server's own time: what it took once the connection's earlier requests were answered (a pipelined
    # request waits in the connection, not in the pool: never queueing, never a stall)
    server = t["server_s"].to_numpy(dtype="float64", na_value=np.nan) - pipelined
    flag = t["server_flag_slow"].astype("boolean")
    flags = Flags(flag.notna().to_numpy(), flag.fillna(False).to_numpy(dtype=bool))
    # the execution classes, numbered once: the estimate and the likely waits both read them
    classes = class_codes(t["command"], t["fingerprint"])
    estimate = estimate_execution(classes, server, fast_runs(server, flags, joined.in_log, long_query_time))
    # TLS flights read without a key log share one fingerprint whatever their statement: no estimate from it
    estimate[(t["command"] == ENCRYPTED_COMMAND).to_numpy(dtype=bool, na_value=False)] = np.nan
    x = executions(server, flags, joined, estimate, long_query_time)
    likely = likely_waits(RawTimes.of(t), classes, server, x.exec_s, x.measured, x.open_)
    del classes
    t = with_queue_columns(t, server, x.has_server, pipelined, x.exec_s, x.source, x.by_fp, x.bound, x.certain,
                           likely)
    return with_join_columns(t, slow, joined, flags, server, long_query_time, thread_pool_size), join


@dataclass
class Joined:
    """What the decomposition reads of the slow-log join, per row (SlowLogJoin's, or a partition's rows' of it)."""

    entry: np.ndarray  # the first joined entry's position in the slow log, -1 when none
    query_time_ns: np.ndarray  # Σ Query_time of the joined entries
    undecided: np.ndarray  # may be the exchange of an entry that could not be joined: in the log or not
    used: bool  # the join joined some entry (else in_slow_log and what it decides stay null)

    @property
    def in_log(self) -> np.ndarray:
        return self.entry >= 0


@dataclass
class Flags:
    """The server's SERVER_QUERY_WAS_SLOW flag per row: whether the wire shows it, and whether it is set."""

    known: np.ndarray
    flagged: np.ndarray


@dataclass
class Executions:
    """`executions`' answer, per row."""

    exec_s: np.ndarray
    source: np.ndarray  # a code of EXEC_SOURCES; -1: unknown
    has_server: np.ndarray
    by_fp: np.ndarray  # estimated from the class's fast runs
    bound: np.ndarray  # known below long_query_time, nothing better
    certain: np.ndarray  # the queue whatever the estimates say
    measured: np.ndarray  # execution from the slow log or the flag (likely_waits' long measured statements)
    open_: np.ndarray  # execution unknown (likely_waits' runs)


def fast_runs(server: np.ndarray, flags: Flags, in_log: np.ndarray, long_query_time: float | None) -> np.ndarray:
    """The runs estimate_execution takes a class's estimate from: not in the slow log, not flagged, not above
    long_query_time."""
    return ~np.isnan(server) & ~in_log & ~flags.flagged & (server >= 0) & \
        (server <= long_query_time if long_query_time is not None else True)


def executions(server: np.ndarray, flags: Flags, joined: Joined, estimate: np.ndarray,
               long_query_time: float | None) -> Executions:
    """Per row, the execution as far as the slow log, the flag and the class estimate (`estimate`:
    estimate_execution's) tell it, before the likely waits: the same for the whole table (`decompose`) and for a
    partition's rows (partitioned_decompose)."""
    n = len(server)
    in_log, flagged, lqt = joined.in_log, flags.flagged, long_query_time
    exec_s = np.full(n, np.nan)
    source = np.full(n, -1, dtype=np.int8)  # a code of EXEC_SOURCES; -1: unknown
    if joined.used:
        exec_s[in_log] = joined.query_time_ns[in_log] / 1e9  # Σ over the statements of a multi-statement packet
        source[in_log] = SLOW_LOG
    # Known to have executed faster than long_query_time: the server did not flag it, or the slow log (in use)
    # does not hold it.
    known_fast = (flags.known & ~flagged) | (joined.used & ~in_log & ~joined.undecided & ~flagged)
    has_server = ~np.isnan(server)
    todo = has_server & ~in_log & ~flagged
    by_fp = todo & ~np.isnan(estimate)
    exec_s[by_fp] = estimate[by_fp]
    source[by_fp] = FINGERPRINT_MEDIAN
    # Flagged SERVER_QUERY_WAS_SLOW but not in the (missing) slow log: execution ≥ long_query_time, and at most
    # the server time; take the server time (queue_s 0 is then a lower bound).
    flagged_only = has_server & flagged & ~in_log
    exec_s[flagged_only] = server[flagged_only]
    source[flagged_only] = FLAGGED_SLOW
    # Known faster than long_query_time and nothing better: execution is only bounded (≤ min(server, lqt)), so
    # exec_s stays unknown (an upper bound is not an execution time) and queue_s is the certain lower bound.
    bound = todo & ~by_fp & known_fast if lqt is not None else np.zeros(n, dtype=bool)
    source[bound] = BELOW_LONG_QUERY_TIME
    # What is certain whatever the estimates say: a measured queue, or the server time beyond the longest the
    # execution can have taken (below long_query_time when the slow log or the flag says it was not slow).
    certain = np.zeros(n)
    certain[in_log] = np.maximum(server[in_log] - exec_s[in_log], 0.0)
    if lqt is not None:
        fast_bounded = has_server & ~in_log & known_fast
        certain[fast_bounded] = np.maximum(server[fast_bounded] - lqt, 0.0)
    certain = np.nan_to_num(certain)
    return Executions(exec_s, source, has_server, by_fp, bound, certain, in_log | flagged_only,
                      ~in_log & ~flagged & has_server)


def with_join_columns(t: pd.DataFrame, slow: pd.DataFrame | None, joined: Joined, flags: Flags, server: np.ndarray,
                      long_query_time: float | None, thread_pool_size: int | None) -> pd.DataFrame:
    """`t` (with_queue_columns' table) with in_slow_log, slow_log_line, hidden_slow, understated and thread_group,
    and the statement texts of ENCRYPTED rows from their entries: the same for the whole table and for a
    partition's rows."""
    n, lqt = len(t), long_query_time
    in_log, undecided, used, flagged = joined.in_log, joined.undecided, joined.used, flags.flagged
    has_server = ~np.isnan(server)
    t["in_slow_log"] = pd.array(in_log, dtype="boolean")
    t.loc[undecided, "in_slow_log"] = pd.NA
    if not used:
        t["in_slow_log"] = null_boolean(n)
    if used:
        _texts_from_slow_log(t, slow, joined.entry)
    lines = slow["line"].to_numpy()[np.maximum(joined.entry, 0)] if used else np.zeros(n, dtype=np.int64)
    t["slow_log_line"] = held(pd.Series(lines, dtype="Int64").where(in_log & used))
    evidence = used | flags.known
    if lqt is None:
        hidden = null_boolean(n)
    else:
        slow_wire = has_server & (server > lqt)
        hidden_np = slow_wire & ~flagged & ~(in_log & used)
        hidden = pd.array(hidden_np, dtype="boolean")
        hidden[~(evidence & has_server) | (undecided & used & slow_wire & ~flagged)] = pd.NA
    t["hidden_slow"] = hidden
    understated = pd.array(in_log & (np.nan_to_num(t["queue_min_s"].to_numpy()) >= STALL_MIN_QUEUE_S), dtype="boolean")
    if not used:
        understated = null_boolean(n)
    t["understated"] = understated
    if thread_pool_size:
        t["thread_group"] = (t["conn_id"].astype("Int64") % int(thread_pool_size)).astype("Int64")
    else:
        t["thread_group"] = null_int64(n)
    return t


def with_queue_columns(t: pd.DataFrame, server: np.ndarray, has_server: np.ndarray, pipelined: np.ndarray,
                       exec_s: np.ndarray, source: np.ndarray, by_fp: np.ndarray, bound: np.ndarray,
                       certain: np.ndarray, likely: LikelyWaits) -> pd.DataFrame:
    """`t` (a shallow copy) with pipelined_s, exec_s, exec_source, queue_s, queue_source and queue_min_s, from the
    execution estimates so far (`exec_s`, `source`: changed in place), the likely waits and the certain queue:
    the decomposition's last per-row step, the same for the whole table (`decompose`) and for a partition's rows
    (partitioned_decompose)."""
    exec_s[likely.rows] = likely.exec_s[likely.rows]
    source[likely.rows] = FINGERPRINT_MEDIAN
    # One typical execution per class, the clean runs' median: a server time within the class's usual range (≤ the
    # clean runs' p90) is all execution, one above it executed the median (estimate_execution's rule).
    typical = ~np.isnan(likely.exec_s) & ~likely.rows & ((by_fp & (exec_s < server)) | (source == BELOW_LONG_QUERY_TIME))
    exec_s[typical] = np.where(server[typical] <= likely.p90[typical], server[typical], likely.exec_s[typical])
    source[typical] = FINGERPRINT_MEDIAN
    bound &= source == BELOW_LONG_QUERY_TIME
    t = t.copy(deep=False)  # copy-on-write: the new columns do not touch the caller's table
    t["pipelined_s"] = np.where(np.isnan(server), np.nan, pipelined)
    t["exec_s"] = exec_s
    t["exec_source"] = labelled(source, EXEC_SOURCES)
    queue = np.where(np.isnan(exec_s) | ~has_server, np.nan, np.maximum(server - exec_s, 0.0))
    queue[bound] = certain[bound]
    queue[likely.rows] = np.maximum(queue[likely.rows], certain[likely.rows])
    t["queue_s"] = queue
    t["queue_source"] = labelled(np.select(
        [np.isnan(queue), source == SLOW_LOG, likely.rows, source == FINGERPRINT_MEDIAN], [-1, 0, 3, 1], 2),
        QUEUE_SOURCES)
    t["queue_min_s"] = np.where(has_server, certain, np.nan)
    return t


def _texts_from_slow_log(t: pd.DataFrame, slow: pd.DataFrame, entry: np.ndarray) -> None:
    """A TLS flight read without a key log (ENCRYPTED) that joined a slow-log entry takes the entry's statement
    text, and the fingerprint and Query ID of it: the only text such an exchange can have."""
    rows = (t["command"] == ENCRYPTED_COMMAND).to_numpy(dtype=bool, na_value=False) & (entry >= 0)
    if not rows.any():
        return
    texts = slow["sql"].astype(object).to_numpy()[entry[rows]]
    for column, value in (("sql", lambda s: s), ("fingerprint", fingerprint),
                          ("query_id", lambda s: query_id(digest_fingerprint(s)))):
        values = t[column].astype(object).to_numpy(copy=True)
        values[rows] = [value(s) if isinstance(s, str) else None for s in texts]
        t[column] = as_category(values)


def pipelined_s(t: pd.DataFrame) -> np.ndarray:
    """Per exchange (build_table's columns), seconds its request waited at the DB behind the same connection's
    earlier requests (it arrived before they were answered: a client that pipelines, as Connector/J 3, R2DBC and
    async drivers do): D1 up to the latest D4 of the requests before it, at most its own D4; 0 otherwise. The
    server reads a connection's requests one after the other, so that wait is the connection's, not the pool's."""
    n = len(t)
    out = np.zeros(n)
    ok = t["server_s"].notna().to_numpy() & t["db_client"].notna().to_numpy()
    if n == 0 or not ok.any():
        return out
    every = bool(ok.all())  # the usual case: the columns read as they are, not taken row by row first
    rows = None if every else np.flatnonzero(ok)
    del ok

    def of_rows(values):
        return values if every else values[rows]

    # numbered in order of first appearance (a categorical by its codes: not a text object per row to hash)
    key = pd.factorize(t["db_client"] if every else t["db_client"].take(rows))[0].astype(np.int64, copy=False)
    server = pd.factorize(t["server"] if every else t["server"].take(rows))[0].astype(np.int64, copy=False)
    key *= int(server.max()) + 1
    key += server
    del server
    d1 = of_rows(np.asarray(t["_d1_raw"], dtype=np.int64))
    d4 = of_rows(np.asarray(t["_d4_raw"], dtype=np.int64))
    order = np.lexsort((d4, d1, key))
    k = key[order]
    del key
    b = d4[order]
    before = _latest_before(k, b)
    del k
    a = d1[order]
    del d1, d4
    np.maximum(before, a, out=before)  # no earlier request, or answered before this one came: no wait
    np.minimum(before, b, out=before)
    del b
    before -= a  # int64 ns until here: no rounding of the times
    del a
    out[order if every else rows[order]] = before / NS
    return out


def _latest_before(k: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row of rows sorted by `k` (its groups one run each): the largest `b` (int64) of the rows before it in its
    group, int64's minimum for a group's first row. One running maximum over every row, each group's values lifted
    above those of the groups before it (b less the least b, plus the group's number times the range of b), in
    int64 while that fits, else by a pandas groupby."""
    none = np.iinfo(np.int64).min
    if not len(k):
        return np.zeros(0, dtype=np.int64)
    first = np.concatenate([[True], k[1:] != k[:-1]])
    group = np.cumsum(first) - 1
    least = int(b.min())
    width = int(b.max()) - least + 1
    if (int(group[-1]) + 1) * width >= 1 << 62:
        # a writable array of its own: pipelined_s works in it in place
        return pd.Series(b).groupby(k).cummax().groupby(k).shift(1, fill_value=none).to_numpy(dtype=np.int64,
                                                                                              copy=True)
    lift = group
    lift *= width
    latest = b - least  # each step in place: the temporaries of every row are few
    latest += lift
    np.maximum.accumulate(latest, out=latest)
    latest -= lift
    latest += least
    del lift
    out = np.empty(len(b), dtype=np.int64)
    out[1:] = latest[:-1]
    out[first] = none
    return out


@dataclass
class LikelyWaits:
    """likely_waits' answer, one entry per row."""

    rows: np.ndarray  # a likely wait: queue_s = server − exec_s, queue_source likely
    exec_s: np.ndarray  # the class's typical execution (NaN where it has none)
    p90: np.ndarray  # … and the p90 of its clean runs: the top of its usual range


@dataclass
class RawTimes:
    """build_table's DB-clock times of every row (`_d1_raw`, `_d4_raw`, int64 ns) and whether they are the row's
    own (`_t_valid`): the table's arrays themselves, read, not copied."""

    d1: np.ndarray
    d4: np.ndarray
    valid: np.ndarray

    @staticmethod
    def of(t: pd.DataFrame) -> RawTimes | None:
        """The table's raw times; None for a table build_table did not make (no such columns)."""
        if "_d1_raw" not in t.columns:
            return None
        return RawTimes(np.asarray(t["_d1_raw"], dtype=np.int64), np.asarray(t["_d4_raw"], dtype=np.int64),
                        np.asarray(t["_t_valid"], dtype=bool))


def likely_waits(times: RawTimes | None, classes: tuple[np.ndarray, int], server: np.ndarray, exec_s: np.ndarray,
                 measured: np.ndarray, open_: np.ndarray) -> LikelyWaits:
    """Waits the slow log cannot prove but the wire makes likely (a statement below long_query_time, or no slow
    log): a statement whose server time is far above its class's typical execution while a long statement
    executed on the server (the thread group is checked later, when it is known: explain/threadpool.py).

    `measured`: rows whose execution the slow log or the wire flag gives; `open_`: rows whose execution is
    unknown (not in the slow log, not flagged). A class is a (command, fingerprint) pair; its typical execution is
    the median server time of its open runs that overlapped no long statement (≥ FINGERPRINT_MIN_SAMPLES of them).
    Long statements: measured executions ≥ STALL_MIN_QUEUE_S, and open runs ≥ STALL_MIN_QUEUE_S of a class with
    too few runs to have a typical execution or whose median is itself that long. A wait is likely when it is ≥
    LIKELY_MIN_WAIT_S and ≥ LIKELY_SPREAD × (p90 − median) of the clean runs, and long statements executed during
    ≥ LIKELY_COVER of it. `times`: the rows' DB-clock times (None: none known, no likely wait); `classes`:
    class_codes of the rows."""
    n = len(server)
    out = LikelyWaits(np.zeros(n, dtype=bool), np.full(n, np.nan), np.full(n, np.nan))
    if n == 0 or times is None:
        return out
    d1, d4 = times.d1, times.d4
    valid = times.valid & ~np.isnan(server) & (d4 >= d1)
    codes, groups = classes
    runs = open_ & valid & (codes >= 0)
    if not runs.any():
        return out
    # per class, then read at each row by its code (a row of code −1 is never a run: what it reads is masked)
    sizes = np.bincount(codes[runs], minlength=groups)
    (median_all,) = _group_quantiles(codes[runs], server[runs], groups, (0.5,))
    few_or_long = (sizes < FINGERPRINT_MIN_SAMPLES) | (np.nan_to_num(median_all) >= STALL_MIN_QUEUE_S)
    long_open = runs & (server >= STALL_MIN_QUEUE_S) & few_or_long[codes]
    long_measured = measured & valid & (np.nan_to_num(exec_s) >= STALL_MIN_QUEUE_S)
    del valid
    long_ = np.flatnonzero(long_open | long_measured)
    # a long statement's execution: from D4 − exec_s (not before D1) where the log or the flag measured it
    x_start = d1[long_]
    timed = long_measured[long_]
    x_start[timed] = np.maximum(d4[long_][timed] - np.rint(exec_s[long_][timed] * NS).astype(np.int64),
                                x_start[timed])
    lo, hi = interval_union(x_start, d4[long_])
    del x_start, timed
    clean = covered_ns(lo, hi, d1, d4) == 0
    clean &= runs
    clean[long_] = False
    del long_
    if not clean.any():
        return out
    counts = np.bincount(codes[clean], minlength=groups)
    median, p90 = _group_quantiles(codes[clean], server[clean], groups, (0.5, 0.9))
    del clean
    median[counts < FINGERPRINT_MIN_SAMPLES] = np.nan
    return likely_rows(out, codes, server, d1, runs, long_open, median, p90, (lo, hi))


def likely_rows(out: LikelyWaits, codes: np.ndarray, server: np.ndarray, d1: np.ndarray, runs: np.ndarray,
                long_open: np.ndarray, median: np.ndarray, p90: np.ndarray, long_union) -> LikelyWaits:
    """likely_waits' answer for rows (written into `out`) from what it gathers over every row: per class the clean
    runs' `median` (NaN for a class with fewer than FINGERPRINT_MIN_SAMPLES) and `p90`, and `long_union` (lo, hi),
    the union of the long statements' executions; `runs`, `long_open`: the rows' open runs and long open runs. Row by
    row: the partitioned decomposition (explain/partitioned_decompose.py) calls it a partition at a time."""
    lo, hi = long_union
    typical = median[codes]
    typical[codes < 0] = np.nan
    known = runs & ~long_open & ~np.isnan(typical)
    del long_open, runs
    out.exec_s = np.where(known, typical, np.nan)
    at = np.flatnonzero(known)
    del known
    typical = typical[at]
    spread = p90[codes[at]] - typical
    wait = server[at] - typical
    far = wait >= np.maximum(LIKELY_MIN_WAIT_S, LIKELY_SPREAD * np.nan_to_num(spread))
    wait_ns = np.rint(wait * NS).astype(np.int64)
    held = covered_ns(lo, hi, d1[at], d1[at] + wait_ns) >= LIKELY_COVER * wait_ns
    out.rows[at[far & held]] = True
    out.p90[at] = typical + spread
    return out


def interval_union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint intervals, sorted, covering the union of [s_i, e_i)."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.concatenate([[True], s[1:] > reach[:-1]])
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def covered_ns(lo: np.ndarray, hi: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """How much of each [s_k, e_k] the disjoint sorted intervals [lo, hi) cover, ns (int64)."""
    if len(lo) == 0:
        return np.zeros(len(s), dtype=np.int64)
    before = np.concatenate([[0], np.cumsum(hi - lo)])  # covered before interval i starts

    def up_to(points: np.ndarray) -> np.ndarray:
        k = np.searchsorted(lo, points, side="right") - 1
        kk = np.maximum(k, 0)
        return np.where(k >= 0, before[kk] + np.clip(np.minimum(points, hi[kk]) - lo[kk], 0, None), 0)

    if len(s) <= ROWS_AT_ONCE:
        return np.maximum(up_to(e) - up_to(s), 0)
    out = np.empty(len(s), dtype=np.int64)  # a slice at a time: the temporaries are of a slice, not of every row
    for a in range(0, len(s), ROWS_AT_ONCE):
        out[a:a + ROWS_AT_ONCE] = np.maximum(up_to(e[a:a + ROWS_AT_ONCE]) - up_to(s[a:a + ROWS_AT_ONCE]), 0)
    return out


def class_codes(command: pd.Series, fingerprint: pd.Series) -> tuple[np.ndarray, int]:
    """Each row's class, a (command, fingerprint) text pair, as a code 0 … groups − 1 (NA as the text str() makes
    of it): numbered pair by pair, not by joining the two texts of every row into a new string (a string per row
    held at once). The codes are int32 (int64 beyond 2³¹ classes): the execution-class view of every row."""
    command_codes = _text_codes(command)
    fingerprint_codes = _text_codes(fingerprint)
    if len(command_codes) == 0:
        return command_codes.astype(np.int32), 0
    command_codes *= int(fingerprint_codes.max()) + 1
    command_codes += fingerprint_codes
    del fingerprint_codes
    codes, uniques = pd.factorize(command_codes)
    del command_codes
    return codes.astype(np.int32 if len(uniques) <= np.iinfo(np.int32).max else np.int64, copy=False), len(uniques)


def _text_codes(column: pd.Series) -> np.ndarray:
    """pd.factorize(column's values as str) (nulls: -1), int64: for a categorical column, from its codes (one
    str() per category, not per row), with the same numbers (in order of first appearance)."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return pd.factorize(column.astype(object).astype(str).to_numpy(dtype=object))[0].astype(np.int64)
    texts = [str(c) for c in column.cat.categories]
    if len(set(texts)) != len(texts):  # two categories with one text: one group, as the texts would make it
        return pd.factorize(column.astype(object).astype(str).to_numpy(dtype=object))[0].astype(np.int64)
    codes = column.cat.codes.to_numpy(np.int64)
    out = pd.factorize(codes)[0].astype(np.int64)  # numbered as they first appear; null's -1 is numbered too
    nulls = codes < 0
    if nulls.any():
        out[nulls] = -1
        out[~nulls] = pd.factorize(codes[~nulls])[0]
    return out


def estimate_execution(classes: tuple[np.ndarray, int], server: np.ndarray, fast: np.ndarray) -> np.ndarray:
    """Execution time estimated from other runs of the same shape, NaN where no robust estimate exists.

    The runs are the `fast` ones (not in the slow log, not flagged, not above long_query_time) of the same command
    *and* fingerprint: a PREPARE, an EXECUTE and a COM_QUERY of one statement do different work. The estimate is
    their median, used only when there are ≥ FINGERPRINT_MIN_SAMPLES of them and they agree (p90 − p10 ≤
    ESTIMATE_MAX_SPREAD × median); a server time within the runs' normal range (≤ their p90) is taken as all
    execution, so scheduling noise is not reported as queueing. `classes`: class_codes of the rows."""
    n = len(server)
    out = np.full(n, np.nan)
    if n == 0:
        return out
    codes, groups = classes
    sample = fast & (codes >= 0)
    if not sample.any():
        return out
    sizes = np.bincount(codes[sample], minlength=groups)  # the runs, a NaN server time included (as pandas counts)
    timed = sample & ~np.isnan(server)
    p10, median, p90 = _group_quantiles(codes[timed], server[timed], groups, (0.1, 0.5, 0.9))
    # NaN quantiles (a group without a time) fail both tests, as they failed them in pandas' table
    return estimate_rows(codes, server, *robust_estimates(sizes, p10, median, p90))


def robust_estimates(sizes: np.ndarray, p10: np.ndarray, median: np.ndarray, p90: np.ndarray) -> tuple:
    """Per class, the median and p90 of its fast runs where they make an estimate (≥ FINGERPRINT_MIN_SAMPLES runs
    that agree: estimate_execution), NaN elsewhere (the arrays are changed in place)."""
    robust = (sizes >= FINGERPRINT_MIN_SAMPLES) & ((p90 - p10) <= ESTIMATE_MAX_SPREAD * median)
    median[~robust] = np.nan
    p90[~robust] = np.nan
    return median, p90


def estimate_rows(codes: np.ndarray, server: np.ndarray, median: np.ndarray, p90: np.ndarray) -> np.ndarray:
    """estimate_execution's answer for rows of classes `codes` from robust_estimates' per-class median and p90."""
    out = np.full(len(server), np.nan)
    row_median, row_p90 = median[codes], p90[codes]
    has = ~np.isnan(row_median) & ~np.isnan(server)
    out[has] = np.where(server[has] <= row_p90[has], server[has], np.minimum(server[has], row_median[has]))
    return out


def _group_quantiles(k: np.ndarray, v: np.ndarray, n: int, qs: tuple[float, ...]) -> list[np.ndarray]:
    """Per group 0 … n − 1 of `k`, the quantiles `qs` of its values `v` (no NaN), NaN for a group without any:
    pandas' groupby(k).quantile(qs) (linear interpolation, its own arithmetic: the value at the truncated position,
    plus the step to the next one times the fraction when there is one), from one sort of the values by group."""
    values, start, count = sorted_by_group(k, v, n)
    out = []
    has = count > 0
    for q in qs:
        position = q * (count[has] - 1).astype(np.float64)
        at = start[has] + position.astype(np.int64)
        frac = position % 1
        value = values[at]
        step = np.flatnonzero(frac != 0.0)
        value[step] = value[step] + (values[at[step] + 1] - value[step]) * frac[step]
        quantile = np.full(n, np.nan)
        quantile[has] = value
        out.append(quantile)
    return out


# --- the network's share, told apart through a proxy -------------------------------------------------------------

NETWORK_PARTS = (("net_app_proxy_s", "app ↔ proxy network"), ("proxy_s", "inside the proxy"),
                 ("net_proxy_db_s", "proxy ↔ DB network"))


def network_parts(x: pd.DataFrame, rows: np.ndarray) -> list[tuple[str, float]]:
    """network_s summed over `rows` (a boolean mask), as [(label, seconds)]: one "network" part without a proxy;
    through a proxy with its capture, the legs and the time inside the proxy (pcapdecomp/pair/proxy.py), and "network
    (not told apart)" for what no proxy column covers (exchanges without the proxy's times, or a hop not captured).
    The parts always add up to network_s's sum."""
    return network_parts_of(masked_sums(network_terms(x, rows)))


def network_terms(x: pd.DataFrame, rows: np.ndarray):
    """The sums network_parts tells, as (name, rows, values) terms (core.exact.masked_sums: NaN as 0, in row
    order): network_s over `rows` where it is known, whether a proxy time is known there ("network:proxied": its
    count), and each proxy column over the same rows."""
    net = x["network_s"].to_numpy(dtype="float64", na_value=np.nan)
    rows = rows & ~np.isnan(net)
    yield "network", rows, net
    if "proxy_s" in x.columns:
        proxy = x["proxy_s"].to_numpy(dtype="float64", na_value=np.nan)
        yield "network:proxied", rows & ~np.isnan(proxy), proxy
        for col, _ in NETWORK_PARTS:
            yield f"network:{col}", rows, x[col].to_numpy(dtype="float64", na_value=np.nan)


def network_parts_of(sums: dict[str, tuple[int, float]]) -> list[tuple[str, float]]:
    """network_parts from the sums of network_terms ({name: (rows, sum)}), however they were made."""
    network = sums["network"][1]
    if not sums.get("network:proxied", (0, 0.0))[0]:
        return [("network", network)]
    parts = [(label, sums[f"network:{col}"][1]) for col, label in NETWORK_PARTS]
    parts = [(label, v) for label, v in parts if v != 0]
    rest = network - sum(v for _, v in parts)
    if abs(rest) > 1e-9 * max(abs(network), 1.0):
        parts.append(("network (not told apart)", rest))
    return parts
