"""Statement text as the server logs it (pcapdecomp.slowlog.sqltext), checked against a real server: the
`slowlog-forms` recording logged every statement (long_query_time=0), so each exchange's text, in the form
`logged_form` / `statements` / `template_matches` give it, must be exactly what MariaDB wrote for it.
Plus the value rules on their own, and properties: the lexer never splits inside a quoted string or comment,
and binary-protocol values encoded on the wire, decoded by our reader and written the way the server writes
them, meet again."""

from __future__ import annotations

import struct
import time
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcapdecomp.mysql.params import decode_execute
from pcapdecomp.read.exchanges import extract
from pcapdecomp.slowlog.reader import read_slow_log
from pcapdecomp.slowlog.sqltext import (
    logged_form,
    parse_params,
    placeholders,
    read_literal,
    statements,
    template_matches,
    template_parts,
    values_equal,
)

FORMS = Path(__file__).resolve().parent.parent / "captures" / "slowlog-forms"


@pytest.fixture(scope="module")
def forms():
    x = extract(FORMS / "db.pcap").exchanges
    slow, _ = read_slow_log(FORMS / "slow.log")
    return x, slow


def logged_statements(row) -> list[str] | None:
    """What the server logs for one exchange, by our rules; None for commands it does not log."""
    if row["command"] == "COM_QUERY":
        return statements(logged_form(row["sql"]))
    return None


def test_every_logged_statement_is_its_exchanges_text_in_order(forms):
    # Per connection, the entries (log order) are the exchanges' statements (wire order) as the rules write them;
    # executes meet their entry value by value. The only exceptions are the ones the server itself makes.
    x, slow = forms
    checked = {"text": 0, "params": 0, "template": 0}
    for conn, rows in x.groupby("conn_id"):
        entries = slow[slow["thread_id"] == conn].sort_values("line")["sql"].tolist()
        expected: list[tuple[str, object]] = []
        for _, row in rows.sort_values("seq").iterrows():
            if row["command"] == "COM_QUERY":
                expected += [("text", s) for s in logged_statements(row)]
            elif row["command"] == "COM_STMT_EXECUTE":
                values = parse_params(row["params"])
                kind = "params" if values is not None and all(v != ("any",) for v in values) else "template"
                expected.append((kind, (template_parts(row["sql"]), None if kind == "template" else values)))
        assert len(entries) == len(expected), conn
        for entry, (kind, want) in zip(entries, expected):
            if kind == "text" and want == "EXECUTE forms_stmt USING @forms_a":
                assert entry == "SELECT 41 + 1 AS sql_level"  # the server logs what it executed
                continue
            if kind == "text":
                assert logged_form(entry) == want
            else:
                assert template_matches(logged_form(entry), *want), entry
            checked[kind] += 1
    assert checked == {"text": 37, "params": 6, "template": 1}  # + the EXECUTE and the lab's own socket entry: 46


def test_measured_forms(forms):
    x, slow = forms
    logged = set(slow["sql"])
    # leading blanks and trailing ';' and blanks go; comments, hints, case and literals stay; CRLF reads as LF
    assert {"SELECT 1 AS leading_blanks", "SELECT 2 AS trailing_semicolons", "/* leading comment */ SELECT 3 AS c",
            "SELECT 4 AS c -- trailing comment", "SELECT 5 AS c # hash comment", "SELECT\n8 AS crlf",
            "select 9 as lower_case", "SELECT 'a\x00b' AS nul_byte"} <= logged
    # a multi-statement packet: one entry per statement, its own text, leading blanks gone, trailing blank kept
    assert {"SELECT 10 AS a", "SELECT 11 AS b ", "SELECT 'x;y' AS semicolon_in_literal"} <= logged
    assert statements("SELECT 10 AS a; SELECT 11 AS b ;  SELECT 'x;y' AS semicolon_in_literal") == [
        "SELECT 10 AS a", "SELECT 11 AS b", "SELECT 'x;y' AS semicolon_in_literal"]


@pytest.mark.parametrize("text, parts", [
    ("SELECT 1", ["SELECT 1"]),
    ("SELECT 1;", ["SELECT 1"]),
    ("SELECT ';' ; SELECT \"a;b\"; SELECT `c;d`", ["SELECT ';'", 'SELECT "a;b"', "SELECT `c;d`"]),
    ("SELECT 'it\\'s;' ; SELECT 2", ["SELECT 'it\\'s;'", "SELECT 2"]),
    ("SELECT 'a''b;c'; SELECT 2", ["SELECT 'a''b;c'", "SELECT 2"]),
    # a ';' in a comment separates nothing; at the end of a statement it goes, like every trailing ';' (alloc_query)
    ("SELECT 1 /* ; */; SELECT 2 -- ;\n; SELECT 3 # ;\n", ["SELECT 1 /* ; */", "SELECT 2 --", "SELECT 3 #"]),
    ("SELECT 1--1; SELECT 2", ["SELECT 1--1", "SELECT 2"]),  # '--' without a blank is minus minus
    ("SELECT 'unterminated; SELECT 2", ["SELECT 'unterminated; SELECT 2"]),
])
def test_statements_split_only_at_top_level_semicolons(text, parts):
    assert statements(text) == parts


def test_placeholders_outside_strings_and_comments():
    text = "SELECT ? AS n /* a ? */, '?' AS q, `?` AS i, \"?\", ? -- ?\n, ? # ?\n"
    assert [text[i] for i in placeholders(text)] == ["?"] * 3
    assert len(template_parts(text)) == 4


@pytest.mark.parametrize("text, value", [
    ("NULL", ("null",)), ("-123", ("num", Decimal("-123"))), ("1.2345678901234567e20", ("num", Decimal("1.2345678901234567e20"))),
    ("'it\\'s a \\\\ back\\nslash'", ("text", "it's a \\ back\nslash")), ("'a''b'", ("text", "a'b")),
    ("TIMESTAMP'2024-05-01 10:00:00.000000'", ("text", "2024-05-01 10:00:00")),
    ("TIME'00:00:01.250000'", ("text", "00:00:01.25")), ("_utf8mb4'x'", ("text", "x")),
    ("X'41FF'", ("text", "A\ufffd")), ("0x4142", ("text", "AB")), ("'\\0\\Z'", ("text", "\x00\x1a")),
])
def test_read_literal(text, value):
    assert read_literal(text, 0) == (value, len(text))


def test_values_compare_by_value():
    assert values_equal(("num", Decimal("0.0000000001000000013351432")), ("num", Decimal("1.000000013351432e-10")))
    assert values_equal(("num", Decimal("12345.678")), ("text", "12345.678"))  # DECIMAL: a string on the wire
    assert not values_equal(("num", Decimal("1800000")), ("num", Decimal("2600000")))
    assert not values_equal(("text", "h02"), ("text", "h12"))
    assert not values_equal(("null",), ("text", "NULL"))


def test_the_issue_pair_does_not_meet():
    # issue 15: same fingerprint, different text, different time
    parts = template_parts("select benchmark(?, md5(?))")
    logged = "select benchmark(1800000, md5('h02'))"
    assert template_matches(logged, parts, parse_params("1800000, 'h02'"))
    assert not template_matches(logged, parts, parse_params("2600000, 'h12'"))
    assert not template_matches(logged, parts, parse_params("1800000, 'h12'"))
    assert logged_form(logged) != logged_form("select benchmark(2600000, md5('h12'))")


# --- properties -------------------------------------------------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


def _mysql_escape(s: str) -> str:
    """escape_string_for_mysql, as the server writes a string parameter into its log."""
    table = {"\0": "\\0", "\n": "\\n", "\r": "\\r", "\\": "\\\\", "'": "\\'", '"': '\\"', "\x1a": "\\Z"}
    return "'" + "".join(table.get(c, c) for c in s) + "'"


def _double(x: float) -> str:
    return repr(x).replace("e+", "e")  # the server's %g-like form differs in the exponent's '+'


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(-2**63, 2**63 - 1).map(lambda v: ("i", v)),
                          st.floats(allow_nan=False, allow_infinity=False, width=64).map(lambda v: ("d", v)),
                          _text.map(lambda v: ("s", v)), st.just(("n", None))), min_size=1, max_size=6))
def test_wire_values_meet_the_logged_statement(values):
    # Encode the parameters as a client does, decode them with our wire reader, write the statement the way the
    # server logs it: the template meets it; change one value and it does not.
    sql = "SELECT " + ", ".join(f"? AS c{i}" for i in range(len(values)))
    types, body, nulls = [], b"", bytearray((len(values) + 7) // 8)
    logged = []
    for i, (kind, v) in enumerate(values):
        if kind == "i":
            types.append(0x08)
            body += struct.pack("<q", v)
            logged.append(str(v))
        elif kind == "d":
            types.append(0x05)
            body += struct.pack("<d", v)
            logged.append(_double(v))
        elif kind == "s":
            raw = v.encode()
            types.append(0xFD)
            body += bytes([len(raw)]) + raw  # under 251 bytes: a one-byte length
            logged.append(_mysql_escape(v))
        else:
            types.append(0x06)
            nulls[i // 8] |= 1 << (i % 8)
            logged.append("NULL")
    payload = struct.pack("<IBI", 1, 0, 1) + bytes(nulls) + b"\x01" + b"".join(struct.pack("<H", t) for t in types) + body
    params, _, _ = decode_execute(payload, len(values), None, False)
    text = "SELECT " + ", ".join(f"{v} AS c{i}" for i, v in enumerate(logged))
    parts = template_parts(sql)
    wire = parse_params(params)
    assert wire is not None and template_matches(text, parts, wire)
    for i, (kind, v) in enumerate(values):
        other = list(logged)
        other[i] = {"i": lambda: str(v + 1 if v < 2**63 - 1 else v - 1), "d": lambda: next(_double(c) for c in (v * 2 + 1, 0.0, 1.0) if _double(c) != _double(v)),  # −1 · 2 + 1 = −1
                    "s": lambda: _mysql_escape(v + "x"), "n": lambda: "0"}[kind]()
        assert not template_matches("SELECT " + ", ".join(f"{x} AS c{j}" for j, x in enumerate(other)), parts, wire)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["SELECT ", "DO ", "select "]), _text), min_size=1, max_size=5))
def test_quoted_semicolons_never_split(items):
    parts = [f"{kw}{_mysql_escape(s)}" for kw, s in items]
    assert statements("; ".join(parts)) == [logged_form(p) for p in parts]


def test_lexer_stays_linear_on_hostile_text():
    # Unterminated quotes, comment openers, backslashes, markers: 200,000 characters of each are read in well
    # under a second of CPU (a quadratic scan would take minutes). The process's CPU time, not the wall clock: on a
    # loaded machine the worker waits for a core, which stretches the wall time (0.8 s of it for 0.4 s of CPU at
    # load 5), not the scan's work.
    for bad in ("'\\" * 100_000, "/*'" * 66_000, "`" + "''" * 100_000, "-- ;'\n" * 40_000, "?'" * 100_000,
                "\"\\'" * 66_000):
        t0 = time.process_time()
        statements(bad), placeholders(bad), logged_form(bad), template_parts(bad)
        assert time.process_time() - t0 < 2.0, bad[:6]
