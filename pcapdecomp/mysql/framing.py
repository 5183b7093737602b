"""Split one direction's byte stream into MySQL packets, keeping when and where each began and ended.

Sans-IO: `feed()` takes in-order stream bytes with the capture timestamp, frame number and stream offset of their
first byte, and returns complete logical packets (a payload of 0xFFFFFF bytes continues in the next physical
packet; the continuation is joined here). Only a prefix of each payload is kept (`keep` bytes), so a hostile length
field or a 1 GB result costs no memory: the rest is counted, not stored.

`CompressedDeframer` undoes the compressed protocol (zlib, or zstd when negotiated) and yields the inner stream
with the timestamps of the compressed packets that carried it.
"""

from __future__ import annotations

import zlib
from array import array
from dataclasses import dataclass

from .wire import MAX_PACKET, WireError

try:  # zstd is optional at import time so the module loads everywhere; pyproject depends on it
    import zstandard
except ImportError:  # pragma: no cover
    zstandard = None


@dataclass(slots=True)
class Packet:
    seq: int  # sequence id of the first physical packet
    last_seq: int  # sequence id of the last physical packet (differs for 16 MiB continuations)
    length: int  # full logical payload length on the wire
    payload: bytes  # the first `keep` bytes of the payload
    first_ts: int
    first_frame: int
    first_offset: int  # stream offset of the first header byte
    last_ts: int
    last_frame: int
    end_offset: int  # stream offset just past the last byte
    wire_bytes: int  # headers + payload

    @property
    def cut(self) -> bool:
        return len(self.payload) < self.length


class PacketFramer:
    def __init__(self, keep: int = 1 << 20):
        self.keep = keep
        self._hdr = bytearray()
        self._remaining = 0  # payload bytes still to come for the current physical packet
        self._phys_len = -1  # -1: reading a header
        self._parts: list[bytes] = []
        self._kept = 0
        self._pkt: Packet | None = None

    @property
    def idle(self) -> bool:
        """True at a packet boundary (nothing half-read)."""
        return self._pkt is None and not self._hdr

    def reset(self) -> None:
        self.__init__(self.keep)

    def partial(self) -> Packet | None:
        """The packet being read, with the payload received so far (its header must be complete)."""
        pkt = self._pkt
        if pkt is None or pkt.wire_bytes < 4:
            return None
        pkt.payload = b"".join(self._parts)
        return pkt

    def feed(self, data: bytes, ts: int, frame: int, offset: int) -> list[Packet]:
        return self.feed_from(data, 0, ts, frame, offset, False)[0]

    def feed_from(self, data: bytes, pos: int, ts: int, frame: int, offset: int,
                  one: bool, limit: int = 0) -> tuple[list[Packet], int]:
        """Frame data[pos:] (`offset` is the stream offset of data[0]). With `one`, stop after the first complete
        packet and return where it ended, so that the caller can look at the rest itself; with `limit`, after that
        many."""
        if one:
            limit = 1
        out: list[Packet] = []
        n = len(data)
        keep = self.keep
        while pos < n:
            if self._pkt is None and pos + 4 <= n and not self._hdr:
                # common case: a whole packet inside `data`, at a packet boundary
                length = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
                end = pos + 4 + length
                if length < MAX_PACKET and end <= n:
                    seq = data[pos + 3]
                    out.append(Packet(seq, seq, length, data[pos + 4 : pos + 4 + min(length, keep)], ts, frame,
                                      offset + pos, ts, frame, offset + end, 4 + length))
                    pos = end
                    if len(out) == limit:
                        break
                    continue
            if self._phys_len < 0:
                if self._pkt is None and not self._hdr:
                    self._pkt = Packet(0, 0, 0, b"", ts, frame, offset + pos, ts, frame, 0, 0)
                take = min(4 - len(self._hdr), n - pos)
                self._hdr += data[pos : pos + take]
                pos += take
                if len(self._hdr) < 4:
                    break
                pkt = self._pkt
                length = self._hdr[0] | self._hdr[1] << 8 | self._hdr[2] << 16
                seq = self._hdr[3]
                if pkt.wire_bytes == 0:
                    pkt.seq = seq
                pkt.last_seq = seq
                pkt.wire_bytes += 4
                self._hdr.clear()
                self._phys_len = length
                self._remaining = length
            take = min(self._remaining, n - pos)
            if take:
                room = self.keep - self._kept
                if room > 0:
                    self._parts.append(data[pos : pos + min(take, room)])
                    self._kept += min(take, room)
                pos += take
                self._remaining -= take
                self._pkt.wire_bytes += take
                self._pkt.length += take
            if self._remaining == 0:
                pkt = self._pkt
                pkt.last_ts, pkt.last_frame, pkt.end_offset = ts, frame, offset + pos
                continued = self._phys_len == MAX_PACKET
                self._phys_len = -1
                if not continued:
                    pkt.payload = b"".join(self._parts) if len(self._parts) != 1 else self._parts[0]
                    out.append(pkt)
                    self._pkt = None
                    self._parts = []
                    self._kept = 0
                    if len(out) == limit:
                        break
        return out, pos


COMPRESSED_HEADER = 7
# Deflate cannot exceed 1032:1; zstd can (16 MiB of one repeated byte fit in a few hundred bytes), and a few KB of
# capture would then expand into millions of protocol packets (each a request to track, or a row to read). A
# compressed packet that claims more than this ratio is not inflated: a counted protocol violation.
MAX_INFLATION = 1032
# The budget of an input's cost (docs/security.md): the commands one compressed packet may carry. A client sends one
# command a packet, or a pipelined batch of a few hundred; 24 KB of zlib can carry 3 million COM_PINGs, each an
# exchange to track. The packets past it are not read: a counted violation ('budget').
MAX_COMMANDS_PER_COMPRESSED = 4096
# The budget of statement text one input may cost in total (COM_QUERY and COM_STMT_PREPARE text kept, after
# --max-sql-bytes): distinct long statements cost their text several times over (request, Python string, Arrow
# column, fingerprint), and 300 of 1 MiB fit in a 580 KB gzip capture. Past it, a statement longer than
# SQL_BUDGET_PREFIX keeps that prefix, is marked sql-cut and counts as a violation ('budget: …').
SQL_BUDGET = 256 << 20
SQL_BUDGET_PREFIX = 256
# The exchanges one input may give: ROWS_PER_INPUT_BYTE per byte of the input as stored (a gzip capture's
# compressed bytes), and at least MIN_ROW_BUDGET. A captured exchange costs tens of bytes of frame and headers, and
# a recorded capture gzips a few times at most; 24 KB of gzip or of compressed protocol can otherwise carry
# millions of COM_PINGs. A request spends its row when it starts; past the budget, requests are not read: each one
# a violation ('budget: …').
ROWS_PER_INPUT_BYTE = 1
MIN_ROW_BUDGET = 1 << 16
ZSTD_MAX_WINDOW = 1 << 25  # a frame header may ask for a 2 GiB window; MySQL's packets are at most 16 MiB


class InputBudget:
    """What is left of an input's budgets, shared by all its connections: `left[0]` bytes of statement text
    (SQL_BUDGET), `left[1]` exchanges (rows). An array so that the native lane (_lane.c) spends from the same
    cells, in capture order as Python does."""

    __slots__ = ("total", "rows_total", "left")

    def __init__(self, total: int = SQL_BUDGET, rows_total: int = 1 << 62):
        self.total = total
        self.rows_total = rows_total
        self.left = array("q", [total, rows_total])

    def row(self) -> bool:
        """An exchange spent from the budget; False when none is left (the caller counts the cut)."""
        left = self.left
        if left[1] <= 0:
            return False
        left[1] -= 1
        return True

    def keep(self, text: bytes) -> bytes | None:
        """`text` spent from the budget when it fits (or is at most SQL_BUDGET_PREFIX bytes: kept, not spent); else
        None: the caller keeps text[:SQL_BUDGET_PREFIX] and counts the cut."""
        n = len(text)
        left = self.left
        if n <= left[0]:
            left[0] -= n
            return text
        return text if n <= SQL_BUDGET_PREFIX else None


@dataclass(frozen=True, slots=True)
class CompressedPacket:
    inner: bytes  # the (inflated) bytes of the inner packet stream it carries
    first_ts: int
    first_frame: int
    first_offset: int
    last_ts: int
    last_frame: int
    end_offset: int


class CompressedDeframer:
    """Compressed protocol: [3-byte compressed length][1-byte seq][3-byte uncompressed length][payload].

    An uncompressed length of 0 means the payload is stored as is. Each compressed packet is independent.
    """

    def __init__(self, algorithm: str = "zlib"):
        self.algorithm = algorithm
        self._buf = bytearray()
        self._start = (0, 0, 0)

    def reset(self) -> None:
        self._buf.clear()

    def feed(self, data: bytes, ts: int, frame: int, offset: int) -> list[CompressedPacket]:
        out = []
        pos, n = 0, len(data)
        while pos < n:
            if not self._buf:
                self._start = (ts, frame, offset + pos)
            need = COMPRESSED_HEADER - len(self._buf)
            if need > 0:
                self._buf += data[pos : pos + need]
                pos += min(need, n - pos)
                if len(self._buf) < COMPRESSED_HEADER:
                    break
            total = COMPRESSED_HEADER + (self._buf[0] | self._buf[1] << 8 | self._buf[2] << 16)
            take = min(total - len(self._buf), n - pos)
            self._buf += data[pos : pos + take]
            pos += take
            if len(self._buf) < total:
                break
            uncompressed_len = self._buf[4] | self._buf[5] << 8 | self._buf[6] << 16
            stored = bytes(self._buf[COMPRESSED_HEADER:])
            self._buf.clear()
            inner = stored if uncompressed_len == 0 else self._inflate(stored, uncompressed_len)
            out.append(CompressedPacket(inner, *self._start, ts, frame, offset + pos))
        return out

    def _inflate(self, stored: bytes, expected: int) -> bytes:
        if expected > MAX_INFLATION * max(len(stored), 1):
            raise WireError(f"compressed packet of {len(stored)} bytes claims {expected} bytes: more than "
                            f"{MAX_INFLATION}x is not inflated")
        limit = min(expected, MAX_PACKET) + 1  # never inflate beyond what the header promises
        if self.algorithm == "zstd" or stored[:4] == b"\x28\xb5\x2f\xfd":
            if zstandard is None:  # pragma: no cover
                raise WireError("zstd payload but the zstandard package is missing")
            try:
                with zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).stream_reader(stored) as reader:
                    return reader.read(limit)
            except zstandard.ZstdError as exc:
                raise WireError(f"cannot inflate zstd payload: {exc}") from None
        try:
            return zlib.decompressobj().decompress(stored, limit)
        except zlib.error as exc:
            raise WireError(f"cannot inflate zlib payload: {exc}") from None
