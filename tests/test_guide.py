"""`pcapdecomp guide`: the capture plan. Its options and its capture.toml here; in the lab (test marked `lab`), its
printed commands run literally on the lab's two hosts against the group-stall workload, and `analyze` on the folder,
with no option added, tells what the workload's own truth (performance_schema, the client's timings) says."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from pcapdecomp.guide import PCAP_RECORD_HEADER_BYTES, GuideOptions, capture_toml, disk, plan
from pcapdecomp.read.captureset import resolve_capture_set

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "pcapdecomp.cli"]
ENV = dict(os.environ, PYTHONPATH=str(REPO))


def _guide(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "guide", *args], capture_output=True, text=True, cwd=cwd, env=ENV)


def sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """The plan's numbered sections: title -> [(the host line above a command, the command)], in order."""
    found: dict[str, list[tuple[str, str]]] = {}
    title, where = "", ""
    for line in text.splitlines():
        if line.startswith("## "):
            title, where = line[3:], ""
            found[title] = []
        elif line.startswith("    ") and title:
            found[title].append((where, line[4:]))
        elif line.startswith("On the "):
            where = line
    return found


def test_guide_writes_a_capture_set_analyze_reads(tmp_path):
    out = tmp_path / "cap"
    done = _guide("--server", "10.0.0.5:3306", "--app-host", "10.0.0.7", "--app-host", "10.0.0.8",
                  "--duration", "300", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    toml = tomllib.loads((out / "capture.toml").read_text())
    # only what was given: no thread_pool_size or long_query_time stands in for a value nobody read
    assert toml["server"] == {"address": "10.0.0.5:3306"}
    got = sections(done.stdout)
    starts = [(where, cmd) for where, cmd in got["3. Start the captures, at the same time on every host"]
              if "tcpdump" in cmd]
    assert [where for where, _ in starts] == ["On the DB host (10.0.0.5):", "On the app host 10.0.0.7:",
                                              "On the app host 10.0.0.8:"]
    for _, cmd in starts:
        for part in ("-s 0", "-B ", "--time-stamp-precision=nano", "-C 100", "-W ", "timeout -s INT 300",
                     "'tcp and host 10.0.0.5 and port 3306'"):
            assert part in cmd
    # the files the commands write are where a capture-set folder has them: one subfolder per point
    written = [Path(re.search(r"-w (\S+)", cmd).group(1)) for _, cmd in starts]
    assert [p.parent.name for p in written] == ["db", "app-10.0.0.7", "app-10.0.0.8"]
    assert all(p.parent.parent == out for p in written)
    analyze = [cmd for _, cmd in got["7. Gather and analyse"]]
    assert analyze == [f"pcapdecomp analyze {out}"]
    for p in written:  # as if the captures were taken: the folder resolves to one DB point and two app points
        p.parent.mkdir(parents=True, exist_ok=True)
        p.with_name(p.name + "00").write_bytes(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, 276))
    (out / "slow.log").write_text("")
    resolved = resolve_capture_set(out, [], None, None, None, None, [])
    assert resolved.servers == ["10.0.0.5:3306"]
    assert sorted(Path(pt.given).name for pt in resolved.points) == ["app-10.0.0.7", "app-10.0.0.8", "db"]
    assert resolved.slow_log == out / "slow.log"
    sql = "\n".join(cmd for _, cmd in got["2. On the DB host, before the window"])
    assert "SET GLOBAL long_query_time = 0" in sql and "variables.tsv" in sql
    assert "information_schema.PROCESSLIST" in got["4. On the DB host, while the captures run"][0][1]


def test_guide_keeps_what_the_user_knows():
    opts = GuideOptions(server="[fd77::2]:3306", long_query_time=2.0, thread_pool_size=8)
    toml = tomllib.loads(capture_toml(opts))
    assert toml["server"] == {"address": "[fd77::2]:3306", "long_query_time": 2.0, "thread_pool_size": 8}
    assert "'tcp and host fd77::2 and port 3306'" in plan(opts)


@pytest.mark.parametrize("handling, given, expected", [
    ("pool-of-threads", {}, {"long_query_time": 1, "thread_handling": "pool-of-threads", "thread_pool_size": 4,
                             "thread_pool_stall_limit": 500}),
    # the variable exists without the pool (MariaDB, Percona): no thread groups are made up from it
    ("one-thread-per-connection", {}, {"long_query_time": 1, "thread_handling": "one-thread-per-connection"}),
    # what the user gave is not written twice (a TOML error)
    ("pool-of-threads", {"long_query_time": 2.0, "thread_pool_size": 8},
     {"long_query_time": 2.0, "thread_handling": "pool-of-threads", "thread_pool_size": 8,
      "thread_pool_stall_limit": 500}),
])
def test_the_db_hosts_capture_toml_holds_the_servers_own_values(tmp_path, handling, given, expected):
    """Section 2's capture.toml line, run by sh and awk on variables.tsv as `mysql -B` writes it."""
    out = tmp_path / "cap"
    out.mkdir()
    (out / "variables.tsv").write_text("Variable_name\tValue\nlong_query_time\t1.000000\nthread_handling\t"
                                       f"{handling}\nthread_pool_size\t4\nthread_pool_stall_limit\t500\n")
    text = plan(GuideOptions(server="10.0.0.5:3306", out=out, **given))
    line = next(cmd for _, cmd in sections(text)["2. On the DB host, before the window"] if "printf" in cmd)
    subprocess.run(["sh", "-c", line], check=True, cwd=tmp_path)
    written = tomllib.loads((out / "capture.toml").read_text())
    assert written["server"] == {"address": "10.0.0.5:3306", **expected}


@pytest.mark.parametrize("log_output, window", [("FILE", None), ("FILE,TABLE", None), ("TABLE", "TABLE,FILE"),
                                                ("NONE", "FILE")])
def test_the_slow_log_goes_to_its_file_for_the_window_and_back(tmp_path, log_output, window):
    """Sections 2 and 5's log_output lines, run by sh and awk on variables.tsv as `mysql -B` writes it; `echo` as the
    client prints the SQL each would send."""
    out = tmp_path / "cap"
    out.mkdir()
    (out / "variables.tsv").write_text(f"Variable_name\tValue\nlog_output\t{log_output}\nlong_query_time\t1.000000\n")
    got = sections(plan(GuideOptions(server="10.0.0.5:3306", out=out, mysql="echo")))
    before = next(cmd for _, cmd in got["2. On the DB host, before the window"] if "LOG_OUTPUT=" in cmd)
    after = next(cmd for _, cmd in got["5. On the DB host, after the captures stopped"] if "log_output =" in cmd)
    said = subprocess.run(["sh", "-c", before], capture_output=True, text=True, check=True).stdout
    assert said == ("" if window is None else f"-e SET GLOBAL log_output = '{window}'\n")
    said = subprocess.run(["sh", "-c", after], capture_output=True, text=True, check=True).stdout
    assert said == f"-e SET GLOBAL log_output = '{log_output}'\n"


def test_disk_estimate_and_ring():
    opts = GuideOptions(server="10.0.0.5:3306", duration_s=3600, packet_rate=20_000, packet_bytes=150, rotate_mb=200)
    d = disk(opts)
    assert d.per_point_bytes == 3600 * 20_000 * (150 + PCAP_RECORD_HEADER_BYTES)
    assert d.files_per_point * 200e6 >= 2 * d.per_point_bytes  # room for twice the estimate
    assert f"-C 200 -W {d.files_per_point} " in plan(opts)
    assert "11,952 MB" in plan(opts)


@pytest.mark.parametrize("args, words", [
    (["--server", "db.example:3306"], "must be an IP address"),
    (["--server", "10.0.0.5"], "HOST:PORT"),
    (["--server", "10.0.0.5:3306", "--app-host", "app1"], "--app-host must be an IP address"),
    (["--server", "10.0.0.5:3306", "--duration", "0"], "--duration"),
    (["--server", "10.0.0.5:3306", "--interface", "eth0 or 1=1"], "--interface"),
])
def test_guide_mistakes_are_one_line(tmp_path, args, words):
    done = _guide(*args, "--out", str(tmp_path / "cap"), cwd=tmp_path)
    assert done.returncode == 2 and words in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "cap").exists()


def test_guide_does_not_replace_another_servers_capture_toml(tmp_path):
    assert _guide("--server", "10.0.0.5:3306", "--out", str(tmp_path / "cap"), cwd=tmp_path).returncode == 0
    again = _guide("--server", "10.0.0.5:3306", "--out", str(tmp_path / "cap"), cwd=tmp_path)
    assert again.returncode == 0  # the same plan again
    with open(tmp_path / "cap" / "capture.toml", "a") as f:  # as the DB host's line completes it
        f.write("long_query_time = 1\n")
    again = _guide("--server", "10.0.0.5:3306", "--out", str(tmp_path / "cap"), cwd=tmp_path)
    assert again.returncode == 0 and "long_query_time = 1" in (tmp_path / "cap" / "capture.toml").read_text()
    other = _guide("--server", "10.0.0.6:3306", "--out", str(tmp_path / "cap"), cwd=tmp_path)
    assert other.returncode == 2 and "describes another capture" in other.stderr
    assert "10.0.0.5:3306" in (tmp_path / "cap" / "capture.toml").read_text()


# --- in the lab: the plan followed literally ---------------------------------------------------------------------

@pytest.mark.lab
def test_guide_followed_in_the_lab_gives_the_right_verdict(tmp_path):
    from labsets import require_lab

    require_lab()
    sys.path.insert(0, str(REPO / "captures" / "lab"))
    from hosts import APP_IPV4, DB_IPV4, MYSQL_PORT, Child, PrivateMariaDB, ServerSettings, TestHosts
    from record import _calibrate_hog_rounds, _statement_history, join_truth
    from scenarios import HELD_GROUPS

    out = tmp_path / "cap"
    pool_size = HELD_GROUPS["thread_pool_size"]
    with TestHosts(tag=f"g{os.getpid()}") as hosts, \
            PrivateMariaDB(hosts.db, hosts.app, tmp_path / "server", ServerSettings(**HELD_GROUPS)) as server:
        rounds = _calibrate_hog_rounds(server, 3.0)
        with server.admin() as conn, conn.cursor() as cur:
            cur.execute("TRUNCATE TABLE performance_schema.events_statements_history_long")
        done = _guide("--server", f"{DB_IPV4}:{MYSQL_PORT}", "--app-host", APP_IPV4, "--duration", "14",
                      "--rotate-mb", "1", "--out", str(out), "--mysql", f"mariadb -S {server.socket} -u root",
                      cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        got = sections(done.stdout)
        ns = {"On the DB host": hosts.db, "On the app host": hosts.app}

        def script(title: str) -> None:
            """A section's commands, in one shell on the DB host (they share $SLOW), as a user pastes them."""
            text = "set -e\n" + "\n".join(cmd for _, cmd in got[title])
            ran = subprocess.run(hosts.db.command("sh", "-c", text), capture_output=True, text=True, cwd=tmp_path)
            assert ran.returncode == 0, (title, ran.stderr)

        with server.admin() as conn, conn.cursor() as cur:  # what capture.toml must say: the server's own, before
            cur.execute("SELECT @@global.long_query_time, @@global.thread_pool_size, @@global.thread_handling")
            server_lqt, server_tps, handling = cur.fetchone()
        script("2. On the DB host, before the window")
        written = tomllib.loads((out / "capture.toml").read_text())["server"]
        assert written["address"] == f"{DB_IPV4}:{MYSQL_PORT}" and written["thread_handling"] == handling
        assert written["long_query_time"] == server_lqt and written["thread_pool_size"] == server_tps
        dumps = []
        try:
            for where, cmd in got["3. Start the captures, at the same time on every host"]:
                host = next(h for prefix, h in ns.items() if where.startswith(prefix))
                if not cmd.startswith("timeout"):
                    subprocess.run(host.command("sh", "-c", cmd), check=True, cwd=tmp_path)
                    continue
                dumps.append(subprocess.Popen(host.command("sh", "-c", cmd), stderr=subprocess.PIPE, text=True,
                                              cwd=tmp_path))
                said = [dumps[-1].stderr.readline() for _ in range(1)]
                while "listening on" not in said[-1] and said[-1] and len(said) < 5:  # it captures from then on
                    said.append(dumps[-1].stderr.readline())
                assert "listening on" in said[-1], said
            assert len(dumps) == 2
            script("4. On the DB host, while the captures run")
            client_file = tmp_path / "client.jsonl"
            params = {"clients": 6, "duration": 6.0, "interval_s": 0.075, "hog_at_s": 1.5, "pool_size": pool_size,
                      "hog_rounds": rounds, "seed": 1}
            with Child(hosts.app.command(sys.executable, str(REPO / "captures" / "lab" / "workload.py"),
                                         "group-stall", "--host", DB_IPV4, "--port", str(MYSQL_PORT), "--out",
                                         str(client_file), "--params", json.dumps(params))) as child:
                assert child.wait(120) == 0
            for dump in dumps:  # each stops by itself when its window ends
                dump.wait(60)
                assert dump.returncode in (0, 124), dump.stderr.read()
                assert re.search(r"^0 packets dropped by kernel", dump.stderr.read(), re.M)
        finally:
            for dump in dumps:
                if dump.poll() is None:
                    dump.kill()
                    dump.wait()
        script("5. On the DB host, after the captures stopped")
        with server.admin() as conn, conn.cursor() as cur:  # the server as it was before the window
            cur.execute("SELECT @@global.long_query_time, @@global.slow_query_log")
            assert cur.fetchone() == (1.0, 0)
        truth = join_truth([json.loads(line) for line in client_file.read_text().splitlines()],
                           _statement_history(server), pool_size)
    assert (out / "processlist.tsv").read_text().startswith("ID\tUSER\tHOST\tDB\tCOMMAND")
    assert "thread_pool_size\t2" in (out / "variables.tsv").read_text()
    analyze = got["7. Gather and analyse"][0][1].split()
    assert analyze[:2] == ["pcapdecomp", "analyze"]
    ran = subprocess.run([*CLI, *analyze[1:]], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert ran.returncode == 0, ran.stderr
    summary = json.loads((tmp_path / "reports" / "cap" / "summary.json").read_text())
    exchanges = pd.read_parquet(tmp_path / "reports" / "cap" / "exchanges.parquet")
    # the truth: the hog, and the probes that waited for its thread group (client time minus performance_schema's
    # execution); a wait near the 0.1 s threshold may go either way, so the tool's list lies between two bounds
    hog = next(r for r in truth if (r["sql"] or "").startswith("SELECT BENCHMARK"))
    probes = [r for r in truth if r["sql"] == "SELECT 1" and r["exec_s"] is not None]
    surely = Counter(r["conn_id"] for r in probes if r["client_s"] - r["exec_s"] >= 0.2)
    maybe = Counter(r["conn_id"] for r in probes if r["client_s"] - r["exec_s"] >= 0.05)
    hog_group = hog["conn_id"] % pool_size
    assert any(c % pool_size == hog_group for c in surely)  # the recording stalled the hog's thread group
    # thread_pool_size as the server said it (capture.toml); the wire agrees where the truth's waits tell the size,
    # when only probes of the hog's group waited. On a loaded machine probes of the other group wait too (at load 14
    # the wire told no size): then it may tell none, or a stall there without a long statement, never another size
    size = summary["thread_pool_size"]
    assert size["value"] == pool_size and size["source"] == "given"
    if all(c % pool_size == hog_group for c in maybe):
        assert size["inferred"]["value"] == pool_size and size["warning"] is None, size
    else:
        assert size["inferred"]["value"] in (pool_size, None), size
        assert size["warning"] is None or "stalls have no culprit" in size["warning"], size
    stalls = summary["groups"]["stalls"]
    named = [s["thread_group"] for s in stalls]
    # the hog's group, and another only where the truth has waits there too (a loaded machine slows every group)
    assert hog_group in named and set(named) <= {c % pool_size for c in maybe}, (named, maybe)
    assert hog["conn_id"] in {c["conn_id"] for c in stalls[named.index(hog_group)]["culprits"]}
    waited = Counter(exchanges.loc[exchanges["understated"].fillna(False).astype(bool), "conn_id"].astype(int))
    assert surely <= waited <= maybe, (surely, waited, maybe)  # every wait the slow log hides, and only those
    assert f"thread group {hog_group}" in summary["story"]["sentence"]
    assert f"connection {hog['conn_id']}" in summary["story"]["sentence"]
    assert summary["exchanges"]["seen_app"] == summary["exchanges"]["seen_db"] == 0
