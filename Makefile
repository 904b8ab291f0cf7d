# tidemq: every target bootstraps .venv when it is missing or older than the project files.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp

.PHONY: up test test-unit test-pure bench bench-quick lint clean system-deps compose-up compose-test

# one distribution (pyproject.toml): the SDK, the services and, through the dev extra, the
# server and metrics extras and the test tools; editable, so sources are used in place. The
# install also compiles the record core (setup.py: Cython + gcc), again when its source changes.
$(STAMP): pyproject.toml setup.py sdk/tidemq/protocol/records/_crecords.pyx
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip uninstall -q -y tidemq-services 2>/dev/null || true  # the former services dist
	$(BIN)/pip install -q -e ".[dev]"
	@touch $(STAMP)

# redis-server, Java (for Spark), promtool and docker-compose come from Debian's packages
# (needs root, or sudo) when missing; the script installs only what is absent.
system-deps:
	@scripts/install-system-deps.sh

# UP_ARGS passes options through to `tidemq up`, e.g. make up UP_ARGS='--grpc-port 18081'
up: $(STAMP) system-deps
	$(BIN)/tidemq up $(UP_ARGS)

# The suite runs in parallel (pytest-xdist): one worker per CPU plus one, at most 4 (the
# integration tests start several processes each and spend much of their time waiting on them:
# on 2 cores, 3 workers ran the suite in 17:41 where 2 took 20:30), every test file on one
# worker so that a module's fixtures start once. PYTEST_WORKERS=0 runs it in this one process,
# e.g. make test PYTEST_WORKERS=0 PYTEST_ARGS='tests/cli/test_cli.py -x'
PYTEST_WORKERS ?= $(shell n=$$(( $$(nproc 2>/dev/null || echo 2) + 1 )); [ "$$n" -gt 4 ] && n=4; echo $$n)
XDIST := -n $(PYTEST_WORKERS) --dist loadfile

test: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 $(XDIST) $(PYTEST_ARGS)

# docker-compose.yml for real (scripts/compose-test.sh): on a private dockerd under a temporary
# folder, images built from a debootstrapped Debian base, every service but Grafana up, checked
# from the host on the published ports (tests/compose/compose_checks.py), then down. Needs root.
compose-test: $(STAMP)
	scripts/compose-test.sh

# `docker compose up` after checking that Docker is there and every published port is free
# (a taken one is named with its service and the variable that moves it)
COMPOSE := $(shell command -v docker-compose >/dev/null 2>&1 && echo docker-compose || echo docker compose)
compose-up: $(STAMP)
	$(BIN)/python scripts/compose_preflight.py check
	$(COMPOSE) up -d --build

# The tests that start no real process (no redis-server, service, Spark or docker-compose).
test-unit: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) -m "not integration" $(PYTEST_ARGS)

# test-unit on the pure-Python record core (the compiled one disabled): the fallback a machine
# without a compiler runs stays tested
test-pure: $(STAMP)
	TIDEMQ_PURE_PYTHON=1 $(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) \
		-m "not integration" $(PYTEST_ARGS)

# bench/install-peers.sh installs the peers measured beside tidemq (nats-server, nats-py,
# hiredis); a peer that still cannot run is an error of the bench that needs it.
bench: $(STAMP) system-deps
	@bench/install-peers.sh $(VENV)
	$(BIN)/python -m bench.run_all $(BENCH_ARGS)

bench-quick: $(STAMP) system-deps
	@bench/install-peers.sh $(VENV)
	$(BIN)/python -m bench.run_all --quick $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check sdk services tests bench examples scripts setup.py
	MYPY=$(BIN)/mypy scripts/mypy.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .lint
