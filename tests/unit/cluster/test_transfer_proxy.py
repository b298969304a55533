"""The worker's transfer proxy, its pure parts (docs/design/artifacts.md §4 "Workers"): which coordinators
a request goes to and in what order, which credentials the worker refuses itself, which headers pass."""

from __future__ import annotations

import pytest

from conveyor.artifacts.routes import transport_router
from conveyor.cluster.transfer_proxy import (
    PROXIED_ROUTES,
    Target,
    answer_headers,
    credential_problem,
    forwarded_request_headers,
    http_base_url,
    proxy_targets,
)
from conveyor.events.summon_routes import router as summon_router
from conveyor.model.tokens import hash_token

A = "cvy_job_" + "a" * 64
B = "cvy_job_" + "b" * 64


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://c1:8470", "http://c1:8470"),
        ("http://c1:8470/", "http://c1:8470"),
        ("https://c1.example/prefix/", "https://c1.example/prefix"),
        ("ws://c1:8470/ws/peer", "http://c1:8470"),
        ("wss://c1.example/ci/ws/peer", "https://c1.example/ci"),
        ("  http://c1:8470  ", "http://c1:8470"),
        ("http://c1:8470?x=1#y", "http://c1:8470"),
        ("ftp://c1", None),
        ("c1:8470", None),
        ("http://", None),
        ("", None),
        (None, None),
    ],
)
def test_the_http_base_of_a_dialed_coordinator_url(url: str | None, base: str | None) -> None:
    assert http_base_url(url) == base


def test_the_owner_comes_first_then_the_other_coordinators_by_id() -> None:
    sessions = [
        ("c3", "coordinator", "http://c3:1"),
        ("c1", "coordinator", "http://c1:1"),
        ("c2", "coordinator", "ws://c2:1/ws/peer"),
    ]
    assert proxy_targets("c2", sessions) == [
        Target("c2", "http://c2:1"),
        Target("c1", "http://c1:1"),
        Target("c3", "http://c3:1"),
    ]
    # An owner that is not connected: the others, by id.
    assert [t.peer_id for t in proxy_targets("gone", sessions)] == ["c1", "c2", "c3"]
    assert [t.peer_id for t in proxy_targets(None, sessions)] == ["c1", "c2", "c3"]


def test_workers_sessions_without_a_url_and_duplicates_are_not_targets() -> None:
    sessions = [
        ("w2", "worker", "http://w2:1"),
        ("c1", "coordinator", None),  # accepted, not dialed: no URL to send HTTP to
        ("c2", "coordinator", "not a url"),
        ("c3", "coordinator", "http://c3:1"),
        ("c3", "coordinator", "http://c3-other:1"),
    ]
    assert proxy_targets("c1", sessions) == [Target("c3", "http://c3:1")]
    assert proxy_targets("c1", []) == []


def test_configured_urls_no_session_came_through_come_last() -> None:
    # A session dropped for missed heartbeats leaves its coordinator's HTTP routes working.
    sessions = [("c2", "coordinator", "http://c2:1")]
    configured = ["http://c1:1", "http://c2:1/", "ws://c3:1/ws/peer", "junk", "http://c1:1"]
    assert proxy_targets("c1", sessions, configured) == [
        Target("c2", "http://c2:1"),
        Target("http://c1:1", "http://c1:1"),
        Target("http://c3:1", "http://c3:1"),
    ]
    assert proxy_targets(None, [], ["http://c1:1"]) == [Target("http://c1:1", "http://c1:1")]


HOLDERS = {hash_token(A): "job-a", hash_token(B): "job-b"}


@pytest.mark.parametrize(
    ("job_id", "authorization", "answer"),
    [
        ("job-a", f"Bearer {A}", None),
        ("job-a", f"bearer   {A} ", None),
        ("job-b", f"Bearer {B}", None),
        # Another held job's credential, for a held job or for one this worker does not hold.
        ("job-a", f"Bearer {B}", (403, "forbidden")),
        ("job-x", f"Bearer {A}", (403, "forbidden")),
        # No held job's credential (unknown, or its job ended here).
        ("job-a", "Bearer cvy_job_" + "c" * 64, (401, "invalid_token")),
        ("job-x", "Bearer cvy_job_" + "c" * 64, (401, "invalid_token")),
        ("job-a", "Bearer cvy_agent_" + "a" * 64, (401, "invalid_token")),
        # No credential at all.
        ("job-a", None, (401, "unauthenticated")),
        ("job-a", "", (401, "unauthenticated")),
        ("job-a", "Bearer ", (401, "unauthenticated")),
        ("job-a", f"Basic {A}", (401, "unauthenticated")),
        ("job-a", A, (401, "unauthenticated")),
    ],
)
def test_the_worker_refuses_what_is_no_held_jobs_own_credential(
    job_id: str, authorization: str | None, answer: tuple[int, str] | None
) -> None:
    problem = credential_problem(HOLDERS, job_id, authorization)
    assert (None if problem is None else (problem.status, problem.code)) == answer


def test_nothing_held_refuses_every_credential() -> None:
    problem = credential_problem({}, "job-a", f"Bearer {A}")
    assert problem is not None and problem.status == 401


def test_the_request_headers_a_coordinator_gets() -> None:
    headers = [
        ("Authorization", f"Bearer {A}"),
        ("Content-Type", "application/json"),
        ("Content-Length", "12"),
        ("Range", "bytes=0-9"),
        ("Host", "worker:8470"),
        ("Cookie", "session=x"),
        ("Connection", "keep-alive"),
        ("Transfer-Encoding", "chunked"),
        ("Accept-Encoding", "gzip"),
        ("X-Forwarded-For", "10.0.0.1"),
    ]
    assert forwarded_request_headers(headers) == {
        "authorization": f"Bearer {A}",
        "content-type": "application/json",
        "content-length": "12",
        "range": "bytes=0-9",
        # The bytes travel as they are stored: their digest is checked end to end.
        "accept-encoding": "identity",
    }


def test_the_answer_headers_an_agent_gets() -> None:
    headers = [
        ("Content-Type", "application/octet-stream"),
        ("Content-Length", "10"),
        ("Content-Range", "bytes 0-9/100"),
        ("ETag", '"abc"'),
        ("Connection", "close"),
        ("Keep-Alive", "timeout=5"),
        ("Date", "Mon, 07 Dec 2026 03:00:00 GMT"),
        ("Server", "uvicorn"),
        ("Transfer-Encoding", "chunked"),
        ("X-Conveyor-Sha256", "abc"),
    ]
    assert answer_headers(headers) == {
        "Content-Type": "application/octet-stream",
        "Content-Length": "10",
        "Content-Range": "bytes 0-9/100",
        "ETag": '"abc"',
        "X-Conveyor-Sha256": "abc",
    }


def test_the_worker_proxies_every_transport_route_of_the_coordinator() -> None:
    # A transport route added on the coordinator without its proxy would fail only on workers.
    coordinator = {
        (method, route.path)  # type: ignore[attr-defined]
        for router in (transport_router, summon_router)
        for route in router.routes
        for method in route.methods  # type: ignore[attr-defined]
    }
    assert set(PROXIED_ROUTES) == coordinator
