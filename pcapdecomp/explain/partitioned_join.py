"""The slow-log join of the partitions' rows, per connection (docs/partitioned.md §3, step 7b with a slow log): what
slowlog.join.join_slow_log gives the decomposition (per row the first joined entry, Σ Query_time, the undecided
marks; whether the join joined anything), made from step 7a's runs without the whole table's join view.

The join's own code does the work (slowlog.join.joined_part on a part of the rows and the entries that can only
be theirs, with the JoinContext of every row); what is gathered here:
- per partition (the first pass): its JoinContext (its span, its connection ids, whether it holds a timed
  ENCRYPTED row) and the join view (`rows_for_join`) of its rows of each connection whose id is an entry's
  Thread_id, and of its rows without an id, one file per (partition, connection) in the work folder;
- per connection named by an entry's thread (between the passes): its view gathered from its pieces, in row-key
  order (the table's), joined with that thread's entries: bounded by the largest connection, not the capture;
- the entries whose thread is no known connection: every row without an id (the global view of those rows only:
  none on sysbench), joined with them;
- the undecided marks: each group records its entries' mark steps, and the global budget (MARK_STEPS × (rows +
  entries)) is spent over them in entry order (slowlog.join.spent_marks), as join_slow_log spends it.

Held across the passes: per joined row its entry and Query_time, per marked row its position (bounded by the
entries: MARK_LIMIT rows an entry), the contexts (a few numbers and the connection ids per partition).

Refused (NotPartitionable), never a different value:
- an entry without a thread id that may be on the wire: it is searched among every connection's rows (the
  global text-search view), not built;
- an entry of no known connection searched by text among the rows without an id while rows with an id exist: the
  search's step limit (SCAN_LIMIT) counts the statements of every connection with the entry's text, which the
  view of the rows without an id does not hold;
- a row without an id joined to an entry (`refuse_named_by_log`, which DecomposedPartitions calls): explain.servers
  then names its connection by the entry's Thread_id (read.connids.ids_from_slow_log), which changes its conn_id,
  conn_id_source and thread_group after the decomposition: not done here. The join itself is made (its answer is
  join_slow_log's: tested), the decomposition is refused."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.framefile import FrameFile
from ..slowlog.join import (NOT_ON_THE_WIRE, JoinContext, combined_context, command_codes, join_stats, joined_part,
                            logs_admin_commands, mark_budget, rows_for_join, slow_entries, spent_marks,
                            undecided_rows, unlogged_rows, view_context)
from .decompose import Joined
from .partitioned import NotPartitionable

FREE = "free"  # the group of the rows without a connection id
# an entry's reasons that depend on the entry and the captures' span alone (slowlog.join._State._pre_reason's
# first ones): the same whichever rows a join of part of them holds
OWN_REASONS = {"socket", "no-query-time", "no-time", "outside-capture", "command-without-response"}
ROW_BITS = 32  # a marked row as one int64: its partition << ROW_BITS | its position in the partition


@dataclass
class JoinPiece:
    """What the first pass keeps of one partition for the join: its JoinContext, its rows, the files of its join
    views by group (a conn_id, or FREE), and the view's empty frame (its columns and dtypes)."""

    context: JoinContext
    rows: int
    files: list[tuple[object, Path]]
    empty_view: pd.DataFrame


def join_piece(work: Path, threads: set, p: int, t: pd.DataFrame, key: np.ndarray) -> JoinPiece:
    """Partition p's JoinPiece (a run's table and its row keys; `threads`: the entries' Thread_ids): the join view
    of its rows whose connection an entry may be on, one file per connection in `work` (PartitionedJoin.work)."""
    view = rows_for_join(t)
    files = []
    ids = view["conn_id"].fillna(-1).to_numpy(dtype=np.int64)
    kept = np.flatnonzero(np.isin(ids, np.fromiter(threads, dtype=np.int64, count=len(threads))) | (ids < 0))
    order = kept[np.argsort(ids[kept], kind="stable")]
    starts = np.flatnonzero(np.r_[True, ids[order][1:] != ids[order][:-1]]) if len(order) else order
    for rows in np.split(order, starts[1:]) if len(order) else ():
        conn = int(ids[rows[0]])
        group = FREE if conn < 0 else conn
        path = Path(work) / f"{p}-{group}"
        _write_piece(path, p, rows, key[rows], view.iloc[rows].reset_index(drop=True))
        files.append((group, path))
    return JoinPiece(view_context(view), len(view), files, view.iloc[:0])


def _write_piece(path: Path, p: int, rows: np.ndarray, keys: np.ndarray, view: pd.DataFrame) -> None:
    """A partition's join view of one group in the work folder: the view as an Arrow IPC file (core.framefile: no
    pickle, the folder may be shared with Dask workers), its partition, rows and row keys as a .npz."""
    FrameFile(path.with_name(path.name + ".arrow"), view, max(len(view), 1)).close()
    np.savez(path.with_name(path.name + ".npz"), p=np.int64(p), rows=rows, keys=keys)


def _read_piece(path: Path) -> tuple[int, np.ndarray, np.ndarray, pd.DataFrame]:
    """What _write_piece wrote at `path`: (partition, rows, row keys, view)."""
    with np.load(path.with_name(path.name + ".npz"), allow_pickle=False) as f:
        p, rows, keys = int(f["p"]), f["rows"], f["keys"]
    return p, rows, keys, FrameFile.read(path.with_name(path.name + ".arrow"))


class PartitionedJoin:
    """The slow-log join of partitions' rows: `add` each partition's rows (the first pass), then `finish` (the
    joins and the marks), then `joined(p, table)` gives partition p's Joined (decompose's input of the join); once
    every partition's is made, `summarize(name)` gives `stats` and `warnings`, join_slow_log's (summary.json's
    slow_log counts)."""

    def __init__(self, slow: pd.DataFrame, work: Path):
        self.slow = slow
        self.thread = slow["thread_id"].astype("Int64").fillna(-1).to_numpy(dtype=np.int64)
        self.threads = set(np.unique(self.thread[self.thread >= 0]).tolist())
        self.logs_commands = logs_admin_commands(slow["admin_command"] if "admin_command" in slow.columns else ())
        self.work = Path(work) / "join"
        self.work.mkdir(parents=True, exist_ok=True)
        self.contexts: list[JoinContext] = []
        self.rows = 0
        self.files: dict[object, list[Path]] = defaultdict(list)  # group (a conn_id, or FREE) → its pieces' files
        self.empty_view: pd.DataFrame | None = None
        self.entries: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # p → (positions, entry, qt)
        self.marked: dict[int, np.ndarray] = {}  # p → positions
        self.used = False
        self.joined_without_id = 0  # rows without a connection id joined to an entry (refuse_named_by_log)
        # what join_stats counts: per entry its reason ('' when joined), whether it joined and how; the parts' sums
        n = len(slow)
        self.reason = np.full(n, "", dtype=object)
        self.entry_joined = np.zeros(n, dtype=bool)
        self.how = np.full(n, "", dtype=object)
        self.kinds: dict[str, int] = defaultdict(int)
        self.several = self.identified = self.marks_cut = 0
        self.context: JoinContext | None = None
        self.unsure: list[int] = []  # log lines of the entries whose reason is not sure here (`_unsure_reasons`)
        self.undecided_counts: dict[int, tuple[int, int]] = {}  # p → (doubtful, unlogged), set by `joined`
        self.stats: dict = {}
        self.warnings: list[str] = []

    # -- the first pass --------------------------------------------------------------------------------------------

    def add(self, p: int, t: pd.DataFrame, key: np.ndarray) -> None:
        """Partition p's rows (a run's table and its row keys): its context, and the join view of its rows whose
        connection an entry may be on, by connection."""
        self.took(join_piece(self.work, self.threads, p, t, key))

    def took(self, piece: JoinPiece) -> None:
        """A partition's JoinPiece (made here by `add`, or by join_piece in another process), in partition order."""
        self.contexts.append(piece.context)
        self.rows += piece.rows
        if self.empty_view is None:
            self.empty_view = piece.empty_view
        for group, path in piece.files:
            self.files[group].append(path)

    # -- between the passes ----------------------------------------------------------------------------------------

    def finish(self) -> None:
        """The joins (per connection named by an entry's thread; the entries of no known connection against the
        rows without an id), then the undecided marks under the global budget, in entry order."""
        if self.empty_view is None:
            raise NotPartitionable("no partition's rows to join the slow log to")
        context = self.context = combined_context(self.contexts)
        marks: dict[int, list] = {}
        joined: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # (p, position, entry, qt)
        for thread in sorted(self.threads & context.known_ids):
            self._join(thread, np.flatnonzero(self.thread == thread), context, marks, joined)
        free = np.flatnonzero((self.thread >= 0) & ~np.isin(self.thread, np.fromiter(
            context.known_ids, dtype=np.int64, count=len(context.known_ids))))
        grouped = bool(len(free) and self.files.get(FREE))
        if grouped:
            searched = self._join(FREE, free, context, marks, joined)
            if searched and context.known_ids:
                raise NotPartitionable(
                    f"{searched} slow-log entries of threads no connection is known by, searched by text among the "
                    "rows without a connection id while connections with one exist: the search's step limit "
                    "(SCAN_LIMIT) counts every connection's statements, which the view of the rows without an id "
                    "does not hold")
        # the entries no group joins (no thread id; a thread no connection is known by, and no row without an id):
        # their reasons, which depend on the entry and the span alone where they are not refused
        alone = np.flatnonzero(self.thread < 0) if grouped else np.union1d(np.flatnonzero(self.thread < 0), free)
        if len(alone):
            self.reason[alone] = joined_part(self.empty_view, self.slow.iloc[alone].reset_index(drop=True),
                                             context).reasons
        self._refuse_threadless()
        self.unsure = self._unsure_reasons(free, context)
        for p, positions, entry, qt in joined:
            self.used = True
            mine = self.entries.get(p)
            self.entries[p] = (positions, entry, qt) if mine is None else tuple(
                np.concatenate([a, b]) for a, b in zip(mine, (positions, entry, qt)))
        budget = mark_budget(self.rows, len(self.slow))
        rows = []
        for e in sorted(marks):
            spent, budget, cuts = spent_marks(((cost, lambda at=at: at) for cost, at in marks[e]), budget)
            rows += spent
            self.marks_cut += cuts
        rows = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        part = rows >> ROW_BITS
        for p in np.unique(part).tolist():
            self.marked[p] = rows[part == p] & ((1 << ROW_BITS) - 1)

    def _refuse_threadless(self) -> None:
        """Entries without a thread id search every connection's rows: refused unless none can be on the wire
        (their reasons, made by `finish` against no row, say so)."""
        lone = np.flatnonzero(self.thread < 0)
        if not len(lone) or not self.rows:  # no row: nothing to join or mark
            return
        wire = [int(self.slow["line"].iloc[e]) for e in lone.tolist() if self.reason[e] not in NOT_ON_THE_WIRE]
        if wire:
            raise NotPartitionable(
                f"{len(wire)} slow-log entries without a thread id (line {wire[0]} the first) inside the captures' "
                "time: such an entry is searched among every connection's rows (the global text-search view), "
                "which the partitioned join does not build")

    def _unsure_reasons(self, free: np.ndarray, context: JoinContext) -> list[int]:
        """The log lines of the entries whose reason is not sure here: of a thread no connection is known by, while
        connections with an id exist, that may be on the wire and found no text among the rows without an id.
        join_slow_log calls such an entry no-text-match only when no row of any connection holds its text, else
        no-time-fit or search-limit (the search's steps over every connection's statements with it), which is not
        gathered here. Their rows are joined and marked alike either way (such an entry joins none, and marks the
        rows without an id): only summary.json's counts of reasons would differ (`refuse_unsure_counts`)."""
        if not context.known_ids or not self.rows:
            return []
        return [int(self.slow["line"].iloc[e]) for e in free.tolist() if self.reason[e] not in OWN_REASONS]

    def refuse_unsure_counts(self) -> None:
        """NotPartitionable when an entry's reason is not sure (`_unsure_reasons`): `summarize` would not give
        join_slow_log's counts. The run mode asks before the second pass."""
        if self.unsure:
            raise NotPartitionable(
                f"{len(self.unsure)} slow-log entries of threads no connection is known by (line {self.unsure[0]} "
                "the first) inside the captures' time: whether another connection's rows hold their text (their "
                "reason in summary.json's slow-log counts) is not gathered by the partitioned join")

    def _join(self, group, entries: np.ndarray, context: JoinContext, marks: dict, joined: list) -> int:
        """One group's join: its view gathered from its pieces in row-key order, joined with `entries` (positions
        in the slow log); its joined rows into `joined`, its entries' mark steps (rows as partition and position)
        into `marks`. Returns how many of its entries were searched by text among rows of no known connection."""
        pieces = []
        for path in self.files.get(group, ()):
            pieces.append(_read_piece(path))
        view = pd.concat([v for *_, v in pieces], ignore_index=True) if pieces else self.empty_view
        keys = np.concatenate([k for _, _, k, _ in pieces]) if pieces else np.zeros((0, 1), dtype=np.int64)
        at = np.concatenate([(np.int64(p) << ROW_BITS) | rows.astype(np.int64) for p, rows, _, _ in pieces]) \
            if pieces else np.zeros(0, dtype=np.int64)
        del pieces
        order = np.lexsort(keys.T[::-1]) if len(keys) else np.zeros(0, dtype=np.int64)
        view = view.take(order).reset_index(drop=True)
        at = at[order]
        part = joined_part(view, self.slow.iloc[entries].reset_index(drop=True), context)
        del view
        self.reason[entries], self.entry_joined[entries], self.how[entries] = part.reasons, part.joined, part.how
        for kind, count in part.kinds.items():
            self.kinds[kind] += count
        self.several += part.several
        self.identified += part.identified
        rows = np.flatnonzero(part.entry >= 0)
        if len(rows):
            if group == FREE:
                self.joined_without_id += len(rows)
            p = at[rows] >> ROW_BITS
            for one in np.unique(p).tolist():
                mine = rows[p == one]
                joined.append((one, at[mine] & ((1 << ROW_BITS) - 1), entries[part.entry[mine]],
                               part.query_time_ns[mine]))
        for e, steps in part.marks.items():
            marks[int(entries[e])] = [(cost, None if local is None else at[local]) for cost, local in steps]
        return len(part.searched)

    def refuse_named_by_log(self) -> None:
        """A row without a connection id joined to an entry: explain.servers then names its connection by the
        entry's Thread_id (read.connids.ids_from_slow_log), after the decomposition."""
        if self.joined_without_id:
            raise NotPartitionable(
                f"{self.joined_without_id} rows without a connection id joined to slow-log entries: explain.servers "
                "then names their connections by the entries' Thread_id (read.connids.ids_from_slow_log), which "
                "changes their conn_id, conn_id_source and thread_group after the decomposition: not partitioned yet")

    # -- the second pass -------------------------------------------------------------------------------------------

    def entries_of(self, p: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Partition p's rows (n of them): per row its first joined entry (-1) and Σ Query_time."""
        entry = np.full(n, -1, dtype=np.int64)
        qt = np.zeros(n, dtype=np.int64)
        if p in self.entries:
            positions, first, total = self.entries[p]
            entry[positions] = first
            qt[positions] = total
        return entry, qt

    def joined(self, p: int, t: pd.DataFrame) -> Joined:
        """Partition p's Joined: join_slow_log's answer at its rows (`t`, the run's table)."""
        entry, qt = self.entries_of(p, len(t))
        marked = np.zeros(len(t), dtype=bool)
        if p in self.marked:
            marked[self.marked[p]] = True
        undecided, doubtful, unlogged = undecided_rows(marked, entry, unlogged_rows(*command_codes(t["command"]),
                                                                                    self.logs_commands))
        self.undecided_counts[p] = (doubtful, unlogged)
        return Joined(entry, qt, undecided, self.used)

    def summarize(self, name: str) -> None:
        """`stats` and `warnings`, join_slow_log's for the same rows and log (`name`: the log's, in the warnings),
        once `joined` has given every partition's rows; NotPartitionable when an entry's reason is not sure."""
        self.refuse_unsure_counts()
        doubtful = sum(d for d, _ in self.undecided_counts.values())
        unlogged = sum(u for _, u in self.undecided_counts.values())
        self.stats, self.warnings = join_stats(slow_entries(self.slow), self.context.span, self.rows, self.reason,
                                               self.entry_joined, self.how, self.kinds, self.identified, self.several,
                                               doubtful, unlogged, self.marks_cut, name)
