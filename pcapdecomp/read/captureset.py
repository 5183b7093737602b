"""The inputs of one analysis: a capture-set folder (app*.pcap…, db*…, proxy*…, their subfolders, slow*.log,
capture.toml) combined with the explicit options (--app, --db, --slow-log, --server, …; explicit options win),
checked before any work so that a mistake costs a second, not a whole extraction."""

from __future__ import annotations

import math
import re

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from dataclasses import dataclass, field
from pathlib import Path

from ..core.endpoints import endpoint_text
from ..core.errors import InputError, UsageError
from ..core.schema import CAPTURE_TOML_KEYS, InputKey
from ..core.window import Window
from . import sources
from .sources import CapturePoint, parse_server
from .tlskeys import KEYLOG_NAME

SERVER_VARS_NAME = "variables.tsv"  # SHOW GLOBAL VARIABLES as `mysql -B` prints it (pcapdecomp guide writes it)


@dataclass
class CaptureSet:
    """The inputs of one analysis, after the folder's contents and the explicit options were combined."""

    name: str
    points: list[CapturePoint]  # every capture point (kind app, db, …), each one file or several (read/sources.py)
    slow_logs: dict[str, Path]  # DB point name -> its slow log
    long_query_time: float | None
    thread_pool_size: int | None
    servers: list[str]
    warnings: list[str] = field(default_factory=list)  # about the folder's contents (a named file is missing)
    server_names: dict[str, str] = field(default_factory=dict)  # --server NAME=HOST:PORT: endpoint -> name
    proxy_servers: list[str] = field(default_factory=list)  # the proxy's listening endpoints, when known
    processlist: Path | None = None  # a processlist snapshot: connection ids by client endpoint (read/connids.py)
    server_settings: dict | None = None  # --server-vars (read.servervars.read_server_vars); None: capture.toml's
    server_vars: Path | None = None  # the folder's variables.tsv (SERVER_VARS_NAME), as `pcapdecomp guide` writes it
    tls_keylogs: list[Path] = field(default_factory=list)  # NSS key logs (--tls-keylog, the folder's tls-keys.log)
    memory: str | None = None  # capture.toml's memory: the analysis's memory bound, as 8G or 800M (--memory wins)
    window: Window | None = None  # analyze --since/--until: the exchanges kept (core.window); None: all of them

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


def _processlists_in(folder: Path) -> list[Path]:
    from fnmatch import fnmatch

    from .connids import PROCESSLIST_NAMES

    return sorted(p for p in folder.iterdir()
                  if any(fnmatch(p.name, pattern) for pattern in PROCESSLIST_NAMES) and p.is_file())


def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def resolve_capture_set(set_dir: Path | None, app: list, db, slow_log, long_query_time: float | None,
                        thread_pool_size: int | None, servers: list[str], proxy: list | None = None,
                        proxy_servers: list[str] | None = None, processlist: Path | None = None,
                        tls_keylog: list | None = None) -> CaptureSet:
    """Fill options from a capture-set folder (app*.pcap[ng][.gz], db*…, proxy*…, app-<host>/ and db[-<name>]/
    subfolders of rotated files, slow*.log, capture.toml); explicit options win. `app`, `db` and `proxy` name capture
    points: each a file, a quoted glob or a folder of one point's files (`db` may be one or a list: several DB
    servers).
    `slow_log` is one file or one per DB point, in their order. `processlist`: a processlist snapshot (else the
    folder's processlist*.tsv|txt, or the one capture.toml's [captures] processlist names).
    `tls_keylog`: NSS key logs; without one, a
    folder's `tls-keys.log` (tlskeys.KEYLOG_NAME) is used.

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
            _check_toml(toml, cfg, missing)
        named = toml.get("captures", {})
        absent: list[str] = []  # captures capture.toml names that are not in the folder
        for kind, given in (("app", app_specs), ("db", db_specs), ("proxy", proxy_specs)):
            if given:
                continue
            if kind in named:
                for n in _names(named[kind]):
                    p = _named_file(set_dir, cfg, kind, n, missing)
                    if p is not None:
                        found.append(sources.point(kind, p))
                    else:
                        absent.append(f"{kind} = {n!r}")
            else:
                found += _folder_points(set_dir, kind)
        if processlist is None and "processlist" in named:
            processlist = _named_file(set_dir, cfg, "processlist", named["processlist"], missing)
        elif processlist is None:
            snapshots = _processlists_in(set_dir)
            processlist = _inside(set_dir, snapshots[0], snapshots[0].name) if snapshots else None
            if len(snapshots) > 1:
                missing.append(f"{set_dir}: {len(snapshots)} processlist snapshots; {snapshots[0].name} is used (name "
                               "one with --processlist or capture.toml's [captures] processlist)")
        if not slow_specs and "slow_log" in named:
            found_slow = [p for n in _names(named["slow_log"])
                          if (p := _named_file(set_dir, cfg, "slow_log", n, missing)) is not None]
        elif not slow_specs:
            slows = _slow_logs_in(set_dir)
            found_slow = [_inside(set_dir, slows[0], slows[0].name)] if slows else []
            for pt in found:  # a DB point's own folder may hold its slow log
                if pt.kind == "db" and Path(pt.given).is_dir() and (mine := _slow_logs_in(Path(pt.given))):
                    folder_slow[pt.name] = _inside(set_dir, mine[0], f"{Path(pt.given).name}/{mine[0].name}")
    server_cfg = toml.get("server", {})
    where = f"{cfg}: [server]" if cfg is not None else ""
    lqt = long_query_time if long_query_time is not None else server_cfg.get("long_query_time")
    tps = thread_pool_size if thread_pool_size is not None else server_cfg.get("thread_pool_size")
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
            servers += _as_list(server_cfg.get(key))
    proxy_servers = list(proxy_servers or [])
    if proxy_servers:
        for s in proxy_servers:
            parse_server(s)
    else:
        value = toml.get("proxy", {}).get("address")
        if value is not None:
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
        processlist=Path(processlist) if processlist is not None else None,
        tls_keylogs=[Path(k) for k in _as_list(tls_keylog)],
        memory=toml.get("memory"),
    )
    if set_dir is not None and (set_dir / SERVER_VARS_NAME).is_file():
        result.server_vars = _inside(set_dir, set_dir / SERVER_VARS_NAME, SERVER_VARS_NAME)
    if not result.tls_keylogs and set_dir is not None and (set_dir / KEYLOG_NAME).is_file():
        result.tls_keylogs = [_inside(set_dir, set_dir / KEYLOG_NAME, KEYLOG_NAME)]
    for path in result.tls_keylogs:
        if not Path(path).is_file():
            raise InputError(f"--tls-keylog {path}: no such file")
    # Files are checked before any work: a mistake costs a second, not a whole extraction.
    from ..slowlog.reader import check_slow_log_file

    for path in result.slow_logs.values():
        if path.exists() and not (path.is_file() or path.is_dir()):
            raise InputError(f"{path}: not a regular file (a pipe, device or socket cannot be read)")
    for path in slow_specs:  # one the folder holds may be garbled: a warning, when it is read
        check_slow_log_file(Path(path))
    if result.processlist is not None and not result.processlist.is_file():
        raise InputError(f"{result.processlist}: {'no such file' if not result.processlist.exists() else 'not a regular file'}"
                         " (the processlist snapshot)")
    if not points:
        where = f" in {set_dir}" if set_dir is not None else ""
        if set_dir is not None and absent:  # where capture.toml names the captures, the folder's files are not looked at
            raise UsageError(f"no capture to analyse{where}: its capture.toml's [captures] names {', '.join(absent)}, "
                             "which are not there; name the files that are, or give them with --app, --db and/or "
                             "--proxy")
        raise UsageError(f"no capture to analyse{where}: give a capture-set folder, --app, --db and/or --proxy")
    return result


# --- capture.toml, checked against its declaration (schema.CAPTURE_TOML_KEYS) --------------------------------------

_DECLARED = {k.name: k for k in CAPTURE_TOML_KEYS}
_DECLARED_PATTERNS = [(re.compile(re.escape(k.name).replace("<point>", "[^.]+")), k) for k in CAPTURE_TOML_KEYS
                      if "<point>" in k.name]


def _is_endpoint(value) -> bool:
    try:
        parse_server(value if isinstance(value, str) else "")
    except UsageError:
        return False
    return True


def _one_or_list(value, each) -> bool:
    values = value if isinstance(value, list) else [value]
    return bool(values) and all(each(v) for v in values)


# per declared type: (the check a value passes, the words a wrong value's message says it must be)
_TYPES = {
    "table": (lambda v: isinstance(v, dict), "a table"),
    "table of any keys": (lambda v: isinstance(v, dict), "a table"),
    "string": (lambda v: isinstance(v, str), "text"),
    "strings": (lambda v: _one_or_list(v, lambda x: isinstance(x, str)), "text or a list of texts"),
    "number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "boolean": (lambda v: isinstance(v, bool), "true or false"),
    "file name": (lambda v: isinstance(v, str) and bool(v), "a file name"),
    "file names": (lambda v: _one_or_list(v, lambda x: isinstance(x, str)), "a file name or a list of file names"),
    "IP:PORT": (_is_endpoint, '"IP:PORT"'),
    "IP:PORTs": (lambda v: _one_or_list(v, _is_endpoint), '"IP:PORT" or a list of them'),
}


def _declaration(name: str) -> InputKey | None:
    key = _DECLARED.get(name)
    if key is None:
        key = next((k for pattern, k in _DECLARED_PATTERNS if pattern.fullmatch(name)), None)
    return key


def _check_toml(toml: dict, cfg: Path, warnings: list[str]) -> None:
    """capture.toml against its declaration: a value of the wrong type is a user mistake (one line); the keys not
    declared are named in one warning (a misspelt key would else be ignored without a word)."""
    unknown = []
    for section, value in toml.items():
        key = _declaration(section)
        if key is None:
            unknown.append(section)
            continue
        _check_value(key, value, cfg, "", section)
        if key.dtype != "table":
            continue
        for name, inner in value.items():
            key = _declaration(f"{section}.{name}")
            if key is None:
                unknown.append(f"[{section}] {name}")
            else:
                _check_value(key, inner, cfg, section, name)
    if unknown:
        warnings.append(f"{cfg}: {', '.join(unknown)}: not {'a key' if len(unknown) == 1 else 'keys'} of "
                        "capture.toml, not read (`pcapdecomp columns capture-toml` lists its keys)")


def _check_value(key: InputKey, value, cfg: Path, section: str, name: str) -> None:
    ok, words = _TYPES[key.dtype]
    if not ok(value):
        if not section:  # a top-level key: a table ([name]) or a value (memory = "8G")
            shape = f" ([{name}])" if key.dtype.startswith("table") else ""
            raise InputError(f"{cfg}: {name} must be {words}{shape}, got {value!r}")
        raise InputError(f"{cfg}: [{section}] {name} must be {words}, got {value!r}")


def _names(value) -> list[str]:
    """[captures] app = "app.pcap" or ["app1.pcap", "app2.pcap"] (one per app host; its type checked already)."""
    return [value] if isinstance(value, str) else value


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


def time_zone(name: str | None):
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



def capture_set(folder: Path | None = None, *, app: list | tuple = (), db=None, slow_log=None,
                long_query_time: float | None = None, thread_pool_size: int | None = None,
                servers: list[str] | tuple = (), proxy: list | tuple = (), proxy_servers: list[str] | tuple = (),
                processlist: Path | None = None, tls_keylog: list | tuple = (),
                server_settings: dict | None = None, window: Window | None = None) -> CaptureSet:
    """What `analyze` reads, from a capture-set folder and/or named files (resolve_capture_set: explicit ones win).
    `server_settings`: the server's settings for the playbook (read.servervars.read_server_vars of --server-vars);
    None: the folder's variables.tsv (a damaged one is a warning), else capture.toml's. `window`: analyze
    --since/--until (core.window.window_of): the exchanges kept."""
    cs = resolve_capture_set(folder, _as_list(app), db, slow_log, long_query_time, thread_pool_size,
                             _as_list(servers), _as_list(proxy), _as_list(proxy_servers), processlist,
                             _as_list(tls_keylog))
    cs.server_settings = server_settings
    cs.window = window
    if server_settings is None and cs.server_vars is not None:
        from .servervars import read_server_vars

        try:
            cs.server_settings = read_server_vars(cs.server_vars)
        except InputError as err:
            cs.warnings.append(f"{err}; what to change is told from capture.toml's settings")
    return cs
