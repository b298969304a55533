"""`ctx.needs` of a matrix upstream is the same under `conveyor run local` and on a server with an agent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import agent_process, job_log
from tests.support.dispatch_stage import stage
from tests.support.processes import run_cli

pytestmark = pytest.mark.slow

# Each combination returns `cell` (its own value) and `shared` (the same key in every combination);
# `report` prints what it sees of `build` on one line.
WORKFLOW = """
import json

from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

build = ci.job("build", runs_on=["linux"], matrix={"n": ["1", "2", "3"]})


@build.step(outputs={"cell": str, "shared": str})
def compile_it(ctx):
    return {"cell": ctx.matrix["n"], "shared": "from " + ctx.matrix["n"]}


def plain(value):
    # `ctx.needs` hands out read-only mappings; json wants dicts.
    return {key: plain(item) for key, item in value.items()} if hasattr(value, "items") else value


@ci.job(runs_on=["linux"], needs=[build])
def report(ctx):
    need = ctx.needs["build"]
    seen = {
        "status": need.status,
        "outputs": plain(need.outputs),
        "by_matrix": {key: [cell.status, plain(cell.outputs)] for key, cell in need.by_matrix.items()},
    }
    print("NEEDS=" + json.dumps(seen, sort_keys=True))
"""

EXPECTED = {
    "status": "success",
    # Every combination's outputs, merged in matrix order: for a key set by each, the last one wins.
    "outputs": {"compile_it": {"cell": "3", "shared": "from 3"}},
    "by_matrix": {
        f"n={n}": ["success", {"compile_it": {"cell": n, "shared": f"from {n}"}}] for n in ("1", "2", "3")
    },
}


def needs_line(text: str) -> dict[str, Any]:
    line = next(line for line in text.splitlines() if "NEEDS=" in line)
    seen: dict[str, Any] = json.loads(line.split("NEEDS=", 1)[1])
    return seen


def test_a_matrix_upstreams_outputs_are_the_same_under_run_local_and_on_a_server(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": WORKFLOW}) as s:
        local = run_cli(["run", "local", "push", "--dir", str(s.repo), "--label", "linux"], timeout=240)
        assert local.returncode == 0, local.stdout + local.stderr
        locally = needs_line(local.stdout)

        with agent_process(s, tmp_path / "agent-home"):
            run_id = s.push()
            run = s.wait_run(run_id, "success", timeout=180)
        report = next(j for j in run["jobs"] if j["name"] == "report")
        served = needs_line(job_log(s, run_id, report["id"]))

    assert served == locally
    assert served == EXPECTED
