"""Connection ids without a greeting: a capture that began after a pool opened its connections has no handshake, so
no connection id (the thread id the slow log and the thread pool's group key use). Three other sources name them:

- a processlist snapshot (`--processlist FILE`, or processlist*.tsv|txt in a capture-set folder): what `mysql -B -e
  "SHOW FULL PROCESSLIST"` or `SELECT ID, USER, HOST, … FROM information_schema.PROCESSLIST` prints (tab-separated,
  a header line), or the mysql client's boxed table (`+----+…`); HOST is the client's ip:port as the server sees
  it, matched to each connection's client endpoint at the DB point;
- a `SELECT CONNECTION_ID()` answered on the wire: the answer is read back from the capture's frames;
- the slow log: an entry's `# Thread_id:` / `Id:`, when every entry joined to a connection has the same id and no
  other connection has it (slowlog/join.py joined them by text and time).

A greeting's id wins over any other source; a source that says otherwise is warned about. Each id's source is
`conn_id_source` (core/schema.py): greeting | connection_id_answer | processlist | slowlog."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.endpoints import endpoint_text
from ..core.errors import InputError
from ..mysql.wire import WireError, read_lenenc_int

GREETING, ANSWER, PROCESSLIST, SLOWLOG = "greeting", "connection_id_answer", "processlist", "slowlog"
SOURCES = (GREETING, ANSWER, PROCESSLIST, SLOWLOG)  # the order of precedence when sources disagree
# file names a capture-set folder's processlist snapshot may have (read/captureset.py)
PROCESSLIST_NAMES = ("processlist*.tsv", "processlist*.txt")
_ID_NAMES = ("id",)
_HOST_NAMES = ("host",)


@dataclass
class Processlist:
    """A processlist snapshot: connection id by client endpoint ("ip:port" as core.endpoints.endpoint_text writes it), and by
    client port alone for rows whose HOST names a host instead of an address (skip_name_resolve off)."""

    path: str
    by_endpoint: dict[str, int] = field(default_factory=dict)
    by_port: dict[int, list[int]] = field(default_factory=dict)  # port -> ids of rows that name a host, not an address
    rows: int = 0
    local_rows: int = 0  # unix socket, localhost, system threads: no TCP endpoint to match
    damaged_rows: int = 0  # rows whose columns or id could not be read
    warnings: list[str] = field(default_factory=list)


def read_processlist(path: Path) -> Processlist:
    """Read a processlist snapshot. A file that is not there or not readable is a user mistake (InputError); a
    damaged or foreign one gives what it holds intact, and a warning with the counts."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: {'no such file' if not path.exists() else 'not a regular file'} (--processlist)")
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as err:
        raise InputError(f"{path}: cannot be read: {err.strerror}") from None
    result = Processlist(str(path))
    lines = [line.rstrip("\r") for line in text.split("\n")]
    lines = [line for line in lines if line.strip()]
    table = _boxed_rows(lines) if lines and lines[0].lstrip().startswith("+-") else _tab_rows(lines)
    if table is None:
        result.warnings.append(f"{path}: not a processlist snapshot (no header line with Id and Host columns, "
                               f"tab-separated as `mysql -B` prints it or boxed as `mysql` prints it): "
                               f"{len(lines)} lines ignored")
        return result
    header, rows = table
    names = [h.strip().lower() for h in header]
    id_col = next(i for i, n in enumerate(names) if n in _ID_NAMES)
    host_col = next(i for i, n in enumerate(names) if n in _HOST_NAMES)
    unmatched: list[str] = []
    for cells in rows:
        result.rows += 1
        if cells is None or len(cells) <= max(id_col, host_col) or not cells[id_col].strip().isdigit():
            result.damaged_rows += 1
            continue
        conn_id, host = int(cells[id_col].strip()), cells[host_col].strip()
        ip, sep, port = host.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            result.local_rows += 1  # localhost, a unix socket, a system thread
            continue
        try:
            address = ipaddress.ip_address(ip.strip("[]"))
        except ValueError:
            if re.fullmatch(r"[A-Za-z0-9._-]+", ip):  # a host name: matched by its port, when that is unambiguous
                result.by_port.setdefault(int(port), []).append(conn_id)
                unmatched.append(ip)
            else:
                result.damaged_rows += 1
            continue
        if getattr(address, "ipv4_mapped", None) is not None:
            address = address.ipv4_mapped
        result.by_endpoint[endpoint_text((str(address), int(port)))] = conn_id
    if result.damaged_rows:
        result.warnings.append(f"{path}: {result.damaged_rows} of {result.rows} processlist rows damaged (no numeric "
                               f"Id, or fewer columns than the header): ignored")
    if unmatched:
        result.warnings.append(f"{path}: {len(unmatched)} rows name a host ({unmatched[0]}…), not an address: matched "
                               "by client port alone where that is unambiguous (skip_name_resolve makes HOST ip:port)")
    return result


def _header_ok(cells: list[str]) -> bool:
    names = {c.strip().lower() for c in cells}
    return bool(names & set(_ID_NAMES)) and bool(names & set(_HOST_NAMES))


def _tab_rows(lines: list[str]) -> tuple[list[str], list] | None:
    """`mysql -B`: a header line, then one line per row, tab-separated, with tab, newline and backslash escaped."""
    for start, line in enumerate(lines[:5]):  # a line or two of noise (a warning the client printed) before it
        header = line.split("\t")
        if len(header) > 1 and _header_ok(header):
            return header, [line.split("\t") for line in lines[start + 1:]]
    return None


def _boxed_rows(lines: list[str]) -> tuple[list[str], list] | None:
    """The mysql client's table: border lines `+----+------+`, cells between `|` at the border's `+` positions."""
    border = lines[0].strip()
    cuts = [i for i, ch in enumerate(border) if ch == "+"]
    body = [line.strip() for line in lines if line.strip().startswith("|")]
    if len(cuts) < 2 or not body:
        return None

    def cells(line: str) -> list[str] | None:
        if len(line) == len(border) and all(line[i] == "|" for i in cuts):
            return [line[a + 1:b] for a, b in zip(cuts, cuts[1:])]
        parts = line.strip("|").split("|")  # wide characters moved the columns: by the bars, if they still count
        return parts if len(parts) == len(cuts) - 1 else None

    header = cells(body[0])
    if header is None or not _header_ok(header):
        return None
    return header, [cells(line) for line in body[1:]]


@dataclass
class Filled:
    """What one fill did: connections named per source, and the conflicts warned about."""

    named: dict[str, int] = field(default_factory=dict)  # source -> connections it named
    conflicts: list[str] = field(default_factory=list)


def add_greeting_source(conns: pd.DataFrame) -> pd.DataFrame:
    """conn_id_source = greeting where the greeting gave the id (the extraction's connections tables)."""
    conns["conn_id_source"] = pd.array(np.where(conns["conn_id"].notna(), GREETING, None), dtype="string")
    return conns


def fill_from_ids(ex: pd.DataFrame, conns: pd.DataFrame, ids: dict[tuple[str, int], int], source: str,
                  filled: Filled) -> None:
    """Give each connection (capture, conn_index) in `ids` its id, in the exchanges and the connections table, unless
    it has one: then a different id is a conflict (warned; the id it has stays)."""
    if not ids or not len(conns):
        return
    key = list(zip(conns["capture"].astype(str), conns["conn_index"].astype(np.int64)))
    have = conns["conn_id"].astype("Int64")
    source_col = conns["conn_id_source"] if "conn_id_source" in conns else pd.Series([None] * len(conns))
    new_ids = have.to_numpy(dtype=object, na_value=None).copy()
    new_src = source_col.astype(object).where(source_col.notna(), None).to_numpy(dtype=object).copy()
    named = 0
    for i, k in enumerate(key):
        wanted = ids.get(k)
        if wanted is None:
            continue
        if new_ids[i] is None:
            new_ids[i], new_src[i] = int(wanted), source
            named += 1
        elif int(new_ids[i]) != int(wanted):
            filled.conflicts.append(f"{conns['client'].iloc[i]}: {new_src[i] or 'its'} id {new_ids[i]}, the "
                                    f"{source.replace('_', ' ')} says {wanted}")
    if not named:
        return
    filled.named[source] = filled.named.get(source, 0) + named
    conns["conn_id"] = pd.array(new_ids, dtype="Int64")
    conns["conn_id_source"] = pd.array(new_src, dtype="string")
    fill_rows(ex, {k: v for k, v, s in zip(key, new_ids, new_src) if s == source})


def fill_rows(ex: pd.DataFrame, ids: dict[tuple[str, int], int]) -> None:
    """The null conn_id of `ex`'s rows of the connections `ids` names ((capture, conn_index) → id), in place (the
    partitioned run fills a partition's rows so: explain/partitioned.py)."""
    if not len(ex) or not ids:
        return
    ex_key = pd.MultiIndex.from_arrays([ex["capture"].astype(str), ex["conn_index"].astype(np.int64)])
    found = pd.Series(list(ids.values()), index=pd.MultiIndex.from_tuples(list(ids.keys())), dtype="Int64")
    _fill_missing_ids(ex, found.reindex(ex_key).to_numpy(dtype="float64", na_value=np.nan))


def ids_from_processlist(conns: pd.DataFrame, snapshot: Processlist) -> dict[tuple[str, int], int]:
    """(capture, conn_index) -> id for the connections whose client endpoint the snapshot names."""
    out: dict[tuple[str, int], int] = {}
    ports: dict[int, list[tuple[str, int]]] = {}
    for cap, index, client in zip(conns["capture"].astype(str), conns["conn_index"], conns["client"].astype(str)):
        conn_id = snapshot.by_endpoint.get(client)
        if conn_id is not None:
            out[(cap, int(index))] = conn_id
        port = client.rpartition(":")[2]
        if snapshot.by_port and port.isdigit():
            ports.setdefault(int(port), []).append((cap, int(index)))
    for port, conn_ids in snapshot.by_port.items():  # a host name: one id for the port, one connection with it
        there = [k for k in ports.get(port, []) if k not in out]
        if len(conn_ids) == 1 and len(there) == 1:
            out[there[0]] = conn_ids[0]
    return out


CONNECTION_ID_SQL = re.compile(r"\s*select\s+connection_id\s*\(\s*\)\s*(?:as\s+\S+\s*|`[^`]*`\s*)?(?:[,;]|$)",
                               re.IGNORECASE)


def ids_from_answers(point, ex: pd.DataFrame, conns: pd.DataFrame) -> dict[tuple[str, int], int]:
    """(capture, conn_index) -> id answered to a `SELECT CONNECTION_ID()` (its first column) on a connection without
    an id: the answer is read back from the frames of the response (one pass over the capture's frames between the
    first and the last such response). `point`: the capture's file, or its sources.CapturePoint (a point of several
    files is read as one stream, its frames numbered through it)."""
    if not len(ex) or "sql" not in ex:
        return {}
    unnamed = conns.loc[conns["conn_id"].isna() & ~conns["tls"].fillna(False).astype(bool)
                        & conns["compressed"].isna(), ["capture", "conn_index"]]
    if not len(unnamed):
        return {}
    wanted_conns = set(zip(unnamed["capture"].astype(str), unnamed["conn_index"].astype(np.int64)))
    rows = [i for i in np.flatnonzero(answers_connection_id(ex))
            if (str(ex["capture"].iat[i]), int(ex["conn_index"].iat[i])) in wanted_conns]
    chosen: dict[tuple[str, int], int] = {}
    for i in rows:  # one answer per connection is enough
        chosen.setdefault((str(ex["capture"].iat[i]), int(ex["conn_index"].iat[i])), i)
    if not chosen:
        return {}
    spans = []
    for k, i in chosen.items():
        first, last = ex["resp_first_frame"].iat[i], ex["resp_last_frame"].iat[i]
        seq, end = ex["resp_tcp_seq"].iat[i], ex["resp_tcp_end"].iat[i]
        if pd.isna(first) or pd.isna(last) or pd.isna(seq) or pd.isna(end):
            continue
        client, server = str(ex["client"].iat[i]), str(ex["server"].iat[i])
        spans.append((k, int(first), int(last), int(seq), (int(end) - int(seq)) % (1 << 32), client, server))
    return _read_answers(point, spans)


def answers_connection_id(ex: pd.DataFrame) -> np.ndarray:
    """Per row of `ex`: a SELECT CONNECTION_ID() answered with a result set, the rows ids_from_answers reads (the
    partitioned run gathers them from the buckets: explain/partitioned.py spilled_names)."""
    return (_asks_connection_id(ex["sql"]) & (ex["command"] == "COM_QUERY").to_numpy()
            & (ex["result"] == "resultset").to_numpy())


def _asks_connection_id(sql: pd.Series) -> np.ndarray:
    """Per row: the statement is SELECT CONNECTION_ID() (its first column); each distinct text is matched once."""
    if isinstance(sql.dtype, pd.CategoricalDtype):
        hits = np.array([bool(CONNECTION_ID_SQL.match(str(c))) for c in sql.cat.categories] + [False])
        return hits[sql.cat.codes.to_numpy()]  # code -1 (null) takes the appended False
    return sql.astype(object).map(lambda t: t is not None and t == t and bool(CONNECTION_ID_SQL.match(str(t)))
                                  ).to_numpy(dtype=bool)


def _read_answers(point, spans: list) -> dict[tuple[str, int], int]:
    from .capture import tcp_records_between
    from .sources import parse_server

    if not spans:
        return {}
    lo, hi = min(s[1] for s in spans), max(s[2] for s in spans)
    by_flow: dict[tuple, list] = {}
    buffers = {}
    for s in spans:
        server, client = parse_server(s[6]), parse_server(s[5])
        by_flow.setdefault((server, client), []).append(s)
        buffers[s[0]] = bytearray(s[4])
    for frame, _ts, _linktype, _data, _orig_len, decoded in tcp_records_between(point, lo, hi):
        (src, dst), sport, dport, seq, _ack, _flags, payload, _missing = decoded
        for k, first, last, start, length, _c, _s in by_flow.get(((src, sport), (dst, dport)), ()):
            if not first <= frame <= last or not payload:
                continue
            at = (seq - start) % (1 << 32)
            if at < length:
                piece = payload[: length - at]
                buffers[k][at: at + len(piece)] = piece
    out = {}
    for k, buf in buffers.items():
        value = _first_cell(bytes(buf))
        if value is not None:
            out[k] = value
    return out


def _first_cell(data: bytes) -> int | None:
    """The first column of the first row of a text-protocol result set, as a whole number; None when the bytes do
    not hold one (a part was not captured, an error, a NULL)."""
    try:
        packets, pos = [], 0
        while pos + 4 <= len(data) and len(packets) < 64:
            size = int.from_bytes(data[pos: pos + 3], "little")
            packets.append(data[pos + 4: pos + 4 + size])
            pos += 4 + size
        columns, _ = read_lenenc_int(packets[0], 0)
        if not columns:
            return None
        at = 1 + columns
        if packets[at][:1] == b"\xfe" and len(packets[at]) < 9:  # the classic EOF after the column definitions
            at += 1
        row = packets[at]
        if row[:1] in (b"\xfe", b"\xff"):
            return None
        length, start = read_lenenc_int(row, 0)
        if length is None:
            return None
        text = row[start: start + length].decode("ascii")
        return int(text) if text.isdigit() else None
    except (IndexError, ValueError, UnicodeDecodeError, WireError):
        return None


def client_keys(table: pd.DataFrame) -> np.ndarray:
    """Each joined row's connection, by its client endpoint at the DB point (at the app when the DB did not see it)."""
    if "db_client" not in table:
        return table["client"].astype(object).to_numpy()
    return table["db_client"].astype(object).where(table["db_client"].notna(),
                                                    table["client"].astype(object)).to_numpy()


def ids_from_slow_log(table: pd.DataFrame, slow: pd.DataFrame | None, entry: np.ndarray | None) -> dict[str, int]:
    """client endpoint -> id for the connections without one whose joined slow-log entries all carry one Thread_id
    that no other connection has (by a join or an id of its own): only when unambiguous."""
    if slow is None or entry is None or not len(table) or "thread_id" not in slow:
        return {}
    threads = slow["thread_id"].astype("Int64").to_numpy(dtype="float64", na_value=np.nan)
    conn = table["conn_id"].astype("Int64").to_numpy(dtype="float64", na_value=np.nan)
    rows = np.flatnonzero((entry >= 0) & np.isnan(conn))
    if not len(rows):
        return {}
    joined = pd.DataFrame({"key": client_keys(table)[rows], "thread": threads[entry[rows]]})
    per = joined.groupby("key", sort=False)["thread"].agg(["nunique", "count", "size", "first"])
    one = per[(per["nunique"] == 1) & (per["count"] == per["size"])]  # one Thread_id, on every joined entry
    taken = set(np.unique(conn[~np.isnan(conn)]).astype(np.int64).tolist())
    claims = one["first"].value_counts()
    return {str(k): int(t) for k, t in one["first"].items() if claims[t] == 1 and int(t) not in taken}


def fill_table(table: pd.DataFrame, ids: dict[str, int], source: str) -> int:
    """Give the joined table's rows of each connection (client endpoint) in `ids` that id and source; the rows
    that have an id keep it. Returns the rows named."""
    if not ids:
        return 0
    keys = pd.Series(client_keys(table))
    got = keys.map(ids).to_numpy(dtype="float64", na_value=np.nan)
    take = _fill_missing_ids(table, got)
    if take.any():
        src = table["conn_id_source"].astype(object).to_numpy().copy()
        src[take] = source
        table["conn_id_source"] = pd.Categorical(src, categories=list(SOURCES))
    return int(take.sum())


def conn_id_sources(exchanges: pd.DataFrame) -> dict[str, int]:
    """summary.json → conn_ids: the connections of the table (capture, conn_index) by the source of their id."""
    out = dict.fromkeys([*SOURCES, "unknown"], 0)
    if not len(exchanges) or "conn_id_source" not in exchanges:
        return out
    capture = pd.factorize(exchanges["capture"])[0].astype(np.int64)
    key = (capture << 32) | exchanges["conn_index"].to_numpy(dtype=np.int64)
    _, first = np.unique(key, return_index=True)
    source = exchanges["conn_id_source"]
    codes = (source.cat.codes.to_numpy() if isinstance(source.dtype, pd.CategoricalDtype)
             else pd.Categorical(source.astype(object), categories=list(SOURCES)).codes)[first]
    codes = np.where(exchanges["conn_id"].isna().to_numpy()[first], -1, codes)
    names = list(source.cat.categories) if isinstance(source.dtype, pd.CategoricalDtype) else list(SOURCES)
    for code, n in zip(*np.unique(codes, return_counts=True)):
        out["unknown" if code < 0 else str(names[code])] += int(n)
    return out


def conflict_warning(filled: Filled) -> str | None:
    if not filled.conflicts:
        return None
    return (f"connection ids: {len(filled.conflicts)} conflicting (the greeting's, or the first source's, is kept): "
            + "; ".join(filled.conflicts[:3]) + (" …" if len(filled.conflicts) > 3 else ""))


def _fill_missing_ids(table: pd.DataFrame, got: np.ndarray) -> np.ndarray:
    """table's null conn_id set from `got` (float, NaN where nothing names the row); ids already known are kept.
    Returns the rows filled."""
    take = ~np.isnan(got) & table["conn_id"].isna().to_numpy()
    if take.any():
        col = table["conn_id"].astype("Int64").copy()
        col[take] = got[take].astype(np.int64)
        table["conn_id"] = col
    return take


def name_connections(processlist: Path | None, points: dict, app_ex: pd.DataFrame, app_conns: pd.DataFrame,
                     db_ex: pd.DataFrame, db_conns: pd.DataFrame, note) -> dict[str, str]:
    """Fill conn_id (exchanges and connections tables, in place) where no greeting gave it: from SELECT
    CONNECTION_ID() answers on the wire, then the processlist snapshot. Returns {client endpoint: source} of the
    connections named so (the joined table's conn_id_source). `processlist`: the capture set's snapshot;
    `points`: its capture points by name (sources.CapturePoint; the answers are read back from their frames)."""
    ex, conns = (db_ex, db_conns) if len(db_conns) else (app_ex, app_conns)
    for c in (app_conns, db_conns):
        if "conn_id_source" not in c:
            add_greeting_source(c)
    if not len(conns) or (processlist is None and not conns["conn_id"].isna().any()):
        return {}
    filled = Filled()
    for capture in conns.loc[conns["conn_id"].isna(), "capture"].astype(str).unique():
        if capture in points:
            mine = ex["capture"].astype(str) == capture
            fill_from_ids(ex, conns, ids_from_answers(points[capture], ex[mine], conns), ANSWER, filled)
    if processlist is not None:
        snapshot = read_processlist(processlist)
        for w in snapshot.warnings:
            note(w)
        named = ids_from_processlist(conns, snapshot)
        fill_from_ids(ex, conns, named, PROCESSLIST, filled)
        if snapshot.rows and not named:
            note(f"{processlist}: none of its {snapshot.rows} rows names a connection of the capture (HOST ip:port "
                 "is matched to the client's endpoint at the DB point)")
    if (w := conflict_warning(filled)) is not None:
        note(w)
    named_conns = conns[conns["conn_id_source"].isin([ANSWER, PROCESSLIST])]
    return dict(zip(named_conns["client"].astype(str), named_conns["conn_id_source"].astype(str)))
