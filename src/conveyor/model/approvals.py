"""Protection rules of environments and the decisions they make (docs/design/approvals.md §1–§3): pure.

`execution` asks whether a job may wait for approval at all (its ref) and whether a caller may decide
it; `secrets` validates a rule before storing it. Nothing here reads the database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from wcmatch import glob

from conveyor.model.permissions import ROLES, role_allows

# As the environments' branch globs (docs/design/admin.md §6.1): `*` within a segment, `**` across.
REF_GLOB_FLAGS = glob.GLOBSTAR | glob.BRACE | glob.DOTMATCH | glob.CASE | glob.FORCEUNIX

MAX_APPROVERS = 20
MAX_APPROVER_LENGTH = 100
MAX_REFS = 20
MAX_REF_LENGTH = 255
MAX_WAIT_TIMER_MS = 30 * 24 * 3600 * 1000
WAITING = "waiting_approval"
BLOCKED_ON = "approval"

Decision = Literal["approved", "rejected"]


@dataclass(frozen=True)
class Protection:
    """An environment's protection rule; `approvers` are role names, token ids or token labels."""

    approvers: tuple[str, ...]
    refs: tuple[str, ...] = ()
    wait_timer_ms: int = 0
    prevent_self_approval: bool = False

    def as_document(self) -> dict[str, Any]:
        """The JSON stored in `environments.protection`."""
        return {
            "approvers": list(self.approvers),
            "refs": list(self.refs),
            "wait_timer_ms": self.wait_timer_ms,
            "prevent_self_approval": self.prevent_self_approval,
        }


@dataclass(frozen=True)
class Approver:
    """Who asks to decide: their token's id, label and role."""

    token_id: str
    label: str | None
    role: str


@dataclass(frozen=True)
class Refusal:
    """Why a caller may not decide a job: `code` is the 403 error code, `detail` the sentence."""

    code: str
    detail: str


def protection_problems(approvers: Sequence[str], refs: Sequence[str], wait_timer_ms: int) -> list[str]:
    """Each thing wrong with a rule, as `field: why` (empty = valid)."""
    problems: list[str] = []
    if not approvers:
        problems.append("approvers: name at least one role or token")
    if len(approvers) > MAX_APPROVERS:
        problems.append(f"approvers: at most {MAX_APPROVERS}")
    for entry in approvers:
        if not entry.strip() or len(entry) > MAX_APPROVER_LENGTH:
            problems.append(f"approvers: {entry[:40]!r} must be 1–{MAX_APPROVER_LENGTH} characters")
        elif entry in ROLES and not role_allows(entry, "run.approve"):
            problems.append(f"approvers: role {entry} does not hold run.approve, so it could never approve")
    if len(refs) > MAX_REFS:
        problems.append(f"refs: at most {MAX_REFS}")
    for ref in refs:
        if not ref.strip() or len(ref) > MAX_REF_LENGTH:
            problems.append(f"refs: {ref[:40]!r} must be 1–{MAX_REF_LENGTH} characters")
    if not 0 <= wait_timer_ms <= MAX_WAIT_TIMER_MS:
        problems.append("wait_timer_ms: must be between 0 and 30 days")
    return problems


def protection_of(document: Mapping[str, Any] | None) -> Protection | None:
    """The rule stored in `environments.protection` (None = unprotected)."""
    if not document:
        return None
    return Protection(
        approvers=tuple(str(a) for a in document.get("approvers") or ()),
        refs=tuple(str(r) for r in document.get("refs") or ()),
        wait_timer_ms=int(document.get("wait_timer_ms") or 0),
        prevent_self_approval=bool(document.get("prevent_self_approval")),
    )


def _short_ref(ref: str) -> str:
    for prefix in ("refs/heads/", "refs/tags/"):
        if ref.startswith(prefix):
            return ref[len(prefix) :]
    return ref


def ref_allowed(ref: str | None, refs: Sequence[str]) -> bool:
    """Whether a run's ref may deploy: a glob matches the full ref or its branch or tag name; no globs
    allow every ref (and a run without one)."""
    if not refs:
        return True
    if not ref:
        return False
    names = {ref, _short_ref(ref)}
    return any(glob.globmatch(name, pattern, flags=REF_GLOB_FLAGS) for pattern in refs for name in names)


def ref_refusal(environment: str, ref: str | None, protection: Protection) -> str | None:
    """The failure reason of a job whose run's ref may not deploy to the environment, else None."""
    if ref_allowed(ref, protection.refs):
        return None
    shown = ref or "(no ref)"
    return (
        f"environment_ref_not_allowed: ref {shown} may not deploy to {environment}; "
        f"its refs are {', '.join(protection.refs)}"
    )


def waiting_reason(environment: str, protection: Protection) -> str:
    """The reason a waiting job shows: who may release it."""
    return f"waiting: approval for environment {environment} (approvers: {', '.join(protection.approvers)})"


def is_listed(approver: Approver, protection: Protection) -> bool:
    """Whether the rule names the caller: its role, its token id or its label (an empty rule names
    everyone)."""
    if not protection.approvers:
        return True
    names = {approver.role, approver.token_id}
    if approver.label:
        names.add(approver.label)
    return any(entry in names for entry in protection.approvers)


def decision_refusal(
    approver: Approver, environment: str, protection: Protection | None, triggered_by: str | None
) -> Refusal | None:
    """None when the caller may approve or reject the job; else why not.

    The caller already holds `run.approve` (the route's permission). A job whose environment lost its
    rule since it started waiting is decided by anyone holding the permission.
    """
    if protection is None:
        return None
    if protection.prevent_self_approval and triggered_by is not None and triggered_by == approver.token_id:
        return Refusal(
            "self_approval",
            f"environment {environment} does not let the token that triggered the run decide its jobs",
        )
    if not is_listed(approver, protection):
        return Refusal(
            "not_an_approver",
            f"environment {environment} is approved by {', '.join(protection.approvers)}; "
            f"this token ({approver.label or approver.token_id}, role {approver.role}) is not one of them",
        )
    return None


def rejection_reason(approver: Approver, comment: str | None) -> str:
    """A rejected job's failure reason."""
    who = approver.label or approver.token_id
    return f"rejected: {who}: {comment}" if comment else f"rejected: {who}"


def held_retention_reason(days: int) -> str:
    """Why the sweep cancelled a job that waited too long."""
    return f"held_retention: waited more than {days} days for approval"


ForkPolicy = Literal["hold", "run-without-secrets", "refuse"]
FORK_POLICIES: tuple[str, ...] = ("hold", "run-without-secrets", "refuse")
FORK_HOLD = "fork pull request"


def fork_verdict(is_fork: bool, policy: str) -> Literal["run", "hold", "refuse"]:
    """What a delivery's event gets under its source's `fork_pull_requests` (docs/design/approvals.md §6):
    anything but a fork runs; an unknown policy holds, the safe side."""
    if not is_fork or policy == "run-without-secrets":
        return "run"
    return "refuse" if policy == "refuse" else "hold"


def fork_refusal(policy: str) -> str:
    """Why a refused fork's delivery started no run."""
    return f"pull request from a fork: the source refuses them (fork_pull_requests={policy})"
