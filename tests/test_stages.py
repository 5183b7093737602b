"""The stages' faces on a real recording, one call each, as the spine makes them (tests/analysing.explain):
read.extract.extract_points → Extracted, pair.pairing.pair_points → Paired, explain.servers.explain_servers →
Explained. Each result holds what the recording's truth (truth.jsonl: the client's own timings and
performance_schema) says the stage found, and the three calls give the tables `analyze` writes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from analysing import explain

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.core.tables import as_declared
from pcapdecomp.explain.servers import Explained
from pcapdecomp.explain.summary import to_json as summary_json
from pcapdecomp.pair.pairing import Paired
from pcapdecomp.read.extract import Extracted

GROUP_STALL = Path(__file__).resolve().parent.parent / "captures" / "group-stall"


def truth() -> list[dict]:
    return [json.loads(line) for line in (GROUP_STALL / "truth.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def stages():
    """The three faces called in order on group-stall, with one job (tests/analysing.explain), and how many
    exchanges each point's extraction read (the pairing takes them over)."""
    done = explain(GROUP_STALL, jobs=1)
    counts = {kind: done.summary["match"][f"{kind}_exchanges"] for kind in ("app", "db")}
    return done.cs, done.extracted, counts, done.paired, done.paired.matching.stats.matched, done.explained, \
        done.warnings


def test_extract_points_reads_every_statement_the_clients_sent(stages):
    cs, extracted, counts, *_ = stages
    assert isinstance(extracted, Extracted)
    assert [p.name for p in extracted.app_points] == [p.name for p in cs.of("app")] and len(extracted.db) == 1
    sent = len(truth())
    # every statement the clients timed was seen at both points (the logins and goodbyes are exchanges too)
    assert counts["app"] >= sent and counts["db"] >= sent
    assert len(extracted.qualities["app"]) == len(extracted.app) and len(extracted.points) == len(cs.points)


def test_pair_points_matches_each_statement_once_and_fits_the_clock(stages):
    _, extracted, counts, paired, matched, _, _ = stages
    assert isinstance(paired, Paired) and not paired.through_proxy and paired.repair is None
    assert matched >= len(truth()) and matched <= min(counts.values())
    assert paired.primary == extracted.app[0].capture and set(paired.clocks) == {paired.primary}
    assert paired.clock_info[paired.primary]["quality"] == "two-sided"
    # the exchanges were handed over: the extractions keep none
    assert all(len(x.exchanges) == 0 for x in extracted.all)


def test_explain_servers_finds_the_waits_the_clients_saw(stages):
    *_, explained, _ = stages
    assert isinstance(explained, Explained) and len(explained.servers) == 1
    x = explained.exchanges
    t = pd.DataFrame(truth())
    queries = t[t["role"] == "query"]
    waited = queries[queries["client_s"] - queries["exec_s"] > 0.5]  # the truth: statements queued behind the hog
    assert len(waited) > 0
    # each of them is a hidden-slow exchange of its connection, its queueing most of what its client waited
    by_conn = x[x["hidden_slow"].fillna(False).astype(bool)].groupby("conn_id").size()
    assert set(waited["conn_id"]) <= set(by_conn.index.astype(int))
    assert explained.groups["thread_group"].notna().any()


def test_the_three_faces_give_the_tables_analyze_writes(stages, tmp_path):
    *_, explained, _ = stages
    result = analyze(capture_set(GROUP_STALL), Options(jobs=1, quiet=True), tmp_path / "out")
    # as the run held it (core.tables.held), and in its declared dtypes, as written
    pd.testing.assert_frame_equal(explained.exchanges, result.held_exchanges, check_exact=True)
    pd.testing.assert_frame_equal(as_declared(explained.exchanges), result.exchanges, check_exact=True)
    pd.testing.assert_frame_equal(explained.groups, result.groups, check_exact=True)


@pytest.mark.parametrize("name", ["group-stall", "features"])
def test_the_tests_stages_are_what_analyze_writes(bundled_analysis, name):
    """tests/analysing.explain (the faces and the summary, nothing written), which the stage tests use in place of
    analyze: the same tables and the same summary.json as the spine's run of the set."""
    stages = explain(GROUP_STALL.parent / name)
    written = bundled_analysis(name)
    pd.testing.assert_frame_equal(stages.exchanges, written.exchanges, check_exact=True)
    pd.testing.assert_frame_equal(stages.groups, written.groups, check_exact=True)
    assert summary_json(stages.summary) == (written.out_dir / "summary.json").read_text(encoding="utf-8")
