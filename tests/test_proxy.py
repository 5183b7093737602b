"""Pairing through a proxy (pcapdecomp/pair/proxy.py) on real recordings: HAProxy in TCP mode (captures/proxy-l4) and
Gaea with a pool of 2 server connections for 8 clients (captures/proxy-pool), each captured at the app, on the
proxy host (both sides) and at the DB, checked against the lab's ground truth (truth.jsonl) and against the
captures themselves; every pair of the three capture points; degenerate inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from analysing import explain

from pcapdecomp.analysis import capture_set
from pcapdecomp.core.schema import PROXY_COLUMNS
from pcapdecomp.mysql.params import split_params
from pcapdecomp.pair.proxy import canonical, with_params

ROOT = Path(__file__).resolve().parents[1]
L4 = ROOT / "captures" / "proxy-l4"
POOL = ROOT / "captures" / "proxy-pool"
_cache: dict = {}


def run(set_dir=None, app=(), db=None, proxy=(), **kw):
    key = (set_dir, tuple(app), db, tuple(proxy))
    if key not in _cache:
        _cache[key] = explain(capture_set(set_dir, app=list(app), db=db, long_query_time=kw.get("lqt"),
                                          proxy=list(proxy)), jobs=1)
    return _cache[key]


def truth(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "truth.jsonl").read_text().splitlines()]


# --- canonical text ------------------------------------------------------------------------------------------------


def test_canonical_sets_aside_what_a_proxy_rewrites_and_keeps_literals():
    assert canonical("SELECT 1001 AS tag, SLEEP(0.15)") == canonical("SELECT 1001 AS `tag`,SLEEP(0.15)")
    assert canonical("/* app=web */ select  1") == canonical("SELECT 1;")
    assert canonical("SELECT 'A  b'") != canonical("SELECT 'a b'")  # a literal is data: case and spaces count
    assert canonical("SELECT 1") != canonical("SELECT 2")
    assert canonical("SELECT '?'") == "select'?'"


def test_prepared_text_with_its_values():
    assert split_params("1, 'a, b', NULL, 'it''s'") == ["1", "'a, b'", "NULL", "'it''s'"]
    assert with_params("SELECT ? AS tag, SLEEP(?)", "1007, 0.15") == "SELECT 1007 AS tag, SLEEP(0.15)"
    assert with_params("SELECT '?' , ?", "5") == "SELECT '?' , 5"  # a ? inside a literal is no placeholder
    assert with_params("SELECT ?, ?", "1") is None  # too few values: no key, no pairing


# --- L4: HAProxy -----------------------------------------------------------------------------------------------


def test_l4_three_points_pair_every_exchange_and_split_the_time():
    r = run(L4)
    x, p = r.exchanges, r.summary["proxy"]
    assert p["kind"] == "l4" and p["sides"]["decided_by"] == "proxy address"
    assert (x["proxy_match"] == "l4").all() and (x["seen"] == "both").all()
    # the three captures hold the same exchanges (each connection has its twin on the other side of the proxy)
    assert len(x) == p["app_proxy"]["matched"] == p["proxy_db"]["matched"] == p["through"]["paired"]
    # L4 passes the greeting through: the client and the server side carry the same connection id
    assert (x["front_conn_id"] == x["conn_id"]).all()
    # the legs add up to what the client waited beyond the DB host
    legs = x["net_app_proxy_s"] + x["proxy_s"] + x["net_proxy_db_s"]
    answered = x["network_s"].notna()
    assert answered.sum() >= len(x) - 5  # only the COM_QUITs go unanswered
    assert np.allclose(legs[answered], x["network_s"][answered], atol=5e-6)
    assert (x["proxy_s"].dropna() >= -5e-6).all() and (x["proxy_wait_s"].dropna() >= -5e-6).all()


def test_l4_group_stall_found_through_haproxy_against_truth():
    r = run(L4)
    rows = truth(L4)
    hog = next(t for t in rows if t["sql"] and "BENCHMARK" in t["sql"])
    stalled = [t for t in rows if t["sql"] == "SELECT 1" and t["conn_id"] % 2 == hog["conn_id"] % 2
               and t["client_s"] > 0.5]
    assert stalled, "the recording shows probes that waited behind the hog"
    x = r.exchanges
    victims = x[x["stall_role"] == "victim"]
    assert set(victims["conn_id"].astype(int)) <= {t["conn_id"] for t in stalled}
    assert len(victims) == len(stalled)
    culprit = x[x["stall_role"] == "culprit"]
    assert list(culprit["conn_id"]) == [hog["conn_id"]]
    # client time as the client measured it (driver overhead aside)
    by_send = x.sort_values("app_req_ts")
    probe_total = by_send[by_send["conn_id"].isin({t["conn_id"] for t in stalled})]["total_s"].max()
    assert abs(probe_total - max(t["client_s"] for t in stalled)) < 0.01


@pytest.mark.parametrize("points", ["app+db", "proxy", "app+proxy", "proxy+db"])
def test_l4_any_two_points(points):
    files = {"app": [L4 / "app.pcap"], "db": L4 / "db.pcap", "proxy": [L4 / "proxy.pcap"]}
    given = points.split("+")
    r = run(None, app=files["app"] if "app" in given else (),
            db=files["db"] if "db" in given else None, proxy=files["proxy"] if "proxy" in given else ())
    x = r.exchanges
    full = run(L4).exchanges
    assert (x["proxy_match"] == "l4").all() and len(x) == len(full)
    # the DB's view is the same whichever points were given: server time per statement
    a = full.sort_values(["conn_id", "seq"])["server_s"].to_numpy()
    b = x.sort_values(["conn_id", "seq"])["server_s"].to_numpy()
    tolerance = 2e-4 if "db" in given else 2e-3  # without the DB capture, server_s includes the proxy→DB legs
    assert np.allclose(a, b, atol=tolerance, equal_nan=True)
    if "proxy" not in given:
        assert x["proxy_s"].isna().all()  # the proxy's time cannot be told from the network without its capture
    else:
        assert x["proxy_s"].notna().sum() == x["server_s"].notna().sum()  # every answered exchange


# --- L7: Gaea with a pool smaller than the clients -----------------------------------------------------------------


def test_l7_pool_bottleneck_against_truth():
    r = run(POOL)
    x = r.exchanges
    p = r.summary["proxy"]
    assert p["kind"] == "l7"
    tagged = {int(t["note"][4:]): t for t in truth(POOL) if (t["note"] or "").startswith("tag=")}
    assert len(tagged) == 24 and all(t["exec_s"] for t in tagged.values())
    found = 0
    runs = x["command"].isin(["COM_QUERY", "COM_STMT_EXECUTE"]) & x["app_req_ts"].notna()
    for _, row in x[runs & x["sql"].astype(str).str.contains("AS tag", regex=False)].iterrows():
        if row["command"] == "COM_STMT_EXECUTE":
            tag = int(str(row["params"]).split(",")[0])
            assert row["proxy_match"] == "l7-params"  # Gaea ran the prepared statement as a text query
        else:
            tag = int(str(row["sql"]).split()[1])
            assert row["proxy_match"] == "l7-rewritten"  # Gaea re-wrote the text (`tag`, no space)
        t = tagged[tag]
        found += 1
        assert row["conn_id"] == t["db_conn_id"]  # the pooled server connection that ran it
        assert row["proxy_candidates"] == 1
        assert abs(row["total_s"] - t["client_s"]) < 0.01
        assert abs(row["server_s"] - t["exec_s"]) < 0.01
        # time inside the proxy = what the client waited beyond execution, within the veth's microseconds
        assert abs(row["proxy_s"] - t["proxy_and_network_s"]) < 0.01
    assert found == 24
    waits = x[x["proxy_match"].isin(["l7-rewritten", "l7-params"])]["proxy_wait_s"]
    # 8 clients at once on 2 server connections, 0.15 s each: waits of about 0, 0.15, 0.30 and 0.45 s
    assert waits.max() == pytest.approx(0.45, abs=0.03)
    assert sorted(np.round(waits / 0.15).astype(int).value_counts().to_dict().items()) == [(0, 6), (1, 6), (2, 6), (3, 6)]
    assert "inside the proxy" in p["sentence"] and p["sentence"] in r.summary["verdict"]


def test_l7_identical_statements_are_marked_never_guessed():
    x = run(POOL).exchanges
    ones = x[(x["sql"] == "SELECT 1") & x["capture"].astype(str).str.endswith("app.pcap")]
    amb = ones[ones["proxy_match"] == "ambiguous"]
    assert len(amb) > 0 and (amb["proxy_candidates"] > 1).all()
    assert amb["db_req_ts"].isna().all() and amb["server_s"].isna().all()  # unpaired: no borrowed server time
    # every pair made is consistent in time: the server side inside the client side
    paired = x[x["proxy_match"].isin(["l7-text", "l7-rewritten", "l7-params"])]
    assert (paired["db_req_ts"] >= paired["app_req_ts"]).all()
    assert (paired["db_resp_ts"] <= paired["app_resp_ts"]).all()


def test_l7_proxy_own_and_proxy_handled_statements():
    x = run(POOL).exchanges
    own = x[x["proxy_match"] == "proxy-own"]
    # Gaea's own statements on its pooled connections: never a client's
    assert len(own) and own["sql"].astype(str).str.startswith("SET NAMES 'utf8mb4' COLLATE").all()
    handled = x[x["proxy_match"] == "proxy-handled"]
    assert set(handled["command"].astype(str)) >= {"CONNECT", "COM_STMT_PREPARE"}
    assert handled["server_s"].isna().all()


@pytest.mark.parametrize("points", ["app+db", "proxy", "app+proxy", "proxy+db"])
def test_l7_any_two_points(points):
    files = {"app": [POOL / "app.pcap"], "db": POOL / "db.pcap", "proxy": [POOL / "proxy.pcap"]}
    given = points.split("+")
    r = run(None, app=files["app"] if "app" in given else (),
            db=files["db"] if "db" in given else None, proxy=files["proxy"] if "proxy" in given else ())
    x = r.exchanges
    tagged = x[x["sql"].astype(str).str.contains("AS tag", regex=False) & x["proxy_match"].isin(["l7-rewritten", "l7-params"])]
    assert len(tagged) == 24  # the unique statements pair whichever two points were captured
    if points == "app+db":  # two hosts' clocks: the offset is bounded by the pairs' order
        info = r.summary["proxy"]["clocks"]["app_db"]
        lo, hi = info["offset_bounds_s"]
        assert lo <= 0 <= hi and hi - lo < 0.01  # the lab's namespaces share one clock
        assert tagged["proxy_s"].isna().all()
    else:
        assert tagged["proxy_wait_s"].max() == pytest.approx(0.45, abs=0.03)


# --- without a proxy and degenerate inputs ----------------------------------------------------------------------


def test_no_proxy_leaves_the_columns_null():
    r = run(ROOT / "captures" / "maxthreads")
    assert r.summary["proxy"] is None
    for c in PROXY_COLUMNS:
        assert r.exchanges[c.name].isna().all()
        assert str(r.exchanges[c.name].dtype) == c.dtype


def test_proxy_capture_of_one_side_only(tmp_path):
    """A proxy capture that holds only the client side: nothing to pair across, nothing invented."""
    import dpkt

    out = tmp_path / "front.pcap"
    with open(POOL / "proxy.pcap", "rb") as f, open(out, "wb") as g:
        reader = dpkt.pcap.Reader(f)
        writer = dpkt.pcap.Writer(g, linktype=reader.datalink(), nano=True)
        for ts, buf in reader:
            if b"\x0a\xd5\x4e\x06" not in buf[:40]:  # frames without the DB's address 10.213.78.6
                writer.writepkt(buf, ts)
    r = explain(capture_set(proxy=[out]), jobs=1)
    x = r.exchanges
    assert len(x) and not x["proxy_match"].isin(["l7-text", "l7-rewritten", "l7-params", "l4"]).any()
    assert x["server_s"].isna().all()


def test_capture_set_folder_finds_proxy_captures_and_cli_says_so(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", str(POOL), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "Through an L7 proxy" in done.stdout
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["inputs"]["proxy"] == [str(POOL / "proxy.pcap")]
    bad = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", "--proxy", str(tmp_path / "nope.pcap")],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such file" in bad.stderr
