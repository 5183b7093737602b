"""Ticket evidence from the bundled recordings: the pcapng files hold exactly the selected exchanges."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.core.formats import seconds_ms
from pcapdecomp.read.capture import iter_records
from pcapdecomp.read.exchanges import extract
from pcapdecomp.render.evidence import export

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"


@pytest.fixture(scope="module")
def group_stall(bundled_analysis):
    return bundled_analysis("group-stall").out_dir


@pytest.fixture(scope="module")
def hogs(bundled_analysis):
    return bundled_analysis("oltp-hogs").out_dir


def tshark(path: Path, *fields: str, flt: str | None = None) -> list[list[str]]:
    cmd = ["tshark", "-r", str(path), "-T", "fields", *[a for f in fields for a in ("-e", f)]]
    if flt:
        cmd += ["-Y", flt]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [line.split("\t") for line in proc.stdout.splitlines()]


def test_default_evidence_holds_the_victims_and_their_culprit(group_stall, tmp_path):
    res = export(group_stall, out_dir=tmp_path / "ev")
    table = pd.read_parquet(group_stall / "exchanges.parquet")
    truth = pd.read_json(CAPTURES / "group-stall" / "truth.jsonl", lines=True)
    hog = truth[truth["sql"].str.startswith("SELECT BENCHMARK")].iloc[0]
    hidden = table[table["hidden_slow"].fillna(False)]
    culprit = table[table["sql"].fillna("").str.startswith("SELECT BENCHMARK")]
    chosen = pd.concat([hidden, culprit])
    assert res.how == "the hidden-slow exchanges with their culprits" and len(res.rows) == len(chosen) == 4
    assert sorted(res.rows["evidence_role"]) == ["culprit", "victim", "victim", "victim"]
    assert list(res.rows.loc[res.rows["evidence_role"] == "culprit", "conn_id"]) == [hog["conn_id"]]
    assert sorted(p.name for p in (tmp_path / "ev").iterdir()) == [".pcapdecomp-outputs.json", "app.pcapng",
                                                                   "db.pcapng", "exchanges.csv", "summary.md"]
    for side, original in (("app", CAPTURES / "group-stall" / "app.pcap"), ("db", CAPTURES / "group-stall" / "db.pcap")):
        evidence = tmp_path / "ev" / f"{side}.pcapng"
        back = extract(evidence).exchanges
        # the same requests (same TCP sequence numbers and text), the culprit's too; the greeting is not there
        assert sorted(zip(back["req_tcp_seq"], back["sql"])) == sorted(zip(chosen["req_tcp_seq"], chosen["sql"]))
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
        # Wireshark sees the same requests, with a comment naming each exchange and its part in the stall
        assert len(tshark(evidence, "mysql.command", flt="mysql.command")) == 4
        comments = [c for (c,) in tshark(evidence, "frame.comment") if c]
        assert len(comments) == 8
        for conn, exec_s in zip(hidden["conn_id"], hidden["exec_s"]):
            mine = [c for c in comments if f"conn {conn} seq" in c and "VICTIM OF STALL 0, HIDDEN SLOW" in c]
            # a wait told as likely beside its certain part; the execution it rests on said to be an estimate
            assert len(mine) == 1 and "(likely; at least" in mine[0] and f"exec {seconds_ms(exec_s)} (estimate)" in mine[0]
        held = [c for c in comments if f"conn {hog['conn_id']} seq" in c and "CULPRIT OF STALL 0" in c]
        assert len(held) == 1 and "(slow log)" in held[0] and "queue 0.117 ms (measured)" in held[0]
    md = (tmp_path / "ev" / "summary.md").read_text()
    summary = json.loads((group_stall / "summary.json").read_text())
    assert summary["story"]["sentence"].replace("`", "\\`") in md
    # the stall with its culprit's Query ID; captures by name, not by this machine's folders
    stall = next(line for line in md.splitlines() if line.startswith("| 0 | 1 |"))
    assert f"`{culprit['query_id'].iloc[0]}`" in stall and "| 3 |" in stall
    assert str(CAPTURES) not in md and str(REPO) not in md
    assert md.count("- `tshark -r app.pcap -Y") == 4 and md.count("- `tshark -r db.pcap -Y") == 4
    # and one filter per stall for its victims and culprit at once, in each capture
    assert md.count("\ntshark -r app.pcap -Y '(") == 1 and md.count("\ntshark -r db.pcap -Y '(") == 1
    assert "pcapdecomp analyze --app app.pcap --db db.pcap --slow-log slow.log" in md
    assert len(pd.read_csv(tmp_path / "ev" / "exchanges.csv")) == 4


def test_the_printed_filter_selects_the_same_frames_in_the_original(group_stall, tmp_path):
    res = export(group_stall, out_dir=tmp_path / "ev")
    md = (tmp_path / "ev" / "summary.md").read_text()
    db_filters = [line.split("-Y '", 1)[1].split("'", 1)[0] for line in md.splitlines()
                  if "- `tshark -r db.pcap" in line]  # the per-exchange ones
    selected = sum(len(tshark(CAPTURES / "group-stall" / "db.pcap", "frame.number", flt=f)) for f in db_filters)
    assert selected == res.frames[str(CAPTURES / "group-stall" / "db.pcap")] == 12


def test_selections_on_oltp_hogs(hogs, tmp_path):
    table = pd.read_parquet(hogs / "exchanges.parquet")
    hog = table[table["sql"].fillna("").str.startswith("SELECT BENCHMARK")]
    qid = hog["query_id"].iloc[0]
    res = export(hogs, query_ids=[qid.lower()], out_dir=tmp_path / "q")
    assert len(res.rows) == len(hog) and set(res.rows["query_id"]) == {qid}
    assert set(res.rows["evidence_role"]) == {"culprit"}  # chosen by Query ID, and each held a stall
    back = extract(tmp_path / "q" / "db.pcapng").exchanges
    assert sorted(back["req_tcp_seq"]) == sorted(hog["req_tcp_seq"])

    conn = int(table["conn_id"].dropna().iloc[0])
    res = export(hogs, conn_ids=[conn], top=5, out_dir=tmp_path / "c")
    mine = table[table["conn_id"] == conn]
    slowest = mine.assign(k=mine["server_s"].fillna(mine["total_s"]).fillna(mine["response_s"])).nlargest(5, "k")
    # the five slowest of that connection, and the hogs that held them when they queued
    stalls = set(slowest.loc[slowest["stall_role"] == "victim", "stall"].dropna())
    held = table[(table["stall_role"] == "culprit") & table["stall"].isin(stalls)]
    assert sorted(res.rows["req_tcp_seq"]) == sorted([*slowest["req_tcp_seq"], *held["req_tcp_seq"]])
    assert res.how.endswith("the 5 slowest" + (" with their culprits" if len(held) else ""))
    assert sorted(extract(tmp_path / "c" / "app.pcapng").exchanges["req_tcp_seq"]) == sorted(res.rows["req_tcp_seq"])


def test_default_on_oltp_hogs_has_every_victim_and_the_three_hog_runs(hogs, tmp_path):
    table = pd.read_parquet(hogs / "exchanges.parquet")
    truth = pd.read_json(CAPTURES / "oltp-hogs" / "truth.jsonl", lines=True)
    res = export(hogs, out_dir=tmp_path / "ev")
    victims = res.rows[res.rows["evidence_role"] == "victim"]
    culprits = res.rows[res.rows["evidence_role"] == "culprit"]
    assert len(victims) == int(table["hidden_slow"].sum()) == 12
    assert len(culprits) == 3 and culprits["sql"].str.startswith("SELECT BENCHMARK").all()
    hog_conns = set(truth.loc[truth["sql"].str.startswith("SELECT BENCHMARK"), "conn_id"])
    assert set(culprits["conn_id"]) == hog_conns
    md = (tmp_path / "ev" / "summary.md").read_text()
    assert sum(line.startswith("| ") and line.split("|")[1].strip().isdigit() for line in md.splitlines()) == 3


def test_db_only_analysis_gives_only_a_db_pcapng(tmp_path):
    gs = CAPTURES / "group-stall"
    analyze(capture_set(db=gs / "db.pcap", slow_log=gs / "slow.log", long_query_time=1.0, thread_pool_size=2),
            Options(quiet=True), tmp_path / "a")
    res = export(tmp_path / "a")
    assert [p.name for p in res.files.values()] == ["db.pcapng"] and len(res.rows) == 4
    assert len(extract(res.files[str(gs / "db.pcap")]).exchanges) == 4


def test_maxthreads_evidence_has_the_waiting_and_the_threads_holders(tmp_path, bundled_analysis):
    shutil.copytree(bundled_analysis("maxthreads").out_dir, tmp_path / "m")  # the run's shared analysis, copied
    res = export(tmp_path / "m")
    truth = pd.read_json(CAPTURES / "maxthreads" / "truth.jsonl", lines=True)
    sleeps = truth[truth["sql"] == "SELECT SLEEP(2)"]
    waited = set(sleeps.loc[sleeps["client_s"] > 3, "conn_id"])
    assert res.how == "the understated exchanges with their culprits" and len(res.rows) == 8
    assert set(res.rows.loc[res.rows["evidence_role"] == "victim", "conn_id"]) == waited
    assert set(res.rows.loc[res.rows["evidence_role"] == "culprit", "conn_id"]) == set(sleeps["conn_id"]) - waited


def test_nothing_slow_takes_the_slowest(tmp_path, bundled_analysis):
    shutil.copytree(bundled_analysis("features").out_dir, tmp_path / "f")  # the run's shared analysis, copied
    res = export(tmp_path / "f")
    assert res.how.startswith("no hidden-slow or understated exchange") and len(res.rows) == 10
    assert set(res.rows["evidence_role"]) == {"selected"}


def test_two_app_captures_with_one_file_name_keep_all_their_frames(tmp_path):
    """Two app hosts both write app.pcap: their evidence files must not overwrite each other."""
    from pcaptools import rewrite, tcp_ports

    gs = CAPTURES / "group-stall"
    for host, parity in (("hostA", 0), ("hostB", 1)):
        (tmp_path / host).mkdir()
        rewrite(gs / "app.pcap", tmp_path / host / "app.pcap",
                keep_packet=lambda pkt, parity=parity: (max(tcp_ports(pkt) or (0, 0)) // 2) % 2 == parity)
    r = analyze(capture_set(app=[tmp_path / "hostA" / "app.pcap", tmp_path / "hostB" / "app.pcap"], db=gs / "db.pcap",
                            slow_log=gs / "slow.log", long_query_time=1.0, thread_pool_size=2),
                Options(quiet=True), tmp_path / "a")
    assert r.summary["exchanges"]["seen_both"] == r.summary["exchanges"]["total"]
    per_host = r.exchanges.groupby("capture", observed=True)["conn_id"].min()
    assert len(per_host) == 2
    res = export(tmp_path / "a", conn_ids=[int(c) for c in per_host])
    names = sorted(p.name for p in res.files.values())
    assert len(names) == len(set(names)) == 3 and "db.pcapng" in names
    app_frames = sum(n for path, n in res.frames.items() if "host" in path)
    assert app_frames == res.frames[str(gs / "db.pcap")]  # the same exchanges' frames at both points
    # every selected request is in one of the two app files (a login needs the greeting before it: not copied)
    back = pd.concat([extract(res.out_dir / n).exchanges for n in names if n != "db.pcapng"])
    commands = res.rows[res.rows["command"] != "CONNECT"]
    assert sorted(back["req_tcp_seq"]) == sorted(commands["req_tcp_seq"]) and len(commands) > 20
    md = (res.out_dir / "summary.md").read_text()
    assert "`hostA/app.pcap`" in md and "`hostB/app.pcap`" in md and str(tmp_path) not in md
    proc = cli("evidence", str(tmp_path / "a"), *[a for c in per_host for a in ("--conn-id", str(int(c)))],
               "--out", str(tmp_path / "c"))
    assert proc.returncode == 0, proc.stderr
    printed = {line.split()[1]: int(line.split("(")[1].split()[0]) for line in proc.stdout.splitlines()
               if line.startswith("wrote") and "frames" in line}
    for path in printed:
        assert printed[path] == sum(1 for _ in iter_records(Path(path)))


def test_the_folder_is_written_as_a_set(group_stall, tmp_path):
    out = tmp_path / "ev"
    export(group_stall, out_dir=out)
    first = (out / "db.pcapng").read_bytes()
    (out / "app-old.pcapng").write_bytes(b"a capture of the user's")  # no run of ours wrote it: it stays
    export(group_stall, top=1, out_dir=out)
    assert sorted(p.name for p in out.iterdir()) == [".pcapdecomp-outputs.json", "app-old.pcapng", "app.pcapng",
                                                     "db.pcapng", "exchanges.csv", "summary.md"]
    assert (out / "app-old.pcapng").read_bytes() == b"a capture of the user's"
    assert (out / "db.pcapng").read_bytes() != first  # ours, replaced by the top-1 selection
    (out / "notes.txt").write_text("mine")
    export(group_stall, out_dir=out)
    assert (out / "notes.txt").read_text() == "mine"
    (out / ".pcapdecomp-outputs.json").unlink()  # nothing says these are ours any more: refused, untouched
    with pytest.raises(Exception, match="which no pcapdecomp run wrote there"):
        export(group_stall, out_dir=out)
    assert (out / "notes.txt").read_text() == "mine" and (out / "db.pcapng").is_file()


def test_summary_md_escapes_what_came_from_the_capture(group_stall, tmp_path):
    """A statement is attacker-controlled: in summary.md it stays text (no HTML, no link, no extra table cell)."""
    from markdown_it import MarkdownIt

    hostile = "SELECT 1 /* </td><script>alert(1)</script> | *x* [a](http://evil.example) `tick` ``` */"
    copy = tmp_path / "a"
    copy.mkdir()
    table = pd.read_parquet(group_stall / "exchanges.parquet")
    table["sql"] = table["sql"].where(~table["hidden_slow"].fillna(False), hostile)
    table.to_parquet(copy / "exchanges.parquet")
    summary = json.loads((group_stall / "summary.json").read_text())
    summary["story"]["sentence"] = hostile
    summary["set"] = "# <b>set</b>"
    (copy / "summary.json").write_text(json.dumps(summary))
    export(copy, out_dir=tmp_path / "ev")
    md = (tmp_path / "ev" / "summary.md").read_text()
    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    assert "<script" not in html and "<a " not in html and "<b>" not in html and "<em>x</em>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown, as text
    # every row of the exchanges table still has its 11 cells
    rows = [line for line in html.split("<tr>")[1:] if "evil.example" in line]
    assert len(rows) == 3 and all(line.count("<td>") == 11 for line in rows)


@pytest.mark.parametrize("text", ["plain", "a|b", "``x``", "`", "<i>x</i>", "- list", "1. item", "http://x.y/", ""])
def test_markdown_helpers_round_trip_as_text(text):
    from markdown_it import MarkdownIt

    from pcapdecomp.render.evidence import md_code, md_text

    md = MarkdownIt("commonmark", {"html": True})
    rendered = md.render(md_text(text, line_start=True))
    import html as h

    assert h.unescape(rendered.replace("<p>", "").replace("</p>", "").strip()) == " ".join(text.split())
    code = md.render(md_code(text)).strip()
    assert code.startswith("<p><code>") or not text
    assert h.unescape(code.removeprefix("<p><code>").removesuffix("</code></p>")).replace("\\|", "|").strip() == text.strip()


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
    assert "2 exchanges (the hidden-slow exchanges, the 1 slowest with their culprits)" in proc.stdout
    assert "(6 frames)" in proc.stdout


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
