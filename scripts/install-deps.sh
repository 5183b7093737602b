#!/usr/bin/env bash
# Install everything pcapdecomp's tests and lab need on Debian/Ubuntu (run as root), then the package itself.
# Debian packages: MariaDB server (the lab's private server), tcpdump (the lab's captures), tshark and
# percona-toolkit (reference tools the tests cross-check against), iproute2 (network namespaces), openssl (lab TLS
# certificate), libmariadb-dev (MariaDB Connector/C for the lab's cursor client), chromium (report rendering test).
# haproxy is the lab's L4 proxy. sysbench drives the lab's sysbench scenario (the speed benchmark). gcc (and python3-dev for Debian's python3)
# build the optional native extension.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pair in mariadbd:mariadb-server mariadb:mariadb-client tcpdump:tcpdump tshark:tshark pt-fingerprint:percona-toolkit \
            ip:iproute2 openssl:openssl chromium:chromium sysbench:sysbench haproxy:haproxy; do
  bin=${pair%%:*}; pkg=${pair##*:}
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need+=("$pkg")
done
dpkg -s libmariadb-dev >/dev/null 2>&1 || need+=(libmariadb-dev)
# the optional native extensions (pcapdecomp/_lane.c, pcapdecomp/_speedups.c): a C compiler, and Python's headers for Debian's python3
command -v cc >/dev/null 2>&1 || need+=(gcc)
python3 -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || { [ "$(command -v python3)" = /usr/bin/python3 ] && need+=(python3-dev); } || true
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing Debian packages (${need[*]}) and not root: install them, or run as root" >&2
  else
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi
# Gaea (XiaoMi's pooling MySQL proxy) for the lab's proxy-pool scenario: built from the Go module proxy with the
# versions pinned in captures/lab/gaea/go.sum (≈ 3 min on a clean machine, nothing when the binary is there).
# Only recording that scenario needs it, so a machine without Go gets a warning, not a failure.
if [ ! -x /usr/local/bin/gaea ] && [ "$(id -u)" = 0 ]; then
  if command -v go >/dev/null 2>&1; then
    gaea_build=$(mktemp -d)
    cp captures/lab/gaea/go.mod captures/lab/gaea/go.sum captures/lab/gaea/tools.go "$gaea_build"/
    (cd "$gaea_build" && GOFLAGS=-mod=mod go build -o /usr/local/bin/gaea github.com/XiaoMi/Gaea/cmd/gaea) \
      || echo "install-deps: warning: building gaea failed; the lab's proxy-pool scenario cannot run" >&2
    rm -rf "$gaea_build"
  else
    echo "install-deps: warning: no Go toolchain, gaea not built; the lab's proxy-pool scenario cannot run" >&2
  fi
fi
python3 -m pip install -q --disable-pip-version-check -e ".[test,dask]"
