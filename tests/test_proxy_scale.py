"""The L7 matcher's cost (pcapdecomp/pair/proxy.py match_l7) grows linearly with the capture: the bundled proxy-pool
recording (Gaea, a pool of 2 for 8 clients) made 4× longer, and 4× busier (its copies overlapping in time, so that
the identical `SELECT 1` of many clients fit many server requests at once), counted in elementary steps
(L7Pairs.work: rows, candidate pairs, rounds of forced pairs), not in wall time."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcapdecomp.pair.proxy import MAX_CANDIDATES, Side, _subset, match_l7, split_sides
from pcapdecomp.read.extract import read_exchanges

POOL = Path(__file__).resolve().parents[1] / "captures" / "proxy-pool"
TAG = re.compile(r"^(SELECT |select )(\d+)( (?:AS|as) `?tag)")


@pytest.fixture(scope="module")
def sides() -> tuple[pd.DataFrame, pd.DataFrame]:
    x = read_exchanges(POOL / "proxy.pcap", [], True)
    address = tomllib.loads((POOL / "capture.toml").read_text())["proxy"]["address"]
    side = Side(x.exchanges, x.connections)
    front, _ = split_sides(side.ex, side.conns, set(), {address})
    return _subset(side, front).ex, _subset(side, ~front).ex


def copies(table: pd.DataFrame, k: int, step_ns: int) -> pd.DataFrame:
    """k copies of a real table, copy i moved by i × step_ns, its tagged statements renumbered (tag + 100,000 × i,
    in the text and in a prepared statement's first parameter) so that each copy's tags are its own."""
    parts = []
    for i in range(k):
        t = table.copy()
        for col in ("req_first_ts", "resp_last_ts"):
            t[col] = t[col] + pd.Timedelta(i * step_ns, "ns")
        t["sql"] = [TAG.sub(lambda m: f"{m[1]}{int(m[2]) + 100_000 * i}{m[3]}", s) if isinstance(s, str) else s
                    for s in t["sql"].astype(object)]
        t["params"] = [f"{int(p.split(', ')[0]) + 100_000 * i}, {p.split(', ', 1)[1]}" if isinstance(p, str) and
                       p[:1].isdigit() else p for p in t["params"].astype(object)]
        parts.append(t)
    out = pd.concat(parts, ignore_index=True)
    out["sql"] = out["sql"].astype("category")
    return out


def _span(front: pd.DataFrame, back: pd.DataFrame) -> int:
    first = min(front["req_first_ts"].min(), back["req_first_ts"].min())
    last = max(front["resp_last_ts"].max(), back["resp_last_ts"].max())
    return (last - first).value


def test_a_longer_capture_costs_proportionally_more(sides):
    front, back = sides
    step = _span(front, back) + 1_000_000_000  # one copy after the other: a recording 4× as long
    one = match_l7(front, back)
    runs = {k: match_l7(copies(front, k, step), copies(back, k, step)) for k in (4, 16)}
    for k, r in runs.items():  # the copies do not touch: each pairs as the recording does
        assert r.stats["paired"] == k * one.stats["paired"] and r.stats["ambiguous"] == k * one.stats["ambiguous"]
    assert runs[16].work / runs[4].work == pytest.approx(4, rel=0.05)


def test_a_busier_capture_costs_proportionally_more(sides):
    """Copies 1 ms apart: up to 8 × k clients send the same SELECT 1 within milliseconds. Before, the forced pairs
    were found by passes over every open request (each pass forcing at least one): quadratic in such a crowd."""
    front, back = sides
    k_small, k_big = 32, 128  # beyond MAX_CANDIDATES fitting requests per statement: the cap bounds the lists
    small, big = (match_l7(copies(front, k, 1_000_000), copies(back, k, 1_000_000)) for k in (k_small, k_big))
    assert big.work / small.work < 4.4
    for k, r in ((k_small, small), (k_big, big)):
        # the tagged statements are unique in every copy: all of them still pair, whatever the crowd
        assert np.isin(r.how, ["l7-rewritten", "l7-params"]).sum() == 24 * k
        assert r.front_candidates.max() > MAX_CANDIDATES  # the crowd is there: some are ambiguous by count


def chain(front: pd.DataFrame, back: pd.DataFrame, n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """n copies of a real `SELECT 1` at the proxy's client side and at its server side, re-timed into a chain:
    server request i fits client requests i − 1 and i; the last client request has one candidate. Each forced pair
    frees the next: n rounds of one pair each."""
    t = 1_000_000  # 1 ms
    f = front[front["sql"] == "SELECT 1"].iloc[[0] * n].reset_index(drop=True)
    b = back[back["sql"] == "SELECT 1"].iloc[[0] * n].reset_index(drop=True)
    at = pd.Timestamp("2026-01-01", tz="UTC") + pd.to_timedelta(np.arange(n) * t, "ns")
    f["req_first_ts"], f["resp_last_ts"] = at, at + pd.Timedelta(int(1.7 * t), "ns")
    b["req_first_ts"], b["resp_last_ts"] = at + pd.Timedelta(int(0.55 * t), "ns"), at + pd.Timedelta(int(0.6 * t), "ns")
    return f, b


def test_a_chain_of_forced_pairs_costs_linear_work(sides):
    """Before, each round of forced pairs passed over every open request: n²/2 steps for this chain."""
    small, big = (match_l7(*chain(*sides, n)) for n in (500, 2000))
    assert small.stats["paired"] == 500 and big.stats["paired"] == 2000  # every pair is forced, one by one
    assert big.work / small.work == pytest.approx(4, rel=0.05)
