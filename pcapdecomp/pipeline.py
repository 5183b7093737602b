"""Runs the stages in order. The CLI calls these; they raise PcapdecompError subclasses for user mistakes."""

from __future__ import annotations

import ipaddress
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from .errors import InputError, UsageError
from .exchanges import Extraction, extract
from .flows import Endpoint


def parse_server(text: str) -> Endpoint:
    """'10.0.0.5:3306' or '[fd00::5]:3306' -> (ip, port)."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--server must be HOST:PORT with a numeric port, got {text!r}")
    try:
        ip = str(ipaddress.ip_address(host))
    except ValueError:
        raise UsageError(f"--server host must be an IP address, got {host!r}") from None
    return ip, int(port)


def check_input(path: Path) -> None:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a capture file")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: empty file")


@contextmanager
def progress_bar(quiet: bool, label: str) -> Iterator:
    """A rich progress bar on stderr (bytes done, MB/s, frames/s, ETA); None when quiet. The bar starts at the first
    update, so that worker processes are forked before its refresh thread exists, and quick runs show none."""
    if quiet:
        yield None
        return
    state: dict = {}

    def update(done: int, total: int, frames: int) -> None:
        if "bar" not in state:
            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)

            console = Console(stderr=True)
            bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                           TransferSpeedColumn(), TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                           console=console, transient=True, disable=not console.is_terminal)
            bar.start()
            state.update(bar=bar, task=bar.add_task(label, total=total, rate=""), start=time.monotonic())
        elapsed = time.monotonic() - state["start"]
        rate = f"{frames / elapsed / 1000:,.0f}k frames/s" if elapsed > 0.5 else ""
        state["bar"].update(state["task"], completed=done, total=total, rate=rate)

    try:
        yield update
    finally:
        if "bar" in state:
            state["bar"].stop()


def read_exchanges(capture: Path, servers: list[str], quiet: bool, max_sql_bytes: int = 1 << 20,
                   jobs: int = 1) -> Extraction:
    return read_captures([capture], servers, quiet, max_sql_bytes, jobs)[0]


def read_captures(captures: list[Path], servers: list[str], quiet: bool, max_sql_bytes: int = 1 << 20,
                  jobs: int = 1) -> list[Extraction]:
    """Extract every capture (with up to `jobs` processes), showing one progress bar for all of them."""
    from .parallel import extract_all

    for capture in captures:
        check_input(capture)
    endpoints = {parse_server(s) for s in servers}
    label = captures[0].name if len(captures) == 1 else f"{len(captures)} captures"
    with progress_bar(quiet, label) as update:
        return extract_all(list(captures), endpoints or None, max_sql_bytes, jobs, update)


def check_output(out: Path) -> None:
    """Refuse a table output path before any work is done."""
    if out.suffix.lower() not in (".parquet", ".csv"):
        raise UsageError(f"--out must end in .parquet or .csv, got {out}")
    if not out.parent.exists():
        raise InputError(f"{out.parent}: output folder does not exist")
    if out.is_dir():
        raise InputError(f"{out}: is a directory, expected a file name")


def write_table(df: pd.DataFrame, out: Path) -> None:
    """Write .parquet or .csv atomically: a failed run leaves no partial file behind."""
    check_output(out)
    suffix = out.suffix.lower()
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        if suffix == ".parquet":
            _write_parquet(df, tmp)
        else:
            df.to_csv(tmp, index=False)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()


PARQUET_ROWS_PER_GROUP = 1 << 17


def _write_parquet(df: pd.DataFrame, path: Path) -> None:
    """Row group by row group, categorical text written as plain text: whoever reads the file gets strings (as
    declared: `file_dtype`), and Parquet dictionary-encodes repetitive text on disk by itself. Only one row group
    is ever converted at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = {c for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)}
    # the file's schema (and its pandas metadata) as if the text columns were plain strings
    schema = pa.Schema.from_pandas(df.iloc[:0].astype({c: "string" for c in text}), preserve_index=False)

    def group(start: int) -> pa.Table:
        # categoricals arrive as Arrow dictionaries and are decoded to text by Arrow: no Python string per cell
        part = pa.Table.from_pandas(df.iloc[start:start + PARQUET_ROWS_PER_GROUP], preserve_index=False)
        return pa.Table.from_arrays([col.cast(field.type) for col, field in zip(part.columns, schema)],
                                    schema=schema)

    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, max(len(df), 1), PARQUET_ROWS_PER_GROUP):
            writer.write_table(group(start))


def capture_problems(q: dict) -> str | None:
    """One warning line per capture: damage, lost or unreadable frames, and whether MySQL was found at all."""
    counts = [f"{q[k]} {label}" for k, label in (
        ("frames_truncated", "frames cut by the snaplen"), ("frames_ip_fragment", "IP fragments"),
        ("frames_bad_ts", "frames with a broken timestamp (given a neighbour's)"),
        ("frames_undecodable", "undecodable frames"), ("frames_unknown_link", "frames of unknown link types"),
        ("if_drops", "packets dropped by the capturing interface"), ("unknown_blocks", "unknown pcapng blocks"),
        ("gaps", "gaps in TCP streams"), ("gaps_forced", "of them declared by the out-of-order memory cap"),
        ("gap_bytes", "bytes never captured"),
        ("unparsed_bytes", "bytes skipped while resynchronising"), ("tls_bytes", "encrypted (TLS) bytes"),
        ("violations", "protocol violations"), ("out_of_range", "exchanges with a number out of range"))
        if q.get(k)]
    parts = []
    if q.get("damaged"):
        parts.append(f"{q['damaged']}; analysed the {q['frames']} frames before it")
    if counts:
        parts.append(", ".join(counts))
    if q.get("exchanges") == 0 and q.get("mysql_connections") == 0:
        parts.append(f"no MySQL traffic found ({q['frames']} frames read)")
    return f"{q['file']}: " + "; ".join(parts) if parts else None


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)
