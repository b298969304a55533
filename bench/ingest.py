"""Ingest: webhooks per second accepted durably (HTTP 202 after the commit), N concurrent clients.

A `git` source (Gitea-style, HMAC-signed unless --verify none) on a real `conveyor server`; every
request is a distinct push delivery to a branch no workflow listens to, so the server also processes
each stored delivery (lease, lock read from the cache, match, finish) while the load runs — the
acceptance rate is measured with that background work going on, as it would in production.
After the run the stored rows are counted: every 202 must be a row in `deliveries`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import httpx
from sqlalchemy import func, select

from bench.harness import Report, arguments, finish, fresh_database, git, make_repo, running_server, workdir
from bench.harness import selected_dialects as chosen_dialects
from conveyor.db.engine import create_sync_engine
from conveyor.db.tables import deliveries
from conveyor.ingest.signatures import hmac_hex

SECRET = "bench-webhook-secret"
TARGETS = {"postgresql": 500.0, "sqlite": 300.0}
WORKFLOW = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["true"])
"""


async def load(
    url: str, source_id: str, sha: str, *, clients: int, seconds: float, verify: str
) -> dict[str, int]:
    """Post distinct push deliveries from `clients` concurrent connections for `seconds`."""
    counts = {"accepted": 0, "other": 0}
    deadline = time.monotonic() + seconds

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            while time.monotonic() < deadline:
                payload = {
                    "ref": "refs/heads/bench-load",
                    "before": "0" * 40,
                    "after": sha,
                    "repository": {"full_name": "bench/app"},
                    "commits": [],
                }
                body = json.dumps(payload).encode()
                headers = {
                    "Content-Type": "application/json",
                    "X-Gitea-Event": "push",
                    "X-Gitea-Delivery": uuid.uuid4().hex,
                }
                if verify == "hmac":
                    headers["X-Gitea-Signature"] = hmac_hex(SECRET, body)
                answer = await http.post(f"/webhooks/{source_id}", content=body, headers=headers)
                counts["accepted" if answer.status_code == 202 else "other"] += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return counts


def measure(dialect: str, base: Path, *, clients: int, seconds: float, verify: str, report: Report) -> None:
    """One server on a fresh database of `dialect`: warm up, load, count the stored rows."""
    with (
        fresh_database(dialect, base) as database_url,
        running_server(base / f"home-{dialect}", database_url) as server,
    ):
        origin = make_repo(base / f"origin-{dialect}", {"ci": WORKFLOW})
        sha = git(origin, "rev-parse", "HEAD")
        body: dict[str, object] = {
            "kind": "git",
            "name": "bench-app",
            "repo": "bench/app",
            "clone_url": f"file://{origin}",
            "verify": verify,
            "signature_header": "X-Gitea-Signature",
        }
        if verify == "hmac":
            body["webhook_secret"] = SECRET
        source_id = server.api_ok("POST", "/sources", json=body)["id"]
        asyncio.run(load(server.url, source_id, sha, clients=2, seconds=0.5, verify=verify))  # warm-up
        engine = create_sync_engine(database_url)
        try:
            with engine.connect() as conn:
                before = conn.execute(select(func.count()).select_from(deliveries)).scalar_one()
            started = time.monotonic()
            counts = asyncio.run(
                load(server.url, source_id, sha, clients=clients, seconds=seconds, verify=verify)
            )
            elapsed = time.monotonic() - started
            with engine.connect() as conn:
                stored = conn.execute(select(func.count()).select_from(deliveries)).scalar_one() - before
        finally:
            engine.dispose()
        rate = counts["accepted"] / elapsed
        target = TARGETS[dialect]
        report.add(
            f"ingest {dialect}: webhooks/s accepted (202)",
            rate,
            "req/s",
            target=f">= {target:.0f}",
            met=rate >= target,
            note=f"{clients} clients, {elapsed:.1f} s, {counts['accepted']} accepted, "
            f"{counts['other']} other, {stored} rows stored, verify={verify}",
        )
        if stored < counts["accepted"]:
            raise SystemExit(f"only {stored} rows stored for {counts['accepted']} answers 202 on {dialect}")


def main() -> None:
    parser = arguments(__doc__ or "")
    parser.add_argument("--clients", type=int, default=16, help="concurrent HTTP clients (default 16)")
    parser.add_argument("--seconds", type=float, help="load duration (default 30, --quick 3)")
    parser.add_argument("--verify", choices=["hmac", "none"], default="hmac")
    args = parser.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 30.0)
    report = Report("ingest")
    with workdir() as base:
        for dialect in chosen_dialects(args):
            print(f"ingest on {dialect}: {args.clients} clients for {seconds:.0f} s", flush=True)
            measure(dialect, base, clients=args.clients, seconds=seconds, verify=args.verify, report=report)
    finish(report, args)


if __name__ == "__main__":
    main()
