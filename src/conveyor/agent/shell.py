"""`ctx.sh`: run a command in its own process group, stream its output line by line, capture it.

Runs inside the step process. A `str` command runs under `bash -e -o pipefail -c` (`sh -e -c` without bash);
a `list[str]` runs as argv with no shell. Each command's process group is reported to the runner before
waiting, so stopping the step also stops what the step started.
"""

from __future__ import annotations

import os
import selectors
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from conveyor.agent.signals import signal_group
from conveyor.sdk.context import ShError, ShResult, ShTimeout

CAPTURE_LIMIT = 16 * 1024 * 1024
# After the command exits, output still held open by a background grandchild (`sleep 300 &`) is read for
# this long, then abandoned: the command is done and the runner kills leftovers at the end of the job.
EXIT_LINGER_S = 0.5
DEFAULT_SH_KILL_GRACE_S = 10.0


# Read once at start-up: the step process later replaces `os.environ` with the step environment.
_KILL_GRACE_MS = os.environ.get("CONVEYOR_KILL_GRACE_MS")


def kill_grace_s(default: float = DEFAULT_SH_KILL_GRACE_S) -> float:
    """`CONVEYOR_KILL_GRACE_MS` when set (tests make it short), else `default`."""
    value = _KILL_GRACE_MS
    try:
        return int(value) / 1000 if value else default
    except ValueError:
        return default


def shell_argv(command: str) -> list[str]:
    """The argv that runs a command string: bash with errexit and pipefail, else POSIX sh."""
    bash = shutil.which("bash")
    if bash:
        return [bash, "-e", "-o", "pipefail", "-c", command]
    return ["/bin/sh", "-e", "-c", command]


def describe(cmd: str | list[str]) -> str:
    """The command as echoed in the log (`$ …`)."""
    return cmd if isinstance(cmd, str) else shlex.join(cmd)


class LineCapture:
    """Splits one stream into lines for the log while keeping up to 16 MiB of text."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        self.sink = sink
        self.parts: list[bytes] = []
        self.size = 0
        self.truncated = False
        self.partial = b""

    def feed(self, data: bytes) -> None:
        if self.size < CAPTURE_LIMIT:
            room = CAPTURE_LIMIT - self.size
            self.parts.append(data[:room])
            self.size += min(len(data), room)
            self.truncated = self.truncated or len(data) > room
        else:
            self.truncated = True
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            self.sink(line.decode("utf-8", errors="replace"))

    def close(self) -> None:
        if self.partial:
            self.sink(self.partial.decode("utf-8", errors="replace"))
            self.partial = b""

    def text(self) -> str:
        return b"".join(self.parts).decode("utf-8", errors="replace")


def line_captures(
    stdout: TextIO, stderr: TextIO, write_lock: threading.Lock
) -> tuple[LineCapture, LineCapture]:
    """A command's two captures, writing each whole line to the step's stream under the step's lock (its
    commands may run in threads at once, and a line must never be cut by another's)."""

    def writer(stream: TextIO) -> Callable[[str], None]:
        def write(line: str) -> None:
            with write_lock:
                stream.write(line + "\n")
                stream.flush()

        return write

    return LineCapture(writer(stdout)), LineCapture(writer(stderr))


def run_command(
    cmd: str | list[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    check: bool,
    timeout: float | None,
    input: str | None,
    stdout: TextIO,
    stderr: TextIO,
    report_group: Callable[[int], None],
    write_lock: threading.Lock,
) -> ShResult:
    """Run `cmd` to completion, streaming each line to `stdout`/`stderr` and capturing both."""
    if isinstance(cmd, str):
        argv = shell_argv(cmd)
    elif isinstance(cmd, list) and all(isinstance(part, str) for part in cmd):
        argv = list(cmd)
    else:
        raise TypeError(f"ctx.sh takes a str (shell) or a list[str] (argv), not {type(cmd).__name__}")
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    report_group(process.pid)
    if input is not None:
        threading.Thread(target=_write_input, args=(process, input), daemon=True).start()

    out, err = line_captures(stdout, stderr, write_lock)
    captures = {"out": out, "err": err}
    selector = selectors.DefaultSelector()
    assert process.stdout is not None and process.stderr is not None
    selector.register(process.stdout, selectors.EVENT_READ, "out")
    selector.register(process.stderr, selectors.EVENT_READ, "err")
    deadline = None if timeout is None else started + timeout
    exited_at: float | None = None
    timed_out = False
    killed_at: float | None = None
    try:
        while selector.get_map():
            now = time.monotonic()
            if exited_at is None and process.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > EXIT_LINGER_S:
                break
            if deadline is not None and now >= deadline and not timed_out:
                timed_out = True
                signal_group(process.pid, signal.SIGTERM)
                killed_at = now + kill_grace_s()
            if killed_at is not None and now >= killed_at:
                signal_group(process.pid, signal.SIGKILL)
                killed_at = None
            for key, _ in selector.select(timeout=0.05):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                else:
                    captures[key.data].feed(data)
        while process.poll() is None:
            now = time.monotonic()
            if deadline is not None and now >= deadline and not timed_out:
                timed_out = True
                signal_group(process.pid, signal.SIGTERM)
                killed_at = now + kill_grace_s()
            if killed_at is not None and now >= killed_at:
                signal_group(process.pid, signal.SIGKILL)
                killed_at = None
            try:
                process.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
    finally:
        selector.close()
        for capture in captures.values():
            capture.close()
        process.stdout.close()
        process.stderr.close()
    if timed_out:
        # The whole group goes: a shell's children must not outlive the timeout.
        signal_group(process.pid, signal.SIGKILL)
        raise ShTimeout(cmd, timeout or 0.0)
    result = ShResult(
        args=cmd,
        returncode=process.returncode,
        stdout=captures["out"].text(),
        stderr=captures["err"].text(),
        duration_s=time.monotonic() - started,
        truncated=captures["out"].truncated or captures["err"].truncated,
    )
    if check and result.returncode != 0:
        raise ShError(result)
    return result


def _write_input(process: subprocess.Popen[bytes], text: str) -> None:
    assert process.stdin is not None
    try:
        process.stdin.write(text.encode("utf-8"))
        process.stdin.close()
    except (BrokenPipeError, OSError):
        pass
