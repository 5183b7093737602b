"""Every public capture in ../shared/corpus parses, with the manifest's command counts."""

from __future__ import annotations

import pytest
from corpus import CORPUS, KNOWN_DIFFERENCES, captures, expected_commands

ROWS = captures()
pytestmark = pytest.mark.skipif(not ROWS, reason=f"public corpus not found at {CORPUS}")

# A non-MySQL client ("hello, world!") talking to a MySQL server: the server's ERR 1156 is the right answer, and
# the client's bytes are a protocol violation we must count, not hide.
EXPECTED_VIOLATIONS = {"percona-toolkit-tcpdump-text-converted/tcpdump043.pcap": 1}


@pytest.mark.parametrize("row", ROWS, ids=[r["path"] for r in ROWS])
def test_corpus_capture_command_counts(row, read_capture):
    result = read_capture(CORPUS / row["path"])
    # ENCRYPTED: a TLS flight read without a key log, its command unknown (the manifest counts the readable ones)
    got = {k: v for k, v in result.commands.items() if k not in ("CONNECT", "ENCRYPTED")}
    expected, _why = KNOWN_DIFFERENCES.get(row["path"], (dict(expected_commands(row)), ""))
    assert got == expected
    assert result.quality()["violations"] == EXPECTED_VIOLATIONS.get(row["path"], 0)
    # every frame is accounted for exactly once
    s = result.stats
    assert s.frames == (
        s.frames_tcp + s.frames_non_ip + s.frames_non_tcp + s.frames_ip_fragment + s.frames_undecodable
        + s.frames_unknown_link
    )
    assert s.frames == int(row["packets"])


def test_corpus_connection_ids_and_versions_from_greetings(read_capture):
    """Connections with a handshake carry the greeting's server version, as the manifest lists them."""
    checked = 0
    for row in ROWS:
        versions = {v.strip() for v in row["server_versions"].replace(";", ",").split(",") if v.strip() not in ("-", "")}
        if not versions or row["path"].endswith("mysql-8.pcap"):
            continue  # nDPI's mysql-8.pcap was hand-edited upstream
        result = read_capture(CORPUS / row["path"])
        seen = set(result.connections["server_version"].dropna())
        assert seen == versions, row["path"]
        checked += 1
    assert checked > 20
