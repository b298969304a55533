"""`git` sources: a Gitea-style HMAC-signed push; the lock is read by a shallow, blob-less fetch."""

import hashlib
import json
from pathlib import Path

from conveyor.ingest.signatures import hmac_hex
from tests.support.git_sources import SECRET, git_source
from tests.support.inprocess import InProcessServer
from tests.support.repos import git
from tests.support.waiting import async_wait_until


async def test_gitea_push_reads_the_lock_by_shallow_fetch_and_dedups_by_body(
    server: InProcessServer, tmp_path: Path
) -> None:
    source_id, sha = await git_source(server, tmp_path)
    payload = {
        "ref": "refs/heads/main",
        "before": "0" * 40,
        "after": sha,
        "repository": {"full_name": "team/app"},
        "commits": [],
    }
    body = json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        "X-Gitea-Event": "push",
        "X-Gitea-Signature": hmac_hex(SECRET, body),
    }
    answer = await server.client.post(f"/webhooks/{source_id}", content=body, headers=headers)
    assert answer.status_code == 202, answer.text
    delivery = answer.json()["delivery"]

    async def processed() -> dict[str, object] | None:
        row = (await server.client.get(f"/api/v1/admin/deliveries/{delivery}", headers=server.auth())).json()
        return row if row["status"] != "received" else None

    row = await async_wait_until(processed, timeout=60, what="the git delivery processed")
    assert row["status"] == "processed" and len(row["runs"]) == 1  # type: ignore[arg-type]
    assert row["delivery_id"] == "sha256:" + hashlib.sha256(body).hexdigest()
    cache = Path(server.state.settings.home) / "git-cache" / f"{source_id}.git"
    assert git(cache, "rev-parse", "--is-shallow-repository") == "true"
    resent = await server.client.post(f"/webhooks/{source_id}", content=body, headers=headers)
    assert resent.status_code == 200 and resent.json()["status"] == "duplicate"
    wrong = await server.client.post(
        f"/webhooks/{source_id}",
        content=body,
        headers={**headers, "X-Gitea-Signature": hmac_hex("nope", body)},
    )
    assert wrong.status_code == 401
