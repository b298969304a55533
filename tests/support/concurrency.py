"""Workflows whose runs share a concurrency group."""

from __future__ import annotations

QUEUEING = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])], concurrency="ci-{event.branch}")

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "build"])
"""


DEPLOY = """
from conveyor import push, workflow

ship = workflow("ship", on=[push(branches=["main"])])

@ship.job(runs_on=["linux"], concurrency_group="production")
def deploy(ctx):
    ctx.sh(["echo", "deploy"])
"""
