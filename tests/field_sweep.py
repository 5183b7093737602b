"""The field sweep: `analyze` on every capture the project has — the bundled recordings, tests/data, and the
public corpus (../shared/corpus) — each as --db alone, as --app alone and as both points, plus the degenerate
shapes of tests/data/field and the bundled capture-set folders. Whatever the capture, the run ends with a report,
both tables and a summary.json that agree with each other. In-process (one `analyze` call per case, --jobs 1).

The cases are split over test files by what they read (tests/test_field.py: the project's own captures;
tests/test_field_corpus_{db,app,both}.py: the corpus in one mode each) so that the suite's workers, which take a
test file each, share the sweep."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from browser import without_blocks
from corpus import CORPUS
from corpus import captures as corpus_captures

from pcapdecomp.analysis import Options, analyze, capture_set
from pcapdecomp.core.outputs import INCOMPLETE_NAME, STAGING_PREFIX

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
FIELD = REPO / "tests" / "data" / "field"

# Where one capture given as both points does not pair every exchange with itself, and why.
SELF_PAIRING_EXCEPTIONS = {
    f"percona-toolkit-tcpdump-text-converted/{name}":
        "one connection's handshake repeated an hour later on the same 4-tuple (same connection id and scramble): "
        "the two copies cannot be told apart by their keys at either point, so they are marked match-ambiguous "
        "(seen = app / db) rather than paired by a guess (pair/match.py)"
    for name in ("tcpdump035.pcap", "tcpdump036.pcap")
}


MODES = ("db", "app", "both")


def ours() -> list:
    """(mode, captures, name, render) of the project's own captures: every bundled and tests/data/field capture in
    each mode, the capture-set folders as they are, and one real app + DB pair; each renders its report."""
    cases = []
    for path, name in [(p, f"captures/{p.parent.name}/{p.name}") for p in sorted(CAPTURES.glob("*/*.pcap"))] + \
            [(p, f"tests/data/field/{p.name}") for p in sorted(FIELD.glob("*.pcap"))]:
        for mode in MODES:
            cases.append(pytest.param(mode, [path], name, True, id=f"{mode}:{name}"))
    for folder in sorted(p.parent for p in CAPTURES.glob("*/capture.toml")):
        cases.append(pytest.param("set", [folder], folder.name, True, id=f"set:{folder.name}"))
    pair = [FIELD / "one-connection-app.pcap", FIELD / "one-connection-db.pcap"]
    cases.append(pytest.param("pair", pair, "one-connection", True, id="pair:tests/data/field/one-connection"))
    return cases


def theirs(mode: str) -> list:
    """(mode, captures, name, render) of the public corpus's captures in `mode`. Every capture runs as both points
    (read at each, paired with itself: the whole path); one point alone, half of them each, in turn: as --db the
    first, third, … and as --app the others. Of the runs one in three renders its report, in turn by mode."""
    k = MODES.index(mode)
    return [pytest.param(mode, [CORPUS / r["path"]], r["path"], (i + k) % len(MODES) == 0, id=f"{mode}:{r['path']}")
            for i, r in enumerate(corpus_captures()) if mode == "both" or i % 2 == k]


def _strict_json(text: str) -> dict:
    def refuse(name):
        raise ValueError(f"summary.json holds {name}, which is not JSON")

    return json.loads(text, parse_constant=refuse)


def _page_text(page: str) -> str:
    page = without_blocks(page, ("script", "style"))
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def check(tmp_path, monkeypatch, bundled_analysis, mode, paths, name, render):
    """One case of the sweep: analyze, then the outputs against each other."""
    out = tmp_path / "out"
    if not render:
        import pcapdecomp.run.session

        monkeypatch.setattr(pcapdecomp.run.session, "render_page", lambda *a, **k: "<!doctype html><html></html>")
    if mode == "set":  # a bundled set as it is: the run's shared analysis (tests/conftest.py), only read here
        result = bundled_analysis(name)
        out = result.out_dir
    else:
        if mode == "pair":
            cs = capture_set(app=[paths[0]], db=paths[1])
        else:
            cs = capture_set(app=paths if mode in ("app", "both") else [],
                             db=paths[0] if mode in ("db", "both") else None)
        result = analyze(cs, Options(quiet=True, jobs=1), out)

    names = {p.name for p in out.iterdir()}
    assert {"report.html", "exchanges.parquet", "groups.parquet", "summary.json"} <= names
    assert INCOMPLETE_NAME not in names and not any(n.startswith(STAGING_PREFIX) for n in names)
    summary = _strict_json((out / "summary.json").read_text(encoding="utf-8"))
    x = pd.read_parquet(out / "exchanges.parquet")
    groups = pd.read_parquet(out / "groups.parquet")

    # summary.json's counts are the table's rows
    counts, match = summary["exchanges"], summary["match"]
    seen = x["seen"].value_counts()
    assert counts["total"] == len(x) == len(result.exchanges)
    assert (counts["seen_both"], counts["seen_app"], counts["seen_db"]) == (
        seen.get("both", 0), seen.get("app", 0), seen.get("db", 0))
    assert (match["matched"], match["app_only"], match["db_only"]) == (
        counts["seen_both"], counts["seen_app"], counts["seen_db"])
    assert counts["hidden_slow"] == int(x["hidden_slow"].fillna(False).sum())
    assert counts["in_slow_log"] == int(x["in_slow_log"].fillna(False).sum())
    assert counts["server_flag_slow"] == int(x["server_flag_slow"].fillna(False).sum())
    # how a wait is known is said exactly where there is a wait (core/schema.py: queue_source is null when queue_s is)
    assert (x["queue_source"].isna() == x["queue_s"].isna()).all()
    for col, key in (("total_s", "total"), ("server_s", "server"), ("queue_s", "queue"), ("exec_s", "exec")):
        stat = summary["latency_s"][key]
        assert (stat["count"] if stat else 0) == int(x[col].notna().sum()), col
    # … and the captures' own counts: every exchange read is in the table once, at one point or paired
    apps, db = summary["captures"]["app"], summary["captures"]["db"]
    assert match["app_exchanges"] == sum(q["exchanges"] for q in apps) == counts["seen_both"] + counts["seen_app"]
    assert match["db_exchanges"] == (db["exchanges"] if db else 0) == counts["seen_both"] + counts["seen_db"]
    for q in apps + ([db] if db else []):
        assert q["frames"] == (q["frames_tcp"] + q["frames_non_ip"] + q["frames_non_tcp"] + q["frames_ip_fragment"]
                               + q["frames_undecodable"] + q["frames_unknown_link"])
        assert q["frames_tcp"] == q["frames_tcp_mysql"] + q["frames_tcp_other"]
        if q["mysql_connections"] == 0 and q["exchanges"] == 0:
            assert any("no MySQL traffic found" in w for w in summary["warnings"])

    # the points: one capture at one point is seen there only; the same capture at both points pairs itself
    if mode == "db":
        assert set(x["seen"]) <= {"db"}
    elif mode == "app":
        assert set(x["seen"]) <= {"app"}
    elif mode == "both" and name not in SELF_PAIRING_EXCEPTIONS:
        assert set(x["seen"]) <= {"both"}, SELF_PAIRING_EXCEPTIONS.get(name)
        clock = summary["clock"]
        if clock and clock["offset_s"] is not None:
            assert clock["offset_s"] == 0 and clock["skew_ppm"] == 0
    if mode == "both":
        # a capture given at both points has no network between them: total time is server time
        both = x[x["seen"] == "both"].dropna(subset=["total_s", "server_s"])
        assert (both["total_s"] - both["server_s"]).abs().max() < 1e-6 if len(both) else True

    # groups exist only with a thread-pool size (given, or inferred from the capture), and only for its groups
    tps = summary["thread_pool_size"]["value"]
    assert summary["inputs"]["thread_pool_size"] in (None, tps)
    if tps is None:
        assert len(groups) == 0
    else:
        assert set(groups["thread_group"]) <= set(range(tps))

    # the report is a whole page that says what summary.json says
    page = (out / "report.html").read_text(encoding="utf-8")
    doctype = "<!doctype html>"  # compared without lowering the whole page: megabytes of inlined script
    assert page.lstrip()[:len(doctype)].lower() == doctype and page.rstrip().endswith("</html>")
    if render:
        # the verdict's sentence and each of its bullets (the page sets them apart: compared without white space)
        text = "".join(_page_text(page).split())
        for said in [summary["story"]["sentence"], *(b["text"] for b in summary["story"]["bullets"])]:
            assert "".join(said.split()) in text
