"""Recognise MySQL by content: a server greeting, or the shape of a command and its answer.

Used to find servers on any port and to resynchronise after a capture gap or a mid-connection start: a
position is accepted only when the bytes there are unambiguously a packet header of the expected kind, so a
statement is never invented from misaligned bytes.
"""

from __future__ import annotations

import zlib

from .wire import COMMON_COMMANDS, MAX_PACKET

_PRINTABLE = frozenset(range(0x20, 0x7F)) | {0x09, 0x0A, 0x0D}


def _header(data: bytes) -> tuple[int, int]:
    return data[0] | data[1] << 8 | data[2] << 16, data[3]


def _texty(raw: bytes, min_share: float = 0.8) -> bool:
    """SQL-like text: starts with a printable ASCII character and is mostly printable or UTF-8."""
    sample = raw[:64]
    if not sample or sample[0] not in _PRINTABLE:
        return False
    good = sum(1 for b in sample if b in _PRINTABLE or b >= 0x80)
    return good >= min_share * len(sample)


def _command_body_ok(cmd: int, body: bytes, length: int) -> bool:
    """Does the payload after the command byte fit the command? `body` may be cut (length is the full size)."""
    if cmd in (0x01, 0x09, 0x0E, 0x1F):  # QUIT, STATISTICS, PING, RESET_CONNECTION: the byte alone
        return length == 1
    if cmd in (0x19, 0x1A, 0x0C):  # STMT_CLOSE, STMT_RESET, PROCESS_KILL: 4-byte id
        return length == 5
    if cmd == 0x1C:  # STMT_FETCH: id + row count
        return length == 9
    if cmd == 0x1B:  # SET_OPTION
        return length == 3
    if cmd == 0x17:  # STMT_EXECUTE: id, flags, iteration count (always 1)
        return length >= 10 and len(body) >= 9 and body[5:9] == b"\x01\x00\x00\x00" and body[4] < 0x10
    if cmd == 0x18:  # SEND_LONG_DATA: id, param id, data
        return length >= 7
    if cmd in (0x03, 0x16):  # QUERY / PREPARE: text, possibly after query attributes (count 0, set 1)
        if length < 2:
            return False
        if body[:2] == b"\x00\x01":
            return length > 3 and _texty(body[2:])
        return _texty(body)
    if cmd in (0x02, 0x04, 0x11):  # INIT_DB, FIELD_LIST, CHANGE_USER: a name
        return length > 1 and _texty(body)
    return False


def plausible_command(data: bytes) -> bool:
    """A whole client command packet (or the start of one) at data[0]."""
    if len(data) < 5:
        return False
    length, seq = _header(data)
    cmd = data[4]
    if seq != 0 or length == 0 or length >= MAX_PACKET or cmd not in COMMON_COMMANDS:
        return False
    if not _command_body_ok(cmd, data[5 : 4 + length], length):
        return False
    end = 4 + length
    if end > len(data):  # the packet continues in later segments: only text commands can be told apart
        return cmd in (0x03, 0x16)
    if end < len(data):  # pipelined: the next bytes must start another command
        rest = data[end:]
        return len(rest) < 4 or rest[3] == 0
    return True


def compressed_command(data: bytes) -> str | None:
    """A compressed-protocol packet whose inner bytes start with a command: returns 'zlib'/'zstd' or None."""
    if len(data) < 8:
        return None
    comp_len = data[0] | data[1] << 8 | data[2] << 16
    plain_len = data[4] | data[5] << 8 | data[6] << 16
    if comp_len == 0 or 7 + comp_len > len(data) or data[3] != 0:
        return None
    stored = data[7 : 7 + comp_len]
    if plain_len == 0:
        return "zlib" if plausible_command(stored) else None
    if stored[:1] == b"\x78":
        try:
            inner = zlib.decompressobj().decompress(stored, plain_len + 1)
        except zlib.error:
            return None
        return "zlib" if len(inner) == plain_len and plausible_command(inner) else None
    if stored[:4] == b"\x28\xb5\x2f\xfd":
        return "zstd"
    return None


def plausible_first_response(data: bytes) -> bool:
    """Stricter than plausible_response_start, for deciding that a connection is MySQL at all: the answer to a
    command (seq 1) whose first byte is OK, ERR, EOF, LOCAL INFILE or a small column count, and whose packet ends
    inside the segment or at a following header with the next sequence id."""
    if looks_like_tls(data) or not plausible_response_start(data, 1):
        return False
    length, _ = _header(data)
    first = data[4]
    if not (first in (0x00, 0xFF, 0xFE, 0xFB) or 0 < first < 0xFB and first <= 4096):
        return False
    end = 4 + length
    if end == len(data):
        return True
    if end < len(data):
        rest = data[end:]
        return len(rest) < 4 or rest[3] == 2
    return first not in (0x00, 0xFF, 0xFE) and length < (1 << 20)


def plausible_response_start(data: bytes, expected_seq: int) -> bool:
    """A server packet header at data[0] with the sequence id the pending request calls for."""
    if len(data) < 5:
        return False
    length, seq = _header(data)
    return seq == expected_seq and 0 < length <= MAX_PACKET


def plausible_compressed_response(data: bytes) -> bool:
    """A compressed-protocol packet answering a compressed command: compressed sequence id 1."""
    if len(data) < 8:
        return False
    comp_len = data[0] | data[1] << 8 | data[2] << 16
    plain_len = data[4] | data[5] << 8 | data[6] << 16
    if data[3] != 1 or comp_len == 0:
        return False
    stored = data[7:]
    if plain_len == 0:
        return plausible_response_start(stored, 1)
    return stored[:1] == b"\x78" or stored[:4] == b"\x28\xb5\x2f\xfd"


def plausible_greeting(data: bytes) -> bool:
    """Protocol-10 (or 9) server greeting: seq 0, version byte, printable NUL-terminated version string."""
    if len(data) < 10:
        return False
    length, seq = _header(data)
    if seq != 0 or data[4] not in (9, 10) or length < 10 or length > 1024:
        return False
    end = data.find(b"\x00", 5, 5 + 64)
    if end < 6:
        return False
    version = data[5:end]
    return all(b in _PRINTABLE for b in version) and version[:1].isdigit()


# Errors a server sends on its own, with no request pending, just before it closes a connection. Each needs the
# client to have been connected (a failed read of its next command, an idle timeout, a kill), so none can stand
# in for a greeting: 1156 packets out of order, 1158-1161 read/write errors and timeouts (1158: the client left
# without COM_QUIT), 1927 connection killed (MariaDB), 4031 ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8.0.24+).
UNPROMPTED_ERRORS = frozenset({1156, 1158, 1159, 1160, 1161, 1927, 4031})


def _err_code(data: bytes) -> int | None:
    """The code of one whole ERR packet filling `data`, else None."""
    if len(data) < 7:
        return None
    length, _ = _header(data)
    if data[4] != 0xFF or 4 + length != len(data):
        return None
    return data[5] | data[6] << 8


def plausible_early_error(data: bytes) -> bool:
    """ERR instead of a greeting (too many connections, host blocked): seq 0, 0xFF, a server error code that can
    come before any client byte (not an unprompted one: a connection seen only from its end is no refusal)."""
    code = _err_code(data)
    return code is not None and data[3] == 0 and 1000 <= code < 5000 and code not in UNPROMPTED_ERRORS


def plausible_unprompted_error(data: bytes) -> bool:
    """One whole ERR packet with a code from UNPROMPTED_ERRORS: a server's last word on its connection."""
    return _err_code(data) in UNPROMPTED_ERRORS


def looks_like_tls(data: bytes) -> bool:
    """A TLS record header: handshake/alert/application data, version 3.x."""
    return len(data) >= 5 and data[0] in (0x15, 0x16, 0x17) and data[1] == 0x03 and data[2] <= 0x04
