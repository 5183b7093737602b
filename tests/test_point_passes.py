"""A capture point of several files (a rotation) is read again as one stream by every pass after extraction: the
loss repair's borrow and re-read, the clock's segment pass, the connection ids read back from answers. Each pass is
given the point itself (an Extraction's `source`), never its name: no registry maps a name to a point's files.

Real captures: a bundled recording's DB capture, split by editcap into files named as dumpcap's ring buffer names
them, against the same capture as one file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.core.errors import InputError
from pcapdecomp.pair.clocks import read_segments_of
from pcapdecomp.read import connids, sources
from pcapdecomp.read.exchanges import extract

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from lose_frames import lose_frames  # noqa: E402

LOSSY_SET = REPO / "captures" / "oltp-prepared"
POOLED_SET = REPO / "captures" / "field-pool-before-capture"  # connections opened before the capture began
NAMES = ("capture", "db_point")  # the point's name (its folder) differs from the file's by design

pytestmark = pytest.mark.skipif(shutil.which("editcap") is None, reason="editcap (Wireshark) splits the captures")


def _rotated(source: Path, folder: Path, frames_per_file: int) -> sources.CapturePoint:
    """`source` split into files of `frames_per_file` frames in `folder` (db_00000_<time>.pcap, …), as one point."""
    folder.mkdir()
    subprocess.run(["editcap", "-F", "nsecpcap", "-c", str(frames_per_file), str(source), str(folder / "db.pcap")],
                   check=True, capture_output=True)
    point = sources.point("db", folder)
    assert len(point.files) >= 2
    return point


@pytest.mark.parametrize("frames_per_file", [900, 250])
def test_the_loss_repair_rereads_a_rotated_point_as_one_stream(tmp_path, monkeypatch, frames_per_file):
    """Frames lost at the DB: the repair borrows and re-reads the DB point of two (or eight) files as it does the
    one file, each file read by the native lane; the repaired exchanges and the repair's counts are the same."""
    from pcapdecomp.pair import repair

    lossy = tmp_path / "db.pcap"
    lose_frames(LOSSY_SET / "db.pcap", lossy, 0.05, 1041)
    point = _rotated(lossy, tmp_path / "db", frames_per_file)
    whole = analyze(capture_set(app=[LOSSY_SET / "app.pcap"], db=[lossy], slow_log=LOSSY_SET / "slow.log",
                                long_query_time=0.1, thread_pool_size=2),
                    Options(quiet=True, jobs=1), tmp_path / "whole")
    reread_natively, natively = repair._reread_natively, []

    def spy(*args):
        x = reread_natively(*args)
        natively.append(x is not None)
        return x

    monkeypatch.setattr(repair, "_reread_natively", spy)
    split = analyze(capture_set(app=[LOSSY_SET / "app.pcap"], db=[point.given], slow_log=LOSSY_SET / "slow.log",
                                long_query_time=0.1, thread_pool_size=2),
                    Options(quiet=True, jobs=1), tmp_path / "split")
    assert natively == [True]  # the lane re-read the point's files, none in Python
    assert whole.summary["repair"]["exchanges_repaired"] > 0
    assert split.summary["repair"] == whole.summary["repair"]
    a, b = whole.exchanges, split.exchanges
    cols = [c for c in a.columns if c not in NAMES]
    pd.testing.assert_frame_equal(a[cols].reset_index(drop=True), b[cols].reset_index(drop=True), check_exact=True)
    assert set(b["db_point"].dropna().astype(str)) == {point.name}


def test_the_clock_pass_reads_a_rotated_point_as_one_stream(tmp_path):
    """The clock's pass over a point of three files gives the segments of the one file."""
    db = LOSSY_SET / "db.pcap"
    point = _rotated(db, tmp_path / "db", 700)
    conns = extract(db).connections
    flows = set()
    for client, server in zip(conns["client"].astype(str), conns["server"].astype(str)):
        (ci, cp), (si, sp) = sources.parse_server(client), sources.parse_server(server)
        flows.add((ci, cp, si, sp))
    assert len(flows) >= 4
    whole, split = read_segments_of(db, flows), read_segments_of(point, flows)
    assert len(whole.ts) > 1000 and whole.read == split.read
    for column in ("k1", "k2", "ts"):
        assert (getattr(whole, column) == getattr(split, column)).all(), column
    # the point's name (its folder) is only a name: nothing maps it to the point's files
    with pytest.raises(InputError):
        read_segments_of(point.name, flows)
    # each file by the native lane, as the extraction reads them, and by the Python reader: the same segments
    os.environ["PCAPDECOMP_NO_LANE"] = "1"
    try:
        python = read_segments_of(point, flows)
    finally:
        os.environ.pop("PCAPDECOMP_NO_LANE", None)
    assert (python.read, python.repeated) == (split.read, split.repeated)
    for column in ("k1", "k2", "ts"):
        assert (getattr(python, column) == getattr(split, column)).all(), column


def test_connection_ids_are_read_back_from_a_rotated_point(tmp_path):
    """Connections seen without their greeting: the ids answered to SELECT CONNECTION_ID() are read back from the
    frames of the point's files, numbered through the point."""
    db = POOLED_SET / "db.pcap"
    point = _rotated(db, tmp_path / "db", 300)
    got = {}
    for source in (db, point):
        x = extract(source)
        ids = connids.ids_from_answers(source, x.exchanges, x.connections)
        got[source is point] = {index: conn_id for (_, index), conn_id in ids.items()}
    assert got[False] and got[True] == got[False]


def test_the_repairs_lane_passes_read_a_rotated_point_as_one_stream(tmp_path):
    """fastlane.excerpt_scan over a point of eight files finds the segments of the one file, frames numbered
    through the files, and excerpt_copy writes the same records, pieces put in: one before a file's first chosen
    frame, one inside a file, one after the last frame."""
    import numpy as np

    from pcapdecomp.pair.repair import PSH
    from pcapdecomp.read import fastlane

    db = LOSSY_SET / "db.pcap"
    point = _rotated(db, tmp_path / "db", 250)
    assert len(point.files) >= 6
    conns = extract(db).connections
    keys = []
    for client, server in zip(conns["client"].astype(str), conns["server"].astype(str)):
        (ci, cp), (si, sp) = sources.parse_server(client), sources.parse_server(server)
        keys += [(ci, cp, si, sp), (si, sp, ci, cp)]
    whole, split = fastlane.excerpt_scan(db, keys), fastlane.excerpt_scan(point, keys)
    assert len(whole[0]) > 1000
    for a, b in zip(whole, split, strict=True):
        assert (a == b).all()
    assert fastlane.file_frames(point) == [250] * (len(point.files) - 1) + [fastlane.file_frames(db)[0] % 250 or 250]
    frames = whole[1][::3]
    boundary = int(np.searchsorted(frames, 2 * 250, side="right"))  # the first chosen frame of the third file
    insert_at = np.array([boundary, boundary + 5, len(frames)], dtype=np.int64)
    blobs = [fastlane.excerpt_record(keys[0], int(whole[2][0]), 7 + i, 9, PSH, b"piece %d" % i) for i in range(3)]
    copies = []
    for source in (db, point):
        out = bytearray()
        assert fastlane.excerpt_copy(source, keys, frames, insert_at, blobs, out.extend) == len(frames)
        copies.append(bytes(out))
    assert copies[0] == copies[1] and all(blob in copies[0] for blob in blobs)
