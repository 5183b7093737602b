"""`analyze --since T --until T` (pcapdecomp/core/window.py, issue 37): a time window of long captures, read whole
for their connections' state and kept to the window's exchanges.

Real captures: the bundled `oltp-prepared` set (prepared statements made once at the start, a CPU hog stalling
thread group 0 every 1.2 s) and tests/data's one-connection pair (a login, then a 3.8 s BENCHMARK). A window of
each is compared with the whole run's rows of the same time, and with an editcap cut of the same window, which is
what the memory bound's refusal advised before: the cut loses the connection ids and the prepared statements'
text the window keeps."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysing import explain
from pcapdecomp.core.errors import UsageError
from pcapdecomp.core.window import MARGIN_NS, NS, Window, parse_instant, window_of
from pcapdecomp.pair.clocks import read_segments_of
from pcapdecomp.read import extract as extraction
from pcapdecomp.read.captureset import capture_set
from pcapdecomp.read.exchanges import extract

REPO = Path(__file__).resolve().parents[1]
OLTP = REPO / "captures" / "oltp-prepared"  # 2026-11-23 20:20:32.03 … 20:20:35.17 UTC at both points
SINCE, UNTIL = "2026-11-23T20:20:33Z", "2026-11-23T20:20:34.2Z"  # the second stall (20:20:34.168) inside
FIELD = REPO / "tests" / "data" / "field"
UTC = dt.timezone.utc
KEY = ["conn_index", "seq"]  # the whole capture is read: connections are numbered as in the full run
needs_editcap = pytest.mark.skipif(shutil.which("editcap") is None, reason="editcap (wireshark-common) cuts the files")


def _window(since: str | None, until: str | None) -> Window:
    return window_of(since, until, UTC)


def _editcap_cut(source: Path, folder: Path, since: str, until: str, names=("app.pcap", "db.pcap")) -> Path:
    """The set's captures cut to [since, until] as the refusal used to advise (editcap's times are local: TZ=UTC),
    the slow log and capture.toml copied as they are."""
    folder.mkdir(parents=True, exist_ok=True)
    a, b = (t.replace("T", " ").rstrip("Z") for t in (since, until))
    for name in names:
        subprocess.run(["editcap", "-A", a, "-B", b, str(source / name), str(folder / name)], check=True,
                       env={"TZ": "UTC", "PATH": "/usr/bin:/bin"}, capture_output=True)
    for name in ("slow.log", "capture.toml"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def oltp():
    """The whole set and the window of it, analysed (the stages, nothing written)."""
    return explain(OLTP), explain(OLTP, window=_window(SINCE, UNTIL))


def _in_window(rows: pd.DataFrame, window: Window) -> pd.DataFrame:
    """The rows whose request began in the window at the point that saw them (app first: each point decides by
    its own clock)."""
    ts = rows["app_req_ts"].where(rows["app_req_ts"].notna(), rows["db_req_ts"])
    ns = ts.astype("int64")
    return rows[((ns >= window.since_ns) & (ns < window.until_ns)).to_numpy()]


# --- the rows of the window are the full run's --------------------------------------------------------------------


def test_the_window_holds_the_full_runs_rows_of_its_time_with_their_ids_groups_and_statements(oltp):
    full, win = oltp
    window = win.cs.window
    expected = _in_window(full.exchanges, window)
    got = win.exchanges
    assert 200 < len(got) < len(full.exchanges)
    assert sorted(map(tuple, got[KEY].to_numpy())) == sorted(map(tuple, expected[KEY].to_numpy()))
    both = got.merge(full.exchanges, on=KEY, suffixes=("", "_full"))
    for column in ("conn_id", "thread_group", "command", "sql", "fingerprint", "query_id", "stmt_id", "app_req_ts",
                   "total_s", "server_s", "in_slow_log", "hidden_slow", "stall_role", "seen", "match_notes"):
        a, b = both[column].astype(object), both[f"{column}_full"].astype(object)
        same = (a.isna() & b.isna()) | (a == b).fillna(False)
        assert same.all(), (column, both.loc[~same.to_numpy(), KEY].head())
    assert got["conn_id"].notna().all() and got["thread_group"].notna().all()
    assert (win.summary["conn_ids"]["greeting"], win.summary["conn_ids"]["unknown"]) == (5, 0)


def test_executes_whose_prepare_came_before_the_window_keep_their_text(oltp):
    full, win = oltp
    since = win.cs.window.since_ns
    x = full.exchanges
    prepares = x[x["command"].astype(object) == "COM_STMT_PREPARE"]
    assert len(prepares) and (prepares["app_req_ts"].astype("int64") < since).all()  # all made before the window
    executes = win.exchanges[win.exchanges["command"].astype(object) == "COM_STMT_EXECUTE"]
    assert len(executes) > 50
    assert executes["sql"].notna().all() and executes["fingerprint"].notna().all()


def test_the_windows_stall_and_its_hidden_slow_statement_are_the_full_runs(oltp):
    full, win = oltp
    def stall_rows(x):
        return sorted(map(tuple, x.loc[x["stall_role"].notna(), [*KEY]].to_numpy()))
    in_window = _in_window(full.exchanges, win.cs.window)
    assert stall_rows(win.exchanges) == stall_rows(in_window) != []
    assert win.summary["exchanges"]["hidden_slow"] == int(in_window["hidden_slow"].fillna(False).sum()) == 1
    assert "thread group 0" in win.summary["verdict"]


def test_summary_and_report_say_the_window(oltp, tmp_path):
    _, win = oltp
    assert win.summary["window"] == {"since": SINCE, "until": UNTIL, "decided_by": "req_first_ts", "margin_s": 1.0}
    assert f"in the time window {SINCE} … {UNTIL}" in win.summary["verdict"]
    from analysing import analyse

    result = analyse(OLTP, tmp_path / "out", window=_window(SINCE, UNTIL), jobs=1)
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "time window" in page and SINCE in page and UNTIL in page
    assert result.summary["window"]["since"] == SINCE


# --- the window's edges are the edges of a capture, not loss -------------------------------------------------------


def test_the_edges_are_not_loss_and_the_connections_are_the_windows(oltp):
    full, win = oltp
    notes = win.exchanges["match_notes"].astype(object).fillna("")
    assert not notes.str.contains("lost-at").any()
    assert win.summary["repair"] is None and win.summary["match"]["app_only"] == win.summary["match"]["db_only"] == 0
    assert not [w for w in win.warnings if "lost" in w or "resynchronis" in w or "gap" in w], win.warnings
    story = win.summary["connections"]
    # opened before the window and closed after it: neither new nor closed in it (a COM_QUIT after the window is
    # not an idle close by the server), open all along
    assert story["new"] == 0 and story["idle_closes"]["count"] == 0 and story["closes"]["open"] == 5
    assert story["span_s"] == pytest.approx(1.2)
    assert full.summary["connections"]["new"] == 5


def test_the_clocks_samples_are_the_windows_and_its_margin():
    pt = capture_set(OLTP).of("db")[0]
    conns = extract(pt).connections
    from pcapdecomp.pair.clocks import _flows

    flows = _flows(conns)
    window = _window("2026-11-23T20:20:33.5Z", "2026-11-23T20:20:33.6Z")
    lo, hi = window.around()
    assert (lo, hi) == (window.since_ns - MARGIN_NS, window.until_ns + MARGIN_NS)
    whole = read_segments_of(pt, flows)
    kept = read_segments_of(pt, flows, (lo, hi))
    assert 0 < kept.read < whole.read
    assert (kept.ts >= lo).all() and (kept.ts <= hi).all()
    assert whole.repeated == 0  # (no key seen twice in this recording: the two passes' counts compare)
    assert kept.read == int(((whole.ts >= lo) & (whole.ts <= hi)).sum())


# --- an editcap cut of the same window loses what the window keeps ------------------------------------------------


@needs_editcap
def test_an_editcap_cut_of_the_window_loses_the_ids_and_the_prepared_statements_the_window_keeps(oltp, tmp_path):
    _, win = oltp
    cut = explain(_editcap_cut(OLTP, tmp_path / "cut", SINCE, UNTIL))
    kept, lost = win.exchanges, cut.exchanges
    assert len(lost) == len(kept)  # the same exchanges …
    executes = lost[lost["command"].astype(object) == "COM_STMT_EXECUTE"]
    assert len(executes) and executes["sql"].isna().all()  # … but no EXECUTE's statement is known in the cut
    assert lost["conn_id"].isna().all() and lost["thread_group"].isna().all()  # nor a connection id or group
    assert not cut.summary["slow_log"]["used"] and win.summary["slow_log"]["matched"] > 0
    assert "thread group" not in cut.summary["verdict"] and "thread group 0" in win.summary["verdict"]
    assert win.exchanges["sql"].notna().sum() > lost["sql"].notna().sum()


@needs_editcap
def test_a_window_of_the_one_connection_pair_keeps_its_connection_id_a_cut_does_not(tmp_path):
    """tests/data: one connection logs in (05:42:34.68) and runs a 3.8 s BENCHMARK from 05:42:36.31; the window
    holds the BENCHMARK alone."""
    since, until = "2026-11-22T05:42:36Z", "2026-11-22T05:42:37Z"
    files = {"app": FIELD / "one-connection-app.pcap", "db": FIELD / "one-connection-db.pcap"}
    full = explain(**files, thread_pool_size=2)
    win = explain(**files, thread_pool_size=2, window=_window(since, until))
    assert list(win.exchanges["sql"]) == ["SELECT BENCHMARK(6895237, SHA2(RAND(), 256))"]
    row = win.exchanges.iloc[0]
    twin = full.exchanges[full.exchanges["sql"].astype(object) == row["sql"]].iloc[0]
    assert (row["conn_id"], row["thread_group"], row["total_s"]) == (7, 1, twin["total_s"])
    assert twin["conn_id"] == 7 and twin["thread_group"] == 1
    # the DB's times on the app's clock: the window's fit (its samples alone) within a nanosecond of the whole's
    assert row["server_s"] == pytest.approx(twin["server_s"], abs=2e-9)
    folder = tmp_path / "cut"
    folder.mkdir()
    for kind, path in files.items():
        shutil.copy(path, folder / f"{kind}.pcap")
    cut = explain(_editcap_cut(folder, tmp_path / "cut-window", since, until))
    assert len(cut.exchanges) == 1 and pd.isna(cut.exchanges["conn_id"].iloc[0])


# --- degenerate windows --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("since,until,word", [(SINCE, SINCE, "empty"), (UNTIL, SINCE, "reversed")])
def test_an_empty_or_reversed_window_is_a_mistake(since, until, word):
    with pytest.raises(UsageError, match=word):
        _window(since, until)


def _one_line_exit_2(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "pcapdecomp", "analyze", *args], capture_output=True, text=True,
                          cwd=REPO)
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_a_window_outside_every_capture_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    out = tmp_path / "out"
    line = _one_line_exit_2(str(OLTP), "--since", "2026-11-24T00:00:00Z", "-q", "-o", str(out))
    assert "outside every capture" in line and "2026-11-23T20:20:32" in line
    assert not out.exists()
    line = _one_line_exit_2(str(OLTP), "--since", UNTIL, "--until", SINCE, "-q", "-o", str(out))
    assert "reversed" in line and not out.exists()
    assert "--until 'tomorrow'" in _one_line_exit_2(str(OLTP), "--until", "tomorrow", "-q", "-o", str(out))


@needs_editcap
def test_a_point_that_caught_nothing_is_analysed_with_a_warning(tmp_path):
    """The app capture ends (20:20:33) before the window begins; the DB capture runs through it."""
    folder = tmp_path / "set"
    folder.mkdir()
    shutil.copy(OLTP / "db.pcap", folder / "db.pcap")
    for name in ("slow.log", "capture.toml"):
        shutil.copy(OLTP / name, folder / name)
    subprocess.run(["editcap", "-B", "2026-11-23 20:20:33", str(OLTP / "app.pcap"), str(folder / "app.pcap")],
                   check=True, env={"TZ": "UTC", "PATH": "/usr/bin:/bin"})
    win = explain(folder, window=_window("2026-11-23T20:20:34Z", "2026-11-23T20:20:35Z"))
    said = [w for w in win.warnings if "no exchange began in the window" in w]
    assert len(said) == 1 and said[0].startswith(str(folder / "app.pcap")), win.warnings
    assert len(win.exchanges) > 100 and (win.exchanges["seen"].astype(object) == "db").all()
    assert win.exchanges["conn_id"].notna().all()


# --- the times a DBA has at hand ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,zone,expected", [
    ("2026-11-23T20:20:33Z", UTC, "2026-11-23T20:20:33+00:00"),
    ("2026-11-23 20:20:33", UTC, "2026-11-23T20:20:33+00:00"),  # no zone: UTC
    ("2026-11-23 21:20:33+01:00", UTC, "2026-11-23T20:20:33+00:00"),
    ("2026-11-23T21:20:33.25", "Europe/Berlin", "2026-11-23T20:20:33.25+00:00"),  # no zone: --slow-log-tz's
    ("2026-11-23T20:20:33.123456789Z", UTC, "2026-11-23T20:20:33.123456789+00:00"),
    ("1795465233", UTC, "2026-11-23T20:20:33+00:00"),  # epoch seconds
    ("1795465233.5", UTC, "2026-11-23T20:20:33.5+00:00"),
])
def test_times_as_a_dba_writes_them(text, zone, expected):
    from zoneinfo import ZoneInfo

    tz = ZoneInfo(zone) if isinstance(zone, str) else zone
    assert parse_instant(text, tz, "--since") == pd.Timestamp(expected).value


@pytest.mark.parametrize("text", ["tomorrow", "20:20:33", "2026-11-23", "2026-13-01T00:00:00", "17954652"])
def test_a_time_that_is_not_one_is_refused_naming_the_option(text):
    with pytest.raises(UsageError, match=r"--until"):
        parse_instant(text, UTC, "--until")


# --- memory follows the window ---------------------------------------------------------------------------------------


def test_the_extraction_knows_how_far_into_the_window_it_is():
    """window_share (the memory bound's extrapolation with a window) climbs to the whole window as the captures
    are read, and the rows held are the window's alone."""
    cs = capture_set(OLTP)
    window = _window(SINCE, UNTIL)
    seen = []
    xs = extraction.extract_all(cs.of("app") + cs.of("db"), None, 1 << 20, 1,
                                lambda *_: seen.append(extraction.window_share()), window=window)
    shares = [s for s in seen if s is not None]
    assert shares and shares == sorted(shares) and 0 <= shares[0] and shares[-1] <= 1
    assert shares[-1] >= 0.99
    assert extraction.window_share() is None  # not left behind for the next run
    for x in xs:
        ts = x.exchanges["req_first_ts"].astype("int64").to_numpy()
        assert len(ts) and (ts >= window.since_ns).all() and (ts < window.until_ns).all()


def test_the_memory_check_counts_the_windows_exchanges_and_suggests_a_shorter_window():
    from pcapdecomp.core import memory
    from pcapdecomp.core.errors import MemoryBoundError
    from pcapdecomp.read.extract import counts_of, extract_points

    cs = capture_set(OLTP, window=_window(SINCE, UNTIL))
    whole = counts_of(extract_points(capture_set(OLTP), 1, True, 1 << 20, lambda _: None))
    bound = memory.MemoryBound(1, "the test's bound", 1)
    bound.limit = bound.start + memory.COST_FIXED + 1  # above the start, below any exchange's share
    with pytest.raises(MemoryBoundError) as refused:
        extract_points(cs, 1, True, 1 << 20, lambda _: None, memory=bound)
    text = str(refused.value)
    assert "a shorter time window" in text and "--since T --until T" in text
    n = int(text.split(" exchanges (")[0].rsplit(" ", 1)[1].replace(",", ""))
    assert 0 < n < whole.exchanges / 2


def test_no_window_keeps_every_row():
    assert window_of(None, None, UTC) is None
    whole = extract(OLTP / "db.pcap")
    open_end = extract(OLTP / "db.pcap", window=Window(None, pd.Timestamp(UNTIL).value))
    ts = whole.exchanges["req_first_ts"].astype("int64").to_numpy()
    assert len(open_end.exchanges) == int((ts < pd.Timestamp(UNTIL).value).sum()) < len(ts)
    assert np.array_equal(open_end.exchanges["seq"].to_numpy(),
                          whole.exchanges["seq"].to_numpy()[ts < pd.Timestamp(UNTIL).value])
    assert NS == 10 ** 9


def test_the_window_read_by_two_workers_is_the_window_read_by_one(oltp):
    """--jobs 2: the app capture read here, the DB capture in a forked worker (read/extract.py's pool): each drops
    the rows outside the window itself, and the clock's pass ahead keeps to the window too."""
    _, win = oltp
    two = explain(OLTP, window=_window(SINCE, UNTIL), jobs=2)
    pd.testing.assert_frame_equal(two.exchanges, win.exchanges, check_exact=True)
    assert two.summary["clock"] == win.summary["clock"]
