"""`ingest_max_concurrency` admission (pure decision, and the gate without a database)."""

import asyncio

from conveyor.ingest.gate import OrgGate, may_enter
from tests.support.waiting import async_wait_until


def test_unlimited_always_admits_and_a_limit_admits_below_it() -> None:
    assert may_enter(10_000, None)
    assert may_enter(0, 1) and not may_enter(1, 1)
    assert may_enter(1, 2) and not may_enter(2, 2) and not may_enter(3, 2)


async def test_the_gate_bounds_each_org_separately_and_lets_every_waiter_in_turn() -> None:
    limits = {"a": 1, "b": None}

    async def limit(org: str) -> int | None:
        return limits[org]

    gate = OrgGate(limit)
    most = {"a": 0, "b": 0}
    release = asyncio.Event()

    async def work(org: str) -> None:
        async with gate.slot(org):
            most[org] = max(most[org], gate.active(org))
            await release.wait()

    tasks = [asyncio.create_task(work(org)) for org in ("a", "a", "a", "b", "b", "b")]

    async def all_admitted() -> bool:
        return gate.active("b") == 3 and gate.active("a") == 1

    await async_wait_until(all_admitted, what="b's three and a's one admitted")
    assert gate.active("a") == 1
    release.set()
    await asyncio.gather(*tasks)
    assert most == {"a": 1, "b": 3} and gate.active("a") == gate.active("b") == 0
