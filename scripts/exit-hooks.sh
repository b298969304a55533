#!/usr/bin/env bash
# Sourced first by scripts/test.sh and scripts/with-docker.sh: `at_exit FUNCTION` runs FUNCTION when the
# script ends, in reverse order of registration, also when it is interrupted (Ctrl-C, SIGTERM, SIGHUP), so
# each sourced ensure-*.sh stops what it started without replacing another's trap.
EXIT_HOOKS=()
at_exit() { EXIT_HOOKS+=("$1"); }
run_exit_hooks() {
  local i
  for ((i = ${#EXIT_HOOKS[@]} - 1; i >= 0; i--)); do "${EXIT_HOOKS[i]}" || true; done
  EXIT_HOOKS=()
}
trap run_exit_hooks EXIT
# A signal ends the script through `exit`, which runs the EXIT trap (bash does not run it on every signal).
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
