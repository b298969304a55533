# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench chaos clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Conveyor needs Python 3.11 or newer; set PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $@ $(VENV)/.installed

## Start Conveyor: orchestrator on the embedded SQLite database in $CONVEYOR_HOME (default ~/.conveyor),
## with the built-in `local` scaler that starts an agent on this machine for each job.
run: $(VENV)/.installed
	@echo "Conveyor is starting. Next, in another terminal (the owner token is printed below on the first boot):"
	@echo "  1. export PATH=\"$(abspath $(BIN)):\$$PATH\" CONVEYOR_URL=http://127.0.0.1:8470 CONVEYOR_TOKEN=<owner token>"
	@echo "  2. cd <your repo> && conveyor init && conveyor compile && git add -A && git commit -m 'ci'"
	@echo "  3. conveyor admin source add --type local --name app --path . && conveyor admin source trigger-local app"
	@echo "  4. conveyor admin run logs <RUN> --follow   (no agent to start: the local scaler spawns one per job)"
	@echo "Dashboard: http://127.0.0.1:8470/ui (sign in by pasting the owner token)"
	$(BIN)/conveyor up

## Run everything CI runs: ruff, mypy, lint-imports and the whole pytest suite on SQLite and PostgreSQL.
test: $(VENV)/.installed-test
	scripts/test.sh

## Benchmarks, quick mode (< 10 min): every bench/ script, the Buildbot peer included (installed into
## bench/.venv-buildbot), then one summary table. Full run: `.venv/bin/python -m bench.run_all`.
## container_start needs a Docker engine: scripts/with-docker.sh provides one (docs/operations.md).
bench: $(VENV)/.installed-test
	scripts/with-docker.sh $(BIN)/python -m bench.run_all --quick $(BENCH_ARGS)

## Chaos: a cluster under load and a seeded fault schedule, then its invariants checked (docs/chaos.md).
## `make chaos DURATION=30m SEED=7`; extra flags in CHAOS_ARGS (e.g. `--rate 20 --keep`).
DURATION ?= 60
SEED ?= 1
chaos: $(VENV)/.installed-test
	scripts/chaos.sh --duration $(DURATION) --seed $(SEED) $(CHAOS_ARGS)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check src tests examples chaos
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
