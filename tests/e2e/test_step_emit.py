"""End to end: a step's `ctx.emit` on a real agent reaches a subscriber in the same repository."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import agent_process
from tests.support.dispatch_stage import stage
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

EMITTER = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    event_id = ctx.emit("deploy-complete", {"version": "1.2.3"})
    print("emitted", event_id)
"""

LISTENER = """
from conveyor import event, workflow

listen = workflow("listen", on=[event("deploy-complete", match={"version": "1.2.3"})])

@listen.job(runs_on=["linux"])
def react(ctx):
    ctx.sh(["echo", "reacting"])
"""

LOOP = """
from conveyor import event, push, workflow

loop = workflow("loop", on=[push(branches=["main"]), event("again")])

@loop.job(runs_on=["linux"])
def go(ctx):
    ctx.emit("again")
"""

EVENTS_ENV = {"CONVEYOR_EVENTS_POLL_SECONDS": "0.5", "CONVEYOR_EVENTS_SCAN_SECONDS": "0.5"}


def test_ctx_emit_reaches_a_subscriber_and_records_the_emitting_run(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": EMITTER, "listen": LISTENER}, env=EVENTS_ENV) as s:
        with agent_process(s, tmp_path / "agent-home"):
            run_id = s.push()
            s.wait_run(run_id, "success", timeout=120)

            def emitted() -> dict[str, Any] | None:
                items = s.api("GET", "/events", params={"name": "deploy-complete"}).json()["items"]
                return items[0] if items and items[0]["state"] == "processed" else None

            item = wait_until(emitted, timeout=60, what="the emitted event processed")
            assert item["source_run_id"] == run_id and item["origin"] == "custom"
            assert (
                item["chain_depth"] == 1 and item["match_outcome"] == "matched" and item["matched_count"] == 1
            )
            shown = s.api("GET", f"/events/{item['id']}").json()
            listen_run = shown["runs"][0]["run_id"]
            run = s.wait_run(listen_run, "success", timeout=120)
            assert run["workflow"] == "listen" and run["event_id"] == item["id"] and run["chain_depth"] == 1
            # The emitting run's completions were written with its terminal statuses.
            done = s.api("GET", "/events", params={"name": "__workflow_complete", "limit": 50}).json()[
                "items"
            ]
            mine = next(e for e in done if e["source_run_id"] == run_id)
            payload = s.api("GET", f"/events/{mine['id']}/payload").json()["payload"]
            assert payload["status"] == "success" and payload["jobs"][0]["name"] == "build"
            jobs_done = s.api("GET", "/events", params={"name": "__job_complete", "limit": 50}).json()[
                "items"
            ]
            assert any(e["source_run_id"] == run_id for e in jobs_done)


def test_an_emit_chain_stops_at_the_depth_limit(database_url: str, tmp_path: Path) -> None:
    with stage(tmp_path, database_url, {"loop": LOOP}, env=EVENTS_ENV) as s:
        with agent_process(s, tmp_path / "agent-home"):
            s.push()

            def failed_run() -> dict[str, Any] | None:
                items = s.api("GET", "/runs", params={"workflow": "loop", "limit": 50}).json()["items"]
                return next((r for r in items if r["status"] == "failed"), None)

            failed = wait_until(failed_run, timeout=300, what="the run whose emit is refused")
            runs = s.api("GET", "/runs", params={"workflow": "loop", "limit": 50}).json()["items"]
            by_event = [r for r in runs if s.run(r["id"])["event_id"]]
            assert len(runs) == 10 and len(by_event) == 9  # the push run plus exactly 9 event-triggered runs
            assert s.run(failed["id"])["chain_depth"] == 9
            job = s.run(failed["id"])["jobs"][0]
            text = s.api(
                "GET",
                f"/runs/{failed['id']}/jobs/{job['id']}/logs",
                params={"offset": 0, "limit_bytes": 1048576},
            ).json()["text"]
            assert "chain_depth_exceeded" in text
