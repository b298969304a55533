"""A worker's proxy of its agents' artifact and cache routes (docs/design/artifacts.md §4 "Workers",
docs/design/caches.md §6).

An agent connected to a database-less worker sends the coordinator's transfer routes (uploads, commits,
listings, downloads with `Range`, test reports, cache lookups, contents and saves) to its worker, with the
job's credential as the coordinator minted it. The worker answers at once, without contacting anyone, when
the credential is no held job's (401) or another held job's (403); otherwise it forwards the request and
its answer unchanged to a coordinator — the job's owner first, then the other connected ones, then the
configured URLs — streaming both ways, and that coordinator checks the credential again against the
database. A coordinator that cannot be connected to is skipped for the next one (nothing was sent yet); a
failure after that is a 502, and no coordinator reachable a 503, both JSON in the server's error shape,
which the agent's retry rules already read.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter
from starlette.requests import ClientDisconnect

from conveyor.artifacts.routes import UPLOAD_PREFIX
from conveyor.http.parts import parts_of
from conveyor.model.errors import ApiError
from conveyor.model.tokens import hash_token
from conveyor.parts import PartKey

log = logging.getLogger(__name__)

JOB_PREFIX = "/api/v1/jobs/{job_id}"
# The coordinator's transport routes (conveyor.artifacts.routes.transport_router), which a worker forwards.
PROXIED_ROUTES: tuple[tuple[str, str], ...] = (
    ("PUT", UPLOAD_PREFIX + "{job_id}"),
    ("POST", JOB_PREFIX + "/artifacts"),
    ("GET", JOB_PREFIX + "/artifacts"),
    ("GET", JOB_PREFIX + "/artifacts/{name}/content"),
    ("POST", JOB_PREFIX + "/test-reports"),
    ("POST", JOB_PREFIX + "/caches/lookup"),
    ("GET", JOB_PREFIX + "/caches/content"),
    ("POST", JOB_PREFIX + "/caches"),
    ("POST", JOB_PREFIX + "/summons"),  # docs/design/execution.md §8.6
    ("GET", JOB_PREFIX + "/summons/{run_id}"),
)
# What of the agent's request the coordinator needs; everything else (hop-by-hop headers, the host, cookies)
# stays here. `Content-Length` lets the coordinator refuse an oversized upload before a byte is read.
FORWARDED_REQUEST_HEADERS = ("authorization", "content-type", "content-length", "range")
# Hop-by-hop headers (RFC 9110, "Connection") belong to one connection, not to the answer.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# The worker's own server writes these on the answer it sends.
ANSWER_DROPPED = HOP_BY_HOP | {"date", "server"}
CONNECT_TIMEOUT_S = 10.0
# An upload's answer comes once the coordinator stored the whole blob (an object store may take a while);
# a download's pieces come as fast as the coordinator reads them.
IO_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Target:
    """A coordinator the worker can forward to: its instance id and HTTP base URL."""

    peer_id: str
    base_url: str


def http_base_url(url: str | None) -> str | None:
    """The `http(s)://host:port[/prefix]` of a coordinator from the URL the worker dialed (`http(s)://` or
    `ws(s)://…/ws/peer`); None when it is no such URL (pure)."""
    if not url:
        return None
    parts = urlsplit(url.strip())
    scheme = {"http": "http", "https": "https", "ws": "http", "wss": "https"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        return None
    path = parts.path.rstrip("/")
    if path.endswith("/ws/peer"):
        path = path[: -len("/ws/peer")]
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def proxy_targets(
    owner: str | None, sessions: Iterable[tuple[str, str, str | None]], configured: Iterable[str] = ()
) -> list[Target]:
    """Where to forward a held job's request, in order (pure).

    The job's owner first (it offered the job; any coordinator can check the credential, the database being
    shared), then the other connected coordinators by instance id, then the configured coordinator URLs
    (`--coordinator`) no session came through, named by their URL. The HTTP port does not depend on the
    peer channel: a session that dropped for a few missed heartbeats leaves its coordinator's routes
    working, and an agent's download is not retried, so a worker whose sessions flap still tries them.
    `sessions` are (peer id, role, dialed URL); one without a usable URL (not dialed by this node) is skipped.
    """
    found: dict[str, Target] = {}
    for peer_id, role, url in sessions:
        base = http_base_url(url)
        if role == "coordinator" and base is not None and peer_id not in found:
            found[peer_id] = Target(peer_id, base)
    ordered = sorted(found.values(), key=lambda target: (target.peer_id != owner, target.peer_id))
    bases = {target.base_url for target in ordered}
    for url in configured:
        base = http_base_url(url)
        if base is not None and base not in bases:
            bases.add(base)
            ordered.append(Target(base, base))
    return ordered


def credential_problem(holders: Mapping[str, str], job_id: str, authorization: str | None) -> ApiError | None:
    """Why the worker refuses a request for `job_id` without asking a coordinator, or None (pure).

    `holders` maps the SHA-256 of each held job's credential to its job id. The answers are the coordinator's
    (docs/design/artifacts.md §4): 401 for no credential or one no held job has (unknown, or its job ended
    here), 403 for a held job's credential used for another job — held here or not, so a worker is never a
    way to reach a job it does not run."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return ApiError(
            401, "unauthenticated", "send the job's credential as Authorization: Bearer cvy_job_…"
        )
    holder = holders.get(hash_token(token))
    if holder is None:
        return ApiError(401, "invalid_token", "the job credential is unknown or its job has ended")
    if holder != job_id:
        return ApiError(403, "forbidden", "this credential belongs to another job")
    return None


def forwarded_request_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The agent's headers the coordinator gets (pure). The bytes travel as they are: no content coding."""
    kept = {name.lower(): value for name, value in headers if name.lower() in FORWARDED_REQUEST_HEADERS}
    kept["accept-encoding"] = "identity"
    return kept


def answer_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The coordinator's answer headers the agent gets: all but the hop-by-hop ones and those the worker's
    server writes itself (pure)."""
    return {name: value for name, value in headers if name.lower() not in ANSWER_DROPPED}


@dataclass(frozen=True)
class ProxyMetrics:
    """`conveyor_worker_transfers_total{outcome}`: `forwarded` (a coordinator answered, whatever it said),
    `refused` (the worker's own 401/403), `unreachable` (503: no coordinator could be connected to),
    `failed` (502), `abandoned` (the agent's upload ended early);
    `conveyor_worker_transfer_failovers_total`: coordinators skipped for the next."""

    requests: Counter
    failovers: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> ProxyMetrics:
        """The collectors in `registry` (a private one when None)."""
        registry = registry if registry is not None else CollectorRegistry()
        return cls(
            Counter(
                "conveyor_worker_transfers_total",
                "Agents' artifact and cache requests on a worker, by outcome",
                ["outcome"],
                registry=registry,
            ),
            Counter(
                "conveyor_worker_transfer_failovers_total",
                "Coordinators a worker could not connect to and skipped for the next",
                registry=registry,
            ),
        )


class _Body:
    """An upload's body as the agent sends it, noting whether the coordinator was given any of it (a
    coordinator that took part of an upload cannot be swapped for another)."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self.started = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        async for chunk in self._chunks:
            yield chunk


class TransferProxy:
    """The worker's forwarding of its agents' transfer routes; a component (the HTTP client's lifetime)."""

    def __init__(
        self,
        worker: Any,
        *,
        metrics: ProxyMetrics | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.worker = worker  # cluster.worker.WorkerService: held jobs and the coordinator sessions
        self.metrics = metrics if metrics is not None else ProxyMetrics.create()
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        """Open the client. No kept-alive connections: a pooled connection the coordinator closed meanwhile
        would fail a request after its body began, which could then not be sent elsewhere."""
        self._client = httpx.AsyncClient(
            transport=self._transport,
            limits=httpx.Limits(max_keepalive_connections=0),
            timeout=httpx.Timeout(IO_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            # The system's trust store, as the peer channel's dialer uses (SSL_CERT_FILE honoured).
            verify=ssl.create_default_context(),
            follow_redirects=False,
        )

    async def stop(self) -> None:
        """Close the client."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def holders(self) -> dict[str, str]:
        """SHA-256 of each held job's credential → its job id."""
        return {
            hash_token(job.reroute.job_token): job.job_id
            for job in list(self.worker.jobs.values())
            if job.reroute.job_token
        }

    def targets(self, owner: str | None) -> list[Target]:
        """The coordinators to try for a job of `owner`, in order (`proxy_targets`)."""
        peers = self.worker.peers
        sessions = list(peers.sessions.values())
        return proxy_targets(
            owner,
            ((s.peer_id, s.peer_role, s.url) for s in sessions),
            getattr(peers, "coordinator_urls", ()),
        )

    async def forward(self, request: Request, job_id: str) -> Response:
        """Check the credential against the held jobs, then forward the request and stream the answer."""
        problem = credential_problem(self.holders(), job_id, request.headers.get("authorization"))
        if problem is not None:
            self.metrics.requests.labels("refused").inc()
            raise problem
        job = self.worker.jobs.get(job_id)
        targets = self.targets(job.owner if job is not None else None)
        if not targets:
            self.metrics.requests.labels("unreachable").inc()
            raise ApiError(503, "no_coordinator", "this worker knows no coordinator URL; retry later")
        client = self._client
        if client is None:
            raise ApiError(503, "unavailable", "the worker is stopping")
        # An upload streams through; the other bodies are small JSON the input guard already read.
        body: _Body | bytes = _Body(request.stream()) if request.method == "PUT" else await request.body()
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        path = raw_path.decode("latin-1")
        query = request.url.query
        headers = forwarded_request_headers(request.headers.items())
        unreachable: list[str] = []
        for target in targets:
            url = target.base_url + path + (f"?{query}" if query else "")
            outgoing = client.build_request(request.method, url, headers=headers, content=body)
            try:
                answer = await client.send(outgoing, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as error:
                if isinstance(body, _Body) and body.started:
                    raise self._failed(target, error) from None
                # Nothing reached this coordinator: the next one gets the whole request.
                log.info("job %s: coordinator %s unreachable (%s)", job_id, target.peer_id, _name(error))
                self.metrics.failovers.inc()
                unreachable.append(f"{target.peer_id} ({_name(error)})")
                continue
            except httpx.TransportError as error:
                raise self._failed(target, error) from None
            except ClientDisconnect:
                # The agent went away mid-upload (killed, its connection cut): the coordinator saw the body end
                # early and keeps nothing (docs/design/artifacts.md §4); no one reads this answer.
                log.info("job %s: the agent's upload ended early; the coordinator keeps nothing", job_id)
                self.metrics.requests.labels("abandoned").inc()
                raise ApiError(400, "incomplete_body", "the request body ended early") from None
            self.metrics.requests.labels("forwarded").inc()
            return StreamingResponse(
                _relay(answer, job_id, target),
                status_code=answer.status_code,
                headers=answer_headers(answer.headers.multi_items()),
            )
        self.metrics.requests.labels("unreachable").inc()
        raise ApiError(
            503,
            "coordinator_unavailable",
            f"no coordinator could be reached: {', '.join(unreachable)}; retry later",
        )

    def _failed(self, target: Target, error: Exception) -> ApiError:
        log.warning(
            "proxying to coordinator %s failed after the request began: %s", target.peer_id, _name(error)
        )
        self.metrics.requests.labels("failed").inc()
        return ApiError(
            502, "bad_gateway", f"the request to coordinator {target.peer_id} failed ({_name(error)}); retry"
        )


async def _relay(answer: httpx.Response, job_id: str, target: Target) -> AsyncIterator[bytes]:
    """The answer's bytes as they come (no decoding: the digest is the coordinator's); the upstream
    connection is closed however the agent's side ends. A break mid-answer cuts the agent's answer short,
    which its length or digest check then refuses."""
    try:
        async for piece in answer.aiter_raw():
            yield piece
    except httpx.TransportError as error:
        log.warning(
            "job %s: the answer from coordinator %s broke off (%s)", job_id, target.peer_id, _name(error)
        )
        raise
    finally:
        await answer.aclose()


def _name(error: Exception) -> str:
    return type(error).__name__


TRANSFER_PROXY = PartKey["TransferProxy"]("transfer_proxy")
"""A worker's forwarding of its agents' artifact and cache routes."""


def transfer_proxy(request: Request) -> TransferProxy:
    """The published proxy; 503 before the worker started it."""
    proxy = parts_of(request).get(TRANSFER_PROXY)
    if proxy is None:
        raise ApiError(503, "unavailable", "artifacts are not available on this node yet")
    return proxy


async def _forward(job_id: str, request: Request) -> Response:
    return await transfer_proxy(request).forward(request, job_id)


router = APIRouter()
for _method, _path in PROXIED_ROUTES:
    router.add_api_route(_path, _forward, methods=[_method], include_in_schema=False)
