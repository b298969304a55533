"""The log routes through the real app: range reads, errors, scoping, and SSE on a finished job."""

from __future__ import annotations

import json

import pytest

from conveyor.execution.log_service import LOGS, log_service
from tests.integration.execution.conftest import ROUTING_KEY, RunningJob, append, finish_job, insert_job
from tests.support.inprocess import InProcessServer

THREE_LINES = ["line-0001", "line-0002", "line-0003"]


@pytest.fixture
async def job(server: InProcessServer) -> RunningJob:
    made = await insert_job(server.state.db, step_names={1: "build"})
    await append(server.state.db, made.job_id, 1, 0, THREE_LINES)
    return made


def logs_path(job: RunningJob, suffix: str = "") -> str:
    return f"/api/v1/admin/runs/{job.run_id}/jobs/{job.job_id}/logs{suffix}"


def parse_events(body: str) -> list[tuple[str | None, str, dict[str, object]]]:
    """(id, event, data) of each event in an SSE body."""
    events = []
    for block in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if "event" in fields:
            events.append((fields.get("id"), fields["event"], json.loads(fields["data"])))
    return events


async def test_a_step_range_answers_text_next_offset_and_complete(
    server: InProcessServer, job: RunningJob
) -> None:
    answer = await server.client.get(
        logs_path(job), params={"step": 1, "offset": 10, "limit_bytes": 10}, headers=server.auth()
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"text": "line-0002\n", "next_offset": 20, "complete": False, "execution": "1.0"}

    whole = await server.client.get(logs_path(job), headers=server.auth())
    assert whole.json()["text"] == "── 1 build ──\nline-0001\nline-0002\nline-0003\n"


@pytest.mark.parametrize(
    "params", [{"limit_bytes": 0}, {"limit_bytes": 1_048_577}, {"offset": -1}, {"offset": "x"}]
)
async def test_out_of_range_parameters_are_invalid_requests(
    server: InProcessServer, job: RunningJob, params: dict[str, object]
) -> None:
    answer = await server.client.get(logs_path(job), params=params, headers=server.auth())
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_request"


async def test_unknown_run_job_or_step_is_not_found(server: InProcessServer, job: RunningJob) -> None:
    other = await insert_job(server.state.db)
    for path, params in [
        (f"/api/v1/admin/runs/nope/jobs/{job.job_id}/logs", {}),
        (f"/api/v1/admin/runs/{other.run_id}/jobs/{job.job_id}/logs", {}),
        (logs_path(job), {"step": 9}),
        (logs_path(job, "/stream"), {"step": 9}),
    ]:
        answer = await server.client.get(path, params=params, headers=server.auth())
        assert answer.status_code == 404, (path, answer.text)
        assert answer.json()["error"] == "not_found"


async def test_a_scoped_token_reads_only_its_routing_key(server: InProcessServer, job: RunningJob) -> None:
    own = await server.mint("auditor", routing_key=ROUTING_KEY)
    foreign = await server.mint("auditor", routing_key="rk-other")
    assert (await server.client.get(logs_path(job), headers=server.auth(own))).status_code == 200
    answer = await server.client.get(logs_path(job), headers=server.auth(foreign))
    assert answer.status_code == 404 and answer.json()["error"] == "not_found"


async def test_the_stream_of_a_finished_job_sends_every_line_then_end(
    server: InProcessServer, job: RunningJob
) -> None:
    await finish_job(server.state.db, job.job_id, "failed")
    answer = await server.client.get(logs_path(job, "/stream"), params={"step": 1}, headers=server.auth())
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = parse_events(answer.text)
    logs = [(i, d["text"], d["offset"]) for i, e, d in events if e == "log"]
    assert logs == [("10", "line-0001", 0), ("20", "line-0002", 10), ("30", "line-0003", 20)]
    assert events[-1] == (None, "end", {"status": "failed"})
    assert {"step_index": 1, "name": "build", "status": "failed"} in [d for _, e, d in events if e == "step"]


async def test_last_event_id_resumes_just_after_that_line(server: InProcessServer, job: RunningJob) -> None:
    await finish_job(server.state.db, job.job_id)
    answer = await server.client.get(
        logs_path(job, "/stream"), params={"step": 1}, headers={**server.auth(), "Last-Event-ID": "20"}
    )
    logs = [d["text"] for _, e, d in parse_events(answer.text) if e == "log"]
    assert logs == ["line-0003"]


async def test_the_job_stream_marks_step_changes_and_ids_count_the_job_log(
    server: InProcessServer, job: RunningJob
) -> None:
    await finish_job(server.state.db, job.job_id)
    answer = await server.client.get(logs_path(job, "/stream"), headers=server.auth())
    events = parse_events(answer.text)
    header = len("── 1 build ──\n".encode())
    assert events[0] == (str(header), "step", {"step_index": 1, "name": "build", "status": "success"})
    assert [i for i, e, _ in events if e == "log"] == [str(header + 10), str(header + 20), str(header + 30)]
    whole = await server.client.get(logs_path(job), params={"offset": header + 10}, headers=server.auth())
    assert whole.json()["text"] == "line-0002\nline-0003\n"


async def test_the_service_is_published_at_start_up(server: InProcessServer) -> None:
    assert log_service(server.state) is server.state.parts.need(LOGS)
