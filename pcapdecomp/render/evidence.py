"""Ticket evidence: the packets of chosen exchanges, per capture point, with a note of what they show.

`export(analysis_dir, …)` reads what `pcapdecomp analyze` wrote (exchanges.parquet, summary.json), selects
exchanges (by default the victims — hidden-slow statements and those the slow log understates — with the culprits
of their stalls and, when the pool was at its thread limit, the statements holding the threads), and writes one
small pcapng per capture point holding just their frames (original bytes, link types and nanosecond timestamps; a
comment on each exchange's first request frame and last response frame), a summary.md and the selected rows as
exchanges.csv. The folder is written as a set: into a temporary folder renamed into place, so an interrupted run
never leaves files of two runs side by side.

Every text from a capture or a log is attacker-controlled: summary.md escapes it for Markdown (`md_text`,
`md_code`), the CSV is written by outputs.write_table."""

from __future__ import annotations

import os
import re
import shlex
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .. import __version__
from ..core.endpoints import split_endpoint
from ..core.errors import InputError, UsageError
from ..core.formats import as_text, clip, clock, is_missing, seconds_ms
from ..core.outputs import INCOMPLETE_NAME, staged_folder, write_table
from ..mysql.tls import keylog_text

DEFAULT_TOP = 10


def display_filter(client: str, server: str, first_frame: int, last_frame: int) -> str:
    """A Wireshark/tshark display filter selecting one exchange's frames (both directions) in one capture.

    client and server are "ip:port" / "[ip6]:port" as in the exchanges table; the frame range is the exchange's
    request-first … response-last frame numbers in that capture (1-based, as Wireshark numbers them)."""
    ci, cp = split_endpoint(client)
    si, sp = split_endpoint(server)
    kind = "ipv6" if ":" in ci else "ip"
    return (f"{kind}.addr=={ci} && {kind}.addr=={si} && tcp.port=={cp} && tcp.port=={sp}"
            f" && frame.number>={int(first_frame)} && frame.number<={int(last_frame)}")


@dataclass
class Span:
    """One exchange's frames in one capture: its TCP connection and the frame range it occupies."""

    row: int  # index into the selected rows
    flow: frozenset  # {(ip, port), (ip, port)}
    first: int
    last: int
    client: str
    server: str


@dataclass
class EvidenceResult:
    out_dir: Path
    rows: pd.DataFrame
    how: str  # how the rows were selected, in words
    files: dict[str, Path] = field(default_factory=dict)  # capture path -> evidence pcapng
    frames: dict[str, int] = field(default_factory=dict)  # capture path -> frames written
    written: list[Path] = field(default_factory=list)


# ------------------------------------------------------------------ selection


def load_analysis(analysis_dir: Path) -> tuple[pd.DataFrame, dict]:
    if not analysis_dir.exists():
        raise InputError(f"{analysis_dir}: no such folder")
    if not analysis_dir.is_dir():
        raise InputError(f"{analysis_dir}: not a folder (give the output folder of `pcapdecomp analyze`)")
    if (analysis_dir / INCOMPLETE_NAME).exists():
        raise InputError(f"{analysis_dir}: an analyze run stopped while writing here ({INCOMPLETE_NAME}); run "
                         "`pcapdecomp analyze` again")
    table, summary = analysis_dir / "exchanges.parquet", analysis_dir / "summary.json"
    if not table.is_file() or not summary.is_file():
        raise InputError(f"{analysis_dir}: no exchanges.parquet and summary.json here: run `pcapdecomp analyze` first")
    from ..core.readback import read_summary, read_table

    summary_dict = read_summary(summary)
    return read_table(table), summary_dict


def select(x: pd.DataFrame, query_ids: list[str], conn_ids: list[int], top: int | None,
           summary: dict | None = None) -> tuple[pd.DataFrame, str]:
    """The union of --query-id and --conn-id matches (else, when the story is a proxy's queue, the longest waits
    inside the proxy; else the victims: hidden-slow and understated statements, else the slowest), then --top, then the culprits of the selected victims' stalls (and, for statements that
    waited for a thread at the pool's limit, the statements holding the threads). Rows get `evidence_role`:
    victim | culprit | selected."""
    if top is not None and top < 1:
        raise UsageError(f"--top must be ≥ 1, got {top}")
    slowness = x["server_s"].fillna(x["total_s"]).fillna(x["response_s"])
    victims = _flag(x, "hidden_slow") | _flag(x, "understated")
    if query_ids or conn_ids:
        wanted = {q.upper().removeprefix("0X") for q in query_ids}
        qid = x["query_id"].astype("string").fillna("").str.upper().str.removeprefix("0X")
        mask = qid.isin(wanted) | x["conn_id"].isin(conn_ids)
        how = " or ".join(filter(None, [f"query id {', '.join(query_ids)}" if query_ids else "",
                                        f"connection {', '.join(map(str, conn_ids))}" if conn_ids else ""]))
        if not mask.any():
            raise UsageError(f"no exchange matches {how}")
    elif "proxy_queue" in ((summary or {}).get("story") or {}).get("findings", []):
        # the time went inside a proxy: the statements that waited longest there, paired across it (their
        # packets at the app and at the DB show both ends of the wait)
        wait = x["proxy_wait_s"] if "proxy_wait_s" in x.columns else pd.Series(np.nan, index=x.index)
        mask, how = wait.notna() & (wait > 0), "the statements that waited longest inside the proxy"
        slowness = wait
        top = top or DEFAULT_TOP
    elif victims.any():
        kinds = [k for k, col in (("hidden-slow", "hidden_slow"), ("understated", "understated")) if _flag(x, col).any()]
        mask, how = victims, "the " + " and ".join(kinds) + " exchanges"
    else:
        mask, how = slowness.notna(), "no hidden-slow or understated exchange: the slowest exchanges"
        top = top or DEFAULT_TOP
    rows = x[mask].assign(_slow=slowness[mask]).sort_values("_slow", ascending=False)
    if top is not None and len(rows) > top:
        rows, how = rows.head(top), f"{how}, the {top} slowest"
    chosen = rows.index
    extra = _culprits_of(x, chosen, summary or {})
    if len(extra.difference(chosen)):
        how += " with their culprits"
    keep = chosen.union(extra)
    out = x.loc[keep].copy()
    culprit = out.index.isin(extra) | (_text(out, "stall_role") == "culprit")
    out["evidence_role"] = np.where(victims.loc[keep].to_numpy(), "victim", np.where(culprit, "culprit", "selected"))
    order = ["app_req_ts", "db_req_ts", "req_first_ts"]
    return out.sort_values(order).reset_index(drop=True), how


def _text(x: pd.DataFrame, col: str) -> np.ndarray:
    """A text column as an object array, "" where null (pandas' NA does not compare)."""
    return x[col].astype("string").fillna("").to_numpy(dtype=object) if col in x.columns else np.full(len(x), "", object)


def _flag(x: pd.DataFrame, col: str) -> pd.Series:
    if col not in x.columns:
        return pd.Series(False, index=x.index)
    return x[col].fillna(False).astype(bool)


def _culprits_of(x: pd.DataFrame, chosen: pd.Index, summary: dict) -> pd.Index:
    """Rows that held the chosen victims: the culprits of their stalls, and the statements executing at the
    thread limit when a chosen row waited for a thread."""
    out = pd.Index([])
    if "stall" in x.columns and "stall_role" in x.columns:
        sel = x.loc[chosen]
        stalls = set(sel.loc[(sel["stall_role"] == "victim").fillna(False), "stall"].dropna().astype(int))
        if stalls:
            out = out.union(x.index[(x["stall_role"] == "culprit").fillna(False) & x["stall"].isin(stalls)])
    cap = ((summary.get("pool") or {}).get("cap")) or {}
    if cap:
        key = list(zip(x["capture"].astype(str), x["conn_index"], x["seq"]))
        where = {k: i for k, i in zip(key, x.index)}
        waiting = {where.get((r["capture"], r["conn_index"], r["seq"])) for r in cap.get("waiting_refs", [])}
        if waiting & set(chosen):
            out = out.union(pd.Index([where[k] for k in ((r["capture"], r["conn_index"], r["seq"])
                                                         for r in cap.get("executing", [])) if k in where]))
    return out


def spans(rows: pd.DataFrame, summary: dict) -> dict[str, list[Span]]:
    """capture path -> the selected exchanges' frame spans in it (app side from the foundation columns, DB side
    from the db_* columns; rows seen only at the DB carry DB frames in the foundation columns)."""
    out: dict[str, list[Span]] = {}

    def add(path, client, server, first, last, i):
        if path is None or pd.isna(first) or pd.isna(last) or pd.isna(client):
            return
        c, s = split_endpoint(str(client)), split_endpoint(str(server))
        if tls:  # Wireshark decrypts a record only after the handshake and every record before it: from the start
            first = 0
        out.setdefault(str(path), []).append(Span(i, frozenset((c, s)), int(first), int(last), str(client), str(server)))

    for i, r in enumerate(rows.itertuples(index=False)):
        tls = bool(getattr(r, "tls", False)) if pd.notna(getattr(r, "tls", False)) else False
        point = getattr(r, "db_point", None)  # several DB points: the row's own server's capture
        db_file = point if isinstance(point, str) and point else summary["inputs"]["db"]
        last_app = r.resp_last_frame if pd.notna(r.resp_last_frame) else r.req_last_frame
        if r.seen in ("both", "app"):
            add(r.capture, r.client, r.server, r.req_first_frame, last_app, i)
        if r.seen == "db":
            add(db_file, r.client, r.server, r.req_first_frame, last_app, i)
        elif r.seen == "both":
            # no response (COM_QUIT, SEND_LONG_DATA): the request's first frame stands for the exchange
            last_db = r.db_resp_last_frame if pd.notna(r.db_resp_last_frame) else r.db_req_first_frame
            add(db_file, r.db_client, _db_server(summary, db_file, r.server), r.db_req_first_frame, last_db, i)
    return out


def _db_server(summary: dict, db_file: str, server: str) -> str:
    """The server's endpoint as the DB capture saw it. The app's `server` is it, except through a proxy: there the
    app talks to the proxy's address, and the DB capture holds the proxy's connections to the DB point's server."""
    if not summary.get("proxy"):
        return server
    point = next((p for p in summary.get("points") or [] if p.get("name") == db_file), {})
    servers = point.get("servers") or ((summary["proxy"].get("sides") or {}).get("back_servers") or [])
    return servers[0] if len(servers) == 1 else server


# ------------------------------------------------------------------ export


def export(analysis_dir: Path, query_ids: list[str] | None = None, conn_ids: list[int] | None = None,
           top: int | None = None, out_dir: Path | None = None) -> EvidenceResult:
    x, summary = load_analysis(analysis_dir)
    rows, how = select(x, list(query_ids or []), list(conn_ids or []), top, summary)
    out = out_dir if out_dir is not None else analysis_dir / "evidence"
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder")
    per_capture = spans(rows, summary)
    cwd = Path(summary["inputs"].get("cwd") or ".")
    sources = {}
    points = {p["name"]: p for p in summary.get("points", [])}
    for path in per_capture:
        src = Path(path) if Path(path).is_absolute() else cwd / path
        files = [f["file"] for f in points.get(path, {}).get("files", []) if not f.get("skipped")]
        if len(files) > 1:  # a capture point of several files: read as one stream, frames numbered through it
            from ..read.sources import CapturePoint

            files = [str(Path(f) if Path(f).is_absolute() else cwd / f) for f in files]
            lost = next((f for f in files if not Path(f).is_file()), None)
            if lost is not None:
                raise InputError(f"{lost}: capture file named in {analysis_dir / 'summary.json'} not found")
            src = CapturePoint(points[path]["kind"], str(src), tuple(files))
        elif not src.is_file():
            raise InputError(f"{src}: capture named in {analysis_dir / 'summary.json'} not found")
        sources[path] = src
    names = _file_names(per_capture, summary)
    result = EvidenceResult(out, rows, how)
    secrets = None
    if "tls" in rows.columns and rows["tls"].fillna(False).astype(bool).any():
        from ..read.tlskeys import load_secrets

        keylogs = [Path(k) if Path(k).is_absolute() else cwd / k for k in summary["inputs"].get("tls_keylogs") or []]
        secrets = load_secrets([k for k in keylogs if k.is_file()], list(sources.values()))
    with staged_folder(out, [*names.values(), "exchanges.csv", "summary.md"]) as tmp:  # outputs.OutputFolder's rule
        for path, sp in per_capture.items():
            with open(tmp / names[path], "wb") as f:
                result.frames[path] = _copy_frames(sources[path], sp, rows, f, secrets)
            result.files[path] = out / names[path]
        write_table(_relative_paths(rows, summary), tmp / "exchanges.csv")
        (tmp / "summary.md").write_text(summary_md(result, summary, x), encoding="utf-8")
    result.written = [*result.files.values(), out / "exchanges.csv", out / "summary.md"]
    return result


def _relative_paths(rows: pd.DataFrame, summary: dict) -> pd.DataFrame:
    """The rows with their capture paths (capture, db_point) as summary.md shows them: relative to the folder the
    inputs share (app.pcap, hostA/app.pcap), not this machine's folders."""
    inputs = summary["inputs"]
    files = [*inputs["app"], *(inputs.get("dbs") or [inputs["db"]] if inputs["db"] else []), *(inputs.get("proxy") or [])]
    shown = display_paths([str(f) for f in files if f])
    out = rows.copy()
    for col in ("capture", "db_point"):
        if col in out.columns:
            out[col] = out[col].astype(object).map(lambda v: shown.get(v, v) if isinstance(v, str) else v)
    return out


def _file_names(per_capture: dict, summary: dict) -> dict[str, str]:
    """One distinct evidence file name per capture: db.pcapng, app.pcapng, app-<stem>.pcapng; two app captures with
    the same file name in different folders get their folders in the name, never the same file."""
    shown = display_paths([*per_capture])
    names: dict[str, str] = {}
    taken: set[str] = set()
    for path in per_capture:
        role = "db" if path in (summary["inputs"].get("dbs") or [summary["inputs"]["db"]]) else "app"
        stem = Path(path).name.split(".")[0]
        name = f"{role}.pcapng" if stem == role else f"{role}-{stem}.pcapng"
        if name in taken:
            flat = re.sub(r"[^A-Za-z0-9_.-]+", "-", shown[path].rsplit(".", 1)[0].split(".pcap")[0]).strip("-")
            name = f"{role}-{flat}.pcapng"
        base, k = name.removesuffix(".pcapng"), 2
        while name in taken:
            name, k = f"{base}-{k}.pcapng", k + 1
        taken.add(name)
        names[path] = name
    return names


def display_paths(paths: list[str]) -> dict[str, str]:
    """Each path by its file name, with as many parent folders as it takes to tell equal names apart
    (hostA/app.pcap, hostB/app.pcap): a ticket must not carry this machine's folders."""
    parts = {p: Path(os.path.abspath(p)).parts for p in dict.fromkeys(paths)}
    depth = {p: 1 for p in parts}
    while True:
        shown = {p: "/".join(parts[p][-depth[p]:]) for p in parts}
        seen: dict[str, list[str]] = {}
        for p, name in shown.items():
            seen.setdefault(name, []).append(p)
        clash = [p for same in seen.values() if len(same) > 1 for p in same if depth[p] < len(parts[p]) - 1]
        if not clash:
            return shown
        for p in clash:
            depth[p] += 1


def _copy_frames(source, sp: list[Span], rows: pd.DataFrame, f, secrets=None) -> int:
    """One pass over the source capture: every frame of a selected connection inside a selected frame range. With
    TLS `secrets` (mysql.tls: client random -> secrets), those of the sessions whose ClientHello is among the
    frames go into a Decryption Secrets Block first, so that Wireshark opens the file decrypted."""
    from ..read.capture import tcp_records_between

    lo, hi = min(s.first for s in sp), max(s.last for s in sp)
    by_flow: dict[frozenset, list[Span]] = {}
    for s in sp:
        by_flow.setdefault(s.flow, []).append(s)
    comments = _comments(sp, rows)
    chosen = []
    for frame, ts_ns, linktype, data, orig_len, decoded in tcp_records_between(source, lo, hi):
        (src, dst), sport, dport = decoded[0], decoded[1], decoded[2]
        flow = frozenset(((src, sport), (dst, dport)))
        if any(s.first <= frame <= s.last for s in by_flow.get(flow, ())):
            chosen.append((linktype, ts_ns, data, orig_len, comments.get(frame)))
    writer = PcapngWriter(f)
    if secrets:
        wanted = {random: labels for random, labels in secrets.items() if any(random in c[2] for c in chosen)}
        if wanted:
            writer.secrets(keylog_text(wanted))
    for record in chosen:
        writer.packet(*record)
    return len(chosen)


def _comments(sp: list[Span], rows: pd.DataFrame) -> dict[int, str]:
    notes: dict[int, list[str]] = {}
    for s in sp:
        r = rows.iloc[s.row]
        label = f"conn {as_text(r['conn_id'])} seq {r['seq']} {r['command']}"
        parts = [f"pcapdecomp: {label}", _role_words(r).upper(), _components(r)]
        sql = r["sql"] if isinstance(r["sql"], str) else ""
        notes.setdefault(s.first, []).append(" · ".join(p for p in parts if p) + (f": {sql[:500]}" if sql else ""))
        if s.last != s.first:
            notes.setdefault(s.last, []).append(f"pcapdecomp: last response frame of {label}")
    return {k: "\n".join(v) for k, v in notes.items()}


EXEC_WORDS = {"slow_log": "slow log", "fingerprint_median": "estimate", "below_long_query_time": "at most",
              "flagged_slow": "at most; flagged slow on the wire"}


def _components(r) -> str:
    """client, server, queue, exec, network of one row, each estimate or bound said to be one."""
    out = []
    for col, name in (("total_s", "client"), ("server_s", "server"), ("queue_s", "queue"), ("exec_s", "exec"),
                      ("network_s", "network")):
        v = r.get(col)
        if v is None or pd.isna(v):
            continue
        text = f"{name} {seconds_ms(v)}"
        if col == "exec_s" and not is_missing(r.get("exec_source")):
            text += f" ({EXEC_WORDS.get(str(r['exec_source']), str(r['exec_source']))})"
        if col == "queue_s" and not is_missing(r.get("queue_source")):
            qs = str(r["queue_source"])
            certain = r.get("queue_min_s")
            if qs in ("estimated", "likely"):
                word = "estimate" if qs == "estimated" else "likely"
                text += (f" ({word}; at least {seconds_ms(certain)} certain)" if not is_missing(certain) and certain > 0
                         else f" ({word})")
            else:
                text += {"measured": " (measured)", "lower_bound": " (at least)"}.get(qs, f" ({qs})")
        out.append(text)
    return ", ".join(out)


def _role_words(r) -> str:
    """victim of stall 3 (hidden slow) | culprit of stall 3 | understated | …; empty for an ordinary row."""
    words = []
    role, stall = r.get("stall_role"), r.get("stall")
    if not is_missing(role):
        words.append(f"{role} of stall {int(stall)}" if not is_missing(stall) else str(role))
    elif r.get("evidence_role") == "culprit":
        words.append("culprit (held the pool's threads)")
    if not is_missing(r.get("hidden_slow")) and bool(r["hidden_slow"]):
        words.append("hidden slow")
    if not is_missing(r.get("understated")) and bool(r["understated"]):
        words.append("understated by the slow log")
    return ", ".join(words)


class PcapngWriter:
    """Minimal pcapng: a section header, one interface per link type (ns timestamps), enhanced packet blocks."""

    def __init__(self, f):
        self.f = f
        self.interfaces: dict[int, int] = {}
        self._block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1)
                    + self._options([(4, f"pcapdecomp {__version__} evidence".encode())]))

    def secrets(self, keylog: str) -> None:
        """A Decryption Secrets Block with a TLS key log (before the packets it decrypts)."""
        data = keylog.encode()
        self._block(0x0A, struct.pack("<II", 0x544C534B, len(data)) + data + b"\0" * (-len(data) % 4))

    def packet(self, linktype: int, ts_ns: int, data: bytes, orig_len: int, comment: str | None) -> None:
        iface = self.interfaces.get(linktype)
        if iface is None:
            iface = self.interfaces[linktype] = len(self.interfaces)
            self._block(1, struct.pack("<HHI", linktype, 0, 0) + self._options([(9, b"\x09")]))  # if_tsresol 1e-9
        body = struct.pack("<IIIII", iface, ts_ns >> 32, ts_ns & 0xFFFFFFFF, len(data), max(orig_len, len(data)))
        body += data + b"\0" * (-len(data) % 4)
        body += self._options([(1, comment.encode("utf-8"))] if comment else [])
        self._block(6, body)

    @staticmethod
    def _options(options: list[tuple[int, bytes]]) -> bytes:
        if not options:
            return b""
        out = b"".join(struct.pack("<HH", code, len(v)) + v + b"\0" * (-len(v) % 4) for code, v in options)
        return out + b"\0\0\0\0"

    def _block(self, kind: int, body: bytes) -> None:
        total = 12 + len(body)
        self.f.write(struct.pack("<II", kind, total) + body + struct.pack("<I", total))


# ------------------------------------------------------------------ summary.md


def summary_md(result: EvidenceResult, summary: dict, x: pd.DataFrame | None = None) -> str:
    """The ticket text. Paths are shown relative to the folder the inputs share; every text that came from a
    capture or a log is escaped (md_text for prose, md_code for statements)."""
    rows = result.rows
    inputs = summary["inputs"]
    proxies = list(inputs.get("proxy") or [])
    files = [*inputs["app"], *([inputs["db"]] if inputs["db"] else []), *proxies,
             *([inputs["slow_log"]] if inputs["slow_log"] else [])]
    shown = display_paths(files)
    story = summary.get("story") or {}
    lines = [f"# pcapdecomp evidence: {md_text(summary['set'])}", ""]
    if story:
        lines += [md_text(story["sentence"], line_start=True), ""]
        lines += [f"- {md_text(b['text'])}" for b in story.get("bullets", [])]
    else:
        lines += [md_text(line, line_start=True) for line in str(summary.get("verdict", "")).splitlines()]
    roles = rows["evidence_role"].value_counts() if "evidence_role" in rows.columns else pd.Series(dtype=int)
    counted = ", ".join(f"{int(roles[k])} {k}{'s' if roles[k] != 1 else ''}" for k in ("victim", "culprit", "selected")
                        if k in roles)
    lines += ["", f"Selected: {md_text(result.how)} ({len(rows)} exchanges" + (f": {counted}" if counted else "")
              + ").", "", "## Inputs", ""]
    lines += [f"- app capture: {md_code(shown[p])}" for p in inputs["app"]]
    lines += [f"- DB capture: {md_code(shown[inputs['db']])}"] if inputs["db"] else []
    lines += [f"- proxy capture: {md_code(shown[p])}" for p in proxies]
    lines += [f"- slow log: {md_code(shown[inputs['slow_log']])}"] if inputs["slow_log"] else []
    size = summary.get("thread_pool_size") or {}
    tps = (f"{size['value']} ({size.get('source')})" if size.get("value") else "unknown") if size else inputs["thread_pool_size"]
    lines += [f"- long_query_time: {inputs['long_query_time']}, thread_pool_size: {md_text(str(tps))}", ""]
    lines += _stall_table(summary, rows)
    # through a proxy: the client connection's id (the proxy's) and the time inside the proxy, apart from network
    proxied = bool(summary.get("proxy")) and "proxy_s" in rows.columns
    lines += ["## Exchanges", "",
              "| role | request sent (UTC) | conn | group | " + ("client conn (proxy's id) | " if proxied else "")
              + "client | server | queue | exec | network | " + ("inside the proxy (waited) | " if proxied else "")
              + "Query ID | SQL |", "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if proxied else "")]
    for r in rows.to_dict("records"):
        when = next((r[c] for c in ("app_req_ts", "db_req_ts", "req_first_ts") if not is_missing(r.get(c))), None)
        sql = r["sql"] if isinstance(r.get("sql"), str) else r.get("command")
        front = f"{as_text(r.get('front_conn_id'))} | " if proxied else ""
        inside = f"{seconds_ms(r.get('proxy_s'))} ({seconds_ms(r.get('proxy_wait_s'))}) | " if proxied else ""
        role = md_text(_role_words(r) or str(r.get('evidence_role') or ''))
        lines.append(f"| {role} | {clock(when, date=True, missing='')} | "
                     f"{as_text(r['conn_id'])} | {as_text(r.get('thread_group'))} | {front}{seconds_ms(r['total_s'])} | "
                     f"{seconds_ms(r['server_s'])} | {md_text(_labelled(r, 'queue_s'))} | "
                     f"{md_text(_labelled(r, 'exec_s'))} | {seconds_ms(r['network_s'])} | {inside}"
                     f"{md_code(str(r.get('query_id') or ''))} | {md_code(sql or '')} |")
    lines += ["", "Estimates and bounds are labelled: *estimate* (from other runs of the same statement; claims "
              "nothing), *at least* / *at most* (bounded by long_query_time), *measured* (the slow log's "
              "Query_time).", "", "## Packets", ""]
    for path, target in result.files.items():
        lines += [f"- {md_code(target.name)}: {result.frames[path]} frames from {md_code(shown.get(path, Path(path).name))}. "
                  "To see the same exchanges in the original capture, one display filter per exchange:", ""]
        here = spans(rows, summary).get(path, [])
        for sp in here:
            command = f"tshark -r {shlex.quote(shown.get(path, Path(path).name))} -Y " \
                      f"{shlex.quote(display_filter(sp.client, sp.server, sp.first, sp.last))}"
            lines.append(f"  - {md_code(command, 1000)}")
        lines.append("")
        for stall, members in _by_stall(rows, here):
            combined = " || ".join(f"({display_filter(sp.client, sp.server, sp.first, sp.last)})" for sp in members)
            command = f"tshark -r {shlex.quote(shown.get(path, Path(path).name))} -Y {shlex.quote(combined)}"
            lines += [f"  Stall {stall}, its victims and culprit at once ({len(members)} exchanges):", "", "```",
                      _fenced(command), "```", ""]
    lines += ["## Reproduce", "", "In the folder that holds the captures:", "", "```"]
    cmd = ["pcapdecomp", "analyze"] + [a for p in inputs["app"] for a in ("--app", shown[p])]
    cmd += ["--db", shown[inputs["db"]]] if inputs["db"] else []
    cmd += [a for p in proxies for a in ("--proxy", shown[p])]
    cmd += [a for s in inputs.get("proxy_servers") or [] for a in ("--proxy-server", s)]
    cmd += ["--slow-log", shown[inputs["slow_log"]]] if inputs["slow_log"] else []
    cmd += ["--long-query-time", str(inputs["long_query_time"])] if inputs["long_query_time"] is not None else []
    cmd += ["--thread-pool-size", str(inputs["thread_pool_size"])] if inputs["thread_pool_size"] else []
    cmd += [a for s in inputs["servers"] for a in ("--server", s)] + ["--out", "analysis"]
    lines += [_fenced(shlex.join(cmd)), _fenced(shlex.join(["pcapdecomp", "evidence", "analysis"])), "```", ""]
    return "\n".join(lines)


def _by_stall(rows: pd.DataFrame, here: list[Span]) -> list[tuple[int, list[Span]]]:
    """The spans of one capture grouped by the stall their exchange took part in (victim or culprit), in stall
    order: one display filter per stall shows it whole in Wireshark."""
    if "stall" not in rows.columns:
        return []
    stall = rows["stall"].to_numpy(dtype="float64", na_value=np.nan)
    groups: dict[int, list[Span]] = {}
    for sp in here:
        if not np.isnan(stall[sp.row]):
            groups.setdefault(int(stall[sp.row]), []).append(sp)
    return sorted(groups.items())


def _stall_table(summary: dict, rows: pd.DataFrame) -> list[str]:
    """The stalls the selected victims queued in, with their culprits and Query IDs."""
    stalls = (summary.get("groups") or {}).get("stalls") or []
    if "stall" not in rows.columns or not stalls:
        return []
    wanted = set(rows.loc[(rows["stall_role"] == "victim").fillna(False), "stall"].dropna().astype(int))
    chosen = [s for s in stalls if s.get("id") in wanted]
    if not chosen:
        return []
    out = ["## Stalls", "", "| stall | thread group | from (UTC) | stalled for | queued | max queue | culprit | "
           "culprit conn | culprit exec | culprit Query ID |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in chosen:
        c = s["culprits"][0] if s["culprits"] else None
        more = f" (+{s['culprits_total'] - 1} more)" if s.get("culprits_total", 0) > 1 else ""
        queue = seconds_ms(s["max_queue_s"]) + (f" (≥ {seconds_ms(s['max_queue_certain_s'])} certain)"
                                                if s.get("max_queue_certain_s", s["max_queue_s"]) < s["max_queue_s"] - 1e-6
                                                else "")
        out.append(f"| {s['id']} | {s['thread_group']} | {clock(s['start'], date=True, missing='')} | "
                   f"{seconds_ms(s['duration_s'])} | {s['queued']} | "
                   f"{md_text(queue)} | " + (f"{md_code(c['sql'] or '')}{md_text(more)} | {as_text(c['conn_id'])} | "
                                              f"{md_text(_labelled(c, 'exec_s'))} | {md_code(c.get('query_id') or '')} |"
                                              if c else "none found | | | |"))
    return out + [""]


def _labelled(r, col: str) -> str:
    """One component with its provenance, as in the packet comments: `exec 56 µs (estimate)` without the name."""
    v = r.get(col)
    if is_missing(v):
        return "–"
    text = _components({col: v, "exec_source": r.get("exec_source"), "queue_source": r.get("queue_source"),
                        "queue_min_s": r.get("queue_min_s")})
    return text.split(" ", 1)[1] if " " in text else text


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~!&@])")


def md_text(text, line_start: bool = False) -> str:
    """Text from anywhere, safe as Markdown prose: on one line, every character Markdown could read as inline
    markup (emphasis, code, links, HTML, entities, tables, strikethrough) backslash-escaped, autolinks broken, and a
    start that would open a list or heading escaped (`line_start`: the text begins a line)."""
    flat = _MD_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))
    flat = re.sub(r"(?i)(://|www\.)", lambda m: "\\:\\/\\/" if m[1] == "://" else m[1][:3] + "\\.", flat)
    if not line_start:
        return flat
    return re.sub(r"^([-+=]|\d+(?=[.)]))", lambda m: "\\" + m[1] if not m[1][0].isdigit() else m[1] + "\\", flat)


def md_code(text, limit: int = 200) -> str:
    """Text as a Markdown code span, safe in a table cell: a fence longer than any run of backticks inside,
    `|` escaped (GFM splits cells before code spans), one line, at most `limit` characters."""
    flat = clip(text, limit)
    fence = "`" * (max((len(m) for m in re.findall(r"`+", flat)), default=0) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") or not flat else ""
    body = flat.replace("|", "\\|")
    return f"{fence}{pad}{body}{pad}{fence}"


def _fenced(line: str) -> str:
    """A command line inside a ``` block: a line of backticks would end the block."""
    return line.replace("```", "` ` `")
