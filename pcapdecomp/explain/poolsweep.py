"""The thread-pool view's tables and stalls from partitions' sorted runs, in one streaming sweep (partitioned.md §2.1,
step 9): the timeline is never held whole.

explain/threadpool.py makes pool.parquet, groups.parquet and the stalls from `_Rows`, every exchange's timeline in
memory. Here each partition hands its rows of that timeline as a `TimelineRun` sorted by D1 (the arrival: every
other time of a row, its execution start, its queue end, its end, is at or after it); the runs are merged k-way
(core.outputs.merged_order, SWEEP_ROWS rows read at a time over all the runs) and swept in time. When the merge has given every
row whose D1 is below `cut`, no later row has a time below it: every event before `cut` is final. What is held:
the runs' read windows and the intervals still open at `cut` (started and not ended, or ended and not yet passed),
the long executions that may still overlap an open stall, and per bucket a few counters.

The results are the in-memory functions' own, to the bit (tests/test_poolsweep.py):
- areas (`_area`: in int64, or in float64 summed in time order when int64 could overflow: both kept, the same
  choice made at the end) and counts per bucket add over the stream;
- the step functions (executing, queued, certainly queued) are made piece by piece: the count after each distinct
  time, every event of a time in the same piece (the events at `cut` wait for the next), the running count
  carried; per bucket the count at its start and the extremes of its steps (`_step_extremes`);
- the stalls (`find_stalls`): per (server, thread group) the union of the certain waits taken in (D1, row) order,
  a stretch closed once `cut` passes the latest wait end of its key, its culprits among the held long executions.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from ..core.outputs import merged_order
from .decompose import NS
from .threadpool import CULPRIT_MIN_SHARE, _Rows, group_frame, groups_of_frames, pool_frame

SWEEP_ROWS = 8192  # rows the merge reads at a time over all the runs (a run's share of it, not below MIN_RUN_STEP)
MIN_RUN_STEP = 256
AREA_KINDS = ("d1", "d4", "q_end", "xs", "d4x")  # the ends the bucket views read (threadpool._interval_ends' names)


@dataclass
class TimelineRun:
    """A partition's rows of the thread-pool timeline (threadpool._Rows' arrays and each row's thread group), sorted
    by D1. `pos` names each row for the stalls' members (a row position in the whole timeline, or a row key)."""

    pos: np.ndarray
    d1: np.ndarray
    d4: np.ndarray
    xs: np.ndarray
    exec_known: np.ndarray
    q_end: np.ndarray
    q_min: np.ndarray
    likely: np.ndarray
    culprit_ok: np.ndarray
    group: np.ndarray  # the row's thread group, −1 where unknown (or no size)
    srv: np.ndarray  # the server's number


RUN_FIELDS = tuple(f.name for f in fields(TimelineRun))


def timeline_run(r: _Rows, group: np.ndarray, rows: np.ndarray) -> TimelineRun:
    """The run of the timeline's rows `rows` (positions in `r`), sorted by D1: a partition's piece as step 7 will
    hand it, made here from today's timeline (the tests, the benchmark)."""
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[np.argsort(r.d1[rows], kind="stable")]
    srv = r.srv if r.srv is not None else np.zeros(len(r.pos), np.int64)
    return TimelineRun(pos=rows, d1=r.d1[rows], d4=r.d4[rows], xs=r.xs[rows], exec_known=r.exec_known[rows],
                       q_end=r.q_end[rows], q_min=r.q_min[rows], likely=r.likely[rows], culprit_ok=r.culprit_ok[rows],
                       group=np.asarray(group, dtype=np.int64)[rows], srv=np.asarray(srv, dtype=np.int64)[rows])


def merged_windows(runs: list[TimelineRun], step: int | None = None):
    """The runs' rows merged by D1, as (TimelineRun of the window's rows in D1 order, cut): `cut` is the least D1
    of the rows not yet given (None after the last window)."""
    keys = [run.d1.reshape(-1, 1) for run in runs]
    cursors = [0] * len(runs)
    for run_of_row, row in merged_order(keys, step):
        columns = {}
        takes = [(r, np.flatnonzero(run_of_row == r)) for r in range(len(runs))]
        takes = [(r, at) for r, at in takes if len(at)]
        for name in RUN_FIELDS:
            out = np.empty(len(row), dtype=getattr(runs[takes[0][0]], name).dtype)
            for r, at in takes:
                out[at] = getattr(runs[r], name)[row[at]]
            columns[name] = out
        for r, at in takes:
            cursors[r] += len(at)
        left = [int(run.d1[c]) for run, c in zip(runs, cursors) if c < len(run.d1)]
        yield TimelineRun(**columns), (min(left) if left else None)


class _Pending:
    """Times with a tag each, fed in any order and handed back in ascending order once below the cut (no later
    feed can come below it): the ends of the intervals open at the cut are what it holds."""

    def __init__(self):
        self.times = np.zeros(0, np.int64)
        self.tags = np.zeros(0, np.int64)

    def take(self, times: np.ndarray, tags: np.ndarray, cut: int | None) -> tuple[np.ndarray, np.ndarray]:
        times = np.concatenate([self.times, times])
        tags = np.concatenate([self.tags, tags])
        ready = np.ones(len(times), bool) if cut is None else times < cut
        self.times, self.tags = times[~ready], tags[~ready]
        times, tags = times[ready], tags[ready]
        order = np.argsort(times, kind="stable")
        return times[order], tags[order]


class _AreaStream:
    """threadpool._area and _histogram of points fed in ascending order, a piece at a time: per edge the points
    below it and their sum from the first edge, in int64 (wrapping, as the sum of the same integers) and in float64
    summed one after the other as _area's np.cumsum does; the same choice between the two as _area at the end."""

    def __init__(self, edges: np.ndarray):
        self.edges = edges
        self.origin = int(edges[0])
        self.rel_edges = edges.astype(np.int64, copy=False) - self.origin
        self.below = np.zeros(len(edges), np.intp)
        self.last_right = 0  # points at or below the last edge (the last bucket is closed, as np.histogram's)
        self.int_sums = np.zeros(len(edges), np.int64)
        self.float_sums = np.zeros(len(edges), np.float64)
        self.running = 0.0  # the float64 running sum of every point so far
        self.n = 0
        self.first = self.last = None

    def add(self, points: np.ndarray) -> None:
        if not len(points):
            return
        k = np.searchsorted(points, self.edges, side="left")
        rel = points - self.origin
        some = k > 0
        self.int_sums[some] += np.cumsum(rel)[k[some] - 1]
        running = np.cumsum(np.concatenate([[self.running], rel.astype(np.float64)]))
        self.float_sums[some] = running[k[some]]  # every earlier point is below an edge that has one of these
        self.running = float(running[-1])
        self.below += k
        self.last_right += int(np.searchsorted(points, self.edges[-1], side="right"))
        self.n += len(points)
        if self.first is None:
            self.first = points[0]
        self.last = points[-1]

    def area(self) -> np.ndarray:
        reach = max(abs(int(self.first - self.origin)), abs(int(self.last - self.origin))) if self.n else 0
        reach = max(reach, abs(int(self.rel_edges[-1])))
        if (self.n + 1) * (reach + 1) < 1 << 62:
            return self.below * self.rel_edges - self.int_sums
        return self.below * self.rel_edges.astype(np.float64) - self.float_sums

    def counts(self) -> np.ndarray:
        k = self.below.copy()
        k[-1] = self.last_right
        return np.diff(k).astype(np.int64)


class _Ends:
    """The ends of one set of rows (the pool, or a thread group) as _Intervals gives them to pool_frame and
    group_frame: an _AreaStream per kind."""

    def __init__(self, edges: np.ndarray):
        self.streams = {kind: _AreaStream(edges) for kind in AREA_KINDS}

    def counts(self, name: str) -> np.ndarray:
        return self.streams[name].counts()

    def area(self, name: str) -> np.ndarray:
        return self.streams[name].area()

    def occupancy(self, starts: str, ends: str) -> np.ndarray:
        return np.diff(self.area(starts) - self.area(ends)).astype(np.float64, copy=False)


class _StepStream:
    """threadpool._count_steps of intervals fed as they arrive, reduced at once to _step_extremes per bucket: the
    count after each distinct time before the cut, the running count carried to the next piece."""

    def __init__(self, edges: np.ndarray):
        self.edges = edges
        self.starts, self.ends = _Pending(), _Pending()
        self.count = 0
        nb = len(edges) - 1
        self.at_start = np.zeros(nb, np.int64)  # the count at each bucket's start (the last step at or before it)
        self.low = np.full(nb, np.iinfo(np.int64).max)  # the extremes of the steps inside each bucket
        self.high = np.full(nb, np.iinfo(np.int64).min)

    def add(self, starts: np.ndarray, ends: np.ndarray, cut: int | None) -> None:
        live = ends > starts  # _count_steps leaves empty intervals out
        s, _ = self.starts.take(starts[live], np.zeros(int(live.sum()), np.int64), cut)
        e, _ = self.ends.take(ends[live], np.zeros(int(live.sum()), np.int64), cut)
        if not len(s) + len(e):
            return
        times = np.concatenate([s, e])
        order = np.argsort(times, kind="stable")
        times = times[order]
        running = self.count + np.cumsum(np.concatenate([np.ones(len(s), np.int64), -np.ones(len(e), np.int64)])[order])
        last = np.ones(len(times), bool)
        np.not_equal(times[1:], times[:-1], out=last[:-1])
        times, counts = times[last], running[last]
        self.count = int(running[-1])
        at = np.searchsorted(times, self.edges[:-1], side="right") - 1
        seen = np.flatnonzero(at >= 0)
        self.at_start[seen] = counts[at[seen]]
        first = np.searchsorted(times, self.edges, side="left")
        stepped = np.flatnonzero(first[1:] > first[:-1])
        if len(stepped):
            inside = counts[:first[-1]]
            self.low[stepped] = np.minimum(self.low[stepped], np.minimum.reduceat(inside, first[stepped]))
            self.high[stepped] = np.maximum(self.high[stepped], np.maximum.reduceat(inside, first[stepped]))

    def extremes(self) -> tuple[np.ndarray, np.ndarray]:
        return np.minimum(self.at_start, self.low), np.maximum(self.at_start, self.high)


class _Stalls:
    """threadpool.find_stalls over the stream: per (server, group) key the stretch open (its waits so far) and the
    latest wait end of the key; the long executions held while they may overlap an open or a later stretch."""

    def __init__(self, threshold_ns: int):
        self.threshold_ns = threshold_ns
        self.waits = _Pending()  # the certain waits not yet below the cut (their D1, a number into `held`)
        self.held: dict[int, tuple] = {}  # wait number → (key, group, pos, end)
        self.serial = 0
        self.open: dict[tuple[int, int], dict] = {}
        self.latest: dict[tuple[int, int], int] = {}  # per key the latest wait end so far (find_stalls' cummax)
        self.busy = {name: np.zeros(0, np.int64) for name in ("srv", "group", "pos", "xs", "d4")}
        self.stalls: list[dict] = []

    def add(self, w: TimelineRun, cut: int | None) -> None:
        told = np.where(w.likely, w.q_end - w.d1, w.q_min)
        victim = np.flatnonzero((told >= self.threshold_ns) & (w.group >= 0))
        numbers = np.arange(self.serial, self.serial + len(victim), dtype=np.int64)
        self.serial += len(victim)
        for i, v in zip(numbers.tolist(), victim.tolist()):
            self.held[i] = ((int(w.srv[v]), int(w.group[v])), int(w.group[v]), int(w.pos[v]), int(w.q_end[v]))
        busy = np.flatnonzero(w.culprit_ok & (w.group >= 0))
        for name in self.busy:
            self.busy[name] = np.concatenate([self.busy[name], getattr(w, name)[busy]])
        starts, numbers = self.waits.take(w.d1[victim], numbers, cut)
        ready = sorted(zip(starts.tolist(), (self.held[i][2] for i in numbers.tolist()), numbers.tolist()))
        for s, pos, i in ready:  # find_stalls' order: by start, then by row
            key, group, _, e = self.held.pop(i)
            stretch = self.open.get(key)
            if stretch is None or s > self.latest[key]:
                if stretch is not None:
                    self._close(key)
                stretch = self.open[key] = {"key": key, "thread_group": group, "s": s, "e": e, "victims": []}
            stretch["victims"].append(pos)
            stretch["s"], stretch["e"] = min(stretch["s"], s), max(stretch["e"], e)
            self.latest[key] = max(self.latest.get(key, e), e)
        for key in [k for k in self.open if cut is None or self.latest[k] < cut]:
            self._close(key)  # every later wait starts at or after the cut, beyond the key's latest end: a new stretch
        if cut is not None:  # an execution that ended before every open stretch and the cut overlaps none of them
            keep = self.busy["d4"] >= min([cut, *(st["s"] for st in self.open.values())])
            self.busy = {name: values[keep] for name, values in self.busy.items()}

    def _close(self, key: tuple[int, int]) -> None:
        st = self.open.pop(key)
        s, e = st["s"], st["e"]
        mine = np.flatnonzero((self.busy["srv"] == key[0]) & (self.busy["group"] == key[1]))
        mine = mine[np.argsort(self.busy["pos"][mine], kind="stable")]  # find_stalls reads them in row order
        overlap = np.minimum(e, self.busy["d4"][mine]) - np.maximum(s, self.busy["xs"][mine])
        hold = overlap >= CULPRIT_MIN_SHARE * (e - s)
        order = np.argsort(-overlap[hold], kind="stable")
        self.stalls.append({"thread_group": st["thread_group"], "s": s, "e": e,
                            "_victims": np.array(st["victims"], dtype=np.int64),
                            "_culprits": self.busy["pos"][mine][hold][order], "_overlap": overlap[hold][order],
                            "_key": key})

    def result(self) -> list[dict]:
        stalls = sorted(self.stalls, key=lambda st: (st["s"], st["thread_group"], st["_key"]))
        for st in stalls:
            del st["_key"]
        return stalls


@dataclass
class SweptView:
    pool: pd.DataFrame  # pool_table's
    groups: pd.DataFrame  # group_table's
    stalls: list[dict]  # find_stalls' (the members named by the runs' `pos`)


def sweep_timeline(runs: list[TimelineRun], edges: np.ndarray, bucket_s: float, threshold_ns: int,
                   step: int | None = None) -> SweptView:
    """pool_table, group_table and find_stalls of the timeline the runs hold (each sorted by D1), from one pass over
    their k-way merge. The groups and stalls are of the rows with a group ≥ 0 (none: the empty table, no stall)."""
    pool = _Ends(edges)
    groups: dict[int, _Ends] = {}
    nb = len(edges) - 1
    max_queue: dict[int, np.ndarray] = {}
    pending = {kind: _Pending() for kind in AREA_KINDS}
    executing, queued, certain = _StepStream(edges), _StepStream(edges), _StepStream(edges)
    stalls = _Stalls(threshold_ns)
    step = step or max(MIN_RUN_STEP, SWEEP_ROWS // max(1, len(runs)))
    for w, cut in merged_windows(runs, step):
        known = w.exec_known
        for kind, points, tags in (("d1", w.d1, w.group), ("d4", w.d4, w.group), ("q_end", w.q_end, w.group),
                                   ("xs", w.xs[known], w.group[known]), ("d4x", w.d4[known], w.group[known])):
            times, tags = pending[kind].take(points, tags, cut)
            pool.streams[kind].add(times)
            _add_by_group(groups, kind, times, tags, edges)
        executing.add(w.xs[known], w.d4[known], cut)
        queued.add(w.d1, w.q_end, cut)
        victim = w.q_min >= threshold_ns
        certain.add(w.d1[victim], w.d1[victim] + w.q_min[victim], cut)
        _bucket_maxima(max_queue, w, edges, nb)
        stalls.add(w, cut)
    x_lo, x_hi = executing.extremes()
    _, q_hi = queued.extremes()
    _, c_hi = certain.extremes()
    frames = [group_frame(np.int64(gid), groups[gid], edges, bucket_s, _with_nan(*max_queue[gid]))
              for gid in sorted(groups)]
    return SweptView(pool=pool_frame(pool, edges, bucket_s, (x_lo, x_hi, q_hi, c_hi)),
                     groups=groups_of_frames(frames), stalls=stalls.result())


def _add_by_group(groups: dict[int, _Ends], kind: str, times: np.ndarray, tags: np.ndarray, edges: np.ndarray) -> None:
    """The points of each thread group (tag ≥ 0) to its own stream, in the same ascending order."""
    member = np.flatnonzero(tags >= 0)
    if not len(member):
        return
    member = member[np.argsort(tags[member], kind="stable")]
    gids, first = np.unique(tags[member], return_index=True)
    for gid, rows in zip(gids.tolist(), np.split(member, first[1:])):
        if gid not in groups:
            groups[gid] = _Ends(edges)
        groups[gid].streams[kind].add(times[rows])


def _bucket_maxima(max_queue: dict[int, tuple], w: TimelineRun, edges: np.ndarray, nb: int) -> None:
    """threadpool._bucket_max of each group's waits (q_end − D1, s) by its D1's bucket, kept per group as
    (maxima, rows per bucket)."""
    bucket = np.searchsorted(edges, w.d1, side="right") - 1
    wait = (w.q_end - w.d1) / NS
    inside = (w.group >= 0) & (bucket >= 0) & (bucket < nb)
    for gid in np.unique(w.group[w.group >= 0]).tolist():
        if gid not in max_queue:
            max_queue[gid] = (np.full(nb, -np.inf), np.zeros(nb, np.int64))
        highest, count = max_queue[gid]
        mine = inside & (w.group == gid)
        np.maximum.at(highest, bucket[mine], wait[mine])
        count += np.bincount(bucket[mine], minlength=nb)


def _with_nan(highest: np.ndarray, count: np.ndarray) -> np.ndarray:
    out = highest.copy()
    out[count == 0] = np.nan
    return out
