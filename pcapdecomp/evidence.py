"""Ticket evidence: the packets of chosen exchanges, per capture point, with a note of what they show.

`export(analysis_dir, …)` reads what `pcapdecomp analyze` wrote (exchanges.parquet, summary.json), selects
exchanges (hidden slow by default), and writes one small pcapng per capture point holding just their frames
(original bytes, link types and nanosecond timestamps; a comment on each exchange's first request frame and last
response frame), a summary.md and the selected rows as exchanges.csv."""

from __future__ import annotations

import json
import os
import shlex
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import __version__
from .errors import InputError, UsageError
from .match import split_endpoint

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
    from .pipeline import INCOMPLETE_NAME

    if (analysis_dir / INCOMPLETE_NAME).exists():
        raise InputError(f"{analysis_dir}: an analyze run stopped while writing here ({INCOMPLETE_NAME}); run "
                         "`pcapdecomp analyze` again")
    table, summary = analysis_dir / "exchanges.parquet", analysis_dir / "summary.json"
    if not table.is_file() or not summary.is_file():
        raise InputError(f"{analysis_dir}: no exchanges.parquet and summary.json here: run `pcapdecomp analyze` first")
    try:
        return pd.read_parquet(table), json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(f"{analysis_dir}: cannot read the analysis: {err}") from None


def select(x: pd.DataFrame, query_ids: list[str], conn_ids: list[int], top: int | None) -> tuple[pd.DataFrame, str]:
    """The union of --query-id and --conn-id matches (else the hidden-slow rows, else the slowest), then --top."""
    if top is not None and top < 1:
        raise UsageError(f"--top must be ≥ 1, got {top}")
    slowness = x["server_s"].fillna(x["total_s"]).fillna(x["response_s"])
    if query_ids or conn_ids:
        wanted = {q.upper().removeprefix("0X") for q in query_ids}
        qid = x["query_id"].astype("string").fillna("").str.upper().str.removeprefix("0X")
        mask = qid.isin(wanted) | x["conn_id"].isin(conn_ids)
        how = " or ".join(filter(None, [f"query id {', '.join(query_ids)}" if query_ids else "",
                                        f"connection {', '.join(map(str, conn_ids))}" if conn_ids else ""]))
        if not mask.any():
            raise UsageError(f"no exchange matches {how}")
    elif x["hidden_slow"].fillna(False).any():
        mask, how = x["hidden_slow"].fillna(False).astype(bool), "the hidden-slow exchanges"
    else:
        mask, how = slowness.notna(), "no hidden-slow exchange: the slowest exchanges"
        top = top or DEFAULT_TOP
    rows = x[mask].assign(_slow=slowness[mask]).sort_values("_slow", ascending=False)
    if top is not None and len(rows) > top:
        rows, how = rows.head(top), f"{how}, the {top} slowest"
    return rows.drop(columns="_slow").sort_values(["app_req_ts", "db_req_ts", "req_first_ts"]).reset_index(drop=True), how


def spans(rows: pd.DataFrame, summary: dict) -> dict[str, list[Span]]:
    """capture path -> the selected exchanges' frame spans in it (app side from the foundation columns, DB side
    from the db_* columns; rows seen only at the DB carry DB frames in the foundation columns)."""
    db_file = summary["inputs"]["db"]
    out: dict[str, list[Span]] = {}

    def add(path, client, server, first, last, i):
        if path is None or pd.isna(first) or pd.isna(last) or pd.isna(client):
            return
        c, s = split_endpoint(str(client)), split_endpoint(str(server))
        out.setdefault(str(path), []).append(Span(i, frozenset((c, s)), int(first), int(last), str(client), str(server)))

    for i, r in enumerate(rows.itertuples(index=False)):
        last_app = r.resp_last_frame if pd.notna(r.resp_last_frame) else r.req_last_frame
        if r.seen in ("both", "app"):
            add(r.capture, r.client, r.server, r.req_first_frame, last_app, i)
        if r.seen == "db":
            add(db_file, r.client, r.server, r.req_first_frame, last_app, i)
        elif r.seen == "both":
            add(db_file, r.db_client, r.server, r.db_req_first_frame, r.db_resp_last_frame, i)
    return out


# ------------------------------------------------------------------ export


def export(analysis_dir: Path, query_ids: list[str] | None = None, conn_ids: list[int] | None = None,
           top: int | None = None, out_dir: Path | None = None) -> EvidenceResult:
    x, summary = load_analysis(analysis_dir)
    rows, how = select(x, list(query_ids or []), list(conn_ids or []), top)
    out = out_dir if out_dir is not None else analysis_dir / "evidence"
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder")
    per_capture = spans(rows, summary)
    cwd = Path(summary["inputs"].get("cwd") or ".")
    sources = {}
    for path in per_capture:
        src = Path(path) if Path(path).is_absolute() else cwd / path
        if not src.is_file():
            raise InputError(f"{src}: capture named in {analysis_dir / 'summary.json'} not found")
        sources[path] = src
    out.mkdir(parents=True, exist_ok=True)
    result = EvidenceResult(out, rows, how)
    names = _file_names(per_capture, summary)
    for path, sp in per_capture.items():
        target = out / names[path]
        result.frames[path] = _write_atomic(target, lambda f, s=sources[path], sp=sp: _copy_frames(s, sp, rows, f))
        result.files[path] = target
        result.written.append(target)
    from .pipeline import write_table

    write_table(rows, out / "exchanges.csv")
    result.written.append(out / "exchanges.csv")
    text = summary_md(result, summary, analysis_dir)
    _write_atomic(out / "summary.md", lambda f: f.write(text.encode("utf-8")))
    result.written.append(out / "summary.md")
    return result


def _file_names(per_capture: dict, summary: dict) -> dict[str, str]:
    names = {}
    for path in per_capture:
        role = "db" if path == summary["inputs"]["db"] else "app"
        stem = Path(path).name.split(".")[0]
        names[path] = f"{role}-{stem}.pcapng" if stem != role else f"{role}.pcapng"
    return names


def _write_atomic(path: Path, write) -> int:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            result = write(f)
        os.replace(tmp, path)
        return result
    finally:
        if tmp.exists():
            tmp.unlink()


def _copy_frames(source: Path, sp: list[Span], rows: pd.DataFrame, f) -> int:
    """One pass over the source capture: every frame of a selected connection inside a selected frame range."""
    from .capture import _decode, iter_records

    lo, hi = min(s.first for s in sp), max(s.last for s in sp)
    by_flow: dict[frozenset, list[Span]] = {}
    for s in sp:
        by_flow.setdefault(s.flow, []).append(s)
    comments = _comments(sp, rows)
    writer = PcapngWriter(f)
    written = 0
    for frame, ts_ns, linktype, data, orig_len in iter_records(source):
        if frame < lo:
            continue
        if frame > hi:
            break
        decoded = _decode(linktype, data, orig_len)
        if decoded.__class__ is not tuple:
            continue
        (src, dst), sport, dport = decoded[0], decoded[1], decoded[2]
        flow = frozenset(((src, sport), (dst, dport)))
        if any(s.first <= frame <= s.last for s in by_flow.get(flow, ())):
            writer.packet(linktype, ts_ns, data, orig_len, comments.get(frame))
            written += 1
    return written


def _comments(sp: list[Span], rows: pd.DataFrame) -> dict[int, str]:
    notes: dict[int, list[str]] = {}
    for s in sp:
        r = rows.iloc[s.row]
        label = f"conn {_v(r['conn_id'])} seq {r['seq']} {r['command']}"
        parts = [f"pcapdecomp: {label}"]
        if r["hidden_slow"] is True or (pd.notna(r["hidden_slow"]) and bool(r["hidden_slow"])):
            parts.append("HIDDEN SLOW")
        parts.append(", ".join(f"{name} {_secs(r[col])}" for col, name in
                               (("total_s", "client"), ("server_s", "server"), ("queue_s", "queue"),
                                ("exec_s", "exec"), ("network_s", "network")) if pd.notna(r[col])))
        sql = r["sql"] if isinstance(r["sql"], str) else ""
        notes.setdefault(s.first, []).append(" · ".join(p for p in parts if p) + (f": {sql[:500]}" if sql else ""))
        if s.last != s.first:
            notes.setdefault(s.last, []).append(f"pcapdecomp: last response frame of {label}")
    return {k: "\n".join(v) for k, v in notes.items()}


class PcapngWriter:
    """Minimal pcapng: a section header, one interface per link type (ns timestamps), enhanced packet blocks."""

    def __init__(self, f):
        self.f = f
        self.interfaces: dict[int, int] = {}
        self._block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1)
                    + self._options([(4, f"pcapdecomp {__version__} evidence".encode())]))

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


def summary_md(result: EvidenceResult, summary: dict, analysis_dir: Path) -> str:
    rows = result.rows
    lines = [f"# pcapdecomp evidence: {summary['set']}", "", summary["verdict"], "",
             f"Selected: {result.how} ({len(rows)} exchanges).", "", "## Inputs", ""]
    inputs = summary["inputs"]
    lines += [f"- app capture: `{p}`" for p in inputs["app"]]
    lines += [f"- DB capture: `{inputs['db']}`"] if inputs["db"] else []
    lines += [f"- slow log: `{inputs['slow_log']}`"] if inputs["slow_log"] else []
    lines += [f"- long_query_time: {inputs['long_query_time']}, thread_pool_size: {inputs['thread_pool_size']}", ""]
    lines += ["## Exchanges", "", "| request sent | conn | group | client | server | queue | exec | network | SQL |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows.itertuples(index=False):
        when = r.app_req_ts if pd.notna(r.app_req_ts) else r.db_req_ts if pd.notna(r.db_req_ts) else r.req_first_ts
        sql = r.sql if isinstance(r.sql, str) else r.command
        lines.append(f"| {_v(when)} | {_v(r.conn_id)} | {_v(r.thread_group)} | {_secs(r.total_s)} | "
                     f"{_secs(r.server_s)} | {_secs(r.queue_s)} | {_secs(r.exec_s)} | {_secs(r.network_s)} | "
                     f"`{_md(sql)}` |")
    lines += ["", "## Packets", ""]
    for path, target in result.files.items():
        lines += [f"- `{target.name}`: {result.frames[path]} frames from `{path}`. To see the same exchanges in the "
                  "original capture, one display filter per exchange:", ""]
        for s in spans(rows, summary).get(path, []):
            lines.append(f"  - `tshark -r {shlex.quote(path)} -Y '{display_filter(s.client, s.server, s.first, s.last)}'`")
        lines.append("")
    lines += ["## Reproduce", "", "```"]
    cmd = ["pcapdecomp", "analyze"] + [a for p in inputs["app"] for a in ("--app", p)]
    cmd += ["--db", inputs["db"]] if inputs["db"] else []
    cmd += ["--slow-log", inputs["slow_log"]] if inputs["slow_log"] else []
    cmd += ["--long-query-time", str(inputs["long_query_time"])] if inputs["long_query_time"] is not None else []
    cmd += ["--thread-pool-size", str(inputs["thread_pool_size"])] if inputs["thread_pool_size"] else []
    cmd += [a for s in inputs["servers"] for a in ("--server", s)] + ["--out", str(analysis_dir)]
    lines += [f"cd {shlex.quote(inputs.get('cwd') or '.')}", shlex.join(cmd),
              shlex.join(["pcapdecomp", "evidence", str(analysis_dir), "--out", str(result.out_dir)]), "```", ""]
    return "\n".join(lines)


def _v(v) -> str:
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return ""
    return v.isoformat() if isinstance(v, pd.Timestamp) else str(v)


def _secs(v) -> str:
    if v is None or pd.isna(v):
        return "–"
    v = float(v)
    return f"{v:.3f} s" if abs(v) >= 1 else f"{v * 1e3:.3f} ms"


def _md(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|").replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"
