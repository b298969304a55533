"""The agent's upload retries (docs/design/artifacts.md §4): an artifact's and a cache entry's upload start
again after a retryable failure with a doubling pause, and fail the step after `UPLOAD_ATTEMPTS`."""

from __future__ import annotations

import pytest

from conveyor.agent.transfer import (
    FIRST_PAUSE_S,
    UPLOAD_ATTEMPTS,
    ArtifactClient,
    ArtifactRequestFailed,
    _Retryable,
)


def client(pauses: list[float], lines: list[str]) -> ArtifactClient:
    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    return ArtifactClient("http://127.0.0.1:1", "cvy_job_x", "job", progress=lines.append, sleep=sleep)


async def test_an_upload_that_fails_twice_is_started_again_and_its_result_returned() -> None:
    pauses: list[float] = []
    lines: list[str] = []
    failures = iter(["HTTP 503: busy", "HTTP 409: swept"])

    async def once() -> str:
        failure = next(failures, None)
        if failure is not None:
            raise _Retryable(failure)
        return "committed"

    assert await client(pauses, lines)._retried("cache deps", once) == "committed"
    assert pauses == [FIRST_PAUSE_S, FIRST_PAUSE_S * 2]
    assert lines == [
        f"cache deps: HTTP 503: busy; starting again (2/{UPLOAD_ATTEMPTS})",
        f"cache deps: HTTP 409: swept; starting again (3/{UPLOAD_ATTEMPTS})",
    ]


async def test_an_upload_failing_every_attempt_fails_the_step_with_the_last_error() -> None:
    pauses: list[float] = []
    calls: list[int] = []

    async def once() -> str:
        calls.append(1)
        raise _Retryable(f"HTTP 503: attempt {len(calls)}")

    with pytest.raises(ArtifactRequestFailed) as failed:
        await client(pauses, [])._retried("artifact dist", once)
    assert str(failed.value) == (
        f"artifact dist: the upload failed {UPLOAD_ATTEMPTS} times: HTTP 503: attempt {UPLOAD_ATTEMPTS}"
    )
    assert len(calls) == UPLOAD_ATTEMPTS and len(pauses) == UPLOAD_ATTEMPTS - 1


async def test_a_failure_that_is_not_retryable_is_not_started_again() -> None:
    calls: list[int] = []

    async def once() -> str:
        calls.append(1)
        raise ArtifactRequestFailed("artifact dist: artifact_exists")

    with pytest.raises(ArtifactRequestFailed, match="artifact_exists"):
        await client([], [])._retried("artifact dist", once)
    assert calls == [1]
