"""A worker service with fake peers and sessions (no sockets), and the reroute messages it is offered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conveyor.cluster.messages import (
    AgentInventory,
    JobReroute,
    ScalerInventory,
)
from conveyor.cluster.outbox import Outbox
from conveyor.cluster.worker import WorkerService

SECRET = "s3cr3t-value-xyz"


class FakeSession:
    def __init__(self, peer_id: str = "c1", role: str = "coordinator") -> None:
        self.peer_id = peer_id
        self.peer_role = role
        self.sent: list[Any] = []

    async def send(self, message: Any) -> None:
        self.sent.append(message if isinstance(message, dict) else message.wire())


class FakePeers:
    def __init__(self, *sessions: FakeSession) -> None:
        self.sessions = {s.peer_id: s for s in sessions}

    def session_for(self, instance_id: str) -> FakeSession | None:
        return self.sessions.get(instance_id)


def reroute(job_id: str = "job-1", **overrides: Any) -> JobReroute:
    values: dict[str, Any] = {
        "message_id": f"m-{job_id}",
        "job_id": job_id,
        "run_id": "run-1",
        "coordinator_id": "c1",
        "hop": 1,
        "max_hops": 3,
        "tried": ["c1"],
        "labels": {
            "runs_on": {"labels": [{"kind": "exact", "pattern": "linux", "flags": ""}], "exclude": []}
        },
        "job": {"name": "build"},
        "workflow": {"name": "ci", "file": "ci.py", "content_hash": "h", "hashed_files": []},
        "checkout": {"repo_url": "file:///repo", "sha": "abc", "auth_header": "Authorization: token-zzz"},
        "secrets": {"DEPLOY_KEY": SECRET},
    }
    values.update(overrides)
    return JobReroute.model_validate(values)


def service(
    tmp_path: Path, *, scaler_room: int = 1, agents: list[AgentInventory] | None = None
) -> tuple[WorkerService, FakeSession]:
    session = FakeSession()
    scalers = [
        ScalerInventory(name="local", backend="bare-metal", label_sets=[["linux"]], max_agents=scaler_room)
    ]
    worker = WorkerService(
        instance_id="w1",
        outbox=Outbox(tmp_path),
        peers=FakePeers(session),
        inventory=lambda: (agents or [], scalers),
    )
    return worker, session
