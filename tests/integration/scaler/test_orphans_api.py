"""Orphans and status through a real server (docs/design/scaler.md §7, docs/design/admin.md): routes,
permissions, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.support.dispatch_stage import FAST, SINGLE_WORKFLOW, Stage, stage
from tests.support.http import HTTP
from tests.support.processes import run_cli
from tests.support.scaler_backends import never_registering_scalers_yaml, process_alive, stray_agent_process
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")


def execute(database_url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            result = conn.execute(text(sql), params)
            return [dict(r._mapping) for r in result] if result.returns_rows else []
    finally:
        engine.dispose()


@pytest.fixture
def staged(database_url: str, tmp_path: Path) -> Iterator[Stage]:
    config = never_registering_scalers_yaml(tmp_path / "scalers.yaml", max_agents=2)
    env = {**FAST, "CONVEYOR_SCALER_CONFIG": str(config)}
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}, env=env) as s:
        yield s


@pytest.fixture
def stray(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A live agent process recorded by another node (its own process group), as an older install left it."""
    with stray_agent_process(tmp_path / "home") as pid:
        yield "stray-agent", pid


def cli(s: Stage, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(["admin", *args], env={"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": token or s.token})


def token(s: Stage, role: str, routing_key: str | None = None) -> str:
    body: dict[str, Any] = {"role": role, "label": f"{role}-token"}
    if routing_key:
        body["routing_key"] = routing_key
    answer = s.api("POST", "/tokens", json=body)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["token"])


def as_token(s: Stage, secret: str, method: str, path: str, **kwargs: Any) -> Any:

    return HTTP.request(
        method,
        f"{s.server.url}/api/v1/admin{path}",
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
        **kwargs,
    )


def test_orphans_are_listed_classified_and_only_untracked_ones_stopped(
    staged: Stage, stray: tuple[str, int], database_url: str
) -> None:
    s = staged
    stray_id, stray_pid = stray
    run_id = s.push()
    (job,) = s.run(run_id)["jobs"]

    def spawned() -> dict[str, Any] | None:
        items = s.api("GET", "/scaler/orphans").json()["items"]
        return next((i for i in items if i["vm_id"] != stray_id), None)

    bound = wait_until(spawned, timeout=60, what="the spawned (never registering) agent")
    body = s.api("GET", "/scaler/orphans").json()
    assert body["complete"] is True and body["disconnected_coordinators"] == []
    by_id = {item["vm_id"]: item for item in body["items"]}
    assert by_id[stray_id]["state"] == "untracked" and by_id[stray_id]["tracked_by"] == []
    assert by_id[stray_id]["pid"] == stray_pid and by_id[stray_id]["kind"] == "process"
    assert bound["state"] == "tracked" and bound["tracked_by"] == ["spawn", "job"]
    assert bound["job_id"] == job["id"]

    listed = cli(s, "scaler", "orphans", "list")
    assert listed.returncode == 0, listed.stderr
    assert "untracked" in listed.stdout and "spawn, job" in listed.stdout

    stopped = cli(s, "scaler", "orphans", "stop", stray_id, bound["vm_id"], stray_id, "nothing-like-this")
    assert stopped.returncode == 1, stopped.stderr  # one was refused
    lines = stopped.stdout.splitlines()
    assert lines[0].startswith(f"{stray_id}: stopped")
    assert lines[1].startswith(f"{bound['vm_id']}: tracked (tracked by spawn, job (job {job['id']}))")
    assert lines[2] == "nothing-like-this: not_found (no live item with this id)"
    assert len(lines) == 3  # the duplicate was merged
    wait_until(lambda: not process_alive(stray_pid), timeout=30, what="the stray agent to end")
    assert process_alive(int(bound["pid"]))  # the tracked one was not touched
    assert [i["vm_id"] for i in s.api("GET", "/scaler/orphans").json()["items"]] == [bound["vm_id"]]
    metrics = s.server.get("/metrics").text
    assert 'conveyor_scaler_orphans_stopped_total{backend="bare-metal"} 1.0' in metrics
    assert 'conveyor_scaler_agents{scaler="local",state="spawning",warm="false"} 1.0' in metrics


def test_with_a_stale_coordinator_nothing_is_untracked(
    staged: Stage, stray: tuple[str, int], database_url: str
) -> None:
    s = staged
    stray_id, stray_pid = stray
    old = datetime.now(UTC) - timedelta(minutes=10)
    execute(
        database_url,
        "INSERT INTO cluster_instances (instance_id, boot_id, role, software_version, started_at, "
        "last_heartbeat_at, draining, applied_settings_version) "
        "VALUES ('coord-behind-a-partition', 'b', 'coordinator', 'x', :at, :at, false, 0)",
        at=old,
    )
    body = s.api("GET", "/scaler/orphans").json()
    assert body["complete"] is False and body["disconnected_coordinators"] == ["coord-behind-a-partition"]
    (item,) = [i for i in body["items"] if i["vm_id"] == stray_id]
    assert item["state"] == "unknown"
    answer = s.api("POST", "/scaler/orphans/stop", json={"vm_ids": [stray_id]})
    assert answer.status_code == 200, answer.text
    (result,) = answer.json()["results"]
    assert result["outcome"] == "unknown" and "coord-behind-a-partition" in result["detail"]
    assert process_alive(stray_pid)
    listed = cli(s, "scaler", "orphans", "list")
    assert "incomplete: coordinators disconnected (coord-behind-a-partition)" in listed.stderr


def test_orphan_routes_check_permissions_targets_and_bodies(staged: Stage, stray: tuple[str, int]) -> None:
    s = staged
    stray_id, stray_pid = stray
    auditor = token(s, "auditor")
    assert as_token(s, auditor, "GET", "/scaler/orphans").status_code == 200
    assert as_token(s, auditor, "GET", "/scaler/status").status_code == 200
    refused = as_token(s, auditor, "POST", "/scaler/orphans/stop", json={"vm_ids": [stray_id]})
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    assert as_token(s, auditor, "POST", "/scaler/reload").status_code == 403
    scoped = token(s, "operator", routing_key="local:app")
    answer = as_token(s, scoped, "GET", "/scaler/orphans")
    assert answer.status_code == 403 and answer.json()["error"] == "token_scope"
    answer = s.api("GET", "/scaler/orphans", params={"target": "no-such-node"})
    assert answer.status_code == 404 and answer.json()["error"] == "unknown_target"
    answer = s.api("POST", "/scaler/orphans/stop", json={"vm_ids": [stray_id], "target": "no-such-node"})
    assert answer.status_code == 404 and answer.json()["error"] == "unknown_target"
    for params in ({"timeout_ms": 10}, {"timeout_ms": 60_001}):
        answer = s.api("GET", "/scaler/orphans", params=params)
        assert answer.status_code == 400 and answer.json()["error"] == "invalid_request"
    for ids in ([], [f"id-{i}" for i in range(101)]):
        answer = s.api("POST", "/scaler/orphans/stop", json={"vm_ids": ids})
        assert answer.status_code == 400 and "vm_ids" in answer.json()["detail"]
    answer = s.api("POST", "/scaler/orphans/stop", json={"vm_ids": [stray_id], "extra": 1})
    assert answer.status_code == 422
    local = s.api("GET", "/scaler/orphans").json()["node"]
    assert s.api("GET", "/scaler/orphans", params={"target": local}).status_code == 200
    assert process_alive(stray_pid)  # nothing above stopped it
    bad = cli(s, "scaler", "orphans", "stop")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_reload_through_the_api_and_on_sighup(staged: Stage, tmp_path: Path) -> None:
    s = staged
    config = tmp_path / "scalers.yaml"
    document = json.loads(config.read_text())
    document["scalers"][0]["max_agents"] = 3
    document["scalers"].append(
        {"name": "second", "type": "bare-metal", "max_agents": 1, "label_sets": [{"labels": ["linux"]}]}
    )
    config.write_text(json.dumps(document))
    answer = s.api("POST", "/scaler/reload")
    assert answer.status_code == 422 and answer.json()["error"] == "scaler_config_invalid"
    assert "label set [linux] is also served by scaler local" in answer.json()["detail"]
    assert [x["max_agents"] for x in s.api("GET", "/scaler/status").json()["scalers"]] == [2]
    document["scalers"][1]["label_sets"] = [{"labels": ["arm"]}]
    config.write_text(json.dumps(document))
    os.kill(s.server.proc.pid, signal.SIGHUP)

    def applied() -> list[tuple[str, int]] | None:
        shown = [(x["name"], x["max_agents"]) for x in s.api("GET", "/scaler/status").json()["scalers"]]
        return shown if len(shown) == 2 else None

    assert wait_until(applied, timeout=30, what="the SIGHUP reload") == [("local", 3), ("second", 1)]
    # Logged once `reload()` returns, which may be just after the new scalers show in the status.
    wait_until(
        lambda: "scaler reload on SIGHUP applied" in s.server.output(), timeout=30, what="the reload logged"
    )
    config.write_text("version: 1\nscalers: [{name: local}]\n")
    os.kill(s.server.proc.pid, signal.SIGHUP)
    wait_until(lambda: "reload on SIGHUP refused" in s.server.output(), timeout=30, what="the refusal log")
    assert s.server.proc.poll() is None
    assert len(s.api("GET", "/scaler/status").json()["scalers"]) == 2


def test_an_invalid_scalers_yaml_stops_the_node_at_boot(tmp_path: Path) -> None:
    from tests.support.processes import ServerProcess

    config = tmp_path / "scalers.yaml"
    config.write_text(
        "version: 1\nscalers:\n  - {name: local, type: bare-metal, label_sets: [{labels: [conveyor:os:linux]}]}\n"
    )
    server = ServerProcess(tmp_path / "home", env={**FAST, "CONVEYOR_SCALER_CONFIG": str(config)})
    try:
        assert server.wait_exit(timeout=90) == 1
        output = server.output()
        assert "the scaler configuration is invalid" in output
        assert f"{config}: scalers[local].max_agents: required" in output
        assert "label conveyor:os:linux starts with 'conveyor:'" in output
        assert "Traceback" not in output
    finally:
        server.stop()
