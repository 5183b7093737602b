#!/usr/bin/env python3
"""Speed and memory of pcapdecomp against its peers on one capture pair, same machine, same run.

    python3 benchmarks/bench.py                         # records 10 s of sysbench with the lab (root), then runs
    python3 benchmarks/bench.py --app A.pcap --db D.pcap   # or takes a capture pair
    python3 benchmarks/bench.py --sizes 10,30,90        # how time and memory grow with the capture's duration
    python3 benchmarks/bench.py --no-pt                 # skip pt-query-digest (slow)
    python3 benchmarks/bench.py --rotated 10 --seconds 40  # tcpdump -C rotated into ~10 files per point: analyze in
                                                        # one process, --jobs, and a Dask LocalCluster of 2 workers

Prints markdown tables: tool, wall seconds, packets/s, peak memory, exchange/command count and the agreement of
pcapdecomp's count with tshark's MySQL dissector (must be within 0.5 %). Each tool runs as a child process; peak
memory is the largest PSS of the child and its worker processes together, sampled every 50 ms (PSS, not RSS:
forked workers share pages with their parent). Large captures go to /tmp; nothing here is committed."""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _memory_kib(pid: int) -> int:
    """Proportional set size (a page shared by n processes counts 1/n in each): forked --jobs workers share the
    parent's pages, and summing their RSS would count those several times. RSS where PSS is not available."""
    for name, key in (("smaps_rollup", "Pss:"), ("status", "VmRSS:")):
        try:
            text = Path(f"/proc/{pid}/{name}").read_text()
        except OSError:
            continue
        value = next((int(line.split()[1]) for line in text.splitlines() if line.startswith(key)), None)
        if value is not None:
            return value
    return 0


def _tree_memory_kib(root: int) -> int:
    """Memory of a process and all its descendants (worker processes of --jobs count too), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        grew = bool(more)
        tree |= more
    return sum(_memory_kib(pid) for pid in tree)


def child_rss(argv: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak memory (MiB, PSS: see _memory_kib) of the child and its worker processes together
    (sampled every 50 ms), stdout."""
    out = tempfile.TemporaryFile(mode="w+")
    err = tempfile.TemporaryFile(mode="w+")
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_memory_kib(proc.pid))
        time.sleep(0.05)
    wall = time.perf_counter() - start
    out.seek(0)
    err.seek(0)
    if proc.returncode != 0:
        sys.exit(f"bench: {argv[0]} failed (exit {proc.returncode}): {err.read().strip()[-400:]}")
    return wall, peak / 1024, out.read()


def packets(path: Path) -> int:
    out = subprocess.run(["capinfos", "-c", "-M", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1].split(":")[-1].strip())


def tshark_commands(path: Path) -> tuple[float, float, int]:
    wall, rss, out = child_rss(["tshark", "-r", str(path), "-Y", "mysql.command", "-T", "fields",
                                "-e", "frame.number", "-e", "mysql.command"])
    # a frame can carry several commands (pipelining): count commands, not frames
    return wall, rss, sum(len(line.split("\t", 1)[1].split(",")) for line in out.splitlines() if "\t" in line)


def pcapdecomp_exchanges(path: Path, work: Path, jobs: int | None = None) -> tuple[float, float, int]:
    out = work / f"{path.stem}.parquet"
    argv = [sys.executable, "-m", "pcapdecomp.cli", "exchanges", str(path), "-q", "--out", str(out)]
    argv += ["--jobs", str(jobs)] if jobs else []
    wall, rss, _ = child_rss(argv)
    import pandas as pd

    x = pd.read_parquet(out, columns=["command"])
    return wall, rss, int((x["command"] != "CONNECT").sum())  # tshark counts commands; CONNECT is a handshake


def pcapdecomp_analyze(app: Path, db: Path, work: Path, jobs: int | None = None) -> tuple[float, float, int]:
    out = work / "analysis"
    argv = [sys.executable, "-m", "pcapdecomp.cli", "analyze", "--app", str(app), "--db", str(db), "-q",
            "--out", str(out)]
    argv += ["--jobs", str(jobs)] if jobs else []
    wall, rss, _ = child_rss(argv)
    import pandas as pd

    return wall, rss, len(pd.read_parquet(out / "exchanges.parquet", columns=["seen"]))


def pt_query_digest(path: Path, work: Path) -> tuple[float, float, float, int]:
    text = work / "tcpdump.txt"
    start = time.perf_counter()
    with open(text, "w") as f:
        subprocess.run(["tcpdump", "-r", str(path), "-x", "-q", "-tttt", "-nn", "port", "3306"], stdout=f,
                       stderr=subprocess.DEVNULL, check=True)
    convert = time.perf_counter() - start
    wall, rss, out = child_rss(["pt-query-digest", "--type", "tcpdump", "--limit", "0", "--no-report",
                                "--output", "slowlog", str(text)])
    queries = sum(1 for line in out.splitlines() if line.startswith("# Query_time:"))
    text.unlink()
    return convert, wall, rss, queries


def record(seconds: int, work: Path) -> tuple[Path, Path]:
    folder = work / f"sysbench-{seconds}s"
    if not (folder / "db.pcap").exists():
        subprocess.run([sys.executable, str(REPO / "captures" / "lab" / "record.py"), "sysbench", "--out", str(folder),
                        "--duration", str(seconds)], check=True)
    return folder / "app.pcap", folder / "db.pcap"


def record_rotated(seconds: int, files: int, work: Path, rate_mb_s: float) -> tuple[Path, Path]:
    """A sysbench recording whose tcpdumps rotated (-C) into about `files` files per point: app/ and db/ folders."""
    rotate_mb = max(1, round(rate_mb_s * seconds / files))
    folder = work / f"sysbench-{seconds}s-C{rotate_mb}"
    if not (folder / "db").is_dir():
        subprocess.run([sys.executable, str(REPO / "captures" / "lab" / "record.py"), "sysbench", "--out", str(folder),
                        "--duration", str(seconds), "--rotate-mb", str(rotate_mb)], check=True)
    return folder / "app", folder / "db"


def bench_rotated(app: Path, db: Path, work: Path) -> None:
    """One process, forked --jobs workers and a Dask LocalCluster of 2 worker processes on the same rotated pair;
    the tables must be identical."""
    import pandas as pd

    def count(folder: Path) -> tuple[int, int]:
        files = [f for f in folder.iterdir() if ".pcap" in f.name]
        return len(files), sum(f.stat().st_size for f in files)

    (na, ba), (nd, bd) = count(app), count(db)
    n = sum(packets(f) for f in db.iterdir() if ".pcap" in f.name)
    print(f"\n### rotated: {app} ({na} files) + {db} ({nd} files, {n:,} packets), {(ba + bd) / 2**20:.0f} MiB\n")
    print("| analyze | wall s | peak PSS MiB (client + workers) | exchanges | load before → after |")
    print("|---|---|---|---|---|")
    tables = {}
    for label, extra in (("one process (--jobs 1)", ["--jobs", "1"]), ("--jobs 2 (forked workers)", ["--jobs", "2"]),
                         ("--scheduler local (LocalCluster, 2 worker processes)", ["--scheduler", "local", "--jobs", "2"])):
        out = work / f"rotated-{len(tables)}"
        before = os.getloadavg()[0]
        wall, rss, _ = child_rss([sys.executable, "-m", "pcapdecomp.cli", "analyze", "--app", str(app), "--db", str(db),
                                  "-q", "--out", str(out), *extra])
        tables[label] = pd.read_parquet(out / "exchanges.parquet")
        print(f"| {label} | {wall:.1f} | {rss:.0f} | {len(tables[label]):,} | {before:.1f} → {os.getloadavg()[0]:.1f} |",
              flush=True)
    first = next(iter(tables.values()))
    same = all(first.equals(t) for t in tables.values())
    print(f"\ntables identical: {same}")
    if not same:
        print("bench: WARNING: the three runs gave different tables")


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, Python {platform.python_version()}"


def bench_pair(app: Path, db: Path, work: Path, with_pt: bool) -> None:
    n = packets(db)
    size = db.stat().st_size / 2**20
    print(f"\n### {db} — {n:,} packets, {size:.0f} MiB (and {app.name}: {packets(app):,} packets)\n")
    print("| tool | wall s | packets/s | peak PSS MiB | exchanges / commands | vs tshark |")
    print("|---|---|---|---|---|---|")
    t_wall, t_rss, t_count = tshark_commands(db)
    print(f"| tshark -Y mysql.command | {t_wall:.1f} | {n / t_wall:,.0f} | {t_rss:.0f} | {t_count:,} | |")
    agree = 0.0
    for jobs in (1, None):
        p_wall, p_rss, p_count = pcapdecomp_exchanges(db, work, jobs)
        agree = 100 * (p_count - t_count) / t_count if t_count else float("nan")
        label = "--jobs 1" if jobs else f"(default --jobs, {os.cpu_count()} cores)"
        print(f"| pcapdecomp exchanges {label} | {p_wall:.1f} | {n / p_wall:,.0f} | {p_rss:.0f} | {p_count:,} | "
              f"{t_wall / p_wall:.2f}× speed, count {agree:+.2f} % |", flush=True)
    a_wall, a_rss, a_count = pcapdecomp_analyze(app, db, work)
    print(f"| pcapdecomp analyze (app + db) | {a_wall:.1f} | {2 * n / a_wall:,.0f} | {a_rss:.0f} | {a_count:,} | "
          f"{t_wall / a_wall:.2f}× tshark's time for one capture |")
    if with_pt and shutil.which("pt-query-digest"):
        convert, q_wall, q_rss, q_count = pt_query_digest(db, work)
        print(f"| tcpdump -x (for pt-query-digest) | {convert:.1f} | {n / convert:,.0f} | | | |")
        print(f"| pt-query-digest --type tcpdump | {q_wall:.1f} | {n / q_wall:,.0f} | {q_rss:.0f} | {q_count:,} | |")
    if t_count and abs(agree) > 0.5:
        print(f"\nbench: WARNING: pcapdecomp's count differs from tshark's by {agree:+.2f} % (> 0.5 %)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", type=Path)
    ap.add_argument("--db", type=Path)
    ap.add_argument("--seconds", type=int, default=10, help="sysbench seconds to record when no pair is given")
    ap.add_argument("--sizes", help="comma-separated sysbench durations: a growth table")
    ap.add_argument("--work", type=Path, default=Path("/tmp/pcapdecomp-bench"))
    ap.add_argument("--no-pt", action="store_true", help="skip pt-query-digest")
    ap.add_argument("--rotated", type=int, metavar="N",
                    help="record with tcpdump rotating into about N files per point (or give --app/--db folders) and "
                         "compare one process, --jobs 2 and a Dask LocalCluster of 2 workers")
    ap.add_argument("--rate", type=float, default=6.5,
                    help="MB/s one point's tcpdump writes under the lab's sysbench (to size -C for --rotated; "
                         "6.5 measured on 2 cores)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d')}")
    if args.rotated:
        app, db = (args.app, args.db) if args.app and args.db else record_rotated(args.seconds, args.rotated, args.work,
                                                                                  args.rate)
        bench_rotated(app, db, args.work)
        return 0
    if args.sizes:
        print("\n| sysbench s | packets (db) | MiB (pair) | exchanges | tshark s | tshark PSS MiB | pcapdecomp exchanges s "
              "| PSS MiB | analyze (app + db) s | PSS MiB | analyze --jobs 1 s | PSS MiB |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for seconds in (int(s) for s in args.sizes.split(",")):
            app, db = record(seconds, args.work)
            n = packets(db)
            t_wall, t_rss, _ = tshark_commands(db)
            p_wall, p_rss, p_count = pcapdecomp_exchanges(db, args.work)
            a_wall, a_rss, _ = pcapdecomp_analyze(app, db, args.work)
            s_wall, s_rss, _ = pcapdecomp_analyze(app, db, args.work, jobs=1)
            pair_mib = (app.stat().st_size + db.stat().st_size) / 2**20
            print(f"| {seconds} | {n:,} | {pair_mib:.0f} | {p_count:,} | {t_wall:.1f} | {t_rss:.0f} | "
                  f"{p_wall:.1f} | {p_rss:.0f} | {a_wall:.1f} | {a_rss:.0f} | {s_wall:.1f} | {s_rss:.0f} |", flush=True)
        return 0
    if args.app and args.db:
        app, db = args.app, args.db
    else:
        app, db = record(args.seconds, args.work)
    bench_pair(app, db, args.work, not args.no_pt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
