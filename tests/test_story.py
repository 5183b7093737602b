"""The story each bundled recording tells, checked against what the recording holds: its ground truth
(truth.jsonl: the client's send/receive times and performance_schema's execution interval per statement) and its
settings (capture.toml: thread_pool_size, thread_pool_max_threads, long_query_time). Nothing here is copied from
the tool's output: the expected story is worked out from the truth.

Also the thread-pool view's pieces against brute force, thread_pool_size inferred without capture.toml, a wrong
size warned about, wild timestamps, and captures with nothing (or almost nothing) in them.
"""

from __future__ import annotations

import json
import re

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from pathlib import Path

import numpy as np
import pandas as pd
import pcaptools as pt
import pytest
from analysing import explain
from hypothesis import given, settings
from hypothesis import strategies as st

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.explain.threadpool import _count_steps, _step_extremes, _union, auto_bucket_s, robust_span

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
RECORDINGS = ["maxthreads", "group-stall", "oltp-hogs", "features"]
THRESHOLD = 0.1  # STALL_MIN_QUEUE_S: a wait this long is a story


def settings_of(name: str) -> dict:
    return tomllib.loads((CAPTURES / name / "capture.toml").read_text())["server"]


def truth_of(name: str) -> pd.DataFrame:
    t = pd.read_json(CAPTURES / name / "truth.jsonl", lines=True)
    t = t[t["exec_s"].notna() & t["client_s"].notna()].copy()
    # performance_schema's time can outlast the wire time (method notes): execution is at most the client time
    t["exec"] = np.minimum(t["exec_s"], t["client_s"])
    t["wait"] = t["client_s"] - t["exec"]
    t["x0"], t["x1"] = t["ps_timer_start_ps"], t["ps_timer_end_ps"]
    return t


def expected_story(name: str) -> dict:
    """What the recording shows, from its truth alone: the statements that waited ≥ THRESHOLD, whether the slow log
    holds them, and what held them — every thread of the pool (thread_pool_max_threads statements executing) or a
    long statement of their own thread group."""
    cfg, t = settings_of(name), truth_of(name)
    lqt = cfg["long_query_time"]
    waited = t[t["wait"] >= THRESHOLD + 0.01]  # a little margin: the wire and the client clock differ by µs-ms
    out = {"waited": waited, "hidden": t[(t["client_s"] > lqt + 0.01) & (t["exec"] < lqt - 0.01)],
           "understated": waited[waited["exec"] >= lqt], "cap": None, "culprits": set(), "groups": set()}
    for _, w in waited.iterrows():
        mid = w["x0"] - w["wait"] / 2 * 1e12  # halfway through its wait, on performance_schema's clock
        running = t[(t["x0"] <= mid) & (t["x1"] >= mid)]
        if len(running) >= cfg["thread_pool_max_threads"]:
            out["cap"] = cfg["thread_pool_max_threads"]
        mine = running[running["thread_group"] == w["thread_group"]]
        out["culprits"] |= set(mine.loc[mine["exec"] >= THRESHOLD, "conn_id"])
        out["groups"].add(int(w["thread_group"]))
    return out


@pytest.fixture(scope="module")
def story(bundled_analysis):
    cache = {}

    def get(name: str, **kw):
        key = (name, tuple(sorted(kw.items())))
        if key not in cache:
            if kw:  # the stages only: these tests read the summary and the tables
                gs = CAPTURES / name
                cfg = settings_of(name)
                cache[key] = explain(capture_set(app=[gs / "app.pcap"], db=gs / "db.pcap", slow_log=gs / "slow.log",
                                                 long_query_time=cfg["long_query_time"],
                                                 thread_pool_size=kw.get("thread_pool_size")))
            else:
                cache[key] = bundled_analysis(name)
        return cache[key]

    return get


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_sentence_tells_what_the_recording_shows(story, name):
    r = story(name)
    want = expected_story(name)
    s, x = r.summary["story"], r.exchanges
    sentence = s["sentence"]
    assert sentence.count(". ") == 0 and sentence.endswith(".")  # one sentence: details go in the bullets
    lines = r.summary["verdict"].splitlines()
    if r.summary["tls"] is not None:  # features has a TLS connection: how it was read comes first
        assert lines.pop(0) == r.summary["tls"]["sentence"]
    assert lines[0] == sentence
    assert [f"- {b['text']}" for b in s["bullets"]] == lines[1:]
    # the statements that certainly waited are those the truth says waited
    certain = x[x["queue_min_s"] >= THRESHOLD]
    assert sorted(certain["conn_id"].astype(int)) == sorted(want["waited"]["conn_id"].astype(int))
    assert int(x["hidden_slow"].fillna(False).sum()) == len(want["hidden"])
    assert int(x["understated"].fillna(False).sum()) == len(want["understated"])
    if not len(want["waited"]):
        assert s["findings"][0] == "idle" and sentence.startswith("No statement waited in the thread pool")
        assert not re.search(r"queueing \d", sentence)
        return
    if want["cap"]:
        assert s["findings"][0] == "max_threads"
        cap = r.summary["pool"]["cap"]
        assert cap["threads"] == want["cap"] and f"thread_pool_max_threads = {want['cap']}" in sentence
        assert f"exactly {want['cap']} statements executed at once" in sentence
        assert cap["waiting"] == len(want["waited"])
        longest = want["waited"]["wait"].max()
        assert abs(cap["max_wait_s"] - longest) < 0.01 and f"waited {cap['max_wait_s']:.3f} s" in sentence
        assert "the slow log shows" in sentence and "not the wait" in sentence
    else:
        assert s["findings"][0] == "group_stall"
        assert r.summary["pool"]["cap"] is None
        (group,) = want["groups"]
        assert f"waited in thread group {group} behind `" in sentence
        named = {int(m) for m in re.findall(r"\(connection (\d+),", sentence)}
        assert named and named <= want["culprits"]
        if len(want["hidden"]):
            assert sentence.startswith(f"{len(want['hidden'])} statements were slow only because they waited")
            assert "the slow log does not show them" in sentence
    assert ("understated" in s["findings"]) == bool(len(want["understated"]))
    assert ("hidden_slow" in s["findings"]) == bool(len(want["hidden"]))


@pytest.mark.parametrize("name", RECORDINGS)
def test_queueing_claims_never_rest_on_an_estimate(story, name):
    x = story(name).exchanges
    src = x["queue_source"].astype(object)
    assert set(src.dropna()) <= {"measured", "estimated", "lower_bound", "likely"}
    # provenance follows the execution's: measured only from the slow log, estimated and likely only from other runs
    assert ((src == "measured") == (x["exec_source"] == "slow_log")).all()
    assert (src.isin(["estimated", "likely"]) == (x["exec_source"] == "fingerprint_median")).all()
    assert (x["queue_s"].isna() == src.isna()).all()
    # the certain part is at most the best value, equal to it when measured, and never from the estimate: a
    # statement without a slow-log entry is certain only by the bound server − long_query_time
    assert (x["queue_min_s"].dropna() <= x.loc[x["queue_min_s"].notna(), "queue_s"].fillna(np.inf) + 1e-9).all()
    m = src == "measured"
    assert np.allclose(x.loc[m, "queue_min_s"], x.loc[m, "queue_s"])
    lqt = settings_of(name)["long_query_time"]
    e = src.isin(["estimated", "likely"]) & (x["queue_min_s"] > 0)
    assert np.allclose(x.loc[e, "queue_min_s"], x.loc[e, "server_s"] - lqt)
    # stall victims all certainly waited
    victims = x[x["stall_role"] == "victim"]
    assert (victims["queue_min_s"] >= THRESHOLD).all()


def test_an_idle_pool_claims_no_queueing(story):
    """features: an idle server; a cursor's PREPARE once showed 0.731 ms of 'queueing' estimated from COM_QUERY
    runs, and the verdict claimed 32.5 % queueing."""
    r = story("features")
    x = r.exchanges
    assert (x["queue_min_s"].fillna(0) == 0).all()
    prepare = x[x["command"] == "COM_STMT_PREPARE"]
    assert not (prepare["queue_source"] == "estimated").any()  # one PREPARE of its shape: nothing to estimate from
    split = next(b["text"] for b in r.summary["story"]["bullets"] if b["topic"] == "split")
    assert "queueing none certain" in split and "claim nothing" in split
    assert r.summary["queueing"]["certain_s"] == 0


def test_estimates_come_from_runs_of_the_same_command(story):
    """oltp-hogs runs one statement as COM_QUERY and as COM_STMT_EXECUTE: each is estimated from its own runs."""
    x = story("oltp-hogs").exchanges
    est = x[x["exec_source"] == "fingerprint_median"]
    fast = est[est["exec_s"] < est["server_s"]]  # above the class's usual range: it executed the class's median
    per = fast.groupby(["command", "fingerprint"], observed=True)["exec_s"].nunique()
    assert (per == 1).all()  # one median per (command, fingerprint)
    by_command = fast.groupby("command", observed=True)["exec_s"].first()
    assert by_command["COM_QUERY"] != by_command["COM_STMT_EXECUTE"]


@pytest.mark.parametrize("name", ["group-stall", "oltp-hogs"])
def test_thread_pool_size_is_inferred_without_capture_toml(story, name):
    r = story(name, thread_pool_size=None)
    size = r.summary["thread_pool_size"]
    assert size["given"] is None and size["source"] == "inferred"
    assert size["value"] == settings_of(name)["thread_pool_size"] and size["inferred"]["confidence"] == "certain"
    truth = truth_of(name)
    groups = r.exchanges.dropna(subset=["conn_id"]).drop_duplicates("conn_id").set_index("conn_id")["thread_group"]
    want = truth.drop_duplicates("conn_id").set_index("conn_id")["thread_group"]
    assert (groups.loc[want.index].to_numpy() == want.to_numpy()).all()
    assert any(b["topic"] == "thread_pool_size" and "inferred from the capture" in b["text"]
               for b in r.summary["story"]["bullets"])
    # the same story as with capture.toml
    assert r.summary["story"]["sentence"] == story(name).summary["story"]["sentence"]


@pytest.mark.parametrize("name", ["maxthreads", "features"])
def test_thread_pool_size_not_inferred_without_evidence(story, name):
    r = story(name, thread_pool_size=None)
    size = r.summary["thread_pool_size"]
    assert size["value"] is None and size["inferred"]["confidence"] == "not enough evidence"
    assert r.exchanges["thread_group"].isna().all() and r.groups.empty
    # maxthreads: the thread limit is still found, without any group
    assert (r.summary["pool"]["cap"] is not None) == (name == "maxthreads")


def test_a_wrong_thread_pool_size_is_warned_about(story):
    r = story("oltp-hogs", thread_pool_size=16)
    size = r.summary["thread_pool_size"]
    stalls = r.summary["groups"]["stalls"]
    assert stalls and all(s["culprits_total"] == 0 for s in stalls)
    assert size["stalls_without_culprits"] == len(stalls)
    assert size["warning"] and "16 may be wrong" in size["warning"] and "the wire says 2" in size["warning"]
    assert size["warning"] in r.warnings[-1] or any(size["warning"] in w for w in r.warnings)
    assert "is thread_pool_size right" in r.summary["story"]["sentence"]


def test_the_thread_limit_in_pool_parquet(story):
    r = story("maxthreads")
    cap = r.summary["pool"]["cap"]
    pool = pd.read_parquet(r.out_dir / "pool.parquet")
    start, end = pd.Timestamp(cap["start"]), pd.Timestamp(cap["end"])
    during = pool[(pool["bucket_start"] >= start) & (pool["bucket_start"] + pd.to_timedelta(pool["bucket_s"], "s") <= end)]
    assert len(during) >= 0.9 * 2.0 / r.summary["pool"]["bucket_s"] - 2
    assert (during["executing_max"] == cap["threads"]).all() and (during["executing_min"] == cap["threads"]).all()
    assert (during["queued_certain_max"] == cap["waiting"]).all()
    assert pool["executing_max"].max() == cap["threads"] == settings_of("maxthreads")["thread_pool_max_threads"]
    # every statement that waited is named, and every statement that held a thread
    assert {w["conn_id"] for w in cap["waiting_refs"]} == set(expected_story("maxthreads")["waited"]["conn_id"])
    assert cap["executing_total"] == len(cap["executing"]) == cap["threads"]


def test_culprits_are_counted_not_dropped(story):
    r = story("maxthreads")
    (stall,) = r.summary["groups"]["stalls"]
    held = r.exchanges[r.exchanges["stall_role"] == "culprit"]
    assert stall["culprits_total"] == len(held) == 6 and stall["culprits_more"] == 6 - len(stall["culprits"])


def test_hidden_slow_grouped_by_stall_with_their_culprit(story):
    r = story("oltp-hogs")
    hs = r.summary["hidden_slow"]
    assert hs["count"] == hs["listed"] == 12 and hs["more"] == 0
    assert [g["stall"] for g in hs["by_stall"]] == [0, 1, 2]
    hog = truth_of("oltp-hogs")
    hog = hog[hog["sql"].str.startswith("SELECT BENCHMARK")]
    for g in hs["by_stall"]:
        assert len(g["victims"]) == 4 and all(v["stall"] == g["stall"] for v in g["victims"])
        (c,) = g["culprits"]
        assert c["conn_id"] in set(hog["conn_id"]) and c["stall_role"] == "culprit"
        # the reference finds its row
        row = r.exchanges[(r.exchanges["capture"] == c["capture"]) & (r.exchanges["conn_index"] == c["conn_index"])
                          & (r.exchanges["seq"] == c["seq"])]
        assert len(row) == 1 and row["sql"].iloc[0].startswith("SELECT BENCHMARK")
    json.dumps(r.summary)  # plain JSON all through


def test_summary_keys_are_declared():
    from pcapdecomp.core.schema import SUMMARY_KEYS

    declared = {c.name.split(".")[0] for c in SUMMARY_KEYS}
    assert {"verdict", "story", "thread_pool_size", "pool", "groups", "hidden_slow", "understated",
            "queueing"} <= declared


# --- damaged and degenerate ------------------------------------------------------------------------------------


def test_wild_timestamps_bound_the_buckets_and_keep_the_story(story, tmp_path):
    """A run of frames with their time set to 0 (1970) in the middle of the DB capture, longer than the capture
    reader repairs (capture.WILD_RUN): the views stay small and the story stays the same."""
    from pcapdecomp.read.capture import WILD_RUN

    gs = CAPTURES / "group-stall"
    stamps = [ts for ts, _, _ in pt.records(gs / "db.pcap")[3]]
    targets = set(stamps[501:501 + WILD_RUN + 2])  # requests and answers of probes in the middle of the capture
    pt.rewrite(gs / "db.pcap", tmp_path / "db.pcap", time=lambda t: 0 if t in targets else t)
    r = analyze(capture_set(app=[gs / "app.pcap"], db=tmp_path / "db.pcap", slow_log=gs / "slow.log",
                            long_query_time=1.0, thread_pool_size=2),
                Options(quiet=True), tmp_path / "out")
    x = r.exchanges
    wild = ((x["db_req_ts"].dt.year < 1971) | (x["db_resp_ts"].dt.year < 1971)).fillna(False)
    assert wild.sum() >= 1 and r.summary["captures"]["db"]["frames_bad_ts"] == 0  # left to the views
    assert r.summary["pool"]["outliers"]["exchanges"] == int(wild.sum())
    assert len(r.groups) <= 2 * 1001 and len(pd.read_parquet(tmp_path / "out" / "pool.parquet")) <= 1001
    assert r.summary["story"]["sentence"] == story("group-stall").summary["story"]["sentence"]
    assert any(b["topic"] == "outliers" for b in r.summary["story"]["bullets"])


def _one_connection(tmp: Path, frames: slice) -> Path:
    """The DB capture of group-stall with one connection only (the frames `frames` of it)."""
    gs = CAPTURES / "group-stall"
    ports: dict[int, int] = {}
    for _, pkt, _ in pt.records(gs / "db.pcap")[3]:
        p = pt.tcp_ports(pkt)
        if p:
            ports[max(p)] = ports.get(max(p), 0) + 1
    port = sorted(ports)[3]
    seen = []

    def keep(pkt: bytes) -> bool:
        if max(pt.tcp_ports(pkt) or (0, 0)) != port:
            return False
        seen.append(1)
        return (frames.start or 0) < len(seen) <= (frames.stop or 1 << 60)

    pt.rewrite(gs / "db.pcap", tmp / "one.pcap", keep_packet=keep)
    return tmp / "one.pcap"


# The connection joins mid-stream (its login not captured): one login in a capture still breaks the report's
# connection-rate chart (issue 16, item 5: not this module's), so the login is left out here.
@pytest.mark.parametrize("frames", [slice(8, None), slice(8, 12)], ids=["one-connection", "one-exchange"])
def test_one_connection_and_one_exchange(tmp_path, frames):
    db = _one_connection(tmp_path, frames)
    r = explain(capture_set(db=db, slow_log=CAPTURES / "group-stall" / "slow.log", long_query_time=1.0))
    # no greeting captured: the id, when known, is the answer to the identify query (SELECT CONNECTION_ID(), …) the
    # lab's connection sent first, and is a probe's
    x = r.exchanges
    assert len(x) >= 1 and not (x["conn_id_source"] == "greeting").any()
    probes = set(pd.read_json(CAPTURES / "group-stall" / "truth.jsonl", lines=True).query("sql == 'SELECT 1'")["conn_id"])
    assert (x["conn_id_source"].dropna() == "connection_id_answer").all() and set(x["conn_id"].dropna()) <= probes
    s = r.summary["story"]
    assert s["sentence"].endswith(".") and s["findings"][0] in {"idle", "undecided"}
    assert r.summary["thread_pool_size"]["inferred"]["confidence"] == "not enough evidence"
    assert r.summary["pool"]["cap"] is None and r.summary["groups"]["stalls"] == []
    json.dumps(r.summary)


def test_nothing_at_all(tmp_path):
    def not_mysql(p: bytes) -> bytes:
        return p[:14 + 20 + 20] if len(p) > 54 else p  # TCP without payload: no MySQL

    pt.rewrite(CAPTURES / "maxthreads" / "db.pcap", tmp_path / "empty.pcap", packet=not_mysql)
    r = analyze(capture_set(db=tmp_path / "empty.pcap"), Options(quiet=True), tmp_path / "out")
    assert r.summary["story"]["findings"] == ["no_exchanges"]
    assert r.summary["hidden_slow"]["count"] == 0 and r.summary["pool"]["cap"] is None
    assert len(pd.read_parquet(tmp_path / "out" / "pool.parquet")) == 0


def test_app_side_only():
    gs = CAPTURES / "group-stall"
    r = explain(capture_set(app=[gs / "app.pcap"], long_query_time=1.0, thread_pool_size=2))
    assert r.summary["story"]["findings"] == ["no_server_view"]
    assert "without the DB capture" in r.summary["story"]["sentence"]


def test_no_slow_log_uses_the_wire_flag():
    """MariaDB flags slow statements on the wire: without the slow log the hidden-slow story still holds."""
    gs = CAPTURES / "group-stall"
    r = explain(capture_set(app=[gs / "app.pcap"], db=gs / "db.pcap", long_query_time=1.0, thread_pool_size=2))
    s = r.summary["story"]
    assert s["findings"][0] == "group_stall" and s["sentence"].startswith("3 statements were slow only because")
    assert "(flagged slow on the wire)" in s["sentence"] or "executing up to" in s["sentence"]
    hidden = next(b["text"] for b in s["bullets"] if b["topic"] == "hidden_slow")
    # the evidence is the flag alone: no claim about a slow log nothing was compared with
    assert "not flagged slow by the server" in hidden and "not in the slow log" not in hidden


def test_without_long_query_time_nothing_is_certain():
    """Nothing bounds execution without long_query_time: nothing is certain (the likely story: test_likely.py)."""
    gs = CAPTURES / "group-stall"
    r = explain(capture_set(app=[gs / "app.pcap"], db=gs / "db.pcap"))
    s = r.summary["story"]
    assert s["findings"][0] in ("undecided", "likely_group_stall") and "long_query_time is unknown" in s["sentence"]
    assert (r.exchanges["queue_min_s"].fillna(0) == 0).all()


# --- the pieces against brute force ----------------------------------------------------------------------------

intervals = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), max_size=25)


@settings(max_examples=200, deadline=None)
@given(intervals, st.integers(1, 200))
def test_step_extremes_equal_brute_force(iv, width):
    starts = np.array([s for s, _ in iv], dtype=np.int64)
    ends = np.array([s + d for s, d in iv], dtype=np.int64)
    edges = np.arange(0, 1400, width, dtype=np.int64)
    times, counts = _count_steps(starts, ends)
    lo, hi = _step_extremes(times, counts, edges)
    for k, (a, b) in enumerate(zip(edges, edges[1:])):
        values = [sum(s <= t < e for s, e in zip(starts, ends)) for t in range(a, b)]
        assert lo[k] == min(values) and hi[k] == max(values)


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_union_equals_brute_force(iv):
    starts = np.array([s for s, _ in iv], dtype=np.int64)
    ends = np.array([s + d for s, d in iv], dtype=np.int64)
    lo, hi = _union(starts, ends)
    covered = {t for s, e in zip(starts, ends) for t in range(s, e)}
    assert {t for a, b in zip(lo, hi) for t in range(a, b)} == covered
    assert (lo[1:] > hi[:-1]).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10**12), min_size=3, max_size=60), st.integers(0, 3))
def test_robust_span_bounds_the_buckets_whatever_the_outliers(times, wild):
    d1 = np.array(times + [0] * wild, dtype=np.int64) + 1_700_000_000 * 10**9
    d1[len(times):] = np.arange(wild)  # 1970
    d4 = d1 + 1000
    keep, t0, t1 = robust_span(d1, d4)
    if len(times) > 100 * wild:  # rare wild ones are cut off …
        assert not keep[len(times):].any()
    assert (t1 - t0) / (auto_bucket_s(t1 - t0) * 10**9) <= 1000  # … and the buckets are bounded anyway


def test_docs_print_the_pool_columns_and_the_summary_keys():
    from pcapdecomp.core.schema import POOL_COLUMNS, SUMMARY_KEYS, markdown_table

    doc = (CAPTURES.parent / "docs" / "analyze.md").read_text()
    assert markdown_table(POOL_COLUMNS) in doc and markdown_table(SUMMARY_KEYS) in doc
