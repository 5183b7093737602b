"""Capture points: where a capture was taken (an app host, a DB server, …) and the files it was written to.

In the field a capture point is rarely one file: tcpdump rotates with `-C`/`-G`/`-W` (db.pcap, db.pcap1, …;
db.pcap00, db.pcap01, …; strftime names), dumpcap writes ring buffers (db_00001_20260102150405.pcapng), and both
may be mixed with pcapng and gzip. A point's files are one stream: they are read one after the other in the time
order of their first frames (never interleaved: rotation never interleaves, and interleaving by timestamp would
scramble frames around a clock step), into one connection tracker, so a TCP connection, its exchange in progress
and its prepared statements continue from one file into the next. Frames are numbered through the point, as
mergecap numbers the merged file; `summary.json → points` maps them back to files (`first_frame`).

A point's kind is a name (app, db, proxy, …): the stages pair points by kind, not by position.

Between two consecutive files of a point:
- a gap (time with no frame) longer than GAP_WARN_S and GAP_FACTOR times the point's usual frame interval is
  warned about: something may be missing (a file deleted, a ring buffer that wrapped, a pause);
- an overlap (the next file begins before the previous one ends) of at most MIXED_OVERLAP_S or MIXED_OVERLAP_SHARE of
  the shorter file is warned about (a clock step, two tcpdumps running for a moment); more is two points' files
  mixed into one (two hosts' captures under one glob): a user mistake (exit 2), found when the earlier file has
  been read;
- a file number missing from a numbered sequence (db.pcap3 between db.pcap2 and db.pcap4) is warned about.
"""

from __future__ import annotations

import glob as globbing
import ipaddress
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import InputError, PcapdecompError, UsageError
from . import capture
from .capture import CaptureReader, CaptureStats

GAP_WARN_S = 0.5
GAP_FACTOR = 100
MIXED_OVERLAP_S = 1.0
MIXED_OVERLAP_SHARE = 0.05
_GLOB_CHARS = re.compile(r"[*?\[]")
# capture files in a point's folder: db.pcap, db.pcap1 / db.pcap00 (tcpdump -C/-W), x.pcapng, x_00001_2026….pcapng
# (dumpcap), any of them .gz (tcpdump -z gzip); hidden files and other files are not captures
_CAPTURE_NAME = re.compile(r"^[^.].*\.(pcap|pcapng|cap)\d*(\.gz)?$", re.IGNORECASE)
# the rotation index of a name: digits after the extension (tcpdump -C/-W), or dumpcap's _NNNNN_YYYYmmddHHMMSS
_TCPDUMP_INDEX = re.compile(r"^(?P<stem>.*\.(?:pcap|pcapng|cap))(?P<n>\d+)(?P<gz>\.gz)?$", re.IGNORECASE)
_DUMPCAP_INDEX = re.compile(r"^(?P<stem>.*)_(?P<n>\d{5})_\d{14}(?P<ext>\.(?:pcap|pcapng)(?:\.gz)?)$", re.IGNORECASE)


@dataclass(frozen=True)
class CapturePoint:
    """One capture point: its kind (app, db, …), its name in the tables (`exchanges.capture`) and its files in
    reading order. Used where a capture path was: os.fspath() gives the name, and `open_capture(point)` reads the
    files as one stream (every pass that reads a point again is given the point, not its name)."""

    kind: str
    name: str
    files: tuple[str, ...]
    given: str = ""  # as the user gave it (a file, a quoted glob, a folder)
    skipped: tuple[str, ...] = ()  # empty files of the rotation (created, never written): not read

    def __fspath__(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name

    @property
    def multi(self) -> bool:
        return len(self.files) > 1

    @property
    def bytes(self) -> int:
        return sum(os.stat(f).st_size for f in self.files)

    def open_reader(self, stats: CaptureStats | None = None) -> CaptureReader | PointReader:
        """A reader of the point's files as one capture (what `capture.open_capture(point)` returns)."""
        return PointReader(self, stats) if len(self.files) != 1 else CaptureReader(self.files[0], stats)


# --- naming and resolving ---------------------------------------------------------------------------------------


def parse_server(text: str) -> tuple[str, int]:
    """'10.0.0.5:3306' or '[fd00::5]:3306' -> (ip, port)."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--server must be HOST:PORT with a numeric port, got {text!r}")
    try:
        ip = str(ipaddress.ip_address(host))
    except ValueError:
        raise UsageError(f"--server host must be an IP address, got {host!r}") from None
    return ip, int(port)


def check_input(path: Path) -> None:
    """A capture file the user named: there, a regular file, not empty."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a capture file")
    if not path.is_file():  # a FIFO would block the run, a device never end; every capture is read twice
        raise InputError(f"{path}: not a regular file (a pipe, device or socket cannot be read)")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: empty file")


def rotation_index(name: str) -> tuple[str, int | None]:
    """(family stem, index) of a rotated file name: db.pcap → (db.pcap, None) (the first file of `tcpdump -C` has no
    number), db.pcap7 → (db.pcap, 7), db.pcap07.gz → (db.pcap.gz, 7), x_00012_20260102150405.pcapng → (x.pcapng, 12)."""
    m = _DUMPCAP_INDEX.match(name)
    if m:
        return m["stem"] + m["ext"], int(m["n"])
    m = _TCPDUMP_INDEX.match(name)
    if m:
        return m["stem"] + (m["gz"] or ""), int(m["n"])
    return name, None


def is_capture_name(name: str) -> bool:
    return bool(_CAPTURE_NAME.match(name))


def _files_of(spec: str, what: str) -> tuple[list[Path], str]:
    """The files a user's point specification names: a file, a quoted glob (expanded here), or a folder of
    capture files. Returns (files, name of the point)."""
    path = Path(spec)
    if _GLOB_CHARS.search(spec) and not path.exists():
        found = sorted(Path(p) for p in globbing.glob(os.path.expanduser(spec)))
        found = [p for p in found if not p.is_dir()]
        if not found:
            raise UsageError(f"{what} {spec!r}: the pattern matches no file")
        return found, spec
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if is_capture_name(p.name) and not p.is_dir())
        if not found:
            raise InputError(f"{what} {spec}: the folder holds no capture file (*.pcap, *.pcapng, rotated "
                             "*.pcap1 …, optionally .gz)")
        return found, os.fspath(path)
    return [path], os.fspath(path)


def first_frame_time(path: Path) -> int | None:
    """Timestamp (ns) of a file's first frame; None when it holds none (a header written just before rotation)."""
    try:
        records = capture.iter_records(path)
        first = next(records, None)
        records.close()
    except PcapdecompError:
        raise
    except OSError as err:
        raise InputError(f"{path}: cannot be read: {err.strerror or err}") from None
    return None if first is None else first[1]


def point(kind: str, spec: str | os.PathLike, what: str | None = None, name: str | None = None) -> CapturePoint:
    """Resolve a user's specification of one capture point into its files, checked and in reading order."""
    what = what or f"--{kind}"
    spec = os.fspath(spec)
    files, default_name = _files_of(spec, what)
    return point_of_files(kind, files, name or default_name, spec, what)


def point_of_files(kind: str, files: list[Path], name: str, given: str, what: str) -> CapturePoint:
    """A point of these files: checked, duplicates and empty rotation files left out, in reading order."""
    unique: dict[str, Path] = {}
    for f in files:
        unique.setdefault(os.path.realpath(f), f)
    files = list(unique.values())
    usable, skipped = [], []
    for f in files:
        if len(files) > 1 and f.is_file() and f.stat().st_size == 0:
            skipped.append(os.fspath(f))  # an empty file in a rotation (created, never written): nothing to read
            continue
        check_input(f)
        usable.append(f)
    if not usable:
        raise InputError(f"{what} {given}: every file is empty")
    if len(usable) > 1:
        starts = {f: first_frame_time(f) for f in usable}
        # time order of the first frames; files without a frame after the others; equal times by rotation index
        usable.sort(key=lambda f: (starts[f] is None, starts[f] or 0, rotation_index(f.name)[1] or 0, f.name))
    return CapturePoint(kind, name, tuple(os.fspath(f) for f in usable), given, tuple(skipped))


def points_of(kind: str, specs: list, what: str | None = None) -> list[CapturePoint]:
    """Each specification one point; a file in two points is a user mistake."""
    out = [p if isinstance(p, CapturePoint) else point(kind, p, what) for p in specs]
    return out


def check_disjoint(points: list[CapturePoint]) -> None:
    """A file may belong to one point only (`--app 'cap/*'` and `--db cap/db.pcap` would read db.pcap twice). One
    exception: the same files given whole as an app point and as a DB point (one capture read from both sides, e.g.
    a capture taken where client and server run on one host, or a self-check)."""
    owner: dict[str, CapturePoint] = {}

    def same_files_other_side(a: CapturePoint, b: CapturePoint) -> bool:
        return a.kind != b.kind and {os.path.realpath(f) for f in a.files} == {os.path.realpath(f) for f in b.files}

    for p in points:
        for f in p.files:
            real = os.path.realpath(f)
            other = owner.get(real)
            if other is not None and other is not p and not same_files_other_side(other, p):
                raise UsageError(f"{f} is in two capture points ({other.kind} {other.given or other.name!r} and "
                                 f"{p.kind} {p.given or p.name!r}): give each point its own files")
            owner[real] = p
    names = [(p.kind, p.name) for p in points]
    for n in set(names):
        if names.count(n) > 1:
            raise UsageError(f"two {n[0]} capture points are named {n[1]!r}: give them different files or folders")


def families(files: list[Path]) -> list[list[Path]]:
    """Files of a capture-set folder grouped into rotation families (db.pcap, db.pcap1, … one family; app1.pcap and
    app2.pcap two)."""
    groups: dict[str, list[Path]] = {}
    for f in sorted(files):
        groups.setdefault(rotation_index(f.name)[0], []).append(f)
    return list(groups.values())


# --- one stream over several files -------------------------------------------------------------------------------


@dataclass
class FileRead:
    """What reading one file of a point found (summary.json → points[].files[])."""

    file: str
    format: str = ""
    gzip: bool = False
    bytes: int = 0
    frames: int = 0
    first_frame: int = 1  # number of the file's first frame in the point
    first_ts_ns: int | None = None
    last_ts_ns: int | None = None
    damaged: str | None = None
    skipped: str | None = None  # why the file was not read (empty)

    def as_dict(self) -> dict:
        import pandas as pd

        iso = lambda ns: None if ns is None else pd.Timestamp(ns, unit="ns", tz="UTC").isoformat()  # noqa: E731
        return {"file": self.file, "format": self.format, "gzip": self.gzip, "bytes": self.bytes,
                "frames": self.frames, "first_frame": self.first_frame, "first_ts": iso(self.first_ts_ns),
                "last_ts": iso(self.last_ts_ns), "damaged": self.damaged}


_SUMMED = ("frames", "frames_tcp", "frames_non_ip", "frames_non_tcp", "frames_ip_fragment", "frames_undecodable",
           "frames_unknown_link", "frames_truncated", "frames_bad_ts", "bytes_file", "unknown_blocks", "sections",
           "interfaces")


def add_stats(total: CaptureStats, part: CaptureStats) -> None:
    """Fold one file's counters into its point's."""
    for name in _SUMMED:
        setattr(total, name, getattr(total, name) + getattr(part, name))
    for k, v in part.link_types.items():
        total.link_types[k] = total.link_types.get(k, 0) + v
    for k, v in part.if_drops.items():
        total.if_drops[k] = total.if_drops.get(k, 0) + v
    formats = [f for f in total.format.split("+") if f]
    if part.format and part.format not in formats:
        formats.append(part.format)
    total.format = "+".join(formats)
    total.gzip = total.gzip or part.gzip
    if total.first_ts_ns is None:
        total.first_ts_ns = part.first_ts_ns
    if part.last_ts_ns is not None:
        total.last_ts_ns = part.last_ts_ns
    if part.damaged:
        damage = f"{Path(part.path).name}: {part.damaged}"
        total.damaged = f"{total.damaged}; {damage}" if total.damaged else damage


class PointReader:
    """A capture point's files as one capture: CaptureReader's interface (segment_fields, raw frames, stats), frame
    numbers running through the files. `files()` hands out each file's own CaptureReader in turn (the extraction
    reads each with the native fast lane)."""

    pcap_layout = None  # not one classic pcap: the fast lane reads the files one by one (files())
    pcapng_packets = False  # nor one pcapng file (the fast lane reads either)

    def __init__(self, point: CapturePoint, stats: CaptureStats | None = None):
        self.point = point
        self.path = point.name
        self.stats = stats if stats is not None else CaptureStats(path=point.name)
        self.stats.path = point.name
        self.reads: list[FileRead] = []
        self._current: CaptureReader | None = None
        self._done_bytes = 0
        self._iterated = self._started = False
        self._total_bytes = point.bytes

    @property
    def bytes_read(self) -> int:
        now = self._current.bytes_read if self._current is not None else 0
        return self._done_bytes + now

    @property
    def total_bytes(self) -> int:
        return self._total_bytes

    def files(self) -> Iterator[tuple[CaptureReader, int]]:
        """(reader of the next file, number of frames before it) for each file in order. The caller reads each
        reader whole before asking for the next; its counters are then folded into `stats`."""
        if self._started:  # (iter_records sets _iterated itself before reading _frames)
            raise RuntimeError("a PointReader can be iterated only once")
        self._started = self._iterated = True
        before = 0
        previous: FileRead | None = None
        for path in self.point.files:
            if os.path.getsize(path) == 0:
                self.reads.append(FileRead(path, skipped="empty file", first_frame=before + 1))
                continue
            reader = CaptureReader(path)
            self._current = reader
            try:
                yield reader, before
            finally:
                reader.close()
                self._current = None
            s = reader.stats
            read = FileRead(path, s.format, s.gzip, s.bytes_file, s.frames, before + 1, s.first_ts_ns, s.last_ts_ns,
                            s.damaged)
            if previous is not None:
                check_overlap(self.point, previous, read)
            if s.frames:
                previous = read
            self.reads.append(read)
            add_stats(self.stats, s)
            self._done_bytes += s.bytes_file
            before += s.frames

    def segment_fields(self) -> Iterator[tuple]:
        for reader, before in self.files():
            if before:
                for fields in reader.segment_fields():
                    yield (fields[0] + before, *fields[1:])
            else:
                yield from reader.segment_fields()

    def _frames(self) -> Iterator[tuple]:
        """Records (frame, ts, linktype, data, orig_len, interface), as CaptureReader._frames (evidence export)."""
        for reader, before in self.files():
            reader._iterated = True
            for record in reader._frames():
                reader.stats.frames += 1  # as iter_records counts for one file: the next file's numbers follow
                yield (record[0] + before, *record[1:])

    def raw_frames(self) -> Iterator[tuple[int, int, int, bytes]]:
        for record in self._frames():
            yield record[:4]

    def __iter__(self):
        from .capture import TcpSegment

        for fields in self.segment_fields():
            yield TcpSegment(*fields)

    def close(self) -> None:
        if self._current is not None:
            self._current.close()

    def __enter__(self) -> "PointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_overlap(point: CapturePoint, previous: FileRead, read: FileRead) -> None:
    """Two files of one point that cover the same time for long are two points' captures: a user mistake."""
    if previous.last_ts_ns is None or read.first_ts_ns is None:
        return
    overlap = previous.last_ts_ns - read.first_ts_ns
    if overlap <= 0:
        return
    spans = [max((r.last_ts_ns or 0) - (r.first_ts_ns or 0), 0) for r in (previous, read)]
    if overlap > MIXED_OVERLAP_S * 1e9 and overlap > MIXED_OVERLAP_SHARE * min(spans):
        raise UsageError(
            f"--{point.kind} {point.given or point.name!r}: {Path(previous.file).name} and {Path(read.file).name} "
            f"cover the same {overlap / 1e9:.1f} s: these look like captures of two points (hosts) mixed in one; "
            f"give each point its own --{point.kind} (rotated files of one point follow each other in time)")


def file_report(point: CapturePoint, reads: list[FileRead]) -> tuple[dict, list[str]]:
    """summary.json → points[] entry of a point read from several files, and the warnings about its files: gaps
    between them, overlaps, numbers missing from a rotation sequence, damage inside a file that is not the last."""
    rows = [r.as_dict() for r in reads]
    warnings: list[str] = []
    read = [r for r in reads if r.frames]
    spans = sum(max((r.last_ts_ns or 0) - (r.first_ts_ns or 0), 0) for r in read)
    frames = sum(r.frames for r in read)
    usual = spans / max(frames - len(read), 1)  # the point's mean frame interval
    prev = None
    gaps, overlaps = [], []
    for row, r in zip(rows, reads):
        row["gap_s"] = None
        if r.skipped:
            row["skipped"] = r.skipped
            warnings.append(f"{point.kind} point {point.name}: {Path(r.file).name} skipped ({r.skipped})")
            continue
        if not r.frames:
            continue
        if prev is not None and prev.last_ts_ns is not None and r.first_ts_ns is not None:
            gap = (r.first_ts_ns - prev.last_ts_ns) / 1e9
            row["gap_s"] = gap
            if gap < 0:
                overlaps.append(f"{Path(prev.file).name} → {Path(r.file).name} overlap {-gap:.3f} s")
            elif gap > GAP_WARN_S and gap * 1e9 > GAP_FACTOR * usual:
                gaps.append(f"{Path(prev.file).name} → {Path(r.file).name} {gap:.3f} s")
        if r.damaged and r is not reads[-1]:
            warnings.append(f"{point.kind} point {point.name}: {Path(r.file).name} is damaged ({r.damaged}); "
                            "its frames before the damage were read, then the next file")
        prev = r
    if gaps:
        warnings.append(f"{point.kind} point {point.name}: {len(gaps)} gap(s) between its files with no frame "
                        f"(a file missing, a ring buffer that wrapped, or a pause): {'; '.join(gaps[:3])}"
                        + (" …" if len(gaps) > 3 else ""))
    if overlaps:
        warnings.append(f"{point.kind} point {point.name}: {len(overlaps)} overlap(s) between its files, read one "
                        f"after the other (a clock step, or two captures running for a moment): "
                        f"{'; '.join(overlaps[:3])}" + (" …" if len(overlaps) > 3 else ""))
    for f in point.skipped:
        rows.append({**FileRead(f).as_dict(), "gap_s": None, "skipped": "empty file"})
        warnings.append(f"{point.kind} point {point.name}: {Path(f).name} skipped (empty file)")
    missing = _missing_numbers([Path(f) for f in (*point.files, *point.skipped)])
    if missing:
        warnings.append(f"{point.kind} point {point.name}: rotation number(s) {', '.join(map(str, missing[:10]))} "
                        "missing from its files' sequence")
    entry = {"name": point.name, "kind": point.kind, "given": point.given, "files": rows,
             "gaps": len(gaps), "overlaps": len(overlaps), "missing_numbers": missing}
    return entry, warnings


def _missing_numbers(files: list[Path]) -> list[int]:
    """Rotation indexes absent from a numbered family (tcpdump numbers from 1 after the unnumbered first file, or
    from 0 with -W; dumpcap from 1)."""
    indexes = [rotation_index(f.name)[1] for f in files]
    numbers = sorted(n for n in indexes if n is not None)
    if not numbers:
        return []
    if None in indexes and numbers[0] >= 1:  # tcpdump -C: the first file has no number, the next ones 1, 2, …
        numbers.insert(0, 0)
    have = set(numbers)
    return [n for n in range(numbers[0], numbers[-1]) if n not in have]


def single_file_entry(point: CapturePoint, stats: CaptureStats) -> dict:
    """summary.json → points[] entry of a one-file point."""
    read = FileRead(point.files[0], stats.format, stats.gzip, stats.bytes_file, stats.frames, 1, stats.first_ts_ns,
                    stats.last_ts_ns, stats.damaged)
    row = read.as_dict()
    row["gap_s"] = None
    return {"name": point.name, "kind": point.kind, "given": point.given, "files": [row], "gaps": 0,
            "overlaps": 0, "missing_numbers": []}
