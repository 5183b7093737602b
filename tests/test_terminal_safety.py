"""Captures do not write to the analyst's terminal: every command's output, on inputs holding terminal control
sequences (OSC 52 clipboard, OSC 0 title, OSC 8 link, C1 CSI/OSC, bidi overrides) and rich markup in SQL, file
names, folder names and capture.toml values, holds no character a terminal acts on, and markup is shown as
typed. Crafted captures (tests/craft.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from craft import T0, stall

from pcapdecomp.core.console import terminal_text

ESC = "\x1b"
MARKUP = "[/quote][link=http://evil.example]shown[/link][bold]"
ATTACK = (f"{MARKUP}{ESC}]52;c;cm0gLXJmIH4K{ESC}\\{ESC}]0;pwned\x07{ESC}]8;;http://evil.example/\x07here{ESC}]8;;\x07"
          "\x9b31m\x9d0;t\x07\u202e")
NAME_PART = ATTACK.replace("/", "|")  # a file name holds anything but '/' and NUL
# what a terminal acts on: C0 but tab and line feed, DEL, C1, bidi controls
ACTS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcapdecomp.cli", *args], capture_output=True, text=True,
                          errors="surrogateescape", timeout=300)


def inert(proc: subprocess.CompletedProcess) -> str:
    both = proc.stdout + proc.stderr
    found = ACTS.search(both)
    assert found is None, f"{found.group()!r} reached the terminal: {both[max(found.start() - 60, 0):found.end() + 60]!r}"
    return both


def capture_set(root: Path, version: str) -> Path:
    folder = root / f"set {NAME_PART} {version}"
    folder.mkdir()
    stall(folder / f"db {NAME_PART}.pcap", f"SELECT SLEEP(3.7), '{ATTACK}'".encode(), [9, 10])
    when = time.strftime("%y%m%d %H:%M:%S", time.gmtime(T0 // 10**9))
    (folder / "slow.log").write_text(f"# Time: {when}\n# User@Host: app[app] @  [10.0.0.8]\n# Thread_id: 8  Schema: \n"
                                     f"# Query_time: 3.699000  Lock_time: 0.000000  Rows_sent: 1  Rows_examined: 0\n"
                                     f"#{ATTACK}\nSET timestamp={T0 // 10**9};\nSELECT SLEEP(3.7), '{ATTACK}';\n")
    def toml(text: str) -> str:
        return "".join(f"\\u{ord(c):04x}" if c in '\\"' or ACTS.match(c) else c for c in text)

    (folder / "capture.toml").write_text(
        f'scenario = "{toml(ATTACK)}"\n[server]\naddress = "10.0.0.2:3306"\nversion = "{toml(ATTACK)} {version}"\n'
        f'long_query_time = 1.0\nthread_pool_size = 1\n[captures]\ndb = "{toml("db " + NAME_PART + ".pcap")}"\nslow_log = "slow.log"\n',
        encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    root = tmp_path_factory.mktemp("terminal")
    sets = [capture_set(root, v) for v in ("1", "2")]
    outs = [root / f"out {NAME_PART} {i}" for i in (1, 2)]
    procs = [run("analyze", str(s), "--out", str(o)) for s, o in zip(sets, outs)]
    return root, sets, outs, procs


def test_terminal_text_shows_what_a_terminal_acts_on():
    shown = terminal_text(ATTACK + "\n" + "\udc9b")
    assert ACTS.search(shown) is None and "\n" not in shown
    assert "\\x1b]52;c;" in shown and "\\x9b31m" in shown and "\\u202e" in shown and "\\udc9b" in shown
    assert terminal_text("a\nb", lines=True) == "a\nb"


def test_analyze_writes_nothing_a_terminal_acts_on(analysed):
    _, _, outs, procs = analysed
    for proc in procs:
        assert proc.returncode == 0, proc.stderr
        both = inert(proc)
        assert MARKUP in both  # markup shown as typed, not applied
        assert "SLEEP(3.7)" in proc.stdout  # the culprit's statement is quoted in the verdict
        assert "wrote " in proc.stdout and "\\x1b" in proc.stdout  # the folder's name, made inert


def test_exchanges_evidence_and_compare_write_nothing_a_terminal_acts_on(analysed):
    root, sets, outs, _ = analysed
    db = next(sets[0].glob("db *.pcap"))
    proc = run("exchanges", str(db), "--out", str(root / f"ex {NAME_PART}.parquet"))
    assert proc.returncode == 0, proc.stderr
    inert(proc)
    proc = run("evidence", str(outs[0]), "--out", str(root / f"evidence {NAME_PART}"))
    assert proc.returncode == 0, proc.stderr
    inert(proc)
    proc = run("compare", str(outs[0]), str(outs[1]), "--out", str(root / f"cmp {NAME_PART}"))
    assert proc.returncode == 0, proc.stderr
    both = inert(proc)
    assert "settings differ" in both  # the capture.toml values are quoted, made inert


def test_errors_and_usage_errors_write_nothing_a_terminal_acts_on(tmp_path):
    missing = tmp_path / f"missing {NAME_PART}.pcap"
    proc = run("exchanges", str(missing))
    assert proc.returncode == 2
    inert(proc)
    proc = run("analyze", "--db", str(missing), f"--bogus{NAME_PART}")
    assert proc.returncode == 2
    inert(proc)
    not_a_log = tmp_path / f"slow {NAME_PART}.log"
    not_a_log.write_bytes(b"\x00\x01" + ATTACK.encode())
    proc = run("analyze", "--db", str(stall(tmp_path / "db.pcap", b"SELECT 1", [9])), "--slow-log", str(not_a_log),
               "--out", str(tmp_path / "o"))
    inert(proc)
