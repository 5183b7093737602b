"""The fast lane: extraction's common path in C (pcapdecomp/_lane.c), with the Python stages as its twin.

A busy capture is mostly the same few things: in-order segments of established MySQL connections carrying one
COM_QUERY or COM_STMT_EXECUTE at a time and its OK or result set, and segments of connections that are not parsed
(other TCP, or another worker's part with `--jobs`). Per packet and per exchange, Python costs ~100 µs for that;
the lane does it in C and writes the exchange rows itself.

How the work is shared:
- The lane reads the records of a capture file (classic pcap or pcapng, gzip or not) and decodes their link, IP
  and TCP headers. A record that is not a plain TCP segment of a connection the lane holds comes back as the raw
  record, and Python handles it exactly as without the lane (capture.frame_segment, FlowTracker).
- After Python has handled a segment, the connection is handed to the lane ("promoted") if it is at a point the
  lane can continue from: not parsed, or MySQL in the command phase with nothing pending, half-read, held out of
  order, compressed or encrypted, and with its EOF convention known.
- Whatever the lane does not recognise as its common path (SYN/FIN/RST, out-of-order or retransmitted data,
  another command, an error, several result sets, a cursor, a packet split by the snaplen, pipelining, …) makes
  it give the connection back ("bail"): it hands over the counters of the exchanges it finished, forgets the
  exchange in progress, and returns copies of that exchange's records, which Python replays. So Python always
  resumes at an exchange boundary, with the state it would have had. At the end of the capture every connection
  is given back the same way, and FlowTracker.finish runs as usual.

The contract between the lane and the Python core is public and named; neither reaches into the other's state:
- the exchange row: schema.EXCHANGE_COLUMNS. Every build writes it as the C header pcapdecomp/_lane_columns.h
  (schema.c_header: COL_<NAME>, NCOLS), the lane names its columns by it, and a lane built from another layout is
  not used (its COLUMNS differ). Python writes the same rows by name (exchanges.exchange_row).
- the records: CaptureReader.hand_over gives them to the lane (a RecordSource), capture.frame_segment counts and
  decodes those it gives back, CaptureReader.records_ended ends them.
- the connections: FlowTracker.connection finds one; MySQLConnection.handover (a Handover, with the connection's
  PreparedStatements, whose `executed` the lane calls) and HalfStream.position say what the lane may take;
  FlowTracker.take_back (a HandBack) takes it back.
- the lane's answers are typed records made in C (named tuples): Record, GivenBack, RowsReady, Damage, Counts.
- the response grammar the lane reads is mysql/responses.py's (ResponseReader); its C comments name the Python
  function each part mirrors.

This module is the only one that knows the lane exists: `read_capture` and `segment_keys` read with it where it
can and with their Python twins otherwise; `reads` says whether it would. Rows, counters and statistics are
identical with and without the lane: tests compare whole extractions. Set PCAPDECOMP_NO_LANE=1 to read with
Python alone.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from socket import AF_INET, AF_INET6, inet_pton

import numpy as np

from ..core.errors import InputError, PcapdecompError
from ..core.schema import CATEGORY, EXCHANGE_COLUMNS
from ..mysql.wire import command_name
from .capture import CaptureReader, RecordSource, frame_segment, open_capture
from .flows import Flow, FlowTracker

try:
    from .._lane import COLUMNS, ROW_KINDS, Damage, GivenBack, Lane, Record, RowsReady, Segments
except ImportError:  # no compiler when installed: Python reads everything
    Lane, Segments, ROW_KINDS, COLUMNS = None, None, "", ()
if COLUMNS != tuple(c.name for c in EXCHANGE_COLUMNS):  # built from another core/schema.py: rebuild (setup.py)
    Lane, Segments, ROW_KINDS = None, None, ""

NATIVE = Lane is not None
CHUNK = 1 << 20
_KINDS = {"other": 2, "foreign": 3}
# the lane numbers the frames of each file it reads from 1; a later file of a capture point continues the numbers
_FRAME_COLUMNS = [i for i, c in enumerate(EXCHANGE_COLUMNS) if c.name.endswith("_frame")]


def _usable(reader: CaptureReader) -> bool:
    """The lane can read this capture: the extension is built, the file is classic pcap or pcapng with at least one
    packet (gzip-compressed or not), and it is not switched off."""
    return (NATIVE and (reader.pcap_layout is not None or reader.pcapng_packets)
            and not os.environ.get("PCAPDECOMP_NO_LANE"))


def _layout(source: RecordSource) -> dict:
    """How the lane reads the records handed over: a classic pcap file after its header, a pcapng file from its
    first byte (the lane counts its blocks again)."""
    layout = source.layout
    if layout is not None:
        return {"pcapng": False, "big_endian": layout.big_endian, "frac_to_ns": layout.frac_to_ns,
                "linktype": layout.linktype, "limit": layout.limit, "pos": 24}
    return {"pcapng": True, "big_endian": False, "frac_to_ns": 1, "linktype": 0, "limit": 0, "pos": 0}


def reads(path: str | os.PathLike) -> bool:
    """The lane would read this capture (False also for a file that cannot be opened: extraction says why). A
    capture the lane reads is not worth splitting between processes (read/extract.py)."""
    if not NATIVE or os.environ.get("PCAPDECOMP_NO_LANE"):
        return False
    try:
        with open_capture(path) as reader:
            return _usable(reader)
    except PcapdecompError:
        return False


def _address(text: str) -> bytes:
    return inet_pton(AF_INET6 if ":" in text else AF_INET, text)


@dataclass(frozen=True)
class ExcerptPlan:
    """The records of excerpt_copy's file, read by an extraction without the file (the repair's re-read,
    repair._reread_natively): the segments `frames` (sorted frame numbers of segments excerpt_scan found for `keys`)
    of the capture, each as excerpt_copy writes it (so decoded into the same fields, link type RAW), with `blobs[i]`
    (excerpt_record's) before the one of ordinal insert_at[i] (after the last when it is len(frames)), numbered from
    1 in that order. read_capture reads them, and stops reading the capture after the last. Their times are the
    capture's, checked once as extraction checks a capture's (capture.repaired_time), not again in their new order
    as a reader of that file would: the extraction counts no frames_bad_ts. The stats that describe the file
    (path, size, format, pcapng blocks) are the capture's."""

    keys: list[tuple[str, int, str, int]]
    frames: np.ndarray  # int64
    insert_at: np.ndarray  # int64, one per blob, sorted
    blobs: list[bytes]


def read_capture(reader: CaptureReader, tracker: FlowTracker, *, add_columns: Callable[[list, str], None],
                 connection_row: Callable[[Flow], tuple], fingerprints: Callable[[str | None, str], tuple],
                 commands: Counter, batch_rows: int, progress: Callable[[int, int, int], None] | None = None,
                 excerpt: ExcerptPlan | None = None) -> int:
    """Read every record of `reader` into `tracker` (FlowTracker.segment_fields, whose emit gets the exchanges read
    in Python): with the lane when it can, else in Python, with the same outcome. The lane writes the rows of the
    exchanges it reads itself (exchanges.extract's, value for value) and hands them over by column, `batch_rows`
    at a time (fewer when they hold 16 MiB of text): `add_columns(values, kinds)` (tables.columns_batch). It
    copies the connection's columns from `connection_row(flow)` (a row of schema.EXCHANGE_COLUMNS), takes each
    statement's fingerprint and Query ID from `fingerprints(sql, command)` (a function of its arguments' values:
    the lane keeps what it said of a prepared statement's text), and counts its exchanges' commands into
    `commands`.
    `progress(bytes_done, bytes_total, frames_done)` is called now and then. Returns how many records the lane
    read itself (0 when Python read them all).
    With `excerpt` the records read are that plan's (only the lane reads those: the capture must be one it reads,
    as excerpt_scan's answer says)."""
    if excerpt is not None and (type(reader) is not CaptureReader or not _usable(reader)):
        raise ValueError(f"the lane cannot read an excerpt plan of {reader.path}")
    if not _usable(reader):
        n = 0
        feed = tracker.segment_fields
        for fields in reader.segment_fields():
            feed(*fields)
            n += 1
            if progress is not None and n & 0x3FFF == 0:
                progress(reader.bytes_read, reader.stats.bytes_file, reader.stats.frames)
        return 0

    stats = reader.stats
    link_types = stats.link_types
    feed = tracker.segment_fields
    connection = tracker.connection
    frame_base = tracker.frame_base
    source = reader.hand_over()

    # text columns that become categoricals are dictionary-coded by the lane as it writes them
    kinds = "".join("c" if kind == "o" and column.dtype == CATEGORY else kind
                    for kind, column in zip(ROW_KINDS, EXCHANGE_COLUMNS, strict=True))
    plan = None if excerpt is None else (
        _directed(excerpt.keys), np.ascontiguousarray(excerpt.frames, dtype=np.int64),
        np.ascontiguousarray(excerpt.insert_at, dtype=np.int64), list(excerpt.blobs))
    lane = Lane(**_layout(source), batch=batch_rows, fingerprints=fingerprints, query=command_name(0x03),
                execute=command_name(0x17), ok="ok", resultset="resultset", coded=kinds, excerpt=plan,
                budget_left=tracker.budget.left)
    finishing = False

    def handle(record: Record) -> Flow | None:
        """A record the lane gave back: read as the reader reads its own. Returns the open connection of a TCP
        segment."""
        fields = frame_segment(stats, *record)
        return None if fields is None else feed(*fields)

    def promote(flow: Flow) -> None:
        """Hand `flow` to the lane if it is at a point the lane can continue from."""
        kind = flow.kind
        if kind in _KINDS:
            lane.promote(flow, _address(flow.a[0]), flow.a[1], _address(flow.b[0]), flow.b[1], _KINDS[kind],
                         flow.owned)
            return
        if kind != "mysql":
            return
        state = flow.mysql.handover()
        # beyond what the lane reads: the EOF convention not known yet, query attributes before the text of every
        # COM_QUERY, problems it does not write
        if state is None or state.deprecate_eof is None or state.query_attributes is True or state.next_problems:
            return
        to_server, to_client = flow.to_server.position, flow.to_client.position
        if to_server is None or to_client is None:
            return
        client, server = flow.client, flow.server
        lane.promote_mysql(flow, _address(client[0]), client[1], _address(server[0]), server[1], to_server, to_client,
                           state.count, state.deprecate_eof, 2 if state.query_attributes is None else 0,
                           state.max_sql_bytes, state.request_keep, state.statements, connection_row(flow))

    def take_rows() -> None:
        values = lane.take_columns()
        if values and len(values[0]):
            if frame_base:  # a later file of a capture point
                for i in _FRAME_COLUMNS:
                    values[i] = (np.frombuffer(values[i], dtype=np.int64) + frame_base).tobytes()
            add_columns(values, kinds)

    def drain() -> Damage | None:
        """Run the lane over what it was fed, doing what it asks of Python. Returns the damage it stopped at."""
        next_item = lane.next
        while True:
            item = next_item()
            kind = item.__class__
            if kind is Record:
                flow = handle(item)
                if flow is not None and not finishing:
                    promote(flow)
            elif item is None:
                return None
            elif kind is RowsReady:
                take_rows()
            elif kind is GivenBack:
                flow = item.flow
                tracker.take_back(flow, item)  # a GivenBack has flows.HandBack's fields
                for _ in range(item.replays):  # the records of the exchange it was reading: Python reads them
                    handle(next_item())
                if not finishing and connection(flow.a, flow.b) is flow:
                    promote(flow)
            elif kind is Damage:
                return item
            else:
                raise TypeError(f"the lane handed over {item!r}")

    fill = _filler(source, lane)
    total = stats.bytes_file
    damage = None
    try:
        while True:
            came = fill(CHUNK)
            if not came:
                lane.eof()
            damage = drain()
            if damage is not None or (plan is not None and lane.excerpt_done()):
                break
            if progress is not None:
                progress(reader.bytes_read, total, lane.counts().records)
            if not came:
                break
    except OSError as err:
        raise InputError(f"cannot read capture file {reader.path}: {err}") from None
    if damage is None:
        reader.records_ended(None)
    else:
        reader.records_ended(damage.what, damage.offset)
    finishing = True
    lane.finish()
    drain()
    take_rows()
    counts = lane.counts()
    stats.frames += counts.consumed
    stats.frames_bad_ts += counts.bad_ts
    stats.frames_tcp += counts.consumed
    for linktype, n in counts.link_types.items():
        link_types[linktype] = link_types.get(linktype, 0) + n
    if source.layout is None and plan is None:  # pcapng: the lane read the file from its first byte (the blocks too)
        stats.sections, stats.interfaces = counts.sections, counts.interfaces
        stats.unknown_blocks = counts.unknown_blocks
        stats.if_drops.update(counts.if_drops)
    if counts.first_ts is not None:
        if stats.first_ts_ns is None:
            stats.first_ts_ns = counts.first_ts
        stats.last_ts_ns = counts.last_ts
    for code, n in ((0x03, counts.queries), (0x17, counts.executes)):
        if n:
            commands[command_name(code)] += n
    return counts.consumed


def segment_keys(reader: CaptureReader, flows: set[tuple[str, int, str, int]]) -> list:
    """clocks.read_segments_of's pass: the keys and times of every TCP segment of the given connections ((client
    ip, port, server ip, port), either direction). Returns [k1, k2, ts], each the buffer of a uint64, uint64 and
    int64 array: k1 = seq << 32 | ack, k2 = wire payload length << 9 | flags << 1 | direction (1: server to
    client). Read by the lane when it can, from the same records as extraction (times checked alike; a damaged
    file up to the damage), else in Python. A capture point of several files (sources.PointReader) is read file by
    file, as the extraction reads it: each by the lane where it can."""
    if hasattr(reader, "files"):
        parts = [segment_keys(part, flows) for part, _ in reader.files()]
        return [np.concatenate([np.frombuffer(part[i], dtype=dtype) for part in parts]) if parts
                else np.zeros(0, dtype=dtype) for i, dtype in enumerate((np.uint64, np.uint64, np.int64))]
    if not _usable(reader):
        return _segment_keys_in_python(reader, flows)
    wanted = []
    for client, client_port, server, server_port in flows:
        try:
            wanted.append((_address(client), client_port, _address(server), server_port))
        except OSError:  # not an address any segment can carry
            continue
    source = reader.hand_over()
    scan = Segments(**_layout(source), flows=wanted)
    _run_through(reader, source, scan)
    return scan.take()


def _filler(source: RecordSource, machine) -> Callable[[int], int]:
    """How the lane and its passes (`machine`: a Lane, Segments or Excerpt) read `source`: fill(n) gives the machine
    up to n more bytes and returns how many came (0 at the end). Where the source reads into a buffer, straight
    into the machine's own (machine.fill): the file is not read into a chunk of ours first and copied from it, a
    copy of every byte of the capture (docs/speed.md, 2026-12-02); else a chunk read and fed."""
    if source.readinto is not None:
        readinto, machine_fill = source.readinto, machine.fill
        return lambda n: machine_fill(readinto, n)
    read, feed = source.read, machine.feed

    def read_and_feed(n: int) -> int:
        chunk = read(n)
        if chunk:
            feed(chunk)
        return len(chunk)

    return read_and_feed


def _run_through(reader: CaptureReader, source: RecordSource, machine, write: Callable[[bytes], None] | None = None
                 ) -> None:
    """Feed the whole of `source` (the records `reader` handed over) to a lane pass (Segments, Excerpt) chunk by
    chunk, running it after each; what a run returns goes to `write` when given."""
    fill = _filler(source, machine)
    try:
        while True:
            came = fill(CHUNK)
            if not came:
                machine.eof()
            out = machine.run()
            if out and write is not None:
                write(out)
            if not came:
                return
    except OSError as err:
        raise InputError(f"cannot read capture file {reader.path}: {err}") from None


def _segment_keys_in_python(reader: CaptureReader, flows: set[tuple[str, int, str, int]]) -> list[array]:
    """segment_keys in Python."""
    forward = flows
    reverse = {(si, sp, ci, cp) for ci, cp, si, sp in flows}
    columns = [array("Q"), array("Q"), array("q")]
    add1, add2, add_ts = (c.append for c in columns)
    for _, ts_ns, src_ip, src_port, dst_ip, dst_port, seq, ack, flags, payload, missing in reader.segment_fields():
        four = (src_ip, src_port, dst_ip, dst_port)
        if four in forward:
            direction = 0
        elif four in reverse:
            direction = 1
        else:
            continue
        add1((seq << 32) | ack)
        add2(((len(payload) + missing) << 9) | (flags << 1) | direction)
        add_ts(ts_ns)
    return columns


# ==== the repair stage's passes (pair/repair.py): the segments of chosen connections, scanned or copied ==============


def _directed(keys: list[tuple[str, int, str, int]]) -> list[tuple[bytes, int, bytes, int]]:
    """`keys` (source ip, port, destination ip, port) as _lane.Excerpt and a Lane's excerpt plan take them."""
    wanted = []
    for src, src_port, dst, dst_port in keys:
        try:
            wanted.append((_address(src), src_port, _address(dst), dst_port))
        except OSError:  # not an address a segment can carry: a key that matches nothing
            wanted.append((b"\0" * 4, 0, b"\0" * 4, 0))
    return wanted


def _excerpts(path: str | os.PathLike, keys: list[tuple[str, int, str, int]], copies: list[dict] | None = None,
              write: Callable[[bytes], object] | None = None) -> list | None:
    """Run _lane.Excerpt over the capture at `path` (see excerpt_scan, excerpt_copy), one per file: a file, or each
    file of a capture point of several (sources.PointReader.files(), in order), with `copies[i]` (frames, insert_at,
    blobs) for the i-th file when given (None there: the file is not read). Returns the Excerpts, or None when the
    lane cannot read one of the files (not built, switched off, a format it does not read)."""
    try:
        from .._lane import Excerpt
    except ImportError:
        return None
    wanted = _directed(keys)
    done = []
    with open_capture(path) as reader:
        parts = reader.files() if hasattr(reader, "files") else iter(((reader, 0),))
        for i, (part, _) in enumerate(parts):
            if type(part) is not CaptureReader or not _usable(part):
                return None
            copy = {} if copies is None else copies[i]
            if copy is None:
                done.append(None)
                continue
            source = part.hand_over()
            excerpt = Excerpt(**_layout(source), keys=wanted, **copy)
            _run_through(part, source, excerpt, write)
            done.append(excerpt)
    return done


def file_frames(path: str | os.PathLike) -> list[int] | None:
    """The frames of each file of the capture at `path` (one file, or a capture point's files in the order and
    with the skips of PointReader.files()), up to damage, as the extraction numbers them; None when the lane cannot
    read one of them."""
    done = _excerpts(path, [])
    return None if done is None else [excerpt.frames() for excerpt in done]


def per_file(frames: np.ndarray, insert_at: np.ndarray, blobs: list, counts: list[int]) -> list[tuple | None]:
    """An excerpt's `frames` (sorted frame numbers through a capture point's files), `insert_at` and `blobs`, cut
    by file (`counts`: file_frames): per file, its frames numbered within it and the blobs that go before one of them
    (with their ordinal among them; the blobs after the last frame: in its file, after it, and all of them in the
    first file when there is no frame), or None for a file with neither."""
    ends = np.cumsum(np.asarray(counts, dtype=np.int64))
    starts = ends - np.asarray(counts, dtype=np.int64)
    first = np.searchsorted(frames, starts, side="right")  # each file's first ordinal (its frames are > start)
    last = np.searchsorted(frames, ends, side="right")
    if len(frames):
        file_of = np.searchsorted(ends, frames[np.minimum(insert_at, len(frames) - 1)], side="left")
    else:
        file_of = np.zeros(len(insert_at), dtype=np.int64)
    out: list[tuple | None] = []
    for i in range(len(counts)):
        mine = np.flatnonzero(file_of == i)
        if first[i] == last[i] and not len(mine):
            out.append(None)
            continue
        out.append((np.ascontiguousarray(frames[first[i]:last[i]] - starts[i], dtype=np.int64),
                    np.ascontiguousarray(insert_at[mine] - first[i], dtype=np.int64), [blobs[j] for j in mine]))
    return out


def excerpt_scan(path: str | os.PathLike, keys: list[tuple[str, int, str, int]]) -> list[np.ndarray] | None:
    """Every TCP segment of the capture at `path` whose (source ip, port, destination ip, port) is one of `keys`,
    read by the lane (the records extraction reads, times checked alike, up to damage): int64 columns [key index
    (the first of equal keys), frame, ts_ns, seq, ack, flags, captured payload length, payload bytes the snaplen cut
    (capture._decode's `missing`)]. A capture point of several files is read file by file, its frames numbered
    through them. None when the lane cannot read this capture (the caller reads it in Python)."""
    done = _excerpts(path, keys)
    if done is None:
        return None
    if len(done) == 1:
        return [np.frombuffer(column, dtype=np.int64) for column in done[0].take()]
    parts, before = [], 0
    for excerpt in done:
        columns = [np.frombuffer(column, dtype=np.int64) for column in excerpt.take()]
        columns[1] = columns[1] + before
        before += excerpt.frames()
        parts.append(columns)
    return [np.concatenate([columns[i] for columns in parts]) for i in range(len(parts[0]))]


# the header of the classic pcap file excerpt_copy writes: nanosecond times, link type RAW (an IP header first)
EXCERPT_PCAP_HEADER = bytes.fromhex("4d3cb2a1" "0200" "0400" "00000000" "00000000" "00000400" "65000000")


def excerpt_record(ends: tuple[str, int, str, int], ts_ns: int, seq: int, ack: int, flags: int,
                   payload: bytes) -> bytes:
    """One TCP segment (source ip, port, destination ip, port) as a record of excerpt_copy's file, made alike (an IP
    header, a 20-byte TCP header): for its `blobs`."""
    src, src_port, dst, dst_port = ends
    family = AF_INET6 if ":" in src else AF_INET
    addresses = inet_pton(family, src) + inet_pton(family, dst)
    body = struct.pack("!HHIIBBHHH", src_port, dst_port, seq, ack, 0x50, flags, 0, 0, 0) + payload
    if family == AF_INET6:
        ip = struct.pack("!BBHHBB", 0x60, 0, 0, len(body) if len(body) <= 0xFFFF else 0, 6, 64) + addresses
    else:
        ip = struct.pack("!BBHHHBBH", 0x45, 0, len(body) + 20 if len(body) + 20 <= 0xFFFF else 0, 0, 0, 64, 6, 0) \
            + addresses
    size = len(ip) + len(body)
    return struct.pack("<IIII", ts_ns // 1_000_000_000, ts_ns % 1_000_000_000, size, size) + ip + body


def excerpt_payloads(records: bytes) -> list[bytes]:
    """The TCP payloads of the records excerpt_copy wrote (after EXCERPT_PCAP_HEADER: an IPv4 or IPv6 header, a
    20-byte TCP header), in order."""
    out, at = [], 0
    view = memoryview(records)
    while at < len(records):
        caplen = int.from_bytes(records[at + 8:at + 12], "little")
        data = view[at + 16:at + 16 + caplen]
        out.append(bytes(data[(20 if data[0] >> 4 == 4 else 40) + 20:]))
        at += 16 + caplen
    return out


def excerpt_copy(path: str | os.PathLike, keys: list[tuple[str, int, str, int]], frames: np.ndarray,
                 insert_at: np.ndarray, blobs: list[bytes], write: Callable[[bytes], object]) -> int | None:
    """The segments `frames` (sorted frame numbers of segments excerpt_scan found for `keys`) of the capture at
    `path`, as classic pcap records (after EXCERPT_PCAP_HEADER: nanoseconds, link type RAW, an IP and a 20-byte TCP
    header that capture._decode and the lane decode into the segment's fields), given to `write` chunk by chunk;
    `blobs[i]` (records made alike) goes in before the copy of frames[insert_at[i]] (after the last when
    insert_at[i] is len(frames)). Returns how many frames were copied, None when the lane cannot read the capture."""
    frames = np.ascontiguousarray(frames, dtype=np.int64)
    insert_at = np.ascontiguousarray(insert_at, dtype=np.int64)
    if len(getattr(path, "files", ())) > 1:  # a capture point of several files: each file its own part
        counts = file_frames(path)
        if counts is None:
            return None
        copies = [None if part is None else dict(zip(("frames", "insert_at", "blobs"), part))
                  for part in per_file(frames, insert_at, blobs, counts)]
    else:
        copies = [{"frames": frames, "insert_at": insert_at, "blobs": blobs}]
    done = _excerpts(path, keys, copies, write)
    return None if done is None else sum(excerpt.take() for excerpt in done if excerpt is not None)
