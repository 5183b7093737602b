"""The public corpus of MySQL captures (../shared/corpus) and its MANIFEST's byte-level command counts."""

from __future__ import annotations

import csv
import functools
import os
import shutil
import subprocess
import tempfile
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


def capture_files() -> list[str]:
    """Every capture file of the corpus (pcap and pcapng), relative to it, in name order."""
    return sorted(str(p.relative_to(CORPUS)) for p in CORPUS.glob("*/*.pcap*"))


@functools.cache
def tshark_frames(fields: tuple[str, ...]) -> dict[str, list[list[str]]] | None:
    """`tshark -n -T fields -E occurrence=f -e FIELD …` of every corpus capture: {capture: one list of field values
    per frame, in the capture's order}, `frame.number` counted within the capture. One tshark process reads them
    all (mergecap concatenates the captures, each keeping interfaces of its own, `-I none`), once per run: a
    tshark process's start is most of what reading one small capture costs it. The concatenation is cut back
    into captures by the frame count of each (capinfos, Wireshark's reader); each capture's frames must carry
    interface ids that no other capture's frames carry, so a frame that landed in the wrong capture fails here.
    None where tshark, mergecap or capinfos is not installed."""
    if not all(shutil.which(tool) for tool in ("tshark", "mergecap", "capinfos")):
        return None
    files = capture_files()
    paths = [str(CORPUS / rel) for rel in files]
    counts = subprocess.run(["capinfos", "-T", "-r", "-c", *paths], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    frames = [int(line.rsplit("\t", 1)[1]) for line in counts]
    assert len(frames) == len(files)
    with tempfile.TemporaryDirectory(prefix="corpus-tshark-") as tmp:
        merged = Path(tmp) / "all.pcapng"
        subprocess.run(["mergecap", "-a", "-I", "none", "-F", "pcapng", "-w", str(merged), *paths],
                       capture_output=True, check=True)
        cmd = ["tshark", "-n", "-r", str(merged), "-T", "fields", "-E", "occurrence=f", "-e", "frame.interface_id"]
        for name in fields:
            cmd += ["-e", name]
        lines = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(lines) == sum(frames), (len(lines), sum(frames))
    number = fields.index("frame.number") if "frame.number" in fields else None
    out: dict[str, list[list[str]]] = {}
    start, interfaces_before = 0, -1
    for rel, n in zip(files, frames):
        rows = [line.split("\t") for line in lines[start:start + n]]
        interfaces = {int(row[0]) for row in rows}
        assert not interfaces or min(interfaces) > interfaces_before, (rel, sorted(interfaces), interfaces_before)
        interfaces_before = max(interfaces, default=interfaces_before)
        values = [row[1:] for row in rows]
        if number is not None:
            for row in values:
                row[number] = str(int(row[number]) - start)
        out[rel] = values
        start += n
    return out


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
