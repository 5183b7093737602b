"""Record one lab scenario into a capture-set folder.

    python3 captures/lab/record.py SCENARIO [--out DIR] [--duration S] [--seed N]

Builds two test hosts (network namespaces), starts a private MariaDB in `db`, captures both ends with
tcpdump, drives the workload from `app`, and writes app.pcap, db.pcap, slow.log, truth.jsonl, capture.toml
and README.md. Needs root. Everything it starts is stopped again, also on error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parent
if str(LAB_DIR) not in sys.path:
    sys.path.insert(0, str(LAB_DIR))

from hosts import (APP_IPV4, DB2_IPV4, DB_IPV4, DB_IPV6, MYSQL_PORT, Child, LabError, PrivateMariaDB,  # noqa: E402
                   TestHosts, Tcpdump, check_can_run, ensure_deps, log)
from scenarios import SCENARIOS, SERIES, Scenario  # noqa: E402
from proxies import (PROXY_APP_IPV4, PROXY_DB_IPV4, PROXY_FRONT_IPV4, DelayRelay, Gaea, HAProxy,  # noqa: E402
                     ProxyHosts)

REPO_CAPTURES = LAB_DIR.parent
TLS_KEYLOG_NAME = "tls-keys.log"  # a capture set's client key log (NSS format); analyze picks it up by this name
TRUTH_KEYS = ("conn_id", "thread_group", "conn_label", "driver", "command", "sql", "role", "note",
              "client_send_ns", "client_recv_ns", "client_s", "exec_s", "ps_event", "ps_statements",
              "ps_timer_start_ps", "ps_timer_end_ps", "rows", "error")


OPTIONAL_TRUTH_KEYS = ("client_port",)  # added later: older committed sets do not have them
PS_SQL_TEXT_LENGTH = 1024  # performance_schema_max_sql_text_length's default


class _Terminated(KeyboardInterrupt):
    """SIGTERM/SIGHUP turned into an interrupt so every `finally` and context exit runs (callers that handle
    KeyboardInterrupt, like the pcapdecomp CLI, handle it too)."""


@contextlib.contextmanager
def _signals_unwind():
    def handler(signum, _frame):
        raise _Terminated(f"signal {signum}")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _calibrate_hog_rounds(server: PrivateMariaDB, seconds: float) -> int:
    """BENCHMARK rounds that keep one core busy for `seconds` on this (shared) machine."""
    rounds = 200_000
    with server.admin() as conn, conn.cursor() as cur:
        for _ in range(3):
            start = time.perf_counter()
            cur.execute(f"SELECT BENCHMARK({rounds}, SHA2(RAND(), 256))")
            elapsed = time.perf_counter() - start
            if elapsed > 0.2:
                break
            rounds *= 4
    return max(1000, int(rounds * seconds / elapsed))


def _await_file(path: Path, child: Child, timeout_s: float) -> None:
    """Wait until the workload creates `path` (it has connected), or fail if it exits or takes too long."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if child.proc.poll() is not None:
            raise LabError(f"the workload exited ({child.proc.returncode}) before it had connected")
        if time.monotonic() > deadline:
            raise LabError(f"the workload did not connect within {timeout_s:.0f} s")
        time.sleep(0.05)


def _statement_history(server: PrivateMariaDB) -> dict[int, list[dict]]:
    """Top-level statements per performance_schema THREAD_ID, in order."""
    with server.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT THREAD_ID, EVENT_ID, EVENT_NAME, SQL_TEXT, TIMER_START, TIMER_END, TIMER_WAIT "
                    "FROM performance_schema.events_statements_history_long "
                    "WHERE NESTING_EVENT_ID IS NULL ORDER BY THREAD_ID, EVENT_ID")
        history: dict[int, list[dict]] = {}
        for thread_id, event_id, name, text, start, end, wait in cur.fetchall():
            history.setdefault(int(thread_id), []).append(
                {"event_id": int(event_id), "name": name, "sql": text or "", "start": start, "end": end,
                 "wait": wait})
    return history


def _norm(sql: str) -> str:
    return " ".join(sql.split()).rstrip("; ").lower()


def _matches(row: dict, event: dict) -> bool:
    if row["ps_event"] and event["name"].lower() == row["ps_event"].lower():
        return True
    if not row["sql"] or not event["sql"]:
        return False
    text, wanted = _norm(event["sql"]), _norm(row["sql"])
    if len(event["sql"]) >= PS_SQL_TEXT_LENGTH:  # performance_schema keeps only the start of long statements
        return wanted.startswith(text[: len(text) - 3] if text.endswith("...") else text)
    return text == wanted or (";" in wanted and text in wanted)


def join_truth(client_rows: list[dict], history: dict[int, list[dict]], pool_size: int) -> list[dict]:
    """Attach the server's execution time to each client row: same thread, same order, same text/command.

    Statements the driver sends on its own (none of ours) are skipped; a multi-statement COM_QUERY takes
    all consecutive statements that are part of its text.
    """
    cursor_by_thread: dict[int, int] = {}
    joined = []
    for row in sorted(client_rows, key=lambda r: r["client_seq"]):
        out = {key: row.get(key) for key in (*TRUTH_KEYS[:1], *OPTIONAL_TRUTH_KEYS, *TRUTH_KEYS[1:])}
        out["thread_group"] = row["conn_id"] % pool_size if row["conn_id"] is not None and pool_size else None
        out["exec_s"] = out["ps_timer_start_ps"] = out["ps_timer_end_ps"] = None
        out["ps_statements"] = 0
        events = history.get(row.get("ps_thread_id"), [])
        position = cursor_by_thread.get(row.get("ps_thread_id"), 0)
        if row["role"] != "connect":
            for index in range(position, len(events)):
                if _matches(row, events[index]):
                    taken = [events[index]]
                    while ";" in (row["sql"] or "") and index + len(taken) < len(events) \
                            and _matches(row, events[index + len(taken)]):
                        taken.append(events[index + len(taken)])
                    out["exec_s"] = sum(e["wait"] for e in taken) / 1e12  # picoseconds
                    out["ps_timer_start_ps"], out["ps_timer_end_ps"] = taken[0]["start"], taken[-1]["end"]
                    out["ps_event"] = taken[0]["name"]
                    out["ps_statements"] = len(taken)
                    cursor_by_thread[row["ps_thread_id"]] = index + len(taken)
                    break
        joined.append(out)
    joined.sort(key=lambda r: (r["client_send_ns"], r["conn_id"] or 0))
    return joined


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a valid TOML basic string


def _pool_settings(s) -> list[str]:
    return [f"thread_pool_size = {s.thread_pool_size}",
            f"thread_pool_max_threads = {s.thread_pool_max_threads}",
            f"thread_pool_stall_limit = {s.thread_pool_stall_limit_ms}",
            f"thread_pool_oversubscribe = {s.thread_pool_oversubscribe}"]


FIELD_HIDDEN_PARAMS = ("pool_size", "hogs")  # the workload's group arithmetic: they name thread_pool_size


def _write_lab_settings(path: Path, scenario: Scenario, params: dict) -> None:
    """What the lab's server ran with, for a field set whose capture.toml leaves the pool's settings out: the tests
    check pcapdecomp's inferences against it; pcapdecomp itself never reads this file."""
    s = scenario.settings
    path.write_text("\n".join([
        "# Written by captures/lab/record.py: the server's settings during this field recording. pcapdecomp does not",
        "# read this file (capture.toml leaves them out, as the field has them not at hand); tests compare with it.",
        "[server]",
        f"thread_handling = {_toml_value(s.thread_handling)}",
        *_pool_settings(s),
        f"long_query_time = {_toml_value(s.long_query_time_s)}",
        "",
        "[workload]  # the parameters capture.toml's [workload] leaves out",
        *[f"{key} = {json.dumps(params[key])}" for key in FIELD_HIDDEN_PARAMS if key in params],
    ]) + "\n")


PROCESSLIST_SQL = ("SELECT ID, USER, HOST, DB, COMMAND, TIME, STATE, INFO FROM information_schema.PROCESSLIST")


def _processlist_snapshot(server: PrivateMariaDB) -> str:
    """What `mysql -B -e "SELECT … FROM information_schema.PROCESSLIST"` prints (tab-separated, a header line), run
    by the mysql client itself over the server's unix socket, so its own connection stays off the captures."""
    import subprocess

    done = subprocess.run(server.host.command("mysql", "--no-defaults", f"--socket={server.socket}", "--user=root",
                                              "-B", "-e", PROCESSLIST_SQL),
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise LabError(f"the processlist snapshot failed: {done.stderr.strip()}")
    return done.stdout


def _write_capture_toml(path: Path, scenario: Scenario, server: PrivateMariaDB, params: dict, stats: dict,
                        proxy=None, folders: bool = False, rotate_mb: int = 0) -> None:
    s = scenario.settings
    lines = [
        "# Written by captures/lab/record.py; describes how this capture set was recorded.",
        f"scenario = {_toml_value(scenario.name)}",
        f"description = {_toml_value(scenario.description)}",
        f"recorded_at = {_toml_value(datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'))}",
        "",
        "[server]",
        f"address = {_toml_value(f'{PROXY_DB_IPV4 if proxy else DB_IPV4}:{MYSQL_PORT}')}",
        *([] if proxy else [f"address_ipv6 = {_toml_value(f'[{DB_IPV6}]:{MYSQL_PORT}')}"]),
        *([f"more_addresses = [{_toml_value(f'{DB2_IPV4}:{MYSQL_PORT}')}]  # the replica (db-replica/)"]
          if "db2" in stats else []),
        f"product = {_toml_value('MariaDB')}",
        f"version = {_toml_value(server.version)}",
        f"long_query_time = {_toml_value(s.long_query_time_s)}",
        f"thread_handling = {_toml_value(s.thread_handling)}",
        # without the pool there are no thread groups: no thread_pool_* settings (analyze would group by them)
        # a field set has no settings at hand either: they go to lab-settings.toml (_write_lab_settings)
        *(_pool_settings(s) if s.thread_handling == "pool-of-threads" and not scenario.field else []),
        f"max_allowed_packet = {s.max_allowed_packet}",
        *([f"thread_cache_size = {s.thread_cache_size}"] if s.thread_cache_size is not None else []),
        *([f"wait_timeout = {s.wait_timeout_s}"] if s.wait_timeout_s is not None else []),
        f"max_connections = {s.max_connections}",
        f"tls = {_toml_value(s.tls)}",
        "",
        *([] if not proxy else [
            "[proxy]", f"address = {_toml_value(f'{PROXY_FRONT_IPV4}:{MYSQL_PORT}')}",
            f"product = {_toml_value(proxy.name)}", f"version = {_toml_value(proxy.version)}",
            f"kind = {_toml_value('l7' if scenario.proxy == 'gaea' else 'l4')}",
            *([f"pool_size = {scenario.proxy_pool}"] if scenario.proxy_pool else []), ""]),
        "[app]",
        f"address = {_toml_value(PROXY_APP_IPV4 if proxy else APP_IPV4)}",
        "",
        "[captures]",
        *(['app = "app.pcap"', 'db = "db.pcap"', *(['proxy = "proxy.pcap"'] if "proxy" in stats else []),
           'slow_log = "slow.log"'] if not folders else
          ['# one folder per capture point: app/, db/ (the primary) and db-replica/, each with its rotated files',
           '# (and a DB point its slow.log)', f"rotate_mb = {rotate_mb}"]),
        'truth = "truth.jsonl"',
        "timestamp_precision = \"ns\"",
        *[f"{name}_packets = {st.captured}" for name, st in stats.items()],
        f"dropped_by_kernel = {sum(st.dropped_by_kernel for st in stats.values())}",
        "",
        "[workload]",
    ]
    lines += [f"{key} = {_toml_value(value) if not isinstance(value, list) else json.dumps(value)}"
              for key, value in sorted(params.items())]
    path.write_text("\n".join(lines) + "\n")


def join_truth_by_tag(client_rows: list[dict], history: dict[int, list[dict]], processlist: dict[int, int],
                      pool_size: int) -> list[dict]:
    """Behind a pooling proxy a client connection has no server thread of its own: each tagged statement
    (`SELECT <tag> AS tag, ...`, unique in the run) is found in the server's history by its tag, whichever pooled
    connection ran it; `db_conn_id` names that connection. Untagged statements (SELECT 1 from many clients) have
    no unambiguous server row: their exec_s stays null."""
    import re

    by_tag: dict[int, tuple[int, dict]] = {}
    for thread_id, events in history.items():
        for event in events:
            m = re.match(r"\s*select\s+(\d+)\s+as\s+`?tag\b", event["sql"], re.IGNORECASE)
            if m:
                by_tag[int(m.group(1))] = (thread_id, event)
    joined = []
    for row in sorted(client_rows, key=lambda r: r["client_seq"]):
        out = {key: row.get(key) for key in TRUTH_KEYS}
        out["exec_s"] = out["ps_timer_start_ps"] = out["ps_timer_end_ps"] = None
        out["ps_statements"], out["db_conn_id"], out["db_sql"] = 0, None, None
        m = re.match(r"tag=(\d+)", row.get("note") or "")
        if m and int(m.group(1)) in by_tag:
            thread_id, event = by_tag[int(m.group(1))]
            out["exec_s"] = event["wait"] / 1e12
            out["ps_timer_start_ps"], out["ps_timer_end_ps"] = event["start"], event["end"]
            out["ps_event"], out["ps_statements"], out["db_sql"] = event["name"], 1, event["sql"]
            out["db_conn_id"] = processlist.get(thread_id)
        out["thread_group"] = out["db_conn_id"] % pool_size if out["db_conn_id"] is not None else None
        out["proxy_and_network_s"] = (out["client_s"] - out["exec_s"]) if out["exec_s"] is not None else None
        joined.append(out)
    joined.sort(key=lambda r: (r["client_send_ns"], r["conn_label"] or ""))
    return joined


def _processlist_ids(server: PrivateMariaDB) -> dict[int, int]:
    with server.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT THREAD_ID, PROCESSLIST_ID FROM performance_schema.threads WHERE PROCESSLIST_ID IS NOT NULL")
        return {int(t): int(p) for t, p in cur.fetchall()}


def record(scenario: str, out_dir: Path | str | None = None, duration_s: float | None = None, seed: int = 1,
           install: bool = True, rotate_mb: int | None = None, rate: int | None = None) -> Path:
    """Record `scenario` into `out_dir` (default captures/<scenario>/) and return that folder. `rotate_mb` makes
    every tcpdump rotate its file each that many million bytes (default: the scenario's); rotated captures are
    written as one folder per capture point (app/, db/, db-replica/). A series (SERIES) records each of its
    scenarios, with the same workload and seed, into `out_dir`/<scenario> (default captures/<scenario>) and
    returns the folder that holds them. `rate`: the sysbench scenarios' transactions a second at most (sysbench
    --rate; None: full speed)."""
    if scenario in SERIES:
        parent = Path(out_dir) if out_dir else REPO_CAPTURES
        for name in SERIES[scenario]:
            record(name, parent / name, duration_s, seed, install, rotate_mb, rate)
        return parent
    if scenario not in SCENARIOS:
        raise LabError(f"unknown scenario {scenario!r}; choose one of {', '.join([*SCENARIOS, *SERIES])}")
    spec = SCENARIOS[scenario]
    check_can_run()
    if install:
        ensure_deps()
    out = Path(out_dir) if out_dir else REPO_CAPTURES / scenario
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="pcd-lab-"))
    workdir.chmod(0o755)
    params = dict(spec.params, seed=seed)
    if duration_s is not None:
        params["duration"] = duration_s
    if rate is not None:
        params["rate"] = rate
    rotate = spec.rotate_mb if rotate_mb is None else rotate_mb
    second = spec.second_server
    folders = bool(rotate) or second
    if second:
        params["host2"] = DB2_IPV4
    try:
        with _signals_unwind(), contextlib.ExitStack() as stack:
            proxy = None
            if spec.proxy:
                hosts = stack.enter_context(ProxyHosts())
                server = stack.enter_context(PrivateMariaDB(hosts.db, hosts.proxy_back, workdir / "db", spec.settings))
            else:
                hosts = stack.enter_context(TestHosts(second_db=second))
                server = stack.enter_context(PrivateMariaDB(hosts.db, hosts.app, workdir / "db", spec.settings))
            servers = {"db": server}
            if second:
                servers["db2"] = stack.enter_context(PrivateMariaDB(hosts.db2, hosts.app2, workdir / "db2",
                                                                    spec.settings))
            for each in servers.values():
                if spec.setup_sql:
                    with each.admin() as conn, conn.cursor() as cur:
                        for sql in spec.setup_sql:
                            cur.execute(sql)
            if spec.hog_seconds:
                params["hog_rounds"] = _calibrate_hog_rounds(server, spec.hog_seconds)
                log(f"BENCHMARK rounds for ~{spec.hog_seconds} s: {params['hog_rounds']}")
            if spec.proxy == "haproxy":
                proxy = stack.enter_context(HAProxy(hosts, workdir / "proxy"))
            elif spec.proxy == "gaea":
                proxy = stack.enter_context(Gaea(hosts, workdir / "proxy", spec.proxy_pool, "app", "app-pass"))
            elif spec.proxy == "relay":
                proxy = stack.enter_context(DelayRelay(hosts, workdir / "proxy", params["relay_delay_ms"]))
            for each in servers.values():
                each.start_recording()
            dumps: dict[str, Tcpdump] = {}
            immediate = not spec.block_capture

            def start_captures() -> None:
                # with two links the app host is captured on both at once (-i any): one capture point
                dumps["app"] = stack.enter_context(Tcpdump(hosts.app, workdir / "app.pcap", rotate_mb=rotate,
                                                           interface="any" if second else None, immediate=immediate))
                dumps["db"] = stack.enter_context(Tcpdump(hosts.db, workdir / "db.pcap", rotate_mb=rotate,
                                                          immediate=immediate))
                if second:
                    dumps["db2"] = stack.enter_context(Tcpdump(hosts.db2, workdir / "db2.pcap", rotate_mb=rotate))
                if proxy is not None and spec.proxy != "relay":  # the relay's hold is network between the points
                    dumps["proxy"] = stack.enter_context(Tcpdump(hosts.proxy_front, workdir / "proxy.pcap",
                                                                 rotate_mb=rotate, interface="any"))

            if spec.midstream:  # the workload connects, then waits for the captures: they begin mid-connection
                params["sync_dir"] = str(workdir)
            else:
                start_captures()
            client_file = workdir / "client.jsonl"
            if params.get("tls"):  # the clients' TLS session secrets, as --tls-keylog reads them
                params["keylog"] = str(workdir / TLS_KEYLOG_NAME)
            log(f"running workload {scenario} {json.dumps(params)}")
            target = PROXY_FRONT_IPV4 if proxy is not None else DB_IPV4
            argv = hosts.app.command(sys.executable, str(LAB_DIR / "workload.py"), scenario, "--host", target,
                                     "--host6", DB_IPV6, "--port", str(MYSQL_PORT), "--out", str(client_file),
                                     "--params", json.dumps(params))
            with Child(argv) as child:
                if spec.midstream:
                    _await_file(workdir / "connected", child, 60)
                    start_captures()
                    (workdir / "go").touch()
                if spec.processlist_at_s:
                    time.sleep(spec.processlist_at_s)
                    processlist = _processlist_snapshot(server)
                code = child.wait(120 + 3 * float(params.get("duration", 0)))
            if code != 0:
                raise LabError(f"the {scenario} workload failed (exit {code}); see its output above")
            for name in dumps:
                dumps[name].__exit__(None, None, None)  # drain and stop now, to read the packet counts
                stats = dumps[name].stats
                if stats is None or stats.captured == 0:
                    raise LabError(f"tcpdump on {name} captured nothing")
                if stats.dropped_by_kernel:
                    log(f"warning: tcpdump on {name} says {stats.dropped_by_kernel} packets dropped by kernel")
            for each in servers.values():
                each.stop_recording()
            client_rows = [json.loads(line) for line in client_file.read_text().splitlines()]
            pooled = spec.settings.thread_handling == "pool-of-threads"
            pool_size = spec.settings.thread_pool_size if pooled else None
            if second:  # each server's rows joined to its own statement history
                truth = []
                for name, each in servers.items():
                    mine = [r for r in client_rows if r["conn_label"].startswith("replica") == (name == "db2")]
                    truth += [dict(row, server=name) for row in join_truth(mine, _statement_history(each), pool_size)]
                truth.sort(key=lambda r: (r["client_send_ns"], r["conn_id"] or 0))
            elif spec.proxy == "gaea":
                truth = join_truth_by_tag(client_rows, _statement_history(server), _processlist_ids(server), pool_size)
            else:
                truth = join_truth(client_rows, _statement_history(server), pool_size)
            if folders:  # one folder per capture point, each with its rotated files (and a DB point its slow log)
                for name, folder in (("app", "app"), ("db", "db"), ("db2", "db-replica"), ("proxy", "proxy")):
                    if name not in dumps:
                        continue
                    (out / folder).mkdir(exist_ok=True)
                    for f in dumps[name].files:
                        shutil.copyfile(f, out / folder / f.name)
                    if name in servers:
                        shutil.copyfile(servers[name].slow_log, out / folder / "slow.log")
            else:
                for name in [f"{n}.pcap" for n in dumps]:
                    shutil.copyfile(workdir / name, out / name)
                shutil.copyfile(server.slow_log, out / "slow.log")
            if spec.processlist_at_s:
                (out / "processlist.tsv").write_text(processlist)
            if spec.field:
                _write_lab_settings(out / "lab-settings.toml", spec, params)
            if params.get("keylog"):
                shutil.copyfile(params["keylog"], out / TLS_KEYLOG_NAME)
            with open(out / "truth.jsonl", "w") as f:
                for row in truth:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
            # a field set's workload section must not give the pool size away either (lab-settings.toml has it)
            hidden = ("sync_dir", *(FIELD_HIDDEN_PARAMS if spec.field else ()))
            _write_capture_toml(out / "capture.toml", spec, server,
                                {k: v for k, v in params.items() if k not in (*hidden, "keylog")}, {n: d.stats for n, d in dumps.items()},
                                proxy, folders, rotate)
            (out / "README.md").write_text(
                f"# Capture set `{scenario}`\n\n{spec.description}\n\nRecorded by `captures/lab/record.py "
                f"{scenario}` on MariaDB {server.version}; settings in `capture.toml`, per-query ground truth "
                "in `truth.jsonl` (see captures/lab/README.md).\n")
            log(f"{len(truth)} client commands, "
                + " / ".join(f"{n} {d.stats.captured}" for n, d in dumps.items())
                + f" packets{f' in {sum(len(d.files) for d in dumps.values())} files' if rotate else ''} -> {out}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record a MariaDB thread-pool scenario on two test hosts.")
    parser.add_argument("scenario", choices=sorted([*SCENARIOS, *SERIES]))
    parser.add_argument("--out", type=Path, help="capture-set folder (default: captures/<scenario>/)")
    parser.add_argument("--duration", type=float, help="workload seconds, for scenarios that run for a while")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-install", action="store_true", help="do not apt-get/pip install missing tools")
    parser.add_argument("--rotate-mb", type=int, help="tcpdump rotates its files every N million bytes (-C N)")
    parser.add_argument("--rate", type=int, metavar="TPS",
                        help="sysbench scenarios: at most TPS transactions a second (sysbench --rate), for a "
                             "workload of a given rate (their tcpdumps keep up at full speed: they capture in blocks, "
                             "scenarios.block_capture)")
    args = parser.parse_args(argv)
    if args.rate is not None and (args.rate <= 0 or not args.scenario.startswith("sysbench")):
        parser.error("--rate takes a positive number, for the sysbench scenarios")
    try:
        record(args.scenario, args.out, args.duration, args.seed, install=not args.no_install,
               rotate_mb=args.rotate_mb, rate=args.rate)
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (KeyboardInterrupt, _Terminated):
        print("interrupted; test hosts and server were cleaned up", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
