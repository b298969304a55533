"""`conveyor` server processes forked from one that imported Conveyor already.

Importing the server takes about 1.5 s of CPU, and the suite starts some 400 servers: a third of its CPU
went to imports. Each pytest worker starts one preloader (`python -m tests.support.preloaded SOCKET`),
which imports the server and the CLI once, then forks a child per request: the child takes the requested
environment, working directory, argv and log file and runs the CLI's `main`, as `python -m conveyor`
would. The servers are still real processes on real sockets; only their imports are shared.

Protocol, one Unix-socket connection per child: the client sends one JSON line `{argv, env, cwd, log}`;
the preloader answers `pid N` once forked, then `exit C` (`C` as `Popen.returncode`: negative for a signal)
once it has reaped the child, and closes. The preloader exits when its stdin (a pipe from the pytest worker)
closes. `CONVEYOR_TEST_PRELOAD=0` turns it off (plain `subprocess.Popen`).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ENABLED = os.environ.get("CONVEYOR_TEST_PRELOAD", "1") != "0"


class PreloadedProcess:
    """The `subprocess.Popen` surface the tests use, for a child of the preloader."""

    def __init__(self, connection: socket.socket, pid: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self._connection = connection
        self._pending = b""
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            self._pidfd = None  # already gone: its `exit` line is on the way

    def _read_exit(self, timeout: float | None) -> bool:
        while b"\n" not in self._pending:
            ready, _, _ = select.select([self._connection], [], [], timeout)
            if not ready:
                return False
            data = self._connection.recv(4096)
            if not data:
                raise RuntimeError(f"the preloader closed the connection of pid {self.pid} without its exit")
            self._pending += data
        line, _, self._pending = self._pending.partition(b"\n")
        kind, _, value = line.decode().partition(" ")
        assert kind == "exit", line
        self.returncode = int(value)
        self._connection.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return True

    def poll(self) -> int | None:
        """The exit code, or None while it runs."""
        if self.returncode is None:
            self._read_exit(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Until it exits (`subprocess.TimeoutExpired` after `timeout`); its exit code."""
        if self.returncode is None and not self._read_exit(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal it, unless it has exited (the pidfd never reaches a process that reused its pid)."""
        if self.returncode is None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)


class Preloader:
    """This pytest worker's preloader process and the socket to reach it."""

    _lock = threading.Lock()
    _current: Preloader | None = None

    def __init__(self) -> None:
        directory = Path(tempfile.mkdtemp(prefix="conveyor-preload-"))
        self.socket_path = directory / "preload.sock"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.preloaded", str(self.socket_path)],
            cwd=Path(__file__).resolve().parents[2],  # where `tests` imports from, whatever a test's cwd
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,  # one line, `ready`, once it listens
            stderr=open(directory / "preloader.log", "wb"),
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin = self.process.stdin  # closing it (at this worker's exit) ends the preloader
        # It imports Conveyor before it listens: wait for its word, not for the socket file to appear.
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        if not ready or self.process.stdout.readline() != b"ready\n":
            raise RuntimeError(f"the preloader did not start (see {directory / 'preloader.log'})")

    @classmethod
    def shared(cls) -> Preloader:
        """The worker's preloader, started at the first use (and again if it died)."""
        with cls._lock:
            if cls._current is None or cls._current.process.poll() is not None:
                cls._current = cls()
            return cls._current

    def _connect(self) -> socket.socket:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(str(self.socket_path))
        return connection

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], log: Path) -> PreloadedProcess:
        """Fork `conveyor ARGV` with `env`, its output appended to `log`."""
        connection = self._connect()
        request = {"argv": list(argv), "env": dict(env), "cwd": os.getcwd(), "log": str(log)}
        connection.sendall(json.dumps(request).encode() + b"\n")
        answer = b""
        while b"\n" not in answer:
            data = connection.recv(4096)
            if not data:
                raise RuntimeError("the preloader closed the connection before forking")
            answer += data
        line, _, rest = answer.partition(b"\n")
        kind, _, value = line.decode().partition(" ")
        assert kind == "pid", line
        process = PreloadedProcess(connection, int(value), ["conveyor", *argv])
        process._pending = rest
        return process


def spawn_conveyor(argv: Sequence[str], env: Mapping[str, str], log: Path) -> Any:
    """`conveyor ARGV` as a preloaded child, or as a plain subprocess when preloading is off."""
    if ENABLED:
        return Preloader.shared().spawn(argv, env, log)
    with open(log, "ab") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "conveyor", *argv],
            env=dict(env),
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


# --- the preloader process


def _run_child(request: dict[str, Any]) -> None:
    """In the forked child: become `conveyor ARGV` and never return."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        output = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        nothing = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nothing, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        os.close(nothing)
        # What `Popen(close_fds=True)` would not have passed on: the preloader's sockets, pidfds, its log.
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        sys.argv = ["conveyor", *request["argv"]]
        from conveyor.cli.main import main

        try:
            main()
            code = 0
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
                code = 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(socket_path: str) -> None:
    """Import Conveyor, then fork a child per request until stdin closes."""
    import conveyor.cli.main
    import conveyor.server.run  # noqa: F401

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    while True:
        for key, _ in selector.select():
            if key.data == "stdin":
                if not os.read(sys.stdin.fileno(), 4096):
                    return
            elif key.data == "accept":
                connection, _ = listener.accept()
                reader = connection.makefile("rb")
                request = json.loads(reader.readline())
                reader.close()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for _, other in children.values():
                        other.close()
                    connection.close()
                    _run_child(request)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, connection)
                selector.register(pidfd, selectors.EVENT_READ, "child")
                connection.sendall(f"pid {pid}\n".encode())
            else:
                pidfd = key.fd
                pid, connection = children.pop(pidfd)
                selector.unregister(pidfd)
                _, status = os.waitpid(pid, 0)
                os.close(pidfd)
                try:
                    connection.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass  # its client is gone
                connection.close()


if __name__ == "__main__":
    serve(sys.argv[1])
