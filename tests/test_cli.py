"""The command line as a user runs it: real subprocesses, real captures, exit codes and messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pcapdecomp.core.schema import EXCHANGE_COLUMNS

REPO = Path(__file__).resolve().parents[1]
GROUP_STALL = REPO / "captures" / "group-stall"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pcapdecomp.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        env={**os.environ, "COLUMNS": "200"},
        timeout=300,
    )


def test_exchanges_writes_parquet_with_the_declared_columns(tmp_path):
    out = tmp_path / "ex.parquet"
    proc = run("exchanges", str(GROUP_STALL / "db.pcap"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    df = pd.read_parquet(out)
    assert list(df.columns) == [c.name for c in EXCHANGE_COLUMNS]
    for col in EXCHANGE_COLUMNS:
        assert str(df[col.name].dtype) == col.file_dtype, col.name
    # the summary names the commands and the connection count, and the table agrees with it
    assert "7 MySQL connections" in proc.stdout
    queries = int((df["command"] == "COM_QUERY").sum())
    row = next(line.split() for line in proc.stdout.splitlines() if line.split()[:1] == ["COM_QUERY"])
    assert row[1] == str(queries)


def test_exchanges_csv_and_server_filter(tmp_path):
    out = tmp_path / "ex.csv"
    proc = run("exchanges", str(GROUP_STALL / "app.pcap"), "--server", "10.213.77.2:3306", "--out", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # --quiet
    df = pd.read_csv(out)
    assert len(df) > 300 and set(df["server"]) == {"10.213.77.2:3306"}
    # a --server that matches nothing: no exchanges, a plain warning, exit 0
    proc = run("exchanges", str(GROUP_STALL / "app.pcap"), "--server", "10.213.77.2:9999", "-q")
    assert proc.returncode == 0
    assert "no MySQL traffic found" in proc.stderr


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


MISTAKES = [
    ("missing file", lambda t: t / "nope.pcap", "no such file"),
    ("directory", lambda t: t, "is a directory"),
    ("empty file", lambda t: _write(t / "empty.pcap", b""), "empty file"),
    ("text file", lambda t: _write(t / "notes.txt", b"hello, this is not a capture\n" * 20), "not a capture"),
    ("random bytes", lambda t: _write(t / "rand.pcap", bytes(range(256)) * 40), "not a capture"),
    ("slow log as capture", lambda t: _write(t / "slow.log", (GROUP_STALL / "slow.log").read_bytes()), "not a capture"),
    ("unknown link type", lambda t: _write(t / "usr.pcap", _with_linktype(147)), "unsupported link type 147"),
    ("gzip that is not", lambda t: _write(t / "x.pcap.gz", b"\x1f\x8b" + b"garbage" * 50), "gzip stream corrupt"),
]


def _with_linktype(linktype: int) -> bytes:
    data = bytearray((GROUP_STALL / "db.pcap").read_bytes())
    data[20:24] = linktype.to_bytes(4, "little")
    return bytes(data)


def test_a_capture_with_no_frames_is_empty_not_an_error(tmp_path):
    path = _write(tmp_path / "hdr.pcap", (GROUP_STALL / "db.pcap").read_bytes()[:24])
    out = tmp_path / "ex.parquet"
    proc = run("exchanges", str(path), "--out", str(out))
    assert proc.returncode == 0 and f"warning: {path}: no MySQL traffic found (0 frames read)" in proc.stderr
    assert len(pd.read_parquet(out)) == 0


@pytest.mark.parametrize("name,make,message", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_user_mistakes_give_one_line_and_exit_2(tmp_path, name, make, message):
    path = make(tmp_path)
    out = tmp_path / "out.parquet"
    proc = run("exchanges", str(path), "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(path.name) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


BAD_OPTIONS = [
    (["--server", "db:3306"], "--server host must be an IP address"),
    (["--server", "10.0.0.1"], "--server must be HOST:PORT"),
    (["--out", "x.json"], "--out must end in .parquet or .csv"),
    (["--out", "/no/such/dir/x.parquet"], "output folder does not exist"),
    (["--jobs", "0"], "--jobs"),
    (["--jobs", "many"], "--jobs"),
    (["--max-sql-bytes", "3"], "--max-sql-bytes"),
]


@pytest.mark.parametrize("args,message", BAD_OPTIONS, ids=[m[1] for m in BAD_OPTIONS])
def test_bad_options_exit_2_before_reading(args, message):
    proc = run("exchanges", str(GROUP_STALL / "db.pcap"), *args)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_every_command_has_help():
    for args in (["--help"], ["exchanges", "--help"], ["analyze", "--help"], ["evidence", "--help"], ["columns", "--help"], ["lab", "record", "--help"]):
        proc = run(*args)
        assert proc.returncode == 0, args
        assert "Usage" in proc.stdout and len(proc.stdout.splitlines()) > 3, args


def _modules_loaded_by(args: list[str], modules: tuple[str, ...]) -> subprocess.CompletedProcess:
    """Run the CLI with `args` in a child Python that then prints, on stderr, `LOADED [...]`: which of `modules` it
    had imported (listed by the child itself, not timed). The child exits 1 when the command failed."""
    return _cli_child(args, f"'LOADED', sorted(m for m in {modules!r} if m in sys.modules)")


def _cli_child(args: list[str], said_at_exit: str) -> subprocess.CompletedProcess:
    """Run the CLI with `args` in a child Python that prints the values of `said_at_exit` (Python, with sys and gc
    imported) on stderr as it ends (a command may end the process without returning, after the atexit handlers).
    The child exits 1 when the command failed."""
    probe = ("import atexit, gc, sys, runpy\n"
             f"sys.argv = ['pcapdecomp', *{args!r}]\n"
             f"atexit.register(lambda: print({said_at_exit}, file=sys.stderr))\n"
             "code = 0\n"
             "try:\n"
             "    runpy.run_module('pcapdecomp.cli', run_name='__main__')\n"
             "except SystemExit as exc:\n"
             "    code = exc.code or 0\n"
             "sys.exit(1 if code else 0)\n")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["exchanges", "--help"], ["analyze", "--help"],
                                  ["evidence", "--help"], ["columns"], ["lab", "record", "--help"]],
                         ids=" ".join)
def test_commands_that_read_nothing_import_neither_pandas_nor_pyarrow(args):
    """Start-up is part of every command's time: help, the version and the column list import no table library,
    nor pydantic (typer's conversion of values: cli._plain_values_without_pydantic) (the modules loaded are
    listed by the child itself, not timed)."""
    proc = _modules_loaded_by(args, ("pandas", "pyarrow", "numpy", "pydantic"))
    assert "LOADED []" in proc.stderr, proc.stderr[-500:]
    assert proc.stdout.strip(), "the command printed nothing"


_BLAS_THREADS_PROBE = """
import atexit, ctypes, os, runpy, sys
def blas_threads():
    # OpenBLAS as numpy loaded it (a wheel's copy has its symbols prefixed): how many threads it runs
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if "openblas" in os.path.basename(path):
            lib = ctypes.CDLL(path)
            for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads"):
                if hasattr(lib, name):
                    return getattr(lib, name)()
    return None
atexit.register(lambda: print("BLAS", os.environ.get("OPENBLAS_NUM_THREADS"), blas_threads(), file=sys.stderr))
sys.argv = ["pcapdecomp", *sys.argv[1:]]
try:
    runpy.run_module("pcapdecomp.cli", run_name="__main__")
except SystemExit as exc:
    sys.exit(exc.code)
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's mappings (Linux)")
@pytest.mark.parametrize("command", ["exchanges", "analyze"])
def test_commands_that_read_a_capture_run_one_blas_thread(command, tmp_path):
    """numpy's OpenBLAS spins a thread per core after its import, CPU the commands do not use
    (cli._one_blas_thread): one thread unless the user set OPENBLAS_NUM_THREADS (the library's own count, asked of
    the OpenBLAS the child loaded)."""
    db = REPO / "captures" / "oltp-prepared" / "db.pcap"
    args = (["exchanges", str(db), "-q", "--out", str(tmp_path / "x.parquet")] if command == "exchanges" else
            ["analyze", "--db", str(db), "-q", "-o", str(tmp_path / "out")])
    for given, expected in ((None, "1"), ("2", "2")):
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
        if given is not None:
            env["OPENBLAS_NUM_THREADS"] = given
        proc = subprocess.run([sys.executable, "-c", _BLAS_THREADS_PROBE, *args], capture_output=True, text=True,
                              cwd=REPO, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-500:]
        said = [line.split() for line in proc.stderr.splitlines() if line.startswith("BLAS ")]
        assert said and said[-1][1] == expected, proc.stderr[-500:]
        if given is None and said[-1][2] != "None":  # an OpenBLAS whose count can be asked (numpy's wheels)
            assert said[-1][2] == "1", proc.stderr[-500:]


def test_a_capture_at_one_point_imports_neither_the_repair_nor_the_clocks(tmp_path):
    """The loss repair and the clock fit need two points (pair.pairing imports them where it pairs two): a DB
    capture alone does not build their classes (the modules loaded are listed by the child itself)."""
    db = REPO / "captures" / "oltp-prepared" / "db.pcap"
    paired = ("pcapdecomp.pair.repair", "pcapdecomp.pair.clocks", "pcapdecomp.pair.clock")
    proc = _modules_loaded_by(["analyze", "--db", str(db), "-q", "-o", str(tmp_path / "out")],
                              ("pcapdecomp.pair.pairing", *paired))
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "LOADED ['pcapdecomp.pair.pairing']" in proc.stderr, proc.stderr[-500:]
    both = _modules_loaded_by(["analyze", str(REPO / "captures" / "oltp-prepared"), "-q", "-o", str(tmp_path / "both")],
                              paired)
    assert both.returncode == 0, both.stderr[-500:]
    assert f"LOADED {sorted(paired)}" in both.stderr, both.stderr[-500:]


def test_columns_command_prints_the_schema():
    proc = run("columns")
    assert proc.returncode == 0
    for col in EXCHANGE_COLUMNS:
        assert f"| `{col.name}` | {col.dtype} |" in proc.stdout


def test_python_m_pcapdecomp_is_the_command(tmp_path):
    """`python3 -m pcapdecomp` (what a user of a checkout types first) runs the command, exit codes and all: it
    was "No module named pcapdecomp.__main__", exit 1."""
    def module(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pcapdecomp", *args], capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, "COLUMNS": "200"}, timeout=300)

    done = module("exchanges", str(GROUP_STALL / "db.pcap"), "-q", "-o", str(tmp_path / "x.parquet"))
    assert done.returncode == 0, done.stderr
    assert len(pd.read_parquet(tmp_path / "x.parquet")) == len(pd.read_parquet(
        _exchanges_of(GROUP_STALL / "db.pcap", tmp_path / "y.parquet")))
    wrong = module("analyze", str(GROUP_STALL), "--memory", "8X", "-q", "-o", str(tmp_path / "out"))
    assert wrong.returncode == 2 and wrong.stderr.startswith("pcapdecomp: error: --memory '8X'"), wrong.stderr


def _exchanges_of(capture: Path, out: Path) -> Path:
    done = run("exchanges", str(capture), "-q", "-o", str(out))
    assert done.returncode == 0, done.stderr
    return out


def test_docs_column_table_is_the_schema():
    """The docs print the declared columns; regenerate with `pcapdecomp columns` when the schema changes."""
    page = (REPO / "docs" / "exchanges-command.md").read_text()
    from pcapdecomp.core.schema import markdown_table

    assert markdown_table(EXCHANGE_COLUMNS) in page


def test_docs_print_the_analysis_and_group_columns():
    from pcapdecomp.core.schema import ANALYSIS_COLUMNS, GROUP_COLUMNS, markdown_table

    doc = (REPO / "docs" / "analyze.md").read_text()
    assert markdown_table(ANALYSIS_COLUMNS) in doc and markdown_table(GROUP_COLUMNS) in doc
    for table in ("analysis", "groups", "connections"):
        assert run("columns", table).returncode == 0
    proc = run("columns", "nope")
    assert proc.returncode == 2 and "unknown table 'nope'" in proc.stderr


# --- analyze


def test_analyze_capture_set_prints_the_verdict_and_writes_the_outputs(tmp_path):
    import json

    out = tmp_path / "report"
    proc = run("analyze", str(GROUP_STALL), "--out", str(out), "--csv")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    # the terminal shows the same verdict as summary.json, and names every file it wrote
    assert " ".join(summary["verdict"].split()) in " ".join(proc.stdout.split())
    for name in ("exchanges.parquet", "exchanges.csv", "groups.parquet", "summary.json", "report.html"):
        assert (out / name).is_file() and f"wrote {out / name}" in proc.stdout, name
    df = pd.read_parquet(out / "exchanges.parquet")
    assert int(df["hidden_slow"].fillna(False).sum()) == summary["exchanges"]["hidden_slow"] == 3
    assert len(pd.read_csv(out / "exchanges.csv")) == len(df)


def test_analyze_explicit_files_and_quiet(tmp_path):
    out = tmp_path / "r"
    proc = run("analyze", "--db", str(GROUP_STALL / "db.pcap"), "--slow-log", str(GROUP_STALL / "slow.log"),
               "--long-query-time", "1", "--thread-pool-size", "2", "--slow-log-tz", "UTC", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
    df = pd.read_parquet(out / "exchanges.parquet")
    assert set(df["seen"]) == {"db"} and set(df["thread_group"].dropna()) == {0, 1}


ANALYZE_MISTAKES = [
    ("missing folder", lambda t: [str(t / "nope")], "no such folder"),
    ("file as folder", lambda t: [str(GROUP_STALL / "db.pcap")], "not a folder"),
    ("folder without captures", lambda t: [str(t)], "no capture to analyse"),
    ("missing --db", lambda t: ["--db", str(t / "db.pcap")], "no such file"),
    ("empty --app", lambda t: ["--app", str(_write(t / "app.pcap", b""))], "empty file"),
    ("text as --db", lambda t: ["--db", str(_write(t / "db.pcap", b"not a capture at all\n" * 10))], "not a capture"),
    ("slow log as --db", lambda t: ["--db", str(GROUP_STALL / "slow.log")], "not a capture"),
    ("capture as --slow-log", lambda t: ["--db", str(GROUP_STALL / "db.pcap"), "--slow-log", str(GROUP_STALL / "app.pcap")],
     "not a slow log (it is a pcap capture)"),
    ("missing --slow-log", lambda t: ["--db", str(GROUP_STALL / "db.pcap"), "--slow-log", str(t / "slow.log")], "no such file"),
    ("bad --slow-log-tz", lambda t: [str(GROUP_STALL), "--slow-log-tz", "Mars/Olympus"], "unknown time zone"),
    ("bad --thread-pool-size", lambda t: [str(GROUP_STALL), "--thread-pool-size", "0"], "--thread-pool-size must be"),
    ("bad --server", lambda t: [str(GROUP_STALL), "--server", "db"], "--server must be HOST:PORT"),
    ("bad capture.toml", lambda t: [str(_bad_toml(t))], "not valid TOML"),
    ("unknown link type", lambda t: ["--db", str(_write(t / "db.pcap", _with_linktype(147)))], "unsupported link type"),
    ("--out is a file", lambda t: [str(GROUP_STALL), "--out", str(_write(t / "out", b"x"))], "exists and is not a folder"),
]


def _bad_toml(folder: Path) -> Path:
    (folder / "db.pcap").write_bytes((GROUP_STALL / "db.pcap").read_bytes())
    (folder / "capture.toml").write_text("[server\nlong_query_time = ")
    return folder


@pytest.mark.parametrize("name,make,message", ANALYZE_MISTAKES, ids=[m[0] for m in ANALYZE_MISTAKES])
def test_analyze_user_mistakes_give_one_line_and_exit_2(tmp_path, name, make, message):
    out = tmp_path / "out"
    proc = run("analyze", *make(tmp_path), "--out", str(out))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() or out.is_file()  # no partial output (the "--out is a file" case: the file stays)


def test_exchanges_with_jobs_writes_the_same_table_as_one_process(tmp_path):
    """Through the CLI, in-process so that the small-capture threshold can be lowered and the workers really run."""
    from typer.testing import CliRunner

    from pcapdecomp.cli import app
    from pcapdecomp.read import extract as extraction

    capture = str(GROUP_STALL / "db.pcap")
    one, two = tmp_path / "one.parquet", tmp_path / "two.parquet"
    old = extraction.SMALL_CAPTURE_BYTES
    extraction.SMALL_CAPTURE_BYTES = 0
    try:
        runner = CliRunner()
        assert runner.invoke(app, ["exchanges", capture, "-q", "--jobs", "1", "--out", str(one)]).exit_code == 0
        assert runner.invoke(app, ["exchanges", capture, "-q", "--jobs", "3", "--out", str(two)]).exit_code == 0
    finally:
        extraction.SMALL_CAPTURE_BYTES = old
    a, b = pd.read_parquet(one), pd.read_parquet(two)
    assert len(a) == 352
    assert a.equals(b)


def test_quiet_exchanges_to_parquet_makes_no_dataframe(tmp_path):
    """The `exchanges` command writes its tables with Arrow alone: pandas is not imported (its import was 40 % of
    a small capture's whole run), nor pydantic or pyarrow.compute, and the files read back as the tables
    extraction makes."""
    out, conns = tmp_path / "x.parquet", tmp_path / "c.parquet"
    capture = REPO / "captures" / "group-stall" / "db.pcap"
    proc = _modules_loaded_by(["exchanges", str(capture), "-q", "--out", str(out), "--connections", str(conns)],
                              ("pandas", "pydantic", "pyarrow.compute"))
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "LOADED []" in proc.stderr, proc.stderr[-500:]
    from pcapdecomp.read.exchanges import extract

    x = extract(capture)
    as_written = x.exchanges.astype({c.name: c.file_dtype for c in EXCHANGE_COLUMNS})
    pd.testing.assert_frame_equal(pd.read_parquet(out), as_written, check_exact=True)
    assert pd.read_parquet(conns)["conn_index"].tolist() == x.connections["conn_index"].tolist()


@pytest.mark.parametrize("command", ["exchanges", "analyze"])
def test_the_commands_make_their_imports_with_the_collector_off_and_freeze_them(tmp_path, command):
    """What `exchanges` and `analyze` import (numpy, pyarrow, the stages) is made with the collector off and then
    frozen, out of the collector's passes, which then cost less (docs/speed.md); the collector runs again for the
    command's own objects."""
    capture = str(GROUP_STALL / "db.pcap")
    args = (["exchanges", capture, "-q", "--out", str(tmp_path / "x.parquet")] if command == "exchanges" else
            ["analyze", "--db", capture, "-q", "--jobs", "1", "-o", str(tmp_path / "out")])
    proc = _cli_child(args, "'COLLECTOR', gc.isenabled(), gc.get_freeze_count()")
    assert proc.returncode == 0, proc.stderr[-500:]
    said = next(line.split() for line in proc.stderr.splitlines() if line.startswith("COLLECTOR "))
    assert said[1] == "True"
    assert int(said[2]) > 50_000, said  # numpy's and pyarrow's imports alone make more objects than that


def test_main_ends_the_process_early_only_for_its_own_command(tmp_path, monkeypatch):
    """An in-process `exchanges` (it may end the process without tearing the interpreter down) must not make a
    later main() in the same process end it: that ended a whole pytest run with exit 0 at test_compare's first
    in-process command, after test_cli's in-process `exchanges`."""
    from typer.testing import CliRunner

    from pcapdecomp import cli

    capture = str(GROUP_STALL / "db.pcap")
    assert CliRunner().invoke(cli.app, ["exchanges", capture, "-q", "--out", str(tmp_path / "x.parquet")]).exit_code == 0
    monkeypatch.setattr(sys, "argv", ["pcapdecomp", "columns", "pool"])
    with pytest.raises(SystemExit) as ended:
        cli.main()  # returns here through sys.exit, not os._exit
    assert ended.value.code in (0, None)
