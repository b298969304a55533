"""A PostgreSQL coordinator restarted after SIGKILL listens at once (docs/design/cluster.md §1).

Its predecessor's `cluster_instances` row stays live for one stale window after the kill, and the
restarted process waits that out before it takes the identity. While it waits it already serves:
`/health` answers, `/ready` says why it is not ready, a webhook is stored durably before its 202, and
the routes whose services are not up yet answer 503 with a JSON body.

The stale window here is two minutes (heartbeat 1 s, 120 beats), far past the moment the test looks
however slowly the process starts, so no assertion depends on timing. Once it has looked, the test ends
the wait the way time would: it moves the dead row's last heartbeat back past the window.
"""

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from conveyor.db.engine import create_sync_engine
from tests.fakes.github import FakeGitHub, post_webhook, push_payload
from tests.support.processes import ServerProcess
from tests.support.repos import git, make_repo

pytestmark = [pytest.mark.slow, pytest.mark.postgres_only, pytest.mark.timeout(240)]

SECRET = "hook-secret"
STALE_WINDOW_S = 120
ENV = {
    "CONVEYOR_INSTANCE_ID": "node-1",
    "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "1000",
    "CONVEYOR_CLUSTER_PEER_STALE_BEATS": str(STALE_WINDOW_S),
    "CONVEYOR_SWEEP_INTERVAL_MS": "200",
    "CONVEYOR_READY_CACHE_MS": "0",
}
# Admin routes a client may call during the wait: each answers (200) or says it cannot yet (503), in JSON.
ADMIN_READS = ("/sources", "/runs", "/deliveries", "/cluster/status", "/cluster-settings", "/agents")


def delivery_status(database_url: str, row_id: str) -> str | None:
    """The delivery row's status, read on a connection of our own (None: no such row)."""
    engine = create_sync_engine(database_url)
    try:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT status FROM deliveries WHERE id = :id"), {"id": row_id})
            return found.scalar()
    finally:
        engine.dispose()


def age_past_the_window(database_url: str, instance_id: str) -> None:
    """What the stale window's passing does to a dead process's row: its last heartbeat is that old."""
    engine = create_sync_engine(database_url)
    try:
        with engine.begin() as conn:
            aged = conn.execute(
                text(
                    "UPDATE cluster_instances SET last_heartbeat_at = last_heartbeat_at - :age * interval '1 second'"
                    " WHERE instance_id = :id"
                ),
                {"age": STALE_WINDOW_S + 1, "id": instance_id},
            )
            assert aged.rowcount == 1
    finally:
        engine.dispose()


def still_waiting(server: ServerProcess) -> dict[str, Any]:
    """`/ready` while the identity wait is on: 503, naming the reason."""
    answer = server.get("/ready")
    assert answer.status_code == 503, answer.text
    body: dict[str, Any] = answer.json()
    assert body["ready"] is False
    detail = body["checks"]["startup"]["detail"]
    assert body["checks"]["startup"]["ok"] is False
    assert detail.startswith("identity: waiting for the previous instance's heartbeat to go stale"), detail
    assert "node-1" in detail
    return body


def test_a_coordinator_restarted_after_sigkill_listens_and_stores_webhooks_while_it_waits(
    postgres_url: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    sha = git(repo, "rev-parse", "HEAD")
    home = tmp_path / "home"
    with FakeGitHub(repos={"acme/app": repo}) as github:
        first = ServerProcess(home, database_url=postgres_url, env=ENV)
        try:
            first.wait_ready()
            token = first.owner_token()
            source_id = first.create_source(token, github.source_body("acme/app", SECRET))
        finally:
            first.kill()  # leaves its instance row live for the whole stale window
            first.stop()

        restarted = ServerProcess(home, database_url=postgres_url, env=ENV)
        try:
            restarted.wait_listening(timeout=60)
            health = restarted.get("/health")
            assert health.status_code == 200 and health.json()["instance_id"] == "node-1"
            still_waiting(restarted)

            answer = post_webhook(
                f"{restarted.url}/webhooks/{source_id}",
                SECRET,
                "push",
                push_payload("acme/app", repo, ref="refs/heads/main", before="0" * 40, after=sha),
                "during-the-wait",
            )
            assert answer.status_code == 202, answer.text
            delivery = answer.json()["delivery"]
            # Durable before the answer, and not processed while the identity is unsettled.
            assert delivery_status(postgres_url, delivery) == "received"
            for path in ADMIN_READS:
                read = restarted.admin(token, "GET", path)
                assert read.status_code in (200, 503), f"{path}: {read.status_code} {read.text}"
                if read.status_code == 503:
                    assert read.json()["error"] == "unavailable", f"{path}: {read.text}"
            still_waiting(restarted)  # all of the above happened during the wait

            age_past_the_window(postgres_url, "node-1")
            restarted.wait_ready(timeout=60)
            startup = restarted.get("/ready").json()["checks"]["startup"]
            assert startup == {"ok": True, "detail": "recovery finished"}

            row = restarted.wait_delivery_handled(
                token, delivery, "the delivery to be processed after the wait"
            )
            assert row["status"] == "processed" and len(row["runs"]) == 1, row
            runs = restarted.admin(token, "GET", "/runs").json()["items"]
            assert [r["delivery_id"] for r in runs] == [delivery]
        finally:
            restarted.stop()


def test_a_live_twin_is_still_refused_after_the_wait(postgres_url: str, tmp_path: Path) -> None:
    # The wait (5 s here) ends in a refusal when the row keeps beating: the process that listened
    # meanwhile exits 1, naming why.
    env = {
        **ENV,
        "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "200",
        "CONVEYOR_CLUSTER_PEER_STALE_BEATS": "25",
        "CONVEYOR_SECRET_KEY": "0f" * 32,
    }
    live = ServerProcess(tmp_path / "a", database_url=postgres_url, env=env)
    try:
        live.wait_ready()
        twin = ServerProcess(tmp_path / "b", database_url=postgres_url, env=env)
        try:
            assert twin.wait_exit(timeout=90) == 1
            output = twin.output()
            assert "listening while start-up waits: identity: waiting" in output
            assert "error: duplicate instance_id node-1" in output
        finally:
            twin.stop()
        assert live.get("/ready").status_code == 200
    finally:
        live.stop()
