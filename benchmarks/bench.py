#!/usr/bin/env python3
"""Speed and memory of pcapdecomp against its peers on one capture pair, same machine, same run.

    python3 benchmarks/bench.py                         # records 10 s of sysbench with the lab (root), then runs
    python3 benchmarks/bench.py --app A.pcap --db D.pcap   # or takes a capture pair
    python3 benchmarks/bench.py --sizes 10,30,90        # how time and memory grow with the capture's duration
    python3 benchmarks/bench.py --no-pt                 # skip pt-query-digest (slow)
    python3 benchmarks/bench.py --no-pcapng             # skip the pcapng and pcapng.gz copies of the DB capture
    python3 benchmarks/bench.py --rotated 10 --seconds 40  # tcpdump -C rotated into ~10 files per point: analyze in
                                                        # one process, --jobs, and a Dask LocalCluster of 2 workers
    python3 benchmarks/bench.py --sizes 10,40,150 --record docs/speed-runs/
                                                        # also writes the run, dated, with the machine and the
                                                        # commit, as docs/speed-runs/<date>-<commit>.md
    python3 benchmarks/bench.py --shapes 10 --runs 3 --against /work/ref36
                                                        # both shapes, each with its slow log: sysbench
                                                        # oltp_read_only and oltp_read_write (16 threads, prepared
                                                        # statements, long_query_time 0.01: entries exist);
                                                        # medians of 3 runs, and the same runs of another tree;
                                                        # analyze of the pair and of the DB capture alone
    python3 benchmarks/bench.py --shapes 10,40,150 --runs 3 --pair-runs 3,3,1 --tree /work/ref37
                                                        # both shapes at each duration (recordings kept in --work
                                                        # are used again), one table, then each row's growth
                                                        # against the 10 s row of its shape; the pcapdecomp of
                                                        # --tree runs (default: this checkout); --db-alone-only
                                                        # runs only tshark and analyze of the DB capture alone

Prints markdown tables: tool, wall seconds, packets/s, peak memory, exchange/command count and the agreement of
pcapdecomp's count with tshark's MySQL dissector (must be within 0.5 %), and beside them the physical limit: the
time `cat FILE > /dev/null` takes with the file already in the page cache (the floor for any reader on this
machine) and how far `exchanges` is from it. The DB capture is also converted to pcapng (`editcap -F pcapng`) and
gzip-compressed pcapng, and `exchanges` and tshark read those too. Start-up (`--help`, median of 5) is printed
first, with the heavy modules `--help` imported (there should be none). Each tool runs as a child process; peak
memory is the largest PSS of the child and its worker processes together, sampled every 50 ms (PSS, not RSS:
forked workers share pages with their parent). Large captures go to /tmp; nothing here is committed."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
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


def process_tree(root: int) -> set[int]:
    """A process and all its descendants (worker processes of --jobs, a Dask worker's), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        grew = bool(more)
        tree |= more
    return tree


def _tree_memory_kib(root: int) -> int:
    """Memory of a process and all its descendants (worker processes of --jobs count too)."""
    return sum(_memory_kib(pid) for pid in process_tree(root))


def child_rss(argv: list[str], cwd: Path | None = None) -> tuple[float, float, str]:
    """Wall seconds, peak memory (MiB, PSS: see _memory_kib) of the child and its worker processes together
    (sampled every 50 ms), stdout. `cwd`: where `python3 -m pcapdecomp.cli` finds the tree it runs."""
    out = tempfile.TemporaryFile(mode="w+")
    err = tempfile.TemporaryFile(mode="w+")
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, cwd=cwd)
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


def cat_seconds(path: Path, runs: int = 3) -> float:
    """The physical limit of reading `path` here: `cat FILE > /dev/null` with the file in the page cache (one
    untimed cat puts it there), the fastest of `runs`. No reader can be faster than copying the bytes once."""
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
        best = min(best, time.perf_counter() - start)
    return best


def as_pcapng(pcap: Path) -> tuple[Path, Path]:
    """The capture as pcapng (editcap -F pcapng: what dumpcap and Wireshark write) and as gzip-compressed pcapng,
    made once beside it."""
    ng = pcap.with_suffix(".pcapng")
    gz = ng.with_name(ng.name + ".gz")
    if not ng.exists():
        subprocess.run(["editcap", "-F", "pcapng", str(pcap), str(ng) + ".tmp"], check=True)
        os.replace(str(ng) + ".tmp", ng)
    if not gz.exists():
        with open(str(gz) + ".tmp", "wb") as f:
            subprocess.run(["gzip", "-1", "-c", str(ng)], stdout=f, check=True)
        os.replace(str(gz) + ".tmp", gz)
    return ng, gz


HEAVY_MODULES = ("pandas", "pyarrow", "numpy", "plotly")


def startup(tree: Path, runs: int = 5) -> list[tuple[str, float]]:
    """Median wall seconds of `python3 -m pcapdecomp.cli ARGS` of `tree`: --help of the tool and of its main
    commands."""
    out = []
    for args in (["--help"], ["exchanges", "--help"], ["analyze", "--help"]):
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pcapdecomp.cli", *args], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=True, cwd=tree)
            times.append(time.perf_counter() - start)
        out.append((" ".join(args), statistics.median(times)))
    return out


def smallest_run(tree: Path, runs: int = 5) -> float:
    """Median wall seconds of a whole `exchanges` run on a small bundled capture written to Parquet: the fixed cost
    of a command (start-up and the imports the table needs) that no capture size hides."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "exchanges", str(SMALL_CAPTURE), "-q", "--out",
                            str(Path(tmp) / "x.parquet")], check=True, cwd=tree)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


SMALL_CAPTURE = REPO / "captures" / "group-stall" / "db.pcap"


def heavy_imports_of_help(tree: Path) -> list[str]:
    """The heavy modules `--help` imports, from `python3 -X importtime` (each import is one line on stderr)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "pcapdecomp.cli", "--help"], capture_output=True,
                          text=True, cwd=tree)
    names = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    return sorted(names & set(HEAVY_MODULES))


def print_startup(tree: Path) -> None:
    """The start-up of the pcapdecomp of `tree` (the first tree that runs)."""
    parts = ", ".join(f"`{args}` {seconds:.2f} s" for args, seconds in startup(tree))
    heavy = heavy_imports_of_help(tree)
    print(f"start-up of {tree} (python3 -m pcapdecomp.cli …, median of 5): {parts}; heavy modules imported by `--help` "
          f"(-X importtime): {', '.join(heavy) if heavy else 'none'}; `exchanges` of "
          f"{SMALL_CAPTURE.relative_to(REPO)} ({SMALL_CAPTURE.stat().st_size // 1024} KiB) to Parquet, whole: "
          f"{smallest_run(tree):.2f} s", flush=True)


def tshark_commands(path: Path) -> tuple[float, float, int]:
    wall, rss, out = child_rss(["tshark", "-r", str(path), "-Y", "mysql.command", "-T", "fields",
                                "-e", "frame.number", "-e", "mysql.command"])
    # a frame can carry several commands (pipelining): count commands, not frames
    return wall, rss, sum(len(line.split("\t", 1)[1].split(",")) for line in out.splitlines() if "\t" in line)


def pcapdecomp_exchanges(path: Path, work: Path, jobs: int | None = None,
                         cwd: Path | None = None) -> tuple[float, float, int]:
    out = work / f"{path.stem}.parquet"
    argv = [sys.executable, "-m", "pcapdecomp.cli", "exchanges", str(path), "-q", "--out", str(out)]
    argv += ["--jobs", str(jobs)] if jobs else []
    wall, rss, _ = child_rss(argv, cwd)
    import pandas as pd

    x = pd.read_parquet(out, columns=["command"])
    return wall, rss, int((x["command"] != "CONNECT").sum())  # tshark counts commands; CONNECT is a handshake


def pcapdecomp_analyze(app: Path | None, db: Path, work: Path, jobs: int | None = None, slow_log: Path | None = None,
                       cwd: Path | None = None, spill: bool = False) -> tuple[float, float, int, str]:
    """Wall s, peak PSS MiB, exchange rows, and what the loss repair did (a lossy pair is read again in part).
    Without `app`: the DB capture alone (one file, as tshark reads it), with the server's settings of the
    recording's capture.toml (`server_options`). `spill`: the partitioned run (--spill into the work folder)."""
    out = work / "analysis"
    argv = [sys.executable, "-m", "pcapdecomp.cli", "analyze", *(["--app", str(app)] if app else []), "--db", str(db),
            "-q", "--out", str(out)]
    argv += ["--jobs", str(jobs)] if jobs else []
    argv += ["--slow-log", str(slow_log)] if slow_log else []
    argv += ["--spill", str(work / "spill")] if spill else []
    argv += [] if app else server_options(db)
    wall, rss, _ = child_rss(argv, cwd)
    import pandas as pd

    repair = json.loads((out / "summary.json").read_text()).get("repair")
    repaired = (f"{repair['connections']} conns re-read, {repair['bytes_borrowed']:,} B borrowed, "
                f"{repair['bytes_unrepaired']:,} B lost at both" if repair else "none")
    return wall, rss, len(pd.read_parquet(out / "exchanges.parquet", columns=["seen"])), repaired


def server_options(db: Path) -> list[str]:
    """--long-query-time and --thread-pool-size from the recording's capture.toml beside `db` (given --app/--db
    files, analyze reads no capture.toml): what a user analysing this server's capture would give."""
    toml = db.parent / "capture.toml"
    if not toml.exists():
        return []
    import tomllib

    server = tomllib.loads(toml.read_text()).get("server", {})
    return [*(["--long-query-time", str(server["long_query_time"])] if "long_query_time" in server else []),
            *(["--thread-pool-size", str(server["thread_pool_size"])] if "thread_pool_size" in server else [])]


def dropped(app: Path) -> str:
    """Packets the lab's tcpdumps said the kernel dropped (capture.toml beside a recording), or '' when unknown."""
    toml = app.parent / "capture.toml"
    if not toml.exists():
        return ""
    import tomllib

    return f"{tomllib.loads(toml.read_text()).get('captures', {}).get('dropped_by_kernel', '')}"


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


TPS: int | None = None  # --tps: sysbench's transactions a second at most when recording (None: full speed)


def record(seconds: int, work: Path, scenario: str = "sysbench") -> tuple[Path, Path]:
    """The lab's recording of `scenario` (sysbench: oltp_read_only; sysbench-rw: oltp_read_write with a slow log
    at long_query_time 0.01) for `seconds`, made once in the work folder (never committed), at --tps."""
    folder = work / f"{scenario}-{seconds}s"
    if not (folder / "db.pcap").exists():
        subprocess.run([sys.executable, str(REPO / "captures" / "lab" / "record.py"), scenario, "--out", str(folder),
                        "--duration", str(seconds), *(["--rate", str(TPS)] if TPS else [])], check=True)
    return folder / "app.pcap", folder / "db.pcap"


SHAPES = {"sysbench": "oltp_read_only, 8 threads", "sysbench-rw": "oltp_read_write, 16 threads"}
SHAPE_COLUMNS = (
    "shape", "tree", "s", "packets (db)", "MiB (db)", "exchanges", "slow-log entries (joined)", "dropped by tcpdump",
    "tshark s", "exchanges --jobs 1 s", "× tshark", "exchanges s", "× tshark", "analyze --jobs 1, no slow log s",
    "× tshark", "analyze --jobs 1 s", "× tshark", "PSS MiB", "analyze s", "× tshark", "PSS MiB", "loss repair",
    "analyze --db alone --jobs 1 s", "× tshark", "PSS MiB", "analyze --db alone s", "× tshark", "PSS MiB",
    "analyze --spill --jobs 1 s", "× tshark", "PSS MiB", "load before → after")
# the timed commands of a shape row, in the order of SHAPE_COLUMNS: key, and whether its peak memory is shown
SHAPE_RUNS = (("exchanges --jobs 1", False), ("exchanges", False), ("analyze --jobs 1, no slow log", False),
              ("analyze --jobs 1", True), ("analyze", True), ("analyze --db alone --jobs 1", True),
              ("analyze --db alone", True), ("analyze --spill --jobs 1", True))
# --lean: the commands a loaded 2-core machine can time (one process each, the slow log given)
LEAN_RUNS = ("exchanges --jobs 1", "analyze --jobs 1", "analyze --db alone --jobs 1", "analyze --spill --jobs 1")


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished children (and theirs, the workers they waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _median_runs(runs: int, measure) -> tuple:
    """Of `runs` runs of measure() (wall s, peak MiB, …): the median run's values, then the median CPU seconds of
    the child processes (on a loaded machine CPU time moves less than wall time)."""
    got, cpu = [], []
    for _ in range(runs):
        before = _cpu_seconds()
        got.append(measure())
        cpu.append(_cpu_seconds() - before)
    got.sort(key=lambda r: r[0])
    return (*got[len(got) // 2], statistics.median(cpu))


def shape_rows(durations: list[int], work: Path, runs: int, pair_runs: list[int], trees: list[Path],
               db_alone_only: bool = False, lean: bool = False) -> list[dict]:
    """Both shapes of the benchmark recorded for each of `durations` (a recording made once, kept in `work`), each
    analysed with its slow log (and, with --jobs 1, without it): per tree, the medians of `runs` runs (`pair_runs`,
    one per duration, of the pair's `analyze`) against one tshark run on the DB capture. Prints a row as it is
    measured; returns the rows' numbers for the growth table. `db_alone_only`: tshark and the DB capture alone;
    `lean`: only LEAN_RUNS."""
    out = []
    for seconds, pair_n in zip(durations, pair_runs):
        for scenario, what in SHAPES.items():
            app, db = record(seconds, work, scenario)
            slow = db.parent / "slow.log"
            n = packets(db)
            before = _cpu_seconds()
            t_wall, t_rss, t_count = tshark_commands(db)
            t_cpu = _cpu_seconds() - before
            for tree in trees:
                before = load()
                measures = {
                    "exchanges --jobs 1": (runs, lambda: pcapdecomp_exchanges(db, work, 1, cwd=tree)),
                    "exchanges": (runs, lambda: pcapdecomp_exchanges(db, work, cwd=tree)),
                    "analyze --jobs 1, no slow log": (pair_n, lambda: pcapdecomp_analyze(app, db, work, 1, cwd=tree)),
                    "analyze --jobs 1": (pair_n, lambda: pcapdecomp_analyze(app, db, work, 1, slow, cwd=tree)),
                    "analyze": (pair_n, lambda: pcapdecomp_analyze(app, db, work, None, slow, cwd=tree)),
                    "analyze --db alone --jobs 1": (runs, lambda: pcapdecomp_analyze(None, db, work, 1, slow,
                                                                                     cwd=tree)),
                    "analyze --db alone": (runs, lambda: pcapdecomp_analyze(None, db, work, None, slow, cwd=tree)),
                    "analyze --spill --jobs 1": (pair_n, lambda: pcapdecomp_analyze(app, db, work, 1, slow, cwd=tree,
                                                                                    spill=True)),
                }
                got, entries = {}, {}
                for key, (times, measure) in measures.items():
                    if (db_alone_only and not key.startswith("analyze --db alone")) or (lean and key not in LEAN_RUNS):
                        continue
                    got[key] = _median_runs(times, measure)
                    if key.startswith("analyze") and key != "analyze --jobs 1, no slow log" and not entries:
                        # the pair's, else the DB capture alone's: how many of the log's entries were joined
                        entries = json.loads((work / "analysis" / "summary.json").read_text()).get("slow_log") or {}
                count = got.get("exchanges --jobs 1", got.get("analyze --db alone --jobs 1"))[2]
                if "exchanges --jobs 1" in got and t_count and abs(100 * (count - t_count) / t_count) > 0.5:
                    print(f"bench: WARNING: {scenario} {seconds} s: pcapdecomp counts {count:,} exchanges, tshark "
                          f"{t_count:,} commands", file=sys.stderr)
                row = {"shape": scenario, "what": what, "tree": tree.name, "seconds": seconds, "packets": n,
                       "mib": db.stat().st_size / 2**20, "exchanges": count, "entries": entries,
                       "dropped": dropped(app), "tshark": (t_wall, t_rss, t_cpu), "runs": got,
                       "load": f"{before} → {load()}"}
                out.append(row)
                print(shape_cells(row), flush=True)
    return out


def shape_cells(row: dict) -> str:
    """A row of the shapes table: wall s (CPU s) of each command and × tshark by wall (by CPU); blank where a
    command did not run."""
    t_wall, _, t_cpu = row["tshark"]
    entries = row["entries"]
    repaired = ""
    cells = [f"{row['shape']} ({row['what']})", row["tree"], f"{row['seconds']}", f"{row['packets']:,}",
             f"{row['mib']:.0f}", f"{row['exchanges']:,}", f"{entries.get('entries', 0)} ({entries.get('matched', 0)})",
             row["dropped"], f"{t_wall:.1f} ({t_cpu:.1f})"]
    for key, with_memory in SHAPE_RUNS:
        run = row["runs"].get(key)
        if run is None:
            cells += ["", ""] + ([""] if with_memory else []) + ([repaired] if key == "analyze" else [])
            continue
        wall, rss, cpu = run[0], run[1], run[-1]
        cells += [f"{wall:.2f} ({cpu:.2f})", f"{t_wall / wall:.1f} ({t_cpu / cpu:.1f})"] + \
            ([f"{rss:.0f}"] if with_memory else [])
        if key == "analyze --jobs 1":
            repaired = run[3]  # what the loss repair did on the pair
        if key == "analyze":
            cells.append(repaired)
    cells.append(row["load"])
    return "| " + " | ".join(cells) + " |"


GROWTH_OF_SHAPES_COLUMNS = (
    "shape", "tree", "s", "× MiB (db)", "× exchanges", "× tshark CPU", "× exchanges --jobs 1 CPU",
    "× analyze --jobs 1 CPU", "× its PSS", "× analyze --db alone --jobs 1 CPU", "× its PSS",
    "× analyze --spill --jobs 1 CPU", "× its PSS", "analyze --db alone --jobs 1 × tshark, CPU")


def shape_growth(rows: list[dict]) -> None:
    """Each row against the shortest recording of its shape and tree (the 10 s one): how the capture, tshark's CPU
    and pcapdecomp's CPU and peak memory grew; and the like-for-like ratio beside it."""
    print("\n| " + " | ".join(GROWTH_OF_SHAPES_COLUMNS) + " |")
    print("|" + "---|" * len(GROWTH_OF_SHAPES_COLUMNS))
    for row in rows:
        base = min((r for r in rows if r["shape"] == row["shape"] and r["tree"] == row["tree"]),
                   key=lambda r: r["seconds"])

        def grew(key: str, memory: bool = False) -> str:
            if key not in row["runs"] or key not in base["runs"]:
                return ""
            at, of = (row["runs"][key][1], base["runs"][key][1]) if memory else (row["runs"][key][-1],
                                                                                  base["runs"][key][-1])
            return f"{at / of:.2f}"

        alone = row["runs"].get("analyze --db alone --jobs 1")
        cells = [row["shape"], row["tree"], f"{row['seconds']} (against {base['seconds']})",
                 f"{row['mib'] / base['mib']:.2f}", f"{row['exchanges'] / base['exchanges']:.2f}",
                 f"{row['tshark'][2] / base['tshark'][2]:.2f}", grew("exchanges --jobs 1"), grew("analyze --jobs 1"),
                 grew("analyze --jobs 1", True), grew("analyze --db alone --jobs 1"),
                 grew("analyze --db alone --jobs 1", True), grew("analyze --spill --jobs 1"),
                 grew("analyze --spill --jobs 1", True), f"{row['tshark'][2] / alone[-1]:.1f}" if alone else ""]
        print("| " + " | ".join(cells) + " |", flush=True)


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


def compile_bytecode(trees: list[Path]) -> bool:
    """The pcapdecomp modules of every tree that runs (this one and --against's) compiled to bytecode (__pycache__,
    git-ignored) when PYTHONDONTWRITEBYTECODE is set in this environment: Python then never writes the bytecode it
    makes, and every timed run would compile the package's modules from source again (~0.5 s of each run here),
    which no installed copy does (pip compiles them when it installs; a checkout keeps what its first run wrote).
    Every tree alike, or an A/B pair would weigh that against the tree left uncompiled. True when it compiled."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return False
    for tree in trees:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "pcapdecomp")], check=True,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    return True


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, Python {platform.python_version()}"


def load() -> str:
    """The 1, 5 and 15 minute load averages (other work on the machine skews the times)."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def bench_pair(app: Path, db: Path, work: Path, with_pt: bool, with_pcapng: bool) -> None:
    n = packets(db)
    size = db.stat().st_size / 2**20
    print(f"\n### {db} — {n:,} packets, {size:.0f} MiB (and {app.name}: {packets(app):,} packets); "
          f"load average {load()}\n")
    print("| tool | wall s | packets/s | peak PSS MiB | exchanges / commands | vs tshark | vs cat |")
    print("|---|---|---|---|---|---|---|")
    cat = cat_seconds(db)
    print(f"| cat db.pcap > /dev/null (page cache warm: the limit) | {cat:.2f} | {n / cat:,.0f} | | | | 1× |")
    t_wall, t_rss, t_count = tshark_commands(db)
    print(f"| tshark -Y mysql.command | {t_wall:.1f} | {n / t_wall:,.0f} | {t_rss:.0f} | {t_count:,} | | "
          f"{t_wall / cat:.0f}× |")
    agree = 0.0
    for jobs in (1, None):
        p_wall, p_rss, p_count = pcapdecomp_exchanges(db, work, jobs)
        agree = 100 * (p_count - t_count) / t_count if t_count else float("nan")
        label = "--jobs 1" if jobs else f"(default --jobs, {os.cpu_count()} cores)"
        print(f"| pcapdecomp exchanges {label} | {p_wall:.2f} | {n / p_wall:,.0f} | {p_rss:.0f} | {p_count:,} | "
              f"{t_wall / p_wall:.1f}× speed, count {agree:+.2f} % | {p_wall / cat:.0f}× |", flush=True)
    a_wall, a_rss, a_count, repaired = pcapdecomp_analyze(app, db, work)
    print(f"| pcapdecomp analyze (app + db; loss repair: {repaired}) | {a_wall:.1f} | {2 * n / a_wall:,.0f} | "
          f"{a_rss:.0f} | {a_count:,} | {t_wall / a_wall:.1f}× tshark's time for one capture | |")
    slow = db.parent / "slow.log"
    b_wall, b_rss, b_count, _ = pcapdecomp_analyze(None, db, work, slow_log=slow if slow.exists() else None)
    print(f"| pcapdecomp analyze --db alone (its slow log, capture.toml's server settings) | {b_wall:.1f} | "
          f"{n / b_wall:,.0f} | {b_rss:.0f} | {b_count:,} | {t_wall / b_wall:.1f}× tshark on the same file | |")
    if with_pcapng:
        ng, gz = as_pcapng(db)
        ng_cat = cat_seconds(ng)
        print(f"| cat db.pcapng > /dev/null (page cache warm) | {ng_cat:.2f} | {n / ng_cat:,.0f} | | | | 1× |")
        g_wall, g_rss, g_count = tshark_commands(ng)
        print(f"| tshark -Y mysql.command, pcapng | {g_wall:.1f} | {n / g_wall:,.0f} | {g_rss:.0f} | {g_count:,} | | "
              f"{g_wall / ng_cat:.0f}× |")
        for label, path in (("pcapng", ng), ("pcapng.gz", gz)):
            e_wall, e_rss, e_count = pcapdecomp_exchanges(path, work)
            print(f"| pcapdecomp exchanges, {label} | {e_wall:.2f} | {n / e_wall:,.0f} | {e_rss:.0f} | {e_count:,} | "
                  f"{g_wall / e_wall:.1f}× tshark on pcapng | {e_wall / ng_cat:.0f}× |", flush=True)
    if with_pt and shutil.which("pt-query-digest"):
        convert, q_wall, q_rss, q_count = pt_query_digest(db, work)
        print(f"| tcpdump -x (for pt-query-digest) | {convert:.1f} | {n / convert:,.0f} | | | | |")
        print(f"| pt-query-digest --type tcpdump | {q_wall:.1f} | {n / q_wall:,.0f} | {q_rss:.0f} | {q_count:,} | | |")
    if t_count and abs(agree) > 0.5:
        print(f"\nbench: WARNING: pcapdecomp's count differs from tshark's by {agree:+.2f} % (> 0.5 %)")


GROWTH_COLUMNS = (
    "sysbench s", "packets (db)", "MiB (pair)", "exchanges", "cat db s (warm)", "tshark s", "tshark PSS MiB",
    "exchanges s", "PSS MiB", "× tshark", "× cat", "analyze (app + db) s", "PSS MiB", "× tshark",
    "analyze --jobs 1 s", "PSS MiB", "analyze --db alone s", "PSS MiB", "× tshark", "tshark pcapng s",
    "exchanges pcapng s", "× tshark", "exchanges pcapng.gz s",
    "× tshark pcapng", "dropped by tcpdump", "loss repair", "load 1/5/15 before", "load after")


def growth_row(seconds: int, work: Path, with_pcapng: bool) -> str:
    """One row of the growth table: the pair recorded for `seconds` of sysbench, every tool on it."""
    app, db = record(seconds, work)
    before = load()
    n = packets(db)
    cat = cat_seconds(db)
    t_wall, t_rss, t_count = tshark_commands(db)
    p_wall, p_rss, p_count = pcapdecomp_exchanges(db, work)
    if t_count and abs(100 * (p_count - t_count) / t_count) > 0.5:
        print(f"bench: WARNING: {seconds} s: pcapdecomp counts {p_count:,} exchanges, tshark {t_count:,} commands",
              file=sys.stderr)
    a_wall, a_rss, _, repaired = pcapdecomp_analyze(app, db, work)
    s_wall, s_rss, _, _ = pcapdecomp_analyze(app, db, work, jobs=1)
    slow = db.parent / "slow.log"
    b_wall, b_rss, _, _ = pcapdecomp_analyze(None, db, work, slow_log=slow if slow.exists() else None)
    ng_cells = ["", "", "", "", ""]
    if with_pcapng:
        ng, gz = as_pcapng(db)
        g_wall, _, g_count = tshark_commands(ng)
        e_wall, _, e_count = pcapdecomp_exchanges(ng, work)
        z_wall, _, z_count = pcapdecomp_exchanges(gz, work)
        if not g_count == t_count or not e_count == z_count == p_count:
            print(f"bench: WARNING: {seconds} s: counts differ between pcap and pcapng: tshark {t_count:,} / "
                  f"{g_count:,}, pcapdecomp {p_count:,} / {e_count:,} / {z_count:,} (gz)", file=sys.stderr)
        ng_cells = [f"{g_wall:.1f}", f"{e_wall:.2f}", f"{g_wall / e_wall:.1f}", f"{z_wall:.2f}",
                    f"{g_wall / z_wall:.1f}"]
    pair_mib = (app.stat().st_size + db.stat().st_size) / 2**20
    cells = [f"{seconds}", f"{n:,}", f"{pair_mib:.0f}", f"{p_count:,}", f"{cat:.2f}", f"{t_wall:.1f}", f"{t_rss:.0f}",
             f"{p_wall:.2f}", f"{p_rss:.0f}", f"{t_wall / p_wall:.1f}", f"{p_wall / cat:.0f}", f"{a_wall:.1f}",
             f"{a_rss:.0f}", f"{t_wall / a_wall:.1f}", f"{s_wall:.1f}", f"{s_rss:.0f}", f"{b_wall:.1f}", f"{b_rss:.0f}",
             f"{t_wall / b_wall:.1f}", *ng_cells, dropped(app), repaired,
             before, load()]
    return "| " + " | ".join(cells) + " |"


class _Tee:
    """stdout that is also written to the run's record file."""

    def __init__(self, stream, path: Path):
        self.stream, self.file = stream, open(path, "a", encoding="utf-8")

    def write(self, text: str) -> int:
        self.file.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.file.flush()
        self.stream.flush()


def commit(tree: Path = REPO) -> str:
    done = subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def record_file(folder: Path, trees: Sequence[Path] = (REPO,)) -> Path:
    """The record of this run in `folder`: its date and the commit measured (the first tree's; by default this
    repository's, which long_capture.py and dask_scaling.py run) name it; its first lines say what ran where (the page
    docs/speed.md links to these files)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y-%m-%d-%H%M')}-{commit(trees[0])}.md"
    ran = "; ".join(f"the pcapdecomp of {tree} at commit {commit(tree)}" for tree in trees)
    path.write_text(f"# Benchmark run of {time.strftime('%Y-%m-%d %H:%M %Z')}\n\n"
                    f"`python3 benchmarks/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}` from commit {commit()}; "
                    f"{ran}; {machine()}; load average (1/5/15 min) at the start {load()}.\n\n", encoding="utf-8")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", type=Path)
    ap.add_argument("--db", type=Path)
    ap.add_argument("--seconds", type=int, default=10, help="sysbench seconds to record when no pair is given")
    ap.add_argument("--sizes", help="comma-separated sysbench durations: a growth table")
    ap.add_argument("--work", type=Path, default=Path("/tmp/pcapdecomp-bench"))
    ap.add_argument("--tps", type=int, metavar="N",
                    help="record sysbench at N transactions a second at most (record.py --rate; default: full "
                         "speed, which the lab's tcpdumps keep up with since they capture in blocks: 0 packets "
                         "dropped at 10, 40 and 150 s on 2 cores)")
    ap.add_argument("--no-pt", action="store_true", help="skip pt-query-digest")
    ap.add_argument("--no-pcapng", action="store_true",
                    help="skip the pcapng and gzip-compressed pcapng copies of the DB capture")
    ap.add_argument("--rotated", type=int, metavar="N",
                    help="record with tcpdump rotating into about N files per point (or give --app/--db folders) and "
                         "compare one process, --jobs 2 and a Dask LocalCluster of 2 workers")
    ap.add_argument("--rate", type=float, default=6.5,
                    help="MB/s one point's tcpdump writes under the lab's sysbench (to size -C for --rotated; "
                         "6.5 measured on 2 cores)")
    ap.add_argument("--shapes", metavar="SECONDS[,SECONDS…]",
                    help="record both shapes (sysbench oltp_read_only; oltp_read_write with a slow log) for each of "
                         "these durations (a recording kept in --work is used again) and print one table of their "
                         "rows: exchanges and analyze (with and without the slow log) against tshark; then each row's "
                         "growth against the shortest recording of its shape")
    ap.add_argument("--runs", type=int, default=1, help="--shapes: runs of each pcapdecomp command (the median is shown)")
    ap.add_argument("--pair-runs", metavar="N[,N…]",
                    help="--shapes: runs of the pair's `analyze` (app + db) columns, one number or one per duration "
                         "(default: --runs)")
    ap.add_argument("--db-alone-only", action="store_true",
                    help="--shapes: run only tshark and `analyze --db alone` (the like-for-like columns)")
    ap.add_argument("--lean", action="store_true",
                    help="--shapes: run only `exchanges`, the pair's `analyze` and `analyze --db alone`, each with "
                         "--jobs 1 and the slow log (the other columns are left blank)")
    ap.add_argument("--tree", type=Path, default=REPO,
                    help="--shapes: the built tree whose pcapdecomp runs (default: this checkout)")
    ap.add_argument("--against", type=Path, action="append", default=[], metavar="TREE",
                    help="--shapes: also run the pcapdecomp of this built tree (an A/B pair: the same recordings, "
                         "one after the other)")
    ap.add_argument("--record", type=Path, metavar="FOLDER",
                    help="also write everything printed to FOLDER/<date>-<commit>.md, headed by the date, the "
                         "command, the commit and the machine")
    args = ap.parse_args()
    global TPS
    TPS = args.tps
    trees = [args.tree.resolve(), *args.against]
    try:
        durations = [int(s) for s in args.shapes.split(",")] if args.shapes else []
        pair_runs = [int(s) for s in args.pair_runs.split(",")] if args.pair_runs else [args.runs]
    except ValueError:
        ap.error("--shapes and --pair-runs: whole numbers separated by commas")
    if len(pair_runs) == 1:
        pair_runs *= len(durations)
    if args.shapes and len(pair_runs) != len(durations):
        ap.error("--pair-runs: one number, or one per --shapes duration")
    args.work.mkdir(parents=True, exist_ok=True)
    if args.record:
        path = record_file(args.record, trees)
        sys.stdout = _Tee(sys.stdout, path)
        print(f"bench: recording this run in {path}", file=sys.stderr)
    compiled = compile_bytecode(trees)
    print(f"machine: {machine()}; load average (1/5/15 min) {load()}; {time.strftime('%Y-%m-%d %H:%M')}"
          f"{'; bytecode compiled first (PYTHONDONTWRITEBYTECODE is set)' if compiled else ''}")
    print_startup(trees[0])
    if args.shapes:
        print("\n| " + " | ".join(SHAPE_COLUMNS) + " |")
        print("|" + "---|" * len(SHAPE_COLUMNS), flush=True)
        rows = shape_rows(durations, args.work, args.runs, pair_runs, trees, args.db_alone_only, args.lean)
        print(f"\nTimes of the DB capture for tshark (one run) and `exchanges`, of the pair (app + db) for "
              f"`analyze` and of the DB capture alone for `analyze --db alone` (one file for each tool: the "
              f"like-for-like row), each the median of {args.runs} run(s) (the pair's `analyze` columns: "
              f"{', '.join(f'{n} at {s} s' for n, s in zip(pair_runs, durations))}), wall (CPU: user + system of the "
              "process and its workers); × tshark = tshark's time / pcapdecomp's, wall (CPU). `analyze` is given the "
              "recording's slow log (--slow-log) except in the 'no slow log' column; the read-only shape's log has no "
              "entries (long_query_time 1 s). `analyze --db alone` is also given the server's long_query_time and "
              "thread_pool_size from the recording's capture.toml (the pair columns are not: given files, analyze "
              "reads no capture.toml). PSS: peak of the process and its workers. Tree: the checkout whose "
              "pcapdecomp ran (--against adds rows of another one on the same recordings). Dropped: packets the "
              "lab's two tcpdumps said the kernel dropped; loss repair: what `analyze` of the pair did about them "
              "(the connections with holes read again and filled from the other point).")
        shape_growth(rows)
        print("\nEach row against the shortest recording of its shape and tree: × = this row's value / that row's "
              "(CPU seconds; PSS: peak memory), and the like-for-like ratio, tshark's CPU / `analyze --db alone "
              "--jobs 1`'s, beside it.")
        return 0
    if args.rotated:
        app, db = (args.app, args.db) if args.app and args.db else record_rotated(args.seconds, args.rotated, args.work,
                                                                                  args.rate)
        bench_rotated(app, db, args.work)
        return 0
    if args.sizes:
        print("\n| " + " | ".join(GROWTH_COLUMNS) + " |")
        print("|" + "---|" * len(GROWTH_COLUMNS), flush=True)
        for seconds in (int(s) for s in args.sizes.split(",")):
            print(growth_row(seconds, args.work, not args.no_pcapng), flush=True)
        print("\nTimes of the DB capture for cat, tshark and `exchanges` (default --jobs), of the pair for `analyze`, "
              "of the DB capture alone (with its slow log and the server's settings of capture.toml) for `analyze "
              "--db alone`; "
              "× tshark = tshark's time / pcapdecomp's, × cat = `exchanges` time / cat's (the distance to the limit). "
              "pcapng: the DB capture converted with editcap -F pcapng, and that gzip -1 compressed; tshark read the "
              "uncompressed pcapng. Dropped: packets the lab's two tcpdumps said the kernel dropped; a lossy pair makes "
              "`analyze` read the connections with holes again to fill them from the other point (loss repair, "
              "through the fast lane). "
              "Load averages from /proc/loadavg before and after the row.")
        return 0
    if args.app and args.db:
        app, db = args.app, args.db
    else:
        app, db = record(args.seconds, args.work)
    bench_pair(app, db, args.work, not args.no_pt, not args.no_pcapng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
