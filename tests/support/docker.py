"""The Docker engine container tests run against, and the images loaded into it.

`scripts/test.sh` (and `scripts/with-docker.sh`) start a private engine, load the test images
(`tests/support/docker_images.py`) and export its address as `CONVEYOR_TEST_DOCKER_HOST`. Container tests
never skip on their own: without an engine they fail, saying how to provide one. `CONVEYOR_TEST_DOCKER=0`
skips them deliberately, and the run's summary says so.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any
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


# --- blocking helpers, for tests that drive real servers from plain functions


def containers(engine: DockerEngine, labels: list[str]) -> list[dict]:
    """The engine's containers (running or not) carrying every `key=value` of `labels`, as listed."""
    with _client(engine.host) as client:
        answer = client.get("/containers/json", params={"all": "1", "filters": json.dumps({"label": labels})})
        answer.raise_for_status()
        return list(answer.json())


def networks(engine: DockerEngine, labels: list[str]) -> list[dict[str, Any]]:
    """The engine's networks carrying every `key=value` of `labels`."""
    with _client(engine.host) as client:
        answer = client.get("/networks", params={"filters": json.dumps({"label": labels})})
        answer.raise_for_status()
        return list(answer.json())


def run_container(engine: DockerEngine, config: dict, name: str | None = None) -> str:
    """Create and start a container; its id."""
    with _client(engine.host) as client:
        created = client.post("/containers/create", params={"name": name} if name else {}, json=config)
        created.raise_for_status()
        container_id = str(created.json()["Id"])
        client.post(f"/containers/{container_id}/start").raise_for_status()
        return container_id


def remove_containers(engine: DockerEngine, labels: list[str]) -> None:
    """Force-remove every container carrying `labels` (a test's safety net)."""
    with _client(engine.host) as client:
        for listed in containers(engine, labels):
            client.delete(f"/containers/{listed['Id']}", params={"force": "1", "v": "1"})


# --- Conveyor inside the Debian test image

REPO_ROOT = Path(__file__).resolve().parents[2]


def agent_in_debian(engine: DockerEngine, *mounts: Path) -> tuple[dict[str, Any], list[str]]:
    """A container scaler label set whose agent runs this checkout on the Debian image's Python, and the volumes.

    Nothing is installed into the image: the checkout's `src` and its virtualenv's site-packages are mounted
    read-only at their own paths and put on PYTHONPATH, so the agent is the code under test. The packages'
    compiled parts are built for the venv's CPython, so it must be the image's 3.11 (Debian bookworm's).
    `mounts` are more host directories the job needs at their own paths (a test's repositories).
    """
    if sys.version_info[:2] != (3, 11):
        pytest.fail(
            "the agent container tests run this checkout's packages on the Debian test image's Python 3.11: "
            f"make the venv with Python 3.11 (this one is {sys.version.split()[0]})"
        )
    site_packages = Path(sysconfig.get_path("purelib"))
    paths = dict.fromkeys([REPO_ROOT, site_packages, *mounts])
    volumes = [
        f"{path}:{path}:ro"
        for path in paths
        if not any(path.is_relative_to(other) and path != other for other in paths)
    ]
    label_set = {
        "image": engine.debian,
        "image_pull_policy": "never",
        "command": ["python3", "-m", "conveyor", "agent"],
        "env": {"PYTHONPATH": f"{REPO_ROOT / 'src'}:{site_packages}", "PYTHONDONTWRITEBYTECODE": "1"},
    }
    return label_set, volumes
