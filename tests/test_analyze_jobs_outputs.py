"""--jobs 2 writes the tables in a forked child from the moment they are whole and makes the report's query
profile in another (run.session.Run.finish): the files must be those --jobs 1 writes, one after the other, byte for
byte (report.html included: its profile made elsewhere, its QPS set from the time axis here)."""

from pathlib import Path

import pytest

from pcapdecomp.analysis import Options, analyze, capture_set

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
FILES = ("exchanges.parquet", "groups.parquet", "pool.parquet", "summary.json", "report.html")


def run(set_dir: Path, out: Path, jobs: int):
    return analyze(set_dir, Options(quiet=True, jobs=jobs, command_line="pcapdecomp analyze (test)"), out)


@pytest.mark.parametrize("name", ["group-stall", "maxthreads"])
def test_jobs_two_writes_what_jobs_one_writes(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # summary.json names the working folder: the same for both runs
    one = run(CAPTURES / name, tmp_path / "one", 1)
    two = run(CAPTURES / name, tmp_path / "two", 2)
    assert two.summary == one.summary
    assert len(one.exchanges) > 0 and one.summary["story"]["sentence"]
    for f in FILES:
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f
    assert "Query profile" in (tmp_path / "two" / "report.html").read_text(encoding="utf-8")


FIELD = Path(__file__).resolve().parent / "data" / "field"


@pytest.mark.parametrize("app, db, slow_log", [
    ([], FIELD / "one-exchange.pcap", None),  # one exchange, DB side only, no slow log, no thread-pool info
    ([FIELD / "one-exchange.pcap"], None, None),  # the same exchange seen by the app only
    ([FIELD / "one-connection-app.pcap"], FIELD / "one-connection-db.pcap", FIELD / "corners.log"),
    ([], FIELD / "no-exchange.pcap", None),  # nothing to decompose
], ids=["one exchange at the DB", "one exchange at the app", "one connection at both, a slow log", "no exchange"])
def test_jobs_two_writes_what_jobs_one_writes_in_degenerate_cases(app, db, slow_log, tmp_path, monkeypatch):
    """With --jobs 2 and one DB point, the query profile, summary.json → latency_s and the report's components are
    made in a child forked before the thread-pool view (run.session._beside_the_view): the same files as --jobs 1 on
    the smallest inputs too."""
    monkeypatch.chdir(tmp_path)
    written = []
    for jobs in (1, 2):
        result = analyze(capture_set(app=app, db=db, slow_log=slow_log, long_query_time=1.0 if slow_log else None),
                         Options(quiet=True, jobs=jobs, command_line="pcapdecomp analyze (test)"), tmp_path / str(jobs))
        written.append(result)
    one, two = written
    assert two.summary == one.summary
    assert (one.summary["slow_log"]["file"] is not None) == (slow_log is not None)
    for f in FILES:
        assert (tmp_path / "1" / f).read_bytes() == (tmp_path / "2" / f).read_bytes(), f


def test_default_jobs_run_a_small_set_in_one_process(monkeypatch):
    """Without --jobs, a capture set under extract.SMALL_CAPTURE_BYTES is analysed in this process (forking the
    workers and children costs more than it saves there); a given --jobs is kept, and a bigger set gets the cores."""
    from pcapdecomp.core.workers import default_jobs
    from pcapdecomp.read import extract
    from pcapdecomp.run.session import Run

    cs = capture_set(CAPTURES / "group-stall")
    size = sum(extract.capture_bytes(p) for p in cs.points)
    assert 0 < size < extract.SMALL_CAPTURE_BYTES
    assert Run(cs, Options(), None).jobs == 1
    assert Run(cs, Options(jobs=2), None).jobs == 2
    monkeypatch.setattr(extract, "SMALL_CAPTURE_BYTES", size)  # the same files, now as big as the bound
    assert Run(cs, Options(), None).jobs == default_jobs()


def test_a_run_partitioned_instead_is_lean_with_a_scheduler_too():
    """--jobs 1 runs lean (memory before time: freed blocks back to the OS at once); with a --scheduler only a
    partitioned run is (the client then holds the spill's counts alone). A run partitioned instead (no --spill given)
    learns it is partitioned after the start: it is lean from then on, as one given --spill is."""
    from pcapdecomp.run.session import Run

    cs = capture_set(CAPTURES / "group-stall")
    assert Run(cs, Options(jobs=1), None).lean
    assert not Run(cs, Options(jobs=2), None).lean
    assert Run(cs, Options(jobs=1, scheduler="local", spill=Path("/tmp")), None).lean
    run = Run(cs, Options(jobs=1, scheduler="local"), None)
    assert not run.lean
    run.spill_automatic = True  # as run.spilled.spill_instead sets it
    assert run.lean
