"""analyze's stated memory bound (--memory, capture.toml's memory, the default): a bound a capture set does not fit
in is refused in one line, exit 2, the output folder as it was; one it fits in runs; the peak the bound checks
(core.memory.predicted_peak) is at least the peak a real run of a bundled capture set measures; the check during
the extraction stops it, workers and all. Real captures, real processes."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pcapdecomp.core import memory
from pcapdecomp.core.errors import MemoryBoundError, PartitionedInstead, UsageError
from pcapdecomp.read.captureset import capture_set
from pcapdecomp.read.extract import counts_of, extract_all, extract_points, span_ns

REPO = Path(__file__).resolve().parents[1]
HOGS = REPO / "captures" / "oltp-hogs"

_spec = importlib.util.spec_from_file_location("memory_bound", REPO / "benchmarks" / "memory_bound.py")
memory_bound = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(memory_bound)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcapdecomp.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "COLUMNS": "200"}, timeout=300)


def _one_line_exit_2(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("pcapdecomp: error: ")
    return lines[0]


@pytest.mark.parametrize("value", ["0", "lots", "-1G", "8X", "0.0M", ""])
def test_a_size_that_is_not_one_is_refused_in_one_line(value, tmp_path):
    line = _one_line_exit_2(run("analyze", str(HOGS), "--memory", value, "-q", "-o", str(tmp_path / "out")))
    assert "--memory" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text,size", [("8G", 8 << 30), ("800M", 800 << 20), ("1.5GiB", 3 << 29),
                                       ("512 MiB", 512 << 20), ("2048", 2048), ("1t", 1 << 40), ("64KB", 64 << 10)])
def test_sizes_as_users_write_them(text, size):
    assert memory.parse_size(text) == size


def _set_copy(tmp_path: Path, toml_line: str | None = None) -> Path:
    folder = tmp_path / "set"
    shutil.copytree(HOGS, folder)
    if toml_line is not None:
        toml = folder / "capture.toml"
        toml.write_text(toml_line + "\n" + toml.read_text())
    return folder


def test_a_bound_far_below_the_need_refuses_and_leaves_the_output_folder_as_it_was(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    line = _one_line_exit_2(run("analyze", str(HOGS), "--memory", "20M", "-q", "-o", str(out)))
    assert "more than the bound of 20 MiB (--memory 20M)" in line
    assert "--memory" in line and "nothing written" in line
    assert "--since" not in line  # below what any analysis takes: a shorter window would not fit either
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"
    _one_line_exit_2(run("analyze", str(HOGS), "--memory", "20M", "-q", "-o", str(tmp_path / "fresh")))
    assert not (tmp_path / "fresh").exists()


def test_capture_toml_states_the_bound_and_the_option_wins(tmp_path):
    folder = _set_copy(tmp_path, 'memory = "20M"')
    line = _one_line_exit_2(run("analyze", str(folder), "-q", "-o", str(tmp_path / "a")))
    assert "(capture.toml: memory = 20M)" in line
    proc = run("analyze", str(folder), "--memory", "8G", "-q", "-o", str(tmp_path / "b"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "b" / "report.html").exists()
    bad = _set_copy(tmp_path / "bad", 'memory = "lots"')
    line = _one_line_exit_2(run("analyze", str(bad), "-q", "-o", str(tmp_path / "c")))
    assert "capture.toml: memory = 'lots'" in line


def test_enough_memory_runs(tmp_path):
    proc = run("analyze", str(HOGS), "--memory", "4G", "-q", "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert {"exchanges.parquet", "summary.json", "report.html"} <= {p.name for p in (tmp_path / "out").iterdir()}


def test_the_counts_check_names_the_exchanges_the_capture_set_holds(tmp_path, monkeypatch):
    """A bound above what any analysis takes but below this set's predicted peak: refused once the counts are known,
    naming them as the extraction counted them (summary.json's per-point counts, here from the same extraction).
    The look during the extraction is off: with a bound a byte below the prediction, its measured growth (buffers,
    whatever this test process held before) can pass it first when a loaded machine makes the extraction outlast
    WATCH_EVERY_S (the CI of 2026-12-02 saw it); that check has its own test below."""
    monkeypatch.setattr(memory, "WATCH_EVERY_S", float("inf"))
    cs = capture_set(HOGS)
    extracted = extract_points(cs, 1, True, 1 << 20, lambda _: None)
    counts = counts_of(extracted)
    assert counts.db_exchanges > 1000 and counts.other_exchanges > 1000 and counts.points == 2

    def bound(above_need: int) -> memory.MemoryBound:
        """A bound `above_need` bytes above this set's predicted peak from the process's memory as it starts."""
        made = memory.MemoryBound(1, "the test's bound", 1)
        made.limit = memory.predicted_peak(counts, 1, made.start) + above_need
        return made

    with pytest.raises(MemoryBoundError) as refused:
        extract_points(cs, 1, True, 1 << 20, lambda _: None, memory=bound(-1))
    text = str(refused.value)
    assert f"for {counts.exchanges:,} exchanges ({counts.db_exchanges:,} at the DB, " in text
    assert "(the test's bound)" in text and "nothing written" in text and "--since T --until T" in text
    assert "editcap" not in text  # a cut file loses the connections' state: the option keeps it
    # a need a byte above the bound: the two sizes are written apart, and the window is shorter than the capture
    need, bound_text = re.search(r"need up to about (.+?) of memory .*more than the bound of (.+?) \(", text).groups()
    assert need != bound_text, text
    window = float(re.search(r"a time window of at most ([0-9.]+) s:", text).group(1))
    assert window < span_ns(extracted.app + extracted.db) / 1e9, text
    enough = bound(0)
    extract_points(cs, 1, True, 1 << 20, lambda _: None, memory=enough)
    assert enough.predicted == enough.limit


def test_a_refusal_names_the_partitioned_run_where_it_would_take_the_set(monkeypatch):
    """A set the in-memory run does not fit in: the refusal names --spill DIR with the partitioned run's own
    predicted peak when that run would take the set (analyze without --spill: spill_hint), said "within the bound"
    only when it is, with the --memory it would need when it is not; for a pair that lost frames, named as without
    the loss repair (the partitioned run leaves the lost bytes holes); not named for the partitioned run's own
    refusal."""
    monkeypatch.setattr(memory, "WATCH_EVERY_S", float("inf"))
    counts = memory.Counts(db_exchanges=10_000_000, other_exchanges=10_000_000, connections=100, points=2)
    start = memory.MemoryBound(None, None, 1).start
    partitioned, in_memory = (memory.predicted_peak(counts, 1, start, partitioned=True),
                              memory.predicted_peak(counts, 1, start))
    between = memory.MemoryBound((partitioned + in_memory) // 2, "--memory (test)", 1)

    def refusal(bound: memory.MemoryBound, of: memory.Counts, **given) -> str:
        with pytest.raises(MemoryBoundError) as refused:
            bound.check(of, **given)
        return str(refused.value)

    text = refusal(between, counts, spill_hint=True)
    hint = re.search(r"analyse it partitioned \(predicted about (.+?), within the bound;", text)
    assert hint and hint.group(1) == memory.size_text(partitioned), text
    # said only under --in-memory (else the run is partitioned by itself): what to drop, or --spill DIR
    assert "without --in-memory it runs so by itself, in the output folder, or with --spill DIR elsewhere" in text
    assert "--spill" not in refusal(between, counts)  # the set is not one the partitioned run takes
    lossy = memory.Counts(db_exchanges=10_000_000, other_exchanges=10_000_000, connections=100, points=2,
                          repaired_bytes=1 << 20)
    text = refusal(between, lossy, spill_hint=True)
    assert "partitioned (predicted about" in text and "without the loss repair" in text, text
    assert "without the loss repair" not in refusal(between, counts, spill_hint=True)
    below_both = memory.MemoryBound(partitioned - (1 << 20), "--memory (test)", 1)
    text = refusal(below_both, counts, spill_hint=True)
    assert "within the bound" not in text, text
    # over the bound too, below the in-memory need: the bound that partitions it by itself, without --spill
    assert (f"analyse it partitioned (predicted about {memory.size_text(partitioned)}; " in text
            and f"--memory {memory.round_up_text(partitioned)} alone does that by itself, in the output folder"
            in text), text
    assert "--spill" not in refusal(below_both, counts, partitioned=True, spill_hint=True)
    # the partitioned run refused where the in-memory one needs less (a small set, its fixed part the larger):
    # that bound said; never the partitioned run named as the way out of an in-memory refusal then
    small = memory.Counts(db_exchanges=10_000, other_exchanges=10_000, connections=10, points=2)
    small_in_memory = memory.predicted_peak(small, 1, start)
    assert small_in_memory < memory.predicted_peak(small, 1, start, partitioned=True)
    tight = memory.MemoryBound(small_in_memory - (1 << 20), "--memory (test)", 1)
    text = refusal(tight, small, partitioned=True)
    assert text.startswith("partitioned, this analysis would need up to about") and (
        f"in memory, without --spill, it needs less: e.g. --memory {memory.round_up_text(small_in_memory)}" in text), text
    assert "partitioned" not in refusal(tight, small, spill_hint=True)
    assert "in memory, without --spill" not in refusal(below_both, counts, partitioned=True)

    # through the extraction, on a bundled pair: the partitioned run's fixed part is above this small set's
    # in-memory need, so the refusal gives the --memory the in-memory run takes and names no partitioned run
    cs = capture_set(HOGS)
    extracted = extract_points(cs, 1, True, 1 << 20, lambda _: None)
    made = memory.MemoryBound(1, "the test's bound", 1)
    want = memory.predicted_peak(counts_of(extracted), 1, made.start)
    assert want < memory.predicted_peak(counts_of(extracted), 1, made.start, partitioned=True)
    made.limit = want - 1
    with pytest.raises(MemoryBoundError) as refused:
        extract_points(cs, 1, True, 1 << 20, lambda _: None, memory=made, spill_hint=True)
    assert not isinstance(refused.value, PartitionedInstead)
    assert f"e.g. --memory {memory.round_up_text(want)})" in str(refused.value), str(refused.value)
    assert "--spill" not in str(refused.value) and "partitioned" not in str(refused.value), str(refused.value)


def test_the_check_during_the_extraction_stops_it_and_its_workers(monkeypatch):
    """The two captures of a set read side by side (--jobs 2: one here, one in a worker): a bound the extraction's
    memory passes at its first look stops the extraction with the refusal, and the worker is ended, not left to
    finish its capture."""
    monkeypatch.setattr(memory, "WATCH_EVERY_S", 0.0)
    bound = memory.MemoryBound(None, "test", 2)
    bound = memory.MemoryBound(bound.start + memory.COST_FIXED - 1, "the test's bound", 2)
    before = set(mp.active_children())
    with pytest.raises(MemoryBoundError) as refused:
        extract_all([HOGS / "app.pcap", HOGS / "db.pcap"], None, 1 << 20, 2, bound.watching(None, None, True))
    assert "stopped early" in str(refused.value) and "(a rough estimate from what the " in str(refused.value)
    # a bound below the partitioned run's fixed part: that run is not named (it would be refused in its turn)
    assert bound.limit < bound._fixed_peak(True) and "--spill" not in str(refused.value), str(refused.value)
    assert set(mp.active_children()) == before
    # above it, the partitioned run is named, without a number (no count yet), and taken instead (PartitionedInstead)
    monkeypatch.setattr(memory, "PEAK_OVER_EXTRACTION", 1e4)
    roomy = memory.MemoryBound(1, "the test's bound", 2)
    roomy.limit = roomy._fixed_peak(True)
    with pytest.raises(PartitionedInstead) as instead:
        extract_all([HOGS / "app.pcap", HOGS / "db.pcap"], None, 1 << 20, 2, roomy.watching(None, None, True))
    assert "analyse it partitioned with --spill DIR (less memory" in str(instead.value), str(instead.value)
    assert set(mp.active_children()) == before


def test_the_partitioned_prediction_bounds_the_measured_peak_of_a_run():
    """analyze --spill of a bundled pair in a child process: the partitioned run's predicted peak (the check with
    --spill predicts it) is at least its measured peak, and not absurdly above. (At scale: docs/scale.md, the
    20-copy synthetic pair, benchmarks/memory_bound.py --spill yes.)"""
    m = memory_bound.measure(REPO, [str(HOGS), "--jobs", "1"], spill=True)
    assert m["code"] == 0
    peak = max(m["maxrss"], m["pss"])
    assert m["predicted"] == memory.predicted_peak(memory.Counts(**m["counts"]), 1, m["start"], partitioned=True)
    assert peak <= m["predicted"] <= 3 * peak, m


def test_the_prediction_bounds_the_measured_peak_of_a_run():
    """analyze of a bundled pair in a child process (benchmarks/memory_bound.py's measurement): the peak its check
    predicted is at least the child's maximum RSS and its process tree's Pss, with --jobs 1 and 2, and not
    absurdly above (a bound of 3× the peak would refuse captures that fit)."""
    for jobs in ("1", "2"):
        m = memory_bound.measure(REPO, [str(HOGS), "--jobs", jobs])
        assert m["code"] == 0
        peak = max(m["maxrss"], m["pss"])
        assert m["counts"]["db_exchanges"] > 1000
        assert peak <= m["predicted"] <= 3 * peak, (jobs, m)


def test_the_default_bound_is_a_share_of_what_the_machine_has():
    bound = memory.MemoryBound(None, None, 1)
    available = memory.mem_available()
    if available is None:
        pytest.skip("no /proc/meminfo")
    assert bound.limit is not None and bound.limit > bound.start
    # what is available moves between the two reads: within a quarter of it
    assert abs((bound.limit - bound.start) - memory.DEFAULT_SHARE * min(
        available, (memory.cgroup_headroom() or (available,))[0])) < available / 4
    assert "at the start" in bound.source and "80%" in bound.source


def test_a_point_that_lost_bytes_counts_its_bytes_for_the_repair(tmp_path):
    """The loss repair reads a lossy point's connections again: its MySQL bytes count in the prediction; a clean
    set's count none."""
    sys.path.insert(0, str(REPO / "scripts"))
    from lose_frames import lose_frames

    lossy = _set_copy(tmp_path)
    lose_frames(HOGS / "db.pcap", lossy / "db.pcap", 0.05, seed=11)
    clean = counts_of(extract_points(capture_set(HOGS), 1, True, 1 << 20, lambda _: None))
    extracted = extract_points(capture_set(lossy), 1, True, 1 << 20, lambda _: None)
    counts = counts_of(extracted)
    assert clean.repaired_bytes == 0
    # the lossy DB point's MySQL bytes, not the clean app point's
    assert counts.repaired_bytes == extracted.qualities["dbs"][0]["mysql_bytes"] > 0
    start = 100 << 20
    assert abs(memory.predicted_peak(counts, 1, start) - memory.predicted_peak(
        memory.Counts(counts.db_exchanges, counts.other_exchanges, counts.connections, counts.points), 1, start)
        - memory.COST_PER_REPAIRED_BYTE * counts.repaired_bytes) <= 1
    # the same lossy DB capture alone: nothing to repair from, nothing counted for it
    alone = counts_of(extract_points(capture_set(db=lossy / "db.pcap"), 1, True, 1 << 20, lambda _: None))
    assert alone.db_exchanges == counts.db_exchanges and alone.repaired_bytes == 0


@pytest.mark.parametrize("seconds,text", [(39.6, "39 s"), (3.08, "3.0 s"), (119.0, "1 min"), (7199.0, "1.9 h"),
                                          (0.05, None)])
def test_the_window_a_refusal_suggests_is_rounded_down(seconds, text):
    """The 40 s read-write pair refused a need a hair above the bound with "a time window of at most 40 s" (its
    39.6 s rounded up to the capture's own length): a window the capture already is."""
    assert memory._duration_text(seconds) == text


@pytest.mark.parametrize("text", ["-5G", "-0.5M", "0", "+0K"])
def test_a_size_not_above_0_is_told_so(text):
    """-5G is a size below 0, not something that is no size at all: the user is told what is wrong with it."""
    with pytest.raises(UsageError, match="must be more than 0"):
        memory.parse_size(text)


def test_a_bound_beyond_what_the_machine_has_is_said_not_silently_taken(tmp_path):
    """--memory 100000T was taken without a word: a bound the machine cannot give does not keep the run from the
    OOM killer. The run goes on (the user may mean it: swap), with a warning on the terminal and in summary.json;
    a bound the machine has gives none."""
    proc = run("analyze", str(HOGS), "--memory", "100000T", "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "warning: --memory 100000T: more than the " in proc.stderr and "OOM killer" in proc.stderr
    warnings = json.loads((tmp_path / "out" / "summary.json").read_text())["warnings"]
    assert [w for w in warnings if w.startswith("--memory 100000T: more than the ")], warnings
    fits = run("analyze", str(HOGS), "--memory", "1G", "-o", str(tmp_path / "fits"))
    assert fits.returncode == 0 and "--memory 1G: more than" not in fits.stderr, fits.stderr


def test_a_spilled_extraction_is_not_extrapolated(tmp_path, monkeypatch):
    """The look during a spilled extraction (--spill, or partitioned instead) holds what it holds now against the
    bound, without extrapolating it to the whole capture: its rows go to the spill, and what it holds does not grow
    with the bytes read (a spilled pair was refused at 2.2 times its count). Here any extrapolation is over the bound
    (its margin 0, from the first byte), and what is held never is: the in-memory extraction is refused, the spilled
    one is not."""
    monkeypatch.setattr(memory, "WATCH_EVERY_S", 0.0)
    monkeypatch.setattr(memory, "EXTRAPOLATE_AFTER", 0.0)
    monkeypatch.setattr(memory, "EXTRAPOLATION_MARGIN", 0.0)
    cs = capture_set(HOGS)

    def bound() -> memory.MemoryBound:
        return memory.MemoryBound(memory.own_rss() + (1 << 30), "the test's bound", 1)

    with pytest.raises(MemoryBoundError) as refused:
        extract_points(cs, 1, True, 1 << 20, lambda _: None, memory=bound())
    assert "stopped early" in str(refused.value)
    extracted = extract_points(cs, 1, True, 1 << 20, lambda _: None, memory=bound(), spill=tmp_path / "spill")
    assert counts_of(extracted).db_exchanges > 1000


def test_a_refusal_gives_only_advice_that_can_work(monkeypatch):
    """What a fresh pair of eyes followed and saw fail: the time window is suggested with a margin (a window in the
    capture's busy part holds more than its average share) and not at all when the run's fixed part alone is over
    the bound; --jobs 1 where the processes' share is what passes it; the in-memory run named as within the bound
    where it is, for a partitioned refusal; the partitioned run not named where the bound it needs would keep the
    set in memory."""
    monkeypatch.setattr(memory, "WATCH_EVERY_S", float("inf"))
    start = memory.MemoryBound(None, None, 1).start
    counts = memory.Counts(db_exchanges=1_000_000, other_exchanges=1_000_000, connections=32, points=2)

    def refusal(bound: memory.MemoryBound, **given) -> str:
        with pytest.raises(MemoryBoundError) as refused:
            bound.check(counts, **given)
        return str(refused.value)

    need = memory.predicted_peak(counts, 1, start)
    fixed = memory.predicted_peak(memory.Counts(0, 0, 0, 0), 1, start)
    half = memory.MemoryBound(1, "--memory (test)", 1)
    half.start, half.limit = start, fixed + (need - fixed) // 2
    text = refusal(half, span_ns=100 * 10**9)
    window = re.search(r"time window of at most (\d+) s", text)
    assert window and int(window.group(1)) == int(100 * 0.5 * memory.WINDOW_MARGIN), text
    below_fixed = memory.MemoryBound(1, "--memory (test)", 1)
    below_fixed.start, below_fixed.limit = start, fixed - 1
    assert "time window" not in refusal(below_fixed, span_ns=100 * 10**9)
    # --jobs 2 over the bound, --jobs 1 within it
    two = memory.MemoryBound(1, "--memory (test)", 2)
    two.start, two.limit = start, need
    assert f"or --jobs 1 (predicted about {memory.size_text(need)}, within the bound)" in refusal(two), refusal(two)
    assert "or --jobs 1 (" not in refusal(half)
    # a partitioned refusal whose in-memory run is within the bound
    small = memory.Counts(db_exchanges=10_000, other_exchanges=10_000, connections=10, points=2)
    tight = memory.MemoryBound(1, "--memory (test)", 1)
    tight.start, tight.limit = start, memory.predicted_peak(small, 1, start) + 1
    with pytest.raises(MemoryBoundError) as refused:
        tight.check(small, partitioned=True)
    assert "in memory, without --spill, it needs less: predicted about" in str(refused.value)
    assert "within this bound" in str(refused.value), str(refused.value)
    # both runs over, the bound the partitioned one needs at or above the in-memory need: not named
    close = memory.Counts(db_exchanges=150_000, other_exchanges=150_000, connections=32, points=2)
    both = memory.MemoryBound(1, "--memory (test)", 1)
    both.start = start
    spill, whole = (memory.predicted_peak(close, 1, start, partitioned=True), memory.predicted_peak(close, 1, start))
    both.limit = min(spill, whole) - 1
    with pytest.raises(MemoryBoundError) as refused:
        both.check(close, spill_hint=True)
    named = "partitioned (predicted" in str(refused.value)
    assert named == (spill < whole and memory.parse_size(memory.round_up_text(spill)) < whole), str(refused.value)


def test_the_look_extrapolates_a_window_from_its_start(monkeypatch):
    """With --since/--until the look extrapolates what the window's rows grew, not what the reading before the
    window grew (connections' state, buffers): a growth of 100 MiB before the window and 10 MiB in its first half
    is about 120 MiB in all, not 220 (times PEAK_OVER_EXTRACTION)."""
    monkeypatch.setattr(memory, "WATCH_EVERY_S", 0.0)
    monkeypatch.setattr(memory, "WATCH_SHARE", float("inf"))  # a look at every step
    held = {"now": 0}
    monkeypatch.setattr(memory, "tree_memory", lambda pid=None: held["now"])
    share = {"now": None}
    bound = memory.MemoryBound(1, "--memory (test)", 1)
    bound.start = 0
    mib = 1 << 20
    bound.limit = memory.COST_FIXED + int(150 * mib * memory.PEAK_OVER_EXTRACTION)
    step = bound.watching(None, lambda: share["now"], spill_hint=True)
    held["now"], share["now"] = 100 * mib, 0.0
    step(10, 100, 1)
    held["now"], share["now"] = 110 * mib, 0.5
    step(60, 100, 2)  # 100 + 10 / 0.5 = 120 MiB: within 150 (extrapolated 220 would be refused)
    held["now"] = 200 * mib
    with pytest.raises(MemoryBoundError) as refused:
        step(70, 100, 3)  # what it holds now is over the bound: refused at any share
    # the bound is above the partitioned run's fixed part: that run named, and the bound that would keep the set in
    # memory said as the least one (the look's estimate, not the counts')
    assert isinstance(refused.value, PartitionedInstead) and refused.value.keep_text.startswith("at least --memory ")
    assert "a rough estimate from what the 50% of the window read so far hold" in str(refused.value)
