"""The partitioned run's paired rows (docs/partitioned.md §5 step 7a): the joined table (explain.servers.
joined_table's rows: the pairing completed inside the paired connections, the four points on the app clock, the
durations, the bounds, db_client, conn_id_source, db_point) made partition by partition from the two points'
spilled extractions (read/spill.py), one partition's rows in memory at a time.

A partition is a run of the spill's buckets (§3): an exchange's app and DB rows lie in the same bucket (the bucket
is a function of the request's TCP sequence number, which both points see), so the pairing inside a connection
pair is a partition's own. What crosses partitions is small and gathered first, in one pass over the buckets'
narrow columns (`first_pass`): each connection's least and greatest paired ordinal (a row seen at one point only
is 'lost-at-*' when its connection paired rows before and after it), and the server endpoints that lead to the
DB point (db_point of a row only the app saw). The connection pairs (match.spilled_connection_step), the clocks
(pair.clocks.spilled_clocks) and the connections named without a greeting (`spilled_names`: read.connids.
name_connections on the answer rows gathered from the buckets) are given, each made from the spill.

Each partition yields a core.outputs.SortedRun: its rows, sorted by their row keys (pair.match.row_key), in the
joined table's columns and dtypes, its categoricals with the partition's own categories (core.outputs.
write_merged recodes them to the file's). Merged by key, the runs are the in-memory joined table.

A DB capture alone (no app point: the common field case) goes through the same runs: nothing pairs, so a
partition's rows are its DB rows in the table's order (match.one_point_matching), on no clock, each on its own
DB point; several DB points alone too (each row's own point, as pair_points gives them). No connection step, no
first pass over the rows: the partitions are cut from the buckets' row counts.

Not partitionable (`NotPartitionable`, for the later step 7 to fall back to the in-memory path): a set without a
DB point, an app point with several DB points, a proxy, an extraction that did not spill; and a pair with frames
lost at a point (`LostFrames`: the loss repair would re-read its connections), unless asked for `unrepaired`: then
its lost bytes stay holes, the exchanges on them marked (`gap`), as the in-memory path leaves bytes lost at both
points (run/spilled.py does so when the in-memory run would pass the memory bound). Several app points of one DB
point are taken: a side's table is its points' rows in order (`_Points.table`), each row keyed by its point, on its
app point's clock (§24)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.framefile import FrameFile
from ..core.memory import release_memory
from ..core.outputs import SortedRun
from ..core.schema import CONNECTION_COLUMNS, EXCHANGE_COLUMNS
from ..core.tables import concat, frame, frame_of_table, table_of
from ..pair.clocks import clock_keys
from ..pair.match import (ConnectionStep, Matching, MatchStats, SpilledKeys, combined_spans, exchange_rows,
                          matching_row_keys, one_point_matching, paired_spans, pairing_keys, pairs_inside)
from ..pair.pairing import db_points
from ..read import connids
from ..read.exchanges import Extraction
from ..read.spill import BUCKETS, SORT_BY
from .servers import joined_rows

TARGET_ROWS = 1 << 16  # rows a partition is cut for (§3: ≈ 50 MiB of the in-memory path's working set)
KEPT_RUN_ROWS = 1 << 14  # rows of a kept run in one batch of its file (one batch is converted at a time)
# the columns the first pass reads of each bucket: the pairing's keys, what decides that a candidate agrees, the
# ordinal and the server endpoint
FIRST_PASS_COLUMNS = ("capture", "server", "conn_index", "seq", "req_first_ts", "command", "sql", "req_tcp_seq",
                      "resp_tcp_end", "result")
# what read.connids.ids_from_answers reads of a row that answers SELECT CONNECTION_ID() (and conn_id, which
# name_connections fills): spilled_names gathers them
ANSWER_COLUMNS = ("capture", "client", "server", "conn_index", "seq", "req_first_ts", "command", "sql", "result",
                  "resp_first_frame", "resp_last_frame", "resp_tcp_seq", "resp_tcp_end", "conn_id")


class NotPartitionable(ValueError):
    """The capture set needs what the partitioned run does not do (yet): the in-memory path makes its tables."""


class LostFrames(NotPartitionable):
    """A pair partitionable but for its frames lost: the loss repair, which the partitioned run does not do, would
    re-read the lossy points' connections (`lossy`: those points' extractions). Partitioned `unrepaired`, the lost
    bytes stay holes."""

    def __init__(self, lossy: list[Extraction]):
        super().__init__(f"frames lost at {', '.join(x.capture for x in lossy)}: the loss repair re-reads whole "
                         "connections")
        self.lossy = lossy


def check_partitionable(app: list[Extraction], db: list[Extraction], proxy: list[Extraction] = (),
                        proxy_servers=(), unrepaired: bool = False) -> None:
    """Raises NotPartitionable, saying why, unless PairedPartitions can make these points' joined table (`proxy`:
    the set's proxy points' extractions, `proxy_servers`: its proxy endpoints; any proxy is refused, one without a
    proxy in its traffic too). DB points alone (no app point) are partitionable, with frames lost too (nothing to
    repair); a pair with frames lost is refused last (LostFrames: nothing else stands in the way), unless
    `unrepaired` (analysed without the loss repair)."""
    if not db:
        raise NotPartitionable("the partitioned run reads a DB point, alone or paired with an app point: it is missing")
    if app and len(db) > 1:
        raise NotPartitionable(f"{len(db)} DB points: each row's clock is its pair of points (not partitioned yet)")
    if proxy or proxy_servers:
        raise NotPartitionable("a proxy: its two sides are different TCP connections, paired across connections")
    unspilled = [x.capture for x in (*app, *db) if x.spill is None]
    if unspilled:
        raise NotPartitionable(f"{', '.join(unspilled)} did not spill its exchanges (read/spill.py)")
    # the loss repair borrows a lossy point's bytes from the other point (pair.pairing.pair_points): DB points
    # alone have none to borrow from and are analysed with their holes, in memory as here
    lossy = [x for x in (*app, *db) if x.holes] if app else []
    if lossy and not unrepaired:
        raise LostFrames(lossy)


@dataclass
class FirstPass:
    """What the partitions read of each other, from one pass over the buckets: per side each connection's least
    and greatest paired ordinal (match.paired_spans), the server endpoints (as the app saw them) of the matched
    rows and of the DB's rows (a row only the app saw is the DB point's when its server is one of them:
    pairing.db_points with one DB point), the partitions (each a run of buckets: its first and its end), and the
    pairing's counts (MatchStats' rows, summed over the partitions)."""

    spans: tuple[pd.DataFrame, pd.DataFrame]
    leading_servers: set
    partitions: list[tuple[int, int]]
    matched: int = 0
    app_only: int = 0
    db_only: int = 0
    conflicts: int = 0
    work: int = 0


class _Points:
    """One side's spilled points: a run of buckets read as the side's table holds those rows (its points in
    order, each sorted by the extraction's order), and each row's connection key as Pairing keys the side's
    concatenated tables (match.SpilledKeys; `keyed` False: None, for a side nothing is paired with, whose keys
    would cost a pass over its buckets)."""

    def __init__(self, points: list[Extraction], keyed: bool = True):
        self.points = points
        self.keys = SpilledKeys(points) if keyed else None

    def rows(self) -> np.ndarray:
        return np.sum([x.spill.rows for x in self.points], axis=0)

    def table(self, first: int, end: int, columns=EXCHANGE_COLUMNS) -> tuple[pd.DataFrame, np.ndarray | None]:
        """The rows of buckets first … end − 1 (the `columns` of them) and their connection keys (None unkeyed)."""
        names = [c.name for c in columns]
        parts = []
        for x in self.points:
            batches = [b.select(names) for bucket in range(first, end) for b in x.spill.bucket(bucket)]
            if batches:
                parts.append(frame_of_table([table_of(batches, columns, sort_by=SORT_BY)], columns))
        if not parts:
            return frame([], columns), np.zeros(0, dtype=np.int64) if self.keys is not None else None
        table = concat(parts) if len(parts) > 1 else parts[0]
        return table, self.keys.of_rows(table) if self.keys is not None else None


def partitions_of(rows: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """The buckets cut into at most `parts` runs (first, end) of about the same rows (`rows` per bucket): a run
    ends at the bucket where the running count reaches the next multiple of rows / parts (§3). A run without rows
    joins the run before it (the first one: the run after it), so the runs cover every bucket."""
    ends = np.cumsum(rows)
    targets = ends[-1] * np.arange(1, parts + 1) / parts
    last = np.minimum(np.searchsorted(ends, targets, side="left"), BUCKETS - 1)
    last[-1] = BUCKETS - 1
    runs, first = [], 0
    for bucket in last:
        if int(bucket) + 1 > first:
            runs.append((first, int(bucket) + 1))
            first = int(bucket) + 1
    out: list[tuple[int, int]] = []
    for a, b in runs:
        if out and (not rows[a:b].sum() or not rows[out[-1][0]:out[-1][1]].sum()):
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _paired(app: pd.DataFrame, db: pd.DataFrame, conn_a: np.ndarray, conn_d: np.ndarray,
            step: ConnectionStep) -> tuple:
    """pairs_inside of a partition's two tables: its rows inside the connection pairs."""
    return pairs_inside(app, db, pairing_keys(app, db, conn_a, conn_d), step.pair_a, step.pair_d)


@dataclass
class _FirstShare:
    """One partition's share of the FirstPass: its connections' paired spans per side, the servers it saw lead to
    the DB point, its pairing's counts."""

    spans: tuple[pd.DataFrame, pd.DataFrame]
    servers: set
    matched: int
    app_only: int
    db_only: int
    conflicts: int
    work: int


def in_this_process(function, shared, calls: list[tuple]) -> list:
    """The mapper of one process: function(shared, *call) for every call, in order (run.cluster.DaskRunner.map
    does the same on Dask workers)."""
    return [function(shared, *call) for call in calls]


def first_pass(app: _Points, db: _Points, step: ConnectionStep, partitions: list[tuple[int, int]],
               mapper=None) -> FirstPass:
    """FirstPass from the partitions' narrow columns (FIRST_PASS_COLUMNS), one partition at a time (`mapper`:
    where the partitions' shares are made, in_this_process by default)."""
    counts = FirstPass((None, None), set(), partitions)
    spans_a, spans_d = [], []
    for share in (mapper or in_this_process)(_first_share, (app, db, step), partitions):
        spans_a.append(share.spans[0])
        spans_d.append(share.spans[1])
        counts.leading_servers.update(share.servers)
        counts.matched += share.matched
        counts.app_only += share.app_only
        counts.db_only += share.db_only
        counts.conflicts += share.conflicts
        counts.work += share.work
    counts.spans = (combined_spans(spans_a), combined_spans(spans_d))
    return counts


def _first_share(points: tuple[_Points, _Points, ConnectionStep], first: int, end: int) -> _FirstShare:
    """The first pass over buckets first … end − 1: the pairing inside the connection pairs of its narrow rows."""
    app, db, step = points
    columns = tuple(c for c in EXCHANGE_COLUMNS if c.name in FIRST_PASS_COLUMNS)
    a, conn_a = app.table(first, end, columns)
    d, conn_d = db.table(first, end, columns)
    *inside, work = _paired(a, d, conn_a, conn_d, step)
    ai, di, ok = inside[0], inside[1], inside[4]
    spans = (paired_spans(conn_a, a["seq"].to_numpy(), ai[ok]), paired_spans(conn_d, d["seq"].to_numpy(), di[ok]))
    servers = {*a["server"].astype(object).to_numpy()[ai[ok]].tolist(),
               *d["server"].astype(object).dropna().unique().tolist()}
    rows = exchange_rows(a, d, tuple(inside), conn_a, conn_d, step.pair_a, step.pair_d, step.ambiguous, spans)
    share = _FirstShare(spans, servers, rows.matched, rows.app_only, rows.db_only, rows.conflicts, work)
    del a, d, inside, rows
    release_memory()  # the partition's heap back before the next one's: the pass's peak is one partition's
    return share


def spilled_names(processlist, points: dict, app: list[Extraction], db: list[Extraction], note,
                  target_rows: int = TARGET_ROWS) -> tuple[dict[str, str], dict[tuple[str, int], int]]:
    """spilled_naming's {client endpoint: source} and the ids it named."""
    id_sources, named, _ = spilled_naming(processlist, points, app, db, note, target_rows)
    return id_sources, named


def spilled_naming(processlist, points: dict, app: list[Extraction], db: list[Extraction], note,
                   target_rows: int = TARGET_ROWS) -> tuple[dict[str, str], dict[tuple[str, int], int], list]:
    """read.connids.name_connections of spilled points, without their exchange tables: the rows it reads (the
    answers to SELECT CONNECTION_ID(), connids.answers_connection_id) gathered a run of buckets at a time, in the
    concatenated tables' order (each point's rows by SORT_BY, the points in order), and handed to it with the
    extractions' connections tables (filled in place, as name_connections fills them). Returns its {client endpoint:
    source} (PairedPartitions' `id_sources`), the ids it named, (capture, conn_index) → id (`named`), and the two
    sides' connections tables as it filled them (pair_points' app_conns and db_conns: what summary.json's stories
    and the report read). `processlist`, `points`, `note`: name_connections'."""
    sides = [concat([x.connections for x in xs]) if xs else frame([], CONNECTION_COLUMNS) for xs in (app, db)]
    named_side = 1 if len(sides[1]) else 0  # name_connections names the DB point's connections when it has some
    xs, conns = (app, db)[named_side], sides[named_side]
    answers = [frame([], EXCHANGE_COLUMNS), frame([], EXCHANGE_COLUMNS)]
    if len(conns) and conns["conn_id"].isna().any():  # else no answer is read (name_connections' own test)
        spilled = _Points(xs, keyed=False)
        columns = tuple(c for c in EXCHANGE_COLUMNS if c.name in ANSWER_COLUMNS)
        rows = spilled.rows()
        parts = []
        for first, end in partitions_of(rows, max(1, -(-int(rows.sum()) // target_rows))) if rows.sum() else []:
            table, _ = spilled.table(first, end, columns)
            parts.append(table[connids.answers_connection_id(table)])
            del table
        if parts:
            found = concat(parts)
            point = pd.Index([x.capture for x in xs]).get_indexer(found["capture"].astype(object).to_numpy())
            order = np.lexsort((found["seq"].to_numpy(), found["conn_index"].to_numpy(),
                                found["req_first_ts"].to_numpy(dtype="datetime64[ns]"), point))
            answers[named_side] = found.take(order).reset_index(drop=True)
    id_sources = connids.name_connections(processlist, points, answers[0], sides[0], answers[1], sides[1], note)
    mine = conns[conns["conn_id_source"].isin([connids.ANSWER, connids.PROCESSLIST]).to_numpy()]
    named = dict(zip(zip(mine["capture"].astype(str), mine["conn_index"].astype(int)), mine["conn_id"].astype(int)))
    return id_sources, named, sides


def _db_points(app: pd.DataFrame, db: pd.DataFrame, matching: Matching, point: str, leading: set) -> np.ndarray:
    """pairing.db_points of a partition's rows with one DB point (`point`): a row the DB saw is its; a row only
    the app saw is its when the row's server (as the app saw it) is among `leading` (FirstPass.leading_servers);
    else None."""
    ar, dr = matching.app_row, matching.db_row
    out = np.full(len(ar), None, dtype=object)
    out[dr >= 0] = point
    only_a = np.flatnonzero((dr < 0) & (ar >= 0))
    if len(only_a) and leading:
        servers = app["server"].astype(object).to_numpy()[ar[only_a]]
        out[only_a[pd.Series(servers).isin(list(leading)).to_numpy()]] = point
    return out


def sorted_run(table: pd.DataFrame, keys: np.ndarray) -> SortedRun:
    """A partition's joined rows and their row keys as a SortedRun (sorted by key)."""
    order = np.lexsort(keys.T[::-1])
    return SortedRun(table.take(order).reset_index(drop=True), keys[order])


class PairedPartitions:
    """The joined table (explain.servers.joined_table's rows and columns) of the spilled points `app` and `db`, as
    SortedRuns, one partition at a time: iterating makes them. `step`: match.spilled_connection_step(app, db)
    (None with `app` empty: DB points alone, nothing to pair); `clocks`: the fitted models by app point (pair.
    clocks.fit_clocks; {} for DB points alone); `id_sources`, `named`: what read.connids.
    name_connections gave (client endpoint → source; and the ids it put on connections without a greeting,
    (capture, conn_index) → id); `parts`: the number of partitions (None: as many as `target_rows`, else
    TARGET_ROWS as it is at the call, asks for);
    `proxy`, `proxy_servers`: the set's proxy points and endpoints; `mapper`: where the first pass's partitions
    are read (`first_pass`; run.cluster.DaskRunner.map: on Dask workers); `unrepaired`: a pair with frames lost is
    taken, its lost bytes left holes (as pair_points leaves them with the repair off). The constructor raises
    NotPartitionable (check_partitionable) before reading a row, then makes `first_pass`."""

    def __init__(self, app: list[Extraction], db: list[Extraction], step: ConnectionStep | None, clocks: dict,
                 *, id_sources: dict[str, str] | None = None, named: dict[tuple[str, int], int] | None = None,
                 parts: int | None = None, target_rows: int | None = None, proxy: list[Extraction] = (),
                 proxy_servers=(), mapper=None, unrepaired: bool = False):
        check_partitionable(app, db, proxy, proxy_servers, unrepaired)
        self.alone = not app  # DB points alone: a partition's rows are its DB rows (match.one_point_matching)
        self.app, self.db = (_Points(app), _Points(db)) if not self.alone else (None, _Points(db, keyed=False))
        self.step, self.clocks = step, clocks
        self.id_sources, self.named = id_sources or {}, named or {}
        # some partition's rows took a statement from the DB side (decompose._statements_from_db): those columns'
        # dictionaries are then the values present (servers.output_categories); known once the runs were made
        self.statements_from_db = False
        self.primary = app[0].capture if app else None
        self.db_point = db[0].capture
        self.app_names, self.db_names = [x.capture for x in app], [x.capture for x in db]
        # a bucket's joined rows: about its larger side's
        rows = self.db.rows() if self.alone else np.maximum(self.app.rows(), self.db.rows())
        total = int(rows.sum())
        parts = parts if parts is not None else max(1, -(-total // (target_rows or TARGET_ROWS)))
        partitions = partitions_of(rows, parts) if total else []
        if self.alone:  # nothing crosses the partitions: no spans, no server leads to a point, every row DB-only
            self.first_pass = FirstPass((None, None), set(), partitions, db_only=total)
        else:
            self.first_pass = first_pass(self.app, self.db, step, partitions, mapper)

    def stats(self) -> MatchStats:
        """MatchStats of the whole pairing (Pairing.complete's), from the connection step and the first pass."""
        f, s = self.first_pass, self.step
        if self.alone:  # as match.one_point_matching counts them
            return MatchStats(app_exchanges=0, db_exchanges=f.db_only, matched=0, app_only=0, db_only=f.db_only,
                              conflicts=0, connections_matched=0, connections_by_scramble=0, connections_nat=0,
                              connections_vetoed=0)
        conns = s.connections
        amb_a, amb_d = s.ambiguous
        return MatchStats(
            app_exchanges=int(self.app.rows().sum()), db_exchanges=int(self.db.rows().sum()), matched=f.matched,
            app_only=f.app_only, db_only=f.db_only, conflicts=f.conflicts, connections_matched=len(conns),
            connections_by_scramble=int(conns["by_scramble"].sum()), connections_nat=int(conns["nat"].sum()),
            connections_vetoed=s.vetoed, connections_ambiguous=len(amb_a) + len(amb_d),
            ambiguous_keys=s.ambiguous_keys, candidates=s.work + f.work)

    def __iter__(self) -> Iterator[SortedRun]:
        for first, end in self.first_pass.partitions:
            yield self.partition(first, end)

    def partition(self, first: int, end: int) -> SortedRun:
        """The joined rows of buckets first … end − 1, sorted by their row keys."""
        run, from_db = self.made(first, end)
        self.statements_from_db |= from_db
        return run

    def made(self, first: int, end: int) -> tuple[SortedRun, bool]:
        """partition(first, end), and whether its rows took a statement from the DB side (`statements_from_db`'s
        share: a process that makes one partition, a Dask worker, hands it back)."""
        if self.alone:
            return self._alone(first, end), False
        a, conn_a = self.app.table(first, end)
        d, conn_d = self.db.table(first, end)
        *inside, _ = _paired(a, d, conn_a, conn_d, self.step)
        rows = exchange_rows(a, d, tuple(inside), conn_a, conn_d, self.step.pair_a, self.step.pair_d,
                             self.step.ambiguous, self.first_pass.spans)
        matching = Matching(rows.app_row, rows.db_row, rows.notes, self.step.connections, None)
        keys = matching_row_keys(matching, a, d, self.app_names, self.db_names)
        both = (rows.app_row >= 0) & (rows.db_row >= 0)
        from_db = bool((a["sql"].isna().to_numpy()[rows.app_row[both]]
                        & d["sql"].notna().to_numpy()[rows.db_row[both]]).any())
        connids.fill_rows(d, self.named)  # as name_connections fills the DB side's table
        row_point = _db_points(a, d, matching, self.db_point, self.first_pass.leading_servers)
        table = joined_rows(a, d, matching, self.clocks, self.primary, None, None, None, self.id_sources, row_point)
        run = sorted_run(table, keys)
        del a, d, table
        release_memory()  # what made the run, back before the next partition's tables are read
        return run, from_db

    def _alone(self, first: int, end: int) -> SortedRun:
        """partition() of DB points alone: the rows as pair_points makes them without an app point (one_point_
        matching, each row on its own DB point, no clock; with several DB points their clock keys, clock_keys')."""
        a = frame([], EXCHANGE_COLUMNS)
        d, _ = self.db.table(first, end)
        matching = one_point_matching(a, d)
        keys = matching_row_keys(matching, a, d, [], self.db_names)
        connids.fill_rows(d, self.named)
        row_point = db_points(a, d, matching)
        row_clock = clock_keys(a, matching, row_point, self.clocks, None) if len(self.db_names) > 1 else None
        table = joined_rows(a, d, matching, self.clocks, None, row_clock, None, None, self.id_sources, row_point)
        run = sorted_run(table, keys)
        del a, d, table
        release_memory()  # what made the run, back before the next partition's tables are read
        return run


class RunsMadeOnce:
    """PairedPartitions' runs made once each and kept in `folder` (per partition an Arrow IPC file of the run's
    table, its dtypes and categories exactly: core.framefile.FrameFile, no pickle; and its row keys, .npy), then
    read back: step 7b reads every partition's rows twice
    (its first pass, its rows), and making them again cost about as much as the rest of 7b (docs/partitioned.md
    §13's CPU). Iterating gives each partition's run, made the first time (`made`) and read back after (`kept`).
    A process that makes or reads one partition (a Dask worker) does it by `made(p)` / `kept(p)` on a copy of this
    object: the folder must then be the same path there. Every copy makes a partition from the same PairedPartitions
    (its first pass done, its clocks and names set), so a run is the same wherever it is made."""

    def __init__(self, rows: PairedPartitions, folder: Path):
        self.rows, self.folder = rows, Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def __len__(self) -> int:
        return len(self.rows.first_pass.partitions)

    def __iter__(self) -> Iterator[SortedRun]:
        for p in range(len(self)):
            yield self.kept(p) if self._file(p).exists() else self.made(p)

    def _file(self, p: int) -> Path:
        return self.folder / f"{p:04d}.arrow"

    def made(self, p: int) -> SortedRun:
        """Partition p's run, made (PairedPartitions.made) and kept; whether it took a statement from the DB side
        is kept beside it (a file, so that the process that made it need not be this one)."""
        run, from_db = self.rows.made(*self.rows.first_pass.partitions[p])
        np.save(self.folder / f"{p:04d}.key.npy", run.key, allow_pickle=False)
        FrameFile(self._file(p), run.table, KEPT_RUN_ROWS).close()
        if from_db:
            (self.folder / f"{p:04d}.from-db").touch()
        return run

    def kept(self, p: int) -> SortedRun:
        """Partition p's run as `made` kept it (read whole: 7b reads every row of it)."""
        return SortedRun(FrameFile.read(self._file(p)), np.load(self.folder / f"{p:04d}.key.npy", allow_pickle=False))

    @property
    def statements_from_db(self) -> bool:
        """Some partition's rows took a statement from the DB side (PairedPartitions.statements_from_db), once
        every partition was made."""
        return self.rows.statements_from_db or any(self.folder.glob("*.from-db"))
