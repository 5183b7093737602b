"""pcapdecomp/core/exact.py against numpy itself: the streamed pairwise sum gives the float np.sum gives (fed in any
chunks), the nearest rank of sorted runs the value np.quantile(method="inverted_cdf") takes of their concatenation,
the per-class running sums what np.bincount(codes, weights) gives of the whole column; on random lengths and
chunkings, on the sums and quantiles summary.json makes (latency_quantiles: NaN left out; verdict._sum: NaN as 0),
and on the columns of real exchanges.parquet files (a bundled capture's, the 10 s read-write recording's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcapdecomp.core.exact import (ClassSums, GroupbySums, KahanClassSums, PairwiseSum, RadixSelect, float_keys,
                                   floats_of_keys, masked_sums, median_of_runs, nearest_rank_index,
                                   nearest_rank_of_runs, pairwise_leaves, pairwise_sum, radix_quantiles, sorted_run)
from pcapdecomp.core.groups import group_sum, nearest_rank
from pcapdecomp.explain.decompose import _group_quantiles
from pcapdecomp.explain.summary import latency_quantiles
from pcapdecomp.explain.verdict import _sum as verdict_sum

LATENCY_COLUMNS = ("total_s", "server_s", "network_s", "net_req_s", "net_resp_s", "queue_s", "exec_s")
RECORDING = Path("/tmp/pcapdecomp-bench/sysbench-rw-10s")
# the lengths where numpy's tree changes shape: a block's edges (8 lanes, 128 values) and the powers of two
EDGES = sorted({0, 1, 2, 7, 8, 9, 15, 16, 17, 127, 128, 129, 135, 136, 137, 255, 256, 257,
                *(2 ** k + d for k in range(9, 18) for d in (-1, 0, 1))})


def values_of(n: int, seed: int) -> np.ndarray:
    """`n` floats of magnitudes far apart, so that the order of the additions shows in the last bits."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n) * 10.0 ** rng.integers(-6, 7, n)


def chunked(values: np.ndarray, cuts: list[int]) -> list[np.ndarray]:
    """`values` cut at the positions `cuts` (any, unsorted, repeated: empty chunks included)."""
    edges = [0, *sorted(min(c, len(values)) for c in cuts), len(values)]
    return [values[a:b] for a, b in zip(edges[:-1], edges[1:])]


def same_float(a: float, b: float) -> bool:
    return np.float64(a).tobytes() == np.float64(b).tobytes() or (np.isnan(a) and np.isnan(b))


# --- PairwiseSum ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", EDGES)
def test_the_streamed_sum_is_numpys_at_the_edges_of_its_tree(n):
    values = values_of(n, n)
    expected = float(np.add.reduce(values))
    assert sum(pairwise_leaves(n)) == n and all(1 <= m <= 128 for m in pairwise_leaves(n) if n)
    for chunk in (1, 7, 8, 127, 128, 129, 131_072):
        assert same_float(pairwise_sum(chunked(values, list(range(chunk, n, chunk))), n), expected), chunk


@settings(max_examples=150)
@given(st.one_of(st.sampled_from(EDGES), st.integers(0, 5000)), st.lists(st.integers(0, 5000), max_size=12),
       st.integers(0, 2 ** 32 - 1))
def test_the_streamed_sum_is_numpys_in_any_chunks(n, cuts, seed):
    values = values_of(n, seed)
    assert same_float(pairwise_sum(chunked(values, cuts), n), float(np.add.reduce(values)))


@settings(max_examples=60)
@given(st.integers(0, 3000), st.floats(0, 1), st.lists(st.integers(0, 3000), max_size=6), st.integers(0, 2 ** 32 - 1))
def test_the_sums_summary_json_makes_with_nan_streamed(n, nan_share, cuts, seed):
    values = values_of(n, seed)
    values[np.random.default_rng(seed).random(n) < nan_share] = np.nan
    frame = pd.DataFrame({c: values for c in LATENCY_COLUMNS})
    # latency_quantiles: the non-null values, compacted, in row order (a partition's part of them, streamed)
    present = [c[~np.isnan(c)] for c in chunked(values, cuts)]
    count = sum(len(c) for c in present)
    made = latency_quantiles(frame)["total"]
    if count:
        assert same_float(pairwise_sum(present, count), made["sum"]) and made["count"] == count
    else:
        assert made is None
    # verdict._sum: every row, NaN as 0
    filled = [np.where(np.isnan(c), 0.0, c) for c in chunked(values, cuts)]
    assert same_float(pairwise_sum(filled, n), verdict_sum(values))


def test_the_streamed_sum_follows_numpys_tree_where_a_sequential_sum_differs():
    values = np.random.default_rng(37).random(1_000_003) * 1e-3 + 1.0
    expected = float(np.add.reduce(values))
    assert float(np.cumsum(values)[-1]) != expected
    for chunk in (131_072, 9_999, 1_000_003):
        assert pairwise_sum(chunked(values, list(range(chunk, len(values), chunk))), len(values)) == expected


def test_nan_and_infinities_take_part_as_in_numpys_sum():
    for special in (np.nan, np.inf, -np.inf):
        values = values_of(1000, 5)
        values[500] = special
        got = pairwise_sum([values[:333], values[333:]], 1000)
        assert same_float(got, float(np.add.reduce(values)))


def test_a_sum_fed_too_few_or_too_many_values_says_so():
    total = PairwiseSum(300)
    total.add(np.ones(299))
    with pytest.raises(ValueError, match="300 values fed 299"):
        total.result()
    with pytest.raises(ValueError, match="300 values fed 302"):
        total.add(np.ones(3))
    assert PairwiseSum(0).result() == 0.0


# --- nearest_rank_of_runs -------------------------------------------------------------------------------------


@settings(max_examples=150)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=10), st.integers(0, 2 ** 32 - 1),
       st.lists(st.floats(0, 1), min_size=1, max_size=4), st.booleans())
def test_the_nearest_rank_of_sorted_runs_is_that_of_their_concatenation(sizes, seed, qs, repeats):
    rng = np.random.default_rng(seed)
    whole = values_of(sum(sizes), seed)
    if repeats:  # latencies repeat (the clock's resolution): ties across runs
        whole = np.round(whole, 1)
    if not len(whole):
        with pytest.raises(ValueError):
            nearest_rank_of_runs([whole], qs)
        return
    whole[rng.random(len(whole)) < 0.1] = np.nan
    cut = np.cumsum(sizes)[:-1]
    runs = [sorted_run(part) for part in np.split(whole, cut)]
    present = whole[~np.isnan(whole)]
    if not len(present):
        return
    got = nearest_rank_of_runs(runs, qs)
    assert np.array_equal(got, np.quantile(present, qs, method="inverted_cdf"))
    assert np.array_equal(got, nearest_rank(present, qs))
    assert np.array_equal(nearest_rank_of_runs(runs[::-1], qs), got)  # which run holds a value does not matter


@pytest.mark.parametrize("n", EDGES[1:])
def test_the_rank_numpy_takes_at_the_edges(n):
    qs = np.array([0.0, 0.01, 0.5, 0.95, 0.99, 1.0, 1 / 3, 2 / 3])
    values = np.arange(n, dtype=np.float64)
    assert np.array_equal(nearest_rank_index(n, qs), np.quantile(values, qs, method="inverted_cdf").astype(np.intp))


# --- ClassSums ------------------------------------------------------------------------------------------------


@settings(max_examples=150)
@given(st.integers(0, 3000), st.integers(1, 40), st.lists(st.integers(0, 3000), max_size=8),
       st.floats(0, 1), st.integers(0, 2 ** 32 - 1))
def test_class_sums_fed_in_chunks_are_bincounts_of_the_column(n, classes, cuts, nan_share, seed):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, classes, n)
    values = values_of(n, seed)
    values[rng.random(n) < nan_share] = np.nan
    sums = ClassSums(classes)
    for c, v in zip(chunked(codes, cuts), chunked(values, cuts)):
        sums.add(c, v)
    got, count = sums.result()
    want, want_count = group_sum(codes, values, classes)
    assert got.tobytes() == want.tobytes() and np.array_equal(count, want_count)


@settings(max_examples=150)
@given(st.integers(1, 3000), st.integers(1, 6), st.lists(st.integers(0, 3000), max_size=8), st.booleans(),
       st.floats(0, 0.2), st.integers(0, 2 ** 32 - 1))
def test_groupby_sums_fed_in_chunks_are_pandas_groupby_sums(n, classes, cuts, in_order, nan_share, seed):
    """pandas' groupby sum takes np.add.reduceat when the group ids never decrease (the rows sorted by group: one
    group always), else its Kahan kernel (and with a NaN): GroupbySums and KahanClassSums give its floats."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, classes, n)
    if in_order:
        codes = np.sort(codes)
    codes = np.unique(codes, return_inverse=True)[1]  # every group present, as groupby's result holds them
    values = values_of(n, seed)
    values[rng.random(n) < nan_share] = np.nan
    frame = pd.DataFrame({"g": pd.Categorical.from_codes(codes, categories=[f"g{i}" for i in range(codes.max() + 1)]),
                          "v": values})
    want = frame.groupby("g")["v"].sum().to_numpy()
    sums = GroupbySums(np.bincount(codes))
    for c, v in zip(chunked(codes, cuts), chunked(values, cuts)):
        sums.add(c, v)
    assert sums.result().tobytes() == want.tobytes()
    if (np.diff(codes) < 0).any() or np.isnan(values).any():
        kahan = KahanClassSums(codes.max() + 1)
        kahan.add(codes, values)
        assert kahan.result()[0].tobytes() == want.tobytes()


def test_groupby_sums_are_not_sums_of_partition_sums():
    """Each group's sum crosses the chunks: one group's durations (the one-connection pair's kind) summed per half
    then added give another float than pandas' sum of the whole (so a test comparing them can fail)."""
    rng = np.random.default_rng(0)
    codes = np.zeros(5000, dtype=np.int64)
    values = rng.exponential(0.001, 5000) * 10.0 ** rng.integers(-3, 3, 5000)
    whole = pd.DataFrame({"g": codes, "v": values}).groupby("g")["v"].sum().to_numpy()
    halves = sum(pd.DataFrame({"g": c, "v": v}).groupby("g")["v"].sum().to_numpy()
                 for c, v in ((codes[:2500], values[:2500]), (codes[2500:], values[2500:])))
    assert whole.tobytes() != halves.tobytes()


@settings(max_examples=100)
@given(st.lists(st.integers(0, 500), min_size=1, max_size=6), st.integers(0, 2 ** 32 - 1))
def test_the_median_of_sorted_runs_is_numpys(sizes, seed):
    rng = np.random.default_rng(seed)
    values = np.round(rng.exponential(1.0, sum(sizes)), int(rng.integers(1, 6)))  # ties too
    if not len(values):
        return
    runs = np.split(values, np.cumsum(sizes)[:-1])
    assert median_of_runs([np.sort(r) for r in runs]) == np.median(values)


def test_masked_sums_are_todays_sums_of_the_selected_values():
    values = np.array([0.1, np.nan, 0.2, 0.3, np.inf])
    rows = np.array([True, True, False, True, False])
    assert masked_sums([("a", rows, values)]) == {"a": (3, verdict_sum(values[rows]))}


def test_class_sums_refuse_a_code_out_of_range():
    with pytest.raises(ValueError):
        ClassSums(3).add([0, 3], [1.0, 2.0])


# --- RadixSelect -----------------------------------------------------------------------------------------------


def partitions_of(values: np.ndarray, codes: np.ndarray | None, cuts: list[int]):
    """A `read` for radix_quantiles: the column cut at `cuts`, yielded afresh for each pass (last piece first, as
    a cluster may hand them in any order)."""
    def read():
        pieces = chunked(values, cuts)
        classes = chunked(codes, cuts) if codes is not None else [None] * len(pieces)
        return list(zip(pieces, classes))[::-1]
    return read


SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1.0, 1.0, 2.5]


@st.composite
def columns(draw):
    """A column of floats with ties, ±0 (not both: see RadixSelect), infinities, subnormals and NaN, its class
    codes, where it is cut into partitions, and how much a pass may hold."""
    n = draw(st.integers(0, 400))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    values = np.where(rng.random(n) < draw(st.sampled_from([0.0, 0.2, 0.6])),
                      rng.choice(np.array(SPECIAL), n), values_of(n, seed))
    zero = draw(st.sampled_from([0.0, -0.0]))
    values[values == 0] = zero
    classes = draw(st.integers(1, 6))
    return (values, rng.integers(0, classes, n), classes, draw(st.lists(st.integers(0, 400), max_size=8)),
            draw(st.sampled_from([0, 1, 7, 1 << 16])))


def same_floats(a: np.ndarray, b: np.ndarray) -> bool:
    return np.asarray(a, dtype=np.float64).tobytes() == np.asarray(b, dtype=np.float64).tobytes()


def test_the_keys_order_the_floats_and_invert():
    values = np.array([-np.inf, -1e300, -1.5, -5e-324, -0.0, 0.0, 5e-324, 1e-300, 1.5, np.inf])
    keys = float_keys(values)
    assert (np.diff(keys.astype(object)) > 0).all()
    assert same_floats(floats_of_keys(keys), values)


@settings(max_examples=300, deadline=None)
@given(columns(), st.lists(st.floats(0, 1), min_size=1, max_size=4))
def test_the_radix_select_is_numpys_nearest_rank_per_class(case, qs):
    values, codes, classes, cuts, hold = case
    got = radix_quantiles(partitions_of(values, codes, cuts), classes, qs, "nearest", hold)
    for k in range(classes):
        mine = values[(codes == k) & ~np.isnan(values)]
        want = nearest_rank(mine, qs) if len(mine) else np.full(len(qs), np.nan)
        assert same_floats([g[k] for g in got], want), (k, hold)
    whole = radix_quantiles(partitions_of(values, None, cuts), 1, qs, "nearest", hold)
    present = values[~np.isnan(values)]
    assert same_floats([w[0] for w in whole], nearest_rank(present, qs) if len(present) else [np.nan] * len(qs))


@settings(max_examples=300, deadline=None)
@given(columns(), st.lists(st.floats(0, 1), min_size=1, max_size=4))
def test_the_radix_select_is_the_execution_estimates_linear_quantile(case, qs):
    values, codes, classes, cuts, hold = case
    got = radix_quantiles(partitions_of(values, codes, cuts), classes, qs, "linear", hold)
    present = ~np.isnan(values)
    want = _group_quantiles(codes[present], values[present], classes, tuple(qs))
    for g, w in zip(got, want):
        assert same_floats(g, w), hold


def test_the_passes_the_radix_select_makes():
    values = values_of(10_000, 3)
    for hold, passes in ((1 << 16, 2), (0, 4)):  # a bucket taken whole, or every 16 bits counted
        select = RadixSelect(1, [0.5, 0.99], hold=hold)
        while True:
            select.feed(values[5000:])
            select.feed(values[:5000])
            if not select.end_pass():
                break
        assert select.passes == passes
        assert same_floats([r[0] for r in select.result()], nearest_rank(values, [0.5, 0.99]))
    empty = RadixSelect(2, [0.5])
    empty.feed([np.nan], [1])
    assert not empty.end_pass() and np.isnan(empty.result()[0]).all() and empty.passes == 1


def test_the_radix_select_with_more_classes_than_a_packed_key_holds():
    """Past 32,768 classes a (class, 48-bit prefix) pair does not fit in one int64: the last passes look the pairs
    up in pandas' index instead; the same quantiles."""
    rng = np.random.default_rng(11)
    codes = rng.choice(np.array([0, 5, 40_000, 65_535]), 3000)
    values = rng.integers(-300, 300, 3000) / 8  # ties, and no −0.0
    got = radix_quantiles(partitions_of(values, codes, [700, 1500]), 65_536, [0.5, 0.9], "nearest", hold=0)
    for k in (0, 5, 40_000, 65_535):
        assert same_floats([g[k] for g in got], nearest_rank(values[codes == k], [0.5, 0.9]))
    assert np.isnan(got[0][1])


def test_a_radix_select_fed_other_values_or_asked_early_says_so():
    select = RadixSelect(1, [0.5], hold=1 << 16)
    select.feed(np.arange(10.0))
    assert select.end_pass()
    with pytest.raises(ValueError):
        select.result()
    select.feed(np.arange(100.0, 110.0))  # none in the bucket the first pass chose
    with pytest.raises(ValueError):
        select.end_pass()
    with pytest.raises(ValueError):
        RadixSelect(1, [0.5], rule="midpoint")
    with pytest.raises(ValueError):
        RadixSelect(2, [0.5]).feed([1.0], [2])


# --- real columns ---------------------------------------------------------------------------------------------


def check_columns(path: Path, row_group: int) -> int:
    """Every latency column of exchanges.parquet at `path`: its latency_quantiles sum and p50/p99 and its verdict
    sum, made from pieces of `row_group` rows in row order (a partition's sorted run each for the quantiles), equal
    what today's functions make of the whole column; the per-fingerprint sums (the query profile's bincount)
    equal too. Returns the rows read."""
    table = pq.read_table(path, columns=[*LATENCY_COLUMNS, "fingerprint"]).to_pandas()
    made = latency_quantiles(table)
    n = len(table)
    codes = table["fingerprint"].astype("category").cat.codes.to_numpy().astype(np.int64)
    codes[codes < 0] = codes.max(initial=0) + 1
    classes = int(codes.max(initial=0)) + 1
    for col in LATENCY_COLUMNS:
        values = table[col].to_numpy(dtype="float64", na_value=np.nan)
        pieces = [values[s:s + row_group] for s in range(0, n, row_group)]
        present = [p[~np.isnan(p)] for p in pieces]
        count = sum(len(p) for p in present)
        entry = made[col.removesuffix("_s")]
        assert (entry is None) == (count == 0)
        if count:
            assert same_float(pairwise_sum(present, count), entry["sum"]), col
            p50, p99 = nearest_rank_of_runs([np.sort(p) for p in present], [0.5, 0.99])
            assert (p50, p99) == (entry["p50"], entry["p99"]), col
            radix = radix_quantiles(lambda: [(p, None) for p in present], 1, [0.5, 0.99])
            assert same_floats([r[0] for r in radix], [entry["p50"], entry["p99"]]), col
        assert same_float(pairwise_sum([np.where(np.isnan(p), 0.0, p) for p in pieces], n), verdict_sum(values)), col
        sums = ClassSums(classes)
        for s in range(0, n, row_group):
            sums.add(codes[s:s + row_group], values[s:s + row_group])
        got, count_by_class = sums.result()
        want, want_count = group_sum(codes, values, classes)
        assert got.tobytes() == want.tobytes() and np.array_equal(count_by_class, want_count), col
        # per fingerprint: the wait profile's nearest ranks and the execution estimates' linear quantiles
        by_piece = [(values[s:s + row_group], codes[s:s + row_group]) for s in range(0, n, row_group)]
        present = ~np.isnan(values)
        for rule, want in (("nearest", [group_nearest_rank_exact(codes[present], values[present], classes, q)
                                        for q in (0.5, 0.95, 0.99)]),
                           ("linear", _group_quantiles(codes[present], values[present], classes, (0.1, 0.5, 0.9)))):
            qs = (0.5, 0.95, 0.99) if rule == "nearest" else (0.1, 0.5, 0.9)
            for g, w in zip(radix_quantiles(lambda: by_piece, classes, qs, rule, hold=1 << 12), want):
                assert same_floats(g, w), (col, rule)
    return n


def group_nearest_rank_exact(codes: np.ndarray, values: np.ndarray, classes: int, q: float) -> np.ndarray:
    """nearest_rank of each class's values at q (NaN for a class without any)."""
    return np.array([nearest_rank(values[codes == k], [q])[0] if (codes == k).any() else np.nan
                     for k in range(classes)])


def test_the_columns_of_a_bundled_analysis(bundled_analysis):
    result = bundled_analysis("oltp-hogs")
    assert check_columns(result.out_dir / "exchanges.parquet", 100) > 3000  # 31 pieces


@pytest.mark.skipif(not (RECORDING / "db.pcap").exists(), reason=f"{RECORDING} is not on this machine")
def test_the_columns_of_the_10_s_read_write_recording(tmp_path):
    from pcapdecomp.analysis import Options, analyze, capture_set

    cs = capture_set(app=[RECORDING / "app.pcap"], db=RECORDING / "db.pcap", slow_log=RECORDING / "slow.log",
                     long_query_time=0.01, thread_pool_size=2)
    analyze(cs, Options(quiet=True, jobs=1), tmp_path / "out")
    # a 10 s recording: its size varies with the machine's load (90,562–101,856 exchanges a point, 2026-12-02)
    assert check_columns(tmp_path / "out" / "exchanges.parquet", 1 << 17) > 50_000
