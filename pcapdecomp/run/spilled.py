"""`analyze --spill DIR`: the partitioned run (docs/partitioned.md §5 step 7). The captures spill their exchanges
into buckets in a folder of the run's own inside DIR (read/spill.py), and the analysis reads them a partition at a
time: the connection step, the clocks and the connection names from the spill (pair.match.spilled_connection_step,
pair.clocks.spilled_clocks, explain.partitioned.spilled_naming), the joined rows (7a: PairedPartitions), the
decomposition (7b: DecomposedPartitions), the thread-pool view, exchanges.parquet by the k-way merge of the
partitions' sorted runs (core.outputs.write_merged), groups.parquet and pool.parquet; then summary.json from the
stored partitions (explain.summaryruns.SummaryOfRuns, fed in row order by the merge: summary_from_runs), and
report.html by today's render.report.render_page from a projection of exchanges.parquet read back: only the
REPORT_COLUMNS it reads, and of them only those it reads of every row (PROJECTED_COLUMNS); the others are read from
the file at the few rows shown (StoredColumns, StoredParams). Every file is the in-memory run's.

With --scheduler the partitions' work (7a's first pass, 7a's rows made and kept, 7b's first pass and rows, the
decomposed partition stored) runs on the Dask workers, one task a partition (run.cluster.DaskRunner.map), the global parts here (the
connection step, clocks, names, 7b's selections, the thread-pool view, the merge); the workers must read and write
the run's folder at its path, else (said in one line) the partitions are analysed on this machine.

What is held across partitions: the 11 columns the thread-pool view reads of every row (VIEW_COLUMNS, ≈ 50 B a
row; gathered in row order a column at a time for thread_pool_view, which reads its references' other columns at
the rows referenced alone and makes no per-row column of every row: _RowsOfView sets them per partition) and where
each row went (its partition and its row there: 6 B a row while the partitions and their rows fit int16 and
int32); the partitions' rows are in files, read back a slice at a time by the writer, a partition at a time by the
summary, and so are their row keys (7 int64 a row: core.outputs.KeyFile, beside the rows), read by the merges a
window at a time and a partition at a time by the summary (docs/partitioned.md §26).

A set this run does not take (`refusal`, before any capture is read; explain.partitioned.NotPartitionable after
the extraction or in the decomposition) is analysed in memory, as without --spill, after one line on the terminal
("--spill: …; analysed in memory"); the run never fails because of --spill. The folder made inside DIR is removed
when the run ends, whatever the end.

Without --spill, a set too big for the memory bound in memory that this run takes within the bound is run here
instead (`spill_instead`: core.errors.PartitionedInstead, raised by the extraction's memory check), its folder in the
output folder (docs/scale.md, "Partitioned instead")."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.console import warn
from ..core.errors import MemoryBoundError, OutputError, PartitionedInstead, UsageError, disk_full
from ..core.framefile import FrameFile
from ..core.groups import equals
from ..core.memory import (COST_PER_DB_EXCHANGE, COST_PER_OTHER_EXCHANGE, SPILL_SHARE, map_big_blocks,
                           release_memory, round_up_text, size_text)
from ..core.outputs import (STAGING_PREFIX, KeyFile, Recoding, SortedRun, StoredRows, interrupts_deferred,
                            key_array, merged_order, write_merged, write_table)
from ..core.schema import ANALYSIS_COLUMNS, CATEGORY, EXCHANGE_COLUMNS
from ..core.tables import frame, held, null_column, with_declared_dtypes
from ..mysql.connection import ENCRYPTED_COMMAND
from ..read.captureset import CaptureSet
from ..read.extract import Extracted, capture_bytes
from ..slowlog.reader import WireStatements

EXCHANGES = (*EXCHANGE_COLUMNS, *ANALYSIS_COLUMNS)
# the text columns: read as categoricals of the file's dictionaries (read_projection, StoredColumns)
TEXT_COLUMNS = frozenset(c.name for c in EXCHANGES if c.dtype == CATEGORY)
# what explain.threadpool.thread_pool_view reads of every row (its timeline, the stall summaries' counts and
# sources): gathered from the partitions in row order, a column at a time (the stalls are numbered, the victims
# sampled and the references listed by row position)
VIEW_COLUMNS = ("server", "conn_id", "db_req_ts", "db_resp_ts", "exec_s", "exec_source", "queue_s", "queue_source",
                "queue_min_s", "hidden_slow", "understated")
# what its references (threadpool.Refs: REF_COLUMNS and EXTRA) read besides: read from the stored partitions at the
# rows referenced alone (threadpool.FetchingRefs)
VIEW_REF_COLUMNS = ("capture", "conn_index", "seq", "thread_group", "query_id", "command", "sql", "app_req_ts",
                    "total_s", "server_s", "in_slow_log", "slow_log_line")
# what report.html is made of (render.report.render_page and what it calls): the columns of exchanges.parquet read
# back for it (PROJECTED_COLUMNS, `params` and ROW_COLUMNS read at the rows shown), once summary.json is made from
# the stored partitions (summary_from_runs); tests/test_spill_run.py fails when it reads another one
REPORT_COLUMNS = ("capture", "conn_index", "conn_id", "client", "server", "command", "sql", "params", "fingerprint",
                  "query_id", "req_first_frame", "resp_last_frame", "response_s", "result",
                  "error_code", "error_message", "rows", "bytes_resp", "user", "db", "seen", "db_client",
                  "db_req_first_frame", "db_resp_last_frame", "app_req_ts", "app_resp_ts", "db_req_ts",
                  "db_resp_ts", "total_s", "server_s", "network_s", "net_req_s", "net_resp_s", "exec_s",
                  "exec_source", "queue_s", "queue_source", "queue_min_s", "in_slow_log", "hidden_slow",
                  "understated", "thread_group", "stall", "stall_role", "proxy_match", "front_conn_id",
                  "proxy_front_req_ts", "proxy_back_req_ts", "proxy_back_resp_ts", "proxy_front_resp_ts",
                  "net_app_proxy_s", "proxy_s", "proxy_wait_s", "net_proxy_db_s")
# what the report reads at a few rows alone (render.report's `columns`: the statements listed, the profile's samples,
# the timeline's statements, the waterfall's, the errors, the logins, the proxy's rows): read from the file at those
# rows (StoredColumns), not held for every row — at 1,157,984 rows of the read-only 40 s pair, 46 B a row of the
# projection (the frame numbers 19, response_s 8, conn_id and thread_group 5 each, conn_index 4, the texts 1 each)
ROW_COLUMNS = ("capture", "conn_index", "conn_id", "client", "server", "query_id", "req_first_frame",
               "resp_last_frame", "response_s", "error_code", "error_message", "db_client", "db_req_first_frame",
               "db_resp_last_frame", "thread_group", "front_conn_id")
# what the projection holds: what the report reads of every row, REPORT_COLUMNS but `params` (the query profile's
# samples' values, some 29 B a row, read for a few rows: StoredParams reads its null mask and the values at those
# rows from the file) and ROW_COLUMNS
PROJECTED_COLUMNS = tuple(c for c in REPORT_COLUMNS if c != "params" and c not in ROW_COLUMNS)
STORED_ROWS = 4096  # rows of a partition in one batch of its stored rows' file (one batch is converted at a time)
VIEW_ROW_COLUMNS = ("thread_group", "stall", "stall_role", "queue_source")  # what the view sets per row
# --jobs 1's mmap threshold in _finish (the writer, the summary, the report): the row group's pieces (a partition's
# slice of some 20,000 rows: 160 KiB an int64 column), the summary's partition read back and the report's arrays
# are made and freed by the thousand, and from the heap their holes stayed in the run's memory, under what was
# allocated after them: at 4 × the 10 s read-write pair, 357 MiB at the writer's peak instead of 316 (docs/
# partitioned.md §22). A fresh mapping costs its page faults: ≈ 5 % more CPU there
LATE_STAGE_BYTES = 64 << 10


def refusal(cs: CaptureSet, csv: bool, partitioned: bool) -> str | None:
    """Why the partitioned run does not take this set, from the set and the options alone (before a capture is
    read); None when it may (the extraction may still find frames lost: NotPartitionable)."""
    if cs.of("proxy") or cs.proxy_servers:
        return "a proxy: its two sides are different TCP connections, paired across connections"
    if not cs.of("db"):
        return "no DB capture: the partitioned run reads a DB point, alone or paired with an app point"
    if len(cs.of("db")) > 1:
        return f"{len(cs.of('db'))} DB points: the thread-pool view per server is not partitioned yet"
    if csv or partitioned:
        return f"{'--csv' if csv else '--partitioned'} writes the whole table at once"
    return None


def fall_back(quiet: bool, why: str) -> None:
    """The one line that says --spill was not followed (on the terminal only: the outputs are the in-memory run's,
    byte for byte)."""
    if not quiet:
        warn(f"--spill: {why}; analysed in memory")


_FULL_SLACK = 1 << 20  # a device with less room left than this after a write found it full is the full one


class SpillFolder:
    """The run's own folder inside the user's --spill DIR (made there, DIR made when missing), removed with everything
    in it when the run ends (`close()`, or the end of `with`); DIR too, and the folders above it, where the run made
    them and they are left empty (a DIR that was there is never removed: it may be a scratch disk's mount point). A DIR
    where no folder can be made is a user mistake (UsageError), found before any capture is read; a DIR that fills up
    during the run is one too (`with`: OutputError, how much room it needs)."""

    def __init__(self, parent: Path, captures_size: int = 0, prefix: str = "pcapdecomp-spill-",
                 named: str | None = None, elsewhere: str = "give another --spill DIR"):
        self.parent, self.needed = Path(parent), _room_needed(captures_size)
        self.named = named if named is not None else f"--spill {parent}"  # DIR as the messages name it
        # what a full device's message advises beside freeing space: a folder the run chose itself (partitioned
        # instead, no --spill given) is not helped by "another --spill"
        self.elsewhere = elsewhere
        if self.parent.is_file():
            raise UsageError(f"{self.named}: is a file, not a folder")
        # the folders this run makes, DIR first: removed again at the end when nothing else is in them
        self.made = [p for p in [self.parent, *self.parent.parents] if not p.exists()]
        try:
            self.parent.mkdir(parents=True, exist_ok=True)
            # absolute: a Dask worker (--scheduler) finds the partitions by this path, from its own working folder
            self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent)).absolute()
        except OSError as err:
            self._remove_made()
            raise UsageError(f"{self.named}: cannot write there ({err.strerror or err})") from None

    def close(self) -> None:
        # a second Ctrl-C (a double press) while the first one's clean-up removes the folder left it behind, half
        # removed (hundreds of MB): the removal ends first, then the interrupt
        with interrupts_deferred():
            shutil.rmtree(self.path, ignore_errors=True)
            self._remove_made()

    def _remove_made(self) -> None:
        for made in self.made:
            try:
                made.rmdir()
            except OSError:  # something else in it (another run's folder, the user's files): kept
                break

    def __enter__(self) -> SpillFolder:
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        full = isinstance(exc, Exception) and disk_full(exc) is not None and self._full()
        self.close()
        if full:  # else the disk-full error of the output folder would say "choose another --out"
            raise OutputError(f"{self.named}: no space left on its device: the run needs about "
                              f"{size_text(self.needed)} free there ({SPILL_SHARE:.0%} of the captures' size): free "
                              f"some space or {self.elsewhere}") from None
        return False

    def _full(self) -> bool:
        """DIR's device is the one that ran out (the output folder's may be another), measured before the run's
        files in it are removed."""
        free = _free_bytes(self.path)
        return free is not None and free < _FULL_SLACK


def _room_needed(captures_size: int) -> int:
    """The room the partitioned run's folder takes at its peak for captures of `captures_size` bytes."""
    return int(captures_size * SPILL_SHARE)


def _free_bytes(path: Path) -> int | None:
    """The bytes an unprivileged writer may still take on `path`'s device; None when it cannot be asked."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class _StoredPartition(StoredRows):
    """A partition's final rows in an Arrow IPC file of batches of STORED_ROWS rows (core.framefile.FrameFile: their
    dtypes and categories kept exactly; no pickle in the folder, which Dask workers may share), read back a slice at
    a time; the thread-pool view's per-row columns are set on each slice as it is read (`view`: _RowsOfView)."""

    def __init__(self, folder: Path, table: pd.DataFrame, view: _RowsOfView | None = None):
        folder.mkdir(parents=True, exist_ok=True)
        self.frames, self.n, self.view = FrameFile(folder / "rows.arrow", table, STORED_ROWS), len(table), None

    def __len__(self) -> int:
        return self.n

    def rows(self, first: int, end: int) -> pd.DataFrame:
        rows = self.frames.rows(first, end)
        return self.view.applied(rows, first) if self.view is not None else rows

    def empty(self) -> pd.DataFrame:
        return self.view.applied(self.frames.empty(), 0) if self.view is not None else self.frames.empty()

    def take(self, rows: list[int]) -> pd.DataFrame:
        """The rows at `rows` (sorted, distinct): each batch that holds some read once, its rows taken."""
        at = np.asarray(rows, dtype=np.int64)
        files = at // STORED_ROWS
        pieces = [self.rows(int(k) * STORED_ROWS, min((int(k) + 1) * STORED_ROWS, self.n)).take(
            at[files == k] - int(k) * STORED_ROWS) for k in np.unique(files)]
        if not pieces:
            return self.empty()
        return pd.concat(pieces, ignore_index=True) if len(pieces) > 1 else pieces[0].reset_index(drop=True)


@dataclass
class _RowsOfView:
    """The thread-pool view's per-row columns of one partition (explain.servers.explain_server sets them on the
    whole table): thread_group from the size the view took, and at the partition's rows it names (sorted) the
    stall and the role (threadpool.stall_marks), and the likely waits it found unheld (queue_source 'estimated')."""

    size: int | None
    marked_rows: np.ndarray
    stall_ids: np.ndarray
    roles: np.ndarray
    roles_present: bool  # any stall in the view: stall_role is a category of the roles, else of nothing
    unheld_rows: np.ndarray

    def applied(self, t: pd.DataFrame, first: int) -> pd.DataFrame:
        from ..explain.threadpool import estimated_at, stall_columns, thread_groups

        n = len(t)
        t = t.copy(deep=False)
        t["thread_group"] = thread_groups(t["conn_id"], self.size)
        stall, role = np.full(n, -1, np.int64), np.full(n, None, dtype=object)
        at = _within(self.marked_rows, first, n)
        stall[self.marked_rows[at] - first], role[self.marked_rows[at] - first] = self.stall_ids[at], self.roles[at]
        t["stall"], t["stall_role"] = stall_columns(stall, role, self.roles_present)
        if len(self.unheld_rows):
            t["queue_source"] = estimated_at(t["queue_source"], self.unheld_rows[_within(self.unheld_rows, first, n)]
                                             - first)
        return with_declared_dtypes(t, EXCHANGES)


def _within(rows: np.ndarray, first: int, n: int) -> np.ndarray:
    """The positions of sorted `rows` that fall in first … first + n − 1."""
    return np.arange(np.searchsorted(rows, first), np.searchsorted(rows, first + n))


def _present(t: pd.DataFrame, present: dict[str, set]) -> None:
    """The values of each categorical column of `t` that occur, added to `present`."""
    for name, column in t.items():
        if isinstance(column.dtype, pd.CategoricalDtype):
            codes = column.cat.codes.to_numpy()
            present.setdefault(name, set()).update(column.cat.categories[np.unique(codes[codes >= 0])].tolist())


def _side_categories(points) -> dict[str, list]:
    """Each categorical extraction column's categories of a side's table (its points' tables concatenated: the
    union of the batches' dictionaries, as tables._categorical unifies them, unused entries included), from the
    spilled buckets; {} for a side without a capture."""
    names = [c.name for c in EXCHANGE_COLUMNS if c.dtype == CATEGORY]
    values: dict[str, set] = {}
    for x in points:
        for name, unused in x.spill.unused_values().items():  # a window's dropped rows' entries (read/spill.py)
            values.setdefault(name, set()).update(unused)
        for bucket in range(len(x.spill.rows)):
            for batch in x.spill.bucket(bucket):
                for name in names:
                    column = batch.column(name)
                    held_values = column.dictionary if hasattr(column, "dictionary") else column.unique()
                    values.setdefault(name, set()).update(v for v in held_values.to_pylist() if v is not None)
    return {name: sorted(values.get(name, ())) for name in names} if points else {}


def spill_folder(run, cs: CaptureSet) -> Path | None:
    """The run's folder in --spill DIR (a DIR it cannot write: UsageError, before any capture is read), removed when
    the run ends; None when the set is analysed in memory (`refusal`, said in one line)."""
    o = run.options
    folder = SpillFolder(o.spill, _captures_size(cs))
    why = refusal(cs, o.csv, o.partitioned)
    if why is not None:
        folder.close()
        fall_back(o.quiet, why)
        return None
    return _taken(run, folder)


# analyze without --spill, of a set too big for the bound in memory: the partitions go to the output folder, named as
# its staging folders are, so that the next run in that folder removes what a killed run left (core.outputs)
INSTEAD_PREFIX = f"{STAGING_PREFIX}spill-"


def spill_instead(run, cs: CaptureSet, over: PartitionedInstead, noted: int) -> Path:
    """The partitioned run's folder for a set whose in-memory run would pass the bound (`over`, raised by the
    extraction's memory check; what it held is gone): made in the output folder, removed when the run ends, and said
    in one warning. The run's warnings from the `noted`-th on are the extraction's: taken back (the captures are read
    again, and say them again). Refused (MemoryBoundError: one line, exit 2) when the output folder's device has less
    room than the partitioned run needs: the user then chooses --spill DIR elsewhere, or more memory."""
    size = _captures_size(cs)
    needed, free = _room_needed(size), _free_bytes(run.out) or 0
    if free < needed:
        raise MemoryBoundError(f"{over.over}, and partitioned it would need about {size_text(needed)} free in the "
                               f"output folder {run.out} ({SPILL_SHARE:.0%} of the captures' size), which has "
                               f"{size_text(free)}; nothing written. Give it more with --memory (e.g. "
                               f"{over.keep_text}), or analyse it partitioned with --spill DIR on a disk with room")
    release_memory()  # the in-memory extraction's arrays, before the captures are read again
    run.take_back_warnings(noted)
    run.spill_automatic = True
    folder = SpillFolder(run.out, size, prefix=INSTEAD_PREFIX, named=f"the output folder {run.out}",
                         elsewhere=f"analyse it with --spill DIR on a disk with room (or more --memory, e.g. "
                                   f"{over.keep_text})")
    _say_instead(run, over)
    return _taken(run, folder)


def _say_instead(run, over: PartitionedInstead) -> None:
    """The one warning of a run partitioned because it would pass the bound in memory."""
    files = "without the loss repair, said below" if over.unrepaired else "the same files"
    run.note(f"in memory, {over.over}: analysed partitioned instead, as with --spill ({files}, for about 2 "
             f"to 5 times the CPU; {over.keep_text} would keep it in memory), its partitions in a folder of "
             f"{run.out} removed at the end (docs/scale.md; --spill DIR puts them elsewhere, --in-memory refuses "
             "instead)")


# spill_first's "surely fits" with --scheduler: the in-memory run's peak per byte of all the set's capture files, above
# what was measured (0.5 for the 10 s read-write pair's 609 MB, 0.8–1.5 for read-only pairs of 0.3–2.3 GB: small
# packets hold more exchanges a byte; docs/scale.md)
IN_MEMORY_PER_CAPTURE_BYTE = 2.0
# without it, spilled first only where the in-memory run's predicted peak (core.memory.predicted_peak, which decides)
# is over the bound for every shape measured: its cost per byte of capture files is lowest for the largest exchanges,
# the read-write recordings' 2,191 B a point (0.19 B a byte for a pair, 0.29 for the DB capture alone). Below, the
# captures are read in memory, the fast path (spilled first and read back, the 40 s read-write pair under --memory 3G
# took 1.6 times the CPU of the in-memory run, 16.9 s against 10.8), and the look during the extraction guards the
# bound
LARGEST_BYTES_PER_EXCHANGE = 2300
SPILL_FIRST_PER_CAPTURE_BYTE = (COST_PER_DB_EXCHANGE + COST_PER_OTHER_EXCHANGE) / (2 * LARGEST_BYTES_PER_EXCHANGE)


def spill_first(run, cs: CaptureSet) -> Path | None:
    """With a memory bound, without --spill or --in-memory, for a set the partitioned run takes: the folder in the
    output folder (the same hidden folder as spill_instead's) the captures' rows are spilled into as they are read,
    so that no table is held whole before the bound is asked; `in_memory_fits` then decides: in memory, the tables
    read back from the folder, or partitioned. On --scheduler's Dask workers when the set may not fit in memory (its
    captures' size times IN_MEMORY_PER_CAPTURE_BYTE above the bound: else the workers' tables all came back here
    before the counts were known, 602 MiB under --memory 450M, then read again partitioned); here when it is likely
    over (times SPILL_FIRST_PER_CAPTURE_BYTE: else the look during the extraction let a 10 GB pair be read whole,
    2,444 MiB under --memory 3G, then read again partitioned; spilled first, 953 MiB: docs/scale.md). None (the
    captures read in memory, as before) without a bound, for a set the partitioned run does not take or below those
    sizes, here with a time window, or when the output folder's device lacks the room (then the look during the
    extraction guards the bound), or when a Dask worker cannot see the folder (then read on the workers in memory:
    a folder of this machine they do not share)."""
    o = run.options
    if run.memory is None or run.memory.limit is None or o.in_memory:
        return None
    if refusal(cs, o.csv, o.partitioned) is not None:
        return None
    if run.runner is None and cs.window is not None:
        # --since/--until: the rows held are the window's, not the captures' size's (a fresh pair of eyes found a
        # 15 s window of 4 GB of captures spilled first, for 1.2 times the time and 2 GB of disk); the look during
        # the extraction extrapolates to the window's end
        return None
    size = _captures_size(cs)
    per_byte = IN_MEMORY_PER_CAPTURE_BYTE if run.runner is not None else SPILL_FIRST_PER_CAPTURE_BYTE
    if size * per_byte <= run.memory.limit - run.memory.start:
        return None  # read in memory, as without a bound
    if (_free_bytes(run.out) or 0) < _room_needed(size):
        if run.runner is not None:
            run.note(f"--scheduler: the output folder {run.out} has less room than the workers' spill of these "
                     f"captures needs (about {size_text(_room_needed(size))}): they read them in memory, and the "
                     "memory bound is checked only once their tables are here (--spill DIR on a disk with room keeps "
                     "it all along)")
        return None
    # the counts are not known yet: the least bound the in-memory run may need, by the largest exchanges measured
    least = round_up_text(int(run.memory.start + size * SPILL_FIRST_PER_CAPTURE_BYTE))
    folder = SpillFolder(run.out, size, prefix=INSTEAD_PREFIX, named=f"the output folder {run.out}",
                         elsewhere=f"analyse it with --spill DIR on a disk with room (or more --memory, at least "
                                   f"--memory {least}: the counts decide once the captures are read)")
    run.within(folder)
    if run.runner is None:  # read here, with --jobs N processes, into the folder
        return folder.path
    run.at_exit(run.runner.close)  # its workers' tasks write in the folder: ended before it goes
    blind = run.runner.blind_to(folder.path)
    if blind is not None:  # (the folder goes at the end, with the run)
        run.note(f"--scheduler: Dask worker {blind} cannot read or write the output folder {run.out}: the workers "
                 "read the captures in memory, and the memory bound is checked only once their tables are here "
                 "(--spill DIR on a file system every worker shares keeps it all along)")
        return None
    run.spill_runner = run.runner
    return folder.path


def in_memory_fits(run, cs: CaptureSet, x: Extracted) -> bool:
    """After spill_first's extraction: whether the in-memory run fits the bound (then analysed in memory, its tables
    read back from the folder, as a --spill run of a set the partitioned run does not take); if not, partitioned,
    said in the one warning of spill_instead; when neither fits, refused (MemoryBoundError) as in memory."""
    from ..read.extract import counts_of, span_ns

    try:
        run.memory.check(counts_of(x), span_ns(x.all, cs.window), window=cs.window, spill_hint=True)
    except PartitionedInstead as over:
        run.memory.check(counts_of(x), span_ns(x.all, cs.window), window=cs.window, partitioned=True)
        run.spill_automatic = True
        _say_instead(run, over)
        return False
    return True


def _taken(run, folder: SpillFolder) -> Path:
    """`folder` the run's spill folder until it ends, its workers asked whether they share it."""
    run.within(folder)
    if run.runner is not None:  # its workers' tasks write in the folder: ended (Ctrl-C, an error) before it goes
        run.at_exit(run.runner.close)
    run.spill_runner = spill_workers(run, folder.path)
    return folder.path


def _captures_size(cs: CaptureSet) -> int:
    """The bytes of the set's capture files (0 when one cannot be read: the extraction says why)."""
    try:
        return sum(capture_bytes(p) for p in cs.points)
    except OSError:
        return 0


def analyze_spilled(run, cs: CaptureSet, x: Extracted, folder: Path):
    """The partitioned run of `cs`, extracted into `folder` (x): its outputs written and committed, the
    run.session.AnalysisResult; None when the set is not partitionable after all (said in one line: the caller
    analyses `x` in memory, its tables read back from the spill). A pair that lost frames is partitioned only when
    the in-memory run, which repairs the loss, would pass the bound: then without the repair (`_unrepaired`)."""
    from ..explain.partitioned import NotPartitionable

    notes: list[str] = []  # told once the run is sure to be partitioned: a fallback tells them again itself
    try:
        skipped = _unrepaired(run, cs, x, notes.append)
        made = _partitioned(run, cs, x, folder, notes.append, skipped)
    except NotPartitionable as why:
        if run.spill_automatic:  # partitioned instead (spill_instead), said in a warning: so is the end of it
            run.note(f"the partitioned run: {why}; analysed in memory after all")
        else:
            fall_back(run.options.quiet, str(why))
        if run.memory is not None:  # the bound was checked for the partitioned run: now the in-memory one's
            from ..read.extract import counts_of, span_ns

            run.memory.check(counts_of(x), span_ns(x.all, cs.window), window=cs.window)
        return None
    for message in notes:
        run.note(message)
    paired, server, runs, categories, members = made
    del made
    return _finish(run, cs, x, paired, server, runs, categories, members, folder)


def _unrepaired(run, cs: CaptureSet, x: Extracted, note) -> dict | None:
    """Raises NotPartitionable unless the partitioned run takes `x` (explain.partitioned.check_partitionable). A
    pair that lost frames (LostFrames) is taken when the in-memory run, which would repair the loss, passes the
    bound: without the loss repair, said in one warning (`note`); the answer is then summary.json → repair, said
    skipped (pair.repair.skipped). None: nothing lost at a pair. Else (it fits in memory, or no bound is known)
    LostFrames: analysed in memory, repaired."""
    from ..core.memory import predicted_peak
    from ..explain.partitioned import LostFrames, check_partitionable
    from ..pair.repair import skipped
    from ..read.extract import counts_of

    try:
        check_partitionable(x.app, x.db, x.proxy, cs.proxy_servers)
        return None
    except LostFrames as lost:
        bound = run.memory
        need = predicted_peak(counts_of(x), bound.jobs, bound.start) if bound is not None else None
        if need is None or bound.limit is None or need <= bound.limit:
            raise
        lossy = lost.lossy  # LostFrames is checked last: nothing else stands in the way
    why = (f"in memory, with the repair, this analysis would need up to about {size_text(need, bound.limit)}, more "
           f"than the bound of {size_text(bound.limit, need)} ({bound.source}); the partitioned run does not repair")
    each = [(point.capture, skipped([point], why)) for point in lossy]
    points = " and at ".join(f"{name} ({n['holes']:,} holes, {n['bytes_unrepaired']:,} bytes never captured, in "
                             f"{n['connections']:,} connections)" for name, n in each)
    note(f"frames lost at {points}: the loss repair, which takes such bytes from the other point, was not done: "
         f"{why}. The exchanges on lost bytes are marked (problems gap) rather than repaired, so these files are not "
         "the in-memory run's (summary.json → repair says skipped). To repair them: --memory "
         f"{round_up_text(need)} (analysed in memory), or a --since/--until window around the incident")
    return skipped(lossy, why)


def _partitioned(run, cs: CaptureSet, x: Extracted, folder: Path, note, repair_skipped: dict | None = None):
    """Up to the thread-pool view: (the stand-in Paired, the ServerPart, the stored runs, the categories, the view's
    members by row key: _members_by_key). `repair_skipped`: a pair that lost frames, analysed without the loss
    repair (`_unrepaired`): summary.json → repair."""
    from ..explain.partitioned import (NotPartitionable, PairedPartitions, RunsMadeOnce, in_this_process,
                                       spilled_naming)
    from ..explain.partitioned_decompose import DecomposedPartitions
    from ..explain.servers import LONG_QUERY_TIME_UNKNOWN, joined_info, output_categories, server_slow_log
    from ..explain.summary import ServerPart
    from ..explain.threadpool import FetchingRefs, stall_marks, thread_pool_view
    from ..pair.match import Matching, spilled_connection_step
    from ..pair.pairing import AFTER_THE_REPAIR_BYTES, Paired, points_seen_alone
    from ..pair.proxy import PROXY_SIGN
    from ..slowlog.join import join_slow_log

    app, db = x.app, x.db
    app_rows, db_rows = sum(int(a.spill.rows.sum()) for a in app), sum(int(d.spill.rows.sum()) for d in db)
    if not app_rows + db_rows:  # no partition to make (the in-memory run of nothing costs nothing)
        raise NotPartitionable("no exchange in the captures")
    step = spilled_connection_step(app, db) if app else None
    on_workers = _workers_mapper(run)  # None: the partitions' work in this process
    # the clocks and the names are set below, before a run is made
    rows = PairedPartitions(app, db, step, {}, mapper=on_workers, unrepaired=repair_skipped is not None)
    first = rows.first_pass
    if run.lean:  # as pair_points: the extraction is done (no repair: a pair with frames lost is left unrepaired)
        map_big_blocks(AFTER_THE_REPAIR_BYTES)
    if app and app_rows and db_rows and first.matched < PROXY_SIGN * min(app_rows, db_rows):
        # in memory, a pair that pairs this little directly is searched for a proxy between its points (pair.proxy.
        # through_proxy: an L4 one by shared scrambles, an L7 one by statements across connections), which the
        # partitions do not do: the files could differ (a pooling proxy's pair: 0 rows paired, none through it)
        raise NotPartitionable(f"{first.matched:,} of {min(app_rows, db_rows):,} exchanges paired directly: the "
                               "captures may show a proxy between the points, found by pairing across connections")
    if app and db and first.matched == 0 and app_rows and db_rows:
        note("no exchange was seen at both points: are these captures of the same traffic and time?")
    elif app and db and len(app) + len(db) > 2:
        for message in points_seen_alone(_spilled_rows_by_point(app, db, step)):
            note(message)
    clocks, clock_info = {}, {}
    if app and len(step.connections):
        from ..pair.clocks import spilled_clocks

        clocks, clock_info = spilled_clocks(x.app_points, x.db_points, app, db, step.connections, None, run.jobs,
                                            note, cs.window.around() if cs.window is not None else None)
    run.ahead.end()
    id_sources, named, (app_conns, db_conns) = spilled_naming(cs.processlist, {p.name: p for p in cs.points}, app,
                                                              db, note)
    rows.clocks, rows.id_sources, rows.named = clocks, id_sources, named
    if cs.long_query_time is None:
        note(LONG_QUERY_TIME_UNKNOWN)
    paired_runs = RunsMadeOnce(rows, folder / "runs")  # 7a's runs made once, read back by 7b's second pass
    point = x.db[0].capture
    slow_path = cs.slow_logs.get(point)
    slow, slow_info = server_slow_log(slow_path, run.tz, run.options.max_sql_bytes, lambda: _wire_of(paired_runs),
                                      note)
    decomposed = DecomposedPartitions(paired_runs, cs.long_query_time, cs.thread_pool_size, folder / "narrow",
                                      slow=slow, mapper=on_workers)
    if decomposed.join is not None:  # summary.json's slow-log counts must be join_slow_log's: asked before the rows
        decomposed.join.refuse_unsure_counts()

    # the decomposed partitions: stored, their keys too (files: KeyFile), their view columns kept, the values
    # present gathered
    shared = (decomposed if on_workers is None else decomposed.for_workers(), paired_runs)
    calls = [(p, folder) for p in range(len(paired_runs))]
    stored, keys, views, present = [], [], [], {}
    texts_from_log = False  # an ENCRYPTED row joined to an entry: its texts are the log's (the columns rebuilt)
    for p, (part, key, view, values, from_log, undecided) in enumerate(
            (on_workers or in_this_process)(_stored_decomposition, shared, calls)):
        if undecided is not None:  # counted where the partition's rows were joined (a worker's copy of the join)
            decomposed.join.undecided_counts[p] = undecided
        stored.append(part)
        keys.append(key)
        views.append(view)
        texts_from_log |= from_log
        for name, mine in values.items():
            present.setdefault(name, set()).update(mine)
    del shared
    total = sum(len(k) for k in keys)
    matched_rows = first.matched > 0
    categories = output_categories(_side_categories(app), _side_categories(db),
                                   {**{k: sorted(v) for k, v in present.items()}, "stall_role": []},
                                   db_rows=db_rows > 0, db_only_rows=first.db_only > 0, matched_rows=matched_rows,
                                   statements_from_db=paired_runs.statements_from_db,
                                   texts_from_log=texts_from_log)

    # the view of the whole table, from its view columns in row order
    run_of, row_of = _merged_places(keys)
    table = _view_table(views, categories, run_of, row_of)
    del views
    join = decomposed.join  # the slow log's join (None without a log, or one without an entry: nothing joined)
    if join is not None:
        join.summarize(str(slow_path))
    else:
        join = join_slow_log(pd.DataFrame(index=pd.RangeIndex(total)), slow, str(slow_path))
    joined_info(slow_info, join, note)
    del join, decomposed, slow
    runs = [SortedRun(s, k) for s, k in zip(stored, keys)]
    more = {name: dtype for name, dtype in stored[0].empty().dtypes.items() if name in VIEW_REF_COLUMNS} \
        if stored else {}
    # the references' other columns read at their rows alone
    refs = partial(FetchingRefs, fetch=_rows_by_position(runs, run_of, row_of), more=more)
    # the per-row columns (thread_group, stall, stall_role, queue_source) are set per partition (_RowsOfView), from
    # the rows the view names: not made of every row
    view = thread_pool_view(table, cs.thread_pool_size, refs=refs, per_row=False)
    del refs
    # the rows labelled 'estimated' once the view relabelled some (the in-memory view's column then has the label
    # where decompose put it too)
    unheld = np.union1d(view.unheld, np.flatnonzero(equals(table["queue_source"], "estimated"))) \
        if len(view.unheld) else view.unheld
    del table
    for w in view.warnings:
        note(w)
    size = view.thread_pool_size["value"]
    marked, stall, role = stall_marks(view.stall_members)
    for p, part in enumerate(stored):
        s, u = _of_run(marked, p, run_of, row_of), _of_run(unheld, p, run_of, row_of)
        part.view = _RowsOfView(size, row_of[marked[s]].astype(np.int64), stall[s], role[s],
                                bool(view.stall_members), row_of[unheld[u]].astype(np.int64))
    if len(unheld):  # the view's column: the likely labels of before and 'estimated', the values present sorted
        categories["queue_source"] = sorted({*categories["queue_source"], "estimated"})
    categories["stall_role"] = sorted(set(role.tolist()))
    # the view's members by row key, for summary.json (summary_from_runs): made while where each row went is at hand
    members = _members_by_key(keys, view, run_of, row_of)
    del run_of, row_of, marked, stall, role
    matching = Matching(None, None, None, step.connections if step is not None else frame([], ()), rows.stats())
    paired = Paired(None, None, app_conns, db_conns, matching, clocks, clock_info, app[0].capture if app else None,
                    None, None, id_sources, None, None, None, repair_skipped=repair_skipped)
    return paired, ServerPart(point, view, slow_info), runs, categories, members


def _spilled_rows_by_point(app: list, db: list, step):
    """pair.pairing.points_seen_alone's counts of the partitioned run: per point, its rows (its spilled buckets')
    and its connections paired (the connection step's)."""
    def rows(points) -> dict[str, int]:
        out: dict[str, int] = {}
        for x in points:
            out[x.capture] = out.get(x.capture, 0) + int(x.spill.rows.sum())
        return out

    return (rows(app), step.paired_by_point[0]), (rows(db), step.paired_by_point[1])


def _wire_of(rows) -> WireStatements:
    """slowlog.join.wire_statements of the joined rows (the slow-log reader's check of header-like lines against
    the wire), gathered from 7a's runs a partition at a time (one more pass over them; only with a slow log)."""
    from ..slowlog.join import wire_statements

    return WireStatements.of_parts(wire_statements(run.table) for run in rows)


def spill_workers(run, folder: Path):
    """With --scheduler, the Dask runner (run.cluster.DaskRunner) that takes the spilled run's work, the extraction
    and the partitions, once every worker is found to read and write the run's spill folder at its path; None
    without a scheduler, or (said in one line) when a worker cannot see the folder: the run is then this machine's.
    Asked once a run (run.spill_runner keeps the answer)."""
    if run.runner is None:
        return None
    blind = run.runner.blind_to(folder)
    if blind is not None:
        if not run.options.quiet:
            warn(f"--spill: Dask worker {blind} cannot read or write {folder} (the spill folder must be on a file "
                 "system every worker shares, at the same path); the captures and the partitions analysed on this "
                 "machine")
        return None
    return run.runner


def _workers_mapper(run):
    """The mapper that runs the partitions' work on the Dask workers (run.cluster.DaskRunner.map) when the run's
    spill folder is theirs too (spill_workers); None: the partitions' work in this process."""
    runner = run.spill_runner
    if runner is None:
        return None
    return lambda function, shared, calls: runner.map(function, shared, calls, "partitions on Dask")


def _stored_decomposition(shared, p: int, folder: Path) -> tuple[_StoredPartition, KeyFile, pd.DataFrame, dict,
                                                                  bool, tuple[int, int] | None]:
    """Partition p decomposed (7b's rows, from 7a's run made once) and stored in `folder`; (the stored partition,
    its row keys stored beside it (KeyFile: the file, not the array, comes back), its thread-pool view columns, the
    values each categorical column holds, whether an ENCRYPTED row joined a slow-log entry, its undecided rows'
    counts for the slow-log stats — PartitionedJoin.undecided_counts, None without a join). What this process, or a
    Dask worker, does of a partition: `shared` is (the DecomposedPartitions, the RunsMadeOnce); what it counts must
    come back in the answer (a worker's copy of the join is not the client's)."""
    decomposed, paired_runs = shared
    part = decomposed.rows_of(p, paired_runs.kept(p))
    t = with_declared_dtypes(part.table, tuple(c for c in EXCHANGES if c.name in part.table.columns))
    stored = _StoredPartition(folder / "rows" / f"{p:04d}", t)
    key = KeyFile.written(folder / "rows" / f"{p:04d}" / "keys.npy", part.key)
    # copies: a selection would share (and keep) the partition's blocks of several columns
    view = {c: t[c].copy() for c in VIEW_COLUMNS if c in t.columns}
    present: dict[str, set] = {}
    _present(t, present)
    from_log = bool(((t["command"] == ENCRYPTED_COMMAND) & t["in_slow_log"].fillna(False)).any())
    del part, t
    release_memory()
    undecided = decomposed.join.undecided_counts.get(p) if decomposed.join is not None else None
    return stored, key, view, present, from_log, undecided


def _of_run(places: np.ndarray, run: int, run_of: np.ndarray, row_of: np.ndarray) -> np.ndarray:
    """Of the row positions `places`, the indices of those of partition `run`, in the order of their row in it."""
    at = np.flatnonzero(run_of[places] == run)
    return at[np.argsort(row_of[places[at]], kind="stable")]


def _merged_places(keys: list[KeyFile | np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per row of the merged order (exchanges.parquet's): its run and its row in that run, each in the narrowest
    of int16, int32 and int64 that holds it (6 B a row, not 16, while the partitions and their rows fit: held
    through the thread-pool view), each piece of the merge put in as it comes (no int64 column of every row)."""
    total = sum(len(k) for k in keys)
    run_of = np.empty(total, dtype=_narrowest(len(keys) - 1))
    row_of = np.empty(total, dtype=_narrowest(max((len(k) for k in keys), default=0) - 1))
    at = 0
    for run, row in merged_order(keys):
        run_of[at:at + len(run)], row_of[at:at + len(row)] = run, row
        at += len(run)
    return run_of, row_of


def _narrowest(most: int) -> type:
    """The narrowest of int16, int32 and int64 that holds 0 … `most`."""
    for kind in (np.int16, np.int32):
        if most <= np.iinfo(kind).max:
            return kind
    return np.int64


def _rows_by_position(runs: list[SortedRun], run_of: np.ndarray, row_of: np.ndarray):
    """What reads the rows at positions of the merged order (`run_of`, `row_of`: _merged_places) from the runs
    (explain.summaryruns.rows_at: one take per run)."""
    from ..explain.summaryruns import rows_at

    return lambda positions: rows_at(runs, list(zip(run_of[positions].tolist(), row_of[positions].tolist())))


def _view_table(views: list[dict[str, pd.Series]], categories: dict[str, list], run_of: np.ndarray,
                row_of: np.ndarray) -> pd.DataFrame:
    """The partitions' view columns (VIEW_COLUMNS) as one table in row order (`run_of`, `row_of`: _merged_places),
    made a column at a time, each partition's piece of it let go once it is in: the categoricals with the file's
    categories (as the whole table's), each column in the form the in-memory run holds it (core.tables.held)."""
    names = [name for name in VIEW_COLUMNS if views and all(name in v for v in views)]
    if not names:
        return frame([], ())
    at = np.concatenate([[0], np.cumsum([len(v[names[0]]) for v in views])])[run_of] + row_of
    table = {}
    for name in names:
        pieces = [v.pop(name) for v in views]
        if isinstance(pieces[0].dtype, pd.CategoricalDtype):
            pieces = [c.cat.set_categories(pd.Index(categories[name], dtype="str")) for c in pieces]
        column = pd.concat(pieces, ignore_index=True) if len(pieces) > 1 else pieces[0].reset_index(drop=True)
        del pieces
        table[name] = held(column.take(at).reset_index(drop=True))
        del column
        release_memory()
    return pd.DataFrame(table, copy=False)


def read_projection(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """`columns` of the exchanges.parquet this run wrote, as the in-memory table holds them: the text columns as
    categoricals of the file's dictionaries (every row group's page is the column's whole list, in its order), the
    others in the form `analyze` holds them in (core.tables.held: int32 where whole numbers fit, one stored value
    where every row holds it), a boolean column null in every row one stored null too (the report only reads
    it)."""
    import pyarrow.parquet as pq

    # a column at a time, each Arrow column let go once it is pandas': the projection is held once, beside one
    # column's Arrow form (the whole file read at once held both); the file memory-mapped, its mapping let go with
    # each column: the column chunks' bytes are read from the mapped pages, not into buffers of the heap whose
    # holes stayed in the run's memory under the columns kept (at 362,248 rows, 104 MiB held for 72 of columns;
    # mapped, 74: docs/partitioned.md §22)
    table = None
    for name in columns:
        with pq.ParquetFile(path, read_dictionary=[name] if name in TEXT_COLUMNS else None, memory_map=True) as file:
            column = file.read(columns=[name], use_pandas_metadata=True).to_pandas(self_destruct=True)[name]
        column = held(column)
        if isinstance(column.dtype, pd.BooleanDtype) and len(column) > 1 and column.isna().all():
            # (in_slow_log without a slow log, understated): one stored null, no bytes per row as held's others
            column = null_column(len(column), "boolean").set_axis(column.index).rename(name)
        if table is None:
            table = column.to_frame()
        else:
            table[name] = column
        del column
        release_memory()  # the column's Arrow form and its declared width, back before the next column is read
    return table


class StoredParams:
    """The `params` column of exchanges.parquet as explain.digest.profile reads it (digest.HeldParams' null mask
    and values at rows), without holding it: the report's projection leaves it out (PROJECTED_COLUMNS) and the
    profile reads the values of its samples alone, a row group at a time."""

    def __init__(self, path: Path):
        self.path = path

    def null(self) -> np.ndarray:
        """Per row, whether its params are null: each row group's column read, its mask kept, the column let go."""
        masks = [group.column("params").is_null().to_numpy() for _, group in _row_groups(self.path, "params", None)]
        return np.concatenate(masks) if masks else np.zeros(0, dtype=bool)

    def at(self, rows: np.ndarray) -> list:
        """The values at `rows` (positions in the file), None where null, in the order of `rows`."""
        import pyarrow as pa

        rows = np.asarray(rows, dtype=np.int64)
        values: list = [None] * len(rows)
        for start, group in _row_groups(self.path, "params", rows):
            column = group.column("params")
            mine = np.flatnonzero((rows >= start) & (rows < start + len(column)))
            for i, value in zip(mine.tolist(), column.take(pa.array(rows[mine] - start)).to_pylist()):
                values[i] = value
        return values


class StoredColumns:
    """The columns the report reads at a few rows alone, as digest.HeldColumns gives them of the whole table,
    without holding them for every row: those `projection` holds (PROJECTED_COLUMNS) taken from it, the others
    (ROW_COLUMNS) read from exchanges.parquet at those rows alone, a row group at a time, in the form the file is
    read in (the text columns categoricals of its dictionaries, the others their declared dtypes: the same values as
    the projection's held forms)."""

    def __init__(self, path: Path, projection: pd.DataFrame):
        import pyarrow.parquet as pq

        self.path, self.projection = path, projection
        stored = [name for name in pq.read_schema(path).names if name not in projection.columns]
        self.columns = pd.Index([*projection.columns, *stored])

    def at(self, rows: np.ndarray, columns) -> pd.DataFrame:
        """Those of `columns` it has (in that order) at `rows` (positions, in any order, repeated), indexed by the
        projection's labels of those rows: what HeldColumns(the whole table).at gives."""
        rows = np.asarray(rows, dtype=np.int64)
        table = {}
        for name in (c for c in columns if c in self.columns):
            if name in self.projection.columns:
                table[name] = self.projection[name].iloc[rows].reset_index(drop=True)
            else:
                table[name] = self._read(name, rows)
        out = pd.DataFrame(table, copy=False) if table else pd.DataFrame(index=pd.RangeIndex(len(rows)))
        out.index = self.projection.index[rows]
        return out

    def _read(self, name: str, rows: np.ndarray) -> pd.Series:
        """Column `name` of the file at `rows`: each distinct row read once, from the row groups holding them."""
        import pyarrow as pa

        wanted, back = np.unique(rows, return_inverse=True)
        pieces = []
        for start, group in _row_groups(self.path, name, wanted, read_dictionary=name in TEXT_COLUMNS):
            mine = wanted[(wanted >= start) & (wanted < start + group.num_rows)]
            pieces.append(group.take(pa.array(mine - start)))
            del group  # let go before the next row group is read
        if not pieces:  # no row: the column's first row group, none of its rows taken (its dtype, its categories)
            pieces = [group.slice(0, 0) for _, group in _row_groups(self.path, name, None, first=True,
                                                                    read_dictionary=name in TEXT_COLUMNS)]
        column = (pa.concat_tables(pieces) if pieces else self._empty(name)).to_pandas()[name]
        return column.iloc[back.reshape(-1)].reset_index(drop=True) if len(rows) else column

    def _empty(self, name: str):
        """A file of no row group: the column with no rows, read from its schema."""
        import pyarrow.parquet as pq

        return pq.read_schema(self.path).empty_table().select([name])


def _row_groups(path: Path, name: str, rows: np.ndarray | None, first: bool = False, read_dictionary: bool = False):
    """(first row, the table of column `name`) of each row group of exchanges.parquet holding one of `rows` (sorted
    or not; None: every one, `first`: the first one alone), in turn; the column with its pandas metadata (the
    declared dtypes), a text column as a dictionary with `read_dictionary`. The file memory-mapped by a mapping
    closed once read: a ParquetFile that maps the file itself keeps the mapping, and its pages in the run's memory,
    until the garbage collector finds it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pa.memory_map(str(path)) as source:
        file = pq.ParquetFile(source, read_dictionary=[name] if read_dictionary else None)
        sizes = [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)]
        starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        groups = (range(min(len(sizes), 1) if first else len(sizes)) if rows is None
                  else np.unique(np.searchsorted(starts, rows, side="right") - 1).tolist())
        for g in groups:
            group = file.read_row_group(g, columns=[name], use_pandas_metadata=True)
            yield int(starts[g]), group
            del group  # let go before the next row group is read
        del file


def _finish(run, cs: CaptureSet, x: Extracted, paired, server, runs: list[SortedRun], categories: dict[str, list],
            members: tuple, folder: Path):
    """exchanges.parquet (the merge), groups.parquet, pool.parquet, summary.json from the stored partitions
    (summary_from_runs), then report.html from the projection read back (REPORT_COLUMNS); committed as one set
    (run.session.Run.finish's, one after the other). `runs` is emptied once the summary is made (their read
    buffers are not held through the report; their keys are files: KeyFile). With --jobs 1 (run.lean) every block
    of LATE_STAGE_BYTES and more is a mapping of its own while it runs (core.memory.map_big_blocks)."""
    from ..pair.pairing import AFTER_THE_REPAIR_BYTES

    if run.lean:  # the late stage's transients in mappings of their own, given back as they are freed
        map_big_blocks(LATE_STAGE_BYTES)
    try:
        return _finished(run, cs, x, paired, server, runs, categories, members, folder)
    finally:
        if run.lean:
            map_big_blocks(AFTER_THE_REPAIR_BYTES)


def _finished(run, cs: CaptureSet, x: Extracted, paired, server, runs: list[SortedRun], categories: dict[str, list],
              members: tuple, folder: Path):
    from ..explain.servers import Explained, server_tables, summary_of
    from ..render.report import render_page, unspanned_profile, write_page
    from .session import AnalysisResult, _write_summary

    out = run.folder.staging
    release_memory()  # what the view and the passes left in the heap, back before the writer's row groups
    write_merged(runs, out / "exchanges.parquet", categories)
    release_memory()
    groups, pool = server_tables([server])
    write_table(groups, out / "groups.parquet")
    write_table(pool, out / "pool.parquet")
    made = summary_from_runs(runs, members, categories, folder / "summary")
    summary = summary_of(cs, x, paired, Explained(None, groups, pool, [server]), run.warnings,
                         run.runner.address if run.runner is not None else None, runs=made)
    del made
    runs.clear()
    release_memory()
    names = ["exchanges.parquet", "groups.parquet", "pool.parquet", _write_summary(out, summary)]
    exchanges = read_projection(out / "exchanges.parquet", PROJECTED_COLUMNS)
    # the columns read at a few rows alone (ROW_COLUMNS), read from the file at those rows
    columns = StoredColumns(out / "exchanges.parquet", exchanges)
    # the query profile made here, as render_page would make it first, its samples' params read from the file
    unspanned = unspanned_profile(exchanges, StoredParams(out / "exchanges.parquet"), columns)
    conns = {"app": paired.app_conns, "db": paired.db_conns}
    page = render_page(summary, exchanges, server.view.groups, run.options.command_line, conns, server.view.pool,
                       lambda: unspanned, columns=columns)
    names.append("report.html")
    write_page(out / "report.html", page)
    run.children.close()
    run.folder.commit()
    return AnalysisResult(run.out, exchanges, groups, summary, [run.out / name for name in names], run.warnings)


def summary_from_runs(runs: list[SortedRun], members: tuple, categories: dict[str, list], scratch: Path):
    """explain.summaryruns.SummaryOfRuns of the stored partitions, fed in row order by the merge: each partition's
    rows as the writer reads them (the thread-pool view's per-row columns applied, recoded to the file's
    categories), and the pool view's members (`members`: its outliers, each stall's culprits and victims, the cap's
    members, by row key: _members_by_key)."""
    from ..explain.summaryruns import SummaryOfRuns

    outliers, culprits, victims, cap = members
    stored = [SortedRun(Recoding(r.table, categories), r.keys) for r in runs]
    return SummaryOfRuns(stored, outliers, culprits, stall_victims=victims, cap_members=cap,
                         scratch=scratch).feed_all()


def _members_by_key(keys: list[KeyFile | np.ndarray], view, run_of: np.ndarray, row_of: np.ndarray):
    """The pool view's members (row positions of the table in row order: its outliers, each stall's culprits and
    victims, the cap's members) as row keys, by where each row went (_merged_places): (outliers, culprits,
    victims, cap). Every list's keys found in one pass over the runs: a stored run's keys read once, one run's at
    a time."""
    width = keys[0].shape[1] if keys else 0
    stalls = len(view.stall_members)
    lists = [view.outliers, *(c for _, c in view.stall_members), *(v for v, _ in view.stall_members),
             *(view.cap_members or ())]
    lists = [np.asarray(positions, dtype=np.int64) for positions in lists]
    keyed = [np.zeros((len(at), width), dtype=np.int64) for at in lists]
    for r, run_keys in enumerate(keys):
        key = key_array(run_keys)
        for at, out in zip(lists, keyed):
            mine = run_of[at] == r
            out[mine] = key[row_of[at[mine]]]
        del key
    return (keyed[0], keyed[1:1 + stalls], keyed[1 + stalls:1 + 2 * stalls],
            tuple(keyed[1 + 2 * stalls:]) if view.cap_members else None)
