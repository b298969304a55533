"""A log per dispatch attempt through the real `/ws` endpoint, with scripted protocol clients
(docs/design/execution.md §9)."""

from pathlib import Path

import pytest

from conveyor.model import protocol as p
from tests.support.dispatch_stage import SINGLE_WORKFLOW, Stage, stage
from tests.support.protocol_agent import ScriptedAgent

pytestmark = pytest.mark.slow


def step_log(s: Stage, run_id: str, job_id: str) -> str:
    answer = s.api("GET", f"/runs/{run_id}/jobs/{job_id}/logs", params={"step": 1})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["text"])


def execution_shown(s: Stage, run_id: str, job_id: str) -> str:
    answer = s.api("GET", f"/runs/{run_id}/jobs/{job_id}/logs")
    assert answer.status_code == 200, answer.text
    return str(answer.json()["execution"])


def named(attempt: int | None) -> dict[str, int]:
    """The `attempt` field as this version's agent sends it; an agent of the previous version has none."""
    return {"attempt": attempt} if attempt is not None else {}


async def send_lines(
    agent: ScriptedAgent, job_id: str, prefix: str, seqs: range, attempt: int | None
) -> None:
    for seq in seqs:
        lines = [p.LogLine(text=f"{prefix} {seq}")]
        await agent.send(p.LogChunk(job_id=job_id, step_index=1, seq=seq, lines=lines, **named(attempt)))


@pytest.mark.parametrize("named_attempts", [True, False], ids=["attempts-named", "previous-version-agents"])
async def test_a_job_run_again_after_its_start_was_lost_shows_only_the_log_of_the_run_that_counts(
    database_url: str, tmp_path: Path, named_attempts: bool
) -> None:
    # Found by the chaos harness (issue 44, seed 4701): an agent ran the job but its start never arrived;
    # the job went back to the queue and another agent ran it again. The second run's chunks, numbered
    # from 0 again, were taken for duplicates of the first's: the log mixed the two runs.
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}) as s:
        run_id = s.push()
        first = ScriptedAgent(s.ws_url, s.agent_token(["linux"]), agent_id="cut-off")
        await first.connect()
        dispatch = await first.next_of(p.JobDispatch)
        job_id = dispatch.job_id
        await first.send(p.JobAck(re=dispatch.id, job_id=job_id))
        await send_lines(first, job_id, "first run", range(2), dispatch.attempt if named_attempts else None)
        # Frames are applied in order: the heartbeat's answer means both chunks were stored.
        await first.send(p.Heartbeat(running=[job_id]))
        await first.next_of(p.HeartbeatAck)
        await first.close()
        assert execution_shown(s, run_id, job_id) == f"{dispatch.attempt}.0"

        second = ScriptedAgent(s.ws_url, s.agent_token(["linux"]), agent_id="second")
        await second.connect()
        again = await second.next_of(p.JobDispatch)
        assert (again.job_id, again.attempt) == (job_id, dispatch.attempt + 1)
        await second.accept(again)
        await send_lines(second, job_id, "second run", range(4), again.attempt if named_attempts else None)
        attempt = again.attempt if named_attempts else None
        await second.send(p.JobFinished(oseq=1, job_id=job_id, status="success", **named(attempt)))
        await second.wait_acked(1)
        s.wait_run(run_id, "success")

        assert step_log(s, run_id, job_id) == "".join(f"second run {seq}\n" for seq in range(4))
        # The range answer names the log it read, so a follower whose offset was the first run's starts over.
        assert execution_shown(s, run_id, job_id) == f"{again.attempt}.0"
        await second.close()
