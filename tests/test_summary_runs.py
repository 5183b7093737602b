"""summary.json's parts from the partitions' runs (explain.summaryruns, docs/partitioned.md step 7c): `analyze`
of a capture set, its final table cut into P = 1, 3, 16 partitions by the plan's key (§3) as test_merged_writer
cuts it, each sorted by the row key; the runs' summary parts (counts, conn_ids, latency_s, queueing, hidden_slow,
understated), the rows streamed in row order by the merged writer or the merge alone, must be the file analyze
wrote, as JSON text; then summary.json whole (summary.build and stories.tell from the runs: the verdict's story
and text, connections, network, playbook) must be the file, as JSON text. The pool view's outliers, stall culprits,
stall members and cap members are handed in by row key, as the view found them (the analysis' own view, taken where
summary.build receives it)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.explain import servers
from pcapdecomp.explain.summary import to_json
from pcapdecomp.explain.summaryruns import SeveralServers, SummaryOfRuns, summary_of_runs

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
RECORDINGS = Path("/tmp/pcapdecomp-bench")
_spec = importlib.util.spec_from_file_location("merged_writer", REPO / "benchmarks" / "merged_writer.py")
merged_writer = sys.modules.get("merged_writer") or importlib.util.module_from_spec(_spec)
if "merged_writer" not in sys.modules:
    sys.modules["merged_writer"] = merged_writer  # its dataclass looks its module up by name
    _spec.loader.exec_module(merged_writer)

PAIRS = sorted(p.name for p in CAPTURES.iterdir() if (p / "app.pcap").exists() and (p / "db.pcap").exists())
PARTS = (1, 3, 16)
PART_KEYS = ("exchanges", "conn_ids", "latency_s", "queueing", "hidden_slow", "understated")


def analysed(cs, options: Options, out: Path, monkeypatch) -> tuple[dict, object, object]:
    """analyze of `cs` into `out`: (summary.json as written, the table and the pool view summary.build was
    handed)."""
    handed = {}
    build = servers.build_summary

    def build_and_keep(*args, **kwargs):
        handed.update(kwargs)
        return build(*args, **kwargs)

    monkeypatch.setattr(servers, "build_summary", build_and_keep)
    analyze(cs, options, out)
    monkeypatch.setattr(servers, "build_summary", build)
    assert len(handed["servers"]) == 1
    return json.loads((out / "summary.json").read_text()), handed["exchanges"], handed["servers"][0].view


def check(cs, options: Options, work: Path, monkeypatch, parts=PARTS) -> dict:
    """The runs' parts equal summary.json's for each P; returns the file's summary."""
    written, table, view = analysed(cs, options, work / "out", monkeypatch)
    keys = merged_writer.paired_inputs(cs, options).keys
    assert len(keys) == len(table)
    outliers = keys[np.asarray(view.outliers, dtype=np.int64)]
    culprits = [keys[np.asarray(c, dtype=np.int64)] for _, c in view.stall_members]
    wanted = to_json({k: written[k] for k in PART_KEYS})
    for p in parts:
        runs = merged_writer.sorted_runs(table, keys, p, seed=p)
        assert to_json(summary_of_runs(runs, outliers, culprits)) == wanted, p
    return written


@pytest.mark.parametrize("name", PAIRS)
def test_bundled_sets(tmp_path, monkeypatch, name):
    check(capture_set(CAPTURES / name), Options(quiet=True, jobs=1), tmp_path, monkeypatch)


def test_bundled_set_without_slow_log_and_pool_size(tmp_path, monkeypatch):
    """group-stall's captures alone: no slow log, the pool size inferred."""
    cs = capture_set(app=[CAPTURES / "group-stall" / "app.pcap"], db=CAPTURES / "group-stall" / "db.pcap")
    written = check(cs, Options(quiet=True, jobs=1), tmp_path, monkeypatch)
    assert written["inputs"]["slow_log"] is None


def test_db_capture_alone(tmp_path, monkeypatch):
    """oltp-hogs' DB capture alone, with its slow log: every row only at the DB."""
    source = CAPTURES / "oltp-hogs"
    cs = capture_set(db=source / "db.pcap", slow_log=source / "slow.log", long_query_time=0.01, thread_pool_size=4)
    written = check(cs, Options(quiet=True, jobs=1), tmp_path, monkeypatch)
    assert written["exchanges"]["seen_db"] == written["exchanges"]["total"] > 0


def test_test_data_pair(tmp_path, monkeypatch):
    field = REPO / "tests" / "data" / "field"
    cs = capture_set(app=[field / "one-connection-app.pcap"], db=field / "one-connection-db.pcap", thread_pool_size=2)
    check(cs, Options(quiet=True, jobs=1), tmp_path, monkeypatch)


def test_the_lists_are_not_empty_somewhere(tmp_path, monkeypatch):
    """The sets whose lists the checks above compare are not all empty: victims grouped by a stall with culprits,
    and more victims than are listed (the top-k cut falls among the candidates)."""
    written = check(capture_set(CAPTURES / "group-stall"), Options(quiet=True, jobs=1), tmp_path, monkeypatch)
    lists = [written[k] for k in ("hidden_slow", "understated")]
    assert any(s["culprits"] for w in lists for s in w["by_stall"])
    assert sum(w["count"] for w in lists) > 0


def test_the_writer_hook_streams_the_sums(tmp_path, monkeypatch):
    """The parts fed by write_merged's merged_rows hook are the same, and the file is the one analyze wrote."""
    import filecmp

    cs = capture_set(CAPTURES / "oltp-hogs")
    options = Options(quiet=True, jobs=1)
    written, table, view = analysed(cs, options, tmp_path / "out", monkeypatch)
    inputs = merged_writer.paired_inputs(cs, options)
    categories = merged_writer.categories_of(table, inputs)
    from pcapdecomp.core.outputs import write_merged

    for p in (1, 16):
        runs = merged_writer.sorted_runs(table, inputs.keys, p, seed=p)
        made = SummaryOfRuns(runs, inputs.keys[view.outliers],
                             [inputs.keys[np.asarray(c, dtype=np.int64)] for _, c in view.stall_members])
        write_merged(runs, tmp_path / "merged.parquet", categories, made.feed)
        assert filecmp.cmp(tmp_path / "out" / "exchanges.parquet", tmp_path / "merged.parquet", shallow=False)
        assert to_json(made.parts()) == to_json({k: written[k] for k in PART_KEYS})


def test_rows_fed_out_of_order_change_the_sums(tmp_path, monkeypatch):
    """The sums are made in row order: the same rows fed partition by partition (P = 16) give another float for
    some latency sum of the 10 s-like oltp-hogs set, so the check above can fail."""
    cs = capture_set(CAPTURES / "oltp-hogs")
    options = Options(quiet=True, jobs=1)
    written, table, view = analysed(cs, options, tmp_path / "out", monkeypatch)
    keys = merged_writer.paired_inputs(cs, options).keys
    runs = merged_writer.sorted_runs(table, keys, 16, seed=16)
    made = SummaryOfRuns(runs, keys[view.outliers])
    for r, run in enumerate(runs):  # run after run: not row order
        made.feed(np.full(len(run.key), r, dtype=np.int64), np.arange(len(run.key), dtype=np.int64))
    got = made.parts()["latency_s"]
    assert any(got[c]["sum"] != written["latency_s"][c]["sum"] for c in got if got[c] is not None)


def test_outliers_handed_in_count(tmp_path, monkeypatch):
    """A row handed in as an outlier leaves the victims' count it was in."""
    cs = capture_set(CAPTURES / "group-stall")
    options = Options(quiet=True, jobs=1)
    written, table, view = analysed(cs, options, tmp_path / "out", monkeypatch)
    keys = merged_writer.paired_inputs(cs, options).keys
    flag = next(f for f in ("hidden_slow", "understated") if written[f]["count"])
    flagged = np.flatnonzero(table[flag].to_numpy(dtype=bool, na_value=False))
    runs = merged_writer.sorted_runs(table, keys, 3)
    more = np.concatenate([keys[np.asarray(view.outliers, dtype=np.int64)], keys[flagged[:1]]])
    got = summary_of_runs(runs, more)
    assert got[flag]["count"] == written[flag]["count"] - 1


def test_several_servers_refused(bundled_analysis):
    table = bundled_analysis("oltp-hogs").held_exchanges
    keys = np.zeros((len(table), 7), dtype=np.int64)
    keys[:, -1] = np.arange(len(table))
    table["db_point"] = np.where(np.arange(len(table)) % 2, "a.pcap", "b.pcap")
    from pcapdecomp.core.outputs import SortedRun

    with pytest.raises(SeveralServers):
        SummaryOfRuns([SortedRun(table, keys)])


@pytest.mark.parametrize("name", ["sysbench-rw-10s", "sysbench-10s"])
def test_recordings(tmp_path, monkeypatch, name):
    folder = RECORDINGS / name
    if not (folder / "db.pcap").exists():
        pytest.skip(f"{folder}: the recording is not on this machine")
    cs = capture_set(app=[folder / "app.pcap"], db=folder / "db.pcap", slow_log=folder / "slow.log",
                     long_query_time=0.01, thread_pool_size=2)
    check(cs, Options(quiet=True, jobs=1), tmp_path, monkeypatch)


# --- the whole summary.json: the verdict's story and text, the stories (the rules' facts, terms and rows) -------


def built_and_handed(cs, options: Options, out: Path, monkeypatch) -> tuple[dict, dict]:
    """analyze of `cs`: (what summary.build returned, before the stories were told; the arguments summary.build
    and stories.tell were handed)."""
    import copy

    handed: dict = {}
    returned: dict = {}
    build, stories = servers.build_summary, servers.tell_stories

    def build_and_keep(*args, **kwargs):
        handed.update(kwargs, cs=args[0])
        made = build(*args, **kwargs)
        returned.update(copy.deepcopy(made))
        return made

    def tell_and_keep(summary, x, conns, settings=None, runs=None):
        handed.update(conns=conns, settings=settings)
        return stories(summary, x, conns, settings, runs=runs)

    monkeypatch.setattr(servers, "build_summary", build_and_keep)
    monkeypatch.setattr(servers, "tell_stories", tell_and_keep)
    analyze(cs, options, out)
    monkeypatch.setattr(servers, "build_summary", build)
    monkeypatch.setattr(servers, "tell_stories", stories)
    return returned, handed


def runs_of(cs, options: Options, handed: dict, p: int) -> SummaryOfRuns:
    """The table summary.build was handed, cut into `p` partitions' runs, and what the pool view found by row key:
    a SummaryOfRuns fed in row order."""
    keys = merged_writer.paired_inputs(cs, options).keys
    table, view = handed["exchanges"], handed["servers"][0].view
    assert len(keys) == len(table)
    rows = lambda positions: keys[np.asarray(positions, dtype=np.int64)]  # noqa: E731
    cap = tuple(rows(m) for m in view.cap_members) if view.cap_members is not None else None
    return SummaryOfRuns(merged_writer.sorted_runs(table, keys, p, seed=p), rows(view.outliers),
                         [rows(c) for _, c in view.stall_members], stall_victims=[rows(v) for v, _ in
                                                                                  view.stall_members],
                         cap_members=cap).feed_all()


def summary_of(handed: dict, made: SummaryOfRuns) -> dict:
    """summary.json's whole content from the runs: summary.build, then the stories told."""
    from pcapdecomp.explain.stories import tell
    from pcapdecomp.explain.summary import build

    kwargs = {k: v for k, v in handed.items() if k not in ("cs", "conns", "settings")}
    summary = build(handed["cs"], **{**kwargs, "exchanges": None, "runs": made})
    tell(summary, None, handed["conns"], handed["settings"], runs=made)
    return summary


def check_whole(cs, options: Options, work: Path, monkeypatch, parts=PARTS) -> dict:
    """summary.json made from the runs (summary.build and the stories) is the file analyze wrote, as JSON text,
    for each P; through a proxy it is refused."""
    from pcapdecomp.explain.summary import NotFromRuns

    _, handed = built_and_handed(cs, options, work / "out", monkeypatch)
    written = (work / "out" / "summary.json").read_text()
    if handed["through_proxy"]:
        with pytest.raises(NotFromRuns, match="through a proxy"):
            summary_of(handed, runs_of(cs, options, handed, 1))
        return json.loads(written)
    for p in parts:
        assert to_json(summary_of(handed, runs_of(cs, options, handed, p))) == written, p
    return json.loads(written)


@pytest.mark.parametrize("name", PAIRS)
def test_summary_json_of_bundled_sets(tmp_path, monkeypatch, name):
    check_whole(capture_set(CAPTURES / name), Options(quiet=True, jobs=1), tmp_path, monkeypatch)


def test_summary_json_without_slow_log_and_pool_size(tmp_path, monkeypatch):
    """group-stall's captures alone: no slow log, the pool size inferred."""
    cs = capture_set(app=[CAPTURES / "group-stall" / "app.pcap"], db=CAPTURES / "group-stall" / "db.pcap")
    written = check_whole(cs, Options(quiet=True, jobs=1), tmp_path, monkeypatch)
    assert written["inputs"]["slow_log"] is None and written["thread_pool_size"]["given"] is None


def test_summary_json_of_db_capture_alone(tmp_path, monkeypatch):
    """oltp-hogs' DB capture alone, with its slow log: no clients' time, no network story."""
    source = CAPTURES / "oltp-hogs"
    cs = capture_set(db=source / "db.pcap", slow_log=source / "slow.log", long_query_time=0.01, thread_pool_size=4)
    written = check_whole(cs, Options(quiet=True, jobs=1), tmp_path, monkeypatch)
    assert written["network"] is None and written["story"]["sentence"]


def test_summary_json_of_test_data_pair(tmp_path, monkeypatch):
    """One connection: its rows in row order are one group's, so pandas sums its network time by np.add.reduceat,
    not by its Kahan kernel (GroupbySums takes the same route)."""
    field = REPO / "tests" / "data" / "field"
    cs = capture_set(app=[field / "one-connection-app.pcap"], db=field / "one-connection-db.pcap", thread_pool_size=2)
    written = check_whole(cs, Options(quiet=True, jobs=1), tmp_path, monkeypatch)
    assert len(written["network"]["connections"]) == 1


def test_the_stories_are_told_somewhere(tmp_path, monkeypatch):
    """The bundled sets compared above tell each kind of sentence and story the runs make: the cap, a stall with
    culprits, likely waits, an idle pool; refused logins, churn, idle closes; the network leading; a playbook line
    from a stall's usual execution."""
    found = set()
    for name in ("maxthreads", "group-stall", "field-default-stall", "connection-refused", "connection-storm",
                 "network-slow-client", "stall-fix-1-pool", "oltp-hogs"):
        written = json.loads((_analysed_file(name, tmp_path / name)).read_text())
        found |= set(written["story"]["findings"]) | {line["finding"] for line in written["playbook"]}
    assert {"max_threads", "group_stall", "refused", "connection_churn", "stall_limit"} <= found, found


def _analysed_file(name: str, out: Path) -> Path:
    analyze(capture_set(CAPTURES / name), Options(quiet=True, jobs=1), out)
    return out / "summary.json"


@pytest.mark.parametrize("name", ["sysbench-rw-10s", "sysbench-10s"])
def test_summary_json_of_recordings(tmp_path, monkeypatch, name):
    folder = RECORDINGS / name
    if not (folder / "db.pcap").exists():
        pytest.skip(f"{folder}: the recording is not on this machine")
    cs = capture_set(app=[folder / "app.pcap"], db=folder / "db.pcap", slow_log=folder / "slow.log",
                     long_query_time=0.01, thread_pool_size=2)
    written = check_whole(cs, Options(quiet=True, jobs=1), tmp_path, monkeypatch)
    assert written["connections"] is not None and written["network"]["connections"]


def test_the_whole_file_fed_out_of_row_order_differs(tmp_path, monkeypatch):
    """The stories' sums are made in row order: the same rows fed run after run (P = 16) give another summary.json
    of oltp-hogs (its split bullet's, connections' or network's floats), so the checks above can fail."""
    cs = capture_set(CAPTURES / "oltp-hogs")
    options = Options(quiet=True, jobs=1)
    _, handed = built_and_handed(cs, options, tmp_path / "out", monkeypatch)
    keys = merged_writer.paired_inputs(cs, options).keys
    view = handed["servers"][0].view
    runs = merged_writer.sorted_runs(handed["exchanges"], keys, 16, seed=16)
    made = SummaryOfRuns(runs, keys[view.outliers], [keys[np.asarray(c, dtype=np.int64)] for _, c in view.stall_members],
                         stall_victims=[keys[np.asarray(v, dtype=np.int64)] for v, _ in view.stall_members])
    for r, run in enumerate(runs):  # run after run: not row order
        made.feed(np.full(len(run.key), r, dtype=np.int64), np.arange(len(run.key), dtype=np.int64))
    got = json.loads(to_json(summary_of(handed, made)))
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    differ = [k for k in written if got[k] != written[k]]
    assert {"connections", "network"} & set(differ) and set(differ) <= {"latency_s", "queueing", "connections", "network"}, differ
