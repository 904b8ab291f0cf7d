#!/usr/bin/env bash
# Installs the system packages tidemq needs from Debian when they are missing.
# Needs root (or passwordless sudo): these are Debian packages.
#   scripts/install-system-deps.sh           # what `make test` and `make up` need
#   scripts/install-system-deps.sh compose   # what `make compose-test` needs: a Docker engine,
#                                            # docker-compose and debootstrap (base images)
set -euo pipefail
need=()
if [ "${1:-}" = compose ]; then
    command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
    command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
    command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
    command -v bc >/dev/null 2>&1 || need+=(bc)  # the step times
else
    # the compiled record core (setup.py): a C compiler, Python's and zlib's headers
    command -v gcc >/dev/null 2>&1 || need+=(gcc)
    python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(
        sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null || need+=(python3-dev)
    [ -f /usr/include/zlib.h ] || need+=(zlib1g-dev)
    command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
    command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)  # PySpark metrics job
    command -v promtool >/dev/null 2>&1 || need+=(prometheus)  # promtool: exposition and rule tests
    command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)  # offline compose validation
    command -v curl >/dev/null 2>&1 || need+=(curl)  # the README's examples (and their test)
    command -v jq >/dev/null 2>&1 || need+=(jq)
    [ -x /usr/bin/etcd ] || command -v etcd >/dev/null 2>&1 || need+=(etcd-server)  # failover
    [ -x /usr/bin/chromium ] || need+=(chromium)  # the console's browser tests (Playwright)
    # the faults suite between namespace hosts (tests/bench/faults, bench/faults.py; as root)
    command -v ip >/dev/null 2>&1 || need+=(iproute2)
    command -v iptables >/dev/null 2>&1 || need+=(iptables)
    ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || need+=(libfaketime)  # clock faults
    # PostgreSQL: the outbox tests start their own server (Debian keeps initdb/postgres off PATH)
    command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
      || need+=(postgresql)
fi
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "installing from Debian: ${need[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
