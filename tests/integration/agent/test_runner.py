"""The runner and step processes, for real: every test runs a job through `JobProcess`."""

from __future__ import annotations

import base64
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from conveyor.agent.process import JobProcess
from tests.integration.agent.conftest import job_spec, run_job, runner_env, write_workflow
from tests.support.waiting import wait_until

HEADER = """
import os, sys, time, signal, base64
from conveyor import workflow, push, Retry, rule, skip, StepFailed
w = workflow("w", on=push())
"""


def live_members(pgids: set[int]) -> list[int]:
    """Pids (not zombies) whose process group is one of `pgids`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp in pgids and state != "Z":
            found.append(int(entry.name))
    return found


def groups_of(messages: list[dict[str, Any]]) -> set[int]:
    return {m["pgid"] for m in messages if m["type"] == "proc"}


async def test_argv_commands_run_without_a_shell_and_outputs_reach_the_job(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux")
@j.step
def hello(ctx):
    ctx.sh(["echo", "$HOME"])
    result = ctx.sh("echo out; echo err >&2")
    return {"stdout": result.stdout, "stderr": result.stderr}
@j.step
def later(ctx):
    assert ctx.outputs_of("hello")["stdout"] == "out\\n"
""",
    )
    run = await run_job(job_spec(lock), workspace)
    assert run.finished["status"] == "success"
    assert "$HOME" in run.log_lines(run.index_of("hello"))
    assert run.step("hello")["outputs"] == {"stdout": "out\n", "stderr": "err\n"}
    assert run.finished["outputs"] == {"hello": {"stdout": "out\n", "stderr": "err\n"}}
    assert next(m["seq"] for m in run.messages if m["type"] == "log" and m["step_index"] == 1) == 0


async def test_secrets_are_masked_plain_base64_and_through_sh(workspace: Path) -> None:
    secret = "hunter2-very-secret"
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux")
@j.step
def leak(ctx):
    value = ctx.secrets.get("TOKEN")
    print("plain", value)
    print("b64", base64.b64encode(value.encode()).decode())
    ctx.secrets.expose("TOKEN", as_="MY_TOKEN")
    ctx.sh("echo shell $MY_TOKEN; echo $MY_TOKEN >&2")
    sys.stdout.write(value[:7]); sys.stdout.flush(); sys.stdout.write(value[7:] + "\\n")
    try:
        ctx.secrets.get("NOPE")
    except KeyError as error:
        print("missing:", error)
    raise StepFailed("failing with " + value)
""",
    )
    run = await run_job(job_spec(lock, secrets={"TOKEN": secret}), workspace)
    text = run.log_text()
    encoded = base64.b64encode(secret.encode()).decode()
    assert secret not in text and encoded not in text
    assert "plain ***" in text and "shell ***" in text
    assert "available: TOKEN" in text
    step = run.step("leak")
    assert step["status"] == "failed" and secret not in step["error"] and "***" in step["error"]


@pytest.mark.slow
async def test_outputs_and_emitted_payloads_leave_the_runner_masked(workspace: Path) -> None:
    secret = "hunter2-very-secret"
    encoded = base64.b64encode(secret.encode()).decode()
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux")
@j.step
def leak(ctx):
    value = ctx.secrets.get("TOKEN")
    ctx.emit("leaked", {"token": value, value: [base64.b64encode(value.encode()).decode()]})
    return {"token": value, "nested": {"list": ["x", value]}, value: 1}
@j.step
def later(ctx):
    # Inside the job, a later step still sees the value itself.
    assert ctx.outputs_of("leak")["token"] == ctx.secrets.get("TOKEN")
""",
    )
    emitted: list[dict[str, Any]] = []

    async def answer(message: dict[str, Any], process: JobProcess) -> None:
        if message["type"] == "event.emit":
            emitted.append(message)
            process.answer_emit(message["request_id"], event_id="evt-1")

    run = await run_job(job_spec(lock, secrets={"TOKEN": secret}), workspace, on_message=answer)
    assert run.finished["status"] == "success", run.finished
    masked = {"token": "***", "nested": {"list": ["x", "***"]}, "***": 1}
    assert run.step("leak")["outputs"] == masked
    assert run.finished["outputs"] == {"leak": masked}
    assert [m["payload"] for m in emitted] == [{"token": "***", "***": ["***"]}]
    for message in run.messages:
        assert secret not in repr(message) and encoded not in repr(message)


async def test_a_hung_command_times_out_the_step_and_leaves_no_process(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux")
@j.step(timeout="5s")
def hang(ctx):
    ctx.sh("echo $$ > sleep.pgid; exec sleep 600")
""",
    )
    run = await run_job(job_spec(lock), workspace)
    step = run.step("hang")
    assert step["status"] == "timed_out" and step["reason"] == "step_timeout"
    assert run.finished["status"] == "timed_out"
    assert run.finished["reason"] == "step_timeout: hang"
    groups = groups_of(run.messages)
    sleep_group = int((workspace / "src" / "sleep.pgid").read_text())
    assert sleep_group in groups
    wait_until(lambda: not live_members(groups), timeout=5, what="every group of the step to be gone")


async def test_os_exit_fails_the_step_with_its_exit_code(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux")
@j.step
def boom(ctx):
    print("about to exit")
    os._exit(7)
@j.step
def never(ctx):
    pass
""",
    )
    run = await run_job(job_spec(lock), workspace)
    assert run.step("boom")["status"] == "failed" and run.step("boom")["exit_code"] == 7
    assert run.step("never")["status"] == "skipped"
    assert run.finished["status"] == "failed" and run.finished["reason"] == "step_failed: boom"
    assert "about to exit" in run.log_text()


async def test_sys_exit_and_exceptions_fail_the_step_with_a_traceback(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux")
@j.step(continue_on_error=True)
def exits(ctx):
    sys.exit(3)
@j.step
def raises(ctx):
    {}["missing"]
""",
    )
    run = await run_job(job_spec(lock), workspace)
    assert run.step("exits")["exit_code"] == 3
    assert run.step("raises")["error"] == "KeyError: 'missing'"
    assert "Traceback" in run.log_text() and "conveyor/agent" not in run.log_text()


async def test_a_runner_killed_with_sigkill_fails_the_job_runner_crashed(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux")
@j.step
def sleepy(ctx):
    print("ready")
    ctx.sh(["sleep", "600"])
""",
    )

    async def kill_runner(message: dict[str, Any], process: JobProcess) -> None:
        if message["type"] == "log" and any(line["text"] == "ready" for line in message["lines"]):
            assert process.pid is not None
            os.kill(process.pid, signal.SIGKILL)

    process = JobProcess(env=runner_env())
    run = await run_job(job_spec(lock), workspace, process, on_message=kill_runner)
    assert run.finished["status"] == "failed" and run.finished["reason"] == "runner_crashed"
    assert run.step("sleepy")["reason"] == "runner_crashed"
    groups = groups_of(run.messages) | {process.pid or 0}
    wait_until(lambda: not live_members(groups), timeout=5, what="the crashed runner's groups to be gone")


@pytest.mark.slow
async def test_retries_with_backoff_until_success(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux")
@j.step(retry=Retry(max_attempts=3, delay="100ms"))
def flaky(ctx):
    marker = ctx.workspace / "attempts"
    count = int(marker.read_text()) if marker.exists() else 0
    marker.write_text(str(count + 1))
    print("attempt", ctx.attempt)
    if count < 2:
        raise StepFailed(f"attempt {count + 1} failed")
""",
    )
    run = await run_job(job_spec(lock), workspace)
    step = run.step("flaky")
    assert step["status"] == "success" and step["attempts"] == 3
    text = run.log_text()
    assert "attempt 2/3" in text and "attempt 3/3" in text
    assert [m["type"] for m in run.messages if m.get("step_index") == step["step_index"]].count(
        "step.started"
    ) == 1


async def test_retry_on_false_stops_retrying_and_continue_on_error_keeps_the_job_green(
    workspace: Path,
) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux")
@j.step(retry=Retry(max_attempts=5, delay="50ms", retry_on=lambda exc: False), continue_on_error=True)
def broken(ctx):
    raise StepFailed("nope")
@j.step
def after(ctx):
    print("after ran")
""",
    )
    run = await run_job(job_spec(lock), workspace)
    assert run.step("broken")["status"] == "failed" and run.step("broken")["attempts"] == 1
    assert run.step("after")["status"] == "success"
    assert run.finished["status"] == "success"


async def test_rules_skip_jobs_and_steps_and_raising_rules_fail(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
off = w.job("off", runs_on="linux", rules=[rule("never", lambda ctx: False)], run=lambda ctx: print("ran"))
mixed = w.job("mixed", runs_on="linux")
@mixed.step(rules=[skip("on main", lambda ctx: ctx.event.branch == "main")])
def skipped_step(ctx):
    print("should not run")
@mixed.step
def runs(ctx):
    print("ran")
bad = w.job("bad", runs_on="linux", rules=[rule("raises", lambda ctx: 1 / 0)], run=lambda ctx: None)
""",
    )
    off = await run_job(job_spec(lock, job="off"), workspace)
    assert off.finished["status"] == "skipped" and off.finished["reason"] == "rules"
    assert off.step("off")["status"] == "skipped"
    mixed = await run_job(job_spec(lock, job="mixed"), workspace)
    assert mixed.step("skipped_step")["status"] == "skipped"
    assert not any(m["type"] == "step.started" and m["name"] == "skipped_step" for m in mixed.messages)
    assert mixed.finished["status"] == "success"
    bad = await run_job(job_spec(lock, job="bad"), workspace)
    assert bad.finished["status"] == "failed" and bad.finished["reason"] == "rule_error"


async def test_outputs_must_be_small_json_dicts(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux")
@j.step(continue_on_error=True)
def not_a_dict(ctx):
    return [1, 2]
@j.step(continue_on_error=True)
def too_big(ctx):
    return {"x": "a" * 70000}
@j.step(outputs={"version": str}, continue_on_error=True)
def wrong_type(ctx):
    return {"version": 3}
@j.step(outputs={"version": str})
def fine(ctx):
    return {"version": "1.0"}
""",
    )
    run = await run_job(job_spec(lock), workspace)
    assert run.step("not_a_dict")["reason"] == "outputs_invalid"
    assert run.step("too_big")["reason"] == "outputs_too_large"
    assert run.step("wrong_type")["reason"] == "outputs_invalid"
    assert run.finished["outputs"] == {"fine": {"version": "1.0"}}


async def test_set_env_add_path_and_env_files_reach_later_steps(workspace: Path, tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    lock = write_workflow(
        workspace / "src",
        HEADER
        + f"""
j = w.job("j", runs_on="linux", env={{"FROM_JOB": "job"}})
@j.step
def first(ctx):
    ctx.set_env("GREETING", "hello")
    assert ctx.sh("echo $GREETING").stdout == "hello\\n"
    ctx.add_path({str(tools)!r})
    ctx.sh("echo FROM_FILE=yes >> $CONVEYOR_ENV")
    try:
        ctx.set_env("CONVEYOR_X", "1")
    except ValueError:
        print("reserved refused")
@j.step
def second(ctx):
    assert ctx.env["GREETING"] == "hello" and ctx.env["FROM_FILE"] == "yes"
    assert ctx.env["PATH"].split(":")[0] == {str(tools)!r}
    assert ctx.env["FROM_JOB"] == "job" and ctx.env["CI"] == "true"
    assert ctx.env["CONVEYOR_JOB"] == "j" and "AGENT_SECRET" not in ctx.env
    print(ctx.sh("echo $GREETING-$FROM_FILE", quiet=True).stdout.strip())
""",
    )
    process = JobProcess(env=runner_env(AGENT_SECRET="do-not-leak"))
    run = await run_job(job_spec(lock), workspace, process)
    assert run.finished["status"] == "success", run.log_text()
    assert "hello-yes" in run.log_text() and "reserved refused" in run.log_text()


async def test_hooks_run_in_order_after_failure_and_success(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
bad = w.job("bad", runs_on="linux")
@bad.step
def fails(ctx):
    raise StepFailed("no")
@bad.on_success
def hook_success(ctx):
    print("on_success")
@bad.on_failure
def hook_failure(ctx):
    print("on_failure", ctx.outcome.status, ctx.outcome.failed_step)
@bad.cleanup
def hook_cleanup(ctx):
    print("cleanup")
good = w.job("good", runs_on="linux", run=lambda ctx: None)
@good.on_success
def good_success(ctx):
    raise StepFailed("on_success fails the job")
""",
    )
    run = await run_job(job_spec(lock, job="bad"), workspace)
    hooks = [m["name"] for m in run.messages if m["type"] == "step.finished" and m["kind"] == "hook"]
    assert hooks == ["on_failure", "cleanup"]
    assert "on_failure failed fails" in run.log_text()
    assert run.finished["status"] == "failed"
    good = await run_job(job_spec(lock, job="good"), workspace)
    assert good.finished["status"] == "failed" and good.finished["reason"] == "step_failed: on_success"


async def test_graceful_cancel_lets_the_step_trap_sigterm_and_runs_cancel_hooks(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux", grace_period="5s")
@j.step
def trapped(ctx):
    def on_term(signum, frame):
        print("trapped SIGTERM")
        sys.exit(1)
    signal.signal(signal.SIGTERM, on_term)
    print("waiting")
    time.sleep(600)
@j.on_cancel
def cancelled(ctx):
    print("on_cancel ran")
@j.cleanup
def tidy(ctx):
    print("cleanup ran")
""",
    )

    async def cancel_when_waiting(message: dict[str, Any], process: JobProcess) -> None:
        if message["type"] == "log" and any(line["text"] == "waiting" for line in message["lines"]):
            process.cancel(force=False)

    run = await run_job(job_spec(lock), workspace, on_message=cancel_when_waiting)
    assert run.step("trapped")["status"] == "cancelled"
    text = run.log_text()
    assert "trapped SIGTERM" in text and "on_cancel ran" in text and "cleanup ran" in text
    assert run.finished["status"] == "cancelled"


async def test_force_cancel_kills_a_step_ignoring_sigterm_and_runs_no_hooks(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux", grace_period="1h")
@j.step
def stubborn(ctx):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("waiting")
    ctx.sh("trap '' TERM; sleep 600")
@j.cleanup
def tidy(ctx):
    print("cleanup ran")
""",
    )

    async def cancel_twice(message: dict[str, Any], process: JobProcess) -> None:
        if message["type"] == "log" and any(line["text"].startswith("$ trap") for line in message["lines"]):
            process.cancel(force=False)
            process.cancel(force=True)

    run = await run_job(job_spec(lock), workspace, on_message=cancel_twice)
    assert run.step("stubborn")["status"] == "cancelled"
    assert "cleanup ran" not in run.log_text()
    assert run.finished["status"] == "cancelled"
    wait_until(lambda: not live_members(groups_of(run.messages)), timeout=5, what="no survivors")


async def test_background_processes_are_killed_at_job_end(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux")
@j.step
def spawn(ctx):
    ctx.sh("sleep 300 & echo started")
""",
    )
    run = await run_job(job_spec(lock), workspace)
    assert run.finished["status"] == "success"
    wait_until(lambda: not live_members(groups_of(run.messages)), timeout=5, what="`sleep 300 &` to be gone")


async def test_a_changed_workflow_fails_lock_out_of_date_before_any_step(workspace: Path) -> None:
    source = HEADER + '\nj = w.job("j", runs_on="linux", run=lambda ctx: print("user code ran"))\n'
    lock = write_workflow(workspace / "src", source)
    (workspace / "src" / ".conveyor" / "workflows" / "wf.py").write_text(source + "# edited\n")
    run = await run_job(job_spec(lock), workspace)
    assert run.finished["status"] == "failed" and run.finished["reason"] == "lock_out_of_date"
    assert "run `conveyor compile` and commit the lock" in run.finished["error"]
    assert run.step("j")["status"] == "skipped"
    assert "user code ran" not in run.log_text()


async def test_an_import_error_fails_the_job_import_error(workspace: Path) -> None:
    source = (
        HEADER
        + '\nj = w.job("j", runs_on="linux", run=lambda ctx: None)\nif os.environ.get("CONVEYOR_JOB_ID"): 1 / 0\n'
    )
    lock = write_workflow(workspace / "src", source)
    run = await run_job(job_spec(lock), workspace)
    assert run.finished["reason"] == "import_error"
    assert "ZeroDivisionError" in run.finished["error"]


async def test_emitted_events_wait_for_the_agents_answer(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
j = w.job("j", runs_on="linux")
@j.step
def announce(ctx):
    print("event id", ctx.emit("deployed", {"version": "1"}))
""",
    )

    async def answer(message: dict[str, Any], process: JobProcess) -> None:
        if message["type"] == "event.emit":
            assert message["name"] == "deployed" and message["payload"] == {"version": "1"}
            process.answer_emit(message["request_id"], event_id="evt-42")

    run = await run_job(job_spec(lock), workspace, on_message=answer)
    assert "event id evt-42" in run.log_text()


EMIT_AND_REPORT = (
    HEADER
    + """
from conveyor import EventEmitError
j = w.job("j", runs_on="linux")
@j.step
def announce(ctx):
    try:
        ctx.emit("deployed")
    except EventEmitError as error:
        print("not emitted", error.code, error.retry_after_ms, "|", error)
"""
)


async def test_a_refused_emit_raises_event_emit_error_with_the_code(workspace: Path) -> None:
    lock = write_workflow(workspace / "src", EMIT_AND_REPORT)

    async def refuse(message: dict[str, Any], process: JobProcess) -> None:
        if message["type"] == "event.emit":
            error = {"code": "rate_limited", "detail": "too many", "retry_after_ms": 1500}
            process.answer_emit(message["request_id"], error=error)

    run = await run_job(job_spec(lock), workspace, on_message=refuse)
    expected = "not emitted rate_limited 1500 | event 'deployed' was not emitted: rate_limited: too many"
    assert expected in run.log_text()


async def test_an_unanswered_emit_times_out(workspace: Path) -> None:
    lock = write_workflow(workspace / "src", EMIT_AND_REPORT)
    process = JobProcess(env=runner_env(CONVEYOR_EMIT_TIMEOUT_MS="300"))
    run = await run_job(job_spec(lock), workspace, process=process)
    assert "not emitted timeout None" in run.log_text()
    assert run.finished["status"] == "success"


async def test_concurrent_emits_each_get_their_own_answer(workspace: Path) -> None:
    lock = write_workflow(
        workspace / "src",
        HEADER
        + """
import threading
j = w.job("j", runs_on="linux")
@j.step
def announce(ctx):
    got = {}
    def one(name):
        got[name] = ctx.emit(name)
    threads = [threading.Thread(target=one, args=(n,)) for n in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("got", sorted(got.items()))
""",
    )
    waiting: list[dict[str, Any]] = []

    async def answer_in_reverse(message: dict[str, Any], process: JobProcess) -> None:
        if message["type"] == "event.emit":
            waiting.append(message)
            if len(waiting) == 2:  # both threads are waiting: answer the later request first
                for pending in reversed(waiting):
                    process.answer_emit(pending["request_id"], event_id=f"id-{pending['name']}")

    run = await run_job(job_spec(lock), workspace, on_message=answer_in_reverse)
    assert "got [('first', 'id-first'), ('second', 'id-second')]" in run.log_text()
