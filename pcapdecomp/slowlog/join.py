"""The slow-log join: which exchange each slow-log entry describes, only where the log and the wire say so.

An entry joins an exchange when

1. **the text is the same**: the entry's statement equals the exchange's statement in the form the server logs it
   (`sqltext.logged_form`; one entry per statement of a multi-statement packet; a COM_STMT_EXECUTE's prepared
   text with its parameters, value by value; an administrator command by its command); a statement cut on the
   wire (problem `sql-cut`) or in the log (`cut`) matches by prefix;
2. **the timing fits the wire**: the execution the entry describes, [start, start + Query_time], lies inside
   [D1, D4] of the exchange, where the log pins `start` to its own resolution: MySQL 8's `Start:`/`End:` and
   MySQL/Percona's ISO `# Time:` (the end) to the microsecond, `SET timestamp` and MariaDB's `# Time:` (the
   start) to the second. D4 may be passed by `LOG_WRITE_SLACK_NS` (the server computes Query_time after it sent
   the answer); times of exchanges seen only on an app clock get `APP_CLOCK_TOLERANCE_NS` either side;
3. **no other exchange or entry could be the partner**: on a connection whose id the wire shows (the greeting) the
   entries of that thread and the exchanges of that connection are both in execution order, so an entry joins
   when every order-keeping assignment gives it the same exchange (earliest and latest assignment agree).
   Without an id (the capture began mid-connection) an entry joins only when it fits exactly one exchange and
   that exchange fits no other entry. A thread with at least MIN_ANCHORS entries that fit exchanges of one
   mid-stream connection only (and no entry of another thread pinned there) is on that connection, after which
   order decides there too.

Anything else stays unjoined with a reason per entry (`REASONS`), and the exchanges that could have been the
partner of an unjoined entry are marked `undecided`: whether they are in the slow log is unknown (the analysis
then leaves in_slow_log / hidden_slow null for them instead of guessing). So are the exchanges of commands the
server does not log (`LOGGED_COMMANDS`).

Cost: per entry, searches in time-sorted indexes bounded by `SCAN_LIMIT` steps (an entry that hits it is
unjoined, reason `search-limit`); no pair of entry × exchange is ever materialised.
"""

from __future__ import annotations

import array
import bisect
import re
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core import formats
from ..core.times import ts_ns
from .reader import WireStatements, holds_header_lines
from .sqltext import (
    WILDCARD,
    logged_form,
    parse_params,
    placeholders,
    read_literal,
    statements,
    template_parts,
    template_values,
)

NS = 1_000_000_000
LOG_WRITE_SLACK_NS = 50_000_000  # the server may stamp the end (and Query_time) after the answer left; in the 85
#                                  joined entries of the bundled recordings Query_time stayed ≥ 18 µs under D4 − D1,
#                                  and a loaded host delays such stamps by tens of ms (method notes): a margin
DB_CLOCK_TOLERANCE_NS = 1_000_000  # DB capture on the DB host: the log and the capture share one clock
APP_CLOCK_TOLERANCE_NS = NS  # exchanges seen only at the app: its clock against the server's (NTP-sized offsets)
SCAN_LIMIT = 10_000  # index steps per search before an entry is given up ('search-limit')
MARK_LIMIT = 1_000  # exchanges marked undecided per unjoined entry (more: counted in undecided_search_cut)
MARK_STEPS = 256  # exchanges examined while marking undecided ones, per exchange and entry of the input
MIN_ANCHORS = 2  # entries of one thread that fit only one mid-stream connection, needed to identify it
MIN_PREFIX_CHARS = 24  # a statement cut shorter than this (a tiny --max-sql-bytes, the tail of a cut multi-statement
#                        packet) says too little to be matched by its prefix: it is not matched
CANDIDATE_LIMIT = 32  # fitting exchanges listed per entry without a connection (more: it pins no connection)
MAX_EXAMPLES = 20
BIG = np.iinfo(np.int64).max // 4

REASONS = {
    "socket": "the client connected over a local socket (no address): no network capture sees it",
    "no-time": "the entry has no usable time (no '# Time:', SET timestamp, Start or End, or only damaged ones)",
    "no-query-time": "Query_time is damaged (out of range or unreadable)",
    "outside-capture": "the execution falls outside the captures' time span",
    "command-without-response": "an administrator command the server does not answer (Quit, Close stmt, Long Data): "
                                "no response on the wire to time it",
    "no-text-match": "no exchange in the capture has this statement text (or command); e.g. a prepared statement "
                     "whose PREPARE was not captured, an SQL-level EXECUTE (logged as the executed text), TLS",
    "no-time-fit": "exchanges with this text exist, but none whose [D1, D4] (on this connection) holds the execution",
    "ambiguous": "several exchanges fit (same text, fitting times) and nothing tells them apart",
    "order-conflict": "the thread's entries do not fit its connection's exchanges in order",
    "search-limit": f"more than {SCAN_LIMIT} same-text exchanges to examine around its time",
}

# The server's command names (`command_name[]` in sql_parse.cc) for '# administrator command: X;' entries.
ADMIN_COMMANDS = {
    "quit": "COM_QUIT", "init db": "COM_INIT_DB", "field list": "COM_FIELD_LIST", "create db": "COM_CREATE_DB",
    "drop db": "COM_DROP_DB", "refresh": "COM_REFRESH", "shutdown": "COM_SHUTDOWN", "statistics": "COM_STATISTICS",
    "processlist": "COM_PROCESS_INFO", "kill": "COM_PROCESS_KILL", "debug": "COM_DEBUG", "ping": "COM_PING",
    "time": "COM_TIME", "change user": "COM_CHANGE_USER", "binlog dump": "COM_BINLOG_DUMP",
    "table dump": "COM_TABLE_DUMP", "register slave": "COM_REGISTER_SLAVE", "prepare": "COM_STMT_PREPARE",
    "long data": "COM_STMT_SEND_LONG_DATA", "close stmt": "COM_STMT_CLOSE", "reset stmt": "COM_STMT_RESET",
    "set option": "COM_SET_OPTION", "fetch": "COM_STMT_FETCH", "daemon": "COM_DAEMON",
    "binlog dump gtid": "COM_BINLOG_DUMP_GTID", "reset connection": "COM_RESET_CONNECTION",
}
ADMIN_NAMES = {command: name for name, command in ADMIN_COMMANDS.items()}
NO_RESPONSE = {"COM_QUIT", "COM_STMT_CLOSE", "COM_STMT_SEND_LONG_DATA"}
LOGGED_COMMANDS = {"COM_QUERY", "COM_STMT_EXECUTE", "COM_STMT_BULK_EXECUTE"}  # what every server writes to the log
NOT_ON_THE_WIRE = {"socket", "no-time", "outside-capture", "command-without-response"}  # nothing there to mark


@dataclass
class SlowLogJoin:
    entry: np.ndarray  # per exchange row: the first (in log order) joined entry's position, -1 when none
    used: bool  # False: no slow log, or one that joined nothing (then in_slow_log stays null)
    stats: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    query_time_ns: np.ndarray | None = None  # per row: Σ Query_time of its joined entries (one per statement)
    undecided: np.ndarray | None = None  # per row: may be the exchange of an unjoined entry (in the log? unknown)
    reasons: np.ndarray | None = None  # per entry: '' when joined, else a key of REASONS
    entry_row: np.ndarray | None = None  # per entry: the joined row, -1 when none


@dataclass
class JoinContext:
    """What a join of some of the exchanges (`joined_part`) reads of all of them: the captures' time span (an entry
    outside it is 'outside-capture'), the connection ids the wire names (an entry of such a thread is searched on
    that connection only), and whether any timed exchange is a TLS flight read without its content (then every
    entry may be any exchange's statement: ANY_TEXT)."""

    span: tuple[int, int]
    known_ids: set[int]
    encrypted: bool


@dataclass
class PartJoin:
    """`joined_part`'s answer, in the positions of the rows and entries it was given."""

    entry: np.ndarray  # per row: the first (in log order) joined entry, -1 when none
    query_time_ns: np.ndarray  # per row: Σ Query_time of its joined entries
    reasons: np.ndarray  # per entry: '' when joined, else a key of REASONS
    marks: dict[int, list[tuple[int, np.ndarray | None]]]  # per entry to mark: its steps (`_State.recorded_marks`)
    searched: list[int]  # entries of no known connection searched by text (their keys found among the slots)
    # what the stats count of this part (`join_stats`): per entry whether it joined and how ('' when not)
    joined: np.ndarray
    how: np.ndarray
    kinds: dict[str, int]  # the joined entries by the kind of key that met (joined_on)
    several: int  # rows joined to several entries
    identified: int  # mid-stream connections named by their entries


def _empty(n: int, entries: int = 0) -> SlowLogJoin:
    return SlowLogJoin(np.full(n, -1, dtype=np.int64), False, {"entries": entries}, [],
                       np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool),
                       np.full(entries, "", dtype=object), np.full(entries, -1, dtype=np.int64))


# --- inputs -------------------------------------------------------------------------------------------------------


def _ip_of(endpoint) -> str | None:
    if not isinstance(endpoint, str) or not endpoint:
        return None
    host = endpoint[1:endpoint.index("]")] if endpoint.startswith("[") and "]" in endpoint else endpoint.rsplit(":", 1)[0]
    return _norm_ip(host)


def _norm_ip(ip) -> str | None:
    if not isinstance(ip, str) or not ip:
        return None
    ip = ip.lower()
    return ip[7:] if ip.startswith("::ffff:") and "." in ip else ip


def _column(frame: pd.DataFrame, name: str, default) -> list:
    """A column as a list of Python values, None for null (NA, NaN)."""
    if name not in frame.columns:
        return [default] * len(frame)
    values = frame[name].astype(object).to_numpy(copy=True)
    values[pd.isna(values)] = None
    return values.tolist()


class _Rows:
    """The exchanges, as plain arrays; times on the DB clock where the DB saw them. `context`: for a join of some
    of the rows (JoinContext), what every row says of the span and the connection ids."""

    def __init__(self, rows: pd.DataFrame, context: JoinContext | None = None):
        n = self.n = len(rows)
        start = rows["start_ns"].astype("Int64")
        end = rows["end_ns"].astype("Int64")
        self.timed = (start.notna() & end.notna()).to_numpy()
        # the times and the tolerance are read two ways, as numpy arrays and (by _Search's per-pair checks) as Python
        # ints: each held once, as machine integers (array.array) that the numpy array views
        self.d1_ints = _int64s(start.fillna(0).to_numpy(dtype=np.int64))
        del start
        self.d4_ints = _int64s(end.fillna(0).to_numpy(dtype=np.int64))
        del end
        self.d1, self.d4 = _viewed(self.d1_ints), _viewed(self.d4_ints)
        self.tol_ints = _int64s(_tolerances(rows))
        self.tol = _viewed(self.tol_ints)
        conn = rows["conn_id"].astype("Int64")
        self.conn_id = conn.fillna(-1).to_numpy(dtype=np.int64)
        # the connection ids the wire names
        self.known_ids = set(np.unique(self.conn_id[self.conn_id >= 0]).tolist()) if context is None \
            else context.known_ids
        # the connection an exchange belongs to: its id when the greeting was seen, else its endpoints (else the row
        # alone), as a number per row and a name per number: ("id", conn_id), ("key", conn_key), ("key", ("row", i))
        self.conn_code, self.conn_names = _connections(self.conn_id, rows["conn_key"] if "conn_key" in rows.columns
                                                       else None)
        # the statements: per row the number of its command and of its text (-1: null) among the distinct ones (a
        # categorical by its codes: no object per row to compare or hash), and per row the value (None: null)
        if "command" in rows.columns:
            self.command_code, self.commands = _codes(rows, "command")
        else:
            self.command_code, self.commands = np.zeros(n, dtype=np.int64), ["COM_QUERY"]
        self.sql_code, self.sqls = _codes(rows, "sql")
        # read per exchange only where a slow-log entry can use the parameters (_Slots): most never are
        self._params = rows["params"].array if "params" in rows.columns else None
        self.sql_cut = _flags(rows, "sql_cut")
        # the client's address: per row the number of its distinct value (-1: none), each value normalised once
        self.ip_code, ips = _codes(rows, "client_ip")
        self.ip_values = [_norm_ip(v) for v in ips]
        self.span = _span(self.d1, self.d4, self.tol, self.timed) if context is None else context.span

    def conn_of(self, rows: list[int]) -> list[tuple]:
        """The connection (its name) of each of these exchanges."""
        names = self.conn_names
        return [names[c] for c in self.conn_code[np.asarray(rows, dtype=np.int64)].tolist()]

    def rows_by_conn(self, rows: np.ndarray) -> dict[tuple, np.ndarray]:
        """These exchanges (ascending) by connection name, each connection's in their order."""
        codes = self.conn_code[rows]
        order = np.argsort(codes, kind="stable")
        rows, codes = rows[order], codes[order]
        starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]) if len(codes) else np.zeros(0, dtype=np.int64)
        return {self.conn_names[c]: part for c, part in zip(codes[starts].tolist(), np.split(rows, starts[1:]))}

    def params_of(self, rows: np.ndarray) -> tuple[np.ndarray, list]:
        """These exchanges' `params` column as pd.factorize gives it: per row the number of its text in order of
        first appearance (-1: null) and the texts. Factorized as the column's own array (an Arrow string array
        hashes its texts without making an object of each)."""
        if self._params is None:
            return np.full(len(rows), -1, dtype=np.int64), []
        codes, texts = pd.factorize(self._params.take(rows))
        return codes.astype(np.int64), np.asarray(texts, dtype=object).tolist()


def _span(d1: np.ndarray, d4: np.ndarray, tol: np.ndarray, timed: np.ndarray) -> tuple[int, int]:
    """The times an entry's execution must touch to be inside the captures: (0, -1) without a timed exchange."""
    if not timed.any():
        return (0, -1)
    return (int((d1 - tol)[timed].min()), int((d4 + tol + LOG_WRITE_SLACK_NS)[timed].max()))


def _tolerances(rows: pd.DataFrame) -> np.ndarray:
    """Per exchange, how far its times may be from the log's: an app clock's or the DB's own."""
    if "db_clock" in rows.columns and rows["db_clock"].dtype == bool:  # rows_for_join's: no null to look for
        app_clock = ~rows["db_clock"].to_numpy()
    else:
        app_clock = np.asarray(_column(rows, "db_clock", True), dtype=object) == False  # noqa: E712
    return np.where(app_clock, APP_CLOCK_TOLERANCE_NS, DB_CLOCK_TOLERANCE_NS)


def _flags(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A column's truth per row (False for null, and for every row when there is no such column)."""
    if name not in frame.columns:
        return np.zeros(len(frame), dtype=bool)
    if frame[name].dtype == bool:
        return frame[name].to_numpy(copy=True)
    values = frame[name].to_numpy(dtype=object, copy=True)
    values[pd.isna(values)] = False
    return values.astype(bool)


def _codes(frame: pd.DataFrame, name: str) -> tuple[np.ndarray, list]:
    """Per row the number of its column's distinct value (-1: null, or no such column), and the values."""
    if name not in frame.columns or not len(frame):
        return np.full(len(frame), -1, dtype=np.int64), []
    return _factorized(frame[name])


def _factorized(column: pd.Series) -> tuple[np.ndarray, list]:
    """pd.factorize of the column's values as objects: per row the number of its value in order of first appearance
    (-1: null), and the values. A categorical by its codes, which numbers its values in the same order."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes, values = pd.factorize(column)
        return codes.astype(np.int64), list(values.astype(object))
    codes, values = pd.factorize(column.to_numpy(dtype=object))
    return codes.astype(np.int64), list(values)


def _connections(conn_id: np.ndarray, conn_key: pd.Series | None) -> tuple[np.ndarray, list[tuple]]:
    """Per row the number of its connection, and per number the connection's name: ("id", conn_id) where the id is
    known (≥ 0), else ("key", conn_key), else ("key", ("row", i)) (a connection of its own)."""
    n = len(conn_id)
    code = np.empty(n, dtype=np.int64)
    has_id = conn_id >= 0
    ids, id_code = np.unique(conn_id[has_id], return_inverse=True)
    code[has_id] = id_code.reshape(-1)
    names: list[tuple] = [("id", c) for c in ids.tolist()]
    if conn_key is not None:
        key_code, key_values = _factorized(conn_key)
    else:
        key_code, key_values = np.full(n, -1, dtype=np.int64), []
    by_key = ~has_id & (key_code >= 0)
    code[by_key] = len(names) + key_code[by_key]
    names += [("key", k) for k in key_values]
    alone = np.flatnonzero(~has_id & (key_code < 0))
    code[alone] = len(names) + np.arange(len(alone), dtype=np.int64)
    names += [("key", ("row", i)) for i in alone.tolist()]
    return code, names


class _Entries:
    """The slow-log entries: keys (filled in by _entry_keys), the window of their execution start, thread, address."""

    def __init__(self, slow: pd.DataFrame):
        n = self.n = len(slow)
        qt = slow["query_time_ns"].astype("Int64")
        self.qt_known = qt.notna().to_numpy()
        self.qt = qt.fillna(0).to_numpy(dtype=np.int64)
        self.line = slow["line"].to_numpy(dtype=np.int64)
        thread = slow["thread_id"].astype("Int64")
        self.thread = thread.fillna(-1).to_numpy(dtype=np.int64)
        self.sql = _column(slow, "sql", "")
        self.admin = _column(slow, "admin_command", None)
        self.cut = [bool(v) for v in _column(slow, "cut", False)]
        ips = _column(slow, "ip", None)
        hosts = _column(slow, "host", None)
        self.ip = [_norm_ip(v) for v in ips]
        self.socket = np.array([ip is None and (h is None or str(h).lower() == "localhost")
                                for ip, h in zip(self.ip, hosts)], dtype=bool)
        self.lo, self.hi = _start_windows(slow, self.qt)
        self.timed = self.lo <= self.hi
        self.keys: list[list[tuple]] = [[] for _ in range(n)]


def _start_windows(slow: pd.DataFrame, qt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi]: where the execution can have started, by every time field the entry has (each to its own
    resolution). lo > hi: no usable time, or fields that contradict each other."""
    n = len(slow)
    lo = np.full(n, -BIG, dtype=np.int64)
    hi = np.full(n, BIG, dtype=np.int64)
    any_time = np.zeros(n, dtype=bool)

    def clip(mask: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        np.maximum(lo, np.where(mask, a, -BIG), out=lo)
        np.minimum(hi, np.where(mask, b, BIG), out=hi)
        any_time[:] |= mask

    us = 1_000
    start, has = ts_ns(slow["start"])
    clip(has, start, start + us)
    end, has = ts_ns(slow["end"])
    clip(has, end - qt, end + us - qt)
    ts, has = ts_ns(slow["timestamp"])
    clip(has, ts, ts + NS - 1)
    time, has = ts_ns(slow["time"])
    precision = slow["time_precision_ns"].astype("Int64").fillna(NS).to_numpy(dtype=np.int64) \
        if "time_precision_ns" in slow.columns else np.full(n, NS, dtype=np.int64)
    meaning = np.asarray(_column(slow, "time_meaning", None), dtype=object)
    is_start, is_end = has & (meaning == "start"), has & (meaning == "end")
    either = has & ~is_start & ~is_end  # flavour unknown: the start or the end
    clip(is_start, time, time + precision - 1)
    clip(is_end, time - qt, time + precision - 1 - qt)
    clip(either, time - qt, time + precision - 1)
    lo[~any_time] = 1
    hi[~any_time] = 0
    return lo, hi


# --- slots: the statements of the exchanges -------------------------------------------------------------------------


EXECUTES = ("COM_STMT_EXECUTE", "COM_STMT_BULK_EXECUTE")


class _Templates:
    """The prepared texts of the exchanges' COM_STMT_EXECUTEs (template ids in order of first use), split at their
    markers, and which entries read as which template with which values."""

    def __init__(self, rows: _Rows):
        executes = [i for i, command in enumerate(rows.commands) if command in EXECUTES]
        execute = np.isin(rows.command_code, np.asarray(executes, dtype=np.int64))
        # the timed executes of a whole prepared text, and their template ids (first use first: pd.factorize's order,
        # of the texts' numbers as of the texts)
        self.rows = np.flatnonzero(execute & rows.timed & ~np.asarray(rows.sql_cut, dtype=bool) & (rows.sql_code >= 0))
        codes, firsts = pd.factorize(rows.sql_code[self.rows])
        texts = [rows.sqls[c] for c in firsts.tolist()]
        self.tid = codes.astype(np.int64)
        self.parts: list[list[str]] = [template_parts(text) for text in texts]

    def reads(self, entries: _Entries) -> list[list[tuple[int, tuple]]]:
        """Per entry: (template id, values key) of every template its text reads as (the prepared text with the
        values in place of its markers), in the order the keys are given."""
        out: list[list[tuple[int, tuple]]] = [[] for _ in range(entries.n)]
        if not self.parts:
            return out
        prefix_index = sorted({len(p[0]) for p in self.parts})
        by_first: dict[str, list[int]] = defaultdict(list)
        for tid, parts in enumerate(self.parts):
            by_first[parts[0]].append(tid)
        for e in range(entries.n):
            admin, sql = entries.admin[e], entries.sql[e] or ""
            if (isinstance(admin, str) and admin) or not sql.strip() or entries.cut[e]:
                continue
            text = logged_form(sql)
            for length in prefix_index:
                for tid in by_first.get(text[:length], ()):
                    values = template_values(text, self.parts[tid])  # no marker: the text itself, no values
                    if values is not None:
                        out[e].append((tid, _values_key(values)))
        return out


class _Wanted:
    """Which COM_STMT_EXECUTEs need their parameters decoded: those of a template some entry reads as, on the
    connection of the entry's thread when the wire names that connection (an entry of a known thread is only ever
    searched among its own connection's statements), on every connection otherwise; and of those, which get a
    slot: the ones whose key an entry has (`keys`). The others carry a key no entry has: no slot is made for
    them, which changes no decision (a slot without a key an entry has is never looked at, and a connection's
    chain keeps the order of the slots it has) and spares decoding the parameters of every execute, and a slot
    for each, to join a few entries. Where every entry reading of a template has a text value, an execute whose
    parameters are plain (`_PLAIN`) and hold none of those texts after a quote cannot have such a key: its
    parameters are not decoded (`could_be`)."""

    def __init__(self, rows: _Rows, entries: _Entries, reads: list[list[tuple[int, tuple]]]):
        known = rows.known_ids
        self.anywhere: set[int] = set()
        self.on_conn: set[tuple[int, int]] = set()
        # the executes' keys the entries can have (_entry_keys: ('x', …) from a reading, ('w', template) with it)
        self.keys: set[tuple] = set()
        for e, got in enumerate(reads):
            thread = int(entries.thread[e])
            for tid, values in got:
                self.keys.update((("x", tid, values), ("w", tid)))
                if thread in known:
                    self.on_conn.add((thread, tid))
                else:
                    self.anywhere.add(tid)
        self._texts = _reading_texts(self.keys)

    def could_be(self, tid: int, params: str) -> bool:
        """May an execute of template `tid` with this `params` text have a key an entry has?"""
        texts = self._texts.get(tid)
        return texts is None or not _PLAIN.fullmatch(params) or \
            any(body.startswith(texts) for body in _QUOTED.findall(params))

    def select(self, conn_id: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """Per execute (its connection id, -1 when unknown, and template id): does it need its parameters?"""
        wanted = np.isin(tid, np.fromiter(self.anywhere, dtype=np.int64, count=len(self.anywhere)))
        if self.on_conn:  # (thread, template) pairs as numbers: the thread's place among them, times the templates
            threads = np.array(sorted({c for c, _ in self.on_conn}), dtype=np.int64)
            width = int(max(tid.max(initial=0), max(t for _, t in self.on_conn))) + 1
            place = np.minimum(np.searchsorted(threads, conn_id), len(threads) - 1)
            pairs = np.array([int(np.searchsorted(threads, c)) * width + t for c, t in self.on_conn], dtype=np.int64)
            wanted |= (threads[place] == conn_id) & np.isin(place * width + tid, pairs)
        return wanted


def _reading_texts(keys: set[tuple]) -> dict[int, tuple[str, ...]]:
    """Per template, a text value of each of the entries' readings of it (`keys`), for `_Wanted.could_be`: a plain
    parameters text has its texts as the bodies of its quoted values (a time's body may go on: the reader trims the
    zeros of its fraction), so one with no body starting with one of them has no reading's key. A template with a
    reading without a text value is not listed: every execute of it may have that reading's key."""
    texts_of: dict[int, set[str] | None] = {}
    for key in keys:
        if key[0] == "x" and texts_of.get(key[1], ()) is not None:
            texts = [v[1] for v in key[2] if v[0] == "text"]
            texts_of[key[1]] = texts_of.get(key[1], set()) | {max(texts, key=len)} if texts else None
    return {tid: tuple(sorted(got)) for tid, got in texts_of.items() if got is not None}


class _Slots:
    """One slot per statement an exchange carries (several for a multi-statement COM_QUERY), with its text keys.
    Keys: ('t', text) exact logged form; ('c', command) administrator commands; ('x', template, values) a
    COM_STMT_EXECUTE with its decoded values; ('w', template) one whose values are unknown; ('p', prefix) a text
    cut on the wire; ('q', prefix) an exchange whose text starts with a cut entry's text. A COM_STMT_EXECUTE that
    no entry can be, or whose key no entry has (`_Wanted`), gets no slot."""

    def __init__(self, rows: _Rows, templates: _Templates, wanted: _Wanted):
        self.row = array.array("q")  # per slot: its exchange (machine integers: 8 bytes a slot)
        self.k: list[int] = []
        self.keys: list[tuple[tuple, ...]] = []  # per slot: its keys (one tuple shared by the executes of a key)
        self.by_key: dict[tuple, list[int]] = defaultdict(list)
        self.template_parts = templates.parts
        self.cut_prefixes: set[str] = set()  # texts of statements cut on the wire
        self.text_of: list[str | None] = []  # per slot: its statement text (for cut entries' prefix keys)
        others = np.ones(rows.n, dtype=bool)
        others[templates.rows] = False  # the executes of whole prepared texts: after the loop, as columns
        todo = np.flatnonzero(rows.timed & others)
        del others
        # a row's slots follow from its command, its text and whether the text was cut: worked out once per
        # distinct triple (the texts split and put in their logged form once, the key tuples shared by its rows)
        plans: dict[tuple[int, int, bool], list[tuple[int, tuple, str | None]]] = {}
        for r, command, sql, cut in zip(todo.tolist(), rows.command_code[todo].tolist(), rows.sql_code[todo].tolist(),
                                        rows.sql_cut[todo].tolist()):
            plan = plans.get((command, sql, cut))
            if plan is None:
                plan = plans[command, sql, cut] = self._plan(rows.commands[command] if command >= 0 else None,
                                                             rows.sqls[sql] if sql >= 0 else None, cut)
            for k, keys, text in plan:
                self._add(r, k, keys, text)
        del todo, plans
        chosen = np.flatnonzero(wanted.select(rows.conn_id[templates.rows], templates.tid))
        keys, code = _execute_keys(rows, templates.rows[chosen], templates.tid[chosen], wanted.could_be)
        asked = np.array([key in wanted.keys for key in keys] + [False], dtype=bool)[code]  # -1: it cannot be
        self._add_executes(templates.rows[chosen[asked]], keys, code[asked])

    def _plan(self, command: str | None, sql: str | None, cut: bool) -> list[tuple[int, tuple, str | None]]:
        """The slots of an exchange (not an execute of a whole prepared text) with this command, text (None: null)
        and cut flag, as (k, keys, text) in their order; a cut text's prefix joins `cut_prefixes`."""
        if command == ENCRYPTED:  # a TLS flight read without its content: any entry's text may be it
            return [(0, (ANY_TEXT,), None)]
        if command in ADMIN_NAMES:  # MySQL/Percona log these as '# administrator command: <name>;'
            return [(0, (("c", ADMIN_NAMES[command]),), None)]
        if sql is None:
            return []
        if command in EXECUTES:  # cut: a cut prepared text is no template, the exchange stays unmatchable
            return []  # (marked)
        if cut:
            text = _LEFT(sql).rstrip("\ufffd")  # a cut inside a multi-byte character decodes to U+FFFD
            parts = statements(text)
            plan = [(k, (("t", part),), part) for k, part in enumerate(parts[:-1])]
            prefix = parts[-1] if len(parts) > 1 else text
            if len(prefix) >= MIN_PREFIX_CHARS:
                self.cut_prefixes.add(prefix)
                plan.append((len(parts) - 1, (("p", prefix),), prefix))
            return plan
        text = logged_form(sql)
        parts = statements(text)
        if len(parts) == 1:
            return [(0, (("t", text),), text)]
        # the whole text too: a compound statement (BEGIN … END) has ';' inside and is logged whole
        return [(k, (("t", part),) + ((("t", text),) if k == 0 else ()), part) for k, part in enumerate(parts)]

    def _add_executes(self, executes: np.ndarray, keys: list[tuple], code: np.ndarray) -> None:
        """A slot for each of these executes (rows in order; one statement each, its key keys[code]) among the
        slots made so far, in the order of their rows, as _add would have made them."""
        if not len(executes):
            return
        made = len(self.row)
        row = np.concatenate([np.asarray(self.row, dtype=np.int64), executes])
        k = np.concatenate([np.asarray(self.k, dtype=np.int64), np.zeros(len(executes), dtype=np.int64)])
        order = np.lexsort((k, row))
        slot = np.empty(len(order), dtype=np.int64)
        slot[order] = np.arange(len(order))
        one = [(key,) for key in keys]
        all_keys = self.keys + [one[c] for c in code.tolist()]
        all_texts = self.text_of + [None] * len(executes)
        at = order.tolist()
        self.row, self.k = _int64s(row[order]), k[order].tolist()
        self.keys, self.text_of = [all_keys[i] for i in at], [all_texts[i] for i in at]
        renumbered = slot[:made].tolist()  # the slots made so far keep their order among themselves
        for slots in self.by_key.values():
            slots[:] = [renumbered[s] for s in slots]
        mine = slot[made:]
        by_code = np.argsort(code, kind="stable")
        for group in np.split(by_code, np.flatnonzero(np.diff(code[by_code])) + 1):
            self.by_key[keys[int(code[group[0]])]] = mine[group].tolist()  # executes' keys: ('x' | 'w', …) only

    def _add(self, r: int, k: int, keys: tuple[tuple, ...], text: str | None) -> None:
        s = len(self.row)
        self.row.append(r)
        self.k.append(k)
        self.keys.append(keys)
        self.text_of.append(text)
        for key in keys:
            self.by_key[key].append(s)

    def add_key(self, s: int, key: tuple) -> None:
        self.keys[s] = (*self.keys[s], key)
        self.by_key[key].append(s)


# The key of an exchange whose text is unknown (mysql.connection.ENCRYPTED_COMMAND: a TLS flight without a key
# log), which every entry also carries: such an exchange joins an entry by its connection (thread id), its time and
# the order of both, as the module's rules say, and never by text.
ENCRYPTED = "ENCRYPTED"
ANY_TEXT = ("e",)


def _LEFT(sql: str) -> str:
    """A cut text's logged form: only its start is known, so only the start is trimmed."""
    text = sql.lstrip(" \t\n\r\v\f")
    return "\n".join(line.rstrip("\r") for line in text.split("\n")) if "\r" in text else text


def _execute_keys(rows: _Rows, executes: np.ndarray, tids: np.ndarray,
                  could_be=lambda tid, params: True) -> tuple[list[tuple], np.ndarray]:
    """The distinct keys of these executes (of templates `tids`): ('x', template, values) or ('w', template), and
    per execute the number of its key, -1 for one whose key `could_be(template, params)` says no entry has. The
    parameters of each distinct text are decoded once."""
    codes, texts = rows.params_of(executes)  # -1: no parameters column value
    width = len(texts) + 1
    pairs, which = np.unique(tids * width + (codes + 1), return_inverse=True)
    numbers: dict[tuple, int] = {}  # two texts may read as the same values ('5', '05'): one key
    per_pair = []
    values_of: dict[int, tuple | None] = {}  # a text of executes of several templates is read once
    for pair in pairs.tolist():
        tid, text = pair // width, pair % width - 1
        if text >= 0 and not could_be(tid, texts[text]):
            per_pair.append(-1)
            continue
        if text not in values_of:
            values_of[text] = _params_key(texts[text] if text >= 0 else None)
        values = values_of[text]
        key = ("w", tid) if values is None else ("x", tid, values)
        per_pair.append(numbers.setdefault(key, len(numbers)))
    return list(numbers), np.asarray(per_pair, dtype=np.int64)[which.reshape(-1)]


_INTEGERS = re.compile(r"-?[0-9]+(?:, -?[0-9]+)*")
# integers and quoted strings without a quote or backslash inside: each string's text is its body as written
_PLAIN = re.compile(r"(?:-?[0-9]+|'[^'\\]*')(?:, (?:-?[0-9]+|'[^'\\]*'))*")
_QUOTED = re.compile(r"'([^']*)'")


def _params_key(params: str | None) -> tuple | None:
    """An execute's `params` column as the key of its values (`_values_key`), None when they are not all known
    (unreadable, or long data). Integers only, the common case, are keyed without the literal reader: the same
    key, `_num_key` of an integer being its decimal digits without leading zeros."""
    if params is not None and _INTEGERS.fullmatch(params):
        return tuple(("num", str(int(v))) for v in params.split(", "))
    values = parse_params(params)
    return None if values is None or WILDCARD in values else _values_key(values)


def _values_key(values: list[tuple]) -> tuple:
    """Values as a hashable key: numbers by value (15 significant digits: servers print floats with fewer or more
    digits than repr()), text exactly."""
    out = []
    for v in values:
        if v[0] == "num":
            out.append(("num", _num_key(v[1])))
        elif v[0] == "text":
            number = _text_number(v[1])
            out.append(("num", number) if number is not None else v)
        else:
            out.append(v)
    return tuple(out)


def _num_key(d) -> str:
    try:
        if d == d.to_integral_value():
            return str(int(d))
        return format(float(d), ".15g")
    except (OverflowError, ValueError, ArithmeticError):
        return str(d)


def _text_number(text: str) -> str | None:
    """A text that is a plain decimal number (a DECIMAL parameter goes on the wire as a string, the log writes it
    bare) as a number key; None otherwise."""
    got = read_literal(text, 0) if text[:1] in "+-.0123456789" else None
    if got is not None and got[1] == len(text) and got[0][0] == "num":
        return _num_key(got[0][1])
    return None


# --- entry keys ---------------------------------------------------------------------------------------------------


def _entry_keys(entries: _Entries, slots: _Slots, reads: list[list[tuple[int, tuple]]],
                encrypted: bool | None = None) -> None:
    """Give each entry the keys of the slots it can meet: its exact text, its command, a template reading
    (`_Templates.reads`), and the prefixes where one side was cut. `encrypted`: whether any exchange is a TLS
    flight read without its content (None: whether one of `slots` is)."""
    texts: list[tuple[str, int]] = []  # (text, entry) of every entry with a statement, for prefix searches
    if encrypted is None:
        encrypted = ANY_TEXT in slots.by_key
    for e in range(entries.n):
        if encrypted:  # on a TLS connection read without a key log, time and order alone decide
            entries.keys[e].append(ANY_TEXT)
        admin = entries.admin[e]
        if isinstance(admin, str) and admin:
            entries.keys[e].append(("c", admin.strip().lower()))
            continue
        sql = entries.sql[e] or ""
        if not sql.strip():
            continue
        if entries.cut[e]:
            text = _LEFT(sql)
            if len(text) >= MIN_PREFIX_CHARS:
                entries.keys[e].append(("q", text))
            texts.append((text, e))
            continue
        text = logged_form(sql)
        entries.keys[e].append(("t", text))
        texts.append((text, e))
        for tid, values in reads[e]:  # COM_STMT_EXECUTE: the prepared text with the values in place of '?'
            entries.keys[e].append(("x", tid, values))
            if ("w", tid) in slots.by_key:
                entries.keys[e].append(("w", tid))
    texts.sort()
    sorted_texts = [t for t, _ in texts]
    for prefix in slots.cut_prefixes:  # exchanges cut on the wire: the entries whose text starts so
        for text, e in _starting_with(texts, sorted_texts, prefix):
            entries.keys[e].append(("p", prefix))
    cut = sorted({key[1] for keys in entries.keys for key in keys if key[0] == "q"})
    if cut:  # entries cut in the log: the exchanges whose statement starts so
        slot_texts = sorted((t, s) for s, t in enumerate(slots.text_of) if t is not None)
        sorted_slot_texts = [t for t, _ in slot_texts]
        for prefix in cut:
            for _, s in _starting_with(slot_texts, sorted_slot_texts, prefix):
                slots.add_key(s, ("q", prefix))


def _starting_with(items: list[tuple[str, int]], keys: list[str], prefix: str):
    """The items (sorted by text; `keys` their texts) whose text starts with `prefix`, at most SCAN_LIMIT."""
    i = bisect.bisect_left(keys, prefix)
    end = min(len(items), i + SCAN_LIMIT)
    while i < end and keys[i].startswith(prefix):
        yield items[i]
        i += 1


# --- the search ---------------------------------------------------------------------------------------------------


def _int64s(values: np.ndarray) -> array.array:
    """An int64 array's values as an array.array: a sequence that bisect, indexing and loops read as Python ints.
    Copied from the array's memory (no bytes object of it made on the way)."""
    out = array.array("q")
    out.frombytes(memoryview(np.ascontiguousarray(values, dtype=np.int64)).cast("B"))
    return out


def _viewed(ints: array.array) -> np.ndarray:
    """The int64 numpy array over an array.array's memory (no copy; the array.array must not grow while it is
    read so: nothing appends to the rows' arrays)."""
    return np.frombuffer(ints, dtype=np.int64) if len(ints) else np.zeros(0, dtype=np.int64)


class _TimeIndex:
    """Items with an interval [start, start + width], for "which items may overlap [b, a]": start ≤ a and
    start + width ≥ b. Items are kept in classes of similar width (powers of 4 of a millisecond), each sorted by
    start, so one long item does not widen the search among short ones."""

    def __init__(self, ids: np.ndarray, start: np.ndarray, width: np.ndarray, reach: int = 0):
        self.reach = reach  # the largest clock tolerance among the items: how far beyond a query they may fit
        width = np.maximum(width, 0)
        cls = np.zeros(len(ids), dtype=np.int64)
        big = width > 1_000_000
        cls[big] = (np.log2(width[big] / 1_000_000) / 2).astype(np.int64) + 1
        # ids and starts as machine integers (8 bytes an item, not a Python int's 36 and more: an index of the
        # exchanges of every connection is one of each exchange), which bisect and the loops read as sequences;
        # each class's ids also as an array over the same bytes, for slices
        self.classes = []
        for c in np.unique(cls):
            sel = np.flatnonzero(cls == c)
            order = sel[np.argsort(start[sel], kind="stable")]
            class_ids = _int64s(ids[order])
            self.classes.append((class_ids, _int64s(start[order]), int(width[order].max()),
                                 np.frombuffer(class_ids, dtype=np.int64)))

    def query(self, a: int, b: int):
        """Items that may have start ≤ a and start + width ≥ b, latest start first within each class."""
        for ids, start, widest, _ in self.classes:
            hi = bisect.bisect_right(start, a)
            lo = bisect.bisect_left(start, b - widest)
            for i in range(hi - 1, lo - 1, -1):
                yield ids[i]

    def slices(self, a: int, b: int):
        """The same items as query, as one array per class."""
        for _, start, widest, ids in self.classes:
            hi = bisect.bisect_right(start, a)
            lo = bisect.bisect_left(start, b - widest)
            if hi > lo:
                yield ids[lo:hi]


class _Search:
    """Feasibility of (entry, exchange) and the indexes the searches use."""

    def __init__(self, rows: _Rows, entries: _Entries, slots: _Slots):
        self.rows, self.entries, self.slots = rows, entries, slots
        self.slot_row = np.asarray(slots.row, dtype=np.int64)
        # sequences of Python ints for the per-pair checks (numpy scalars cost several times more in a Python
        # loop): the times and the tolerance of every exchange as machine integers (8 bytes each, a list's ints
        # 40), the same memory as the rows' numpy arrays
        self._d1, self._d4, self._tol = rows.d1_ints, rows.d4_ints, rows.tol_ints
        self._lo, self._hi, self._qt = entries.lo.tolist(), entries.hi.tolist(), entries.qt.tolist()
        ips = {ip: i for i, ip in enumerate(sorted({*rows.ip_values, *entries.ip} - {None}))}
        # per distinct address of the rows, then per row (a row without one: the -1 appended last)
        self.row_ip = np.array([ips.get(ip, -1) for ip in rows.ip_values] + [-1], dtype=np.int64)[rows.ip_code]
        self.entry_ip = [ips.get(ip, -1) for ip in entries.ip]
        self._indexes: dict[object, _TimeIndex] = {}

    def fits(self, e: int, s: int) -> bool:
        return self.fits_row(e, self.slots.row[s])

    def fits_row(self, e: int, r: int) -> bool:
        """The entry's execution can lie inside the exchange's [D1, D4] (and the client address agrees)."""
        tol = self._tol[r]
        a = self._d1[r] - tol
        lo = self._lo[e]
        if lo > a:
            a = lo
        b = self._d4[r] + LOG_WRITE_SLACK_NS + tol - self._qt[e]
        hi = self._hi[e]
        if hi < b:
            b = hi
        if a > b:
            return False
        ip_e = self.entry_ip[e]
        return ip_e < 0 or self.row_ip[r] < 0 or ip_e == self.row_ip[r]

    def fitting_rows(self, e: int, rows: np.ndarray) -> np.ndarray:
        """fits_row for many rows at once."""
        R = self.rows
        tol = R.tol[rows]
        a = np.maximum(self._lo[e], R.d1[rows] - tol)
        b = np.minimum(self._hi[e], R.d4[rows] + LOG_WRITE_SLACK_NS + tol - self._qt[e])
        ok = a <= b
        ip_e = self.entry_ip[e]
        if ip_e >= 0:
            ip_r = self.row_ip[rows]
            ok &= (ip_r < 0) | (ip_r == ip_e)
        return rows[ok]

    def slot_index(self, key: tuple) -> _TimeIndex:
        index = self._indexes.get(("slots", key))
        if index is None:
            ids = np.asarray(self.slots.by_key[key], dtype=np.int64)
            r = self.slot_row[ids]
            index = self._indexes[("slots", key)] = _TimeIndex(ids, self.rows.d1[r], self.rows.d4[r] - self.rows.d1[r],
                                                                int(self.rows.tol[r].max()))
        return index

    def row_index(self, name, rows) -> _TimeIndex:
        """The index of the exchanges `rows()` lists, built once under `name`."""
        index = self._indexes.get(("rows", name))
        if index is None:
            ids = rows()
            index = self._indexes[("rows", name)] = _TimeIndex(
                ids, self.rows.d1[ids], self.rows.d4[ids] - self.rows.d1[ids],
                int(self.rows.tol[ids].max()) if len(ids) else 0)
        return index

    def bounds(self, e: int, reach: int = APP_CLOCK_TOLERANCE_NS) -> tuple[int, int]:
        """(a, b) for _TimeIndex.query over exchanges: D1 ≤ latest start + tolerance, D4 ≥ earliest end − slack."""
        return self._hi[e] + reach, self._lo[e] + self._qt[e] - LOG_WRITE_SLACK_NS - reach

    def find(self, e: int, index: _TimeIndex, allowed, enough, found: list[int]) -> bool:
        """Add to `found` the slots of `index` that fit entry e and pass `allowed`, until `enough(found)`;
        True when SCAN_LIMIT stopped the search first."""
        fits_row, slot_row = self.fits_row, self.slots.row
        for steps, s in enumerate(index.query(*self.bounds(e, index.reach))):
            if steps >= SCAN_LIMIT:
                return True
            if s not in found and fits_row(e, slot_row[s]) and allowed(s):
                found.append(s)
                if enough(found):
                    break
        return False


# --- the join -----------------------------------------------------------------------------------------------------


def rows_for_join(t: pd.DataFrame) -> pd.DataFrame:
    """The join's view of decompose.build_table's output: D1/D4 on the DB clock where the DB saw the exchange
    (else the app's A1/A4), the statement, and the connection (id, or endpoints as the DB saw them).
    Text made of the endpoints is made once per distinct value (per connection), not once per exchange."""
    valid = t["_t_valid"].to_numpy()
    ends = t[["db_client", "server", "capture", "client"]]
    conn, first = _distinct_rows(ends)
    one = ends.iloc[first]
    db_client = one["db_client"].astype(object).to_numpy()
    client = one["client"].astype(object).to_numpy().astype(str)
    server = one["server"].astype(object).to_numpy().astype(str)
    capture = one["capture"].astype(object).to_numpy().astype(str)
    has_db = pd.notna(db_client)
    conn_key = np.where(has_db, "db|" + db_client.astype(str) + "|" + server,
                        "app|" + capture + "|" + client + "|" + server)
    key_code, keys = pd.factorize(conn_key)  # two endpoint rows may name one connection (the DB's view of it)
    ip_code, ips = pd.factorize(np.array([_ip_of(c) for c in db_client] + [None], dtype=object)[:-1])
    problem_codes, problem_texts = _distinct(t["problems"])  # each distinct text looked at once
    cut_kinds = np.array([isinstance(v, str) and "sql-cut" in v for v in problem_texts] + [False], dtype=bool)
    # the texts as the table has them: the join numbers them (_codes), a categorical by its codes
    return pd.DataFrame({
        "conn_id": t["conn_id"].astype("Int64"),
        "conn_key": pd.Series(pd.Categorical.from_codes(key_code[conn], keys), index=t.index),
        "command": t["command"],
        "sql": t["sql"],
        "params": t["params"],  # read only for the executes an entry can be (_Rows.params_of)
        "sql_cut": cut_kinds[problem_codes],
        "client_ip": pd.Series(pd.Categorical.from_codes(ip_code[conn], ips), index=t.index),
        "db_clock": (t["seen"] != "app").to_numpy(),
        "start_ns": pd.Series(t["_d1_raw"].to_numpy(), dtype="Int64").where(valid),
        "end_ns": pd.Series(t["_d4_raw"].to_numpy(), dtype="Int64").where(valid),
    })


def wire_statements(t: pd.DataFrame) -> WireStatements:
    """The statements of the exchanges (build_table's columns command, sql, problems, bytes_req) a slow log's
    header lines could hide in, for the slow-log reader (slowlog.reader.WireStatements): the whole ones that hold
    header-like lines, in their logged form; those cut on the wire (--max-sql-bytes), by their known start and
    their size from the request's length; prepared ones holding header-like lines up to their first parameter."""
    if not len(t):
        return WireStatements()
    codes, texts_seen = _distinct(t["sql"])  # each distinct text looked at once
    holds = np.array([isinstance(v, str) and holds_header_lines(v) for v in texts_seen] + [False], dtype=bool)
    problem_codes, problem_texts = _distinct(t["problems"])
    cut_kinds = np.array([isinstance(v, str) and "sql-cut" in v for v in problem_texts] + [False], dtype=bool)
    was_cut = cut_kinds[problem_codes]
    maybe = holds[codes] | was_cut
    if not maybe.any():
        return WireStatements()
    rows = np.flatnonzero(maybe)
    texts = np.asarray(texts_seen, dtype=object)[codes[rows]]
    commands = t["command"].astype(object).to_numpy()[rows]
    sizes = (t["bytes_req"].to_numpy(dtype=np.int64)[rows] if "bytes_req" in t.columns
             else np.full(len(rows), -1, dtype=np.int64))
    whole: list[str] = []
    cut: list[tuple[str, int | None]] = []
    for text, command, cut_here, size in zip(texts, commands, was_cut[rows], sizes):
        if not isinstance(text, str):
            continue
        if command in ("COM_STMT_EXECUTE", "COM_STMT_BULK_EXECUTE"):
            marks = placeholders(text)
            if marks and not cut_here:
                cut.append((_LEFT(text[: marks[0]]), None))
                continue
        if command != "COM_QUERY" and not cut_here:
            whole.append(logged_form(text))
            continue
        parts = statements(text) if command == "COM_QUERY" else [logged_form(text)]
        if cut_here:
            whole += [p for p in parts[:-1] if holds_header_lines(p)]
            # a packet's bytes less its header and command byte (and 4 per further packet of a long one)
            payload = int(size) - 5 - 4 * (int(size) // (0xFFFFFF + 4)) if size > 0 else -1
            cut.append((_LEFT(text) if len(parts) == 1 else parts[-1], payload if payload > 0 else None))
        else:
            whole += [p for p in parts if holds_header_lines(p)]
    return WireStatements(whole, cut)


def _distinct(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(codes, distinct values) of a column, -1 for null: a categorical's own codes and categories (no pass over
    the rows' values), else pd.factorize."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy(dtype=np.int64), column.cat.categories.to_numpy(dtype=object)
    codes, values = pd.factorize(column.astype(object))
    return codes, np.asarray(values, dtype=object)


def _distinct_rows(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the number of its distinct combination of values (null equals null), and the first row of each."""
    if not len(frame):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    number = np.zeros(len(frame), dtype=np.int64)
    for name in frame.columns:  # the combinations so far, then with this column: numbered in order of first row
        codes, values = pd.factorize(frame[name], use_na_sentinel=True)
        number = pd.factorize(number * (len(values) + 1) + (codes + 1))[0].astype(np.int64)
    _, first = np.unique(number, return_index=True)
    return number, first


def join_slow_log(rows: pd.DataFrame, slow: pd.DataFrame | None, name: str = "slow log") -> SlowLogJoin:
    """Join slow-log entries (read_slow_log's table) to exchange rows (`rows_for_join`): see the module doc."""
    n = len(rows)
    if slow is None or len(slow) == 0:
        return _empty(n, 0 if slow is None else len(slow))
    state = _state(rows, slow, None)
    del rows  # _Rows has what the join reads of it: a view handed over (decompose's) goes now
    state.run()
    return state.result(name)


def joined_part(rows: pd.DataFrame, slow: pd.DataFrame, context: JoinContext) -> PartJoin:
    """The join of some of the exchanges (`rows_for_join`'s rows, in the table's order) and the entries that can
    only be theirs: a thread's entries and its connection's rows, or the entries of no known connection and every
    row without an id (explain/partitioned_join.py). `context` says what the other rows would: with it the
    decisions are join_slow_log's for these entries and rows. The undecided marks are recorded, not made: their
    budget is spent over every entry in log order (`spent_marks`), which the caller replays."""
    state = _state(rows, slow, context)
    del rows
    state.decide()
    entry, qt, entry_row, per_row, kinds = state.joined_rows()
    marks = {e: state.recorded_marks(e) for e in state.to_mark()}
    return PartJoin(entry, qt, state.reason.copy(), marks, [e for e in state.todo if e not in state.on_known],
                    entry_row >= 0, state.how.copy(), dict(kinds), sum(1 for c in per_row.values() if c > 1),
                    len(state.identified))


def _state(rows: pd.DataFrame, slow: pd.DataFrame, context: JoinContext | None) -> _State:
    """The join's state before its decisions: the rows, the entries, the slots and their keys."""
    R = _Rows(rows, context)
    del rows
    E = _Entries(slow)
    T = _Templates(R)
    reads = T.reads(E)
    S = _Slots(R, T, _Wanted(R, E, reads))
    _entry_keys(E, S, reads, None if context is None else context.encrypted)
    return _State(R, E, S, _Search(R, E, S))


def view_context(view: pd.DataFrame) -> JoinContext:
    """The JoinContext of `rows_for_join`'s rows alone; `combined_context` joins those of several pieces."""
    start, end = view["start_ns"].astype("Int64"), view["end_ns"].astype("Int64")
    timed = (start.notna() & end.notna()).to_numpy()
    d1, d4 = start.fillna(0).to_numpy(dtype=np.int64), end.fillna(0).to_numpy(dtype=np.int64)
    conn = view["conn_id"].astype("Int64")
    commands = view["command"].astype(object).to_numpy()
    return JoinContext(_span(d1, d4, _tolerances(view), timed),
                       set(np.unique(conn.dropna().to_numpy(dtype=np.int64)).tolist()),
                       bool((timed & (commands == ENCRYPTED)).any()))


def combined_context(contexts: list[JoinContext]) -> JoinContext:
    """The JoinContext of the rows of several pieces, from each piece's."""
    spans = [c.span for c in contexts if c.span[0] <= c.span[1]]
    return JoinContext((min(a for a, _ in spans), max(b for _, b in spans)) if spans else (0, -1),
                       set().union(*(c.known_ids for c in contexts)), any(c.encrypted for c in contexts))


def spent_marks(steps, budget: int) -> tuple[list[np.ndarray], int, int]:
    """An unjoined entry's undecided marks under the budget left: `steps` are its (cost, fit) in order (the rows of
    an index slice examined, and a function giving those of them to mark); each step costs its slice, none is
    taken once the budget is spent or MARK_LIMIT rows are marked. Returns the rows marked, the budget left and the
    cuts (each counted in undecided_search_cut)."""
    marks: list[np.ndarray] = []
    marked = cuts = 0
    for cost, fit in steps:
        if budget <= 0 or marked >= MARK_LIMIT:
            return marks, budget, cuts + 1
        budget -= cost
        rows = fit()
        if marked + len(rows) > MARK_LIMIT:
            rows = rows[: MARK_LIMIT - marked]
            cuts += 1
        marks.append(rows)
        marked += len(rows)
    return marks, budget, cuts


def mark_budget(rows: int, entries: int) -> int:
    """The exchanges the undecided marks may examine in all: MARK_STEPS per exchange and entry of the input."""
    return MARK_STEPS * (rows + entries)


def logs_admin_commands(admin) -> bool:
    """Whether the log writes administrator commands (MySQL/Percona with log_slow_admin_statements: entries of an
    `admin_command`): then their absence says they ran fast, as a statement's does."""
    return any(isinstance(a, str) and a for a in admin)


def unlogged_rows(command_code: np.ndarray, commands: list, logs_commands: bool) -> np.ndarray:
    """Per row (its command's number among `commands`, -1: none), whether its command is one the server does not
    write to its slow log: its absence from the log says nothing about its execution."""
    # A TLS flight without a key log (ENCRYPTED) is taken as a statement the server logs: an administrator
    # command that runs past long_query_time is not met in practice.
    return np.array([c not in LOGGED_COMMANDS and c != ENCRYPTED and (not logs_commands or c == "CONNECT")
                     for c in [*commands, None]], dtype=bool)[command_code]  # per command, then per row


def undecided_rows(marked: np.ndarray, entry: np.ndarray, unlogged: np.ndarray) -> tuple[np.ndarray, int, int]:
    """Per row, whether its place in the log is unknown: marked as an unjoined entry's possible exchange and joined
    to none, or of an unlogged command and joined to none; with the counts of the two kinds (stats). `marked` is
    changed in place."""
    marked &= entry < 0
    doubtful = int(marked.sum())  # exchanges an unjoined entry may describe
    unlogged = unlogged & (entry < 0) & ~marked
    marked |= unlogged
    return marked, doubtful, int(unlogged.sum())


def command_codes(command: pd.Series) -> tuple[np.ndarray, list]:
    """Per row the number of its command among the distinct ones (-1: null), and the commands, as the join reads
    them (`unlogged_rows`' input)."""
    return _factorized(command)


class _ChainPositions:
    """Per key, the positions (ascending) in a connection's chain of its slots with that key, a position once per
    time the slot has the key (a dict's `get`, made when a key is first asked for: only the keys of the entries of
    the connection's thread are)."""

    def __init__(self, ids: np.ndarray, by_key: dict[tuple, list[int]]):
        # the chain's slots sorted, and each one's position: a slot's position found by a search, not read from an
        # array over every slot (one such array per connection grows as connections × slots)
        self._order = np.argsort(ids, kind="stable")
        self._sorted = ids[self._order]
        self._by_key = by_key
        self._made: dict[tuple, list[int]] = {}

    def get(self, key: tuple, default=None):
        got = self._made.get(key)
        if got is None:
            slots = self._by_key.get(key)
            if not slots:
                return default
            slots = np.asarray(slots, dtype=np.int64)
            at = np.minimum(np.searchsorted(self._sorted, slots), max(len(self._sorted) - 1, 0))
            mine = self._sorted[at] == slots if len(self._sorted) else np.zeros(len(slots), dtype=bool)
            got = self._made[key] = np.sort(self._order[at[mine]]).tolist()
        return got if got else default


def _slots_by_connection(rows: _Rows, slot_row: np.ndarray) -> dict[tuple, np.ndarray]:
    """Per connection name, its slots (ascending)."""
    if not len(slot_row):
        return {}
    codes = rows.conn_code[slot_row]
    order = np.argsort(codes, kind="stable")
    starts = np.flatnonzero(np.r_[True, codes[order][1:] != codes[order][:-1]])
    return {rows.conn_names[c]: part for c, part in zip(codes[order][starts].tolist(), np.split(order, starts[1:]))}


class _State:
    """The decisions, entry by entry: joined (to a slot, and how) or a reason; exchanges marked undecided."""

    def __init__(self, rows: _Rows, entries: _Entries, slots: _Slots, search: _Search):
        self.R, self.E, self.S, self.search = rows, entries, slots, search
        self.reason = np.full(entries.n, "", dtype=object)
        self.joined = np.full(entries.n, -1, dtype=np.int64)  # slot
        self.how = np.full(entries.n, "", dtype=object)  # order | unique | inferred
        self.slot_taken: dict[int, int] = {}
        self.undecided = np.zeros(rows.n, dtype=bool)
        self.marks_cut = 0
        self.mark_budget = mark_budget(rows.n, entries.n)
        self.identified: dict[int, tuple] = {}  # thread -> mid-stream connection, named by its entries
        self.owner: dict[tuple, int] = {}  # the inverse
        self.cands: dict[int, list[int] | None] = {}
        self.slot_conn = rows.conn_of(slots.row)
        self.slot_k = np.asarray(slots.k, dtype=np.int64)
        self.conn_slots = _slots_by_connection(rows, search.slot_row)
        self._rows_of: dict[tuple, np.ndarray] | None = None
        self._joined_by_thread: dict[int, list] | None = None
        known = self.known = rows.known_ids
        self.todo: list[int] = []
        for e in range(entries.n):
            why = self._pre_reason(e)
            if why:
                self.reason[e] = why
            else:
                self.todo.append(e)
        self.on_known = {e for e in self.todo if entries.thread[e] in known}

    def _pre_reason(self, e: int) -> str:
        E, R, S = self.E, self.R, self.S
        if E.socket[e]:
            return "socket"
        if not E.qt_known[e]:
            return "no-query-time"
        if not E.timed[e]:
            return "no-time"
        lo, hi = R.span
        if E.hi[e] < lo or E.lo[e] + E.qt[e] > hi:
            return "outside-capture"
        keys = E.keys[e]
        if keys and keys[0][0] == "c" and ADMIN_COMMANDS.get(keys[0][1]) in NO_RESPONSE:
            return "command-without-response"
        if not any(key in S.by_key for key in keys):
            return "no-text-match"
        return ""

    def run(self) -> None:
        self.decide()
        for e in self.to_mark():  # what an unjoined entry may describe is undecided
            marks, self.mark_budget, cuts = spent_marks(self._mark_steps(e), self.mark_budget)
            self.marks_cut += cuts
            for rows in marks:
                self.undecided[rows] = True

    def decide(self) -> None:
        """Each entry joined or given its reason: a known thread's entries by order on its connection, the others by
        uniqueness (naming mid-stream connections on the way)."""
        by_thread: dict[int, list[int]] = defaultdict(list)
        for e in self.on_known:
            by_thread[int(self.E.thread[e])].append(e)
        for thread, es in by_thread.items():
            self._chain(("id", thread), sorted(es, key=lambda e: self.E.line[e]), how="order")
        free = [e for e in self.todo if e not in self.on_known]
        for _ in range(64):  # name mid-stream connections by their entries; order decides on them too
            self._free(free)
            new = self._identify(free)
            if not new:
                break
            for thread, conn in new.items():
                es = [e for e in free if self.E.thread[e] == thread]
                for e in es:
                    self._unjoin(e)
                    self.reason[e] = ""
                self._chain(conn, sorted(es, key=lambda e: self.E.line[e]), how="inferred")
            free = [e for e in free if self.E.thread[e] not in self.identified]

    def to_mark(self) -> list[int]:
        """The entries whose possible exchanges are marked undecided, in log order: the unjoined ones that may be
        on the wire."""
        return [e for e in range(self.E.n) if self.joined[e] < 0 and self.reason[e] not in NOT_ON_THE_WIRE]

    # -- a thread on a known connection: order ---------------------------------------------------------------

    def _chain_slots(self, conn: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
        """A connection's slots in execution order, their D1 and D4, and per key the positions of its slots:
        gathered when its thread's entries are joined and let go after (a connection is joined once: kept for
        the whole join, every connection's chain was ≈ 40 bytes a slot of every connection held at once)."""
        ids = np.asarray(self.conn_slots.get(conn, []), dtype=np.int64)
        rows = self.search.slot_row[ids]
        order = np.lexsort((self.slot_k[ids], self.R.d1[rows])) if len(ids) else ids
        ids, rows = ids[order], rows[order]
        return ids, self.R.d1[rows], self.R.d4[rows], _ChainPositions(ids, self.S.by_key)

    def _positions(self, e: int, per_key: dict) -> list[int]:
        keys = self.E.keys[e]
        if len(keys) == 1:
            return per_key.get(keys[0], [])
        return sorted({p for key in keys for p in per_key.get(key, ())})

    def _first(self, e: int, chain, positions: list[int], after: int) -> int | None:
        """The first position > after whose slot fits e; None when none can (positions are in time order)."""
        ids, d1, _, _ = chain
        upper = self.search.bounds(e)[0]
        i = bisect.bisect_right(positions, after)
        for steps in range(SCAN_LIMIT):
            if i >= len(positions) or d1[positions[i]] > upper:
                return None
            if self.search.fits(e, int(ids[positions[i]])):
                return positions[i]
            i += 1
        raise _ScanLimit

    def _last(self, e: int, chain, positions: list[int], before: int) -> int | None:
        """The last position < before whose slot fits e; None when none can."""
        ids, _, d4, _ = chain
        lower = self.search.bounds(e)[1]
        i = bisect.bisect_left(positions, before) - 1
        for steps in range(SCAN_LIMIT):
            if i < 0 or d4[positions[i]] < lower:
                return None
            if self.search.fits(e, int(ids[positions[i]])):
                return positions[i]
            i -= 1
        raise _ScanLimit

    def _chain(self, conn: tuple, es: list[int], how: str) -> None:
        """A thread's entries (log order) against its connection's statements (execution order): an entry joins
        when the earliest and the latest order-keeping assignment give it the same statement."""
        chain = self._chain_slots(conn)
        ids, _, _, per_key = chain
        early: dict[int, int] = {}
        live: list[int] = []
        prev = -1
        for e in es:
            positions = self._positions(e, per_key)
            try:
                p = self._first(e, chain, positions, prev)
                if p is None:
                    if self._first(e, chain, positions, -1) is None:
                        self.reason[e] = "no-time-fit" if positions else "no-text-match"
                        continue
                    self._unique_within(es, chain)  # the log's order contradicts the wire's
                    return
            except _ScanLimit:
                self.reason[e] = "search-limit"
                continue
            early[e] = p
            live.append(e)
            prev = p
        nxt = len(ids)
        late: dict[int, int] = {}
        for e in reversed(live):
            try:
                p = self._last(e, chain, self._positions(e, per_key), nxt)
            except _ScanLimit:
                p = None
            late[e] = early[e] if p is None else p  # None cannot follow a successful forward pass
            nxt = late[e]
        for e in live:
            if early[e] == late[e]:
                self._join(e, int(ids[early[e]]), how)
            else:
                self.reason[e] = "ambiguous"

    def _unique_within(self, es: list[int], chain) -> None:
        """Order contradicted: join only entries with one fitting statement that fits no other of the entries."""
        ids, _, _, per_key = chain
        fits: dict[int, list[int]] = {}
        users: dict[int, int] = defaultdict(int)
        for e in es:
            if self.reason[e] in ("no-time-fit", "no-text-match", "search-limit"):
                continue
            cands = []
            for p in self._positions(e, per_key)[:SCAN_LIMIT]:
                if self.search.fits(e, int(ids[p])):
                    cands.append(int(ids[p]))
                    if len(cands) > 2:
                        break
            fits[e] = cands
            for s in cands:
                users[s] += 1
        for e, cands in fits.items():
            if len(cands) == 1 and users[cands[0]] == 1:
                self._join(e, cands[0], "order")
            else:
                self.reason[e] = "order-conflict" if cands else "no-time-fit"

    # -- entries without a known connection: uniqueness ---------------------------------------------------------

    def _allowed(self, e: int, s: int) -> bool:
        """May entry e (whose thread the wire does not name) be on slot s's connection? Not on one with an id when
        the entry has a thread id (that thread's own connection would carry it), not on another thread's."""
        conn = self.slot_conn[s]
        thread = int(self.E.thread[e])
        if thread >= 0 and conn[0] == "id":
            return False
        owner = self.owner.get(conn)
        return owner is None or owner == thread

    def _free(self, free: list[int]) -> None:
        """Join an entry when exactly one statement fits it and no other entry fits that statement. Each entry's
        fitting statements (up to CANDIDATE_LIMIT) are kept for _identify."""
        single: dict[int, int] = {}
        for e in free:
            if self.joined[e] >= 0:
                self._unjoin(e)
            found: list[int] = []
            limited = False
            for key in self.E.keys[e]:
                if key in self.S.by_key:
                    limited |= self.search.find(e, self.search.slot_index(key), lambda s, e=e: self._allowed(e, s),
                                                self._enough, found)
                if self._enough(found):
                    break
            self.cands[e] = None if limited or len(found) > CANDIDATE_LIMIT else found
            if len(found) >= 2:
                self.reason[e] = "ambiguous"
            elif limited:
                self.reason[e] = "search-limit"
            elif not found:
                self.reason[e] = "no-time-fit"
            else:
                single[e] = found[0]
        index = self._entry_index(free)
        for e, s in single.items():
            if self._entries_fitting(s, index, limit=2) == 1:
                self._join(e, s, "unique")
            else:
                self.reason[e] = "ambiguous"

    def _enough(self, found: list[int]) -> bool:
        """Stop listing an entry's candidates once it can be neither joined alone (two found) nor pin a connection
        (two connections among them), or past CANDIDATE_LIMIT."""
        if len(found) < 2:
            return False
        first = self.slot_conn[found[0]]
        return self.slot_conn[found[-1]] != first or len(found) > CANDIDATE_LIMIT

    def _entry_index(self, free: list[int]) -> dict[tuple, _TimeIndex]:
        by_key: dict[tuple, list[int]] = defaultdict(list)
        for e in free:
            for key in self.E.keys[e]:
                by_key[key].append(e)
        E = self.E
        out = {}
        for key, es in by_key.items():
            ids = np.asarray(es, dtype=np.int64)
            out[key] = _TimeIndex(ids, E.lo[ids], E.hi[ids] - E.lo[ids])
        return out

    def _entries_fitting(self, s: int, index: dict[tuple, _TimeIndex], limit: int) -> int:
        """How many entries (up to `limit`) of `index` fit slot s and may be on its connection."""
        r = self.S.row[s]
        a = int(self.R.d4[r]) + LOG_WRITE_SLACK_NS + int(self.R.tol[r])
        b = int(self.R.d1[r]) - int(self.R.tol[r])
        seen: set[int] = set()
        for key in self.S.keys[s]:
            if key not in index:
                continue
            for steps, e in enumerate(index[key].query(a, b)):
                if steps >= SCAN_LIMIT:
                    return limit  # too many to tell: count it as shared
                if e not in seen and self.search.fits(e, s) and self._allowed(e, s):
                    seen.add(e)
                    if len(seen) >= limit:
                        return limit
        return len(seen)

    def _identify(self, free: list[int]) -> dict[int, tuple]:
        """Mid-stream connections named by the entries: thread t is on connection C when at least MIN_ANCHORS of
        its entries fit statements of C and of no other connection, no other of its entries is pinned to another
        connection, and no entry of another thread is pinned to C. (Each such entry is on C unless its own
        exchange escaped every capture; two agreeing ones make that coincidence no explanation.)"""
        pinned: dict[int, list[tuple]] = defaultdict(list)
        pinned_by: dict[tuple, set[int]] = defaultdict(set)
        for e in free:
            thread = int(self.E.thread[e])
            cands = self.cands.get(e)
            if thread < 0 or not cands:
                continue
            conns = {self.slot_conn[s] for s in cands}
            if len(conns) == 1:
                conn = conns.pop()
                pinned[thread].append(conn)
                pinned_by[conn].add(thread)
        new = {}
        for thread, conns in pinned.items():
            conn = conns[0]
            if (thread not in self.identified and len(conns) >= MIN_ANCHORS and len(set(conns)) == 1
                    and conn[0] == "key" and pinned_by[conn] == {thread} and conn not in self.owner):
                new[thread] = conn
        self.identified.update(new)
        self.owner = {c: t for t, c in self.identified.items()}
        return new

    # -- bookkeeping ----------------------------------------------------------------------------------------------

    def _join(self, e: int, s: int, how: str) -> None:
        other = self.slot_taken.get(s)
        if other is not None and other != e:  # two decisions claim one statement: neither is sure
            self._unjoin(other)
            self.reason[other] = self.reason[e] = "ambiguous"
            return
        self.joined[e] = s
        self.how[e] = how
        self.reason[e] = ""
        self.slot_taken[s] = e

    def _unjoin(self, e: int) -> None:
        s = int(self.joined[e])
        if s >= 0 and self.slot_taken.get(s) == e:
            del self.slot_taken[s]
        self.joined[e] = -1
        self.how[e] = ""

    def recorded_marks(self, e: int) -> list[tuple[int, np.ndarray | None]]:
        """This unjoined entry's mark steps as spent_marks takes them without a budget: (cost, rows marked, None for
        the step that found MARK_LIMIT reached). Replayed with the budget left (the rows are this state's)."""
        steps: list[list] = []

        def recording():
            for cost, fit in self._mark_steps(e):
                step = [cost, None]
                steps.append(step)

                def fitted(fit=fit, step=step):
                    step[1] = fit()
                    return step[1]
                yield cost, fitted
        spent_marks(recording(), BIG)
        return [(cost, rows) for cost, rows in steps]

    def _mark_steps(self, e: int):
        """The exchanges that could be this unjoined entry's, whatever their text (it may be written differently):
        on its thread's connection when known, between the exchanges of the thread's joined entries before and
        after it (the order); else on any connection without an id. Whether they are in the log is unknown. As
        spent_marks' steps: per index slice its length and the function giving its rows that fit."""
        thread = int(self.E.thread[e])
        conn = ("id", thread) if thread in self.known else self.identified.get(thread)
        R = self.R
        after, before = -BIG, BIG
        if conn is not None:
            name, rows = conn, lambda: self._conn_rows(conn)
            after, before = self._neighbours(e, thread)
        elif thread >= 0:
            name, rows = "free", lambda: np.flatnonzero(R.timed & (R.conn_id < 0))
        else:
            name, rows = "all", lambda: np.flatnonzero(R.timed)
        index = self.search.row_index(name, rows)

        def fitting(chunk: np.ndarray) -> np.ndarray:
            fit = self.search.fitting_rows(e, chunk)
            if conn is not None:
                d1 = R.d1[fit]
                fit = fit[(d1 >= after) & (d1 <= before)]
            return fit

        for chunk in index.slices(*self.search.bounds(e, index.reach)):
            yield len(chunk), lambda chunk=chunk: fitting(chunk)

    def _conn_rows(self, conn: tuple) -> np.ndarray:
        if self._rows_of is None:
            self._rows_of = self.R.rows_by_conn(np.flatnonzero(self.R.timed))
        return self._rows_of.get(conn, np.zeros(0, dtype=np.int64))

    def _neighbours(self, e: int, thread: int) -> tuple[int, int]:
        """D1 of the exchanges joined to the thread's entries just before and just after e in the log."""
        if self._joined_by_thread is None:
            self._joined_by_thread = defaultdict(list)
            for x in np.flatnonzero(self.joined >= 0).tolist():
                self._joined_by_thread[int(self.E.thread[x])].append((int(self.E.line[x]), x))
            for items in self._joined_by_thread.values():
                items.sort()
        items = self._joined_by_thread.get(thread, [])
        i = bisect.bisect_left(items, (int(self.E.line[e]), -1))
        d1 = lambda x: int(self.R.d1[self.S.row[int(self.joined[x])]])  # noqa: E731
        return (d1(items[i - 1][1]) if i > 0 else -BIG), (d1(items[i][1]) if i < len(items) else BIG)

    # -- result ---------------------------------------------------------------------------------------------------

    def joined_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict, dict]:
        """Per row its first joined entry in log order (-1) and Σ Query_time of its joined entries; per entry its
        row (-1); the joined entries per row and how each entry's keys met (for the stats)."""
        R, E, S = self.R, self.E, self.S
        entry = np.full(R.n, -1, dtype=np.int64)
        qt = np.zeros(R.n, dtype=np.int64)
        entry_row = np.full(E.n, -1, dtype=np.int64)
        per_row: dict[int, int] = defaultdict(int)
        kinds: dict[str, int] = defaultdict(int)
        for e in np.argsort(E.line, kind="stable").tolist():
            s = int(self.joined[e])
            if s < 0:
                continue
            r = S.row[s]
            entry_row[e] = r
            if entry[r] < 0:
                entry[r] = e
            qt[r] += int(E.qt[e])
            per_row[r] += 1
            common = {key[0] for key in S.keys[s]} & {key[0] for key in E.keys[e]}
            kinds["prefix" if common & {"p", "q"} else "params" if "x" in common else
                  "template" if "w" in common else "command" if "c" in common else
                  "time" if common == {"e"} else "text"] += 1
        return entry, qt, entry_row, per_row, kinds

    def result(self, name: str) -> SlowLogJoin:
        R, E = self.R, self.E
        entry, qt, entry_row, per_row, kinds = self.joined_rows()
        # Commands the server does not write to its slow log (MariaDB: COM_PING, COM_INIT_DB, binary prepares,
        # logins...; MySQL/Percona only with log_slow_admin_statements, which shows as administrator-command
        # entries): their absence from the log says nothing about their execution.
        unlogged = unlogged_rows(R.command_code, R.commands, logs_admin_commands(E.admin))
        self.undecided, doubtful, unlogged_count = undecided_rows(self.undecided, entry, unlogged)
        joined = entry_row >= 0
        stats, warnings = join_stats(E, R.span, R.n, self.reason, joined, self.how, kinds, len(self.identified),
                                     sum(1 for c in per_row.values() if c > 1), doubtful, unlogged_count,
                                     int(self.marks_cut), name)
        return SlowLogJoin(entry, stats["matched"] > 0, stats, warnings, qt, self.undecided, self.reason.copy(),
                           entry_row)


def slow_entries(slow: pd.DataFrame) -> _Entries:
    """The slow log's entries as the join reads them (their times, threads, texts), for `join_stats`."""
    return _Entries(slow)


def join_stats(E: _Entries, span: tuple[int, int], rows: int, reason: np.ndarray, joined: np.ndarray,
               how: np.ndarray, kinds: dict[str, int], identified: int, several: int, doubtful: int, unlogged: int,
               marks_cut: int, name: str) -> tuple[dict, list[str]]:
    """summary.json's slow_log counts of a join and its warnings, from its answer per entry (`reason`: '' when
    joined; `joined`; `how`: the rule that joined it), the captures' span and rows, the joined entries by kind of
    key (`kinds`), the connections named by their entries, the rows joined to several entries, the undecided rows
    of both kinds and the marks the budget cut. One rule for join_slow_log and the partitioned join (which sums
    these over its parts: explain/partitioned_join.py)."""
    matched = int(joined.sum())
    lo, hi = span
    window = E.timed & (E.hi >= lo) & (E.lo + E.qt <= hi) if rows else np.zeros(E.n, dtype=bool)
    reasons = pd.Series(reason[~joined], dtype=object).value_counts()
    how_counts = pd.Series(how[joined], dtype=object).value_counts()
    stats = {
        "entries": E.n,
        "entries_in_capture_window": int(window.sum()),
        "matched": matched,
        "unmatched_in_capture_window": int((window & ~joined).sum()),
        "joined_by": {k: int(how_counts.get(k, 0)) for k in ("order", "unique", "inferred")},
        "joined_on": {k: int(kinds.get(k, 0)) for k in ("text", "params", "template", "prefix", "command", "time")},
        "unjoined": {k: int(reasons[k]) for k in REASONS if k in reasons},
        "connections_identified": identified,
        "exchanges_with_several_entries": several,
        "exchanges_undecided": doubtful,
        "exchanges_of_unlogged_commands": unlogged,  # the other ones of unknown place in the log
        "undecided_search_cut": marks_cut,
        "unjoined_examples": [
            {"line": int(E.line[e]), "reason": str(reason[e]),
             "thread_id": None if E.thread[e] < 0 else int(E.thread[e]),
             "query_time_s": float(E.qt[e]) / NS if E.qt_known[e] else None,
             "sql": formats.clip(E.sql[e] or (f"administrator command: {E.admin[e]}" if E.admin[e] else ""),
                                 200, flat=False)}
            for e in np.flatnonzero(~joined & window)[:MAX_EXAMPLES].tolist()],
    }
    warnings = []
    if matched == 0:
        why = "none of its entries falls within the captures' time" if not window.any() else \
            "no entry matched an exchange"
        warnings.append(f"{name}: {why}; analysed without the slow log")
    else:
        unclear = {k: v for k, v in stats["unjoined"].items() if k in ("ambiguous", "order-conflict", "search-limit")}
        if unclear:
            parts = ", ".join(f"{v} {k}" for k, v in unclear.items())
            warnings.append(f"{name}: {sum(unclear.values())} entries not joined ({parts}); "
                            f"{stats['exchanges_undecided']} exchanges may or may not be in the slow log")
    return stats, warnings


class _ScanLimit(Exception):
    pass
