"""Ingest: webhooks per second accepted durably (HTTP 202 after the commit), N concurrent clients.

A `git` source (Gitea-style, HMAC-signed unless --verify none) on a real `conveyor server`; every
request is a distinct push delivery to a branch no workflow listens to, so the server also processes
each stored delivery (lease, lock read from the cache, match, finish) while the load runs — the
acceptance rate is measured with that background work going on, as it would in production.
After the run the stored rows are counted: every 202 must be a row in `deliveries`, and the script
waits (with a deadline) until every delivery is processed, printing the rate including that.

Beside it, in the same run: the raw durable single-row insert rate of the same database from the same
number of connections (plain driver, one row and one commit per insert, the server's durability
settings: WAL `synchronous=NORMAL` on SQLite, `synchronous_commit=on` on PostgreSQL), the ceiling the
acceptance rate is compared with, and one client's POST -> 202 latency.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

from bench.harness import (
    Report,
    _pg_connect,
    arguments,
    finish,
    fresh_database,
    git,
    make_repo,
    percentile,
    running_server,
    wait_until,
    workdir,
)
from bench.harness import selected_dialects as chosen_dialects
from conveyor.db.engine import create_sync_engine
from conveyor.db.tables import deliveries
from conveyor.ingest.signatures import hmac_hex

SECRET = "bench-webhook-secret"
TARGETS = {"postgresql": 400.0, "sqlite": 400.0}
RAW_SHARE_TARGET = 40.0  # % of the raw durable single-row insert rate
LATENCY_TARGET_MS = 10.0
WORKFLOW = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["true"])
"""


def raw_insert_rate(dialect: str, database_url: str, *, connections: int, seconds: float) -> float:
    """Durable single-row inserts per second from `connections` threads, one connection and one commit
    per insert, on the plain driver: the ceiling of a server that commits each delivery on its own."""
    body = b"x" * 300  # about a compressed push payload
    if dialect == "sqlite":
        path = database_url.removeprefix("sqlite:///")

        def connect() -> Any:
            conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            return conn

        def insert(conn: Any) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO bench_raw VALUES (?, ?)", (uuid.uuid4().hex, body))
            conn.execute("COMMIT")

        setup = connect()
        setup.execute("CREATE TABLE bench_raw (id TEXT PRIMARY KEY, body BLOB)")
        teardown = "DROP TABLE bench_raw"
    else:
        from sqlalchemy.engine import make_url

        name = make_url(database_url).database or "postgres"

        def connect() -> Any:
            from bench.harness import pg_url_for

            return _pg_connect(pg_url_for(name))  # autocommit: each INSERT is one durable commit

        def insert(conn: Any) -> None:
            conn.execute("INSERT INTO bench_raw VALUES (%s, %s)", (uuid.uuid4().hex, body))

        setup = connect()
        setup.execute("CREATE TABLE bench_raw (id text PRIMARY KEY, body bytea)")
        teardown = "DROP TABLE bench_raw"
    counts = [0] * connections
    deadline = time.monotonic() + seconds

    def worker(index: int) -> None:
        conn = connect()
        try:
            while time.monotonic() < deadline:
                insert(conn)
                counts[index] += 1
        finally:
            conn.close()

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    setup.execute(teardown)
    setup.close()
    return sum(counts) / elapsed


def push_request(sha: str, verify: str) -> tuple[bytes, dict[str, str]]:
    """One distinct push delivery: its body and headers."""
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
    return body, headers


async def single_client_latencies(
    url: str, source_id: str, sha: str, *, count: int, verify: str
) -> list[float]:
    """POST -> 202 in ms, one client, `count` sequential deliveries."""
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for _ in range(count):
            body, headers = push_request(sha, verify)
            started = time.perf_counter()
            answer = await http.post(f"/webhooks/{source_id}", content=body, headers=headers)
            latencies.append((time.perf_counter() - started) * 1000)
            if answer.status_code != 202:
                raise SystemExit(f"single client: {answer.status_code} {answer.text}")
    return latencies


async def load(
    url: str, source_id: str, sha: str, *, clients: int, seconds: float, verify: str
) -> dict[str, int]:
    """Post distinct push deliveries from `clients` concurrent connections for `seconds`."""
    counts = {"accepted": 0, "other": 0}
    deadline = time.monotonic() + seconds

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            while time.monotonic() < deadline:
                body, headers = push_request(sha, verify)
                answer = await http.post(f"/webhooks/{source_id}", content=body, headers=headers)
                counts["accepted" if answer.status_code == 202 else "other"] += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return counts


def measure(
    dialect: str,
    base: Path,
    *,
    clients: int,
    seconds: float,
    verify: str,
    latency_posts: int,
    report: Report,
) -> None:
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

        def count(*conditions: Any) -> int:
            with engine.connect() as conn:
                query = select(func.count()).select_from(deliveries).where(*conditions)
                return int(conn.execute(query).scalar_one())

        try:
            wait_until(
                lambda: count(deliveries.c.status == "received") == 0, timeout=60, what="warm-up processed"
            )
            latencies = asyncio.run(
                single_client_latencies(server.url, source_id, sha, count=latency_posts, verify=verify)
            )
            wait_until(lambda: count(deliveries.c.status == "received") == 0, timeout=60, what="idle again")
            before = count()
            started = time.monotonic()
            counts = asyncio.run(
                load(server.url, source_id, sha, clients=clients, seconds=seconds, verify=verify)
            )
            elapsed = time.monotonic() - started
            stored = count() - before
            wait_until(
                lambda: count(deliveries.c.status == "received") == 0,
                timeout=max(120.0, seconds * 10),
                what="every delivery processed",
                poll=0.1,
            )
            processed_elapsed = time.monotonic() - started
        finally:
            engine.dispose()
        raw = raw_insert_rate(dialect, database_url, connections=clients, seconds=min(seconds, 10.0))
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
        report.add(
            f"ingest {dialect}: accepted and processed per second",
            counts["accepted"] / processed_elapsed,
            "req/s",
            note=f"all {stored} processed {processed_elapsed - elapsed:.1f} s after the load ended",
        )
        report.add(
            f"ingest {dialect}: raw durable single-row inserts/s, same database",
            raw,
            "rows/s",
            note=f"{clients} connections, plain driver, one commit per row",
        )
        share = 100 * rate / raw
        report.add(
            f"ingest {dialect}: accepted / raw insert rate",
            share,
            "%",
            target=f">= {RAW_SHARE_TARGET:.0f} %",
            met=share >= RAW_SHARE_TARGET,
        )
        p50 = percentile(latencies, 50)
        report.add(
            f"ingest {dialect}: one client POST -> 202 p50",
            p50,
            "ms",
            target=f"<= {LATENCY_TARGET_MS:.0f} ms",
            met=p50 <= LATENCY_TARGET_MS,
            note=f"{len(latencies)} sequential posts, p90 {percentile(latencies, 90):.1f} ms",
        )
        if stored < counts["accepted"]:
            raise SystemExit(f"only {stored} rows stored for {counts['accepted']} answers 202 on {dialect}")


def main() -> None:
    parser = arguments(__doc__ or "")
    parser.add_argument("--clients", type=int, default=16, help="concurrent HTTP clients (default 16)")
    parser.add_argument("--seconds", type=float, help="load duration (default 30, --quick 3)")
    parser.add_argument("--verify", choices=["hmac", "none"], default="hmac")
    parser.add_argument(
        "--latency-posts", type=int, help="sequential posts of the one-client p50 (default 200, --quick 30)"
    )
    args = parser.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 30.0)
    latency_posts = args.latency_posts or (30 if args.quick else 200)
    report = Report("ingest")
    with workdir() as base:
        for dialect in chosen_dialects(args):
            print(f"ingest on {dialect}: {args.clients} clients for {seconds:.0f} s", flush=True)
            measure(
                dialect,
                base,
                clients=args.clients,
                seconds=seconds,
                verify=args.verify,
                latency_posts=latency_posts,
                report=report,
            )
    finish(report, args)


if __name__ == "__main__":
    main()
