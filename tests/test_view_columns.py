"""The thread-pool view as the partitioned run calls it (docs/partitioned.md §17): handed only the columns it reads
of every row (run/spilled.py VIEW_COLUMNS), its references' other columns read at the referenced rows alone
(threadpool.FetchingRefs), and no per-row column made of every row (`per_row=False`: the stalls' members and the
unheld rows instead, stall_marks) — against the view of the whole table, on the tables the in-memory analysis hands
it: the same pool and group tables, the same summary.json parts (references included), the same stall, role and
queue_source of every row. The bundled sets hold stalls with culprits, a thread limit (maxthreads), an inferred size
and likely waits found not held on their group."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcapdecomp.explain.threadpool import REF_COLUMNS, FetchingRefs, Refs, stall_marks, thread_pool_view
from pcapdecomp.run.spilled import VIEW_COLUMNS, VIEW_REF_COLUMNS

CAPTURES = Path(__file__).resolve().parents[1] / "captures"
SETS = ["group-stall", "oltp-hogs", "maxthreads", "maxthreads-below-lqt", "field-default-stall", "stall-fix-1-pool",
        "midstream-join", "features"]
# a thread_pool_size given wrong (as a user may): likely waits with no long statement on their group, relabelled
# 'estimated' by the view (no bundled set's own size finds one)
WRONG_SIZES = [("oltp-hogs", 3), ("stall-fix-1-pool", 5), ("field-default-stall", 2)]


_HANDED: dict[str, list] = {}


def handed(name: str) -> list[tuple[pd.DataFrame, int | None]]:
    """The tables (and the size) `analyze` hands the thread-pool view on a bundled set, one per DB point (kept for
    the next test of the set)."""
    from pcapdecomp import analysis
    from pcapdecomp.explain import servers

    if name not in _HANDED:
        got: list = []
        with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as out:
            real = servers.thread_pool_view
            patch.setattr(servers, "thread_pool_view",
                          lambda table, size, *a, **k: got.append((table.copy(), size)) or real(table, size, *a, **k))
            analysis.analyze(CAPTURES / name, analysis.Options(quiet=True), Path(out))
        _HANDED[name] = got
    return _HANDED[name]


def narrow_view(table: pd.DataFrame, size: int | None, fetched: list):
    """The view as run/spilled.py calls it: VIEW_COLUMNS alone, the other reference columns fetched by position."""
    def fetch(positions):
        fetched.append(list(positions))
        return table.take(positions).reset_index(drop=True)

    more = {c: d for c, d in table.dtypes.items() if c in VIEW_REF_COLUMNS}
    narrow = table[[c for c in VIEW_COLUMNS if c in table.columns]].copy()
    return thread_pool_view(narrow, size, refs=lambda t: FetchingRefs(t, fetch, more), per_row=False)


def as_json(part) -> str:
    return json.dumps(part, sort_keys=False, default=str)


@pytest.mark.parametrize("name,given", [(name, None) for name in SETS] + WRONG_SIZES)
def test_the_view_of_the_view_columns_is_the_view_of_the_table(name, given):
    cases = handed(name)
    assert cases
    for table, size in cases:
        size = given or size
        whole = thread_pool_view(table.copy(), size)
        fetched: list = []
        narrow = narrow_view(table, size, fetched)
        pd.testing.assert_frame_equal(narrow.pool, whole.pool, check_exact=True)
        pd.testing.assert_frame_equal(narrow.groups, whole.groups, check_exact=True)
        for part in ("thread_pool_size", "pool_summary", "groups_summary"):
            assert as_json(getattr(narrow, part)) == as_json(getattr(whole, part)), part
        assert narrow.warnings == whole.warnings
        assert len(narrow.stall_members) == len(whole.stall_members)
        for (v, c), (wv, wc) in zip(narrow.stall_members, whole.stall_members):
            assert np.array_equal(v, wv) and np.array_equal(c, wc)
        assert narrow.thread_group is narrow.stall is narrow.stall_role is narrow.queue_source is None
        # the per-row columns the partitions set from what the view names: the whole view's
        rows, stall, role = stall_marks(narrow.stall_members)
        dense_stall = np.full(len(table), -1, np.int64)
        dense_role = np.full(len(table), None, dtype=object)
        dense_stall[rows], dense_role[rows] = stall, role
        assert np.array_equal(dense_stall, whole.stall.fillna(-1).to_numpy(dtype=np.int64))
        assert dense_role.tolist() == whole.stall_role.astype(object).where(whole.stall_role.notna(), None).tolist()
        if whole.queue_source is not None:
            relabelled = table["queue_source"].astype(object).to_numpy(copy=True)
            relabelled[narrow.unheld] = "estimated"
            assert pd.Series(relabelled, dtype=object).equals(whole.queue_source.astype(object))
        else:
            assert not len(narrow.unheld)
        # the other columns were read at the referenced rows alone, each row once
        read = [p for batch in fetched for p in batch]
        assert len(read) == len(set(read)) <= 5 * len(whole.stall_members) + 40


def test_the_sets_exercise_stalls_the_cap_and_unheld_waits():
    """The cases above are not vacuous: stalls with culprits referenced, the thread limit's references, likely waits
    found not held (the relabelling by codes)."""
    seen = {"stalls": 0, "cap": 0, "unheld": 0}
    for name, given in (("group-stall", None), ("maxthreads", None), ("oltp-hogs", 3)):
        for table, size in handed(name):
            view = narrow_view(table, given or size, [])
            seen["stalls"] += sum(bool(s["culprits"]) for s in view.groups_summary["stalls"])
            seen["cap"] += view.pool_summary["cap"] is not None
            seen["unheld"] += len(view.unheld)
    assert all(seen.values()), seen


def test_fetching_refs_are_the_refs_of_the_whole_table():
    """Every reference column, at rows of every kind (nulls, ENCRYPTED, in and out of the slow log), read from the
    fetched rows by Refs' own rules: the same values; a row not prefetched is fetched when referenced; a whole
    column of the fetched ones is refused (it is not held)."""
    (table, _), *_ = handed("group-stall")
    rng = np.random.default_rng(0)
    positions = sorted(rng.choice(len(table), 60, replace=False).tolist())
    whole = Refs(table)
    more = {c: d for c, d in table.dtypes.items() if c in VIEW_REF_COLUMNS}
    narrow = FetchingRefs(table[list(VIEW_COLUMNS)].copy(), lambda at: table.take(at).reset_index(drop=True), more)
    narrow.prefetch([np.array(positions[:30])])
    assert [narrow.ref(p) for p in positions] == [whole.ref(p) for p in positions]
    assert set(REF_COLUMNS) <= set(VIEW_COLUMNS) | set(VIEW_REF_COLUMNS)
    with pytest.raises(KeyError):
        narrow.array("sql")


def test_stall_marks_victims_first():
    """A row that is a culprit of stall 0 and a victim of stall 1 is stall 1's victim; a culprit of two stalls is
    the first's; a victim of two stalls the last's."""
    members = [(np.array([1, 2]), np.array([5, 7])), (np.array([5, 2]), np.array([7, 9]))]
    rows, stall, role = stall_marks(members)
    assert rows.tolist() == [1, 2, 5, 7, 9]
    assert stall.tolist() == [0, 1, 1, 0, 1]
    assert role.tolist() == ["victim", "victim", "victim", "culprit", "culprit"]
    rows, stall, role = stall_marks([])
    assert len(rows) == len(stall) == len(role) == 0
