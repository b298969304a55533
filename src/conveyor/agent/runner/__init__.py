"""The job runner: `python -m conveyor.agent.runner (--workspace DIR | --wait) [--venvs DIR] [--mirrors DIR]`.

(docs/design/execution.md §7.) `--mirrors` (with `--mirror-max-bytes`) checks out through the agent's
per-repository mirrors (`mirror.py`); without it the runner fetches from the clone URL directly, as
`conveyor run local` does.

stdin: with `--wait` (a runner the agent starts before its job arrives), first `{"workspace", "venvs",
"mirrors", "mirror_max_bytes"}` (the last two may be absent); then
the job spec as one JSON line, then control lines `{"cancel": {"force": bool, "reason": str}}` and
`{"emit_result": {"request_id", "event_id", "error": {"code", "detail", "retry_after_ms"} | null}}`. stdout: JSON lines with a `type` — `proc`,
`step.started`, `log`, `step.finished`, `event.emit`, `job.finished` (always last). The runner never imports
user code: checkout, the drift check and the order of things happen here; rules, steps and hooks each run in
a step process (`conveyor.agent.step`) in its own process group; the next one is started while the
current one runs (`step_spare`).

The parts: `protocol.py` (stdout lines, stdin, the placement), `entry.py` (`main`), `job.py` (`Runner`: steps
and hooks), `setup.py` (checkout, requirements, drift, containers, inspection), `child.py` (step processes and
their supervision), `logs.py` (log buffering and step reports), `core.py` (the state they share),
`policy.py` (small decisions over plain values). This module re-exports what other code uses.
"""

from conveyor.agent.runner.core import ChildOutcome, SetupFailed, StepRecord, StopRequest
from conveyor.agent.runner.entry import main, main_async
from conveyor.agent.runner.job import Runner
from conveyor.agent.runner.policy import (
    DEFAULT_HOOK_TIMEOUT_MS,
    DEFAULT_STEP_TIMEOUT_MS,
    allowlisted_environment,
    bootstrap_environment,
    drift_message,
    emit_timeout_s,
    parse_env_file,
    retry_delay_ms,
)
from conveyor.agent.runner.protocol import Emitter, Placement, mirrors_of

__all__ = [
    "DEFAULT_HOOK_TIMEOUT_MS",
    "DEFAULT_STEP_TIMEOUT_MS",
    "ChildOutcome",
    "Emitter",
    "Placement",
    "Runner",
    "SetupFailed",
    "StepRecord",
    "StopRequest",
    "allowlisted_environment",
    "bootstrap_environment",
    "drift_message",
    "emit_timeout_s",
    "main",
    "main_async",
    "mirrors_of",
    "parse_env_file",
    "retry_delay_ms",
]
