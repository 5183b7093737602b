"""Match stage: pair each exchange seen at an app host with the same exchange seen at the DB host (the TCP segments
both points saw, the clock's samples, are pair/clocks.py's).

Why sequence numbers: the same TCP connection carries the same raw sequence numbers at both capture points, even
when source NAT or a load balancer rewrites addresses and ports, and whatever the segmentation (TSO/GRO) at each
host. So a request is keyed by the raw sequence number of its first byte. Sequence numbers are 32-bit and random
per connection, so two different connections can collide; pairs are therefore decided per *connection* first:
connections vote by how many of their requests share a sequence number with the same command and text, the server
greeting's scramble (20 random bytes, identical at both points) outvotes everything, and a different scramble or
connection id vetoes. Exchanges are then paired only inside paired connections, and only when command, text and
the end of the response (resp_tcp_end) agree: a neighbour's request or response is never taken for this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..core.groups import group_order

if TYPE_CHECKING:
    from ..read.exchanges import Extraction

SCRAMBLE_VOTE = 1_000_000  # a shared greeting scramble outweighs any number of shared sequence numbers
# A key (a request's sequence number and content, or a scramble) that more connections than this share at one point
# does not vote on its own: it votes only together with the connection's endpoints, with the same limit. This keeps
# matching linear in exchanges whatever the repeated values (5,000 connections opened with one ISN, a replayed
# greeting); such keys are counted in MatchStats.ambiguous_keys.
FANOUT = 4
VOTE_KEY = ["seq", "cmd", "sql"]  # a request's vote: its TCP sequence number, command and text (codes)


@dataclass(frozen=True, slots=True)
class MatchStats:
    app_exchanges: int
    db_exchanges: int
    matched: int  # exchanges paired (seen = both)
    app_only: int
    db_only: int
    conflicts: int  # same connection and request bytes, but command/text/response end disagree: not paired
    connections_matched: int
    connections_by_scramble: int  # paired connections confirmed by the greeting scramble
    connections_nat: int  # paired connections whose client endpoint differs between the points (NAT)
    connections_vetoed: int  # candidate connection pairs refused: different scramble or connection id
    connections_ambiguous: int = 0  # connections left unpaired: two partners at the other point scored the same
    ambiguous_keys: int = 0  # keys shared by more than FANOUT connections at one point (they vote only with endpoints)
    candidates: int = 0  # candidate rows the joins produced (the work done; linear in exchanges and connections)

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass
class Matching:
    """Row pairs between two exchange tables (positional indexes); -1 where one side did not see the exchange."""

    app_row: np.ndarray  # int64, positional row in the app table or -1
    db_row: np.ndarray  # int64, positional row in the DB table or -1
    notes: np.ndarray  # str per pair: comma-separated match notes ('' when none)
    connections: pd.DataFrame  # app_conn, db_conn (conn keys), nat, by_scramble
    stats: MatchStats

    @property
    def matched(self) -> int:
        """Exchanges paired (as Pairing.matched)."""
        return self.stats.matched

    def matched_at_least(self, count: float) -> bool:
        return self.stats.matched >= count


def connection_keys(exchanges: pd.DataFrame) -> pd.Series:
    """One integer per (capture, conn_index): several app captures share conn_index values."""
    if len(exchanges) == 0:
        return pd.Series([], dtype="int64")
    # groupby(["capture", "conn_index"], sort=False).ngroup(): numbered in order of first appearance, as factorize
    captures = pd.factorize(exchanges["capture"])[0].astype(np.int64)
    conn = exchanges["conn_index"].to_numpy(dtype=np.int64)
    width = int(conn.max()) + 1 if len(conn) else 1
    if captures.min() < 0 or conn.min() < 0 or (int(captures.max()) + 1) * width >= 1 << 62:
        return exchanges.groupby(["capture", "conn_index"], sort=False).ngroup().astype("int64")
    return pd.Series(pd.factorize(captures * width + conn)[0].astype(np.int64), index=exchanges.index)


def _codes(a: pd.Series, b: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes of two columns in one value space; null is -1 on both sides (two nulls are equal)."""
    if isinstance(a.dtype, pd.CategoricalDtype) and isinstance(b.dtype, pd.CategoricalDtype):
        # a's codes as they are, b's categories looked up among a's and its own others (only equality of codes
        # matters to the joins): no recoding of a's rows
        space = a.cat.categories.append(b.cat.categories.difference(a.cat.categories))
        to_space = space.get_indexer(b.cat.categories)
        if space.is_unique and not (to_space < 0).any():
            to_space = np.append(to_space, -1).astype(np.int64)  # a null's code -1 picks the last: -1
            return a.cat.codes.to_numpy(np.int64), to_space[b.cat.codes.to_numpy(np.int64)]
        space = a.cat.categories.union(b.cat.categories)
        return (a.cat.set_categories(space).cat.codes.to_numpy(np.int64),
                b.cat.set_categories(space).cat.codes.to_numpy(np.int64))
    codes, _ = pd.factorize(pd.concat([a.astype(object), b.astype(object)], ignore_index=True), use_na_sentinel=True)
    return codes[:len(a)].astype(np.int64), codes[len(a):].astype(np.int64)


def _radix_key(frames: list[pd.DataFrame], keys: list[str]) -> list[np.ndarray] | None:
    """One int64 per row of each frame for its values of the integer columns `keys` (mixed radix over the columns'
    ranges, in one space for all frames: equal numbers, equal values); None when the ranges need more than 62 bits."""
    return _radix_arrays([[f[k].to_numpy(np.int64) for k in keys] for f in frames])


def _radix_arrays(frames: list[list[np.ndarray]]) -> list[np.ndarray] | None:
    """_radix_key of frames given as their key columns (integer arrays, in the same order for every frame)."""
    columns = [[np.asarray(f[k], dtype=np.int64) for f in frames] for k in range(len(frames[0]))]
    out = [np.zeros(len(f[0]), dtype=np.int64) for f in frames]
    room = 1
    for parts in columns:
        present = [p for p in parts if len(p)]
        if not present:
            continue
        low = min(int(p.min()) for p in present)
        span = max(int(p.max()) for p in present) - low + 1
        room *= span
        if room >= 1 << 62:
            return None
        for o, p in zip(out, parts):  # o * span + (p - low), in place: no temporary of the table's length
            o *= span
            o += p
            o -= low
    return out


def _bounded_join(a: pd.DataFrame, d: pd.DataFrame, on: list[str], refine: list[str]) -> tuple[pd.DataFrame, int, int,
                                                                                             set, set]:
    """The (a_conn, d_conn) pairs that share a value of `on`, at most FANOUT × FANOUT per value: a value that more
    connections share at one point is joined on `on` + `refine` instead (with the same limit), or not at all.
    Returns (pairs with the number of shared values, values too widely shared to vote on their own, rows produced,
    and the app and DB connections that hold those values).

    Done on sorted integer arrays (what _bounded_join_frames does with pandas merges and groupbys, several times
    faster): each point's rows sorted by (value of `on`, connection) give its distinct (value, connection) pairs
    as runs (_distinct_pairs), the values are numbered in one space for both points (_numbered), and the
    connections per value and the join are bincounts and searches in those sorted arrays.""" 
    keys = _radix_key([a, d], on) if len(a) and len(d) else None
    if keys is None:
        return _bounded_join_frames(a, d, on, refine)
    a_conn, d_conn = a["a_conn"].to_numpy(np.int64), d["d_conn"].to_numpy(np.int64)
    if min(a_conn.min(), d_conn.min()) < 0 or max(a_conn.max(), d_conn.max(), len(a) + len(d)) >= 1 << 31:
        return _bounded_join_frames(a, d, on, refine)
    key_a, key_d = keys
    del keys
    va, ca, row_a = _distinct_pairs(key_a, a_conn)
    vd, cd, row_d = _distinct_pairs(key_d, d_conn)
    del key_a, key_d
    if not (va[1:] == va[:-1]).any() and not (vd[1:] == vd[:-1]).any():
        # every value at one connection of each point (the usual case: requests of different connections share
        # no sequence number): all within FANOUT, none ambiguous, the join is one search of the sorted values
        pa, pd_ = _join_values(ca, va, cd, vd)
        pair, votes = _counted_pairs(pa, pd_)
        counted = pd.DataFrame({"a_conn": pair >> 32, "d_conn": pair & 0xFFFFFFFF, "votes": votes.astype(np.int64)})
        return counted, 0, len(va) + len(vd) + len(pa), set(), set()
    va, vd = _numbered(va, vd)
    work = 0
    parts = []
    ambiguous = 0
    held: tuple[set, set] = (set(), set())
    for step in (0, 1):
        if not len(va) or not len(vd):
            break
        if step == 1:  # the values of `on` + `refine`, renumbered in one space
            on_rows = [a[refine].iloc[row_a], d[refine].iloc[row_d]]  # the columns read, not whole rows
            refined = _radix_key(on_rows, refine)
            if refined is None:
                refined = list(_codes_of(on_rows, refine))
            del on_rows
            both = np.unique(np.concatenate([va, vd]) * (int(max(refined[0].max(initial=0),
                                                                  refined[1].max(initial=0))) + 1)
                             + np.concatenate(refined), return_inverse=True)[1].reshape(-1)
            va, vd = both[:len(va)], both[len(va):]
        space = int(max(va.max(), vd.max())) + 1
        count_a, count_d = np.bincount(va, minlength=space), np.bincount(vd, minlength=space)
        a_ok, d_ok = count_a[va] <= FANOUT, count_d[vd] <= FANOUT
        pa, pd_ = _join_values(*((ca, va) if a_ok.all() else (ca[a_ok], va[a_ok])),  # (all: no copies)
                               *((cd, vd) if d_ok.all() else (cd[d_ok], vd[d_ok])))
        work += len(va) + len(vd) + len(pa)
        parts.append((pa, pd_))
        # what remains ambiguous: values present at both points but too widely shared at one of them
        big = (count_a > 0) & (count_d > 0) & ((count_a > FANOUT) | (count_d > FANOUT))
        n_big = int(big.sum())
        work += n_big
        if step == 1:
            break
        ambiguous = n_big
        if n_big:
            held = (set(ca[big[va]].tolist()), set(cd[big[vd]].tolist()))
        if not n_big or not refine:
            break
        keep_a, keep_d = big[va], big[vd]
        va, ca, row_a = va[keep_a], ca[keep_a], row_a[keep_a]
        vd, cd, row_d = vd[keep_d], cd[keep_d], row_d[keep_d]
    pa = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    pd_ = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    pair, votes = _counted_pairs(pa, pd_)  # sorted by a_conn, then d_conn
    counted = pd.DataFrame({"a_conn": pair >> 32, "d_conn": pair & 0xFFFFFFFF, "votes": votes.astype(np.int64)})
    return counted, ambiguous, work, *held


def _key_then_group_order(key: np.ndarray, group: np.ndarray, groups: int) -> np.ndarray:
    """np.lexsort((group, key)): the rows in order of key, then group (0 … groups − 1), then row. Made as a stable
    sort of the group numbers (numpy's radix sort: core.groups.group_order) and then a stable sort of the keys in that
    order, which timsort runs through in a few merges when each group's keys already grow with its rows (a
    connection's request sequence numbers do), which is cheaper than one sort of both keys."""
    by_group = group_order(group, groups - 1)
    return by_group[np.argsort(key[by_group], kind="stable")]


def _distinct_pairs(key: np.ndarray, conn: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (key, connection) pairs of one point's rows in order of key, then connection, and the first
    row of each (connections are numbered from 0)."""
    order = _key_then_group_order(key, conn, int(conn.max()) + 1)
    sorted_key, sorted_conn = key[order], conn[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (sorted_key[1:] != sorted_key[:-1]) | (sorted_conn[1:] != sorted_conn[:-1])
    return sorted_key[first], sorted_conn[first], order[first]


def _numbered(a: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted arrays of values as numbers 0, 1, 2 … in order of value, in one space (equal values, equal
    numbers): a stable sort of the two joined (timsort merges the two runs) and a count of the changes."""
    both = np.concatenate([a, d])
    order = np.argsort(both, kind="stable")
    ordered = both[order]
    del both
    number = np.zeros(len(ordered), dtype=np.int64)
    np.cumsum(ordered[1:] != ordered[:-1], out=number[1:])
    del ordered
    out = np.empty(len(number), dtype=np.int64)
    out[order] = number
    return out[:len(a)], out[len(a):]


def _counted_pairs(a: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique((a << 32) | d, return_counts=True) for connection numbers a and d (0 … 2^31): by a bincount over
    every (a, d) when there are not many more of them than pairs (connections are far fewer than their shared
    values), else by the sort."""
    if not len(a):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    width = int(d.max()) + 1
    if (int(a.max()) + 1) * width > len(a) + (1 << 20):
        return np.unique((a << 32) | d, return_counts=True)
    counts = np.bincount(a * width + d)
    present = np.flatnonzero(counts)
    return ((present // width) << 32) | (present % width), counts[present]


def _codes_of(frames: list[pd.DataFrame], keys: list[str]) -> tuple[np.ndarray, ...]:
    """Per frame, one code per row of its values of `keys`, in one space (equal codes, equal values)."""
    joined = pd.concat([f[keys] for f in frames], ignore_index=True)
    codes = joined.groupby(keys, sort=False).ngroup().to_numpy(np.int64)
    bounds = np.cumsum([0, *(len(f) for f in frames)])
    return tuple(codes[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:]))


def _join_values(a_conn: np.ndarray, va: np.ndarray, d_conn: np.ndarray, vd: np.ndarray) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """The inner join of (a_conn, value) rows with (d_conn, value) rows on the value: the a_conn and d_conn of
    each joined row."""
    if len(vd) and not (vd[1:] < vd[:-1]).any():  # sorted already (_bounded_join's are)
        order, sorted_vd = None, vd
    else:
        order = np.argsort(vd, kind="stable")
        sorted_vd = vd[order]
    lo = np.searchsorted(sorted_vd, va, side="left")
    if len(vd) and not (sorted_vd[1:] == sorted_vd[:-1]).any():  # each value once at the other point: one search
        hit = np.flatnonzero(sorted_vd[np.minimum(lo, len(vd) - 1)] == va)
        at = lo[hit]
        return a_conn[hit], d_conn[at if order is None else order[at]]
    if order is None:
        order = np.arange(len(vd))
    many = np.searchsorted(sorted_vd, va, side="right") - lo
    rows_a = np.repeat(np.arange(len(va)), many)
    step = np.arange(len(rows_a)) - np.repeat(np.cumsum(many) - many, many)
    rows_d = order[np.repeat(lo, many) + step]
    return a_conn[rows_a], d_conn[rows_d]


def _bounded_join_frames(a: pd.DataFrame, d: pd.DataFrame, on: list[str], refine: list[str]) -> tuple[pd.DataFrame,
                                                                                                     int, int, set,
                                                                                                     set]:
    """The (a_conn, d_conn) pairs that share a value of `on`, at most FANOUT × FANOUT per value: a value that more
    connections share at one point is joined on `on` + `refine` instead (with the same limit), or not at all.
    Returns (pairs with the number of shared values, values too widely shared to vote on their own, rows produced,
    and the app and DB connections that hold those values)."""
    a = a.drop_duplicates(["a_conn", *on])
    d = d.drop_duplicates(["d_conn", *on])
    work = 0
    parts = []
    ambiguous = 0
    held: tuple[set, set] = (set(), set())
    for keys in (on, [*on, *refine]):
        if not len(a) or not len(d):
            break
        na = a.groupby(keys, sort=False)["a_conn"].transform("size").to_numpy()
        nd = d.groupby(keys, sort=False)["d_conn"].transform("size").to_numpy()
        a_ok, d_ok = a[na <= FANOUT], d[nd <= FANOUT]
        joined = a_ok[["a_conn", *keys]].merge(d_ok[["d_conn", *keys]], on=keys, how="inner")
        work += len(a) + len(d) + len(joined)
        parts.append(joined[["a_conn", "d_conn"]])
        # what remains ambiguous: values present at both points but too widely shared at one of them
        a_big = a[na > FANOUT].drop_duplicates(keys)[keys]
        d_big = d[nd > FANOUT].drop_duplicates(keys)[keys]
        a_any = a.drop_duplicates(keys)[keys]
        d_any = d.drop_duplicates(keys)[keys]
        big = pd.concat([a_big.merge(d_any, on=keys), d_big.merge(a_any, on=keys)]).drop_duplicates()
        work += len(big)
        if keys != on:
            break
        ambiguous = len(big)
        if len(big):
            held = (set(a.merge(big, on=keys)["a_conn"]), set(d.merge(big, on=keys)["d_conn"]))
        if not len(big) or not refine:
            break
        a = a.merge(big[on].drop_duplicates(), on=on)
        d = d.merge(big[on].drop_duplicates(), on=on)
    pairs = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({"a_conn": [], "d_conn": []})
    counted = pairs.groupby(["a_conn", "d_conn"]).size().rename("votes").reset_index()
    return counted, ambiguous, work, *held


def match_exchanges(app: pd.DataFrame, db: pd.DataFrame, app_conns: pd.DataFrame, db_conns: pd.DataFrame) -> Matching:
    """Pair rows of the app exchanges table (all app captures concatenated) with rows of the DB one.

    app_conns/db_conns are the connections tables (capture, conn_index, conn_id, scramble, ...). The work is
    linear in exchanges and connections whatever repeats in the keys (FANOUT). Both steps at once: see Pairing.
    """
    return Pairing(app, db, app_conns, db_conns).complete()


def one_point_matching(app: pd.DataFrame, db: pd.DataFrame) -> Matching:
    """Pairing(app, db, app_conns, db_conns).complete() where one of the two tables has no rows (a capture at one
    point only), made directly: nothing pairs, so every row is its own point's alone, in row order, with no note (a
    note needs a paired connection, a conflict or an ambiguous twin at the other point), and no candidate was
    joined: made without the votes, the scramble join and the exchange pairing, which find nothing there."""
    if len(app) and len(db):
        raise ValueError("one_point_matching: both tables have rows")
    app_row = np.arange(len(app), dtype=np.int64)
    db_row = np.arange(len(db), dtype=np.int64)
    notes = np.full(len(app) + len(db), "", dtype=object)
    # the columns as the vote tables' empty join makes them
    connections = pd.DataFrame({"app_conn": np.zeros(0, dtype=np.float64), "db_conn": np.zeros(0, dtype=np.float64),
                                "nat": np.zeros(0, dtype=bool), "by_scramble": np.zeros(0, dtype=bool)})
    stats = MatchStats(app_exchanges=len(app), db_exchanges=len(db), matched=0, app_only=len(app), db_only=len(db),
                       conflicts=0, connections_matched=0, connections_by_scramble=0, connections_nat=0,
                       connections_vetoed=0)
    return Matching(np.concatenate([app_row, np.full(len(db), -1, dtype=np.int64)]),
                    np.concatenate([np.full(len(app), -1, dtype=np.int64), db_row]), notes, connections, stats)


class Pairing:
    """match_exchanges in its two steps: the connection pairs (`connections`, made here) and the exchange pairs
    inside them (`matched`, `complete()`), made when first wanted and then once.

    Why two: the loss repair (pair/repair.py) needs only the connection pairs, and it replaces the exchange rows of the
    connections it repairs, which are then paired once, after it: an exchange pairing made before it would be
    thrown away. When nothing is repaired the exchanges are paired from these
    same connection pairs. Holds the two exchange tables until `complete()` or `release()`."""

    def __init__(self, app: pd.DataFrame, db: pd.DataFrame, app_conns: pd.DataFrame, db_conns: pd.DataFrame):
        self._app, self._db = app, db
        self._columns: tuple | None = None
        self._inside: tuple | None = None
        self._counted: list[tuple] = []  # matched_at_least's parts of _pairs_inside, and their connection pairs
        self._counted_pairs = np.zeros(0, dtype=np.int64)
        self._matching: Matching | None = None
        conn_a, conn_d, seq_a, seq_d, cmd_a, cmd_d, sql_a, sql_d = self._keys()
        a = pd.DataFrame({"a_conn": conn_a, "seq": seq_a, "cmd": cmd_a, "sql": sql_a}, copy=False)
        d = pd.DataFrame({"d_conn": conn_d, "seq": seq_d, "cmd": cmd_d, "sql": sql_d}, copy=False)

        # --- connections: votes from shared request bytes, the scramble decides, a contradiction vetoes
        a_info = _conn_info(app, app_conns, "a", conn_a)
        d_info = _conn_info(db, db_conns, "d", conn_d)
        ends_a, ends_d = _endpoint_codes(a_info, d_info)
        key_a = a.assign(ends=ends_a[conn_a] if len(a) else np.zeros(0, dtype=np.int64))
        key_d = d.assign(ends=ends_d[conn_d] if len(d) else np.zeros(0, dtype=np.int64))
        del a, d
        voted = _bounded_join(key_a, key_d, VOTE_KEY, ["ends"])
        del key_a, key_d
        step = connection_step(voted, a_info, d_info, ends_a, ends_d)
        self.connections = step.connections
        self._pair_a, self._pair_d = step.pair_a, step.pair_d
        self._vetoed = step.vetoed
        self._ambiguous = step.ambiguous
        self._ambiguous_keys = step.ambiguous_keys
        self._work = step.work

    def _keys(self) -> tuple:
        """Per row of each table: its connection key, request sequence number, and codes of command and text (in one
        space for both tables)."""
        if self._columns is None:
            app, db = self._app, self._db
            self._columns = pairing_keys(app, db, connection_keys(app).to_numpy(), connection_keys(db).to_numpy())
        return self._columns

    def row_connections(self, app: pd.DataFrame, db: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """connection_keys of the rows of `app` and `db`: the ones made for the pairing when these are its tables
        (repair.plan asks; else both tables' rows would be factorized again)."""
        if app is self._app and db is self._db and app is not None:
            return self._keys()[:2]
        return connection_keys(app).to_numpy(), connection_keys(db).to_numpy()

    @property
    def matched(self) -> int:
        """Exchanges paired (MatchStats.matched), without the rest of the exchange pairing's answer."""
        if self._matching is not None:
            return self._matching.stats.matched
        return int(self._pairs_inside()[4].sum())

    def matched_at_least(self, count: float) -> bool:
        """matched >= count, counted connection pair by pair, the biggest first, until the answer is known (the
        sign of a proxy before the loss repair asks for half the exchanges: on a lossy pair the rest would be
        paired before the repair replaces them for nothing). What is counted is kept for _pairs_inside."""
        if self._matching is not None or self._inside is not None:
            return self.matched >= count
        conn_a, conn_d = self._keys()[:2]
        n = len(self._pair_a)
        at_a, at_d = _positions(self._pair_a, conn_a), _positions(self._pair_d, conn_d)
        # a connection pair pairs at most as many exchanges as the smaller of its two connections holds
        most = np.minimum(np.bincount(at_a[at_a >= 0], minlength=n), np.bincount(at_d[at_d >= 0], minlength=n))
        del at_a, at_d
        order = np.argsort(-most, kind="stable")
        counted, start = 0, len(self._counted_pairs)
        if start:  # asked before: go on from there
            counted = sum(int(part[4].sum()) for part in self._counted)
            order = np.concatenate([self._counted_pairs, np.setdiff1d(order, self._counted_pairs, assume_unique=True)])
        while counted < count:
            rest = most[order[start:]]
            if start == n or counted + int(rest.sum()) < count:
                return False
            stop = start + min(int(np.searchsorted(np.cumsum(rest), count - counted)) + 1, len(rest))
            part = self._inside_of(order[start:stop])
            self._counted.append(part)
            self._counted_pairs = order[:stop]
            counted += int(part[4].sum())
            start = stop
        return True

    def _pairs_inside(self) -> tuple:
        """The exchanges inside paired connections: the k-th exchange with a sequence number on one side with the
        k-th on the other (a number repeats inside one connection only after 4 GiB, or in a forged capture), when
        command, text and response end agree. (app rows, DB rows, app's response end, DB's, agree) per candidate,
        in app row order."""
        if self._inside is not None:
            return self._inside
        if not self._counted:
            *inside, work = self._inside_of(None)
        else:  # the connection pairs matched_at_least did not count, and the parts it did, in app row order
            rest = np.setdiff1d(np.arange(len(self._pair_a)), self._counted_pairs, assume_unique=True)
            parts = [*self._counted, self._inside_of(rest)]
            self._counted, self._counted_pairs = [], np.zeros(0, dtype=np.int64)
            order = np.argsort(np.concatenate([part[0] for part in parts]), kind="stable")
            inside = [np.concatenate([part[i] for part in parts])[order] for i in range(5)]
            work = sum(part[5] for part in parts)
            del parts, order
        self._inside_work = work  # (assigned: made again after release, counted once)
        self._inside = tuple(inside)
        return self._inside

    def _inside_of(self, which: np.ndarray | None) -> tuple:
        """_pairs_inside for the connection pairs at positions `which` (None: all), and the work (candidates)."""
        pair_a = self._pair_a if which is None else self._pair_a[which]
        pair_d = self._pair_d if which is None else self._pair_d[which]
        return pairs_inside(self._app, self._db, self._keys(), pair_a, pair_d)

    def release(self, tables: bool = True) -> None:
        """Let what was made of the tables' rows go, and the tables unless `tables` is false (then `complete()` makes
        it again); `connections` stays. The repair replaces the tables: what the exchange pairing made of them
        would only add to its peak."""
        self._columns = self._inside = None
        self._counted, self._counted_pairs = [], np.zeros(0, dtype=np.int64)
        if tables:
            self._app = self._db = None

    def complete(self) -> Matching:
        """The whole Matching: exchange rows paired inside the paired connections, and the notes of the others."""
        if self._matching is not None:
            return self._matching
        if self._app is None:
            raise RuntimeError("Pairing.complete after release")
        app, db = self._app, self._db
        conn_a, conn_d = self._keys()[:2]
        rows = exchange_rows(app, db, self._pairs_inside(), conn_a, conn_d, self._pair_a, self._pair_d,
                             self._ambiguous)
        amb_a, amb_d = self._ambiguous
        conn_pairs = self.connections
        stats = MatchStats(
            app_exchanges=len(app), db_exchanges=len(db), matched=rows.matched, app_only=rows.app_only,
            db_only=rows.db_only, conflicts=rows.conflicts,
            connections_matched=len(conn_pairs), connections_by_scramble=int(conn_pairs["by_scramble"].sum()),
            connections_nat=int(conn_pairs["nat"].sum()), connections_vetoed=self._vetoed,
            connections_ambiguous=len(amb_a) + len(amb_d), ambiguous_keys=self._ambiguous_keys,
            candidates=self._work + self._inside_work,
        )
        self._matching = Matching(rows.app_row, rows.db_row, rows.notes, conn_pairs, stats)
        self.release()
        return self._matching


def pairing_keys(app: pd.DataFrame, db: pd.DataFrame, conn_a: np.ndarray, conn_d: np.ndarray) -> tuple:
    """Per row of each table: its connection key (`conn_a`, `conn_d`, given), request sequence number, and codes of
    command and text (in one space for both tables): what pairs_inside reads."""
    cmd_a, cmd_d = _codes(app["command"], db["command"])
    sql_a, sql_d = _codes(app["sql"], db["sql"])
    return conn_a, conn_d, app["req_tcp_seq"].to_numpy(), db["req_tcp_seq"].to_numpy(), cmd_a, cmd_d, sql_a, sql_d


def pairs_inside(app: pd.DataFrame, db: pd.DataFrame, keys: tuple, pair_a: np.ndarray, pair_d: np.ndarray) -> tuple:
    """The exchanges of `app` and `db` inside the connection pairs (`pair_a`[i], `pair_d`[i]) (Pairing._pairs_inside's
    answer for them): (app rows, DB rows, app's response end, DB's, agree) per candidate, in app row order, and the
    work (candidates). `keys`: Pairing._keys of the two tables (connection keys, seq, command and text codes in one
    space). Only a connection's rows with the same sequence number meet, so a partition of the rows by the
    sequence number's piece (docs/partitioned.md §3) pairs them as the whole tables do."""
    conn_a, conn_d, seq_a, seq_d, cmd_a, cmd_d, sql_a, sql_d = keys
    at_a = _positions(pair_a, conn_a)
    rows_a = np.flatnonzero(at_a >= 0)
    rows_d = np.flatnonzero(_positions(pair_d, conn_d) >= 0)
    partner = pair_d[at_a[rows_a]]  # the DB connection each app row's connection is paired with
    del at_a
    found = _inside_once(partner, seq_a[rows_a], conn_d[rows_d], seq_d[rows_d])
    if found is None:  # a sequence number repeats inside a connection: (rows are in app / DB row order: the
        # k-th in row order)
        k_a = _occurrence(conn_a[rows_a], seq_a[rows_a])
        k_d = _occurrence(conn_d[rows_d], seq_d[rows_d])
        found = _inside_rows([partner, seq_a[rows_a], k_a], [conn_d[rows_d], seq_d[rows_d], k_d])
        del k_a, k_d
    in_a, in_d = found
    work = len(rows_a) + len(rows_d) + len(in_a)
    ai, di = rows_a[in_a], rows_d[in_d]
    del rows_a, rows_d, in_a, in_d, partner, found
    a_end = app["resp_tcp_end"].to_numpy(dtype="float64", na_value=np.nan)[ai]
    d_end = db["resp_tcp_end"].to_numpy(dtype="float64", na_value=np.nan)[di]
    both_done = app["result"].notna().to_numpy()[ai] & db["result"].notna().to_numpy()[di]
    # a response not fully seen at one point ends early there: its end says nothing
    ends_agree = np.isnan(a_end) | np.isnan(d_end) | ~both_done | (a_end == d_end)
    # a statement's text unknown at one point only (its PREPARE lost there, or sent before that capture began:
    # an EXECUTE whose text only the other point knows) is the same request all the same, on the same bytes of
    # the same connection; taken as a conflict, a lost PREPARE on every prepared connection left too few pairs
    # and the captures were taken for the two sides of an L7 proxy
    sa, sd = sql_a[ai], sql_d[di]
    content = (cmd_a[ai] == cmd_d[di]) & ((sa == sd) | (sa < 0) | (sd < 0))
    return ai, di, a_end, d_end, content & ends_agree, work


@dataclass
class ExchangeRows:
    """Pairing.complete's rows: the joined table's rows as (app row, DB row) (-1: not seen there; the matched in app
    row order, then the app's alone, then the DB's alone), each row's match notes ('' when none), and the counts."""

    app_row: np.ndarray
    db_row: np.ndarray
    notes: np.ndarray
    matched: int
    app_only: int
    db_only: int
    conflicts: int


def exchange_rows(app: pd.DataFrame, db: pd.DataFrame, inside: tuple, conn_a: np.ndarray, conn_d: np.ndarray,
                  pair_a: np.ndarray, pair_d: np.ndarray, ambiguous: tuple[set, set],
                  spans: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> ExchangeRows:
    """The rows of `app` and `db` laid out as the joined table's (Pairing.complete): the candidates `inside`
    (pairs_inside's answer) that agree are matched, the rest seen at one point only, with their notes. `conn_a`,
    `conn_d`: the rows' connection keys; `pair_a`, `pair_d`: the connection pairs; `ambiguous`: the connections
    left unpaired on a tie (app, DB). `spans`: per side, each connection's least and greatest paired ordinal
    (`paired_spans`) when these tables are a part of the whole (a partition): a row's 'lost-at-*' reads its
    connection's paired rows, which lie in every partition; None: from these tables' own pairs."""
    ai, di, a_end, d_end, ok = inside
    good_ai, good_di = ai[ok], di[ok]
    conflict_a = set(_rows_not_in(ai[~ok], good_ai, len(app)).tolist())
    conflict_d = set(_rows_not_in(di[~ok], good_di, len(db)).tolist())
    a_end_na, d_end_na = np.isnan(a_end[ok]), np.isnan(d_end[ok])
    a_done = app["result"].notna().to_numpy()[good_ai]
    d_done = db["result"].notna().to_numpy()[good_di]
    a_cut = ~a_done & d_done & ~a_end_na
    d_cut = ~d_done & a_done & ~d_end_na
    # the notes as codes first, then their texts (one object per row, as np.select on the texts made them)
    good_notes = np.array(["", "response-unseen-at-app", "response-unseen-at-db", "response-incomplete-at-app",
                           "response-incomplete-at-db"], dtype=object)[
        np.select([a_end_na & ~d_end_na, d_end_na & ~a_end_na, a_cut, d_cut], [1, 2, 3, 4], 0)]
    app_only = _rows_not_in(np.arange(len(app), dtype=np.int64), good_ai, len(app))
    db_only = _rows_not_in(np.arange(len(db), dtype=np.int64), good_di, len(db))
    app_row = np.concatenate([good_ai, app_only, np.full(len(db_only), -1, dtype=np.int64)])
    db_row = np.concatenate([good_di, np.full(len(app_only), -1, dtype=np.int64), db_only])
    amb_a, amb_d = ambiguous
    span_a, span_d = spans if spans is not None else (None, None)
    notes = np.concatenate([
        good_notes,
        _only_notes(app_only, conflict_a, conn_a, good_ai, app["seq"].to_numpy(), pair_a, "db", amb_a, span_a),
        _only_notes(db_only, conflict_d, conn_d, good_di, db["seq"].to_numpy(), pair_d, "app", amb_d, span_d),
    ])
    return ExchangeRows(app_row, db_row, notes, len(good_ai), len(app_only), len(db_only),
                        len(conflict_a) + len(conflict_d))


def paired_spans(conn: np.ndarray, ordinal: np.ndarray, rows: np.ndarray) -> pd.DataFrame:
    """Each connection's least and greatest ordinal (the `seq` column) among the paired rows `rows` (columns min,
    max; indexed by connection key): what a row seen at one point only reads for 'lost-at-*'. Pieces of it
    combine by the least of the mins and the greatest of the maxes (`combined_spans`)."""
    return pd.DataFrame({"conn": conn[rows], "ord": ordinal[rows]}).groupby("conn")["ord"].agg(["min", "max"])


def combined_spans(pieces: list[pd.DataFrame]) -> pd.DataFrame:
    """paired_spans of the union of the rows of `pieces` (paired_spans each)."""
    if not pieces:
        return paired_spans(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    joined = pd.concat(pieces)
    return joined.groupby(level=0).agg({"min": "min", "max": "max"})


@dataclass
class ConnectionStep:
    """Pairing's connection step: the connection pairs (`connections`: app_conn, db_conn, nat, by_scramble; their
    keys as `pair_a`, `pair_d`), the candidate pairs vetoed, the connections left unpaired because two partners
    tied (app, DB), the keys too widely shared to vote alone, and the candidate rows the joins produced."""

    connections: pd.DataFrame
    pair_a: np.ndarray
    pair_d: np.ndarray
    vetoed: int
    ambiguous: tuple[set, set]
    ambiguous_keys: int
    work: int
    # the partitioned run's (spilled_connection_step): per app point and per DB point, the paired connections'
    # count (points_seen_alone reads it: a point none of whose connections paired)
    paired_by_point: tuple[dict[str, int], dict[str, int]] | None = None


def connection_step(voted: tuple, a_info: pd.DataFrame, d_info: pd.DataFrame, ends_a: np.ndarray,
                    ends_d: np.ndarray) -> ConnectionStep:
    """The connection pairs from the request votes (`voted`: _bounded_join's answer on VOTE_KEY, refined by the
    endpoints), each point's connections (`_conn_info`) and their endpoint codes (`_endpoint_codes`): the
    scramble join, the vetoes, the one-to-one choice."""
    votes, ambiguous_requests, work, amb_a, amb_d = voted
    scr_a = a_info.dropna(subset=["a_scramble"])
    scr_d = d_info.dropna(subset=["d_scramble"])
    codes_a, codes_d = _codes(scr_a["a_scramble"], scr_d["d_scramble"])
    scr_a = scr_a.assign(scramble=codes_a, ends=ends_a[scr_a["a_conn"].to_numpy()])
    scr_d = scr_d.assign(scramble=codes_d, ends=ends_d[scr_d["d_conn"].to_numpy()])
    by_scramble, ambiguous_scrambles, work_s, amb_sa, amb_sd = _bounded_join(scr_a, scr_d, ["scramble"], ["ends"])
    work += work_s
    amb_a |= amb_sa
    amb_d |= amb_sd
    pairs = votes.merge(by_scramble[["a_conn", "d_conn"]].assign(scr=True), on=["a_conn", "d_conn"], how="outer")
    pairs["votes"] = pairs["votes"].fillna(0).astype(np.int64)
    pairs["scr"] = pairs["scr"].fillna(False).astype(bool)
    pairs = pairs.merge(a_info, on="a_conn", how="left").merge(d_info, on="d_conn", how="left")
    veto = (
        (pairs["a_scramble"].notna() & pairs["d_scramble"].notna() & (pairs["a_scramble"] != pairs["d_scramble"]))
        | (pairs["a_conn_id"].notna() & pairs["d_conn_id"].notna() & (pairs["a_conn_id"] != pairs["d_conn_id"]))
    ).fillna(False).astype(bool)
    vetoed = int(veto.sum())
    pairs = pairs[~veto].copy()
    pairs["score"] = pairs["votes"] + SCRAMBLE_VOTE * pairs["scr"]
    pairs, tied_a, tied_d = _one_to_one(pairs)
    amb_a |= tied_a
    amb_d |= tied_d
    pairs["nat"] = (pairs["a_client"] != pairs["d_client"]).fillna(False).astype(bool)
    connections = pairs[["a_conn", "d_conn", "nat", "scr"]].rename(
        columns={"a_conn": "app_conn", "d_conn": "db_conn", "scr": "by_scramble"}).reset_index(drop=True)
    return ConnectionStep(connections, pairs["a_conn"].to_numpy(np.int64), pairs["d_conn"].to_numpy(np.int64), vetoed,
                          (amb_a - set(pairs["a_conn"]), amb_d - set(pairs["d_conn"])),
                          ambiguous_requests + ambiguous_scrambles, work)


def _positions(pairs: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """pd.Index(pairs).get_indexer(keys) for distinct connection keys `pairs`: the position of each key in `pairs`,
    -1 where absent. Connection keys number connections from 0 (connection_keys), so this is one lookup array."""
    if not len(pairs) or not len(keys):
        return np.full(len(keys), -1, dtype=np.int64)
    if min(pairs.min(), keys.min()) < 0 or max(pairs.max(), keys.max()) > 4 * (len(pairs) + len(keys)):
        return pd.Index(pairs).get_indexer(keys)
    at = np.full(int(max(pairs.max(), keys.max())) + 1, -1, dtype=np.int64)
    at[pairs] = np.arange(len(pairs), dtype=np.int64)
    return at[keys]


def _inside_once(conn_a: np.ndarray, seq_a: np.ndarray, conn_d: np.ndarray, seq_d: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """_inside_rows on the keys (DB connection, seq, k) when no sequence number repeats inside a connection at
    either point (the usual case: then k is 0 on every row): the (connection, seq) pairs of both points sorted
    (_key_then_group_order: the sequence numbers of a connection already grow with its rows), one search of the
    app's among the DB's (both sorted: the search walks memory in order), the matches put back in app row order.
    None when one repeats (or a number is out of range): _inside_rows decides."""
    if not len(conn_a) or not len(conn_d):
        return None
    top = int(max(conn_a.max(), conn_d.max()))
    if min(conn_a.min(), conn_d.min(), seq_a.min(), seq_d.min()) < 0 or top >= 1 << 31 \
            or max(seq_a.max(), seq_d.max()) >= 1 << 32:
        return None
    sorted_keys = []
    for conn, seq in ((conn_a, seq_a), (conn_d, seq_d)):
        key = (conn.astype(np.int64) << 32) | seq.astype(np.int64)
        order = _key_then_group_order(key, conn, top + 1)
        key = key[order]
        if (key[1:] == key[:-1]).any():
            return None
        sorted_keys.append((key, order))
    (key_a, order_a), (key_d, order_d) = sorted_keys
    del sorted_keys
    found_a, found_d = _join_values(order_a, key_a, order_d, key_d)  # the app's and DB's rows of each key at both
    partner_row = np.full(len(key_a), -1, dtype=np.int64)
    partner_row[found_a] = found_d
    rows = np.flatnonzero(partner_row >= 0)
    return rows, partner_row[rows]


def _inside_rows(a_keys: list[np.ndarray], d_keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The inner join of two sets of rows on their keys (d_conn, seq, k), as row positions (app, DB) in app row
    order, as a merge gives them. The key is unique on each side (k numbers a sequence number's repeats inside a
    connection, and connections pair one to one), so this is a lookup of each app row's key among the sorted DB
    keys; a merge decides when it is not."""
    keys = _radix_arrays([a_keys, d_keys]) if len(a_keys[0]) and len(d_keys[0]) else None
    if keys is not None:
        key_a, key_d = keys
        order = np.argsort(key_d, kind="stable")
        sorted_d = key_d[order]
        if not (sorted_d[1:] == sorted_d[:-1]).any():
            at = np.minimum(np.searchsorted(sorted_d, key_a), len(sorted_d) - 1)
            hit = sorted_d[at] == key_a
            return np.flatnonzero(hit), order[at[hit]]
    on = ["d_conn", "seq", "k"]
    a = pd.DataFrame(dict(zip(on, a_keys)) | {"row_a": np.arange(len(a_keys[0]), dtype=np.int64)})
    d = pd.DataFrame(dict(zip(on, d_keys)) | {"row_d": np.arange(len(d_keys[0]), dtype=np.int64)})
    joined = a.merge(d, on=on, how="inner")
    return joined["row_a"].to_numpy(np.int64), joined["row_d"].to_numpy(np.int64)


def first_rows(keys: np.ndarray) -> np.ndarray:
    """np.unique(keys, return_index=True)[1] for keys numbered 0, 1, 2 … in order of first appearance (as
    connection_keys numbers them): the rows where a key exceeds every one before it, found without a sort."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    before = np.empty(len(keys), dtype=np.int64)
    before[0] = -1
    np.maximum.accumulate(keys[:-1], out=before[1:])
    first = np.flatnonzero(keys > before)
    if len(first) != int(keys.max()) + 1 or keys.min() < 0:  # not numbered so: sort
        return np.unique(keys, return_index=True)[1]
    return first


def _occurrence(*keys: np.ndarray) -> np.ndarray:
    """For each row, how many earlier rows have the same keys (groupby(keys).cumcount(), by a stable sort)."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort(keys[::-1])  # stable: rows with equal keys keep their order
    start = np.ones(n, dtype=bool)
    for key in keys:
        ordered = key[order]
        start[1:] &= ordered[1:] == ordered[:-1]
    start[1:] = ~start[1:]  # a row whose keys differ from the row before it begins a group
    position = np.arange(n, dtype=np.int64)
    rank = position - np.maximum.accumulate(np.where(start, position, 0))
    out = np.empty(n, dtype=np.int64)
    out[order] = rank
    return out


def _rows_not_in(rows: np.ndarray, taken: np.ndarray, n: int) -> np.ndarray:
    """The distinct values of `rows` (row positions below n) that are not in `taken`, sorted (np.setdiff1d by a
    mask: linear, where setdiff1d sorts or hashes both)."""
    seen = np.zeros(n, dtype=bool)
    seen[rows] = True
    seen[taken] = False
    return np.flatnonzero(seen).astype(np.int64)


def _endpoint_codes(a_info: pd.DataFrame, d_info: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per connection key, a code of its (client, server) endpoints in one space for both points (negative:
    unknown)."""
    def text(info: pd.DataFrame, side: str) -> pd.Series:
        return (info[f"{side}_client"].astype("string") + " " + info[f"{side}_server"].astype("string")).astype(object)

    codes_a, codes_d = _codes(text(a_info, "a"), text(d_info, "d"))
    out_a = np.full(int(a_info["a_conn"].max()) + 1 if len(a_info) else 0, -1, dtype=np.int64)
    out_d = np.full(int(d_info["d_conn"].max()) + 1 if len(d_info) else 0, -1, dtype=np.int64)
    out_a[a_info["a_conn"].to_numpy()] = codes_a
    out_d[d_info["d_conn"].to_numpy()] = np.where(codes_d < 0, -2, codes_d)  # unknown never equals unknown
    return out_a, out_d


def _one_to_one(pairs: pd.DataFrame) -> tuple[pd.DataFrame, set, set]:
    """Greedy one-to-one, best score first (a connection is at one place at each point). A connection whose best
    two candidates score the same is left unpaired (which one is its twin cannot be told): returned, app and DB."""
    pairs = pairs.sort_values(["score", "a_conn", "d_conn"], ascending=[False, True, True], kind="stable")
    drop = np.zeros(len(pairs), dtype=bool)
    tied = []
    for conn in ("a_conn", "d_conn"):
        rank = _occurrence(pairs[conn].to_numpy())  # 0: the connection's best candidate (its groupby cumcount)
        score = pairs["score"].to_numpy()
        best = pd.Series(score[rank == 0], index=pairs[conn].to_numpy()[rank == 0])
        second = pd.Series(score[rank == 1], index=pairs[conn].to_numpy()[rank == 1])
        ties = second.index[second.to_numpy() == best.loc[second.index].to_numpy()]
        tied.append(set(ties))
        drop |= pairs[conn].isin(ties).to_numpy()
    pairs = pairs[~drop]
    return pairs.drop_duplicates("a_conn").drop_duplicates("d_conn"), *tied


def _only_notes(only: np.ndarray, conflicts: set, conn: np.ndarray, paired: np.ndarray, ordinal: np.ndarray,
                paired_conns: np.ndarray, other: str, ambiguous: set, spans: pd.DataFrame | None = None
                ) -> np.ndarray:
    """Notes for exchanges seen at one point only: 'match-conflict', 'match-ambiguous' (the connection's twin at the
    other point could not be told from others that look the same), or 'lost-at-<other>' when the other point
    saw exchanges of the same connection before and after this one (so it was there, and missed these bytes).
    `spans`: paired_spans of every paired row of the side (None: of `paired`)."""
    notes = np.full(len(only), "", dtype=object)
    if len(only) == 0:
        return notes
    if ambiguous:
        notes[np.isin(conn[only], np.fromiter(ambiguous, dtype=np.int64, count=len(ambiguous)))] = "match-ambiguous"
    seen = paired_spans(conn, ordinal, paired) if spans is None else spans
    span = pd.DataFrame({"conn": conn[only], "ord": ordinal[only]}).join(seen, on="conn")
    inside = (span["conn"].isin(paired_conns) & (span["ord"] > span["min"]) & (span["ord"] < span["max"])).to_numpy()
    notes[inside] = f"lost-at-{other}"
    if conflicts:
        notes[np.isin(only, np.fromiter(conflicts, dtype=np.int64, count=len(conflicts)))] = "match-conflict"
    return notes


def _conn_info(exchanges: pd.DataFrame, conns: pd.DataFrame, side: str, conn: np.ndarray | None = None) -> pd.DataFrame:
    """conn key -> scramble, conn_id, client, server of each connection that has exchanges (`conn`: the rows'
    connection_keys, when known)."""
    conn = connection_keys(exchanges).to_numpy() if conn is None else conn
    first = first_rows(conn)  # each key's first row: keys number connections as they appear
    keys = pd.DataFrame({
        f"{side}_conn": conn[first],
        "capture": exchanges["capture"].iloc[first].to_numpy(), "conn_index": exchanges["conn_index"].to_numpy()[first],
    })
    return _info_of_keys(keys, conns, side)


def _info_of_keys(keys: pd.DataFrame, conns: pd.DataFrame, side: str) -> pd.DataFrame:
    """_conn_info of the connections `keys` names (`{side}_conn`, capture, conn_index; in key order)."""
    columns = ["scramble", "conn_id", "client", "server"]
    dtypes = {"scramble": "string", "conn_id": "Int64", "client": "string", "server": "string"}
    table = conns[["capture", "conn_index", *columns]]
    rows = _rows_of_keys(keys, table)
    if rows is None:  # a connection listed twice: the merge's rows
        info = keys.merge(table, on=["capture", "conn_index"], how="left").astype(dtypes)
        return info.drop(columns=["capture", "conn_index"]).rename(columns={c: f"{side}_{c}" for c in columns})
    # the left merge's result, made by looking each connection up: its row of `conns`, else null
    return pd.DataFrame({f"{side}_conn": keys[f"{side}_conn"].to_numpy(),
                         **{f"{side}_{c}": pd.Series(table[c].array.take(rows, allow_fill=True)).astype(dtypes[c])
                            for c in columns}})


def _rows_of_keys(keys: pd.DataFrame, conns: pd.DataFrame) -> np.ndarray | None:
    """Per row of `keys`, the row of `conns` with its (capture, conn_index), −1 where none; None when a (capture,
    conn_index) is in `conns` more than once."""
    where = {}
    for i, key in enumerate(zip(conns["capture"].astype(object).tolist(), conns["conn_index"].tolist())):
        if where.setdefault(key, i) != i:
            return None
    wanted = zip(keys["capture"].astype(object).tolist(), keys["conn_index"].tolist())
    return np.fromiter((where.get(key, -1) for key in wanted), dtype=np.int64, count=len(keys))


# --- clock samples -------------------------------------------------------------------------------------------




# --- the row key: exchanges.parquet's row order, known inside a partition (docs/partitioned.md §2.3) -------------

ROW_KEY_FIELDS = ("class", "repair_job", "point", "reread_row", "req_first_ts", "conn_index", "seq")
MATCHED, APP_ONLY, DB_ONLY = 0, 1, 2  # the row key's classes, in the order Pairing.complete lays the rows out
KEPT = -1  # the row key's repair job and reread_row of a row the repair did not re-read


def row_key(row_class, repair_job, point, reread_row, req_first_ts, conn_index, seq) -> np.ndarray:
    """The row key of each row (n × 7 int64, ROW_KEY_FIELDS, compared column by column): exchanges.parquet's rows
    are in the order of their keys. Pairing.complete lays out the matched rows in app-table order, then the rows
    only the app saw in app-table order, then the rows only the DB saw in DB-table order. A side's table is its
    points in order, each sorted by (req_first_ts, conn_index, seq) (null first); after a repair, the kept rows so,
    then each re-read capture's rows appended in the re-read's own order. So a row's key is its class (MATCHED,
    APP_ONLY, DB_ONLY), the re-read that made it (KEPT, or its number among its side's re-reads), its point's index
    among its side's points, its row in that re-read (KEPT for a kept row: a re-read sorted its rows by times it
    then nulled where they fell on borrowed bytes, and by its own connection numbers), and its (req_first_ts as
    int64 ns, NaT the least, conn_index, seq); all of the side that orders it (the app's where the app saw it).
    A partition knows these of its own rows once it knows which paired. Scalars broadcast."""
    columns = np.broadcast_arrays(*(np.asarray(c) for c in (row_class, repair_job, point, reread_row, req_first_ts,
                                                              conn_index, seq)))
    n = len(columns[-1]) if columns[-1].ndim else 1
    out = np.empty((n, len(ROW_KEY_FIELDS)), dtype=np.int64)
    for i, c in enumerate(columns):
        out[:, i] = c.view(np.int64) if c.dtype.kind == "M" else c.astype(np.int64, copy=False)
    return out


def matching_row_keys(matching: Matching, app_ex: pd.DataFrame, db_ex: pd.DataFrame, app_points: list[str],
                      db_points: list[str], reread_starts: dict | None = None) -> np.ndarray:
    """row_key of each row of `matching` (the joined table's rows, in their order) from the tables it pairs: the
    app row where the app saw the exchange, else the DB row. `app_points`, `db_points`: each side's capture names in
    the order its table holds them; `reread_starts`: repair.Repair.reread_starts (None: nothing re-read)."""
    has_app = matching.app_row >= 0
    row_class = np.where(has_app, np.where(matching.db_row >= 0, MATCHED, APP_ONLY), DB_ONLY)
    out = np.empty((len(row_class), len(ROW_KEY_FIELDS)), dtype=np.int64)
    for side, table, rows, points in (("app", app_ex, matching.app_row, app_points),
                                      ("db", db_ex, matching.db_row, db_points)):
        mine = has_app if side == "app" else ~has_app
        at = rows[mine]
        point = pd.Index(list(points)).get_indexer(table["capture"].astype(object).to_numpy()[at])
        if (point < 0).any():
            raise ValueError(f"a {side} row of a capture not among {list(points)}")
        starts = np.asarray((reread_starts or {}).get(side, []), dtype=np.int64)
        job = np.searchsorted(starts, at, side="right") - 1  # KEPT (-1) before the first re-read's rows
        reread_row = np.where(job >= 0, at - starts[np.maximum(job, 0)] if len(starts) else 0, KEPT)
        ts = table["req_first_ts"].to_numpy(dtype="datetime64[ns]")[at]
        out[mine] = row_key(row_class[mine], job, point, reread_row, ts, table["conn_index"].to_numpy()[at],
                            table["seq"].to_numpy()[at])
    return out
# --- the connection step from the extraction's buckets ---------------------------------------------------------


def spilled_connection_step(app: list[Extraction], db: list[Extraction]) -> ConnectionStep:
    """Pairing's connection step (what `Pairing(app, db, app_conns, db_conns)` makes of the points' concatenated
    tables: `connections` and its counts) from the points' spilled buckets (`Extraction.spill`, read/spill.py) and
    their connections tables, a bucket at a time: the first pass of the partitioned analysis (docs/partitioned.md
    §2.1, §5 step 4). Every extraction must have spilled. A vote's key (seq, command, text) lies in one bucket
    (the bucket is a function of seq), so _bounded_join's FANOUT test is a bucket's own: the votes, the keys too
    widely shared and the work add up over the buckets. Connections are keyed as connection_keys keys the
    concatenated tables: by first appearance in row order (a pass over the buckets finds each connection's first
    request)."""
    from ..core.tables import concat
    from ..read.spill import BUCKETS

    texts = _TextCodes()
    app_keys, db_keys = SpilledKeys(app), SpilledKeys(db)
    a_info = _info_of_keys(app_keys.frame("a_conn"), concat([x.connections for x in app]), "a")
    d_info = _info_of_keys(db_keys.frame("d_conn"), concat([x.connections for x in db]), "d")
    ends_a, ends_d = _endpoint_codes(a_info, d_info)
    votes, ambiguous, work, amb_a, amb_d = [], 0, 0, set(), set()
    lone, seen_a, seen_d = 0, False, False  # the distinct pairs of buckets only one side has rows in
    for bucket in range(BUCKETS):
        a = app_keys.votes_of(bucket, texts)
        d = db_keys.votes_of(bucket, texts)
        seen_a, seen_d = seen_a or a is not None, seen_d or d is not None
        if a is not None and d is not None:
            counted, n_ambiguous, n_work, held_a, held_d = _bounded_join(
                pd.DataFrame({"a_conn": a[0], **dict(zip(VOTE_KEY, a[1:])), "ends": ends_a[a[0]]}, copy=False),
                pd.DataFrame({"d_conn": d[0], **dict(zip(VOTE_KEY, d[1:])), "ends": ends_d[d[0]]}, copy=False),
                VOTE_KEY, ["ends"])
            votes.append(counted)
            ambiguous += n_ambiguous
            work += n_work
            amb_a |= held_a
            amb_d |= held_d
        elif a is not None or d is not None:
            # the whole tables' join counts this side's distinct (key, connection) pairs, which meet none here
            lone += len(np.unique(np.stack(a if d is None else d), axis=1).T)
    if seen_a and seen_d:  # a side without a row is not joined at all (_bounded_join_frames: no work)
        work += lone
    pair = np.concatenate([(v["a_conn"].to_numpy(np.int64) << 32) | v["d_conn"].to_numpy(np.int64) for v in votes]) \
        if votes else np.zeros(0, dtype=np.int64)
    weights = np.concatenate([v["votes"].to_numpy(np.int64) for v in votes]) if votes else np.zeros(0, np.int64)
    distinct, inverse = np.unique(pair, return_inverse=True)
    summed = np.bincount(inverse.reshape(-1), weights=weights, minlength=len(distinct)).astype(np.int64)
    counted = pd.DataFrame({"a_conn": distinct >> 32, "d_conn": distinct & 0xFFFFFFFF, "votes": summed})
    step = connection_step((counted, ambiguous, work, amb_a, amb_d), a_info, d_info, ends_a, ends_d)
    step.paired_by_point = tuple(_paired_by_point(side.capture_of_keys(), paired.to_numpy(np.int64))
                                 for side, paired in ((app_keys, step.connections["app_conn"]),
                                                      (db_keys, step.connections["db_conn"])))
    return step


def _paired_by_point(capture_of_key: np.ndarray, paired_keys: np.ndarray) -> dict[str, int]:
    """Per capture point that has a connection (`capture_of_key`: each connection key's point), how many of its
    connections paired (`paired_keys`: their keys)."""
    counts = {str(name): 0 for name in pd.unique(capture_of_key)}
    names, n = np.unique(capture_of_key[paired_keys].astype(str), return_counts=True) if len(paired_keys) \
        else ([], [])
    counts.update({str(name): int(c) for name, c in zip(names, n)})
    return counts


class _TextCodes:
    """Codes of a dictionary column's texts in one space for both points (equal texts, equal codes; null −1), as
    Pairing's `_codes` makes them equal or not: a text's code is the order it was first met in."""

    def __init__(self):
        self.codes: dict[str, dict[str, int]] = {}

    def of(self, name: str, array) -> np.ndarray:
        import pyarrow as pa

        codes = self.codes.setdefault(name, {})
        if not isinstance(array, pa.DictionaryArray):
            array = array.dictionary_encode()
        lookup = np.array([codes.setdefault(t, len(codes)) for t in array.dictionary.to_pylist()] + [-1],
                          dtype=np.int64)
        indices = array.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        return lookup[indices]  # -1 picks the last: null


class SpilledKeys:
    """One side's points (extractions that spilled) as Pairing keys them: each connection's key (connection_keys:
    by (capture, conn_index), numbered by first appearance in the concatenated tables' row order), found from
    each connection's first request time; and each bucket's rows as vote keys."""

    def __init__(self, points: list[Extraction]):
        from ..read.spill import BUCKETS, int64_values

        self.points = points
        names: dict[str, int] = {}
        self.capture = [names.setdefault(x.capture, len(names)) for x in points]
        self.names = list(names)
        firsts: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in points]
        for bucket in range(BUCKETS):
            for i, x in enumerate(points):
                for batch in x.spill.bucket(bucket):
                    conn = int64_values(batch.column("conn_index"))
                    ts = int64_values(batch.column("req_first_ts"), null=np.iinfo(np.int64).min)
                    if len(conn) and conn.max() >= len(firsts[i]):
                        grown = np.full(int(conn.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
                        grown[:len(firsts[i])] = firsts[i]
                        firsts[i] = grown
                    np.minimum.at(firsts[i], conn, ts)
        self.width = max((len(f) for f in firsts), default=0) or 1
        self.key = np.full(len(names) * self.width, -1, dtype=np.int64)  # capture code × width + conn_index → key
        numbered: list[int] = []
        for i, first in enumerate(firsts):
            present = np.flatnonzero(first < np.iinfo(np.int64).max)
            # in row order: a point's rows are sorted by (req_first_ts, conn_index, seq)
            for conn in present[np.lexsort((present, first[present]))]:
                at = self.capture[i] * self.width + int(conn)
                if self.key[at] < 0:
                    self.key[at] = len(numbered)
                    numbered.append(at)
        self.numbered = np.array(numbered, dtype=np.int64)

    def frame(self, name: str) -> pd.DataFrame:
        """The connections' keys, in key order, with their capture and conn_index (what _conn_info reads)."""
        return pd.DataFrame({name: np.arange(len(self.numbered), dtype=np.int64), "capture": self.capture_of_keys(),
                             "conn_index": self.numbered % self.width})

    def capture_of_keys(self) -> np.ndarray:
        """Each connection key's capture point (its name), in key order."""
        return np.array([self.names[c] for c in self.numbered // self.width], dtype=object)

    def of_rows(self, table: pd.DataFrame) -> np.ndarray:
        """The connection key of each row of `table` (rows of these points: capture and conn_index)."""
        if not len(table):
            return np.zeros(0, dtype=np.int64)
        capture = pd.Index(self.names).get_indexer(table["capture"].astype(object).to_numpy())
        return self.key[capture * self.width + table["conn_index"].to_numpy(dtype=np.int64)]

    def votes_of(self, bucket: int, texts: _TextCodes) -> list[np.ndarray] | None:
        """The bucket's rows of every point as Pairing's vote keys: connection key, seq, command and text codes
        (None when no point has a row there)."""
        from ..read.spill import int64_values

        parts = []
        for i, x in enumerate(self.points):
            for batch in x.spill.bucket(bucket):
                conn = self.key[self.capture[i] * self.width + int64_values(batch.column("conn_index"))]
                parts.append((conn, int64_values(batch.column("req_tcp_seq")),
                              texts.of("command", batch.column("command")), texts.of("sql", batch.column("sql"))))
        return [np.concatenate(c) for c in zip(*parts)] if parts else None


