"""The partitioned run's paired rows (explain/partitioned.py, docs/partitioned.md §5 step 7a): the joined table made
partition by partition from the two points' spilled buckets, its runs merged by row key, is today's joined table
(explain.servers.joined_table after pair.pairing.pair_points): the same rows in the same order, the same values
and dtypes, categoricals the same once recoded to today's categories (the file's dictionaries are the merged
writer's job: test_merged_writer). For P = 1, 3 and 16 partitions, on every bundled capture set with both points
that is partitionable, on the test captures' pairs and on the 10 s recordings (skipped when absent). The sets the
partitioned run does not do are refused, before any row is read: a lossy copy (the loss repair), a proxy set,
an app point with several DB points, an app point alone (several app points are taken: test_spill_run). A DB capture alone (one or
several DB points) gives today's rows of the DB point(s) alone."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcapdecomp.analysis import Options, capture_set
from pcapdecomp.core.tables import as_declared
from pcapdecomp.explain.partitioned import (NotPartitionable, PairedPartitions, check_partitionable, partitions_of,
                                           spilled_names)
from pcapdecomp.pair.clocks import spilled_clocks
from pcapdecomp.pair.match import ROW_KEY_FIELDS, spilled_connection_step
from pcapdecomp.read import connids
from pcapdecomp.read.extract import extract_points
from pcapdecomp.read.spill import BUCKETS

from partitioning import (CAPTURES, PAIRS, PROXY_SETS, RECORDED, REPO, db_alone, merged, partitionable_recording,
                          spilled, today)

PARTS = (1, 3, 16)
sys.path.insert(0, str(REPO / "scripts"))

from lose_frames import lose_frames  # noqa: E402


def assert_same_as_today(cs, work: Path, parts=PARTS) -> dict:
    """The partitioned rows of `cs` equal today's joined table for each P in `parts`; the runs sorted by key and
    none above its P. Their inputs made from the spill too, and equal to today's: the clock models (repr) and their
    entries (spilled_clocks), the connections named without a greeting (spilled_names). Returns what the checks
    saw."""
    table, (clocks, clock_info, id_sources, db_conns, matching) = today(cs)
    x = spilled(cs, work / "spill")
    step = spilled_connection_step(x.app, x.db) if x.app else None  # DB points alone: nothing to pair
    named = {}
    if "conn_id_source" in db_conns:
        mine = db_conns[db_conns["conn_id_source"].isin([connids.ANSWER, connids.PROCESSLIST]).to_numpy()]
        named = dict(zip(zip(mine["capture"].astype(str), mine["conn_index"].astype(int)), mine["conn_id"].astype(int)))
    notes: list[str] = []
    got_sources, got_named = spilled_names(cs.processlist, {p.name: p for p in cs.points}, x.app, x.db, notes.append)
    assert (got_sources, got_named) == (id_sources, named)
    got_clocks, got_info = (spilled_clocks(x.app_points, x.db_points, x.app, x.db, step.connections, None, 1,
                                           notes.append) if x.app and len(step.connections) else ({}, {}))
    assert repr(got_clocks) == repr(clocks) and got_info == clock_info
    clocks, id_sources, named = got_clocks, got_sources, got_named  # the partitions from the spill's own inputs
    for p in parts:
        rows = PairedPartitions(x.app, x.db, step, clocks, id_sources=id_sources, named=named, parts=p)
        assert rows.stats() == matching.stats, p
        runs = list(rows)
        assert 1 <= len(runs) <= p
        for run in runs:  # each run sorted by its keys, one key per row
            assert len(run.key) == len(run.table) and run.key.shape[1] == len(ROW_KEY_FIELDS)
            assert np.array_equal(np.lexsort(run.key.T[::-1]), np.arange(len(run.key)))
        got = merged(runs, {c: table[c].cat.categories for c in table.columns
                            if isinstance(table[c].dtype, pd.CategoricalDtype)})
        # whole numbers in their declared dtype: the in-memory table holds a column narrower where its values
        # allow (core.tables.held), a partition's by its own values; the files hold the declared dtype
        pd.testing.assert_frame_equal(as_declared(got), as_declared(table), check_exact=True)
    return {"rows": len(table), "seen": table["seen"].value_counts().to_dict(), "runs": len(runs), "named": len(named),
            "points": table["db_point"].nunique(), "sources": set(id_sources.values()), "clocks": len(clocks)}


@pytest.mark.parametrize("name", [n for n in PAIRS if n not in PROXY_SETS])
def test_the_partitioned_rows_are_todays_joined_table(name, tmp_path):
    found = assert_same_as_today(capture_set(CAPTURES / name), tmp_path)
    assert found["rows"] > 0
    if name == "field-pool-before-capture":  # its pool's connections are named by the processlist, not a greeting
        assert found["named"] > 0 and found["sources"] == {connids.ANSWER, connids.PROCESSLIST}, found


def test_connections_named_by_their_answers_alone(tmp_path):
    """field-pool-before-capture without its processlist: the ids come from the SELECT CONNECTION_ID() answers the
    buckets hold alone (spilled_names), as name_connections finds them in the tables."""
    cs = capture_set(CAPTURES / "field-pool-before-capture")
    cs.processlist = None
    found = assert_same_as_today(cs, tmp_path, parts=(3,))
    assert found["named"] > 0 and found["sources"] == {connids.ANSWER}, found


@pytest.mark.parametrize("name", PAIRS)
def test_a_db_capture_alone_is_todays_joined_table(name, tmp_path):
    """Every bundled set's DB capture alone (the proxy sets' too: without the proxy point, their DB side): every
    row seen at the DB only, on its own point, the app columns null, as today's joined table."""
    found = assert_same_as_today(db_alone(capture_set(CAPTURES / name)), tmp_path)
    assert found["rows"] > 0 and {seen for seen, n in found["seen"].items() if n} == {"db"}, found
    if name == "field-pool-before-capture":  # named at the DB point by its answers and the processlist
        assert found["named"] > 0 and found["sources"] == {connids.ANSWER, connids.PROCESSLIST}, found


@pytest.mark.parametrize("name", ["oltp-hogs", "field-pool-before-capture"])
def test_several_db_points_alone(name, tmp_path):
    """Two DB points and no app point (the set's app capture read as a second DB point): each row on its own
    point, with the clock key pair_points gives it, as today."""
    cs = capture_set(CAPTURES / name)
    cs.points = [dataclasses.replace(p, kind="db") for p in cs.points]
    found = assert_same_as_today(cs, tmp_path)
    assert found["points"] == 2 and {seen for seen, n in found["seen"].items() if n} == {"db"}, found


def test_the_test_captures_pair(tmp_path):
    """tests/data's one pair: one whole connection seen at both points (22 frames each)."""
    field = REPO / "tests" / "data" / "field"
    cs = capture_set(app=[field / "one-connection-app.pcap"], db=field / "one-connection-db.pcap")
    assert assert_same_as_today(cs, tmp_path)["rows"] > 0
    alone = assert_same_as_today(capture_set(db=field / "one-connection-db.pcap"), tmp_path / "alone")
    assert alone["rows"] > 0 and {seen for seen, n in alone["seen"].items() if n} == {"db"}, alone


@pytest.mark.parametrize("name", PROXY_SETS)
def test_a_proxy_set_is_refused(name, tmp_path):
    cs = capture_set(CAPTURES / name)
    x = spilled(cs, tmp_path)
    with pytest.raises(NotPartitionable, match="proxy"):
        PairedPartitions(x.app, x.db, spilled_connection_step(x.app, x.db), {}, proxy=x.proxy,
                         proxy_servers=cs.proxy_servers)


def _copy_set(name: str, folder: Path, app: Path | None = None, db: Path | None = None) -> Path:
    folder.mkdir()
    for part in ("capture.toml", "slow.log"):
        if (CAPTURES / name / part).exists():
            shutil.copyfile(CAPTURES / name / part, folder / part)
    shutil.copyfile(app or CAPTURES / name / "app.pcap", folder / "app.pcap")
    shutil.copyfile(db or CAPTURES / name / "db.pcap", folder / "db.pcap")
    return folder


def test_a_lossy_copy_is_refused(tmp_path):
    """Frames lost at the app: the loss repair would re-read connections, which the partitions do not do
    (LostFrames, naming the lossy point); asked `unrepaired` (run/spilled.py, when the in-memory run would pass the
    bound), taken, its lost bytes left holes."""
    from pcapdecomp.explain.partitioned import LostFrames

    lose_frames(CAPTURES / "oltp-prepared" / "app.pcap", tmp_path / "lossy.pcap", 0.03, 1)
    cs = capture_set(_copy_set("oltp-prepared", tmp_path / "set", app=tmp_path / "lossy.pcap"))
    x = spilled(cs, tmp_path / "spill")
    assert x.app[0].holes
    step = spilled_connection_step(x.app, x.db)
    with pytest.raises(LostFrames, match="frames lost at") as refused:
        PairedPartitions(x.app, x.db, step, {})
    assert refused.value.lossy == [x.app[0]]
    assert PairedPartitions(x.app, x.db, step, {}, unrepaired=True).first_pass.matched > 0


def test_sets_of_other_shapes_are_refused(tmp_path):
    """An app point alone, an app point with several DB points, an extraction that did not spill: refused, saying
    which. A DB point alone is not, nor several app points of one DB point."""
    cs = capture_set(CAPTURES / "oltp-hogs")
    x = spilled(cs, tmp_path / "spill")
    with pytest.raises(NotPartitionable, match="missing"):
        check_partitionable(x.app, [])
    check_partitionable([], x.db)
    check_partitionable([], [*x.db, *x.db])
    with pytest.raises(NotPartitionable, match="2 DB points"):
        check_partitionable(x.app, [*x.db, *x.db])
    check_partitionable([*x.app, *x.app], x.db)  # several app points: taken (§24, test_spill_run)
    memory = extract_points(cs, 1, True, Options(quiet=True).max_sql_bytes, lambda _: None)
    with pytest.raises(NotPartitionable, match="did not spill"):
        check_partitionable(memory.app, memory.db)


def test_rows_only_one_point_saw(tmp_path):
    """group-stall with the app capture's last tenth and the DB capture's first tenth of frames cut off (by
    editcap): rows only the app saw and rows only the DB saw, without a proxy and without a loss inside a
    connection's stream: their notes, db_point and bounds from the partitions as today."""
    import subprocess

    source = CAPTURES / "group-stall"
    frames = {}
    for side in ("app", "db"):
        done = subprocess.run(["capinfos", "-c", "-M", str(source / f"{side}.pcap")], capture_output=True, text=True,
                              check=True)
        frames[side] = int(done.stdout.split()[-1])
    cut_app, cut_db = tmp_path / "app.pcap", tmp_path / "db.pcap"
    subprocess.run(["editcap", "-r", str(source / "app.pcap"), str(cut_app), f"1-{frames['app'] * 9 // 10}"],
                   check=True, capture_output=True)
    subprocess.run(["editcap", "-r", str(source / "db.pcap"), str(cut_db), f"{frames['db'] // 10 + 1}-{frames['db']}"],
                   check=True, capture_output=True)
    cs = capture_set(_copy_set("group-stall", tmp_path / "set", app=cut_app, db=cut_db))
    x = spilled(cs, tmp_path / "probe")
    if any(p.holes for p in (*x.app, *x.db)):
        pytest.skip("the cut left holes inside a connection's stream: the repair's case")
    found = assert_same_as_today(cs, tmp_path)
    assert found["seen"].get("app", 0) > 0 and found["seen"].get("db", 0) > 0, found


def test_the_partitions_are_runs_of_buckets_of_about_the_same_rows():
    """partitions_of: consecutive runs covering every bucket, each with rows, cut near multiples of rows / P."""
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 100, BUCKETS)
    for p in (1, 3, 16, 300):
        runs = partitions_of(rows, p)
        assert runs[0][0] == 0 and runs[-1][1] == BUCKETS
        assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
        assert len(runs) <= p
        sums = [rows[a:b].sum() for a, b in runs]
        assert all(s > 0 for s in sums)
        if p <= 16:
            assert max(sums) <= rows.sum() / p + rows.max()
    sparse = np.zeros(BUCKETS, dtype=np.int64)
    sparse[[5, 200]] = 7
    assert partitions_of(sparse, 16) == [(0, 6), (6, BUCKETS)]


@pytest.mark.parametrize("folder", RECORDED, ids=lambda p: p.name)
def test_the_10s_recordings(folder, tmp_path):
    cs = partitionable_recording(folder, tmp_path / "probe")
    found = assert_same_as_today(cs, tmp_path)
    # a 10 s recording: its size varies with the machine's load (90,562–101,856 exchanges a point, 2026-12-02)
    assert found["rows"] > 50_000 and found["clocks"] == 1, found


@pytest.mark.parametrize("folder", RECORDED, ids=lambda p: p.name)
def test_the_10s_recordings_db_capture_alone(folder, tmp_path):
    """analyze --db F/db.pcap's rows, partitioned."""
    if not (folder / "db.pcap").exists():
        pytest.skip(f"{folder} is not here")
    found = assert_same_as_today(db_alone(capture_set(folder)), tmp_path)
    assert found["rows"] > 50_000 and {seen for seen, n in found["seen"].items() if n} == {"db"}, found


def test_lost_at_notes_read_each_connections_whole_span(tmp_path):
    """A row seen at one point only is 'lost-at-*' when its connection paired rows before and after it, which may
    lie in other partitions: the first pass's spans (match.paired_spans, combined) make the partitions' notes the
    whole pairing's. On a lossy copy (its rows paired without the repair, which the partitioned run refuses to
    need): every row's pair and note, from 3 partitions, as Pairing.complete gives them."""
    from pcapdecomp.pair.match import Pairing, combined_spans, exchange_rows, paired_spans, pairs_inside

    lose_frames(CAPTURES / "oltp-prepared" / "app.pcap", tmp_path / "lossy.pcap", 0.03, 1)
    cs = capture_set(_copy_set("oltp-prepared", tmp_path / "set", app=tmp_path / "lossy.pcap"))
    x = extract_points(cs, 1, True, Options(quiet=True).max_sql_bytes, lambda _: None)
    app, db = x.app[0].exchanges, x.db[0].exchanges
    pairing = Pairing(app, db, x.app[0].connections, x.db[0].connections)
    keys = pairing._keys()
    pair_a, pair_d, ambiguous = pairing._pair_a, pairing._pair_d, pairing._ambiguous
    whole = pairing.complete()
    lost = {n for n in whole.notes if n.startswith("lost-at-")}
    assert lost, "the lossy copy leaves rows lost at a point"
    expected = set(zip(whole.app_row.tolist(), whole.db_row.tolist(), whole.notes.tolist()))

    parts = 3
    # pieces of 256 bytes of the request streams (this capture's connections are shorter than one 64 KiB piece of
    # the buckets): an exchange's app and DB rows stay together, a connection's rows lie in every partition
    part_a = (app["req_tcp_seq"].to_numpy(dtype=np.int64) >> 8) % parts
    part_d = (db["req_tcp_seq"].to_numpy(dtype=np.int64) >> 8) % parts
    pieces = []
    for p in range(parts):
        ra, rd = np.flatnonzero(part_a == p), np.flatnonzero(part_d == p)
        sub = (app.iloc[ra].reset_index(drop=True), db.iloc[rd].reset_index(drop=True),
               tuple(k[ra] for k in keys[0::2]), tuple(k[rd] for k in keys[1::2]))
        pieces.append((ra, rd, sub))
    spans_a, spans_d, found = [], [], []
    for ra, rd, (a, d, ka, kd) in pieces:  # the first pass: each connection's paired ordinals
        ai, di, _, _, ok, _ = pairs_inside(a, d, tuple(v for pair in zip(ka, kd) for v in pair), pair_a, pair_d)
        spans_a.append(paired_spans(ka[0], a["seq"].to_numpy(), ai[ok]))
        spans_d.append(paired_spans(kd[0], d["seq"].to_numpy(), di[ok]))
    spans = (combined_spans(spans_a), combined_spans(spans_d))
    assert (spans[0]["min"] < spans[0]["max"]).any()
    for ra, rd, (a, d, ka, kd) in pieces:
        inside = pairs_inside(a, d, tuple(v for pair in zip(ka, kd) for v in pair), pair_a, pair_d)[:5]
        rows = exchange_rows(a, d, inside, ka[0], kd[0], pair_a, pair_d, ambiguous, spans)
        found += zip(np.where(rows.app_row >= 0, ra[rows.app_row], -1).tolist(),
                     np.where(rows.db_row >= 0, rd[rows.db_row], -1).tolist(), rows.notes.tolist())
    assert len(found) == len(expected) and set(found) == expected
