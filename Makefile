# `make test` works on a fresh Debian machine (root, package registries only): `deps` bootstraps first.
SHELL := /bin/bash
VENV := .venv
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: deps lint test demo bench deploy-assets

deps:
	@bash scripts/bootstrap.sh

lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: lint
	$(VENV)/bin/pytest -q -m "not slow" $(PYTEST_ARGS)

demo: deps
	$(VENV)/bin/python -m playground.demo

# Benchmark with references (docs/benchmarks.md), e.g. make bench BENCH_ARGS="--workload a --sink sqlite"
bench: deps
	$(VENV)/bin/python -m bench $(BENCH_ARGS)

# Regenerate the generated deploy/ files (tests fail while they are stale): the Grafana dashboard from
# deploy/grafana/dashboard.py, the Kubernetes PrometheusRule from deploy/prometheus/alerts.yml
deploy-assets: deps
	$(VENV)/bin/python deploy/grafana/dashboard.py
	$(VENV)/bin/python deploy/kubernetes/sync_rules.py
