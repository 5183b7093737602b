#!/usr/bin/env python3
"""Bounded-time mutation fuzzing of the capture reader, TCP reassembly + the MySQL protocol core, the fast lane,
`analyze` end to end and the slow-log parser.

Seeds are the bundled real recordings. Each round mutates one of them:
  - capture reader: bit flips, byte overwrites, truncation, inserted junk, huge record lengths in the file bytes;
    reading may only end in a PcapdecompError or in normal iteration, never another exception;
  - flows/tcp/mysql: the segments of a real capture with payload bytes flipped, segments dropped, duplicated,
    reordered, split and cut; the tracker must never raise and every exchange must be well-formed;
  - the native fast lane (pcapdecomp/_lane.c): a mutated capture file is extracted with and without the lane;
    both must give the same tables, counters and statistics, or the same error. The seeds are read as classic
    pcap and as pcapng (one interface; or two interfaces with ns and 2^-30 s clocks, big-endian, two sections,
    simple packet blocks, name resolution and statistics blocks), and a fifth of the mutated files are
    gzip-compressed, so the lane's pcapng and gzip readers are compared with Python's too (the capture reader
    target reads the pcapng seeds as well);
  - analyze, end to end and in-process: a real capture set (app, DB, slow log) whose pcap fields are mutated where
    they mean something (record timestamps and lengths, IP lengths, TCP sequence numbers and flags, MySQL packet
    lengths, sequence ids and commands, statement text overwritten with markup, quotes and comment openers) and
    whose slow log is mutated too; the run may only end normally or in a PcapdecompError, and what it wrote must
    be strict JSON and a report;
  - the slow-log parser (slowlog.read_slow_log) on real slow logs with lines dropped, repeated and swapped, and
    numbers (Query_time, Time, SET timestamp, Id, rows) replaced by extreme, negative and malformed values;
  - embedded headers: a real slow log where one statement holds copies of other entries' header blocks (a forged
    entry), read with the wire's copy of it whole (exactly the log's own entries) or cut (any extra entry flagged);
  - terminal: any text through console.terminal_text / say holds nothing a terminal acts on;
  - output folders: a folder of a user's files (some by our names, a manifest listing some) written by
    OutputFolder: unlisted files stay as they were, or the run refuses and changes nothing.

    python3 scripts/fuzz.py --seconds 60 [--seed N] [--only TARGET]

The time is shared between the targets by weight (not by rounds: an analyze run costs a hundred reader rounds).
Prints the number of inputs tried per target and exits non-zero on the first failure (with a reproducer seed).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import shutil
import struct
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pcapdecomp.core.errors import PcapdecompError  # noqa: E402
from pcapdecomp.mysql.connection import ENCRYPTED_RESULT  # noqa: E402
from pcapdecomp.read.capture import open_capture  # noqa: E402
from pcapdecomp.read.flows import FlowTracker  # noqa: E402

SETS = [REPO / "captures" / name for name in ("features", "group-stall", "maxthreads")]
SEEDS = [folder / side for folder in SETS for side in ("app.pcap", "db.pcap")]
# pcapng shapes of every seed (tests/pcaptools.to_pcapng): a plain one, and one with what pcapng allows beyond pcap
PCAPNG_SHAPES = [dict(interfaces=1, extra_blocks=False),
                 dict(interfaces=2, resolutions=(9, 0x80 | 30), big_endian=True, sections=2, simple_every=7)]
SLOW_LOGS = sorted((REPO / "tests" / "data" / "slowlog").glob("*.log")) + [folder / "slow.log" for folder in SETS]


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(5)
        pos = rng.randrange(len(buf)) if buf else 0
        if op == 0 and buf:
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[pos] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        elif op == 2:
            del buf[rng.randrange(len(buf) + 1) :]
        elif op == 3:
            buf[pos:pos] = os.urandom(rng.randint(1, 64))
        elif op == 4 and len(buf) > pos + 4:
            buf[pos : pos + 4] = rng.choice((b"\xff\xff\xff\x7f", b"\xff\xff\xff\x00", b"\x00\x00\x00\x00"))
    return bytes(buf)


def fuzz_reader(data: bytes, rng: random.Random, tmp: Path) -> None:
    path = tmp / "fuzz.pcap"
    path.write_bytes(mutate_bytes(data, rng))
    try:
        with open_capture(path) as reader:
            for _ in reader:
                pass
    except PcapdecompError:
        pass


def mutate_segments(segments: list, rng: random.Random) -> list:
    segs = list(segments)
    for _ in range(rng.randint(1, 12)):
        if not segs:
            break
        i = rng.randrange(len(segs))
        op = rng.randrange(7)
        seg = segs[i]
        if op == 0 and seg.payload:
            payload = bytearray(seg.payload)
            payload[rng.randrange(len(payload))] ^= 1 << rng.randrange(8)
            segs[i] = replace(seg, payload=bytes(payload))
        elif op == 1:
            del segs[i]
        elif op == 2:
            segs.insert(i, seg)
        elif op == 3 and i + 1 < len(segs):
            segs[i], segs[i + 1] = segs[i + 1], segs[i]
        elif op == 4 and len(seg.payload) > 1:
            cut = rng.randrange(1, len(seg.payload))
            segs[i : i + 1] = [replace(seg, payload=seg.payload[:cut]), replace(seg, seq=(seg.seq + cut) % (1 << 32), payload=seg.payload[cut:])]
        elif op == 5 and seg.payload:
            cut = rng.randrange(len(seg.payload))
            segs[i] = replace(seg, payload=seg.payload[:cut], missing=len(seg.payload) - cut)
        elif op == 6:
            segs[i] = replace(seg, payload=os.urandom(rng.randint(0, 80)))
    return segs


def fuzz_flows(segments: list, rng: random.Random) -> int:
    exchanges = []
    tracker = FlowTracker(lambda flow, ex: exchanges.append(ex), lambda flow: None)
    for seg in mutate_segments(segments, rng):
        tracker.segment(seg)
    tracker.finish()
    for ex in exchanges:
        assert ex.command and ex.req_first_ts is not None, ex
        assert ex.result in (None, "ok", "error", "resultset", "none", ENCRYPTED_RESULT), ex  # schema: result
        assert ex.bytes_req >= 0 and ex.bytes_resp >= 0 and ex.rows >= 0, ex
    return len(exchanges)


def _extraction(path: Path, lane: bool):
    """What extract gives, as comparable values, or the error it raised."""
    import dataclasses

    from pcapdecomp.read.exchanges import extract

    if lane:
        os.environ.pop("PCAPDECOMP_NO_LANE", None)
    else:
        os.environ["PCAPDECOMP_NO_LANE"] = "1"
    try:
        x = extract(path)
    except PcapdecompError as err:
        return ("error", type(err).__name__, str(err))
    finally:
        os.environ.pop("PCAPDECOMP_NO_LANE", None)
    return (x.exchanges, x.connections, dataclasses.asdict(x.stats), x.quality(), dict(x.commands),
            x.other_tcp_frames, x.other_tcp_bytes, x.flow_first_frames)


def pcapng_seeds(seeds: list[Path], tmp: Path) -> list[bytes]:
    """Every seed as pcapng in each of PCAPNG_SHAPES."""
    sys.path.insert(0, str(REPO / "tests"))
    from pcaptools import to_pcapng

    out = []
    for i, seed in enumerate(seeds):
        for k, shape in enumerate(PCAPNG_SHAPES):
            ng = tmp / f"seed-{i}-{k}.pcapng"
            to_pcapng(seed, ng, **shape)
            out.append(ng.read_bytes())
            ng.unlink()
    return out


def fuzz_lane(data: bytes, rng: random.Random, tmp: Path) -> None:
    import pandas as pd

    path = tmp / "lane.pcap"
    buf = bytearray(data)
    if rng.random() < 0.5:  # flips inside the packets (MySQL payloads) rather than anywhere
        for _ in range(rng.randint(1, 6)):
            pos = rng.randrange(24, len(buf))
            buf[pos] ^= 1 << rng.randrange(8)
        mutated = bytes(buf)
    else:
        mutated = mutate_bytes(data, rng)
    if rng.random() < 0.2:  # the lane reads gzip itself: its inflating reader against Python's
        mutated = gzip.compress(mutated, compresslevel=1, mtime=0)
    path.write_bytes(mutated)
    python, native = _extraction(path, False), _extraction(path, True)
    if isinstance(python[0], str) or isinstance(native[0], str):  # ("error", kind, message)
        assert python == native, (python[:3], native[:3])
        return
    pd.testing.assert_frame_equal(python[0], native[0])
    pd.testing.assert_frame_equal(python[1], native[1])
    assert python[2:] == native[2:], "counters differ with and without the fast lane"


# --- analyze end to end: structure-aware mutations of real capture sets ------------------------------------------

HOSTILE_TEXTS = [b"<script>alert(1)</script>", b"<!--<script", b"</script>", b"'\"", b"/*", b"#'", b"-- ",
                 b"\xe2\x80\xa8", b"=1+2", b"@SUM(A1)", b"union select ", b"\x00\xff", b"%s%n", b"\\"]


def pcap_records(data: bytes) -> list[int]:
    """Offsets of the record headers of a little-endian classic pcap (the lab's recordings)."""
    out, pos = [], 24
    while pos + 16 <= len(data):
        out.append(pos)
        pos += 16 + struct.unpack_from("<I", data, pos + 8)[0]
    return out


def _tcp_offsets(buf: bytearray, rec: int) -> tuple[int, int, int] | None:
    """(IP header, TCP header, payload) offsets of an Ethernet/IPv4/TCP record, else None."""
    frame = rec + 16
    if buf[frame + 12:frame + 14] != b"\x08\x00" or len(buf) < frame + 34 or buf[frame + 23] != 6:
        return None
    ip = frame + 14
    tcp = ip + (buf[ip] & 0x0F) * 4
    if len(buf) < tcp + 20:
        return None
    return ip, tcp, tcp + (buf[tcp + 12] >> 4) * 4


def mutate_capture_fields(data: bytes, rng: random.Random) -> bytes:
    """A few mutations of fields that mean something, on a copy of a classic pcap."""
    buf = bytearray(data)
    recs = pcap_records(data)
    for _ in range(rng.randint(1, 4)):
        rec = rng.choice(recs)
        caplen = struct.unpack_from("<I", buf, rec + 8)[0]
        offsets = _tcp_offsets(buf, rec)
        op = rng.randrange(9)
        if op == 0:  # record timestamp: zero, far future, a bit flip, a step back or forward
            sec, frac = struct.unpack_from("<II", buf, rec)
            sec = rng.choice([0, 0xFFFFFFFF, sec ^ (1 << rng.randrange(32)), sec - rng.randint(1, 10**6),
                              sec + rng.randint(1, 10**6)]) & 0xFFFFFFFF
            frac = rng.choice([frac, 0, 999_999_999, 0xFFFFFFFF])
            struct.pack_into("<II", buf, rec, sec, frac)
        elif op == 1:  # original length: larger (snaplen cut) or smaller than captured
            struct.pack_into("<I", buf, rec + 12, rng.choice([0, caplen - 1 if caplen else 0, caplen + rng.randint(1, 1 << 16)]))
        elif offsets is None:
            continue
        elif op == 2:  # IP total length
            struct.pack_into(">H", buf, offsets[0] + 2, rng.choice([0, 20, 40, rng.randrange(1 << 16)]))
        elif op == 3:  # TCP sequence / acknowledgement numbers
            at = offsets[1] + rng.choice((4, 8))
            value = (struct.unpack_from(">I", buf, at)[0] + rng.choice([1, -1, 1 << 31, rng.randrange(1 << 32)])) % (1 << 32)
            struct.pack_into(">I", buf, at, value)
        elif op == 4:  # TCP flags
            buf[offsets[1] + 13] ^= rng.choice((0x01, 0x02, 0x04, 0x10, 0x17))
        elif op == 5 and offsets[2] + 4 <= rec + 16 + caplen:  # MySQL packet length (3 bytes) and sequence id
            at = offsets[2] + rng.randrange(4)
            buf[at] = rng.choice((0, 0xFF, 0xFE, 0xFB, rng.randrange(256)))
        elif op == 6 and offsets[2] + 5 <= rec + 16 + caplen:  # the command byte / first payload byte
            buf[offsets[2] + 4] = rng.choice((0x00, 0x01, 0x03, 0x16, 0x17, 0x19, 0xFE, 0xFF, rng.randrange(256)))
        elif op == 7 and offsets[2] + 9 < rec + 16 + caplen:  # text in the payload (statement, rows, messages)
            end = rec + 16 + caplen
            at = rng.randrange(offsets[2] + 5, end)
            text = rng.choice(HOSTILE_TEXTS) * rng.randint(1, 8)
            buf[at:end] = (text + bytes(buf[at + len(text):end]))[: end - at]
        elif op == 8:  # a record repeated or dropped
            chunk = bytes(buf[rec:rec + 16 + caplen])
            if rng.random() < 0.5:
                buf[rec:rec] = chunk
            else:
                del buf[rec:rec + 16 + caplen]
            recs = pcap_records(bytes(buf))
    return bytes(buf)


def fuzz_analyze(sets: list[dict], rng: random.Random, tmp: Path) -> None:
    from pcapdecomp.analysis import Options, analyze, capture_set

    seed = rng.choice(sets)
    work = tmp / "set"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    sides = rng.choice([("app", "db"), ("db",), ("app",)])
    for side in ("app", "db"):
        data = seed[side]
        if side in sides or rng.random() < 0.5:
            data = mutate_capture_fields(data, rng)
        (work / f"{side}.pcap").write_bytes(data)
    slow = work / "slow.log"
    slow.write_text(mutate_slow_log(seed["slow"], rng) if rng.random() < 0.5 else seed["slow"], encoding="utf-8",
                    errors="surrogateescape")
    out = tmp / "out"
    shutil.rmtree(out, ignore_errors=True)
    try:
        analyze(capture_set(app=[work / "app.pcap"], db=work / "db.pcap", slow_log=slow,
                            long_query_time=seed["long_query_time"], thread_pool_size=seed["thread_pool_size"]),
                Options(quiet=True, jobs=1), out)
    except PcapdecompError:
        return

    def no_constant(name):
        raise ValueError(f"summary.json holds {name}, which is not JSON")

    json.loads((out / "summary.json").read_text(), parse_constant=no_constant)
    assert (out / "report.html").stat().st_size > 0


# --- the slow-log parser ------------------------------------------------------------------------------------------

EXTREME_NUMBERS = ["0", "-0.5", "-1", "1e308", "1e400", "nan", "inf", "-inf", "99999999999999999999999", "0x10",
                   "1.2.3", "", "١٢", "3.815330e9", "18446744073709551616"]


def mutate_slow_log(text: str, rng: random.Random) -> str:
    lines = text.splitlines(keepends=True)
    for _ in range(rng.randint(1, 6)):
        if not lines:
            break
        i = rng.randrange(len(lines))
        op = rng.randrange(6)
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, lines[i])
        elif op == 2 and i + 1 < len(lines):
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
        elif op == 3:  # a number in the line replaced
            numbers = list(re.finditer(r"-?\d+(?:\.\d+)?", lines[i]))
            if numbers:
                m = rng.choice(numbers)
                lines[i] = lines[i][:m.start()] + rng.choice(EXTREME_NUMBERS) + lines[i][m.end():]
        elif op == 4:  # a header line of another shape
            lines.insert(i, rng.choice([
                "# Time: 9999-12-31T23:59:59.999999Z\n", "# Time: 0000-00-00T00:00:00Z\n", "# Time: 991231 25:61:61\n",
                f"SET timestamp={rng.choice(EXTREME_NUMBERS)};\n", f"# Query_time: {rng.choice(EXTREME_NUMBERS)}  "
                f"Lock_time: {rng.choice(EXTREME_NUMBERS)} Rows_sent: {rng.choice(EXTREME_NUMBERS)}  Rows_examined: 0\n",
                f"# User@Host: a[a] @ h []  Id: {rng.choice(EXTREME_NUMBERS)}\n", "# Time: \n", "use `x\n",
            ]))
        else:  # statement text
            lines[i] = lines[i].rstrip("\n") + rng.choice(["<script>", "/*", "'", "\u2028", "\x00", ";"]) * rng.randint(1, 4) + "\n"
    return "".join(lines)


def fuzz_slow_log(texts: list[str], rng: random.Random, tmp: Path) -> None:
    from pcapdecomp.slowlog.reader import read_slow_log

    path = tmp / "slow.log"
    path.write_text(mutate_slow_log(rng.choice(texts), rng), encoding="utf-8", errors="surrogateescape")
    try:
        frame, _stats = read_slow_log(path)
    except PcapdecompError:
        return
    for column in frame.columns:  # whatever was parsed fits its column
        frame[column].to_numpy()


# --- slow logs with header blocks inside statements ---------------------------------------------------------------

def _entry_blocks(text: str) -> list[str]:
    """The entries of a real slow log as text blocks (each from its '# Time:' or '# User@Host:' line)."""
    blocks, current = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith(("# Time: ", "# User@Host: ")) and current and not current[-1].startswith("# Time: "):
            blocks.append("".join(current))
            current = []
        current.append(line)
    if current:
        blocks.append("".join(current))
    return [b for b in blocks if "# Query_time: " in b]


def fuzz_embedded_headers(texts: list[str], rng: random.Random, tmp: Path) -> None:
    """A statement whose text holds copies of other entries' header blocks, as a database user can send it: read
    with the wire's copy of that statement (whole, or cut), the log has exactly its own entries, never more; the
    forged blocks are counted as SQL, or the entry after them as unverified."""
    from pcapdecomp.slowlog.reader import WireStatements, parse_slow_log

    blocks = _entry_blocks(rng.choice(texts))
    if len(blocks) < 2:
        return
    host = rng.randrange(len(blocks))
    head, sep, _ = blocks[host].rpartition("SET timestamp=")
    if not sep:
        return
    prefix = head + blocks[host][len(head):].split("\n", 1)[0] + "\n"
    forged = [rng.choice(blocks).rstrip("\n").removesuffix(";") for _ in range(rng.randint(1, 3))]
    statement = rng.choice(["SELECT 'x;", "SELECT 1 /* ;", "INSERT INTO t VALUES ('a;"]) + "\n" + ";\n".join(forged)
    statement += rng.choice(["", "'", "\n' OR 1", "*/"])
    log = "".join(blocks[:host]) + prefix + statement + ";\n" + "".join(blocks[host + 1:])
    expected, _ = parse_slow_log("".join(blocks))
    if rng.random() < 0.5:
        wire = WireStatements([statement])
        entries, stats = parse_slow_log(log, wire=wire)
        assert len(entries) == len(expected), (len(entries), len(expected))
        assert stats.unverified_entries == 0
        mine = [e for e in entries if e.sql == statement]
        assert mine, "the statement holding the forged blocks lost its text"
    else:
        cut = rng.randrange(1, len(statement))
        wire = WireStatements([], [(statement[:cut], len(statement.encode()))])
        entries, stats = parse_slow_log(log, wire=wire)
        forged_seen = len(entries) - len(expected)
        assert forged_seen >= 0
        assert forged_seen == 0 or stats.unverified_entries >= 1, "an entry inside a cut statement was not flagged"


# --- terminal output ----------------------------------------------------------------------------------------------

_TERMINAL_PIECES = ["\x1b]52;c;aGVsbG8=\x07", "\x1b]0;title\x1b\\", "\x1b]8;;http://x/\x07l\x1b]8;;\x07", "\x9b31m",
                    "\x9d0;t\x07", "\x1b[2J", "\r", "\x08", "\x7f", "\u202e", "\u2066", "\udc9b", "[/quote]",
                    "[link=http://x]y[/link]", "[bold]", "\n", "\t", "é", "漢", "\\x1b", "SELECT 1"]
_ACTS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def fuzz_terminal(rng: random.Random, tmp: Path) -> None:
    """Any text through console.terminal_text holds nothing a terminal acts on; one line stays one line; and
    what is not a control character is kept as it was."""
    import io
    from contextlib import redirect_stdout

    from pcapdecomp.core.console import say, terminal_text

    text = "".join(rng.choice(_TERMINAL_PIECES) if rng.random() < 0.7 else chr(rng.randrange(0, 0x3000))
                   for _ in range(rng.randint(0, 30)))
    for lines in (False, True):
        shown = terminal_text(text, lines)
        assert not _ACTS.search(shown), repr(shown)
        assert lines or "\n" not in shown
        # each character acted on (and a line feed in one line) shown as its escape, as the docstring says, every
        # other one as it was. (Removing the escapes from both sides instead was ambiguous: a literal backslash and
        # `x` in the text, followed by a control character and two hex digits, reads as an escape once the control
        # character is gone.)
        expected = "".join((f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                           if _ACTS.match(c) or (c == "\n" and not lines) else c for c in text)
        assert shown == expected, f"plain text was changed: {shown!r} against {expected!r}"
    printed = io.StringIO()
    with redirect_stdout(printed):
        say(text)
    assert not _ACTS.search(printed.getvalue()) and printed.getvalue().count("\n") == 1


# --- output folders -----------------------------------------------------------------------------------------------

_FOLDER_NAMES = ["exchanges.parquet", "summary.json", "report.html", "exchanges.csv", "db.pcapng", "app.pcapng",
                 "evidence", "exchanges", "analyses", "notes.txt", "db.pcap", "slow.log", "internal-error.txt",
                 "INCOMPLETE.txt", "comparison.html"]


def fuzz_output_folder(rng: random.Random, tmp: Path) -> None:
    """A folder holding a user's files (some by our names), maybe a manifest of ours listing some of them: a run
    either writes its set and leaves every unlisted file as it was, or refuses (UsageError) and changes nothing."""
    from pcapdecomp.core.errors import UsageError
    from pcapdecomp.core.outputs import MANIFEST_NAME, OutputFolder, listed_outputs

    out = tmp / "folder"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    for name in rng.sample(_FOLDER_NAMES, rng.randint(0, 6)):
        if rng.random() < 0.3:
            (out / name).mkdir()
            (out / name / "inside").write_bytes(b"user " + name.encode())
        else:
            (out / name).write_bytes(b"user " + name.encode())
    if rng.random() < 0.5:
        listed = rng.sample(_FOLDER_NAMES + ["../escape", ".hidden", "/abs"], rng.randint(0, 5))
        (out / MANIFEST_NAME).write_text(json.dumps({"files": listed}))
    ours = listed_outputs(out)

    def snapshot() -> dict[str, bytes]:
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    before = snapshot()
    writes = rng.sample(_FOLDER_NAMES[:9], rng.randint(1, 4))
    try:
        with OutputFolder(out, writes[:rng.randint(0, len(writes))]) as folder:
            for name in writes:
                (folder.staging / name).write_bytes(b"ours")
            folder.commit()
    except UsageError:
        assert snapshot() == before, "a refused run changed the folder"
        return
    after = snapshot()
    for path, data in before.items():
        top = path.split("/", 1)[0]
        if top in ours or top == MANIFEST_NAME or top in writes:
            continue
        assert after.get(path) == data, f"{path} was not ours and changed"
    for name in writes:
        assert (out / name).read_bytes() == b"ours"


# --- driver -------------------------------------------------------------------------------------------------------

WEIGHTS = {"capture reader": 0.5, "tcp+mysql": 1.0, "fast lane": 1.5, "analyze": 1.5, "slow log": 0.5,
           "embedded headers": 0.3, "terminal": 0.1, "output folders": 0.2}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--only", choices=sorted(WEIGHTS), help="fuzz this target alone")
    parser.add_argument("--skip", choices=sorted(WEIGHTS), action="append", default=[], help="leave a target out")
    parser.add_argument("--round-seed", type=int, help="with --only: replay the one round a failure named")
    args = parser.parse_args()
    seeds = [p for p in SEEDS if p.exists()]
    if not seeds:
        print("fuzz: no seed recordings found under captures/", file=sys.stderr)
        return 2
    files = [p.read_bytes() for p in seeds]
    with tempfile.TemporaryDirectory() as tmp:
        files += pcapng_seeds(seeds, Path(tmp))
    segment_lists = []
    for p in seeds:
        with open_capture(p) as reader:
            segment_lists.append(list(reader))
    from pcapdecomp.read import fastlane
    from pcapdecomp.read.captureset import tomllib

    sets = []
    for folder in SETS:
        server = tomllib.loads((folder / "capture.toml").read_text())["server"]
        sets.append({"app": (folder / "app.pcap").read_bytes(), "db": (folder / "db.pcap").read_bytes(),
                     "slow": (folder / "slow.log").read_text(encoding="utf-8", errors="surrogateescape"),
                     "long_query_time": server.get("long_query_time"), "thread_pool_size": server.get("thread_pool_size")})
    slow_texts = [p.read_text(encoding="utf-8", errors="surrogateescape") for p in SLOW_LOGS if p.exists()]

    targets = {
        "capture reader": lambda rng, tmp: fuzz_reader(rng.choice(files), rng, tmp),
        "tcp+mysql": lambda rng, tmp: fuzz_flows(rng.choice(segment_lists), rng),
        "fast lane": lambda rng, tmp: fuzz_lane(rng.choice(files), rng, tmp),
        "analyze": lambda rng, tmp: fuzz_analyze(sets, rng, tmp),
        "slow log": lambda rng, tmp: fuzz_slow_log(slow_texts, rng, tmp),
        "embedded headers": lambda rng, tmp: fuzz_embedded_headers(slow_texts, rng, tmp),
        "terminal": fuzz_terminal,
        "output folders": fuzz_output_folder,
    }
    if not fastlane.NATIVE:
        del targets["fast lane"]
    if args.only:
        targets = {args.only: targets[args.only]}
    for name in args.skip:
        targets.pop(name, None)
    if args.round_seed is not None:
        if not args.only:
            parser.error("--round-seed needs --only TARGET")
        with tempfile.TemporaryDirectory() as tmp:
            targets[args.only](random.Random(args.round_seed), Path(tmp))
        print(f"fuzz: round seed {args.round_seed} of {args.only!r} passed")
        return 0
    tried = dict.fromkeys(targets, 0)
    spent = dict.fromkeys(targets, 0.0)
    deadline = time.monotonic() + args.seconds
    round_no = 0
    with tempfile.TemporaryDirectory() as tmp:
        while time.monotonic() < deadline:
            round_seed = args.seed * 1_000_003 + round_no
            rng = random.Random(round_seed)
            round_no += 1
            name = min(targets, key=lambda t: spent[t] / WEIGHTS[t])  # the target furthest behind its share
            start = time.monotonic()
            try:
                targets[name](rng, Path(tmp))
            except Exception:
                traceback.print_exc()
                print(f"fuzz: FAILED in target {name!r} at round {round_no} (reproduce with --only {name!r} "
                      f"--round-seed {round_seed})", file=sys.stderr)
                return 1
            spent[name] += time.monotonic() - start
            tried[name] += 1
    total = sum(tried.values())
    print(f"fuzz: {total} inputs tried in {args.seconds:.0f} s (seed {args.seed}): "
          + ", ".join(f"{k} {v}" for k, v in tried.items()) + "; 0 failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
