"""Group kernels over numpy arrays: per-group sums, maxima, orders and nearest-rank percentiles of values keyed by
a group number 0 … n − 1 (the query profile, the pairing, the thread-pool view and the wait profile share them)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def equals(column: pd.Series, value: str) -> np.ndarray:
    """column == value as a bool array, False where null (on a categorical's codes, not a string per row)."""
    return (column == value).to_numpy(dtype=bool, na_value=False)


def codes(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(code per row, −1 where null; the distinct values): a categorical's own codes, else factorized."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.cat.codes.to_numpy().astype(np.int64)
        used = np.flatnonzero(np.bincount(codes[codes >= 0], minlength=len(col.cat.categories)))  # no sort
        remap = np.full(len(col.cat.categories) + 1, -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        return remap[codes], col.cat.categories.to_numpy(dtype=object)[used]
    codes, uniques = pd.factorize(col.astype(object).to_numpy())
    return codes.astype(np.int64), np.asarray(uniques, dtype=object)


def group_sum(k: np.ndarray, v: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per group: the sum of the non-NaN values (NaN where there is none) and their count."""
    # the NaN rows weigh 0 rather than being taken out: no copy of k and v, and the same sums (a 0.0 added to a
    # sum of floats leaves it as it was)
    missing = np.isnan(v)
    count = np.bincount(k, minlength=n)
    if missing.any():
        count = count - np.bincount(k[missing], minlength=n)
        v = np.where(missing, 0.0, v)
    return np.where(count > 0, np.bincount(k, weights=v, minlength=n), np.nan), count


def group_max(k: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    """Per group: the max of the non-NaN values (NaN where there is none); no sort, one pass."""
    ok = ~np.isnan(v)
    out = np.full(n, -np.inf)
    np.maximum.at(out, k[ok], v[ok])
    out[np.bincount(k[ok], minlength=n) == 0] = np.nan
    return out


def group_order(k: np.ndarray, largest: int) -> np.ndarray:
    """The positions of the group numbers `k` (0 … `largest`) in group order, stable (row order within a group):
    an argsort of them in the narrowest integer type that holds them, which numpy sorts by radix up to 16 bits."""
    width = (np.int16 if largest <= np.iinfo(np.int16).max else np.int32 if largest <= np.iinfo(np.int32).max
             else np.int64)
    return np.argsort(k.astype(width), kind="stable")


def nearest_rank(values: np.ndarray, qs) -> np.ndarray:
    """The nearest-rank percentiles `qs` (0 … 1) of `values` (no NaN, not empty): the smallest value with at least
    q × n values at or below it — always a latency that occurred, never a value between two (a p95 of 2.903 s where
    every client saw ≈ 2.0 or ≈ 4.0 s)."""
    return np.quantile(values, qs, method="inverted_cdf")


def group_nearest_rank(k: np.ndarray, v: np.ndarray, n: int, q: float) -> np.ndarray:
    """Per group 0 … n − 1 of `k`, nearest_rank of its non-NaN values `v` at q; NaN for a group without any."""
    ok = ~np.isnan(v)
    vv, start, count = sorted_by_group(k[ok], v[ok], n)
    out = np.full(n, np.nan)
    has = count > 0
    rank = np.maximum(np.ceil(q * count[has] - 1e-9).astype(np.int64), 1)
    out[has] = vv[start[has] + rank - 1]
    return out


def sorted_by_group(k: np.ndarray, v: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The values `v` (no NaN) grouped by `k` (0 … n − 1), in group order and sorted within each group; each
    group's start in that array and its count.

    A stable argsort of the group numbers (a radix sort when they fit in 16 bits), then each group's slice sorted
    in place: several times faster than a stable argsort of the values and one of the groups (or pandas' groupby
    quantile), and the same array, since values that tie are equal whatever their order (but for −0.0 and 0.0,
    which tie and differ: with a −0.0 among the values, both sorts are stable, as the values' row order had them)."""
    count = np.bincount(k, minlength=n)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    if np.signbit(v[v == 0]).any():
        order = np.argsort(v, kind="stable")
        return v[order[np.argsort(k[order], kind="stable")]], start, count
    out = v[group_order(k, n - 1)]
    several = np.flatnonzero(count > 1)
    for a, c in zip(start[several].tolist(), count[several].tolist()):
        out[a:a + c].sort()
    return out, start, count


def group_min_max_p95(k: np.ndarray, v: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group: min, max and the nearest-rank 95th percentile of non-NaN values."""
    ok = ~np.isnan(v)
    vv, start, count = sorted_by_group(k[ok], v[ok], n)
    out = np.full((3, n), np.nan)
    has = count > 0
    base = start[has]
    out[0, has] = vv[base]
    out[1, has] = vv[base + count[has] - 1]
    out[2, has] = vv[base + np.maximum(np.ceil(0.95 * count[has] - 1e-9).astype(np.int64), 1) - 1]
    return out[0], out[1], out[2]


AGGREGATIONS = ("size", "sum", "min", "max", "first", "mean")


def aggregated(grouped, **named: tuple[str, str]) -> pd.DataFrame:
    """grouped.agg(name=(column, function), …) of a groupby with its keys as the index, for the functions of
    AGGREGATIONS: each function called once over all of its columns, the same group kernels as .agg's, which
    dispatches column by column at several times the cost on a small table. The columns in the order named."""
    if grouped.ngroups == 0:
        return grouped.agg(**named)  # no group: the dtypes .agg gives an empty result
    columns: dict[str, list[str]] = {}
    for column, function in named.values():
        if function not in AGGREGATIONS:
            raise ValueError(f"aggregated: {function!r} is not one of {AGGREGATIONS}")
        if function != "size" and column not in columns.setdefault(function, []):
            columns[function].append(column)
    done = {function: getattr(grouped[cols], function)() for function, cols in columns.items()}
    size = grouped.size() if any(f == "size" for _, f in named.values()) else None
    return pd.DataFrame({name: size if function == "size" else done[function][column]
                         for name, (column, function) in named.items()})
