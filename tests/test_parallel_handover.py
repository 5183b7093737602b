"""Results of forked children (the pools, workers.Worker, workers.Forked) cross to the parent by the handover: a big
one as a file in shared memory that the parent maps (workers._pack / _unpack). What arrives equals what the pipe
gives, the file is gone afterwards whatever happened, and without a writable directory the pipe carries it."""

from __future__ import annotations

import mmap
import os
import pickle
import resource
import shutil
import signal
import sys
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcapdecomp.analysis import Options, analyze
from pcapdecomp.core import workers
from pcapdecomp.read import extract as extraction
from pcapdecomp.read.exchanges import extract

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "captures" / "oltp-hogs" / "db.pcap"
sys.path.insert(0, str(REPO / "scripts"))

from lose_frames import lose_frames  # noqa: E402


@pytest.fixture
def handover_dir(tmp_path, monkeypatch):
    """A directory of the test's own for the files, and thresholds low enough that the bundled captures' small
    tables cross by a file (the children are forked after this, so they see it too)."""
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(workers, "HANDOVER_DIR", str(shm))
    monkeypatch.setattr(workers, "HANDOVER_MIN_BYTES", 0)
    monkeypatch.setattr(workers, "_ARRAY_FILE_MIN_BYTES", 1)
    return shm


def table(rows: int) -> pd.DataFrame:
    """Every kind of column the analysis sends back: categorical, nullable Int64 and boolean with missing values,
    string, datetime64[ns, UTC], float with NaN, and Python objects."""
    n = np.arange(rows)
    return pd.DataFrame({
        "frame": n,
        "command": pd.Categorical(np.array(["COM_QUERY", "COM_STMT_EXECUTE", "COM_PING"])[n % 3]),
        "rows": pd.array(np.where(n % 5 == 0, None, n), dtype="Int64"),
        "sql": pd.array([None if i % 11 == 0 else f"SELECT {i % 97}" for i in n], dtype="string"),
        "ok": pd.array(np.where(n % 7 == 0, None, n % 2 == 0), dtype="boolean"),
        "ts": pd.to_datetime(n * 1_000_003, utc=True),
        "ms": np.where(n % 13 == 0, np.nan, n / 3),
        "holes": [(i % 4, "gap") if i % 3 else None for i in n],
    })


def mapped(array) -> bool:
    """The array's memory is a map of a handover file (not a copy made by unpickling from the pipe)."""
    base = array
    while base is not None:
        if isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap):
            return True
        base = getattr(base, "base", None) if not isinstance(base, memoryview) else base.obj
    return False


def column_arrays(df: pd.DataFrame):
    return [block.values._ndarray if hasattr(block.values, "_ndarray") else
            getattr(block.values, "_data", getattr(block.values, "codes", block.values))
            for block in df._mgr.blocks]


def same_extraction(a, b) -> None:
    assert a.exchanges.equals(b.exchanges)
    assert a.connections.equals(b.connections)
    assert a.quality() == b.quality()
    assert a.commands == b.commands
    assert a.holes == b.holes and a.flow_first_frames == b.flow_first_frames


def test_a_table_crosses_by_the_file_equal_to_the_pipe(handover_dir):
    expected = table(20_000)
    big, small = workers.run_all(table, [(20_000,), (3,)], 2)
    pd.testing.assert_frame_equal(big, expected, check_exact=True)
    pd.testing.assert_frame_equal(big, pickle.loads(pickle.dumps(expected)), check_exact=True)  # what the pipe gives
    pd.testing.assert_frame_equal(small, table(3), check_exact=True)
    assert any(mapped(a) for a in column_arrays(big))
    assert list(handover_dir.iterdir()) == []


def test_a_mapped_table_takes_writes_in_place(handover_dir):
    """pandas writes into its arrays (loc, +=, fillna(inplace)): a copy-on-write map takes them, privately."""
    with workers.Forked(table, 20_000) as child:
        got = child.result()
    assert any(mapped(a) for a in column_arrays(got))
    got.loc[5, "rows"] = -1
    got.loc[7, "ok"] = True
    got["frame"] += 10
    got["command"] = got["command"].cat.add_categories("COM_QUIT")
    got.loc[0, "command"] = "COM_QUIT"
    expected = table(20_000)
    expected.loc[5, "rows"] = -1
    expected.loc[7, "ok"] = True
    expected["frame"] += 10
    expected["command"] = expected["command"].cat.add_categories("COM_QUIT")
    expected.loc[0, "command"] = "COM_QUIT"
    pd.testing.assert_frame_equal(got, expected, check_exact=True)
    assert list(handover_dir.iterdir()) == []


def test_an_extraction_from_a_worker_equals_one_made_here(handover_dir):
    here = extract(CAPTURE)
    with workers.Worker() as worker:
        there = worker.submit(extract, CAPTURE).result()
        there.exchanges  # noqa: B018 - made here, from the Arrow tables that came over
    same_extraction(there, here)
    assert list(handover_dir.iterdir()) == []


def test_extract_all_with_two_jobs_equals_one_job(handover_dir):
    paths = [CAPTURE, REPO / "captures" / "oltp-hogs" / "app.pcap"]
    one = extraction.extract_all(paths, None, 1 << 20, 1)
    two = extraction.extract_all(paths, None, 1 << 20, 2)
    for a, b in zip(one, two):
        same_extraction(a, b)
    assert any(mapped(a) for a in column_arrays(two[1].exchanges))  # read by the worker (_work), the first here
    assert list(handover_dir.iterdir()) == []


@pytest.mark.parametrize("where", ["missing", "a file"])
def test_without_a_writable_directory_the_pipe_carries_it(tmp_path, monkeypatch, where):
    not_a_directory = tmp_path / where
    if where == "a file":
        not_a_directory.write_text("")
    monkeypatch.setattr(workers, "HANDOVER_DIR", str(not_a_directory))
    monkeypatch.setattr(workers, "HANDOVER_MIN_BYTES", 0)
    got = workers.run_all(table, [(20_000,), (5,)], 2)[0]
    with workers.Forked(table, 20_000) as child:
        forked = child.result()
    for df in (got, forked):
        pd.testing.assert_frame_equal(df, table(20_000), check_exact=True)
        assert not any(mapped(a) for a in column_arrays(df))


def test_switched_off_the_pipe_carries_it(monkeypatch):
    monkeypatch.setattr(workers, "HANDOVER_DIR", "")
    monkeypatch.setattr(workers, "HANDOVER_MIN_BYTES", 0)
    got = workers.run_all(table, [(20_000,), (5,)], 2)[0]
    pd.testing.assert_frame_equal(got, table(20_000), check_exact=True)
    assert not any(mapped(a) for a in column_arrays(got))


def fail(rows: int):
    raise ValueError(f"no {rows} rows")


def table_or_fail(rows: int):
    return table(rows) if rows > 7 else fail(rows)


def test_no_file_is_left_after_a_workers_exception(handover_dir):
    with pytest.raises(ValueError, match="no 7 rows"):
        workers.run_all(table_or_fail, [(20_000,), (7,), (30_000,)], 2)
    assert list(handover_dir.iterdir()) == []
    with pytest.raises(ValueError, match="no 9 rows"):
        with workers.Forked(fail, 9) as child:
            child.result()
    assert list(handover_dir.iterdir()) == []


def written_then_killed(prefix: str):
    """A child killed after it wrote its file and before it sent its name: the file is the parent's to remove."""
    name = workers._pack(table(20_000), prefix).path
    assert os.path.exists(name)
    os.kill(os.getpid(), signal.SIGKILL)


def test_no_file_is_left_after_a_worker_is_killed(handover_dir):
    with pytest.raises(BrokenProcessPool):
        with workers.worker_pool(1) as pool:
            pool.submit(written_then_killed, pool._prefix).result()
    assert list(handover_dir.iterdir()) == []
    # the prefixes number the pools and Forked children of this process: the next Forked takes the one after this
    pid, number = workers._handover_prefix().split("-")[1:3]
    with pytest.raises(RuntimeError, match="ended without its result"):
        with workers.Forked(written_then_killed, f"pcapdecomp-{pid}-{int(number) + 1}-") as child:
            child.result()
    assert list(handover_dir.iterdir()) == []


def test_analyze_of_a_pair_lossy_at_both_points_on_mapped_tables_writes_what_jobs_one_writes(handover_dir, tmp_path,
                                                                                            monkeypatch):
    """Every array of every worker's result (the extraction's, the clock's, the repair's re-read in
    workers.Worker, the query profile) comes through a file, and the stages after them run on the maps."""
    lossy = REPO / "captures" / "oltp-prepared"
    pair = tmp_path / "pair"
    pair.mkdir()
    for name in ("capture.toml", "slow.log"):
        shutil.copyfile(lossy / name, pair / name)
    lose_frames(lossy / "app.pcap", pair / "app.pcap", 0.03, 21)
    lose_frames(lossy / "db.pcap", pair / "db.pcap", 0.03, 1021)
    monkeypatch.chdir(tmp_path)  # summary.json names the working folder: the same for both runs
    handed: list[int] = []
    pack = workers._pack
    monkeypatch.setattr(workers, "_unpack", lambda value, unpack=workers._unpack: (
        handed.append(isinstance(value, workers._Handover)), unpack(value))[1])
    runs = {jobs: analyze(pair, Options(quiet=True, jobs=jobs, command_line="pcapdecomp analyze (test)"),
                          tmp_path / f"jobs{jobs}") for jobs in (1, 2)}
    assert workers._pack is pack
    assert runs[1].summary["repair"]["bytes_borrowed"] > 0
    assert sum(handed) >= 3  # the extraction's worker, the repair's Worker, the query profile
    for name in ("exchanges.parquet", "groups.parquet", "pool.parquet", "summary.json", "report.html"):
        assert (tmp_path / "jobs1" / name).read_bytes() == (tmp_path / "jobs2" / name).read_bytes(), name
    assert list(handover_dir.iterdir()) == []



def little_room() -> None:
    """In a child: writes beyond 64 KiB fail midway (a file size limit), as they fail with ENOSPC on a full
    /dev/shm."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails (EFBIG) instead of ending the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))


def packed_with_little_room(directory: str):
    little_room()
    packed = workers._pack(table(20_000), "pcapdecomp-little-room-")
    return isinstance(packed, pd.DataFrame), sorted(os.listdir(directory))


def table_with_little_room(rows: int) -> pd.DataFrame:
    little_room()
    return table(rows)


def test_a_write_that_fails_midway_leaves_no_file_and_the_pipe_carries_it(handover_dir):
    with workers.Forked(packed_with_little_room, str(handover_dir)) as child:
        as_is, files_then = child.result()
    assert as_is and files_then == []  # the partial file was removed at once, not when the Forked context ended
    with workers.Forked(table_with_little_room, 20_000) as child:
        got = child.result()
    pd.testing.assert_frame_equal(got, table(20_000), check_exact=True)
    assert not any(mapped(a) for a in column_arrays(got))
    assert list(handover_dir.iterdir()) == []
