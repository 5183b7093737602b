"""Small pcap tools for tests: shift a capture's clock, drop packets, cut its start, NAT its client, read it.

A pcap file is a 24-byte global header and records of (ts_sec, ts_frac, incl_len, orig_len) + packet bytes;
the magic says the byte order and whether ts_frac is µs or ns. Nothing else is touched (no checksums: the
reader does not check them, and a real NAT device would recompute them anyway).
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from pcapdecomp.read.capture import TcpSegment, open_capture

_MAGIC = {
    b"\xd4\xc3\xb2\xa1": ("<", 1_000), b"\xa1\xb2\xc3\xd4": (">", 1_000),
    b"\x4d\x3c\xb2\xa1": ("<", 1), b"\xa1\xb2\x3c\x4d": (">", 1),
}


def records(path: Path) -> tuple[bytes, str, int, Iterator[tuple[int, bytes, int]]]:
    """(global header, byte order, ns per ts_frac unit, iterator of (ts_ns, packet bytes, orig_len))."""
    data = path.read_bytes()
    order, unit = _MAGIC[data[:4]]
    header = data[:24]

    def it() -> Iterator[tuple[int, bytes, int]]:
        pos = 24
        while pos + 16 <= len(data):
            sec, frac, incl, orig = struct.unpack_from(order + "IIII", data, pos)
            yield sec * 1_000_000_000 + frac * unit, data[pos + 16: pos + 16 + incl], orig
            pos += 16 + incl

    return header, order, unit, it()


def rewrite(src: Path, dst: Path, *, time: Callable[[int], int] = lambda t: t,
            keep: Callable[[int, int], bool] = lambda i, t: True,
            packet: Callable[[bytes], bytes] = lambda p: p,
            repeat: Callable[[int], bool] = lambda i: False,
            keep_packet: Callable[[bytes], bool] = lambda p: True) -> int:
    """Copy src to dst with each kept packet's time mapped by `time(ts_ns)` and bytes by `packet(bytes)`.
    keep(index, ts_ns) and keep_packet(bytes) choose the packets (index from 0, ts before mapping); repeat(index) writes a packet twice
    (a retransmission 1 µs later). Returns packets written."""
    header, order, unit, recs = records(src)
    out = [header]
    n = 0
    for i, (ts, pkt, orig) in enumerate(recs):
        if not keep(i, ts) or not keep_packet(pkt):
            continue
        new = packet(pkt)
        for t in (time(ts), time(ts) + 1_000)[: 2 if repeat(i) else 1]:
            out.append(struct.pack(order + "IIII", t // 1_000_000_000, (t % 1_000_000_000) // unit, len(new),
                                   orig + len(new) - len(pkt)))
            out.append(new)
            n += 1
    dst.write_bytes(b"".join(out))
    return n


def tcp_ports(pkt: bytes) -> tuple[int, int] | None:
    """(source port, destination port) of an Ethernet/IPv4 or IPv6 TCP packet, else None."""
    if len(pkt) < 14:
        return None
    kind = pkt[12:14]
    if kind == b"\x08\x00" and len(pkt) >= 34 and pkt[23] == 6:
        tcp = 14 + (pkt[14] & 0x0F) * 4
    elif kind == b"\x86\xdd" and len(pkt) >= 58 and pkt[20] == 6:
        tcp = 54
    else:
        return None
    return struct.unpack_from(">HH", pkt, tcp) if len(pkt) >= tcp + 4 else None


def skewed_clock(offset_ns: int, skew_ppm: float, t0_ns: int) -> Callable[[int], int]:
    """t -> t + offset + skew·(t − t0): a clock that was `offset` ahead at t0 and runs fast by skew_ppm."""
    return lambda t: t + offset_ns + round(skew_ppm * 1e-6 * (t - t0_ns))


def first_ts(path: Path) -> int:
    return next(records(path)[3])[0]


def nat_client(old_ip: str, new_ip: str, port_shift: int) -> Callable[[bytes], bytes]:
    """Rewrite an Ethernet/IPv4 packet's address old_ip to new_ip and, on that side, the TCP port by port_shift,
    in both directions (as source NAT does). Other packets pass unchanged."""
    old, new = ipaddress.IPv4Address(old_ip).packed, ipaddress.IPv4Address(new_ip).packed

    def rewrite_packet(pkt: bytes) -> bytes:
        if len(pkt) < 34 or pkt[12:14] != b"\x08\x00":
            return pkt
        b = bytearray(pkt)
        ip = 14
        tcp = ip + (b[ip] & 0x0F) * 4
        is_tcp = b[ip + 9] == 6 and len(b) >= tcp + 4
        if b[ip + 12: ip + 16] == old:  # from the client
            b[ip + 12: ip + 16] = new
            if is_tcp:
                struct.pack_into(">H", b, tcp, (struct.unpack_from(">H", b, tcp)[0] + port_shift) % 65536)
        elif b[ip + 16: ip + 20] == old:  # to the client
            b[ip + 16: ip + 20] = new
            if is_tcp:
                struct.pack_into(">H", b, tcp + 2, (struct.unpack_from(">H", b, tcp + 2)[0] + port_shift) % 65536)
        return bytes(b)

    return rewrite_packet


def to_pcapng(src: Path, dst: Path, *, interfaces: int = 1, resolutions: tuple[int, ...] = (9,), big_endian: bool = False,
              sections: int = 1, simple_every: int = 0, offset_s: int = 0, extra_blocks: bool = True,
              wild: dict[int, int] | None = None) -> int:
    """Write the records of classic pcap `src` as pcapng: frame i on interface i % `interfaces` (interface k has the
    if_tsresol byte resolutions[k % len]: 9 is ns, 6 µs, 0x80|30 2^-30 s), `sections` section header blocks (the
    interfaces described again in each), with `simple_every` every n-th frame of interface 0 a simple packet block
    (which borrows the previous packet's time), if_tsoffset `offset_s`, and with `extra_blocks` a name
    resolution block and interface statistics (drops) in between. `wild` gives frames (by index) raw 64-bit tick
    counts instead of their own: broken times. Returns the number of packet blocks."""
    header, order, _unit, recs = records(src)
    linktype = struct.unpack_from(order + "I", header, 20)[0] & 0xFFFF
    e = ">" if big_endian else "<"

    def block(kind: int, body: bytes) -> bytes:
        body += b"\0" * (-len(body) % 4)
        return struct.pack(e + "II", kind, 12 + len(body)) + body + struct.pack(e + "I", 12 + len(body))

    def option(code: int, value: bytes) -> bytes:
        return struct.pack(e + "HH", code, len(value)) + value + b"\0" * (-len(value) % 4)

    def section() -> list[bytes]:
        out = [block(0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1))]
        for k in range(interfaces):
            opts = option(9, bytes([resolutions[k % len(resolutions)]]))
            if offset_s:
                opts += option(14, struct.pack(e + "q", offset_s))
            out.append(block(1, struct.pack(e + "HHI", linktype, 0, 0) + opts + b"\0" * 4))
        return out

    def ticks(ts: int, resol: int) -> int:
        ts -= offset_s * 1_000_000_000
        if resol & 0x80:
            return (ts << (resol & 0x7F)) // 1_000_000_000
        return ts // 10 ** (9 - resol) if resol <= 9 else ts * 10 ** (resol - 9)

    frames = list(recs)
    cut_at = {len(frames) * s // sections for s in range(1, sections)}
    out = section()
    for i, (ts, pkt, orig) in enumerate(frames):
        if i in cut_at:
            out += section()
        if extra_blocks and i == len(frames) // 3:
            out.append(block(4, struct.pack(e + "HH", 1, 9) + bytes([10, 0, 0, 1]) + b"host\0" + b"\0" * 7))
            out.append(block(5, struct.pack(e + "III", 0, 0, 0) + option(5, struct.pack(e + "Q", 3)) + b"\0" * 4))
        k = i % interfaces
        if simple_every and k == 0 and i % simple_every == simple_every - 1:
            out.append(block(3, struct.pack(e + "I", orig) + pkt))
            continue
        t = ticks(ts, resolutions[k % len(resolutions)]) % 2**64 if not wild or i not in wild else wild[i]
        out.append(block(6, struct.pack(e + "IIIII", k, t >> 32, t & 0xFFFFFFFF, len(pkt), orig) + pkt))
    dst.write_bytes(b"".join(out))
    return len(frames)


def read_segments(path: Path) -> Iterator[TcpSegment]:
    """Every TCP segment of a capture, through the tool's own reader (the file is closed at the end)."""
    with open_capture(path) as reader:
        yield from reader


# --- pcapng blocks, written from the specification (independently of the reader) ---------------------------------


def _pad4(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def ng_block(btype: int, body: bytes, e="<") -> bytes:
    body = _pad4(body)
    return struct.pack(e + "II", btype, len(body) + 12) + body + struct.pack(e + "I", len(body) + 12)


def ng_options(options, e="<") -> bytes:
    if not options:
        return b""
    out = b"".join(struct.pack(e + "HH", code, len(v)) + _pad4(v) for code, v in options)
    return out + struct.pack(e + "HH", 0, 0)


def ng_shb(e="<") -> bytes:
    return ng_block(0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1), e)


def ng_idb(linktype: int, tsresol: int | None = None, tsoffset: int | None = None, snaplen=0, e="<") -> bytes:
    opts = []
    if tsresol is not None:
        opts.append((9, bytes([tsresol])))
    if tsoffset is not None:
        opts.append((14, struct.pack(e + "q", tsoffset)))
    return ng_block(1, struct.pack(e + "HHI", linktype, 0, snaplen) + ng_options(opts, e), e)


def ng_epb(if_id: int, ticks: int, frame: bytes, orig_len=None, e="<") -> bytes:
    orig_len = len(frame) if orig_len is None else orig_len
    head = struct.pack(e + "IIIII", if_id, ticks >> 32, ticks & 0xFFFFFFFF, len(frame), orig_len)
    return ng_block(6, head + frame, e)


def ng_spb(frame: bytes, e="<") -> bytes:
    return ng_block(3, struct.pack(e + "I", len(frame)) + frame, e)


def ng_pb(if_id: int, ticks: int, frame: bytes, e="<") -> bytes:
    head = struct.pack(e + "HHIIII", if_id, 0, ticks >> 32, ticks & 0xFFFFFFFF, len(frame), len(frame))
    return ng_block(2, head + frame, e)


def ng_isb(if_id: int, ifdrop: int, e="<") -> bytes:
    return ng_block(5, struct.pack(e + "III", if_id, 0, 0) + ng_options([(5, struct.pack(e + "Q", ifdrop))], e), e)
