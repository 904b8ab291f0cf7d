#!/usr/bin/env bash
# The lowest versions pyproject.toml allows of the libraries whose internals the services use
# (redis-py, uvicorn, FastAPI: see the comments at their bounds), installed into a throwaway
# venv beside the server extra, and the tests that exercise those internals run there.
#   scripts/check-dependency-floors.sh            # a venv under a new temp dir, removed after
#   FLOORS_VENV=/tmp/floors scripts/check-dependency-floors.sh   # kept and reused
# Needs the package index (or pip's cache) and redis-server/redis-sentinel like the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
# the libraries whose internals the code reaches into, and httpx (the SDK's floor, 0.27: with
# 0.28 the floor FastAPI's Starlette TestClient cannot start)
BOUNDED=(redis uvicorn fastapi httpx)
TESTS=(tests/common/test_redis_url.py tests/common/test_redis_sentinel.py
       tests/common/test_httpserver.py tests/common/test_lean_route.py
       tests/packaging/test_import_name.py)

if [ -n "${FLOORS_VENV:-}" ]; then
    venv=$FLOORS_VENV
else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    venv=$tmp/venv
fi
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
# name==floor for each bounded library, read from the requirements and the server extra
"$PY" - "${BOUNDED[@]}" >"$venv/floors.txt" <<'PY'
import re
import sys
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
deps = project["dependencies"] + project["optional-dependencies"]["server"]
for dep in deps:
    name = re.split(r"[\s\[<>=!~;]", dep, maxsplit=1)[0]
    if name in sys.argv[1:]:
        floor = re.search(r">=\s*([^,;\s]+)", dep)
        assert floor, f"{dep}: no floor (>=)"
        print(f"{name}=={floor.group(1)}")
PY
echo "floors: $(paste -sd' ' "$venv/floors.txt")"
start=$(date +%s)
# the tests' own needs: pytest and its plugins, asyncpg (tests/conftest.py's PostgreSQL helper)
"$venv/bin/pip" install -q --disable-pip-version-check -c "$venv/floors.txt" -e ".[server]" \
    pytest pytest-asyncio pytest-timeout asyncpg 2> >(grep -v "^WARNING: Location" >&2)
"$venv/bin/pip" list --disable-pip-version-check 2>/dev/null | grep -iE "^($(IFS='|'; echo "${BOUNDED[*]}")) "
echo "installed in $(( $(date +%s) - start ))s"
"$venv/bin/python" -m pytest -p no:cacheprovider -q "${TESTS[@]}" "$@"
