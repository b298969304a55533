"""The tests' preloaded `conveyor` processes (tests/support/preloaded.py) behave as `python -m conveyor` in a
`subprocess.Popen` would: same output, exit codes, signals, environment and working directory."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.preloaded import ENABLED, Preloader, run_captured
from tests.support.processes import ServerProcess, clean_environ

pytestmark = pytest.mark.skipif(not ENABLED, reason="CONVEYOR_TEST_PRELOAD=0")


def test_a_command_exits_with_its_code_and_writes_its_output_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "help.log"
    helped = Preloader.shared().spawn(["--help"], clean_environ(), log)
    assert helped.wait(timeout=60) == 0
    assert "Usage" in log.read_text()
    refused = Preloader.shared().spawn(["no-such-command"], clean_environ(), tmp_path / "refused.log")
    assert refused.wait(timeout=60) == 2


def test_a_server_gets_its_environment_and_a_signal_ends_it_as_a_signal(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "home")
    server.wait_ready()
    assert (tmp_path / "home" / "conveyor.db").exists()  # CONVEYOR_HOME reached the child
    assert server.proc.poll() is None
    server.proc.kill()
    assert server.proc.wait(timeout=30) == -signal.SIGKILL
    server.proc.kill()  # after its end: nothing, and no error
    assert server.proc.poll() == -signal.SIGKILL


def test_a_sigterm_stops_a_server_cleanly(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "home")
    server.wait_ready()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0


def test_a_captured_command_gets_its_stdin_and_keeps_stdout_and_stderr_apart() -> None:
    shown = run_captured(["--version"], clean_environ(), None, timeout=60)
    assert shown.returncode == 0 and shown.stdout.startswith("conveyor ") and shown.stderr == ""
    unreachable = ["admin", "--url", "http://127.0.0.1:1", "--token", "x", "run", "list"]
    refused = run_captured(unreachable, clean_environ(), None, 60)
    assert refused.returncode == 1 and refused.stdout == "" and "cannot reach" in refused.stderr
    assert "Traceback" not in refused.stderr
    bodies: list[bytes] = []
    with _recording_api(bodies) as url:
        put = run_captured(
            ["admin", "--url", url, "--token", "x", "secret", "set", "org", "X"], clean_environ(), "v1\n", 60
        )
    assert put.returncode == 0, put.stderr
    assert put.stdout == "set org X (key version 1)\n"
    assert [json.loads(body) for body in bodies] == [{"value": "v1\n"}]  # what was on its stdin


@contextmanager
def _recording_api(bodies: list[bytes]) -> Iterator[str]:
    """A stand-in for the admin API's secret PUT that keeps each request body."""

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            answer = json.dumps({"scope": "org", "name": "X", "key_version": 1}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
