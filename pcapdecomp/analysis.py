"""`pcapdecomp analyze`, the orchestration: resolve the capture set (read/captureset.py), extract each capture point
(read/extract.py or run/cluster.py), pair the points (pair/match.py, through a proxy pair/proxy.py, capture loss pair/repair.py), fit the
clocks (match.read_segments_of, pair/clock.py), join the slow log and decompose every exchange's latency per DB server
(explain/decompose.py), view the thread pool (explain/threadpool.py), build summary.json and its verdict (explain/summary.py, explain/verdict.py)
and write exchanges.parquet, groups.parquet, pool.parquet, summary.json and report.html as one set (core/outputs.py,
render/report.py). The stage logic lives in those modules; this one passes tables from one to the next, releases memory
between them and collects the warnings."""

from __future__ import annotations

from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .core.console import capture_problems, progress_bar, warn
from .core.endpoints import split_endpoint
from .core.errors import InputError, SlowLogError, UsageError, internal_errors_to
from .core.memory import map_big_blocks, release_memory
from .core.outputs import OutputFolder, write_table, write_text
from .core.schema import ANALYSIS_COLUMNS, EXCHANGE_COLUMNS
from .core.tables import as_category, concat, with_declared_dtypes
from .core.workers import Ahead, Forked, default_jobs, run_all
from .explain.decompose import build_table, decompose
from .explain.stories import tell as tell_stories
from .explain.summary import ServerPart
from .explain.summary import build as build_summary
from .explain.summary import clock_entry, latency_quantiles
from .explain.summary import to_json as summary_json
from .explain.threadpool import thread_pool_view
from .pair.clock import ClockModel, estimate_clock
from .pair.match import Matching, Pairing, pair_segments, read_segments_of
from .pair.proxy import NoProxy, Side
from .pair.proxy import empty_columns as proxy_empty
from .pair.proxy import finish as proxy_finish
from .pair.proxy import through_proxy
from .pair.repair import apply_bounds, point_bounds, repair_losses
from .read import connids, sources
from .read.captureset import CaptureSet, resolve_capture_set, time_zone
from .read.sources import CapturePoint, parse_server
from .render.report import component_rows
from .render.report import render as render_report
from .render.report import unspanned_profile


@dataclass
class AnalysisResult:
    out_dir: Path
    exchanges: pd.DataFrame  # EXCHANGE_COLUMNS + ANALYSIS_COLUMNS
    groups: pd.DataFrame  # per thread group and time bucket
    summary: dict  # what summary.json holds
    written: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _flows(conns: pd.DataFrame) -> set[tuple[str, int, str, int]]:
    out = set()
    for client, server in zip(conns["client"], conns["server"]):
        ci, cp = split_endpoint(client)
        si, sp = split_endpoint(server)
        out.add((ci, cp, si, sp))
    return out


ANALYSIS_NAMES = ("exchanges.parquet", "groups.parquet", "pool.parquet", "summary.json", "report.html")  # always


def analyze(set_dir: Path | None, app: list, db, slow_log, long_query_time: float | None,
            thread_pool_size: int | None, servers: list[str], out_dir: Path | None,
            csv: bool = False, quiet: bool = False, slow_log_tz: str | None = None,
            command_line: str | None = None, max_sql_bytes: int = 1 << 20,
            jobs: int | None = None, scheduler: str | None = None, partitioned: bool = False,
            proxy: list | None = None, proxy_servers: list[str] | None = None,
            processlist: Path | None = None, server_settings: dict | None = None,
            tls_keylog: list | None = None, scheduler_tls: str | None = None) -> AnalysisResult:
    """Run every stage and write the outputs. Raises PcapdecompError subclasses for user mistakes.
    `app`, `db`: capture points (a file, a glob, a folder; `db` one or a list); `slow_log`: one or one per DB point.
    `scheduler`: a Dask scheduler address or "local" (pcapdecomp/run/cluster.py) to extract on Dask workers,
    `scheduler_tls` "CA,CERT,KEY" for a tls:// one. `proxy`:
    capture points on a proxy host between app and DB (pcapdecomp/pair/proxy.py), `proxy_servers` its endpoints.
    `processlist`: a processlist snapshot naming the connections the captures saw no greeting of (read/connids.py).
    `server_settings`: the server's settings for the playbook (playbook.read_server_vars); None: capture.toml's.
    `tls_keylog`: NSS key logs that decrypt TLS connections (read/tlskeys.py)."""
    cs = resolve_capture_set(set_dir, app, db, slow_log, long_query_time, thread_pool_size, servers, proxy,
                             proxy_servers, processlist, tls_keylog)
    cs.server_settings = server_settings
    if server_settings is None and cs.server_vars is not None:  # the folder's variables.tsv: damaged, a warning
        from .explain.playbook import read_server_vars

        try:
            cs.server_settings = read_server_vars(cs.server_vars)
        except InputError as err:
            cs.warnings.append(f"{err}; what to change is told from capture.toml's settings")
    tz = time_zone(slow_log_tz)
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be ≥ 1, got {jobs}")
    out = out_dir if out_dir is not None else Path("reports") / cs.name
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder")
    runner = None
    if scheduler is not None:
        from .run.cluster import DaskRunner

        # a wrong address fails here, before any work
        runner = DaskRunner.connect(scheduler, cs.points, quiet, jobs, tls=scheduler_tls)
    # the outputs are written as a set (outputs.OutputFolder); a bug becomes one line, its traceback a file in out
    try:
        with internal_errors_to(out):
            with OutputFolder(out, ANALYSIS_NAMES) as folder, Ahead(jobs if runner is None else 1) as ahead:
                result, names = _analyze(cs, tz, jobs, folder.staging, csv, quiet, command_line, max_sql_bytes,
                                         runner, partitioned, ahead)
                folder.commit()
    finally:
        if runner is not None:
            runner.close()
    result.out_dir = out
    result.written = [out / name for name in names]
    return result


def _pair_key(app: str, db: str) -> str:
    """The name of the clock between an app point and a DB point (summary.json → clocks, with several DB points)."""
    return f"{app} ↔ {db}"


def _extract(points: list[CapturePoint], servers: list[str], quiet: bool, max_sql_bytes: int, jobs: int,
             runner, tls_secrets=None) -> list:
    """Every point's Extraction: in this machine's worker processes (--jobs), or on Dask (--scheduler); both
    decrypt the TLS connections `tls_secrets` has keys for."""
    from .read.extract import extract_all

    endpoints = {parse_server(s) for s in servers} or None
    if runner is not None:
        return runner.extract(points, endpoints, max_sql_bytes, tls_secrets)
    label = points[0].name if len(points) == 1 else f"{len(points)} captures"
    with progress_bar(quiet, label) as update:
        return extract_all(list(points), endpoints, max_sql_bytes, jobs, update, tls_secrets=tls_secrets)


def _points_info(points: list[CapturePoint], extractions: list, qualities: dict, note) -> list[dict]:
    """summary.json → points: each point's files (and their gaps and overlaps) and the servers a DB point saw; the
    capture problems and file warnings go to `note`."""
    out = []
    for pt, x in zip(points, extractions):
        problem = capture_problems(qualities[id(x)])
        if problem:
            note(problem)
        if pt.multi:
            entry, file_warnings = sources.file_report(pt, x.files)
            for w in file_warnings:
                note(w)
        else:
            entry = sources.single_file_entry(pt, x.stats)
        entry["servers"] = sorted(set(x.connections["server"].dropna().astype(str))) if pt.kind == "db" else []
        out.append(entry)
    return out


def _analyze(cs: CaptureSet, tz, jobs: int, out: Path, csv: bool, quiet: bool, command_line: str | None,
             max_sql_bytes: int, runner=None, partitioned: bool = False, ahead: Ahead | None = None
             ) -> tuple[AnalysisResult, list[str]]:
    """Every stage; the outputs are written to `out` (the staging folder). Returns the result and the file names.
    `ahead`: workers for the clock's segment pass, started while the captures are paired (_segments_ahead)."""
    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        if not quiet:
            warn(message)

    for message in cs.warnings:
        note(message)
    for pt in cs.points:
        sources.register(pt)  # later passes (repair, clock) open the point by its name
    # With --jobs 1 (memory before time), until the loss repair is done, a freed array of 1 MiB or more goes back
    # to the OS at once: the extraction's arrays and the repair's scan and re-read come and go beside the tables,
    # and left in the heap they were ~0.1 GB of the whole run's peak; it costs page faults (tables.map_big_blocks)
    lean = jobs == 1 and runner is None
    if lean:
        map_big_blocks(1 << 20)

    app_pts, db_pts, proxy_pts = cs.of("app"), cs.of("db"), cs.of("proxy")
    read = [*app_pts, *db_pts, *proxy_pts]
    # behind a proxy the app talks to the proxy's address, not the server's: read every capture with both
    readable = [*cs.servers, *cs.proxy_servers] if cs.servers else []
    from .read.tlskeys import load_secrets

    tls_secrets = load_secrets(cs.tls_keylogs, read)
    extractions = _extract(read, readable, quiet, max_sql_bytes, jobs, runner, tls_secrets)
    app_x = extractions[:len(app_pts)]
    db_xs = extractions[len(app_pts):len(app_pts) + len(db_pts)]
    proxy_x = extractions[len(app_pts) + len(db_pts):]
    read_ahead = _segments_ahead(ahead, app_pts, db_pts, app_x, db_xs) if ahead is not None and not proxy_pts else {}
    qualities = {id(x): x.quality() for x in extractions}
    points_info = _points_info(read, extractions, qualities, note)
    empty = _empty_extraction_frames()
    app_ex = concat([x.exchanges for x in app_x]) if app_x else empty[0]
    app_conns = concat([x.connections for x in app_x]) if app_x else empty[1]
    db_ex = concat([x.exchanges for x in db_xs]) if db_xs else empty[0]
    db_conns = concat([x.connections for x in db_xs]) if db_xs else empty[1]
    # the connection pairs now; the exchange pairs inside them when wanted: after the loss repair, which replaces
    # the rows of the connections it repairs (match.Pairing)
    matching = Pairing(app_ex, db_ex, app_conns, db_conns)
    proxied = through_proxy(Side(app_ex, app_conns) if app_x else None, Side(db_ex, db_conns) if db_xs else None,
                            Side(concat([x.exchanges for x in proxy_x]), concat([x.connections for x in proxy_x]))
                            if proxy_x else None, set(cs.servers), set(cs.proxy_servers), direct=matching)
    proxy_summary = proxied.summary if proxied is not None else None
    if isinstance(proxied, NoProxy):  # a proxy capture without a proxy in its traffic stays out of the way
        note(f"{', '.join(str(p) for p in cs.proxy)}: {proxied.warning}")
        proxied = None
        if not app_x:  # it is the client side's view
            app_x, app_pts = proxy_x, proxy_pts
            app_ex, app_conns = concat([x.exchanges for x in app_x]), concat([x.connections for x in app_x])
            matching = Pairing(app_ex, db_ex, app_conns, db_conns)
            proxied = through_proxy(Side(app_ex, app_conns), Side(db_ex, db_conns) if db_xs else None, None,
                                    set(cs.servers), set(cs.proxy_servers), direct=matching)
            proxy_summary = proxied.summary if proxied is not None else proxy_summary
    if proxied is not None:  # the two sides of the decomposition are the ends of the chain through the proxy
        app_ex, app_conns, db_ex, db_conns = (proxied.client.ex, proxied.client.conns, proxied.server.ex,
                                              proxied.server.conns)
        matching = proxied.matching
        for w in proxied.warnings:
            note(w)
    # app_ex and db_ex hold the extractions' exchanges now: the extractions let theirs go, so that a table the
    # repair replaces is not kept alive through the stages after it (40 s lossy sysbench pair: 0.23 GB)
    for x in extractions:
        x.exchanges = x.exchanges.iloc[:0].copy()  # a copy: an empty view would keep the whole table alive
    release_memory()
    # capture loss is repaired between two captures of one TCP connection: not through a proxy
    repair = None
    if app_x and db_xs and proxied is None:
        handed = [app_ex, db_ex, app_conns, db_conns, matching]  # repair_losses lets them go once replaced
        del app_ex, db_ex, app_conns, db_conns, matching
        repair = repair_losses(app_x, db_xs if len(db_xs) != 1 else db_xs[0], handed,
                               {parse_server(s) for s in cs.servers} or None, max_sql_bytes, jobs, tls_secrets)
        if repair is None:
            app_ex, db_ex, app_conns, db_conns, matching = handed
        del handed
    if repair is not None:
        app_ex, db_ex, app_conns, db_conns, matching = (repair.app_ex, repair.db_ex, repair.app_conns,
                                                        repair.db_conns, repair.matching)
        # held here only: `del db_ex` below lets the DB table go (40 s lossy sysbench pair: 0.25 GB)
        repair.app_ex = repair.db_ex = None
        release_memory()
        for message in repair.stats.warnings():
            note(message)
    elif not isinstance(matching, Matching):  # nothing to repair: the exchanges paired from the same connection pairs
        matching = matching.complete()
    if lean:
        map_big_blocks(None)  # the extractions and the repair are done: see above
    if app_x and db_xs and matching.stats.matched == 0 and len(app_ex) and len(db_ex):
        note("no exchange was seen at both points: are these captures of the same traffic and time?")

    # --- clocks: one model per app point and DB point, from segments of their matched connections
    several = len(db_xs) > 1
    clocks: dict[str, ClockModel] = {}
    clock_info: dict[str, dict] = {}
    if app_x and db_xs and len(matching.connections) and proxied is None:  # through a proxy: its own clocks, per hop
        clocks, clock_info = _fit_clocks(app_pts, db_pts, app_x, db_xs, app_ex, db_ex, app_conns, db_conns, matching,
                                         runner, jobs, note, read_ahead)
    if ahead is not None:
        ahead.end()  # its passes are taken (or unused): see Ahead.end
    primary = app_x[0].capture if app_x else None
    if proxied is not None:
        clocks = dict(proxied.clocks)
        clock_info = {}  # the proxy's clocks are in summary.json → proxy.clocks
        primary = str(app_ex["capture"].iloc[0]) if len(app_ex) else primary

    # connection ids without a greeting (a pool opened before the capture): named at the DB point, where the
    # processlist's HOST is the client's endpoint; at the app point when there is none
    id_filled = _connection_ids(cs, app_ex, app_conns, db_ex, db_conns, note)

    # which DB point each exchange belongs to (the server it went to), and which clock converts its DB times
    row_point = _db_points(app_ex, db_ex, matching)
    clock_keys = _clock_keys(app_ex, matching, row_point, clocks, primary) if several else None

    # The joined table takes what it needs of both sides (build_table moves the app side's columns into it one by
    # one), so memory holds about one table, not three.
    bounds = point_bounds(app_ex, db_ex, matching, repair)
    table = apply_bounds(build_table(app_ex, db_ex, matching, clocks, primary, clock_keys, bounds), bounds, clocks,
                         primary, clock_keys)
    table = proxy_finish(table, proxied) if proxied is not None else proxy_empty(table)
    table["conn_id_source"] = _conn_id_sources(table, id_filled)
    del app_ex, db_ex
    release_memory()
    table["db_point"] = as_category(row_point)

    if cs.long_query_time is None:
        note("long_query_time unknown (no capture.toml, no --long-query-time): hidden_slow not decided")
    # --- per DB point (a server's slow log, thread pool and verdict are its own): decomposition and thread-pool view
    # The query profile is made in a forked child as soon as its columns are (with one DB point: after the
    # decomposition, beside the thread-pool view; see _per_server); the children end with this block.
    with ExitStack() as children:
        names_of = [x.capture for x in db_xs] or [None]
        if several:
            positions = np.arange(len(table))
            which = row_point.copy()
            which[pd.isna(which)] = names_of[0]  # exchanges no DB point saw, of an unknown server: with the first
            parts = [(name, positions[which == name]) for name in names_of]
        else:
            parts = [(names_of[0], None)]
        done: list[ServerPart] = []
        tables = []
        early: list[Forked] = []  # the query profile's child, when started by _per_server

        def profile_beside(decomposed: pd.DataFrame) -> None:
            early.append(children.enter_context(Forked(_beside_the_view, decomposed)))
        for name, rows in parts:
            sub = table if rows is None else table.iloc[rows].reset_index(drop=True)
            part_table, part = _per_server(sub, cs, name, tz, max_sql_bytes, note,
                                           profile_beside if jobs > 1 and not several else None)
            tables.append(part_table)
            done.append(part)
            del sub, part_table
            release_memory()
        if several:
            order = np.argsort(np.concatenate([rows for _, rows in parts]), kind="stable")
            table = concat(tables).take(order).reset_index(drop=True)
        else:
            table = tables[0]
        del tables
        first = done[0]

        exchanges = with_declared_dtypes(table, (*EXCHANGE_COLUMNS, *ANALYSIS_COLUMNS))
        del table
        groups = concat([d.view.groups.assign(db_point=as_category([d.point] * len(d.view.groups))) for d in done])
        pool = concat([d.view.pool.assign(db_point=as_category([d.point] * len(d.view.pool))) for d in done])

        def summarised(latency: dict | None = None) -> dict:
            summary = build_summary(
                cs, names={"app": [p.name for p in app_pts], "dbs": [p.name for p in db_pts],
                            "proxy": [p.name for p in proxy_pts]},
                points=points_info, qualities={"app": [qualities[id(x)] for x in app_x],
                                               "dbs": [qualities[id(x)] for x in db_xs],
                                               "proxy": [qualities[id(x)] for x in proxy_x]},
                matching=matching.stats.as_dict(), proxy=proxy_summary,
                repair=repair.stats.as_dict() if repair is not None else None, clocks=clock_info, servers=done,
                exchanges=exchanges, warnings=warnings, scheduler=runner.address if runner is not None else None,
                through_proxy=proxied is not None, latency=latency)
            tell_stories(summary, exchanges, concat([app_conns, db_conns]), cs.server_settings)
            return summary

        # With --jobs N the tables are written by a forked child as soon as they are whole, while the summary is built
        # and the report renders here: it shares the tables as they are (nothing pickled), and converting them to Arrow
        # holds the GIL, so a thread here would not run beside them (40 s sysbench pair: writing 0.97 s CPU, summary and
        # report 1.2 s). --jobs 1: one after the other.
        # The query profile (the report's most costly part: 40 s pair 0.33 s, 150 s pair ~1.2 s) is made by a second
        # forked child: it needs nothing of the summary, and the report takes it when it reaches that section. With
        # one DB point that child started before the thread-pool view (profile_beside), when one core was idle.
        # The thread-pool view's per-bucket tables are made before the children start, not beside them: made after
        # the fork, every heap page they wrote was first copied from the children's (copy-on-write: 0.34 s of system
        # time on the 40 s pair, more than starting the writer 0.3 s earlier gained).
        if jobs > 1:
            with (Forked(_write_tables, out, cs, exchanges, groups, pool, csv, partitioned) as writing,
                  nullcontext() if early else Forked(unspanned_profile, exchanges) as profiling):
                # made beside the thread-pool view (early): the profile, the latency quantiles, the components
                beside = early[0].result() if early else {}
                summary = summarised(beside.get("latency"))
                page = render_report(summary, exchanges, first.view.groups, command_line,
                                     {"app": app_conns, "db": db_conns}, first.view.pool,
                                     (lambda: beside["profile"]) if early else profiling.result,
                                     (lambda: beside["components"]) if early else None)
                del beside
                names = writing.result()
            names.append(_write_summary(out, summary))
        else:
            summary = summarised()
            names = _write_outputs(out, cs, exchanges, groups, pool, summary, csv, partitioned)
            page = render_report(summary, exchanges, first.view.groups, command_line,
                                 {"app": app_conns, "db": db_conns}, first.view.pool)
        names.append("report.html")
        write_text(out / "report.html", page)
        return AnalysisResult(out, exchanges, groups, summary, [], warnings), names


def _beside_the_view(decomposed: pd.DataFrame) -> dict:
    """What the summary and the report read of the decomposition's columns alone, from the table as the
    decomposition left it (one DB point): the query profile (unspanned_profile), summary.json → latency_s
    (latency_quantiles) and the report's table of components (component_rows). None of them reads the thread-pool
    view's columns, so a child forked then makes them beside the view, on the core that is otherwise idle (150 s
    sysbench pair: ~2 s of CPU out of the stretch where the table's writer, the summary and the report share the
    two cores), from the columns in their declared dtypes, as exchanges.parquet has them."""
    declared = tuple(c for c in (*EXCHANGE_COLUMNS, *ANALYSIS_COLUMNS) if c.name in decomposed.columns)
    x = with_declared_dtypes(decomposed, declared)
    return {"profile": unspanned_profile(x), "latency": latency_quantiles(x), "components": component_rows(x)}


def _write_outputs(out: Path, cs: CaptureSet, exchanges: pd.DataFrame, groups: pd.DataFrame, pool: pd.DataFrame,
                   summary: dict, csv: bool, partitioned: bool) -> list[str]:
    """The tables and summary.json into `out`; returns their names (report.html follows them)."""
    names = _write_tables(out, cs, exchanges, groups, pool, csv, partitioned)
    names.append(_write_summary(out, summary))
    return names


def _write_tables(out: Path, cs: CaptureSet, exchanges: pd.DataFrame, groups: pd.DataFrame, pool: pd.DataFrame,
                  csv: bool, partitioned: bool) -> list[str]:
    """The tables into `out` (Parquet, --csv, --partitioned); returns their names."""
    names = []
    for name, df in (("exchanges.parquet", exchanges), ("groups.parquet", groups), ("pool.parquet", pool)):
        write_table(df, out / name)
        names.append(name)
        release_memory()
    if csv:
        write_table(exchanges, out / "exchanges.csv")
        names.append("exchanges.csv")
    if partitioned:
        from .core.dataset import host_of, write_dataset

        hosts = {p.name: host_of(p.given if Path(p.given).is_dir() else p.name) for p in cs.points}
        names.append(write_dataset(exchanges, out / DATASET_NAME, hosts))
    return names


def _write_summary(out: Path, summary: dict) -> str:
    """summary.json into `out`; returns its name."""
    write_text(out / "summary.json", summary_json(summary))
    return "summary.json"


DATASET_NAME = "exchanges"  # --partitioned: the hive-style dataset folder in the output folder


def _fit_clocks(app_pts: list[CapturePoint], db_pts: list[CapturePoint], app_x: list, db_xs: list,
                app_ex: pd.DataFrame, db_ex: pd.DataFrame, app_conns: pd.DataFrame, db_conns: pd.DataFrame, matching,
                runner, jobs: int, note, read_ahead: dict | None = None
                ) -> tuple[dict[str, ClockModel], dict[str, dict]]:
    """One clock model per app point and DB point with matched connections, keyed by the app point (one DB point)
    or `_pair_key` (several), and its summary.json → clocks entry. `read_ahead`: _segments_ahead's passes, used
    for a point whose matched connections are the ones it read."""
    several = len(db_xs) > 1
    clocks: dict[str, ClockModel] = {}
    clock_info: dict[str, dict] = {}
    a_keys = _conn_table(app_ex, app_conns)
    d_keys = _conn_table(db_ex, db_conns)
    pairs = matching.connections.merge(a_keys, left_on="app_conn", right_on="key").merge(
        d_keys, left_on="db_conn", right_on="key", suffixes=("_a", "_d"))
    # one more pass over each capture point for the segments of matched connections: on the workers (--jobs,
    # --scheduler)
    calls, owners = [], []
    for side, pts, xs in (("d", db_pts, db_xs), ("a", app_pts, app_x)):
        for pt, x in zip(pts, xs):
            mine = pairs[pairs[f"capture_{side}"] == x.capture]
            if len(mine):
                calls.append((pt, _flows(mine.rename(columns={f"client_{side}": "client",
                                                              f"server_{side}": "server"}))))
                owners.append((side, x.capture))
    # A pass started ahead read every connection of its point: its keys are these calls' when all of them matched
    # (a key seen in an unmatched connection too would not be unique here); else the point is read again. With one
    # app and one DB point the worker also paired the two and fitted their clock.
    wanted = dict(zip(owners, (flows for _, flows in calls)))
    fitted: dict[tuple[str, str], tuple[ClockModel, dict]] = {}
    ready = {}
    for key, started in (read_ahead or {}).items():
        if key[0] == "pair":
            db_x = next(x for x in db_xs if x.capture == key[2])
            if (wanted.get(("a", key[1])), wanted.get(("d", key[2])), db_x.stats.first_ts_ns) == started[:3]:
                fitted[key[1:]] = started[3].result()
        elif wanted.get(key) == started[0]:
            ready[key] = started[1]
    pair_list = [tuple(p) for p in pairs[["capture_a", "capture_d"]].drop_duplicates().itertuples(index=False)]
    needed = {owner for a_cap, d_cap in pair_list if (a_cap, d_cap) not in fitted
              for owner in (("a", a_cap), ("d", d_cap))}
    todo = [(call, owner) for call, owner in zip(calls, owners) if owner in needed and owner not in ready]
    if runner is not None:
        segment_sets = runner.run(read_segments_of, [call for call, _ in todo]) if todo else []
    else:
        segment_sets = run_all(read_segments_of, [call for call, _ in todo], jobs)
    segments = {owner: future.result() for owner, future in ready.items() if owner in needed}
    segments.update(zip([owner for _, owner in todo], segment_sets))
    del segment_sets, ready
    release_memory()  # with --jobs 1 the reading ran here: its per-packet garbage goes before pairing
    for a_cap, d_cap in pair_list:
        db_x = next(x for x in db_xs if x.capture == d_cap)
        model, entry = fitted.get((a_cap, d_cap)) or _fitted_clock(segments[("a", a_cap)], segments[("d", d_cap)],
                                                                    db_x.stats.first_ts_ns)
        key = _pair_key(a_cap, d_cap) if several else a_cap
        clocks[key] = model
        clock_info[key] = {"app": a_cap, "db": d_cap, **entry}
        if model.quality != "two-sided":
            note(f"clock of {a_cap}{' and ' + d_cap if several else ''}: {model.quality} fit (too few segments "
                 "seen at both points); one-way network times are bounds, not estimates")
    del segments
    release_memory()
    return clocks, clock_info


def _fitted_clock(app, db, db_first_ns: int | None) -> tuple[ClockModel, dict]:
    """The clock of an app point and a DB point from their segments (read_segments_of's), and its summary.json →
    clocks entry (without the points' names)."""
    samples = pair_segments(app, db)
    del app, db
    release_memory()
    model = estimate_clock(samples.fwd_app, samples.fwd_db, samples.rev_db, samples.rev_app)
    return model, clock_entry(model, samples, db_first_ns)


def _clock_ahead(app_pt: CapturePoint, app_flows: set, db_pt: CapturePoint, db_flows: set,
                 db_first_ns: int | None) -> tuple[ClockModel, dict]:
    """_fit_clocks' work for one app point and one DB point, in one call (on a worker: _segments_ahead)."""
    db = read_segments_of(db_pt, db_flows)
    return _fitted_clock(read_segments_of(app_pt, app_flows), db, db_first_ns)


def _segments_ahead(ahead: Ahead, app_pts: list[CapturePoint], db_pts: list[CapturePoint], app_x: list,
                    db_xs: list) -> dict[tuple, tuple]:
    """The clock's pass over each app and DB point (read_segments_of), for every connection it holds, started on
    `ahead`'s workers as soon as the extraction is done: it runs while this process pairs the captures and repairs
    their losses, and _fit_clocks takes it when the connections it read are the matched ones (the usual case: all
    of them). {("a" or "d", capture): (flows, Future of its segments)}; for one app point and one DB point the
    worker also fits their clock (_clock_ahead), so only the model comes back: {("pair", app capture, DB capture):
    (app flows, DB flows, the DB capture's first time, Future of (model, clocks entry))}. Empty with one job or small captures (read as before)."""
    from .read.extract import SMALL_CAPTURE_BYTES, capture_bytes

    if not app_x or not db_xs or sum(capture_bytes(p) for p in (*app_pts, *db_pts)) < SMALL_CAPTURE_BYTES:
        return {}
    owners, calls = [], []
    for side, pts, xs in (("d", db_pts, db_xs), ("a", app_pts, app_x)):
        for pt, x in zip(pts, xs):
            conns = x.connections[x.connections["client"].notna() & x.connections["server"].notna()]
            if len(conns):
                owners.append((side, x.capture))
                calls.append((pt, _flows(conns)))
    if owners == [("d", db_xs[0].capture), ("a", app_x[0].capture)] and len(app_x) == len(db_xs) == 1:
        (db_pt, db_flows), (app_pt, app_flows) = calls
        first_ns = db_xs[0].stats.first_ts_ns
        futures = ahead.start_all(_clock_ahead, [(app_pt, app_flows, db_pt, db_flows, first_ns)])
        return {} if futures is None else {("pair", app_x[0].capture, db_xs[0].capture): (app_flows, db_flows,
                                                                                          first_ns, futures[0])}
    futures = ahead.start_all(read_segments_of, calls)
    if futures is None:
        return {}
    return {owner: (flows, future) for owner, (_, flows), future in zip(owners, calls, futures)}


def _per_server(table: pd.DataFrame, cs: CaptureSet, point: str | None, tz, max_sql_bytes: int,
                note, decomposed=None) -> tuple[pd.DataFrame, ServerPart]:
    """The slow-log join, the decomposition and the thread-pool view of one DB point's exchanges: the table with
    their columns, and what the summary reads of them. `decomposed(table)`: called with the table once it has
    the decomposition's columns, before the thread-pool view (which adds the columns of its own)."""
    slow_path = cs.slow_logs.get(point if point is not None else "")
    slow = None
    slow_info: dict = {"file": str(slow_path) if slow_path else None, "used": False}
    if slow_path is not None:
        from .slowlog.join import wire_statements
        from .slowlog.reader import read_slow_log

        try:
            slow, sstats = read_slow_log(slow_path, tz=tz, max_sql_bytes=max_sql_bytes, wire=wire_statements(table))
            slow_info.update({"flavor": sstats.flavor, "unparsed_lines": sstats.unparsed_lines,
                              "cut_entries": sstats.cut_entries, "damaged_values": sstats.damaged_values,
                              "capped_statements": sstats.capped_statements,
                              "wire_sql_entries": sstats.wire_sql_entries,
                              "unverified_entries": sstats.unverified_entries})
            for w in sstats.warnings[:5]:
                note(w)
        except SlowLogError as err:
            note(f"{err}; analysed without the slow log")
    table, join = decompose(table, slow, cs.long_query_time, cs.thread_pool_size, str(slow_path))
    release_memory()
    if join.used and table["conn_id"].isna().any():  # the Thread_id of the slow-log entries joined to a connection
        named = connids.ids_from_slow_log(table, slow, join.entry)
        if connids.fill_table(table, named, connids.SLOWLOG) and cs.thread_pool_size:
            table["thread_group"] = (table["conn_id"].astype("Int64") % int(cs.thread_pool_size)).astype("Int64")
    for w in join.warnings:
        note(w)
    slow_info.update(join.stats)
    slow_info["used"] = join.used
    if decomposed is not None:
        decomposed(table)
    view = thread_pool_view(table, cs.thread_pool_size)
    for col in ("thread_group", "stall", "stall_role"):
        table[col] = getattr(view, col).array
    if view.queue_source is not None:
        table["queue_source"] = view.queue_source.array
    for w in view.warnings:
        note(w if len(cs.of("db")) <= 1 else f"{point}: {w}")
    return table, ServerPart(point, view, slow_info)


def _connection_ids(cs: CaptureSet, app_ex: pd.DataFrame, app_conns: pd.DataFrame, db_ex: pd.DataFrame,
                    db_conns: pd.DataFrame, note) -> dict[str, str]:
    """Fill conn_id (exchanges and connections tables, in place) where no greeting gave it: from SELECT
    CONNECTION_ID() answers on the wire, then the processlist snapshot. Returns {client endpoint: source} of the
    connections named so (the joined table's conn_id_source)."""
    ex, conns = (db_ex, db_conns) if len(db_conns) else (app_ex, app_conns)
    for c in (app_conns, db_conns):
        if "conn_id_source" not in c:
            connids.add_greeting_source(c)
    if not len(conns) or (cs.processlist is None and not conns["conn_id"].isna().any()):
        return {}
    filled = connids.Filled()
    points = {p.name: p for p in cs.points}
    for capture in conns.loc[conns["conn_id"].isna(), "capture"].astype(str).unique():
        if capture in points:
            mine = ex["capture"].astype(str) == capture
            connids.fill_from_ids(ex, conns, connids.ids_from_answers(capture, ex[mine], conns), connids.ANSWER,
                                  filled)
    if cs.processlist is not None:
        snapshot = connids.read_processlist(cs.processlist)
        for w in snapshot.warnings:
            note(w)
        named = connids.ids_from_processlist(conns, snapshot)
        connids.fill_from_ids(ex, conns, named, connids.PROCESSLIST, filled)
        if snapshot.rows and not named:
            note(f"{cs.processlist}: none of its {snapshot.rows} rows names a connection of the capture (HOST ip:port "
                 "is matched to the client's endpoint at the DB point)")
    if (w := connids.conflict_warning(filled)) is not None:
        note(w)
    named_conns = conns[conns["conn_id_source"].isin([connids.ANSWER, connids.PROCESSLIST])]
    return dict(zip(named_conns["client"].astype(str), named_conns["conn_id_source"].astype(str)))


def _conn_id_sources(table: pd.DataFrame, filled: dict[str, str]) -> pd.Categorical:
    """Each row's conn_id_source: greeting where the id came with the connection, else the source that named its
    client endpoint (at the DB point, else at the app)."""
    known = table["conn_id"].notna().to_numpy()
    codes = np.where(known, connids.SOURCES.index(connids.GREETING), -1).astype(np.int8)
    if filled:
        other = pd.Series(connids.client_keys(table)).map(
            {client: connids.SOURCES.index(source) for client, source in filled.items()})
        take = other.notna().to_numpy() & known
        codes[take] = other.to_numpy(dtype="float64", na_value=np.nan)[take].astype(np.int8)
    return pd.Categorical.from_codes(codes, categories=list(connids.SOURCES))


def _db_points(app_ex: pd.DataFrame, db_ex: pd.DataFrame, matching) -> np.ndarray:
    """Per row of the joined table (matching's order): the DB point that saw the exchange; for one only the app
    saw, the DB point its server endpoint (as the app saw it) leads to, when exactly one does; else None."""
    ar, dr = matching.app_row, matching.db_row
    out = np.full(len(ar), None, dtype=object)
    if not len(db_ex):
        return out
    d_cap = db_ex["capture"].astype(object).to_numpy()
    seen_d = dr >= 0
    out[seen_d] = d_cap[dr[seen_d]]
    only_a = ~seen_d & (ar >= 0)
    if only_a.any() and len(app_ex):
        a_server = app_ex["server"].astype(object).to_numpy()
        both = seen_d & (ar >= 0)
        leads = pd.DataFrame({"server": np.concatenate([a_server[ar[both]], db_ex["server"].astype(object).to_numpy()]),
                              "point": np.concatenate([out[both], d_cap])}).drop_duplicates()
        counted = leads.groupby("server")["point"].agg(["first", "size"])
        unique = counted.loc[counted["size"] == 1, "first"]
        rows = np.flatnonzero(only_a)
        out[rows] = pd.Series(a_server[ar[rows]]).map(unique).astype(object).where(lambda v: v.notna(), None).to_numpy()
    return out


def _clock_keys(app_ex: pd.DataFrame, matching, row_point: np.ndarray, clocks: dict, primary: str | None) -> np.ndarray:
    """Per row, the clock (`_pair_key(app point, DB point)`) that converts its DB times onto its app point's clock:
    a row only the DB saw goes on the first app point's clock, else on that of any app point with a clock to its
    DB point."""
    ar = matching.app_row
    a_cap = np.full(len(ar), primary, dtype=object)
    if len(app_ex):
        caps = app_ex["capture"].astype(object).to_numpy()
        a_cap[ar >= 0] = caps[ar[ar >= 0]]
    fallback: dict[str, str | None] = {}
    keys = np.array([_pair_key(a, d) if d is not None else None for a, d in zip(a_cap, row_point)], dtype=object)
    missing = {d for k, d in zip(keys, row_point) if d is not None and k not in clocks}
    for d in missing:
        fallback[d] = next((k for k in clocks if k.endswith(" ↔ " + d) and k.startswith(f"{primary} ↔ ")),
                           next((k for k in clocks if k.endswith(" ↔ " + d)), None))
    db_only = matching.app_row < 0
    for i in np.flatnonzero(db_only):
        d = row_point[i]
        if d is not None and keys[i] not in clocks:
            keys[i] = fallback.get(d)
    return keys


def _empty_extraction_frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    from .core.schema import CONNECTION_COLUMNS
    from .core.tables import frame

    return frame([], EXCHANGE_COLUMNS), frame([], CONNECTION_COLUMNS)


def _conn_table(ex: pd.DataFrame, conns: pd.DataFrame) -> pd.DataFrame:
    from .pair.match import connection_keys, first_rows

    key = connection_keys(ex).to_numpy()
    first = first_rows(key)  # each connection's first row (keys number them as they appear)
    keys = pd.DataFrame({"key": key[first], "capture": ex["capture"].iloc[first].to_numpy(),
                         "conn_index": ex["conn_index"].to_numpy()[first]})
    return keys.merge(conns[["capture", "conn_index", "client", "server"]], on=["capture", "conn_index"])


