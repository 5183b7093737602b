"""The lab's two test hosts: network namespaces joined by a veth pair, tcpdump on each, a private MariaDB.

Everything here is started by us and torn down by us; nothing touches the system's own MariaDB service.
Each piece is a context manager, so one `contextlib.ExitStack` in record.py stops them in reverse order
whatever happens (error, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[2]
if str(_REPO_ROOT) not in sys.path:  # record.py runs as a script; the error base lives in the package
    sys.path.insert(0, str(_REPO_ROOT))

from pcapdecomp.core.errors import PcapdecompError  # noqa: E402

MYSQL_PORT = 3306
APP_IPV4, DB_IPV4 = "10.213.77.1", "10.213.77.2"  # a private /30 that exists only inside the two namespaces
APP_IPV6, DB_IPV6 = "fd77::1", "fd77::2"  # unique-local, also namespace-only
# a second DB host (two-servers: a primary and a replica), on its own veth pair from the app host
APP2_IPV4, DB2_IPV4 = "10.213.78.1", "10.213.78.2"
APP2_IPV6, DB2_IPV6 = "fd78::1", "fd78::2"

# binary -> Debian package that provides it
_DEBIAN_PACKAGES = {"mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server",
                    "tcpdump": "tcpdump", "ip": "iproute2", "openssl": "openssl", "sysbench": "sysbench"}
_PIP_PACKAGES = {"pymysql": "pymysql", "mysql.connector": "mysql-connector-python"}


class LabError(PcapdecompError):
    """The lab cannot run here (not root, no `ip netns`) or a piece of it failed to start."""


def log(message: str) -> None:
    print(f"[lab] {message}", file=sys.stderr, flush=True)


def check_can_run() -> None:
    """Raise LabError naming the reason when this machine cannot host the lab."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, tcpdump); run it with sudo or as root")
    if shutil.which("ip") is None:
        raise LabError("`ip` (iproute2) is not installed; install it or run ensure_deps() as root")
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise LabError(f"`ip netns` is unavailable here: {probe.stderr.strip() or probe.returncode}")


def _sbin_which(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def ensure_deps() -> None:
    """Install missing binaries with apt-get (update once, only if something is missing) and drivers with pip."""
    missing = sorted({pkg for binary, pkg in _DEBIAN_PACKAGES.items() if _sbin_which(binary) is None})
    if missing:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise LabError(f"missing Debian packages {missing} and cannot install them (need root and apt-get)")
        log(f"installing {' '.join(missing)} with apt-get")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update"], check=True, env=env, stdout=subprocess.DEVNULL)
        done = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *missing], env=env,
                              stdout=subprocess.DEVNULL)
        if done.returncode != 0:
            raise LabError(f"apt-get install {' '.join(missing)} failed (exit {done.returncode})")
    for module, pip_name in _PIP_PACKAGES.items():
        try:
            __import__(module)
        except ImportError:
            log(f"installing {pip_name} with pip")
            done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", pip_name])
            if done.returncode != 0:
                raise LabError(f"pip install {pip_name} failed (exit {done.returncode})")


def stop_process(proc: subprocess.Popen | None, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL after timeout_s; nothing when it already ended."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if done.returncode != 0:
        raise LabError(f"`{' '.join(args)}` failed: {done.stderr.strip()}")


def make_namespaces(namespaces: list[str], links: list[tuple["Host", "Host", int]]) -> None:
    """Network namespaces with their loopback up, and a veth pair per link (near, far, IPv4 prefix length) with
    both ends addressed (IPv4 and IPv6) and up."""
    for netns in namespaces:
        _run("ip", "netns", "add", netns)
        _run("ip", "-n", netns, "link", "set", "lo", "up")
    for near, far, prefix in links:
        _run("ip", "link", "add", near.veth, "type", "veth", "peer", "name", far.veth)
        for host in (near, far):
            _run("ip", "link", "set", host.veth, "netns", host.netns)
            _run("ip", "-n", host.netns, "addr", "add", f"{host.ipv4}/{prefix}", "dev", host.veth)
            _run("ip", "-n", host.netns, "-6", "addr", "add", f"{host.ipv6}/64", "dev", host.veth, "nodad")
            _run("ip", "-n", host.netns, "link", "set", host.veth, "up")


@dataclass(frozen=True, slots=True)
class Host:
    """One namespace end of the veth pair."""

    netns: str
    veth: str
    ipv4: str
    ipv6: str

    def command(self, *args: str) -> list[str]:
        """argv that runs `args` inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *args]


class TestHosts:
    """Two namespaces `pcd-<pid>-app` and `pcd-<pid>-db` with one veth pair; unique per run. With `second_db`, a
    third namespace `pcd-<pid>-db2` on a veth pair of its own from the app host (`app2` is the app's end of it):
    two DB servers, each captured on its own host."""

    __test__ = False  # not a pytest class despite the name

    def __init__(self, tag: str | None = None, second_db: bool = False):
        tag = tag or str(os.getpid())
        self.app = Host(f"pcd-{tag}-app", f"pcda{tag}"[:15], APP_IPV4, APP_IPV6)
        self.db = Host(f"pcd-{tag}-db", f"pcdd{tag}"[:15], DB_IPV4, DB_IPV6)
        self.app2 = Host(self.app.netns, f"pcdb{tag}"[:15], APP2_IPV4, APP2_IPV6) if second_db else None
        self.db2 = Host(f"pcd-{tag}-db2", f"pcde{tag}"[:15], DB2_IPV4, DB2_IPV6) if second_db else None

    def _links(self) -> list[tuple[Host, Host]]:
        return [(self.app, self.db)] + ([(self.app2, self.db2)] if self.db2 is not None else [])

    def __enter__(self) -> TestHosts:
        try:
            make_namespaces([host.netns for host in (self.app, self.db, *([self.db2] if self.db2 else []))],
                            [(near, far, 30) for near, far in self._links()])
        except BaseException:
            self.__exit__(None, None, None)
            raise
        extra = f" and {self.db2.netns} ({DB2_IPV4})" if self.db2 else ""
        log(f"test hosts {self.app.netns} ({APP_IPV4}) and {self.db.netns} ({DB_IPV4}){extra} are up")
        return self

    def __exit__(self, *exc) -> None:
        for host in (self.app, self.db, *([self.db2] if self.db2 else [])):  # the veth ends inside go too
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        for near, _ in self._links():
            subprocess.run(["ip", "link", "del", near.veth], capture_output=True)  # if it never moved


class _StderrTail:
    """Collects a child's stderr lines in a thread so the pipe never fills and we can wait for a line."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, pattern: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not any(re.search(pattern, line) for line in self.lines):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


@dataclass(frozen=True, slots=True)
class CaptureStats:
    captured: int
    dropped_by_kernel: int


class Tcpdump:
    """tcpdump on one host's veth, nanosecond pcap, whole packets, written as they arrive.

    `rotate_mb`: tcpdump's own rotation (`-C N`: a new file once the current one holds N million bytes: pcap,
    pcap1, pcap2, …), as captures in the field are taken. `interface`: another interface than the host's veth
    (`any` on a host with two links: Linux cooked headers). `immediate=False`: packets reach the file in the ring's
    blocks (TPACKET_V3) instead of one by one, for a workload at full speed on 2 cores (sysbench): in immediate mode
    tcpdump dropped 963–13,613 packets of 40 s at full speed (one 256 KiB slot a packet), in blocks none."""

    # With --immediate-mode libpcap gives every packet a ring slot of snaplen bytes (256 KiB with -s 0), so the
    # default 2 MiB buffer holds only 8 packets and a burst (eight connections closing at once) is dropped.
    buffer_kib = 128 * 1024

    def __init__(self, host: Host, pcap: Path, port: int = MYSQL_PORT, rotate_mb: int = 0,
                 interface: str | None = None, immediate: bool = True):
        self.host, self.pcap, self.port = host, pcap, port
        self.immediate = immediate
        self.rotate_mb, self.interface = rotate_mb, interface or host.veth
        self.stats: CaptureStats | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def files(self) -> list[Path]:
        """The files written: the capture, then its rotations in order."""
        rotated = sorted((p for p in self.pcap.parent.glob(self.pcap.name + "*")
                          if p.name[len(self.pcap.name):].isdigit()), key=lambda p: int(p.name[len(self.pcap.name):]))
        return [self.pcap, *rotated] if self.pcap.exists() else rotated

    def __enter__(self) -> Tcpdump:
        rotation = ["-C", str(self.rotate_mb)] if self.rotate_mb else []
        argv = self.host.command("tcpdump", "-i", self.interface, "-w", str(self.pcap), *rotation,
                                 *(["--immediate-mode"] if self.immediate else []), "-U", "-B", str(self.buffer_kib),
                                 "-s", "0", "-Z", "root", "--time-stamp-precision=nano", "tcp", "port",
                                 str(self.port))
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._stderr = _StderrTail(self._proc.stderr)
        if not self._stderr.wait_for(r"listening on", 15):
            self._stop()
            raise LabError(f"tcpdump in {self.host.netns} did not start: {' | '.join(self._stderr.lines)}")
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is not None and self._proc.poll() is None:
            # let the last segments (FINs, ACKs) reach the file; in blocks, a block is handed over when full or
            # after libpcap's timeout (1 s)
            time.sleep(1.0 if self.immediate else 2.5)
        self._stop()

    def _stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.join(5)
        text = "\n".join(self._stderr.lines)
        captured = re.search(r"(\d+) packets? captured", text)
        dropped = re.search(r"(\d+) packets? dropped by kernel", text)
        if captured and dropped:
            self.stats = CaptureStats(int(captured.group(1)), int(dropped.group(1)))
        self._proc = None


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """The mariadbd options a scenario chooses; everything else is fixed lab boilerplate."""

    thread_handling: str = "pool-of-threads"  # or one-thread-per-connection (the thread_pool_* options then do nothing)
    thread_pool_size: int = 2
    thread_pool_max_threads: int = 100
    thread_pool_stall_limit_ms: int = 500
    thread_pool_oversubscribe: int = 3
    long_query_time_s: float = 1.0
    max_allowed_packet: int = 16 * 1024 * 1024
    local_infile: bool = False
    tls: bool = False
    statement_history_size: int = 20000
    thread_cache_size: int | None = None  # None: MariaDB's default
    wait_timeout_s: int | None = None  # None: MariaDB's default (8 hours)
    max_connections: int = 2000  # the lab's default stays out of the way; a scenario lowers it to be refused


class PrivateMariaDB:
    """A throwaway mariadbd in the db namespace: own datadir, socket and port, not the system service."""

    def __init__(self, host: Host, app: Host, workdir: Path, settings: ServerSettings):
        self.host, self.app, self.workdir, self.settings = host, app, workdir, settings
        self.datadir = workdir / "data"
        self.socket = workdir / "mysqld.sock"
        # its own temporary folder: a server starting removes every #sql* file in its tmpdir, so two lab servers
        # (two recordings at once) sharing /tmp removed each other's temporary tables while one was being installed
        self.tmpdir = workdir / "tmp"
        self.slow_log = workdir / "slow.log"
        self.error_log = workdir / "error.log"
        self.version = ""
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> PrivateMariaDB:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tmpdir.mkdir(exist_ok=True)
        self._install_datadir()
        s = self.settings
        options = [
            "--no-defaults", f"--datadir={self.datadir}", f"--tmpdir={self.tmpdir}", "--user=root",
            f"--socket={self.socket}", f"--port={MYSQL_PORT}", "--bind-address=*", "--skip-name-resolve", f"--pid-file={self.workdir}/pid",
            f"--log-error={self.error_log}", "--skip-log-bin", "--innodb-buffer-pool-size=64M",
            "--innodb-flush-log-at-trx-commit=2", f"--max-connections={s.max_connections}",
            f"--thread-handling={s.thread_handling}", f"--thread-pool-size={s.thread_pool_size}",
            f"--thread-pool-max-threads={s.thread_pool_max_threads}",
            f"--thread-pool-stall-limit={s.thread_pool_stall_limit_ms}",
            f"--thread-pool-oversubscribe={s.thread_pool_oversubscribe}",
            # the slow log is switched on after setup, so only the workload's statements land in it
            "--slow-query-log=0", f"--slow-query-log-file={self.slow_log}", "--log-output=FILE",
            f"--long-query-time={s.long_query_time_s}",
            "--performance-schema=ON", "--performance-schema-consumer-events-statements-current=ON",
            "--performance-schema-consumer-events-statements-history-long=ON",
            f"--performance-schema-events-statements-history-long-size={s.statement_history_size}",
            f"--max-allowed-packet={s.max_allowed_packet}", f"--local-infile={int(s.local_infile)}",
            *([f"--thread-cache-size={s.thread_cache_size}"] if s.thread_cache_size is not None else []),
            *([f"--wait-timeout={s.wait_timeout_s}"] if s.wait_timeout_s is not None else []),
        ]
        if s.tls:
            cert, key = self._make_certificate()
            options += [f"--ssl-cert={cert}", f"--ssl-key={key}"]
        self._proc = subprocess.Popen(self.host.command("mariadbd", *options), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        try:
            self._wait_ready(60)
            self._setup_users()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        log(f"MariaDB {self.version} ready in {self.host.netns} on {self.host.ipv4}:{MYSQL_PORT}")
        return self

    def _install_datadir(self) -> None:
        # its own process group: the script starts `mariadbd --bootstrap`, which would outlive a killed script
        installer = subprocess.Popen(["mariadb-install-db", "--no-defaults", f"--datadir={self.datadir}",
                                      f"--tmpdir={self.tmpdir}", "--user=root", "--auth-root-authentication-method=socket", "--skip-test-db"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        try:
            _, stderr = installer.communicate(timeout=120)
        except BaseException:
            os.killpg(installer.pid, signal.SIGKILL)
            installer.wait()
            raise
        if installer.returncode != 0:
            raise LabError(f"mariadb-install-db failed: {stderr.strip()[-500:]}")

    def _make_certificate(self) -> tuple[Path, Path]:
        cert, key = self.workdir / "cert.pem", self.workdir / "key.pem"
        _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
             "-days", "2", "-subj", "/CN=pcd-lab-db")
        return cert, key

    def _wait_ready(self, timeout_s: float) -> None:
        import pymysql

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise LabError(f"mariadbd exited ({self._proc.returncode}): {self._error_tail()}")
            if self.socket.exists():
                try:
                    with self.admin() as conn, conn.cursor() as cur:
                        cur.execute("SELECT VERSION()")
                        self.version = cur.fetchone()[0]
                        return
                except pymysql.err.OperationalError:
                    pass
            time.sleep(0.1)
        raise LabError(f"mariadbd did not become ready in {timeout_s:.0f} s: {self._error_tail()}")

    def _error_tail(self) -> str:
        try:
            return " | ".join(self.error_log.read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return "(no error log)"

    def admin(self):
        """A root connection over the unix socket (never on the veth, so it stays out of the captures)."""
        import pymysql

        return pymysql.connect(unix_socket=str(self.socket), user="root", autocommit=True)

    def _setup_users(self) -> None:
        with self.admin() as conn, conn.cursor() as cur:
            for address in (self.app.ipv4, self.app.ipv6):
                cur.execute(f"CREATE USER 'app'@'{address}' IDENTIFIED VIA mysql_native_password "
                            "USING PASSWORD('app-pass')")
                cur.execute(f"GRANT ALL ON *.* TO 'app'@'{address}'")
                cur.execute(f"CREATE USER 'other'@'{address}' IDENTIFIED VIA mysql_native_password "
                            "USING PASSWORD('other-pass')")
                cur.execute(f"GRANT SELECT ON *.* TO 'other'@'{address}'")
            cur.execute("CREATE DATABASE lab")

    def start_recording(self) -> None:
        """Forget setup statements and open the slow log: from here on only the workload counts."""
        with self.admin() as conn, conn.cursor() as cur:
            cur.execute("TRUNCATE TABLE performance_schema.events_statements_history_long")
            cur.execute("SET GLOBAL slow_query_log = 1")

    def stop_recording(self) -> None:
        with self.admin() as conn, conn.cursor() as cur:
            cur.execute("SET GLOBAL slow_query_log = 0")

    def __exit__(self, *exc) -> None:
        stop_process(self._proc, 30)
        self._proc = None


class Child:
    """A workload process in the app namespace, killed on exit if still running."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv)

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise LabError(f"the workload did not finish within {timeout_s:.0f} s") from None

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
