"""`github` sources: GitHub-format webhooks; lock and compare through the REST API; commit statuses
or check runs (`report: checks`)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from urllib.parse import quote

import httpx

from conveyor.execution.reports import check_run_fields
from conveyor.ingest.providers.base import (
    Ignored,
    ParsedDelivery,
    Permanent,
    Refused,
    Retryable,
    SourceRow,
    StatusReport,
    read_limited,
)
from conveyor.ingest.providers.forge import normalise_forge
from conveyor.lockfile import LOCK_PATH
from conveyor.lockfile.reader import MAX_LOCK_BYTES
from conveyor.matching import Event

DEFAULT_API_URL = "https://api.github.com"


def _raise_retryable(response: httpx.Response) -> None:
    """5xx, 429 and an exhausted rate limit are transient."""
    if response.status_code >= 500 or response.status_code == 429:
        raise Retryable(f"GitHub API answered {response.status_code}")
    if response.status_code == 403 and response.headers.get("x-ratelimit-remaining") == "0":
        raise Retryable("GitHub API rate limit reached")


SecretLookup = Callable[[str, str], Awaitable[str | None]]


class GitHubProvider:
    """Talks to GitHub's REST API (or a faithful fake of it in tests)."""

    # Its changed files are an API call (compare): the pipeline keeps them in the content cache.
    fetches_changed_files = True

    def __init__(self, secret: SecretLookup, *, timeout_s: float = 10.0) -> None:
        self._secret = secret
        self._timeout_s = timeout_s

    def normalise(
        self, source: SourceRow, delivery: ParsedDelivery, delivery_row_id: str
    ) -> Event | Ignored | Refused:
        """Pushes (branches and tags) and pull requests."""
        return normalise_forge(source, delivery, delivery_row_id)

    async def _headers(self, source: SourceRow, accept: str) -> dict[str, str]:
        headers = {"Accept": accept, "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "conveyor"}
        token = await self._secret(source.id, "api_token")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _repo_url(self, source: SourceRow, repo: str) -> str:
        # The repository may come from a payload: each segment is percent-encoded, so none steers the path.
        return f"{(source.api_url or DEFAULT_API_URL).rstrip('/')}/repos/{quote(repo, safe='/*')}"

    async def _call(
        self, method: str, url: str, headers: dict[str, str], json: object = None
    ) -> httpx.Response:
        try:
            async with httpx.AsyncClient(timeout=self._timeout_s) as client:
                response = await client.request(method, url, headers=headers, json=json)
        except httpx.HTTPError as exc:
            raise Retryable(f"GitHub API unreachable: {exc}") from exc
        _raise_retryable(response)
        return response

    async def resolve_ref(self, source: SourceRow, ref: str) -> str | None:
        """`GET /repos/{repo}/commits/{ref}` → its SHA."""
        url = f"{self._repo_url(source, source.repo)}/commits/{quote(ref, safe='/')}"
        response = await self._call("GET", url, await self._headers(source, "application/vnd.github+json"))
        if response.status_code in (404, 422):
            return None
        if response.status_code != 200:
            raise Permanent(f"GitHub commits API answered {response.status_code}")
        sha = response.json().get("sha")
        return sha if isinstance(sha, str) else None

    async def fetch_lock(
        self, source: SourceRow, sha: str, repo: str | None = None, *, max_bytes: int = MAX_LOCK_BYTES
    ) -> bytes | None:
        """Contents API at the SHA, raw media type; 404 means the commit has no lock.

        The body is streamed and the read stops past `max_bytes` (`LockTooLarge`).
        """
        url = f"{self._repo_url(source, repo or source.repo)}/contents/{LOCK_PATH}"
        headers = await self._headers(source, "application/vnd.github.raw+json")
        try:
            async with httpx.AsyncClient(timeout=self._timeout_s) as client:
                # `params` percent-encodes the ref: a `&` or `#` in it cannot add a parameter or end the query.
                async with client.stream("GET", url, headers=headers, params={"ref": sha}) as response:
                    _raise_retryable(response)
                    if response.status_code == 404:
                        return None
                    if response.status_code != 200:
                        text = (await response.aread())[:200].decode(errors="replace")
                        raise Permanent(f"GitHub contents API answered {response.status_code}: {text}")
                    declared = response.headers.get("content-length")
                    return await read_limited(
                        response.aiter_bytes(),
                        max_bytes,
                        int(declared) if declared and declared.isdigit() else None,
                    )
        except httpx.HTTPError as exc:
            raise Retryable(f"GitHub API unreachable: {exc}") from exc

    async def changed_files(self, source: SourceRow, event: Event) -> list[str] | None:
        """The compare API between `before` and the SHA (used when the payload's list was capped)."""
        if not event.before or not event.sha:
            return None
        url = f"{self._repo_url(source, event.repo)}/compare/{quote(event.before)}...{quote(event.sha)}"
        response = await self._call("GET", url, await self._headers(source, "application/vnd.github+json"))
        if response.status_code != 200:
            return None
        files = response.json().get("files") or []
        return sorted({f["filename"] for f in files if isinstance(f, dict) and "filename" in f})

    async def report(self, source: SourceRow, report: StatusReport) -> str | None:
        """`POST /repos/{repo}/statuses/{sha}`, or a check run for a `report: checks` source."""
        repo = str(report.extra.get("repo") or source.repo)
        if source.report == "checks":
            return await self._check_run(source, repo, report)
        body = {
            "state": report.state,
            "context": report.context,
            "description": report.description[:140],
            **({"target_url": report.target_url} if report.target_url else {}),
        }
        url = f"{self._repo_url(source, repo)}/statuses/{quote(report.sha, safe='')}"
        response = await self._call(
            "POST", url, await self._headers(source, "application/vnd.github+json"), body
        )
        if response.status_code >= 400:
            raise Permanent(f"GitHub statuses API answered {response.status_code}: {response.text[:200]}")
        return None

    async def _check_run(self, source: SourceRow, repo: str, report: StatusReport) -> str:
        """Create the check run at the first report (`POST …/check-runs`), then `PATCH` it by its id.

        Returns the check run's id, which the reporter stores as the row's `external_id`.
        """
        status, conclusion = check_run_fields(report.state, report.description)
        body: dict[str, object] = {
            "name": report.context,
            "status": status,
            "output": {
                "title": report.description[:140],
                "summary": report.description + (f"\n\n{report.details}" if report.details else ""),
            },
        }
        if conclusion is not None:
            body["conclusion"] = conclusion
        if report.target_url:
            body["details_url"] = report.target_url
        reference = report.extra.get("job_id") or report.extra.get("run_id")
        if reference:
            body["external_id"] = str(reference)
        headers = await self._headers(source, "application/vnd.github+json")
        if report.external_id:
            url = f"{self._repo_url(source, repo)}/check-runs/{report.external_id}"
            response = await self._call("PATCH", url, headers, body)
            if response.status_code >= 400:
                raise Permanent(
                    f"GitHub check runs API answered {response.status_code}: {response.text[:200]}"
                )
            return report.external_id
        url = f"{self._repo_url(source, repo)}/check-runs"
        response = await self._call("POST", url, headers, {**body, "head_sha": report.sha})
        if response.status_code >= 400:
            raise Permanent(f"GitHub check runs API answered {response.status_code}: {response.text[:200]}")
        check_run_id = response.json().get("id") if response.content else None
        if not isinstance(check_run_id, int):
            raise Permanent("GitHub check runs API answered without a check run id")
        return str(check_run_id)

    async def clone_credential(self, source: SourceRow) -> str | None:
        """`Authorization` header value for cloning (`x-access-token` basic auth)."""
        token = await self._secret(source.id, "clone_token") or await self._secret(source.id, "api_token")
        if not token:
            return None
        return "Basic " + base64.b64encode(f"x-access-token:{token}".encode()).decode()
