"""The worker's transfer proxy over real sockets (docs/design/artifacts.md §4 "Workers"): the proxy's routes
served by uvicorn, forwarding to a FAKE coordinator (a small app on its own socket that records what it was
sent and answers like the transport routes) or to a port where nothing listens. Held jobs and coordinator
sessions are plain records: what is tested is the forwarding — the order, the failover before any byte was
sent, the 502/503 answers, the credential refusals that reach no coordinator, bodies streamed both ways."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry

from conveyor.cluster.transfer_proxy import TRANSFER_PROXY, ProxyMetrics, TransferProxy, router
from conveyor.model.errors import ApiError
from conveyor.parts import Parts
from tests.support.http import HTTP
from tests.support.processes import free_port
from tests.support.waiting import wait_until

A = "cvy_job_" + "a" * 64
B = "cvy_job_" + "b" * 64
BLOB = bytes(range(256)) * 4096  # 1 MiB


@dataclass
class FakeCoordinator:
    """Records each request (method, path, query, headers, body digest and size) and answers like the
    coordinator's transport routes would."""

    seen: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.api_route("/{path:path}", methods=["GET", "PUT", "POST"])
        async def anything(path: str, request: Request) -> Response:
            digest = hashlib.sha256()
            size = 0
            async for chunk in request.stream():
                digest.update(chunk)
                size += len(chunk)
            self.seen.append(
                {
                    "method": request.method,
                    "path": request.url.path,
                    "raw_path": request.scope["raw_path"].decode(),
                    "query": request.url.query,
                    "headers": dict(request.headers),
                    "sha256": digest.hexdigest(),
                    "size": size,
                }
            )
            if request.method == "GET" and path.endswith("/content"):
                if request.headers.get("range") == "bytes=10-19":
                    return Response(
                        BLOB[10:20], status_code=206, headers={"Content-Range": f"bytes 10-19/{len(BLOB)}"}
                    )
                return StreamingResponse(iter([BLOB[i : i + 65536] for i in range(0, len(BLOB), 65536)]))
            return JSONResponse({"sha256": digest.hexdigest(), "size": size}, status_code=201)

        return app


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """`app` on a real socket (uvicorn in a thread); its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=10, what="the server to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def hanging_up() -> Iterator[tuple[list[int], str]]:
    """A listener that reads the start of each request and closes the connection without an answer; the
    byte counts it read, and its base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[int] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                received.append(len(connection.recv(65536)))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield received, f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        # A shutdown wakes the blocked accept (a close alone leaves it blocked on Linux).
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=10)


def worker_app(
    sessions: list[tuple[str, str | None]],
    owner: str = "c1",
    configured: tuple[str, ...] = (),
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    """The proxy's routes with two held jobs (tokens A and B) of `owner`, these coordinator sessions and
    these configured coordinator URLs."""
    jobs = {
        job_id: SimpleNamespace(job_id=job_id, owner=owner, reroute=SimpleNamespace(job_token=token))
        for job_id, token in (("job-a", A), ("job-b", B))
    }
    peers = SimpleNamespace(
        sessions={
            peer_id: SimpleNamespace(peer_id=peer_id, peer_role="coordinator", url=url)
            for peer_id, url in sessions
        },
        coordinator_urls=list(configured),
    )
    proxy = TransferProxy(SimpleNamespace(jobs=jobs, peers=peers), metrics=ProxyMetrics.create(registry))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await proxy.start()
        yield
        await proxy.stop()

    app = FastAPI(lifespan=lifespan)
    parts = Parts()
    parts.put(TRANSFER_PROXY, proxy)
    app.state.server = SimpleNamespace(parts=parts)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> Response:
        return JSONResponse(exc.body(), status_code=exc.status)

    app.include_router(router)
    return app


def counted(registry: CollectorRegistry) -> dict[str, float]:
    """The proxy's metrics: requests by outcome, and failovers."""
    found = {
        outcome: registry.get_sample_value("conveyor_worker_transfers_total", {"outcome": outcome}) or 0.0
        for outcome in ("forwarded", "refused", "unreachable", "failed", "abandoned")
    }
    found["failovers"] = registry.get_sample_value("conveyor_worker_transfer_failovers_total") or 0.0
    return {name: value for name, value in found.items() if value}


def dead_url() -> str:
    """A port on which nothing listens (a connection is refused)."""
    return f"http://127.0.0.1:{free_port()}"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def coordinator() -> Iterator[tuple[FakeCoordinator, str]]:
    fake = FakeCoordinator()
    with serving(fake.app()) as url:
        yield fake, url


def test_an_upload_streams_through_to_the_owner_with_the_token_unchanged(
    coordinator: tuple[FakeCoordinator, str],
) -> None:
    fake, url = coordinator
    with serving(worker_app([("c1", url), ("c2", dead_url())])) as worker:

        def chunks() -> Iterator[bytes]:
            for start in range(0, len(BLOB), 50_000):
                yield BLOB[start : start + 50_000]

        answer = HTTP.put(
            f"{worker}/api/v1/uploads/job-a?purpose=cache", content=chunks(), headers=auth(A), timeout=30
        )
    assert answer.status_code == 201, answer.text
    assert answer.json() == {"sha256": hashlib.sha256(BLOB).hexdigest(), "size": len(BLOB)}
    (seen,) = fake.seen
    assert (seen["method"], seen["path"], seen["query"]) == ("PUT", "/api/v1/uploads/job-a", "purpose=cache")
    assert seen["headers"]["authorization"] == f"Bearer {A}"
    assert "host" in seen["headers"] and seen["headers"]["host"] != worker.removeprefix("http://")


def test_a_download_streams_back_whole_or_by_range(coordinator: tuple[FakeCoordinator, str]) -> None:
    fake, url = coordinator
    with serving(worker_app([("c1", url)])) as worker:
        whole = HTTP.get(
            f"{worker}/api/v1/jobs/job-b/artifacts/a%20b%25c/content", headers=auth(B), timeout=30
        )
        part = HTTP.get(
            f"{worker}/api/v1/jobs/job-b/artifacts/x/content",
            headers={**auth(B), "Range": "bytes=10-19"},
            timeout=30,
        )
    assert (whole.status_code, whole.content) == (200, BLOB)
    assert (part.status_code, part.content) == (206, BLOB[10:20])
    assert part.headers["content-range"] == f"bytes 10-19/{len(BLOB)}"
    # The name's escapes reach the coordinator as the agent sent them.
    assert fake.seen[0]["raw_path"] == "/api/v1/jobs/job-b/artifacts/a%20b%25c/content"
    assert fake.seen[1]["headers"]["range"] == "bytes=10-19"
    assert fake.seen[1]["headers"]["accept-encoding"] == "identity"


def test_an_unreachable_owner_is_skipped_for_the_next_coordinator(
    coordinator: tuple[FakeCoordinator, str],
) -> None:
    fake, url = coordinator
    registry = CollectorRegistry()
    with serving(worker_app([("c1", dead_url()), ("c2", url)], owner="c1", registry=registry)) as worker:
        answer = HTTP.put(f"{worker}/api/v1/uploads/job-a", content=BLOB, headers=auth(A), timeout=30)
        looked = HTTP.post(
            f"{worker}/api/v1/jobs/job-a/caches/lookup", json={"key": "k"}, headers=auth(A), timeout=30
        )
    assert answer.status_code == 201 and answer.json()["size"] == len(BLOB)
    assert looked.status_code == 201
    assert [(s["method"], s["size"]) for s in fake.seen] == [
        ("PUT", len(BLOB)),
        ("POST", len(b'{"key":"k"}')),
    ]
    assert counted(registry) == {"forwarded": 2, "failovers": 2}


def test_a_configured_coordinator_without_a_session_is_tried_last(
    coordinator: tuple[FakeCoordinator, str],
) -> None:
    fake, url = coordinator
    with serving(worker_app([("c1", dead_url())], configured=(url,))) as worker:
        answer = HTTP.get(f"{worker}/api/v1/jobs/job-a/artifacts", headers=auth(A), timeout=30)
    assert answer.status_code == 201 and len(fake.seen) == 1


def test_no_coordinator_reachable_is_a_503_naming_each(coordinator: tuple[FakeCoordinator, str]) -> None:
    registry = CollectorRegistry()
    with serving(worker_app([("c1", dead_url()), ("c2", dead_url())], registry=registry)) as worker:
        answer = HTTP.get(f"{worker}/api/v1/jobs/job-a/artifacts", headers=auth(A), timeout=30)
    assert counted(registry) == {"unreachable": 1, "failovers": 2}
    assert answer.status_code == 503
    assert answer.json()["error"] == "coordinator_unavailable"
    assert "c1 (ConnectError)" in answer.json()["detail"] and "c2 (ConnectError)" in answer.json()["detail"]
    with serving(worker_app([])) as worker:
        answer = HTTP.get(f"{worker}/api/v1/jobs/job-a/artifacts", headers=auth(A), timeout=30)
    assert (answer.status_code, answer.json()["error"]) == (503, "no_coordinator")


def test_a_coordinator_that_fails_after_the_request_was_sent_is_a_502_and_not_retried_elsewhere(
    coordinator: tuple[FakeCoordinator, str],
) -> None:
    fake, url = coordinator
    registry = CollectorRegistry()
    with (
        hanging_up() as (received, broken),
        serving(worker_app([("c1", broken), ("c2", url)], registry=registry)) as worker,
    ):
        answer = HTTP.put(f"{worker}/api/v1/uploads/job-a", content=BLOB, headers=auth(A), timeout=30)
    assert (answer.status_code, answer.json()["error"]) == (502, "bad_gateway")
    assert "c1" in answer.json()["detail"]
    # c1 was sent the request: it is never sent again elsewhere.
    assert len(received) == 1 and received[0] > 0 and fake.seen == []
    assert counted(registry) == {"failed": 1}


def test_an_upload_the_agent_abandons_mid_body_stores_nothing_and_the_worker_serves_on(
    coordinator: tuple[FakeCoordinator, str],
) -> None:
    fake, url = coordinator
    registry = CollectorRegistry()
    with serving(worker_app([("c1", url)], registry=registry)) as worker:
        host, port = worker.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as agent:
            head = (
                "PUT /api/v1/uploads/job-a HTTP/1.1\r\nHost: worker\r\n"
                f"Authorization: Bearer {A}\r\nContent-Length: {len(BLOB)}\r\n\r\n"
            )
            agent.sendall(head.encode() + BLOB[:100_000])
        # The agent is gone with 90 % of its body unsent: the worker drops the upstream request…
        wait_until(lambda: counted(registry).get("abandoned") == 1, timeout=30, what="the abandoned upload")
        # …which the coordinator never saw complete, and the next request goes through.
        after = HTTP.get(f"{worker}/api/v1/jobs/job-a/artifacts", headers=auth(A), timeout=30)
    assert after.status_code == 201
    assert [(s["method"], s["size"]) for s in fake.seen] == [("GET", 0)]


def test_credentials_the_worker_refuses_reach_no_coordinator(
    coordinator: tuple[FakeCoordinator, str],
) -> None:
    fake, url = coordinator
    registry = CollectorRegistry()
    with serving(worker_app([("c1", url)], registry=registry)) as worker:
        other_job = HTTP.get(f"{worker}/api/v1/jobs/job-a/artifacts", headers=auth(B), timeout=30)
        not_held = HTTP.put(f"{worker}/api/v1/uploads/job-x", content=b"x", headers=auth(A), timeout=30)
        unknown = HTTP.get(
            f"{worker}/api/v1/jobs/job-a/artifacts", headers=auth("cvy_job_" + "0" * 64), timeout=30
        )
        missing = HTTP.get(f"{worker}/api/v1/jobs/job-a/artifacts", timeout=30)
        elsewhere = HTTP.get(f"{worker}/api/v1/admin/runs", headers=auth(A), timeout=30)
    assert (other_job.status_code, other_job.json()["error"]) == (403, "forbidden")
    assert (not_held.status_code, not_held.json()["error"]) == (403, "forbidden")
    assert (unknown.status_code, unknown.json()["error"]) == (401, "invalid_token")
    assert (missing.status_code, missing.json()["error"]) == (401, "unauthenticated")
    assert elsewhere.status_code == 404  # only the transport routes are forwarded
    assert fake.seen == []
    assert counted(registry) == {"refused": 4}
