"""Notifications end to end (docs/design/events.md §10): a real server process, a scripted agent ending runs,
a real SMTP server (aiosmtpd) and a local HTTP server receiving what the rules send."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from conveyor.model import protocol as p
from tests.support.cli import invoke
from tests.support.dispatch_stage import SINGLE_WORKFLOW, Stage, stage
from tests.support.notify import Hooks, webhook_server
from tests.support.processes import free_port
from tests.support.protocol_agent import ScriptedAgent
from tests.support.repos import commit_all
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

PUBLIC_URL = "http://ci.example.test"


class Mailbox:
    """aiosmtpd handler keeping every message it is handed."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(message_from_bytes(envelope.content))
        return "250 OK"


@contextmanager
def smtp_server() -> Iterator[tuple[str, Mailbox]]:
    mailbox = Mailbox()
    port = free_port()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield f"smtp://127.0.0.1:{port}", mailbox
    finally:
        controller.stop()


def env(smtp_url: str = "smtp://127.0.0.1:1", max_attempts: int = 5) -> dict[str, str]:
    return {
        "CONVEYOR_PUBLIC_URL": PUBLIC_URL,
        "CONVEYOR_SMTP_URL": smtp_url,
        "CONVEYOR_SMTP_FROM": "conveyor@example.test",
        "CONVEYOR_EVENTS_POLL_SECONDS": "0.2",
        "CONVEYOR_EVENTS_SCAN_SECONDS": "0.2",
        "CONVEYOR_EVENTS_RETRY_BASE_SECONDS": "0.05",
        "CONVEYOR_EVENTS_RETRY_MAX_SECONDS": "0.1",
        "CONVEYOR_EVENT_ROUTER_MAX_DISPATCH_ATTEMPTS": str(max_attempts),
    }


def add_rule(s: Stage, **body: Any) -> str:
    answer = s.api("POST", "/notification-rules", json=body)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


async def end_run(s: Stage, agent: ScriptedAgent, status: str) -> str:
    """Push, let the scripted agent end the run's one job with `status`; the run id."""
    run_id = s.push()
    dispatch = await agent.next_of(p.JobDispatch)
    await agent.accept(dispatch)
    reason = "step_failed: build" if status == "failed" else None
    await agent.wait_acked(await agent.finish(dispatch.job_id, status, reason))
    return run_id


def notification_events(s: Stage) -> list[dict[str, Any]]:
    answer = s.api("GET", "/events", params={"name": "conveyor.notification", "limit": 500})
    assert answer.status_code == 200, answer.text
    return answer.json()["items"]  # type: ignore[no-any-return]


async def test_a_failure_emails_and_posts_once_and_the_fix_sends_fixed(
    database_url: str, tmp_path: Path
) -> None:
    hooks = Hooks()
    with smtp_server() as (smtp_url, mailbox), webhook_server(hooks) as hook_url:
        with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}, env=env(smtp_url)) as s:
            add_rule(s, source="app", on=["failed", "fixed"], email="team@example.test")
            add_rule(s, on=["failed", "fixed"], webhook=f"{hook_url}/hook", ref="main")
            # Filtered out: another workflow, another branch.
            add_rule(s, on=["failed", "fixed", "succeeded"], webhook=f"{hook_url}/other", workflow="deploy")
            add_rule(s, on=["failed", "fixed", "succeeded"], webhook=f"{hook_url}/other", ref="release/*")
            agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]))
            await agent.connect()

            failed = await end_run(s, agent, "failed")
            s.wait_run(failed, "failed")
            wait_until(lambda: len(mailbox.messages) == 1 and len(hooks.bodies()) == 1, what="failed sent")
            mail = mailbox.messages[0]
            assert mail["To"] == "team@example.test" and mail["From"] == "conveyor@example.test"
            assert "workflow ci failed on main" in mail["Subject"]
            assert f"{PUBLIC_URL}/ui/runs/{failed}" in mail.get_payload()
            body = hooks.bodies()[0]
            assert {
                k: body[k] for k in ("event", "run_id", "source", "workflow", "ref", "status", "url")
            } == {
                "event": "failed",
                "run_id": failed,
                "source": "app",
                "workflow": "ci",
                "ref": "refs/heads/main",
                "status": "failed",
                "url": f"{PUBLIC_URL}/ui/runs/{failed}",
            }
            assert body["sha"] and "workflow ci failed on main" in body["text"]

            commit_all(s.repo, "fix")
            fixed = await end_run(s, agent, "success")
            s.wait_run(fixed, "success")
            wait_until(lambda: len(mailbox.messages) == 2 and len(hooks.bodies()) == 2, what="fixed sent")
            assert hooks.bodies()[1]["event"] == "fixed" and hooks.bodies()[1]["run_id"] == fixed
            assert "workflow ci is fixed on main" in mailbox.messages[1]["Subject"]

            # The filtered rules fired nothing: their events would exist once the runs were terminal.
            rows = notification_events(s)
            assert len(rows) == 4
            wait_until(
                lambda: all(r["match_outcome"] == "delivered" for r in notification_events(s)),
                what="all delivered",
            )
            assert hooks.bodies("/other") == []
            await agent.close()


async def test_a_failing_endpoint_is_retried_then_dead_lettered_and_never_holds_the_run(
    database_url: str, tmp_path: Path
) -> None:
    hooks = Hooks(status=500)
    hooks.release_first.clear()
    with webhook_server(hooks) as hook_url:
        with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}, env=env(max_attempts=3)) as s:
            add_rule(s, on=["failed"], webhook=f"{hook_url}/hook")
            agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]))
            await agent.connect()
            run_id = await end_run(s, agent, "failed")
            # The first attempt is in flight and held un-answered by the endpoint: the run is already
            # terminal, so its end never waited on the notifier.
            wait_until(lambda: len(hooks.bodies()) == 1, what="first attempt in flight")
            assert hooks.answered == 0
            assert s.run(run_id)["status"] == "failed"
            hooks.release_first.set()

            def dead() -> dict[str, Any] | None:
                items = s.api("GET", "/event-dlq", params={"name": "conveyor.notification"}).json()["items"]
                return items[0] if items else None

            row = wait_until(dead, timeout=60, what="the notification dead-lettered")
            assert row["dlq_reason"] == "exhausted_retries" and row["attempts"] == 3
            assert "answered 500" in row["last_error"] and "/hook" not in row["last_error"]
            assert len(hooks.bodies()) == 3
            await agent.close()


def test_cli_adds_lists_and_removes_rules(database_url: str, tmp_path: Path) -> None:
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}) as s:
        cli_env = {"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token}
        added = invoke(
            [
                "admin",
                "notify",
                "add",
                "--source",
                "app",
                "--on",
                "failed,fixed",
                "--workflow",
                "ci",
                "--ref",
                "main",
                "--webhook",
                "https://hooks.example.test/services/secret-path",
            ],
            env=cli_env,
        )
        assert added.exit_code == 0, added.output
        rule_id = added.output.strip()
        listed = invoke(["admin", "notify", "list", "--json"], env=cli_env)
        assert listed.exit_code == 0, listed.output
        [item] = json.loads(listed.output)["items"]
        assert (item["id"], item["source"], item["on"], item["workflow"], item["ref"]) == (
            rule_id,
            "app",
            ["failed", "fixed"],
            "ci",
            "main",
        )
        assert item["target"] == "https://hooks.example.test/…" and "secret-path" not in listed.output
        both = invoke(
            ["admin", "notify", "add", "--on", "failed", "--email", "a@b.c", "--webhook", "https://x"],
            env=cli_env,
        )
        assert both.exit_code == 2
        unknown = invoke(["admin", "notify", "add", "--on", "broken", "--email", "a@b.c"], env=cli_env)
        assert unknown.exit_code == 2 and "on" in unknown.output
        removed = invoke(["admin", "notify", "remove", rule_id], env=cli_env)
        assert removed.exit_code == 0, removed.output
        assert json.loads(invoke(["admin", "notify", "list", "--json"], env=cli_env).output)["items"] == []
