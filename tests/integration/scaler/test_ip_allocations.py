"""Guest addresses in `ip_allocations` (coordinators share the pool), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

from conveyor.db.engine import Database
from conveyor.scaler.ip_allocations import DatabaseIpAllocator


def allocator(database: Database, node: str = "node-a", cidr: str = "10.200.0.0/24") -> DatabaseIpAllocator:
    return DatabaseIpAllocator(database, node, cidr, "10.200.0.1")


async def test_each_vm_gets_its_own_address_and_keeps_it(database: Database) -> None:
    pool = allocator(database)
    assert await pool.allocate("vm-1") == "10.200.0.2"
    assert await pool.allocate("vm-2") == "10.200.0.3"
    assert await pool.allocate("vm-1") == "10.200.0.2"
    assert await pool.allocations() == {"vm-1": "10.200.0.2", "vm-2": "10.200.0.3"}


async def test_a_released_address_is_handed_out_again(database: Database) -> None:
    pool = allocator(database)
    await pool.allocate("vm-1")
    await pool.allocate("vm-2")
    await pool.release("vm-1")
    await pool.release("vm-unknown")
    assert await pool.allocate("vm-3") == "10.200.0.2"


async def test_an_exhausted_network_allocates_nothing(database: Database) -> None:
    pool = allocator(database, cidr="10.200.0.0/30")  # hosts .1 (gateway) and .2
    assert await pool.allocate("vm-1") == "10.200.0.2"
    assert await pool.allocate("vm-2") is None
    assert set(await pool.allocations()) == {"vm-1"}


async def test_two_coordinators_never_hand_out_the_same_address(database: Database) -> None:
    first, second = allocator(database, "node-a"), allocator(database, "node-b")
    vms = [f"vm-{n}" for n in range(12)]

    ips = await asyncio.gather(*((first if n % 2 else second).allocate(vm) for n, vm in enumerate(vms)))

    assert len(set(ips)) == len(vms) and None not in ips
    assert await first.allocations() == dict(zip(vms, ips, strict=True))
