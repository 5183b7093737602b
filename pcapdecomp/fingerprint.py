"""Query fingerprints and Query IDs exactly as percona-toolkit computes them.

A fingerprint abstracts a statement's literals so that statements differing only in values group together:
``SELECT * FROM t WHERE id = 42`` becomes ``select * from t where id = ?``. pt-query-digest groups its report by
fingerprint and names each group by a Query ID, the MD5 of the fingerprint. Using the same two functions lets a
pcapdecomp result be joined with a pt-query-digest report of the same slow log.

This is a line-by-line port of ``QueryRewriter::fingerprint`` from percona-toolkit 3.2.1 (fat-packed into
``/usr/bin/pt-fingerprint`` and ``/usr/bin/pt-query-digest``). The two tools carry slightly different copies:
pt-query-digest also turns ``true``/``false`` into ``?``; hence :func:`fingerprint` (pt-fingerprint) and
:func:`digest_fingerprint` (pt-query-digest). The algorithm is a chain of regex substitutions, not a parser, and
its quirks are kept on purpose (``ORDER BY x ascii`` loses its ``asc``; ``0xFF`` becomes ``?ff``): a "fixed"
fingerprint would produce a different Query ID.

Perl runs these regexes on bytes, where ``\\s``, ``\\w``, ``\\b``, ``/i`` and ``lc`` know ASCII only. Every
pattern here is compiled with ``re.ASCII`` and lowercasing touches A-Z only, so on a ``str`` the port gives the
same result as Perl on that text's bytes: non-ASCII characters are opaque "other" characters to both. Text
decoded from raw bytes with ``errors="surrogateescape"`` round-trips through :func:`query_id` byte-exactly.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["fingerprint", "digest_fingerprint", "query_id"]

_A = re.ASCII
_I = re.IGNORECASE | re.ASCII
_IS = re.IGNORECASE | re.DOTALL | re.ASCII

# Early returns, tried on the raw text in this order.
_MYSQLDUMP_RE = re.compile(r"SELECT /\*!40001 SQL_NO_CACHE \*/ \* FROM `", _A)
_PERCONA_TOOLKIT_RE = re.compile(r"/\*\w+\.\w+:[0-9]/[0-9]\*/", _A)  # pt-table-checksum's /*db.tbl:1/5*/ tag
_ADMIN_PREFIX = "administrator command: "
_CALL_RE = re.compile(r"\s*(call\s+\S+)\(", _I)
# A multi-row INSERT/REPLACE is cut to its first row before anything else, so long batches stay cheap.
_MULTI_ROW_INSERT_RE = re.compile(r"((?:INSERT|REPLACE)(?: IGNORE)?\s+INTO.+?VALUES\s*\(.*?\))\s*,\s*\(", _IS)

# Comments. /*!50100 ... */ version comments stay: MySQL executes them. A one-line comment must reach the
# end of its line without meeting a quote. Perl's \Z also matches before a final newline; the [\r\n]
# alternative already covers that position, so Python's \Z is equivalent here.
_MULTI_LINE_COMMENT_RE = re.compile(r"/\*[^!].*?\*/", re.DOTALL | _A)
_ONE_LINE_COMMENT_RE = re.compile(r"(?:--|#)[^'\"\r\n]*(?=[\r\n]|\Z)", _A)
_USE_RE = re.compile(r"use \S+(?=\n?\Z)", _I)  # Perl: \Ause \S+\Z

# Literals.
_ESCAPED_QUOTE_RE = re.compile(r"\\[\"']", _A)
_DOUBLE_QUOTED_RE = re.compile(r'".*?"', re.DOTALL | _A)
_SINGLE_QUOTED_RE = re.compile(r"'.*?'", re.DOTALL | _A)
_BOOLEAN_RE = re.compile(r"\bfalse\b|\btrue\b", _IS)  # pt-query-digest's copy only
_MD5_RE = re.compile(r"([._-])[a-f0-9]{32}", _A)  # case-sensitive: runs before lowercasing, as in Perl
_NUMBER_RE = re.compile(r"[0-9+-][0-9a-f.xb+-]*", _A)
_WORD_NUMBER_RE = re.compile(r"\b[0-9+-][0-9a-f.xb+-]*", _A)  # --match-embedded-numbers
_NUMBER_PREFIX_RE = re.compile(r"[xb.+-]\?", _A)
_NUMBER_PREFIX_NO_DOT_RE = re.compile(r"[xb+-]\?", _A)  # --match-md5-checksums keeps "db.?" dots

# Layout. Perl's tr[ \n\t\r\f][ ]s squeezes runs of these five (not \v) into one space.
_PERL_SPACE = " \t\n\r\f\v"  # Perl's \s on bytes (since 5.18, with \v)
_WHITESPACE_RUN_RE = re.compile(r"[ \n\t\r\f]+", _A)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

# Structure, on the lowercased text.
_NULL_RE = re.compile(r"\bnull\b", _A)
_LIST_RE = re.compile(r"\b(in|values?)(?:[\s,]*\([\s?,]*\))+", _A)
_UNION_RE = re.compile(r"\b(select\s.*?)(?:(\sunion(?:\sall)?)\s\1)+", _A)
_LIMIT_RE = re.compile(r"\blimit \?(?:, ?\?| offset \?)?", _A)
_ORDER_BY_RE = re.compile(r"\bORDER BY ", _I)
_ASC_RE = re.compile(r"(.+?)\s+ASC", _I)


def fingerprint(sql: str, *, match_embedded_numbers: bool = False, match_md5_checksums: bool = False) -> str:
    """What ``pt-fingerprint --query SQL`` prints, without the newline print adds.

    The keyword options are pt-fingerprint's ``--match-embedded-numbers`` and ``--match-md5-checksums``.
    """
    return _fingerprint(sql, False, match_embedded_numbers, match_md5_checksums)


def digest_fingerprint(sql: str, *, preserve_embedded_numbers: bool = False) -> str:
    """The fingerprint pt-query-digest groups by: pt-fingerprint's, plus ``true``/``false`` become ``?``.

    ``preserve_embedded_numbers`` is pt-query-digest's ``--preserve-embedded-numbers``.
    """
    return _fingerprint(sql, True, preserve_embedded_numbers, False)


def query_id(fp: str) -> str:
    """pt-query-digest's Query ID of a fingerprint: ``"0x"`` + uppercase hex MD5 of its bytes (32 digits).

    percona-toolkit 3.x ``make_checksum`` is ``uc md5_hex($fingerprint)`` and the report prints it after "0x";
    the JSON output's ``checksum`` is the same digits without "0x". (pt-query-digest 2.x kept only the last 16
    digits.) Characters are encoded as UTF-8; lone surrogates from a surrogateescape decode as their raw byte.
    """
    digest = hashlib.md5(fp.encode("utf-8", "surrogateescape")).hexdigest()
    return "0x" + digest.upper()


def _fingerprint(sql: str, abstract_booleans: bool, embedded_numbers: bool, md5_checksums: bool) -> str:
    query = sql
    if _MYSQLDUMP_RE.match(query):
        return "mysqldump"
    if _PERCONA_TOOLKIT_RE.search(query):
        return "percona-toolkit"
    if query.startswith(_ADMIN_PREFIX):
        return query
    call = _CALL_RE.match(query)
    if call:
        return call.group(1).translate(_ASCII_LOWER)
    first_row = _MULTI_ROW_INSERT_RE.match(query)
    if first_row:
        query = first_row.group(1)

    query = _MULTI_LINE_COMMENT_RE.sub("", query)
    query = _ONE_LINE_COMMENT_RE.sub("", query)
    use = _USE_RE.match(query)
    if use:
        return "use ?" + query[use.end():]  # Perl's \Z leaves a final newline in place

    query = _ESCAPED_QUOTE_RE.sub("", query)
    query = _DOUBLE_QUOTED_RE.sub("?", query)
    query = _SINGLE_QUOTED_RE.sub("?", query)
    if abstract_booleans:
        query = _BOOLEAN_RE.sub("?", query)
    if md5_checksums:
        query = _MD5_RE.sub(r"\1?", query)
    query = (_WORD_NUMBER_RE if embedded_numbers else _NUMBER_RE).sub("?", query)
    query = (_NUMBER_PREFIX_NO_DOT_RE if md5_checksums else _NUMBER_PREFIX_RE).sub("?", query)

    query = query.lstrip(_PERL_SPACE)
    if query.endswith("\n"):  # chomp
        query = query[:-1]
    query = _WHITESPACE_RUN_RE.sub(" ", query)
    query = query.translate(_ASCII_LOWER)

    query = _NULL_RE.sub("?", query)
    query = _LIST_RE.sub(r"\1(?+)", query)
    # The backreference search is quadratic in the text after each "select" (as in Perl: ~0.5 s for a
    # 50 kB UNION of 1000 distinct SELECTs); skip it when it cannot match.
    if "union" in query:
        query = _UNION_RE.sub(r"\1 /*repeat\2*/", query)
    query = _LIMIT_RE.sub("limit ?", query, count=1)  # not /g in Perl: only the first LIMIT
    return _drop_order_by_asc(query)


def _drop_order_by_asc(query: str) -> str:
    """Perl: ``if (m/\\bORDER BY /gi) { 1 while s/\\G(.+?)\\s+ASC/$1/gi && pos }``.

    The substitution resets pos(), so the loop body runs once: a single /g pass of back-to-back matches, the
    first starting right after the first "ORDER BY ", each next one where the previous ended.
    """
    order_by = _ORDER_BY_RE.search(query)
    if not order_by:
        return query
    pos = order_by.end()
    kept = [query[:pos]]
    while (asc := _ASC_RE.match(query, pos)) is not None:
        kept.append(asc.group(1))
        pos = asc.end()
    kept.append(query[pos:])
    return "".join(kept)
