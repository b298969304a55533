"""What every benchmark shares: a real `conveyor server` on a fresh database, percentiles, the table.

Deliberately independent of tests/ (benchmarks are not tests): the server process, the git helpers
and the PostgreSQL database handling are re-implemented here in their minimal form.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
POSTGRES_URL = os.environ.get("CONVEYOR_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
BENCH_DB_PREFIX = "conveyor_bench_"
TOKEN_PATTERN = re.compile(r"cvy_admin_[0-9a-f]{64}")
DIALECTS = ("sqlite", "postgresql")
GIT_CONFIG = ["-c", "user.name=Bench", "-c", "user.email=bench@example.com", "-c", "commit.gpgsign=false"]

# Short intervals so a benchmark never waits on a poll it does not measure.
FAST_ENV = {
    "CONVEYOR_SWEEP_INTERVAL_MS": "500",
    "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "1000",
    "CONVEYOR_DISPATCH_POLL_MS": "500",
}

T = TypeVar("T")


# --- figures and the table -------------------------------------------------------------------------


@dataclass
class Figure:
    """One measured number, with the target it is held against (None: informational)."""

    name: str
    value: float | None
    unit: str
    target: str = ""
    met: bool | None = None
    note: str = ""

    def shown(self) -> str:
        """The value as printed ('n/a' when not measured)."""
        if self.value is None:
            return "n/a"
        if abs(self.value) >= 100:
            return f"{self.value:,.0f}"
        if abs(self.value) >= 10:
            return f"{self.value:.1f}"
        return f"{self.value:.2f}"


@dataclass
class Report:
    """The figures of one script."""

    script: str
    figures: list[Figure] = field(default_factory=list)

    def add(
        self,
        name: str,
        value: float | None,
        unit: str,
        *,
        target: str = "",
        met: bool | None = None,
        note: str = "",
    ) -> Figure:
        """Record a figure and echo it at once (long runs show progress)."""
        figure = Figure(name, value, unit, target, met, note)
        self.figures.append(figure)
        print(f"  {name}: {figure.shown()} {unit}" + (f"  ({note})" if note else ""), flush=True)
        return figure


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def format_table(figures: Sequence[Figure], title: str = "") -> str:
    """A fixed-width table: figure, value, unit, target, verdict, note."""
    header = ("figure", "value", "unit", "target", "met", "note")
    rows = [
        (
            f.name,
            f.shown(),
            f.unit,
            f.target,
            "" if f.met is None else ("yes" if f.met else "NO"),
            f.note,
        )
        for f in figures
    ]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    widths[-1] = min(widths[-1], 60)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).rjust(w) if i == 1 else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [title] if title else []
    out += [line(header), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def finish(report: Report, args: argparse.Namespace) -> None:
    """Print the script's table and, with --json, write its figures for the summary."""
    print()
    print(format_table(report.figures, f"== {report.script}"))
    if getattr(args, "json", None):
        Path(args.json).write_text(
            json.dumps({"script": report.script, "figures": [asdict(f) for f in report.figures]}, indent=1)
        )


def arguments(description: str, *, dialects: bool = True) -> argparse.ArgumentParser:
    """The options every script has: --quick, --db, --json.

    Also turns SIGTERM into a normal exit, so an interrupted benchmark still drops its database and
    stops its server.
    """
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small counts and short durations")
    if dialects:
        parser.add_argument(
            "--db",
            default=",".join(DIALECTS),
            help="comma-separated databases to measure (sqlite, postgresql); default both",
        )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    return parser


def add_docker_host(parser: argparse.ArgumentParser) -> None:
    """The --docker-host option of the container benches (the suite's engine, else DOCKER_HOST)."""
    parser.add_argument(
        "--docker-host",
        default=os.environ.get("CONVEYOR_BENCH_DOCKER_HOST")
        or os.environ.get("CONVEYOR_TEST_DOCKER_HOST")
        or os.environ.get("DOCKER_HOST"),
        help="the engine's address, e.g. unix:///var/run/docker.sock",
    )


def docker_host(args: argparse.Namespace) -> str:
    """The --docker-host given, or an exit saying how to provide an engine."""
    if not args.docker_host:
        raise SystemExit(
            "no Docker engine: pass --docker-host, or run through scripts/with-docker.sh (docs/operations.md)"
        )
    return str(args.docker_host)


def selected_dialects(args: argparse.Namespace) -> list[str]:
    """The --db list, validated."""
    chosen = [d.strip() for d in str(args.db).split(",") if d.strip()]
    unknown = [d for d in chosen if d not in DIALECTS]
    if unknown or not chosen:
        raise SystemExit(f"--db: choose from {', '.join(DIALECTS)} (got {args.db!r})")
    return chosen


def machine() -> dict[str, str]:
    """nproc, memory and CPU model of this machine (for the README's results)."""
    model = ""
    try:
        for text_line in Path("/proc/cpuinfo").read_text().splitlines():
            if text_line.startswith("model name"):
                model = text_line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    memory = ""
    try:
        total_kb = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f"{total_kb // 1024} MB"
    except (OSError, ValueError, IndexError):
        pass
    return {"nproc": str(os.cpu_count()), "memory": memory, "cpu": model, "python": platform.python_version()}


# --- waiting ----------------------------------------------------------------------------------------


def wait_until(condition: Callable[[], T | None], *, timeout: float, what: str, poll: float = 0.02) -> T:
    """Poll `condition` until truthy; raise after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:
            last = exc
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}" + (f" ({last})" if last else ""))


# --- databases --------------------------------------------------------------------------------------


def _pg_connect(url: str = POSTGRES_URL) -> Any:
    import psycopg
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return psycopg.connect(
        host=parsed.host or "127.0.0.1",
        port=parsed.port or 5432,
        user=parsed.username or "postgres",
        password=parsed.password,
        dbname=parsed.database or "postgres",
        autocommit=True,
        connect_timeout=5,
    )


def pg_url_for(name: str) -> str:
    """The bench PostgreSQL server's URL naming database `name`."""
    from sqlalchemy.engine import make_url

    return make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)


@contextmanager
def fresh_database(dialect: str, workdir: Path, *, migrate: bool = False) -> Iterator[str]:
    """A new empty SQLite file or PostgreSQL database (dropped afterwards); yields its URL."""
    if dialect == "sqlite":
        url = f"sqlite:///{workdir / f'bench-{uuid.uuid4().hex[:8]}.db'}"
        if migrate:
            from conveyor.db.migrate import upgrade_to

            upgrade_to(url)
        yield url
        return
    from psycopg import sql

    name = f"{BENCH_DB_PREFIX}{uuid.uuid4().hex[:12]}"
    with _pg_connect() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = pg_url_for(name)
        if migrate:
            from conveyor.db.migrate import upgrade_to

            upgrade_to(url)
        yield url
    finally:
        with _pg_connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def workdir(prefix: str = "conveyor-bench-") -> Iterator[Path]:
    """A temporary directory removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix) as path:
        yield Path(path)


# --- processes --------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without CONVEYOR_* variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CONVEYOR_")}
    env.update(extra or {})
    return env


def conveyor_command(*args: str) -> list[str]:
    """`conveyor ARGS` with this interpreter."""
    return [sys.executable, "-m", "conveyor", *args]


def stop_process(proc: subprocess.Popen[Any], timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL if it does not exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


class Server:
    """A real `conveyor server` process on a free port with its own home and database."""

    def __init__(self, home: Path, database_url: str, env: Mapping[str, str] | None = None) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws"
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = home / "server.log"
        self._log = open(self.log_path, "w")
        environ = {
            "CONVEYOR_HOME": str(home),
            "CONVEYOR_DATABASE_URL": database_url,
            "CONVEYOR_LOG_FORMAT": "json",
            **FAST_ENV,
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            conveyor_command("server", "--port", str(self.port)),
            env=clean_environ(environ),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.token = ""

    def output(self) -> str:
        """What the server printed so far."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120) -> None:
        """Until /ready answers 200; then read the owner token from the first-boot banner."""

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            return httpx.get(self.url + "/ready", timeout=5).status_code == 200

        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    break
            except RuntimeError:
                raise
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready after {timeout}s:\n{self.output()[-3000:]}")
            time.sleep(0.05)
        found = TOKEN_PATTERN.findall(self.output())
        if not found:
            raise RuntimeError("no owner token in the server output")
        self.token = found[0]

    def headers(self) -> dict[str, str]:
        """Owner authorisation."""
        return {"Authorization": f"Bearer {self.token}"}

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A call to the admin API as the owner."""
        return httpx.request(
            method, f"{self.url}/api/v1/admin{path}", headers=self.headers(), timeout=60, **kwargs
        )

    def api_ok(self, method: str, path: str, **kwargs: Any) -> Any:
        """An admin API call that must succeed; its JSON."""
        answer = self.api(method, path, **kwargs)
        if answer.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {answer.status_code} {answer.text}")
        return answer.json()

    def agent_token(self, labels: Sequence[str]) -> str:
        """A new agent token."""
        created = self.api_ok("POST", "/agent-tokens", json={"labels": list(labels), "mandatory_labels": []})
        return str(created["token"])

    def rss_mb(self) -> float:
        """Resident set size of the server process, from /proc."""
        return rss_mb(self.proc.pid)

    def stop(self) -> None:
        """SIGTERM (then SIGKILL) and close the log."""
        stop_process(self.proc)
        self._log.close()


@contextmanager
def running_server(home: Path, database_url: str, env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """A ready server, stopped afterwards."""
    server = Server(home, database_url, env)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def rss_mb(pid: int) -> float:
    """VmRSS of a process in MB."""
    for text_line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if text_line.startswith("VmRSS:"):
            return int(text_line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


# --- git repositories with compiled workflows -------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    """Run git in `repo`; stdout."""
    done = subprocess.run(["git", *GIT_CONFIG, "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr}")
    return done.stdout.strip()


def make_repo(path: Path, workflows: Mapping[str, str]) -> Path:
    """A repository on `main` with `workflows` compiled into the lock and committed."""
    import textwrap

    from conveyor.lockfile import compile_repository

    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    directory = path / ".conveyor" / "workflows"
    directory.mkdir(parents=True, exist_ok=True)
    for name, source in workflows.items():
        (directory / f"{name}.py").write_text(textwrap.dedent(source))
    result = compile_repository(path)
    if not result.ok or result.lock_bytes is None:
        raise RuntimeError(f"workflows do not compile: {[str(e) for e in result.errors]}")
    (path / ".conveyor" / "conveyor.lock.json").write_bytes(result.lock_bytes)
    (path / ".conveyor" / ".gitignore").write_text("__pycache__/\n")
    (path / "README.md").write_text("benchmark repository\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    git(path, "config", "uploadpack.allowFilter", "true")
    git(path, "config", "uploadpack.allowAnySHA1InWant", "true")
    return path


def new_commit(repo: Path, message: str) -> str:
    """An empty commit on the current branch; its SHA."""
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")
