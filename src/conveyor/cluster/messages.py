"""Peer-channel messages (docs/design/cluster.md §2.4): pydantic models in a union discriminated on `type`.

Unknown fields are kept (a newer peer may send more), an unknown `type` is logged and ignored, and
a known message that fails validation raises `InvalidMessage` so the caller can drop it (and answer
a request with `peer.error`).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from conveyor.errors import ConveyorError

log = logging.getLogger(__name__)

PeerRole = Literal["coordinator", "worker"]


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    def wire(self) -> dict[str, Any]:
        """The JSON object to send (unset optional fields left out)."""
        return self.model_dump(mode="json", exclude_none=True)


class AuthRequest(_Message):
    """D→A: who the dialer is, with exactly one of a join token or a proof."""

    type: Literal["peer.auth.request"] = "peer.auth.request"
    instance_id: str = Field(min_length=1, max_length=64)
    software_version: str = Field(max_length=64)
    advertise_url: str | None = Field(default=None, max_length=255)
    join_token: str | None = Field(default=None, max_length=128)
    proof: str | None = Field(default=None, max_length=128)

    @model_validator(mode="after")
    def _one_credential(self) -> AuthRequest:
        if (self.join_token is None) == (self.proof is None):
            raise ValueError("exactly one of join_token or proof is required")
        return self


class IssuedCredential(BaseModel):
    """A credential secret, returned once."""

    model_config = ConfigDict(extra="allow")

    secret: str
    expires_at: str


class AuthResponse(_Message):
    """A→D: accepted or refused (with a reason), the role the acceptor holds for the dialer."""

    type: Literal["peer.auth.response"] = "peer.auth.response"
    accepted: bool
    reason: str | None = None
    instance_id: str
    your_role: PeerRole | None = None
    server_signature: str | None = None
    credential: IssuedCredential | None = None


class AgentInventory(BaseModel):
    """One agent in a heartbeat."""

    model_config = ConfigDict(extra="allow")

    agent_id: str
    labels: list[str] = Field(default_factory=list)
    mandatory_labels: list[str] = Field(default_factory=list)
    active_jobs: int = 0
    capacity: int = 0

    @field_validator("labels", "mandatory_labels")
    @classmethod
    def _lower(cls, value: list[str]) -> list[str]:
        return [label.lower() for label in value]


class ScalerInventory(BaseModel):
    """One scaler's capacity in a heartbeat."""

    model_config = ConfigDict(extra="allow")

    name: str
    backend: str
    label_sets: list[list[str]] = Field(default_factory=list)
    mandatory_labels: list[str] = Field(default_factory=list)
    max_agents: int = 0
    active: int = 0

    @field_validator("label_sets")
    @classmethod
    def _lower_sets(cls, value: list[list[str]]) -> list[list[str]]:
        return [[label.lower() for label in labels] for labels in value]

    @field_validator("mandatory_labels")
    @classmethod
    def _lower(cls, value: list[str]) -> list[str]:
        return [label.lower() for label in value]


class LeaseInfo(BaseModel):
    """A coordinator's view of the leader lease."""

    model_config = ConfigDict(extra="allow")

    holder: str | None = None
    epoch: int | None = None


class Heartbeat(_Message):
    """Both directions: liveness and inventory (docs/design/cluster.md §2.3)."""

    type: Literal["peer.heartbeat"] = "peer.heartbeat"
    instance_id: str
    role: PeerRole
    at: str
    software_version: str
    draining: bool = False
    agents: list[AgentInventory] = Field(default_factory=list)
    scalers: list[ScalerInventory] = Field(default_factory=list)
    cluster_settings_version: int = 0
    registry_version: int = 0
    lease: LeaseInfo | None = None
    secret_key_fingerprint: str | None = None


class Leaving(_Message):
    """Both: the sender shuts down cleanly; the receiver marks it disconnected at once."""

    type: Literal["peer.leaving"] = "peer.leaving"
    instance_id: str
    reason: str = "shutdown"


class Revoked(_Message):
    """Coordinator → coordinator: close your sessions of this peer (its credential was revoked)."""

    type: Literal["peer.revoked"] = "peer.revoked"
    instance_id: str


class CredentialRotate(_Message):
    """A→D: a new credential secret, to be saved before it is acknowledged."""

    type: Literal["peer.credential.rotate"] = "peer.credential.rotate"
    secret: str
    expires_at: str


class CredentialRotateAck(_Message):
    """D→A: the new secret is saved; the acceptor may now make it the active row."""

    type: Literal["peer.credential.rotate.ack"] = "peer.credential.rotate.ack"
    instance_id: str


class ForgetRequest(_Message):
    """Coordinator → coordinator: forget this peer if your own guards allow it
    (docs/design/cluster.md §7.1)."""

    type: Literal["peer.forget.request"] = "peer.forget.request"
    message_id: str = Field(min_length=1, max_length=64)
    instance_id: str = Field(min_length=1, max_length=64)
    acknowledge_backstop: bool = False


class ForgetResponse(_Message):
    """The answering coordinator's outcome (docs/design/cluster.md §7.1's table)."""

    type: Literal["peer.forget.response"] = "peer.forget.response"
    message_id: str
    outcome: str
    detail: str = ""


class OrphansRequest(_Message):
    """Coordinator → peer: list or stop this node's orphans (docs/design/scaler.md §7)."""

    type: Literal["peer.scaler.orphans.request"] = "peer.scaler.orphans.request"
    message_id: str = Field(min_length=1, max_length=64)
    action: Literal["list", "stop"]
    vm_ids: list[str] | None = Field(default=None, max_length=100)
    timeout_ms: int = 10_000


class OrphansResponse(_Message):
    """The node's listing (`items`, `complete`, `disconnected_coordinators`) or stop `results`."""

    type: Literal["peer.scaler.orphans.response"] = "peer.scaler.orphans.response"
    message_id: str
    ok: bool
    error: str | None = None
    node: str
    items: list[dict[str, Any]] | None = None
    results: list[dict[str, Any]] | None = None
    complete: bool | None = None
    disconnected_coordinators: list[str] | None = None


class ScalerReloadRequest(_Message):
    """Coordinator → peer: reload your scaler configuration (docs/design/scaler.md §3, `reload --target`)."""

    type: Literal["peer.scaler.reload.request"] = "peer.scaler.reload.request"
    message_id: str = Field(min_length=1, max_length=64)


class ScalerReloadResponse(_Message):
    """The node's outcome: `reloaded` (with its scalers) or `refused` (the config error, every problem)."""

    type: Literal["peer.scaler.reload.response"] = "peer.scaler.reload.response"
    message_id: str
    node: str
    outcome: Literal["reloaded", "refused"]
    detail: str = ""
    scalers: list[str] | None = None


class SupportBundleRequest(_Message):
    """Coordinator → peer: your part of a support bundle (docs/design/admin.md §8.1)."""

    type: Literal["peer.support_bundle.request"] = "peer.support_bundle.request"
    message_id: str = Field(min_length=1, max_length=64)
    log_bytes: int = Field(ge=1024, le=4 * 1024 * 1024)


class SupportBundleResponse(_Message):
    """The node's files (already redacted and bounded by the node), or a refusal in `error`."""

    type: Literal["peer.support_bundle.response"] = "peer.support_bundle.response"
    message_id: str
    node: str
    ok: bool
    error: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


class PeerError(_Message):
    """Both: the answer to a request that failed validation or has no handler."""

    type: Literal["peer.error"] = "peer.error"
    message_id: str | None = None
    error: str
    detail: str = ""


class SharedScalerConfig(BaseModel):
    """The shared `scalers.yaml` inside a settings snapshot (docs/design/cluster.md §5.3)."""

    model_config = ConfigDict(extra="allow")
    version: int = Field(ge=1)
    content: str
    sha256: str = Field(min_length=64, max_length=64)


class SettingsRequest(_Message):
    """Worker → coordinator: send me the cluster-settings snapshot (docs/design/cluster.md §5.3)."""

    type: Literal["cluster_settings.request"] = "cluster_settings.request"
    message_id: str = Field(min_length=1, max_length=64)


class SettingsResponse(_Message):
    """Coordinator → worker: `{version, settings}` resolved from one uncached row read."""

    type: Literal["cluster_settings.response"] = "cluster_settings.response"
    message_id: str = Field(min_length=1, max_length=64)
    version: int = Field(ge=0)
    settings: dict[str, int | None] = Field(default_factory=dict)
    # The shared scaler configuration (docs/design/scaler.md §11); None when none is stored, or from an
    # older coordinator.
    scaler_config: SharedScalerConfig | None = None


class DrainRequest(_Message):
    """Coordinator → peer: drain or resume (docs/design/cluster.md §8, admin
    `orchestrator drain --target`)."""

    type: Literal["peer.drain.request"] = "peer.drain.request"
    message_id: str = Field(min_length=1, max_length=64)
    action: Literal["drain", "resume"]


class DrainResponse(_Message):
    """Peer → coordinator: the drain state after the request, and how many jobs still run."""

    type: Literal["peer.drain.response"] = "peer.drain.response"
    message_id: str = Field(min_length=1, max_length=64)
    draining: bool
    jobs_running: int = 0


# --- the job path (docs/design/cluster.md §4): coordinator ↔ worker

JobState = Literal[
    "queued", "dispatched", "running", "cancelling", "success", "failed", "cancelled", "skipped", "timed_out"
]
TERMINAL_JOB_STATES = frozenset({"success", "failed", "cancelled", "skipped", "timed_out"})
RerouteNak = Literal["loop", "max-hops", "draining", "no-capacity", "invalid"]


class RerouteLabels(BaseModel):
    """The job's label rule (`docs/design/execution.md` §5): its stored `runs_on` document (`labels` and
    `exclude`)."""

    model_config = ConfigDict(extra="allow")

    runs_on: dict[str, Any] = Field(default_factory=dict)


class RerouteCheckout(BaseModel):
    """How the worker's agent clones: `clone_token`/`auth_header` are credentials (memory only)."""

    model_config = ConfigDict(extra="allow")

    repo_url: str
    ref: str | None = None
    sha: str
    clone_token: str | None = None
    auth_header: str | None = None


class SpawnRetry(BaseModel):
    """The org's spawn-retry budget for this job (docs/design/cluster.md §4.3)."""

    model_config = ConfigDict(extra="allow")

    max_attempts: int = Field(default=3, ge=1)
    backoff_ms: int = Field(default=5000, ge=0)


class JobReroute(_Message):
    """Coordinator → worker: run this job (docs/design/cluster.md §4.2). Carries secrets: never logged, never
    written."""

    type: Literal["job.reroute"] = "job.reroute"
    message_id: str
    job_id: str
    run_id: str
    org_id: str = "default"
    coordinator_id: str
    hop: int = Field(ge=1)
    max_hops: int = Field(ge=1)
    tried: list[str] = Field(default_factory=list)
    labels: RerouteLabels = Field(default_factory=RerouteLabels)
    job: dict[str, Any]
    workflow: dict[str, Any]
    attempt: int = 1
    env: dict[str, str] = Field(default_factory=dict)
    upstream: dict[str, Any] = Field(default_factory=dict)
    context: dict[str, Any] = Field(default_factory=dict)
    log_max_bytes: int = 10 * 1024 * 1024
    checkout: RerouteCheckout
    secrets: dict[str, str] = Field(default_factory=dict)
    spawn_retry: SpawnRetry = Field(default_factory=SpawnRetry)
    trace_id: str | None = None
    # The job's artifact credential (`cvy_job_…`, docs/design/artifacts.md §4), minted with the claim by the
    # offering coordinator: the worker hands it to its agent and checks it on the routes it proxies.
    # Absent from an older coordinator: the job's artifact calls then fail on the agent.
    job_token: str | None = Field(default=None, max_length=128)

    def __repr__(self) -> str:  # a stray log of the message must not print secrets or tokens
        return f"JobReroute(job_id={self.job_id!r}, hop={self.hop})"

    __str__ = __repr__


class JobRerouteAck(_Message):
    """Worker → coordinator: accepted (maybe a duplicate) or a NAK with its reason."""

    type: Literal["job.reroute.ack"] = "job.reroute.ack"
    message_id: str
    job_id: str
    accepted: bool
    duplicate: bool = False
    reason: str | None = None


class JobProgress(_Message):
    """Worker → coordinator: a job or step state; terminal job progress carries every step's result."""

    type: Literal["job.progress"] = "job.progress"
    job_id: str
    run_id: str
    kind: Literal["job", "step"]
    step_index: int | None = None
    state: str
    at: str
    data: dict[str, Any] = Field(default_factory=dict)
    final_steps: list[dict[str, Any]] | None = None
    # The dispatch attempt and offer hop of the execution reporting: a terminal progress makes its log the
    # job's (docs/design/execution.md §9).
    attempt: int | None = Field(default=None, ge=1)
    hop: int | None = Field(default=None, ge=0)

    @property
    def terminal(self) -> bool:
        """A job's end (what the outbox keeps until it is acknowledged)."""
        return self.kind == "job" and self.state in TERMINAL_JOB_STATES


class JobProgressAck(_Message):
    """Coordinator → worker: applied (or a replay that changed nothing), after commit."""

    type: Literal["job.progress.ack"] = "job.progress.ack"
    job_id: str
    state: str


class JobCancelRequest(_Message):
    """Coordinator → worker: stop a held job (a spawn, or the agent running it)."""

    type: Literal["job.cancel"] = "job.cancel"
    run_id: str
    job_id: str | None = None
    reason: str = "cancelled"
    force: bool = False


class JobCancelRelay(_Message):
    """Coordinator → coordinator: pass a `job.cancel` on to a worker connected there and not here
    (docs/design/cluster.md §4.4: the leader's sweep may cancel through any connected coordinator). Accepted
    from coordinators only."""

    type: Literal["job.cancel.relay"] = "job.cancel.relay"
    worker: str
    cancel: JobCancelRequest


class AgentTokenRevoke(_Message):
    """Coordinator → coordinator: an agent token was revoked; close the agents connected with it here
    (close 4010). Accepted from coordinators only: a worker's agents hold tokens the worker minted
    itself, never the database's."""

    type: Literal["agent_token.revoke"] = "agent_token.revoke"
    token_id: str = Field(min_length=1, max_length=64)


class ScalerEventRelay(_Message):
    """Worker → coordinator: what a worker's scaler did for a rerouted job (docs/design/cluster.md §4.3)."""

    type: Literal["scaler.event"] = "scaler.event"
    run_id: str
    job_id: str
    agent_id: str | None = None
    kind: str
    detail: str = ""
    attempt: int | None = None
    final: bool | None = None
    at: str


class LogChunkRelay(_Message):
    """Worker → coordinator: an agent's `log.chunk`, already masked by the worker."""

    type: Literal["log.chunk"] = "log.chunk"
    job_id: str
    step_index: int
    seq: int = Field(ge=0)
    lines: list[dict[str, Any]]
    # The dispatch attempt and offer hop of the execution that wrote it (docs/design/execution.md §9); none
    # from a worker of the previous version.
    attempt: int | None = Field(default=None, ge=1)
    hop: int | None = Field(default=None, ge=0)


class EventEmitRelay(_Message):
    """Worker → coordinator: an agent's `event.emit` (`docs/design/execution.md` §6), answered by
    `.result`."""

    type: Literal["event.emit"] = "event.emit"
    job_id: str
    request_id: str
    name: str
    payload: dict[str, Any] = Field(default_factory=dict)
    target_repos: list[str] | None = None


class EventEmitResultRelay(_Message):
    """Coordinator → worker: the answer to a relayed `event.emit`."""

    type: Literal["event.emit.result"] = "event.emit.result"
    job_id: str
    request_id: str
    event_id: str | None = None
    created: bool | None = None
    error: dict[str, Any] | None = None


PeerMessage = Annotated[
    AuthRequest
    | AuthResponse
    | Heartbeat
    | Leaving
    | Revoked
    | CredentialRotate
    | CredentialRotateAck
    | ForgetRequest
    | ForgetResponse
    | OrphansRequest
    | OrphansResponse
    | ScalerReloadRequest
    | ScalerReloadResponse
    | SupportBundleRequest
    | SupportBundleResponse
    | PeerError
    | SettingsRequest
    | SettingsResponse
    | DrainRequest
    | DrainResponse
    | JobReroute
    | JobRerouteAck
    | JobProgress
    | JobProgressAck
    | JobCancelRequest
    | JobCancelRelay
    | AgentTokenRevoke
    | ScalerEventRelay
    | LogChunkRelay
    | EventEmitRelay
    | EventEmitResultRelay,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[PeerMessage] = TypeAdapter(PeerMessage)
KNOWN_TYPES = frozenset(
    model.model_fields["type"].default
    for model in (
        AuthRequest,
        AuthResponse,
        Heartbeat,
        Leaving,
        Revoked,
        CredentialRotate,
        CredentialRotateAck,
        ForgetRequest,
        ForgetResponse,
        OrphansRequest,
        OrphansResponse,
        ScalerReloadRequest,
        ScalerReloadResponse,
        SupportBundleRequest,
        SupportBundleResponse,
        PeerError,
        SettingsRequest,
        SettingsResponse,
        DrainRequest,
        DrainResponse,
        JobReroute,
        JobRerouteAck,
        JobProgress,
        JobProgressAck,
        JobCancelRequest,
        JobCancelRelay,
        AgentTokenRevoke,
        ScalerEventRelay,
        LogChunkRelay,
        EventEmitRelay,
        EventEmitResultRelay,
    )
)


class InvalidMessage(ConveyorError):
    """A message of a known type failed validation; drop it (a request gets `peer.error`)."""

    def __init__(self, message_type: str, detail: str, message_id: str | None) -> None:
        super().__init__(f"{message_type}: {detail}")
        self.message_type = message_type
        self.detail = detail
        self.message_id = message_id


def parse_message(data: dict[str, Any]) -> PeerMessage | None:
    """The model for `data`, or None for an unknown `type` (logged: forward compatibility)."""
    message_type = data.get("type")
    if message_type not in KNOWN_TYPES:
        log.info("ignored a peer message of unknown type %r", str(message_type)[:64])
        return None
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        message_id = data.get("message_id")
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:]) or 'message'}: {err['msg']}" for err in exc.errors()
        )
        raise InvalidMessage(
            str(message_type), problems, message_id if isinstance(message_id, str) else None
        ) from exc
