"""`analyze --scheduler` (Dask) and `--partitioned` on the rotated two-server lab recording (tests/labsets.py):
a LocalCluster of 2 worker processes gives the single-process tables exactly; the dataset reads back in DuckDB and
pyarrow.dataset with every row and the exact capture names."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from labsets import REPO, two_servers

from pcapdecomp.analysis import Options, analyze
from pcapdecomp.core.errors import UsageError

pytestmark = pytest.mark.lab
distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    rotated = two_servers()
    tmp = tmp_path_factory.mktemp("cluster")
    one = analyze(rotated, Options(quiet=True, jobs=1), tmp / "one")
    dask = analyze(rotated, Options(quiet=True, jobs=2, scheduler="local", partitioned=True), tmp / "dask")
    return rotated, one, dask


def test_local_cluster_gives_the_single_process_tables(runs):
    rotated, one, dask = runs
    # every select the clients sent is in the tables compared (the workload sends a fixed 3600, however slowly a
    # loaded machine runs them; it used to stop after 3 s, with fewer than 3000 under load)
    sent = sum(json.loads(line)["role"] == "query" for line in (rotated / "truth.jsonl").read_text().splitlines())
    assert one.exchanges["sql"].astype(str).str.startswith("SELECT id, k, c").sum() == sent > 3000
    pd.testing.assert_frame_equal(one.exchanges, dask.exchanges)
    pd.testing.assert_frame_equal(one.groups, dask.groups)
    for key in ("exchanges", "match", "clocks", "latency_s", "points", "servers", "verdict", "captures"):
        assert one.summary[key] == dask.summary[key], key
    assert dask.summary["inputs"]["scheduler"].startswith("local (2 worker processes")  # ", TLS)" with cryptography
    assert one.summary["inputs"]["scheduler"] is None


def test_partitioned_dataset_reads_back_in_duckdb_and_pyarrow(runs):
    duckdb = pytest.importorskip("duckdb")
    import pyarrow.dataset as ds

    rotated, _, dask = runs
    folder = dask.out_dir / "exchanges"
    parts = sorted(p.relative_to(folder).parts[:2] for p in folder.rglob("*.parquet"))
    assert parts and all(h.startswith("host=") and c.startswith("capture=") for h, c in parts)
    got = duckdb.sql(f"SELECT host, capture, db_point, count(*) AS n, sum(total_s) AS total "
                     f"FROM read_parquet('{folder}/**/*.parquet', hive_partitioning = true) "
                     "GROUP BY ALL ORDER BY ALL").df()
    x = pd.read_parquet(dask.out_dir / "exchanges.parquet")
    want = x.groupby(["capture", "db_point"], observed=True).agg(n=("seq", "size"), total=("total_s", "sum"))
    want = want.reset_index().sort_values(["capture", "db_point"]).reset_index(drop=True)
    assert list(got["capture"]) == list(want["capture"]) == [str(rotated / "app")] * 2  # the exact name, decoded
    assert list(got["host"]) == ["app", "app"]
    assert list(got["n"]) == list(want["n"]) and got["total"].round(9).tolist() == want["total"].round(9).tolist()
    table = ds.dataset(folder, partitioning="hive").to_table().to_pandas()
    assert len(table) == len(x) and set(table.columns) == set(x.columns) | {"host"}
    mine = table[table["db_point"] == str(rotated / "db-replica")].sort_values(["conn_index", "seq"])
    theirs = x[x["db_point"] == str(rotated / "db-replica")].sort_values(["conn_index", "seq"])
    assert mine["req_tcp_seq"].tolist() == theirs["req_tcp_seq"].tolist()


def test_a_worker_that_cannot_read_a_capture_is_named(runs, tmp_path):
    from pcapdecomp.run.cluster import DaskRunner

    rotated, _, _ = runs
    gone = tmp_path / "db.pcap1"
    gone.write_bytes((rotated / "db" / "db.pcap1").read_bytes())
    runner = DaskRunner.connect("local", [], quiet=True, workers=1)
    try:
        gone.unlink()  # the client resolved it; the workers cannot open it
        with pytest.raises(UsageError, match="cannot read .*db.pcap1.*same path on every worker"):
            runner._check_files([str(gone)])
    finally:
        runner.close()


def test_a_scheduler_that_does_not_answer_is_one_line_and_exit_2(runs, tmp_path):
    rotated, _, _ = runs
    done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", "analyze", str(rotated), "--scheduler",
                           "tcp://127.0.0.1:9", "--out", str(tmp_path / "o"), "-q"],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "PCAPDECOMP_DASK_TIMEOUT": "2"})
    assert done.returncode == 2, done.stderr
    assert "no Dask scheduler answers there" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_summary_json_names_the_scheduler(runs):
    _, _, dask = runs
    summary = json.loads((dask.out_dir / "summary.json").read_text())
    assert summary["inputs"]["scheduler"] == dask.summary["inputs"]["scheduler"]
    assert "exchanges" in json.loads((dask.out_dir / ".pcapdecomp-outputs.json").read_text())["files"]


def test_a_local_cluster_beside_another_says_nothing_of_ports(tmp_path):
    """Two runs with --scheduler local at once (two terminals; tests beside each other): the second LocalCluster's
    scheduler found its HTTP port, 8787, taken, and Dask printed a four-line UserWarning ("Port 8787 is already in
    use …") on the user's terminal. Here 8787 is held (by this test, or by whatever holds it already)."""
    import socket

    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8787))
        holder.listen()
    except OSError:  # taken already: the case itself
        pass
    try:
        done = subprocess.run([sys.executable, "-m", "pcapdecomp", "analyze", str(REPO / "captures" / "group-stall"),
                               "-q", "--jobs", "2", "--scheduler", "local", "-o", str(tmp_path / "out")],
                              capture_output=True, text=True, cwd=REPO, timeout=600)
    finally:
        holder.close()
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
