"""Record tests/data/field/corners.pcap: protocol corners other projects' captures showed, from a real MariaDB
(run by hand, as root; not part of the test suite; uses the lab's hosts, captures/lab/hosts.py).

    python3 tests/data/field/record_corners.py OUTDIR

tcpdump on the DB host (port 3306) records, in this order:

1. `idle`: a connection logged in *before* tcpdump started (so the capture has no handshake) that leaves without
   COM_QUIT: the client closes its socket, MariaDB answers with an unsolicited ERR 1158.
2. `quitless`: a whole connection (SYN, login, `SELECT 1`) that leaves without COM_QUIT the same way.
3. `tls`: a connection that switches to TLS right after the greeting (SSLRequest), runs a query and quits.
4. `telnet`: a client that is not MySQL (it sends an HTTP request line) to the MySQL port.
5. `health`: MariaDB stops, and a plain-text health check (HTTP) answers on the same address and port.

The timeline of what the clients did is written to OUTDIR/corners.log.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "captures" / "lab"))


def client(mode: str) -> None:
    """Runs inside the app namespace."""
    import pymysql
    from hosts import DB_IPV4, MYSQL_PORT

    def login(**kw):
        return pymysql.connect(host=DB_IPV4, port=MYSQL_PORT, user="app", password="app-pass", database="lab",
                               autocommit=True, **kw)

    if mode == "idle":  # log in, say so, wait for SIGUSR1, then leave without COM_QUIT
        conn = login(ssl_disabled=True)
        print("ready", flush=True)
        signal.sigwait({signal.SIGUSR1})
        conn._sock.close()  # no COM_QUIT
        time.sleep(0.3)
    elif mode == "quitless":
        conn = login(ssl_disabled=True)
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            cur.fetchall()
        time.sleep(0.05)
        conn._sock.close()
        time.sleep(0.3)
    elif mode in ("killed", "timeout", "shutdown"):  # idle until the server ends the connection
        conn = login(ssl_disabled=True)
        with conn.cursor() as cur:
            if mode == "timeout":
                cur.execute("SET SESSION wait_timeout = 1")
            cur.execute("SELECT CONNECTION_ID()")
            print(cur.fetchone()[0], flush=True)
        conn._sock.settimeout(20)
        try:
            print("read", conn._sock.recv(4096).hex(), flush=True)  # what the server sends on its own
        except OSError as err:
            print("read error", err, flush=True)
        conn._sock.close()
    elif mode == "tls":
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        conn = login(ssl=context)
        with conn.cursor() as cur:
            cur.execute("SELECT 'inside TLS'")
            cur.fetchall()
        conn.close()
    elif mode in ("telnet", "health"):
        with socket.create_connection((DB_IPV4, MYSQL_PORT), timeout=5) as s:
            if mode == "telnet":
                s.recv(4096)  # the greeting
            s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            try:
                while s.recv(4096):
                    pass
            except (ConnectionResetError, socket.timeout):
                pass


def main(out: Path) -> None:
    from hosts import DB_IPV4, MYSQL_PORT, PrivateMariaDB, ServerSettings, Tcpdump, TestHosts, check_can_run

    check_can_run()
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "corners.log", "w")

    def note(text: str) -> None:
        print(f"{time.time():.6f} {text}", file=log, flush=True)

    def run(hosts, mode: str) -> None:
        note(f"client {mode}")
        subprocess.run(hosts.app.command(sys.executable, __file__, "--client", mode), check=True, timeout=60)

    with TestHosts(f"c{os.getpid() % 100000}") as hosts:
        server = PrivateMariaDB(hosts.db, hosts.app, out / "server", ServerSettings(tls=True))
        server.__enter__()
        try:
            with server.admin() as conn, conn.cursor() as cur:
                cur.execute("CREATE TABLE IF NOT EXISTS lab.t (i INT)")
            idle = subprocess.Popen(hosts.app.command(sys.executable, __file__, "--client", "idle"),
                                    stdout=subprocess.PIPE, text=True)
            assert idle.stdout.readline().strip() == "ready"
            with Tcpdump(hosts.db, out / "corners.pcap", MYSQL_PORT):
                time.sleep(0.3)
                note("idle client leaves")
                idle.send_signal(signal.SIGUSR1)  # reaches `ip netns exec`, which execs python: same process
                idle.wait(10)
                time.sleep(0.3)
                for mode in ("quitless", "tls", "telnet"):
                    run(hosts, mode)
                    time.sleep(0.3)
                server.__exit__(None, None, None)
                note("MariaDB stopped")
                http = subprocess.Popen(hosts.db.command(sys.executable, "-m", "http.server", "--bind", DB_IPV4,
                                                         str(MYSQL_PORT)), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                try:
                    time.sleep(1.5)
                    run(hosts, "health")
                    time.sleep(0.3)
                finally:
                    http.terminate()
                    http.wait(10)
        finally:
            server.__exit__(None, None, None)
    note("done")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--client"]:
        client(sys.argv[2])
    else:
        main(Path(sys.argv[1]).resolve())
