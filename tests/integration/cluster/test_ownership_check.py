"""`ownership_db_check_timeout_ms` (docs/design/cluster.md §4.4): the owner's check of a rerouted job whose spawn
window lapsed waits for the job's row locks at most this long; past it the check defers, acts on nothing, and
looks again; once the locks are free it takes the job back exactly once (PostgreSQL: row locks).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import select, update

from conveyor.db.engine import Database
from conveyor.db.tables import jobs
from conveyor.model.ids import utc_now
from tests.support.reroute import STARTED, Peers, job_row, offered_through, offers, reroute_service, seen


async def test_a_check_held_up_by_a_row_lock_defers_and_the_job_is_taken_back_once_after(
    pg_database: Database,
) -> None:
    db = pg_database
    peers = Peers("w1", "w2")
    service = reroute_service(db, peers, ownership_db_check_timeout_ms=300)
    try:
        seen(service, "w1", slots=2)
        seen(service, "w2", slots=1)
        job_id = await offered_through(db, service, "w1")
        (offer,) = offers(peers, "w1")
        from conveyor.cluster.messages import JobRerouteAck

        await service.on_ack(
            "w1", JobRerouteAck(message_id=offer["message_id"], job_id=job_id, accepted=True)
        )
        service.disarm_window(job_id)
        async with db.transaction() as conn:  # the window lapsed
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id)
                .values(reroute_window_expires_at=utc_now() - timedelta(seconds=1))
            )
        async with db.transaction() as conn:
            # Another transaction holds the job's row (a long cancel, a stuck writer) while the window timer looks.
            await conn.execute(select(jobs.c.id).where(jobs.c.id == job_id).with_for_update())
            # Bounded: it returns (deferred) instead of waiting for this transaction to end.
            assert not await asyncio.wait_for(service.window_lapsed(job_id, "w1"), timeout=10)
            assert service.metrics.ownership_deferrals._value.get() == 1
            assert job_id in service.windows  # it will look again
            service.disarm_window(job_id)
            assert offers(peers, "w2") == []
            assert service.metrics.redispatches.labels("window")._value.get() == 0
        assert (await job_row(db, job_id)).rerouted_to == "w1"  # the deferral changed nothing
        # The lock is gone: the next look takes the job back, once.
        assert await service.window_lapsed(job_id, "w1")
        assert not await service.window_lapsed(job_id, "w1")
        assert len(offers(peers, "w2")) == 1
        assert service.metrics.redispatches.labels("window")._value.get() == 1
    finally:
        while STARTED:
            await STARTED.pop().stop()
