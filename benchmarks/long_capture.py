#!/usr/bin/env python3
"""A synthetic long capture pair: a recorded capture set (app.pcap, db.pcap, its slow log) repeated K times.

    python3 benchmarks/long_capture.py /tmp/pcapdecomp-bench/sysbench-rw-10s --gb 10 --out /tmp/long-10g
    python3 benchmarks/long_capture.py captures/oltp-prepared --copies 3 --out /tmp/long-k3
    python3 benchmarks/long_capture.py SET --gb 1,2,4 --run --out /tmp/long   # build each size, run pcapdecomp on it
                                                                            # (time and peak memory), delete it

Copy k (0 … K-1) of the recording is the recording with
- every timestamp moved by k × shift, shift = the recording's span (first to last packet of both points) plus a gap,
  rounded up to whole seconds, so that the pcap records change in their seconds field only and the slow log's
  whole-second times (`# Time:`, `SET timestamp=`) move exactly as the packets do;
- every client port mapped to a port no other copy uses (a new 4-tuple per copy: the copies' connections stay
  distinct). The mapping adds k × d to the port within 1024–65535 (1–65535 when some client port is lower), d
  chosen so that no two copies' ports meet and none lands on a server port; when no d serves all copies, copies are
  taken in blocks of the largest number that one d serves, and block b also moves the client address (IPv4: its
  second byte + b; IPv6: its ninth byte + b);
- every connection id moved by k × ID_STEP, in the server's greeting (where the analysis learns it) and in the slow
  log's `Thread_id:` / `Id:` alike, so that the join by thread id finds each copy's entries on that copy's
  connections. ID_STEP is a multiple of 720720 (= lcm(1..16)) and of capture.toml's thread_pool_size, so that
  conn_id mod thread_pool_size (the thread group) stays what it was for any pool of up to 16 groups.
The TCP checksums (and IPv4 header checksums) are updated for what changed (RFC 1624), so a checksum that was right
stays right. TCP sequence numbers stay. capture.toml is copied with its packet counts multiplied by K.

The output is written streaming, copy by copy and record range by record range (the source is mapped, never read
whole; each copy is patched in chunks of about 64 MB): the run is bound by the disk. Classic pcap only (what the
lab and tcpdump write); link types Ethernet (with VLAN tags), Linux cooked (SLL, SLL2), raw IP and BSD loopback.

`--run` (item 4 of issue 37): for each size, build the pair, run `exchanges` on the DB capture and
`analyze --jobs 1` on the pair (with the slow log) under a memory cap (`prlimit --as`, --cap-gb) and with the
memory bound --memory (default: the cap), print wall time, CPU time and peak memory (PSS of the process and its
workers, sampled every 50 ms) and the bound, then delete the pair. `--spill DIR`: analyze partitioned
(`analyze --spill DIR`) instead of in memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import mmap
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ID_STEP_BASE = 720720  # lcm(1..16): conn_id mod N unchanged for every thread_pool_size N of 1..16
CHUNK_BYTES = 64 << 20
PCAP_MAGICS = {  # magic as read little-endian -> (byte order of the file, nanosecond timestamps)
    0xA1B2C3D4: ("<", False), 0xA1B23C4D: ("<", True),
    0xD4C3B2A1: (">", False), 0x4D3CB2A1: (">", True),
}
PORT_LOW = 1024


class LongCaptureError(Exception):
    """The source cannot be repeated (not classic pcap, an unknown link type, ids or times that would overflow)."""


@dataclasses.dataclass
class Source:
    """One capture file, indexed: where each record and each field a copy changes lies."""

    path: Path
    mm: mmap.mmap  # the file, mapped (kept open while the copies are written)
    header: bytes
    order: str  # '<' or '>': byte order of the record headers
    rec_off: np.ndarray  # byte offset of every record header
    first_ns: int
    last_ns: int
    # TCP records with their client port captured
    port_off: np.ndarray  # offset of the client's port field
    port: np.ndarray  # the client's port
    tcp_ck_off: np.ndarray  # offset of the TCP checksum field, -1 when not captured
    addr_byte_off: np.ndarray  # offset of the client address's byte that a block changes
    addr_word_even: np.ndarray  # that byte is the high byte of its 16-bit word
    ip_ck_off: np.ndarray  # IPv4 header checksum field, -1 for IPv6 (no header checksum)
    port_rec: np.ndarray  # index of the record each of these rows is in
    seq_off: np.ndarray  # offset of the sequence number, -1 when not captured
    ack_set: np.ndarray  # the ACK flag is set: the acknowledgment number is moved too
    # SACK blocks: (record index, TCP checksum offset, offsets of the 4-byte edges relative to the TCP header's, TCP
    # header offset)
    sacks: list[tuple[int, int, list[int], int]]
    # greetings: (record index, offset of the 4-byte connection id, offset of the TCP header, TCP checksum offset)
    greetings: list[tuple[int, int, int, int]]
    greeting_ids: list[int]


@dataclasses.dataclass
class LongCapture:
    """What make_long_capture wrote and how the copies differ."""

    out: Path
    copies: int
    shift_s: int  # copy k is moved by k * shift_s seconds
    id_step: int  # copy k's connection ids are moved by k * id_step
    port_step: int  # copy k's client ports (within its block) are moved by (k mod block) * port_step
    block: int  # copies per client address
    bytes_per_point: dict[str, int]
    seconds: float  # wall time of the writing


def _u16be(a: np.ndarray, off: np.ndarray) -> np.ndarray:
    return (a[off].astype(np.int64) << 8) | a[off + 1]


def _u32be(a: np.ndarray, off: np.ndarray) -> np.ndarray:
    return (_u16be(a, off) << 16) | _u16be(a, off + 2)


def _put16be(a: np.ndarray, off: np.ndarray, v: np.ndarray) -> None:
    a[off] = v >> 8
    a[off + 1] = v & 0xFF


def doff_of(a: np.ndarray, tcp: np.ndarray, has_flags: np.ndarray) -> np.ndarray:
    """The TCP header's length (data offset × 4) where its byte is captured, else 20."""
    out = np.full(len(tcp), 20, np.int64)
    out[has_flags] = (a[tcp[has_flags] + 12] >> 4).astype(np.int64) * 4
    return out


def index_capture(path: Path, server_ports: set[int]) -> tuple[Source, set[int], set[int]]:
    """The records of `path` and, for its TCP records, the client side's fields; also the ports seen as servers
    (destination of a SYN, source of a SYN-ACK) and the client ports. `server_ports`: ports taken as servers
    whether or not a handshake shows them."""
    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # empty file
            raise LongCaptureError(f"{path}: empty") from exc
    if len(mm) < 24 or struct.unpack_from("<I", mm, 0)[0] not in PCAP_MAGICS:
        raise LongCaptureError(f"{path}: not a classic pcap file (pcapng: convert with editcap -F pcap)")
    order, _ = PCAP_MAGICS[struct.unpack_from("<I", mm, 0)[0]]
    linktype = struct.unpack_from(order + "I", mm, 20)[0] & 0x0FFFFFFF
    rec = struct.Struct(order + "IIII")
    offsets = []
    pos, end = 24, len(mm)
    unpack = rec.unpack_from
    append = offsets.append
    while pos + 16 <= end:
        caplen = unpack(mm, pos)[2]
        if pos + 16 + caplen > end:
            break  # a record cut by the end of the file: left out
        append(pos)
        pos += 16 + caplen
    a = np.frombuffer(mm, dtype=np.uint8)
    off = np.asarray(offsets, dtype=np.int64)
    dt4 = np.dtype(order + "u4")

    def u32(o: np.ndarray) -> np.ndarray:
        b = np.stack([a[o + i] for i in range(4)], axis=1).copy()
        return b.view(dt4).ravel().astype(np.int64)

    sec, frac = u32(off), u32(off + 4)
    _, nano = PCAP_MAGICS[struct.unpack_from("<I", mm, 0)[0]]
    ts = sec * 1_000_000_000 + frac * (1 if nano else 1000)
    caplen = u32(off + 8)
    data = off + 16
    stop = data + caplen
    # network layer: offset and protocol version (4, 6 or 0 = not IP)
    if linktype == 1:  # Ethernet, up to two VLAN tags
        l3, etype = data + 14, np.zeros(len(off), np.int64)
        ok = caplen >= 14
        etype[ok] = _u16be(a, data[ok] + 12)
        for _ in range(2):
            tagged = ok & np.isin(etype, (0x8100, 0x88A8)) & (l3 + 4 <= stop)
            etype[tagged] = _u16be(a, l3[tagged] - 2 + 4)
            l3 = np.where(tagged, l3 + 4, l3)
        ver = np.select([etype == 0x0800, etype == 0x86DD], [4, 6], 0)
    elif linktype == 113:  # Linux cooked
        l3 = data + 16
        ok = caplen >= 16
        etype = np.zeros(len(off), np.int64)
        etype[ok] = _u16be(a, data[ok] + 14)
        ver = np.select([etype == 0x0800, etype == 0x86DD], [4, 6], 0)
    elif linktype == 276:  # Linux cooked v2
        l3 = data + 20
        ok = caplen >= 20
        etype = np.zeros(len(off), np.int64)
        etype[ok] = _u16be(a, data[ok])
        ver = np.select([etype == 0x0800, etype == 0x86DD], [4, 6], 0)
    elif linktype in (101, 12, 14, 228, 229, 0, 108):  # raw IP; BSD loopback (4-byte family)
        l3 = data + (4 if linktype in (0, 108) else 0)
        ok = l3 < stop
        ver = np.zeros(len(off), np.int64)
        ver[ok] = a[l3[ok]] >> 4
    else:
        raise LongCaptureError(f"{path}: link type {linktype} is not supported here")
    ver = np.where(l3 + 20 <= stop, ver, 0)
    v4, v6 = ver == 4, (ver == 6) & (l3 + 40 <= stop)
    tcp = np.full(len(off), -1, np.int64)
    ip_ck = np.full(len(off), -1, np.int64)
    src_a = np.full(len(off), -1, np.int64)
    dst_a = np.full(len(off), -1, np.int64)
    plen = np.zeros(len(off), np.int64)  # TCP segment length (header + payload) by the IP header
    i4 = np.flatnonzero(v4)
    ihl4 = (a[l3[i4]] & 0x0F).astype(np.int64) * 4
    first_frag = (_u16be(a, l3[i4] + 6) & 0x1FFF) == 0
    is_tcp4 = (a[l3[i4] + 9] == 6) & first_frag & (ihl4 >= 20)
    i4, ihl4 = i4[is_tcp4], ihl4[is_tcp4]
    tcp[i4] = l3[i4] + ihl4
    ip_ck[i4] = l3[i4] + 10
    src_a[i4], dst_a[i4] = l3[i4] + 12, l3[i4] + 16
    plen[i4] = _u16be(a, l3[i4] + 2) - ihl4
    i6 = np.flatnonzero(v6)
    i6 = i6[a[l3[i6] + 6] == 6]
    tcp[i6] = l3[i6] + 40
    src_a[i6], dst_a[i6] = l3[i6] + 8, l3[i6] + 24
    plen[i6] = _u16be(a, l3[i6] + 4)
    has_ports = (tcp >= 0) & (tcp + 4 <= stop)
    t = np.flatnonzero(has_ports)
    tt, st = tcp[t], stop[t]  # the TCP header and the record end of these records
    sport, dport = _u16be(a, tt), _u16be(a, tt + 2)
    has_flags = tt + 14 <= st
    flags = np.zeros(len(t), np.int64)
    flags[has_flags] = a[tt[has_flags] + 13]
    seen_servers = set(np.unique(dport[(flags & 0x12) == 0x02]).tolist()) | \
        set(np.unique(sport[(flags & 0x12) == 0x12]).tolist())
    servers = seen_servers | server_ports
    s_srv, d_srv = np.isin(sport, list(servers)), np.isin(dport, list(servers))
    # the client: the side that is not a server; when both or neither are, the higher port (the ephemeral one)
    client_is_src = np.where(d_srv & ~s_srv, True, np.where(s_srv & ~d_srv, False, sport >= dport))
    port_off = np.where(client_is_src, tt, tt + 2)
    port = np.where(client_is_src, sport, dport)
    ck_off = np.where(tt + 18 <= st, tt + 16, -1)
    caddr = np.where(client_is_src, src_a[t], dst_a[t])
    is4 = ver[t] == 4
    addr_byte = np.where(is4, caddr + 1, caddr + 8)
    addr_even = np.where(is4, False, True)  # IPv4 byte 1: low byte of the word; IPv6 byte 8: high byte
    ipck = np.where(is4, ip_ck[t], -1)
    seq_off = np.where(tt + 12 <= st, tt + 4, -1)
    ack_set = (flags & 0x10) != 0
    # SACK option blocks (after a loss): found by a cheap pass over the option bytes, read in Python
    sacks = []
    opt_len = np.where(has_flags, np.minimum(doff_of(a, tt, has_flags), st - tt) - 20, 0)
    maybe = np.zeros(len(t), bool)
    for q in range(40):
        inside = q < opt_len
        maybe[inside] |= a[tt[inside] + 20 + q] == 5
    for j in np.flatnonzero(maybe).tolist():
        r, base = int(t[j]), int(tt[j])
        edges, q, end_ = [], base + 20, base + 20 + int(opt_len[j])
        while q < end_:
            kind = mm[q]
            if kind == 0:
                break
            if kind == 1:
                q += 1
                continue
            if q + 1 >= end_ or mm[q + 1] < 2:
                break
            if kind == 5:
                edges += [e - base for e in range(q + 2, min(q + mm[q + 1], end_) - 3, 4)]
            q += mm[q + 1]
        if edges:
            sacks.append((r, int(ck_off[j]), edges, base))
    # greetings: per connection, the server's first payload segment (and its retransmissions: the same seq)
    greetings, greeting_ids = [], []
    doff = doff_of(a, tt, has_flags)
    payload = tt + doff
    pay_len = np.minimum(plen[t], st - tt) - doff
    from_server = ~client_is_src & has_flags & (pay_len >= 10)
    cand = np.flatnonzero(from_server)
    cand = cand[(a[payload[cand] + 3] == 0) & (a[payload[cand] + 4] == 10)]  # MySQL seq 0, protocol 10
    first_seq: dict[tuple, int] = {}
    for j in cand.tolist():
        r = int(t[j])
        key = (bytes(a[src_a[r]:src_a[r] + (4 if ver[r] == 4 else 16)]), int(sport[j]),
               bytes(a[dst_a[r]:dst_a[r] + (4 if ver[r] == 4 else 16)]), int(dport[j]))
        seq = struct.unpack_from(">I", mm, int(tcp[r]) + 4)[0]
        if first_seq.setdefault(key, seq) != seq:
            continue
        p, e = int(payload[j]), int(payload[j] + pay_len[j])
        nul = mm.find(b"\0", p + 5, e)
        if nul < 0 or nul + 13 > e:  # the id and the scramble's first 8 bytes
            continue
        greetings.append((r, nul + 1, int(tcp[r]), int(ck_off[j])))
        greeting_ids.append(struct.unpack_from("<I", mm, nul + 1)[0])
    return Source(path=path, mm=mm, header=bytes(mm[:24]), order=order, rec_off=off,
                  first_ns=int(ts.min()) if len(ts) else 0, last_ns=int(ts.max()) if len(ts) else 0,
                  port_off=port_off, port=port, tcp_ck_off=ck_off, addr_byte_off=addr_byte, addr_word_even=addr_even,
                  ip_ck_off=ipck, port_rec=t, seq_off=seq_off, ack_set=ack_set, sacks=sacks, greetings=greetings,
                  greeting_ids=greeting_ids), seen_servers, set(np.unique(port).tolist())


def port_step(clients: set[int], servers: set[int], copies: int) -> tuple[int, int, int, int]:
    """(d, block, low, span): client port p of copy k (within a block) becomes low + (p - low + k·d) mod span; the
    largest block of copies one d keeps apart (no port of two copies equal, none on a server port), and that d."""
    low = PORT_LOW if min(clients, default=PORT_LOW) >= PORT_LOW else 1
    span = 65536 - low
    rel = np.asarray(sorted(clients), dtype=np.int64) - low
    taken = np.zeros(span, bool)  # steps m·d must avoid: copy m's ports would meet copy 0's or a server's
    taken[((rel[:, None] - rel[None, :]) % span).ravel()] = True  # 0 included
    server = np.asarray([s - low for s in servers if low <= s < 65536], dtype=np.int64)
    taken[((server[:, None] - rel[None, :]) % span).ravel()] = True
    d = np.arange(1, span, dtype=np.int64)
    best = (1, 1)
    alive = np.ones(len(d), bool)
    for m in range(1, copies):
        alive &= ~taken[(d * m) % span]
        if not alive.any():
            break
        # prefer the step that spreads the copies evenly over the range
        cand = d[alive]
        best = (int(cand[np.argmin(np.abs(cand - span // copies))]), m + 1)
    return best[0], best[1], low, span


def _fold(s: np.ndarray) -> np.ndarray:
    for _ in range(3):
        s = (s & 0xFFFF) + (s >> 16)
    return s


def _adjust(ck: np.ndarray, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m') for one changed 16-bit word per checksum."""
    return (~_fold((~ck & 0xFFFF) + (~old & 0xFFFF) + new)) & 0xFFFF


def _words(b: bytes, start_even: bool) -> list[int]:
    """16-bit words of the bytes at a position of that parity in the checksummed data."""
    if not start_even:
        b = b"\0" + b
    if len(b) % 2:
        b = b + b"\0"
    return [int.from_bytes(b[i:i + 2], "big") for i in range(0, len(b), 2)]


SEQ_STEP = 0x9E3779B1  # odd: k × SEQ_STEP mod 2^32 differs for every copy k < 2^32


def _adjust_many(ck: np.ndarray, old: list[np.ndarray], new: list[np.ndarray]) -> np.ndarray:
    """RFC 1624 eqn. 3 for several changed 16-bit words: HC' = ~(~HC + Σ ~m + Σ m')."""
    s = ~ck & 0xFFFF
    for o, n in zip(old, new):
        s = _fold(s + (~o & 0xFFFF) + n)
    return (~_fold(s)) & 0xFFFF


def _patch_bytes(buf: np.ndarray, at: int, new_b: bytes, ck_at: int, parity_from: int) -> None:
    """Write `new_b` at buf[at] and move the TCP checksum at buf[ck_at] (when >= 0) by the change; `parity_from`:
    where the checksummed TCP header starts (a byte at an even distance from it is a word's high byte)."""
    old_b = bytes(buf[at:at + len(new_b)])
    buf[at:at + len(new_b)] = np.frombuffer(new_b, np.uint8)
    if ck_at < 0:
        return
    even = (at - parity_from) % 2 == 0
    c = (int(buf[ck_at]) << 8) | int(buf[ck_at + 1])
    s = (~c & 0xFFFF) + sum(~w & 0xFFFF for w in _words(old_b, even)) + sum(_words(new_b, even))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    c = ~s & 0xFFFF
    buf[ck_at], buf[ck_at + 1] = c >> 8, c & 0xFF


def _scramble(old: bytes, k: int) -> bytes:
    """The scramble's first bytes made different for copy k (its digits in base 127, one per byte), kept in the
    range of the byte (1–127 or 128–255; a zero byte stays), so that no two copies' greetings look like one
    connection's (the scramble pairs a connection's two points)."""
    out = bytearray(old)
    for i, o in enumerate(old):
        digit = (k // 127 ** i) % 127
        if 1 <= o <= 127:
            out[i] = 1 + (o - 1 + digit) % 127
        elif o >= 128:
            out[i] = 128 + (o - 128 + digit) % 128
    return bytes(out)


def write_copies(src: Source, out: Path, copies: int, shift_s: int, id_step: int, d: int, block: int, low: int,
                 span: int) -> int:
    """Write `copies` patched copies of `src` to `out` (through a temporary name); returns the bytes written."""
    mm = src.mm
    a = np.frombuffer(mm, dtype=np.uint8)
    sec_dt = np.dtype(src.order + "u4")
    n_rec = len(src.rec_off)
    ends = np.append(src.rec_off[1:], src.rec_off[-1] + 16 + _caplen_last(mm, src)) if n_rec else src.rec_off
    tmp = out.with_name(out.name + ".tmp")
    written = 0
    greet = sorted(zip(src.greetings, src.greeting_ids))
    g_rec = np.asarray([g[0][0] for g in greet], dtype=np.int64)
    s_rec = np.asarray([x[0] for x in src.sacks], dtype=np.int64)
    if src.greeting_ids and max(src.greeting_ids) + (copies - 1) * id_step >= 2**32:
        raise LongCaptureError("connection ids would pass 2^32: fewer copies")
    # record ranges of about CHUNK_BYTES
    cuts = [0]
    if n_rec:
        targets = np.arange(CHUNK_BYTES, int(ends[-1]), CHUNK_BYTES)
        cuts += sorted(set(np.searchsorted(src.rec_off, targets).tolist()) - {0, n_rec})
    cuts.append(n_rec)
    with open(tmp, "wb") as f:
        f.write(src.header)
        written += len(src.header)
        for k in range(copies):
            kb, b = k % block, k // block
            table = low + (np.arange(span, dtype=np.int64) + kb * d) % span  # relative port -> new port
            seq_move = (k * SEQ_STEP) % 2**32
            for i, j in zip(cuts[:-1], cuts[1:]):
                if i == j:
                    continue
                base, top = int(src.rec_off[i]), int(ends[j - 1])
                buf = a[base:top].copy()
                if k:
                    _patch_copy(src, buf, base, i, j, k, kb, b, shift_s, table, low, span, seq_move, sec_dt)
                    g_lo, g_hi = np.searchsorted(g_rec, (i, j))
                    for (r, id_off, tcp_off, ck_off), old_id in greet[g_lo:g_hi]:
                        p = id_off - base
                        new_b = (old_id + k * id_step).to_bytes(4, "little") + _scramble(bytes(buf[p + 4:p + 8]), k)
                        _patch_bytes(buf, p, new_b, ck_off - base if ck_off >= 0 else -1, tcp_off - base)
                    s_lo, s_hi = np.searchsorted(s_rec, (i, j))
                    for r, ck_off, edges, tcp_off in src.sacks[s_lo:s_hi]:
                        for e in edges:
                            p = tcp_off + e - base
                            edge = (int.from_bytes(bytes(buf[p:p + 4]), "big") + seq_move) % 2**32
                            _patch_bytes(buf, p, edge.to_bytes(4, "big"), ck_off - base if ck_off >= 0 else -1,
                                         tcp_off - base)
                f.write(buf)
                written += len(buf)
    os.replace(tmp, out)
    return written


def _patch_copy(src: Source, buf: np.ndarray, base: int, i: int, j: int, k: int, kb: int, b: int, shift_s: int,
                table: np.ndarray, low: int, span: int, seq_move: int, sec_dt: np.dtype) -> None:
    """Records i..j of copy k in `buf` (their bytes from offset `base`): times, client ports and addresses,
    sequence and acknowledgment numbers, and the checksums those are in."""
    ro = src.rec_off[i:j] - base
    secs = np.stack([buf[ro + q] for q in range(4)], axis=1).copy().view(sec_dt).ravel()
    sb = (secs.astype(np.int64) + k * shift_s).astype(sec_dt).view(np.uint8).reshape(-1, 4)
    for q in range(4):
        buf[ro + q] = sb[:, q]
    lo, hi = np.searchsorted(src.port_rec, (i, j))
    po = src.port_off[lo:hi] - base
    old = src.port[lo:hi]
    new = np.where(old >= low, table[np.clip(old - low, 0, span - 1)], old)
    _put16be(buf, po, new)
    cko = src.tcp_ck_off[lo:hi]
    has = cko >= 0
    olds, news = [old[has]], [new[has]]
    # sequence and acknowledgment numbers (the acknowledgment only where the ACK flag makes it one)
    so = src.seq_off[lo:hi]
    for field_off, moves in ((so, so >= 0), (so + 4, (so >= 0) & src.ack_set[lo:hi])):
        fo = field_off[moves] - base
        v = _u32be(buf, fo)
        nv = (v + seq_move) % 2**32
        _put16be(buf, fo, nv >> 16)
        _put16be(buf, fo + 2, nv & 0xFFFF)
        full_o, full_n = np.zeros((2, len(old)), np.int64), np.zeros((2, len(old)), np.int64)
        full_o[0, moves], full_o[1, moves] = v >> 16, v & 0xFFFF
        full_n[0, moves], full_n[1, moves] = nv >> 16, nv & 0xFFFF
        olds += [full_o[0][has], full_o[1][has]]
        news += [full_n[0][has], full_n[1][has]]
    if b:
        ao = src.addr_byte_off[lo:hi] - base
        even = src.addr_word_even[lo:hi]
        ob = buf[ao].astype(np.int64)
        nb = (ob + b) % 256
        # the word holding the byte: the other byte is unchanged, so only this byte's share moves
        ow, nw = np.where(even, ob << 8, ob), np.where(even, nb << 8, nb)
        olds.append(ow[has])
        news.append(nw[has])
        buf[ao] = nb
        ipo = src.ip_ck_off[lo:hi]
        v4 = ipo >= 0
        _put16be(buf, ipo[v4] - base, _adjust(_u16be(buf, ipo[v4] - base), ow[v4], nw[v4]))
    _put16be(buf, cko[has] - base, _adjust_many(_u16be(buf, cko[has] - base), olds, news))


def _caplen_last(mm, src: Source) -> int:
    return struct.unpack_from(src.order + "I", mm, int(src.rec_off[-1]) + 8)[0]


# --- the slow log -------------------------------------------------------------------------------------------------

_TIME_LINE = re.compile(r"^(# Time: )(\S+(?: +\S+)?)(.*)$")
_ISO = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:?\d{2})?$")
_SHORT = re.compile(r"^(\d{6})( +)(\d{1,2}):(\d{2}):(\d{2})(\.\d+)?$")
_SET_TS = re.compile(r"^(SET (?:[a-z_]+=[^,;\s]+,)*timestamp=)(\d+)(;.*)$")
_THREAD_ID = re.compile(r"((?:^|\s)(?:Thread_id|Id):\s*)(\d+)")
# the lines the server writes when it (re)starts its log: an entry may start after them
_SERVER_HEADER = re.compile(r"^(?:\S.*, Version: .+ started with:|Tcp port: \d+\s+Unix socket: .*|Time\s+Id\s+Command\s+Argument)$")
_START_END = re.compile(r"((?:Start|End): )(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})")


def _shift_iso(stamp: str, seconds: int) -> str:
    return (dt.datetime.fromisoformat(stamp) + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")


def _shift_time_value(value: str, seconds: int) -> str:
    m = _ISO.match(value)
    if m:
        return _shift_iso(m[1], seconds) + (m[2] or "") + (m[3] or "")
    m = _SHORT.match(value)
    if m:
        moment = dt.datetime.strptime(f"{m[1]} {int(m[3]):02d}:{m[4]}:{m[5]}", "%y%m%d %H:%M:%S")
        moment += dt.timedelta(seconds=seconds)
        hour = f"{moment.hour:>{len(m[2]) + len(m[3]) - 1}d}"
        return f"{moment:%y%m%d} {hour}:{moment:%M:%S}{m[6] or ''}"
    return value


def moved_address(text: str, block: int) -> str:
    """A client address as block `block` of the copies has it (IPv4: second byte + block; IPv6: ninth byte +
    block, mod 256); anything that is not an address stays."""
    import ipaddress

    try:
        packed = bytearray(ipaddress.ip_address(text).packed)
    except ValueError:
        return text
    at = 1 if len(packed) == 4 else 8
    packed[at] = (packed[at] + block) % 256
    return str(ipaddress.ip_address(bytes(packed)))


_USER_HOST_IP = re.compile(r"^(# User@Host: [^\[]*\[[^\]]*\] @ [^\[]*?\s*\[)([^\]]*)(\])")


def shift_slow_log_line(line: str, seconds: int, ids: int, role: str, block: int = 0) -> str:
    """One line of a slow log moved by `seconds` and its thread ids by `ids`. `role`: 'header' (a '#' line where an
    entry may start: '# Time:', 'Thread_id:'/'Id:', MySQL 8's 'Start:'/'End:' move; the client address of
    'User@Host:' moves to its `block`'s), 'prefix' (the server's 'use db;' and 'SET timestamp=N;' lines after a
    header: N moves) or 'sql' (the statement: left as it is)."""
    if role == "header":
        if block and line.startswith("# User@Host:"):
            line = _USER_HOST_IP.sub(lambda x: x[1] + moved_address(x[2], block) + x[3], line)
        m = _TIME_LINE.match(line.rstrip("\n"))
        if m:
            return f"{m[1]}{_shift_time_value(m[2], seconds)}{_THREAD_ID.sub(lambda x: x[1] + str(int(x[2]) + ids), m[3])}\n"
        if "Id:" in line or "Thread_id:" in line:  # User@Host's Id, MariaDB's Thread_id line, MySQL 8's extra
            line = _THREAD_ID.sub(lambda x: x[1] + str(int(x[2]) + ids), line)
        if "Start: " in line or "End: " in line:
            line = _START_END.sub(lambda x: x[1] + _shift_iso(x[2], seconds), line)
        return line
    if role == "prefix":
        m = _SET_TS.match(line.rstrip("\n"))
        if m:
            return f"{m[1]}{int(m[2]) + seconds}{m[3]}\n"
    return line


def write_slow_log(src: Path, out: Path, copies: int, shift_s: int, id_step: int, block: int | None = None) -> int:
    """The slow log repeated like the captures, streaming (each copy reads the source again); the server's header
    lines before the first entry are written once. A '#' line is a header only where the server can start an entry:
    right after a line that ends in ';' (or another header line), as the slow-log reader decides; a statement's own
    lines that look like headers stay as they are. `block`: copies per client address (as the captures').
    Returns the lines written."""
    tmp = out.with_name(out.name + ".tmp")
    lines = 0
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape", newline="") as f:
        for k in range(copies):
            started, role, may_start = False, "sql", True
            with open(src, encoding="utf-8", errors="surrogateescape", newline="") as s:
                for line in s:
                    if line.startswith("#") and (may_start or role == "header"):
                        role, started = "header", True
                    elif role in ("header", "prefix") and line.startswith(("use ", "SET ")):
                        role = "prefix"
                    else:
                        role = "sql"
                    bare = line.rstrip("\r\n")
                    may_start = bare.endswith(";") or not started or bool(_SERVER_HEADER.match(bare))
                    if not started and k:
                        continue
                    f.write(shift_slow_log_line(line, k * shift_s, k * id_step, role, k // (block or copies))
                            if k else line)
                    lines += 1
    os.replace(tmp, out)
    return lines


def _thread_pool_size(toml: Path) -> int | None:
    if not toml.exists():
        return None
    import tomllib

    value = tomllib.loads(toml.read_text()).get("server", {}).get("thread_pool_size")
    return int(value) if isinstance(value, int) and value > 0 else None


def _write_toml(src: Path, out: Path, copies: int) -> None:
    text = re.sub(r"(?m)^((?:app|db)_packets = )(\d+)$", lambda m: f"{m[1]}{int(m[2]) * copies}", src.read_text())
    out.write_text(text)


def make_long_capture(source: Path, out: Path, copies: int | None = None, gb: float | None = None,
                      gap_s: float = 2.0, server_ports: tuple[int, ...] = (3306,),
                      max_block: int | None = None) -> LongCapture:
    """The capture set `source` (app.pcap, db.pcap, slow.log and capture.toml when there) repeated `copies` times,
    or as many times as makes each point at least `gb` GB (10^9 bytes), into the folder `out`. `max_block`: at
    most that many copies per client address (the tests' way to the address change)."""
    start = time.perf_counter()
    points = {name: source / f"{name}.pcap" for name in ("app", "db") if (source / f"{name}.pcap").exists()}
    if not points:
        raise LongCaptureError(f"{source}: no app.pcap or db.pcap")
    indexed, servers, clients = {}, set(server_ports), set()
    for name, path in points.items():
        src, seen, cl = index_capture(path, set(server_ports))
        indexed[name] = src
        servers |= seen
        clients |= cl
    clients -= servers
    if copies is None:
        smallest = min(p.stat().st_size for p in points.values())
        copies = max(1, math.ceil((gb or 0) * 1e9 / smallest))
    span_ns = max(s.last_ns for s in indexed.values()) - min(s.first_ns for s in indexed.values())
    shift_s = max(1, math.ceil(span_ns / 1e9 + gap_s))
    tps = _thread_pool_size(source / "capture.toml")
    id_step = ID_STEP_BASE * (tps // math.gcd(tps, ID_STEP_BASE) if tps else 1)
    d, block, low, span = port_step(clients, servers, copies)
    block = min(block, max_block or block)
    if copies > block * 255:
        raise LongCaptureError(f"{copies} copies: client ports and addresses do not give that many distinct copies")
    out.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for name, src in indexed.items():
        sizes[name] = write_copies(src, out / f"{name}.pcap", copies, shift_s, id_step, d, block, low, span)
        src.mm.close()
    slow = source / "slow.log"
    if slow.exists():
        write_slow_log(slow, out / "slow.log", copies, shift_s, id_step, block)
    if (source / "capture.toml").exists():
        _write_toml(source / "capture.toml", out / "capture.toml", copies)
    (out / "README.md").write_text(
        f"Synthetic long capture (benchmarks/long_capture.py): {source} repeated {copies} times; copy k moved by "
        f"k × {shift_s} s, its client ports by k × {d} (mod {span} from {low}; a new client address every {block} "
        f"copies), its connection ids (greetings and the slow log's thread ids) by k × {id_step}.\n")
    return LongCapture(out=out, copies=copies, shift_s=shift_s, id_step=id_step, port_step=d, block=block,
                       bytes_per_point=sizes, seconds=time.perf_counter() - start)


# --- --run: the benchmark row -------------------------------------------------------------------------------------

def _bench():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench  # the benchmark's helpers: child_rss (wall, peak PSS of the process tree), tshark, records

    return bench


def _timed(argv: list[str], cap_gb: float, nice: int) -> tuple[float | None, float, float | None, str]:
    """(wall s or None when it failed, CPU s of the child and its workers, peak PSS MiB or None, what happened) of
    `argv` run under an address-space cap of `cap_gb` (prlimit --as) at `nice`."""
    bench = _bench()
    before = bench._cpu_seconds()
    try:
        wall, peak, _ = bench.child_rss(["nice", "-n", str(nice), "prlimit", f"--as={int(cap_gb * 2**30)}", "--",
                                         *argv], cwd=REPO)
        return wall, bench._cpu_seconds() - before, peak, "ok"
    except SystemExit as exc:  # child_rss exits when the child fails: the cap was hit (MemoryError), or another error
        return None, bench._cpu_seconds() - before, None, f"failed: {str(exc)[-200:]}"


def run_row(pair: Path, cap_gb: float, jobs: int, nice: int, with_tshark: bool, memory: str | None = None,
            spill: Path | None = None) -> dict:
    """`exchanges` of the DB capture, `analyze --jobs JOBS --memory MEMORY [--spill SPILL]` of the pair with its slow
    log (and tshark's MySQL dissector on the DB capture when asked): time, CPU, peak memory; the analysis's counts."""
    import json

    row: dict = {}
    if with_tshark:
        bench = _bench()
        before = bench._cpu_seconds()
        wall, peak, commands = bench.tshark_commands(pair / "db.pcap")
        row["tshark"] = (wall, bench._cpu_seconds() - before, peak, f"{commands:,} commands")
    row["exchanges"] = _timed([sys.executable, "-m", "pcapdecomp.cli", "exchanges", str(pair / "db.pcap"), "-q",
                               "--out", str(pair / "x.parquet")], cap_gb, nice)
    (pair / "x.parquet").unlink(missing_ok=True)
    out = pair / "analysis"
    row["analyze"] = _timed([sys.executable, "-m", "pcapdecomp.cli", "analyze", str(pair), "--jobs", str(jobs), "-q",
                             "--out", str(out), *(["--memory", memory] if memory else []),
                             *(["--spill", str(spill)] if spill is not None else [])], cap_gb, nice)
    if (out / "summary.json").exists():
        s = json.loads((out / "summary.json").read_text())
        row["counts"] = (s["exchanges"]["total"], (s.get("slow_log") or {}).get("matched"),
                         s["hidden_slow"]["count"], len(s["warnings"]))
    return row


ROW_COLUMNS = ("GB per point (copies)", "build s (MB/s)", "tshark s (CPU s)", "exchanges s (CPU s)", "PSS MiB",
               "× tshark", "analyze --jobs 1 s (CPU s)", "PSS MiB", "× tshark", "--memory", "exchanges, slow-log joined, hidden-slow, "
               "warnings", "load before → after")


def _cell(measured, tshark_s: float | None) -> list[str]:
    wall, cpu, peak, what = measured
    if wall is None:
        return [f"— ({cpu:.0f}; {what})", "", ""]
    return [f"{wall:.1f} ({cpu:.1f})", f"{peak:,.0f}", f"{tshark_s / wall:.1f}×" if tshark_s else ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="a capture-set folder: app.pcap, db.pcap (classic pcap), slow.log")
    ap.add_argument("--out", type=Path, default=Path("/tmp/pcapdecomp-long"))
    size = ap.add_mutually_exclusive_group(required=True)
    size.add_argument("--copies", type=int, help="K: the number of copies")
    size.add_argument("--gb", help="GB (10^9 bytes) per point, at least; comma-separated sizes with --run")
    ap.add_argument("--gap", type=float, default=2.0, help="seconds between one copy's last packet and the next's first")
    ap.add_argument("--server-port", type=int, action="append", default=[],
                    help="a server port for connections whose handshake is not captured (default 3306)")
    ap.add_argument("--run", action="store_true",
                    help="per size: build the pair, run exchanges and analyze on it under --cap-gb, print the row, "
                         "delete the pair")
    ap.add_argument("--cap-gb", type=float, default=14.0, help="--run: address-space cap of each run (prlimit --as)")
    ap.add_argument("--jobs", type=int, default=1, help="--run: analyze --jobs")
    ap.add_argument("--memory", help="--run: analyze's memory bound (--memory; default: --cap-gb's, in GiB)")
    ap.add_argument("--spill", type=Path, metavar="DIR",
                    help="--run: analyze the pair partitioned (analyze --spill DIR) instead of in memory")
    ap.add_argument("--tshark-up-to", type=float, default=1.5,
                    help="--run: run tshark on the DB capture of the sizes up to this many GB per point")
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("--record", type=Path, metavar="FOLDER",
                    help="--run: also write the run to FOLDER/<date>-<commit>.md (as bench.py --record)")
    args = ap.parse_args()
    ports = tuple(args.server_port) or (3306,)
    if not args.run:
        made = make_long_capture(args.source, args.out, copies=args.copies,
                                 gb=float(args.gb) if args.gb else None, gap_s=args.gap, server_ports=ports)
        print(f"{made.out}: {made.copies} copies, " + ", ".join(f"{k}.pcap {v / 1e9:.2f} GB" for k, v in
              made.bytes_per_point.items()) + f" in {made.seconds:.1f} s "
              f"({sum(made.bytes_per_point.values()) / made.seconds / 1e6:.0f} MB/s)")
        return 0
    bench = _bench()
    if args.record:
        path = bench.record_file(args.record)
        sys.stdout = bench._Tee(sys.stdout, path)
    sizes = [float(x) for x in (args.gb or "").split(",") if x] or [None]
    print(f"machine: {bench.machine()}; source {args.source}; each run capped at {args.cap_gb:g} GiB of address space "
          f"(prlimit --as), nice {args.nice}; {time.strftime('%Y-%m-%d %H:%M')}\n")
    print("| " + " | ".join(ROW_COLUMNS) + " |")
    print("|" + "---|" * len(ROW_COLUMNS), flush=True)
    tshark_s = None
    for gb in sizes:
        pair = args.out / f"long-{gb or args.copies}"
        before = bench.load()
        made = make_long_capture(args.source, pair, copies=args.copies if gb is None else None, gb=gb,
                                 gap_s=args.gap, server_ports=ports)
        per_point = made.bytes_per_point.get("db", 0) / 1e9
        memory = args.memory or f"{args.cap_gb:g}G"
        row = run_row(pair, args.cap_gb, args.jobs, args.nice, with_tshark=per_point <= args.tshark_up_to,
                      memory=memory, spill=args.spill)
        cells = [f"{per_point:.2f} ({made.copies})",
                 f"{made.seconds:.0f} ({sum(made.bytes_per_point.values()) / made.seconds / 1e6:.0f})"]
        if "tshark" in row:
            tshark_s = row["tshark"][0] / made.copies  # per copy: tshark's time grows with the packets
            cells.append(f"{row['tshark'][0]:.1f} ({row['tshark'][1]:.1f})")
        else:
            cells.append(f"≈ {tshark_s * made.copies:.0f} (extrapolated)" if tshark_s else "")
        scale = tshark_s * made.copies if tshark_s else None
        cells += _cell(row["exchanges"], scale)[:3] + _cell(row["analyze"], scale) + [
            memory + (" (--spill)" if args.spill is not None else "")]
        counts = row.get("counts")
        cells.append(", ".join(f"{c:,}" if isinstance(c, int) else str(c) for c in counts) if counts else "")
        cells.append(f"{before} → {bench.load()}")
        print("| " + " | ".join(cells) + " |", flush=True)
        subprocess.run(["rm", "-rf", str(pair)], check=True)
    print(f"\nEach size: `{Path(__file__).name}` builds the pair (K copies of the source; build: both points, MB/s "
          "written), then `exchanges DB` and `analyze PAIR --jobs 1` (with the slow log and capture.toml) run one "
          "after the other under the cap; wall s (CPU s: user + system of the process and its workers); PSS: peak of "
          "the process and its workers, sampled every 50 ms; × tshark: tshark's time on the DB capture (measured, or "
          "extrapolated from the last measured size by the copies: tshark's work grows with the packets) / "
          "pcapdecomp's. The pair is deleted after its row.")
    return 0

if __name__ == "__main__":
    try:
        sys.exit(main())
    except LongCaptureError as exc:
        print(f"long_capture: {exc}", file=sys.stderr)
        sys.exit(2)
