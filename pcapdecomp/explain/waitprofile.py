"""The query profile ranked by what the clients waited: one row per Query ID (pt-query-digest's, explain/digest.py), ranked
by the clients' time when an app capture is there, else by the server's (`order_by` chooses: client, server, exec).

pt-query-digest ranks what it can see: a slow log's Query_time (execution only), or with `--type tcpdump` the
request to response time at the capture point. A class that executes in 100 µs and queues for 800 ms behind a
stalled thread group is last by execution and first by what its clients waited; this profile shows both side by
side (wire and execution), with the class's queueing split into certain, likely and estimated (digest.queue_layers),
nearest-rank p95/p99 and max of the ranking time, a log-scale histogram in pt-query-digest's buckets, the slow log's
Rows_examined and Lock_time for the calls it logged, and the client hosts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.endpoints import address_of
from ..core.groups import codes as group_codes
from ..core.groups import group_sum, nearest_rank, sorted_by_group
from .digest import queue_layers

ORDERS = ("client", "server", "exec")  # --order-by
BOUND_EXEC = ("below_long_query_time", "flagged_slow")  # exec_source values that bound execution, not measure it
# pt-query-digest's Query_time distribution: a bucket per power of ten from 1 µs; the last holds 10 s and more
HISTOGRAM_LABELS = ("1us", "10us", "100us", "1ms", "10ms", "100ms", "1s", "10s+")
HOSTS_LISTED = 3  # client hosts named per class (the rest counted)

PROFILE_COLUMNS = ("rank", "query_id", "fingerprint", "calls", "time_sum", "time_share", "r_call", "p95", "p99",
                   "max", "wire_sum", "server_sum", "network_sum", "exec_sum", "exec_measured", "exec_bounded",
                   "queue_certain_sum",
                   "queue_likely_sum", "queue_estimated_sum", "histogram", "logged", "rows_examined_sum", "lock_time_sum", "hosts",
                   "hosts_more", "sample")


def default_order(x: pd.DataFrame) -> str:
    """client when any exchange has the clients' time (an app capture), else server."""
    return "client" if "total_s" in x.columns and bool(x["total_s"].notna().any()) else "server"


def ranking_time(x: pd.DataFrame, order_by: str) -> np.ndarray:
    """Per exchange, the seconds the profile ranks by: client (A4 − A1, else D4 − D1, else the one capture's time),
    server (D4 − D1, else the one capture's time) or exec (execution, measured or estimated)."""
    chain = {"client": ("total_s", "server_s", "response_s"), "server": ("server_s", "response_s"),
             "exec": ("exec_s",)}[order_by]
    out = np.full(len(x), np.nan)
    for col in chain:
        if col in x.columns:
            out = np.where(np.isnan(out), _floats(x, col), out)
    if order_by == "exec":  # a bound is not a time to rank by
        out = np.where(x["exec_source"].astype(object).isin(BOUND_EXEC).to_numpy(dtype=bool), np.nan, out)
    return out


def histogram(values: np.ndarray) -> list[int]:
    """Counts per pt-query-digest bucket (HISTOGRAM_LABELS): [10^k µs, 10^(k+1) µs), below 10 µs in the first,
    10 s and more in the last."""
    v = values[~np.isnan(values)]
    with np.errstate(divide="ignore"):
        k = np.floor(np.log10(np.maximum(v, 1e-12) / 1e-6))
    k = np.clip(np.nan_to_num(k, nan=0.0), 0, len(HISTOGRAM_LABELS) - 1).astype(np.int64)
    return np.bincount(k, minlength=len(HISTOGRAM_LABELS)).tolist()


def profile(x: pd.DataFrame, order_by: str | None = None, slow: pd.DataFrame | None = None,
            top: int | None = None) -> tuple[pd.DataFrame, str]:
    """(one row per fingerprint ranked by its summed ranking time, the order used). slow: the slow-log entries the
    exchanges joined (slow_entries), for Rows_examined and Lock_time; None: those stay unknown."""
    order_by = order_by or default_order(x)
    codes, uniques = group_codes(x["fingerprint"])
    has = codes >= 0
    n = len(uniques)
    if n == 0:
        return pd.DataFrame(columns=PROFILE_COLUMNS), order_by
    k = codes[has]
    t = ranking_time(x, order_by)[has]
    calls = np.bincount(k, minlength=n)
    time_sum, _ = group_sum(k, t, n)
    out = pd.DataFrame({"code": np.arange(n), "fingerprint": uniques, "calls": calls, "time_sum": time_sum})
    total = float(np.nansum(time_sum))
    out["time_share"] = time_sum / total if total > 0 else np.nan
    out["r_call"] = time_sum / np.maximum(calls, 1)
    ok = ~np.isnan(t)
    vv, start, count = sorted_by_group(k[ok], t[ok], n)
    stats = np.full((3, n), np.nan)
    hist = [[0] * len(HISTOGRAM_LABELS) for _ in range(n)]
    for g in np.flatnonzero(count).tolist():
        part = vv[start[g]:start[g] + count[g]]
        stats[:, g] = (*nearest_rank(part, [0.95, 0.99]), part[-1])
        hist[g] = histogram(part)
    out["p95"], out["p99"], out["max"] = stats
    out["histogram"] = hist
    for name, col in (("wire_sum", "total_s"), ("server_sum", "server_s"), ("network_sum", "network_s")):
        out[name] = group_sum(k, _floats(x, col)[has], n)[0] if col in x.columns else np.nan
    # execution summed where it is a time (measured or estimated); a bound (below_long_query_time, flagged_slow)
    # is counted apart, never added in as if it were one
    bounded = x["exec_source"].astype(object).isin(BOUND_EXEC).to_numpy(dtype=bool)[has]
    exec_s = _floats(x, "exec_s")[has]
    out["exec_sum"] = group_sum(k, np.where(bounded, np.nan, exec_s), n)[0]
    out["exec_bounded"] = np.bincount(k, weights=bounded, minlength=n).astype(np.int64)  # exec_s null or a bound
    measured = (x["exec_source"] == "slow_log").fillna(False).to_numpy(dtype=bool)[has]
    out["exec_measured"] = np.bincount(k, weights=measured, minlength=n) / np.maximum(calls, 1)
    certain, likely, estimated = (part[has] for part in queue_layers(x))
    out["queue_certain_sum"] = np.bincount(k, weights=certain, minlength=n)
    out["queue_likely_sum"] = np.bincount(k, weights=likely, minlength=n)
    out["queue_estimated_sum"] = np.bincount(k, weights=estimated, minlength=n)
    _add_slow_log(out, x, has, k, n, slow)
    _add_hosts(out, x, has, k)
    order = np.lexsort((-calls, -np.nan_to_num(time_sum, nan=-1.0)))
    out = out.iloc[order].reset_index(drop=True)
    out["rank"] = np.arange(1, len(out) + 1)
    if top is not None:
        out = out.head(top).copy()
    rows = np.flatnonzero(has)
    first = np.zeros(n, dtype=np.int64)
    first[k[::-1]] = np.arange(len(k) - 1, -1, -1)
    worst = _worst(k, t, n)
    picked = out["code"].to_numpy()
    out["query_id"] = [_text(v) for v in x["query_id"].iloc[rows[first[picked]]].astype(object)]
    out["sample"] = [_text(v) for v in x["sql"].iloc[rows[worst[picked]]].astype(object)]
    return out[list(PROFILE_COLUMNS)], order_by


def _worst(k: np.ndarray, t: np.ndarray, n: int) -> np.ndarray:
    """Per group, the row (into k) of its longest ranking time (its first row when none is known)."""
    key = np.nan_to_num(t, nan=-1.0)
    order = np.lexsort((-key, k))
    out = np.zeros(n, dtype=np.int64)
    firsts = np.ones(len(order), dtype=bool)
    firsts[1:] = k[order][1:] != k[order][:-1]
    out[k[order][firsts]] = order[firsts]
    return out


def _add_slow_log(out: pd.DataFrame, x: pd.DataFrame, has: np.ndarray, k: np.ndarray, n: int,
                  slow: pd.DataFrame | None) -> None:
    """Rows_examined and Lock_time summed over the calls joined to a slow-log entry (`logged` of them)."""
    logged = x["slow_log_line"].notna().to_numpy(dtype=bool)[has] if "slow_log_line" in x.columns else np.zeros(
        int(has.sum()), dtype=bool)
    out["logged"] = np.bincount(k, weights=logged, minlength=n).astype(np.int64)
    out["rows_examined_sum"] = np.nan
    out["lock_time_sum"] = np.nan
    if slow is None or not len(slow) or not logged.any():
        return
    point = (x["db_point"].astype(object).to_numpy()[has] if "db_point" in x.columns
             else np.full(int(has.sum()), None, dtype=object))
    line = x["slow_log_line"].to_numpy(dtype="float64", na_value=np.nan)[has]
    keys = pd.MultiIndex.from_arrays([pd.Series(point, dtype=object).fillna(""), pd.Series(line)])
    entries = slow.set_index(["db_point", "line"])
    found = entries.reindex(keys)
    for name, col in (("rows_examined_sum", "rows_examined"), ("lock_time_sum", "lock_time_s")):
        values = found[col].to_numpy(dtype="float64", na_value=np.nan)
        out[name] = group_sum(k, values, n)[0]


def _add_hosts(out: pd.DataFrame, x: pd.DataFrame, has: np.ndarray, k: np.ndarray) -> None:
    """The client hosts (addresses without the port) of each class, the busiest first, and how many more."""
    hosts = pd.Series(hosts_of(x["client"])[has] if "client" in x.columns else np.full(int(has.sum()), None))
    counts = pd.DataFrame({"k": k, "host": hosts}).dropna().value_counts()
    listed: dict[int, list[str]] = {}
    for (g, host), _ in counts.items():
        listed.setdefault(int(g), []).append(host)
    codes = out["code"].to_numpy()
    out["hosts"] = [", ".join(listed.get(int(g), [])[:HOSTS_LISTED]) for g in codes]
    out["hosts_more"] = [max(len(listed.get(int(g), [])) - HOSTS_LISTED, 0) for g in codes]


def hosts_of(clients: pd.Series) -> np.ndarray:
    """address_of for a column of endpoints, once per distinct endpoint."""
    code, hosts = host_codes(clients)
    return np.array([*hosts, None], dtype=object)[code]  # code −1 (unknown) takes the last entry, None


def host_codes(clients: pd.Series) -> tuple[np.ndarray, list[str]]:
    """(per row, the code of its client's host, −1 where unknown; the hosts in lexical order): hosts_of as codes,
    one small integer a row instead of a reference to a text."""
    code, uniques = group_codes(clients)
    addresses = [address_of(u) for u in uniques]
    hosts = sorted({a for a in addresses if a is not None})
    place = {h: i for i, h in enumerate(hosts)}
    table = np.array([-1 if a is None else place[a] for a in addresses] + [-1], dtype=np.int64)
    return table[code], hosts


def slow_entries(summary: dict) -> pd.DataFrame | None:
    """The slow-log entries of the analysed server(s), read again from the files summary.json names (db_point,
    line, rows_examined, lock_time_s), for the profile's Rows_examined and Lock_time; None when no slow log was
    used or its file is no longer there (those columns then stay unknown)."""
    from ..core.errors import SlowLogError
    from ..slowlog.reader import read_slow_log

    inputs = summary.get("inputs") or {}
    cwd = Path(inputs.get("cwd") or ".")
    parts = []
    for point, name in (inputs.get("slow_logs") or {}).items():
        if not isinstance(name, str) or not name:
            continue
        path = Path(name) if Path(name).is_absolute() else cwd / name
        if not path.is_file():
            continue
        try:
            frame, _ = read_slow_log(path)
        except SlowLogError:
            continue
        parts.append(pd.DataFrame({"db_point": point or "", "line": frame["line"].astype("float64"),
                                   "rows_examined": frame["rows_examined"].astype("float64"),
                                   "lock_time_s": frame["lock_time_s"].astype("float64")}))
    return pd.concat(parts, ignore_index=True).drop_duplicates(["db_point", "line"]) if parts else None


def _floats(x: pd.DataFrame, col: str) -> np.ndarray:
    return x[col].to_numpy(dtype="float64", na_value=np.nan)


def _text(v) -> str | None:
    return None if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v)
