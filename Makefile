# `make test` works on a fresh Debian machine (root, package registries only): `deps` bootstraps first.
SHELL := /bin/bash
VENV := .venv
PYTEST_ARGS ?=
# pytest-xdist workers: each has its own servers (tests/conftest.py); Spark tests share one worker (loadgroup).
# 3 on the 2-core machine: the suite waits on servers more than it computes (docs/testing.md, "Workers").
# TEST_WORKERS=0 runs in this process, serially (docs/testing.md)
TEST_WORKERS ?= 3
BENCH_ARGS ?=
SINK ?= sqlite
UPSTREAM ?= postgresql
DEMO_ARGS ?=

.PHONY: deps lint test demo bench deploy-assets

deps:
	@bash scripts/bootstrap.sh

lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: lint
	$(VENV)/bin/pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadgroup --durations=20 $(PYTEST_ARGS)

# The demo into another target: make demo SINK=kafka|file|mariadb|postgresql (default sqlite), e.g. a short run:
# make demo SINK=kafka DEMO_ARGS="--txns 30 --big-rows 1000 --existing-rows 100"
# From a MariaDB upstream (row binlog; SQL targets only): make demo UPSTREAM=mariadb SINK=mariadb (docs/demo.md)
demo: deps
	$(VENV)/bin/python -m playground.demo --upstream $(UPSTREAM) --sink $(SINK) $(DEMO_ARGS)

# Benchmark with references (docs/benchmarks.md), e.g. make bench BENCH_ARGS="--workload a --sink sqlite"
bench: deps
	$(VENV)/bin/python -m bench $(BENCH_ARGS)

# Regenerate the generated deploy/ files (tests fail while they are stale): the Grafana dashboard from
# deploy/grafana/dashboard.py, the Kubernetes PrometheusRule from deploy/prometheus/alerts.yml
deploy-assets: deps
	$(VENV)/bin/python deploy/grafana/dashboard.py
	$(VENV)/bin/python deploy/kubernetes/sync_rules.py
