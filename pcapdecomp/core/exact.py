"""Sums and order statistics made from pieces that equal, to the last bit, what numpy makes of the whole column.

The partitioned analysis (docs/partitioned.md §2.4) never holds a whole column, yet summary.json's floats must be
the ones today's code writes. Three facts about numpy make that possible, each reproduced here:

- `PairwiseSum`: numpy's float64 sum of a contiguous array (`np.sum`, `pd.Series.sum`, `np.add.reduce`) is not
  sequential but pairwise (`pairwise_sum` in numpy's loops_utils.h.src: fewer than 8 values one by one, up to 128 in
  8 lanes, above that the two halves, the cut a multiple of 8). Knowing n, the tree is known before the first value:
  the values fed in row order, in any chunks, give the very float `np.sum` gives, from O(log n) state and one block
  of at most 128 values. `latency_quantiles` sums the non-null values of a column, `verdict._sum` every row with NaN
  as 0: each is this sum of the values it sums, in row order.
- `nearest_rank_of_runs`: `np.quantile(method="inverted_cdf")` (core.groups.nearest_rank) is an order statistic, so
  it depends on the multiset alone: from sorted runs (one per partition) by counting, no concatenation.
- `ClassSums`: `np.bincount(codes, weights)` (core.groups.group_sum) adds each class's values one after the other in
  row order, not pairwise: a running sum per class fed chunk by chunk in row order is the same float; a sum of
  per-partition sums is not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

PW_BLOCKSIZE = 128  # numpy's pairwise sum: a block of at most this many values is summed directly (in 8 lanes)
PW_LANES = 8  # the halves of a longer block are cut at a multiple of this


def pairwise_halves(n: int) -> tuple[int, int] | None:
    """The two halves numpy's pairwise sum cuts `n` values into, None for a block it sums directly."""
    if n <= PW_BLOCKSIZE:
        return None
    first = n // 2
    first -= first % PW_LANES
    return first, n - first


def pairwise_leaves(n: int) -> Iterator[int]:
    """The lengths of the blocks numpy's pairwise sum of `n` values sums directly, in order (a walk of its tree that
    keeps one pending right half per level)."""
    pending = [n] if n else []
    while pending:
        m = pending.pop()
        cut = pairwise_halves(m)
        while cut is not None:
            pending.append(cut[1])
            m = cut[0]
            cut = pairwise_halves(m)
        yield m


class PairwiseSum:
    """numpy's float64 sum of `n` values, fed in order a chunk at a time (`add`), read by `result()` once all n
    came: the float `np.add.reduce` gives of the whole contiguous array. NaN and infinities take part as they do
    in numpy's sum; leaving NaN out, or counting it as 0, is the caller's choice, as in today's code."""

    def __init__(self, n: int):
        if n < 0:
            raise ValueError(f"a sum of {n} values")
        self.n = n
        self._leaves = pairwise_leaves(n)
        self._leaf = next(self._leaves, None)  # the length of the block being filled
        self._held: list[np.ndarray] = []  # the block's values so far (fewer than its length)
        self._held_count = 0
        self._done: list[tuple[int, float]] = []  # (values, sum) of finished subtrees, combined as halves pair
        self.fed = 0

    def add(self, values) -> None:
        values = np.ascontiguousarray(values, dtype=np.float64).ravel()
        if self.fed + len(values) > self.n:
            raise ValueError(f"a sum of {self.n} values fed {self.fed + len(values)}")
        self.fed += len(values)
        at = 0
        while at < len(values):
            want = self._leaf - self._held_count
            if self._held_count == 0 and len(values) - at >= want:  # a whole block inside the chunk: no copy
                block = values[at:at + want]
            else:
                piece = values[at:at + want]
                self._held.append(piece)
                self._held_count += len(piece)
                at += len(piece)
                if self._held_count < self._leaf:
                    return
                block = np.concatenate(self._held)
                self._held, self._held_count = [], 0
                self._finish(block)
                continue
            at += want
            self._finish(block)

    def _finish(self, block: np.ndarray) -> None:
        # a block of at most 128 values is numpy's own leaf: its sum of it is the leaf's
        self._done.append((len(block), float(np.add.reduce(block))))
        self._leaf = next(self._leaves, None)
        # two finished neighbours that are the halves of one node of the tree become that node
        while len(self._done) >= 2:
            (n1, a), (n2, b) = self._done[-2], self._done[-1]
            if pairwise_halves(n1 + n2) != (n1, n2):
                break
            self._done[-2:] = [(n1 + n2, a + b)]

    def result(self) -> float:
        if self.fed != self.n:
            raise ValueError(f"a sum of {self.n} values fed {self.fed}")
        return self._done[0][1] if self.n else 0.0


def pairwise_sum(chunks: Iterable, n: int) -> float:
    """`PairwiseSum` of the chunks' values, `n` in all."""
    total = PairwiseSum(n)
    for chunk in chunks:
        total.add(chunk)
    return total.result()


def nearest_rank_index(n: int, qs) -> np.ndarray:
    """The positions in the sorted values that np.quantile(method="inverted_cdf") takes for `qs` of n values: the
    same float arithmetic as numpy's (n × q − 1, up to the next whole number unless it is one, at least 0)."""
    q = np.asanyarray(qs, dtype=np.float64)
    index = n * q - 1
    below = np.floor(index)
    at = np.where(index - below == 0, below, below + 1).astype(np.intp)
    at[at < 0] = 0
    return at


def nearest_rank_of_runs(runs: list[np.ndarray], qs) -> np.ndarray:
    """core.groups.nearest_rank (np.quantile(method="inverted_cdf")) of the concatenation of `runs`, each sorted
    ascending, without NaN (as latency_quantiles leaves NaN out), not all empty: the k-th smallest value of their
    union for each q, found by counting (a binary search in each run, the ranks summed over the runs), so no run is
    copied. Order statistics depend on the values alone, not on which run holds them or in what order."""
    runs = [np.asarray(r, dtype=np.float64) for r in runs if len(r)]
    n = sum(len(r) for r in runs)
    if not n:
        raise ValueError("the nearest rank of no values")
    ranks = nearest_rank_index(n, qs)
    return np.array([_kth(runs, int(k)) for k in np.ravel(ranks)], dtype=np.float64).reshape(np.shape(ranks))


def _kth(runs: list[np.ndarray], k: int) -> float:
    """The value of rank k (0-based) of the sorted runs' union: some run holds it at a position where the count of
    smaller values over all runs is at most k and the count of values not greater exceeds k."""
    for run in runs:
        lo, hi = 0, len(run)
        while lo < hi:
            mid = (lo + hi) // 2
            value = run[mid]
            if k < sum(int(np.searchsorted(r, value, side="left")) for r in runs):
                hi = mid
            elif k >= sum(int(np.searchsorted(r, value, side="right")) for r in runs):
                lo = mid + 1
            else:
                return float(value)
    raise ValueError(f"rank {k} of {sum(len(r) for r in runs)} values: the runs are not sorted, or hold NaN")


def sorted_run(values) -> np.ndarray:
    """A partition's run for nearest_rank_of_runs: its values without NaN, sorted."""
    values = np.asarray(values, dtype=np.float64)
    return np.sort(values[~np.isnan(values)])


class ClassSums:
    """core.groups.group_sum(codes, values, classes) of a column fed in row order a chunk at a time: per class the
    sum of its non-NaN values (NaN where it has none) and their count. np.bincount adds a class's weights one by one
    in row order, so each chunk's sums start from the running ones: the running sums go in as the first weight of
    each class, and one np.bincount continues them (0.0 + s is s: a running sum is never -0.0, as bincount's start
    is 0.0)."""

    def __init__(self, classes: int):
        self.classes = classes
        self._sums = np.zeros(classes, dtype=np.float64)
        self._counts = np.zeros(classes, dtype=np.int64)
        self._start = np.arange(classes, dtype=np.intp)

    def add(self, codes, values) -> None:
        codes = np.asarray(codes, dtype=np.intp)
        values = np.asarray(values, dtype=np.float64)
        if len(codes) != len(values) or (len(codes) and (codes.min() < 0 or codes.max() >= self.classes)):
            raise ValueError(f"{len(codes)} codes of {self.classes} classes for {len(values)} values")
        missing = np.isnan(values)
        self._counts += np.bincount(codes, minlength=self.classes)
        if missing.any():
            self._counts -= np.bincount(codes[missing], minlength=self.classes)
            values = np.where(missing, 0.0, values)  # as group_sum: a NaN weighs 0, which leaves a sum as it was
        self._sums = np.bincount(np.concatenate([self._start, codes]), minlength=self.classes,
                                 weights=np.concatenate([self._sums, values]))

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        return np.where(self._counts > 0, self._sums, np.nan), self._counts.copy()
