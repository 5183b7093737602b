"""`pcapdecomp compare`: two or more analyses side by side — before and after a fix.

Each argument is an analysis folder (what `pcapdecomp analyze` wrote) or a capture-set folder, which is analysed
on the way by the analyze pipeline itself (into `analyses/` of the output). The first one is the baseline: every
change is measured against it, as the four-point incident reported its fix (3,788 slow statements → 818 with
one-thread-per-connection, −78 %; → 63 with thread_pool_stall_limit=10, −98.3 %).

The comparison is a long table (schema.COMPARISON_COLUMNS: per analysis, scope, key and metric, with per-second
and per-call rates and the change against the baseline), comparison.json (headline, notes, the analyses) and one
self-contained HTML page (render/compare_page.py). Notes say honestly where the captures differ — length, load,
statement mix, capture points, slow log, long_query_time, thread groups, servers, settings, capture quality — and
when that makes them not comparable. The output folder is written as a set (a temporary folder renamed into
place)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import __version__
from .core.errors import InputError, UsageError
from .core.formats import pct_change, seconds_significant
from .core.groups import group_nearest_rank, nearest_rank
from .core.outputs import staged_folder, write_table
from .core.schema import COMPARISON_COLUMNS
from .explain.playbook import settings_beside

SLOW_WIRE_S = 0.1  # the four-point incident counted statements slower than 100 ms on the wire
COUNTS = ("calls", "slow_wire", "hidden_slow", "in_slow_log", "understated")
QUANTILES = (("p50_s", 0.5), ("p95_s", 0.95), ("p99_s", 0.99))
EXCHANGE_METRICS = (*COUNTS, "sum_s", "p50_s", "p95_s", "p99_s", "max_s")
COMPONENT_METRICS = ("calls", "sum_s", "p50_s", "p95_s", "p99_s", "max_s")
COMPONENTS = (("network", "network_s"), ("queueing", "queue_s"), ("queueing_certain", "queue_min_s"),
              ("execution", "exec_s"))
# through a proxy with its capture (pcapdecomp/pair/proxy.py): compared when an analysis has them
PROXY_COMPONENTS = (("inside_the_proxy", "proxy_s"), ("proxy_wait", "proxy_wait_s"))
FLAGS = (("hidden_slow", "hidden_slow"), ("in_slow_log", "in_slow_log"), ("understated", "understated"))
# what this module reads of an analysis: a folder without these is from an incompatible version
NEEDED_COLUMNS = ("command", "fingerprint", "query_id", "total_s", "server_s", "response_s", "network_s", "queue_s",
                  "queue_min_s", "exec_s", "hidden_slow", "in_slow_log", "understated", "thread_group")
NEEDED_KEYS = ("pcapdecomp", "set", "inputs", "captures", "slow_log")
OUTPUT_NAMES = ("comparison.parquet", "comparison.csv", "comparison.json", "comparison.html", "analyses")
SETTINGS = ("product", "version", "thread_handling", "thread_pool_size", "thread_pool_stall_limit",
            "thread_pool_max_threads", "thread_pool_oversubscribe", "long_query_time")
DIFFERENT_SHARE = 0.25  # lengths or loads further apart than this get a note
MIX_NOT_COMPARABLE, MIX_CAUTION = 0.8, 0.95  # shares of calls by Query ID the two analyses have in common


@dataclass
class Analysis:
    """One analysis of the comparison, with what the comparison reads of it."""

    step: int
    name: str
    folder: Path
    summary: dict
    x: pd.DataFrame  # NEEDED_COLUMNS of exchanges.parquet, and the PROXY_COMPONENTS' columns where it has them
    span_s: float | None
    settings: dict | None  # capture.toml [server] beside its captures, when found
    analysed_here: bool = False
    label: str = ""  # the settings that tell it from the others (thread_pool_stall_limit=10), else its name

    @property
    def calls(self) -> int:
        return len(self.x)

    @property
    def capture_points(self) -> str:
        inputs = self.summary["inputs"]
        points = [p for p, present in (("app", bool(inputs.get("app"))), ("db", bool(inputs.get("db")))) if present]
        return " and ".join(points) or "none"

    @property
    def slow_log_used(self) -> bool:
        return bool((self.summary.get("slow_log") or {}).get("used"))

    @property
    def long_query_time(self) -> float | None:
        return self.summary["inputs"].get("long_query_time")

    @property
    def thread_pool_size(self) -> tuple[int | None, str | None]:
        tps = self.summary.get("thread_pool_size")
        if isinstance(tps, dict):
            return tps.get("value"), tps.get("source")
        return self.summary["inputs"].get("thread_pool_size"), "given"


@dataclass
class Note:
    kind: str
    severity: str  # info | caution | not comparable
    text: str


@dataclass
class Comparison:
    analyses: list[Analysis]
    table: pd.DataFrame  # COMPARISON_COLUMNS
    headline: list[str]
    notes: list[Note]
    slow_s: float
    out_dir: Path | None = None
    sentence: str = ""  # what the change did, in one sentence, by the settings that changed
    written: list[Path] = field(default_factory=list)

    @property
    def comparable(self) -> bool:
        return not any(n.severity == "not comparable" for n in self.notes)

    def counts(self) -> dict[str, list]:
        t = self.table
        overall = t[(t["scope"] == "overall")]
        out = {}
        for metric in ("slow_wire", "hidden_slow", "in_slow_log", "understated", "calls"):
            rows = overall[overall["metric"] == metric].sort_values("step")
            out[metric] = [None if pd.isna(v) else int(v) for v in rows["value"]]
        return out


# ------------------------------------------------------------------ inputs


def check_inputs(paths: list[Path]) -> list[str]:
    """'analysis' or 'capture set' per path; a user mistake raises InputError/UsageError before any work."""
    if len(paths) < 2:
        raise UsageError("compare needs at least two folders: BEFORE AFTER [MORE…]")
    return [_kind_of(p) for p in paths]


def _kind_of(path: Path) -> str:
    if not path.exists():
        raise InputError(f"{path}: no such folder")
    if not path.is_dir():
        raise InputError(f"{path}: not a folder: give an analysis folder (what `pcapdecomp analyze` wrote) or a "
                         "capture-set folder")
    has = {name: (path / name).is_file() for name in ("summary.json", "exchanges.parquet")}
    if any(has.values()):
        missing = [name for name, present in has.items() if not present]
        if missing:
            raise InputError(f"{path}: {missing[0]} missing (an analysis folder holds exchanges.parquet and "
                             "summary.json): run `pcapdecomp analyze` again")
        return "analysis"
    from .read.sources import is_capture_name

    # capture files (rotated ones too) or capture-point folders (app/, app-<host>/, db/, db-<name>/)
    captures = [p for p in path.iterdir() if p.name.startswith(("app", "db"))
                and (p.is_dir() if p.name in ("app", "db") or p.name.startswith(("app-", "db-"))
                     else p.is_file() and is_capture_name(p.name))]
    if captures or (path / "capture.toml").is_file():
        return "capture set"
    raise InputError(f"{path}: neither an analysis folder (exchanges.parquet, summary.json) nor a capture set "
                     "(app*.pcap, db*.pcap, capture.toml)")


def read_analysis(folder: Path, step: int, analysed_here: bool = False) -> Analysis:
    """Read what the comparison needs of an analysis folder; an unreadable or incompatible one is a user mistake."""
    import pyarrow.parquet as pq

    from .core.readback import read_summary, read_table

    summary = read_summary(folder / "summary.json")
    version = summary.get("pcapdecomp") if isinstance(summary.get("pcapdecomp"), str) else None
    try:
        columns = set(pq.read_schema(folder / "exchanges.parquet").names)
    except (OSError, ValueError) as err:
        raise InputError(f"{folder / 'exchanges.parquet'}: not readable as Parquet: {err}") from None
    missing = [k for k in NEEDED_KEYS if k not in summary] + [c for c in NEEDED_COLUMNS if c not in columns]
    if missing:
        raise InputError(f"{folder}: an analysis from an incompatible version of pcapdecomp "
                         f"({version or 'unknown'}; this is {__version__}): {', '.join(missing[:4])}"
                         f"{' …' if len(missing) > 4 else ''} missing; run `pcapdecomp analyze` again")
    x = read_table(folder / "exchanges.parquet",
                   columns=[*NEEDED_COLUMNS, *(c for _, c in PROXY_COMPONENTS if c in columns)])
    return Analysis(step, str(summary["set"]), folder, summary, x, _span_s(summary), _settings(summary),
                    analysed_here)


def _span_s(summary: dict) -> float | None:
    """Capture length: the robust span of the exchanges when the analysis found outliers (wild timestamps), else
    the captures' first to last frame (app captures when there are, else the DB capture)."""
    outliers = (summary.get("pool") or {}).get("outliers") or {}
    caps = summary.get("captures") or {}
    if outliers.get("exchanges") and outliers.get("span_start") and outliers.get("span_end"):
        spans = [(outliers["span_start"], outliers["span_end"])]
    elif caps.get("app"):
        spans = [(q.get("first_ts"), q.get("last_ts")) for q in caps["app"] if isinstance(q, dict)]
    elif isinstance(caps.get("db"), dict):
        spans = [(caps["db"].get("first_ts"), caps["db"].get("last_ts"))]
    else:
        return None
    try:
        first = min(pd.Timestamp(a) for a, _ in spans if a)
        last = max(pd.Timestamp(b) for _, b in spans if b)
    except (ValueError, TypeError):
        return None
    seconds = (last - first).total_seconds()
    return seconds if seconds > 0 else None


def _settings(summary: dict) -> dict | None:
    """The server settings of capture.toml beside the analysed captures (the lab writes one), when it is there."""
    server = (settings_beside(summary) or {}).get("values")
    return {k: server[k] for k in SETTINGS if k in server} if server else None


# ------------------------------------------------------------------ the table


def wire_time(x: pd.DataFrame) -> pd.Series:
    """What the client waited: A4 − A1 where the app saw the exchange, else D4 − D1, else the one capture's time."""
    return x["total_s"].fillna(x["server_s"]).fillna(x["response_s"]).astype("float64")


def _flag(x: pd.DataFrame, col: str) -> np.ndarray:
    """A nullable boolean column as floats 1 / 0 / NaN (NaN: not decided), for sums that stay null when nothing
    was decided."""
    return x[col].astype("boolean").astype("Float64").to_numpy(dtype="float64", na_value=np.nan)


def exchange_stats(x: pd.DataFrame, keys: pd.Series, slow_s: float) -> pd.DataFrame:
    """EXCHANGE_METRICS per key (null keys dropped): calls, counts of slow on the wire and of the analysis's flags,
    wire time summed and its percentiles."""
    wire = wire_time(x).to_numpy()
    f = pd.DataFrame({"key": keys.array, "wire": wire, "slow": (wire > slow_s).astype("float64"),
                      **{m: _flag(x, col) for m, col in FLAGS}})
    g = f.groupby("key", sort=True, dropna=True, observed=True)
    out = pd.DataFrame({"calls": g.size().astype("float64"), "slow_wire": g["slow"].sum(),
                        **{m: g[m].sum(min_count=1) for m, _ in FLAGS}, "sum_s": g["wire"].sum(min_count=1)})
    codes, keys_seen = pd.factorize(f["key"], sort=True)
    for name, q in QUANTILES:  # nearest-rank: a wire time that occurred
        per_key = pd.Series(group_nearest_rank(codes[codes >= 0], wire[codes >= 0], len(keys_seen), q),
                            index=keys_seen)
        out[name] = per_key.reindex(out.index).to_numpy()
    out["max_s"] = g["wire"].max()
    out.index = out.index.astype(str)
    return out[list(EXCHANGE_METRICS)]


def component_stats(x: pd.DataFrame) -> pd.DataFrame:
    rows = {}
    proxied = [(n, c) for n, c in PROXY_COMPONENTS if c in x.columns and x[c].notna().any()]
    for name, col in (*COMPONENTS, *proxied):
        v = x[col].dropna().to_numpy(dtype="float64")
        q = nearest_rank(v, [q for _, q in QUANTILES]) if len(v) else [np.nan] * len(QUANTILES)
        rows[name] = [float(len(v)), float(v.sum()) if len(v) else np.nan, *q, float(v.max()) if len(v) else np.nan]
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(COMPONENT_METRICS))


def _scopes(a: Analysis, slow_s: float) -> dict[str, pd.DataFrame]:
    x = a.x
    scopes = {"overall": exchange_stats(x, pd.Series("all", index=x.index), slow_s),
              "component": component_stats(x),
              "query_id": exchange_stats(x, x["query_id"], slow_s)}
    if x["thread_group"].notna().any():
        scopes["thread_group"] = exchange_stats(x, x["thread_group"].astype("Int64"), slow_s)
    return scopes


def build_table(analyses: list[Analysis], slow_s: float) -> pd.DataFrame:
    """The long comparison table: every (scope, key) seen in any analysis, every metric of its scope, every step."""
    per_step = [_scopes(a, slow_s) for a in analyses]
    fingerprints = _fingerprints(analyses)
    parts = []
    for scope, metrics in (("overall", EXCHANGE_METRICS), ("component", COMPONENT_METRICS),
                           ("thread_group", EXCHANGE_METRICS), ("query_id", EXCHANGE_METRICS)):
        keys = sorted(set().union(*(s[scope].index for s in per_step if scope in s)),
                      key=lambda k: (int(k) if scope == "thread_group" else 0, k))
        if not keys:
            continue
        for a, scopes in zip(analyses, per_step):
            if scope in scopes:
                stats = scopes[scope].reindex(keys)
                absent = ~stats.index.isin(scopes[scope].index)
                # a key that did not occur here: none of its calls, none slow — known zeros where this analysis
                # decides the count at all
                for metric in COUNTS:
                    if metric in stats and (metric in ("calls", "slow_wire") or _decided(a, metric)):
                        stats.loc[absent, metric] = 0.0
            else:  # no thread groups in this analysis: nothing known per group
                stats = pd.DataFrame(np.nan, index=keys, columns=list(metrics))
            long = stats[list(metrics)].rename_axis("key").reset_index().melt(
                id_vars="key", var_name="metric", value_name="value")
            calls = stats["calls"].reindex(long["key"]).to_numpy()
            long["per_call"] = np.where(long["metric"].isin([*COUNTS[1:], "sum_s"]) & (calls > 0),
                                        long["value"].to_numpy() / np.where(calls > 0, calls, 1), np.nan)
            rate = long["metric"].isin([*COUNTS, "sum_s"])
            long["per_second"] = np.where(rate, long["value"] / a.span_s, np.nan) if a.span_s else np.nan
            long.insert(0, "scope", scope)
            long["step"], long["analysis"] = a.step, a.name
            parts.append(long)
    t = pd.concat(parts, ignore_index=True)
    t["fingerprint"] = np.where(t["scope"] == "query_id", t["key"].map(fingerprints), None)
    base = t[t["step"] == 0].set_index(["scope", "key", "metric"])
    ref = pd.MultiIndex.from_frame(t[["scope", "key", "metric"]])
    steps = t["step"].to_numpy()
    for col, change_pct in (("value", "change_pct"), ("per_second", "per_second_change_pct"),
                            ("per_call", "per_call_change_pct")):
        before = base[col].reindex(ref).to_numpy(dtype="float64")
        diff = t[col].to_numpy(dtype="float64") - before
        diff[steps == 0] = np.nan
        if col == "value":
            t["change"] = diff
        pct = np.full(len(t), np.nan)
        ok = np.isfinite(diff) & (before != 0)
        pct[ok] = np.round(100 * diff[ok] / before[ok], 9)  # 0 after x is −100 %, not −100.00000000000001 %
        t[change_pct] = pct
    for c in COMPARISON_COLUMNS:
        t[c.name] = t[c.name].astype(c.dtype)
    return t[[c.name for c in COMPARISON_COLUMNS]]


def _decided(a: Analysis, metric: str) -> bool:
    col = dict(FLAGS)[metric]
    return bool(a.x[col].notna().any())


def _fingerprints(analyses: list[Analysis]) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in analyses:
        pairs = a.x[["query_id", "fingerprint"]].dropna().drop_duplicates("query_id")
        for qid, fp in zip(pairs["query_id"], pairs["fingerprint"]):
            out.setdefault(str(qid), str(fp))
    return out


# ------------------------------------------------------------------ notes and headline


def notes_for(analyses: list[Analysis]) -> list[Note]:
    """Where the analyses differ in what they measured, each later one against the baseline."""
    base, notes = analyses[0], []
    for a in analyses:
        if a.span_s is None:
            notes.append(Note("length", "caution", f"{a.name}: capture length unknown: no per-second rates"))
    for a in analyses[1:]:
        if a.folder.resolve() == base.folder.resolve():
            notes.append(Note("same", "info", f"{a.name} is the same analysis as {base.name} ({a.folder})"))
        if base.span_s and a.span_s and _apart(base.span_s, a.span_s):
            notes.append(Note("length", "caution", f"the captures differ in length: {base.name} {base.span_s:.1f} s, "
                              f"{a.name} {a.span_s:.1f} s; compare the rates (per_second)"))
        if base.span_s and a.span_s and base.calls and a.calls and \
                _apart(base.calls / base.span_s, a.calls / a.span_s):
            notes.append(Note("load", "caution", f"the load differs: {base.name} {base.calls / base.span_s:,.1f} "
                              f"exchanges/s, {a.name} {a.calls / a.span_s:,.1f} exchanges/s"))
        common, only_base, only_a = _mix(base, a)
        if common < MIX_CAUTION:
            severity = "not comparable" if common < MIX_NOT_COMPARABLE else "caution"
            notes.append(Note("mix", severity, f"different statement mix: {100 * common:.0f} % of the calls of "
                              f"{base.name} and {a.name} are of the same Query IDs in the same shares "
                              f"({only_base} Query IDs only in {base.name}, {only_a} only in {a.name})"
                              + ("; the workloads are not comparable" if severity == "not comparable" else "")))
        if a.capture_points != base.capture_points:
            notes.append(Note("points", "not comparable", f"different capture points: {base.name} has "
                              f"{base.capture_points}, {a.name} {a.capture_points}: wire time is the client's "
                              "(A4 − A1) only with an app capture, else the server's (D4 − D1), without the network"))
        if a.slow_log_used != base.slow_log_used:
            without = a if not a.slow_log_used else base
            notes.append(Note("slow_log", "not comparable", f"{without.name} has no usable slow log: in_slow_log and "
                              "understated are not compared, and hidden slow there rests on the wire flag "
                              "(SERVER_QUERY_WAS_SLOW) alone"))
        if a.long_query_time != base.long_query_time:
            notes.append(Note("long_query_time", "not comparable", f"long_query_time differs ({base.name} "
                              f"{_or_unknown(base.long_query_time)}, {a.name} {_or_unknown(a.long_query_time)}): "
                              "hidden slow and in_slow_log count against different thresholds"))
        n0, n1 = base.thread_pool_size[0], a.thread_pool_size[0]
        if n0 != n1:
            without = [x.name for x, n in ((base, n0), (a, n1)) if n is None]
            consequence = f"no per-group rows for {' and '.join(without)}" if without else \
                "per-group rows compare different groupings"
            notes.append(Note("thread_groups", "caution", f"thread groups differ: {base.name} {_tps_text(base)}, "
                              f"{a.name} {_tps_text(a)}: {consequence}"))
        servers0 = set(base.summary["inputs"].get("servers") or [])
        servers1 = set(a.summary["inputs"].get("servers") or [])
        if servers0 and servers1 and servers0 != servers1:
            notes.append(Note("servers", "caution", f"different servers: {base.name} {', '.join(sorted(servers0))}, "
                              f"{a.name} {', '.join(sorted(servers1))}"))
    changed = _settings_changes(analyses)
    if changed:
        notes.append(Note("settings", "info", "settings differ (capture.toml): " + "; ".join(changed)))
    unknown = [a.name for a in analyses if a.settings is None]
    if unknown:
        notes.append(Note("settings", "info", f"server settings unknown for {', '.join(unknown)} (no capture.toml "
                          "beside the captures): whether a setting changed cannot be told from the captures"))
    from .core.console import capture_problems

    for a in analyses:
        caps = a.summary.get("captures") or {}
        for q in [*(caps.get("app") or []), *([caps["db"]] if caps.get("db") else [])]:
            problem = capture_problems(q) if isinstance(q, dict) and "file" in q else None
            if problem:
                notes.append(Note("quality", "caution", f"{a.name}: {problem}"))
    return notes


def _apart(a: float, b: float) -> bool:
    return abs(a - b) > DIFFERENT_SHARE * max(a, b)


def _mix(base: Analysis, a: Analysis) -> tuple[float, int, int]:
    """Share of calls the two have in common by Query ID (Σ min of the shares; 1 = the same mix), and the Query IDs
    only one of them has."""
    s0 = base.x["query_id"].value_counts(normalize=True)
    s1 = a.x["query_id"].value_counts(normalize=True)
    if s0.empty or s1.empty:
        return (1.0 if s0.empty and s1.empty else 0.0), len(s0), len(s1)
    both = pd.concat([s0, s1], axis=1).fillna(0.0)
    return float(both.min(axis=1).sum()), int((both.iloc[:, 1] == 0).sum()), int((both.iloc[:, 0] == 0).sum())


def _settings_changes(analyses: list[Analysis]) -> list[str]:
    known = [a.settings for a in analyses if a.settings is not None]
    if len(known) < 2:
        return []
    out = []
    for key in SETTINGS:
        values = [a.settings.get(key) if a.settings is not None else "?" for a in analyses]
        if len({json.dumps(v) for v in values if v != "?"}) > 1:
            out.append(f"{key} " + " → ".join("(not set)" if v is None else str(v) for v in values))
    return out


def _or_unknown(v) -> str:
    return "unknown" if v is None else f"{v:g} s"


def _tps_text(a: Analysis) -> str:
    n, source = a.thread_pool_size
    handling = (a.settings or {}).get("thread_handling")
    if n is None:
        return f"none ({handling})" if handling and handling != "pool-of-threads" else "none (thread_pool_size unknown)"
    return f"thread_pool_size {n} ({source})"


def headline(c: Comparison) -> list[str]:
    """One line per headline metric: baseline → each later analysis (relative change against the baseline), and
    the per-second rates as well when the captures differ in length."""
    t = c.table
    lengths_differ = any(n.kind == "length" for n in c.notes)
    threshold = seconds_significant(c.slow_s)
    lines = []
    for label, scope, key, metric in (
            (f"exchanges slower than {threshold} on the wire", "overall", "all", "slow_wire"),
            ("hidden slow", "overall", "all", "hidden_slow"),
            ("in the slow log", "overall", "all", "in_slow_log"),
            ("understated in the slow log", "overall", "all", "understated"),
            ("p99 wire time", "overall", "all", "p99_s"),
            ("certain queueing, summed", "component", "queueing_certain", "sum_s")):
        rows = t[(t["scope"] == scope) & (t["key"] == key) & (t["metric"] == metric)].sort_values("step")
        if rows.empty:
            continue
        seconds = metric.endswith("_s")
        line = f"{label}: " + _chain(rows["value"], rows["change_pct"], seconds)
        if lengths_differ and metric in COUNTS:
            line += "; per second " + _chain(rows["per_second"], rows["per_second_change_pct"], False, rate=True)
        lines.append(line)
    return lines


POOL_ONLY = ("thread_pool_size", "thread_pool_stall_limit", "thread_pool_max_threads", "thread_pool_oversubscribe")


def label_steps(analyses: list[Analysis]) -> None:
    """Each analysis's label: the settings (capture.toml) in which a later step differs from the baseline, with
    this analysis's values ("thread_pool_stall_limit=10"); the thread_pool_* ones only where the pool runs. An
    analysis whose settings are unknown, or a comparison where none changed, keeps its name."""
    base = analyses[0].settings
    changed: list[str] = []
    for a in analyses[1:]:
        if a.settings is None or base is None:
            continue
        for key in SETTINGS:
            if key in ("product", "version") or key in changed:
                continue
            mine = a.settings.get(key)
            if mine is not None and mine != base.get(key) and _applies(a.settings, key):
                changed.append(key)
    for a in analyses:
        shown = [f"{k}={a.settings.get(k)}" for k in changed
                 if a.settings is not None and a.settings.get(k) is not None and _applies(a.settings, k)
                 and (a is base or a.step == 0 or a.settings.get(k) != (base or {}).get(k))]
        a.label = ", ".join(shown) or a.name


def _applies(settings: dict, key: str) -> bool:
    return key not in POOL_ONLY or settings.get("thread_handling", "pool-of-threads") == "pool-of-threads"


def sentence(c: Comparison) -> str:
    """What the change did, in one sentence: slow on the wire and hidden slow, from the baseline to each later
    step, each step named by its label."""
    t = c.table
    values = {}
    for metric in ("slow_wire", "hidden_slow"):
        rows = t[(t["scope"] == "overall") & (t["key"] == "all") & (t["metric"] == metric)].sort_values("step")
        values[metric] = rows["value"].tolist()
    slow, hidden = values["slow_wire"], values["hidden_slow"]
    if len(slow) != len(c.analyses) or len(c.analyses) < 2:
        return ""

    def n(v) -> str:
        return "unknown" if pd.isna(v) else f"{v:,.0f}"

    threshold = seconds_significant(c.slow_s)
    told = len(hidden) == len(slow) and not pd.isna(hidden[0])
    parts = []
    for i, a in enumerate(c.analyses[1:], 1):
        if i == 1:
            part = (f"{a.label} took the exchanges slower than {threshold} on the wire from {n(slow[0])} to "
                    f"{n(slow[i])}" + (f" and the hidden-slow ones from {n(hidden[0])} to {n(hidden[i])}" if told else ""))
        else:
            part = f"{a.label} to {n(slow[i])}" + (f" and {n(hidden[i])}" if told else "")
        parts.append(part)
    return f"Against {c.analyses[0].label}: " + "; ".join(parts) + "."


def _chain(values: pd.Series, pcts: pd.Series, seconds: bool, rate: bool = False) -> str:
    """'a → b (−x %) → c (+y %)'; against a baseline of 0 the change is absolute ('0 → 3 (+3)'), against an unknown
    one there is none."""
    def text_of(v) -> str:
        return seconds_significant(v) if seconds else (f"{v:,.2f}" if rate else f"{v:,.0f}")

    base = values.iloc[0]
    parts = []
    for i, (v, p) in enumerate(zip(values, pcts)):
        text = "unknown" if pd.isna(v) else text_of(v)
        if i and not pd.isna(v) and not pd.isna(base):
            if not pd.isna(p):
                text += f" ({pct_change(p)})"
            elif v == base:
                text += " (±0)"
            else:
                text += f" (+{text_of(v - base)})"
        parts.append(text)
    return " → ".join(parts)


# ------------------------------------------------------------------ the command


def compare(paths: list[Path], out_dir: Path | None = None, slow_s: float = SLOW_WIRE_S, csv: bool = False,
            quiet: bool = False, jobs: int | None = None, command_line: str | None = None) -> Comparison:
    """Compare the analyses (or capture sets, analysed here) in `paths`, in order; write the outputs as a set."""
    if not slow_s > 0:
        raise UsageError(f"--slow must be > 0 seconds, got {slow_s}")
    kinds = check_inputs(paths)
    out = out_dir if out_dir is not None else Path("reports") / ("compare-" + "-vs-".join(
        _safe_name(p.resolve().name) for p in paths))[:200]
    _check_out(out, paths)
    with staged_folder(out, [n for n in OUTPUT_NAMES if n != "analyses" or "capture set" in kinds]) as tmp:
        analyses = []
        for step, (path, kind) in enumerate(zip(paths, kinds)):
            if kind == "analysis":
                analyses.append(read_analysis(path, step))
                continue
            from .analysis import analyze, Options

            sub = Path("analyses") / f"{step}-{_safe_name(path.resolve().name)}"
            analyze(path,
                    Options(quiet=quiet, jobs=jobs, command_line=f"pcapdecomp analyze {path} (by pcapdecomp compare)"),
                    tmp / sub)
            a = read_analysis(tmp / sub, step, analysed_here=True)
            a.folder = out / sub
            analyses.append(a)
        _unique_names(analyses)
        c = Comparison(analyses, build_table(analyses, slow_s), [], notes_for(analyses), slow_s, out)
        c.headline = headline(c)
        label_steps(analyses)
        c.sentence = sentence(c)
        from .render.compare_page import render

        write_table(c.table, tmp / "comparison.parquet")
        names = ["comparison.parquet"]
        if csv:
            write_table(_csv_safe(c.table), tmp / "comparison.csv")
            names.append("comparison.csv")
        (tmp / "comparison.json").write_text(json.dumps(_json(c), indent=2, ensure_ascii=False) + "\n",
                                             encoding="utf-8")
        (tmp / "comparison.html").write_text(render(c, command_line), encoding="utf-8")
        names += ["comparison.json", "comparison.html"]
    c.written = [out / n for n in names]
    return c


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "analysis"


def _check_out(out: Path, inputs: list[Path]) -> None:
    for p in inputs:  # the output replaces its folder as a whole: never an input's
        if out.resolve() == p.resolve() or out.resolve() in p.resolve().parents:
            raise UsageError(f"--out {out} would replace the input {p}; choose another --out")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder")


def _unique_names(analyses: list[Analysis]) -> None:
    seen: dict[str, int] = {}
    for a in analyses:
        seen[a.name] = seen.get(a.name, 0) + 1
        if seen[a.name] > 1:
            a.name = f"{a.name} ({seen[a.name]})"


def _csv_safe(t: pd.DataFrame) -> pd.DataFrame:
    """Text cells a spreadsheet would run as a formula (=, +, -, @, tab, CR first) get a leading apostrophe: the
    fingerprint and the names come from captures and folders."""
    out = t.copy()
    for col in ("fingerprint", "analysis", "key"):
        s = out[col].astype("string")
        risky = s.str.match(r"^[=+\-@\t\r]").fillna(False)
        out[col] = s.where(~risky, "'" + s)
    return out


def _json(c: Comparison) -> dict:
    return {
        "pcapdecomp": __version__,
        "slow_threshold_s": c.slow_s,
        "analyses": [{
            "step": a.step, "name": a.name, "folder": str(a.folder), "analysed_here": a.analysed_here,
            "pcapdecomp": a.summary.get("pcapdecomp"), "span_s": a.span_s, "calls": a.calls,
            "calls_per_s": a.calls / a.span_s if a.span_s else None, "capture_points": a.capture_points,
            "slow_log": a.slow_log_used, "long_query_time": a.long_query_time,
            "thread_pool_size": a.thread_pool_size[0], "settings": a.settings, "label": a.label,
        } for a in c.analyses],
        "headline": c.headline,
        "sentence": c.sentence,
        "counts": c.counts(),
        "comparable": c.comparable,
        "notes": [{"kind": n.kind, "severity": n.severity, "text": n.text} for n in c.notes],
    }
