"""The decomposition per partition (docs/partitioned.md §5 step 7b): what explain.decompose.decompose adds to the
joined table (pipelined_s, exec_s, exec_source, queue_s, queue_source before the thread-pool view, queue_min_s,
in_slow_log, slow_log_line, hidden_slow, understated, thread_group), made from step 7a's runs (explain/partitioned.py
PairedPartitions: one core.outputs.SortedRun per partition) one partition at a time, with or without a slow log.

What a row's columns read of other partitions is gathered first, and is small (per class, per connection piece, the
long executions' union):
- the classes (decompose.class_codes): a (command, fingerprint) pair numbered by the texts' first appearance in the
  table's order — the row keys' order — over the whole table, as class_codes numbers them (its sum of the two codes
  makes the same classes, a null fingerprint's included);
- pipelined_s' carry (§3): a connection's rows sorted by (D1, D4, row key), the latest D4 of those before a row.
  Per piece of a connection (its rows of one partition with one req_tcp_seq >> 16), the first and last of them in
  that order and their latest D4; where the pieces of a connection do not interleave, a piece's carry is the latest
  D4 of the pieces before it, exact. Pieces that interleave raise NotPartitionable, saying which connection: never
  a different value;
- the execution estimates' quantiles per class (decompose.estimate_execution, likely_waits' typical executions) by
  core.exact.RadixSelect over the partitions, and likely_waits' long executions and their union;
- with a slow log, the join per connection (explain/partitioned_join.py), made between the first pass and the
  selections (the estimates leave out the rows in the log): per row its entry, Query_time and undecided mark.

Between the passes each partition's narrow columns (≈ 50 B a row: D1, D4, server_s, the class, the flag, the
pipelined piece) are kept in a work folder as .npy files, read back by the selection's passes; the runs themselves
are iterated twice (the first pass and the rows' own pass). Held at once: one partition's rows, its narrow columns
and the global state (per class and per piece arrays, the union).

The thread-pool view's columns (thread_group's stalls, stall_role, queue_source's unheld likely waits turned
estimated) are explain/threadpool.py's, after this: the rows here are its input, as decompose's table is today."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.exact import RadixSelect
from ..core.memory import release_memory
from ..core.outputs import SortedRun
from ..mysql.connection import ENCRYPTED_COMMAND
from .decompose import (FINGERPRINT_MIN_SAMPLES, NS, STALL_MIN_QUEUE_S, Flags, Joined, LikelyWaits, _latest_before,
                        covered_ns, estimate_rows, executions, fast_runs, interval_union, likely_rows,
                        robust_estimates, with_join_columns, with_queue_columns)
from .partitioned import NotPartitionable
from .partitioned_join import JoinPiece, PartitionedJoin, join_piece

PIECE_SHIFT = 16  # a connection's piece: its requests' TCP sequence numbers >> this (the spill's, §3)
NONE = np.iinfo(np.int64).min  # no D4 before: pipelined_s' "no earlier request"


def _texts(column: pd.Series) -> tuple[np.ndarray, list]:
    """decompose._text_codes' texts of a partition's column: per row an index into the returned texts (-1: a null
    of a categorical column, which class_codes codes -1), from the categories' codes, not a str per row."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        texts = [str(c) for c in column.cat.categories]
        if len(set(texts)) == len(texts):
            return column.cat.codes.to_numpy(np.int64), texts
    codes, uniques = pd.factorize(column.astype(object).astype(str).to_numpy(dtype=object))
    return codes.astype(np.int64), list(uniques)


def _first_rows(codes: np.ndarray, count: int) -> np.ndarray:
    """Per text 0 … count − 1, the first row holding it (rows in key order); -1 for a text no row holds."""
    first = np.full(count, -1, dtype=np.int64)
    present = np.flatnonzero(codes >= 0)
    texts, at = np.unique(codes[present], return_index=True)  # each text's first position among the present rows
    first[texts] = present[at]
    return first


@dataclass
class _Piece:
    """A connection's rows of one partition with one req_tcp_seq >> PIECE_SHIFT, in (D1, D4, row key) order: the
    first and the last of them as (D1, D4, *key) and their latest D4."""

    partition: int
    index: int
    first: tuple
    last: tuple
    latest: int


@dataclass
class _PartitionFirst:
    """What the first pass keeps of one partition (its narrow columns go to a file): its rows, per column (command,
    fingerprint) each text's first row key, its distinct (command, fingerprint) text pairs, its pipelined pieces'
    ends by connection, and its JoinPiece (with a slow log)."""

    rows: int
    first_key: tuple[dict, dict]
    pairs: list
    pieces: list  # (connection (db_client, server), _Piece)
    join: JoinPiece | None


@dataclass
class _Gathered:
    """The first pass's global state."""

    first_key: dict = field(default_factory=lambda: ({}, {}))  # per column (command, fingerprint): text → key
    pairs: list = field(default_factory=list)  # per partition: its distinct (command text, fingerprint text) pairs
    pieces: dict = field(default_factory=dict)  # connection (db_client, server) → its _Pieces
    rows: list = field(default_factory=list)  # per partition: its rows

    def took(self, first: _PartitionFirst) -> None:
        """The next partition's share (partitions in order)."""
        self.rows.append(first.rows)
        for mine, theirs in zip(self.first_key, first.first_key):
            for text, key in theirs.items():
                seen = mine.get(text)
                if seen is None or key < seen:
                    mine[text] = key
        self.pairs.append(first.pairs)
        for conn, piece in first.pieces:
            self.pieces.setdefault(conn, []).append(piece)


def first_of_partition(p: int, run: SortedRun, work: Path, join_threads: set | None) -> _PartitionFirst:
    """The first pass over partition p's run: its _PartitionFirst, and its narrow columns kept in `work` (p.npz);
    with `join_threads` (a slow log's Thread_ids), its join views too (partitioned_join.join_piece). What one
    process, or a Dask worker, does of a partition; DecomposedPartitions gathers the partitions' shares."""
    t, key = run.table, run.key
    n = len(t)
    first_key: tuple[dict, dict] = ({}, {})
    local = []
    for k, col in enumerate(("command", "fingerprint")):
        codes, texts = _texts(t[col])
        for text, row in zip(texts, _first_rows(codes, len(texts)).tolist()):
            if row >= 0:
                first_key[k][text] = tuple(key[row].tolist())
        local.append((codes, texts))
    (cc, ct), (fc, ft) = local
    pair, uniques = pd.factorize(cc * (len(ft) + 1) + (fc + 1)) if n else (np.zeros(0, np.int64), [])
    pairs = [(ct[u // (len(ft) + 1)] if u // (len(ft) + 1) >= 0 else None,
              ft[u % (len(ft) + 1) - 1] if u % (len(ft) + 1) else None) for u in (int(v) for v in uniques)]
    d1 = np.asarray(t["_d1_raw"], dtype=np.int64)
    d4 = np.asarray(t["_d4_raw"], dtype=np.int64)
    server_s = t["server_s"].to_numpy(dtype="float64", na_value=np.nan)
    ok = ~np.isnan(server_s) & t["db_client"].notna().to_numpy()
    pieces, piece, before = _pieces(p, t, key, ok, d1, d4)
    join = join_piece(Path(work) / "join", join_threads, p, t, key) if join_threads is not None else None
    flag = t["server_flag_slow"].astype("boolean")
    np.savez(Path(work) / f"{p}.npz", d1=d1, d4=d4, valid=np.asarray(t["_t_valid"], dtype=bool),
             server_s=server_s, pair=pair.astype(np.int64),
             flag=np.where(flag.isna().to_numpy(), -1, flag.fillna(False).to_numpy(dtype=bool)).astype(np.int8),
             encrypted=(t["command"] == ENCRYPTED_COMMAND).to_numpy(dtype=bool, na_value=False),
             piece=piece, before=before)
    return _PartitionFirst(n, first_key, pairs, pieces, join)


def _made_first_of_partition(runs, p: int, work: Path, join_threads: set | None) -> _PartitionFirst:
    """first_of_partition of partition p of `runs` (an explain.partitioned.RunsMadeOnce), its run made (and kept)
    here: what a Dask worker runs."""
    first = first_of_partition(p, runs.made(p), work, join_threads)
    release_memory()
    return first


def _pieces(p: int, t: pd.DataFrame, key: np.ndarray, ok: np.ndarray, d1: np.ndarray,
            d4: np.ndarray) -> tuple[list, np.ndarray, np.ndarray]:
    """Partition p's pieces (rows of `ok`, the rows pipelined_s reads): each piece's ends, by connection; per row
    its piece (-1: not read) and the latest D4 of its piece's rows before it (NONE for a piece's first)."""
    n = len(t)
    piece = np.full(n, -1, dtype=np.int64)
    before = np.full(n, NONE, dtype=np.int64)
    rows = np.flatnonzero(ok)
    if not len(rows):
        return [], piece, before
    if t["server"].take(rows).isna().any():
        raise NotPartitionable("a row with a server time and no server endpoint: pipelined_s' connections "
                               "would not be told apart as today")
    client = t["db_client"].astype(object).to_numpy()[rows]
    server = t["server"].astype(object).to_numpy()[rows]
    number = np.asarray(t["req_tcp_seq"], dtype=np.int64)[rows] >> PIECE_SHIFT
    ids, uniques = pd.factorize(pd.MultiIndex.from_arrays([client, server, number]))
    order = np.lexsort((d4[rows], d1[rows], ids))  # a stable sort: ties in row (key) order
    k, b = ids[order], d4[rows][order]
    piece[rows] = ids
    before[rows[order]] = _latest_before(k, b)
    starts = np.flatnonzero(np.concatenate([[True], k[1:] != k[:-1]]))
    ends = np.concatenate([starts[1:], [len(k)]]) - 1
    latest = np.maximum.reduceat(b, starts)
    pieces = []
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        first, last = rows[order[s]], rows[order[e]]
        pieces.append((uniques[int(k[s])][:2], _Piece(
            p, int(k[s]), (int(d1[first]), int(d4[first]), *key[first].tolist()),
            (int(d1[last]), int(d4[last]), *key[last].tolist()), int(latest[i]))))
    return pieces, piece, before


class DecomposedPartitions:
    """decompose's columns of the joined table, per partition: iterating yields each of `runs`' SortedRuns (a
    partition's joined rows, explain.partitioned.PairedPartitions) with the columns added, in decompose's order and
    dtypes (categoricals with the partition's own categories, as 7a's runs). `runs` is iterated twice (the first
    pass and the rows' pass: PairedPartitions makes its runs again each time, explain.partitioned.RunsMadeOnce
    reads them back), in the same order; `work`: a folder for each partition's narrow columns between the passes.
    `slow`: the slow log's entries (read_slow_log's table), joined per connection (explain/partitioned_join.py:
    what it cannot join exactly raises NotPartitionable); the pieces of a connection that interleave raise
    NotPartitionable too (pipelined_s' carry would not be exact). The constructor makes the first pass, the join
    and the selections.

    `mapper` (with `runs` a RunsMadeOnce): the first pass's partitions made elsewhere, mapper(function, shared,
    calls) → [function(shared, *call) for call in calls] (run.cluster.DaskRunner.map: on Dask workers, which must
    see `work` and the runs' folder at the same paths). The rows' pass per partition is `rows_of(p, run)`, on a
    copy made by `for_workers()`."""

    def __init__(self, runs: Iterable[SortedRun], long_query_time: float | None, thread_pool_size: int | None,
                 work: Path, slow: pd.DataFrame | None = None, mapper=None):
        self.runs, self.lqt, self.thread_pool_size = runs, long_query_time, thread_pool_size
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.slow = slow if slow is not None and len(slow) else None
        self.join = PartitionedJoin(self.slow, self.work) if self.slow is not None else None
        gathered = self._first_pass(mapper)
        if self.join is not None:
            self.join.finish()
            self.join.refuse_named_by_log()
        self.sizes = gathered.rows
        self.classes, self.groups = self._classes(gathered)
        self.carry = self._carries(gathered.pieces)
        self._selections()

    # -- the first pass: each partition's narrow columns kept, the texts' first keys and the pieces gathered ---------

    def _first_pass(self, mapper) -> _Gathered:
        g = _Gathered()
        threads = self.join.threads if self.join is not None else None
        if mapper is None:
            firsts: Iterable[_PartitionFirst] = self._firsts(threads)
        else:
            firsts = mapper(_made_first_of_partition, self.runs,
                            [(p, self.work, threads) for p in range(len(self.runs))])
        for first in firsts:
            g.took(first)
            if self.join is not None:
                self.join.took(first.join)
            release_memory()
        return g

    def _firsts(self, threads: set | None) -> Iterator[_PartitionFirst]:
        for p, run in enumerate(self.runs):
            first = first_of_partition(p, run, self.work, threads)
            del run  # the partition's rows let go before the next partition's are made
            yield first

    def for_workers(self) -> DecomposedPartitions:
        """A copy for the rows' pass elsewhere (`rows_of` on a Dask worker): the global state, not the runs."""
        copy = object.__new__(DecomposedPartitions)
        copy.__dict__.update(self.__dict__, runs=None)
        return copy

    # -- between the passes: the classes, the carries -------------------------------------------------------------

    @staticmethod
    def _classes(g: _Gathered) -> tuple[list[np.ndarray], int]:
        """Per partition, its pairs' class codes as class_codes numbers the whole table's (each text coded by its
        first appearance in key order, nulls -1, the command's code × (the greatest fingerprint code + 1) + the
        fingerprint's, factorized); and the number of classes."""
        code = [{text: i for i, text in enumerate(sorted(first, key=first.get))} for first in g.first_key]
        width = (max(code[1].values()) if code[1] else -1) + 1
        combined = [np.asarray([(code[0][c] if c is not None else -1) * width + (code[1][f] if f is not None else -1)
                                for c, f in pairs], dtype=np.int64) for pairs in g.pairs]
        every, groups = pd.factorize(np.concatenate(combined)) if combined else (np.zeros(0, np.int64), [])
        out, at = [], 0
        for c in combined:
            out.append(every[at:at + len(c)].astype(np.int64))
            at += len(c)
        return out, len(groups)

    @staticmethod
    def _carries(pieces: dict) -> list[dict]:
        """Per partition, per piece, the latest D4 of its connection's pieces before it: the pieces of a connection
        in (D1, D4, key) order must not interleave (one's last row before the next one's first), else
        NotPartitionable."""
        carry: dict = {}
        for conn, mine in pieces.items():
            mine.sort(key=lambda x: x.first)
            latest = NONE
            for before, piece in zip([None, *mine[:-1]], mine):
                if before is not None and not before.last < piece.first:
                    raise NotPartitionable(
                        f"connection {conn[0]} → {conn[1]}: its pieces (req_tcp_seq >> {PIECE_SHIFT}) interleave in "
                        "(D1, D4) order, so pipelined_s' carry per piece would not be exact")
                carry.setdefault(piece.partition, {})[piece.index] = latest
                latest = max(latest, piece.latest)
        return carry

    def _narrow(self, p: int) -> dict:
        """Partition p's narrow columns, with its rows' pipelined_s, server time (less it) and class."""
        with np.load(self.work / f"{p}.npz") as f:
            x = {k: f[k] for k in f.files}
        carry = self.carry.get(p, {})
        reads = x["piece"] >= 0
        latest = x["before"].copy()
        if reads.any():
            table = np.full(int(x["piece"].max()) + 1, NONE, dtype=np.int64)
            for index, value in carry.items():
                table[index] = value
            latest[reads] = np.maximum(latest[reads], table[x["piece"][reads]])
        d1, d4 = x["d1"], x["d4"]
        wait = np.minimum(np.maximum(latest, d1), d4)
        wait -= d1
        pipelined = np.zeros(len(d1))
        pipelined[reads] = wait[reads] / NS
        x["pipelined"] = pipelined
        x["server"] = x["server_s"] - pipelined
        x["codes"] = self.classes[p][x["pair"]] if len(x["pair"]) else np.zeros(0, np.int64)
        x["flags"] = Flags(x["flag"] >= 0, x["flag"] == 1)
        x["flagged"] = x["flags"].flagged
        x["has_server"] = ~np.isnan(x["server"])
        entry, qt = self.join.entries_of(p, len(d1)) if self.join is not None else \
            (np.full(len(d1), -1, dtype=np.int64), np.zeros(len(d1), dtype=np.int64))
        x["in_log"] = entry >= 0
        x["exec_log"] = qt / 1e9
        x["fast"] = fast_runs(x["server"], x["flags"], x["in_log"], self.lqt)
        x["runs"] = x["valid"] & x["has_server"] & (d4 >= d1) & ~x["flagged"] & ~x["in_log"]
        return x

    def _narrows(self) -> Iterator[dict]:
        for p in range(len(self.sizes)):
            yield self._narrow(p)

    def _select(self, selections: list[tuple[RadixSelect, str, str]]) -> None:
        """RadixSelect's passes over the partitions' narrow columns: each selection's values are `server` at the
        rows of its mask."""
        wanted = list(selections)
        while wanted:
            for x in self._narrows():
                for select, mask, _ in wanted:
                    rows = x[mask]
                    select.feed(x["server"][rows], x["codes"][rows])
            wanted = [s for s in wanted if s[0].end_pass()]

    def _selections(self) -> None:
        """The per-class quantiles and the long executions' union (estimate_execution's, likely_waits')."""
        groups = self.groups
        sizes = np.zeros(groups, dtype=np.int64)
        run_sizes = np.zeros(groups, dtype=np.int64)
        for x in self._narrows():
            sizes += np.bincount(x["codes"][x["fast"]], minlength=groups)
            run_sizes += np.bincount(x["codes"][x["runs"]], minlength=groups)
        estimate = RadixSelect(groups, (0.1, 0.5, 0.9), "linear")
        every_run = RadixSelect(groups, (0.5,), "linear")
        self._select([(estimate, "fast", "estimate"), (every_run, "runs", "runs")])
        self.estimate = robust_estimates(sizes, *estimate.result())
        (median_all,) = every_run.result()
        self.few_or_long = (run_sizes < FINGERPRINT_MIN_SAMPLES) | (np.nan_to_num(median_all) >= STALL_MIN_QUEUE_S)
        starts, ends = [], []
        for x in self._narrows():
            s, e = self._long(x)
            starts.append(s)
            ends.append(e)
        self.union = interval_union(np.concatenate(starts) if starts else np.zeros(0, np.int64),
                                    np.concatenate(ends) if ends else np.zeros(0, np.int64))
        counts = np.zeros(groups, dtype=np.int64)
        clean = RadixSelect(groups, (0.5, 0.9), "linear")
        wanted = True
        while wanted:
            for x in self._narrows():
                rows = self._clean(x)
                if clean.passes == 0:
                    counts += np.bincount(x["codes"][rows], minlength=groups)
                clean.feed(x["server"][rows], x["codes"][rows])
            wanted = clean.end_pass()
        median, p90 = clean.result()
        median[counts < FINGERPRINT_MIN_SAMPLES] = np.nan
        self.clean = (median, p90)

    def _long(self, x: dict) -> tuple[np.ndarray, np.ndarray]:
        """likely_waits' long statements of a partition (its masks into x: long_open, long): their executions'
        starts and ends (the union of them, a partition's). A measured execution is the slow log's (in the log) or
        the server time (flagged slow)."""
        server, d1, d4 = x["server"], x["d1"], x["d4"]
        x["long_open"] = x["runs"] & (server >= STALL_MIN_QUEUE_S) & self.few_or_long[x["codes"]]
        executed = np.where(x["in_log"], x["exec_log"], server)
        measured = (x["in_log"] | (x["has_server"] & x["flagged"])) & x["has_server"] & x["valid"] & (d4 >= d1) & \
            (np.nan_to_num(executed) >= STALL_MIN_QUEUE_S)
        long_ = np.flatnonzero(x["long_open"] | measured)
        x["long"] = long_
        x_start = d1[long_]
        timed = measured[long_]
        x_start[timed] = np.maximum(d4[long_][timed] - np.rint(executed[long_][timed] * NS).astype(np.int64),
                                    x_start[timed])
        return interval_union(x_start, d4[long_])

    def _clean(self, x: dict) -> np.ndarray:
        """likely_waits' clean runs of a partition: open runs that overlapped no long statement."""
        self._long(x)
        lo, hi = self.union
        clean = covered_ns(lo, hi, x["d1"], x["d4"]) == 0
        clean &= x["runs"]
        clean[x["long"]] = False
        return clean

    # -- the second pass: the rows ---------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[SortedRun]:
        count = 0
        for p, run in enumerate(self.runs):
            count += 1
            yield self.rows_of(p, run)
        if count != len(self.sizes):
            raise ValueError(f"{count} partitions, the first pass had {len(self.sizes)}")

    def rows_of(self, p: int, run: SortedRun) -> SortedRun:
        """Partition p's run (the one the first pass read) with decompose's columns."""
        if p >= len(self.sizes) or len(run.table) != self.sizes[p]:
            raise ValueError(f"partition {p}: not the rows of the first pass (the runs must come again, alike)")
        return SortedRun(self._columns(p, run.table, self._narrow(p)), run.key)

    def _columns(self, p: int, t: pd.DataFrame, x: dict) -> pd.DataFrame:
        """decompose's columns of partition p's rows: its arithmetic (decompose.executions, likely_rows,
        with_queue_columns, with_join_columns), row by row, with the global state."""
        n = len(t)
        server, codes = x["server"], x["codes"]
        joined = self.join.joined(p, t) if self.join is not None else \
            Joined(np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool), False)
        estimate = estimate_rows(codes, server, *self.estimate) if n else np.full(0, np.nan)
        estimate[x["encrypted"]] = np.nan
        done = executions(server, x["flags"], joined, estimate, self.lqt)
        likely = LikelyWaits(np.zeros(n, dtype=bool), np.full(n, np.nan), np.full(n, np.nan))
        if n:
            self._long(x)
            likely = likely_rows(likely, codes, server, x["d1"], x["runs"], x["long_open"], *self.clean, self.union)
        t = with_queue_columns(t, server, done.has_server, x["pipelined"], done.exec_s, done.source, done.by_fp,
                               done.bound, done.certain, likely)
        return with_join_columns(t, self.slow, joined, x["flags"], server, self.lqt, self.thread_pool_size)
