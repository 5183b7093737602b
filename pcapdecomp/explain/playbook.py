"""What to change: one line per finding that a server (or proxy) setting governs, from the server's settings —
capture.toml's [server] and [proxy] beside the captures, or `--server-vars FILE` (what
`mysql -B -e "SHOW GLOBAL VARIABLES"` prints) — and, where a setting is unknown, the SQL that fetches it.

Every line cites the measured numbers it rests on; a finding without numbers gives no line. The rules:
- a thread group stalled for about thread_pool_stall_limit or longer: the group waited for its stall timer before
  another worker took its queue; lowering the limit (MariaDB's minimum is 10 ms) lets the queue go sooner — the fix
  the four-point incident ended with (method.md). The value suggested stays well above the queued class's own
  execution and well below the stalls measured.
- thread_pool_oversubscribe: said to stay when each stall had fewer long statements than 1 + oversubscribe (the
  threads a group may run): raising it would not have freed the queue; the stall limit did.
- thread_pool_max_threads against the cap measured on the wire (exactly N statements at once while others waited).
- the proxy's pool size against the waits inside the proxy.
- thread_cache_size against the rate of new connections (connstory.churning), and wait_timeout against the idle time after which the
  server closed connections (connection story: summary.json → connections).
- max_connections against refusals (ERR 1040) and the most connections open at once."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.formats import seconds_rounded
from .connstory import churning
from .wording import span, up_to

MIN_STALL_LIMIT_MS = 10  # MariaDB's smallest thread_pool_stall_limit
SQL_THREAD_POOL = "SHOW GLOBAL VARIABLES LIKE 'thread_pool%';"
SQL_CONNECTIONS = ("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('thread_handling', 'thread_cache_size', "
                   "'wait_timeout', 'max_connections'); SHOW GLOBAL STATUS LIKE 'Threads_created';")


def settings_beside(summary: dict) -> dict | None:
    """{"source": the capture.toml, "values": its [server] table, "proxy": its [proxy] table} beside the analysed
    captures (the lab writes one), or None when there is none (or it is not readable TOML)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    inputs = summary.get("inputs") or {}
    cwd = Path(inputs.get("cwd") or ".")
    for capture in [inputs.get("db"), *(inputs.get("app") or [])]:
        if not isinstance(capture, str):
            continue
        path = Path(capture) if Path(capture).is_absolute() else cwd / capture
        toml = path.parent / "capture.toml"
        if toml.is_file():
            try:
                parsed = tomllib.loads(toml.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                return None
            server, proxy = parsed.get("server"), parsed.get("proxy")
            return {"source": str(toml), "values": server if isinstance(server, dict) else {},
                    "proxy": proxy if isinstance(proxy, dict) else {}}
    return None


def lines(summary: dict, x: pd.DataFrame | None, settings: dict | None, usual_execution=None) -> list[dict]:
    """The playbook: [{finding, text, sql (what to run: the change, or the query that fetches an unknown
    setting)}], in the verdict's order of importance. `usual_execution(stalls)`: _usual_execution's value made
    elsewhere (the partitions' runs: explain/summaryruns.py), with `x` None (the proxy's line needs the table: not
    through a proxy there)."""
    values = {str(k).lower(): v for k, v in ((settings or {}).get("values") or {}).items()}
    proxy = (settings or {}).get("proxy") or {}
    where = _where(settings)
    usual = usual_execution or (lambda stalls: _usual_execution(x, stalls))
    out = []
    for line in (_stall_limit(summary, usual, values, where), _oversubscribe(summary, values, where),
                 _max_threads(summary, values, where)):
        if line:
            out.append(line)
    line = _proxy_pool(summary, x, proxy, where)
    if line:
        out.append(line)
    for rule in (_thread_cache, _wait_timeout, _max_connections):
        line = rule(summary, values, where)
        if line:
            out.append(line)
    line = _network(summary)
    if line:
        out.insert(0, line)
    return out


def _where(settings: dict | None) -> str:
    if not settings:
        return ""
    source = Path(str(settings.get("source") or "")).name
    return f" ({source})" if source else ""


def _stalls(summary: dict) -> list[dict]:
    return [s for s in ((summary.get("groups") or {}).get("stalls") or []) if s.get("duration_s")]


def _range(values: list[float]) -> str:
    return span(min(values), max(values), "–", rel_tol=0.005, alike_as_lo=True)


def _stall_limit(summary: dict, usual_execution, values: dict, where: str) -> dict | None:
    stalls = _stalls(summary)
    if not stalls:
        return None
    durations = [float(s["duration_s"]) for s in stalls]
    queued = sum(int(s.get("queued") or 0) for s in stalls)
    waited = max(float(s.get("max_queue_s") or 0) for s in stalls)
    facts = (f"{len(stalls)} thread-group {'stall' if len(stalls) == 1 else 'stalls'} of {_range(durations)} held "
             f"{queued} statements {up_to(waited)}")
    limit = values.get("thread_pool_stall_limit")
    shown = (summary.get("groups") or {}).get("stall_limit") or {}
    if not isinstance(limit, (int, float)) and shown.get("stall_limit_at_most_s"):
        # unknown, but the capture shows groups relieved while their long statement still ran: the timer fired
        limit = round(float(shown["stall_limit_at_most_s"]) * 1000)
        current = (f"(not known: the capture shows groups relieved ≈ {limit} ms after their long statement began, so "
                   f"it is at most that, likely the default 500 ms; `{SQL_THREAD_POOL}` tells)")
    else:
        current = f"from {_ms(limit)}{where}" if isinstance(limit, (int, float)) else ""
    if not isinstance(limit, (int, float)):
        return {"finding": "stall_limit", "sql": SQL_THREAD_POOL,
                "text": f"{facts}; thread_pool_stall_limit is unknown (default 500 ms): a group waits that long for "
                        "its stall timer before another worker takes its queue. Fetch it:"}
    limit_s = float(limit) / 1000
    # stalls far shorter than the timer ended when their long statement did: the timer never fired, and a lower
    # one would have let another worker take the queue sooner all the same
    before_timer = max(durations) < 0.5 * limit_s
    usual = usual_execution(stalls)
    if usual is None or 20 * usual > min(durations) or (summary.get("pool") or {}).get("cap"):
        return None  # the queued statements are long themselves, or threads ran out: not the stall timer's doing
    target = max(MIN_STALL_LIMIT_MS, int(math.ceil(10 * usual * 1000 / 10) * 10))
    target = min(target, max(MIN_STALL_LIMIT_MS, int(min(durations) * 1000 / 5) // 10 * 10))
    if target >= float(limit):
        return None
    return {"finding": "stall_limit", "sql": f"SET GLOBAL thread_pool_stall_limit = {target};",
            "text": f"Lower thread_pool_stall_limit {current} to about {target} ms: {facts}. A "
                    "stalled group's queue waits for the stall timer before another worker takes it, and the "
                    f"statements that queued take {seconds_rounded(usual)} inside the server when they do not "
                    f"queue (median): a limit of {target} ms stays far above that and far below the stalls."
                    + (f" The stalls ended when their long statement finished, long before the {_ms(limit)} timer "
                       "fired." if before_timer else "")}


def _usual_execution(x: pd.DataFrame, stalls: list[dict]) -> float | None:
    """What the statements that queued in the stalls take when they do not queue: the median server time (D4 − D1)
    of their classes' calls outside every stall, which is execution plus the server's own overhead; None when
    their classes ran only inside stalls. Not their exec_s: for a victim that is often a bound (below
    long_query_time), not a time."""
    if not has_usual_columns(x):
        return None
    ids = [s.get("id") for s in stalls]
    classes = usual_classes(x, ids)
    if not classes:
        return None
    v = usual_values(x, ids, classes)
    return float(np.median(v)) if len(v) else None


def has_usual_columns(x: pd.DataFrame) -> bool:
    return all(c in x.columns for c in ("stall", "stall_role", "fingerprint"))


def usual_classes(x: pd.DataFrame, ids: list) -> set:
    """The fingerprints of the rows of `x` (the table or a chunk) that queued in the stalls `ids`."""
    in_stall = x["stall"].isin(ids).to_numpy(dtype=bool)
    victims = in_stall & (x["stall_role"].astype(object) != "culprit").to_numpy(dtype=bool)
    return set(x["fingerprint"].astype(object)[victims].dropna().tolist())


def usual_values(x: pd.DataFrame, ids: list, classes: set) -> np.ndarray:
    """The known server times of the rows of `x` (the table or a chunk) of `classes` outside every stall."""
    in_stall = x["stall"].isin(ids).to_numpy(dtype=bool)
    outside = x["fingerprint"].astype(object).isin(classes).to_numpy(dtype=bool) & ~in_stall & ~x[
        "stall"].notna().to_numpy(dtype=bool)
    v = x["server_s"].to_numpy(dtype="float64", na_value=np.nan)[outside]
    return v[~np.isnan(v)]


def _oversubscribe(summary: dict, values: dict, where: str) -> dict | None:
    stalls = _stalls(summary)
    over = values.get("thread_pool_oversubscribe")
    if not stalls or not isinstance(over, (int, float)):
        return None
    most = max(int(s.get("culprits_total") or 0) for s in stalls)
    if most == 0 or most >= 1 + over:
        return None
    return {"finding": "oversubscribe", "sql": None,
            "text": f"Leave thread_pool_oversubscribe at {int(over)}{where}: each stall had at most {most} long "
                    f"{'statement' if most == 1 else 'statements'} executing, fewer than the {int(over) + 1} threads a "
                    "group may run (1 + oversubscribe), so a higher value would not have freed the queue sooner."}


def _max_threads(summary: dict, values: dict, where: str) -> dict | None:
    cap = (summary.get("pool") or {}).get("cap")
    if not cap:
        return None
    facts = (f"exactly {cap['threads']} statements executed at once for {seconds_rounded(cap['duration_s'])} while "
             f"{cap.get('waiting', '?')} waited {up_to(cap.get('max_wait_s'))} for a thread")
    limit = values.get("thread_pool_max_threads")
    if not isinstance(limit, (int, float)):
        return {"finding": "max_threads", "sql": SQL_THREAD_POOL,
                "text": f"The pool hit a thread limit of {cap['threads']} (measured on the wire): {facts}. Compare "
                        "with thread_pool_max_threads:"}
    if int(limit) != int(cap["threads"]):
        return {"finding": "max_threads", "sql": SQL_THREAD_POOL,
                "text": f"The pool stopped at {cap['threads']} threads (measured: {facts}), but "
                        f"thread_pool_max_threads is {int(limit)}{where}: another limit held it (max_connections, "
                        "the OS thread limit, or the settings changed since):"}
    wanted = int(cap["threads"]) + int(cap.get("waiting") or 0)
    return {"finding": "max_threads", "sql": f"SET GLOBAL thread_pool_max_threads = {max(wanted * 2, wanted + 8)};",
            "text": f"Raise thread_pool_max_threads from {int(limit)}{where}: {facts} (at least {wanted} were "
                    "wanted at once)."}


def _proxy_pool(summary: dict, x: pd.DataFrame, proxy: dict, where: str) -> dict | None:
    findings = (summary.get("story") or {}).get("findings") or []
    if "proxy_queue" not in findings or x is None or "proxy_wait_s" not in x.columns:
        return None
    waits = x["proxy_wait_s"].to_numpy(dtype="float64", na_value=np.nan)
    long = waits[waits >= 0.1]
    if not len(long):
        return None
    facts = (f"{len(long)} statements waited 100 ms or more inside the proxy before it sent them on ("
             f"{up_to(float(long.max()))}, {seconds_rounded(float(np.nansum(waits)))} in all)")
    size = proxy.get("pool_size")
    if isinstance(size, int):
        return {"finding": "proxy_pool", "sql": None,
                "text": f"Raise the proxy's server-connection pool from {size}{where}: {facts}, while the DB "
                        "queued none of them."}
    return {"finding": "proxy_pool", "sql": None,
            "text": f"Check the proxy's server-connection pool size (unknown here): {facts}, while the DB queued "
                    "none of them."}


def _thread_cache(summary: dict, values: dict, where: str) -> dict | None:
    conns = summary.get("connections") or {}
    if not churning(conns):
        return None
    rate = conns["new_per_s"]
    facts = (f"{conns['new']} new connections in {seconds_rounded(conns['span_s'])} ({rate:.0f}/s) for "
             f"{conns['statements']} statements ({conns['statements_per_s']:.0f}/s), set-up (SYN → login OK) median "
             f"{seconds_rounded(conns['setup_median_s'])}, max {seconds_rounded(conns['setup_max_s'])}, "
             f"{seconds_rounded(conns['setup_sum_s'])} in all")
    cache = values.get("thread_cache_size")
    handling = str(values.get("thread_handling") or "")
    if not isinstance(cache, (int, float)):
        return {"finding": "thread_cache", "sql": SQL_CONNECTIONS,
                "text": f"{facts}: with a small thread_cache_size each costs a thread creation; pool the app's "
                        "connections. Fetch the settings:"}
    peak = int(conns.get("open_max") or 0)
    if cache >= max(peak, 1) and handling != "one-thread-per-connection":
        return {"finding": "thread_cache", "sql": None,
                "text": f"Pool the app's connections: {facts} (thread_cache_size = {int(cache)}{where} already "
                        "covers them)."}
    return {"finding": "thread_cache", "sql": f"SET GLOBAL thread_cache_size = {max(peak * 2, 16)};",
            "text": f"Raise thread_cache_size from {int(cache)}{where} to at least {max(peak * 2, 16)} (twice the "
                    f"{peak} connections open at once), and pool the app's connections: {facts}."}


def _wait_timeout(summary: dict, values: dict, where: str) -> dict | None:
    idle = (summary.get("connections") or {}).get("idle_closes") or {}
    if not idle.get("steady"):
        return None
    facts = (f"the server closed {idle['count']} idle connections the client still held after "
             f"{_range([idle['idle_min_s'], idle['idle_max_s']])} idle, so their next statement fails (\"server has "
             "gone away\")")
    timeout = values.get("wait_timeout")
    if not isinstance(timeout, (int, float)):
        return {"finding": "wait_timeout", "sql": "SHOW GLOBAL VARIABLES LIKE 'wait_timeout';",
                "text": f"{facts}: that is wait_timeout; make the app's pool retire connections sooner (max idle "
                        "time below it, or validate before use), or raise wait_timeout. Fetch it:"}
    return {"finding": "wait_timeout", "sql": None,
            "text": f"wait_timeout = {_number(timeout)} s{where}: {facts}. Set the app's pool to retire "
                    f"connections idle for less than {_number(timeout)} s (or validate them before use), or raise "
                    "wait_timeout above the pool's idle time."}


def _max_connections(summary: dict, values: dict, where: str) -> dict | None:
    """Refusals (ERR 1040) against max_connections and the most connections open at once."""
    conns = summary.get("connections") or {}
    refused = int(conns.get("refused") or 0)
    if not refused:
        return None
    peak = int(conns.get("open_max") or 0)
    facts = (f"{refused} connection {'attempt was' if refused == 1 else 'attempts were'} refused with ERR 1040 "
             f"(Too many connections) at a peak of {peak} {'connection' if peak == 1 else 'connections'} open at once (the refused attempts included)")
    limit = values.get("max_connections")
    if not isinstance(limit, (int, float)):
        return {"finding": "max_connections", "sql": "SHOW GLOBAL VARIABLES LIKE 'max_connections';",
                "text": f"{facts}: max_connections was reached; raise it above what the app's pools open, or cap "
                        "the pools below it. Fetch it:"}
    target = max(2 * peak, int(limit) + refused)
    return {"finding": "max_connections", "sql": f"SET GLOBAL max_connections = {target};",
            "text": f"Raise max_connections from {int(limit)}{where} to at least {target} (twice the {peak} open at "
                    f"once, or the limit plus the {refused} refused), or cap the app's pools below it: {facts}."}


def _network(summary: dict) -> dict | None:
    """Not a setting: when network leads the verdict, the path to look at, with its numbers per exchange."""
    if "network" not in ((summary.get("story") or {}).get("findings") or []):
        return None
    hosts = (summary.get("network") or {}).get("hosts") or []
    if not hosts or not hosts[0].get("exchanges"):
        return None
    top, rest = hosts[0], hosts[1:]
    others = sum(h["exchanges"] for h in rest)
    versus = (f", against {seconds_rounded(sum(h['network_s'] for h in rest) / others)} from the other "
              f"{'host' if len(rest) == 1 else 'hosts'}" if others else "")
    return {"finding": "network", "sql": None,
            "text": f"Not a MySQL setting: look at the network path between {top['host']} and the DB host "
                    f"({seconds_rounded(top['network_s'])} of network over its {top['exchanges']} exchanges, "
                    f"{seconds_rounded(top['network_s'] / top['exchanges'])} each{versus}): a slow link, a "
                    "congested or shaping hop, a proxy or load balancer between the capture points."}


def _ms(value) -> str:
    return f"{_number(value)} ms"


def _number(value) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
