"""Evidence for a stall: one tshark display filter per stall that selects its victims and culprit at once (the
union of the per-exchange filters, checked with tshark itself), and exchanges.csv naming the captures as the
capture set does (app.pcap), not by this machine's folders."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from pcapdecomp.render.evidence import export

REPO = Path(__file__).resolve().parents[1]
SET = REPO / "captures" / "stall-fix-1-pool"


@pytest.fixture(scope="module")
def evidence(tmp_path_factory, bundled_analysis):
    return export(bundled_analysis(SET.name).out_dir, out_dir=tmp_path_factory.mktemp("evidence") / "evidence")


def _frame_counts(capture: Path, display_filters: list[str]) -> list[int]:
    """How many frames of `capture` each display filter selects, as tshark counts them: one pass over the capture
    for all the filters (`-z io,stat,0,…`: the whole capture as one interval, a column per filter)."""
    done = subprocess.run(["tshark", "-r", str(capture), "-q", "-z", "io,stat,0," + ",".join(display_filters)],
                          capture_output=True, text=True, timeout=120, check=True)
    row = [line for line in done.stdout.splitlines() if "<>" in line][-1]  # "| 0.000 <> 4.132 | frames | bytes | …"
    cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
    counts = [int(cell) for cell in cells[1::2]]
    assert len(counts) == len(display_filters), done.stdout[-2000:]
    return counts


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_one_filter_per_stall_selects_its_exchanges_in_tshark(evidence, bundled_analysis):
    text = (evidence.out_dir / "summary.md").read_text()
    combined = re.findall(r"Stall (\d+), its victims and culprit at once \((\d+) exchanges\):\n\n```\n"
                          r"tshark -r (\S+) -Y '([^']+)'\n```", text)
    stalls = pd.read_parquet(bundled_analysis(SET.name).out_dir / "exchanges.parquet")["stall"].dropna().unique()
    assert {int(s) for s, _, _, _ in combined} == {int(s) for s in stalls}
    rows = evidence.rows
    asked: dict[str, list[tuple[str, str]]] = {}  # capture → (display filter, what its count must be)
    for stall, count, capture, flt in combined:
        members = rows[(rows["stall"] == int(stall)).fillna(False)]
        assert int(count) == len(members)
        single = re.findall(r"tshark -r " + re.escape(capture) + r" -Y '([^']+)'`", text)
        parts = flt[1:-1].split(") || (")
        assert len(parts) == len(members) and set(parts) <= set(single)
        # tshark reads the union as a whole; each member selects frames, and none that the union does not select
        asked.setdefault(capture, []).append((flt, "some"))
        for member in parts:
            asked[capture] += [(member, "some"), (f"({member}) && !({flt})", "none")]
    for capture, checks in asked.items():
        counts = _frame_counts(SET / capture, [flt for flt, _ in checks])
        for (flt, want), n in zip(checks, counts):
            assert (n > 0) if want == "some" else (n == 0), f"{capture}: {n} frames: {flt}"


def test_exchanges_csv_names_captures_as_the_set_does(evidence):
    csv = pd.read_csv(evidence.out_dir / "exchanges.csv")
    assert set(csv["capture"]) <= {"app.pcap", "db.pcap"}
    assert set(csv["db_point"].dropna()) <= {"db.pcap"}
    assert len(csv) == len(evidence.rows)
