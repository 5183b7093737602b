"""The lab: a real recording of `maxthreads`, and the committed capture sets' ground truth.

The recording test needs root and `ip netns`; where it cannot run it skips naming the reason, except in CI
(CI=true), where a skip would hide a broken lab, so it fails instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from pathlib import Path

import dpkt
import pytest

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "captures" / "lab"
sys.path.insert(0, str(LAB))

import rawclient  # noqa: E402
import record as lab_record  # noqa: E402

FIELD = ("field-default-stall", "field-default-stall-lqt-10", "field-pool-before-capture")
COMMITTED = ("maxthreads", "group-stall", "oltp-hogs", "features", "oltp-prepared", "stall-fix-1-pool",
             "stall-fix-2-thread-per-connection", "stall-fix-3-stall-limit-10", "group-stall-tls13", "group-stall-tls12", "oltp-prepared-tls13",
             "oltp-prepared-tls12",
             "connection-refused",
             *FIELD)


from labsets import lab_unavailable_reason as _lab_unavailable_reason  # noqa: E402


def _slow_log_entries(text: str) -> list[tuple[int, float, str]]:
    """(Thread_id, Query_time, statement) per entry of a MariaDB file slow log."""
    entries = []
    for block in re.split(r"^# User@Host: ", text, flags=re.M)[1:]:
        thread = int(re.search(r"# Thread_id: (\d+)", block).group(1))
        seconds = float(re.search(r"# Query_time: ([\d.]+)", block).group(1))
        statement = [line for line in block.splitlines() if line and not line.startswith(("#", "SET timestamp",
                                                                                         "use "))][-1]
        entries.append((thread, seconds, statement))
    return entries


def _pcap_payloads(path: Path) -> tuple[int, bytes]:
    """(packet count, all TCP payload bytes concatenated) — enough to count statements on the wire."""
    packets, payload = 0, bytearray()
    with open(path, "rb") as f:
        for _, frame in dpkt.pcap.Reader(f):
            packets += 1
            ip = dpkt.ethernet.Ethernet(frame).data
            if isinstance(ip, (dpkt.ip.IP, dpkt.ip6.IP6)) and isinstance(ip.data, dpkt.tcp.TCP):
                payload += ip.data.data
    return packets, bytes(payload)


def _read_set(folder: Path) -> tuple[dict, list[dict], str]:
    meta = tomllib.loads((folder / "capture.toml").read_text())
    truth = [json.loads(line) for line in (folder / "truth.jsonl").read_text().splitlines()]
    return meta, truth, (folder / "slow.log").read_text()


def _assert_maxthreads_truth(folder: Path) -> None:
    meta, truth, slow = _read_set(folder)
    assert meta["server"]["thread_pool_size"] == 1 and meta["server"]["thread_pool_max_threads"] == 6
    sleeps = [r for r in truth if r["sql"] == "SELECT SLEEP(2)"]
    assert len(sleeps) == 8 and len({r["conn_id"] for r in sleeps}) == 8
    client = sorted(r["client_s"] for r in sleeps)
    # six get a worker thread at once; two wait in the pool queue for one of them to finish
    assert all(1.9 <= s <= 2.6 for s in client[:6]), client
    assert all(3.8 <= s <= 4.8 for s in client[6:]), client
    assert all(1.9 <= r["exec_s"] <= 2.6 for r in sleeps), [r["exec_s"] for r in sleeps]
    entries = [e for e in _slow_log_entries(slow) if e[2] == "SELECT SLEEP(2);"]
    assert len(entries) == 8
    assert {e[0] for e in entries} == {r["conn_id"] for r in sleeps}  # slow-log Thread_id is the conn id
    assert all(1.9 <= e[1] <= 2.6 for e in entries)  # queue time is invisible to the slow log
    for pcap in ("app.pcap", "db.pcap"):
        packets, payload = _pcap_payloads(folder / pcap)
        assert packets > 0
        assert payload.count(b"\x03SELECT SLEEP(2)") == 8  # COM_QUERY byte + text, once per query


@pytest.mark.lab
def test_maxthreads_recording_shows_queue_time_the_slow_log_misses(tmp_path):
    reason = _lab_unavailable_reason()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the lab must run in CI but cannot: {reason}")
        pytest.skip(reason)
    out = lab_record.record("maxthreads", tmp_path / "maxthreads")
    _assert_maxthreads_truth(out)
    if shutil.which("tshark"):
        counted = subprocess.run(["tshark", "-r", str(out / "db.pcap"), "-Y",
                                  'mysql.command == 3 && mysql.query == "SELECT SLEEP(2)"'],
                                 capture_output=True, text=True)
        assert len(counted.stdout.splitlines()) == 8
    # nothing left behind: namespaces of this process, its tcpdumps and its server
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"pcd-{os.getpid()}-" not in namespaces
    assert subprocess.run(["pgrep", "-f", f"netns exec pcd-{os.getpid()}-"], capture_output=True).returncode == 1


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_set_is_well_formed(name):
    folder = REPO / "captures" / name
    meta, truth, slow = _read_set(folder)
    assert meta["scenario"] == name and meta["server"]["address"] == "10.213.77.2:3306"
    assert meta["captures"]["dropped_by_kernel"] == 0
    for row in truth:
        assert set(lab_record.TRUTH_KEYS) <= row.keys()
        assert row["client_recv_ns"] >= row["client_send_ns"] > 0 and isinstance(row["client_send_ns"], int)
    for pcap, key in (("app.pcap", "app_packets"), ("db.pcap", "db_packets")):
        packets, _ = _pcap_payloads(folder / pcap)
        assert packets == meta["captures"][key]
    joined = [r for r in truth if r["role"] in ("query", "identify")]
    assert sum(r["exec_s"] is not None for r in joined) == len(joined)  # every statement found its server time


def test_committed_maxthreads_truth():
    _assert_maxthreads_truth(REPO / "captures" / "maxthreads")


def test_committed_group_stall_truth():
    meta, truth, slow = _read_set(REPO / "captures" / "group-stall")
    hog = next(r for r in truth if r["sql"].startswith("SELECT BENCHMARK"))
    probes = [r for r in truth if r["sql"] == "SELECT 1"]
    assert {r["thread_group"] for r in probes} == {0, 1}
    held = [r for r in probes if r["thread_group"] == hog["thread_group"]]
    other = [r for r in probes if r["thread_group"] != hog["thread_group"]]
    waited = [r for r in held if r["client_s"] > 1.0]
    assert waited and all(r["exec_s"] < 0.01 for r in waited)  # waiting, not executing
    assert max(r["client_s"] for r in other) < 0.1
    # only the hog is slow in the server's eyes
    assert [e[0] for e in _slow_log_entries(slow)] == [hog["conn_id"]]


@pytest.mark.parametrize("name", FIELD)
def test_committed_field_set_truth(name):
    """What each field set's README says, from its own truth: the pool's settings only in lab-settings.toml, the
    lookups that arrived on a group while its BENCHMARK ran waited 0.1–1 s while executing in milliseconds, each
    connection once, and the slow log holds exactly the statements that executed ≥ long_query_time."""
    folder = REPO / "captures" / name
    meta, truth, slow = _read_set(folder)
    lab = tomllib.loads((folder / "lab-settings.toml").read_text())
    assert not any(k.startswith("thread_pool") for k in meta["server"])  # the field has none at hand
    assert not {"pool_size", "hogs"} & meta["workload"].keys()
    assert lab["server"]["thread_pool_size"] == 3 and lab["server"]["thread_pool_stall_limit"] == 500
    assert lab["server"]["thread_pool_oversubscribe"] == 3
    assert all(r["thread_group"] == r["conn_id"] % 3 for r in truth)
    hogs = [r for r in truth if r["role"] == "hog"]
    lookups = [r for r in truth if r["role"] == "query"]
    assert sorted(r["thread_group"] for r in hogs) == [0, 1, 2] and all(r["exec_s"] > 0.9 for r in hogs)
    waited = [r for r in lookups if r["client_s"] - r["exec_s"] > 0.1]
    assert all(0.1 < r["client_s"] - r["exec_s"] < 1.0 and r["exec_s"] < 0.01 for r in waited)
    assert len(waited) == len({r["conn_id"] for r in waited}) == len({r["conn_id"] for r in lookups})
    for hog in hogs:  # each waited on its own group, while that group's BENCHMARK ran
        mine = [r for r in waited if r["thread_group"] == hog["thread_group"]]
        assert mine and all(hog["client_send_ns"] < r["client_send_ns"] < hog["client_recv_ns"] for r in mine)
    assert all(r["client_s"] < 0.05 for r in lookups if r not in waited)
    lqt = meta["server"]["long_query_time"]
    logged = sorted(e[0] for e in _slow_log_entries(slow))
    assert logged == sorted(r["conn_id"] for r in truth if r["exec_s"] is not None and r["exec_s"] >= lqt)
    assert bool(logged) == (lqt == 1.0)
    if name == "field-pool-before-capture":
        _, payload = _pcap_payloads(folder / "app.pcap")
        assert b"SELECT CONNECTION_ID()" in payload and b"performance_schema.threads" not in payload  # no greeting


def test_committed_pool_before_capture_processlist():
    """The snapshot is what `mysql -B` prints: a header, then one tab-separated row per connection, HOST ip:port
    naming each app connection by its client port (truth's client_port)."""
    folder = REPO / "captures" / "field-pool-before-capture"
    lines = (folder / "processlist.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["ID", "USER", "HOST", "DB", "COMMAND", "TIME", "STATE", "INFO"]
    rows = [line.split("\t") for line in lines[1:]]
    _, truth, _ = _read_set(folder)
    port_of = {r["conn_id"]: r["client_port"] for r in truth}
    app = {int(r[0]): r[2] for r in rows if r[2].startswith("10.213.77.1:")}
    assert app == {conn_id: f"10.213.77.1:{port}" for conn_id, port in port_of.items()}


def test_committed_features_cover_the_protocol():
    _, truth, _ = _read_set(REPO / "captures" / "features")
    commands = {r["command"] for r in truth}
    assert {"COM_STMT_FETCH", "COM_STMT_SEND_LONG_DATA", "COM_RESET_CONNECTION", "COM_CHANGE_USER", "COM_PING",
            "COM_INIT_DB", "COM_STATISTICS", "COM_STMT_RESET"} <= commands
    fetches = [r for r in truth if r["command"] == "COM_STMT_FETCH"]
    assert [r["rows"] for r in fetches] == [5, 5, 2]  # 12 rows through a cursor, 5 at a time
    by_label = {r["conn_label"]: r for r in truth if r["role"] == "query"}
    assert by_label["multi-statement"]["ps_statements"] == 3
    assert by_label["error"]["error"].startswith("1064")
    _, payload = _pcap_payloads(REPO / "captures" / "features" / "app.pcap")
    assert b"over IPv6" in payload and b"LOAD DATA LOCAL INFILE" in payload
    assert b"secret over TLS" not in payload and b"compressible compressible" not in payload  # TLS, zlib


def test_native_password_scramble_matches_pymysql():
    from pymysql import _auth

    salt = bytes(range(1, 21))
    assert rawclient.native_password_scramble("app-pass", salt) == _auth.scramble_native_password(b"app-pass", salt)


def test_record_refuses_unknown_scenario():
    with pytest.raises(lab_record.LabError, match="unknown scenario"):
        lab_record.record("no-such-scenario")


@pytest.mark.parametrize("argv", [["group-stall", "--rate", "100"], ["sysbench", "--rate", "0"]])
def test_record_rate_is_for_sysbench_and_positive(argv, capsys):
    # --rate is sysbench's --rate: another scenario has no transactions to pace, and 0 would mean full speed
    with pytest.raises(SystemExit) as ended:
        lab_record.main([*argv, "--no-install"])
    assert ended.value.code == 2 and "--rate" in capsys.readouterr().err


from labsets import require_lab as _require_lab  # noqa: E402


@pytest.mark.lab
def test_bigpacket_recording_parses_a_17_mib_row(tmp_path):
    """A real 17 MiB result row: the server splits it into a 16 MiB − 1 packet and its continuation. The parser
    must count one row, read the whole response, and keep memory small (only a prefix of each payload is kept)."""
    _require_lab()
    from pcapdecomp.read.exchanges import extract

    out = lab_record.record("bigpacket", tmp_path / "bigpacket", install=False)
    for side in ("app", "db"):
        ex = extract(out / f"{side}.pcap").exchanges
        big = ex[ex["sql"].str.contains("REPEAT", regex=False, na=False).astype(bool)]
        assert len(big) == 1, side
        row = big.iloc[0]
        assert row["result"] == "resultset" and row["rows"] == 1 and row["problems"] == ""
        assert row["bytes_resp"] > 17 * 1024 * 1024
        truth = [json.loads(line) for line in (out / "truth.jsonl").read_text().splitlines()]
        client = [t for t in truth if "REPEAT" in (t.get("sql") or "")]
        assert len(client) == 1
        # the wire time of the exchange fits inside what the client measured around the same call
        assert 0 < row["response_s"] <= client[0]["client_s"] + 0.002
