"""The lab's third host: a proxy namespace between app and DB, and the real proxies that run in it.

    app (10.213.78.1) ──veth── (10.213.78.2:3306) proxy (10.213.78.5) ──veth── db (10.213.78.6:3306)

`ProxyHosts` builds the three namespaces; `HAProxy` runs Debian's haproxy in TCP mode (an L4 proxy: one server
connection per client connection, bytes passed through); `Gaea` runs XiaoMi's Gaea (built from the Go module
proxy by scripts/install-deps.sh), a MySQL-aware proxy with a pool of server connections shared by all client
connections (an L7 pooling proxy that re-writes prepared statements as text queries). The two-host lab in
hosts.py is unchanged; these are used only by the proxy scenarios.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from hosts import Host, LabError, _sbin_which, log, make_namespaces, stop_process

PROXY_APP_IPV4, PROXY_FRONT_IPV4 = "10.213.78.1", "10.213.78.2"  # app ↔ proxy link
PROXY_BACK_IPV4, PROXY_DB_IPV4 = "10.213.78.5", "10.213.78.6"  # proxy ↔ db link
PROXY_PORT = 3306
GAEA_BINARY_ENV = "PCAPDECOMP_GAEA"  # path of the gaea binary, when not on PATH
GAEA_DEFAULT_PATHS = ("/usr/local/bin/gaea", "/opt/pcapdecomp/bin/gaea")


class ProxyHosts:
    """Three namespaces `pcd-<pid>-app`, `pcd-<pid>-proxy`, `pcd-<pid>-db`; two veth pairs through the proxy.

    `app` and `db` are Hosts like TestHosts' (so PrivateMariaDB and Tcpdump take them); `proxy_front` and
    `proxy_back` are the proxy's two ends (one namespace), `proxy_back` being the client the DB sees.
    """

    __test__ = False

    def __init__(self, tag: str | None = None):
        tag = tag or str(os.getpid())
        proxy_ns = f"pcd-{tag}-proxy"
        self.app = Host(f"pcd-{tag}-app", f"pcxa{tag}"[:15], PROXY_APP_IPV4, "fd78::1")
        self.proxy_front = Host(proxy_ns, f"pcxf{tag}"[:15], PROXY_FRONT_IPV4, "fd78::2")
        self.proxy_back = Host(proxy_ns, f"pcxb{tag}"[:15], PROXY_BACK_IPV4, "fd78:1::1")
        self.db = Host(f"pcd-{tag}-db", f"pcxd{tag}"[:15], PROXY_DB_IPV4, "fd78:1::2")
        self._links = ((self.app, self.proxy_front, 30), (self.proxy_back, self.db, 30))

    def __enter__(self) -> ProxyHosts:
        try:
            make_namespaces([self.app.netns, self.proxy_front.netns, self.db.netns], list(self._links))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        log(f"test hosts {self.app.netns} ({PROXY_APP_IPV4}) -> {self.proxy_front.netns} ({PROXY_FRONT_IPV4}, "
            f"{PROXY_BACK_IPV4}) -> {self.db.netns} ({PROXY_DB_IPV4}) are up")
        return self

    def __exit__(self, *exc) -> None:
        for netns in (self.app.netns, self.proxy_front.netns, self.db.netns):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        for a, _, _ in self._links:
            subprocess.run(["ip", "link", "del", a.veth], capture_output=True)


def _wait_listening(host: Host, port: int, timeout_s: float, proc: subprocess.Popen, name: str, log_file: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LabError(f"{name} exited ({proc.returncode}): {_tail(log_file)}")
        done = subprocess.run(host.command("ss", "-Hltn", f"sport = :{port}"), capture_output=True, text=True)
        if done.stdout.strip():
            return
        time.sleep(0.1)
    raise LabError(f"{name} did not listen on {port} within {timeout_s:.0f} s: {_tail(log_file)}")


def _tail(path: Path) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-5:])
    except OSError:
        return "(no log)"


class _Daemon:
    name = "proxy"

    def __init__(self, hosts: ProxyHosts, workdir: Path):
        self.hosts, self.workdir = hosts, workdir
        self.log_file = workdir / f"{self.name}.log"
        self._proc: subprocess.Popen | None = None
        self.version = ""

    def _start(self, argv: list[str], cwd: Path | None = None) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_file, "w")
        self._proc = subprocess.Popen(self.hosts.proxy_front.command(*argv), stdout=out, stderr=subprocess.STDOUT,
                                      cwd=cwd, start_new_session=True)
        out.close()
        try:
            _wait_listening(self.hosts.proxy_front, PROXY_PORT, 30, self._proc, self.name, self.log_file)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        log(f"{self.name} {self.version} listening on {PROXY_FRONT_IPV4}:{PROXY_PORT}")

    def __exit__(self, *exc) -> None:
        stop_process(self._proc, 10)
        self._proc = None


class HAProxy(_Daemon):
    """Debian's haproxy in TCP mode: each client connection gets its own server connection (L4)."""

    name = "haproxy"

    def __enter__(self) -> HAProxy:
        binary = _sbin_which("haproxy")
        if binary is None:
            raise LabError("haproxy is not installed (apt-get install haproxy, or scripts/install-deps.sh)")
        self.version = subprocess.run([binary, "-v"], capture_output=True, text=True).stdout.split("\n")[0]
        self.version = self.version.split(" version ")[-1].split(" ")[0] if " version " in self.version else ""
        cfg = self.workdir / "haproxy.cfg"
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg.write_text(
            "global\n  maxconn 2000\n\n"
            "defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 120s\n  timeout server 120s\n\n"
            f"frontend mysql_front\n  bind {PROXY_FRONT_IPV4}:{PROXY_PORT}\n  default_backend mysql_back\n\n"
            # `source` pins the server side to the back link's address (the DB's grants name it)
            f"backend mysql_back\n  source {PROXY_BACK_IPV4}\n  server db {PROXY_DB_IPV4}:{PROXY_PORT}\n")
        self._start([binary, "-db", "-f", str(cfg)])
        return self


SLOW_CLIENT_IPV4 = "10.213.78.11"  # a second address on the app host: the client the relay delays


class DelayRelay(_Daemon):
    """relay.py: an L4 relay (one server connection per client connection) that holds each chunk `delay_ms` for
    the connections from SLOW_CLIENT_IPV4, which it adds to the app host: one client on a slow path."""

    name = "relay"

    def __init__(self, hosts: ProxyHosts, workdir: Path, delay_ms: float):
        super().__init__(hosts, workdir)
        self.delay_ms = delay_ms
        self.version = f"relay.py, {delay_ms:g} ms per leg for {SLOW_CLIENT_IPV4}"

    def __enter__(self) -> DelayRelay:
        import sys

        # the links are /30s: the address is the app's alone (/32), and the relay's host routes it to the app link
        subprocess.run(self.hosts.app.command("ip", "addr", "add", f"{SLOW_CLIENT_IPV4}/32", "dev", self.hosts.app.veth),
                       check=True, capture_output=True)
        subprocess.run(self.hosts.proxy_front.command("ip", "route", "add", f"{SLOW_CLIENT_IPV4}/32", "dev",
                                                      self.hosts.proxy_front.veth), check=True, capture_output=True)
        self._start([sys.executable, str(Path(__file__).with_name("relay.py")), "--listen",
                     f"{PROXY_FRONT_IPV4}:{PROXY_PORT}", "--connect", f"{PROXY_DB_IPV4}:{PROXY_PORT}", "--source",
                     PROXY_BACK_IPV4, "--delay-ms", str(self.delay_ms), "--slow", SLOW_CLIENT_IPV4])
        return self


def gaea_binary() -> str | None:
    """The gaea binary: $PCAPDECOMP_GAEA, on PATH, or where install-deps.sh puts it."""
    for candidate in (os.environ.get(GAEA_BINARY_ENV), shutil.which("gaea"), *GAEA_DEFAULT_PATHS):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class Gaea(_Daemon):
    """XiaoMi's Gaea, file-configured: one namespace whose slice is the lab's DB with a pool of `pool_size` server
    connections (capacity = max_capacity), shared by every client connection (L7, pooling)."""

    name = "gaea"

    def __init__(self, hosts: ProxyHosts, workdir: Path, pool_size: int, user: str, password: str):
        super().__init__(hosts, workdir)
        self.pool_size, self.user, self.password = pool_size, user, password

    def __enter__(self) -> Gaea:
        binary = gaea_binary()
        if binary is None:
            raise LabError(f"gaea is not installed (scripts/install-deps.sh builds it from the Go module proxy; "
                           f"or set {GAEA_BINARY_ENV})")
        self.version = "v1.2.5"
        namespace_dir = self.workdir / "etc" / "file" / "namespace"
        namespace_dir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        namespace = {
            "name": "lab", "online": True, "read_only": False, "allowed_dbs": {"lab": True},
            "slow_sql_time": "1000", "black_sql": [""], "allowed_ip": None,
            "slices": [{"name": "slice-0", "user_name": self.user, "password": self.password,
                        "master": f"{PROXY_DB_IPV4}:{PROXY_PORT}", "slaves": None, "statistic_slaves": None,
                        "capacity": self.pool_size, "max_capacity": self.pool_size, "idle_timeout": 3600}],
            "shard_rules": None,
            "users": [{"user_name": self.user, "password": self.password, "namespace": "lab", "rw_flag": 2,
                       "rw_split": 0, "other_property": 0}],
            "default_slice": "slice-0", "global_sequences": None, "max_sql_execute_time": 0,
        }
        (namespace_dir / "lab.json").write_text(json.dumps(namespace, indent=1))
        ini = self.workdir / "gaea.ini"
        ini.write_text(
            "config_type=file\nfile_config_path=./etc/file\nenviron=local\nservice_name=gaea_proxy\n"
            "cluster_name=gaea_lab\nlog_path=./logs\nlog_level=Notice\nlog_filename=gaea\nlog_output=file\n"
            "admin_addr=127.0.0.1:13307\nadmin_user=admin\nadmin_password=admin\nproto_type=tcp4\n"
            f"proxy_addr={PROXY_FRONT_IPV4}:{PROXY_PORT}\nproxy_charset=utf8\nslow_sql_time=1000\n"
            "session_timeout=3600\nstats_enabled=false\nstats_interval=10\nencrypt_key=1234abcd5678efg*\n"
            "server_version=5.6.20-gaea\nauth_plugin=mysql_native_password\n")
        self._start([binary, "-config", str(ini)], cwd=self.workdir)
        return self
