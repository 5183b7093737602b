"""Matching exchanges across capture points, on the real group-stall recording's two captures, and the clock
samples taken from their segments (on rewritten copies with known offsets and retransmissions)."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pcaptools as pt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcapdecomp.core.endpoints import split_endpoint
from pcapdecomp.pair.clocks import pair_segments, read_segments_of
from pcapdecomp.pair.match import Pairing, match_exchanges
from pcapdecomp.read.exchanges import extract

SET = Path(__file__).resolve().parent.parent / "captures" / "group-stall"


@pytest.fixture(scope="module")
def sides():
    return extract(SET / "app.pcap"), extract(SET / "db.pcap")


def pairs_of(m) -> set[tuple[int, int]]:
    both = (m.app_row >= 0) & (m.db_row >= 0)
    return set(zip(m.app_row[both].tolist(), m.db_row[both].tolist()))


def identity(app: pd.DataFrame, db: pd.DataFrame) -> set[tuple[int, int]]:
    """The right answer, independently: the lab's captures hold the same connections (conn_id from the greeting)
    and each connection's exchanges in the same order."""
    a = app.reset_index(drop=True).reset_index()[["index", "conn_id", "seq"]]
    d = db.reset_index(drop=True).reset_index()[["index", "conn_id", "seq"]]
    j = a.merge(d, on=["conn_id", "seq"])
    return set(zip(j["index_x"].tolist(), j["index_y"].tolist()))


def test_every_exchange_paired_with_itself(sides):
    app, db = sides
    m = match_exchanges(app.exchanges, db.exchanges, app.connections, db.connections)
    assert pairs_of(m) == identity(app.exchanges, db.exchanges)
    assert len(pairs_of(m)) == len(app.exchanges) == 352
    assert m.stats.connections_by_scramble == m.stats.connections_matched == 7


def test_row_order_does_not_matter(sides):
    app, db = sides
    shuffled = db.exchanges.sample(frac=1.0, random_state=3).reset_index(drop=True)
    m = match_exchanges(app.exchanges, shuffled, app.connections, db.connections)
    assert pairs_of(m) == identity(app.exchanges, shuffled)


@pytest.mark.parametrize("column, value", [("sql", "SELECT 2"), ("command", "COM_PING"), ("resp_tcp_end", 12345)])
def test_disagreeing_content_is_never_paired_and_is_marked(sides, column, value):
    app, db = sides
    d = db.exchanges.copy()
    victim = int(np.flatnonzero((d["sql"] == "SELECT 1").fillna(False).to_numpy(dtype=bool))[10])
    if isinstance(d[column].dtype, pd.CategoricalDtype) and value not in d[column].cat.categories:
        d[column] = d[column].cat.add_categories([value])  # text columns are categorical
    d.loc[victim, column] = value
    m = match_exchanges(app.exchanges, d, app.connections, db.connections)
    expected = identity(app.exchanges, d)
    twin = next(a for a, b in expected if b == victim)
    assert pairs_of(m) == expected - {(twin, victim)}
    notes = dict(zip(zip(m.app_row.tolist(), m.db_row.tolist()), m.notes.tolist()))
    assert notes[(twin, -1)] == "match-conflict" and notes[(-1, victim)] == "match-conflict"
    assert m.stats.conflicts == 2


def test_sequence_number_collision_across_connections_is_not_a_pair(sides):
    # A DB exchange on another connection that happens to carry the same request sequence number and text.
    app, db = sides
    a, d = app.exchanges, db.exchanges.copy()
    target = int(np.flatnonzero((a["sql"] == "SELECT 1").fillna(False).to_numpy(dtype=bool))[20])
    other = int(np.flatnonzero(((d["sql"] == "SELECT 1") & (d["conn_id"] != a.loc[target, "conn_id"])).fillna(False).to_numpy(dtype=bool))[5])
    d.loc[other, "req_tcp_seq"] = a.loc[target, "req_tcp_seq"]
    m = match_exchanges(a, d, app.connections, db.connections)
    got = pairs_of(m)
    assert (target, other) not in got
    assert all(a.loc[i, "conn_id"] == d.loc[j, "conn_id"] for i, j in got)
    assert len(got) == len(a) - 1  # only the altered DB row's own pair is gone


def test_different_scramble_vetoes_the_connection(sides):
    app, db = sides
    conns = app.connections.copy()
    conns.loc[0, "scramble"] = "00" * 20
    m = match_exchanges(app.exchanges, db.exchanges, conns, db.connections)
    lost = set(np.flatnonzero((app.exchanges["conn_index"] == conns.loc[0, "conn_index"]).to_numpy()).tolist())
    assert m.stats.connections_vetoed >= 1
    assert not any(i in lost for i, _ in pairs_of(m))
    assert m.stats.matched == len(app.exchanges) - len(lost)


def test_nat_rewritten_client_matched_through_sequence_numbers_without_greeting(sides):
    # Client address rewritten and no greeting on either side (scramble and conn_id unknown): votes decide.
    app, db = sides
    a = app.exchanges.copy()
    a["client"] = "192.0.2.9:" + (a["client"].str.rsplit(":", n=1).str[1].astype(int) + 1).astype(str)
    a["conn_id"] = pd.array([None] * len(a), dtype="Int64")
    ac = app.connections.assign(scramble=pd.NA, conn_id=pd.NA, client="192.0.2.9:1")
    dc = db.connections.assign(scramble=pd.NA)
    m = match_exchanges(a, db.exchanges, ac, dc)
    assert pairs_of(m) == identity(app.exchanges, db.exchanges)
    assert m.stats.connections_nat == 7 and m.stats.connections_by_scramble == 0


def test_one_side_empty(sides):
    app, db = sides
    m = match_exchanges(app.exchanges.iloc[:0], db.exchanges, app.connections.iloc[:0], db.connections)
    assert (m.app_row == -1).all() and sorted(m.db_row.tolist()) == list(range(len(db.exchanges)))


# --- in two steps: connections, then exchanges (the loss repair sits between them) ----------------------------------


def test_connections_first_then_exchanges_once(sides):
    app, db = sides
    pairing = Pairing(app.exchanges, db.exchanges, app.connections, db.connections)
    assert len(pairing.connections) == 7
    assert pairing.matched == len(identity(app.exchanges, db.exchanges))  # the count alone, before the rest
    m = pairing.complete()
    assert pairs_of(m) == identity(app.exchanges, db.exchanges)
    assert m.stats.matched == pairing.matched == m.matched
    assert m.connections is pairing.connections  # the connection pairs were not made again
    assert pairing.complete() is m  # nor the exchange pairs


def test_exchange_pairs_made_again_after_release_are_the_same(sides):
    app, db = sides
    gone = db.exchanges.drop(index=db.exchanges.index[::9]).reset_index(drop=True)  # some DB rows not seen
    whole = match_exchanges(app.exchanges, gone, app.connections, db.connections)
    pairing = Pairing(app.exchanges, gone, app.connections, db.connections)
    assert pairing.matched == whole.stats.matched < len(app.exchanges)
    pairing.release(tables=False)  # what it made of the rows goes; made again from the same connection pairs
    again = pairing.complete()
    assert np.array_equal(again.app_row, whole.app_row) and np.array_equal(again.db_row, whole.db_row)
    assert list(again.notes) == list(whole.notes) and again.stats == whole.stats
    assert "lost-at-db" in set(again.notes)
    released = Pairing(app.exchanges, gone, app.connections, db.connections)
    released.release()
    with pytest.raises(RuntimeError):
        released.complete()


def test_counting_part_of_the_pairs_answers_as_the_whole_count_and_is_not_done_twice(sides):
    """matched_at_least counts connection pair by pair until it knows; the exchange pairing then made of those parts
    and the rest is the one made at once."""
    app, db = sides
    gone = db.exchanges.drop(index=db.exchanges.index[::5]).reset_index(drop=True)
    whole = match_exchanges(app.exchanges, gone, app.connections, db.connections)
    assert 0 < whole.stats.matched < len(app.exchanges)
    for asks in ([0], [1], [whole.stats.matched], [whole.stats.matched + 1], [10, 100, whole.stats.matched],
                 [len(app.exchanges) + 1, 50], [0.5 * len(app.exchanges)]):
        pairing = Pairing(app.exchanges, gone, app.connections, db.connections)
        for count in asks:
            assert pairing.matched_at_least(count) == (whole.stats.matched >= count)
        some = len(pairing._counted_pairs)
        assert 0 <= some <= len(pairing.connections)
        m = pairing.complete()
        assert np.array_equal(m.app_row, whole.app_row) and np.array_equal(m.db_row, whole.db_row)
        assert list(m.notes) == list(whole.notes) and m.stats == whole.stats
        assert m.matched_at_least(whole.stats.matched) and not m.matched_at_least(whole.stats.matched + 1)
    pairing = Pairing(app.exchanges, gone, app.connections, db.connections)
    assert pairing.matched_at_least(10) and 0 < len(pairing._counted_pairs) < len(pairing.connections)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_inside_rows_is_the_merge_of_the_keys(data):
    from pcapdecomp.pair.match import _inside_rows

    big = data.draw(st.booleans())  # values too far apart for one int64 key: the merge itself answers

    def side(n, unique):
        rows = data.draw(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 7, 1 << 40 if big else 9]),
                                            st.integers(0, 2)), min_size=n, max_size=n, unique=unique))
        return [np.array([r[i] for r in rows], dtype=np.int64) for i in range(3)]

    a = side(data.draw(st.integers(0, 20)), True)
    d = side(data.draw(st.integers(0, 20)), True)
    if big and len(a[0]) and len(d[0]):
        a[2] = a[2] * (1 << 30)  # the three columns' ranges multiply beyond 62 bits
        d[2] = d[2] * (1 << 30)
    rows_a, rows_d = _inside_rows(a, d)
    on = ["d_conn", "seq", "k"]
    left = pd.DataFrame(dict(zip(on, a))).reset_index()
    right = pd.DataFrame(dict(zip(on, d))).reset_index()
    want = left.merge(right, on=on, how="inner")
    assert rows_a.tolist() == want["index_x"].tolist() and rows_d.tolist() == want["index_y"].tolist()


# --- the sorted joins against what they replace (the pandas merges, np.unique, the occurrence numbers) --------------


def test_a_sequence_number_repeated_inside_a_connection_pairs_by_its_occurrence(sides):
    # Two requests of one connection carry the same sequence number at both points (4 GiB apart, or forged): the
    # k-th with the k-th, by the occurrence numbers, not the one search of distinct (connection, seq) keys.
    app, db = sides
    a, d = app.exchanges.copy(), db.exchanges.copy()
    conn = a["conn_index"].iloc[0]
    rows_a = np.flatnonzero((a["conn_index"] == conn).to_numpy())[:2]
    twin = d["conn_id"] == a["conn_id"].iloc[rows_a[0]]
    rows_d = np.flatnonzero(twin.fillna(False).to_numpy(dtype=bool))[:2]
    a.loc[rows_a[1], "req_tcp_seq"] = a.loc[rows_a[0], "req_tcp_seq"]
    d.loc[rows_d[1], "req_tcp_seq"] = d.loc[rows_d[0], "req_tcp_seq"]
    m = match_exchanges(a, d, app.connections, db.connections)
    assert pairs_of(m) == identity(app.exchanges, db.exchanges)


def test_one_connection_and_no_exchange(sides):
    app, db = sides
    one = app.exchanges["conn_index"] == app.exchanges["conn_index"].iloc[0]
    a = app.exchanges[one.to_numpy()].reset_index(drop=True)
    m = match_exchanges(a, db.exchanges, app.connections, db.connections)
    assert pairs_of(m) == identity(a, db.exchanges) and len(pairs_of(m)) == len(a) > 0
    assert m.stats.connections_matched == 1
    none = match_exchanges(app.exchanges.iloc[:0], db.exchanges.iloc[:0], app.connections, db.connections)
    assert len(none.app_row) == 0 and none.stats.matched == 0 and len(none.connections) == 0


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_bounded_join_is_the_pandas_one(data):
    from pcapdecomp.pair.match import FANOUT, _bounded_join, _bounded_join_frames

    def side(conn: str):
        n = data.draw(st.integers(0, 40))
        rows = data.draw(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 5), st.integers(0, 2)),
                                  min_size=n, max_size=n))
        frame = pd.DataFrame(rows, columns=[conn, "value", "ends"], dtype=np.int64)
        return frame.assign(ends=frame[conn] % data.draw(st.integers(1, 3)))  # a connection's endpoints

    a, d = side("a_conn"), side("d_conn")
    got = _bounded_join(a, d, ["value"], ["ends"])
    want = _bounded_join_frames(a, d, ["value"], ["ends"])
    assert got[0].astype(np.int64).reset_index(drop=True).equals(want[0].astype(np.int64).reset_index(drop=True))
    assert got[1:] == want[1:]
    assert FANOUT == 4  # the draws above put up to 7 connections on one value: both sides of the limit


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_inside_once_is_the_join_with_occurrences_or_declines(data):
    from pcapdecomp.pair.match import _inside_once, _inside_rows, _occurrence

    def side():
        n = data.draw(st.integers(0, 30))
        conn = np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=np.int64)
        seq = np.array(data.draw(st.lists(st.sampled_from([0, 5, 6, (1 << 32) - 1]), min_size=n, max_size=n)),
                       dtype=np.int64)
        return conn, seq

    (ca, sa), (cd, sd) = side(), side()
    got = _inside_once(ca, sa, cd, sd)
    repeats = any(len(set(zip(c.tolist(), s.tolist()))) < len(c) for c, s in ((ca, sa), (cd, sd)))
    if got is None:
        assert repeats or not len(ca) or not len(cd)
        return
    assert not repeats
    want = _inside_rows([ca, sa, _occurrence(ca, sa)], [cd, sd, _occurrence(cd, sd)])
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_sorting_helpers_are_the_numpy_ones(data):
    from pcapdecomp.pair.match import _counted_pairs, _key_then_group_order, _numbered, _positions

    n = data.draw(st.integers(0, 40))
    key = np.array(data.draw(st.lists(st.integers(-3, 1 << 40), min_size=n, max_size=n)), dtype=np.int64)
    group = np.array(data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)), dtype=np.int64)
    assert _key_then_group_order(key, group, 6).tolist() == np.lexsort((group, key)).tolist()
    a, d = np.sort(key[: n // 2]), np.sort(key[n // 2:])
    na, nd = _numbered(a, d)
    codes = np.unique(np.concatenate([a, d]), return_inverse=True)[1].reshape(-1)
    assert na.tolist() == codes[:len(a)].tolist() and nd.tolist() == codes[len(a):].tolist()
    wide = data.draw(st.booleans())  # numbers far apart: counted by the sort
    pa, pd_ = group * ((1 << 30) if wide else 1), group[::-1].copy()
    pair, votes = _counted_pairs(pa, pd_)
    want_pair, want_votes = np.unique((pa << 32) | pd_, return_counts=True)
    assert pair.tolist() == want_pair.tolist() and votes.tolist() == want_votes.tolist()
    pairs = np.unique(group[: n // 3]) * ((1 << 20) if wide else 1)
    expected = pd.Index(pairs).get_indexer(group) if len(pairs) else np.full(len(group), -1)
    assert _positions(pairs, group).tolist() == expected.tolist()


# --- clock samples ---------------------------------------------------------------------------------------


def flows(conns: pd.DataFrame) -> set:
    return {(*split_endpoint(c), *split_endpoint(s)) for c, s in zip(conns["client"], conns["server"])}


def test_clock_samples_pair_identical_segments_and_drop_retransmissions(sides, tmp_path):
    app, db = sides
    offset = 123_456_789
    repeated = set(range(100, 1099, 50))  # 20 packets written twice (a retransmission 1 µs later)
    pt.rewrite(SET / "db.pcap", tmp_path / "db.pcap", time=lambda t: t + offset, repeat=lambda i: i in repeated)
    a = read_segments_of(SET / "app.pcap", flows(app.connections))
    d = read_segments_of(tmp_path / "db.pcap", flows(db.connections))
    assert a.read == 1099 and d.read == 1099 + len(repeated)
    assert len(a.ts) == 1099 and len(d.ts) == 1099 - len(repeated)  # a retransmitted key has no single time
    s = pair_segments(a, d)
    # Every sample pairs a segment with itself: the DB time is the app time plus the applied offset plus the
    # (tiny, positive) veth delay forward, minus it backward.
    fwd = s.fwd_db - s.fwd_app - offset
    rev = s.rev_db - s.rev_app - offset
    assert (fwd >= 0).all() and (fwd < 200_000).all()
    assert (rev <= 0).all() and (rev > -200_000).all()
    assert len(s.fwd_app) + len(s.rev_app) == 1099 - len(repeated)  # a retransmitted key has no single time
    assert s.duplicates_dropped == 2 * len(repeated)


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_clock_samples_only_of_chosen_connections(sides):
    app, _ = sides
    one = app.connections.iloc[:1]
    a = read_segments_of(SET / "app.pcap", flows(one))
    port = split_endpoint(one["client"].iloc[0])[1]
    # tshark counts the same connection's frames independently
    out = subprocess.run(["tshark", "-r", str(SET / "app.pcap"), "-Y", f"tcp.port == {port}"],
                         capture_output=True, text=True, check=True).stdout
    assert 0 < a.read == len(out.splitlines())


def _reference_pairs(a, d):
    """What pairing the clock samples means, written the slow obvious way: keys seen once per side, joined."""
    frames = []
    for (k1, k2, ts) in (a, d):
        df = pd.DataFrame({"k1": k1, "k2": k2, "ts": ts})
        frames.append(df[~df.duplicated(["k1", "k2"], keep=False)])
    both = frames[0].merge(frames[1], on=["k1", "k2"], suffixes=("_a", "_d"))
    fwd = (both["k2"].to_numpy() & np.uint64(1)) == 0
    return sorted((int(x), int(y), bool(f)) for x, y, f in zip(both["ts_a"], both["ts_d"], fwd))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_segment_pairing_is_the_join_of_keys_seen_once(data):
    from pcapdecomp.pair.clocks import _unique_sorted

    def side(n):
        k1 = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))  # few values: ties and repeats
        k2 = data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
        ts = data.draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n))
        return (np.array(k1, dtype=np.uint64), np.array(k2, dtype=np.uint64), np.array(ts, dtype=np.int64))

    a = side(data.draw(st.integers(0, 25)))
    d = side(data.draw(st.integers(0, 25)))
    samples = pair_segments(_unique_sorted(list(a)), _unique_sorted(list(d)))
    got = [(int(x), int(y), True) for x, y in zip(samples.fwd_app, samples.fwd_db)]
    got += [(int(x), int(y), False) for x, y in zip(samples.rev_app, samples.rev_db)]
    assert sorted(got) == _reference_pairs(a, d)
    assert list(samples.fwd_app) == sorted(samples.fwd_app) and list(samples.rev_app) == sorted(samples.rev_app)
    assert samples.app_segments == len(a[0]) and samples.db_segments == len(d[0])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_segment_pairing_in_chunks_is_the_same_join(data):
    """pair_segments searches JOIN_CHUNK app segments at a time: whatever the chunk, the join of the keys seen
    once, the samples in the same order."""
    from unittest import mock

    from pcapdecomp.pair import clocks

    def side(n):
        k1 = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        k2 = data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
        ts = data.draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n))
        return (np.array(k1, dtype=np.uint64), np.array(k2, dtype=np.uint64), np.array(ts, dtype=np.int64))

    a = side(data.draw(st.integers(0, 25)))
    d = side(data.draw(st.integers(0, 25)))
    with mock.patch.object(clocks, "JOIN_CHUNK", data.draw(st.integers(1, 8))):
        samples = pair_segments(clocks._unique_sorted(list(a)), clocks._unique_sorted(list(d)))
    got = [(int(x), int(y), True) for x, y in zip(samples.fwd_app, samples.fwd_db)]
    got += [(int(x), int(y), False) for x, y in zip(samples.rev_app, samples.rev_db)]
    assert sorted(got) == _reference_pairs(a, d)
    assert list(samples.fwd_app) == sorted(samples.fwd_app) and list(samples.rev_app) == sorted(samples.rev_app)


def test_clock_samples_of_a_real_capture_alike_in_chunks(sides):
    """The lab's group-stall capture against itself, searched 7 app segments at a time: the samples of one search."""
    from unittest import mock

    from pcapdecomp.pair import clocks

    app, db = sides
    a = read_segments_of(SET / "app.pcap", flows(app.connections))
    d = read_segments_of(SET / "db.pcap", flows(db.connections))
    whole = pair_segments(a, d)
    with mock.patch.object(clocks, "JOIN_CHUNK", 7):
        chunked = pair_segments(a, d)
    assert len(whole.fwd_app) + len(whole.rev_app) > 100  # the capture's segments seen at both points
    for name in ("fwd_app", "fwd_db", "rev_db", "rev_app"):
        assert np.array_equal(getattr(whole, name), getattr(chunked, name))
    assert sorted([(int(x), int(y), True) for x, y in zip(chunked.fwd_app, chunked.fwd_db)]
                  + [(int(x), int(y), False) for x, y in zip(chunked.rev_app, chunked.rev_db)]) \
        == _reference_pairs((a.k1, a.k2, a.ts), (d.k1, d.k2, d.ts))


# --- repeated keys: matching stays linear ---------------------------------------------------------------------


def copies(src: Path, dst: Path, port: int, n: int, port_of) -> None:
    """`n` copies of the connection whose client port is `port` in the real capture `src`, each on its own client
    port `port_of(i)`, everything else byte for byte (the same ISNs, the same greeting scramble, the same
    statements at the same times): what 5,000 connections opened by one forged client look like."""
    header, order, unit, recs = pt.records(src)
    out = [header]
    for ts, pkt, orig in recs:
        if pkt[12:14] != b"\x08\x00" or pkt[23] != 6:
            continue
        tcp = 14 + (pkt[14] & 0x0F) * 4
        sport, dport = int.from_bytes(pkt[tcp:tcp + 2], "big"), int.from_bytes(pkt[tcp + 2:tcp + 4], "big")
        if port not in (sport, dport):
            continue
        at = tcp if sport == port else tcp + 2
        for i in range(n):
            new = pkt[:at] + port_of(i).to_bytes(2, "big") + pkt[at + 2:]
            out.append(struct.pack(order + "IIII", ts // 1_000_000_000, (ts % 1_000_000_000) // unit, len(new), orig))
            out.append(new)
    dst.write_bytes(b"".join(out))


def replicated(tmp_path: Path, n: int, nat: bool):
    x = extract(SET / "app.pcap")
    conn = x.connections[x.connections["exchanges"] == 32].iloc[0]
    port = split_endpoint(conn["client"])[1]
    copies(SET / "app.pcap", tmp_path / f"app{n}.pcap", port, n, lambda i: 20000 + i)
    copies(SET / "db.pcap", tmp_path / f"db{n}.pcap", port, n, lambda i: (40000 if nat else 20000) + i)
    return extract(tmp_path / f"app{n}.pcap"), extract(tmp_path / f"db{n}.pcap")


@pytest.mark.parametrize("nat", [False, True])
def test_matching_work_grows_linearly_with_connections_that_share_every_key(tmp_path, nat):
    """N copies of one real connection, same ISNs and scramble: the joins on sequence numbers and scrambles would
    make N² candidate pairs. Scaled 4×, the work (rows the joins produce) and the memory grow about 4×; every
    exchange paired is paired with its own copy; behind NAT (client ports differ between the points) the copies
    cannot be told apart, so none is paired and all say why."""
    import tracemalloc

    work, peak = [], []
    for n in (25, 100):
        app, db = replicated(tmp_path, n, nat)
        assert len(app.connections) == len(db.connections) == n and len(app.exchanges) == 32 * n
        tracemalloc.start()
        m = match_exchanges(app.exchanges, db.exchanges, app.connections, db.connections)
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        work.append(m.stats.candidates)
        both = (m.app_row >= 0) & (m.db_row >= 0)
        a_port = app.exchanges["client"].astype(str).str.rsplit(":", n=1).str[1].astype(int).to_numpy()
        d_port = db.exchanges["client"].astype(str).str.rsplit(":", n=1).str[1].astype(int).to_numpy()
        offset = 20000 if nat else 0
        assert (a_port[m.app_row[both]] + offset == d_port[m.db_row[both]]).all()  # never another copy
        if nat:
            assert both.sum() == 0 and m.stats.connections_ambiguous == 2 * n
            assert set(m.notes.tolist()) == {"match-ambiguous"}
        else:
            assert both.sum() == 32 * n and m.stats.connections_matched == n
        assert m.stats.ambiguous_keys > 0
    assert work[1] <= 4.6 * work[0], work  # quadratic would be 16×
    assert peak[1] <= 5 * peak[0], peak


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from("abcde")), max_size=12),
       st.lists(st.one_of(st.none(), st.sampled_from("cdefg")), max_size=12), st.booleans())
def test_codes_of_two_columns_are_equal_when_their_values_are(left, right, categorical):
    from pcapdecomp.pair.match import _codes

    a = pd.Series(left, dtype="category" if categorical else object)
    b = pd.Series(right, dtype="category" if categorical else object)
    codes_a, codes_b = _codes(a, b)
    for i, x in enumerate(left):
        assert (codes_a[i] < 0) == (x is None)
        for j, y in enumerate(right):
            assert (codes_a[i] == codes_b[j]) == (x == y)


def test_a_connection_whose_rows_were_all_replaced_pairs_as_before(sides):
    # The loss repair leaves a repaired connection's rows after the kept ones (repair.repair_losses): its
    # connection key is numbered last, its rows sorted apart from the others'.
    from pcapdecomp.pair.match import connection_keys

    app, db = sides
    d = db.exchanges
    moved = (d["conn_index"] == d["conn_index"].iloc[0]).to_numpy()
    again = pd.concat([d[~moved], d[moved]], ignore_index=True)
    m = match_exchanges(app.exchanges, again, app.connections, db.connections)
    assert pairs_of(m) == identity(app.exchanges, again) and len(pairs_of(m)) == len(app.exchanges)
    pairing = Pairing(app.exchanges, again, app.connections, db.connections)
    keys_a, keys_d = pairing.row_connections(app.exchanges, again)  # the pairing's own keys of its tables
    assert np.array_equal(keys_d, connection_keys(again).to_numpy()) and keys_d[-1] == keys_d.max()
    other_a, other_d = pairing.row_connections(app.exchanges, d)  # other tables: their own keys
    assert np.array_equal(other_d, connection_keys(d).to_numpy()) and not np.array_equal(other_d, keys_d)


def _clock_of_all_samples(a, d, db_first_ns):
    """The clock fitted the way it was before hulls: every sample held, estimate_clock on them."""
    from pcapdecomp.pair import clocks
    from pcapdecomp.pair.clock import estimate_clock

    samples = pair_segments(a, d)
    model = estimate_clock(samples.fwd_app, samples.fwd_db, samples.rev_db, samples.rev_app)
    return model, clocks.clock_entry(model, samples.counts, db_first_ns)


@pytest.mark.parametrize("step_ns", [0, 3_000_000])
def test_clock_from_hulls_is_the_clock_of_all_samples(sides, tmp_path, step_ns):
    """The lab's group-stall pair, its DB clock offset (and stepped 3 ms a third of the way in: no consistent line
    at once, so the samples are paired again and fitted as before), its segments reduced 7 app segments at a
    time: the model and summary.json's clocks entry of one fit on every sample, bit for bit."""
    from unittest import mock

    from pcapdecomp.pair import clocks

    app, db = sides
    records = list(pt.records(SET / "db.pcap")[3])
    step_at = records[len(records) // 3][0]
    pt.rewrite(SET / "db.pcap", tmp_path / "db.pcap", time=lambda t: t + 777_000 + (step_ns if t >= step_at else 0))
    a = read_segments_of(SET / "app.pcap", flows(app.connections))
    d = read_segments_of(tmp_path / "db.pcap", flows(db.connections))
    first = records[0][0] + 777_000
    expected_model, expected_entry = _clock_of_all_samples(a, d, first)
    assert (expected_model.quality, len(expected_model.segments)) == ("two-sided", 2 if step_ns else 1)
    for chunk in (clocks.JOIN_CHUNK, 7):
        with mock.patch.object(clocks, "JOIN_CHUNK", chunk):
            model, entry = clocks._fitted_clock(a, d, first)
        assert repr(model) == repr(expected_model)
        assert entry == expected_entry
