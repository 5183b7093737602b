"""report.html: rendered in headless Chromium from the bundled recordings; what it draws and prints is checked
against the tables; self-contained; bounded for big inputs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from browser import flat_text, page_text, probe, rendered, screenshot, script_errors, section

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.core.formats import seconds
from pcapdecomp.explain.digest import queue_parts
from pcapdecomp.render.figures import (
    TIME_BUCKETS,
    TIMELINE_LANES,
    TIMELINE_STATEMENTS,
    connection_times,
    exchange_times,
    figure_specs,
    time_axis,
)
from pcapdecomp.render.report import PROFILE_ROWS, render

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
ARTIFACTS = Path(os.environ.get("PCAPDECOMP_ARTIFACTS", REPO / "tests" / "artifacts"))


@pytest.fixture(scope="module")
def group_stall(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "group-stall"
    return analyze(CAPTURES / "group-stall",
                   Options(quiet=True, command_line="pcapdecomp analyze captures/group-stall"), out)


@pytest.fixture(scope="module")
def group_stall_page(group_stall, tmp_path_factory):
    return probe(group_stall.out_dir / "report.html", tmp_path_factory.mktemp("chromium") / "profile")


def _ns(col: pd.Series) -> np.ndarray:
    return col.dropna().to_numpy(dtype="datetime64[ns]").astype(np.int64)


def test_every_figure_renders_and_the_time_charts_share_one_axis(group_stall, group_stall_page):
    found, dom, _ = group_stall_page
    assert not script_errors(dom) and not found["errors"], (script_errors(dom), found["errors"])
    assert rendered(dom) == "7 figures"
    figs = found["figures"]
    assert set(figs) == {"fig-shares", "fig-timeline", "fig-heatmap", "fig-pool", "fig-waterfall", "fig-connrate",
                         "fig-openconns"}
    timed = {k: v for k, v in figs.items() if v["type"] == "date"}
    assert set(timed) == {"fig-timeline", "fig-heatmap", "fig-pool", "fig-connrate", "fig-openconns"}
    # one plot area, one range: the same instant is at the same pixel in every time chart
    for name, f in timed.items():
        assert (f["l"], f["w"]) == (figs["fig-timeline"]["l"], figs["fig-timeline"]["w"]), name
        assert f["range"] == pytest.approx(figs["fig-timeline"]["range"], abs=1.0), name
        assert f["px"] == pytest.approx(figs["fig-timeline"]["px"], abs=0.5), name
    # the range covers every exchange, from the first request to the last answer, and not much more
    x = group_stall.exchanges
    first = min(_ns(x["app_req_ts"]).min(), _ns(x["db_req_ts"]).min()) / 1e6
    last = max(_ns(x["app_resp_ts"]).max(), _ns(x["db_resp_ts"]).max()) / 1e6
    lo, hi = figs["fig-timeline"]["range"]
    assert lo <= first and hi >= last and (hi - lo) < 1.1 * (last - first)
    # a stall's zoom button and a drag in the timeline move every time chart
    for zoom in ("zoom1", "zoom2"):
        assert set(found[zoom]["got"]) == set(timed)
        for name, got in found[zoom]["got"].items():
            assert got == pytest.approx(found[zoom]["asked"], abs=1.0), (zoom, name)


def test_timeline_draws_every_statement_as_a_span_with_the_culprit_on_its_own_lane(group_stall, group_stall_page):
    found, _, _ = group_stall_page
    x = group_stall.exchanges
    timeline = found["figures"]["fig-timeline"]
    traces = {t["name"]: t for t in timeline["traces"]}
    answered = x["app_resp_ts"].notna() | x["db_resp_ts"].notna()
    # one span per answered exchange (x, x, gap per span); one end marker per span
    assert traces["client wait"]["n"] == 3 * int(answered.sum())
    markers = sum(t["n"] for name, t in traces.items() if t["type"] == "scattergl" and name in
                  ("statement", "in the slow log", "slow", "understated", "hidden slow", "culprit"))
    assert markers == int(answered.sum())
    hidden = x[x["hidden_slow"].fillna(False)]
    assert traces["hidden slow"]["n"] == len(hidden) == 3
    # each hidden-slow statement's lane is labelled with its own group and connection; the culprit has its own
    lanes = timeline["ticktext"]
    for _, r in hidden.iterrows():
        assert f"g{r['thread_group']} · conn {r['conn_id']}" in lanes
    culprit = group_stall.summary["groups"]["stalls"][0]["culprits"][0]
    assert traces["culprit"]["n"] == 1 and f"g1 · conn {culprit['conn_id']}" in lanes
    assert culprit["conn_id"] not in set(hidden["conn_id"])  # not covered by a victim's marker: another lane
    assert lanes == sorted(lanes, key=lambda s: int(s.split(" ")[0][1:]))  # ordered by thread group
    assert timeline["shapes"] == len(group_stall.summary["groups"]["stalls"]) == 1  # the stall, shaded
    assert "culprit" in timeline["annotations"]
    # the tooltip the page writes (as text) for the first point of a trace: that statement's numbers
    tips = found["tips"]
    first = hidden.sort_index().iloc[0]
    estimated = queue_parts(hidden.sort_index().iloc[:1])[1][0]
    assert tips["hidden slow"].split("\n") == [
        first["sql"], f"conn {first['conn_id']}, group 1, sent {first['app_req_ts'].strftime('%H:%M:%S.%f')}",
        f"client {seconds(first['total_s'])}, server {seconds(first['server_s'])}",
        f"queue {seconds(first['queue_s'])}" + (f" ({seconds(estimated)} estimated)" if estimated > 0 else "")
        + f", exec {seconds(first['exec_s'])} ({first['exec_source']}), network {seconds(first['network_s'])}"]
    assert tips["culprit"].startswith(f"{culprit['sql']}\nconn {culprit['conn_id']}, group 1, sent ")
    # execution (green) and queueing segments: one per statement with a D4 / with any queueing
    assert traces["execution"]["n"] == 3 * int(x["db_resp_ts"].notna().sum())
    queued = (x["queue_s"].fillna(0) > 0).sum()
    assert traces.get("queueing", {"n": 0})["n"] + traces.get("queueing (estimated)", {"n": 0})["n"] >= 3 * queued


def test_aggregated_charts_sum_to_the_tables(group_stall, group_stall_page, tmp_path):
    found, _, _ = group_stall_page
    figs = found["figures"]
    groups = group_stall.groups
    heat = figs["fig-heatmap"]["traces"][0]
    assert heat["zsum"] == pytest.approx(float(groups["queue_s"].sum()), rel=1e-9)
    # new connections: one per SYN the DB capture holds (tshark counts them independently)
    proc = subprocess.run(["tshark", "-r", str(CAPTURES / "group-stall" / "db.pcap"), "-Y",
                           "tcp.flags.syn==1 && tcp.flags.ack==0", "-T", "fields", "-e", "frame.number"],
                          capture_output=True, text=True, timeout=120)
    syns = len(proc.stdout.split())
    conn = {t["name"]: t for t in figs["fig-connrate"]["traces"]}
    assert conn["new connections (plain)"]["ysum"] == syns == 7
    assert conn["SYN → greeting, ms"]["n"] == conn["greeting → OK, ms"]["n"] == syns
    shares = {t["name"]: t["xsum"] for t in figs["fig-shares"]["traces"]}
    both = group_stall.exchanges[group_stall.exchanges["seen"] == "both"]
    assert sum(shares.values()) == pytest.approx(float(both["total_s"].sum()), rel=1e-3)
    assert shares["execution"] == pytest.approx(float(both["exec_s"].sum()), rel=1e-9)


def test_open_connections_figure_peaks_where_summary_says(group_stall, group_stall_page):
    """The Connections section's open-connections line (on the shared time axis) reaches summary.json's open_max,
    which is every connection the DB capture saw open at once (all of group-stall's are held to the end: tshark
    counts their SYNs), and never more."""
    found, dom, _ = group_stall_page
    assert re.search("id=[\"']fig-openconns[\"']", section(dom, "connections"))
    story = group_stall.summary["connections"]
    traces = {t["name"]: t for t in found["figures"]["fig-openconns"]["traces"]}
    assert traces["open connections"]["ymax"] == story["open_max"]
    assert traces[f"most at once: {story['open_max']}"]["ymax"] == story["open_max"]
    proc = subprocess.run(["tshark", "-r", str(CAPTURES / "group-stall" / "app.pcap"), "-Y",
                           "tcp.flags.syn==1 && tcp.flags.ack==0", "-T", "fields", "-e", "frame.number"],
                          capture_output=True, text=True, timeout=120)
    assert story["open_max"] == len(proc.stdout.split()) == story["connections"]


def test_profile_lists_every_fingerprint_with_its_calls(group_stall, group_stall_page):
    """The Query profile: pt-query-digest's columns, filled (the count column was empty before), ranked by the
    clients' time, the sample with its values, the split beside it."""
    _, dom, _ = group_stall_page
    rows = re.findall(r"<tr><td>(\d+)</td><td><code[^>]*>(0x[0-9A-F]{32})</code></td>"
                      r"<td class=\"num\">([\d,]+)</td>", section(dom, "profile"))
    x = group_stall.exchanges
    calls = x.groupby(x["query_id"].astype(str)).size()
    assert len(rows) == x["query_id"].nunique() == 6
    for rank, qid, n in rows:
        assert int(n.replace(",", "")) == calls[qid], qid
    assert [int(r[0]) for r in rows] == list(range(1, 7))
    # ranked by what the clients waited: the victims' `select ?` (queued behind the BENCHMARK), not the culprit
    waited = x.groupby(x["query_id"].astype(str))["total_s"].sum().sort_values(ascending=False)
    assert [r[1] for r in rows] == list(waited.index)
    benchmark = x.loc[x["sql"].str.startswith("SELECT BENCHMARK").fillna(False), "query_id"].iloc[0]
    assert rows[0][1] != benchmark
    text = page_text(section(dom, "profile"))
    assert "SELECT BENCHMARK(6895237, SHA2(RAND(), 256))" in text and "fingerprint: select ?" in text
    assert text.count("net ") >= 5  # the split bar's numbers


def test_hidden_slow_table_groups_victims_by_stall_and_links_each_to_its_culprit(group_stall, group_stall_page):
    _, dom, _ = group_stall_page
    hidden_html = section(dom, "hidden")
    text = page_text(hidden_html)
    stall = group_stall.summary["groups"]["stalls"][0]
    culprit = stall["culprits"][0]
    sid = stall.get("id", 1)
    start = pd.Timestamp(stall["start"]).strftime("%H:%M:%S.%f")
    assert (f"Stall {sid}: thread group 1, {start} for 3.809 s, 3 queued — held by conn {culprit['conn_id']} "
            f"{culprit['sql']} executing 3.815 s") in flat_text(hidden_html)
    hidden = group_stall.exchanges[group_stall.exchanges["hidden_slow"].fillna(False)].sort_values("db_req_ts")
    # readable times, in time order within the stall, each linked to the stall row of the groups section
    times = re.findall(r"<tr><td>(\d\d:\d\d:\d\d\.\d{6})</td>", hidden_html)
    assert times == [t.strftime("%H:%M:%S.%f") for t in hidden["app_req_ts"]]
    assert hidden_html.count(f"href=\"#stall-{sid}\"") == 1 + len(hidden)
    assert f"id=\"stall-{sid}\"" in section(dom, "groups")
    for _, row in hidden.iterrows():
        app_filter = f"tcp.port=={row['client'].rsplit(':', 1)[1]} && tcp.port==3306 && frame.number>={row['req_first_frame']}"
        db_filter = f"frame.number>={row['db_req_first_frame']} && frame.number<={row['db_resp_last_frame']}"
        assert app_filter in text and db_filter in text, row["conn_id"]
        assert f"app {row['req_first_frame']}–{row['resp_last_frame']} · db {row['db_req_first_frame']}" in text
    assert text.count("frame.number>=") == 2 * len(hidden) == 6
    assert hidden_html.count("<details>") == len(hidden)  # the filters folded: one compact cell per row


def test_verdict_connections_and_method_say_the_measured_numbers(group_stall, group_stall_page, tmp_path):
    _, dom, _ = group_stall_page
    text = page_text(dom)
    verdict = flat_text(section(dom, "verdict"))
    story = group_stall.summary["story"]
    assert story["sentence"] in verdict and story["sentence"].startswith("3 statements were slow")
    assert all(" ".join(b["text"].split()) in verdict for b in story["bullets"])
    assert "pcapdecomp analyze captures/group-stall" in text  # the command line, in the method section
    conn = page_text(section(dom, "connections"))
    assert "7 MySQL connections, 7 of them opened during the capture (0 were already open when it began), 0 switched to TLS" in conn
    for label in ("SYN → greeting", "greeting → OK", "SYN → OK"):
        assert label in conn
    assert "handshake latency" not in text
    screenshot(group_stall.out_dir / "report.html", tmp_path / "shot", ARTIFACTS / "report-group-stall.png")


def test_connection_set_up_latencies_match_tshark(group_stall, tmp_path):
    """SYN → greeting and greeting → OK per connection, against tshark's frame times of the same packets."""
    from pcapdecomp.read.extract import read_exchanges

    db = CAPTURES / "group-stall" / "db.pcap"
    conns = read_exchanges(db, [], True).connections
    c = connection_times({"app": None, "db": conns}, {"clock": None})
    proc = subprocess.run(["tshark", "-r", str(db), "-Y", "(tcp.flags.syn==1 && tcp.flags.ack==0) || "
                           "mysql.protocol || (mysql.response_code == 0 && mysql.packet_number == 2)", "-T", "fields",
                           "-e", "tcp.srcport", "-e", "tcp.dstport", "-e", "frame.time_epoch", "-e", "tcp.flags.syn",
                           "-e", "mysql.protocol"], capture_output=True, text=True, timeout=120)
    per: dict = {}
    for line in proc.stdout.splitlines():
        sport, dport, when, syn, proto = line.split("\t")
        client = dport if sport == "3306" else sport
        kind = "syn" if syn == "1" and not proto and sport != "3306" else "greeting" if proto else "ok"
        per.setdefault(client, {}).setdefault(kind, float(when))
    want_sg = sorted(v["greeting"] - v["syn"] for v in per.values())
    want_go = sorted(v["ok"] - v["greeting"] for v in per.values())
    assert len(want_sg) == len(c) == 7
    assert sorted(c["syn_greeting_s"]) == pytest.approx(want_sg, abs=2e-6)
    assert sorted(c["greeting_ok_s"]) == pytest.approx(want_go, abs=2e-6)


def test_display_filter_selects_the_exchange_in_tshark(group_stall):
    """The filter printed for a hidden-slow exchange selects its frames, and tshark sees the same request."""
    row = group_stall.exchanges[group_stall.exchanges["hidden_slow"].fillna(False)].iloc[0]
    from pcapdecomp.render.evidence import display_filter

    flt = display_filter(row["db_client"], row["server"], row["db_req_first_frame"], row["db_resp_last_frame"])
    proc = subprocess.run(["tshark", "-r", str(CAPTURES / "group-stall" / "db.pcap"), "-Y", f"({flt}) && mysql.query",
                           "-T", "fields", "-e", "frame.number", "-e", "mysql.query"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line.split("\t") for line in proc.stdout.splitlines()]
    assert lines == [[str(row["db_req_first_frame"]), row["sql"]]]


def test_report_is_self_contained(group_stall):
    import plotly.offline

    page = (group_stall.out_dir / "report.html").read_text(encoding="utf-8")
    plotly_js = plotly.offline.get_plotlyjs()
    assert page.count(plotly_js[:400]) == 1  # plotly.js inlined once
    outside = page.replace(plotly_js, "")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", outside, flags=re.I)
    assert not re.search(r"@import|url\(\s*['\"]?https?:", outside, flags=re.I)


@pytest.mark.parametrize("name", ["group-stall", "maxthreads", "oltp-hogs", "features"])
def test_every_bundled_report_fills_its_tables(name, bundled_analysis):
    """No empty cells where numbers belong (the profile's calls were empty in every report), spans on the time
    axis for every answered exchange, a readable time in the hidden-slow table."""
    res = bundled_analysis(name)
    page = (res.out_dir / "report.html").read_text(encoding="utf-8")
    x = res.exchanges
    prof = section(page, "profile")
    rows = re.findall(r"<code[^>]*>(0x[0-9A-F]{32})</code></td><td class='num'>([\d,]+)</td>", prof)
    want = x.groupby(x["query_id"].astype(str)).size()
    assert len(rows) == min(len(want), PROFILE_ROWS)
    assert {q: int(n.replace(",", "")) for q, n in rows} == {q: want[q] for q, _ in rows}
    if len(want) > PROFILE_ROWS:
        assert f"… and {len(want) - PROFILE_ROWS} more fingerprints." in prof
    assert "bound method" not in page and "<td></td>" not in prof
    specs = _page_specs(page)
    meta = specs["_timeline"]
    answered = int((x["app_resp_ts"].notna() | x["db_resp_ts"].notna()).sum())
    assert meta["total"] == answered and meta["shown"] == answered and not meta["sampled"]
    if name == "maxthreads":  # 8 SLEEP(2) in the slow log, two of them waited for a thread
        assert int(x["in_slow_log"].fillna(False).sum()) == 8


def test_report_of_100k_exchanges_stays_bounded(tmp_path, capsys, bundled_analysis):
    """oltp-hogs repeated 40 times, each copy shifted by a tenth of the recording's span (so that some 90
    connections overlap): the timeline keeps every notable statement, samples the rest down to TIMELINE_STATEMENTS
    on at most TIMELINE_LANES lanes, the aggregated charts stay at TIME_BUCKETS buckets, the page stays small."""
    res = bundled_analysis("oltp-hogs")
    x = res.exchanges
    span = (x["app_resp_ts"].max() - x["app_req_ts"].min()) / 10
    copies, groups = [], []
    for k in range(40):
        c = x.copy()
        for col in ("app_req_ts", "app_resp_ts", "db_req_ts", "db_resp_ts", "req_first_ts", "req_last_ts",
                    "resp_first_ts", "resp_last_ts"):
            c[col] = c[col] + k * span
        c["conn_id"] = c["conn_id"] + 1000 * k  # other connections: more lanes than the chart holds
        copies.append(c)
        g = res.groups.copy()
        g["bucket_start"] = g["bucket_start"] + k * span
        groups.append(g)
    big = pd.concat(copies, ignore_index=True)
    big_groups = pd.concat(groups, ignore_index=True)
    assert len(big) >= 100_000
    hidden = int(big["hidden_slow"].fillna(False).sum())
    assert hidden == 40 * res.summary["exchanges"]["hidden_slow"] > 0

    t = exchange_times(big)
    axis = time_axis(t)
    specs = figure_specs(res.summary, big, big_groups, t, axis)
    traces = {tr["name"]: tr for tr in specs["timeline"]["data"]}
    markers = [tr for tr in specs["timeline"]["data"] if tr["mode"] == "markers"]
    shown = sum(len(_values(tr["y"])) for tr in markers)
    assert shown == specs["_timeline"]["shown"] == TIMELINE_STATEMENTS
    assert len(_values(traces["hidden slow"]["y"])) == hidden  # every one kept
    assert len(specs["timeline"]["layout"]["yaxis"]["ticktext"]) == TIMELINE_LANES
    assert specs["timeline"]["layout"]["yaxis"]["ticktext"][-1].endswith("other connections")
    assert len(specs["heatmap"]["data"][0]["z"][0]) <= TIME_BUCKETS
    assert len(_values(specs["pool"]["data"][0]["y"])) <= TIME_BUCKETS + 1

    started = time.perf_counter()
    page = render(res.summary, big, big_groups)
    print(f"render of {len(big)} exchanges: {time.perf_counter() - started:.2f} s, {len(page) / 2**20:.1f} MiB")
    assert len(page.encode()) < 15 * 2**20, len(page)
    assert "a uniform sample of the rest" in page
    assert page.count("<tr") < 1000  # tables are aggregated, not one row per exchange


def _page_specs(page: str) -> dict:
    return json.loads(re.search(r"var specs = (\{.*?\});\n", page, flags=re.S).group(1))


def _values(v) -> np.ndarray:
    """A trace array: a list, or {dtype, bdata} base64 typed array."""
    if isinstance(v, dict) and "bdata" in v:
        import base64

        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
    return np.asarray(v)


@pytest.mark.parametrize("case", ["db-only", "app-only", "no-slow-log", "no-thread-pool-size", "no-exchanges"])
def test_report_says_what_is_missing(tmp_path, case):
    gs = CAPTURES / "group-stall"
    kwargs = dict(long_query_time=1.0, thread_pool_size=2)
    if case == "db-only":
        kwargs.update(db=gs / "db.pcap", slow_log=gs / "slow.log")
    elif case == "app-only":
        kwargs.update(app=[gs / "app.pcap"])
    elif case == "no-slow-log":
        kwargs.update(app=[gs / "app.pcap"], db=gs / "db.pcap")
    elif case == "no-thread-pool-size":
        kwargs.update(app=[gs / "app.pcap"], db=gs / "db.pcap", slow_log=gs / "slow.log", thread_pool_size=None)
    else:
        kwargs.update(db=gs / "db.pcap", servers=["10.213.77.2:9999"])  # a server that is not in the capture
    res = analyze(capture_set(**kwargs), Options(quiet=True), tmp_path / case)
    page = (res.out_dir / "report.html").read_text(encoding="utf-8")
    text = page_text(page)
    sentence = " ".join(res.summary["story"]["sentence"].split())
    assert sentence in text
    if case == "db-only":
        assert "app captures none" in text and sentence.startswith("3 statements were slow")
        assert "not estimated" in text  # clock
        assert "At the DB capture (the server's view): 7 MySQL connections" in text
    elif case == "app-only":
        assert "DB capture none" in text and "No exchange was seen at both points" in text
        assert "Hidden-slow statements None" in text or "hidden slow not decided" in text
        assert "At the app capture: 7 MySQL connections" in text
    elif case == "no-slow-log":
        assert "slow log none" in text
        # without a slow log, MariaDB's SERVER_QUERY_WAS_SLOW flag still tells the 3 hidden probes apart
        assert "3 statements took longer than long_query_time" in text
    elif case == "no-thread-pool-size":
        tps = res.summary["thread_pool_size"]
        if tps["value"] is None:
            assert "no per-group view" in text
        else:  # inferred from the wire: said so, and the groups are drawn
            assert f"thread_pool_size {tps['value']} (inferred from the wire" in text and "id='fig-heatmap'" in page
    else:
        assert len(res.exchanges) == 0 and "nothing to show" in text and "no statements" in text
    specs = _page_specs(page)
    assert all(isinstance(v, dict) and "data" in v for k, v in specs.items() if not k.startswith("_"))


def test_db_only_report_renders_in_chromium(tmp_path):
    gs = CAPTURES / "group-stall"
    res = analyze(capture_set(db=gs / "db.pcap", slow_log=gs / "slow.log", long_query_time=1.0, thread_pool_size=2),
                  Options(quiet=True), tmp_path / "db-only")
    found, dom, _ = probe(res.out_dir / "report.html", tmp_path / "profile")
    assert not script_errors(dom) and not found["errors"]
    specs = _page_specs((res.out_dir / "report.html").read_text(encoding="utf-8"))
    drawn = sum(1 for k in specs if not k.startswith("_"))
    assert rendered(dom) == f"{drawn} figures" and drawn == 6  # all but the shares: no exchange seen at both points
    traces = {tr["name"]: tr for tr in found["figures"]["fig-timeline"]["traces"]}
    assert traces["hidden slow"]["n"] == 3  # spans from D1 to D4 when only the DB saw the exchange


def test_connection_chart_counts_tls_and_survives_one_login_equal_times_or_none(tmp_path):
    """features holds a TLS connection (counted, stacked on plain in the chart); the chart also stands with one
    login, with every login at the same instant (the old chart divided by a zero span there) and with none."""
    from pcapdecomp.read.extract import read_exchanges
    from pcapdecomp.render.figures import _connection_rate

    db = read_exchanges(CAPTURES / "features" / "db.pcap", [], True)
    conns = db.connections
    assert int(conns["tls"].sum()) == 1
    summary = {"clock": None}
    x = db.exchanges
    t = exchange_times(x.assign(app_req_ts=x["req_first_ts"], app_resp_ts=x["resp_last_ts"],
                                db_req_ts=pd.NaT, db_resp_ts=pd.NaT))
    c = connection_times({"db": conns}, summary)
    axis = time_axis(t, [c["t_ns"].to_numpy()])
    bars = {tr["name"]: _values(tr["y"]).sum() for tr in _connection_rate(c, axis)["data"] if tr["type"] == "bar"}
    assert bars == {"new connections (plain)": len(conns) - 1, "new connections (TLS)": 1}
    one = connection_times({"db": conns.iloc[:1]}, summary)
    same = connection_times({"db": conns.assign(syn_ts=conns["syn_ts"].iloc[0], greeting_ts=conns["syn_ts"].iloc[0])},
                            summary)
    for frame, n in ((one, 1), (same, len(conns))):
        spec = _connection_rate(frame, time_axis(t, [frame["t_ns"].to_numpy()]))
        assert sum(_values(tr["y"]).sum() for tr in spec["data"] if tr["type"] == "bar") == n
    assert _connection_rate(connection_times({"db": conns.iloc[:0]}, summary), axis) is None
    assert connection_times(None, summary) is None


def test_connections_that_follow_each_other_share_a_lane(group_stall):
    """Five copies of group-stall one after the other (35 connections, at most 7 open at once): 7 lanes, each
    holding the same connection slot of every copy, every statement drawn."""
    x = group_stall.exchanges
    span = (x["app_resp_ts"].max() - x["app_req_ts"].min()) + pd.Timedelta(seconds=1)
    copies = []
    for k in range(5):
        c = x.copy()
        for col in ("app_req_ts", "app_resp_ts", "db_req_ts", "db_resp_ts"):
            c[col] = c[col] + k * span
        c["conn_id"] = c["conn_id"] + 100 * k
        copies.append(c)
    big = pd.concat(copies, ignore_index=True)
    t = exchange_times(big)
    spec = figure_specs(group_stall.summary, big, None, t, time_axis(t))["timeline"]
    labels = spec["layout"]["yaxis"]["ticktext"]
    assert len(labels) == 7 and all(label.endswith(" + 4 after it") for label in labels), labels
    markers = [tr for tr in spec["data"] if tr["mode"] == "markers"]
    assert sum(len(_values(tr["y"])) for tr in markers) == 5 * int(x["app_resp_ts"].notna().sum())


def test_the_waterfall_takes_the_slowest_as_nlargest_does():
    """figures._largest_positive (the waterfall's slowest, chosen among the values at or above the n-th largest
    alone) is Series.nlargest of the positive values: the same values at the same positions, ties in row order,
    NaN, 0 and −0 left out."""
    from pcapdecomp.render.figures import _largest_positive

    rng = np.random.default_rng(7)
    for trial in range(200):
        size = int(rng.integers(0, 120))
        values = (rng.choice([np.nan, -1.0, 0.0, -0.0, 1e-9, 0.5, 1.0, 2.0], size) if trial % 2
                  else rng.random(size) - 0.2)
        for n in (1, 3, 30):
            whole = pd.Series(values).dropna()
            expected = whole[whole > 0].nlargest(n)
            got = _largest_positive(values.copy(), n)
            assert got.index.tolist() == expected.index.tolist()
            assert got.to_numpy().tolist() == expected.to_numpy().tolist()


def test_the_time_axis_points_are_the_parts_taken():
    """figures._taken is np.concatenate of each part at its mask: masks taking all, some or none of their values."""
    from pcapdecomp.render.figures import _taken

    rng = np.random.default_rng(3)
    a, b, c = (rng.integers(-5, 5, 50).astype(np.int64) for _ in range(3))
    for mask_a, mask_b in ((np.ones(50, bool), rng.random(50) < 0.5), (np.zeros(50, bool), np.ones(50, bool))):
        got = _taken([(a, mask_a), (b, mask_b), (c, None)])
        assert got.dtype == np.int64 and got.tolist() == np.concatenate([a[mask_a], b[mask_b], c]).tolist()
    assert len(_taken([(a, np.zeros(50, bool))])) == 0


def test_the_exchange_times_are_the_same_read_in_place():
    """figures.exchange_times reads a time column in place where none of its rows is null: the same start, end, D1,
    D4 and masks as made from ts_ns's copies (nulls 0), with every row's A1, none, or some."""
    from pcapdecomp.core.times import ts_ns
    from pcapdecomp.render.figures import exchange_times

    ns = pd.Series(pd.to_datetime(np.arange(6) * 1_000_000 + 1_700_000_000_000_000_000, utc=True))
    null = pd.Series(pd.NaT, index=ns.index, dtype=ns.dtype)
    some = ns.where(np.array([True, False, True, True, False, True]))
    for a1, a4, d1, d4 in ((ns, ns, ns, ns), (ns, some, some, ns), (null, null, ns, some), (some, some, ns, null)):
        t = exchange_times(pd.DataFrame({"app_req_ts": a1, "app_resp_ts": a4, "db_req_ts": d1, "db_resp_ts": d4}))
        (c1, v1), (c4, v4), (e1, w1), (e4, w4) = (ts_ns(c) for c in (a1, a4, d1, d4))
        expected = (np.where(v1, c1, e1), np.where(v1, c4, e4), e1, e4, v1 | w1, np.where(v1, v4, w4), w1, w4)
        got = (t.start, t.end, t.d1, t.d4, t.has_start, t.has_end, t.has_d1, t.has_d4)
        for g, e in zip(got, expected):
            assert g.tolist() == e.tolist()


def test_the_layer_sums_are_the_layers_summed():
    """figures.layer_sums (each part made in turn in queue_parts' arrays) gives the very floats of digest.queue_layers'
    parts summed over the rows: every row or some, likely queues among them or none, queue_min_s or not."""
    from pcapdecomp.explain.digest import queue_layers
    from pcapdecomp.render.figures import layer_sums

    rng = np.random.default_rng(11)
    for trial in range(60):
        n = int(rng.integers(0, 400))
        queue = np.where(rng.random(n) < 0.2, np.nan, rng.random(n) * 10.0 ** rng.integers(-6, 1, n))
        x = pd.DataFrame({
            "queue_s": queue, "exec_s": rng.random(n),
            "queue_min_s": np.where(rng.random(n) < 0.3, np.nan, queue * rng.random(n)),
            "queue_source": pd.Categorical(rng.choice(["measured", "likely", "estimated", None], n,
                                                      p=[0.4, 0.1 * (trial % 3), 0.5 - 0.1 * (trial % 3), 0.1])),
            "exec_source": pd.Categorical(rng.choice(["slow_log", "fingerprint_median", None], n))})
        if trial % 4 == 0:
            x = x.drop(columns="queue_min_s")
        for rows in (np.ones(n, dtype=bool), rng.random(n) < 0.5):
            expected = tuple(float(part[rows].sum()) for part in queue_layers(x))
            assert layer_sums(x, rows) == expected
