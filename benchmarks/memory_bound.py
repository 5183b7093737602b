#!/usr/bin/env python3
"""The memory bound of `analyze` (--memory) against the peaks it bounds: for each recording, the pair and the DB
capture alone, with --jobs 1 and the default --jobs, the exchanges, the peak `analyze` predicted from its counts
(core.memory.predicted_peak, as its check computed it), the measured peaks, and their ratio.

    python3 benchmarks/memory_bound.py                                   # the recordings of /tmp/pcapdecomp-bench
    python3 benchmarks/memory_bound.py /tmp/pcapdecomp-bench/sysbench-rw-10s --jobs 1
    python3 benchmarks/memory_bound.py --tree /work/main …               # another checkout's code
    python3 benchmarks/memory_bound.py --spill both …                    # and the partitioned run (--spill)

Each run is `python3 -m pcapdecomp.cli analyze … -q -o TMP` of the tree in a child process whose MemoryBound.check
is wrapped to write down its counts and prediction. Measured: the child's own maximum RSS (its VmHWM as it exits:
exact) and, sampled every 20 ms, the process tree's summed Pss (shared pages split between the processes
that share them: what the tree takes from the machine) and summed RSS (shared pages counted in each). The ratio is
the prediction over the larger of the child's maximum RSS and the tree's Pss peak: ≥ 1 is a bound. The last columns
are the measured peak above the process's memory at the start, per exchange at the DB point(s) (with a pair, its
app twin's cost in it): what core.memory's per-unit costs are fitted to (docs/scale.md, "Memory: the stated
bound"), and the run's wall time. Linux only; nothing is committed."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from pcapdecomp.core.memory import tree_rollup  # noqa: E402  (this checkout's, whatever --tree runs)
BENCH = Path("/tmp/pcapdecomp-bench")
RECORDINGS = ["sysbench-10s", "sysbench-rw-10s", "sysbench-rw-40s", "sysbench-rw-150s"]

_CHILD = """
import json, os, sys
from pcapdecomp.core import memory
seen, path = {}, sys.argv[1]
check = memory.MemoryBound.check
def wrapped(self, counts, *rest, **given):  # (span_ns, window: as each tree's check takes them)
    try:
        return check(self, counts, *rest, **given)
    finally:
        seen.update(predicted=self.predicted, start=self.start, jobs=self.jobs, limit=self.limit,
                    counts=vars(counts), partitioned=bool(given.get("partitioned")))
        with open(path, "w") as f:  # now: a run that succeeds ends with os._exit (cli.main)
            f.write(json.dumps(seen))
memory.MemoryBound.check = wrapped
def high_water_mark():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))
def write_hwm():
    seen["hwm"] = high_water_mark()
    with open(path, "w") as f:
        f.write(json.dumps(seen))
exit_now = os._exit
def exiting(code):  # a run that succeeds ends with os._exit (cli.main): atexit would not run
    write_hwm()
    exit_now(code)
os._exit = exiting
sys.argv = ["pcapdecomp", *sys.argv[2:]]
from pcapdecomp.cli import main
try:
    main()
finally:
    write_hwm()
"""


def _sample(pid: int, peaks: dict, done: threading.Event) -> None:
    """The tree's summed Pss and RSS every 20 ms: their maxima into `peaks`."""
    while not done.is_set():
        pss, rss = tree_rollup(pid)
        peaks["pss"] = max(peaks.get("pss", 0), pss)
        peaks["rss"] = max(peaks.get("rss", 0), rss)
        time.sleep(0.02)


def measure(tree: Path, args: list[str], spill: bool = False) -> dict:
    """One `analyze` run of `tree`'s code with `args` (partitioned, `--spill` into its temporary folder, when
    `spill`): its prediction and measured peaks."""
    with tempfile.TemporaryDirectory(prefix="memory-bound-") as tmp:
        seen = Path(tmp) / "seen.json"
        if spill:
            args = [*args, "--spill", tmp]
        env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(seen), "analyze", *args, "-q", "-o",
                                  str(Path(tmp) / "out")], cwd=tree, env=env)
        peaks: dict = {}
        done = threading.Event()
        sampler = threading.Thread(target=_sample, args=(child.pid, peaks, done), daemon=True)
        sampler.start()
        started = time.monotonic()
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.monotonic() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        sampler.join()
        result = json.loads(seen.read_text()) if seen.exists() and seen.stat().st_size else {}
    # the child's own high-water mark (VmHWM, read as it exits), not getrusage's ru_maxrss: Linux hands a child the
    # RSS its parent had when it forked (the mm that exec replaces is the parent's copy), so under a fat parent (a
    # test process) ru_maxrss is the parent's size
    maxrss = result.pop("hwm", None)
    return {**result, "code": child.returncode, "maxrss": maxrss if maxrss is not None else usage.ru_maxrss << 10,
            "pss": peaks.get("pss", 0),
            "rss": peaks.get("rss", 0), "s": elapsed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recordings", nargs="*", type=Path, help="capture-set folders (default: those of "
                                                            f"{BENCH} that exist: {', '.join(RECORDINGS)})")
    p.add_argument("--tree", type=Path, default=REPO, help="the checkout whose code runs (default: this one)")
    p.add_argument("--jobs", default="1,default", help="--jobs values, comma-separated; 'default': none given")
    p.add_argument("--shapes", default="pair,db", help="pair (the folder), db (the DB capture alone)")
    p.add_argument("--spill", default="no", choices=("no", "yes", "both"),
                   help="the partitioned run (analyze --spill): no, yes, or both runs of each configuration")
    a = p.parse_args()
    folders = a.recordings or [BENCH / r for r in RECORDINGS if (BENCH / r / "db.pcap").exists()]
    mib = 1 << 20
    print("| recording | shape | --jobs | --spill | exchanges (DB) | connections | start MiB | predicted MiB | max RSS MiB | "
          "tree Pss MiB | tree RSS MiB | predicted / peak | peak above start, B per DB exchange | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for folder in folders:
        for shape in a.shapes.split(","):
            args = [str(folder)] if shape == "pair" else [
                "--db", str(folder / "db.pcap"), "--slow-log", str(folder / "slow.log"), "--long-query-time", "0.01",
                "--thread-pool-size", "2"]
            for jobs, spill in ((j, s) for j in a.jobs.split(",")
                                for s in {"no": (False,), "yes": (True,), "both": (False, True)}[a.spill]):
                m = measure(a.tree, args + ([] if jobs == "default" else ["--jobs", jobs]), spill)
                peak = max(m["maxrss"], m["pss"])
                counts = m.get("counts") or {}
                exchanges = counts.get("db_exchanges", 0) + counts.get("other_exchanges", 0)
                predicted = m.get("predicted")
                # a set the partitioned run does not take (a pair that lost frames: a lossy recording) is analysed
                # in memory: its last check predicted the in-memory run, and the row says so
                said = ("yes" if m.get("partitioned", True) else "yes, **analysed in memory** (frames lost?)") \
                    if spill else "no"
                print(f"| {folder.name} | {shape} | {m.get('jobs', jobs)} | {said} | {exchanges:,} "
                      f"({counts.get('db_exchanges', 0):,}) | "
                      f"{counts.get('connections', 0):,} | {m.get('start', 0) / mib:,.0f} | "
                      f"{predicted / mib if predicted else 0:,.0f} | {m['maxrss'] / mib:,.0f} | "
                      f"{m['pss'] / mib:,.0f} | "
                      f"{m['rss'] / mib:,.0f} | {predicted / peak if predicted else 0:.2f} | "
                      f"{(peak - m.get('start', 0)) / max(counts.get('db_exchanges', 0), 1):,.0f} | {m['s']:.1f} |"
                      + (f" exit {m['code']}" if m["code"] else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
