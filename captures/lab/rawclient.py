"""A small blocking MySQL client over a raw socket, for the commands drivers do not expose.

It speaks just enough of the classic protocol to log in with mysql_native_password and send any command
packet: COM_STMT_EXECUTE with a read-only cursor then COM_STMT_FETCH, COM_STMT_SEND_LONG_DATA,
COM_RESET_CONNECTION, COM_CHANGE_USER, COM_STATISTICS, ... The server on the other end is a real MariaDB;
this only decides which bytes go on the wire. Responses are read to their end, not decoded into values.
"""

from __future__ import annotations

import hashlib
import socket
import struct
from dataclasses import dataclass

COM_QUIT, COM_INIT_DB, COM_QUERY, COM_STATISTICS, COM_PING = 0x01, 0x02, 0x03, 0x09, 0x0E
COM_CHANGE_USER, COM_STMT_PREPARE, COM_STMT_EXECUTE, COM_STMT_SEND_LONG_DATA = 0x11, 0x16, 0x17, 0x18
COM_STMT_CLOSE, COM_STMT_RESET, COM_STMT_FETCH, COM_RESET_CONNECTION = 0x19, 0x1A, 0x1C, 0x1F

CLIENT_LONG_PASSWORD, CLIENT_FOUND_ROWS, CLIENT_LONG_FLAG, CLIENT_CONNECT_WITH_DB = 0x1, 0x2, 0x4, 0x8
CLIENT_LOCAL_FILES, CLIENT_PROTOCOL_41, CLIENT_TRANSACTIONS, CLIENT_SECURE_CONNECTION = 0x80, 0x200, 0x2000, 0x8000
CLIENT_MULTI_STATEMENTS, CLIENT_MULTI_RESULTS, CLIENT_PS_MULTI_RESULTS = 0x10000, 0x20000, 0x40000
CLIENT_PLUGIN_AUTH = 0x80000

SERVER_MORE_RESULTS_EXISTS, SERVER_STATUS_CURSOR_EXISTS, SERVER_STATUS_LAST_ROW_SENT = 0x08, 0x40, 0x80
CURSOR_TYPE_READ_ONLY = 0x01

# parameter types for COM_STMT_EXECUTE
MYSQL_TYPE_DOUBLE, MYSQL_TYPE_LONGLONG, MYSQL_TYPE_DATETIME = 0x05, 0x08, 0x0C
MYSQL_TYPE_BLOB, MYSQL_TYPE_VAR_STRING, MYSQL_TYPE_NULL = 0xFC, 0xFD, 0x06
MYSQL_TYPE_TINY, MYSQL_TYPE_FLOAT, MYSQL_TYPE_DATE, MYSQL_TYPE_TIME, MYSQL_TYPE_NEWDECIMAL = 0x01, 0x04, 0x0A, 0x0B, 0xF6
UNSIGNED_FLAG = 0x8000  # in the type's second byte on the wire

MAX_PAYLOAD = 0xFFFFFF


class ProtocolError(Exception):
    """The server answered with something this small client does not expect."""


@dataclass(frozen=True, slots=True)
class Response:
    """What came back for one command: the kind of final packet and a few facts about it."""

    kind: str  # "ok", "err", "eof", "resultset", "text"
    status: int = 0
    rows: int = 0
    result_sets: int = 0
    error: str = ""
    first_row: tuple[str | None, ...] = ()  # text-protocol cells of the first row, decoded as strings


def native_password_scramble(password: str, salt: bytes) -> bytes:
    if not password:
        return b""
    stage1 = hashlib.sha1(password.encode()).digest()
    stage2 = hashlib.sha1(stage1).digest()
    mask = hashlib.sha1(salt + stage2).digest()
    return bytes(a ^ b for a, b in zip(stage1, mask))


def lenenc_int(value: int) -> bytes:
    if value < 251:
        return bytes([value])
    if value < 1 << 16:
        return b"\xfc" + struct.pack("<H", value)
    if value < 1 << 24:
        return b"\xfd" + struct.pack("<I", value)[:3]
    return b"\xfe" + struct.pack("<Q", value)


def _read_lenenc_int(data: bytes, pos: int) -> tuple[int, int]:
    first = data[pos]
    if first < 251:
        return first, pos + 1
    width = {0xFC: 2, 0xFD: 3, 0xFE: 8}[first]
    return int.from_bytes(data[pos + 1:pos + 1 + width], "little"), pos + 1 + width


def _text_cells(row: bytes) -> tuple[str | None, ...]:
    cells, pos = [], 0
    while pos < len(row):
        if row[pos] == 0xFB:
            cells.append(None)
            pos += 1
            continue
        length, pos = _read_lenenc_int(row, pos)
        cells.append(row[pos:pos + length].decode(errors="replace"))
        pos += length
    return tuple(cells)


def _is_eof(payload: bytes) -> bool:
    return payload[:1] == b"\xfe" and len(payload) < 9


def _err_text(payload: bytes) -> str:
    code = struct.unpack_from("<H", payload, 1)[0]
    return f"{code}: {payload[9:].decode(errors='replace')}"


def _ok_status(payload: bytes) -> int:
    _, pos = _read_lenenc_int(payload, 1)  # affected rows
    _, pos = _read_lenenc_int(payload, pos)  # last insert id
    return struct.unpack_from("<H", payload, pos)[0]


class RawClient:
    """One connection. Methods send one command and read its whole response."""

    def __init__(self, host: str, port: int, user: str, password: str, database: str = "",
                 timeout_s: float = 30.0):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_connection((host, port), timeout_s) if family == socket.AF_INET else \
            socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_INET6:
            self.sock.settimeout(timeout_s)
            self.sock.connect((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""
        self.seq = 0
        self.connection_id = 0
        self.salt = b""
        self._handshake(user, password, database)

    # --- framing -------------------------------------------------------------------------------------------
    def _recv_exact(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buffer)))
            if not chunk:
                raise ProtocolError("server closed the connection")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def read_packet(self) -> bytes:
        """One logical payload; payloads of 16 MiB - 1 continue in the next packet."""
        parts = []
        while True:
            header = self._recv_exact(4)
            length = int.from_bytes(header[:3], "little")
            self.seq = (header[3] + 1) & 0xFF
            parts.append(self._recv_exact(length))
            if length < MAX_PAYLOAD:
                return b"".join(parts)

    def write_packet(self, payload: bytes) -> None:
        out = []
        for start in range(0, len(payload) + 1, MAX_PAYLOAD):
            chunk = payload[start:start + MAX_PAYLOAD]
            out.append(len(chunk).to_bytes(3, "little") + bytes([self.seq]) + chunk)
            self.seq = (self.seq + 1) & 0xFF
            if len(chunk) < MAX_PAYLOAD:
                break
        self.sock.sendall(b"".join(out))

    def send_command(self, command: int, body: bytes = b"") -> None:
        self.seq = 0
        self.write_packet(bytes([command]) + body)

    # --- login ---------------------------------------------------------------------------------------------
    def _handshake(self, user: str, password: str, database: str) -> None:
        greeting = self.read_packet()
        if greeting[0] == 0xFF:
            raise ProtocolError(_err_text(greeting))
        pos = greeting.index(b"\0", 1) + 1  # after the server version
        self.connection_id = struct.unpack_from("<I", greeting, pos)[0]
        salt1 = greeting[pos + 4:pos + 12]
        pos += 13  # id, salt part 1, filler
        pos += 2 + 1 + 2 + 2  # capability low, charset, status, capability high
        salt_len = greeting[pos]
        pos += 1 + 10
        salt2 = greeting[pos:pos + max(13, salt_len - 8)].rstrip(b"\0")
        self.salt = salt1 + salt2
        caps = (CLIENT_LONG_PASSWORD | CLIENT_FOUND_ROWS | CLIENT_LONG_FLAG | CLIENT_PROTOCOL_41
                | CLIENT_TRANSACTIONS | CLIENT_SECURE_CONNECTION | CLIENT_MULTI_STATEMENTS | CLIENT_MULTI_RESULTS
                | CLIENT_PS_MULTI_RESULTS | CLIENT_PLUGIN_AUTH)
        if database:
            caps |= CLIENT_CONNECT_WITH_DB
        auth = native_password_scramble(password, self.salt)
        body = struct.pack("<IIB23x", caps, MAX_PAYLOAD, 45) + user.encode() + b"\0" + bytes([len(auth)]) + auth
        if database:
            body += database.encode() + b"\0"
        body += b"mysql_native_password\0"
        self.write_packet(body)
        self._finish_auth(password)

    def _finish_auth(self, password: str) -> None:
        reply = self.read_packet()
        if reply[0] == 0xFE:  # auth switch: plugin name, then a fresh salt
            end = reply.index(b"\0", 1)
            plugin = reply[1:end].decode()
            if plugin != "mysql_native_password":
                raise ProtocolError(f"server asks for auth plugin {plugin}")
            self.salt = reply[end + 1:].rstrip(b"\0")
            self.write_packet(native_password_scramble(password, self.salt))
            reply = self.read_packet()
        if reply[0] == 0xFF:
            raise ProtocolError(_err_text(reply))
        if reply[0] != 0x00:
            raise ProtocolError(f"unexpected login reply 0x{reply[0]:02x}")

    # --- responses -----------------------------------------------------------------------------------------
    def read_response(self, binary_rows: bool = False) -> Response:
        """Read OK / ERR / one or more result sets (classic EOF framing) to the end."""
        rows = result_sets = 0
        first_row: tuple[str | None, ...] = ()
        while True:
            first = self.read_packet()
            if first[0] == 0x00:
                status = _ok_status(first)
            elif first[0] == 0xFF:
                return Response("err", rows=rows, result_sets=result_sets, error=_err_text(first))
            else:
                columns, _ = _read_lenenc_int(first, 0)
                for _ in range(columns):
                    self.read_packet()
                eof = self.read_packet()
                status = struct.unpack_from("<H", eof, 3)[0]
                result_sets += 1
                if status & SERVER_STATUS_CURSOR_EXISTS:  # rows come later, by COM_STMT_FETCH
                    return Response("resultset", status=status, rows=0, result_sets=result_sets)
                while True:
                    row = self.read_packet()
                    if _is_eof(row):
                        status = struct.unpack_from("<H", row, 3)[0]
                        break
                    if row[0] == 0xFF:
                        return Response("err", rows=rows, result_sets=result_sets, error=_err_text(row))
                    if not rows and not binary_rows and len(row) < 4096:
                        first_row = _text_cells(row)
                    rows += 1
            if not status & SERVER_MORE_RESULTS_EXISTS:
                return Response("resultset" if result_sets else "ok", status=status, rows=rows,
                                result_sets=result_sets, first_row=first_row)

    # --- commands ------------------------------------------------------------------------------------------
    def query(self, sql: str) -> Response:
        self.send_command(COM_QUERY, sql.encode())
        return self.read_response()

    def ping(self) -> Response:
        self.send_command(COM_PING)
        return self.read_response()

    def init_db(self, database: str) -> Response:
        self.send_command(COM_INIT_DB, database.encode())
        return self.read_response()

    def statistics(self) -> Response:
        self.send_command(COM_STATISTICS)
        self.read_packet()  # a bare human-readable string, not an OK packet
        return Response("text")

    def reset_connection(self) -> Response:
        self.send_command(COM_RESET_CONNECTION)
        return self.read_response()

    def change_user(self, user: str, password: str, database: str = "") -> Response:
        auth = native_password_scramble(password, self.salt)
        body = (user.encode() + b"\0" + bytes([len(auth)]) + auth + database.encode() + b"\0"
                + struct.pack("<H", 45) + b"mysql_native_password\0")
        self.send_command(COM_CHANGE_USER, body)
        try:
            self._finish_auth(password)
        except ProtocolError as exc:
            return Response("err", error=str(exc))
        return Response("ok")

    def prepare(self, sql: str) -> tuple[int, int, int]:
        """COM_STMT_PREPARE -> (statement id, columns, params)."""
        self.send_command(COM_STMT_PREPARE, sql.encode())
        first = self.read_packet()
        if first[0] == 0xFF:
            raise ProtocolError(_err_text(first))
        statement_id, columns, params = struct.unpack_from("<IHH", first, 1)
        for count in (params, columns):
            if count:
                for _ in range(count):
                    self.read_packet()
                self.read_packet()  # EOF
        return statement_id, columns, params

    def execute(self, statement_id: int, params: list[tuple[int, bytes | None]], cursor: bool = False) -> Response:
        """COM_STMT_EXECUTE with (type, encoded value or None for NULL) per parameter."""
        body = struct.pack("<IBI", statement_id, CURSOR_TYPE_READ_ONLY if cursor else 0, 1)
        if params:
            null_bitmap = bytearray((len(params) + 7) // 8)
            for i, (_, value) in enumerate(params):
                if value is None:
                    null_bitmap[i // 8] |= 1 << (i % 8)
            body += bytes(null_bitmap) + b"\x01"  # new params bound: types follow
            body += b"".join(struct.pack("<H", type_) for type_, _ in params)  # type, flags (0x8000 unsigned)
            body += b"".join(value for _, value in params if value is not None)
        self.send_command(COM_STMT_EXECUTE, body)
        return self.read_response(binary_rows=True)

    def fetch(self, statement_id: int, rows: int) -> Response:
        """COM_STMT_FETCH: binary rows then EOF (LAST_ROW_SENT when the cursor is exhausted)."""
        self.send_command(COM_STMT_FETCH, struct.pack("<II", statement_id, rows))
        count = 0
        while True:
            packet = self.read_packet()
            if packet[0] == 0xFF:
                return Response("err", rows=count, error=_err_text(packet))
            if _is_eof(packet):
                return Response("eof", status=struct.unpack_from("<H", packet, 3)[0], rows=count)
            count += 1

    def send_long_data(self, statement_id: int, param_id: int, data: bytes) -> None:
        self.send_command(COM_STMT_SEND_LONG_DATA, struct.pack("<IH", statement_id, param_id) + data)

    def reset_statement(self, statement_id: int) -> Response:
        self.send_command(COM_STMT_RESET, struct.pack("<I", statement_id))
        return self.read_response()

    def close_statement(self, statement_id: int) -> None:
        self.send_command(COM_STMT_CLOSE, struct.pack("<I", statement_id))

    def quit(self) -> None:
        try:
            self.send_command(COM_QUIT)
        finally:
            self.sock.close()


def encode_string(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return lenenc_int(len(raw)) + raw


def encode_datetime(year: int, month: int, day: int, hour: int, minute: int, second: int, micro: int) -> bytes:
    return bytes([11]) + struct.pack("<HBBBBBI", year, month, day, hour, minute, second, micro)


def encode_time(days: int, hours: int, minutes: int, seconds: int, micro: int, negative: bool = False) -> bytes:
    return bytes([12]) + struct.pack("<BIBBBI", int(negative), days, hours, minutes, seconds, micro)
