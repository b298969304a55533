"""Every accepted setting takes effect: one behaviour test per knob, on SQLite and PostgreSQL.

`KNOB_TESTS` names, for every knob of `conveyor.model.knobs`, the test that shows it changes
behaviour; `tests/unit/repository/test_knob_coverage.py` fails for a knob without one, except those in the
explicit `AWAITING_CLUSTER_ISSUES` allowlist. The tests of the knobs issue 16 wired live below.
"""

from __future__ import annotations

import asyncio
import gzip
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, insert, select, update

from conveyor.db.engine import Database
from conveyor.db.tables import (
    DEFAULT_ORG,
    access_log,
    deliveries,
    dispatch_history,
    dispatch_queue,
    job_logs,
    job_needs,
    jobs,
    run_timeline,
    runs,
    status_reports,
    steps,
)
from conveyor.execution.lifecycle import finish_job
from conveyor.ingest.providers.base import SourceRow
from conveyor.ingest.providers.local import LocalProvider
from conveyor.ingest.service import INGEST
from conveyor.matching import Event
from conveyor.model.ids import new_id, utc_now
from conveyor.runtime import runtime_services
from conveyor.runtime.lease import LeaderContext, LeaseLost
from conveyor.server.retention import RETENTION, RetentionSweep
from tests.fakes.github import FakeGitHub, push_payload
from tests.support.github_ingest import add_github_source, delivery_status, post, processed
from tests.support.inprocess import InProcessServer
from tests.support.repos import git, make_repo
from tests.support.waiting import async_wait_until


async def now_true(value: bool) -> bool:
    return value


HERE = "tests/integration/knobs/test_knobs.py"
REROUTE = "tests/integration/cluster/test_reroute_service.py"
CACHES = "tests/integration/knobs/test_ingest_caches.py"
CONTENT_CACHE_TEST = (
    "test_the_content_cache_is_bounded_by_entries_bytes_and_ttl_and_a_miss_reads_the_commit_again"
)
LOCKFILE_CACHE_TEST = (
    "test_the_lockfile_cache_is_bounded_by_entries_bytes_and_ttl_and_a_miss_parses_the_lock_again"
)
GLOBAL = "tests/integration/events/test_global_workflows.py"

# knob → the test (path::name) that shows it takes effect. Each test sets the knob (through the
# settings API, the env default or the value the knob feeds) and asserts the behaviour it changes.
KNOB_TESTS: dict[str, str] = {
    # artifacts
    "artifact_max_bytes": "tests/integration/artifacts/test_limits_and_retention.py::"
    "test_artifact_max_bytes_refuses_a_larger_upload_declared_or_streamed",
    "artifact_run_max_bytes": "tests/integration/artifacts/test_limits_and_retention.py::"
    "test_artifact_run_max_bytes_refuses_the_commit_that_would_pass_it",
    "artifact_retention_days": "tests/integration/artifacts/test_limits_and_retention.py::"
    "test_artifact_retention_days_expires_an_artifact_and_the_sweep_deletes_its_blob_only",
    "provenance_retention_days": "tests/integration/artifacts/test_provenance.py::"
    "test_provenance_retention_days_sweeps_old_statements_and_they_are_not_minted_again",
    # caches
    "cache_max_entry_bytes": "tests/integration/artifacts/test_caches.py::"
    "test_cache_max_entry_bytes_refuses_a_larger_entry_and_leaves_artifacts_alone",
    "cache_max_total_bytes": "tests/integration/artifacts/test_caches.py::"
    "test_cache_max_total_bytes_evicts_the_least_recently_used_entries",
    "cache_ttl_days": "tests/integration/artifacts/test_caches.py::"
    "test_cache_ttl_days_expires_entries_unused_that_long_and_the_sweep_deletes_their_blobs",
    # ingest
    "max_webhook_payload_bytes": "tests/integration/ingest/test_github_ingest.py::"
    "test_redelivery_and_refused_deliveries_change_nothing",
    "lock_file_max_bytes": f"{HERE}::test_a_lock_over_lock_file_max_bytes_fails_the_deliverys_run_visibly",
    "webhook_dedup_ttl_ms": f"{HERE}::test_finished_deliveries_are_pruned_after_the_dedup_ttl_which_ends_dedup",
    "ingest_max_concurrency": f"{HERE}::test_ingest_max_concurrency_bounds_an_orgs_deliveries_in_progress_and_drops_none",
    "event_log_max_payload_bytes": "tests/integration/knobs/test_event_log_payload.py::"
    "test_an_ended_deliverys_body_is_cut_to_event_log_max_payload_bytes_after_processing_the_whole",
    "content_cache_max": f"{CACHES}::{CONTENT_CACHE_TEST}",
    "content_cache_max_bytes": f"{CACHES}::{CONTENT_CACHE_TEST}",
    "content_cache_ttl_ms": f"{CACHES}::{CONTENT_CACHE_TEST}",
    "lockfile_cache_max": f"{CACHES}::{LOCKFILE_CACHE_TEST}",
    "lockfile_cache_max_bytes": f"{CACHES}::{LOCKFILE_CACHE_TEST}",
    "lockfile_cache_ttl_ms": f"{CACHES}::{LOCKFILE_CACHE_TEST}",
    # dispatch
    "queue_max_depth": f"{HERE}::test_a_job_enqueued_into_a_full_queue_fails_queue_full_visibly_and_counted",
    "unroutable_grace_ms": "tests/integration/execution/test_dispatch.py::"
    "test_unservable_labels_are_shown_then_fail_unroutable",
    "max_fanout_hosts": "tests/e2e/test_fanout.py::"
    "test_four_matching_agents_over_max_fanout_hosts_of_three_fail_the_job_at_queue_with_the_reason",
    "concurrency_wait_timeout_ms": "tests/integration/execution/test_sweeps.py::"
    "test_waiting_for_a_group_past_the_wait_timeout_fails_the_run_or_times_out_the_job",
    "dispatch_ack_timeout_ms": "tests/integration/execution/test_dispatch.py::"
    "test_an_agent_that_never_acks_loses_the_job_until_attempts_run_out",
    "queue_timeout_ms": "tests/integration/execution/test_sweeps.py::"
    "test_a_queued_job_past_its_queue_timeout_times_out",
    # global workflows (docs/design/global_workflows.md §4, §6)
    "global_eval_round_timeout_ms": f"{GLOBAL}::"
    "test_global_eval_round_timeout_ms_bounds_the_round_and_the_repositorys_runs_do_not_wait",
    "global_eval_candidate_timeout_ms": f"{GLOBAL}::"
    "test_global_eval_candidate_timeout_ms_skips_a_slow_candidate_and_the_round_goes_on",
    "global_eval_cache_max": f"{GLOBAL}::test_global_eval_cache_max_bounds_the_compiled_candidates_kept",
    "global_eval_wait_timeout_ms": f"{GLOBAL}::"
    "test_global_eval_wait_timeout_ms_bounds_the_wait_for_global_registrations",
    # approvals (docs/design/approvals.md §4)
    "held_run_retention_days": "tests/e2e/test_approvals.py::"
    "test_a_restart_keeps_jobs_waiting_and_held_run_retention_days_cancels_old_ones",
    # event router
    "event_router_event_ttl_seconds": "tests/integration/events/test_metrics_and_settings.py::"
    "test_the_event_ttl_follows_the_live_cluster_knob",
    "event_router_max_dispatch_attempts": "tests/integration/events/test_metrics_and_settings.py::"
    "test_the_dispatch_attempts_follow_the_live_cluster_knob",
    "event_router_rate_limit_per_workflow_per_minute": "tests/integration/events/test_metrics_and_settings.py::"
    "test_the_rate_limit_follows_the_live_cluster_knob",
    "event_max_payload_bytes": "tests/integration/events/test_metrics_and_settings.py::"
    "test_the_event_payload_limit_follows_the_live_cluster_knob",
    # agents, scaler
    "agent_token_ttl_ms": "tests/integration/scaler/test_manager.py::"
    "test_a_spawned_agents_token_lives_agent_token_ttl_ms",
    "firecracker_api_socket_wait_ms": "tests/integration/scaler/test_firecracker_backend.py::"
    "test_the_default_wait_is_five_seconds_and_a_longer_setting_lets_a_slow_socket_through",
    "scaler_reap_interval_ms": "tests/integration/scaler/test_manager.py::"
    "test_the_reaper_closes_rows_of_this_boot_that_no_spawn_holds",
    "scaler_provision_backoff_base_ms": "tests/integration/scaler/test_manager.py::"
    "test_provision_backoff_doubles_and_one_registration_resets_it",
    "scaler_provision_backoff_max_ms": "tests/integration/scaler/test_manager.py::"
    "test_provision_backoff_doubles_and_one_registration_resets_it",
    "scaler_provision_max_consecutive_failures": "tests/integration/scaler/test_manager.py::"
    "test_provision_backoff_doubles_and_one_registration_resets_it",
    "scaler_spawn_timeout_ms": "tests/integration/scaler/test_manager.py::"
    "test_a_spawn_that_never_registers_is_reaped",
    "scaler_reap_reattempt_interval_ms": "tests/integration/scaler/test_manager.py::"
    "test_a_failed_teardown_is_tried_again_every_reattempt_interval_until_it_succeeds",
    "scaler_claim_retention_ms": "tests/integration/scaler/test_claims.py::"
    "test_scaler_claim_retention_ms_is_a_live_cluster_knob_the_reaper_reads",
    "scaler_reap_stranded_timeout_ms": "tests/integration/scaler/test_backstop.py::"
    "test_the_leader_adopts_a_gone_nodes_records_and_tears_down_what_is_stranded_after_the_timeout",
    # reroute (the service tests set each knob by name through `resolve_reroute_settings`)
    "reroute_ack_timeout_ms": f"{REROUTE}::test_an_ack_timeout_cancels_on_that_worker_and_offers_the_job_onwards",
    "ownership_db_check_timeout_ms": "tests/integration/cluster/test_ownership_check.py::"
    "test_a_check_held_up_by_a_row_lock_defers_and_the_job_is_taken_back_once_after",
    "reroute_max_hops": f"{REROUTE}::test_when_hops_run_out_the_row_goes_back_for_local_capacity_only",
    "reroute_spawn_window_ms": f"{REROUTE}::test_a_lapsed_spawn_window_cancels_on_the_holder_and_offers_the_job_onwards",
    "reroute_spawn_max_attempts": "tests/integration/cluster/test_worker_runs_jobs.py::"
    "test_a_job_whose_spawn_fails_on_one_worker_runs_on_the_next_with_the_same_job_id",
    "reroute_spawn_retry_backoff_ms": f"{REROUTE}::test_a_not_final_failure_from_the_holder_counts_and_rearms_the_window",
    "reroute_flap_grace_ms": "tests/integration/cluster/test_worker_runs_jobs.py::"
    "test_the_stale_run_sweep_defers_a_rerouted_job_within_the_flap_grace_only_and_never_a_local_one",
    # retention
    "run_retention_days": f"{HERE}::test_run_retention_deletes_ended_runs_past_the_window_and_keeps_the_rest",
    "audit_retention_days": f"{HERE}::test_audit_retention_deletes_old_access_log_rows_and_zero_keeps_them",
    "check_run_tracking_ttl_days": f"{HERE}::"
    "test_check_run_tracking_ttl_days_deletes_sent_report_rows_past_it_and_keeps_owed_ones",
}

# Knobs stored and validated whose behaviour belonged to the cluster issues; they are all wired and
# tested above now, and the list stays empty (the coverage test refuses any knob without a test).
AWAITING_CLUSTER_ISSUES: frozenset[str] = frozenset()

DAY = timedelta(days=1)
# Test rows live in the future, so the boot-time sweep (real clock) never touches them; the tests
# sweep with a clock of their own.
BASE = utc_now() + 1000 * DAY


async def patch_cluster(server: InProcessServer, values: dict[str, Any]) -> None:
    answer = await server.client.patch("/api/v1/admin/cluster-settings", json=values, headers=server.auth())
    assert answer.status_code == 200, answer.text


def leader(server: InProcessServer) -> LeaderContext:
    context = runtime_services(server.state.parts).leadership.context()
    assert context is not None, "the in-process server leads"
    return context


def sweeper(server: InProcessServer) -> RetentionSweep:
    found = server.state.parts.need(RETENTION)
    assert isinstance(found, RetentionSweep)
    return found


async def history_run(
    db: Database,
    *,
    created: datetime,
    finished: datetime | None,
    status: str = "success",
    log_rows: int = 3,
) -> str:
    """A run with one job, two steps, logs, a needs edge, dispatch history, timeline and a report."""
    run_id, job_id = new_id(), new_id()
    job_status = status if finished is not None else "running"
    async with db.transaction() as conn:
        await conn.execute(
            insert(runs).values(
                id=run_id,
                org_id=DEFAULT_ORG,
                number=1,
                workflow="ci",
                repo="acme/app",
                event={},
                status=status,
                created_at=created,
                finished_at=finished,
            )
        )
        await conn.execute(
            insert(jobs).values(
                id=job_id,
                run_id=run_id,
                org_id=DEFAULT_ORG,
                name="build",
                display_name="build",
                status=job_status,
                runs_on={"labels": [], "exclude": []},
                created_at=created,
                finished_at=finished,
            )
        )
        await conn.execute(insert(job_needs).values(job_id=job_id, upstream_name="setup", run_on=["success"]))
        for index in (0, 1):
            await conn.execute(
                insert(steps).values(
                    job_id=job_id, step_index=index, name=f"s{index}", kind="step", status="success"
                )
            )
        for seq in range(log_rows):
            await conn.execute(
                insert(job_logs).values(
                    job_id=job_id,
                    step_index=1,
                    seq=seq,
                    byte_offset=seq * 6,
                    job_offset=seq * 6,
                    bytes=6,
                    line_count=1,
                    data=gzip.compress(b"hello\n"),
                    meta=[[0, "out"]],
                    created_at=created,
                )
            )
        await conn.execute(
            insert(dispatch_history).values(
                id=new_id(), job_id=job_id, attempt=1, ended_at=finished or created, outcome="finished"
            )
        )
        await conn.execute(
            insert(run_timeline).values(
                id=new_id(), run_id=run_id, at=created, source="dispatch", kind="run.created"
            )
        )
        await conn.execute(
            insert(status_reports).values(
                source_id="src",
                sha=new_id(),
                context="conveyor/ci",
                run_id=run_id,
                state="success",
                version=1,
                next_attempt_at=created,
                updated_at=created,
            )
        )
    return run_id


async def rows_of(db: Database, run_id: str) -> dict[str, int]:
    """How many rows each table holds for the run."""
    async with db.read() as conn:
        job_ids = [r.id for r in await conn.execute(select(jobs.c.id).where(jobs.c.run_id == run_id))]
        found: dict[str, int] = {}
        for table, column, values in (
            (runs, runs.c.id, [run_id]),
            (jobs, jobs.c.run_id, [run_id]),
            (run_timeline, run_timeline.c.run_id, [run_id]),
            (status_reports, status_reports.c.run_id, [run_id]),
            (steps, steps.c.job_id, job_ids),
            (job_logs, job_logs.c.job_id, job_ids),
            (job_needs, job_needs.c.job_id, job_ids),
            (dispatch_history, dispatch_history.c.job_id, job_ids),
        ):
            query = select(func.count()).select_from(table).where(column.in_(values))
            found[table.name] = (await conn.execute(query)).scalar_one()
    return found


def gone(counts: dict[str, int]) -> bool:
    return all(count == 0 for count in counts.values())


async def metric(server: InProcessServer, kind: str) -> float:
    text = (await server.client.get("/metrics")).text
    prefix = f'conveyor_retention_deleted_total{{kind="{kind}"}} '
    line = next((line for line in text.splitlines() if line.startswith(prefix)), None)
    return float(line.removeprefix(prefix)) if line else 0.0


# --- run_retention_days


async def test_run_retention_deletes_ended_runs_past_the_window_and_keeps_the_rest(
    server: InProcessServer,
) -> None:
    db = server.state.db
    await patch_cluster(server, {"run_retention_days": 30})
    old = await history_run(db, created=BASE - 40 * DAY, finished=BASE - 35 * DAY, status="failed")
    recent = await history_run(db, created=BASE - 6 * DAY, finished=BASE - 5 * DAY)
    # Ended 29 days before BASE: inside the window now, outside it two days later.
    edge = await history_run(db, created=BASE - 60 * DAY, finished=BASE - 29 * DAY, status="cancelled")
    # Created long before the window and still running: never touched, whatever the clock says.
    running = await history_run(db, created=BASE - 200 * DAY, finished=None, status="running")

    deleted = await sweeper(server).sweep(leader(server).fence, now=BASE)

    assert gone(await rows_of(db, old))
    for kept in (recent, edge, running):
        assert (await rows_of(db, kept))["runs"] == 1 and (await rows_of(db, kept))["job_logs"] == 3
    assert deleted["runs"] == 1 and deleted["job_logs"] == 3 and deleted["steps"] == 2
    assert await metric(server, "runs") == 1

    # The clock moves two days on: the edge run is now past the window; the running run stays.
    await sweeper(server).sweep(leader(server).fence, now=BASE + 2 * DAY)
    assert gone(await rows_of(db, edge))
    assert (await rows_of(db, recent))["runs"] == 1
    assert (await rows_of(db, running)) == {
        "runs": 1,
        "jobs": 1,
        "run_timeline": 1,
        "status_reports": 1,
        "steps": 2,
        "job_logs": 3,
        "job_needs": 1,
        "dispatch_history": 1,
    }
    assert await metric(server, "runs") == 2

    # 0 keeps forever.
    await patch_cluster(server, {"run_retention_days": 0})
    await sweeper(server).sweep(leader(server).fence, now=BASE + 5000 * DAY)
    assert (await rows_of(db, recent))["runs"] == 1


async def test_a_retention_backlog_goes_in_bounded_batches(server: InProcessServer) -> None:
    db = server.state.db
    await patch_cluster(server, {"run_retention_days": 1})
    old = [
        await history_run(db, created=BASE - 10 * DAY, finished=BASE - 9 * DAY, log_rows=7) for _ in range(5)
    ]
    small = RetentionSweep(db, sweeper(server).settings, batch=4, run_batch=2)
    deleted = await small.sweep(leader(server).fence, now=BASE)
    assert deleted["runs"] == 5 and deleted["job_logs"] == 35
    assert all([gone(await rows_of(db, run_id)) for run_id in old])
    # 35 log rows at most 4 per transaction: no single transaction took the backlog.
    assert small.transactions >= 35 // 4


async def test_a_node_that_lost_the_lease_deletes_nothing(server: InProcessServer) -> None:
    db = server.state.db
    await patch_cluster(server, {"run_retention_days": 1})
    old = await history_run(db, created=BASE - 10 * DAY, finished=BASE - 9 * DAY)
    current = leader(server)
    stale = LeaderContext(
        db=db, holder=current.holder, epoch=current.epoch - 1, ttl_ms=current.ttl_ms, on_lost=lambda: None
    )
    with pytest.raises(LeaseLost):
        await sweeper(server).sweep(stale.fence, now=BASE)
    assert (await rows_of(db, old))["job_logs"] == 3 and (await rows_of(db, old))["runs"] == 1


# --- audit_retention_days


async def access_row(db: Database, at: datetime) -> str:
    row_id = new_id()
    async with db.transaction() as conn:
        await conn.execute(
            insert(access_log).values(
                id=row_id,
                at=at,
                actor_type="token",
                source="api",
                action="run.list",
                outcome="allowed",
                status_code=200,
            )
        )
    return row_id


async def access_ids(db: Database, ids: list[str]) -> set[str]:
    async with db.read() as conn:
        return {r.id for r in await conn.execute(select(access_log.c.id).where(access_log.c.id.in_(ids)))}


async def test_audit_retention_deletes_old_access_log_rows_and_zero_keeps_them(
    server: InProcessServer,
) -> None:
    db = server.state.db
    await patch_cluster(server, {"audit_retention_days": 30})
    old = await access_row(db, BASE - 31 * DAY)
    young = await access_row(db, BASE - 29 * DAY)
    await sweeper(server).sweep(leader(server).fence, now=BASE)
    assert await access_ids(db, [old, young]) == {young}
    assert await metric(server, "access_log") >= 1

    await patch_cluster(server, {"audit_retention_days": 0})
    await sweeper(server).sweep(leader(server).fence, now=BASE + 5000 * DAY)
    assert await access_ids(db, [young]) == {young}


# --- webhook_dedup_ttl_ms


async def test_finished_deliveries_are_pruned_after_the_dedup_ttl_which_ends_dedup(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    await patch_cluster(server, {"webhook_dedup_ttl_ms": 60_000})
    source = await add_github_source(server, github)
    sha = git(repo, "rev-parse", "HEAD")
    payload = push_payload("acme/app", repo, ref="refs/heads/main", before="0" * 40, after=sha)
    first = await post(server, source["id"], payload, delivery="same")
    first_id = first.json()["delivery"]
    await processed(server, first_id)
    # An unprocessed delivery is owed processing: never pruned, however old. Another node holds its
    # lease, so this node's recovery scan does not process it again while the sweep runs.
    async with server.state.db.transaction() as conn:
        await conn.execute(
            update(deliveries)
            .where(deliveries.c.id == first_id)
            .values(status="received", lease_owner="another-node", lease_until=utc_now() + DAY)
        )
    await sweeper(server).sweep(leader(server).fence, now=utc_now() + 10 * DAY)
    assert (await delivery_status(server, first_id))["status"] == "received"
    async with server.state.db.transaction() as conn:
        await conn.execute(
            update(deliveries)
            .where(deliveries.c.id == first_id)
            .values(status="processed", lease_owner=None, lease_until=None)
        )

    # Within the TTL the delivery id still deduplicates…
    await sweeper(server).sweep(leader(server).fence, now=utc_now())
    again = await post(server, source["id"], payload, delivery="same")
    assert again.json() == {"status": "duplicate", "delivery": first_id}

    # …past it the finished row is pruned, and the same id is a new delivery.
    deleted = await sweeper(server).sweep(leader(server).fence, now=utc_now() + timedelta(minutes=2))
    assert deleted.get("deliveries", 0) >= 1
    gone_row = await server.client.get(f"/api/v1/admin/deliveries/{first_id}", headers=server.auth())
    assert gone_row.status_code == 404
    later = await post(server, source["id"], payload, delivery="same")
    assert later.status_code == 202 and later.json()["delivery"] != first_id
    assert await metric(server, "deliveries") >= 1


# --- queue_max_depth

WIDE_WORKFLOW = """
from conveyor import Need, push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def a(ctx):
    ctx.sh(["echo", "a"])

@ci.job(runs_on=["linux"])
def b(ctx):
    ctx.sh(["echo", "b"])

@ci.job(runs_on=["linux"])
def c(ctx):
    ctx.sh(["echo", "c"])

@ci.job(runs_on=["linux"], needs=[Need(a, when="always")])
def d(ctx):
    ctx.sh(["echo", "d"])
"""


async def local_push(server: InProcessServer, repo: Path) -> str:
    """Add a local source for `repo`, trigger its HEAD, return the run id."""
    answer = await server.client.post(
        "/api/v1/admin/sources",
        json={"kind": "local", "name": "app", "path": str(repo)},
        headers=server.auth(),
    )
    assert answer.status_code == 201, answer.text
    source_id = answer.json()["id"]
    sha = git(repo, "rev-parse", "HEAD")
    trigger = await server.client.post(
        f"/api/v1/admin/sources/{source_id}/trigger",
        json={"ref": "refs/heads/main", "sha": sha},
        headers=server.auth(),
    )
    assert trigger.status_code == 202, trigger.text
    row = await processed(server, trigger.json()["delivery"])
    assert row["status"] == "processed", row
    return str(row["runs"][0])


async def job_states(server: InProcessServer, run_id: str) -> dict[str, tuple[str, str | None]]:
    run = (await server.client.get(f"/api/v1/admin/runs/{run_id}", headers=server.auth())).json()
    return {j["name"]: (j["status"], j["reason"]) for j in run["jobs"]}


async def queue_full_count(server: InProcessServer) -> float:
    text = (await server.client.get("/metrics")).text
    line = next(line for line in text.splitlines() if line.startswith("conveyor_queue_full_total "))
    return float(line.split()[1])


async def test_a_job_enqueued_into_a_full_queue_fails_queue_full_visibly_and_counted(
    server: InProcessServer, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "wide", {"ci": WIDE_WORKFLOW})
    before = await queue_full_count(server)
    await patch_cluster(server, {"queue_max_depth": 2})
    run_id = await local_push(server, repo)
    states = await job_states(server, run_id)
    # Two rows fill the queue; the third ready job is refused at creation, its dependant waits.
    assert {name: status for name, (status, _) in states.items()} == {
        "a": "queued",
        "b": "queued",
        "c": "failed",
        "d": "pending",
    }
    assert states["c"][1] == "queue_full: 2 jobs already pending (queue_max_depth)"
    assert await queue_full_count(server) == before + 1
    async with server.state.db.read() as conn:
        query = select(func.count()).select_from(dispatch_queue).where(dispatch_queue.c.state == "pending")
        assert (await conn.execute(query)).scalar_one() == 2

    # A job released from `pending` into a full queue fails the same way: with a ended, d is ready,
    # but b's row alone is the whole of queue_max_depth=1.
    await patch_cluster(server, {"queue_max_depth": 1})
    run = (await server.client.get(f"/api/v1/admin/runs/{run_id}", headers=server.auth())).json()
    job_ids = {j["name"]: j["id"] for j in run["jobs"]}
    async with server.state.db.transaction() as conn:
        await finish_job(conn, job_ids["a"], "cancelled")
    states = await job_states(server, run_id)
    assert states["d"] == ("failed", "queue_full: 1 jobs already pending (queue_max_depth)")
    assert states["b"][0] == "queued"
    assert await queue_full_count(server) == before + 2


# --- lock_file_max_bytes


async def test_a_lock_over_lock_file_max_bytes_fails_the_deliverys_run_visibly(
    server: InProcessServer, github: FakeGitHub, repo: Path, tmp_path: Path
) -> None:
    lock_size = (repo / ".conveyor" / "conveyor.lock.json").stat().st_size
    assert lock_size > 1024, "the test lock must be bigger than the smallest limit"
    await patch_cluster(server, {"lock_file_max_bytes": 1024})
    source = await add_github_source(server, github)
    sha = git(repo, "rev-parse", "HEAD")
    payload = push_payload("acme/app", repo, ref="refs/heads/main", before="0" * 40, after=sha)

    # GitHub (streamed contents API) …
    row = await processed(
        server, (await post(server, source["id"], payload, delivery="big")).json()["delivery"]
    )
    assert row["status"] == "lock_invalid" and len(row["runs"]) == 1
    run = (await server.client.get(f"/api/v1/admin/runs/{row['runs'][0]}", headers=server.auth())).json()
    assert run["status"] == "failed"
    assert run["reason"].startswith("lock_too_large: ") and "1024-byte limit" in run["reason"]

    # … and a local source (size read before the blob) refuse it the same way.
    local = await server.client.post(
        "/api/v1/admin/sources",
        json={"kind": "local", "name": "app", "path": str(repo)},
        headers=server.auth(),
    )
    trigger = await server.client.post(
        f"/api/v1/admin/sources/{local.json()['id']}/trigger",
        json={"ref": "refs/heads/main", "sha": sha},
        headers=server.auth(),
    )
    local_row = await processed(server, trigger.json()["delivery"])
    local_run = (
        await server.client.get(f"/api/v1/admin/runs/{local_row['runs'][0]}", headers=server.auth())
    ).json()
    assert local_row["status"] == "lock_invalid" and local_run["reason"].startswith("lock_too_large: ")

    # Raised past the lock's size, the same commit's lock is read and its workflows run.
    await patch_cluster(server, {"lock_file_max_bytes": 1024 * 1024})
    row = await processed(
        server, (await post(server, source["id"], payload, delivery="fits")).json()["delivery"]
    )
    assert row["status"] == "processed" and row["runs"]


# --- ingest_max_concurrency


class HeldLocalProvider(LocalProvider):
    """A local provider whose per-delivery step (changed files) waits until the test lets it go."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.entered = 0
        self.release = asyncio.Semaphore(0)

    async def changed_files(self, source: SourceRow, event: Event) -> list[str] | None:
        self.in_flight += 1
        self.entered += 1
        self.most = max(self.most, self.in_flight)
        try:
            await self.release.acquire()
            return await super().changed_files(source, event)
        finally:
            self.in_flight -= 1


async def trigger_many(server: InProcessServer, source_id: str, sha: str, count: int) -> list[str]:
    ids = []
    for _ in range(count):
        answer = await server.client.post(
            f"/api/v1/admin/sources/{source_id}/trigger",
            json={"ref": "refs/heads/main", "sha": sha, "before": sha, "delivery_id": new_id()},
            headers=server.auth(),
        )
        assert answer.status_code == 202, answer.text
        ids.append(answer.json()["delivery"])
    return ids


async def test_ingest_max_concurrency_bounds_an_orgs_deliveries_in_progress_and_drops_none(
    server: InProcessServer, repo: Path
) -> None:
    held = HeldLocalProvider()
    pipeline = server.state.parts.need(INGEST).pipeline
    pipeline._providers = {**pipeline._providers, "local": held}  # the test's hold on processing
    answer = await server.client.patch(
        f"/api/v1/admin/org-settings/{DEFAULT_ORG}", json={"ingest_max_concurrency": 2}, headers=server.auth()
    )
    assert answer.status_code == 200, answer.text
    added = await server.client.post(
        "/api/v1/admin/sources",
        json={"kind": "local", "name": "app", "path": str(repo)},
        headers=server.auth(),
    )
    source_id = added.json()["id"]
    sha = git(repo, "rev-parse", "HEAD")

    ids = await trigger_many(server, source_id, sha, 5)
    await async_wait_until(lambda: now_true(held.entered == 2), what="two deliveries in progress")
    for _ in range(3):
        # Each one let go admits exactly one more: the others wait, unleased and unprocessed.
        entered = held.entered
        held.release.release()
        await async_wait_until(
            lambda e=entered: now_true(held.entered == e + 1), what="the next delivery admitted"
        )
        assert held.in_flight == 2
    for _ in range(2):
        held.release.release()
    rows = [await processed(server, delivery) for delivery in ids]
    assert [row["status"] for row in rows] == ["processed"] * 5
    assert held.most == 2

    # Unset (unlimited), every delivery goes at once.
    answer = await server.client.patch(
        f"/api/v1/admin/org-settings/{DEFAULT_ORG}",
        json={"ingest_max_concurrency": None},
        headers=server.auth(),
    )
    assert answer.status_code == 200, answer.text
    more = await trigger_many(server, source_id, sha, 4)
    await async_wait_until(lambda: now_true(held.in_flight == 4), what="four deliveries in progress at once")
    for _ in range(4):
        held.release.release()
    assert [(await processed(server, d))["status"] for d in more] == ["processed"] * 4


# --- check_run_tracking_ttl_days


async def report_row(db: Database, *, updated: datetime, version: int, sent_version: int) -> str:
    """A status-report row of a `checks` source's run (its check run id in `external_id`); returns its sha."""
    sha = new_id()
    async with db.transaction() as conn:
        await conn.execute(
            insert(status_reports).values(
                source_id="src",
                sha=sha,
                context="conveyor/ci",
                run_id=new_id(),
                state="success",
                version=version,
                sent_version=sent_version,
                external_id="4242",
                next_attempt_at=updated,
                updated_at=updated,
            )
        )
    return sha


async def report_shas(db: Database) -> set[str]:
    async with db.read() as conn:
        return {str(sha) for sha in (await conn.execute(select(status_reports.c.sha))).scalars()}


async def test_check_run_tracking_ttl_days_deletes_sent_report_rows_past_it_and_keeps_owed_ones(
    server: InProcessServer,
) -> None:
    db = server.state.db
    before = await metric(server, "status_reports")
    await patch_cluster(server, {"check_run_tracking_ttl_days": 30})
    old_sent = await report_row(db, updated=BASE - 31 * DAY, version=2, sent_version=2)
    old_owed = await report_row(db, updated=BASE - 31 * DAY, version=3, sent_version=2)
    young = await report_row(db, updated=BASE - 29 * DAY, version=1, sent_version=1)

    deleted = await sweeper(server).sweep(leader(server).fence, now=BASE)

    assert deleted.get("status_reports") == 1
    assert {old_owed, young} <= await report_shas(db) and old_sent not in await report_shas(db)
    assert await metric(server, "status_reports") == before + 1

    # 0 keeps them until their run is deleted.
    await patch_cluster(server, {"check_run_tracking_ttl_days": 0})
    await sweeper(server).sweep(leader(server).fence, now=BASE + 5000 * DAY)
    assert {old_owed, young} <= await report_shas(db)
