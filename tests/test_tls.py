"""Encrypted MySQL (issue 32): the bundled TLS 1.3 and TLS 1.2 group-stall recordings (captures/group-stall-tls13,
-tls12: PyMySQL over TLS with the client's key log, tls-keys.log), read with the key log (decrypted: the same
exchanges as tshark decrypts) and without it (timed by their records), held to each recording's truth.jsonl."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcapdecomp.analysis import Options, analyze
from pcapdecomp.mysql.tls import parse_keylog
from pcapdecomp.read.exchanges import extract
from pcapdecomp.read.tlskeys import pcapng_secrets

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
SETS = ["group-stall-tls13", "group-stall-tls12"]
# text and prepared statements (mysql-connector's cursors: PREPARE, RESET + EXECUTE) over TLS 1.3
OLTP = "oltp-prepared-tls13"
# the same over TLS 1.2: the key log has PyMySQL's sessions only (mysql-connector pinned to 1.2 writes none), so
# the capture mixes decrypted and timed connections
OLTP12 = "oltp-prepared-tls12"
UNKEYED_DRIVERS = {OLTP12: {"connector"}}  # the clients whose sessions are not in the set's key log
CORPUS = REPO.parent.parent / "shared" / "corpus" if (REPO.parent.parent / "shared" / "corpus").is_dir() \
    else Path("/work/shared/corpus")
TSHARK = shutil.which("tshark")


def truth(name: str) -> list[dict]:
    return [json.loads(line) for line in (CAPTURES / name / "truth.jsonl").read_text().splitlines()]


def keys(name: str) -> dict:
    return parse_keylog((CAPTURES / name / "tls-keys.log").read_text())


def unkeyed(name: str) -> set[int]:
    """The connection ids of the set whose TLS sessions the key log does not have (truth's driver)."""
    return {t["conn_id"] for t in truth(name) if t["driver"] in UNKEYED_DRIVERS.get(name, set())}


def lqt(name: str) -> float:
    import tomllib

    return tomllib.loads((CAPTURES / name / "capture.toml").read_text())["server"]["long_query_time"]


_WITHOUT_KEYS: dict = {}


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tls")


@pytest.fixture(scope="module")
def analysed(tmp_root, bundled_analysis):
    """`analysed(NAME, with_keys)`: analyze of the set with its key log (the folder's tls-keys.log: the run's shared
    analysis, tests/conftest.py, only read) or of a copy without it (made once here)."""
    def get(name: str, with_keys: bool):
        if with_keys:
            return bundled_analysis(name)
        if name not in _WITHOUT_KEYS:
            folder = tmp_root / f"{name}-nokeys"
            shutil.copytree(CAPTURES / name, folder)
            (folder / "tls-keys.log").unlink()
            _WITHOUT_KEYS[name] = analyze(folder, Options(quiet=True), tmp_root / f"out-{name}-nokeys")
        return _WITHOUT_KEYS[name]

    return get


# ---- reading ---------------------------------------------------------------------------------------------------

@pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")
@pytest.mark.parametrize("name", [*SETS, OLTP, OLTP12])
@pytest.mark.parametrize("side", ["app", "db"])
def test_decrypted_commands_are_tsharks(name, side):
    """One client key log decrypts both capture points; the commands read equal tshark's with the same key log
    (on the mixed TLS 1.2 set: the sessions it has; the others are timed flights, which tshark does not decrypt
    either)."""
    path = CAPTURES / name / f"{side}.pcap"
    proc = subprocess.run([TSHARK, "-r", str(path), "-o", f"tls.keylog_file:{CAPTURES / name / 'tls-keys.log'}",
                           "-Y", "mysql.command", "-T", "fields", "-e", "mysql.command"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    theirs = Counter(int(v) for line in proc.stdout.split() for v in line.split(","))
    x = extract(path, tls_secrets=keys(name))
    ex = x.exchanges
    ours = Counter(ex["command"].astype(str))
    codes = {"COM_QUIT": 1, "COM_QUERY": 3, "COM_PING": 14, "COM_STMT_PREPARE": 22, "COM_STMT_EXECUTE": 23,
             "COM_STMT_CLOSE": 25, "COM_STMT_RESET": 26}
    assert {c: ours[c] for c in codes if ours[c] or theirs[codes[c]]} == \
        {c: theirs[codes[c]] for c in codes if ours[c] or theirs[codes[c]]}
    timed = unkeyed(name)
    assert ours["COM_QUERY"] > 100 and set(ours) <= {*codes, "CONNECT", *(["ENCRYPTED"] if timed else [])}
    q = x.quality()
    assert q["tls_connections"] == q["mysql_connections"] == len({t["conn_id"] for t in truth(name)})
    assert q["tls_timed_connections"] == len(timed)
    assert q["tls_decrypted_connections"] == q["tls_connections"] - len(timed)
    assert set(x.connections.loc[x.connections["tls_mode"] == "timed", "conn_id"]) == timed
    assert q["tls_decrypted_bytes"] + q["tls_timed_bytes"] == q["tls_bytes"] and q["tls_decrypted_bytes"] > 0
    assert q["tls_unreadable_bytes"] == 0
    assert (x.connections["tls_version"] == name[-2] + "." + name[-1]).all()


def test_prepared_statements_over_tls_decode_their_parameters():
    """mysql-connector's prepared cursors over TLS 1.3: every COM_STMT_EXECUTE the client timed is read inside its
    send … receive on its connection, with the prepared text and the id it sent as the parameter."""
    ex = extract(CAPTURES / OLTP / "db.pcap", tls_secrets=keys(OLTP)).exchanges
    executes = ex[ex["command"] == "COM_STMT_EXECUTE"]
    start = executes["req_first_ts"].astype("int64").to_numpy()
    end = executes["resp_last_ts"].astype("int64").to_numpy()
    conn = executes["conn_id"].to_numpy()
    rows = [t for t in truth(OLTP) if t["command"] == "COM_STMT_EXECUTE"]
    assert len(rows) > 100
    for t in rows:
        inside = np.flatnonzero((conn == t["conn_id"]) & (start >= t["client_send_ns"]) & (end <= t["client_recv_ns"]))
        assert len(inside) == 1, t
        got = executes.iloc[inside[0]]
        assert got["sql"] == t["sql"] and got["params"] == t["note"].rsplit("id=", 1)[1]


@pytest.mark.parametrize("name", SETS)
def test_decrypted_statements_are_the_clients(name):
    """Every statement the client sent is read with its text, on its connection, in order."""
    ex = extract(CAPTURES / name / "db.pcap", tls_secrets=keys(name)).exchanges
    for conn_id, rows in pd.DataFrame(truth(name)).groupby("conn_id"):
        got = ex[(ex["conn_id"] == conn_id) & (ex["command"] == "COM_QUERY")].sort_values("seq")["sql"].tolist()
        want = rows.sort_values("client_send_ns")["sql"].tolist()
        assert [s for s in got if s != "SET NAMES utf8mb4"] == want


@pytest.mark.parametrize("name", [*SETS, OLTP, OLTP12])
def test_without_keys_each_statement_is_one_timed_flight(name):
    """No key log: each statement the client timed is one ENCRYPTED flight (a prepared cursor's call two), inside
    its send … receive on its connection (the lab's hosts share one clock), as the decrypted reading has them."""
    x = extract(CAPTURES / name / "db.pcap")
    ex = x.exchanges
    assert set(x.connections["tls_mode"]) == {"timed"} and ex["sql"].isna().all()
    decrypted = extract(CAPTURES / name / "db.pcap", tls_secrets=keys(name)).exchanges
    # a request the server does not answer (COM_STMT_CLOSE) is one flight with the client's next request
    merged = sum(int((g.sort_values("seq")["command"].iloc[:-1].isin(["COM_STMT_CLOSE", "COM_QUIT"])).sum())
                 for _, g in decrypted.groupby("conn_index"))
    assert len(ex) == len(decrypted) - merged
    answered = ex[ex["result"] == "encrypted"]
    start = answered["req_first_ts"].astype("int64").to_numpy()
    end = answered["resp_last_ts"].astype("int64").to_numpy()
    conn = answered["conn_id"].to_numpy()
    plain = decrypted[decrypted["resp_last_ts"].notna()]
    p_start = plain["req_first_ts"].astype("int64").to_numpy()
    p_end = plain["resp_last_ts"].astype("int64").to_numpy()
    p_conn = plain["conn_id"].to_numpy()
    for t in truth(name):
        inside = (conn == t["conn_id"]) & (start >= t["client_send_ns"]) & (end <= t["client_recv_ns"])
        # as many flights as answered requests the key log shows there (a prepared cursor's call is two:
        # COM_STMT_RESET, then COM_STMT_EXECUTE), and at least one
        there = (p_conn == t["conn_id"]) & (p_start >= t["client_send_ns"]) & (p_end <= t["client_recv_ns"])
        assert inside.sum() == there.sum() >= 1, t
        if name not in (OLTP, OLTP12):
            assert inside.sum() == 1, t
    # the flights' times are the decrypted exchanges' own: the same records bound both
    if merged:
        return
    both = ex.merge(decrypted, on=["conn_index", "seq"], suffixes=("", "_d"))
    assert (both["req_first_ts"] == both["req_first_ts_d"]).all()
    assert (both["resp_last_ts"].dropna() == both["resp_last_ts_d"].dropna()).all()


def test_a_key_log_for_other_sessions_leaves_the_connections_timed():
    x = extract(CAPTURES / "group-stall-tls13" / "db.pcap", tls_secrets=keys("group-stall-tls12"))
    assert set(x.connections["tls_mode"]) == {"timed"}


# ---- the story, with and without keys --------------------------------------------------------------------------

def _expected(name: str):
    rows = truth(name)
    hog = max(rows, key=lambda r: r["exec_s"] or 0)
    limit = lqt(name)
    # a prepared cursor's call waits in its COM_STMT_RESET (the first request the stalled group queues), an
    # administrator command the server never logs: the victims held to hidden_slow are the text statements
    victims = {(r["conn_id"], r["client_send_ns"]) for r in rows
               if r is not hog and r["client_s"] > limit + 0.05 and (r["exec_s"] or 0) < limit
               and r["command"] == "COM_QUERY"}
    fast = {(r["conn_id"], r["client_send_ns"]) for r in rows if r["client_s"] < limit - 0.05}
    return hog, victims, fast


def _truth_row_of(x: pd.DataFrame, rows: list[dict]) -> dict:
    """exchange row index -> (conn_id, client_send_ns) of the truth row whose send … receive holds it (the last
    exchange there)."""
    out = {}
    start = x["db_req_ts"].astype("int64").to_numpy()
    answered = x["db_resp_ts"].notna().to_numpy()
    end = np.where(answered, pd.to_datetime(x["db_resp_ts"]).astype("int64").to_numpy(), np.iinfo(np.int64).max)
    for r in rows:
        hit = np.flatnonzero((x["conn_id"].to_numpy() == r["conn_id"]) & (start >= r["client_send_ns"])
                             & (end <= r["client_recv_ns"]))
        # the statement is the last request in its window: a driver sends its helpers first (mysql-connector's
        # PREPARE, RESET, PING)
        hit = hit[np.argsort(start[hit])][-1:]
        if len(hit) == 1:
            out[int(hit[0])] = (r["conn_id"], r["client_send_ns"])
    return out


@pytest.mark.parametrize("with_keys", [True, False], ids=["keys", "no-keys"])
@pytest.mark.parametrize("name", [*SETS, OLTP, OLTP12])
def test_the_stall_its_culprit_and_its_hidden_victims_are_found(tmp_root, name, with_keys, analysed):
    r = analysed(name, with_keys)
    x = r.exchanges.reset_index(drop=True)
    s = r.summary
    hog, victims, fast = _expected(name)
    tls = s["tls"]
    assert tls["connections"] == tls["of"] == len({t["conn_id"] for t in truth(name)})
    timed = len(unkeyed(name)) if with_keys else tls["connections"]
    assert tls["timed"] == timed and tls["decrypted"] == tls["connections"] - timed and tls["unreadable"] == 0
    assert s["verdict"].splitlines()[0] == tls["sentence"]
    assert ("decrypted with the key log" in tls["sentence"]) == with_keys
    assert ("timed without their text" in tls["sentence"]) == (timed > 0)
    which = _truth_row_of(x, truth(name))
    assert len(which) == len(truth(name))  # every statement the client timed is one exchange, by connection and time
    assert len(victims) >= 2
    # its server time lies between the execution performance_schema measured and what the client waited (the
    # server may stamp the end after it sent the answer: the slow-log join's 50 ms slack)
    by_key = {(t["conn_id"], t["client_send_ns"]): t for t in truth(name)}
    server = x["server_s"].to_numpy(dtype=float, na_value=np.nan)
    for i, k in which.items():
        assert (by_key[k]["exec_s"] or 0) - 0.05 <= server[i] <= by_key[k]["client_s"], by_key[k]
    hidden = {which[i] for i in np.flatnonzero(x["hidden_slow"].to_numpy(dtype=bool, na_value=False)) if i in which}
    assert victims and victims <= hidden and not (hidden & fast)
    # and every call the client saw slow has a request that was slow inside the server, in its window
    start = x["db_req_ts"].astype("int64").to_numpy()
    end = pd.to_datetime(x["db_resp_ts"]).astype("int64").to_numpy()
    conn = x["conn_id"].to_numpy()
    for t in truth(name):
        if t is not hog and t["client_s"] > lqt(name) + 0.05:
            there = (conn == t["conn_id"]) & (start >= t["client_send_ns"]) & (end <= t["client_recv_ns"])
            assert np.nanmax(server[there]) > lqt(name), t
    # the culprit is the hog, its text from the wire (keys) or from the slow log (no keys), its group the stalled one
    culprits = x[(x["stall_role"] == "culprit").to_numpy(dtype=bool, na_value=False)]
    assert set(culprits["conn_id"]) == {hog["conn_id"]}
    assert set(culprits["sql"].astype(str)) == {hog["sql"]}
    assert hog["sql"] in s["verdict"]
    group = hog["conn_id"] % 2
    assert set(x.loc[(x["stall_role"] == "victim").to_numpy(dtype=bool, na_value=False), "thread_group"]) == {group}
    assert s["slow_log"]["matched"] == sum(1 for t in truth(name) if (t["exec_s"] or 0) >= lqt(name))


@pytest.mark.parametrize("name", SETS)
def test_server_time_is_the_same_with_and_without_keys(tmp_root, name, analysed):
    a = analysed(name, True).exchanges
    b = analysed(name, False).exchanges
    both = a.merge(b, on=["conn_index", "seq"], suffixes=("", "_n"))
    assert len(both) == len(a) == len(b)
    assert np.allclose(both["server_s"].astype(float), both["server_s_n"].astype(float), equal_nan=True, atol=1e-9)


@pytest.fixture(scope="module")
def on_a_local_cluster(tmp_root) -> tuple[subprocess.CompletedProcess, Path]:
    """`pcapdecomp analyze group-stall-tls13 --scheduler local --jobs 2` as a user runs it (not quiet: the progress
    loop that polls the workers runs): the process and its output folder, read by the two tests below (a Dask
    cluster started once)."""
    pytest.importorskip("distributed")
    out = tmp_root / "out-tls13-dask"
    done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", str(CAPTURES / "group-stall-tls13"),
                           "--scheduler", "local", "--jobs", "2", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    return done, out


def test_a_dask_cluster_decrypts_as_one_process_does(tmp_root, on_a_local_cluster, analysed):
    """`analyze --scheduler local`: the key log goes to the workers with the task, so the exchanges table is the
    single-process one (decrypted: statement text, no ENCRYPTED flight), not the timed-only reading."""
    done, out = on_a_local_cluster
    assert done.returncode == 0, done.stderr[-2000:]
    one = analysed("group-stall-tls13", True)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    exchanges = pd.read_parquet(out / "exchanges.parquet")
    assert summary["inputs"]["scheduler"].startswith("local (2 worker processes")
    assert not (exchanges["command"] == "ENCRYPTED").any()
    sent = {r["sql"] for r in truth("group-stall-tls13") if r.get("sql")}
    assert sent and sent <= set(exchanges["sql"].dropna())
    pd.testing.assert_frame_equal(pd.read_parquet(one.out_dir / "exchanges.parquet"), exchanges, check_exact=True)
    assert one.summary["tls"] == summary["tls"]


def test_analyze_on_a_local_cluster_as_a_user_runs_it(on_a_local_cluster):
    """The command line: exit 0, the verdict opens with the decrypted connections."""
    done, _ = on_a_local_cluster
    assert done.returncode == 0, done.stderr[-2000:]
    n = len({t["conn_id"] for t in truth("group-stall-tls13")})
    assert done.stdout.splitlines()[0].startswith(f"{n} of {n} connections are TLS: decrypted with the key log")


def _lossy_copy(name: str, where: str, seed: int, with_keys: bool, folder: Path) -> int:
    """A copy of the set with 1 % of the frames of one point dropped (scripts/lose_frames.py); frames dropped."""
    sys.path.insert(0, str(REPO / "scripts"))
    from lose_frames import lose_frames

    folder.mkdir(parents=True)
    for f in ("capture.toml", "slow.log", *(["tls-keys.log"] if with_keys else [])):
        shutil.copyfile(CAPTURES / name / f, folder / f)
    for point in ("app", "db"):
        if point != where:
            shutil.copyfile(CAPTURES / name / f"{point}.pcap", folder / f"{point}.pcap")
    return len(lose_frames(CAPTURES / name / f"{where}.pcap", folder / f"{where}.pcap", 0.01, seed)[1])


POINTS = {"app_req_ts": "A1", "app_resp_ts": "A4", "db_req_ts": "D1", "db_resp_ts": "D4"}


def test_capture_loss_in_a_tls_connection_is_repaired_with_the_key_log(tmp_root, analysed):
    """1 % of the DB capture's frames lost (seed 1: 5 frames, inside 3 TLS connections): the other point's TLS
    records fill the holes and the connections are decrypted again; every statement the client sent is measured
    as without loss or bounded and marked, none wrong or unmarked (scripts/loss_acceptance.py's classes, against
    truth.jsonl and the loss-free reading)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from loss_acceptance import classify, truth_statements

    name = "group-stall-tls13"
    assert _lossy_copy(name, "db", 1, True, tmp_root / "lossy-keys") > 0
    lossy = analyze(tmp_root / "lossy-keys", Options(quiet=True), tmp_root / "out-lossy-keys")
    classes = Counter(classify(truth_statements(CAPTURES / name / "truth.jsonl"), lossy.exchanges,
                               analysed(name, True).exchanges))
    assert classes["wrong"] == classes["unmarked"] == classes["lost"] == 0, classes
    assert classes["bounded"] >= 1 and classes["full"] > 100, classes
    repair = lossy.summary["repair"]
    assert repair["connections"] >= 1 and repair["bytes_unrepaired"] == 0 and repair["bounded_times"] >= 1
    assert not (lossy.exchanges["command"] == "ENCRYPTED").any()


def test_capture_loss_in_a_tls_connection_is_repaired_without_the_key_log(tmp_root, analysed):
    """The same loss without the key log: each timed flight of the loss-free reading is there again (same
    connection, same TCP sequence number) with the same times, or with the time that fell on a lost frame null
    and named in `bounded` with its bounds; never another time."""
    name = "group-stall-tls13"
    assert _lossy_copy(name, "db", 1, False, tmp_root / "lossy-nokeys") > 0
    lossy = analyze(tmp_root / "lossy-nokeys", Options(quiet=True), tmp_root / "out-lossy-nokeys").exchanges
    ref = analysed(name, False).exchanges
    both = ref.merge(lossy, on=["conn_id", "req_tcp_seq"], how="left", suffixes=("", "_l"), indicator=True)
    assert (both["_merge"] == "both").all() and len(lossy) == len(ref)
    bounded = 0
    for column, point in POINTS.items():
        gone = both[column + "_l"].isna() & both[column].notna()
        assert both.loc[gone, "bounded_l"].fillna("").str.contains(point).all(), column
        depends = "total_s" if column.startswith("app") else "server_s"  # a duration that spans the point
        assert both.loc[gone, depends + "_lo_l"].notna().all() and both.loc[gone, depends + "_l"].isna().all()
        assert (both.loc[gone, depends + "_lo_l"] <= both.loc[gone, depends] + 5e-6).all()
        assert (both.loc[gone, depends + "_hi_l"] >= both.loc[gone, depends] - 5e-6).all()
        kept = both[column + "_l"].notna()
        assert both.loc[kept, column].notna().all()
        diff = (both.loc[kept, column + "_l"] - both.loc[kept, column]).abs()
        assert (diff <= pd.Timedelta(0 if column.startswith("app") else 5_000, "ns")).all(), column
        bounded += int(gone.sum())
    assert bounded >= 1


# ---- key logs from elsewhere, and mistakes -------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("editcap") is None, reason="editcap is not installed")
def test_secrets_embedded_in_a_pcapng_decrypt_it(tmp_path):
    src = CAPTURES / "group-stall-tls13"
    out = tmp_path / "db.pcapng"
    proc = subprocess.run(["editcap", "--inject-secrets", f"tls,{src / 'tls-keys.log'}", str(src / "db.pcap"),
                           str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert pcapng_secrets(out) == keys("group-stall-tls13")
    cli = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "exchanges", str(out), "-q", "--connections",
                          str(tmp_path / "c.csv")], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert cli.returncode == 0, cli.stderr
    assert set(pd.read_csv(tmp_path / "c.csv")["tls_mode"]) == {"decrypted"}


def test_a_key_log_that_is_not_one_is_a_one_line_mistake(tmp_path):
    bad = tmp_path / "keys.log"
    bad.write_text("CLIENT_RANDOM zz 00\n")
    src = CAPTURES / "group-stall-tls13"
    proc = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", str(src), "--tls-keylog", str(bad),
                           "-o", str(tmp_path / "out"), "-q"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "--tls-keylog" in proc.stderr


def test_a_gap_in_a_tls_stream_stops_that_direction_without_a_traceback():
    """A lost segment mid-connection: that direction cannot be framed (nor, in TLS 1.3, numbered) any more; its
    bytes after the loss are counted unreadable, and what came before stands."""
    from pcapdecomp.read.capture import open_capture
    from pcapdecomp.read.flows import FlowTracker

    found, unreadable = [], []

    def closed(flow):
        if flow.mysql is not None and flow.mysql.tls:
            decrypted, timed = flow.mysql.tls_split()
            unreadable.append(flow.mysql.counters.tls_bytes - decrypted - timed)

    tracker = FlowTracker(lambda flow, ex: found.append(ex), closed, tls_secrets=keys("group-stall-tls13"))
    dropped = None
    with open_capture(CAPTURES / "group-stall-tls13" / "db.pcap") as reader:
        for i, seg in enumerate(reader):
            if dropped is None and i > 200 and len(seg.payload) > 0:
                dropped = seg  # one segment lost, mid-capture
                continue
            tracker.segment(seg)
    tracker.finish()
    full = extract(CAPTURES / "group-stall-tls13" / "db.pcap", tls_secrets=keys("group-stall-tls13")).exchanges
    assert dropped is not None and 100 < len(found) < len(full)
    assert sum(1 for u in unreadable if u > 0) == 1


# ---- public TLS captures ---------------------------------------------------------------------------------------

CORPUS_TLS = ["wireshark-notes/mysql-ssl.pcapng", "wireshark-notes/mysql-ssl-larger.pcapng",
              "zeek/tls-12-amazon-rds.pcap", "zeek/tls-13-amazon-rds.pcap", "zeek/encrypted.pcap",
              "arkime/mysql-tls.pcap"]


@pytest.mark.parametrize("name", CORPUS_TLS)
def test_public_tls_captures_analyse_and_say_what_they_are(tmp_path, name):
    path = CORPUS / name
    if not path.exists():
        pytest.skip(f"{path} is not in the corpus")
    proc = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", "--db", str(path), "-o",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    tls = summary["tls"]
    assert tls is not None and tls["connections"] >= 1
    assert summary["verdict"].startswith(tls["sentence"]) and " TLS: " in tls["sentence"]
    assert tls["decrypted"] + tls["timed"] + tls["unreadable"] == tls["connections"]


@pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")
def test_evidence_keeps_the_secrets_wireshark_needs(tmp_root, analysed):
    """The evidence pcapng of a decrypted analysis holds the sessions' secrets and their handshakes: tshark reads
    the statements in it with no key log given; a secret of a session the file does not hold is not in it."""
    from pcapdecomp.render.evidence import export

    folder = tmp_root / "evidence-of-tls13"  # evidence is written into the analysis: a copy of the shared one
    shutil.copytree(analysed("group-stall-tls13", True).out_dir, folder)
    result = export(folder)
    db = next(p for p in result.files.values() if "db" in p.name)
    proc = subprocess.run([TSHARK, "-r", str(db), "-Y", "mysql.query", "-T", "fields", "-e", "mysql.query"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    hog = max(truth("group-stall-tls13"), key=lambda t: t["exec_s"] or 0)
    assert hog["sql"] in proc.stdout.splitlines()
    embedded = pcapng_secrets(db)
    assert embedded and set(embedded) < set(keys("group-stall-tls13"))


def test_a_capture_begun_after_the_handshakes_times_the_records_it_has(tmp_path):
    """The first 40 % of the TLS 1.3 DB capture removed: the connections are met mid-stream, inside TLS (no greeting,
    no handshake, nothing to decrypt with): given the server (--server), their records are still timed as flights,
    marked midstream."""
    from pcaptools import rewrite

    src = CAPTURES / "group-stall-tls13" / "db.pcap"
    frames = extract(src).quality()["frames"]
    rewrite(src, tmp_path / "cut.pcap", keep=lambda i, t: i >= int(frames * 0.4))
    from pcapdecomp.read.sources import parse_server

    # without a greeting or a plain command nothing says the encrypted connections are MySQL: --server does
    x = extract(tmp_path / "cut.pcap", servers={parse_server("10.213.77.2:3306")},
                tls_secrets=keys("group-stall-tls13"))
    q = x.quality()
    assert q["midstream_connections"] == q["tls_connections"] == q["mysql_connections"] > 0
    assert q["tls_timed_connections"] == q["tls_connections"] and q["tls_timed_bytes"] > 0
    assert q["mysql_bytes"] + q["unparsed_bytes"] + q["tls_bytes"] > 0
    ex = x.exchanges
    assert len(ex) > 20 and set(ex["command"]) == {"ENCRYPTED"}
    first = ex.sort_values("seq").groupby("conn_index").head(1)
    assert first["problems"].astype(str).str.contains("midstream").all()


def test_a_key_log_missing_one_session_decrypts_the_others_and_times_that_one():
    from pcapdecomp.explain.verdict import tls_part

    secrets = keys("group-stall-tls13")
    missing = sorted(secrets)[0]
    partial = {random: labels for random, labels in secrets.items() if random != missing}
    x = extract(CAPTURES / "group-stall-tls13" / "db.pcap", tls_secrets=partial)
    modes = x.connections["tls_mode"].value_counts().to_dict()
    assert modes == {"decrypted": len(secrets) - 1, "timed": 1}
    q = x.quality()
    assert q["tls_decrypted_bytes"] + q["tls_timed_bytes"] == q["tls_bytes"] and q["tls_timed_bytes"] > 0
    part = tls_part({"dbs": [q], "app": [], "proxy": []})
    assert part["decrypted"] == len(secrets) - 1 and part["timed"] == 1
    assert part["sentence"].startswith(f"{len(secrets)} of {len(secrets)} connections are TLS: "
                                       f"{len(secrets) - 1} decrypted with the key log; 1 timed without their text")


@pytest.mark.parametrize("with_keys", [True, False], ids=["keys", "no-keys"])
def test_damaged_tls_bytes_never_raise(with_keys):
    """Bytes of the TLS recording flipped at random (5 % of the segments, one byte each, 40 seeds): records that
    no longer frame or decrypt are counted, never raised; every connection still ends with a TLS mode."""
    import dataclasses
    import random

    from pcapdecomp.read.capture import open_capture
    from pcapdecomp.read.flows import FlowTracker

    with open_capture(CAPTURES / "group-stall-tls13" / "db.pcap") as reader:
        segments = list(reader)
    for seed in range(40):
        rng = random.Random(seed)
        modes = []

        def closed(flow):
            if flow.mysql is not None:
                modes.append(flow.mysql.tls_outcome)

        tracker = FlowTracker(lambda flow, ex: None, closed, tls_secrets=keys("group-stall-tls13") if with_keys else None)
        for seg in segments:
            if seg.payload and rng.random() < 0.05:
                data = bytearray(seg.payload)
                data[rng.randrange(len(data))] = rng.randrange(256)
                seg = dataclasses.replace(seg, payload=bytes(data))
            tracker.segment(seg)
        tracker.finish()
        assert modes and all(m in ("decrypted", "timed", "unreadable") for m in modes), (seed, modes)
