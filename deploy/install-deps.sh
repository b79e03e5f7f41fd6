#!/usr/bin/env bash
# Installs every build and test dependency of vSocket from Debian 12 packages.
# Idempotent and quiet; fails loudly. Run as root (or via sudo).
set -euo pipefail

PACKAGES=(
  # build
  bazel-bootstrap bazel-platforms bazel-rules-java
  clang libclang-rt-14-dev pkg-config
  libgtest-dev googletest
  libdpdk-dev
  libibverbs-dev rdma-core ibverbs-providers
  libcuckoo-dev
  libssl-dev openssl
  libcurl4-openssl-dev nlohmann-json3-dev
  # the cluster directory (locator = etcd://...) and its tests
  etcd-server etcd-client
  # Debian packages (deploy/package.sh; no fakeroot: Rules-Requires-Root: no)
  dpkg-dev debhelper
  # test beds and tools
  iproute2 nftables socat procps python3 strace
  # real applications in the end-to-end tests
  sockperf iperf3 redis-server redis-tools nginx curl wrk memcached libmemcached-tools
  postgresql-15 postgresql-client-15 openssh-server openssh-client haproxy
  # the application matrix (tests/e2e/same_host/62_http_servers.sh .. 75_mariadb.sh)
  nodejs python3-aiohttp apache2 apache2-utils rsync python3-grpcio
  mariadb-server mariadb-client sysbench
  # bench/ plots
  gnuplot-nox
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/vsocket-apt.log 2>&1; then
  $SUDO apt-get update -qq >>/tmp/vsocket-apt.log 2>&1 || { cat /tmp/vsocket-apt.log >&2; exit 1; }
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >>/tmp/vsocket-apt.log 2>&1 \
    || { echo "install-deps: apt-get failed:" >&2; tail -30 /tmp/vsocket-apt.log >&2; exit 1; }
fi
