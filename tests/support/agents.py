"""A real `conveyor agent` process for a stage's server, and what end-to-end tests check around it: a
job's log, a secret set through the API, and that no table holds a secret in clear."""

import signal
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.support.dispatch_stage import Stage
from tests.support.processes import clean_environ, conveyor_command


@contextmanager
def agent_process(
    s: Stage,
    home: Path,
    labels: str = "linux",
    *,
    reuse_token: bool = False,
    token: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A `conveyor agent` for the stage's server, stopped (SIGTERM, then SIGKILL) on exit. Its token is
    `token`, else the one of its last start with `reuse_token`, else a new one; `env` adds to its
    environment (e.g. `DOCKER_HOST`)."""
    token_file = home.parent / f"{home.name}.token"
    if token is None and reuse_token and token_file.exists():
        token = token_file.read_text()
    elif token is None:
        token = s.agent_token(labels.split(","))
    token_file.write_text(token)
    log = open(home.parent / "agent.log", "ab")
    proc = subprocess.Popen(
        conveyor_command("agent", "--url", s.ws_url, "--labels", labels, "--home", str(home)),
        env=clean_environ({**(env or {}), "CONVEYOR_AGENT_TOKEN": token}),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def set_secret(s: Stage, name: str, value: str) -> None:
    answer = s.api("PUT", f"/secrets/org/{name}", json={"value": value})
    assert answer.status_code in (200, 201), answer.text


def job_log(s: Stage, run_id: str, job_id: str) -> str:
    answer = s.api("GET", f"/runs/{run_id}/jobs/{job_id}/logs", params={"offset": 0, "limit_bytes": 1048576})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["text"])


def assert_no_clear_secret(database_url: str, value: str) -> None:
    """No column of any table holds the value in clear, gzip-compressed log data included."""
    import gzip

    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            for table in inspect(conn).get_table_names():
                for row in conn.execute(text(f'SELECT * FROM "{table}"')):
                    for cell in row:
                        data = cell if isinstance(cell, bytes | memoryview) else str(cell).encode()
                        data = bytes(data)
                        if data[:2] == b"\x1f\x8b":
                            data = gzip.decompress(data)
                        assert value.encode() not in data, f"{value!r} found in clear in {table}"
    finally:
        engine.dispose()
