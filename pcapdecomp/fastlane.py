"""The fast lane: extraction's common path in C (pcapdecomp/_lane.c), with the Python stages as its twin.

A busy capture is mostly the same few things: in-order segments of established MySQL connections carrying one
COM_QUERY or COM_STMT_EXECUTE at a time and its OK or result set, and segments of connections that are not parsed
(other TCP, or another worker's part with `--jobs`). Per packet and per exchange, Python costs ~100 µs for that;
the lane does it in C and writes the exchange rows itself.

How the work is shared:
- The lane reads the records of a classic pcap or pcapng file (gzip or not) and decodes
  their link, IP and TCP headers. A record that is not a plain TCP segment of a connection the lane holds comes
  back as the raw record, and Python handles it exactly as without the lane (capture._decode, FlowTracker).
- After Python has handled a segment, the connection is handed to the lane ("promoted") if it is at a point the
  lane can continue from: not parsed, or MySQL in the command phase with nothing pending, half-read, held out of
  order, compressed or encrypted, and with its EOF convention known.
- Whatever the lane does not recognise as its common path (SYN/FIN/RST, out-of-order or retransmitted data,
  another command, an error, several result sets, a cursor, a packet split by the snaplen, pipelining, …) makes
  it give the connection back ("bail"): it hands over the counters of the exchanges it finished, forgets the
  exchange in progress, and returns copies of that exchange's records, which Python replays. So Python always
  resumes at an exchange boundary, with the state it would have had. At the end of the capture every connection
  is given back the same way, and FlowTracker.finish runs as usual.

Rows, counters and statistics are identical with and without the lane: tests compare whole extractions. Set
PCAPDECOMP_NO_LANE=1 to read with Python alone.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from socket import AF_INET, AF_INET6, inet_pton

from .capture import CaptureReader, _Damaged, _decode, count_outcome, open_capture
from .errors import InputError, PcapdecompError
from .flows import Flow, FlowTracker
from .mysql.connection import CLIENT, COMMAND, SERVER
from .mysql.wire import command_name
from .schema import CATEGORY, EXCHANGE_COLUMNS

try:
    from ._lane import ROW_KINDS, Lane, Segments
except ImportError:  # no compiler when installed: Python reads everything
    Lane, Segments, ROW_KINDS = None, None, ""

NATIVE = Lane is not None
CHUNK = 1 << 20
_KINDS = {"other": 2, "foreign": 3}


def usable(reader: CaptureReader) -> bool:
    """The lane can read this capture: the extension is built, the file is classic pcap or pcapng with at least one
    packet (gzip-compressed or not), and it is not switched off."""
    return (NATIVE and (reader.pcap_layout is not None or reader.pcapng_packets)
            and not os.environ.get("PCAPDECOMP_NO_LANE"))


def _layout(reader: CaptureReader) -> dict:
    """How the lane reads the records of `reader` from where its file now stands: a classic pcap after its file
    header; a pcapng file from its first byte (the reader rewinds it; the lane counts the blocks again)."""
    layout = reader.pcap_layout
    if layout is not None:
        return {"pcapng": False, "big_endian": layout.big_endian, "frac_to_ns": layout.frac_to_ns,
                "linktype": layout.linktype, "limit": layout.limit, "pos": 24}
    reader.rewind()
    return {"pcapng": True, "big_endian": False, "frac_to_ns": 1, "linktype": 0, "limit": 0, "pos": 0}


def reads(path: str | os.PathLike) -> bool:
    """The lane would read this capture (False also for a file that cannot be opened: extraction says why)."""
    if not NATIVE or os.environ.get("PCAPDECOMP_NO_LANE"):
        return False
    try:
        with open_capture(path) as reader:
            return usable(reader)
    except PcapdecompError:
        return False


def _address(text: str) -> bytes:
    return inet_pton(AF_INET6 if ":" in text else AF_INET, text)


def run(reader: CaptureReader, tracker: FlowTracker, add_columns: Callable[[list, str], None],
        fingerprints: Callable, row_ends: Callable[[Flow], tuple[tuple, tuple]], commands: Counter,
        progress: Callable[[int, int, int], None] | None = None) -> int:
    """Read every record of `reader` into `tracker`, the common path in C. The rows of exchanges finished in C
    (exchanges.extract's emit, row for row) are handed over by column, a batch at a time: `add_columns(values,
    ROW_KINDS)` (tables.columns_batch). `row_ends(flow)` gives the parts of a row that are constant for a
    connection. Returns how many records the lane consumed itself."""
    stats = reader.stats
    link_types = stats.link_types
    flows = tracker._flows
    feed = tracker.segment_fields
    from .exchanges import ROWS_PER_BATCH

    # text columns that become categoricals are dictionary-coded by the lane as it writes them
    kinds = "".join("c" if kind == "o" and column.dtype == CATEGORY else kind
                    for kind, column in zip(ROW_KINDS, EXCHANGE_COLUMNS))
    lane = Lane(**_layout(reader), batch=ROWS_PER_BATCH, fingerprints=fingerprints, query=command_name(0x03),
                execute=command_name(0x17), ok="ok", resultset="resultset", coded=kinds)
    finishing = False

    def handle(record) -> tuple | None:
        """A record the lane gave back: what capture._fields and the extraction loop do with it. Returns the
        flow key of a TCP segment."""
        frame, ts_ns, linktype, data, orig_len = record
        stats.frames += 1
        link_types[linktype] = link_types.get(linktype, 0) + 1
        result = _decode(linktype, data, orig_len)
        if result.__class__ is not tuple:
            count_outcome(stats, result)
            return None
        (src, dst), sport, dport, seq, ack, flags, payload, missing = result
        stats.frames_tcp += 1
        if missing:
            stats.frames_truncated += 1
        feed(frame, ts_ns, src, sport, dst, dport, seq, ack, flags, payload, missing)
        a, b = (src, sport), (dst, dport)
        return (a, b) if a <= b else (b, a)

    def promote(flow: Flow) -> None:
        kind = flow.kind
        if kind in _KINDS:
            lane.promote(flow, _address(flow.a[0]), flow.a[1], _address(flow.b[0]), flow.b[1], _KINDS[kind],
                         flow.owned)
            return
        if kind != "mysql":
            return
        conn = flow.mysql
        if (conn.tls or conn.phase != COMMAND or conn._pending or conn.deprecate_eof is None
                or conn.query_attributes is True or not (conn._synced[0] and conn._synced[1])
                or conn._deframers[0] is not None or conn._deframers[1] is not None
                or not (conn._framers[0].idle and conn._framers[1].idle)
                or (conn.counters.midstream and conn._count == 0)):
            return
        to_server, to_client = flow.to_server, flow.to_client
        if to_server.base is None or to_client.base is None or to_server._held or to_client._held:
            return
        client, server = flow.client, flow.server
        prefix, suffix = row_ends(flow)
        qa = 2 if conn.query_attributes is None else 0
        lane.promote_mysql(flow, _address(client[0]), client[1], _address(server[0]), server[1],
                           to_server.base, to_server.next, to_client.base, to_client.next, conn._count,
                           conn.deprecate_eof, qa, conn.max_sql_bytes, conn._framers[CLIENT].keep,
                           conn._statements, prefix, suffix)

    def settle(header) -> int:
        """Take back a connection from the lane: its committed counters. Returns how many records follow."""
        (flow, frames, last_ts, segs_c, bytes_c, segs_s, bytes_s, exchanges, count, other_frames, other_bytes,
         replays) = header
        flow.frames += frames
        if last_ts is not None:
            flow.last_ts = last_ts
        if flow.kind == "mysql":
            counters = flow.mysql.counters
            for half, segs, nbytes, direction in ((flow.to_server, segs_c, bytes_c, CLIENT),
                                                  (flow.to_client, segs_s, bytes_s, SERVER)):
                half.next += nbytes
                half.stats.segments += segs
                half.stats.bytes_delivered += nbytes
                counters.mysql_bytes[direction] += nbytes
                counters.parsed_bytes[direction] += nbytes
            if exchanges:
                flow.exchanges += exchanges
                flow.mysql._count = count
                flow.mysql._last_finished = None  # an exchange the lane finished: not a PREPARE
        tracker.other_tcp_frames += other_frames
        tracker.other_tcp_bytes += other_bytes
        return replays

    def drain() -> None:
        next_item = lane.next
        while True:
            item = next_item()
            if item is None:
                return
            if item.__class__ is int:
                add_columns(lane.take_columns(), kinds)
                continue
            size = len(item)
            if size == 5:
                key = handle(item)
                if key is not None and not finishing:
                    flow = flows.get(key)
                    if flow is not None:
                        promote(flow)
            elif size == 3:
                _, what, pos = item
                raise _Damaged(what, pos)
            else:
                flow = item[0]
                for _ in range(settle(item)):
                    handle(next_item())
                if not finishing:
                    a, b = flow.a, flow.b
                    if flows.get((a, b) if a <= b else (b, a)) is flow:
                        promote(flow)

    reader._iterated = True
    read = reader._file.read
    total = stats.bytes_file
    damage = None
    try:
        while True:
            chunk = read(CHUNK)
            if chunk:
                lane.feed(chunk)
            else:
                lane.eof()
            drain()
            if progress is not None:
                progress(reader.bytes_read, total, lane.counts()[0])
            if not chunk:
                break
    except _Damaged as err:
        damage = str(err)
    except OSError as err:
        raise InputError(f"cannot read capture file {reader.path}: {err}") from None
    reader._note_damage(damage)
    finishing = True
    lane.finish()
    drain()
    add_columns(lane.take_columns(), kinds)
    (_frames, fast, first_ts, last_ts, _pos, queries, executes, bad_ts, sections, interfaces, unknown_blocks,
     if_drops, fast_link_types) = lane.counts()
    stats.frames += fast
    stats.frames_bad_ts += bad_ts
    stats.frames_tcp += fast
    for linktype, n in fast_link_types.items():
        link_types[linktype] = link_types.get(linktype, 0) + n
    if reader.pcap_layout is None:  # pcapng: the lane read the file from its first byte (the blocks too)
        stats.sections, stats.interfaces, stats.unknown_blocks = sections, interfaces, unknown_blocks
        stats.if_drops.update(if_drops)
    if first_ts is not None:
        if stats.first_ts_ns is None:
            stats.first_ts_ns = first_ts
        stats.last_ts_ns = last_ts
    for code, n in ((0x03, queries), (0x17, executes)):
        if n:
            commands[command_name(code)] += n
    return fast


def segment_keys(reader: CaptureReader, flows: set[tuple[str, int, str, int]]) -> list[bytes]:
    """match.read_segments_of's pass in C: the keys and times of every TCP segment of the given connections
    ((client ip, port, server ip, port), either direction), read from the same records as the lane (times checked
    alike). Returns [k1, k2, ts] as the bytes of uint64, uint64 and int64 arrays; a damaged file is read up to the
    damage. `reader` must be `usable`."""
    wanted = []
    for client, client_port, server, server_port in flows:
        try:
            wanted.append((_address(client), client_port, _address(server), server_port))
        except OSError:  # not an address any segment can carry
            continue
    scan = Segments(**_layout(reader), flows=wanted)
    reader._iterated = True
    read = reader._file.read
    try:
        while True:
            chunk = read(CHUNK)
            if chunk:
                scan.feed(chunk)
            else:
                scan.eof()
            scan.run()
            if not chunk:
                return scan.take()
    except OSError as err:
        raise InputError(f"cannot read capture file {reader.path}: {err}") from None
