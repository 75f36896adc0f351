# One command per chore. CI calls `make test`, exactly as the README says.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed-stamp
CONFIG ?= examples/pools.yaml

.PHONY: help venv etcd run test check lint typecheck imports unit pytest bench proto simulate drill clean

help:
	@echo "make run       set up and start a single-node allocator on $(CONFIG)"
	@echo "make test      set up (virtualenv, dependencies, etcd) and run every check and test"
	@echo "make check     lint, format check, mypy --strict, import layers"
	@echo "make bench     run the benchmarks (writes docs/benchmarks.md)"
	@echo "make proto     regenerate the gRPC stubs from proto/"
	@echo "make drill     randomized failover drill on a three-member etcd (MINUTES=5 SEED=1)"

# Debian's own python3 needs python3-venv for `-m venv`; it is installed when missing.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is needed"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null \
	  && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Debian's etcd-server (3.4) gives the tests a real etcd; they start and stop it themselves.
# etcd-client's etcdctl lets the drills find and move the leader of their three-member etcd.
etcd:
	@{ command -v etcd && command -v etcdctl; } >/dev/null 2>&1 || { \
	  echo "installing etcd-server and etcd-client (Debian packages)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq etcd-server etcd-client >/dev/null; \
	  command -v etcd >/dev/null 2>&1 || command -v /usr/bin/etcd >/dev/null 2>&1; }

run: venv
	$(BIN)/fairshare serve --config $(CONFIG)

check: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

pytest: venv etcd
	$(BIN)/pytest

test: check pytest

# Each benchmark writes its own section of docs/benchmarks.md (about 4 minutes in all).
bench: venv etcd
	$(PY) -m bench.core
	$(PY) -m bench.grpc_service
	$(PY) -m bench.replicated

MINUTES ?= 5
SEED ?= 1
drill: venv etcd
	$(PY) tests/drills/schedule.py --minutes $(MINUTES) --seed $(SEED)

proto: venv
	$(PY) -m server.genproto

# Runs every scenario of the vLLM scheduling simulator; writes docs/simulation.md and its plots.
simulate: venv
	$(PY) -m server.sim --scenario all --out docs/simulation

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
