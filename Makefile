# tidemq: every target bootstraps .venv when it is missing or older than the project files.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp

.PHONY: up test test-fast bench bench-quick lint typecheck clean redis

$(STAMP): pyproject.toml sdk/pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e sdk -e ".[dev]"
	@touch $(STAMP)

# redis-server comes from Debian's package (needs root, or sudo) when it is not installed.
redis:
	@command -v redis-server >/dev/null 2>&1 || scripts/install-system-deps.sh

up: $(STAMP) redis
	$(BIN)/tidemq up

test: $(STAMP) redis
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# bench/install-peers.sh installs the peers measured beside tidemq (nats-server, nats-py);
# it never fails the run: a missing peer is reported as skipped.
bench: $(STAMP) redis
	@bench/install-peers.sh $(VENV)
	$(BIN)/python -m bench.run_all $(BENCH_ARGS)

bench-quick: $(STAMP) redis
	@bench/install-peers.sh $(VENV)
	$(BIN)/python -m bench.run_all --quick $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check sdk services tests bench
	$(BIN)/mypy sdk/tidemq services

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
