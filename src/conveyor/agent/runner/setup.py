"""Job setup: checkout (through the mirrors or direct), requirements, the drift check, the job's
containers, and the inspection of the workflow (import, rules, hooks) in a step process."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from typing import Any

from conveyor.agent.checkout import CheckoutFailed, checkout
from conveyor.agent.container_plan import AGENT_ID_VARIABLE, ContainerFailed, engine_address, local_agent_id
from conveyor.agent.requirements import (
    RequirementsFailed,
    ensure_venv,
    remember_interpreter,
    requirement_lines,
    venv_python,
)
from conveyor.agent.runner.core import RunnerCore, SetupFailed
from conveyor.agent.runner.policy import (
    DEFAULT_HOOK_TIMEOUT_MS,
    allowlisted_environment,
    drift_message,
    emit_timeout_s,
)
from conveyor.lockfile.hashing import content_hash_of_checkout


class SetupPart(RunnerCore):
    """The runner's job setup."""

    def _context(self, step: str, outcome: dict[str, Any] | None = None) -> dict[str, Any]:
        spec = self.spec
        event = spec.context.event
        return {
            "event": event,
            "inputs": (event.get("payload") or {}).get("inputs") or {},
            "matrix": spec.matrix,
            "needs": {name: result.model_dump() for name, result in spec.upstream.items()},
            "workflow": spec.workflow.name,
            "job": spec.job.name,
            "step": step,
            "run_id": spec.run_id,
            "emit_timeout_s": emit_timeout_s(),
            "environment": spec.environment,
            "is_local": spec.local,
            "workspace": str(self.workspace),
            "outputs_of": {
                name: (record.outputs if record.status == "success" else None)
                for name, record in self.records.items()
            },
            "outcome": outcome,
        }

    def _base_message(self, kind: str, step: str, attempt: int = 1) -> dict[str, Any]:
        return {
            "type": "run",
            "kind": kind,
            "root": str(self.src),
            "workflow_root": str(self.workflow_src),
            "workflow_file": self.spec.workflow.file,
            "workflow": self.spec.workflow.name,
            "job": self.spec.job.name,
            "step": step,
            "attempt": attempt,
            "ctx": self._context(step),
        }

    async def setup(self) -> tuple[str, dict[str, int]]:
        """Checkout, requirements, drift check, import and job rules; returns (`passed`|`skipped`, hooks)."""
        spec = self.spec
        self.tmp.mkdir(parents=True, exist_ok=True)
        if spec.job.container is not None or spec.job.services:
            # The engine client's import, and then the job's network, services and container, overlap the
            # checkout and the drift check (the workspace the container mounts exists already); a missing
            # image waits for the drift check before it is pulled. `remove_containers` waits for them.
            self.containers_import = asyncio.ensure_future(
                asyncio.to_thread(importlib.import_module, "conveyor.agent.containers")
            )
            self.containers_starting = asyncio.ensure_future(self.start_containers())
        else:
            # A ready runner's spares preload the engine client for a container job that did not come: the
            # replacements a host job starts after each step need not compete with its next one for it.
            self.spares.preload_containers = False
        if spec.repo is not None:
            base_env = {**allowlisted_environment(os.environ), "TMPDIR": str(self.tmp)}

            def setup_log(text: str, stream: str) -> None:
                self.log(0, text, stream)

            try:
                # A job without checkout needs only `.conveyor/`: a blob-less sparse fetch from the clone
                # URL is smaller than the mirror's full tree, and keeps partial clones out of the mirror.
                if self.mirrors is not None and spec.job.checkout:
                    await self.mirrors.checkout(spec.repo, self.src, base_env=base_env, log=setup_log)
                else:
                    await checkout(
                        spec.repo, self.src, base_env=base_env, log=setup_log, sparse=not spec.job.checkout
                    )
            except (CheckoutFailed, OSError) as error:
                raise SetupFailed("checkout_failed", f"checkout failed: {error}") from None
            if spec.workflow.repo is not None:
                try:
                    await checkout(spec.workflow.repo, self.workflow_src, base_env=base_env, log=setup_log)
                except (CheckoutFailed, OSError) as error:
                    raise SetupFailed(
                        "checkout_failed", f"checkout of the workflow's repository failed: {error}"
                    ) from None
        elif not self.src.is_dir():
            raise SetupFailed("checkout_failed", f"no source at {self.src}")
        requirements = self.workflow_src / ".conveyor" / "requirements.txt"
        if requirements.is_file() and requirement_lines(requirements.read_text(encoding="utf-8")):
            try:
                venv = await ensure_venv(requirements, self.venvs_dir, lambda t, s: self.log(0, t, s))
            except (RequirementsFailed, OSError) as error:
                raise SetupFailed("requirements_failed", f"requirements failed: {error}") from None
            self.python = str(venv_python(venv))
            remember_interpreter(self.venvs_dir, self.python)
        else:
            remember_interpreter(self.venvs_dir, None)
        try:
            actual = content_hash_of_checkout(self.workflow_src, spec.workflow.hashed_files)
        except OSError as error:
            self.log(0, f"drift check: {error}")
            raise SetupFailed("lock_out_of_date", drift_message(spec.workflow.name)) from None
        if actual != spec.workflow.content_hash:
            self.log(0, f"content hash {actual} differs from the lock's {spec.workflow.content_hash}")
            raise SetupFailed("lock_out_of_date", drift_message(spec.workflow.name))
        if self.containers_starting is not None:
            self.pull_gate.set()
            await self.containers_starting
        message = self._base_message("inspect", "")
        message["steps"] = [step.name for step in spec.job.steps]
        message["hooks"] = list(spec.job.hooks)
        outcome = await self.run_child(0, message, timeout_ms=DEFAULT_HOOK_TIMEOUT_MS, on_begin=lambda: None)
        if outcome.status in ("cancelled", "timed_out"):
            raise SetupFailed(outcome.reason or outcome.status, outcome.error or outcome.status)
        if outcome.result is None or outcome.status != "success":
            reason = (
                outcome.reason if outcome.reason in ("import_error", "lock_out_of_date") else "import_error"
            )
            raise SetupFailed(reason, outcome.error or "importing the workflow failed")
        report = outcome.result["inspect"]
        unlisted = sorted(set(report["imported"]) - set(spec.workflow.hashed_files))
        if unlisted or report["missing"]:
            for item in unlisted:
                self.log(0, f"{item} is imported but not listed in the lock")
            for item in report["missing"]:
                self.log(0, f"{item} is in the lock but not in the checkout")
            raise SetupFailed("lock_out_of_date", drift_message(spec.workflow.name))
        rules = report["rules"]
        if rules["status"] == "error":
            raise SetupFailed("rule_error", self.masker.mask(rules.get("error") or "a rule raised"))
        if rules["status"] == "skipped":
            self.log(0, f"skipped: rule {rules['label']!r} did not pass")
            return "skipped", report["hooks"]
        return "passed", report["hooks"]

    async def start_containers(self) -> None:
        """The job's network, services and job container (docs/design/containers.md §4), before any step code."""
        self.spares.prepare_for_containers()
        # Imported here (started in a thread when setup began): aiodocker is a cost a host job need not pay.
        if self.containers_import is not None:
            await self.containers_import
        from conveyor.agent.containers import JobContainers

        self.containers = JobContainers(
            self.spec.job,
            job_id=self.spec.job_id,
            agent_id=os.environ.get(AGENT_ID_VARIABLE) or local_agent_id(),
            workspace=self.workspace,
            engine=engine_address(os.environ),
            log=lambda text: self.log(0, text),
            stopped=lambda: self.cancel is not None or self.job_timed_out or self.setup_abandoned,
            pull_gate=self.pull_gate,
        )
        try:
            self.job_container = await self.containers.start()
        except ContainerFailed as failure:
            if self.setup_abandoned:
                raise SetupFailed("cancelled", "the setup failed while the containers started") from None
            if self.job_timed_out:
                raise SetupFailed("job_timeout", "job timed out while its containers started") from None
            raise SetupFailed(failure.reason, failure.message) from None
        if self.cancel is not None:
            raise SetupFailed("cancelled", "cancelled")
        if self.job_timed_out:
            raise SetupFailed("job_timeout", "job timed out while its containers started")

    async def remove_containers(self) -> None:
        """Remove what the job started on the engine (idempotent); a failure is left to the agent's sweep."""
        starting, self.containers_starting = self.containers_starting, None
        if starting is not None and not starting.done():
            # The setup failed (a checkout, say) while the containers started: what they are waiting for
            # ends, and what was created is known before it is removed.
            self.setup_abandoned = True
            self.pull_gate.set()
            await asyncio.wait({starting})
        if starting is not None and not starting.cancelled():
            starting.exception()  # told by the setup when it waited; here it is only retrieved
        containers, self.containers, self.job_container = self.containers, None, None
        if containers is None:
            return
        for pending in self._later:
            pending.cancel()
        try:
            await containers.remove()
        except Exception as problem:  # the job's result must still be reported
            print(f"conveyor runner: removing the job's containers: {problem!r}", file=sys.stderr)
