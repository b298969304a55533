"""`conveyor` server processes forked from one that imported Conveyor already.

Importing the server takes about 1.5 s of CPU, and the suite starts some 400 servers: a third of its CPU
went to imports. Each pytest worker starts one preloader (`python -m tests.support.preloaded SOCKET`),
which imports the server and the CLI once, then forks a child per request: the child takes the requested
environment, working directory, argv and log file and runs the CLI's `main`, as `python -m conveyor`
would. The servers are still real processes on real sockets; only their imports are shared.

Protocol, one Unix-socket connection per child: the client sends one JSON line `{argv, env, cwd, log}`;
the preloader answers `pid N` once forked, then `exit C` (`C` as `Popen.returncode`: negative for a signal)
once it has reaped the child, and closes. A request with `"stdio": true` comes with three file descriptors
(SCM_RIGHTS) that become the child's stdin, stdout and stderr instead of its log: `run_captured` runs the
CLI that way (a CLI process costs some 0.25 s of CPU to import, a fork a few ms). The preloader exits when
its stdin (a pipe from the pytest worker) closes. `CONVEYOR_TEST_PRELOAD=0` turns it off (plain
`subprocess.Popen`).
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
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

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path | None,
        stdio: tuple[int, int, int] | None = None,
    ) -> PreloadedProcess:
        """Fork `conveyor ARGV` with `env`, its output appended to `log` (or on the `stdio` descriptors)."""
        connection = self._connect()
        request = {
            "argv": list(argv),
            "env": dict(env),
            "cwd": os.getcwd(),
            "log": None if log is None else str(log),
            "stdio": stdio is not None,
        }
        payload = json.dumps(request).encode() + b"\n"
        if stdio is None:
            connection.sendall(payload)
        else:  # the descriptors ride on the first bytes; the rest of a long request follows
            sent = socket.send_fds(connection, [payload], list(stdio))
            connection.sendall(payload[sent:])
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


def run_captured(
    argv: Sequence[str], env: Mapping[str, str], input_text: str | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`conveyor ARGV` forked by the preloader, as `subprocess.run(..., capture_output=True, text=True)`."""
    stdin_read, stdin_write = os.pipe()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        process = Preloader.shared().spawn(argv, env, None, stdio=(stdin_read, out_write, err_write))
    except BaseException:
        for fd in (stdin_write, out_read, err_read):
            os.close(fd)
        raise
    finally:
        for fd in (stdin_read, out_write, err_write):
            os.close(fd)
    feeder = threading.Thread(target=_feed, args=(stdin_write, (input_text or "").encode()), daemon=True)
    feeder.start()
    deadline = time.monotonic() + timeout
    outputs = _drain((out_read, err_read), deadline)
    args = ["conveyor", *argv]
    stdout, stderr = (_text(outputs[fd]) for fd in (out_read, err_read))
    try:
        returncode = process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise subprocess.TimeoutExpired(args, timeout, stdout, stderr) from None
    if not all(output.closed for output in outputs.values()):  # the deadline came first
        process.kill()
        raise subprocess.TimeoutExpired(args, timeout, stdout, stderr)
    return subprocess.CompletedProcess(args, returncode, stdout, stderr)


class _Output(bytearray):
    closed = False


def _feed(fd: int, data: bytes) -> None:
    try:
        with open(fd, "wb") as pipe:
            pipe.write(data)
    except BrokenPipeError:
        pass  # the CLI exited without reading all of it, as subprocess.run tolerates


def _drain(pipes: Sequence[int], deadline: float) -> dict[int, _Output]:
    """Read each pipe to its end or until the deadline; each closed."""
    outputs = {fd: _Output() for fd in pipes}
    selector = selectors.DefaultSelector()
    for fd in pipes:
        selector.register(fd, selectors.EVENT_READ)
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for key, _ in selector.select(remaining):
                data = os.read(key.fd, 65536)
                if data:
                    outputs[key.fd] += data
                else:
                    selector.unregister(key.fd)
                    outputs[key.fd].closed = True
    finally:
        selector.close()
        for fd in pipes:
            os.close(fd)
    return outputs


def _text(data: bytes | bytearray) -> str:
    """Decoded as `subprocess.run(text=True)` does: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


# --- the preloader process


def _run_child(request: dict[str, Any], stdio: Sequence[int]) -> None:
    """In the forked child: become `conveyor ARGV` and never return."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        if stdio:
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
        else:
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


def _read_request(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request line and the descriptors sent with it."""
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
    while not data.endswith(b"\n"):
        more = connection.recv(1 << 16)
        if not more:
            raise RuntimeError("a client closed its connection inside its request")
        data += more
    request = json.loads(data)
    if request.get("stdio") and len(fds) != 3:
        raise RuntimeError(f"a stdio request came with {len(fds)} descriptors")
    return request, list(fds)


def serve(socket_path: str) -> None:
    """Import Conveyor, then fork a child per request until stdin closes."""
    import importlib
    import pkgutil

    import conveyor.cli.admin
    import conveyor.cli.main
    import conveyor.server.run

    # The CLI imports an admin command's group when a command line names it; the suite names them all.
    for module in pkgutil.iter_modules(conveyor.cli.admin.__path__):
        importlib.import_module(f"conveyor.cli.admin.{module.name}")

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
                try:
                    request, stdio = _read_request(connection)
                except (OSError, ValueError, RuntimeError):
                    connection.close()  # its client went away mid-request: nothing to fork
                    continue
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for _, other in children.values():
                        other.close()
                    connection.close()
                    _run_child(request, stdio)
                for fd in stdio:  # the child has them; the preloader's copies would keep pipes open
                    os.close(fd)
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
