"""A run as a whole: its outputs are written as a set, a failure or Ctrl-C leaves the previous set as it was,
a second run on the same folder is refused, a bug is one line and exit 70 with the traceback in a file, and
mistakes in capture.toml or the options are one line and exit 2. Real subprocesses where the exit code, the
message or a signal is what is tested."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from analysing import analyse

from pcapdecomp.core.errors import InternalError, OutputError
from pcapdecomp.core.outputs import INCOMPLETE_NAME, MANIFEST_NAME, STAGING_PREFIX, neutralise_formulas, write_table

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
GROUP_STALL = CAPTURES / "group-stall"
HOGS = CAPTURES / "oltp-hogs"  # the largest bundled set: a run takes seconds, long enough to interrupt


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcapdecomp.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)


def run(out: Path, set_dir: Path = GROUP_STALL, **kw):
    return analyse(set_dir, out, **{"jobs": 1, **kw})


def fingerprint(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


# --- a bug in a stage ------------------------------------------------------------------------------------------

INJECT = """
import importlib, sys
def broken(*args, **kwargs):
    raise ZeroDivisionError("injected into the {stage} stage")
setattr(importlib.import_module({module!r}), {name!r}, broken)
from pcapdecomp.cli import main
sys.argv = ["pcapdecomp", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("stage,module,name,where", [
    ("report", "pcapdecomp.run.session", "render_page", "run.session.finish"),
    ("matching", "pcapdecomp.pair.pairing", "Pairing", "pair.pairing.pair_points")])
def test_a_bug_is_one_line_exit_70_and_the_traceback_in_the_output_folder(tmp_path, stage, module, name, where):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", INJECT.format(stage=stage, module=module, name=name), "analyze",
                           str(GROUP_STALL),
                           "--out", str(out), "-q"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 70, proc.stderr
    line = one_line(proc.stderr)
    m = re.fullmatch(r"pcapdecomp: internal error: ZeroDivisionError: injected into the (\w+) stage, in "
                     r"([\w.]+) \(details: (.+)\)", line)
    assert m and m[1] == stage and m[2] == where, line
    details = Path(m[3])
    assert details == out / "internal-error.txt"
    text = details.read_text()
    assert "Traceback" in text and "ZeroDivisionError: injected" in text and "analyze" in text
    # no set of outputs that looks complete: the folder holds the details only
    assert sorted(p.name for p in out.iterdir()) == ["internal-error.txt"]


def test_a_bug_outside_any_output_folder_goes_to_a_temporary_file(tmp_path):
    code = ("import sys, pcapdecomp.read.exchanges as e\n"
            "def broken(*a, **k): raise KeyError('injected')\n"
            "import pcapdecomp.read.extract as p; p.extract = broken\n"
            "from pcapdecomp.cli import main\nsys.argv = ['pcapdecomp', *sys.argv[1:]]\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", code, "exchanges", str(GROUP_STALL / "db.pcap"), "-q"],
                          capture_output=True, text=True, cwd=REPO, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 70
    line = one_line(proc.stderr)
    assert line.startswith("pcapdecomp: internal error: KeyError: 'injected'")
    details = Path(re.search(r"\(details: (.+)\)$", line)[1])
    assert details.parent == tmp_path and "KeyError: 'injected'" in details.read_text()


def test_a_failed_run_leaves_the_previous_outputs_as_they_were(tmp_path, monkeypatch):
    out = tmp_path / "out"
    run(out, csv=True)
    before = fingerprint(out)
    import pcapdecomp.run.session as session

    def broken(*args, **kwargs):
        raise RuntimeError("report failed")

    monkeypatch.setattr(session, "render_page", broken)
    with pytest.raises(InternalError, match="RuntimeError: report failed"):
        run(out, set_dir=CAPTURES / "maxthreads")  # another set, without --csv
    after = fingerprint(out)
    assert after.pop("internal-error.txt").startswith("") and after == before
    assert not any(p.name.startswith(STAGING_PREFIX) for p in out.iterdir())


def test_a_new_run_replaces_the_whole_previous_set_and_leaves_other_files_alone(tmp_path):
    out = tmp_path / "out"
    run(out, csv=True)
    assert cli("evidence", str(out), "-q").returncode == 0  # an older run's evidence, listed in the manifest
    (out / "internal-error.txt").write_text("an older failure")  # not one of ours: its first line is not
    (out / "my-notes.txt").write_text("mine")
    (out / "db.pcap").write_bytes(b"a capture")  # and a manifest that claims it: no run deletes a capture
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    (out / MANIFEST_NAME).write_text(json.dumps({"files": manifest["files"] + ["db.pcap", "../x", ".hidden"]}))
    run(out, set_dir=CAPTURES / "maxthreads")
    names = sorted(p.name for p in out.iterdir())
    assert names == [MANIFEST_NAME, "db.pcap", "exchanges.parquet", "groups.parquet", "internal-error.txt",
                     "my-notes.txt", "pool.parquet", "report.html", "summary.json"]
    assert json.loads((out / "summary.json").read_text())["set"] == "maxthreads"
    assert len(pd.read_parquet(out / "exchanges.parquet")) == 40
    assert json.loads((out / MANIFEST_NAME).read_text())["files"] == [
        "exchanges.parquet", "groups.parquet", "pool.parquet", "report.html", "summary.json"]


def test_a_run_stopped_while_moving_its_files_in_is_marked_and_evidence_refuses_it(tmp_path, monkeypatch):
    out = tmp_path / "out"
    run(out)
    real_replace = os.replace
    moved = []

    def failing_replace(src, dst):
        if Path(dst).parent == out and Path(src).parent.name.startswith(STAGING_PREFIX):
            if moved:
                raise OSError(28, "No space left on device")
            moved.append(dst)
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OutputError, match="No space left on device"):
        run(out, set_dir=CAPTURES / "maxthreads")
    monkeypatch.setattr(os, "replace", real_replace)
    assert (out / INCOMPLETE_NAME).is_file()
    proc = cli("evidence", str(out))
    assert proc.returncode == 2 and "an analyze run stopped while writing here" in one_line(proc.stderr)
    run(out)  # the next run repairs the folder
    assert not (out / INCOMPLETE_NAME).exists() and cli("evidence", str(out), "-q").returncode == 0


# --- Ctrl-C and a second run ---------------------------------------------------------------------------------

def _as_a_shell_starts_it() -> None:
    """In the child before exec: Ctrl-C at its default, as an interactive shell starts a command. A test run started
    in the background by a non-interactive shell (`pytest &`) has SIGINT ignored, and an ignored SIGINT is inherited
    across exec: the analysis then never hears the Ctrl-C these tests send."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _start(out: Path) -> subprocess.Popen:
    """analyze of oltp-hogs in its own process group (as a shell runs it), returned once it is writing."""
    proc = subprocess.Popen([sys.executable, "-m", "pcapdecomp.cli", "analyze", str(HOGS), "--out", str(out), "-q"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_as_a_shell_starts_it)
    deadline = time.monotonic() + 60
    while not (out.exists() and any(p.name.startswith(STAGING_PREFIX) for p in out.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    return proc


@pytest.mark.parametrize("delay", [0.0, 0.05])
def test_ctrl_c_exits_130_with_one_line_and_leaves_no_outputs(tmp_path, delay):
    out = tmp_path / "new"
    proc = _start(out)
    # inside the extraction (the whole run takes ≈ 0.8 s after this point); at 0 while the workers are being forked,
    # where a worker that took the signal itself used to break the pool (exit 70 and its traceback on stderr)
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: the whole foreground group, workers included
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert one_line(stderr) == "pcapdecomp: interrupted"
    assert not out.exists()  # this run made the folder, and nothing of it stays


def test_ctrl_c_keeps_the_previous_outputs(tmp_path):
    out = tmp_path / "old"
    run(out)
    before = fingerprint(out)
    proc = _start(out)
    time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and one_line(stderr) == "pcapdecomp: interrupted"
    assert fingerprint(out) == before


def test_a_second_run_on_the_same_folder_is_refused_while_the_first_finishes(tmp_path):
    out = tmp_path / "out"
    first = _start(out)
    # the first run, stopped while it writes, holds the folder for as long as the second takes to start: without
    # the stop, a first run faster than the second's start-up would be done before it is asked
    os.killpg(first.pid, signal.SIGSTOP)
    try:
        second = cli("analyze", str(GROUP_STALL), "--out", str(out), "-q")
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    assert second.returncode == 2
    assert one_line(second.stderr) == (f"pcapdecomp: error: {out}: another pcapdecomp run is writing this folder; "
                                       "wait for it to finish or choose another --out")
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["set"] == "oltp-hogs" and len(pd.read_parquet(out / "exchanges.parquet")) == summary["exchanges"]["total"]
    assert cli("analyze", str(GROUP_STALL), "--out", str(out), "-q").returncode == 0  # free again


# --- mistakes in capture.toml, the options and the output folder -----------------------------------------------

def _set(tmp: Path, toml: str, *, files=("db.pcap",)) -> Path:
    folder = tmp / "set"
    folder.mkdir()
    for name in files:
        shutil.copy(GROUP_STALL / name, folder / name)
    (folder / "capture.toml").write_text(toml)
    return folder


def _fifo(tmp: Path, toml: str, name: str) -> Path:
    folder = _set(tmp, toml, files=())
    os.mkfifo(folder / name)
    return folder


TOML_MISTAKES = [
    ("nan", lambda t: [str(_set(t, "[server]\nlong_query_time = nan\n"))], "long_query_time must be a finite number"),
    ("inf", lambda t: [str(_set(t, "[server]\nlong_query_time = inf\n"))], "long_query_time must be a finite number"),
    ("negative", lambda t: [str(_set(t, "[server]\nlong_query_time = -1.5\n"))], "long_query_time must be a finite"),
    ("text", lambda t: [str(_set(t, "[server]\nlong_query_time = \"1\"\n"))], "long_query_time must be a number"),
    ("boolean", lambda t: [str(_set(t, "[server]\nthread_pool_size = true\n"))], "thread_pool_size must be a number"),
    ("fraction", lambda t: [str(_set(t, "[server]\nthread_pool_size = 2.5\n"))], "thread_pool_size must be a whole"),
    ("address", lambda t: [str(_set(t, "[server]\naddress = \"db:3306\"\n"))], "address must be \"IP:PORT\""),
    ("not a table", lambda t: [str(_set(t, "server = 5\n"))], "server must be a table ([server]), got 5"),
    # a top-level value is no table: its message names no [memory] section that does not exist
    ("memory a number", lambda t: [str(_set(t, "memory = 800\n"))], "capture.toml: memory must be text, got 800"),
    ("absolute", lambda t: [str(_set(t, "[captures]\ndb = \"/etc/passwd\"\n"))], "outside the capture-set folder"),
    ("dot-dot", lambda t: [str(_set(t, "[captures]\ndb = \"../db.pcap\"\n"))], "outside the capture-set folder"),
    ("app list of numbers", lambda t: [str(_set(t, "[captures]\napp = [1, 2]\n"))], "must be a file name or a list"),
    ("fifo named", lambda t: [str(_fifo(t, "[captures]\ndb = \"db.pcap\"\n", "db.pcap"))], "not a regular file"),
    ("fifo found", lambda t: [str(_fifo(t, "", "db.pcap"))], "not a regular file"),
    ("fifo slow log", lambda t: [str(_fifo_slow(t))], "not a regular file"),
    ("symlink out", lambda t: [str(_symlink_out(t))], "outside the capture-set folder"),
    ("--long-query-time nan", lambda t: [str(GROUP_STALL), "--long-query-time", "nan"], "--long-query-time must be"),
    ("--long-query-time inf", lambda t: [str(GROUP_STALL), "--long-query-time", "inf"], "--long-query-time must be"),
    ("--db is a device", lambda t: ["--db", "/dev/zero"], "not a regular file"),
    ("--out below a file", lambda t: [str(GROUP_STALL), "--out", str(_file(t) / "sub")], "cannot write the output"),
]


def _fifo_slow(tmp: Path) -> Path:
    folder = _set(tmp, "")
    os.mkfifo(folder / "slow.log")
    return folder


def _symlink_out(tmp: Path) -> Path:
    folder = _set(tmp, "", files=())
    shutil.copy(GROUP_STALL / "db.pcap", tmp / "elsewhere.pcap")
    (folder / "db.pcap").symlink_to(tmp / "elsewhere.pcap")
    return folder


def _file(tmp: Path) -> Path:
    path = tmp / "a-file"
    path.write_text("x")
    return path


def main_in_process(args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """cli.main as `pcapdecomp ARGS` runs it, in this process: (exit code, stderr)."""
    import pcapdecomp.core.memory
    from pcapdecomp.cli import main

    monkeypatch.setattr(pcapdecomp.core.memory, "use_returning_allocator", lambda: None)  # leave pytest's allocator
    monkeypatch.setattr(sys, "argv", ["pcapdecomp", *args])
    with pytest.raises(SystemExit) as exit:
        main()
    return exit.value.code, capsys.readouterr().err


@pytest.mark.parametrize("name,make,message", TOML_MISTAKES, ids=[m[0] for m in TOML_MISTAKES])
def test_mistakes_in_capture_toml_options_and_output_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, name,
                                                                               make, message):
    out = tmp_path / "out"
    args = make(tmp_path)
    if "--out" not in args:
        args += ["--out", str(out)]
    if "fifo" in name:  # a FIFO that were opened would block: in a subprocess, whose timeout fails the test
        proc = cli("analyze", *args, "-q", timeout=60)
        code, stderr = proc.returncode, proc.stderr
    else:
        code, stderr = main_in_process(["analyze", *args, "-q"], monkeypatch, capsys)
    assert code == 2, stderr
    assert message in one_line(stderr) and one_line(stderr).startswith("pcapdecomp: error: ")
    assert not out.exists()


def test_a_file_capture_toml_names_that_is_missing_is_a_warning_not_silence(tmp_path):
    folder = _set(tmp_path, "[captures]\ndb = \"db.pcap\"\napp = \"app-host-2.pcap\"\nslow_log = \"slow.log\"\n")
    r = run(tmp_path / "out", set_dir=folder)
    missing = [w for w in r.warnings if "which is not in" in w]
    assert len(missing) == 2 and any("'app-host-2.pcap'" in w for w in missing) and any("'slow.log'" in w for w in missing)
    assert set(r.exchanges["seen"]) == {"db"} and r.summary["warnings"] == r.warnings


def test_capture_toml_may_name_several_app_captures(tmp_path):
    folder = _set(tmp_path, "[captures]\ndb = \"db.pcap\"\napp = [\"app.pcap\"]\n", files=("db.pcap", "app.pcap"))
    r = run(tmp_path / "out", set_dir=folder)
    assert r.summary["match"]["matched"] == 352


# --- CSV cells a spreadsheet would run ----------------------------------------------------------------------

PAYLOADS = ["=HYPERLINK(\"http://x\",\"y\")", "+1+1", "-2+3", "@SUM(A1)", "\tTAB", "\rCR"]


def test_formula_cells_are_neutralised_in_every_csv(tmp_path):
    """exchanges.csv (of `exchanges --out`, `analyze --csv` and `evidence`) goes through write_table: a real table
    with statement texts and users a client could have sent."""
    r = run(tmp_path / "a")
    x = r.exchanges.head(len(PAYLOADS) + 4).copy()
    sql = x["sql"].astype(object)
    sql.iloc[: len(PAYLOADS)] = PAYLOADS
    x["sql"] = sql.astype("category")  # as the table holds it
    x["user"] = x["user"].astype(object)
    x.loc[x.index[0], "user"] = "=cmd|' /C calc'!A0"
    write_table(x, tmp_path / "x.csv")
    with (tmp_path / "x.csv").open(newline="", encoding="utf-8") as fh:  # the csv module keeps a quoted CR
        rows = list(csv.reader(fh))
    back = pd.DataFrame(rows[1:], columns=rows[0])
    assert list(back["sql"][: len(PAYLOADS)]) == ["'" + p for p in PAYLOADS]
    assert back["user"].iloc[0] == "'=cmd|' /C calc'!A0"
    assert list(back["sql"][len(PAYLOADS):]) == [  # the other cells untouched
        "" if pd.isna(v) else v for v in x["sql"][len(PAYLOADS):]]
    assert list(back["rows"]) == [str(v) for v in x["rows"]]  # numbers stay numbers
    # nothing to neutralise: the same frame comes back, no copy
    clean = r.exchanges[["conn_index", "command"]]
    assert neutralise_formulas(clean) is clean
