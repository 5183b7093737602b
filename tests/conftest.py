"""What the test files share within one run: each bundled capture set analysed once, each capture read once, the
markers by cost, and the hypothesis settings.

Markers (declared in pyproject.toml), given here by file so that a new test in a file gets its file's:
- `lab`: records live traffic in the lab (root, `ip netns`); `pytest -m "not lab"` leaves these out;
- `corpus`: reads the public corpus (../shared/corpus); `pytest -m "not corpus"` runs without it;
- `quick`: no sweep over capture files, no `analyze` in a subprocess, no lab: `pytest -m quick` is the edit loop.
A file not named in QUICK_FILES is not quick; a file that reads the corpus or records in the lab is never quick.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"

# A loaded CI machine makes an example slow, not wrong: no per-example deadline, no "too slow" health check. The
# example counts are each test's own (@settings); a test without them gets hypothesis's 100.
settings.register_profile("pcapdecomp", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "pcapdecomp"))

# Every test of these files records in the lab; others mark the single tests that do (@pytest.mark.lab).
LAB_FILES = {"test_sources.py", "test_cluster.py", "test_report_acceptance.py"}
# Files with tests that read ../shared/corpus (tests/corpus.py).
CORPUS_FILES = {"test_capture.py", "test_corners.py", "test_corpus.py", "test_docs.py", "test_fastlane.py",
                "test_field.py", "test_field_corpus_app.py", "test_field_corpus_both.py",
                "test_field_corpus_db.py", "test_fingerprint.py", "test_flows.py", "test_parallel.py", "test_points.py",
                "test_stories.py", "test_tls.py"}
# Files whose tests call one stage on real data, or read a few shared analyses of bundled sets, and read no corpus.
QUICK_FILES = {"test_clock.py", "test_connids.py", "test_decompose.py", "test_digest.py", "test_fingerprint_scans.py",
               "test_group_stats.py", "test_layout.py", "test_mysql_core.py", "test_proxy_scale.py", "test_schema.py",
               "test_slowjoin.py", "test_slowlog.py", "test_slowlog_damage.py", "test_sqltext.py", "test_tables.py",
               "test_tcp.py", "test_threadpool_steps.py"}
# Tests of a quick file that run `pcapdecomp analyze` in a subprocess.
NOT_QUICK = {"test_connids.py::test_a_missing_snapshot_is_one_line_and_exit_2"}


def pytest_configure(config):
    """The package's bytecode, compiled once before the workers start: where PYTHONDONTWRITEBYTECODE is set (as on
    the development machine) every `python3 -m pcapdecomp.cli` the tests start compiled the package from source
    again, a quarter of a second of CPU each. Python reads bytecode that exists whatever that variable says."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        import compileall

        compileall.compile_dir(REPO / "pcapdecomp", quiet=2)


@pytest.hookimpl(wrapper=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): a worker per core, as pytest-xdist counts them, and one more. Much of the
    suite waits rather than computes (the lab's server and tcpdump, the browser, a Dask cluster starting, the
    subprocesses of the command-line tests), and a worker that waits leaves its core idle: a third worker on two
    cores keeps them busy (docs/development.md). PYTEST_XDIST_AUTO_NUM_WORKERS, where set, is taken as it is."""
    workers = yield
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return workers
    return workers + 1


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """The test modules with their assertions rewritten by pytest, cached in tests/__pycache__ while they are
    collected, PYTHONDONTWRITEBYTECODE or not: pytest reads a cached rewrite whatever that variable says, but writes
    none where it is set, so every worker of every run parsed and rewrote all the test modules again, most of what
    a collection costs. Only the collection writes bytecode; the tests run as the environment says."""
    import sys

    was = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = was


def pytest_collection_finish(session):
    """The test modules and what they imported (pandas, pyarrow, the package) are kept for the run: out of the
    collector's view (kept_for_the_run), as `pcapdecomp analyze` does with its imports."""
    kept_for_the_run()


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        if name in LAB_FILES:
            item.add_marker(pytest.mark.lab)
        if name in CORPUS_FILES:
            item.add_marker(pytest.mark.corpus)
        if (name in QUICK_FILES and name not in CORPUS_FILES and item.get_closest_marker("lab") is None
                and f"{name}::{item.originalname}" not in NOT_QUICK):
            item.add_marker(pytest.mark.quick)
    items[:] = in_the_order_files_start(items)


def in_the_order_files_start(items: list) -> list:
    """The files with lab tests first, then the others with the most tests first (pytest-xdist's own order, which
    pyproject's --no-loadscope-reorder turns off so that this one holds); each file's tests as collected. A lab test
    mostly waits on its server, so a worker that starts on it leaves its core to the others; at the end of the
    run, where xdist's order put these few-test files, they kept the run waiting on them."""
    tests_in: dict = {}
    has_lab: set = set()
    for item in items:
        tests_in[item.path] = tests_in.get(item.path, 0) + 1
        if item.get_closest_marker("lab") is not None:
            has_lab.add(item.path)
    first = {path: i for i, path in enumerate(tests_in)}
    return sorted(items, key=lambda item: (item.path not in has_lab, -tests_in[item.path], first[item.path]))


def _listing(folder: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*"))


def kept_for_the_run() -> None:
    """What the run keeps (the shared analyses and extractions: millions of objects by the end) taken out of the
    garbage collector's view: each full collection walked all of it again, in every analysis a test ran after it
    and in every gc.collect() of the measuring tests (tests/test_growth.py's took 24 s instead of 3). The garbage
    of the moment is collected first, so that none is kept."""
    gc.collect()
    gc.freeze()


def _shared_by_the_run(tmp_path_factory) -> Path:
    """A folder that every process of this run sees: the run's base temporary folder (pytest-xdist gives each worker
    a folder inside it), or this process's own without workers."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def bundled_analysis(tmp_path_factory):
    """`analyze` of a bundled capture set (captures/NAME, with its capture.toml's options, nothing else given),
    once per run: `bundled_analysis(NAME)` is an AnalysisResult whose tables and summary are the caller's own
    copies; its `out_dir` (report.html, the tables, summary.json) is shared and only read: a test that writes
    there, or needs other options, runs its own `analyze`. The first worker to ask for a set makes it, under a lock,
    and leaves the result pickled beside its folder; the other workers read that (the same tables: a pickle keeps
    every dtype). At the end of the run every shared folder must be as `analyze` left it."""
    import fcntl
    import pickle

    from pcapdecomp.analysis import Options, analyze

    root = _shared_by_the_run(tmp_path_factory) / "bundled"
    root.mkdir(exist_ok=True)
    done: dict[str, object] = {}
    listings: dict[str, list] = {}

    def get(name: str):
        if name not in done:
            out, kept = root / name, root / f"{name}.pickle"
            with open(root / f"{name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                if not kept.exists():
                    result = analyze(CAPTURES / name, Options(quiet=True), out)
                    staged = root / f"{name}.pickle.{os.getpid()}"
                    staged.write_bytes(pickle.dumps((result, _listing(out)), protocol=pickle.HIGHEST_PROTOCOL))
                    staged.replace(kept)
                done[name], listings[name] = pickle.loads(kept.read_bytes())
            kept_for_the_run()
        r = done[name]
        return dataclasses.replace(r, held_exchanges=r.exchanges.copy(), groups=r.groups.copy(),
                                   summary=copy.deepcopy(r.summary), written=list(r.written),
                                   warnings=list(r.warnings))

    yield get
    for name, listing in listings.items():
        assert _listing(root / name) == listing, f"a test wrote into the shared analysis of {name}"


@pytest.fixture(scope="session")
def read_capture():
    """`extract` of one capture file with the default options and the native lane where it is built, once per run
(the corpus and the bundled captures are swept by several files): `read_capture(path)` is the extraction, shared;
callers only read it."""
    from lanes import extract_with

    done: dict[str, object] = {}

    def get(path) -> object:
        key = str(Path(path).resolve())
        if key not in done:
            done[key] = extract_with(Path(path), True)
            kept_for_the_run()
        return done[key]

    return get


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 16 KiB tmpfs: room for no capture's spill (skipped where `mount` is not allowed)."""
    import subprocess

    where = tmp_path / "small"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "none", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("mount -t tmpfs is not allowed here")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)
