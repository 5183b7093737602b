"""Connection ids without a greeting (pcapdecomp/read/connids.py), held to the lab recordings' truth: a pool opened before
the capture (captures/field-pool-before-capture: a processlist snapshot, SELECT CONNECTION_ID() on the wire, a slow
log with Thread_id), captures/midstream-join (its slow log), and greeted recordings (the greeting wins)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from analysing import explain

from pcapdecomp.read import connids
from pcapdecomp.read.exchanges import extract

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
POOLED = CAPTURES / "field-pool-before-capture"
GREETED = CAPTURES / "field-default-stall"
MIDSTREAM = CAPTURES / "midstream-join"


def truth_of(set_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (set_dir / "truth.jsonl").read_text().splitlines()]


def truth_by_port(set_dir: Path) -> dict[int, dict]:
    """The truth of each connection by its client port (the app address is the same for all)."""
    return {r["client_port"]: r for r in truth_of(set_dir) if r["client_port"] is not None}


def port_of(client) -> int:
    return int(str(client).rsplit(":", 1)[1])


def copy_set(src: Path, dst: Path, without: tuple[str, ...] = ()) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in without:
            shutil.copyfile(f, dst / f.name)
    return dst


def assert_ids_true(x: pd.DataFrame, set_dir: Path) -> pd.DataFrame:
    """Every id the tool gives is the truth's, and so is every thread group; returns the named rows."""
    truth = truth_by_port(set_dir)
    named = x[x["conn_id"].notna()]
    want = [truth[port_of(c)]["conn_id"] for c in named["client"]]
    assert [int(c) for c in named["conn_id"]] == want
    grouped = named[named["thread_group"].notna()]
    assert [int(g) for g in grouped["thread_group"]] == [truth[port_of(c)]["thread_group"] for c in grouped["client"]]
    return named


@pytest.fixture(scope="module")
def pooled():
    # the pool's size is not in the set (the field's capture.toml): given, as a DBA who looked it up would
    return explain(POOLED, thread_pool_size=3)


def test_a_processlist_snapshot_names_every_pooled_connection(pooled):
    x = pooled.exchanges
    truth = truth_by_port(POOLED)
    assert not (x["conn_id_source"] == "greeting").any()  # the capture began after every login
    named = assert_ids_true(x, POOLED)
    assert len(named) == len(x) and x["client"].nunique() == len(truth) == 27
    assert x["thread_group"].notna().all()  # once the id is known, the group is computed as for a greeting
    # the four connections that asked SELECT CONNECTION_ID() on the wire are named by its answer, the rest by the
    # snapshot; the two agree where both speak (no conflict)
    asked = {r["conn_id"] for r in truth_of(POOLED) if r["role"] == "connection-id"}
    by_answer = set(x.loc[x["conn_id_source"] == "connection_id_answer", "conn_id"].astype(int))
    assert by_answer == asked and len(asked) == 4
    assert set(x["conn_id_source"].astype(str)) == {"connection_id_answer", "processlist"}
    assert pooled.summary["conn_ids"] == {"greeting": 0, "connection_id_answer": 4, "processlist": 23, "slowlog": 0,
                                          "unknown": 0}
    assert pooled.summary["inputs"]["processlist"].endswith("processlist.tsv")
    assert not any("conflicting" in w for w in pooled.warnings)


def test_without_a_snapshot_the_wire_and_the_slow_log_name_what_they_can(tmp_path):
    """A foreign file given as the snapshot (the slow log) is a warning, not a stop; the answers on the wire and the
    slow log's Thread_id name their connections, each right, and nothing else is guessed."""
    folder = copy_set(POOLED, tmp_path / "set", without=("processlist.tsv",))
    r = explain(folder, thread_pool_size=3, processlist=folder / "slow.log")
    assert any("not a processlist snapshot" in w and "lines ignored" in w for w in r.warnings)
    x = r.exchanges
    named = assert_ids_true(x, POOLED)
    truth = truth_of(POOLED)
    asked = {t["conn_id"] for t in truth if t["role"] == "connection-id"}
    logged = {t["conn_id"] for t in truth if t["role"] == "hog"}  # the BENCHMARKs ran ≥ 1 s: in the slow log
    assert set(named.loc[named["conn_id_source"] == "connection_id_answer", "conn_id"].astype(int)) == asked
    assert set(named.loc[named["conn_id_source"] == "slowlog", "conn_id"].astype(int)) == logged
    # connections no source names stay unknown, with no thread group
    assert x.loc[x["conn_id"].isna(), "thread_group"].isna().all()
    assert x.loc[x["conn_id"].isna(), "client"].nunique() == 27 - len(asked | logged)
    assert r.summary["conn_ids"] == {"greeting": 0, "connection_id_answer": len(asked), "processlist": 0,
                                     "slowlog": len(logged), "unknown": 27 - len(asked | logged)}


def test_the_slow_logs_thread_id_names_midstream_connections_only_when_unambiguous(bundled_analysis):
    r = bundled_analysis(MIDSTREAM.name)
    x = r.exchanges
    named = assert_ids_true(x, MIDSTREAM)
    assert (named["conn_id_source"] == "slowlog").all() and named["client"].nunique() >= 5
    # the twins run the same statement at the same moment: their entries cannot be told apart, so no id
    truth = truth_by_port(MIDSTREAM)
    twins = [c for c in x["client"].unique() if truth[port_of(c)]["conn_label"].startswith("twin")]
    assert twins and x.loc[x["client"].isin(twins), "conn_id"].isna().all()


def test_a_conflicting_snapshot_is_warned_and_the_greeting_wins(tmp_path):
    folder = copy_set(GREETED, tmp_path / "set")
    ports = sorted(truth_by_port(GREETED).items())
    lines = ["Id\tUser\tHost\tdb\tCommand\tTime\tState\tInfo\tProgress"]
    for i, (port, t) in enumerate(ports):
        wrong = t["conn_id"] + 100 if i == 0 else t["conn_id"]
        lines.append(f"{wrong}\tapp\t10.213.77.1:{port}\tlab\tSleep\t0\t\tNULL\t0.000")
    (folder / "processlist.txt").write_text("\n".join(lines) + "\n")
    r = explain(folder)
    assert any("1 conflicting" in w and "greeting id" in w for w in r.warnings), r.warnings
    x = r.exchanges
    assert (x["conn_id_source"] == "greeting").all()
    assert_ids_true(x, GREETED)


def _boxed(header: list[str], rows: list[list[str]]) -> str:
    """The mysql client's table layout (mysql -t, or interactive): columns as wide as their widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    border = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells):
        return "|" + "|".join(f" {c:<{w}} " for c, w in zip(cells, widths)) + "|"

    return "\n".join([border, line(header), border, *(line(r) for r in rows), border]) + "\n"


def test_processlist_formats_tab_separated_and_boxed(tmp_path):
    tsv = (POOLED / "processlist.tsv").read_text().splitlines()
    header, rows = tsv[0].split("\t"), [line.split("\t") for line in tsv[1:]]
    want = connids.read_processlist(POOLED / "processlist.tsv")
    assert len(want.by_endpoint) == 27 and want.local_rows == 1 and not want.warnings  # root@localhost: no endpoint
    show = ["Id", "User", "Host", "db", "Command", "Time", "State", "Info", "Progress"]  # SHOW FULL PROCESSLIST
    for name, text in (("boxed.txt", _boxed(header, rows)),
                       ("show.txt", "\n".join("\t".join(r) for r in [show, *[r + ["0.000"] for r in rows]]) + "\n"),
                       ("show-boxed.txt", _boxed(show, [r + ["0.000"] for r in rows]))):
        (tmp_path / name).write_text(text)
        got = connids.read_processlist(tmp_path / name)
        assert got.by_endpoint == want.by_endpoint and not got.warnings, name


def test_a_damaged_snapshot_keeps_its_intact_rows_and_counts_the_rest(tmp_path):
    lines = (POOLED / "processlist.tsv").read_text().splitlines()
    damaged = lines[:5] + ["17\tapp"] + ["x9\tapp\t10.213.77.1:1\tlab"] + lines[5:20] + [lines[20][:3]]
    (tmp_path / "p.tsv").write_bytes("\n".join(damaged).encode() + b"\n\xff\xfe\x00garbage")
    got = connids.read_processlist(tmp_path / "p.tsv")
    assert len(got.by_endpoint) == 18  # rows 1–19 less the root row: intact
    assert got.damaged_rows == 4
    assert any(f"4 of {got.rows} processlist rows damaged" in w for w in got.warnings)


def test_ipv6_and_v4_mapped_hosts_name_their_connection(tmp_path):
    """The features recording's IPv6 connection and a v4 one, as if their greetings had not been captured: MariaDB
    writes HOST as address:port without brackets (fd77::1:53166), an IPv4 client of a dual-stack socket as
    ::ffff:a.b.c.d:port. Their ids are the truth's (the greeting's id is the processlist id)."""
    x = extract(CAPTURES / "features" / "db.pcap")
    conns = x.connections
    truth_ids = {r["conn_label"]: r["conn_id"] for r in truth_of(CAPTURES / "features")}
    v6 = conns[conns["client"].str.startswith("[")].iloc[0]
    v4 = conns[~conns["client"].str.startswith("[")].iloc[0]
    assert int(v6["conn_id"]) == truth_ids["ipv6"]
    (tmp_path / "processlist.tsv").write_text(
        "ID\tUSER\tHOST\tDB\tCOMMAND\tTIME\tSTATE\tINFO\n"
        f"{int(v6['conn_id'])}\tapp\tfd77::1:{port_of(v6['client'])}\tlab\tSleep\t0\t\tNULL\n"
        f"{int(v4['conn_id'])}\tapp\t::ffff:10.213.77.1:{port_of(v4['client'])}\tlab\tSleep\t0\t\tNULL\n")
    named = connids.ids_from_processlist(conns, connids.read_processlist(tmp_path / "processlist.tsv"))
    assert named == {(v6["capture"], int(v6["conn_index"])): int(v6["conn_id"]),
                     (v4["capture"], int(v4["conn_index"])): int(v4["conn_id"])}
    blank = conns.assign(conn_id=pd.array([None] * len(conns), dtype="Int64"), conn_id_source=None)
    filled = connids.Filled()
    connids.fill_from_ids(x.exchanges.copy(), blank, named, connids.PROCESSLIST, filled)
    assert filled.named == {"processlist": 2} and list(blank["conn_id"].dropna()) == sorted(
        [int(v6["conn_id"]), int(v4["conn_id"])], key=lambda c: list(conns["conn_id"]).index(c))


def test_the_exchanges_connections_table_says_the_greeting(tmp_path):
    x = extract(GREETED / "db.pcap")
    c = x.connections
    assert (c["conn_id_source"] == "greeting").all() and c["conn_id"].notna().all()
    m = extract(POOLED / "db.pcap").connections
    assert m["conn_id"].isna().all() and m["conn_id_source"].isna().all()


def test_the_verdict_claims_nothing_about_groups_it_does_not_know(tmp_path):
    """midstream-join without its slow log: every id is unknown, so no thread group is known; the verdict says so
    rather than that nothing executed long on "their" group."""
    folder = copy_set(MIDSTREAM, tmp_path / "set", without=("slow.log",))
    toml = (folder / "capture.toml").read_text()
    (folder / "capture.toml").write_text("\n".join(l for l in toml.splitlines() if not l.startswith("slow_log")))
    r = explain(folder)
    x = r.exchanges
    assert x["conn_id"].isna().all() and x["thread_group"].isna().all()
    verdict = r.summary["verdict"]
    assert "no statement of their thread group" not in verdict
    assert "connection ids are unknown" in verdict


def test_a_missing_snapshot_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", str(POOLED), "--processlist",
                           str(tmp_path / "nowhere.tsv"), "-o", str(tmp_path / "out"), "-q"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "nowhere.tsv" in done.stderr and "Traceback" not in done.stderr


def test_capture_toml_may_name_the_snapshot(tmp_path):
    folder = copy_set(POOLED, tmp_path / "set")
    (folder / "processlist.tsv").rename(folder / "snapshot-0310.tab")
    toml = (folder / "capture.toml").read_text().replace('[captures]\n', '[captures]\nprocesslist = "snapshot-0310.tab"\n')
    (folder / "capture.toml").write_text(toml)
    from pcapdecomp.read.captureset import resolve_capture_set

    cs = resolve_capture_set(folder, [], None, None, None, None, [])
    assert cs.processlist == folder / "snapshot-0310.tab"
    (folder / "snapshot-0310.tab").unlink()
    cs = resolve_capture_set(folder, [], None, None, None, None, [])
    assert cs.processlist is None and any("snapshot-0310.tab" in w for w in cs.warnings)
