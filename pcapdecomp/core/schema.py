"""Every table column, declared once: name, dtype, meaning. The docs print these declarations."""

from __future__ import annotations

from dataclasses import dataclass

TS = "datetime64[ns, UTC]"
# Text with few distinct values per table (endpoints, commands, statements, fingerprints…): a pandas categorical of
# strings, an Arrow dictionary in parquet. Reads like text; costs one small code per row.
CATEGORY = "category"


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    dtype: str  # pandas dtype
    meaning: str

    @property
    def file_dtype(self) -> str:
        """The dtype pandas gives the column when it reads the Parquet file back: categorical text is written as text."""
        return "string" if self.dtype == CATEGORY else self.dtype


EXCHANGE_COLUMNS: tuple[Column, ...] = (
    Column("capture", CATEGORY, "capture file the exchange was read from"),
    Column("conn_index", "int64", "ordinal of the TCP connection in the capture (groups exchanges when conn_id is unknown)"),
    Column("conn_id", "Int64", "MySQL connection id (thread id) from the server greeting; analyze also takes it from a processlist snapshot, a SELECT CONNECTION_ID() answered on the wire or the slow log (conn_id_source); null when unknown (the capture began mid-connection)"),
    Column("client", CATEGORY, "client endpoint ip:port"),
    Column("server", CATEGORY, "server endpoint ip:port"),
    Column("seq", "int64", "ordinal of the exchange in its connection, from 0"),
    Column("command", CATEGORY, "COM_QUERY, COM_STMT_EXECUTE, ...; CONNECT for the login; COM_0xNN when unknown; "
           "ENCRYPTED for a request read from TLS records without a key log (one client flight: command and text "
           "unknown, bytes and times known)"),
    Column("sql", CATEGORY, "statement text (prepared text for COM_STMT_*; USE `db` for COM_INIT_DB; of an ENCRYPTED "
           "exchange, the text of the slow-log entry it joined); null when none"),
    Column("stmt_id", "Int64", "prepared statement id (COM_STMT_*)"),
    Column("params", "string", "COM_STMT_EXECUTE parameters as SQL literals, comma-separated; null when undecodable"),
    Column("fingerprint", CATEGORY, "pt-fingerprint of sql (administrator command: X for commands without SQL)"),
    Column("query_id", CATEGORY, "pt-query-digest Query ID of the fingerprint"),
    Column("req_first_ts", TS, "capture time of the request's first byte"),
    Column("req_last_ts", TS, "capture time of the request's last byte (including LOCAL INFILE data and auth continuations)"),
    Column("resp_first_ts", TS, "capture time of the response's first byte; null when no response was seen"),
    Column("resp_last_ts", TS, "capture time of the response's last byte"),
    Column("req_first_frame", "int64", "frame number carrying the request's first byte"),
    Column("req_last_frame", "int64", "frame number carrying the request's last byte"),
    Column("resp_first_frame", "Int64", "frame number carrying the response's first byte"),
    Column("resp_last_frame", "Int64", "frame number carrying the response's last byte"),
    Column("response_s", "float64", "resp_last_ts - req_first_ts, seconds"),
    Column("ttfb_s", "float64", "resp_first_ts - req_last_ts, seconds (server think time before the first byte)"),
    Column("result", CATEGORY, "ok | error | resultset | none (no response expected) | encrypted (a TLS flight answered, "
           "its content unknown); null when the response was not (fully) seen"),
    Column("error_code", "Int64", "ERR packet code"),
    Column("error_state", CATEGORY, "ERR packet SQL state"),
    Column("error_message", CATEGORY, "ERR packet message"),
    Column("rows", "int64", "rows in the result set(s)"),
    Column("affected_rows", "int64", "affected rows from the final OK packet(s); at most the int64 maximum (problems: out-of-range)"),
    Column("warnings", "int64", "warning count from OK/EOF packets"),
    Column("result_sets", "int64", "number of result sets (several with SERVER_MORE_RESULTS_EXISTS)"),
    Column("bytes_req", "int64", "request bytes: MySQL packets with their 4-byte headers (decompressed when the connection uses the compressed protocol)"),
    Column("bytes_resp", "int64", "response bytes: MySQL packets with their 4-byte headers (decompressed when the connection uses the compressed protocol)"),
    Column("status_flags", "Int64", "server status flags of the final OK/EOF packet"),
    Column("server_flag_slow", "boolean", "SERVER_QUERY_WAS_SLOW (0x0800) set in the final status flags"),
    Column("tls", "boolean", "the connection switched to TLS (decrypted with a key log, or timed by its records: "
           "connections.tls_mode)"),
    Column("compressed", CATEGORY, "zlib | zstd when the compressed protocol was in use"),
    Column("user", CATEGORY, "user name from the login packet"),
    Column("db", CATEGORY, "database from the login packet"),
    Column("req_tcp_seq", "int64", "TCP sequence number of the request's first byte (matches the same bytes at another capture point)"),
    Column("resp_tcp_seq", "Int64", "TCP sequence number of the response's first byte"),
    Column("resp_tcp_end", "Int64", "TCP sequence number just past the response's last byte"),
    Column("problems", CATEGORY, "comma-separated: midstream, gap, unanswered, incomplete, truncated, sql-cut, sequence, violation, unknown-statement, params-undecoded, query-attributes, out-of-range (a wire number beyond int64: the column holds the int64 maximum, a lower bound), retransmission-conflict (two copies of its bytes on the wire differed: an insertion or a rewriting middlebox; the first copy was read)"),
)

CONNECTION_COLUMNS: tuple[Column, ...] = (
    Column("capture", "string", "capture file"),
    Column("conn_index", "int64", "ordinal of the TCP connection in the capture"),
    Column("conn_id", "Int64", "MySQL connection id (thread id): from the greeting, else from the source conn_id_source names"),
    Column("conn_id_source", "string", "where conn_id comes from: greeting | connection_id_answer (a SELECT CONNECTION_ID() answered on the wire) | processlist (a processlist snapshot's row whose HOST is the client ip:port at the DB point; analyze --processlist) | slowlog (the Thread_id of every slow-log entry joined to the connection, one id no other connection has; analyze); null when unknown"),
    Column("client", "string", "client endpoint ip:port"),
    Column("server", "string", "server endpoint ip:port"),
    Column("server_version", "string", "version string from the greeting"),
    Column("auth_plugin", "string", "authentication plugin offered in the greeting"),
    Column("user", "string", "user name from the login packet"),
    Column("db", "string", "database from the login packet"),
    Column("scramble", "string", "hex of the greeting's 20-byte challenge: identical at every capture point of the connection"),
    Column("syn_ts", TS, "capture time of the client's SYN; null when not captured"),
    Column("greeting_ts", TS, "capture time of the server greeting"),
    Column("login_ok_ts", TS, "capture time of the OK that ended authentication"),
    Column("handshake_s", "float64", "login_ok_ts - (syn_ts or greeting_ts): connection set-up latency, seconds"),
    Column("first_ts", TS, "first frame of the connection"),
    Column("last_ts", TS, "last frame of the connection"),
    Column("frames", "int64", "frames of this connection"),
    Column("exchanges", "int64", "exchanges read"),
    Column("midstream", "boolean", "the capture began after the connection's handshake"),
    Column("tls", "boolean", "the connection switched to TLS"),
    Column("compressed", "string", "zlib | zstd when the compressed protocol was in use"),
    Column("closed", "boolean", "FIN from both sides or RST seen"),
    Column("gaps", "int64", "holes in the byte stream (bytes never captured)"),
    Column("gap_bytes", "int64", "bytes never captured, both directions"),
    Column("retransmitted_bytes", "int64", "duplicate bytes dropped by reassembly"),
    Column("mysql_bytes", "int64", "stream bytes read by the MySQL parser (both directions; compressed bytes as on the wire)"),
    Column("unparsed_bytes", "int64", "bytes skipped while resynchronising (mid-stream start, after a gap or a violation)"),
    Column("tls_bytes", "int64", "bytes after the switch to TLS (= tls_decrypted_bytes + tls_timed_bytes + the "
           "unreadable rest)"),
    Column("tls_mode", "string", "decrypted (with the key log) | timed (application-data records read as flights "
           "without their content: no key log for it) | unreadable (neither: no handshake or records seen, a gap, "
           "a key that does not decrypt); null without TLS"),
    Column("tls_version", "string", "1.0 | 1.1 | 1.2 | 1.3, from the ServerHello (1.0 and 1.1 are timed only: their CBC suites are not decrypted); null when not seen"),
    Column("tls_cipher", "string", "the cipher suite the ServerHello chose (OpenSSL or IANA name)"),
    Column("tls_decrypted_bytes", "int64", "TLS bytes decrypted, with the handshake records of a decrypted connection"),
    Column("tls_timed_bytes", "int64", "TLS bytes read as timed records only, with the handshake records of such a "
           "connection"),
    Column("violations", "int64", "protocol violations (packets that do not fit the state machine) and cuts of the "
           "input's budgets (violation_notes: 'budget: …')"),
    Column("violation_notes", "string", "the first few violations, for the curious"),
    Column("close_error", "Int64", "code of an ERR the server sent unprompted before closing (1158: the client left "
           "without COM_QUIT; 4031: idle timeout; 1927: killed); not an exchange, not a violation"),
    Column("closed_by", "string", "client | server: the side whose FIN or RST came first; null when the capture saw "
           "neither"),
    Column("close_ts", TS, "capture time of that first FIN or RST"),
    Column("close_rst", "boolean", "that first close was a RST, not a FIN"),
)


def markdown_table(columns: tuple[Column, ...] | tuple[InputKey, ...]) -> str:
    if columns and isinstance(columns[0], InputKey):
        lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{k.name}` | {k.dtype} | {k.default} | {k.meaning} |" for k in columns]
        return "\n".join(lines)
    lines = ["| column | dtype | meaning |", "|---|---|---|"]
    lines += [f"| `{c.name}` | {c.dtype} | {c.meaning} |" for c in columns]
    return "\n".join(lines)

# One capture point's quality (exchanges.Extraction.quality): `summary.json → captures` (app: [...], db, dbs: [...],
# proxy: [...]) and the summary of `pcapdecomp exchanges`. Every frame and MySQL byte is accounted for: frames =
# frames_tcp + frames_non_ip + frames_non_tcp + frames_ip_fragment + frames_undecodable + frames_unknown_link, and
# frames_tcp = frames_tcp_mysql + frames_tcp_other. `dtype` is the JSON type.
CAPTURE_QUALITY_KEYS: tuple[Column, ...] = (
    Column("file", "string", "the capture point's name (its `capture` in the tables)"),
    Column("format", "string", "pcap | pcap-ns | pcapng (of a point of several files: the first file's)"),
    Column("gzip", "boolean", "the file was gzip-compressed"),
    Column("frames", "int", "packet records read"),
    Column("frames_tcp", "int", "frames that were TCP segments"),
    Column("frames_tcp_mysql", "int", "TCP frames of the MySQL connections (frames_tcp − frames_tcp_other)"),
    Column("frames_tcp_other", "int", "TCP frames of connections that are not MySQL"),
    Column("frames_non_ip", "int", "ARP, LLDP, STP, …"),
    Column("frames_non_tcp", "int", "UDP, ICMP, …"),
    Column("frames_ip_fragment", "int", "IPv4/IPv6 fragments: not reassembled, counted"),
    Column("frames_undecodable", "int", "link, IP or TCP header broken, or cut before the TCP header ends"),
    Column("frames_unknown_link", "int", "frames of a pcapng interface whose link type is not decoded"),
    Column("frames_truncated", "int", "TCP frames whose payload the snaplen cut (also in frames_tcp)"),
    Column("frames_bad_ts", "int", "frames whose timestamp was impossible or out of line: given a neighbour's"),
    Column("if_drops", "int", "packets the capturing interfaces dropped (pcapng interface statistics)"),
    Column("damaged", "string|null", "why reading stopped before the end, with the byte offset; null: read to the end"),
    Column("unknown_blocks", "int", "pcapng blocks skipped (name resolution, decryption secrets, custom, unknown)"),
    Column("first_ts", "string|null", "time of the first frame in file order, ISO 8601 UTC"),
    Column("last_ts", "string|null", "time of the last frame in file order, ISO 8601 UTC"),
    Column("mysql_connections", "int", "MySQL connections found"),
    Column("midstream_connections", "int", "of them, begun before the capture (no handshake seen)"),
    Column("tls_connections", "int", "of them, switched to TLS"),
    Column("tls_decrypted_connections", "int", "of the TLS connections, decrypted with the key log"),
    Column("tls_timed_connections", "int", "of the TLS connections, timed by their records (no key log for them)"),
    Column("tls_unreadable_connections", "int", "of the TLS connections, neither decrypted nor timed"),
    Column("exchanges", "int", "exchanges read"),
    Column("gaps", "int", "holes in the MySQL byte streams (bytes never captured)"),
    Column("gaps_forced", "int", "of them, declared because a cap on held out-of-order data bit"),
    Column("gap_bytes", "int", "bytes never captured"),
    Column("retransmitted_bytes", "int", "duplicate bytes dropped by reassembly"),
    Column("mysql_bytes", "int", "stream bytes the MySQL parser read"),
    Column("unparsed_bytes", "int", "bytes skipped while resynchronising (mid-stream start, after a gap or a violation)"),
    Column("tls_bytes", "int", "bytes after a switch to TLS"),
    Column("tls_decrypted_bytes", "int", "of them, decrypted with the key log"),
    Column("tls_timed_bytes", "int", "of them, read as timed records without their content"),
    Column("tls_unreadable_bytes", "int", "of them, neither (tls_bytes − decrypted − timed)"),
    Column("violations", "int", "protocol violations (packets that do not fit the state machine) and cuts of the "
           "input's budgets (violation_notes: 'budget: …')"),
    Column("out_of_range", "int", "exchanges with a number out of range (problems: out-of-range)"),
    Column("retransmission_conflicts", "int", "exchanges two of whose copies on the wire differed (problems: retransmission-conflict)"),
    Column("other_tcp_bytes", "int", "TCP payload bytes of connections that are not MySQL"),
    Column("understood_share", "float|null", "(mysql_bytes + tls_decrypted_bytes + tls_timed_bytes) / (mysql_bytes + "
           "gap_bytes + unparsed_bytes + tls_bytes): the share of the MySQL byte streams read (TLS ones decrypted or "
           "timed); null without MySQL bytes"),
)

# Quality keys that say something was lost or could not be read when they are not 0: the terminal warns with these
# words, in this order (`damaged` in its own words, and "no MySQL traffic found" when nothing was), and report.html
# marks them, with damaged, midstream_connections and tls_connections (not a loss, but the report shows them).
CAPTURE_PROBLEM_WORDS: tuple[tuple[str, str], ...] = (
    ("frames_truncated", "frames cut by the snaplen"), ("frames_ip_fragment", "IP fragments"),
    ("frames_bad_ts", "frames with a broken timestamp (given a neighbour's)"),
    ("frames_undecodable", "undecodable frames"), ("frames_unknown_link", "frames of unknown link types"),
    ("if_drops", "packets dropped by the capturing interface"), ("unknown_blocks", "unknown pcapng blocks"),
    ("gaps", "gaps in TCP streams"), ("gaps_forced", "of them declared by the out-of-order memory cap"),
    ("gap_bytes", "bytes never captured"),
    ("unparsed_bytes", "bytes skipped while resynchronising"), ("tls_unreadable_bytes", "encrypted (TLS) bytes neither decrypted nor timed"),
    ("violations", "protocol violations or budget cuts"), ("out_of_range", "exchanges with a number out of range"),
    ("retransmission_conflicts", "exchanges whose retransmitted copies differed (the first copy read)"),
)
CAPTURE_PROBLEM_KEYS = frozenset([k for k, _ in CAPTURE_PROBLEM_WORDS]
                                 + ["damaged", "midstream_connections", "tls_connections",
                                    "tls_unreadable_connections"])


# The slow log as a table (pcapdecomp/slowlog/reader.py read_slow_log): one row per entry, joined to the exchanges by
# pcapdecomp/slowlog/join.py (docs/slowlog.md).
SLOWLOG_COLUMNS: tuple[Column, ...] = (
    Column("line", "int64", "1-based line of the entry's first header line"),
    Column("time", "datetime64[ns, UTC]", "'# Time:' (own or inherited): MySQL end of statement, MariaDB start second"),
    Column("time_meaning", "string", "what `time` marks: end (ISO times; YYMMDD of MySQL/Percona) | start (MariaDB); null when the flavour is unknown"),
    Column("time_precision_ns", "Int64", "resolution of `time`: 1000000000 for whole seconds, 1000 for microseconds"),
    Column("timestamp", "datetime64[ns, UTC]", "'SET timestamp=N;': statement start, whole seconds"),
    Column("start", "datetime64[ns, UTC]", "MySQL 8 log_slow_extra 'Start:' (start of execution)"),
    Column("end", "datetime64[ns, UTC]", "MySQL 8 log_slow_extra 'End:'"),
    Column("user", "string", "login user"),
    Column("host", "string", "client host name"),
    Column("ip", "string", "client address"),
    Column("thread_id", "Int64", "connection id (MySQL 'Id:'/'Thread_id:', MariaDB/Percona 'Thread_id:')"),
    Column("schema", "string", "default database ('Schema:' or 'use db;')"),
    Column("query_time_ns", "Int64", "'Query_time:' in integer ns (execution; excludes thread-pool queueing); null when damaged"),
    Column("query_time_s", "float64", "'Query_time:' in seconds"),
    Column("lock_time_s", "float64", "'Lock_time:' in seconds"),
    Column("rows_sent", "Int64", "'Rows_sent:'"),
    Column("rows_examined", "Int64", "'Rows_examined:'"),
    Column("rows_affected", "Int64", "'Rows_affected:' (MariaDB, Percona)"),
    Column("bytes_sent", "Int64", "'Bytes_sent:'"),
    Column("errno", "Int64", "'Errno:' (MySQL 8 log_slow_extra) or 'Last_errno:' (Percona)"),
    Column("killed", "Int64", "'Killed:' (0: not killed)"),
    Column("admin_command", "string", "'# administrator command: X;' -> X (sql is then empty)"),
    Column("sql", "string", "statement text without the 'use'/'SET timestamp' prefix lines and the final ';'"),
    Column("cut", "bool", "the statement text is incomplete (log cut inside it, or longer than max_sql_bytes)"),
    Column("extra", "object", "dict of every other 'Key: value' pair, verbatim"),
)

def c_header(columns: tuple[Column, ...] = EXCHANGE_COLUMNS) -> str:
    """The exchange row layout for the native fast lane (pcapdecomp/_lane.c), which writes its rows column by
    column: `COL_<NAME>` is the position of each column, `NCOLS` their number, `COLUMN_NAMES` their names in order
    (the lane exports them; read/fastlane.py uses the lane only when they are these). setup.py writes this to
    pcapdecomp/_lane_columns.h before it builds the extension, so the C code names columns and never counts them."""
    lines = ["/* Generated by setup.py from pcapdecomp/core/schema.py (EXCHANGE_COLUMNS, schema.c_header): do not edit, do",
             " * not commit. The exchange row layout the fast lane writes. */",
             "#ifndef PCAPDECOMP_LANE_COLUMNS_H", "#define PCAPDECOMP_LANE_COLUMNS_H", "",
             f"#define NCOLS {len(columns)}"]
    lines += [f"#define COL_{c.name.upper()} {i}" for i, c in enumerate(columns)]
    names = [f'    "{c.name}",' for c in columns]
    lines += ["#define COLUMN_NAMES \\", *(name + " \\" for name in names[:-1]), names[-1].rstrip(",")]
    lines += ["", "#endif", ""]
    return "\n".join(lines)


# Columns the proxy stage (pcapdecomp/pair/proxy.py) adds: how each exchange was paired through a proxy between app and
# DB, and the proxy's share of the time. P1/P4: the request's first / the response's last byte at the proxy's client
# side; P2/P3: the same at its server side (proxy clock, converted to the app clock). All null without a proxy.
PROXY_COLUMNS: tuple[Column, ...] = (
    Column("proxy_match", CATEGORY, "how the exchange was paired through a proxy: l4 (same bytes, TCP sequence numbers translated per connection pair found by the greeting's scramble) | l7-text (same statement text) | l7-rewritten (same text once comments, whitespace, identifier quotes and case are set aside) | l7-params (a prepared statement the proxy ran with the same parameter values: as a text query or re-prepared) | ambiguous (several server-side requests fit: not paired, never guessed) | unmatched (no server-side request fits) | proxy-handled (a command the proxy answers itself: login, PREPARE, CLOSE, PING, INIT_DB, QUIT) | proxy-own (sent by the proxy on its own: no client request) | unseen-at-proxy | unseen-at-app | unpaired; null without a proxy"),
    Column("proxy_candidates", "Int64", "L7: server-side requests that fit this client request (same text, inside its time); 1 when paired, > 1 when ambiguous; null for L4 and without a proxy"),
    Column("front_conn_id", "Int64", "connection id the client saw (from the proxy's greeting); behind an L7 proxy it is the proxy's own, and conn_id is the server connection that ran the statement"),
    Column("proxy_front_req_ts", TS, "P1: request's first byte at the proxy's client side, on the app clock; needs the proxy capture"),
    Column("proxy_back_req_ts", TS, "P2: the same request's first byte leaving at the proxy's server side, on the app clock; null when not paired across the proxy"),
    Column("proxy_back_resp_ts", TS, "P3: response's last byte at the proxy's server side, on the app clock; null when not paired across the proxy"),
    Column("proxy_front_resp_ts", TS, "P4: response's last byte at the proxy's client side, on the app clock"),
    Column("net_app_proxy_s", "float64", "(P1 − A1) + (A4 − P4): both legs between app and proxy, also for exchanges not paired across the proxy; needs the app and proxy captures"),
    Column("proxy_s", "float64", "(P2 − P1) + (P4 − P3): time inside the proxy (waiting for a pooled server connection, parsing, routing, relaying the answer); P4 − P1 for a command the proxy answered itself (proxy-handled); needs the proxy capture; null when not paired across it (ambiguous, unmatched: the proxy's and the DB's time are not told apart)"),
    Column("proxy_wait_s", "float64", "P2 − P1: the request's part of proxy_s, from its arrival at the proxy until the proxy sent it on (a pool's queue shows here)"),
    Column("net_proxy_db_s", "float64", "(D1 − P2) + (P3 − D4): both legs between proxy and DB; needs the proxy and DB captures. With all three captures network_s = net_app_proxy_s + proxy_s + net_proxy_db_s"),
)


# Columns the analysis stage (pcapdecomp/explain/decompose.py) adds to EXCHANGE_COLUMNS. A1/A4 are app-clock capture
# times at the app host, D1/D4 DB-capture times converted to that app clock by the fitted clock model.
ANALYSIS_COLUMNS: tuple[Column, ...] = (
    Column("seen", CATEGORY, "both | app | db: the capture points that saw the exchange (foundation columns come from the app side when seen there)"),
    Column("match_notes", CATEGORY, "comma-separated: match-conflict (same request bytes, different command/text/response end: not paired); match-ambiguous (the connection's twin at the other point could not be told from others that look the same: not paired); lost-at-app|db (the other point saw this connection before and after, and missed this exchange: capture loss); response-unseen-at-app|db; response-incomplete-at-app|db (that point did not see the response's end); repaired-at-app|db (bytes of this exchange that point lost were taken from the other point: see bounded)"),
    Column("db_client", CATEGORY, "client endpoint as seen at the DB (differs from client behind NAT)"),
    Column("conn_id_source", CATEGORY, "where conn_id comes from, as in the connections table: greeting | connection_id_answer | processlist | slowlog; null when conn_id is unknown"),
    Column("db_req_first_frame", "Int64", "frame number of the request's first byte in the DB capture"),
    Column("db_resp_last_frame", "Int64", "frame number of the response's last byte in the DB capture"),
    Column("app_req_ts", TS, "A1: request's first byte at the app host (app clock)"),
    Column("app_resp_ts", TS, "A4: response's last byte at the app host (app clock)"),
    Column("db_req_ts", TS, "D1: request's first byte at the DB host, on the app clock"),
    Column("db_resp_ts", TS, "D4: response's last byte at the DB host, on the app clock"),
    Column("total_s", "float64", "A4 - A1: what the client waited, seconds"),
    Column("server_s", "float64", "D4 - D1 measured on the DB clock, skew-corrected: time inside the DB host"),
    Column("network_s", "float64", "total_s - server_s: both network legs (independent of the clock offset)"),
    Column("net_req_s", "float64", "D1 - A1: request leg, after clock alignment (depends on the offset estimate)"),
    Column("net_resp_s", "float64", "A4 - D4: response leg; net_req_s + net_resp_s = network_s"),
    Column("bounded", CATEGORY, "comma-separated A1, A4, D1, D4: the points whose time is only bounded (their bytes were lost at that point and taken from the other one, or the response's end was not seen there); those times and the durations that depend on them are null, their bounds are in *_lo/*_hi; null when all four are measured"),
    Column("total_s_lo", "float64", "lower bound of total_s where it is null because A1 or A4 is bounded (null when unknown)"),
    Column("total_s_hi", "float64", "upper bound of total_s, likewise"),
    Column("server_s_lo", "float64", "lower bound of server_s where it is null because D1 or D4 is bounded; queue_s then lies in [server_s_lo - exec_s, server_s_hi - exec_s]"),
    Column("server_s_hi", "float64", "upper bound of server_s, likewise"),
    Column("network_s_lo", "float64", "lower bound of network_s where it is null because a point is bounded"),
    Column("network_s_hi", "float64", "upper bound of network_s, likewise"),
    Column("pipelined_s", "float64", "D1 up to the answer of the same connection's previous request (a client that pipelines: it sent this one before that answer): waiting in the connection, not the pool: never queueing, never a stall; exec_s and queue_s split server_s − pipelined_s; 0 when not pipelined, null without server time"),
    Column("exec_s", "float64", "execution time: the slow log's Query_time, else an estimate (see exec_source); null when only bounded (exec_source below_long_query_time: at most server_s − queue_min_s) or unknown"),
    Column("exec_source", CATEGORY, "slow_log | fingerprint_median (estimate from ≥ 5 runs of the same command and fingerprint: its server time when within their usual range, else their median; the runs are those that overlapped no long statement, or ≥ 5 agreeing fast ones) | below_long_query_time (known faster than long_query_time, nothing better known: exec_s is null, execution at most min(server_s, long_query_time)) | flagged_slow (SERVER_QUERY_WAS_SLOW without a slow-log entry: exec_s = server_s, an upper bound); null when unknown"),
    Column("queue_s", "float64", "server_s - pipelined_s - exec_s, at least 0: waiting before execution (thread-pool queue); how it is known: queue_source"),
    Column("queue_source", CATEGORY, "measured (exec_s is the slow log's Query_time) | estimated (exec_s is a fingerprint_median estimate: queue_s is an estimate, queue_min_s is what is certain) | lower_bound (execution only bounded: queue_s = queue_min_s, a lower bound) | likely (server_s far above its statement's typical execution while a long statement executed on its thread group, or on the server when thread groups are unknown: queue_s = server_s − the typical execution, told as likely; queue_min_s is what is certain); null when queue_s is null"),
    Column("queue_min_s", "float64", "queueing that is certain, never from an estimate: queue_s when measured; server_s minus an upper bound on execution (long_query_time for a statement known faster than it) otherwise; 0 when nothing bounds execution; null without server time. Claims of queueing (verdict, stalls, understated) rest on this column"),
    Column("in_slow_log", "boolean", "joined to a slow-log entry; null when no usable slow log, or when the exchange may be the partner of an entry that could not be joined (undecided)"),
    Column("slow_log_line", "Int64", "line of the joined slow-log entry"),
    Column("hidden_slow", "boolean", "server_s > long_query_time, yet not in the slow log and not flagged SERVER_QUERY_WAS_SLOW: slow before execution; null without the evidence or when undecided (see in_slow_log)"),
    Column("understated", "boolean", "in the slow log, yet it waited ≥ 0.1 s before executing (measured: server_s − Query_time): the slow log understates what the client waited; null without a usable slow log"),
    Column("thread_group", "Int64", "conn_id mod thread_pool_size (MariaDB/Percona thread pool group); the size given, else the one inferred from the wire (summary.json → thread_pool_size)"),
    Column("stall", "Int64", "id of the stalled stretch (summary.json → groups.stalls[].id) this exchange queued in (stall_role victim) or held by executing through it (culprit); null otherwise"),
    Column("stall_role", CATEGORY, "victim (queued ≥ 0.1 s, certain, in the stalled stretch) | culprit (executed through at least a quarter of it, in the same group); null when not part of a stall"),
    *PROXY_COLUMNS,
    Column("db_point", CATEGORY, "the DB capture point (server) of the exchange: the one that saw it; for an exchange only the app saw, the one its server endpoint leads to when exactly one does; null otherwise. With several DB points (a primary and a replica, shards) the decomposition, thread groups and stalls are each point's own: a stall id is unique within its db_point (summary.json → servers[])"),
)


# groups.parquet: one row per thread group and time bucket (pcapdecomp/explain/decompose.py group_view). Times are DB-side
# request times on the app clock (db_req_ts … db_resp_ts), so queueing lines up with the exchanges table.
GROUP_COLUMNS: tuple[Column, ...] = (
    Column("thread_group", "int64", "conn_id mod thread_pool_size"),
    Column("bucket_start", TS, "start of the time bucket"),
    Column("bucket_s", "float64", "bucket length, seconds (the smallest of 10 ms, 100 ms, 1 s, 10 s, 1 min, 10 min, 1 h, 1 day giving ≤ 1000 buckets over the capture's robust span, then whole days)"),
    Column("in_flight", "float64", "mean number of the group's exchanges between D1 and D4 during the bucket"),
    Column("executing", "float64", "mean number executing (between D4 − exec_s and D4)"),
    Column("queued", "float64", "mean number queued (between D1 and D1 + queue_s)"),
    Column("queue_s", "float64", "queue seconds spent inside the bucket, summed over the group's exchanges"),
    Column("started", "int64", "exchanges whose D1 falls in the bucket"),
    Column("max_queue_s", "float64", "largest queue_s of the exchanges started in the bucket; null when none started"),
    Column("db_point", CATEGORY, "the DB capture point (server) whose thread group this is"),
)


# pool.parquet: one row per time bucket for the whole server (every thread group together), from D1/D4 and
# exec_s/queue_s of every exchange seen at the DB. It does not need thread_pool_size: a pool at
# thread_pool_max_threads shows as `executing_max` flat at the cap while `queued_max` > 0.
POOL_COLUMNS: tuple[Column, ...] = (
    Column("bucket_start", TS, "start of the time bucket (app clock, like groups.parquet)"),
    Column("bucket_s", "float64", "bucket length, seconds (as in groups.parquet)"),
    Column("in_flight", "float64", "mean number of exchanges between D1 and D4 during the bucket"),
    Column("executing", "float64", "mean number executing (between D4 − exec_s and D4; exec_s of any exec_source)"),
    Column("queued", "float64", "mean number queued (between D1 and D1 + queue_s; queue_s of any queue_source)"),
    Column("executing_min", "int64", "fewest statements executing at any instant of the bucket"),
    Column("executing_max", "int64", "most statements executing at any instant of the bucket"),
    Column("queued_max", "int64", "most statements queued at any instant of the bucket (queue_s of any source)"),
    Column("queued_certain_max", "int64", "most statements queued at any instant, counting only certain queueing (D1 … D1 + queue_min_s)"),
    Column("started", "int64", "exchanges whose D1 falls in the bucket"),
    Column("db_point", CATEGORY, "the DB capture point (server) of the row: each DB point's pool has its own rows"),
)


# summary.json, every key, in the file's order: `a.b` is key b of object a, `*` any key of an object (a point's or a
# component's name). An object whose members are not declared on their own lists them in its meaning. `dtype` is
# the JSON type; a `ref` is an exchange reference: {capture, conn_index, seq} (the key of its row in
# exchanges.parquet) with conn_id, thread_group, query_id, command, sql (≤ 200 characters), app_req_ts, db_req_ts,
# total_s, server_s, exec_s, exec_source, queue_s, queue_source, queue_min_s, in_slow_log (null where the table's is: no usable slow log, or undecided).
SUMMARY_KEYS: tuple[Column, ...] = (
    Column('set', 'string', "name of the capture set (its folder's name, else the first capture's)"),
    Column('verdict', 'string', "the verdict as the terminal prints it: tls.sentence when there is TLS, story.sentence, then one line '- …' per story.bullets[].text"),
    Column('pcapdecomp', 'string', 'version that wrote the analysis'),
    Column('inputs.app', 'list[string]', "every app point's name (its `capture` in the tables)"),
    Column('inputs.db', 'string|null', "the first DB point's name"),
    Column('inputs.dbs', 'list[string]', "every DB point's name (inputs.db: the first)"),
    Column('inputs.slow_log', 'string|null', "the first DB point's slow log"),
    Column('inputs.slow_logs', 'object', 'DB point name -> its slow log (inputs.slow_log: the first)'),
    Column('inputs.tls_keylogs', 'list[string]', 'the TLS key logs given (--tls-keylog, or the folder\'s tls-keys.log); the evidence command reads them again'),
    Column('inputs.long_query_time', 'float|null', 'long_query_time in seconds (capture.toml or --long-query-time); null: unknown'),
    Column('inputs.thread_pool_size', 'int|null', 'thread_pool_size as given (capture.toml or --thread-pool-size)'),
    Column('inputs.servers', 'list[string]', 'the DB server endpoints given (--server, capture.toml [server] address); empty: found by content'),
    Column('inputs.proxy', 'list[string]', "every proxy point's name"),
    Column('inputs.proxy_servers', 'list[string]', "the proxy's listening endpoints, when known (--proxy-server, capture.toml [proxy] address)"),
    Column('inputs.cwd', 'string', 'the working folder of the run: relative capture paths (here and in exchanges.capture) are relative to it'),
    Column('inputs.scheduler', 'string|null', 'the Dask scheduler the captures were read on (--scheduler), null: this machine'),
    Column('inputs.processlist', 'string|null', "the processlist snapshot read for connection ids (--processlist, the folder's processlist*.tsv|txt, capture.toml [captures] processlist); null: none"),
    Column('window', 'object', "analyze --since/--until only: the time window analysed, {since, until (ISO 8601, UTC; null: an open end), decided_by (req_first_ts: an exchange is kept when its request's first byte is in [since, until), each point by its own clock), margin_s (the clock's samples and the holes the repair fills are taken this far beyond each end)}"),
    Column('points', 'list[object]', "every capture point in reading order: {name (its `capture` in the tables), kind (app | db), given (the file, glob or folder as given), files: [{file, format, gzip, bytes, frames, first_frame (its first frame's number in the point: frames are numbered through a point's files), first_ts, last_ts, damaged, gap_s (time from the previous file's last frame; negative: an overlap; null for the first), skipped (empty file: not read)}], gaps (gaps between files that were warned about), overlaps, missing_numbers (rotation numbers absent from the files' sequence), servers (a DB point's server endpoints)}"),
    Column('captures.app', 'list[object]', 'capture quality of every app point (`pcapdecomp columns quality`)'),
    Column('captures.db', 'object|null', 'capture quality of the first DB point'),
    Column('captures.dbs', 'list[object]', 'capture quality of every DB point (captures.db: the first)'),
    Column('captures.proxy', 'list[object]', 'capture quality of every proxy point'),
    Column('match.app_exchanges', 'int', 'exchanges read at the app point(s)'),
    Column('match.db_exchanges', 'int', 'exchanges read at the DB point(s)'),
    Column('match.matched', 'int', 'exchanges paired across the points (seen = both)'),
    Column('match.app_only', 'int', 'exchanges only the app side saw'),
    Column('match.db_only', 'int', 'exchanges only the DB side saw'),
    Column('match.conflicts', 'int', 'same connection and request bytes, but command, text or response end disagree: not paired'),
    Column('match.connections_matched', 'int', 'connections paired across the points'),
    Column('match.connections_by_scramble', 'int', "of them, confirmed by the greeting's scramble"),
    Column('match.connections_nat', 'int', 'of them, with a client endpoint that differs between the points (NAT)'),
    Column('match.connections_vetoed', 'int', 'candidate connection pairs refused: different scramble or connection id'),
    Column('match.connections_ambiguous', 'int', 'connections left unpaired: two partners at the other point scored the same'),
    Column('match.ambiguous_keys', 'int', 'keys shared by more than 4 connections at one point (they vote only with endpoints)'),
    Column('match.candidates', 'int', 'candidate rows the joins produced (the work done; linear in exchanges and connections)'),
    Column('proxy', 'object|null', "through a proxy (`--proxy`, or app and DB exchanges that pair only through one): {kind (l4 | l7), points, sides: {decided_by, …} (how the proxy capture was split into its client and server side), through (pairing across the proxy: counts per proxy_match), app_proxy, proxy_db (each hop's matching and clocks), clocks (app_db: offset and bounds from the order of paired statements), exchanges, sentence (the verdict's line)}; null without a proxy"),
    Column('repair', 'object|null', 'capture loss repaired from the other point: {connections (re-read), holes, pieces, bytes_borrowed, bytes_unrepaired (lost at both points), skipped_wrap, exchanges_replaced, exchanges_repaired, exchanges_with_borrowed, bounded_times}; when it was not done (a pair too big for the memory bound in memory, analysed partitioned) {skipped: true, reason, lossy_points, connections, holes, bytes_unrepaired}; null when no point had holes, or only one point was given'),
    Column('clock', 'object|null', "the first clock (`clocks`' first entry): {app, db, offset_s (DB − app at the DB capture's first packet), skew_ppm, offset_bounds_s: [lo, hi], samples: {forward, reverse}, excluded, segments (clock steps + 1), quality, duplicates_dropped, segments_read: {app, db}}; null without both sides"),
    Column('clocks.*', 'object', 'one clock per app point (and DB point, with several): the same keys as `clock`; empty through a proxy (its clocks are in proxy.clocks)'),
    Column('clocks.*.app', 'string', "the app point of this clock; with several DB points `clocks` is keyed 'APP ↔ DB' (one clock per app point and DB point that share connections)"),
    Column('clocks.*.db', 'string', 'the DB point of this clock'),
    Column('slow_log.file', 'string|null', 'the slow log read; null: none given'),
    Column('slow_log.used', 'boolean', 'the slow log was read and joined'),
    Column('slow_log.flavor', 'string', 'mysql | mariadb | percona | unknown (docs/slowlog.md)'),
    Column('slow_log.unparsed_lines', 'int', 'lines the parser could not place'),
    Column('slow_log.cut_entries', 'int', 'entries whose statement text is incomplete'),
    Column('slow_log.damaged_values', 'int', 'header values that could not be read (counted, left null)'),
    Column('slow_log.capped_statements', 'int', 'statements longer than --max-sql-bytes, cut'),
    Column('slow_log.wire_sql_entries', 'int', 'header blocks read as SQL: they lie inside a statement the capture shows (a forged entry)'),
    Column('slow_log.unverified_entries', 'int', 'entries that may begin inside a statement the capture shows cut: the slow log disagrees with the wire and names no culprit'),
    Column('slow_log.entries', 'int', 'entries read'),
    Column('slow_log.entries_in_capture_window', 'int', "entries inside the captures' time span"),
    Column('slow_log.matched', 'int', 'entries joined to an exchange'),
    Column('slow_log.unmatched_in_capture_window', 'int', 'entries inside the span joined to none'),
    Column('slow_log.joined_by', 'object', '{order, unique, inferred}: how the joined entries were placed (docs/slowlog.md)'),
    Column('slow_log.joined_on', 'object', '{text, params, template, prefix, command, time}: what the joined entries agreed on with their exchange (time: '
           'a TLS exchange without a key log, joined by its connection, time and order alone)'),
    Column('slow_log.unjoined', 'object', '{reason: count} of the entries joined to none (reasons in docs/slowlog.md)'),
    Column('slow_log.connections_identified', 'int', 'capture connections tied to a slow-log thread id'),
    Column('slow_log.exchanges_with_several_entries', 'int', 'exchanges that more than one entry fitted'),
    Column('slow_log.exchanges_undecided', 'int', 'exchanges that may or may not be in the slow log'),
    Column('slow_log.exchanges_of_unlogged_commands', 'int', 'exchanges of commands the slow log does not show'),
    Column('slow_log.undecided_search_cut', 'int', 'searches cut by the bound on candidates (counted, never guessed)'),
    Column('slow_log.unjoined_examples', 'list[object]', 'up to 20: {line, reason, thread_id, query_time_s, sql (≤ 200 characters)}'),
    Column('exchanges.total', 'int', 'rows of exchanges.parquet'),
    Column('exchanges.seen_both', 'int', 'exchanges both points saw'),
    Column('exchanges.seen_app', 'int', 'exchanges only the app point saw'),
    Column('exchanges.seen_db', 'int', 'exchanges only the DB point saw'),
    Column('exchanges.hidden_slow', 'int', 'exchanges with hidden_slow true'),
    Column('exchanges.in_slow_log', 'int', 'exchanges joined to a slow-log entry'),
    Column('exchanges.server_flag_slow', 'int', 'exchanges whose final status flags had SERVER_QUERY_WAS_SLOW'),
    Column('exchanges.match_conflicts', 'int', 'exchanges with match-conflict in match_notes'),
    Column('exchanges.repaired', 'int', 'exchanges with bytes taken from the other point (repaired-at in match_notes)'),
    Column('exchanges.bounded', 'int', 'exchanges with a time that is a bound, not a measurement (bounded)'),
    Column('conn_ids', 'object', 'connections (capture, conn_index) of exchanges.parquet by where their conn_id comes from: {greeting, connection_id_answer, processlist, slowlog, unknown} (docs/connection-ids.md)'),
    Column('latency_s.*', 'object|null', 'per component (total, server, network, net_req, net_resp, queue, exec: the *_s columns): {count, sum, p50, p99, max} in seconds; null when no exchange has it'),
    Column('thread_pool_size.value', 'int|null', 'the N thread groups are computed with (given, else inferred when certain or likely); null: no groups'),
    Column('thread_pool_size.source', 'string|null', 'given (capture.toml or --thread-pool-size) | inferred; null when unknown'),
    Column('thread_pool_size.given', 'int|null', 'the value given, if any'),
    Column('thread_pool_size.inferred', 'object', '{value (int|null), confidence: certain | likely | not enough evidence, candidates: [N…] explaining as many queued statements, victims (statements with certain or likely queueing ≥ 0.1 s considered), explained (of them, with a long statement executing meanwhile on conn_id mod value), contradicted (statements that passed freely meanwhile on that group), checked_up_to, note}'),
    Column('thread_pool_size.stalls_without_culprits', 'int', 'stalled stretches for which no statement of the group executed long enough: a sign of a wrong thread_pool_size'),
    Column('thread_pool_size.warning', 'string|null', 'set when the given value leaves stalls without culprits, or disagrees with a certain inference'),
    Column('pool.bucket_s', 'float|null', 'bucket length of pool.parquet'),
    Column('pool.max_executing', 'int', 'most statements executing at once anywhere in the capture'),
    Column('pool.cap', 'object|null', 'the pool at thread_pool_max_threads, inferred from the wire: {threads (the cap: the most statements ever executing at once), start, end (first and last wait), duration_s (time at the cap while statements certainly waited), stretches, waiting (statements that certainly waited), max_wait_s, total_wait_s, wait_source (measured | lower_bound | both, comma-separated), executing: [ref…≤ 20] (executing through the waits), executing_total, waiting_refs: [ref…≤ 20]}; null when no such stretch'),
    Column('pool.outliers', 'object', "{exchanges: count of exchanges left out of pool/groups buckets because their times lie far outside the capture's robust span, span_start, span_end}"),
    Column('groups.bucket_s', 'float|null', 'bucket length of groups.parquet'),
    Column('groups.stall_limit', 'object|null', 'what the capture shows of thread_pool_stall_limit: {relieved (stalls whose waiting statements were let go at once while their culprit still executed: the pool woke another worker), of_stalls, min_s, max_s (from the culprit\'s start to the release), stall_limit_at_most_s (the shortest relief: the timer finds a group stalled one to two stall limits after it stopped)}; null when no stall was relieved so'),
    Column('groups.stalls', 'list[object]', 'stalled stretches in start order: {id, thread_group, start, end, duration_s, queued, max_queue_s (queue_s, any source), max_queue_certain_s (queue_min_s), queue_sources: {measured, estimated, lower_bound, likely} (victims per queue_source), hidden_slow, understated (victims of each kind), culprits: [ref + overlap_s, ≤ 5, longest overlap first], culprits_total, culprits_more}'),
    Column('warnings', 'list[string]', 'every warning of the run, as the terminal printed them'),
    Column('tls', 'object|null', 'how the TLS connections were read (counted at the DB points, else the app points, '
           'else the proxy); null without TLS'),
    Column('tls.connections', 'int', 'TLS connections'),
    Column('tls.of', 'int', 'MySQL connections at those points'),
    Column('tls.decrypted', 'int', 'of the TLS connections, decrypted with the key log'),
    Column('tls.timed', 'int', 'of the TLS connections, read as timed flights without their content'),
    Column('tls.unreadable', 'int', 'of the TLS connections, neither'),
    Column('tls.bytes', 'object', '{decrypted, timed, unreadable}: their bytes after the switch to TLS'),
    Column('tls.sentence', 'string', "the verdict's first line: '12 of 14 connections are TLS: …'"),
    Column('queueing', 'object', '{measured_s, estimated_s, lower_bound_s, likely_s, certain_s}: queue_s summed by queue_source over exchanges seen at both points, and queue_min_s summed'),
    Column('hidden_slow', 'object', '{count, listed, more, by_stall: [{stall (id|null), thread_group, culprits: [ref…], victims: [ref…]}]}: hidden-slow statements grouped by the stall they queued in (stall null: none found), slowest first, up to 50 listed'),
    Column('understated', 'object', '{count, threshold_s, listed, more, by_stall: [same shape as hidden_slow]}: statements in the slow log that measurably queued ≥ threshold_s'),
    Column('story.sentence', 'string', 'one sentence: the most important thread-pool finding with its measured numbers'),
    Column('story.findings', 'list[string]', "what was found, the sentence's first: proxy_queue (through a proxy with its capture: statements waited 100 ms or more inside the proxy, longer in all than any certain queueing in the DB; the DB's own sentence follows as the first bullet, topic db) | max_threads | group_stall | queueing_unexplained (certain queueing, no culprit found) | likely_group_stall (no certain queueing, but statements likely waited behind a long statement of their thread group: queue_source likely) | likely_queueing (likely waits while a long statement executed on the server, thread groups unknown) | idle | undecided (no long_query_time, or neither a slow log nor the wire flag: queueing cannot be told from execution) | no_server_view | no_exchanges; then understated and hidden_slow when there are such statements, and slow_log_disagrees (entries the capture cannot check: no culprit is named from the slow log); network (network took half the clients' time or more: it leads, the pool's sentence follows as the first bullet, topic db) or connection_churn (setting connections up cost more than the statements and no pool story: it leads likewise) or refused (logins refused with ERR 1040 and no pool story: it leads likewise) may come first; connection_churn, idle_closes, refused and retransmissions follow when found (pcapdecomp/explain/stories.py)"),
    Column('story.bullets', 'list[object]', 'details below the sentence: {topic, text}; topic is one of db (through a proxy whose queue leads: the DB’s own sentence), cap, stall, understated, hidden_slow, thread_pool_size, stall_limit (what the capture shows of thread_pool_stall_limit), split, estimates, counts, clock, outliers, proxy (through a proxy: summary.proxy.sentence), slow_log (the slow log disagrees with the capture, or header blocks read as SQL), pipelined (requests sent before the previous answer), connections (churn, idle closes, who closed, refusals), network (by client host, retransmissions)'),
    Column('servers', 'list[object]', "with several DB points only, one per DB point (server) in order: {point, name (--server NAME=… or the point's folder/file name), endpoints, exchanges, slow_log, thread_pool_size, pool, groups, story, verdict, hidden_slow, understated, queueing}, each of the same shape as the top-level key, computed from that server's exchanges alone; the top-level keys are the first DB point's, and the verdict adds one line per other server"),
    Column('connections', 'object|null', "the connection story of the capture point the exchanges come from (the app's when there is one): {connections (in the table), new (handshakes seen: SYN or greeting → login OK), span_s (first to last frame of them), new_per_s, statements (exchanges but COM_QUIT), statements_per_s, setup_sum_s / setup_median_s / setup_max_s (handshake_s: what setting connections up cost the clients), statements_sum_s (the statements' wire time summed), open_max and open_max_at (most connections open at once, and when), open_series ([{t, open}], ≤ 200 samples of open connections over time), closes: {client_quit (the client sent COM_QUIT), client_fin_rst (the client's FIN or RST came first, no COM_QUIT), server (the server's FIN or RST came first), open (no close seen)}, idle_closes: {count (closed by the server), measured, idle_min_s / idle_median_s / idle_max_s (from the last answered response to the server's close), failed (of them, connections with a statement after the close, or unanswered at it: the client's 'server has gone away'), steady (the idle times agree within ±10 % or 100 ms: one timer, wait_timeout)}, refused (ERR 1040 Too many connections)}; null without a connections table"),
    Column('network', 'object|null', "the network story: {network_s (network_s summed over exchanges seen at both points), clients_s (their total_s summed), share, hosts: [{host, exchanges, network_s, share_of_network, network_share_of_its_time}] (by client host, most network first, ≤ 10), hosts_total, connections: [{capture, conn_index, conn_id, host, exchanges, network_s}] (≤ 10, most network first), retransmitted_bytes (duplicate bytes TCP reassembly dropped, these connections), retransmitting_connections, rto_stalls_likely (exchanges with ≥ 200 ms of network on a connection that retransmitted), rto_stalls: [{capture, conn_index, conn_id, client, sent (A1, ISO), sql (≤ 200 characters), command, network_s}] (those exchanges, most network first, ≤ 10)}; null without exchanges seen at both points"),
    Column('playbook', 'list[object]', "what to change: {finding (network (not a setting: the path to look at, when network leads) | stall_limit | oversubscribe | max_threads | proxy_pool | thread_cache | wait_timeout | max_connections), text (the suggestion with the measured numbers it rests on), sql (the statement that makes the change, or that fetches an unknown setting; null: none)}, from capture.toml beside the captures (pcapdecomp report --server-vars: from SHOW GLOBAL VARIABLES)"),
)


# `analyze --partitioned`: exchanges/host=…/capture=…/part-N.parquet (pcapdecomp/core/dataset.py) holds the columns of
# exchanges.parquet (capture in the path) and these.
DATASET_COLUMNS: tuple[Column, ...] = (
    Column("host", "string", "the capture point the row's foundation columns come from (its `capture`), as a short "
           "name: its folder's name (app-web1, db-replica) or its file's name without the capture suffixes (app for "
           "app.pcap); a partition key of the dataset, with `capture`"),
)


# comparison.parquet (`pcapdecomp compare`, pcapdecomp/compare.py): one row per analysis (step) and per scope, key
# and metric, in long form so that any number of analyses fits one declaration. Changes are against step 0, the first
# analysis named (the "before"), as an incident's fix is reported: each step against the state before any change.
COMPARISON_COLUMNS: tuple[Column, ...] = (
    Column("scope", CATEGORY, "overall (every exchange of the analysis) | component (the exchanges where that component is known) | thread_group | query_id"),
    Column("key", "string", "all (overall) | network, queueing, queueing_certain, execution, and through a proxy with its capture inside_the_proxy (proxy_s) and proxy_wait (proxy_wait_s) (component) | the thread group number (thread_group) | the Query ID (query_id)"),
    Column("fingerprint", "string", "pt-fingerprint of the Query ID (query_id rows; statement text from the capture); null otherwise"),
    Column("metric", CATEGORY, "what value counts or measures: calls, slow_wire, hidden_slow, in_slow_log, understated, sum_s, p50_s, p95_s, p99_s, max_s (the metrics table)"),
    Column("step", "int64", "position of the analysis on the command line, from 0 (the baseline every change is measured against)"),
    Column("analysis", "string", "name of the analysis (its capture set), as in comparison.json → analyses"),
    Column("value", "float64", "the metric in this analysis; 0 for counts when the key did not occur in it; null when not known (no slow log: in_slow_log, understated; no long_query_time: hidden_slow; no thread groups: thread_group rows; no value: percentiles)"),
    Column("per_second", "float64", "value / the analysis's span_s (comparison.json → analyses), for counts and sums: rates that stay comparable when the captures differ in length; null for percentiles"),
    Column("per_call", "float64", "value / calls of the same scope, key and step, for counts other than calls (a share) and sum_s (the mean); null otherwise"),
    Column("change", "float64", "value − the baseline's (step 0) value; null at step 0 or when either is null"),
    Column("change_pct", "float64", "100 × change / the baseline's value; null when that is 0 or null"),
    Column("per_second_change_pct", "float64", "relative change of per_second against the baseline, in %"),
    Column("per_call_change_pct", "float64", "relative change of per_call against the baseline, in %"),
)

# The metrics of comparison.parquet. "Wire time" is what the client waited: total_s (A4 − A1) where the app capture
# saw the exchange, else server_s (D4 − D1), else response_s of the one capture.
COMPARISON_METRICS: tuple[Column, ...] = (
    Column("calls", "float64", "exchanges (overall, thread_group, query_id; every command, logins included); exchanges where the component is known (component)"),
    Column("slow_wire", "float64", "exchanges whose wire time exceeds the slow threshold (--slow, default 0.1 s)"),
    Column("hidden_slow", "float64", "exchanges with hidden_slow true (slower than long_query_time inside the server, not in the slow log, not flagged slow); null when the analysis could not decide"),
    Column("in_slow_log", "float64", "exchanges joined to a slow-log entry; null without a usable slow log"),
    Column("understated", "float64", "exchanges in the slow log that waited ≥ 0.1 s before executing; null without a usable slow log"),
    Column("sum_s", "float64", "wire time summed (overall, thread_group, query_id) or the component's seconds summed (component)"),
    Column("p50_s", "float64", "median wire time (component: of the component)"),
    Column("p95_s", "float64", "95th percentile, as p50_s"),
    Column("p99_s", "float64", "99th percentile, as p50_s"),
    Column("max_s", "float64", "largest, as p50_s"),
)

# comparison.json keys (`pcapdecomp compare`).
COMPARISON_KEYS: tuple[Column, ...] = (
    Column("pcapdecomp", "string", "version that wrote the comparison"),
    Column("slow_threshold_s", "float", "wire time above which an exchange counts as slow_wire (--slow)"),
    Column("analyses", "list[object]", "in step order: {step, name, folder (the analysis folder), analysed_here (a capture set analysed by this run, into analyses/ of the output), pcapdecomp (version that wrote it), span_s (capture length: the robust span of the exchanges, else the captures' first to last frame), calls, calls_per_s, capture_points (app, db or both), slow_log (usable: true/false), long_query_time, thread_pool_size, settings (capture.toml [server] beside the captures, null when none), label (the settings in which a later step differs from the baseline, with this one's values, e.g. thread_pool_stall_limit=10: what the page names its columns by; the name when none are known)}"),
    Column("headline", "list[string]", "the lines the terminal prints: slow on the wire, hidden slow, in the slow log, understated, p99 wire time, certain queueing, each from the baseline to every later analysis"),
    Column("sentence", "string", "what the change did in one sentence: slow on the wire and hidden slow from the baseline to each later step, each named by its label"),
    Column("counts", "object", "{slow_wire, hidden_slow, in_slow_log, understated, calls: [value per step, null when unknown]} of the overall scope"),
    Column("comparable", "boolean", "false when a note says the analyses are not comparable (different statement mix, capture points, slow-log availability or long_query_time)"),
    Column("notes", "list[object]", "{kind, severity (info | caution | not comparable), text}: where the captures differ in length, load, capture points, slow log, long_query_time, thread groups, servers, settings or capture quality"),
)


@dataclass(frozen=True, slots=True)
class InputKey:
    """A key of a file the user may write: `name` is "section.key" ("key" at the top, "section" for the table
    itself; a `<point>` part stands for any capture point's name), `dtype` its TOML type (INPUT_TYPES), `default`
    what holds when the key is absent."""

    name: str
    dtype: str
    meaning: str
    default: str = "—"


# The TOML types of input keys, as their readers check them (read/captureset.py).
INPUT_TYPES = ("table", "table of any keys", "string", "strings", "number", "boolean", "file name", "file names",
               "IP:PORT", "IP:PORTs")

# capture.toml: what a capture-set folder says about itself (`pcapdecomp guide` writes one, the lab another). analyze
# reads it (read/captureset.py: explicit options win; a value of the wrong type is a user mistake, a key not
# declared here a warning), and the report's playbook and `compare` read its [server] and [proxy] values.
# "strings", "file names", "IP:PORTs": one or a list of them.
CAPTURE_TOML_KEYS: tuple[InputKey, ...] = (
    InputKey("scenario", "string", "the lab scenario that recorded the set (captures/lab); not read"),
    InputKey("description", "string", "what the set holds, in words; not read"),
    InputKey("recorded_at", "string", "when the lab recorded it (ISO 8601, UTC); not read"),
    InputKey("memory", "string", "the memory the analysis may take, a size like \"8G\" or \"800M\" (as --memory)",
             "80 % of what the machine (or its cgroup's limit) has available at the start"),
    InputKey("server", "table", "the DB server: its endpoints and the settings it ran with (the guide's plan has "
             "the DB host add the server's own values)"),
    InputKey("server.address", "IP:PORT", "the DB server's endpoint (as --server)",
             "the server side of the MySQL connections in the captures"),
    InputKey("server.address_ipv6", "IP:PORT", "the same server's IPv6 endpoint, [IP]:PORT"),
    InputKey("server.more_addresses", "IP:PORTs", "the other DB servers' endpoints (several DB capture points)"),
    InputKey("server.product", "string", "MariaDB, MySQL or Percona Server; not read"),
    InputKey("server.version", "string", "the server's version; not read"),
    InputKey("server.long_query_time", "number", "the slow log's threshold in seconds (as --long-query-time)",
             "unknown: hidden slow is not decided"),
    InputKey("server.thread_handling", "string", "one-thread-per-connection or pool-of-threads (the playbook)"),
    InputKey("server.thread_pool_size", "number", "thread groups of the pool, a whole number ≥ 1 (as "
             "--thread-pool-size)", "inferred from the statements that queued, when they tell it"),
    InputKey("server.thread_pool_max_threads", "number", "the pool's thread_pool_max_threads (the playbook)"),
    InputKey("server.thread_pool_stall_limit", "number", "the pool's thread_pool_stall_limit, ms (the playbook, "
             "compare's labels)"),
    InputKey("server.thread_pool_oversubscribe", "number", "the pool's thread_pool_oversubscribe (the playbook)"),
    InputKey("server.max_allowed_packet", "number", "the server's max_allowed_packet, bytes; not read"),
    InputKey("server.thread_cache_size", "number", "the server's thread_cache_size (the playbook)"),
    InputKey("server.wait_timeout", "number", "the server's wait_timeout, s (the playbook)"),
    InputKey("server.max_connections", "number", "the server's max_connections (the playbook)"),
    InputKey("server.tls", "boolean", "the server offered TLS; not read"),
    InputKey("proxy", "table", "a proxy between the app and the DB server"),
    InputKey("proxy.address", "IP:PORT", "the proxy's endpoint the app connects to (as --proxy-server)",
             "found in the proxy capture's traffic"),
    InputKey("proxy.product", "string", "the proxy's name; not read"),
    InputKey("proxy.version", "string", "the proxy's version; not read"),
    InputKey("proxy.kind", "string", "l4 (forwards connections) or l7 (reads statements); not read"),
    InputKey("proxy.pool_size", "number", "the proxy's pool of server connections (the playbook)"),
    InputKey("app", "table", "the app hosts"),
    InputKey("app.address", "string", "the app host's address; not read"),
    InputKey("app.addresses", "strings", "the app hosts' addresses (the guide); not read"),
    InputKey("captures", "table", "the set's files, named inside its folder (a file outside it is refused)"),
    InputKey("captures.app", "file names", "the app capture points (as --app)",
             "the folder's app*.pcap[ng][.gz] files and app-<host>/ folders"),
    InputKey("captures.db", "file names", "the DB capture points (as --db)",
             "the folder's db*.pcap[ng][.gz] files and db[-<name>]/ folders"),
    InputKey("captures.proxy", "file names", "the proxy capture points (as --proxy)",
             "the folder's proxy*.pcap[ng][.gz] files"),
    InputKey("captures.slow_log", "file names", "the slow logs, one per DB point in their order (as --slow-log)",
             "the folder's slow*.log, or a DB point's folder's own"),
    InputKey("captures.processlist", "file name", "a processlist snapshot (as --processlist)",
             "the folder's processlist*.tsv|txt"),
    InputKey("captures.truth", "file name", "the lab's truth.jsonl (what the tests compare with); not read"),
    InputKey("captures.timestamp_precision", "string", "the time resolution tcpdump was asked for; not read"),
    InputKey("captures.rotate_mb", "number", "the size tcpdump rotated its files at (-C), MB; not read"),
    InputKey("captures.<point>_packets", "number", "packets tcpdump wrote at that capture point; not read"),
    InputKey("captures.dropped_by_kernel", "number", "packets the kernel dropped, as tcpdump counted them; not read"),
    InputKey("workload", "table of any keys", "the lab workload's parameters; not read"),
)


# Every declaration by the name `pcapdecomp columns NAME` prints it under (the docs print the same tables:
# tests/test_schema.py). What writes each: exchanges.parquet (exchanges + analysis, proxy among them),
# `pcapdecomp exchanges --out/--connections` (exchanges, connections), groups.parquet, pool.parquet, summary.json
# (summary; its captures: quality), the slow log as read (slowlog), `compare` (comparison, comparison-metrics,
# comparison-json), `analyze --partitioned` (dataset), `pcapdecomp guide` (capture-toml; analyze reads it).
TABLES: dict[str, tuple[Column, ...] | tuple[InputKey, ...]] = {
    "exchanges": EXCHANGE_COLUMNS,
    "analysis": ANALYSIS_COLUMNS,
    "proxy": PROXY_COLUMNS,
    "groups": GROUP_COLUMNS,
    "pool": POOL_COLUMNS,
    "connections": CONNECTION_COLUMNS,
    "summary": SUMMARY_KEYS,
    "quality": CAPTURE_QUALITY_KEYS,
    "slowlog": SLOWLOG_COLUMNS,
    "comparison": COMPARISON_COLUMNS,
    "comparison-metrics": COMPARISON_METRICS,
    "comparison-json": COMPARISON_KEYS,
    "dataset": DATASET_COLUMNS,
    "capture-toml": CAPTURE_TOML_KEYS,
}
