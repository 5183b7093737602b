"""Property tests of the slow-log reader and the join on mutated real slow logs (hypothesis).

Sources: every log in tests/data/slowlog (recorded MariaDB, hand-written MySQL/Percona layouts), every bundled
recording's slow.log, and — when PCAPDECOMP_PT_SLOWLOGS names a folder holding them — percona-toolkit's sample
slow logs (t/lib/samples/slowlogs, GPL: read from a local checkout, never copied here). A mutation changes
numbers (to negative, huge, exponent, garbage), times, lines (deleted, doubled, swapped, garbage inserted) or
cuts the file. Whatever comes out: no exception but SlowLogError, the declared dtypes, every number in range,
the counts consistent, the sans-IO parser agreeing with the file reader; a changed value changes only its own
entry; and the join never pairs an entry with a statement of another text."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from joininput import exchange_table

from pcapdecomp.core.errors import SlowLogError
from pcapdecomp.slowlog.join import REASONS, join_slow_log, rows_for_join
from pcapdecomp.slowlog.reader import MAX_EPOCH_NS, MIN_EPOCH_NS, SLOWLOG_COLUMNS, parse_slow_log, read_slow_log
from pcapdecomp.slowlog.sqltext import logged_form, statements

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*(ROOT / "tests" / "data" / "slowlog").glob("*.log"), *(ROOT / "captures").glob("*/slow.log")])
_PT = os.environ.get("PCAPDECOMP_PT_SLOWLOGS")
if _PT and Path(_PT).is_dir():
    SOURCES += sorted(p for p in Path(_PT).iterdir() if p.is_file() and not p.name.endswith(".gz"))
TEXTS = [p.read_bytes().decode("utf-8", "replace") for p in SOURCES]
TEXTS = [t for t in TEXTS if "Query_time" in t]

BAD_NUMBERS = ["-0.5", "-1", "1e30", "99999999999999999999", "0", "18446744073709551616", "253402300800",
               "nan", "2.5.5", "1" * 40, "0x10", "+3", "007", "1.0000000000001"]
JUNK = st.lists(st.sampled_from(list("#;: \t\r\x00\u2028'\"\\-") + ["Query_time", "Time", "SET timestamp=", "use x",
                                                                    "User@Host", "\n", "1", "a"]), max_size=20).map("".join)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _header_number_spots(lines: list[str]) -> list[tuple[int, int, int]]:
    """(line, start, end) of every number in a value of a header line (not a '# Time:' line: its shape decides
    where entries start) or of a SET timestamp line."""
    spots = []
    for i, line in enumerate(lines):
        if line.startswith(("# Query_time:", "# Rows_affected:", "# Thread_id:", "# Schema:", "SET timestamp=",
                            "# Bytes_sent:")):
            spots += [(i, m.start(), m.end()) for m in _NUMBER.finditer(line)]
    return spots


@st.composite
def mutated(draw, value_only: bool = False):
    text = draw(st.sampled_from(TEXTS))
    lines = text.split("\n")
    spots = _header_number_spots(lines)
    changes = []
    if value_only:
        if not spots:
            return text, lines, []
        i, a, b = draw(st.sampled_from(spots))
        lines[i] = lines[i][:a] + draw(st.sampled_from(BAD_NUMBERS)) + lines[i][b:]
        return "\n".join(lines), lines, [i]
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["number", "number", "time", "delete", "dup", "swap", "insert", "cut"]))
        n = len(lines)
        spots = _header_number_spots(lines)
        if op == "number" and spots:
            i, a, b = draw(st.sampled_from(spots))
            lines[i] = lines[i][:a] + draw(st.sampled_from(BAD_NUMBERS)) + lines[i][b:]
        elif op == "time":
            times = [i for i, line in enumerate(lines) if line.startswith("# Time:")]
            if times:
                i = draw(st.sampled_from(times))
                lines[i] = "# Time: " + draw(st.from_regex(r"[0-9]{6} [ 0-9]{1,2}:[0-9]{2}:[0-9]{2}|[0-9]{4}-[0-9]{2}-"
                                                          r"[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})",
                                                          fullmatch=True))
        elif op == "delete" and n > 1:
            del lines[draw(st.integers(0, n - 1))]
        elif op == "dup":
            i = draw(st.integers(0, n - 1))
            lines.insert(i, lines[i])
        elif op == "swap" and n > 1:
            i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "insert":
            lines.insert(draw(st.integers(0, n)), draw(JUNK))
        elif op == "cut":
            joined = "\n".join(lines)
            lines = joined[: draw(st.integers(0, len(joined)))].split("\n")
        changes.append(op)
    return "\n".join(lines), lines, changes


def _read(text: str):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "slow.log"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        return read_slow_log(path)


def _check_frame(frame: pd.DataFrame, stats) -> None:
    assert len(frame) == stats.entries
    for name, dtype in ((c.name, c.dtype) for c in SLOWLOG_COLUMNS):
        assert str(frame[name].dtype) == dtype or (dtype == "object" and frame[name].dtype == object), name
    for col in ("time", "timestamp", "start", "end"):
        ns = frame[col].dropna().astype("int64")
        assert ((ns >= MIN_EPOCH_NS) & (ns < MAX_EPOCH_NS)).all(), col
    qt = frame["query_time_ns"].dropna()
    assert ((qt >= 0) & (qt <= 10**17)).all()
    for col in ("rows_sent", "rows_examined", "rows_affected", "bytes_sent", "errno", "killed", "thread_id"):
        assert (frame[col].dropna() >= 0).all(), col


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_any_mutation_reads_or_refuses_cleanly(case):
    text, lines, _ = case
    try:
        frame, stats = _read(text)
    except SlowLogError:
        return
    _check_frame(frame, stats)
    header_times = sum(line.count("Query_time:") for line in lines if line.startswith("#"))
    assert stats.entries <= header_times
    entries, sans_io = parse_slow_log(text.replace("\r\n", "\n"))
    assert len(entries) == len(frame) or "\r" in text  # the file reader splits on '\n' only, like the server


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(value_only=True))
def test_a_changed_value_changes_only_its_entry(case):
    text, lines, changed = case
    if not changed:
        return
    original = next(t for t in TEXTS if t.split("\n")[:changed[0]] == lines[:changed[0]]
                    and t.split("\n")[changed[0] + 1:] == lines[changed[0] + 1:])
    before, s0 = parse_slow_log(original)
    old_line = original.split("\n")[changed[0]]
    assume(not any(old_line in e.sql for e in before))  # a header-like line the parser (rightly) read as SQL
    after, s1 = parse_slow_log(text)
    assert len(before) == len(after)
    line_no = changed[0] + 1
    affected = max((i for i, e in enumerate(after) if e.line <= line_no), default=None)
    for i, (a, b) in enumerate(zip(before, after)):
        if i != affected:
            assert a == b
        else:
            assert a.sql == b.sql and a.line == b.line
            assert s1.damaged_values >= s0.damaged_values or a != b


# --- the join on mutated logs ---------------------------------------------------------------------------------

_JOIN_SETS = ["maxthreads", "group-stall", "midstream-join"]
_ROWS: dict[str, pd.DataFrame] = {}


def _rows(name: str) -> pd.DataFrame:
    """The join's rows of the set's exchanges, made once per set (every example joins a mutated log to them); each
    example has its own copy."""
    if name not in _ROWS:
        _ROWS[name] = rows_for_join(exchange_table(ROOT / "captures" / name))
    return _ROWS[name].copy()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_JOIN_SETS), st.data())
def test_join_on_mutated_logs_pairs_only_equal_texts(name, data):
    text = (ROOT / "captures" / name / "slow.log").read_text()
    lines = text.split("\n")
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(st.sampled_from(["number", "text", "delete", "dup"]))
        if op == "number" and _NUMBER.search(lines[i]):
            m = list(_NUMBER.finditer(lines[i]))[data.draw(st.integers(0, len(_NUMBER.findall(lines[i])) - 1))]
            lines[i] = lines[i][:m.start()] + data.draw(st.sampled_from(BAD_NUMBERS)) + lines[i][m.end():]
        elif op == "text" and not lines[i].startswith("#"):
            lines[i] = lines[i].replace("(", "( ", 1)
        elif op == "delete":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
    try:
        frame, _ = _read("\n".join(lines))
    except SlowLogError:
        return
    rows = _rows(name)
    join = join_slow_log(rows, frame)
    assert set(join.reasons) <= set(REASONS) | {""}
    for e in np.flatnonzero(join.entry_row >= 0):
        row = rows.iloc[int(join.entry_row[e])]
        sql = frame["sql"].iloc[e]
        assert row["sql"] is not None and logged_form(sql) in statements(logged_form(row["sql"])) + [None] \
            or row["command"] == "COM_STMT_EXECUTE"
    assert not (join.undecided & (join.entry >= 0)).any()
