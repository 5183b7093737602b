"""One rule for output folders (outputs.OutputFolder): a run replaces or removes only what a manifest of ours
lists; a file or folder no run of ours wrote is left alone, and a run whose outputs would replace one refuses with
one line (exit 2) and touches nothing. For analyze --out, evidence --out and compare --out, on folders full of a
user's files (real bundled captures). An analysis a test only starts from is a copy of the run's shared one
(tests/conftest.py: `analyze` of the bundled set, as the command makes it); the runs a test is about are the
command's own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GROUP_STALL = REPO / "captures" / "group-stall"
MAXTHREADS = REPO / "captures" / "maxthreads"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcapdecomp.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def users_folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def analysed(bundled_analysis, folder: Path, to: Path) -> Path:
    """A copy of the shared analysis of the bundled set `folder` (what `pcapdecomp analyze FOLDER --out TO` writes)."""
    shutil.copytree(bundled_analysis(folder.name).out_dir, to)
    return to


def refused(proc: subprocess.CompletedProcess, name: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "which no pcapdecomp run wrote there" in lines[0] and name in lines[0]


def test_analyze_writes_beside_a_users_files_and_leaves_them_alone(tmp_path):
    out = users_folder(tmp_path / "notes", {"notes.txt": b"mine", "exchanges.csv": b"my,csv\n",
                                            "evidence/db.pcapng": b"customer capture", "exchanges/part.parquet": b"x"})
    before = snapshot(out)
    proc = cli("analyze", str(GROUP_STALL), "--out", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    after = snapshot(out)
    assert {k: after[k] for k in before} == before and (out / "summary.json").is_file()
    proc = cli("analyze", str(GROUP_STALL), "--out", str(out), "-q", "--csv")  # exchanges.csv is theirs
    refused(proc, "exchanges.csv")
    assert {k: snapshot(out)[k] for k in before} == before


def test_analyze_refuses_a_folder_whose_files_it_would_replace(tmp_path):
    out = users_folder(tmp_path / "mine", {"summary.json": b"{\"mine\": 1}", "report.html": b"<p>mine</p>"})
    before = snapshot(out)
    refused(cli("analyze", str(GROUP_STALL), "--out", str(out), "-q"), "report.html")
    assert snapshot(out) == before


def test_evidence_never_replaces_a_customers_captures(tmp_path, bundled_analysis):
    analysis = analysed(bundled_analysis, GROUP_STALL, tmp_path / "analysis")
    theirs = users_folder(tmp_path / "captures", {"db.pcapng": b"customer db capture", "app.pcapng": b"customer app",
                                                  "other.pcapng": b"another"})
    before = snapshot(theirs)
    refused(cli("evidence", str(analysis), "--out", str(theirs), "-q"), "db.pcapng")
    assert snapshot(theirs) == before
    del before["db.pcapng"], before["app.pcapng"]
    (theirs / "db.pcapng").unlink()
    (theirs / "app.pcapng").unlink()
    assert cli("evidence", str(analysis), "--out", str(theirs), "-q").returncode == 0  # beside their files
    after = snapshot(theirs)
    assert after["other.pcapng"] == b"another" and (theirs / "db.pcapng").stat().st_size > 100
    assert cli("evidence", str(analysis), "--out", str(theirs), "-q").returncode == 0  # ours: replaced
    assert snapshot(theirs)["other.pcapng"] == b"another"


def test_an_evidence_folder_of_ours_is_replaced_by_the_next_analyze(tmp_path, bundled_analysis):
    analysis = analysed(bundled_analysis, GROUP_STALL, tmp_path / "analysis")
    assert cli("evidence", str(analysis), "-q").returncode == 0
    assert (analysis / "evidence" / "summary.md").is_file()
    assert cli("analyze", str(MAXTHREADS), "--out", str(analysis), "-q").returncode == 0
    assert not (analysis / "evidence").exists()  # the older run's evidence, listed in its manifest


def test_compare_leaves_a_users_analyses_folder_alone(tmp_path, bundled_analysis):
    a = analysed(bundled_analysis, GROUP_STALL, tmp_path / "a")
    b = analysed(bundled_analysis, MAXTHREADS, tmp_path / "b")
    out = users_folder(tmp_path / "cmp", {"analyses/mine.txt": b"my analyses", "readme.md": b"mine"})
    before = snapshot(out)
    assert cli("compare", str(a), str(b), "--out", str(out), "-q").returncode == 0
    after = snapshot(out)
    assert {k: after[k] for k in before} == before and (out / "comparison.html").is_file()
    refused(cli("compare", str(GROUP_STALL), str(MAXTHREADS), "--out", str(out), "-q"), "analyses")
    assert {k: snapshot(out)[k] for k in before} == before
