#!/usr/bin/env python3
"""Memory of one `analyze` run, stage by stage: where the peak is and what each stage holds.

    python3 benchmarks/memory.py -- analyze /tmp/pcapdecomp-bench/sysbench-rw-10s --jobs 1 -q -o /tmp/out
    python3 benchmarks/memory.py --tree /work/main -- analyze …     # another checkout's code
    python3 benchmarks/memory.py --timeline t.tsv -- analyze …      # the samples too, one a line
    python3 benchmarks/memory.py --mark pcapdecomp.explain.summary:tell -- analyze …   # one more function marked
    python3 benchmarks/memory.py --spill /tmp/spill -- analyze …   # the extraction spills into buckets there

Runs the command in a child process (`python3 -m pcapdecomp.cli ARGS` of the tree) with the stages' functions
(STAGES, and --mark's) wrapped: on entering and leaving each, the child reads its VmRSS and VmHWM and resets
VmHWM (writing 5 to /proc/self/clear_refs), so each stretch between two marks has its exact peak, whatever the
sampling misses. A wrapper passes its arguments on without keeping them (a table handed over and let go inside
is freed as without the mark). This process samples the child's VmRSS and its smaps_rollup Pss every 15 ms
beside it. Prints a markdown table: per stage (the innermost one running, nested as "a > b"), its time, its peak
RSS and the RSS it leaves, both also above the baseline (the RSS when the extraction starts: the imports' and
the capture set's), per exchange (the rows of the output folder's exchanges.parquet). "Left" is RSS, not what is
live: freed heap not yet handed back counts. Linux only. Nothing is committed."""

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

# (module, attribute): the stages marked, outermost first; a class's method as "Class.method"
STAGES = [
    ("pcapdecomp.analysis", "extract_points"),
    ("pcapdecomp.read.extract", "extract_all"),  # the captures read; then their quality counted
    ("pcapdecomp.read.spill", "Spill.table"),  # with --spill: a point's table read back from its buckets
    ("pcapdecomp.analysis", "pair_points"),
    ("pcapdecomp.pair.pairing", "Pairing"),
    ("pcapdecomp.pair.repair", "repair_losses"),  # imported by pairing where two points pair
    ("pcapdecomp.pair.clocks", "fit_clocks"),
    ("pcapdecomp.read.connids", "name_connections"),
    ("pcapdecomp.analysis", "explain_servers"),
    ("pcapdecomp.explain.servers", "joined_table"),
    ("pcapdecomp.explain.servers", "build_table"),
    ("pcapdecomp.explain.servers", "apply_bounds"),
    ("pcapdecomp.explain.servers", "explain_server"),
    ("pcapdecomp.slowlog.join", "wire_statements"),
    ("pcapdecomp.slowlog.reader", "read_slow_log"),
    ("pcapdecomp.explain.servers", "decompose"),
    ("pcapdecomp.explain.decompose", "rows_for_join"),
    ("pcapdecomp.explain.decompose", "join_slow_log"),
    ("pcapdecomp.explain.decompose", "estimate_execution"),
    ("pcapdecomp.explain.servers", "thread_pool_view"),
    ("pcapdecomp.explain.threadpool", "_rows"),
    ("pcapdecomp.explain.threadpool", "pool_table"),
    ("pcapdecomp.explain.threadpool", "infer_thread_pool_size"),
    ("pcapdecomp.explain.threadpool", "infer_cap"),
    ("pcapdecomp.explain.threadpool", "group_table"),
    ("pcapdecomp.explain.threadpool", "find_stalls"),
    ("pcapdecomp.explain.servers", "with_declared_dtypes"),
    ("pcapdecomp.run.session", "Run.finish"),
    ("pcapdecomp.run.session", "summary_of"),
    ("pcapdecomp.explain.servers", "build_summary"),
    ("pcapdecomp.explain.servers", "tell_stories"),
    ("pcapdecomp.run.session", "_write_outputs"),
    ("pcapdecomp.run.session", "render_page"),
    ("pcapdecomp.run.session", "write_page"),
]


def _status() -> tuple[int, int]:
    """This process's VmRSS and VmHWM, bytes."""
    rss = hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) << 10
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) << 10
    return rss, hwm


def _child(marks: str, argv: list[str], extra: list[tuple[str, str]], spill: str | None = None) -> None:
    """In the child: wrap the stages (and `extra`), then run the CLI with `argv`; each mark is one JSON line in
    `marks`. `spill`: the folder the extraction spills into (read/spill.py; analyze has no option for it yet)."""
    import functools
    import importlib
    import inspect

    if spill:
        import pcapdecomp.analysis

        pcapdecomp.analysis.extract_points = functools.partial(pcapdecomp.analysis.extract_points, spill=Path(spill))

    out = open(marks, "a", buffering=1)

    def mark(name: str, what: str) -> None:
        rss, hwm = _status()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM from here on: the next stretch's own peak
        out.write(json.dumps({"t": time.monotonic(), "name": name, "what": what, "rss": rss, "hwm": hwm}) + "\n")

    def wrapped(name, fn):
        """fn with marks around it, taking the same parameters and passing them on without keeping a reference
        (a table handed to fn, which it lets go, is not held by the mark)."""
        params = list(inspect.signature(fn).parameters.values())  # a class's: its constructor's, less self
        heads, passes = [], []
        for p in params:
            handed = f"({p.name}, ({p.name} := None))[0]"
            if p.kind is p.VAR_POSITIONAL:
                heads.append(f"*{p.name}"), passes.append(f"*{p.name}")
            elif p.kind is p.VAR_KEYWORD:
                heads.append(f"**{p.name}"), passes.append(f"**{p.name}")
            elif p.kind is p.KEYWORD_ONLY:
                if not any(h.startswith("*") and not h.startswith("**") for h in heads):
                    heads.append("*")
                heads.append(p.name), passes.append(f"{p.name}={handed}")
            else:
                heads.append(p.name), passes.append(handed)
        source = (f"def run({', '.join(heads)}):\n    _mark_(_name_, 'enter')\n    try:\n"
                  f"        return _fn_({', '.join(passes)})\n    finally:\n        _mark_(_name_, 'exit')\n")
        scope = {"_mark_": mark, "_name_": name, "_fn_": fn}
        exec(source, scope)
        run = scope["run"]
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        run.__defaults__ = tuple(p.default for p in positional if p.default is not p.empty) or None
        run.__kwdefaults__ = {p.name: p.default for p in params
                              if p.kind is p.KEYWORD_ONLY and p.default is not p.empty} or None
        return functools.wraps(fn)(run)

    for module_name, attr in STAGES + extra:
        module = importlib.import_module(module_name)
        owner, _, method = attr.rpartition(".")
        holder = getattr(module, owner) if owner else module
        setattr(holder, method, wrapped(attr, getattr(holder, method)))
    mark("start", "enter")
    sys.argv = ["pcapdecomp", *argv]
    from pcapdecomp.cli import main

    try:
        main()
    finally:
        mark("start", "exit")


def _sample(pid: int, every: float, samples: list, done: threading.Event) -> None:
    """The child's VmRSS and Pss every `every` seconds until `done`."""
    while not done.is_set():
        try:
            rss = pss = 0
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1]) << 10
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss = int(line.split()[1]) << 10
            samples.append((time.monotonic(), rss, pss))
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(every)


def _rows(argv: list[str]) -> int | None:
    """The rows of the output folder's exchanges.parquet (-o/--out in `argv`)."""
    for i, a in enumerate(argv):
        if a in ("-o", "--out") and i + 1 < len(argv):
            try:
                import pyarrow.parquet as pq

                return pq.ParquetFile(Path(argv[i + 1]) / "exchanges.parquet").metadata.num_rows
            except Exception:
                return None
    return None


def stretches(events: list[dict]) -> list[dict]:
    """The stretches between two marks, each named by the stage innermost at it (nested as 'a > b'), with its peak
    (VmHWM at its end mark) and the RSS at its start and end."""
    stack: list[str] = []
    out = []
    for prev, ev in zip(events, events[1:]):
        if prev["what"] == "enter":
            stack.append(prev["name"])
        elif stack:
            stack.pop()
        out.append({"stage": " > ".join(stack[1:]) or "(outside)", "t0": prev["t"], "t1": ev["t"],
                    "peak": ev["hwm"], "rss0": prev["rss"], "rss1": ev["rss"]})
    return out


def report(events: list[dict], samples: list, rows: int | None) -> str:
    base = next(e["rss"] for e in events if e["name"] == "extract_points" and e["what"] == "enter")
    per = f" (B/exchange, {rows:,} exchanges)" if rows else ""
    lines = [f"baseline (RSS as the extraction starts): {base / 2**20:.0f} MiB; peak RSS "
             f"{max(e['hwm'] for e in events) / 2**20:.0f} MiB; peak Pss sampled "
             f"{max((s[2] for s in samples), default=0) / 2**20:.0f} MiB", "",
             f"| stage (innermost) | s | peak MiB | above base{per} | left MiB | above base{per} |",
             "|---|---|---|---|---|---|"]
    merged: dict[str, dict] = {}
    for s in stretches(events):  # a stage's stretches between its children: their maximum peak, its last exit
        m = merged.setdefault(s["stage"], {"s": 0.0, "peak": 0, "left": 0})
        m["s"] += s["t1"] - s["t0"]
        m["peak"] = max(m["peak"], s["peak"])
        m["left"] = s["rss1"]
    for stage, m in merged.items():
        if m["s"] < 0.005 and stage == "(outside)":
            continue

        def cell(v):
            return f"{(v - base) / 2**20:+.0f}" + (f" ({(v - base) / rows:,.0f})" if rows else "")
        lines.append(f"| {stage} | {m['s']:.2f} | {m['peak'] / 2**20:.0f} | {cell(m['peak'])} | "
                     f"{m['left'] / 2**20:.0f} | {cell(m['left'])} |")
    return "\n".join(lines)


def main() -> int:
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        extra = [tuple(m.split(":", 1)) for m in os.environ.get("PCAPDECOMP_MEMORY_MARKS", "").split(",") if m]
        _child(sys.argv[i + 1], sys.argv[i + 2:], extra, os.environ.get("PCAPDECOMP_MEMORY_SPILL"))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, default=REPO, help="the checkout whose code runs (default: this one)")
    p.add_argument("--every", type=float, default=0.015, help="seconds between samples")
    p.add_argument("--timeline", type=Path, help="write the samples and marks here (TSV)")
    p.add_argument("--mark", action="append", default=[], metavar="MODULE:ATTR",
                   help="mark this function too (where a caller looks it up: pcapdecomp.explain.summary:tell)")
    p.add_argument("--spill", type=Path, metavar="DIR",
                   help="the extraction spills its exchange rows into buckets in DIR (read/spill.py), read back after")
    p.add_argument("args", nargs="+", help="after --: the pcapdecomp command line (analyze …)")
    a = p.parse_args()
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as marks:
        env = dict(os.environ, PYTHONPATH=str(a.tree.resolve()), PCAPDECOMP_MEMORY_MARKS=",".join(a.mark),
                   PCAPDECOMP_MEMORY_SPILL=str(a.spill.resolve()) if a.spill else "")
        child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", marks.name, *a.args],
                                 cwd=a.tree, env=env)
        samples: list = []
        done = threading.Event()
        sampler = threading.Thread(target=_sample, args=(child.pid, a.every, samples, done), daemon=True)
        sampler.start()
        code = child.wait()
        done.set()
        sampler.join()
        events = [json.loads(line) for line in Path(marks.name).read_text().splitlines()]
    if a.timeline:
        with open(a.timeline, "w") as f:
            f.write("t\tkind\tname\trss\tpss\n")
            for t, rss, pss in samples:
                f.write(f"{t:.4f}\tsample\t\t{rss}\t{pss}\n")
            for e in events:
                f.write(f"{e['t']:.4f}\t{e['what']}\t{e['name']}\t{e['rss']}\t\n")
    print(report(events, samples, _rows(a.args)))
    return code


if __name__ == "__main__":
    sys.exit(main())
