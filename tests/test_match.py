"""Matching exchanges across capture points, on the real group-stall recording's two captures, and the clock
samples taken from their segments (on rewritten copies with known offsets and retransmissions)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pcaptools as pt
from pcapdecomp.exchanges import extract
from pcapdecomp.match import match_exchanges, pair_segments, read_segments_of, split_endpoint

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
    from pcapdecomp.match import _unique_sorted

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
