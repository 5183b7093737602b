"""The extraction's spill (read/spill.py, docs/partitioned.md §5 step 3): a capture whose exchange rows went into
the 256 buckets by the partition key, read back, is the table the in-memory extraction makes: the same values,
dtypes, categories and row order, on every bundled capture and test capture, in parts (--jobs) and serially, lossy,
decrypted and compressed. And step 4: Pairing's connection step made from the buckets, a bucket at a time, gives
the same connection pairs and counts as on the tables."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pcapdecomp.core.tables import concat
from pcapdecomp.mysql.tls import parse_keylog
from pcapdecomp.pair.match import Pairing, spilled_connection_step
from pcapdecomp.read import extract as extraction
from pcapdecomp.read import spill
from pcapdecomp.read.exchanges import extract, merge_parts

REPO = Path(__file__).resolve().parents[1]
BUNDLED = sorted((REPO / "captures").glob("*/*.pcap*"))
TEST_DATA = sorted((REPO / "tests" / "data").rglob("*.pcap*"))
sys.path.insert(0, str(REPO / "scripts"))

from lose_frames import lose_frames  # noqa: E402


def same(memory, spilled) -> None:
    """Everything the in-memory extraction holds, equal in the spilled one (read back from its buckets)."""
    assert spilled.spill is not None
    assert int(spilled.spill.rows.sum()) == len(memory.exchanges)
    # exact: floats to the bit, categoricals by their codes and categories (pandas compares those when exact)
    pd.testing.assert_frame_equal(memory.exchanges, spilled.exchanges, check_exact=True)
    pd.testing.assert_frame_equal(memory.connections, spilled.connections, check_exact=True)
    assert memory.quality() == spilled.quality()
    assert memory.commands == spilled.commands
    assert memory.flow_first_frames == spilled.flow_first_frames


def buckets_of(x) -> np.ndarray:
    return spill.partition_buckets(x.exchanges["req_tcp_seq"].to_numpy(dtype=np.int64))


@pytest.mark.parametrize("path", BUNDLED + TEST_DATA, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_spilled_capture_reads_back_as_the_in_memory_table(path, tmp_path, read_capture):
    memory = read_capture(path)
    spilled = extract(path, spill=tmp_path)
    # each row in the bucket of its key, every bucket's file holding what the counts say
    counts = np.bincount(buckets_of(memory), minlength=spill.BUCKETS)
    assert (spilled.spill.rows == counts).all()
    for bucket in np.flatnonzero(counts):
        assert sum(b.num_rows for b in spilled.spill.bucket(int(bucket))) == counts[bucket]
    same(memory, spilled)


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "python"])
def test_a_window_spills_the_dictionary_entries_of_the_rows_it_dropped(lane, tmp_path, monkeypatch):
    """analyze --since/--until drops a batch's rows outside the window before it is spilled: the in-memory table
    keeps the dropped rows' dictionary entries among its categories (unused), and so does the spill's table read
    back (SpillWriter keeps them: Spill.unused_values), where the buckets' compacted slices do not hold them."""
    import datetime as dt

    from pcapdecomp.core.window import window_of

    if not lane:
        monkeypatch.setenv("PCAPDECOMP_NO_LANE", "1")
    path = REPO / "captures" / "oltp-prepared" / "db.pcap"
    window = window_of("2026-11-23T20:20:33Z", "2026-11-23T20:20:34.2Z", dt.timezone.utc)
    memory = extract(path, window=window)
    spilled = extract(path, window=window, spill=tmp_path)
    same(memory, spilled)
    unused = spilled.spill.unused_values()
    command = memory.exchanges["command"]
    assert "COM_STMT_PREPARE" in unused["command"] and "COM_STMT_PREPARE" in command.cat.categories
    assert not (command == "COM_STMT_PREPARE").any()  # made before the window: an entry no row holds
    assert extract(path, spill=tmp_path / "whole").spill.unused_values() == {}  # without a window: none


@pytest.mark.parametrize("name", ["oltp-hogs/db.pcap", "features/db.pcap", "group-stall/app.pcap"])
def test_the_python_reader_spills_what_the_lane_spills(name, tmp_path, monkeypatch, read_capture):
    """Without the lane the rows come in Python's chunks (8,192 rows), not the lane's batches."""
    monkeypatch.setenv("PCAPDECOMP_NO_LANE", "1")
    path = REPO / "captures" / name
    spilled = extract(path, spill=tmp_path)
    assert spilled.native_frames == 0
    same(read_capture(path), spilled)


@pytest.mark.parametrize("n", [2, 3])
def test_parts_spill_and_merge_into_the_serial_table(n, tmp_path, read_capture):
    """--jobs: each part spills into its own folder; merge_parts renumbers the connections, in the table and in
    the buckets it hands on (a part's conn_index → the merged one)."""
    path = REPO / "captures" / "oltp-hogs" / "app.pcap"
    serial = read_capture(path)
    parts = [extract(path, part=(i, n), spill=tmp_path / f"part-{i}") for i in range(n)]
    merged = merge_parts(parts)
    same(serial, merged)
    assert len(merged.spill.parts) == n
    # the merged buckets, read back with the connections renumbered, are the serial table too
    table = merged.spill.table()
    assert table.column("conn_index").to_pylist() == serial.exchanges["conn_index"].tolist()
    assert table.column("sql").to_pylist() == serial.exchanges["sql"].astype(object).where(
        serial.exchanges["sql"].notna(), None).tolist()
    bucket = int(np.flatnonzero(merged.spill.rows)[0])
    in_bucket = serial.exchanges[buckets_of(serial) == bucket]
    read = pa.Table.from_batches(merged.spill.bucket(bucket))
    assert sorted(zip(read.column("conn_index").to_pylist(), read.column("seq").to_pylist())) == \
        sorted(zip(in_bucket["conn_index"], in_bucket["seq"]))


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "python"])
def test_extract_all_spills_in_worker_processes(lane, tmp_path, monkeypatch, read_capture):
    """--jobs: the worker processes spill too (without the lane a capture is read in parts by connection)."""
    monkeypatch.setattr(extraction, "SMALL_CAPTURE_BYTES", 0)  # the bundled captures are small: force the pool
    if not lane:
        monkeypatch.setenv("PCAPDECOMP_NO_LANE", "1")
    paths = [REPO / "captures" / "oltp-hogs" / "app.pcap", REPO / "captures" / "oltp-hogs" / "db.pcap"]
    forked = extraction.extract_all(paths, None, 1 << 20, jobs=3, spill=tmp_path)
    for path, x in zip(paths, forked):
        same(read_capture(path), x)
    folders = {p.name for p in tmp_path.iterdir()}
    # a folder per capture, or per part of a capture the pool split
    assert {f[:len("capture-00")] for f in folders} == {"capture-00", "capture-01"}
    assert any("-part-" in f for f in folders) == (not lane)


def test_a_lossy_capture_spills_with_its_holes(tmp_path, read_capture):
    lossy = tmp_path / "db.pcap"
    lose_frames(REPO / "captures" / "oltp-hogs" / "db.pcap", lossy, 0.05, seed=11)
    memory = extract(lossy)
    assert memory.quality()["gaps"] > 0 and memory.holes
    spilled = extract(lossy, spill=tmp_path / "spill")
    same(memory, spilled)
    assert spilled.holes == memory.holes


def test_a_decrypted_and_a_compressed_capture_spill(tmp_path, read_capture):
    name = "group-stall-tls12"
    secrets = parse_keylog((REPO / "captures" / name / "tls-keys.log").read_text())
    memory = extract(REPO / "captures" / name / "db.pcap", tls_secrets=secrets)
    assert memory.quality()["tls_decrypted_connections"] > 0
    same(memory, extract(REPO / "captures" / name / "db.pcap", tls_secrets=secrets, spill=tmp_path / "tls"))
    compressed = REPO / "captures" / "features" / "db.pcap"
    memory = read_capture(compressed)
    assert (memory.exchanges["compressed"] == "zlib").any()
    same(memory, extract(compressed, spill=tmp_path / "zlib"))


def test_the_key_is_the_piece_of_the_request_stream_hashed():
    """partition_buckets: seq >> 16 as decimal text, hashed by stable_hash, modulo 256; the same in every process
    (a fixed value here: blake2b, not Python's salted hash)."""
    seqs = np.array([0, 65535, 65536, 123_456_789, 2**32 - 1], dtype=np.int64)
    expected = spill.stable_hash((seqs >> 16).astype(str).astype(object)) % 256
    assert (spill.partition_buckets(seqs) == expected).all()
    assert spill.partition_buckets(seqs)[0] == spill.partition_buckets(seqs)[1]  # one piece, one bucket
    assert int(spill.stable_hash(np.array(["0"], dtype=object))[0]) == \
        int.from_bytes(__import__("hashlib").blake2b(b"0", digest_size=8).digest(), "little") >> 1


def test_a_bucket_gets_the_dictionary_entries_its_rows_use():
    """A slice shares its batch's dictionary; each bucket's file gets only the entries its rows use, the values
    unchanged (nulls too)."""
    dictionary = pa.array([f"SELECT {i}" for i in range(1000)])
    indices = pa.array([5, None, 999, 5, 7], type=pa.int32())
    array = pa.DictionaryArray.from_arrays(indices, dictionary).slice(1, 4)
    compacted = spill._compacted(array)
    assert compacted.dictionary.to_pylist() == ["SELECT 5", "SELECT 7", "SELECT 999"]
    assert compacted.to_pylist() == array.to_pylist() == [None, "SELECT 999", "SELECT 5", "SELECT 7"]


# --- step 4: Pairing's connection step from the buckets -------------------------------------------------------

PAIRED_SETS = sorted(d for d in (REPO / "captures").iterdir() if (d / "app.pcap").exists() and (d / "db.pcap").exists())


def assert_same_connection_step(app: list, db: list) -> None:
    """spilled_connection_step of the spilled points = Pairing's connection step on their tables (the pairs, in
    order, and every count MatchStats takes from that step)."""
    step = spilled_connection_step(app, db)
    pairing = Pairing(concat([x.exchanges for x in app]), concat([x.exchanges for x in db]),
                      concat([x.connections for x in app]), concat([x.connections for x in db]))
    pd.testing.assert_frame_equal(step.connections, pairing.connections, check_exact=True)
    assert (step.pair_a.tolist(), step.pair_d.tolist()) == (pairing._pair_a.tolist(), pairing._pair_d.tolist())
    assert (step.vetoed, step.ambiguous, step.ambiguous_keys, step.work) == \
        (pairing._vetoed, pairing._ambiguous, pairing._ambiguous_keys, pairing._work)
    stats = pairing.complete().stats
    assert stats.connections_matched == len(step.connections)
    assert stats.candidates >= step.work


@pytest.mark.parametrize("folder", PAIRED_SETS, ids=lambda d: d.name)
def test_the_connection_step_from_the_buckets_is_pairings(folder, tmp_path):
    app = [extract(folder / "app.pcap", spill=tmp_path / "app")]
    db = [extract(folder / "db.pcap", spill=tmp_path / "db")]
    assert_same_connection_step(app, db)


def test_the_connection_step_from_buckets_of_parts_and_of_a_lossy_point(tmp_path):
    """Parts (--jobs): the merged buckets renumber the connections as merge_parts does; a lossy DB point: its
    connections hold holes. Two app points, the second a copy of the first (the same capture name twice would
    share keys; a copy under another name does not)."""
    hogs = REPO / "captures" / "oltp-hogs"
    lossy = tmp_path / "db.pcap"
    lose_frames(hogs / "db.pcap", lossy, 0.05, seed=11)
    app = merge_parts([extract(hogs / "app.pcap", part=(i, 2), spill=tmp_path / f"app-{i}") for i in range(2)])
    db = extract(lossy, spill=tmp_path / "db")
    assert db.holes
    assert_same_connection_step([app], [db])
    (tmp_path / "copy").mkdir()
    copy = tmp_path / "copy" / "app.pcap"
    copy.write_bytes((hogs / "app.pcap").read_bytes())
    assert_same_connection_step([app, extract(copy, spill=tmp_path / "copy-spill")], [db])
