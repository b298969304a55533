"""The workflows the load runs: `needs`, a matrix, a retried step, a slow step, a scaler-only job that emits
a custom event, and reactions to custom events, cron and generic webhooks.

Every step appends one line to the run's ledger file (`{job, step, ws, max, at}`, `ws` the workspace's path
and an id of that directory's lifetime) before it does anything else: the checker counts executions from
it, which no fault can rewrite (a job whose steps ran twice, or in two workspaces, shows there even when
the database says nothing).
"""

from __future__ import annotations

PRELUDE = """
import json, os, time, uuid
from conveyor import Retry, event, generic_webhook, push, schedule, workflow

LEDGER = {ledger!r}


def workspace():
    # An agent wipes a job's workspace when the job ends and when the agent starts again, so a job handed
    # back to the same agent (its start never recorded) runs in a new directory at the same path: an id
    # kept beside the checkout tells the two apart, while two runs sharing one directory share the id.
    source = os.environ["CONVEYOR_WORKSPACE"]
    marker = os.path.join(os.path.dirname(source), "chaos-workspace-id")
    try:
        descriptor = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        with open(marker) as existing:
            return source + "#" + existing.read()
    made = uuid.uuid4().hex
    with os.fdopen(descriptor, "w") as fresh:
        fresh.write(made)
    return source + "#" + made


def note(step, allowed=1):
    entry = {{"job": os.environ["CONVEYOR_JOB_ID"], "step": step, "ws": workspace(),
             "max": allowed, "at": time.time()}}
    with open(LEDGER, "a") as ledger:
        ledger.write(json.dumps(entry) + "\\n")
"""

CI = """
ci = workflow("ci", on=[push(branches=["main"])])

build = ci.job("build", runs_on=["linux"], matrix={{"part": ["a", "b"]}})


@build.step()
def compile(ctx):
    note("compile")
    print("compiling part", ctx.matrix["part"])


test = ci.job("test", runs_on=["linux"], needs=[build])


@test.step(retry=Retry(max_attempts=2, delay="200ms"))
def flaky(ctx):
    note("flaky", 2)
    marker = os.path.join(os.environ["TMPDIR"], "failed-once")
    # Half of the jobs fail their first attempt, so retries run under faults too.
    if int(os.environ["CONVEYOR_JOB_ID"][-1], 16) % 2 == 0 and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("the first attempt fails on purpose")
    print("flaky passed")


soak = ci.job("soak", runs_on=["linux"], needs=[build])


@soak.step()
def hold(ctx):
    note("hold")
    # Long enough that cancels and kills find running jobs.
    seconds = 0.5 + int(os.environ["CONVEYOR_JOB_ID"][-2:], 16) % 25 / 10
    for tick in range(int(seconds * 10)):
        print("soaking", tick)
        time.sleep(0.1)


deploy = ci.job("deploy", runs_on={burst}, needs=[test, soak])


@deploy.step()
def ship(ctx):
    note("ship")
    ctx.emit("chaos.deployed", {{"sha": os.environ["CONVEYOR_SHA"]}})
    print("shipped")
"""

REACT = """
react = workflow("react", on=[event("chaos.deployed"), event("chaos.ping")])


@react.job(runs_on=["linux"])
def acknowledge(ctx):
    note("acknowledge")
    print("reacting to", ctx.event.name if hasattr(ctx.event, "name") else "an event")
"""

TICK = """
tick = workflow("tick", on=[schedule(cron="* * * * *")])


@tick.job(runs_on=["linux"])
def beat(ctx):
    note("beat")
    print("tick")
"""

HOOK = """
hook = workflow("hook", on=[generic_webhook("hooks")])


@hook.job(runs_on=["linux"])
def receive(ctx):
    note("receive")
    print("received a generic webhook")
"""


def workflow_files(ledger: str, *, with_tick: bool, with_hook: bool, burst: list[str]) -> dict[str, str]:
    """The `.conveyor/workflows/*.py` files of one repository of the run."""
    prelude = PRELUDE.format(ledger=ledger)
    files = {
        "ci": prelude + CI.format(burst=repr(burst)),
        "react": prelude + REACT,
    }
    if with_tick:
        files["tick"] = prelude + TICK
    if with_hook:
        files["hook"] = prelude + HOOK
    return files
