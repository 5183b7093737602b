"""How right the queueing split is on a lab recording, against its ground truth (issue 31's acceptance numbers).

For every statement of truth.jsonl found on the wire: its true wait = wire server time − performance_schema's
execution (capped by the server time: performance_schema's timer can outlast the wire, method notes). Printed:

- of statements that truly waited ≥ 100 ms, the share whose queue_s is within max(30 ms, 25 %) of it (target ≥ 90 %);
- of those that waited < 10 ms, the share with queue_s < 50 ms (target ≥ 99 %);
- the share of statements whose thread_group is the server's (truth's thread_group; target ≥ 95 %);
- whether the verdict names a culprit, and which connection.

    python3 scripts/field_accuracy.py captures/stall-fix-1-pool --long-query-time 1 [--thread-pool-size N]
        [--slow-log-min 1.0] [--no-slow-log]
    python3 scripts/field_accuracy.py DIR --as-set     # `analyze DIR` as a new user runs it (capture.toml, …)

--slow-log-min S keeps only the slow-log entries with Query_time ≥ S (what a server at long_query_time S would have
logged). The run's numbers are printed as one JSON line (and a few readable lines before it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pcapdecomp.analysis import Options, analyze, capture_set  # noqa: E402

MATCH_WINDOW_NS = 20_000_000  # an exchange's A1 lies this close to the client's send time


def filtered_slow_log(src: Path, dst: Path, min_s: float) -> Path:
    """The entries of slow log `src` with Query_time ≥ min_s, written to `dst` (headers kept)."""
    text = src.read_text(errors="replace")
    head, *entries = re.split(r"(?m)^(?=# (?:Time|User@Host):)", text)
    kept, pending = [head], ""
    for e in entries:
        if e.startswith("# Time:") and "# Query_time" not in e:
            pending += e  # a bare "# Time:" line belongs to the next entry
            continue
        m = re.search(r"# Query_time:\s*([0-9.]+)", e)
        if m and float(m.group(1)) >= min_s:
            kept.append(pending + e)
        pending = ""
    dst.write_text("".join(kept))
    return dst


def truth_joined(x: pd.DataFrame, truth_path: Path) -> pd.DataFrame:
    """Truth rows with their exchange's columns (xi: row in x), joined by statement text and send time (and by
    connection id where the exchange knows it)."""
    t = pd.read_json(truth_path, lines=True)
    t = t[t["exec_s"].notna()].copy()
    t["ti"] = np.arange(len(t))
    e = x[x["app_req_ts"].notna()].copy()
    e["a1"] = e["app_req_ts"].astype("int64")
    e["xi"] = e.index
    e = e[["xi", "a1", "sql", "conn_id"]].astype({"sql": object})
    e["x_conn"] = e.pop("conn_id").astype("float64")
    m = t.merge(e, on="sql", how="inner")
    m = m[m["x_conn"].isna() | (m["x_conn"] == m["conn_id"].astype("float64"))]
    m["d"] = (m["a1"] - m["client_send_ns"]).abs()
    m = m[m["d"] < MATCH_WINDOW_NS].sort_values("d").drop_duplicates("ti").drop_duplicates("xi")
    return m.sort_values("ti").reset_index(drop=True)


def measure(set_dir: Path, long_query_time: float | None, thread_pool_size: int | None, slow_min: float | None,
            no_slow_log: bool, out: Path, as_set: bool = False) -> dict:
    slow = None if no_slow_log else set_dir / "slow.log"
    if slow is not None and slow_min is not None:
        slow = filtered_slow_log(slow, out / "slow-filtered.log", slow_min)
    if as_set:
        res = analyze(set_dir, Options(quiet=True), out / "analysis")
    else:
        res = analyze(capture_set(app=[set_dir / "app.pcap"], db=set_dir / "db.pcap", slow_log=slow,
                                  long_query_time=long_query_time, thread_pool_size=thread_pool_size),
                      Options(quiet=True), out / "analysis")
    x = res.exchanges
    m = truth_joined(x, set_dir / "truth.jsonl")
    rows = x.loc[m["xi"].astype(int)].reset_index(drop=True)
    server = rows["server_s"].to_numpy(dtype="float64", na_value=np.nan)
    true_exec = np.minimum(m["exec_s"].to_numpy(dtype="float64"), server)
    wait = server - true_exec
    queue = rows["queue_s"].to_numpy(dtype="float64", na_value=np.nan)
    waited, fast = wait >= 0.1, wait < 0.01
    close = np.abs(queue - wait) <= np.maximum(0.03, 0.25 * wait)
    groups = rows["thread_group"].to_numpy(dtype="float64", na_value=np.nan)
    group_right = groups == m["thread_group"].to_numpy(dtype="float64")
    sentence = res.summary["story"]["sentence"]
    named = sorted({int(c) for c in re.findall(r"\(connection (\d+)", sentence)})
    hogs = m.loc[true_exec >= 0.1, "conn_id"].astype(int)
    truth_culprits = sorted(set(hogs))
    out_numbers = {
        "set": set_dir.name, "long_query_time": long_query_time, "thread_pool_size": thread_pool_size,
        "slow_log_min": slow_min, "no_slow_log": no_slow_log,
        "statements": int(len(m)), "truth_rows": int(sum(1 for _ in open(set_dir / "truth.jsonl"))),
        "waited_100ms": int(waited.sum()),
        "waited_100ms_close": int((waited & close).sum()),
        "share_close": float((waited & close).sum() / waited.sum()) if waited.any() else None,
        "waited_under_10ms": int(fast.sum()),
        "share_under_10ms_queue_below_50ms": float((fast & (np.nan_to_num(queue) < 0.05)).sum() / fast.sum())
        if fast.any() else None,
        "share_thread_group_right": float(group_right.mean()) if len(m) else None,
        "culprits_named": named, "culprits_truth": truth_culprits,
        "culprit_named": bool(named) and set(named) <= set(truth_culprits),
        "thread_pool_size_found": res.summary["thread_pool_size"]["value"],
        "sentence": sentence,
    }
    return out_numbers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("set_dir", type=Path)
    ap.add_argument("--long-query-time", type=float)
    ap.add_argument("--thread-pool-size", type=int)
    ap.add_argument("--slow-log-min", type=float)
    ap.add_argument("--no-slow-log", action="store_true")
    ap.add_argument("--as-set", action="store_true", help="analyze the folder as a capture set (capture.toml, …)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        n = measure(a.set_dir, a.long_query_time, a.thread_pool_size, a.slow_log_min, a.no_slow_log, Path(tmp),
                    a.as_set)
    print(f"{n['set']}: lqt={n['long_query_time']} size={n['thread_pool_size']} slow≥{n['slow_log_min']}"
          f"{' no slow log' if n['no_slow_log'] else ''}")
    print(f"  waited ≥ 100 ms: {n['waited_100ms']}, queue_s within max(30 ms, 25 %): {n['waited_100ms_close']}"
          f" ({n['share_close']})")
    print(f"  waited < 10 ms: {n['waited_under_10ms']}, queue_s < 50 ms: {n['share_under_10ms_queue_below_50ms']}")
    print(f"  thread group right: {n['share_thread_group_right']} (size found {n['thread_pool_size_found']})")
    print(f"  culprits named {n['culprits_named']} (truth {n['culprits_truth']})")
    print(f"  {n['sentence']}")
    print(json.dumps(n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
