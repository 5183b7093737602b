"""What summary.json's parts cost made from the partitions' runs (explain.summaryruns, docs/partitioned.md step
7c) against today's whole-table code for the same parts: the six parts alone (summary._counts,
connids.conn_id_sources, summary.latency_quantiles, verdict._sane, _queueing, _victims), and, with --build,
today's summary stage whole: summary.build (those and the verdict: story, bullets, text) and stories.tell
(connections, network, playbook), from the table or from the runs (summary.json's whole content). The memory each allocates above what it is handed (tracemalloc peak; the table, or the runs,
already held) and its CPU (time.process_time), the two alternated, medians. Checks the two give the same JSON text
each time.

    python3 benchmarks/summary_runs.py /tmp/pcapdecomp-bench/sysbench-rw-40s [--db-only] [--build] [--parts 1,10]
        [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.explain import servers, stories, verdict
from pcapdecomp.explain.summary import _counts, build, latency_quantiles, to_json
from pcapdecomp.explain.summaryruns import SummaryOfRuns
from pcapdecomp.read.connids import conn_id_sources

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("merged_writer", HERE / "merged_writer.py")
merged_writer = importlib.util.module_from_spec(_spec)
sys.modules["merged_writer"] = merged_writer
_spec.loader.exec_module(merged_writer)


def today(x, view) -> dict:
    """The parts as summary.build and verdict.tell make them of the whole table."""
    sane = verdict._sane(x, view)
    hidden = x["hidden_slow"].to_numpy(dtype=bool, na_value=False) & sane
    understated = x["understated"].to_numpy(dtype=bool, na_value=False) & sane
    return {"exchanges": _counts(x), "conn_ids": conn_id_sources(x), "latency_s": latency_quantiles(x),
            "queueing": verdict._queueing(x, sane), "hidden_slow": verdict._victims(x, hidden, view),
            "understated": {**verdict._victims(x, understated, view), "threshold_s": verdict.STALL_MIN_QUEUE_S}}


def measured(make) -> tuple[float, float, str]:
    """(tracemalloc peak MiB above the start, CPU s, the parts' JSON text) of one call."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    start = tracemalloc.get_traced_memory()[0]
    cpu = time.process_time()
    parts = make()
    cpu = time.process_time() - cpu
    peak = tracemalloc.get_traced_memory()[1] - start
    tracemalloc.stop()
    return peak / 2**20, cpu, to_json(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", type=Path, help="a folder with db.pcap, slow.log (and app.pcap)")
    parser.add_argument("--db-only", action="store_true", help="analyze the DB capture alone")
    parser.add_argument("--parts", default="1,10")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--build", action="store_true", help="summary.build whole (the verdict too)")
    args = parser.parse_args()
    f = args.recording
    cs = capture_set(app=[] if args.db_only else [f / "app.pcap"], db=f / "db.pcap", slow_log=f / "slow.log",
                     long_query_time=0.01, thread_pool_size=2)
    options = Options(quiet=True, jobs=1)
    handed = {}
    told = {}
    servers.build_summary = lambda *a, **k: (handed.update(k, cs=a[0]), build(*a, **k))[1]
    servers.tell_stories = lambda summary, x, conns, settings=None, runs=None: (
        told.update(conns=conns, settings=settings), stories.tell(summary, x, conns, settings, runs=runs))[1]
    with tempfile.TemporaryDirectory() as work:
        analyze(cs, options, Path(work) / "out")
        written_text = (Path(work) / "out" / "summary.json").read_text()
        written = json.loads(written_text)
    servers.build_summary, servers.tell_stories = build, stories.tell
    kwargs = {k: v for k, v in handed.items() if k != "cs"}

    def summary_stage(**given) -> dict:
        """summary.build and the stories, as servers.summary_of makes summary.json's content."""
        summary = build(cs, **{**kwargs, **given})
        stories.tell(summary, given.get("exchanges", x), told["conns"], told["settings"], runs=given.get("runs"))
        return summary

    x, view = handed["exchanges"], handed["servers"][0].view
    keys = merged_writer.paired_inputs(cs, options).keys
    outliers = keys[np.asarray(view.outliers, dtype=np.int64)]
    culprits = [keys[np.asarray(c, dtype=np.int64)] for _, c in view.stall_members]
    cap = tuple(keys[np.asarray(m, dtype=np.int64)] for m in view.cap_members) if view.cap_members else None
    victims = [keys[np.asarray(v, dtype=np.int64)] for v, _ in view.stall_members]
    wanted = (written_text if args.build else
              to_json({k: written[k] for k in json.loads(to_json(today(x, view)))}))
    print(f"{f.name}{' (DB alone)' if args.db_only else ''}: {len(x):,} rows; hidden_slow "
          f"{written['hidden_slow']['count']}, understated {written['understated']['count']}")
    results: dict[str, list] = {}
    for _ in range(args.repeat):
        for p in ["today", *args.parts.split(",")]:
            if p == "today":
                got = measured(lambda: summary_stage() if args.build else today(x, view))
            else:
                runs = merged_writer.sorted_runs(x, keys, int(p), seed=int(p))

                def made():
                    fed = SummaryOfRuns(runs, outliers, culprits, stall_victims=victims, cap_members=cap).feed_all()
                    return summary_stage(exchanges=None, runs=fed) if args.build else fed.parts()

                got = measured(made)
                del runs
            assert got[2] == wanted, p
            results.setdefault(p, []).append(got[:2])
    print("| route | tracemalloc peak MiB (median) | CPU s (median; all) |")
    print("|---|---|---|")
    for p, rows in results.items():
        name = "today: whole table" if p == "today" else f"runs, P = {p}"
        cpu = [c for _, c in rows]
        print(f"| {name} | {statistics.median(m for m, _ in rows):.1f} | {statistics.median(cpu):.3f} "
              f"({', '.join(f'{c:.3f}' for c in cpu)}) |")


if __name__ == "__main__":
    main()
