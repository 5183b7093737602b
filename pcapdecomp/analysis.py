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

from . import __version__
from .clock import ClockModel, estimate_clock
from .decompose import build_table, decompose
from .errors import InputError, SlowLogError, UsageError, internal_errors_to
from .match import ClockSamples, match_exchanges, pair_segments, read_segments_of, split_endpoint
from .parallel import default_jobs, run_all
from .pipeline import OutputFolder, capture_problems, parse_server, read_captures, warn, write_table
from .proxy import NoProxy, Side, through_proxy
from .proxy import empty_columns as proxy_empty
from .proxy import finish as proxy_finish
from .repair import apply_bounds, point_bounds, repair_losses
from .report import render as render_report
from .schema import ANALYSIS_COLUMNS, EXCHANGE_COLUMNS
from .tables import concat, release_memory
from .threadpool import json_value, thread_pool_view
from .verdict import tell

CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".pcap.gz", ".pcapng.gz")


@dataclass
class CaptureSet:
    """The inputs of one analysis, after the folder's contents and the explicit options were combined."""

    name: str
    app: list[Path]
    db: Path | None
    slow_log: Path | None
    long_query_time: float | None
    thread_pool_size: int | None
    servers: list[str]
    warnings: list[str] = field(default_factory=list)  # about the folder's contents (a named file is missing)
    proxy: list[Path] = field(default_factory=list)  # captures on a proxy host between app and DB
    proxy_servers: list[str] = field(default_factory=list)  # the proxy's listening endpoints, when known


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
                  if p.name.startswith(prefix) and p.name.endswith(CAPTURE_SUFFIXES) and not p.is_dir())


def resolve_capture_set(set_dir: Path | None, app: list[Path], db: Path | None, slow_log: Path | None,
                        long_query_time: float | None, thread_pool_size: int | None,
                        servers: list[str], proxy: list[Path] | None = None,
                        proxy_servers: list[str] | None = None) -> CaptureSet:
    """Fill options from a capture-set folder (app*.pcap[ng][.gz], db*…, proxy*…, slow*.log, capture.toml); explicit
    options win.

    A capture set may come from someone else, so its capture.toml is not trusted: values of the wrong type or out
    of range, a named file that is missing, or a file outside the folder (an absolute path, `..`, a symlink that
    leads out) are user mistakes, reported in one line."""
    toml: dict = {}
    found_proxy: list[Path] = []
    found_app: list[Path] = []
    found_db: Path | None = None
    found_slow: Path | None = None
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
        if app:
            found_app = []
        elif "app" in named:
            found_app = [p for n in _names(named["app"], cfg, "[captures] app")
                         if (p := _named_file(set_dir, cfg, "app", n, missing)) is not None]
        else:
            found_app = [_inside(set_dir, p, p.name) for p in _captures_in(set_dir, "app")]
        if db is None and "db" in named:
            found_db = _named_file(set_dir, cfg, "db", named["db"], missing)
        elif db is None:
            dbs = _captures_in(set_dir, "db")
            if len(dbs) > 1:
                raise UsageError(f"{set_dir}: several DB captures ({', '.join(p.name for p in dbs)}); choose one with --db")
            found_db = _inside(set_dir, dbs[0], dbs[0].name) if dbs else None
        if proxy:
            found_proxy = []
        elif "proxy" in named:
            found_proxy = [p for n in _names(named["proxy"], cfg, "[captures] proxy")
                           if (p := _named_file(set_dir, cfg, "proxy", n, missing)) is not None]
        else:
            found_proxy = [_inside(set_dir, p, p.name) for p in _captures_in(set_dir, "proxy")]
        if slow_log is None and "slow_log" in named:
            found_slow = _named_file(set_dir, cfg, "slow_log", named["slow_log"], missing)
        elif slow_log is None:
            slows = sorted(p for p in set_dir.iterdir()
                           if p.name.startswith("slow") and p.name.endswith((".log", ".log.gz")) and not p.is_dir())
            found_slow = _inside(set_dir, slows[0], slows[0].name) if slows else None
    server_cfg = _table(toml, "server", cfg)
    where = f"{cfg}: [server]" if cfg is not None else ""
    lqt = long_query_time if long_query_time is not None else _number(server_cfg, "long_query_time", where)
    tps = thread_pool_size if thread_pool_size is not None else _number(server_cfg, "thread_pool_size", where)
    servers = list(servers)
    if servers:
        for s in servers:
            parse_server(s)
    else:
        for key in ("address", "address_ipv6"):
            value = server_cfg.get(key)
            if value is None:
                continue
            try:
                parse_server(value if isinstance(value, str) else "")
            except UsageError:
                raise InputError(f"{where} {key} must be \"IP:PORT\", got {value!r}") from None
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
    result = CaptureSet(
        name=(set_dir.resolve().name if set_dir is not None else (db or (app[0] if app else Path("analysis"))).name.split(".")[0]),
        app=list(app) or found_app, db=db or found_db, slow_log=slow_log or found_slow,
        long_query_time=None if lqt is None else float(lqt), thread_pool_size=None if tps is None else int(tps),
        servers=list(servers), warnings=missing, proxy=list(proxy or []) or found_proxy, proxy_servers=proxy_servers,
    )
    # Files are checked before any work: a mistake costs a second, not a whole extraction.
    from .pipeline import check_input
    from .slowlog import check_slow_log_file

    for path in [*result.app, *result.proxy]:
        check_input(path)
    if result.db is not None:
        check_input(result.db)
    if result.slow_log is not None and result.slow_log.exists() and not (result.slow_log.is_file()
                                                                          or result.slow_log.is_dir()):
        raise InputError(f"{result.slow_log}: not a regular file (a pipe, device or socket cannot be read)")
    if slow_log is not None:  # one the folder holds may be garbled: a warning, when it is read
        check_slow_log_file(slow_log)
    if not result.app and result.db is None and not result.proxy:
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


def analyze(set_dir: Path | None, app: list[Path], db: Path | None, slow_log: Path | None,
            long_query_time: float | None, thread_pool_size: int | None, servers: list[str], out_dir: Path | None,
            csv: bool = False, quiet: bool = False, slow_log_tz: str | None = None,
            command_line: str | None = None, max_sql_bytes: int = 1 << 20,
            jobs: int | None = None, proxy: list[Path] | None = None,
            proxy_servers: list[str] | None = None) -> AnalysisResult:
    """Run every stage and write the outputs. Raises PcapdecompError subclasses for user mistakes."""
    cs = resolve_capture_set(set_dir, app, db, slow_log, long_query_time, thread_pool_size, servers, proxy,
                             proxy_servers)
    tz = _time_zone(slow_log_tz)
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be ≥ 1, got {jobs}")
    out = out_dir if out_dir is not None else Path("reports") / cs.name
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder")
    # the outputs are written as a set (pipeline.OutputFolder); a bug becomes one line, its traceback a file in out
    with internal_errors_to(out):
        with OutputFolder(out) as folder:
            result, names = _analyze(cs, tz, jobs, folder.staging, csv, quiet, command_line, max_sql_bytes)
            folder.commit()
    result.out_dir = out
    result.written = [out / name for name in names]
    return result


def _analyze(cs: CaptureSet, tz, jobs: int, out: Path, csv: bool, quiet: bool, command_line: str | None,
             max_sql_bytes: int) -> tuple[AnalysisResult, list[str]]:
    """Every stage; the outputs are written to `out` (the staging folder). Returns the result and the file names."""
    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        if not quiet:
            warn(message)

    for message in cs.warnings:
        note(message)

    # behind a proxy the app talks to the proxy's address, not the server's: read every capture with both
    readable = [*cs.servers, *cs.proxy_servers] if cs.servers else []
    extractions = read_captures([*cs.app, *([cs.db] if cs.db is not None else []), *cs.proxy], readable, quiet,
                                max_sql_bytes, jobs)
    app_x = extractions[:len(cs.app)]
    db_x = extractions[len(cs.app)] if cs.db is not None else None
    proxy_x = extractions[len(cs.app) + (cs.db is not None):]
    qualities = {id(x): x.quality() for x in extractions}
    for x in extractions:
        problem = capture_problems(qualities[id(x)])
        if problem:
            note(problem)
    empty = _empty_extraction_frames()
    app_ex = concat([x.exchanges for x in app_x]) if app_x else empty[0]
    app_conns = concat([x.connections for x in app_x]) if app_x else empty[1]
    db_ex = db_x.exchanges if db_x is not None else empty[0]
    db_conns = db_x.connections if db_x is not None else empty[1]
    matching = match_exchanges(app_ex, db_ex, app_conns, db_conns)
    proxied = through_proxy(Side(app_ex, app_conns) if app_x else None, Side(db_ex, db_conns) if db_x else None,
                            Side(concat([x.exchanges for x in proxy_x]), concat([x.connections for x in proxy_x]))
                            if proxy_x else None, set(cs.servers), set(cs.proxy_servers), direct=matching)
    proxy_summary = proxied.summary if proxied is not None else None
    if isinstance(proxied, NoProxy):  # a proxy capture without a proxy in its traffic stays out of the way
        note(f"{', '.join(str(p) for p in cs.proxy)}: {proxied.warning}")
        proxied = None
        if not app_x:  # it is the client side's view
            app_x = proxy_x
            app_ex, app_conns = concat([x.exchanges for x in app_x]), concat([x.connections for x in app_x])
            matching = match_exchanges(app_ex, db_ex, app_conns, db_conns)
            proxied = through_proxy(Side(app_ex, app_conns), Side(db_ex, db_conns) if db_x else None, None,
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
    repair = repair_losses(app_x, db_x, app_ex, db_ex, app_conns, db_conns, matching,
                           {parse_server(s) for s in cs.servers} or None, max_sql_bytes, jobs) \
        if app_x and db_x is not None and proxied is None else None
    if repair is not None:
        app_ex, db_ex, app_conns, db_conns, matching = (repair.app_ex, repair.db_ex, repair.app_conns,
                                                        repair.db_conns, repair.matching)
        release_memory()
        for message in repair.stats.warnings():
            note(message)
    if app_x and db_x is not None and matching.stats.matched == 0 and len(app_ex) and len(db_ex):
        note("no exchange was seen at both points: are these captures of the same traffic and time?")

    # --- clocks: one model per app capture, from segments of its matched connections
    clocks: dict[str, ClockModel] = {}
    clock_info: dict[str, dict] = {}
    if app_x and db_x is not None and len(matching.connections):
        a_keys = _conn_table(app_ex, app_conns)
        d_keys = _conn_table(db_ex, db_conns)
        pairs = matching.connections.merge(a_keys, left_on="app_conn", right_on="key").merge(
            d_keys, left_on="db_conn", right_on="key", suffixes=("_a", "_d"))
        # one more pass over each capture for the segments of matched connections: in parallel with --jobs
        calls = [(cs.db, _flows(pairs.rename(columns={"client_d": "client", "server_d": "server"})))]
        for x in app_x:
            mine = pairs[pairs["capture_a"] == x.capture]
            if len(mine):
                calls.append((x.capture, _flows(mine.rename(columns={"client_a": "client", "server_a": "server"}))))
        db_segments, *app_segment_sets = run_all(read_segments_of, calls, jobs)
        release_memory()  # with --jobs 1 the reading ran here: its per-packet garbage goes before pairing
        for (capture, _), app_segments in zip(calls[1:], app_segment_sets):
            x = next(x for x in app_x if x.capture == capture)
            samples = pair_segments(app_segments, db_segments)
            release_memory()
            model = estimate_clock(samples.fwd_app, samples.fwd_db, samples.rev_db, samples.rev_app)
            clocks[x.capture] = model
            clock_info[x.capture] = _clock_summary(model, samples, db_x.stats.first_ts_ns)
            if model.quality != "two-sided":
                note(f"clock of {x.capture}: {model.quality} fit (too few segments seen at both points); "
                     "one-way network times are bounds, not estimates")
        del db_segments, app_segment_sets, app_segments
        release_memory()
    primary = app_x[0].capture if app_x else None
    if proxied is not None:
        clocks = dict(proxied.clocks)
        clock_info = {}  # the proxy's clocks are in summary.json → proxy.clocks
        primary = str(app_ex["capture"].iloc[0]) if len(app_ex) else primary

    # --- slow log
    slow = None
    slow_info: dict = {"file": str(cs.slow_log) if cs.slow_log else None, "used": False}
    if cs.slow_log is not None:
        from .slowlog import read_slow_log

        try:
            slow, sstats = read_slow_log(cs.slow_log, tz=tz, max_sql_bytes=max_sql_bytes)
            slow_info.update({"flavor": sstats.flavor, "unparsed_lines": sstats.unparsed_lines,
                              "cut_entries": sstats.cut_entries, "damaged_values": sstats.damaged_values,
                              "capped_statements": sstats.capped_statements})
            for w in sstats.warnings[:5]:
                note(w)
        except SlowLogError as err:
            note(f"{err}; analysed without the slow log")

    # The joined table takes what it needs of both sides: the per-capture tables go (build_table moves the app
    # side's columns into it one by one), so memory holds about one table, not three.
    for x in extractions:
        x.exchanges = x.exchanges.iloc[:0].copy()  # a copy: an empty view would keep the whole table alive
    bounds = point_bounds(app_ex, db_ex, matching, repair)
    table = apply_bounds(build_table(app_ex, db_ex, matching, clocks, primary), bounds, clocks, primary)
    table = proxy_finish(table, proxied) if proxied is not None else proxy_empty(table)
    del app_ex, db_ex
    release_memory()
    table, join = decompose(table, slow, cs.long_query_time, cs.thread_pool_size, str(cs.slow_log))
    release_memory()
    for w in join.warnings:
        note(w)
    slow_info.update(join.stats)
    slow_info["used"] = join.used
    if cs.long_query_time is None:
        note("long_query_time unknown (no capture.toml, no --long-query-time): hidden_slow not decided")
    view = thread_pool_view(table, cs.thread_pool_size)
    for col in ("thread_group", "stall", "stall_role"):
        table[col] = getattr(view, col).array
    for w in view.warnings:
        note(w)
    groups = view.groups
    release_memory()

    exchanges = table[[c.name for c in (*EXCHANGE_COLUMNS, *ANALYSIS_COLUMNS)]]  # copy-on-write: no copy made
    del table
    for col in (*EXCHANGE_COLUMNS, *ANALYSIS_COLUMNS):
        if str(exchanges[col.name].dtype) != col.dtype:
            exchanges[col.name] = exchanges[col.name].astype(col.dtype)

    summary = {
        "set": cs.name,
        "verdict": "",
        "pcapdecomp": __version__,
        "inputs": {
            "app": [str(p) for p in cs.app], "db": str(cs.db) if cs.db else None,
            "slow_log": str(cs.slow_log) if cs.slow_log else None, "long_query_time": cs.long_query_time,
            "thread_pool_size": cs.thread_pool_size, "servers": cs.servers,
            "proxy": [str(p) for p in cs.proxy], "proxy_servers": cs.proxy_servers,
            "cwd": os.getcwd(),  # relative capture paths above (and in exchanges.capture) are relative to this
        },
        "captures": {"app": [qualities[id(x)] for x in app_x],
                      "db": qualities[id(db_x)] if db_x is not None else None,
                      "proxy": [qualities[id(x)] for x in proxy_x]},
        "match": matching.stats.as_dict(),
        "proxy": proxy_summary,
        "repair": repair.stats.as_dict() if repair is not None else None,
        "clock": next(iter(clock_info.values()), None),
        "clocks": clock_info,
        "slow_log": slow_info,
        "exchanges": _counts(exchanges),
        "latency_s": _latency(exchanges),
        "thread_pool_size": view.thread_pool_size,
        "pool": view.pool_summary,
        "groups": view.groups_summary,
        "warnings": warnings,
    }
    summary.update(tell(summary, exchanges, view))
    if proxied is not None:
        from .proxy import sentence as proxy_sentence

        summary["proxy"]["sentence"] = proxy_sentence(exchanges, proxied.summary)
        summary["verdict"] += "\n- " + summary["proxy"]["sentence"]

    names = []
    for name, df in (("exchanges.parquet", exchanges), ("groups.parquet", groups), ("pool.parquet", view.pool)):
        write_table(df, out / name)
        names.append(name)
        release_memory()
    if csv:
        write_table(exchanges, out / "exchanges.csv")
        names.append("exchanges.csv")
    _write_text(out / "summary.json", json.dumps(_finite(summary), indent=2, ensure_ascii=False, allow_nan=False,
                                                 default=_json_default) + "\n")
    _write_text(out / "report.html", render_report(summary, exchanges, groups, command_line,
                                                   {"app": app_conns, "db": db_conns}, view.pool))
    names += ["summary.json", "report.html"]
    return AnalysisResult(out, exchanges, groups, summary, [], warnings), names


def _empty_extraction_frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    from .schema import CONNECTION_COLUMNS
    from .tables import frame

    return frame([], EXCHANGE_COLUMNS), frame([], CONNECTION_COLUMNS)


def _conn_table(ex: pd.DataFrame, conns: pd.DataFrame) -> pd.DataFrame:
    from .match import connection_keys

    keys = pd.DataFrame({"key": connection_keys(ex).to_numpy(), "capture": ex["capture"].to_numpy(),
                         "conn_index": ex["conn_index"].to_numpy()}).drop_duplicates("key")
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


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
