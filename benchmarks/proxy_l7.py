#!/usr/bin/env python3
"""Wall time of the L7 proxy matcher (pcapdecomp/pair/proxy.py match_l7) on the bundled proxy-pool recording (Gaea, a
pool of 2 for 8 clients) repeated: copies one after the other (a longer capture) and copies 1 ms apart (a busier
one, where the identical `SELECT 1` of many clients fit many server requests at once). The copies are made as in
tests/test_proxy_scale.py, which checks that the matcher's work grows linearly; this prints the seconds.

    python3 benchmarks/proxy_l7.py [--long 100,1000] [--busy 100,400]"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # this checkout's package and its tests' recording helpers

from test_proxy_scale import POOL, _span, copies  # noqa: E402

from pcapdecomp.pair.proxy import Side, _subset, match_l7, split_sides  # noqa: E402
from pcapdecomp.read.extract import read_exchanges  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long", default="100,1000", help="copies one after the other (comma-separated counts)")
    ap.add_argument("--busy", default="100,400", help="copies 1 ms apart (comma-separated counts)")
    args = ap.parse_args()
    x = read_exchanges(POOL / "proxy.pcap", [], True)
    address = tomllib.loads((POOL / "capture.toml").read_text())["proxy"]["address"]
    side = Side(x.exchanges, x.connections)
    front, _ = split_sides(side.ex, side.conns, set(), {address})
    f, b = _subset(side, front).ex, _subset(side, ~front).ex
    print("| copies | placed | client exchanges | server exchanges | paired | ambiguous | seconds | client exchanges/s |")
    print("|---|---|---|---|---|---|---|---|")
    for placed, counts, step in (("after each other", args.long, _span(f, b) + 1_000_000_000),
                                 ("1 ms apart", args.busy, 1_000_000)):
        for k in (int(c) for c in counts.split(",") if c):
            front_k, back_k = copies(f, k, step), copies(b, k, step)
            t0 = time.perf_counter()
            r = match_l7(front_k, back_k)
            dt = time.perf_counter() - t0
            print(f"| {k} | {placed} | {len(front_k):,} | {len(back_k):,} | {r.stats['paired']:,} | "
                  f"{r.stats['ambiguous']:,} | {dt:.2f} | {len(front_k) / dt:,.0f} |")


if __name__ == "__main__":
    main()
