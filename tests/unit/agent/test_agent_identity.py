"""The agent's labels, id and reconnect backoff (pure functions)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from conveyor.agent.connection import backoff_ceiling, backoff_delay, close_action
from conveyor.agent.identity import agent_labels, automatic_labels, load_agent_id, parse_labels
from conveyor.agent.program import runner_environment
from conveyor.cli.agent import default_home


@pytest.mark.parametrize(
    ("system", "machine", "expected_os", "expected_arch"),
    [
        ("Linux", "x86_64", "linux", "x86_64"),
        ("Linux", "aarch64", "linux", "arm64"),
        ("Darwin", "arm64", "macos", "arm64"),
        ("Windows", "AMD64", "windows", "x86_64"),
    ],
)
def test_automatic_labels(system: str, machine: str, expected_os: str, expected_arch: str) -> None:
    assert automatic_labels(system=system, machine=machine, hostname="Build-01") == [
        f"conveyor:os:{expected_os}",
        f"conveyor:arch:{expected_arch}",
        "conveyor:host:build-01",
    ]


def test_configured_labels_come_first_and_reserved_ones_are_refused() -> None:
    assert parse_labels(["linux, GPU", "gpu,docker", ""]) == ["linux", "gpu", "docker"]
    labels = agent_labels(["linux", "gpu"], system="Linux", machine="x86_64", hostname="h")
    assert labels == ["linux", "gpu", "conveyor:os:linux", "conveyor:arch:x86_64", "conveyor:host:h"]
    with pytest.raises(ValueError, match="conveyor:os:windows"):
        agent_labels(["conveyor:os:windows"])


def test_the_agent_id_is_created_once_in_the_home(tmp_path: Path) -> None:
    first = load_agent_id(tmp_path)
    assert first and (tmp_path / "agent_id").read_text().strip() == first
    assert load_agent_id(tmp_path) == first
    assert load_agent_id(tmp_path, "configured") == "configured"


def test_backoff_doubles_from_one_second_to_thirty_with_full_jitter() -> None:
    assert [backoff_ceiling(attempt) for attempt in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff_ceiling(500) == 30
    rng = random.Random(7)
    for attempt in range(10):
        delays = [backoff_delay(attempt, rng) for _ in range(200)]
        assert all(0 <= delay <= backoff_ceiling(attempt) for delay in delays)
        assert max(delays) > backoff_ceiling(attempt) * 0.8, "jitter spans the whole range"
        assert min(delays) < backoff_ceiling(attempt) * 0.2


class FixedRandom(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


def test_backoff_schedule_with_an_injected_random_source() -> None:
    rng = FixedRandom()
    assert [backoff_delay(attempt, rng) for attempt in range(6)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]


@pytest.mark.parametrize(
    ("code", "draining", "ephemeral", "idle", "expected"),
    [
        (4010, False, False, True, 3),
        (4003, False, False, True, 3),
        (4008, False, False, False, 3),
        (1000, False, False, True, None),
        (1000, True, False, True, 0),
        (1000, False, True, True, 0),
        (1000, True, False, False, None),  # a job still running: reconnect to report it
        (1001, True, True, True, None),
        (4006, False, False, True, None),
        (4031, False, False, True, None),
        (None, False, False, True, None),
    ],
)
def test_close_codes(
    code: int | None, draining: bool, ephemeral: bool, idle: bool, expected: int | None
) -> None:
    assert close_action(code, draining=draining, ephemeral=ephemeral, idle=idle) == expected


def test_the_runner_never_sees_the_agent_token() -> None:
    env = runner_environment(
        {"PATH": "/bin", "CONVEYOR_AGENT_TOKEN": "secret", "CONVEYOR_KILL_GRACE_MS": "5"}
    )
    assert env == {"PATH": "/bin", "CONVEYOR_KILL_GRACE_MS": "5"}


def test_default_home() -> None:
    assert default_home({"CONVEYOR_AGENT_HOME": "/a"}) == Path("/a")
    assert default_home({"CONVEYOR_HOME": "/c"}) == Path("/c/agent")
    assert default_home({}) == Path.home() / ".conveyor" / "agent"
