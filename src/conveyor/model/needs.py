"""What `ctx.needs[job]` says about an upstream job, from its rows (pure; the dispatcher and `run local`).

One function for both, so a workflow sees the same `status`, `outputs` and `by_matrix` on an agent as
under `conveyor run local` (docs/authoring.md, "Outputs and needs").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from conveyor.model.states import aggregate_status

StepOutputs = Mapping[str, Mapping[str, Any]]


class NeedMember(NamedTuple):
    """One job row of the upstream: a matrix combination (`matrix_key` set) or the job itself."""

    matrix_key: str
    status: str
    outputs: StepOutputs | None


def need_result(members: Sequence[NeedMember]) -> dict[str, Any] | None:
    """`{status, outputs, by_matrix}` of an upstream job whose rows are `members`, in matrix order.

    `outputs` is `{step: {key: value}}`. For a matrix upstream it merges every combination's outputs
    in matrix order, key by key, so a key several combinations set holds the last combination's value
    (deterministic, unlike a CI whose last *finished* combination wins); `by_matrix` maps each matrix key
    to that combination's own status and outputs. None while a member is unfinished.
    """
    status = aggregate_status(member.status for member in members)
    if status is None:
        return None
    merged: dict[str, dict[str, Any]] = {}
    by_matrix: dict[str, dict[str, Any]] = {}
    for member in members:
        for step, values in (member.outputs or {}).items():
            merged.setdefault(step, {}).update(values)
        if member.matrix_key:
            by_matrix[member.matrix_key] = {
                "status": member.status,
                "outputs": {step: dict(values) for step, values in (member.outputs or {}).items()},
            }
    return {"status": status, "outputs": merged, "by_matrix": by_matrix}
