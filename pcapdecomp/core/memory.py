"""The process's memory: between stages, freed heap given back to the OS (glibc's malloc_trim), big blocks in their
own mappings, and Arrow's allocator (nothing of this changes a result; on a libc other than glibc it does nothing);
and the stated bound of `analyze --memory` (MemoryBound): the peak predicted from what the extraction read, and the
refusal when it is above the bound."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from .errors import MemoryBoundError, PartitionedInstead, UsageError


def use_returning_allocator() -> None:
    """Arrow's default allocator (mimalloc) keeps freed pages for reuse: after a few hundred thousand short-lived
    string arrays (one per batch, before dictionary encoding) it held ~0.4 KB per exchange that nothing used. The
    system allocator gives them back (with `release_memory`). Called by the CLI, not on import: a library should
    not change its host's allocator."""
    import pyarrow as pa

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


# --- the stated bound of `analyze --memory` ------------------------------------------------------------------------
#
# analyze holds every exchange in memory (about 1 KB each: docs/scale.md, "Memory: the stated bound"). Before a
# capture too big for the machine runs for an hour and is then killed, it predicts its peak from what it has read
# and stops while the prediction is above the bound: during the extraction from the memory the process tree holds
# so far, as the capture is read (`MemoryBound.watching`), and once the counts are known from the per-unit costs
# below (`MemoryBound.check`). The costs were measured on main's code; benchmarks/memory_bound.py prints the peaks
# beside the predictions so that they can be measured again: a bound stays a bound when later work lowers the peaks.

DEFAULT_SHARE = 0.8  # of the memory available at the start (MemAvailable, or what the cgroup's limit leaves)

# the peak above the process's memory at the start (its imports), per unit of what the extraction found, fitted
# with a margin over the recordings' peaks (docs/scale.md, "Memory: the stated bound": 1.1-1.5 times the 10 s and
# 40 s recordings' peaks with --jobs 1, once analyze held its tables narrower, core.tables.held). The peak per
# exchange grows with the slow log's entries (the join's search, the largest transient left), so the costs follow
# the largest recording and the small ones get the wider margin:
COST_FIXED = 64 << 20  # the report's and the verdict's fixed parts, the slow log, a forked child's start
COST_PER_DB_EXCHANGE = 625  # an exchange at a DB point: its row through the join, the decomposition, the report
COST_PER_OTHER_EXCHANGE = 200  # an exchange at an app or proxy point: its row until it is matched, the clock's pass
COST_PER_CONNECTION = 16 << 10  # a connection's state: its row, its timelines, the matching's per-connection parts
# a MySQL byte at a point that lost bytes (gaps): the loss repair reads its connections again beside the tables, and
# what it holds follows the bytes it reads, not the exchanges: the 150 s read-write pair (1.5 M exchanges, 3.03 GB
# of MySQL bytes at its lossy app point, every connection read again) peaked at 2,886 MiB in the repair, 1,690 MiB
# above any other stage (2026-12-01: a cost per exchange fitted to the read-only shape, 556 B a capture byte per
# exchange against 2.2 KB here, predicted 1,642 MiB: no bound); 0.7 B a byte was 1.17x that peak. Since the
# handover in shared memory (docs/scale.md) the repair costs far less: 2026-12-02 night, the lossless 150 s
# read-write pair with 0.02 % of its DB frames dropped (3.81 GB of MySQL bytes in 16 lossy connections, all re-read)
# peaked at 1,410 MiB (--jobs 1) and 1,818 MiB (--jobs 2) of the tree, predicted at 0.7 B a byte 4.10 and 4.70 GiB
# (2.9x and 2.6x: the repair dropped where it fits); the lossy 40 s read-write pair (707 MB) at 467 and 471 MiB,
# predicted 921 MiB and 1.03 GiB. At 0.15 B a byte: 1.18–1.49x the four peaks
COST_PER_REPAIRED_BYTE = 0.15
# analyze --spill (run/spilled.py: the partitioned run) holds one partition's rows, one row group of the merged
# writer, the thread-pool view's columns, then the projection the summary and the report read back: fitted with a
# margin over its measured peaks, on their growth at scale (docs/scale.md, "Memory: the stated bound"; refitted
# 2026-12-03 on main 2210487, the row keys in files and the projection narrower, docs/partitioned.md §29: 20 runs of
# benchmarks/memory_bound.py --spill yes, the 10 s and 40 s read-only and read-write pairs and 4 copies of the
# read-write one, pair and DB alone, --jobs 1 and 2: predicted 1.20-1.63 times the peaks, where the costs before,
# 352 B and 48 B, predicted 1.30-2.07; the 21-copy pair, 4,667,754 exchanges a point, peaked at 943-953 MiB of Pss:
# predicted 1,454 MiB, 1.53 times: 2,095 before, over a bound of 2 GiB)
PARTITIONED_COST_FIXED = 192 << 20  # one partition (65,536 rows), one row group (131,072 rows), the report's parts
PARTITIONED_COST_PER_DB_EXCHANGE = 224  # its view columns, its row of the projection, where it went
PARTITIONED_COST_PER_OTHER_EXCHANGE = 32  # an app exchange: the pairing's first pass, the clock's segments
SPILL_SHARE = 0.6  # --spill DIR: the spill folder's peak over the captures' size (partitioned.md §20: 0.58–0.60 a DB
# capture alone, 0.39 a pair)
# with --jobs N, the children beside this process (the extraction's workers, the writer and the report's profile
# at the end) add their own: this share of the growth per process beyond the first, for at most MORE_PROCESSES
COST_PER_JOB = 0.15
MORE_PROCESSES = 3
# during the extraction: the run's peak above the start is at least COST_FIXED and this many times what the
# extraction's processes hold (the lowest of the recordings, the 40 s read-write pair's, whose tables analyze holds
# narrower from the extraction on (core.tables.held): 64 MiB + 0.91 x 328 MiB of Pss = its peak, 364 MiB above the
# start; the DB capture alone's 1.06): a need the counts' prediction would rarely put lower, and the extraction
# itself stays under the bound
PEAK_OVER_EXTRACTION = 0.9
# the first share of a capture may not stand for all of it: its extrapolation to the whole capture refuses a run
# only past this share, and above the bound by EXTRAPOLATION_MARGIN (what is held so far refuses at any share)
EXTRAPOLATE_AFTER = 1 / 8
EXTRAPOLATION_MARGIN = 1.25
# a refusal's time window: this share of the one whose exchanges at the capture's average rate would fit, as a
# window in its busy part holds more (a fresh pair of eyes followed "at most 6.0 s" and was refused at 251 MiB of
# 250: the suggested lengths were exact)
WINDOW_MARGIN = 0.8
EXTRACTION_PER_EXCHANGE = 350  # bytes the extraction holds per exchange read (the count a refusal estimates)
WATCH_EVERY_S = 1.0  # seconds between two looks at the process tree's memory during the extraction, at least
WATCH_SHARE = 0.01  # and no more of the extraction's time than this share in looking

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# a sign is read so that -5G is told "must be more than 0", not "not a size"
_SIZE = re.compile(r"\s*([+-]?[0-9]{1,12}(?:\.[0-9]{1,9})?)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


def parse_size(text, what: str = "--memory") -> int:
    """Bytes of a size as a user writes it: 8G, 800M, 1.5GiB, 512MiB, 2048 (K, M, G, T and KiB… or KB…: powers of
    1024, as free(1) and ulimit count). A value that is not one, or not above 0, is a user mistake (one line)."""
    m = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise UsageError(f"{what} {text!r}: not a size; give one like 8G, 800M or 1.5GiB (K, M, G, T: powers of 1024)")
    size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if size <= 0:
        raise UsageError(f"{what} {text!r}: must be more than 0 (a size like 8G, 800M or 1.5GiB)")
    return size


def size_text(size: float, beside: float | None = None) -> str:
    """A size in words: 3.41 GiB, 812 MiB. `beside`: another size the same sentence compares it with; where the two
    read the same (a need 1 MiB above a bound of 1.10 GiB), both are written finer, MiB to a tenth, else bytes, so
    that "1.10 GiB, more than the bound of 1.10 GiB" is never printed."""
    text = _rounded_size_text(size)
    if beside is None or text != _rounded_size_text(beside):
        return text
    if f"{size / (1 << 20):,.1f}" != f"{beside / (1 << 20):,.1f}":
        return f"{size / (1 << 20):,.1f} MiB"
    return f"{size:,.0f} B"


def _rounded_size_text(size: float) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            value = size / (1 << shift)
            return f"{value:.2f} {unit}" if value < 10 and unit in ("TiB", "GiB") else f"{value:,.0f} {unit}"
    return f"{size:.0f} B"


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _inactive_file(stat_path: str, key: str) -> int:
    """A cgroup's reclaimable page cache (memory.stat's inactive_file, total_inactive_file in v1): its usage counts
    the captures' pages the kernel gives back at need."""
    try:
        with open(stat_path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cgroup_headroom() -> tuple[int, str] | None:
    """What this process's memory cgroup (v2 or v1) and its parents' limits leave: (bytes, its file), the least of
    them; None without a limit. Usage counts without the inactive page cache, which the kernel reclaims."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            root, limit_name, usage_name, stat_key = "/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"
        elif "memory" in controllers.split(","):
            root, limit_name, usage_name = "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
            stat_key = "total_inactive_file"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        # the cgroup's own folder and its parents' (a container sees its own cgroup as the mount's root)
        for depth in range(len(parts), -1, -1):
            folder = "/".join([root, *parts[:depth]])
            limit, usage = _read_int(f"{folder}/{limit_name}"), _read_int(f"{folder}/{usage_name}")
            if limit is None or usage is None or limit >= 1 << 60:
                continue
            usage -= _inactive_file(f"{folder}/memory.stat", stat_key)
            found.append((max(0, limit - usage), f"{folder}/{limit_name}"))
    return min(found) if found else None


def mem_available() -> int | None:
    """/proc/meminfo's MemAvailable (bytes): what the machine can give without swapping; None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return None


def own_rss() -> int:
    """This process's resident memory now (bytes; 0 where /proc is not)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def tree_memory(pid: int | None = None) -> int:
    """The proportional set size (Pss: shared pages split between the processes that share them) of a process and
    its descendants, bytes: what the process tree takes from the machine. A process that ends while it is read
    counts 0."""
    return tree_rollup(pid)[0]


def tree_rollup(pid: int | None = None) -> tuple[int, int]:
    """(Pss, Rss) of a process and its descendants, bytes, summed (Rss counts a shared page in each process that
    maps it; Pss splits it between them)."""
    pid = os.getpid() if pid is None else pid
    pss = rss = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:  # Rss comes before Pss
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) << 10
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) << 10
                        break
        except (OSError, ValueError, IndexError):
            pass
    return pss, rss


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (the kernel's children lists of every thread)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                pass
    return out


@dataclass(frozen=True)
class Counts:
    """What the extraction found, that the run's peak grows with."""

    db_exchanges: int
    other_exchanges: int  # at app and proxy points
    connections: int  # MySQL connections, at every point
    points: int
    repaired_bytes: int = 0  # MySQL bytes of the connections with gaps, which the loss repair reads again

    @property
    def exchanges(self) -> int:
        return self.db_exchanges + self.other_exchanges


def predicted_peak(counts: Counts, jobs: int, start: int, partitioned: bool = False) -> int:
    """The peak memory (bytes) of an analysis of `counts` with `jobs` processes, from the process's memory at the
    start (`start`: its imports) and the per-unit costs measured on the recordings: a bound, not an estimate
    (benchmarks/memory_bound.py checks it against measured peaks). `partitioned`: the run of analyze --spill
    (PARTITIONED_COST_*; no loss repair: a pair that lost frames is analysed in memory, repaired, where that fits
    the bound, else partitioned without the repair: run/spilled.py)."""
    if partitioned:
        grown = (PARTITIONED_COST_FIXED + PARTITIONED_COST_PER_DB_EXCHANGE * counts.db_exchanges
                 + PARTITIONED_COST_PER_OTHER_EXCHANGE * counts.other_exchanges
                 + COST_PER_CONNECTION * counts.connections)
        return int(start + grown * (1 + COST_PER_JOB * min(max(jobs, 1) - 1, MORE_PROCESSES)))
    grown = (COST_FIXED + COST_PER_DB_EXCHANGE * counts.db_exchanges
             + COST_PER_OTHER_EXCHANGE * counts.other_exchanges + COST_PER_CONNECTION * counts.connections
             + COST_PER_REPAIRED_BYTE * counts.repaired_bytes)
    return int(start + grown * (1 + COST_PER_JOB * min(max(jobs, 1) - 1, MORE_PROCESSES)))


def available_memory() -> tuple[int, str] | None:
    """What this process may still take now: MemAvailable, or what its cgroup's limit leaves, the less; (bytes, in
    words: "the 21.5 GiB this machine had available"). None where neither is known (not Linux)."""
    available = mem_available()
    cgroup = cgroup_headroom()
    if cgroup is not None and (available is None or cgroup[0] < available):
        return cgroup[0], f"the {size_text(cgroup[0])} the cgroup's {cgroup[1]} left"
    if available is not None:
        return available, f"the {size_text(available)} this machine had available"
    return None


def default_bound() -> tuple[int, str] | None:
    """The bound without --memory: DEFAULT_SHARE of `available_memory()` at the start; (bytes the run may add, where
    it came from). None where it is not known (not Linux): no bound."""
    available = available_memory()
    if available is None:
        return None
    return int(available[0] * DEFAULT_SHARE), f"{DEFAULT_SHARE:.0%} of {available[1]}"


def beyond_the_machine(limit: int, start: int, source: str) -> str | None:
    """A warning for a stated bound (--memory, capture.toml's) above what the machine has available on top of the
    process's `start`: the bound then cannot keep the run from the OOM killer (or swap). None when it can, or when
    what is available is not known."""
    available = available_memory()
    if available is None or limit <= start + available[0]:
        return None
    return (f"{source}: more than {available[1]} at the start (and this process's {size_text(start)}); a run that "
            "needs more than that is ended by the OOM killer, or swaps, instead of being refused")


class MemoryBound:
    """The stated bound of one analysis: the memory its process tree may take (`limit`, bytes; the process's own at
    the start included) and where the number came from (`source`, in words). `check` refuses counts whose
    predicted peak is above it; `watching` wraps the extraction's progress with the check of what it holds so far.
    A refusal is MemoryBoundError: one line, exit 2, nothing written."""

    def __init__(self, size: int | None, source: str | None, jobs: int):
        self.start = own_rss()
        self.jobs = jobs
        if size is None:
            default = default_bound()
            size, source = (None, None) if default is None else (self.start + default[0], default[1] + " at the start")
        self.limit = size
        self.source = source
        self.predicted: int | None = None  # the last prediction from counts (benchmarks read it)

    def count_children(self) -> None:
        """The processes this one started to work for it and that stay (a LocalCluster's scheduler, nannies and
        workers: ≈ 245 MiB for 2 workers) counted in the start, the memory every prediction adds to: the bound is the
        process tree's, and they are in it (before, a run with --scheduler local predicted within --memory 700M
        peaked at 807 MiB of the tree)."""
        self.start = max(self.start, tree_memory())

    def check_start(self) -> None:
        """Refuse at once a bound below what any analysis takes (the imports and the fixed part)."""
        if self.limit is not None and self.start + COST_FIXED > self.limit:
            self._refuse(f"an analysis takes at least {size_text(self.start + COST_FIXED)} of memory here (its "
                         f"programs {size_text(self.start)}, its fixed part {size_text(COST_FIXED)})",
                         self.start + COST_FIXED, None, window_helps=False)

    def check(self, counts: Counts, span_ns: int | None = None, window=None, partitioned: bool = False,
              spill_hint: bool = False) -> None:
        """Refuse `counts` when their predicted peak is above the bound. `span_ns`: the captures' time span (in
        the window, when one was given: `window`, core.window), for the window the message suggests;
        `partitioned`: the peak of analyze --spill's partitioned run; `spill_hint`: an in-memory run of a set the
        partitioned run would take (analyze without --spill): a refusal says what --spill DIR would need (for a pair
        that lost frames, that it would not repair them: run/spilled.py analyses it without the loss repair)."""
        self.predicted = predicted_peak(counts, self.jobs, self.start, partitioned)
        if self.limit is None or self.predicted <= self.limit:
            return
        given, window = window, None
        share = self._window_share(self.predicted, partitioned)
        if span_ns and share > 0:
            window = _duration_text(span_ns * share / 1e9)
        one_job = None
        if self.jobs > 1:  # the processes beside this one add their share: one may fit where they do not
            one_job = predicted_peak(counts, 1, self.start, partitioned)
            one_job = one_job if one_job <= self.limit else None
        spill = in_memory = None
        if spill_hint and not partitioned:
            spill = predicted_peak(counts, self.jobs, self.start, partitioned=True)
            if spill >= self.predicted:  # a small set: the partitioned run's fixed part is more than it saves
                spill = None
        if partitioned:  # (a set partitioned because the look during its extraction put it over the bound in memory
            # may need less in memory than partitioned, once its counts are known)
            in_memory = predicted_peak(counts, self.jobs, self.start)
            if in_memory >= self.predicted:
                in_memory = None
        self._refuse(f"{'partitioned, ' if partitioned else ''}this analysis would need up to about "
                     f"{size_text(self.predicted, self.limit)} of memory for "
                     f"{counts.exchanges:,} exchanges ({counts.db_exchanges:,} at the DB, "
                     f"{counts.connections:,} connections, --jobs {self.jobs})", self.predicted, window,
                     windowed=given is not None, spill=spill, unrepaired=bool(counts.repaired_bytes),
                     in_memory=in_memory, window_helps=self._fixed_peak(partitioned) < self.limit, one_job=one_job)

    def watching(self, progress: Callable[[int, int, int], None] | None,
                 window_share: Callable[[], float | None] | None = None,
                 spill_hint: bool = False, spilled: bool = False) -> Callable[[int, int, int], None]:
        """The extraction's progress callback (`progress`, None when quiet) with the check of the memory the
        extraction's processes hold so far: now and then (WATCH_EVERY_S) their growth since the start (Pss of the
        process tree), times PEAK_OVER_EXTRACTION, as the least peak it leads to; refused when that is above the
        bound, or when its extrapolation to the whole capture is (beyond EXTRAPOLATE_AFTER of it, with
        EXTRAPOLATION_MARGIN). So the extraction stops before it passes the bound itself. `window_share`: with
        analyze --since/--until, the share of the window's time read so far (read.extract.window_share; None: an
        open end): the rows held grow with it, not with the bytes read, so the extrapolation is to the window's
        end (by the bytes, a window at the capture's start would be extrapolated as if every byte after it held
        rows, and one at its end would look empty until it is read). `spill_hint`: as check's (the partitioned run
        named, without a number: the counts are not known yet). `spilled`: the extraction writes its rows to the
        spill (read/spill.py) and holds its batches and connections' state, which do not grow with the bytes read:
        no extrapolation, only what it holds now against the bound (the partitioned run's peak, later, is checked on
        its counts; extrapolated, a spilled read-write pair was refused at 2.2 times its count)."""
        if self.limit is None:
            return progress
        limit, start, clock = self.limit, tree_memory(), time.monotonic
        next_look = clock() + WATCH_EVERY_S
        before_window = 0  # with a window: what the reading before it grew (connections' state, buffers), not
        # extrapolated with the window's rows (a fresh pair of eyes: a 2 s window of a 10 s capture estimated at 7
        # times its exchanges, refused under the bound it then ran within)

        def step(done: int, total: int, frames: int) -> None:
            nonlocal next_look, before_window
            if progress is not None:
                progress(done, total, frames)
            if clock() < next_look:
                return
            looked = clock()
            grown = max(tree_memory() - start, 0)
            took = clock() - looked
            of_window = window_share() if window_share is not None else None
            if of_window is not None and of_window <= 0:
                before_window = grown
            share = of_window if of_window is not None else done / total if total else 0.0
            now = self.start + COST_FIXED + grown * PEAK_OVER_EXTRACTION
            rows_grown = grown - before_window if of_window is not None else grown
            whole = (self.start + COST_FIXED + (before_window + rows_grown / share) * PEAK_OVER_EXTRACTION
                     if share and not spilled else now)
            if now > limit or (not spilled and share >= EXTRAPOLATE_AFTER and whole > limit * EXTRAPOLATION_MARGIN):
                need = int(max(now, whole))
                fits = self._window_share(need, spilled)
                read = (f"the {share:.0%} of the {'window' if of_window is not None else 'captures'} read so far"
                        if share < 0.995 else f"the {'window' if of_window is not None else 'captures'} read")
                self._refuse(f"{'partitioned, ' if spilled else ''}this analysis would need about "
                             f"{size_text(need, limit)} of memory for about "
                             f"{int(grown / EXTRACTION_PER_EXCHANGE / (share if need > now else 1)):,} exchanges "
                             f"(a rough estimate from what {read} hold, {size_text(grown)}"
                             f"{'; extrapolated to the whole' if need > now and share < 0.995 else ''})",
                             need, (f"{fits:.0%} of the {'window' if window_share else 'capture'}'s time"
                                    if fits >= 0.01 else None), stopped_early=True, windowed=window_share is not None,
                             spill_named=spill_hint and self._fixed_peak(True) <= limit,
                             window_helps=self._fixed_peak(spilled) < limit)
            # a look reads every page table of the tree (milliseconds per GiB): at most WATCH_SHARE of the time
            next_look = clock() + max(WATCH_EVERY_S, took / WATCH_SHARE)
        return step

    def _fixed_peak(self, partitioned: bool) -> int:
        """The run's peak for no exchange at all, with this bound's processes: its fixed part. Under a bound below
        it, no time window fits; the partitioned run's (one partition, one row group) is above what an in-memory run
        of a small set needs, and under a bound below it the partitioned run is not the way out."""
        return predicted_peak(Counts(0, 0, 0, 0), self.jobs, self.start, partitioned)

    def _window_share(self, need: int, partitioned: bool) -> float:
        """The share of the captures' time whose exchanges fit the bound, for a run that needs `need` for the whole,
        with WINDOW_MARGIN (≤ 0: none fits)."""
        fixed = self._fixed_peak(partitioned)
        return (self.limit - fixed) / max(need - fixed, 1) * WINDOW_MARGIN

    def _refuse(self, need: str, need_bytes: int, window: str | None, stopped_early: bool = False,
                window_helps: bool = True, windowed: bool = False, spill: int | None = None,
                spill_named: bool = False, unrepaired: bool = False, in_memory: int | None = None,
                one_job: int | None = None) -> None:
        """Stop the run: one line, what it needs, the bound and where it came from, and what to do (`window_helps`:
        a shorter capture would fit; not so for a bound below what any analysis takes; `windowed`: the run had a
        window already, --since/--until, so a shorter one is what would fit; `spill`: the partitioned run's
        predicted peak, said as the other way, within the bound or not; `spill_named`: that way named without a
        number; `unrepaired`: of a pair that lost frames, which it analyses without the loss repair; `in_memory`: a
        partitioned run's refusal, the in-memory run's predicted peak where it is less; `one_job`: the peak with
        --jobs 1, where it is within the bound). A refusal whose
        partitioned run fits the bound, or may (`spill_named`), is PartitionedInstead: analyze without --spill runs
        partitioned instead."""
        more = (f"about --memory {round_up_text(need_bytes)}, a rough estimate: the bound is checked again once the "
                "capture is read" if stopped_early else f"e.g. --memory {round_up_text(need_bytes)}")
        if spill is not None and spill > self.limit and round_up(spill) >= need_bytes:
            spill = None  # the bound that would partition it would keep it in memory: the advice before it
        # the same files for less memory and more CPU (docs/scale.md): the user's choice
        cpu, room = "about 2 to 5 times the CPU", f"room for about {SPILL_SHARE:.0%} of the captures' size"
        costs = f"{cpu}; DIR needs {room}"
        unrepaired_text = "; without the loss repair: the exchanges on lost frames marked, not repaired"
        if spill is not None and spill <= self.limit:  # said only with --in-memory (else it runs so by itself)
            more += (f"), analyse it partitioned (predicted about {size_text(spill)}, within the bound; {cpu}; "
                     f"{room} on its disk{unrepaired_text if unrepaired else ''}; without --in-memory it runs so "
                     "by itself, in the output folder, or with --spill DIR elsewhere")
        elif spill is not None:  # over the bound too, below the in-memory need: a bound for it partitions by itself
            more += (f"), analyse it partitioned (predicted about {size_text(spill)}; "
                     f"{cpu}; {room} on its disk{unrepaired_text if unrepaired else ''}; --memory "
                     f"{round_up_text(spill)} alone does that by itself, in the output folder, or with --spill DIR "
                     "elsewhere")
        elif spill_named:
            more += f"), analyse it partitioned with --spill DIR (less memory for {costs}"
        if in_memory is not None:
            more += ("; in memory, without --spill, it needs less: "
                     + (f"e.g. --memory {round_up_text(in_memory)}" if in_memory > self.limit else
                        f"predicted about {size_text(in_memory)}, within this bound"))
        if one_job is not None:
            more += f"), or --jobs 1 (predicted about {size_text(one_job)}, within the bound"
        window_text = (f", or analyse {'a shorter' if windowed else 'a'} time window"
                       f"{f' of at most {window}' if window else ''}: --since T --until T (ISO 8601 or epoch "
                       "seconds; the captures are still read whole for their connections' state, only that "
                       "window's exchanges are kept)" if window_helps else "")
        over = f"{need}, more than the bound of {size_text(self.limit, need_bytes)} ({self.source})"
        message = (f"{over}; {'stopped early, ' if stopped_early else ''}nothing written. Give it more with --memory "
                   f"({more}){window_text}")
        if spill_named or (spill is not None and spill <= self.limit):  # the partitioned run fits, or may
            raise PartitionedInstead(message, over, round_up_text(need_bytes), unrepaired, early=stopped_early)
        raise MemoryBoundError(message)


def round_up(need: int) -> int:
    """A --memory value above `need`, in bytes: whole GiB from 1 GiB on, else MiB by 64 (round_up_text's)."""
    mib = -(-need // (64 << 20)) * 64
    return (-(-mib // 1024) << 30) if mib >= 1024 else mib << 20


def round_up_text(need: int) -> str:
    """round_up(need) as a --memory value: "2G", "320M"."""
    value = round_up(need)
    return f"{value >> 30}G" if value >= 1 << 30 else f"{value >> 20}M"


def _duration_text(seconds: float) -> str | None:
    """The longest window a refusal suggests, in words, rounded down: a window of at most `seconds` fits, and one
    rounded up to the capture's own length ("at most 40 s" of a 40 s capture) would not. None below 0.1 s."""
    if seconds >= 3600:
        return f"{math.floor(seconds / 360) / 10:.1f} h"
    if seconds >= 60:
        return f"{math.floor(seconds / 60)} min"
    if seconds >= 10:
        return f"{math.floor(seconds)} s"
    return f"{math.floor(seconds * 10) / 10:.1f} s" if seconds >= 0.1 else None
