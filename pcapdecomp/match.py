"""Match stage: pair each exchange seen at an app host with the same exchange seen at the DB host, and collect
the TCP segments seen at both points as clock samples.

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

import os
from array import array
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .capture import open_capture
from .tables import release_memory

SCRAMBLE_VOTE = 1_000_000  # a shared greeting scramble outweighs any number of shared sequence numbers


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


def connection_keys(exchanges: pd.DataFrame) -> pd.Series:
    """One integer per (capture, conn_index): several app captures share conn_index values."""
    if len(exchanges) == 0:
        return pd.Series([], dtype="int64")
    return exchanges.groupby(["capture", "conn_index"], sort=False).ngroup().astype("int64")


def _same(a: pd.Series, b: pd.Series) -> pd.Series:
    """Equality where two nulls are equal too (a missing SQL text on both sides agrees)."""
    if isinstance(a.dtype, pd.CategoricalDtype) and isinstance(b.dtype, pd.CategoricalDtype):
        # text columns of two tables: compare codes in one category space (null is code -1 on both sides)
        space = a.cat.categories.union(b.cat.categories)
        return pd.Series(a.cat.set_categories(space).cat.codes.to_numpy()
                         == b.cat.set_categories(space).cat.codes.to_numpy(), index=a.index)
    eq = (a == b).fillna(False).astype(bool)
    return eq | (a.isna() & b.isna()).to_numpy()


def match_exchanges(app: pd.DataFrame, db: pd.DataFrame, app_conns: pd.DataFrame, db_conns: pd.DataFrame) -> Matching:
    """Pair rows of the app exchanges table (all app captures concatenated) with rows of the DB one.

    app_conns/db_conns are the connections tables (capture, conn_index, conn_id, scramble, ...).
    """
    a = pd.DataFrame({
        "ai": np.arange(len(app), dtype=np.int64), "a_conn": connection_keys(app).to_numpy(),
        "seq": app["req_tcp_seq"].to_numpy(), "a_cmd": app["command"].array,
        "a_sql": app["sql"].array, "a_end": app["resp_tcp_end"].array,
    })
    d = pd.DataFrame({
        "di": np.arange(len(db), dtype=np.int64), "d_conn": connection_keys(db).to_numpy(),
        "seq": db["req_tcp_seq"].to_numpy(), "d_cmd": db["command"].array,
        "d_sql": db["sql"].array, "d_end": db["resp_tcp_end"].array,
    })
    cand = a.merge(d, on="seq", how="inner")
    cand["content"] = _same(cand["a_cmd"], cand["d_cmd"]) & _same(cand["a_sql"], cand["d_sql"])
    cand = cand.drop(columns=["a_cmd", "d_cmd", "a_sql", "d_sql"])  # compared: not carried through the joins below

    # --- connections: votes from shared request bytes, the scramble decides, a contradiction vetoes
    a_info = _conn_info(app, app_conns, "a")
    d_info = _conn_info(db, db_conns, "d")
    votes = cand[cand["content"]].groupby(["a_conn", "d_conn"]).size().rename("votes").reset_index()
    by_scramble = a_info.dropna(subset=["a_scramble"]).merge(
        d_info.dropna(subset=["d_scramble"]), left_on="a_scramble", right_on="d_scramble")[["a_conn", "d_conn"]]
    pairs = votes.merge(by_scramble.assign(scr=True), on=["a_conn", "d_conn"], how="outer")
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
    # Greedy one-to-one, best score first (a connection is at one place at each point).
    pairs = pairs.sort_values(["score", "a_conn"], ascending=[False, True], kind="stable")
    pairs = pairs.drop_duplicates("a_conn").drop_duplicates("d_conn")
    pairs["nat"] = (pairs["a_client"] != pairs["d_client"]).fillna(False).astype(bool)
    conn_pairs = pairs[["a_conn", "d_conn", "nat", "scr"]].rename(
        columns={"a_conn": "app_conn", "d_conn": "db_conn", "scr": "by_scramble"}).reset_index(drop=True)

    # --- exchanges, inside paired connections only
    inside = cand.merge(pairs[["a_conn", "d_conn"]], on=["a_conn", "d_conn"], how="inner")
    ends_agree = ~(inside["a_end"].notna() & inside["d_end"].notna()).to_numpy() | (
        inside["a_end"].to_numpy(dtype="float64", na_value=np.nan) == inside["d_end"].to_numpy(dtype="float64", na_value=np.nan))
    ok = inside["content"].to_numpy() & ends_agree
    good = inside[ok].drop_duplicates("ai").drop_duplicates("di")
    bad = inside[~ok]
    conflict_a = set(bad["ai"]) - set(good["ai"])
    conflict_d = set(bad["di"]) - set(good["di"])

    a_end_na = good["a_end"].isna().to_numpy()
    d_end_na = good["d_end"].isna().to_numpy()
    good_notes = np.where(a_end_na & ~d_end_na, "response-unseen-at-app",
                          np.where(d_end_na & ~a_end_na, "response-unseen-at-db", ""))
    app_only = np.setdiff1d(np.arange(len(app), dtype=np.int64), good["ai"].to_numpy())
    db_only = np.setdiff1d(np.arange(len(db), dtype=np.int64), good["di"].to_numpy())
    app_row = np.concatenate([good["ai"].to_numpy(), app_only, np.full(len(db_only), -1, dtype=np.int64)])
    db_row = np.concatenate([good["di"].to_numpy(), np.full(len(app_only), -1, dtype=np.int64), db_only])
    notes = np.concatenate([
        good_notes,
        _only_notes(app_only, conflict_a, a, good["ai"].to_numpy(), app["seq"].to_numpy(), pairs["a_conn"], "db"),
        _only_notes(db_only, conflict_d, d.rename(columns={"d_conn": "a_conn"}), good["di"].to_numpy(),
                    db["seq"].to_numpy(), pairs["d_conn"], "app"),
    ])
    stats = MatchStats(
        app_exchanges=len(app), db_exchanges=len(db), matched=len(good), app_only=len(app_only),
        db_only=len(db_only), conflicts=len(conflict_a) + len(conflict_d),
        connections_matched=len(conn_pairs), connections_by_scramble=int(conn_pairs["by_scramble"].sum()),
        connections_nat=int(conn_pairs["nat"].sum()), connections_vetoed=vetoed,
    )
    return Matching(app_row, db_row, notes, conn_pairs, stats)


def _only_notes(only: np.ndarray, conflicts: set, side: pd.DataFrame, paired: np.ndarray, ordinal: np.ndarray,
                paired_conns: pd.Series, other: str) -> np.ndarray:
    """Notes for exchanges seen at one point only: 'match-conflict', or 'lost-at-<other>' when the other point
    saw exchanges of the same connection before and after this one (so it was there, and missed these bytes)."""
    notes = np.full(len(only), "", dtype=object)
    if len(only) == 0:
        return notes
    conn = side["a_conn"].to_numpy()
    seen = pd.DataFrame({"conn": conn[paired], "ord": ordinal[paired]}).groupby("conn")["ord"].agg(["min", "max"])
    span = pd.DataFrame({"conn": conn[only], "ord": ordinal[only]}).join(seen, on="conn")
    inside = (span["conn"].isin(paired_conns) & (span["ord"] > span["min"]) & (span["ord"] < span["max"])).to_numpy()
    notes[inside] = f"lost-at-{other}"
    if conflicts:
        notes[np.isin(only, np.fromiter(conflicts, dtype=np.int64, count=len(conflicts)))] = "match-conflict"
    return notes


def _conn_info(exchanges: pd.DataFrame, conns: pd.DataFrame, side: str) -> pd.DataFrame:
    """conn key -> scramble, conn_id, client of each connection that has exchanges."""
    keys = pd.DataFrame({
        f"{side}_conn": connection_keys(exchanges).to_numpy(),
        "capture": exchanges["capture"].to_numpy(), "conn_index": exchanges["conn_index"].to_numpy(),
    }).drop_duplicates(f"{side}_conn")
    info = keys.merge(conns[["capture", "conn_index", "scramble", "conn_id", "client"]], on=["capture", "conn_index"], how="left")
    info = info.astype({"scramble": "string", "conn_id": "Int64", "client": "string"})
    return info.drop(columns=["capture", "conn_index"]).rename(
        columns={"scramble": f"{side}_scramble", "conn_id": f"{side}_conn_id", "client": f"{side}_client"})


# --- clock samples -------------------------------------------------------------------------------------------


def split_endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class _Segments:
    """Segments of chosen connections at one capture point: the keys seen exactly once there (a retransmission or
    a duplicate ACK has no one time), sorted by key, as three compact arrays."""

    k1: np.ndarray  # uint64: seq << 32 | ack
    k2: np.ndarray  # uint64: payload length << 9 | flags << 1 | direction (0 client→server, 1 server→client)
    ts: np.ndarray  # int64 ns
    read: int = 0  # segments read
    repeated: int = 0  # segments dropped because their key was seen more than once


def _unique_sorted(columns: list[array]) -> _Segments:
    """k1, k2, ts (given as arrays, consumed: each is freed as soon as its sorted copy exists, which keeps the peak
    at about twice the segments' size) sorted by key, with the keys seen more than once dropped."""
    k1 = np.frombuffer(columns[0], dtype=np.uint64)
    k2 = np.frombuffer(columns[1], dtype=np.uint64)
    order = np.lexsort((k2, k1))
    del k1, k2
    k1, k2, ts = (np.frombuffer(columns.pop(0), dtype=dtype)[order] for dtype in (np.uint64, np.uint64, np.int64))
    del order
    repeat = (k1[1:] == k1[:-1]) & (k2[1:] == k2[:-1])
    once = np.ones(len(k1), dtype=bool)
    once[1:] &= ~repeat
    once[:-1] &= ~repeat
    kept = int(once.sum())
    if kept == len(once):
        return _Segments(k1, k2, ts, read=len(once), repeated=0)
    return _Segments(k1[once], k2[once], ts[once], read=len(once), repeated=len(once) - kept)


def read_segments_of(path: str | os.PathLike, flows: set[tuple[str, int, str, int]]) -> _Segments:
    """Keys and times of the segments of the given connections ((client ip, port, server ip, port) tuples),
    reduced to the keys seen once (in the worker process, with --jobs: only those travel back)."""
    forward = flows
    reverse = {(si, sp, ci, cp) for ci, cp, si, sp in flows}
    columns = [array("Q"), array("Q"), array("q")]
    add1, add2, add_ts = (c.append for c in columns)
    with open_capture(path) as reader:
        for _, ts_ns, src_ip, src_port, dst_ip, dst_port, seq, ack, flags, payload, missing in reader.segment_fields():
            four = (src_ip, src_port, dst_ip, dst_port)
            if four in forward:
                direction = 0
            elif four in reverse:
                direction = 1
            else:
                continue
            add1((seq << 32) | ack)
            add2(((len(payload) + missing) << 9) | (flags << 1) | direction)
            add_ts(ts_ns)
    del add1, add2, add_ts  # they hold the arrays, which _unique_sorted frees one by one
    segments = _unique_sorted(columns)
    release_memory()  # the per-packet garbage of the pass, before the next capture's pass or the pairing
    return segments


@dataclass(frozen=True)
class ClockSamples:
    fwd_app: np.ndarray  # app→DB: app timestamp a
    fwd_db: np.ndarray  # app→DB: DB timestamp b
    rev_db: np.ndarray  # DB→app: DB timestamp c
    rev_app: np.ndarray  # DB→app: app timestamp e
    app_segments: int  # segments of matched connections read at the app point
    db_segments: int
    duplicates_dropped: int  # keys seen more than once at one point (retransmissions, duplicate ACKs)


def pair_segments(app: _Segments, db: _Segments) -> ClockSamples:
    """The segments seen at both points (same key), as clock samples. Both sides are sorted by (k1, k2) with unique
    keys, so this is a merge join on sorted arrays: no hash table, a few index arrays of memory."""
    lo = np.searchsorted(db.k1, app.k1, side="left")
    hi = np.searchsorted(db.k1, app.k1, side="right")
    # Several DB segments may share a seq/ack (a pure ACK, then data): walk those runs in step, all app keys at
    # once; each step compares one more DB segment of every run still open (runs are a few segments long).
    ia = np.flatnonzero(hi > lo)
    j, end = lo[ia], hi[ia]
    del lo, hi
    ia_parts, id_parts = [ia[:0]], [j[:0]]
    while len(ia):
        hit = db.k2[j] == app.k2[ia]
        ia_parts.append(ia[hit])
        id_parts.append(j[hit])
        more = ~hit & (j + 1 < end)
        ia, j, end = ia[more], j[more] + 1, end[more]
    ia, id_ = np.concatenate(ia_parts), np.concatenate(id_parts)
    fwd = (app.k2[ia] & np.uint64(1)) == 0
    ts_a, ts_d = app.ts[ia], db.ts[id_]
    order_f = np.lexsort((ts_d[fwd], ts_a[fwd]))  # by app time; equal app times by DB time
    order_r = np.lexsort((ts_d[~fwd], ts_a[~fwd]))
    return ClockSamples(
        ts_a[fwd][order_f], ts_d[fwd][order_f], ts_d[~fwd][order_r], ts_a[~fwd][order_r],
        app_segments=app.read, db_segments=db.read, duplicates_dropped=app.repeated + db.repeated,
    )
