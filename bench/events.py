"""Events: emit → processed throughput on a real server, and the event store's lease rate as the
number of processed events in the table grows (0 vs 1M; --quick: 0 vs 2,000).

Throughput: a real `conveyor server`; C concurrent HTTP clients emit E operator events
(`POST /api/v1/admin/events`, each answered 201 after its commit) and the clock stops when the
router has processed all E (`processed_at` set on every row); the per-name emit limit is raised for
this server (100 a minute by default). No registration listens, so each
event is leased, routed (`no-registration`) and finished — the router's fixed cost per event.

Lease rate: the event store's own functions, as the router's drain loop calls them: pages of due
rows from `catchup_page`, then for each row `take_lease` (one transaction) and `finish` (another),
W at a time, until N fresh events are processed; leases per second. Measured on two PostgreSQL
databases, one with no processed events and one with 1M bulk-inserted, rounds alternating between
them; each round starts after `VACUUM ANALYZE events`, the best of --repeat is kept (the machine is
shared).
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import httpx
from sqlalchemy import func, insert, select, text

from bench.harness import (
    Report,
    arguments,
    finish,
    fresh_database,
    running_server,
    wait_until,
    workdir,
)
from bench.harness import selected_dialects as chosen_dialects
from conveyor.db.engine import Database, create_sync_engine
from conveyor.db.tables import events
from conveyor.events import store
from conveyor.model.ids import new_id, utc_now

OWNER = "bench-router"
# The per-name emit limit (100 a minute by default) would answer 429 long before E events; the
# benchmark measures the pipeline, not the limiter, so it is raised to the knob's maximum.
RAISED_LIMIT = {"CONVEYOR_EVENT_ROUTER_RATE_LIMIT_PER_WORKFLOW_PER_MINUTE": "100000"}
FLATNESS_TARGET = 20.0


async def emit_all(url: str, token: str, count: int, clients: int) -> int:
    """Emit `count` events from `clients` connections; how many were answered 201."""
    created = 0
    next_index = 0

    async def client() -> None:
        nonlocal created, next_index
        async with httpx.AsyncClient(
            base_url=f"{url}/api/v1/admin", headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as http:
            while next_index < count:
                index = next_index
                next_index += 1
                answer = await http.post("/events", json={"name": "bench.tick", "payload": {"n": index}})
                if answer.status_code != 201:
                    raise RuntimeError(f"emit answered {answer.status_code}: {answer.text}")
                created += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return created


def processed_count(database_url: str) -> int:
    engine = create_sync_engine(database_url)
    try:
        with engine.connect() as conn:
            query = select(func.count()).select_from(events).where(events.c.processed_at.is_not(None))
            return int(conn.execute(query).scalar_one())
    finally:
        engine.dispose()


def measure_throughput(dialect: str, base: Path, *, count: int, clients: int, report: Report) -> None:
    with (
        fresh_database(dialect, base) as database_url,
        running_server(base / f"home-{dialect}", database_url, RAISED_LIMIT) as server,
    ):
        started = time.monotonic()
        created = asyncio.run(emit_all(server.url, server.token, count, clients))
        emitted_s = time.monotonic() - started
        wait_until(
            lambda: processed_count(database_url) >= created,
            timeout=300,
            what=f"{created} events processed",
            poll=0.05,
        )
        elapsed = time.monotonic() - started
    report.add(
        f"events {dialect}: emit -> processed throughput",
        created / elapsed,
        "events/s",
        note=f"{created} events, {clients} clients; emitting alone {created / emitted_s:.0f}/s",
    )


def seed_unprocessed(url: str, count: int) -> None:
    """`count` due, unleased events, then VACUUM ANALYZE (PostgreSQL)."""
    now = utc_now()
    rows = [
        {
            "id": new_id(),
            "name": "bench.tick",
            "origin": "admin",
            "org_id": "default",
            "payload": {"n": i},
            "created_at": now + timedelta(microseconds=i),
        }
        for i in range(count)
    ]
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(insert(events), rows)
        if engine.dialect.name == "postgresql":
            with engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE events"))
    finally:
        engine.dispose()


def add_processed(url: str, count: int, tag: str) -> float:
    """Bulk-insert `count` processed events (PostgreSQL); seconds taken."""
    started = time.monotonic()
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO events (id, name, origin, org_id, payload, chain_depth, attempts, created_at, "
                    "processed_at, match_outcome, matched_count) "
                    "SELECT 'he-' || g || '-' || :tag, 'bench.old', 'admin', 'default', '{}'::jsonb, 0, 1, "
                    "now() - interval '2 days', now() - interval '2 days', 'no-registration', 0 "
                    "FROM generate_series(1, :n) AS g"
                ),
                {"n": count, "tag": tag},
            )
    finally:
        engine.dispose()
    return time.monotonic() - started


async def lease_rate(url: str, workers: int) -> tuple[float, int]:
    """Drain every due event with catchup_page + take_lease + finish; (leases/s, leases)."""
    db = Database.connect(url, pool_size=workers + 1)
    gate = asyncio.Semaphore(workers)
    done = 0

    async def one(event_id: str) -> None:
        nonlocal done
        async with gate:
            async with db.transaction() as conn:
                row = await store.take_lease(conn, event_id, OWNER, utc_now(), 60.0)
            if row is None:
                return
            async with db.transaction() as conn:
                if await store.finish(
                    conn, event_id, OWNER, int(row["attempts"]), utc_now(), "no-registration", 0
                ):
                    done += 1

    try:
        async with db.read() as conn:
            await conn.execute(text("SELECT 1"))
        started = time.monotonic()
        after = None
        while True:
            async with db.read() as conn:
                page = await store.catchup_page(conn, utc_now(), after)
            if not page:
                break
            await asyncio.gather(*(one(event_id) for _, event_id in page))
            after = page[-1]
        elapsed = time.monotonic() - started
    finally:
        await db.dispose()
    return done / elapsed, done


def measure_lease_flatness(
    base: Path, *, count: int, workers: int, history: int, repeat: int, report: Report
) -> None:
    """Lease rate on an empty table and on one holding `history` processed events, rounds interleaved."""
    with (
        fresh_database("postgresql", base, migrate=True) as empty_url,
        fresh_database("postgresql", base, migrate=True) as full_url,
    ):
        seconds = add_processed(full_url, history, "h")
        best = {"empty": (0.0, 0), "full": (0.0, 0)}
        for _ in range(repeat):
            for key, url in (("empty", empty_url), ("full", full_url)):
                seed_unprocessed(url, count)
                best[key] = max(best[key], asyncio.run(lease_rate(url, workers)))
        (empty, done), (full, full_done) = best["empty"], best["full"]
        report.add(
            "events postgresql: lease rate, 0 processed events",
            empty,
            "leases/s",
            note=f"{done} leases, {workers} workers, best of {repeat}",
        )
        report.add(
            f"events postgresql: lease rate, {history:,} processed events",
            full,
            "leases/s",
            note=f"{full_done} leases, best of {repeat}; history inserted in {seconds:.0f} s",
        )
        change = (empty - full) / empty * 100
        report.add(
            f"events postgresql: lease rate drop 0 -> {history:,} processed",
            change,
            "%",
            target=f"<= {FLATNESS_TARGET:.0f} %",
            met=change <= FLATNESS_TARGET,
            note="negative: faster with history (noise)",
        )


def main() -> None:
    parser = arguments(__doc__ or "")
    parser.add_argument(
        "--events", type=int, help="events emitted for throughput (default 2000, --quick 100)"
    )
    parser.add_argument("--clients", type=int, default=8, help="concurrent emitting clients (default 8)")
    parser.add_argument(
        "--leases", type=int, help="events leased per lease-rate round (default 3000, --quick 300)"
    )
    parser.add_argument("--workers", type=int, default=4, help="concurrent leases (default 4)")
    parser.add_argument(
        "--history", type=int, help="processed events for flatness (default 1000000, --quick 2000)"
    )
    parser.add_argument("--repeat", type=int, help="lease-rate rounds, best kept (default 2, --quick 1)")
    args = parser.parse_args()
    report = Report("events")
    count = args.events or (100 if args.quick else 2000)
    with workdir() as base:
        dialects = chosen_dialects(args)
        for dialect in dialects:
            print(f"events on {dialect}: emit {count} with {args.clients} clients", flush=True)
            measure_throughput(dialect, base, count=count, clients=args.clients, report=report)
        if "postgresql" in dialects:
            history = args.history or (2000 if args.quick else 1_000_000)
            print(f"events lease rate on postgresql: 0 vs {history:,} processed events", flush=True)
            measure_lease_flatness(
                base,
                count=args.leases or (300 if args.quick else 3000),
                workers=args.workers,
                history=history,
                repeat=args.repeat or (1 if args.quick else 2),
                report=report,
            )
    finish(report, args)


if __name__ == "__main__":
    main()
