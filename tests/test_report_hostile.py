"""A capture is attacker-controlled: whoever can send a statement writes into report.html. Nothing from a capture,
a slow log or a file name may run script or change the page, and no timestamp may make the figures' cost explode.

The hostile capture set is group-stall with its statements, its database name, its folder and its app capture's
file name rewritten (same byte lengths: TCP and MySQL lengths, sequence numbers and the slow-log join hold)."""

from __future__ import annotations

import html
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from browser import flat_text, page_text, probe, rendered, script_errors, section

from pcapdecomp.analysis import Options, analyze
from pcapdecomp.render.figures import TIME_BUCKETS

sys.path.insert(0, str(Path(__file__).parent))
from pcaptools import records, rewrite  # noqa: E402

CAPTURES = Path(__file__).resolve().parents[1] / "captures"
GS = CAPTURES / "group-stall"

# old statement (bytes on the wire and in the slow log) -> payload of the same length or shorter (padded)
PAYLOADS = {
    # the culprit of the stall: stalls table, verdict, timeline, waterfall, profile
    "SELECT BENCHMARK(6895237, SHA2(RAND(), 256))": "SELECT '<img src=x onerror=console.log(2)>'",
    # the hidden-slow victims: plotly markup in labels
    "SELECT 1": "<b>1</b>",
    "SET NAMES utf8mb4": "<a href=//e>x</a>",
    # breaks out of <script>, opens an HTML comment (the double-escaped state), a plotly template, line separators
    "SELECT CONNECTION_ID(), (SELECT THREAD_ID FROM performance_schema.threads WHERE PROCESSLIST_ID = CONNECTION_ID())":
        "SELECT '</script><script>console.log(\"PWNED\");document.title=1</script><!--<script>%{x}\u2028\u2029&lt;' "
        "FROM dual",
}
DB_NAME = (b"lab\x00", b"<i>\x00")  # the login packet's database
SET_NAME = "set<svg onload=console.log(3)>\"'&"
APP_NAME = "app<img src=y onerror=console.log(4)>.pcap"
BENIGN_CONSOLE = re.compile(r"WebGL|GPU stall|GL Driver|swiftshader|GroupMarkerNotSet", re.I)


def _same_length(old: str, new: str) -> tuple[bytes, bytes]:
    a, b = old.encode(), new.encode()
    assert len(b) <= len(a), (old, new)
    return a, b.ljust(len(a))


def hostile_set(dst: Path) -> Path:
    folder = dst / SET_NAME
    folder.mkdir(parents=True)
    pairs = [_same_length(old, new) for old, new in PAYLOADS.items()] + [DB_NAME]

    def packet(pkt: bytes) -> bytes:
        for a, b in pairs:
            pkt = pkt.replace(a, b)
        return pkt

    rewrite(GS / "app.pcap", folder / APP_NAME, packet=packet)
    rewrite(GS / "db.pcap", folder / "db.pcap", packet=packet)
    slow = (GS / "slow.log").read_bytes()
    for a, b in pairs[:-1]:
        slow = slow.replace(a, b)
    (folder / "slow.log").write_bytes(slow)
    toml = (GS / "capture.toml").read_text(encoding="utf-8")
    (folder / "capture.toml").write_text(toml.replace('app = "app.pcap"', f'app = "{APP_NAME}"'), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    folder = hostile_set(tmp_path_factory.mktemp("hostile"))
    res = analyze(folder, Options(quiet=True), folder.parent / "out")
    found, dom, console = probe(res.out_dir / "report.html", tmp_path_factory.mktemp("chromium") / "profile")
    return res, found, dom, console


def test_the_payloads_reached_the_tables(hostile):
    """The crafted set is analysed like the original: the payloads are in the exchanges, the culprit still holds
    its group, the victims are still hidden slow (so every section carries a payload)."""
    res, *_ = hostile
    x = res.exchanges
    sql = set(x["sql"].dropna().astype(str))
    for new in PAYLOADS.values():
        assert new.encode().decode() in {s.rstrip() for s in sql}, new
    assert int(x["hidden_slow"].fillna(False).sum()) == 3
    assert res.summary["groups"]["stalls"][0]["culprits"][0]["sql"].startswith("SELECT '<img")
    assert set(x["db"].dropna().astype(str)) == {"<i>"}


def test_no_payload_runs_script_or_changes_the_page(hostile):
    res, found, dom, console = hostile
    # the title is the folder's name as text
    title = re.search(r"<title>(.*?)</title>", dom, flags=re.S).group(1)
    assert html.unescape(title) == f"pcapdecomp — {SET_NAME}"
    # nothing logged but plotly's WebGL notices; no error
    assert not [line for line in console if not BENIGN_CONSOLE.search(line)], console
    assert not script_errors(dom) and not found["errors"]
    # every figure rendered, with its data
    specs = [k for k in ("shares", "timeline", "heatmap", "pool", "waterfall", "connrate", "openconns")]
    assert rendered(dom) == f"{len(specs)} figures"
    assert set(found["figures"]) == {f"fig-{k}" for k in specs}
    assert all(t["n"] > 0 for f in found["figures"].values() for t in f["traces"])
    # no element came from a payload: our three scripts and the probe's, no image, no svg handler, no link to //e
    assert dom.count("<script") == 4
    markup = re.sub(r"<script>.*?</script>", "", dom, flags=re.S)  # the elements, without our scripts' code
    assert "<img" not in markup and "<svg onload" not in markup and not re.search(r"href=\"//e\"", markup)
    for raw in ("<b>1</b>", "@<i>", "<a href=//e>"):
        at = markup.find(raw)
        assert at < 0, markup[max(at - 300, 0):at + 100]


def test_payloads_are_shown_as_text_everywhere(hostile):
    res, found, dom, _ = hostile
    culprit = PAYLOADS["SELECT BENCHMARK(6895237, SHA2(RAND(), 256))"]
    groups = flat_text(section(dom, "groups"))
    assert f"conn 7: {culprit} executed 3.815 s" in groups
    hidden = flat_text(section(dom, "hidden"))
    assert hidden.count("<b>1</b>") == 3 and culprit in hidden
    profile = page_text(section(dom, "profile"))
    assert PAYLOADS["SET NAMES utf8mb4"] in profile and "app@<i>" in profile
    assert "</script><script>console.log(\"PWNED\");document.title=1</script><!--<script>%{x}" in profile
    inputs = page_text(section(dom, "inputs"))  # the inputs table, below the picture
    assert APP_NAME in inputs and SET_NAME in inputs
    # plotly drew the labels as text: the waterfall's tick labels and the timeline's tooltip
    assert re.search(r"conn \d+ · &lt;b&gt;1&lt;/b&gt;", section(dom, "waterfall"))
    assert found["tips"]["culprit"].startswith(culprit + "\nconn 7, group 1")
    assert found["tips"]["hidden slow"].startswith("<b>1</b>\nconn ")


def test_script_blocks_hold_no_raw_markup_or_line_separators(hostile):
    res, *_ = hostile
    page = (res.out_dir / "report.html").read_text(encoding="utf-8")
    boot = page.rsplit("<script>", 1)[1]
    assert "</script" not in boot.split("</script></body>")[0]
    data = boot.split("var specs = ", 1)[1].split(";\n", 1)[0]
    for bad in ("<", ">", "&", "\u2028", "\u2029"):
        assert bad not in data, bad
    assert "\\u003c/script\\u003e\\u003c!--\\u003cscript\\u003e%{x}" in data  # the payload is there, escaped


def test_script_json_escapes_everything_that_could_end_or_bend_a_script():
    from pcapdecomp.render.report import _script_json

    nasty = {"a": "</script><!--<script>]]>&amp;\u2028\u2029\x00é💥", "</b>": ["<", ">", "&"]}
    text = _script_json(nasty)
    assert json.loads(text) == nasty
    assert not re.search("[<>&\u2028\u2029]", text) and text.isascii()


def test_wild_timestamps_are_counted_and_said_not_plotted(tmp_path):
    """One frame stamped 1970 (time 0) in the DB capture made the figures allocate per-bucket arrays over 56 years
    (4.4 GB, a 675 MB report). The capture reader now repairs short runs of such frames (capture.WILD_RUN); a
    longer run reaches the analysis. The charts show the capture's real span and say what was left out."""
    from pcapdecomp.read.capture import WILD_RUN

    folder = tmp_path / "wild"
    folder.mkdir()
    for name in ("app.pcap", "slow.log", "capture.toml"):
        shutil.copy(GS / name, folder / name)
    stamps = [ts for ts, _, _ in records(GS / "db.pcap")[3]]
    wild = set(stamps[501:501 + WILD_RUN + 2])  # requests and answers of probes in the middle of the capture
    rewrite(GS / "db.pcap", folder / "db.pcap", time=lambda ts: 0 if ts in wild else ts)
    res = analyze(folder, Options(quiet=True), tmp_path / "out")
    x = res.exchanges
    assert min(x["db_req_ts"].min(), x["db_resp_ts"].min()).year < 1971  # the damage is in the table
    page_path = res.out_dir / "report.html"
    assert page_path.stat().st_size < 8 * 2**20
    found, dom, _ = probe(page_path, tmp_path / "profile")
    assert not script_errors(dom) and not found["errors"]
    text = page_text(dom)
    assert re.search(r"time outliers [1-9][0-9]* exchanges or connections have timestamps far outside the capture's time "
                     r"range \(between 19(69-12-31|70-01-01) [0-9:.]+ and 19(69-12-31|70-01-01)", text), text[:3000]
    real = x["app_req_ts"].dropna()
    lo, hi = real.min().value / 1e6, x["app_resp_ts"].max().value / 1e6
    for name, f in found["figures"].items():
        if f["type"] == "date":
            assert lo - 1e3 < f["range"][0] <= lo and hi <= f["range"][1] < hi + 1e3, name
    heat = found["figures"]["fig-heatmap"]["traces"][0]
    assert heat["n"] <= TIME_BUCKETS + 1


def test_binary_bytes_in_text_are_shown_as_escapes_and_keep_the_page_utf8():
    """A statement's control characters and undecodable bytes (surrogate-escaped) become visible \\xNN escapes in
    HTML and in plotly labels, and never make the page invalid UTF-8."""
    from pcapdecomp.render.figures import plain
    from pcapdecomp.render.report import esc

    raw = b"SELECT '\x00\x07\xff<'".decode("utf-8", "surrogateescape")
    assert esc(raw) == "SELECT &#x27;\\x00\\x07\\xff&lt;&#x27;"
    assert plain(raw) == "SELECT '\\x00\\x07\\xff&lt;'"
    esc(raw).encode("utf-8")  # no lone surrogate left
