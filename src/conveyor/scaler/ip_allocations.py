"""Firecracker guest addresses in the shared database (`ip_allocations`, docs/design/scaler.md §8).

Coordinators allocate from the table so two orchestrators never hand the same address out; a worker (no
database) uses the in-memory `MemoryIpAllocator` of `conveyor.scaler.firecracker`. The pick is the pure
`pick_ip`; the primary key on `ip` settles a race between coordinators, and the loser retries.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from sqlalchemy import delete, insert, select, text
from sqlalchemy.exc import IntegrityError

from conveyor.db.engine import Database
from conveyor.db.tables import ip_allocations
from conveyor.errors import ConveyorError

ATTEMPTS = 8


def pick_ip(cidr: str, gateway: str, taken: Iterable[str]) -> str | None:
    """The lowest host address of `cidr` that is neither the gateway nor taken; None when the pool is empty."""
    network = ipaddress.ip_network(cidr, strict=False)
    used = {ipaddress.ip_address(gateway)}
    for ip in taken:
        try:
            used.add(ipaddress.ip_address(ip))
        except ValueError:  # a row written by hand; it cannot collide with a valid address
            continue
    return next((str(host) for host in network.hosts() if host not in used), None)


class AllocationContention(ConveyorError):
    """Other coordinators kept taking the picked address (the pool is being drained concurrently)."""


class DatabaseIpAllocator:
    """`IpAllocator` over the `ip_allocations` table (one row per VM, any node)."""

    def __init__(
        self,
        database: Database,
        node_id: str,
        cidr: str,
        gateway: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.database = database
        self.node_id = node_id
        self.cidr = cidr
        self.gateway = gateway
        self.clock = clock

    async def allocate(self, vm_id: str) -> str | None:
        """The VM's address (the same one again for the same VM); None when the network has none left."""
        for _ in range(ATTEMPTS):
            try:
                async with self.database.transaction() as conn:
                    if conn.dialect.name == "postgresql":
                        # Allocations queue behind one lock instead of racing for the lowest free
                        # address, where a burst of N coordinators' VMs could need N attempts.
                        # (SQLite write transactions already start with BEGIN IMMEDIATE.)
                        await conn.execute(
                            text("SELECT pg_advisory_xact_lock(hashtext(:key))"),
                            {"key": f"ip_allocations:{self.cidr}"},
                        )
                    held = await conn.scalar(
                        select(ip_allocations.c.ip).where(ip_allocations.c.vm_id == vm_id)
                    )
                    if held is not None:
                        return str(held)
                    taken = (await conn.scalars(select(ip_allocations.c.ip))).all()
                    ip = pick_ip(self.cidr, self.gateway, taken)
                    if ip is None:
                        return None
                    await conn.execute(
                        insert(ip_allocations).values(
                            ip=ip, vm_id=vm_id, node_id=self.node_id, allocated_at=self.clock()
                        )
                    )
                return ip
            except IntegrityError:
                continue  # another coordinator took this address (or this VM) first: look again
        raise AllocationContention(
            f"could not allocate a guest address in {self.cidr} after {ATTEMPTS} attempts"
        )

    async def release(self, vm_id: str) -> None:
        """Free the VM's address (nothing when it holds none)."""
        async with self.database.transaction() as conn:
            await conn.execute(delete(ip_allocations).where(ip_allocations.c.vm_id == vm_id))

    async def allocations(self) -> dict[str, str]:
        """Every allocation, by VM id (all nodes: the sweep keeps a TAP whose VM still holds an address)."""
        async with self.database.read() as conn:
            rows = (await conn.execute(select(ip_allocations.c.vm_id, ip_allocations.c.ip))).all()
        return {str(vm_id): str(ip) for vm_id, ip in rows}
