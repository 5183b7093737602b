#!/usr/bin/env python3
"""Where the CPU of one `analyze` goes (issue 37, item 3; docs/partitioned.md §18): the interpreter's start and the
imports, each stage of the in-memory run, and the rest (summary.json's making, the output folder), as CPU seconds
(user + system, `time.process_time` in the run's own process), with the run's page faults. What a whole-process
timing cannot tell: how much of a run is the fixed cost that no per-exchange work changes.

    python3 benchmarks/cpu_split.py [--tree DIR] [--runs N] -- analyze --db D/db.pcap --slow-log D/slow.log …

Each run is a child process of DIR's code (default: this tree; its extensions built, its modules compiled: a
tree without .pyc files spends a second compiling them), the arguments given to `pcapdecomp`, with `-q` added.
Prints one line per run and the medians; times are CPU, not wall, and say nothing without the machine's load
(printed beside them)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# the stages of analysis.analyze and run.session.Run.finish, by the names their callers look them up with
STAGES = (("pcapdecomp.analysis", "extract_points"), ("pcapdecomp.analysis", "pair_points"),
          ("pcapdecomp.analysis", "explain_servers"), ("pcapdecomp.run.session", "summary_of"),
          ("pcapdecomp.run.session", "_write_tables"), ("pcapdecomp.run.session", "render_page"))

# the child: imports timed first, then each stage wrapped where its caller finds it; one JSON line on stderr
CHILD = """
import functools, importlib, json, resource, sys, time
started = time.process_time()
import pcapdecomp.cli as cli, pcapdecomp.analysis, pcapdecomp.run.session
imported = time.process_time()
spent = {}
for module, name in %r:
    owner = importlib.import_module(module)
    def timed(f, name=name):
        @functools.wraps(f)
        def call(*args, **kwargs):
            t = time.process_time()
            try:
                return f(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.process_time() - t
        return call
    setattr(owner, name, timed(getattr(owner, name)))
sys.argv = ["pcapdecomp", *sys.argv[1:]]
try:
    cli.main()
except SystemExit:
    pass
usage = resource.getrusage(resource.RUSAGE_SELF)
print("CPU_SPLIT " + json.dumps({"start and imports": imported, **spent, "total": time.process_time(),
                                 "page faults": usage.ru_minflt}), file=sys.stderr)
""" % (STAGES,)


def one_run(tree: Path, argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", CHILD, *argv, "-q"], cwd=tree, env=env, capture_output=True,
                          text=True)
    lines = [line for line in done.stderr.splitlines() if line.startswith("CPU_SPLIT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"cpu_split: the run failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    got = json.loads(lines[-1].split(" ", 1)[1])
    got["rest"] = got["total"] - got["start and imports"] - sum(got.get(name, 0.0) for _, name in STAGES)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=REPO, help="the tree whose code runs (default: this one)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- then pcapdecomp's arguments (analyze …)")
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv or argv[0] != "analyze":
        parser.error("give `-- analyze …`")
    columns = ["start and imports", *(name for _, name in STAGES), "rest", "total", "page faults"]
    print(" | ".join(["load", *columns]))
    runs = []
    for _ in range(args.runs):
        got = one_run(args.tree.resolve(), argv)
        runs.append(got)
        load = os.getloadavg()[0]
        print(" | ".join([f"{load:.1f}", *(f"{got.get(c, 0.0):.3f}" if c != "page faults" else f"{got[c]:,}"
                                           for c in columns)]), flush=True)
    print(" | ".join(["median", *(f"{statistics.median(r.get(c, 0.0) for r in runs):.3f}" if c != "page faults"
                                  else f"{statistics.median(r[c] for r in runs):,.0f}" for c in columns)]))


if __name__ == "__main__":
    main()
