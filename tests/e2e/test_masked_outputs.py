"""End to end: a secret a step returns or emits is stored and served masked, from a real agent and from an
agent that reports it in clear (the orchestrator masks again with the job's secret values)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from conveyor.model import protocol as p
from tests.support.agents import agent_process, assert_no_clear_secret, set_secret
from tests.support.dispatch_stage import Stage, stage
from tests.support.protocol_agent import ScriptedAgent
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.slow

SECRET = "hunter2-masked-value"
ENCODED = base64.b64encode(SECRET.encode()).decode()

# The keys avoid secret-like words: the events API redacts those by name, which would hide a leak here.
WORKFLOWS = {
    "ci": """
import base64

from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])
build = ci.job("build", runs_on=["linux"])

@build.step
def leak(ctx):
    key = ctx.secrets.get("DEPLOY_KEY")
    ctx.emit("leaked", {"value": key, key: [base64.b64encode(key.encode()).decode()]})
    return {"value": key, "nested": {"list": ["x", key]}, key: 1}
""",
    "raw": """
from conveyor import push, workflow

raw = workflow("raw", on=[push(branches=["main"])])

@raw.job(runs_on=["scripted"])
def report(ctx):
    pass
""",
}
MASKED_OUTPUTS = {"value": "***", "nested": {"list": ["x", "***"]}, "***": 1}


def clear_outputs(key: str) -> dict[str, object]:
    return {"value": key, "nested": {"list": ["x", key]}, key: 1, "b64": ENCODED}


async def report_in_clear(s: Stage, token: str) -> None:
    """A scripted agent reports the job's secret in clear: step outputs and an emit on its first connection,
    a second step, an emit and the job's outputs after reconnecting (the orchestrator then holds no values
    for it in memory and reads them again)."""
    agent = ScriptedAgent(s.ws_url, token, labels=["scripted"])
    await agent.connect()
    dispatch = await agent.next_of(p.JobDispatch)
    assert dispatch.secrets == {"DEPLOY_KEY": SECRET}
    await agent.accept(dispatch)
    job_id = dispatch.job_id
    await agent.send(p.StepStarted(job_id=job_id, step_index=1, name="first"))
    await agent.send(
        p.LogChunk(job_id=job_id, step_index=1, seq=0, lines=[p.LogLine(text=f"printing {SECRET}")])
    )
    first = p.StepFinished(
        oseq=1, job_id=job_id, step_index=1, name="first", status="success", outputs=clear_outputs(SECRET)
    )
    await agent.send(first)
    await agent.send(
        p.EventEmit(oseq=2, request_id="r1", job_id=job_id, name="leaked", payload={"first": SECRET})
    )
    await agent.wait_acked(2)
    await agent.close()

    again = ScriptedAgent(s.ws_url, token, agent_id=agent.agent_id, labels=["scripted"])
    await again.connect(in_flight=[job_id])
    await again.send(p.StepStarted(job_id=job_id, step_index=2, name="second"))
    await again.send(
        p.LogChunk(job_id=job_id, step_index=2, seq=0, lines=[p.LogLine(text=f"again {SECRET}")])
    )
    await again.send(
        p.StepFinished(
            oseq=3,
            job_id=job_id,
            step_index=2,
            name="second",
            status="failed",
            error=f"failed with {SECRET}",
            outputs=clear_outputs(SECRET),
        )
    )
    await again.send(
        p.EventEmit(oseq=4, request_id="r2", job_id=job_id, name="leaked", payload={SECRET: [ENCODED]})
    )
    await again.send(
        p.JobFinished(oseq=5, job_id=job_id, status="success", outputs={"first": clear_outputs(SECRET)})
    )
    await again.wait_acked(5)
    await again.close()


def served(s: Stage, run_ids: list[str]) -> tuple[list[str], dict[str, list[dict[str, object]]]]:
    """Every API answer about these runs (runs, jobs and steps, logs, their events and completions), and
    the payloads of their events by event name."""
    answers = [s.api("GET", "/runs", params={"limit": 50})]
    for run_id in run_ids:
        answers.append(s.api("GET", f"/runs/{run_id}"))
        answers.append(jobs := s.api("GET", f"/runs/{run_id}/jobs"))
        for job in jobs.json()["items"]:
            params = {"offset": 0, "limit_bytes": 1048576}
            answers.append(s.api("GET", f"/runs/{run_id}/jobs/{job['id']}/logs", params=params))
    events = s.api("GET", "/events", params={"limit": 200})
    answers.append(events)
    payloads: dict[str, list[dict[str, object]]] = {}
    for event in events.json()["items"]:
        if event["source_run_id"] in run_ids:
            answers.append(s.api("GET", f"/events/{event['id']}"))
            answers.append(payload := s.api("GET", f"/events/{event['id']}/payload"))
            payloads.setdefault(event["name"], []).append(payload.json()["payload"])
    for answer in answers:
        assert answer.status_code == 200, (answer.request.url, answer.text)
    return [answer.text for answer in answers], payloads


async def test_returned_and_emitted_secrets_are_masked_in_storage_and_every_answer(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, WORKFLOWS) as s:
        set_secret(s, "DEPLOY_KEY", SECRET)
        with agent_process(s, tmp_path / "agent-home"):
            s.push()
            await report_in_clear(s, s.agent_token(["scripted"]))

            def runs() -> list[dict[str, object]]:
                return s.api("GET", "/runs", params={"limit": 50}).json()["items"]  # type: ignore[no-any-return]

            async def both_done() -> bool:
                return sorted(str(r["status"]) for r in runs()) == ["success", "success"]

            await async_wait_until(both_done, timeout=120, what="both runs finished")
            by_workflow = {str(r["workflow"]): s.run(str(r["id"])) for r in runs()}

        ci_steps = {st["name"]: st for st in by_workflow["ci"]["jobs"][0]["steps"]}
        assert ci_steps["leak"]["outputs"] == MASKED_OUTPUTS
        assert by_workflow["ci"]["jobs"][0]["outputs"] == {"leak": MASKED_OUTPUTS}
        raw_job = by_workflow["raw"]["jobs"][0]
        raw_steps = {st["name"]: st for st in raw_job["steps"]}
        masked_raw = {**MASKED_OUTPUTS, "b64": "***"}
        assert raw_steps["first"]["outputs"] == masked_raw and raw_steps["second"]["outputs"] == masked_raw
        assert raw_steps["second"]["error"] == "failed with ***"
        assert raw_job["outputs"] == {"first": masked_raw}

        run_ids = [str(run["id"]) for run in by_workflow.values()]
        answers, payloads = served(s, run_ids)
        for text in answers:
            assert SECRET not in text and ENCODED not in text, text
        emitted = sorted(json.dumps(payload, sort_keys=True) for payload in payloads["leaked"])
        assert emitted == sorted(
            json.dumps(d, sort_keys=True)
            for d in ({"value": "***", "***": ["***"]}, {"first": "***"}, {"***": ["***"]})
        )
        completions = payloads["__workflow_complete"]
        assert {c["workflow_name"]: c["jobs"][0]["outputs"] for c in completions} == {  # type: ignore[index]
            "ci": {"leak": MASKED_OUTPUTS},
            "raw": {"first": masked_raw},
        }
        assert_no_clear_secret(database_url, SECRET)
        assert_no_clear_secret(database_url, ENCODED)
