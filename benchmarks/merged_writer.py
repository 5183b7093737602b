#!/usr/bin/env python3
"""The partitioned analysis' row key and merged writer (docs/partitioned.md §2.3, step 2) checked on real captures:
for each capture set, the row key of every exchange (pair.match.matching_row_keys) must sort today's table into
today's order, and exchanges.parquet written by core.outputs.write_merged from the table cut into P partitions by
the plan's key (§3) must be byte for byte the file analyze wrote, with the dictionaries explain.servers.
output_categories states.

    python3 benchmarks/merged_writer.py                      # the public corpus, each capture as --db, --app, both
    python3 benchmarks/merged_writer.py --sets captures/oltp-hogs /tmp/pcapdecomp-bench/sysbench-rw-10s
    python3 benchmarks/merged_writer.py --parts 1,3,16 --limit 20
    python3 benchmarks/merged_writer.py --timing 5 --parts 1,16 --sets /tmp/pcapdecomp-bench/sysbench-rw-10s

tests/test_merged_writer.py runs the same checks (these functions) on the bundled captures."""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.core.outputs import SortedRun, write_merged
from pcapdecomp.explain.servers import output_categories
from pcapdecomp.pair.match import matching_row_keys
from pcapdecomp.pair.pairing import pair_points
from pcapdecomp.read.captureset import CaptureSet
from pcapdecomp.read.extract import extract_points

BUCKETS = 256  # docs/partitioned.md §3: pieces of a request stream hashed into this many buckets
WINDOW_BITS = 16  # a piece: the requests whose TCP sequence number shares the bits above these (64 KiB)
GOLDEN = 0x9E3779B97F4A7C15  # Fibonacci hashing: a piece number times this, the top bits its bucket


@dataclass
class PairedInputs:
    """What the writer needs of the pairing, which pass 1 would gather from the partitions: each row's key (in the
    joined table's order) and what output_categories reads of the two sides' tables."""

    keys: np.ndarray
    app_categories: dict[str, list]
    db_categories: dict[str, list]
    db_rows: bool
    db_only_rows: bool
    matched_rows: bool
    statements_from_db: bool


def paired_inputs(cs: CaptureSet, options: Options) -> PairedInputs:
    """The stages up to the pairing (as analyze runs them with --jobs 1), and the row keys and category inputs of
    their result."""
    notes: list[str] = []
    x = extract_points(cs, 1, True, options.max_sql_bytes, notes.append)
    paired = pair_points(x, cs, 1, options.max_sql_bytes, notes.append)
    app, db, matching = paired.app_ex, paired.db_ex, paired.matching
    # each side's points in the order its table holds them: its captures by first row (a repair appends re-read
    # rows of captures already there)
    app_points = list(dict.fromkeys(app["capture"].astype(object)))
    db_points = list(dict.fromkeys(db["capture"].astype(object)))
    reread = paired.repair.reread_starts if paired.repair is not None else None
    keys = matching_row_keys(matching, app, db, app_points, db_points, reread)
    both = (matching.app_row >= 0) & (matching.db_row >= 0)
    a_sql = app["sql"].isna().to_numpy()[matching.app_row[both]]
    d_sql = db["sql"].notna().to_numpy()[matching.db_row[both]]

    def categories(table: pd.DataFrame) -> dict[str, list]:
        return {c: list(table[c].cat.categories) for c in table.columns
                if isinstance(table[c].dtype, pd.CategoricalDtype)}

    return PairedInputs(keys, categories(app), categories(db), len(db) > 0, bool((matching.app_row < 0).any()),
                        bool(both.any()), bool((a_sql & d_sql).any()))


def categories_of(table: pd.DataFrame, inputs: PairedInputs) -> dict[str, list]:
    """output_categories with the values present in `table` (what pass 1 would gather per partition)."""
    present = {c: table[c].dropna().astype(str).unique().tolist() for c in table.columns
               if isinstance(table[c].dtype, pd.CategoricalDtype)}
    return output_categories(inputs.app_categories, inputs.db_categories, present, db_rows=inputs.db_rows,
                             db_only_rows=inputs.db_only_rows, matched_rows=inputs.matched_rows,
                             statements_from_db=inputs.statements_from_db)


def partition_of(table: pd.DataFrame, parts: int) -> np.ndarray:
    """Each row's partition by the plan's key (§3): its request's TCP sequence number >> WINDOW_BITS, hashed into
    BUCKETS buckets; a partition is a run of consecutive buckets, cut where the running count of rows reaches the
    next multiple of rows / parts."""
    piece = table["req_tcp_seq"].to_numpy(dtype=np.int64, na_value=0).astype(np.uint64) >> np.uint64(WINDOW_BITS)
    bucket = ((piece * np.uint64(GOLDEN)) >> np.uint64(64 - 8)).astype(np.int64)  # 8 bits: 256 buckets
    ends = np.cumsum(np.bincount(bucket, minlength=BUCKETS))
    targets = ends[-1] * np.arange(1, parts + 1) / parts if len(ends) else np.zeros(parts)
    last_bucket = np.minimum(np.searchsorted(ends, targets, side="left"), BUCKETS - 1)  # each partition's last
    last_bucket[-1] = BUCKETS - 1
    return np.searchsorted(last_bucket, bucket, side="left")


def sorted_runs(table: pd.DataFrame, keys: np.ndarray, parts: int, seed: int = 0) -> list[SortedRun]:
    """`table` cut into `parts` partitions (partition_of), each partition's rows shuffled and then sorted by their
    keys: the runs pass 2 would write."""
    rng = np.random.default_rng(seed)
    of = partition_of(table, parts)
    runs = []
    for p in range(parts):
        rows = rng.permutation(np.flatnonzero(of == p))
        rows = rows[np.lexsort(keys[rows].T[::-1])]
        runs.append(SortedRun(table.take(rows).reset_index(drop=True), keys[rows]))
    return runs


def key_sorts_the_table(keys: np.ndarray) -> bool:
    """The keys are distinct and already in their order: sorting by them gives the table's own order."""
    return bool(np.array_equal(np.lexsort(keys.T[::-1]), np.arange(len(keys)))
                and len(np.unique(keys, axis=0)) == len(keys))


def check_set(cs: CaptureSet, options: Options, work: Path, parts: tuple[int, ...]) -> dict:
    """analyze of `cs` into `work`/out, the row keys of its pairing, and exchanges.parquet written again by
    write_merged for each P in `parts`: whether the key sorts the table and whether each file is the same."""
    result = analyze(cs, options, work / "out")
    table = result.held_exchanges
    inputs = paired_inputs(cs, options)
    written = work / "out" / "exchanges.parquet"
    out = {"rows": len(table), "classes": np.bincount(inputs.keys[:, 0], minlength=3).tolist() if len(table) else [],
           "reread": int((inputs.keys[:, 1] >= 0).sum()), "key_sorts": key_sorts_the_table(inputs.keys)}
    categories = categories_of(table, inputs)
    out["categories_as_today"] = all(list(table[c].cat.categories) == categories[c] for c in categories)
    for p in parts:
        merged = work / f"merged-{p}.parquet"
        write_merged(sorted_runs(table, inputs.keys, p), merged, categories)
        out[f"same_{p}"] = filecmp.cmp(written, merged, shallow=False)
    return out


def _cpu(work) -> float:
    started = time.process_time()
    work()
    return time.process_time() - started


def timings(cs: CaptureSet, options: Options, work: Path, parts: tuple[int, ...], repeats: int) -> list[str]:
    """CPU seconds (this process, user + system; medians of `repeats`, the two sides alternated) of exchanges.parquet
    written by write_table (today) and by write_merged from P runs (the runs made beforehand), and of core/exact.py's
    pieces against numpy on the table's total_s (latency_quantiles' sum and p50/p99, the profile's per-fingerprint
    sums) fed a row group (131,072 rows) at a time."""
    from pcapdecomp.core.exact import ClassSums, PairwiseSum, nearest_rank_of_runs
    from pcapdecomp.core.groups import group_sum, nearest_rank
    from pcapdecomp.core.outputs import write_table

    result = analyze(cs, options, work / "out")
    table = result.held_exchanges
    inputs = paired_inputs(cs, options)
    categories = categories_of(table, inputs)
    lines = []
    runs = {p: sorted_runs(table, inputs.keys, p) for p in parts}
    today, merged = [], {p: [] for p in parts}
    for _ in range(repeats):
        today.append(_cpu(lambda: write_table(table, work / "today.parquet")))
        for p in parts:
            merged[p].append(_cpu(lambda: write_merged(runs[p], work / "merged.parquet", categories)))
    lines.append(f"write_table: {np.median(today):.3f} s; " + "; ".join(
        f"write_merged of {p} runs: {np.median(merged[p]):.3f} s" for p in parts))
    values = table["total_s"].to_numpy(dtype="float64", na_value=np.nan)
    present = values[~np.isnan(values)]
    codes = table["fingerprint"].cat.codes.to_numpy().astype(np.int64)
    codes[codes < 0] = codes.max(initial=0) + 1
    classes = int(codes.max(initial=0)) + 1
    step = 1 << 17

    def streamed_sum():
        total = PairwiseSum(len(present))
        for s in range(0, len(present), step):
            total.add(present[s:s + step])
        return total.result()

    def class_sums():
        sums = ClassSums(classes)
        for s in range(0, len(values), step):
            sums.add(codes[s:s + step], values[s:s + step])
        return sums.result()

    pairs = [("np.sum", lambda: np.sum(present), "PairwiseSum", streamed_sum),
             ("nearest_rank", lambda: nearest_rank(present, [0.5, 0.99]), "nearest_rank_of_runs of sorted row groups",
              lambda: nearest_rank_of_runs([np.sort(present[s:s + step]) for s in range(0, len(present), step)],
                                           [0.5, 0.99])),
             ("group_sum", lambda: group_sum(codes, values, classes), "ClassSums", class_sums)]
    for name_a, a, name_b, b in pairs:
        ta, tb = [], []
        for _ in range(repeats):
            ta.append(_cpu(a))
            tb.append(_cpu(b))
        lines.append(f"{name_a}: {np.median(ta) * 1e3:.1f} ms; {name_b}: {np.median(tb) * 1e3:.1f} ms "
                     f"({len(values):,} rows)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="*", type=Path, help="capture-set folders (default: the public corpus)")
    parser.add_argument("--parts", default="1,3,16", help="partition counts (comma-separated)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many corpus captures")
    parser.add_argument("--after", default="", help="start after the case of this name (a sweep resumed)")
    parser.add_argument("--timing", type=int, default=0, metavar="N",
                        help="instead of the checks, time the writers and core/exact.py on --sets (medians of N)")
    args = parser.parse_args()
    parts = tuple(int(p) for p in args.parts.split(","))
    cases: list[tuple[str, CaptureSet, Options]] = []
    if args.sets:
        for folder in args.sets:
            if (folder / "capture.toml").exists():
                cases.append((str(folder), capture_set(folder), Options(quiet=True, jobs=1)))
            else:  # a recording of the lab's benchmark (app.pcap, db.pcap, slow.log)
                cases.append((str(folder), capture_set(app=[folder / "app.pcap"], db=folder / "db.pcap",
                                                       slow_log=folder / "slow.log", long_query_time=0.01,
                                                       thread_pool_size=2), Options(quiet=True, jobs=1)))
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from corpus import CORPUS, capture_files

        files = capture_files()[:args.limit or None]
        for rel in files:
            path = CORPUS / rel
            for mode in ("db", "app", "both"):
                cases.append((f"{rel} as {mode}", capture_set(app=[path] if mode != "db" else [],
                                                              db=path if mode != "app" else None),
                              Options(quiet=True, jobs=1)))
    if args.after:
        names = [name for name, _, _ in cases]
        cases = cases[names.index(args.after) + 1:] if args.after in names else cases
    if args.timing:
        for name, cs, options in cases:
            with tempfile.TemporaryDirectory(prefix="merged-writer-") as tmp:
                print(f"{name}:\n- " + "\n- ".join(timings(cs, options, Path(tmp), parts, args.timing)))
        return
    print("| capture set | rows | matched, app only, DB only | re-read | key sorts | categories | "
          + " | ".join(f"P = {p}: same" for p in parts) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(parts))
    failed = with_rows = 0
    started = time.process_time()
    for name, cs, options in cases:
        with tempfile.TemporaryDirectory(prefix="merged-writer-") as tmp:
            try:
                r = check_set(cs, options, Path(tmp), parts)
            except Exception as err:  # a capture analyze refuses (no MySQL in it): said, and the sweep goes on
                print(f"| {name} | {type(err).__name__}: {str(err)[:80]} |" + " |" * (4 + len(parts)))
                continue
        if not r["rows"]:
            continue
        with_rows += 1
        good = r["key_sorts"] and r["categories_as_today"] and all(r[f"same_{p}"] for p in parts)
        failed += not good
        print(f"| {name} | {r['rows']:,} | {', '.join(map(str, r['classes']))} | {r['reread']} | {r['key_sorts']} | "
              f"{r['categories_as_today']} | " + " | ".join(str(r[f"same_{p}"]) for p in parts) + " |")
    print(f"\n{with_rows} capture sets with exchanges, {failed} not the same; "
          f"{time.process_time() - started:.1f} s of CPU")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
