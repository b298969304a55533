"""The tests' preloaded `conveyor` processes (tests/support/preloaded.py) behave as `python -m conveyor` in a
`subprocess.Popen` would: same output, exit codes, signals, environment and working directory."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.preloaded import ENABLED, Preloader
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
