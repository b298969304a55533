#!/usr/bin/env bash
# `make chaos DURATION=… SEED=…`: one chaos run (docs/chaos.md) against a reachable PostgreSQL, started
# privately when none answers, as scripts/test.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONVEYOR_TEST_DATABASE_URL="${CONVEYOR_TEST_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/postgres}"
source scripts/ensure-postgres.sh
exec .venv/bin/python -m chaos "$@"
