"""The trust model (docs/design/events.md §3.2): may event E trigger registration R? Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from conveyor.events.models import FAILED_BATCH, GENERIC_WEBHOOK, SCHEDULE_FIRE


@dataclass(frozen=True)
class Grant:
    """An enabled `event_trust` row."""

    id: str
    org_id: str
    source_routing_key: str
    source_repo: str
    target_routing_key: str
    target_repo: str
    event_names: tuple[str, ...]


@dataclass(frozen=True)
class TrustFacts:
    """What trust looks at on an event."""

    name: str
    origin: str
    source_routing_key: str | None
    source_repo: str | None


def _grant_allows(event: TrustFacts, org_id: str, routing_key: str, repo: str, grant: Grant) -> bool:
    if grant.org_id != org_id or grant.source_routing_key != event.source_routing_key:
        return False
    if grant.target_routing_key != routing_key:
        return False
    source_ok = (
        fnmatchcase(event.source_repo, grant.source_repo) if event.source_repo else grant.source_repo == "*"
    )
    return (
        source_ok
        and fnmatchcase(repo, grant.target_repo)
        and any(fnmatchcase(event.name, pattern) for pattern in grant.event_names)
    )


def trust_allows(
    event: TrustFacts, *, org_id: str, routing_key: str, repo: str, grants: Iterable[Grant]
) -> bool:
    """Rules 0–3; anything else (a non-exempt event without a source routing key included) is blocked."""
    if event.origin == "admin" and event.source_routing_key is None and event.source_repo is None:
        return True  # 0: an operator's org-wide event
    if event.name in (SCHEDULE_FIRE, FAILED_BATCH) or event.name.startswith("conveyor.scaler."):
        return True  # 1: targeted at this registration / named by the operator
    if event.name == GENERIC_WEBHOOK:
        return True  # 1': a `generic_webhook` trigger names its source, which is the subscriber's consent
    if event.source_routing_key is None:
        return False
    if event.source_routing_key == routing_key:
        return True  # 2: the same administrative domain
    return any(_grant_allows(event, org_id, routing_key, repo, grant) for grant in grants)  # 3


# A grant names summons explicitly (docs/design/execution.md §8.6): `summon:<workflow glob>`.
SUMMON_PREFIX = "summon:"


def summon_allowed(
    *,
    org_id: str,
    summoner_routing_key: str | None,
    summoner_repo: str | None,
    target_routing_key: str,
    target_repo: str,
    workflow: str,
    grants: Iterable[Grant],
) -> bool:
    """May a step of `summoner_routing_key` start `workflow` of the target? The same routing key, or a grant of
    the event trust rules' shape whose `event_names` holds a `summon:` pattern matching `summon:<workflow>`
    (a `*` grant lets events through, never summons)."""
    if summoner_routing_key is None:
        return False
    if summoner_routing_key == target_routing_key:
        return True
    facts = TrustFacts(f"{SUMMON_PREFIX}{workflow}", "custom", summoner_routing_key, summoner_repo)
    for grant in grants:
        summons = tuple(p for p in grant.event_names if p.startswith(SUMMON_PREFIX))
        if summons and _grant_allows(
            facts, org_id, target_routing_key, target_repo, _narrowed(grant, summons)
        ):
            return True
    return False


def _narrowed(grant: Grant, event_names: tuple[str, ...]) -> Grant:
    return Grant(
        grant.id,
        grant.org_id,
        grant.source_routing_key,
        grant.source_repo,
        grant.target_routing_key,
        grant.target_repo,
        event_names,
    )
