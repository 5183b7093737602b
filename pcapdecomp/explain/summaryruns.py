"""summary.json's parts made from the partitions' sorted runs (docs/partitioned.md step 7c), not from the whole
table: the `exchanges` counts, `conn_ids`, `latency_s`, and the verdict's `queueing`, `hidden_slow` and
`understated` — each the value summary.build and verdict.tell make of the whole table, float for float.

What it reads of the runs, and when:
- per partition, in any order (`SummaryOfRuns(...)`): the counts (they add up), each connection's first row (the
  least row key wins), the app-side times of the robust span (`threadpool.outlier_limits`: order statistics),
  then each row's `sane` flag, the counts of the sums and each partition's candidates of the two victim lists (its
  slowest VICTIMS_LISTED by server_s, ties by row key);
- in row order (`feed(run, row)`: the pieces of the merge as `core.outputs.write_merged` streams them, through its
  `merged_rows` hook, or `merged_order` alone): the sums, numpy's pairwise sum in row order (core.exact.
  PairwiseSum), which no sum of partition sums reproduces;
- then (`parts()`): the quantiles and maxima from the partitions' sorted values (one column at a time), the
  victims' top VICTIMS_LISTED of the candidates, and their references (threadpool.Refs) read from the selected
  rows alone.

What the rows do not hold is handed in by row key, as the pool view (threadpool.PoolView) finds it: its outliers
(rows with wild DB-side times) and each stall's culprits (`view.stall_members[sid][1]`). One DB point only: with
several, summary.build tells the verdict per point (a refusal here, `SeveralServers`).

The rest of summary.json (`tell`, `connections`, `network`, `usual_execution`: summary.build(runs=…) and
stories.tell(runs=…) call them): the verdict's story and text, the connection and network stories and the
playbook, by the rules verdict, connstory, netstory and playbook apply to the whole table, each split into what a
chunk of rows gives (facts reduced by their kind, terms summed in row order by a PairwiseSum each, pandas' groupby
sums by core.exact.GroupbySums fed in row order, top-k candidates by row key) and the words made of them. The
pool view's stall members and cap members are handed in by row key too. Not through a proxy (NotFromRuns: the
partitioned path does not apply there, docs/partitioned.md §3). See docs/partitioned.md, "Step 7c's rest"."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.exact import GroupbySums, PairwiseSum, median_of_runs, nearest_rank_of_runs, sorted_run
from ..core.groups import equals
from ..core.outputs import KeyFile, SortedRun, StoredRows, key_array, merged_order
from ..core.times import ts_ns
from ..read.connids import SOURCES
from .summary import NotFromRuns, _counts
from .waitprofile import host_codes
from .threadpool import MAX_CULPRITS, Refs, outlier_limits
from .decompose import STALL_MIN_QUEUE_S
from . import connstory, netstory, playbook, verdict
from .verdict import VICTIMS_LISTED

LATENCY_COLUMNS = ("total_s", "server_s", "network_s", "net_req_s", "net_resp_s", "queue_s", "exec_s")
QUEUE_SOURCES = ("measured", "estimated", "lower_bound", "likely")  # verdict._queueing's, in its order
VICTIM_LISTS = ("hidden_slow", "understated")  # the table's flag column of each, and its summary.json key


class SeveralServers(ValueError):
    """The runs hold rows of several DB points: the verdict is told per point (summary._tell), not built here."""


class SummaryOfRuns:
    """The summary parts of the runs (see the module's text). `runs`: the partitions' SortedRuns (the final rows);
    `outlier_keys`: the row keys (n × the key's width) of the pool view's outliers; `stall_culprits`: per stall id,
    the row keys of its culprits in the view's order."""

    def __init__(self, runs: list[SortedRun], outlier_keys: np.ndarray | None = None,
                 stall_culprits: list[np.ndarray] | None = None, *, stall_victims: list[np.ndarray] | None = None,
                 cap_members: tuple[np.ndarray, np.ndarray] | None = None, scratch: Path | None = None):
        held: list = [None, None]  # the one stored partition read back whole at a time: (its run's number, its table)
        runs = [_ReadBack(r.table, r.keys, held, n) if isinstance(r.table, StoredRows) else r
                for n, r in enumerate(runs)]
        self.runs = runs
        self.stall_culprits = stall_culprits or []
        self.stall_victims = stall_victims or []  # per stall, its members' row keys (view.stall_members[sid][0])
        self.cap_keys = cap_members  # (executing, waiting) row keys while at the cap (view.cap_members)
        outliers = np.zeros((0, 0), np.int64) if outlier_keys is None else np.asarray(outlier_keys, np.int64)
        # two passes over the partitions (a stored one read back whole once in each): what a partition gives alone,
        # then, with the app times' robust span of them all, each row's `sane` and what depends on it
        points: set = set()
        self.counts: dict = {}
        first: dict = {}
        times = []
        self._captures: set = set()  # the captures whose exchanges the runs hold (connstory.captures_of)
        for run in runs:
            t = run.table
            self._captures |= connstory.captures_of(t)
            if "db_point" in t:
                points |= {str(p) for p in t["db_point"].dropna().unique()}
            for name, n in _counts(t).items():  # every count adds up over the partitions
                self.counts[name] = self.counts.get(name, 0) + n
            _first_sources(run, first)
            times.append(_app_times(t)[1:])  # the union of the app times: an order statistic's input
            del t
        if len(points) > 1:
            raise SeveralServers(f"rows of {len(points)} DB points: the verdict is told per point")
        self.conn_ids = _conn_id_sources(first)
        limits = _app_limits(times)
        del times
        # the sums' channels: column → the rows whose values the sum takes: its non-null values (None), else the
        # queueing's rows (sane and seen at both points: "both"), of one queue_source (its index in QUEUE_SOURCES)
        n = len(runs)
        self.sane = [None] * n
        self._sorted = _SortedColumns(n, scratch)  # the latency columns' values of each run, for the quantiles
        candidates: dict = {flag: [None] * n for flag in VICTIM_LISTS}
        flagged = ([None] * n, [None] * n)  # per run, its hidden and its understated rows (sane ones)
        for r in reversed(range(n)):  # from the last: the partition the first pass read last is still held
            run = runs[r]
            t, key = run.table, run.key  # a stored run's keys read once here, let go with its table
            s = self.sane[r] = _sane_of(t, key, outliers, limits)
            self._sorted.keep(r, t, stored=isinstance(run, _ReadBack))
            for flag, rows in zip(VICTIM_LISTS, flagged):
                candidates[flag][r] = _victim_candidates(t, key, r, flag, s)
                rows[r] = t[flag].to_numpy(dtype=bool, na_value=False) & s
            del t, key
        self._flag_rows = flagged
        self.candidates = {flag: (sum(c for c, _ in pieces), np.concatenate([p for _, p in pieces]) if pieces
                                  else _victim_piece(0, runs[0].keys.shape[1] if runs else 0))
                           for flag, pieces in candidates.items()}
        # the sums (summary.json's latency sums and queueing, _summary_terms; the story's, verdict.story_terms;
        # the connections' and the network's), each term's rows and values made a block of a run at a time, fed in
        # row order: no column of every row held (a function of the runs, not a method: the terms held by this
        # object would hold it in a cycle, and a partition read back with it, until the collector ran)
        self.terms = _RowOrderTerms(functools.partial(_terms_of, runs, self.sane), [len(r.keys) for r in runs])
        self.network_groups = _NetworkGroups(runs)
        self._parts = None

    def feed(self, run: np.ndarray, row: np.ndarray) -> None:
        """The next piece of the merged order (merged_order's: run, row in that run), every row once, in row
        order."""
        self.terms.feed(run, row)
        self.network_groups.feed(run, row)

    def feed_all(self) -> SummaryOfRuns:
        """The rows in row order by the k-way merge alone (no file written beside it)."""
        for run, row in merged_order([r.keys for r in self.runs]):
            self.feed(run, row)
        return self

    def parts(self) -> dict:
        """summary.json's exchanges, conn_ids, latency_s, queueing, hidden_slow and understated (made once)."""
        if self._parts is None:
            self._parts = self._made_parts()
        return self._parts

    def _made_parts(self) -> dict:
        sums = self.terms.result()
        queueing = {f"{s}_s": sums[f"{SUMMARY_TERM}queue:{s}"][1] for s in QUEUE_SOURCES}
        return {
            "exchanges": self.counts,
            "conn_ids": self.conn_ids,
            "latency_s": self._latency(sums),
            "queueing": {**queueing, "certain_s": sums[f"{SUMMARY_TERM}queue:certain"][1]},
            "hidden_slow": self._victims("hidden_slow"),
            "understated": {**self._victims("understated"), "threshold_s": STALL_MIN_QUEUE_S},
        }

    def tell(self, summary: dict) -> dict:
        """verdict.tell's parts (queueing, hidden_slow, understated, story, verdict) from the runs, `summary` holding
        the other parts the story reads (inputs, exchanges, clock, slow_log, groups, pool, thread_pool_size), as
        summary.build hands them to verdict.tell."""
        made = self.parts()
        parts = {k: made[k] for k in ("queueing", "hidden_slow", "understated")}
        rows = _RunsRows(self)
        stalls = verdict.told_stalls(summary)
        facts = verdict.combine_facts([
            verdict.story_facts(run.table, sane, hidden, understated, told, run.key)
            for run, sane, hidden, understated, told in zip(self.runs, self.sane, *self._flags(),
                                                            rows.told_masks(stalls))])
        story = verdict._story(summary, facts, self.terms.result(), rows)
        parts["story"] = story
        parts["verdict"] = "\n".join([story["sentence"], *(f"- {b['text']}" for b in story["bullets"])])
        return parts

    def connections(self, conns: pd.DataFrame | None) -> dict | None:
        """connstory.tell of the runs: summary.json → connections."""
        if conns is None or not len(conns):
            return None
        closes = connstory.server_closes(conns, self._captures)
        # from the last run (the one the verdict's pass read last is still held), listed in their order
        facts = connstory.combine_facts([connstory.row_facts(r.table, closes) for r in self.runs[::-1]][::-1])
        return connstory.told(facts, self.terms.result(), conns)

    def network(self, conns: pd.DataFrame | None) -> dict | None:
        """netstory.tell of the runs: summary.json → network."""
        groups = self.network_groups
        if groups.proxied:
            raise NotFromRuns("through a proxy")
        if groups.absent or not groups.rows:
            return None
        sums = self.terms.result()
        by_host, by_conn = groups.frames()
        if conns is None or not len(conns) or "retransmitted_bytes" not in conns.columns:
            retrans = netstory.told_retransmissions(None, 0, pd.DataFrame())
        else:
            rb, keys = netstory.retransmitting(conns, self._captures)
            count, pieces = 0, []
            width = self.runs[0].keys.shape[1]
            kind = np.dtype([("slow", np.float64), ("key", np.int64, (width,)), ("run", np.int64), ("row", np.int64)])
            for r, run in enumerate(self.runs):
                net, _, both = netstory.row_times(run.table)
                rows = np.flatnonzero(netstory.rto_rows(run.table, keys, both, net))
                count += len(rows)
                piece = np.empty(len(rows), dtype=kind)
                piece["slow"], piece["key"], piece["run"], piece["row"] = -net[rows], run.key[rows], r, rows
                pieces.append(_top(piece, netstory.LISTED))
            listed = _top(np.concatenate(pieces), netstory.LISTED)
            named = rows_at(self.runs, list(zip(listed["run"].tolist(), listed["row"].tolist())))
            named = named.assign(_net=-listed["slow"]) if len(named) else named.assign(_net=np.zeros(0))
            retrans = netstory.told_retransmissions(rb, count, named)
        return netstory.told(sums["network:network_s"][1], sums["network:clients_s"][1], by_host, by_conn, retrans)

    def usual_execution(self, stalls: list[dict]) -> float | None:
        """playbook._usual_execution of the runs: the median by counting over each run's sorted values."""
        if not self.runs or not playbook.has_usual_columns(_slice(self.runs[0], 0, 0)):
            return None
        ids = [s.get("id") for s in stalls]
        classes = set().union(*(playbook.usual_classes(r.table, ids) for r in self.runs[::-1]))  # the last is held
        if not classes:
            return None
        values = [np.sort(playbook.usual_values(r.table, ids, classes)) for r in self.runs]
        return median_of_runs(values) if any(len(v) for v in values) else None

    def _flags(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per run, its hidden and its understated rows (sane ones: verdict.tell's masks), made in the second pass."""
        return self._flag_rows

    def rows_of_keys(self, keys: np.ndarray) -> list[tuple[int, int]]:
        """(run, row) of each row key, in their order."""
        keys = np.asarray(keys, dtype=np.int64)
        found = np.full(len(keys), -1, dtype=np.int64)
        place = np.zeros(len(keys), dtype=np.int64)
        for r, run in enumerate(self.runs):
            at = _positions_of_keys(run.key, keys)
            hit = (at >= 0) & (found < 0)
            found[hit], place[hit] = r, at[hit]
        if (found < 0).any():
            raise KeyError(f"no row has the key {keys[np.flatnonzero(found < 0)[0]].tolist()}")
        return list(zip(found.tolist(), place.tolist()))

    def _latency(self, sums: dict[str, tuple[int, float]]) -> dict:
        """summary.latency_quantiles' values: count, the pairwise sum in row order, nearest-rank p50/p99, max."""
        out = {}
        for col in LATENCY_COLUMNS:
            runs = self._sorted.runs_of(col)  # one column's sorted values at a time
            n = sum(len(r) for r in runs)
            if not n:
                out[col.removesuffix("_s")] = None
                continue
            p50, p99 = nearest_rank_of_runs(runs, [0.5, 0.99])
            out[col.removesuffix("_s")] = {"count": n, "sum": sums[f"{SUMMARY_TERM}{col}"][1], "p50": float(p50),
                                           "p99": float(p99), "max": float(max(r[-1] for r in runs if len(r)))}
            del runs
        return out

    def _victims(self, flag: str) -> dict:
        """verdict._victims of the rows flagged (and sane): the slowest VICTIMS_LISTED by server_s (NaN as −1),
        ties by row key, grouped by the stall they were victims of, with the stalls' culprits."""
        count, chosen = self.candidates[flag]
        listed = _top(chosen, VICTIMS_LISTED)
        rows = [(int(r), int(i)) for r, i in zip(listed["run"], listed["row"])]
        by_stall = []
        if rows:
            at = rows_at(self.runs, rows)  # their stall, role and thread group, read once
            by_stall = verdict.grouped_by_stall(
                rows, at["stall"].to_numpy(dtype="float64", na_value=np.nan),
                at["stall_role"].astype(object).to_numpy(), at["thread_group"],
                lambda sid: [self._row_of_key(k) for k in self.stall_culprits[sid][:MAX_CULPRITS]]
                if sid < len(self.stall_culprits) else None,
                lambda places: _refs(self.runs, places))
        return {"count": count, "listed": len(rows), "more": count - len(rows), "by_stall": by_stall}

    def _row_of_key(self, key: np.ndarray) -> tuple[int, int]:
        """(run, row) of the row with this key (each run is sorted by its keys: a binary search per run, a stored
        run's keys read a row at a time)."""
        for r, run in enumerate(self.runs):
            at = _row_with_key(run.keys, key)
            if at is not None:
                return r, at
        raise KeyError(f"no row has the key {key.tolist()}")


def _terms_of(runs: list, sane: list[np.ndarray], r: int, lo: int, hi: int):
    """The sums' terms of run r's rows lo:hi: summary.json's (_summary_terms), the verdict's (story_terms), the
    connections' and the network's, each rule on those rows alone (every term is per row)."""
    t = _slice(runs[r], lo, hi)
    s = sane[r][lo:hi]
    return [*_summary_terms(t, s), *verdict.story_terms(t, s), *connstory.terms(t),
            *((f"network:{n}", rows, v) for n, rows, v in netstory.terms(t))]


SUMMARY_TERM = "summary:"  # the names of _summary_terms' sums begin so (the story's are verdict.story_terms')


def _summary_terms(t: pd.DataFrame, sane: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """summary.json's sums as terms of these rows (name, rows, values; a value's NaN is 0 where its row is taken):
    each latency column's non-null values (latency_s' sums), and queue_s of the queueing's rows — sane and seen at
    both points — of each queue_source, queue_min_s of them all (queueing's; verdict._sum: NaN as 0, infinities
    kept)."""
    out = []
    for col in LATENCY_COLUMNS:
        v = _floats(t, col)
        out.append((f"{SUMMARY_TERM}{col}", ~np.isnan(v), v))
    both = sane & equals(t["seen"], "both")
    source = _source_codes(t)
    queue = _floats(t, "queue_s")
    for i, name in enumerate(QUEUE_SOURCES):
        out.append((f"{SUMMARY_TERM}queue:{name}", both & (source == i), queue))
    out.append((f"{SUMMARY_TERM}queue:certain", both, _floats(t, "queue_min_s")))
    return out


class _SortedColumns:
    """Each run's values of the latency columns (LATENCY_COLUMNS), for the quantiles (nearest_rank_of_runs): a run
    held in memory keeps its columns (no copy; sorted when asked); a stored run's (the partitioned run's, read back
    whole once) are sorted and written to `scratch` (one .npy a run and column), read back one column at a time —
    not held, 56 B a row, through the merge's pass (docs/partitioned.md §25)."""

    def __init__(self, n: int, scratch: Path | None):
        self.scratch = scratch
        self.held: dict[str, list] = {col: [None] * n for col in LATENCY_COLUMNS}

    def keep(self, r: int, t: pd.DataFrame, stored: bool) -> None:
        for col in LATENCY_COLUMNS:
            if stored and self.scratch is not None:
                self.scratch.mkdir(parents=True, exist_ok=True)
                path = self.scratch / f"{col}-{r:04d}.npy"
                np.save(path, sorted_run(_floats(t, col)), allow_pickle=False)
                self.held[col][r] = path
            else:
                self.held[col][r] = _floats(t, col, copy=stored)

    def runs_of(self, col: str) -> list[np.ndarray]:
        """The runs' sorted values of `col` without NaN (core.exact.sorted_run's)."""
        return [np.load(v, allow_pickle=False) if isinstance(v, Path) else sorted_run(v) for v in self.held[col]]


class _ReadBack:
    """A run whose rows are stored (core.outputs.StoredRows: the partitioned run's partitions in files), as the
    summary reads it: `table` read back whole when a pass over the runs reaches it, one partition held at a time
    (`held`, shared by the runs of one SummaryOfRuns: the one read last, by its run's number `n`: a reference to
    the run there would make a cycle, freed only by the collector), and a slice or a few rows read alone (`rows`,
    `take`) where the summary reads no more than those."""

    def __init__(self, stored: StoredRows, keys: np.ndarray | KeyFile, held: list, n: int):
        self.stored, self.keys, self._held, self.n = stored, keys, held, n

    @property
    def key(self) -> np.ndarray:
        """The run's keys as an array (SortedRun.key: a KeyFile's read back whole each time, not kept)."""
        return key_array(self.keys)

    @property
    def table(self) -> pd.DataFrame:
        if self._held[0] != self.n:
            self._held[:] = [None, None]  # the partition held before, let go before this one is read
            self._held[:] = [self.n, self.rows(0, len(self.stored))]
        return self._held[1]

    def rows(self, lo: int, hi: int) -> pd.DataFrame:
        if self._held[0] == self.n:
            return self._held[1].iloc[lo:hi]
        return self.stored.rows(lo, hi) if hi > lo else self.stored.empty()

    def take(self, rows: list[int]) -> pd.DataFrame:
        """The rows (sorted, distinct) of the run, read alone (StoredRows.take: not the whole partition)."""
        if self._held[0] == self.n:
            return self._held[1].take(rows)
        return self.stored.take(rows)


def _slice(run, lo: int, hi: int) -> pd.DataFrame:
    """Rows lo:hi of a run (a stored run's read alone)."""
    return run.rows(lo, hi) if isinstance(run, _ReadBack) else run.table.iloc[lo:hi]


def rows_at(runs: list, places: list[tuple[int, int]]) -> pd.DataFrame:
    """The rows (run, row) of the runs in the order given, as one table: one take per run (a stored run's rows read
    alone, not its whole table)."""
    if not places:
        return _slice(runs[0], 0, 0)
    pieces, order = [], []
    for r in sorted({r for r, _ in places}):
        mine = sorted({i for q, i in places if q == r})
        run = runs[r]
        pieces.append((run.take(mine) if isinstance(run, _ReadBack) else run.table.take(mine)).reset_index(drop=True))
        order += [(r, i) for i in mine]
    table = pd.concat(pieces, ignore_index=True) if len(pieces) > 1 else pieces[0]
    at = {place: n for n, place in enumerate(order)}
    return table.take([at[place] for place in places]).reset_index(drop=True)


def summary_of_runs(runs: list[SortedRun], outlier_keys: np.ndarray | None = None,
                    stall_culprits: list[np.ndarray] | None = None) -> dict:
    """SummaryOfRuns' parts, the rows streamed by the merge alone."""
    return SummaryOfRuns(runs, outlier_keys, stall_culprits).feed_all().parts()


def _floats(table: pd.DataFrame, col: str, copy: bool = False) -> np.ndarray:
    """A float column's values, null as NaN: a float64 column's own array (read only; `copy`: not a view that would
    keep the table's block of float columns), else a copy."""
    column = table[col]
    if column.dtype == np.float64:
        return column.to_numpy(copy=copy)
    return column.to_numpy(dtype="float64", na_value=np.nan)


def _first_sources(run: SortedRun, first: dict) -> None:
    """Of one partition: each connection (capture, conn_index) with its first row's key and conn_id_source
    ("unknown" without an id), into `first` where its key is less than the one there (the least row key over the
    partitions wins: the connection's first row in row order)."""
    t = run.table
    if not len(t) or "conn_id_source" not in t:
        return
    capture, index = t["capture"].astype(object).to_numpy(), t["conn_index"].to_numpy(dtype=np.int64)
    at = ~pd.DataFrame({"c": capture, "i": index}).duplicated().to_numpy()  # a run is in row order: a
    # connection's first row in it
    source = t["conn_id_source"].astype(object).to_numpy()[at]
    named = t["conn_id"].notna().to_numpy()[at]
    for capture, index, key, s, n in zip(capture[at], index[at], run.key[at], source, named):
        label = str(s) if n and not pd.isna(s) else "unknown"
        key = tuple(int(v) for v in key)
        conn = (capture, int(index))
        if conn not in first or key < first[conn][0]:
            first[conn] = (key, label)


def _conn_id_sources(first: dict) -> dict[str, int]:
    """connids.conn_id_sources of the whole table from each connection's first row (_first_sources)."""
    out = dict.fromkeys([*SOURCES, "unknown"], 0)
    for _, label in first.values():
        out[label] += 1
    return out


def _source_codes(table: pd.DataFrame) -> np.ndarray:
    """Each row's queue_source as its index in QUEUE_SOURCES, −1 for another or none."""
    codes = np.full(len(table), -1, dtype=np.int8)
    for i, source in enumerate(QUEUE_SOURCES):
        codes[equals(table["queue_source"], source)] = i
    return codes


def _app_times(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows with both app times, their A1, their A4) of a partition (int64 ns), as verdict._sane reads them."""
    a1, v1 = ts_ns(table["app_req_ts"])
    a4, v4 = ts_ns(table["app_resp_ts"])
    both = np.flatnonzero(v1 & v4)
    return both, a1[both], a4[both]


def _app_limits(times: list[tuple[np.ndarray, np.ndarray]]) -> tuple | None:
    """The robust span of every partition's app times (outlier_limits of their union: order statistics, any
    order); None without a row whose A4 ≥ A1."""
    a1 = np.concatenate([t[0] for t in times]) if times else np.zeros(0, np.int64)
    a4 = np.concatenate([t[1] for t in times]) if times else np.zeros(0, np.int64)
    keep = a4 >= a1
    return outlier_limits(a1, a4, keep) if keep.any() else None


def _sane_of(t: pd.DataFrame, keys: np.ndarray, outliers: np.ndarray, limits: tuple | None) -> np.ndarray:
    """verdict._sane of one partition's rows (its table and keys): not one of the view's outliers, and the app
    times inside `limits` (_app_limits)."""
    both, r1, r4 = _app_times(t)
    s = np.ones(len(keys), dtype=bool)
    for key in outliers:  # few: each found by a binary search in the sorted run
        at = _row_with_key(keys, key)
        if at is not None:
            s[at] = False
    inside = (r4 >= r1) if limits is None else (r4 >= r1) & (r1 >= limits[0]) & (r4 <= limits[1])
    if limits is None:
        inside[:] = False
    s[both[~inside]] = False
    return s


def _victim_piece(n: int, width: int) -> np.ndarray:
    """n candidates of a victim list: (−server_s with NaN as −1, row key, run, row)."""
    kind = np.dtype([("slow", np.float64), ("key", np.int64, (width,)), ("run", np.int64), ("row", np.int64)])
    return np.empty(n, dtype=kind)


def _victim_candidates(t: pd.DataFrame, key: np.ndarray, r: int, flag: str, sane: np.ndarray
                       ) -> tuple[int, np.ndarray]:
    """Of one partition (run r: its table and keys): how many rows are flagged and sane, and its slowest
    VICTIMS_LISTED of them, which hold the whole list's members found there."""
    rows = np.flatnonzero(t[flag].to_numpy(dtype=bool, na_value=False) & sane)
    server = t["server_s"].to_numpy(dtype="float64", na_value=np.nan)[rows]
    piece = _victim_piece(len(rows), key.shape[1])
    piece["slow"] = -np.nan_to_num(server, nan=-1.0)
    piece["key"] = key[rows]
    piece["run"], piece["row"] = r, rows
    return len(rows), _top(piece, VICTIMS_LISTED)


def _top(candidates: np.ndarray, k: int) -> np.ndarray:
    """The first k of the candidates by (slow, key): verdict._victims' stable sort by −server_s over the rows in
    row order."""
    if not len(candidates):
        return candidates
    order = np.lexsort((*candidates["key"].T[::-1], candidates["slow"]))
    return candidates[order[:k]]


def _row_with_key(keys: np.ndarray | KeyFile, key) -> int | None:
    """The row of `keys` (a run's, sorted column by column, distinct) equal to `key`, None if none is: a binary
    search, a KeyFile's rows read through a map of its file (the search touches a page per step, ≈ 17 of them for
    65,536 rows, given back when the map goes; read a row at a time, it opened the file at every step)."""
    key = tuple(int(v) for v in key)
    rows = keys.mapped() if isinstance(keys, KeyFile) else keys
    lo, hi = 0, len(rows)
    while lo < hi:
        mid = (lo + hi) // 2
        if tuple(rows[mid].tolist()) < key:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < len(rows) and tuple(rows[lo].tolist()) == key else None


def _refs(runs: list[SortedRun], rows: list[tuple[int, int]]) -> dict[tuple[int, int], dict]:
    """summary.json's references (threadpool.Refs) to the rows (run, row), read from those rows alone."""
    rows = sorted(set(rows))
    if not rows:
        return {}
    refs = Refs(rows_at(runs, rows))
    return {place: refs.ref(n) for n, place in enumerate(rows)}


def _positions_of_keys(run_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Per key of `keys`, its row in a run (whose keys are distinct), −1 where the run has none: one hash lookup
    of them all."""
    if not len(keys) or not len(run_keys):
        return np.full(len(keys), -1, dtype=np.int64)
    index = pd.MultiIndex.from_arrays(list(np.asarray(run_keys, dtype=np.int64).T))
    return index.get_indexer(pd.MultiIndex.from_arrays(list(np.asarray(keys, dtype=np.int64).T))).astype(np.int64)


class _RowOrderTerms:
    """Sums of (name, rows, values) terms (core.exact.masked_sums' terms: NaN as 0) made over the runs, a
    PairwiseSum each, the rows fed in row order (feed: the merge's pieces). The terms are made by `make(run, lo,
    hi)` a block of a run's rows at a time: once to count each term's rows (a PairwiseSum knows its n), then as the
    merge reaches each block; held at once: one block per run."""

    BLOCK = 8192  # a run's rows whose terms are made at once

    def __init__(self, make, lengths: list[int]):
        self.make, self.lengths = make, lengths
        counts: dict[str, int] = {}
        for r, n in enumerate(lengths):
            for lo in range(0, n, self.BLOCK):
                for name, rows, _ in make(r, lo, min(lo + self.BLOCK, n)):
                    counts[name] = counts.get(name, 0) + int(rows.sum())
        if not counts:  # no row at all: the terms' names from an empty block
            counts = {name: 0 for name, _, _ in make(0, 0, 0)} if lengths else {}
        self._sums = {name: PairwiseSum(n) for name, n in counts.items()}
        self._blocks: dict[int, tuple[int, int, dict]] = {}

    def _block(self, r: int, at: int) -> tuple[int, int, dict]:
        """The block of run r holding its row `at`, its terms made (the run's previous block let go)."""
        block = self._blocks.get(r)
        if block is None or not block[0] <= at < block[1]:
            lo = at - at % self.BLOCK
            hi = min(lo + self.BLOCK, self.lengths[r])
            terms = {}
            for name, rows, values in self.make(r, lo, hi):
                terms[name] = (rows, np.where(np.isnan(values), 0.0, values))
            block = self._blocks[r] = (lo, hi, terms)
        return block

    def feed(self, run: np.ndarray, row: np.ndarray) -> None:
        """A piece of the merged order: (run, row in that run) per row, in row order."""
        pieces = []
        for at in (np.flatnonzero(run == r) for r in np.unique(run)):
            r, lo, hi = int(run[at[0]]), int(row[at[0]]), int(row[at[-1]]) + 1
            while lo < hi:  # the run's rows of the piece, cut where its blocks end
                b0, b1, terms = self._block(r, lo)
                end = min(hi, b1)
                pieces.append((at[:end - lo], terms, lo - b0, end - b0))
                at, lo = at[end - lo:], end
        for name, total in self._sums.items():
            taken = np.zeros(len(run), dtype=bool)
            values = np.zeros(len(run), dtype=np.float64)
            for at, terms, lo, hi in pieces:
                rows, kept = terms[name]
                mine = rows[lo:hi]
                taken[at[mine]] = True
                values[at[mine]] = kept[lo:hi][mine]
            total.add(values[taken])

    def result(self) -> dict[str, tuple[int, float]]:
        return {name: (total.n, total.result()) for name, total in self._sums.items()}


class _RunsRows:
    """The rows the story names (verdict.TableRows' questions), read from the runs by the row keys the pool view
    handed in."""

    def __init__(self, made: SummaryOfRuns):
        self.made = made

    def stall_members(self) -> list[np.ndarray]:
        return [np.asarray(k, dtype=np.int64).reshape(-1, self._width()) for k in self.made.stall_victims]

    def _width(self) -> int:
        return self.made.runs[0].keys.shape[1] if self.made.runs else 0

    def told_masks(self, stalls: list[dict]) -> list[np.ndarray]:
        """Per run, its rows among the members of the stalls that name a culprit."""
        keys = [k for s, k in zip(stalls, self.stall_members()) if s["culprits_total"]]
        keys = np.concatenate(keys) if keys else np.zeros((0, self._width()), dtype=np.int64)
        return [_positions_of_keys(keys, run.key) >= 0 for run in self.made.runs]

    def cap_members(self) -> tuple[pd.DataFrame, int, set]:
        executing, waiting = (np.asarray(k, dtype=np.int64).reshape(-1, self._width()) for k in self.made.cap_keys)
        places = self.made.rows_of_keys(np.concatenate([executing, waiting]))
        hidden, understated = self.made._flags()
        table = rows_at(self.made.runs, places)
        table = table.assign(hidden=[bool(hidden[r][i]) for r, i in places],
                             understated=[bool(understated[r][i]) for r, i in places])
        return table, len(executing), set(verdict._ids(waiting))

    def fingerprint_count(self, fingerprint) -> int:
        return sum(int((run.table["fingerprint"].astype(object) == fingerprint).sum()) for run in self.made.runs)

    def longest_meanwhile(self, mask_of) -> dict | None:
        pieces = [verdict.meanwhile_pieces(run.table, mask_of(run.table, sane), run.key)
                  for run, sane in zip(self.made.runs, self.made.sane)]
        best = verdict.longest_of(pieces)
        if best is None:
            return None
        place = self.made.rows_of_keys(np.array([best], dtype=np.int64))[0]
        return _refs(self.made.runs, [place])[place]


class _NetworkGroups:
    """netstory's per-host and per-connection sums of the runs (pandas' groupby sums: GroupbySums, fed in row
    order), with each group's count, first host and first connection id (the least row key with one)."""

    def __init__(self, runs: list[SortedRun]):
        self.absent = not runs or "network_s" not in runs[0].table.columns
        self.rows = 0
        self._runs = [None] * len(runs)
        self.proxied = False
        if self.absent:
            return
        hosts: set = set()
        conns: set = set()
        for run in runs:  # the groups first (what they are, not their rows: one run's arrays at a time)
            # through a proxy the network is its two hops, a choice netstory makes of the whole table: not made here
            if "proxy_s" in run.table.columns and run.table["proxy_s"].notna().any():
                self.proxied = self.absent = True
                return
            _, host, capture, index = self._rows_of(run)
            hosts |= set(pd.unique(host).tolist())
            conns |= set(pd.MultiIndex.from_arrays([capture, index]).unique().tolist())
        self.hosts = [*sorted(h for h in hosts if h is not None), *([None] if None in hosts else [])]
        self.conns = sorted(conns)
        host_index = pd.Index(self.hosts, dtype=object)
        conn_index = pd.MultiIndex.from_tuples(self.conns) if self.conns else None
        host_counts = np.zeros(len(self.hosts), dtype=np.int64)
        conn_counts = np.zeros(len(self.conns), dtype=np.int64)
        self._first_host: dict = {}
        self._first_id: dict = {}
        spans = {"host": {}, "conn": {}}  # per group, its least and greatest row key: are the groups' blocks in order?
        for r in reversed(range(len(runs))):  # from the last: the partition the pass above read last is still held
            run = runs[r]
            both, host, capture, index = self._rows_of(run)
            t, key = run.table, run.key  # a stored run's keys read once here
            net, total, _ = netstory.row_times(t)
            rows = np.flatnonzero(both)
            h = host_index.get_indexer(host).astype(np.int64)
            c = (conn_index.get_indexer(pd.MultiIndex.from_arrays([capture, index])).astype(np.int64)
                 if len(capture) else np.zeros(0, dtype=np.int64))
            host_counts += np.bincount(h, minlength=len(self.hosts))
            conn_counts += np.bincount(c, minlength=len(self.conns))
            self._firsts(c, host, key, rows, self._first_host)
            self._firsts(c, np.asarray(t["conn_id"].array[both].astype(object)), key, rows, self._first_id)
            for name, groups in (("host", h), ("conn", c)):
                _group_spans(groups, key, rows, spans[name])
            del key
            self._runs[r] = (both, h.astype(np.int32), c.astype(np.int32), np.maximum(net[both], 0.0),
                             total[both])  # 4 B a code
            self.rows += len(h)
        host_order, conn_order = (_in_order(spans[name]) for name in ("host", "conn"))
        self.sums = {"host:network_s": GroupbySums(host_counts, host_order),
                     "host:total_s": GroupbySums(host_counts, host_order),
                     "conn:network_s": GroupbySums(conn_counts, conn_order),
                     "conn:total_s": GroupbySums(conn_counts, conn_order)}
        self.host_counts, self.conn_counts = host_counts, conn_counts
        self._at = [0] * len(self._runs)

    @staticmethod
    def _rows_of(run: SortedRun) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(the run's rows with both times known; their host, capture and conn_index)."""
        t = run.table
        _, _, both = netstory.row_times(t)
        host, names = host_codes(t["client"])
        return (both, np.array([*names, None], dtype=object)[host[both]], t["capture"].astype(object).to_numpy()[both],
                t["conn_index"].to_numpy(dtype=np.int64)[both])

    @staticmethod
    def _firsts(groups: np.ndarray, values: np.ndarray, keys: np.ndarray, rows: np.ndarray, first: dict) -> None:
        """Per group, its first known value in row order (the least row key), as groupby's first takes it;
        `groups` and `values` of the run's `rows` (their keys in `keys[rows]`)."""
        known = np.flatnonzero(~pd.isna(values))
        found, at = np.unique(groups[known], return_index=True)  # a run is in row order: its first row of each
        for g, i in zip(found.tolist(), known[at].tolist()):
            key = tuple(int(v) for v in keys[rows[i]])
            if g not in first or key < first[g][0]:
                first[g] = (key, values[i])

    def feed(self, run: np.ndarray, row: np.ndarray) -> None:
        if self.absent:
            return
        pieces = [(at, int(run[at[0]]), int(row[at[0]]), int(row[at[-1]]) + 1)
                  for at in (np.flatnonzero(run == r) for r in np.unique(run))]
        taken = np.zeros(len(run), dtype=bool)
        h = np.zeros(len(run), dtype=np.int64)
        c = np.zeros(len(run), dtype=np.int64)
        net = np.zeros(len(run), dtype=np.float64)
        total = np.zeros(len(run), dtype=np.float64)
        for at, r, lo, hi in pieces:
            both, hr, cr, nr, tr = self._runs[r]
            mine = both[lo:hi]
            n = int(mine.sum())
            start = self._at[r]
            place = at[mine]
            taken[place] = True
            h[place], c[place] = hr[start:start + n], cr[start:start + n]
            net[place], total[place] = nr[start:start + n], tr[start:start + n]
            self._at[r] = start + n
        h, c, net, total = h[taken], c[taken], net[taken], total[taken]
        self.sums["host:network_s"].add(h, net)
        self.sums["host:total_s"].add(h, total)
        self.sums["conn:network_s"].add(c, net)
        self.sums["conn:total_s"].add(c, total)

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """netstory's by_host and by_conn (aggregated's frames, in the groupby's order)."""
        by_host = pd.DataFrame({"exchanges": self.host_counts, "network_s": self.sums["host:network_s"].result(),
                                "total_s": self.sums["host:total_s"].result()},
                               index=pd.Index([np.nan if h is None else h for h in self.hosts], dtype=object))
        first_host = [self._first_host.get(g, (None, np.nan))[1] for g in range(len(self.conns))]
        first_id = [self._first_id.get(g, (None, None))[1] for g in range(len(self.conns))]
        by_conn = pd.DataFrame({"host": [np.nan if h is None else h for h in first_host],
                                "conn_id": pd.array(first_id, dtype="Int64"), "exchanges": self.conn_counts,
                                "network_s": self.sums["conn:network_s"].result(),
                                "total_s": self.sums["conn:total_s"].result()},
                               index=pd.MultiIndex.from_tuples(self.conns))
        return by_host, by_conn


def _group_spans(groups: np.ndarray, keys: np.ndarray, rows: np.ndarray, spans: dict) -> None:
    """Per group of a run's `rows` (in row order), its least and greatest row key, merged into `spans`."""
    found, first = np.unique(groups, return_index=True)
    _, last = np.unique(groups[::-1], return_index=True)
    last = len(groups) - 1 - last
    for g, i, j in zip(found.tolist(), first.tolist(), last.tolist()):
        lo, hi = tuple(keys[rows[i]].tolist()), tuple(keys[rows[j]].tolist())
        have = spans.get(g)
        spans[g] = (lo, hi) if have is None else (min(have[0], lo), max(have[1], hi))


def _in_order(spans: dict) -> bool:
    """The groups' codes never decrease in row order: each group's rows lie before the next group's."""
    ordered = [spans[g] for g in sorted(spans)]
    return all(a[1] < b[0] for a, b in zip(ordered, ordered[1:]))
