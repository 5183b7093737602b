"""The connection and network stories (summary.json → connections, network; their verdict bullets and playbook
lines) on the bundled recordings, against what the clients wrote in truth.jsonl: connection-storm (a connection
per statement at ~60/s on one-thread-per-connection with thread_cache_size=0, and pooled connections reset by the
server after wait_timeout=2 s idle, whose next statement failed) and stall-fix-1-pool (a pool of 26 long-lived
connections, no closes by the server)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pandas as pd
import pytest

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.explain import connstory, netstory
from pcapdecomp.read.exchanges import extract

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
STORM, POOL = "connection-storm", "stall-fix-1-pool"


@pytest.fixture(scope="module")
def summaries(bundled_analysis) -> dict[str, dict]:
    return {name: json.loads((bundled_analysis(name).out_dir / "summary.json").read_text()) for name in (STORM, POOL)}


def truth(name: str) -> list[dict]:
    return [json.loads(line) for line in (CAPTURES / name / "truth.jsonl").read_text().splitlines() if line.strip()]


def server(name: str) -> dict:
    return tomllib.loads((CAPTURES / name / "capture.toml").read_text())["server"]


def test_every_connection_and_its_set_up_is_counted(summaries):
    """One new connection per connection the clients opened; each one's SYN → login OK on the wire lies within
    what the client timed around its connect call (matched by the client's port)."""
    rows = truth(STORM)
    labels = {r["conn_label"] for r in rows}
    story = summaries[STORM]["connections"]
    assert story["new"] == story["connections"] == len(labels)
    conns = extract(CAPTURES / STORM / "app.pcap").connections
    by_port = {int(c.rpartition(":")[2]): s for c, s in zip(conns["client"], conns["handshake_s"])}
    connects = [r for r in rows if r["role"] == "connect"]
    assert connects
    for r in connects:
        assert 0 < by_port[r["client_port"]] <= r["client_s"], r
    assert story["setup_sum_s"] == pytest.approx(float(conns["handshake_s"].sum()))
    assert story["setup_sum_s"] <= sum(r["client_s"] for r in connects)
    first = min(r["client_send_ns"] for r in rows)
    last = max(r["client_recv_ns"] for r in rows)
    assert story["new_per_s"] == pytest.approx(len(labels) / ((last - first) / 1e9), rel=0.15)
    # every storm connection ended with the client's COM_QUIT; the pooled ones were closed by the server
    pooled = {r["conn_label"] for r in rows if r["conn_label"].startswith("pooled")}
    assert story["closes"] == {"client_quit": len(labels - pooled), "client_fin_rst": 0, "server": len(pooled),
                               "open": 0}


def test_idle_closes_are_the_wait_timeout_and_the_statements_that_failed(summaries):
    """The server closed exactly the pooled connections whose next statement failed in the client (truth's error),
    each after about wait_timeout (capture.toml) idle: one timer."""
    rows = truth(STORM)
    failed = {r["conn_label"] for r in rows if r["error"]}
    assert failed and all(label.startswith("pooled") for label in failed)
    assert all("gone away" in r["error"] or "Lost connection" in r["error"] for r in rows if r["error"])
    timeout = server(STORM)["wait_timeout"]
    idle = summaries[STORM]["connections"]["idle_closes"]
    assert idle["count"] == len(failed) and idle["steady"]
    assert timeout <= idle["idle_min_s"] <= idle["idle_max_s"] < timeout + 0.5
    story = summaries[STORM]["story"]
    assert "idle_closes" in story["findings"]
    told = next(b["text"] for b in story["bullets"] if "idle" in b["text"] and b["topic"] == "connections")
    assert f"closed {len(failed)} idle connections" in told and "gone away" in told


def test_churn_leads_when_connecting_cost_the_clients_more_than_their_statements(summaries):
    """Which leads follows the clients' own timings: their connect calls against their statements."""
    rows = truth(STORM)
    connecting = sum(r["client_s"] for r in rows if r["role"] == "connect")
    querying = sum(r["client_s"] for r in rows if r["role"] in ("query", "identify") and not r["error"])
    story = summaries[STORM]["story"]
    assert "connection_churn" in story["findings"]
    assert (story["findings"][0] == "connection_churn") == (connecting > querying)
    assert story["sentence"].startswith("Connection churn: 244 new connections")


def test_the_playbook_names_the_settings_and_the_numbers(summaries):
    settings = server(STORM)
    book = {line["finding"]: line for line in summaries[STORM]["playbook"]}
    story = summaries[STORM]["connections"]
    cache = book["thread_cache"]
    assert f"from {settings['thread_cache_size']} (capture.toml)" in cache["text"]
    assert f"{story['new']} new connections" in cache["text"]
    assert cache["sql"].startswith("SET GLOBAL thread_cache_size = ")
    assert int(cache["sql"].split("=")[1].rstrip(";")) >= story["open_max"]
    assert f"wait_timeout = {settings['wait_timeout']} s" in book["wait_timeout"]["text"]


def test_a_pool_of_long_lived_connections_tells_no_churn(summaries):
    rows = truth(POOL)
    story = summaries[POOL]["connections"]
    assert story["new"] == len({r["conn_label"] for r in rows})
    assert story["idle_closes"]["count"] == 0 and not any(r["error"] for r in rows)
    assert story["open_max"] == len({r["conn_label"] for r in rows})
    findings = summaries[POOL]["story"]["findings"]
    assert "connection_churn" not in findings and "idle_closes" not in findings
    assert {line["finding"] for line in summaries[POOL]["playbook"]}.isdisjoint({"thread_cache", "wait_timeout"})


def test_network_time_by_host_adds_up(summaries):
    """The network story's sums are the exchanges' network_s (A4 − A1 − (D4 − D1)) over those seen at both points;
    on a LAN recording network is far from half the clients' time, so it does not lead."""
    net = summaries[POOL]["network"]
    assert net["hosts_total"] == 1 and net["hosts"][0]["host"] == "10.213.77.1"
    assert net["hosts"][0]["network_s"] == pytest.approx(net["network_s"])
    assert net["share"] < netstory.NETWORK_LEADS
    assert "network" not in summaries[POOL]["story"]["findings"]
    assert net["retransmitted_bytes"] == 0 and net["rto_stalls_likely"] == 0


def test_degenerate_inputs():
    empty = pd.DataFrame({c: pd.Series(dtype=object) for c in ("capture", "command", "client")})
    assert connstory.tell(empty, None) is None
    assert connstory.bullets(None) == ([], [])
    assert netstory.tell(empty, None) is None
    assert netstory.bullets(None) == (None, [], [])


SLOW = "network-slow-client"


@pytest.fixture(scope="module")
def slow_path(bundled_analysis) -> dict:
    return json.loads((bundled_analysis(SLOW).out_dir / "summary.json").read_text())


def test_a_slow_path_for_one_client_is_told_by_host(slow_path):
    """One of two clients ran through a relay that holds each leg relay_delay_ms (capture.toml [workload]): every
    exchange of that host has at least twice the delay of network, the other host's much less; the network story
    names that host, and leads the verdict when the clients' own timings say the slow client's time is most of
    theirs."""
    workload = tomllib.loads((CAPTURES / SLOW / "capture.toml").read_text())["workload"]
    delay_s, slow_host = workload["relay_delay_ms"] / 1000, workload["slow_host"]
    net = slow_path["network"]
    hosts = {h["host"]: h for h in net["hosts"]}
    assert set(hosts) == {slow_host, "10.213.78.1"}
    slow, fast = hosts[slow_host], hosts["10.213.78.1"]
    assert slow["network_s"] >= 0.95 * 2 * delay_s * slow["exchanges"]
    assert fast["network_s"] < delay_s * fast["exchanges"]
    assert net["hosts"][0]["host"] == slow_host
    rows = truth(SLOW)
    mine = sum(r["client_s"] for r in rows if r["conn_label"].startswith("slow"))
    assert (slow_path["story"]["findings"][0] == "network") == (mine > 0.5 * sum(r["client_s"] for r in rows))
    assert slow_host in slow_path["story"]["sentence"]
    assert slow_path["story"]["bullets"][0]["topic"] == "db"  # the pool's own sentence follows
    line = next(line for line in slow_path["playbook"] if line["finding"] == "network")
    assert slow_host in line["text"] and line["sql"] is None


REFUSED = "connection-refused"


@pytest.fixture(scope="module")
def refused(bundled_analysis):
    """`analyze captures/connection-refused`: the run's shared analysis (tests/conftest.py), only read here."""
    return bundled_analysis(REFUSED)


def test_refusals_are_counted_once_each_and_not_taken_for_idle_closes(refused):
    """The clients' own errors say how many logins max_connections refused (ERR 1040); the server closed those
    connections at once, which is neither an idle close nor wait_timeout (no statement failed in the clients)."""
    rows = truth(REFUSED)
    connects = [r for r in rows if r["role"] == "connect"]
    turned = [r for r in connects if r["error"] and "1040" in r["error"]]
    assert turned and len(turned) < len(connects)
    story = refused.summary["connections"]
    assert story["refused"] == len(turned)
    assert story["new"] == len(connects) - len(turned)  # handshakes that ended with login OK
    assert story["connections"] == len(connects)
    assert story["closes"]["server"] == len(turned) and story["closes"]["client_quit"] == len(connects) - len(turned)
    assert not any(r["error"] for r in rows if r["role"] != "connect")
    assert story["idle_closes"]["count"] == 0
    limit = server(REFUSED)["max_connections"]
    assert limit <= story["open_max"] <= len(connects)  # the limit was reached, and no more than tried at once
    findings = refused.summary["story"]["findings"]
    assert "idle_closes" not in findings
    # clients turned away lead when no statement waited in the pool: truth has no statement slower than 1 s
    assert max(r["client_s"] for r in rows if r["role"] == "query") < 1.0
    assert findings[0] == "refused"
    assert refused.summary["story"]["sentence"].startswith(f"{len(turned)} connection attempts were refused")
    assert refused.summary["story"]["bullets"][0]["text"].startswith("On the DB: No statement waited")


def test_the_playbook_sets_max_connections_above_the_peak(refused):
    """max_connections from capture.toml against the refusals and the most open at once; unknown, the SQL to fetch
    it."""
    limit = server(REFUSED)["max_connections"]
    story = refused.summary["connections"]
    line = next(line for line in refused.summary["playbook"] if line["finding"] == "max_connections")
    assert f"from {limit} (capture.toml)" in line["text"]
    assert f"{story['refused']} connection attempts were refused" in line["text"]
    assert f"peak of {story['open_max']} connections" in line["text"]
    target = int(line["sql"].removeprefix("SET GLOBAL max_connections = ").rstrip(";"))
    assert target >= story["open_max"] and target >= limit + story["refused"]
    from pcapdecomp.explain.playbook import lines
    unknown = next(line for line in lines(refused.summary, refused.exchanges, None)
                   if line["finding"] == "max_connections")
    assert unknown["sql"] == "SHOW GLOBAL VARIABLES LIKE 'max_connections';"
    assert f"{story['refused']} connection attempts" in unknown["text"]
    assert not [line for line in lines(summaries_without_refusals(refused.summary), refused.exchanges, None)
                if line["finding"] == "max_connections"]


def summaries_without_refusals(summary: dict) -> dict:
    return {**summary, "connections": {**summary["connections"], "refused": 0}}


RETRANSMIT_DELAY_MS = 250.0


@pytest.fixture(scope="module")
def retransmitted(tmp_path_factory):
    """group-stall with one request of a probe on the thread group the BENCHMARK did not hold lost once and
    retransmitted RETRANSMIT_DELAY_MS later (scripts/retransmit.py): what the script changed is the truth."""
    rows = truth("group-stall")
    groups = server("group-stall")["thread_pool_size"]
    hog = next(r for r in rows if r["sql"] and "BENCHMARK" in r["sql"])
    conn_id = next(r["conn_id"] for r in rows if r["conn_id"] is not None and r["sql"] == "SELECT 1"
                   and r["conn_id"] % groups != hog["conn_id"] % groups)
    conns = extract(CAPTURES / "group-stall" / "app.pcap").connections
    assert int(conns["retransmitted_bytes"].sum()) == 0  # the recording itself retransmitted nothing
    port = int(conns.loc[conns["conn_id"] == conn_id, "client"].iloc[0].rpartition(":")[2])
    root = tmp_path_factory.mktemp("retransmit")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "retransmit.py"), str(CAPTURES / "group-stall"),
                           str(root / "set"), "--client-port", str(port), "--nth", "40",
                           "--delay-ms", str(RETRANSMIT_DELAY_MS)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout)
    res = analyze(root / "set", Options(quiet=True), root / "out")
    return made, conn_id, res


def test_a_retransmitted_request_is_counted_and_named_as_a_likely_rto_stall(retransmitted):
    made, conn_id, res = retransmitted
    net = res.summary["network"]
    assert net["retransmitted_bytes"] == made["bytes"] > 0
    assert net["retransmitting_connections"] == 1
    assert net["rto_stalls_likely"] == 1
    stall = net["rto_stalls"][0]
    assert stall["conn_id"] == conn_id and stall["client"] == made["client"]
    assert pd.Timestamp(stall["sent"]).value == made["original_ns"]
    assert stall["network_s"] >= made["delay_ns"] / 1e9
    assert "retransmissions" in res.summary["story"]["findings"]
    told = next(b["text"] for b in res.summary["story"]["bullets"] if b["text"].startswith("TCP retransmitted"))
    assert f"{made['bytes']} bytes on 1 connection" in told and f"connection {conn_id} `" in told


def test_the_thread_pool_is_not_blamed_for_a_retransmission(retransmitted):
    """The delayed exchange's extra time is network: the server's time did not change, so it is no stall's victim,
    not hidden slow, and queues nothing; no bullet but the network's names its connection."""
    made, conn_id, res = retransmitted
    x = res.exchanges
    sent = x["app_req_ts"].map(lambda t: pd.Timestamp(t).value if pd.notna(t) else None)
    row = x[(x["conn_id"] == conn_id) & (sent == made["original_ns"])].iloc[0]
    assert row["network_s"] >= made["delay_ns"] / 1e9
    assert row["server_s"] < 0.05 and row["total_s"] - row["network_s"] == pytest.approx(row["server_s"], abs=1e-6)
    assert pd.isna(row["stall"]) and pd.isna(row["stall_role"]) and not bool(row["hidden_slow"])
    assert (row["queue_s"] if pd.notna(row["queue_s"]) else 0.0) <= row["server_s"]
    for bullet in res.summary["story"]["bullets"]:
        if bullet["topic"] != "network":
            assert f"connection {conn_id} " not in bullet["text"] and f"connection {conn_id})" not in bullet["text"]
    assert res.summary["story"]["findings"][0] != "retransmissions"
    hidden = res.summary["hidden_slow"]
    victims = {v.get("conn_id") for s in hidden["by_stall"] for v in s.get("victims") or []}
    assert hidden["count"] and victims and conn_id not in victims  # the stall's own victims are still told


def _refusals_in_the_corpus() -> list[tuple[str, int]]:
    from corpus import CORPUS, captures
    out = []
    for row in captures():
        codes = dict(part.split("=") for part in row["errors(code=count)"].split(",") if "=" in part)
        if "1040" in codes and (CORPUS / row["path"]).exists():
            out.append((row["path"], int(codes["1040"])))
    return out


@pytest.mark.parametrize("path,count", _refusals_in_the_corpus() or [pytest.param("", 0, marks=pytest.mark.skip(
    reason="no corpus capture with ERR 1040"))])
def test_a_real_servers_refusals_in_the_corpus(path, count, tmp_path):
    """A real server's ERR 1040 packets (the MANIFEST counts them with tshark): counted as refusals, leading the
    verdict, and the playbook asks for max_connections (no settings beside a bare capture)."""
    from corpus import CORPUS
    res = analyze(capture_set(db=CORPUS / path), Options(quiet=True), tmp_path / "out")
    assert res.summary["connections"]["refused"] == count
    assert res.summary["story"]["findings"][0] == "refused"
    line = next(line for line in res.summary["playbook"] if line["finding"] == "max_connections")
    assert line["sql"] == "SHOW GLOBAL VARIABLES LIKE 'max_connections';"
