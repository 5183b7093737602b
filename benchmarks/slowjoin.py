#!/usr/bin/env python3
"""Speed of the slow-log reader and of the slow-log join, and how they grow.

    python3 benchmarks/slowjoin.py                 # sizes 10k, 40k, 160k entries
    python3 benchmarks/slowjoin.py --sizes 1000,4000

Reader: the bundled slowlog-forms log (44 entries of every form, recorded from MariaDB) repeated to the size,
written to /tmp and read with read_slow_log. Join: n statements on n/10 connections, 100 a second, every one in
the log with whole-second times (MariaDB's resolution), in three shapes: distinct texts; one identical text with
the connection ids on the wire (order decides); one identical text mid-stream (no ids: every entry ambiguous).
Prints a markdown table of seconds and µs per entry. Nothing is committed."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pcapdecomp.slowlog.join import join_slow_log  # noqa: E402
from pcapdecomp.slowlog.reader import read_slow_log  # noqa: E402


def statements(n: int, shape: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    t0 = 1_795_000_000 * 10**9
    start = t0 + np.arange(n, dtype=np.int64) * 10_000_000
    conns = 1000 + np.arange(n) % max(n // 10, 1)
    text = [f"SELECT c FROM sbtest1 WHERE id = {i}" for i in range(n)] if shape == "distinct" else ["SELECT 1"] * n
    ids = shape != "mid-stream"
    rows = pd.DataFrame({"conn_id": pd.array(conns if ids else [pd.NA] * n, dtype="Int64"),
                         "conn_key": [f"c{c}" for c in conns], "command": "COM_QUERY", "sql": text, "params": None,
                         "sql_cut": False, "client_ip": None, "db_clock": True,
                         "start_ns": pd.array(start, dtype="Int64"), "end_ns": pd.array(start + 1_000_000, dtype="Int64")})
    naught = pd.Series(pd.NaT, index=range(n), dtype="datetime64[ns, UTC]")
    slow = pd.DataFrame({"line": np.arange(n) * 5 + 1, "thread_id": pd.array(conns, dtype="Int64"),
                         "query_time_ns": pd.array(np.full(n, 900_000), dtype="Int64"), "sql": text,
                         "admin_command": None, "cut": False, "ip": None, "host": "app",
                         "timestamp": pd.to_datetime(start // 10**9 * 10**9, unit="ns", utc=True),
                         "time": naught, "start": naught, "end": naught, "time_meaning": None,
                         "time_precision_ns": pd.array([10**9] * n, dtype="Int64")})
    return rows, slow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,40000,160000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print("| what | entries | seconds | µs per entry |")
    print("|---|---|---|---|")
    forms = (REPO / "captures" / "slowlog-forms" / "slow.log").read_text(errors="replace")
    header, _, body = forms.partition("# Time:")
    body = "# Time:" + body
    per = body.count("# Query_time:")
    for n in sizes:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "slow.log"
            path.write_text(header + body * max(n // per, 1))
            t = time.perf_counter()
            frame, _ = read_slow_log(path)
            dt = time.perf_counter() - t
        print(f"| read_slow_log (slowlog-forms repeated) | {len(frame)} | "
              f"{dt:.2f} | {dt / len(frame) * 1e6:.0f} |")
    for shape in ("distinct", "identical, with ids", "mid-stream"):
        for n in sizes:
            rows, slow = statements(n, shape.split(",")[0] if shape != "identical, with ids" else "ids")
            t = time.perf_counter()
            join = join_slow_log(rows, slow)
            dt = time.perf_counter() - t
            print(f"| join: {shape} (joined {join.stats['matched']}) | {n} | {dt:.2f} | {dt / n * 1e6:.0f} |")


if __name__ == "__main__":
    main()
