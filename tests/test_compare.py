"""`pcapdecomp compare` on real recordings: the stall-fix series (captures/stall-fix-*: one workload, three server
settings), an analysis against itself, degenerate analyses, hostile text, and user mistakes.

Every count the comparison shows is recomputed here from the analyses' own files (exchanges.parquet read with
pyarrow, summary.json) or from the lab's ground truth (truth.jsonl, written by the client that sent each
statement), never from compare's output."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import numpy as np
import pandas as pd
import pcaptools as pt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pcapdecomp import cli
from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.compare import compare
from pcapdecomp.core.schema import COMPARISON_COLUMNS, COMPARISON_METRICS

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
SERIES = ["stall-fix-1-pool", "stall-fix-2-thread-per-connection", "stall-fix-3-stall-limit-10"]


@pytest.fixture(scope="module")
def analyses(bundled_analysis) -> dict[str, Path]:
    """The three bundled recordings analysed once, as a user would: `analyze captures/<set>`."""
    return {name: bundled_analysis(name).out_dir for name in SERIES}


@pytest.fixture(scope="module")
def series(analyses, tmp_path_factory):
    return compare([analyses[n] for n in SERIES], tmp_path_factory.mktemp("cmp") / "series", csv=True, quiet=True)


def independent_counts(folder: Path, slow_s: float = 0.1) -> dict:
    """Counts straight from exchanges.parquet (pyarrow, not pandas, not compare.py)."""
    t = pq.read_table(folder / "exchanges.parquet")
    wire = pc.coalesce(t["total_s"], t["server_s"], t["response_s"])

    def true_count(col) -> int:
        return pc.sum(pc.fill_null(t[col], False).cast(pa.int64())).as_py() or 0

    return {"calls": t.num_rows, "slow_wire": pc.sum(pc.greater(wire, slow_s).cast(pa.int64())).as_py() or 0,
            "hidden_slow": true_count("hidden_slow"), "in_slow_log": true_count("in_slow_log"),
            "understated": true_count("understated"), "table": t, "wire": wire}


def rows(c, scope: str, key: str, metric: str) -> pd.DataFrame:
    t = c.table
    return t[(t["scope"] == scope) & (t["key"] == key) & (t["metric"] == metric)].sort_values("step")


# ---- the bundled recordings ------------------------------------------------------------------------------------------
def test_the_three_settings_ran_the_same_workload():
    truth = [pd.read_json(CAPTURES / n / "truth.jsonl", lines=True) for n in SERIES]
    meta = [tomllib.loads((CAPTURES / n / "capture.toml").read_text()) for n in SERIES]
    lookups = [sorted(zip(t.loc[t["role"] == "query", "conn_id"], t.loc[t["role"] == "query", "sql"])) for t in truth]
    assert len(lookups[0]) == 240 and lookups[0] == lookups[1] == lookups[2]  # same connections, same ids
    hogs = [t[t["role"] == "hog"] for t in truth]
    assert [len(h) for h in hogs] == [4, 4, 4] and all(h["conn_id"].mod(2).tolist() == [0, 1, 0, 1] for h in hogs)
    workload = [{k: v for k, v in m["workload"].items() if k != "hog_rounds"} for m in meta]  # calibrated per run
    assert workload[0] == workload[1] == workload[2]
    server = [m["server"] for m in meta]
    assert [s["thread_handling"] for s in server] == ["pool-of-threads", "one-thread-per-connection", "pool-of-threads"]
    assert server[0]["thread_pool_stall_limit"] == 500 and server[2]["thread_pool_stall_limit"] == 10
    assert "thread_pool_size" not in server[1] and truth[1]["thread_group"].isna().all()  # no pool, no groups


def test_the_docs_print_the_declared_tables():
    from pcapdecomp.core.schema import COMPARISON_KEYS, markdown_table

    page = (REPO / "docs" / "compare.md").read_text()
    for table in (COMPARISON_COLUMNS, COMPARISON_METRICS, COMPARISON_KEYS):
        assert markdown_table(table) in page


# ---- the counts are the analyses' counts ----------------------------------------------------------------------------
def test_overall_counts_equal_the_analyses(series, analyses):
    for step, name in enumerate(SERIES):
        mine = independent_counts(analyses[name])
        summary = json.loads((analyses[name] / "summary.json").read_text())
        for metric in ("calls", "slow_wire", "hidden_slow", "in_slow_log", "understated"):
            value = rows(series, "overall", "all", metric)["value"].iloc[step]
            assert value == mine[metric], (name, metric)
        # and analyze's own summary agrees on what it counted
        assert mine["hidden_slow"] == summary["exchanges"]["hidden_slow"]
        assert mine["in_slow_log"] == summary["exchanges"]["in_slow_log"]
        assert mine["calls"] == summary["exchanges"]["total"]
        wire = mine["wire"].to_numpy(zero_copy_only=False).astype(float)
        wire = wire[~np.isnan(wire)]
        assert rows(series, "overall", "all", "p99_s")["value"].iloc[step] == pytest.approx(np.quantile(wire, 0.99, method="inverted_cdf"))  # nearest-rank
        assert rows(series, "overall", "all", "sum_s")["value"].iloc[step] == pytest.approx(wire.sum())
    assert series.counts()["slow_wire"] == [independent_counts(analyses[n])["slow_wire"] for n in SERIES]


def test_per_query_id_thread_group_and_component_equal_the_analyses(series, analyses):
    t = series.table
    for step, name in enumerate(SERIES):
        x = pd.read_parquet(analyses[name] / "exchanges.parquet")
        mine = t[t["step"] == step]
        calls = mine[(mine["scope"] == "query_id") & (mine["metric"] == "calls")].set_index("key")["value"]
        expected = x["query_id"].value_counts()
        assert calls[calls > 0].sort_index().to_dict() == {str(k): float(v) for k, v in expected.sort_index().items()}
        wire = x["total_s"].fillna(x["server_s"]).fillna(x["response_s"])
        if x["thread_group"].notna().any():
            slow = mine[(mine["scope"] == "thread_group") & (mine["metric"] == "slow_wire")].set_index("key")["value"]
            by_group = (wire > 0.1).groupby(x["thread_group"]).sum()
            assert {int(k): v for k, v in slow.items()} == {int(k): float(v) for k, v in by_group.items()}
        else:  # one-thread-per-connection: no groups, nothing claimed per group
            assert mine[mine["scope"] == "thread_group"]["value"].isna().all()
        for key, col in (("network", "network_s"), ("queueing", "queue_s"), ("queueing_certain", "queue_min_s"),
                         ("execution", "exec_s")):
            got = mine[(mine["scope"] == "component") & (mine["key"] == key)].set_index("metric")["value"]
            v = x[col].dropna().to_numpy(float)
            assert got["calls"] == len(v) and got["sum_s"] == pytest.approx(v.sum())
            assert got["p95_s"] == pytest.approx(np.quantile(v, 0.95, method="inverted_cdf"))  # nearest-rank
            assert got["p95_s"] in set(v)  # a value that occurred


def test_changes_rates_and_shares_follow_from_the_values(series):
    t = series.table
    base = t[t["step"] == 0].set_index(["scope", "key", "metric"])["value"]
    later = t[t["step"] > 0]
    before = base.reindex(pd.MultiIndex.from_frame(later[["scope", "key", "metric"]])).to_numpy()
    both = ~np.isnan(before) & later["value"].notna().to_numpy()
    assert np.allclose(later["change"].to_numpy(float)[both], (later["value"].to_numpy(float) - before)[both])
    nonzero = both & (before != 0)
    assert np.allclose(later["change_pct"].to_numpy(float)[nonzero],
                       100 * (later["value"].to_numpy(float) - before)[nonzero] / before[nonzero])
    spans = {a["step"]: a["span_s"] for a in json.loads((series.out_dir / "comparison.json").read_text())["analyses"]}
    slow = t[(t["scope"] == "overall") & (t["metric"] == "slow_wire")]
    for _, r in slow.iterrows():
        assert r["per_second"] == pytest.approx(r["value"] / spans[r["step"]])
    assert set(t["metric"]) <= {m.name for m in COMPARISON_METRICS}


# ---- the bundled series: the fix, in the expected direction ----------------------------------------------------------
def test_the_stall_fix_series_goes_the_expected_way(series):
    truth = [pd.read_json(CAPTURES / n / "truth.jsonl", lines=True) for n in SERIES]
    slow = rows(series, "overall", "all", "slow_wire")["value"].tolist()
    hidden = rows(series, "overall", "all", "hidden_slow")["value"].tolist()
    # the client's own clock (truth.jsonl) agrees on how many waited longer than 100 ms, up to statements within
    # the client's overhead (driver and Python, a few ms) of the threshold
    for value, t in zip(slow, truth):
        near = int(((t["client_s"] - 0.1).abs() < 0.01).sum())
        assert abs(value - int((t["client_s"] > 0.1).sum())) <= near
    assert slow[0] > 5 * slow[1] and slow[0] > 5 * slow[2]  # both fixes remove most slow statements
    assert hidden[0] >= 10 and hidden[1] == 0 and hidden[2] == 0  # and every hidden-slow one
    # the statements still slow afterwards are the hogs themselves: executing slowly, in the slow log
    hogs = [int((t["role"] == "hog").sum()) for t in truth]
    assert slow[1] == slow[2] == hogs[1] == hogs[2]
    assert rows(series, "overall", "all", "in_slow_log")["value"].tolist() == [float(h) for h in hogs]
    certain = rows(series, "component", "queueing_certain", "sum_s")["value"].tolist()
    assert certain[1] < 0.01 * certain[0] and certain[2] < 0.01 * certain[0]
    # the same workload three times: the same statements, the same mix
    assert len(set(rows(series, "overall", "all", "calls")["value"])) == 1
    assert series.comparable and not any(n.kind == "mix" for n in series.notes)
    settings = next(n.text for n in series.notes if n.kind == "settings")
    assert "thread_handling pool-of-threads → one-thread-per-connection → pool-of-threads" in settings
    assert "thread_pool_stall_limit 500 → (not set) → 10" in settings
    assert series.headline[0].startswith(f"exchanges slower than 100 ms on the wire: {slow[0]:,.0f} → {slow[1]:,.0f} (−")


def test_outputs_have_the_declared_columns(series):
    names = [c.name for c in COMPARISON_COLUMNS]
    table = pd.read_parquet(series.out_dir / "comparison.parquet")
    assert list(table.columns) == names
    for col in COMPARISON_COLUMNS:
        assert str(table[col.name].dtype) == col.file_dtype, col.name
    assert list(pd.read_csv(series.out_dir / "comparison.csv").columns) == names
    data = json.loads((series.out_dir / "comparison.json").read_text())
    assert [a["name"] for a in data["analyses"]] == SERIES and data["headline"] == series.headline
    html = (series.out_dir / "comparison.html").read_text()
    assert html.count("Plotly.newPlot") == 1 and "https://" not in html.split("<body", 1)[1]


def _browser_dom(page: Path, tmp: Path) -> str:
    """The page's DOM after its scripts ran, in headless Chromium, through the report tests' helpers."""
    import browser

    return browser.dom_and_console(page, tmp / "profile")[0]


def test_the_page_renders_in_a_browser(series, tmp_path):
    from browser import page_text, script_errors

    dom = _browser_dom(series.out_dir / "comparison.html", tmp_path)
    assert not script_errors(dom), script_errors(dom)
    assert 'data-rendered="3 figures"' in dom and dom.count('class="main-svg"') >= 3
    text = page_text(dom)
    assert series.headline[0] in text and series.headline[1] in text
    slow = rows(series, "overall", "all", "slow_wire")["value"].tolist()
    assert f"{slow[1]:,.0f} (−{slow[0] - slow[1]:,.0f}, −" in text  # the change in the overall table
    for name in SERIES:
        assert name in text


# ---- an analysis against itself ---------------------------------------------------------------------------------------
def test_an_analysis_compared_with_itself_shows_no_change(analyses, tmp_path):
    a = analyses[SERIES[0]]
    c = compare([a, a], tmp_path / "self", quiet=True)
    later = c.table[c.table["step"] == 1]
    assert len(later) == len(c.table) // 2
    for col in ("change", "change_pct", "per_second_change_pct", "per_call_change_pct"):
        v = later[col].to_numpy(float)
        assert np.all(np.isnan(v) | (v == 0)), col
    assert later["change"].notna().sum() > 100  # compared, not merely unknown
    assert c.comparable and [n.kind for n in c.notes] == ["same"]
    assert all("(±0" in line for line in c.headline), c.headline
    assert [x["name"] for x in json.loads((c.out_dir / "comparison.json").read_text())["analyses"]] == \
        [SERIES[0], f"{SERIES[0]} (2)"]


# ---- capture sets analysed on the way; other capture points; degenerate analyses --------------------------------------
def test_capture_sets_are_analysed_by_the_analyze_pipeline(analyses, tmp_path):
    c = compare([analyses[SERIES[0]], CAPTURES / SERIES[2]], tmp_path / "mixed", quiet=True)
    made = tmp_path / "mixed" / "analyses" / f"1-{SERIES[2]}"
    assert (made / "report.html").is_file() and c.analyses[1].folder == made and c.analyses[1].analysed_here
    assert c.counts()["slow_wire"][1] == independent_counts(made)["slow_wire"] == \
        independent_counts(analyses[SERIES[2]])["slow_wire"]
    assert "analyses/1-stall-fix-3-stall-limit-10/report.html" in (c.out_dir / "comparison.html").read_text()


def test_different_capture_points_and_no_slow_log_are_not_comparable(analyses, tmp_path):
    src = CAPTURES / SERIES[0]
    db_only = analyze(capture_set(db=src / "db.pcap", long_query_time=0.1, thread_pool_size=2), Options(quiet=True),
                      tmp_path / "db-only").out_dir
    c = compare([analyses[SERIES[0]], db_only], tmp_path / "cmp", quiet=True)
    kinds = {n.kind: n.severity for n in c.notes}
    assert kinds["points"] == "not comparable" and kinds["slow_log"] == "not comparable" and not c.comparable
    assert c.counts()["in_slow_log"][1] is None  # no slow log: not counted, not zero
    assert rows(c, "overall", "all", "in_slow_log")["change"].isna().all()
    # the DB sees the same statements: server time, which the slow statements exceed as well
    assert c.counts()["slow_wire"][1] == independent_counts(db_only)["slow_wire"] > 0


@pytest.mark.parametrize("packets", [3, 40])
def test_degenerate_analyses(analyses, tmp_path, packets):
    """An analysis of a capture cut to its first packets: nothing (3 packets: no exchange) or a few exchanges."""
    d = tmp_path / "cut"
    d.mkdir()
    for side in ("app", "db"):
        pt.rewrite(CAPTURES / SERIES[2] / f"{side}.pcap", d / f"{side}.pcap", keep=lambda i, t: i < packets)
    shutil.copy(CAPTURES / SERIES[2] / "capture.toml", d)
    cut = analyze(d, Options(quiet=True), tmp_path / "cut-analysis").out_dir
    n = independent_counts(cut)["calls"]
    assert (n == 0) == (packets == 3)
    c = compare([analyses[SERIES[2]], cut], tmp_path / "cmp", quiet=True)
    assert c.counts()["calls"] == [independent_counts(analyses[SERIES[2]])["calls"], n]
    assert any(note.kind == "mix" and note.severity == "not comparable" for note in c.notes)
    back = compare([cut, cut], tmp_path / "self", quiet=True)  # an empty baseline: changes are unknown, not ∞
    assert not np.isinf(back.table["change_pct"].to_numpy(float)).any()


# ---- hostile text ------------------------------------------------------------------------------------------------------
def test_statement_text_and_names_are_escaped(analyses, tmp_path):
    evil = tmp_path / "evil"
    shutil.copytree(analyses[SERIES[0]], evil)
    script = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
    x = pd.read_parquet(evil / "exchanges.parquet")
    x["fingerprint"] = x["fingerprint"].astype(object).where(x["command"] != "COM_QUERY", "=cmd|' /C calc'!A0 " + script)
    x.to_parquet(evil / "exchanges.parquet")
    summary = json.loads((evil / "summary.json").read_text())
    summary["set"] = "<b onmouseover=alert(3)>set</b>"
    (evil / "summary.json").write_text(json.dumps(summary))
    c = compare([evil, analyses[SERIES[1]]], tmp_path / "cmp", csv=True, quiet=True)
    html = (c.out_dir / "comparison.html").read_text()
    for raw in (script, "<img src=x", "<b onmouseover", "<script>alert"):
        assert raw not in html
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in html and "&lt;b onmouseover=alert(3)&gt;" in html
    csv = pd.read_csv(c.out_dir / "comparison.csv", keep_default_na=False)
    assert not csv["fingerprint"].str.startswith("=").any()
    assert csv["fingerprint"].str.startswith("'=cmd").any()


# ---- user mistakes: one line, exit 2 ----------------------------------------------------------------------------------
def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["pcapdecomp", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    return code, out, err


def _no_pcapdecomp_key(folder: Path) -> None:
    summary = json.loads((folder / "summary.json").read_text())
    del summary["pcapdecomp"]
    (folder / "summary.json").write_text(json.dumps(summary))


def _old_table(folder: Path) -> None:
    pd.read_parquet(folder / "exchanges.parquet").drop(columns=["queue_min_s", "understated"]).to_parquet(
        folder / "exchanges.parquet")


@pytest.mark.parametrize("case,make,message", [
    ("missing folder", lambda a, t: [str(a), str(t / "nowhere")], "no such folder"),
    ("a file", lambda a, t: [str(a), str(a / "summary.json")], "not a folder"),
    ("empty folder", lambda a, t: [str(a), str(t / "empty")], "neither an analysis folder"),
    ("one folder", lambda a, t: [str(a)], "at least two folders"),
    ("no exchanges.parquet", lambda a, t: [str(a), str(t / "half")], "exchanges.parquet missing"),
    ("summary not JSON", lambda a, t: [str(a), str(t / "garbled")], "not readable as JSON"),
    ("old version", lambda a, t: [str(a), str(t / "old")], "incompatible version"),
    ("old table", lambda a, t: [str(a), str(t / "oldtable")], "queue_min_s, understated missing"),
    ("bad --slow", lambda a, t: [str(a), str(a), "--slow", "0"], "--slow must be > 0"),
    ("--out is an input", lambda a, t: [str(a), str(t / "copy"), "--out", str(t / "copy")], "would replace the input"),
    ("--out holds a file of the user's by an output's name", lambda a, t: [str(a), str(a), "--out", str(t / "busy")],
     "which no pcapdecomp run wrote there"),
])
def test_user_mistakes_are_one_line_and_exit_2(analyses, tmp_path, monkeypatch, capsys, case, make, message):
    a = analyses[SERIES[0]]
    (tmp_path / "empty").mkdir()
    (tmp_path / "half").mkdir()
    shutil.copy(a / "summary.json", tmp_path / "half")
    for name, spoil in (("garbled", lambda f: (f / "summary.json").write_text("{not json")),
                        ("old", _no_pcapdecomp_key), ("oldtable", _old_table), ("copy", lambda f: None)):
        shutil.copytree(a, tmp_path / name)
        spoil(tmp_path / name)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    (tmp_path / "busy" / "comparison.html").write_text("mine too")
    code, out, err = run_cli(monkeypatch, capsys, "compare", *make(a, tmp_path), "-q")
    assert code == 2, (case, out, err)
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"  # nothing of the user's replaced
    assert (tmp_path / "busy" / "comparison.html").read_text() == "mine too"


def test_cli_prints_the_headline_and_writes_the_set(analyses, tmp_path, monkeypatch, capsys):
    out = tmp_path / "cmp"
    code, stdout, err = run_cli(monkeypatch, capsys, "compare", *(str(analyses[n]) for n in SERIES), "--out", str(out))
    assert code == 0, err
    lines = stdout.splitlines()
    assert lines[0].startswith("Against thread_handling=pool-of-threads, thread_pool_stall_limit=500: ")  # what changed
    assert lines[1].startswith("exchanges slower than 100 ms on the wire: ")
    assert lines[2].startswith("hidden slow: ") and " → 0 (−100.0 %) → 0 (−100.0 %)" in lines[2]
    assert sorted(p.name for p in out.iterdir()) == [".pcapdecomp-outputs.json", "comparison.html", "comparison.json",
                                                     "comparison.parquet"]
    assert [line for line in lines if line.startswith("wrote ")] == [
        f"wrote {out / n}" for n in ("comparison.parquet", "comparison.json", "comparison.html")]
    # run again into the same folder: replaced as a whole, nothing of the older run left beside
    code, _, _ = run_cli(monkeypatch, capsys, "compare", str(analyses[SERIES[0]]), str(analyses[SERIES[2]]),
                         "--out", str(out), "--csv", "-q")
    assert code == 0 and len(json.loads((out / "comparison.json").read_text())["analyses"]) == 2
    assert (out / "comparison.csv").is_file()


def test_help_names_the_inputs_and_outputs(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "compare", "--help")
    assert code == 0
    text = " ".join(out.replace("│", " ").split())
    for words in ("BEFORE AFTER", "capture-set folders", "--out", "--slow", "--csv", "comparison.html",
                  "comparison.parquet"):
        assert words in text, words


def test_steps_are_named_by_the_setting_that_changed(series):
    """The page's columns and the one-sentence summary name each step by the capture.toml setting that tells it
    from the baseline (the folder names say nothing to a reader of the ticket), with the counts of the analyses."""
    toml = {n: tomllib.loads((CAPTURES / n / "capture.toml").read_text())["server"] for n in SERIES}
    labels = [a.label for a in series.analyses]
    assert labels[1] == f"thread_handling={toml[SERIES[1]]['thread_handling']}"
    assert labels[2] == f"thread_pool_stall_limit={toml[SERIES[2]]['thread_pool_stall_limit']}"
    assert labels[0] == (f"thread_handling={toml[SERIES[0]]['thread_handling']}, "
                         f"thread_pool_stall_limit={toml[SERIES[0]]['thread_pool_stall_limit']}")
    counts = [independent_counts(a.folder) for a in series.analyses]
    assert series.sentence == (
        f"Against {labels[0]}: {labels[1]} took the exchanges slower than 100 ms on the wire from "
        f"{counts[0]['slow_wire']} to {counts[1]['slow_wire']} and the hidden-slow ones from {counts[0]['hidden_slow']} "
        f"to {counts[1]['hidden_slow']}; {labels[2]} to {counts[2]['slow_wire']} and {counts[2]['hidden_slow']}.")
    page = (series.out_dir / "comparison.html").read_text()
    assert all(f"<th>{a.step}: {a.label}</th>" in page for a in series.analyses)
    assert json.loads((series.out_dir / "comparison.json").read_text())["sentence"] == series.sentence
