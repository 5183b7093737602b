"""core.framefile.FrameFile, the Arrow IPC file `analyze --spill` keeps its partitions and 7a's runs in (instead of
pickles, docs/partitioned.md §19): a table written and read back whole, by slices across its batches, by a copy of
the object (as a Dask worker hands one back) and by a process that knows only the path (`FrameFile.of`) is the same
table exactly — the columns, every dtype (a categorical's categories, their Index's dtype and its codes' width;
nullable integers and booleans; Arrow text; times with their zone), nulls where nulls and floats bit for bit (a NaN
of other bits, −0.0). On the tables `analyze` made of bundled sets (their text, errors, TLS, prepared statements,
stalls), as analyze holds them and in the declared dtypes the partitions are stored in. A file changed behind the
run is an error, never other rows; categories JSON cannot keep are refused when written. The stored partition
leaves no pickle in the folder."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from pcapdecomp.core.framefile import FrameFile
from pcapdecomp.core.tables import with_declared_dtypes
from pcapdecomp.run import spilled

SETS = ("group-stall", "oltp-prepared-tls13", "connection-refused", "slowlog-forms")


def assert_same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """The same frame exactly: columns, index, dtypes (categories and their dtype, code widths), values and float
    bits."""
    pd.testing.assert_frame_equal(a, b, check_exact=True, check_categorical=True)
    assert list(a.dtypes) == list(b.dtypes)
    for name in a.columns:
        x, y = a[name], b[name]
        if isinstance(x.dtype, pd.CategoricalDtype):
            assert x.cat.categories.dtype == y.cat.categories.dtype, name
            assert x.cat.codes.dtype == y.cat.codes.dtype, name
            assert list(x.cat.categories) == list(y.cat.categories), name
        elif isinstance(x.dtype, np.dtype) and x.dtype.kind == "f":
            assert np.array_equal(x.to_numpy().view(np.int64), y.to_numpy().view(np.int64)), name


def tables_of(bundled_analysis, name: str) -> list[pd.DataFrame]:
    """The set's exchanges as analyze holds them, and in the declared dtypes (as a partition is stored)."""
    held = bundled_analysis(name).held_exchanges
    return [held, with_declared_dtypes(held, spilled.EXCHANGES)]


@pytest.mark.parametrize("name", SETS)
def test_a_table_reads_back_exactly(bundled_analysis, tmp_path, name):
    for k, table in enumerate(tables_of(bundled_analysis, name)):
        n = len(table)
        assert n > 20
        stored = FrameFile(tmp_path / f"{k}.arrow", table, 7)  # many batches: slices cross their edges
        assert len(stored) == n
        assert_same(stored.rows(0, n), table)
        for first, end in ((0, 1), (6, 8), (7, 14), (3, n - 2), (n - 1, n), (5, 5)):
            assert_same(stored.rows(first, end), table.iloc[first:end].reset_index(drop=True))
        assert_same(stored.empty(), table.iloc[:0])
        copy = pickle.loads(pickle.dumps(stored))  # as a Dask worker hands a stored partition back
        assert_same(copy.rows(2, 19), table.iloc[2:19].reset_index(drop=True))
        other = FrameFile.of(tmp_path / f"{k}.arrow")  # another process: the dtypes from the file alone
        assert len(other) == n
        assert_same(other.rows(0, n), table)
        assert_same(other.rows(9, 30), table.iloc[9:30].reset_index(drop=True))
        assert_same(other.empty(), table.iloc[:0])
        assert_same(FrameFile.read(tmp_path / f"{k}.arrow"), table)  # the whole frame at once (7a's runs, the join)


def test_floats_keep_their_bits(bundled_analysis, tmp_path):
    table = bundled_analysis("group-stall").held_exchanges
    values = table["server_s"].to_numpy().copy()
    values[0] = np.frombuffer(np.uint64(0xFFF8000000000001).tobytes(), dtype=np.float64)[0]  # a NaN of other bits
    values[1] = -0.0
    table["server_s"] = values
    back = FrameFile(tmp_path / "f.arrow", table, 64).rows(0, len(table))
    assert back["server_s"].to_numpy().view(np.uint64)[0] == 0xFFF8000000000001
    assert np.signbit(back["server_s"].to_numpy()[1])
    assert_same(back, table)


def test_a_file_changed_behind_the_run_is_an_error(bundled_analysis, tmp_path):
    """Codes out of their categories (a file rewritten by someone who can write the shared folder) are refused when
    read, not turned into other values; so is a file cut short."""
    table = bundled_analysis("group-stall").held_exchanges.iloc[:50].reset_index(drop=True)
    path = tmp_path / "t.arrow"
    stored = FrameFile(path, table, 16)
    with ipc.open_file(pa.OSFile(str(path))) as reader:
        schema, batches = reader.schema, [reader.get_batch(k) for k in range(reader.num_record_batches)]
    i = schema.get_field_index("command")
    forged = [b.set_column(i, schema.field(i), pa.array(np.full(b.num_rows, 120, dtype=np.int8))) for b in batches]
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, schema) as writer:
        for b in forged:
            writer.write_batch(b)
    with pytest.raises(ValueError):
        stored.rows(0, 10)
    path.write_bytes(path.read_bytes()[:400])
    with pytest.raises((pa.ArrowInvalid, OSError)):
        FrameFile.of(path).rows(0, 10)


def test_categories_json_cannot_keep_are_refused(tmp_path):
    times = pd.DataFrame({"at": pd.Categorical([pd.Timestamp("2026-12-02")])})
    with pytest.raises((ValueError, TypeError)):
        FrameFile(tmp_path / "t.arrow", times, 4)


def test_the_stored_partition_leaves_no_pickle(bundled_analysis, tmp_path):
    table = with_declared_dtypes(bundled_analysis("group-stall").held_exchanges, spilled.EXCHANGES)
    part = spilled._StoredPartition(tmp_path / "rows" / "0000", table)
    files = [p.name for p in (tmp_path / "rows" / "0000").iterdir()]
    assert files == ["rows.arrow"]
    with ipc.open_file(pa.OSFile(str(tmp_path / "rows" / "0000" / "rows.arrow"))) as reader:
        described = json.loads(reader.schema.metadata[b"pcapdecomp:categories"])
    assert set(described) == {c for c, t in table.dtypes.items() if isinstance(t, pd.CategoricalDtype)}
    assert_same(part.rows(0, len(table)), table)
    assert_same(part.take([0, 5, len(table) - 1]), table.take([0, 5, len(table) - 1]).reset_index(drop=True))


def test_a_table_of_chunked_columns_reads_back_exactly(bundled_analysis, tmp_path):
    """A table pandas concatenated (the partitioned run's side of several points: explain.partitioned._Points.
    table) holds Arrow text in several chunks; its batches are still batch_rows rows each, and every row reads
    back. Before, write_table also cut at the chunks' edges: short batches, and rows() read too few rows."""
    table = with_declared_dtypes(bundled_analysis("group-stall").held_exchanges, spilled.EXCHANGES)
    half = len(table) // 2
    joined = pd.concat([table.iloc[:half], table.iloc[half:]], ignore_index=True)
    arrow = pa.Table.from_pandas(joined, preserve_index=False)
    assert any(column.num_chunks > 1 for column in arrow.columns), "no column of the concatenation is chunked"
    stored = FrameFile(tmp_path / "chunked.arrow", joined, 7)
    n = len(joined)
    with ipc.open_file(str(tmp_path / "chunked.arrow")) as reader:
        sizes = [reader.get_batch(k).num_rows for k in range(reader.num_record_batches)]
    assert sizes == [7] * (n // 7) + ([n % 7] if n % 7 else [])
    assert_same(stored.rows(0, n), joined)
    assert_same(FrameFile.read(tmp_path / "chunked.arrow"), joined)
    for first, end in ((0, 1), (half - 3, half + 4), (n - 8, n)):
        assert_same(stored.rows(first, end), joined.iloc[first:end].reset_index(drop=True))
