"""The gates of a summon (docs/design/execution.md §8.6), as pure decisions."""

from __future__ import annotations

from dataclasses import replace

from conveyor.events.summon import Summoner, summon_refusal
from conveyor.events.trust import Grant, summon_allowed
from conveyor.ingest.providers.base import SourceRow

SUMMONER = Summoner(
    job_id="job-1",
    job_status="running",
    run_id="run-1",
    org_id="default",
    routing_key="local:app",
    repo="app",
    branch="main",
    sha="a" * 40,
    source_id="src-app",
    chain_depth=0,
    is_fork=False,
    triggered_by=None,
)


def source(name: str, org_id: str = "default") -> SourceRow:
    return SourceRow(
        id=f"src-{name}",
        org_id=org_id,
        name=name,
        kind="local",
        routing_key=f"local:{name}",
        repo=f"/repos/{name}",
        api_url=None,
        clone_url=None,
        default_branch="main",
        verify="none",
        signature_header=None,
        event_header=None,
        report="none",
        enabled=True,
    )


def grant(*names: str, target_repo: str = "*") -> Grant:
    return Grant("g1", "default", "local:app", "*", "local:other", target_repo, names)


def test_the_same_routing_key_may_summon_without_a_grant() -> None:
    assert summon_allowed(
        org_id="default",
        summoner_routing_key="local:app",
        summoner_repo="app",
        target_routing_key="local:app",
        target_repo="app",
        workflow="deploy",
        grants=(),
    )


def test_a_grant_of_every_event_name_does_not_allow_a_summon_but_one_naming_summons_does() -> None:
    def allowed(*grants: Grant, workflow: str = "deploy") -> bool:
        return summon_allowed(
            org_id="default",
            summoner_routing_key="local:app",
            summoner_repo="app",
            target_routing_key="local:other",
            target_repo="other",
            workflow=workflow,
            grants=grants,
        )

    assert not allowed()
    assert not allowed(grant("*"))
    assert not allowed(grant("deploy"))
    assert allowed(grant("summon:deploy"))
    assert allowed(grant("summon:*"))
    assert not allowed(grant("summon:deploy"), workflow="destroy")
    assert not allowed(grant("summon:deploy", target_repo="else"))


def test_the_gates_refuse_in_order_with_the_api_code() -> None:
    other = source("other")

    def code(summoner: Summoner = SUMMONER, target: SourceRow | None = other, *grants: Grant) -> str | None:
        refusal = summon_refusal(summoner, target, "local:other", "deploy", grants, 10)
        return None if refusal is None else refusal.code

    assert code(replace(SUMMONER, job_status="cancelling")) == "job_not_running"
    assert code(replace(SUMMONER, is_fork=True)) == "forbidden"
    assert code(SUMMONER, None) == "unknown_repo"
    assert code(SUMMONER, source("other", org_id="acme")) == "unknown_repo"
    assert code(SUMMONER, other) == "untrusted"
    assert code(SUMMONER, other, grant("summon:deploy")) is None
    assert code(replace(SUMMONER, chain_depth=9), other, grant("summon:deploy")) == "chain_depth_exceeded"
    assert code(replace(SUMMONER, chain_depth=8), other, grant("summon:deploy")) is None


def test_the_chain_depth_refusal_names_the_depth_and_the_limit() -> None:
    refusal = summon_refusal(replace(SUMMONER, chain_depth=2), source("app"), None, "deploy", (), 3)
    assert refusal is not None and refusal.status == 409
    assert refusal.detail == "chain depth 3 reaches the limit of 3 (CONVEYOR_EVENTS_MAX_CHAIN_DEPTH)"


def test_a_job_whose_start_is_not_applied_yet_may_summon_but_a_cancelling_or_ended_one_may_not() -> None:
    """A step can summon before the orchestrator has applied its agent's `job.started` (the job is still
    `dispatched`): that summon is the running job's, not a refusal."""

    def code(status: str) -> str | None:
        refusal = summon_refusal(replace(SUMMONER, job_status=status), source("app"), None, "deploy", (), 10)
        return None if refusal is None else refusal.code

    for status in ("dispatched", "running", "recovering"):
        assert code(status) is None, status
    for status in ("cancelling", "success", "failed", "cancelled", "timed_out", "queued", "pending"):
        assert code(status) == "job_not_running", status
