"""`conveyor admin run logs --follow` as a real process."""

from __future__ import annotations

import subprocess

from tests.support.processes import clean_environ, conveyor_command


def start_follow(env: dict[str, str], run_id: str) -> subprocess.Popen[str]:
    """`conveyor admin run logs RUN --follow` as a real process with its stdout piped."""
    return subprocess.Popen(
        conveyor_command("admin", "run", "logs", run_id, "--follow"),
        env=clean_environ(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
