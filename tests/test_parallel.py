"""--jobs: a capture read in parts by several processes gives exactly what one process gives; the native row walker
gives exactly what its Python twin gives."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from corpus import CORPUS, captures
from hypothesis import given, settings
from hypothesis import strategies as st

from pcapdecomp.core import workers
from pcapdecomp.core.errors import InputError
from pcapdecomp.mysql import walk
from pcapdecomp.read import extract as extraction
from pcapdecomp.read.exchanges import extract, merge_parts

REPO = Path(__file__).resolve().parents[1]
BUNDLED = sorted(p for p in (REPO / "captures").glob("*/*.pcap*"))


def same(a, b) -> None:
    assert a.exchanges.equals(b.exchanges)
    assert a.connections.equals(b.connections)
    assert a.quality() == b.quality()
    assert a.commands == b.commands
    assert (a.other_tcp_frames, a.other_tcp_bytes) == (b.other_tcp_frames, b.other_tcp_bytes)


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize("n", [2, 3])
def test_parts_of_a_bundled_capture_merge_into_the_serial_result(path, n, read_capture):
    serial = read_capture(path)
    parts = [extract(path, part=(i, n)) for i in range(n)]
    assert sum(len(p.exchanges) for p in parts) == len(serial.exchanges)
    same(serial, merge_parts(parts))


def test_parts_of_every_corpus_capture_merge_into_the_serial_result(read_capture):
    """Mid-stream starts, port reuse, learned servers, other TCP, damaged files: 125 captures written by others."""
    rows = captures()
    if not rows:
        pytest.skip("corpus not found")
    checked = 0
    for row in rows:
        path = CORPUS / row["path"]
        serial = read_capture(path)
        same(serial, merge_parts([extract(path, part=(i, 2)) for i in range(2)]))
        checked += 1
    assert checked == len(rows)


def test_a_part_that_parses_nothing_still_counts_its_connections():
    """Connections are split by ports: with many parts, some parts have no MySQL connection at all."""
    path = REPO / "captures" / "features" / "db.pcap"
    serial = extract(path)
    n = len(serial.connections) + 3
    parts = [extract(path, part=(i, n)) for i in range(n)]
    assert any(len(p.exchanges) == 0 for p in parts)
    same(serial, merge_parts(parts))


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "python"])
def test_extract_all_in_worker_processes_equals_one_process(monkeypatch, lane):
    """With the native lane each capture is one task; without it (Python alone) captures are also split into
    parts by connection. Both give what one process gives."""
    monkeypatch.setattr(extraction, "SMALL_CAPTURE_BYTES", 0)  # the bundled captures are small: force the pool
    if not lane:
        monkeypatch.setenv("PCAPDECOMP_NO_LANE", "1")
    paths = [REPO / "captures" / "oltp-hogs" / "app.pcap", REPO / "captures" / "oltp-hogs" / "db.pcap"]
    seen: list[tuple[int, int, int]] = []
    forked = extraction.extract_all(paths, None, 1 << 20, jobs=3, progress=lambda d, t, f: seen.append((d, t, f)))
    for path, x in zip(paths, forked):
        same(extract(path), x)
    total = sum(p.stat().st_size for p in paths)
    assert seen and all(t == total for _, t, _ in seen)
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)


@pytest.mark.parametrize("bad_first", [False, True], ids=["in-a-worker", "in-this-process"])
def test_a_worker_error_reaches_the_caller_as_itself(tmp_path, monkeypatch, bad_first):
    """The first capture is read by this process itself (a task per process), the second by a worker: an error in
    either reaches the caller as itself."""
    monkeypatch.setattr(extraction, "SMALL_CAPTURE_BYTES", 0)
    bad = tmp_path / "not-a-capture.pcap"
    bad.write_bytes(b"this is not a capture file at all" * 10)
    good = REPO / "captures" / "features" / "db.pcap"
    with pytest.raises(InputError, match="not-a-capture.pcap"):
        extraction.extract_all([bad, good] if bad_first else [good, bad], None, 1 << 20, jobs=2)


@pytest.mark.parametrize(
    ("sizes", "jobs", "parts"),
    [
        ([100 << 20], 1, [1]),
        ([100 << 20], 4, [4]),
        ([1 << 20], 4, [1]),  # small: serial
        ([100 << 20, 100 << 20], 2, [1, 1]),
        ([300 << 20, 100 << 20], 4, [3, 1]),
        ([100 << 20] * 3, 2, [1, 1, 1]),
    ],
)
def test_plan_shares_workers_by_size(sizes, jobs, parts):
    assert extraction.plan(sizes, jobs) == parts


def test_plan_keeps_captures_the_native_lane_reads_whole():
    assert extraction.plan([300 << 20, 100 << 20], 4, [False, True]) == [1, 1]
    assert extraction.plan([300 << 20, 100 << 20], 4, [True, False]) == [3, 1]


def test_run_all_keeps_the_order_of_calls():
    assert workers.run_all(pow, [(2, k) for k in range(6)], jobs=2) == [2**k for k in range(6)]


# --- the native row walker and its Python twin --------------------------------------------------------------


def _rows(lengths: list[int], first_seq: int, tail: bytes) -> bytes:
    out = bytearray()
    for k, length in enumerate(lengths):
        out += length.to_bytes(3, "little") + bytes([(first_seq + k) & 0xFF]) + b"\x03" + b"r" * (length - 1)
    return bytes(out) + tail


@pytest.mark.skipif(walk.walk_rows_native is None, reason="native extension not built")
@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 300), st.integers(0, 255))
def test_native_walker_equals_python_on_any_bytes(data, pos, expect):
    assert walk.walk_rows_native(data, pos, expect) == walk.walk_rows_py(data, pos, expect)


@pytest.mark.skipif(walk.walk_rows_native is None, reason="native extension not built")
@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 600), max_size=40), st.integers(0, 255),
       st.sampled_from([b"", b"\x05\x00\x00\x00\xfe\x00\x00\x02\x00", b"\xff", b"\x00\x00\x00\x00"]))
def test_native_walker_equals_python_on_row_runs(lengths, first_seq, tail):
    data = _rows(lengths, first_seq, tail)
    got = walk.walk_rows_native(data, 0, first_seq)
    assert got == walk.walk_rows_py(data, 0, first_seq)
    assert got[1] == len(lengths)  # every row counted, the tail never
    assert got[2] == (first_seq + len(lengths)) & 0xFF


def test_native_walker_is_built_where_a_compiler_is():
    """The install builds the extension when cc exists; a silent build failure would cost the speed unnoticed."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    assert walk.NATIVE


# --- Forked: a call in a child that shares this process's memory ----------------------------------------------


def test_forked_call_sees_this_process_memory_and_returns_its_result():
    table = list(range(100_000))  # not pickled on the way in: the child sees it as it is
    with workers.Forked(sum, table) as child:
        assert child.result() == sum(table)


def test_forked_call_error_reaches_the_caller_as_itself(tmp_path):
    from pcapdecomp.read.exchanges import extract

    bad = tmp_path / "not-a-capture.pcap"
    bad.write_bytes(b"this is not a capture file at all" * 10)
    with workers.Forked(extract, bad) as child, pytest.raises(InputError, match="not-a-capture.pcap"):
        child.result()


def test_leaving_a_forked_call_early_ends_the_child():
    import time

    with pytest.raises(ZeroDivisionError):
        with workers.Forked(time.sleep, 60) as child:
            1 / 0
    assert not child._process.is_alive() and child._process.exitcode is not None


# --- Ahead: calls started on workers before their results are wanted --------------------------------------------


def test_ahead_ends_its_workers_when_told_not_at_the_end_of_its_context():
    # A worker left alive makes this process's writes to pages it had at the fork copies of them: analysis ends the
    # read-ahead's workers once the clock took its passes, not when the whole run ends.
    import multiprocessing as mp

    before = set(mp.active_children())
    with workers.Ahead(2) as ahead:
        futures = ahead.start_all(sum, [(range(1000),), (range(10),)])
        assert [f.result() for f in futures] == [sum(range(1000)), sum(range(10))]
        assert set(mp.active_children()) - before  # the worker is there until told
        ahead.end()
        assert not set(mp.active_children()) - before
    assert workers.Ahead(1).start_all(sum, [(range(3),)]) is None  # one job: nothing ahead, nothing to end
