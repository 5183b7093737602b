#!/usr/bin/env python3
"""Memory and CPU of the partitioned run's paired rows (explain/partitioned.py, docs/partitioned.md step 7a)
against the in-memory path's same stage (Pairing.complete and explain.servers.joined_table), on a capture set
with an app and a DB point, or on its DB capture alone (`--db-alone`: what analyze --db makes of it):

    python3 benchmarks/partitioned_pass.py /tmp/pcapdecomp-bench/sysbench-rw-40s [--parts N] [--work DIR] [--db-alone]
        [--slow-log]

Two child processes, one after the other (each its own peak):
- `memory`: the stages as analyze --jobs 1 runs them (extract_points, pair_points, joined_table); Pairing.complete,
  fit_clocks and joined_table are marked: on entering, the child's VmHWM is reset (5 to /proc/self/clear_refs) and
  its VmRSS read; on leaving, VmHWM is the stretch's peak. It hands the clocks and the connections named without
  a greeting to the other child (a pickle in the work folder), which checks its own against them.
- `partitioned`: the two points extracted into the spill (read.extract.extract_all, their tables never read
  back), match.spilled_connection_step, the clocks (pair.clocks.spilled_clocks) and the connections named
  (explain.partitioned.spilled_names) from the spill — checked equal to the handed ones —, then explain.
  partitioned.PairedPartitions: its first pass, then its partitions (each run counted and let go: what step 7
  hands to the merged writer), each stretch marked alike. A DB capture alone: no connection step, no clock.
Then step 7b (explain/partitioned_decompose.py): decompose on the joined table in memory, and
DecomposedPartitions over the partitions (its first pass and selections, then its rows; each iterates
PairedPartitions, which makes the runs again: their cost is the runs' line above, counted in each). Without a slow
log by default; `--slow-log`: with the folder's slow.log, read as explain.servers reads it (by the memory child,
from its joined table: read_slow_log with the wire's statements) and handed to the other child, and the join's
own CPU noted (join_slow_log inside decompose; explain/partitioned_join.py's PartitionedJoin.finish inside
DecomposedPartitions' constructor: its first-pass share, the views written, is not in that note).
Prints a markdown table: per stretch its RSS at entry, its peak, the peak above entry, and CPU (user + system)."""

from __future__ import annotations

import argparse
import json
import pickle
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the decomposition's settings, as the lead's DB-capture command gives them (no slow log: step 7b's scope)
LONG_QUERY_TIME, THREAD_POOL_SIZE = 0.01, 2


def _status(field: str) -> int:
    """A field of /proc/self/status in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Marks:
    """The stretches measured: name → (RSS at entry, peak, CPU), each peak from a VmHWM reset at its entry."""

    def __init__(self):
        self.found: list[dict] = []

    def start(self) -> tuple[int, float]:
        Path("/proc/self/clear_refs").write_text("5")
        return _status("VmRSS"), _cpu()

    def stop(self, name: str, started: tuple[int, float], **more) -> None:
        rss, cpu = started
        self.found.append({"stretch": name, "entry": rss, "peak": _status("VmHWM"), "cpu": _cpu() - cpu, **more})

    def wrap(self, owner, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)

        def marked(*args, **kwargs):
            started = self.start()
            try:
                return original(*args, **kwargs)
            finally:
                self.stop(name, started)

        setattr(owner, attribute, marked)


def the_set(folder: Path, db_alone: bool):
    """The capture set of `folder`, without its app and proxy points when `db_alone`."""
    from pcapdecomp.analysis import capture_set

    cs = capture_set(folder)
    if db_alone:
        cs.points = [p for p in cs.points if p.kind == "db"]
        cs.proxy_servers = []
    return cs


class CpuOf:
    """The CPU (user + system) spent inside a function, summed over its calls (no VmHWM reset: it runs inside a
    measured stretch)."""

    def __init__(self, owner, attribute: str):
        self.seconds = 0.0
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            started = _cpu()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += _cpu() - started

        setattr(owner, attribute, timed)


def memory_side(folder: Path, work: Path, db_alone: bool, with_slow_log: bool) -> list[dict]:
    from pcapdecomp.analysis import Options
    from pcapdecomp.explain import servers
    from pcapdecomp.pair import clocks
    from pcapdecomp.pair.match import Pairing
    from pcapdecomp.pair.pairing import pair_points
    from pcapdecomp.read import connids
    from pcapdecomp.read.extract import extract_points

    marks = Marks()
    marks.wrap(Pairing, "complete", "in memory: Pairing.complete")
    marks.wrap(clocks, "fit_clocks", "in memory: fit_clocks")  # pair_points imports it when it calls it
    cs, options = the_set(folder, db_alone), Options(quiet=True)
    x = extract_points(cs, 1, True, options.max_sql_bytes, lambda _: None)
    paired = pair_points(x, cs, 1, options.max_sql_bytes, lambda _: None)
    conns = paired.db_conns
    mine = conns[conns["conn_id_source"].isin([connids.ANSWER, connids.PROCESSLIST]).to_numpy()] \
        if "conn_id_source" in conns else conns.iloc[:0]
    named = dict(zip(zip(mine["capture"].astype(str), mine["conn_index"].astype(int)), mine["conn_id"].astype(int)))
    (work / "inputs.pkl").write_bytes(pickle.dumps((repr(paired.clocks), paired.clock_info, paired.id_sources, named)))
    rows = len(paired.matching.app_row)
    started = marks.start()
    table = servers.joined_table(paired)
    marks.stop("in memory: joined_table", started, rows=len(table))
    assert len(table) == rows
    from pcapdecomp.explain import decompose as decomposing

    slow = None
    if with_slow_log:
        from pcapdecomp.read.captureset import time_zone
        from pcapdecomp.slowlog.join import wire_statements
        from pcapdecomp.slowlog.reader import read_slow_log

        slow, _ = read_slow_log(cs.slow_log, tz=time_zone(None), max_sql_bytes=options.max_sql_bytes,
                                wire=wire_statements(table))
    (work / "slow.pkl").write_bytes(pickle.dumps(slow))
    join_cpu = CpuOf(decomposing, "join_slow_log")
    started = marks.start()
    decomposed, join = decomposing.decompose(table, slow, LONG_QUERY_TIME, THREAD_POOL_SIZE)
    marks.stop(f"in memory: decompose ({'with the slow log' if with_slow_log else 'no slow log'})", started,
               rows=len(decomposed), **({"join_cpu_s": round(join_cpu.seconds, 2),
                                         "in_slow_log": int(decomposed["in_slow_log"].fillna(False).sum())}
                                        if with_slow_log else {}))
    return marks.found


def partitioned_side(folder: Path, work: Path, parts: int | None, db_alone: bool) -> list[dict]:
    from pcapdecomp.analysis import Options
    from pcapdecomp.explain.partitioned import PairedPartitions, spilled_names
    from pcapdecomp.pair.clocks import spilled_clocks
    from pcapdecomp.pair.match import spilled_connection_step
    from pcapdecomp.read.extract import extract_all
    from pcapdecomp.read.sources import parse_server
    from pcapdecomp.read.tlskeys import load_secrets

    marks = Marks()
    cs, options = the_set(folder, db_alone), Options(quiet=True)
    read = [*cs.of("app"), *cs.of("db")]
    endpoints = {parse_server(s) for s in cs.servers} or None
    started = marks.start()
    extractions = extract_all(read, endpoints, options.max_sql_bytes, 1, tls_secrets=load_secrets(cs.tls_keylogs, read),
                              spill=work / "spill")
    marks.stop(f"spilled: extract_all ({'the DB point' if db_alone else 'both points'})", started)
    app, db = extractions[:len(cs.of("app"))], extractions[len(cs.of("app")):]
    handed = pickle.loads((work / "inputs.pkl").read_bytes())
    step, clocks, clock_info = None, {}, {}
    if app:
        started = marks.start()
        step = spilled_connection_step(app, db)
        marks.stop("spilled: spilled_connection_step", started)
        started = marks.start()
        clocks, clock_info = spilled_clocks(cs.of("app"), cs.of("db"), app, db, step.connections, None, 1,
                                            lambda _: None)
        marks.stop("spilled: spilled_clocks", started)
    started = marks.start()
    id_sources, named = spilled_names(cs.processlist, {p.name: p for p in cs.points}, app, db, lambda _: None)
    marks.stop("spilled: spilled_names", started, named=len(named))
    if (repr(clocks), clock_info, id_sources, named) != handed:
        sys.exit("the spill's clocks or names are not the in-memory path's")
    started = marks.start()
    rows = PairedPartitions(app, db, step, clocks, id_sources=id_sources, named=named, parts=parts)
    marks.stop("spilled: PairedPartitions' first pass", started, partitions=len(rows.first_pass.partitions))
    started = marks.start()
    total, largest = 0, 0
    for run in rows:
        total += len(run.table)
        largest = max(largest, len(run.table))
        del run
    marks.stop("spilled: the partitions' runs", started, rows=total, largest=largest)
    from pcapdecomp.explain.partitioned_decompose import DecomposedPartitions
    from pcapdecomp.explain.partitioned_join import PartitionedJoin

    slow = pickle.loads((work / "slow.pkl").read_bytes())
    join_cpu = CpuOf(PartitionedJoin, "finish")
    started = marks.start()
    decomposed = DecomposedPartitions(rows, LONG_QUERY_TIME, THREAD_POOL_SIZE, work / "narrow", slow=slow)
    marks.stop("spilled: DecomposedPartitions' first pass, join and selections (the runs made again)"
               if slow is not None else "spilled: DecomposedPartitions' first pass and selections (the runs made "
               "again)", started, classes=decomposed.groups,
               **({"join_cpu_s": round(join_cpu.seconds, 2)} if slow is not None else {}))
    started = marks.start()
    total = in_log = 0
    for run in decomposed:
        total += len(run.table)
        in_log += int(run.table["in_slow_log"].fillna(False).sum())
        del run
    marks.stop("spilled: the decomposed partitions (the runs made again)", started, rows=total,
               **({"in_slow_log": in_log} if slow is not None else {}))
    return marks.found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a capture set with an app and a DB point")
    parser.add_argument("--parts", type=int, default=None, help="partitions (default: for 65,536 rows each)")
    parser.add_argument("--work", type=Path, default=None, help="the spill and the handed inputs (default: a temp)")
    parser.add_argument("--db-alone", action="store_true", help="the set's DB capture alone (analyze --db)")
    parser.add_argument("--slow-log", action="store_true", help="step 7b with the folder's slow log (its join)")
    parser.add_argument("--side", choices=["memory", "partitioned"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        found = memory_side(args.folder, args.work, args.db_alone, args.slow_log) if args.side == "memory" else \
            partitioned_side(args.folder, args.work, args.parts, args.db_alone)
        print(json.dumps(found))
        return
    with tempfile.TemporaryDirectory(prefix="partitioned-pass-") as temp:
        work = args.work or Path(temp)
        work.mkdir(parents=True, exist_ok=True)
        found = []
        for side in ("memory", "partitioned"):
            command = [sys.executable, __file__, str(args.folder), "--side", side, "--work", str(work)]
            if args.parts:
                command += ["--parts", str(args.parts)]
            if args.db_alone:
                command.append("--db-alone")
            if args.slow_log:
                command.append("--slow-log")
            done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
            if done.returncode:
                sys.exit(f"{side}: {done.stderr.strip()[-2000:]}")
            found += json.loads(done.stdout.strip().splitlines()[-1])
    mib = 1 << 20
    print("| stretch | RSS at entry MiB | peak MiB | peak above entry MiB | CPU s | notes |")
    print("|---|---|---|---|---|---|")
    for f in found:
        notes = ", ".join(f"{k} {v:,}" for k, v in f.items() if k not in ("stretch", "entry", "peak", "cpu"))
        print(f"| {f['stretch']} | {f['entry'] / mib:.1f} | {f['peak'] / mib:.1f} | {(f['peak'] - f['entry']) / mib:.1f} "
              f"| {f['cpu']:.2f} | {notes} |")


if __name__ == "__main__":
    main()
