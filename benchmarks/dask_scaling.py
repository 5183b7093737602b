#!/usr/bin/env python3
"""How `analyze --scheduler` scales with the workers of a Dask cluster, against one process, on the same pair.

    python3 benchmarks/dask_scaling.py /tmp/pcapdecomp-bench/sysbench-rw-10s --workers 1,2,4
    python3 benchmarks/dask_scaling.py SET1 SET2 --workers 1,2,4 --files 10 --record docs/speed-runs/

Each capture set (a folder with app.pcap, db.pcap, slow.log: what the lab and bench.py record) is split into about
--files files per point (`editcap -c`, as tcpdump -C rotates: Dask workers read a point's files themselves, from the
same paths), then analysed
- in one process (`analyze --jobs 1`): the reference outputs;
- with `--scheduler tcp://127.0.0.1:PORT` against a cluster this script starts for each worker count N:
  `dask scheduler` and `dask worker --nworkers N --nthreads 1` (processes, one thread each), stopped after the run.
Prints, per run, the wall time and CPU time of the client, the client's peak memory and the workers' (PSS of each
process tree, sampled every 50 ms: the workers' peak is the largest sum over the worker processes at one moment),
and whether the outputs equal the one-process run's (exchanges.parquet, groups.parquet, pool.parquet value for value
and byte for byte, summary.json value for value but for the inputs' scheduler and working folder).
The workers' CPU time is read from /proc at the end of the run (user + system of the worker processes).

    python3 benchmarks/dask_scaling.py /tmp/pcapdecomp-bench/sysbench-rw-10s --spill --workers 1,2,4 [--db-alone]

`--spill` measures `analyze --spill DIR` instead (run/spilled.py, docs/partitioned.md §16): the reference is the run
without a cluster (`--jobs 1 --spill`), then `--jobs 1 --spill --scheduler` against the same kind of cluster for each
N (N worker processes of one thread: a LocalCluster of N processes). The workers read the captures into the spill
folder they share with the client and take the partitions there, with the set's slow log and the lab's settings;
--db-alone: the DB capture alone. The outputs are compared byte for byte: the tables, and summary.json but for the
scheduler its inputs record."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench  # noqa: E402  (PSS sampling of a process tree, load, machine, the run's record)
import same_outputs  # noqa: E402  (the comparison of two analyses' tables and summaries)

TABLES = ("exchanges.parquet", "groups.parquet", "pool.parquet")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def split_set(src: Path, work: Path, files: int) -> Path:
    """`src`'s app.pcap and db.pcap cut into about `files` files each (app/ and db/), its slow.log beside them; with
    `files` 1, links to its own files."""
    out = work / f"{src.name}-split{files}"
    if files <= 1:
        for point in ("app", "db"):
            (out / point).mkdir(parents=True, exist_ok=True)
            link = out / point / f"{point}.pcap"
            if not link.exists():
                link.symlink_to((src / f"{point}.pcap").resolve())
        if (src / "slow.log").exists() and not (out / "slow.log").exists():
            (out / "slow.log").symlink_to((src / "slow.log").resolve())
        return out
    if (out / "db").is_dir():
        return out
    tmp = work / f"{src.name}-split{files}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for point in ("app", "db"):
        (tmp / point).mkdir(parents=True)
        n = bench.packets(src / f"{point}.pcap")
        subprocess.run(["editcap", "-c", str(max(1, -(-n // files))), str(src / f"{point}.pcap"),
                        str(tmp / point / f"{point}.pcap")], check=True, capture_output=True)
    if (src / "slow.log").exists():
        shutil.copy(src / "slow.log", tmp / "slow.log")
    os.replace(tmp, out)
    return out


def _cpu_of(pids: set[int]) -> float:
    """User + system seconds the processes have used so far (their waited-for children too)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return total / CLK_TCK


def measure(argv: list[str], workers_root: int | None) -> dict:
    """Run `argv` (the client); sample the PSS of its process tree and of the worker tree every 50 ms."""
    out, err = tempfile.TemporaryFile(mode="w+"), tempfile.TemporaryFile(mode="w+")
    w_pids = bench.process_tree(workers_root) if workers_root else set()
    w_cpu0 = _cpu_of(w_pids)
    c_cpu0 = bench._cpu_seconds()
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, cwd=REPO)
    client_peak = workers_peak = 0
    per_worker: dict[int, int] = {}
    while proc.poll() is None:
        client_peak = max(client_peak, bench._tree_memory_kib(proc.pid))
        if workers_root:
            sizes = {pid: bench._memory_kib(pid) for pid in bench.process_tree(workers_root)}
            workers_peak = max(workers_peak, sum(sizes.values()))
            for pid, kib in sizes.items():
                per_worker[pid] = max(per_worker.get(pid, 0), kib)
        time.sleep(0.05)
    wall = time.perf_counter() - start
    err.seek(0)
    if proc.returncode != 0:
        sys.exit(f"dask_scaling: {' '.join(argv[:6])} … failed (exit {proc.returncode}): {err.read().strip()[-400:]}")
    return {"wall": wall, "client_cpu": bench._cpu_seconds() - c_cpu0, "client_mib": client_peak / 1024,
            "workers_mib": workers_peak / 1024, "worker_max_mib": max(per_worker.values(), default=0) / 1024,
            "workers_cpu": _cpu_of(bench.process_tree(workers_root)) - w_cpu0 if workers_root else 0.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """`dask scheduler` and `dask worker --nworkers N --nthreads 1` on this machine, on a free local port."""

    def __init__(self, n: int, work: Path):
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        log = open(work / f"dask-{n}.log", "w")
        self.scheduler = subprocess.Popen(["dask", "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                           "--no-dashboard"], stdout=log, stderr=log, start_new_session=True)
        self.workers = subprocess.Popen(["dask", "worker", self.address, "--nworkers", str(n), "--nthreads", "1",
                                         "--memory-limit", "0", "--no-dashboard", "--local-directory",
                                         str(work / "dask-scratch")], stdout=log, stderr=log,
                                        start_new_session=True, cwd=REPO,
                                        env={**os.environ, "PYTHONPATH": str(REPO)})  # this tree's pcapdecomp
        self._wait(n)

    def _wait(self, n: int, timeout: float = 120) -> None:
        from distributed import Client

        with Client(self.address, timeout="60s") as client:
            client.wait_for_workers(n, timeout=timeout)

    def close(self) -> None:
        for proc in (self.workers, self.scheduler):
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # its own session: the nanny and worker processes it started
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def equal_outputs(a: Path, b: Path) -> str:
    """'yes' when b's tables and summary equal a's (and whether the tables' bytes do), else what differs."""
    problems = [p for p in (same_outputs.same_table(a / name, b / name) for name in TABLES) if p]
    left, right = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for s in (left, right):
        s.get("inputs", {}).pop("cwd", None)
        s.get("inputs", {}).pop("scheduler", None)
    if left != right:
        problems.append(f"summary.json differs in {sorted(k for k in set(left) | set(right) if left.get(k) != right.get(k))}")
    if problems:
        return "NO: " + "; ".join(problems)
    same_bytes = all((a / n).read_bytes() == (b / n).read_bytes() for n in TABLES)
    return "yes" + (" (tables byte for byte)" if same_bytes else " (values; table bytes differ)")


def spilled_runs(args, extra: list[str]) -> None:
    """The --spill table: no cluster, then a cluster of each worker count, on each set (its slow log with it)."""
    spill = args.work / "spill"
    spill.mkdir(parents=True, exist_ok=True)
    for src in args.sets:
        base = [sys.executable, "-m", "pcapdecomp.cli", "analyze", "--db", str(src / "db.pcap"),
                *([] if args.db_alone else ["--app", str(src / "app.pcap")]),
                *(["--slow-log", str(src / "slow.log")] if (src / "slow.log").exists() else []), *extra, "--jobs", "1",
                "-q",
                "--spill", str(spill)]
        mb = sum((src / f"{p}.pcap").stat().st_size for p in (("db",) if args.db_alone else ("app", "db"))) / 1e6
        what = f"{src.name}{', DB alone' if args.db_alone else ''}"
        reference = args.work / "spilled-none"
        for n in [None, *(int(x) for x in args.workers.split(","))]:
            out = reference if n is None else args.work / f"spilled-{n}"
            shutil.rmtree(out, ignore_errors=True)
            before = bench.load()
            cluster = Cluster(n, args.work) if n else None
            try:
                m = measure(base + ["--out", str(out)] + (["--scheduler", cluster.address] if cluster else []),
                            cluster.workers.pid if cluster else None)
            finally:
                if cluster:
                    cluster.close()
            equal = "(reference)" if n is None else equal_bytes(reference, out)
            label = "no cluster" if n is None else f"{n} worker process{'es' if n > 1 else ''}"
            workers = f"{m['workers_mib']:,.0f} ({m['worker_max_mib']:,.0f})" if n else ""
            workers_cpu = f"{m['workers_cpu']:.1f}" if n else ""
            print(f"| {what} | {mb:,.0f} | {label} | {m['wall']:.1f} | {m['client_cpu']:.1f} | {workers_cpu} | "
                  f"{m['client_mib']:,.0f} | {workers} | {equal} | {before} → {bench.load()} |", flush=True)


def equal_bytes(a: Path, b: Path) -> str:
    """'yes' when b's tables are a's byte for byte, and its summary.json too but for the scheduler its inputs
    record (b's run had one, a's not), else which differ."""
    differ = [n for n in TABLES if (a / n).read_bytes() != (b / n).read_bytes()]
    texts = [(d / "summary.json").read_text() for d in (a, b)]
    recorded = json.loads(texts[1]).get("inputs", {}).get("scheduler")
    if texts[0] != texts[1].replace(f'"scheduler": {json.dumps(recorded)}', '"scheduler": null', 1):
        differ.append("summary.json")
    return "yes (byte for byte)" if not differ else "NO: " + ", ".join(differ)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sets", type=Path, nargs="+", help="capture-set folders (app.pcap, db.pcap, slow.log)")
    ap.add_argument("--workers", default="1,2,4", help="worker process counts of the clusters")
    ap.add_argument("--files", type=int, default=10, help="files per point the captures are split into")
    ap.add_argument("--work", type=Path, default=Path("/tmp/pcapdecomp-dask"))
    ap.add_argument("--analyze-args", default="--long-query-time 0.01 --thread-pool-size 2",
                    help="more analyze options, the same for every run (the lab's settings by default)")
    ap.add_argument("--record", type=Path, metavar="FOLDER", help="also write the run to FOLDER/<date>-<commit>.md")
    ap.add_argument("--spill", action="store_true", help="measure analyze --spill: no cluster, then each cluster")
    ap.add_argument("--db-alone", action="store_true", help="with --spill: the DB capture alone")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.record:
        sys.stdout = bench._Tee(sys.stdout, bench.record_file(args.record))
    print(f"machine: {bench.machine()}; {time.strftime('%Y-%m-%d %H:%M')}; load {bench.load()}\n")
    extra = args.analyze_args.split()
    if args.spill:
        print("| set | MB read | run | wall s | client CPU s | workers CPU s | client peak PSS MiB | "
              "workers' peak PSS MiB (largest worker) | outputs equal to no cluster | load before → after |")
        print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
        spilled_runs(args, extra)
        print("\nwall: the client's (`pcapdecomp analyze --spill`), from its start to its end; the cluster is started "
              "before and stopped after, outside the time. CPU: user + system seconds (client: the process and the "
              "children it waited for; workers: the worker tree's processes, read from /proc). PSS sampled every 50 "
              "ms; the workers' tree includes `dask worker`'s nanny processes.")
        return 0
    print("| set | MB per point (files) | run | wall s | client CPU s | workers CPU s | client peak PSS MiB | "
          "workers' peak PSS MiB (largest worker) | outputs equal to one process | load before → after |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for src in args.sets:
        split = split_set(src, args.work, args.files)
        nfiles = len(list((split / "db").iterdir()))
        mb = (src / "db.pcap").stat().st_size / 1e6
        base = [sys.executable, "-m", "pcapdecomp.cli", "analyze", "--app", str(split / "app"), "--db",
                str(split / "db"), *(["--slow-log", str(split / "slow.log")] if (split / "slow.log").exists() else []),
                *extra, "-q"]
        runs = [("one process (--jobs 1)", None)] + [(f"--scheduler, {n} worker process{'es' if n > 1 else ''}", n)
                                                     for n in (int(x) for x in args.workers.split(","))]
        reference = args.work / "out-one"
        for label, n in runs:
            out = reference if n is None else args.work / f"out-{n}"
            shutil.rmtree(out, ignore_errors=True)
            before = bench.load()
            cluster = Cluster(n, args.work) if n else None
            try:
                argv = base + ["--out", str(out)] + (["--jobs", "1"] if n is None else ["--scheduler", cluster.address])
                m = measure(argv, cluster.workers.pid if cluster else None)
            finally:
                if cluster:
                    cluster.close()
            equal = "(reference)" if n is None else equal_outputs(reference, out)
            workers = f"{m['workers_mib']:,.0f} ({m['worker_max_mib']:,.0f})" if n else ""
            print(f"| {src.name} | {mb:,.0f} ({nfiles}) | {label} | {m['wall']:.1f} | {m['client_cpu']:.1f} | "
                  f"{m['workers_cpu']:.1f} | {m['client_mib']:,.0f} | {workers} | {equal} | {before} → {bench.load()} |",
                  flush=True)
    print("\nwall: the client's (`pcapdecomp analyze`), from its start to its end; the cluster is started before and "
          "stopped after, outside the time. CPU: user + system seconds (client: the process and the children it "
          "waited for; workers: the worker tree's processes, read from /proc). PSS sampled every 50 ms; the workers' "
          "tree includes `dask worker`'s nanny processes.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
