"""`--scheduler`: a scheduler runs code in its clients, so the local one authenticates (Dask's temporary TLS
security: no other local user can connect), a remote tls:// one takes the client's certificate (--scheduler-tls),
and a transport we do not support is one line, exit 2. On the bundled group-stall capture set."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")
pytest.importorskip("cryptography")

from distributed import Client, LocalCluster  # noqa: E402
from distributed.security import Security  # noqa: E402

from pcapdecomp.read.captureset import resolve_capture_set  # noqa: E402
from pcapdecomp.run.cluster import DaskRunner  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GROUP_STALL = REPO / "captures" / "group-stall"


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcapdecomp.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PCAPDECOMP_DASK_TIMEOUT": "5", **env})


def one_line_exit_2(proc: subprocess.CompletedProcess, words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr


def test_the_local_cluster_lets_no_one_else_connect():
    cs = resolve_capture_set(GROUP_STALL, [], None, [], None, None, [], None, None)
    runner = DaskRunner.connect("local", cs.points, quiet=True, workers=1)
    try:
        address = runner.cluster.scheduler_address
        assert address.startswith("tls://127.0.0.1:")
        assert runner.client.submit(sum, [1, 2]).result() == 3  # ours is let in
        with pytest.raises(Exception):  # no certificate: the handshake fails
            Client(address, timeout="3s").close()
        with pytest.raises(Exception):  # a certificate of another CA: refused
            Client(address, timeout="3s", security=Security.temporary()).close()
    finally:
        runner.close()


def test_the_local_schedulers_http_server_tells_nothing():
    """The LocalCluster's scheduler listens for HTTP on 127.0.0.1 even without a dashboard, and no one is asked who
    they are there: it answers the health check alone, not Dask's info and JSON pages (the workers, their memory and
    tasks), which a fresh pair of eyes read with curl as any local user."""
    import urllib.error
    import urllib.request

    cs = resolve_capture_set(GROUP_STALL, [], None, [], None, None, [], None, None)
    runner = DaskRunner.connect("local", cs.points, quiet=True, workers=1)
    try:
        port = runner.cluster.scheduler.http_server.port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            assert answer.status == 200
        for page in ("/info/main/workers.html", "/json/counts.json", "/info/main/logs.html"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{page}", timeout=5)
            assert refused.value.code == 404, page
    finally:
        runner.close()


def test_unsupported_transports_and_misplaced_tls_options_are_one_line(tmp_path):
    out = str(tmp_path / "o")
    one_line_exit_2(cli("analyze", str(GROUP_STALL), "--scheduler", "ucx://10.0.0.1:8786", "--out", out, "-q"),
                    "ucx:// is not supported")
    one_line_exit_2(cli("analyze", str(GROUP_STALL), "--scheduler", "tcp://127.0.0.1:9", "--scheduler-tls", "a,b,c",
                        "--out", out, "-q"), "--scheduler-tls is for a tls:// scheduler")
    # without --scheduler the run would read on this machine, the certificate unused: refused, not ignored
    one_line_exit_2(cli("analyze", str(GROUP_STALL), "--scheduler-tls", "a,b,c", "--out", out, "-q"),
                    "give it with --scheduler tls://HOST:PORT")
    one_line_exit_2(cli("analyze", str(GROUP_STALL), "--scheduler", "tls://127.0.0.1:9", "--scheduler-tls",
                        f"{tmp_path}/ca.pem,{tmp_path}/c.pem,{tmp_path}/k.pem", "--out", out, "-q"), "no such file")
    assert not (tmp_path / "o").exists()


def test_a_tls_scheduler_is_reached_with_the_clients_certificate(tmp_path):
    security = Security.temporary()  # PEM texts: written to files as an administrator hands them out
    files = []
    for name, pem in (("ca.pem", security.tls_ca_file), ("cert.pem", security.tls_client_cert),
                      ("key.pem", security.tls_client_key)):
        (tmp_path / name).write_text(pem)
        files.append(str(tmp_path / name))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None, protocol="tls://",
                      host="127.0.0.1", security=security, silence_logs=logging.ERROR) as cluster:
        address = cluster.scheduler_address
        one_line_exit_2(cli("analyze", str(GROUP_STALL), "--scheduler", address, "--out", str(tmp_path / "a"), "-q"),
                        "needs --scheduler-tls")
        done = cli("analyze", str(GROUP_STALL), "--scheduler", address, "--scheduler-tls", ",".join(files),
                   "--out", str(tmp_path / "b"), "-q")
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "b" / "summary.json").is_file()
