#!/usr/bin/env python3
"""How `pcapdecomp analyze` fares when frames are lost at a capture point, against the client's own record.

    python3 scripts/loss_acceptance.py CAPTURE_SET [--pattern app:0.01] [--pattern both:0.01] ... [--seeds 1,2,3]
                                        [--work DIR]

CAPTURE_SET is a lab recording (app.pcap, db.pcap, truth.jsonl, capture.toml; `pcapdecomp lab record
oltp-prepared`). For each pattern (`app`, `db` or `both`, and a loss rate) and seed, frames are dropped from copies
of the captures (scripts/lose_frames.py; `both` draws independently at each point with seeds s and s + 1000), the
copies are analysed in-process, and each client statement in truth.jsonl is classified:

- **full**: one exchange row seen at both points with all four times measured, each inside the client's own
  [send, receive] span (A1 and A4 exactly: the app capture and the client share the host's clock; D1 and D4
  within the clock's bound);
- **bounded**: decomposed with a bound: one or more of the four times is named in `bounded` (taken from the other
  point) with the duration bounds set, the measured times inside the client's span and the bounds containing it;
- **lost**: no decomposition, and the row(s) say why (`match_notes` or `problems`, or no row at all when the
  statement's bytes were lost at both points);
- **unmarked**: no decomposition and nothing says why;
- **wrong**: a time outside the client's span (paired with another exchange's times), a bound that excludes the
  truth, or a statement paired with a different one.

Prints one line per pattern and seed, and a table over all seeds. tests/test_repair.py runs it on the bundled
`captures/oltp-prepared` recording.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lose_frames import lose_frames  # noqa: E402

CLASSES = ("full", "bounded", "lost", "unmarked", "wrong")
DB_TOLERANCE_NS = 200_000  # D1/D4 are on the app clock through the fitted clock model: allow its error
STATEMENT_COMMANDS = ("COM_QUERY", "COM_STMT_EXECUTE")


def truth_statements(path: Path) -> pd.DataFrame:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    t = pd.DataFrame(rows)
    t = t[t["command"].isin(STATEMENT_COMMANDS) & t["conn_id"].notna()].reset_index(drop=True)
    t["param"] = t["note"].fillna("").str.extract(r"id=(\d+)", expand=False)
    return t


def _ns(col: pd.Series) -> np.ndarray:
    return col.astype("datetime64[ns, UTC]").to_numpy(dtype="datetime64[ns]").astype("int64")


POINT_COLUMNS = ("app_req_ts", "app_resp_ts", "db_req_ts", "db_resp_ts")
CLOCK_CHANGE_NS = 5_000  # D1/D4 on the app clock move by the clock fit's change between two analyses


def _rows_by_statement(truth: pd.DataFrame, exchanges: pd.DataFrame) -> list[list[dict]]:
    """For each truth statement, the analysis rows that are it: same connection id, command, text (and for an
    EXECUTE the same parameter), with a time inside the client's [send, receive] span."""
    x = exchanges[exchanges["command"].isin(STATEMENT_COMMANDS) & exchanges["conn_id"].notna()].copy()
    x["conn_id"] = x["conn_id"].astype("int64")
    for col in ("sql", "params", "seen", "bounded", "match_notes", "problems"):
        if col in x.columns:
            x[col] = x[col].astype(object).where(x[col].notna(), None)
    for col in POINT_COLUMNS:
        valid = x[col].notna().to_numpy()
        x[col + "_ns"] = np.where(valid, _ns(x[col].fillna(pd.Timestamp(0, tz="UTC"))), -1)
    by_key: dict[tuple, list[dict]] = {}
    for row in x.to_dict("records"):
        by_key.setdefault((row["conn_id"], row["command"], row["sql"]), []).append(row)
    out = []
    for t in truth.to_dict("records"):
        send, recv = int(t["client_send_ns"]), int(t["client_recv_ns"])
        rows = by_key.get((int(t["conn_id"]), t["command"], t["sql"]), [])
        if t["command"] == "COM_STMT_EXECUTE" and isinstance(t["param"], str):
            rows = [r for r in rows if r["params"] is None or str(r["params"]) == t["param"]]
        out.append([r for r in rows if _touches(r, send, recv)])
    return out


def classify(truth: pd.DataFrame, exchanges: pd.DataFrame, reference: pd.DataFrame | None = None) -> pd.Series:
    """One class (CLASSES) per truth statement, from the analysis table `exchanges`. With `reference` (the analysis
    of the same recording without loss), a measured time must equal the reference's (A1/A4 exactly, D1/D4 within
    the clock fit's change) and a bound must contain the reference's duration."""
    mine = _rows_by_statement(truth, exchanges)
    refs = _rows_by_statement(truth, reference) if reference is not None else [None] * len(truth)
    out = [_one(rows, ref, t) for rows, ref, t in zip(mine, refs, truth.to_dict("records"))]
    return pd.Series(out, index=truth.index, dtype="object")


def _touches(r: dict, send: int, recv: int) -> bool:
    for col, tol in zip(POINT_COLUMNS, (0, 0, DB_TOLERANCE_NS, DB_TOLERANCE_NS)):
        v = r[col + "_ns"]
        if v >= 0 and send - tol <= v <= recv + tol:
            return True
    return False


def _num(v) -> float | None:
    return None if v is None or v != v else float(v)


def _one(rows: list[dict], ref: list[dict] | None, t: dict) -> str:
    if not rows:
        return "lost"
    send, recv, client_s = int(t["client_send_ns"]), int(t["client_recv_ns"]), float(t["client_s"])
    r0 = ref[0] if ref and len(ref) == 1 else None
    for r in rows:
        for col, tol in zip(POINT_COLUMNS, (0, 0, DB_TOLERANCE_NS, DB_TOLERANCE_NS)):
            v = r[col + "_ns"]
            if v >= 0 and not send - tol <= v <= recv + tol:
                return "wrong"
            if v >= 0 and r0 is not None and r0[col + "_ns"] >= 0 \
                    and abs(v - r0[col + "_ns"]) > (0 if col.startswith("app") else CLOCK_CHANGE_NS):
                return "wrong"
        total = _num(r.get("total_s"))
        if total is not None and total > client_s + 1e-9:
            return "wrong"
        for name in ("total_s", "server_s", "network_s"):
            lo, hi = _num(r.get(name + "_lo")), _num(r.get(name + "_hi"))
            if lo is not None and lo > client_s + DB_TOLERANCE_NS / 1e9:
                return "wrong"
            truth_value = _num(r0.get(name)) if r0 is not None else None
            if truth_value is not None and _num(r.get(name)) is None and (
                    (lo is not None and truth_value < lo - CLOCK_CHANGE_NS / 1e9)
                    or (hi is not None and truth_value > hi + CLOCK_CHANGE_NS / 1e9)):
                return "wrong"
    both = [r for r in rows if r["seen"] == "both"]
    if len(both) == 1 and len(rows) == 1:
        r = both[0]
        measured = [r[c + "_ns"] >= 0 for c in POINT_COLUMNS]
        if all(measured):
            return "full"
        named = set((r.get("bounded") or "").split(","))
        missing = {p for p, ok in zip(("A1", "A4", "D1", "D4"), measured) if not ok}
        if missing <= named:
            return "bounded"
    return "lost" if all(_marked(r) for r in rows) else "unmarked"


def _marked(r: dict) -> bool:
    return any(isinstance(r.get(col), str) and r.get(col) for col in ("match_notes", "problems", "bounded"))


def run_pattern(capture_set: Path, where: str, rate: float, seed: int, work: Path,
                reference: pd.DataFrame | None = None) -> tuple[pd.Series, dict]:
    """Copy the set into `work` with frames lost as the pattern says, analyse it, classify the statements."""
    import shutil

    from pcapdecomp.analysis import Options, analyze

    work.mkdir(parents=True, exist_ok=True)
    for name in ("capture.toml", "slow.log"):
        if (capture_set / name).exists():
            shutil.copyfile(capture_set / name, work / name)
    lost = {}
    for point, point_seed in (("app", seed), ("db", seed + 1000 if where == "both" else seed)):
        if where in (point, "both"):
            lost[point] = lose_frames(capture_set / f"{point}.pcap", work / f"{point}.pcap", rate, point_seed)[1]
        else:
            shutil.copyfile(capture_set / f"{point}.pcap", work / f"{point}.pcap")
    result = analyze(work, Options(quiet=True, jobs=1), work / "out")
    truth = truth_statements(capture_set / "truth.jsonl")
    return classify(truth, result.exchanges, reference), {"frames_lost": {k: len(v) for k, v in lost.items()},
                                                         "summary": result.summary, "exchanges": result.exchanges}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("capture_set", type=Path)
    parser.add_argument("--pattern", action="append", help="app|db|both:RATE (default: the four of issue 15)")
    parser.add_argument("--seeds", default="1", help="comma-separated seeds")
    parser.add_argument("--work", type=Path, help="folder for the lossy copies and outputs (default: a temporary one)")
    args = parser.parse_args(argv)
    patterns = args.pattern or ["app:0.01", "db:0.01", "both:0.01", "app:0.05"]
    seeds = [int(s) for s in args.seeds.split(",")]
    table = []
    with tempfile.TemporaryDirectory(prefix="loss-") as tmp:
        work = args.work or Path(tmp)
        reference = run_pattern(args.capture_set, "app", 0.0, 0, work / "reference")[1]["exchanges"]
        for pattern in patterns:
            where, rate = pattern.split(":")
            total = pd.Series(0, index=list(CLASSES))
            for seed in seeds:
                classes, info = run_pattern(args.capture_set, where, float(rate), seed, work / f"{where}-{rate}-{seed}",
                                            reference)
                counts = classes.value_counts().reindex(list(CLASSES), fill_value=0)
                total += counts
                print(f"{pattern} seed {seed}: frames lost {info['frames_lost']}; "
                      + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
            n = int(total.sum())
            table.append((pattern, n, *total.tolist()))
    print("\n| loss | statements | full | bounded+marked | lost (marked) | unmarked | wrong | decomposed |")
    print("|---|---|---|---|---|---|---|---|")
    for pattern, n, full, bounded, lost, unmarked, wrong in table:
        print(f"| {pattern} | {n} | {full} | {bounded} | {lost} | {unmarked} | {wrong} | "
              f"{100 * (full + bounded) / max(n, 1):.2f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
