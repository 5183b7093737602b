"""Every table the tool writes, and summary.json, is declared once in pcapdecomp/core/schema.py, and what a run writes is
exactly what is declared: the columns of each Parquet file (names, order, dtypes as read back), the capture-quality
keys, the slow-log table and every key path of summary.json. The docs print each declaration, and `pcapdecomp
columns NAME` prints the same table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pcapdecomp.core.schema import (
    ANALYSIS_COLUMNS,
    CAPTURE_PROBLEM_KEYS,
    CAPTURE_PROBLEM_WORDS,
    CAPTURE_QUALITY_KEYS,
    CONNECTION_COLUMNS,
    EXCHANGE_COLUMNS,
    GROUP_COLUMNS,
    POOL_COLUMNS,
    SLOWLOG_COLUMNS,
    SUMMARY_KEYS,
    TABLES,
    Column,
    markdown_table,
)
from pcapdecomp.slowlog.reader import read_slow_log

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
# a proxy between app and DB (proxy keys, proxy columns), a group stall with a slow log (stalls, the join)
SETS = ("proxy-l4", "group-stall")


@pytest.fixture(scope="module")
def runs(bundled_analysis) -> dict[str, Path]:
    return {name: bundled_analysis(name).out_dir for name in SETS}


def _declared(columns: tuple[Column, ...]) -> list[tuple[str, str]]:
    return [(c.name, c.file_dtype) for c in columns]


def _written(path: Path) -> list[tuple[str, str]]:
    table = pd.read_parquet(path)
    return [(name, str(dtype)) for name, dtype in table.dtypes.items()]


def test_analyze_writes_the_declared_columns(runs):
    for folder in runs.values():
        assert _written(folder / "exchanges.parquet") == _declared((*EXCHANGE_COLUMNS, *ANALYSIS_COLUMNS))
        assert _written(folder / "groups.parquet") == _declared(GROUP_COLUMNS)
        assert _written(folder / "pool.parquet") == _declared(POOL_COLUMNS)
        assert len(pd.read_parquet(folder / "exchanges.parquet")) > 0


def test_exchanges_command_writes_the_declared_columns(tmp_path):
    out, conns = tmp_path / "x.parquet", tmp_path / "c.parquet"
    done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "exchanges", str(CAPTURES / "features" / "db.pcap"),
                           "--out", str(out), "--connections", str(conns), "--quiet"], cwd=REPO, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert _written(out) == _declared(EXCHANGE_COLUMNS)
    assert _written(conns) == _declared(CONNECTION_COLUMNS)


def test_the_slow_log_table_is_the_declared_one():
    table, _ = read_slow_log(CAPTURES / "group-stall" / "slow.log")
    assert len(table) > 0
    assert [(n, str(d)) for n, d in table.dtypes.items()] == [(c.name, c.dtype) for c in SLOWLOG_COLUMNS]


def test_capture_quality_keys_are_the_declared_ones(runs):
    names = [c.name for c in CAPTURE_QUALITY_KEYS]
    for folder in runs.values():
        captures = json.loads((folder / "summary.json").read_text())["captures"]
        qualities = [*captures["app"], *captures["dbs"], *captures["proxy"]]
        assert qualities and all(list(q) == names for q in qualities)
    assert {k for k, _ in CAPTURE_PROBLEM_WORDS} <= CAPTURE_PROBLEM_KEYS <= set(names)


def _matches(declared: tuple[str, ...], path: tuple[str, ...]) -> bool:
    return len(declared) == len(path) and all(d in ("*", p) for d, p in zip(declared, path))


def _undeclared(value, path: tuple[str, ...], names: list[tuple[str, ...]]) -> list[str]:
    """Key paths of `value` (at `path`, a tuple of keys: a key may hold a dot, as a capture's file name does) that no
    declaration covers, as 'a.b' texts: a declared key covers its whole value; an object with declared members has
    each of its keys checked."""
    if path and any(_matches(n, path) for n in names):
        return []
    if isinstance(value, dict) and any(len(n) > len(path) and _matches(n[:len(path)], path) for n in names):
        out = []
        for key, v in value.items():
            out += _undeclared(v, (*path, key), names)
        return out
    return [".".join(path)]


def test_every_summary_key_is_declared(runs):
    names = [tuple(c.name.split(".")) for c in SUMMARY_KEYS]
    assert len(set(names)) == len(names)
    for name, folder in runs.items():
        summary = json.loads((folder / "summary.json").read_text())
        assert _undeclared(summary, (), names) == [], name
        # and what is declared is written, where its parent is (servers: several DB points only)
        for declared in names:
            *parent, key = declared
            if "*" in declared or declared in (("servers",), ("window",)):  # several DB points; --since/--until
                continue
            node = summary
            for part in parent:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict):
                assert key in node, (name, declared)
    tops = [n[0] for n in names]
    assert list(dict.fromkeys(tops))[:3] == ["set", "verdict", "pcapdecomp"]


def test_the_undeclared_check_finds_an_undeclared_key():
    names = [tuple(c.name.split(".")) for c in SUMMARY_KEYS]
    written = {"set": "x", "exchanges": {"total": 1, "new_count": 2}, "clocks": {"app.pcap": {"app": "a", "x": 1}},
               "slow_log": {"file": None, "used": False, "flavour": "x"}, "surprise": 1}
    assert _undeclared(written, (), names) == ["exchanges.new_count", "slow_log.flavour", "surprise"]


def test_every_table_is_printed_in_the_docs_and_by_the_columns_command():
    docs = "\n".join(p.read_text(encoding="utf-8") for p in [REPO / "README.md", *(REPO / "docs").glob("*.md")])
    for name, columns in TABLES.items():
        assert markdown_table(columns) in docs, f"the docs do not print `pcapdecomp columns {name}`"
        assert all(c.meaning for c in columns), name
        done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "columns", name], cwd=REPO,
                              capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout == markdown_table(columns) + "\n", name


def test_the_columns_command_help_names_every_table():
    """`columns --help` is how a user learns what TABLE may be: a table it accepts and does not name (capture-toml
    was one) is found only by a mistake's message."""
    done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "columns", "--help"], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"})
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert [name for name in TABLES if name not in text] == []
