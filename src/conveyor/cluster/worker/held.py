"""A job this worker accepted (`HeldJob`): its state here and its secrets, which live nowhere else."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from conveyor.cluster.messages import JobReroute
from conveyor.cluster.worker.logs import LogRelayBuffer
from conveyor.model import protocol as p
from conveyor.model.ids import new_id, utc_now


@dataclass
class HeldJob:
    """A job this worker accepted. Its secrets are here and nowhere else."""

    reroute: JobReroute
    owner: str
    state: str = "held"  # held → offered (sent to an agent) → acked → running → (gone)
    agent_id: str | None = None
    dispatch_id: str | None = None
    offered_at: float = 0.0
    bound_agent_id: str | None = None
    spawn_failures: int = 0
    not_before: float = 0.0
    final_steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    logs: LogRelayBuffer = field(default_factory=LogRelayBuffer)
    accepted_at: datetime = field(default_factory=utc_now)

    @property
    def job_id(self) -> str:
        """The coordinator's job id."""
        return self.reroute.job_id

    @property
    def runs_on(self) -> dict[str, Any]:
        """The job's label rule."""
        return dict(self.reroute.labels.runs_on)

    def secret_values(self) -> tuple[str, ...]:
        """Every credential to mask in relayed lines."""
        checkout = self.reroute.checkout
        extra = [v for v in (checkout.clone_token, checkout.auth_header, self.reroute.job_token) if v]
        return tuple(sorted({*self.reroute.secrets.values(), *extra}, key=len, reverse=True))

    def erase(self) -> None:
        """Drop secrets and clone credentials (the job ended or left this worker)."""
        self.reroute.secrets.clear()
        self.reroute.checkout.clone_token = None
        self.reroute.checkout.auth_header = None
        self.reroute.job_token = None
        self.reroute.env.clear()

    def dispatch(self) -> p.JobDispatch:
        """The agent's `job.dispatch` for this job."""
        reroute = self.reroute
        return p.JobDispatch(
            id=new_id(),
            job_id=reroute.job_id,
            run_id=reroute.run_id,
            attempt=reroute.attempt,
            repo=p.RepoSpec(
                clone_url=reroute.checkout.repo_url,
                ref=reroute.checkout.ref,
                sha=reroute.checkout.sha,
                auth_header=reroute.checkout.auth_header,
            ),
            workflow=p.WorkflowSpec.model_validate(reroute.workflow),
            job=reroute.job,
            env=dict(reroute.env),
            secrets=dict(reroute.secrets),
            upstream=reroute.upstream,
            context=reroute.context,
            log_max_bytes=reroute.log_max_bytes,
            # The agent sends its transfers to this worker, which proxies them (docs/design/artifacts.md §4).
            artifacts=p.ArtifactAccess(token=reroute.job_token) if reroute.job_token else None,
        )
