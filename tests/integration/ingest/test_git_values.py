"""Commit ids and refs from a webhook never reach `git` as options (issue 35, high 1).

A push whose `after` is `--upload-pack=touch <file>;true` made `git fetch … origin <after>` run the
command on the orchestrator. Every commit id and ref of a payload is now checked where it is normalised,
the delivery is recorded `failed` with the reason, and no git runs for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conveyor.ingest.service import INGEST
from tests.support.git_sources import git_source, signed_post
from tests.support.inprocess import InProcessServer
from tests.support.repos import git
from tests.support.waiting import async_wait_until


async def finished(server: InProcessServer, delivery: str) -> dict[str, Any]:
    """The delivery once processed, or once its first attempt failed (background work, the lock prefetch
    included, done)."""

    async def done() -> dict[str, Any] | None:
        row = (await server.client.get(f"/api/v1/admin/deliveries/{delivery}", headers=server.auth())).json()
        return row if row["status"] != "received" or row["attempts"] > 0 else None

    row = await async_wait_until(done, timeout=30, what=f"delivery {delivery} processed")
    await server.state.parts.need(INGEST).pipeline.drain()
    return row


async def test_the_upload_pack_payload_runs_nothing_and_is_recorded_refused(
    server: InProcessServer, tmp_path: Path
) -> None:
    source_id, _ = await git_source(server, tmp_path)
    marker = tmp_path / "pwned"
    delivery = await signed_post(
        server,
        source_id,
        {
            "ref": "refs/heads/main",
            "before": "0" * 40,
            "after": f"--upload-pack=touch {marker};true",
            "repository": {"full_name": "team/app"},
            "commits": [],
        },
    )
    row = await finished(server, delivery)
    assert not marker.exists()
    assert row["status"] == "failed"
    assert row["error"].startswith("refused: after is not a commit id"), row["error"]
    assert row["runs"] == [] and row["attempts"] == 0
    # Nothing was fetched for it: the source's cache was never even created.
    assert not (Path(server.state.settings.home) / "git-cache" / f"{source_id}.git").exists()


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("ref", "--upload-pack=touch {marker};true", "ref starts with '-'"),
        ("ref", "refs/heads/../../x", "ref contains '..'"),
        ("before", "--output={marker}", "before is not a commit id"),
        ("after", "HEAD", "after is not a commit id"),
    ],
)
async def test_a_push_with_any_invalid_ref_or_commit_id_is_refused(
    server: InProcessServer, tmp_path: Path, field: str, value: str, reason: str
) -> None:
    source_id, sha = await git_source(server, tmp_path)
    marker = tmp_path / "pwned"
    payload: dict[str, Any] = {
        "ref": "refs/heads/main",
        "before": "0" * 40,
        "after": sha,
        "repository": {"full_name": "team/app"},
        "commits": [],
        field: value.format(marker=marker),
    }
    row = await finished(server, await signed_post(server, source_id, payload))
    assert row["status"] == "failed" and row["error"].startswith(f"refused: {reason}"), row
    assert not marker.exists()


async def test_a_valid_push_after_a_refused_one_still_runs(server: InProcessServer, tmp_path: Path) -> None:
    source_id, sha = await git_source(server, tmp_path)
    base = {"ref": "refs/heads/main", "before": "0" * 40, "repository": {"full_name": "team/app"}}
    refused = await finished(server, await signed_post(server, source_id, {**base, "after": "-x"}))
    assert refused["status"] == "failed"
    row = await finished(server, await signed_post(server, source_id, {**base, "after": sha}))
    assert row["status"] == "processed" and len(row["runs"]) == 1, row


async def test_a_local_trigger_or_a_manual_run_with_an_option_for_a_ref_is_refused(
    server: InProcessServer, tmp_path: Path
) -> None:
    origin = tmp_path / "local"
    source_id, sha = await git_source(server, tmp_path)
    git(tmp_path / "origin", "clone", "-q", str(tmp_path / "origin"), str(origin))
    local = await server.client.post(
        "/api/v1/admin/sources",
        json={"kind": "local", "name": "local-app", "path": str(origin)},
        headers=server.auth(),
    )
    assert local.status_code == 201, local.text
    marker = tmp_path / "pwned"
    hostile = f"--output={marker}"
    trigger = await server.client.post(
        f"/api/v1/admin/sources/{local.json()['id']}/trigger",
        json={"ref": hostile, "sha": sha},
        headers=server.auth(),
    )
    assert trigger.status_code == 422 and "ref: " in trigger.json()["detail"], trigger.text
    for source in (source_id, local.json()["id"]):
        run = await server.client.post(
            "/api/v1/admin/runs",
            json={"source": source, "workflow": "ci", "ref": hostile},
            headers=server.auth(),
        )
        assert run.status_code == 400 and run.json()["error"] == "invalid_ref", run.text
    patched = await server.client.patch(
        f"/api/v1/admin/sources/{source_id}", json={"default_branch": "-main"}, headers=server.auth()
    )
    assert patched.status_code == 422, patched.text
    assert not marker.exists()
