"""The agent side of execution: the job runner, step processes, `ctx`, checkout, requirements.

`JobProcess` is what the agent program (and `conveyor run local`) uses to run one job; `JobSpec` is the job
it is given. Nothing here imports user code in the calling process. Names are imported lazily so that a
step process (`conveyor.agent.step`) starts without loading what only the agent needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.agent.process import JobProcess
    from conveyor.agent.spec import JobSpec, RepoSpec, RunContext, UpstreamResult, WorkflowRef

_EXPORTS = {
    "JobProcess": "conveyor.agent.process",
    "JobSpec": "conveyor.agent.spec",
    "RepoSpec": "conveyor.agent.spec",
    "RunContext": "conveyor.agent.spec",
    "UpstreamResult": "conveyor.agent.spec",
    "WorkflowRef": "conveyor.agent.spec",
}

__all__ = [
    "JobProcess",
    "JobSpec",
    "RepoSpec",
    "RunContext",
    "UpstreamResult",
    "WorkflowRef",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'conveyor.agent' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
