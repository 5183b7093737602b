"""What the server answers to each command, as a table, and a small state machine that reads one response.

The table is the single place that says which packets end a response (h11 `_state.py`, Zeek's expectations).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .wire import (
    MAX_PACKET,
    SERVER_MORE_RESULTS_EXISTS,
    SERVER_STATUS_CURSOR_EXISTS,
    ErrPacket,
    PrepareOk,
    WireError,
    parse_eof,
    parse_err,
    parse_ok,
    parse_prepare_ok,
    read_lenenc_int,
)

# Response kinds.
NONE = "none"  # no response at all
OK = "ok"  # one OK / ERR / EOF packet
RESULT = "result"  # OK, ERR, LOCAL INFILE request or result set(s), possibly several (SERVER_MORE_RESULTS_EXISTS)
PREPARE = "prepare"  # PREPARE_OK + parameter and column definitions, or ERR
ROWS = "rows"  # rows until EOF/OK or ERR (COM_STMT_FETCH)
FIELDS = "fields"  # column definitions until EOF, or ERR (COM_FIELD_LIST)
STRING = "string"  # one free-form packet (COM_STATISTICS)
AUTH = "auth"  # an authentication exchange that ends with OK or ERR (COM_CHANGE_USER)
STREAM = "stream"  # unknown or open-ended (binlog dump): everything until the next command

EXPECTED_RESPONSE: dict[int, str] = {
    0x01: NONE,  # COM_QUIT: the server closes the connection
    0x03: RESULT,  # COM_QUERY
    0x04: FIELDS,  # COM_FIELD_LIST
    0x09: STRING,  # COM_STATISTICS
    0x11: AUTH,  # COM_CHANGE_USER
    0x12: STREAM,  # COM_BINLOG_DUMP
    0x16: PREPARE,  # COM_STMT_PREPARE
    0x17: RESULT,  # COM_STMT_EXECUTE (binary rows)
    0x18: NONE,  # COM_STMT_SEND_LONG_DATA
    0x19: NONE,  # COM_STMT_CLOSE
    0x1C: ROWS,  # COM_STMT_FETCH
    0x1E: STREAM,  # COM_BINLOG_DUMP_GTID
    0xFA: RESULT,  # MariaDB COM_STMT_BULK_EXECUTE
}
OK_COMMANDS = frozenset({0x02, 0x05, 0x06, 0x07, 0x08, 0x0C, 0x0D, 0x0E, 0x1A, 0x1B, 0x1F})


def expected_response(command: int) -> str:
    if command in EXPECTED_RESPONSE:
        return EXPECTED_RESPONSE[command]
    return OK if command in OK_COMMANDS else STREAM


def column_definitions_sent(count: int, packet: bytes, after_count: int, end: int) -> int:
    """How many column definitions follow the packet that starts a result set, which says `count` columns and
    holds packet[after_count:end] after the count. As many as columns, except MariaDB's cached metadata
    (MARIADB_CLIENT_CACHE_METADATA): a "metadata follows" byte after the count, 0 when the client has the
    definitions cached and none are sent (the EOF that would end them still is). ResponseReader and the whole-
    response fast path (connection._whole_response) ask here; the native lane mirrors it (_lane.c,
    response_packet)."""
    return 0 if after_count < end and packet[after_count] == 0 else count


@dataclass
class ResponseSummary:
    result: str | None = None  # ok | error | resultset | none; None until something decisive is seen
    rows: int = 0
    affected_rows: int = 0
    warnings: int = 0
    status_flags: int | None = None
    result_sets: int = 0
    error: ErrPacket | None = None
    prepare_ok: PrepareOk | None = None
    local_infile: bool = False
    cursor_opened: bool = False
    problems: list[str] = field(default_factory=list)


class ResponseReader:
    """Reads the server packets of one response; `packet()` returns True when the response is complete."""

    def __init__(self, kind: str, deprecate_eof: bool | None):
        self.kind = kind
        self.deprecate_eof = deprecate_eof  # None: unknown (mid-stream); decided from the packets' shapes
        self.summary = ResponseSummary()
        self.done = kind == NONE
        self._state = "start"
        self._left = 0  # definitions still expected in the current block
        self._blocks: list[int] = []  # PREPARE: definition blocks still to come

    def packet(self, payload: bytes, length: int) -> bool:
        if self.done:
            raise WireError("packet after the response ended")
        handler = getattr(self, "_on_" + self._state)
        handler(payload, length)
        return self.done

    # --- helpers -----------------------------------------------------------------------------------------
    def _finish_error(self, payload: bytes) -> None:
        s = self.summary
        s.error = parse_err(payload)
        s.result = "error"
        self.done = True

    def _finish_ok(self, payload: bytes, more_allowed: bool = True) -> None:
        ok = parse_ok(payload)
        s = self.summary
        s.affected_rows += ok.affected_rows
        s.warnings += ok.warnings
        s.status_flags = ok.status_flags
        if s.result is None:
            s.result = "ok"
        self._end_result(ok.status_flags, more_allowed)

    def _end_result(self, status: int, more_allowed: bool = True) -> None:
        if more_allowed and self.kind == RESULT and status & SERVER_MORE_RESULTS_EXISTS:
            self._state = "start"
        else:
            self.done = True

    def _terminator(self, payload: bytes, length: int) -> None:
        """EOF or (under CLIENT_DEPRECATE_EOF) the 0xFE-headed OK that ends rows."""
        s = self.summary
        if length < 9 and length <= 5:
            eof = parse_eof(payload)
            s.warnings += eof.warnings
            s.status_flags = eof.status_flags
            self._end_result(eof.status_flags)
        else:
            self._finish_ok(payload)

    # --- states --------------------------------------------------------------------------------------------
    def _on_start(self, payload: bytes, length: int) -> None:
        if not payload:
            raise WireError("empty response packet")
        first = payload[0]
        kind = self.kind
        if first == 0xFF:
            return self._finish_error(payload)
        if kind == OK:
            if first == 0xFE:  # old servers answer COM_SET_OPTION / COM_DEBUG with EOF
                eof = parse_eof(payload)
                self.summary.status_flags = eof.status_flags
                self.summary.result = "ok"
                self.done = True
                return None
            return self._finish_ok(payload, more_allowed=False)
        if kind == STRING:
            self.summary.result = "ok"
            self.done = True
            return None
        if kind == STREAM:
            self.summary.result = "ok" if first == 0x00 else self.summary.result
            return None  # ends only when the next command starts
        if kind == AUTH:
            if first == 0x00:
                return self._finish_ok(payload, more_allowed=False)
            return None  # auth switch (0xFE) or more data (0x01): the client answers, the server continues
        if kind == PREPARE:
            prep = parse_prepare_ok(payload)
            self.summary.prepare_ok = prep
            self.summary.warnings += prep.warnings
            self.summary.result = "ok"
            self._blocks = [n for n in (prep.num_params, prep.num_columns) if n]
            return self._next_block()
        if kind == ROWS:
            self.summary.result = "resultset"
            self._state = "rows"
            return self._on_rows(payload, length)
        if kind == FIELDS:
            self.summary.result = "resultset"
            self._state = "rows"  # column definitions end with EOF, like rows
            return self._on_rows(payload, length)
        # RESULT
        if first == 0x00:
            return self._finish_ok(payload)
        if first == 0xFB:
            self.summary.local_infile = True
            self._state = "after_infile"
            return None
        count, pos = read_lenenc_int(payload, 0)
        if not count:
            raise WireError("result set with no columns")
        self.summary.result = "resultset"
        self.summary.result_sets += 1
        self._left = column_definitions_sent(count, payload, pos, len(payload))
        if self._left:
            self._state = "columns"
        else:
            self._state = "rows" if self.deprecate_eof else "after_columns"
        return None

    def _on_after_infile(self, payload: bytes, length: int) -> None:
        if payload[:1] == b"\xff":
            return self._finish_error(payload)
        return self._finish_ok(payload)

    def _on_columns(self, payload: bytes, length: int) -> None:
        self._left -= 1
        if self._left == 0:
            self._state = "rows" if self.deprecate_eof else "after_columns"

    def _on_after_columns(self, payload: bytes, length: int) -> None:
        if payload[:1] == b"\xfe" and length < MAX_PACKET:
            if length <= 5:  # classic intermediate EOF: rows follow (or a cursor was opened)
                self.deprecate_eof = False
                eof = parse_eof(payload)
                if eof.status_flags & SERVER_STATUS_CURSOR_EXISTS:
                    self.summary.cursor_opened = True
                    self.summary.status_flags = eof.status_flags
                    self.done = True
                    return None
                self._state = "rows"
                return None
            self.deprecate_eof = True  # OK with 0xFE header right after the columns: zero rows
            return self._finish_ok(payload)
        self.deprecate_eof = True
        self._state = "rows"
        return self._on_rows(payload, length)

    def _on_rows(self, payload: bytes, length: int) -> None:
        first = payload[0] if payload else None
        if first == 0xFE and length < MAX_PACKET:
            return self._terminator(payload, length)
        if first == 0xFF:
            return self._finish_error(payload)
        self.summary.rows += 1

    def _next_block(self) -> None:
        if not self._blocks:
            self.done = True
            return
        self._left = self._blocks.pop(0)
        self._state = "definitions"

    def _on_definitions(self, payload: bytes, length: int) -> None:
        self._left -= 1
        if self._left == 0:
            if self.deprecate_eof:
                self._next_block()
            else:
                self._state = "definitions_eof"

    def _on_definitions_eof(self, payload: bytes, length: int) -> None:
        if payload[:1] == b"\xfe" and length <= 5:
            self.deprecate_eof = False
            return self._next_block()
        # No EOF: the client asked for CLIENT_DEPRECATE_EOF; this packet already belongs to the next block.
        self.deprecate_eof = True
        self._next_block()
        if self.done:
            raise WireError("unexpected packet after COM_STMT_PREPARE response")
        self._on_definitions(payload, length)

    @property
    def waiting_for_optional_eof(self) -> bool:
        """PREPARE definitions are complete except for an EOF that only comes without CLIENT_DEPRECATE_EOF."""
        return self._state == "definitions_eof" and not self._blocks
