"""`queue_max_depth` (docs/design/execution.md §5): a job that would be enqueued while `pending` rows number
the limit or more fails `queue_full`, visibly (its reason) and counted (`conveyor_queue_full_total`).

The limit is read in the enqueuing transaction itself: the `cluster_settings` column when set,
else the configured default (`CONVEYOR_QUEUE_MAX_DEPTH`, set once at start-up). Counting stops at
the limit, so the check costs at most `queue_max_depth` index entries however deep the queue is.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import cluster_settings, dispatch_queue
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME

QUEUE_MAX_DEPTH = "queue_max_depth"

# Counters of the execution package, exported by the server's `/metrics` next to its own.
REGISTRY = CollectorRegistry()
QUEUE_FULL = Counter(
    "conveyor_queue_full_total", "Jobs failed queue_full (queue_max_depth reached)", registry=REGISTRY
)


@dataclass
class DepthDefault:
    """The configured default of `queue_max_depth` (the server sets it from env/YAML at start-up)."""

    value: int = CLUSTER_KNOBS_BY_NAME[QUEUE_MAX_DEPTH].default or 1000


DEFAULT = DepthDefault()


def queue_full_reason(limit: int) -> str:
    """The visible reason of a job refused by a full queue."""
    return f"queue_full: {limit} jobs already pending (queue_max_depth)"


def room_left(limit: int, pending: int) -> int:
    """How many more jobs may be enqueued (pure; never negative)."""
    return max(0, limit - pending)


async def queue_limit(conn: AsyncConnection) -> int:
    """The effective `queue_max_depth`, read in the caller's transaction."""
    stored = (
        await conn.execute(
            select(cluster_settings.c[QUEUE_MAX_DEPTH]).where(cluster_settings.c.id == "default")
        )
    ).scalar_one_or_none()
    return int(stored) if stored is not None else DEFAULT.value


async def queue_room(conn: AsyncConnection) -> tuple[int, int]:
    """(room left, limit): how many jobs may still be enqueued before the queue is full."""
    limit = await queue_limit(conn)
    pending = (
        select(dispatch_queue.c.job_id).where(dispatch_queue.c.state == "pending").limit(limit).subquery()
    )
    count = (await conn.execute(select(func.count()).select_from(pending))).scalar_one()
    return room_left(limit, int(count)), limit
