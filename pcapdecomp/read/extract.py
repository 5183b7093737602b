"""Stage 1's face: `extract_points` reads every capture point of a capture set → `Extracted`. Below it, the
extraction on several cores (`--jobs`, `extract_all`): the work splits by capture file and, inside a capture, by TCP
connection: each worker process reads the whole file but parses only its part of the connections (FlowTracker's
`part`), and `merge_parts` joins the parts into exactly what one process gives (tests compare them).

Workers are forked before the progress bar starts its thread; they report bytes read through shared memory."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.console import capture_problems, progress_bar
from ..core.errors import UsageError
from ..core.memory import Counts, MemoryBound
from ..core.window import Window, iso_text
from ..core.workers import worker_pool
from . import fastlane
from .exchanges import Extraction, extract, merge_parts
from .flows import Endpoint
from .sources import CapturePoint, check_input, file_report, parse_server, single_file_entry

if TYPE_CHECKING:
    from .captureset import CaptureSet

SMALL_CAPTURE_BYTES = 16 << 20  # below this, starting processes costs more than it saves


def plan(sizes: list[int], jobs: int, splittable: list[bool] | None = None) -> list[int]:
    """How many parts to split each capture into, given their sizes in bytes and the number of workers: every
    capture gets a share of the workers in proportion to its size, at least one part; small work stays serial.
    A capture that is not `splittable` stays one part: the native fast lane reads it faster alone than several
    workers that each read the whole file for their part of the connections (benchmarks/bench.py)."""
    if jobs <= 1 or sum(sizes) < SMALL_CAPTURE_BYTES or not sizes:
        return [1] * len(sizes)
    if len(sizes) >= jobs:
        return [1] * len(sizes)
    total = sum(sizes) or 1
    parts = [max(1, round(jobs * s / total)) for s in sizes]
    while sum(parts) > jobs and max(parts) > 1:
        parts[parts.index(max(parts))] -= 1
    if splittable is not None:
        parts = [n if split else 1 for n, split in zip(parts, splittable)]
    return parts


_PROGRESS = None  # shared array: bytes and frames read, two slots per task, inherited by forked workers
# With a window (analyze --since/--until): (the window, a shared array of the latest request time each task's
# batches reached, each task's share of the bytes read), inherited by forked workers; window_share reads it
_WINDOW_READ: tuple[Window, object, list[float]] | None = None


def _reached(slot: int) -> Callable[[int], None] | None:
    """What a task's extraction tells how far into the capture's time it is (None without a window)."""
    if _WINDOW_READ is None:
        return None
    reached = _WINDOW_READ[1]

    def tell(ns: int) -> None:
        reached[slot] = max(reached[slot], ns)
    return tell


def window_share() -> float | None:
    """The share of the window's time the extraction has read so far (each task by the latest request its batches
    held, weighted by its share of the bytes), for the memory bound's extrapolation: with a window the rows held
    grow with the window's time read, not with the bytes. None without a window or with an open end (then the
    share of the bytes read is the measure)."""
    if _WINDOW_READ is None or _WINDOW_READ[0].length_ns is None:
        return None
    window, reached, weights = _WINDOW_READ
    since, length = window.since_ns, window.length_ns
    return sum(w * min(max((reached[i] - since) / length, 0.0), 1.0) if reached[i] else 0.0
               for i, w in enumerate(weights))


def _work(slot: int, path: str, servers: set[Endpoint] | None, max_sql_bytes: int, part: tuple[int, int] | None,
          tls_secrets=None, spill: Path | None = None, window: Window | None = None):
    def progress(done: int, total: int, frames: int) -> None:
        _PROGRESS[2 * slot] = done
        _PROGRESS[2 * slot + 1] = frames

    x = extract(path, servers=servers, max_sql_bytes=max_sql_bytes, part=part, progress=progress,
                tls_secrets=tls_secrets, spill=spill, window=window, reached=_reached(slot))
    _as_frames(x)
    return x


def _as_frames(x: Extraction) -> None:
    """The parent wants DataFrames (analyze's stages, merge_parts): made where the extraction ran, the Arrow tables
    go column by column as they become the DataFrame that is sent; sent as Arrow tables, the parent would hold both
    while it converts. A spilled exchanges table stays in its buckets (read back, it would be sent and held whole:
    what the spill is there to avoid)."""
    if x.spill is None:
        x.exchanges  # noqa: B018
    x.connections  # noqa: B018


def capture_bytes(path) -> int:
    """Size of a capture file, or of all the files of a capture point (sources.CapturePoint)."""
    files = getattr(path, "files", None)
    return sum(os.stat(f).st_size for f in files) if files is not None else os.stat(path).st_size


def lane_reads(path) -> bool:
    """The fast lane reads this capture (every file of a capture point)."""
    files = getattr(path, "files", None)
    return all(fastlane.reads(f) for f in files) if files is not None else fastlane.reads(path)


def extract_all(paths: list[Path], servers: set[Endpoint] | None, max_sql_bytes: int, jobs: int,
                progress: Callable[[int, int, int], None] | None = None, tls_secrets=None,
                spill: Path | None = None, window: Window | None = None) -> list[Extraction]:
    """Extract every capture (a file or a sources.CapturePoint), using up to `jobs` processes; results in the order
    of `paths`. `tls_secrets`: a key log (mysql.tls) that decrypts the TLS connections it has secrets for.
    `spill`: a folder the captures spill their exchange rows into (read/spill.py), a folder per capture and part
    (`spill_folder`). `window` (core.window): only the exchanges whose request falls in it are kept."""
    sizes = [capture_bytes(p) for p in paths]
    parts = plan(sizes, jobs, [not lane_reads(p) for p in paths])
    try:
        return _extract_all(paths, sizes, parts, servers, max_sql_bytes, jobs, progress, tls_secrets, spill, window)
    finally:
        global _WINDOW_READ
        _WINDOW_READ = None


def _extract_all(paths: list, sizes: list[int], parts: list[int], servers: set[Endpoint] | None, max_sql_bytes: int,
                 jobs: int, progress: Callable[[int, int, int], None] | None, tls_secrets, spill: Path | None,
                 window: Window | None) -> list[Extraction]:
    """extract_all's work, once the captures are planned into `parts`."""
    global _WINDOW_READ
    serial = sum(parts) == len(paths) and (jobs <= 1 or len(paths) == 1)
    if window is not None:  # one slot per capture read here, else per task
        weights = ([s / (sum(sizes) or 1) for s in sizes] if serial else
                   [s / n / (sum(sizes) or 1) for s, n in zip(sizes, parts) for _ in range(n)])
        _WINDOW_READ = (window, mp.get_context("fork").Array("q", len(weights), lock=False), weights)
    if serial:
        out: list[Extraction] = []
        for path, before in zip(paths, [sum(sizes[:i]) for i in range(len(sizes))]):
            if out and spill is None:  # the previous capture's DataFrames before the next is read: its tables are
                # held in their narrower form (tables.held) meanwhile, not as the Arrow tables of the declared
                # widths (a spilled capture holds its buckets' names alone)
                out[-1].exchanges, out[-1].connections  # noqa: B018
            frames_before = sum(x.stats.frames for x in out)
            step = None if progress is None else (
                lambda d, t, f, b=before, fb=frames_before: progress(b + d, sum(sizes), fb + f))
            out.append(extract(path, servers=servers, max_sql_bytes=max_sql_bytes, progress=step,
                               tls_secrets=tls_secrets, spill=spill_folder(spill, len(out), None), window=window,
                               reached=_reached(len(out))))
        return out
    tasks = [(i, path, (k, n) if n > 1 else None) for i, (path, n) in enumerate(zip(paths, parts)) for k in range(n)]
    # When every task has a process of its own, this one reads the first task itself instead of waiting: its
    # tables are not pickled in a worker and unpickled here, and one fork less.
    here = len(tasks) <= jobs
    total = sum(sizes)
    global _PROGRESS
    _PROGRESS = mp.get_context("fork").Array("q", 2 * len(tasks), lock=False)

    def show() -> None:
        if progress is not None:
            # each part reads the whole file: a capture is as far as its parts are on average
            done = sum(_PROGRESS[2 * s] / parts[tasks[s][0]] for s in range(len(tasks)))
            frames = sum(_PROGRESS[2 * s + 1] / parts[tasks[s][0]] for s in range(len(tasks)))
            progress(int(done), total, int(frames))

    def own_progress(done: int, _total: int, frames: int) -> None:
        _PROGRESS[0], _PROGRESS[1] = done, frames
        show()

    try:
        with worker_pool(min(jobs - here, len(tasks) - here)) as pool:
            futures = [pool.submit(_work, slot, path if hasattr(path, "files") else os.fspath(path), servers,
                                   max_sql_bytes, part, tls_secrets, spill_folder(spill, i, part), window)
                       for slot, (i, path, part) in enumerate(tasks) if slot >= here]
            own = [extract(tasks[0][1], servers=servers, max_sql_bytes=max_sql_bytes, part=tasks[0][2],
                           progress=own_progress, tls_secrets=tls_secrets,
                           spill=spill_folder(spill, 0, tasks[0][2]), window=window, reached=_reached(0))] \
                if here else []
            for x in own:  # its DataFrames now, while the workers still make and send theirs (as _work does)
                _as_frames(x)
            while True:
                finished, pending = wait(futures, timeout=0.2, return_when=FIRST_EXCEPTION)
                show()
                if not pending or any(f.exception() is not None for f in finished):
                    break
            results = own + [f.result() for f in futures]  # re-raises a worker's error here
    finally:
        _PROGRESS = None
    by_capture: list[list[Extraction]] = [[] for _ in paths]
    for (i, _, _), result in zip(tasks, results):
        by_capture[i].append(result)
    return [merge_parts(group) for group in by_capture]


def spill_folder(spill: Path | None, capture: int, part: tuple[int, int] | None) -> Path | None:
    """The folder of capture `capture` (its index among the captures read), part `part`, inside the run's spill
    folder (None: no spill)."""
    if spill is None:
        return None
    return Path(spill) / (f"capture-{capture:02d}" + ("" if part is None else f"-part-{part[0]}-of-{part[1]}"))



def read_exchanges(capture: Path, servers: list[str], quiet: bool, max_sql_bytes: int = 1 << 20,
                   jobs: int = 1, tls_keylog: list | None = None) -> Extraction:
    """One capture file's exchanges (the `exchanges` command): checked, with up to `jobs` processes, a progress bar
    on the terminal unless `quiet`. `servers`: the user's --server texts (HOST:PORT); `tls_keylog`: key log files
    (with the capture's own Decryption Secrets Blocks, they decrypt TLS connections)."""
    check_input(capture)
    endpoints = {parse_server(s) for s in servers}
    from .tlskeys import load_secrets

    secrets = load_secrets(list(tls_keylog or []), [capture])
    with progress_bar(quiet, capture.name) as update:
        return extract_all([capture], endpoints or None, max_sql_bytes, jobs, update, tls_secrets=secrets)[0]


# --- the stage's face: every capture point of a capture set --------------------------------------------------------


@dataclass
class Extracted:
    """Stage 1's result: the extraction of every capture point of a capture set, by kind (each list in the order of
    its points), what summary.json says of the points, and the TLS secrets the later passes over the captures use."""

    app_points: list[CapturePoint]
    db_points: list[CapturePoint]
    proxy_points: list[CapturePoint]
    app: list[Extraction]
    db: list[Extraction]
    proxy: list[Extraction]
    points: list[dict]  # summary.json → points: each point's files, their gaps and overlaps, a DB point's servers
    qualities: dict[str, list[dict]]  # {"app", "dbs", "proxy"}: each extraction's quality(), in the same order
    tls_secrets: object = None  # mysql.tls key material for the connections later passes decrypt again

    @property
    def all(self) -> list[Extraction]:
        return [*self.app, *self.db, *self.proxy]


def extract_points(cs: CaptureSet, jobs: int, quiet: bool, max_sql_bytes: int, note: Callable[[str], None],
                   runner=None, memory: MemoryBound | None = None, spill: Path | None = None,
                   spill_hint: bool = False) -> Extracted:
    """Every capture point of `cs`, read with up to `jobs` processes, or on Dask workers (`runner`, a
    run.cluster.DaskRunner); the capture problems and file warnings go to `note`. Behind a proxy the app talks to
    the proxy's address, not the server's: every capture is read for both. `memory`: the run's bound, checked as
    the captures are read (on this machine) and on the counts at the end (MemoryBoundError). `spill`: a folder the
    points spill their exchange rows into as they are read (read/spill.py; on the Dask workers of `runner` too,
    which must share it); each point's table is read back from it when first asked for. `spill_hint`: the
    partitioned run (--spill) would take this set: a refusal of the in-memory run says what that one needs."""
    app_pts, db_pts, proxy_pts = cs.of("app"), cs.of("db"), cs.of("proxy")
    read = [*app_pts, *db_pts, *proxy_pts]
    readable = [*cs.servers, *cs.proxy_servers] if cs.servers else []
    from .tlskeys import load_secrets

    tls_secrets = load_secrets(cs.tls_keylogs, read)
    endpoints = {parse_server(s) for s in readable} or None
    window = cs.window
    if runner is not None:
        extractions = runner.extract(read, endpoints, max_sql_bytes, tls_secrets, window, spill=spill)
    else:
        label = read[0].name if len(read) == 1 else f"{len(read)} captures"
        with progress_bar(quiet, label) as update:
            step = update if memory is None else memory.watching(update, window_share if window else None, spill_hint,
                                                                 spilled=spill is not None)
            extractions = extract_all(list(read), endpoints, max_sql_bytes, jobs, step, tls_secrets=tls_secrets,
                                      spill=spill, window=window)
    qualities = [x.quality() for x in extractions]
    if window is not None:
        _check_window(window, read, extractions, qualities, note)
    points = _points_info(read, extractions, qualities, note)
    n_app, n_db = len(app_pts), len(db_pts)
    for side, xs in (("app", extractions[:n_app]), ("DB", extractions[n_app:n_app + n_db])):
        _captured_twice(side, xs, note)
    extracted = Extracted(app_pts, db_pts, proxy_pts, extractions[:n_app], extractions[n_app:n_app + n_db],
                          extractions[n_app + n_db:], points,
                          {"app": qualities[:n_app], "dbs": qualities[n_app:n_app + n_db],
                           "proxy": qualities[n_app + n_db:]}, tls_secrets)
    if memory is not None:  # before the stages that hold the memory (spilled: the partitioned run's peak; a set it
        # turns out not to take is checked again as analysed in memory, run/spilled.py)
        memory.check(counts_of(extracted), span_ns(extractions, window), window=window, partitioned=spill is not None,
                     spill_hint=spill_hint)
    return extracted


# connections of two points of one side with the same endpoints are one connection when their frames are this close
# in time (a file's last frame and the next file's first, when one point's rotated files are given as two points)
TWICE_WITHIN_NS = 1_000_000_000


def _captured_twice(side: str, xs: list[Extraction], note: Callable[[str], None]) -> None:
    """A warning when two points of one side hold the same TCP connection (the same client and server endpoints, at
    the same time or one just after the other): one host captured twice, or one point's files (rotated halves)
    given as two points. Each point's rows of it are then taken for another connection: split in two, paired apart,
    counted twice, or taken for a proxy between the points (the same exchanges seen at the app, the DB seeing them
    on one connection)."""
    if len(xs) < 2:
        return
    import pandas as pd

    spans = []
    for k, x in enumerate(xs):
        c = x.connections
        if len(c):
            spans.append(pd.DataFrame({"point": k, "client": c["client"].astype(str).to_numpy(),
                                       "server": c["server"].astype(str).to_numpy(),
                                       "first": c["first_ts"].to_numpy(dtype="datetime64[ns]").view("int64"),
                                       "last": c["last_ts"].to_numpy(dtype="datetime64[ns]").view("int64")}))
    if len(spans) < 2:
        return
    every = pd.concat(spans, ignore_index=True)
    both = every.merge(every, on=["client", "server"], suffixes=("", "_other"))
    both = both[(both["point"] < both["point_other"]) & (both["first"] <= both["last_other"] + TWICE_WITHIN_NS)
                & (both["first_other"] <= both["last"] + TWICE_WITHIN_NS)]
    for (a, b), shared in both.groupby(["point", "point_other"], sort=True):
        n = shared[["client", "server"]].drop_duplicates().shape[0]
        note(f"{side} points {xs[a].capture} and {xs[b].capture} hold the same {n:,} TCP connection"
             f"{'s' if n != 1 else ''} (the same client and server endpoints at the same time, e.g. "
             f"{shared['client'].iloc[0]} → {shared['server'].iloc[0]}): one host captured twice, or one point's "
             f"files given as two points — give a point's files as one point (a quoted glob: --{side.lower()} "
             "'app.pcap*'). Each point's part of such a connection is counted as a connection of its own: its "
             "exchanges may be paired apart, counted twice, or taken for a proxy's")


def counts_of(x: Extracted) -> Counts:
    """What the run's memory grows with (core.memory.Counts), from the points' quality counts."""
    every = [*x.qualities["app"], *x.qualities["dbs"], *x.qualities["proxy"]]
    db = sum(q["exchanges"] for q in x.qualities["dbs"])
    # the loss repair reads a lossy point's connections again to borrow from the other point: a DB or app capture
    # alone has none to borrow from, and is analysed with its holes
    repairs = bool(x.app and x.db)
    return Counts(db_exchanges=db, other_exchanges=sum(q["exchanges"] for q in every) - db,
                  connections=sum(q["mysql_connections"] for q in every), points=len(every),
                  repaired_bytes=sum(_lossy_bytes(e) for e in x.all) if repairs else 0)


def _lossy_bytes(x: Extraction) -> int:
    """The MySQL bytes of the point's connections with holes: those the loss repair reads again (each whole; the
    connections without a hole are not read: counting every byte of a lossy point predicted the repaired run of the
    40 s read-write pair, 16 of its 32 connections lossy, at 928 MiB for a 467 MiB peak)."""
    c = x.connections
    if not x.holes or not len(c):
        return 0
    lossy = c["conn_index"].isin(list(x.holes)).to_numpy()
    return int(c["mysql_bytes"].to_numpy(dtype="int64", na_value=0)[lossy].sum())


def span_ns(extractions: list[Extraction], window: Window | None = None) -> int | None:
    """The captures' time span, first frame to last (None when no frame had a time); with a window, the part of it
    in the window."""
    firsts = [x.stats.first_ts_ns for x in extractions if x.stats.first_ts_ns is not None]
    lasts = [x.stats.last_ts_ns for x in extractions if x.stats.last_ts_ns is not None]
    if not firsts or not lasts:
        return None
    first, last = min(firsts), max(lasts)
    if window is not None:
        first = max(first, window.since_ns) if window.since_ns is not None else first
        last = min(last, window.until_ns) if window.until_ns is not None else last
    return max(last - first, 0)


def _check_window(window: Window, points: list[CapturePoint], extractions: list[Extraction], qualities: list[dict],
                  note: Callable[[str], None]) -> None:
    """A window outside every capture is a mistake (UsageError: nothing analysed); a point that kept no exchange
    in it is analysed, with a warning (a capture that ended early, or began late)."""
    spans = [(x.stats.first_ts_ns, x.stats.last_ts_ns) for x in extractions]
    if not any(window.meets(*span) for span in spans):
        held = "; ".join(f"{pt.name}: {iso_text(a)} … {iso_text(b)}" if a is not None and b is not None
                         else f"{pt.name}: no timed frame" for pt, (a, b) in zip(points, spans))
        raise UsageError(f"--since/--until: the window {window.text()} is outside every capture ({held}): nothing "
                         "to analyse")
    for pt, quality, (a, b) in zip(points, qualities, spans):
        if not quality["exchanges"]:
            where = (f"the capture runs {iso_text(a)} … {iso_text(b)}" if a is not None and b is not None
                     else "the capture has no timed frame")
            note(f"{pt.name}: no exchange began in the window {window.text()} ({where}): analysed without this "
                 "point's exchanges")


def _points_info(points: list[CapturePoint], extractions: list[Extraction], qualities: list[dict],
                 note: Callable[[str], None]) -> list[dict]:
    """summary.json → points: each point's files (and their gaps and overlaps) and the servers a DB point saw; the
    capture problems and file warnings go to `note`."""
    out = []
    for pt, x, quality in zip(points, extractions, qualities):
        problem = capture_problems(quality)
        if problem:
            note(problem)
        if pt.multi:
            entry, file_warnings = file_report(pt, x.files)
            for w in file_warnings:
                note(w)
        else:
            entry = single_file_entry(pt, x.stats)
        entry["servers"] = sorted(set(x.connections["server"].dropna().astype(str))) if pt.kind == "db" else []
        out.append(entry)
    return out
