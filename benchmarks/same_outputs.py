#!/usr/bin/env python3
"""Speed work must not change a result: the outputs of this tree and of a reference tree (say, main before the
change) compared on every capture there is.

    git worktree add /tmp/ref main && (cd /tmp/ref && python3 setup.py build_ext --inplace -q)
    python3 benchmarks/same_outputs.py --reference /tmp/ref            # every capture below
    python3 benchmarks/same_outputs.py --reference /tmp/ref --quick    # the bundled sets and the corpus, `analyze` only
    python3 benchmarks/same_outputs.py --reference /tmp/ref --pair A.pcap D.pcap   # one more pair (a benchmark's)
    python3 benchmarks/same_outputs.py --reference /tmp/ref --quick --spill  # each `analyze` also with --spill DIR

Runs, with each tree's own CLI (a child process, `--jobs 1` and the default `--jobs`):
  - `analyze` of every capture set under captures/ (app + DB + slow log + capture.toml);
  - `analyze --db X` and `analyze --app X` of every other capture: tests/data and /work/shared/corpus (or
    $PCAPDECOMP_CORPUS), and the bundled captures converted to pcapng and gzip-compressed pcapng (the formats the
    fast lane reads since it reads pcapng);
  - `exchanges X --connections` of each of them.
With --spill, each `analyze` runs once more in both trees with `--spill DIR` (the partitioned run, or its line
saying why a set is analysed in memory): a change to the partitioned run is compared on every capture too, not only
on the sets too big for memory. Compares exchanges.parquet, groups.parquet, pool.parquet and summary.json (all but the working folder) value for
value, and report.html byte for byte. Prints one line per difference and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
CORPUS = Path(os.environ.get("PCAPDECOMP_CORPUS", "/work/shared/corpus"))


def run(tree: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PCAPDECOMP_NO_LANE"}
    return subprocess.run([sys.executable, "-m", "pcapdecomp.cli", *argv], cwd=tree, env=env, capture_output=True,
                          text=True)


def tree_neutral(text: str, tree: Path) -> str:
    """`text` with the tree's own files named alike for both trees (a traceback's). Not every path below the tree:
    the captures of tests/data are this tree's for both runs, and their paths must stay as they are."""
    return text.replace(str(tree / "pcapdecomp"), "TREE/pcapdecomp")


def same_table(a: Path, b: Path) -> str | None:
    import pandas as pd

    if a.exists() != b.exists():
        return f"{a.name}: written by one tree only"
    if not a.exists():
        return None
    try:
        pd.testing.assert_frame_equal(pd.read_parquet(a), pd.read_parquet(b))
    except AssertionError as err:
        return f"{a.name}: {str(err).splitlines()[0:3]}"
    return None


def same_summary(a: Path, b: Path) -> str | None:
    if a.exists() != b.exists():
        return "summary.json: written by one tree only"
    if not a.exists():
        return None
    left, right = json.loads(a.read_text()), json.loads(b.read_text())
    for s in (left, right):
        s.get("inputs", {}).pop("cwd", None)
    if left != right:
        keys = sorted(k for k in set(left) | set(right) if left.get(k) != right.get(k))
        return f"summary.json: differs in {keys}"
    return None


def compare_analyze(ref: Path, argv: list[str], work: Path) -> list[str]:
    out = {}
    folder = work / "out"  # the same for both: report.html shows the command line
    for name, tree in (("reference", ref), ("this", REPO)):
        done = run(tree, ["analyze", *argv, "-q", "--out", str(folder)])
        kept = work / name
        if folder.exists():
            folder.rename(kept)
        out[name] = (done.returncode, tree_neutral(done.stderr, tree), kept)
    (rc_a, err_a, a), (rc_b, err_b, b) = out["reference"], out["this"]
    problems = []
    if rc_a != rc_b or err_a != err_b:
        problems.append(f"exit {rc_a} vs {rc_b}; stderr {err_a[-200:]!r} vs {err_b[-200:]!r}")
    if rc_a == 0 and rc_b == 0:
        for name in ("exchanges.parquet", "groups.parquet", "pool.parquet"):
            problems.append(same_table(a / name, b / name))
        problems.append(same_summary(a / "summary.json", b / "summary.json"))
        if (a / "report.html").read_bytes() != (b / "report.html").read_bytes():
            problems.append("report.html differs")
    return [p for p in problems if p]


def compare_exchanges(ref: Path, capture: Path, work: Path) -> list[str]:
    out = {}
    for name, tree in (("reference", ref), ("this", REPO)):
        table, conns = work / "x.parquet", work / "c.parquet"
        done = run(tree, ["exchanges", str(capture), "--out", str(table), "--connections", str(conns)])
        kept = (work / f"{name}-x.parquet", work / f"{name}-c.parquet")
        for made, keep in zip((table, conns), kept):
            if made.exists():
                made.rename(keep)
        out[name] = (done.returncode, done.stdout, tree_neutral(done.stderr, tree), *kept)
    a, b = out["reference"], out["this"]
    problems = []
    if a[:3] != b[:3]:
        problems.append(f"exit, summary or warnings differ: {a[0]} vs {b[0]}")
    if a[0] == 0 and b[0] == 0:
        problems += [same_table(a[3], b[3]), same_table(a[4], b[4])]
    return [p for p in problems if p]


def pcapng_copies(work: Path) -> list[Path]:
    """The bundled captures as pcapng (two interfaces, nanosecond and microsecond clocks) and as pcapng.gz."""
    import gzip

    from pcaptools import to_pcapng

    out = []
    for pcap in sorted((REPO / "captures").glob("*/*.pcap")):
        ng = work / f"{pcap.parent.name}-{pcap.stem}.pcapng"
        to_pcapng(pcap, ng, interfaces=2)
        gz = ng.with_name(ng.name + ".gz")
        gz.write_bytes(gzip.compress(ng.read_bytes(), compresslevel=1))
        out += [ng, gz]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, required=True, help="a pcapdecomp tree (its extensions built)")
    ap.add_argument("--quick", action="store_true", help="only `analyze`, of the sets and the corpus")
    ap.add_argument("--pair", nargs=2, type=Path, metavar=("APP", "DB"), help="also analyse this pair")
    ap.add_argument("--spill", action="store_true",
                    help="each `analyze` also with --spill DIR (the partitioned run), in both trees")
    args = ap.parse_args()
    ref = args.reference.resolve()
    differences = 0
    checked = 0
    with tempfile.TemporaryDirectory(prefix="same-outputs-") as tmp:
        work = Path(tmp)
        jobs_options = [["--jobs", "1"]] if args.quick else [["--jobs", "1"], []]
        cases: list[tuple[str, list[str] | Path]] = []
        for folder in sorted(p for p in (REPO / "captures").iterdir() if (p / "capture.toml").exists()):
            cases += [(f"analyze {folder.name} {' '.join(j)}", [str(folder), *j]) for j in jobs_options]
        if args.pair:
            cases.append(("analyze pair", ["--app", str(args.pair[0].resolve()), "--db", str(args.pair[1].resolve())]))
        singles = sorted(CORPUS.rglob("*.pcap*")) if CORPUS.exists() else []
        if not args.quick:
            singles += sorted((REPO / "tests" / "data").rglob("*.pcap*")) + pcapng_copies(work)
        for capture in singles:
            sides = [["--db"]] if args.quick else [["--db"], ["--app"]]
            cases += [(f"analyze {side[0]} {capture}", [*side, str(capture)]) for side in sides]
            if not args.quick:
                cases.append((f"exchanges {capture}", capture))
        if args.spill:  # the same folder for both trees: a message that names it reads alike
            spill = ["--spill", str(work / "spill")]
            cases += [(f"{label} --spill", [*case, *spill]) for label, case in cases if not isinstance(case, Path)]
        for label, case in cases:
            case_dir = work / f"case{checked}"
            case_dir.mkdir()
            found = (compare_exchanges(ref, case, case_dir) if isinstance(case, Path)
                     else compare_analyze(ref, case, case_dir))
            checked += 1
            for problem in found:
                differences += 1
                print(f"DIFFERENT {label}: {problem}", flush=True)
    print(f"same_outputs: {checked} runs compared, {differences} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
