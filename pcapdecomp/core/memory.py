"""The process's memory between stages: freed heap given back to the OS (glibc's malloc_trim), big blocks in their
own mappings, and Arrow's allocator. Nothing of this changes a result; on a libc other than glibc it does nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import pyarrow as pa


def use_returning_allocator() -> None:
    """Arrow's default allocator (mimalloc) keeps freed pages for reuse: after a few hundred thousand short-lived
    string arrays (one per batch, before dictionary encoding) it held ~0.4 KB per exchange that nothing used. The
    system allocator gives them back (with `release_memory`). Called by the CLI, not on import: a library should
    not change its host's allocator."""
    pa.set_memory_pool(pa.system_memory_pool())


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, looked up on first use: in the symbols the process has loaded already (libc's among
    them), else in the libc that ctypes.util finds. That search runs ldconfig in a child process: the last way, not
    the first, so that a run does not pay for it."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        return trim
    name = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None


def map_big_blocks(size: int | None) -> None:
    """Blocks of `size` bytes and more in their own mappings, given back to the OS when freed; None: 32 MiB and
    more, where glibc's own threshold ends up once tables of a million rows come and go. glibc's default raises
    its threshold to the largest block freed so far: after the first columns, every array of a million-row table
    comes from the heap, and a freed one stays there, under what was allocated after it, until `release_memory`
    (which gives back only the top of the heap and whole free pages). The extraction and the loss repair free
    and make such arrays by the hundred (batches, the repair's scan of a capture, its re-read), so analyze sets
    1 MiB up to the end of the repair, which lowers its peak. A fresh mapping per array costs page faults, so not
    for the whole run: after the repair 4 MiB (pair.pairing.AFTER_THE_REPAIR_BYTES), where the columns of a long
    capture, which the later stages make and free beside the table, would otherwise stay in the heap (the numbers:
    docs/speed.md). Not glibc: nothing."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is not None:
        mallopt(-3, size or 32 << 20)  # M_MMAP_THRESHOLD (setting it also ends glibc's adjusting of it)


@functools.cache
def _libc():
    """The C library this process runs on (its symbols, without ldconfig's search of find_library)."""
    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):  # TypeError: Windows wants a name
        return None


def release_memory() -> None:
    """Hand freed heap memory back to the OS between stages (glibc's malloc_trim; nothing elsewhere), so the next
    stage and the reported RSS start from what is live."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
