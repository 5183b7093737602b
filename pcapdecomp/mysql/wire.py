"""MySQL wire format: constants and decoders for single packets. Pure functions over bytes.

Nothing here keeps state between packets; `connection.py` does that. Every decoder tolerates short or garbled
input by raising `WireError`, which the connection turns into a counted protocol violation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAX_PACKET = 0xFFFFFF  # a payload of exactly this length continues in the next packet
INT64_MAX = (1 << 63) - 1  # the largest count an int64 column holds; larger wire values are marked out-of-range

# Capability flags (client and server).
CLIENT_LONG_PASSWORD = 1 << 0
CLIENT_CONNECT_WITH_DB = 1 << 3
CLIENT_COMPRESS = 1 << 5
CLIENT_LOCAL_FILES = 1 << 7
CLIENT_PROTOCOL_41 = 1 << 9
CLIENT_SSL = 1 << 11
CLIENT_TRANSACTIONS = 1 << 13
CLIENT_SECURE_CONNECTION = 1 << 15
CLIENT_MULTI_STATEMENTS = 1 << 16
CLIENT_MULTI_RESULTS = 1 << 17
CLIENT_PLUGIN_AUTH = 1 << 19
CLIENT_CONNECT_ATTRS = 1 << 20
CLIENT_PLUGIN_AUTH_LENENC_DATA = 1 << 21
CLIENT_DEPRECATE_EOF = 1 << 24
CLIENT_ZSTD_COMPRESSION = 1 << 26
CLIENT_QUERY_ATTRIBUTES = 1 << 27

# Server status flags (OK / EOF packets).
SERVER_STATUS_IN_TRANS = 0x0001
SERVER_STATUS_AUTOCOMMIT = 0x0002
SERVER_MORE_RESULTS_EXISTS = 0x0008
SERVER_STATUS_CURSOR_EXISTS = 0x0040
SERVER_STATUS_LAST_ROW_SENT = 0x0080
SERVER_QUERY_WAS_SLOW = 0x0800
SERVER_PS_OUT_PARAMS = 0x1000

# COM_STMT_EXECUTE flags.
CURSOR_TYPE_READ_ONLY = 0x01
PARAMETER_COUNT_AVAILABLE = 0x08

COMMANDS: dict[int, str] = {
    0x00: "COM_SLEEP",
    0x01: "COM_QUIT",
    0x02: "COM_INIT_DB",
    0x03: "COM_QUERY",
    0x04: "COM_FIELD_LIST",
    0x05: "COM_CREATE_DB",
    0x06: "COM_DROP_DB",
    0x07: "COM_REFRESH",
    0x08: "COM_SHUTDOWN",
    0x09: "COM_STATISTICS",
    0x0A: "COM_PROCESS_INFO",
    0x0B: "COM_CONNECT",
    0x0C: "COM_PROCESS_KILL",
    0x0D: "COM_DEBUG",
    0x0E: "COM_PING",
    0x0F: "COM_TIME",
    0x10: "COM_DELAYED_INSERT",
    0x11: "COM_CHANGE_USER",
    0x12: "COM_BINLOG_DUMP",
    0x13: "COM_TABLE_DUMP",
    0x14: "COM_CONNECT_OUT",
    0x15: "COM_REGISTER_SLAVE",
    0x16: "COM_STMT_PREPARE",
    0x17: "COM_STMT_EXECUTE",
    0x18: "COM_STMT_SEND_LONG_DATA",
    0x19: "COM_STMT_CLOSE",
    0x1A: "COM_STMT_RESET",
    0x1B: "COM_SET_OPTION",
    0x1C: "COM_STMT_FETCH",
    0x1D: "COM_DAEMON",
    0x1E: "COM_BINLOG_DUMP_GTID",
    0x1F: "COM_RESET_CONNECTION",
    0x20: "COM_CLONE",
    0xFA: "COM_STMT_BULK_EXECUTE",  # MariaDB
}

# Commands a client sends in normal operation; used to recognise a command when resynchronising mid-stream.
COMMON_COMMANDS = frozenset(
    {0x01, 0x02, 0x03, 0x04, 0x09, 0x0C, 0x0E, 0x11, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x1F}
)


def command_name(code: int) -> str:
    return COMMANDS.get(code, f"COM_0x{code:02X}")


class WireError(ValueError):
    """A packet does not have the shape its type requires."""


def read_lenenc_int(buf: bytes, pos: int) -> tuple[int | None, int]:
    """Length-encoded integer at pos -> (value, new pos). 0xFB is SQL NULL (value None)."""
    if pos >= len(buf):
        raise WireError("lenenc int past end")
    first = buf[pos]
    if first < 0xFB:
        return first, pos + 1
    if first == 0xFB:
        return None, pos + 1
    width = {0xFC: 2, 0xFD: 3, 0xFE: 8}.get(first)
    if width is None or pos + 1 + width > len(buf):
        raise WireError("bad lenenc int")
    return int.from_bytes(buf[pos + 1 : pos + 1 + width], "little"), pos + 1 + width


def read_lenenc_bytes(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    length, pos = read_lenenc_int(buf, pos)
    if length is None:
        return None, pos
    if pos + length > len(buf):
        raise WireError("lenenc string past end")
    return buf[pos : pos + length], pos + length


def read_nul_str(buf: bytes, pos: int) -> tuple[bytes, int]:
    end = buf.find(b"\x00", pos)
    if end < 0:
        raise WireError("unterminated string")
    return buf[pos:end], end + 1


def text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class OkPacket:
    affected_rows: int
    last_insert_id: int
    status_flags: int
    warnings: int


@dataclass(frozen=True, slots=True)
class ErrPacket:
    code: int
    sql_state: str | None
    message: str


@dataclass(frozen=True, slots=True)
class EofPacket:
    warnings: int
    status_flags: int


def parse_ok(payload: bytes) -> OkPacket:
    """OK (0x00) or the 0xFE-headed OK that ends a result set under CLIENT_DEPRECATE_EOF."""
    affected, pos = read_lenenc_int(payload, 1)
    insert_id, pos = read_lenenc_int(payload, pos)
    status = warnings = 0
    if pos + 2 <= len(payload):
        status = int.from_bytes(payload[pos : pos + 2], "little")
    if pos + 4 <= len(payload):
        warnings = int.from_bytes(payload[pos + 2 : pos + 4], "little")
    return OkPacket(affected or 0, insert_id or 0, status, warnings)


def parse_err(payload: bytes) -> ErrPacket:
    if len(payload) < 3 or payload[0] != 0xFF:
        raise WireError("short ERR packet")
    code = int.from_bytes(payload[1:3], "little")
    if len(payload) >= 9 and payload[3:4] == b"#":
        return ErrPacket(code, payload[4:9].decode("ascii", "replace"), payload[9:].decode("utf-8", "replace"))
    return ErrPacket(code, None, payload[3:].decode("utf-8", "replace"))


def parse_eof(payload: bytes) -> EofPacket:
    if len(payload) >= 5:
        warnings, status = struct.unpack_from("<HH", payload, 1)
        return EofPacket(warnings, status)
    return EofPacket(0, 0)


@dataclass(frozen=True, slots=True)
class Greeting:
    protocol: int
    server_version: str
    conn_id: int
    capabilities: int
    status_flags: int
    auth_plugin: str | None
    scramble: bytes  # the 20-byte challenge: identical at every capture point, a fingerprint of the connection


def parse_greeting(payload: bytes) -> Greeting:
    if not payload or payload[0] not in (9, 10):
        raise WireError("not a server greeting")
    version, pos = read_nul_str(payload, 1)
    if pos + 4 > len(payload):
        raise WireError("greeting too short")
    conn_id = int.from_bytes(payload[pos : pos + 4], "little")
    pos += 4
    if payload[0] == 9:
        return Greeting(9, text(version) or "", conn_id, 0, 0, None, payload[pos:].rstrip(b"\x00"))
    scramble1 = payload[pos : pos + 8]
    pos += 9  # 8 bytes + filler
    caps = int.from_bytes(payload[pos : pos + 2], "little")
    pos += 2
    status = 0
    plugin = None
    scramble2 = b""
    if pos + 16 <= len(payload):
        status = int.from_bytes(payload[pos + 1 : pos + 3], "little")
        caps |= int.from_bytes(payload[pos + 3 : pos + 5], "little") << 16
        auth_len = payload[pos + 5]
        pos += 16  # charset, status, caps upper, auth len, 10 reserved (MariaDB keeps extended caps there)
        if caps & CLIENT_SECURE_CONNECTION:
            take = max(13, auth_len - 8)
            scramble2 = payload[pos : pos + take].rstrip(b"\x00")
            pos += take
        if caps & CLIENT_PLUGIN_AUTH and pos < len(payload):
            end = payload.find(b"\x00", pos)
            plugin = text(payload[pos : end if end >= 0 else len(payload)])
    return Greeting(payload[0], text(version) or "", conn_id, caps, status, plugin, scramble1 + scramble2)


@dataclass(frozen=True, slots=True)
class LoginRequest:
    capabilities: int
    user: str | None
    database: str | None
    auth_plugin: str | None
    ssl_request: bool  # the short SSLRequest packet: TLS follows
    zstd_level: int | None


def parse_login(payload: bytes) -> LoginRequest:
    if len(payload) < 4:
        raise WireError("login packet too short")
    caps = int.from_bytes(payload[0:2], "little")
    if not caps & CLIENT_PROTOCOL_41:  # HandshakeResponse320
        user, pos = read_nul_str(payload, 5) if len(payload) > 5 else (b"", 5)
        return LoginRequest(caps, text(user), None, None, False, None)
    if len(payload) < 32:
        raise WireError("login packet too short")
    caps = int.from_bytes(payload[0:4], "little")
    if len(payload) == 32 and caps & CLIENT_SSL:
        return LoginRequest(caps, None, None, None, True, None)
    user, pos = read_nul_str(payload, 32)
    if caps & CLIENT_PLUGIN_AUTH_LENENC_DATA:
        _, pos = read_lenenc_bytes(payload, pos)
    elif caps & CLIENT_SECURE_CONNECTION:
        pos += 1 + payload[pos] if pos < len(payload) else 0
    else:
        _, pos = read_nul_str(payload, pos)
    database = plugin = None
    if caps & CLIENT_CONNECT_WITH_DB and pos < len(payload):
        raw_db, pos = read_nul_str(payload, pos)
        database = text(raw_db)
    if caps & CLIENT_PLUGIN_AUTH and pos < len(payload):
        raw_plugin, pos = read_nul_str(payload, pos)
        plugin = text(raw_plugin)
    zstd_level = None
    if caps & CLIENT_ZSTD_COMPRESSION and len(payload) > 0:
        zstd_level = payload[-1]  # the last byte, after the connection attributes
    return LoginRequest(caps, text(user), database, plugin, False, zstd_level)


@dataclass(frozen=True, slots=True)
class PrepareOk:
    stmt_id: int
    num_columns: int
    num_params: int
    warnings: int


def parse_prepare_ok(payload: bytes) -> PrepareOk:
    if len(payload) < 12 or payload[0] != 0x00:
        raise WireError("short COM_STMT_PREPARE OK")
    stmt_id, num_columns, num_params = struct.unpack_from("<IHH", payload, 1)
    warnings = struct.unpack_from("<H", payload, 10)[0]
    return PrepareOk(stmt_id, num_columns, num_params, warnings)
