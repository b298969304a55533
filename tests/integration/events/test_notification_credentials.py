"""Notification credentials from the secret store (docs/design/events.md §10): a `secret:NAME` webhook and the
SMTP password named in `CONVEYOR_SMTP_URL` are read from the org's secrets at delivery, on SQLite and
PostgreSQL, against the real in-process app."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from conveyor.events.models import NonRetryableEventError
from conveyor.events.notify_delivery import deliver, send_email
from conveyor.events.service import EventService
from conveyor.events.startup import EVENTS
from tests.support.inprocess import InProcessServer
from tests.support.notify import Hooks, webhook_server

API = "/api/v1/admin"
PAYLOAD: dict[str, Any] = {
    "event": "failed",
    "run_id": "run1",
    "run_number": 7,
    "source": "app",
    "repo": "acme/app",
    "workflow": "ci",
    "ref": "refs/heads/main",
    "sha": "abc1234def",
    "status": "failed",
    "url": None,
}


def _events(server: InProcessServer) -> EventService:
    service = server.state.parts.need(EVENTS)
    assert isinstance(service, EventService)
    return service


async def _rule(server: InProcessServer, webhook: str) -> str:
    added = await server.client.post(
        f"{API}/notification-rules", json={"on": ["failed"], "webhook": webhook}, headers=server.auth()
    )
    assert added.status_code == 201, added.text
    assert added.json()["target"] == webhook, "a secret's name is shown as is"
    return str(added.json()["id"])


async def test_a_webhook_named_by_a_secret_is_read_from_the_store_at_delivery(
    server: InProcessServer,
) -> None:
    events = _events(server)
    hooks = Hooks()
    with webhook_server(hooks) as base:
        stored = await server.client.put(
            f"{API}/secrets/org/SLACK_HOOK", json={"value": f"{base}/hook"}, headers=server.auth()
        )
        assert stored.status_code == 201, stored.text
        rule_id = await _rule(server, "secret:SLACK_HOOK")
        outcome = await deliver(
            server.state.db, {**PAYLOAD, "rule_id": rule_id}, events.settings, events.secret_lookup
        )
        assert outcome == "delivered"
        assert [body["run_id"] for body in hooks.bodies()] == ["run1"]
    missing = await _rule(server, "secret:NOT_SET")
    with pytest.raises(NonRetryableEventError, match="NOT_SET"):
        await deliver(server.state.db, {**PAYLOAD, "rule_id": missing}, events.settings, events.secret_lookup)


async def test_an_smtp_password_named_by_a_missing_secret_goes_to_the_dlq_without_sending(
    server: InProcessServer,
) -> None:
    events = _events(server)
    settings = replace(
        events.settings,
        smtp_url="smtp://bot@127.0.0.1:9?password=secret:SMTP_PASSWORD",
        smtp_from="ci@example.test",
    )
    with pytest.raises(NonRetryableEventError, match="SMTP_PASSWORD"):
        await send_email("team@example.test", {**PAYLOAD, "rule_id": "r"}, settings, events.secret_lookup)
