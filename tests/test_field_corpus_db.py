"""The field sweep (tests/field_sweep.py) on the public corpus, each capture as --db alone."""

from __future__ import annotations

import pytest
from field_sweep import check, theirs


@pytest.mark.parametrize("mode,paths,name,render", theirs("db"))
def test_analyze_runs_and_its_outputs_agree(tmp_path, monkeypatch, bundled_analysis, mode, paths, name, render):
    check(tmp_path, monkeypatch, bundled_analysis, mode, paths, name, render)
