#!/usr/bin/env bash
# Install the benchmark peers that the benches compare tidemq with, when missing:
#   - nats-server (Debian package; needs root or sudo)  - NATS JetStream peer
#   - nats-py (pip, into the project's virtualenv)      - its Python client
#   - hiredis (pip, into the project's virtualenv)      - the parser a Redis user installs with
#                                                         redis-py (the Redis Streams peer)
# redis-server and redis-py the project installs anyway (scripts/install-system-deps.sh).
#
# The script itself never fails: whatever cannot be installed is reported with the reason. The
# benches run it when a peer is missing and then report a peer that still cannot run as an
# error. Usage: bench/install-peers.sh [path/to/venv]
set -u

VENV="${1:-${VENV:-.venv}}"
PIP="$VENV/bin/pip"
PY="$VENV/bin/python"

say() { printf 'install-peers: %s\n' "$*" >&2; }

# --- nats-server (Debian) ---------------------------------------------------------------------
if command -v nats-server >/dev/null 2>&1; then
  say "nats-server present ($(nats-server --version 2>/dev/null || echo '?'))"
elif ! command -v apt-get >/dev/null 2>&1; then
  say "nats-server missing and apt-get not found (not Debian/Ubuntu): the NATS peer cannot run"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      SUDO="sudo -n"
    else
      say "nats-server missing and not root (no passwordless sudo): the NATS peer cannot run;" \
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
      say "could not install nats-server (see /tmp/install-peers-apt.log): the NATS peer" \
          "cannot run"
    fi
  fi
fi

# --- nats-py and hiredis (pip into the virtualenv) -------------------------------------------
pip_peer() {  # module, requirement, what it is for
  if [ ! -x "$PY" ]; then
    say "no virtualenv at $VENV: cannot check $2 (make creates it)"
  elif "$PY" -c "import $1" >/dev/null 2>&1; then
    say "$2 present"
  elif "$PIP" install -q "$2" >>/tmp/install-peers-pip.log 2>&1; then
    say "$2 installed into $VENV"
  else
    say "could not pip install $2 (see /tmp/install-peers-pip.log): the $3 peer cannot run"
  fi
}
pip_peer nats 'nats-py>=2.6' "NATS JetStream"
pip_peer hiredis 'hiredis>=2.0' "Redis Streams"

exit 0
