"""Protocol corners seen in other people's captures, each on a real or cut-from-real capture (tests/data/field,
see its README): an unprompted ERR before the server closes, a login without its answer, a non-MySQL
connection on a MySQL server's address, a switch to TLS after the greeting. Counts are checked against tshark
and against the frames themselves; the native lane must read every one of them as Python does."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from pcaptools import records, tcp_ports

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.core.console import capture_problems
from pcapdecomp.read.exchanges import extract

REPO = Path(__file__).resolve().parents[1]
FIELD = REPO / "tests" / "data" / "field"
CAPTURES = REPO / "captures"


def tshark(path: Path, display_filter: str, *options: str) -> list[str]:
    """Frame numbers tshark's display filter selects."""
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed")
    done = subprocess.run(["tshark", "-r", str(path), *options, "-Y", display_filter, "-T", "fields", "-e",
                           "frame.number"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def frames_of_port(path: Path, port: int) -> list[int]:
    """1-based frame numbers of the TCP connection with this client port, read from the raw records."""
    return [i + 1 for i, (_, pkt, _) in enumerate(records(path)[3]) if port in (tcp_ports(pkt) or ())]


def test_an_unprompted_err_before_closing_is_no_violation_and_no_invented_login():
    path = FIELD / "unprompted-err.pcap"
    x = extract(path)
    conns = x.connections.set_index("conn_index")
    # every ERR 1158 tshark sees is a connection's close_error, none an exchange's error
    assert len(tshark(path, "mysql.error_code == 1158")) == 2 == int((conns["close_error"] == 1158).sum())
    assert not (x.exchanges["error_code"] == 1158).any()
    whole, end_only = conns.loc[0], conns.loc[1]
    assert whole["violations"] == 0 and not whole["midstream"] and whole["exchanges"] == 5
    # the connection seen only from its end: no login made up from the server's ERR
    assert end_only["midstream"] and end_only["exchanges"] == 0 and end_only["unparsed_bytes"] == 0
    assert (x.exchanges["conn_index"] == 1).sum() == 0
    q = x.quality()
    assert q["violations"] == 0 and q["unparsed_bytes"] == 0
    assert "violation" not in (capture_problems(q) or "")
    # its requests all stay answered and unmarked
    assert list(x.exchanges["result"]) == ["ok"] + ["resultset"] * 4 and not x.exchanges["problems"].astype(bool).any()


def test_an_err_before_the_greeting_is_still_a_refused_connection():
    """The counterpart: zeek/auth.pcap's 'Host … is not allowed to connect' (1130) ERR instead of a greeting is a
    failed CONNECT, as it was (not an unprompted close)."""
    from corpus import CORPUS

    path = CORPUS / "zeek" / "auth.pcap"
    if not path.exists():
        pytest.skip("corpus not present")
    x = extract(path)
    refused = x.exchanges[x.exchanges["error_code"] == 1130]
    assert len(refused) == len(tshark(path, "mysql.error_code == 1130")) > 0
    assert set(refused["command"]) == {"CONNECT"} and x.connections["close_error"].isna().all()


@pytest.mark.parametrize("name,problem,frames", [("login-unanswered.pcap", "unanswered", 7),
                                                 ("login-incomplete.pcap", "incomplete", 8)])
def test_a_login_without_its_ok_or_err_has_no_result(name, problem, frames):
    x = extract(FIELD / name)
    (login,) = x.exchanges.itertuples()
    assert x.stats.frames == frames
    assert login.command == "CONNECT" and pd_na(login.result)
    assert login.problems == problem
    assert x.connections["login_ok_ts"].isna().all()


def test_result_none_only_where_no_response_is_expected():
    """docs: `none` is for commands the server never answers (COM_QUIT, COM_STMT_CLOSE, SEND_LONG_DATA)."""
    paths = sorted(CAPTURES.glob("*/db.pcap")) + sorted(FIELD.glob("*.pcap"))
    commands = set()
    for path in paths:
        x = extract(path)
        commands |= set(x.exchanges.loc[x.exchanges["result"] == "none", "command"])
    assert commands and commands <= {"COM_QUIT", "COM_STMT_CLOSE", "COM_STMT_SEND_LONG_DATA"}


def test_a_plain_text_health_check_on_a_mysql_address_is_not_a_midstream_connection():
    path = FIELD / "corners.pcap"
    x = extract(path)
    health = frames_of_port(path, 59816)  # MariaDB stopped; an HTTP server answered on 10.213.77.2:3306
    assert len(health) == 12 and len(tshark(path, "tcp.port == 59816 && http", "-d", "tcp.port==3306,http")) == 2
    assert not x.connections["client"].str.endswith(":59816").any()
    q = x.quality()
    assert q["midstream_connections"] == 0 and q["unparsed_bytes"] == 0
    idle = frames_of_port(path, 59782)  # a MySQL connection seen only by its closing handshake (no payload)
    assert q["frames_tcp_other"] == len(health) + len(idle)
    # the standalone capture of the health check: no MySQL at all, said so
    alone = extract(FIELD / "no-mysql.pcap").quality()
    assert alone["mysql_connections"] == 0 and alone["frames_tcp_other"] == alone["frames"] == 12
    assert "no MySQL traffic found" in capture_problems(alone)


def test_a_client_that_is_not_mysql_is_a_counted_violation():
    """The HTTP request line sent to MariaDB itself (ERR 1156 'Got packets out of order'): the bytes do not fit
    the protocol, so it stays one counted violation with its note."""
    x = extract(FIELD / "corners.pcap")
    c = x.connections[x.connections["client"].str.endswith(":59808")].iloc[0]
    assert c["violations"] == 1 and "before the client's login" in c["violation_notes"] and c["exchanges"] == 0


def test_a_switch_to_tls_after_the_greeting_is_timed_by_its_records():
    """No key log: the TLS connection's application-data flights are its exchanges, the login (CONNECT) first, each
    starting at a client frame that carries application data after the handshake (tshark's)."""
    path = FIELD / "corners.pcap"
    x = extract(path)
    tls = x.exchanges[x.exchanges["tls"].fillna(False)].sort_values("seq")
    assert int(x.connections["tls"].sum()) == 1
    conn = x.connections[x.connections["tls"]].iloc[0]
    assert conn["tls_mode"] == "timed" and conn["tls_timed_bytes"] == conn["tls_bytes"] > 0
    # the client's Finished rides with its ChangeCipherSpec (frame 30): handshake, not a request
    flights = tshark(path, "tcp.srcport == 59794 && tls.app_data && !tls.change_cipher_spec")
    assert [str(f) for f in tls["req_first_frame"]] == flights
    assert list(tls["command"]) == ["CONNECT"] + ["ENCRYPTED"] * (len(flights) - 1)
    assert tls.iloc[0]["client"].endswith(":59794") and pd_na(tls.iloc[0]["user"])
    # the bundled features recording's TLS connection too
    feats = extract(CAPTURES / "features" / "db.pcap")
    assert int(feats.connections["tls"].sum()) == 1
    assert set(feats.exchanges.loc[feats.exchanges["tls"].fillna(False), "command"]) == {"CONNECT", "ENCRYPTED"}


def pd_na(value) -> bool:
    import pandas as pd

    return value is None or pd.isna(value)


def test_analyze_of_the_corners_warns_only_about_what_is_wrong(tmp_path):
    r = analyze(capture_set(db=FIELD / "unprompted-err.pcap"), Options(quiet=True, jobs=1), tmp_path / "a")
    assert not any("violation" in w for w in r.warnings), r.warnings
    r = analyze(capture_set(db=FIELD / "corners.pcap"), Options(quiet=True, jobs=1), tmp_path / "b")
    problems = next(w for w in r.warnings if "corners.pcap" in w)
    # the TLS connection is timed by its records: its bytes are read, not a problem
    assert "1 protocol violations" in problems and "encrypted (TLS) bytes" not in problems
    assert "skipped while resynchronising" not in problems


@pytest.mark.parametrize("path", sorted(FIELD.glob("*.pcap")), ids=lambda p: p.name)
def test_the_native_lane_reads_the_corners_as_python_does(path):
    from lanes import assert_same

    from pcapdecomp.read import fastlane

    if not fastlane.NATIVE:
        pytest.skip("the native lane is not built")
    assert_same(path)
