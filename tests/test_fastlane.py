"""The native fast lane (pcapdecomp/_lane.c) against its Python twin. A whole extraction must come out
identical with and without the lane: on every real capture, and on real captures bent into the shapes that make
the lane give a connection back to Python (lost, repeated, reordered and re-segmented packets, a cut start or end,
`--jobs` parts)."""

from __future__ import annotations

import gzip
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from corpus import CORPUS
from corpus import captures as corpus_captures
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes import assert_same, extract_with
from pcaptools import records, to_pcapng

from pcapdecomp.core.errors import PcapdecompError
from pcapdecomp.read import fastlane

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
REAL = sorted(CAPTURES.glob("*/*.pcap"))
# recordings whose every connection is TLS: the lane hands them all to the Python path (it reads no TLS)
ALL_TLS = {"group-stall-tls13", "group-stall-tls12", "oltp-prepared-tls13", "oltp-prepared-tls12"}


needs_lane = pytest.mark.skipif(not fastlane.NATIVE, reason="the native lane is not built (no C compiler)")


def test_the_lane_is_built_where_a_compiler_is():
    """The install builds the extension when cc exists; a silent build failure would cost the speed unnoticed."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    assert fastlane.NATIVE


@needs_lane
def test_the_lane_writes_the_row_layout_of_the_schema():
    """The lane is compiled with the column positions of schema.EXCHANGE_COLUMNS (setup.py writes them as a header
    at every build): a lane built before the schema changed would write its values into the wrong columns."""
    from pcapdecomp import _lane
    from pcapdecomp.core.schema import EXCHANGE_COLUMNS, c_header

    assert _lane.COLUMNS == tuple(c.name for c in EXCHANGE_COLUMNS)
    assert len(_lane.ROW_KINDS) == len(EXCHANGE_COLUMNS) and set(_lane.ROW_KINDS) <= set("oqdnbs")
    header = Path(fastlane.__file__).with_name("_lane_columns.h")  # in a source tree (an installed wheel has none)
    if header.exists():
        assert header.read_text() == c_header()
    assert f"#define COL_RESP_TCP_END {[c.name for c in EXCHANGE_COLUMNS].index('resp_tcp_end')}\n" in c_header()


def test_only_fastlane_knows_the_lane_and_it_uses_public_names_only():
    """The lane's contract with the core is public (CaptureReader.hand_over, MySQLConnection.handover,
    FlowTracker.take_back, ...): read/fastlane.py reads no private attribute of another object, no other module imports
    the extension, and fastlane imports no stage that calls it (no import cycle)."""
    import ast
    import subprocess
    import sys

    package = Path(fastlane.__file__).parent.parent
    for source in sorted(package.rglob("*.py")):
        tree = ast.parse(source.read_text())
        imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
        names = {alias.name for node in imports for alias in node.names} | {
            node.module or "" for node in imports if isinstance(node, ast.ImportFrom)}
        if source.relative_to(package).as_posix() != "read/fastlane.py":
            assert not any(name.split(".")[-1] == "_lane" for name in names), source
            continue
        private = sorted({node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                          and node.attr.startswith("_") and not node.attr.startswith("__")})
        assert private == [], private
        assert not names & {"exchanges", "match", "parallel", "analysis", "pipeline"}, names
    loaded = subprocess.run([sys.executable, "-c", "import sys, pcapdecomp.read.fastlane; "
                             "print(sorted(m for m in sys.modules if m.startswith('pcapdecomp.')))"],
                            capture_output=True, text=True, check=True, cwd=package.parent).stdout
    assert "pcapdecomp.read.exchanges" not in loaded and "pcapdecomp.read.fastlane" in loaded


@needs_lane
def test_the_lane_answers_with_typed_records():
    from pcapdecomp import _lane
    from pcapdecomp.read.flows import HandBack

    for kind in (_lane.Record, _lane.GivenBack, _lane.Damage, _lane.RowsReady, _lane.Counts):
        assert kind.__match_args__ and kind.__doc__, kind  # named fields, said what it is
    # FlowTracker.take_back takes the lane's GivenBack as the HandBack it declares: every field is there
    assert set(HandBack._fields) <= set(_lane.GivenBack.__match_args__)
    assert {"flow", "replays"} <= set(_lane.GivenBack.__match_args__)


@needs_lane
@pytest.mark.parametrize("path", REAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_captures_come_out_identical(path, read_capture):
    native = assert_same(path, native=read_capture(path))
    assert len(native.exchanges) > 0


@needs_lane
@pytest.mark.parametrize("capture", ["oltp-hogs/db.pcap", "oltp-prepared/db.pcap"])
def test_the_lane_reading_the_file_into_its_buffer_is_the_lane_fed_chunks(capture, monkeypatch):
    """The lane reads a file straight into its own buffer (fastlane._filler: Lane.fill with the file's readinto),
    or is fed chunks read elsewhere where the source cannot read into a buffer: the same extraction, also with
    chunks of an odd size that cut records, headers and packets anywhere (and the same as Python's)."""
    from dataclasses import replace

    from pcapdecomp.read.capture import CaptureReader

    path = CAPTURES / capture
    whole = extract_with(path, True)
    monkeypatch.setattr(fastlane, "CHUNK", 4099)
    filled = assert_same(path)
    hand_over = CaptureReader.hand_over
    monkeypatch.setattr(CaptureReader, "hand_over", lambda reader: replace(hand_over(reader), readinto=None))
    fed = assert_same(path)
    assert filled.native_frames == fed.native_frames == whole.native_frames > 0.6 * whole.stats.frames
    pd.testing.assert_frame_equal(whole.exchanges, fed.exchanges, check_exact=True)


@needs_lane
def test_the_lanes_fill_takes_only_what_its_reader_says_it_wrote():
    """Lane.fill(readinto, n) lends readinto room in the lane's buffer for the call: a count beyond the room, or a
    readinto that keeps a view of it (which the buffer could move or be freed under) is an error, not bytes taken
    from nowhere, and the room lends nothing once the call is over; readinto's own OSError is passed on
    (extraction words it)."""
    import numpy as np

    from pcapdecomp import _lane
    from pcapdecomp.read.capture import CaptureReader

    source = CaptureReader(CAPTURES / "oltp-hogs" / "db.pcap").hand_over()
    scan = _lane.Segments(**fastlane._layout(source), flows=[])
    with pytest.raises(ValueError, match="readinto returned 17"):
        scan.fill(lambda room: memoryview(room).nbytes + 1, 16)
    kept = []
    with pytest.raises(BufferError, match="kept a view"):
        scan.fill(lambda room: kept.append(np.frombuffer(room, dtype=np.uint8)) or 0, 16)
    with pytest.raises(BufferError, match="kept a view"):
        scan.fill(lambda room: kept.append(memoryview(room)[4:]) or 0, 16)
    with pytest.raises(BufferError, match="only during the read"):
        scan.fill(lambda room: kept.append(room) or 0, 16)
        memoryview(kept[-1])
    kept.clear()

    def broken(view):
        raise OSError("the disk went away")

    with pytest.raises(OSError, match="went away"):
        scan.fill(broken, 16)
    assert scan.fill(source.readinto, 1 << 20) > 0  # still reads


@needs_lane
@pytest.mark.parametrize("part", [(0, 2), (1, 2), (2, 3)])
def test_parts_of_a_capture_come_out_identical(part):
    """With --jobs, each worker's lane also holds the other workers' connections (consumed, not parsed)."""
    native = assert_same(CAPTURES / "oltp-hogs" / "db.pcap", part=part)
    assert native.native_frames > 0


@needs_lane
def test_the_lane_reads_the_common_path_itself():
    """Not a lane that hands everything back: on a real OLTP capture it consumes most frames itself."""
    native = assert_same(CAPTURES / "oltp-hogs" / "db.pcap")
    frames = native.stats.frames
    assert native.native_frames > 0.6 * frames, (native.native_frames, frames)


@needs_lane
@pytest.mark.parametrize("row", [r for r in corpus_captures() if (CORPUS / r["path"]).exists()],
                         ids=lambda r: r["path"])
def test_public_corpus_captures_come_out_identical(row, read_capture):
    assert_same(CORPUS / row["path"], native=read_capture(CORPUS / row["path"]))


# --- real captures, bent ---------------------------------------------------------------------------------

def split_frame(frame: bytes, at: float) -> list[bytes]:
    """An Ethernet TCP frame as two frames whose payloads are the original's cut at fraction `at` (IP length and
    TCP sequence number adjusted; FIN only on the second). Frames without payload are returned as they are."""
    if frame[12:14] == b"\x08\x00":
        ip, v4 = 14, True
        tcp = ip + (frame[ip] & 0x0F) * 4
        end = ip + struct.unpack_from(">H", frame, ip + 2)[0]
    elif frame[12:14] == b"\x86\xdd" and frame[20] == 6:
        ip, v4 = 14, False
        tcp = ip + 40
        end = tcp + struct.unpack_from(">H", frame, ip + 4)[0]
    else:
        return [frame]
    start = tcp + (frame[tcp + 12] >> 4) * 4
    payload = frame[start:end]
    cut = int(len(payload) * at)
    if not 0 < cut < len(payload):
        return [frame]
    out = []
    for part, shift, last in ((payload[:cut], 0, False), (payload[cut:], cut, True)):
        f = bytearray(frame[:start] + part)
        struct.pack_into(">H", f, ip + 2 if v4 else ip + 4, len(f) - ip if v4 else len(f) - tcp)
        seq = struct.unpack_from(">I", f, tcp + 4)[0]
        struct.pack_into(">I", f, tcp + 4, (seq + shift) & 0xFFFFFFFF)
        if not last:
            f[tcp + 13] &= ~0x01
        out.append(bytes(f))
    return out


def to_ipv6(frame: bytes, options: bool) -> bytes:
    """An Ethernet/IPv4 frame as Ethernet/IPv6 (addresses fd00::a.b.c.d), with a destination-options extension
    header before TCP when `options`. Other frames are returned as they are."""
    if frame[12:14] != b"\x08\x00":
        return frame
    ip = 14
    ihl = (frame[ip] & 0x0F) * 4
    end = ip + struct.unpack_from(">H", frame, ip + 2)[0]
    segment = frame[ip + ihl:end]
    ext = bytes([6, 0, 1, 4, 0, 0, 0, 0]) if options else b""  # next header TCP, 8 bytes, PadN
    prefix = b"\xfd" + b"\x00" * 11
    header = struct.pack(">IHBB", 6 << 28, len(ext) + len(segment), 60 if options else 6, 64)
    return frame[:12] + b"\x86\xdd" + header + prefix + frame[ip + 12:ip + 16] + prefix + frame[ip + 16:ip + 20] + ext + segment


def bend(src: Path, dst: Path, *, start: int, drops: set[int], repeats: set[int], swaps: set[int],
         splits: dict[int, float], cut: float | None, snaps: dict[int, float] | None = None) -> None:
    header, order, unit, recs = records(src)
    frames = [(ts, pkt) for ts, pkt, _orig in recs][start:]
    for i in sorted(swaps):
        if i + 1 < len(frames):
            frames[i], frames[i + 1] = frames[i + 1], frames[i]
    out = [header]
    for i, (ts, pkt) in enumerate(frames):
        if i in drops:
            continue
        pieces = split_frame(pkt, splits[i]) if i in splits else [pkt]
        for copy in range(2 if i in repeats else 1):
            for piece in pieces:
                t = ts + copy * 1000
                kept = len(piece)
                if snaps and i in snaps:  # cut by a snaplen: the record keeps the original length
                    kept = max(14, int(kept * snaps[i]))
                out.append(struct.pack(order + "IIII", t // 1_000_000_000, (t % 1_000_000_000) // unit,
                                       kept, len(piece)))
                out.append(piece[:kept])
    data = b"".join(out)
    if cut is not None:
        data = data[: 24 + int((len(data) - 24) * cut)]
    dst.write_bytes(data)


SMALL = [CAPTURES / name / f"{side}.pcap" for name in ("group-stall", "features", "maxthreads")
         for side in ("db", "app")] + [CAPTURES / "oltp-prepared" / "db.pcap"]  # prepared statements (a cut start)


@needs_lane
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_bent_real_captures_come_out_identical(data):
    src = data.draw(st.sampled_from(SMALL), label="capture")
    n = sum(1 for _ in records(src)[3])
    index = st.integers(0, n - 1)
    start = data.draw(st.one_of(st.just(0), st.integers(0, n // 2)), label="start")
    drops = data.draw(st.sets(index, max_size=4), label="drops")
    repeats = data.draw(st.sets(index, max_size=4), label="repeats")
    swaps = data.draw(st.sets(index, max_size=4), label="swaps")
    splits = data.draw(st.one_of(
        st.dictionaries(index, st.floats(0.01, 0.99), max_size=40),
        st.builds(lambda at: {i: at for i in range(n)}, st.floats(0.01, 0.99)),  # every segment split
    ), label="splits")
    cut = data.draw(st.one_of(st.none(), st.floats(0.0, 1.0)), label="cut")
    snaps = data.draw(st.dictionaries(index, st.floats(0.0, 0.99), max_size=4), label="snaplen cuts")
    part = data.draw(st.sampled_from([None, (0, 2), (1, 2)]), label="part")
    with tempfile.TemporaryDirectory() as tmp:
        bent = Path(tmp) / "bent.pcap"
        bend(src, bent, start=start, drops=drops, repeats=repeats, swaps=swaps, splits=splits, cut=cut, snaps=snaps)
        assert_same(bent, part=part)


@needs_lane
def test_every_segment_split_in_two_is_still_read_natively(tmp_path):
    """Responses whose packet headers straddle segments are reassembled in C, not handed back."""
    src = CAPTURES / "oltp-hogs" / "db.pcap"
    bent = tmp_path / "split.pcap"
    bend(src, bent, start=0, drops=set(), repeats=set(), swaps=set(),
         splits={i: 0.5 for i in range(sum(1 for _ in records(src)[3]))}, cut=None)
    native = assert_same(bent)
    assert native.native_frames > 0.6 * native.stats.frames


@needs_lane
def test_executes_of_statements_prepared_before_the_capture_are_read_natively(tmp_path):
    """A pool's connections prepared their statements before tcpdump started: their EXECUTEs name statement ids
    the capture never saw. The lane reads them as Python does (no text, no parameters, the id, the problem
    unknown-statement) instead of handing each one to Python and taking the connection back (a round trip per
    exchange: ~30x slower per byte on such a capture)."""
    src = CAPTURES / "oltp-prepared" / "db.pcap"
    n = sum(1 for _ in records(src)[3])
    cut = tmp_path / "after-the-prepares.pcap"
    bend(src, cut, start=n // 2, drops=set(), repeats=set(), swaps=set(), splits={}, cut=None)
    native = assert_same(cut)
    x = native.exchanges
    unknown = (x["problems"] == "unknown-statement") & (x["command"] == "COM_STMT_EXECUTE")
    assert unknown.sum() > 100, unknown.sum()
    assert x.loc[unknown, "sql"].isna().all() and x.loc[unknown, "params"].isna().all()
    assert x.loc[unknown, "stmt_id"].notna().all()
    # the lane reads the connections on: most frames are its own (Python read only their starts)
    assert native.native_frames > 0.6 * native.stats.frames, (native.native_frames, native.stats.frames)


@needs_lane
def test_segments_cut_by_the_snaplen_give_the_connection_back(tmp_path):
    """A segment the lane cannot take (its payload cut by the snaplen) of a connection the lane holds: the lane
    gives the connection back first, so Python never sees it with stale state."""
    src = CAPTURES / "oltp-hogs" / "db.pcap"
    n = sum(1 for _ in records(src)[3])
    bent = tmp_path / "snap.pcap"
    bend(src, bent, start=0, drops=set(), repeats=set(), swaps=set(), splits={}, cut=None,
         snaps={i: 0.5 for i in range(100, n, 97)})
    native = assert_same(bent)
    assert native.stats.frames_truncated > 0 and native.native_frames > 0.5 * native.stats.frames


@needs_lane
def test_ipv6_with_extension_headers_is_read_natively(tmp_path):
    """A real capture moved to IPv6, every third frame with a destination-options header."""
    header, order, unit, recs = records(CAPTURES / "oltp-hogs" / "db.pcap")
    out = [header]
    for i, (ts, pkt, _orig) in enumerate(recs):
        frame = to_ipv6(pkt, options=i % 3 == 0)
        out.append(struct.pack(order + "IIII", ts // 1_000_000_000, (ts % 1_000_000_000) // unit, len(frame),
                               len(frame)))
        out.append(frame)
    bent = tmp_path / "v6.pcap"
    bent.write_bytes(b"".join(out))
    native = assert_same(bent)
    assert len(native.exchanges) > 1000 and native.exchanges["server"].str.startswith("[fd00:").all()
    assert native.native_frames > 0.6 * native.stats.frames


def test_ipv6_addresses_that_differ_in_their_last_byte_are_two_connections(tmp_path):
    """A real capture moved to IPv6, where one answer of the server goes to a client address that differs from its
    connection's only in the last byte, the same ports (a flipped bit, as the fuzz target made it): Python takes it
    for a connection of its own, and so must the lane (its connection key once lost that byte to the ports)."""
    header, order, unit, recs = records(CAPTURES / "oltp-hogs" / "db.pcap")
    recs = list(recs)
    frames = [to_ipv6(pkt, options=False) for _ts, pkt, _orig in recs]
    answers = [i for i, f in enumerate(frames) if f[12:14] == b"\x86\xdd" and f[54:56] == b"\x0c\xea"
               and len(f) > 54 + 20 + 8]  # from port 3306, with a payload
    bent_at = answers[len(answers) // 2]
    f = bytearray(frames[bent_at])
    f[14 + 8 + 16 + 15] ^= 0x10  # the destination (client) address's last byte
    frames[bent_at] = bytes(f)
    out = [header]
    for (ts, _pkt, _orig), frame in zip(recs, frames):
        out.append(struct.pack(order + "IIII", ts // 1_000_000_000, (ts % 1_000_000_000) // unit, len(frame),
                               len(frame)))
        out.append(frame)
    bent = tmp_path / "v6-flipped.pcap"
    bent.write_bytes(b"".join(out))
    frames[bent_at] = to_ipv6(recs[bent_at][1], options=False)
    whole = tmp_path / "v6.pcap"
    whole.write_bytes(b"".join([header, *(struct.pack(order + "IIII", ts // 1_000_000_000,
                                                      (ts % 1_000_000_000) // unit, len(fr), len(fr)) + fr
                                          for (ts, _pkt, _orig), fr in zip(recs, frames))]))
    native = assert_same(bent)
    assert len(native.connections) == len(extract_with(whole, True).connections) + 1
    assert (native.connections["gap_bytes"] > 0).any()  # the connection the answer left has a hole where it was


# --- pcapng: the lane reads it too (blocks, interfaces with their own clocks, sections, simple packet blocks) ---

def as_pcapng(src: Path, dst: Path, **shape) -> Path:
    to_pcapng(src, dst, **shape)
    return dst


@needs_lane
@pytest.mark.parametrize("path", REAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_captures_as_pcapng_come_out_identical(path, tmp_path):
    """Every bundled recording as pcapng (two interfaces, nanosecond and 2^-30 s clocks, a name resolution block,
    interface statistics) and gzip-compressed: the lane reads it, and reads it as Python does."""
    ng = as_pcapng(path, tmp_path / "x.pcapng", interfaces=2, resolutions=(9, 0x80 | 30))
    native = assert_same(ng)
    assert (native.native_frames > 0) == (path.parent.name not in ALL_TLS)
    assert native.stats.format == "pcapng" and native.stats.if_drops == {0: 3}
    gz = tmp_path / "x.pcapng.gz"
    gz.write_bytes(gzip.compress(ng.read_bytes(), compresslevel=1))
    assert_same(gz)


@needs_lane
def test_pcapng_gives_the_exchanges_of_the_same_pcap(tmp_path):
    """The same records as pcap and as pcapng (nanosecond clock): the same exchanges, mostly read by the lane."""
    src = CAPTURES / "oltp-hogs" / "db.pcap"
    pcap = extract_with(src, True)
    ng = extract_with(as_pcapng(src, tmp_path / "db.pcapng"), True)
    assert ng.native_frames > 0.6 * ng.stats.frames
    pd.testing.assert_frame_equal(pcap.exchanges.drop(columns="capture"), ng.exchanges.drop(columns="capture"))
    pd.testing.assert_frame_equal(pcap.connections.drop(columns="capture"), ng.connections.drop(columns="capture"))


@needs_lane
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_bent_pcapng_comes_out_identical(data):
    """Real captures bent as above, then written as pcapng of every shape the reader knows: big-endian sections,
    several sections and interfaces with their own resolutions and offsets, simple packet blocks, broken times
    (zero, far future, beyond int64 nanoseconds), and cut or flipped bytes anywhere in the file."""
    src = data.draw(st.sampled_from(SMALL), label="capture")
    n = sum(1 for _ in records(src)[3])
    index = st.integers(0, n - 1)
    shape = {
        "interfaces": data.draw(st.integers(1, 3), label="interfaces"),
        "resolutions": tuple(data.draw(st.lists(st.sampled_from([9, 6, 3, 0x80 | 30, 10]), min_size=1, max_size=3),
                                       label="resolutions")),
        "big_endian": data.draw(st.booleans(), label="big endian"),
        "sections": data.draw(st.integers(1, 3), label="sections"),
        "simple_every": data.draw(st.sampled_from([0, 0, 2, 7]), label="simple every"),
        "offset_s": data.draw(st.sampled_from([0, 0, 3600, -7200]), label="offset"),
        "wild": data.draw(st.dictionaries(index, st.sampled_from([0, 1, 2**63, 2**64 - 1, 2**40]), max_size=4),
                          label="wild ticks"),
    }
    drops = data.draw(st.sets(index, max_size=4), label="drops")
    swaps = data.draw(st.sets(index, max_size=4), label="swaps")
    splits = data.draw(st.dictionaries(index, st.floats(0.01, 0.99), max_size=20), label="splits")
    cut = data.draw(st.one_of(st.none(), st.floats(0.0, 1.0)), label="cut")
    flips = data.draw(st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 7)), max_size=3), label="flips")
    with tempfile.TemporaryDirectory() as tmp:
        bent = Path(tmp) / "bent.pcap"
        bend(src, bent, start=0, drops=drops, repeats=set(), swaps=swaps, splits=splits, cut=None)
        ng = as_pcapng(bent, Path(tmp) / "bent.pcapng", **shape)
        raw = bytearray(ng.read_bytes())
        for at, bit in flips:
            raw[int(at * (len(raw) - 1))] ^= 1 << bit
        if cut is not None:
            raw = raw[: max(4, int(len(raw) * cut))]
        ng.write_bytes(bytes(raw))
        try:
            assert_same(ng)
        except PcapdecompError as err:  # a file no longer a capture: both refuse it alike
            assert "capture" in str(err)
        assert_same_segments(ng)


@needs_lane
def test_pcapng_times_beyond_int64_are_repaired_alike(tmp_path):
    """Broken pcapng times (before 1970 with an offset, beyond int64 nanoseconds, one and a run of them) are
    repaired by the lane exactly as by Python, and counted."""
    src = CAPTURES / "group-stall" / "db.pcap"
    ng = as_pcapng(src, tmp_path / "wild.pcapng", interfaces=2, offset_s=-10**10,
                   wild={0: 0, 5: 2**64 - 1, 40: 2**63, 41: 2**63, 42: 2**63})
    native = assert_same(ng)
    assert native.stats.frames_bad_ts >= 4  # frame 5 stays: the next frame is of the other interface


# --- the clock's segments: clocks.read_segments_of through the lane (fastlane.segment_keys) ---------------------

def assert_same_segments(path: Path) -> None:
    """read_segments_of with and without the lane: the same keys and times, for half of the connections."""
    import numpy as np

    from pcapdecomp.core.errors import PcapdecompError
    from pcapdecomp.pair.clocks import read_segments_of
    from pcapdecomp.read.capture import open_capture

    try:
        with open_capture(path) as reader:
            flows = sorted({(s.src_ip, s.src_port, s.dst_ip, s.dst_port) for s in reader})
    except PcapdecompError:
        return
    chosen = set(flows[::2])
    os.environ["PCAPDECOMP_NO_LANE"] = "1"
    try:
        python = read_segments_of(path, chosen)
    finally:
        os.environ.pop("PCAPDECOMP_NO_LANE", None)
    native = read_segments_of(path, chosen)
    for name in ("k1", "k2", "ts"):
        assert np.array_equal(getattr(python, name), getattr(native, name)), name
    assert (python.read, python.repeated) == (native.read, native.repeated)


@needs_lane
@pytest.mark.parametrize("path", REAL + [CORPUS / r["path"] for r in corpus_captures() if (CORPUS / r["path"]).exists()],
                         ids=lambda p: p.name if p.parent.parent == CORPUS else f"{p.parent.name}/{p.name}")
def test_clock_segments_are_read_alike(path):
    assert_same_segments(path)
