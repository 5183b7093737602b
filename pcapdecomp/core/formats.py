"""How values read in the outputs: the report and its figures, the verdict, the evidence summary and comments, the
comparison. One module, so a value reads the same wherever it is shown and a change of style is made once.

Durations come in four styles, each where its reader needs it:
- `seconds` for tables and hover text: 3.809 s, 12.34 ms, 87 µs;
- `seconds_rounded` for sentences (the verdict): 3.809 s, 12 ms, 1.5 ms, 87 µs;
- `seconds_ms` for evidence (frame comments, summary.md), to the microsecond: 3.809 s, 12.340 ms, 0.087 ms;
- `seconds_significant` for a comparison's chains of values: 1,234.500 s, 12.3 ms, 87 µs, 0 s.
Times of day are UTC: `clock` to the microsecond (tables), `clock_ms` to the millisecond (sentences).

Nothing here escapes for a context (HTML, Markdown, CSV): the output module does that on what these return.
"""

from __future__ import annotations

import pandas as pd

MISSING = "–"  # what a table cell shows for an unknown value


def is_missing(v) -> bool:
    """None, NaN, NaT or pd.NA (a text never is, whatever it says)."""
    return v is None or (not isinstance(v, str) and bool(pd.isna(v)))


# --- text -------------------------------------------------------------------------------------------------------


def as_text(v, missing: str = "") -> str:
    """A value as text: a timestamp in ISO 8601, anything else as str()."""
    if is_missing(v):
        return missing
    return v.isoformat() if isinstance(v, pd.Timestamp) else str(v)


def cell(v) -> str:
    """A table cell: as `as_text`, floats to six significant digits."""
    if isinstance(v, float) and not is_missing(v):
        return f"{v:.6g}"
    return as_text(v)


def clip(value, limit: int, flat: bool = True) -> str:
    """At most `limit` characters, an ellipsis in the last one when cut; `flat`: runs of white space (line breaks
    too) become one space first. A missing value is empty."""
    if is_missing(value):
        return ""
    out = " ".join(str(value).split()) if flat else str(value)
    return out if len(out) <= limit else out[: limit - 1] + "…"


def plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


# --- numbers ----------------------------------------------------------------------------------------------------


def integer(v, missing: str = "?") -> str:
    """An identifier-like integer (connection id, thread group): 12."""
    return missing if is_missing(v) else str(int(v))


def count(v) -> str:
    """A count with thousands separators: 12,345."""
    return MISSING if is_missing(v) else f"{int(v):,}"


def share(v) -> str:
    """A fraction as a percentage: 0.1234 → 12.3 %."""
    return MISSING if is_missing(v) else f"{100 * v:.1f} %"


def pct_change(p: float) -> str:
    """A signed change in per cent: +12.3 %, −4.0 %, ±0 %. More digits when one would round a change that is not
    ±100 % to it (−99.996 % is not −100 %)."""
    if round(p, 1) == 0:
        return "±0 %"
    digits = 1
    while round(abs(p), digits) == 100 and abs(p) != 100 and digits < 4:
        digits += 1
    return f"{p:+.{digits}f} %".replace("-", "−")


# --- durations (seconds in, text out) ---------------------------------------------------------------------------


def seconds(v, missing: str = MISSING) -> str:
    """A duration for tables: 3.809 s, 12.34 ms, 87 µs."""
    if is_missing(v):
        return missing
    v = float(v)
    if abs(v) >= 1:
        return f"{v:.3f} s"
    if abs(v) >= 1e-3:
        return f"{v * 1e3:.2f} ms"
    return f"{v * 1e6:.0f} µs"


def seconds_rounded(v) -> str:
    """A duration for a sentence, as few digits as tell it: 3.809 s, 12 ms, 1.5 ms, 87 µs."""
    if is_missing(v):
        return "?"
    v = float(v)
    if abs(v) >= 1:
        return f"{v:.3f} s"
    if abs(v) >= 0.01:
        return f"{v * 1e3:.0f} ms"
    if abs(v) >= 0.001:
        return f"{v * 1e3:.1f} ms"
    return f"{v * 1e6:.0f} µs"


def seconds_ms(v) -> str:
    """A duration to the microsecond, below a second in ms: 3.809 s, 12.340 ms, 0.087 ms (evidence)."""
    if is_missing(v):
        return MISSING
    v = float(v)
    return f"{v:.3f} s" if abs(v) >= 1 else f"{v * 1e3:.3f} ms"


def seconds_significant(v: float) -> str:
    """A duration to three significant digits below a second: 1,234.500 s, 12.3 ms, 87 µs, 0 s."""
    v = float(v)
    if v == 0:
        return "0 s"
    if abs(v) >= 1:
        return f"{v:,.3f} s"
    if abs(v) >= 1e-3:
        return f"{v * 1e3:.3g} ms"
    return f"{v * 1e6:.3g} µs"


# --- times of day (UTC) -----------------------------------------------------------------------------------------


def _timestamp(v) -> pd.Timestamp:
    if isinstance(v, pd.Timestamp):
        return v
    if isinstance(v, str):
        return pd.Timestamp(v)
    return pd.Timestamp(int(v), unit="ns", tz="UTC")


def clock(v, date: bool = False, missing: str = MISSING) -> str:
    """A time of day to the microsecond, the date in front when asked: 05:42:36.320020. `v`: integer ns since the
    epoch, a Timestamp or an ISO 8601 text."""
    if is_missing(v):
        return missing
    return _timestamp(v).strftime("%Y-%m-%d %H:%M:%S.%f" if date else "%H:%M:%S.%f")


def clock_ms(v) -> str:
    """A time of day to the millisecond, for a sentence: 05:42:36.320 UTC."""
    ts = _timestamp(v)
    return ts.strftime("%H:%M:%S.") + f"{ts.microsecond // 1000:03d} UTC"


__all__ = [
    "MISSING", "is_missing", "as_text", "cell", "clip", "plural", "integer", "count", "share", "pct_change", "seconds",
    "seconds_rounded", "seconds_ms", "seconds_significant", "clock", "clock_ms",
]
