"""Decode COM_STMT_EXECUTE parameters (binary protocol) into SQL literals for the `params` column."""

from __future__ import annotations

import struct

from .wire import WireError, read_lenenc_bytes, read_lenenc_int

T_DECIMAL, T_TINY, T_SHORT, T_LONG, T_FLOAT, T_DOUBLE, T_NULL, T_TIMESTAMP, T_LONGLONG, T_INT24 = range(10)
T_DATE, T_TIME, T_DATETIME, T_YEAR = 10, 11, 12, 13
_FIXED_INT = {T_TINY: 1, T_SHORT: 2, T_YEAR: 2, T_LONG: 4, T_INT24: 4, T_LONGLONG: 8}
_UNSIGNED = 0x8000


def _quote(raw: bytes) -> str:
    value = raw.decode("utf-8", "replace")
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _temporal(buf: bytes, pos: int, kind: int) -> tuple[str, int]:
    length = buf[pos]
    body = buf[pos + 1 : pos + 1 + length]
    pos += 1 + length
    if kind == T_TIME:
        if length == 0:
            return "'00:00:00'", pos
        neg, days, h, m, s = struct.unpack_from("<BIBBB", body)
        micro = struct.unpack_from("<I", body, 8)[0] if length >= 12 else 0
        hours = days * 24 + h
        value = f"{'-' if neg else ''}{hours:02d}:{m:02d}:{s:02d}" + (f".{micro:06d}" if micro else "")
        return f"'{value}'", pos
    if length == 0:
        return "'0000-00-00 00:00:00'", pos
    year, month, day = struct.unpack_from("<HBB", body)
    value = f"{year:04d}-{month:02d}-{day:02d}"
    if length >= 7:
        h, m, s = body[4], body[5], body[6]
        value += f" {h:02d}:{m:02d}:{s:02d}"
        if length >= 11:
            value += f".{struct.unpack_from('<I', body, 7)[0]:06d}"
    return f"'{value}'", pos


def decode_value(buf: bytes, pos: int, type_code: int) -> tuple[str, int]:
    kind = type_code & 0xFF
    unsigned = bool(type_code & _UNSIGNED)
    if kind in _FIXED_INT:
        width = _FIXED_INT[kind]
        if pos + width > len(buf):
            raise WireError("parameter past end")
        return str(int.from_bytes(buf[pos : pos + width], "little", signed=not unsigned)), pos + width
    if kind == T_FLOAT:
        return repr(struct.unpack_from("<f", buf, pos)[0]), pos + 4
    if kind == T_DOUBLE:
        return repr(struct.unpack_from("<d", buf, pos)[0]), pos + 8
    if kind == T_NULL:
        return "NULL", pos
    if kind in (T_DATE, T_DATETIME, T_TIMESTAMP, T_TIME):
        if pos >= len(buf):
            raise WireError("parameter past end")
        return _temporal(buf, pos, kind)
    raw, pos = read_lenenc_bytes(buf, pos)  # strings, decimals, blobs, JSON, ...
    return ("NULL" if raw is None else _quote(raw)), pos


def decode_execute(
    payload: bytes,
    num_params: int | None,
    prior_types: list[int] | None,
    query_attributes: bool,
    long_data: dict[int, int] | None = None,
) -> tuple[str | None, list[int] | None, int]:
    """Parse COM_STMT_EXECUTE after the command byte: statement id (4), flags (1), iteration count (4), then
    the NULL bitmap, the new-params-bound flag, the types and the values.

    Returns (params as comma-separated SQL literals or None, the parameter types in force, flags).
    `num_params` comes from the statement's PREPARE response; None when the prepare was not captured, in which
    case the values cannot be delimited and params stays None. `long_data` maps parameter index -> bytes sent
    with COM_STMT_SEND_LONG_DATA: those values are not in the packet.
    """
    if len(payload) < 9:
        raise WireError("short COM_STMT_EXECUTE")
    flags = payload[4]
    pos = 9
    if query_attributes and flags & 0x08:  # PARAMETER_COUNT_AVAILABLE
        count, pos = read_lenenc_int(payload, pos)
        num_params = count
    if num_params is None:
        return None, prior_types, flags
    if num_params == 0:
        return "", prior_types, flags
    bitmap_len = (num_params + 7) // 8
    nulls = payload[pos : pos + bitmap_len]
    pos += bitmap_len
    if pos >= len(payload):
        raise WireError("COM_STMT_EXECUTE cut before parameter types")
    new_bound = payload[pos]
    pos += 1
    types = prior_types
    if new_bound:
        types = []
        for _ in range(num_params):
            types.append(struct.unpack_from("<H", payload, pos)[0])
            pos += 2
            if query_attributes:
                _, pos = read_lenenc_bytes(payload, pos)
    if types is None or len(types) != num_params:
        return None, types, flags
    values = []
    for i, type_code in enumerate(types):
        if nulls[i // 8] >> (i % 8) & 1:
            values.append("NULL")
            continue
        if long_data and i in long_data:
            values.append(f"<long data: {long_data[i]} bytes>")
            continue
        value, pos = decode_value(payload, pos, type_code)
        values.append(value)
    return ", ".join(values), types, flags


def split_params(params: str) -> list[str] | None:
    """The `params` column back into its SQL literals: "1, 'a, b', NULL" -> ["1", "'a, b'", "NULL"]. Literals are
    joined by ", " (as decode_execute writes them); a string is single- or double-quoted, with backslash escapes or a doubled
    quote inside. None when the text does not split cleanly (a quote left open: a value cut short)."""
    values: list[str] = []
    i, n = 0, len(params)
    while n:
        start = i
        while i < n and not params.startswith(", ", i):
            quote = params[i]
            i += 1
            if quote in "'\"":
                while i < n and params[i] != quote:
                    i += 2 if params[i] == "\\" else 1
                if i >= n:
                    return None
                i += 1  # past the closing quote (a doubled quote opens again on the next turn)
        values.append(params[start:i])
        if i >= n:
            return values
        i += 2
    return values
