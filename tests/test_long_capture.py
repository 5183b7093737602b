"""benchmarks/long_capture.py, the synthetic long capture of issue 37: a bundled recording repeated K times must
analyse as K recordings side by side: K× the exchanges, the joined slow-log entries and the hidden-slow
statements, no warning one copy alone does not give, and K× the MySQL packets by tshark's dissector."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysing import analyse
from pcapdecomp.slowlog.reader import parse_slow_log

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
DATA = Path(__file__).resolve().parent / "data"

_spec = importlib.util.spec_from_file_location("long_capture", REPO / "benchmarks" / "long_capture.py")
long_capture = importlib.util.module_from_spec(_spec)
sys.modules["long_capture"] = long_capture  # its dataclasses look their module up
_spec.loader.exec_module(long_capture)

K = 2


def _same_words(warnings: list[str], folder: Path) -> list[str]:
    """The warnings without their numbers and the capture set's path: what they say, not how much."""
    return sorted(re.sub(r"\d[\d,.]*", "#", w.replace(str(folder), "SET")) for w in warnings)


def _mysql_packets(path: Path) -> int:
    out = subprocess.run(["tshark", "-r", str(path), "-Y", "mysql", "-T", "fields", "-e", "frame.number"],
                         capture_output=True, text=True, check=True).stdout
    return len(out.split())


@pytest.mark.parametrize("name, max_block", [("oltp-prepared", None), ("group-stall", None), ("slowlog-forms", None),
                                             ("oltp-prepared", 1)])
def test_k_copies_analyse_as_k_recordings(name, max_block, tmp_path, bundled_analysis):
    """max_block 1: every copy has its own client address (what many copies of many connections come to), in the
    captures and in the slow log's User@Host alike."""
    one = bundled_analysis(name)
    made = long_capture.make_long_capture(CAPTURES / name, tmp_path / "set", copies=K, max_block=max_block)
    assert made.copies == K
    got = analyse(tmp_path / "set", tmp_path / "out")
    s1, sk = one.summary, got.summary
    assert len(got.exchanges) == K * len(one.exchanges)
    for key in ("total", "seen_both", "seen_app", "seen_db", "hidden_slow", "in_slow_log", "server_flag_slow"):
        assert sk["exchanges"][key] == K * s1["exchanges"][key], key
    assert sk["slow_log"]["entries"] == K * s1["slow_log"]["entries"]
    assert sk["slow_log"]["matched"] == K * s1["slow_log"]["matched"]
    assert sk["hidden_slow"]["count"] == K * s1["hidden_slow"]["count"]
    assert sk["match"]["connections_matched"] == K * s1["match"]["connections_matched"]
    assert sk["match"]["connections_vetoed"] == s1["match"]["connections_vetoed"]  # no copy mistaken for another
    assert sk["clock"]["quality"] == s1["clock"]["quality"]
    assert _same_words(sk["warnings"], tmp_path / "set") == _same_words(s1["warnings"], CAPTURES / name)
    # each copy's connections keep their thread group: conn_id mod thread_pool_size is the recording's
    ids1 = one.exchanges["conn_id"].dropna().astype("int64")
    idsk = got.exchanges["conn_id"].dropna().astype("int64")
    assert set(idsk) == {i + k * made.id_step for i in set(ids1) for k in range(K)}
    assert made.id_step % 720720 == 0


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
@pytest.mark.parametrize("name", ["oltp-prepared", "group-stall"])
def test_tshark_sees_k_times_the_mysql_packets(name, tmp_path):
    long_capture.make_long_capture(CAPTURES / name, tmp_path / "set", copies=K)
    for point in ("app", "db"):
        assert _mysql_packets(tmp_path / "set" / f"{point}.pcap") == K * _mysql_packets(CAPTURES / name / f"{point}.pcap")


@pytest.mark.parametrize("log", [CAPTURES / "slowlog-forms" / "slow.log", *sorted((DATA / "slowlog").glob("*.log"))],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_slow_log_moves_with_the_capture(log, tmp_path):
    """Every entry of copy k is the recording's, k × shift later (each of its times) and k × step on in thread id,
    as the slow-log reader reads them."""
    shift, step, copies = 37, 720720, 3
    long_capture.write_slow_log(log, tmp_path / "slow.log", copies, shift, step)
    first, _ = parse_slow_log(log.read_text(encoding="utf-8", errors="surrogateescape"))
    got, stats = parse_slow_log((tmp_path / "slow.log").read_text(encoding="utf-8", errors="surrogateescape"))
    assert len(first) > 0 and len(got) == copies * len(first)
    n = len(first)
    for k in range(copies):
        for e, c in zip(first, got[k * n:(k + 1) * n]):
            assert c.sql == e.sql
            assert c.thread_id == (None if e.thread_id is None else e.thread_id + k * step)
            assert c.time_ns == (None if e.time_ns is None else e.time_ns + k * shift * 10**9)
            assert c.timestamp_s == (None if e.timestamp_s is None else e.timestamp_s + k * shift)
            for when in ("start_ns", "end_ns"):
                t0 = getattr(e, when)
                assert getattr(c, when) == (None if t0 is None else t0 + k * shift * 10**9)
            assert c.query_time_ns == e.query_time_ns


@pytest.mark.parametrize("clients", [set(range(60822, 60960, 2)), {1025, 5000, 33000, 60999, 65535},
                                     set(range(32768, 61000, 97))])
def test_copies_ports_never_meet(clients):
    """Within a block, copy k's client ports are the recording's moved by k·d: no two copies share a port and none
    lands on the server's; blocks past the first are told apart by the client address."""
    servers, copies = {3306, 33060}, 40
    d, block, low, span = long_capture.port_step(clients, servers, copies)
    assert block >= 2
    seen: set[int] = set()
    for k in range(min(block, copies)):
        moved = {low + (p - low + k * d) % span for p in clients}
        assert len(moved) == len(clients) and not moved & seen and not moved & servers
        assert all(1 <= p <= 65535 for p in moved)
        seen |= moved


def test_a_run_can_be_recorded(tmp_path):
    """`--record` of long_capture.py (and dask_scaling.py) names no tree: the record is headed with this repository's
    commit (record_file's trees became a required argument once and both benchmarks failed at their start)."""
    bench = long_capture._bench()
    path = bench.record_file(tmp_path / "runs")
    head = path.read_text(encoding="utf-8")
    assert path.parent == tmp_path / "runs" and path.name.endswith(f"-{bench.commit(REPO)}.md")
    assert f"the pcapdecomp of {REPO} at commit {bench.commit(REPO)}" in head
