"""The Docker engine container tests run against, and the images loaded into it.

`scripts/test.sh` (and `scripts/with-docker.sh`) start a private engine, load the test images
(`tests/support/docker_images.py`) and export its address as `CONVEYOR_TEST_DOCKER_HOST`. Container tests
never skip on their own: without an engine they fail, saying how to provide one. `CONVEYOR_TEST_DOCKER=0`
skips them deliberately, and the run's summary says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import httpx
import pytest

from tests.support.docker_images import IMAGES

HOST_VARIABLE = "CONVEYOR_TEST_DOCKER_HOST"
SWITCH_VARIABLE = "CONVEYOR_TEST_DOCKER"
SKIPPED = f"{SWITCH_VARIABLE}=0: the container tests are skipped deliberately"
HOW_TO_PROVIDE = (
    "run the tests through scripts/test.sh (make test) or scripts/with-docker.sh, which start a private "
    f"Docker engine (as root), or set {HOST_VARIABLE} to a running engine's socket (Docker's or Podman's; "
    f"the test images load with `python -m tests.support.docker_images ensure`), or set {SWITCH_VARIABLE}=0 "
    "to skip the container tests (docs/operations.md)"
)


@dataclass(frozen=True)
class DockerEngine:
    """The test run's engine: its address and the references of the test images in it."""

    host: str
    busybox: str = IMAGES["busybox"]
    debian: str = IMAGES["debian"]


def skipped_deliberately() -> bool:
    """Whether this run skips container tests on purpose (`CONVEYOR_TEST_DOCKER=0`)."""
    return os.environ.get(SWITCH_VARIABLE, "1") == "0"


def _client(host: str) -> httpx.Client:
    parts = urlsplit(host)
    if parts.scheme == "unix":
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=parts.path), base_url="http://docker", timeout=10
        )
    return httpx.Client(base_url=host.replace("tcp://", "http://", 1), timeout=10)


def engine_for_tests() -> DockerEngine:
    """The engine named by the environment, checked to answer and to hold the test images; else fail or skip."""
    if skipped_deliberately():
        pytest.skip(SKIPPED)
    host = os.environ.get(HOST_VARIABLE)
    if not host:
        pytest.fail(
            f"no Docker engine for the container tests ({HOST_VARIABLE} is not set): {HOW_TO_PROVIDE}"
        )
    try:
        with _client(host) as client:
            client.get("/_ping").raise_for_status()
            missing = [
                reference
                for reference in IMAGES.values()
                if client.get(f"/images/{quote(reference, safe='')}/json").status_code == 404
            ]
    except httpx.HTTPError as exc:
        pytest.fail(f"the Docker engine at {HOST_VARIABLE}={host} does not answer ({exc}): {HOW_TO_PROVIDE}")
    if missing:
        pytest.fail(
            f"the Docker engine at {host} lacks the test images {', '.join(missing)}: "
            f"python -m tests.support.docker_images ensure --host {host}"
        )
    return DockerEngine(host=host)
