"""Real `conveyor` processes for tests: free ports, environment, readiness, clean-up."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support import preloaded
from tests.support.http import HTTP
from tests.support.preloaded import spawn_conveyor
from tests.support.waiting import wait_until

TOKEN_PATTERN = re.compile(r"cvy_admin_[0-9a-f]{64}")


# Test servers take ports from a range of their pytest worker's own, below Linux's ephemeral range
# (32768–60999). A port the kernel picked (bind to 0) was free only at that instant: another worker's
# `free_port` could be handed the same one before either server bound it, and the later server's test
# then talked to the other test's server (seen as a missing owner token in an empty log).
# Two pytest runs on one machine (two checkouts) share those ranges: a port handed out is also claimed
# machine-wide by a file naming the claiming process, which no other live process takes over.
# CONVEYOR_TEST_PORT_BASE moves the ranges (fewer ports skipped when runs are concurrent).
PORT_CLAIMS = Path(tempfile.gettempdir()) / "conveyor-test-ports"
PORT_RANGE_START = int(os.environ.get("CONVEYOR_TEST_PORT_BASE", "20000"))
PORTS_PER_WORKER = 1_500
WORKER_RANGES = 8
_handed_out = itertools.count()
# Ports Chromium refuses to load (ERR_UNSAFE_PORT) above 1023: a browser test's server must not get one
# (a CONVEYOR_TEST_PORT_BASE of 6000 handed out 6000, X11's port, first).
BROWSER_UNSAFE_PORTS = frozenset(
    {1719, 1720, 1723, 2049, 3659, 4045, 4190, 5060, 5061, 6000, 6566, *range(6665, 6670), 6697, 10080}
)


def worker_port_range(worker: str) -> range:
    """The ports `free_port` hands out in pytest-xdist worker `worker` (`gw0`, `gw1`, …; else the first)."""
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    first = PORT_RANGE_START + (index % WORKER_RANGES) * PORTS_PER_WORKER
    return range(first, first + PORTS_PER_WORKER)


def free_port() -> int:
    """A TCP port nothing listens on right now, from this worker's range, not handed out again by this
    process until the whole range has been."""
    ports = worker_port_range(os.environ.get("PYTEST_XDIST_WORKER", "gw0"))
    for _ in ports:
        port = ports[next(_handed_out) % len(ports)]
        if port in BROWSER_UNSAFE_PORTS or not _claim(port):
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {ports}")


def _claim(port: int) -> bool:
    """Claim `port` for this process machine-wide; False when another live process holds it."""
    PORT_CLAIMS.mkdir(exist_ok=True)
    path = PORT_CLAIMS / str(port)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                holder = int(path.read_text() or "0")
            except (OSError, ValueError):
                return False  # being written by its claimant right now
            if holder == os.getpid():
                return True
            if holder and _alive(holder):
                return False
            path.unlink(missing_ok=True)  # its claimant is gone
            continue
        with os.fdopen(fd, "w") as claim:
            claim.write(str(os.getpid()))
        return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without CONVEYOR_* (so tests do not leak into each other)."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CONVEYOR_")}
    env.update(extra or {})
    return env


def conveyor_command(*args: str) -> list[str]:
    """Run the CLI with this interpreter (works whether or not the venv is activated)."""
    return [sys.executable, "-m", "conveyor", *args]


def run_cli(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    input_text: str | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run `conveyor ARGS` to completion, capturing output (forked by the preloader when it is on)."""
    if preloaded.ENABLED:
        return preloaded.run_captured(list(args), clean_environ(env), input_text, timeout)
    return subprocess.run(
        conveyor_command(*args),
        env=clean_environ(env),
        input=input_text,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=None if input_text is not None else subprocess.DEVNULL,
    )


def admin_ok(url: str, token: str, *args: str) -> Any:
    """`conveyor admin --url URL --token TOKEN ARGS`, which must succeed: its JSON with `--json`, else its text."""
    done = run_cli(["admin", "--url", url, "--token", token, *args])
    assert done.returncode == 0, (args, done.stderr)
    return json.loads(done.stdout) if "--json" in args else done.stdout


@contextmanager
def agent_process(
    ws_url: str, token: str, home: Path, labels: str = "linux"
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`conveyor agent` dialling `ws_url` with `token`; yields the process and its log file (killed after)."""
    log_path = home.parent / f"{home.name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            conveyor_command("agent", "--url", ws_url, "--labels", labels, "--home", str(home)),
            env=clean_environ({"CONVEYOR_AGENT_TOKEN": token, "CONVEYOR_LOG_FORMAT": "text"}),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            yield proc, log_path
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=20)


class ServerProcess:
    """A `conveyor server` subprocess on a free port with its own home."""

    def __init__(
        self,
        home: Path,
        *,
        database_url: str | None = None,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        port: int | None = None,
        command: str = "server",
    ) -> None:
        self.home = home
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / f"server-{self.port}.log"
        home.mkdir(parents=True, exist_ok=True)
        environ = {
            "CONVEYOR_HOME": str(home),
            "CONVEYOR_LOG_FORMAT": "json",
            # An idle server keeps its pool's connections open (10 by default, 13 in all): four workers'
            # PostgreSQL servers at once passed PostgreSQL's 100. With 6 (10 in all) ten fit; with 4 a
            # coordinator starting under load waited on its own pool. A test that needs more sets it.
            "CONVEYOR_DB_POOL_SIZE": "6",
            **(env or {}),
        }
        if database_url:
            environ["CONVEYOR_DATABASE_URL"] = database_url
        self._log = open(self.log_path, "w")
        # Forked from a process that imported the server already (tests/support/preloaded.py).
        self.proc = spawn_conveyor(
            [command, "--port", str(self.port), *args], clean_environ(environ), self.log_path
        )

    def output(self) -> str:
        """Everything the process printed so far."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def owner_token(self) -> str:
        """The owner token from the first-boot banner."""
        found = TOKEN_PATTERN.findall(self.output())
        assert found, f"no owner token in the server output:\n{self.output()}"
        return found[0]

    def owner_token_or_none(self) -> str | None:
        """The first-boot owner token, if this process printed one."""
        found = TOKEN_PATTERN.findall(self.output())
        return found[0] if found else None

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        """A GET against this server."""
        return HTTP.get(self.url + path, timeout=10, **kwargs)  # type: ignore[arg-type]

    def admin(self, token: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A request to this server's admin API (`/api/v1/admin<path>`) as `token`."""
        return HTTP.request(
            method,
            f"{self.url}/api/v1/admin{path}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            **kwargs,
        )

    def create_source(self, token: str, body: Mapping[str, Any]) -> str:
        """Create a source through the admin API (201 asserted); its id."""
        created = self.admin(token, "POST", "/sources", json=dict(body))
        assert created.status_code == 201, created.text
        return str(created.json()["id"])

    def wait_delivery_handled(self, token: str, delivery: str, what: str) -> dict[str, Any]:
        """The webhook delivery's admin row once it is no longer `received`."""

        def handled() -> dict[str, Any] | None:
            row: dict[str, Any] = self.admin(token, "GET", f"/deliveries/{delivery}").json()
            return row if row["status"] != "received" else None

        row = wait_until(handled, timeout=30, what=what)
        assert row is not None
        return row

    def wait_listening(self, timeout: float = 90) -> None:
        """Until /health answers 200 (fails early if the process died)."""

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            return self.get("/health").status_code == 200

        wait_until(up, timeout=timeout, what=f"server on {self.url} to listen")

    def wait_ready(self, timeout: float = 90) -> None:
        """Until /ready answers 200."""
        self.wait_listening(timeout)
        wait_until(lambda: self.get("/ready").status_code == 200, timeout=timeout, what="/ready 200")

    def wait_exit(self, timeout: float = 30) -> int:
        """Until the process exits; its code."""
        return self.proc.wait(timeout=timeout)

    def signal(self, sig: int) -> None:
        """Send a signal to the process."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM, then SIGKILL if it does not exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        self._log.close()

    def kill(self) -> None:
        """SIGKILL."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=15)


def wait_for_port_closed(port: int, timeout: float = 10) -> None:
    """Until nothing accepts on `port`."""

    def closed() -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.2)
            return sock.connect_ex(("127.0.0.1", port)) != 0

    wait_until(closed, timeout=timeout, what=f"port {port} to close")
