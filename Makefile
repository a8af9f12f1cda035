# `make test` works on a fresh Debian machine (root, package registries only): `deps` bootstraps first.
SHELL := /bin/bash
VENV := .venv
PYTEST_ARGS ?=

.PHONY: deps lint test demo

deps:
	@bash scripts/bootstrap.sh

lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: lint
	$(VENV)/bin/pytest -q -m "not slow" $(PYTEST_ARGS)

demo: deps
	$(VENV)/bin/python -m playground.demo
