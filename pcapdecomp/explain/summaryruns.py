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

import numpy as np
import pandas as pd

from ..core.exact import GroupbySums, PairwiseSum, median_of_runs, nearest_rank_of_runs, sorted_run
from ..core.groups import codes, equals
from ..core.outputs import SortedRun, merged_order
from ..core.times import ts_ns
from ..read.connids import SOURCES
from .summary import NotFromRuns, _counts
from .waitprofile import host_codes
from .threadpool import MAX_CULPRITS, Refs, json_value, outlier_limits
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
                 cap_members: tuple[np.ndarray, np.ndarray] | None = None):
        self.runs = runs
        self.stall_culprits = stall_culprits or []
        self.stall_victims = stall_victims or []  # per stall, its members' row keys (view.stall_members[sid][0])
        self.cap_keys = cap_members  # (executing, waiting) row keys while at the cap (view.cap_members)
        points = {str(p) for r in runs if "db_point" in r.table for p in r.table["db_point"].dropna().unique()}
        if len(points) > 1:
            raise SeveralServers(f"rows of {len(points)} DB points: the verdict is told per point")
        outliers = np.zeros((0, 0), np.int64) if outlier_keys is None else np.asarray(outlier_keys, np.int64)
        self.counts = _summed_counts([r.table for r in runs])
        self.conn_ids = _conn_id_sources(runs)
        self.sane = _sane_rows(runs, outliers)
        # the sums' channels: column → the rows whose values the sum takes: its non-null values (None), else the
        # queueing's rows (sane and seen at both points: "both"), of one queue_source (its index in QUEUE_SOURCES)
        self._columns = {col: [_floats(r.table, col) for r in runs] for col in (*LATENCY_COLUMNS, "queue_min_s")}
        self._both = [s & equals(r.table["seen"], "both") for r, s in zip(runs, self.sane)]
        self._source = [_source_codes(r.table) for r in runs]  # int8 a row: 1 B, not a mask per source
        self._channels: dict[str, tuple[str, object]] = {col: (col, None) for col in LATENCY_COLUMNS}
        for i, source in enumerate(QUEUE_SOURCES):
            self._channels[f"queue:{source}"] = ("queue_s", i)
        self._channels["queue:certain"] = ("queue_min_s", "both")
        self._sums = {}
        for name, (col, rows) in self._channels.items():
            if rows is None:
                n = sum(int((~np.isnan(v)).sum()) for v in self._columns[col])
            elif rows == "both":
                n = sum(int(b.sum()) for b in self._both)
            else:
                n = sum(int((b & (c == rows)).sum()) for b, c in zip(self._both, self._source))
            self._sums[name] = PairwiseSum(n)
        self.candidates = {flag: _victim_candidates(runs, flag, self.sane) for flag in VICTIM_LISTS}
        # the story's sums (verdict.story_terms), each term's rows and values per run, fed in row order
        self.terms = _RowOrderTerms(self._terms, [len(r.table) for r in runs])
        self.network_groups = _NetworkGroups(runs)
        self._parts = None

    def feed(self, run: np.ndarray, row: np.ndarray) -> None:
        """The next piece of the merged order (merged_order's: run, row in that run), every row once, in row
        order."""
        # a run's rows in a piece are consecutive, in its order: a slice
        slices = [(at, slice(int(row[at[0]]), int(row[at[-1]]) + 1))
                  for at in (np.flatnonzero(run == r) for r in np.unique(run))]

        def gathered(per_run: list[np.ndarray], dtype) -> np.ndarray:
            out = np.empty(len(run), dtype=dtype)
            for at, rows in slices:
                out[at] = per_run[run[at[0]]][rows]
            return out

        values = {col: gathered(per_run, np.float64) for col, per_run in self._columns.items()}
        both, source = gathered(self._both, bool), gathered(self._source, np.int8)
        for name, (col, rows) in self._channels.items():
            v = values[col]
            if rows is None:
                self._sums[name].add(v[~np.isnan(v)])
                continue
            taken = both if rows == "both" else both & (source == rows)
            self._sums[name].add(np.nan_to_num(v[taken], nan=0.0, posinf=np.inf, neginf=-np.inf))  # verdict._sum

        self.terms.feed(run, row)
        self.network_groups.feed(run, row)

    def feed_all(self) -> SummaryOfRuns:
        """The rows in row order by the k-way merge alone (no file written beside it)."""
        for run, row in merged_order([r.key for r in self.runs]):
            self.feed(run, row)
        return self

    def parts(self) -> dict:
        """summary.json's exchanges, conn_ids, latency_s, queueing, hidden_slow and understated (made once)."""
        if self._parts is None:
            self._parts = self._made_parts()
        return self._parts

    def _made_parts(self) -> dict:
        queueing = {f"{s}_s": self._sums[f"queue:{s}"].result() for s in QUEUE_SOURCES}
        return {
            "exchanges": self.counts,
            "conn_ids": self.conn_ids,
            "latency_s": self._latency(),
            "queueing": {**queueing, "certain_s": self._sums["queue:certain"].result()},
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

    def _terms(self, r: int, lo: int, hi: int):
        """The sums' terms of run r's rows lo:hi: the verdict's (story_terms), the connections' and the network's,
        each rule on those rows alone (every term is per row)."""
        t = self.runs[r].table.iloc[lo:hi]
        return [*verdict.story_terms(t, self.sane[r][lo:hi]), *connstory.terms(t),
                *((f"network:{n}", rows, v) for n, rows, v in netstory.terms(t))]

    def connections(self, conns: pd.DataFrame | None) -> dict | None:
        """connstory.tell of the runs: summary.json → connections."""
        if conns is None or not len(conns):
            return None
        captures = set().union(*(connstory.captures_of(r.table) for r in self.runs))
        closes = connstory.server_closes(conns, captures)
        facts = connstory.combine_facts([connstory.row_facts(r.table, closes) for r in self.runs])
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
            captures = set().union(*(set(codes(r.table["capture"])[1].tolist()) for r in self.runs))
            rb, keys = netstory.retransmitting(conns, captures)
            count, pieces = 0, []
            width = self.runs[0].key.shape[1]
            kind = np.dtype([("slow", np.float64), ("key", np.int64, (width,)), ("run", np.int64), ("row", np.int64)])
            for r, run in enumerate(self.runs):
                net, _, both = netstory.row_times(run.table)
                rows = np.flatnonzero(netstory.rto_rows(run.table, keys, both, net))
                count += len(rows)
                piece = np.empty(len(rows), dtype=kind)
                piece["slow"], piece["key"], piece["run"], piece["row"] = -net[rows], run.key[rows], r, rows
                pieces.append(_top(piece, netstory.LISTED))
            listed = _top(np.concatenate(pieces), netstory.LISTED)
            named = [self.runs[r].table.iloc[[i]] for r, i in zip(listed["run"].tolist(), listed["row"].tolist())]
            named = (pd.concat(named, ignore_index=True).assign(_net=-listed["slow"]) if named
                     else self.runs[0].table.iloc[[]].assign(_net=np.zeros(0)))
            retrans = netstory.told_retransmissions(rb, count, named)
        return netstory.told(sums["network:network_s"][1], sums["network:clients_s"][1], by_host, by_conn, retrans)

    def usual_execution(self, stalls: list[dict]) -> float | None:
        """playbook._usual_execution of the runs: the median by counting over each run's sorted values."""
        if not self.runs or not playbook.has_usual_columns(self.runs[0].table):
            return None
        ids = [s.get("id") for s in stalls]
        classes = set().union(*(playbook.usual_classes(r.table, ids) for r in self.runs))
        if not classes:
            return None
        values = [np.sort(playbook.usual_values(r.table, ids, classes)) for r in self.runs]
        return median_of_runs(values) if any(len(v) for v in values) else None

    def _flags(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per run, its hidden and its understated rows (sane ones: verdict.tell's masks)."""
        return tuple([run.table[flag].to_numpy(dtype=bool, na_value=False) & sane
                      for run, sane in zip(self.runs, self.sane)] for flag in VICTIM_LISTS)

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

    def _latency(self) -> dict:
        """summary.latency_quantiles' values: count, the pairwise sum in row order, nearest-rank p50/p99, max."""
        out = {}
        for col in LATENCY_COLUMNS:
            runs = [sorted_run(v) for v in self._columns[col]]  # one column's sorted copy at a time
            n = sum(len(r) for r in runs)
            if not n:
                out[col.removesuffix("_s")] = None
                continue
            p50, p99 = nearest_rank_of_runs(runs, [0.5, 0.99])
            out[col.removesuffix("_s")] = {"count": n, "sum": self._sums[col].result(), "p50": float(p50),
                                           "p99": float(p99), "max": float(max(r[-1] for r in runs if len(r)))}
        return out

    def _victims(self, flag: str) -> dict:
        """verdict._victims of the rows flagged (and sane): the slowest VICTIMS_LISTED by server_s (NaN as −1),
        ties by row key, grouped by the stall they were victims of, with the stalls' culprits."""
        count, chosen = self.candidates[flag]
        listed = _top(chosen, VICTIMS_LISTED)
        rows = [(int(r), int(i)) for r, i in zip(listed["run"], listed["row"])]
        groups: dict = {}
        for r, i in rows:
            t = self.runs[r].table
            stall, role = t["stall"].iloc[i], t["stall_role"].iloc[i]
            sid = int(stall) if not pd.isna(role) and role == "victim" and not pd.isna(stall) else None
            groups.setdefault(sid, []).append((r, i))
        culprits_of = {sid: [self._row_of_key(k) for k in self.stall_culprits[sid][:MAX_CULPRITS]]
                       for sid in groups if sid is not None and sid < len(self.stall_culprits)}
        refs = _refs(self.runs, [*rows, *(c for cs in culprits_of.values() for c in cs)])
        by_stall = []
        for sid in sorted(groups, key=lambda s: (s is None, s if s is not None else 0)):
            culprits = []
            group = None
            if sid in culprits_of:
                culprits = [refs[c] for c in culprits_of[sid]]
                r, i = groups[sid][0]
                group = json_value(self.runs[r].table["thread_group"].iloc[i])
            by_stall.append({"stall": sid, "thread_group": group, "culprits": culprits,
                             "victims": [refs[c] for c in groups[sid]]})
        return {"count": count, "listed": len(rows), "more": count - len(rows), "by_stall": by_stall}

    def _row_of_key(self, key: np.ndarray) -> tuple[int, int]:
        """(run, row) of the row with this key (each run is sorted by its keys: a binary search per run)."""
        for r, run in enumerate(self.runs):
            at = _row_with_key(run.key, key)
            if at is not None:
                return r, at
        raise KeyError(f"no row has the key {key.tolist()}")


def summary_of_runs(runs: list[SortedRun], outlier_keys: np.ndarray | None = None,
                    stall_culprits: list[np.ndarray] | None = None) -> dict:
    """SummaryOfRuns' parts, the rows streamed by the merge alone."""
    return SummaryOfRuns(runs, outlier_keys, stall_culprits).feed_all().parts()


def _floats(table: pd.DataFrame, col: str) -> np.ndarray:
    """A float column's values, null as NaN: a float64 column's own array (read only), else a copy."""
    column = table[col]
    if column.dtype == np.float64:
        return column.to_numpy()
    return column.to_numpy(dtype="float64", na_value=np.nan)


def _summed_counts(tables: list[pd.DataFrame]) -> dict:
    """summary._counts of the whole table: every count adds up over the partitions."""
    total: dict = {}
    for t in tables:
        for name, n in _counts(t).items():
            total[name] = total.get(name, 0) + n
    return total


def _conn_id_sources(runs: list[SortedRun]) -> dict[str, int]:
    """connids.conn_id_sources of the whole table: each connection (capture, conn_index) counted by its first row
    in row order (the least row key over the runs): its conn_id_source, "unknown" without an id."""
    out = dict.fromkeys([*SOURCES, "unknown"], 0)
    if not any(len(r.table) for r in runs) or "conn_id_source" not in runs[0].table:
        return out
    first: dict[tuple, tuple] = {}  # connection → (its least row key, its source)
    for run in runs:
        t = run.table
        if not len(t):
            continue
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


def _sane_rows(runs: list[SortedRun], outliers: np.ndarray) -> list[np.ndarray]:
    """verdict._sane per run: not one of the view's outliers, and the app times inside the robust span of every
    partition's app times (outlier_limits of their union: order statistics, any order)."""
    times = [_app_times(r.table)[1:] for r in runs]  # the union of the app times: an order statistic's input
    a1 = np.concatenate([t[0] for t in times]) if times else np.zeros(0, np.int64)
    a4 = np.concatenate([t[1] for t in times]) if times else np.zeros(0, np.int64)
    del times
    keep = a4 >= a1
    limits = outlier_limits(a1, a4, keep) if keep.any() else None
    del a1, a4, keep
    sane = []
    for run in runs:
        both, r1, r4 = _app_times(run.table)  # again, a partition at a time: not held for every partition
        s = np.ones(len(run.table), dtype=bool)
        for key in outliers:  # few: each found by a binary search in the sorted run
            at = _row_with_key(run.key, key)
            if at is not None:
                s[at] = False
        inside = (r4 >= r1) if limits is None else (r4 >= r1) & (r1 >= limits[0]) & (r4 <= limits[1])
        if limits is None:
            inside[:] = False
        s[both[~inside]] = False
        sane.append(s)
    return sane


def _victim_candidates(runs: list[SortedRun], flag: str, sane: list[np.ndarray]) -> tuple[int, np.ndarray]:
    """(how many rows are flagged and sane, each partition's slowest VICTIMS_LISTED of them): a structured array of
    (−server_s with NaN as −1, row key, run, row), which holds the whole list's members."""
    count = 0
    pieces = []
    width = runs[0].key.shape[1] if runs else 0
    kind = np.dtype([("slow", np.float64), ("key", np.int64, (width,)), ("run", np.int64), ("row", np.int64)])
    for r, (run, s) in enumerate(zip(runs, sane)):
        rows = np.flatnonzero(run.table[flag].to_numpy(dtype=bool, na_value=False) & s)
        count += len(rows)
        server = run.table["server_s"].to_numpy(dtype="float64", na_value=np.nan)[rows]
        piece = np.empty(len(rows), dtype=kind)
        piece["slow"] = -np.nan_to_num(server, nan=-1.0)
        piece["key"] = run.key[rows]
        piece["run"], piece["row"] = r, rows
        pieces.append(_top(piece, VICTIMS_LISTED))
    return count, np.concatenate(pieces) if pieces else np.empty(0, dtype=kind)


def _top(candidates: np.ndarray, k: int) -> np.ndarray:
    """The first k of the candidates by (slow, key): verdict._victims' stable sort by −server_s over the rows in
    row order."""
    if not len(candidates):
        return candidates
    order = np.lexsort((*candidates["key"].T[::-1], candidates["slow"]))
    return candidates[order[:k]]


def _row_with_key(keys: np.ndarray, key) -> int | None:
    """The row of `keys` (a run's, sorted column by column, distinct) equal to `key`, None if none is: a binary
    search."""
    key = tuple(int(v) for v in key)
    lo, hi = 0, len(keys)
    while lo < hi:
        mid = (lo + hi) // 2
        if tuple(keys[mid].tolist()) < key:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < len(keys) and tuple(keys[lo].tolist()) == key else None


def _refs(runs: list[SortedRun], rows: list[tuple[int, int]]) -> dict[tuple[int, int], dict]:
    """summary.json's references (threadpool.Refs) to the rows (run, row), read from those rows alone."""
    rows = sorted(set(rows))
    if not rows:
        return {}
    pieces = [runs[r].table.take([i for q, i in rows if q == r]) for r in sorted({r for r, _ in rows})]
    refs = Refs(pd.concat(pieces, ignore_index=True) if len(pieces) > 1 else pieces[0].reset_index(drop=True))
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
        return self.made.runs[0].key.shape[1] if self.made.runs else 0

    def told_masks(self, stalls: list[dict]) -> list[np.ndarray]:
        """Per run, its rows among the members of the stalls that name a culprit."""
        keys = [k for s, k in zip(stalls, self.stall_members()) if s["culprits_total"]]
        keys = np.concatenate(keys) if keys else np.zeros((0, self._width()), dtype=np.int64)
        return [_positions_of_keys(keys, run.key) >= 0 for run in self.made.runs]

    def cap_members(self) -> tuple[pd.DataFrame, int, set]:
        executing, waiting = (np.asarray(k, dtype=np.int64).reshape(-1, self._width()) for k in self.made.cap_keys)
        places = self.made.rows_of_keys(np.concatenate([executing, waiting]))
        hidden, understated = self.made._flags()
        table = pd.concat([self.made.runs[r].table.iloc[[i]] for r, i in places], ignore_index=True)
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
        self._runs = []
        # through a proxy the network is its two hops, a choice netstory makes of the whole table: not made here
        self.proxied = not self.absent and any("proxy_s" in r.table.columns and r.table["proxy_s"].notna().any()
                                               for r in runs)
        if self.absent or self.proxied:
            self.absent = True
            return
        hosts: set = set()
        conns: set = set()
        for run in runs:  # the groups first (what they are, not their rows: one run's arrays at a time)
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
        for run in runs:
            both, host, capture, index = self._rows_of(run)
            t = run.table
            net, total, _ = netstory.row_times(t)
            rows = np.flatnonzero(both)
            h = host_index.get_indexer(host).astype(np.int64)
            c = (conn_index.get_indexer(pd.MultiIndex.from_arrays([capture, index])).astype(np.int64)
                 if len(capture) else np.zeros(0, dtype=np.int64))
            host_counts += np.bincount(h, minlength=len(self.hosts))
            conn_counts += np.bincount(c, minlength=len(self.conns))
            self._firsts(c, host, run.key, rows, self._first_host)
            self._firsts(c, np.asarray(t["conn_id"].array[both].astype(object)), run.key, rows, self._first_id)
            for name, groups in (("host", h), ("conn", c)):
                _group_spans(groups, run.key, rows, spans[name])
            self._runs.append((both, h.astype(np.int32), c.astype(np.int32), np.maximum(net[both], 0.0),
                               total[both]))  # 4 B a code
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
