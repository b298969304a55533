"""The step process: `python -m conveyor.agent.step` runs one step, hook or setup inspection.

The runner starts it in a new session (its own process group) with cwd `src`, stdin `/dev/null` and
stdout/stderr piped into the log. The control channel (a socket on fd 3, or `CONVEYOR_CONTROL_FD`) carries
`ready` out once the process has imported what it needs (a spare waits there), `run {...}` in, and
`begin`, `set_env`, `add_path`, `proc`, `emit` and finally `result {...}` out. Whatever
the user code does (`sys.exit`, a crash, `os._exit`), the runner learns the outcome from `result` or from the
exit status, never by sharing a process with it.
"""

from __future__ import annotations

import asyncio
import inspect as pyinspect
import json
import os
import socket
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import conveyor
from conveyor.agent.context import ControlChannel, StepContextImpl, stream_writers
from conveyor.errors import ConveyorError
from conveyor.heap import freeze_startup_heap
from conveyor.sdk.context import ShError, ShTimeout, StepFailed

MAX_OUTPUTS_BYTES = 64 * 1024
_SDK_DIR = str(Path(conveyor.__file__).resolve().parent)
_JSON_KINDS: dict[type, tuple[type, ...]] = {
    str: (str,),
    int: (int,),
    float: (int, float),
    bool: (bool,),
    list: (list,),
    dict: (dict,),
}


class StepOutcome(ConveyorError):
    """Ends the step with a status and reason other than a plain failure."""

    def __init__(self, status: str, reason: str | None, error: str | None = None) -> None:
        super().__init__(error or reason or status)
        self.status, self.reason, self.error = status, reason, error


def user_traceback(error: BaseException) -> str:
    """The traceback without Conveyor's own frames (the user's code is what matters)."""
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not str(Path(frame.filename).resolve()).startswith(_SDK_DIR)
    ]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
    lines.extend(traceback.format_exception_only(type(error), error))
    return "".join(lines).rstrip("\n")


def _call(function: Any, ctx: Any) -> Any:
    value = function(ctx)
    if pyinspect.iscoroutine(value):
        value = asyncio.run(value)
    return value


def _import(run: Mapping[str, Any]) -> Any:
    from conveyor.lockfile.loader import import_workflow_file

    # A global workflow is imported from its own repository, beside the workspace
    # (docs/design/global_workflows.md §5); every other from the workspace.
    root = Path(run.get("workflow_root") or run["root"])
    try:
        imported = import_workflow_file(root, root / run["workflow_file"])
    except Exception as error:
        diagnostics = getattr(error, "diagnostics", None)
        detail = "; ".join(str(item) for item in diagnostics) if diagnostics else repr(error)
        raise StepOutcome(
            "failed", "import_error", f"importing {run['workflow_file']} failed: {detail}"
        ) from None
    # Imports inside step bodies (`from release import deploy`) must keep working after the isolated import.
    sys.path.insert(0, str(root / ".conveyor"))
    return imported


def _find_workflow(module: Any, name: str) -> Any:
    from conveyor.lockfile.loader import module_workflows

    for _, item in module_workflows(module):
        if item.name == name:
            return item
    raise StepOutcome("failed", "lock_out_of_date", f"workflow {name!r} is not defined in the checkout")


def evaluate_rules(rules: list[Any], ctx: Any, stderr: Any) -> dict[str, Any]:
    """Rules in order, stopping at the first that does not pass: `passed`, `skipped` (label) or `error`."""
    for item in rules:
        if item.check is None:
            continue
        try:
            value = _call(item.check, ctx)
        except BaseException as error:
            stderr.write(user_traceback(error) + "\n")
            return {"status": "error", "label": item.label, "error": f"rule {item.label!r} raised: {error!r}"}
        passed = bool(value) if item.kind == "rule" else not bool(value)
        if not passed:
            return {"status": "skipped", "label": item.label}
    return {"status": "passed"}


def check_outputs(value: Any, declared: Any) -> dict[str, Any] | None:
    """A step's return value as outputs: None or a JSON-serialisable dict of at most 64 KiB."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise StepOutcome(
            "failed", "outputs_invalid", f"a step must return None or a dict, not {value!r:.200}"
        )
    if isinstance(declared, Mapping):
        for key, kind in declared.items():
            if key not in value:
                raise StepOutcome("failed", "outputs_invalid", f"declared output {key!r} is missing")
            allowed = _JSON_KINDS.get(kind, (kind,))
            item = value[key]
            if not isinstance(item, allowed) or (kind is not bool and isinstance(item, bool)):
                raise StepOutcome(
                    "failed", "outputs_invalid", f"output {key!r} must be {kind.__name__}, not {item!r:.100}"
                )
        unknown = sorted(set(value) - set(declared))
        if unknown:
            raise StepOutcome("failed", "outputs_invalid", f"undeclared outputs: {', '.join(unknown)}")
    elif declared is not None and hasattr(declared, "model_validate"):
        try:
            value = declared.model_validate(value).model_dump(mode="json")
        except Exception as error:
            raise StepOutcome(
                "failed", "outputs_invalid", f"outputs do not match the model: {error}"
            ) from None
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise StepOutcome(
            "failed", "outputs_invalid", f"outputs are not JSON-serialisable: {error}"
        ) from None
    if len(text.encode("utf-8")) > MAX_OUTPUTS_BYTES:
        raise StepOutcome("failed", "outputs_too_large", "outputs are over 64 KiB serialised")
    result: dict[str, Any] = json.loads(text)
    return result


def _inspect(run: Mapping[str, Any], ctx: StepContextImpl, stderr: Any) -> dict[str, Any]:
    imported = _import(run)
    workflow = _find_workflow(imported.module, run["workflow"])
    missing: list[str] = []
    hooks: dict[str, int] = {}
    rules: dict[str, Any] = {"status": "passed"}
    job_name = run["job"]
    if job_name == "__hooks__":
        hooks = {kind: hook.timeout_ms for kind, hook in workflow.hooks.items()}
    else:
        job = workflow.jobs.get(job_name)
        if job is None:
            missing.append(f"job {job_name!r}")
        else:
            names = {item.name for item in job.steps}
            missing.extend(f"step {name!r}" for name in run.get("steps", []) if name not in names)
            missing.extend(f"{kind} hook" for kind in run.get("hooks", []) if kind not in job.hooks)
            if not missing and run.get("evaluate_rules", True):
                rules = evaluate_rules(workflow.rules, ctx, stderr)
                if rules["status"] == "passed":
                    rules = evaluate_rules(job.rules, ctx, stderr)
    return {
        "status": "success",
        "inspect": {
            "imported": sorted({run["workflow_file"], *imported.imported_files}),
            "missing": missing,
            "hooks": hooks,
            "rules": rules,
        },
    }


def _run_user_code(run: Mapping[str, Any], ctx: StepContextImpl, control: ControlChannel, stderr: Any) -> Any:
    imported = _import(run)
    workflow = _find_workflow(imported.module, run["workflow"])
    declared: Any = None
    retry_on: Any = None
    if run["kind"] == "hook":
        owner = workflow if run["owner"] == "workflow" else workflow.jobs.get(run["job"])
        hook = None if owner is None else owner.hooks.get(run["hook"])
        if hook is None:
            raise StepOutcome("failed", "lock_out_of_date", f"{run['hook']} hook not found in the checkout")
        function = hook.fn
    else:
        job = workflow.jobs.get(run["job"])
        step = None if job is None else next((s for s in job.steps if s.name == run["step"]), None)
        if step is None:
            raise StepOutcome("failed", "lock_out_of_date", f"step {run['step']!r} not found in the checkout")
        if run.get("evaluate_rules", True):
            verdict = evaluate_rules(step.rules, ctx, stderr)
            if verdict["status"] == "skipped":
                raise StepOutcome("skipped", "rules", f"rule {verdict['label']!r} did not pass")
            if verdict["status"] == "error":
                raise StepOutcome("failed", "rule_error", verdict["error"])
        function, declared = step.fn, step.outputs
        retry_on = step.retry.retry_on if step.retry is not None else None
    control.send({"type": "begin"})
    try:
        value = _call(function, ctx)
    except BaseException as error:
        error.retry_on = retry_on  # type: ignore[attr-defined]
        raise
    return check_outputs(value, declared)


def execute(run: Mapping[str, Any], control: ControlChannel, stdout: Any, stderr: Any) -> dict[str, Any]:
    """Run what `run` asks for and describe the outcome as a `result` message."""
    ctx = StepContextImpl(run, control, stdout, stderr)
    # Module-level code and steps that spawn processes themselves see the step environment, nothing else.
    ctx.apply_environment()
    try:
        if run["kind"] == "inspect":
            return _inspect(run, ctx, stderr)
        outputs = _run_user_code(run, ctx, control, stderr)
        # Caches are saved only once the step succeeded (docs/design/caches.md §5).
        ctx.save_caches()
        return {"status": "success", "outputs": outputs}
    except StepOutcome as outcome:
        return {"status": outcome.status, "reason": outcome.reason, "error": outcome.error}
    except BaseException as error:
        exit_code = None
        if isinstance(error, SystemExit):
            code = error.code
            exit_code = code if isinstance(code, int) else (0 if code is None else 1)
            message = f"the step called sys.exit({code!r})"
        elif isinstance(error, StepFailed):
            message = str(error)
        elif isinstance(error, ShError | ShTimeout):
            message = str(error)
        else:
            stderr.write(user_traceback(error) + "\n")
            message = f"{type(error).__name__}: {error}"
        retry = True
        retry_on = getattr(error, "retry_on", None)
        if retry_on is not None:
            try:
                retry = bool(retry_on(error))
            except Exception as problem:
                stderr.write(f"retry_on raised {problem!r}; not retrying\n")
                retry = False
        if isinstance(error, KeyboardInterrupt):
            retry = False
        return {
            "status": "failed",
            "reason": "step_failed",
            "error": message,
            "exit_code": exit_code,
            "retry": retry,
        }


def main() -> None:
    """Entry point: read `run` from the control channel, execute it, send `result`, exit."""
    fd = int(os.environ.pop("CONVEYOR_CONTROL_FD", "3"))
    os.set_inheritable(fd, False)
    channel = socket.socket(fileno=fd)
    control = ControlChannel(channel)
    # Everything but the workflow itself is imported before `ready`, so a spare is as far along as it can be.
    from conveyor.lockfile.loader import resolve_loaded_modules

    resolve_loaded_modules()
    freeze_startup_heap()
    control.send({"type": "ready"})
    try:
        run = control.receive()
        while run.get("type") == "preload":
            # A container job's spare: the Engine API client, imported while the spare waits.
            import conveyor.agent.container_exec  # noqa: F401

            run = control.receive()
    except EOFError:  # a spare the runner no longer needs
        os._exit(0)
    stdout, stderr = stream_writers()
    os.chdir(run["root"])
    result = execute(run, control, stdout, stderr)
    stdout.flush()
    stderr.flush()
    control.send({"type": "result", **result})
    # Non-daemon threads left behind by user code must not keep the step alive.
    os._exit(0)


if __name__ == "__main__":
    main()
