"""Deploy on tags: a protected environment, one deploy per environment at a time, rollback on failure."""

from conveyor import Concurrency, Input, Need, RunsOn, dispatch, rule, tag, workflow

deploy = workflow(
    "deploy",
    on=[
        tag(patterns=["v*"]),
        dispatch(
            inputs={
                "version": Input(str, required=True, pattern=r"v\d+\.\d+\.\d+"),
                "environment": Input(choices=["staging", "production"], default="staging"),
            }
        ),
    ],
    concurrency=Concurrency("deploy-{event.repo}", cancel_in_progress=False),
    timeout="1h",
    hooks_runs_on="conveyor:os:linux",
)

ship = deploy.job(
    "ship",
    runs_on=RunsOn(labels=["conveyor:os:linux", "deploy"], exclude=["conveyor:host:canary-*"]),
    environment="production",
    concurrency_group="deploy-production",
    timeout="30m",
    grace_period="30s",
    rules=[rule("release tags only", lambda ctx: ctx.event.tag is None or ctx.event.tag.startswith("v"))],
)


@ship.step
def upload(ctx):
    ctx.secrets.expose("DEPLOY_TOKEN")
    ctx.sh(["./scripts/deploy.sh", ctx.event.tag or ctx.inputs["version"]])


@ship.step(retry=5, timeout="2m")
def smoke_test(ctx):
    ctx.sh(["curl", "--fail", "--silent", "https://example.com/health"])


@ship.on_failure
def rollback(ctx):
    ctx.sh(["./scripts/rollback.sh"])


notify = deploy.job(
    "notify",
    runs_on="conveyor:os:linux",
    needs=[Need(ship, when="always")],
    checkout=False,
    run=lambda ctx: ctx.emit("deploy.finished", {"status": ctx.needs["ship"].status}),
)


@deploy.on_failure
def page_on_call(ctx):
    ctx.log.error("deploy failed", outcome=ctx.outcome.status)
