"""The partitioned analysis' row key and merged writer (docs/partitioned.md §2.3): pair.match.row_key must sort
today's exchanges table into today's order, and core.outputs.write_merged, given today's table cut into P
partitions by the plan's key (§3), each sorted by the row key, and the dictionaries explain.servers.
output_categories states, must write the very file analyze wrote (filecmp, byte for byte). On every bundled capture
set with both points, and on copies cut from them: frames lost at the app (the repair re-reads connections), the
two captures' windows shifted apart (rows only the app saw and rows only the DB saw, without a proxy), the app's
connections split between two app points. The same checks on the public corpus and the recordings:
benchmarks/merged_writer.py (whose functions these tests call)."""

from __future__ import annotations

import filecmp
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcapdecomp.analysis import Options, capture_set
from pcapdecomp.core import outputs
from pcapdecomp.core.outputs import KeyFile, SortedRun, merged_order, write_merged, write_table
from pcapdecomp.pair.match import APP_ONLY, DB_ONLY, KEPT, MATCHED, ROW_KEY_FIELDS, row_key

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
_spec = importlib.util.spec_from_file_location("merged_writer", REPO / "benchmarks" / "merged_writer.py")
merged_writer = importlib.util.module_from_spec(_spec)
sys.modules["merged_writer"] = merged_writer  # its dataclass looks its module up by name
_spec.loader.exec_module(merged_writer)
sys.path.insert(0, str(REPO / "scripts"))

from lose_frames import lose_frames  # noqa: E402

# every bundled set with an app and a DB capture (the proxy sets' too: through a proxy the two ends' tables order
# the rows the same way)
PAIRS = sorted(p.name for p in CAPTURES.iterdir() if (p / "app.pcap").exists() and (p / "db.pcap").exists())
PARTS = (1, 3, 16)


def check_bundled(bundled_analysis, name: str, work: Path) -> np.ndarray:
    """The shared analysis of captures/NAME: its keys sort its table, output_categories gives its categories, and
    the merged file of each P in PARTS is the file it wrote. Returns the keys."""
    result = bundled_analysis(name)
    table = result.held_exchanges  # the table as the run wrote it
    inputs = merged_writer.paired_inputs(capture_set(CAPTURES / name), Options(quiet=True))
    assert len(inputs.keys) == len(table) > 0
    assert merged_writer.key_sorts_the_table(inputs.keys)
    categories = merged_writer.categories_of(table, inputs)
    for column, wanted in categories.items():
        assert list(table[column].cat.categories) == wanted, column
    for parts in PARTS:
        merged = work / f"merged-{parts}.parquet"
        write_merged(merged_writer.sorted_runs(table, inputs.keys, parts, seed=parts), merged, categories)
        assert filecmp.cmp(result.out_dir / "exchanges.parquet", merged, shallow=False), parts
    return inputs.keys


@pytest.mark.parametrize("name", PAIRS)
def test_the_merged_runs_are_the_file_analyze_wrote(bundled_analysis, tmp_path, name):
    keys = check_bundled(bundled_analysis, name, tmp_path)
    classes = set(np.unique(keys[:, ROW_KEY_FIELDS.index("class")]).tolist())
    # proxy-pool is the bundled set with rows seen at one end only
    assert classes == ({MATCHED, APP_ONLY, DB_ONLY} if name == "proxy-pool" else {MATCHED})


def test_many_row_groups_and_small_merge_steps(bundled_analysis, tmp_path, monkeypatch):
    """Row groups of 500 rows (oltp-hogs: 7 of them) for both writers, and a merge that looks at 7 rows of each run
    at a time: the row groups' edges and the merge's bound fall inside the runs."""
    result = bundled_analysis("oltp-hogs")
    table = result.held_exchanges
    inputs = merged_writer.paired_inputs(capture_set(CAPTURES / "oltp-hogs"), Options(quiet=True))
    monkeypatch.setattr(outputs, "PARQUET_ROWS_PER_GROUP", 500)
    monkeypatch.setattr(outputs, "MERGE_STEP", 7)
    write_table(table, tmp_path / "today.parquet")
    categories = merged_writer.categories_of(table, inputs)
    for parts in (1, 16):
        write_merged(merged_writer.sorted_runs(table, inputs.keys, parts), tmp_path / "merged.parquet", categories)
        assert filecmp.cmp(tmp_path / "today.parquet", tmp_path / "merged.parquet", shallow=False), parts
    import pyarrow.parquet as pq

    assert pq.ParquetFile(tmp_path / "merged.parquet").metadata.num_row_groups == 7


def _copy_set(name: str, folder: Path, app: Path | None = None, db: Path | None = None) -> Path:
    folder.mkdir()
    for part in ("capture.toml", "slow.log"):
        shutil.copyfile(CAPTURES / name / part, folder / part)
    shutil.copyfile(app or CAPTURES / name / "app.pcap", folder / "app.pcap")
    shutil.copyfile(db or CAPTURES / name / "db.pcap", folder / "db.pcap")
    return folder


def _frames(path: Path) -> int:
    done = subprocess.run(["capinfos", "-c", "-M", str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def check_copy(cs, tmp_path: Path) -> dict:
    found = merged_writer.check_set(cs, Options(quiet=True, jobs=1), tmp_path, PARTS)
    assert found["key_sorts"] and found["categories_as_today"], found
    assert all(found[f"same_{p}"] for p in PARTS), found
    return found


def test_rows_the_repair_read_again(tmp_path):
    """Frames lost at the app point of oltp-prepared: the repair re-reads its connections (rows appended after the
    kept ones, in the re-read's order, their bounded times null)."""
    lose_frames(CAPTURES / "oltp-prepared" / "app.pcap", tmp_path / "lossy.pcap", 0.03, 1)
    folder = _copy_set("oltp-prepared", tmp_path / "set", app=tmp_path / "lossy.pcap")
    found = check_copy(capture_set(folder), tmp_path)
    assert found["reread"] > 100


def test_rows_only_one_point_saw(tmp_path):
    """group-stall with the app capture's last tenth and the DB capture's first tenth of frames cut off: rows only
    the app saw and rows only the DB saw, paired directly (no proxy)."""
    source = CAPTURES / "group-stall"
    n = _frames(source / "app.pcap")
    subprocess.run(["editcap", "-r", str(source / "app.pcap"), str(tmp_path / "app.pcap"), f"1-{n * 9 // 10}"],
                   check=True, capture_output=True)
    subprocess.run(["editcap", "-r", str(source / "db.pcap"), str(tmp_path / "db.pcap"), f"{n // 10}-{n}"],
                   check=True, capture_output=True)
    folder = _copy_set("group-stall", tmp_path / "set", app=tmp_path / "app.pcap", db=tmp_path / "db.pcap")
    found = check_copy(capture_set(folder), tmp_path)
    assert found["classes"][APP_ONLY] > 10 and found["classes"][DB_ONLY] > 10


def test_two_app_points(tmp_path):
    """oltp-hogs' app capture split by TCP stream into two app points: each row's point index orders it."""
    source = CAPTURES / "oltp-hogs"
    for half, rule in (("even", "tcp.stream % 2 == 0"), ("odd", "tcp.stream % 2 == 1")):
        subprocess.run(["tshark", "-r", str(source / "app.pcap"), "-Y", rule, "-w", str(tmp_path / f"app-{half}.pcap")],
                       check=True, capture_output=True)
    cs = capture_set(source, app=[tmp_path / "app-even.pcap", tmp_path / "app-odd.pcap"])
    found = check_copy(cs, tmp_path)
    assert found["rows"] == 3023


# --- the pieces alone -----------------------------------------------------------------------------------------


@settings(max_examples=100)
@given(st.lists(st.lists(st.tuples(st.integers(-3, 3), st.integers(-2, 2)), max_size=60), min_size=1, max_size=8),
       st.integers(1, 20))
def test_merged_order_is_a_stable_sort_of_the_runs(runs, step):
    keys = [np.array(sorted(r), dtype=np.int64).reshape(-1, 2) for r in runs]
    got = [(int(a), int(b)) for run, row in merged_order(keys, step) for a, b in zip(run, row)]
    run = np.concatenate([np.full(len(k), i) for i, k in enumerate(keys)])
    row = np.concatenate([np.arange(len(k)) for k in keys])
    whole = np.concatenate(keys)
    order = np.lexsort((row, run, whole[:, 1], whole[:, 0]))  # equal keys: run by run
    assert got == list(zip(run[order].tolist(), row[order].tolist()))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(-3, 3), st.integers(-2, 2)), max_size=60), min_size=1, max_size=6),
       st.integers(1, 20))
def test_merged_order_of_key_files_is_that_of_the_arrays(runs, step):
    """Runs whose keys are files (KeyFile: the partitioned run's, docs/partitioned.md §26) merge as their arrays do,
    piece for piece; a KeyFile's slices, length, shape and whole array are the array's, and it is no mapping."""
    keys = [np.array(sorted(r), dtype=np.int64).reshape(-1, 2) for r in runs]
    with tempfile.TemporaryDirectory() as folder:
        files = [KeyFile.written(Path(folder) / f"{i:04d}.npy", k) for i, k in enumerate(keys)]
        for k, f in zip(keys, files):
            assert len(f) == len(k) and f.shape == k.shape and np.array_equal(f.whole(), k)
            for a, b in ((0, len(k)), (1, 3), (len(k) - 1, len(k) + 5), (5, 2)):
                assert np.array_equal(f[a:b], k[a:b]) and f[a:b].shape == k[a:b].shape
            assert np.array_equal(SortedRun(None, f).key, k)
        got = list(merged_order(files, step))
        expected = list(merged_order(keys, step))
        assert len(got) == len(expected)
        for (run, row), (run_expected, row_expected) in zip(got, expected):
            assert np.array_equal(run, run_expected) and np.array_equal(row, row_expected)
        maps = Path("/proc/self/maps")
        if maps.exists():
            assert folder not in maps.read_text()


@settings(max_examples=60, deadline=None)
@given(st.sets(st.tuples(st.integers(-4, 4), st.integers(-3, 3)), max_size=40),
       st.lists(st.tuples(st.integers(-5, 5), st.integers(-4, 4)), min_size=1, max_size=10))
def test_a_row_is_found_by_its_key_in_a_key_file_as_in_the_array(present, asked):
    """The binary search of the summary's culprits and outliers (summaryruns._row_with_key) finds in a KeyFile,
    through its map, the row it finds in the array: each key present at its row, an absent one nowhere; the map
    is gone once the search ends."""
    from pcapdecomp.explain.summaryruns import _row_with_key

    keys = np.array(sorted(present), dtype=np.int64).reshape(-1, 2)
    with tempfile.TemporaryDirectory() as folder:
        f = KeyFile.written(Path(folder) / "k.npy", keys)
        for key in [*map(tuple, keys.tolist()), *asked]:
            expected = sorted(present).index(key) if key in present else None
            assert _row_with_key(keys, np.array(key)) == expected
            assert _row_with_key(f, np.array(key)) == expected
        import gc

        gc.collect()
        maps = Path("/proc/self/maps")
        if maps.exists():
            assert folder not in maps.read_text()


def test_a_key_file_reads_slices_alone():
    keys = np.arange(12, dtype=np.int64).reshape(-1, 3)
    with tempfile.TemporaryDirectory() as folder:
        f = KeyFile.written(Path(folder) / "k.npy", keys)
        with pytest.raises(TypeError):
            f[[0, 1]]
        with pytest.raises(TypeError):
            f[0:4:2]
        np.save(Path(folder) / "flat.npy", np.arange(3))
        with pytest.raises(ValueError, match="row keys"):
            KeyFile(Path(folder) / "flat.npy")


def test_row_key_broadcasts_and_takes_times_as_ns():
    ts = np.array(["2026-11-22T05:43:14.000000001", "NaT"], dtype="datetime64[ns]")
    key = row_key(MATCHED, KEPT, 0, KEPT, ts, [3, 4], [1, 2])
    assert key.shape == (2, len(ROW_KEY_FIELDS)) and key.dtype == np.int64
    assert key[0, 4] == ts[0].astype(np.int64) and key[1, 4] == np.iinfo(np.int64).min  # NaT first, as sorted
    assert (key[:, :4] == [MATCHED, KEPT, 0, KEPT]).all()


def test_write_merged_refuses_what_it_cannot_write_as_today(bundled_analysis, tmp_path):
    table = bundled_analysis("group-stall").held_exchanges
    keys = np.arange(len(table), dtype=np.int64).reshape(-1, 1)
    categories = {c: list(table[c].cat.categories) for c in table.columns if table[c].dtype == "category"}
    with pytest.raises(ValueError, match="values not among"):
        write_merged([SortedRun(table, keys)], tmp_path / "x.parquet", {**categories, "sql": ["SELECT 1"]})
    with pytest.raises(ValueError, match="keys"):
        write_merged([SortedRun(table, keys[:-1])], tmp_path / "x.parquet", categories)
    assert not (tmp_path / "x.parquet").exists()
    write_merged([SortedRun(table.iloc[:0], keys[:0])], tmp_path / "empty.parquet", categories)
    write_table(table.iloc[:0], tmp_path / "today-empty.parquet")
    assert filecmp.cmp(tmp_path / "empty.parquet", tmp_path / "today-empty.parquet", shallow=False)
