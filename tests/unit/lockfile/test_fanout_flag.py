"""`fanout=True` (docs/design/authoring.md §2.4): carried into the lock only when set; no matrix with it."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from conveyor.lockfile import compile_repository, parse_lock
from conveyor.sdk import job
from conveyor.sdk.errors import AuthoringError


def test_the_sdk_flag_reaches_the_lock_only_when_set_and_refuses_a_matrix(
    repo: Path, write_workflow: Callable[[str, str], object]
) -> None:
    write_workflow(
        "ci",
        textwrap.dedent(
            """\
            from conveyor import job, push, workflow

            ci = workflow("ci", on=push(branches=["main"]))

            @ci.job(runs_on="linux", fanout=True)
            def deploy(ctx):
                pass

            @ci.job(runs_on="linux")
            def build(ctx):
                pass
            """
        ),
    )
    result = compile_repository(repo)
    assert result.ok, result.errors
    document = json.loads(result.lock_bytes)
    by_name = {entry["name"]: entry for entry in document["workflows"][0]["jobs"]}
    assert by_name["deploy"]["fanout"] is True
    assert "fanout" not in by_name["build"]
    assert [j.fanout for j in parse_lock(result.lock_bytes).workflows[0].jobs] == [True, False]
    with pytest.raises(AuthoringError, match="E122"):
        job("deploy", runs_on="linux", matrix={"n": ["1", "2"]}, fanout=True)
