"""Capture points of several files (tcpdump's own rotation) and several DB servers, on a real lab recording.

The recording (tests/labsets.py, `two-servers`): a primary and a replica, each on its own host and captured
there, the app host captured on both of its links; every tcpdump rotated its file each million bytes (-C 1).
Results must equal those of each point's files merged into one by mergecap; the exchanges must go to the server
truth.jsonl says; the primary's hog must stall the primary only."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from labsets import REPO, two_servers

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.core.errors import InputError, UsageError
from pcapdecomp.read import sources
from pcapdecomp.read.exchanges import extract

pytestmark = pytest.mark.lab
NOT_COMPARED = ("capture", "db_point")  # names of the points, which differ between the two runs by design


@pytest.fixture(scope="module")
def rotated():
    return two_servers()


@pytest.fixture(scope="module")
def runs(rotated, tmp_path_factory):
    """The folder analysed as it is, and each point's files merged by mergecap and given as files."""
    tmp = tmp_path_factory.mktemp("runs")
    folder = analyze(rotated, Options(quiet=True, jobs=1), tmp / "folder")
    merged = {}
    for point, pattern in (("app", "app/app.pcap*"), ("db", "db/db.pcap*"), ("db2", "db-replica/db2.pcap*")):
        files = sorted(rotated.glob(pattern))
        merged[point] = tmp / f"{point}.pcap"
        subprocess.run(["mergecap", "-F", "nsecpcap", "-w", str(merged[point]), *map(str, files)], check=True)
    one = analyze(capture_set(app=[merged["app"]], db=[merged["db"], merged["db2"]],
                              slow_log=[rotated / "db" / "slow.log", rotated / "db-replica" / "slow.log"],
                              long_query_time=0.1, thread_pool_size=2, servers=["10.213.77.2:3306", "10.213.78.2:3306"]),
                  Options(quiet=True, jobs=2), tmp / "merged")
    return folder, one


def _truth(rotated: Path) -> pd.DataFrame:
    return pd.DataFrame([json.loads(line) for line in (rotated / "truth.jsonl").read_text().splitlines()])


def test_tcpdump_rotated_every_point_into_several_files(rotated, runs):
    folder, _ = runs
    for sub, stem in (("app", "app.pcap"), ("db", "db.pcap"), ("db-replica", "db2.pcap")):
        names = sorted(p.name for p in (rotated / sub).iterdir() if p.name.startswith(stem))
        assert len(names) >= 2 and stem in names and f"{stem}1" in names, names
    points = {p["name"]: p for p in folder.summary["points"]}
    assert len(points) == 3
    for p in points.values():
        files = p["files"]
        assert len(files) >= 2
        # frames are numbered through the point: each file's first frame follows the previous file's last
        assert [f["first_frame"] for f in files] == [1 + sum(g["frames"] for g in files[:i]) for i in range(len(files))]
        assert all(0 <= f["gap_s"] < 0.5 for f in files[1:]), files  # rotation leaves no hole between files
        assert p["gaps"] == 0 and p["overlaps"] == 0 and p["missing_numbers"] == []


def test_rotated_points_give_what_the_mergecap_merged_files_give(rotated, runs):
    folder, one = runs
    a, b = folder.exchanges, one.exchanges
    cols = [c for c in a.columns if c not in NOT_COMPARED]
    truth = _truth(rotated)
    assert len(a) >= (truth["role"] == "query").sum() > 3000  # every select the clients sent, a fixed 3600
    pd.testing.assert_frame_equal(a[cols].reset_index(drop=True), b[cols].reset_index(drop=True))
    for key in ("exchanges", "match", "latency_s"):
        assert folder.summary[key] == one.summary[key], key
    clocks_a = [{k: v for k, v in c.items() if k not in ("app", "db")} for c in folder.summary["clocks"].values()]
    clocks_b = [{k: v for k, v in c.items() if k not in ("app", "db")} for c in one.summary["clocks"].values()]
    assert clocks_a == clocks_b
    for got, want in zip(folder.summary["servers"], one.summary["servers"]):
        assert got["story"]["sentence"].replace("db-replica", "X") == want["story"]["sentence"].replace("db2.pcap", "X")


def test_connections_continue_across_files(rotated, runs):
    """Every file after the first begins inside connections (a rotation cuts them); read alone it loses their
    identity, read as one point nothing is mid-stream."""
    folder, _ = runs
    for quality in [*folder.summary["captures"]["app"], *folder.summary["captures"]["dbs"]]:
        assert quality["midstream_connections"] == 0, quality["file"]
    alone = extract(rotated / "db" / "db.pcap1")
    assert alone.quality()["midstream_connections"] >= 3  # the primary's 4 connections were open across the cut
    point = sources.point("db", rotated / "db")
    whole = extract(point)
    assert whole.quality()["midstream_connections"] == 0
    assert len(whole.exchanges) > len(extract(rotated / "db" / "db.pcap").exchanges) + len(alone.exchanges) - 4


def test_each_exchange_goes_to_the_server_truth_names(rotated, runs):
    folder, _ = runs
    truth = _truth(rotated)
    x = folder.exchanges
    names = {"db": str(rotated / "db"), "db2": str(rotated / "db-replica")}
    for server, point in names.items():
        mine = truth[(truth["server"] == server) & (truth["role"] == "query")]
        seen = x[(x["db_point"].astype(str) == point) & x["sql"].astype(str).str.startswith("SELECT id, k, c")]
        assert len(seen) == len(mine) > 1000, server
        assert set(seen["client"].astype(str).str.rsplit(":", n=1).str[1].astype(int)) == set(mine["client_port"])
        assert (seen["seen"].astype(str) == "both").all()
    assert x["db_point"].notna().all()
    # two clocks, each fitted from its own server's segments, both within the lab's few microseconds
    clocks = folder.summary["clocks"]
    assert sorted(c["db"] for c in clocks.values()) == sorted(names.values())
    for c in clocks.values():
        assert c["quality"] == "two-sided" and abs(c["offset_s"]) < 20e-6


def test_each_server_has_its_own_thread_pool_view(rotated, runs):
    """Connection ids repeat across servers (both count from the same start): groups, stalls and hidden-slow
    statements are per server, and match what each server's clients measured. Whether the primary's selects
    queued behind its hog is the recording's own truth (a loaded machine can run the hog before or after them):
    a stall is required where truth.jsonl shows the waits, with the hog among its culprits, and any stall's culprit
    is the hog or a statement that itself held the server 0.1 s or more (on a loaded machine a select can: the CI of
    2026-12-02 afternoon found a stall whose culprit was not the hog; a short statement named a culprit fails)."""
    folder, _ = runs
    truth = _truth(rotated)
    x = folder.exchanges
    servers = {s["point"]: s for s in folder.summary["servers"]}
    assert len(servers) == 2
    primary = servers[str(rotated / "db")]
    stalls = primary["groups"]["stalls"]
    assert all("BENCHMARK" in c["sql"] or c["server_s"] >= 0.1 for s in stalls for c in s["culprits"]), stalls
    replica = servers[str(rotated / "db-replica")]
    assert not any("BENCHMARK" in c["sql"] for s in replica["groups"]["stalls"] for c in s["culprits"])
    # hidden slow = what the clients saw waiting outside execution, at its own server (margins for rounding)
    queries = truth[truth["role"] == "query"].dropna(subset=["exec_s"])
    waited = queries["client_s"] - queries["exec_s"]
    hidden = x[x["hidden_slow"].fillna(False).astype(bool)]
    got = {(p, int(c.rsplit(":", 1)[1])) for p, c in zip(hidden["db_point"].astype(str), hidden["client"].astype(str))}
    point_of = {"db": str(rotated / "db"), "db2": str(rotated / "db-replica")}
    sure = {(point_of[s], port) for s, port in zip(queries["server"][waited >= 0.12], queries["client_port"][waited >= 0.12])}
    maybe = {(point_of[s], port) for s, port in zip(queries["server"][waited >= 0.08], queries["client_port"][waited >= 0.08])}
    assert sure <= got <= maybe
    # a select unlogged (below long_query_time 0.1 s) is certain to have queued its wait minus 0.1 s; a stall needs
    # 0.1 s certain (STALL_MIN_QUEUE_S): truth's waits of 0.25 s at the primary must make one (margin for rounding)
    stalled = queries[(waited >= 0.25) & (queries["server"] == "db")]
    if len(stalled):
        assert stalls and any(p == str(rotated / "db") for p, _ in got)
        assert any("BENCHMARK" in c["sql"] for s in stalls for c in s["culprits"]), stalls
    assert primary["name"] == "db" and replica["name"] == "db-replica"
    assert f"Server db-replica: {replica['story']['sentence']}" in folder.summary["verdict"]


def test_ring_buffer_order_is_time_not_name(rotated, tmp_path):
    """tcpdump -W wraps: a later file can have a lower number. Files are read in the time order of their first
    frames; one converted to pcapng and gzip-compressed is read the same."""
    files = sorted((rotated / "db").glob("db.pcap*"), key=lambda p: sources.first_frame_time(p))
    work = tmp_path / "db"
    work.mkdir()
    for i, f in enumerate(files):  # names in reverse time order: db.pcap<n-1> … db.pcap0
        shutil.copy(f, work / f"db.pcap{len(files) - 1 - i}")
    converted = work / f"db.pcap{len(files) - 1}"
    subprocess.run(["editcap", "-F", "pcapng", str(converted), str(tmp_path / "ng")], check=True)
    converted.unlink()
    with open(tmp_path / "ng", "rb") as src, gzip.open(work / "db.pcap_first.pcapng.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    point = sources.point("db", work)
    assert [os.path.getsize(f) > 0 for f in point.files] and point.files[0].endswith(".pcapng.gz")
    want = extract(sources.point("db", rotated / "db"))
    got = extract(point)
    cols = [c for c in want.exchanges.columns if c != "capture"]
    pd.testing.assert_frame_equal(want.exchanges[cols], got.exchanges[cols])
    assert "pcapng" in got.stats.format and got.stats.gzip


def test_a_missing_file_is_reported(rotated, tmp_path):
    work = tmp_path / "app"
    work.mkdir()
    files = sorted((rotated / "app").glob("app.pcap*"))
    for f in files:
        if f.name != "app.pcap1":
            shutil.copy(f, work / f.name)
    (work / "app.pcap9").write_bytes(b"")  # created, never written: skipped
    r = analyze(capture_set(app=[work], db=[rotated / "db", rotated / "db-replica"], long_query_time=0.1,
                            thread_pool_size=2),
                Options(quiet=True, jobs=1), tmp_path / "out")
    entry = next(p for p in r.summary["points"] if p["kind"] == "app")
    assert 1 in entry["missing_numbers"] and entry["gaps"] == 1
    assert any("gap(s) between its files" in w for w in r.warnings)
    assert any("app.pcap9 skipped (empty file)" in w for w in r.warnings)
    # what the app lost with the file, the DB points saw: repaired from them, its app times bounded, not invented
    assert r.summary["exchanges"]["repaired"] > 100 and r.summary["exchanges"]["bounded"] > 100


def test_two_points_files_mixed_in_one_is_a_mistake(rotated, tmp_path):
    with pytest.raises(UsageError, match="two points"):
        analyze(capture_set(app=[str(rotated / "*" / "*.pcap")]), Options(quiet=True, jobs=1), tmp_path / "o")
    with pytest.raises(UsageError, match="two capture points"):  # one of the app point's files as the DB point
        analyze(capture_set(app=[str(rotated / "db")], db=[str(rotated / "db" / "db.pcap")]), Options(quiet=True),
                tmp_path / "o")
    # the same files whole as both points: one capture read from both sides (tests/test_field.py's "both" runs)
    both = analyze(capture_set(app=[str(rotated / "db")], db=[str(rotated / "db" / "db.pcap*")]),
                   Options(quiet=True, jobs=1), tmp_path / "both")
    assert both.summary["match"]["matched"] > 0


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcapdecomp.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})})


def test_user_mistakes_are_one_line_and_exit_2(rotated, tmp_path):
    cases = [
        (["analyze", "--db", str(tmp_path / "nothing*.pcap")], "matches no file"),
        (["analyze", "--app", str(rotated / "*" / "*.pcap")], "two points"),
        (["analyze", str(rotated / "db" / "db.pcap"), str(rotated / "db" / "db.pcap1")], "quote a glob"),
        (["analyze", "--db", str(rotated / "db"), "--slow-log", "a.log", "--slow-log", "b.log"], "slow logs for 1"),
        (["analyze", "--db", str(tmp_path)], "holds no capture file"),
        (["analyze", str(rotated), "--server", "=10.213.78.2:3306"], "the name before '=' is empty"),
    ]
    for args, message in cases:
        done = _cli(*args, "--out", str(tmp_path / "out"), "-q")
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_rotation_names():
    assert sources.rotation_index("db.pcap") == ("db.pcap", None)
    assert sources.rotation_index("db.pcap12") == ("db.pcap", 12)
    assert sources.rotation_index("db.pcap07.gz") == ("db.pcap.gz", 7)
    assert sources.rotation_index("ring_00012_20260102150405.pcapng") == ("ring.pcapng", 12)
    assert [len(f) for f in sources.families([Path(n) for n in ("app1.pcap", "app2.pcap", "db.pcap", "db.pcap1")])] \
        == [1, 1, 2]
    assert sources._missing_numbers([Path(n) for n in ("db.pcap", "db.pcap2", "db.pcap3")]) == [1]
    with pytest.raises(InputError):
        sources.point("db", "/nonexistent/db.pcap")


def test_docs_print_the_dataset_columns_and_the_help_names_the_options():
    from pcapdecomp.core.schema import DATASET_COLUMNS, markdown_table

    assert markdown_table(DATASET_COLUMNS) in (REPO / "docs" / "scale.md").read_text()
    done = _cli("analyze", "--help", env={"COLUMNS": "200"})
    assert done.returncode == 0
    for option in ("--app", "--db", "--scheduler", "--partitioned", "quoted glob", "same path on every worker"):
        assert option in done.stdout, option


def test_evidence_cuts_frames_from_each_points_files(runs, tmp_path):
    """Evidence reads a point's rotated files as one stream with the point's frame numbers, and a DB row's frames
    from its own server's capture."""
    import dpkt

    from pcapdecomp.render.evidence import export

    folder, _ = runs
    result = export(folder.out_dir, out_dir=tmp_path / "evidence")
    servers = {}
    for path in result.written:
        if path.suffix != ".pcapng":
            continue
        with open(path, "rb") as f:
            addresses = {ip for _, frame in dpkt.pcapng.Reader(f)
                         for ip in (_ip_pair(frame) or ())}
        servers[path.name] = addresses
    assert servers["db.pcapng"] and servers["db.pcapng"] <= {"10.213.77.1", "10.213.77.2"}
    replica = [n for n in servers if "replica" in n]
    if replica:  # the replica's clients waited too (the machine is shared): its frames are its own
        assert servers[replica[0]] <= {"10.213.78.1", "10.213.78.2"}
    assert result.frames and all(n > 0 for n in result.frames.values())


def _ip_pair(frame: bytes):
    import socket

    import dpkt

    ip = dpkt.ethernet.Ethernet(frame).data
    if isinstance(ip, dpkt.ip.IP):
        return socket.inet_ntoa(ip.src), socket.inet_ntoa(ip.dst)
    try:  # the app's `-i any` capture: Linux cooked (SLL2) headers
        ip = dpkt.sll2.SLL2(frame).data
        return socket.inet_ntoa(ip.src), socket.inet_ntoa(ip.dst)
    except Exception:
        return None


def test_server_names_name_the_servers_in_the_verdict(rotated, tmp_path):
    r = analyze(capture_set(rotated, servers=["primary=10.213.77.2:3306", "replica=10.213.78.2:3306"]),
                Options(quiet=True), tmp_path / "named")
    assert [s["name"] for s in r.summary["servers"]] == ["primary", "replica"]
    assert "\n- Server replica: " in r.summary["verdict"]
    assert r.summary["inputs"]["servers"] == ["10.213.77.2:3306", "10.213.78.2:3306"]


def test_two_db_points_of_one_file_name_are_named_apart(tmp_path):
    """Two DB points whose files share a name (group-stall/db.pcap and oltp-hogs/db.pcap, as primary/db.pcap and
    replica/db.pcap would): each named with as many folders as tell it from the other — before, the verdict's
    second server was "Server db.pcap", which names either; the one that paired nothing is told too."""
    captures = REPO / "captures"
    first, second = captures / "group-stall" / "db.pcap", captures / "oltp-hogs" / "db.pcap"
    r = analyze(capture_set(app=[captures / "group-stall" / "app.pcap"], db=[first, second]), Options(quiet=True),
                tmp_path / "out")
    names = [s["name"] for s in r.summary["servers"]]
    assert names == ["group-stall/db.pcap", "oltp-hogs/db.pcap"], names
    assert "\n- Server oltp-hogs/db.pcap: " in r.summary["verdict"]
    # the count line above the second server's bullet is the first server's, and says so, with the total of both
    ex = r.exchanges
    firsts = int((ex["db_point"].astype(object) == str(first)).sum() + ex["db_point"].isna().sum())
    assert 0 < firsts < len(ex)
    assert (f"\n- {firsts} exchanges at server group-stall/db.pcap or at no DB point (" in r.summary["verdict"]
            and f"; {len(ex)} in all, at 2 DB points." in r.summary["verdict"]), r.summary["verdict"]
    assert any(w.startswith(f"DB point {second}: none of its ") for w in r.summary["warnings"]), r.summary["warnings"]
