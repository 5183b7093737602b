"""benchmarks/partition_views.py, the numbers of docs/partitioned.md: its streamed pairwise sum must give the very
float numpy's sum gives (the plan's summary.json sums rest on it: a sequential sum differs in the last digits), fed
in any chunks; and its runs of buckets must cover every row once."""

import importlib.util
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("partition_views", REPO / "benchmarks" / "partition_views.py")
partition_views = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(partition_views)


def streamed(values: np.ndarray, chunk: int) -> float:
    total = partition_views.numpy_pairwise_sum(len(values))
    for start in range(0, len(values), chunk):
        total.add(values[start:start + chunk])
    return total.result()


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3000), st.integers(1, 700), st.integers(0, 2**32 - 1))
def test_the_streamed_sum_is_numpys_sum(n, chunk, seed):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)  # magnitudes apart: the order shows
    assert streamed(values, chunk) == float(np.add.reduce(values))


def test_the_streamed_sum_is_numpys_where_the_order_matters():
    # a million values where a sequential sum differs from numpy's: the stream must follow numpy's tree, not the
    # order the values come in
    values = np.random.default_rng(37).random(1_000_003) * 1e-3 + 1.0
    expected = float(np.add.reduce(values))
    assert float(np.cumsum(values)[-1]) != expected
    assert streamed(values, 131_072) == expected
    assert streamed(values, 9_999) == expected


def test_a_stream_fed_too_few_values_says_so():
    total = partition_views.numpy_pairwise_sum(300)
    total.add(np.ones(299))
    try:
        total.result()
    except ValueError as err:
        assert "blocks" in str(err)
    else:
        raise AssertionError("a sum of 299 of 300 values was given")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=300), st.integers(1, 64))
def test_bucket_runs_hold_every_row_once(buckets, parts):
    counts = np.array(buckets, dtype=np.int64)
    sizes = partition_views.bucket_runs(counts, parts)
    assert len(sizes) == parts
    assert (sizes >= 0).all()
    assert sizes.sum() == counts.sum()
