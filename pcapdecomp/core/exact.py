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
- `RadixSelect`: the same order statistics (and `_group_quantiles`' interpolated ones) per class without holding
  the values at all: passes over the partitions counting 16 bits of the float64 keys at a time (step 9).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd

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


def masked_sums(terms) -> dict[str, tuple[int, float]]:
    """{name: (how many rows, their sum)} of (name, rows, values) terms, each summed as today's code sums a column's
    selected values (verdict._sum, np.nansum): NaN as 0, numpy's pairwise sum of the selected values in row order.
    The whole table's route; the partitions' feed the same terms to a PairwiseSum each (explain/summaryruns.py)."""
    out = {}
    for name, rows, values in terms:
        picked = values[rows]
        out[name] = (len(picked), float(np.where(np.isnan(picked), 0.0, picked).sum()))
    return out


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


def median_of_runs(runs: list[np.ndarray]) -> float:
    """np.median of the concatenation of `runs` (each sorted, without NaN, not all empty): the middle value, or
    np.mean of the two middle ones, found by counting as nearest_rank_of_runs does."""
    runs = [np.asarray(r, dtype=np.float64) for r in runs if len(r)]
    n = sum(len(r) for r in runs)
    if not n:
        raise ValueError("the median of no values")
    middle = [_kth(runs, n // 2)] if n % 2 else [_kth(runs, n // 2 - 1), _kth(runs, n // 2)]
    return float(np.mean(np.array(middle, dtype=np.float64)))


def sorted_run(values) -> np.ndarray:
    """A partition's run for nearest_rank_of_runs: its values without NaN, sorted."""
    values = np.asarray(values, dtype=np.float64)
    return np.sort(values[~np.isnan(values)])


def _check_codes(codes: np.ndarray, values: np.ndarray, classes: int) -> None:
    """A class code per value, each in 0 … classes − 1 (what the per-class sums and selections are fed)."""
    if len(codes) != len(values) or (len(codes) and (codes.min() < 0 or codes.max() >= classes)):
        raise ValueError(f"{len(codes)} codes of {classes} classes for {len(values)} values")


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
        _check_codes(codes, values, self.classes)
        missing = np.isnan(values)
        self._counts += np.bincount(codes, minlength=self.classes)
        if missing.any():
            self._counts -= np.bincount(codes[missing], minlength=self.classes)
            values = np.where(missing, 0.0, values)  # as group_sum: a NaN weighs 0, which leaves a sum as it was
        self._sums = np.bincount(np.concatenate([self._start, codes]), minlength=self.classes,
                                 weights=np.concatenate([self._sums, values]))

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        return np.where(self._counts > 0, self._sums, np.nan), self._counts.copy()


class KahanClassSums:
    """pandas' groupby sum (its group_sum kernel: per group a Kahan-compensated running sum in row order, NaN left
    out, a compensation made NaN by an infinity reset to 0) of a column fed in row order a chunk at a time: the
    floats pandas gives of the whole column. Per group the running sum and its compensation are carried across
    chunks, which no sum of partition sums reproduces."""

    def __init__(self, classes: int):
        self.classes = classes
        self._sums = [0.0] * classes
        self._comp = [0.0] * classes
        self._counts = np.zeros(classes, dtype=np.int64)

    def add(self, codes, values) -> None:
        codes = np.asarray(codes, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        _check_codes(codes, values, self.classes)
        known = ~np.isnan(values)
        self._counts += np.bincount(codes[known], minlength=self.classes)
        sums, comp = self._sums, self._comp
        for c, v in zip(codes[known].tolist(), values[known].tolist()):  # one after the other: the kernel's order
            y = v - comp[c]
            t = sums[c] + y
            comp[c] = t - sums[c] - y
            if comp[c] != comp[c]:
                comp[c] = 0.0
            sums[c] = t

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(per class its sum, 0.0 where it has no value, as pandas' sum with min_count 0; its count)."""
        return np.array(self._sums, dtype=np.float64), self._counts.copy()


class GroupbySums:
    """pandas' groupby sum of a column without NaN, fed in row order a chunk at a time (codes: the groups'
    positions in the groupby's result, which is sorted): when the codes never decrease over the whole column,
    pandas sums each group's segment by np.add.reduceat (its first value plus numpy's pairwise sum of the rest:
    `counts`, each group's values, gives the trees); else, or with a NaN, by its Kahan kernel (KahanClassSums).
    Both are made while it cannot yet be told which pandas takes."""

    def __init__(self, counts, monotonic: bool | None = None):
        counts = np.asarray(counts, dtype=np.int64)
        self.counts = counts
        # `monotonic` known beforehand (from the groups' first and last row keys): only that route is made
        self._kahan_wanted = monotonic is not True
        self._segments_wanted = monotonic is not False
        self.kahan = KahanClassSums(len(counts))
        self._first = np.zeros(len(counts), dtype=np.float64)
        self._started = np.zeros(len(counts), dtype=bool)
        self._rest = [PairwiseSum(max(int(c) - 1, 0)) for c in counts] if self._segments_wanted else []
        self._last = -1
        self.monotonic = monotonic is not False

    def add(self, codes, values) -> None:
        codes = np.asarray(codes, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if self._kahan_wanted:
            self.kahan.add(codes, values)
        if not len(codes) or not self.monotonic:
            return
        if codes[0] < self._last or (np.diff(codes) < 0).any() or np.isnan(values).any():
            if not self._kahan_wanted:
                raise ValueError("the group ids decrease (or a NaN came) where they were said not to")
            self.monotonic = False
            return
        self._last = int(codes[-1])
        cuts = np.flatnonzero(np.diff(codes)) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(codes)]):
            c = int(codes[lo])
            if not self._started[c]:
                self._first[c], self._started[c] = values[lo], True
                lo += 1
            self._rest[c].add(values[lo:hi])

    def result(self) -> np.ndarray:
        if not self.monotonic:
            return self.kahan.result()[0]
        out = np.zeros(len(self.counts), dtype=np.float64)
        for c in np.flatnonzero(self.counts).tolist():
            out[c] = self._first[c] + self._rest[c].result() if self.counts[c] > 1 else self._first[c]
        return out


# --- order statistics by a radix select (partitioned.md §2.1, step 9) ------------------------------------------

RADIX_BITS = 16  # the bits of the float64 keys a pass counts: 65,536 counters per (class, prefix) looked into
DENSE_CELLS = 1 << 18  # cells a pass counts by np.bincount (2 MiB of counters: four classes or prefixes) rather than by a sort
COUNT_LISTS = 16  # partitions' count lists held before they are summed into one
RADIX_HOLD = 1 << 16  # a bucket of at most this many values is taken whole in the next pass, not counted deeper


def float_keys(values: np.ndarray) -> np.ndarray:
    """uint64 keys of float64 values (no NaN) in their numeric order: the sign bit set for a positive value's
    pattern, every bit flipped for a negative one. −0.0 keys just below 0.0: the two are equal numerically and
    the order between them is the one thing the keys add (see RadixSelect)."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    return np.where(bits >> np.uint64(63), ~bits, bits | np.uint64(1 << 63))


def floats_of_keys(keys: np.ndarray) -> np.ndarray:
    """float_keys inverted."""
    keys = np.asarray(keys, dtype=np.uint64)
    return np.where(keys >> np.uint64(63), keys & np.uint64((1 << 63) - 1), ~keys).view(np.float64)


class RadixSelect:
    """Exact order statistics of a column held in partitions, per class, without holding the column: passes over
    the partitions (each fed by `feed`, closed by `end_pass`, repeated while `end_pass` says more are wanted), each
    counting the next RADIX_BITS bits of the values' float_keys under the prefixes chosen so far (counts add over
    partitions, so each partition's pass can run anywhere), until a chosen bucket holds at most `hold` values, which
    the next pass takes whole; at most 64 / RADIX_BITS + 1 passes. Held at once: the counters of the (class, prefix)
    pairs looked into and the values of the held buckets, not the column.

    The first pass counts every class's values (NaN left out, as today's quantiles leave it out), which gives each
    class's n and so the ranks the rule asks for:
    - "nearest": core.groups.nearest_rank (np.quantile(method="inverted_cdf"), numpy's index arithmetic:
      nearest_rank_index) — summary.json's p50/p99, the report's and the wait profile's percentiles;
    - "linear": decompose._group_quantiles (pandas' groupby quantile: the value at the truncated position q × (n − 1)
      plus the step to the next one times the fraction, when there is one) — the execution estimates.
    `result()` is one array per q of the classes' values (NaN for a class without any), the same floats as those
    functions but for the sign of a zero: where −0.0 and 0.0 both occur, numpy's partition returns either at a rank
    they share, depending on where they lie in the column (no partitioned route can know it); here −0.0 ranks first."""

    def __init__(self, classes: int, qs, rule: str = "nearest", hold: int = RADIX_HOLD):
        if rule not in ("nearest", "linear"):
            raise ValueError(f"rule {rule!r}: 'nearest' or 'linear'")
        self.classes, self.qs, self.rule, self.hold = classes, tuple(float(q) for q in qs), rule, hold
        self.passes = 0
        self.n = np.zeros(classes, dtype=np.int64)  # each class's non-NaN values, known after the first pass
        self._level = 0  # the bits of the keys fixed by the passes so far, in RADIX_BITS
        self._counts: list[tuple[np.ndarray, np.ndarray]] = []  # this pass's (cell, count) lists, summed as they come
        self._held: list[tuple[np.ndarray, np.ndarray]] = []  # this pass's (group, key) of the held buckets' values
        # the targets (a class's rank wanted), known after the first pass: class, rank left inside the prefix,
        # prefix, whether its bucket is held whole this pass, and the key once found
        self._t_class = self._t_rank = self._t_prefix = self._t_held = self._t_key = None
        self._done = False

    # -- a pass ----------------------------------------------------------------------------------------------

    def feed(self, values, classes=None) -> None:
        """One partition's values (and their class codes 0 … classes − 1; None: every value is of class 0) in this
        pass. Any partitions, in any order, each once per pass."""
        if self._done:
            raise ValueError("every rank is found: no pass is wanted")
        values = np.asarray(values, dtype=np.float64).ravel()
        codes = (np.zeros(len(values), np.int64) if classes is None
                 else np.asarray(classes, dtype=np.int64).ravel())
        _check_codes(codes, values, self.classes)
        present = ~np.isnan(values)
        keys, codes = float_keys(values[present]), codes[present]
        if self._level == 0:  # the first pass: every class, the top bits
            digit = (keys >> np.uint64(64 - RADIX_BITS)).astype(np.int64)
            self._count(*_cell_counts(codes << RADIX_BITS | digit, self.classes << RADIX_BITS))
            return
        group = self._groups_of(codes, keys)
        mine = group >= 0
        group, keys = group[mine], keys[mine]
        held = self._g_held[group]
        if held.any():
            self._held.append((group[held], keys[held]))
        counted = ~held
        if counted.any():
            shift = np.uint64(64 - RADIX_BITS * (self._level + 1))
            digit = ((keys[counted] >> shift) & np.uint64((1 << RADIX_BITS) - 1)).astype(np.int64)
            self._count(*_cell_counts(group[counted] << RADIX_BITS | digit, len(self._g_index) << RADIX_BITS))

    def _count(self, cells: np.ndarray, counts: np.ndarray) -> None:
        """A partition's counts added: the lists are summed into one every COUNT_LISTS, so what is held is the
        distinct cells of the pass, not a list per partition."""
        self._counts.append((cells, counts))
        if len(self._counts) >= COUNT_LISTS:
            self._counts = [_summed(self._counts)]

    def end_pass(self) -> bool:
        """Closes the pass; True while another pass over the partitions is wanted."""
        if self._done:
            raise ValueError("every rank is found: no pass is wanted")
        self.passes += 1
        if self._level == 0:
            self._first_pass_done()
        else:
            self._pass_done()
        self._counts, self._held = [], []
        self._level += 1
        self._done = bool(self._t_key is None or (self._t_key != _NO_KEY).all())
        if not self._done:
            self._make_groups()
        return not self._done

    # -- the bookkeeping -------------------------------------------------------------------------------------

    def _first_pass_done(self) -> None:
        cells, counts = _summed(self._counts)
        cls, digit = cells >> RADIX_BITS, cells & ((1 << RADIX_BITS) - 1)
        self.n = np.zeros(self.classes, dtype=np.int64)
        np.add.at(self.n, cls, counts)
        t_class, t_rank = self._targets()
        self._t_class, self._t_rank = t_class, t_rank
        self._t_prefix = np.zeros(len(t_class), dtype=np.uint64)
        self._t_key = np.full(len(t_class), _NO_KEY, dtype=np.uint64)
        # per target: its class's cells in digit order (cells are sorted by class, then digit)
        self._descend(t_rank, cells, counts, np.searchsorted(cells, t_class << RADIX_BITS),
                      np.searchsorted(cells, (t_class + 1) << RADIX_BITS), digit)

    def _pass_done(self) -> None:
        held, counted = self._held, self._counts
        active = np.flatnonzero(self._t_key == _NO_KEY)
        if held:
            group = np.concatenate([p[0] for p in held])
            keys = np.concatenate([p[1] for p in held])
            order = np.lexsort((keys, group))
            group, keys = group[order], keys[order]
            for t in active[self._t_held[active]]:
                g = self._t_group[t]
                start = np.searchsorted(group, g)
                self._t_key[t] = keys[start + self._t_rank[t]]
        elif (self._t_held[active]).any():
            raise ValueError("a held bucket came back empty: the partitions fed differ from the first pass's")
        counting = active[~self._t_held[active]]
        if len(counting):
            cells, counts = _summed(counted)
            g = self._t_group[counting]
            self._descend_some(counting, cells, counts, np.searchsorted(cells, g << RADIX_BITS),
                               np.searchsorted(cells, (g + 1) << RADIX_BITS))

    def _descend_some(self, targets, cells, counts, lo, hi) -> None:
        digit = cells & ((1 << RADIX_BITS) - 1)
        ranks = self._t_rank[targets]
        self._descend(ranks, cells, counts, lo, hi, digit, targets)

    def _descend(self, ranks, cells, counts, lo, hi, digit, targets=None) -> None:
        """Each target's bucket in this pass's counts (its cells are cells[lo:hi], in digit order): the digit where
        the running count passes its rank, the rank left inside, and whether that bucket is held whole next."""
        targets = np.arange(len(ranks)) if targets is None else targets
        level = self._level
        for t, rank, a, b in zip(targets.tolist(), ranks.tolist(), lo.tolist(), hi.tolist()):
            running = np.cumsum(counts[a:b])
            if not len(running) or rank >= running[-1]:
                raise ValueError("a rank beyond the values counted: the partitions fed differ between passes")
            at = int(np.searchsorted(running, rank, side="right"))
            before = int(running[at - 1]) if at else 0
            d = int(digit[a + at])
            self._t_rank[t] = rank - before
            prefix = (int(self._t_prefix[t]) << RADIX_BITS) | d
            self._t_prefix[t] = np.uint64(prefix)
            if RADIX_BITS * (level + 1) >= 64:  # every bit fixed: the key itself
                self._t_key[t] = np.uint64(prefix)
            else:
                self._t_held[t] = int(counts[a + at]) <= self.hold

    def _targets(self) -> tuple[np.ndarray, np.ndarray]:
        """(class, rank) of every rank the rule reads, for the classes with values; the held flags made too."""
        has = np.flatnonzero(self.n > 0)
        t_class, t_rank = [], []
        for q in self.qs:
            if self.rule == "nearest":
                for c, n in zip(has.tolist(), self.n[has].tolist()):
                    t_class.append(c)
                    t_rank.append(int(nearest_rank_index(n, [q])[0]))
            else:
                position = q * (self.n[has] - 1).astype(np.float64)
                at = position.astype(np.int64)
                t_class += [*has.tolist(), *has[position % 1 != 0].tolist()]
                t_rank += [*at.tolist(), *(at[position % 1 != 0] + 1).tolist()]
        self._t_held = np.zeros(len(t_class), dtype=bool)
        return np.array(t_class, dtype=np.int64), np.array(t_rank, dtype=np.int64)

    def _make_groups(self) -> None:
        """The (class, prefix) pairs the next pass looks into, numbered; each active target's number."""
        active = np.flatnonzero(self._t_key == _NO_KEY)
        pairs = pd.MultiIndex.from_arrays([self._t_class[active], self._t_prefix[active]])
        self._g_index = pairs.unique()
        self._t_group = np.full(len(self._t_class), -1, dtype=np.int64)
        self._t_group[active] = self._g_index.get_indexer(pairs)
        self._g_held = np.zeros(len(self._g_index), dtype=bool)
        self._g_held[self._t_group[active]] = self._t_held[active]
        self._g_prefixes = np.unique(self._t_prefix[active])
        self._g_packed = None
        if self._packs():  # (class, prefix) as one int64: a sorted search instead of the index's lookup
            packed = self._packed(self._g_index.get_level_values(0).to_numpy(np.int64),
                                  self._g_index.get_level_values(1).to_numpy(np.uint64))
            order = np.argsort(packed)
            self._g_packed, self._g_packed_ids = packed[order], order

    def _packs(self) -> bool:
        return self.classes <= 1 << (63 - RADIX_BITS * self._level)

    def _packed(self, codes: np.ndarray, prefix: np.ndarray) -> np.ndarray:
        return codes << (RADIX_BITS * self._level) | prefix.astype(np.int64)

    def _groups_of(self, codes: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Each value's group of this pass (−1: none looks into its (class, prefix))."""
        prefix = keys >> np.uint64(64 - RADIX_BITS * self._level)
        group = np.full(len(keys), -1, dtype=np.int64)
        if self._g_packed is not None:
            packed = self._packed(codes, prefix)
            at = np.minimum(np.searchsorted(self._g_packed, packed), len(self._g_packed) - 1)
            found = self._g_packed[at] == packed
            group[found] = self._g_packed_ids[at[found]]
            return group
        near = np.flatnonzero(np.isin(prefix, self._g_prefixes))
        if len(near):
            group[near] = self._g_index.get_indexer(pd.MultiIndex.from_arrays([codes[near], prefix[near]]))
        return group

    # -- the answer ------------------------------------------------------------------------------------------

    def result(self) -> list[np.ndarray]:
        """Per q, each class's quantile by the rule (NaN for a class without values)."""
        if not self._done:
            raise ValueError(f"the select wants more passes ({self.passes} made)")
        value = floats_of_keys(self._t_key) if len(self._t_key) else np.zeros(0)
        out, at = [], 0
        has = np.flatnonzero(self.n > 0)
        for q in self.qs:
            quantile = np.full(self.classes, np.nan)
            if self.rule == "nearest":
                quantile[has] = value[at:at + len(has)]
                at += len(has)
            else:
                position = q * (self.n[has] - 1).astype(np.float64)
                frac = position % 1
                got = value[at:at + len(has)].copy()
                at += len(has)
                step = np.flatnonzero(frac != 0.0)
                nxt = value[at:at + len(step)]
                at += len(step)
                got[step] = got[step] + (nxt - got[step]) * frac[step]
                quantile[has] = got
            out.append(quantile)
        return out


_NO_KEY = np.uint64(0)  # no float64 has key 0 but the NaN with every bit set, which is never fed


def _cell_counts(cells: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct cells (0 … span − 1) and how many times each occurs, cells ascending: by np.bincount when the
    cells are few enough to count densely (a sort of the piece costs ten times more), else by np.unique."""
    if span <= DENSE_CELLS:
        counts = np.bincount(cells, minlength=span)
        seen = np.flatnonzero(counts)
        return seen, counts[seen]
    return np.unique(cells, return_counts=True)


def _summed(pieces) -> tuple[np.ndarray, np.ndarray]:
    """Partial (cell, count) lists summed by cell, cells ascending."""
    if not pieces:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cells = np.concatenate([p[0] for p in pieces])
    counts = np.concatenate([p[1] for p in pieces])
    cells, inverse = np.unique(cells, return_inverse=True)
    return cells, np.bincount(inverse, weights=counts, minlength=len(cells)).astype(np.int64)


def radix_quantiles(read, classes: int, qs, rule: str = "nearest", hold: int = RADIX_HOLD) -> list[np.ndarray]:
    """RadixSelect over the partitions `read()` yields afresh for each pass: (values, class codes or None) pairs."""
    select = RadixSelect(classes, qs, rule, hold)
    while True:
        for values, codes in read():
            select.feed(values, codes)
        if not select.end_pass():
            return select.result()
