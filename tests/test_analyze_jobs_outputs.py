"""--jobs 2 writes the tables in a forked child from the moment they are whole and makes the report's query
profile in another (analysis._analyze): the files must be those --jobs 1 writes, one after the other, byte for
byte (report.html included: its profile made elsewhere, its QPS set from the time axis here)."""

from pathlib import Path

import pytest

from pcapdecomp.analysis import analyze

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
FILES = ("exchanges.parquet", "groups.parquet", "pool.parquet", "summary.json", "report.html")


def run(set_dir: Path, out: Path, jobs: int):
    return analyze(set_dir, app=[], db=None, slow_log=None, long_query_time=None, thread_pool_size=None, servers=[],
                   out_dir=out, quiet=True, jobs=jobs, command_line="pcapdecomp analyze (test)")


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
