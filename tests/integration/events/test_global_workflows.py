"""Global workflows (docs/design/global_workflows.md): policy sources, registration refusals, evaluation per
delivery with its timeouts, runs on the triggering commit and the required status, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from conveyor.db.tables import jobs, status_reports
from conveyor.events.startup import EVENT_PRODUCERS
from conveyor.execution.lifecycle import finish_job
from tests.integration.events.conftest import CI_WORKFLOW, FAST, Events, rewrite
from tests.support.inprocess import in_process_server
from tests.support.repos import git, make_repo
from tests.support.waiting import async_wait_until

LICENCE_SCAN = """
from conveyor import push, workflow

scan = workflow("licence-scan", on=[push()], global_repos=["local:app*"], required={required})

@scan.job(runs_on=["linux"])
def licences(ctx):
    ctx.sh(["echo", "scanning"])
"""

SLOW_SCAN = """
from conveyor import push, workflow

slow = workflow("audit-scan", on=[push()], global_repos=["local:*"])

@slow.job(runs_on=["linux"])
def scan(ctx):
    ctx.sh(["echo", "slow"])
"""

POLICY = "local:policy"


def policy_repo(tmp_path: Path, *, required: bool = True, slow: bool = False) -> Path:
    workflows = {"licence": LICENCE_SCAN.replace("{required}", str(required))}
    if slow:
        workflows["slow"] = SLOW_SCAN
    return make_repo(tmp_path / "policy", workflows)


async def set_policy(events: Events, value: Any) -> dict[str, Any]:
    answer = await events.api("PATCH", "/org-settings/default", json={"global_sources": value})
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


async def set_knobs(events: Events, **values: int) -> None:
    answer = await events.api("PATCH", "/cluster-settings", json=values)
    assert answer.status_code == 200, answer.text


async def delivery(events: Events, delivery_id: str) -> dict[str, Any]:
    answer = await events.api("GET", f"/deliveries/{delivery_id}")
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


async def runs_of(events: Events, delivery_id: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for run_id in (await delivery(events, delivery_id))["runs"]:
        run = (await events.api("GET", f"/runs/{run_id}")).json()
        found[run["workflow"]] = run
    return found


async def with_sources(events: Events, tmp_path: Path, policy: Path) -> dict[str, str]:
    """The policy source, `app` (covered by `local:app*`) and `other` (not covered)."""
    app = make_repo(tmp_path / "app", {"ci": CI_WORKFLOW})
    other = make_repo(tmp_path / "other", {"ci": CI_WORKFLOW})
    ids = {}
    for name, path in (("policy", policy), ("app", app), ("other", other)):
        body = await events.add_source(name, path)
        ids[name] = body["id"]
        if name == "app":
            answer = await events.api("PATCH", f"/sources/{body['id']}", json={"report": "statuses"})
            assert answer.status_code == 200, answer.text
    return ids


async def test_global_sources_is_an_org_setting_a_list_of_routing_keys(events_server: Events) -> None:
    body = await set_policy(events_server, "local:policy, github:acme/platform,local:policy")
    assert body["settings"]["global_sources"] == ["local:policy", "github:acme/platform"]
    assert body["changed"] == ["global_sources"]
    assert (await set_policy(events_server, ["local:policy", "github:acme/platform"]))["changed"] == []
    shown = (await events_server.api("GET", "/org-settings/default")).json()
    assert shown["effective"]["global_sources"] == ["local:policy", "github:acme/platform"]
    refused = await events_server.api("PATCH", "/org-settings/default", json={"global_sources": "policy"})
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_value", refused.text
    cleared = await set_policy(events_server, None)
    assert (cleared["settings"]["global_sources"], cleared["effective"]["global_sources"]) == (None, [])


async def test_a_global_workflow_registers_only_from_a_policy_sources_default_branch(
    events_server: Events, tmp_path: Path
) -> None:
    policy = policy_repo(tmp_path)
    source = await events_server.add_source("policy", policy)
    await events_server.push(source["id"], policy)
    assert "licence-scan" not in {r["workflow_name"] for r in await events_server.registrations()}

    await set_policy(events_server, POLICY)
    await events_server.push(source["id"], policy)
    registered = {r["workflow_name"]: r for r in await events_server.registrations()}
    assert registered["licence-scan"]["is_global"] is True

    # Another branch of the policy source registers nothing and says why.
    git(policy, "checkout", "-q", "-b", "feature")
    rewrite(policy, {"licence": LICENCE_SCAN.replace("{required}", "False")}, "feature change")
    delivery_id = await events_server.push(source["id"], policy, ref="refs/heads/feature")
    skipped = (await delivery(events_server, delivery_id))["decisions"]["skipped_global"]
    assert skipped == [
        {
            "workflow": "licence-scan",
            "source": POLICY,
            "reason": "registered only from the default branch main; this push is to feature",
        }
    ]

    # A manual registration of a global workflow is refused with its reason.
    lock = (policy / ".conveyor" / "conveyor.lock.json").read_text()
    answer = await events_server.api(
        "POST",
        "/registrations/manual",
        json={"routing_key": POLICY, "repo": "policy", "lock": json.loads(lock)},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["skipped_global"] == [
        {
            "workflow": "licence-scan",
            "reason": "a global workflow registers only from the policy source's default branch "
            "(a push or a refresh), not a manual registration",
        }
    ]

    # Out of the policy: the next default-branch push refuses it and prunes the row.
    await set_policy(events_server, None)
    git(policy, "checkout", "-q", "main")
    await events_server.push(source["id"], policy)
    assert "licence-scan" not in {r["workflow_name"] for r in await events_server.registrations()}


async def test_a_push_runs_the_global_workflow_on_covered_repositories_and_a_required_failure_fails_the_commit(
    events_server: Events, tmp_path: Path
) -> None:
    ids = await with_sources(events_server, tmp_path, policy_repo(tmp_path))
    await set_policy(events_server, POLICY)
    await events_server.push(ids["policy"], tmp_path / "policy")

    app_delivery = await events_server.push(ids["app"], tmp_path / "app")
    runs = await runs_of(events_server, app_delivery)
    assert set(runs) == {"ci", "local:policy/licence-scan"}
    scan = runs["local:policy/licence-scan"]
    sha = git(tmp_path / "app", "rev-parse", "HEAD")
    assert (scan["repo"], scan["sha"], scan["routing_key"]) == ("app", sha, "local:app")
    decisions = (await delivery(events_server, app_delivery))["decisions"]
    assert [w["workflow"] for w in decisions["workflows"]] == ["ci"]
    assert [(g["workflow"], g["source"], g["matched"]) for g in decisions["global"]] == [
        ("licence-scan", POLICY, True)
    ]
    assert decisions["skipped_global"] == []

    other_delivery = await events_server.push(ids["other"], tmp_path / "other")
    assert set(await runs_of(events_server, other_delivery)) == {"ci"}
    (candidate,) = (await delivery(events_server, other_delivery))["decisions"]["global"]
    assert candidate["matched"] is False and candidate["global_repos"]["ok"] is False

    # Required: the commit's status follows the global run, and its failure fails it.
    db = events_server.server.state.db

    async def states() -> dict[str, str]:
        async with db.read() as conn:
            rows = await conn.execute(
                select(status_reports.c.context, status_reports.c.state).where(status_reports.c.sha == sha)
            )
            return {row.context: row.state for row in rows}

    assert (await states())["conveyor/local:policy/licence-scan"] == "pending"
    async with db.transaction() as conn:
        (job_id,) = (await conn.execute(select(jobs.c.id).where(jobs.c.run_id == scan["id"]))).scalars()
        await finish_job(conn, job_id, "failed", reason="licence found: GPL-3.0")
    assert (await states())["conveyor/local:policy/licence-scan"] == "failure"


async def test_a_global_workflow_that_is_not_required_reports_nothing_on_the_commit(
    events_server: Events, tmp_path: Path
) -> None:
    ids = await with_sources(events_server, tmp_path, policy_repo(tmp_path, required=False))
    await set_policy(events_server, POLICY)
    await events_server.push(ids["policy"], tmp_path / "policy")
    app_delivery = await events_server.push(ids["app"], tmp_path / "app")
    scan = (await runs_of(events_server, app_delivery))["local:policy/licence-scan"]
    db = events_server.server.state.db
    async with db.transaction() as conn:
        (job_id,) = (await conn.execute(select(jobs.c.id).where(jobs.c.run_id == scan["id"]))).scalars()
        await finish_job(conn, job_id, "failed", reason="advisory")
    async with db.read() as conn:
        contexts = set(
            (
                await conn.execute(
                    select(status_reports.c.context).where(status_reports.c.run_id == scan["id"])
                )
            )
            .scalars()
            .all()
        )
    assert contexts == set()


@pytest.fixture
async def hung_server(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[Events]:
    """A server whose `audit-scan` candidates never finish evaluating (and, with the `hang_load` marker's
    value, whose registration index never loads for the evaluation)."""
    env = {**FAST, "CONVEYOR_TEST_MODE": "1", "CONVEYOR_TEST_GLOBAL_EVAL_HANG": "audit-scan"}
    if getattr(request, "param", None) == "load":
        env["CONVEYOR_TEST_GLOBAL_EVAL_HANG_LOAD"] = "1"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    async with in_process_server(database_url, tmp_path / "home", env=env) as server:
        yield Events(server, tmp_path / "app")


async def _slow_setup(events: Events, tmp_path: Path) -> dict[str, str]:
    ids = await with_sources(events, tmp_path, policy_repo(tmp_path, slow=True))
    await set_policy(events, POLICY)
    await events.push(ids["policy"], tmp_path / "policy")
    return ids


async def test_global_eval_candidate_timeout_ms_skips_a_slow_candidate_and_the_round_goes_on(
    hung_server: Events, tmp_path: Path
) -> None:
    ids = await _slow_setup(hung_server, tmp_path)
    await set_knobs(hung_server, global_eval_candidate_timeout_ms=150, global_eval_round_timeout_ms=60_000)
    app_delivery = await hung_server.push(ids["app"], tmp_path / "app")
    decisions = (await delivery(hung_server, app_delivery))["decisions"]
    assert decisions["skipped_global"] == [
        {
            "workflow": "audit-scan",
            "source": POLICY,
            "reason": "evaluation exceeded global_eval_candidate_timeout_ms (150 ms)",
        }
    ]
    # The candidate after the slow one (id order) was still evaluated, and the repository's own run is there.
    assert set(await runs_of(hung_server, app_delivery)) == {"ci", "local:policy/licence-scan"}


async def test_global_eval_round_timeout_ms_bounds_the_round_and_the_repositorys_runs_do_not_wait(
    hung_server: Events, tmp_path: Path
) -> None:
    ids = await _slow_setup(hung_server, tmp_path)
    await set_knobs(hung_server, global_eval_candidate_timeout_ms=60_000, global_eval_round_timeout_ms=200)
    app_delivery = await hung_server.push(ids["app"], tmp_path / "app")
    decisions = (await delivery(hung_server, app_delivery))["decisions"]
    # In id order: audit-scan hung until the round's end; licence-scan came too late for it.
    reason = "evaluation exceeded global_eval_round_timeout_ms (200 ms)"
    assert decisions["skipped_global"] == [
        {"workflow": "audit-scan", "source": POLICY, "reason": reason},
        {"workflow": "licence-scan", "source": POLICY, "reason": reason},
    ]
    assert set(await runs_of(hung_server, app_delivery)) == {"ci"}


async def test_the_repositorys_own_runs_exist_before_a_global_round_ends(
    hung_server: Events, tmp_path: Path
) -> None:
    """While the round hangs (until its timeout), A's own run is already committed."""
    ids = await _slow_setup(hung_server, tmp_path)
    await set_knobs(hung_server, global_eval_candidate_timeout_ms=60_000, global_eval_round_timeout_ms=8_000)
    sha = git(tmp_path / "app", "rev-parse", "HEAD")
    answer = await hung_server.api(
        "POST", f"/sources/{ids['app']}/trigger", json={"ref": "refs/heads/main", "sha": sha}
    )
    assert answer.status_code == 202, answer.text
    delivery_id = answer.json()["delivery"]

    async def own_run() -> bool:
        body = await delivery(hung_server, delivery_id)
        return body["status"] == "received" and len(body["runs"]) == 1

    await async_wait_until(own_run, timeout=30, what="A's own run while the global round hangs")
    assert set(await runs_of(hung_server, delivery_id)) == {"ci"}

    async def processed() -> bool:
        return (await delivery(hung_server, delivery_id))["status"] == "processed"

    await async_wait_until(processed, timeout=30, what="the round's end at its timeout")
    skipped = (await delivery(hung_server, delivery_id))["decisions"]["skipped_global"]
    assert [entry["workflow"] for entry in skipped] == ["audit-scan", "licence-scan"]


async def test_global_eval_cache_max_bounds_the_compiled_candidates_kept(
    events_server: Events, tmp_path: Path
) -> None:
    policy = make_repo(
        tmp_path / "policy",
        {"licence": LICENCE_SCAN.replace("{required}", "False"), "slow": SLOW_SCAN},
    )
    ids = await with_sources(events_server, tmp_path, policy)
    await set_policy(events_server, POLICY)
    await events_server.push(ids["policy"], policy)
    producers = events_server.server.state.parts.get(EVENT_PRODUCERS)
    assert producers is not None and producers.global_evaluator is not None
    cache = producers.global_evaluator.cache

    await set_knobs(events_server, global_eval_cache_max=1)
    before = cache.compiles
    for _ in range(2):
        await events_server.push(ids["app"], tmp_path / "app")
    assert (cache.compiles - before, len(cache)) == (4, 1)  # two candidates, one kept: every lookup compiles

    await set_knobs(events_server, global_eval_cache_max=10)
    before = cache.compiles
    for _ in range(2):
        await events_server.push(ids["app"], tmp_path / "app")
    assert (cache.compiles - before, len(cache)) == (1, 2)  # the one evicted compiles once, then both stay


@pytest.mark.parametrize("hung_server", ["load"], indirect=True)
async def test_global_eval_wait_timeout_ms_bounds_the_wait_for_global_registrations(
    hung_server: Events, tmp_path: Path
) -> None:
    await set_knobs(hung_server, global_eval_wait_timeout_ms=120)
    ids = await with_sources(hung_server, tmp_path, policy_repo(tmp_path))
    await set_policy(hung_server, POLICY)
    await hung_server.push(ids["policy"], tmp_path / "policy")
    app_delivery = await hung_server.push(ids["app"], tmp_path / "app")
    body = await delivery(hung_server, app_delivery)
    assert body["status"] == "processed"
    assert body["decisions"]["skipped_global"] == [
        {
            "workflow": "*",
            "source": "*",
            "reason": "global registrations not loaded within global_eval_wait_timeout_ms (120 ms)",
        }
    ]
    assert set(await runs_of(hung_server, app_delivery)) == {"ci"}
