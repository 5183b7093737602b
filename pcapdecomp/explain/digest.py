"""A query profile in the manner of pt-query-digest's: one row per fingerprint (Query ID), ranked by execution time,
with calls, QPS, per-call statistics, rows and bytes sent, user@db and a sample carrying its real parameter values;
beside it, where each fingerprint's client time went (network, queueing, execution).

pt-query-digest reads a slow log, so its "response time" is Query_time: execution only. Here execution is the slow
log's Query_time where the statement was logged, else an estimate (`exec_source`); `exec_measured` says which share
of the calls was measured. On the slow-logged subset the numbers are pt-query-digest's (tests/test_digest.py
compares them with pt-query-digest on the same slow log)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.groups import codes as group_codes
from ..core.groups import equals, group_max, group_min_max_p95, group_sum
from ..mysql.params import split_params
from ..slowlog.sqltext import placeholders

MEASURED_EXEC = ("slow_log",)  # exec_source values that are measurements, not estimates or bounds

PROFILE_COLUMNS = ("rank", "query_id", "fingerprint", "command", "commands", "calls", "qps", "exec_sum", "exec_share",
                   "exec_avg", "exec_min", "exec_max", "exec_p95", "exec_vm", "exec_measured", "client_sum",
                   "network_sum", "queue_sum", "queue_estimated_sum", "server_max", "rows_sum", "bytes_sum",
                   "user_db", "user_db_more", "sample", "sample_conn_id", "sample_row", "hidden_slow")


def profile(x: pd.DataFrame, span_s: float | None, top: int | None = None, params=None,
            columns=None) -> pd.DataFrame:
    """One row per fingerprint, ranked by summed execution time (client or server time when no execution is known).

    x: the exchanges table (analysis columns included). span_s: the capture's span in seconds, for QPS (calls per
    second of capture; None or 0: QPS left null). top: keep only the first `top` ranks (the statistics of the kept
    rows are computed over all their calls). params: where the samples' parameter values are read when x holds
    no `params` column (run.spilled.StoredParams: read from the file at the rows sampled), else x's own
    (HeldParams). columns: where the samples' sql and conn_id and the Query IDs are read, at those rows alone
    (run.spilled.StoredColumns: from the file, the projection holds neither), else x's own (HeldColumns). Only rows
    with a fingerprint count; administrator commands are kept, as pt-query-digest keeps
    them. Memory: a few arrays of one number per exchange at a time, each let go once summed, never a copy of the
    table."""
    codes, uniques = group_codes(x["fingerprint"])
    has = codes >= 0
    n = len(uniques)
    if n == 0:
        return pd.DataFrame(columns=PROFILE_COLUMNS)
    fingerprinted = _Fingerprinted(x, has)
    k = fingerprinted.of(codes)  # (group_codes' own array, where every row has a fingerprint)
    del codes
    calls = np.bincount(k, minlength=n)
    # the columns as arrays, made into a table once (a column added to a small table at a time cost more than
    # computing it)
    # (the fingerprints' dtype as a table of all of them infers it, kept by the rows taken: also none)
    out = {"fingerprint": pd.Series(uniques).array, "code": np.arange(n), "calls": calls}
    exec_s = fingerprinted.floats("exec_s")
    exec_sum, exec_n = group_sum(k, exec_s, n)
    out["exec_sum"] = exec_sum
    exec_avg = np.where(exec_n > 0, exec_sum / np.maximum(exec_n, 1), np.nan)
    out["exec_avg"] = exec_avg
    out["exec_min"], out["exec_max"], out["exec_p95"] = group_min_max_p95(k, exec_s, n)
    squares, _ = group_sum(k, exec_s * exec_s, n)
    var = np.maximum(np.where(exec_n > 0, squares / np.maximum(exec_n, 1), np.nan) - exec_avg ** 2, 0.0)
    out["exec_vm"] = np.where(exec_avg > 0, var / exec_avg, np.nan)
    measured = fingerprinted.of(x["exec_source"].isin(MEASURED_EXEC).to_numpy(dtype=bool)) & ~np.isnan(exec_s)
    out["exec_measured"] = np.where(exec_n > 0, np.bincount(k, weights=measured, minlength=n) / np.maximum(exec_n, 1),
                                    np.nan)
    del measured
    server = fingerprinted.floats("server_s")
    client = _first_finite(fingerprinted.floats("total_s"), server)
    time_key = _first_finite(exec_s, server, client)  # what a call's "time" is for ranking and the sample
    del exec_s
    exec_total = float(np.nansum(exec_sum))
    out["exec_share"] = exec_sum / exec_total if exec_total > 0 else np.full(n, np.nan)
    out["qps"] = calls / span_s if span_s else np.full(n, np.nan)
    out["client_sum"] = group_sum(k, client, n)[0]
    del client
    for name, col in (("network_sum", "network_s"), ("rows_sum", "rows"), ("bytes_sum", "bytes_resp")):
        out[name] = group_sum(k, fingerprinted.floats(col), n)[0]  # each column's values let go once summed
    queue_sum, queue_n = group_sum(k, fingerprinted.floats("queue_s"), n)
    out["queue_sum"] = queue_sum
    estimated = fingerprinted.of(queue_parts(x)[1])
    out["queue_estimated_sum"] = np.where(queue_n > 0, np.bincount(k, weights=estimated, minlength=n), np.nan)
    del estimated
    out["server_max"] = group_max(k, server, n)
    out["hidden_slow"] = np.bincount(k, weights=fingerprinted.of(x["hidden_slow"].fillna(False).to_numpy(dtype=bool)),
                                     minlength=n).astype(np.int64)
    t_sum = group_sum(k, time_key, n)[0]
    # ranked by execution time; a fingerprint without any execution time by its client/server time after those
    order = np.lexsort((-np.nan_to_num(t_sum, nan=-1.0), -np.nan_to_num(exec_sum, nan=-1.0)))
    if top is not None:
        order = order[:top]  # as head(top)
    out = {name: values[order] for name, values in out.items()}
    out["rank"] = np.arange(1, len(order) + 1)
    command, commands = group_codes(x["command"])
    command = fingerprinted.of(command)
    # the sample shows the statement as executed: a PREPARE, CLOSE or an EXECUTE whose values were not decoded
    # only where no call of the fingerprint carries its values
    without = np.isin(command, np.flatnonzero(np.isin(commands.astype(str), _WITHOUT_VALUES)))
    if params is None and "params" in x.columns:
        params = HeldParams(x["params"])
    if params is not None:
        execute = command == (np.flatnonzero(commands.astype(str) == "COM_STMT_EXECUTE")[:1].tolist() or [-2])[0]
        without |= execute & fingerprinted.of(params.null())
        del execute
    worst = _worst_call(k, time_key, server, ~without, n)[out["code"]]
    del time_key, server, without
    first = _first_call(k, n)[out["code"]]
    rows = np.flatnonzero(has)  # positions in x of the rows with a fingerprint
    columns = columns if columns is not None else HeldColumns(x)
    _add_samples(out, columns.at(rows[worst], ("sql", "command", "conn_id")), rows[worst], params)
    _add_user_db(out, x, fingerprinted, k, n)
    out["query_id"] = _values_at(columns.at(rows[first], ("query_id",))["query_id"], np.arange(len(first)))
    del rows
    out["command"], out["commands"] = _command_mix(k, command, commands, out["code"])
    return pd.DataFrame({name: out[name] for name in PROFILE_COLUMNS}, columns=list(PROFILE_COLUMNS))


class _Fingerprinted:
    """The rows of a table that have a fingerprint (`has`), taken from one of its columns at a time: the column's own
    array where every row has one (no copy), else a copy of those rows."""

    def __init__(self, x: pd.DataFrame, has: np.ndarray):
        self.x, self.has, self.every = x, has, bool(has.all())

    def of(self, values: np.ndarray) -> np.ndarray:
        return values if self.every else values[self.has]

    def floats(self, col: str) -> np.ndarray:
        return self.of(_floats(self.x, col))


class HeldParams:
    """The `params` column of a table as profile reads it: its null mask, and its values at some rows. Another
    source reads the same two things (run.spilled.StoredParams: from exchanges.parquet, without holding the
    column)."""

    def __init__(self, column: pd.Series):
        self.column = column

    def null(self) -> np.ndarray:
        """Per row, whether its params are null."""
        return self.column.isna().to_numpy(dtype=bool)

    def at(self, rows: np.ndarray) -> list:
        """The values at `rows` (positions), None where null."""
        return _values_at(self.column, rows)


class HeldColumns:
    """The columns of a table that the report reads at a few rows alone (the statements it lists, the samples, the
    timeline's statements: run.spilled.ROW_COLUMNS), taken from the table itself. Another source gives the same
    (run.spilled.StoredColumns: the columns its projection holds from it, the others read from exchanges.parquet
    at those rows alone)."""

    def __init__(self, x: pd.DataFrame):
        self.x = x

    @property
    def columns(self) -> pd.Index:
        """The columns it can give."""
        return self.x.columns

    def at(self, rows: np.ndarray, columns) -> pd.DataFrame:
        """Those of `columns` it has (in that order) at `rows` (positions, in any order, repeated), indexed by the
        table's labels of those rows: x.iloc of them (a row filter of these columns alone, not of all)."""
        return self.x.iloc[rows, self.x.columns.get_indexer([c for c in columns if c in self.x.columns])]


_WITHOUT_VALUES = ("COM_STMT_PREPARE", "COM_STMT_CLOSE", "COM_STMT_RESET", "COM_STMT_SEND_LONG_DATA")


def _command_mix(k: np.ndarray, command: np.ndarray, names: np.ndarray, kept: np.ndarray) -> tuple[list, list]:
    """Per kept fingerprint: its most frequent command, and every command with its count, most frequent first
    ("COM_QUERY ×1490, COM_STMT_EXECUTE ×1490, COM_STMT_PREPARE ×4"): a prepared statement's PREPARE and CLOSE
    share its fingerprint and Query ID with its executions."""
    width = len(names) + 1
    pairs, counts = np.unique(k * width + (command + 1), return_counts=True)
    mix: dict = {}
    for pair, count in zip(pairs.tolist(), counts.tolist()):
        c = pair % width - 1
        mix.setdefault(pair // width, []).append((count, str(names[c]) if c >= 0 else "?"))
    top, words = [], []
    for code in kept.tolist():
        parts = sorted(mix.get(code, []), key=lambda p: (-p[0], p[1]))
        top.append(parts[0][1] if parts else None)
        words.append(", ".join(f"{name} ×{count:,}" for count, name in parts))
    return top, words


def _worst_call(k: np.ndarray, key: np.ndarray, tie: np.ndarray, complete: np.ndarray, n: int) -> np.ndarray:
    """Per group, the index (into k) of pt-query-digest's sample: the worst call, the longest time first, ties by
    server time, then the first such call; among the `complete` calls (those that show the statement with its
    values) where the group has any."""
    key, tie = np.nan_to_num(key, nan=-1.0), np.nan_to_num(tie, nan=-1.0)
    has_complete = np.zeros(n, dtype=bool)
    has_complete[k[complete]] = True
    cand = complete | ~has_complete[k]
    top = np.full(n, -np.inf)
    np.maximum.at(top, k, np.where(cand, key, -np.inf))  # the others' −inf leaves top as it is: no copy of k
    best = cand & (key == top[k])
    top_tie = np.full(n, -np.inf)
    np.maximum.at(top_tie, k[best], tie[best])
    pick = np.flatnonzero(best & (tie == top_tie[k]))
    out = np.zeros(n, dtype=np.int64)
    out[k[pick][::-1]] = pick[::-1]  # the last write wins: the first such call of each group
    return out


def _first_call(k: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=np.int64)
    out[k[::-1]] = np.arange(len(k) - 1, -1, -1)  # the last write wins: the first row of each group
    return out


def _values_at(col: pd.Series, rows: np.ndarray) -> list:
    values = col.iloc[rows].astype(object).to_numpy()
    return [None if v is None or (not isinstance(v, str) and pd.isna(v)) else v for v in values]


def _add_samples(out: dict, sampled: pd.DataFrame, rows: np.ndarray, params: HeldParams | None) -> None:
    """pt-query-digest's sample: the worst call, shown with its parameter values (`params`: profile's). sampled:
    the sql, command and conn_id of the sampled `rows` (positions in the table), in their order."""
    at = np.arange(len(rows))
    sql = _values_at(sampled["sql"], at)
    params = params.at(rows) if params is not None else [None] * len(rows)
    command = _values_at(sampled["command"], at)
    conn = _values_at(sampled["conn_id"], at)
    out["sample"] = [sample_statement(s, p, c) for s, p, c in zip(sql, params, command)]
    out["sample_conn_id"] = [None if c is None else int(c) for c in conn]
    out["sample_row"] = rows


def _add_user_db(out: dict, x: pd.DataFrame, fingerprinted: _Fingerprinted, k: np.ndarray, n: int) -> None:
    """The most frequent user@db of each fingerprint, and how many other combinations there were."""
    # combo = (k × (users + 1) + user + 1) × (dbs + 1) + db + 1 (0: unknown), made in its own array
    user, users = group_codes(x["user"])
    combo = k * (len(users) + 1)
    combo += fingerprinted.of(user)
    del user
    combo += 1
    db, dbs = group_codes(x["db"])
    combo *= len(dbs) + 1
    combo += fingerprinted.of(db)
    del db
    combo += 1
    values, counts = np.unique(combo, return_counts=True)
    group = values // ((len(users) + 1) * (len(dbs) + 1))
    order = np.lexsort((-counts, group))
    top = np.ones(len(order), dtype=bool)
    top[1:] = group[order][1:] != group[order][:-1]
    best = pd.Series(values[order][top], index=group[order][top])
    distinct = np.bincount(group, minlength=n)
    names_u = np.concatenate([["?"], users.astype(str)])
    names_d = np.concatenate([["?"], dbs.astype(str)])
    labels = []
    for code in out["code"]:
        v = int(best[code])
        rest = v % ((len(users) + 1) * (len(dbs) + 1))
        labels.append(f"{names_u[rest // (len(dbs) + 1)]}@{names_d[rest % (len(dbs) + 1)]}")
    out["user_db"] = labels
    out["user_db_more"] = distinct[out["code"]] - 1


def queue_layers(x: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """queue_s split into (certain, likely, estimated) seconds per row: queue_parts' certain part; the rest is
    likely where queue_source is likely (far above the statement's typical execution while a long statement ran),
    else estimated."""
    certain, rest = queue_parts(x)
    likely = likely_queue(x)
    estimated = np.where(likely, 0.0, rest)
    rest[~likely] = 0.0  # the likely part, in rest's own array (queue_parts made it): one array of a row fewer
    return certain, rest, estimated


def likely_queue(x: pd.DataFrame) -> np.ndarray:
    """Per row, whether its queueing beyond the certain part is likely (queue_source 'likely'), not estimated: the
    split of queue_layers (and of render.figures.layer_sums, which sums its parts one at a time). None likely in a
    table without queue_source."""
    return equals(x["queue_source"], "likely") if "queue_source" in x.columns else np.zeros(len(x), dtype=bool)


SERVER_OVERHEAD_S = 0.001  # a measured server time − Query_time below this is the server's own overhead (parsing,
# the network stack, the slow-log write), not a wait in the thread pool's queue


def overhead_part(x: pd.DataFrame) -> np.ndarray:
    """Per row, the measured queue_s that is the server's own overhead (below SERVER_OVERHEAD_S: parsing,
    the network stack), not queueing; 0 elsewhere. The shares tell it apart from queueing."""
    queue = np.nan_to_num(x["queue_s"].to_numpy(dtype="float64", na_value=np.nan))
    measured = equals(x["queue_source"], "measured")
    return np.where(measured & (queue < SERVER_OVERHEAD_S), queue, 0.0)


def bounded_part(x: pd.DataFrame) -> np.ndarray:
    """Per row, the server time not split because execution is only bounded (exec_s null, queue_s its certain
    lower bound): execution or waiting, not told apart; 0 elsewhere."""
    exec_s = x["exec_s"].to_numpy(dtype="float64", na_value=np.nan)
    queue = x["queue_s"].to_numpy(dtype="float64", na_value=np.nan)
    server = x["server_s"].to_numpy(dtype="float64", na_value=np.nan)
    return np.where(np.isnan(exec_s) & ~np.isnan(queue) & ~np.isnan(server), np.maximum(server - queue, 0.0), 0.0)


def queue_parts(x: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """queue_s split into (certain, estimated) seconds per row: certain is measured (execution from the slow log)
    or a bound (execution known shorter than long_query_time); the rest rests on an execution time estimated from
    other runs of the statement. queue_min_s says what is certain where the analysis wrote it; before that column
    existed, a queue is all estimated when its exec_source is an estimate and all certain otherwise."""
    queue = np.nan_to_num(x["queue_s"].to_numpy(dtype="float64", na_value=np.nan))
    if "queue_min_s" in x.columns:
        certain = np.nan_to_num(x["queue_min_s"].to_numpy(dtype="float64", na_value=np.nan))
        np.minimum(certain, queue, out=certain)  # in the copy nan_to_num made: no array of a row more
    else:
        estimated = (x["exec_source"] == "fingerprint_median").fillna(False).to_numpy(dtype=bool)
        certain = np.where(estimated, 0.0, queue)
    queue -= certain  # the rest, in queue's own copy
    return certain, queue


def _floats(q: pd.DataFrame, col: str) -> np.ndarray:
    return q[col].to_numpy(dtype="float64", na_value=np.nan)


def _first_finite(*arrays: np.ndarray) -> np.ndarray:
    out = arrays[0].copy()
    for a in arrays[1:]:
        out = np.where(np.isnan(out), a, out)
    return out


def sample_statement(sql, params, command) -> str:
    """The statement as executed: a prepared statement's `?` replaced by its parameter values when they fit, else
    the prepared text followed by the values in a comment; the command name when there is no text."""
    if not isinstance(sql, str):
        return str(command) if isinstance(command, str) else ""
    if not isinstance(params, str) or not params:
        return sql
    values = split_params(params)
    marks = placeholders(sql)
    if values is None or len(values) != len(marks):
        return f"{sql} /* parameters: {params} */"
    parts, last = [], 0
    for pos, value in zip(marks, values):
        parts += [sql[last:pos], value]
        last = pos + 1
    return "".join(parts) + sql[last:]
