"""Tables of declared columns (core/schema.py): rows -> Arrow record batches -> pandas, and the concatenation and sorting
that keep the declared dtypes.

Tables are built with one block per column (`copy=False`; pandas would otherwise consolidate columns of a dtype
into one 2-D block, copying the whole table on the way and keeping a dropped column's memory alive).

Repetitive text (capture, endpoints, command, statement text, fingerprints, results…) is declared `category`: it
is dictionary-encoded as each batch is built, so a million exchanges of a few dozen distinct statements hold one
small code per row instead of a string per row. pandas concatenates categoricals with different categories into
plain strings, so every concatenation of these tables goes through `concat`, which unions the categories.

pandas is imported by the functions that make or take DataFrames, not with this module: the `exchanges` command
builds its table and writes it with Arrow alone (`table_of`, `file_schema`): importing pandas is a large part of
a small capture's whole run."""

from __future__ import annotations

import functools
from collections import namedtuple
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

try:  # Arrow's compute functions, called by name: importing pyarrow.compute wraps ~300 of them in Python
    # functions with docstrings, at every `exchanges` run, which calls five
    from pyarrow._compute import TakeOptions, call_function
except ImportError:  # a pyarrow that moved them
    from pyarrow.compute import TakeOptions, call_function

from .memory import release_memory
from .schema import CATEGORY, TS, Column

if TYPE_CHECKING:
    import pandas as pd

ARROW_TYPES = {"string": pa.string(), CATEGORY: pa.string(), "int64": pa.int64(), "Int64": pa.int64(),
               "float64": pa.float64(), "boolean": pa.bool_(), TS: pa.timestamp("ns", tz="UTC")}


@functools.cache
def _pandas_types() -> dict:
    import pandas as pd

    return {pa.string(): pd.StringDtype("pyarrow"), pa.bool_(): pd.BooleanDtype()}


def arrow_type(column: Column) -> pa.DataType:
    return pa.dictionary(pa.int32(), pa.string()) if column.dtype == CATEGORY else ARROW_TYPES[column.dtype]


# How pandas describes each declared dtype in a Parquet file's metadata (pyarrow's pandas_compat, as a DataFrame
# of that dtype is written by outputs.write_table: categorical text as text): (Arrow type, pandas_type,
# numpy_type, metadata). Checked against pandas' own description by tests/test_tables.py.
_FILE_TYPES = {
    "string": (pa.large_string(), "object", "string", None),
    CATEGORY: (pa.large_string(), "object", "string", None),
    "int64": (pa.int64(), "int64", "int64", None),
    "Int64": (pa.int64(), "int64", "Int64", None),
    "float64": (pa.float64(), "float64", "float64", None),
    "boolean": (pa.bool_(), "bool", "boolean", None),
    TS: (pa.timestamp("ns", tz="UTC"), "datetimetz", "datetime64[ns]", {"timezone": "UTC"}),
}


def file_schema(columns: tuple[Column, ...]) -> pa.Schema:
    """The Arrow schema, with its pandas metadata, of a Parquet file of a table of these declared columns, as
    outputs.write_table writes a DataFrame of them: what readers see. Made without importing pandas (the
    `exchanges` command writes its table with Arrow alone); its version is the installed package's."""
    import json

    described = [{"name": c.name, "field_name": c.name, "pandas_type": _FILE_TYPES[c.dtype][1],
                  "numpy_type": _FILE_TYPES[c.dtype][2], "metadata": _FILE_TYPES[c.dtype][3]} for c in columns]
    pandas = {"index_columns": [], "column_indexes": [], "columns": described, "attributes": {},
              "creator": {"library": "pyarrow", "version": pa.__version__},
              "pandas_version": _installed_version("pandas")}
    return pa.schema([(c.name, _FILE_TYPES[c.dtype][0]) for c in columns],
                     metadata={b"pandas": json.dumps(pandas).encode()})


def declared_dtype(dtype) -> str | None:
    """The declared dtype (schema.Column.dtype) whose file description (`file_schema`) is pandas' description of a
    DataFrame column of this pandas dtype as outputs.write_table writes it: categorical (of any categories, written
    as text) CATEGORY; a dtype `frame` gives its declared one; None for any other."""
    import pandas as pd

    if isinstance(dtype, pd.CategoricalDtype):
        return CATEGORY
    return _declared_dtypes().get(dtype)


@functools.cache
def _declared_dtypes() -> dict:
    # with the narrower dtypes `held` keeps whole numbers in: declared int64 and Int64, written as declared
    return {_pandas_dtype(d): d for d in _FILE_TYPES if d != CATEGORY} | {np.dtype(np.int32): "int64",
                                                                          _pandas_dtype("Int32"): "Int64"}


@functools.cache
def _installed_version(name: str) -> str:
    """importlib.metadata.version(name), read from the name of the package's one .dist-info folder beside it when
    there is one (importing importlib.metadata would be paid by every `exchanges` run); else asked of
    importlib.metadata."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(name)  # finds, does not import
    for place in (spec.submodule_search_locations or []) if spec is not None else []:
        found = list(Path(place).parent.glob(f"{name}-*.dist-info"))
        if len(found) == 1:
            return found[0].name[len(name) + 1:-len(".dist-info")]
    from importlib.metadata import version

    return version(name)


def row_type(name: str, columns: tuple[Column, ...]) -> type[tuple]:
    """A named tuple of the declared columns, in their order: rows are written by column name (a name missing or
    unknown is a TypeError) and are still the plain tuples `batch` takes."""
    return namedtuple(name, [c.name for c in columns])


def row_function(name: str, columns: tuple[Column, ...], parameters: str, sources: dict[str, str]
                 ) -> Callable[..., tuple]:
    """A function `name(parameters)` that returns a row of `columns` as a plain tuple in their order, the value of
    each column being the Python expression `sources[column name]` over the parameters. For rows written once per
    exchange: compiled once (as namedtuple and dataclasses compile their methods), so a row is written by name
    and costs one tuple; a dict or 42 keyword arguments per row made the Python extraction ~9 % slower. A column
    without a source, or a source without a column, is a ValueError."""
    names = [c.name for c in columns]
    if set(sources) != set(names):
        raise ValueError(f"{name}: no source for {sorted(set(names) - set(sources))}, "
                         f"no column for {sorted(set(sources) - set(names))}")
    values = "".join(f"\n        {sources[n]},  # {n}" for n in names)
    code = f"def {name}({parameters}):\n    return ({values}\n    )\n"
    namespace: dict = {}
    exec(compile(code, f"<row {name}>", "exec"), namespace)
    return namespace[name]


def batch(rows: list[tuple], columns: tuple[Column, ...]) -> pa.RecordBatch:
    """Rows (tuples in column order, e.g. of `row_type`) -> one Arrow record batch of the declared types.
    Timestamps go straight from Python ints to nanoseconds: no float detour that would round them to ~256 ns.
    A row with more or fewer values than there are columns is a ValueError."""
    values = list(zip(*rows, strict=True)) if rows else [() for _ in columns]
    return columns_batch(values, "o" * len(columns), columns)


def columns_batch(values: list, kinds: str, columns: tuple[Column, ...]) -> pa.RecordBatch:
    """Columns (not rows) -> one Arrow record batch of the declared types. `kinds[i]` says how column i comes:
    'o' a list of Python objects, 'q' / 'd' the bytes of int64 / float64 values without nulls, which become
    Arrow arrays without a copy, 'c' (categorical text) the bytes of int32 codes (-1 for null) and the list of
    the values they stand for, first seen first (the native fast lane writes its rows so); and, as the lane writes
    them too, 'n' (whole numbers or null) the bytes of int64 values and a byte per row (1: a value, 0: null), 'b'
    (booleans or null) a byte per row (0, 1, 2: null), 's' (text or null) the bytes of int32 offsets (where each
    row starts, then where the last ends), of the UTF-8 text and a byte per row (1: text, 0: null). As many values
    and kinds as columns, and as many values in each column, or a ValueError: nothing is cut to fit."""
    arrays = []
    for c, kind, v in zip(columns, kinds, values, strict=True):
        if kind == "o":
            array = pa.array(v, type=ARROW_TYPES[c.dtype])
        elif kind == "n":
            data, held = v
            if len(data) != 8 * len(held):
                raise ValueError(f"column {c.name}: {len(data)} bytes of values for {len(held)} rows")
            array = pa.Array.from_buffers(ARROW_TYPES[c.dtype], len(held), [_validity(held, 1), pa.py_buffer(data)])
        elif kind == "b":
            codes = np.frombuffer(v, dtype=np.uint8)
            values_bits = pa.py_buffer(np.packbits(codes == 1, bitorder="little"))
            array = pa.Array.from_buffers(ARROW_TYPES[c.dtype], len(codes), [_validity(v, 2, null=True), values_bits])
        elif kind == "s":
            offsets, text, held = v
            if len(offsets) != 4 * (len(held) + 1):
                raise ValueError(f"column {c.name}: {len(offsets)} bytes of offsets for {len(held)} rows")
            array = pa.Array.from_buffers(ARROW_TYPES[c.dtype], len(held),
                                          [_validity(held, 1), pa.py_buffer(offsets), pa.py_buffer(text)])
            array.validate(full=True)  # the offsets and the UTF-8 as Arrow needs them, or an error here
        elif kind == "c":
            codes = np.frombuffer(v[0], dtype=np.int32)
            null = codes < 0
            # from the buffers: pa.array of a numpy array imports pandas (to look for pandas types)
            valid = pa.py_buffer(np.packbits(~null, bitorder="little")) if null.any() else None
            indices = pa.Array.from_buffers(pa.int32(), len(codes), [valid, pa.py_buffer(v[0])])
            arrays.append(pa.DictionaryArray.from_arrays(indices, pa.array(v[1], type=pa.string())))
            continue
        else:
            if len(v) % 8:
                raise ValueError(f"column {c.name}: {len(v)} bytes are not a whole number of 8-byte values")
            array = pa.Array.from_buffers(ARROW_TYPES[c.dtype], len(v) // 8, [None, pa.py_buffer(v)])
        arrays.append(call_function("dictionary_encode", [array]) if c.dtype == CATEGORY else array)
    if any(len(a) != len(arrays[0]) for a in arrays):
        lengths = {c.name: len(a) for c, a in zip(columns, arrays)}
        raise ValueError(f"columns of different lengths: {lengths}")
    return pa.RecordBatch.from_arrays(arrays, names=[c.name for c in columns])


def _validity(marks: bytes, mark: int, null: bool = False) -> pa.Buffer | None:
    """An Arrow validity bitmap of a byte per row: valid where the byte is `mark` (where it is not, when `null`);
    None when every row is valid."""
    bytes_ = np.frombuffer(marks, dtype=np.uint8)
    valid = bytes_ != mark if null else bytes_ == mark
    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def frame_of(batches: list[pa.RecordBatch], columns: tuple[Column, ...], sort_by: list[str] | None = None
             ) -> pd.DataFrame:
    """Record batches -> a DataFrame with the declared pandas dtypes, its rows in the stable order of the int64
    or timestamp columns `sort_by` (as sorted_columnwise orders them) when given. The list is emptied: each
    column's Arrow memory is let go as soon as it is converted (and sorted), so the peak is the table plus one
    column."""
    holder = [table_of(batches, columns, sort_by)]
    return frame_of_table(holder, columns)


def table_of(batches: list[pa.RecordBatch], columns: tuple[Column, ...], sort_by: list[str] | None = None,
             after_column: Callable[[], None] | None = None) -> pa.Table:
    """Record batches -> one Arrow table of the declared Arrow types (`arrow_type`), its rows in the stable order
    of the int64 or timestamp columns `sort_by` when given. The list is emptied, and each column is let go once
    it is sorted: the peak is the table plus one column. `after_column()` is called after each column is sorted
    (batches mapped from files let that column's pages go: read/spill.py)."""
    schema = pa.schema([(c.name, arrow_type(c)) for c in columns])
    table = pa.Table.from_batches(batches, schema=schema)
    batches.clear()
    order = _order(table, sort_by) if sort_by else None
    if order is None:
        return table
    arrays = []
    trim = _Trim()
    for c in columns:
        chunked = table.column(c.name)
        table = table.drop_columns([c.name])
        # a dictionary column: its codes only; the order is a permutation (no bounds to check)
        arrays.append(call_function("take", [chunked, order], TakeOptions(boundscheck=False)))
        nbytes = chunked.nbytes
        del chunked
        trim.freed(nbytes)
        if after_column is not None:
            after_column()
    return pa.Table.from_arrays(arrays, schema=schema)


class _Trim:
    """`release_memory` after every ~16 MB let go while a table is rebuilt column by column. A column made of
    record batches is many small heap blocks, below malloc's mmap threshold: freed, glibc keeps them for reuse,
    while the new whole-column arrays are mmap'd apart, so without a trim the rebuild holds the old table and the
    new one."""

    STEP = 16 << 20

    def __init__(self):
        self.pending = 0

    def freed(self, nbytes: int) -> None:
        self.pending += nbytes
        if self.pending >= self.STEP:
            self.pending = 0
            release_memory()


def frame_of_table(holder: list[pa.Table], columns: tuple[Column, ...]) -> pd.DataFrame:
    """The table of `table_of` in `holder` (a list of one) -> a DataFrame with the declared pandas dtypes. The
    table is taken out of the list, and each column's Arrow memory is let go as soon as it is converted (a table
    passed as an argument would stay alive in the caller until the whole DataFrame is made: twice the memory)."""
    import pandas as pd

    table = holder.pop()
    # the table's columns by name, held here alone (not by a table: a table rebuilt without each column in turn
    # cost more than converting a small table's columns)
    held = dict(zip(table.column_names, table.columns))
    del table
    data = {}
    trim = _Trim()
    for c in columns:
        chunked = held.pop(c.name)
        data[c.name] = _values(chunked, c)
        nbytes = chunked.nbytes
        del chunked
        trim.freed(nbytes)
    # from the columns' arrays (Series would have their indexes aligned); copy=False: no consolidating copy
    return pd.DataFrame(data, columns=[c.name for c in columns], copy=False)


def _order(table: pa.Table, keys: list[str]) -> pa.Array | None:
    """The stable order of the table's rows by the key columns, or None when they are in that order already. Null
    sorts first, as NaT's int64 does in sorted_columnwise."""
    arrays = [_int64_key(table.column(k)) for k in keys]
    order = lexsort_nearly_sorted(arrays)
    if np.array_equal(order, np.arange(len(order))):
        return None
    # from the buffer: pa.array of a numpy array imports numpy.ma, which nothing else needs
    order = np.ascontiguousarray(order, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(order), [None, pa.py_buffer(order)])


def lexsort_nearly_sorted(keys: list[np.ndarray]) -> np.ndarray:
    """np.lexsort(keys[::-1]) (the first key is the primary one; stable), for rows nearly in the order of the
    first key, as exchanges are (written as they end, sorted by when they began). A stable sort by the first key
    finds its runs (timsort: nearly linear), and only the rows whose first key ties with a neighbour's are sorted
    by all the keys; np.lexsort sorted the whole table once per key (~3x the time on a 1 M-row table)."""
    first = keys[0]
    order = np.argsort(first, kind="stable")
    if len(keys) == 1 or len(order) < 2:
        return order
    in_order = first[order]
    same = in_order[1:] == in_order[:-1]
    del in_order
    tied = np.zeros(len(order), dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    places = np.flatnonzero(tied)
    if len(places):
        # the tied rows keep their places (sorted by the first key already); among each run of equal first keys
        # the other keys decide, stably
        rows = order[places]
        order[places] = rows[np.lexsort([k[rows] for k in keys[::-1]])]
    return order


def _int64_key(chunked: pa.ChunkedArray) -> np.ndarray:
    """An int64 or timestamp column as int64 values in a numpy array, null as the least int64 (first, as NaT's
    int64 sorts in sorted_columnwise), read from its buffers (numpy conversions of Arrow arrays import pandas:
    tables.arrow_without_pandas)."""
    parts = []
    for chunk in chunked.chunks:
        if not len(chunk):
            continue
        values = np.frombuffer(chunk.buffers()[1], dtype=np.int64, count=len(chunk), offset=chunk.offset * 8)
        if chunk.null_count:
            values = np.where(_valid(chunk), values, np.iinfo(np.int64).min)
        parts.append(values)
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _values(chunked: pa.ChunkedArray, column: Column):
    """A column of a table_of table as the array of a DataFrame column of its declared dtype. Made directly where
    that is quicker than Arrow's conversion to pandas (text, nullable whole numbers and booleans: the dtype's own
    conversion of Arrow arrays, `__from_arrow__`, which Arrow's calls too; times: from their int64 values), the same
    values and dtype. (`pd.array(chunked, dtype=…)` gives the same values but converts Int64 and boolean value by
    value.)"""
    import pandas as pd

    if column.dtype == CATEGORY:
        # Categories are put in lexical order so that sorting by such a column sorts by its text, as it would for
        # strings.
        return _categorical(chunked).array
    kept = (lambda values: values) if column.name in KEPT_AS_DECLARED else held
    if column.dtype == TS and chunked.type == ARROW_TYPES[TS]:
        return kept(pd.array(_int64_key(chunked).view("M8[ns]"), dtype=pd.DatetimeTZDtype("ns", "UTC")))  # null: NaT
    if column.dtype in ("string", "Int64", "boolean") and chunked.type == ARROW_TYPES[column.dtype]:
        return kept(_pandas_dtype(column.dtype).__from_arrow__(chunked))
    return kept(chunked.to_pandas(types_mapper=_pandas_types().get).array)


@functools.cache
def _pandas_dtype(dtype: str):
    """The pandas dtype of a declared dtype of a nullable column: text as Arrow holds it (pd.StringDtype("pyarrow"),
    as Arrow's conversion makes it), Int64, boolean; and "str", the dtype of categories of text."""
    import pandas as pd

    if dtype == "str":  # text as pd.Index(..., dtype="str") holds it
        return pd.Index([], dtype="str").dtype
    return pd.StringDtype("pyarrow") if dtype == "string" else pd.api.types.pandas_dtype(dtype)


def _categorical(chunked: pa.ChunkedArray) -> pd.Series:
    """A dictionary column of text (arrow_type's) as _text_categories(chunked.to_pandas()) makes it, from its codes
    and its distinct values: the batches' dictionaries unified, the values sorted once, the codes renumbered.
    pandas' conversion and re-sorting of the categories took several times as long on a small table (a column of
    each of the few hundred tables a test run makes)."""
    import pandas as pd

    if chunked.type != pa.dictionary(pa.int32(), pa.string()):
        return _text_categories(chunked.to_pandas())
    if chunked.num_chunks > 1:
        chunked = chunked.unify_dictionaries()  # one dictionary for every chunk
    values = chunked.chunk(0).dictionary.to_pylist() if chunked.num_chunks else []
    if None in values:  # a null among the distinct values: pandas' conversion decides what it becomes
        return _text_categories(chunked.to_pandas())
    order = sorted(range(len(values)), key=values.__getitem__)  # code point order, as the text Index sorts
    rank = np.empty(len(values) + 1, dtype=np.int64)
    rank[order] = np.arange(len(values))
    rank[-1] = -1  # null stays null
    codes = [rank[_int32_codes(chunk.indices)] for chunk in chunked.chunks]
    dtype = text_dtype(tuple(values[i] for i in order))
    return pd.Series(pd.Categorical.from_codes(np.concatenate(codes) if codes else np.empty(0, dtype=np.int64),
                                               dtype=dtype))


_TEXT_DTYPES: dict = {}
TEXT_DTYPE_KEPT = 64  # categories of at most this many values are kept (a table's columns of few distinct texts)


def text_dtype(categories: tuple[str, ...]) -> pd.CategoricalDtype:
    """pd.CategoricalDtype(pd.Index(categories, dtype="str")) of distinct texts in lexical order. Made once per
    such tuple of few texts: building the Index and checking that its values are distinct cost more than the rest
    of a small table's column. A dtype is immutable, so the columns that have the same categories share one."""
    import pandas as pd

    dtype = _TEXT_DTYPES.get(categories)
    if dtype is None:
        dtype = pd.CategoricalDtype(pd.Index(list(categories), dtype="str"))
        if len(categories) <= TEXT_DTYPE_KEPT:
            if len(_TEXT_DTYPES) >= 4096:
                _TEXT_DTYPES.clear()
            _TEXT_DTYPES[categories] = dtype
    return dtype


def _int32_codes(indices: pa.Array) -> np.ndarray:
    """An int32 Arrow array as int64 values, −1 where null, read from its buffers."""
    if not len(indices):
        return np.empty(0, dtype=np.int64)
    codes = np.frombuffer(indices.buffers()[1], dtype=np.int32, count=len(indices),
                          offset=indices.offset * 4).astype(np.int64)
    if indices.null_count:
        codes[~_valid(indices)] = -1
    return codes


def _valid(array: pa.Array) -> np.ndarray:
    """Per value of an Arrow array with nulls, whether it is not null: its validity bitmap, unpacked."""
    return np.unpackbits(np.frombuffer(array.buffers()[0], dtype=np.uint8), bitorder="little",
                         count=array.offset + len(array))[array.offset:].astype(bool)


def _text_categories(series: pd.Series) -> pd.Series:
    """The same categorical with its categories as text (`str`, also when empty) in lexical order, so that
    categoricals of different tables can be unioned and compared."""
    import pandas as pd

    categories = series.cat.categories
    if categories.dtype == _pandas_dtype("str") and categories.is_monotonic_increasing:
        return series  # text in lexical order already (categories are distinct): what sorting would give
    wanted = pd.Index(categories, dtype="str").sort_values()
    if categories.dtype == wanted.dtype and categories.equals(wanted):
        return series
    return series.cat.set_categories(wanted)


def frame(rows: list[tuple], columns: tuple[Column, ...]) -> pd.DataFrame:
    if not rows:
        # a table of no rows (a point without a capture) is made once per declaration: each caller gets its own
        # shallow copy, which copy-on-write keeps apart from the others however it is changed
        return _empty_frame(columns).copy(deep=False)
    return frame_of([batch(rows, columns)], columns)


@functools.lru_cache(maxsize=16)
def _empty_frame(columns: tuple[Column, ...]) -> pd.DataFrame:
    return frame_of([batch([], columns)], columns)


def concat_column(parts: list[pd.Series]) -> pd.Series:
    """pd.concat that keeps a categorical a categorical when the parts' categories differ."""
    import pandas as pd
    from pandas.api.types import union_categoricals

    full = [p for p in parts if len(p)]
    if len(parts) > 1 and len(full) == 1:  # the others are empty (an app side of no rows, a DB capture alone)
        one = _concat_one(full[0], parts)
        if one is not None:  # named as the union or the concatenation names it
            same = isinstance(one.dtype, pd.CategoricalDtype) or all(p.name == parts[0].name for p in parts)
            return one.rename(parts[0].name if same else None)
    if len(parts) > 1 and all(isinstance(p.dtype, pd.CategoricalDtype) for p in parts):
        joined = union_categoricals([_text_categories(p) for p in parts], sort_categories=True, ignore_order=True)
        return pd.Series(joined, name=parts[0].name)
    dtype = parts[0].dtype
    if len(parts) > 1 and all(p.dtype == dtype for p in parts):
        # parts of one dtype that numpy holds (or times of one zone, as their int64 values): their values joined,
        # what pd.concat gives at a fraction of its cost on small parts
        name = parts[0].name if all(p.name == parts[0].name for p in parts) else None
        if isinstance(dtype, np.dtype) and dtype.kind in "biufM":
            return pd.Series(np.concatenate([p.to_numpy() for p in parts]), name=name)
        if isinstance(dtype, pd.DatetimeTZDtype):
            values = np.concatenate([p.array.asi8 for p in parts]).view(f"M8[{dtype.unit}]")
            return pd.Series(pd.array(values, dtype=dtype), name=name)
    return pd.concat(parts, ignore_index=True)


def concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """pd.concat(frames, ignore_index=True) of tables with the same columns, keeping categorical columns."""
    import pandas as pd

    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    names = list(frames[0].columns)
    # of the columns' arrays: a frame of Series would align their indexes; each in the form its values decide
    # (`held`), as a table read whole holds them
    return pd.DataFrame({n: held(concat_column([f[n] for f in frames]).rename(n)).array for n in names},
                        columns=names, copy=False)


def _concat_one(only: pd.Series, parts: list[pd.Series]) -> pd.Series | None:
    """concat_column(parts) when `only` is the one part with rows (the others: the loss repair's kept rows when it
    re-read every connection, an app side of no rows beside a DB capture alone), where that is the column itself,
    no copy of it: every part has its dtype, as concatenating would give; a categorical whose empty parts have no
    categories, with its categories as text in lexical order, as their union gives. None otherwise."""
    import pandas as pd

    if isinstance(only.dtype, pd.CategoricalDtype):
        if all(p is only or (isinstance(p.dtype, pd.CategoricalDtype) and not len(p.dtype.categories)) for p in parts):
            return _text_categories(only).reset_index(drop=True)
        return None
    held_as = declared_dtype(only.dtype)  # an empty part of the declared dtype beside a column held narrower: as is
    if any(p.dtype != only.dtype and (len(p) or held_as is None or declared_dtype(p.dtype) != held_as) for p in parts):
        return None
    return only.reset_index(drop=True)


def as_category(values) -> pd.Series:
    """Text values (array, list or Series; None/NA for null) as a categorical column."""
    import pandas as pd

    if isinstance(values, list) and all(type(v) is str or v is None for v in values):
        text = np.empty(len(values), dtype=object)
        text[:] = values
        values = text
    if isinstance(values, np.ndarray) and values.dtype == object:
        # the values hashed once (pd.factorize), not made into a string array first and looked up among the
        # categories: the same column
        codes, uniques = pd.factorize(values)
        if all(isinstance(u, str) for u in uniques):
            return labelled(codes, list(uniques))
    series = pd.Series(values, dtype="string") if not isinstance(values, pd.Series) else values.astype("string")
    categories = pd.Index(sorted(series.dropna().unique()), dtype="str")
    return pd.Series(pd.Categorical(series, categories=categories), index=series.index, name=series.name)


def null_boolean(n: int) -> pd.arrays.BooleanArray:
    """n nulls of dtype boolean (pd.array([pd.NA] * n, dtype="boolean") without a list of n objects)."""
    import pandas as pd

    return pd.arrays.BooleanArray(np.zeros(n, dtype=bool), np.ones(n, dtype=bool))


def null_int64(n: int) -> pd.arrays.IntegerArray:
    """n nulls of dtype Int64 (as pd.array([pd.NA] * n, dtype="Int64") makes them: 1 under the mask)."""
    import pandas as pd

    return pd.arrays.IntegerArray(np.ones(n, dtype=np.int64), np.ones(n, dtype=bool))


def null_column(n: int, dtype: str) -> pd.Series:
    """n nulls of dtype float64, Int64, boolean or datetime64[ns, UTC] (TS) that hold no bytes per row: one value
    read n times (a read-only array of stride 0). For a column null in every row that nothing writes into (a write
    in place raises): readers see the nulls, a copy or a file holds them as any column of nulls."""
    import pandas as pd

    if dtype == "boolean":
        return pd.Series(pd.arrays.BooleanArray(np.broadcast_to(np.False_, (n,)), np.broadcast_to(np.True_, (n,))),
                         copy=False)
    if dtype == "float64":
        return pd.Series(np.broadcast_to(np.float64(np.nan), (n,)), copy=False)
    if dtype == "Int64":
        return pd.Series(pd.arrays.IntegerArray(np.broadcast_to(np.int64(1), (n,)), np.broadcast_to(True, (n,))),
                         copy=False)
    if dtype == TS:
        return pd.Series(_times_of(np.broadcast_to(np.datetime64("NaT", "ns"), (n,))), copy=False)
    raise ValueError(f"null_column: no {dtype!r} column")


def _times_of(values: np.ndarray) -> pd.arrays.DatetimeArray:
    """datetime64[ns] values as a datetime64[ns, UTC] array of those very values (no copy: a read-only array of
    stride 0 stays one). pandas' public constructors copy them; its own constructor of a checked array does not."""
    import pandas as pd

    dtype = pd.DatetimeTZDtype("ns", "UTC")
    try:
        return pd.arrays.DatetimeArray._simple_new(values, dtype=dtype)
    except (AttributeError, TypeError):  # a pandas without it: the same values, copied
        return pd.array(np.array(values), dtype=dtype)


def labelled(codes: np.ndarray, labels: list[str]) -> pd.Series:
    """as_category(labels[codes]) (-1: null) from the codes: the labels that occur, sorted, as categories. Built
    from the codes, not by encoding one string a row."""
    import pandas as pd

    codes = np.asarray(codes, dtype=np.int64)
    present = np.bincount(codes[codes >= 0], minlength=len(labels)) > 0
    used = sorted(label for label, there in zip(labels, present) if there)
    rank = {label: i for i, label in enumerate(used)}
    remap = np.full(len(labels) + 1, -1, dtype=np.int64)  # the last entry: -1 stays -1
    for i, label in enumerate(labels):
        if present[i]:
            remap[i] = rank[label]
    return pd.Series(pd.Categorical.from_codes(remap[codes], dtype=text_dtype(tuple(used))))


def with_declared_dtypes(df: pd.DataFrame, columns: tuple[Column, ...]) -> pd.DataFrame:
    """`df`'s `columns`, in their order, each of the dtype the schema declares (converted only where it differs;
    under copy-on-write the selection copies nothing)."""
    out = df[[c.name for c in columns]]
    dtypes = dict(zip(out.columns, out.dtypes))  # the dtypes at once, not a column taken out per column
    for col in columns:
        held_so = col.dtype in _HELD and declared_dtype(dtypes[col.name]) == col.dtype  # int32 of a declared int64
        if str(dtypes[col.name]) != col.dtype and not held_so:
            out[col.name] = out[col.name].astype(col.dtype)
    return out


def as_declared(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with each whole-number column `held` narrower (int32, Int32) in its declared dtype (int64, Int64), as
    the files have it (the Parquet writer widens each row group as it writes it). The other columns are `df`'s own
    (copy-on-write); `df` itself when there is none."""
    import pandas as pd

    wide = {name: column.astype(declared_dtype(column.dtype)) for name, column in df.items()
            if column.dtype == np.int32 or column.dtype == _pandas_dtype("Int32")}
    if not wide:
        return df
    return pd.DataFrame({n: wide.get(n, c) for n, c in df.items()}, columns=df.columns, copy=False)


def hold_columns(df: pd.DataFrame) -> None:
    """Every column of `df` in its `held` form, in place (a column already so is left as it is)."""
    for name in df.columns:
        column = df[name]
        kept = held(column)
        if kept.array is not column.array and _backing(kept.array) is not _backing(column.array):
            df[name] = kept


def _backing(values):
    """The numpy array under a pandas array (its values: a masked array's data, a time array's ints)."""
    for attribute in ("_data", "_ndarray"):
        inner = getattr(values, attribute, None)
        if isinstance(inner, np.ndarray):
            return inner
    return values


def _stride_zero(values) -> bool:
    """The array (numpy, or a masked or time array's values) reads one value for every row."""
    data = _backing(values)
    return isinstance(data, np.ndarray) and data.ndim == 1 and len(data) > 1 and data.strides[0] == 0


# The declared dtypes whose columns `held` may keep in another form
_HELD = ("int64", "Int64", "boolean", TS)
_INT32 = np.iinfo(np.int32)
# Columns held as declared whatever their values: TCP sequence numbers are counted modulo 2^32 (the matching, the
# repair and the proxy add and subtract them), which int32 arithmetic would wrap at 2^31 first
KEPT_AS_DECLARED = frozenset({"req_tcp_seq", "resp_tcp_seq", "resp_tcp_end"})


def held(values):
    """The form a column (an array, or a Series: then a Series) of a declared dtype is held in while `analyze` runs:
    the same values in fewer bytes, decided by the values alone (so a table read in parts and concatenated holds
    the form the whole table read at once holds):
    - whole numbers (int64, Int64) that fit int32: int32 (Int32), 4 bytes a row instead of 8;
    - one value in every row (whole numbers, booleans, nulls of float64, Int64 or time): that value read n times,
      a read-only array of stride 0 (`null_column`), no bytes per row;
    anything else, and a Series of a column KEPT_AS_DECLARED, as it is. The stages read the values as before (a
    numpy sum or cumsum of int32 is taken in int64; a write into a column of stride 0 copies it under
    copy-on-write). The files hold the declared dtypes: the Parquet writer describes a column held so by its
    declared dtype (`declared_dtype`) and casts each row group; `as_declared` widens a whole table back."""
    import pandas as pd

    if isinstance(values, pd.Series):  # a Series of the held array, no copy of it (setting a column from a bare
        # array copies it: a dense copy of a stride-0 array); a column KEPT_AS_DECLARED as it is
        if values.name in KEPT_AS_DECLARED:
            return values
        return pd.Series(held(values.array), index=values.index, name=values.name, copy=False)
    n = len(values)
    if n < 2 or _stride_zero(values):
        return values
    if isinstance(values, pd.arrays.NumpyExtensionArray):
        values = values.to_numpy()
    if isinstance(values, np.ndarray):
        if values.dtype == np.float64:
            return null_column(n, "float64").to_numpy() if np.isnan(values).all() else values
        if values.dtype != np.int64 and values.dtype != np.int32:
            return values
        lo, hi = values.min(), values.max()
        if lo == hi:
            return np.broadcast_to(np.int64(lo), (n,))
        if values.dtype == np.int32 or not (_INT32.min <= lo and hi <= _INT32.max):
            return values
        return values.astype(np.int32)
    if isinstance(values, pd.arrays.IntegerArray) and values.dtype in (_pandas_dtype("Int64"), _pandas_dtype("Int32")):
        data, mask = values._data, values._mask
        if mask.all():
            return null_column(n, "Int64").array
        if values.dtype == _pandas_dtype("Int32"):
            return values
        valid = data[~mask]
        if _INT32.min <= valid.min() and valid.max() <= _INT32.max:
            return pd.arrays.IntegerArray(data.astype(np.int32), mask)  # a null's value cut as it is: not read
        return values
    if isinstance(values, pd.arrays.BooleanArray):
        data, mask = values._data, values._mask
        if not mask.any() and (data.all() or not data.any()):
            return pd.arrays.BooleanArray(np.broadcast_to(data[0], (n,)), np.broadcast_to(np.False_, (n,)))
        return values
    if isinstance(values, pd.arrays.DatetimeArray) and values.dtype == _pandas_dtype(TS) and values.isna().all():
        return null_column(n, TS).array
    return values


def _sort_key(column: pd.Series) -> np.ndarray:
    """int64 view of a key column (nanoseconds for timestamps: to_numpy() would make Timestamp objects)."""
    import pandas as pd

    if isinstance(column.dtype, pd.DatetimeTZDtype):
        return column.array.asi8
    return column.to_numpy(dtype=np.int64)


# From this many rows up, a table consumed column by column has each column deleted once taken, so that memory
# holds one table plus one column; below it the table is let go whole by the caller: a deletion costs the frame's
# width (pandas rebuilds its block map), more than a shorter column holds.
LET_GO_COLUMNS_FROM_ROWS = 1 << 16


def sorted_columnwise(frames: list[pd.DataFrame], keys: list[str]) -> pd.DataFrame:
    """concat(frames).sort_values(keys, stable) built one column at a time, each input column of a long frame
    dropped once used (LET_GO_COLUMNS_FROM_ROWS): the peak is one table plus one column, not the two or three copies
    of concat-then-sort."""
    import pandas as pd

    if len(frames) == 1 and len(frames[0]) < 2:
        return frames[0].reset_index(drop=True)
    key_arrays = [np.concatenate([_sort_key(f[k]) for f in frames]) for k in keys]
    order = np.lexsort(key_arrays[::-1])  # last key is the primary one for lexsort
    del key_arrays
    if np.array_equal(order, np.arange(len(order))):
        order = None  # already in order (one part, one connection…): no copy at all
    names = list(frames[0].columns)
    data = {}
    for name in names:
        column = concat_column([f[name] for f in frames])
        data[name] = held((column if order is None else column.take(order)).reset_index(drop=True).rename(name))
        for f in frames:
            if len(f) >= LET_GO_COLUMNS_FROM_ROWS:
                del f[name]
    return pd.DataFrame(data, columns=names, copy=False)


def arrow_without_pandas() -> None:
    """Arrow's conversion of Python values (pa.array of a list or of a numpy array) first imports pandas, to tell
    pandas objects apart, as costly as the rest of a small capture's whole `exchanges` run, which makes no
    DataFrame. When pandas is not imported yet, this lets Arrow's one attempt to import it fail (it then converts
    as without pandas: the same arrays). pandas stays importable: Arrow's conversions to and from pandas import it
    again themselves. For the `exchanges` command, before it reads."""
    import sys

    if "pandas" in sys.modules:
        return

    class NoPandas:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "pandas":
                raise ImportError("pandas is not imported while Arrow looks for it")

    sys.meta_path.insert(0, NoPandas)
    try:
        pa.array([], type=pa.int64())  # Arrow's one attempt
    finally:
        sys.meta_path.remove(NoPandas)


