#!/usr/bin/env bash
# make compose-test: docker-compose.yml run for real, as a user would, on a private Docker daemon.
#
#  1. installs docker.io, docker-compose and debootstrap from Debian when missing;
#  2. starts its own dockerd on a socket and data root under a temporary folder (never the
#     machine's default daemon; no docker0 bridge, no change to the host's IP forwarding),
#     stopped by its PID at the end, the folder removed;
#  3. pulls debian:bookworm-slim, or makes it (deploy/images/debian-base.sh) when no registry
#     answers;
#  4. builds the four images of deploy/images in parallel (BuildKit when the client has it, else
#     the classic builder), passing the host's extra CA certificates for pip as a build argument
#     of the build stage only;
#  5. `docker-compose up -d` of every service but Grafana, on free host ports, until all are
#     healthy; then tests/compose/compose_checks.py against the published ports; then `down -v`.
#
# It prints each step's time, the load average and the image sizes. COMPOSE_TEST_DOCKER_HOST
# runs on an already running private daemon instead (its images and build cache are reused: for
# development, not CI); COMPOSE_TEST_KEEP=1 leaves the services up at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PY:-$REPO/.venv/bin/python}
BASE=debian:bookworm-slim
IMAGES=(tidemq redis etcd prometheus)  # deploy/images/<name>, tagged as docker-compose.yml says

# CPU accounting: this script, its dockerd and every container and build step it runs share one
# cgroup (the script in $CG/run, dockerd's containers under $CG/docker), so each step's CPU
# seconds are its own, whatever else the machine runs. Left out where cgroups are not writable.
CG_NAME=tidemq-compose-$$
CG=""
if [ -f /sys/fs/cgroup/cpuacct/cpuacct.usage ]; then CG=/sys/fs/cgroup/cpuacct/$CG_NAME  # v1
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then CG=/sys/fs/cgroup/$CG_NAME  # v2
fi
if [ -n "$CG" ] && ! { mkdir -p "$CG/run" && echo $$ >"$CG/run/cgroup.procs"; } 2>/dev/null; then
    rmdir "$CG/run" "$CG" 2>/dev/null; CG=""
fi
cpu_ns() {  # CPU time used by everything in the cgroup so far (ns)
    if [ -f "$CG/cpuacct.usage" ]; then cat "$CG/cpuacct.usage"
    elif [ -n "$CG" ]; then echo $(( $(sed -n 's/^usage_usec //p' "$CG/cpu.stat") * 1000 ))
    else echo 0; fi
}
uncgroup() {  # back to the root cgroup; remove ours (and what dockerd made under it)
    [ -n "$CG" ] || return 0
    echo $$ >"$(dirname "$CG")/cgroup.procs"
    find /sys/fs/cgroup -depth -type d -path "*/$CG_NAME*" -exec rmdir {} + 2>/dev/null
    CG=""
}

STEPS=()
START=$(date +%s.%N)
t0=$START
c0=$(cpu_ns)
CPU0=$c0
mark() {  # mark NAME: the time and CPU since the last mark, and the load average now
    local now cpu load
    now=$(date +%s.%N)
    cpu=$(cpu_ns)
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    STEPS+=("$(printf '%-40s %6.1f s %6.1f   %s' "$1" "$(echo "$now - $t0" | bc)" \
        "$(echo "($cpu - $c0) / 1000000000" | bc -l)" "$load")")
    t0=$now c0=$cpu
}
SIZES=()
report() {
    echo
    echo "compose-test: $(nproc) cores; CPU s: used by this run's processes, containers and builds"
    printf '  %-40s %8s %6s   %s\n' step wall "CPU s" "load average (1, 5, 15 min) at its end"
    printf '  %s\n' "${STEPS[@]}"
    printf '  %-40s %6.1f s %6.1f\n' "total" "$(echo "$(date +%s.%N) - $START" | bc)" \
        "$(echo "($(cpu_ns) - $CPU0) / 1000000000" | bc -l)"
    [ ${#SIZES[@]} -eq 0 ] || { echo "compose-test: image sizes"; printf '  %s\n' "${SIZES[@]}"; }
}
say() { echo "compose-test: $*" >&2; }

scripts/install-system-deps.sh compose
mark "install docker.io, compose, debootstrap"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tidemq-compose.XXXXXX")
DOCKERD_PID=""
COMPOSE_UP=""
export COMPOSE_PROJECT_NAME=tidemqci COMPOSE_FILE=$REPO/docker-compose.yml
export COMPOSE_HTTP_TIMEOUT=300

cleanup() {
    local rc=$?
    set +e
    [ $rc -ne 0 ] && mark "FAILED in the step after the last above"
    if [ -n "$COMPOSE_UP" ] && [ "${COMPOSE_TEST_KEEP:-}" != 1 ]; then
        [ $rc -ne 0 ] && docker-compose ps >&2 && docker-compose logs --tail=40 >&2
        docker-compose down -v --remove-orphans >/dev/null 2>&1
    fi
    if [ -n "$DOCKERD_PID" ]; then
        kill "$DOCKERD_PID" 2>/dev/null
        for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$DOCKERD_PID" 2>/dev/null && kill -9 "$DOCKERD_PID"
        grep -o " $TMP/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
    fi
    rm -rf "$TMP"
    mark "stop dockerd, remove its data root"
    report
    uncgroup
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -n "${COMPOSE_TEST_DOCKER_HOST:-}" ]; then
    case "$COMPOSE_TEST_DOCKER_HOST" in
        *"/var/run/docker.sock"|*"/run/docker.sock") say "not the machine's default daemon"; exit 2;;
    esac
    export DOCKER_HOST=$COMPOSE_TEST_DOCKER_HOST
else
    # its own bridge networks only (compose's), and no change to net.ipv4.ip_forward (which
    # would also turn the host's FORWARD policy to DROP): builds use the host's network
    dockerd --host "unix://$TMP/docker.sock" --data-root "$TMP/root" --exec-root "$TMP/exec" \
        --pidfile "$TMP/docker.pid" --bridge=none --ip-forward=false \
        ${CG:+--cgroup-parent=/$CG_NAME/docker} >"$TMP/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    export DOCKER_HOST=unix://$TMP/docker.sock
    for _ in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 0.25; done
    docker info >/dev/null 2>&1 || { tail -n 20 "$TMP/dockerd.log" >&2; say "dockerd did not start"; exit 1; }
fi
mark "start dockerd"

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    if timeout 30 docker pull -q "$BASE" >/dev/null 2>&1; then
        mark "pull $BASE"
    else
        say "no registry gave $BASE: making it with debootstrap"
        deploy/images/debian-base.sh "$BASE"
        mark "debootstrap + import $BASE"
    fi
fi

# Debian's docker client (docker.io) builds with the daemon's BuildKit; a client without it (or
# without buildx) falls back to the classic builder, which compose itself uses
DOCKER=docker
[ -x /usr/bin/docker ] && DOCKER=/usr/bin/docker
if echo "FROM $BASE" | DOCKER_BUILDKIT=1 $DOCKER build -q - >/dev/null 2>&1; then
    export DOCKER_BUILDKIT=1; BUILDER=BuildKit; PROGRESS=(--progress=plain)
else
    export DOCKER_BUILDKIT=0; BUILDER=classic; PROGRESS=()
fi
CA_ARGS=()
extra=$(cat /usr/local/share/ca-certificates/*.crt 2>/dev/null || true)
[ -n "$extra" ] && CA_ARGS=(--build-arg "EXTRA_CA_CERTS=$extra")
build() {  # build NAME: deploy/images/NAME → the tag docker-compose.yml gives it
    local name=$1 tag="tidemq-$1:local" context="deploy/images/$1" dockerfile=() start
    if [ "$name" = tidemq ]; then
        tag=tidemq:local context=. dockerfile=(-f deploy/images/tidemq/Dockerfile)
    fi
    start=$(date +%s.%N)
    $DOCKER build --network host "${PROGRESS[@]}" "${dockerfile[@]}" "${CA_ARGS[@]}" -t "$tag" \
        "$context" >"$TMP/build-$name.log" 2>&1 \
        || { tail -n 40 "$TMP/build-$name.log" >&2; say "building $tag failed"; return 1; }
    printf '%s %.1f\n' "$name" "$(echo "$(date +%s.%N) - $start" | bc)" >"$TMP/build-$name.time"
}
pids=()
for name in "${IMAGES[@]}"; do build "$name" & pids+=($!); done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ $failed -eq 0 ] || exit 1
mark "build ${#IMAGES[@]} images in parallel ($BUILDER)"
for name in "${IMAGES[@]}"; do
    read -r _ secs <"$TMP/build-$name.time"
    STEPS+=("$(printf '  %-38s %6.1f s' "image $name" "$secs")")
done

# every published port on a free one (the variables the compose file reads)
eval "$("$PY" scripts/compose_preflight.py free-ports)"
SERVICES=$(docker-compose config --services | grep -vx grafana)
COMPOSE_UP=1
# shellcheck disable=SC2086
docker-compose up -d --no-build $SERVICES >"$TMP/up.log" 2>&1 \
    || { cat "$TMP/up.log" >&2; exit 1; }
"$PY" scripts/compose_preflight.py wait-healthy $SERVICES
mark "up: every service healthy"

nameserver=$(docker-compose ps -q nameserver-1)
docker cp "$nameserver:/secrets/ca.pem" "$TMP/ca.pem"
docker cp "$nameserver:/secrets/admin.env" "$TMP/admin.env"
set -a; . "$TMP/admin.env"; set +a
TIDEMQ_TLS_CA=$TMP/ca.pem "$PY" -m pytest -q -p no:cacheprovider --durations=0 \
    tests/compose/compose_checks.py
mark "checks (tests/compose/compose_checks.py)"

if [ "${COMPOSE_TEST_KEEP:-}" != 1 ]; then
    docker-compose down -v --remove-orphans >/dev/null 2>&1
    COMPOSE_UP=""
    mark "down -v"
fi

for name in "${IMAGES[@]}"; do
    tag="tidemq-$name:local"; [ "$name" = tidemq ] && tag=tidemq:local
    size=$(docker image inspect -f '{{.Size}}' "$tag")
    SIZES+=("$(printf '%-26s %6d MB' "$tag" $((size / 1000000)))")
done
size=$(docker image inspect -f '{{.Size}}' "$BASE")
SIZES+=("$(printf '%-26s %6d MB' "$BASE" $((size / 1000000)))")
