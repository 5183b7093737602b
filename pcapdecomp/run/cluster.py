"""`analyze --scheduler`: the passes over the captures on a Dask cluster (dask.distributed), not a runner of our own.

What runs on the workers, one task each:
- the extraction of every capture point, split into parts by TCP connection when there are more workers than
  points (`exchanges.extract(point, part=(i, n))`, as `--jobs` splits it on one machine; the parts are joined
  with `exchanges.merge_parts`, which gives exactly what one process gives);
- the clock's second pass over each point (`clocks.read_segments_of`: the segments of its matched connections).

A point's files are read by one task in their order (read/sources.py): a TCP connection, its exchange in progress and
its prepared statements carry from one file into the next, so cutting the work at file boundaries would cut
connections. The work splits by point and, inside a point, by connection; each part of a point reads all of the
point's files and parses its share of the connections.

Matching, the clock fit, the decomposition and the report run on the machine that runs `pcapdecomp`, from the
tables the workers send back (a few hundred bytes per exchange, not the packets).

With `--spill DIR` (run/spilled.py, docs/partitioned.md §16) the workers read the captures into the run's spill
folder (the extraction's tasks as above, each spilling its exchange rows there: only the buckets' counts, the
connections and the counts come back), and take the partitions' work (`DaskRunner.map`, one task a partition): 7a's first pass,
7a's rows made and kept, 7b's first pass, 7b's rows, the decomposed partition stored; back come small pieces (per class, per
connection piece, the thread-pool view's columns). The workers read and write the spill folder at its path: the
folder must be on a file system every worker shares (a LocalCluster: this machine's); `blind_to` checks it.

Trust: a Dask scheduler runs code in every client connected to it (that is what Dask is for), so the scheduler
and every client of it must be trusted like the analyst's own account. `--scheduler local` starts its cluster with
Dask's temporary TLS security (`Security.temporary()`: a fresh CA and certificate known to this process only), so
no other local user can connect to it; a remote scheduler is reached over `tcp://` (an isolated network only) or
`tls://` with `--scheduler-tls CA,CERT,KEY` (or Dask's own TLS configuration).

The workers open the capture files themselves: every file must be readable at the same path on every worker (a
shared file system). That is checked on every worker before any work, and a file a worker cannot read is a user
mistake named in one line.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..core.errors import UsageError
from ..read.sources import CapturePoint

CONNECT_TIMEOUT_S = float(os.environ.get("PCAPDECOMP_DASK_TIMEOUT", "10"))  # seconds to wait for the scheduler


SCHEMES = ("tcp", "tls")  # the Dask transports we connect over (ucx://, ws:// … are not supported)


def _security(tls: str):
    """Dask's Security for a tls:// scheduler from "CA,CERT,KEY" (the key may be inside CERT: "CA,CERT")."""
    from distributed.security import Security

    parts = [p.strip() for p in tls.split(",")]
    if len(parts) not in (2, 3) or not all(parts):
        raise UsageError(f"--scheduler-tls {tls}: give CA,CERT,KEY (three files, or CA,CERT with the key inside CERT)")
    for f in parts:
        if not os.path.isfile(f):
            raise UsageError(f"--scheduler-tls: {f}: no such file")
    ca, cert, key = (parts + [None])[:3]
    return Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True)


def _unreadable(files: list[str]) -> list[str]:
    """On a worker: the files it cannot open for reading."""
    out = []
    for f in files:
        try:
            with open(f, "rb"):
                pass
        except OSError:
            out.append(f)
    return out


def _sees(mark: str, token: str) -> bool:
    """On a worker: it reads `mark` as written (`token`) and can write beside it."""
    try:
        if Path(mark).read_text() != token:
            return False
        beside = Path(mark).with_name(f"{Path(mark).name}-{os.urandom(8).hex()}")
        beside.write_text(token)
        beside.unlink()
        return True
    except OSError:
        return False


def _extract_part(point: CapturePoint, servers, max_sql_bytes: int, part, tls_secrets=None, window=None,
                  spill: Path | None = None):
    """On a worker: one part of one capture point (its TLS connections decrypted with `tls_secrets`, the key log;
    only the exchanges in `window`, core.window, kept: the worker's memory follows the window too; `spill`: the
    folder of the run's spill folder, shared with the client, its exchange rows go to: only their buckets' counts
    come back)."""
    from ..read.exchanges import extract

    return extract(point, servers=servers, max_sql_bytes=max_sql_bytes, part=part, tls_secrets=tls_secrets,
                   window=window, spill=spill)


# a LocalCluster's scheduler serves HTTP (the health check) on 8787 unless told a port: a second run at the same
# time (two terminals, a test beside another) found it taken, and Dask printed a four-line UserWarning ("Port 8787
# is already in use …") on the user's terminal. Any free port of 127.0.0.1 instead: nothing here reads it
_HTTP_ANY_PORT = {"dashboard_address": "127.0.0.1:0"}


class DaskRunner:
    """A connected Dask client (and the LocalCluster it started, for `--scheduler local`)."""

    def __init__(self, client, cluster, address: str, quiet: bool):
        self.client, self.cluster, self.address, self.quiet = client, cluster, address, quiet

    @classmethod
    def connect(cls, scheduler: str, points: list[CapturePoint], quiet: bool, workers: int = 2,
                tls: str | None = None) -> "DaskRunner":
        """Connect to `scheduler` (an address, or "local": a LocalCluster of `workers` worker processes, TLS with a
        temporary certificate) and check that every worker can read every capture file. `tls`: "CA,CERT,KEY",
        the files that authenticate this client to a `tls://` scheduler."""
        scheme = scheduler.split("://", 1)[0].lower() if "://" in scheduler else "tcp"
        if scheduler != "local" and scheme not in SCHEMES:
            raise UsageError(f"--scheduler {scheduler}: {scheme}:// is not supported; give a tcp:// or tls:// address "
                             "or 'local'")
        if tls is not None and scheme != "tls":
            raise UsageError("--scheduler-tls is for a tls:// scheduler address")
        try:
            import dask
            from distributed import Client, LocalCluster
            from distributed.security import Security
        except ImportError:
            raise UsageError("--scheduler needs Dask: pip install 'pcapdecomp[dask]' (dask.distributed)") from None
        import logging

        logging.getLogger("distributed").setLevel(logging.ERROR)  # its own INFO lines are not ours to print
        # a gather that Ctrl-C (or SIGTERM) left waiting ends with AllExit when the client closes, and asyncio logs
        # it with a traceback ("Task exception was never retrieved"): the run is interrupted, said in one line
        logging.getLogger("asyncio").addFilter(_not_a_closed_clients_gather)
        cluster = None
        # a LocalCluster's workers log a failed task with its traceback on this terminal ("Compute Failed"): the
        # task's exception comes back here and is said in one line (a full --spill DIR, a bug's details file)
        quiet_workers = logging.CRITICAL
        if scheduler == "local":
            try:
                security = Security.temporary()
            except ImportError:  # no `cryptography`: workers in this process, no listening socket at all
                security = None
            n = max(1, workers)
            if security is not None:
                # Ctrl-C is this process's to handle (it closes the cluster): the terminal sends SIGINT to the whole
                # group, and a worker process started with it handled prints its KeyboardInterrupt's traceback; one
                # started with it ignored keeps it ignored (an ignored signal stays ignored across exec)
                previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
                try:
                    # its scheduler's HTTP server (on 127.0.0.1, not authenticated, there even without a dashboard)
                    # serves the health check alone: Dask's info and JSON pages named the workers, their memory and
                    # tasks to any local user
                    with dask.config.set({"distributed.scheduler.http.routes": ["distributed.http.health"]}):
                        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                               dashboard_address=None, silence_logs=quiet_workers, security=security,
                                               protocol="tls://", host="127.0.0.1", scheduler_kwargs=_HTTP_ANY_PORT)
                finally:
                    signal.signal(signal.SIGINT, previous)
                address = f"local ({n} worker processes, TLS)"
            else:
                cluster = LocalCluster(n_workers=1, threads_per_worker=n, processes=False, dashboard_address=None,
                                       silence_logs=quiet_workers, scheduler_kwargs=_HTTP_ANY_PORT)
                address = f"local (in this process, {n} threads)"
            _without_gc_diagnosis()
            client = Client(cluster, security=security)
        else:
            security = _security(tls) if tls is not None else None
            try:
                client = Client(scheduler, timeout=f"{CONNECT_TIMEOUT_S}s",
                                **({"security": security} if security is not None else {}))
            except Exception as err:  # noqa: BLE001 - Dask raises OSError, TimeoutError, ValueError, TypeError (TLS)
                why = str(err).splitlines()[0] if str(err) else type(err).__name__
                hint = (" (a tls:// scheduler needs --scheduler-tls CA,CERT,KEY or Dask's TLS configuration)"
                        if scheme == "tls" and security is None else "")
                raise UsageError(f"--scheduler {scheduler}: no Dask scheduler answers there ({why}){hint}") from None
            address = scheduler
        runner = cls(client, cluster, address, quiet)
        try:
            runner._check_files([f for p in points for f in p.files])
        except BaseException:
            runner.close()
            raise
        return runner

    def _check_files(self, files: list[str]) -> None:
        files = [os.path.abspath(f) for f in files]
        if not self.client.scheduler_info().get("workers"):
            self.client.wait_for_workers(1, timeout=CONNECT_TIMEOUT_S)
        missing = self.client.run(_unreadable, files)
        for worker, unreadable in sorted(missing.items()):
            if unreadable:
                raise UsageError(f"--scheduler: worker {worker} cannot read {unreadable[0]}"
                                 f"{f' (and {len(unreadable) - 1} more)' if len(unreadable) > 1 else ''}: the capture "
                                 "files must be readable at the same path on every worker (a shared file system)")

    def warm(self) -> None:
        """Every worker imports what its tasks import (the readers, pandas, pyarrow) now, not at its first task: a
        LocalCluster's memory, counted in the bound's start (core.memory.MemoryBound.count_children), then holds it
        (counted before the imports, a run predicted up to 785 MiB peaked at 802)."""
        self.client.run(_import_the_readers)

    @property
    def workers(self) -> int:
        info = self.client.scheduler_info().get("workers", {})
        return max(1, sum(w.get("nthreads", 1) for w in info.values()))

    def extract(self, points: list[CapturePoint], servers, max_sql_bytes: int, tls_secrets=None, window=None,
                spill: Path | None = None) -> list:
        """Every point's Extraction, read on the workers; parts of a point joined here. `tls_secrets` (the key log,
        mysql.tls) goes to the workers once and decrypts there as it does in one process; `window` (core.window):
        the exchanges kept; `spill`: the run's spill folder (analyze --spill), which every worker reads and writes
        at its path (blind_to): the workers spill the exchange rows there, as the processes of --jobs do."""
        from ..read.exchanges import merge_parts
        from ..read.extract import capture_bytes, lane_reads, plan, spill_folder

        absolute = [replace(p, files=tuple(os.path.abspath(f) for f in p.files)) for p in points]
        sizes = [capture_bytes(p) for p in absolute]
        parts = plan(sizes, self.workers, [not lane_reads(p) for p in absolute])
        tasks = [(i, (k, n) if n > 1 else None) for i, n in enumerate(parts) for k in range(n)]
        # scattered once (in a list: a scattered dict would be taken as one item per key), not sent with every task
        secrets = self.client.scatter([tls_secrets], broadcast=True)[0] if tls_secrets else None
        futures = [self.client.submit(_extract_part, absolute[i], servers, max_sql_bytes, part, secrets, window,
                                      spill_folder(spill, i, part), pure=False) for i, part in tasks]
        results = self._gather(futures, "reading captures on Dask")
        by_point: list[list] = [[] for _ in points]
        for (i, _), result in zip(tasks, results):
            by_point[i].append(result)
        return [merge_parts(group) for group in by_point]

    def map(self, function: Callable, shared, calls: list[tuple], label: str) -> list:
        """function(shared, *call) for every call, on the workers, `shared` sent to each worker once (scattered, not
        with every task); results in order. An exception a task raises is raised here, as it was raised."""
        held = self.client.scatter([shared], broadcast=True, hash=False)[0]
        futures = [self.client.submit(function, held, *call, pure=False) for call in calls]
        try:
            return self._gather(futures, label)
        finally:
            self.client.cancel([*futures, held])  # the workers let go of `shared` and the results

    def blind_to(self, folder: Path) -> str | None:
        """A worker that cannot read and write `folder` (a folder of this machine the workers are to share at the
        same path), else None."""
        mark = Path(folder) / "seen-by-the-workers"
        token = os.urandom(8).hex()
        mark.write_text(token)
        try:
            sees = self.client.run(_sees, str(mark), token)
        finally:
            mark.unlink(missing_ok=True)
        return next((worker for worker, ok in sorted(sees.items()) if not ok), None)

    def run(self, function: Callable, calls: list[tuple]) -> list:
        """function(*call) for every call, on the workers; results in order."""
        futures = [self.client.submit(function, *call, pure=False) for call in calls]
        return self._gather(futures, "reading segments on Dask")

    def _gather(self, futures: list, label: str) -> list:
        if self.quiet or not futures:
            return self.client.gather(futures)
        from distributed import wait
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True, disable=not console.is_terminal) as bar:
            task = bar.add_task(label, total=len(futures))
            while True:
                done = sum(f.done() for f in futures)
                bar.update(task, completed=done)
                if done == len(futures) or any(f.status == "error" for f in futures):
                    break
                try:
                    wait(futures, timeout=0.2, return_when="FIRST_COMPLETED")
                except TimeoutError:  # Dask's wait raises when none is done within the timeout: poll again
                    pass
                time.sleep(0.05)
        return self.client.gather(futures)

    def close(self) -> None:
        """The client and its LocalCluster closed; a second call does nothing (run.spilled closes it before the
        spill folder goes, the run again at its end)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        try:
            self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()


def _not_a_closed_clients_gather(record) -> bool:
    """A logging filter: False for asyncio's record of a closed client's gather (distributed.client.AllExit)."""
    return "exception=AllExit()" not in record.getMessage()


def _without_gc_diagnosis() -> None:
    """The in-process scheduler's garbage-collection timer (distributed.gc) off: a Ctrl-C that lands in its gc
    callback is swallowed there ("Exception ignored in … _gc_callback", with a traceback) and the run goes on; it
    only feeds a log of long collections this run silences anyway."""
    try:
        from distributed.gc import disable_gc_diagnosis
    except ImportError:
        return
    disable_gc_diagnosis(force=True)


def _import_the_readers() -> None:
    """On a worker: the modules the extraction's and the partitions' tasks import (DaskRunner.warm)."""
    import importlib

    for name in ("pandas", "pyarrow.parquet", "pcapdecomp.read.exchanges", "pcapdecomp.explain.partitioned"):
        importlib.import_module(name)
