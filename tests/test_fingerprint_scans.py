"""The linear scans that replace core/fingerprint.py's backtracking regexes give exactly what those regexes give.

Each regex stays in core/fingerprint.py as the specification of its scan; here both run on generated text made of the
tokens that matter to it (openers, closers, quotes, keywords, every ASCII whitespace, repetitions that make the
regex backtrack). The UNION step beyond _UNION_BY_REGEX characters is also checked against percona-toolkit itself
(tests/test_fingerprint.py runs the whole port against it on shorter statements).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ptoracle import PERL, PT_FINGERPRINT, PtOracle

from pcapdecomp.core import fingerprint as fp

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def text_of(tokens: list[str], max_size: int = 40):
    pieces = st.lists(st.sampled_from(tokens) | st.text(max_size=2), max_size=max_size).map("".join)
    return st.tuples(pieces, st.integers(1, 3)).map(lambda t: t[0] * t[1])  # repeats make regexes retry


COMMENT_TOKENS = ["/*", "*/", "/*!", "/**/", "!", "*", "/", "a", " ", "\n", "\r", "--", "#", "-", "'", '"']
INSERT_TOKENS = ["INSERT", "insert", "REPLACE", " IGNORE", " ignore", " ", "  ", "\n", "\t", "INTO", "into", "VALUES",
                 "values", "VALUE", "(", ")", ",", " , ", "a", "'", ")\n,\n("]
UNION_TOKENS = ["select", "select ", "SELECT ", "select\v", "select\n", " ", "\v", "\t", "\n", "union", " union ",
                " union all ", " union\vall\v", "all", "a", "b", "_", "1", ",", "select a", "select a union ",
                "select a union select a", "ǅ"]
ASC_TOKENS = ["order by ", "ORDER BY ", "a", " ", "\v", "\t", "\n", "asc", "ASC", "aSc", "ascii", "b asc", ",", "x"]


@SETTINGS
@given(text_of(COMMENT_TOKENS))
def test_comment_scans_equal_their_regexes(query):
    assert fp._strip_multi_line_comments(query) == fp._MULTI_LINE_COMMENT_RE.sub("", query)
    assert fp._strip_one_line_comments(query) == fp._ONE_LINE_COMMENT_RE.sub("", query)


@SETTINGS
@given(text_of(INSERT_TOKENS))
def test_first_row_scan_equals_its_regex(query):
    match = fp._MULTI_ROW_INSERT_RE.match(query)
    assert fp._first_row_of_insert(query) == (match.group(1) if match else None)


@SETTINGS
@given(text_of(UNION_TOKENS, 60))
def test_union_collapse_equals_its_regex(query):
    """The long path on any length (its own threshold bypassed): same result as the regex."""
    assert fp._collapse_unions_long(query) == fp._UNION_RE.sub(r"\1 /*repeat\2*/", query)


@SETTINGS
@given(text_of(ASC_TOKENS))
def test_order_by_asc_scan_equals_its_regex(query):
    def by_regex(q: str) -> str:
        order_by = fp._ORDER_BY_RE.search(q)
        if not order_by:
            return q
        pos = order_by.end()
        kept = [q[:pos]]
        while (asc := fp._ASC_RE.match(q, pos)) is not None:
            kept.append(asc.group(1))
            pos = asc.end()
        kept.append(q[pos:])
        return "".join(kept)

    assert fp._drop_order_by_asc(query) == by_regex(query)


def test_hand_made_corners():
    # "/**/" does not close itself ([^!] eats the "*" the closer needed): the comment runs to the next "*/"
    assert fp._strip_multi_line_comments("a /**/ b") == "a /**/ b"
    assert fp._strip_multi_line_comments("a /**/ b /* c */ d") == "a  d"
    assert fp._strip_one_line_comments("a # b\nc -- d ' e\nf #g") == "a \nc -- d ' e\nf "
    assert fp._first_row_of_insert("INSERT INTO t VALUES (1),(2)") == "INSERT INTO t VALUES (1)"
    assert fp._first_row_of_insert("INSERT INTO t VALUES(VALUES(1)") is None
    # "select\n" may end W (the \s after "select"), but W's ".*?" may not cross a newline
    assert fp._collapse_unions_long("select\nx union select\nx") == "select\nx /*repeat union*/"
    assert fp._collapse_unions_long("select x\ny union select x\ny") == "select x\ny union select x\ny"


LONG_UNIONS = [
    " union ".join(["select a from t where b = ?"] * 120),
    "select c from t where id = ? union all " + " union all ".join(f"select c{i} from t{i % 7}" for i in range(150)),
    " union ".join(f"select {w} from t" for w in ["x", "y"] * 100) + " union select x from t",
    "select * from (" + " union ".join(["select x", "select y", "select x", "select y"] * 60) + ") q order by a asc",
    "(select a from t) union (select a from t) union " + " union ".join(["select b from u"] * 200),
]


@pytest.mark.skipif(PT_FINGERPRINT is None or PERL is None, reason="pt-fingerprint (percona-toolkit) or perl is not installed")
def test_long_unions_match_pt_fingerprint():
    oracle = PtOracle(PT_FINGERPRINT)
    try:
        for query in LONG_UNIONS:
            assert len(query) > fp._UNION_BY_REGEX
            assert fp.fingerprint(query) == oracle(query), query[:80]
    finally:
        oracle.close()
