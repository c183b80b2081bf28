PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SOURCES := queue_server cli tests migrations reliability
TYPED := queue_server cli tests reliability

.PHONY: help install serve test lint unit fmt clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install the project with its dev tools

serve: $(STAMP) ## Serve on 127.0.0.1:8080 (embedded PostgreSQL unless QUEUE_SERVER_DATABASE_URL is set)
	$(BIN)/queue-server serve

lint: $(STAMP) ## ruff and mypy
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/mypy $(TYPED)

unit: $(STAMP) ## The test suite only
	$(BIN)/pytest -q

test: lint unit ## Lint, then the whole test suite

fmt: $(STAMP) ## Format and fix what ruff can
	$(BIN)/ruff format $(SOURCES)
	$(BIN)/ruff check --fix $(SOURCES)

clean: ## Remove the virtual environment
	rm -rf $(VENV)
