"""Thread-pool stage: what the pool did, from the decomposed exchanges alone.

- the whole pool over time (pool.parquet): statements in flight, executing and queued per bucket, with the extremes
  at any instant, so a pool at `thread_pool_max_threads` shows as a flat line at the cap;
- the thread limit itself, inferred: statements certainly waited while the most statements ever seen executing at
  once were executing, and nobody passed them;
- `thread_pool_size`, when not given, inferred: the N for which every statement that certainly queued had a long
  statement executing on its group `conn_id % N` meanwhile, while nobody else on that group passed freely;
- per thread group and bucket (groups.parquet), the stalled stretches and their culprits.

Claims of queueing rest on `queue_min_s` (measured, or bounded by the slow log / the wire flag), never on an
estimate alone; the extent of a wait uses `queue_s`, whose provenance is `queue_source`.

Cost follows the exchanges: buckets are at most MAX_BUCKETS over the robust span of the capture (a frame with a wild
timestamp is counted as an outlier, not stretched over), pair searches are capped and the caps reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core.formats import clip
from ..core.groups import equals, group_order
from ..core.memory import release_memory
from ..core.schema import GROUP_COLUMNS, POOL_COLUMNS
from ..core.times import ts_ns
from .decompose import LIKELY_COVER, NS, ROWS_AT_ONCE, STALL_MIN_QUEUE_S, covered_ns
from .decompose import interval_union as _union

CULPRIT_MIN_SHARE = 0.25  # a culprit executed during at least this share of the stalled stretch
MAX_CULPRITS = 5  # listed per stall in summary.json (all are marked in exchanges.stall_role; the rest counted)
MAX_BUCKETS = 1000
BUCKET_LADDER_S = (0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0, 86400.0)
OUTLIER_MIN_MARGIN_NS = 86400 * NS  # times further than this (or 10 core spans) outside the core are outliers
CLUSTER_GAP_NS = 30 * 86400 * NS  # no capture sits silent this long between two of its exchanges: times beyond
# such a gap belong to another clock (a run of broken timestamps the reader could not repair, a crafted frame)
MAX_THREAD_POOL_SIZE = 128  # largest thread_pool_size tried when inferring it (MariaDB's and Percona's maximum)
INFER_MAX_VICTIMS = 5000  # queued statements considered when inferring thread_pool_size (evenly sampled beyond)
INFER_MAX_CULPRITS = 5000  # long statements considered (the longest)
INFER_MAX_ARRIVALS = 200_000  # arrivals checked for free passes, in all (at most 2,000 per long statement)
EXPLAINED_SHARE = 0.9  # an N must explain this share of the queued statements …
FREE_PASS_SHARE = 0.1  # … with at most this many free passes per explained statement
RELEASE_MARGIN_NS = 20_000_000  # a group's waiting statements are let go within this long (the queue drains): an
# arrival that close to the last release did not pass anyone
CAP_SHARE = 0.9  # the pool is at its thread limit when the cap was reached during this share of the waiting time
MAX_REFS = 20  # exchange references listed per list in summary.json

GROUP_COLUMNS_NAMES = [c.name for c in GROUP_COLUMNS]
POOL_COLUMNS_NAMES = [c.name for c in POOL_COLUMNS]
REF_COLUMNS = ("capture", "conn_index", "seq", "conn_id", "thread_group", "query_id", "command", "sql", "app_req_ts",
               "db_req_ts", "total_s", "server_s", "exec_s", "exec_source", "queue_s", "queue_source", "queue_min_s",
               "in_slow_log")


@dataclass
class PoolView:
    """What analysis needs from this stage: the tables, the summary.json parts, the per-exchange annotations."""

    pool: pd.DataFrame  # POOL_COLUMNS
    groups: pd.DataFrame  # GROUP_COLUMNS
    thread_pool_size: dict  # summary.json → thread_pool_size
    pool_summary: dict  # summary.json → pool
    groups_summary: dict  # summary.json → groups
    thread_group: pd.Series | None  # Int64 per exchange row (None: not made, thread_pool_view's per_row)
    stall: pd.Series | None  # Int64 per exchange row
    stall_role: pd.Series | None  # category per exchange row
    stall_members: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # per stall (victims, culprits): row positions
    cap_members: tuple[np.ndarray, np.ndarray] | None = None  # (executing, waiting) row positions while at the cap
    outliers: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # rows with wild DB-side times
    warnings: list[str] = field(default_factory=list)
    queue_source: pd.Series | None = None  # per exchange row, when a likely wait was found not held on its group
    unheld: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # those rows ('estimated' now)


# --- buckets --------------------------------------------------------------------------------------------------


def auto_bucket_s(span_ns: int) -> float:
    """The smallest of 10 ms, 100 ms, 1 s, 10 s, 1 min, 10 min, 1 h, 1 day giving at most MAX_BUCKETS buckets;
    beyond that whole days, so the number of buckets never grows with the span."""
    for b in BUCKET_LADDER_S:
        if span_ns / (b * NS) <= MAX_BUCKETS:
            return b
    return 86400.0 * float(np.ceil(span_ns / (MAX_BUCKETS * 86400.0 * NS)))


def core_range(points: np.ndarray, mine: bool = False) -> tuple[int, int]:
    """The core of a capture's timestamps (int64 ns, not empty): the biggest run of times without a silence of
    CLUSTER_GAP_NS (however many broken ones lie elsewhere), less 1 % at each end. The robust span of the
    thread-pool views and the report's time axis are measured from it. `mine`: `points` is the caller's to
    reorder (it is partitioned in place, not copied)."""
    if len(points) >= 3 and int(points.max()) - int(points.min()) <= CLUSTER_GAP_NS:
        # one run (the usual case): the two times wanted are order statistics, found without sorting them all
        k = max(1, len(points) // 100)
        if mine:
            points.partition((k, len(points) - 1 - k))
            c = points
        else:
            c = np.partition(points, (k, len(points) - 1 - k))
        return int(c[k]), int(c[len(points) - 1 - k])
    p = np.sort(points)
    cuts = np.flatnonzero(np.diff(p) > CLUSTER_GAP_NS) + 1
    bounds = np.concatenate([[0], cuts, [len(p)]])
    biggest = int(np.argmax(np.diff(bounds)))
    c = p[bounds[biggest]:bounds[biggest + 1]]
    k = max(1, len(c) // 100) if len(c) >= 3 else 0  # with three or more, at least one dropped
    return int(c[k]), int(c[len(c) - 1 - k])


def robust_span(d1: np.ndarray, d4: np.ndarray) -> tuple[np.ndarray, int, int]:
    """(keep mask, start, end): the exchanges whose D1 … D4 lie within the capture's robust span.

    An exchange more than max(10 core spans, 1 day) outside the core (core_range), or one that ends before it
    starts, is an outlier (frames with wild timestamps must not stretch the buckets over decades)."""
    keep = d4 >= d1
    if not keep.any():
        return keep, 0, 0
    lowest, highest = outlier_limits(d1, d4, keep)
    keep &= (d1 >= lowest) & (d4 <= highest)
    if not keep.any():
        return keep, 0, 0
    return keep, int(d1[keep].min()), int(d4[keep].max())


def outlier_limits(d1: np.ndarray, d4: np.ndarray, keep: np.ndarray) -> tuple[int, int]:
    """(least D1, greatest D4) of an exchange robust_span keeps: the core range (core_range of the D1 and D4 of the
    rows in `keep`, those that end at or after they start: at least one) widened by the margin. Order statistics:
    the same from the rows in any order, so a partitioned run finds them from its partitions' times."""
    every = bool(keep.all())  # the usual case: the times as they are, not a copy of each taken by the mask first
    core_lo, core_hi = core_range(np.concatenate([d1, d4] if every else [d1[keep], d4[keep]]), mine=True)
    margin = max(10 * max(core_hi - core_lo, 0), OUTLIER_MIN_MARGIN_NS)
    return core_lo - margin, core_hi + margin


def _edges(t0: int, t1: int, bucket_s: float) -> np.ndarray:
    bns = int(round(bucket_s * NS))
    first = t0 - t0 % bns
    count = max(1, -(-(t1 + 1 - first) // bns))
    return first + bns * np.arange(count + 1, dtype=np.int64)


def _area(points: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """F(edge) = Σ_{p<edge}(edge − p) for every edge, from the points (int64 ns) sorted. The sums are taken from the
    first edge, not from the epoch: summed as epoch nanoseconds in float64, a million points reach ~1e24, whose step
    (2^28 ns ≈ 0.27 s) showed in the buckets' in-flight counts as steps of ~0.67 and values below zero. In integers
    (exact, int64) while the sums cannot overflow int64; beyond that (tens of millions of points over hours) in
    float64, still from the first edge (a step of microseconds). Differences of areas are exact in int64 only: the
    callers subtract and difference them before converting to float64."""
    origin = int(edges[0]) if len(edges) else 0
    points = points.astype(np.int64, copy=False)
    rel_edges = edges.astype(np.int64, copy=False) - origin
    k = np.searchsorted(points, edges, side="left")
    reach = max(abs(int(points[0] - origin)), abs(int(points[-1] - origin))) if len(points) else 0
    reach = max(reach, abs(int(rel_edges[-1])) if len(edges) else 0)
    if (len(points) + 1) * (reach + 1) < 1 << 62:
        csum = np.empty(len(points) + 1, dtype=np.int64)  # [0, cumsum(points − origin)], made in place
        csum[0] = 0
        np.subtract(points, origin, out=csum[1:])
        np.cumsum(csum[1:], out=csum[1:])
        return k * rel_edges - csum[k]  # int64: a float64 of it would round (it reaches n × span, beyond 2^53)
    rel_points = points - origin
    csum = np.concatenate([[0.0], np.cumsum(rel_points, dtype=np.float64)])
    return k * rel_edges.astype(np.float64) - csum[k]


def _occupancy(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Σ_i |[s_i, e_i] ∩ [edge_k, edge_k+1]| for every bucket, in ns, via F(t) = Σ_{s<t}(t−s) − Σ_{e<t}(t−e)."""
    return np.diff(_area(np.sort(starts), edges) - _area(np.sort(ends), edges)).astype(np.float64, copy=False)


def _histogram(points: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """np.histogram(points, bins=edges)[0] of points already sorted: the count per bucket [edge_k, edge_k+1), the
    last one closed on the right as numpy's, int64."""
    k = np.searchsorted(points, edges, side="left")
    k[-1] = np.searchsorted(points, edges[-1], side="right")
    return np.diff(k).astype(np.int64)


class _Intervals:
    """The ends of intervals as the bucket views read them: each array of points sorted once, read for its areas
    (_area) and its count per bucket (_histogram), and let go: the sorted copies of every row are not held together
    (they were the pool view's peak). Views share what is put once (in flight and queued share D1; in flight and
    executing share D4 when every execution is known)."""

    def __init__(self, edges: np.ndarray):
        self.edges = edges
        self._areas: dict[str, np.ndarray] = {}
        self._counts: dict[str, np.ndarray] = {}

    def put(self, name: str, points: np.ndarray | None, same_as: str | None = None) -> None:
        """`points` under `name`; `same_as`: the name of the same points, put before (sorted once)."""
        if same_as is not None:
            self._areas[name], self._counts[name] = self._areas[same_as], self._counts[same_as]
            return
        ordered = np.sort(points)
        self._areas[name] = _area(ordered, self.edges)
        self._counts[name] = _histogram(ordered, self.edges)

    def counts(self, name: str) -> np.ndarray:
        """_histogram of the points named `name`: how many fall in each bucket."""
        return self._counts[name]

    def area(self, name: str) -> np.ndarray:
        return self._areas[name]

    def occupancy(self, starts: str, ends: str) -> np.ndarray:
        """_occupancy of the intervals from the points named `starts` to those named `ends`."""
        return np.diff(self.area(starts) - self.area(ends)).astype(np.float64, copy=False)


def _count_steps(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The step function count(t) = #{i: s_i ≤ t < e_i} as (times, count from that time on); empty intervals
    are left out.

    One plain sort of the starts and ends together, each time doubled with its kind in the lowest bit (start 1,
    end 0), and a running sum of ±1 read at the last entry of each distinct time: the sum there does not depend
    on the order of the entries of one time, so no stable argsort is needed (3× less time for a million rows)."""
    live = ends > starts
    if not live.all():  # the usual case for executions and waits alike keeps every row: no copy then
        starts, ends = starts[live], ends[live]
    del live
    if len(starts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo = min(int(starts.min()), int(ends.min()))
    if max(int(starts.max()), int(ends.max())) - lo >= 1 << 62:  # the doubled offsets would not fit in int64
        return _count_steps_sorted(starts, ends)
    # made in place, in one array of keys and one of steps (a temporary of every row is fresh pages to fault in);
    # the steps' running sum in int32 while it fits (half the bytes), each array let go once read
    key = np.empty(len(starts) + len(ends), dtype=np.int64)
    for part, points, kind in ((key[:len(starts)], starts, 1), (key[len(starts):], ends, 0)):
        np.subtract(points, lo, out=part)
        part *= 2
        part += kind
    key.sort()
    running = np.empty(len(key), dtype=np.int32 if len(key) < 1 << 31 else np.int64)
    np.bitwise_and(key, 1, out=running, casting="unsafe")
    running *= 2
    running -= 1
    np.cumsum(running, out=running)
    times = key
    times >>= 1
    last = np.empty(len(times), dtype=bool)  # the last entry of each distinct time
    np.not_equal(times[1:], times[:-1], out=last[:-1])
    last[-1] = True
    counts = running[last]
    del running
    times = times[last]
    del key, last
    times += lo
    return times, counts.astype(np.int64, copy=False)


def _count_steps_sorted(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """_count_steps of non-empty intervals spread over more than 2⁶² ns, by a stable argsort of their times."""
    times = np.concatenate([starts, ends])
    delta = np.concatenate([np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)])
    order = np.argsort(times, kind="stable")
    times, delta = times[order], delta[order]
    uniq, first = np.unique(times, return_index=True)
    return uniq, np.cumsum(np.add.reduceat(delta, first))


def _step_extremes(times: np.ndarray, counts: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """min and max of a step function over each bucket [edge_k, edge_k+1)."""
    nb = len(edges) - 1
    if len(times) == 0:
        return np.zeros(nb, np.int64), np.zeros(nb, np.int64)
    at = np.searchsorted(times, edges[:-1], side="right") - 1  # last step at or before each bucket's start
    start_value = np.where(at >= 0, counts[np.maximum(at, 0)], 0)
    lo, hi = start_value.copy(), start_value.copy()
    # the steps inside bucket k (steps at its start too) are times[first[k]:first[k + 1]]: the times are sorted,
    # so each bucket's steps are one slice, reduced at once
    first = np.searchsorted(times, edges, side="left")
    stepped = np.flatnonzero(first[1:] > first[:-1])
    if len(stepped):
        inside = counts[:first[-1]]
        lo[stepped] = np.minimum(lo[stepped], np.minimum.reduceat(inside, first[stepped]))
        hi[stepped] = np.maximum(hi[stepped], np.maximum.reduceat(inside, first[stepped]))
    return lo, hi


def _measure_at_least(times: np.ndarray, counts: np.ndarray, level: int, lo: np.ndarray, hi: np.ndarray) -> float:
    """Σ over intervals [lo_i, hi_i) (disjoint) of the time the step function is ≥ level, ns."""
    if len(times) == 0 or len(lo) == 0:
        return 0.0
    ends = np.concatenate([times[1:], [times[-1]]])
    high = counts >= level
    s, e = times[high], ends[high]
    total = 0.0
    for a, b in zip(lo, hi):  # the waiting stretches: few
        total += float(np.clip(np.minimum(e, b) - np.maximum(s, a), 0, None).sum())
    return total


# --- the exchanges as intervals -----------------------------------------------------------------------------------


@dataclass
class _Rows:
    """The thread-pool timeline (partitioned.md §2.1): the exchanges inside the robust span as fixed-width arrays,
    built once from the table by _rows and read by every part of the view. No array here is a copy of a table
    column made only to be read: D1 and D4 are the table's own times where none is null and none is an outlier."""

    pos: np.ndarray  # row positions in the exchanges table
    d1: np.ndarray
    d4: np.ndarray
    xs: np.ndarray  # execution start: D4 − exec_s (D1 when exec_s is unknown: then `exec_known` is False)
    exec_known: np.ndarray
    q_end: np.ndarray  # D1 + queue_s (the best value, whatever its source)
    q_min: np.ndarray  # queue_min_s, ns
    conn: np.ndarray  # conn_id, -1 when unknown (the conn_id column's integer width: int32 where it is held so)
    measured: np.ndarray  # queue_source is measured (the slow log timed the execution)
    likely: np.ndarray  # queue_source is likely (decompose.likely_waits): a wait told as likely, not as certain
    culprit_ok: np.ndarray  # its execution could hold a worker for long: exec_s ≥ threshold from a source that says so
    srv: np.ndarray | None = None  # the DB server endpoint's number: a thread pool is one server's (one DB capture
    #                                point may see several servers: their statements never wait for each other);
    #                                one number stored once (stride 0) when every row has the same server

    @property
    def server(self) -> np.ndarray:
        """D4 − D1, ns: made when read (two readers, each once), not held beside the timeline."""
        return self.d4 - self.d1

    @property
    def q_told(self) -> np.ndarray:
        """The wait a story may tell, ns: the likely one where queue_source is likely, else the certain one."""
        return np.where(self.likely, self.q_end - self.d1, self.q_min)

    def groups(self, size: int | None) -> np.ndarray:
        """Each row's thread group, conn_id % size (the table's thread_group, which is made so), −1 where the
        connection id or the size is unknown."""
        if not size:
            return np.full(len(self.pos), -1, np.int64)
        group = self.conn % int(size)
        group[self.conn < 0] = -1
        return group


def _ns_from_seconds(seconds: np.ndarray) -> np.ndarray:
    """np.rint(np.nan_to_num(seconds) * NS).astype(np.int64), made in the int64 result and a scratch of
    ROWS_AT_ONCE: no float64 array of every row beside it."""
    out = np.empty(len(seconds), dtype=np.int64)
    scratch = np.empty(min(len(seconds), ROWS_AT_ONCE))
    for a in range(0, len(seconds), ROWS_AT_ONCE):
        part = scratch[:len(seconds[a:a + ROWS_AT_ONCE])]
        np.copyto(part, seconds[a:a + ROWS_AT_ONCE])
        np.nan_to_num(part, copy=False)
        part *= NS
        np.rint(part, out=part)
        np.copyto(out[a:a + ROWS_AT_ONCE], part, casting="unsafe")
    return out


def _server_numbers(column: pd.Series, pos: np.ndarray | None) -> np.ndarray:
    """The server endpoint of each row at `pos` (None: every row) numbered in order of first appearance in the
    column (pd.factorize's codes, as int64); one stored number (stride 0) when every row has the same server, a
    categorical read by its codes."""
    n = len(column) if pos is None else len(pos)
    if isinstance(column.dtype, pd.CategoricalDtype) and len(column):
        codes = column.cat.codes.to_numpy()
        if codes.min() == codes.max() >= 0:
            return np.broadcast_to(np.int64(0), n)
    numbers = pd.factorize(column)[0].astype(np.int64)
    return numbers if pos is None else numbers[pos]


def _connection_ids(column: pd.Series) -> np.ndarray:
    """conn_id as integers of the column's own width (int32 where the table holds it so), −1 where null."""
    values = column.array
    if isinstance(values, pd.arrays.IntegerArray):
        return values.to_numpy(dtype=values.dtype.numpy_dtype, na_value=-1)
    return column.astype("Int64").to_numpy(dtype="int64", na_value=-1)


def _rows(t: pd.DataFrame, threshold_ns: int) -> tuple[_Rows, np.ndarray, int, int]:
    """The exchanges with DB-side times inside the robust span, as int64 ns arrays; (rows, outlier row positions,
    t0, t1)."""
    d1_all, v1 = ts_ns(t["db_req_ts"], copy=False)
    d4_all, v4 = ts_ns(t["db_resp_ts"], copy=False)
    valid = v1 & v4
    every = bool(valid.all())
    del v1, v4
    pos = np.flatnonzero(valid)
    del valid
    d1, d4 = (d1_all, d4_all) if every else (d1_all[pos], d4_all[pos])
    del d1_all, d4_all
    keep, t0, t1 = robust_span(d1, d4)
    outliers = pos[~keep]
    if not keep.all():
        every = False
        pos, d1, d4 = pos[keep], d1[keep], d4[keep]
    del keep

    def of_pos(values: np.ndarray) -> np.ndarray:
        """values[pos]: every row is one of them (pos is 0 … n − 1) in the usual case, and then no copy is made."""
        return values if every else values[pos]

    def col(name):
        return of_pos(t[name].to_numpy(dtype="float64", na_value=np.nan))

    exec_s = col("exec_s")
    upper_bound = of_pos(equals(t["exec_source"], "below_long_query_time"))
    # a statement known faster than long_query_time executed at most server − queue_min_s: the interval a worker
    # may have been held, not a measurement, and only a culprit when it is not known to have queued itself
    fill = np.flatnonzero(np.isnan(exec_s) & upper_bound)
    if len(fill):  # on those rows only; exec_s may be the table's own
        exec_s = exec_s.copy()
        exec_s[fill] = (d4[fill] - d1[fill]) / NS - np.nan_to_num(col("queue_min_s")[fill])
    del fill
    exec_known = ~np.isnan(exec_s)
    exec_ns = _ns_from_seconds(exec_s)
    del exec_s
    unknown = np.flatnonzero(~exec_known)
    exec_ns[unknown] = d4[unknown] - d1[unknown]  # the server time, as np.where(exec_known, …, server) made it
    del unknown
    long_exec = exec_known & (exec_ns >= threshold_ns)
    xs = np.subtract(d4, exec_ns, out=exec_ns)  # exec_ns is not read again
    np.maximum(xs, d1, out=xs)
    del exec_ns
    q_end = _ns_from_seconds(col("queue_s"))
    q_end += d1
    np.minimum(q_end, d4, out=q_end)
    q_min = _ns_from_seconds(col("queue_min_s"))
    conn = of_pos(_connection_ids(t["conn_id"]))
    likely = of_pos(equals(t["queue_source"], "likely"))
    told = q_end - d1  # q_told, made in place
    np.copyto(told, q_min, where=~likely)
    victim = told >= threshold_ns
    del told
    # an upper bound on execution (below long_query_time) can still be a culprit, unless the statement is known to
    # have queued itself
    culprit_ok = long_exec & (~upper_bound | ~victim)
    measured = of_pos(equals(t["queue_source"], "measured"))
    srv = _server_numbers(t["server"], None if every else pos)
    return (_Rows(pos, d1, d4, xs, exec_known, q_end, q_min, conn, measured, likely, culprit_ok, srv=srv),
            outliers, t0, t1)


# --- the whole pool -------------------------------------------------------------------------------------------


def pool_table(r: _Rows, edges: np.ndarray, bucket_s: float, threshold_ns: int) -> pd.DataFrame:
    # each step function reduced to its buckets' extremes as soon as it is made (none is read elsewhere: two arrays
    # of twice the rows each, not held beside the next, nor through the rest of the view), then the sorted ends
    every = bool(r.exec_known.all())
    x_lo, x_hi = _step_extremes(*_count_steps(r.xs if every else r.xs[r.exec_known],
                                              r.d4 if every else r.d4[r.exec_known]), edges)
    _, q_hi = _step_extremes(*_count_steps(r.d1, r.q_end), edges)
    victim = np.flatnonzero(r.q_min >= threshold_ns)
    _, c_hi = _step_extremes(*_count_steps(r.d1[victim], r.d1[victim] + r.q_min[victim]), edges)
    del victim
    return pool_frame(_interval_ends(r, None, edges), edges, bucket_s, (x_lo, x_hi, q_hi, c_hi))


def pool_frame(ends, edges: np.ndarray, bucket_s: float, extremes: tuple[np.ndarray, ...]) -> pd.DataFrame:
    """pool.parquet's table from the ends' areas and counts (an _Intervals, or anything that reads the same:
    the streaming sweep's) and the step functions' extremes per bucket (executing min and max, queued max, certainly
    queued max)."""
    bns = int(round(bucket_s * NS))
    x_lo, x_hi, q_hi, c_hi = extremes
    return pd.DataFrame({
        "bucket_start": pd.to_datetime(edges[:-1], unit="ns", utc=True),
        "bucket_s": float(bucket_s),
        "in_flight": ends.occupancy("d1", "d4") / bns,
        "executing": ends.occupancy("xs", "d4x") / bns,
        "queued": ends.occupancy("d1", "q_end") / bns,
        "executing_min": x_lo.astype(np.int64),
        "executing_max": x_hi.astype(np.int64),
        "queued_max": q_hi.astype(np.int64),
        "queued_certain_max": c_hi.astype(np.int64),
        "started": ends.counts("d1"),
    })


def _interval_ends(r: _Rows, rows: np.ndarray | None, edges: np.ndarray) -> _Intervals:
    """The ends the bucket views read, of the rows `rows` (a mask or ascending positions; None: all), each sorted
    once: "d1", "d4", "q_end", and "xs", "d4x" of those whose execution is known."""
    def of(points: np.ndarray) -> np.ndarray:
        return points if rows is None else points[rows]

    ends = _Intervals(edges)
    ends.put("d1", of(r.d1))
    ends.put("d4", of(r.d4))
    ends.put("q_end", of(r.q_end))
    known = of(r.exec_known)
    if known.all():
        ends.put("xs", of(r.xs))
        ends.put("d4x", None, same_as="d4")
    else:
        ends.put("xs", of(r.xs)[known])
        ends.put("d4x", of(r.d4)[known])
    return ends


def infer_cap(r: _Rows, groups: np.ndarray | None, threshold_ns: int) -> dict | None:
    """The pool at thread_pool_max_threads: during (almost) all the time statements certainly waited, the most
    statements ever executing at once (K ≥ 2) were executing, nobody arrived and passed the waiting ones, and —
    when the thread groups are known — the waiting ones' own group had K executing too (else one busy group, not
    the whole pool, held them: a group stall). Returns the cap's summary part, or None."""
    victim = r.q_told >= threshold_ns
    if not victim.any():
        return None
    ex = r.exec_known  # every known execution (a victim's comes after its wait)
    # the waiting statements' own executions left out: below long_query_time only a bound on each is known, and
    # it reaches back into its wait (where the thread limit held it), so the count there would pass the limit
    times, counts = _count_steps(r.xs[ex & ~victim], r.d4[ex & ~victim])
    if len(counts) == 0:
        return None
    cap = int(counts.max())
    if cap < 2:
        return None
    w_lo, w_hi = _union(r.d1[victim], r.q_end[victim])
    waiting_ns = float((w_hi - w_lo).sum())
    if waiting_ns <= 0:
        return None
    at_cap = _measure_at_least(times, counts, cap, w_lo, w_hi)
    if at_cap < CAP_SHARE * waiting_ns:
        return None
    # free passes: arrivals during the waits that did not wait themselves
    margin = NS // 1000
    inside = np.searchsorted(w_lo, r.d1, side="right") - 1
    during = (inside >= 0) & (r.d1 > w_lo[np.maximum(inside, 0)] + margin) & (r.d1 < w_hi[np.maximum(inside, 0)] - margin)
    free = during & ~victim & _did_not_queue(r, threshold_ns)
    if free.sum() > FREE_PASS_SHARE * victim.sum():
        return None
    # the statements executing while they waited: an execution overlaps a (sorted, disjoint) waiting stretch when
    # the first stretch ending after it starts begins before it ends
    k = np.minimum(np.searchsorted(w_hi, r.xs, side="right"), len(w_lo) - 1)
    overlap = np.minimum(r.d4, w_hi[k]) - np.maximum(r.xs, w_lo[k])
    holding = np.flatnonzero(ex & ~victim & (overlap >= CULPRIT_MIN_SHARE * (w_hi[k] - w_lo[k])))
    if groups is not None and (groups[victim] >= 0).all():
        # how many executed in the waiting statement's own group during its wait
        same = []
        for v in np.flatnonzero(victim)[:200]:
            mine = holding[(groups[holding] == groups[v]) & (r.xs[holding] < r.q_end[v]) & (r.d4[holding] > r.d1[v])]
            same.append(len(mine))
        if np.median(same) < cap:
            return None
    waits = (r.q_end - r.d1)[victim]
    return {
        "threads": cap,
        "start": _iso(int(w_lo.min())), "end": _iso(int(w_hi.max())),
        "duration_s": at_cap / NS,
        "stretches": int(len(w_lo)),
        "waiting": int(victim.sum()),
        "max_wait_s": float(waits.max()) / NS,
        "total_wait_s": float(waits.sum()) / NS,
        "executing_total": int(len(holding)),
        "_holding": r.pos[holding], "_waiting": r.pos[np.flatnonzero(victim)],
    }


def infer_thread_pool_size(r: _Rows, threshold_ns: int) -> dict:
    """The thread_pool_size that explains the queueing: see the module docstring. Returns summary.json's
    thread_pool_size.inferred."""
    q_told = r.q_told
    victim = (q_told >= threshold_ns) & (r.conn >= 0)
    culprit = r.culprit_ok & (r.conn >= 0)
    out = {"value": None, "confidence": "not enough evidence", "candidates": [], "victims": int(victim.sum()),
           "explained": 0, "contradicted": 0, "checked_up_to": 0, "note": ""}
    if not victim.any():
        queued = int((q_told >= threshold_ns).sum())
        out["note"] = (f"{queued} statements certainly queued, none with a known connection id (their greetings "
                       "were not captured)" if queued else "no statement certainly queued")
        return out
    vi = np.flatnonzero(victim)
    if len(vi) > INFER_MAX_VICTIMS:
        vi = vi[np.linspace(0, len(vi) - 1, INFER_MAX_VICTIMS).astype(np.int64)]
        out["note"] = f"{INFER_MAX_VICTIMS} of {int(victim.sum())} queued statements considered; "
    # long statements executing during some certain wait (disjoint sorted union of the waits)
    w_lo, w_hi = _union(r.d1[vi], (r.d1 + q_told)[vi])
    ci = np.flatnonzero(culprit)
    k = np.searchsorted(w_hi, r.xs[ci], side="right")
    ci = ci[(k < len(w_lo)) & (w_lo[np.minimum(k, len(w_lo) - 1)] < r.d4[ci])]
    if len(ci) > INFER_MAX_CULPRITS:
        ci = ci[np.argsort(r.xs[ci] - r.d4[ci], kind="stable")[:INFER_MAX_CULPRITS]]  # the longest
        out["note"] += f"the {INFER_MAX_CULPRITS} longest of {int(culprit.sum())} long statements considered; "
    # (victim, culprit) pairs: the culprit executed during at least half of the victim's certain wait
    pv, pc = [], []
    for chunk in np.array_split(vi, max(1, len(vi) // 500)):
        w0, w1 = r.d1[chunk][:, None], (r.d1 + q_told)[chunk][:, None]
        ov = np.minimum(w1, r.d4[ci][None, :]) - np.maximum(w0, r.xs[ci][None, :])
        ok = ((ov >= 0.5 * (w1 - w0)) & (r.conn[chunk][:, None] != r.conn[ci][None, :])
              & (r.srv[chunk][:, None] == r.srv[ci][None, :]))
        a, b = np.nonzero(ok)
        pv.append(chunk[a])
        pc.append(ci[b])
    pv = np.concatenate(pv) if pv else np.zeros(0, np.int64)
    pc = np.concatenate(pc) if pc else np.zeros(0, np.int64)
    if len(pv) == 0:
        out["note"] += "no long statement executed while statements queued"
        return out
    diff = np.abs(r.conn[pv] - r.conn[pc])
    top = int(min(MAX_THREAD_POOL_SIZE, diff.max()))
    out["checked_up_to"] = top
    # arrivals during each blocking statement that did not wait: free passes
    free_ok = (r.conn >= 0) & _did_not_queue(r, threshold_ns)
    fi = np.flatnonzero(free_ok)
    fi = fi[np.argsort(r.d1[fi], kind="stable")]
    fd1 = r.d1[fi]
    blockers = np.unique(pc)
    per_blocker = max(1, min(2000, INFER_MAX_ARRIVALS // len(blockers)))
    fc, fu = [], []
    for c in blockers:
        lo = np.searchsorted(fd1, r.xs[c], side="right")
        hi = np.searchsorted(fd1, r.d4[c], side="left")
        us = fi[lo:min(hi, lo + per_blocker)]
        us = us[(r.conn[us] != r.conn[c]) & (r.srv[us] == r.srv[c])]
        fc.append(np.full(len(us), c))
        fu.append(us)
    fc = np.concatenate(fc) if fc else np.zeros(0, np.int64)
    fu = np.concatenate(fu) if fu else np.zeros(0, np.int64)
    fdiff = np.abs(r.conn[fu] - r.conn[fc])
    # A free pass contradicts N only while the statements a blocker held on its group were still waiting: after
    # thread_pool_stall_limit the pool declares the group stalled and wakes another worker, and later arrivals pass
    # freely while the long statement still runs (MariaDB's default 500 ms).
    slot = np.searchsorted(blockers, pc)
    f_slot = np.searchsorted(blockers, fc)
    wait_end = (r.d1 + q_told)[pv]
    n_victims = len(vi)
    scores = []
    for n in range(1, top + 1):
        ok = diff % n == 0
        explained = len(np.unique(pv[ok]))
        held_until = np.full(len(blockers), np.iinfo(np.int64).min)
        np.maximum.at(held_until, slot[ok], wait_end[ok])
        f_ok = (fdiff % n == 0) & (r.d1[fu] < held_until[f_slot] - RELEASE_MARGIN_NS)
        free = len(np.unique(fu[f_ok]))
        scores.append((n, explained, free))
    consistent = [(n, e, f) for n, e, f in scores
                  if e >= EXPLAINED_SHARE * n_victims and f <= FREE_PASS_SHARE * e]
    out["candidates"] = [n for n, _, _ in consistent][:10]
    if len(consistent) == 1:
        n, e, f = consistent[0]
        # certain only on certain waits: waits told as likely make the size likely too
        proven = vi[r.q_min[vi] >= threshold_ns]
        out.update(value=n, explained=e, contradicted=f,
                   confidence="certain" if len(proven) >= 3 and len({int(r.conn[v]) for v in proven}) >= 2
                   else "likely")
        out["note"] += (f"{e} of {n_victims} queued statements had a long statement executing on conn_id % {n} "
                        f"meanwhile; {f} passed freely on those groups")
    elif consistent:
        out["note"] += ("several sizes explain the queueing equally well: "
                        + ", ".join(str(n) for n, _, _ in consistent[:10]))
    else:
        best = max(scores, key=lambda s: (s[1] - s[2], -s[0]))
        out["explained"], out["contradicted"] = best[1], best[2]
        out["note"] += ("no single thread group explains the queueing (statements on the same group passed freely, "
                        "or the long statements ran on other groups): the whole pool, not one group, was busy")
    return out


def _did_not_queue(r: _Rows, threshold_ns: int) -> np.ndarray:
    """Certainly did not wait `threshold` or more: a measured short wait, or a short time inside the server."""
    return (r.q_min < threshold_ns) & (r.measured | (r.server < threshold_ns))


# --- per thread group -----------------------------------------------------------------------------------------


def group_table(r: _Rows, group: np.ndarray, edges: np.ndarray, bucket_s: float) -> pd.DataFrame:
    nb = len(edges) - 1
    frames = []
    for gid, rows in _rows_by_group(group):
        d1 = r.d1[rows]
        max_queue = _bucket_max((r.q_end[rows] - d1) / NS, np.searchsorted(edges, d1, side="right") - 1, nb)
        frames.append(group_frame(gid, _interval_ends(r, rows, edges), edges, bucket_s, max_queue))
    return groups_of_frames(frames)


def group_frame(gid, ends, edges: np.ndarray, bucket_s: float, max_queue_s: np.ndarray) -> pd.DataFrame:
    """groups.parquet's rows of one thread group from its ends' areas and counts (as pool_frame reads them) and its
    longest wait per bucket (by its start's bucket)."""
    bns = int(round(bucket_s * NS))
    queued = ends.occupancy("d1", "q_end")
    return pd.DataFrame({
        "thread_group": gid,
        "bucket_start": pd.to_datetime(edges[:-1], unit="ns", utc=True),
        "bucket_s": float(bucket_s),
        "in_flight": ends.occupancy("d1", "d4") / bns,
        "executing": ends.occupancy("xs", "d4x") / bns,
        "queued": queued / bns,
        "queue_s": queued / NS,
        "started": ends.counts("d1"),
        "max_queue_s": max_queue_s,
    })


def groups_of_frames(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """groups.parquet's table: the groups' frames (group_frame) in ascending group order, or its empty table."""
    if not frames:
        return pd.DataFrame({c.name: pd.Series(dtype=c.dtype) for c in GROUP_COLUMNS})
    groups = pd.concat(frames, ignore_index=True)
    groups["thread_group"] = groups["thread_group"].astype("int64")
    groups["started"] = groups["started"].astype("int64")
    return groups


def _rows_by_group(group: np.ndarray) -> list[tuple[np.int64, np.ndarray]]:
    """(group, its row positions in ascending order) for every group ≥ 0, in ascending group order: one stable
    argsort of the group numbers (a radix sort: they are below MAX_THREAD_POOL_SIZE, or at least small), not one
    pass over every row per group (thread_pool_size 64: 64 passes)."""
    member = np.flatnonzero(group >= 0)
    if not len(member):
        return []
    g = group[member]
    rows = member[group_order(g, int(g.max()))]
    gids, counts = np.unique(g, return_counts=True)
    cut = np.cumsum(counts)[:-1]
    return list(zip(gids, np.split(rows, cut)))


def _bucket_max(values: np.ndarray, bucket: np.ndarray, nb: int) -> np.ndarray:
    """The largest of `values` (no NaN) in each of the buckets 0 … nb − 1 (`bucket`: each value's, others ignored),
    NaN where a bucket has none."""
    inside = (bucket >= 0) & (bucket < nb)
    out = np.full(nb, -np.inf)
    np.maximum.at(out, bucket[inside], values[inside])
    out[np.bincount(bucket[inside], minlength=nb) == 0] = np.nan
    return out


def find_stalls(r: _Rows, group: np.ndarray, threshold_ns: int) -> list[dict]:
    """Stalled stretches: per group, the union of the waits of statements that certainly queued ≥ threshold; the
    culprits are statements of the same group whose execution covered ≥ CULPRIT_MIN_SHARE of the stretch, longest
    overlap first. Each stall has `_victims` and `_culprits` (row positions in `r`, private to this module)."""
    victim = (r.q_told >= threshold_ns) & (group >= 0)
    if not victim.any():
        return []
    # a thread group is one server's: with several servers at one point, (server, group) is the key
    key = r.srv * (int(group.max()) + 1) + group if r.srv is not None else group
    q = pd.DataFrame({"g": key[victim], "s": r.d1[victim], "e": r.q_end[victim], "i": np.flatnonzero(victim)})
    q = q.sort_values(["g", "s"], kind="stable")
    prev_end = q.groupby("g")["e"].cummax().groupby(q["g"]).shift()
    q["stretch"] = ((q["s"] > prev_end) | prev_end.isna() | (q["g"] != q["g"].shift())).cumsum()
    stalls = []
    busy = np.flatnonzero(r.culprit_ok & (group >= 0))
    for _, members in q.groupby("stretch"):
        k = int(members["g"].iloc[0])
        g = int(group[members["i"].iloc[0]])
        s, e = int(members["s"].min()), int(members["e"].max())
        mine = busy[key[busy] == k]
        overlap = np.minimum(e, r.d4[mine]) - np.maximum(s, r.xs[mine])
        hold = overlap >= CULPRIT_MIN_SHARE * (e - s)
        order = np.argsort(-overlap[hold], kind="stable")
        stalls.append({"thread_group": g, "s": s, "e": e, "_victims": members["i"].to_numpy(),
                       "_culprits": mine[hold][order], "_overlap": overlap[hold][order]})
    stalls.sort(key=lambda st: (st["s"], st["thread_group"]))
    return stalls


# --- the stage ------------------------------------------------------------------------------------------------


def thread_pool_view(t: pd.DataFrame, given_size: int | None, bucket_s: float | None = None,
                     threshold_s: float = STALL_MIN_QUEUE_S, refs=None, per_row: bool = True) -> PoolView:
    """Everything the thread-pool view adds, from decompose()'s table (exec_s, queue_s, queue_min_s, …). `refs`:
    what makes summary.json's references of `t` (Refs by default; the partitioned run hands a table of VIEW_COLUMNS
    alone and reads the other columns at the rows referenced: FetchingRefs). `per_row` False: the per-row columns
    (thread_group, stall, stall_role, queue_source) are not made of every row, only what names their rows
    (stall_members, unheld: the partitioned run sets them per partition)."""
    threshold_ns = int(round(threshold_s * NS))
    r, outlier_rows, t0, t1 = _rows(t, threshold_ns)
    outliers = len(outlier_rows)
    n = len(t)
    warnings: list[str] = []
    if outliers:
        warnings.append(f"{outliers} exchanges have DB-side times far outside the capture's span (or ending before "
                        "they start): left out of the pool and group views and the verdict")
    bucket_s = bucket_s or auto_bucket_s(t1 - t0)
    edges = _edges(t0, t1, bucket_s) if len(r.pos) else np.zeros(1, np.int64)
    pool = pool_table(r, edges, bucket_s, threshold_ns) if len(r.pos) else _empty(POOL_COLUMNS)
    release_memory()  # the pool table's step functions and sorted ends, freed: group_table's come next

    inferred = infer_thread_pool_size(r, threshold_ns)
    size, source = given_size, "given" if given_size else None
    if not given_size and inferred["value"] is not None:
        size, source = inferred["value"], "inferred"
    thread_group = thread_groups(t["conn_id"], size) if per_row else None
    group_r = r.groups(size)  # thread_group at the timeline's rows, from its own connection ids

    # the cap check looks into the groups only when the wire confirms them (a wrong given size would hide the cap)
    sure = inferred["confidence"] == "certain" and inferred["value"] == size
    cap = infer_cap(r, group_r if size and sure else None, threshold_ns)
    if cap and source == "inferred" and inferred["confidence"] != "certain":
        # the waits are the thread limit's doing: they say nothing about the groups
        size, source = None, None
        inferred.update(value=None, confidence="not enough evidence",
                        note="the waits are explained by the thread limit (thread_pool_max_threads), not by groups")
        thread_group = thread_groups(t["conn_id"], None) if per_row else None
        group_r = np.full(len(r.pos), -1, np.int64)
    elif cap and inferred["confidence"] != "certain":
        inferred["note"] = ("the waits are explained by the thread limit (thread_pool_max_threads), which hides the "
                            "groups; " + inferred["note"])
    queue_source = None
    unheld = _likely_not_held(r, group_r) if size else np.zeros(0, np.int64)
    if len(unheld):  # no long statement on its own group: the likely wait is only an estimate after all
        r.likely[unheld] = False
    if len(unheld) and not per_row and isinstance(t["queue_source"].dtype, pd.CategoricalDtype):
        # relabelled for the references alone, by the categorical's codes
        t = t.copy(deep=False)
        t["queue_source"] = estimated_at(t["queue_source"], r.pos[unheld])
    elif len(unheld):
        values = t["queue_source"].astype(object).to_numpy(copy=True)
        values[r.pos[unheld]] = "estimated"
        # the categories those of the column and "estimated", sorted as tables.labelled makes them: the column's
        # are the labels that occur, and a value outside them would become null
        queue_source = pd.Series(pd.Categorical(values, categories=sorted({*t["queue_source"].cat.categories,
                                                                            "estimated"}))
                                 if isinstance(t["queue_source"].dtype, pd.CategoricalDtype) else values)
        t = t.copy(deep=False)
        t["queue_source"] = queue_source.to_numpy()
    groups = group_table(r, group_r, edges, bucket_s) if size and len(r.pos) else _empty(GROUP_COLUMNS)
    stalls_raw = find_stalls(r, group_r, threshold_ns) if size else []

    members = [(r.pos[st["_victims"]], r.pos[st["_culprits"]]) for st in stalls_raw]
    stall, role = None, None
    if per_row:  # per-exchange annotations
        marked, stall_of, role_of = stall_marks(members)
        stall = np.full(n, -1, np.int64)
        role = np.full(n, None, dtype=object)
        stall[marked], role[marked] = stall_of, role_of
        del marked, stall_of, role_of

    cols = (refs or Refs)(t)
    cap_members = (cap.pop("_holding"), cap.pop("_waiting")) if cap else None
    cols.prefetch([r.pos[st["_culprits"][:MAX_CULPRITS]] for st in stalls_raw]
                  + ([m[:MAX_REFS] for m in cap_members] if cap_members else []))
    stalls = [_stall_summary(sid, st, cols, r) for sid, st in enumerate(stalls_raw)]
    without = sum(1 for s in stalls if s["culprits_total"] == 0)
    size_info = {"value": size, "source": source, "given": given_size, "inferred": inferred,
                 "stalls_without_culprits": without, "warning": None}
    if given_size:
        problems = []
        if stalls and without:
            problems.append(f"{without} of {len(stalls)} stalls have no culprit on their thread group")
        if inferred["confidence"] == "certain" and inferred["value"] != given_size:
            problems.append(f"the wire says {inferred['value']} ({inferred['note']})")
        if problems:
            size_info["warning"] = (f"thread_pool_size {given_size} may be wrong: " + "; ".join(problems)
                                    + (f"; the wire suggests {inferred['value']}" if inferred["value"]
                                       and inferred["value"] != given_size and "the wire says" not in problems[-1]
                                       else ""))
            warnings.append(size_info["warning"])
    pool_info = {"bucket_s": float(bucket_s) if len(r.pos) else None,
                 "max_executing": int(pool["executing_max"].max()) if len(pool) else 0,
                 "cap": _cap_summary(cap, cap_members, cols) if cap else None,
                 "outliers": {"exchanges": outliers, "span_start": _iso(t0) if len(r.pos) else None,
                              "span_end": _iso(t1) if len(r.pos) else None}}
    stall_column, role_column = stall_columns(stall, role, bool(stalls_raw)) if per_row else (None, None)
    return PoolView(
        pool=pool, groups=groups, thread_pool_size=size_info, pool_summary=pool_info,
        groups_summary={"bucket_s": float(bucket_s) if size and len(r.pos) else None, "stalls": stalls,
                        "stall_limit": None if cap else _stall_limit(stalls_raw, r)},
        thread_group=thread_group.reset_index(drop=True) if per_row else None,
        stall=stall_column, stall_role=role_column,
        stall_members=members, cap_members=cap_members, outliers=outlier_rows, warnings=warnings,
        queue_source=queue_source, unheld=r.pos[unheld],
    )


def stall_marks(members: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows the stalls name (`members`: per stall its victims and culprits, row positions) in ascending order,
    with each one's stall and role: a statement that queued in a stall is its victim (of the last it queued in)
    even if it held another one; a culprit of several stalls is the first's."""
    marked: dict[int, tuple[int, str]] = {}
    for sid, (_, culprits) in enumerate(members):
        for row in culprits.tolist():
            marked.setdefault(row, (sid, "culprit"))
    for sid, (victims, _) in enumerate(members):
        for row in victims.tolist():
            marked[row] = (sid, "victim")
    rows = sorted(marked)
    return (np.array(rows, dtype=np.int64), np.array([marked[row][0] for row in rows], dtype=np.int64),
            np.array([marked[row][1] for row in rows], dtype=object))


def thread_groups(conn_id: pd.Series, size: int | None) -> pd.Series:
    """The thread_group column: conn_id % size (Int64), null where the connection id or the size is unknown."""
    if not size:
        return pd.Series(pd.NA, index=conn_id.index, dtype="Int64")
    return (conn_id.astype("Int64") % int(size)).astype("Int64")


def estimated_at(column: pd.Series, rows: np.ndarray) -> pd.Categorical:
    """The categorical queue_source column with 'estimated' at `rows`: its categories and 'estimated', sorted (as the
    per-row column thread_pool_view makes), the codes set at those rows alone (no object array of every row)."""
    labels = sorted({*column.cat.categories, "estimated"})
    codes = column.cat.set_categories(labels).cat.codes.to_numpy().copy()
    codes[rows] = labels.index("estimated")
    return pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(labels))


def _stall_limit(stalls: list[dict], r: _Rows) -> dict | None:
    """What the capture shows of thread_pool_stall_limit: stalls whose waiting statements were all let go at once
    while their main culprit still executed — the pool declared the group stalled and woke another worker. The
    timer finds a group stalled one to two stall limits after it stopped, so the shortest relief bounds it."""
    relief = []
    for st in stalls:
        # a lower bound does not say when a wait ended: only measured and likely waits time the release
        if not len(st["_culprits"]) or not (r.measured | r.likely)[st["_victims"]].all():
            continue
        c = st["_culprits"][0]
        ends = r.q_end[st["_victims"]]
        if int(r.d4[c]) > int(ends.max()) + RELEASE_MARGIN_NS and int(ends.max() - ends.min()) <= RELEASE_MARGIN_NS:
            relief.append(int(ends.max()) - int(r.xs[c]))
    if not relief:
        return None
    return {"relieved": len(relief), "of_stalls": len(stalls), "min_s": min(relief) / NS, "max_s": max(relief) / NS,
            "stall_limit_at_most_s": min(relief) / NS}


def _likely_not_held(r: _Rows, group: np.ndarray) -> np.ndarray:
    """Positions in `r` of likely waits on a known thread group during which no long statement of that group
    executed (≥ LIKELY_COVER of the wait): decompose.likely_waits saw one on the server, not on the group."""
    likely = np.flatnonzero(r.likely & (group >= 0))
    if not len(likely):
        return likely
    held = np.zeros(len(likely), dtype=bool)
    busy = np.flatnonzero(r.culprit_ok & (group >= 0))
    for gid in np.unique(group[likely]):
        mine = likely[group[likely] == gid]
        culprits = busy[group[busy] == gid]
        lo, hi = _union(r.xs[culprits], r.d4[culprits])
        wait = r.q_end[mine] - r.d1[mine]
        held[group[likely] == gid] = covered_ns(lo, hi, r.d1[mine], r.q_end[mine]) >= LIKELY_COVER * wait
    return likely[~held]


def stall_columns(stall: np.ndarray, role: np.ndarray, any_stall: bool) -> tuple[pd.Series, pd.Series]:
    """The per-row stall and stall_role columns from each row's stall id (−1: none) and role (None: none): Int64
    with nulls, and a categorical of the roles present (of none, when the view found no stall)."""
    return (pd.Series(stall, dtype="Int64").where(stall >= 0),
            pd.Series(role, dtype="object").astype("category") if any_stall else _no_roles(len(role)))


def _no_roles(n: int) -> pd.Series:
    """n nulls as pd.Series([None] * n, dtype="object").astype("category") makes them, without n objects."""
    return pd.Series(pd.Categorical.from_codes(np.full(n, -1, dtype=np.int8),
                                               dtype=pd.CategoricalDtype(pd.Index([], dtype=object))))


def _stall_summary(sid: int, st: dict, cols: "Refs", r: _Rows) -> dict:
    vic = r.pos[st["_victims"]]
    sources = cols.array("queue_source")[vic]
    culprits = []
    for i, ov in zip(st["_culprits"][:MAX_CULPRITS], st["_overlap"][:MAX_CULPRITS]):
        ref = cols.ref(int(r.pos[i]))
        ref["overlap_s"] = float(ov) / NS
        culprits.append(ref)
    queue, certain = cols.array("queue_s")[vic], cols.array("queue_min_s")[vic]
    return {
        "id": sid, "thread_group": st["thread_group"], "start": _iso(st["s"]), "end": _iso(st["e"]),
        "duration_s": (st["e"] - st["s"]) / NS, "queued": int(len(vic)),
        "max_queue_s": float(np.nanmax(queue)), "max_queue_certain_s": float(np.nanmax(certain)),
        "queue_sources": {k: int((sources == k).sum()) for k in ("measured", "estimated", "lower_bound", "likely")},
        "hidden_slow": int(cols.array("hidden_slow")[vic].sum()), "understated": int(cols.array("understated")[vic].sum()),
        "culprits": culprits, "culprits_total": int(len(st["_culprits"])),
        "culprits_more": max(0, int(len(st["_culprits"])) - MAX_CULPRITS),
    }


def _cap_summary(cap: dict, members: tuple[np.ndarray, np.ndarray], cols: "Refs") -> dict:
    holding, waiting = members
    sources = set(cols.array("queue_source")[waiting])
    cap["wait_source"] = "measured" if sources == {"measured"} else ",".join(sorted(map(str, sources)))
    cap["executing"] = [cols.ref(int(i)) for i in holding[:MAX_REFS]]
    cap["waiting_refs"] = [cols.ref(int(i)) for i in waiting[:MAX_REFS]]
    return cap


class Refs:
    """References to exchanges for summary.json: each its key (capture, conn_index, seq) and what a reader needs.
    A column asked for whole (`array`) is converted once, not once per reference; a reference alone reads its
    values one by one (a few dozen references each converting a few dozen columns of every row cost more than the
    rest of the summary)."""

    EXTRA = ("stall", "stall_role", "slow_log_line")
    _NAT = np.iinfo(np.int64).min

    def __init__(self, t: pd.DataFrame):
        self.t = t
        self._arrays: dict[str, np.ndarray] = {}
        self._columns: dict[str, pd.Series] = {}
        self._dtypes = {c: d for c, d in t.dtypes.items()}
        self._times = {c for c, d in self._dtypes.items() if str(d).startswith("datetime64")}

    def array(self, col: str) -> np.ndarray:
        if col not in self._arrays:
            c = self.t[col]
            if str(c.dtype).startswith("datetime64"):
                ns, valid = ts_ns(c)  # Timestamps made per reference: converting a million of them costs seconds
                self._arrays[col] = np.where(valid, ns, self._NAT)
            elif str(c.dtype) == "boolean":
                self._arrays[col] = c.to_numpy(dtype=bool, na_value=False)
            elif str(c.dtype) in ("float64", "Float64"):
                self._arrays[col] = c.to_numpy(dtype="float64", na_value=np.nan)
            else:
                self._arrays[col] = c.astype(object).to_numpy()
        return self._arrays[col]

    def prefetch(self, positions: list[np.ndarray]) -> None:
        """The rows at `positions` will be referenced (nothing to do here: `t` holds every column)."""

    def _column(self, col: str) -> pd.Series:
        if col not in self._columns:
            self._columns[col] = self.t[col]
        return self._columns[col]

    def _element(self, col: str, pos: int):
        """array(col)[pos], read from the column's own array without converting the column."""
        if col in self._arrays:
            return self._arrays[col][pos]
        dtype = self._dtypes[col]
        if col in self._times and dtype not in (np.dtype("M8[ns]"), pd.DatetimeTZDtype("ns", "UTC")):
            return self.array(col)[pos]  # another unit or zone: converted as ts_ns converts it
        values = self._column(col).array
        if col in self._times:
            return values.asi8[pos]  # NaT is int64's minimum, as array() marks it
        v = values[pos]
        if str(dtype) in ("float64", "Float64"):
            return np.nan if v is pd.NA else v
        return v

    def value(self, col: str, pos: int):
        if str(self._dtypes[col]) == "boolean":  # a null (in_slow_log without a usable slow log, or undecided) is
            # not known: null in the reference as in the table; `array` reads it as False, for counting only
            v = self._column(col).array[pos]
            return None if v is pd.NA else bool(v)
        v = self._element(col, pos)
        if col in self._times:
            return None if v == self._NAT else _iso(int(v))
        return json_value(v)

    def ref(self, pos: int) -> dict:
        out = {c: self.value(c, pos) if c in self._dtypes else None for c in REF_COLUMNS}
        for c in self.EXTRA:
            if c in self._dtypes:
                out[c] = self.value(c, pos)
        if isinstance(out.get("sql"), str):
            out["sql"] = clip(out["sql"], 200, flat=False)
        return out


class FetchingRefs(Refs):
    """Refs of a table that holds some columns of every row (`t`: what the view reads whole), the other reference
    columns (`more`: their names and dtypes) read at the rows referenced alone: `fetch(positions)` gives those rows
    (every column, in that order), fetched once by `prefetch` before the references are made (a row referenced
    without it is fetched then). The same references as Refs of the whole table: each value is read by Refs' own
    rules, from a table of the referenced rows."""

    def __init__(self, t: pd.DataFrame, fetch, more: dict):
        super().__init__(t)
        self.fetch = fetch
        self._more = {c: d for c, d in more.items() if c not in self._dtypes}
        self._dtypes.update(self._more)
        self._times |= {c for c, d in self._more.items() if str(d).startswith("datetime64")}
        self._fetched: dict[int, int] = {}  # row position → its row in `_rows`
        self._rows: Refs | None = None

    def prefetch(self, positions: list[np.ndarray]) -> None:
        wanted = sorted({int(p) for at in positions for p in np.asarray(at).tolist()} - set(self._fetched))
        if not wanted:
            return
        rows = self.fetch(wanted)[list(self._more)]
        if self._rows is not None:  # more rows after the first fetch (a reference not prefetched): kept together
            rows = pd.concat([self._rows.t, rows], ignore_index=True)
        self._fetched.update({p: len(self._fetched) + n for n, p in enumerate(wanted)})
        self._rows = Refs(rows)

    def value(self, col: str, pos: int):
        if col not in self._more:
            return super().value(col, pos)
        if pos not in self._fetched:
            self.prefetch([np.array([pos])])
        return self._rows.value(col, self._fetched[pos])

    def array(self, col: str) -> np.ndarray:
        if col in self._more:
            raise KeyError(f"{col}: read at the referenced rows alone, not as a whole column")
        return super().array(col)


def json_value(v):
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return None
    if isinstance(v, pd.Timestamp):
        return v.isoformat()
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


def _iso(ns: int) -> str:
    return pd.Timestamp(int(ns), unit="ns", tz="UTC").isoformat()


def _empty(columns) -> pd.DataFrame:
    return pd.DataFrame({c.name: pd.Series(dtype=c.dtype) for c in columns})
