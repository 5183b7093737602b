"""Analysis folders read back (evidence, compare) are checked against core/schema.py: a column or a summary key of the
wrong type is one line naming it (exit 2), and a table claiming many rows in a small file is refused before any
allocation. Crafted from a real analysis of the bundled group-stall set."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pcapdecomp.core.readback import MIN_FILE_BYTES_PER_ROW

REPO = Path(__file__).resolve().parent.parent
GROUP_STALL = REPO / "captures" / "group-stall"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcapdecomp.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def analysis(bundled_analysis) -> Path:
    return bundled_analysis(GROUP_STALL.name).out_dir


def spoiled(analysis: Path, tmp_path: Path, name: str) -> Path:
    copy = tmp_path / name
    shutil.copytree(analysis, copy)
    return copy


def one_line(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), proc.stderr


def test_a_column_of_the_wrong_type_is_one_line_naming_it(analysis, tmp_path):
    bad = spoiled(analysis, tmp_path, "bad")
    table = pq.read_table(bad / "exchanges.parquet")
    i = table.schema.get_field_index("server_s")
    table = table.set_column(i, "server_s", pa.array(["slow"] * len(table)))  # text where seconds belong
    pq.write_table(table, bad / "exchanges.parquet")
    one_line(cli("evidence", str(bad), "-q"), "column server_s holds string, not float64")
    one_line(cli("compare", str(analysis), str(bad), "--out", str(tmp_path / "c"), "-q"), "column server_s")


def test_a_summary_key_of_the_wrong_type_is_one_line_naming_it(analysis, tmp_path):
    bad = spoiled(analysis, tmp_path, "bad")
    summary = json.loads((bad / "summary.json").read_text())
    summary["inputs"]["db"] = 7
    (bad / "summary.json").write_text(json.dumps(summary))
    one_line(cli("evidence", str(bad), "-q"), "inputs.db holds int")
    one_line(cli("compare", str(analysis), str(bad), "--out", str(tmp_path / "c"), "-q"), "inputs.db holds int")


def test_many_rows_in_a_small_file_are_refused_before_reading(analysis, tmp_path):
    bad = spoiled(analysis, tmp_path, "bad")
    rows = 2_000_000  # a constant column compresses to almost nothing: 16 MB of values in a few KB
    pq.write_table(pa.table({"conn_id": pa.repeat(pa.scalar(1, pa.int64()), rows)}), bad / "exchanges.parquet")
    size = (bad / "exchanges.parquet").stat().st_size
    assert rows * MIN_FILE_BYTES_PER_ROW > size
    one_line(cli("evidence", str(bad), "-q"), "claims 2,000,000 rows in")
