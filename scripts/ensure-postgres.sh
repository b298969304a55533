#!/usr/bin/env bash
# Sourced by scripts/test.sh: make CONVEYOR_TEST_DATABASE_URL answer, starting a private server if needed.
# at_exit (scripts/exit-hooks.sh) stops what this starts; a script that did not source it gets it here.
declare -F at_exit >/dev/null || source scripts/exit-hooks.sh

pg_answers() {
  .venv/bin/python - "$1" <<'PY' >/dev/null 2>&1
import sys, psycopg
from sqlalchemy.engine import make_url
u = make_url(sys.argv[1])
psycopg.connect(host=u.host or "127.0.0.1", port=u.port or 5432, user=u.username or "postgres",
                password=u.password, dbname=u.database or "postgres", connect_timeout=3).close()
PY
}

find_pg_bin() {
  local dir
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV) /usr/local/bin /usr/bin; do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then echo "$dir"; return 0; fi
  done
  return 1
}

if pg_answers "$CONVEYOR_TEST_DATABASE_URL"; then
  echo "== PostgreSQL answers at $CONVEYOR_TEST_DATABASE_URL"
else
  echo "== no PostgreSQL at $CONVEYOR_TEST_DATABASE_URL; starting a private one"
  if ! PG_BIN=$(find_pg_bin); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
      PG_BIN=$(find_pg_bin) || { echo "PostgreSQL was installed but initdb/pg_ctl were not found" >&2; exit 1; }
    else
      echo "PostgreSQL is needed: install the server (e.g. 'apt-get install postgresql') or set CONVEYOR_TEST_DATABASE_URL" >&2
      exit 1
    fi
  fi
  PG_DIR=$(mktemp -d /tmp/conveyor-pg.XXXXXX)
  PG_PORT=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  RUN_AS=()
  if [ "$(id -u)" = 0 ]; then
    # initdb refuses to run as root.
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    chown postgres "$PG_DIR"
    RUN_AS=(runuser -u postgres --)
  fi
  "${RUN_AS[@]}" "$PG_BIN/initdb" -D "$PG_DIR/data" -U postgres --auth=trust >/dev/null
  "${RUN_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
      -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300" start >/dev/null
  stop_private_pg() { "${RUN_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$PG_DIR"; }
  at_exit stop_private_pg
  export CONVEYOR_TEST_DATABASE_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
  pg_answers "$CONVEYOR_TEST_DATABASE_URL" || { echo "the private PostgreSQL did not start; see $PG_DIR/log" >&2; exit 1; }
fi
