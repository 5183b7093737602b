"""report.html: rendered in headless Chromium from the bundled recordings; self-contained; bounded for big inputs."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcapdecomp.analysis import analyze
from pcapdecomp.report import render
from pcapdecomp.report_figures import TIMELINE_POINTS, figure_specs

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
ARTIFACTS = Path(os.environ.get("PCAPDECOMP_ARTIFACTS", REPO / "tests" / "artifacts"))


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    assert path, "chromium not found: run scripts/install-deps.sh (Debian package chromium)"
    return path


def run_chromium(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         f"--user-data-dir={tmp / 'chromium-profile'}", "--virtual-time-budget=15000", *args, page.as_uri()],
        capture_output=True, text=True, timeout=180,
    )


def rendered_dom(page: Path, tmp: Path, screenshot: str | None = None) -> str:
    proc = run_chromium(page, tmp, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    if screenshot:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = run_chromium(page, tmp, "--hide-scrollbars", "--window-size=1400,5200",
                            f"--screenshot={ARTIFACTS / screenshot}")
        assert shot.returncode == 0 and (ARTIFACTS / screenshot).stat().st_size > 10_000, shot.stderr[-2000:]
    return proc.stdout


def script_errors(dom: str) -> str | None:
    """What window.onerror recorded on the <html> element (see report._ERRORS), or None."""
    m = re.search(r"<html[^>]*data-errors=\"([^\"]*)\"", dom)
    return html.unescape(m.group(1)) if m else None


def page_text(dom: str) -> str:
    text = re.sub(r"<script.*?</script>", " ", dom, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


@pytest.fixture(scope="module")
def group_stall(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "group-stall"
    return analyze(CAPTURES / "group-stall", [], None, None, None, None, [], out, quiet=True,
                   command_line="pcapdecomp analyze captures/group-stall")


def test_group_stall_report_renders_without_script_errors_and_names_the_findings(group_stall, tmp_path):
    page = group_stall.out_dir / "report.html"
    dom = rendered_dom(page, tmp_path, screenshot="report-group-stall.png")
    assert not script_errors(dom), script_errors(dom)
    figures = re.search(r"<body[^>]*data-rendered=\"([^\"]*)\"", dom)
    assert figures and figures.group(1) == "6 figures"  # every figure's Plotly.newPlot resolved
    assert dom.count("class=\"main-svg\"") >= 6  # plotly drew them
    text = page_text(dom)
    # the verdict and the stalled group with its culprit
    assert "3 statements were slow only because they waited in thread group 1" in text
    assert "thread group 1" in text and "SELECT BENCHMARK(6895237, SHA2(RAND(), 256))" in text
    # the hidden-slow table lists exactly the flagged exchanges, each with a display filter for both captures
    hidden = group_stall.exchanges[group_stall.exchanges["hidden_slow"].fillna(False)]
    section = page_text(dom.split("id=\"hidden\"", 1)[1].split("</section>", 1)[0])
    for _, row in hidden.iterrows():
        app_filter = f"tcp.port=={row['client'].rsplit(':', 1)[1]} && tcp.port==3306 && frame.number>={row['req_first_frame']}"
        db_filter = f"frame.number>={row['db_req_first_frame']} && frame.number<={row['db_resp_last_frame']}"
        assert app_filter in section and db_filter in section, row["conn_id"]
    assert section.count("frame.number>=") == 2 * len(hidden) == 6
    assert "pcapdecomp analyze captures/group-stall" in text  # the command line, in the method section


def test_display_filter_selects_the_exchange_in_tshark(group_stall):
    """The filter printed for a hidden-slow exchange selects its frames, and tshark sees the same request."""
    row = group_stall.exchanges[group_stall.exchanges["hidden_slow"].fillna(False)].iloc[0]
    from pcapdecomp.evidence import display_filter

    flt = display_filter(row["db_client"], row["server"], row["db_req_first_frame"], row["db_resp_last_frame"])
    proc = subprocess.run(["tshark", "-r", str(CAPTURES / "group-stall" / "db.pcap"), "-Y", f"({flt}) && mysql.query",
                           "-T", "fields", "-e", "frame.number", "-e", "mysql.query"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line.split("\t") for line in proc.stdout.splitlines()]
    assert lines == [[str(row["db_req_first_frame"]), row["sql"]]]


def test_report_is_self_contained(group_stall):
    import plotly.offline

    page = (group_stall.out_dir / "report.html").read_text(encoding="utf-8")
    plotly_js = plotly.offline.get_plotlyjs()
    assert page.count(plotly_js[:400]) == 1  # plotly.js inlined once
    outside = page.replace(plotly_js, "")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", outside, flags=re.I)
    assert not re.search(r"@import|url\(\s*['\"]?https?:", outside, flags=re.I)


def test_report_of_100k_exchanges_stays_bounded(tmp_path):
    """oltp-hogs repeated 40 times, each copy shifted by the recording's span: the timeline keeps every
    hidden-slow and slow-logged exchange, samples the rest down to TIMELINE_POINTS, and the page stays small."""
    res = analyze(CAPTURES / "oltp-hogs", [], None, None, None, None, [], tmp_path / "hogs", quiet=True)
    x = res.exchanges
    span = (x["app_resp_ts"].max() - x["app_req_ts"].min()) + pd.Timedelta(seconds=1)
    copies = []
    for k in range(40):
        c = x.copy()
        for col in ("app_req_ts", "app_resp_ts", "db_req_ts", "db_resp_ts", "req_first_ts", "req_last_ts",
                    "resp_first_ts", "resp_last_ts"):
            c[col] = c[col] + k * span
        copies.append(c)
    big = pd.concat(copies, ignore_index=True)
    assert len(big) >= 100_000
    hidden = int(big["hidden_slow"].fillna(False).sum())
    logged = int(big["in_slow_log"].fillna(False).sum())
    assert hidden == 40 * res.summary["exchanges"]["hidden_slow"] > 0

    specs = figure_specs(res.summary, big, res.groups)
    traces = {t["name"]: t for t in specs["timeline"]["data"]}
    points = sum(len(_values(t["y"])) for t in traces.values())
    assert points <= TIMELINE_POINTS
    assert len(_values(traces["hidden slow"]["y"])) == hidden
    assert len(_values(traces["in the slow log"]["y"])) == logged - int((big["hidden_slow"].fillna(False) & big["in_slow_log"].fillna(False)).sum())
    timed = int(big["server_s"].fillna(big["total_s"]).fillna(big["response_s"]).notna().sum())
    assert len(big) - timed == 40 * 13  # COM_QUIT and COM_STMT_CLOSE have no response, so no time
    assert specs["_timeline_meta"] == {"total": timed, "shown": points, "sampled": True}

    page = render(res.summary, big, res.groups)
    assert len(page.encode()) < 15 * 2**20, len(page)
    assert "sample of the rest" in page
    assert page.count("<tr>") < 1000  # tables are aggregated, not one row per exchange


def _values(v) -> np.ndarray:
    """A trace array from plotly's JSON: a list, or {dtype, bdata} base64 typed array."""
    if isinstance(v, dict) and "bdata" in v:
        import base64

        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
    return np.asarray(v)


@pytest.mark.parametrize("case", ["db-only", "app-only", "no-slow-log", "no-thread-pool-size", "no-exchanges"])
def test_report_says_what_is_missing(tmp_path, case):
    gs = CAPTURES / "group-stall"
    kwargs = dict(set_dir=None, app=[], db=None, slow_log=None, long_query_time=1.0, thread_pool_size=2,
                  servers=[], out_dir=tmp_path / case, quiet=True)
    if case == "db-only":
        kwargs.update(db=gs / "db.pcap", slow_log=gs / "slow.log")
    elif case == "app-only":
        kwargs.update(app=[gs / "app.pcap"])
    elif case == "no-slow-log":
        kwargs.update(app=[gs / "app.pcap"], db=gs / "db.pcap")
    elif case == "no-thread-pool-size":
        kwargs.update(app=[gs / "app.pcap"], db=gs / "db.pcap", slow_log=gs / "slow.log", thread_pool_size=None)
    else:
        kwargs.update(db=gs / "db.pcap", servers=["10.213.77.2:9999"])  # a server that is not in the capture
    res = analyze(**kwargs)
    page = (res.out_dir / "report.html").read_text(encoding="utf-8")
    text = page_text(page)
    if case == "db-only":
        assert "app captures none" in text and "3 statements were slow only because they waited" in text
        assert "not estimated" in text  # clock
    elif case == "app-only":
        assert "DB capture none" in text and "No exchange was seen at both points" in text
        assert "Hidden-slow statements None" in text or "hidden slow not decided" in text
    elif case == "no-slow-log":
        assert "slow log none" in text
        # without a slow log, MariaDB's SERVER_QUERY_WAS_SLOW flag still tells the 3 hidden probes apart
        assert "3 statements were slow only because they waited" in text
    elif case == "no-thread-pool-size":
        assert "no per-group view" in text
    else:
        assert len(res.exchanges) == 0 and "nothing to show" in text
    specs = json.loads(re.search(r"var specs = (\{.*?\});\n", page, flags=re.S).group(1))
    assert all(v is None or "data" in v for k, v in specs.items() if not k.startswith("_"))


def test_db_only_report_renders_in_chromium(tmp_path):
    gs = CAPTURES / "group-stall"
    res = analyze(None, [], gs / "db.pcap", gs / "slow.log", 1.0, 2, [], tmp_path / "db-only", quiet=True)
    dom = rendered_dom(res.out_dir / "report.html", tmp_path)
    assert not script_errors(dom), script_errors(dom)
    rendered = re.search(r"<body[^>]*data-rendered=\"([^\"]*)\"", dom).group(1)
    drawn = sum(1 for k, v in figure_specs(res.summary, res.exchanges, res.groups).items()
                if v is not None and not k.startswith("_"))
    assert rendered == f"{drawn} figures" and drawn >= 4
