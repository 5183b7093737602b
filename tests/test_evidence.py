"""Ticket evidence from the bundled recordings: the pcapng files hold exactly the selected exchanges."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pcapdecomp.analysis import analyze
from pcapdecomp.capture import iter_records
from pcapdecomp.evidence import export
from pcapdecomp.exchanges import extract

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"


@pytest.fixture(scope="module")
def group_stall(tmp_path_factory):
    out = tmp_path_factory.mktemp("evidence") / "gs"
    analyze(CAPTURES / "group-stall", [], None, None, None, None, [], out, quiet=True)
    return out


@pytest.fixture(scope="module")
def hogs(tmp_path_factory):
    out = tmp_path_factory.mktemp("evidence") / "hogs"
    analyze(CAPTURES / "oltp-hogs", [], None, None, None, None, [], out, quiet=True)
    return out


def tshark(path: Path, *fields: str, flt: str | None = None) -> list[list[str]]:
    cmd = ["tshark", "-r", str(path), "-T", "fields", *[a for f in fields for a in ("-e", f)]]
    if flt:
        cmd += ["-Y", flt]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [line.split("\t") for line in proc.stdout.splitlines()]


def test_default_evidence_holds_exactly_the_hidden_slow_exchanges(group_stall, tmp_path):
    res = export(group_stall, out_dir=tmp_path / "ev")
    table = pd.read_parquet(group_stall / "exchanges.parquet")
    hidden = table[table["hidden_slow"].fillna(False)]
    assert res.how == "the hidden-slow exchanges" and len(res.rows) == len(hidden) == 3
    assert sorted(p.name for p in (tmp_path / "ev").iterdir()) == ["app.pcapng", "db.pcapng", "exchanges.csv",
                                                                   "summary.md"]
    for side, original in (("app", CAPTURES / "group-stall" / "app.pcap"), ("db", CAPTURES / "group-stall" / "db.pcap")):
        evidence = tmp_path / "ev" / f"{side}.pcapng"
        back = extract(evidence).exchanges
        # the same requests (same TCP sequence numbers and text), nothing else; the greeting is not there
        assert sorted(zip(back["req_tcp_seq"], back["sql"])) == sorted(zip(hidden["req_tcp_seq"], hidden["sql"]))
        assert set(back["problems"]) == {"midstream"}
        # same timestamps and bytes as in the original capture
        originals = {f: (ts, data) for f, ts, _lt, data, _ol in iter_records(original)}
        full = extract(original).exchanges.set_index("req_tcp_seq")
        for r in back.itertuples():
            assert r.req_first_ts == full.loc[r.req_tcp_seq, "req_first_ts"]
            assert r.resp_last_ts == full.loc[r.req_tcp_seq, "resp_last_ts"]
        copied = [(ts, data) for _f, ts, _lt, data, _ol in iter_records(evidence)]
        assert all(item in originals.values() for item in copied) and len(copied) == res.frames[
            next(k for k, v in res.files.items() if v == evidence)]
        # Wireshark sees the same requests, with a comment naming each exchange
        assert len(tshark(evidence, "mysql.command", flt="mysql.command")) == 3
        comments = [c for (c,) in tshark(evidence, "frame.comment") if c]
        assert len(comments) == 6
        for conn in hidden["conn_id"]:
            assert sum(f"conn {conn} seq" in c and "HIDDEN SLOW" in c for c in comments) == 1
    md = (tmp_path / "ev" / "summary.md").read_text()
    assert json.loads((group_stall / "summary.json").read_text())["verdict"] in md
    assert md.count(f"tshark -r {CAPTURES / 'group-stall'}/") == 6 and "pcapdecomp analyze --app" in md
    assert len(pd.read_csv(tmp_path / "ev" / "exchanges.csv")) == 3


def test_the_printed_filter_selects_the_same_frames_in_the_original(group_stall, tmp_path):
    res = export(group_stall, out_dir=tmp_path / "ev")
    md = (tmp_path / "ev" / "summary.md").read_text()
    db_filters = [line.split("-Y '", 1)[1].rstrip("'`") for line in md.splitlines() if f"tshark -r {CAPTURES / 'group-stall' / 'db.pcap'}" in line]
    selected = sum(len(tshark(CAPTURES / "group-stall" / "db.pcap", "frame.number", flt=f)) for f in db_filters)
    assert selected == res.frames[str(CAPTURES / "group-stall" / "db.pcap")] == 9


def test_selections_on_oltp_hogs(hogs, tmp_path):
    table = pd.read_parquet(hogs / "exchanges.parquet")
    hog = table[table["sql"].fillna("").str.startswith("SELECT BENCHMARK")]
    qid = hog["query_id"].iloc[0]
    res = export(hogs, query_ids=[qid.lower()], out_dir=tmp_path / "q")
    assert len(res.rows) == len(hog) and set(res.rows["query_id"]) == {qid}
    back = extract(tmp_path / "q" / "db.pcapng").exchanges
    assert sorted(back["req_tcp_seq"]) == sorted(hog["req_tcp_seq"])

    conn = int(table["conn_id"].dropna().iloc[0])
    res = export(hogs, conn_ids=[conn], top=5, out_dir=tmp_path / "c")
    mine = table[table["conn_id"] == conn]
    slowest = mine.assign(k=mine["server_s"].fillna(mine["total_s"]).fillna(mine["response_s"])).nlargest(5, "k")
    assert sorted(res.rows["req_tcp_seq"]) == sorted(slowest["req_tcp_seq"])
    assert res.how.endswith("the 5 slowest")
    assert sorted(extract(tmp_path / "c" / "app.pcapng").exchanges["req_tcp_seq"]) == sorted(slowest["req_tcp_seq"])


def test_db_only_analysis_gives_only_a_db_pcapng(tmp_path):
    gs = CAPTURES / "group-stall"
    analyze(None, [], gs / "db.pcap", gs / "slow.log", 1.0, 2, [], tmp_path / "a", quiet=True)
    res = export(tmp_path / "a")
    assert [p.name for p in res.files.values()] == ["db.pcapng"] and len(res.rows) == 3
    assert len(extract(res.files[str(gs / "db.pcap")]).exchanges) == 3


def test_no_hidden_slow_takes_the_slowest(tmp_path):
    analyze(CAPTURES / "maxthreads", [], None, None, None, None, [], tmp_path / "m", quiet=True)
    res = export(tmp_path / "m")
    assert res.how.startswith("no hidden-slow exchange") and len(res.rows) == 10


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcapdecomp.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "COLUMNS": "200"}, timeout=300)


def test_cli_evidence_and_analyze_evidence(tmp_path):
    out = tmp_path / "r"
    proc = cli("analyze", str(CAPTURES / "group-stall"), "--out", str(out), "--evidence")
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out / 'evidence' / 'db.pcapng'}" in proc.stdout
    proc = cli("evidence", str(out), "--top", "1", "--out", str(tmp_path / "one"))
    assert proc.returncode == 0, proc.stderr
    assert "1 exchanges (the hidden-slow exchanges, the 1 slowest)" in proc.stdout
    assert "(3 frames)" in proc.stdout


def _moved(tmp: Path, analysis: Path) -> Path:
    """The analysis folder with its captures moved away (paths in summary.json and exchanges.capture dangle)."""
    copy = tmp / "moved"
    copy.mkdir()
    gone = lambda p: str(tmp / "gone" / Path(p).name)  # noqa: E731
    table = pd.read_parquet(analysis / "exchanges.parquet")
    table["capture"] = table["capture"].map(gone).astype("string")
    table.to_parquet(copy / "exchanges.parquet")
    summary = json.loads((analysis / "summary.json").read_text())
    summary["inputs"]["app"] = [gone(p) for p in summary["inputs"]["app"]]
    summary["inputs"]["db"] = gone(summary["inputs"]["db"])
    (copy / "summary.json").write_text(json.dumps(summary))
    return copy


MISTAKES = [
    ("missing folder", lambda t, a: [str(t / "nope")], "no such folder"),
    ("not an analysis", lambda t, a: [str(t)], "run `pcapdecomp analyze` first"),
    ("a file", lambda t, a: [str(a / "summary.json")], "not a folder"),
    ("unknown query id", lambda t, a: [str(a), "--query-id", "0xDEADBEEF"], "no exchange matches query id 0xDEADBEEF"),
    ("bad --top", lambda t, a: [str(a), "--top", "0"], "--top must be ≥ 1"),
    ("captures gone", lambda t, a: [str(_moved(t, a))], "capture named in"),
]


@pytest.mark.parametrize("name,make,message", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_evidence_mistakes_give_one_line_and_exit_2(group_stall, tmp_path, name, make, message):
    out = tmp_path / "ev-out"
    proc = cli("evidence", *make(tmp_path, group_stall), "--out", str(out))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists()
