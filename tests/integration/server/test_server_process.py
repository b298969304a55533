"""`conveyor server` as a real process: probes, first-boot token, schema checks, config errors, CLI."""

import json
import signal
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select, text

from conveyor.db.migrate import downgrade_to, upgrade_to
from conveyor.db.tables import access_log
from tests.support import postgres
from tests.support.processes import TOKEN_PATTERN, ServerProcess, free_port, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def fresh_home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def test_first_boot_serves_probes_and_prints_the_owner_token_once(
    empty_database_url: str, fresh_home: Path
) -> None:
    server = ServerProcess(fresh_home, database_url=empty_database_url)
    try:
        server.wait_ready()
        assert server.get("/health").json()["status"] == "ok"
        metrics = server.get("/metrics").text
        assert "conveyor_build_info" in metrics and "conveyor_http_requests_total" in metrics
        token = server.owner_token()
        assert server.output().count(token) == 1
        answer = server.get("/api/v1/admin/tokens", headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.output()

    again = ServerProcess(fresh_home, database_url=empty_database_url)
    try:
        again.wait_ready()
        assert not TOKEN_PATTERN.search(again.output())
    finally:
        again.stop()


def test_unreachable_postgres_keeps_health_up_and_ready_naming_the_database(fresh_home: Path) -> None:
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    server = ServerProcess(fresh_home, database_url=dead, env={"CONVEYOR_READY_CACHE_MS": "0"})
    try:
        server.wait_listening()
        assert server.get("/health").status_code == 200
        ready = server.get("/ready")
        assert ready.status_code == 503
        assert "database" in ready.json()["checks"]["database"]["detail"]
        assert ready.json()["checks"]["database"]["ok"] is False
    finally:
        server.stop()


def test_no_migrate_on_an_older_schema_exits_naming_db_migrate(
    empty_database_url: str, fresh_home: Path
) -> None:
    upgrade_to(empty_database_url)
    downgrade_to(empty_database_url, "-1")
    server = ServerProcess(fresh_home, database_url=empty_database_url, args=["--no-migrate"])
    try:
        assert server.wait_exit() != 0
        assert "conveyor admin db migrate" in server.output()
    finally:
        server.stop()
    migrated = run_cli(["admin", "db", "migrate", "--database-url", empty_database_url])
    assert migrated.returncode == 0, migrated.stderr
    status = run_cli(["admin", "db", "status", "--database-url", empty_database_url, "--json"])
    assert json.loads(status.stdout)["state"] == "current"
    restarted = ServerProcess(fresh_home, database_url=empty_database_url, args=["--no-migrate"])
    try:
        restarted.wait_ready()
    finally:
        restarted.stop()


def test_schema_newer_than_the_build_keeps_health_but_not_ready(database_url: str, fresh_home: Path) -> None:
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff_future'"))
    engine.dispose()
    server = ServerProcess(fresh_home, database_url=database_url, env={"CONVEYOR_READY_CACHE_MS": "0"})
    try:
        server.wait_listening()
        ready = server.get("/ready").json()
        assert ready["ready"] is False
        assert ready["checks"]["migrations"]["ok"] is False
        assert "ffff_future" in ready["checks"]["migrations"]["detail"]
    finally:
        server.stop()


def test_misspelt_variable_fails_start_naming_the_right_one(fresh_home: Path) -> None:
    result = run_cli(["server"], env={"CONVEYOR_PROT": "1", "CONVEYOR_HOME": str(fresh_home)})
    assert result.returncode != 0
    assert "CONVEYOR_PORT" in result.stderr
    assert "Traceback" not in result.stderr


def test_two_coordinators_on_an_empty_postgres_print_one_owner_token(tmp_path: Path) -> None:
    postgres.check_reachable()
    name = postgres.new_database_name()
    url = postgres.create_database(name)
    shared_key = {"CONVEYOR_SECRET_KEY": "ab" * 32}  # coordinators of one database share the master key
    servers = [ServerProcess(tmp_path / f"home{i}", database_url=url, env=shared_key) for i in range(2)]
    try:
        for server in servers:
            server.wait_ready()
        tokens = [TOKEN_PATTERN.findall(s.output()) for s in servers]
        assert sorted(len(t) for t in tokens) == [0, 1]
    finally:
        for server in servers:
            server.stop()
        postgres.drop_database(name)


def test_admin_cli_token_lifecycle_and_exit_codes(database_url: str, fresh_home: Path) -> None:
    server = ServerProcess(fresh_home, database_url=database_url)
    try:
        server.wait_ready()
        owner = {"CONVEYOR_URL": server.url, "CONVEYOR_TOKEN": server.owner_token()}
        created = run_cli(["admin", "token", "create", "--role", "auditor", "--json"], env=owner)
        assert created.returncode == 0, created.stderr
        auditor = json.loads(created.stdout)
        assert auditor["token"].startswith("cvy_admin_")
        as_auditor = {"CONVEYOR_URL": server.url, "CONVEYOR_TOKEN": auditor["token"]}

        refused = run_cli(["admin", "token", "create", "--role", "admin"], env=as_auditor)
        assert refused.returncode == 3
        assert "403" in refused.stderr and "permission" not in refused.stdout
        assert "Traceback" not in refused.stderr

        listed = run_cli(["admin", "--json", "token", "list"], env=owner)
        assert {t["id"] for t in json.loads(listed.stdout)["items"]} >= {auditor["id"]}

        no_tty = run_cli(["admin", "token", "revoke", auditor["id"]], env=owner)
        assert no_tty.returncode == 2
        revoked = run_cli(["admin", "token", "revoke", auditor["id"], "--yes"], env=owner)
        assert revoked.returncode == 0, revoked.stderr
        after = run_cli(["admin", "token", "list"], env=as_auditor)
        assert after.returncode == 3 and "401" in after.stderr

        missing = run_cli(["admin", "token", "list"], env={"CONVEYOR_URL": server.url})
        assert missing.returncode == 3
        usage = run_cli(["admin", "token", "list", "--database-url", "x"], env=owner)
        assert usage.returncode == 2
        gone = run_cli(["admin", "access-log", "show", "nope"], env=owner)
        assert gone.returncode == 4
    finally:
        server.stop()


def test_offline_bootstrap_mints_a_working_owner_token(database_url: str, fresh_home: Path) -> None:
    result = run_cli(["admin", "token", "bootstrap", "--database-url", database_url, "--label", "rescue"])
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert TOKEN_PATTERN.fullmatch(token)
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        sources = [row.source for row in conn.execute(select(access_log.c.source))]
    engine.dispose()
    assert sources == ["cli_offline"]
    server = ServerProcess(fresh_home, database_url=database_url)
    try:
        server.wait_ready()
        assert (
            server.get("/api/v1/admin/tokens", headers={"Authorization": f"Bearer {token}"}).status_code
            == 200
        )
    finally:
        server.stop()


def test_offline_bootstrap_refuses_an_unmigrated_database(empty_database_url: str) -> None:
    result = run_cli(["admin", "token", "bootstrap", "--database-url", empty_database_url])
    assert result.returncode == 1
    assert "db migrate" in result.stderr


def test_sigterm_shuts_down_cleanly(database_url: str, fresh_home: Path) -> None:
    server = ServerProcess(fresh_home, database_url=database_url)
    server.wait_ready()
    server.signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    server.stop()


def test_worker_mode_without_coordinators_or_a_coordinator_with_a_worker_admin_token_refuses_to_start(
    tmp_path: Path,
) -> None:
    for args, env, message in (
        (["server", "--role", "worker"], {}, "worker mode needs its coordinators"),
        (["server"], {"CONVEYOR_CLUSTER_ROLE": "worker"}, "worker mode needs its coordinators"),
        (["server"], {"CONVEYOR_WORKER_ADMIN_TOKEN": "t"}, "CONVEYOR_WORKER_ADMIN_TOKEN is for workers"),
    ):
        done = run_cli(args, env={"CONVEYOR_HOME": str(tmp_path / "home"), "CONVEYOR_PORT": "0", **env})
        assert done.returncode == 2, done
        assert message in done.stderr and "Traceback" not in done.stderr
        assert not (tmp_path / "home" / "conveyor.db").exists()
