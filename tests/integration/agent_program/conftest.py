"""A real `conveyor agent` process against the fake orchestrator (`tests/support/fake_orchestrator.py`)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.fake_orchestrator import FakeOrchestrator
from tests.support.processes import clean_environ, conveyor_command
from tests.support.repos import make_repo
from tests.support.waiting import async_wait_until

T = TypeVar("T")
TOKEN = "cvy_agent_test_token"


async def until(condition: Callable[[], T], *, what: str, timeout: float = 30.0) -> T:
    """Wait (without blocking the fake's event loop) until `condition()` is truthy."""

    async def check() -> T:
        return condition()

    return await async_wait_until(check, timeout=timeout, what=what)


class AgentProcess:
    """`conveyor agent` as a subprocess with its own home; output goes to a log file."""

    def __init__(self, home: Path, url: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = home.parent / f"{home.name}-{len(list(home.parent.glob(home.name + '-*.log')))}.log"
        self._log = open(self.log_path, "w")
        environ = {
            "CONVEYOR_LOG_FORMAT": "text",
            "CONVEYOR_LOG_LEVEL": "debug",
            "CONVEYOR_KILL_GRACE_MS": "500",
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            conveyor_command(
                "agent", "--url", url, "--token", TOKEN, "--home", str(home), "--labels", "linux", *args
            ),
            env=clean_environ(environ),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def output(self) -> str:
        """What the agent logged so far."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    async def wait_exit(self, timeout: float = 30.0) -> int:
        """Until the agent exits; its exit code."""
        await until(
            lambda: self.proc.poll() is not None, what=f"the agent to exit:\n{self.output()}", timeout=timeout
        )
        return int(self.proc.returncode)

    def outbox_lines(self) -> list[dict[str, Any]]:
        """Entries in `<home>/outbox.jsonl` (acknowledged or not)."""
        path = self.home / "outbox.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        """Kill it if still running and close the log."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


@pytest.fixture
async def fake() -> AsyncIterator[FakeOrchestrator]:
    """The fake orchestrator, listening."""
    async with FakeOrchestrator() as orchestrator:
        yield orchestrator
        assert not orchestrator.invalid, orchestrator.invalid


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git repository with the compiled `ci` workflow (`build`, `test`)."""
    return make_repo(tmp_path_factory.mktemp("agent-program") / "repo")


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    """Start agents (same home by default, so a restart is another call); all are killed at the end."""
    started: list[AgentProcess] = []

    def start(
        url: str, *args: str, home: Path | None = None, env: dict[str, str] | None = None
    ) -> AgentProcess:
        agent = AgentProcess(home or tmp_path / "home", url, *args, env=env)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()
