"""`pcapdecomp guide`: the capture plan for one server — the tcpdump command on every host, the SQL to run before
and after, the slow log for the window, a TLS key log, the disk it takes, and the `analyze` command that reads it.

The plan's text lives here and only here (docs/capture-guide.md shows a run of it, checked by tests/test_docs.py).
Its file names are the ones a capture-set folder uses (read/captureset.py): `app-<host>/` and `db/` subfolders for each
point's rotated files, `slow.log`, `capture.toml`; the SQL snapshots go to `variables.tsv` and `processlist.tsv`
beside them, as `mysql -B` writes them (tab-separated, a header line).
"""

from __future__ import annotations

import ipaddress
import math
import shlex

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from dataclasses import dataclass, field
from pathlib import Path

from .core.errors import OutputError, UsageError
from .read.sources import parse_server
from .read.tlskeys import KEYLOG_NAME

PCAP_RECORD_HEADER_BYTES = 16  # each packet's record header in a pcap file, on top of the packet itself
# The variables the analysis (or a later version) reads from variables.tsv, and those that decide whether the slow
# log holds every statement of the window.
VARIABLES = ("long_query_time", "slow_query_log", "slow_query_log_file", "log_output", "log_slow_extra",
             "log_slow_verbosity", "log_slow_rate_limit", "log_slow_filter", "min_examined_row_limit",
             "log_slow_admin_statements",
             "thread_handling", "max_connections", "thread_cache_size", "wait_timeout", "version",
             "version_comment", "datadir")
# log_output with FILE added when it leaves the file out (NONE wins over any other value, so it is replaced);
# prints nothing when FILE is there already.
LOG_OUTPUT_WITH_FILE_AWK = '$1 == "log_output" && $2 !~ /FILE/ { print ($2 == "NONE" ? "FILE" : $2 ",FILE") }'
PROCESSLIST_SQL = "SELECT ID, USER, HOST, DB, COMMAND, TIME, STATE, INFO FROM information_schema.PROCESSLIST"
# The slow log's path: MariaDB and MySQL give a relative slow_query_log_file relative to the data directory.
SLOW_LOG_PATH_SQL = ("SELECT IF(@@global.slow_query_log_file LIKE '/%', @@global.slow_query_log_file, "
                     "CONCAT(@@global.datadir, @@global.slow_query_log_file))")


@dataclass(frozen=True)
class GuideOptions:
    server: str  # HOST:PORT as given
    app_hosts: list[str] = field(default_factory=list)
    duration_s: int = 600
    out: Path = Path("pcapdecomp-capture")
    rotate_mb: int = 100
    packet_rate: float = 5000.0  # packets per second through the server's port, for the disk estimate
    packet_bytes: int = 200  # mean packet size on the wire, for the disk estimate
    interface: str = "any"
    mysql: str = "mysql"  # how to run the mysql client as an admin on the DB host
    buffer_mib: int = 128
    long_query_time: float | None = None  # the server's own value, when the user knows it
    thread_pool_size: int | None = None


@dataclass(frozen=True)
class Disk:
    per_point_bytes: int  # at the given packet rate, for the whole duration, on the DB host
    files_per_point: int  # tcpdump -W: the ring holds at most this many files of rotate_mb
    cap_bytes: int  # what the ring can ever take on one host


def disk(opts: GuideOptions) -> Disk:
    """The DB host sees every packet of the server's port; an app host at most as many. tcpdump -C counts millions
    of bytes; the ring (-W) gets room for twice the estimate so a busier hour than expected still fits whole."""
    per_point = int(opts.packet_rate * opts.duration_s * (opts.packet_bytes + PCAP_RECORD_HEADER_BYTES))
    rotate = opts.rotate_mb * 1_000_000
    files = max(2, math.ceil(2 * per_point / rotate) + 1)
    return Disk(per_point, files, files * rotate)


def check(opts: GuideOptions) -> tuple[str, int]:
    """The server endpoint, and every option in range; a mistake is one line (UsageError)."""
    host, port = parse_server(opts.server)
    for app_host in opts.app_hosts:
        try:
            ipaddress.ip_address(app_host.strip("[]"))
        except ValueError:
            raise UsageError(f"--app-host must be an IP address (the app host's address as the server sees it), "
                             f"got {app_host!r}") from None
    if opts.duration_s < 1:
        raise UsageError(f"--duration must be at least 1 second, got {opts.duration_s}")
    if opts.rotate_mb < 1:
        raise UsageError(f"--rotate-mb must be at least 1, got {opts.rotate_mb}")
    if not opts.packet_rate > 0 or opts.packet_bytes < 1:
        raise UsageError("--packet-rate and --packet-bytes must be positive")
    if not opts.interface.strip() or any(c.isspace() for c in opts.interface):
        raise UsageError(f"--interface must be one interface name (or any), got {opts.interface!r}")
    return host, port


def _address(opts: GuideOptions) -> str:
    host, port = check(opts)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def capture_toml(opts: GuideOptions) -> str:
    """What the plan's capture set says about itself: the server's address, and only the server values the user
    gave (never a default standing in for a value nobody read). [server] comes last, so that the values the DB
    host reads from the server itself (section 2 of the plan) can follow it."""
    lines = ["# Written by `pcapdecomp guide`: the capture plan of this folder. Server values come from you or from",
             "# the server itself (variables.tsv), never from a default: what is unknown is left out."]
    if opts.app_hosts:
        lines += ["[app]", "addresses = [" + ", ".join(f'"{h}"' for h in opts.app_hosts) + "]", ""]
    lines += ["[server]", f'address = "{_address(opts)}"']
    if opts.long_query_time is not None:
        lines.append(f"long_query_time = {float(opts.long_query_time)!r}")
    if opts.thread_pool_size is not None:
        lines.append(f"thread_pool_size = {int(opts.thread_pool_size)}")
    return "\n".join(lines) + "\n"


def server_values_awk(opts: GuideOptions) -> str:
    """An awk program over variables.tsv that prints the [server] values of capture.toml the server itself holds:
    long_query_time (its own threshold: connections opened before the window keep it), thread_handling, and the
    thread pool's settings only when the pool is in use (MariaDB and Percona have thread_pool_size either way).
    Values the user gave are not printed again."""
    prints = ['if ("thread_handling" in v) print "thread_handling = \\"" v["thread_handling"] "\\""']
    if opts.long_query_time is None:
        prints.insert(0, 'if ("long_query_time" in v) print "long_query_time = " v["long_query_time"] + 0')
    pool = ["thread_pool_max_threads", "thread_pool_stall_limit", "thread_pool_oversubscribe"]
    if opts.thread_pool_size is None:
        pool.insert(0, "thread_pool_size")
    prints.append('if (v["thread_handling"] == "pool-of-threads") { '
                  + " ".join(f'if ("{k}" in v) print "{k} = " v["{k}"] + 0;' for k in pool) + " }")
    return "{ v[$1] = $2 } END { " + "; ".join(prints) + " }"


def write_capture_toml(opts: GuideOptions) -> tuple[Path, bool]:
    """OUT/capture.toml (OUT made when missing), and whether it was written now: one already there for the same
    server is kept (it may hold the values the DB host read since), one for another server is not replaced."""
    text = capture_toml(opts)
    path = opts.out / "capture.toml"
    try:
        opts.out.mkdir(parents=True, exist_ok=True)
        if path.exists():
            try:
                there = tomllib.loads(path.read_text(encoding="utf-8")).get("server", {}).get("address")
            except (tomllib.TOMLDecodeError, UnicodeDecodeError, AttributeError):
                there = None
            if there != _address(opts):
                raise OutputError(f"{path} exists and describes another capture: choose another --out")
            return path, False
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise OutputError(f"{path}: cannot write it: {err.strerror or err}") from None
    return path, True


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 10e6 else f"{n / 1e6:,.1f} MB"


def tcpdump_command(opts: GuideOptions, folder: Path, name: str) -> str:
    """One capture point's tcpdump, stopped by `timeout` after the window (SIGINT: it writes its counts)."""
    host, port = check(opts)
    d = disk(opts)
    target = shlex.quote(str(folder / name))
    return (f"timeout -s INT {opts.duration_s} tcpdump -i {shlex.quote(opts.interface)} -nn -s 0 "
            f"-B {opts.buffer_mib * 1024} --time-stamp-precision=nano -Z root -C {opts.rotate_mb} "
            f"-W {d.files_per_point} -w {target} 'tcp and host {host} and port {port}'")


def _mysql(opts: GuideOptions, sql: str, flags: str = "-B") -> str:
    """The mysql client running `sql`, in double quotes (the SQL holds single quotes and nothing the shell expands
    inside double quotes)."""
    assert not any(c in sql for c in '"$`\\'), sql
    return f"{opts.mysql}{' ' + flags if flags else ''} -e \"{sql}\""


def _if_variable(opts: GuideOptions, name: str, then: str) -> str:
    """`then`, in a shell line that runs it only when the server has the variable `name` (variables.tsv, written
    before the window, lists it), and ends with status 0 either way."""
    test = f"awk -F'\\t' '$1==\"{name}\"{{f=1}} END{{exit !f}}' {shlex.quote(str(opts.out / 'variables.tsv'))}"
    return f"if {test}; then {then}; fi"


def plan(opts: GuideOptions) -> str:
    """The capture plan as text, in the order it is followed."""
    host, port = check(opts)
    out = opts.out
    q = shlex.quote
    d = disk(opts)
    db_dir = out / "db"
    app_dirs = [(h, out / f"app-{h.strip('[]').replace(':', '_')}") for h in opts.app_hosts]
    variables = " OR ".join(["Variable_name LIKE 'thread_pool%'",
                             "Variable_name IN (" + ", ".join(f"'{v}'" for v in VARIABLES) + ")"])
    lines: list[str] = []
    add = lines.append

    def command(text: str) -> None:
        add(f"    {text}")

    add(f"# Capture plan for the MySQL/MariaDB server {opts.server}: {opts.duration_s} s, into {out}/")
    add("")
    add(f"{out / 'capture.toml'} names the server (the DB host adds the server's own settings in section 2). "
        "Run every command as root, in this order.")
    add("")
    add("## 1. Disk")
    add(f"At {opts.packet_rate:,.0f} packets/s of {opts.packet_bytes} bytes, {opts.duration_s} s take about "
        f"{_mb(d.per_point_bytes)} on the DB host, and at most as much on each app host. tcpdump writes files of "
        f"{opts.rotate_mb} MB and keeps the last {d.files_per_point} (-W): never more than {_mb(d.cap_bytes)} per "
        "host, and the whole window unless the traffic is more than twice the estimate.")
    add("Your packet rate: the count this prints, divided by 10 (then run guide again with --packet-rate):")
    command(f"timeout -s INT 10 tcpdump -i {q(opts.interface)} -nn -q -w /dev/null 'tcp and host {host} and "
            f"port {port}'")
    add("")
    add("## 2. On the DB host, before the window")
    add("The server's settings (thread pool, slow log, limits) and where its slow log is:")
    command(f"mkdir -p {q(str(db_dir))}")
    command(f"{_mysql(opts, 'SHOW GLOBAL VARIABLES WHERE ' + variables)} > {q(str(out / 'variables.tsv'))}")
    add("capture.toml with the server's own values (its long_query_time, and the thread pool's settings when it "
        "uses one), for analyze:")
    toml_lines = " ".join(q(line) for line in capture_toml(opts).splitlines() if not line.startswith("#"))
    command(f"{{ printf '%s\\n' {toml_lines}; awk -F'\\t' {q(server_values_awk(opts))} "
            f"{q(str(out / 'variables.tsv'))}; }} > {q(str(out / 'capture.toml'))}")
    command(f"SLOW=$({_mysql(opts, SLOW_LOG_PATH_SQL, '-BN')})")
    command(f"(wc -c < \"$SLOW\" 2>/dev/null || echo 0) > {q(str(out / 'slow.offset'))}")
    add("Every statement into the slow log for the window (Query_time is execution only; the capture gives the rest):")
    command(_mysql(opts, "SET GLOBAL slow_query_log = 1; SET GLOBAL long_query_time = 0", ""))
    add("The slow log into its file too, where log_output (variables.tsv) leaves the file out (TABLE or NONE): "
        "without it slow.log stays empty and analyze cannot tell queueing from execution:")
    command(f"LOG_OUTPUT=$(awk -F'\\t' {q(LOG_OUTPUT_WITH_FILE_AWK)} {q(str(out / 'variables.tsv'))}); "
            f"if [ -n \"$LOG_OUTPUT\" ]; then {opts.mysql} -e \"SET GLOBAL log_output = '$LOG_OUTPUT'\"; fi")
    add("MySQL 8.0.14+ also writes when each statement began executing, to the microsecond, with log_slow_extra "
        "(the line does nothing on a server without it, such as MariaDB):")
    command(_if_variable(opts, "log_slow_extra", _mysql(opts, "SET GLOBAL log_slow_extra = ON", "")))
    add("long_query_time = 0 holds for connections opened from now on; a connection pool opened earlier keeps its "
        "old threshold (capture.toml has it), so its statements reach the slow log only above it. MariaDB: "
        "log_slow_rate_limit must be 1 "
        "and log_slow_filter empty or the default (variables.tsv shows them), or entries are left out.")
    add("")
    add("## 3. Start the captures, at the same time on every host")
    add(f"On the DB host ({host}):")
    command(tcpdump_command(opts, db_dir, "db.pcap"))
    for app_host, folder in app_dirs:
        add(f"On the app host {app_host}:")
        command(f"mkdir -p {q(str(folder))}")
        command(tcpdump_command(opts, folder, "app.pcap"))
    if not app_dirs:
        add("No --app-host given: the DB side alone shows the server's time (queueing and execution), not the "
            "network's; give the app hosts' addresses for the clients' side.")
    add(f"Each stops by itself after {opts.duration_s} s; to stop one earlier press Ctrl-C in its terminal (or "
        "`kill -INT` its pid). When it ends it prints \"N packets dropped by kernel\": more than 0 means a bigger "
        f"-B (now {opts.buffer_mib} MiB) or a narrower window. -Z root keeps the rotated files writable where "
        "tcpdump would drop its privileges; -s 0 keeps whole packets; --time-stamp-precision=nano keeps "
        "nanoseconds where the kernel gives them. A NIC that stamps packets itself (`tcpdump -J -i IFACE` lists "
        "adapter_unsynced) adds nothing here: both hosts' clocks are aligned from the traffic itself.")
    add("")
    add("## 4. On the DB host, while the captures run")
    add("Which connection is which (ID, HOST as ip:port), for connections opened before the capture began:")
    command(f"{_mysql(opts, PROCESSLIST_SQL)} > {q(str(out / 'processlist.tsv'))}")
    add("")
    add("## 5. On the DB host, after the captures stopped")
    add("The settings back to the values variables.tsv holds (long_query_time, slow_query_log, log_output, "
        "log_slow_extra), and the window's part of the slow log:")
    restore = ("$(awk -F'\\t' '$1==\"long_query_time\"{print $2}' " + q(str(out / "variables.tsv")) + ")")
    command(f"{opts.mysql} -e \"SET GLOBAL long_query_time = {restore}\"")
    command(f"{opts.mysql} -e \"SET GLOBAL slow_query_log = "
            f"$(awk -F'\\t' '$1==\"slow_query_log\"{{print $2}}' {q(str(out / 'variables.tsv'))})\"")
    command(_if_variable(opts, "log_output", f"{opts.mysql} -e \"SET GLOBAL log_output = "
                         f"'$(awk -F'\\t' '$1==\"log_output\"{{print $2}}' {q(str(out / 'variables.tsv'))})'\""))
    command(_if_variable(opts, "log_slow_extra", f"{opts.mysql} -e \"SET GLOBAL log_slow_extra = "
                         f"$(awk -F'\\t' '$1==\"log_slow_extra\"{{print $2}}' {q(str(out / 'variables.tsv'))})\""))
    command(f"SLOW=$({_mysql(opts, SLOW_LOG_PATH_SQL, '-BN')})")
    command(f"tail -c +$(( $(cat {q(str(out / 'slow.offset'))}) + 1 )) \"$SLOW\" > {q(str(out / 'slow.log'))}")
    add("")
    add("## 6. TLS")
    add("If the clients connect with TLS (MySQL 8 and MariaDB 11.4+ do by default), the statements are encrypted "
        "on the wire: without keys their times are still measured (by their TLS records), their text is not read. "
        "With the clients' key log analyze decrypts them; the keys come from the client only, as an NSS key log: "
        f"save it as {out / KEYLOG_NAME}, where analyze picks it up. Python: SSLContext.keylog_filename (and "
        "SSLKEYLOGFILE for ssl.create_default_context); Go: tls.Config.KeyLogWriter; Java: the extract-tls-secrets "
        "agent; OpenSSL-based clients (libmysqlclient, MariaDB Connector/C): SSLKEYLOGFILE with an LD_PRELOAD "
        "key logger (sslkeylog). The server cannot give one.")
    add("")
    add("## 7. Gather and analyse")
    if app_dirs:
        first = app_dirs[0][1]
        add(f"Gather into one {out}/ on the machine that analyses: the DB host's {out}/ (capture.toml, db/, "
            f"slow.log, the .tsv files) and each app host's {first.name}/ folder (e.g. "
            f"`scp -r APPHOST:{first} {out}/`), then:")
    else:
        add(f"On the machine that analyses, with the DB host's {out}/ (capture.toml, db/, slow.log, the .tsv files) "
            "copied over:")
    command(f"pcapdecomp analyze {q(str(out))}")
    add("The verdict's first sentence names the thread group that stalled and the statement that held it, or says "
        f"that nothing waited; the tables and report.html go to reports/{out.name}/ (docs/concepts.md: the "
        "verdict).")
    return "\n".join(lines) + "\n"
