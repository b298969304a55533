"""Roles and permissions (docs/design/admin.md §3): a static map, no table."""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["owner", "admin", "operator", "auditor"]
ROLES: tuple[Role, ...] = get_args(Role)

# Permission -> roles holding it, exactly the table of docs/design/admin.md §3 (O = owner, A = admin, P =
# operator, U = auditor).
_TABLE: dict[str, str] = {
    "run.read": "OAPU",
    "run.cancel": "OAP",
    "run.rerun": "OAP",
    "run.approve": "OAP",
    "log.read": "OAPU",
    "agent.read": "OAPU",
    "agent.manage": "OAP",
    "token.manage": "O",
    "source.read": "OAPU",
    "source.manage": "OA",
    "source.trigger": "OAP",
    "secret.read_meta": "OAPU",
    "secret.write": "OA",
    "secret.rotate_key": "O",
    "event.read": "OAPU",
    "event.read_payload": "OA",
    "event.emit": "OAP",
    "event_dlq.read": "OAPU",
    "event_dlq.manage": "OAP",
    "registration.read": "OAPU",
    "registration.manage": "OA",
    "scaler.read": "OAPU",
    "scaler.manage": "OAP",
    "peer.read": "OAPU",
    "peer.manage": "OA",
    "cluster_settings.read": "OAPU",
    "cluster_settings.write": "OA",
    "org_settings.read": "OAPU",
    "org_settings.write": "OA",
    "orchestrator.drain": "OAP",
    "access_log.read": "OAU",
    "artifact.read": "OAU",
    "cache.read": "OAPU",
    "cache.manage": "OAP",
    "support_bundle.create": "OA",
}
_LETTER: dict[str, Role] = {"O": "owner", "A": "admin", "P": "operator", "U": "auditor"}

PERMISSIONS: frozenset[str] = frozenset(_TABLE)
ROLE_PERMISSIONS: dict[Role, frozenset[str]] = {
    role: frozenset(perm for perm, letters in _TABLE.items() if any(_LETTER[c] == role for c in letters))
    for role in ROLES
}


def role_allows(role: str, permission: str) -> bool:
    """Whether `role` holds `permission` (unknown roles hold nothing)."""
    return any(permission in perms for name, perms in ROLE_PERMISSIONS.items() if name == role)
