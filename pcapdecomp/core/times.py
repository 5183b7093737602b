"""Time columns as integer nanoseconds, and back: every stage keeps its times as int64 ns since the epoch (UTC) and
converts at its edges with these."""

from __future__ import annotations

import numpy as np
import pandas as pd


def ts_ns(col: pd.Series, copy: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """A datetime column as (int64 ns, valid mask); null entries hold 0. A column of another unit or zone, or of
    objects, is read as UTC first (naive times are UTC). `copy=False`: the column's own values, read-only (no
    array of every row made for a reader that only reads); its null entries then hold int64's minimum, not 0."""
    if col.dtype not in (np.dtype("M8[ns]"), pd.DatetimeTZDtype("ns", "UTC")) and len(col):
        col = pd.to_datetime(col, utc=True).astype("datetime64[ns, UTC]")
    if col.dtype in (np.dtype("M8[ns]"), pd.DatetimeTZDtype("ns", "UTC")):
        values = col.array.asi8  # NaT is int64's minimum
        valid = values != np.iinfo(np.int64).min
        if copy:
            values = values.copy()
            values[~valid] = 0
        else:
            values = values.view()
            values.flags.writeable = False
        return values, valid
    valid = col.notna().to_numpy().copy()
    values = np.zeros(len(col), dtype=np.int64)
    values[valid] = col[valid].to_numpy(dtype="datetime64[ns]").astype(np.int64)
    return values, valid


def to_ts(ns: np.ndarray, valid: np.ndarray) -> pd.Series:
    """int64 ns as a datetime64[ns, UTC] column, NaT where not `valid` (NaT is int64's minimum: a view, no
    conversion)."""
    ns = np.asarray(ns).astype(np.int64, copy=False)
    return pd.Series(np.where(valid, ns, np.iinfo(np.int64).min).view("M8[ns]")).dt.tz_localize("UTC")


def ts_ns_or(col: pd.Series, missing: int) -> np.ndarray:
    """A datetime column as int64 ns, `missing` where null (a time that sorts after or before every other)."""
    values, valid = ts_ns(col)
    values[~valid] = missing
    return values


def ts_ns_float(col: pd.Series) -> np.ndarray:
    """A datetime column as float64 ns, NaN where null (for arithmetic that carries the unknown along)."""
    values, valid = ts_ns(col)
    out = values.astype("float64")
    out[~valid] = np.nan
    return out


def timestamp_ns(value) -> int:
    """One time (a Timestamp, a datetime, an ISO text) as int64 ns since the epoch."""
    return int(pd.Timestamp(value).value)
