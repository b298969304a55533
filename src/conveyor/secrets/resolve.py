"""What a job may see: its secrets and its variables (pure; the store loads, this decides).

A job sees the org's secrets and, when it names an environment, that environment's secrets; the
environment wins on a name clash (docs/design/authoring.md §2.5). `source:<id>` secrets (webhook secrets,
clone tokens) are never given to jobs. Variables follow the same rule: org variables, then the
environment's variables over them; the job's own `env` is applied later by the runner.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from conveyor.secrets.scopes import ORG_SCOPE, environment_scope


@dataclass(frozen=True)
class ScopedValue:
    """One decrypted secret (or variable) and the scope it came from."""

    scope: str
    name: str
    value: str


def scopes_visible_to_job(environment: str | None) -> tuple[str, ...]:
    """The scopes a job's secrets come from, lowest precedence first."""
    return (ORG_SCOPE,) if environment is None else (ORG_SCOPE, environment_scope(environment))


def secrets_for_job(values: Iterable[ScopedValue], environment: str | None) -> dict[str, str]:
    """Merge org and environment secrets; the environment's value wins; other scopes are ignored."""
    order = scopes_visible_to_job(environment)
    rank = {scope: index for index, scope in enumerate(order)}
    chosen: dict[str, tuple[int, str]] = {}
    for item in values:
        if item.scope not in rank:
            continue
        current = chosen.get(item.name)
        if current is None or rank[item.scope] >= current[0]:
            chosen[item.name] = (rank[item.scope], item.value)
    return {name: value for name, (_, value) in sorted(chosen.items())}


def variables_for_job(
    org_variables: Mapping[str, str], environment_variables: Mapping[str, str] | None
) -> dict[str, str]:
    """Org variables overlaid by the environment's variables (the environment wins)."""
    merged = dict(org_variables)
    merged.update(environment_variables or {})
    return merged
