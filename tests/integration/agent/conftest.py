"""Real runners and step processes against workflow files in temporary directories, and a real `conveyor
agent` process against the fake orchestrator (`tests/support/fake_orchestrator.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.agent.process import JobProcess
from conveyor.agent.spec import JobSpec
from conveyor.lockfile.compiler import compile_repository
from conveyor.lockfile.models import Lock
from conveyor.lockfile.reader import render_lock
from tests.support.fake_orchestrator import FakeOrchestrator
from tests.support.processes import clean_environ, conveyor_command
from tests.support.repos import GIT_ENV, make_repo
from tests.support.run_local import KILL_GRACE_MS, initialised_repo
from tests.support.waiting import async_wait_until


def write_workflow(root: Path, source: str, name: str = "wf.py") -> Lock:
    """Write `.conveyor/workflows/<name>`, compile, write the lock; returns the lock."""
    workflows = root / ".conveyor" / "workflows"
    workflows.mkdir(parents=True, exist_ok=True)
    (workflows / name).write_text(textwrap.dedent(source))
    result = compile_repository(root)
    assert result.ok, [str(error) for error in result.errors]
    assert result.lock is not None
    (root / ".conveyor" / "conveyor.lock.json").write_bytes(render_lock(result.lock))
    return result.lock


def git(root: Path, *args: str) -> str:
    """Run git in `root` with a fixed identity."""
    completed = subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV}
    )
    return completed.stdout.strip()


def job_spec(lock: Lock, workflow: str = "w", job: str = "j", **overrides: Any) -> JobSpec:
    """A job spec for `workflow`/`job` of `lock`, source already in `<workspace>/src`."""
    entry = lock.workflow(workflow)
    assert entry is not None
    job_entry = next(item for item in entry.jobs if item.name == job)
    document: dict[str, Any] = {
        "job_id": f"job-{job}",
        "run_id": "run-1",
        "workflow": {
            "name": entry.name,
            "file": entry.source.file,
            "content_hash": entry.content_hash,
            "hashed_files": entry.hashed_files,
        },
        "job": job_entry.model_dump(mode="json", by_alias=True),
        "context": {"event": {"type": "push", "branch": "main", "ref": "refs/heads/main"}, "run_id": "run-1"},
        "local": True,
    }
    document.update(overrides)
    return JobSpec.model_validate(document)


@dataclass
class JobRun:
    """Everything a runner reported for one job."""

    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finished(self) -> dict[str, Any]:
        ends = [m for m in self.messages if m["type"] == "job.finished"]
        assert len(ends) == 1, ends
        return ends[0]

    def step(self, name: str) -> dict[str, Any]:
        found = [m for m in self.messages if m["type"] == "step.finished" and m["name"] == name]
        assert len(found) == 1, (name, found)
        return found[0]

    def log_lines(self, step_index: int | None = None) -> list[str]:
        return [
            line["text"]
            for m in self.messages
            if m["type"] == "log" and (step_index is None or m["step_index"] == step_index)
            for line in m["lines"]
        ]

    def log_text(self) -> str:
        return "\n".join(self.log_lines())

    def index_of(self, name: str) -> int:
        return int(self.step(name)["step_index"])


def runner_env(**extra: str) -> dict[str, str]:
    """The test process's environment with a short kill grace."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["CONVEYOR_KILL_GRACE_MS"] = KILL_GRACE_MS
    env.update(extra)
    return env


async def run_job(
    spec: JobSpec,
    workspace: Path,
    process: JobProcess | None = None,
    on_message: Any = None,
    ready: Any = None,
) -> JobRun:
    """Run the job to its end with a real runner (`ready`: a runner started with `--wait`)."""
    process = process or JobProcess(env=runner_env())
    result = JobRun()
    async for message in process.start(spec, workspace, ready=ready):
        result.messages.append(message)
        if on_message is not None:
            await on_message(message, process)
    return result


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A job workspace whose `src` is where tests write workflow files."""
    (tmp_path / "ws" / "src").mkdir(parents=True)
    return tmp_path / "ws"


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
def ci_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
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


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository made by `conveyor init`, committed (the `conveyor run local` tests)."""
    return initialised_repo(tmp_path / "repo")
