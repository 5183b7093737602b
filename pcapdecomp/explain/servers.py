"""Stage 3's face: Paired → Explained, the joined table of every exchange with its network, queueing and execution
(the slow log joined, the decomposition and the thread-pool view per DB server: each server's slow log, thread pool
and verdict are its own), the thread-pool tables, and what the summary reads of each server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ..core.errors import SlowLogError
from ..core.memory import release_memory
from ..core.schema import ANALYSIS_COLUMNS, CATEGORY, EXCHANGE_COLUMNS
from ..core.tables import as_category, concat, held, hold_columns, with_declared_dtypes
from ..pair.pairing import Paired
from ..pair.proxy import empty_columns as proxy_empty
from ..pair.proxy import finish as proxy_finish
from ..read import connids
from ..read.captureset import CaptureSet
from ..read.extract import Extracted
from .bounds import apply_bounds, point_bounds
from .decompose import build_table, decompose
from .stories import tell as tell_stories
from .summary import ServerPart
from .summary import build as build_summary
from .threadpool import thread_pool_view


LONG_QUERY_TIME_UNKNOWN = "long_query_time unknown (no capture.toml, no --long-query-time): hidden_slow not decided"


@dataclass
class Explained:
    """Stage 3's result: what exchanges.parquet, groups.parquet and pool.parquet hold, and what the summary reads of
    each DB server."""

    exchanges: pd.DataFrame  # EXCHANGE_COLUMNS + ANALYSIS_COLUMNS, in their declared dtypes
    groups: pd.DataFrame  # per DB point, thread group and time bucket
    pool: pd.DataFrame  # per DB point and time bucket
    servers: list[ServerPart]  # one per DB point, in their order (one, of point None, without a DB capture)


def explain_servers(paired: Paired, cs: CaptureSet, db_captures: list[str], tz, max_sql_bytes: int,
                    note: Callable[[str], None], decomposed: Callable[[pd.DataFrame], None] | None = None
                    ) -> Explained:
    """The joined table of `paired` (its exchange tables are handed over: build_table moves the app side's columns
    into the table one by one, so memory holds about one table, not three), then per DB point (`db_captures`, the
    names of their captures) the slow-log join, the decomposition and the thread-pool view. `decomposed(table)`:
    with one DB point, called once the table has the decomposition's columns (run.session starts the query
    profile's child there)."""
    table = joined_table(paired)
    if cs.long_query_time is None:
        note(LONG_QUERY_TIME_UNKNOWN)
    several = len(db_captures) > 1
    names_of = list(db_captures) or [None]
    if several:
        positions = np.arange(len(table))
        which = paired.row_point.copy()
        which[pd.isna(which)] = names_of[0]  # exchanges no DB point saw, of an unknown server: with the first
        parts = [(name, positions[which == name]) for name in names_of]
    else:
        parts = [(names_of[0], None)]
    paired.row_point = None  # read: the table's db_point and `parts` say it now
    servers: list[ServerPart] = []
    tables = []
    for name, rows in parts:
        sub = table if rows is None else table.iloc[rows].reset_index(drop=True)
        part_table, part = explain_server(sub, cs, name, tz, max_sql_bytes, note, decomposed if not several else None)
        tables.append(part_table)
        servers.append(part)
        del sub, part_table
        release_memory()
    del table
    if several:
        order = np.argsort(np.concatenate([rows for _, rows in parts]), kind="stable")
        table = concat(tables).take(order).reset_index(drop=True)
    else:
        table = tables[0]
    del tables
    exchanges = with_declared_dtypes(table, (*EXCHANGE_COLUMNS, *ANALYSIS_COLUMNS))
    del table
    return Explained(exchanges, *server_tables(servers), servers)


def server_tables(servers: list[ServerPart]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """groups.parquet's and pool.parquet's tables: each DB point's thread-pool view, with its db_point."""
    groups = concat([d.view.groups.assign(db_point=as_category([d.point] * len(d.view.groups))) for d in servers])
    pool = concat([d.view.pool.assign(db_point=as_category([d.point] * len(d.view.pool))) for d in servers])
    return groups, pool


def summary_of(cs: CaptureSet, x: Extracted, paired: Paired, explained: Explained, warnings: list[str],
               scheduler: str | None = None, latency: dict | None = None, runs=None) -> dict:
    """summary.json's content, its verdict and stories told: the points and their quality, the pairing, the
    proxy, the repair, the clocks, each DB server's slow-log join and thread-pool view, the exchanges' counts and
    latency. `warnings` is kept as given (notes added later are in the file too); `latency`: summary.json →
    latency_s when it was made beside (run.session), else made here. `runs`: the partitions' runs fed
    (explain.summaryruns.SummaryOfRuns; the partitioned run, run/spilled.py), the exchanges' parts made from them
    rather than from `explained.exchanges` (None there)."""
    app_points, app_kind = (x.proxy_points, "proxy") if paired.app_kind == "proxy" else (x.app_points, "app")
    summary = build_summary(
        cs, names={"app": [p.name for p in app_points], "dbs": [p.name for p in x.db_points],
                   "proxy": [p.name for p in x.proxy_points]},
        points=x.points, qualities={**x.qualities, "app": x.qualities[app_kind]},
        matching=paired.matching.stats.as_dict(), proxy=paired.proxy_summary,
        repair=paired.repair.stats.as_dict() if paired.repair is not None else paired.repair_skipped,
        clocks=paired.clock_info,
        servers=explained.servers, exchanges=explained.exchanges, warnings=warnings, scheduler=scheduler,
        through_proxy=paired.through_proxy, latency=latency, runs=runs)
    tell_stories(summary, explained.exchanges, concat([paired.app_conns, paired.db_conns]), cs.server_settings,
                 runs=runs)
    return summary


def joined_table(paired: Paired) -> pd.DataFrame:
    """One row per exchange (the matching's rows): both points' times on the primary app point's clock, what capture
    loss left bounded, the proxy's columns, where each connection id came from and the DB point. Takes `paired`'s
    exchange tables (set to None) and its matching's rows (summary.json reads the matching's stats alone)."""
    table = joined_rows(paired.app_ex, paired.db_ex, paired.matching, paired.clocks, paired.primary, paired.row_clock,
                        paired.repair, paired.proxied, paired.id_sources, paired.row_point)
    paired.app_ex = paired.db_ex = None
    paired.matching = replace(paired.matching, app_row=None, db_row=None, notes=None)
    hold_columns(table)  # the columns the joined table made (nulls of a DB capture alone, the DB's frame numbers…)
    release_memory()
    return table


def joined_rows(app_ex: pd.DataFrame, db_ex: pd.DataFrame, matching, clocks: dict, primary: str | None,
                row_clock: np.ndarray | None, repair, proxied, id_sources: dict[str, str],
                row_point: np.ndarray) -> pd.DataFrame:
    """joined_table's rows from its parts: the matching's rows of the two tables (build_table consumes the app
    table's columns) with their times on the clocks, the bounds, the proxy's columns, conn_id_source (`id_sources`:
    client endpoint → source) and the DB point of each row (`row_point`). The partitioned run makes a partition's
    rows with it (explain/partitioned.py)."""
    bounds = point_bounds(app_ex, db_ex, matching, repair)
    table = apply_bounds(build_table(app_ex, db_ex, matching, clocks, primary, row_clock, bounds),
                         bounds, clocks, primary, row_clock)
    table = proxy_finish(table, proxied) if proxied is not None else proxy_empty(table)
    table["conn_id_source"] = conn_id_sources_of(table, id_sources)
    table["db_point"] = as_category(row_point)
    return table


def explain_server(table: pd.DataFrame, cs: CaptureSet, point: str | None, tz, max_sql_bytes: int,
                   note, decomposed=None) -> tuple[pd.DataFrame, ServerPart]:
    """The slow-log join, the decomposition and the thread-pool view of one DB point's exchanges: the table with
    their columns, and what the summary reads of them. `decomposed(table)`: called with the table once it has
    the decomposition's columns, before the thread-pool view (which adds the columns of its own)."""
    from ..slowlog.join import wire_statements

    slow_path = cs.slow_logs.get(point if point is not None else "")
    slow, slow_info = server_slow_log(slow_path, tz, max_sql_bytes, lambda: wire_statements(table), note)
    table, join = decompose(table, slow, cs.long_query_time, cs.thread_pool_size, str(slow_path))
    release_memory()
    if join.used and table["conn_id"].isna().any():  # the Thread_id of the slow-log entries joined to a connection
        named = connids.ids_from_slow_log(table, slow, join.entry)
        if connids.fill_table(table, named, connids.SLOWLOG) and cs.thread_pool_size:
            table["thread_group"] = (table["conn_id"].astype("Int64") % int(cs.thread_pool_size)).astype("Int64")
    joined_info(slow_info, join, note)
    del join  # its per-row arrays (the joined entry, the Query_time, the undecided marks): read by now
    if decomposed is not None:
        decomposed(table)
    view = thread_pool_view(table, cs.thread_pool_size)
    for col in ("thread_group", "stall", "stall_role"):
        # a Series on the table's index: setting a column from an array copies it (a null column of stride 0 too)
        table[col] = pd.Series(held(getattr(view, col).array), index=table.index, copy=False)
    if view.queue_source is not None:
        table["queue_source"] = view.queue_source.array
    for w in view.warnings:
        note(w if len(cs.of("db")) <= 1 else f"{point}: {w}")
    return table, ServerPart(point, view, slow_info)


def server_slow_log(slow_path, tz, max_sql_bytes: int, wire: Callable[[], object], note
                    ) -> tuple[pd.DataFrame | None, dict]:
    """A DB point's slow log (`slow_path`, None: none) read for the join, and summary.json → slow_log's start (the
    file, what its reading said); its reading's warnings (the first five) to `note`. `wire()` gives the wire's
    statements the log's header lines could hide in (slowlog.join.wire_statements of the point's joined rows),
    made only when there is a log to read. A log that cannot be read: noted, None (analysed without it)."""
    slow = None
    slow_info: dict = {"file": str(slow_path) if slow_path else None, "used": False}
    if slow_path is None:
        return slow, slow_info
    from ..slowlog.reader import read_slow_log

    try:
        slow, sstats = read_slow_log(slow_path, tz=tz, max_sql_bytes=max_sql_bytes, wire=wire())
        slow_info.update({"flavor": sstats.flavor, "unparsed_lines": sstats.unparsed_lines,
                          "cut_entries": sstats.cut_entries, "damaged_values": sstats.damaged_values,
                          "capped_statements": sstats.capped_statements,
                          "wire_sql_entries": sstats.wire_sql_entries,
                          "unverified_entries": sstats.unverified_entries})
        for w in sstats.warnings[:5]:
            note(w)
    except SlowLogError as err:
        note(f"{err}; analysed without the slow log")
    return slow, slow_info


def joined_info(slow_info: dict, join, note) -> None:
    """summary.json → slow_log of a DB point: `slow_info` (the file, what its reading said) with the join's counts
    (`join`: slowlog.join's result, without a slow log its empty one, or a summarized
    explain.partitioned_join.PartitionedJoin: its `stats`, `warnings` and `used`); the join's warnings to
    `note`."""
    for w in join.warnings:
        note(w)
    slow_info.update(join.stats)
    slow_info["used"] = join.used


def conn_id_sources_of(table: pd.DataFrame, filled: dict[str, str]) -> pd.Categorical:
    """Each row's conn_id_source: greeting where the id came with the connection, else the source that named its
    client endpoint (at the DB point, else at the app)."""
    known = table["conn_id"].notna().to_numpy()
    codes = np.where(known, connids.SOURCES.index(connids.GREETING), -1).astype(np.int8)
    if filled:
        other = pd.Series(connids.client_keys(table)).map(
            {client: connids.SOURCES.index(source) for client, source in filled.items()})
        take = other.notna().to_numpy() & known
        codes[take] = other.to_numpy(dtype="float64", na_value=np.nan)[take].astype(np.int8)
    return pd.Categorical.from_codes(codes, categories=list(connids.SOURCES))


# --- exchanges.parquet's dictionaries, by rule (docs/partitioned.md §2.3) --------------------------------------

SEEN_CATEGORIES = ("app", "both", "db")  # decompose.build_table's `seen`, whichever occur
REBUILT_STATEMENT_COLUMNS = ("sql", "fingerprint", "query_id")  # decompose._statements_from_db's categoricals


def output_categories(app: dict[str, list], db: dict[str, list], present: dict[str, list], *, db_rows: bool,
                      db_only_rows: bool, matched_rows: bool, statements_from_db: bool, texts_from_log: bool = False
                      ) -> dict[str, list[str]]:
    """The categories of each categorical column of exchanges.parquet, as today's table has them: the rules the
    in-memory path follows without stating them, in one place, for a writer that must know every row group's
    dictionary page (the whole list, unused entries included) before its first row (core.outputs.write_merged).

    - `seen` and `conn_id_source`: fixed lists, whatever occurs (SEEN_CATEGORIES; read.connids.SOURCES, in its
      order of precedence, not sorted);
    - `problems` where some exchange was seen at both points (decompose._merged_problems rebuilds it), and `sql`,
      `fingerprint`, `query_id` where some statement was taken from the DB side (`statements_from_db`:
      decompose._statements_from_db) or from the slow log (`texts_from_log`: an ENCRYPTED row joined to an entry,
      decompose._texts_from_slow_log): the values present, sorted;
    - the other columns of the extraction (EXCHANGE_COLUMNS' categoricals, `app` and `db` given): the app side's
      categories when no row was seen at the DB alone (decompose._rows_of takes the app column as it is), else the
      sorted union of both sides' whole lists (concat_column's union_categoricals), entries of DB rows that paired
      and so are not in the file included; without an app side, the DB side's whole list (its table's column as
      it is: unused entries included, those of the rows a window dropped);
    - `db_client`: the DB side's whole `client` list when the DB side has rows (`db_rows`: decompose.build_table
      takes the DB table's column as it is, so a window's dropped rows' entries are among its categories as they
      are among `client`'s), else none;
    - every other column (made by as_category or labelled): the values present, sorted.
    `app`, `db`: per extraction column, the categories of each side's table (the sorted union of its points' and
    re-reads' distinct values; a side without a capture: none); `present`: per column, the values its rows hold
    (as many times as they occur, or once: only the set counts)."""
    out = {}
    for column in (*EXCHANGE_COLUMNS, *ANALYSIS_COLUMNS):
        if column.dtype != CATEGORY:
            continue
        name = column.name
        if name == "seen":
            out[name] = list(SEEN_CATEGORIES)
        elif name == "conn_id_source":
            out[name] = list(connids.SOURCES)
        elif (name == "problems" and matched_rows) or \
                (name in REBUILT_STATEMENT_COLUMNS and (statements_from_db or texts_from_log)):
            out[name] = sorted(set(present.get(name, ())))
        elif column in EXCHANGE_COLUMNS and name in app:
            out[name] = sorted(set(app[name]) | (set(db.get(name, ())) if db_only_rows else set()))
        elif column in EXCHANGE_COLUMNS and not app and name in db:  # DB points alone: their column as it is
            out[name] = sorted(set(db[name]))
        elif name == "db_client":  # build_table's db_column("client"): the DB table's column as it is
            out[name] = sorted(set(db.get("client", ()))) if db_rows else []
        else:
            out[name] = sorted(set(present.get(name, ())))
    return out
