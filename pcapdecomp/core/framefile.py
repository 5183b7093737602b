"""A DataFrame kept out of memory in an Arrow IPC file and read back exactly, a slice at a time: the partitioned
run's stored partitions (run/spilled.py) and 7a's runs made once (explain/partitioned.py), in the run's spill folder.

Arrow IPC, not pickles: the spill folder may be on a file system others can write (`--spill DIR --scheduler`: one
the Dask workers share), and unpickling a file someone replaced runs whatever code it names; an IPC file is only
data, each batch validated in full as it is read and a categorical's codes checked against its categories
(docs/security.md). It is also cheaper to read back in pieces:
a record batch is read as its bytes and a slice of it converted, where a pickle was decoded whole for a few of its
rows, again each time the merge came back to it.

Exactly: each column's dtype is the frame's. A categorical is written as its codes (int, −1 for a null) and its
categories in the file's metadata (JSON: the values, their Index's dtype, whether ordered), read back by
`pd.Categorical.from_codes` with one dtype made per file (no categories rebuilt or compared per slice; the codes
checked against them); the other
columns as pyarrow converts them with the pandas metadata it writes (nullable integers and booleans, Arrow strings,
times with their zone), floats as their values (a NaN's bits kept, not made a null)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

_CATEGORIES = b"pcapdecomp:categories"  # the schema's metadata key of the categoricals' categories
_ROWS = b"pcapdecomp:rows"  # … and of the row count and the rows of a batch


class FrameFile:
    """`table` (a DataFrame with a RangeIndex) written to `path` in record batches of `batch_rows` rows (one batch
    converted at a time), then read back by `rows(first, end)`: the rows first … end − 1 with the table's columns
    and dtypes. The batch read last is held (the merge and the summary read a partition slice after slice).
    Picklable (a Dask worker hands one back): the path, the row count and the dtypes, not the open file.
    `FrameFile.of(path)` opens a file another process wrote, its dtypes from the file."""

    def __init__(self, path: Path, table: pd.DataFrame, batch_rows: int):
        import pyarrow as pa
        import pyarrow.ipc as ipc

        self.path, self.n, self.batch_rows = Path(path), len(table), batch_rows
        self._empty = _empty(dict(table.dtypes.items()))
        categoricals = _categoricals(table)
        codes = table.assign(**{name: table[name].cat.codes for name in categoricals}) if categoricals else table
        schema = pa.Schema.from_pandas(codes.iloc[:0], preserve_index=False)
        schema = schema.with_metadata({**(schema.metadata or {}), _CATEGORIES: _described(table, categoricals),
                                       _ROWS: json.dumps([self.n, batch_rows]).encode()})
        # converted whole (per batch, pyarrow's per-call work cost three times the conversion), floats as their
        # values: from_pandas would write a NaN as a null, which reads back as a NaN of its own bits
        arrow = pa.Table.from_pandas(codes, schema=schema, preserve_index=False)
        for i, (name, dtype) in enumerate(codes.dtypes.items()):
            if isinstance(dtype, np.dtype) and dtype.kind == "f":
                arrow = arrow.set_column(i, schema.field(i), pa.array(codes[name].to_numpy(), type=schema.types[i]))
        del codes
        # batch k must hold rows k × batch_rows … (rows() finds a row's batch by division): written a slice at a
        # time, each slice's chunks combined. write_table(max_chunksize=) also cuts at the table's own chunk
        # edges, and a column pandas concatenated (Arrow text of two app points' tables) has some: batches came
        # out shorter, and rows() read the wrong rows and too few of them (a partition of 47,831 rows read back
        # as 34,407)
        with pa.OSFile(str(self.path), "wb") as sink, ipc.new_file(sink, schema) as writer:
            for first in range(0, self.n, batch_rows):
                writer.write_batch(arrow.slice(first, batch_rows).combine_chunks().to_batches()[0])
        self._opened()

    @classmethod
    def of(cls, path: Path) -> FrameFile:
        """The FrameFile written to `path` (by this process or another), its dtypes as the file records them."""
        self = cls.__new__(cls)
        self.path = Path(path)
        self._opened()
        reader = self._reader()
        self.n, self.batch_rows = json.loads(reader.schema.metadata[_ROWS])
        self._dtypes = _dtypes_of(reader.schema)
        self._empty = _empty(self._dtypes)
        return self

    @classmethod
    def read(cls, path: Path) -> pd.DataFrame:
        """The whole frame written to `path` (by this process or another), the file let go once read."""
        stored = cls.of(path)
        try:
            return stored.rows(0, len(stored))
        finally:
            stored.close()

    def _opened(self) -> None:
        self._file = None  # the open file and its reader, opened when first read (not pickled)
        self._held: tuple[int, pa.RecordBatch] | None = None
        self._dtypes: dict | None = None

    def __getstate__(self) -> dict:
        return {"path": self.path, "n": self.n, "batch_rows": self.batch_rows, "_empty": self._empty}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._opened()

    def __len__(self) -> int:
        return self.n

    def empty(self) -> pd.DataFrame:
        """The columns and dtypes without rows."""
        return self._empty

    def close(self) -> None:
        """The open file let go (it is opened again when read)."""
        if self._file is not None:
            self._file[0].close()
        self._opened()

    def _reader(self):
        import pyarrow as pa
        import pyarrow.ipc as ipc

        if self._file is None:
            # read, not memory-mapped: a mapped file's pages would stay in the run's resident memory once read
            source = pa.OSFile(str(self.path), "rb")
            self._file = (source, ipc.open_file(source))
        return self._file[1]

    def _batch(self, k: int) -> pa.RecordBatch:
        if self._held is None or self._held[0] != k:
            self._held = None  # the batch held before, let go before this one is read
            batch = self._reader().get_batch(k)
            batch.validate(full=True)  # a damaged or replaced file is an error here, not memory read out of bounds
            self._held = (k, batch)
        return self._held[1]

    def rows(self, first: int, end: int) -> pd.DataFrame:
        """Rows first … end − 1 (0 ≤ first ≤ end ≤ len), in the table's columns and dtypes, with a RangeIndex."""
        import pyarrow as pa

        if end <= first:
            return self._empty
        size = self.batch_rows
        batches = [self._batch(k) for k in range(first // size, (end - 1) // size + 1)]
        at = first - (first // size) * size
        part = pa.Table.from_batches(batches).slice(at, end - first)
        del batches  # the batches now the slice's alone (but the one held): let go column by column as converted
        return self._frame(part)

    def _frame(self, part: pa.Table) -> pd.DataFrame:
        """The rows of `part` (codes for the categoricals) as the table held them."""
        import pandas as pd

        if self._dtypes is None:
            self._dtypes = dict(self._empty.dtypes.items())
        import pyarrow as pa

        for i, field in enumerate(part.schema):
            if part.num_rows and (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)
                                  or pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type)):
                # copied out: pandas holds Arrow text as it is, which would keep the whole read batch (every
                # column's bytes) alive as long as the column is
                part = part.set_column(i, field, pa.chunked_array([pa.concat_arrays(part.column(i).chunks)],
                                                                  field.type))
        frame = part.to_pandas(self_destruct=True)  # each column's Arrow form let go once it is pandas'
        del part
        categorical = {name: pd.Categorical.from_codes(frame[name].to_numpy(), dtype=dtype)
                       for name, dtype in self._dtypes.items() if isinstance(dtype, pd.CategoricalDtype)}
        return frame.assign(**categorical) if categorical else frame


def _empty(dtypes: dict) -> pd.DataFrame:
    """A frame of these columns and dtypes without rows, made new: a slice of a table (`iloc[:0]`, even copied)
    keeps an Arrow string column's buffers, here a whole read batch's, as long as it is held."""
    import pandas as pd

    return pd.DataFrame({name: pd.Series([], dtype=dtype) for name, dtype in dtypes.items()})


def _categoricals(table: pd.DataFrame) -> list[str]:
    import pandas as pd

    return [name for name, dtype in table.dtypes.items() if isinstance(dtype, pd.CategoricalDtype)]


def _described(table: pd.DataFrame, categoricals: list[str]) -> bytes:
    """The categoricals' dtypes as JSON (their values, their Index's dtype, whether ordered); values JSON does not
    give back as they are (neither text nor a number) are refused, not written changed."""
    described = {}
    for name in categoricals:
        dtype = table[name].dtype
        values = dtype.categories.tolist()
        if json.loads(json.dumps(values)) != values:  # a NaN among them is not equal to itself: refused too
            raise ValueError(f"{name}: categories JSON does not keep exactly")
        described[name] = {"values": values, "index": str(dtype.categories.dtype), "ordered": bool(dtype.ordered)}
    return json.dumps(described).encode()


def _dtypes_of(schema: pa.Schema) -> dict:
    """Each column's dtype as the file records it: the categoricals' from the metadata, the rest as pyarrow
    converts the (pandas-described) schema."""
    import pandas as pd

    empty = schema.empty_table().to_pandas()
    dtypes = dict(empty.dtypes.items())
    for name, d in json.loads((schema.metadata or {})[_CATEGORIES]).items():
        dtypes[name] = pd.CategoricalDtype(pd.Index(d["values"], dtype=d["index"]), ordered=d["ordered"])
    return dtypes

