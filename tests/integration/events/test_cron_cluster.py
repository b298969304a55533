"""Two real coordinators on one fresh PostgreSQL: the leader fires each cron slot exactly once, also
across a takeover, and never in the minute the schedule was registered."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from conveyor.db.engine import create_sync_engine
from tests.integration.runtime.conftest import FAST_CLUSTER
from tests.support.http import HTTP
from tests.support.processes import ServerProcess
from tests.support.repos import git, make_repo
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

EVERY_MINUTE = """
from conveyor import schedule, workflow

tick = workflow("tick", on=[schedule("* * * * *")])

@tick.job(runs_on=["linux"])
def run(ctx):
    ctx.sh(["echo", "tick"])
"""


@pytest.fixture
def nodes() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for process in started:
        process.signal(signal.SIGCONT)
        process.stop()


def query(url: str, sql: str) -> list[dict[str, Any]]:
    engine = create_sync_engine(url)
    try:
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(text(sql))]
    finally:
        engine.dispose()


def test_one_fire_per_slot_with_two_coordinators_and_a_takeover(
    postgres_url: str, tmp_path: Path, nodes: list[ServerProcess]
) -> None:
    env = {**FAST_CLUSTER, "CONVEYOR_SECRET_KEY": "0f" * 32, "CONVEYOR_CRON_TICK_SECONDS": "0.5"}
    for name in ("node-a", "node-b"):
        nodes.append(
            ServerProcess(
                tmp_path / name, database_url=postgres_url, env={**env, "CONVEYOR_INSTANCE_ID": name}
            )
        )
    for process in nodes:
        process.wait_ready(timeout=120)
    token = next(t for t in (p.owner_token_or_none() for p in nodes) if t)
    a = nodes[0]

    def api(method: str, path: str, **kwargs: Any) -> httpx.Response:
        return HTTP.request(
            method,
            f"{a.url}/api/v1/admin{path}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            **kwargs,
        )

    repo = make_repo(tmp_path / "repo", {"tick": EVERY_MINUTE})
    source = api("POST", "/sources", json={"kind": "local", "name": "app", "path": str(repo)}).json()
    sha = git(repo, "rev-parse", "HEAD")
    assert (
        api(
            "POST", f"/sources/{source['id']}/trigger", json={"ref": "refs/heads/main", "sha": sha}
        ).status_code
        == 202
    )
    armed = wait_until(
        lambda: query(postgres_url, "SELECT armed_at FROM cron_schedules"), timeout=60, what="the schedule"
    )[0]["armed_at"]

    fires = wait_until(
        lambda: query(postgres_url, "SELECT slot_at FROM cron_fires"), timeout=150, what="the first cron fire"
    )
    first_slot: datetime = fires[0]["slot_at"]
    assert first_slot > armed  # never in the minute it was registered

    holder = wait_until(
        lambda: query(
            postgres_url, "SELECT holder FROM leader_lease WHERE name = 'leader' AND expires_at > now()"
        ),
        timeout=30,
        what="a live leader",
    )[0]["holder"]
    leader = next(p for p in nodes if p.home.name == holder)
    follower = next(p for p in nodes if p is not leader)
    leader.kill()  # mid-slot: the follower takes over while the slot just fired is still the latest one
    wait_until(
        lambda: query(
            postgres_url,
            f"SELECT holder FROM leader_lease WHERE name = 'leader' AND holder = '{follower.home.name}' "
            "AND expires_at > now()",
        ),
        timeout=60,
        what="the follower to lead",
    )
    second = wait_until(
        lambda: [
            r for r in query(postgres_url, "SELECT slot_at FROM cron_fires") if r["slot_at"] > first_slot
        ],
        timeout=150,
        what="the next slot fired by the new leader",
    )
    assert len(second) == 1
    per_slot = query(
        postgres_url,
        "SELECT payload->>'slot_at' AS slot, count(*) AS n FROM events WHERE name = '__schedule_fire' GROUP BY 1",
    )
    assert len(per_slot) == 2 and all(row["n"] == 1 for row in per_slot)
