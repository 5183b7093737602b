"""`pcapdecomp analyze`: read a capture set, extract each capture, match the points, fit the clock, join the slow
log, decompose every exchange's latency and write exchanges.parquet, groups.parquet, summary.json, report.html."""

from __future__ import annotations

import json
import math
import os
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import __version__, sources
from .clock import ClockModel, estimate_clock
from .decompose import build_table, decompose
from .errors import InputError, SlowLogError, UsageError, internal_errors_to
from .flows import endpoint_text
from .console import capture_problems, progress_bar, warn
from .match import ClockSamples, match_exchanges, pair_segments, read_segments_of, split_endpoint
from .outputs import OutputFolder, write_table, write_text
from .parallel import default_jobs, run_all
from .proxy import NoProxy, Side, through_proxy
from .proxy import empty_columns as proxy_empty
from .proxy import finish as proxy_finish
from .repair import apply_bounds, point_bounds, repair_losses
from .report import render as render_report
from .schema import ANALYSIS_COLUMNS, EXCHANGE_COLUMNS
from .sources import CapturePoint, parse_server
from .tables import as_category, concat, release_memory
from .threadpool import json_value, thread_pool_view
from .verdict import tell

@dataclass
class CaptureSet:
    """The inputs of one analysis, after the folder's contents and the explicit options were combined."""

    name: str
    points: list[CapturePoint]  # every capture point (kind app, db, …), each one file or several (sources.py)
    slow_logs: dict[str, Path]  # DB point name -> its slow log
    long_query_time: float | None
    thread_pool_size: int | None
    servers: list[str]
    warnings: list[str] = field(default_factory=list)  # about the folder's contents (a named file is missing)
    server_names: dict[str, str] = field(default_factory=dict)  # --server NAME=HOST:PORT: endpoint -> name
    proxy_servers: list[str] = field(default_factory=list)  # the proxy's listening endpoints, when known

    def of(self, kind: str) -> list[CapturePoint]:
        return [p for p in self.points if p.kind == kind]

    @property
    def app(self) -> list[Path]:
        return [Path(p.name) for p in self.of("app")]

    @property
    def db(self) -> Path | None:
        dbs = self.of("db")
        return Path(dbs[0].name) if dbs else None

    @property
    def proxy(self) -> list[Path]:  # captures on a proxy host between app and DB
        return [Path(p.name) for p in self.of("proxy")]

    @property
    def slow_log(self) -> Path | None:
        return next(iter(self.slow_logs.values()), None)


@dataclass
class AnalysisResult:
    out_dir: Path
    exchanges: pd.DataFrame  # EXCHANGE_COLUMNS + ANALYSIS_COLUMNS
    groups: pd.DataFrame  # per thread group and time bucket
    summary: dict  # what summary.json holds
    written: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _captures_in(folder: Path, prefix: str) -> list[Path]:
    return sorted(p for p in folder.iterdir()
                  if p.name.startswith(prefix) and sources.is_capture_name(p.name) and not p.is_dir())


def _folder_points(set_dir: Path, kind: str) -> list[CapturePoint]:
    """A capture-set folder's points of one kind: subfolders `<kind>/` and `<kind>-<host>/` (one point each, its
    files rotated), and files `<kind>*.pcap…` (one point per rotation family: db.pcap, db.pcap1, … are one)."""
    found = []
    for sub in sorted(p for p in set_dir.iterdir() if p.is_dir() and (p.name == kind or p.name.startswith(kind + "-"))):
        _inside(set_dir, sub, sub.name)
        pt = sources.point(kind, sub, f"{set_dir}: {kind} folder")
        for f in pt.files:
            _inside(set_dir, Path(f), f"{sub.name}/{Path(f).name}")
        found.append(pt)
    for family in sources.families(_captures_in(set_dir, kind)):
        for f in family:
            _inside(set_dir, f, f.name)
        if len(family) == 1:
            found.append(sources.point(kind, family[0]))
        else:
            stem = sources.rotation_index(family[0].name)[0]
            name = str(set_dir / (stem + "*"))
            found.append(sources.point_of_files(kind, family, name, name, f"{set_dir}: {kind} files"))
    return found


def _slow_logs_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir()
                  if p.name.startswith("slow") and p.name.endswith((".log", ".log.gz")) and not p.is_dir())


def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def resolve_capture_set(set_dir: Path | None, app: list, db, slow_log, long_query_time: float | None,
                        thread_pool_size: int | None, servers: list[str], proxy: list | None = None,
                        proxy_servers: list[str] | None = None) -> CaptureSet:
    """Fill options from a capture-set folder (app*.pcap[ng][.gz], db*…, proxy*…, app-<host>/ and db[-<name>]/
    subfolders of rotated files, slow*.log, capture.toml); explicit options win. `app`, `db` and `proxy` name capture
    points: each a file, a quoted glob or a folder of one point's files (`db` may be one or a list: several DB
    servers).
    `slow_log` is one file or one per DB point, in their order.

    A capture set may come from someone else, so its capture.toml is not trusted: values of the wrong type or out
    of range, a named file that is missing, or a file outside the folder (an absolute path, `..`, a symlink that
    leads out) are user mistakes, reported in one line."""
    toml: dict = {}
    app_specs, db_specs, slow_specs = _as_list(app), _as_list(db), _as_list(slow_log)
    proxy_specs = _as_list(proxy)
    found: list[CapturePoint] = []
    found_slow: list[Path] = []
    folder_slow: dict[str, Path] = {}
    cfg = None
    missing: list[str] = []
    if set_dir is not None:
        if not set_dir.exists():
            raise InputError(f"{set_dir}: no such folder")
        if not set_dir.is_dir():
            raise InputError(f"{set_dir}: not a folder (give captures with --app/--db, or a capture-set folder)")
        cfg = set_dir / "capture.toml"
        if cfg.exists():
            if not cfg.is_file():
                raise InputError(f"{cfg}: not a regular file")
            try:
                toml = tomllib.loads(cfg.read_text(encoding="utf-8"))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
                raise InputError(f"{cfg}: not valid TOML: {err}") from None
        named = _table(toml, "captures", cfg)
        for kind, given in (("app", app_specs), ("db", db_specs), ("proxy", proxy_specs)):
            if given:
                continue
            if kind in named:
                found += [sources.point(kind, p) for n in _names(named[kind], cfg, f"[captures] {kind}")
                          if (p := _named_file(set_dir, cfg, kind, n, missing)) is not None]
            else:
                found += _folder_points(set_dir, kind)
        if not slow_specs and "slow_log" in named:
            found_slow = [p for n in _names(named["slow_log"], cfg, "[captures] slow_log")
                          if (p := _named_file(set_dir, cfg, "slow_log", n, missing)) is not None]
        elif not slow_specs:
            slows = _slow_logs_in(set_dir)
            found_slow = [_inside(set_dir, slows[0], slows[0].name)] if slows else []
            for pt in found:  # a DB point's own folder may hold its slow log
                if pt.kind == "db" and Path(pt.given).is_dir() and (mine := _slow_logs_in(Path(pt.given))):
                    folder_slow[pt.name] = _inside(set_dir, mine[0], f"{Path(pt.given).name}/{mine[0].name}")
    server_cfg = _table(toml, "server", cfg)
    where = f"{cfg}: [server]" if cfg is not None else ""
    lqt = long_query_time if long_query_time is not None else _number(server_cfg, "long_query_time", where)
    tps = thread_pool_size if thread_pool_size is not None else _number(server_cfg, "thread_pool_size", where)
    servers = list(servers)
    server_names: dict[str, str] = {}
    if servers:
        plain = []
        for s in servers:
            name, sep, endpoint = s.partition("=") if "=" in s else ("", "", s)
            host, port = parse_server(endpoint)
            if sep:
                if not name.strip():
                    raise UsageError(f"--server {s!r}: the name before '=' is empty")
                server_names[endpoint_text((host, port))] = name.strip()
            plain.append(endpoint)
        servers = plain
    else:
        for key in ("address", "address_ipv6", "more_addresses"):  # more_addresses: other DB servers (a list)
            for value in _as_list(server_cfg.get(key)):
                try:
                    parse_server(value if isinstance(value, str) else "")
                except UsageError:
                    raise InputError(f"{where} {key} must be \"IP:PORT\"{' or a list of them' * (key == 'more_addresses')}"
                                     f", got {value!r}") from None
                servers.append(value)
    proxy_servers = list(proxy_servers or [])
    if proxy_servers:
        for s in proxy_servers:
            parse_server(s)
    else:
        value = _table(toml, "proxy", cfg).get("address")
        if value is not None:
            try:
                parse_server(value if isinstance(value, str) else "")
            except UsageError:
                raise InputError(f"{cfg}: [proxy] address must be \"IP:PORT\", got {value!r}") from None
            proxy_servers.append(value)
    if lqt is not None and not (isinstance(lqt, (int, float)) and math.isfinite(lqt) and lqt >= 0):
        raise UsageError(f"{'--long-query-time' if long_query_time is not None else where + ' long_query_time'} "
                         f"must be a finite number of seconds ≥ 0, got {lqt}")
    if tps is not None and not (float(tps).is_integer() and 1 <= tps <= 1_000_000):
        raise UsageError(f"{'--thread-pool-size' if thread_pool_size is not None else where + ' thread_pool_size'} "
                         f"must be a whole number ≥ 1, got {tps}")
    points = [*sources.points_of("app", app_specs), *sources.points_of("db", db_specs),
              *sources.points_of("proxy", proxy_specs)]
    if not slow_specs:  # a DB point given as a folder brings the slow log it holds
        for pt in points:
            if pt.kind == "db" and Path(pt.given).is_dir() and (mine := _slow_logs_in(Path(pt.given))):
                folder_slow[pt.name] = mine[0]
    given = {"app": app_specs, "db": db_specs, "proxy": proxy_specs}
    points += [p for p in found if not given.get(p.kind)]
    points.sort(key=lambda p: ("app", "db").index(p.kind) if p.kind in ("app", "db") else 2)
    sources.check_disjoint(points)
    dbs = [p for p in points if p.kind == "db"]
    if len(dbs) > 1 and any(p.kind == "proxy" for p in points):
        raise UsageError(f"a proxy capture with {len(dbs)} DB capture points: analyse each DB server through the "
                         "proxy in a run of its own")
    slows = [Path(s) for s in slow_specs] or found_slow
    if len(slows) > max(len(dbs), 1):
        raise UsageError(f"{len(slows)} slow logs for {len(dbs)} DB capture point(s): give one --slow-log per --db, "
                         "in the same order")
    slow_logs = {} if slow_specs else dict(folder_slow)  # a DB point's folder's own slow log, unless given
    for pt, path in zip(dbs or [None], slows):
        key = pt.name if pt is not None else ""
        if slow_specs or key not in slow_logs:
            slow_logs[key] = path
    if set_dir is not None:
        name = set_dir.resolve().name
    else:
        first = dbs[0] if dbs else (points[0] if points else None)
        name = Path(first.files[0]).name.split(".")[0] if first is not None else "analysis"
    result = CaptureSet(
        name=name, points=points, slow_logs=slow_logs,
        long_query_time=None if lqt is None else float(lqt), thread_pool_size=None if tps is None else int(tps),
        servers=list(servers), warnings=missing, server_names=server_names, proxy_servers=proxy_servers,
    )
    # Files are checked before any work: a mistake costs a second, not a whole extraction.
    from .slowlog import check_slow_log_file

    for path in result.slow_logs.values():
        if path.exists() and not (path.is_file() or path.is_dir()):
            raise InputError(f"{path}: not a regular file (a pipe, device or socket cannot be read)")
    for path in slow_specs:  # one the folder holds may be garbled: a warning, when it is read
        check_slow_log_file(Path(path))
    if not points:
        where = f" in {set_dir}" if set_dir is not None else ""
        raise UsageError(f"no capture to analyse{where}: give a capture-set folder, --app, --db and/or --proxy")
    return result


def _table(toml: dict, key: str, cfg: Path | None) -> dict:
    value = toml.get(key, {})
    if not isinstance(value, dict):
        raise InputError(f"{cfg}: {key} must be a table ([{key}]), got {value!r}")
    return value


def _names(value, cfg: Path, what: str) -> list[str]:
    """[captures] app = "app.pcap" or ["app1.pcap", "app2.pcap"] (one per app host)."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise InputError(f"{cfg}: {what} must be a file name or a list of file names, got {value!r}")
    return names


def _named_file(set_dir: Path, cfg: Path, key: str, name, missing: list[str]) -> Path | None:
    """A file capture.toml names: inside the set folder; None, with a warning in `missing`, when it is not there."""
    if not isinstance(name, str) or not name:
        raise InputError(f"{cfg}: [captures] {key} must be a file name, got {name!r}")
    path = _inside(set_dir, set_dir / name, name)
    if not path.exists() and not path.is_symlink():
        missing.append(f"{cfg}: [captures] {key} names {name!r}, which is not in {set_dir}: analysed without it")
        return None
    return path


def _inside(set_dir: Path, path: Path, name: str) -> Path:
    """Refuse a file of the set that lies outside its folder (absolute, `..`, or a symlink leading out): a capture
    set from elsewhere must not make pcapdecomp read other files. Give such a file with --app/--db/--slow-log."""
    try:
        path.resolve().relative_to(set_dir.resolve())
    except ValueError:
        raise InputError(f"{set_dir}: {name!r} is outside the capture-set folder; give it with --app, --db or "
                         "--slow-log if you mean it") from None
    return path


def _time_zone(name: str | None):
    """--slow-log-tz: an IANA zone name or UTC±HH:MM; None means UTC."""
    import datetime as dt
    import re
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if name is None:
        return dt.timezone.utc
    m = re.fullmatch(r"(?:UTC)?([+-])(\d{1,2}):?(\d{2})", name.strip())
    if m:
        sign = 1 if m[1] == "+" else -1
        return dt.timezone(sign * dt.timedelta(hours=int(m[2]), minutes=int(m[3])))
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise UsageError(f"--slow-log-tz: unknown time zone {name!r} (use e.g. Europe/Berlin or +02:00)") from None


def _number(table: dict, key: str, where: str):
    """A number of capture.toml's [server]; absent is None, anything else (text, a boolean) a mistake."""
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where} {key} must be a number, got {value!r}")
    return value


def _flows(conns: pd.DataFrame) -> set[tuple[str, int, str, int]]:
    out = set()
    for client, server in zip(conns["client"], conns["server"]):
        ci, cp = split_endpoint(client)
        si, sp = split_endpoint(server)
        out.add((ci, cp, si, sp))
    return out


def analyze(set_dir: Path | None, app: list, db, slow_log, long_query_time: float | None,
            thread_pool_size: int | None, servers: list[str], out_dir: Path | None,
            csv: bool = False, quiet: bool = False, slow_log_tz: str | None = None,
            command_line: str | None = None, max_sql_bytes: int = 1 << 20,
            jobs: int | None = None, scheduler: str | None = None, partitioned: bool = False,
            proxy: list | None = None, proxy_servers: list[str] | None = None) -> AnalysisResult:
    """Run every stage and write the outputs. Raises PcapdecompError subclasses for user mistakes.
    `app`, `db`: capture points (a file, a glob, a folder; `db` one or a list); `slow_log`: one or one per DB point.
    `scheduler`: a Dask scheduler address or "local" (pcapdecomp/cluster.py) to extract on Dask workers. `proxy`:
    capture points on a proxy host between app and DB (pcapdecomp/proxy.py), `proxy_servers` its endpoints."""
    cs = resolve_capture_set(set_dir, app, db, slow_log, long_query_time, thread_pool_size, servers, proxy,
                             proxy_servers)
    tz = _time_zone(slow_log_tz)
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be ≥ 1, got {jobs}")
    out = out_dir if out_dir is not None else Path("reports") / cs.name
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder")
    runner = None
    if scheduler is not None:
        from .cluster import DaskRunner

        runner = DaskRunner.connect(scheduler, cs.points, quiet, jobs)  # a wrong address fails here, before any work
    # the outputs are written as a set (outputs.OutputFolder); a bug becomes one line, its traceback a file in out
    try:
        with internal_errors_to(out):
            with OutputFolder(out) as folder:
                result, names = _analyze(cs, tz, jobs, folder.staging, csv, quiet, command_line, max_sql_bytes,
                                         runner, partitioned)
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
             runner) -> list:
    """Every point's Extraction: in this machine's worker processes (--jobs), or on Dask (--scheduler)."""
    from .parallel import extract_all

    endpoints = {parse_server(s) for s in servers} or None
    if runner is not None:
        return runner.extract(points, endpoints, max_sql_bytes)
    label = points[0].name if len(points) == 1 else f"{len(points)} captures"
    with progress_bar(quiet, label) as update:
        return extract_all(list(points), endpoints, max_sql_bytes, jobs, update)


def _analyze(cs: CaptureSet, tz, jobs: int, out: Path, csv: bool, quiet: bool, command_line: str | None,
             max_sql_bytes: int, runner=None, partitioned: bool = False) -> tuple[AnalysisResult, list[str]]:
    """Every stage; the outputs are written to `out` (the staging folder). Returns the result and the file names."""
    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        if not quiet:
            warn(message)

    for message in cs.warnings:
        note(message)
    for pt in cs.points:
        sources.register(pt)  # later passes (repair, clock) open the point by its name

    app_pts, db_pts, proxy_pts = cs.of("app"), cs.of("db"), cs.of("proxy")
    read = [*app_pts, *db_pts, *proxy_pts]
    # behind a proxy the app talks to the proxy's address, not the server's: read every capture with both
    readable = [*cs.servers, *cs.proxy_servers] if cs.servers else []
    extractions = _extract(read, readable, quiet, max_sql_bytes, jobs, runner)
    app_x = extractions[:len(app_pts)]
    db_xs = extractions[len(app_pts):len(app_pts) + len(db_pts)]
    proxy_x = extractions[len(app_pts) + len(db_pts):]
    qualities = {id(x): x.quality() for x in extractions}
    points_info = []
    for pt, x in zip(read, extractions):
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
        points_info.append(entry)
    empty = _empty_extraction_frames()
    app_ex = concat([x.exchanges for x in app_x]) if app_x else empty[0]
    app_conns = concat([x.connections for x in app_x]) if app_x else empty[1]
    db_ex = concat([x.exchanges for x in db_xs]) if db_xs else empty[0]
    db_conns = concat([x.connections for x in db_xs]) if db_xs else empty[1]
    matching = match_exchanges(app_ex, db_ex, app_conns, db_conns)
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
            matching = match_exchanges(app_ex, db_ex, app_conns, db_conns)
            proxied = through_proxy(Side(app_ex, app_conns), Side(db_ex, db_conns) if db_xs else None, None,
                                    set(cs.servers), set(cs.proxy_servers), direct=matching)
            proxy_summary = proxied.summary if proxied is not None else proxy_summary
    if proxied is not None:  # the two sides of the decomposition are the ends of the chain through the proxy
        app_ex, app_conns, db_ex, db_conns = (proxied.client.ex, proxied.client.conns, proxied.server.ex,
                                              proxied.server.conns)
        matching = proxied.matching
        for w in proxied.warnings:
            note(w)
    release_memory()
    # capture loss is repaired between two captures of one TCP connection: not through a proxy
    repair = repair_losses(app_x, db_xs if len(db_xs) != 1 else db_xs[0], app_ex, db_ex, app_conns, db_conns,
                           matching, {parse_server(s) for s in cs.servers} or None, max_sql_bytes, jobs) \
        if app_x and db_xs and proxied is None else None
    if repair is not None:
        app_ex, db_ex, app_conns, db_conns, matching = (repair.app_ex, repair.db_ex, repair.app_conns,
                                                        repair.db_conns, repair.matching)
        release_memory()
        for message in repair.stats.warnings():
            note(message)
    if app_x and db_xs and matching.stats.matched == 0 and len(app_ex) and len(db_ex):
        note("no exchange was seen at both points: are these captures of the same traffic and time?")

    # --- clocks: one model per app point and DB point, from segments of their matched connections
    several = len(db_xs) > 1
    clocks: dict[str, ClockModel] = {}
    clock_info: dict[str, dict] = {}
    if app_x and db_xs and len(matching.connections) and proxied is None:  # through a proxy: its own clocks, per hop
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
        if runner is not None:
            segment_sets = runner.run(read_segments_of, calls)
        else:
            segment_sets = run_all(read_segments_of, calls, jobs)
        segments = dict(zip(owners, segment_sets))
        del segment_sets
        release_memory()  # with --jobs 1 the reading ran here: its per-packet garbage goes before pairing
        for a_cap, d_cap in pairs[["capture_a", "capture_d"]].drop_duplicates().itertuples(index=False):
            samples = pair_segments(segments[("a", a_cap)], segments[("d", d_cap)])
            release_memory()
            model = estimate_clock(samples.fwd_app, samples.fwd_db, samples.rev_db, samples.rev_app)
            db_x = next(x for x in db_xs if x.capture == d_cap)
            key = _pair_key(a_cap, d_cap) if several else a_cap
            clocks[key] = model
            clock_info[key] = {"app": a_cap, "db": d_cap,
                               **_clock_summary(model, samples, db_x.stats.first_ts_ns)}
            if model.quality != "two-sided":
                note(f"clock of {a_cap}{' and ' + d_cap if several else ''}: {model.quality} fit (too few segments "
                     "seen at both points); one-way network times are bounds, not estimates")
        del segments
        release_memory()
    primary = app_x[0].capture if app_x else None
    if proxied is not None:
        clocks = dict(proxied.clocks)
        clock_info = {}  # the proxy's clocks are in summary.json → proxy.clocks
        primary = str(app_ex["capture"].iloc[0]) if len(app_ex) else primary

    # which DB point each exchange belongs to (the server it went to), and which clock converts its DB times
    row_point = _db_points(app_ex, db_ex, matching)
    clock_keys = _clock_keys(app_ex, matching, row_point, clocks, primary) if several else None

    # The joined table takes what it needs of both sides: the per-capture tables go (build_table moves the app
    # side's columns into it one by one), so memory holds about one table, not three.
    for x in extractions:
        x.exchanges = x.exchanges.iloc[:0].copy()  # a copy: an empty view would keep the whole table alive
    bounds = point_bounds(app_ex, db_ex, matching, repair)
    table = apply_bounds(build_table(app_ex, db_ex, matching, clocks, primary, clock_keys), bounds, clocks, primary,
                         clock_keys)
    table = proxy_finish(table, proxied) if proxied is not None else proxy_empty(table)
    del app_ex, db_ex
    release_memory()
    table["db_point"] = as_category(row_point)

    if cs.long_query_time is None:
        note("long_query_time unknown (no capture.toml, no --long-query-time): hidden_slow not decided")
    # --- per DB point (a server's slow log, thread pool and verdict are its own): decomposition and thread-pool view
    names_of = [x.capture for x in db_xs] or [None]
    if several:
        positions = np.arange(len(table))
        which = row_point.copy()
        which[pd.isna(which)] = names_of[0]  # exchanges no DB point saw, of an unknown server: with the first
        parts = [(name, positions[which == name]) for name in names_of]
    else:
        parts = [(names_of[0], None)]
    done = []
    for name, rows in parts:
        sub = table if rows is None else table.iloc[rows].reset_index(drop=True)
        done.append(_per_server(sub, cs, name, tz, max_sql_bytes, note))
        release_memory()
    if several:
        order = np.argsort(np.concatenate([rows for _, rows in parts]), kind="stable")
        table = concat([d["table"] for d in done]).take(order).reset_index(drop=True)
    else:
        table = done[0]["table"]
    for d in done:
        del d["table"]
    first = done[0]

    exchanges = table[[c.name for c in (*EXCHANGE_COLUMNS, *ANALYSIS_COLUMNS)]]  # copy-on-write: no copy made
    del table
    for col in (*EXCHANGE_COLUMNS, *ANALYSIS_COLUMNS):
        if str(exchanges[col.name].dtype) != col.dtype:
            exchanges[col.name] = exchanges[col.name].astype(col.dtype)
    groups = concat([d["view"].groups.assign(db_point=as_category([d["point"]] * len(d["view"].groups)))
                     for d in done])
    pool = concat([d["view"].pool.assign(db_point=as_category([d["point"]] * len(d["view"].pool))) for d in done])

    summary = {
        "set": cs.name,
        "verdict": "",
        "pcapdecomp": __version__,
        "inputs": {
            "app": [p.name for p in app_pts], "db": db_pts[0].name if db_pts else None,
            "dbs": [p.name for p in db_pts],
            "slow_log": str(cs.slow_log) if cs.slow_log else None,
            "slow_logs": {k: str(v) for k, v in cs.slow_logs.items()},
            "long_query_time": cs.long_query_time,
            "thread_pool_size": cs.thread_pool_size, "servers": cs.servers,
            "proxy": [p.name for p in proxy_pts], "proxy_servers": cs.proxy_servers,
            "cwd": os.getcwd(),  # relative capture paths above (and in exchanges.capture) are relative to this
            "scheduler": runner.address if runner is not None else None,
        },
        "points": points_info,
        "captures": {"app": [qualities[id(x)] for x in app_x],
                     "db": qualities[id(db_xs[0])] if db_xs else None,
                     "dbs": [qualities[id(x)] for x in db_xs],
                     "proxy": [qualities[id(x)] for x in proxy_x]},
        "match": matching.stats.as_dict(),
        "proxy": proxy_summary,
        "repair": repair.stats.as_dict() if repair is not None else None,
        "clock": next(iter(clock_info.values()), None),
        "clocks": clock_info,
        "slow_log": first["slow_info"],
        "exchanges": _counts(exchanges),
        "latency_s": _latency(exchanges),
        "thread_pool_size": first["view"].thread_pool_size,
        "pool": first["view"].pool_summary,
        "groups": first["view"].groups_summary,
        "warnings": warnings,
    }
    mine = exchanges if not several else exchanges[exchanges["db_point"].astype(object).isin([first["point"], None])
                                                   | exchanges["db_point"].isna()].reset_index(drop=True)
    summary.update(tell(_point_summary(summary, mine, first, clock_info), mine, first["view"]) if several
                   else tell(summary, exchanges, first["view"]))
    if several:
        servers = []
        for d in done:
            x = exchanges[(exchanges["db_point"].astype(object) == d["point"]).to_numpy()].reset_index(drop=True)
            part = _point_summary(summary, x, d, clock_info)
            part.update(tell(part, x, d["view"]))
            servers.append({"point": d["point"], "name": _server_name(cs, points_info, d["point"]),
                            "endpoints": next((e["servers"] for e in points_info if e["name"] == d["point"]), []),
                            **{k: part[k] for k in ("exchanges", "slow_log", "thread_pool_size", "pool", "groups",
                                                    "story", "verdict", "hidden_slow", "understated", "queueing")}})
        summary["servers"] = servers
        extra = [f"- Server {s['name']}: {s['story']['sentence']}" for s in servers[1:]]
        summary["verdict"] = "\n".join([summary["verdict"], *extra])
    if proxied is not None:
        from .proxy import sentence as proxy_sentence

        summary["proxy"]["sentence"] = proxy_sentence(exchanges, proxied.summary)
        summary["verdict"] += "\n- " + summary["proxy"]["sentence"]

    names = []
    for name, df in (("exchanges.parquet", exchanges), ("groups.parquet", groups), ("pool.parquet", pool)):
        write_table(df, out / name)
        names.append(name)
        release_memory()
    if csv:
        write_table(exchanges, out / "exchanges.csv")
        names.append("exchanges.csv")
    if partitioned:
        from .dataset import host_of, write_dataset

        hosts = {p.name: host_of(p.given if Path(p.given).is_dir() else p.name) for p in cs.points}
        names.append(write_dataset(exchanges, out / DATASET_NAME, hosts))
    write_text(out / "summary.json", json.dumps(_finite(summary), indent=2, ensure_ascii=False, allow_nan=False,
                                                 default=_json_default) + "\n")
    write_text(out / "report.html", render_report(summary, exchanges, first["view"].groups, command_line,
                                                   {"app": app_conns, "db": db_conns}, first["view"].pool))
    names += ["summary.json", "report.html"]
    return AnalysisResult(out, exchanges, groups, summary, [], warnings), names


DATASET_NAME = "exchanges"  # --partitioned: the hive-style dataset folder in the output folder


def _server_name(cs: CaptureSet, points_info: list[dict], point: str | None) -> str:
    """How the verdict names a DB point: its --server NAME= when one of its endpoints has one, else the point."""
    entry = next((e for e in points_info if e["name"] == point), None)
    for endpoint in (entry or {}).get("servers", []):
        if endpoint in cs.server_names:
            return cs.server_names[endpoint]
    return Path(str(point)).name


def _per_server(table: pd.DataFrame, cs: CaptureSet, point: str | None, tz, max_sql_bytes: int, note) -> dict:
    """The slow-log join, the decomposition and the thread-pool view of one DB point's exchanges."""
    slow_path = cs.slow_logs.get(point if point is not None else "")
    slow = None
    slow_info: dict = {"file": str(slow_path) if slow_path else None, "used": False}
    if slow_path is not None:
        from .slowlog import read_slow_log

        try:
            slow, sstats = read_slow_log(slow_path, tz=tz, max_sql_bytes=max_sql_bytes)
            slow_info.update({"flavor": sstats.flavor, "unparsed_lines": sstats.unparsed_lines,
                              "cut_entries": sstats.cut_entries, "damaged_values": sstats.damaged_values,
                              "capped_statements": sstats.capped_statements})
            for w in sstats.warnings[:5]:
                note(w)
        except SlowLogError as err:
            note(f"{err}; analysed without the slow log")
    table, join = decompose(table, slow, cs.long_query_time, cs.thread_pool_size, str(slow_path))
    release_memory()
    for w in join.warnings:
        note(w)
    slow_info.update(join.stats)
    slow_info["used"] = join.used
    view = thread_pool_view(table, cs.thread_pool_size)
    for col in ("thread_group", "stall", "stall_role"):
        table[col] = getattr(view, col).array
    for w in view.warnings:
        note(w if len(cs.of("db")) <= 1 else f"{point}: {w}")
    return {"point": point, "table": table, "view": view, "slow_info": slow_info}


def _point_summary(summary: dict, x: pd.DataFrame, done: dict, clock_info: dict) -> dict:
    """The summary parts the verdict reads, for one DB point."""
    part = dict(summary)
    part.update({"exchanges": _counts(x), "slow_log": done["slow_info"],
                 "thread_pool_size": done["view"].thread_pool_size, "pool": done["view"].pool_summary,
                 "groups": done["view"].groups_summary,
                 "clock": next((c for c in clock_info.values() if c.get("db") == done["point"]), None)})
    return part


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
    from .schema import CONNECTION_COLUMNS
    from .tables import frame

    return frame([], EXCHANGE_COLUMNS), frame([], CONNECTION_COLUMNS)


def _conn_table(ex: pd.DataFrame, conns: pd.DataFrame) -> pd.DataFrame:
    from .match import connection_keys

    key = connection_keys(ex).to_numpy()
    first = np.unique(key, return_index=True)[1]  # each connection's first row (keys number them as they appear)
    keys = pd.DataFrame({"key": key[first], "capture": ex["capture"].iloc[first].to_numpy(),
                         "conn_index": ex["conn_index"].to_numpy()[first]})
    return keys.merge(conns[["capture", "conn_index", "client", "server"]], on=["capture", "conn_index"])


def _clock_summary(model: ClockModel, samples: ClockSamples, db_first_ns: int | None) -> dict:
    info = model.summary(int(db_first_ns)) if db_first_ns is not None else {}
    info["samples"] = {"forward": len(samples.fwd_app), "reverse": len(samples.rev_app)}
    info["duplicates_dropped"] = samples.duplicates_dropped
    info["segments_read"] = {"app": samples.app_segments, "db": samples.db_segments}
    return info


def _counts(x: pd.DataFrame) -> dict:
    seen = x["seen"].value_counts()
    return {
        "total": len(x), "seen_both": int(seen.get("both", 0)), "seen_app": int(seen.get("app", 0)),
        "seen_db": int(seen.get("db", 0)), "hidden_slow": int(x["hidden_slow"].fillna(False).sum()),
        "in_slow_log": int(x["in_slow_log"].fillna(False).sum()),
        "server_flag_slow": int(x["server_flag_slow"].fillna(False).sum()),
        "match_conflicts": int(x["match_notes"].astype("string").str.contains("match-conflict").fillna(False).sum()),
        "repaired": int(x["match_notes"].astype("string").str.contains("repaired-at").fillna(False).sum()),
        "bounded": int(x["bounded"].notna().sum()),
    }


def _latency(x: pd.DataFrame) -> dict:
    out = {}
    for col in ("total_s", "server_s", "network_s", "net_req_s", "net_resp_s", "queue_s", "exec_s"):
        v = x[col].dropna()
        out[col.removesuffix("_s")] = None if v.empty else {
            "count": int(len(v)), "sum": float(v.sum()), "p50": float(v.quantile(0.5)),
            "p99": float(v.quantile(0.99)), "max": float(v.max()),
        }
    return out


def _finite(v):
    """summary.json is strict JSON: a number that is not finite (a one-sided clock bound is infinite) is null."""
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if isinstance(v, (float, np.floating)) and not np.isfinite(v):
        return None
    return v


def _json_default(v):
    value = json_value(v)
    if value is v:
        raise TypeError(f"not JSON serialisable: {type(v)}")
    return value
