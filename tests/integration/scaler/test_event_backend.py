"""The `event` backend against each database: `spawn` stores the claim and emits `scale_up` in one
transaction; `destroy` withdraws an unredeemed claim and emits `scale_down` once
(docs/design/scaler.md §6.4)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from conveyor.db.engine import Database
from conveyor.db.tables import events, scaler_claims
from conveyor.model.ids import new_id, utc_now
from conveyor.scaler import claims
from conveyor.scaler.backend import (
    BackendContext,
    LabelSetSpec,
    ScalerEntry,
    ScalerEvent,
    SpawnContext,
    SpawnFailed,
    SpawnRequest,
)
from conveyor.scaler.event import EventBackend

ENTRY = ScalerEntry(
    name="cloud",
    type="event",
    max_agents=2,
    label_sets=(
        LabelSetSpec(labels=("big", "cloud"), auto_labels=("conveyor:arch:x86_64", "conveyor:os:linux")),
    ),
    options={"provisioning_targets": ["acme/infra"], "provisioning_label": "provisioner", "claim_ttl_s": 120},
)


async def _setting(name: str) -> int:
    return 0


def _backend(tmp_path: Path, database: Database | None) -> EventBackend:
    context = BackendContext(
        home=tmp_path, node_id="node-1", boot_id="boot-1", cluster_setting=_setting, database=database
    )
    return EventBackend(ENTRY, context)


def _request(agent_id: str, job_id: str | None = None) -> SpawnRequest:
    return SpawnRequest(
        agent_id=agent_id,
        scaler="cloud",
        label_set=ENTRY.label_sets[0],
        orchestrator_url="ws://ci.example:8470/ws",
        token="cvy_agent_" + "0" * 64,
        env={},
        limits=None,
        context=SpawnContext(bound_job_id=job_id, run_id="run-1"),
        deadline=time.monotonic() + 300,
    )


async def _events(database: Database, name: str) -> list[dict[str, object]]:
    async with database.read() as conn:
        rows = await conn.execute(select(events).where(events.c.name == name))
        return [dict(r._mapping) for r in rows]


async def test_spawn_stores_a_claim_and_emits_scale_up(database: Database, tmp_path: Path) -> None:
    backend = _backend(tmp_path, database)
    seen: list[ScalerEvent] = []
    agent_id, job_id = new_id(), new_id()
    before = utc_now()
    managed = await backend.spawn(_request(agent_id, job_id), seen.append)
    assert managed.agent_id == agent_id and managed.state == "running" and backend.is_alive(agent_id)
    assert [e.kind for e in seen] == ["provisioning"] and "acme/infra" in seen[0].detail
    (up,) = await _events(database, "conveyor.scaler.scale_up")
    payload = up["payload"]
    assert isinstance(payload, dict)
    assert up["org_id"] is None and up["target_repos"] == ["acme/infra"] and up["origin"] == "system"
    assert (
        payload["agent_id"] == agent_id and payload["bound_job_id"] == job_id and payload["run_id"] == "run-1"
    )
    assert payload["labels"] == ["big", "cloud"] and payload["scaler"] == "cloud"
    assert payload["orchestrator_url"] == "ws://ci.example:8470/ws"
    code = payload["claim_code"]
    assert isinstance(code, str) and code.startswith("cvy_claim_")
    async with database.read() as conn:
        claim = (await conn.execute(select(scaler_claims))).one()
    assert claim.agent_id == agent_id and claim.code_sha256 == claims.hash_code(code)
    assert claim.consumed_at is None
    assert 119 <= (claim.expires_at - before).total_seconds() <= 121
    assert await backend.list_live() == []

    await backend.destroy(agent_id, reason="agent did not register within 300 s")
    await backend.destroy(agent_id, reason="again")  # idempotent: no second event
    (down,) = await _events(database, "conveyor.scaler.scale_down")
    assert down["payload"] == {
        "request_id": down["payload"]["request_id"],  # type: ignore[index]
        "agent_id": agent_id,
        "scaler": "cloud",
        "labels": ["big", "cloud"],
        "reason": "agent did not register within 300 s",
    }
    assert down["target_repos"] == ["acme/infra"] and not backend.is_alive(agent_id)
    async with database.read() as conn:
        expires_at = (await conn.execute(select(scaler_claims.c.expires_at))).scalar_one()
        assert expires_at <= utc_now()
        assert await claims.redeem(conn, code, utc_now(), 60_000) is None


async def test_without_a_database_spawn_fails_and_keeps_nothing(tmp_path: Path) -> None:
    backend = _backend(tmp_path, None)
    with pytest.raises(SpawnFailed, match="only on a coordinator"):
        await backend.spawn(_request(new_id()), lambda _: None)
    assert backend.managed() == {}
