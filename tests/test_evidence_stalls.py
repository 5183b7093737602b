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


def _frames(capture: Path, display_filter: str) -> set[int]:
    done = subprocess.run(["tshark", "-r", str(capture), "-Y", display_filter, "-T", "fields", "-e", "frame.number"],
                          capture_output=True, text=True, timeout=120, check=True)
    return {int(v) for v in done.stdout.split()}


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_one_filter_per_stall_selects_its_exchanges_in_tshark(evidence, bundled_analysis):
    text = (evidence.out_dir / "summary.md").read_text()
    combined = re.findall(r"Stall (\d+), its victims and culprit at once \((\d+) exchanges\):\n\n```\n"
                          r"tshark -r (\S+) -Y '([^']+)'\n```", text)
    stalls = pd.read_parquet(bundled_analysis(SET.name).out_dir / "exchanges.parquet")["stall"].dropna().unique()
    assert {int(s) for s, _, _, _ in combined} == {int(s) for s in stalls}
    rows = evidence.rows
    for stall, count, capture, flt in combined:
        members = rows[(rows["stall"] == int(stall)).fillna(False)]
        assert int(count) == len(members)
        single = re.findall(r"tshark -r " + re.escape(capture) + r" -Y '([^']+)'`", text)
        parts = flt[1:-1].split(") || (")
        assert len(parts) == len(members) and set(parts) <= set(single)
        # tshark reads the union as a whole; its first, middle and last members each select frames it selects (a
        # tshark run per member, all of them, is most of this file's time and shows nothing more)
        selected = _frames(SET / capture, flt)
        for member in sorted({parts[0], parts[len(parts) // 2], parts[-1]}):
            frames = _frames(SET / capture, member)
            assert frames and frames <= selected


def test_exchanges_csv_names_captures_as_the_set_does(evidence):
    csv = pd.read_csv(evidence.out_dir / "exchanges.csv")
    assert set(csv["capture"]) <= {"app.pcap", "db.pcap"}
    assert set(csv["db_point"].dropna()) <= {"db.pcap"}
    assert len(csv) == len(evidence.rows)
