"""Statement text as the server writes it to its slow log, for joining log entries to exchanges by exact text.

What the server does to a statement before it logs it (MariaDB 10.11 measured in the lab's `slowlog-forms`
recording, MySQL/Percona from their sources, `alloc_query` and `Item_param::query_val_str`):

- `alloc_query` strips leading blanks (space, \\t, \\n, \\r, \\v, \\f) and trailing blanks and ';' from the text the
  client sent; the log writes the rest byte for byte (comments and the case of keywords kept, no escaping)
  followed by ';\\n'. Reading the log back, each line loses its trailing '\\r's (`logged_form`).
- A multi-statement COM_QUERY is logged as one entry per statement: each statement's text from its first
  non-blank character up to (not including) its ';' (`statements`).
- A COM_STMT_EXECUTE is logged as the prepared text with each '?' replaced by its value
  (`Item_param::query_val_str`): integers in decimal (unsigned as unsigned), floats and doubles in the
  shortest-or-fixed `%g`-like form of the double (a float parameter as its double, 0.1f → 0.10000000149011612),
  decimals unquoted, temporal values quoted with MariaDB's type prefix (`TIMESTAMP'2024-05-01 10:00:00.512345'`,
  `DATE'…'`, `TIME'…'`; MySQL without prefix), strings and blobs quoted with backslash escapes
  (`\\0 \\n \\r \\\\ \\' \\" \\Z`; doubled quotes under NO_BACKSLASH_ESCAPES; hex for charsets where backslash is
  unsafe), long data inlined, NULL. `template_matches` compares such a text with the prepared text and the
  parameters decoded from the wire, value by value.

The lexer is linear: it jumps between quote, comment and separator characters with one compiled search, so no
input makes it backtrack.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

__all__ = ["logged_form", "statements", "placeholders", "template_parts", "parse_params", "read_literal",
           "template_values", "template_matches", "values_equal", "WILDCARD"]

_BLANKS = " \t\n\r\v\f"  # my_isspace() on the server's ASCII-compatible charsets
_STOPS = re.compile(r"['\"`;?#]|--|/\*")
_LINE_END_CR = re.compile(r"\r+\n")


def logged_form(text: str) -> str:
    """The text the slow log holds for a statement the client sent as `text` (as our parser reads it back)."""
    text = text.lstrip(_BLANKS)
    end = len(text)
    while end and (text[end - 1] == ";" or text[end - 1] in _BLANKS):
        end -= 1
    text = text[:end]
    if "\r" in text:
        text = _LINE_END_CR.sub("\n", text)  # the reader drops each line's trailing '\r's
    return text


def _scan(text: str, want_semicolons: bool, want_marks: bool) -> list[int]:
    """Positions of top-level ';' and/or '?' (outside quotes, backquotes and comments)."""
    out: list[int] = []
    pos, n = 0, len(text)
    search = _STOPS.search
    while pos < n:
        m = search(text, pos)
        if m is None:
            break
        tok, at = m.group(), m.start()
        if tok in ("'", '"', "`"):
            pos = _skip_quoted(text, at, tok)
        elif tok == ";":
            if want_semicolons:
                out.append(at)
            pos = at + 1
        elif tok == "?":
            if want_marks:
                out.append(at)
            pos = at + 1
        elif tok == "/*":
            end = text.find("*/", at + 2)
            pos = n if end < 0 else end + 2
        elif tok == "--" and not (at + 2 < n and text[at + 2] not in _BLANKS):
            # MySQL's '-- ' comment needs a blank (or the end) after the dashes; '--1' is minus minus one
            end = text.find("\n", at)
            pos = n if end < 0 else end + 1
        elif tok == "#":
            end = text.find("\n", at)
            pos = n if end < 0 else end + 1
        else:
            pos = at + len(tok)
    return out


def _skip_quoted(text: str, at: int, quote: str) -> int:
    """Index just past the string/identifier opened at `at` (the end of the text when it never closes).
    Backslash escapes the next character in strings; a doubled quote stands for itself."""
    n = len(text)
    pos = at + 1
    while True:
        end = text.find(quote, pos)
        if end < 0:
            return n
        if quote != "`":
            # an odd run of backslashes just before the quote escapes it
            back = end - 1
            while back >= pos and text[back] == "\\":
                back -= 1
            if (end - 1 - back) % 2 == 1:
                pos = end + 1
                continue
        if end + 1 < n and text[end + 1] == quote:
            pos = end + 2
            continue
        return end + 1


def statements(text: str) -> list[str]:
    """The statements of a multi-statement text, each as the server logs it (empty ones dropped); [text] when
    there is one."""
    cuts = _scan(text, want_semicolons=True, want_marks=False)
    if not cuts:
        return [text]
    out, start = [], 0
    for cut in [*cuts, len(text)]:
        part = logged_form(text[start:cut])
        if part:
            out.append(part)
        start = cut + 1
    return out or [text]


def placeholders(text: str) -> list[int]:
    """Positions of the '?' parameter markers of a prepared text (not those in strings or comments)."""
    return _scan(text, want_semicolons=False, want_marks=True)


def template_parts(prepared: str) -> list[str]:
    """The prepared text split at its markers, in logged form: parts[0] + v1 + parts[1] + … + parts[-1]."""
    text = prepared.lstrip(_BLANKS)
    marks = placeholders(text)
    parts, start = [], 0
    for at in marks:
        parts.append(text[start:at])
        start = at + 1
    parts.append(text[start:])
    parts[-1] = logged_form(parts[-1]) if len(parts) == 1 else parts[-1].rstrip(_BLANKS + ";")
    return [_LINE_END_CR.sub("\n", p) if "\r" in p else p for p in parts]


# --- literal values ---------------------------------------------------------------------------------------------

WILDCARD = ("any",)  # a parameter whose value the wire did not show (long data): matches any literal
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_PREFIX = re.compile(r"(?:TIMESTAMP|DATETIME|DATE|TIME|_[A-Za-z0-9]+)\s*(?=')", re.IGNORECASE)
_HEX = re.compile(r"[xX]'([0-9A-Fa-f]*)'|0x([0-9A-Fa-f]+)")
_LONG_DATA = re.compile(r"<long data: \d+ bytes>")
_UNESCAPE = {"0": "\0", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "b": "\b"}
_FRACTION_ZEROS = re.compile(r"(\d\d:\d\d:\d\d)\.0*$|(\d\d:\d\d:\d\d\.\d*?)0+$")


def _unescape(body: str) -> str:
    if "\\" not in body and "''" not in body:
        return body
    out, i, n = [], 0, len(body)
    while i < n:
        c = body[i]
        if c == "\\" and i + 1 < n:
            out.append(_UNESCAPE.get(body[i + 1], body[i + 1]))
            i += 2
        elif c == "'" and i + 1 < n and body[i + 1] == "'":
            out.append("'")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _number(text: str) -> tuple:
    try:
        return ("num", Decimal(text))
    except InvalidOperation:  # pragma: no cover - the pattern only lets numbers through
        return ("text", text)


def read_literal(text: str, pos: int) -> tuple[tuple, int] | None:
    """The SQL literal at text[pos:] as (value, end): ('null',), ('num', Decimal), ('text', str); None when no
    literal starts there. Temporal strings lose trailing zeros of their fraction (the server prints a datetime
    with zero microseconds without them)."""
    if text.startswith(("NULL", "null"), pos):
        return ("null",), pos + 4
    m = _HEX.match(text, pos)
    if m:
        digits = m.group(1) if m.group(1) is not None else m.group(2)
        if len(digits) % 2 == 0:
            return ("text", bytes.fromhex(digits).decode("utf-8", "replace")), m.end()
    temporal = False
    m = _PREFIX.match(text, pos)
    if m:
        temporal = not m.group().startswith("_")
        pos = m.end()
    if pos < len(text) and text[pos] == "'":
        end = _skip_quoted(text, pos, "'")
        if end > len(text) or text[end - 1] != "'" or end - pos < 2:
            return None
        body = _unescape(text[pos + 1:end - 1])
        if temporal or _looks_temporal(body):
            body = _FRACTION_ZEROS.sub(lambda t: t.group(1) or t.group(2), body)
        return ("text", body), end
    if m:  # a prefix without a string
        return None
    m = _NUMBER.match(text, pos)
    if m:
        return _number(m.group()), m.end()
    return None


def _looks_temporal(body: str) -> bool:
    return len(body) >= 8 and body[2:3] == ":" or (len(body) >= 19 and body[4:5] == "-" and body[13:14] == ":")


def parse_params(params: str | None) -> list[tuple] | None:
    """The `params` column (comma-separated SQL literals) as values; None when it is not readable."""
    if params is None:
        return None
    if params == "":
        return []
    out, pos, n = [], 0, len(params)
    while pos <= n:
        m = _LONG_DATA.match(params, pos)
        if m:
            value, pos = WILDCARD, m.end()
        else:
            got = read_literal(params, pos)
            if got is None:
                return None
            value, pos = got
        out.append(value)
        if pos == n:
            return out
        if not params.startswith(", ", pos):
            return None
        pos += 2
    return None


def values_equal(logged: tuple, wire: tuple) -> bool:
    if wire is WILDCARD or wire == WILDCARD:
        return True
    if logged == wire:
        return True
    a, b = _as_number(logged), _as_number(wire)
    if a is not None and b is not None:
        if a == b:
            return True
        if a.as_tuple().exponent == 0 and b.as_tuple().exponent == 0:
            return False  # integers: exactly
        try:  # a float parameter printed with fewer digits by the server than by repr(), or the other way
            x, y = float(a), float(b)
        except (OverflowError, ValueError):
            return False
        return math.isfinite(x) and math.isclose(x, y, rel_tol=1e-14, abs_tol=0.0)
    return False


def _as_number(value: tuple) -> Decimal | None:
    if value[0] == "num":
        return value[1]
    if value[0] == "text" and _NUMBER.fullmatch(value[1].strip()):  # a decimal sent as a string, logged bare
        try:
            return Decimal(value[1].strip())
        except InvalidOperation:  # pragma: no cover
            return None
    return None


def template_values(logged: str, parts: list[str]) -> list[tuple] | None:
    """The literals standing in a logged text where the template (parts[0] ? parts[1] … ? parts[-1]) has its
    markers; None when the text is not that template."""
    if not logged.startswith(parts[0]):
        return None
    pos, values = len(parts[0]), []
    for part in parts[1:]:
        got = read_literal(logged, pos)
        if got is None:
            return None
        value, pos = got
        values.append(value)
        if not logged.startswith(part, pos):
            return None
        pos += len(part)
    return values if pos == len(logged) else None


def template_matches(logged: str, parts: list[str], values: list[tuple] | None) -> bool:
    """Does the logged text read as parts[0] v1 parts[1] … parts[-1], each vi a literal equal to values[i-1]
    (any literal when values is None)?"""
    got = template_values(logged, parts)
    if got is None or values is None:
        return got is not None
    return len(got) == len(values) and all(values_equal(a, b) for a, b in zip(got, values))
