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
    Column("conn_id", "Int64", "MySQL connection id (thread id) from the server greeting; null when the capture began mid-connection"),
    Column("client", CATEGORY, "client endpoint ip:port"),
    Column("server", CATEGORY, "server endpoint ip:port"),
    Column("seq", "int64", "ordinal of the exchange in its connection, from 0"),
    Column("command", CATEGORY, "COM_QUERY, COM_STMT_EXECUTE, ...; CONNECT for the login; COM_0xNN when unknown"),
    Column("sql", CATEGORY, "statement text (prepared text for COM_STMT_*; USE `db` for COM_INIT_DB); null when none"),
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
    Column("result", CATEGORY, "ok | error | resultset | none (no response expected); null when the response was not (fully) seen"),
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
    Column("tls", "boolean", "the connection switched to TLS (its exchanges after the switch cannot be read)"),
    Column("compressed", CATEGORY, "zlib | zstd when the compressed protocol was in use"),
    Column("user", CATEGORY, "user name from the login packet"),
    Column("db", CATEGORY, "database from the login packet"),
    Column("req_tcp_seq", "int64", "TCP sequence number of the request's first byte (matches the same bytes at another capture point)"),
    Column("resp_tcp_seq", "Int64", "TCP sequence number of the response's first byte"),
    Column("resp_tcp_end", "Int64", "TCP sequence number just past the response's last byte"),
    Column("problems", CATEGORY, "comma-separated: midstream, gap, unanswered, incomplete, truncated, sql-cut, sequence, violation, unknown-statement, params-undecoded, query-attributes, out-of-range (a wire number beyond int64: the column holds the int64 maximum, a lower bound)"),
)

CONNECTION_COLUMNS: tuple[Column, ...] = (
    Column("capture", "string", "capture file"),
    Column("conn_index", "int64", "ordinal of the TCP connection in the capture"),
    Column("conn_id", "Int64", "MySQL connection id from the greeting"),
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
    Column("tls_bytes", "int64", "bytes after the switch to TLS"),
    Column("violations", "int64", "protocol violations (packets that do not fit the state machine)"),
    Column("violation_notes", "string", "the first few violations, for the curious"),
)


def markdown_table(columns: tuple[Column, ...]) -> str:
    lines = ["| column | dtype | meaning |", "|---|---|---|"]
    lines += [f"| `{c.name}` | {c.dtype} | {c.meaning} |" for c in columns]
    return "\n".join(lines)

# Columns the analysis stage (pcapdecomp/decompose.py) adds to EXCHANGE_COLUMNS. A1/A4 are app-clock capture
# times at the app host, D1/D4 DB-capture times converted to that app clock by the fitted clock model.
ANALYSIS_COLUMNS: tuple[Column, ...] = (
    Column("seen", CATEGORY, "both | app | db: the capture points that saw the exchange (foundation columns come from the app side when seen there)"),
    Column("match_notes", CATEGORY, "match-conflict (same request bytes, different command/text/response end: not paired); lost-at-app|db (the other point saw this connection before and after, and missed this exchange: capture loss); response-unseen-at-app|db"),
    Column("db_client", CATEGORY, "client endpoint as seen at the DB (differs from client behind NAT)"),
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
    Column("exec_s", "float64", "execution time: the slow log's Query_time, else an estimate (see exec_source)"),
    Column("exec_source", CATEGORY, "slow_log | fingerprint_median (median server time of fast executions of the fingerprint) | below_long_query_time (known faster than long_query_time: exec_s is the bound min(server_s, long_query_time)) | flagged_slow (SERVER_QUERY_WAS_SLOW without a slow-log entry: exec_s = server_s, an upper bound); null when unknown"),
    Column("queue_s", "float64", "server_s - exec_s, at least 0: waiting before execution (thread-pool queue)"),
    Column("in_slow_log", "boolean", "joined to a slow-log entry; null when no usable slow log"),
    Column("slow_log_line", "Int64", "line of the joined slow-log entry"),
    Column("hidden_slow", "boolean", "server_s > long_query_time, yet not in the slow log and not flagged SERVER_QUERY_WAS_SLOW: slow before execution; null without the evidence"),
    Column("thread_group", "Int64", "conn_id mod thread_pool_size (MariaDB/Percona thread pool group)"),
)


# groups.parquet: one row per thread group and time bucket (pcapdecomp/decompose.py group_view). Times are DB-side
# request times on the app clock (db_req_ts … db_resp_ts), so queueing lines up with the exchanges table.
GROUP_COLUMNS: tuple[Column, ...] = (
    Column("thread_group", "int64", "conn_id mod thread_pool_size"),
    Column("bucket_start", TS, "start of the time bucket"),
    Column("bucket_s", "float64", "bucket length, seconds (the smallest of 10 ms, 100 ms, 1 s, 10 s, 1 min giving ≤ 1000 buckets)"),
    Column("in_flight", "float64", "mean number of the group's exchanges between D1 and D4 during the bucket"),
    Column("executing", "float64", "mean number executing (between D4 − exec_s and D4)"),
    Column("queued", "float64", "mean number queued (between D1 and D1 + queue_s)"),
    Column("queue_s", "float64", "queue seconds spent inside the bucket, summed over the group's exchanges"),
    Column("started", "int64", "exchanges whose D1 falls in the bucket"),
    Column("max_queue_s", "float64", "largest queue_s of the exchanges started in the bucket; null when none started"),
)
