"""What a real `conveyor server` (uvicorn) does at the HTTP edge (issue 35, low): forwarded headers are
believed only from CONVEYOR_TRUSTED_PROXIES, a request head must arrive in time, answers over https
carry HSTS. The throttles and the connection handling are in memory, so one database (SQLite) is enough."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http import HTTP
from tests.support.processes import ServerProcess

pytestmark = pytest.mark.slow

FAILURES = "2"
HEAD_TIMEOUT_MS = 600


@pytest.fixture(scope="module")
def untrusting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with the defaults: no trusted proxy."""
    server = ServerProcess(
        tmp_path_factory.mktemp("untrusting"),
        env={
            "CONVEYOR_DASHBOARD_SIGN_IN_MAX_FAILURES": FAILURES,
            "CONVEYOR_HTTP_HEADER_TIMEOUT_MS": str(HEAD_TIMEOUT_MS),
        },
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def behind_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that believes the proxy on loopback."""
    server = ServerProcess(
        tmp_path_factory.mktemp("proxied"),
        env={"CONVEYOR_DASHBOARD_SIGN_IN_MAX_FAILURES": FAILURES, "CONVEYOR_TRUSTED_PROXIES": "127.0.0.1/32"},
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def failed_sign_ins(server: ServerProcess, count: int) -> list[int]:
    """`count` sign-ins with a wrong token, each claiming another client address."""
    return [
        HTTP.post(
            f"{server.url}/ui/sign-in",
            data={"token": "cvy_admin_" + "0" * 64, "next": "/ui/runs"},
            headers={"X-Forwarded-For": f"203.0.113.{n}"},
            timeout=10,
        ).status_code
        for n in range(count)
    ]


def test_a_forwarded_for_header_from_an_untrusted_peer_does_not_dodge_the_sign_in_throttle(
    untrusting: ServerProcess,
) -> None:
    assert failed_sign_ins(untrusting, 3) == [401, 401, 429]


def test_a_trusted_proxy_s_forwarded_for_names_the_client_the_throttle_counts(
    behind_proxy: ServerProcess,
) -> None:
    assert failed_sign_ins(behind_proxy, 3) == [401, 401, 401]


def test_hsts_is_sent_over_https_only_as_a_trusted_proxy_reports_it(
    untrusting: ServerProcess, behind_proxy: ServerProcess
) -> None:
    forwarded = {"X-Forwarded-Proto": "https"}
    assert "strict-transport-security" not in untrusting.get("/health", headers=forwarded).headers
    assert "strict-transport-security" not in behind_proxy.get("/health").headers
    hsts = behind_proxy.get("/health", headers=forwarded).headers.get("strict-transport-security")
    assert hsts == "max-age=31536000"


def test_a_request_head_trickled_slower_than_the_deadline_is_closed(untrusting: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", untrusting.port), timeout=10) as slow:
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        deadline = time.monotonic() + 10
        closed_after = None
        slow.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                slow.sendall(b"X: y\r\n")  # a header line now and then, as a slow client does
                if slow.recv(1024) == b"":
                    closed_after = time.monotonic()
                    break
            except TimeoutError:
                continue
            except OSError:  # reset by the server
                closed_after = time.monotonic()
                break
        assert closed_after is not None, "the server kept a trickling connection open for 10 s"
    # A head sent at once is served as before.
    assert untrusting.get("/health").status_code == 200


def test_a_connection_that_sends_nothing_is_closed_after_the_deadline(
    untrusting: ServerProcess, tmp_path: Path
) -> None:
    with socket.create_connection(("127.0.0.1", untrusting.port), timeout=10) as idle:
        idle.settimeout(10)
        started = time.monotonic()
        assert idle.recv(1024) == b""
        assert time.monotonic() - started < 5
