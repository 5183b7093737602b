"""`analyze --spill DIR` (run/spilled.py, docs/partitioned.md step 7): the partitioned run writes the very files the
in-memory run writes — exchanges.parquet, groups.parquet, pool.parquet and summary.json byte for byte (cmp),
report.html too but for the command line it shows — on every set it takes: each bundled pair without its slow log
(the set's long_query_time, thread_pool_size and processlist given), as a pair and as its DB capture alone; each
bundled set with its slow log (the folder as it is, and its DB capture alone with the log), the join per connection
(§14); the test captures' pair, alone and with a slow log of another day; and the 10 s recordings (skipped when
absent), the read-write one with its slow log too. A set it does not take (a proxy, frames lost, a slow log the
join per connection refuses) is analysed in memory after one line, with the same outputs; a DIR it cannot write is
one line, exit 2. summary.json is made from the stored partitions (§15), across several partitions; the projection
the report is made from (REPORT_COLUMNS) holds every column it reads. With --scheduler (docs/partitioned.md §16)
the partitions' work runs on Dask workers: the same files on a LocalCluster of 2 processes, and one line when a
worker cannot see DIR."""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pcapdecomp.analysis import capture_set
from pcapdecomp.explain.partitioned import TARGET_ROWS
from pcapdecomp.explain.summaryruns import LATENCY_COLUMNS
from pcapdecomp.run import spilled

from partitioning import CAPTURES, PAIRS, PROXY_SETS, RECORDED, REPO

sys.path.insert(0, str(REPO / "scripts"))

from lose_frames import lose_frames  # noqa: E402

TABLES = ("exchanges.parquet", "groups.parquet", "pool.parquet", "summary.json")
COMMAND = re.compile(r"; command: <code>[^<]*</code>")
TAKEN = [name for name in PAIRS if name not in PROXY_SETS]
# the bundled sets with a slow log the partitioned join takes (midstream-join's rows without an id joined to entries
# are named by the log after the decomposition: refused, test_a_set_it_does_not_take_is_analysed_in_memory)
WITH_SLOW_LOG = [name for name in TAKEN if (CAPTURES / name / "slow.log").exists() and name != "midstream-join"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcapdecomp", "analyze", *args, "--jobs", "1"], capture_output=True,
                          text=True, cwd=REPO, timeout=900)


def set_args(folder: Path, db_alone: bool = False, slow_log: bool = False) -> list[str]:
    """The set's captures named one by one (so its slow log is left out, unless `slow_log`) with its capture.toml
    settings."""
    cs = capture_set(folder)
    args = ["--db", str(folder / "db.pcap")]
    if slow_log:
        args += ["--slow-log", str(cs.slow_log)]
    if not db_alone:
        args += ["--app", str(folder / "app.pcap")]
    if cs.long_query_time is not None:
        args += ["--long-query-time", str(cs.long_query_time)]
    if cs.thread_pool_size:
        args += ["--thread-pool-size", str(cs.thread_pool_size)]
    if cs.processlist is not None:
        args += ["--processlist", str(cs.processlist)]
    return args


def both_ways(args: list[str], tmp: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The run without and with --spill (into tmp/spill), each into its own folder; their files compared."""
    memory = cli(*args, "-q", "-o", str(tmp / "memory"))
    assert memory.returncode == 0, memory.stderr
    spill = tmp / "spill"
    partitioned = cli(*args, "-o", str(tmp / "spilled"), "--spill", str(spill))
    assert partitioned.returncode == 0, partitioned.stderr
    for name in TABLES:
        assert filecmp.cmp(tmp / "memory" / name, tmp / "spilled" / name, shallow=False), name
    pages = [COMMAND.sub("", (tmp / side / "report.html").read_text()) for side in ("memory", "spilled")]
    assert pages[0] == pages[1]
    # the run's folder in DIR went with the run, and DIR too: the run made it (main 7dbee1a)
    assert not spill.exists() or list(spill.iterdir()) == []
    return memory, partitioned


def assert_partitioned(args: list[str], tmp: Path) -> dict:
    _, partitioned = both_ways(args, tmp)
    assert "--spill:" not in partitioned.stderr  # taken, not analysed in memory
    return pd.read_json(tmp / "spilled" / "summary.json", typ="series").to_dict()


@pytest.mark.parametrize("name", TAKEN)
def test_a_bundled_pair_without_its_slow_log(name, tmp_path):
    summary = assert_partitioned(set_args(CAPTURES / name), tmp_path)
    assert summary["exchanges"]["total"] > 0


@pytest.mark.parametrize("name", TAKEN)
def test_a_bundled_db_capture_alone(name, tmp_path):
    summary = assert_partitioned(set_args(CAPTURES / name, db_alone=True), tmp_path)
    assert summary["exchanges"]["total"] > 0


@pytest.mark.parametrize("name", WITH_SLOW_LOG)
def test_a_bundled_set_with_its_slow_log(name, tmp_path):
    """The folder as analyze reads it (capture.toml, the slow log, the processlist…): the join per connection gives
    the same rows and summary.json's slow_log part (its counts and warnings)."""
    summary = assert_partitioned([str(CAPTURES / name)], tmp_path)
    assert summary["exchanges"]["total"] > 0
    assert summary["slow_log"]["file"] == str(CAPTURES / name / "slow.log")


@pytest.mark.parametrize("name", WITH_SLOW_LOG)
def test_a_bundled_db_capture_alone_with_its_slow_log(name, tmp_path):
    summary = assert_partitioned(set_args(CAPTURES / name, db_alone=True, slow_log=True), tmp_path)
    assert summary["slow_log"]["file"] is not None


def test_the_slow_log_is_exercised(tmp_path):
    """The sets above hold what the join's counts and notes are for: entries joined by order, rows in the log,
    undecided rows and an entry left unjoined with its reason (slowlog-forms), the log's reading counts."""
    summary = assert_partitioned([str(CAPTURES / "slowlog-forms")], tmp_path)
    slow = summary["slow_log"]
    assert slow["used"] and slow["matched"] > 40 and slow["joined_by"]["order"] == slow["matched"]
    assert slow["unjoined"] and slow["unjoined_examples"] and slow["exchanges_of_unlogged_commands"] > 0
    x = pd.read_parquet(tmp_path / "spilled" / "exchanges.parquet", columns=["in_slow_log", "slow_log_line"])
    assert x["in_slow_log"].fillna(False).sum() > 0 and x["in_slow_log"].isna().any()  # undecided: null
    assert x["slow_log_line"].notna().any()


def test_a_slow_log_of_another_day(tmp_path):
    """The test captures' pair with a slow log none of whose entries falls within the captures' time: nothing
    joined, said in the same note, and summary.json's counts say why."""
    field = REPO / "tests" / "data" / "field"
    args = ["--app", str(field / "one-connection-app.pcap"), "--db", str(field / "one-connection-db.pcap"),
            "--slow-log", str(REPO / "tests" / "data" / "slowlog" / "mariadb-10.11-verbose.log")]
    memory, partitioned = both_ways(args, tmp_path)
    assert "--spill:" not in partitioned.stderr
    assert "none of its entries falls within the captures' time" in partitioned.stderr
    summary = pd.read_json(tmp_path / "spilled" / "summary.json", typ="series").to_dict()
    assert summary["slow_log"]["entries"] > 0 and not summary["slow_log"]["used"]


def test_a_db_capture_alone_with_frames_lost(tmp_path):
    """Without an app point nothing repairs a loss (the in-memory run analyses the DB capture with its holes): a
    lossy copy of oltp-prepared's DB capture, with its slow log, is partitioned, the same files."""
    lose_frames(CAPTURES / "oltp-prepared" / "db.pcap", tmp_path / "lossy.pcap", 0.03, 1)
    args = [*set_args(CAPTURES / "oltp-prepared", db_alone=True, slow_log=True)]
    args[args.index("--db") + 1] = str(tmp_path / "lossy.pcap")
    _, partitioned = both_ways(args, tmp_path / "run")
    assert "gaps in TCP streams" in partitioned.stderr and "--spill:" not in partitioned.stderr


def test_the_stalls_and_the_inferred_size_are_exercised(tmp_path):
    """group-stall (thread_pool_size given: stalls with victims and culprits) and oltp-hogs without its size (the
    view infers it and sets thread_group itself): the view's per-row columns cross the partitions."""
    summary = assert_partitioned(set_args(CAPTURES / "group-stall"), tmp_path / "stall")
    assert summary["groups"]["stalls"]
    x = pd.read_parquet(tmp_path / "stall" / "spilled" / "exchanges.parquet", columns=["stall_role"])
    assert set(x["stall_role"].dropna()) == {"culprit", "victim"}
    args = [a for a in set_args(CAPTURES / "oltp-hogs") if a]
    cut = args.index("--thread-pool-size") if "--thread-pool-size" in args else None
    if cut is not None:
        del args[cut:cut + 2]
    summary = assert_partitioned(args, tmp_path / "hogs")
    assert summary["thread_pool_size"]["source"] in ("inferred", None)


def test_the_test_captures_pair(tmp_path):
    field = REPO / "tests" / "data" / "field"
    assert_partitioned(["--app", str(field / "one-connection-app.pcap"), "--db",
                        str(field / "one-connection-db.pcap")], tmp_path)


@pytest.mark.parametrize("recording", RECORDED, ids=lambda p: p.name)
@pytest.mark.parametrize("db_alone", [True, False], ids=["db", "pair"])
def test_a_recording(recording, db_alone, tmp_path):
    if not (recording / "db.pcap").exists():
        pytest.skip(f"{recording}: not recorded on this machine")
    args = ["--db", str(recording / "db.pcap"), "--long-query-time", "0.01", "--thread-pool-size", "2"]
    if not db_alone:
        args += ["--app", str(recording / "app.pcap")]
    summary = assert_partitioned(args, tmp_path)
    assert summary["exchanges"]["total"] > TARGET_ROWS  # more than one partition (a recording's size varies)


@pytest.mark.parametrize("db_alone", [True, False], ids=["db", "pair"])
def test_the_read_write_recording_with_its_slow_log(db_alone, tmp_path):
    """sysbench-rw-10s with its slow log (entries of every sysbench thread, joined by order on their connections;
    some ambiguous): the join per connection over ≈ 60 K-row partitions gives the same files."""
    recording = RECORDED[0]
    if not (recording / "db.pcap").exists() or not (recording / "slow.log").exists():
        pytest.skip(f"{recording}: not recorded on this machine")
    args = ["--db", str(recording / "db.pcap"), "--slow-log", str(recording / "slow.log"), "--long-query-time", "0.01",
            "--thread-pool-size", "2"]
    if not db_alone:
        args += ["--app", str(recording / "app.pcap")]
    summary = assert_partitioned(args, tmp_path)
    assert summary["exchanges"]["total"] > TARGET_ROWS and summary["slow_log"]["matched"] > 0


OLTP_WINDOW = ["--since", "2026-11-23T20:20:33Z", "--until", "2026-11-23T20:20:34.2Z"]  # oltp-prepared's 2nd stall
STORM_WINDOW = ["--since", "2026-11-27T06:57:54Z", "--until", "2026-11-27T06:57:55.5Z"]
WINDOWS = {
    "oltp-prepared": [str(CAPTURES / "oltp-prepared"), *OLTP_WINDOW],
    "oltp-prepared's DB capture alone": [*set_args(CAPTURES / "oltp-prepared", db_alone=True, slow_log=True),
                                         *OLTP_WINDOW],
    "group-stall since": [str(CAPTURES / "group-stall"), "--since", "2026-11-22 05:42:37"],
    "group-stall until": [*set_args(CAPTURES / "group-stall"), "--until", "2026-11-22 05:42:38"],
    # a connection a statement: most of the capture's 244 connections are before or after the window
    "connection-storm": [str(CAPTURES / "connection-storm"), *STORM_WINDOW],
    "connection-storm's DB capture alone": [*set_args(CAPTURES / "connection-storm", db_alone=True), *STORM_WINDOW],
}


@pytest.mark.parametrize("name", WINDOWS)
def test_a_time_window(name, tmp_path):
    """--since/--until: the clocks' samples from the window and its margin (spilled_clocks' `around`), the
    dictionary entries of the rows the window dropped kept (read/spill.py: exchanges.parquet's dictionaries hold
    them, as the in-memory table's categories do; db_client's too, servers.output_categories), closed and open
    windows, with and without a slow log, a pair and a DB capture alone."""
    summary = assert_partitioned(WINDOWS[name], tmp_path)
    assert summary["window"] and summary["exchanges"]["total"] > 0
    if name.startswith("oltp"):  # the statements prepared before the window: entries no row of the file holds
        command = spilled.read_projection(tmp_path / "spilled" / "exchanges.parquet", ("command",))["command"]
        assert "COM_STMT_PREPARE" in command.cat.categories and not (command == "COM_STMT_PREPARE").any()
    if name.startswith("connection-storm"):  # db_client's entries of the connections outside the window kept too
        ends = spilled.read_projection(tmp_path / "spilled" / "exchanges.parquet", ("client", "db_client"))
        clients = ends["db_client"].cat.categories
        assert len(clients) > 2 * ends["db_client"].nunique() > 0 and set(clients) <= set(ends["client"].cat.categories)


@pytest.mark.parametrize("db_alone", [True, False], ids=["db", "pair"])
def test_a_time_window_of_the_read_write_recording(db_alone, tmp_path):
    recording = RECORDED[0]
    if not (recording / "db.pcap").exists() or not (recording / "slow.log").exists():
        pytest.skip(f"{recording}: not recorded on this machine")
    with open(recording / "db.pcap", "rb") as f:  # the first frame's second (a pcap: its record after 24 bytes)
        head = f.read(28)
    first = int.from_bytes(head[24:28], "little" if head[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else "big")
    args = ["--db", str(recording / "db.pcap"), "--slow-log", str(recording / "slow.log"), "--long-query-time", "0.01",
            "--thread-pool-size", "2", "--since", str(first + 3), "--until", str(first + 6)]
    if not db_alone:
        args += ["--app", str(recording / "app.pcap")]
    summary = assert_partitioned(args, tmp_path)
    assert summary["exchanges"]["total"] > 10_000 and summary["window"]


@pytest.mark.parametrize("case", ["named by the slow log", "entries without a thread id", "threads never seen", "proxy",
                                  "a proxy not captured", "frames lost", "no exchange"])
def test_a_set_it_does_not_take_is_analysed_in_memory(case, tmp_path):
    if case == "named by the slow log":  # no connection has an id: the log's Thread_id names them after the join
        args = [str(CAPTURES / "midstream-join")]
        why = "rows without a connection id joined to slow-log entries"
    elif case == "entries without a thread id":  # they would search every connection's rows
        log = tmp_path / "slow.log"
        log.write_text(re.sub(r"(?m)^# Thread_id: \d+\s+", "# ", (CAPTURES / "group-stall" / "slow.log").read_text()))
        args = [*set_args(CAPTURES / "group-stall"), "--slow-log", str(log)]
        why = "slow-log entries without a thread id"
    elif case == "threads never seen":  # its reason counted in summary.json needs every connection's texts
        log = tmp_path / "slow.log"
        log.write_text(re.sub(r"(?m)^# Thread_id: (\d+)", lambda m: f"# Thread_id: {int(m[1]) + 1_000_000}",
                              (CAPTURES / "group-stall" / "slow.log").read_text()))
        args = [*set_args(CAPTURES / "group-stall"), "--slow-log", str(log)]
        why = "threads no connection is known by"
    elif case == "proxy":
        folder = CAPTURES / "proxy-l4"
        args = [*set_args(folder), "--proxy", str(folder / "proxy.pcap")]
        why = "a proxy"
    elif case == "a proxy not captured":  # a pooling proxy between the points, captured at the app and the DB only:
        # in memory its pairs are found across connections (pair.proxy), which the partitions do not do
        folder = CAPTURES / "proxy-pool"
        args = ["--app", str(folder / "app.pcap"), "--db", str(folder / "db.pcap")]
        why = "may show a proxy between the points"
    elif case == "no exchange":
        args = ["--db", str(REPO / "tests" / "data" / "field" / "no-exchange.pcap")]
        why = "no exchange"
    else:
        lose_frames(CAPTURES / "oltp-prepared" / "app.pcap", tmp_path / "lossy.pcap", 0.03, 1)
        args = ["--app", str(tmp_path / "lossy.pcap"), "--db", str(CAPTURES / "oltp-prepared" / "db.pcap")]
        why = "frames lost"
    _, partitioned = both_ways(args, tmp_path)
    told = [line for line in partitioned.stderr.splitlines() if line.startswith("--spill:")
            or "--spill:" in line]
    assert len(told) == 1 and why in told[0] and told[0].endswith("analysed in memory"), partitioned.stderr


def test_a_spill_folder_it_cannot_write_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    done = cli(*set_args(CAPTURES / "oltp-hogs"), "-q", "-o", str(tmp_path / "out"), "--spill", str(blocker / "sub"))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "--spill" in done.stderr
    assert not (tmp_path / "out" / "exchanges.parquet").exists()


class _Reading(pd.DataFrame):
    """A table that records the columns read of it (and of the frames made from it)."""

    _metadata = ["read"]

    @property
    def _constructor(self):
        def made(*args, **kwargs):
            out = _Reading(*args, **kwargs)
            out.read = self.read
            return out
        return made

    def __getitem__(self, key):
        names = key if isinstance(key, (list, tuple, pd.Index)) else [key]
        self.read.update(n for n in names if isinstance(n, str))
        return super().__getitem__(key)


class _Asking:
    """digest.HeldColumns of a table, remembering which columns the report asked for at a few rows."""

    def __init__(self, x: pd.DataFrame):
        from pcapdecomp.explain.digest import HeldColumns

        self.held, self.asked = HeldColumns(x), set()
        self.columns = self.held.columns

    def at(self, rows, columns) -> pd.DataFrame:
        self.asked.update(columns)
        return self.held.at(rows, columns)


@pytest.mark.parametrize("name", ["group-stall", "oltp-hogs", "field-pool-before-capture", "maxthreads",
                                  "connection-refused", "oltp-prepared", "proxy-pool"])
def test_the_report_reads_only_its_projection(name, tmp_path):
    """render_page, handed the whole table, reads of every row no column outside PROJECTED_COLUMNS (but `params`'
    null mask: StoredParams) and at a few rows (`columns`) none outside REPORT_COLUMNS; handed the projection alone
    with the other columns at rows from the whole table, it makes the same page, and so with REPORT_COLUMNS (with
    the slow log: its columns are read too; with errors; through a proxy). The summary is made from the runs
    (test_summary_runs; here the run mode's whole files are compared)."""
    from pcapdecomp.analysis import Options
    from pcapdecomp.explain.digest import HeldColumns, HeldParams
    from pcapdecomp.explain.servers import explain_servers, summary_of
    from pcapdecomp.pair.pairing import pair_points
    from pcapdecomp.read.captureset import time_zone
    from pcapdecomp.read.extract import extract_points
    from pcapdecomp.render.report import render_page, unspanned_profile

    cs = capture_set(CAPTURES / name)
    notes: list[str] = []
    x = extract_points(cs, 1, True, Options().max_sql_bytes, notes.append)
    paired = pair_points(x, cs, 1, Options().max_sql_bytes, notes.append)
    explained = explain_servers(paired, cs, [d.capture for d in x.db], time_zone(None), Options().max_sql_bytes, notes.append)
    whole = explained.exchanges
    conns = {"app": paired.app_conns, "db": paired.db_conns}
    summary = summary_of(cs, x, paired, explained, list(notes))
    first = explained.servers[0]

    def page(table: pd.DataFrame, columns=None, profiled=None) -> str:
        return render_page(summary, table, first.view.groups, None, conns, first.view.pool, profiled,
                           columns=columns).text()

    reading = _Reading(whole)
    reading.read = set()
    asking = _Asking(whole)
    expected = page(reading, asking)
    assert reading.read and reading.read - {"params"} <= set(spilled.PROJECTED_COLUMNS), \
        sorted(reading.read - set(spilled.PROJECTED_COLUMNS))
    asked = asking.asked & set(whole.columns)
    assert asked and asked <= set(spilled.REPORT_COLUMNS), sorted(asked - set(spilled.REPORT_COLUMNS))
    projection = whole[list(spilled.PROJECTED_COLUMNS)].copy()
    at_rows = HeldColumns(whole[list(spilled.REPORT_COLUMNS)].copy())
    profile = unspanned_profile(projection, HeldParams(whole["params"]), at_rows)
    assert page(projection, at_rows, lambda: profile) == expected  # a column read otherwise: a KeyError
    assert page(whole[list(spilled.REPORT_COLUMNS)].copy()) == expected
    if name == "connection-refused":
        assert "<h3>Errors</h3>" in expected
    if name == "proxy-pool":
        assert "Longest waits inside the proxy" in expected and "Server connections of the proxy" in expected


@pytest.mark.parametrize("name", ["connection-refused", "proxy-pool", "group-stall"])
def test_the_report_from_the_projection_and_the_stored_columns(name, tmp_path):
    """report.html made from the projection (PROJECTED_COLUMNS) and the columns at rows read from exchanges.parquet
    (StoredColumns) is the page made from the whole file read back (rerender's way: no connections, so the logins
    are read at the CONNECT rows): with errors, through a proxy, with stalls."""
    import numpy as np

    from pcapdecomp.render.report import render_page, unspanned_profile

    run = cli(str(CAPTURES / name), "-q", "-o", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    path = tmp_path / "out" / "exchanges.parquet"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    groups, pool = pd.read_parquet(tmp_path / "out" / "groups.parquet"), pd.read_parquet(tmp_path / "out" / "pool.parquet")
    groups, pool = (t.drop(columns="db_point") if "db_point" in t.columns else t for t in (groups, pool))
    whole = spilled.read_projection(path, tuple(pd.read_parquet(path).columns))
    expected = render_page(summary, whole, groups, None, None, pool).text()
    projection = spilled.read_projection(path, spilled.PROJECTED_COLUMNS)
    assert not set(spilled.ROW_COLUMNS) & set(projection.columns)
    columns = spilled.StoredColumns(path, projection)
    profile = unspanned_profile(projection, spilled.StoredParams(path), columns)
    assert render_page(summary, projection, groups, None, None, pool, lambda: profile, columns=columns).text() == expected
    if name == "connection-refused":
        assert "<h3>Errors</h3>" in expected and "logins in the capture" in expected
        assert (whole["result"] == "error").any()
    if name == "proxy-pool":
        assert "Longest waits inside the proxy" in expected
        assert np.isfinite(whole["proxy_wait_s"].to_numpy(dtype="float64", na_value=np.nan)).any()


def _values(column: pd.Series) -> list:
    return [None if pd.isna(v) else v for v in column.astype(object)]


def test_stored_columns_are_the_columns_at_any_rows(tmp_path):
    """StoredColumns gives what HeldColumns gives of the whole table read as held: each of REPORT_COLUMNS (those of
    the projection from it, ROW_COLUMNS from the file) at rows in any order, repeated, across row groups, the
    projection's row labels; the same values (the file's declared dtypes where the projection holds narrower ones),
    none at no row. The projection holds a boolean column null in every row as one stored null."""
    import numpy as np
    import pyarrow.parquet as pq

    from pcapdecomp.core.schema import CATEGORY
    from pcapdecomp.explain.digest import HeldColumns

    run = cli(*set_args(CAPTURES / "connection-refused"), "-q", "-o", str(tmp_path / "out"), "--spill",
              str(tmp_path / "spill"))
    assert run.returncode == 0, run.stderr
    text = [c.name for c in spilled.EXCHANGES if c.dtype == CATEGORY]
    table = pq.read_table(tmp_path / "out" / "exchanges.parquet", read_dictionary=text)
    path = tmp_path / "exchanges.parquet"
    size = max(len(table) // 7, 2)
    pq.write_table(table, path, row_group_size=size)  # the dictionaries whole in each row group, as write_merged's
    assert pq.ParquetFile(path).num_row_groups >= 7
    projection = spilled.read_projection(path, spilled.PROJECTED_COLUMNS)
    held_columns = HeldColumns(spilled.read_projection(path, spilled.REPORT_COLUMNS))
    stored = spilled.StoredColumns(path, projection)
    assert set(spilled.REPORT_COLUMNS) <= set(stored.columns)
    rows = np.random.default_rng(0).choice(len(projection), 300)
    rows = np.concatenate([rows, [len(projection) - 1, 0, 0, size, size - 1, size - 1]])
    wanted = (*reversed(spilled.ROW_COLUMNS), "seen", "total_s", "no such column")
    for at in (rows, np.sort(rows), np.zeros(0, dtype=np.int64)):
        got, expected = stored.at(at, wanted), held_columns.at(at, wanted)
        assert list(got.columns) == [c for c in wanted if c != "no such column"] and len(got) == len(at)
        pd.testing.assert_index_equal(got.index, expected.index)
        for name in got.columns:
            assert _values(got[name]) == _values(expected[name]), name
            if isinstance(expected[name].dtype, pd.CategoricalDtype):
                assert list(got[name].cat.categories) == list(expected[name].cat.categories), name
    assert (projection["result"] == "error").any()
    # without a slow log in_slow_log is null in every row: one stored null, read as the column read whole
    assert projection["in_slow_log"].isna().all() and projection["in_slow_log"].array._data.strides == (0,)


def test_the_projection_is_read_mapped_and_let_go(tmp_path):
    """read_projection reads exchanges.parquet memory-mapped, a column at a time (docs/partitioned.md §22): the
    frame is the file's columns read whole as analyze holds them, and no mapping of the file is left once read."""
    import pyarrow.parquet as pq

    from pcapdecomp.core.schema import CATEGORY
    from pcapdecomp.core.tables import held

    run = cli(*set_args(CAPTURES / "group-stall", slow_log=True), "-q", "-o", str(tmp_path / "out"), "--spill",
              str(tmp_path / "spill"))
    assert run.returncode == 0, run.stderr
    path = tmp_path / "out" / "exchanges.parquet"
    projection = spilled.read_projection(path, spilled.REPORT_COLUMNS)
    text = [c.name for c in spilled.EXCHANGES if c.dtype == CATEGORY and c.name in spilled.REPORT_COLUMNS]
    whole = pq.read_table(path, columns=list(spilled.REPORT_COLUMNS), read_dictionary=text,
                          use_pandas_metadata=True).to_pandas()
    expected = pd.DataFrame({name: held(whole[name]) for name in spilled.REPORT_COLUMNS})
    assert len(projection) > 100
    pd.testing.assert_frame_equal(projection, expected, check_exact=True)
    maps = Path("/proc/self/maps")
    if maps.exists():
        assert str(path) not in maps.read_text()


def test_stored_params_are_the_columns_at_any_rows(tmp_path):
    """StoredParams reads from the file what digest.HeldParams reads of the column held: the same null mask, and the
    same values (None where null, "" kept) at rows in any order, repeated, across row groups."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pcapdecomp.explain.digest import HeldParams

    values = [None if i % 7 == 0 else "" if i % 11 == 0 else f"{i}, 'x{i % 5}'" for i in range(1000)]
    path = tmp_path / "exchanges.parquet"
    pq.write_table(pa.table({"params": pa.array(values, pa.large_string())}), path, row_group_size=128)
    held_column = HeldParams(pq.read_table(path).to_pandas()["params"])
    stored = spilled.StoredParams(path)
    assert (stored.null() == held_column.null()).all() and stored.null().sum() == sum(v is None for v in values)
    rows = np.random.default_rng(0).choice(len(values), 300)
    rows = np.concatenate([rows, [999, 0, 0, 128, 127]])
    assert stored.at(rows) == held_column.at(rows) == [values[i] for i in rows]
    assert stored.at(np.zeros(0, dtype=np.int64)) == []


def test_the_profile_reads_the_stored_params_at_its_samples(tmp_path):
    """The query profile of the projection without params (PROJECTED_COLUMNS), its samples' params read from the
    file (StoredParams) and their sql, conn_id and Query IDs too (StoredColumns), is the profile of the projection with the whole column: prepared statements' samples with
    their values, the same rows."""
    from pcapdecomp.render.report import unspanned_profile

    run = cli(*set_args(CAPTURES / "oltp-prepared"), "-q", "-o", str(tmp_path / "out"), "--spill",
              str(tmp_path / "spill"))
    assert run.returncode == 0, run.stderr
    path = tmp_path / "out" / "exchanges.parquet"
    whole = unspanned_profile(spilled.read_projection(path, spilled.REPORT_COLUMNS))
    projection = spilled.read_projection(path, spilled.PROJECTED_COLUMNS)
    assert "params" not in projection.columns
    stored = unspanned_profile(projection, spilled.StoredParams(path), spilled.StoredColumns(path, projection))
    pd.testing.assert_frame_equal(stored, whole, check_exact=True)
    assert whole["commands"].str.contains("COM_STMT_EXECUTE").any()


def test_the_memory_bound_takes_the_partitioned_runs_peak():
    """With --spill the check after the extraction predicts the partitioned run's peak: a capture it analyses
    within the bound is not refused for the in-memory run's need (here 10 M exchanges a point)."""
    from pcapdecomp.core.errors import MemoryBoundError
    from pcapdecomp.core.memory import Counts, MemoryBound, predicted_peak

    counts = Counts(db_exchanges=10_000_000, other_exchanges=10_000_000, connections=100, points=2)
    start = MemoryBound(None, None, 1).start
    partitioned, in_memory = predicted_peak(counts, 1, start, partitioned=True), predicted_peak(counts, 1, start)
    assert partitioned < in_memory  # 0.52 of it on the costs of 2026-12-02 afternoon (core.memory)
    bound = MemoryBound((partitioned + in_memory) // 2, "--memory (test)", 1)
    bound.check(counts, partitioned=True)
    with pytest.raises(MemoryBoundError):
        bound.check(counts)


# -- --spill with --scheduler: the partitions' work on Dask workers (docs/partitioned.md §16) -------------------------

def same_files(left: Path, right: Path, scheduler: bool = False) -> None:
    """Two runs' outputs: the tables and summary.json cmp-equal, report.html but for the command line. `scheduler`:
    the right-hand run had a Dask scheduler, which summary.json's inputs record (as the in-memory run with one
    does): that one value differs, the rest of the text is the same."""
    for name in TABLES:
        if scheduler and name == "summary.json":
            texts = [(side / name).read_text() for side in (left, right)]
            recorded = json.loads(texts[1])["inputs"]["scheduler"]
            assert recorded and json.loads(texts[0])["inputs"]["scheduler"] is None
            assert texts[0] == texts[1].replace(f'"scheduler": {json.dumps(recorded)}', '"scheduler": null', 1)
            continue
        assert filecmp.cmp(left / name, right / name, shallow=False), name
    pages = [COMMAND.sub("", (side / "report.html").read_text()) for side in (left, right)]
    assert pages[0] == pages[1]


def test_the_partitions_on_a_local_cluster_of_two_processes(tmp_path, monkeypatch):
    """group-stall with its slow log cut into partitions of 100 rows (its stalls, victims and culprits across them),
    analysed with --spill on a LocalCluster of 2 worker processes: the captures are read into the spill folder, and
    7a's first pass and runs, 7b's first pass and rows and the stored partitions made, on the workers (DaskRunner.map, one task a partition), and the files are the
    in-memory run's and the one-process --spill run's with the same partitions — summary.json's slow-log counts too,
    among them what a worker counts while it joins a partition's rows (the undecided rows of unlogged commands: 14
    here, that a worker's copy of the join once kept to itself)."""
    from pcapdecomp.analysis import Options, analyze
    from pcapdecomp.explain import partitioned
    from pcapdecomp.run.cluster import DaskRunner

    args = set_args(CAPTURES / "group-stall", slow_log=True)
    memory = cli(*args, "-q", "-o", str(tmp_path / "memory"))
    assert memory.returncode == 0, memory.stderr
    monkeypatch.setattr(partitioned, "TARGET_ROWS", 100)  # the partitions' size: 352 rows → 4 partitions
    mapped: list[tuple[str, int]] = []
    real = DaskRunner.map

    def counted(self, function, shared, calls, label):
        mapped.append((function.__name__, len(calls)))
        return real(self, function, shared, calls, label)

    monkeypatch.setattr(DaskRunner, "map", counted)
    read: list[tuple] = []
    real_extract = DaskRunner.extract

    def reading(self, points, *given, spill=None, **named):
        made = real_extract(self, points, *given, spill=spill, **named)
        read.append((spill, [x.spill is not None and all(p.folder.parent == spill for p in x.spill.parts)
                             for x in made]))
        return made

    monkeypatch.setattr(DaskRunner, "extract", reading)
    cs = capture_set(app=[CAPTURES / "group-stall" / "app.pcap"], db=CAPTURES / "group-stall" / "db.pcap",
                     slow_log=CAPTURES / "group-stall" / "slow.log", long_query_time=capture_set(CAPTURES / "group-stall").long_query_time,
                     thread_pool_size=capture_set(CAPTURES / "group-stall").thread_pool_size)
    for name, scheduler in (("one", None), ("dask", "local")):
        analyze(cs, Options(quiet=True, jobs=2 if scheduler else 1, scheduler=scheduler, spill=tmp_path / "spill"),
                tmp_path / name)
        assert not (tmp_path / "spill").exists()  # made by the run, left empty: removed
    assert mapped == [("_first_share", 4), ("_made_first_of_partition", 4), ("_stored_decomposition", 4)]
    # the captures were read on the workers too, into the run's spill folder (their rows spilled there, not sent)
    assert len(read) == 1 and read[0][0].parent == tmp_path / "spill" and read[0][1] == [True, True], read
    same_files(tmp_path / "memory", tmp_path / "one")
    same_files(tmp_path / "one", tmp_path / "dask", scheduler=True)
    summary = pd.read_json(tmp_path / "dask" / "summary.json", typ="series").to_dict()
    assert summary["groups"]["stalls"]
    assert summary["slow_log"]["used"] and summary["slow_log"]["exchanges_of_unlogged_commands"] > 0


def test_the_row_keys_are_files_the_merges_read_a_window_at_a_time(tmp_path, monkeypatch):
    """group-stall with its slow log in partitions of 100 rows, --spill in this process (docs/partitioned.md §26):
    each stored run's keys are a file beside its rows (KeyFile), not an array; the summary's runs (_ReadBack) hold
    no key array; the merge over the files is the merge over their arrays, at the writer's step and a small one;
    where each row went is held narrow (int16 here, runs and rows); and the files are the in-memory run's."""
    import numpy as np

    from pcapdecomp.analysis import Options, analyze
    from pcapdecomp.core.outputs import KeyFile, merged_order
    from pcapdecomp.explain import partitioned

    args = set_args(CAPTURES / "group-stall", slow_log=True)
    memory = cli(*args, "-q", "-o", str(tmp_path / "memory"))
    assert memory.returncode == 0, memory.stderr
    monkeypatch.setattr(partitioned, "TARGET_ROWS", 100)  # 352 rows → 4 partitions
    seen: dict = {}
    real_places, real_summary = spilled._merged_places, spilled.summary_from_runs

    def places(keys):
        run_of, row_of = real_places(keys)
        seen["places"] = (len(keys), run_of.dtype, row_of.dtype, len(run_of))
        return run_of, row_of

    def summary(runs, members, categories, scratch):
        files = [r.keys for r in runs]
        assert all(isinstance(f, KeyFile) for f in files), [type(f) for f in files]
        assert all(f.path.exists() and f.path.parent.parent.name == "rows" for f in files)
        arrays = [f.whole() for f in files]
        for step in (None, 3):
            got = [np.concatenate(p) for p in zip(*merged_order(files, step))]
            expected = [np.concatenate(p) for p in zip(*merged_order(arrays, step))]
            assert all(np.array_equal(a, b) for a, b in zip(got, expected))
        made = real_summary(runs, members, categories, scratch)
        # the summary's runs of stored rows: their keys a file, no array of them kept
        assert all(isinstance(r.keys, KeyFile) for r in made.runs)
        assert not any(isinstance(v, np.ndarray) and v.ndim == 2 for r in made.runs for v in vars(r).values())
        seen["runs"] = len(runs)
        return made

    monkeypatch.setattr(spilled, "_merged_places", places)
    monkeypatch.setattr(spilled, "summary_from_runs", summary)
    analyze(capture_set(app=[CAPTURES / "group-stall" / "app.pcap"], db=CAPTURES / "group-stall" / "db.pcap",
                        slow_log=CAPTURES / "group-stall" / "slow.log",
                        long_query_time=capture_set(CAPTURES / "group-stall").long_query_time,
                        thread_pool_size=capture_set(CAPTURES / "group-stall").thread_pool_size),
            Options(quiet=True, jobs=1, spill=tmp_path / "spill"), tmp_path / "one")
    assert seen["runs"] == 4 and seen["places"] == (4, np.int16, np.int16, 352), seen
    same_files(tmp_path / "memory", tmp_path / "one")


@pytest.mark.parametrize("recording", RECORDED[:1], ids=lambda p: p.name)
def test_a_recording_on_a_local_cluster(recording, tmp_path):
    """The 10 s read-write recording (2 partitions) with --spill on a LocalCluster of 2 worker processes: the
    one-process --spill run's files."""
    if not (recording / "db.pcap").exists():
        pytest.skip(f"{recording}: not recorded on this machine")
    args = ["--db", str(recording / "db.pcap"), "--app", str(recording / "app.pcap"), "--long-query-time", "0.01",
            "--thread-pool-size", "2", "--spill", str(tmp_path / "spill"), "-q",
            *(["--slow-log", str(recording / "slow.log")] if (recording / "slow.log").exists() else [])]
    one = cli(*args, "-o", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    dask = subprocess.run([sys.executable, "-m", "pcapdecomp", "analyze", *args, "-o", str(tmp_path / "dask"),
                           "--scheduler", "local", "--jobs", "2"], capture_output=True, text=True, cwd=REPO,
                          timeout=900)
    assert dask.returncode == 0, dask.stderr
    same_files(tmp_path / "one", tmp_path / "dask", scheduler=True)


def test_a_worker_that_cannot_see_the_spill_folder(tmp_path):
    """A Dask worker in a mount namespace of its own, with an empty file system over the spill DIR (as a worker on
    another machine without the shared file system): one line says so, the partitions are analysed on this
    machine, the same files."""
    if shutil.which("unshare") is None or shutil.which("dask") is None or \
            subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare -m (root) and the dask command")
    spill = tmp_path / "spill"
    spill.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    log = open(tmp_path / "dask.log", "w")
    scheduler = subprocess.Popen(["dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                                 stdout=log, stderr=log, start_new_session=True)
    worker = subprocess.Popen(["unshare", "-m", "sh", "-c", f'mount -t tmpfs none "{spill}" && exec dask worker '
                               f'{address} --nworkers 1 --nthreads 1 --no-dashboard'], stdout=log, stderr=log,
                              start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        from distributed import Client

        with Client(address, timeout="60s") as client:
            client.wait_for_workers(1, timeout=120)
        args = set_args(CAPTURES / "oltp-hogs")
        one = cli(*args, "-q", "-o", str(tmp_path / "one"), "--spill", str(spill))
        assert one.returncode == 0, one.stderr
        blind = subprocess.run([sys.executable, "-m", "pcapdecomp", "analyze", *args, "-o", str(tmp_path / "blind"),
                                "--spill", str(spill), "--scheduler", address], capture_output=True, text=True,
                               cwd=REPO, timeout=900)
        assert blind.returncode == 0, blind.stderr
    finally:
        for proc in (worker, scheduler):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    told = [line for line in blind.stderr.splitlines() if "--spill:" in line]
    assert len(told) == 1 and "cannot read or write" in told[0] and told[0].endswith("analysed on this machine"), \
        blind.stderr
    same_files(tmp_path / "one", tmp_path / "blind", scheduler=True)
@pytest.mark.parametrize("name", ["group-stall", "field-default-stall", "connection-storm"])
def test_the_summary_from_runs_across_partitions(name, tmp_path, monkeypatch):
    """The partitions cut for 40 rows (several per set, as the recordings' size makes them): summary.json, made
    from the stored partitions (stalls with their victims and culprits, every sum in row order, the view's members
    handed in by row key, the connection and network stories), and report.html are the in-memory run's."""
    from pcapdecomp.analysis import Options, analyze
    from pcapdecomp.explain.partitioned import PairedPartitions

    cs = capture_set(app=[CAPTURES / name / "app.pcap"], db=CAPTURES / name / "db.pcap",
                     long_query_time=capture_set(CAPTURES / name).long_query_time,
                     thread_pool_size=capture_set(CAPTURES / name).thread_pool_size)
    analyze(cs, Options(quiet=True, jobs=1), tmp_path / "memory")
    monkeypatch.setitem(PairedPartitions.__init__.__kwdefaults__, "target_rows", 40)
    made = []
    summary_from_runs = spilled.summary_from_runs

    def kept(runs, members, categories, scratch):
        _, culprits, _, cap = members  # one culprits' list a stall of the view
        made.append((len(runs), len(culprits), cap is not None))
        summary = summary_from_runs(runs, members, categories, scratch)
        # the latency columns' sorted values of every partition went to the scratch folder, not held
        assert sorted(p.name for p in scratch.iterdir()) == sorted(
            f"{col}-{r:04d}.npy" for col in LATENCY_COLUMNS for r in range(len(runs)))
        return summary

    monkeypatch.setattr(spilled, "summary_from_runs", kept)
    analyze(cs, Options(quiet=True, jobs=1, spill=tmp_path / "spill"), tmp_path / "spilled")
    assert made and made[0][0] >= 3, made  # partitioned, in several partitions
    for file in TABLES:
        assert filecmp.cmp(tmp_path / "memory" / file, tmp_path / "spilled" / file, shallow=False), file
    pages = [COMMAND.sub("", (tmp_path / side / "report.html").read_text()) for side in ("memory", "spilled")]
    assert pages[0] == pages[1]
    summary = pd.read_json(tmp_path / "spilled" / "summary.json", typ="series").to_dict()
    if name == "group-stall":  # victims grouped under their stalls, with culprits
        assert made[0][1] and summary["hidden_slow"]["count"] > 0
        assert any(s["stall"] is not None and s["culprits"] for s in summary["hidden_slow"]["by_stall"])


def app_hosts(app: Path, tmp: Path) -> list[Path]:
    """The app capture cut in two by connection (its client port's bit 1: Linux gives connect() even ports), as
    two app hosts would each capture their own connections: two app points of one DB point."""
    from pcaptools import rewrite, tcp_ports

    def of_host(host: int):
        def keep(packet: bytes) -> bool:
            ports = tcp_ports(packet)
            client = ports[0] if ports is not None and ports[1] == 3306 else ports[1] if ports is not None else 0
            return (client >> 1) & 1 == host
        return keep

    hosts = []
    for host in (0, 1):
        hosts.append(tmp / f"app{host}.pcap")
        assert rewrite(app, hosts[-1], keep_packet=of_host(host)) > 0  # each host has connections of its own
    return hosts


@pytest.mark.parametrize("name", ["group-stall", "oltp-prepared", "connection-storm"])
def test_several_app_points(name, tmp_path, monkeypatch):
    """Two app points of one DB point (the app capture cut in two by connection), the partitions cut for 40 rows:
    every row on its own app point's clock, the files those of the in-memory run. Before, several app points were
    refused (analysed in memory), and a partition of rows from two points read back short of rows (core.framefile:
    batches cut at the concatenation's chunk edges)."""
    from pcapdecomp.analysis import Options, analyze
    from pcapdecomp.explain.partitioned import PairedPartitions

    base = capture_set(CAPTURES / name)
    cs = capture_set(app=app_hosts(CAPTURES / name / "app.pcap", tmp_path), db=CAPTURES / name / "db.pcap",
                     long_query_time=base.long_query_time, thread_pool_size=base.thread_pool_size)
    analyze(cs, Options(quiet=True, jobs=1), tmp_path / "memory")
    monkeypatch.setitem(PairedPartitions.__init__.__kwdefaults__, "target_rows", 40)
    made = []
    summary_from_runs = spilled.summary_from_runs
    monkeypatch.setattr(spilled, "summary_from_runs",
                        lambda runs, *rest: made.append(len(runs)) or summary_from_runs(runs, *rest))
    analyze(cs, Options(quiet=True, jobs=1, spill=tmp_path / "spill"), tmp_path / "spilled")
    assert made and made[0] >= 3, made  # partitioned, in several partitions
    for file in TABLES:
        assert filecmp.cmp(tmp_path / "memory" / file, tmp_path / "spilled" / file, shallow=False), file
    summary = json.loads((tmp_path / "spilled" / "summary.json").read_text())
    assert sorted(Path(c).name for c in summary["clocks"]) == ["app0.pcap", "app1.pcap"]  # a clock per app point
    table = pd.read_parquet(tmp_path / "spilled" / "exchanges.parquet", columns=["capture", "seen"])
    assert {Path(c).name for c in table.loc[table["seen"] != "db", "capture"]} == {"app0.pcap", "app1.pcap"}


@pytest.mark.parametrize("recording", RECORDED[:1], ids=lambda p: p.name)
def test_several_app_points_of_a_recording(recording, tmp_path):
    """The read-write recording's app capture cut in two hosts, with its slow log, by the command line: partitioned
    (no fallback line), the in-memory run's files."""
    if not (recording / "db.pcap").exists():
        pytest.skip(f"{recording} not recorded on this machine (benchmarks/bench.py records it)")
    hosts = app_hosts(recording / "app.pcap", tmp_path)
    args = ["--db", str(recording / "db.pcap"), "--slow-log", str(recording / "slow.log"),
            *[a for host in hosts for a in ("--app", str(host))]]
    _, partitioned = both_ways(args, tmp_path)
    assert "--spill:" not in partitioned.stderr


def test_a_time_window_the_db_capture_has_no_exchange_in(tmp_path):
    """The DB capture cut to its first second, the window after it: the app's rows alone in the window. The
    connection step joins nothing, and counts no work (match.candidates 0, as the in-memory Pairing, whose join of an
    empty side does none); the spilled step counted the app's buckets (228 here) before."""
    from pcaptools import first_ts, rewrite

    folder = CAPTURES / "group-stall"
    start = first_ts(folder / "db.pcap")
    db = tmp_path / "db.pcap"
    assert rewrite(folder / "db.pcap", db, keep=lambda i, ts: ts < start + 1_000_000_000) > 0
    args = ["--app", str(folder / "app.pcap"), "--db", str(db), "--since", str(start // 1_000_000_000 + 3)]
    summary = assert_partitioned(args, tmp_path)
    assert summary["match"]["db_exchanges"] == 0 < summary["match"]["app_exchanges"]
    assert summary["match"]["candidates"] == 0


def test_one_hosts_connections_at_two_app_points_are_told(tmp_path):
    """The app capture cut in two halves by time and given as two app points (one point's rotated files given as two):
    the same TCP connections at both, said in one warning naming both points and how many; cut by connection (two
    hosts' own connections), no such warning."""
    from pcapdecomp.analysis import Options, analyze
    from pcaptools import first_ts, rewrite

    folder = CAPTURES / "group-stall"
    app = folder / "app.pcap"
    middle = first_ts(app) + 2_000_000_000
    halves = [tmp_path / "early.pcap", tmp_path / "late.pcap"]
    assert rewrite(app, halves[0], keep=lambda i, ts: ts < middle) > 0
    assert rewrite(app, halves[1], keep=lambda i, ts: ts >= middle) > 0
    base = capture_set(folder)
    told = analyze(capture_set(app=halves, db=folder / "db.pcap", long_query_time=base.long_query_time,
                               thread_pool_size=base.thread_pool_size), Options(quiet=True, jobs=1), tmp_path / "halves")
    said = [w for w in told.warnings if "hold the same" in w]
    assert len(said) == 1 and "early.pcap" in said[0] and "late.pcap" in said[0], told.warnings
    hosts = app_hosts(app, tmp_path)
    apart = analyze(capture_set(app=hosts, db=folder / "db.pcap", long_query_time=base.long_query_time,
                                thread_pool_size=base.thread_pool_size), Options(quiet=True, jobs=1), tmp_path / "hosts")
    assert not any("hold the same" in w for w in apart.warnings)


def test_a_point_none_of_whose_exchanges_paired_is_told(tmp_path):
    """An app point of another capture set given beside the right one (group-stall's app and DB, oltp-hogs' app):
    its rows are all app-only, said in one warning naming it, in memory and partitioned alike (the same files);
    the point that paired is not named. Before, the run said nothing: the verdict counted the other set's 3,023
    exchanges as "only at the app". A DB point of another set beside the right one (several DB points: in memory)
    likewise; the pair alone, no such warning."""
    group, other = CAPTURES / "group-stall", CAPTURES / "oltp-hogs"
    args = ["--app", str(group / "app.pcap"), "--app", str(other / "app.pcap"), "--db", str(group / "db.pcap")]
    memory, partitioned = both_ways(args, tmp_path / "apps")
    assert "--spill:" not in partitioned.stderr  # partitioned, not analysed in memory
    for side in ("memory", "spilled"):
        warnings = json.loads((tmp_path / "apps" / side / "summary.json").read_text())["warnings"]
        said = [w for w in warnings if "none of its" in w]
        assert len(said) == 1, warnings
        assert said[0].startswith(f"app point {other / 'app.pcap'}: none of its ") and "app-only" in said[0]
        rows = pd.read_parquet(tmp_path / "apps" / side / "exchanges.parquet", columns=["capture", "seen"])
        alone = rows[rows["capture"].astype(str) == str(other / "app.pcap")]
        assert len(alone) and (alone["seen"] == "app").all()
        assert f"none of its {len(alone):,} exchanges" in said[0]
    dbs = cli("--app", str(group / "app.pcap"), "--db", str(group / "db.pcap"), "--db", str(other / "db.pcap"), "-q",
              "-o", str(tmp_path / "dbs"))
    assert dbs.returncode == 0, dbs.stderr
    warnings = json.loads((tmp_path / "dbs" / "summary.json").read_text())["warnings"]
    said = [w for w in warnings if "none of its" in w]
    assert len(said) == 1 and said[0].startswith(f"DB point {other / 'db.pcap'}: ") and "DB-only" in said[0], said
    pair = cli("--app", str(group / "app.pcap"), "--db", str(group / "db.pcap"), "-q", "-o", str(tmp_path / "pair"))
    assert pair.returncode == 0, pair.stderr
    assert not any("none of its" in w for w in json.loads((tmp_path / "pair" / "summary.json").read_text())["warnings"])
