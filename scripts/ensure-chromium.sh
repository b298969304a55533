#!/usr/bin/env bash
# The dashboard's browser tests drive Debian's chromium through Playwright (Playwright's own browser
# download cannot be assumed to reach its host). Installs it when missing and running as root.
if [ -n "${CONVEYOR_TEST_CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1; then
  return 0 2>/dev/null || exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing Debian's chromium for the dashboard's browser tests"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q chromium >/dev/null 2>&1; then
    apt-get update -q >/dev/null
    apt-get install -y -q chromium >/dev/null
  fi
else
  echo "the dashboard's browser tests need chromium: apt-get install chromium (as root), or set CONVEYOR_TEST_CHROMIUM to a Chromium binary" >&2
  exit 1
fi
