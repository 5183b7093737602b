"""dpkt as an independent reference reader: every bundled capture, read by dpkt and by pcapdecomp's own reader,
gives the same TCP segments per connection direction (frame numbers, integer-ns times, sequence numbers, flags and
payload bytes).

The package reads captures with its own code (read/capture.py says why: dpkt's timestamps are floats or Decimals and
its pcapng reader applies the first interface's settings to every packet); dpkt stays as the second opinion. Its
nanosecond pcap timestamps are Decimals, so they convert to integer ns exactly.
"""

from __future__ import annotations

import socket
from collections import defaultdict
from pathlib import Path

import dpkt
import pytest

from pcapdecomp.read.capture import open_capture

REPO = Path(__file__).resolve().parents[1]
BUNDLED = sorted(REPO.glob("captures/*/*.pcap"))


def _address(raw: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET6 if len(raw) == 16 else socket.AF_INET, raw)


def _by_direction_dpkt(path: Path) -> tuple[int, dict]:
    """(frames, {(src ip, src port, dst ip, dst port): (segments as (frame, ts_ns, seq, ack, flags), payload)})."""
    out: dict = defaultdict(lambda: ([], bytearray()))
    frames = 0
    with open(path, "rb") as f:
        reader = dpkt.pcap.Reader(f)
        link = {dpkt.pcap.DLT_EN10MB: dpkt.ethernet.Ethernet, dpkt.pcap.DLT_LINUX_SLL2: dpkt.sll2.SLL2}[
            reader.datalink()]
        for frame, (ts, data) in enumerate(reader, start=1):
            frames += 1
            ip = link(data).data
            if not isinstance(ip, (dpkt.ip.IP, dpkt.ip6.IP6)) or not isinstance(ip.data, dpkt.tcp.TCP):
                continue
            tcp = ip.data
            segments, payload = out[(_address(ip.src), tcp.sport, _address(ip.dst), tcp.dport)]
            segments.append((frame, int(ts * 10**9), tcp.seq, tcp.ack, tcp.flags))
            payload += tcp.data
    return frames, {key: (segments, bytes(payload)) for key, (segments, payload) in out.items()}


def _by_direction_ours(path: Path) -> tuple[int, dict]:
    out: dict = defaultdict(lambda: ([], bytearray()))
    with open_capture(path) as reader:
        for seg in reader:
            segments, payload = out[(seg.src_ip, seg.src_port, seg.dst_ip, seg.dst_port)]
            segments.append((seg.frame, seg.ts_ns, seg.seq, seg.ack, seg.flags))
            payload += seg.payload
            assert seg.missing == 0  # the bundled captures keep whole packets
    return reader.stats.frames, {key: (segments, bytes(payload)) for key, (segments, payload) in out.items()}


def test_bundled_captures_are_found():
    assert len(BUNDLED) >= 20 and {p.name for p in BUNDLED} == {"app.pcap", "db.pcap", "proxy.pcap"}


@pytest.mark.parametrize("path", BUNDLED, ids=[f"{p.parent.name}/{p.name}" for p in BUNDLED])
def test_same_segments_as_dpkt(path):
    frames_ref, ref = _by_direction_dpkt(path)
    frames, ours = _by_direction_ours(path)
    assert frames == frames_ref
    assert ours.keys() == ref.keys() and ref
    for key in ref:
        assert len(ours[key][0]) == len(ref[key][0]), key
        assert ours[key][0] == ref[key][0], key
        assert ours[key][1] == ref[key][1], (key, len(ours[key][1]), len(ref[key][1]))
