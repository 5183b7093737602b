"""Tables of declared columns: text held as categoricals in memory, concatenated without losing that, written to
files as plain text; and the pieces of the join that work on categorical codes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pandas.api.types import union_categoricals

from pcapdecomp.core import outputs
from pcapdecomp.core.schema import CATEGORY, CONNECTION_COLUMNS, EXCHANGE_COLUMNS, Column
from pcapdecomp.core.tables import (
    KEPT_AS_DECLARED,
    as_category,
    as_declared,
    batch,
    columns_batch,
    concat,
    declared_dtype,
    file_schema,
    frame,
    held,
    null_column,
    row_function,
    sorted_columnwise,
)
from pcapdecomp.explain.decompose import _merged_problems
from pcapdecomp.pair.match import _codes
from pcapdecomp.read.exchanges import extract

REPO = Path(__file__).resolve().parents[1]
COLUMNS = (Column("t", CATEGORY, "text"), Column("n", "int64", "number"))
texts = st.lists(st.one_of(st.none(), st.sampled_from(["", "b", "a", "SELECT 1", "é"])), max_size=30)


@settings(max_examples=200, deadline=None)
@given(texts, texts)
def test_concat_keeps_values_and_the_categorical(left, right):
    a = frame([(t, i) for i, t in enumerate(left)], COLUMNS)
    b = frame([(t, i) for i, t in enumerate(right)], COLUMNS)
    joined = concat([a, b])
    assert isinstance(joined["t"].dtype, pd.CategoricalDtype)
    assert list(joined["t"].cat.categories) == sorted({t for t in left + right if t is not None})
    assert [None if pd.isna(v) else v for v in joined["t"]] == left + right
    assert joined["n"].tolist() == list(range(len(left))) + list(range(len(right)))


def test_concat_with_empty_parts_is_pandas_concat_and_shares_the_one_full_part():
    # the loss repair joins the rows it kept (none, when it re-read every connection) with the re-read ones: the
    # re-read table's columns are taken as they are, and the categoricals still unite every part's categories
    x = extract(REPO / "captures" / "oltp-hogs" / "db.pcap").exchanges
    kept = x.iloc[:0].copy()
    kept["command"] = kept["command"].cat.add_categories(["COM_ONLY_IN_THE_EMPTY_PART"])
    for parts in ([kept, x], [x, kept], [kept, x, kept]):
        joined = concat(parts)
        for name in x.columns:
            column = [p[name] for p in parts]
            if isinstance(x[name].dtype, pd.CategoricalDtype):
                expected = pd.Series(union_categoricals(column, sort_categories=True, ignore_order=True))
                assert list(joined[name].cat.categories) == list(expected.cat.categories)
            else:
                expected = pd.concat(column, ignore_index=True)
                if isinstance(x[name].dtype, np.dtype):
                    assert np.shares_memory(joined[name].to_numpy(), x[name].to_numpy())
            pd.testing.assert_series_equal(joined[name], expected, check_names=False)
    assert "COM_ONLY_IN_THE_EMPTY_PART" in concat([kept, x])["command"].cat.categories


def test_a_row_or_a_column_of_another_length_is_an_error_not_cut_to_fit():
    with pytest.raises(ValueError):
        frame([("a", 1), ("b",)], COLUMNS)
    with pytest.raises(ValueError):
        frame([("a", 1, "extra")], COLUMNS)
    with pytest.raises(ValueError):  # columns as the fast lane hands them over: one column too few
        columns_batch([["a", "b"]], "o", COLUMNS)
    with pytest.raises(ValueError):  # as many columns, one value short
        columns_batch([["a", "b"], np.array([1], dtype=np.int64).tobytes()], "oq", COLUMNS)
    whole = columns_batch([["a", "b"], np.array([1, 2], dtype=np.int64).tobytes()], "oq", COLUMNS)
    assert whole.num_rows == 2 and whole.column(1).to_pylist() == [1, 2]


def test_rows_are_written_by_column_name():
    row = row_function("row", COLUMNS, "x", {"n": "x + 1", "t": "str(x)"})
    assert row(41) == ("41", 42)  # in the columns' order, whatever the order of the sources
    with pytest.raises(ValueError, match="no source for \\['n'\\]"):
        row_function("row", COLUMNS, "x", {"t": "str(x)"})
    with pytest.raises(ValueError, match="no column for \\['m'\\]"):
        row_function("row", COLUMNS, "x", {"t": "str(x)", "n": "x", "m": "x"})


def test_categories_are_lexical_so_sorting_sorts_by_text():
    t = frame([("b", 0), ("c", 1), ("a", 2), (None, 3), ("b", 4)], COLUMNS)
    assert list(t["t"].cat.categories) == ["a", "b", "c"]
    assert t.sort_values("t", kind="stable")["n"].tolist() == [2, 0, 4, 1, 3]


def test_sorted_columnwise_without_reordering_keeps_the_rows():
    t = frame([("x", i) for i in range(5)], COLUMNS)
    out = sorted_columnwise([t.copy()], ["n"])
    assert out.equals(t)


def test_text_columns_of_a_real_capture_are_codes_not_strings():
    x = extract(REPO / "captures" / "oltp-hogs" / "db.pcap").exchanges
    for c in EXCHANGE_COLUMNS:  # each in its declared dtype, or a narrower form of it (tables.held)
        assert declared_dtype(x[c.name].dtype) == c.dtype, c.name
    for name in ("fingerprint", "client", "command"):
        col = x[name]
        assert col.cat.categories.is_unique and col.cat.categories.is_monotonic_increasing
        # one small code per row, far below the text it stands for
        assert col.cat.codes.dtype.itemsize <= 2
        assert col.memory_usage(deep=True) < 0.25 * col.astype("string").memory_usage(deep=True), name
    # distinct statements (literals inline): never more than a code per row above plain text
    sql = x["sql"]
    assert sql.memory_usage(deep=True) <= sql.astype("string").memory_usage(deep=True) + 4 * len(sql)


def test_parquet_holds_text_and_reads_back_as_strings_in_several_row_groups(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setattr(outputs, "PARQUET_ROWS_PER_GROUP", 7)
    t = frame([(["a", None, "bb"][i % 3], i) for i in range(20)], COLUMNS)
    out = tmp_path / "t.parquet"
    outputs.write_table(t, out)
    assert pq.ParquetFile(out).num_row_groups == 3
    back = pd.read_parquet(out)
    assert str(back["t"].dtype) == COLUMNS[0].file_dtype == "string"
    assert back["t"].tolist() == [v if v is not None else pd.NA for v in t["t"].astype(object).where(t["t"].notna(), None)]
    assert back["n"].tolist() == list(range(20))
    assert back["t"].fillna("").str.len().sum() == 7 * 1 + 6 * 2  # usable as text: fillna('') works


def test_row_group_whose_text_is_all_null_keeps_the_file_schema(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setattr(outputs, "PARQUET_ROWS_PER_GROUP", 4)
    t = frame([("x" if i < 4 else None, i) for i in range(10)], COLUMNS)  # groups 2 and 3: no text at all
    out = tmp_path / "n.parquet"
    outputs.write_table(t, out)
    f = pq.ParquetFile(out)
    assert f.num_row_groups == 3 and str(f.schema_arrow.field("t").type) in ("string", "large_string")
    back = pd.read_parquet(out)
    assert back["t"].isna().tolist() == [False] * 4 + [True] * 6 and back["n"].tolist() == list(range(10))


def test_empty_table_writes_and_reads(tmp_path):
    out = tmp_path / "e.parquet"
    outputs.write_table(frame([], COLUMNS), out)
    back = pd.read_parquet(out)
    assert len(back) == 0 and list(back.columns) == ["t", "n"]


@pytest.mark.parametrize("app, db, both, expected", [
    (["gap", "", None, "midstream"], ["gap,sequence", "x", "y", None], [True, True, True, False],
     ["gap,sequence", "x", "y", "midstream"]),
    ([None, None], [None, "z"], [True, False], ["", None]),
    (["a,b", "a,b"], ["b,c", "b,c"], [True, True], ["a,b,c", "a,b,c"]),
])
def test_problems_of_both_points_are_merged_once_each(app, db, both, expected):
    out = _merged_problems(as_category(app), as_category(db), np.array(both))
    assert isinstance(out.dtype, pd.CategoricalDtype)
    assert [None if pd.isna(v) else v for v in out] == expected


def test_text_of_two_tables_compares_by_value_not_by_code():
    a = as_category(["SELECT 1", None, "b", "c"])
    b = as_category(["SELECT 1", None, "c", "zz"])  # same texts sit at other codes here
    codes_a, codes_b = _codes(a, b)
    assert (codes_a == codes_b).tolist() == [True, True, False, False]
    codes_a, codes_b = _codes(a.astype(object), b.astype(object))  # plain text columns: the same answer
    assert (codes_a == codes_b).tolist() == [True, True, False, False]


ALL_DTYPES = (Column("c", CATEGORY, ""), Column("s", "string", ""), Column("i", "int64", ""), Column("n", "Int64", ""),
              Column("f", "float64", ""), Column("b", "boolean", ""), Column("t", "datetime64[ns, UTC]", ""))


@pytest.mark.parametrize("columns", [EXCHANGE_COLUMNS, ALL_DTYPES, CONNECTION_COLUMNS], ids=["exchanges", "dtypes",
                                                                                              "connections"])
def test_file_schema_is_the_one_pandas_writes(tmp_path, columns):
    """tables.file_schema describes the file without pandas; pandas' own description of a DataFrame of the
    declared dtypes (categorical text as text) must be the same, metadata included, and so must the file
    outputs.write_table writes of it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = frame([], columns)
    out = tmp_path / "p.parquet"
    outputs.write_table(df, out)
    by_pandas = pa.Schema.from_pandas(_text_as_strings(df), preserve_index=False)
    assert by_pandas.equals(file_schema(columns), check_metadata=True)
    assert pq.ParquetFile(out).schema_arrow.equals(by_pandas, check_metadata=True)


def _text_as_strings(df: pd.DataFrame) -> pd.DataFrame:
    return df.astype({c: "string" for c, t in df.dtypes.items() if isinstance(t, pd.CategoricalDtype)})


@pytest.mark.parametrize("change", ["none", "int32", "float32", "numpy bool", "int categories", "attrs", "int label",
                                    "same label twice", "naive times", "python strings"])
def test_written_schema_is_pandas_description_whatever_the_dtypes(tmp_path, change):
    """write_table describes a frame of declared dtypes from the declarations, any other as pandas does: the file's
    schema is pandas' description of the frame in its declared dtypes (categorical text as text; whole numbers held
    in int32 as int64: tables.held) in every case, metadata included."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = frame([("b", "x", 1, 2, 0.5, True, pd.Timestamp(1, tz="UTC").value), (None, None, 3, None, None, None, None)],
               ALL_DTYPES)
    df["t"] = pd.to_datetime(df["t"], utc=True)
    if change == "int32":
        df["i"] = df["i"].astype("int32")
    elif change == "float32":
        df["f"] = df["f"].astype("float32")
    elif change == "numpy bool":
        df["b"] = df["b"].fillna(False).astype(bool)
    elif change == "int categories":
        df["c"] = pd.Categorical([5, 7])
    elif change == "attrs":
        df.attrs["source"] = "test"
    elif change == "int label":
        df = df.rename(columns={"i": 3})
    elif change == "same label twice":  # pandas refuses to describe it: so does write_table
        df.columns = ["c", "s", "i", "i", "f", "b", "t"]
        with pytest.raises(ValueError, match="Duplicate column names"):
            outputs.write_table(df, tmp_path / "p.parquet")
        return
    elif change == "naive times":
        df["t"] = df["t"].dt.tz_localize(None)
    elif change == "python strings":
        df["s"] = df["s"].astype(pd.StringDtype("python"))
    out = tmp_path / "p.parquet"
    outputs.write_table(df, out)
    by_pandas = pa.Schema.from_pandas(_text_as_strings(as_declared(df)), preserve_index=False)
    assert pq.ParquetFile(out).schema_arrow.equals(by_pandas, check_metadata=True)
    if change in ("none", "int32"):  # held in int32, written as declared
        assert str(df["i"].dtype) == "int32" and pq.ParquetFile(out).schema_arrow.field("i").type == pa.int64()


def _same_file(a: Path, b: Path) -> None:
    """Schema (with metadata), row groups, encodings, values and pandas' reading of two Parquet files."""
    import pyarrow.parquet as pq

    fa, fb = pq.ParquetFile(a), pq.ParquetFile(b)
    assert fa.schema_arrow.equals(fb.schema_arrow, check_metadata=True)
    assert fa.schema.equals(fb.schema)  # the Parquet schema: physical and logical types
    groups = [(fa.metadata.row_group(i), fb.metadata.row_group(i)) for i in range(fa.num_row_groups)]
    assert fa.num_row_groups == fb.num_row_groups
    for ga, gb in groups:
        assert ga.num_rows == gb.num_rows
        for k in range(ga.num_columns):
            # dictionary-encoded text in both (or in neither), whatever the page encodings' order
            assert ("RLE_DICTIONARY" in ga.column(k).encodings) == ("RLE_DICTIONARY" in gb.column(k).encodings)
    assert fa.read().equals(fb.read())
    pd.testing.assert_frame_equal(pd.read_parquet(a), pd.read_parquet(b))


@pytest.mark.parametrize("capture", ["captures/oltp-hogs/db.pcap", "captures/group-stall/app.pcap"])
def test_arrow_table_writes_the_file_its_dataframe_writes(tmp_path, monkeypatch, capture):
    """The `exchanges` command writes the Arrow table extraction made; analyze writes DataFrames: the same file
    either way, in several row groups too."""
    monkeypatch.setattr(outputs, "PARQUET_ROWS_PER_GROUP", 1000)
    x = extract(REPO / capture)
    for name, columns in (("exchanges", EXCHANGE_COLUMNS), ("connections", CONNECTION_COLUMNS)):
        table = x.arrow(name)
        assert table is not None and table.num_rows > 0
        outputs.write_table(table, tmp_path / f"{name}-arrow.parquet", file_schema(columns))
        outputs.write_table(getattr(x, name), tmp_path / f"{name}-pandas.parquet")
        assert x.arrow(name) is None  # now a DataFrame
        _same_file(tmp_path / f"{name}-arrow.parquet", tmp_path / f"{name}-pandas.parquet")


def test_quality_counts_the_same_from_arrow_and_from_pandas():
    x = extract(REPO / "captures" / "oltp-hogs" / "db.pcap")
    from_arrow = x.quality()
    x.exchanges, x.connections  # noqa: B018 (converted)
    assert x.arrow("exchanges") is None
    assert x.quality() == from_arrow and from_arrow["exchanges"] > 0 and from_arrow["mysql_connections"] > 0


@pytest.mark.parametrize("ns", [0, 1, 999, 1000, 123_456_789, 1_764_000_000_000_000_000, 1_764_000_000_123_000_000,
                                1_764_000_000_000_001_000, -1, -1_000_000_001, 4_000_000_000_999_999_999])
def test_iso_times_are_pandas_isoformat(ns):
    from pcapdecomp.read.exchanges import _iso

    assert _iso(ns) == pd.Timestamp(ns, unit="ns", tz="UTC").isoformat()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3), st.integers(-2, 2)), max_size=60),
       st.integers(0, 2))
def test_lexsort_of_nearly_sorted_rows_is_numpys(rows, keys_used):
    from pcapdecomp.core.tables import lexsort_nearly_sorted

    keys = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(keys_used + 1)]
    assert lexsort_nearly_sorted(keys).tolist() == np.lexsort(keys[::-1]).tolist()


def test_lexsort_of_a_real_capture_is_numpys():
    from pcapdecomp.core.tables import lexsort_nearly_sorted

    x = extract(REPO / "captures" / "oltp-hogs" / "db.pcap").exchanges.sample(frac=1, random_state=1)
    keys = [x["req_first_ts"].array.asi8 // 1_000_000, x["conn_index"].to_numpy(), x["seq"].to_numpy()]
    assert lexsort_nearly_sorted(keys).tolist() == np.lexsort(keys[::-1]).tolist()


def test_rows_are_sorted_with_null_keys_first_across_batches():
    """table_of sorts by int64 and timestamp keys read from Arrow's buffers: nulls first (as NaT), stable, over
    several batches and from a slice's offset."""
    import pyarrow as pa

    from pcapdecomp.core.tables import table_of

    columns = (Column("t", "datetime64[ns, UTC]", ""), Column("n", "int64", ""))
    rows = [(5, 0), (None, 1), (3, 2), (5, 3), (None, 4), (1, 5), (3, 6), (2, 7)]
    first, second = batch(rows[:5], columns), batch(rows[5:], columns)
    got = table_of([first.slice(1), second], columns, sort_by=["t", "n"])
    expected = sorted(rows[1:], key=lambda r: (-1 if r[0] is None else r[0], r[1]))
    assert got.column("n").to_pylist() == [r[1] for r in expected]
    assert got.schema.field("t").type == pa.timestamp("ns", tz="UTC")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["b", "a", "", "zz", "é", None, float("nan")]), max_size=40))
def test_as_category_of_an_object_array_is_the_string_columns_categorical(values):
    """as_category hashes an object array of text and nulls (pd.factorize) instead of making a string array of it:
    the same column as the string array's categorical, with sorted categories."""
    array = np.array(values, dtype=object)
    text = pd.Series(array, dtype="string")
    expected = pd.Series(pd.Categorical(text, categories=pd.Index(sorted(text.dropna().unique()), dtype="str")),
                         index=text.index)
    pd.testing.assert_series_equal(as_category(array), expected)


@pytest.mark.parametrize("dtype", ["float64", "Int64", "datetime64[ns, UTC]"])
def test_null_column_holds_no_bytes_per_row_and_reads_and_writes_as_nulls(dtype, tmp_path):
    import tracemalloc

    n = 300_000
    tracemalloc.start()
    try:
        col = null_column(n, dtype)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 10_000  # one value, not n
    assert str(col.dtype) == dtype and len(col) == n and col.isna().all()
    assert np.isnan(col.to_numpy(dtype="float64", na_value=np.nan)).all()
    plain = pd.Series(np.full(n, np.nan)) if dtype == "float64" else pd.Series(pd.array([pd.NA] * n, dtype=dtype))
    table = pd.DataFrame({"k": np.arange(n)})
    table["v"] = col
    other = pd.DataFrame({"k": np.arange(n)})
    other["v"] = plain
    outputs.write_table(table, tmp_path / "null.parquet")
    outputs.write_table(other, tmp_path / "plain.parquet")
    assert (tmp_path / "null.parquet").read_bytes() == (tmp_path / "plain.parquet").read_bytes()
    assert table.iloc[::7].equals(other.iloc[::7])  # a copy of its rows is a column of nulls like any other


def _held_bytes(values) -> int:
    """The bytes a column's arrays hold per row (nothing for an array of stride 0)."""
    arrays = [getattr(values, a) for a in ("_data", "_mask", "_ndarray") if hasattr(values, a)] or [np.asarray(values)]
    return sum(a.itemsize for a in arrays if a.strides[0] != 0)


def test_a_real_capture_is_held_in_fewer_bytes_and_written_as_declared(tmp_path):
    """The exchanges of a real capture as analyze holds them (tables.held): whole numbers that fit int32 in 4 bytes
    a row (5 with a null mask), a column of one value in none, every value the same as in the declared dtypes
    (as_declared widens them back), and the Parquet file byte for byte the one of the declared table."""
    x = extract(REPO / "captures" / "oltp-hogs" / "db.pcap").exchanges
    wide = as_declared(x)
    assert [str(t) for t in wide.dtypes] == [c.dtype for c in EXCHANGE_COLUMNS]
    narrower = []
    for c in EXCHANGE_COLUMNS:
        values = x[c.name].array
        if c.dtype not in ("int64", "Int64"):
            continue
        full = wide[c.name]
        if c.name in KEPT_AS_DECLARED:  # TCP sequence numbers: modulo 2^32, whatever their values
            assert _held_bytes(values) == (8 if c.dtype == "int64" else 9), c.name
        elif full.nunique(dropna=False) == 1:
            assert _held_bytes(values) == 0, c.name
        elif full.dropna().between(-2**31, 2**31 - 1).all():
            assert _held_bytes(values) == (4 if c.dtype == "int64" else 5), c.name
            narrower.append(c.name)
        else:
            assert _held_bytes(values) == (8 if c.dtype == "int64" else 9), c.name
    assert {"conn_index", "seq", "req_first_frame", "bytes_resp", "conn_id", "stmt_id"} <= set(narrower)
    # the same table in the declared dtypes: each column converted, none held
    declared = pd.DataFrame({c.name: wide[c.name].to_numpy(copy=True) if c.dtype == "int64" else
                             wide[c.name].copy(deep=True) for c in EXCHANGE_COLUMNS})
    pd.testing.assert_frame_equal(wide, declared, check_exact=True)
    outputs.write_table(x, tmp_path / "held.parquet")
    outputs.write_table(declared, tmp_path / "declared.parquet")
    assert (tmp_path / "held.parquet").read_bytes() == (tmp_path / "declared.parquet").read_bytes()


def test_held_is_decided_by_the_values_alone():
    """A table read in parts and concatenated holds what the whole holds: the same form for the same values,
    whichever form they came in, and values that do not fit int32 (or a column of nulls and values) as they are."""
    n = 1000
    for values in (np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int32)):
        assert held(values).dtype == np.int32 and (held(values) == np.arange(n)).all()
    for values in (np.full(n, 7, dtype=np.int64), np.full(n, 7, dtype=np.int32)):
        one = held(values)
        assert one.dtype == np.int64 and one.strides == (0,) and (one == 7).all()
    big = np.arange(n, dtype=np.int64) + 2**31
    assert held(big) is big
    some = pd.array([1, None, 2**40], dtype="Int64")
    assert held(some) is some
    seq = pd.Series(np.arange(n, dtype=np.int64), name="req_tcp_seq")  # fits int32, kept: counted modulo 2^32
    assert held(seq) is seq and held(pd.Series(np.arange(n, dtype=np.int64))).dtype == np.int32
    assert str(held(pd.array([1, None, 3], dtype="Int64")).dtype) == "Int32"
    parts = [frame([("x", i) for i in range(5)], COLUMNS), frame([("y", 9)] * 3, COLUMNS)]
    whole = frame([*[("x", i) for i in range(5)], *[("y", 9)] * 3], COLUMNS)
    joined = concat(parts)
    assert joined["n"].dtype == whole["n"].dtype == np.int32 and joined.equals(whole)
    assert frame([("y", 9)] * 3, COLUMNS)["n"].array._ndarray.strides == (0,)
