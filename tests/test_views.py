"""The narrow views (docs/partitioned.md §2.1, step 6) give what the table gave: on real captures, today's
thread-pool rows (threadpool._rows: the timeline's fixed-width arrays, D1 and D4 the table's own memory), likely
waits (on the execution classes numbered once, int32) and slow-log join slots (made once per distinct statement)
against the functions they replaced (tests/views_before.py), on every call an analysis makes. The bundled sets
hold stalls, a thread limit, slow logs of several forms, mid-stream connections without an id and TLS; the 10 s
read-write benchmark recording (when present) holds 136,000 exchanges."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from views_before import SlotsBefore, class_codes_before, likely_waits_before, rows_before

CAPTURES = Path(__file__).resolve().parents[1] / "captures"
BENCH = Path("/tmp/pcapdecomp-bench")
BUNDLED = ["group-stall", "maxthreads", "maxthreads-below-lqt", "field-pool-before-capture", "field-default-stall",
           "midstream-join", "oltp-hogs", "oltp-prepared", "slowlog-forms", "features", "group-stall-tls13",
           "stall-fix-1-pool"]
RECORDINGS = ["sysbench-rw-10s"]  # the read-write one: slow-log entries on prepared statements, rows without a
# server time; the read-only one adds time, not cases
THRESHOLD_NS = 100_000_000


def handed(set_dir: Path) -> dict:
    """Run `analyze` on the set, keeping what it handed likely_waits, the thread-pool view and the slow-log join
    (each call's inputs, copied where the caller changes them afterwards) and what likely_waits gave."""
    from pcapdecomp import analysis
    from pcapdecomp.explain import decompose as dec
    from pcapdecomp.explain import servers

    got: dict[str, list] = {"tables": [], "likely": [], "views": [], "joins": []}
    real = {"decompose": servers.decompose, "likely": dec.likely_waits, "view": servers.thread_pool_view,
            "join": dec.join_slow_log}

    def decompose(table, *a, **k):
        got["tables"].append(table[["command", "fingerprint", "_d1_raw", "_d4_raw", "_t_valid"]].copy())
        return real["decompose"](table, *a, **k)

    def likely(times, classes, server, exec_s, measured, open_):
        out = real["likely"](times, classes, server, exec_s, measured, open_)
        got["likely"].append((got["tables"][-1], classes, server.copy(), exec_s.copy(), measured.copy(),
                              open_.copy(), out))
        return out

    def view(table, *a, **k):
        got["views"].append(table.copy(deep=False))
        return real["view"](table, *a, **k)

    def join(rows, slow, *a, **k):
        got["joins"].append((rows, slow))
        return real["join"](rows, slow, *a, **k)

    servers.decompose, dec.likely_waits, servers.thread_pool_view, dec.join_slow_log = \
        decompose, likely, view, join
    try:
        with tempfile.TemporaryDirectory() as out:
            analysis.analyze(set_dir, analysis.Options(quiet=True), Path(out))
    finally:
        servers.decompose, dec.likely_waits, servers.thread_pool_view, dec.join_slow_log = \
            real["decompose"], real["likely"], real["view"], real["join"]
    return got


def _sets():
    yield from (pytest.param(CAPTURES / name, id=name) for name in BUNDLED)
    for name in RECORDINGS:
        yield pytest.param(BENCH / name, id=name, marks=pytest.mark.skipif(
            not (BENCH / name / "db.pcap").exists(), reason=f"{BENCH / name} not recorded on this machine"))


@pytest.mark.parametrize("set_dir", list(_sets()))
def test_the_narrow_views_give_what_the_table_gave(set_dir):
    got = handed(set_dir)
    assert got["likely"] and got["views"], "the analysis made no decomposition"

    # likely waits: the classes numbered once (int32) as they were numbered inside, and the same waits
    for table, classes, server, exec_s, measured, open_, out in got["likely"]:
        codes, count = classes
        before_codes, before_count = class_codes_before(table["command"], table["fingerprint"])
        assert codes.dtype == np.int32 and count == before_count and np.array_equal(codes, before_codes)
        rows, typical, p90 = likely_waits_before(table, server, exec_s, measured, open_)
        assert np.array_equal(out.rows, rows)
        assert np.array_equal(out.exec_s, typical, equal_nan=True)
        assert np.array_equal(out.p90, p90, equal_nan=True)

    # the thread-pool timeline: every array as _rows made it column by column
    from pcapdecomp.explain.threadpool import _rows

    for table in got["views"]:
        r, outliers, t0, t1 = _rows(table, THRESHOLD_NS)
        want, want_outliers, want_t0, want_t1 = rows_before(table, THRESHOLD_NS)
        assert (t0, t1) == (want_t0, want_t1) and np.array_equal(outliers, want_outliers)
        assert len(r.pos) > 0
        for name, values in want.items():
            mine = getattr(r, name)
            assert mine.shape == values.shape and np.array_equal(mine, values), name
        assert np.array_equal(r.groups(3), np.where(want["conn"] >= 0, want["conn"] % 3, -1))
        if len(r.pos) == len(table):  # every row in the timeline: D1 and D4 are the table's times, not copies
            assert np.shares_memory(r.d1, table["db_req_ts"].array.asi8)
            assert np.shares_memory(r.d4, table["db_resp_ts"].array.asi8)

    # the slow-log join's slots: made once per distinct statement, the same slots, keys and order as row by row
    from pcapdecomp.slowlog import join as slowjoin

    for rows, slow in got["joins"]:
        if slow is None or not len(slow):
            continue
        R = slowjoin._Rows(rows)
        templates, entries = slowjoin._Templates(R), slowjoin._Entries(slow)
        reads = templates.reads(entries)
        wanted = slowjoin._Wanted(R, entries, reads)
        slots, before = slowjoin._Slots(R, templates, wanted), SlotsBefore(R, templates, wanted)
        assert len(before.row) > 0
        assert list(slots.row) == list(before.row) and slots.k == before.k
        assert slots.keys == before.keys and slots.text_of == before.text_of
        assert dict(slots.by_key) == dict(before.by_key) and slots.cut_prefixes == before.cut_prefixes
