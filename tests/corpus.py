"""The public corpus of MySQL captures (../shared/corpus) and its MANIFEST's byte-level command counts."""

from __future__ import annotations

import csv
import os
from collections import Counter
from pathlib import Path


def _corpus() -> Path:
    """../shared/corpus next to the checkout; PCAPDECOMP_CORPUS or /work/shared/corpus for a clone elsewhere."""
    for candidate in (os.environ.get("PCAPDECOMP_CORPUS"), Path(__file__).resolve().parents[2] / "shared" / "corpus",
                      "/work/shared/corpus"):
        if candidate and (Path(candidate) / "MANIFEST.tsv").exists():
            return Path(candidate)
    return Path(__file__).resolve().parents[2] / "shared" / "corpus"


CORPUS = _corpus()
MANIFEST = CORPUS / "MANIFEST.tsv"


def manifest_rows() -> list[dict]:
    if not MANIFEST.exists():
        return []
    with MANIFEST.open(newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def captures() -> list[dict]:
    """Rows for real capture files (not the percona text dumps)."""
    return [r for r in manifest_rows() if not r["path"].endswith(".txt")]


def expected_commands(row: dict) -> Counter:
    """Command counts per the manifest's heuristic (byte-level) columns, keyed like our `command` column."""
    counts: Counter = Counter()
    query = row["com_query(tshark/heuristic)"].split("/")[-1]
    if query.strip().isdigit() and int(query):
        counts["COM_QUERY"] = int(query)
    for column in ("prepared_statements", "other_commands"):
        text = row[column].split("|")[0].strip()
        if text in ("", "-"):
            continue
        for item in text.split(","):
            name, _, n = item.strip().partition("=")
            if n.isdigit():
                counts["COM_" + name] += int(n)
    if row["compression"].startswith("yes") or "compress" in row["notes"]:
        counts.pop("COM_SLEEP", None)  # tshark 4.0's reading of compressed frames (see the manifest's notes)
    return counts


# Where the manifest's byte-level count is not the truth, with the reason (checked by hand against the bytes and
# against percona-toolkit's own expected parser output in corpus/percona-toolkit-tcpdump-text/expected/).
KNOWN_DIFFERENCES: dict[str, tuple[dict, str]] = {
    "01_SQL_Tools/mysql_test.pcap": (
        {"COM_QUIT": 1},
        "the 'INIT_DB' is tshark's reading of the caching_sha2 public-key request (0x02) during the login",
    ),
    "percona-toolkit-tcpdump-text-converted/tcpdump017.pcap": (
        {"COM_QUERY": 1},
        "crafted: the same 37 bytes sent 4 times with sequence numbers shifted by 1; TCP-wise 3 are overlapping"
        " retransmissions (pt-query-digest ignores sequence numbers and counts 4)",
    ),
    "percona-toolkit-tcpdump-text-converted/tcpdump035.pcap": (
        {"COM_QUERY": 2, "COM_QUIT": 2},
        "client port reuse: two connections on one 4-tuple; percona's MySQLProtocolParser.t expects both"
        " connections' query and quit",
    ),
}
