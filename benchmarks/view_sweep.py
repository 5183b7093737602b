"""Step 9's pieces against today's in-memory functions (docs/partitioned.md, "Step 9's pieces, built"): memory
(tracemalloc peak above the start of the call: numpy's buffers counted; what the call is handed is not) and CPU
(time.process_time, the two routes alternated, medians) on an analysed recording's exchanges.parquet.

    python3 benchmarks/view_sweep.py OUT/exchanges.parquet [--size 2] [--repeat 5] [--parts 1,16]

- the thread-pool view: pool_table + group_table + find_stalls of the whole timeline (`_Rows`, built by `_rows`
  beforehand) against poolsweep.sweep_timeline of it cut into P runs by rows dealt at random (each run sorted by D1,
  made beforehand: in the partitioned run they are the partitions' files);
- the quantiles: summary.json's p50/p99 of the seven latency columns (latency_quantiles' nearest_rank of each
  column's non-null values) and the execution estimates' per-class p10/p50/p90 of exec_s by fingerprint
  (_group_quantiles) against RadixSelect fed the column in pieces of PIECE rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pcapdecomp.core.exact import radix_quantiles  # noqa: E402
from pcapdecomp.core.groups import nearest_rank  # noqa: E402
from pcapdecomp.explain import threadpool as tp  # noqa: E402
from pcapdecomp.explain.decompose import _group_quantiles  # noqa: E402
from pcapdecomp.explain.poolsweep import sweep_timeline, timeline_run  # noqa: E402

LATENCY_COLUMNS = ("total_s", "server_s", "network_s", "net_req_s", "net_resp_s", "queue_s", "exec_s")
PIECE = 1 << 16  # rows of a partition's piece fed to the radix select
MIB = 1 << 20


def measured(call):
    """(result, peak MiB above the start, CPU s) of call()."""
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    cpu = time.process_time()
    result = call()
    cpu = time.process_time() - cpu
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return result, (peak - start) / MIB, cpu


def timed(call) -> float:
    cpu = time.process_time()
    call()
    return time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exchanges", type=Path)
    ap.add_argument("--size", type=int, default=2, help="thread_pool_size (the groups and stalls)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--parts", default="1,16")
    ap.add_argument("--step", type=int, default=None, help="rows of each run the merge reads at a time")
    args = ap.parse_args()
    table = pq.read_table(args.exchanges).to_pandas()
    n = len(table)
    threshold_ns = int(round(tp.STALL_MIN_QUEUE_S * tp.NS))
    (r, _, t0, t1), rows_mib, _ = measured(lambda: tp._rows(table, threshold_ns))
    bucket_s = tp.auto_bucket_s(t1 - t0)
    edges = tp._edges(t0, t1, bucket_s)
    group = r.groups(args.size)
    print(f"{args.exchanges}: {n:,} exchanges, timeline {len(r.pos):,} rows, {len(edges) - 1} buckets of {bucket_s} s")
    print(f"  _rows (making the timeline today's view holds): peak {rows_mib:.1f} MiB ({rows_mib * MIB / n:.0f} B an exchange)")

    def today():
        return (tp.pool_table(r, edges, bucket_s, threshold_ns), tp.group_table(r, group, edges, bucket_s),
                tp.find_stalls(r, group, threshold_ns))

    (pool, groups, stalls), mib, cpu = measured(today)
    print(f"  today (pool_table + group_table + find_stalls on _Rows): peak {mib:.1f} MiB, {len(stalls)} stalls")
    rng = np.random.default_rng(0)
    for count in [int(p) for p in args.parts.split(",")]:
        part = rng.integers(0, count, len(r.pos))
        runs = [timeline_run(r, group, np.flatnonzero(part == p)) for p in range(count)]
        view, mib, _ = measured(lambda: sweep_timeline(runs, edges, bucket_s, threshold_ns, step=args.step))
        same = view.pool.equals(pool) and view.groups.equals(groups) and len(view.stalls) == len(stalls)
        print(f"  sweep of {count} runs: peak {mib:.1f} MiB, same tables and stall count: {same}")
        a, b = [], []
        for _ in range(args.repeat):
            a.append(timed(today))
            b.append(timed(lambda: sweep_timeline(runs, edges, bucket_s, threshold_ns, step=args.step)))
        print(f"  CPU, medians of {args.repeat} alternated: today {statistics.median(a):.3f} s "
              f"({min(a):.3f}-{max(a):.3f}), sweep of {count} runs {statistics.median(b):.3f} s ({min(b):.3f}-{max(b):.3f})")

    columns = {c: table[c].to_numpy(dtype="float64", na_value=np.nan) for c in LATENCY_COLUMNS}
    empty = [c for c, v in columns.items() if np.isnan(v).all()]  # latency_quantiles writes null for these
    columns = {c: v for c, v in columns.items() if c not in empty}

    def today_quantiles():
        return [nearest_rank(v[~np.isnan(v)], [0.5, 0.99]) for v in columns.values()]

    def radix():
        return [radix_quantiles(lambda: [(v[a:a + PIECE], None) for a in range(0, n, PIECE)], 1, [0.5, 0.99])
                for v in columns.values()]

    want, mib_a, _ = measured(today_quantiles)
    got, mib_b, _ = measured(radix)
    same = all(np.array_equal(w, [g[0][0], g[1][0]]) for w, g in zip(want, got))
    a = [timed(today_quantiles) for _ in range(args.repeat)]
    b = [timed(radix) for _ in range(args.repeat)]
    print(f"  p50/p99 of the {len(columns)} latency columns with values (none in {', '.join(empty) or '-'}): nearest_rank peak {mib_a:.1f} MiB, {statistics.median(a):.3f} s; "
          f"RadixSelect peak {mib_b:.1f} MiB, {statistics.median(b):.3f} s; the same: {same}")
    codes = table["fingerprint"].astype("category").cat.codes.to_numpy().astype(np.int64)
    codes[codes < 0] = codes.max(initial=0) + 1
    classes = int(codes.max(initial=0)) + 1
    exec_s = columns["exec_s"]
    ok = ~np.isnan(exec_s)

    def today_classes():
        return _group_quantiles(codes[ok], exec_s[ok], classes, (0.1, 0.5, 0.9))

    def radix_classes():
        return radix_quantiles(lambda: [(exec_s[a:a + PIECE], codes[a:a + PIECE]) for a in range(0, n, PIECE)],
                               classes, (0.1, 0.5, 0.9), "linear")

    want, mib_a, _ = measured(today_classes)
    got, mib_b, _ = measured(radix_classes)
    same = all(w.tobytes() == g.tobytes() for w, g in zip(want, got))
    a = [timed(today_classes) for _ in range(args.repeat)]
    b = [timed(radix_classes) for _ in range(args.repeat)]
    print(f"  exec_s p10/p50/p90 of {classes} classes: _group_quantiles peak {mib_a:.1f} MiB, "
          f"{statistics.median(a):.3f} s; RadixSelect peak {mib_b:.1f} MiB, {statistics.median(b):.3f} s; "
          f"the same: {same}")


if __name__ == "__main__":
    main()
