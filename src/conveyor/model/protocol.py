"""The agent protocol over `/ws` (docs/design/execution.md §6): one pydantic model per message type.

Frames are JSON text objects with a `type`. Requests expecting an answer carry `id`; answers carry
`re`. Durable agent → orchestrator messages (`step.finished`, `job.finished`, `event.emit`) carry the
outbox sequence `oseq` and are acknowledged with `status.ack` after the orchestrator committed them.

The handshake is `auth.request` then `agent.register`. An agent may send the register right behind the
auth request, without waiting for `auth.success` (the agent of this version does: one round trip); the
orchestrator answers the auth first and reads the register only after `auth.success`, so an agent that
waits between the two (older versions) is served the same way.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

PROTOCOL_VERSION = 1

# Close codes (docs/design/execution.md §6).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_BAD_MESSAGE = 4000
CLOSE_HANDSHAKE_TIMEOUT = 4002
CLOSE_PROTOCOL_UNSUPPORTED = 4003
CLOSE_HEARTBEAT_TIMEOUT = 4004
CLOSE_OPERATOR = 4006
CLOSE_REPLACED = 4008
CLOSE_AUTH_FAILED = 4010
CLOSE_ACK_TIMEOUT = 4031


class Message(BaseModel):
    """Base of every frame: unknown fields are refused (a schema error closes 4000)."""

    # `defer_build`: a model's validator and serializer are built when it is first used, so a process
    # builds only the messages it handles (an ephemeral agent starts sooner), not the whole protocol.
    model_config = ConfigDict(extra="forbid", defer_build=True)


# --- handshake


class AuthRequest(Message):
    type: Literal["auth.request"] = "auth.request"
    token: str
    protocol: int = PROTOCOL_VERSION
    version: str = ""


class AuthSuccess(Message):
    type: Literal["auth.success"] = "auth.success"
    connection_id: str
    instance_id: str
    server_version: str
    heartbeat_ms: int


class AuthFailure(Message):
    type: Literal["auth.failure"] = "auth.failure"
    reason: str


class HostInfo(Message):
    hostname: str = ""
    os: str = ""
    arch: str = ""
    cpus: int | None = None
    memory_mb: int | None = None
    python: str = ""


class InFlight(Message):
    job_id: str
    step_index: int | None = None


class AgentRegister(Message):
    type: Literal["agent.register"] = "agent.register"
    agent_id: str
    labels: list[str] = Field(default_factory=list)
    capacity: int = Field(default=1, ge=1, le=256)
    in_flight: list[InFlight] = Field(default_factory=list)
    unacked_jobs: list[str] = Field(default_factory=list)
    host: HostInfo = Field(default_factory=HostInfo)
    version: str = ""
    ephemeral: bool = False


class RegisterAck(Message):
    type: Literal["register.ack"] = "register.ack"
    agent_id: str
    labels: list[str]
    mandatory_labels: list[str]
    pending_dispatch: bool = False
    bound_job_id: str | None = None


# --- orchestrator → agent


class RepoSpec(Message):
    clone_url: str
    ref: str | None = None
    sha: str
    auth_header: str | None = None


class WorkflowSpec(Message):
    name: str
    file: str
    content_hash: str
    hashed_files: list[str]
    # A global workflow's own repository (the policy source's, at the commit that registered it): the agent
    # imports the workflow from there, beside the workspace (docs/design/global_workflows.md §5).
    repo: RepoSpec | None = None


class ArtifactAccess(Message):
    """The job's artifact credential (docs/design/artifacts.md §4); the agent keeps it from its steps."""

    token: str
    url: str | None = None
    # The blob store writes an upload's final key directly when the agent sends the digest first, and a
    # whole download may be answered with a redirect to the object store (docs/design/artifacts.md §4).
    digest_first: bool = False
    direct_downloads: bool = False


class JobDispatch(Message):
    type: Literal["job.dispatch"] = "job.dispatch"
    id: str
    job_id: str
    run_id: str
    attempt: int
    repo: RepoSpec
    workflow: WorkflowSpec
    job: dict[str, Any]
    env: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(default_factory=dict)
    upstream: dict[str, Any] = Field(default_factory=dict)
    context: dict[str, Any] = Field(default_factory=dict)
    log_max_bytes: int = 10 * 1024 * 1024
    artifacts: ArtifactAccess | None = None


class JobCancel(Message):
    type: Literal["job.cancel"] = "job.cancel"
    job_id: str
    reason: str = ""
    force: bool = False


class AgentDrain(Message):
    type: Literal["agent.drain"] = "agent.drain"
    reason: str = ""


class StatusAck(Message):
    type: Literal["status.ack"] = "status.ack"
    oseq: int


class HeartbeatAck(Message):
    type: Literal["heartbeat.ack"] = "heartbeat.ack"
    ts: float


class EmitError(Message):
    """Why an `event.emit` was refused (docs/design/events.md §1): the API error code, its text, a retry
    hint."""

    code: str
    detail: str = ""
    retry_after_ms: int | None = None


class EventEmitResult(Message):
    type: Literal["event.emit.result"] = "event.emit.result"
    request_id: str
    event_id: str | None = None
    created: bool | None = None
    error: EmitError | None = None


# --- agent → orchestrator


class JobAck(Message):
    type: Literal["job.ack"] = "job.ack"
    re: str
    job_id: str


class JobReject(Message):
    type: Literal["job.reject"] = "job.reject"
    re: str
    job_id: str
    reason: Literal["busy", "draining", "unsupported"]
    detail: str = ""


class JobStarted(Message):
    type: Literal["job.started"] = "job.started"
    job_id: str
    ts: float | None = None


class StepStarted(Message):
    type: Literal["step.started"] = "step.started"
    job_id: str
    step_index: int
    name: str
    kind: Literal["setup", "step", "hook"] = "step"
    lock_index: int | None = None
    ts: float | None = None


class LogLine(Message):
    ts: float | None = None
    stream: Literal["out", "err", "sys"] = "out"
    text: str


class LogChunk(Message):
    type: Literal["log.chunk"] = "log.chunk"
    job_id: str
    step_index: int
    seq: int = Field(ge=0)
    lines: list[LogLine]
    # The `job.dispatch` attempt whose execution wrote it; an agent of the previous version sends none.
    attempt: int | None = Field(default=None, ge=1)


class StepFinished(Message):
    type: Literal["step.finished"] = "step.finished"
    oseq: int
    job_id: str
    step_index: int
    name: str | None = None
    kind: Literal["setup", "step", "hook"] | None = None
    status: Literal["success", "failed", "cancelled", "skipped", "timed_out"]
    reason: str | None = None
    exit_code: int | None = None
    outputs: dict[str, Any] | None = None
    attempts: int = 1
    duration_ms: int | None = None
    error: str | None = None


class JobFinished(Message):
    type: Literal["job.finished"] = "job.finished"
    oseq: int
    job_id: str
    status: Literal["success", "failed", "cancelled", "skipped", "timed_out"]
    reason: str | None = None
    outputs: dict[str, Any] | None = None
    duration_ms: int | None = None
    error: str | None = None
    # The attempt of the execution reporting: its log is the one the job shows.
    attempt: int | None = Field(default=None, ge=1)


class EventEmit(Message):
    type: Literal["event.emit"] = "event.emit"
    oseq: int
    request_id: str
    job_id: str
    name: str
    payload: dict[str, Any] = Field(default_factory=dict)
    target_repos: list[str] | None = None


class Heartbeat(Message):
    type: Literal["heartbeat"] = "heartbeat"
    ts: float | None = None
    running: list[str] = Field(default_factory=list)
    free_slots: int = 0
    draining: bool = False


AgentMessage = Annotated[
    AuthRequest
    | AgentRegister
    | JobAck
    | JobReject
    | JobStarted
    | StepStarted
    | LogChunk
    | StepFinished
    | JobFinished
    | EventEmit
    | Heartbeat,
    Field(discriminator="type"),
]
OrchestratorMessage = Annotated[
    AuthSuccess
    | AuthFailure
    | RegisterAck
    | JobDispatch
    | JobCancel
    | AgentDrain
    | StatusAck
    | HeartbeatAck
    | EventEmitResult,
    Field(discriminator="type"),
]


@functools.cache
def agent_messages() -> TypeAdapter[AgentMessage]:
    """The parser of agent → orchestrator frames, built on first use (an agent never needs it)."""
    return TypeAdapter(AgentMessage)


@functools.cache
def orchestrator_messages() -> TypeAdapter[OrchestratorMessage]:
    """The parser of orchestrator → agent frames, built on first use (an orchestrator never needs it)."""
    return TypeAdapter(OrchestratorMessage)


def parse_agent_message(raw: str | bytes) -> AgentMessage:
    """Parse one frame from an agent; raises `pydantic.ValidationError` (close 4000)."""
    return agent_messages().validate_json(raw)


def parse_orchestrator_message(raw: str | bytes) -> OrchestratorMessage:
    """Parse one frame from the orchestrator."""
    return orchestrator_messages().validate_json(raw)
