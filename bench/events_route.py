"""Benchmark: one routing decision among 10,000 registrations (`python bench/events_route.py`).

Calls the pure `conveyor.events.router.route` directly on an in-memory `RegistrationIndex`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from conveyor.events.registrations import Registration, RegistrationIndex
from conveyor.events.router import EventView, route
from conveyor.lockfile import parse_lock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.repos import make_repo

WORKFLOW = """
from conveyor import event, workflow

deploy = workflow("deploy", on=[event("deploy.requested", match={"env": "prod"})])

@deploy.job(runs_on=["linux"])
def ship(ctx):
    ctx.sh(["echo", "ship"])
"""


def main(count: int = 10_000, names: int = 500, rounds: int = 200) -> None:
    with tempfile.TemporaryDirectory() as directory:
        repo = make_repo(Path(directory) / "repo", {"deploy": WORKFLOW})
        lock = parse_lock((repo / ".conveyor" / "conveyor.lock.json").read_bytes())
    entry = lock.workflows[0]
    registrations = []
    for number in range(count):
        trigger = entry.triggers[0].model_copy(update={"name": f"deploy.{number % names}"})
        workflow = entry.model_copy(update={"name": f"deploy-{number}", "triggers": [trigger]})
        registrations.append(
            Registration(
                id=f"reg-{number:06d}",
                org_id="default",
                routing_key=f"local:app{number % 50}",
                repo=f"repo-{number % 100}",
                workflow_name=workflow.name,
                entry=workflow,
                kinds=frozenset({"event"}),
                commit_sha="a" * 40,
                default_branch="main",
                disabled=False,
                updated_at=datetime.now(UTC),
            )
        )
    index = RegistrationIndex.build(registrations)
    event = EventView(id="e", name="deploy.7", origin="admin", org_id="default", payload={"env": "prod"})
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        decision = route(event, index)
        timings.append((time.perf_counter() - started) * 1000)
    timings.sort()
    print(
        f"registrations={count} dispatched={len(decision.dispatch)} "
        f"median={statistics.median(timings):.3f}ms p99={timings[int(rounds * 0.99) - 1]:.3f}ms"
    )


if __name__ == "__main__":
    main()
