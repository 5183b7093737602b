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

MEASURED_EXEC = ("slow_log",)  # exec_source values that are measurements, not estimates or bounds

PROFILE_COLUMNS = ("rank", "query_id", "fingerprint", "command", "calls", "qps", "exec_sum", "exec_share",
                   "exec_avg", "exec_min", "exec_max", "exec_p95", "exec_vm", "exec_measured", "client_sum",
                   "network_sum", "queue_sum", "queue_estimated_sum", "server_max", "rows_sum", "bytes_sum",
                   "user_db", "user_db_more", "sample", "sample_conn_id", "sample_row", "hidden_slow")


def profile(x: pd.DataFrame, span_s: float | None, top: int | None = None) -> pd.DataFrame:
    """One row per fingerprint, ranked by summed execution time (client or server time when no execution is known).

    x: the exchanges table (analysis columns included). span_s: the capture's span in seconds, for QPS (calls per
    second of capture; None or 0: QPS left null). top: keep only the first `top` ranks (the statistics of the kept
    rows are computed over all their calls). Only rows with a fingerprint count; administrator commands are kept,
    as pt-query-digest keeps them."""
    has_fp = x["fingerprint"].notna().to_numpy()
    q = x.loc[has_fp]
    if q.empty:
        return pd.DataFrame(columns=PROFILE_COLUMNS)
    codes, uniques = pd.factorize(q["fingerprint"].astype(object).to_numpy())
    n = len(uniques)
    exec_s = _floats(q, "exec_s")
    server = _floats(q, "server_s")
    client = _floats(q, "total_s")
    queue = _floats(q, "queue_s")
    network = _floats(q, "network_s")
    measured = q["exec_source"].isin(MEASURED_EXEC).to_numpy(dtype=bool) & ~np.isnan(exec_s)
    estimated_queue = queue_parts(q)[1]
    time_key = _first_finite(exec_s, server, client)  # what a call's "time" is for ranking and the sample
    f = pd.DataFrame({"k": codes, "exec": exec_s, "client": _first_finite(client, server),
                      "net": network, "queue": queue, "qest": estimated_queue,
                      "server": server, "measured": measured, "t": time_key,
                      "rows": q["rows"].to_numpy(dtype="float64", na_value=np.nan),
                      "bytes": q["bytes_resp"].to_numpy(dtype="float64", na_value=np.nan),
                      "hidden": q["hidden_slow"].fillna(False).to_numpy(dtype=bool)})
    g = f.groupby("k", sort=True)
    out = pd.DataFrame({
        "calls": g.size(), "exec_sum": g["exec"].sum(min_count=1), "exec_avg": g["exec"].mean(),
        "exec_min": g["exec"].min(), "exec_max": g["exec"].max(), "exec_p95": g["exec"].quantile(0.95),
        "exec_var": g["exec"].var(ddof=0), "exec_n": g["exec"].count(), "measured": g["measured"].sum(),
        "client_sum": g["client"].sum(min_count=1), "network_sum": g["net"].sum(min_count=1),
        "queue_sum": g["queue"].sum(min_count=1), "queue_estimated_sum": g["qest"].sum(min_count=1),
        "server_max": g["server"].max(), "rows_sum": g["rows"].sum(min_count=1),
        "bytes_sum": g["bytes"].sum(min_count=1), "hidden_slow": g["hidden"].sum(), "t_sum": g["t"].sum(min_count=1),
    }).reindex(range(n))
    out["fingerprint"] = uniques
    out["code"] = np.arange(n)
    exec_total = float(np.nansum(out["exec_sum"].to_numpy(float)))
    out["exec_share"] = out["exec_sum"] / exec_total if exec_total > 0 else np.nan
    out["exec_vm"] = np.where(out["exec_avg"] > 0, out["exec_var"] / out["exec_avg"], np.nan)
    out["exec_measured"] = np.where(out["exec_n"] > 0, out["measured"] / out["exec_n"].clip(lower=1), np.nan)
    out["qps"] = out["calls"] / span_s if span_s else np.nan
    # ranked by execution time; a fingerprint without any execution time by its client/server time after those
    order = np.lexsort((-np.nan_to_num(out["t_sum"].to_numpy(float), nan=-1.0),
                        -np.nan_to_num(out["exec_sum"].to_numpy(float), nan=-1.0)))
    out = out.iloc[order].reset_index(drop=True)
    out["rank"] = np.arange(1, len(out) + 1)
    if top is not None:
        out = out.head(top)
    _add_samples(out, q, codes, time_key, server)
    _add_user_db(out, q, codes)
    out["query_id"] = _first_of(q["query_id"], codes, out)
    out["command"] = _first_of(q["command"], codes, out)
    return out[list(PROFILE_COLUMNS)]


def queue_parts(x: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """queue_s split into (certain, estimated) seconds per row: certain is measured (execution from the slow log)
    or a bound (execution known shorter than long_query_time); the rest rests on an execution time estimated from
    other runs of the statement. queue_min_s says what is certain where the analysis wrote it; before that column
    existed, a queue is all estimated when its exec_source is an estimate and all certain otherwise."""
    queue = np.nan_to_num(x["queue_s"].to_numpy(dtype="float64", na_value=np.nan))
    if "queue_min_s" in x.columns:
        certain = np.minimum(np.nan_to_num(x["queue_min_s"].to_numpy(dtype="float64", na_value=np.nan)), queue)
    else:
        estimated = (x["exec_source"] == "fingerprint_median").fillna(False).to_numpy(dtype=bool)
        certain = np.where(estimated, 0.0, queue)
    return certain, queue - certain


def _floats(q: pd.DataFrame, col: str) -> np.ndarray:
    return q[col].to_numpy(dtype="float64", na_value=np.nan)


def _first_finite(*arrays: np.ndarray) -> np.ndarray:
    out = arrays[0].copy()
    for a in arrays[1:]:
        out = np.where(np.isnan(out), a, out)
    return out


def _first_of(col: pd.Series, codes: np.ndarray, out: pd.DataFrame) -> list:
    """The value of `col` at the first row of each kept fingerprint."""
    first = pd.Series(np.arange(len(codes))).groupby(codes).first()
    rows = first.reindex(out["code"].to_numpy()).to_numpy()
    values = col.astype(object).to_numpy()
    return [None if pd.isna(values[r]) else values[r] for r in rows]


def _add_samples(out: pd.DataFrame, q: pd.DataFrame, codes: np.ndarray, time_key: np.ndarray,
                 server: np.ndarray) -> None:
    """pt-query-digest's sample is the worst call: here the call with the longest time (execution, else server or
    client time; ties by server time), shown with its parameter values."""
    key = np.nan_to_num(time_key, nan=-1.0)
    tie = np.nan_to_num(server, nan=-1.0)
    order = np.lexsort((-tie, -key, codes))
    first = np.ones(len(order), dtype=bool)
    first[1:] = codes[order][1:] != codes[order][:-1]
    worst = pd.Series(order[first], index=codes[order][first])
    kept = worst.reindex(out["code"].to_numpy()).to_numpy()
    sql = q["sql"].astype(object).to_numpy()
    params = q["params"].astype(object).to_numpy() if "params" in q.columns else np.full(len(q), None)
    command = q["command"].astype(object).to_numpy()
    conn = q["conn_id"].astype("Int64").to_numpy(dtype="float64", na_value=np.nan)
    out["sample"] = [sample_statement(sql[r], params[r], command[r]) for r in kept]
    out["sample_conn_id"] = [None if np.isnan(conn[r]) else int(conn[r]) for r in kept]
    out["sample_row"] = [int(q.index[r]) if isinstance(q.index[r], (int, np.integer)) else None for r in kept]


def _add_user_db(out: pd.DataFrame, q: pd.DataFrame, codes: np.ndarray) -> None:
    """The most frequent user@db of each fingerprint, and how many other combinations there were."""
    ud = (q["user"].astype(object).fillna("?").astype(str) + "@" + q["db"].astype(object).fillna("?").astype(str)).to_numpy()
    counts = pd.DataFrame({"k": codes, "ud": ud}).value_counts()
    top = counts.reset_index().drop_duplicates("k").set_index("k")["ud"]
    distinct = counts.reset_index().groupby("k").size()
    kept = out["code"].to_numpy()
    out["user_db"] = top.reindex(kept).to_numpy()
    out["user_db_more"] = (distinct.reindex(kept).fillna(1).to_numpy() - 1).astype(int)


def split_params(params: str) -> list[str] | None:
    """The `params` column's comma-separated SQL literals back into a list (strings are single-quoted with
    backslash escapes, as pcapdecomp.mysql.params writes them); None when the text does not split cleanly."""
    out: list[str] = []
    i, n = 0, len(params)
    while i < n:
        if params[i] == "'":
            j = i + 1
            while j < n and params[j] != "'":
                j += 2 if params[j] == "\\" else 1
            if j >= n:
                return None
            end = j + 1
        else:
            end = params.find(", ", i)
            end = n if end < 0 else end
        out.append(params[i:end])
        if end < n and not params.startswith(", ", end):
            return None
        i = end + 2 if end < n else n
    return out


def placeholders(sql: str) -> list[int]:
    """Positions of the `?` placeholders of a prepared statement, skipping quoted text and comments."""
    out = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"`":
            j = i + 1
            while j < n and sql[j] != c:
                j += 2 if sql[j] == "\\" and c != "`" else 1
            i = j + 1
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "#" or (sql.startswith("--", i) and (i + 2 >= n or sql[i + 2] in " \t\r\n")):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        else:
            if c == "?":
                out.append(i)
            i += 1
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
