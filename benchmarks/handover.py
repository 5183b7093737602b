#!/usr/bin/env python3
"""A forked worker's big result reaching the parent (pcapdecomp/core/workers.py, "Handing results back" in
docs/scale.md): through the pool's pipe, and through a file in shared memory the parent maps. The worker returns an
Extraction made before the fork (so the transfer alone is timed), the parent then reads every column once (what the
stages after it do). Prints, per route and round: wall time from submit to result, the read's time, CPU time of the
parent and of the worker, and minor page faults (a fresh page costs ~3.5 us on the benchmark machine).

    python3 benchmarks/handover.py CAPTURE [--rounds 3]"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's package

from pcapdecomp.core import workers  # noqa: E402
from pcapdecomp.read.exchanges import extract  # noqa: E402

EXTRACTION = None  # made before the workers are forked: they inherit it


def give():
    return EXTRACTION


def read_every_column(extraction) -> None:
    for column in extraction.exchanges.columns:
        extraction.exchanges[column].isna().sum()


def cpu_and_faults(who: int) -> tuple[float, int]:
    use = resource.getrusage(who)
    return use.ru_utime + use.ru_stime, use.ru_minflt


def main() -> None:
    global EXTRACTION
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("capture", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    EXTRACTION = extract(args.capture)
    print(f"{len(EXTRACTION.exchanges):,} exchanges, {EXTRACTION.exchanges.memory_usage().sum() / 1e6:.0f} MB "
          f"(arrays; text columns are categoricals)")
    shm = workers.HANDOVER_DIR or "/dev/shm"
    for _ in range(args.rounds):
        for route, directory in (("pipe", ""), ("handover", shm)):
            workers.HANDOVER_DIR = directory
            parent_before, worker_before = cpu_and_faults(resource.RUSAGE_SELF), cpu_and_faults(
                resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            with workers.Worker() as worker:
                got = worker.submit(give).result()
                arrived = time.perf_counter()
            read_every_column(got)
            read = time.perf_counter() - arrived
            parent, worker = cpu_and_faults(resource.RUSAGE_SELF), cpu_and_faults(resource.RUSAGE_CHILDREN)
            print(f"{route:9s} result {arrived - start:5.2f} s, then read {read:4.2f} s; CPU parent "
                  f"{parent[0] - parent_before[0]:4.2f} s, worker {worker[0] - worker_before[0]:4.2f} s; minor faults "
                  f"parent {parent[1] - parent_before[1]:,}, worker {worker[1] - worker_before[1]:,}", flush=True)
            del got


if __name__ == "__main__":
    main()
