#!/usr/bin/env bash
# mypy over the SDK and the services under their import names: scripts/mypy.sh [FILE ...]
#
# The services' folder services/ is imported as tidemq_server (package-dir in pyproject.toml), a
# mapping mypy cannot read. So mypy reads them through .lint/tidemq_server, a link to services/
# made here (git-ignored); pyproject.toml's mypy_path lists .lint and sdk. Files given as
# services/... are checked as tidemq_server modules; paths in the output read services/... again.
# Without FILE: every module of both packages (what `make lint` runs).
set -euo pipefail
cd "$(dirname "$0")/.."
MYPY=${MYPY:-.venv/bin/mypy}
mkdir -p .lint
ln -sfn ../services .lint/tidemq_server
args=()
for f in "$@"; do
    case "$f" in
        services/*) args+=(".lint/tidemq_server/${f#services/}") ;;
        *) args+=("$f") ;;
    esac
done
[ ${#args[@]} -gt 0 ] || args=(-p tidemq -p tidemq_server)
set +e
"$MYPY" "${args[@]}" 2>&1 | sed 's#^\.lint/tidemq_server/#services/#'
exit "${PIPESTATUS[0]}"
