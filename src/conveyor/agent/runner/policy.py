"""The runner's small decisions over plain values: a step's environment, `$CONVEYOR_ENV` lines, retry
delays, the drift message, the status that decides a workflow's hooks."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from conveyor.agent.context import DEFAULT_EMIT_TIMEOUT_S

DEFAULT_STEP_TIMEOUT_MS = 30 * 60 * 1000
DEFAULT_HOOK_TIMEOUT_MS = 5 * 60 * 1000
HOOK_ORDER = ("on_success", "on_failure", "on_cancel", "cleanup")
ENV_ALLOWLIST = {
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "TERM",
    "TZ",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
}
ENV_LINE_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def allowlisted_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The agent's variables a step may see: the allowlist (either case) and `LC_*`."""
    return {
        name: value
        for name, value in environ.items()
        if name.upper() in ENV_ALLOWLIST or name.startswith("LC_")
    }


def drift_message(workflow: str) -> str:
    """docs/design/authoring.md's message for a lock that no longer matches the sources."""
    return (
        f"workflow {workflow!r} changed since the lock file was compiled; "
        "run `conveyor compile` and commit the lock"
    )


def parse_env_file(text: str) -> dict[str, str]:
    """`NAME=value` lines of `$CONVEYOR_ENV`; raises ValueError naming the first bad line."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        found = ENV_LINE_RE.match(line)
        if not found:
            raise ValueError(f"line {number} is not NAME=value")
        name, value = found.groups()
        if name == "PATH" or name.startswith("CONVEYOR_"):
            raise ValueError(f"line {number} sets the reserved variable {name}")
        values[name] = value
    return values


def retry_delay_ms(retry: Any, attempt: int) -> int:
    """Wait after failed attempt `attempt` (1-based): exponential `min(delay·2^(n-1), max)` or fixed."""
    if retry.backoff == "fixed":
        return int(retry.delay_ms)
    return int(min(retry.delay_ms * 2 ** (attempt - 1), retry.max_delay_ms))


def emit_timeout_s() -> float:
    """How long `ctx.emit` waits for the orchestrator: `CONVEYOR_EMIT_TIMEOUT_MS` (tests), else 30 s."""
    try:
        value = int(os.environ.get("CONVEYOR_EMIT_TIMEOUT_MS", ""))
    except ValueError:
        return DEFAULT_EMIT_TIMEOUT_S
    return value / 1000 if value > 0 else DEFAULT_EMIT_TIMEOUT_S


def bootstrap_environment(step_env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """A step process's environment at start (its `run` message then makes `step_env` its environment)."""
    bootstrap = dict(step_env)
    for name in ("CONVEYOR_KILL_GRACE_MS", "PYTHONPATH"):
        if environ.get(name):
            bootstrap[name] = environ[name]
    return bootstrap


def aggregate_status(statuses: list[str]) -> str:
    """The status that decides a workflow hooks job's hooks: the worst of its upstream jobs' statuses."""
    for status in ("failed", "timed_out", "cancelled"):
        if status in statuses:
            return status
    return "success" if "success" in statuses or not statuses else "skipped"
