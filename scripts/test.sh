#!/usr/bin/env bash
# Run the whole test suite: lint, types, then pytest against a reachable PostgreSQL and a Docker engine.
# Uses CONVEYOR_TEST_DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres); when none
# answers, starts a private PostgreSQL in a temp dir on a free port and stops it afterwards. Uses
# CONVEYOR_TEST_DOCKER_HOST, else starts a private dockerd the same way (scripts/ensure-docker.sh);
# CONVEYOR_TEST_DOCKER=0 skips the container tests.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin

export CONVEYOR_TEST_DATABASE_URL="${CONVEYOR_TEST_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/postgres}"
source scripts/exit-hooks.sh
source scripts/ensure-postgres.sh
source scripts/ensure-chromium.sh
source scripts/ensure-docker.sh

echo "== ruff"
$BIN/ruff check .
$BIN/ruff format --check src tests examples chaos
echo "== mypy"
$BIN/mypy
echo "== lint-imports (the layers of docs/design/ARCHITECTURE.md §3)"
$BIN/lint-imports --no-cache
echo "== pytest (PostgreSQL: ${CONVEYOR_TEST_DATABASE_URL})"
# Every test starts servers, agents and CLIs: each would compile Conveyor's ~230 modules again where
# PYTHONDONTWRITEBYTECODE is set (some CI images set it), so the bytecode is written once, here, and
# the suite's processes (pytest's assertion-rewrite cache included) may write theirs.
unset PYTHONDONTWRITEBYTECODE
$BIN/python -m compileall -q -j 0 src chaos >/dev/null
workers="${CONVEYOR_TEST_WORKERS:-4}"
# The slowest tests are listed at the end, so a suite that grows slow says where.
$BIN/pytest -n "$workers" --dist loadgroup --durations=30 "$@"
