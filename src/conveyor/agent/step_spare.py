"""Step processes started ahead of need, so a step does not wait for an interpreter to start.

A step process (`python -m conveyor.agent.step`) imports Conveyor, the SDK and the workflow loader, says
`ready` on its control channel and then waits for its `run` message. The runner keeps one such spare: a
step takes it when it fits (same interpreter, same start-up environment) and a new spare is started at once
for the next step. Each step still gets a process of its own, so isolation between steps is unchanged. A
spare that died or never became ready is thrown away and the step starts a process of its own instead.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from conveyor.agent.signals import signal_group

READY_TIMEOUT_S = 10.0
DROP_WAIT_S = 1.0
STREAM_LIMIT = 1024 * 1024
CONTROL_LIMIT = 16 * 1024 * 1024
# Variables the interpreter or the dynamic loader read when the process starts; setting them later (as a
# spare's `run` does for the rest of the step environment) would not have the same effect.
STARTUP_PREFIXES = ("PYTHON", "LD_", "DYLD_")


def startup_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The part of an environment that only takes effect when a process starts."""
    return {name: value for name, value in env.items() if name.upper().startswith(STARTUP_PREFIXES)}


def spare_fits(spare_python: str, spare_env: Mapping[str, str], python: str, env: Mapping[str, str]) -> bool:
    """Whether a spare started with (`spare_python`, `spare_env`) can run a step that wants (`python`, `env`)."""
    return spare_python == python and startup_environment(spare_env) == startup_environment(env)


@dataclass
class StepProcess:
    """A started step process and the runner's end of its control channel."""

    process: asyncio.subprocess.Process
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    python: str
    env: dict[str, str]

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self.reader.at_eof()

    def discard(self) -> None:
        """Kill it (it runs in a session of its own) and close its channel."""
        if self.process.returncode is None:
            signal_group(self.process.pid, signal.SIGKILL)
        self.writer.close()


async def spawn_step(python: str, env: Mapping[str, str], cwd: Path) -> StepProcess:
    """Start `python -m conveyor.agent.step` in its own session, its control socket as `CONVEYOR_CONTROL_FD`."""
    parent, child_socket = socket.socketpair()
    try:
        process = await asyncio.create_subprocess_exec(
            python,
            "-m",
            "conveyor.agent.step",
            cwd=cwd,
            env={**env, "CONVEYOR_CONTROL_FD": str(child_socket.fileno())},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            pass_fds=(child_socket.fileno(),),
            limit=STREAM_LIMIT,
        )
    except BaseException:
        parent.close()
        raise
    finally:
        child_socket.close()
    reader, writer = await asyncio.open_unix_connection(sock=parent, limit=CONTROL_LIMIT)
    return StepProcess(process, reader, writer, python, dict(env))


async def wait_ready(step: StepProcess, timeout: float = READY_TIMEOUT_S) -> bool:
    """Consume the step's `ready` line; False when it died or stayed silent for `timeout` seconds."""
    try:
        line = await asyncio.wait_for(step.reader.readline(), timeout)
    except (TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError):
        return False
    return is_ready_line(line)


def is_ready_line(line: bytes) -> bool:
    """Whether a JSON line is the `ready` a step process or a `--wait` runner says once it has imported."""
    try:
        message = json.loads(line)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("type") == "ready"


class StepSpares:
    """Up to `size` spare step processes, started in the background and handed to the next steps that fit.

    Two by default: the setup's inspection takes one and the first step must not wait for its replacement.
    """

    def __init__(self, cwd: Path, size: int = 2) -> None:
        self.cwd = cwd
        self.size = size
        self._spares: list[tuple[str, dict[str, str], asyncio.Task[StepProcess | None]]] = []
        self.pids: set[int] = set()
        self.preload_containers = False

    def prepare_for_containers(self) -> None:
        """Have every spare, now and later, import the container exec client while it waits (a container job:
        docs/design/containers.md §3), so the job's first `ctx.sh` does not pay for the import."""
        self.preload_containers = True
        for _, _, task in self._spares:
            if task.done() and not task.cancelled() and task.exception() is None:
                spare = task.result()
                if spare is not None:
                    _send_preload(spare)

    def refill(self, python: str, env: Mapping[str, str]) -> None:
        """Start spares for (`python`, `env`) until there are `size`."""
        while len(self._spares) < self.size:
            wanted = dict(env)
            self._spares.append((python, wanted, asyncio.ensure_future(self._start(python, wanted))))

    async def _start(self, python: str, env: dict[str, str]) -> StepProcess | None:
        try:
            step = await spawn_step(python, env, self.cwd)
        except OSError:
            return None
        self.pids.add(step.process.pid)
        if not await wait_ready(step):
            step.discard()
            return None
        if self.preload_containers:
            _send_preload(step)
        return step

    async def take(self, python: str, env: Mapping[str, str]) -> StepProcess | None:
        """The oldest spare that fits and is alive and ready; None otherwise (then start a process yourself).

        Spares that do not fit are dropped. A fitting spare that is still starting is waited for: it is
        further along than a new process.
        """
        while self._spares:
            spare_python, spare_env, task = self._spares.pop(0)
            if not spare_fits(spare_python, spare_env, python, env):
                await _drop(task)
                continue
            try:
                spare = await asyncio.shield(task)
            except Exception:
                continue
            if spare is None:
                continue
            if not spare.alive:
                spare.discard()
                continue
            self.pids.discard(spare.process.pid)
            return spare
        return None

    async def close(self) -> None:
        """Kill the spares, started or still starting."""
        spares, self._spares = self._spares, []
        for _, _, task in spares:
            await _drop(task)
        for pid in self.pids:
            signal_group(pid, signal.SIGKILL)
        self.pids.clear()


def _send_preload(step: StepProcess) -> None:
    if step.alive:
        step.writer.write(b'{"type": "preload", "what": "containers"}\n')


async def _drop(task: asyncio.Task[StepProcess | None]) -> None:
    task.cancel()
    # Bounded: a task cancelled inside `create_subprocess_exec` can wait for ever on Python 3.11. A spare
    # left starting exits by itself once the runner is gone (its control channel reads end-of-file).
    await asyncio.wait({task}, timeout=DROP_WAIT_S)
    if task.done() and not task.cancelled() and task.exception() is None:
        spare = task.result()
        if spare is not None:
            spare.discard()
