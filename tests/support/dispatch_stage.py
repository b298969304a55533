"""A real server process, a local source with workflows, and agent tokens: the dispatch tests' stage."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support.http import HTTP
from tests.support.processes import ServerProcess
from tests.support.repos import git, make_repo
from tests.support.waiting import wait_until

FAST = {
    "CONVEYOR_SWEEP_INTERVAL_MS": "200",
    "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "200",
    "CONVEYOR_CLUSTER_LEASE_RENEW_MS": "300",
    "CONVEYOR_CLUSTER_LEASE_TTL_MS": "1500",
    "CONVEYOR_DISPATCH_POLL_MS": "200",
    # The product's default: a scripted agent acks only when its test says so, after blocking calls
    # (`push`, `wait_run`) that take seconds on a loaded machine. Tests about the deadline set
    # SHORT_ACK_TIMEOUT themselves.
    "CONVEYOR_DISPATCH_ACK_TIMEOUT_MS": "10000",
    "CONVEYOR_RECOVERY_GRACE_MS": "1500",
    # Scripted agents send no heartbeats, and the tests' blocking waits (CLI runs, `wait_run`) hold
    # the event loop their frames would come from: on a loaded machine 3 s of silence is ordinary.
    # Tests about silent agents set SILENT_AGENT_DEAD_AFTER themselves.
    "CONVEYOR_AGENT_DEAD_AFTER_MS": "30000",
}
SILENT_AGENT_DEAD_AFTER = {"CONVEYOR_AGENT_DEAD_AFTER_MS": "3000"}
SHORT_ACK_TIMEOUT = {"CONVEYOR_DISPATCH_ACK_TIMEOUT_MS": "1000"}

NEEDS_WORKFLOW = """
from conveyor import Need, push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "build"])

@ci.job(runs_on=["linux"], needs=[build])
def test(ctx):
    ctx.sh(["echo", "test"])

@ci.job(runs_on=["linux"], needs=[Need(build, when="always")])
def report(ctx):
    ctx.sh(["echo", "report"])
"""

SINGLE_WORKFLOW = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "build"])
"""

GPU_WORKFLOW = """
from conveyor import push, workflow

ml = workflow("ml", on=[push(branches=["main"])])

@ml.job(runs_on=["gpu", "linux"])
def train(ctx):
    ctx.sh(["echo", "train"])
"""


class Stage:
    """One server with an owner token, a local source and helpers to drive it."""

    def __init__(self, server: ServerProcess, repo: Path) -> None:
        self.server = server
        self.repo = repo
        self.token = server.owner_token()
        self.ws_url = server.url.replace("http://", "ws://") + "/ws"
        self.source_id = ""
        # Each agent token this stage created, plaintext → id. A token's listed prefix is `cvy_agent_` and two
        # hex digits, so two tokens share one in 1 of 256 stages: only the creation answer names the row.
        self.token_ids: dict[str, str] = {}

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        answer = HTTP.request(
            method,
            f"{self.server.url}/api/v1/admin{path}",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
            **kwargs,
        )
        if answer.status_code >= 500:
            # pytest shows a failing test's output: the server's traceback, gone with its directory after.
            print(
                f"--- {method} {path}: {answer.status_code}; the server's log ends:\n{self.server.output()[-8000:]}"
            )
        return answer

    def add_source(self, name: str = "app") -> None:
        answer = self.api("POST", "/sources", json={"kind": "local", "name": name, "path": str(self.repo)})
        assert answer.status_code == 201, answer.text
        self.source_id = answer.json()["id"]

    def agent_token(self, labels: list[str]) -> str:
        answer = self.api("POST", "/agent-tokens", json={"labels": labels, "mandatory_labels": []})
        assert answer.status_code == 201, answer.text
        token = str(answer.json()["token"])
        self.token_ids[token] = str(answer.json()["id"])
        return token

    def push(self) -> str:
        """Trigger the repository's HEAD; return the run id (the single run created)."""
        sha = git(self.repo, "rev-parse", "HEAD")
        answer = self.api(
            "POST", f"/sources/{self.source_id}/trigger", json={"ref": "refs/heads/main", "sha": sha}
        )
        assert answer.status_code == 202, answer.text
        delivery = answer.json()["delivery"]

        def run_ids() -> list[str] | None:
            row = self.api("GET", f"/deliveries/{delivery}").json()
            return row["runs"] or None

        return wait_until(run_ids, timeout=20, what="the push's run")[0]

    def run(self, run_id: str) -> dict[str, Any]:
        return self.api("GET", f"/runs/{run_id}").json()  # type: ignore[no-any-return]

    def job_status(self, run_id: str) -> dict[str, str]:
        return {j["name"]: j["status"] for j in self.run(run_id)["jobs"]}

    def wait_run(self, run_id: str, status: str, timeout: float = 90) -> dict[str, Any]:
        return wait_until(
            lambda: (r := self.run(run_id))["status"] == status and r,
            timeout=timeout,
            what=f"run {run_id} {status}",
        )


@contextmanager
def stage(
    tmp_path: Path, database_url: str, workflows: dict[str, str], env: dict[str, str] | None = None
) -> Iterator[Stage]:
    """A running server with a local source holding `workflows`."""
    repo = make_repo(tmp_path / "repo", workflows)
    server = ServerProcess(tmp_path / "home", database_url=database_url, env={**FAST, **(env or {})})
    try:
        server.wait_ready()
        staged = Stage(server, repo)
        staged.add_source()
        yield staged
    finally:
        server.stop()
