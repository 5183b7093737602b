"""Writing outputs so that a failed or interrupted run never leaves a file or a folder that looks complete: every
file through one atomic writer (`write_atomically`: a temporary name beside it, renamed over it when whole), tables
as Parquet or CSV (`write_table`), analyze's folder as a set (`OutputFolder`), and a folder replaced whole
(`staged_folder`: evidence, compare)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import DETAILS_NAME, InputError, OutputError, UsageError, is_details_file
from .memory import release_memory

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` writes the file's content to `tmp` (beside `path`, hidden); then it replaces `path` at once. A
    failure leaves `path` as it was and no temporary file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: Path, text: str) -> None:
    """A UTF-8 text file, written atomically."""
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def check_output(out: Path) -> None:
    """Refuse a table output path before any work is done."""
    if out.suffix.lower() not in (".parquet", ".csv"):
        raise UsageError(f"--out must end in .parquet or .csv, got {out}")
    if not out.parent.exists():
        raise InputError(f"{out.parent}: output folder does not exist")
    if out.is_dir():
        raise InputError(f"{out}: is a directory, expected a file name")


def write_table(df: pd.DataFrame | pa.Table, out: Path, schema: pa.Schema | None = None) -> None:
    """Write .parquet or .csv atomically: a failed run leaves no partial file behind. `df` is a DataFrame, or (for
    .parquet) an Arrow table with `schema`, the file schema a DataFrame of its columns would be written with
    (tables.file_schema): it is written as that DataFrame would be, without importing pandas."""
    check_output(out)
    if schema is not None:
        if out.suffix.lower() != ".parquet":
            raise ValueError(f"{out}: an Arrow table is written to Parquet only")
        write_atomically(out, lambda tmp: _write_arrow_parquet(df, schema, tmp))
    elif out.suffix.lower() == ".parquet":
        write_atomically(out, lambda tmp: _write_parquet(df, tmp))
    else:
        # CRLF rows (RFC 4180): the writer then quotes every cell holding a CR or LF; with LF rows a lone CR in a
        # statement stayed unquoted and a reader split the row there
        write_atomically(out, lambda tmp: neutralise_formulas(df).to_csv(tmp, index=False, lineterminator="\r\n"))


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralise_formulas(df: pd.DataFrame) -> pd.DataFrame:
    """Text cells that a spreadsheet would run as a formula (starting with = + - @, tab or CR: statement text is
    written by whoever can send a query) get a leading apostrophe, which spreadsheets show as plain text. Only
    text columns are touched; numbers stay numbers. Returns `df` itself when no cell needs it."""
    import pandas as pd

    changed = {}
    for name in df.columns:
        col = df[name]
        if isinstance(col.dtype, pd.CategoricalDtype):
            values = pd.Series(col.cat.categories)
            if not (pd.api.types.is_object_dtype(values.dtype) or pd.api.types.is_string_dtype(values.dtype)):
                continue
            risky = values.astype(str).str.startswith(FORMULA_STARTS).to_numpy()
            if risky.any():
                safe = values.where(~risky, "'" + values.astype(str))
                if safe.is_unique:
                    changed[name] = col.cat.rename_categories(list(safe))
                else:  # "'=x" and "=x" both present: fall back to plain text
                    text = col.astype(object)
                    changed[name] = text.where(~text.astype(str).str.startswith(FORMULA_STARTS) | text.isna(),
                                               "'" + text.astype(str))
        elif pd.api.types.is_object_dtype(col.dtype) or pd.api.types.is_string_dtype(col.dtype):
            risky = col.map(lambda v: isinstance(v, str) and v.startswith(FORMULA_STARTS)).astype(bool)
            if risky.any():
                changed[name] = col.where(~risky, "'" + col.astype(str))
    return df.assign(**changed) if changed else df


PARQUET_ROWS_PER_GROUP = 1 << 17
THREADED_ROWS_PER_COLUMN = 100  # pa.Table.from_pandas converts a table of more rows per column on several threads


def _parquet_options(schema: pa.Schema) -> dict:
    """How each column of a file of this (file) schema is encoded, for both writers: choices that change how many
    bytes and how much time a file takes, never the values read back.
    - Text: dictionary pages (for numbers and times, nearly all distinct, Parquet would build a dictionary per
      column chunk and then give it up: half of the writing time, for a file no smaller), Snappy-compressed, and
      no min/max statistics (about half of a text column's writing time: the minimum and maximum of its values).
    - Whole numbers and times: DELTA_BINARY_PACKED, not compressed. Times, frame numbers and counters of rows in
      time order are small differences, which this encoding writes smaller and faster than plain + Snappy (see
      docs/speed.md). Their statistics stay: a reader skips row groups by time.
    - Floating point: plain, not compressed (Snappy took time and saved nothing on durations)."""
    import pyarrow as pa

    def is_text(t: pa.DataType) -> bool:
        return pa.types.is_string(t) or pa.types.is_large_string(t)

    text = [f.name for f in schema if is_text(f.type)]
    numbers = [f.name for f in schema if pa.types.is_integer(f.type) or pa.types.is_timestamp(f.type)]
    floats = [f.name for f in schema if pa.types.is_floating(f.type)]
    return {"use_dictionary": text, "store_schema": False,
            "column_encoding": dict.fromkeys(numbers, "DELTA_BINARY_PACKED"),
            "compression": {f.name: "none" if f.name in numbers or f.name in floats else "snappy" for f in schema},
            "write_statistics": [f.name for f in schema if not is_text(f.type)]}


def _write_parquet(df: pd.DataFrame, path: Path) -> None:
    """Row group by row group, categorical text written as plain text: whoever reads the file gets strings (as
    declared: `file_dtype`). Only one row group is ever converted at a time.

    Categorical text goes to Parquet as the Arrow dictionary it is (codes and the distinct values): Parquet stores
    text as dictionary pages anyway, and decoding each column to one string per row first, for Parquet to encode it
    back, took most of the writing time. The file's Arrow schema (ARROW:schema, and the pandas metadata) is the one
    of plain text, written as pyarrow writes it: readers see exactly what they saw before."""
    import pyarrow.parquet as pq

    schema, written, options = _parquet_schemas(df)
    with pq.ParquetWriter(path, written, **options) as writer:
        for start in range(0, max(len(df), 1), PARQUET_ROWS_PER_GROUP):
            writer.write_table(_row_group(df.iloc[start:start + PARQUET_ROWS_PER_GROUP], written))
        _end_parquet(writer, schema)


def _row_group(rows: pd.DataFrame, written: pa.Schema) -> pa.Table:
    """One row group of _write_parquet's (and write_merged's) file: the rows' columns as Arrow arrays of the
    written schema."""
    import pyarrow as pa

    if len(rows) > THREADED_ROWS_PER_COLUMN * len(rows.columns):  # pyarrow converts these on its threads
        columns = pa.Table.from_pandas(rows, preserve_index=False).columns
    else:  # each column as from_pandas converts it (pa.array), without the description it makes and we drop
        columns = [pa.array(column, from_pandas=True) for _, column in rows.items()]
    return pa.Table.from_arrays([col if col.type == field.type else col.cast(field.type)
                                 for col, field in zip(columns, written)], schema=written)


def _end_parquet(writer, schema: pa.Schema) -> None:
    """The file's key-value metadata, as pyarrow writes it for a table of `schema` (ARROW:schema, pandas)."""
    import base64

    writer.add_key_value_metadata({b"ARROW:schema": base64.b64encode(schema.serialize().to_pybytes()),
                                   **(schema.metadata or {})})


_SCHEMAS: dict = {}


def _parquet_schemas(df: pd.DataFrame) -> tuple[pa.Schema, pa.Schema, dict]:
    """For _write_parquet: the file's schema (with its pandas metadata) as if the categorical text columns were
    plain strings, the schema written (those columns as dictionaries of that text) and the writer's options.

    They depend on nothing but the frame's column labels and dtypes (and a categorical's code width), so they are
    made once per such signature: pandas' description of a frame (three conversions of it to Arrow) cost more than
    writing a small table. A frame with `attrs` (which pandas' metadata records) is described each time."""
    import pandas as pd

    dtypes = df.dtypes
    text = [c for c, t in dtypes.items() if isinstance(t, pd.CategoricalDtype)]
    key = None
    if not df.attrs:
        # a categorical by what its description takes of it (not its categories, which differ from run to run)
        described = {c: ("category", df[c].array.codes.dtype, dtypes[c].categories.dtype, dtypes[c].ordered)
                     for c in text}
        key = (type(df.columns), df.columns.dtype, df.columns.name, tuple(df.columns),
               tuple(described.get(c, t) for c, t in dtypes.items()))
        try:
            return _SCHEMAS[key]
        except KeyError:
            pass
        except TypeError:  # a label or dtype that cannot be hashed
            key = None
    made = _described(df, set(text))
    if key is not None:
        if len(_SCHEMAS) >= 64:  # code widths vary with the number of categories: keep the memo small
            _SCHEMAS.clear()
        _SCHEMAS[key] = made
    return made


def _described(df: pd.DataFrame, text: set) -> tuple[pa.Schema, pa.Schema, dict]:
    import pyarrow as pa

    from .schema import Column
    from .tables import as_declared, declared_dtype, file_schema

    # the file's schema (and its pandas metadata) as if the text columns were plain strings: a frame of declared
    # dtypes and text labels, without attrs, is described from the declarations (pandas' description converts the
    # frame three times); any other as pandas describes it
    declared = [declared_dtype(t) for t in df.dtypes]
    if not df.attrs and None not in declared and all(type(c) is str for c in df.columns) and df.columns.is_unique:
        schema = file_schema(tuple(Column(c, d, "") for c, d in zip(df.columns, declared)))
    else:  # whole numbers held in int32 (tables.held) described as the int64 they are declared as
        schema = pa.Schema.from_pandas(as_declared(df.iloc[:0]).astype({c: "string" for c in text}),
                                       preserve_index=False)
    # what is written: the text columns as dictionaries of that text, indexed by the categorical's codes as they
    # are (pyarrow converts a categorical's codes to its dictionary's indices of the same width)
    written = pa.schema([pa.field(f.name, pa.dictionary(pa.from_numpy_dtype(df[f.name].array.codes.dtype), f.type)
                                  if f.name in text else f.type) for f in schema])
    return schema, written, _parquet_options(schema)


def _write_arrow_parquet(table: pa.Table, schema: pa.Schema, path: Path) -> None:
    """_write_parquet of an Arrow table (tables.table_of) whose file schema is `schema` (tables.file_schema: the
    ARROW:schema and pandas metadata pandas writes): the same row groups, encodings and values. Categorical text
    goes to Parquet as the Arrow dictionary it is, unified within each row group so that each column chunk has
    one dictionary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:  # as core/tables.py: without importing pyarrow.compute
        from pyarrow._compute import CastOptions, call_function
    except ImportError:
        from pyarrow.compute import CastOptions, call_function

    written = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), f.type) if pa.types.is_dictionary(t) else f.type)
                         for f, t in zip(schema, table.schema.types, strict=True)])

    def group(start: int) -> pa.Table:
        part = table.slice(start, PARQUET_ROWS_PER_GROUP).unify_dictionaries()
        return pa.Table.from_arrays([col if col.type == field.type else
                                     call_function("cast", [col], CastOptions.safe(field.type))
                                     for col, field in zip(part.columns, written)], schema=written)

    with pq.ParquetWriter(path, written, **_parquet_options(schema)) as writer:
        for start in range(0, max(table.num_rows, 1), PARQUET_ROWS_PER_GROUP):
            writer.write_table(group(start))
        _end_parquet(writer, schema)


# --- one file from sorted runs (the partitioned analysis' writer: docs/partitioned.md §2.3) ----------------------

MERGE_STEP = 8192  # rows of each run the k-way merge looks at in one step


@dataclass(frozen=True)
class SortedRun:
    """A partition's rows of exchanges.parquet, sorted by their keys: `table` (the columns and dtypes of the
    file's table; or a StoredRows, read a slice at a time) and `keys` (one row of int64 per row of the table,
    compared column by column: pair.match.row_key; the array, or a KeyFile, read when asked). `key`: the keys as
    an array (a KeyFile's read back whole, each time it is asked: not kept); `keys` has `len()`, `shape` and
    slices of rows `[a:b]` either way (what merged_order reads)."""

    table: pd.DataFrame | StoredRows
    keys: np.ndarray | KeyFile

    @property
    def key(self) -> np.ndarray:
        return key_array(self.keys)


class KeyFile:
    """A run's row keys (n × k int64, SortedRun's) in a .npy file, held nowhere: `len()`, `shape`, the rows
    `[a:b]` read alone from the file (the merge's windows: merged_order holds runs × MERGE_STEP keys, not all of
    them), `whole()` the array read back. The partitioned run's (run/spilled.py: written where a partition is
    stored, on a Dask worker maybe; the object is its path and header, cheap to send back). Read with plain reads
    at the data's offset, not memory-mapped: a mapping's pages once read stay in the process' RSS until it is
    unmapped, and a merge reads every one (docs/partitioned.md §26)."""

    def __init__(self, path: Path):
        import numpy as np

        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = header(f)
            self.offset = f.tell()  # where the rows begin
        if fortran or len(shape) != 2:
            raise ValueError(f"{path}: not a table of row keys (shape {shape}, Fortran order {fortran})")
        self.path, self.shape, self.dtype = path, tuple(shape), dtype

    @classmethod
    def written(cls, path: Path, keys: np.ndarray) -> KeyFile:
        """`keys` (n × k) written to `path` (.npy), as a KeyFile."""
        import numpy as np

        np.save(path, np.ascontiguousarray(keys), allow_pickle=False)
        return cls(path)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> np.ndarray:
        """The keys of rows a:b (a slice of step 1), read from the file into an array of their own."""
        import numpy as np

        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError(f"a KeyFile reads slices of rows, not {rows!r}")
        first, end, _ = rows.indices(len(self))
        out = np.empty((max(end - first, 0), self.shape[1]), dtype=self.dtype)
        if out.nbytes:
            with open(self.path, "rb") as f:
                f.seek(self.offset + first * self.shape[1] * self.dtype.itemsize)
                read = f.readinto(out.reshape(-1).view(np.uint8))
            if read != out.nbytes:
                raise OSError(f"{self.path}: {read} bytes of keys read, {out.nbytes} asked")
        return out

    def whole(self) -> np.ndarray:
        import numpy as np

        return np.load(self.path, allow_pickle=False)

    def mapped(self) -> np.ndarray:
        """The keys as a read-only map of the file, for a few rows read here and there (a binary search): only the
        pages read come in, and go with the map. Not for a pass over all of them (see the class)."""
        import numpy as np

        return np.load(self.path, mmap_mode="r", allow_pickle=False)


def key_array(keys: np.ndarray | KeyFile) -> np.ndarray:
    """Row keys as an array: a KeyFile's read back whole (SortedRun.keys)."""
    return keys.whole() if isinstance(keys, KeyFile) else keys


class StoredRows:
    """A run's rows kept out of memory for write_merged (the partitioned run, run/spilled.py): `len()` rows, read
    back a slice at a time by `rows(first, end)` in the file's columns and dtypes (each slice asked for starts where
    the one before ended: the merge reads a run in its order), and `empty()`, the columns and dtypes without rows."""

    def __len__(self) -> int:
        raise NotImplementedError

    def rows(self, first: int, end: int) -> pd.DataFrame:
        raise NotImplementedError

    def empty(self) -> pd.DataFrame:
        raise NotImplementedError

    def take(self, rows: list[int]) -> pd.DataFrame:
        """The rows at `rows` (sorted, distinct), in the file's columns and dtypes: each read alone."""
        import pandas as pd

        return pd.concat([self.rows(i, i + 1) for i in rows], ignore_index=True) if len(rows) else self.empty()


def merged_order(keys: list[np.ndarray | KeyFile], step: int | None = None
                 ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The k-way merge of runs each sorted by its keys (n × k int64, compared column by column): the merged order
    as successive pieces (run, row in that run). A step looks at the next `step` (MERGE_STEP) rows of each run:
    every row whose (key, run) is at most the least (last key, run) of the windows that stop short of their run's
    end goes out, sorted (a run's later rows are all above it), so equal keys go out run by run. O(runs × step)
    held at a time. A run's keys are read through `len()` and slices `[a:b]` alone: an array's, or a KeyFile's
    (its windows read from the file as the merge reaches them)."""
    import numpy as np

    step = step or MERGE_STEP
    cursors = [0] * len(keys)
    while True:
        windows = [(r, k[cursors[r]:cursors[r] + step]) for r, k in enumerate(keys) if cursors[r] < len(k)]
        if not windows:
            return
        short = [(r, w[-1]) for r, w in windows if cursors[r] + step < len(keys[r])]
        if short:
            lasts = np.array([last for _, last in short])
            least = np.lexsort((np.array([r for r, _ in short]), *lasts.T[::-1]))[0]
            bound_run, bound = short[least]
            takes = [(r, w[:_count_at_most(w, r <= bound_run, bound)]) for r, w in windows]
        else:  # every window reaches its run's end: all of them
            takes = windows
        run = np.concatenate([np.full(len(w), r, dtype=np.int64) for r, w in takes])
        row = np.concatenate([np.arange(cursors[r], cursors[r] + len(w), dtype=np.int64) for r, w in takes])
        key = np.concatenate([w for _, w in takes])
        order = np.lexsort((row, run, *key.T[::-1]))
        for r, w in takes:
            cursors[r] += len(w)
        yield run[order], row[order]


def _count_at_most(window: np.ndarray, tie: bool, bound: np.ndarray) -> int:
    """How many of a sorted window's keys are at most `bound` (they come first): compared column by column, and an
    equal key counted when `tie` (its run is not after the bound's: equal keys go out run by run)."""
    import numpy as np

    at_most = np.full(len(window), tie, dtype=bool)
    for j in range(window.shape[1] - 1, -1, -1):  # from the last column: below, or equal and the rest at most
        at_most = (window[:, j] < bound[j]) | ((window[:, j] == bound[j]) & at_most)
    return int(at_most.sum())


def write_merged(runs: list[SortedRun], out: Path, categories: dict[str, list],
                 merged_rows: Callable[[np.ndarray, np.ndarray], None] | None = None) -> None:
    """exchanges.parquet from sorted runs (the partitions' rows, each run sorted by its keys): the file
    write_table writes of the runs' rows merged in key order, byte for byte (the same row groups, schema, encodings
    and key-value metadata), without the whole table in memory: the rows go through a k-way merge into one row
    group of PARQUET_ROWS_PER_GROUP rows at a time. `categories`: each categorical column's categories, as today's
    table would have them (explain.servers.output_categories: every row group's dictionary page is the whole list,
    so it must be known before the first row); a run's values are recoded to them. At least one run (it may be
    empty: it gives the columns and dtypes). `merged_rows`: called with each piece of the merged order (run, row in
    that run) as it is written, for what is made of the rows in row order beside the file (summary.json's sums:
    explain.summaryruns); the file is the same with it or without."""
    check_output(out)
    if out.suffix.lower() != ".parquet":
        raise ValueError(f"{out}: the merged writer writes Parquet")
    if not runs:
        raise ValueError("write_merged of no run")
    write_atomically(out, lambda tmp: _write_merged(runs, tmp, categories, merged_rows))


def _write_merged(runs: list[SortedRun], path: Path, categories: dict[str, list], merged_rows) -> None:
    import pandas as pd
    import pyarrow.parquet as pq

    # a run in memory is recoded whole; a stored one slice by slice, as it is read (Recoding)
    tables = [_recoded(r.table, categories) if isinstance(r.table, pd.DataFrame) else Recoding(r.table, categories)
              for r in runs]
    for t, r in zip(tables, runs):
        if len(t) != len(r.keys):
            raise ValueError(f"a run of {len(t)} rows with {len(r.keys)} keys")
    first = tables[0]
    stored = not all(isinstance(t, pd.DataFrame) for t in tables)
    schema, written, options = _parquet_schemas(first.iloc[:0] if isinstance(first, pd.DataFrame) else first.empty())
    with pq.ParquetWriter(path, written, **options) as writer:
        pending: list[tuple] = []
        held = 0
        for run, row in merged_order([r.keys for r in runs]):
            if merged_rows is not None:
                merged_rows(run, row)
            pending.append((run, row))
            held += len(run)
            while held >= PARQUET_ROWS_PER_GROUP:
                group, pending, held = _take_group(tables, pending, PARQUET_ROWS_PER_GROUP, written)
                writer.write_table(group)
                del group
                if stored:  # the group's pieces, its pandas slices and the writer's pages, back before the next
                    release_memory()
        if held or not sum(len(t) for t in tables):
            group = _take_group(tables, pending, held, written)[0] if held else \
                _row_group(first.iloc[:0] if isinstance(first, pd.DataFrame) else first.empty(), written)
            writer.write_table(group)
        _end_parquet(writer, schema)


def _take_group(tables: list, pending: list[tuple], size: int, written: pa.Schema) -> tuple[pa.Table, list, int]:
    """The first `size` rows of the pending merged order as one row group of the written schema (each run's rows are
    consecutive there), and what is left of the order. Runs in memory: their rows gathered as one pandas table, then
    converted (_row_group); stored runs (Recoding): each run's slice converted as it is read, the Arrow pieces then
    put in order, so that the group is held in pandas' form one slice at a time."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    if not all(isinstance(t, pd.DataFrame) for t in tables):
        run, row, rest, left = _first_of_order(pending, size)
        pieces, places = [], []
        for r in np.unique(run):
            mine = np.flatnonzero(run == r)
            rows = row[mine]
            pieces.append(_row_group(tables[r].rows(int(rows[0]), int(rows[-1]) + 1), written))
            places.append(mine)
        position = np.empty(len(run), dtype=np.int64)
        position[np.concatenate(places)] = np.arange(len(run))
        group = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        del pieces
        order, taken = pa.array(position), []
        for _ in written.names:  # a column at a time, let go once it is in order: the group is held once, not twice
            column = group.column(0)
            group = group.remove_column(0)
            taken.append(column.take(order))
            del column
        return pa.Table.from_arrays(taken, schema=written).combine_chunks(), rest, left

    run, row, rest, left = _first_of_order(pending, size)
    pieces, places = [], []
    for r in np.unique(run):
        mine = np.flatnonzero(run == r)
        rows = row[mine]
        pieces.append(tables[r].iloc[int(rows[0]):int(rows[-1]) + 1])  # a run goes out in its order: a slice
        places.append(mine)
    group = pd.concat(pieces, ignore_index=True) if len(pieces) > 1 else pieces[0].reset_index(drop=True)
    position = np.empty(len(run), dtype=np.int64)
    position[np.concatenate(places)] = np.arange(len(run))
    return _row_group(group.take(position).reset_index(drop=True), written), rest, left


def _first_of_order(pending: list[tuple], size: int) -> tuple:
    """The first `size` (run, row) of the pending merged order, what is left of it and how many are left."""
    import numpy as np

    run = np.concatenate([r for r, _ in pending])
    row = np.concatenate([w for _, w in pending])
    left = len(run) - size
    rest = [(run[size:], row[size:])] if left else []
    return run[:size], row[:size], rest, left


class Recoding(StoredRows):
    """A StoredRows whose slices come recoded to the file's categories (_recoded): as write_merged reads a stored run,
    and the partitioned run's summary (explain.summaryruns) reads the same rows. Each column's recoding is made once
    per dtype its slices come in (a stored partition's slices share their columns' dtypes: core.framefile), not
    once per slice."""

    def __init__(self, stored: StoredRows, categories: dict[str, list]):
        self.stored, self.categories = stored, categories
        self._recodings: dict = {}

    def __len__(self) -> int:
        return len(self.stored)

    def rows(self, first: int, end: int) -> pd.DataFrame:
        return _recoded(self.stored.rows(first, end), self.categories, self._recodings)

    def take(self, rows: list[int]) -> pd.DataFrame:
        return _recoded(self.stored.take(rows), self.categories, self._recodings)  # recoded once, not row by row

    def empty(self) -> pd.DataFrame:
        return _recoded(self.stored.empty(), self.categories, self._recodings)


def _recoded(table: pd.DataFrame, categories: dict[str, list], recodings: dict | None = None) -> pd.DataFrame:
    """`table` with each categorical column's categories set to `categories` (its values kept); a value not among
    them is an error, not a null. `recodings`: each column's recoding by the dtype it was made for (kept there,
    _recoding), for the slices of one run."""
    import pandas as pd

    changed = {}
    for name, dtype in table.dtypes.items():
        if not isinstance(dtype, pd.CategoricalDtype):
            continue
        if name not in categories:
            raise ValueError(f"no categories given for {name}")
        known = recodings.get((name, id(dtype))) if recodings is not None else None
        if known is None or known[0] is not dtype:  # (the dtype kept with it: its id is not another's meanwhile)
            known = (dtype, _recoding(dtype, categories[name]))
            if recodings is not None:
                recodings[(name, id(dtype))] = known
        if known[1] is None:
            continue  # the same text (whatever the Index's dtype): the same dictionary written
        code_map, wanted = known[1]
        codes = table[name].cat.codes.to_numpy()
        recoded = code_map[codes]  # code −1 (null) takes the map's last entry, −1
        if ((recoded < 0) & (codes >= 0)).any():
            missing = sorted(set(table[name].dropna().astype(str)) - set(wanted.categories))
            raise ValueError(f"{name}: values not among its categories: {missing[:5]}")
        changed[name] = pd.Categorical.from_codes(recoded, dtype=wanted)
    return table.assign(**changed) if changed else table


def _recoding(dtype: pd.CategoricalDtype, categories: list) -> tuple[np.ndarray, pd.CategoricalDtype] | None:
    """How a categorical of `dtype` is recoded to `categories` (text, in the file's order), as
    `cat.set_categories` recodes it: each code's new code (−1 for a value not among them; one entry more, −1, for
    a null's code), and the dtype; None when the categories are already those."""
    import numpy as np
    import pandas as pd

    if len(dtype.categories) == len(categories) and list(dtype.categories) == list(categories):
        return None
    wanted = pd.Index(list(categories), dtype="str")
    code_map = np.append(wanted.get_indexer(dtype.categories), -1)
    return code_map, pd.CategoricalDtype(wanted, ordered=dtype.ordered)


# --- an output folder written as a set ------------------------------------------------------------------------
#
# `analyze` writes its files into a staging folder inside the output folder, then moves them in one after the other
# under an INCOMPLETE.txt marker, which is removed last: a run that fails or is interrupted removes its staging folder
# and leaves the previous run's files as they were; a crash in the millisecond of renaming leaves INCOMPLETE.txt
# (and `evidence` refuses such a folder). The previous run's files (named in the manifest it left, plus the names
# older versions wrote) are removed before the new ones move in, so a folder never mixes two runs; files of anyone
# else are left alone. Staging inside the output folder (not next to it) works where only that folder is writable
# and when it is a mount point. A lock (flock on the folder) refuses a second run on the same folder.

INCOMPLETE_NAME = "INCOMPLETE.txt"
_MARKER_START = b"pcapdecomp was replacing the outputs"
MANIFEST_NAME = ".pcapdecomp-outputs.json"
STAGING_PREFIX = ".pcapdecomp-partial-"
# what a manifest may make a run remove: output kinds only (a manifest is only a file in a folder, and must not make
# a run delete captures or logs), and the folders our runs write (each holding a manifest of its own)
OUTPUT_SUFFIXES = (".parquet", ".csv", ".json", ".html", ".md", ".txt", ".pcapng")
OWN_FOLDERS = ("evidence", "exchanges", "analyses")  # analyze --evidence, --partitioned; compare's analyses/


def listed_outputs(out: Path) -> set[str]:
    """The names the manifest of `out` lists as written by a run of ours, that a new run may replace or remove."""
    try:
        listed = json.loads((out / MANIFEST_NAME).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    if not isinstance(listed, list):
        return set()
    return {n for n in listed if isinstance(n, str) and n and "/" not in n and "\\" not in n and not n.startswith(".")
            and (n.endswith(OUTPUT_SUFFIXES) or n in OWN_FOLDERS) and n not in (INCOMPLETE_NAME, DETAILS_NAME)}


def _not_ours(out: Path, names) -> list[str]:
    """Of `names`, those present in `out` that no run of ours wrote there (its manifest does not list them)."""
    if not out.is_dir():
        return []
    listed = listed_outputs(out)
    return sorted(n for n in names if n not in listed and ((out / n).exists() or (out / n).is_symlink())
                  and not (n == DETAILS_NAME and is_details_file(out / n))
                  and not (n == INCOMPLETE_NAME and _is_marker(out / n)))


def _is_marker(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return not path.is_symlink() and f.read(len(_MARKER_START)) == _MARKER_START
    except OSError:
        return False


def _refuse(out: Path, clash: list[str]) -> None:
    shown = ", ".join(clash[:5]) + (f" and {len(clash) - 5} more" if len(clash) > 5 else "")
    raise UsageError(f"{out}: holds {shown}, which no pcapdecomp run wrote there (not in its {MANIFEST_NAME}); "
                     "choose another --out or move them away")


class OutputFolder:
    """`with OutputFolder(out) as folder:` write into `folder.staging`, then `folder.commit()`. Leaving the block
    without commit (an error, Ctrl-C) removes the staging folder, and the output folder too when this run made it.

    The folder rule: a run replaces or removes only what the folder's manifest (MANIFEST_NAME, written by every
    commit) lists; anything else in the folder is left alone, and a run whose outputs would replace such a file
    refuses (UsageError: one line, exit 2), before its work when `names` (what it will write) are given, else at
    commit, touching nothing."""

    def __init__(self, out: Path, names=()):
        self.out = out
        self.names = tuple(names)
        self.staging = out / f"{STAGING_PREFIX}{os.getpid()}"
        self.committed: list[Path] = []
        self._made = False
        self._owner = False  # this run holds the folder's lock
        self._lock_fd: int | None = None

    def __enter__(self) -> "OutputFolder":
        out = self.out
        if out.exists() and not out.is_dir():
            raise InputError(f"{out}: exists and is not a folder")
        clash = _not_ours(out, self.names)
        if clash:
            _refuse(out, clash)
        try:
            self._made = not out.exists()
            out.mkdir(parents=True, exist_ok=True)
            self._lock()
            for stale in out.glob(f"{STAGING_PREFIX}*"):  # of a run that was killed: no run holds the lock
                _remove(stale)
            self.staging.mkdir()
        except OSError as err:
            self._release(failed=True)
            raise OutputError(f"{out}: cannot write the output folder: {err.strerror or err}") from None
        except BaseException:  # Ctrl-C, also the one taken as mkdir returns: the staging folder goes too
            _remove(self.staging)
            self._release(failed=True)
            raise
        return self

    def __exit__(self, kind, exc, tb) -> None:
        _remove(self.staging)
        self._release(failed=kind is not None)

    def commit(self) -> list[Path]:
        """Move every file of the staging folder into the output folder, replacing the previous run's files (those
        its manifest lists); a file of the same name that no run of ours wrote makes the commit refuse."""
        out = self.out
        names = sorted(p.name for p in self.staging.iterdir())
        clash = _not_ours(out, [*names, INCOMPLETE_NAME])
        if clash:
            _refuse(out, clash)
        with interrupts_deferred():
            try:
                marker = out / INCOMPLETE_NAME
                marker.write_bytes(_MARKER_START + b" in this folder when it stopped: the files here may come from "
                                   b"two runs. Run `pcapdecomp analyze` again.\n")
                for name in sorted(self._previous() - {INCOMPLETE_NAME}):
                    _remove(out / name)
                for name in names:
                    os.replace(self.staging / name, out / name)
                write_text(out / MANIFEST_NAME, json.dumps({"files": names}) + "\n")
                marker.unlink()
            except OSError as err:
                raise OutputError(f"{out}: cannot write the outputs: {err.strerror or err}") from None
        _register(out)
        self.committed = [out / name for name in names]
        return self.committed

    def _previous(self) -> set[str]:
        """The previous run's files: what its manifest lists, and an internal-error.txt of ours."""
        names = listed_outputs(self.out)
        if is_details_file(self.out / DETAILS_NAME):
            names.add(DETAILS_NAME)
        return names

    def _lock(self) -> None:
        """flock on the output folder itself: released by the kernel when the process ends, however it ends."""
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            self._owner = True
            return
        for _ in range(5):
            fd = os.open(self.out, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise UsageError(f"{self.out}: another pcapdecomp run is writing this folder; wait for it to finish "
                                 "or choose another --out") from None
            except OSError:  # a file system without flock (some NFS mounts): no lock
                os.close(fd)
                self._owner = True
                return
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.out))
            except FileNotFoundError:
                same = False
            if same:  # not a folder that a failed run removed while we opened it
                self._lock_fd = fd
                self._owner = True
                return
            os.close(fd)
            self.out.mkdir(parents=True, exist_ok=True)
        raise OutputError(f"{self.out}: cannot lock the output folder")

    def _release(self, failed: bool) -> None:
        if self._made and failed and self._owner:  # nothing of this run stays (internal-error.txt may follow)
            try:
                self.out.rmdir()
            except OSError:
                pass
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):  # not there: below a file, nothing is
            pass


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C (and SIGTERM, which the CLI unwinds as one) waits until the block is done (the renames of a commit
    take milliseconds; a spill folder's removal, run.spilled.SpillFolder, a fraction of a second), then
    interrupts."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(caught):
            if callable(previous[s]):  # Python's handler (default_int_handler raises KeyboardInterrupt)
                previous[s](s, None)
            elif previous[s] == signal.SIG_DFL:
                signal.raise_signal(s)


# --- a folder replaced whole ------------------------------------------------------------------------------------


@contextmanager
def staged_folder(out: Path, names=()) -> Iterator[Path]:
    """`with staged_folder(out) as tmp:` write the folder's files into `tmp`; when the block ends normally they
    replace the previous run's (OutputFolder's rule: only what the folder's manifest lists; other files stay, and a
    file of ours that would replace one of them makes it refuse). Whatever happens, `tmp` is gone afterwards: a
    failure leaves `out` as it was."""
    with OutputFolder(out, names) as folder:
        yield folder.staging
        folder.commit()


def _register(out: Path) -> None:
    """A folder of ours written inside another folder of ours (evidence/ in an analysis) is listed in that one's
    manifest too, so that the next run there replaces it, as every other of its outputs."""
    parent = out.parent
    if out.name not in OWN_FOLDERS or not (parent / MANIFEST_NAME).is_file():
        return
    try:
        manifest = json.loads((parent / MANIFEST_NAME).read_text(encoding="utf-8"))
        files = manifest["files"]
        if isinstance(files, list) and out.name not in files:
            write_text(parent / MANIFEST_NAME, json.dumps({**manifest, "files": [*files, out.name]}) + "\n")
    except (OSError, ValueError, KeyError, TypeError):
        pass
