"""Child supervision: a step process started (a spare or a cold one), fed its `run` message, its output
relayed, its control lines answered, stopped on cancel or timeout (SIGTERM, the grace, SIGKILL) with every
process group it made, and what the agent says on stdin (cancel, answers to `event.emit`)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from conveyor.agent.runner.core import Child, ChildOutcome, RunnerCore, StopRequest
from conveyor.agent.runner.policy import allowlisted_environment, bootstrap_environment, parse_env_file
from conveyor.agent.shell import kill_grace_s
from conveyor.agent.signals import signal_group
from conveyor.agent.step_spare import spawn_step
from conveyor.model.masking import StreamMasker

# Output still held open by a leftover background process after the step exited is read this long.
EXIT_LINGER_S = 0.5


class ChildPart(RunnerCore):
    """The runner's step processes."""

    # -- environment ---------------------------------------------------------------------------------

    def step_environment(self, env_file: Path, path_file: Path) -> dict[str, str]:
        """Allowlist < dispatched env < job env < set_env, then PATH additions and CONVEYOR_* last."""
        spec, event = self.spec, self.spec.context.event
        env = allowlisted_environment(os.environ)
        env.update({"TMPDIR": str(self.tmp), "CI": "true"})
        env.update(spec.env)
        env.update(spec.job.env)
        env.update(self.env_updates)
        path_parts = [*self.path_prefix]
        # The requirements venv is the host's: a container job's commands have the image's tools instead.
        if self.python != sys.executable and self.job_container is None:
            path_parts.append(str(Path(self.python).parent))
        base_path = os.environ.get("PATH", os.defpath)
        env["PATH"] = os.pathsep.join([*path_parts, base_path])
        env.update(
            {
                "CONVEYOR_RUN_ID": spec.run_id,
                "CONVEYOR_JOB_ID": spec.job_id,
                "CONVEYOR_WORKFLOW": spec.workflow.name,
                "CONVEYOR_JOB": spec.job.name,
                "CONVEYOR_SHA": str(event.get("sha") or (spec.repo.sha if spec.repo else "")),
                "CONVEYOR_REF": str(event.get("ref") or (spec.repo.ref if spec.repo else "") or ""),
                "CONVEYOR_BRANCH": str(event.get("branch") or ""),
                "CONVEYOR_EVENT_TYPE": str(event.get("type") or ""),
                "CONVEYOR_WORKSPACE": str(self.src),
                "CONVEYOR_ENV": str(env_file),
                "CONVEYOR_PATH": str(path_file),
                "CONVEYOR_LOCAL": "1" if spec.local else "0",
            }
        )
        return {name: value for name, value in env.items() if name.upper() not in {"CONVEYOR_KILL_GRACE_MS"}}

    # -- child processes -----------------------------------------------------------------------------

    async def run_child(
        self,
        index: int,
        message: dict[str, Any],
        *,
        timeout_ms: int | None,
        on_begin: Callable[[], None],
    ) -> ChildOutcome:
        """Start a step process, feed it `message`, relay its output and control lines, wait for it."""
        env_file = self.tmp / f"conveyor-env-{index}"
        path_file = self.tmp / f"conveyor-path-{index}"
        env_file.write_text("")
        path_file.write_text("")
        step_env = self.step_environment(env_file, path_file)
        message = {**message, "env": step_env, "secrets": self.spec.secrets}
        exec_tag = None
        if self.job_container is not None:
            exec_tag = f"{index}-{self.clock():.6f}".replace(".", "")
            message["container"] = {
                **self.job_container.as_message(os.environ.get("PATH", os.defpath)),
                "exec_tag": exec_tag,
            }
        bootstrap = bootstrap_environment(step_env, os.environ)
        # A cold process's `ready` line is read (and ignored) by `_control` with the rest.
        step = await self.spares.take(self.python, bootstrap) or await spawn_step(
            self.python, bootstrap, self.src
        )
        process, reader, writer = step.process, step.reader, step.writer
        child = Child(process, writer, {process.pid}, exec_tag=exec_tag)
        self.child = child
        self._remember_group(process.pid)
        if self.cancel is not None and self._cancel_applies(self.cancel):
            self._request_stop(child, self.cancel)
        outcome = ChildOutcome(status="failed")
        writer.write((json.dumps(message) + "\n").encode())
        await writer.drain()

        def begin() -> None:
            outcome.began = True
            on_begin()

        assert process.stdout is not None and process.stderr is not None
        pumps = [
            asyncio.create_task(self._pump(index, process.stdout, "out")),
            asyncio.create_task(self._pump(index, process.stderr, "err")),
        ]
        control = asyncio.create_task(self._control(child, reader, outcome, begin))
        timeout = None if timeout_ms is None else timeout_ms / 1000
        waiter = asyncio.create_task(process.wait())
        stopper = asyncio.create_task(child.stop_event.wait())
        try:
            done, _ = await asyncio.wait(
                {waiter, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                self._request_stop(child, StopRequest("step_timeout", kill_grace_s()))
            if not waiter.done():
                assert child.stop is not None
                await self._stop(child, child.stop, waiter)
            await waiter
            # The control channel ends with the process; give it a moment to deliver the last lines.
            await asyncio.wait({control, *pumps}, timeout=EXIT_LINGER_S)
        finally:
            for task in (control, *pumps, stopper):
                task.cancel()
            writer.close()
            self.child = None
            for pending, owner in list(self.pending_emits.items()):
                if owner is child:
                    del self.pending_emits[pending]
        # Replacements start once this step is over, so they never compete with it for the CPU.
        self.spares.refill(self.python, bootstrap)
        self._apply_env_files(index, env_file, path_file, outcome)
        return self._conclude(child, outcome, process.returncode)

    def _conclude(self, child: Child, outcome: ChildOutcome, returncode: int | None) -> ChildOutcome:
        stop = child.stop
        if stop is not None and stop.kind in ("cancel", "force"):
            outcome.status, outcome.reason, outcome.retry = "cancelled", "cancelled", False
            outcome.error = outcome.error or "cancelled"
        elif stop is not None and stop.kind in ("step_timeout", "job_timeout"):
            outcome.status, outcome.reason = "timed_out", stop.kind
            outcome.error = "step timed out" if stop.kind == "step_timeout" else "job timed out"
            outcome.retry = stop.kind == "step_timeout"
        elif outcome.result is None:
            outcome.status, outcome.reason = "failed", "step_failed"
            outcome.exit_code = returncode
            how = (
                f"was killed by signal {-returncode}"
                if returncode and returncode < 0
                else f"exited with code {returncode}"
            )
            outcome.error = f"the step process {how} before reporting a result"
        return outcome

    async def _pump(self, index: int, stream: asyncio.StreamReader, name: str) -> None:
        masker = StreamMasker(self.masker)
        partial = ""
        decoder = _utf8_decoder()
        try:
            while data := await stream.read(65536):
                partial += masker.feed(decoder.decode(data))
                *lines, partial = partial.split("\n")
                for line in lines:
                    self._add_line(index, line, name)
                if len(partial) > 64 * 1024:
                    self._add_line(index, partial, name)
                    partial = ""
        finally:
            partial += masker.feed(decoder.decode(b"", final=True)) + masker.flush()
            for line in partial.split("\n") if partial else []:
                self._add_line(index, line, name)

    async def _control(
        self, child: Child, reader: asyncio.StreamReader, outcome: ChildOutcome, begin: Callable[[], None]
    ) -> None:
        while line := await reader.readline():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            kind = message.get("type")
            if kind == "begin":
                begin()
            elif kind == "proc":
                pgid = int(message["pgid"])
                child.groups.add(pgid)
                self._remember_group(pgid)
                if child.stop is not None:
                    signal_group(pgid, signal.SIGKILL if child.stop.kind == "force" else signal.SIGTERM)
            elif kind == "set_env":
                self.env_updates[str(message["name"])] = str(message["value"])
            elif kind == "add_path":
                self.path_prefix.insert(0, str(message["dir"]))
            elif kind == "emit":
                self.pending_emits[str(message["request_id"])] = child
                self.emit(
                    "event.emit",
                    request_id=message["request_id"],
                    name=message["name"],
                    payload=self.masker.mask_json(message.get("payload") or {}),
                    target_repos=message.get("target_repos"),
                )
            elif kind == "summon":
                # The agent calls the orchestrator with the job's credential: docs/design/execution.md §8.6.
                self.pending_emits[str(message["request_id"])] = child
                # Inputs are stored with the summoned run: secret values are masked, as an emit's payload.
                fields = {k: v for k, v in message.items() if k != "type"}
                fields["inputs"] = self.masker.mask_json(message.get("inputs") or {})
                self.emit("summon.request", **fields)
            elif kind == "artifact":
                # Artifact transfers are the agent's (it holds the job's credential): docs/design/artifacts.md §5.
                self.pending_emits[str(message["request_id"])] = child
                self.emit("artifact.request", **{k: v for k, v in message.items() if k != "type"})
            elif kind == "result":
                outcome.result = message
                outcome.status = str(message.get("status", "failed"))
                outcome.reason = message.get("reason")
                outcome.error = message.get("error")
                outcome.outputs = message.get("outputs")
                outcome.exit_code = message.get("exit_code")
                outcome.retry = bool(message.get("retry", True))

    def _apply_env_files(self, index: int, env_file: Path, path_file: Path, outcome: ChildOutcome) -> None:
        try:
            self.env_updates.update(parse_env_file(env_file.read_text(encoding="utf-8", errors="replace")))
        except ValueError as error:
            self.log(index, f"$CONVEYOR_ENV: {error}")
            if outcome.status == "success":
                outcome.status, outcome.reason = "failed", "env_file_invalid"
                outcome.error = f"env_file_invalid: {error}"
        except OSError:
            pass
        try:
            for line in path_file.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.strip():
                    self.path_prefix.insert(0, line.strip())
        except OSError:
            pass

    def _remember_group(self, pgid: int) -> None:
        if pgid not in self.groups:
            self.groups.add(pgid)
            self.emit("proc", pgid=pgid)

    def _request_stop(self, child: Child, request: StopRequest) -> None:
        if child.stop is not None and not (request.kind == "force" and child.stop.kind != "force"):
            return
        child.stop = request
        child.stop_event.set()

    async def _stop(self, child: Child, request: StopRequest, waiter: asyncio.Task[int]) -> None:
        """SIGTERM the step's group and every `ctx.sh` group; SIGKILL whatever is left after the grace.

        In a container job the step's commands run in the job container: they get the same signals there.
        """
        if request.kind != "force":
            for pgid in list(child.groups):
                signal_group(pgid, signal.SIGTERM)
            await self._signal_container_commands(child, "TERM")
            deadline = self.clock() + request.grace_s
            while self.clock() < deadline:
                if child.stop is not None and child.stop.kind == "force":
                    break
                if waiter.done() and not any(_group_alive(pgid) for pgid in child.groups):
                    break
                await asyncio.sleep(0.05)
            else:
                await self._kill(child)
                return
            if child.stop is None or child.stop.kind != "force":
                # The step is gone; a command of its in the container may still be in its own grace.
                await self._signal_container_commands(child, "KILL", after_s=request.grace_s)
                return
        await self._kill(child)

    async def _kill(self, child: Child) -> None:
        for pgid in list(child.groups):
            signal_group(pgid, signal.SIGKILL)
        await self._signal_container_commands(child, "KILL")

    async def _signal_container_commands(self, child: Child, signal_name: str, after_s: float = 0.0) -> None:
        if child.exec_tag is None or self.containers is None:
            return
        if after_s:
            containers, tag = self.containers, child.exec_tag
            self._later.add(asyncio.ensure_future(self._signal_later(containers, tag, signal_name, after_s)))
            return
        await self.containers.signal_commands(child.exec_tag, signal_name)

    async def _signal_later(self, containers: Any, tag: str, signal_name: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        await containers.signal_commands(tag, signal_name)

    # -- control from the agent --------------------------------------------------------------------

    def request_cancel(self, force: bool, reason: str | None = None) -> None:
        """Graceful: stop the running step with the job's grace period; force: SIGKILL now, no hooks."""
        grace = self.spec.job.grace_period_ms / 1000
        request = StopRequest("force" if force else "cancel", 0.0 if force else grace)
        if self.cancel is not None and not (force and self.cancel.kind != "force"):
            return
        self.cancel = request
        self.cancel_reason = reason or self.cancel_reason
        if self.child is not None and self._cancel_applies(request):
            self._request_stop(self.child, request)

    def _cancel_applies(self, request: StopRequest) -> bool:
        # Hooks (`on_cancel`, `cleanup`) run after a graceful cancel; only a forced one stops them.
        return request.kind == "force" or not self.in_hooks

    def answer_emit(self, answer: Mapping[str, Any]) -> None:
        """Pass the orchestrator's answer to `event.emit` back to the waiting step."""
        child = self.pending_emits.pop(str(answer.get("request_id")), None)
        if child is not None:
            child.writer.write((json.dumps(dict(answer)) + "\n").encode())

    async def _read_control(self, stdin: asyncio.StreamReader) -> None:
        while line := await stdin.readline():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if "cancel" in message:
                options = message["cancel"] or {}
                self.request_cancel(bool(options.get("force")), options.get("reason"))
            elif "emit_result" in message:
                self.answer_emit(message["emit_result"])
            elif "artifact_result" in message:
                self.answer_emit(message["artifact_result"])
            elif "summon_result" in message:
                self.answer_emit(message["summon_result"])

    async def _watch_job_deadline(self) -> None:
        timeout_ms = self.spec.job.timeout_ms
        if timeout_ms is None:
            return
        await asyncio.sleep(timeout_ms / 1000)
        self.job_timed_out = True
        if self.child is not None:
            self._request_stop(self.child, StopRequest("job_timeout", kill_grace_s()))

    def kill_leftovers(self) -> None:
        """SIGKILL every process group the job recorded (a step's `sleep 300 &` included), and the spare."""
        for pid in self.spares.pids:
            signal_group(pid, signal.SIGKILL)
        for pgid in self.groups:
            signal_group(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _utf8_decoder() -> Any:
    import codecs

    return codecs.getincrementaldecoder("utf-8")(errors="replace")
