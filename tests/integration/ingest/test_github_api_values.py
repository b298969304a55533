"""Values sent to GitHub's API are percent-encoded: a ref cannot add a query parameter (issue 35, high 1)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs

from conveyor.ingest.providers.base import SourceRow
from conveyor.ingest.providers.github import GitHubProvider
from tests.fakes.github import FakeGitHub


def github_source(api_url: str) -> SourceRow:
    return SourceRow(
        id="s",
        org_id="default",
        name="acme/app",
        kind="github",
        routing_key="github:acme/app",
        repo="acme/app",
        api_url=api_url,
        clone_url=None,
        default_branch="main",
        verify="hmac",
        signature_header=None,
        event_header=None,
        report="statuses",
        enabled=True,
    )


async def no_token(_source_id: str, _name: str) -> str | None:
    return None


async def test_the_lock_fetch_sends_the_ref_as_one_encoded_parameter(repo: Path) -> None:
    with FakeGitHub(repos={"acme/app": repo}) as fake:
        provider = GitHubProvider(no_token)
        assert await provider.fetch_lock(github_source(fake.url), "main&x=1#y") is None
        assert await provider.fetch_lock(github_source(fake.url), "main") is not None
    assert [parse_qs(q) for q in fake.queries] == [{"ref": ["main&x=1#y"]}, {"ref": ["main"]}]


async def test_a_ref_resolved_through_the_commits_api_stays_one_path_segment(repo: Path) -> None:
    with FakeGitHub(repos={"acme/app": repo}) as fake:
        provider = GitHubProvider(no_token)
        assert await provider.resolve_ref(github_source(fake.url), "main?x=1") is None
    assert fake.requests == ["GET /repos/acme/app/commits/main%3Fx=1"] and fake.queries == [""]
