#!/usr/bin/env bash
# Install the benchmark peers that bench/produce_consume.py compares tidemq with, when missing:
#   - nats-server (Debian package; needs root or sudo)  - NATS JetStream peer
#   - nats-py (pip, into the project's virtualenv)      - its Python client
# Redis Streams uses redis-server and redis-py, which the project installs anyway (make redis).
#
# This never fails the bench: whatever cannot be installed is reported with the reason, and the
# bench then reports that peer as skipped. Usage: bench/install-peers.sh [path/to/venv]
set -u

VENV="${1:-${VENV:-.venv}}"
PIP="$VENV/bin/pip"
PY="$VENV/bin/python"

say() { printf 'install-peers: %s\n' "$*" >&2; }

# --- nats-server (Debian) ---------------------------------------------------------------------
if command -v nats-server >/dev/null 2>&1; then
  say "nats-server present ($(nats-server --version 2>/dev/null || echo '?'))"
elif ! command -v apt-get >/dev/null 2>&1; then
  say "nats-server missing and apt-get not found (not Debian/Ubuntu): NATS peer will be skipped"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      SUDO="sudo -n"
    else
      say "nats-server missing and not root (no passwordless sudo): NATS peer will be skipped;" \
          "run 'apt-get install -y nats-server' as root to include it"
      SUDO="none"
    fi
  fi
  if [ "$SUDO" != "none" ]; then
    say "installing nats-server with apt-get ..."
    if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q nats-server >/tmp/install-peers-apt.log 2>&1; then
      # the package lists may be missing or stale on a fresh machine
      $SUDO apt-get update -q >>/tmp/install-peers-apt.log 2>&1 || true
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q nats-server >>/tmp/install-peers-apt.log 2>&1 || true
    fi
    if command -v nats-server >/dev/null 2>&1; then
      say "nats-server installed ($(nats-server --version 2>/dev/null || echo '?'))"
    else
      say "could not install nats-server (see /tmp/install-peers-apt.log): NATS peer will be" \
          "skipped"
    fi
  fi
fi

# --- nats-py (pip into the virtualenv) --------------------------------------------------------
if [ ! -x "$PY" ]; then
  say "no virtualenv at $VENV: cannot check nats-py (make creates it); NATS peer may be skipped"
elif "$PY" -c 'import nats' >/dev/null 2>&1; then
  say "nats-py present"
elif "$PIP" install -q 'nats-py>=2.6' >/tmp/install-peers-pip.log 2>&1; then
  say "nats-py installed into $VENV"
else
  say "could not pip install nats-py (see /tmp/install-peers-pip.log): NATS peer will be skipped"
fi

exit 0
