"""Result-set row walking, the loop that touches most packets of a busy server. The native twin in
pcapdecomp/_speedups.c (built when a C compiler is at hand) has the same contract; tests compare the two."""

from __future__ import annotations

MAX_PACKET = 0xFFFFFF


def walk_rows_py(data: bytes, pos: int, expect: int) -> tuple[int, int, int, int]:
    """Count whole row packets from `pos` -> (pos after them, rows, next expected sequence id, start of the last
    row or -1). Stops before anything that is not plainly a row: a terminator or error (lead byte 0xFE/0xFF), an
    empty or 16 MiB packet, a packet cut by the end of `data`, a sequence id other than `expect`."""
    n = len(data)
    pos = max(pos, 0)
    expect &= 0xFF
    rows, last_start = 0, -1
    while pos + 4 < n:
        length = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
        end = pos + 4 + length
        if length == 0 or length >= MAX_PACKET or end > n or data[pos + 3] != expect:
            break
        first = data[pos + 4]
        if first == 0xFE or first == 0xFF:
            break
        expect = (expect + 1) & 0xFF
        last_start, pos = pos, end
        rows += 1
    return pos, rows, expect, last_start


try:
    from .._speedups import walk_rows as walk_rows_native
except ImportError:  # no compiler when installed: the Python twin does the work
    walk_rows_native = None

walk_rows = walk_rows_native or walk_rows_py
NATIVE = walk_rows_native is not None
