#!/usr/bin/env python3
"""What TLS costs pcapdecomp: `analyze` and `exchanges` of a TLS 1.3 pair with its key log, of the same pair
without it (timed flights), of the same workload in plaintext, and tshark with the key log, same machine, same run.

    python3 benchmarks/tls.py                      # records 60 s of group-stall-tls13 and group-stall-cleartext (root)
    python3 benchmarks/tls.py --seconds 20
    python3 benchmarks/tls.py --tls DIR --plain DIR  # or takes two capture-set folders (DIR/tls-keys.log the key log)

Prints a markdown table: run, wall seconds (median of --runs), CPU seconds of the child and its workers (user +
system, median), peak memory (PSS, as benchmarks/bench.py samples it) and the statements read. Nothing is committed;
recordings go to a temporary folder."""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import _tree_memory_kib  # noqa: E402


def measure(argv: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s of the child and what it waited for, peak MiB PSS) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_memory_kib(proc.pid))
        time.sleep(0.05)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"tls bench: {argv[:4]} failed (exit {proc.returncode}): {proc.stderr.read().strip()[-400:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, peak / 1024


def median_run(argv: list[str], runs: int) -> tuple[float, float, float]:
    got = [measure(argv) for _ in range(runs)]
    return (statistics.median(g[0] for g in got), statistics.median(g[1] for g in got), max(g[2] for g in got))


def statements(folder: Path) -> int:
    return sum(1 for line in (folder / "truth.jsonl").read_text().splitlines() if line.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tls", type=Path, help="a TLS capture set (app.pcap, db.pcap, slow.log, tls-keys.log)")
    parser.add_argument("--plain", type=Path, help="the same workload in plaintext")
    parser.add_argument("--seconds", type=float, default=60.0, help="workload seconds when recording")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pcd-tls-bench-"))
    tls, plain = args.tls, args.plain
    for name, given in (("group-stall-tls13", tls), ("group-stall-cleartext", plain)):
        if given is None:
            subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "lab", "record", name, "--out", str(work / name),
                            "--duration", str(args.seconds)], check=True, cwd=REPO)
    tls = tls or work / "group-stall-tls13"
    plain = plain or work / "group-stall-cleartext"
    keys = tls / "tls-keys.log"
    nokeys = work / "tls-without-keys"
    nokeys.mkdir(exist_ok=True)
    for f in ("app.pcap", "db.pcap", "slow.log", "capture.toml"):
        (nokeys / f).write_bytes((tls / f).read_bytes())
    cli = [sys.executable, "-m", "pcapdecomp.cli"]
    rows = [
        ("analyze, TLS 1.3 pair with the key log", cli + ["analyze", str(tls), "-o", str(work / "a1"), "-q", "-j", "1"],
         statements(tls)),
        ("analyze, the TLS pair without a key log", cli + ["analyze", str(nokeys), "-o", str(work / "a2"), "-q", "-j", "1"],
         statements(tls)),
        ("analyze, the same workload in plaintext", cli + ["analyze", str(plain), "-o", str(work / "a3"), "-q", "-j", "1"],
         statements(plain)),
        ("exchanges, TLS DB capture with the key log", cli + ["exchanges", str(tls / "db.pcap"), "-q", "--tls-keylog",
                                                              str(keys)], statements(tls)),
        ("exchanges, the TLS DB capture without it", cli + ["exchanges", str(tls / "db.pcap"), "-q"], statements(tls)),
        ("exchanges, plaintext DB capture", cli + ["exchanges", str(plain / "db.pcap"), "-q"], statements(plain)),
        ("tshark with the key log, TLS DB capture", ["tshark", "-r", str(tls / "db.pcap"), "-o",
                                                     f"tls.keylog_file:{keys}", "-Y", "mysql.command", "-T", "fields",
                                                     "-e", "mysql.command"], statements(tls)),
    ]
    print(f"TLS set {tls} ({(tls / 'db.pcap').stat().st_size / 1e6:.2f} MB a point), plaintext set {plain} "
          f"({(plain / 'db.pcap').stat().st_size / 1e6:.2f} MB a point); median of {args.runs} runs\n")
    print("| run | wall s | CPU s | peak MiB | statements | CPU ms / statement |")
    print("|---|---|---|---|---|---|")
    for label, argv, n in rows:
        wall, cpu, peak = median_run(argv, args.runs)
        print(f"| {label} | {wall:.2f} | {cpu:.2f} | {peak:.0f} | {n} | {1000 * cpu / max(n, 1):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
