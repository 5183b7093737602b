"""Through a proxy, the verdict and the report tell the proxy's share: checked on the lab's real recordings through
Gaea (pool of 2, the proxy is the bottleneck) and HAProxy (the DB's thread group stalls), against their truth files,
rendered in headless Chromium, and on the degenerate point sets (the proxy capture alone, app + DB without it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from browser import page_text, probe, rendered, script_errors, section
from hypothesis import given, settings
from hypothesis import strategies as st

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.explain.decompose import STALL_MIN_QUEUE_S, network_parts
from pcapdecomp.pair.proxy import PAIRED_KINDS
from pcapdecomp.render.figures import TimeAxis, _most_at_once

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"


def run(tmp_path_factory, name, **kw):
    out = tmp_path_factory.mktemp("proxyreport") / name
    kw = {"set_dir": CAPTURES / name, **kw}
    return analyze(capture_set(kw.pop("set_dir"), **kw), Options(quiet=True), out)


def truth(name: str) -> list[dict]:
    return [json.loads(line) for line in (CAPTURES / name / "truth.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def pool(bundled_analysis):
    """`analyze captures/proxy-pool`: the run's shared analysis (tests/conftest.py), only read here."""
    return bundled_analysis("proxy-pool")


@pytest.fixture(scope="module")
def pool_page(pool, tmp_path_factory):
    return probe(pool.out_dir / "report.html", tmp_path_factory.mktemp("chromium") / "profile")


@pytest.fixture(scope="module")
def l4(bundled_analysis):
    """`analyze captures/proxy-l4`: the run's shared analysis (tests/conftest.py), only read here."""
    return bundled_analysis("proxy-l4")


def paired(x: pd.DataFrame) -> np.ndarray:
    return x["proxy_match"].isin(PAIRED_KINDS).to_numpy(dtype=bool, na_value=False)


# --- the verdict ---------------------------------------------------------------------------------------------------


def test_pool_bottleneck_leads_the_story_with_the_truths_numbers(pool):
    """Gaea's pool of 2 in front of 8 clients: the story says the time went inside the proxy, with as many waits
    of 100 ms or more as the truth's statements whose client time beyond execution was that long, and the pool's
    size as the truth has it (8 client connections, 2 server connections that ran the tagged statements)."""
    story = pool.summary["story"]
    x = pool.exchanges
    tagged = [r for r in truth("proxy-pool") if r["db_conn_id"] is not None]
    clients = {r["conn_label"] for r in truth("proxy-pool")}
    servers = {r["db_conn_id"] for r in tagged}
    assert story["findings"][0] == "proxy_queue"
    assert story["sentence"].startswith("The time went inside the L7 proxy, not the DB: ")
    assert f"its {len(clients)} client connections shared {len(servers)} server connections" in story["sentence"]
    waited = paired(x) & (x["proxy_wait_s"].fillna(0) >= STALL_MIN_QUEUE_S).to_numpy()
    assert f"{int(waited.sum())} of the {int(paired(x).sum())} statements paired through it" in story["sentence"]
    # every tagged statement that waited in truth is among them: truth's wait beyond execution ≥ 100 ms
    slow_in_truth = sum(1 for r in tagged if r["proxy_and_network_s"] >= STALL_MIN_QUEUE_S)
    assert slow_in_truth == 18 and int(waited.sum()) >= slow_in_truth
    # the DB's own story is kept, as a bullet, and the proxy's line is one too
    topics = [b["topic"] for b in story["bullets"]]
    assert topics[0] == "db" and story["bullets"][0]["text"].startswith("On the DB: No statement waited")
    assert "proxy" in topics
    assert pool.summary["verdict"].splitlines()[0] == story["sentence"]
    assert pool.summary["proxy"]["sentence"] in pool.summary["verdict"]


def test_db_stall_behind_l4_stays_the_story_and_the_proxy_is_a_bullet(l4):
    story = l4.summary["story"]
    assert story["findings"][0] == "group_stall" and "proxy_queue" not in story["findings"]
    assert [b for b in story["bullets"] if b["topic"] == "proxy"][0]["text"].startswith("Through an L4 proxy: ")


@pytest.mark.parametrize("name", ["proxy-pool", "proxy-l4"])
def test_split_tells_the_proxys_share_and_adds_up(tmp_path_factory, pool, l4, name):
    res = pool if name == "proxy-pool" else l4
    x = res.exchanges
    both = ((x["seen"] == "both") & x["total_s"].notna()).to_numpy()
    parts = dict(network_parts(x, both))
    assert set(parts) >= {"inside the proxy"}
    assert sum(parts.values()) == pytest.approx(float(x.loc[both, "network_s"].sum()), rel=1e-9, abs=1e-12)
    assert parts["inside the proxy"] == pytest.approx(float(x.loc[both, "proxy_s"].sum()), rel=1e-9)
    split = next(b["text"] for b in res.summary["story"]["bullets"] if b["topic"] == "split")
    total = float(x.loc[both, "total_s"].sum())
    assert f"inside the proxy {100 * parts['inside the proxy'] / total:.1f} %" in split
    assert "network (not told apart)" not in parts  # all three captures: every leg measured


def test_without_the_proxy_capture_network_is_not_split(tmp_path_factory):
    """App + DB through Gaea without its capture: the proxy columns stay null, the split says plain network, and the
    story does not claim a proxy queue it cannot see."""
    res = run(tmp_path_factory, "proxy-pool", set_dir=None, app=[CAPTURES / "proxy-pool" / "app.pcap"],
              db=CAPTURES / "proxy-pool" / "db.pcap")
    x = res.exchanges
    assert x["proxy_s"].isna().all()
    assert [label for label, _ in network_parts(x, np.ones(len(x), dtype=bool))] == ["network"]
    assert "proxy_queue" not in res.summary["story"]["findings"]
    assert "without a capture on the proxy host" in res.summary["proxy"]["sentence"]
    html = (res.out_dir / "report.html").read_text()
    assert "id='proxy'" in html and "id='fig-proxy'" not in html


# --- the report ----------------------------------------------------------------------------------------------------


def test_pool_page_renders_the_proxy_section_against_the_table(pool, pool_page):
    found, dom, _ = pool_page
    assert not script_errors(dom) and not found["errors"], (script_errors(dom), found["errors"])
    assert rendered(dom) == f"{len(found['figures'])} figures" and "fig-proxy" in found["figures"]
    figs = found["figures"]
    # on the shared time axis: same plot area and pixels as the timeline
    assert figs["fig-proxy"]["type"] == "date"
    assert figs["fig-proxy"]["px"] == pytest.approx(figs["fig-timeline"]["px"], abs=0.5)
    x = pool.exchanges
    pair = paired(x)
    text = page_text(section(dom, "proxy"))
    assert pool.summary["proxy"]["sentence"] in text
    servers = x.loc[pair, "db_client"].nunique()
    assert f"{servers} server connections carried the {int(pair.sum())} paired statements of 8 client connections" in text
    rows = re.findall(r"<tr><td>([\d.:]+)</td><td class=\"num\">(\d+)</td><td class=\"num\">(\d+)</td>",
                      section(dom, "proxy"))
    assert len(rows) == servers == 2
    assert sum(int(n) for _, _, n in rows) == int(pair.sum())
    # the longest waits, longest first, each a row of the table
    longest = x.loc[x["proxy_wait_s"].notna()].nlargest(3, "proxy_wait_s")
    waits = section(dom, "proxy").split("Longest waits inside the proxy", 1)[1]
    for _, r in longest.iterrows():
        assert r["app_req_ts"].strftime("%H:%M:%S.%f") in waits
    assert f"{int((x['proxy_match'] == 'ambiguous').sum())} client statements had several server-side requests" in text
    nav = re.search(r"<nav>(.*?)</nav>", dom, flags=re.S).group(1)
    assert "href=\"#proxy\"" in nav


def test_pool_figure_shows_the_pool_at_its_size(pool, pool_page):
    """'sent on to the DB' never exceeds the pool (2 server connections) and reaches it; waiting ones are above it;
    one marker per paired statement's wait."""
    found, _, _ = pool_page
    traces = {t["name"]: t for t in found["figures"]["fig-proxy"]["traces"]}
    x = pool.exchanges
    assert traces["one statement's wait, ms (right axis)"]["n"] == int(x["proxy_wait_s"].notna().sum())
    assert traces["one statement's wait, ms (right axis)"]["ysum"] == pytest.approx(
        1e3 * float(x["proxy_wait_s"].sum()), rel=1e-6)
    spec = json.loads(re.search(r"var specs = (\{.*?\});\n", (pool.out_dir / "report.html").read_text(),
                                flags=re.S).group(1).replace("\\u003c", "<").replace("\\u003e", ">").replace(
        "\\u0026", "&"))
    import base64

    def values(a):
        return np.frombuffer(base64.b64decode(a["bdata"]), dtype={"f8": np.float64}[a["dtype"]])

    lines = {d["name"]: values(d["y"]) for d in spec["proxy"]["data"] if d["type"] == "scatter"}
    assert lines["sent on to the DB (most at once)"].max() == 2
    assert lines["waiting inside the proxy (most at once)"].max() >= 6  # 8 clients at once, 2 sent on


def test_pool_timeline_puts_each_client_on_its_lane_with_the_wait_in_pink(pool, pool_page):
    found, dom, _ = pool_page
    tl = found["figures"]["fig-timeline"]
    traces = {t["name"]: t for t in tl["traces"]}
    x = pool.exchanges
    fronts = x.loc[paired(x), "front_conn_id"].dropna().astype(int).unique()
    for f in fronts:
        assert f"conn {f}" in tl["ticktext"]
    p = {c: x[c] for c in ("proxy_front_req_ts", "proxy_back_req_ts", "proxy_back_resp_ts", "proxy_front_resp_ts")}
    segments = int((p["proxy_back_req_ts"] > p["proxy_front_req_ts"]).sum()
                   + (p["proxy_front_resp_ts"] > p["proxy_back_resp_ts"]).sum())
    assert traces["inside the proxy"]["n"] == 3 * segments
    tip = found["tips"]["statement"]
    assert "inside the proxy" in tip and "at the proxy" in tip
    assert "Pink: inside the proxy" in page_text(section(dom, "timeline"))


def test_pages_without_a_proxy_have_no_proxy_section(bundled_analysis):
    res = bundled_analysis("group-stall")
    html = (res.out_dir / "report.html").read_text()
    assert "id='proxy'" not in html and "href='#proxy'" not in html and "Pink: inside the proxy" not in html
    assert '"name":"inside the proxy"' not in html and res.summary["proxy"] is None


def test_proxy_capture_alone_renders(tmp_path_factory):
    """The proxy's capture alone: its client side is the app's view, its server side the DB's; the page renders
    with the proxy section and its figure."""
    res = run(tmp_path_factory, "proxy-pool", set_dir=None, proxy=[CAPTURES / "proxy-pool" / "proxy.pcap"])
    found, dom, _ = probe(res.out_dir / "report.html", tmp_path_factory.mktemp("chromium") / "profile")
    assert not script_errors(dom) and not found["errors"]
    assert "fig-proxy" in found["figures"]
    assert res.summary["story"]["findings"][0] == "proxy_queue"


# --- the pool's concurrency, against a brute force ------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), max_size=40), st.integers(1, 97))
def test_most_at_once_is_the_maximum_overlap_per_bucket(intervals, bucket):
    start = np.array([a for a, _ in intervals], dtype=np.int64)
    end = np.array([a + d for a, d in intervals], dtype=np.int64)
    axis = TimeAxis(0, 1300, 0, 1300)
    if not len(start):
        return
    edges, most = _most_at_once(start, end, bucket, axis)
    assert len(edges) == len(most) + 1
    for k in range(len(most)):
        lo, hi = edges[k], edges[k + 1]
        # brute force: overlap at every instant of the bucket (intervals are half-open [start, end))
        want = max(int(((start <= t) & (t < end)).sum()) for t in range(lo, hi))
        assert most[k] == want, (k, lo, hi)


# --- evidence and the table through the proxy ----------------------------------------------------------------------


def test_l7_requests_without_a_server_connection_have_no_thread_group(pool):
    """Behind an L7 proxy the client side's connection id is the proxy's own: a request not paired to a server
    request (ambiguous, unmatched, answered by the proxy) has no server connection, so no conn_id and no thread
    group (they were the proxy's id and that id modulo the pool size: a thread group that does not exist)."""
    x = pool.exchanges
    alone = x["proxy_match"].isin(["ambiguous", "unmatched", "proxy-handled"]).to_numpy(dtype=bool, na_value=False)
    assert alone.sum() == 41
    assert x.loc[alone, "conn_id"].isna().all() and x.loc[alone, "thread_group"].isna().all()
    assert x.loc[alone, "front_conn_id"].notna().all()
    db_ids = {r["db_conn_id"] for r in truth("proxy-pool") if r["db_conn_id"] is not None}
    assert set(x.loc[paired(x), "conn_id"].astype(int)) == db_ids  # paired: the server thread that ran it


@pytest.mark.parametrize("name", ["proxy-pool", "proxy-l4"])
def test_evidence_through_a_proxy_holds_both_ends_and_reproduces(tmp_path_factory, pool, l4, name):
    """Evidence of an analysis through a proxy: the DB capture's frames of the chosen exchanges are found at the
    server's address as the DB saw it (not the proxy's the app talked to), tshark reads each chosen statement from
    them, and the command in summary.md reproduces the analysis."""
    import shlex
    import subprocess
    import sys

    from pcapdecomp.render.evidence import export

    res = pool if name == "proxy-pool" else l4
    out = tmp_path_factory.mktemp("evidence") / name
    result = export(res.out_dir, out_dir=out)
    md = (out / "summary.md").read_text()
    rows = result.rows
    if name == "proxy-pool":  # the story is the proxy's queue: the longest waits inside it are the evidence
        assert result.how.startswith("the statements that waited longest inside the proxy")
        x = res.exchanges
        assert sorted(rows["proxy_wait_s"]) == pytest.approx(sorted(x["proxy_wait_s"].dropna().nlargest(len(rows))))
        assert "inside the proxy (waited)" in md and "client conn (proxy's id)" in md
    db = out / "db.pcapng"
    assert result.frames[str(CAPTURES / name / "db.pcap")] > 0
    proc = subprocess.run(["tshark", "-r", str(db), "-Y", "mysql.query", "-T", "fields", "-e", "mysql.query"],
                          capture_output=True, text=True, timeout=120)
    queries = proc.stdout.splitlines()
    both = rows[rows["seen"] == "both"]
    assert len(both) and len(queries) >= len(both)
    command = re.search(r"```\n(pcapdecomp analyze .*)\n", md).group(1)
    args = shlex.split(command)[2:]
    args[args.index("--out") + 1] = str(tmp_path_factory.mktemp("again") / "analysis")
    assert "--proxy" in args
    again = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", *args, "-q"], cwd=CAPTURES / name,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    redo = json.loads((Path(args[args.index("--out") + 1]) / "summary.json").read_text())
    assert redo["story"]["sentence"] == res.summary["story"]["sentence"]


def test_compare_through_proxies_has_the_proxys_components(pool, l4, tmp_path):
    """compare of the two proxy recordings: the time inside the proxy is a component of its own, equal to the
    analyses' sums; thread groups with null keys (L7 requests without a server connection) do not break it."""
    from pcapdecomp.compare import compare

    result = compare([pool.out_dir, l4.out_dir], tmp_path / "cmp", quiet=True)
    t = result.table
    part = t[(t["scope"] == "component") & (t["metric"] == "sum_s")].set_index(["key", "analysis"])["value"]
    for res in (pool, l4):
        name = res.summary["set"]
        assert part[("inside_the_proxy", name)] == pytest.approx(float(res.exchanges["proxy_s"].sum()), rel=1e-9)
        assert part[("proxy_wait", name)] == pytest.approx(float(res.exchanges["proxy_wait_s"].sum()), rel=1e-9)
    groups = t[(t["scope"] == "thread_group") & (t["metric"] == "calls") & (t["analysis"] == "proxy-pool")]
    x = pool.exchanges
    assert groups["value"].sum() == x["thread_group"].notna().sum()
