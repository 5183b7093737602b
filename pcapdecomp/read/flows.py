"""From TCP segments to MySQL exchanges: track connections, find the MySQL ones, run reassembly and the protocol.

Which side is the server is taken from `--server` endpoints when given; otherwise it is found by content: a server
greeting, an ERR instead of a greeting, or a command followed by an answer with the next sequence id. Once an
endpoint has been recognised, later connections to it are MySQL too. Connections that never look like MySQL are
counted as other TCP and their bytes are not parsed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from ..core.endpoints import Endpoint
from ..mysql import detect
from ..mysql.connection import CLIENT, SERVER, Exchange, MySQLConnection
from ..mysql.framing import SQL_BUDGET, InputBudget
from ..mysql.tls import Secrets
from .capture import TcpSegment
from .tcp import HalfStream, HeldBudget

SYN, FIN, RST, ACK = 0x02, 0x01, 0x04, 0x10
DETECT_SEGMENTS = 48  # payload segments looked at before a connection is called "not MySQL"
DETECT_BYTES = 256 << 10
# Segments without payload held (for the replay once a connection is recognised) beyond this many are not kept
# unless they end the connection: a connection of nothing but ACKs must not grow with its packets. The replay
# needs the first ones (SYN, the first sequence numbers); later bare ACKs only declare holes the close declares too.
HELD_EMPTY_SEGMENTS = 64


@dataclass
class Flow:
    """One TCP connection (a 4-tuple between SYNs), before and after it is recognised as MySQL."""

    index: int  # ordinal of the connection in the capture
    a: Endpoint
    b: Endpoint
    first_ts: int
    first_frame: int = 0
    owned: bool = True  # this tracker's part of the capture (see FlowTracker's `part`)
    server: Endpoint | None = None
    syn_ts: int | None = None
    last_ts: int = 0
    frames: int = 0
    closed: bool = False
    kind: str = "pending"  # pending | mysql | other | foreign (MySQL of another part: not parsed here)
    held: list[TcpSegment] = field(default_factory=list)
    held_bytes: int = 0
    held_empty: int = 0  # segments without payload in `held`
    unheld: int = 0  # segments without payload not held (beyond HELD_EMPTY_SEGMENTS): frames to count, no bytes
    payload_segments: int = 0
    command_candidate: Endpoint | None = None  # side that sent what looked like a command
    first_payload_from: dict[Endpoint, bytes] = field(default_factory=dict)
    fins: set[Endpoint] = field(default_factory=set)
    close_from: Endpoint | None = None  # the side whose FIN or RST came first
    close_ts: int | None = None  # … and when
    close_rst: bool = False  # that first close was a RST
    mysql: MySQLConnection | None = None
    to_server: HalfStream | None = None
    to_client: HalfStream | None = None
    exchanges: int = 0

    @property
    def client(self) -> Endpoint | None:
        if self.server is None:
            return None
        return self.b if self.server == self.a else self.a


class HandBack(NamedTuple):
    """What a reader that continued a connection on its own did with it, given back with FlowTracker.take_back
    (the native fast lane's GivenBack has these fields too). The reader took the connection when it was plain to
    follow (not parsed, or MySQL between two exchanges: MySQLConnection.handover, HalfStream.position) and gives
    it back at such a point again."""

    frames: int  # the connection's frames it read
    last_ts: int | None  # time of the last of them that Flow.last_ts counts (None: none)
    segments_to_server: int  # in-order payload segments it read, client→server (MySQL)
    bytes_to_server: int  # their bytes
    segments_to_client: int  # likewise server→client
    bytes_to_client: int
    exchanges: int  # exchanges it finished and reported itself (MySQL)
    other_frames: int  # frames and bytes of a connection that is not parsed, counted as other TCP (owned)
    other_bytes: int


class FlowTracker:
    """Feed segments in capture order; `emit(flow, exchange)` is called for every finished exchange and
    `closed(flow)` once per flow when it ends (FIN/RST on both sides, a new SYN on the same 4-tuple, or `finish`).

    `part=(i, n)` makes this tracker one of n that share a capture (one process each, `--jobs`): every tracker
    follows every connection until it is recognised, so that all learn the same servers in the same order, but
    only connections whose ports hash to i mod n are parsed, counted and reported here. Flow indexes are then local;
    the caller renumbers connections by `first_frame`, which gives the indexes of a single tracker."""

    def __init__(
        self,
        emit: Callable[[Flow, Exchange], None],
        closed: Callable[[Flow], None],
        servers: set[Endpoint] | None = None,
        max_sql_bytes: int = 1 << 20,
        part: tuple[int, int] | None = None,
        tls_secrets: Secrets | None = None,
        sql_budget: int = SQL_BUDGET,
        row_budget: int = 1 << 62,
    ):
        self._part = part
        self.tls_secrets = tls_secrets  # a key log: the TLS connections it has secrets for are decrypted
        self._emit = emit
        self._closed = closed
        self.explicit_servers = servers or set()
        self.learned_servers: set[Endpoint] = set()
        self.max_sql_bytes = max_sql_bytes
        self._flows: dict[tuple[Endpoint, Endpoint], Flow] = {}
        self._count = 0
        self._ended: dict[tuple[Endpoint, Endpoint], str] = {}  # connections closed by FIN/RST -> their kind
        self.held_budget = HeldBudget()  # out-of-order bytes held by all connections together (read/tcp.py)
        # statement text kept and exchanges written by all connections together; the parts of one capture share
        # the input's budgets
        self.budget = InputBudget(sql_budget // (part[1] if part else 1), row_budget // (part[1] if part else 1))
        self.other_tcp_frames = 0
        self.other_tcp_bytes = 0
        # added to the frame numbers fed in: a capture point of several files numbers its frames through them
        # (exchanges.extract sets it per file; the files' segments continue in this one tracker)
        self.frame_base = 0

    # ------------------------------------------------------------------------------------------------------
    def segment(self, seg: TcpSegment) -> None:
        src = (seg.src_ip, seg.src_port)
        dst = (seg.dst_ip, seg.dst_port)
        key = (src, dst) if src <= dst else (dst, src)
        flow = self._flows.get(key)
        flags = seg.flags
        if flow is None and key in self._ended and not (flags & SYN and not flags & ACK):
            # The last ACK, or a retransmitted FIN, of a connection that already ended: still that connection's.
            if self._ended[key] not in ("mysql", "foreign") and self._owns(key):
                self.other_tcp_frames += 1
                self.other_tcp_bytes += len(seg.payload)
            return
        if flow is not None and flags & SYN and not flags & ACK and (flow.closed or flow.frames > 2 and flow.exchanges):
            self._close(key, flow)  # port reuse: a new connection on the same 4-tuple
            flow = None
        if flow is None:
            self._ended.pop(key, None)
            flow = Flow(self._count, src, dst, seg.ts_ns, seg.frame, self._owns(key))
            self._count += 1
            self._flows[key] = flow
            if self.explicit_servers:
                flow.server = dst if dst in self.explicit_servers else src if src in self.explicit_servers else None
                if flow.server is None:
                    flow.kind = "other"
        flow.frames += 1
        if flow.kind == "foreign":
            if flags & (RST | FIN):
                self._maybe_close(key, flow, seg)
            return
        flow.last_ts = seg.ts_ns
        if flags & SYN and not flags & ACK:
            flow.syn_ts = seg.ts_ns
            if flow.server is None and flow.kind == "pending" and dst in self.learned_servers:
                flow.server = dst
        if flow.kind == "other":
            if flow.owned:
                self.other_tcp_frames += 1
                self.other_tcp_bytes += len(seg.payload)
        elif flow.kind == "mysql":
            self._feed(flow, seg)
        else:
            self._classify(flow, seg)
        if flags & (RST | FIN):
            self._maybe_close(key, flow, seg)

    def segment_fields(self, frame: int, ts_ns: int, src_ip: str, src_port: int, dst_ip: str, dst_port: int,
                       seq: int, ack: int, flags: int, payload: bytes, missing: int) -> Flow | None:
        """`segment` for a segment given as its fields (TcpSegment's order). The bulk of a capture, segments of
        an established connection without SYN/FIN/RST, takes a short path that feeds in-order payload straight
        to the protocol; everything else goes through `segment`, with the same outcome. Returns the segment's
        connection if it is still open after it (as `connection` would)."""
        if self.frame_base:
            frame += self.frame_base
        src = (src_ip, src_port)
        dst = (dst_ip, dst_port)
        flow = self._flows.get((src, dst) if src <= dst else (dst, src))
        if flow is not None and not flags & 0x07:  # no FIN, SYN, RST
            kind = flow.kind
            if kind == "mysql" and not missing:
                flow.frames += 1
                flow.last_ts = ts_ns
                if dst == flow.server:
                    half, other, direction, other_dir = flow.to_server, flow.to_client, CLIENT, SERVER
                else:
                    half, other, direction, other_dir = flow.to_client, flow.to_server, SERVER, CLIENT
                if flags & ACK and other._held:
                    self._deliver(flow, other_dir, other.ack(ack, ts_ns))
                if payload:
                    offset = half.in_order(seq, len(payload))
                    if offset is None:
                        events = half.segment(seq, payload, ts_ns, frame, False, ack if flags & ACK else None)
                        if half.new_conflicts:  # before the bytes: they may finish the exchange the copies belong to
                            self._conflict(flow, half, direction)
                        self._deliver(flow, direction, events)
                    else:
                        half.delivered(offset, payload)
                        conn = flow.mysql
                        conn.data(direction, payload, ts_ns, frame, offset, ack if flags & ACK else None)
                        for exchange in conn.take():
                            flow.exchanges += 1
                            self._emit(flow, exchange)
                        if conn.between_exchanges:
                            half.forget_delivered()
                            other.forget_delivered()
                elif half.base is None:
                    half.segment(seq, payload, ts_ns, frame, False)
                return flow
            if kind == "other":
                flow.frames += 1
                flow.last_ts = ts_ns
                if flow.owned:
                    self.other_tcp_frames += 1
                    self.other_tcp_bytes += len(payload)
                return flow
            if kind == "foreign":
                flow.frames += 1
                return flow
        self.segment(TcpSegment(frame, ts_ns, src_ip, src_port, dst_ip, dst_port, seq, ack, flags, payload, missing))
        return self._flows.get((src, dst) if src <= dst else (dst, src))

    def connection(self, a: Endpoint, b: Endpoint) -> Flow | None:
        """The open connection between two endpoints (either order), if any."""
        return self._flows.get((a, b) if a <= b else (b, a))

    def take_back(self, flow: Flow, back: HandBack) -> None:
        """A connection that another reader continued on its own comes back: what it read (`back`, a HandBack or
        a record with its fields) is counted as if it had been read here, and the next segments come here
        again."""
        flow.frames += back.frames
        if back.last_ts is not None:
            flow.last_ts = back.last_ts
        if flow.kind == "mysql":
            # the streams continue after the bytes it read in order (the reader took them at HalfStream.position)
            for half, segments, nbytes in ((flow.to_server, back.segments_to_server, back.bytes_to_server),
                                           (flow.to_client, back.segments_to_client, back.bytes_to_client)):
                half.next += nbytes
                half.stats.segments += segments
                half.stats.bytes_delivered += nbytes
            flow.mysql.resume(back.exchanges, back.bytes_to_server, back.bytes_to_client)
            flow.exchanges += back.exchanges
        self.other_tcp_frames += back.other_frames
        self.other_tcp_bytes += back.other_bytes

    def finish(self) -> None:
        for key, flow in list(self._flows.items()):
            if flow.kind == "pending" and flow.command_candidate is not None and flow.server is None:
                # Only one side spoke, and what it sent are commands (a capture of one COM_STMT_CLOSE, or of
                # requests whose answers were not captured): MySQL, with the server on the other side.
                talkers = set(flow.first_payload_from)
                if talkers == {flow.command_candidate}:
                    flow.server = flow.b if flow.command_candidate == flow.a else flow.a
                    self._start_mysql(flow)
            self._close(key, flow)

    # ------------------------------------------------------------------------------------------------------
    def _classify(self, flow: Flow, seg: TcpSegment) -> None:
        if not seg.payload:
            if flow.held_empty < HELD_EMPTY_SEGMENTS or seg.flags & (FIN | RST):
                flow.held.append(seg)
                flow.held_empty += 1
            else:
                flow.unheld += 1
            return
        flow.held.append(seg)
        flow.held_bytes += len(seg.payload)
        flow.payload_segments += 1
        src = (seg.src_ip, seg.src_port)
        dst = (seg.dst_ip, seg.dst_port)
        data = seg.payload
        first_from_src = src not in flow.first_payload_from
        if first_from_src:
            flow.first_payload_from[src] = data
        elif len(flow.first_payload_from[src]) < 10 and flow.payload_segments <= 3:
            # a packet header written on its own, then its body (Go proxies such as Gaea do): judge them together
            data = flow.first_payload_from[src] = flow.first_payload_from[src] + data
            first_from_src = True
        if flow.server is None:
            if src in self.learned_servers:
                flow.server = src
            elif dst in self.learned_servers:
                flow.server = dst
            elif first_from_src and (detect.plausible_greeting(data) or detect.plausible_early_error(data)):
                flow.server = src
            elif flow.command_candidate == dst and (
                detect.plausible_first_response(data) or detect.plausible_compressed_response(data)
            ):
                flow.server = src
            elif not detect.looks_like_tls(data) and (detect.plausible_command(data) or detect.compressed_command(data)):
                flow.command_candidate = src
            elif flow.command_candidate == dst:
                flow.command_candidate = None  # the answer did not fit: that was not a command
        if flow.server is not None:
            if flow.payload_segments == 1 and len(flow.first_payload_from.get(flow.server, b"..........")) < 10:
                return  # the server's first segment is a bare packet header: wait for its body (split greeting)
            self._start_mysql(flow)
        elif flow.payload_segments >= DETECT_SEGMENTS or flow.held_bytes >= DETECT_BYTES:
            flow.kind = "other"
            if flow.owned:
                self._count_held_as_other(flow)
            flow.held = []

    def _count_held_as_other(self, flow: Flow) -> None:
        self.other_tcp_frames += len(flow.held) + flow.unheld
        self.other_tcp_bytes += flow.held_bytes

    def _owns(self, key) -> bool:
        part = self._part
        # hash of the two ports (ints hash the same in every process); not their sum: Linux hands out even
        # ephemeral ports to connect(), so sums with an even server port would all fall into one part
        return part is None or hash((key[0][1], key[1][1])) % part[1] == part[0]

    def _start_mysql(self, flow: Flow) -> None:
        if _begins_without_greeting(flow):  # e.g. a plain-text health check on a MySQL server's address
            flow.kind = "other"
            if flow.owned:
                self.other_tcp_frames += len(flow.held)
                self.other_tcp_bytes += sum(len(held.payload) for held in flow.held)
            flow.held = []
            return
        flow.kind = "mysql"
        if flow.server not in self.explicit_servers:
            self.learned_servers.add(flow.server)
        if not flow.owned:
            flow.kind = "foreign"
            flow.held = []
            return
        first_server = flow.first_payload_from.get(flow.server)
        first_overall = next((s for s in flow.held if s.payload), None)
        from_server_first = first_overall is not None and (first_overall.src_ip, first_overall.src_port) == flow.server
        greeting_first = (
            from_server_first
            and first_server is not None
            and (detect.plausible_greeting(first_server) or detect.plausible_early_error(first_server))
        )
        flow.mysql = MySQLConnection(midstream=not greeting_first, max_sql_bytes=self.max_sql_bytes,
                                     tls_secrets=self.tls_secrets, budget=self.budget)
        flow.to_server = HalfStream(budget=self.held_budget)
        flow.to_client = HalfStream(budget=self.held_budget)
        flow.mysql.client_offset = flow.to_server.offset_of  # what a server segment's ACK number acknowledges
        held, flow.held = flow.held, []
        for seg in held:
            self._feed(flow, seg)

    def _feed(self, flow: Flow, seg: TcpSegment) -> None:
        to_server = (seg.dst_ip, seg.dst_port) == flow.server
        direction = CLIENT if to_server else SERVER
        half, other = (flow.to_server, flow.to_client) if to_server else (flow.to_client, flow.to_server)
        other_dir = SERVER if to_server else CLIENT
        flags = seg.flags
        if flags & SYN:
            half.syn(seg.seq)
        if flags & ACK:
            self._deliver(flow, other_dir, other.ack(seg.ack, seg.ts_ns))
        events = half.segment(seg.seq, seg.payload, seg.ts_ns, seg.frame, bool(flags & FIN),
                              seg.ack if flags & ACK else None)
        if seg.missing and events:
            events += half.cut_by_snaplen(seg.seq, len(seg.payload), seg.missing, seg.ts_ns)
        if half.new_conflicts:  # before the bytes: they may finish the exchange the copies belong to
            self._conflict(flow, half, direction)
        self._deliver(flow, direction, events)

    @staticmethod
    def _conflict(flow: Flow, half: HalfStream, direction: int) -> None:
        """Two copies of this direction's bytes differed: the exchange they belong to is marked (the first copy is
        the one read). Called when the segment that showed it has been taken and before the bytes it made
        deliverable are delivered: delivered first, they may finish that exchange, and the mark went to the next
        one."""
        half.new_conflicts = 0
        flow.mysql.conflict(direction)

    def _deliver(self, flow: Flow, direction: int, events: list) -> None:
        if not events:
            return
        conn = flow.mysql
        for event in events:
            if hasattr(event, "data"):
                conn.data(direction, event.data, event.ts_ns, event.frame, event.offset, event.ack)
            else:
                conn.gap(direction, event.length, event.ts_ns)
        for exchange in conn.take():
            flow.exchanges += 1
            self._emit(flow, exchange)
        if conn.between_exchanges:
            flow.to_server.forget_delivered()
            flow.to_client.forget_delivered()

    def _maybe_close(self, key, flow: Flow, seg: TcpSegment) -> None:
        if flow.close_ts is None and seg.flags & (FIN | RST):
            flow.close_from, flow.close_ts, flow.close_rst = (seg.src_ip, seg.src_port), seg.ts_ns, bool(seg.flags & RST)
        if seg.flags & FIN:
            flow.fins.add((seg.src_ip, seg.src_port))
        if seg.flags & RST or len(flow.fins) == 2:
            flow.closed = True
            self._close(key, flow)
            self._ended[key] = flow.kind

    def _close(self, key, flow: Flow) -> None:
        self._flows.pop(key, None)
        if flow.kind == "mysql":
            last = flow.last_ts
            self._deliver(flow, SERVER, flow.to_client.flush(last))
            self._deliver(flow, CLIENT, flow.to_server.flush(last))
            flow.mysql.end()
            for exchange in flow.mysql.take():
                flow.exchanges += 1
                self._emit(flow, exchange)
        elif flow.kind == "pending":
            if flow.owned:
                self._count_held_as_other(flow)
            flow.held = []
            flow.kind = "other"
        if flow.owned:
            self._closed(flow)


def _begins_without_greeting(flow: Flow) -> bool:
    """The capture holds this connection's start (the server's SYN-ACK) and it is not MySQL's: the client spoke
    before the server had sent a byte (its ACK still at the server's ISN + 1), or the server's first byte is not a
    greeting. A MySQL server always speaks first, so this is another protocol, not a mid-stream MySQL connection.
    Without the SYN-ACK nothing is known (the connection may have begun before the capture)."""
    server = flow.server
    isn = next((seg.seq for seg in flow.held if seg.flags & SYN and seg.flags & ACK
                and (seg.src_ip, seg.src_port) == server), None)
    if isn is None:
        return False
    first = next((seg for seg in flow.held if seg.payload), None)
    if first is None:
        return False
    if (first.src_ip, first.src_port) != server:
        return bool(first.flags & ACK) and (first.ack - isn) % (1 << 32) == 1
    head = flow.first_payload_from.get(server, first.payload)  # a header sent on its own is judged with its body
    return (first.seq - isn) % (1 << 32) == 1 and not first.missing and not (  # a greeting cut by the snaplen is one
        detect.plausible_greeting(head) or detect.plausible_early_error(head))
