#!/bin/sh
# Entrypoint of the tidemq image. Started as root, it creates the service's data directory (the
# path its one TIDEMQ_<SERVICE>_DATA_DIR setting names, whatever volume is mounted there), gives
# it to the tidemq user when someone else owns it (a volume Docker made, or an older image's),
# then runs the command as tidemq. Started as another user (docker run --user), it only runs it.
set -eu
if [ "$(id -u)" = 0 ]; then
    env | sed -n 's/^TIDEMQ_[A-Z]*_DATA_DIR=//p' | while IFS= read -r dir; do
        [ -n "$dir" ] || continue
        mkdir -p "$dir"
        [ "$(stat -c %U "$dir")" = tidemq ] || chown -R tidemq:tidemq "$dir"
    done
    exec setpriv --reuid=tidemq --regid=tidemq --init-groups "$@"
fi
exec "$@"
