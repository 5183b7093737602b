"""Exchange stage: one capture file -> the exchanges table, the connections table and capture-quality counters."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..core.endpoints import Endpoint, endpoint_text
from ..core.fingerprint import digest_fingerprint, fingerprint, query_id
from ..core.memory import release_memory
from ..core.schema import CONNECTION_COLUMNS, EXCHANGE_COLUMNS
from ..core.tables import batch, call_function, columns_batch, frame_of_table, row_function, row_type, table_of
from ..core.window import Window
from ..mysql.connection import ENCRYPTED_COMMAND, Exchange
from ..mysql.framing import MIN_ROW_BUDGET, ROWS_PER_INPUT_BYTE, SQL_BUDGET, InputBudget
from ..mysql.tls import Secrets
from .capture import CaptureStats, open_capture
from .fastlane import ExcerptPlan, file_frames, per_file, read_capture
from .flows import Flow, FlowTracker
from .spill import Spill, SpillWriter

if TYPE_CHECKING:
    import pandas as pd

_ADMIN_NAMES = {
    "COM_QUIT": "Quit",
    "COM_PING": "Ping",
    "COM_STATISTICS": "Statistics",
    "COM_STMT_CLOSE": "Close stmt",
    "COM_STMT_RESET": "Reset stmt",
    "COM_RESET_CONNECTION": "Reset connection",
    "COM_CHANGE_USER": "Change user",
    "COM_SET_OPTION": "Set option",
    "COM_PROCESS_KILL": "Kill",
    "CONNECT": "Connect",
}


ENCRYPTED_FINGERPRINT = "encrypted request (TLS without a key log: text unknown)"


@lru_cache(maxsize=65536)
def fingerprints(sql: str | None, command: str) -> tuple[str, str]:
    """(pt-fingerprint, pt-query-digest Query ID). Commands without SQL get pt-query-digest's admin form."""
    if command == ENCRYPTED_COMMAND:  # a TLS flight read without its content
        return ENCRYPTED_FINGERPRINT, query_id(ENCRYPTED_FINGERPRINT)
    if sql is None:
        fp = "administrator command: " + _ADMIN_NAMES.get(command, command.removeprefix("COM_").replace("_", " ").title())
        return fp, query_id(fp)
    return fingerprint(sql), query_id(digest_fingerprint(sql))


class Extraction:
    """One capture's exchanges and connections tables, and what else extraction learnt about it.

    The tables are made as Arrow tables of the declared columns (tables.table_of) and become DataFrames when
    `exchanges` / `connections` is first read: the `exchanges` command writes them and counts its summary with
    Arrow alone (`arrow`, `quality`), without importing pandas. An extraction that spilled its exchanges
    (`extract(spill=…)`, read/spill.py) is given the `Spill` instead of the table: the table is read back from it
    when first asked for, and `spill` keeps the buckets."""

    def __init__(self, capture: str, exchanges: pd.DataFrame | pa.Table | Spill, connections: pd.DataFrame | pa.Table,
                 stats: CaptureStats, other_tcp_frames: int = 0, other_tcp_bytes: int = 0,
                 commands: Counter | None = None, flow_first_frames: dict[int, int] | None = None,
                 native_frames: int = 0, holes: dict[int, tuple[list, list]] | None = None, gaps_forced: int = 0,
                 files: list | None = None, source: str | os.PathLike | None = None):
        self.capture = capture
        # what reads this capture again (the repair's passes): the file, or the sources.CapturePoint of its files
        self.source = capture if source is None else source
        self._tables = {"exchanges": exchanges, "connections": connections}
        self.spill = exchanges if isinstance(exchanges, Spill) else None  # the buckets (read/spill.py), if spilled
        self.stats = stats
        self.other_tcp_frames = other_tcp_frames
        self.other_tcp_bytes = other_tcp_bytes
        self.commands = Counter() if commands is None else commands
        self.flow_first_frames = {} if flow_first_frames is None else flow_first_frames  # conn_index -> first frame
        self.native_frames = native_frames  # frames read natively (fastlane.read_capture); the rest went through Python
        # conn_index -> (client→server, server→client) byte ranges never captured, as tcp.HalfStream.holes, for the
        # connections that have any (the repair stage takes them from another capture point)
        self.holes = {} if holes is None else holes
        self.gaps_forced = gaps_forced  # gaps declared because a cap on held out-of-order data bit (read/tcp.py)
        self.files = [] if files is None else files  # sources.FileRead per file of a capture point of several files

    def _frame(self, name: str, columns: tuple) -> pd.DataFrame:
        self._read_back(name)
        if isinstance(self._tables[name], pa.Table):
            holder = [self._tables[name]]
            self._tables[name] = None  # the Arrow memory goes column by column as it is converted
            self._tables[name] = frame_of_table(holder, columns)
        return self._tables[name]

    @property
    def exchanges(self) -> pd.DataFrame:
        return self._frame("exchanges", EXCHANGE_COLUMNS)

    @exchanges.setter
    def exchanges(self, df: pd.DataFrame) -> None:
        self._tables["exchanges"] = df

    @property
    def connections(self) -> pd.DataFrame:
        return self._frame("connections", CONNECTION_COLUMNS)

    @connections.setter
    def connections(self, df: pd.DataFrame) -> None:
        self._tables["connections"] = df

    def _read_back(self, name: str) -> None:
        """A spilled table read back from its buckets (in the in-memory extraction's order), once."""
        spilled = self._tables[name]
        if isinstance(spilled, Spill):
            self._tables[name] = spilled.table()

    def arrow(self, name: str) -> pa.Table | None:
        """The `exchanges` or `connections` table as the Arrow table it was made as (read back from the spill),
        or None once it is a DataFrame."""
        self._read_back(name)
        table = self._tables[name]
        return table if isinstance(table, pa.Table) else None

    def _exchange_rows(self) -> int:
        """The exchanges' count, from the spill's bucket counts while the table is spilled (not read back for it)."""
        spilled = self._tables["exchanges"]
        if isinstance(spilled, Spill):
            return int(spilled.rows.sum())
        table = self.arrow("exchanges")
        return table.num_rows if table is not None else len(self.exchanges)

    def _problem_lists(self) -> list[tuple]:
        """(problem list, rows) of the exchanges: counted over the few distinct lists, not the rows; from the
        spill's buckets, a batch at a time, while the table is spilled (not read back for it)."""
        spilled = self._tables["exchanges"]
        if isinstance(spilled, Spill):
            return list(_problem_counts(b.column("problems") for bucket in range(len(spilled.rows))
                                        for b in spilled.bucket(bucket)).items())
        exchanges = self.arrow("exchanges")
        if exchanges is not None:
            return list(_problem_counts(exchanges.column("problems").chunks).items()) if exchanges.num_rows else []
        exchanges = self.exchanges
        return list(exchanges["problems"].value_counts().items()) if len(exchanges) else []

    def quality(self) -> dict:
        """Capture-quality summary: every frame and MySQL byte accounted for."""
        s = self.stats
        c = self.arrow("connections")
        if c is not None:  # the table as made: counted with Arrow (sums skip nulls, as pandas' do)
            total = lambda col: int(call_function("sum", [c.column(col)]).as_py() or 0)  # noqa: E731
            rows = c.num_rows
            tls_modes = Counter(v for v in c.column("tls_mode").to_pylist() if v is not None)
        else:
            c = self.connections
            total = lambda col: int(c[col].sum()) if len(c) else 0  # noqa: E731
            rows = len(c)
            tls_modes = Counter(v for v in c["tls_mode"].tolist() if isinstance(v, str))
        problems = self._problem_lists()
        return {
            "file": self.capture,
            "format": s.format,
            "gzip": s.gzip,
            "frames": s.frames,
            "frames_tcp": s.frames_tcp,
            "frames_tcp_mysql": s.frames_tcp - self.other_tcp_frames,
            "frames_tcp_other": self.other_tcp_frames,
            "frames_non_ip": s.frames_non_ip,
            "frames_non_tcp": s.frames_non_tcp,
            "frames_ip_fragment": s.frames_ip_fragment,
            "frames_undecodable": s.frames_undecodable,
            "frames_unknown_link": s.frames_unknown_link,
            "frames_truncated": s.frames_truncated,
            "frames_bad_ts": s.frames_bad_ts,
            "if_drops": sum(s.if_drops.values()),
            "damaged": s.damaged,
            "unknown_blocks": s.unknown_blocks,
            "first_ts": _iso(s.first_ts_ns),
            "last_ts": _iso(s.last_ts_ns),
            "mysql_connections": rows,
            "midstream_connections": total("midstream"),
            "tls_connections": total("tls"),
            **{f"tls_{mode}_connections": tls_modes.get(mode, 0) for mode in ("decrypted", "timed", "unreadable")},
            "exchanges": self._exchange_rows(),
            "gaps": total("gaps"),
            "gaps_forced": self.gaps_forced,
            "gap_bytes": total("gap_bytes"),
            "retransmitted_bytes": total("retransmitted_bytes"),
            "mysql_bytes": total("mysql_bytes"),
            "unparsed_bytes": total("unparsed_bytes"),
            "tls_bytes": total("tls_bytes"),
            "tls_decrypted_bytes": total("tls_decrypted_bytes"),
            "tls_timed_bytes": total("tls_timed_bytes"),
            "tls_unreadable_bytes": total("tls_bytes") - total("tls_decrypted_bytes") - total("tls_timed_bytes"),
            "violations": total("violations"),
            "out_of_range": _with_problem(problems, "out-of-range"),
            "retransmission_conflicts": _with_problem(problems, "retransmission-conflict"),
            "other_tcp_bytes": self.other_tcp_bytes,
            # share of the MySQL connections' byte streams that were read (the rest: never captured, skipped while
            # resynchronising, or encrypted and neither decrypted nor timed)
            "understood_share": _share(total("mysql_bytes") + total("tls_decrypted_bytes") + total("tls_timed_bytes"),
                                       total("gap_bytes") + total("unparsed_bytes") + total("tls_bytes")
                                       - total("tls_decrypted_bytes") - total("tls_timed_bytes")),
        }


def _problem_counts(chunks) -> Counter:
    """Each problem list's rows, from dictionary-coded `problems` chunks (the codes counted, chunk by chunk)."""
    counter: Counter = Counter()
    for chunk in chunks:
        counted = call_function("value_counts", [chunk.indices])
        texts = chunk.dictionary.to_pylist()
        for code, n in zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist()):
            if code is not None:
                counter[texts[code]] += n
    return counter


def _with_problem(counts, problem: str) -> int:
    """Exchanges whose `problems` name `problem`, from the rows of each problem list (Extraction._problem_lists)."""
    return int(sum(n for text, n in counts if text is not None and problem in str(text).split(",")))


def _share(good: int, bad: int) -> float | None:
    return None if good + bad == 0 else round(good / (good + bad), 6)


def _iso(ns: int | None) -> str | None:
    """pandas.Timestamp(ns, unit="ns", tz="UTC").isoformat(), without pandas: seconds, then six digits when the
    microseconds are not 0 and nine when the nanoseconds are not."""
    if ns is None:
        return None
    from datetime import datetime, timezone

    seconds, fraction = divmod(ns, 1_000_000_000)
    text = datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None).isoformat()
    if fraction % 1000:
        text += f".{fraction:09d}"
    elif fraction:
        text += f".{fraction // 1000:06d}"
    return text + "+00:00"


# The rows of the connections table, written by column name (core/schema.py declares the columns and their order).
ConnectionRow = row_type("ConnectionRow", CONNECTION_COLUMNS)
# Where each exchanges column comes from, by name: Python expressions over the capture's name `capture`, the
# connection (`flow`, its MySQLConnection `conn`, its client and server as text `ends`), the finished exchange `ex`,
# its fingerprint `fp` and Query ID `qid`, and the TCP sequence numbers of stream offset 0 of the request and the
# response direction `req_base`, `resp_base` (HalfStream.raw_seq, inline).
_CONNECTION_SOURCES = {
    "capture": "capture",
    "conn_index": "flow.index",
    "conn_id": "conn.greeting.conn_id if conn.greeting else None",
    "client": "ends[0]",
    "server": "ends[1]",
    "tls": "conn.tls",
    "compressed": "conn.compression",
    "user": "conn.login.user if conn.login else None",
    "db": "conn.login.database if conn.login else None",
}
_EXCHANGE_SOURCES = {
    **{name: f"ex.{name}" for name in (  # the Exchange's fields (and properties) of the same name
        "seq", "command", "sql", "stmt_id", "params", "req_first_ts", "req_last_ts", "resp_first_ts", "resp_last_ts",
        "req_first_frame", "req_last_frame", "resp_first_frame", "resp_last_frame", "result", "error_code",
        "error_state", "error_message", "rows", "affected_rows", "warnings", "result_sets", "bytes_req", "bytes_resp",
        "status_flags", "server_flag_slow")},
    "fingerprint": "fp",
    "query_id": "qid",
    "response_s": "(ex.resp_last_ts - ex.req_first_ts) / 1e9 if ex.resp_last_ts is not None else None",
    "ttfb_s": "(ex.resp_first_ts - ex.req_last_ts) / 1e9 if ex.resp_first_ts is not None else None",
    "req_tcp_seq": "(req_base + ex.req_offset) % 4294967296",
    "resp_tcp_seq": "(resp_base + ex.resp_offset) % 4294967296 if ex.resp_offset is not None else None",
    "resp_tcp_end": "(resp_base + ex.resp_end_offset) % 4294967296 if ex.resp_end_offset is not None else None",
    "problems": "','.join(ex.problems)",
}
# the row of a finished exchange
exchange_row = row_function("exchange_row", EXCHANGE_COLUMNS,
                            "capture, flow, conn, ends, ex, fp, qid, req_base, resp_base",
                            {**_CONNECTION_SOURCES, **_EXCHANGE_SOURCES})
# a row of the connection's columns alone, None for the exchange's (what a reader that writes rows itself copies)
connection_part = row_function("connection_part", EXCHANGE_COLUMNS, "capture, flow, conn, ends",
                               {**_CONNECTION_SOURCES, **dict.fromkeys(_EXCHANGE_SOURCES, "None")})
ROWS_PER_BATCH = 1 << 13  # rows are held as Python tuples only until a batch of this many is columnar
# The fast lane holds its rows in C buffers and the distinct texts of a batch (no Python object per row): its
# batches are bigger (and end sooner when they hold 16 MiB of text), so fewer of them are made into Arrow and
# fewer dictionaries unified when the table is sorted
LANE_ROWS_PER_BATCH = 1 << 16


def extract(
    path: str | os.PathLike,
    servers: set[Endpoint] | None = None,
    max_sql_bytes: int = 1 << 20,
    progress: Callable[[int, int, int], None] | None = None,
    part: tuple[int, int] | None = None,
    segments: Iterable[tuple] | None = None,
    excerpt: ExcerptPlan | None = None,
    tls_secrets: Secrets | None = None,
    sql_budget: int | None = None,
    row_budget: int | None = None,
    spill: str | os.PathLike | None = None,
    window: Window | None = None,
    reached: Callable[[int], None] | None = None,
) -> Extraction:
    """Read one capture into exchanges and connections. `progress(bytes_done, bytes_total, frames_done)` is called now and
    then.
    With `part=(i, n)` only the connections of part i of n are read (see FlowTracker); `merge_parts` joins them.
    With `segments` (TcpSegment field tuples in capture order) those are read instead of the file, which `path` then
    only names (the repair stage re-reads chosen connections this way). With `excerpt` the lane reads that plan's
    records of the capture instead of all of them (fastlane.ExcerptPlan: the repair's native re-read).
    `sql_budget`: the statement text (bytes) this input may keep in total (framing.InputBudget; a part its share);
    by default SQL_BUDGET or the input's size, the larger: a capture whose bytes are not compressed holds its
    statements, so only an input that inflates (gzip, the compressed protocol) can reach it. `row_budget`: the
    exchanges it may give, by default ROWS_PER_INPUT_BYTE per byte of the input as stored, at least MIN_ROW_BUDGET
    (a re-read of `segments`: no limit). `spill`: a folder the exchange rows are written into as they come, in
    buckets by the partition key (read/spill.py), instead of being held: the Extraction's table is read back from
    them when first asked for. `window` (core.window, analyze --since/--until): every frame is still read, but only
    the exchanges whose request falls in the window are kept, dropped from each batch of rows as it is made (the
    lane's and Python's alike), and only the holes found in it (with its margin) are given to the repair;
    `reached(ns)` is told how far into the capture's time each batch is."""
    name = os.fspath(path)
    ex_rows: list[tuple] = []
    ex_batches: list[pa.RecordBatch] = []
    spilling = None if spill is None else SpillWriter(spill, rows_dropped=window is not None)
    keep = ex_batches.append if spilling is None else spilling.add  # where each batch of rows goes
    if window is not None:  # the rows outside the window go before a batch is held or spilled
        held = keep

        def keep(rows: pa.RecordBatch) -> None:
            held(window.kept(rows, reached))
    conn_rows: list[ConnectionRow] = []
    commands: Counter = Counter()
    first_frames: dict[int, int] = {}
    holes: dict[int, tuple[list, list]] = {}

    texts: dict[int, tuple[str, str]] = {}  # flow index -> client and server as text, made once per flow

    def ends(flow: Flow) -> tuple[str, str]:
        """The client and the server of `flow` as text, made once per connection."""
        made = texts.get(flow.index)
        if made is None:
            made = texts[flow.index] = (endpoint_text(flow.client), endpoint_text(flow.server))
        return made

    def connection_row(flow: Flow) -> tuple:
        return connection_part(name, flow, flow.mysql, texts.get(flow.index) or ends(flow))

    def emit(flow: Flow, ex: Exchange) -> None:
        fp, qid = fingerprints(ex.sql, ex.command)
        commands[ex.command] += 1
        ex_rows.append(exchange_row(name, flow, flow.mysql, texts.get(flow.index) or ends(flow), ex, fp, qid,
                                    flow.to_server.base or 0, flow.to_client.base or 0))
        if len(ex_rows) >= ROWS_PER_BATCH:
            flush()

    def closed(flow: Flow) -> None:
        first_frames[flow.index] = flow.first_frame
        if flow.kind != "mysql":
            return
        if flow.to_server.holes or flow.to_client.holes:
            found = ((flow.to_server.holes, flow.to_client.holes) if window is None else
                     (window.holes_in(flow.to_server.holes), window.holes_in(flow.to_client.holes)))
            if found[0] or found[1]:
                holes[flow.index] = found
        conn = flow.mysql
        c = conn.counters
        greeting, login = conn.greeting, conn.login
        start = flow.syn_ts if flow.syn_ts is not None else conn.greeting_ts
        handshake = (conn.connect_ok_ts - start) / 1e9 if conn.connect_ok_ts is not None and start is not None else None
        halves = (flow.to_server.stats, flow.to_client.stats)
        tls_split = conn.tls_split()
        row = ConnectionRow(
            capture=name,
            conn_index=flow.index,
            conn_id=greeting.conn_id if greeting else None,
            conn_id_source="greeting" if greeting else None,  # analyze fills the others (read/connids.py)
            client=endpoint_text(flow.client),
            server=endpoint_text(flow.server),
            server_version=greeting.server_version if greeting else None,
            auth_plugin=greeting.auth_plugin if greeting else None,
            user=login.user if login else None,
            db=login.database if login else None,
            scramble=greeting.scramble.hex() if greeting else None,
            syn_ts=flow.syn_ts,
            greeting_ts=conn.greeting_ts,
            login_ok_ts=conn.connect_ok_ts,
            handshake_s=handshake,
            first_ts=flow.first_ts,
            last_ts=flow.last_ts,
            frames=flow.frames,
            exchanges=flow.exchanges,
            midstream=c.midstream,
            tls=conn.tls,
            compressed=conn.compression,
            closed=flow.closed,
            gaps=sum(h.gaps for h in halves),
            gap_bytes=sum(h.gap_bytes for h in halves),
            retransmitted_bytes=sum(h.retransmitted_bytes for h in halves),
            mysql_bytes=sum(c.mysql_bytes),
            unparsed_bytes=sum(c.unparsed_bytes),
            tls_bytes=c.tls_bytes,
            tls_mode=conn.tls_outcome,
            tls_version=conn.tls_session.version_text if conn.tls_session else None,
            tls_cipher=conn.tls_session.suite_name if conn.tls_session else None,
            tls_decrypted_bytes=tls_split[0],
            tls_timed_bytes=tls_split[1],
            violations=c.violations,
            violation_notes="; ".join(c.violation_notes) or None,
            close_error=conn.close_error[0] if conn.close_error else None,
            closed_by=None if flow.close_from is None else "server" if flow.close_from == flow.server else "client",
            close_ts=flow.close_ts,
            close_rst=flow.close_rst if flow.close_from is not None else None,
        )
        if window is not None:
            row = _connection_in(window, row)
        if row is not None:
            conn_rows.append(row)

    def flush() -> None:
        keep(batch(ex_rows, EXCHANGE_COLUMNS))
        ex_rows.clear()

    def add_columns(values: list, kinds: str) -> None:
        keep(columns_batch(values, kinds, EXCHANGE_COLUMNS))

    def finished(stats: CaptureStats, native: int) -> Extraction:
        keep(batch(ex_rows, EXCHANGE_COLUMNS))
        ex_rows.clear()
        exchanges = table_of(ex_batches, EXCHANGE_COLUMNS, sort_by=["req_first_ts", "conn_index", "seq"]) \
            if spilling is None else spilling.close()
        # conn_index is unique: any sort gives this order
        connections = table_of([batch(conn_rows, CONNECTION_COLUMNS)], CONNECTION_COLUMNS, sort_by=["conn_index"])
        release_memory()
        return Extraction(name, exchanges, connections, stats, tracker.other_tcp_frames, tracker.other_tcp_bytes,
                          commands, first_frames, native, holes, tracker.held_budget.forced_gaps, source=path)

    tracker = FlowTracker(emit, closed, servers=servers, max_sql_bytes=max_sql_bytes, part=part,
                          tls_secrets=tls_secrets, sql_budget=SQL_BUDGET if sql_budget is None else sql_budget,
                          **({} if row_budget is None else {"row_budget": row_budget}))
    if segments is not None:
        feed = tracker.segment_fields
        for fields in segments:
            feed(*fields)
        tracker.finish()
        return finished(CaptureStats(name), 0)
    with open_capture(path) as reader:
        total = getattr(reader, "total_bytes", reader.stats.bytes_file)
        share = part[1] if part else 1
        tracker.budget = InputBudget(
            (max(SQL_BUDGET, total) if sql_budget is None else sql_budget) // share,
            (max(MIN_ROW_BUDGET, ROWS_PER_INPUT_BYTE * total) if row_budget is None else row_budget) // share)
        native = 0
        # a capture point of several files (sources.PointReader) hands out its files one by one, into this one
        # tracker: connections continue across them, frames are numbered through them (with an excerpt plan, its
        # records: each file reads its own part of the plan)
        several = hasattr(reader, "files")
        plans = _plans_by_file(path, excerpt) if several and excerpt is not None else None
        for i, (part, before) in enumerate(reader.files() if several else ((reader, 0),)):
            tracker.frame_base = before
            if plans is not None:
                excerpt = plans[i]
            step = progress
            if progress is not None and part is not reader:
                done = reader.bytes_read
                step = lambda d, t, f, done=done, before=before: progress(done + d, total, before + f)  # noqa: E731
            native += read_capture(part, tracker, add_columns=add_columns, connection_row=connection_row,
                                   fingerprints=fingerprints, commands=commands, batch_rows=LANE_ROWS_PER_BATCH,
                                   progress=step, excerpt=excerpt)
        tracker.frame_base = 0
        tracker.finish()
        stats = reader.stats
        files = list(getattr(reader, "reads", ()))
    if progress is not None:
        progress(total, total, stats.frames)
    result = finished(stats, native)
    result.files = files
    return result


def _connection_in(window: Window, row: ConnectionRow) -> ConnectionRow | None:
    """A connection's row as a capture of the window alone would have it (None: its life is outside the window):
    what it learnt before the window (its greeting's connection id and scramble, the login's user, TLS) stays, that
    is the point of reading the capture whole; but its set-up before the window and its close after it are not
    events of the window (the connection story would count a connection opened an hour ago as new, or one whose
    COM_QUIT came after the window as closed idle by the server), and its first and last times are cut to it."""
    if not window.meets(row.first_ts, row.last_ts):
        return None
    since = window.since_ns if window.since_ns is not None else row.first_ts
    until = window.until_ns if window.until_ns is not None else row.last_ts + 1
    opened = row.syn_ts if row.syn_ts is not None else row.greeting_ts
    if opened is not None and opened < since:
        row = row._replace(syn_ts=None, greeting_ts=None, login_ok_ts=None, handshake_s=None)
    if row.close_ts is not None and row.close_ts >= until:
        row = row._replace(closed=False, closed_by=None, close_ts=None, close_rst=None, close_error=None)
    return row._replace(first_ts=max(row.first_ts, since), last_ts=min(row.last_ts, until))


def _plans_by_file(path, excerpt: ExcerptPlan) -> list[ExcerptPlan]:
    """An excerpt plan of a capture point of several files, as one plan per file (fastlane.per_file), an empty one
    for a file with no part of it."""
    counts = file_frames(path)
    if counts is None:
        raise ValueError(f"the lane cannot read an excerpt plan of {os.fspath(path)}")
    empty = np.zeros(0, dtype=np.int64)
    return [ExcerptPlan(excerpt.keys, empty, empty, []) if part is None else ExcerptPlan(excerpt.keys, *part)
            for part in per_file(excerpt.frames, excerpt.insert_at, excerpt.blobs, counts)]


def merge_parts(parts: list[Extraction]) -> Extraction:
    """Join the parts of one capture read by several trackers (`extract(part=...)`) into what one tracker gives:
    connections are renumbered in the order of their first frame, which is the order a single tracker met them.
    The parts' tables are consumed."""
    if len(parts) == 1:
        return parts[0]
    import numpy as np
    import pandas as pd

    from ..core.tables import sorted_columnwise

    ranks: dict[tuple[int, int], int] = {}
    order = sorted((frame, i, index) for i, p in enumerate(parts) for index, frame in p.flow_first_frames.items())
    for rank, (_, i, index) in enumerate(order):
        ranks[(i, index)] = rank

    def renumbered(frames: list[pd.DataFrame]) -> list[pd.DataFrame]:
        for i, df in enumerate(frames):
            df["conn_index"] = np.fromiter((ranks[(i, index)] for index in df["conn_index"]), np.int64, len(df))
        return frames

    if all(p.spill is not None for p in parts):  # the parts' buckets, their connections numbered as here: the
        # merged table stays spilled (read back when asked for, in this order: Spill.table sorts by SORT_BY)
        exchanges = Spill([q for p in parts for q in p.spill.parts], parts[0].spill.columns).renumbered(
            [_ranks_of(i, p.flow_first_frames, ranks) for i, p in enumerate(parts)])
    else:
        exchanges = sorted_columnwise(renumbered([p.exchanges for p in parts]), ["req_first_ts", "conn_index", "seq"])
    connections = sorted_columnwise(renumbered([p.connections for p in parts]), ["conn_index"])
    commands: Counter = Counter()
    for p in parts:
        commands.update(p.commands)
    first = parts[0]
    merged = Extraction(first.capture, exchanges, connections, first.stats,
                      sum(p.other_tcp_frames for p in parts), sum(p.other_tcp_bytes for p in parts), commands,
                      {ranks[(i, index)]: frame for i, p in enumerate(parts) for index, frame in p.flow_first_frames.items()},
                      sum(p.native_frames for p in parts),
                      {ranks[(i, index)]: h for i, p in enumerate(parts) for index, h in p.holes.items()},
                      sum(p.gaps_forced for p in parts), first.files, first.source)
    return merged


def _ranks_of(part: int, first_frames: dict[int, int], ranks: dict[tuple[int, int], int]) -> np.ndarray:
    """Part `part`'s conn_index → the merged extraction's, as an array indexed by the part's conn_index."""
    out = np.full(max(first_frames, default=-1) + 1, -1, dtype=np.int64)
    for index in first_frames:
        out[index] = ranks[(part, index)]
    return out
