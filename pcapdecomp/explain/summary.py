"""summary.json: what one analysis found, as one JSON document (its keys are declared in schema.SUMMARY_KEYS and
printed by `pcapdecomp columns`). The inputs, each capture point's quality, the matching, proxy, repair and clock
results, the slow-log join, counts and latency quantiles, the thread-pool view of the (first) DB server, and the
verdict (verdict.tell), told per DB server when there are several."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .. import __version__
from ..core.groups import nearest_rank
from ..read.captureset import CaptureSet
from ..read.connids import conn_id_sources
from .threadpool import PoolView, json_value
from .verdict import tell, tell_proxy, tls_part


class NotFromRuns(ValueError):
    """summary.build from the partitions' runs is made for one DB point, not through a proxy: through a proxy the
    two sides are different TCP connections and the partitioned path does not apply (docs/partitioned.md §3); with
    several DB points the verdict is told per point."""


@dataclass
class ServerPart:
    """What the summary reads of one DB point's analysis: its thread-pool view and its slow-log join."""

    point: str | None  # the DB point's name; None without a DB capture
    view: PoolView
    slow_info: dict  # summary.json → slow_log


def build(cs: CaptureSet, *, names: dict[str, list[str]], points: list[dict], qualities: dict[str, list[dict]],
          matching: dict, proxy: dict | None, repair: dict | None, clocks: dict, servers: list[ServerPart],
          exchanges: pd.DataFrame | None, warnings: list[str], scheduler: str | None, through_proxy: bool,
          latency: dict | None = None, runs=None) -> dict:
    """summary.json's content. `names` and `qualities`: the app, DB and proxy points' names and capture-quality
    dicts ("app", "dbs", "proxy"), as the stages used them; `clocks`: per app/DB pair, `pair.clocks.clock_entry`; `servers`: one
    per DB point, in order; `through_proxy`: the decomposition ran through a proxy (its sentence joins the
    verdict). `warnings` is kept as given: notes added to it later are in the file too. `latency`: summary.json →
    latency_s as `latency_quantiles(exchanges)` gives it, made elsewhere (analysis.py); None: made here. `runs`:
    instead of `exchanges`, the partitions' runs (explain.summaryruns.SummaryOfRuns, fed), which make the same
    parts from them (one DB point, not through a proxy)."""
    first = servers[0]
    if runs is not None and (through_proxy or len(servers) > 1):
        raise NotFromRuns("through a proxy" if through_proxy else f"{len(servers)} DB points")
    made = runs.parts() if runs is not None else None
    summary = {
        "set": cs.name,
        "verdict": "",
        "pcapdecomp": __version__,
        "inputs": {
            "app": names["app"], "db": names["dbs"][0] if names["dbs"] else None,
            "dbs": names["dbs"],
            "slow_log": str(cs.slow_log) if cs.slow_log else None,
            "slow_logs": {k: str(v) for k, v in cs.slow_logs.items()},
            "long_query_time": cs.long_query_time,
            "thread_pool_size": cs.thread_pool_size, "servers": cs.servers,
            "proxy": names["proxy"], "proxy_servers": cs.proxy_servers,
            "cwd": os.getcwd(),  # relative capture paths above (and in exchanges.capture) are relative to this
            "scheduler": scheduler,
            "processlist": str(cs.processlist) if cs.processlist is not None else None,
            "tls_keylogs": [str(p) for p in cs.tls_keylogs],
        },
        # analyze --since/--until: the time window whose exchanges were kept (absent without one)
        **({"window": cs.window.summary()} if cs.window is not None else {}),
        "points": points,
        "captures": {"app": qualities["app"],
                     "db": qualities["dbs"][0] if qualities["dbs"] else None,
                     "dbs": qualities["dbs"],
                     "proxy": qualities["proxy"]},
        "match": matching,
        "proxy": proxy,
        "repair": repair,
        "clock": next(iter(clocks.values()), None),
        "clocks": clocks,
        "slow_log": first.slow_info,
        "exchanges": made["exchanges"] if made else _counts(exchanges),
        "conn_ids": made["conn_ids"] if made else conn_id_sources(exchanges),
        "latency_s": (made["latency_s"] if made else latency if latency is not None
                      else latency_quantiles(exchanges)),
        "thread_pool_size": first.view.thread_pool_size,
        "pool": first.view.pool_summary,
        "groups": first.view.groups_summary,
        "warnings": warnings,
    }
    if runs is not None:
        summary.update(runs.tell(summary))
    else:
        _tell(summary, cs, exchanges, servers, clocks, points)
    if through_proxy:
        summary.update(tell_proxy(summary, exchanges))
    summary["tls"] = tls_part(qualities)
    if summary["tls"] is not None:  # how much of the traffic could be read comes first
        summary["verdict"] = f"{summary['tls']['sentence']}\n{summary['verdict']}"
    return summary


def _tell(summary: dict, cs: CaptureSet, exchanges: pd.DataFrame, servers: list[ServerPart], clocks: dict,
          points: list[dict]) -> None:
    """The verdict parts (verdict.tell) into `summary`: of the one DB server; with several, of the first at the top
    (its exchanges and those no DB point saw) and of each in `servers`, the others' sentences as bullets."""
    first = servers[0]
    if len(servers) == 1:
        summary.update(tell(summary, exchanges, first.view))
        return
    mine = exchanges[exchanges["db_point"].astype(object).isin([first.point, None])
                     | exchanges["db_point"].isna()].reset_index(drop=True)
    top = _point_summary(summary, mine, first, clocks)
    # the count line above the other servers' bullets says whose exchanges it counts, and how many there are in all
    top["counted"] = {"server": _server_name(cs, points, first.point, [e.point for e in servers]),
                      "total": len(exchanges), "servers": len(servers)}
    summary.update(tell(top, mine, first.view))
    told = []
    for d in servers:
        x = exchanges[(exchanges["db_point"].astype(object) == d.point).to_numpy()].reset_index(drop=True)
        part = _point_summary(summary, x, d, clocks)
        part.update(tell(part, x, d.view))
        told.append({"point": d.point, "name": _server_name(cs, points, d.point, [e.point for e in servers]),
                     "endpoints": next((e["servers"] for e in points if e["name"] == d.point), []),
                     **{k: part[k] for k in ("exchanges", "slow_log", "thread_pool_size", "pool", "groups",
                                             "story", "verdict", "hidden_slow", "understated", "queueing")}})
    summary["servers"] = told
    extra = [f"- Server {s['name']}: {s['story']['sentence']}" for s in told[1:]]
    summary["verdict"] = "\n".join([summary["verdict"], *extra])


def to_json(summary: dict) -> str:
    """The file's text: strict JSON (no NaN or infinity), indented, UTF-8 as is."""
    return json.dumps(_finite(summary), indent=2, ensure_ascii=False, allow_nan=False, default=_json_default) + "\n"


def _server_name(cs: CaptureSet, points_info: list[dict], point: str | None, every: list) -> str:
    """How the verdict names a DB point: its --server NAME= when one of its endpoints has one, else the point's
    file name, with as many of its folders as tell it from the other DB points (`every`): primary/db.pcap and
    replica/db.pcap, not db.pcap twice."""
    entry = next((e for e in points_info if e["name"] == point), None)
    for endpoint in (entry or {}).get("servers", []):
        if endpoint in cs.server_names:
            return cs.server_names[endpoint]
    parts = Path(str(point)).parts
    others = [Path(str(p)).parts for p in every if str(p) != str(point)]
    for k in range(1, len(parts) + 1):
        if all(o[-k:] != parts[-k:] for o in others):
            return str(Path(*parts[-k:]))
    return str(point)


def _point_summary(summary: dict, x: pd.DataFrame, done: ServerPart, clock_info: dict) -> dict:
    """The summary parts the verdict reads, for one DB point."""
    part = dict(summary)
    part.update({"exchanges": _counts(x), "slow_log": done.slow_info,
                 "thread_pool_size": done.view.thread_pool_size, "pool": done.view.pool_summary,
                 "groups": done.view.groups_summary,
                 "clock": next((c for c in clock_info.values() if c.get("db") == done.point), None)})
    return part


def _counts(x: pd.DataFrame) -> dict:
    seen = x["seen"].value_counts()
    return {
        "total": len(x), "seen_both": int(seen.get("both", 0)), "seen_app": int(seen.get("app", 0)),
        "seen_db": int(seen.get("db", 0)), "hidden_slow": int(x["hidden_slow"].fillna(False).sum()),
        "in_slow_log": int(x["in_slow_log"].fillna(False).sum()),
        "server_flag_slow": int(x["server_flag_slow"].fillna(False).sum()),
        "match_conflicts": _containing(x["match_notes"], "match-conflict"),
        "repaired": _containing(x["match_notes"], "repaired-at"),
        "bounded": int(x["bounded"].notna().sum()),
    }


def _containing(column: pd.Series, text: str) -> int:
    """How many values of a text column contain `text`: for a categorical one, its categories are searched, not
    its rows."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        categories = column.cat.categories
        hit = np.flatnonzero(pd.Series(categories, dtype="string").str.contains(text, regex=False).fillna(False)
                             .to_numpy(dtype=bool))
        if not len(hit):
            return 0
        return int(np.bincount(column.cat.codes.to_numpy(np.int64) + 1, minlength=len(categories) + 1)[hit + 1].sum())
    return int(column.astype("string").str.contains(text).fillna(False).sum())


def latency_quantiles(x: pd.DataFrame) -> dict:
    """summary.json → latency_s: count, sum, p50, p99 and max of each duration column (the decomposition's)."""
    out = {}
    for col in ("total_s", "server_s", "network_s", "net_req_s", "net_resp_s", "queue_s", "exec_s"):
        values = x[col].to_numpy(dtype="float64", na_value=np.nan)
        v = values[~np.isnan(values)]
        p50, p99 = nearest_rank(v, [0.5, 0.99]) if len(v) else (None, None)
        out[col.removesuffix("_s")] = None if not len(v) else {
            "count": int(len(v)), "sum": float(pd.Series(v).sum()), "p50": float(p50), "p99": float(p99),
            "max": float(v.max()),
        }
    return out


def _finite(v):
    """summary.json is strict JSON: a number that is not finite (a one-sided clock bound is infinite) is null."""
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if isinstance(v, (float, np.floating)) and not np.isfinite(v):
        return None
    return v


def _json_default(v):
    value = json_value(v)
    if value is v:
        raise TypeError(f"not JSON serialisable: {type(v)}")
    return value
