"""What the partitioned run's tests share (test_partitioned_pass, test_partitioned_decompose): the bundled pairs,
today's in-memory joined table of a capture set, its spilled extraction, and partitions' runs merged by row key."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcapdecomp.analysis import Options, capture_set
from pcapdecomp.explain.partitioned import NotPartitionable, check_partitionable
from pcapdecomp.explain.servers import joined_table
from pcapdecomp.pair.pairing import pair_points
from pcapdecomp.read.extract import extract_points

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "captures"
RECORDINGS = Path("/tmp/pcapdecomp-bench")
RECORDED = [RECORDINGS / "sysbench-rw-10s", RECORDINGS / "sysbench-10s"]

PAIRS = sorted(p.name for p in CAPTURES.iterdir() if (p / "app.pcap").exists() and (p / "db.pcap").exists())
PROXY_SETS = [name for name in PAIRS if capture_set(CAPTURES / name).proxy_servers or capture_set(CAPTURES / name).proxy]


def today(cs) -> tuple[pd.DataFrame, tuple]:
    """Today's joined table of `cs` (the in-memory path, as analyze --jobs 1 makes it) and what its pairing kept:
    (clocks, clock_info, id_sources, db_conns, matching)."""
    notes: list[str] = []
    options = Options(quiet=True)
    x = extract_points(cs, 1, True, options.max_sql_bytes, notes.append)
    paired = pair_points(x, cs, 1, options.max_sql_bytes, notes.append)
    kept = (paired.clocks, paired.clock_info, paired.id_sources, paired.db_conns, paired.matching)
    return joined_table(paired), kept


def spilled(cs, folder: Path):
    """`cs` extracted with its exchange rows spilled into `folder` (read/spill.py)."""
    notes: list[str] = []
    return extract_points(cs, 1, True, Options(quiet=True).max_sql_bytes, notes.append, spill=folder)


def merged(runs: list, categories: dict[str, pd.Index]) -> pd.DataFrame:
    """The runs merged by row key (a stable sort of their concatenation: the merged writer's order), each run's
    categoricals recoded to `categories` (a value outside them fails)."""
    keys = np.concatenate([r.key for r in runs])
    order = np.lexsort(keys.T[::-1])
    assert len(np.unique(keys, axis=0)) == len(keys)  # distinct: the order is the keys' alone
    tables = []
    for r in runs:
        t = r.table.copy(deep=False)
        for c, wanted in categories.items():
            assert isinstance(t[c].dtype, pd.CategoricalDtype), c
            assert set(t[c].dropna().astype(str)) <= set(wanted.astype(str)), c
            t[c] = t[c].cat.set_categories(wanted)
        tables.append(t)
    return pd.concat(tables, ignore_index=True).take(order).reset_index(drop=True)


def partitionable_recording(folder: Path, probe: Path):
    """The capture set of a recording in `folder`: the test is skipped when the recording is not here, or when the
    partitioned run refuses it (its spill in `probe`, removed after)."""
    if not (folder / "app.pcap").exists() or not (folder / "db.pcap").exists():
        pytest.skip(f"{folder} is not here")
    cs = capture_set(folder)
    x = spilled(cs, probe)
    try:
        check_partitionable(x.app, x.db, x.proxy, cs.proxy_servers)
    except NotPartitionable as refused:
        pytest.skip(f"{folder.name}: {refused}")
    del x
    shutil.rmtree(probe)
    return cs


def db_alone(cs):
    """`cs` without its app and proxy points: what analyze --db makes of the DB capture (the folder's slow log,
    processlist, key log and settings kept)."""
    cs.points = [p for p in cs.points if p.kind == "db"]
    cs.proxy_servers = []
    return cs
