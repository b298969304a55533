"""The `event` backend (docs/design/scaler.md §6.4): a workflow provisions the machine, Conveyor starts
nothing.

`spawn` stores a single-use claim and emits `conveyor.scaler.scale_up` to the scaler's
`provisioning_targets` (repositories whose workflows subscribe to it by name); the workflow creates
a machine in whatever cloud it talks to, and that machine runs `conveyor agent --claim CODE --url
URL`, which redeems the claim for the spawn's agent token. `destroy` emits
`conveyor.scaler.scale_down` so the workflow can tear the machine down. The manager's registration
deadline, provision backoff, single use and token revocation apply as for every backend; there is
no local compute, so `list_live` is empty.

Config keys: `provisioning_targets` (required, repositories), `provisioning_label` (required: the
label of the ordinary agents that run the provisioning workflow's jobs; it may not be in this
scaler's label sets, or the scaler would be asked to provision its own provisioners) and
`claim_ttl_s` (default 300).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from conveyor.events.emit import emit_system
from conveyor.events.models import SCALE_DOWN, SCALE_UP, EmitRequest, EventSettings
from conveyor.model.ids import format_rfc3339, new_id, utc_now
from conveyor.scaler import claims
from conveyor.scaler.backend import (
    BackendContext,
    LiveItem,
    ManagedAgent,
    OnEvent,
    ScalerBackend,
    ScalerEntry,
    ScalerEvent,
    SpawnFailed,
    SpawnRequest,
)

log = logging.getLogger(__name__)

MAX_TARGETS = 50


class EventBackend(ScalerBackend):
    """Provisioning by internal events and claim codes."""

    type: ClassVar[str] = "event"
    scaler_keys: ClassVar[frozenset[str]] = frozenset(
        {"provisioning_targets", "provisioning_label", "claim_ttl_s"}
    )

    def __init__(self, entry: ScalerEntry, context: BackendContext) -> None:
        super().__init__(entry, context)
        self._agents: dict[str, ManagedAgent] = {}
        self._registered: set[str] = set()

    @property
    def _settings(self) -> EventSettings:
        """The event system's current settings (the server's, live knobs included)."""
        current = self.context.event_settings
        return current() if current is not None else EventSettings()

    @classmethod
    def validate_entry(cls, entry: ScalerEntry) -> list[str]:
        """`provisioning_targets` and `provisioning_label` are required; `claim_ttl_s` is positive."""
        options = entry.options
        errors: list[str] = []
        targets = options.get("provisioning_targets")
        if (
            not isinstance(targets, list)
            or not targets
            or not all(isinstance(t, str) and t.strip() for t in targets)
        ):
            errors.append("provisioning_targets: required, a non-empty list of repositories")
        elif len(targets) > MAX_TARGETS:
            errors.append(f"provisioning_targets: at most {MAX_TARGETS} repositories")
        label = options.get("provisioning_label")
        if not isinstance(label, str) or not label.strip():
            errors.append(
                "provisioning_label: required, the label of the agents that run the provisioning jobs"
            )
        else:
            wanted = label.strip().lower()
            if wanted.startswith("conveyor:"):
                errors.append(f"provisioning_label: {wanted} is reserved (conveyor:)")
            for index, label_set in enumerate(entry.label_sets):
                if wanted in label_set.labels:
                    errors.append(
                        f"label_sets[{index}]: holds the provisioning label {wanted}; the scaler "
                        "would provision machines for its own provisioning jobs"
                    )
        ttl = options.get("claim_ttl_s", claims.DEFAULT_CLAIM_TTL_S)
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0:
            errors.append(f"claim_ttl_s: must be a positive number of seconds (got {ttl!r})")
        return errors

    @property
    def targets(self) -> list[str]:
        return [str(t).strip() for t in self.entry.options.get("provisioning_targets") or []]

    @property
    def claim_ttl_s(self) -> float:
        return float(self.entry.options.get("claim_ttl_s", claims.DEFAULT_CLAIM_TTL_S))

    def _database(self) -> Any:
        if self.context.database is None:
            raise SpawnFailed("the event backend runs only on a coordinator (it needs the database)")
        return self.context.database

    async def spawn(self, request: SpawnRequest, on_event: OnEvent) -> ManagedAgent:
        """Store the claim and emit `scale_up` in one transaction; the machine comes later."""
        db = self._database()
        managed = ManagedAgent(
            agent_id=request.agent_id,
            scaler=request.scaler,
            label_set=request.labels,
            backend_ref=f"event:{request.agent_id}",
        )
        self._agents[request.agent_id] = managed
        code = claims.generate_claim_code()
        now = utc_now()
        try:
            async with db.transaction() as conn:
                expires_at = await claims.insert_claim(
                    conn,
                    agent_id=request.agent_id,
                    code=code,
                    scaler=request.scaler,
                    url=request.orchestrator_url,
                    now=now,
                    ttl_s=self.claim_ttl_s,
                )
                payload: dict[str, Any] = {
                    "request_id": new_id(),
                    "agent_id": request.agent_id,
                    "scaler": request.scaler,
                    "labels": list(request.label_set.labels),
                    "orchestrator_url": request.orchestrator_url,
                    "claim_code": code,
                    "claim_expires_at": format_rfc3339(expires_at),
                    "bound_job_id": request.context.bound_job_id,
                    "run_id": request.context.run_id,
                }
                emitted = await emit_system(
                    conn,
                    EmitRequest(
                        name=SCALE_UP,
                        origin="system",
                        org_id=None,
                        payload=payload,
                        target_repos=self.targets,
                        dedup_key=f"scaler:scale_up:{request.agent_id}",
                    ),
                    self._settings,
                )
                if emitted is None:
                    raise SpawnFailed("the scale_up event was refused (see the orchestrator log)")
        except BaseException:
            self._agents.pop(request.agent_id, None)
            raise
        managed.state = "running"
        on_event(
            ScalerEvent(
                request.agent_id,
                "provisioning",
                f"scale_up emitted to {', '.join(self.targets)}; claim valid {self.claim_ttl_s:g} s",
            )
        )
        return managed

    async def destroy(self, agent_id: str, *, reason: str, grace_s: float | None = None) -> None:
        """Expire an unredeemed claim and emit `scale_down` (once per agent)."""
        managed = self._agents.pop(agent_id, None)
        self._registered.discard(agent_id)
        if managed is None or self.context.database is None:
            return
        managed.state = "destroying"
        async with self.context.database.transaction() as conn:
            await claims.expire_claim(conn, agent_id, utc_now())
            await emit_system(
                conn,
                EmitRequest(
                    name=SCALE_DOWN,
                    origin="system",
                    org_id=None,
                    payload={
                        "request_id": new_id(),
                        "agent_id": agent_id,
                        "scaler": managed.scaler,
                        "labels": [label for label in managed.label_set if not label.startswith("conveyor:")],
                        "reason": reason,
                    },
                    target_repos=self.targets,
                    dedup_key=f"scaler:scale_down:{agent_id}",
                ),
                self._settings,
            )

    def mark_registered(self, agent_id: str) -> None:
        if agent_id in self._agents:
            self._registered.add(agent_id)

    def is_alive(self, agent_id: str) -> bool:
        return agent_id in self._agents

    async def list_live(self) -> list[LiveItem]:
        return []

    async def stop_live(self, item: LiveItem) -> None:
        return None

    def managed(self) -> dict[str, ManagedAgent]:
        return dict(self._agents)
