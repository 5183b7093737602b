"""Slow log stage: parse a MySQL / Percona Server / MariaDB slow query log (file output) into entries and a table.

The core (`SlowLogParser`, `parse_slow_log`) is sans-IO: lines in, `SlowLogEntry` records out. `read_slow_log`
opens the file (plain or gzip), refuses what is clearly not a slow log, and builds the table declared once in
`schema.SLOWLOG_COLUMNS`.

Why the parser is a small state machine and not a split on "# Time:": a statement may itself contain lines that
look exactly like entry headers (a `# ...` SQL comment, or a string literal spanning lines). The server writes
every statement followed by ";\n" (and strips the client's own trailing ';' and blanks first), so a header line
only starts a new entry right after a line ending in ';' -- and, to be sure, only when the run of '#' lines it
opens holds a `# Query_time:` line. A run that does not is SQL. A log cut mid-statement (no ';') is detected
when a complete header block (Time/User@Host ... Query_time) follows, or at the end of the input.

Times: MySQL 5.7+ writes `# Time:` as ISO 8601 with zone (the moment the entry was written, i.e. the statement's
end); MySQL 5.6, Percona 5.x and MariaDB write `YYMMDD H:MM:SS` in the server's local time without zone (pass
`tz`), and MariaDB only when the second changes, so entries without their own `# Time:` inherit the previous one.
MariaDB 10.11's `# Time:` is the second the statement *started* (recorded: a SLEEP(1.2) started at :19.09 is
logged under `# Time: ... :19`). `SET timestamp=N;` is the statement's start, whole seconds, UTC epoch.
"""

from __future__ import annotations

import bisect
import datetime as dt
import gzip
import io
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from pcapdecomp.core.errors import SlowLogError
from pcapdecomp.core.schema import SLOWLOG_COLUMNS

__all__ = [
    "SlowLogEntry",
    "SlowLogStats",
    "SlowLogParser",
    "WireStatements",
    "parse_slow_log",
    "read_slow_log",
    "entries_to_frame",
    "SLOWLOG_COLUMNS",
]

UTC = dt.timezone.utc
MAX_WARNINGS = 50  # past this, warnings are only counted (a badly damaged log would otherwise flood the report)
MAX_HEADER_LOOKAHEAD = 200  # '#' lines held back while deciding whether a header-like line starts an entry
MAX_HEADER_LOOKAHEAD_CHARS = 1 << 20  # and their characters at most (memory stays bounded on hostile logs)
MAX_SQL_BYTES = 1 << 20  # statement text kept per entry (like --max-sql-bytes on the wire); the rest is counted
# Ranges of the numbers read from a log. A value outside is damage (counted, warned, read as unknown), never a
# crash or a wrong number: the times must fit int64 ns (pandas' datetime64[ns] ends in 2262).
MAX_DURATION_S = 10**8  # Query_time / Lock_time: ~3 years (a clock step can make the server write nonsense)
MIN_EPOCH_NS = 0  # 1970-01-01
MAX_EPOCH_NS = 7_258_118_400 * 1_000_000_000  # 2200-01-01
MAX_COUNTER = 2**63 - 1  # Rows_*, Bytes_*, Thread_id, Errno, Killed: int64


@dataclass(frozen=True, slots=True)
class SlowLogEntry:
    """One slow-log entry: the header block plus the statement it describes."""

    line: int  # 1-based line of the entry's first header line (its own '# Time:' line when it has one)
    time_ns: int | None  # '# Time:' (own or inherited), ns since epoch UTC: MySQL end, MariaDB start second
    timestamp_s: int | None  # 'SET timestamp=N;': statement start, whole seconds since epoch (UTC)
    start_ns: int | None  # MySQL 8 log_slow_extra 'Start:' (start of execution), ns since epoch UTC
    end_ns: int | None  # MySQL 8 log_slow_extra 'End:'
    user: str | None  # login user: the bracketed name of 'user[user] @ host [ip]'
    host: str | None  # client host name, None when the server logged none
    ip: str | None  # client address, None when empty (local socket connections)
    thread_id: int | None  # MySQL 'Id:' / 'Thread_id:', MariaDB/Percona 'Thread_id:' (= connection id on the wire)
    schema: str | None  # default database: 'Schema:' or the 'use db;' line before the statement
    query_time_ns: int | None  # 'Query_time:' (execution only: not thread-pool queue time); None when damaged
    lock_time_ns: int | None
    rows_sent: int | None
    rows_examined: int | None
    rows_affected: int | None
    bytes_sent: int | None
    errno: int | None  # MySQL 'Errno:', Percona 'Last_errno:'
    killed: int | None
    extra: dict[str, str]  # every other 'Key: value' pair, verbatim; 'explain' holds MariaDB's '# explain:' lines
    sql: str  # statement text, prefix lines ('use x;', 'SET timestamp=...;') and the final ';' removed
    admin_command: str | None  # '# administrator command: Quit;' -> 'Quit' (sql is then '')
    cut: bool = False  # the statement text is incomplete: the log ended or was broken inside it, or it was capped
    time_precision_ns: int | None = None  # resolution of time_ns: 10**9 for whole seconds, 1000 for µs
    time_iso: bool = False  # '# Time:' in ISO 8601 (MySQL 5.7+, Percona 5.7+: the end); else YYMMDD (flavour-bound)


@dataclass
class SlowLogStats:
    """What parsing one slow log found. Lines are counted once each; `unparsed_lines` are lines that belong to no
    entry and are not a server file header or blank (garbage), plus the lines of header blocks that were dropped
    because they never reached a '# Query_time:' line."""

    lines: int = 0
    entries: int = 0
    unparsed_lines: int = 0
    warnings: list[str] = field(default_factory=list)
    flavor: str = "unknown"  # 'mysql' | 'percona' | 'mariadb' | 'unknown'
    server_headers: int = 0  # server file headers seen ('... Version: ... started with:'): start, restart, flush
    cut_entries: int = 0  # entries whose statement text is incomplete
    warnings_dropped: int = 0  # warnings not kept in `warnings` (over MAX_WARNINGS)
    damaged_values: int = 0  # numbers or times out of range or unreadable: read as unknown (None), each warned
    capped_statements: int = 0  # statements longer than max_sql_bytes: kept up to the cap and marked cut
    capped_bytes: int = 0  # statement bytes not kept because of the cap
    line_dropped: int = 0  # bytes the reader dropped from the line being fed (a line longer than it reads)
    wire_sql_entries: int = 0  # header blocks read as SQL: they lie inside a statement the wire shows whole
    unverified_entries: int = 0  # entries that may begin inside a statement the wire shows only in part (cut)

    def warn(self, message: str) -> None:
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(message)
        else:
            self.warnings_dropped += 1

    def damage(self, lineno: int, what: str, text: str) -> None:
        self.damaged_values += 1
        self.warn(f"line {lineno}: {what} {text[:40]!r} out of range or unreadable; read as unknown")


# --- line grammar -------------------------------------------------------------------------------------------

# The server's own file header, written at start, after FLUSH SLOW LOGS and on reopen; may appear mid-file.
_SERVER_HEADER = (
    re.compile(r"^\S.*, Version: (?P<version>.+) started with:$"),
    re.compile(r"^Tcp port: \d+\s+Unix socket: .*$"),
    re.compile(r"^Time\s+Id\s+Command\s+Argument$"),
)
_TIME = re.compile(r"^# Time: (?P<value>\S+(?: +\S+)?)\s*(?:# (?P<rest>User@Host: .*))?$")
_ISO_TIME = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2})T(?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})(?:\.(?P<frac>\d{1,9}))?"
    r"(?P<zone>Z|[+-]\d{2}:?\d{2})?$"
)
_SHORT_TIME = re.compile(
    r"^(?P<y>\d{2})(?P<mo>\d{2})(?P<d>\d{2}) +(?P<h>\d{1,2}):(?P<m>\d{2}):(?P<s>\d{2})(?:\.(?P<frac>\d{1,9}))?$"
)
_USER_HOST = re.compile(
    r"^# User@Host: (?P<priv>[^\[]*)\[(?P<user>[^\]]*)\] @ (?P<host>[^\[]*?) *\[(?P<ip>[^\]]*)\]"
    r"(?:\s+Id:\s*(?P<id>\d+))?\s*$"
)
# Any value (also a damaged one: signed, exponent, garbage) delimits entries; _freeze checks the value.
_QUERY_TIME = re.compile(r"^# Query_time: (?P<qt>\S+)\s")
_DURATION = re.compile(r"(?P<whole>\d{1,12})(?:\.(?P<frac>\d+))?")
_ADMIN = re.compile(r"^# administrator command: (?P<cmd>.*?);?\s*$")
# 'Key: value'; also 'Key:value' with a number right after the colon (percona-toolkit's slow034: 'Rows_examined:40')
_KEY_SPLIT = re.compile(r"(?:^|(?<=\s))([A-Za-z_][A-Za-z0-9_]*):(?=\s|$|\d)")
_USE = re.compile(r"^use (?P<db>`(?:[^`]|``)*`|\S+);$", re.IGNORECASE)
# The server writes digits; a damaged value is still the server's line (before the statement), not SQL.
_SET_TIMESTAMP = re.compile(r"^SET (?P<assign>(?:[a-z_]+=[^,;\s]+,)*)timestamp=(?P<ts>[^,;\s]+);$")
_NOTES = ("# No InnoDB statistics available for this query",)

_INT_FIELDS = {  # header key -> SlowLogEntry field, for integer values
    "Rows_sent": "rows_sent",
    "Rows_examined": "rows_examined",
    "Rows_affected": "rows_affected",
    "Bytes_sent": "bytes_sent",
    "Errno": "errno",
    "Last_errno": "errno",
    "Killed": "killed",
    "Thread_id": "thread_id",
}


def _is_server_header(line: str) -> bool:
    if line.startswith("#") or not (", Version: " in line or line.startswith(("Tcp port: ", "Time"))):
        return False  # the cheap test first: this runs on every line
    return any(p.match(line) for p in _SERVER_HEADER)


def _seconds_to_ns(text: str) -> int:
    """'2.000173' -> 2000173000, exactly (no float on the way; digits past ns are dropped). ValueError for
    anything but a non-negative decimal of at most MAX_DURATION_S."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ValueError(text)
    ns = int(m["whole"]) * 1_000_000_000 + int(((m["frac"] or "") + "000000000")[:9])
    if ns > MAX_DURATION_S * 1_000_000_000:
        raise ValueError(text)
    return ns


def _counter(text: str) -> int:
    """A non-negative integer that fits int64; ValueError otherwise."""
    if not (text.isascii() and text.isdigit() and len(text) <= 19) or int(text) > MAX_COUNTER:
        raise ValueError(text)
    return int(text)


def _looks_like_time(value: str) -> bool:
    """The shape of a '# Time:' value (ISO or YYMMDD), whether or not it is a valid moment."""
    return bool(_ISO_TIME.match(value) or _SHORT_TIME.match(value))


def _frac_ns(frac: str | None) -> int:
    return int((frac + "000000000")[:9]) if frac else 0


def parse_log_time(value: str, tz: dt.tzinfo = UTC) -> int | None:
    """A '# Time:' / 'Start:' / 'End:' value -> ns since epoch UTC; None when it is not a time, not a valid
    moment, or outside [MIN_EPOCH_NS, MAX_EPOCH_NS]. Values without a zone are local time in `tz`."""
    try:
        m = _ISO_TIME.match(value)
        if m:
            zone = m["zone"]
            if zone is None:
                tzinfo: dt.tzinfo = tz
            elif zone == "Z":
                tzinfo = UTC
            else:
                sign = -1 if zone[0] == "-" else 1
                digits = zone[1:].replace(":", "")
                tzinfo = dt.timezone(sign * dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
            date = dt.date.fromisoformat(m["date"])
            moment = dt.datetime(date.year, date.month, date.day, int(m["h"]), int(m["m"]), int(m["s"]),
                                 tzinfo=tzinfo)
        else:
            m = _SHORT_TIME.match(value)
            if not m:
                return None
            moment = dt.datetime(2000 + int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["m"]),
                                 int(m["s"]), tzinfo=tz)
        ns = _epoch_ns(moment) + _frac_ns(m["frac"])
    except (ValueError, OverflowError):  # no such date, a zone of a day or more, a zone past year 1 or 9999
        return None
    return ns if MIN_EPOCH_NS <= ns < MAX_EPOCH_NS else None


def _time_precision_ns(value: str) -> int:
    """Resolution of a time value: 10**9 for whole seconds, 10**(9 - digits) with a fraction."""
    m = _ISO_TIME.match(value) or _SHORT_TIME.match(value)
    digits = len(m["frac"]) if m and m["frac"] else 0
    return 10 ** (9 - digits)


def _epoch_ns(moment: dt.datetime) -> int:
    delta = moment - dt.datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def parse_key_values(text: str) -> dict[str, str]:
    """'Thread_id: 8  Schema:   QC_hit: No' -> {'Thread_id': '8', 'Schema': '', 'QC_hit': 'No'}.
    A key is a word followed by ':' and a blank; its value runs to the next key (values may be empty)."""
    parts = _KEY_SPLIT.split(text)  # [before, key1, value1, key2, value2, ...]
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def _unquote_db(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] == "`":
        return name[1:-1].replace("``", "`")
    return name


# --- the state machine --------------------------------------------------------------------------------------


class WireStatements:
    """The statements seen on the wire that a slow log's header lines could hide in, in their logged form
    (`sqltext.logged_form`). The server writes a statement into its slow log as is, newlines included, so a string
    literal can hold a whole header block; where such a block lies inside a statement the wire shows, it is SQL.
    `whole`: texts the wire shows complete that hold header-like lines; `cut`: (known start, length in bytes of
    the whole statement or None when unknown) of statements the wire shows only in part: cut at --max-sql-bytes,
    or a prepared statement's text up to its first parameter (the log writes values there)."""

    SCAN = 64  # cut statements examined per header-like line (a log cannot make the check quadratic)

    def __init__(self, whole: Iterable[str] = (), cut: Iterable[tuple[str, int | None]] = ()):
        self.whole = sorted(set(whole))
        pairs = sorted(set(cut), key=lambda pair: pair[0])
        self.cut = [text for text, _ in pairs]
        self.cut_size = [size for _, size in pairs]

    def __len__(self) -> int:
        return len(self.whole) + len(self.cut)

    @classmethod
    def of_parts(cls, parts: Iterable[WireStatements]) -> WireStatements:
        """The statements of several parts of the exchanges (partitions): the same as of them all at once (the
        texts are kept as sets)."""
        whole: set[str] = set()
        cut: set[tuple[str, int | None]] = set()
        for part in parts:
            whole.update(part.whole)
            cut.update(zip(part.cut, part.cut_size))
        return cls(whole, cut)

    @staticmethod
    def _starts_one(texts: list[str], prefix: str) -> bool:
        i = bisect.bisect_left(texts, prefix)
        return i < len(texts) and texts[i].startswith(prefix)

    def _cut_sizes(self, so_far: str) -> Iterator[int | None]:
        """The whole sizes of the cut statements whose known start agrees with `so_far` (one is a prefix of the
        other)."""
        i = bisect.bisect_left(self.cut, so_far)
        for k in range(i, min(i + self.SCAN, len(self.cut))):  # known starts that continue so_far
            if not self.cut[k].startswith(so_far):
                break
            yield self.cut_size[k]
        k = i - 1
        for _ in range(self.SCAN):  # known starts that so_far continues: sorted just before it
            if k < 0:
                break
            if so_far.startswith(self.cut[k]):
                yield self.cut_size[k]
            elif self.cut[k][:1] != so_far[:1]:
                break
            k -= 1

    def reads(self, sql_lines: list[str], line: str, capped: bool, size: int) -> str | None:
        """What a header-like `line` after the statement lines `sql_lines` (`size`: their bytes in the log, line
        feeds and the bytes a cap dropped included) is: 'sql' when the statement so far, this line included, is
        the start of a statement the wire shows; 'unverified' when the wire cannot tell (its copy, or the log's,
        is cut before the line and the statement may go on past it); None when no statement of the wire holds it."""
        so_far = "\n".join(sql_lines)
        text = so_far + "\n" + line if sql_lines else line
        if not capped and (self._starts_one(self.whole, text) or self._starts_one(self.cut, text)):
            return "sql"
        if capped and self._starts_one(self.whole, so_far):
            return "unverified"
        if not sql_lines or not self.cut:
            return None
        reach = size + 1 + len(line.encode("utf-8", "surrogatepass"))
        for whole_size in self._cut_sizes(so_far):
            if whole_size is None or reach <= whole_size:  # the statement may go on past this line
                return "unverified"
        return None


class _Draft:
    """An entry being assembled. Mutable on purpose; frozen into a SlowLogEntry when complete."""

    __slots__ = ("line", "nlines", "time_ns", "time_precision_ns", "time_iso", "has_user_host", "values", "user",
                 "host", "ip", "priv_user", "id", "use_db", "timestamp_s", "set_assign", "sql", "admin", "explain",
                 "in_sql", "prefix_done", "sql_bytes", "capped", "last_nonblank", "size")

    def __init__(self, line: int, time_ns: int | None, time_precision_ns: int | None = None, time_iso: bool = False):
        self.line = line
        self.nlines = 0
        self.time_ns = time_ns
        self.time_precision_ns = time_precision_ns if time_ns is not None else None
        self.time_iso = time_iso
        self.has_user_host = False
        self.values: dict[str, str] = {}
        self.user = self.host = self.ip = self.priv_user = None
        self.id: int | None = None
        self.use_db: str | None = None
        self.timestamp_s: int | None = None
        self.set_assign: str = ""
        self.sql: list[str] = []
        self.admin: str | None = None
        self.explain: list[str] = []
        self.in_sql = False  # past the header block
        self.prefix_done = False  # a statement line was seen: 'use'/'SET timestamp' are SQL from now on
        self.sql_bytes = 0  # UTF-8 bytes of the statement lines kept (with their line feeds)
        self.capped = False  # statement lines past max_sql_bytes were not kept
        self.size = 0  # UTF-8 bytes of the statement lines with their line feeds, kept or not
        self.last_nonblank: str | None = None  # the last non-blank statement line, kept or not (its ';' counts)

    @property
    def has_query_time(self) -> bool:
        return "Query_time" in self.values


class SlowLogParser:
    """Feed lines (without or with their line ending) with `feed`; call `close` at the end. Complete entries are
    returned by both. Stats accumulate in `self.stats`."""

    def __init__(self, tz: dt.tzinfo = UTC, max_sql_bytes: int = MAX_SQL_BYTES, wire: WireStatements | None = None):
        self.tz = tz
        self.max_sql_bytes = max_sql_bytes
        self.wire = wire if wire else None  # statements of the capture holding header-like lines
        self._unverified_at: int | None = None  # line from which an entry may begin inside a statement the wire
        #                                         shows cut: the first entry from there is counted unverified
        self.stats = SlowLogStats()
        self._lineno = 0
        self._draft: _Draft | None = None
        self._last_time: tuple[int | None, int | None, bool] = (None, None, False)  # MariaDB writes '# Time:'
        # only when the second changes: (ns, precision, iso) of the last one, inherited by the entries after it
        self._pending: list[tuple[int, str]] = []  # header-like lines inside SQL, awaiting a decision
        self._pending_chars = 0
        self._pending_after_semicolon = False
        self._flavor_votes: list[str] = []

    # public -----------------------------------------------------------------------------------------------

    def feed(self, line: str) -> list[SlowLogEntry]:
        self._lineno += 1
        self.stats.lines += 1
        line = line.rstrip("\r\n")
        out: list[SlowLogEntry] = []
        if self._pending:
            self._feed_pending(self._lineno, line, out)
        else:
            self._feed_line(self._lineno, line, out)
        return out

    def close(self) -> list[SlowLogEntry]:
        out: list[SlowLogEntry] = []
        if self._pending:
            self._resolve_pending_at_end(out)
        self._finish(out, at_eof=True)
        self.stats.flavor = self._flavor()
        return out

    # dispatch ---------------------------------------------------------------------------------------------

    def _feed_line(self, lineno: int, line: str, out: list[SlowLogEntry]) -> None:
        draft = self._draft
        if self.wire is not None and draft is not None and draft.in_sql and draft.admin is None \
                and (starts_entry(line) or _is_server_header(line)) and self._read_by_wire(draft, lineno, line):
            return
        if _is_server_header(line):
            if _SERVER_HEADER[0].match(line):
                self.stats.server_headers += 1
                self._vote_version(_SERVER_HEADER[0].match(line)["version"])
            self._finish(out)
            return
        if draft is None or not draft.in_sql:
            if line.startswith("#"):
                self._header_line(lineno, line, out)
            elif draft is None:
                if line.strip():
                    self.stats.unparsed_lines += 1
            else:
                draft.in_sql = True
                self._statement_line(draft, line)
            return
        # in a statement: a header-like line may start the next entry, or be part of the SQL
        if starts_entry(line):
            # no statement line yet means the last line was a prefix line ('SET timestamp=...;'), also ';'-ended;
            # blank lines after a statement's ';' are not part of it (the server strips trailing blanks)
            last = draft.last_nonblank
            after_semicolon = last is None or last.endswith(";") or draft.admin is not None
            if after_semicolon or not _QUERY_TIME.match(line):
                self._pending = [(lineno, line)]
                self._pending_chars = len(line)
                self._pending_after_semicolon = after_semicolon
                if after_semicolon and _QUERY_TIME.match(line):
                    self._start_from_pending(out)
                return
        self._statement_line(draft, line)

    def _read_by_wire(self, draft: _Draft, lineno: int, line: str) -> bool:
        """A line that would end the statement (an entry header, a server header) read against the wire: True when
        the wire shows it inside the statement (then it was added to it as SQL, whatever it looks like)."""
        reading = self.wire.reads(draft.sql, line, draft.capped, draft.size)
        if reading == "sql":
            if _QUERY_TIME.match(line):
                self.stats.wire_sql_entries += 1
            self._statement_line(draft, line)
            return True
        if reading == "unverified" and self._unverified_at is None:
            self._unverified_at = lineno
        return False

    def _feed_pending(self, lineno: int, line: str, out: list[SlowLogEntry]) -> None:
        if line.startswith("#") and len(self._pending) < MAX_HEADER_LOOKAHEAD \
                and self._pending_chars + len(line) <= MAX_HEADER_LOOKAHEAD_CHARS:
            self._pending.append((lineno, line))
            self._pending_chars += len(line)
            if _QUERY_TIME.match(line):
                self._start_from_pending(out)
            return
        if _is_server_header(line):  # the log was reopened here: the held-back lines end like at EOF
            self._resolve_pending_at_end(out)
        else:  # a statement line: the '#' lines were SQL comments
            self._pending_to_sql()
        self._feed_line(lineno, line, out)

    def _resolve_pending_at_end(self, out: list[SlowLogEntry]) -> None:
        """No '# Query_time:' will come. After a ';' the lines are a header block cut short (dropped, counted);
        otherwise they are the end of the statement."""
        if self._pending_after_semicolon or any(text.endswith(";") for _, text in self._pending):
            self._start_from_pending(out)
        else:
            self._pending_to_sql()

    def _start_from_pending(self, out: list[SlowLogEntry]) -> None:
        """The held-back '#' lines end in a real header block: close the current entry and replay them.
        Genuine header lines before '# Query_time:' never end in ';', so '#' lines up to the last one that
        does are SQL comments of the current statement, and the block starts after it."""
        pending, self._pending, self._pending_chars = self._pending, [], 0
        split = max((i + 1 for i, (_, text) in enumerate(pending) if text.endswith(";")), default=0)
        if split and (split == len(pending) or not starts_entry(pending[split][1])):
            for _, line in pending:  # what follows the last ';' cannot start an entry: all of it is SQL
                self._statement_line(self._draft, line)
            return
        for _, line in pending[:split]:
            self._statement_line(self._draft, line)
        self._finish(out, cut=not (self._pending_after_semicolon or split))
        for lineno, line in pending[split:]:
            self._header_line(lineno, line, out)

    def _pending_to_sql(self) -> None:
        pending, self._pending, self._pending_chars = self._pending, [], 0
        for _, line in pending:
            self._statement_line(self._draft, line)

    # header block ------------------------------------------------------------------------------------------

    def _header_line(self, lineno: int, line: str, out: list[SlowLogEntry]) -> None:
        draft = self._draft
        m = _TIME.match(line)
        if m and _looks_like_time(m["value"]):
            if draft is not None:
                self._finish(out)
            iso = bool(_ISO_TIME.match(m["value"]))
            self._vote("mysql" if iso else None)
            time_ns = parse_log_time(m["value"], self.tz)
            if time_ns is None:  # the entries that inherit it have no time either, not the one before
                self.stats.damage(lineno, "'# Time:'", m["value"])
            self._last_time = (time_ns, _time_precision_ns(m["value"]), iso)
            draft = self._draft = _Draft(lineno, *self._last_time)
            draft.nlines += 1
            if m["rest"]:  # old Percona: '# Time: 071218 11:48:27 # User@Host: ...' on one line
                self._user_host(draft, "# " + m["rest"], lineno)
            return
        if line.startswith("# User@Host:"):
            if draft is not None and (draft.has_user_host or draft.has_query_time):
                self._finish(out)
                draft = None
            if draft is None:
                draft = self._draft = _Draft(lineno, *self._last_time)
            draft.nlines += 1
            self._user_host(draft, line, lineno)
            return
        if _QUERY_TIME.match(line) and draft is not None and draft.has_query_time:
            self._finish(out)
            draft = None
        if draft is None:
            if not _QUERY_TIME.match(line):  # a '#' line outside any entry
                self.stats.unparsed_lines += 1
                return
            draft = self._draft = _Draft(lineno, *self._last_time)
        draft.nlines += 1
        if m := _ADMIN.match(line):
            draft.admin = m["cmd"]
            draft.in_sql = True  # the admin command replaces the statement
            return
        if line.startswith("# explain:"):
            draft.explain.append(line[len("# explain:"):].strip())
            return
        if line.strip() == "#" or line in _NOTES:
            return
        pairs = parse_key_values(line[1:])
        if not pairs:
            self.stats.unparsed_lines += 1
            self.stats.warn(f"line {lineno}: header line not understood: {line[:80]!r}")
            return
        draft.values.update(pairs)

    def _user_host(self, draft: _Draft, line: str, lineno: int) -> None:
        draft.has_user_host = True
        m = _USER_HOST.match(line)
        if not m:
            self.stats.warn(f"line {lineno}: User@Host line not understood: {line[:80]!r}")
            return
        draft.priv_user = m["priv"].strip() or None
        draft.user = m["user"].strip() or draft.priv_user
        draft.host = m["host"].strip() or None
        draft.ip = m["ip"].strip() or None
        if m["id"] is not None:
            try:
                draft.id = _counter(m["id"])
            except ValueError:
                self.stats.damage(lineno, "connection id", m["id"])
            self._vote("mysql")

    # statement --------------------------------------------------------------------------------------------

    def _statement_line(self, draft: _Draft, line: str) -> None:
        draft.nlines += 1
        if line.strip():
            draft.last_nonblank = line
        if draft.admin is not None:  # nothing follows an administrator command in a well-formed entry
            if line.strip():
                self.stats.unparsed_lines += 1
            return
        if not draft.sql and (m := _ADMIN.match(line)):  # after the prefix lines (MySQL, Percona)
            draft.admin = m["cmd"]
            return
        if not draft.prefix_done:
            if draft.use_db is None and draft.timestamp_s is None and (m := _USE.match(line)):
                draft.use_db = _unquote_db(m["db"])
                return
            if draft.timestamp_s is None and (m := _SET_TIMESTAMP.match(line)):
                seconds = int(m["ts"]) if m["ts"].isdigit() and len(m["ts"]) <= 12 else MAX_EPOCH_NS
                if MIN_EPOCH_NS <= seconds * 1_000_000_000 < MAX_EPOCH_NS:
                    draft.timestamp_s = seconds
                else:
                    draft.timestamp_s = -1  # seen but damaged: the next such line is SQL, as for a good one
                    self.stats.damage(draft.line, "SET timestamp", m["ts"])
                draft.set_assign = m["assign"].rstrip(",")
                return
            draft.prefix_done = True
        size = len(line) if line.isascii() else len(line.encode("utf-8", "surrogatepass"))
        draft.size += size + (1 if draft.size else 0) + self.stats.line_dropped
        room = self.max_sql_bytes - draft.sql_bytes
        if draft.capped or size + (1 if draft.sql else 0) > room:
            if not draft.capped and room > 0:  # keep what fits of the line that crosses the cap
                draft.sql.append(line.encode("utf-8", "surrogatepass")[: room - (1 if draft.sql else 0)]
                                 .decode("utf-8", "ignore"))
            self.stats.capped_bytes += max(size + 1 - max(room, 0), 0)
            draft.sql_bytes = self.max_sql_bytes
            draft.capped = True
            return
        draft.sql_bytes += size + (1 if draft.sql else 0)
        draft.sql.append(line)

    # finishing --------------------------------------------------------------------------------------------

    def _finish(self, out: list[SlowLogEntry], cut: bool = False, at_eof: bool = False) -> None:
        draft, self._draft = self._draft, None
        if draft is None:
            return
        if not draft.has_query_time:
            self.stats.unparsed_lines += draft.nlines
            self.stats.warn(f"line {draft.line}: entry without '# Query_time:' dropped ({draft.nlines} lines)")
            return
        sql_lines = list(draft.sql)
        while sql_lines and not sql_lines[-1].strip():
            sql_lines.pop()  # the server strips trailing blanks from statements: these are not part of one
        if draft.capped:  # the kept text is a prefix; whether the statement ended is told by its last line
            self.stats.capped_statements += 1
            self.stats.warn(f"line {draft.line}: statement longer than {self.max_sql_bytes} bytes; kept up to "
                            "that size and marked cut")
            self.stats.cut_entries += 1
            self._emit(out, draft, "\n".join(sql_lines), True)
            return
        if at_eof and draft.admin is None and sql_lines and not sql_lines[-1].endswith(";"):
            # Lines after a complete statement at the end of the file that end in no ';' and start no entry:
            # garbage appended to the log (or a fragment of another file), not part of the statement.
            last = max((i for i, text in enumerate(sql_lines) if text.endswith(";")), default=None)
            if last is not None:
                tail = len(sql_lines) - last - 1
                self.stats.unparsed_lines += tail
                self.stats.warn(f"line {draft.line}: {tail} lines after the last statement's ';' at the end of the "
                                "log are not a slow-log entry")
                sql_lines = sql_lines[: last + 1]
        if draft.admin is None and sql_lines and sql_lines[-1].endswith(";"):
            sql_lines[-1] = sql_lines[-1][:-1]
        elif draft.admin is None:
            cut = True
        if cut:
            self.stats.cut_entries += 1
            where = "the end of the log" if at_eof else "a server header or the next entry"
            self.stats.warn(f"line {draft.line}: statement cut by {where} (no final ';')")
        self._emit(out, draft, "\n".join(sql_lines), cut)

    def _emit(self, out: list[SlowLogEntry], draft: _Draft, sql: str, cut: bool) -> None:
        out.append(self._freeze(draft, sql, cut))
        self.stats.entries += 1
        if self._unverified_at is not None and draft.line >= self._unverified_at:
            self._unverified_at = None
            self.stats.unverified_entries += 1
            self.stats.warn(f"line {draft.line}: this entry may begin inside a statement the capture shows cut "
                            "(its text holds slow-log header lines): the slow log cannot be checked against the wire")

    def _freeze(self, draft: _Draft, sql: str, cut: bool) -> SlowLogEntry:
        """Every number is range-checked here: a damaged one is read as None (counted, warned) and its text kept
        in `extra`; the entry itself is kept (its statement and times still say something)."""
        values = dict(draft.values)
        query_time_ns = self._take(values, "Query_time", _seconds_to_ns, draft.line)
        lock_time_ns = self._take(values, "Lock_time", _seconds_to_ns, draft.line)
        ints: dict[str, int | None] = {name: None for name in set(_INT_FIELDS.values())}
        for key, name in _INT_FIELDS.items():
            if ints[name] is None:  # Errno before Last_errno
                ints[name] = self._take(values, key, _counter, draft.line)
        if "QC_hit" in values:
            self._vote("mariadb")
        if "QC_Hit" in values or "Last_errno" in draft.values or "Log_slow_rate_type" in values:
            self._vote("percona")
        if "Errno" in draft.values or "Start" in values:
            self._vote("mysql")
        start_ns = self._take(values, "Start", lambda text: parse_log_time(text, self.tz), draft.line)
        end_ns = self._take(values, "End", lambda text: parse_log_time(text, self.tz), draft.line)
        schema = values.pop("Schema", None) or draft.use_db
        thread_id = ints["thread_id"] if ints["thread_id"] is not None else draft.id
        if draft.priv_user and draft.priv_user != draft.user:
            values["priv_user"] = draft.priv_user
        if draft.set_assign:
            for assign in draft.set_assign.split(","):
                key, _, value = assign.partition("=")
                values[key] = value
        if draft.explain:
            values["explain"] = "\n".join(draft.explain)
        return SlowLogEntry(
            line=draft.line, time_ns=draft.time_ns,
            timestamp_s=draft.timestamp_s if draft.timestamp_s is not None and draft.timestamp_s >= 0 else None,
            start_ns=start_ns,
            end_ns=end_ns, user=draft.user, host=draft.host, ip=draft.ip, thread_id=thread_id, schema=schema,
            query_time_ns=query_time_ns, lock_time_ns=lock_time_ns, rows_sent=ints["rows_sent"],
            rows_examined=ints["rows_examined"], rows_affected=ints["rows_affected"],
            bytes_sent=ints["bytes_sent"], errno=ints["errno"], killed=ints["killed"], extra=values,
            sql="" if draft.admin is not None else sql, admin_command=draft.admin, cut=cut,
            time_precision_ns=draft.time_precision_ns, time_iso=draft.time_iso,
        )

    def _take(self, values: dict[str, str], key: str, parse, line: int):
        """values[key] read by `parse` (which raises ValueError or returns None for a value it refuses) and
        removed; None when absent, or when damaged: then counted, warned and its text kept in `extra`."""
        if key not in values:
            return None
        try:
            value = parse(values[key])
        except ValueError:
            value = None
        if value is None:
            self.stats.damage(line, key, values[key])
            return None
        del values[key]
        return value

    # flavor -----------------------------------------------------------------------------------------------

    def _vote_version(self, version: str) -> None:
        lowered = version.lower()
        self._vote("mariadb" if "mariadb" in lowered else "percona" if "percona" in lowered else "mysql")

    def _vote(self, flavor: str | None) -> None:
        if flavor is not None and len(self._flavor_votes) < 1000:
            self._flavor_votes.append(flavor)

    def _flavor(self) -> str:
        """The server's own header decides; else the most specific signature seen (MariaDB and Percona share
        MySQL's lines, so any MariaDB/Percona-only key outweighs MySQL's)."""
        votes = self._flavor_votes
        if not votes:
            return "unknown"
        for flavor in ("mariadb", "percona"):
            if flavor in votes:
                return flavor
        return "mysql"


def starts_entry(line: str) -> bool:
    """The line may begin a slow-log entry ('# Time:', '# User@Host:' or '# Query_time:' as the server writes
    them)."""
    if line.startswith("# Time: "):
        m = _TIME.match(line)
        return bool(m) and _looks_like_time(m["value"])  # a damaged time still starts its entry
    return bool(_USER_HOST.match(line) or _QUERY_TIME.match(line))


def holds_header_lines(text: str) -> bool:
    """A statement text holds a line the slow log would read as the start of an entry, or as the server's file
    header (which ends the entry before it)."""
    lines = text.split("\n")
    if len(lines) == 1 and not text.startswith("#"):
        return False
    return any(starts_entry(line.rstrip("\r")) if line.startswith("#") else _is_server_header(line.rstrip("\r"))
               for line in lines)


def split_lines(text: str) -> list[str]:
    """Split on '\n' only: str.splitlines() would also split on \x0b, \x1c, U+2028... inside SQL literals."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _iter_lines(text_or_lines: str | Iterable[str]) -> Iterator[str]:
    if isinstance(text_or_lines, str):
        yield from split_lines(text_or_lines)
    else:
        yield from text_or_lines


def parse_slow_log(text_or_lines: str | Iterable[str], tz: dt.tzinfo = UTC, max_sql_bytes: int = MAX_SQL_BYTES,
                   wire: WireStatements | None = None) -> tuple[list[SlowLogEntry], SlowLogStats]:
    """Parse a whole slow log. `tz` is the server's time zone, used for '# Time:' values written without one
    (MySQL 5.6, Percona 5.x, MariaDB). `wire`: the capture's statements that hold header-like lines."""
    parser = SlowLogParser(tz, max_sql_bytes, wire)
    entries: list[SlowLogEntry] = []
    for line in _iter_lines(text_or_lines):
        entries.extend(parser.feed(line))
    entries.extend(parser.close())
    return entries, parser.stats


# --- the table ----------------------------------------------------------------------------------------------

def time_meaning(entry: SlowLogEntry, flavor: str) -> str | None:
    """'end' or 'start': what an entry's '# Time:' marks, by its form and the log's flavour (see module doc)."""
    if entry.time_ns is None:
        return None
    if entry.time_iso or flavor in ("mysql", "percona"):
        return "end"
    return "start" if flavor == "mariadb" else None


def entries_to_frame(entries: list[SlowLogEntry], flavor: str = "unknown"):
    """Build the table declared in SLOWLOG_COLUMNS (pandas imported here: the parser core does not need it).
    `flavor` (SlowLogStats.flavor) decides what a YYMMDD '# Time:' marks."""
    import pandas as pd

    def ns_column(values: list[int | None]) -> pd.Series:
        return pd.to_datetime(pd.array(values, dtype="Int64"), unit="ns", utc=True)

    def seconds(values: list[int | None]) -> list[float]:
        return [float("nan") if v is None else v / 1e9 for v in values]

    by_name = {
        "line": [e.line for e in entries],
        "time": ns_column([e.time_ns for e in entries]),
        "timestamp": ns_column([None if e.timestamp_s is None else e.timestamp_s * 1_000_000_000 for e in entries]),
        "start": ns_column([e.start_ns for e in entries]),
        "end": ns_column([e.end_ns for e in entries]),
        "query_time_s": seconds([e.query_time_ns for e in entries]),
        "time_meaning": [time_meaning(e, flavor) for e in entries],
        "lock_time_s": seconds([e.lock_time_ns for e in entries]),
    }
    columns = {}
    for name, dtype in ((c.name, c.dtype) for c in SLOWLOG_COLUMNS):
        values = by_name[name] if name in by_name else [getattr(e, name) for e in entries]
        columns[name] = pd.Series(values, dtype=dtype if dtype != "object" else object)
    return pd.DataFrame(columns)


# --- the file -----------------------------------------------------------------------------------------------

_BINARY_MAGIC = {
    b"\xd4\xc3\xb2\xa1": "a pcap capture", b"\xa1\xb2\xc3\xd4": "a pcap capture",
    b"\x4d\x3c\xb2\xa1": "a pcap capture", b"\xa1\xb2\x3c\x4d": "a pcap capture",
    b"\x0a\x0d\x0d\x0a": "a pcapng capture", b"\x28\xb5\x2f\xfd": "zstd-compressed data",
}


def _refuse_binary(name: str, head: bytes) -> None:
    kind = _BINARY_MAGIC.get(head[:4])
    # The server writes statements byte for byte, so a slow log may hold a NUL inside a logged literal: NUL bytes
    # make a file binary only when nothing in its head looks like a slow log.
    if kind is None and b"\x00" in head and b"# Query_time: " not in head and b" started with:" not in head:
        kind = "binary data"
    if kind is not None:
        raise SlowLogError(f"{name}: not a slow log (it is {kind})")


def check_slow_log_file(path: str | os.PathLike) -> None:
    """Cheap up-front check of a slow log the user named: it exists, is a file, and is text, not a capture.
    Raises SlowLogError; whether its text is a usable slow log is read_slow_log's business (a warning)."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as raw:
            head = raw.read(65536)
        if head[:2] == b"\x1f\x8b":
            with gzip.open(name, "rb") as f:
                head = f.read(65536)
    except FileNotFoundError:
        raise SlowLogError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise SlowLogError(f"{name}: is a directory, not a slow log") from None
    except (OSError, EOFError, zlib.error) as err:
        raise SlowLogError(f"{name}: cannot read slow log: {err}") from None
    _refuse_binary(name, head)


def _lines(text: io.TextIOBase, limit: int, stats: SlowLogStats) -> Iterator[str]:
    """The lines of `text`, each at most `limit` characters plus its last one: a longer line is read in pieces
    and only its head and last character kept (the last character says whether a statement ended with ';'), so
    memory stays bounded by the limit however long a line is. Whether a line was shortened is counted."""
    while True:
        line = text.readline(limit)
        if not line:
            return
        stats.line_dropped = 0
        if len(line) < limit or line.endswith("\n"):
            yield line
            continue
        last = line[-1]
        dropped = 0
        while True:  # skip the rest of the long line
            more = text.readline(limit)
            if not more:
                break
            dropped += len(more)
            last = more.rstrip("\r\n")[-1:] or last
            if more.endswith("\n"):
                break
        stats.capped_bytes += dropped
        stats.line_dropped = dropped
        yield line[: limit - 1] + last + "\n"


def read_slow_log(path: str | os.PathLike, tz: dt.tzinfo = UTC, max_sql_bytes: int = MAX_SQL_BYTES,
                  wire: WireStatements | None = None):
    """Read a slow log file (plain or .gz) into (DataFrame, SlowLogStats). Raises SlowLogError, naming the file,
    for a file that is clearly not a slow log: missing, binary, or non-empty without a single entry or server
    header. An empty file (or one holding only server headers) is a slow log with no entries: a warning.
    The file is streamed line by line; only the entries are held in memory, each statement up to
    `max_sql_bytes` (longer ones are kept up to it, marked cut and counted). Damaged values never raise: they
    are read as unknown and counted in `stats.damaged_values`. `wire` (WireStatements): header lines the capture
    shows inside a statement are read as that statement's SQL."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as raw:
            compressed = raw.read(2) == b"\x1f\x8b"
        with (gzip.open(name, "rb") if compressed else open(name, "rb")) as f:
            _refuse_binary(name, f.peek(65536)[:65536] if hasattr(f, "peek") else b"")
            # newline="\n": only '\n' ends a line ('\r' and U+2028 may sit inside SQL literals)
            text = io.TextIOWrapper(f, encoding="utf-8", errors="replace", newline="\n")
            parser = SlowLogParser(tz, max_sql_bytes, wire)
            entries: list[SlowLogEntry] = []
            blank, replaced = True, False
            # a line is read whole up to the statement cap (and never less than 64 KiB: header lines stay whole)
            for line in _lines(text, max(max_sql_bytes, 1 << 16) + 2, parser.stats):
                if blank and line.strip():
                    blank = False
                if not replaced and "\ufffd" in line:
                    replaced = True
                entries.extend(parser.feed(line))
            entries.extend(parser.close())
    except FileNotFoundError:
        raise SlowLogError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise SlowLogError(f"{name}: is a directory, not a slow log") from None
    except (OSError, EOFError, zlib.error) as err:  # unreadable, or a damaged gzip stream
        raise SlowLogError(f"{name}: cannot read slow log: {err}") from None
    stats = parser.stats
    if not entries:
        if not blank and stats.server_headers == 0:
            raise SlowLogError(f"{name}: not a slow log (no '# Query_time:' entry in {stats.lines} lines)")
        stats.warn(f"{name}: slow log has no entries")
    if replaced:
        stats.warn(f"{name}: bytes that are not UTF-8 were replaced by U+FFFD")
    return entries_to_frame(entries, stats.flavor), stats
