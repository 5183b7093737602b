#!/usr/bin/env python3
"""The partitioned analysis' numbers (docs/partitioned.md), measured on one analyze's outputs.

    pcapdecomp analyze /tmp/pcapdecomp-bench/sysbench-rw-40s --jobs 1 -q -o /tmp/design37-out
    python3 benchmarks/partition_views.py /tmp/design37-out
    python3 benchmarks/partition_views.py /tmp/design37-out --partitions 4,16,64,256 --window-bits 16

From exchanges.parquet alone (nothing is re-analysed) it prints, as markdown:
- the global views of the plan: their rows and bytes (as the plan lays them out: fixed-width arrays), per
  exchange of the table;
- the partitions: rows per partition when connections, and then pieces (the requests whose TCP sequence
  number shares its bits above WINDOW_BITS: a window of the request stream, the plan's key, which both points see
  alike), are hashed into P partitions; the largest connection and the largest piece;
- the facts the plan's byte-for-byte rules rest on, checked on this file: the row order (matched rows, then those
  only the app saw, then those only the DB saw, each run in its point's order), the row groups, the categorical
  dictionaries that hold values no row has, and that numpy's pairwise sum of a float column is reproduced exactly
  by a streaming sum fed the values in row order a row group at a time (pcapdecomp.core.exact.PairwiseSum)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pcapdecomp.core.exact import PairwiseSum  # noqa: E402
# the partition key's hash and buckets, as the extraction's spill makes them
from pcapdecomp.read.spill import BUCKETS, WINDOW_BITS, stable_hash  # noqa: E402

LATENCY_COLUMNS = ("total_s", "server_s", "network_s", "net_req_s", "net_resp_s", "queue_s", "exec_s")
ROW_GROUP = 1 << 17  # core.outputs.PARQUET_ROWS_PER_GROUP


def _column(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    if pa.types.is_timestamp(col.type):
        return col.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64) \
            if col.null_count else col.cast(pa.int64()).to_numpy()
    return col.to_numpy(zero_copy_only=False)


def _ns(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    col = table.column(name).cast(pa.int64())
    valid = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    return col.fill_null(0).to_numpy(), valid


def _texts(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_pylist(), dtype=object)


def partition_keys(table: pa.Table) -> np.ndarray:
    """Each row's connection as the plan keys it: (client endpoint as the DB saw it, server) where the DB saw the
    exchange, else the app's client endpoint (the same without NAT), as text."""
    import pyarrow.compute as pc

    text = [table.column(c).cast(pa.string()) for c in ("db_client", "client", "server")]
    who = pc.coalesce(text[0], text[1])
    return np.asarray(pc.binary_join_element_wise(who, text[2], "|").to_pylist(), dtype=object)


def bucket_runs(buckets: np.ndarray, parts: int) -> np.ndarray:
    """Rows per partition when the buckets, in order, are cut into `parts` runs: a run ends at the first bucket
    where the running count reaches the next multiple of total / parts (an empty run when a bucket jumps two)."""
    ends = np.cumsum(buckets)
    targets = ends[-1] * np.arange(1, parts + 1) / parts
    cut = np.minimum(np.searchsorted(ends, targets, side="left"), len(buckets) - 1)
    cut[-1] = len(buckets) - 1
    return np.diff(np.concatenate([[0], ends[cut]]))


def global_views(table: pa.Table, n: int) -> list[tuple[str, int, int, str]]:
    """(view, rows, bytes, how its pieces combine)."""
    d1, v1 = _ns(table, "db_req_ts")
    d4, v4 = _ns(table, "db_resp_ts")
    timed = v1 & v4
    server = _column(table, "server_s")
    has_server = ~np.isnan(server)
    conn_id = table.column("conn_id")
    no_id = int(conn_id.null_count)
    keys = partition_keys(table)
    connections = len(np.unique(keys))
    seen = _texts(table, "seen")
    both = int((seen == "both").sum())
    views = [
        ("connections (key, both points' ids, partition, counts, conn_id, first row): 48 B a connection",
         connections, 48 * connections, "concatenated; one row per connection"),
        ("clock, if kept as points: the matched exchanges' (A1, A4, D1, D4) (a stand-in: the fit reads segments, "
         "2 or more an exchange)", both, 32 * both,
         "hull of the union = hull of the partitions' hulls; robust path by time pieces"),
        ("execution classes: (class code int32, server time float64) of rows with a server time",
         int(has_server.sum()), 12 * int(has_server.sum()), "concatenated, then per class exact quantiles"),
        ("thread-pool timeline: (D1, D4, execution start, queue end, queue_min int64; group int32)",
         int(timed.sum()), 44 * int(timed.sum()), "k-way merge by D1 (each partition sorted)"),
    ]
    for col in LATENCY_COLUMNS:
        values = _column(table, col)
        count = int((~np.isnan(values)).sum())
        views.append((f"latency_s.{col.removesuffix('_s')}: its values (float64) for p50/p99", count, 8 * count,
                      "exact order statistics: a sort of the concatenation, or a radix select"))
    views.append(("slow-log search by text: rows without conn_id (rows_for_join ≈ 86 B a row)", no_id, 86 * no_id,
                  "concatenated; only for entries whose thread is not a known connection"))
    views.append(("row order: each row's global position (int64)", n, 8 * n, "k-way merge key"))
    return views


def dictionaries(path: Path) -> list[tuple[str, int, int, int]]:
    """Per dictionary-encoded column of the file: (column, entries in the dictionary, distinct values in the rows,
    bytes of the dictionary's text)."""
    names = [f.name for f in pq.ParquetFile(path).schema_arrow
             if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    out = []
    whole = pq.read_table(path, columns=names, read_dictionary=names)
    for name in names:
        col = whole.column(name)
        if not pa.types.is_dictionary(col.type) or not col.num_chunks:
            continue
        first = col.chunk(0).dictionary
        # each row group's chunk carries the dictionary page of its row group
        same = all(chunk.dictionary.equals(first) for chunk in col.chunks)
        used = len(set().union(*(set(np.unique(chunk.indices.drop_null().to_numpy())) for chunk in col.chunks)))
        size = sum(len(s.encode()) for s in first.to_pylist() if s is not None)
        out.append((name + ("" if same else " (row groups differ)"), len(first), used, size))
    return out


def row_order(table: pa.Table) -> list[str]:
    """The runs of `seen` in the file, and whether each run is in its point's order (req_first_ts, conn_index, seq
    within each capture)."""
    seen = _texts(table, "seen")
    change = np.flatnonzero(seen[1:] != seen[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(seen)]])
    runs = [(str(seen[s]), int(s), int(e)) for s, e in zip(starts, ends)]
    ts, _ = _ns(table, "req_first_ts")
    conn, seq = _column(table, "conn_index"), _column(table, "seq")
    capture = _texts(table, "capture")
    lines = [f"{len(runs)} run(s) of seen: " + ", ".join(f"{k} × {e - s:,}" for k, s, e in runs[:6])
             + (" …" if len(runs) > 6 else "")]
    for kind, s, e in runs[:6]:
        ordered = True
        for cap in dict.fromkeys(capture[s:e]):
            rows = np.flatnonzero(capture[s:e] == cap) + s
            key = np.lexsort((seq[rows], conn[rows], ts[rows]))
            ordered &= bool(np.array_equal(key, np.arange(len(rows))))
        lines.append(f"- run {kind} (rows {s:,}–{e - 1:,}): in (req_first_ts, conn_index, seq) order per capture: "
                     f"{ordered}")
    return lines


def pairwise_check(table: pa.Table) -> list[str]:
    """np.sum of each latency column's values (as latency_quantiles sums them: NaN left out) against the streaming
    sum fed a row group (131,072 rows, what the k-way merge hands the writer) at a time, and of the filled column
    (verdict._sum: NaN as 0)."""
    lines = []
    for col in LATENCY_COLUMNS:
        values = _column(table, col)
        for what, v in (("non-null values", values[~np.isnan(values)]),
                        ("NaN as 0", np.where(np.isnan(values), 0.0, values))):
            expected = float(np.add.reduce(v))
            stream = PairwiseSum(len(v))
            for start in range(0, len(v), ROW_GROUP):
                stream.add(v[start:start + ROW_GROUP])
            got = stream.result()
            sequential = float(np.cumsum(v)[-1]) if len(v) else 0.0
            lines.append(f"| {col} | {what} | {len(v):,} | {expected!r} | {got == expected} | "
                         f"{'same' if sequential == expected else repr(sequential)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="an analyze output folder (its exchanges.parquet)")
    parser.add_argument("--partitions", default="4,16,64,256", help="partition counts to measure (comma-separated)")
    parser.add_argument("--window-bits", type=int, default=WINDOW_BITS,
                        help=f"a piece: 2^N bytes of the request stream (default {WINDOW_BITS})")
    args = parser.parse_args()
    path = args.out / "exchanges.parquet"
    if not path.is_file():
        sys.exit(f"partition_views: {path} not found: run pcapdecomp analyze … -o {args.out} first")
    meta = pq.ParquetFile(path).metadata
    columns = ["capture", "conn_index", "conn_id", "client", "server", "seq", "req_first_ts", "seen", "db_client",
               "db_req_ts", "db_resp_ts", "req_tcp_seq", *LATENCY_COLUMNS]
    table = pq.read_table(path, columns=columns)
    n = table.num_rows
    print(f"{path}: {n:,} exchanges, {meta.num_columns} columns, {path.stat().st_size / n:,.0f} B an exchange on "
          f"disk; row groups {[meta.row_group(i).num_rows for i in range(meta.num_row_groups)]}\n")

    print("**Global views** (what the first pass keeps; fixed-width layout)\n")
    print("| view | rows | bytes | B per exchange | pieces combine by |")
    print("|---|---|---|---|---|")
    total = 0
    for name, rows, size, how in global_views(table, n):
        total += size
        print(f"| {name} | {rows:,} | {size:,} | {size / n:.1f} | {how} |")
    print(f"| **all of them** | | {total:,} | **{total / n:.1f}** | |\n")

    print("**Dictionaries** (categorical text: every row group's dictionary page is the column's whole category "
          "list, unused entries included)\n")
    print("| column | dictionary entries | distinct values in the rows | dictionary bytes |")
    print("|---|---|---|---|")
    for name, entries, used, size in dictionaries(path):
        print(f"| {name} | {entries:,} | {used:,} | {size:,} |")
    print()

    keys = partition_keys(table)
    distinct, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    print(f"**Partitions** ({len(distinct):,} connections by (client as the DB saw it, server); the largest "
          f"{counts.max():,} rows = {counts.max() / n:.1%} of the exchanges, the median {int(np.median(counts)):,})\n")
    print("| partitions | rows: largest | smallest | mean | largest / mean | empty |")
    print("|---|---|---|---|---|---|")
    hashed = stable_hash(keys)
    for parts in [int(p) for p in args.partitions.split(",")]:
        of = hashed % parts
        sizes = np.bincount(of, minlength=parts)
        print(f"| {parts} | {sizes.max():,} | {sizes.min():,} | {sizes.mean():,.0f} | "
              f"{sizes.max() / sizes.mean():.2f} | {int((sizes == 0).sum())} |")
    print()

    pieces = _column(table, "req_tcp_seq") >> args.window_bits  # the key alone: no endpoint (NAT may change those)
    _, piece_counts = np.unique(pieces, return_counts=True)
    print(f"**Partitions by pieces** ({len(piece_counts):,} pieces: windows of {2 ** args.window_bits:,} bytes of the "
          f"request streams' TCP sequence numbers; the largest {piece_counts.max():,} rows, the median "
          f"{int(np.median(piece_counts)):,})\n")
    print("| partitions | rows: largest | smallest | mean | largest / mean | empty |")
    print("|---|---|---|---|---|---|")
    hashed = stable_hash(pieces.astype(str).astype(object))
    for parts in [int(p) for p in args.partitions.split(",")]:
        sizes = np.bincount(hashed % parts, minlength=parts)
        print(f"| {parts} | {sizes.max():,} | {sizes.min():,} | {sizes.mean():,.0f} | "
              f"{sizes.max() / sizes.mean():.2f} | {int((sizes == 0).sum())} |")
    print()
    buckets = np.bincount(hashed % BUCKETS, minlength=BUCKETS)
    print(f"**Partitions as runs of {BUCKETS} buckets** (pieces hashed into {BUCKETS} buckets; a partition is a run "
          "of consecutive buckets, cut where the running count passes the next multiple of rows / P)\n")
    print("| partitions | rows: largest | smallest | mean | largest / mean |")
    print("|---|---|---|---|---|")
    for parts in [int(p) for p in args.partitions.split(",") if int(p) <= BUCKETS]:
        sizes = bucket_runs(buckets, parts)
        print(f"| {parts} | {sizes.max():,} | {sizes.min():,} | {sizes.mean():,.0f} | "
              f"{sizes.max() / sizes.mean():.2f} |")
    print()

    print("**Row order** of exchanges.parquet\n")
    print("\n".join(row_order(table)))
    print()

    print("**Sums** (numpy's pairwise sum of the whole column, against PairwiseSum fed the column in row "
          "order a row group at a time, and against a sequential sum)\n")
    print("| column | values | n | np.sum | streamed: equal | sequential sum |")
    print("|---|---|---|---|---|---|")
    print("\n".join(pairwise_check(table)))


if __name__ == "__main__":
    main()
