"""`pcapdecomp analyze`: read a capture set, extract each capture, match the points, fit the clock, join the slow
log, decompose every exchange's latency and write exchanges.parquet, groups.parquet, summary.json, report.html."""

from __future__ import annotations

import json
import os
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import __version__
from .clock import ClockModel, estimate_clock
from .decompose import build_table, decompose
from .errors import InputError, SlowLogError, UsageError
from .match import ClockSamples, match_exchanges, pair_segments, read_segments_of, split_endpoint
from .parallel import default_jobs, run_all
from .proxy import Side, through_proxy
from .proxy import empty_columns as proxy_empty
from .proxy import finish as proxy_finish
from .pipeline import capture_problems, parse_server, read_captures, warn, write_table
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
                  if p.is_file() and p.name.startswith(prefix) and p.name.endswith(CAPTURE_SUFFIXES))


def resolve_capture_set(set_dir: Path | None, app: list[Path], db: Path | None, slow_log: Path | None,
                        long_query_time: float | None, thread_pool_size: int | None,
                        servers: list[str], proxy: list[Path] | None = None,
                        proxy_servers: list[str] | None = None) -> CaptureSet:
    """Fill options from a capture-set folder (app*.pcap[ng][.gz], db*…, slow*.log, capture.toml); explicit win."""
    toml: dict = {}
    found_proxy: list[Path] = []
    found_app: list[Path] = []
    found_db: Path | None = None
    found_slow: Path | None = None
    if set_dir is not None:
        if not set_dir.exists():
            raise InputError(f"{set_dir}: no such folder")
        if not set_dir.is_dir():
            raise InputError(f"{set_dir}: not a folder (give captures with --app/--db, or a capture-set folder)")
        cfg = set_dir / "capture.toml"
        if cfg.exists():
            try:
                toml = tomllib.loads(cfg.read_text(encoding="utf-8"))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
                raise InputError(f"{cfg}: not valid TOML: {err}") from None
        named = toml.get("captures", {})
        found_app = [set_dir / named["app"]] if isinstance(named.get("app"), str) else _captures_in(set_dir, "app")
        dbs = [set_dir / named["db"]] if isinstance(named.get("db"), str) else _captures_in(set_dir, "db")
        if len(dbs) > 1:
            raise UsageError(f"{set_dir}: several DB captures ({', '.join(p.name for p in dbs)}); choose one with --db")
        found_db = dbs[0] if dbs else None
        found_proxy = ([set_dir / named["proxy"]] if isinstance(named.get("proxy"), str)
                       else _captures_in(set_dir, "proxy"))
        found_proxy = [p for p in found_proxy if p.exists()]
        if isinstance(named.get("slow_log"), str):
            found_slow = set_dir / named["slow_log"]
        else:
            slows = sorted(p for p in set_dir.iterdir() if p.name.startswith("slow") and p.name.endswith((".log", ".log.gz")))
            found_slow = slows[0] if slows else None
        found_app = [p for p in found_app if p.exists()]
        found_db = found_db if found_db is not None and found_db.exists() else None
        found_slow = found_slow if found_slow is not None and found_slow.exists() else None
    server_cfg = toml.get("server", {}) if isinstance(toml.get("server"), dict) else {}
    lqt = long_query_time if long_query_time is not None else _number(server_cfg.get("long_query_time"))
    tps = thread_pool_size if thread_pool_size is not None else _number(server_cfg.get("thread_pool_size"))
    if not servers:
        servers = [a for a in (server_cfg.get("address"), server_cfg.get("address_ipv6")) if isinstance(a, str)]
    proxy_cfg = toml.get("proxy", {}) if isinstance(toml.get("proxy"), dict) else {}
    if not proxy_servers:
        proxy_servers = [a for a in (proxy_cfg.get("address"),) if isinstance(a, str)]
    for s in [*servers, *proxy_servers]:
        parse_server(s)
    if lqt is not None and lqt < 0:
        raise UsageError(f"--long-query-time must be ≥ 0, got {lqt}")
    if tps is not None and int(tps) < 1:
        raise UsageError(f"--thread-pool-size must be ≥ 1, got {tps}")
    result = CaptureSet(
        name=(set_dir.resolve().name if set_dir is not None else (db or (app[0] if app else Path("analysis"))).name.split(".")[0]),
        app=list(app) or found_app, db=db or found_db, slow_log=slow_log or found_slow,
        long_query_time=None if lqt is None else float(lqt), thread_pool_size=None if tps is None else int(tps),
        servers=list(servers), proxy=list(proxy or []) or found_proxy, proxy_servers=list(proxy_servers),
    )
    # Files the user named are checked before any work: a mistake costs a second, not a whole extraction.
    from .pipeline import check_input
    from .slowlog import check_slow_log_file

    for path in [*app, *(proxy or [])]:
        check_input(path)
    if db is not None:
        check_input(db)
    if slow_log is not None:
        check_slow_log_file(slow_log)
    if not result.app and result.db is None and not result.proxy:
        where = f" in {set_dir}" if set_dir is not None else ""
        raise UsageError(f"no capture to analyse{where}: give a capture-set folder, --app, --db and/or --proxy")
    return result


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


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


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
    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        if not quiet:
            warn(message)

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
    if proxied is not None:  # the two sides of the decomposition are the ends of the chain through the proxy
        app_ex, app_conns, db_ex, db_conns = (proxied.client.ex, proxied.client.conns, proxied.server.ex,
                                              proxied.server.conns)
        matching = proxied.matching
        for w in proxied.warnings:
            note(w)
    release_memory()
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
            slow, sstats = read_slow_log(cs.slow_log, tz=tz)
            slow_info.update({"flavor": sstats.flavor, "unparsed_lines": sstats.unparsed_lines,
                              "cut_entries": sstats.cut_entries})
            for w in sstats.warnings[:5]:
                note(w)
        except SlowLogError as err:
            note(f"{err}; analysed without the slow log")

    # The joined table takes what it needs of both sides: the per-capture tables go (build_table moves the app
    # side's columns into it one by one), so memory holds about one table, not three.
    for x in extractions:
        x.exchanges = x.exchanges.iloc[:0].copy()  # a copy: an empty view would keep the whole table alive
    table = build_table(app_ex, db_ex, matching, clocks, primary)
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
        "proxy": proxied.summary if proxied is not None else None,
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

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, df in (("exchanges.parquet", exchanges), ("groups.parquet", groups), ("pool.parquet", view.pool)):
        write_table(df, out / name)
        written.append(out / name)
        release_memory()
    if csv:
        write_table(exchanges, out / "exchanges.csv")
        written.append(out / "exchanges.csv")
    _write_text(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False, default=_json_default) + "\n")
    _write_text(out / "report.html", render_report(summary, exchanges, groups, command_line, {"app": app_conns, "db": db_conns}, view.pool))
    written += [out / "summary.json", out / "report.html"]
    return AnalysisResult(out, exchanges, groups, summary, written, warnings)


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
        "match_conflicts": int((x["match_notes"] == "match-conflict").fillna(False).sum()),
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
