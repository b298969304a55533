"""Nightly maintenance plus reactions to custom events, completions and failure bursts."""

from conveyor import event, schedule, workflow, workflow_complete, workflows_failed_batch

nightly = workflow(
    "nightly",
    on=[
        schedule(cron="0 2 * * *", timezone="Europe/Paris"),
        schedule(cron="0 12 * * 6", timezone="UTC", inputs={"deep": True}),
        event("deps.updated", match={"ecosystem": ["pip", "uv"]}, from_repos=["acme/*"]),
    ],
    concurrency="nightly",
)


@nightly.job(runs_on="conveyor:os:linux", timeout="2h")
def audit(ctx):
    ctx.sh("pip-audit --strict || true")
    ctx.sh(["pytest", "-q", "-m", "slow"])


after_deploy = workflow(
    "after-deploy",
    on=[workflow_complete(workflow=["deploy"], status=["success"])],
)


@after_deploy.job(runs_on="conveyor:os:linux", checkout=False)
def warm_caches(ctx):
    ctx.sh(["curl", "--fail", "https://example.com/warm"])


triage = workflow(
    "failure-triage", on=[workflows_failed_batch(window="10m", workflow=["package-ci", "nightly"])]
)


@triage.job(runs_on="conveyor:os:linux", checkout=False)
def summarise(ctx):
    runs = ctx.event.payload["runs"]
    ctx.log.warn(f"{ctx.event.payload['total']} failed runs", runs=[run["workflow_name"] for run in runs])
