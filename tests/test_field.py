"""The field sweep (tests/field_sweep.py) on the project's own captures: every bundled and tests/data/field capture
as --db, as --app and as both points, the bundled capture-set folders, one real app + DB pair. The public corpus's
runs are tests/test_field_corpus_{db,app,both}.py."""

from __future__ import annotations

import pytest
from corpus import captures as corpus_captures
from field_sweep import MODES, check, ours, theirs


@pytest.mark.parametrize("mode,paths,name,render", ours())
def test_analyze_runs_and_its_outputs_agree(tmp_path, monkeypatch, bundled_analysis, mode, paths, name, render):
    check(tmp_path, monkeypatch, bundled_analysis, mode, paths, name, render)


def test_the_sweep_covers_every_kind_of_capture():
    """The parametrisation really holds the bundled sets, every tests/data capture and (where present) the corpus."""
    ids = [c.id for c in ours() + [c for mode in MODES for c in theirs(mode)]]
    for folder in ("group-stall", "maxthreads", "oltp-hogs", "features"):
        assert f"set:{folder}" in ids and f"db:captures/{folder}/db.pcap" in ids
    for shape in ("one-exchange", "one-connection-db", "no-exchange", "one-microsecond", "one-frame", "no-mysql"):
        assert f"both:tests/data/field/{shape}.pcap" in ids
    for r in corpus_captures():  # each corpus capture as both points, and as one point alone
        assert f"both:{r['path']}" in ids and (f"db:{r['path']}" in ids) != (f"app:{r['path']}" in ids)
