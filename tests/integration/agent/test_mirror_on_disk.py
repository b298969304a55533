"""A real `conveyor agent` with capacity 2: two jobs of one repository at once share its mirror, and neither
the clone token nor a secret is written under the agent's home (issue 19)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.agent.conftest import AgentProcess, until
from tests.support.fake_orchestrator import FakeOrchestrator, job_dispatch
from tests.support.repos import make_repo

pytestmark = pytest.mark.slow


def log_lines(messages: list[dict[str, object]]) -> list[str]:
    return [
        str(line["text"])  # type: ignore[index]
        for message in messages
        if message["type"] == "log.chunk"
        for line in message["lines"]  # type: ignore[attr-defined]
    ]


Start = Callable[..., AgentProcess]
CLONE_TOKEN = "ghs_clonetoken_never_on_disk_7f3a"
SECRET = "s3cr3t-value-never-on-disk-91c2"
WORKFLOW = """
from conveyor import push, workflow

w = workflow("w", on=[push(branches=["main"])])

@w.job(runs_on=["linux"])
def use(ctx):
    key = ctx.secrets.get("API_KEY")
    print("the key is", key, flush=True)
    with open("out.txt", "w") as handle:
        handle.write("no secret here")
    ctx.sh(["git", "log", "-1", "--format=head %H"])

@w.job(runs_on=["linux"])
def keep(ctx):
    print("the key is", ctx.secrets.get("API_KEY"), flush=True)
    raise SystemExit("failing on purpose: --keep-workspace keeps a failed job's workspace")
"""


async def test_two_jobs_share_the_mirror_and_leave_no_token_or_secret_under_the_home(
    fake: FakeOrchestrator, agents: Start, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"w": WORKFLOW})
    agent = agents(fake.url, "--capacity", "2", "--keep-workspace")
    connection = await until(fake.registered, what="the agent to register")
    dispatches = [job_dispatch(repo, "w", "use", secrets={"API_KEY": SECRET}) for _ in range(2)]
    kept = job_dispatch(repo, "w", "keep", secrets={"API_KEY": SECRET})
    for dispatch in dispatches:
        dispatch["repo"]["auth_header"] = f"Bearer {CLONE_TOKEN}"
        await fake.dispatch(dispatch)
    ids = {dispatch["job_id"] for dispatch in dispatches}

    def both_finished() -> list[dict[str, object]] | None:
        ends = [m for m in connection.of_type("job.finished") if m["job_id"] in ids]
        return ends if len(ends) == 2 else None

    finished = await until(both_finished, what=f"both jobs to finish:\n{agent.output()}")
    assert [m["status"] for m in finished] == ["success", "success"], agent.output()
    mirrors = [path for path in (agent.home / "mirrors").iterdir() if path.suffix == ".git"]
    assert len(mirrors) == 1, "one mirror for the repository, shared by both jobs"
    # A failed job's workspace is kept: its checkout and files are on disk for the search below.
    kept["repo"]["auth_header"] = f"Bearer {CLONE_TOKEN}"
    await fake.dispatch(kept)
    [failed] = await until(
        lambda: [m for m in connection.of_type("job.finished") if m["job_id"] == kept["job_id"]],
        what=f"the failing job to finish:\n{agent.output()}",
    )
    assert failed["status"] == "failed"
    assert (agent.home / "work" / kept["job_id"] / "src" / ".conveyor" / "workflows" / "w.py").is_file()
    holders = [
        (path, value)
        for path in agent.home.rglob("*")
        if path.is_file()
        for value in (CLONE_TOKEN, SECRET)
        if value.encode() in path.read_bytes()
    ]
    assert holders == [], f"written to disk: {holders}"
    assert any("the key is ***" in line for line in log_lines(connection.messages)), (
        "the step used the secret"
    )
