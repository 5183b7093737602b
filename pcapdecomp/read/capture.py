"""Capture stage: read a pcap / pcapng file (optionally gzip-compressed) into TCP segments.

Our own record readers (struct over a buffered file) instead of dpkt's: dpkt gives float/Decimal timestamps and
its pcapng reader applies the first interface's link type and resolution to every packet. Here every timestamp
is converted once, exactly, to integer nanoseconds, and every interface keeps its own link type and resolution.

Every frame read is counted in exactly one `frames_*` counter of `CaptureStats`; a damaged file is read up to the
damage, which is described in `stats.damaged` (nothing is raised: what was read stays valid). Only a file that
is not a capture at all raises (`InputError` / `CaptureFormatError`, one-line message naming the file).
"""

from __future__ import annotations

import io
import os
import re
import struct
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, make_dataclass
from ipaddress import IPv6Address
from socket import AF_INET, inet_ntop

from pcapdecomp.core.errors import CaptureFormatError, InputError

__all__ = [
    "TcpSegment",
    "CaptureStats",
    "CaptureReader",
    "open_capture",
    "iter_records",
    "SUPPORTED_LINK_TYPES",
]


@dataclass(frozen=True, slots=True)
class TcpSegment:
    """One captured TCP segment, as seen at the capture point."""

    frame: int  # 1-based frame number in the file, as Wireshark numbers them (every frame counted)
    ts_ns: int  # capture timestamp, integer ns since the Unix epoch, UTC
    src_ip: str  # textual IPv4/IPv6 ("10.0.0.1", "fd00::1")
    src_port: int
    dst_ip: str
    dst_port: int
    seq: int  # raw 32-bit TCP sequence number
    ack: int  # raw 32-bit acknowledgement number
    flags: int  # TCP flags byte (FIN=0x01 SYN=0x02 RST=0x04 PSH=0x08 ACK=0x10)
    payload: bytes  # captured TCP payload (shorter than on the wire when `missing` > 0)
    missing: int  # payload bytes that were on the wire but cut by the snaplen (0 when complete)


# A frozen dataclass's __init__ sets each field through object.__setattr__, 4x the cost of a plain one; at
# millions of segments that matters. So segments are built as this unfrozen twin (same slots, same layout) and
# then become TcpSegment by __class__ assignment, which CPython allows between identical slot layouts.
_SegmentBuilder = make_dataclass(
    "_SegmentBuilder", [(f.name, f.type) for f in fields(TcpSegment)], slots=True, eq=False, repr=False
)


@dataclass
class CaptureStats:
    """What reading one capture found. Every frame is counted in exactly one of the `frames_*` counters
    below `frames` (frames_truncated is a subset of frames_tcp)."""

    path: str
    format: str = ""  # "pcap", "pcap-ns" or "pcapng"
    gzip: bool = False  # the file was gzip-compressed (byte offsets below are then uncompressed offsets)
    frames: int = 0  # packet records read
    frames_tcp: int = 0  # yielded as TcpSegment
    frames_non_ip: int = 0  # ARP, LLDP, STP, ...
    frames_non_tcp: int = 0  # UDP, ICMP, ...
    frames_ip_fragment: int = 0  # IPv4/IPv6 fragments: not reassembled; counted, not mis-parsed
    frames_undecodable: int = 0  # link/IP/TCP header broken, or cut before the TCP header ends
    frames_unknown_link: int = 0  # pcapng interface with a link type we do not decode
    frames_truncated: int = 0  # TCP frames whose payload was cut by the snaplen (also in frames_tcp)
    frames_bad_ts: int = 0  # frames whose timestamp was impossible or out of line; given a neighbour's (repaired_time)
    bytes_file: int = 0  # size of the file on disk
    link_types: dict[int, int] = field(default_factory=dict)  # link type -> frames
    first_ts_ns: int | None = None  # timestamp of the first frame in file order
    last_ts_ns: int | None = None  # timestamp of the last frame in file order
    damaged: str | None = None  # why reading stopped early, with the byte offset; None when read to the end
    unknown_blocks: int = 0  # pcapng blocks skipped (name resolution, decryption secrets, custom, unknown)
    if_drops: dict[int, int] = field(default_factory=dict)  # pcapng interface -> packets dropped (ISB)
    sections: int = 0  # pcapng section header blocks
    interfaces: int = 0  # pcapng interface description blocks (1 for pcap)


# --- link types --------------------------------------------------------------------------------------------

LINKTYPE_NULL = 0  # BSD loopback: 4-byte address family in the capturing host's byte order
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101  # raw IP, version from the first nibble (also 12 and 14 on some BSDs)
LINKTYPE_LOOP = 108  # OpenBSD loopback: address family in network byte order
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
SUPPORTED_LINK_TYPES = frozenset({0, 1, 12, 14, 101, 108, 113, 228, 229, 276})

ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_IPV6 = 0x86DD
VLAN_TPIDS = frozenset({0x8100, 0x88A8, 0x9100})  # 802.1Q, 802.1ad (QinQ), old QinQ
AF_INET6_VALUES = frozenset({10, 24, 28, 30})  # Linux, NetBSD/OpenBSD, FreeBSD, Darwin

# Outcome codes of _decode when the frame is not a TCP segment.
_NON_IP, _NON_TCP, _FRAGMENT, _UNDECODABLE, _UNKNOWN_LINK = range(5)

# IPv6 extension headers we walk through: hop-by-hop, routing, destination options, AH (fragment handled apart).
_IPV6_EXT = frozenset({0, 43, 60, 51})
_IPV6_FRAGMENT = 44

_IPV4 = struct.Struct("!BxHxxHxB").unpack_from  # version/IHL, total length, flags/fragment offset, protocol
_U16 = struct.Struct("!H").unpack_from
_TCP = struct.Struct("!HHIIBB").unpack_from  # ports, seq, ack, data offset byte, flags


# Source+destination address bytes -> their text. A capture holds few distinct address pairs, and inet_ntop
# twice per packet costs more than the rest of the IP header; bounded so that a scan cannot grow it forever.
_ADDRESS_TEXT: dict[bytes, tuple[str, str]] = {}


def _address_text(addresses: bytes) -> tuple[str, str]:
    if len(_ADDRESS_TEXT) > 100_000:
        _ADDRESS_TEXT.clear()
    if len(addresses) == 8:
        text = (inet_ntop(AF_INET, addresses[:4]), inet_ntop(AF_INET, addresses[4:]))
    else:  # as ipaddress writes them (RFC 5952), as --server's are: glibc's inet_ntop writes ::1:0 as ::0.1.0.0
        # and ::ffff:a00:5 as ::ffff:10.0.0.5, so a server given so was never found in the capture
        text = (str(IPv6Address(addresses[:16])), str(IPv6Address(addresses[16:])))
    _ADDRESS_TEXT[addresses] = text
    return text


def _decode(linktype: int, data: bytes, orig_len: int):
    """Frame bytes -> ((src, dst), sport, dport, seq, ack, flags, payload, missing), or an outcome code."""
    n = len(data)
    # Link layer: find the network protocol and where its header starts.
    if linktype == LINKTYPE_ETHERNET:
        if n < 14:
            return _UNDECODABLE
        ethertype = _U16(data, 12)[0]
        off = 14
    elif linktype == LINKTYPE_LINUX_SLL2:
        if n < 20:
            return _UNDECODABLE
        ethertype = (data[0] << 8) | data[1]
        off = 20
    elif linktype == LINKTYPE_LINUX_SLL:
        if n < 16:
            return _UNDECODABLE
        ethertype = (data[14] << 8) | data[15]
        off = 16
    elif linktype == LINKTYPE_NULL or linktype == LINKTYPE_LOOP:
        if n < 4:
            return _UNDECODABLE
        # The writer's byte order is unknown for NULL (and some LOOP writers get it wrong): try both.
        family = data[0] | data[3]  # the family fits in one byte, the other three are zero
        if family == 2:
            ethertype = ETHERTYPE_IPV4
        elif family in AF_INET6_VALUES:
            ethertype = ETHERTYPE_IPV6
        else:
            return _NON_IP
        off = 4
    elif linktype in (LINKTYPE_RAW, 12, 14, LINKTYPE_IPV4, LINKTYPE_IPV6):
        if n < 1:
            return _UNDECODABLE
        version = data[0] >> 4
        ethertype = ETHERTYPE_IPV4 if version == 4 else ETHERTYPE_IPV6 if version == 6 else -1
        if ethertype == -1:
            return _UNDECODABLE
        off = 0
    else:
        return _UNKNOWN_LINK
    while ethertype in VLAN_TPIDS:  # 802.1Q / QinQ tags: 2 bytes of tag, then the inner ethertype
        if n < off + 4:
            return _UNDECODABLE
        ethertype = (data[off + 2] << 8) | data[off + 3]
        off += 4

    # Network layer: addresses, protocol, where TCP starts and where the IP packet ends on the wire.
    # The end comes from the IP length (so Ethernet padding and FCS never become payload), but never beyond the
    # frame's original length (a lying length field cannot invent missing bytes).
    wire_end = orig_len if orig_len > n else n
    if ethertype == ETHERTYPE_IPV4:
        if n < off + 20:
            return _UNDECODABLE
        ver_ihl, total_len, fragment, protocol = _IPV4(data, off)
        ihl = (ver_ihl & 0x0F) * 4
        if ver_ihl >> 4 != 4 or ihl < 20 or n < off + ihl:
            return _UNDECODABLE
        if fragment & 0x3FFF:  # More Fragments set or fragment offset != 0
            return _FRAGMENT
        if protocol != 6:
            return _NON_TCP
        if total_len:
            if total_len < ihl:
                return _UNDECODABLE
            ip_end = off + total_len
            if ip_end < wire_end:
                wire_end = ip_end
        # else: total length 0 is TCP segmentation offload seen on the sending host: the frame length holds.
        addresses = data[off + 12 : off + 20]
        src_dst = _ADDRESS_TEXT.get(addresses) or _address_text(addresses)
        tcp = off + ihl
    elif ethertype == ETHERTYPE_IPV6:
        if n < off + 40 or data[off] >> 4 != 6:
            return _UNDECODABLE
        payload_len = (data[off + 4] << 8) | data[off + 5]
        if payload_len:  # 0 means a jumbogram or offloaded segment: the frame length holds
            ip_end = off + 40 + payload_len
            if ip_end < wire_end:
                wire_end = ip_end
        next_header = data[off + 6]
        tcp = off + 40
        while next_header != 6:
            if next_header == _IPV6_FRAGMENT:
                return _FRAGMENT
            if next_header not in _IPV6_EXT:
                return _NON_TCP
            if n < tcp + 2:
                return _UNDECODABLE
            ext_len = (data[tcp + 1] + 2) * 4 if next_header == 51 else (data[tcp + 1] + 1) * 8
            next_header = data[tcp]
            tcp += ext_len
        addresses = data[off + 8 : off + 40]
        src_dst = _ADDRESS_TEXT.get(addresses) or _address_text(addresses)
    else:
        return _NON_IP

    # Transport layer.
    if n < tcp + 20:
        return _UNDECODABLE
    sport, dport, seq, ack, data_offset, flags = _TCP(data, tcp)
    start = tcp + (data_offset >> 4) * 4
    if start < tcp + 20 or start > n or start > wire_end:
        return _UNDECODABLE
    if wire_end <= n:
        return src_dst, sport, dport, seq, ack, flags, data[start:wire_end], 0
    return src_dst, sport, dport, seq, ack, flags, data[start:], wire_end - n


def count_outcome(stats: CaptureStats, outcome: int) -> None:
    """Count a frame that _decode did not turn into a TCP segment."""
    if outcome == _NON_IP:
        stats.frames_non_ip += 1
    elif outcome == _NON_TCP:
        stats.frames_non_tcp += 1
    elif outcome == _FRAGMENT:
        stats.frames_ip_fragment += 1
    elif outcome == _UNDECODABLE:
        stats.frames_undecodable += 1
    else:
        stats.frames_unknown_link += 1


def frame_segment(stats: CaptureStats, frame: int, ts_ns: int, linktype: int, data: bytes, orig_len: int
                  ) -> tuple | None:
    """A frame that another reader of the records took (CaptureReader.hand_over: the native fast lane gives back
    the frames it does not read itself), counted into `stats` as CaptureReader._fields counts the frames it reads,
    and decoded: its TCP segment in TcpSegment's field order, or None when it is not one."""
    stats.frames += 1
    link_types = stats.link_types
    link_types[linktype] = link_types.get(linktype, 0) + 1
    result = _decode(linktype, data, orig_len)
    if result.__class__ is not tuple:
        count_outcome(stats, result)
        return None
    (src, dst), sport, dport, seq, ack, flags, payload, missing = result
    stats.frames_tcp += 1
    if missing:
        stats.frames_truncated += 1
    return frame, ts_ns, src, sport, dst, dport, seq, ack, flags, payload, missing


# --- timestamps ----------------------------------------------------------------------------------------------

TIME_JUMP_NS = 1_000_000_000  # frames of one interface this far apart in time, out of order, are not jitter
IDLE_LIMIT_NS = 86_400 * 1_000_000_000  # a capture does not sit idle this long between its first two frames
WILD_RUN = 8  # up to this many consecutive frames with broken times are recognised (the look-ahead)
TS_MAX = (1 << 63) - 1  # the last nanosecond an int64 / datetime64[ns] holds (year 2262)


def _valid_ts(ts: int) -> bool:
    return 0 <= ts <= TS_MAX


def repaired_time(prev2: int | None, prev: int | None, ts: int, following: list[int], last: bool) -> int | None:
    """The timestamp to use instead of a frame's `ts`, or None to keep it.

    A capture's frames are in time order within the jitter of the capturing host. A frame whose time breaks that
    order while its neighbours agree has a broken timestamp (a bit flip, a zeroed field), not a clock that moved,
    and would otherwise stretch every time span to decades. Such a frame gets a neighbour's time (the true one
    lies between the two):
    - in the middle: more than TIME_JUMP_NS from the previous frame, while one of the next WILD_RUN frames is
      back within TIME_JUMP_NS of the previous one and more than TIME_JUMP_NS from this one (time that leaves and
      comes back within a few frames is impossible in ordered time; runs of up to WILD_RUN broken frames are
      repaired one after the other): the previous frame's time;
    - the first frame: later than the next by more than TIME_JUMP_NS, or earlier by more than IDLE_LIMIT_NS,
      while the next two agree: the next frame's time;
    - the last frame: earlier than the previous by more than TIME_JUMP_NS, or later by more than IDLE_LIMIT_NS,
      while the previous two agree: the previous frame's time.
    A time out of range (before 1970, or beyond int64 nanoseconds: pcapng's 64-bit ticks can say anything) is
    always repaired: the previous frame's time, else the next valid one's, else 0.
    `prev`, `prev2` are the times used for the previous two frames of the frame's interface (None: none);
    `following` the raw times of the next complete frames of the same interface, up to WILD_RUN (fewer at the end
    or where another interface's frame comes); `last`: no frame follows at all. The native lane (_lane.c,
    ts_repair) applies the same rule to pcap files.
    """
    jump, idle = TIME_JUMP_NS, IDLE_LIMIT_NS
    if not _valid_ts(ts):
        if prev is not None:
            return prev
        return next((t for t in following if _valid_ts(t)), 0)
    if prev is None:
        if len(following) >= 2:
            nxt, nxt2 = following[0], following[1]
            if (_valid_ts(nxt) and _valid_ts(nxt2) and abs(nxt - nxt2) <= jump
                    and (ts - nxt > jump or nxt - ts > idle)):
                return nxt
        return None
    if -jump <= ts - prev <= jump:
        return None
    if following:
        if any(_valid_ts(t) and abs(t - prev) <= jump and abs(t - ts) > jump for t in following):
            return prev
        return None
    if last and prev2 is not None and abs(prev - prev2) <= jump and (prev - ts > jump or ts - prev > idle):
        return prev
    return None


def _timed(records: Iterator[tuple], stats: CaptureStats) -> Iterator[tuple]:
    """Records (frame, ts, linktype, data, orig_len, interface) with their timestamps checked by repaired_time
    (interface: a key per clock in the file, None for a record that has no time of its own).
    A record is only read ahead when its own time is in question; damage met while reading ahead is raised after
    the records before it."""
    it = iter(records)
    ahead: deque = deque()
    end: BaseException | None = None  # what ended the records (StopIteration, or damage to raise last)

    def read() -> None:
        nonlocal end
        try:
            ahead.append(next(it))
        except StopIteration as stop:
            end = stop
        except (_Damaged, OSError) as err:
            end = err

    used: dict[int, tuple[int | None, int]] = {}  # interface -> times used for its last two frames
    last_used = 0
    jump = TIME_JUMP_NS
    while True:
        if not ahead:
            if end is not None:
                break
            read()
            if not ahead:
                break
        record = ahead.popleft()
        ts, iface = record[1], record[5]
        if iface is None:  # no time of its own (pcapng simple packet block: the previous packet's, as read)
            if not 0 <= ts <= TS_MAX:
                stats.frames_bad_ts += 1
                record = (record[0], last_used, *record[2:])
            yield record
            continue
        prev2, prev = used.get(iface, (None, None))
        if prev is None or not 0 <= ts <= TS_MAX or not -jump <= ts - prev <= jump:
            while len(ahead) < WILD_RUN and end is None:
                read()
            following = []
            for later in ahead:
                if later[5] != iface:
                    break
                following.append(later[1])
            fixed = repaired_time(prev2, prev, ts, following, not ahead)
            if fixed is not None:
                stats.frames_bad_ts += 1
                ts = fixed
                record = (record[0], ts, *record[2:])
        used[iface] = (prev, ts)
        last_used = ts
        yield record
    if end is not None and not isinstance(end, StopIteration):
        raise end


# --- record readers ----------------------------------------------------------------------------------------

_MAX_RECORD = 256 * 1024 * 1024  # no capture tool writes a bigger record: treat as damage
_MIN_SANE_SNAPLEN = 262144  # tcpdump's maximum snaplen; records up to this size are never "insane"
_GZIP_MAGIC = b"\x1f\x8b"
_PCAP_MAGICS = {  # magic as read little-endian -> (byte order, ns resolution)
    0xA1B2C3D4: ("<", False),
    0xD4C3B2A1: (">", False),
    0xA1B23C4D: ("<", True),
    0x4D3CB2A1: (">", True),
}
_PCAPNG_SHB = 0x0A0D0D0A
# the first line of tcpdump's text output (`tcpdump -x`/`-X`/`-xx`, what pt-query-digest --type tcpdump reads):
# a time, with or without the date (-tttt), then IP/IP6 or a link header, then the hex lines' first offset
_TCPDUMP_TEXT = re.compile(rb"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d\.\d+ .*\n\s+0x0000:", re.DOTALL)


_MIN_BODY = {6: 20, 2: 20, 3: 4, 1: 8, 5: 12}  # pcapng block type -> smallest valid body


@dataclass(frozen=True)
class PcapLayout:
    """How the records of a classic pcap file are laid out (what the native fast lane needs to read them)."""

    big_endian: bool
    frac_to_ns: int  # 1 for nanosecond files, 1000 for microsecond ones
    linktype: int
    limit: int  # a record longer than this is damage


@dataclass(frozen=True, slots=True)
class RecordSource:
    """The records of a capture file as CaptureReader.hand_over gives them to a reader of its own."""

    read: Callable[[int], bytes]  # read(n): the next n bytes of the file (uncompressed when it is gzip)
    # how the records of a classic pcap file are laid out; read() starts at its first record (byte 24). None: a
    # pcapng file, which read() gives from its first byte (section and interface blocks included)
    layout: PcapLayout | None
    # readinto(buffer): read() into a buffer the caller reuses, returning how many bytes came (0 at the end): no new
    # memory for every chunk of the file
    readinto: Callable[[bytearray | memoryview], int] | None = None


class _Damaged(Exception):
    """Raised inside a record reader to stop at damage; turned into stats.damaged, never seen by callers."""

    def __init__(self, what: str, offset: int):
        super().__init__(f"{what} at byte {offset}")
        self.offset = offset


def _ts_converter(resol_byte: int | None):
    """pcapng if_tsresol option -> function(ticks) -> ns, exact integer arithmetic. Default: microseconds."""
    if resol_byte is None:
        return lambda t: t * 1000
    exponent = resol_byte & 0x7F
    if resol_byte & 0x80:  # 2^-n seconds per tick
        return lambda t: (t * 1_000_000_000) >> exponent
    if exponent <= 9:
        factor = 10 ** (9 - exponent)
        return lambda t: t * factor
    divisor = 10 ** (exponent - 9)
    return lambda t: t // divisor


@dataclass(slots=True)
class _Interface:
    linktype: int
    snaplen: int
    to_ns: object  # ticks -> ns
    offset_ns: int  # if_tsoffset, in ns
    key: int = 0  # ordinal over the whole file (interface ids restart in each section): whose clock a time is


def _pcapng_options(body: bytes, start: int, endian: str) -> Iterator[tuple[int, bytes]]:
    """(code, value) of each option in a block body (body excludes the trailing length)."""
    hdr = struct.Struct(endian + "HH").unpack_from
    pos = start
    while pos + 4 <= len(body):
        code, length = hdr(body, pos)
        if code == 0:  # opt_endofopt
            return
        yield code, body[pos + 4 : pos + 4 + length]
        pos += 4 + ((length + 3) & ~3)


class _Gunzip(io.RawIOBase):
    """A gzip file (all members) as a raw stream of uncompressed bytes. gzip.GzipFile raises at a cut or corrupt
    stream, which loses what its buffers held; here damage ends the stream like an end of file and is kept in
    `damage`, so every byte before it is still read."""

    def __init__(self, file):
        self._file = file
        self._zlib = zlib.decompressobj(wbits=31)  # 31: gzip header and trailer
        self._member_open = False
        self._pending = b""
        self.damage: str | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            if self._zlib.eof:  # a member ended: what follows is another member, or the end
                feed = self._zlib.unused_data
                self._zlib = zlib.decompressobj(wbits=31)
                self._member_open = False
            else:
                feed = self._zlib.unconsumed_tail
            if not feed:
                feed = self._file.read(1 << 16)
                if not feed:
                    if self._member_open:
                        self.damage = "gzip stream cut short"
                    return 0
            self._member_open = True
            try:
                self._pending = self._zlib.decompress(feed, 1 << 20)  # bounded output: zip bombs stay small
            except zlib.error as err:
                self.damage = f"gzip stream corrupt: {err}"
                return 0
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


class CaptureReader:
    """An open capture. Iterate for TcpSegments (once); `stats` fills in as you go."""

    def __init__(self, path: str | os.PathLike, stats: CaptureStats | None = None):
        self.path = os.fspath(path)
        name = self.path
        if not os.path.exists(name):
            raise InputError(f"capture file not found: {name}")
        if os.path.isdir(name):
            raise InputError(f"capture path is a directory, not a file: {name}")
        try:
            raw = open(name, "rb")
        except OSError as err:
            raise InputError(f"cannot open capture file {name}: {err.strerror}") from None
        self._gunzip: _Gunzip | None = None
        self.stats = stats if stats is not None else CaptureStats(path=name)
        self.stats.path, self.stats.bytes_file = name, os.fstat(raw.fileno()).st_size
        self._file = raw
        self._raw = raw
        try:
            self._open_stream()
            self._records = self._start_records()
        except BaseException:
            self.close()
            raise
        self._iterated = False

    pcap_layout: PcapLayout | None = None  # set for classic pcap files: how their records are laid out
    pcapng_packets = False  # a pcapng file whose first packet was found at open time (the fast lane reads those)

    # -- another reader of the records --

    def hand_over(self) -> RecordSource:
        """Give the records to a reader of its own (the native fast lane, read/fastlane.py) instead of iterating them:
        a classic pcap file (`pcap_layout`) from its first record, a pcapng file with packets (`pcapng_packets`)
        from its first byte (rewound: its blocks are counted again by that reader). Only once, before any record
        is read. That reader counts the frames it gives back with `frame_segment`, the others into `stats`
        itself, and calls `records_ended` when it stops."""
        if self._iterated:
            raise RuntimeError("a CaptureReader's records can be handed over only before they are read")
        layout = self.pcap_layout
        if layout is None:
            if not self.pcapng_packets:
                raise RuntimeError("only the records of a classic pcap file or of a pcapng file can be handed over")
            self.rewind()
        self._iterated = True
        return RecordSource(self._file.read, layout, getattr(self._file, "readinto", None))

    def records_ended(self, damage: str | None, offset: int = 0) -> None:
        """The reader the records were handed to stopped: at their end (`damage` None), or at damage, `damage`
        saying what it found at byte `offset` of the (uncompressed) file. Recorded as iterating would."""
        self._note_damage(None if damage is None else str(_Damaged(damage, offset)))

    @property
    def bytes_read(self) -> int:
        """How far into the file (on disk, compressed when gzip) reading has got: for progress bars."""
        try:
            return self._raw.tell()
        except (OSError, ValueError):
            return self.stats.bytes_file

    # -- opening --

    def rewind(self) -> None:
        """Back to the capture's first byte, before any record is read (the native fast lane reads a pcapng file
        from its section header on). The file is opened again; what opening counted of its blocks is reset, for the
        reader of the records counts it again."""
        if self._iterated:
            raise RuntimeError("a CaptureReader can be rewound only before its records are read")
        self._file.close()
        try:
            raw = open(self.path, "rb")
        except OSError as err:
            raise InputError(f"cannot open capture file {self.path}: {err.strerror}") from None
        self._raw = self._file = raw
        self._gunzip = None
        if self.stats.gzip:
            self._gunzip = _Gunzip(raw)
            self._file = io.BufferedReader(self._gunzip, buffer_size=1 << 20)
        stats = self.stats
        stats.sections = stats.interfaces = stats.unknown_blocks = 0
        stats.if_drops = {}

    def _open_stream(self) -> None:
        head = self._file.read(4)
        if not head:
            raise InputError(f"capture file is empty: {self.path}")
        if head[:2] == _GZIP_MAGIC:
            self._file.seek(0)
            self._gunzip = _Gunzip(self._file)
            self._file = io.BufferedReader(self._gunzip, buffer_size=1 << 20)
            self.stats.gzip = True
            head = self._file.read(4)
            if self._gunzip.damage and len(head) < 4:
                raise CaptureFormatError(f"not a capture file ({self._gunzip.damage}): {self.path}")
            if not head:
                raise InputError(f"capture file is empty (gzip of nothing): {self.path}")
        self._magic = head

    def _start_records(self) -> Iterator[tuple[int, int, int, bytes, int]]:
        magic_le = struct.unpack("<I", self._magic.ljust(4, b"\0"))[0]
        if len(self._magic) == 4 and magic_le in _PCAP_MAGICS:
            return self._pcap_records(*_PCAP_MAGICS[magic_le])
        if len(self._magic) == 4 and magic_le == _PCAPNG_SHB:
            return self._pcapng_start()
        shown = self._magic.hex()
        if _TCPDUMP_TEXT.match(self._magic + self._file.read(2048)):  # told apart: the fix is a different tcpdump
            raise CaptureFormatError(f"not a capture file but tcpdump's text output (tcpdump -x, as pt-query-digest "
                                     f"reads it): record with `tcpdump -w FILE` (docs/capture-guide.md): {self.path}")
        raise CaptureFormatError(f"not a capture file (unknown magic 0x{shown}): {self.path}")

    # -- pcap --

    def _pcap_records(self, endian: str, nanos: bool):
        header = self._file.read(20)
        if len(header) < 20:
            raise CaptureFormatError(f"not a capture file (pcap header cut short): {self.path}")
        _major, _minor, _zone, _sigfigs, snaplen, network = struct.unpack(endian + "HHiIII", header)
        linktype = network & 0xFFFF  # upper bits may carry FCS length flags
        if linktype not in SUPPORTED_LINK_TYPES:
            raise CaptureFormatError(f"unsupported link type {linktype} in capture file: {self.path}")
        self.stats.format = "pcap-ns" if nanos else "pcap"
        self.stats.interfaces = 1
        limit = min(_MAX_RECORD, max(snaplen * 4, _MIN_SANE_SNAPLEN))
        self.pcap_layout = PcapLayout(endian == ">", 1 if nanos else 1000, linktype, limit)
        return self._pcap_loop(endian, 1 if nanos else 1000, linktype, limit)

    def _pcap_loop(self, endian: str, frac_to_ns: int, linktype: int, limit: int):
        read = self._file.read  # buffered: two small reads per record cost no more than slicing a big chunk
        record_header = struct.Struct(endian + "IIII").unpack
        pos = 24
        frame = 0
        while True:
            head = read(16)
            if len(head) < 16:
                if head:
                    raise _Damaged("file truncated mid-record header", pos)
                return
            sec, frac, caplen, orig_len = record_header(head)
            if caplen > limit:
                raise _Damaged(f"insane record length {caplen}", pos)
            data = read(caplen)
            if len(data) < caplen:
                raise _Damaged("file truncated mid-record", pos)
            frame += 1
            yield frame, sec * 1_000_000_000 + frac * frac_to_ns, linktype, data, orig_len, 0
            pos += 16 + caplen

    # -- pcapng --

    def _pcapng_start(self):
        """Read up to the first packet so that a file whose every interface has an unknown link type fails at
        open time, like a pcap with an unknown link type."""
        records = self._pcapng_loop()
        try:
            first = next(records, None)
        except _Damaged as err:
            if err.offset == 0:
                raise CaptureFormatError(f"not a capture file (pcapng {err}): {self.path}") from None
            self._note_damage(str(err))
            return iter(())
        self.stats.format = "pcapng"
        if first is not None and not any(i.linktype in SUPPORTED_LINK_TYPES for i in self._interfaces):
            kinds = ", ".join(sorted({str(i.linktype) for i in self._interfaces}))
            raise CaptureFormatError(f"unsupported link type {kinds} in capture file: {self.path}")
        if first is None:
            return iter(())
        self.pcapng_packets = True

        def chained():
            yield first
            yield from records

        return chained()

    def _pcapng_loop(self):
        read = self._file.read
        stats = self.stats
        self._interfaces: list[_Interface] = []
        interfaces = self._interfaces
        pos = 0
        frame = 0
        last_ts = 0
        head = self._magic + read(8)  # block type, block length, byte-order magic
        endian = "<"
        while True:
            if len(head) < 8:
                if head:
                    raise _Damaged("file truncated mid-block header", pos)
                return
            block_type = struct.unpack_from(endian + "I", head)[0]
            if block_type == _PCAPNG_SHB:
                if len(head) < 12:
                    head += read(12 - len(head))
                    if len(head) < 12:
                        raise _Damaged("file truncated mid-block header", pos)
                bom = head[8:12]
                if bom == b"\x4d\x3c\x2b\x1a":
                    endian = "<"
                elif bom == b"\x1a\x2b\x3c\x4d":
                    endian = ">"
                elif pos == 0:
                    raise CaptureFormatError(f"not a capture file (bad pcapng byte-order magic): {self.path}")
                else:
                    raise _Damaged("bad section header", pos)
                u32 = struct.Struct(endian + "I").unpack_from
                interfaces.clear()  # interface ids are per section
                stats.sections += 1
                block_len = u32(head, 4)[0]
                already = 12
                if block_len < 28:
                    raise _Damaged(f"insane section header length {block_len}", pos)
            else:
                block_len = u32(head, 4)[0]
                already = 8
            if block_len < 12 or block_len % 4 or block_len > _MAX_RECORD:
                raise _Damaged(f"insane block length {block_len}", pos)
            rest = read(block_len - already)
            if len(rest) < block_len - already:
                raise _Damaged("file truncated mid-record", pos)
            body = (head[8:] + rest)[:-4] if already == 12 else rest[:-4]
            if u32(rest, len(rest) - 4)[0] != block_len:
                raise _Damaged("block length mismatch", pos)

            if len(body) < _MIN_BODY.get(block_type, 0):
                raise _Damaged(f"block of type {block_type} too short", pos)
            if block_type == 6:  # Enhanced Packet Block
                if_id, ts_high, ts_low, caplen, orig_len = struct.unpack_from(endian + "IIIII", body)
                if caplen > len(body) - 20 or if_id >= len(interfaces):
                    raise _Damaged("bad packet block", pos)
                iface = interfaces[if_id]
                last_ts = iface.to_ns((ts_high << 32) | ts_low) + iface.offset_ns
                frame += 1
                yield frame, last_ts, iface.linktype, body[20 : 20 + caplen], orig_len, iface.key
            elif block_type == 3:  # Simple Packet Block: interface 0, no timestamp -> reuse the previous one
                if not interfaces:
                    raise _Damaged("packet block before any interface", pos)
                orig_len = u32(body, 0)[0]
                iface = interfaces[0]
                caplen = min(orig_len, len(body) - 4, iface.snaplen or orig_len)
                frame += 1
                yield frame, last_ts, iface.linktype, body[4 : 4 + caplen], orig_len, None  # a borrowed time
            elif block_type == 2:  # obsolete Packet Block
                if_id, _drops, ts_high, ts_low, caplen, orig_len = struct.unpack_from(endian + "HHIIII", body)
                if caplen > len(body) - 20 or if_id >= len(interfaces):
                    raise _Damaged("bad packet block", pos)
                iface = interfaces[if_id]
                last_ts = iface.to_ns((ts_high << 32) | ts_low) + iface.offset_ns
                frame += 1
                yield frame, last_ts, iface.linktype, body[20 : 20 + caplen], orig_len, iface.key
            elif block_type == 1:  # Interface Description Block
                linktype, _reserved, snaplen = struct.unpack_from(endian + "HHI", body)
                resol, offset_s = None, 0
                for code, value in _pcapng_options(body, 8, endian):
                    if code == 9 and value:  # if_tsresol
                        resol = value[0]
                    elif code == 14 and len(value) == 8:  # if_tsoffset, seconds
                        offset_s = struct.unpack(endian + "q", value)[0]
                interfaces.append(_Interface(linktype, snaplen, _ts_converter(resol), offset_s * 1_000_000_000,
                                             stats.interfaces))
                stats.interfaces += 1
            elif block_type == 5:  # Interface Statistics Block: counters are cumulative, keep the latest
                if_id = u32(body, 0)[0]
                for code, value in _pcapng_options(body, 12, endian):
                    if code == 5 and len(value) == 8:  # isb_ifdrop
                        stats.if_drops[if_id] = struct.unpack(endian + "Q", value)[0]
            elif block_type != _PCAPNG_SHB:
                stats.unknown_blocks += 1  # name resolution, decryption secrets, custom, journal, unknown
            pos += block_len
            head = read(8)

    # -- iteration --

    def __iter__(self) -> Iterator[TcpSegment]:
        if self._iterated:
            raise RuntimeError("a CaptureReader can be iterated only once")
        self._iterated = True
        return self._segments()

    def _frames(self) -> Iterator[tuple[int, int, int, bytes, int, int]]:
        """Records (frame, ts, linktype, data, orig_len, interface), timestamps checked (_timed), with damage and
        gzip errors turned into stats.damaged."""
        try:
            yield from _timed(self._records, self.stats)
        except _Damaged as err:
            self._note_damage(str(err))
        except OSError as err:
            raise InputError(f"cannot read capture file {self.path}: {err}") from None
        else:
            self._note_damage(None)

    def _note_damage(self, record_damage: str | None) -> None:
        gzip_damage = self._gunzip.damage if self._gunzip else None
        if gzip_damage and record_damage:
            record_damage = f"{gzip_damage} ({record_damage} of the uncompressed data)"
        elif gzip_damage:
            record_damage = f"{gzip_damage} (after frame {self.stats.frames})"
        self.stats.damaged = record_damage

    def _segments(self) -> Iterator[TcpSegment]:
        for values in self._fields():
            segment = _SegmentBuilder(*values)
            segment.__class__ = TcpSegment
            yield segment

    def segment_fields(self) -> Iterator[tuple]:
        """Like iterating the reader, but each TCP segment comes as a plain tuple in TcpSegment's field order
        (frame, ts_ns, src_ip, src_port, dst_ip, dst_port, seq, ack, flags, payload, missing): the extraction hot
        path builds an object only for the few segments that need one."""
        if self._iterated:
            raise RuntimeError("a CaptureReader can be iterated only once")
        self._iterated = True
        return self._fields()

    def _fields(self) -> Iterator[tuple]:
        stats = self.stats
        link_types = stats.link_types
        decode = _decode
        tcp = truncated = 0
        first = True
        ts_ns = None
        try:
            for frame, ts_ns, linktype, data, orig_len, _iface in self._frames():
                stats.frames += 1
                if first:
                    if stats.first_ts_ns is None:
                        stats.first_ts_ns = ts_ns
                    first = False
                link_types[linktype] = link_types.get(linktype, 0) + 1
                result = decode(linktype, data, orig_len)
                if result.__class__ is tuple:
                    (src, dst), sport, dport, seq, ack, flags, payload, missing = result
                    tcp += 1
                    if missing:
                        truncated += 1
                    yield frame, ts_ns, src, sport, dst, dport, seq, ack, flags, payload, missing
                else:
                    count_outcome(stats, result)
        finally:
            stats.frames_tcp += tcp
            stats.frames_truncated += truncated
            if ts_ns is not None:
                stats.last_ts_ns = ts_ns

    def raw_frames(self) -> Iterator[tuple[int, int, int, bytes]]:
        """(frame number, ts_ns, link type, frame bytes) for every frame, decoded or not (for evidence export)."""
        if self._iterated:
            raise RuntimeError("a CaptureReader can be iterated only once")
        self._iterated = True
        for frame, ts_ns, linktype, data, _orig_len, _iface in self._frames():
            self.stats.frames += 1
            yield frame, ts_ns, linktype, data

    def close(self) -> None:
        self._file.close()  # closes the gzip layer and the file below it

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_capture(path: str | os.PathLike, stats: CaptureStats | None = None) -> CaptureReader:
    """Open a pcap/pcapng capture (gzip-compressed or not). Raises InputError / CaptureFormatError.
    `stats`, if given, is the CaptureStats object to fill in (else a new one: reader.stats).
    `path`: a file, or a capture point (sources.CapturePoint), which opens its own files as one capture; a point of
    several files is passed as the point itself wherever it is read again, never by its name."""
    opener = getattr(path, "open_reader", None)  # a sources.CapturePoint opens its own files
    if opener is not None:
        return opener(stats)
    return CaptureReader(path, stats)


def iter_records(path: str | os.PathLike) -> Iterator[tuple[int, int, int, bytes, int]]:
    """(frame number, ts_ns, link type, captured bytes, original length) of every frame: what a pcapng writer
    needs to copy frames faithfully (evidence export)."""
    reader = open_capture(path)

    def records():
        with reader:
            reader._iterated = True
            for record in reader._frames():
                reader.stats.frames += 1
                yield record[:5]

    return records()


def tcp_records_between(path: str | os.PathLike, first: int, last: int) -> Iterator[tuple]:
    """(frame number, ts_ns, link type, captured bytes, original length, TCP fields) of the TCP frames numbered
    `first` … `last`; the capture is not read past `last`. The TCP fields are _decode's: ((source ip, destination
    ip), source port, destination port, seq, ack, flags, payload, bytes missing). One pass over chosen frames of
    chosen connections: the answers that name a connection (connids), the frames evidence copies."""
    for frame, ts_ns, linktype, data, orig_len in iter_records(path):
        if frame < first:
            continue
        if frame > last:
            break
        decoded = _decode(linktype, data, orig_len)
        if decoded.__class__ is tuple:
            yield frame, ts_ns, linktype, data, orig_len, decoded
