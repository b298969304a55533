"""`ctx.sh` in a container job: the command runs inside the job container through the Engine API's exec
(docs/design/containers.md §3), with the same streaming, capture, exit code and timeout as `shell.py` gives a
host command.

Runs inside the step process, whose step code is synchronous: each command runs on an event loop of its own
in a worker thread, so a step that itself runs an event loop can still call `ctx.sh`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import aiodocker

from conveyor.agent.container_plan import exec_pid_file
from conveyor.agent.shell import EXIT_LINGER_S, LineCapture, kill_grace_s, line_captures
from conveyor.sdk.context import ShError, ShResult, ShTimeout

# Variables of the step environment that describe the host, not the container.
HOST_ONLY = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "SSL_CERT_FILE", "SSL_CERT_DIR", "PATH"})
# One shell per command: `$1` the pid file, `$2` the stdin file ('' for none), `$3` `shell` (the command string
# follows: bash with errexit and pipefail when the image has bash, else POSIX sh) or `argv` (the argv follows).
# The pid is written first, so a timeout can signal the command's process group (an exec is a session leader)
# with one more exec.
_WRAPPER = (
    'echo $$ > "$1"; in="$2"; mode="$3"; shift 3; '
    'if [ -n "$in" ]; then exec < "$in"; else exec < /dev/null; fi; '
    'if [ "$mode" = argv ]; then exec "$@"; fi; '
    'if command -v bash >/dev/null 2>&1; then exec bash -e -o pipefail -c "$1"; fi; '
    'exec sh -e -c "$1"'
)
STATE_POLL_S = 0.1


def exec_argv(cmd: str | list[str], pid_file: str, input_file: str) -> list[str]:
    """The exec's argv for a `ctx.sh` command (pure)."""
    if isinstance(cmd, str):
        return ["sh", "-c", _WRAPPER, "sh", pid_file, input_file, "shell", cmd]
    return ["sh", "-c", _WRAPPER, "sh", pid_file, input_file, "argv", *cmd]


def signal_argv(pid_file: str, signal_name: str) -> list[str]:
    """An exec's argv that sends `signal_name` to the process group recorded in `pid_file` (pure)."""
    script = f'p=$(cat "$1" 2>/dev/null) || exit 0; kill -{signal_name} -"$p" 2>/dev/null || kill -{signal_name} "$p"'
    return ["sh", "-c", script, "sh", pid_file]


def container_environment(env: Mapping[str, str], container: Mapping[str, Any]) -> dict[str, str]:
    """The step environment as a command in the container sees it (docs/design/containers.md §3, pure).

    What describes the host goes; `PATH` is the image's with the job's `add_path` entries in front (the
    runner's step `PATH` is those entries followed by `host_path`).
    """
    result = {name: value for name, value in env.items() if name.upper() not in HOST_ONLY}
    path, host_path = env.get("PATH", ""), str(container.get("host_path") or "")
    prefix = path[: -len(host_path)] if host_path and path.endswith(host_path) else ""
    result["PATH"] = prefix + str(container["image_path"])
    return result


def run_in_container(
    cmd: str | list[str],
    *,
    container: Mapping[str, Any],
    env: Mapping[str, str],
    cwd: Path,
    tmp: Path,
    check: bool,
    timeout: float | None,
    input: str | None,
    stdout: TextIO,
    stderr: TextIO,
    write_lock: threading.Lock,
) -> ShResult:
    """Run `cmd` in the job container to completion, streaming each line to `stdout`/`stderr`."""
    if isinstance(cmd, list) and not all(isinstance(part, str) for part in cmd):
        raise TypeError("ctx.sh takes a str (shell) or a list[str] (argv)")

    out, err = line_captures(stdout, stderr, write_lock)
    captures = {1: out, 2: err}
    input_file = ""
    if input is not None:
        # The workspace is mounted at the same path, so a file written here is the command's stdin there.
        tmp.mkdir(parents=True, exist_ok=True)
        path = tmp / f"conveyor-stdin-{uuid.uuid4().hex}"
        path.write_text(input, encoding="utf-8")
        input_file = str(path)
    started = time.monotonic()
    job = _exec(cmd, container, container_environment(env, container), cwd, timeout, input_file, captures)
    try:
        returncode, timed_out = asyncio.run_coroutine_threadsafe(job, _engine_loop()).result()
    finally:
        for capture in captures.values():
            capture.close()
        if input_file:
            Path(input_file).unlink(missing_ok=True)
    if timed_out:
        raise ShTimeout(cmd, timeout or 0.0)
    result = ShResult(
        args=cmd,
        returncode=returncode,
        stdout=captures[1].text(),
        stderr=captures[2].text(),
        duration_s=time.monotonic() - started,
        truncated=captures[1].truncated or captures[2].truncated,
    )
    if check and result.returncode != 0:
        raise ShError(result)
    return result


_loop: asyncio.AbstractEventLoop | None = None
_clients: dict[str, aiodocker.Docker] = {}
_loop_lock = threading.Lock()


def _engine_loop() -> asyncio.AbstractEventLoop:
    """The step process's event loop for engine calls, in a daemon thread, started at the first command: one
    loop and one client for all of a step's commands, whatever the step's own code does with event loops."""
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="conveyor-engine", daemon=True).start()
            _loop = loop
        return _loop


def _client(engine: str) -> aiodocker.Docker:
    """The engine's client (called on the engine loop, so it is made there)."""
    if engine not in _clients:
        _clients[engine] = aiodocker.Docker(url=engine)
    return _clients[engine]


async def _exec(
    cmd: str | list[str],
    container: Mapping[str, Any],
    env: Mapping[str, str],
    cwd: Path,
    timeout: float | None,
    input_file: str,
    captures: Mapping[int, LineCapture],
) -> tuple[int, bool]:
    pid_file = exec_pid_file(container.get("exec_tag"), uuid.uuid4().hex)
    target = _client(str(container["engine"])).containers.container(str(container["id"]))
    execution = await target.exec(
        exec_argv(cmd, pid_file, input_file),
        stdout=True,
        stderr=True,
        tty=False,
        environment=dict(env),
        workdir=str(cwd),
        user=str(container.get("user") or ""),
    )

    async def pump() -> None:
        async with execution.start(detach=False) as stream:
            while (message := await stream.read_out()) is not None:
                captures[message.stream].feed(message.data)

    reading = asyncio.create_task(pump())
    deadline = None if timeout is None else time.monotonic() + timeout
    exited_at: float | None = None
    timed_out = False
    kill_at: float | None = None
    try:
        while not reading.done():
            await asyncio.wait({reading}, timeout=STATE_POLL_S)
            if reading.done():
                break
            now = time.monotonic()
            if exited_at is None and not (await execution.inspect()).get("Running"):
                exited_at = now
            # A background process of the command may hold its output open: the command is done.
            if exited_at is not None and now - exited_at > EXIT_LINGER_S:
                break
            if deadline is not None and now >= deadline and not timed_out:
                timed_out = True
                await _signal(target, pid_file, "TERM")
                kill_at = now + kill_grace_s()
            if kill_at is not None and now >= kill_at:
                await _signal(target, pid_file, "KILL")
                kill_at = None
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiodocker.DockerError):
            await reading
    if timed_out:
        await _signal(target, pid_file, "KILL")
    for _ in range(50):  # the stream ends as the process does; its exit code follows at once
        inspected = await execution.inspect()
        if not inspected.get("Running"):
            break
        await asyncio.sleep(0.02)
    code = inspected.get("ExitCode")
    return (int(code) if code is not None else -1), timed_out


async def _signal(target: Any, pid_file: str, signal_name: str) -> None:
    await _run_quietly(target, signal_argv(pid_file, signal_name))


async def _run_quietly(target: Any, argv: list[str]) -> None:
    """An exec as root whose output nobody reads (signals, clean-up); waits until it ends."""
    with contextlib.suppress(aiodocker.DockerError):
        execution = await target.exec(argv, stdout=False, stderr=False, tty=False, user="0")
        await execution.start(detach=True)
        for _ in range(100):
            if not (await execution.inspect()).get("Running"):
                return
            await asyncio.sleep(0.02)
