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

Cost. A statement is attacker-controlled text (anyone who can send SQL writes it), so every step is linear in
its length (the UNION step n log n): a backtracking regex with a lazy or repeated part that can fail late costs
quadratic time on crafted text (1 MiB of ``/*`` or ``#…'`` took hours). Those steps are written as scans that
give exactly what the regex gives (tests/test_fingerprint.py checks each against its regex on generated text,
and the whole port against percona-toolkit); the regexes stay beside them as their specification.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

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
# Specification (quadratic when "VALUES(" repeats without a row boundary): _first_row_of_insert is the scan.
_MULTI_ROW_INSERT_RE = re.compile(r"((?:INSERT|REPLACE)(?: IGNORE)?\s+INTO.+?VALUES\s*\(.*?\))\s*,\s*\(", _IS)
_INSERT_HEAD_RE = re.compile(r"(?:INSERT|REPLACE)(?: IGNORE)?\s+INTO", _I)
_VALUES_PAREN_RE = re.compile(r"VALUES\s*\(", _I)
_ROW_BOUNDARY_RE = re.compile(r"\)\s*,\s*\(", _A)

# Comments. /*!50100 ... */ version comments stay: MySQL executes them. A one-line comment must reach the
# end of its line without meeting a quote. Perl's \Z also matches before a final newline; the [\r\n]
# alternative already covers that position, so Python's \Z is equivalent here.
# Specifications of _strip_multi_line_comments / _strip_one_line_comments (quadratic on many unclosed openings).
_MULTI_LINE_COMMENT_RE = re.compile(r"/\*[^!].*?\*/", re.DOTALL | _A)
_ONE_LINE_COMMENT_RE = re.compile(r"(?:--|#)[^'\"\r\n]*(?=[\r\n]|\Z)", _A)
_ONE_LINE_OPEN_RE = re.compile(r"--|#", _A)
_ONE_LINE_STOP_RE = re.compile(r"['\"\r\n]", _A)
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
# Specification of _collapse_unions (quadratic in the text after each "select", cubic at worst).
_UNION_RE = re.compile(r"\b(select\s.*?)(?:(\sunion(?:\sall)?)\s\1)+", _A)
_SELECT_START_RE = re.compile(r"\bselect\s", _A)
_UNION_SEPARATOR_AHEAD_RE = re.compile(r"(?=(\sunion(?:\sall)?)\s)", _A)
_UNION_SEPARATOR_RE = re.compile(r"(\sunion(?:\sall)?)\s", _A)
_UNION_BY_REGEX = 2048  # up to this length the regex itself is cheap (a few ms at worst)
_LIMIT_RE = re.compile(r"\blimit \?(?:, ?\?| offset \?)?", _A)
_ORDER_BY_RE = re.compile(r"\bORDER BY ", _I)
_ASC_RE = re.compile(r"(.+?)\s+ASC", _I)  # specification of the scan in _drop_order_by_asc
_ASC_AFTER_SPACE_RE = re.compile(r"(?<=\s)ASC", _I)


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
    first_row = _first_row_of_insert(query)
    if first_row is not None:
        query = first_row

    query = _strip_multi_line_comments(query)
    query = _strip_one_line_comments(query)
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
    query = _collapse_unions(query)
    query = _LIMIT_RE.sub("limit ?", query, count=1)  # not /g in Perl: only the first LIMIT
    return _drop_order_by_asc(query)


def _first_row_of_insert(query: str) -> str | None:
    """``_MULTI_ROW_INSERT_RE.match(query).group(1)`` (None when it does not match), in linear time.

    The head ``(INSERT|REPLACE)( IGNORE)?\\s+INTO`` can end at one place only. The lazy ``.+?VALUES\\s*\\(`` then
    takes the first "VALUES(" at least one character later, and the lazy ``.*?\\)`` the first ")" after it that a
    row boundary ``\\s*,\\s*\\(`` follows. A later "VALUES(" cannot help when that fails: its "(" comes later, so
    every ")" it could use, the first one's could use too.
    """
    head = _INSERT_HEAD_RE.match(query)
    if head is None:
        return None
    values = _VALUES_PAREN_RE.search(query, head.end() + 1)
    if values is None:
        return None
    boundary = _ROW_BOUNDARY_RE.search(query, values.end())
    return None if boundary is None else query[: boundary.start() + 1]


def _strip_multi_line_comments(query: str) -> str:
    """``_MULTI_LINE_COMMENT_RE.sub("", query)`` in linear time: a "/*" not followed by "!" is removed up to the
    first "*/" that starts at least one character after it. When no such "*/" exists, no later "/*" has one
    either, so the scan stops instead of trying every remaining opening."""
    kept = []
    pos = at = 0
    while True:
        start = query.find("/*", at)
        if start < 0 or start + 2 >= len(query):
            break
        if query[start + 2] == "!":
            at = start + 1
            continue
        close = query.find("*/", start + 3)
        if close < 0:
            break
        kept.append(query[pos:start])
        pos = at = close + 2
    kept.append(query[pos:])
    return "".join(kept)


def _strip_one_line_comments(query: str) -> str:
    """``_ONE_LINE_COMMENT_RE.sub("", query)`` in linear time: a "--" or "#" is removed up to the next CR, LF or
    the end, unless a quote comes first. Every opening before that quote fails alike, so the scan jumps past it."""
    kept = []
    pos = at = 0
    while (opening := _ONE_LINE_OPEN_RE.search(query, at)) is not None:
        stop = _ONE_LINE_STOP_RE.search(query, opening.end())
        end = len(query) if stop is None else stop.start()
        if stop is None or query[end] in "\r\n":
            kept.append(query[pos:opening.start()])
            pos = end
        at = end
    kept.append(query[pos:])
    return "".join(kept)


def _collapse_unions(query: str) -> str:
    """``_UNION_RE.sub(r"\\1 /*repeat\\2*/", query)``: ``select A union select A union …`` becomes
    ``select A /*repeat union*/``. The regex costs (text after each "select") × (unions after it), quadratic or
    worse on long statements, so beyond a few kB the match is found as below instead."""
    if "union" not in query:
        return query
    if len(query) <= _UNION_BY_REGEX:
        return _UNION_RE.sub(r"\1 /*repeat\2*/", query)
    return _collapse_unions_long(query)


def _collapse_unions_long(query: str) -> str:
    """What the regex gives, in O(n log n).

    The regex, at each "select" start a (leftmost first), takes the shortest W = query[a:e] (e ≥ a + 7, no
    newline) such that a separator ``\\sunion(\\sall)?\\s`` starts at e and a copy of W starts right after it, at
    x; then as many more "separator + W" as follow. So each start needs the smallest e among the separators
    (e, x) with query[x:x+L] == query[a:a+L], L = e − a. Equality of two substrings is decided by ranks of all
    substrings of length B = 1, 2, 4, … (prefix doubling: the rank of a 2B-block is the rank of its two B-blocks'
    ranks): for L in [B, 2B) it is the equality of the ranks of the first and the last B-block. Separators of a
    level are looked up by (rank of the B-block at x, e), so each start finds the candidates of a level, whose
    first B characters already agree, with two binary searches; few of them fail (two that both matched B
    characters within B of each other would make a shorter W work first)."""
    n = len(query)
    starts = np.fromiter((m.start() for m in _SELECT_START_RE.finditer(query)), np.int64)
    sep_e, sep_x = [], []
    for m in _UNION_SEPARATOR_AHEAD_RE.finditer(query):
        x = m.start() + len(m.group(1)) + 1
        if query.startswith("select", x):  # W starts with "select": its copy too
            sep_e.append(m.start())
            sep_x.append(x)
    if not len(starts) or not sep_e:
        return query
    sep_e_arr = np.array(sep_e, np.int64)
    sep_x_arr = np.array(sep_x, np.int64)
    newlines = np.fromiter((i for i, c in enumerate(query) if c == "\n"), np.int64) if "\n" in query else None
    # W's ".*?" may not contain a newline (the regex's "." does not match one; "select\\s" may end in one):
    # e ≤ the first newline from a + 7
    limit = np.full(len(starts), n, np.int64)
    if newlines is not None:
        k = np.searchsorted(newlines, starts + 7)
        has = k < len(newlines)
        limit[has] = newlines[k[has]]
    codes = np.frombuffer(query.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.int64)
    rank = np.unique(codes, return_inverse=True)[1].astype(np.int64).reshape(-1)
    best = np.full(len(starts), -1, np.int64)  # e of each start's match, -1: none
    waiting = np.arange(len(starts))
    block = 1
    while len(waiting) and block <= n:
        lo_len, hi_len = max(block, 7), 2 * block  # W lengths decided at this level
        if lo_len < hi_len:
            a = starts[waiting]
            width = np.int64(n + 1)
            keys = rank[sep_x_arr] * width + sep_e_arr
            order = np.argsort(keys, kind="stable")
            keys = keys[order]
            lo = np.searchsorted(keys, rank[a] * width + a + lo_len)
            end = np.minimum(limit[waiting] + 1, n)
            hi = np.searchsorted(keys, rank[a] * width + np.minimum(a + hi_len, end))
            # a start whose first B characters recur at no later copy position cannot match a longer W either
            alive = np.searchsorted(keys, rank[a] * width + end) > lo
            found = np.full(len(a), -1, np.int64)
            at = lo.copy()
            active = np.flatnonzero(at < hi)
            while len(active):
                sep = order[at[active]]
                e, x, aa = sep_e_arr[sep], sep_x_arr[sep], a[active]
                length = e - aa
                fits = x + length <= n
                tail_x = np.where(fits, x + length - block, 0)
                ok = fits & (rank[aa + length - block] == rank[tail_x])
                found[active[ok]] = e[ok]
                rest = active[~ok]
                at[rest] += 1
                active = rest[at[rest] < hi[rest]]
            best[waiting[found >= 0]] = found[found >= 0]
            waiting = waiting[(found < 0) & alive & (a + hi_len <= sep_e_arr[-1])]  # else: nothing longer fits
        if not len(waiting):
            break
        following = np.full(n, -1, np.int64)
        following[: n - block] = rank[block:]
        rank = np.unique(rank * (n + 1) + following + 1, return_inverse=True)[1].astype(np.int64).reshape(-1)
        block *= 2

    kept = []
    pos = 0
    for a, e in zip(starts.tolist(), best.tolist()):
        if e < 0 or a < pos:
            continue
        word = query[a:e]
        sep = _UNION_SEPARATOR_RE.match(query, e)
        last, end = sep.group(1), sep.end() + len(word)
        while (sep := _UNION_SEPARATOR_RE.match(query, end)) is not None and query.startswith(word, sep.end()):
            last, end = sep.group(1), sep.end() + len(word)
        kept.append(query[pos:a])
        kept.append(f"{word} /*repeat{last}*/")
        pos = end
    kept.append(query[pos:])
    return "".join(kept)


def _drop_order_by_asc(query: str) -> str:
    """Perl: ``if (m/\\bORDER BY /gi) { 1 while s/\\G(.+?)\\s+ASC/$1/gi && pos }``.

    The substitution resets pos(), so the loop body runs once: a single /g pass of back-to-back matches, the
    first starting right after the first "ORDER BY ", each next one where the previous ended.

    Each match of ``_ASC_RE`` at pos is found by a linear scan: ``(.+?)`` stops at the first whitespace k > pos
    whose run of whitespace is followed by "ASC" (the regex itself retries every position of a long whitespace
    run, quadratic on a run of vertical tabs, which the squeeze keeps).
    """
    order_by = _ORDER_BY_RE.search(query)
    if not order_by:
        return query
    pos = order_by.end()
    kept = [query[:pos]]
    while (asc := _ASC_AFTER_SPACE_RE.search(query, pos + 2)) is not None:
        run = asc.start() - 1  # the whitespace run before "ASC" starts at run, but (.+?) takes pos at least
        while run - 1 > pos and query[run - 1] in _PERL_SPACE:
            run -= 1
        newline = query.find("\n", pos, run)  # "." does not match a newline
        if newline >= 0:
            break
        kept.append(query[pos:run])
        pos = asc.end()
    kept.append(query[pos:])
    return "".join(kept)
