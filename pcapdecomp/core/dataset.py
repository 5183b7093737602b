"""`analyze --partitioned`: the exchanges table also as a Parquet dataset, partitioned hive-style by capture point:
`exchanges/host=<host>/capture=<capture>/part-0.parquet`. DuckDB (`read_parquet('exchanges/**/*.parquet',
hive_partitioning = true)`), Spark (`spark.read.parquet("exchanges/")`), Dask (`dask.dataframe.read_parquet`) and
pyarrow.dataset read it directly, and a query that names a host or capture reads only that folder.

The files hold every column of exchanges.parquet except `capture`, which is in the path (URI-encoded: every engine
above decodes it back to the exact text), and `host` (schema.DATASET_COLUMNS) is added there too."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from .schema import DATASET_COLUMNS
from .tables import as_declared

PARTITION_ROWS = 1 << 17  # rows converted to Arrow at a time


def host_of(point_name: str) -> str:
    """A capture point's host as the dataset names it: its folder's or file's name without the capture suffixes
    (app-web1/ → app-web1, db.pcap → db, db.pcap* → db)."""
    name = Path(point_name.rstrip("/")).name
    return re.sub(r"(\.(pcapng|pcap|cap)\d*)?(\.gz)?\*?( \(rotated\))?$", "", name) or name


def write_dataset(exchanges: pd.DataFrame, folder: Path, hosts: dict[str, str]) -> str:
    """Write the dataset into `folder` (which must not exist); `hosts`: capture -> host. Returns the folder's name."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    text = [c for c in exchanges.columns if isinstance(exchanges[c].dtype, pd.CategoricalDtype)]
    host_col = DATASET_COLUMNS[0].name
    # described in the declared dtypes (as_declared: whole numbers held narrower are widened as they are written)
    schema = pa.Schema.from_pandas(as_declared(exchanges.iloc[:0]).astype({c: "string" for c in text}),
                                   preserve_index=False)
    schema = schema.append(pa.field(host_col, pa.string()))

    def batches():
        for start in range(0, len(exchanges), PARTITION_ROWS):
            part = exchanges.iloc[start:start + PARTITION_ROWS]
            table = pa.Table.from_pandas(part, preserve_index=False)
            captures = part["capture"].astype(object).to_numpy()
            host = pa.array([hosts.get(c, host_of(str(c))) for c in captures], pa.string())
            arrays = [col.cast(field.type) for col, field in zip(table.columns, schema)] + [host]
            yield from pa.Table.from_arrays(arrays, schema=schema).to_batches()

    partitioning = ds.partitioning(pa.schema([(host_col, pa.string()), ("capture", pa.string())]), flavor="hive")
    ds.write_dataset(batches(), folder, schema=schema, format="parquet", partitioning=partitioning,
                     basename_template="part-{i}.parquet", existing_data_behavior="error")
    if not len(exchanges):
        folder.mkdir(parents=True, exist_ok=True)
    return folder.name
