"""`GET /badge/{source}/{workflow}.svg` against a real server, on both dialects (docs/design/execution.md §11).

One server per dialect for the module: its `app` source is public, with a run that succeeded on `main`
and, after it, one that failed on `dev` (finished by a scripted agent); `private` has a successful run
on `main` and its badges left off. Each test only reads, except the CLI test, which has its own source.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from conveyor.model import protocol as p
from tests.support.cli import invoke
from tests.support.dispatch_stage import Stage, stage
from tests.support.http import HTTP
from tests.support.protocol_agent import ScriptedAgent
from tests.support.repos import git
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

CI_ON_MAIN_AND_DEV = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main", "dev"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "build"])
"""


@dataclass
class Badged:
    """The module's server and its sources."""

    stage: Stage
    app_id: str

    def badge(self, path: str) -> httpx.Response:
        """`GET /badge/<path>` with no credentials at all."""
        return HTTP.get(f"{self.stage.server.url}/badge/{path}", timeout=30)


def _add_source(s: Stage, name: str) -> str:
    answer = s.api("POST", "/sources", json={"kind": "local", "name": name, "path": str(s.repo)})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _trigger(s: Stage, source_id: str, ref: str) -> str:
    """Trigger HEAD on `ref`; the run it created."""
    sha = git(s.repo, "rev-parse", "HEAD")
    answer = s.api("POST", f"/sources/{source_id}/trigger", json={"ref": ref, "sha": sha})
    assert answer.status_code == 202, answer.text
    delivery = answer.json()["delivery"]
    runs = wait_until(
        lambda: s.api("GET", f"/deliveries/{delivery}").json()["runs"] or None, timeout=30, what="the run"
    )
    return str(runs[0])


async def _run_to_end(s: Stage, agent: ScriptedAgent, source_id: str, ref: str, status: str) -> None:
    run_id = await asyncio.to_thread(_trigger, s, source_id, ref)
    dispatch = await agent.next_of(p.JobDispatch)
    await agent.accept(dispatch)
    reason = None if status == "success" else "step_failed: build"
    await agent.wait_acked(await agent.finish(dispatch.job_id, status, reason))
    await asyncio.to_thread(s.wait_run, run_id, "success" if status == "success" else "failed")


async def _finish_runs(s: Stage, app_id: str, private_id: str) -> None:
    agent = ScriptedAgent(s.ws_url, s.agent_token(["linux"]))
    await agent.connect()
    try:
        await _run_to_end(s, agent, app_id, "refs/heads/main", "success")
        await _run_to_end(s, agent, app_id, "refs/heads/dev", "failed")
        await _run_to_end(s, agent, private_id, "refs/heads/main", "success")
    finally:
        await agent.close()


@pytest.fixture(scope="module")
def badged(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Badged]:
    tmp = tmp_path_factory.mktemp("badges")
    with stage(tmp, module_database_url, {"ci": CI_ON_MAIN_AND_DEV}) as s:
        app_id = s.source_id
        private_id = _add_source(s, "private")
        opened = s.api("PATCH", f"/sources/{app_id}", json={"public_badges": True})
        assert opened.status_code == 200 and opened.json()["public_badges"] is True, opened.text
        asyncio.run(_finish_runs(s, app_id, private_id))
        yield Badged(s, app_id)


def _message(answer: httpx.Response) -> list[str]:
    """The badge's two texts: workflow name and status."""
    assert answer.status_code == 200, answer.text
    return re.findall(r"<text [^>]*>([^<]*)</text>", answer.text)


def test_a_public_badge_is_an_svg_reading_passing_where_the_run_succeeded(badged: Badged) -> None:
    answer = badged.badge("app/ci.svg?ref=main")
    assert _message(answer) == ["ci", "passing"]
    assert answer.headers["content-type"].startswith("image/svg+xml")
    assert answer.headers["cache-control"] == "max-age=60"
    assert answer.text.startswith("<svg ")


def test_a_public_badge_reads_failing_on_the_ref_whose_run_failed(badged: Badged) -> None:
    assert _message(badged.badge("app/ci.svg?ref=dev")) == ["ci", "failing"]
    assert _message(badged.badge("app/ci.svg?ref=refs/heads/dev")) == ["ci", "failing"]


def test_without_a_ref_the_badge_follows_the_default_branch(badged: Badged) -> None:
    # The newest finished run is dev's failure; the default branch (main) passed.
    assert _message(badged.badge("app/ci.svg")) == ["ci", "passing"]


def test_the_source_may_be_named_by_its_id(badged: Badged) -> None:
    assert _message(badged.badge(f"{badged.app_id}/ci.svg?ref=dev")) == ["ci", "failing"]


def test_a_ref_or_workflow_without_finished_runs_reads_no_runs(badged: Badged) -> None:
    assert _message(badged.badge("app/ci.svg?ref=feature")) == ["ci", "no runs"]
    assert _message(badged.badge("app/deploy.svg")) == ["deploy", "no runs"]


def test_a_private_source_answers_exactly_as_an_unknown_one(badged: Badged) -> None:
    private = badged.badge("private/ci.svg?ref=main")
    unknown = badged.badge("nowhere/ci.svg?ref=main")
    assert private.status_code == unknown.status_code == 404
    assert private.content == unknown.content
    assert private.json() == {"error": "not_found", "detail": "no such badge"}
    assert private.headers["content-type"] == unknown.headers["content-type"]
    assert "cache-control" not in private.headers and "cache-control" not in unknown.headers


def test_markup_in_a_workflow_name_is_shown_as_text(badged: Badged) -> None:
    answer = badged.badge("app/<script>alert(1)<b>.svg")
    assert answer.status_code == 200, answer.text
    assert "<script" not in answer.text and "<b>" not in answer.text
    assert "&lt;script&gt;alert(1)&lt;b&gt;" in answer.text


def test_the_cli_turns_a_sources_badges_on_and_off(badged: Badged) -> None:
    s = badged.stage
    _add_source(s, "toggled")
    env = {"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token}
    assert badged.badge("toggled/ci.svg").status_code == 404

    on = invoke(["admin", "source", "update", "toggled", "--public-badges"], env=env)
    assert on.exit_code == 0, on.output
    assert re.search(r"^public_badges\s+True$", on.output, re.M), on.output
    assert _message(badged.badge("toggled/ci.svg")) == ["ci", "no runs"]
    shown = invoke(["admin", "source", "show", "toggled"], env=env)
    assert re.search(r"^public_badges\s+True$", shown.output, re.M), shown.output
    listed = invoke(["admin", "source", "list"], env=env)
    assert "public_badges" in listed.output, listed.output

    off = invoke(["admin", "source", "update", "toggled", "--no-public-badges"], env=env)
    assert off.exit_code == 0, off.output
    assert re.search(r"^public_badges\s+False$", off.output, re.M), off.output
    assert badged.badge("toggled/ci.svg").status_code == 404
