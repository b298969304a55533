"""The peer hub applies each job-path message once, retrying it while the database says a retry may succeed
(docs/design/cluster.md §4.5): an ack, a `running` or a log chunk dropped on a transient error is lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError

from conveyor.cluster.messages import JobRerouteAck
from conveyor.cluster.service import HubIdentity, HubSettings, PeerHub


class Session:
    peer_id = "w1"
    peer_role = "worker"


def hub(tmp_path: Path, failures: list[Exception]) -> tuple[PeerHub, list[Any]]:
    applied: list[Any] = []

    async def job_messages(session: Any, message: Any) -> bool:
        if failures:
            raise failures.pop(0)
        applied.append(message)
        return True

    peers = PeerHub(
        identity=HubIdentity("c1", "coordinator", "0", None),
        settings=HubSettings(heartbeat_interval_ms=200, stale_beats=3),
        home=tmp_path,
    )
    peers.job_messages = job_messages
    return peers, applied


ACK = JobRerouteAck(message_id="m1", job_id="j1", accepted=True)


def ended() -> DBAPIError:
    return DBAPIError("UPDATE", {}, Exception("server closed the connection"), connection_invalidated=True)


async def test_a_message_whose_session_the_database_ended_is_applied_on_a_retry(tmp_path: Path) -> None:
    peers, applied = hub(tmp_path, [ended(), ended()])
    assert await peers._apply_job_message(Session(), ACK)  # type: ignore[arg-type]
    assert applied == [ACK]


async def test_an_error_a_retry_cannot_cure_is_raised_at_once(tmp_path: Path) -> None:
    lasting = DBAPIError("UPDATE", {}, Exception("syntax error"))
    peers, applied = hub(tmp_path, [lasting, ended()])
    with pytest.raises(DBAPIError):
        await peers._apply_job_message(Session(), ACK)  # type: ignore[arg-type]
    assert applied == []
