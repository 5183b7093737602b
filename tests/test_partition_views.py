"""benchmarks/partition_views.py, the numbers of docs/partitioned.md: its runs of buckets must cover every row once
(its streamed pairwise sum is pcapdecomp.core.exact.PairwiseSum, tested in tests/test_exact.py)."""

import importlib.util
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("partition_views", REPO / "benchmarks" / "partition_views.py")
partition_views = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(partition_views)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=300), st.integers(1, 64))
def test_bucket_runs_hold_every_row_once(buckets, parts):
    counts = np.array(buckets, dtype=np.int64)
    sizes = partition_views.bucket_runs(counts, parts)
    assert len(sizes) == parts
    assert (sizes >= 0).all()
    assert sizes.sum() == counts.sum()
