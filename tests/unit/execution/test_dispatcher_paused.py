"""A draining node's dispatcher claims nothing (docs/design/cluster.md §8)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from conveyor.db.engine import Database
from conveyor.execution.dispatcher import Dispatcher
from conveyor.execution.queue import AgentSlot


class Link:
    """An agent with a free slot; the round must not even ask for it while paused."""

    agent_id = "a1"

    def __init__(self) -> None:
        self.asked = 0

    def free_slot(self) -> AgentSlot | None:
        self.asked += 1
        return cast(AgentSlot, object())

    def idle_since(self) -> float:
        return 0.0

    def bound_job_id(self) -> str | None:
        return None

    async def offer(self, dispatch: Any) -> bool:
        raise AssertionError("nothing is offered while draining")


class NoDatabase:
    def transaction(self) -> Any:
        raise AssertionError("a paused dispatcher claims no dispatch_queue row")


async def ack_timeout() -> int:
    return 10_000


async def test_a_paused_dispatcher_claims_no_row() -> None:
    link = Link()
    dispatcher = Dispatcher(
        db=cast(Database, NoDatabase()),
        resources=cast(Any, None),
        owner=lambda: "c1",
        ack_timeout_ms=ack_timeout,
        max_attempts=5,
        poll_s=1.0,
        log_max_bytes=1024,
        agents={"a1": link},
        paused=lambda: True,
    )
    assert await dispatcher.dispatch_round() == 0
    assert link.asked == 0


async def test_an_unpaused_dispatcher_goes_to_the_queue() -> None:
    dispatcher = Dispatcher(
        db=cast(Database, NoDatabase()),
        resources=cast(Any, None),
        owner=lambda: "c1",
        ack_timeout_ms=ack_timeout,
        max_attempts=5,
        poll_s=1.0,
        log_max_bytes=1024,
        agents={"a1": Link()},
    )
    with pytest.raises(AssertionError, match="claims no dispatch_queue row"):
        await dispatcher.dispatch_round()
