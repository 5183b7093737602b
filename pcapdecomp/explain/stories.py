"""The stories beside the thread pool's, told into summary.json in one place: the connection story
(connstory), the network story (netstory) and the playbook (what to change, from the server's settings).

The thread pool's verdict (verdict.tell) keeps its sentence unless one of these is bigger for the clients: network
took half their time or more, or setting connections up cost them more than their statements did, or
max_connections refused logins (ERR 1040), while the pool told no story of its own; then that leads and the pool's sentence follows as the first bullet (topic db)."""

from __future__ import annotations

import pandas as pd

from . import connstory, netstory
from .playbook import lines as playbook_lines
from .playbook import settings_beside

POOL_STORIES = ("proxy_queue", "max_threads", "group_stall", "queueing_unexplained")


def tell(summary: dict, x: pd.DataFrame | None, conns: pd.DataFrame | None, settings: dict | None = None,
         runs=None) -> dict:
    """Adds connections, network and playbook to `summary` and their bullets to its story and verdict. conns: the
    connections tables of the capture points (app and DB), concatenated; settings: the server's (--server-vars),
    else capture.toml's beside the captures. `runs`: instead of the table `x`, the partitions' runs
    (explain.summaryruns.SummaryOfRuns, fed), which tell the same from them. Returns `summary`."""
    connections = runs.connections(conns) if runs is not None else connstory.tell(x, conns)
    network = runs.network(conns) if runs is not None else netstory.tell(x, conns)
    summary["connections"] = connections
    summary["network"] = network
    story = dict(summary.get("story") or {"sentence": summary.get("verdict", ""), "findings": [], "bullets": []})
    old_lines = str(summary.get("verdict") or "").split("\n")
    # lines before the story's sentence (how much TLS traffic could be read) and after its bullets (other servers')
    at = old_lines.index(story["sentence"]) if story.get("sentence") in old_lines else 0
    head, extra = old_lines[:at], old_lines[at + 1 + len(story.get("bullets") or []):]
    lead, net_bullets, net_findings = netstory.bullets(network)
    conn_bullets, conn_findings = connstory.bullets(connections)
    findings = list(story.get("findings") or [])
    bullets = list(story.get("bullets") or [])
    pool_told = any(f in findings for f in POOL_STORIES)
    if lead is None and "connection_churn" in conn_findings and not pool_told and connections and (
            connections["setup_sum_s"] >= connections["statements_sum_s"]):
        lead = conn_bullets[0]["text"]
        conn_bullets = conn_bullets[1:]
        findings.insert(0, "connection_churn")
        conn_findings = [f for f in conn_findings if f != "connection_churn"]
    elif lead is None and "refused" in conn_findings and not pool_told:
        # clients turned away at login matter more than statements that did not wait
        refusal = next(b for b in conn_bullets if "ERR 1040" in b["text"])
        lead = refusal["text"]
        conn_bullets = [b for b in conn_bullets if b is not refusal]
        findings.insert(0, "refused")
        conn_findings = [f for f in conn_findings if f != "refused"]
    elif lead is not None:
        findings.insert(0, net_findings.pop(0))
    if lead is not None:
        bullets.insert(0, {"topic": "db", "text": f"On the DB: {story.get('sentence', '')}"})
        story["sentence"] = lead
    # the connection and network findings come right after the sentence's own details
    at = 1 if lead is not None else 0
    at += sum(1 for b in bullets[at:] if b.get("topic") in ("cap", "stall", "proxy"))
    bullets[at:at] = [*conn_bullets, *net_bullets]
    findings += [f for f in (*conn_findings, *net_findings) if f not in findings]
    story.update(findings=findings, bullets=bullets)
    summary["story"] = story
    summary["verdict"] = "\n".join([*head, story["sentence"], *(f"- {b['text']}" for b in bullets), *extra])
    summary["playbook"] = playbook_lines(summary, x, settings if settings is not None else settings_beside(summary),
                                         runs.usual_execution if runs is not None else None)
