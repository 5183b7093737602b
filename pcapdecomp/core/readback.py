"""Reading an analysis folder back (evidence, compare): what `analyze` wrote, checked against its declarations in
core/schema.py before anything is built on it. Such folders travel with tickets: a value of the wrong type is one line
naming it (InputError, exit 2), and a table cannot make the reader allocate more than its file's size justifies."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import InputError
from .schema import ANALYSIS_COLUMNS, CATEGORY, EXCHANGE_COLUMNS, SUMMARY_KEYS, TS, Column

if TYPE_CHECKING:
    import pandas as pd

# The smallest file bytes per row of an exchanges table as analyze writes it: a row holds several times, frame and
# sequence numbers that no encoding stores in less (the bundled analyses take 145–910 bytes a row). A file claiming
# more rows than this allows is not ours, and reading it would allocate memory its size does not justify.
MIN_FILE_BYTES_PER_ROW = 8
EXCHANGES = (*EXCHANGE_COLUMNS, *ANALYSIS_COLUMNS)


def _type_fits(arrow_type, dtype: str) -> bool:
    import pyarrow as pa

    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    if pa.types.is_null(t):  # a column of nulls only
        return True
    if dtype in (CATEGORY, "string"):
        return pa.types.is_string(t) or pa.types.is_large_string(t)
    if dtype in ("int64", "Int64"):
        return pa.types.is_integer(t)
    if dtype == "float64":
        return pa.types.is_floating(t)
    if dtype == "boolean":
        return pa.types.is_boolean(t)
    if dtype == TS:
        return pa.types.is_timestamp(t)
    return True


def read_table(path: Path, declared: tuple[Column, ...] = EXCHANGES, columns: list[str] | None = None
               ) -> pd.DataFrame:
    """The Parquet table at `path` (only `columns` when given), after checking its row count against its size
    (MIN_FILE_BYTES_PER_ROW) and each declared column's type."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(path)
        size = os.path.getsize(path)
    except (OSError, ValueError, pa.ArrowException) as err:
        raise InputError(f"{path}: not readable as Parquet: {err}") from None
    rows = f.metadata.num_rows
    groups = sum(f.metadata.row_group(i).num_rows for i in range(f.metadata.num_row_groups))
    if rows < 0 or groups != rows or rows * MIN_FILE_BYTES_PER_ROW > max(size, 0):
        raise InputError(f"{path}: claims {rows:,} rows in {size:,} bytes, more than a table pcapdecomp writes "
                         f"holds (at least {MIN_FILE_BYTES_PER_ROW} bytes a row): not read")
    wanted = set(columns) if columns is not None else None
    by_name = {c.name: c for c in declared}
    for field in f.schema_arrow:
        column = by_name.get(field.name)
        if column is None or (wanted is not None and field.name not in wanted):
            continue
        if not _type_fits(field.type, column.dtype):
            raise InputError(f"{path}: column {field.name} holds {field.type}, not {column.dtype} as declared "
                             "(`pcapdecomp columns`): not as pcapdecomp writes it; run `pcapdecomp analyze` again")
    try:
        return pd.read_parquet(path, columns=columns)
    except (OSError, ValueError, TypeError, pa.ArrowException) as err:
        raise InputError(f"{path}: not readable: {err}") from None


_JSON_TYPES = {"int": (int,), "float": (int, float), "string": (str,), "boolean": (bool,), "object": (dict,),
               "null": (type(None),), "list[object]": (list,), "list[string]": (list,)}


def _json_fits(value, dtype: str) -> bool:
    kinds = dtype.split("|")
    for kind in kinds:
        types = _JSON_TYPES.get(kind)
        if types is None:
            return True  # a type word this check does not know: not checked
        if isinstance(value, bool) and kind in ("int", "float"):
            continue
        if isinstance(value, types):
            if kind == "list[string]":
                return all(isinstance(v, str) for v in value)
            if kind == "list[object]":
                return all(isinstance(v, dict) for v in value)
            return True
    return False


def read_summary(path: Path) -> dict:
    """summary.json, after checking the type of every key schema.SUMMARY_KEYS declares (where present)."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError(f"{path}: not readable as JSON: {err}") from None
    if not isinstance(summary, dict):
        raise InputError(f"{path}: not an analysis summary (a JSON object is expected)")
    for key in SUMMARY_KEYS:
        if "*" in key.name:
            continue
        value, found = summary, True
        for part in key.name.split("."):
            if not isinstance(value, dict) or part not in value:
                found = False
                break
            value = value[part]
        if found and not _json_fits(value, key.dtype):
            raise InputError(f"{path}: {key.name} holds {type(value).__name__} {json.dumps(value)[:40]}, not "
                             f"{key.dtype} as declared: not as pcapdecomp writes it; run `pcapdecomp analyze` again")
    return summary
