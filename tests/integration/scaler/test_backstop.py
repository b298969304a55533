"""The scaler backstop on a real server (docs/design/cluster.md §7.2): the leader adopts the spawn records of
a coordinator that is gone and, once `scaler_reap_stranded_timeout_ms` has passed since the adoption, stops
the instance it left behind and closes the record as `stranded`."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select

from conveyor.db.engine import create_sync_engine
from conveyor.db.tables import cluster_instances, scaler_spawn_history, scaler_spawns
from conveyor.model.ids import utc_now
from tests.support.dispatch_stage import FAST, SINGLE_WORKFLOW, Stage, stage
from tests.support.scaler_backends import never_registering_scalers_yaml, process_alive, stray_agent_process
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups"),
]

GONE = "gone-node"  # the node marker `stray_agent_process` stamps on its record


@pytest.fixture
def staged(database_url: str, tmp_path: Path) -> Iterator[Stage]:
    config = never_registering_scalers_yaml(tmp_path / "scalers.yaml")
    env = {**FAST, "CONVEYOR_SCALER_CONFIG": str(config)}
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}, env=env) as s:
        yield s


def spawn_row(
    agent_id: str, *, adopted_by: str | None = None, adopted_at: datetime | None = None
) -> dict[str, Any]:
    now = utc_now()
    return {
        "agent_id": agent_id,
        "node_id": GONE,
        "boot_id": "old-boot",
        "scaler": "local",
        "backend_type": "bare-metal",
        "label_set": ["linux"],
        "state": "spawning",
        "spawned_at": now - timedelta(hours=1),
        "deadline_at": now - timedelta(minutes=55),
        "adopted_by": adopted_by,
        "adopted_at": adopted_at,
    }


def test_the_leader_adopts_a_gone_nodes_records_and_tears_down_what_is_stranded_after_the_timeout(
    staged: Stage, database_url: str, tmp_path: Path
) -> None:
    s = staged
    engine = create_sync_engine(database_url)
    try:
        with engine.connect() as conn:
            (me,) = conn.execute(
                select(cluster_instances.c.instance_id).where(cluster_instances.c.role == "coordinator")
            ).one()
        answer = s.api(
            "PATCH",
            "/cluster-settings",
            json={
                "scaler_reap_stranded_timeout_ms": 60_000,
                "scaler_reap_interval_ms": 5_000,
                "reroute_flap_grace_ms": 1_000,
            },
        )
        assert answer.status_code == 200, answer.text
        with stray_agent_process(tmp_path / "home", agent_id="stranded-agent") as pid:
            now = utc_now()
            with engine.begin() as conn:
                # Adopted 90 s ago: past the one-minute timeout. Adopted now: not yet. Not adopted: adopt.
                conn.execute(
                    insert(scaler_spawns),
                    [
                        spawn_row("stranded-agent", adopted_by=me, adopted_at=now - timedelta(seconds=90)),
                        spawn_row("young-agent", adopted_by=me, adopted_at=now),
                        spawn_row("unadopted-agent"),
                    ],
                )

            def ended() -> dict[str, Any] | None:
                with engine.connect() as conn:
                    row = conn.execute(
                        select(scaler_spawn_history).where(
                            scaler_spawn_history.c.agent_id == "stranded-agent"
                        )
                    ).first()
                return dict(row._mapping) if row is not None else None

            history = wait_until(ended, timeout=60, what="the stranded spawn ended by the backstop")
            assert (history["outcome"], history["adopted_by"]) == ("stranded", me)
            assert "stopped by the backstop" in history["error"]
            wait_until(lambda: not process_alive(pid), timeout=30, what="the stranded process stopped")

            def adopted() -> dict[str, str | None] | None:
                with engine.connect() as conn:
                    rows = {
                        r.agent_id: r.adopted_by
                        for r in conn.execute(select(scaler_spawns.c.agent_id, scaler_spawns.c.adopted_by))
                    }
                return rows if rows.get("unadopted-agent") == me else None

            rows = wait_until(adopted, timeout=30, what="the unadopted record adopted")
            # The records adopted since wait out their minute.
            assert rows == {"young-agent": me, "unadopted-agent": me}
    finally:
        engine.dispose()
