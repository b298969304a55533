#!/usr/bin/env bash
# Run a command with CONVEYOR_TEST_DOCKER_HOST set: a private Docker engine with the test images loaded,
# stopped (and its host changes undone) when the command ends. For working on the container tests alone:
#   scripts/with-docker.sh .venv/bin/pytest tests/integration/scaler/test_container_backend.py -q
# (`make test` starts its own through scripts/test.sh.)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/exit-hooks.sh
source scripts/ensure-docker.sh
"$@"
