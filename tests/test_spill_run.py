"""`analyze --spill DIR` (run/spilled.py, docs/partitioned.md step 7): the partitioned run writes the very files the
in-memory run writes — exchanges.parquet, groups.parquet, pool.parquet and summary.json byte for byte (cmp),
report.html too but for the command line it shows — on every set it takes: each bundled pair without its slow log
(the set's long_query_time, thread_pool_size and processlist given), as a pair and as its DB capture alone, the
test captures' pair, and the 10 s recordings (skipped when absent). A set it does not take (a slow log, a proxy,
frames lost) is analysed in memory after one line, with the same outputs; a DIR it cannot write is one line, exit
2. The projection the report is made from (REPORT_COLUMNS) holds every column it reads."""

from __future__ import annotations

import filecmp
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pcapdecomp.analysis import capture_set
from pcapdecomp.run import spilled

from partitioning import CAPTURES, PAIRS, PROXY_SETS, RECORDED, REPO

sys.path.insert(0, str(REPO / "scripts"))

from lose_frames import lose_frames  # noqa: E402

TABLES = ("exchanges.parquet", "groups.parquet", "pool.parquet", "summary.json")
COMMAND = re.compile(r"; command: <code>[^<]*</code>")
TAKEN = [name for name in PAIRS if name not in PROXY_SETS]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcapdecomp", "analyze", *args, "--jobs", "1"], capture_output=True,
                          text=True, cwd=REPO, timeout=900)


def set_args(folder: Path, db_alone: bool = False) -> list[str]:
    """The set's captures named one by one (so its slow log is left out) with its capture.toml settings."""
    cs = capture_set(folder)
    args = ["--db", str(folder / "db.pcap")]
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
    assert list(spill.iterdir()) == []  # the run's folder in DIR went with the run
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
    assert summary["exchanges"]["total"] > 100_000


@pytest.mark.parametrize("case", ["slow log", "proxy", "frames lost", "no exchange"])
def test_a_set_it_does_not_take_is_analysed_in_memory(case, tmp_path):
    if case == "slow log":
        args = [str(CAPTURES / "group-stall")]
        why = "a slow log"
    elif case == "proxy":
        folder = CAPTURES / "proxy-l4"
        args = [*set_args(folder), "--proxy", str(folder / "proxy.pcap")]
        why = "a proxy"
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


@pytest.mark.parametrize("name", ["group-stall", "oltp-hogs", "field-pool-before-capture", "maxthreads"])
def test_the_report_reads_only_its_projection(name, tmp_path):
    """render_page, handed the whole table, reads no column outside REPORT_COLUMNS; handed the projection alone,
    it makes the same page (with the slow log: its columns are read too). The summary is made from the runs
    (test_summary_runs; here the run mode's whole files are compared)."""
    from pcapdecomp.analysis import Options
    from pcapdecomp.explain.servers import explain_servers, summary_of
    from pcapdecomp.pair.pairing import pair_points
    from pcapdecomp.read.captureset import time_zone
    from pcapdecomp.read.extract import extract_points
    from pcapdecomp.render.report import render_page

    cs = capture_set(CAPTURES / name)
    notes: list[str] = []
    x = extract_points(cs, 1, True, Options().max_sql_bytes, notes.append)
    paired = pair_points(x, cs, 1, Options().max_sql_bytes, notes.append)
    explained = explain_servers(paired, cs, [d.capture for d in x.db], time_zone(None), Options().max_sql_bytes, notes.append)
    whole = explained.exchanges
    conns = {"app": paired.app_conns, "db": paired.db_conns}
    summary = summary_of(cs, x, paired, explained, list(notes))
    first = explained.servers[0]

    def page(table: pd.DataFrame) -> str:
        return render_page(summary, table, first.view.groups, None, conns, first.view.pool).text()

    from pcapdecomp.render.figures import TIMELINE_COLUMNS
    from pcapdecomp.render.report import _STATEMENT_COLUMNS

    reading = _Reading(whole)
    reading.read = set()
    expected = page(reading)
    # read by name (tracked), or taken where present (the report's row lists: `if c in x.columns`)
    read = (reading.read | set(TIMELINE_COLUMNS) | set(_STATEMENT_COLUMNS)) & set(whole.columns)
    assert read and read <= set(spilled.REPORT_COLUMNS), sorted(read - set(spilled.REPORT_COLUMNS))
    assert page(whole[list(spilled.REPORT_COLUMNS)].copy()) == expected  # a column read otherwise: a KeyError


def test_the_memory_bound_takes_the_partitioned_runs_peak():
    """With --spill the check after the extraction predicts the partitioned run's peak: a capture it analyses
    within the bound is not refused for the in-memory run's need (here 10 M exchanges a point)."""
    from pcapdecomp.core.errors import MemoryBoundError
    from pcapdecomp.core.memory import Counts, MemoryBound, predicted_peak

    counts = Counts(db_exchanges=10_000_000, other_exchanges=10_000_000, connections=100, points=2)
    start = MemoryBound(None, None, 1).start
    partitioned, in_memory = predicted_peak(counts, 1, start, partitioned=True), predicted_peak(counts, 1, start)
    assert partitioned < in_memory / 2
    bound = MemoryBound((partitioned + in_memory) // 2, "--memory (test)", 1)
    bound.check(counts, partitioned=True)
    with pytest.raises(MemoryBoundError):
        bound.check(counts)


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

    def kept(runs, view, categories):
        made.append((len(runs), len(view.stall_members), view.cap_members is not None))
        return summary_from_runs(runs, view, categories)

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
