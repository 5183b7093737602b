"""The extraction's spill (docs/partitioned.md §3, step 3 of §5): a point's exchange rows written, as the lane's
batches and the Python reader's chunks arrive, into Arrow IPC stream files in BUCKETS buckets by the partition key,
so that what the extraction holds is the batch being written, not the table.

The key: a request's TCP sequence number above WINDOW_BITS (a piece of 64 KiB of the connection's request stream),
hashed stably into BUCKETS buckets. Both capture points see the same sequence number for the same bytes (with or
without NAT), so the app's and the DB's rows of one exchange land in the same bucket; a repeat of a number inside a
connection (after 4 GiB) lands in the same piece.

`SpillWriter` writes one extraction (or one part of it, `extract(part=…)`) and gives a `Spill`: the files and the
rows in each bucket, small and picklable (a worker's extraction crosses to the parent with it). `Spill.table()`
reads the buckets back into the table the in-memory extraction makes (the same rows, order and dictionaries);
`Spill.bucket(b)` reads one bucket, its parts' connections renumbered as `exchanges.merge_parts` numbers them."""

from __future__ import annotations

import hashlib
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..core.schema import EXCHANGE_COLUMNS, Column
from ..core.tables import arrow_type, table_of

BUCKETS = 256  # the fine buckets a point spills into; a partition of the analysis is a run of them
WINDOW_BITS = 16  # a piece of a connection: its requests whose TCP sequence number shares the bits above these
SEQ_BITS = 32  # a TCP sequence number's width: the pieces are the 2^(32 - WINDOW_BITS) values of seq >> WINDOW_BITS
SORT_BY = ["req_first_ts", "conn_index", "seq"]  # the extraction's row order (exchanges.extract's table_of)


def stable_hash(keys: np.ndarray) -> np.ndarray:
    """A hash (int64, ≥ 0) of each key's text that is the same in every process and run: Python's hash of str is
    salted. Made once per distinct key."""
    distinct, inverse = np.unique(keys, return_inverse=True)
    digests = np.array([int.from_bytes(hashlib.blake2b(str(k).encode(), digest_size=8).digest(), "little") >> 1
                        for k in distinct], dtype=np.int64)
    return digests[inverse]


_PIECES = 1 << (SEQ_BITS - WINDOW_BITS)  # the values of seq >> WINDOW_BITS
_bucket_of_piece = np.full(_PIECES, -1, dtype=np.int64)  # each piece's bucket, once it is met (−1: not yet)


def partition_buckets(req_tcp_seq: np.ndarray) -> np.ndarray:
    """The bucket of each request's TCP sequence number (the partition key of docs/partitioned.md §3): its piece
    (seq >> WINDOW_BITS) as decimal text, hashed by `stable_hash`, modulo BUCKETS. Each piece is hashed once per
    process, when first met (a capture meets a few hundred; all 65,536 would take 0.15 s)."""
    pieces = np.asarray(req_tcp_seq, dtype=np.int64) >> WINDOW_BITS
    buckets = _bucket_of_piece[pieces]
    if (buckets < 0).any():
        new = np.unique(pieces[buckets < 0])
        _bucket_of_piece[new] = stable_hash(new.astype(str).astype(object)) % BUCKETS
        buckets = _bucket_of_piece[pieces]
    return buckets


def _bucket_file(folder: Path, bucket: int) -> Path:
    return folder / f"bucket-{bucket:03d}.arrows"


def int64_values(array: pa.Array, null: int = 0) -> np.ndarray:
    """An integer or timestamp column of a batch as int64 numpy values, `null` where null (the spill's default 0:
    every exchange has its sequence number; a null one goes with piece 0 rather than failing); an int64 or
    timestamp column is read from its buffers, without a copy when it has no nulls."""
    if pa.types.is_timestamp(array.type):
        array = array.cast(pa.int64())
    if array.null_count:
        array = array.fill_null(null)
    if not pa.types.is_int64(array.type):
        return array.to_numpy(zero_copy_only=False).astype(np.int64)
    return np.frombuffer(array.buffers()[1], dtype=np.int64, count=len(array), offset=array.offset * 8)


def _compacted(array: pa.Array) -> pa.Array:
    """A dictionary column of one bucket's slice with the dictionary entries its rows use only. A slice shares its
    batch's dictionary: written as it is, every bucket's file would get a copy of the whole dictionary of every
    batch (a batch of statements with literals: 64 K texts, 256 times). The union of the slices' dictionaries is
    the batch's (the lane and dictionary_encode list the values the rows have), so reading back gives the same
    categories."""
    if not isinstance(array, pa.DictionaryArray) or len(array.dictionary) <= 1:
        return array
    indices = array.indices
    codes = np.frombuffer(indices.buffers()[1], dtype=np.int32, count=len(indices), offset=indices.offset * 4)
    valid = None
    if indices.null_count:
        valid = np.unpackbits(np.frombuffer(indices.buffers()[0], dtype=np.uint8), bitorder="little",
                              count=indices.offset + len(indices))[indices.offset:].astype(bool)
        codes = np.where(valid, codes, 0)
    used, renumbered = np.unique(codes if valid is None else codes[valid], return_inverse=True)
    if len(used) == len(array.dictionary):
        return array
    if valid is not None:
        full = np.zeros(len(codes), dtype=np.int32)
        full[valid] = renumbered
        renumbered = full
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    new_indices = pa.Array.from_buffers(pa.int32(), len(codes),
                                        [bitmap, pa.py_buffer(renumbered.astype(np.int32, copy=False))])
    dictionary = array.dictionary.take(pa.Array.from_buffers(pa.int64(), len(used),
                                                             [None, pa.py_buffer(used.astype(np.int64))]))
    return pa.DictionaryArray.from_arrays(new_indices, dictionary)


class SpillWriter:
    """Writes a point's exchange rows into `folder` (made if missing), one IPC stream file per bucket, opened when
    its first rows come. `add(batch)` takes record batches of `columns` (the extraction's); `close()` gives the
    `Spill`. Memory: the batch being cut (a stable sort by bucket, then slices); the files' bytes are the
    system's page cache."""

    def __init__(self, folder: str | os.PathLike, columns: tuple[Column, ...] = EXCHANGE_COLUMNS, *,
                 rows_dropped: bool = False):
        self.folder = Path(folder)
        # rows_dropped: the batches come with rows taken out (a window): only then can a dictionary hold entries no
        # row does, and only then are they looked for (a bincount per dictionary column of every batch)
        self._rows_dropped = rows_dropped
        self.folder.mkdir(parents=True, exist_ok=True)
        self.columns = columns
        self.schema = pa.schema([(c.name, arrow_type(c)) for c in columns])
        self._seq = [c.name for c in columns].index("req_tcp_seq")
        self._writers: dict[int, tuple[pa.NativeFile, pa.ipc.RecordBatchStreamWriter]] = {}
        self.rows = np.zeros(BUCKETS, dtype=np.int64)
        self.unused: dict[str, set] = {}  # per dictionary column: the batches' entries none of their rows holds

    def add(self, batch: pa.RecordBatch) -> None:
        if self._rows_dropped:
            self._keep_unused(batch)
        if not batch.num_rows:
            return
        buckets = partition_buckets(int64_values(batch.column(self._seq)))
        counts = np.bincount(buckets, minlength=BUCKETS)
        order = np.argsort(buckets, kind="stable")  # a bucket's rows keep the batch's order
        start = 0
        for bucket in np.flatnonzero(counts):
            n = int(counts[bucket])
            rows = np.ascontiguousarray(order[start:start + n])
            start += n
            # taken bucket by bucket, not the whole batch in bucket order: a copy of one bucket's rows at a time
            piece = batch.take(pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(rows)]))
            self._writer(int(bucket)).write_batch(
                pa.RecordBatch.from_arrays([_compacted(a) for a in piece.columns], schema=self.schema))
        self.rows += counts

    def _keep_unused(self, batch: pa.RecordBatch) -> None:
        """The dictionary entries of `batch` that none of its rows holds (the rows analyze --since/--until dropped
        before the batch came, read/exchanges.py): the compacted slices lose them, the in-memory extraction's
        table keeps them among its categories (unused entries included: exchanges.parquet's dictionaries). Kept
        here, given back by `Spill.unused_values`. A batch without a window holds every entry of its dictionaries: the
        writer looks only when told rows were dropped."""
        for name, column in zip(batch.schema.names, batch.columns):
            if not isinstance(column, pa.DictionaryArray) or not len(column.dictionary):
                continue
            indices = column.indices
            codes = np.frombuffer(indices.buffers()[1], dtype=np.int32, count=len(indices), offset=indices.offset * 4)
            if indices.null_count:
                codes = codes[np.asarray(indices.is_valid())]
            held = np.bincount(codes, minlength=len(column.dictionary)) > 0
            if not held.all():
                unused = column.dictionary.filter(pa.array(~held)).to_pylist()
                self.unused.setdefault(name, set()).update(v for v in unused if v is not None)

    def _writer(self, bucket: int) -> pa.ipc.RecordBatchStreamWriter:
        held = self._writers.get(bucket)
        if held is None:
            sink = pa.OSFile(str(_bucket_file(self.folder, bucket)), "wb")
            held = self._writers[bucket] = (sink, pa.ipc.new_stream(sink, self.schema))
        return held[1]

    def close(self) -> Spill:
        for sink, writer in self._writers.values():
            writer.close()
            sink.close()
        self._writers.clear()
        return Spill([SpillPart(self.folder, self.rows.copy(), unused={k: sorted(v) for k, v in self.unused.items()})],
                     self.columns)


@dataclass
class SpillPart:
    """One writer's buckets: its folder, the rows in each bucket, and the renumbering of its connections
    (`conn_index` → the merged extraction's, as merge_parts numbers them; None: as written)."""

    folder: Path
    rows: np.ndarray
    conn_index: np.ndarray | None = None
    unused: dict[str, list] = field(default_factory=dict)  # SpillWriter.unused: per column, entries no row holds


@dataclass
class Spill:
    """A point's spilled exchange rows: its parts' buckets (one part, or the parts of a capture read by several
    trackers, in part order)."""

    parts: list[SpillPart]
    columns: tuple[Column, ...] = field(default=EXCHANGE_COLUMNS)

    @property
    def rows(self) -> np.ndarray:
        """Rows per bucket, every part's."""
        return np.sum([p.rows for p in self.parts], axis=0) if self.parts else np.zeros(BUCKETS, dtype=np.int64)

    def renumbered(self, conn_index: list[np.ndarray]) -> Spill:
        """The same buckets with each part's connections renumbered by `conn_index[i]` (indexed by part i's
        conn_index: what merge_parts makes of it)."""
        return Spill([SpillPart(p.folder, p.rows, n, p.unused) for p, n in zip(self.parts, conn_index, strict=True)],
                     self.columns)

    def unused_values(self) -> dict[str, set]:
        """Per dictionary column, the entries of the written batches' dictionaries that none of their rows held
        (a window's dropped rows'): the categories the in-memory extraction's table has beyond the rows' values."""
        out: dict[str, set] = {}
        for part in self.parts:
            for name, values in part.unused.items():
                out.setdefault(name, set()).update(values)
        return out

    def bucket(self, bucket: int, maps: list[mmap.mmap] | None = None) -> list[pa.RecordBatch]:
        """Bucket `bucket`'s rows of every part, as written (part by part, each in its batches' order), with the
        connections renumbered. The batches are the files' pages, mapped (their maps appended to `maps`)."""
        out: list[pa.RecordBatch] = []
        for part in self.parts:
            if not part.rows[bucket]:
                continue
            with open(_bucket_file(part.folder, bucket), "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            if maps is not None:
                maps.append(mapped)
            batches = list(pa.ipc.open_stream(pa.BufferReader(pa.py_buffer(mapped))))
            if part.conn_index is not None:
                batches = [_with_conn_index(b, part.conn_index) for b in batches]
            out.extend(batches)
        return out

    def table(self) -> pa.Table:
        """Every bucket read back and put in the extraction's row order (SORT_BY: unique per row, so the order is
        the in-memory extraction's whatever the buckets' order): the table `exchanges.extract` makes without a
        spill.
        The batches are the files mapped, not read: the table is rebuilt column by column (table_of), and after
        each column the pages it read are let go (MADV_DONTNEED: clean pages of a file, read again if asked), so
        the rebuild holds the new table and one column of the old, as the in-memory extraction's sort does. Read
        into memory instead, a batch's columns share one buffer, freed only with the last of them: the rebuild
        held the spill's rows and the table at once."""
        maps: list[mmap.mmap] = []
        batches = [b for bucket in np.flatnonzero(self.rows) for b in self.bucket(int(bucket), maps)]

        def let_go() -> None:
            for mapped in maps:
                mapped.madvise(mmap.MADV_DONTNEED)

        return _with_unused(table_of(batches, self.columns, sort_by=SORT_BY, after_column=let_go),
                            self.unused_values())


def _with_unused(table: pa.Table, unused: dict[str, set]) -> pa.Table:
    """`table` with `unused` (per dictionary column, entries no row holds) added to its columns' dictionaries, as
    the in-memory extraction's table has them (the codes unchanged: the entries come after the unified ones)."""
    for name, values in unused.items():
        i = table.schema.get_field_index(name)
        chunked = table.column(i).unify_dictionaries()
        present = chunked.chunk(0).dictionary if chunked.num_chunks else pa.array([], pa.string())
        more = sorted(set(values) - set(present.to_pylist()))
        if not more:
            continue
        dictionary = pa.concat_arrays([present, pa.array(more, present.type)])
        chunks = [pa.DictionaryArray.from_arrays(c.indices, dictionary) for c in chunked.chunks] or \
            [pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), dictionary)]
        table = table.set_column(i, table.schema.field(i), pa.chunked_array(chunks, chunked.type))
    return table


def _with_conn_index(batch: pa.RecordBatch, ranks: np.ndarray) -> pa.RecordBatch:
    i = batch.schema.get_field_index("conn_index")
    renumbered = np.ascontiguousarray(ranks[int64_values(batch.column(i))], dtype=np.int64)
    return batch.set_column(i, "conn_index",
                            pa.Array.from_buffers(pa.int64(), len(renumbered), [None, pa.py_buffer(renumbered)]))
