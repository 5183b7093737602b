"""Connection tracking and MySQL detection (pcapdecomp.read.flows.FlowTracker) on real captures.

The exchanges a capture yields must not depend on how TCP happened to segment, retransmit or reorder it; servers
are found by content on any port, and nothing else is taken for MySQL.
"""

from __future__ import annotations

import random
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from corpus import CORPUS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streams import ACK, SYN, duplicate, lab_segments, merge_runs, reorder, resplit, segments, table, track

from pcapdecomp.read.capture import TcpSegment
from pcapdecomp.read.exchanges import extract
from pcapdecomp.read.flows import FlowTracker

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
LAB = ["features", "group-stall", "maxthreads", "oltp-hogs"]
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TIMING = {"req_first_ts", "req_last_ts", "resp_first_ts", "resp_last_ts", "req_first_frame", "req_last_frame",
          "resp_first_frame", "resp_last_frame"}


def first_payloads(segs: list[TcpSegment]) -> set[int]:
    """Positions of the first payload segment of each side of each connection. Detection reads a segment's content
    (a greeting, the shape of a command): those are the only segments not re-cut below."""
    seen, out = set(), set()
    for i, s in enumerate(segs):
        side = (s.src_ip, s.src_port, s.dst_ip, s.dst_port)
        if s.payload and side not in seen:
            seen.add(side)
            out.add(i)
    return out


_LAB_TABLES: dict[tuple[str, frozenset], list] = {}


def lab_table(name: str, drop: frozenset = frozenset()) -> list:
    """table() of a lab capture's segments tracked as they were recorded, made once per capture and left-out fields
    (each example of a property compares its perturbed copy against it); callers only read it."""
    key = (name, frozenset(drop))
    if key not in _LAB_TABLES:
        _LAB_TABLES[key] = table(track(lab_segments(name))[0], drop)
    return _LAB_TABLES[key]


# ---- the table does not depend on segmentation, retransmission or reordering ----------------------------------------------
@pytest.mark.parametrize("name", ["features", "group-stall"])
@given(seed=st.integers(0, 2**32 - 1))
@SETTINGS
def test_exchanges_do_not_depend_on_segmentation_duplicates_or_order(name, seed):
    rng = random.Random(seed)
    segs = lab_segments(name)
    want = lab_table(name)
    keep = first_payloads(segs)
    perturbed: list[TcpSegment] = []
    for i, seg in enumerate(segs):
        if i not in keep and len(seg.payload) > 1 and rng.random() < 0.4:
            perturbed += resplit(seg, [rng.randrange(1, len(seg.payload)) for _ in range(rng.randrange(1, 4))])
        else:
            perturbed.append(seg)
    perturbed = reorder(perturbed, rng, window=rng.randrange(2, 6), swaps=rng.randrange(0, 200))
    perturbed = duplicate(perturbed, rng, rng.randrange(0, 20))
    rows, tracker, _ = track(perturbed)
    assert table(rows) == want  # every field, timestamps and frames included: the first copy of each byte wins
    assert tracker.other_tcp_frames == 0


@given(seed=st.integers(0, 2**32 - 1))
@settings(max_examples=15, deadline=None)
def test_super_segments_change_only_the_timing(seed):
    """TSO/GRO-merged segments carry the first segment's time, so only timestamps and frames may move."""
    rng = random.Random(seed)
    segs = lab_segments("oltp-hogs")
    servers = {(s.dst_ip, s.dst_port) for s in segs if s.flags & SYN and not s.flags & ACK}
    merged = segs
    for client_side in (False, True):
        srcs = {(s.src_ip, s.src_port) for s in segs if ((s.src_ip, s.src_port) in servers) != client_side}
        for src in srcs:
            merged = merge_runs(merged, src, rng)
    rows = track(merged)[0]
    assert table(rows, TIMING) == lab_table("oltp-hogs", TIMING)


# ---- frame accounting -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", LAB)
def test_every_lab_frame_belongs_to_a_mysql_connection(name):
    """The lab captures only the MySQL port: no frame is 'other TCP', not even the last ACK after both FINs, and
    there is one connection per SYN."""
    result = extract(CAPTURES / name / "db.pcap")
    q = result.quality()
    syns = sum(1 for s in lab_segments(name) if s.flags & SYN and not s.flags & ACK)
    assert q["frames_tcp_other"] == 0 and q["frames_tcp_mysql"] == q["frames_tcp"] == len(lab_segments(name))
    assert list(result.connections["conn_index"]) == list(range(syns))
    assert int(result.connections["frames"].sum()) + _after_close(lab_segments(name)) == len(lab_segments(name))


def _after_close(segs: list[TcpSegment]) -> int:
    """How many segments are the final ACK after the second FIN of their connection (counted as MySQL, not as a
    connection frame): those that come after a FIN from each end of their connection, in capture order."""
    fins: dict[frozenset, set] = {}
    after = 0
    for s in segs:
        seen = fins.setdefault(frozenset({(s.src_ip, s.src_port), (s.dst_ip, s.dst_port)}), set())
        if len(seen) == 2:
            after += 1
        if s.flags & 0x01:
            seen.add((s.src_ip, s.src_port))
    return after


# ---- detection by content ------------------------------------------------------------------------------------------------
def _tshark_streams(path: Path) -> Counter:
    out = subprocess.run(
        ["tshark", "-r", str(path), "-T", "fields", "-e", "tcp.srcport", "-e", "tcp.dstport"],
        capture_output=True, text=True, check=True,
    ).stdout
    return Counter(tuple(sorted(map(int, line.split("\t")))) for line in out.splitlines() if line.strip())


WIRESHARK_LEARNING = CORPUS / "Wireshark-learning" / "mysql.pcap"


def test_a_connection_is_handed_over_only_between_reported_exchanges():
    """MySQLConnection.handover and HalfStream.position (what a reader of its own, the fast lane, may take) on a
    real capture: a connection offers itself only when every exchange it finished has been reported, says how
    many, and where its streams stand; inside an exchange it does not."""
    reported: Counter = Counter()
    tracker = FlowTracker(lambda flow, ex: reported.update([flow.index]), lambda flow: None)
    offered = withheld = 0
    for seg in segments(CAPTURES / "oltp-hogs" / "db.pcap"):
        tracker.segment(seg)
        flow = tracker.connection((seg.src_ip, seg.src_port), (seg.dst_ip, seg.dst_port))
        if flow is None or flow.kind != "mysql":
            continue
        state = flow.mysql.handover()
        if state is None:
            withheld += 1
            continue
        offered += 1
        assert state.count == reported[flow.index] == flow.exchanges
        for half in (flow.to_server, flow.to_client):
            assert half.position in (None, (half.base, half.next))
    assert offered > 1000 and withheld > 1000, (offered, withheld)


@pytest.mark.skipif(not WIRESHARK_LEARNING.exists(), reason="public corpus not found")
def test_https_and_other_background_tcp_is_not_mysql():
    """Wireshark-learning/mysql.pcap: two MySQL connections to :3306 amid TLS on :443, HTTP on :80 and the Azure
    agent on :32526 (seen with `tshark -z conv,tcp`). Only the two MySQL connections are MySQL."""
    rows, tracker, closed = track(segments(WIRESHARK_LEARNING))
    mysql = [f for f in closed if f.kind == "mysql"]
    assert sorted(f.server[1] for f in mysql) == [3306, 3306]
    others = [f for f in closed if f.kind != "mysql"]
    assert {p for f in others for p in (f.a[1], f.b[1])} >= {443, 80, 32526}
    assert all(server[1] == 3306 for _, server, _ in rows)
    # every TCP frame that is not on :3306 is counted as other TCP
    ports = _tshark_streams(WIRESHARK_LEARNING) if _has_tshark() else None
    if ports is not None:
        assert tracker.other_tcp_frames == sum(n for pair, n in ports.items() if 3306 not in pair)


def _has_tshark() -> bool:
    try:
        subprocess.run(["tshark", "-v"], capture_output=True, check=True)
        return True
    except (OSError, subprocess.CalledProcessError):
        return False


ODD_PORTS = [
    ("zeek/mysql-on-port-5432.pcap", 5432),  # a handshake on PostgreSQL's port
    ("tcpdp/mysql8_prepare.pcap", 33308),
    ("deepflow/large-response.pcap", 6033),  # ProxySQL's port, mid-stream (no SYN)
    ("deepflow/binary-in-sql.pcap", 2883),  # OceanBase's port, mid-stream
    ("percona-toolkit-tcpdump-text-converted/tcpdump018.pcap", 12345),  # two servers, mid-stream
    ("packetbeat/mysql_int_string_operations.pcap", 13001),
]


@pytest.mark.parametrize("path,port", ODD_PORTS, ids=[p for p, _ in ODD_PORTS])
def test_mysql_on_odd_ports_is_found_by_content(path, port):
    full = CORPUS / path
    if not full.exists():
        pytest.skip("public corpus not found")
    rows, tracker, closed = track(segments(full))
    mysql = [f for f in closed if f.kind == "mysql"]
    assert mysql and all(f.server[1] in (port, 12347) for f in mysql)
    assert any(f.server[1] == port for f in mysql)
    assert rows, "exchanges were read"


def test_server_restriction_keeps_only_the_named_server():
    """--server: connections to other endpoints are not parsed, even when they are MySQL."""
    path = CORPUS / "percona-toolkit-tcpdump-text-converted" / "tcpdump018.pcap"
    if not path.exists():
        pytest.skip("public corpus not found")
    segs = segments(path)
    both = track(segs)[0]
    servers = {server for _, server, _ in both}
    assert len(servers) == 2
    chosen = sorted(servers)[0]
    only = track(segs, servers={chosen})
    assert only[0] and {server for _, server, _ in only[0]} == {chosen}
    assert table(only[0], {"seq"}) != [] and len(only[0]) == sum(1 for _, s, _ in both if s == chosen)
    assert only[1].other_tcp_frames == sum(1 for s in segs if chosen not in ((s.src_ip, s.src_port), (s.dst_ip, s.dst_port)))
    # a server that is not in the capture at all: nothing is MySQL
    none = track(segs, servers={("192.0.2.1", 3306)})
    assert none[0] == [] and none[1].other_tcp_frames == len(segs)


def test_learned_server_makes_later_connections_mysql_from_their_syn():
    """Once a server endpoint is recognised, a later connection to it is MySQL even before any payload."""
    segs = lab_segments("features")
    rows, tracker, closed = track(segs)
    assert len(tracker.learned_servers) == 2  # the IPv4 and the IPv6 address of the lab server
    assert {ep[1] for ep in tracker.learned_servers} == {3306}
