"""The client side of each scenario. Runs inside the app namespace and writes one JSON line per command.

    ip netns exec pcd-<pid>-app python3 workload.py SCENARIO --host 10.213.77.2 --out client.jsonl ...

Every connection first asks the server who it is (`IDENTIFY_SQL`): the processlist id (= the id in the
handshake, the slow log's Thread_id and the thread-pool group key) and the performance_schema THREAD_ID,
so record.py can join each client row to the server's own statement timing. Times are `time.time_ns()`
right before the driver call that sends and right after it returned the last response byte.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rawclient as raw  # noqa: E402

IDENTIFY_SQL = ("SELECT CONNECTION_ID(), (SELECT THREAD_ID FROM performance_schema.threads "
                "WHERE PROCESSLIST_ID = CONNECTION_ID())")
USER, PASSWORD = "app", "app-pass"


class Truth:
    """Thread-safe list of client rows."""

    def __init__(self):
        self.rows: list[dict] = []
        self._lock = threading.Lock()
        self._seq = 0

    def add(self, **row) -> None:
        with self._lock:
            row["client_seq"] = self._seq
            self._seq += 1
            row["client_s"] = (row["client_recv_ns"] - row["client_send_ns"]) / 1e9
            self.rows.append(row)


class Connection:
    """A connection (driver or raw) that knows its ids and times every command it sends."""

    def __init__(self, truth: Truth, label: str, kind: str, handle, note: str = "", identify: bool = True):
        self.truth, self.label, self.kind, self.handle, self.note = truth, label, kind, handle, note
        self.conn_id = self.ps_thread_id = None
        self.client_port = _local_port(kind, handle)
        if not identify:  # behind a pooling proxy the server's ids belong to whichever pooled connection ran it
            return
        ids = self.timed_query(IDENTIFY_SQL, role="identify")
        self.conn_id, self.ps_thread_id = int(ids[0]), int(ids[1])
        for row in self.truth.rows:  # the identify row was written before the ids were known
            if row["conn_label"] == label and row["conn_id"] is None:
                row["conn_id"], row["ps_thread_id"] = self.conn_id, self.ps_thread_id

    def record(self, send_ns: int, recv_ns: int, *, command: str, sql: str | None, role: str,
               ps_event: str | None = None, rows: int | None = None, error: str | None = None,
               note: str | None = None) -> None:
        self.truth.add(conn_label=self.label, conn_id=self.conn_id, ps_thread_id=self.ps_thread_id,
                       client_port=self.client_port, driver=self.kind, command=command, sql=sql, role=role, ps_event=ps_event,
                       client_send_ns=send_ns, client_recv_ns=recv_ns, rows=rows, error=error,
                       note=note if note is not None else self.note)

    def timed_query(self, sql: str, role: str = "query", note: str | None = None):
        """COM_QUERY through whichever client this is; returns the first row (or None)."""
        first = None
        error = None
        rows = None
        send_ns = time.time_ns()
        if self.kind == "raw":
            answer = self.handle.query(sql)
            recv_ns = time.time_ns()
            rows, error = answer.rows, answer.error or None
            first = answer.first_row or None
        else:
            cursor = self.handle.cursor()
            try:
                cursor.execute(sql)
                result = cursor.fetchall()
                recv_ns = time.time_ns()
                rows = len(result)
                first = result[0] if result else None
            except Exception as exc:  # a driver error is an outcome to record, not a crash
                recv_ns = time.time_ns()
                error = str(exc)
            finally:
                cursor.close()
        self.record(send_ns, recv_ns, command="COM_QUERY", sql=sql, role=role, rows=rows, error=error, note=note)
        return first

    def close(self) -> None:
        if self.kind == "raw":
            self.handle.quit()
        else:
            self.handle.close()


def _local_port(kind: str, handle) -> int | None:
    """The client's TCP port: with the address it names the connection on the wire, also without a greeting."""
    sock = {"raw": lambda: handle.sock, "pymysql": lambda: handle._sock,
            "connector": lambda: handle._socket.sock}.get(kind, lambda: None)
    try:
        return sock().getsockname()[1]
    except (AttributeError, OSError, TypeError, IndexError):
        return None


def connect(truth: Truth, label: str, args, kind: str = "pymysql", note: str = "", identify: bool = True,
            **options) -> Connection:
    host = options.pop("host_override", args.host)
    if kind == "pymysql" and "ssl" not in options and getattr(args, "tls", None):
        options["ssl"] = _tls_context(args.tls, getattr(args, "keylog", None))
    elif kind == "connector" and "ssl" not in options and getattr(args, "tls", None) == "1.3":
        # mysql-connector builds its own context (ssl.create_default_context, which honours SSLKEYLOGFILE: main
        # sets it) and negotiates TLS 1.3 with the lab's server
        options.update(ssl_disabled=False, ssl_verify_cert=False, ssl_verify_identity=False)
    elif kind == "connector" and "ssl" not in options and getattr(args, "tls", None) == "1.2":
        # pinned to TLS 1.2 mysql-connector builds a bare ssl.SSLContext, which writes no key log: these
        # connections are TLS without keys (timed only) beside the PyMySQL ones the key log decrypts
        options.update(ssl_disabled=False, ssl_verify_cert=False, ssl_verify_identity=False,
                       tls_versions=["TLSv1.2"], tls_ciphersuites=["ECDHE-RSA-AES256-GCM-SHA384"])
    if kind != "raw" and "ssl" not in options:
        options.setdefault("ssl_disabled", True)  # both drivers prefer TLS when the server offers it (features does)
    if kind == "pymysql":
        import pymysql

        handle = pymysql.connect(host=host, port=args.port, user=USER, password=PASSWORD,
                                 database=options.pop("database", "lab"), autocommit=True, **options)
    elif kind == "connector":
        import mysql.connector

        handle = mysql.connector.connect(host=host, port=args.port, user=USER, password=PASSWORD,
                                         database="lab", use_pure=True, autocommit=True, **options)
    else:
        handle = raw.RawClient(host, args.port, USER, PASSWORD, database="lab")
    return Connection(truth, label, kind, handle, note, identify)


def run_threads(workers: list) -> None:
    threads = [threading.Thread(target=w) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# --- scenarios ---------------------------------------------------------------------------------------------

def maxthreads(args, truth: Truth) -> None:
    clients = [connect(truth, f"sleeper-{i}", args) for i in range(args.clients)]
    start = threading.Barrier(len(clients))

    def sleeper(conn: Connection):
        start.wait()
        conn.timed_query(f"SELECT SLEEP({args.sleep_s})")

    run_threads([lambda c=c: sleeper(c) for c in clients])
    for c in clients:
        c.close()


def group_stall(args, truth: Truth) -> None:
    hog = connect(truth, "hog", args)
    probes: list[Connection] = []
    # ids are consecutive, so connections alternate between the groups; make sure both have probes
    while len(probes) < args.clients or len({p.conn_id % args.pool_size for p in probes}) < args.pool_size:
        probes.append(connect(truth, f"probe-{len(probes)}", args))
    t0 = time.monotonic()
    stop = t0 + args.duration

    def probe(conn: Connection, offset: float):
        time.sleep(offset)
        while time.monotonic() < stop:
            conn.timed_query("SELECT 1")
            time.sleep(args.interval_s)

    def hogger():
        time.sleep(args.hog_at_s)
        hog.timed_query(f"SELECT BENCHMARK({args.hog_rounds}, SHA2(RAND(), 256))")

    rng = random.Random(args.seed)
    run_threads([hogger] + [lambda p=p: probe(p, rng.uniform(0, args.interval_s)) for p in probes])
    for c in [hog, *probes]:
        c.close()


POINT_SQL = "SELECT c FROM sbtest1 WHERE id = ?"


def _oltp(args, truth: Truth, prepared_kind: str, prepared_worker, hog_times: list[float]) -> None:
    """The OLTP scenarios: `args.clients` pymysql text-protocol connections and as many `prepared_kind` ones running
    `prepared_worker(conn, rng, paced)`, each at rate / (2 × clients) per second for `args.duration` s, and a hog
    connection running a BENCHMARK at each of `hog_times` (s from the start)."""
    text = [connect(truth, f"text-{i}", args) for i in range(args.clients)]
    prepared = [connect(truth, f"prepared-{i}", args, kind=prepared_kind) for i in range(args.clients)]
    hog = connect(truth, "hog", args)
    per_client_rate = args.rate / (2 * args.clients)
    stop = time.monotonic() + args.duration

    def paced(call) -> None:
        next_at = time.monotonic()
        while next_at < stop:
            call()
            next_at = max(next_at + 1 / per_client_rate, time.monotonic() - 0.05)
            time.sleep(max(0.0, next_at - time.monotonic()))

    def text_worker(conn: Connection, rng: random.Random):
        paced(lambda: conn.timed_query(f"SELECT c FROM sbtest1 WHERE id = {rng.randint(1, args.rows)}"))

    def hogger():
        for at in hog_times:
            time.sleep(max(0.0, stop - args.duration + at - time.monotonic()))
            hog.timed_query(f"SELECT BENCHMARK({args.hog_rounds}, SHA2(RAND(), 256))", role="hog")

    workers = [hogger]
    workers += [lambda c=c, i=i: text_worker(c, random.Random(args.seed * 1000 + i)) for i, c in enumerate(text)]
    workers += [lambda c=c, i=i: prepared_worker(c, random.Random(args.seed * 2000 + i), paced)
                for i, c in enumerate(prepared)]
    run_threads(workers)
    for c in [*text, *prepared, hog]:
        c.close()


def oltp_hogs(args, truth: Truth) -> None:
    def prepared_worker(conn: Connection, rng: random.Random, paced):
        client: raw.RawClient = conn.handle
        send_ns = time.time_ns()
        statement_id, _, _ = client.prepare(POINT_SQL)
        conn.record(send_ns, time.time_ns(), command="COM_STMT_PREPARE", sql=POINT_SQL, role="prepare",
                    ps_event="statement/com/Prepare")

        def call():
            value = rng.randint(1, args.rows)
            send_ns = time.time_ns()
            answer = client.execute(statement_id, [(raw.MYSQL_TYPE_LONGLONG, value.to_bytes(8, "little"))])
            conn.record(send_ns, time.time_ns(), command="COM_STMT_EXECUTE", sql=POINT_SQL, role="query",
                        ps_event="statement/com/Execute", rows=answer.rows, note=f"id={value}")

        paced(call)
        client.close_statement(statement_id)

    _oltp(args, truth, "raw", prepared_worker, args.hog_times)


def oltp_prepared(args, truth: Truth) -> None:
    """Point selects over pymysql (text protocol) and mysql-connector prepared cursors, which send COM_STMT_PREPARE
    once and then COM_STMT_RESET + COM_STMT_EXECUTE for every call; a CPU hog at hog_first s and every hog_every s
    after (longer recordings get more hogs). A prepared call's truth row spans the RESET and the EXECUTE (one
    driver call); its command is the EXECUTE."""
    def prepared_worker(conn: Connection, rng: random.Random, paced):
        cursor = conn.handle.cursor(prepared=True)
        first = [True]

        def call():
            value = rng.randint(1, args.rows)
            send_ns = time.time_ns()
            cursor.execute(POINT_SQL, (value,))
            rows = cursor.fetchall()
            note = ("COM_STMT_PREPARE + COM_STMT_RESET + COM_STMT_EXECUTE" if first[0]
                    else "COM_STMT_RESET + COM_STMT_EXECUTE") + f"; id={value}"
            first[0] = False
            conn.record(send_ns, time.time_ns(), command="COM_STMT_EXECUTE", sql=POINT_SQL, role="query",
                        ps_event="statement/com/Execute", rows=len(rows), note=note)

        paced(call)
        cursor.close()

    rounds = int(max(args.duration - args.hog_first, 0) // args.hog_every) + 1
    hogs = [args.hog_first + k * args.hog_every for k in range(rounds)]
    _oltp(args, truth, "connector", prepared_worker, [at for at in hogs if at < args.duration])


def connection_churn(args, truth: Truth) -> None:
    import pymysql

    stop = time.monotonic() + args.duration
    per_worker_rate = args.rate / args.clients
    counter = iter(range(10**9))

    def churner():
        next_at = time.monotonic()
        while next_at < stop:
            label = f"churn-{next(counter)}"
            send_ns = time.time_ns()
            # ssl_disabled: otherwise pymysql builds a TLS context (loading the CA store, ~50 ms) on every connect
            handle = pymysql.connect(host=args.host, port=args.port, user=USER, password=PASSWORD, database="lab",
                                     ssl_disabled=True)
            recv_ns = time.time_ns()
            conn = Connection(truth, label, "pymysql", handle)  # the identify query is the one query
            conn.record(send_ns, recv_ns, command="connect", sql=None, role="connect",
                        note="TCP handshake + greeting + login, until the driver returned")
            conn.close()
            next_at = max(next_at + 1 / per_worker_rate, time.monotonic() - 0.05)
            time.sleep(max(0.0, next_at - time.monotonic()))

    run_threads([churner] * args.clients)


def connection_storm(args, truth: Truth) -> None:
    """connect → one lookup → quit at args.rate connections/s over args.clients threads, beside args.pooled
    connections that go idle args.idle_s (past wait_timeout) before their second statement."""
    import pymysql

    stop = time.monotonic() + args.duration
    per_worker_rate = args.rate / args.clients
    counter = iter(range(10**9))
    rng = random.Random(args.seed or 1)

    def churner():
        next_at = time.monotonic()
        while next_at < stop:
            label = f"storm-{next(counter)}"
            send_ns = time.time_ns()
            handle = pymysql.connect(host=args.host, port=args.port, user=USER, password=PASSWORD, database="lab",
                                     ssl_disabled=True, autocommit=True)
            recv_ns = time.time_ns()
            conn = Connection(truth, label, "pymysql", handle, identify=False)
            conn.record(send_ns, recv_ns, command="connect", sql=None, role="connect",
                        note="TCP handshake + greeting + login, until the driver returned")
            conn.timed_query(f"SELECT c FROM sbtest1 WHERE id = {rng.randint(1, 1000)}")
            conn.close()
            next_at = max(next_at + 1 / per_worker_rate, time.monotonic() - 0.05)
            time.sleep(max(0.0, next_at - time.monotonic()))

    def pooled(i: int):
        conn = connect(truth, f"pooled-{i}", args)
        conn.timed_query(f"SELECT c FROM sbtest1 WHERE id = {i + 1}")
        time.sleep(args.idle_s)
        conn.timed_query(f"SELECT c FROM sbtest1 WHERE id = {i + 2}", note="after the idle gap")
        try:
            conn.close()
        except Exception:  # the server already closed it
            pass

    run_threads([churner] * args.clients + [lambda i=i: pooled(i) for i in range(args.pooled)])


def connection_refused(args, truth: Truth) -> None:
    """args.clients connections opened args.stagger_s apart, each held args.hold_s between two lookups; the
    attempts past max_connections are refused (ERR 1040): their connect row carries the driver's error."""
    import pymysql

    def client(i: int):
        time.sleep(i * args.stagger_s)
        label = f"held-{i}"
        send_ns = time.time_ns()
        try:
            # the SELECT-only user: the lab's user has CONNECTION ADMIN, which max_connections does not hold back
            handle = pymysql.connect(host=args.host, port=args.port, user="other", password="other-pass",
                                     database="lab", ssl_disabled=True, autocommit=True)
        except pymysql.err.OperationalError as exc:  # refused: an outcome to record, not a crash
            truth.add(conn_label=label, conn_id=None, ps_thread_id=None, client_port=None, driver="pymysql",
                      command="connect", sql=None, role="connect", ps_event=None, client_send_ns=send_ns,
                      client_recv_ns=time.time_ns(), rows=None, error=str(exc), note="refused")
            return
        recv_ns = time.time_ns()
        conn = Connection(truth, label, "pymysql", handle)  # its ids: the statements join performance_schema
        conn.record(send_ns, recv_ns, command="connect", sql=None, role="connect",
                    note="TCP handshake + greeting + login, until the driver returned")
        conn.timed_query(f"SELECT c FROM sbtest1 WHERE id = {i + 1}")
        time.sleep(args.hold_s)
        conn.timed_query(f"SELECT c FROM sbtest1 WHERE id = {i + 2}")
        conn.close()

    run_threads([lambda i=i: client(i) for i in range(args.clients)])


def network_slow_client(args, truth: Truth) -> None:
    """Two connections run the same point lookups at the same pace; one binds to args.slow_host, the address the
    relay delays."""
    conns = [connect(truth, "fast-0", args), connect(truth, "slow-0", args, bind_address=args.slow_host)]
    stop = time.monotonic() + args.duration

    def worker(conn: Connection, rng: random.Random):
        next_at = time.monotonic()
        while next_at < stop:
            conn.timed_query(f"SELECT c FROM sbtest1 WHERE id = {rng.randint(1, 1000)}")
            next_at = max(next_at + args.interval_s, time.monotonic() - 0.05)
            time.sleep(max(0.0, next_at - time.monotonic()))

    run_threads([lambda c=c, i=i: worker(c, random.Random((args.seed or 1) * 100 + i)) for i, c in enumerate(conns)])
    for c in conns:
        c.close()


def _tls_context(version: str | None = None, keylog: str | None = None) -> ssl.SSLContext:
    """A client TLS context for the lab's self-signed server. `version` "1.2" pins TLS 1.2 with
    ECDHE-RSA-AES256-GCM-SHA384 (what MySQL servers negotiate with such clients), "1.3" pins TLS 1.3; `keylog`
    makes Python's ssl write the session secrets in NSS key log format (what --tls-keylog reads)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the lab's self-signed certificate
    if version == "1.2":
        context.maximum_version = context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers("ECDHE-RSA-AES256-GCM-SHA384")
    elif version == "1.3":
        context.minimum_version = ssl.TLSVersion.TLSv1_3
    if keylog:
        context.keylog_filename = keylog
    return context


def features(args, truth: Truth) -> None:
    """Each protocol feature on its own connection; `note` says which."""
    c = connect(truth, "zlib", args, kind="connector", compress=True, note="zlib-compressed protocol")
    c.timed_query("SELECT REPEAT('compressible ', 400) AS text, 42 AS answer")
    c.close()

    c = connect(truth, "multi-results-call", args, kind="raw", note="CALL returning two result sets")
    c.timed_query("CALL two_results()")
    c.close()

    c = connect(truth, "multi-statement", args, kind="raw",
                note="one COM_QUERY with three statements (CLIENT_MULTI_STATEMENTS)")
    c.timed_query("SELECT 1 AS first; SELECT 2 AS second, 3 AS third; DO 0")
    c.close()

    infile = Path(tempfile.mkdtemp(prefix="pcd-lab-")) / "rows.csv"
    infile.write_text("".join(f"{i},row {i}\n" for i in range(1, 201)))
    c = connect(truth, "local-infile", args, local_infile=True, note="LOAD DATA LOCAL INFILE, 200 rows")
    c.timed_query(f"LOAD DATA LOCAL INFILE '{infile}' INTO TABLE loaded FIELDS TERMINATED BY ','")
    c.close()
    shutil.rmtree(infile.parent)

    c = connect(truth, "cursor", args, kind="raw", note="COM_STMT_EXECUTE with a read-only cursor, COM_STMT_FETCH")
    client: raw.RawClient = c.handle
    sql = "SELECT id, c FROM sbtest1 WHERE id <= ?"
    send_ns = time.time_ns()
    statement_id, _, _ = client.prepare(sql)
    c.record(send_ns, time.time_ns(), command="COM_STMT_PREPARE", sql=sql, role="prepare",
             ps_event="statement/com/Prepare")
    send_ns = time.time_ns()
    answer = client.execute(statement_id, [(raw.MYSQL_TYPE_LONGLONG, (12).to_bytes(8, "little"))], cursor=True)
    c.record(send_ns, time.time_ns(), command="COM_STMT_EXECUTE", sql=sql, role="query",
             ps_event="statement/com/Execute", rows=answer.rows, note="cursor opened, 12 rows pending")
    for _ in range(3):
        send_ns = time.time_ns()
        answer = client.fetch(statement_id, 5)
        c.record(send_ns, time.time_ns(), command="COM_STMT_FETCH", sql=None, role="fetch",
                 ps_event="statement/com/Fetch", rows=answer.rows,
                 note=f"fetch 5, last_row_sent={bool(answer.status & raw.SERVER_STATUS_LAST_ROW_SENT)}")
    send_ns = time.time_ns()
    client.close_statement(statement_id)
    c.record(send_ns, time.time_ns(), command="COM_STMT_CLOSE", sql=None, role="close",
             ps_event="statement/com/Close stmt", note="no response on the wire")
    c.close()

    c = connect(truth, "long-data", args, kind="raw", note="COM_STMT_SEND_LONG_DATA in two chunks, then execute")
    client = c.handle
    sql = "INSERT INTO blobs (b) VALUES (?)"
    send_ns = time.time_ns()
    statement_id, _, _ = client.prepare(sql)
    c.record(send_ns, time.time_ns(), command="COM_STMT_PREPARE", sql=sql, role="prepare",
             ps_event="statement/com/Prepare")
    for chunk in (b"A" * 3000, b"B" * 3000):
        send_ns = time.time_ns()
        client.send_long_data(statement_id, 0, chunk)
        c.record(send_ns, time.time_ns(), command="COM_STMT_SEND_LONG_DATA", sql=None, role="long-data",
                 ps_event="statement/com/Long Data", note="no response on the wire")
    send_ns = time.time_ns()
    answer = client.execute(statement_id, [(raw.MYSQL_TYPE_BLOB, b"")])
    c.record(send_ns, time.time_ns(), command="COM_STMT_EXECUTE", sql=sql, role="query",
             ps_event="statement/com/Execute", error=answer.error or None, note="inserts 6000 bytes")
    c.close()

    c = connect(truth, "typed-params", args, kind="raw", note="prepared statement with params of several types")
    client = c.handle
    sql = "SELECT ? AS n, ? AS x, ? AS s, ? AS t, ? AS nothing"
    send_ns = time.time_ns()
    statement_id, _, _ = client.prepare(sql)
    c.record(send_ns, time.time_ns(), command="COM_STMT_PREPARE", sql=sql, role="prepare",
             ps_event="statement/com/Prepare")
    for n, x, s in ((7, 2.5, "first"), (-123456789012, 1e-3, "zweite ünicode")):
        params = [(raw.MYSQL_TYPE_LONGLONG, n.to_bytes(8, "little", signed=True)),
                  (raw.MYSQL_TYPE_DOUBLE, raw.struct.pack("<d", x)),
                  (raw.MYSQL_TYPE_VAR_STRING, raw.encode_string(s)),
                  (raw.MYSQL_TYPE_DATETIME, raw.encode_datetime(2024, 5, 1, 10, 0, 0, 512345)),
                  (raw.MYSQL_TYPE_NULL, None)]
        send_ns = time.time_ns()
        answer = client.execute(statement_id, params)
        c.record(send_ns, time.time_ns(), command="COM_STMT_EXECUTE", sql=sql, role="query",
                 ps_event="statement/com/Execute", rows=answer.rows, note=f"params {n}, {x}, {s!r}, datetime, NULL")
    send_ns = time.time_ns()
    client.reset_statement(statement_id)
    c.record(send_ns, time.time_ns(), command="COM_STMT_RESET", sql=None, role="command",
             ps_event="statement/com/Reset stmt")
    c.close()

    for label, note, action, command, event in (
            ("reset-connection", "COM_RESET_CONNECTION", lambda cl: cl.reset_connection(), "COM_RESET_CONNECTION",
             "statement/com/Reset connection"),
            ("ping", "COM_PING", lambda cl: cl.ping(), "COM_PING", "statement/com/Ping"),
            ("init-db", "COM_INIT_DB to mysql", lambda cl: cl.init_db("mysql"), "COM_INIT_DB",
             "statement/com/Init DB"),
            ("statistics", "COM_STATISTICS (answer is a bare string)", lambda cl: cl.statistics(),
             "COM_STATISTICS", "statement/com/Statistics"),
            ("change-user", "COM_CHANGE_USER to user `other` (auth switch)",
             lambda cl: cl.change_user("other", "other-pass", "lab"), "COM_CHANGE_USER",
             "statement/com/Change user")):
        c = connect(truth, label, args, kind="raw", note=note)
        send_ns = time.time_ns()
        answer = action(c.handle)
        c.record(send_ns, time.time_ns(), command=command, sql=None, role="command", ps_event=event,
                 error=answer.error or None)
        c.timed_query("SELECT CURRENT_USER(), DATABASE()", role="after")
        c.close()

    c = connect(truth, "error", args, kind="raw", note="ERR packet for bad SQL")
    c.timed_query("SELEC 1 FROM nowhere")
    c.close()

    c = connect(truth, "tls", args, ssl=_tls_context(), note="TLS after SSLRequest (payload encrypted on the wire)")
    c.timed_query("SELECT 'secret over TLS'")
    c.close()

    c = connect(truth, "ipv6", args, kind="pymysql", note="IPv6 connection", host_override=args.host6)
    c.timed_query("SELECT 'over IPv6'")
    c.close()


def wait_for_captures(args) -> None:
    """Mid-stream scenarios: tell record.py the connections are up, then wait until its captures run."""
    sync = getattr(args, "sync_dir", None)
    if not sync:
        return
    (Path(sync) / "connected").touch()
    deadline = time.monotonic() + 60
    while not (Path(sync) / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("the captures did not start within 60 s")
        time.sleep(0.02)
    time.sleep(0.2)  # tcpdump says "listening" a moment before its ring sees packets


def midstream_join(args, truth: Truth) -> None:
    """Statements of one fingerprint with different values, some slow-logged, seen by captures that began after
    every login (see the scenario's description)."""
    from pymysql.constants import CLIENT

    text = [connect(truth, f"text-{i}", args, client_flag=CLIENT.MULTI_STATEMENTS) for i in range(args.clients)]
    fresh = connect(truth, "prepared-after", args, kind="raw", note="prepared after the captures began")
    early = connect(truth, "prepared-before", args, kind="raw",
                    note="prepared before the captures began: its text is not on the wire")
    twins = [connect(truth, f"twin-{i}", args, note="runs only what its twin runs, at the same moment")
             for i in range(2)]
    template = "select benchmark(?, md5(?))"

    def prepare(conn: Connection) -> int:
        send_ns = time.time_ns()
        statement_id, _, _ = conn.handle.prepare(template)
        conn.record(send_ns, time.time_ns(), command="COM_STMT_PREPARE", sql=template, role="prepare",
                    ps_event="statement/com/Prepare")
        return statement_id

    def execute(conn: Connection, statement_id: int, rounds: int, tag: str) -> None:
        send_ns = time.time_ns()
        answer = conn.handle.execute(statement_id, [(raw.MYSQL_TYPE_LONGLONG, rounds.to_bytes(8, "little")),
                                                    (raw.MYSQL_TYPE_VAR_STRING, raw.encode_string(tag))])
        conn.record(send_ns, time.time_ns(), command="COM_STMT_EXECUTE", sql=template, role="query",
                    ps_event="statement/com/Execute", rows=answer.rows, error=answer.error or None,
                    note=f"params {rounds}, {tag!r}")

    # md5 rounds per second on this (shared) machine, measured before the captures: slow-logged, outside them
    start = time.monotonic()
    text[0].timed_query(f"select benchmark({args.seed_rounds}, md5('calibrate'))", role="calibrate")
    per_s = args.seed_rounds / max(time.monotonic() - start, 1e-3)
    early_id = prepare(early)
    wait_for_captures(args)

    # seconds of md5 on an idle core; 8 connections share 2 cores and 2 thread groups, so they take 2-4x as
    # long: below and above long_query_time (0.5)
    sizes = [0.02, 0.08, 0.25, 0.7]
    stop = time.monotonic() + args.duration
    together = threading.Barrier(len(text))

    def text_worker(i: int, conn: Connection) -> None:
        rng = random.Random(args.seed * 100 + i)
        while time.monotonic() < stop:
            rounds = int(per_s * rng.choice(sizes))
            conn.timed_query(f"select benchmark({rounds}, md5('h{rng.randrange(16):02d}'))")
            time.sleep(rng.uniform(0.0, 0.03))
        together.wait()  # the same text on every connection at the same moment
        conn.timed_query("select sleep(0.6)", role="same-text")
        together.wait()
        conn.timed_query(f"select benchmark({int(per_s * 0.4)}, md5('same'))", role="same-text")
        together.wait()
        if i == 0:
            for _ in range(4):
                conn.timed_query("select sleep(0.55)", role="repeat")
        elif i == 1:
            conn.timed_query("/* job=17 */ select sleep(0.6)", role="comment")
            conn.timed_query("select sleep(0.6) -- trailing comment", role="comment")
        elif i == 2:
            conn.timed_query("select sleep(0.6); select 1", role="multi-statement")

    def prepared_worker(conn: Connection, statement_id: int | None, seed: int) -> None:
        rng = random.Random(seed)
        if statement_id is None:
            statement_id = prepare(conn)
        while time.monotonic() < stop:
            execute(conn, statement_id, int(per_s * rng.choice(sizes)), f"p{rng.randrange(16):02d}")
            time.sleep(rng.uniform(0.0, 0.1))

    in_step = threading.Barrier(len(twins))

    def twin_worker(conn: Connection) -> None:
        for _ in range(2):  # nothing on the wire or in the log tells these two connections apart
            in_step.wait()
            conn.timed_query("select sleep(0.6)", role="twin")

    workers = [lambda i=i, c=c: text_worker(i, c) for i, c in enumerate(text)]
    workers += [lambda c=c: twin_worker(c) for c in twins]
    workers += [lambda: prepared_worker(fresh, None, args.seed * 7), lambda: prepared_worker(early, early_id, args.seed * 11)]
    run_threads(workers)
    for c in [*text, fresh, early, *twins]:
        c.close()


def slowlog_forms(args, truth: Truth) -> None:
    """Each form of statement text once (long_query_time=0: all of them are in the slow log)."""
    c = connect(truth, "text-forms", args, kind="raw", note="COM_QUERY texts in many forms")
    for sql in ("  \t SELECT 1 AS leading_blanks",
                "SELECT 2 AS trailing_semicolons ;; \n",
                "/* leading comment */ SELECT 3 AS c",
                "SELECT 4 AS c -- trailing comment",
                "SELECT 5 AS c # hash comment\n",
                "SELECT /*+ no hint really */ 6 AS c",
                "SELECT 'multi\nline\r\nliteral' AS m, 7 AS c",
                "SELECT\r\n8 AS crlf\r\n",
                "SELECT 'quote '' and \\' and \\\\ backslash' AS q",
                "SELECT '\u00fcn\u00efc\u00f6d\u00e9 \u2713' AS u",
                "select 9 as lower_case",
                "SELECT 1 AS x,\n# a line that looks like a comment header\n2 AS y",
                "SELECT '\n# Query_time: 1.0 inside a literal\n' AS fake_header",
                "SELECT 'a\x00b' AS nul_byte",
                "SELECT '" + "x" * 5000 + "' AS long_statement",
                "SELECT 10 AS a; SELECT 11 AS b ;  SELECT 'x;y' AS semicolon_in_literal",
                "SET @forms_x = 1",
                "USE lab",
                "SELECT c FROM sbtest1 WHERE id IN (1, 2, 3)",
                "PREPARE forms_stmt FROM 'SELECT ? + 1 AS sql_level'",
                "SET @forms_a = 41",
                "EXECUTE forms_stmt USING @forms_a",
                "DEALLOCATE PREPARE forms_stmt",
                "SELEC 1 AS syntax_error",
                "DO SLEEP(0.01)"):
        c.timed_query(sql)
    c.close()

    c = connect(truth, "binary-params", args, kind="raw", note="COM_STMT_EXECUTE with parameters of every type")
    client: raw.RawClient = c.handle
    sql = ("SELECT ? AS i, ? AS u, ? AS t, ? AS f, ? AS d, ? AS dec_, ? AS dt, ? AS da, ? AS tm, ? AS s, ? AS b, "
           "? AS n /* a ? in a comment */, '?' AS not_a_param")
    send_ns = time.time_ns()
    statement_id, _, _ = client.prepare(sql)
    c.record(send_ns, time.time_ns(), command="COM_STMT_PREPARE", sql=sql, role="prepare",
             ps_event="statement/com/Prepare")
    unsigned = 0x8000
    for values in ((-123456789012, 18446744073709551615, -7, 0.1, 2.5, "12345.678", (2024, 5, 1, 10, 0, 0, 512345),
                    (2024, 5, 2), (1, 12, 34, 56, 0), "it's a \\ back\nslash \u00fc", b"\x00\x01\xfe\xff'", None),
                   (0, 0, 127, 1e-10, 1.2345678901234567e20, "-0.5", (1999, 12, 31, 23, 59, 59, 0),
                    (1970, 1, 1), (0, 0, 0, 1, 250000), "", b"", None)):
        i, u, t, f, d, dec, dt, da, tm, s, b, n = values
        params = [(raw.MYSQL_TYPE_LONGLONG, i.to_bytes(8, "little", signed=True)),
                  (raw.MYSQL_TYPE_LONGLONG | unsigned, u.to_bytes(8, "little")),
                  (raw.MYSQL_TYPE_TINY, t.to_bytes(1, "little", signed=True)),
                  (raw.MYSQL_TYPE_FLOAT, raw.struct.pack("<f", f)),
                  (raw.MYSQL_TYPE_DOUBLE, raw.struct.pack("<d", d)),
                  (raw.MYSQL_TYPE_NEWDECIMAL, raw.encode_string(dec)),
                  (raw.MYSQL_TYPE_DATETIME, raw.encode_datetime(*dt)),
                  (raw.MYSQL_TYPE_DATE, bytes([4]) + raw.struct.pack("<HBB", *da)),
                  (raw.MYSQL_TYPE_TIME, raw.encode_time(*tm)),
                  (raw.MYSQL_TYPE_VAR_STRING, raw.encode_string(s)),
                  (raw.MYSQL_TYPE_BLOB, raw.encode_string(b)),
                  (raw.MYSQL_TYPE_NULL, None)]
        send_ns = time.time_ns()
        answer = client.execute(statement_id, params)
        c.record(send_ns, time.time_ns(), command="COM_STMT_EXECUTE", sql=sql, role="query",
                 ps_event="statement/com/Execute", rows=answer.rows, error=answer.error or None,
                 note=f"params {values!r}")
    long_sql = "SELECT LENGTH(?) AS long_data_length, ? AS tag"
    send_ns = time.time_ns()
    long_id, _, _ = client.prepare(long_sql)
    c.record(send_ns, time.time_ns(), command="COM_STMT_PREPARE", sql=long_sql, role="prepare",
             ps_event="statement/com/Prepare")
    client.send_long_data(long_id, 0, b"L" * 3000)
    send_ns = time.time_ns()
    answer = client.execute(long_id, [(raw.MYSQL_TYPE_BLOB, b""), (raw.MYSQL_TYPE_VAR_STRING, raw.encode_string("ld"))])
    c.record(send_ns, time.time_ns(), command="COM_STMT_EXECUTE", sql=long_sql, role="query",
             ps_event="statement/com/Execute", rows=answer.rows, note="parameter 0 sent as long data")
    # a prepared text without a marker, executed without parameters, as sysbench and JDBC's server-side prepared
    # statements send BEGIN and COMMIT: logged as the text itself
    bare_sql = "COMMIT"
    send_ns = time.time_ns()
    bare_id, _, _ = client.prepare(bare_sql)
    c.record(send_ns, time.time_ns(), command="COM_STMT_PREPARE", sql=bare_sql, role="prepare",
             ps_event="statement/com/Prepare")
    for _ in range(2):
        send_ns = time.time_ns()
        answer = client.execute(bare_id, [])
        c.record(send_ns, time.time_ns(), command="COM_STMT_EXECUTE", sql=bare_sql, role="query",
                 ps_event="statement/com/Execute", error=answer.error or None, note="prepared without parameters")
    client.close_statement(statement_id)
    client.close_statement(long_id)
    client.close_statement(bare_id)
    c.close()

    c = connect(truth, "connector-prepared", args, kind="connector", note="mysql-connector prepared cursor")
    cursor = c.handle.cursor(prepared=True)
    for value in (3, "it's"):
        send_ns = time.time_ns()
        cursor.execute("SELECT id, c FROM sbtest1 WHERE id = %s OR c = %s", (value, str(value)))
        cursor.fetchall()
        c.record(send_ns, time.time_ns(), command="COM_STMT_EXECUTE", sql="SELECT id, c FROM sbtest1 WHERE id = ? OR c = ?",
                 role="query", ps_event="statement/com/Execute", note=f"connector params {value!r}")
    cursor.close()
    c.close()

    c = connect(truth, "pymysql-params", args, note="pymysql interpolates parameters client-side")
    cursor = c.handle.cursor()
    for value in ("it's \\ \u00fc\n", 42):
        sql = cursor.mogrify("SELECT %s AS v", (value,))  # the text pymysql sends
        send_ns = time.time_ns()
        cursor.execute("SELECT %s AS v", (value,))
        cursor.fetchall()
        c.record(send_ns, time.time_ns(), command="COM_QUERY", sql=sql, role="query",
                 note=f"pymysql params {value!r}")
    cursor.close()
    c.close()

    c = connect(truth, "commands", args, kind="raw", note="commands without SQL text")
    for command, action, event in (("COM_PING", lambda cl: cl.ping(), "statement/com/Ping"),
                                   ("COM_INIT_DB", lambda cl: cl.init_db("lab"), "statement/com/Init DB"),
                                   ("COM_STATISTICS", lambda cl: cl.statistics(), "statement/com/Statistics"),
                                   ("COM_RESET_CONNECTION", lambda cl: cl.reset_connection(),
                                    "statement/com/Reset connection")):
        send_ns = time.time_ns()
        answer = action(c.handle)
        c.record(send_ns, time.time_ns(), command=command, sql=None, role="command", ps_event=event,
                 error=answer.error or None)
    c.timed_query("SELECT 'after commands' AS done")
    c.close()


def bigpacket(args, truth: Truth) -> None:
    c = connect(truth, "bigpacket", args, kind="raw", note="a 17 MiB result row: packets of 16 MiB - 1 continued")
    c.timed_query(f"SELECT REPEAT('x', {17 * 1024 * 1024})")
    c.close()


def sysbench(args, truth: Truth) -> None:
    """sysbench oltp_read_only, or the scenario's `test` (oltp_read_write), with server-side prepared statements at
    full speed: a large capture for benchmarks. No per-query truth: sysbench reports only totals, printed to the
    lab's log."""
    import subprocess

    done = subprocess.run(
        ["sysbench", getattr(args, "test", "oltp_read_only"), f"--mysql-host={args.host}", f"--mysql-port={args.port}",
         f"--mysql-user={USER}", f"--mysql-password={PASSWORD}", "--mysql-db=lab", "--tables=1",
         f"--table-size={args.rows}", f"--threads={args.clients}", f"--time={int(args.duration)}",
         "--db-ps-mode=auto", "--mysql-ssl=off", "--report-interval=0",
         *([f"--rate={args.rate}"] if getattr(args, "rate", None) else []), "run"],
        capture_output=True, text=True)
    print(done.stdout[-1500:], flush=True)
    if done.returncode != 0:
        raise SystemExit(f"sysbench failed (exit {done.returncode}): {done.stderr[-500:]}")


def proxy_pool(args, truth: Truth) -> None:
    """Behind a pooling proxy with fewer server connections than clients: every round, all clients send a tagged
    `SELECT <tag> AS tag, SLEEP(s)` at once (text protocol, or a prepared statement the proxy rewrites as text),
    so the pool runs them `pool` at a time and the rest wait inside the proxy; between rounds each client sends a
    few identical `SELECT 1` (the same text from many connections at nearly the same time)."""
    text = [connect(truth, f"text-{i}", args, identify=False) for i in range(args.clients - args.prepared)]
    prepared = [connect(truth, f"prepared-{i}", args, kind="raw", identify=False) for i in range(args.prepared)]
    clients = [*text, *prepared]
    statements = {}
    for conn in prepared:
        send_ns = time.time_ns()
        statements[conn.label] = conn.handle.prepare(args.prepared_sql)[0]
        conn.record(send_ns, time.time_ns(), command="COM_STMT_PREPARE", sql=args.prepared_sql, role="prepare")
    # with --duration, rounds go on until it has passed (the clients decide together, at the barrier)
    stop_at = time.monotonic() + float(getattr(args, "duration", 0) or 0)
    rounds_done = [0]

    def next_round():
        rounds_done[0] += 1

    barrier = threading.Barrier(len(clients), action=next_round)

    def client(index: int, conn: Connection, rng: random.Random):
        while True:
            barrier.wait()
            round_no = rounds_done[0] - 1
            if round_no >= args.rounds and time.monotonic() >= stop_at:
                break
            tag = 1000 * (round_no + 1) + index
            if conn.kind == "raw":
                send_ns = time.time_ns()
                answer = conn.handle.execute(statements[conn.label], [
                    (raw.MYSQL_TYPE_LONGLONG, tag.to_bytes(8, "little")),
                    (raw.MYSQL_TYPE_DOUBLE, struct.pack("<d", args.sleep_s))])
                conn.record(send_ns, time.time_ns(), command="COM_STMT_EXECUTE", sql=args.prepared_sql,
                            role="query", rows=answer.rows, error=answer.error or None, note=f"tag={tag}")
            else:
                conn.timed_query(f"SELECT {tag} AS tag, SLEEP({args.sleep_s})", note=f"tag={tag}")
            time.sleep(rng.uniform(0, 0.02))
            for _ in range(args.probes):
                conn.timed_query("SELECT 1", role="probe")
                time.sleep(rng.uniform(0, 0.01))

    run_threads([lambda i=i, c=c: client(i, c, random.Random(args.seed * 100 + i)) for i, c in enumerate(clients)])
    for conn in prepared:
        conn.handle.close_statement(statements[conn.label])
    for c in clients:
        c.close()


def stall_fix(args, truth: Truth) -> None:
    """Primary-key lookups from many connections, and CPU-bound hogs that keep a worker of one thread group busy
    (args.hogs: [start s, group] pairs). The same schedule and seed for every server setting of the series."""
    lookups = [connect(truth, f"lookup-{i}", args) for i in range(args.clients)]
    hogs: dict[int, Connection] = {}
    while len(hogs) < args.pool_size:  # ids are consecutive: one hog connection per group, whatever the handling
        conn = connect(truth, f"hog-{len(hogs)}", args)
        if conn.conn_id % args.pool_size in hogs:
            conn.close()
            continue
        hogs[conn.conn_id % args.pool_size] = conn
    wait_for_captures(args)  # a pool opened before the captures began (field-pool-before-capture)
    for conn in lookups[:getattr(args, "connection_id_queries", 0)]:
        conn.timed_query("SELECT CONNECTION_ID()", role="connection-id", note="the id answered on the wire")
    per_client_rate = args.rate / args.clients
    start = time.monotonic()
    stop = start + args.duration

    def lookup(conn: Connection, rng: random.Random):
        # a fixed schedule: a lookup held up delays the next ones but none is skipped, so every setting gets the
        # same statements (same ids, same count) and only their timing differs
        next_at = start + rng.uniform(0, 1 / per_client_rate)
        while next_at < stop:
            time.sleep(max(0.0, next_at - time.monotonic()))
            conn.timed_query(f"SELECT c FROM sbtest1 WHERE id = {rng.randint(1, args.rows)}")
            next_at += 1 / per_client_rate

    def hogger(group: int):
        for at, _ in (h for h in args.hogs if h[1] == group):
            time.sleep(max(0.0, start + at - time.monotonic()))
            hogs[group].timed_query(f"SELECT BENCHMARK({args.hog_rounds}, SHA2(RAND(), 256))", role="hog",
                                    note=f"conn_id % {args.pool_size} = {group}")

    workers = [lambda g=g: hogger(g) for g in sorted(hogs)]
    workers += [lambda c=c, i=i: lookup(c, random.Random(args.seed * 1000 + i)) for i, c in enumerate(lookups)]
    run_threads(workers)
    for c in [*lookups, *hogs.values()]:
        c.close()


def two_servers(args, truth: Truth) -> None:
    """Range selects (20 rows) on `clients` text connections to each of two servers (a primary at --host, a replica at
    `host2`), each at rate / (2 × clients) per second, rate × duration of them in all, and a hog connection to the
    primary running a BENCHMARK at each of `hog_times`: the primary's thread group stalls, the replica's does not."""
    servers = {"primary": args.host, "replica": args.host2}
    conns = [connect(truth, f"{role}-{i}", args, host_override=host)
             for role, host in servers.items() for i in range(args.clients)]
    hog = connect(truth, "primary-hog", args)
    per_client_rate = args.rate / (2 * args.clients)
    per_client = round(args.duration * per_client_rate)
    start = time.monotonic()

    def worker(conn: Connection, rng: random.Random):
        # a fixed count on a schedule: a select held up (by the hog, or by a loaded machine) delays the next ones
        # but none is skipped, so every recording has the same statements and the same bytes at each point (the
        # tests need > 3000 of them, and rotated files), and only their timing differs
        for i in range(per_client):
            time.sleep(max(0.0, start + i / per_client_rate - time.monotonic()))
            first = rng.randint(1, args.rows - 19)  # 20 short rows: enough bytes for tcpdump -C 1 to rotate
            conn.timed_query(f"SELECT id, k, c FROM sbtest1 WHERE id BETWEEN {first} AND {first + 19}")

    def hogger():
        for at in args.hog_times:
            time.sleep(max(0.0, start + at - time.monotonic()))
            hog.timed_query(f"SELECT BENCHMARK({args.hog_rounds}, SHA2(RAND(), 256))", role="hog")

    run_threads([hogger, *[lambda c=c, i=i: worker(c, random.Random(args.seed * 1000 + i))
                           for i, c in enumerate(conns)]])
    for c in [*conns, hog]:
        c.close()


SCENARIOS = {"maxthreads": maxthreads, "maxthreads-below-lqt": maxthreads, "group-stall": group_stall, "oltp-hogs": oltp_hogs,
             "oltp-prepared": oltp_prepared,
             "group-stall-tls13": group_stall, "group-stall-tls12": group_stall, "group-stall-cleartext": group_stall,
             "oltp-prepared-tls13": oltp_prepared, "oltp-prepared-tls12": oltp_prepared,
             "connection-churn": connection_churn, "connection-storm": connection_storm,
             "connection-refused": connection_refused, "features": features,
             "network-slow-client": network_slow_client, "bigpacket": bigpacket,
            "sysbench": sysbench, "sysbench-rw": sysbench, "midstream-join": midstream_join, "slowlog-forms": slowlog_forms,
            "proxy-l4": group_stall, "proxy-pool": proxy_pool, "two-servers": two_servers,
             # one workload, three server settings (captures/lab/scenarios.py SERIES "stall-fix")
             "stall-fix-1-pool": stall_fix, "stall-fix-2-thread-per-connection": stall_fix,
             "stall-fix-3-stall-limit-10": stall_fix,
             # the field as it is (captures/lab/scenarios.py, issue 31)
             "field-default-stall": stall_fix, "field-default-stall-lqt-10": stall_fix,
             "field-pool-before-capture": stall_fix}



def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--host", required=True)
    parser.add_argument("--host6", default="")
    parser.add_argument("--port", type=int, default=3306)
    parser.add_argument("--out", required=True)
    parser.add_argument("--params", default="{}", help="scenario parameters as JSON")
    args = parser.parse_args(argv)
    for key, value in json.loads(args.params).items():
        setattr(args, key, value)
    if getattr(args, "keylog", None):
        os.environ["SSLKEYLOGFILE"] = args.keylog  # for drivers that make their TLS context themselves
    truth = Truth()
    SCENARIOS[args.scenario](args, truth)
    with open(args.out, "w") as out:
        for row in truth.rows:
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
