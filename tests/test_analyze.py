"""The analysis end to end on the lab's real recordings, checked against their ground truth (truth.jsonl: the
client's own send/receive times and performance_schema's execution time), and on copies of them rewritten to
shift the DB clock, NAT the client, cut the start and drop packets.

The lab records both ends on one machine (one clock), so client_send_ns / client_recv_ns are on the app
capture's clock: a truth row is joined to its exchange by connection id, text and the nearest request time.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pcaptools as pt
import pytest
from analysing import analyse

from pcapdecomp.core.errors import PcapdecompError, UsageError
from pcapdecomp.core.schema import ANALYSIS_COLUMNS, EXCHANGE_COLUMNS
from pcapdecomp.read.captureset import resolve_capture_set

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
MS = 1e-3



def run(set_dir: Path | None, out: Path, **kw):
    return analyse(set_dir, out, **kw)


def truth_join(x: pd.DataFrame, truth_path: Path, by_conn: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(truth rows, their exchanges) aligned row by row; a truth row without an exchange is dropped from both
    and counted by the caller through len()."""
    t = pd.read_json(truth_path, lines=True)
    t["ti"] = np.arange(len(t))
    e = x[x["app_req_ts"].notna()].copy()
    e["a1"] = e["app_req_ts"].astype("int64")
    e["xi"] = e.index
    keys = ["sql"] + (["conn_id"] if by_conn else [])
    e = e[["xi", "a1", *keys]].astype({"sql": object})
    if by_conn:
        e["conn_id"] = e["conn_id"].astype("float64")
        t["conn_id"] = t["conn_id"].astype("float64")
    m = t.merge(e, on=keys, how="inner")
    m["d"] = (m["a1"] - m["client_send_ns"]).abs()
    m = m[m["d"] < 20_000_000].sort_values("d").drop_duplicates("ti").sort_values("ti").reset_index(drop=True)
    return m, x.loc[m["xi"].astype(int)].reset_index(drop=True)


@pytest.fixture(scope="module")
def lab(bundled_analysis):
    return bundled_analysis


def readable_truth(name: str) -> pd.DataFrame:
    t = pd.read_json(CAPTURES / name / "truth.jsonl", lines=True)
    return t[~t["note"].fillna("").str.contains("TLS")]  # encrypted on the wire: no exchange to find


@pytest.mark.parametrize("name", ["maxthreads", "group-stall", "oltp-hogs", "features"])
def test_every_client_query_found_and_matched(lab, name):
    r = lab(name)
    truth, ex = truth_join(r.exchanges, CAPTURES / name / "truth.jsonl")
    assert len(truth) == len(readable_truth(name))
    assert (ex["seen"] == "both").all()
    assert r.summary["match"]["conflicts"] == 0


@pytest.mark.parametrize("name", ["maxthreads", "group-stall", "oltp-hogs"])
def test_total_within_client_time_and_network_near_zero_on_veth(lab, name):
    truth, ex = truth_join(lab(name).exchanges, CAPTURES / name / "truth.jsonl")
    gap = truth["client_s"] - ex["total_s"]
    # The client's clock reads bracket the wire: the capture can only see less than the client waited.
    assert (gap > 0).all()
    assert gap.max() < 10 * MS and gap.median() < 1 * MS
    both = lab(name).exchanges.query("seen == 'both'")
    assert both["network_s"].abs().max() < 1 * MS
    assert np.allclose(both["net_req_s"] + both["net_resp_s"], both["network_s"], atol=1e-9, equal_nan=True)
    answered = both["total_s"].notna()
    assert (both["server_s"] <= both["total_s"])[answered].all()


@pytest.mark.parametrize("name", ["maxthreads", "group-stall", "oltp-hogs"])
def test_queue_time_of_slow_logged_statements(lab, name):
    truth, ex = truth_join(lab(name).exchanges, CAPTURES / name / "truth.jsonl")
    logged = ex["in_slow_log"].fillna(False).to_numpy()
    assert logged.sum() > 0
    assert (ex.loc[logged, "exec_source"] == "slow_log").all()
    expected = truth["client_s"] - truth["exec_s"]
    err = (ex["queue_s"] - expected)[logged]
    assert err.abs().max() < 10 * MS


def test_maxthreads_two_statements_queued_two_seconds_but_none_hidden(lab):
    # 8 SLEEP(2) on 6 threads: two wait ~2 s for a thread, then execute 2 s (so they are slow-logged anyway).
    ex = lab("maxthreads").exchanges
    sleeps = ex[ex["sql"] == "SELECT SLEEP(2)"]
    assert len(sleeps) == 8 and sleeps["in_slow_log"].all()
    assert sorted(np.round(sleeps["queue_s"], 1)) == [0.0] * 6 + [2.0] * 2
    assert not ex["hidden_slow"].any()


@pytest.mark.parametrize("name", ["maxthreads", "group-stall", "oltp-hogs"])
def test_hidden_slow_exactly_the_statements_that_waited_longer_than_long_query_time(lab, name):
    r = lab(name)
    lqt = r.summary["inputs"]["long_query_time"]
    truth, ex = truth_join(r.exchanges, CAPTURES / name / "truth.jsonl")
    want = (truth["client_s"] > lqt) & (truth["exec_s"] < lqt)
    assert (ex["hidden_slow"].fillna(False) == want).all()
    assert r.exchanges["hidden_slow"].fillna(False).sum() == want.sum()
    assert r.summary["exchanges"]["hidden_slow"] == want.sum()


@pytest.mark.parametrize("name", ["maxthreads", "group-stall", "oltp-hogs"])
def test_thread_group_is_the_servers(lab, name):
    truth, ex = truth_join(lab(name).exchanges, CAPTURES / name / "truth.jsonl")
    assert (ex["thread_group"].astype("int64") == truth["thread_group"]).all()


def test_group_stall_shows_the_stalled_group_and_its_culprit(lab):
    r = lab("group-stall")
    truth = pd.read_json(CAPTURES / "group-stall" / "truth.jsonl", lines=True)
    hog = truth[truth["sql"].str.startswith("SELECT BENCHMARK")].iloc[0]
    stalls = r.summary["groups"]["stalls"]
    assert [s["thread_group"] for s in stalls] == [hog["thread_group"]]
    culprits = stalls[0]["culprits"]
    assert culprits[0]["conn_id"] == hog["conn_id"] and culprits[0]["sql"].startswith("SELECT BENCHMARK")
    assert abs(stalls[0]["duration_s"] - hog["client_s"]) < 0.1
    # The bucketed view agrees: the hog's group has queued requests during the stall, the other group none.
    g = r.groups
    assert g.loc[g["thread_group"] == hog["thread_group"], "queue_s"].sum() > 3.0
    assert g.loc[g["thread_group"] != hog["thread_group"], "queue_s"].sum() < 0.1
    sentence = r.summary["story"]["sentence"]
    assert f"thread group {hog['thread_group']} behind `SELECT BENCHMARK" in sentence
    assert f"(connection {hog['conn_id']}," in sentence


def test_outputs_written(lab, tmp_path):
    run(CAPTURES / "maxthreads", tmp_path / "out", csv=True)
    names = sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith("."))
    assert names == ["exchanges.csv", "exchanges.parquet", "groups.parquet", "pool.parquet", "report.html",
                     "summary.json"]
    table = pd.read_parquet(tmp_path / "out" / "exchanges.parquet")
    assert list(table.columns) == [c.name for c in EXCHANGE_COLUMNS] + [c.name for c in ANALYSIS_COLUMNS]
    assert str(table["app_req_ts"].dtype) == "datetime64[ns, UTC]"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {"offset_s", "skew_ppm", "offset_bounds_s", "samples"} <= set(summary["clock"])
    assert summary["exchanges"]["total"] == len(table) == 40
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.startswith("<!doctype html>")
    import html

    story = summary["story"]  # tests/test_report.py renders the page in Chromium
    assert all(html.escape(t) in page for t in [story["sentence"], *(b["text"] for b in story["bullets"])])


# --- rewritten copies -------------------------------------------------------------------------------------


def rewritten(tmp_path: Path, name: str, app_kw: dict | None = None, db_kw: dict | None = None,
              slow_log: bool = True) -> Path:
    src, dst = CAPTURES / name, tmp_path / name
    dst.mkdir()
    for f in ["capture.toml"] + (["slow.log"] if slow_log else []):
        shutil.copy(src / f, dst / f)
    pt.rewrite(src / "app.pcap", dst / "app.pcap", **(app_kw or {}))
    pt.rewrite(src / "db.pcap", dst / "db.pcap", **(db_kw or {}))
    return dst


@pytest.mark.parametrize("offset_ms, skew_ppm", [(350, 40.0), (-820, -25.0)])
def test_clock_offset_and_skew_recovered(tmp_path, lab, offset_ms, skew_ppm):
    t0 = pt.first_ts(CAPTURES / "group-stall" / "db.pcap")
    d = rewritten(tmp_path, "group-stall", db_kw={"time": pt.skewed_clock(offset_ms * 1_000_000, skew_ppm, t0)})
    r = run(d, tmp_path / "out")
    clock = r.summary["clock"]
    # θ at the DB capture's first packet is the applied offset (the lab's own clocks are one clock).
    assert abs(clock["offset_s"] - offset_ms * MS) < 0.3 * MS
    assert abs(clock["skew_ppm"] - skew_ppm) < 5
    lo, hi = clock["offset_bounds_s"]
    assert lo <= offset_ms * MS <= hi
    # After alignment the decomposition is that of the original.
    plain = lab("group-stall").exchanges
    assert (r.exchanges["seen"] == "both").all()
    assert np.abs(r.exchanges["server_s"] - plain["server_s"]).max() < 20e-6
    assert r.exchanges["net_req_s"].abs().max() < 1 * MS and r.exchanges["net_resp_s"].abs().max() < 1 * MS
    assert r.summary["exchanges"]["hidden_slow"] == 3


def test_nat_rewritten_client_still_matched(tmp_path, lab):
    d = rewritten(tmp_path, "group-stall", app_kw={"packet": pt.nat_client("10.213.77.1", "192.0.2.9", 1000)})
    r = run(d, tmp_path / "out")
    m = r.summary["match"]
    assert m["matched"] == m["app_exchanges"] == m["db_exchanges"] == len(lab("group-stall").exchanges)
    assert m["connections_nat"] == m["connections_matched"] == 7
    assert r.exchanges["client"].str.startswith("192.0.2.9:").all()
    assert r.exchanges["db_client"].str.startswith("10.213.77.1:").all()


def test_start_cut_off_both_captures(tmp_path):
    t0 = pt.first_ts(CAPTURES / "group-stall" / "db.pcap")
    cut = t0 + 1_000_000_000  # after every login: each connection starts mid-stream in both captures
    keep = {"keep": lambda i, t: t >= cut}
    r = run(rewritten(tmp_path, "group-stall", keep, keep), tmp_path / "out")
    x = r.exchanges
    # no greeting, no connection id from it: only the BENCHMARK's connection is named, by its slow-log entry's
    # Thread_id (the truth's id of the hog)
    assert not (x["conn_id_source"] == "greeting").any()
    hog = pd.read_json(CAPTURES / "group-stall" / "truth.jsonl", lines=True).query("conn_label == 'hog'")["conn_id"]
    named = x[x["conn_id"].notna()]
    assert (named["conn_id_source"] == "slowlog").all() and set(named["conn_id"]) == set(hog)
    assert named["sql"].astype(str).str.startswith("SELECT BENCHMARK").any()
    truth, ex = truth_join(x, CAPTURES / "group-stall" / "truth.jsonl", by_conn=False)
    all_truth = pd.read_json(CAPTURES / "group-stall" / "truth.jsonl", lines=True)
    after = all_truth[all_truth["client_send_ns"] > cut + 50_000_000]
    assert set(after.index) <= set(truth["ti"])
    assert (ex["seen"] == "both").all() and x["network_s"].abs().max() < 1 * MS
    # Without connection ids the slow log still joins by text and time; the stalled probes are still hidden slow.
    want = (truth["client_s"] > 1.0) & (truth["exec_s"] < 1.0)
    assert want.sum() == 3 and (ex["hidden_slow"].fillna(False) == want).all()
    assert r.summary["slow_log"]["matched"] == 1


@pytest.mark.parametrize("side", ["app", "db"])
def test_one_percent_of_one_capture_dropped(tmp_path, side):
    name = "oltp-hogs"
    n_packets = sum(1 for _ in pt.records(CAPTURES / name / f"{side}.pcap")[3])
    dropped = set(random.Random(7).sample(range(n_packets), n_packets // 100))
    kw = {"keep": lambda i, t: i not in dropped}
    r = run(rewritten(tmp_path, name, **{f"{side}_kw": kw}), tmp_path / "out")
    x = r.exchanges
    other = "db" if side == "app" else "app"
    both = x[x["seen"] == "both"]
    # No wrong pairs: a neighbour's request or response would be ms away on this busy link.
    assert both["net_req_s"].abs().max() < 1 * MS
    assert both["net_resp_s"].dropna().abs().max() < 1 * MS
    # The other point had every byte this one lost: repaired from it (pcapdecomp/pair/repair.py), nothing is seen at
    # one point only, the repaired exchanges say so, and a time that fell on a lost frame is a marked bound.
    assert (x["seen"] == "both").all() and r.summary["repair"]["bytes_borrowed"] > 0
    repaired = x["match_notes"].astype("string").str.contains(f"repaired-at-{side}").fillna(False)
    assert repaired.sum() > 0 and not x["match_notes"].astype("string").str.contains(other).fillna(False).any()
    bounded = x[x["bounded"].notna()]
    assert len(bounded) > 0 and bounded["bounded"].astype(str).str.match("^(A|D)").all()
    assert repaired[x["bounded"].notna()].all()
    # Every query the client made is found at both points (truth_join finds it by A1: not those whose A1 is a bound).
    truth, ex = truth_join(x, CAPTURES / name / "truth.jsonl")
    a1_bounded = int(x["bounded"].astype("string").str.contains("A1").fillna(False).sum())
    assert len(readable_truth(name)) - a1_bounded <= len(truth) and (ex["seen"] == "both").all()
    assert r.summary["clock"]["quality"] == "two-sided"
    assert abs(r.summary["clock"]["offset_s"]) < 0.1 * MS


# --- inputs ---------------------------------------------------------------------------------------------


def test_one_side_only(tmp_path):
    src = CAPTURES / "group-stall"
    db_only = run(None, tmp_path / "db", db=src / "db.pcap", slow_log=src / "slow.log", long_query_time=1.0,
                  thread_pool_size=2)
    x = db_only.exchanges
    answered = x["resp_last_ts"].notna()
    assert (x["seen"] == "db").all() and x["total_s"].isna().all() and x["server_s"].notna().eq(answered).all()
    assert x["hidden_slow"].sum() == 3 and db_only.summary["clock"] is None
    app_only = run(None, tmp_path / "app", app=[src / "app.pcap"])
    y = app_only.exchanges
    answered = y["resp_last_ts"].notna()
    assert (y["seen"] == "app").all() and y["total_s"].notna().eq(answered).all() and y["server_s"].isna().all()
    assert y["hidden_slow"].isna().all()  # no server time, no long_query_time: not decided


def test_without_slow_log_the_wire_flag_decides(tmp_path):
    r = run(rewritten(tmp_path, "group-stall", slow_log=False), tmp_path / "out")
    assert r.exchanges["in_slow_log"].isna().all()
    assert r.exchanges["hidden_slow"].sum() == 3  # MariaDB's SERVER_QUERY_WAS_SLOW flag is on the wire
    # summary.json's references say what the table says: not known (they said false, as if the slow log was read)
    refs = [v for stall in r.summary["hidden_slow"]["by_stall"] for v in stall["victims"]]
    assert len(refs) == 3 and all("in_slow_log" in v and v["in_slow_log"] is None for v in refs)


@pytest.mark.parametrize("content", [b"hello\nthis is not a slow log\n", b"\xd4\xc3\xb2\xa1" + bytes(40)])
def test_garbled_slow_log_warns_and_analyses_without(tmp_path, content):
    d = rewritten(tmp_path, "group-stall")
    (d / "slow.log").write_bytes(content)
    r = run(d, tmp_path / "out")
    assert any("slow log" in w for w in r.warnings)
    assert r.exchanges["in_slow_log"].isna().all() and r.summary["exchanges"]["hidden_slow"] == 3


def test_unrelated_slow_log_warns(tmp_path):
    d = rewritten(tmp_path, "group-stall")
    shutil.copy(CAPTURES / "maxthreads" / "slow.log", d / "slow.log")  # another recording's statements and times
    r = run(d, tmp_path / "out")
    assert r.summary["slow_log"]["used"] is False
    assert any("analysed without the slow log" in w for w in r.warnings)
    hidden = next(b["text"] for b in r.summary["story"]["bullets"] if b["topic"] == "hidden_slow")
    assert "not in the slow log" not in hidden and "no slow log was joined" in hidden  # the flag's evidence only


def test_explicit_options_win_over_the_folder(tmp_path):
    cs = resolve_capture_set(CAPTURES / "group-stall", [], None, None, 0.5, 4, ["10.0.0.9:3307"])
    assert cs.long_query_time == 0.5 and cs.thread_pool_size == 4 and cs.servers == ["10.0.0.9:3307"]
    assert cs.app == [CAPTURES / "group-stall" / "app.pcap"] and cs.db == CAPTURES / "group-stall" / "db.pcap"
    assert cs.name == "group-stall"


@pytest.mark.parametrize("kwargs", [
    {"set_dir": None},
    {"set_dir": Path("/nonexistent/set")},
    {"set_dir": CAPTURES / "group-stall" / "capture.toml"},
    {"set_dir": CAPTURES / "group-stall", "servers": ["nohost"]},
    {"set_dir": CAPTURES / "group-stall", "thread_pool_size": 0},
])
def test_user_mistakes_raise_pcapdecomp_errors(tmp_path, kwargs):
    args = dict(kwargs)
    with pytest.raises(PcapdecompError):
        run(args.pop("set_dir"), tmp_path / "o", **args)


def test_no_capture_is_a_usage_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no capture"):
        run(tmp_path / "empty", tmp_path / "o")


def _split_app_capture(src, tmp_path) -> None:
    """src's app capture split in two by client port, as two app hosts would capture it: app1.pcap and app2.pcap
    in tmp_path, the second one's clock 200 ms behind."""
    ports = sorted({int(c.rsplit(":", 1)[1]) for c in run(src, tmp_path / "plain").exchanges["client"]})
    first = set(ports[: len(ports) // 2])

    def on_first(pkt: bytes) -> bool:
        p = pt.tcp_ports(pkt)
        return p is not None and (p[0] in first or p[1] in first)

    pt.rewrite(src / "app.pcap", tmp_path / "app1.pcap", keep_packet=on_first)
    pt.rewrite(src / "app.pcap", tmp_path / "app2.pcap", keep_packet=lambda p: not on_first(p),
               time=lambda t: t - 200_000_000)


def test_two_app_hosts_with_their_own_clocks(tmp_path):
    """The app capture split in two by client port (two app hosts), the second one's clock 200 ms behind: each
    gets its own clock model, and every exchange is still matched and decomposed on its own host's clock."""
    src = CAPTURES / "group-stall"
    _split_app_capture(src, tmp_path)
    r = run(None, tmp_path / "out", app=[tmp_path / "app1.pcap", tmp_path / "app2.pcap"], db=src / "db.pcap",
            slow_log=src / "slow.log", long_query_time=1.0, thread_pool_size=2)
    clocks = r.summary["clocks"]
    assert abs(clocks[str(tmp_path / "app1.pcap")]["offset_s"]) < 0.3 * MS
    assert abs(clocks[str(tmp_path / "app2.pcap")]["offset_s"] - 0.2) < 0.3 * MS
    x = r.exchanges
    assert (x["seen"] == "both").all() and len(x) == 352
    assert x["net_req_s"].abs().max() < 1 * MS and x["net_resp_s"].abs().max() < 1 * MS
    assert r.summary["exchanges"]["hidden_slow"] == 3


# --- the clock's segment pass, started ahead on the workers (--jobs) ---------------------------------------------


@pytest.mark.parametrize("drop_one_at_db", [False, True])
def test_clock_pass_started_ahead_gives_the_clock_of_one_process(tmp_path, monkeypatch, drop_one_at_db):
    """With --jobs 2 the segments of each point are read for all its connections, and the clock fitted, on a worker
    while the captures are paired (pair.clocks.start_segment_passes): when every connection matched that clock is used,
    else the points are read again for their matched connections. Either way the clock, and so every output, is
    that of --jobs 1."""
    from pcapdecomp.pair import clocks
    from pcapdecomp.read import extract as extraction

    src = CAPTURES / "group-stall"
    shutil.copy(src / "app.pcap", tmp_path / "app.pcap")
    ports = sorted({int(c.rsplit(":", 1)[1]) for c in run(src, tmp_path / "plain").exchanges["client"]})

    def not_first(pkt: bytes) -> bool:  # one connection only the app capture holds
        p = pt.tcp_ports(pkt)
        return not drop_one_at_db or p is None or ports[0] not in p

    pt.rewrite(src / "db.pcap", tmp_path / "db.pcap", keep_packet=not_first)
    kw = dict(app=[tmp_path / "app.pcap"], db=tmp_path / "db.pcap", slow_log=src / "slow.log", long_query_time=1.0,
              thread_pool_size=2)
    one = run(None, tmp_path / "one", jobs=1, **kw)
    monkeypatch.setattr(extraction, "SMALL_CAPTURE_BYTES", 0)  # these small captures read ahead as a big pair would
    read_again = []
    run_all = clocks.run_all
    monkeypatch.setattr(clocks, "run_all", lambda f, calls, jobs: read_again.extend(calls) or run_all(f, calls, jobs))
    two = run(None, tmp_path / "two", jobs=2, **kw)
    assert [str(pt_.name) for pt_, *_ in read_again] == ([str(tmp_path / "db.pcap"), str(tmp_path / "app.pcap")]
                                                        if drop_one_at_db else [])
    assert two.summary["clocks"] == one.summary["clocks"] and two.summary["clock"] == one.summary["clock"]
    assert one.summary["clock"]["quality"] == "two-sided"
    pd.testing.assert_frame_equal(two.exchanges, one.exchanges, check_exact=True)


def test_clock_passes_started_ahead_for_two_app_points(tmp_path, monkeypatch):
    """Two app points and a DB point: each point's segments are read ahead on the workers (three passes) and paired
    here, giving the clocks --jobs 1 gives."""
    from pcapdecomp.pair import clocks
    from pcapdecomp.read import extract as extraction

    src = CAPTURES / "group-stall"
    _split_app_capture(src, tmp_path)
    kw = dict(app=[tmp_path / "app1.pcap", tmp_path / "app2.pcap"], db=src / "db.pcap", slow_log=src / "slow.log",
              long_query_time=1.0, thread_pool_size=2)
    one = run(None, tmp_path / "one", jobs=1, **kw)
    monkeypatch.setattr(extraction, "SMALL_CAPTURE_BYTES", 0)
    read_again = []
    run_all = clocks.run_all
    monkeypatch.setattr(clocks, "run_all", lambda f, calls, jobs: read_again.extend(calls) or run_all(f, calls, jobs))
    two = run(None, tmp_path / "two", jobs=2, **kw)
    assert read_again == [] and len(two.summary["clocks"]) == 2
    assert two.summary["clocks"] == one.summary["clocks"]
    pd.testing.assert_frame_equal(two.exchanges, one.exchanges, check_exact=True)
