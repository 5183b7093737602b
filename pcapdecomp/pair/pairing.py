"""Stage 2's face: the capture points of one capture set → Paired, the app and DB sides with their exchanges
matched, through a proxy when there is one in the traffic, capture loss repaired from the other point, the
clocks fitted and the connections without a greeting named."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..core.memory import map_big_blocks, release_memory
from ..core.schema import CONNECTION_COLUMNS, EXCHANGE_COLUMNS
from ..core.tables import concat, frame
from ..core.workers import Ahead
from ..read import connids
from ..read.captureset import CaptureSet
from ..read.extract import Extracted
from ..read.sources import parse_server
from .match import Matching, Pairing, one_point_matching
from .proxy import NoProxy, ProxyResult, Side, through_proxy

if TYPE_CHECKING:
    from .clock import ClockModel
    from .repair import Repair

# The loss repair and the clocks (pair.repair, pair.clocks, pair.clock) are imported where two points are paired:
# a capture at one point, over half of the runs, would build their classes and pay for them for nothing.


@dataclass
class Paired:
    """Stage 2's result: the two ends of the decomposition (the app side and the DB side; through a proxy, the ends
    of its chain), their exchanges matched, and what the summary says of the pairing."""

    app_ex: pd.DataFrame  # the app side's exchanges (EXCHANGE_COLUMNS)
    db_ex: pd.DataFrame
    app_conns: pd.DataFrame  # and connections (CONNECTION_COLUMNS)
    db_conns: pd.DataFrame
    matching: Matching  # which app row and DB row are one exchange (the joined table's rows, in its order)
    clocks: dict[str, ClockModel]  # by app point (one DB point) or clocks.pair_key (several)
    clock_info: dict[str, dict]  # summary.json → clocks
    primary: str | None  # the app capture whose clock the joined table's times are on
    row_point: np.ndarray  # per joined row: the DB point that saw it (db_points)
    row_clock: np.ndarray | None  # per joined row, with several DB points: the clock of its DB times (clock_keys)
    id_sources: dict[str, str]  # {client endpoint: conn_id source} of the connections named without a greeting
    proxied: ProxyResult | None  # the chain through a proxy, when the traffic went through one
    proxy_summary: dict | None  # summary.json → proxy
    repair: Repair | None  # the loss repair, when one ran
    app_kind: str = "app"  # whose capture points are the app side: "proxy" when a proxy capture without a proxy in
    # its traffic stood in for the missing app captures
    repair_skipped: dict | None = None  # summary.json → repair of a pair that lost frames, left unrepaired (skipped)

    @property
    def through_proxy(self) -> bool:
        return self.proxied is not None


# --jobs 1's mmap threshold from the end of the repair: a column of half a million rows and more (int64) gets a
# mapping of its own, given back when freed; a shorter one comes from the heap (core.memory.map_big_blocks)
AFTER_THE_REPAIR_BYTES = 4 << 20


def pair_points(x: Extracted, cs: CaptureSet, jobs: int, max_sql_bytes: int, note: Callable[[str], None],
                runner=None, ahead: Ahead | None = None, lean: bool = False, loss_repair: bool = True) -> Paired:
    """Pair the extracted capture points of `cs`: the connections, then (after the loss repair, which replaces the
    rows of the connections it repairs) the exchanges inside them; fit the clocks and name the connections. The
    extractions hand their exchanges over (`x.app[i].exchanges` is emptied). `ahead`: workers for the clock's pass
    over the captures, started here at once; `lean` (--jobs 1): freed big blocks went back to the OS until now
    (core.memory.map_big_blocks), which ends with the repair. `loss_repair` False (Options.loss_repair, for tests):
    no loss repair, the lost bytes left holes, as the partitioned run leaves them (run/spilled.py)."""
    app_x, db_xs, proxy_x = x.app, x.db, x.proxy
    # analyze --since/--until: the clock's samples from the window and its margin (core.window)
    around = cs.window.around() if cs.window is not None else None
    read_ahead = {}
    if ahead is not None and not proxy_x and app_x and db_xs:  # (start_segment_passes: {} unless both points)
        from .clocks import start_segment_passes

        read_ahead = start_segment_passes(ahead, x.app_points, x.db_points, app_x, db_xs, around)
    app_ex = concat([e.exchanges for e in app_x]) if app_x else frame([], EXCHANGE_COLUMNS)
    app_conns = concat([e.connections for e in app_x]) if app_x else frame([], CONNECTION_COLUMNS)
    db_ex = concat([e.exchanges for e in db_xs]) if db_xs else frame([], EXCHANGE_COLUMNS)
    db_conns = concat([e.connections for e in db_xs]) if db_xs else frame([], CONNECTION_COLUMNS)
    # one point only: nothing to pair (the repair and the clocks need both points)
    matching = Pairing(app_ex, db_ex, app_conns, db_conns) if app_x and db_xs else one_point_matching(app_ex, db_ex)
    points = {p.name: p for p in cs.points}  # the passes that read a capture again are given its point
    proxied = through_proxy(Side(app_ex, app_conns) if app_x else None, Side(db_ex, db_conns) if db_xs else None,
                            Side(concat([e.exchanges for e in proxy_x]), concat([e.connections for e in proxy_x]))
                            if proxy_x else None, set(cs.servers), set(cs.proxy_servers), direct=matching,
                            points=points)
    proxy_summary = proxied.summary if proxied is not None else None
    app_points, app_kind = x.app_points, "app"
    if isinstance(proxied, NoProxy):  # a proxy capture without a proxy in its traffic stays out of the way
        note(f"{', '.join(str(p) for p in cs.proxy)}: {proxied.warning}")
        proxied = None
        if not app_x:  # it is the client side's view
            app_x, app_points, app_kind = proxy_x, x.proxy_points, "proxy"
            app_ex, app_conns = concat([e.exchanges for e in app_x]), concat([e.connections for e in app_x])
            matching = Pairing(app_ex, db_ex, app_conns, db_conns)
            proxied = through_proxy(Side(app_ex, app_conns), Side(db_ex, db_conns) if db_xs else None, None,
                                    set(cs.servers), set(cs.proxy_servers), direct=matching, points=points)
            proxy_summary = proxied.summary if proxied is not None else proxy_summary
    if proxied is not None:  # the two sides of the decomposition are the ends of the chain through the proxy
        app_ex, app_conns, db_ex, db_conns = (proxied.client.ex, proxied.client.conns, proxied.server.ex,
                                              proxied.server.conns)
        matching = proxied.matching
        for w in proxied.warnings:
            note(w)
    # app_ex and db_ex hold the extractions' exchanges now: the extractions let theirs go, so that a table the
    # repair replaces is not kept alive through the stages after it
    for e in x.all:
        e.exchanges = e.exchanges.iloc[:0].copy()  # a copy: an empty view would keep the whole table alive
    release_memory()
    # capture loss is repaired between two captures of one TCP connection: not through a proxy
    lossy = [e for e in (*app_x, *db_xs) if e.holes] if app_x and db_xs and proxied is None and not loss_repair \
        else []
    repair_skipped = None
    if lossy:
        from .repair import skipped

        repair_skipped = skipped(lossy, "switched off (run.session.Options.loss_repair, for tests)")
    repair = None
    if app_x and db_xs and proxied is None and repair_skipped is None:
        from .repair import PairTables, repair_losses

        handed = PairTables(app_ex, db_ex, app_conns, db_conns, matching)  # their only holder now
        del app_ex, db_ex, app_conns, db_conns, matching
        repair = repair_losses(app_x, db_xs if len(db_xs) != 1 else db_xs[0], handed,
                               {parse_server(s) for s in cs.servers} or None, max_sql_bytes, jobs, x.tls_secrets,
                               cs.window)
        if repair is None:
            app_ex, db_ex, app_conns, db_conns, matching = handed.take()
        del handed
    if repair is not None:
        app_ex, db_ex, app_conns, db_conns, matching = (repair.app_ex, repair.db_ex, repair.app_conns,
                                                        repair.db_conns, repair.matching)
        repair.app_ex = repair.db_ex = None  # held here only, so that the DB table can go when its stage is done
        release_memory()
        for message in repair.stats.warnings():
            note(message)
    elif not isinstance(matching, Matching):  # nothing to repair: the exchanges paired from the same connection pairs
        matching = matching.complete()
    if lean:  # the extractions and the repair are done: see core.memory.map_big_blocks
        map_big_blocks(AFTER_THE_REPAIR_BYTES)
    if app_x and db_xs and matching.stats.matched == 0 and len(app_ex) and len(db_ex):
        note("no exchange was seen at both points: are these captures of the same traffic and time?")
    elif app_x and db_xs and proxied is None and len(app_x) + len(db_xs) > 2:
        for message in points_seen_alone(_rows_by_point(app_ex, db_ex, matching)):
            note(message)

    # the clocks: one model per app point and DB point, from segments of their matched connections
    several = len(db_xs) > 1
    clocks: dict[str, ClockModel] = {}
    clock_info: dict[str, dict] = {}
    if app_x and db_xs and len(matching.connections) and proxied is None:  # through a proxy: its own clocks, per hop
        from .clocks import fit_clocks

        clocks, clock_info = fit_clocks(app_points, x.db_points, app_x, db_xs, app_ex, db_ex, app_conns, db_conns,
                                        matching, runner, jobs, note, read_ahead, around)
    if ahead is not None:
        ahead.end()  # its passes are taken (or unused): see Ahead.end
    primary = app_x[0].capture if app_x else None
    if proxied is not None:
        clocks = dict(proxied.clocks)
        clock_info = {}  # the proxy's clocks are in summary.json → proxy.clocks
        primary = str(app_ex["capture"].iloc[0]) if len(app_ex) else primary

    # connection ids without a greeting (a pool opened before the capture): named at the DB point, where the
    # processlist's HOST is the client's endpoint; at the app point when there is none
    id_sources = connids.name_connections(cs.processlist, points, app_ex, app_conns, db_ex,
                                          db_conns, note)

    row_point = db_points(app_ex, db_ex, matching)
    row_clock = None
    if several:
        from .clocks import clock_keys

        row_clock = clock_keys(app_ex, matching, row_point, clocks, primary)
    return Paired(app_ex, db_ex, app_conns, db_conns, matching, clocks, clock_info, primary, row_point, row_clock,
                  id_sources, proxied, proxy_summary, repair, app_kind, repair_skipped)


def points_seen_alone(counts: tuple[tuple[dict[str, int], dict[str, int]], tuple[dict[str, int], dict[str, int]]]
                      ) -> list[str]:
    """The warnings of the capture points none of whose exchanges was paired with the other side's while other
    points' were (a pair that pairs nothing at all has its own warning): a point of other traffic or another
    time, given by mistake or of a host whose partner was not captured; its rows are one side's only, not split.
    `counts`: (rows, paired) of the app points and of the DB points, each by point name; paired counts rows or
    connections (zero or not is what is read)."""
    out = []
    for (rows, paired), kind, other, why in (
            (counts[0], "app", "a DB point", "traffic to a server whose capture is not given, or another time"),
            (counts[1], "DB", "an app point", "traffic of app hosts not captured, or another time")):
        for name, n in rows.items():
            if n and not paired.get(name):
                out.append(f"{kind} point {name}: none of its {n:,} exchanges was seen at {other}, while the other "
                           f"points' were: likely {why} (is it a capture of this incident?); its rows are "
                           f"{kind}-only, their time not split")
    return out


def _rows_by_point(app_ex: pd.DataFrame, db_ex: pd.DataFrame, matching: Matching):
    """points_seen_alone's counts of the in-memory pairing: per point, its rows and its rows paired."""
    both = (matching.app_row >= 0) & (matching.db_row >= 0)

    def counted(table: pd.DataFrame, rows: np.ndarray) -> tuple[dict[str, int], dict[str, int]]:
        capture = table["capture"].astype(object).to_numpy()
        every = pd.Series(capture).value_counts()
        paired = pd.Series(capture[rows]).value_counts()
        return ({str(k): int(v) for k, v in every.items()}, {str(k): int(v) for k, v in paired.items()})

    return counted(app_ex, matching.app_row[both]), counted(db_ex, matching.db_row[both])


def db_points(app_ex: pd.DataFrame, db_ex: pd.DataFrame, matching) -> np.ndarray:
    """Per row of the joined table (matching's order): the DB point that saw the exchange; for one only the app
    saw, the DB point its server endpoint (as the app saw it) leads to, when exactly one does; else None."""
    ar, dr = matching.app_row, matching.db_row
    out = np.full(len(ar), None, dtype=object)
    if not len(db_ex):
        return out
    d_cap = db_ex["capture"].astype(object).to_numpy()
    seen_d = dr >= 0
    out[seen_d] = d_cap[dr[seen_d]]
    only_a = ~seen_d & (ar >= 0)
    if only_a.any() and len(app_ex):
        a_server = app_ex["server"].astype(object).to_numpy()
        both = seen_d & (ar >= 0)
        leads = pd.DataFrame({"server": np.concatenate([a_server[ar[both]], db_ex["server"].astype(object).to_numpy()]),
                              "point": np.concatenate([out[both], d_cap])}).drop_duplicates()
        counted = leads.groupby("server")["point"].agg(["first", "size"])
        unique = counted.loc[counted["size"] == 1, "first"]
        rows = np.flatnonzero(only_a)
        out[rows] = pd.Series(a_server[ar[rows]]).map(unique).astype(object).where(lambda v: v.notna(), None).to_numpy()
    return out
