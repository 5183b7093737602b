"""What each lab scenario is: server settings, workload parameters, tables, and what the recording shows."""

from __future__ import annotations

from dataclasses import dataclass, field

from hosts import ServerSettings

SBTEST_ROWS = 10_000
# Two thread groups that a busy statement holds (a 60 s stall limit, one extra active thread): requests on its group
# queue behind it.
HELD_GROUPS = dict(thread_pool_size=2, thread_pool_max_threads=100, thread_pool_stall_limit_ms=60_000,
                   thread_pool_oversubscribe=1)


def _sbtest_sql(rows: int) -> list[str]:
    """A sysbench-like table with short rows, so point selects stay small on the wire."""
    values = ",".join(f"({i},{(i * 7919) % rows},'c-{i:08d}')" for i in range(1, rows + 1))
    return ["CREATE TABLE lab.sbtest1 (id INT PRIMARY KEY, k INT NOT NULL, c CHAR(12) NOT NULL, KEY (k))",
            f"INSERT INTO lab.sbtest1 VALUES {values}"]


def _sysbench_table_sql(rows: int) -> list[str]:
    """sysbench's own sbtest1 (c CHAR(120), pad CHAR(60)), which oltp_read_write's UPDATEs and INSERTs need; the
    texts are fixed, not random, so two recordings hold the same table."""
    values = ",".join(f"({i},{(i * 7919) % rows},'{i:011d}-{i * 31 % 99991:011d}-{'x' * 95}','{i:011d}-{'y' * 47}')"
                      for i in range(1, rows + 1))
    return ["CREATE TABLE lab.sbtest1 (id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, k INT NOT NULL DEFAULT 0, "
            "c CHAR(120) NOT NULL DEFAULT '', pad CHAR(60) NOT NULL DEFAULT '', KEY k_1 (k))",
            f"INSERT INTO lab.sbtest1 VALUES {values}"]


# the OLTP scenarios: two thread groups, a stall limit long enough that a hog keeps its group, long_query_time 0.1
OLTP_SETTINGS = ServerSettings(**HELD_GROUPS, long_query_time_s=0.1)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str  # one paragraph: the incident and its ground truth
    settings: ServerSettings
    params: dict = field(default_factory=dict)  # passed to workload.py; "duration" is overridable
    setup_sql: tuple[str, ...] = ()
    hog_seconds: float = 0.0  # when > 0, BENCHMARK rounds are calibrated to run this long on this machine
    committed: bool = True  # recorded into captures/<name>/ and committed
    midstream: bool = False  # the captures start after the workload has connected (no greetings, no ids)
    proxy: str = ""  # "haproxy" (L4) or "gaea" (L7, pooling): three hosts app -> proxy -> db (proxies.py)
    proxy_pool: int = 0  # the pooling proxy's server connections
    second_server: bool = False  # a second MariaDB on a host of its own (a replica), captured there too
    rotate_mb: int = 0  # tcpdump rotates its files every this many million bytes (-C); 0: one file per host
    # the field as it is: capture.toml carries no thread_pool_* settings (a DBA at 3 a.m. has none at hand); the
    # server's settings go to lab-settings.toml, which pcapdecomp never reads, for the tests to check inferences
    field: bool = False
    processlist_at_s: float = 0.0  # > 0: a processlist snapshot (`mysql -B`) this long after the captures began
    # tcpdump hands packets over in ring blocks, not one by one (hosts.Tcpdump): for sysbench at full speed, where
    # immediate mode drops packets on 2 cores
    block_capture: bool = False


SCENARIOS = {s.name: s for s in (
    Scenario(
        "maxthreads",
        "thread_pool_size=1, thread_pool_max_threads=6: 8 concurrent SELECT SLEEP(2). Six run at once and answer "
        "in ~2 s; two wait in the thread-pool queue for a free thread and answer in ~4 s. The slow log says ~2 s "
        "for all eight: the queue time is invisible to it.",
        ServerSettings(thread_pool_size=1, thread_pool_max_threads=6, thread_pool_stall_limit_ms=500,
                       thread_pool_oversubscribe=3, long_query_time_s=1.0),
        {"clients": 8, "sleep_s": 2},
    ),
    Scenario(
        "maxthreads-below-lqt",
        "thread_pool_size=1, thread_pool_max_threads=4: 6 concurrent SELECT SLEEP(0.97), below long_query_time=1. "
        "Four run at once and answer in ~0.97 s; two wait in the thread-pool queue for a free thread and answer in "
        "~1.94 s. None executed as long as long_query_time: the slow log holds none of them, so the four that ran "
        "have only a bound on their execution (the thread limit in the field, where long_query_time is above it).",
        ServerSettings(thread_pool_size=1, thread_pool_max_threads=4, thread_pool_stall_limit_ms=500,
                       thread_pool_oversubscribe=3, long_query_time_s=1.0),
        {"clients": 6, "sleep_s": 0.97},
    ),
    Scenario(
        "group-stall",
        "thread_pool_size=2 with a huge thread_pool_stall_limit: one CPU-bound BENCHMARK (~3 s) holds its "
        "thread group. Probe queries (SELECT 1 every ~75 ms on several connections in both groups) on that group "
        "wait until it finishes (client time up to ~3 s, execution microseconds); probes on the other group stay "
        "fast. Only the BENCHMARK is in the slow log (long_query_time=1).",
        ServerSettings(**HELD_GROUPS, long_query_time_s=1.0),
        {"clients": 6, "duration": 6.0, "interval_s": 0.075, "hog_at_s": 1.5, "pool_size": 2},
        hog_seconds=3.0,
    ),
    Scenario(
        "group-stall-tls13",
        "The group-stall workload over TLS 1.3 (PyMySQL with an ssl context; MariaDB with a self-signed "
        "certificate): one BENCHMARK (~1.5 s) holds its thread group, SELECT 1 probes on that group queue behind it. "
        "The client's key log (Python ssl keylog_filename) is tls-keys.log: with it the captures decrypt; without "
        "it only the greeting is plain text. Only the BENCHMARK is in the slow log (long_query_time=1).",
        ServerSettings(**HELD_GROUPS, long_query_time_s=1.0, tls=True),
        {"clients": 4, "duration": 3.0, "interval_s": 0.075, "hog_at_s": 0.8, "pool_size": 2, "tls": "1.3"},
        hog_seconds=1.5,
    ),
    Scenario(
        "group-stall-tls12",
        "The group-stall workload over TLS 1.2 with ECDHE-RSA-AES256-GCM-SHA384 (PyMySQL; MariaDB with a "
        "self-signed certificate): one BENCHMARK (~1.5 s) holds its thread group, SELECT 1 probes on that group "
        "queue behind it. The client's key log is tls-keys.log. Only the BENCHMARK is in the slow log "
        "(long_query_time=1).",
        ServerSettings(**HELD_GROUPS, long_query_time_s=1.0, tls=True),
        {"clients": 4, "duration": 3.0, "interval_s": 0.075, "hog_at_s": 0.8, "pool_size": 2, "tls": "1.2"},
        hog_seconds=1.5,
    ),
    Scenario(
        "oltp-prepared-tls13",
        "The oltp-prepared workload over TLS 1.3: point selects over 2 pymysql text-protocol connections and 2 "
        "mysql-connector prepared cursors (COM_STMT_PREPARE, COM_STMT_RESET + COM_STMT_EXECUTE), up to 200/s for "
        "3 s, a CPU hog (BENCHMARK ~0.3 s) every 1.2 s on thread_pool_size=2. The clients' key log (Python ssl: "
        "keylog_filename for pymysql, SSLKEYLOGFILE for mysql-connector's own context) is tls-keys.log.",
        ServerSettings(**HELD_GROUPS, long_query_time_s=0.1, tls=True),
        {"clients": 2, "rate": 200, "duration": 3.0, "rows": SBTEST_ROWS, "hog_first": 0.8, "hog_every": 1.2,
         "tls": "1.3"},
        tuple(_sbtest_sql(SBTEST_ROWS)),
        hog_seconds=0.3,
    ),
    Scenario(
        "oltp-prepared-tls12",
        "The oltp-prepared workload over TLS 1.2 (ECDHE-RSA-AES256-GCM-SHA384): point selects over 2 pymysql "
        "text-protocol connections and 2 mysql-connector prepared cursors, up to 200/s for 3 s, a CPU hog "
        "(BENCHMARK ~0.3 s) every 1.2 s on thread_pool_size=2. Only PyMySQL's sessions are in the key log "
        "(tls-keys.log): mysql-connector pinned to TLS 1.2 makes a context that writes none, so its connections "
        "are TLS without keys, timed only, in the same capture.",
        ServerSettings(**HELD_GROUPS, long_query_time_s=0.1, tls=True),
        {"clients": 2, "rate": 200, "duration": 3.0, "rows": SBTEST_ROWS, "hog_first": 0.8, "hog_every": 1.2,
         "tls": "1.2"},
        tuple(_sbtest_sql(SBTEST_ROWS)),
        hog_seconds=0.3,
    ),
    Scenario(
        "group-stall-cleartext",
        "The group-stall-tls13 workload without TLS (the server still offers it; the clients decline): the plaintext "
        "yardstick of benchmarks/tls.py. Recorded on demand, not committed.",
        ServerSettings(**HELD_GROUPS, long_query_time_s=1.0, tls=True),
        {"clients": 4, "duration": 3.0, "interval_s": 0.075, "hog_at_s": 0.8, "pool_size": 2},
        hog_seconds=1.5,
        committed=False,
    ),
    Scenario(
        "oltp-hogs",
        "OLTP point selects on a 10k-row sysbench-like table, text protocol (pymysql) and server-side prepared "
        "statements (COM_STMT_EXECUTE), 4+4 connections at up to 1200/s in total for 3 s, while a CPU hog (BENCHMARK ~0.4 s) "
        "runs three times on thread_pool_size=2 with a 60 s stall limit: point selects queued behind a hog in "
        "its group slow down without being slow themselves (long_query_time=0.1).",
        OLTP_SETTINGS,
        {"clients": 4, "rate": 1200, "duration": 3.0, "rows": SBTEST_ROWS, "hog_times": [0.6, 1.5, 2.4]},
        tuple(_sbtest_sql(SBTEST_ROWS)),
        hog_seconds=0.4,
    ),
    Scenario(
        "oltp-prepared",
        "OLTP point selects on a 10k-row sysbench-like table over 2 pymysql text-protocol connections and 2 "
        "mysql-connector prepared cursors (COM_STMT_PREPARE once, then COM_STMT_RESET + COM_STMT_EXECUTE per "
        "call), up to 200/s in total for 3 s, while a CPU hog (BENCHMARK ~0.3 s) runs every 1.2 s on "
        "thread_pool_size=2. The recording that capture loss is tested on (tests/test_repair.py drops frames "
        "from a copy with scripts/lose_frames.py).",
        OLTP_SETTINGS,
        {"clients": 2, "rate": 200, "duration": 3.0, "rows": SBTEST_ROWS, "hog_first": 0.8, "hog_every": 1.2},
        tuple(_sbtest_sql(SBTEST_ROWS)),
        hog_seconds=0.3,
    ),
    Scenario(
        "connection-churn",
        "Short connections at a high rate: connect, one query, quit (~60 connections/s). The connect rows in "
        "truth.jsonl give the client-side handshake latency (TCP + greeting + login).",
        ServerSettings(thread_pool_size=2, long_query_time_s=1.0),
        {"clients": 3, "rate": 60, "duration": 5.0},
        committed=False,
    ),
    Scenario(
        "connection-storm",
        "Clients that open a connection for every statement, ~60 connections/s on one-thread-per-connection with "
        "thread_cache_size=0 (each connection costs the server a new thread), for 4 s: connect, one point lookup, "
        "quit. Beside them 4 pooled connections run a lookup, sit idle 3 s, past wait_timeout=2, and run one more: "
        "the server closed them after 2 s idle, so that statement fails (\"MySQL server has gone away\" / lost "
        "connection). truth.jsonl: a connect row per connection (TCP + greeting + login, as the client timed it), a "
        "row per statement with its error, and the pooled connections' labels (pooled-N).",
        ServerSettings(thread_handling="one-thread-per-connection", thread_cache_size=0, wait_timeout_s=2,
                       long_query_time_s=1.0),
        {"clients": 3, "rate": 60, "duration": 4.0, "pooled": 4, "idle_s": 3.0},
        _sbtest_sql(1000),
    ),
    Scenario(
        "connection-refused",
        "max_connections=10 (MariaDB's smallest): 14 clients connect 50 ms apart and each holds its connection "
        "1.5 s (a lookup, the wait, a lookup, quit). They log in as a SELECT-only user (the lab's own user has "
        "CONNECTION ADMIN, which max_connections does not hold back): the server accepts max_connections of them "
        "and answers the others' login with ERR 1040 \"Too many connections\" (MariaDB checks the limit after "
        "authentication), then closes them. truth.jsonl: a connect row per client (refused: its error), a row per "
        "statement.",
        ServerSettings(max_connections=10, long_query_time_s=1.0),
        {"clients": 14, "stagger_s": 0.05, "hold_s": 1.5},
        _sbtest_sql(1000),
    ),
    Scenario(
        "network-slow-client",
        "Two app clients run the same point lookups (one every 25 ms each, for 3 s) through an L4 relay between "
        "the app and DB hosts; the relay holds every chunk of one client's connection 20 ms (each leg of each "
        "exchange), the other passes at once: a slow network path for one client, made without netem. The "
        "captures are at the app and the DB, not on the relay host: the relay's hold is network between them. "
        "truth.jsonl: each statement's client time; the slow client's label is slow-0 and its address "
        "10.213.78.11.",
        ServerSettings(thread_pool_size=2, long_query_time_s=1.0),
        {"duration": 3.0, "interval_s": 0.025, "slow_host": "10.213.78.11", "relay_delay_ms": 20.0},
        _sbtest_sql(1000),
        proxy="relay",  # proxies.DelayRelay: params relay_delay_ms per leg for slow_host
    ),
    Scenario(
        "features",
        "One connection per protocol feature no public capture has: zlib compression, CALL with two result "
        "sets, a multi-statement COM_QUERY, LOAD DATA LOCAL INFILE, a read-only cursor with COM_STMT_FETCH, "
        "COM_STMT_SEND_LONG_DATA, typed prepared-statement parameters, COM_STMT_RESET, COM_RESET_CONNECTION, "
        "COM_PING, COM_INIT_DB, COM_STATISTICS, COM_CHANGE_USER, an ERR packet, TLS and IPv6. Each row's "
        "`note` in truth.jsonl names the feature.",
        ServerSettings(thread_pool_size=2, long_query_time_s=1.0, local_infile=True, tls=True),
        {},
        (*_sbtest_sql(100),
         "CREATE TABLE lab.loaded (id INT PRIMARY KEY, label VARCHAR(20))",
         "CREATE TABLE lab.blobs (id INT AUTO_INCREMENT PRIMARY KEY, b MEDIUMBLOB)",
         "CREATE PROCEDURE lab.two_results() BEGIN SELECT 1 AS first_set; SELECT 2 AS second_set, 'b' AS x; END"),
    ),
    Scenario(
        "midstream-join",
        "The captures start after 10 connections logged in (no greeting: no connection ids on the wire). The "
        "statements share a few fingerprints and differ in their values: select benchmark(N, md5('hNN')) with N "
        "from four sizes on six text connections at once, on thread_pool_size=2 with a 60 s stall limit (so "
        "some queue behind others), then the same text on every connection at the same moment (select sleep(0.6), "
        "select benchmark(N, md5('same'))), select sleep(0.55) four times in a row on one connection, a "
        "commented and a multi-statement query, and prepared select benchmark(?, md5(?)) on two binary-protocol "
        "connections: one prepared after the captures began, one before (its text is not on the wire), and two "
        "twin connections that only ever run select sleep(0.6) at the same moment (nothing tells them apart). "
        "long_query_time=0.5: some statements of each fingerprint are slow-logged, some are not.",
        ServerSettings(**HELD_GROUPS, long_query_time_s=0.5),
        {"clients": 6, "duration": 6.0, "seed_rounds": 200_000},
        midstream=True,
    ),
    Scenario(
        "slowlog-forms",
        "Every statement in the slow log (long_query_time=0): the forms a statement takes on the wire and in the "
        "log. Leading blanks, trailing ';', comments (/* */, --, #, hints), CRLF and multi-line literals, quotes "
        "and backslashes, unicode, a NUL byte, a 5 kB statement, a three-statement COM_QUERY, USE, SET, "
        "SQL-level PREPARE/EXECUTE, binary-protocol executes with parameters of every type (integers signed and "
        "unsigned, float, double, decimal, date, time, datetime, strings with quotes/backslashes/newlines, a "
        "binary blob, NULL, long data), a prepared COMMIT without parameters, mysql-connector's prepared cursor, "
        "pymysql's client-side interpolation, and COM_PING / COM_INIT_DB / COM_STATISTICS / COM_RESET_CONNECTION.",
        ServerSettings(thread_pool_size=2, long_query_time_s=0.0),
        {},
        tuple(_sbtest_sql(100)),
    ),
    Scenario(
        "sysbench",
        "sysbench oltp_read_only (prepared statements: point selects, ranges, sums, ORDER BY, DISTINCT) on 8 "
        "threads at full speed against a 10k-row table, for the speed benchmark (benchmarks/bench.py). "
        "Recorded on demand (large), not committed; no per-query truth.",
        ServerSettings(thread_pool_size=2, long_query_time_s=1.0),
        {"clients": 8, "duration": 10.0, "rows": SBTEST_ROWS},
        tuple(_sbtest_sql(SBTEST_ROWS)),
        committed=False, block_capture=True,
    ),
    Scenario(
        "sysbench-rw",
        "sysbench oltp_read_write (prepared statements: point selects, range selects of 100 rows, sums, ORDER BY, "
        "DISTINCT, index and non-index UPDATEs, DELETE and INSERT in transactions) on 16 threads at full speed "
        "against sysbench's own 10k-row table, long_query_time=0.01 so that the slow log has entries (a statement "
        "takes ~1 ms here): the benchmark's second shape (benchmarks/bench.py --shape rw). Recorded on demand "
        "(large), not committed; no per-query truth.",
        ServerSettings(thread_pool_size=2, long_query_time_s=0.01),
        {"clients": 16, "duration": 10.0, "rows": SBTEST_ROWS, "test": "oltp_read_write"},
        tuple(_sysbench_table_sql(SBTEST_ROWS)),
        committed=False, block_capture=True,
    ),
    Scenario(
        "two-servers",
        "Two MariaDB servers, a primary and a replica, each on a host of its own and captured there; the app host "
        "talks to both over two links and is captured on both (-i any); every tcpdump rotates its file each "
        "million bytes (-C 1), as long captures in the field are taken. Range selects (20 rows by id) on 3 text connections to "
        "each server, 3600 of them at 1200/s in total (3 s; a fixed count: a loaded machine takes longer, never "
        "fewer); a CPU hog (BENCHMARK ~0.4 s) runs twice on the primary "
        "(thread_pool_size=2, 60 s stall limit): the primary's selects in the hog's thread group queue "
        "behind it, the replica's do not (long_query_time=0.1). truth.jsonl says which server (conn_label "
        "primary-… / replica-…). Recorded by the tests (tests/test_sources.py), not committed.",
        OLTP_SETTINGS,
        {"clients": 3, "rate": 1200, "duration": 3.0, "rows": SBTEST_ROWS, "hog_times": [0.8, 2.0]},
        tuple(_sbtest_sql(SBTEST_ROWS)),
        hog_seconds=0.4,
        committed=False,
        second_server=True,
        rotate_mb=1,
    ),
    Scenario(
        "bigpacket",
        "One result row of 17 MiB (SELECT REPEAT('x', 17 MiB)): the response payload is split into packets of "
        "16 MiB - 1 continued in the next packet. The pcaps are ~18 MB each; recorded on demand, not committed.",
        ServerSettings(thread_pool_size=2, long_query_time_s=1.0, max_allowed_packet=64 * 1024 * 1024),
        {},
        committed=False,
    ),
    Scenario(
        "proxy-l4",
        "HAProxy (Debian's package) in TCP mode between app and DB: every client connection gets its own server "
        "connection, the greeting and every byte pass through, only ports and TCP sequence numbers differ. "
        "Behind it the group-stall incident: thread_pool_size=2, a CPU-bound BENCHMARK (~1.5 s) holds thread "
        "group 1 and the probes (SELECT 1 every ~75 ms) on that group wait for it. Captured at the app, on the "
        "proxy host (both sides, tcpdump -i any) and at the DB.",
        ServerSettings(thread_pool_size=2, thread_pool_max_threads=100, thread_pool_stall_limit_ms=60_000,
                       thread_pool_oversubscribe=1, long_query_time_s=1.0),
        {"clients": 4, "duration": 3.0, "interval_s": 0.075, "hog_at_s": 1.0, "pool_size": 2},
        hog_seconds=1.5, proxy="haproxy",
    ),
    Scenario(
        "proxy-pool",
        "Gaea (XiaoMi's MySQL proxy, built from the Go module proxy) with a pool of 2 server connections in front "
        "of 8 client connections: every round all 8 send a tagged SELECT ..., SLEEP(0.15) at once (6 by text, 2 "
        "as a prepared statement that Gaea executes as a text query with the values written in), so the pool "
        "runs two at a time and the others wait inside the proxy for a pooled connection (0.15 to 0.6 s) while "
        "the DB executes each in 0.15 s and never queues. Between rounds each client sends two identical "
        "SELECT 1. Gaea also sends statements of its own on the pooled connections (SET autocommit, SET NAMES).",
        ServerSettings(thread_pool_size=4, thread_pool_max_threads=100, thread_pool_stall_limit_ms=500,
                       thread_pool_oversubscribe=3, long_query_time_s=1.0),
        {"clients": 8, "prepared": 2, "rounds": 3, "sleep_s": 0.15, "probes": 2,
         "prepared_sql": "SELECT ? AS tag, SLEEP(?)"},
        proxy="gaea", proxy_pool=2,
    ),
)}


# --- the four-point incident's fix, three times (one command: `lab record stall-fix`) ------------------------------
# The same workload and seed under three settings, in the incident's order: the pool as configured (default stall
# limit), one-thread-per-connection, the pool with thread_pool_stall_limit=10. `pcapdecomp compare` reads them in
# this order (their names sort so).
_STALL_FIX_PARAMS = {"clients": 24, "rate": 60, "duration": 4.0, "rows": SBTEST_ROWS, "pool_size": 2,
                     "hogs": [[0.5, 0], [1.3, 1], [2.3, 0], [3.0, 1]]}
_STALL_FIX_TEXT = ("24 connections run primary-key lookups (SELECT c FROM sbtest1 WHERE id = N, 60/s in all, on a fixed schedule) for "
                   "4 s while a CPU-bound BENCHMARK (~1 s) keeps a worker busy four times, twice on each of the two "
                   "thread groups (conn_id % 2), as in the four-point incident. long_query_time=0.1.")
_STALL_FIX = (
    ("stall-fix-1-pool", "pool-of-threads, thread_pool_size=2 and MariaDB's default thread_pool_stall_limit (500 ms) "
     "and thread_pool_oversubscribe (3): lookups that arrive on a group while its hog runs wait in the queue until "
     "the group is declared stalled.", dict(thread_handling="pool-of-threads", thread_pool_stall_limit_ms=500)),
    ("stall-fix-2-thread-per-connection", "thread_handling=one-thread-per-connection: no pool, no queue; every "
     "connection has its own thread, and the hogs compete with the lookups for the CPU only.",
     dict(thread_handling="one-thread-per-connection")),
    ("stall-fix-3-stall-limit-10", "pool-of-threads as in stall-fix-1-pool, with thread_pool_stall_limit=10: a group "
     "whose worker is busy for 10 ms is declared stalled and another worker takes its queue.",
     dict(thread_handling="pool-of-threads", thread_pool_stall_limit_ms=10)),
)
for _name, _text, _settings in _STALL_FIX:
    SCENARIOS[_name] = Scenario(
        _name, f"{_STALL_FIX_TEXT} Here: {_text}",
        ServerSettings(thread_pool_size=2, thread_pool_max_threads=65536, thread_pool_oversubscribe=3,
                       long_query_time_s=0.1, **_settings),
        dict(_STALL_FIX_PARAMS), tuple(_sbtest_sql(SBTEST_ROWS)), hog_seconds=1.0)
SERIES = {"stall-fix": tuple(name for name, _, _ in _STALL_FIX)}


# --- the field as it is (issue 31): MariaDB's defaults, three thread groups, no thread_pool_* in capture.toml ----------
# thread_pool_max_threads stays at its default (65536), so only the stall limit relieves a busy group.
FIELD_SETTINGS = dict(thread_handling="pool-of-threads", thread_pool_size=3, thread_pool_max_threads=65536,
                      thread_pool_stall_limit_ms=500, thread_pool_oversubscribe=3)
_FIELD_PARAMS = {"clients": 24, "rate": 60, "duration": 5.0, "rows": SBTEST_ROWS, "pool_size": 3,
                 "hogs": [[0.4, 0], [2.0, 1], [3.6, 2]]}
_FIELD_TEXT = ("The field as it is: MariaDB's defaults thread_pool_stall_limit=500 ms and thread_pool_oversubscribe=3 "
               "on thread_pool_size=3 (not in capture.toml: lab-settings.toml has the server's settings). 24 "
               "connections run primary-key lookups (SELECT c FROM sbtest1 WHERE id = N, 60/s in all, on a fixed "
               "schedule) for 5 s while three CPU-bound SELECT BENCHMARK(…) of about 1–1.5 s run one after the other, one "
               "on each thread group (conn_id % 3): lookups that arrive on a group while its BENCHMARK runs wait in "
               "the queue (a few hundred ms, up to about 1 s) until the pool's timer declares the group stalled and "
               "another worker takes them, while executing in under a few ms; later lookups on that group pass.")
for _name, _lqt, _extra, _more in (
        ("field-default-stall", 1.0, "long_query_time=1: the slow log holds the BENCHMARKs that ran ≥ 1 s, none "
         "of the lookups.", {}),
        ("field-default-stall-lqt-10", 10.0, "long_query_time=10, the server's default: the slow log is empty.", {}),
        ("field-pool-before-capture", 1.0, "The connection pool opened its 27 connections before the captures "
         "began (no greeting, no connection id on the wire); a processlist snapshot (processlist.tsv, `mysql -B` "
         "of information_schema.PROCESSLIST) was taken 1.2 s into the captures; four lookup connections ask "
         "SELECT CONNECTION_ID() once, on the wire; long_query_time=1: the slow log holds the BENCHMARKs that ran "
         "≥ 1 s, with their Thread_id.", dict(midstream=True, processlist_at_s=1.2))):
    SCENARIOS[_name] = Scenario(
        _name, f"{_FIELD_TEXT} {_extra}", ServerSettings(**FIELD_SETTINGS, long_query_time_s=_lqt),
        dict(_FIELD_PARAMS, connection_id_queries=4 if _more.get("midstream") else 0),
        tuple(_sbtest_sql(SBTEST_ROWS)), hog_seconds=1.5, field=True, **_more)
