"""The MySQL connection state machine: in-order bytes of both directions in, exchanges out. Sans-IO.

Feed `data(direction, bytes, ts_ns, frame, offset)` for each in-order chunk of one TCP connection (as the
reassembler delivers them, in capture order across both directions), `gap(direction, ...)` where bytes were never
captured, and `end()` when the connection or the capture ends; `take()` returns the finished exchanges.

Wire problems are counted and recorded in the exchanges' `problems`; no exception escapes (a broken packet makes
that direction resynchronise at the next position that is unambiguously a packet header).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from . import detect
from .framing import (
    MAX_COMMANDS_PER_COMPRESSED,
    SQL_BUDGET_PREFIX,
    CompressedDeframer,
    InputBudget,
    Packet,
    PacketFramer,
)
from .params import decode_execute
from .responses import NONE, RESULT, ResponseReader, column_definitions_sent, expected_response
from .tls import Plain, Sealed, Secrets, TlsSession
from .walk import walk_rows
from .wire import (
    CLIENT_COMPRESS,
    CLIENT_DEPRECATE_EOF,
    CLIENT_QUERY_ATTRIBUTES,
    CLIENT_ZSTD_COMPRESSION,
    INT64_MAX,
    MAX_PACKET,
    SERVER_MORE_RESULTS_EXISTS,
    SERVER_QUERY_WAS_SLOW,
    SERVER_STATUS_CURSOR_EXISTS,
    Greeting,
    LoginRequest,
    WireError,
    command_name,
    parse_eof,
    parse_err,
    parse_greeting,
    parse_login,
    parse_ok,
    read_lenenc_int,
)

CLIENT, SERVER = 0, 1
# the command of an exchange read from TLS records without their content: one client flight and the server's
# records until the next one (result ENCRYPTED_RESULT when the server answered)
ENCRYPTED_COMMAND, ENCRYPTED_RESULT = "ENCRYPTED", "encrypted"
GREETING, LOGIN, AUTH, COMMAND, TLS, CLOSED = "greeting", "login", "auth", "command", "tls", "closed"
_DECODE_ERRORS = (WireError, struct.error, IndexError, ValueError)


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request and its response on one connection, as seen at one capture point."""

    seq: int  # ordinal of the exchange in its connection, from 0
    command: str  # COM_QUERY, COM_STMT_EXECUTE, ..., CONNECT for the login, COM_0xNN when unknown
    sql: str | None
    sql_cut: bool  # the statement was longer than the kept prefix
    stmt_id: int | None
    params: str | None
    req_first_ts: int
    req_last_ts: int
    resp_first_ts: int | None
    resp_last_ts: int | None
    req_first_frame: int
    req_last_frame: int
    resp_first_frame: int | None
    resp_last_frame: int | None
    req_offset: int  # stream offset of the request's first byte (client->server direction)
    resp_offset: int | None  # stream offset of the response's first byte (server->client direction)
    resp_end_offset: int | None  # stream offset just past the response's last byte
    result: str | None  # ok | error | resultset | none; None when the response was not (fully) seen
    error_code: int | None
    error_state: str | None
    error_message: str | None
    rows: int
    affected_rows: int
    warnings: int
    result_sets: int
    bytes_req: int
    bytes_resp: int
    status_flags: int | None
    problems: tuple[str, ...]

    @property
    def server_flag_slow(self) -> bool | None:
        return None if self.status_flags is None else bool(self.status_flags & SERVER_QUERY_WAS_SLOW)


@dataclass(slots=True)
class PreparedStatement:
    """A statement prepared on a connection (COM_STMT_PREPARE's OK), as its COM_STMT_EXECUTEs need it. A reader that
    continues the connection on its own (Handover.statements) reads these fields and calls `executed`."""

    sql: str | None
    num_params: int | None
    types: list[int] | None = None  # parameter types last bound (an execute with the new-params-bound flag sends them)
    long_data: dict[int, int] = field(default_factory=dict)  # parameter -> bytes sent since the last execute

    def executed(self, types: list[int] | None) -> None:
        """An execute was read whose parameters were decoded with `types` (sent with it, or the ones bound
        before): they stay bound, and the long data sent for it is used up."""
        self.types = types
        if self.long_data:
            self.long_data = {}


class Handover(NamedTuple):
    """A connection between two exchanges, as a reader that continues it on its own needs it
    (MySQLConnection.handover; the native fast lane, read/fastlane.py, takes it when it can read what comes next). The
    reader gives the connection back at an exchange boundary with `MySQLConnection.resume`."""

    count: int  # exchanges so far: the seq of the next one
    deprecate_eof: bool | None  # CLIENT_DEPRECATE_EOF (None: not known yet, e.g. mid-stream)
    query_attributes: bool | None  # CLIENT_QUERY_ATTRIBUTES (None: not known; COM_QUERY text may carry them)
    max_sql_bytes: int  # statement text kept of a COM_QUERY (longer: cut, problems sql-cut)
    request_keep: int  # request bytes kept: a longer request is cut (problems truncated)
    statements: dict[int, PreparedStatement]  # the prepared statements by id: shared, not copied
    next_problems: tuple[str, ...]  # problems the next exchange carries whatever it is (midstream)


# Handover(*values) without the Python-level __new__ NamedTuple generates (as its _make does): asked for after
# every segment the fast lane gives back, where a Python call per record is a measurable share.
_new_handover = partial(tuple.__new__, Handover)


@dataclass
class _Pending:
    command: int
    name: str
    first: Packet
    reader: ResponseReader
    sql: str | None = None
    sql_cut: bool = False
    stmt_id: int | None = None
    params: str | None = None
    last: Packet | None = None  # last request packet (continuations, LOCAL INFILE data, auth data)
    resp_first: Packet | None = None
    resp_last: Packet | None = None
    next_seq: int = 1
    bytes_req: int = 0
    bytes_resp: int = 0
    problems: list[str] = field(default_factory=list)
    row: bool = False  # its row was spent from the input's budget when it started


@dataclass
class _Flight:
    """A request and its response read from TLS records that do not decrypt: the client's records after the
    server's last answer, and the server's records until the client's next ones."""

    first: Sealed
    last: Sealed
    bytes_req: int
    resp_first: Sealed | None = None
    resp_last: Sealed | None = None
    bytes_resp: int = 0
    problems: list[str] = field(default_factory=list)


@dataclass
class ConnectionCounters:
    midstream: bool = False
    violations: int = 0
    gaps: int = 0
    gap_bytes: list[int] = field(default_factory=lambda: [0, 0])
    unparsed_bytes: list[int] = field(default_factory=lambda: [0, 0])  # skipped while resynchronising
    parsed_bytes: list[int] = field(default_factory=lambda: [0, 0])
    mysql_bytes: list[int] = field(default_factory=lambda: [0, 0])  # stream bytes read by the MySQL parser
    tls_bytes: int = 0  # every byte after the switch to TLS (the session's counters split them)
    violation_notes: list[str] = field(default_factory=list)  # the first few, for the report


class MySQLConnection:
    """One TCP connection's MySQL conversation as one capture point saw it: both directions' in-order bytes in
    (`data`, `gap`, `end`), finished `Exchange`s out (`take`). Sans-IO: no files, no sockets, no pandas.

    The phases follow the handshake: GREETING (the server's first packet) → LOGIN (the client's HandshakeResponse;
    an SSL request moves to TLS) → AUTH (auth switch / more data until the server's OK or ERR) → COMMAND; a
    connection the server refused (an ERR for a greeting, a failed login) is CLOSED. In TLS the bytes go to a
    `tls.TlsSession`: what it decrypts (`tls_secrets`, a key log) is read from LOGIN on as if sent in the clear
    (`_plain`); records it cannot decrypt become timed flights (`_sealed`): command ENCRYPTED_COMMAND, no content.
    A connection whose handshake the capture missed starts in COMMAND with
    `midstream=True` and reads nothing until each direction resynchronises on a position that is unambiguously a
    packet header (`_try_sync`, with `detect` and, for the server, the client offset its ACK numbers acknowledge).

    In COMMAND each client packet with sequence id 0 starts a request (`_start`): its command decides what answer is
    expected (`responses.expected_response`, the command → response table) and a `ResponseReader` follows that
    answer packet by packet. Requests wait in order in a queue (a client may pipeline them); server packets go to the
    oldest request still unanswered. Prepared statements are remembered by id (statement text, parameter count and
    types) so that COM_STMT_EXECUTE parameters decode into SQL literals. The compressed protocol (zlib, zstd) is
    unwrapped before framing once the login negotiated it.

    Busy servers answer mostly with result-set rows: `_whole_response` and `_skip_rows` walk a whole response or a
    run of row packets in one chunk without building a Packet per row, and leave anything unusual to the
    packet-by-packet path; both give exactly what that path gives (tests feed every capture whole, byte by byte
    and reordered).

    What the rest of the package reads: `greeting`, `login`, `tls`, `compression`, `deprecate_eof`,
    `query_attributes`, `greeting_ts`, `connect_ok_ts`, `close_error` (an ERR the server sent on its own before
    closing) and `counters` (`ConnectionCounters`: gaps, violations, bytes read, skipped and encrypted). The TCP
    layer sets `client_offset`. Wire problems never raise: they are counted as violations, and each exchange lists
    its own in `problems` (gap, sql-cut, incomplete, unanswered, sequence, truncated, …)."""

    def __init__(self, *, midstream: bool = False, max_sql_bytes: int = 1 << 20, response_keep: int = 1 << 16,
                 tls_secrets: Secrets | None = None, budget: InputBudget | None = None):
        self.phase = COMMAND if midstream else GREETING
        # TLS after an SSLRequest (or met mid-stream): the session, the key log it may decrypt with, the login
        # request that asked for it, and the client flight being timed when nothing decrypts
        self.tls_session: TlsSession | None = None
        self.tls_secrets = tls_secrets
        self._ssl_request: _Pending | None = None
        self._flight: _Flight | None = None
        self.counters = ConnectionCounters(midstream=midstream)
        self.greeting: Greeting | None = None
        self.login: LoginRequest | None = None
        self.tls = False
        self.compression: str | None = None
        self.deprecate_eof: bool | None = None
        self.query_attributes: bool | None = None
        self.connect_ok_ts: int | None = None
        self.greeting_ts: int | None = None
        # an ERR the server sent on its own, no request pending, before closing (1158 when the client left
        # without COM_QUIT, 4031 on an idle timeout): (code, message); part of no exchange, not a violation
        self.close_error: tuple[int, str] | None = None
        self._negotiated_compression: str | None = None
        self._synced = [not midstream, not midstream]
        # The client framer keeps at least 64 KiB so that logins and EXECUTE parameters stay whole with a small
        # max_sql_bytes; statement text is cut to max_sql_bytes in _describe.
        self.max_sql_bytes = max_sql_bytes
        self.budget = budget  # the input's budgets (statement text, exchanges), shared by its connections
        self._framers = [PacketFramer(max(max_sql_bytes, 1 << 16)), PacketFramer(response_keep)]
        self._deframers: list[CompressedDeframer | None] = [None, None]
        self._conflict_next = False  # a conflict found between exchanges: the next one the client starts is marked
        self._pending: deque[_Pending] = deque()
        self._finished: list[Exchange] = []
        self._statements: dict[int, PreparedStatement] = {}
        self._last_prepared: int | None = None
        self._count = 0
        self._connect: _Pending | None = None
        self._last_finished: _Pending | None = None
        # raw ACK number of a server segment -> client stream offset (set by the TCP layer; None: not known)
        self.client_offset: Callable[[int], int | None] | None = None

    # ---- input -------------------------------------------------------------------------------------------
    def data(self, direction: int, data: bytes, ts: int, frame: int, offset: int, ack: int | None = None) -> None:
        """`ack`: the raw ACK number of the segment that carried `data`, when it had one."""
        if not data:
            return
        if not self.tls and not self._synced[direction] and detect.looks_like_tls(data) \
                and not detect.plausible_command(data):
            self._begin_tls(midstream=True)  # the capture began after a TLS handshake: records can be timed
        if self.tls:
            self.counters.tls_bytes += len(data)
            try:
                events = self.tls_session.data(direction, data, ts, frame, offset)
            except (*_DECODE_ERRORS, KeyError) as exc:  # a handshake message that does not parse: stop here
                self.tls_session.gap(direction)
                self._violation(direction, f"{'client' if direction == CLIENT else 'server'}: TLS: {exc}")
                return
            for event in events:
                if type(event) is Plain:
                    self._plain(event)
                else:
                    self._sealed(event)
            return
        if not self._synced[direction] and not self._try_sync(direction, data, ack):
            self.counters.unparsed_bytes[direction] += len(data)
            return
        self.counters.mysql_bytes[direction] += len(data)
        self._read(direction, data, ts, frame, offset)

    def _read(self, direction: int, data: bytes, ts: int, frame: int, offset: int) -> None:
        """In-order bytes of the MySQL protocol (on the wire, or decrypted from TLS records) into packets."""
        try:
            deframer = self._deframers[direction]
            if deframer is None:
                if direction == SERVER and self.phase == COMMAND:
                    return self._server_data(data, ts, frame, offset)
                packets = self._framers[direction].feed(data, ts, frame, offset)
            else:
                packets = []
                for cp in deframer.feed(data, ts, frame, offset):
                    framer = self._framers[direction]
                    inner = cp.inner
                    got = framer.feed(inner[:1], cp.first_ts, cp.first_frame, cp.first_offset)
                    limit = MAX_COMMANDS_PER_COMPRESSED - len(got) if direction == CLIENT else 0
                    rest, end = framer.feed_from(inner, 1, cp.last_ts, cp.last_frame, cp.end_offset - len(inner),
                                                 False, limit)
                    packets += got
                    packets += rest
                    if end < len(inner):  # over the budget: the rest of this compressed packet is not read
                        framer.reset()
                        self._violation(direction, f"budget: a compressed packet carries more than "
                                                   f"{MAX_COMMANDS_PER_COMPRESSED} commands; its last "
                                                   f"{len(inner) - end} bytes are not read")
            for packet in packets:
                self.counters.parsed_bytes[direction] += packet.wire_bytes
                self._packet(direction, packet)
                if self.phase == TLS:
                    break
        except _DECODE_ERRORS as exc:
            self._violation(direction, f"{'client' if direction == CLIENT else 'server'}: {exc}")

    def gap(self, direction: int, length: int, ts: int) -> None:
        """`length` bytes of this direction were never captured."""
        c = self.counters
        c.gaps += 1
        c.gap_bytes[direction] += length
        if self.tls:
            self.tls_session.gap(direction)
            if self._flight is not None:
                self._flight.problems.append("gap")
            if not self.tls_session.decrypting:
                return
        if self.phase in (GREETING, LOGIN, AUTH):
            # Handshake bytes were lost: read the rest as after a mid-stream start (commands resynchronise) rather
            # than wait for a login or an OK that will never come.
            if self._connect is not None and self._connect in self._pending:
                self._connect.problems.append("gap")
                self._finish(self._connect)
            self.phase = COMMAND
            self._desync(CLIENT)
            self._desync(SERVER)
            return
        partial = self._framers[direction].partial() if self._deframers[direction] is None else None
        self._desync(direction)
        if direction == CLIENT and self.phase == COMMAND and partial is not None and partial.seq == 0 and partial.payload:
            # A command cut by the gap: keep what was captured, marked; its response can still be read.
            try:
                self._start(partial, problems=["gap", "sql-cut"])
            except _DECODE_ERRORS as exc:
                self._violation(CLIENT, f"client: {exc}")
            return
        if direction == SERVER:
            head = self._head()
            if head is not None:
                head.problems.append("gap")
                self._finish(head)
        elif self._pending and self._pending[-1].resp_first is None:
            self._pending[-1].problems.append("gap")  # the request (or its data) may be incomplete
    def end(self) -> None:
        """The connection (or the capture) ended: whatever is pending is finished as it stands."""
        if self.tls:
            self._end_tls()
        partial = self._framers[CLIENT].partial() if self._deframers[CLIENT] is None else None
        if self.phase == COMMAND and partial is not None and partial.seq == 0 and partial.payload:
            # The capture ended inside a command (a large INSERT still uploading): report what was captured.
            self._framers[CLIENT].reset()
            try:
                self._start(partial, problems=["incomplete"])
            except _DECODE_ERRORS as exc:
                self._violation(CLIENT, f"client: {exc}")
        while self._pending:
            pending = self._pending[0]
            if pending.reader.waiting_for_optional_eof:
                pending.reader.done = True
            elif pending.resp_first is None:
                pending.problems.append("unanswered")
            elif not pending.reader.done or pending is self._connect:  # a login is done only by its OK or ERR
                pending.problems.append("incomplete")
            self._finish(pending)

    def take(self) -> list[Exchange]:
        out, self._finished = self._finished, []
        return out

    # ---- another reader --------------------------------------------------------------------------------------
    @property
    def between_exchanges(self) -> bool:
        """Nothing pending and nothing half-read: the next bytes start a new exchange (or answer none)."""
        return not self._pending and self._framers[CLIENT].idle and self._framers[SERVER].idle

    def handover(self) -> Handover | None:
        """The connection as a reader that continues it on its own needs it, when it stands between two exchanges
        with nothing half-read: in the command phase, nothing pending, both directions in sync, packet framing
        idle, neither compressed nor encrypted, nothing finished that `take` has not given. None otherwise. The
        bytes of both directions must then go to that reader until it gives the connection back (`resume`)."""
        if self.tls or self.phase != COMMAND or self._pending or self._finished:
            return None
        synced, deframers, framers = self._synced, self._deframers, self._framers
        if (not (synced[CLIENT] and synced[SERVER]) or deframers[CLIENT] is not None
                or deframers[SERVER] is not None or not (framers[CLIENT].idle and framers[SERVER].idle)):
            return None
        first = ("midstream",) if self.counters.midstream and self._count == 0 else ()
        if self._conflict_next:  # the next exchange carries it: a reader that continues the connection must know
            first += ("retransmission-conflict",)
        return _new_handover((self._count, self.deprecate_eof, self.query_attributes, self.max_sql_bytes,
                              framers[CLIENT].keep, self._statements, first))

    def resume(self, exchanges: int, client_bytes: int, server_bytes: int) -> None:
        """The reader the connection was handed over to gives it back, between two exchanges again: it read
        `client_bytes` and `server_bytes` and finished `exchanges` exchanges, which it reported itself. Counted as
        if they had been read here."""
        c = self.counters
        c.mysql_bytes[CLIENT] += client_bytes
        c.parsed_bytes[CLIENT] += client_bytes
        c.mysql_bytes[SERVER] += server_bytes
        c.parsed_bytes[SERVER] += server_bytes
        if exchanges:
            self._count += exchanges
            self._last_finished = None  # an exchange read elsewhere is the last: not a PREPARE

    # ---- TLS ----------------------------------------------------------------------------------------------------
    @property
    def tls_outcome(self) -> str | None:
        """decrypted | timed | unreadable for a TLS connection (None otherwise): whether its records were
        decrypted with the key log, read as timed flights without their content, or neither."""
        session = self.tls_session
        if session is None:
            return None
        c = session.counters
        if session.decrypting and c.decrypted_bytes:
            return "decrypted"
        if c.sealed_bytes:
            return "timed"
        return "unreadable"

    def tls_split(self) -> tuple[int, int]:
        """(decrypted, timed) of `counters.tls_bytes`; the rest is unreadable. The handshake records read in the
        clear count with the connection's way of reading the rest."""
        session = self.tls_session
        if session is None:
            return 0, 0
        c = session.counters
        decrypting = bool(session.decrypting)
        decrypted = c.decrypted_bytes + (c.handshake_bytes if decrypting else 0)
        timed = c.sealed_bytes + (0 if decrypting else c.handshake_bytes)
        total = self.counters.tls_bytes
        return min(decrypted, total), min(timed, max(0, total - decrypted))

    def _begin_tls(self, midstream: bool = False) -> None:
        self.tls = True
        self.phase = TLS if not midstream else self.phase
        self.tls_session = TlsSession(None if midstream else self.tls_secrets, midstream=midstream)

    def _plain(self, event: Plain) -> None:
        """Decrypted application data: the MySQL protocol continues (the login inside TLS first)."""
        if self.phase == TLS:
            self.phase = LOGIN
            self._ssl_request = None  # the login inside TLS is the CONNECT
        data = event.data
        if event.first_frame == event.last_frame:  # the record came in one segment: one time for all of it
            return self._read(event.direction, data, event.last_ts, event.last_frame, event.offset)
        # across segments: its first byte at the time the record began, the rest when it was complete
        self._read(event.direction, data[:1], event.first_ts, event.first_frame, event.offset)
        if len(data) > 1:
            self._read(event.direction, data[1:], event.last_ts, event.last_frame, event.offset + 1)

    def _sealed(self, event: Sealed) -> None:
        flight = self._flight
        if event.direction == CLIENT:
            if flight is not None and flight.resp_first is None:
                flight.last = event
                flight.bytes_req += event.wire_bytes
                return
            if flight is not None:
                self._finish_flight()
            self._flight = _Flight(event, event, event.wire_bytes)
        elif flight is not None:
            if flight.resp_first is None:
                flight.resp_first = event
            flight.resp_last = event
            flight.bytes_resp += event.wire_bytes

    def _finish_flight(self) -> None:
        flight, self._flight = self._flight, None
        login = self._ssl_request
        self._ssl_request = None
        problems = list(flight.problems)
        if flight.resp_first is None and "gap" not in problems:
            problems.append("unanswered")
        if self.counters.midstream and self._count == 0:
            problems.append("midstream")
        first, last, rf, rl = flight.first, flight.last, flight.resp_first, flight.resp_last
        self._finished.append(Exchange(
            seq=self._count, command="CONNECT" if login is not None else ENCRYPTED_COMMAND, sql=None, sql_cut=False,
            stmt_id=None, params=None, req_first_ts=first.first_ts, req_last_ts=last.last_ts,
            resp_first_ts=rf.first_ts if rf else None, resp_last_ts=rl.last_ts if rl else None,
            req_first_frame=first.first_frame, req_last_frame=last.last_frame,
            resp_first_frame=rf.first_frame if rf else None, resp_last_frame=rl.last_frame if rl else None,
            req_offset=first.offset, resp_offset=rf.offset if rf else None,
            resp_end_offset=rl.offset + rl.wire_bytes if rl else None,
            result=ENCRYPTED_RESULT if rf else None, error_code=None, error_state=None, error_message=None,
            rows=0, affected_rows=0, warnings=0, result_sets=0,
            bytes_req=flight.bytes_req + (login.bytes_req if login is not None else 0), bytes_resp=flight.bytes_resp,
            status_flags=None, problems=tuple(dict.fromkeys(problems))))
        if not self._within_budget():
            self._finished.pop()
        self._count += 1

    def _end_tls(self) -> None:
        if self._flight is not None:
            self._finish_flight()
        if self._ssl_request is not None:  # nothing after the SSLRequest could be read
            self._pending.append(self._ssl_request)
            self._ssl_request = None
            self._finish(self._pending[-1])
        failures = self.tls_session.counters.failures
        if failures:
            self.counters.violations += failures
            notes = self.counters.violation_notes
            notes += self.tls_session.counters.notes[:max(0, 5 - len(notes))]

    # ---- synchronisation ------------------------------------------------------------------------------------
    def _desync(self, direction: int) -> None:
        self._synced[direction] = False
        self._framers[direction].reset()
        if self._deframers[direction] is not None:
            self._deframers[direction].reset()

    def _try_sync(self, direction: int, data: bytes, ack: int | None = None) -> bool:
        if self.phase != COMMAND:
            return False
        if direction == CLIENT:
            if self._deframers[CLIENT] is None and detect.plausible_command(data):
                self._synced[CLIENT] = True
                return True
            algorithm = detect.compressed_command(data)
            if algorithm:
                self._enable_compression(algorithm)
                self._synced[CLIENT] = True
                return True
            return False
        received = self.client_offset(ack) if ack is not None and self.client_offset is not None else None
        if received is not None and self._deframers[SERVER] is None and self._pending:
            # After lost bytes, which request does this answer? The segment's ACK number says which client bytes
            # the server had received when it sent it: the latest request it had received in full (clients wait
            # for an answer before the next request), so the requests before it got their answers where this
            # point lost them. Data sent before any pending request arrived answers none of them.
            received_in_full = []
            for pending in self._pending:  # in request order
                if (pending.last or pending.first).end_offset > received:
                    break
                if not pending.reader.done:
                    received_in_full.append(pending)
            if not received_in_full:
                return False
            for pending in received_in_full[:-1]:  # each is finished once: linear however long this lasts
                pending.problems.append("gap")
                self._finish(pending)
            target = received_in_full[-1]
            if target.resp_first is not None or not detect.plausible_response_start(data, target.next_seq):
                return False
            self._synced[SERVER] = True
            return True
        head = self._head()
        if head is None and self._deframers[SERVER] is None and detect.plausible_unprompted_error(data):
            self._synced[SERVER] = True  # the server's last word on a connection whose requests were not seen
            return True
        if head is None or head.resp_first is not None:
            return False
        if self._deframers[SERVER] is not None:
            ok = len(data) >= 7 and 7 + (data[0] | data[1] << 8 | data[2] << 16) <= len(data) + (1 << 24)
        else:
            ok = detect.plausible_response_start(data, head.next_seq)
        if ok:
            self._synced[SERVER] = True
        return ok

    def _enable_compression(self, algorithm: str) -> None:
        self.compression = algorithm
        for direction in (CLIENT, SERVER):
            if self._deframers[direction] is None:
                self._deframers[direction] = CompressedDeframer(algorithm)

    def conflict(self, direction: int) -> None:
        """Two copies of bytes of `direction` differed (TCP reassembly kept the first): the exchange in progress
        there is marked 'retransmission-conflict' (the server's: the one whose answer is being read; the client's:
        the request being read, else the last one read); with none, the next one the client starts."""
        if direction == SERVER:
            target = self._head()
        else:
            target = self._pending[-1] if self._pending and self._framers[CLIENT].idle else None
        if target is None:
            self._conflict_next = True
        elif "retransmission-conflict" not in target.problems:
            target.problems.append("retransmission-conflict")

    def _within_budget(self) -> bool:
        """The exchange just finished may be written (an input's exchanges are budgeted); else the cut is counted."""
        if self.budget is None or self.budget.row():
            return True
        self._count_violation(f"budget: exchanges past the input's {self.budget.rows_total}; not written")
        return False

    def _count_violation(self, note: str) -> None:
        c = self.counters
        c.violations += 1
        if len(c.violation_notes) < 5:
            c.violation_notes.append(note)

    def _violation(self, direction: int, note: str) -> None:
        self._count_violation(note)
        target = self._head() if direction == SERVER else (self._pending[-1] if self._pending else None)
        if target is not None and "violation" not in target.problems:
            target.problems.append("violation")
        self._desync(direction)

    # ---- packets --------------------------------------------------------------------------------------------
    def _packet(self, direction: int, packet: Packet) -> None:
        phase = self.phase
        if phase == COMMAND:
            if direction == CLIENT:
                if packet.seq == 0:
                    self._start(packet)
                else:
                    self._request_continues(packet)
            else:
                self._response(packet)
        elif phase == GREETING:
            self._on_greeting(direction, packet)
        elif phase == LOGIN:
            self._on_login(direction, packet)
        elif phase == AUTH:
            self._on_auth(direction, packet)
        elif direction == CLIENT and packet.seq == 0:  # CLOSED: e.g. COM_QUIT after a refused login
            self.phase = COMMAND
            self._start(packet)
        else:
            raise WireError(f"data after the connection failed ({phase})")

    def _on_greeting(self, direction: int, packet: Packet) -> None:
        if direction == CLIENT:
            raise WireError("client spoke before the server greeting")
        if packet.payload[:1] == b"\xff" and self._unprompted_error(packet):
            return  # a connection seen from its end (mid-stream): no login happened here
        if packet.payload[:1] == b"\xff":  # refused before the handshake: too many connections, host blocked
            connect = self._new_pending(0x00, "CONNECT", packet, ResponseReader(NONE, None))
            connect.resp_first = connect.resp_last = packet
            connect.bytes_resp = packet.wire_bytes
            self._pending.append(connect)
            self._finish(connect, error=packet.payload)
            self.phase = CLOSED
            return
        self.greeting = parse_greeting(packet.payload)
        self.greeting_ts = packet.first_ts
        self.phase = LOGIN

    def _on_login(self, direction: int, packet: Packet) -> None:
        if direction == SERVER:
            raise WireError("server packet before the client's login")
        login = parse_login(packet.payload)
        self.login = login
        if login.ssl_request:
            # The login continues inside TLS: decrypted, its HandshakeResponse is read as a login; timed only, the
            # first client flight is the login. When neither comes, this request is the CONNECT row (its outcome
            # unreadable, result null) that shows the connection and carries tls = true into the exchanges table.
            self._begin_tls()
            connect = self._new_pending(0x00, "CONNECT", packet, ResponseReader(NONE, None))
            connect.bytes_req = packet.wire_bytes
            self._ssl_request = connect
            return
        caps = login.capabilities & (self.greeting.capabilities if self.greeting else 0xFFFFFFFF)
        self.deprecate_eof = bool(caps & CLIENT_DEPRECATE_EOF)
        self.query_attributes = bool(caps & CLIENT_QUERY_ATTRIBUTES)
        if caps & CLIENT_ZSTD_COMPRESSION:
            self._negotiated_compression = "zstd"
        elif caps & CLIENT_COMPRESS:
            self._negotiated_compression = "zlib"
        else:
            self._negotiated_compression = None
        connect = self._new_pending(0x00, "CONNECT", packet, ResponseReader(NONE, None))
        connect.bytes_req = packet.wire_bytes
        self._connect = connect
        self._pending.append(connect)
        self.phase = AUTH

    def _on_auth(self, direction: int, packet: Packet) -> None:
        connect = self._connect
        if direction == CLIENT:  # auth switch response, RSA key request, scrambled password ...
            connect.bytes_req += packet.wire_bytes  # req_last stays the login packet: ttfb is the server's
            return
        if connect.resp_first is None:
            connect.resp_first = packet
        connect.resp_last = packet
        connect.bytes_resp += packet.wire_bytes
        first = packet.payload[:1]
        if first == b"\x00":
            self.phase = COMMAND
            self.connect_ok_ts = packet.last_ts
            self._finish(connect, ok=True)
            if self._negotiated_compression:
                self._enable_compression(self._negotiated_compression)
        elif first == b"\xff":
            self._finish(connect, error=packet.payload)
            self.phase = CLOSED

    def _unprompted_error(self, packet: Packet) -> bool:
        """An ERR the server sent with no request pending, just before it closes the connection (the client left
        without COM_QUIT: 1158; an idle timeout: 4031; a kill: 1927): kept as `close_error`. Only the codes of
        detect.UNPROMPTED_ERRORS: another ERR with nothing pending (the answer to a request lost in a gap) stays a
        violation, and one before a greeting a refused connection."""
        try:
            err = parse_err(packet.payload)
        except _DECODE_ERRORS:
            return False
        if err.code not in detect.UNPROMPTED_ERRORS:
            return False
        self.close_error = (err.code, err.message)
        self.phase = CLOSED if self.phase == GREETING else self.phase
        return True

    def _new_pending(self, command: int, name: str, packet: Packet, reader: ResponseReader) -> _Pending:
        return _Pending(command, name, packet, reader, last=packet, next_seq=(packet.last_seq + 1) & 0xFF)

    def _start(self, packet: Packet, problems: list[str] | None = None) -> None:
        # A PREPARE whose optional EOF never came is complete. Only the oldest pending request can be in that
        # state (responses come in order), so this looks at the front only: a scan of every pending request here
        # made a run of unanswered requests quadratic.
        while self._pending and self._pending[0].reader.waiting_for_optional_eof:
            self._pending[0].reader.done = True
            self._finish(self._pending[0])
        payload = packet.payload
        if not payload:
            raise WireError("empty command packet")
        if self.budget is not None and not self.budget.row():
            # every request started becomes a row: past the budget it is not read, nor held while it waits
            self._count_violation(f"budget: exchanges past the input's {self.budget.rows_total}; not read")
            return
        code = payload[0]
        pending = self._new_pending(code, command_name(code), packet, ResponseReader(expected_response(code), self.deprecate_eof))
        pending.bytes_req = packet.wire_bytes
        pending.row = self.budget is not None
        if problems:
            pending.problems += problems
        if self._conflict_next:
            self._conflict_next = False
            pending.problems.append("retransmission-conflict")
        self._describe(pending, payload, packet)
        packet.payload = b""  # described: a request waiting for its answer keeps its text, not its bytes twice
        if problems:
            pending.sql_cut = pending.sql is not None
        self._pending.append(pending)
        if pending.reader.done:  # no response expected
            self._finish(pending)

    def _describe(self, pending: _Pending, payload: bytes, packet: Packet) -> None:
        """Fill sql / stmt_id / params from the command packet."""
        code = pending.command
        cut = packet.cut
        if code in (0x03, 0x16):  # COM_QUERY, COM_STMT_PREPARE
            if len(payload) > self.max_sql_bytes:
                payload, cut = payload[: self.max_sql_bytes], True
            body = payload[1:]
            if code == 0x03 and self.query_attributes is not False and body[:2] == b"\x00\x01" and len(body) > 2:
                # MySQL 8.0.23+ query attributes: parameter count 0, parameter set count 1
                body = body[2:]
            elif code == 0x03 and self.query_attributes and body[:1] != b"\x00":
                count, pos = read_lenenc_int(body, 0)
                _, pos = read_lenenc_int(body, pos)
                if count:
                    pending.problems.append("query-attributes")  # bound attributes precede the text; skip them
                    body = body[pos:]  # best effort: values are not decoded
                else:
                    body = body[pos:]
            if self.budget is not None and self.budget.keep(body) is None:
                body, cut = body[:SQL_BUDGET_PREFIX], True
                # the stream stays in sync: only what is kept of this statement's text is cut
                self._count_violation(f"budget: statement text past the input's {self.budget.total} bytes; "
                                      f"{SQL_BUDGET_PREFIX} bytes kept")
            pending.sql = body.decode("utf-8", "replace")
            pending.sql_cut = cut
        elif code in (0x02, 0x04):  # COM_INIT_DB, COM_FIELD_LIST
            name = payload[1:].split(b"\x00", 1)[0].decode("utf-8", "replace")
            pending.sql = f"USE `{name}`" if code == 0x02 else name
        elif code == 0x0C and len(payload) >= 5:
            pending.sql = f"KILL {int.from_bytes(payload[1:5], 'little')}"
        elif code in (0x17, 0x18, 0x19, 0x1A, 0x1C, 0xFA) and len(payload) >= 5:
            stmt_id = int.from_bytes(payload[1:5], "little")
            if stmt_id == 0xFFFFFFFF and self._last_prepared is not None:  # MariaDB: "the statement just prepared"
                stmt_id = self._last_prepared
            pending.stmt_id = stmt_id
            statement = self._statements.get(stmt_id)
            if statement is None:
                pending.problems.append("unknown-statement")
            else:
                pending.sql = statement.sql
            if code == 0x17:
                self._decode_params(pending, payload, statement, cut)
            elif code == 0x18 and len(payload) >= 7:
                param = int.from_bytes(payload[5:7], "little")
                pending.params = f"long data for parameter {param}: {packet.length - 7} bytes"
                if statement is not None:
                    statement.long_data[param] = statement.long_data.get(param, 0) + packet.length - 7
            elif code == 0x19:
                self._statements.pop(stmt_id, None)
        elif code == 0x11:
            pending.sql = None

    def _decode_params(self, pending: _Pending, payload: bytes, statement: PreparedStatement | None, cut: bool
                       ) -> None:
        num = statement.num_params if statement else None
        prior = statement.types if statement else None
        try:
            long_data = statement.long_data if statement else None
            params, types, flags = decode_execute(payload[1:], num, prior, bool(self.query_attributes), long_data)
        except _DECODE_ERRORS:
            pending.problems.append("params-undecoded" if not cut else "truncated")
            return
        if statement is not None:
            statement.executed(types)
        pending.params = params

    def _request_continues(self, packet: Packet) -> None:
        """A client packet that is not a new command: LOCAL INFILE data, auth data, a continuation."""
        target = self._pending[-1] if self._pending else None
        if target is None:
            raise WireError(f"client packet with sequence id {packet.seq} outside any exchange")
        target.last = packet
        target.bytes_req += packet.wire_bytes
        target.next_seq = (packet.last_seq + 1) & 0xFF

    def _server_data(self, data: bytes, ts: int, frame: int, offset: int) -> None:
        """Server bytes in the command phase: packet by packet, with result-set rows counted in bulk."""
        framer = self._framers[SERVER]
        pos, n = 0, len(data)
        while pos < n:
            # one packet at a time while in the command phase (rows may follow); after COM_CHANGE_USER moved the
            # connection to authentication, the rest in one go
            command = self.phase == COMMAND
            if command and framer.idle:
                pos = self._whole_response(data, pos, ts, frame, offset)
                if pos >= n:
                    break
                pos = self._skip_rows(data, pos, ts, frame, offset)
                if pos >= n:
                    break
            packets, pos = framer.feed_from(data, pos, ts, frame, offset, command)
            for packet in packets:
                self.counters.parsed_bytes[SERVER] += packet.wire_bytes
                self._packet(SERVER, packet)
                if self.phase == TLS:
                    return

    def _whole_response(self, data: bytes, start: int, ts: int, frame: int, offset: int) -> int:
        """Fast path for the common answers to COM_QUERY / COM_STMT_EXECUTE when the whole response lies in `data`:
        an OK, or one result set (column count, definitions, optional EOF, rows, EOF/OK), with consecutive sequence
        ids. The packets are only walked; the outcome is what `_response` and `ResponseReader` would give packet by
        packet. Anything else (an error, several result sets, a cursor, a 16 MiB packet, a response continuing in
        later data) leaves `data` untouched for the general path. Returns the position after what was consumed."""
        head = self._head()
        if head is None or head.resp_first is not None:
            return start
        reader = head.reader
        if reader.kind != RESULT or reader._state != "start":
            return start
        n = len(data)
        keep = self._framers[SERVER].keep
        pos = start
        if pos + 4 >= n:
            return start
        length = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
        end = pos + 4 + length
        expect = head.next_seq
        if length == 0 or length > keep or end > n or data[pos + 3] != expect:
            return start
        first = data[pos + 4]
        summary = reader.summary
        if first == 0x00:  # OK
            try:
                ok = parse_ok(data[pos + 4 : end])
            except _DECODE_ERRORS:
                return start  # the general path records the violation
            if ok.status_flags & SERVER_MORE_RESULTS_EXISTS:
                return start
            summary.affected_rows += ok.affected_rows
            summary.warnings += ok.warnings
            summary.status_flags = ok.status_flags
            summary.result = "ok"
            first_start = last_start = pos
            pos = end
        elif first < 0xFB:  # a column count below 251 (bigger ones take the general path)
            first_start = pos
            columns = column_definitions_sent(first, data, pos + 5, end)  # the count is the packet's first byte
            pos = end
            expect = (expect + 1) & 0xFF
            for _ in range(columns):  # column definitions: counted, not decoded
                if pos + 4 >= n:
                    return start
                length = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
                end = pos + 4 + length
                if length >= MAX_PACKET or end > n or data[pos + 3] != expect:
                    return start
                pos = end
                expect = (expect + 1) & 0xFF
            deprecate_eof = reader.deprecate_eof
            if not deprecate_eof:  # the "after_columns" state: a classic EOF, or (then CLIENT_DEPRECATE_EOF) a row
                if pos + 4 >= n:
                    return start
                length = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
                end = pos + 4 + length
                if length == 0 or length >= MAX_PACKET or end > n or data[pos + 3] != expect:
                    return start
                if data[pos + 4] == 0xFE:
                    if length > 5:
                        return start  # an OK right after the columns: zero rows (general path)
                    eof = parse_eof(data[pos + 4 : end])
                    if eof.status_flags & SERVER_STATUS_CURSOR_EXISTS:
                        return start
                    deprecate_eof = False
                    pos = end
                    expect = (expect + 1) & 0xFF
                else:
                    deprecate_eof = True
            pos, rows, expect, _ = walk_rows(data, pos, expect)  # rows up to the terminator
            if pos + 4 >= n:
                return start
            length = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
            end = pos + 4 + length
            if (length == 0 or length > keep or end > n or data[pos + 3] != expect
                    or data[pos + 4] != 0xFE):
                return start
                return start
            payload = data[pos + 4 : end]
            if length <= 5:
                eof = parse_eof(payload)
                warnings, status, affected = eof.warnings, eof.status_flags, 0
            else:
                try:
                    ok = parse_ok(payload)
                except _DECODE_ERRORS:
                    return start
                warnings, status, affected = ok.warnings, ok.status_flags, ok.affected_rows
            if status & SERVER_MORE_RESULTS_EXISTS:
                return start
            reader.deprecate_eof = deprecate_eof
            summary.result = "resultset"
            summary.result_sets += 1
            summary.rows += rows
            summary.affected_rows += affected
            summary.warnings += warnings
            summary.status_flags = status
            last_start = pos
            pos = end
        else:
            return start
        seq = data[last_start + 3]
        reader.done = True
        if first != 0x00:
            reader._state = "rows"
        first_len = data[first_start] | data[first_start + 1] << 8 | data[first_start + 2] << 16
        head.resp_first = Packet(data[first_start + 3], data[first_start + 3], first_len,
                                 data[first_start + 4 : first_start + 4 + min(first_len, keep)], ts, frame,
                                 offset + first_start, ts, frame, offset + first_start + 4 + first_len,
                                 4 + first_len)
        head.resp_last = Packet(seq, seq, pos - last_start - 4, b"", ts, frame, offset + last_start, ts, frame,
                                offset + pos, pos - last_start)
        head.bytes_resp += pos - start
        head.next_seq = (seq + 1) & 0xFF
        self.counters.parsed_bytes[SERVER] += pos - start
        if reader.deprecate_eof is not None and self.deprecate_eof is None:
            self.deprecate_eof = reader.deprecate_eof
        self._finish(head)
        return pos

    def _skip_rows(self, data: bytes, start: int, ts: int, frame: int, offset: int) -> int:
        """Fast path for result-set rows, which are most of the packets of a busy server: whole row packets at the
        start of `data` are counted without building Packet objects. It stops, leaving the rest to the framer and
        the response reader, at anything that is not plainly a row: a terminator or error (0xFE/0xFF), a 16 MiB
        continuation, an empty packet, a packet cut by the end of `data`, or a sequence id out of order.
        Returns the number of bytes consumed."""
        head = self._head()
        if head is None or head.reader._state != "rows":
            return start
        pos, rows, expect, last_start = walk_rows(data, start, head.next_seq)
        if rows:
            head.reader.summary.rows += rows
            head.next_seq = expect
            head.bytes_resp += pos - start
            self.counters.parsed_bytes[SERVER] += pos - start
            seq = (expect - 1) & 0xFF
            head.resp_last = Packet(seq, seq, pos - last_start - 4, b"", ts, frame, offset + last_start, ts, frame,
                                    offset + pos, pos - last_start)
        return pos

    def _head(self) -> _Pending | None:
        for pending in self._pending:
            if not pending.reader.done:
                return pending
        return None

    def _response(self, packet: Packet) -> None:
        head = self._head()
        if head is None:
            last = self._last_finished
            if last is not None and last.command == 0x16 and packet.payload[:1] == b"\xfe" and packet.length <= 5:
                last.resp_last = packet  # the optional EOF of a PREPARE that was closed early; nothing lost
                return
            if packet.payload[:1] == b"\xff" and self._unprompted_error(packet):
                return
            raise WireError(f"server packet (sequence id {packet.seq}) with no request pending")
        if packet.seq != head.next_seq:
            # the next request still waiting (found lazily: scanning them all per packet is quadratic)
            later = head.resp_first is not None and next(
                (p for p in self._pending if p is not head and not p.reader.done), None)
            if later and packet.seq == later.next_seq:
                head.problems.append("incomplete")  # the rest of head's response was never captured
                self._finish(head)
                head = later
            else:
                head.problems.append("sequence") if "sequence" not in head.problems else None
        if head.resp_first is None:
            head.resp_first = packet
        head.resp_last = packet
        head.bytes_resp += packet.wire_bytes
        head.next_seq = (packet.last_seq + 1) & 0xFF
        if packet.cut and packet.payload[:1] in (b"\x00", b"\xff", b"\xfe") and packet.length < (1 << 16):
            head.problems.append("truncated")
        reader = head.reader
        done = reader.packet(packet.payload, packet.length)
        if reader.deprecate_eof is not None and self.deprecate_eof is None:
            self.deprecate_eof = reader.deprecate_eof
        if done:
            self._finish(head)

    def _finish(self, pending: _Pending, ok: bool = False, error: bytes | None = None) -> None:
        try:
            self._pending.remove(pending)
        except ValueError:
            return
        summary = pending.reader.summary
        result = summary.result
        err = summary.error
        if error is not None:
            try:
                err = parse_err(error)
            except _DECODE_ERRORS:
                err = None
            result = "error"
        elif ok:
            result = "ok"
        if pending.reader.kind == NONE and error is None and not ok:
            # "none": no response expected; a login (CONNECT) always expects one, so without its OK/ERR it is null
            result = None if pending.name == "CONNECT" else "none"
        elif not pending.reader.done and error is None and not ok:
            result = None
        if pending.command == 0x16 and summary.prepare_ok is not None:
            prep = summary.prepare_ok
            self._statements[prep.stmt_id] = PreparedStatement(pending.sql, prep.num_params)
            self._last_prepared = prep.stmt_id
            pending.stmt_id = prep.stmt_id
        problems = pending.problems + summary.problems
        affected_rows = summary.affected_rows
        if affected_rows > INT64_MAX:  # a wire value (or sum) the int64 column cannot hold: a bound, marked
            affected_rows = INT64_MAX
            problems.append("out-of-range")
        if self.counters.midstream and self._count == 0:
            problems.append("midstream")
        if pending.sql_cut:
            problems.append("sql-cut")
        first, last = pending.first, pending.last or pending.first
        rf, rl = pending.resp_first, pending.resp_last
        self._finished.append(
            Exchange(
                seq=self._count,
                command=pending.name,
                sql=pending.sql,
                sql_cut=pending.sql_cut,
                stmt_id=pending.stmt_id,
                params=pending.params,
                req_first_ts=first.first_ts,
                req_last_ts=last.last_ts,
                resp_first_ts=rf.first_ts if rf else None,
                resp_last_ts=rl.last_ts if rl else None,
                req_first_frame=first.first_frame,
                req_last_frame=last.last_frame,
                resp_first_frame=rf.first_frame if rf else None,
                resp_last_frame=rl.last_frame if rl else None,
                req_offset=first.first_offset,
                resp_offset=rf.first_offset if rf else None,
                resp_end_offset=rl.end_offset if rl else None,
                result=result,
                error_code=err.code if err else None,
                error_state=err.sql_state if err else None,
                error_message=err.message if err else None,
                rows=summary.rows,
                affected_rows=affected_rows,
                warnings=summary.warnings,
                result_sets=summary.result_sets,
                bytes_req=pending.bytes_req,
                bytes_resp=pending.bytes_resp,
                status_flags=summary.status_flags,
                problems=tuple(dict.fromkeys(problems)),
            )
        )
        if not pending.row and not self._within_budget():
            self._finished.pop()
        self._count += 1
        self._last_finished = pending
