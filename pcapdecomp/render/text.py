"""The verdict, the playbook and the query profile for a terminal (plain text, at most 100 columns) and for a ticket
(Markdown): what `pcapdecomp report --format text|md` prints.

The text layout follows pt-query-digest's report, which a DBA reads without thinking: a profile table of the top
classes (rank, Query ID, time, share, calls, R/Call, …), then per class a block with its attributes and its
time distribution in log-scale buckets. Every text from a capture or a log is attacker-controlled: on the terminal
control characters (C0, DEL and C1, which terminals read as escape sequences) are shown as \\xNN (`term`), in
Markdown every character that could be markup is escaped (evidence.md_text / md_code)."""

from __future__ import annotations

import re

import pandas as pd

from ..core.console import terminal_text
from ..core.formats import MISSING, clip, count, is_missing, seconds, share
from ..explain.waitprofile import HISTOGRAM_LABELS
from .evidence import md_code, md_text

WIDTH = 100  # the terminal text fits this many columns
BAR = 50  # the longest histogram bar, in characters

_ORDER_WORDS = {"client": "the clients' time (A4 − A1)", "server": "the server's time (D4 − D1)",
                "exec": "execution (slow log's Query_time, else estimated)"}


def term(text, limit: int | None = None) -> str:
    """Text from anywhere, safe on a terminal (console.terminal_text), on one line, clipped to `limit`."""
    shown = " ".join(terminal_text(text, lines=True).split())
    return clip(shown, limit) if limit else shown


def text(summary: dict, prof: pd.DataFrame, order_by: str, playbook: list[dict], top: int) -> str:
    """The terminal report: set, verdict, playbook, profile table, then a block per listed class."""
    out = [f"# pcapdecomp report: {term(summary.get('set'), 60)}", ""]
    out += _wrapped(summary.get("verdict") or "", "")
    warnings = summary.get("warnings") or []
    if warnings:  # what the numbers rest on (frames lost, a setting not known, a point that paired nothing…)
        out += ["", f"# Warnings ({len(warnings)}): what the numbers above rest on"]
        for w in warnings:
            out += _wrapped(f"- {w}", "")
    out += ["", "# What to change"]
    if playbook:
        for line in playbook:
            out += _wrapped(line["text"], "- ")
            if line.get("sql"):
                out.append(f"    {term(line['sql'], WIDTH - 4)}")
    else:
        out.append("- nothing: no finding of this capture points at a server setting")
    hosts = network_hosts(summary)
    if hosts:
        out += ["", "# Network by client host (A4 − A1 − (D4 − D1), exchanges seen at both points)",
                f"{'Host':<40} {'Exchanges':>9} {'Network':>10} {'of network':>10} {'of its time':>11}"]
        out += [f"{term(h['host'], 40):<40} {h['exchanges']:>9,} {seconds(h['network_s']):>10} "
                f"{share(h['share_of_network']):>10} {share(h['network_share_of_its_time']):>11}" for h in hosts]
    out += ["", f"# Profile, ranked by {_ORDER_WORDS[order_by]}; p95/p99 by nearest rank"]
    out += _profile_table(prof.head(top))
    for _, r in prof.head(top).iterrows():
        out += [""] + _class_block(r, order_by)
    rest = len(prof) - min(top, len(prof))
    if rest > 0:
        out += ["", f"# {rest} more classes (--top to list them)"]
    return "\n".join(line.rstrip() for line in out) + "\n"


def network_hosts(summary: dict) -> list[dict]:
    """summary.json → network's hosts when network is worth a table: 10 % of the clients' time or more."""
    net = summary.get("network") or {}
    return list(net.get("hosts") or []) if (net.get("share") or 0) >= 0.1 else []


def _wrapped(paragraphs: str, bullet: str) -> list[str]:
    """Lines of at most WIDTH columns; the verdict's '- ' bullets keep their hanging indent."""
    import textwrap

    out = []
    for para in str(paragraphs).split("\n"):
        lead = bullet
        body = para
        if para.startswith("- "):
            lead, body = "- ", para[2:]
        out += textwrap.wrap(term(body), WIDTH, initial_indent=lead, subsequent_indent=" " * len(lead),
                             break_on_hyphens=False) or [""]
    return out


_TABLE = (("Rank", 4, ">"), ("Query ID", 14, "<"), ("Time", 9, ">"), ("Share", 6, ">"), ("Calls", 6, ">"),
          ("R/Call", 9, ">"), ("p99", 9, ">"), ("Exec", 9, ">"), ("Queue", 9, ">"))
_VERB = re.compile(r"\s*([a-z]+)")
_TABLES = re.compile(r"\b(?:from|into|update|join|table)\s+((?:`[^`]+`|[\w$.?]+)(?:\s*,\s*(?:`[^`]+`|[\w$.?]+))*)",
                     re.IGNORECASE)


def distill(fingerprint) -> str:
    """pt-query-digest's "Item": the statement's verb and the tables it names (SELECT sbtest1), from a fingerprint."""
    if is_missing(fingerprint):
        return MISSING
    text = str(fingerprint)
    verb = _VERB.match(text)
    if verb is None or text.startswith(("administrator", "call ")):
        return text
    tables = []
    for group in _TABLES.findall(text):
        for name in group.split(","):
            name = name.strip()
            if name and name not in tables and name != "?":
                tables.append(name)
    return " ".join([verb.group(1).upper(), *tables])


def _row_cells(r) -> list[str]:
    qid = "" if is_missing(r["query_id"]) else str(r["query_id"])
    return [str(int(r["rank"])), term(qid.removeprefix("0x")[:12] + "…" if len(qid) > 14 else qid or MISSING, 14),
            seconds(r["time_sum"]), share(r["time_share"]).replace(" %", "%"), count(r["calls"]),
            seconds(r["r_call"]), seconds(r["p99"]), seconds(r["exec_sum"]),
            seconds(r["queue_certain_sum"] + r["queue_likely_sum"] + r["queue_estimated_sum"])]


def _profile_table(prof: pd.DataFrame) -> list[str]:
    used = sum(w for _, w, _ in _TABLE) + len(_TABLE)
    item = WIDTH - used

    def line(cells: list[str], last: str) -> str:
        parts = [f"{c:{a}{w}}" for c, (_, w, a) in zip(cells, _TABLE)]
        return " ".join(parts) + " " + last

    out = [line([h for h, _, _ in _TABLE], "Item"), line(["=" * w for _, w, _ in _TABLE], "=" * item)]
    for _, r in prof.iterrows():
        out.append(line(_row_cells(r), term(distill(r["fingerprint"]), item)))
    return out


def _class_block(r, order_by: str) -> list[str]:
    """pt-query-digest's per-query report, with the wire, the split and the queueing beside execution."""
    qid = MISSING if is_missing(r["query_id"]) else r["query_id"]
    head = f"# Query {int(r['rank'])}: ID {term(qid, 40)}, {count(r['calls'])} calls: {term(distill(r['fingerprint']), 40)}"
    out = [head]
    kv = [
        ("time", f"{seconds(r['time_sum'])} ({share(r['time_share'])}), R/Call {seconds(r['r_call'])}, p95 "
                 f"{seconds(r['p95'])}, p99 {seconds(r['p99'])}, max {seconds(r['max'])}"),
        ("wire", f"client {seconds(r['wire_sum'])}, server {seconds(r['server_sum'])}, network "
                 f"{seconds(r['network_sum'])}"),
        ("execution", f"{seconds(r['exec_sum'])}, {share(r['exec_measured'])} of the calls measured in the slow log"
                      + (f", {count(r['exec_bounded'])} bounded only (< long_query_time)" if r["exec_bounded"]
                         else "")),
        ("queueing", f"{seconds(r['queue_certain_sum'])} certain, {seconds(r['queue_likely_sum'])} likely, "
                     f"{seconds(r['queue_estimated_sum'])} estimated"),
        ("slow log", _slow_words(r)),
        ("hosts", (term(r["hosts"], 60) or MISSING) + (f" and {r['hosts_more']} more" if r["hosts_more"] else "")),
    ]
    out += [f"#   {k:<10} {term(v, WIDTH - 15)}" for k, v in kv]
    out.append(f"#   {_ORDER_WORDS[order_by].split(' (')[0]} distribution")
    hist = list(r["histogram"])
    peak = max(hist) if hist and max(hist) > 0 else 1
    for label, n in zip(HISTOGRAM_LABELS, hist):
        bar = "#" * (max(1, round(BAR * n / peak)) if n else 0)
        out.append(f"#   {label:>6} {bar} {n if n else ''}".rstrip())
    out.append("#   " + term(r["fingerprint"] if is_missing(r["sample"]) else r["sample"], WIDTH - 4))
    return out


def _slow_words(r) -> str:
    if not r["logged"]:
        return "no call logged"
    rows = "?" if is_missing(r["rows_examined_sum"]) else f"{int(r['rows_examined_sum']):,}"
    lock = seconds(r["lock_time_sum"])
    return f"{count(r['logged'])} calls logged: Rows_examined {rows}, Lock_time {lock}"


def markdown(summary: dict, prof: pd.DataFrame, order_by: str, playbook: list[dict], top: int) -> str:
    """The same for a ticket: the verdict as prose and bullets, the playbook, the profile as a Markdown table."""
    out = [f"## pcapdecomp: {md_text(summary.get('set'))}", ""]
    for para in str(summary.get("verdict") or "").split("\n"):
        out.append(f"- {md_text(para[2:])}" if para.startswith("- ") else md_text(para, line_start=True))
    warnings = summary.get("warnings") or []
    if warnings:
        out += ["", f"### Warnings ({len(warnings)}): what the numbers above rest on", ""]
        out += [f"- {md_text(w)}" for w in warnings]
    out += ["", "### What to change", ""]
    if playbook:
        for line in playbook:
            out.append(f"- {md_text(line['text'])}" + (f" {md_code(line['sql'], 400)}" if line.get("sql") else ""))
    else:
        out.append("- nothing: no finding of this capture points at a server setting")
    hosts = network_hosts(summary)
    if hosts:
        out += ["", "### Network by client host", "", "| Host | Exchanges | Network | of network | of its time |",
                "|---|---:|---:|---:|---:|"]
        out += [f"| {md_text(h['host'])} | {h['exchanges']:,} | {seconds(h['network_s'])} | "
                f"{share(h['share_of_network'])} | {share(h['network_share_of_its_time'])} |" for h in hosts]
    out += ["", f"### Profile, ranked by {md_text(_ORDER_WORDS[order_by])}", "",
            "| Rank | Query ID | Time | Share | Calls | R/Call | p95 | p99 | Max | Exec | Queue certain | Queue likely "
            "| Queue estimated | Rows_examined | Lock_time | Hosts | Item |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for _, r in prof.head(top).iterrows():
        rows = MISSING if is_missing(r["rows_examined_sum"]) else f"{int(r['rows_examined_sum']):,}"
        cells = [str(int(r["rank"])), md_code(MISSING if is_missing(r["query_id"]) else r["query_id"]), seconds(r["time_sum"]),
                 share(r["time_share"]), count(r["calls"]), seconds(r["r_call"]), seconds(r["p95"]),
                 seconds(r["p99"]), seconds(r["max"]), seconds(r["exec_sum"]), seconds(r["queue_certain_sum"]),
                 seconds(r["queue_likely_sum"]), seconds(r["queue_estimated_sum"]), rows, seconds(r["lock_time_sum"]),
                 md_text(r["hosts"] or MISSING) + (f" +{r['hosts_more']}" if r["hosts_more"] else ""),
                 md_code(distill(r["fingerprint"]), 80)]
        out.append("| " + " | ".join(cells) + " |")
    rest = len(prof) - min(top, len(prof))
    if rest > 0:
        out += ["", f"{rest} more classes not listed."]
    return "\n".join(out) + "\n"
