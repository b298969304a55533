"""The bare-metal backend: each agent is a child process of the orchestrator (docs/design/scaler.md §6.1).

By default the child is `<the server's python> -m conveyor agent --ephemeral`, so it works when
`conveyor` exists only inside a virtualenv. On POSIX the child leads its own process group and the
teardown signals the group (SIGTERM, the grace, SIGKILL), then SIGKILLs every step group the agent
listed in its home's `running.json`, so grandchildren die too. On Windows the tree is ended with
`taskkill /T /F`, and only while the child is still running.

Output goes to a file (`$CONVEYOR_HOME/scaler/logs/<agent_id>.log`), never a pipe: an agent must
not die of SIGPIPE because the orchestrator did. A record file per agent
(`$CONVEYOR_HOME/scaler/bare-metal/<agent_id>.json {pid, start_time, node, boot}`) backs
`list_live`, so a restarted orchestrator finds the agents of its older boot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import psutil

from conveyor.scaler.backend import (
    LOG_TAIL_BYTES,
    LOG_TAIL_LINES,
    LiveItem,
    ManagedAgent,
    OnEvent,
    ScalerBackend,
    ScalerEntry,
    ScalerEvent,
    SpawnFailed,
    SpawnRequest,
)
from conveyor.scaler.windows_cmd import (
    batch_command_refusals,
    batch_invocation,
    is_batch_launcher,
    taskkill_command,
)

log = logging.getLogger(__name__)

IS_WINDOWS = sys.platform == "win32"
DEFAULT_TERMINATE_GRACE_S = 15.0
GROUP_POLL_S = 0.05
START_TIME_TOLERANCE_S = 0.05

# The parent environment a spawned agent inherits (everything else is dropped).
ALLOWED_ENV = frozenset(
    "PATH HOME USER LOGNAME LANG TZ TMPDIR SYSTEMROOT SYSTEMDRIVE COMSPEC PATHEXT TEMP TMP USERPROFILE "
    "APPDATA LOCALAPPDATA PROGRAMDATA WINDIR".split()
)
AGENT_ENV_PREFIX = "CONVEYOR_AGENT_ENV_"


def default_command() -> list[str]:
    """`<this python> -m conveyor agent --ephemeral`."""
    return [sys.executable, "-m", "conveyor", "agent", "--ephemeral"]


def agent_environment(parent: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The allowlisted part of `parent` (names as spelled there), then `extra` on top (pure)."""
    env = {
        name: value
        for name, value in parent.items()
        if name.upper() in ALLOWED_ENV or name.upper().startswith("LC_")
    }
    env.update(extra)
    return env


def forwarded_agent_env(parent: Mapping[str, str]) -> dict[str, str]:
    """The orchestrator's `CONVEYOR_AGENT_ENV_<NAME>` variables with the prefix removed (pure)."""
    return {
        name[len(AGENT_ENV_PREFIX) :]: value
        for name, value in parent.items()
        if name.upper().startswith(AGENT_ENV_PREFIX) and len(name) > len(AGENT_ENV_PREFIX)
    }


def cgroup_prefix(agent_id: str, cpus: float | None, mem_bytes: int | None) -> list[str]:
    """`systemd-run --user --scope …` for `enforce_cgroups: true` with positive limits (pure)."""
    if not cpus and not mem_bytes:
        return []
    command = [
        "systemd-run",
        "--user",
        "--scope",
        "--quiet",
        f"--unit=conveyor-agent-{agent_id}",
        "--slice=conveyor-scaler.slice",
    ]
    if cpus:
        command += ["-p", f"CPUQuota={round(cpus * 100)}%"]
    if mem_bytes:
        command += ["-p", f"MemoryMax={mem_bytes}"]
    return [*command, "--"]


def read_tail(path: Path, max_lines: int = LOG_TAIL_LINES, max_bytes: int = LOG_TAIL_BYTES) -> list[str]:
    """The last lines of a file (at most `max_lines` and `max_bytes`); empty when it is missing."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first line was cut
    return lines[-max_lines:]


def process_start_time(pid: int) -> float | None:
    """The process's start time (seconds since the epoch), None when it does not exist."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, ValueError):
        return None


def same_process(pid: int, start_time: float | None) -> bool:
    """The pid exists and started when recorded (the pid-reuse guard)."""
    current = process_start_time(pid)
    if current is None or start_time is None:
        return False
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.Error:
        return False
    return abs(current - start_time) < START_TIME_TOLERANCE_S


def _signal_group(pgid: int, signum: int) -> bool:
    """Signal a process group; False when it is gone (ESRCH)."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in the group."""
    if not _signal_group(pgid, 0):
        return False
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return False


async def _group_gone_within(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if not _group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(GROUP_POLL_S)


async def end_process_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the group, wait up to `grace_s` for it to empty, then SIGKILL (POSIX)."""
    if not _signal_group(pgid, signal.SIGTERM):
        return
    if await _group_gone_within(pgid, grace_s):
        return
    _signal_group(pgid, signal.SIGKILL)
    await _group_gone_within(pgid, 5)


def kill_recorded_groups(agent_home: Path, own_group: int) -> list[int]:
    """SIGKILL every step group the agent listed in `running.json` (steps run in their own sessions)."""
    try:
        document = json.loads((agent_home / "running.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    killed: list[int] = []
    for groups in (document.get("jobs") or {}).values():
        for pgid in groups if isinstance(groups, list) else []:
            if isinstance(pgid, int) and pgid > 1 and pgid not in (own_group, os.getpgrp()):
                if _signal_group(pgid, signal.SIGKILL):
                    killed.append(pgid)
    return killed


async def end_recorded_groups(agent_home: Path, own_group: int) -> None:
    """`kill_recorded_groups`, then wait (up to 5 s each) until those groups are gone."""
    for pgid in kill_recorded_groups(agent_home, own_group):
        await _group_gone_within(pgid, 5)


@dataclass
class _Child:
    managed: ManagedAgent
    process: asyncio.subprocess.Process | subprocess.Popen[bytes] | None
    workdir: Path
    log_path: Path
    registered: bool = False
    destroying: bool = False
    watcher: asyncio.Task[None] | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)


class BareMetalBackend(ScalerBackend):
    """Agents as child processes of this orchestrator."""

    type: ClassVar[str] = "bare-metal"
    scaler_keys: ClassVar[frozenset[str]] = frozenset({"command", "enforce_cgroups", "terminate_grace_s"})
    label_set_keys: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, entry: ScalerEntry, context: Any) -> None:
        super().__init__(entry, context)
        self._children: dict[str, _Child] = {}
        base = Path(context.home) / "scaler"
        self.records_dir = base / "bare-metal"
        self.work_dir = base / "work"
        self.logs_dir = base / "logs"

    # --- configuration

    @classmethod
    def validate_entry(cls, entry: ScalerEntry) -> list[str]:
        problems: list[str] = []
        command = entry.options.get("command")
        if command is not None:
            if (
                not isinstance(command, list)
                or not command
                or not all(isinstance(token, str) and token for token in command)
            ):
                problems.append("command: must be a non-empty list of non-empty strings")
            elif is_batch_launcher(command[0]):
                problems.extend(f"command: {refusal}" for refusal in batch_command_refusals(command))
        cgroups = entry.options.get("enforce_cgroups", False)
        if not isinstance(cgroups, bool):
            problems.append("enforce_cgroups: must be true or false")
        elif cgroups and not sys.platform.startswith("linux"):
            problems.append("enforce_cgroups: only available on Linux")
        grace = entry.options.get("terminate_grace_s", DEFAULT_TERMINATE_GRACE_S)
        if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
            problems.append("terminate_grace_s: must be a non-negative number of seconds")
        return problems

    def command(self) -> list[str]:
        configured = self.entry.options.get("command")
        return list(configured) if configured else default_command()

    @property
    def terminate_grace_s(self) -> float:
        return float(self.entry.options.get("terminate_grace_s", DEFAULT_TERMINATE_GRACE_S))

    # --- spawning

    def _argv(self, request: SpawnRequest) -> list[str] | str:
        command = self.command()
        if is_batch_launcher(command[0]):
            refusals = batch_command_refusals(command)
            if refusals:
                raise SpawnFailed("; ".join(refusals))
            if IS_WINDOWS:
                return batch_invocation(command, os.environ).command_line
        if self.entry.options.get("enforce_cgroups") and request.limits is not None:
            command = [
                *cgroup_prefix(request.agent_id, request.limits.cpus, request.limits.mem_bytes),
                *command,
            ]
        return command

    async def spawn(self, request: SpawnRequest, on_event: OnEvent) -> ManagedAgent:
        agent_id = request.agent_id
        workdir = self.work_dir / agent_id
        log_path = self.logs_dir / f"{agent_id}.log"
        managed = ManagedAgent(agent_id=agent_id, scaler=self.name, label_set=request.labels, backend_ref="")
        child = _Child(managed=managed, process=None, workdir=workdir, log_path=log_path)
        self._children[agent_id] = child
        try:
            argv = self._argv(request)
            for directory in (workdir, self.logs_dir, self.records_dir):
                directory.mkdir(parents=True, exist_ok=True)
            env = agent_environment(
                os.environ,
                {
                    **forwarded_agent_env(os.environ),
                    **request.env,
                    "CONVEYOR_AGENT_HOME": str(workdir),
                },
            )
            on_event(ScalerEvent(agent_id, "provisioning", f"starting {self._shown(argv)}"))
            with log_path.open("ab") as output:
                process = await self._start(argv, workdir, env, output)
        except SpawnFailed:
            self._forget(agent_id)
            raise
        except OSError as exc:
            self._forget(agent_id)
            raise SpawnFailed(f"cannot start {self._shown(self.command())}: {exc.strerror or exc}") from exc
        child.process = process
        managed.pid = process.pid
        managed.backend_ref = str(process.pid)
        managed.state = "running"
        self._write_record(agent_id, process.pid)
        child.watcher = asyncio.create_task(self._watch(child, on_event), name=f"scaler-agent-{agent_id}")
        on_event(ScalerEvent(agent_id, "connecting", f"agent process {process.pid} started"))
        return managed

    @staticmethod
    def _shown(argv: Sequence[str] | str) -> str:
        return argv if isinstance(argv, str) else " ".join(argv)

    async def _start(
        self, argv: list[str] | str, workdir: Path, env: dict[str, str], output: Any
    ) -> asyncio.subprocess.Process | subprocess.Popen[bytes]:
        if IS_WINDOWS:
            flags = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)
            return await asyncio.to_thread(
                subprocess.Popen,
                argv,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                creationflags=flags,
            )
        assert isinstance(argv, list)
        return await asyncio.create_subprocess_exec(
            *argv,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            process_group=0,
        )

    async def _wait(self, process: asyncio.subprocess.Process | subprocess.Popen[bytes]) -> int:
        if isinstance(process, subprocess.Popen):
            while True:
                code = process.poll()
                if code is not None:
                    return int(code)
                await asyncio.sleep(0.2)
        return await process.wait()

    async def _watch(self, child: _Child, on_event: OnEvent) -> None:
        assert child.process is not None
        code = await self._wait(child.process)
        child.exited.set()
        agent_id = child.managed.agent_id
        if child.destroying:
            return
        if child.registered:
            on_event(ScalerEvent(agent_id, "exited", f"agent exited with code {code}", exit_code=code))
        else:
            on_event(
                ScalerEvent(
                    agent_id,
                    "failed",
                    f"agent exited with code {code} before registering",
                    exit_code=code,
                    log_tail=tuple(read_tail(child.log_path)),
                )
            )

    def mark_registered(self, agent_id: str) -> None:
        child = self._children.get(agent_id)
        if child is not None:
            child.registered = True

    def is_alive(self, agent_id: str) -> bool:
        child = self._children.get(agent_id)
        return child is not None and child.process is not None and not child.exited.is_set()

    def managed(self) -> dict[str, ManagedAgent]:
        return {agent_id: child.managed for agent_id, child in self._children.items()}

    def log_tail(self, agent_id: str) -> list[str]:
        return read_tail(self.logs_dir / f"{agent_id}.log")

    # --- ending

    async def destroy(self, agent_id: str, *, reason: str, grace_s: float | None = None) -> None:
        child = self._children.get(agent_id)
        if child is None:
            return
        if child.destroying:
            if child.process is not None:
                await child.exited.wait()
            return
        child.destroying = True
        child.managed.state = "destroying"
        grace = self.terminate_grace_s if grace_s is None else grace_s
        process = child.process
        if process is not None:
            log.info("ending agent %s (pid %s): %s", agent_id, process.pid, reason)
            if IS_WINDOWS:
                command = taskkill_command(process.pid, process.returncode)
                if command is not None:
                    with contextlib.suppress(OSError):
                        await asyncio.to_thread(
                            subprocess.run, command, capture_output=True, timeout=30, check=False
                        )
            else:
                await end_process_group(process.pid, grace)
                await end_recorded_groups(child.workdir, process.pid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wait(process), timeout=10)
            child.exited.set()
        self._forget(agent_id)

    def _forget(self, agent_id: str) -> None:
        child = self._children.pop(agent_id, None)
        (self.records_dir / f"{agent_id}.json").unlink(missing_ok=True)
        if child is not None:
            shutil.rmtree(child.workdir, ignore_errors=True)
            child.log_path.unlink(missing_ok=True)

    # --- records and live items

    def _write_record(self, agent_id: str, pid: int) -> None:
        record = {
            "pid": pid,
            "start_time": process_start_time(pid),
            "node": self.context.node_id,
            "boot": self.context.boot_id,
            "scaler": self.name,
            "agent_id": agent_id,
        }
        path = self.records_dir / f"{agent_id}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(record), encoding="utf-8")
        os.replace(temporary, path)

    async def list_live(self) -> list[LiveItem]:
        return list_records(self.records_dir)

    async def stop_live(self, item: LiveItem) -> None:
        if item.agent_id is not None and item.agent_id in self._children:
            await self.destroy(item.agent_id, reason="stopped as an orphan")
            return
        await stop_recorded(self.records_dir, self.work_dir, item, self.terminate_grace_s)


def list_records(records_dir: Path) -> list[LiveItem]:
    """Live agents recorded in `records_dir` (pid alive and started when recorded); stale records go."""
    items: list[LiveItem] = []
    if not records_dir.is_dir():
        return items
    for path in sorted(records_dir.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            pid = int(record["pid"])
            agent_id = str(record.get("agent_id") or path.stem)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not same_process(pid, record.get("start_time")):
            path.unlink(missing_ok=True)
            continue
        items.append(
            LiveItem(
                vm_id=agent_id,
                kind="process",
                backend=BareMetalBackend.type,
                backend_ref=str(pid),
                agent_id=agent_id,
                scaler=record.get("scaler"),
                node_marker=record.get("node"),
                boot_marker=record.get("boot"),
                pid=pid,
                started_at=record.get("start_time"),
            )
        )
    return items


async def stop_recorded(records_dir: Path, work_dir: Path, item: LiveItem, grace_s: float) -> None:
    """End a recorded agent this process did not start (older boot, orphan): group, then step groups."""
    record_path = records_dir / f"{item.vm_id}.json"
    if item.pid is None or not same_process(item.pid, item.started_at):
        record_path.unlink(missing_ok=True)
        return
    if IS_WINDOWS:
        # Not our child: we hold no handle, so the pid could be reused under us; only SIGTERM-free
        # termination of exactly this process is safe.
        with contextlib.suppress(psutil.Error):
            psutil.Process(item.pid).kill()
    else:
        await end_process_group(item.pid, grace_s)
        await end_recorded_groups(work_dir / item.vm_id, item.pid)
    record_path.unlink(missing_ok=True)
    shutil.rmtree(work_dir / item.vm_id, ignore_errors=True)
