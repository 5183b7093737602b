"""The verdict's phrases live in one room (explain/wording.py): each helper says its phrase as the verdict reads,
and the modules that tell the verdict do not spell those phrases themselves."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pcapdecomp.core.formats import seconds_rounded
from pcapdecomp.explain import wording

REPO = Path(__file__).resolve().parents[1]
TELLERS = ["explain/verdict.py", "explain/playbook.py", "explain/stories.py", "explain/connstory.py",
           "explain/netstory.py", "explain/waitprofile.py", "render/text.py"]


def test_bounds_and_spans_are_said_once():
    assert wording.up_to(1.234) == "up to 1.234 s" and wording.at_least(0.25) == "at least 250 ms"
    assert wording.span(0.2, 1.1) == "200 ms to 1.100 s"
    assert wording.span(0.9996, 0.9999) == seconds_rounded(0.9999)  # alike: one value, the larger
    assert wording.span(0.9996, 0.9999, alike_as_lo=True) == seconds_rounded(0.9996)
    assert "–" in wording.span(1.0, 1.1, "–", rel_tol=0.005) and "–" not in wording.span(1.0, 1.004, "–", rel_tol=0.005)
    assert wording.span_of(np.array([np.nan, np.nan])) == "unknown"
    assert wording.span_of(np.array([0.5, np.nan, 2.0])) == wording.span(0.5, 2.0)


def test_counts_groups_connections_and_statements():
    assert (wording.statements(1), wording.statements(3)) == ("1 statement", "3 statements")
    assert wording.thread_groups([3]) == "thread group 3"
    assert wording.thread_groups([1, 2, 5]) == "thread groups 1, 2 and 5"
    assert (wording.connection(12), wording.connection(None)) == ("connection 12", "connection unknown")
    assert wording.quoted("SELECT " + "x" * 200).startswith("`SELECT ") and len(wording.quoted("y" * 200)) < 90


@pytest.mark.parametrize("source,words", [("slow_log", ("executing 1.5", "")), ("flagged_slow", ("executing up to",
                         "(flagged slow on the wire)")), ("fingerprint_median", ("executing about", "(estimate)")),
                         ("below_long_query_time", ("executing up to", "(a bound)"))])
def test_an_execution_says_how_it_is_known(source, words):
    said = wording.execution({"exec_s": 1.5, "exec_source": source})
    assert said.startswith(words[0]) and said.endswith(words[1])
    assert wording.execution({"exec_s": None, "exec_source": "slow_log"}) == "execution unknown"
    bound = wording.execution({"exec_s": None, "exec_source": "below_long_query_time", "server_s": 2.0,
                               "queue_min_s": 0.5})
    assert bound == f"executing {wording.up_to(1.5)} (a bound)"


@pytest.mark.parametrize("path", TELLERS)
def test_the_modules_that_tell_the_verdict_do_not_spell_its_phrases(path):
    """A bound, a quoted statement, a thread-group list or an execution's words spelled in a telling module would
    be a second room for the same phrase."""
    text = (REPO / "pcapdecomp" / path).read_text(encoding="utf-8")
    for phrase in (r"up to \{seconds_rounded", r"at least \{seconds_rounded", r"`\{clip\(", r"\"thread groups \" \+",
                   r"\"executing about\"", r"plural\([^)]*'statement', 'statements'\)\}\"? ?(?:in|waited|is)"):
        assert not re.search(phrase, text), (path, phrase)
