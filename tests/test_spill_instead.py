"""`analyze` without --spill, of a set too big for its memory bound in memory (issue 37: "a stated bound holds for any
capture size"): when the partitioned run takes the set and fits the bound (core.memory raises PartitionedInstead),
the run is partitioned instead, its partitions in a folder of the output folder that is gone when the run ends, said
in one warning, and its files are the in-memory run's; --in-memory refuses instead (exit 2, nothing written); an
output folder without room for the partitions, a set the partitioned run does not take (a proxy) and a partitioned
run that does not fit either are refusals, nothing written. On a LocalCluster with a bound the workers read the
captures once, into the output folder's partitions, before the bound is asked (run.spilled.spill_first): then
partitioned, or read back into memory.

A bundled capture is far below any machine's memory, so the in-memory run's cost per exchange at the DB is raised
here (core.memory.COST_PER_DB_EXCHANGE: the bound's model, not the analysis) until the set is over a bound of 1 GiB
above this process's memory; the analysis itself runs as in the field. At the scale where this happens by itself
(the in-memory prediction above the partitioned one from about 320,000 exchanges a point): docs/scale.md."""

from __future__ import annotations

import filecmp
import json
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.core import memory
from pcapdecomp.core.errors import MemoryBoundError, PartitionedInstead
from pcapdecomp.run import spilled

from partitioning import CAPTURES, REPO

sys.path.insert(0, str(REPO / "scripts"))

from lose_frames import lose_frames  # noqa: E402

TABLES = ("exchanges.parquet", "groups.parquet", "pool.parquet")
INSTEAD = "analysed partitioned instead"


def bound_above_this_process(extra_mib: int = 1024) -> str:
    """A --memory `extra_mib` above what this (test) process holds now: the bound counts the process's own memory."""
    return f"{(memory.own_rss() >> 20) + extra_mib}M"


@pytest.fixture
def in_memory_too_big(monkeypatch):
    """The in-memory run of any bundled set predicted far above a bound of 1 GiB, its partitioned run within it; the
    look during the extraction off (its measured growth is this small set's)."""
    monkeypatch.setattr(memory, "COST_PER_DB_EXCHANGE", 1 << 30)
    monkeypatch.setattr(memory, "WATCH_EVERY_S", float("inf"))


@pytest.fixture
def spill_folders(monkeypatch):
    """The folders the partitioned run was handed (analyze_spilled's), each with whether it existed then."""
    seen = []
    real = spilled.analyze_spilled

    def watched(run, cs, x, folder):
        seen.append((folder, folder.is_dir()))
        return real(run, cs, x, folder)
    monkeypatch.setattr("pcapdecomp.analysis.analyze_spilled", watched)
    return seen


@pytest.mark.parametrize("name, db_alone, lossy", [("group-stall", False, False), ("oltp-hogs", True, False),
                                                   ("slowlog-forms", False, False), ("oltp-prepared", True, True)])
def test_a_set_too_big_in_memory_is_analysed_partitioned_with_the_same_files(name, db_alone, lossy, tmp_path,
                                                                             monkeypatch, spill_folders):
    """`lossy`: the DB capture with 3 % of its frames lost (the extraction's own warnings, said once)."""
    folder = CAPTURES / name
    db = folder / "db.pcap"
    if lossy:
        db = tmp_path / "lossy.pcap"
        lose_frames(folder / "db.pcap", db, 0.03, 1)
    cs_of = (lambda: capture_set(None, db=[str(db)], slow_log=capture_set(folder).slow_log,
                                 long_query_time=capture_set(folder).long_query_time,
                                 thread_pool_size=capture_set(folder).thread_pool_size)) if db_alone else \
        (lambda: capture_set(folder))
    reference = analyze(cs_of(), Options(quiet=True, jobs=1), tmp_path / "memory")
    assert not any(INSTEAD in w for w in reference.warnings)
    assert not lossy or any("gaps in TCP streams" in w for w in reference.warnings)
    with monkeypatch.context() as patched:
        patched.setattr(memory, "COST_PER_DB_EXCHANGE", 1 << 30)
        patched.setattr(memory, "WATCH_EVERY_S", float("inf"))
        out = tmp_path / "instead"
        got = analyze(cs_of(), Options(quiet=True, jobs=1, memory=bound_above_this_process()), out)
    said = [w for w in got.warnings if INSTEAD in w]
    assert len(said) == 1, got.warnings
    assert "more than the bound of" in said[0] and str(out) in said[0]
    # partitioned, in a folder of the output folder named as its staging folders are, gone at the end
    assert len(spill_folders) == 1
    where, existed = spill_folders[0]
    assert existed and where.parent == out.absolute() and where.name.startswith(spilled.INSTEAD_PREFIX)
    assert not where.exists() and sorted(p.name for p in out.iterdir() if p.name.startswith(".pcapdecomp")) == \
        [".pcapdecomp-outputs.json"]
    for table in TABLES:
        assert filecmp.cmp(tmp_path / "memory" / table, out / table, shallow=False), table
    left, right = (json.loads((d / "summary.json").read_text()) for d in (tmp_path / "memory", out))
    assert [w for w in right.pop("warnings") if INSTEAD not in w] == left.pop("warnings")
    assert left == right


def test_in_memory_refuses_instead(tmp_path, in_memory_too_big, spill_folders):
    out = tmp_path / "out"
    with pytest.raises(PartitionedInstead) as refused:
        analyze(capture_set(CAPTURES / "group-stall"),
                Options(quiet=True, jobs=1, memory=bound_above_this_process(), in_memory=True), out)
    text = str(refused.value)
    assert "nothing written" in text and "analyse it partitioned (predicted about" in text
    assert "within the bound" in text, text
    assert not spill_folders and not out.exists()


def test_a_proxy_set_is_refused_not_partitioned(tmp_path, in_memory_too_big, spill_folders):
    """The partitioned run does not take a proxy: the refusal names no --spill, and nothing is partitioned."""
    out = tmp_path / "out"
    with pytest.raises(MemoryBoundError) as refused:
        analyze(capture_set(CAPTURES / "proxy-l4"), Options(quiet=True, jobs=1, memory=bound_above_this_process()),
                out)
    assert not isinstance(refused.value, PartitionedInstead)
    assert "--spill" not in str(refused.value) and not spill_folders and not out.exists()


def test_a_partitioned_run_over_the_bound_too_is_refused(tmp_path, monkeypatch, spill_folders):
    """Both runs over the bound: the refusal gives the --memory the partitioned run would need (that bound alone
    partitions it, no --spill needed), nothing is partitioned, nothing written."""
    monkeypatch.setattr(memory, "COST_PER_DB_EXCHANGE", 1 << 30)
    monkeypatch.setattr(memory, "PARTITIONED_COST_PER_DB_EXCHANGE", 1 << 28)
    monkeypatch.setattr(memory, "WATCH_EVERY_S", float("inf"))
    out = tmp_path / "out"
    with pytest.raises(MemoryBoundError) as refused:
        analyze(capture_set(CAPTURES / "group-stall"), Options(quiet=True, jobs=1, memory=bound_above_this_process()),
                out)
    assert not isinstance(refused.value, PartitionedInstead)
    assert "alone does that by itself, in the output folder" in str(refused.value), str(refused.value)
    assert not spill_folders and not out.exists()


def patched_cli(patch: str, *args: str) -> subprocess.CompletedProcess:
    """`pcapdecomp analyze ARGS` as a user runs it, in a child whose core.memory has `patch` (Python statements on
    `memory`) applied first."""
    code = (f"import sys; from pcapdecomp.core import memory; {patch}; from pcapdecomp.cli import main; "
            "sys.argv[0] = 'pcapdecomp'; main()")
    return subprocess.run([sys.executable, "-c", code, "analyze", *args, "--jobs", "1"], capture_output=True,
                          text=True, cwd=REPO, timeout=300)


def test_an_extraction_stopped_early_is_read_again_partitioned(tmp_path):
    """The look during the extraction (every time here, its measured growth counted ten thousand times) finds the
    in-memory extraction over the bound before the counts are known: said, and the captures are read again,
    partitioned; here that run's own look refuses too, as the partitioned run's refusal: it names no --spill;
    nothing written, no partition left."""
    out = tmp_path / "out"
    done = patched_cli("memory.WATCH_EVERY_S = 0.0; memory.PEAK_OVER_EXTRACTION = 1e4",
                       str(CAPTURES / "oltp-hogs"), "-o", str(out), "--memory", "2G")
    lines = [line for line in done.stderr.splitlines() if line.strip() and "━" not in line]
    assert done.returncode == 2, done.stderr
    assert any(INSTEAD in line and line.startswith("warning:") for line in lines), done.stderr
    assert lines[-1].startswith("pcapdecomp: error:") and "stopped early" in lines[-1]
    assert "--spill" not in lines[-1] and "Traceback" not in done.stderr
    assert not out.exists()


def test_no_room_in_the_output_folder_is_one_line(small_tmpfs):
    """An output folder on a device without room for the partitions: one line naming it and the room needed, exit
    2, nothing left there."""
    done = patched_cli("memory.COST_PER_DB_EXCHANGE = 1 << 30; memory.WATCH_EVERY_S = float('inf')",
                       str(CAPTURES / "oltp-hogs"), "-q", "-o", str(small_tmpfs / "out"), "--memory", "2G")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "free in the output folder" in lines[0] and "Traceback" not in done.stderr
    assert "--spill DIR on a disk with room" in lines[0]
    assert not (small_tmpfs / "out").exists() or list((small_tmpfs / "out").iterdir()) == []


@pytest.mark.parametrize("first", ["read in memory", "spilled"])
def test_an_output_folder_that_fills_up_during_the_run_is_one_line(first, small_tmpfs):
    """The check before the run passes (the room it needs estimated at 1 % of the captures' size here, so that a
    16 KiB device passes it, as a device passes whose room the partitions outgrow) and the partitions fill the
    output folder's device: one line naming the output folder, advising --spill DIR (none was given, so not
    "another --spill") or more --memory (how much when the in-memory counts said it; the least it takes when the
    captures were spilled first, the set likely over the bound in memory by their size, its counts not known yet),
    exit 2, nothing left there."""
    patch = "spilled.SPILL_FIRST_PER_CAPTURE_BYTE = 0.0" if first == "read in memory" else "pass"
    done = patched_cli("memory.COST_PER_DB_EXCHANGE = 1 << 30; memory.WATCH_EVERY_S = float('inf'); "
                       f"from pcapdecomp.run import spilled; spilled.SPILL_SHARE = 0.01; {patch}",
                       str(CAPTURES / "group-stall"), "-q", "-o", str(small_tmpfs / "out"), "--memory", "2G")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"the output folder {small_tmpfs / 'out'}: no space left on its device" in lines[0], lines[0]
    advice = "analyse it with --spill DIR on a disk with room (or more --memory"
    assert advice + (", e.g. --memory " if first == "read in memory" else ", at least --memory ") in lines[0], lines[0]
    if first == "spilled":  # spilled first because the captures' size put the in-memory run over the bound: the
        # least --memory it names is above the one given
        least = re.search(r"at least --memory (\d+[MG]): the counts decide once the captures are read\)", lines[0])
        assert least and memory.parse_size(least.group(1)) > 2 << 30, lines[0]
    assert "another --spill" not in lines[0]
    assert not (small_tmpfs / "out").exists() or list((small_tmpfs / "out").iterdir()) == []


def test_in_memory_with_spill_is_a_user_mistake(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pcapdecomp", "analyze", str(CAPTURES / "group-stall"), "-q",
                           "--in-memory", "--spill", str(tmp_path / "spill"), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--in-memory and --spill" in done.stderr and not (tmp_path / "out").exists()


@pytest.fixture
def dask_reads(monkeypatch):
    """The spill folder of each extraction on the Dask workers (DaskRunner.extract's; None: in memory)."""
    from pcapdecomp.run.cluster import DaskRunner

    read: list = []
    real_extract = DaskRunner.extract

    def reading(self, points, *given, spill=None, **named):
        read.append(spill)
        return real_extract(self, points, *given, spill=spill, **named)

    monkeypatch.setattr(DaskRunner, "extract", reading)
    return read


def test_on_a_local_cluster_the_workers_spill_first_and_it_is_partitioned(tmp_path, spill_folders, monkeypatch,
                                                                       dask_reads):
    """With --scheduler local (2 worker processes) and a bound: the workers read the captures once, into the
    partitions' folder in the output folder (spill_first: no table comes back whole before the bound is asked), the
    check on their counts finds the in-memory run over the bound, and the run is partitioned from that one read; the
    tables are the in-memory run's. Before, the workers' tables came back whole first, then the captures were read
    again."""
    cs = capture_set(CAPTURES / "group-stall")
    analyze(cs, Options(quiet=True, jobs=1), tmp_path / "memory")
    monkeypatch.setattr(memory, "COST_PER_DB_EXCHANGE", 1 << 30)
    monkeypatch.setattr(memory, "WATCH_EVERY_S", float("inf"))
    monkeypatch.setattr(spilled, "IN_MEMORY_PER_CAPTURE_BYTE", float(1 << 20))  # not surely in memory
    out = tmp_path / "dask"
    got = analyze(cs, Options(quiet=True, jobs=2, scheduler="local", memory=bound_above_this_process()), out)
    assert sum(INSTEAD in w for w in got.warnings) == 1, got.warnings
    assert len(dask_reads) == 1 and dask_reads[0].parent == out.absolute(), dask_reads
    assert dask_reads[0].name.startswith(spilled.INSTEAD_PREFIX)
    assert len(spill_folders) == 1 and spill_folders[0][0] == dask_reads[0] and not dask_reads[0].exists()
    for table in TABLES:
        assert filecmp.cmp(tmp_path / "memory" / table, out / table, shallow=False), table


def test_on_a_local_cluster_a_set_that_fits_is_read_back_into_memory(tmp_path, spill_folders, dask_reads,
                                                                     monkeypatch):
    """The same with a bound the in-memory run fits: the workers' one spilled read is read back here and analysed in
    memory (not partitioned, no warning about it), the folder gone at the end, the tables those of --scheduler on
    captures that surely fit (read in memory on the workers), and summary.json too."""
    cs = capture_set(CAPTURES / "group-stall")
    plain = analyze(cs, Options(quiet=True, jobs=2, scheduler="local", memory=bound_above_this_process()),
                    tmp_path / "plain")
    assert dask_reads == [None]  # surely fits: read in memory on the workers, as before
    monkeypatch.setattr(spilled, "IN_MEMORY_PER_CAPTURE_BYTE", float(1 << 20))  # not surely in memory
    out = tmp_path / "dask"
    got = analyze(cs, Options(quiet=True, jobs=2, scheduler="local", memory=bound_above_this_process()), out)
    assert not any(INSTEAD in w for w in got.warnings) and got.warnings == plain.warnings
    assert len(dask_reads) == 2 and dask_reads[1].parent == out.absolute() and not dask_reads[1].exists()
    assert spill_folders == []  # not the partitioned run
    for table in (*TABLES, "summary.json"):
        assert filecmp.cmp(tmp_path / "plain" / table, out / table, shallow=False), table
    assert [p.name for p in out.iterdir() if p.name.startswith(".pcapdecomp-partial")] == []


@pytest.fixture
def extractions(monkeypatch):
    """The spill folder of each extraction analyze asks for (extract_points's `spill`; None: in memory)."""
    import pcapdecomp.analysis as analysis

    asked: list = []
    real = analysis.extract_points

    def extracting(*args, **named):
        asked.append(named.get("spill"))
        return real(*args, **named)

    monkeypatch.setattr(analysis, "extract_points", extracting)
    return asked


@pytest.mark.parametrize("jobs", [1, 2])
def test_here_a_set_not_surely_in_memory_is_read_once_spilled_then_partitioned(jobs, tmp_path, spill_folders,
                                                                               monkeypatch, extractions):
    """Without a scheduler too (issue 37: a 10 GB pair under --memory 3G was read whole in memory, 2,444 MiB, before
    the counts sent it partitioned, where --spill DIR peaked at 943): a set whose captures are too big to surely fit
    is read once, spilled into a folder of the output folder, and partitioned from that read when its counts are
    over the bound in memory; one warning, the in-memory run's tables, the folder gone at the end."""
    cs = capture_set(CAPTURES / "group-stall")
    analyze(cs, Options(quiet=True, jobs=1), tmp_path / "memory")
    extractions.clear()
    monkeypatch.setattr(memory, "COST_PER_DB_EXCHANGE", 1 << 30)
    monkeypatch.setattr(memory, "WATCH_EVERY_S", float("inf"))
    monkeypatch.setattr(spilled, "SPILL_FIRST_PER_CAPTURE_BYTE", float(1 << 20))  # likely over in memory
    out = tmp_path / "spilled-first"
    got = analyze(cs, Options(quiet=True, jobs=jobs, memory=bound_above_this_process()), out)
    assert sum(INSTEAD in w for w in got.warnings) == 1, got.warnings
    assert len(extractions) == 1 and extractions[0].parent == out.absolute(), extractions  # one read, spilled
    assert extractions[0].name.startswith(spilled.INSTEAD_PREFIX) and not extractions[0].exists()
    assert len(spill_folders) == 1 and spill_folders[0][0] == extractions[0]
    for table in TABLES:
        assert filecmp.cmp(tmp_path / "memory" / table, out / table, shallow=False), table


@pytest.mark.parametrize("lossy", [False, True])
def test_here_a_set_that_fits_after_all_is_read_back_into_memory(lossy, tmp_path, spill_folders, monkeypatch,
                                                                  extractions):
    """The same read, spilled first, of a set whose counts fit the bound in memory: read back and analysed in memory
    (not partitioned, nothing said about it; a pair that lost frames repaired as in memory), every file the in-memory
    run's, summary.json too; no folder left."""
    folder = CAPTURES / "group-stall"
    if lossy:
        folder = tmp_path / "lossy-pair"
        folder.mkdir()
        for name in ("app.pcap", "slow.log", "capture.toml"):
            shutil.copy(CAPTURES / "group-stall" / name, folder / name)
        lose_frames(CAPTURES / "group-stall" / "db.pcap", folder / "db.pcap", 0.03, 1)
    plain = analyze(capture_set(folder), Options(quiet=True, jobs=1, memory=bound_above_this_process()),
                    tmp_path / "plain")
    assert extractions == [None]  # surely fits: read in memory
    assert not lossy or any("taken from the other" in w for w in plain.warnings), plain.warnings
    monkeypatch.setattr(spilled, "SPILL_FIRST_PER_CAPTURE_BYTE", float(1 << 20))  # likely over in memory
    out = tmp_path / "read-back"
    got = analyze(capture_set(folder), Options(quiet=True, jobs=1, memory=bound_above_this_process()), out)
    assert got.warnings == plain.warnings
    assert len(extractions) == 2 and extractions[1].parent == out.absolute() and not extractions[1].exists()
    assert spill_folders == []  # not the partitioned run
    for table in (*TABLES, "summary.json"):
        assert filecmp.cmp(tmp_path / "plain" / table, out / table, shallow=False), table
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".pcapdecomp")) == [".pcapdecomp-outputs.json"]


def test_here_a_time_window_is_not_spilled_first(tmp_path, monkeypatch, extractions):
    """With --since/--until the rows held are the window's: the captures' size says nothing of them, so they are
    read in memory (the look during the extraction extrapolates to the window's end), not spilled first."""
    import datetime as dt

    from pcapdecomp.core.window import window_of

    monkeypatch.setattr(spilled, "SPILL_FIRST_PER_CAPTURE_BYTE", float(1 << 20))  # likely over in memory, by size
    cs = capture_set(CAPTURES / "oltp-prepared", window=window_of("2026-11-23T20:20:33Z", "2026-11-23T20:20:34.2Z",
                                                                  dt.timezone.utc))
    got = analyze(cs, Options(quiet=True, jobs=1, memory=bound_above_this_process()), tmp_path / "out")
    assert extractions == [None] and not any(INSTEAD in w for w in got.warnings)
    assert got.summary["exchanges"]["total"] > 0


def test_a_lossy_pair_switched_early_is_analysed_in_memory_after_all(tmp_path, monkeypatch):
    """The early look switches before the counts show the pair lost frames (here: it finds the first, in-memory
    extraction over the bound, its fixed part counted as 1 TiB; the second extraction is looked at as in the
    field); the partitioned run does not take a lossy pair, so the set is analysed in memory after all,
    within the bound: both said in summary.json's warnings, the tables the in-memory run's."""
    import pcapdecomp.analysis as analysis

    folder = tmp_path / "lossy-pair"
    folder.mkdir()
    for name in ("app.pcap", "slow.log", "capture.toml"):
        shutil.copy(CAPTURES / "group-stall" / name, folder / name)
    lose_frames(CAPTURES / "group-stall" / "db.pcap", folder / "db.pcap", 0.03, 1)
    reference = analyze(capture_set(folder), Options(quiet=True, jobs=1), tmp_path / "memory")
    assert any("taken from the other" in w for w in reference.warnings), reference.warnings  # repaired
    calls = []
    real = analysis.extract_points

    def first_looked_at_as_over(*args, **named):
        calls.append(named.get("spill"))
        with monkeypatch.context() as knobs:
            if len(calls) == 1:
                knobs.setattr(memory, "WATCH_EVERY_S", 0.0)
                # over at the first look whatever it measured (a test process may grow by nothing: reused blocks)
                knobs.setattr(memory, "COST_FIXED", 1 << 40)
            return real(*args, **named)

    monkeypatch.setattr(analysis, "extract_points", first_looked_at_as_over)
    out = tmp_path / "out"
    got = analyze(capture_set(folder), Options(quiet=True, jobs=1, memory=bound_above_this_process()), out)
    assert len(calls) == 2 and calls[0] is None and calls[1] is not None
    assert any(INSTEAD in w for w in got.warnings)
    assert any(w.startswith("the partitioned run: frames lost at") and w.endswith("analysed in memory after all")
               for w in got.warnings), got.warnings
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".pcapdecomp")) == [".pcapdecomp-outputs.json"]
    for table in TABLES:
        assert filecmp.cmp(tmp_path / "memory" / table, out / table, shallow=False), table


def test_a_local_clusters_processes_are_counted_in_the_bounds_start(tmp_path):
    """--scheduler local starts a scheduler and worker processes under this one, which stay for the run: the bound is
    the process tree's, so they are counted in the start every prediction adds to (before, a run predicted within
    --memory 700M peaked at 807 MiB of the tree on the 40 s read-write pair)."""
    from pcapdecomp.run.session import Run

    cs = capture_set(CAPTURES / "group-stall")
    own = memory.own_rss()
    with Run(cs, Options(quiet=True, jobs=2, scheduler="local"), tmp_path / "out") as run:
        assert run.runner.cluster is not None
        tree = memory.tree_memory()
        assert tree > own + (32 << 20)  # the cluster's processes hold memory of their own
        assert run.memory.start >= 0.8 * tree, (run.memory.start >> 20, tree >> 20)


# -- a pair that lost frames, too big for the bound in memory: partitioned without the loss repair ---------------------

LOSS_SKIPPED = "the loss repair, which takes such bytes from the other point, was not done"


def lossy_pair(folder):
    """group-stall with 3 % of its DB capture's frames lost (its app capture, slow log and settings as they are)."""
    folder.mkdir()
    for name in ("app.pcap", "slow.log", "capture.toml"):
        shutil.copy(CAPTURES / "group-stall" / name, folder / name)
    lose_frames(CAPTURES / "group-stall" / "db.pcap", folder / "db.pcap", 0.03, 1)
    return folder


def unrepaired_reference(folder, out):
    """The in-memory run of `folder` with the loss repair switched off (Options.loss_repair, for tests)."""
    reference = analyze(capture_set(folder), Options(quiet=True, jobs=1, loss_repair=False), out)
    skipped = reference.summary["repair"]
    assert skipped["skipped"] is True and skipped["holes"] > 0 and skipped["bytes_unrepaired"] > 0, skipped
    assert not any("taken from the other" in w for w in reference.warnings)
    return reference


def assert_same_but_the_mode(memory_out, out) -> tuple[dict, list[str]]:
    """Every *.parquet of `out` cmp-equal to `memory_out`'s, summary.json equal but for the mode's warnings (those
    only `out` has) and the repair's reason; (out's repair block, those warnings)."""
    names = sorted(p.name for p in memory_out.glob("*.parquet"))
    assert names == sorted(p.name for p in out.glob("*.parquet")) and "exchanges.parquet" in names
    for name in names:
        assert filecmp.cmp(memory_out / name, out / name, shallow=False), name
    left, right = (json.loads((d / "summary.json").read_text()) for d in (memory_out, out))
    mine = [w for w in right["warnings"] if w not in left["warnings"]]
    assert [w for w in right.pop("warnings") if w not in mine] == left.pop("warnings")
    repair = dict(right["repair"])
    left["repair"].pop("reason"), right["repair"].pop("reason")
    assert left == right
    return repair, mine


def test_a_lossy_pair_too_big_in_memory_is_partitioned_without_the_repair(tmp_path, monkeypatch, spill_folders):
    """The in-memory run (which would repair the loss) over the bound, the partitioned one within it: partitioned
    instead, without the loss repair, said in one warning (the points, their holes and bytes, the memory the repair
    needs against the bound, the --memory that would repair, a window); summary.json → repair says skipped and why;
    the files are those of the in-memory run with the repair off, the exchanges on lost bytes marked gap."""
    folder = lossy_pair(tmp_path / "lossy-pair")
    reference = unrepaired_reference(folder, tmp_path / "memory")
    out = tmp_path / "instead"
    with monkeypatch.context() as patched:
        patched.setattr(memory, "COST_PER_DB_EXCHANGE", 1 << 30)
        patched.setattr(memory, "WATCH_EVERY_S", float("inf"))
        got = analyze(capture_set(folder), Options(quiet=True, jobs=1, memory=bound_above_this_process()), out)
    assert len(spill_folders) == 1 and not spill_folders[0][0].exists()
    assert sum(INSTEAD in w for w in got.warnings) == 1
    said = [w for w in got.warnings if LOSS_SKIPPED in w]
    assert len(said) == 1, got.warnings
    lost = reference.summary["repair"]
    db = str(folder / "db.pcap")
    assert said[0].startswith(f"frames lost at {db} ({lost['holes']:,} holes, {lost['bytes_unrepaired']:,} bytes "
                              f"never captured, in {lost['connections']:,} connections)"), said[0]
    assert "more than the bound of" in said[0] and "marked (problems gap) rather than repaired" in said[0]
    assert re.search(r"To repair them: --memory \d+[MG] \(analysed in memory\), or a --since/--until window", said[0])
    assert not any("taken from the other" in w or "analysed in memory after all" in w for w in got.warnings)
    repair, mine = assert_same_but_the_mode(tmp_path / "memory", out)
    assert sorted(mine) == sorted(w for w in got.warnings if INSTEAD in w or LOSS_SKIPPED in w)
    assert repair["skipped"] is True and repair["lossy_points"] == [db]
    assert "more than the bound of" in repair["reason"] and "does not repair" in repair["reason"]
    written = pd.read_parquet(out / "exchanges.parquet", columns=["problems", "match_notes", "bounded"])
    assert written["problems"].astype(str).str.contains("gap").any()
    assert not written["match_notes"].astype(str).str.contains("repaired-at").any()
    assert not written["bounded"].astype(str).str.len().any()  # no time bounded by borrowed bytes


def test_spill_given_on_a_lossy_pair_too_big_in_memory_is_partitioned_without_the_repair(tmp_path):
    """`--spill DIR` on a pair that lost frames whose in-memory run does not fit: partitioned without the repair
    (no longer analysed in memory), exit 0, the warning on the terminal; every table byte for byte the in-memory
    run's with the repair off."""
    folder = lossy_pair(tmp_path / "lossy-pair")
    unrepaired_reference(folder, tmp_path / "memory")
    out, spill = tmp_path / "spilled", tmp_path / "spill"
    done = patched_cli("memory.COST_PER_DB_EXCHANGE = 1 << 30; memory.WATCH_EVERY_S = float('inf')", str(folder),
                       "-o", str(out), "--spill", str(spill), "--memory", "2G")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip() and "━" not in line]
    assert sum(line.startswith("warning: frames lost at") and LOSS_SKIPPED in line for line in lines) == 1, lines
    assert not any("--spill:" in line or INSTEAD in line for line in lines), lines
    repair, mine = assert_same_but_the_mode(tmp_path / "memory", out)
    assert repair["skipped"] is True and len(mine) == 1 and LOSS_SKIPPED in mine[0]
    assert not spill.exists()  # made by the run, left empty: removed


def test_a_lossy_pair_that_fits_is_repaired_in_memory(tmp_path, spill_folders):
    """Within the bound in memory, a pair that lost frames is analysed there, repaired, as before: nothing
    partitioned, no word of a skipped repair. (--spill given on one: tests/test_spill_run.py, 'frames lost'.)"""
    folder = lossy_pair(tmp_path / "lossy-pair")
    got = analyze(capture_set(folder), Options(quiet=True, jobs=1, memory=bound_above_this_process()),
                  tmp_path / "out")
    assert not spill_folders and got.summary["repair"]["bytes_borrowed"] > 0
    assert "skipped" not in got.summary["repair"]
    assert not any(INSTEAD in w or LOSS_SKIPPED in w for w in got.warnings)
    assert any("taken from the other" in w for w in got.warnings)


def test_on_a_local_cluster_without_room_for_the_spill_it_says_the_bound_waits(tmp_path, monkeypatch, dask_reads):
    """The output folder's device with no room for the workers' spill (its free bytes read as 0): the workers read in
    memory as before, and one warning says that the bound is checked only once their tables are here (a run that
    held the bound silently broke it: 1,387 MiB under --memory 900M on a 300 MB tmpfs)."""
    cs = capture_set(CAPTURES / "group-stall")
    monkeypatch.setattr(spilled, "IN_MEMORY_PER_CAPTURE_BYTE", float(1 << 20))  # not surely in memory
    monkeypatch.setattr(spilled, "_free_bytes", lambda path: 0)
    got = analyze(cs, Options(quiet=True, jobs=2, scheduler="local", memory=bound_above_this_process()),
                  tmp_path / "dask")
    said = [w for w in got.warnings if "less room than the workers' spill" in w]
    assert len(said) == 1 and "checked only once their tables are here" in said[0], got.warnings
    assert dask_reads == [None]


def test_a_warning_taken_back_is_printed_once(tmp_path, in_memory_too_big, capfd):
    """Partitioned instead of a lossy DB capture: the first extraction's damage line is taken back (summary.json has
    it once) and said again by the second read; on the terminal it is printed once, not twice."""
    db = tmp_path / "lossy.pcap"
    lose_frames(CAPTURES / "oltp-prepared" / "db.pcap", db, 0.03, 1)
    cs = capture_set(None, db=[str(db)])
    got = analyze(cs, Options(quiet=False, jobs=1, memory=bound_above_this_process()), tmp_path / "out")
    assert any(INSTEAD in w for w in got.warnings)
    damage = [w for w in got.warnings if "never captured" in w]
    assert len(damage) == 1, got.warnings
    printed = capfd.readouterr().err
    assert printed.count("never captured") == 1, printed
