"""The verdict's words, in one room: how a wait or an execution is said with its bound (up to, at least) and where
it is known from, a span of durations, a count of statements, thread groups, a connection and a quoted statement.
Every part that tells the verdict uses these (explain/verdict.py, explain/playbook.py, explain/netstory.py; render/text.py prints
what they made), so that a phrase is changed here once. Numbers are formatted by core/formats.py; this module puts
them in words."""

from __future__ import annotations

import math

import numpy as np

from ..core.formats import clip, plural, seconds_rounded

SQL_CHARS = 80  # a statement quoted in a sentence is clipped to this many characters
SAME_S = 0.0005  # two durations that differ by less than this are told as one (they round alike)


def quoted(sql, limit: int = SQL_CHARS) -> str:
    """A statement in a sentence: `its text`, clipped."""
    return f"`{clip(sql, limit)}`"


def statements(n: int) -> str:
    """'1 statement', '3 statements'."""
    return f"{n} {plural(n, 'statement', 'statements')}"


def up_to(seconds: float) -> str:
    """A wait or a time known by its largest value, or bounded from above: 'up to 1.2 s'."""
    return f"up to {seconds_rounded(seconds)}"


def at_least(seconds: float) -> str:
    """A time bounded from below (the slow log left the statement out: its wait is at least this): 'at least 1.2 s'."""
    return f"at least {seconds_rounded(seconds)}"


def span(lo: float, hi: float, between: str = " to ", rel_tol: float | None = None, alike_as_lo: bool = False) -> str:
    """Durations from `lo` to `hi`: one value when they are alike (closer than SAME_S, or within `rel_tol` of each
    other when given), `hi` (or `lo` with `alike_as_lo`), else both with `between` ('0.2 s to 1.1 s',
    '0.2 s–1.1 s')."""
    alike = math.isclose(lo, hi, rel_tol=rel_tol) if rel_tol is not None else hi - lo < SAME_S
    if alike:
        return seconds_rounded(lo if alike_as_lo else hi)
    return f"{seconds_rounded(lo)}{between}{seconds_rounded(hi)}"


def span_of(values: np.ndarray) -> str:
    """The span of the known durations among `values` (NaN: unknown), 'unknown' when none is known."""
    values = values[~np.isnan(values)]
    if not len(values):
        return "unknown"
    return span_known(float(values.min()), float(values.max()))


def span_known(lo: float, hi: float) -> str:
    """span_of from the known durations' least and greatest (NaN: none is known)."""
    return "unknown" if np.isnan(lo) else span(lo, hi)


def thread_groups(groups: list) -> str:
    """'thread group 3', 'thread groups 1, 2 and 3'."""
    if len(groups) == 1:
        return f"thread group {groups[0]}"
    return "thread groups " + ", ".join(map(str, groups[:-1])) + f" and {groups[-1]}"


def connection(conn_id) -> str:
    """'connection 12'; 'connection unknown' when no greeting, snapshot or slow log named it."""
    return f"connection {conn_id}" if conn_id is not None else "connection unknown"


# How a statement's execution is said, by where it is known from (exchanges.exec_source): the word before the time
# and what follows it. A bound or an estimate is said to be one.
_EXEC_WORD = {"slow_log": "executing", "flagged_slow": "executing up to", "fingerprint_median": "executing about",
              "below_long_query_time": "executing up to"}
_EXEC_TAIL = {"slow_log": "", "flagged_slow": " (flagged slow on the wire)", "fingerprint_median": " (estimate)",
              "below_long_query_time": " (a bound)"}


def execution(c: dict) -> str:
    """How long a statement (a culprit's dict: exec_s, exec_source, server_s, queue_min_s) executed, in words."""
    if c.get("exec_s") is None:
        if c.get("exec_source") == "below_long_query_time" and c.get("server_s") is not None:
            return f"executing {up_to(c['server_s'] - (c.get('queue_min_s') or 0.0))} (a bound)"
        return "execution unknown"
    source = c.get("exec_source")
    return f"{_EXEC_WORD.get(source, 'executing')} {seconds_rounded(c['exec_s'])}{_EXEC_TAIL.get(source, '')}"


def queue_source(source: str) -> str:
    """How a wait is known (exchanges.queue_source), in words."""
    return {"measured": "measured: server time − Query_time", "lower_bound": "at least: not in the slow log"}.get(
        source, source)
