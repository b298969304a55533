"""The agent's per-repository mirror (issue 19): real runners, real git repositories in temp dirs.

A job fetches only the commit it needs into `<mirrors>/<key>.git` and checks it out into a fresh directory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from conveyor.agent.mirror import PIN_PREFIX, mirror_key
from conveyor.agent.process import JobProcess
from conveyor.agent.spec import RepoSpec
from conveyor.lockfile.reader import load_lock
from tests.integration.agent.conftest import JobRun, git, job_spec, run_job, runner_env, write_workflow
from tests.support.agent_repos import TOKEN, committed_repo, git_wrapper

WORKFLOW = """
from conveyor import workflow, push
w = workflow("w", on=push())
j = w.job("j", runs_on="linux")
@j.step
def show(ctx):
    ctx.sh(["git", "log", "-1", "--format=subject: %s"])
    ctx.sh(["git", "status", "--porcelain", "--untracked-files=all"])
"""


async def run_at(
    origin: Path,
    sha: str,
    workspace: Path,
    mirrors: Path,
    *,
    env: dict[str, str] | None = None,
    max_bytes: int | None = None,
    auth_header: str | None = None,
) -> JobRun:
    """Run the workflow of `origin` at `sha` with a runner checking out through `mirrors`."""
    repo = RepoSpec(clone_url=str(origin), ref="refs/heads/main", sha=sha, auth_header=auth_header)
    spec = job_spec(
        load_lock(origin / ".conveyor" / "conveyor.lock.json"), repo=repo, job_id=f"job-{workspace.name}"
    )
    process = JobProcess(env=env or runner_env(), mirrors_dir=mirrors, mirror_max_bytes=max_bytes)
    return await run_job(spec, workspace, process)


def new_commit(origin: Path, subject: str) -> str:
    (origin / "notes.txt").write_text(subject)
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", subject)
    return git(origin, "rev-parse", "HEAD")


def assert_checked_out(run: JobRun, workspace: Path, sha: str, subject: str) -> None:
    assert run.finished["status"] == "success", run.log_text()
    assert f"subject: {subject}" in run.log_text()
    assert git(workspace / "src", "rev-parse", "HEAD") == sha
    assert git(workspace / "src", "status", "--porcelain") == "", "a clean, fresh work tree"


async def test_a_job_fetches_only_a_commit_the_mirror_lacks(tmp_path: Path) -> None:
    origin, mirrors = tmp_path / "origin", tmp_path / "mirrors"
    _, first = committed_repo(origin, WORKFLOW)
    run = await run_at(origin, first, tmp_path / "ws1", mirrors)
    assert_checked_out(run, tmp_path / "ws1", first, "the commit")
    mirror = mirrors / f"{mirror_key(str(origin))}.git"
    assert git(mirror, "rev-parse", f"{PIN_PREFIX}{first}") == first
    assert any("fetch" in line for line in run.log_lines(0))

    again = await run_at(origin, first, tmp_path / "ws2", mirrors)
    assert_checked_out(again, tmp_path / "ws2", first, "the commit")
    setup = again.log_lines(0)
    assert not any(line.startswith("$ git") and " fetch " in line for line in setup), setup
    assert any("already in the mirror" in line for line in setup)

    second = new_commit(origin, "the next commit")
    later = await run_at(origin, second, tmp_path / "ws3", mirrors)
    assert_checked_out(later, tmp_path / "ws3", second, "the next commit")
    assert git(mirror, "rev-parse", f"{PIN_PREFIX}{second}") == second
    # The checkout owns its object files: deleting the mirror does not break it.
    await asyncio.to_thread(shutil.rmtree, mirror)
    assert git(tmp_path / "ws3" / "src", "log", "-1", "--format=%s") == "the next commit"


async def test_a_corrupt_mirror_is_rebuilt_and_the_job_still_runs(tmp_path: Path) -> None:
    origin, mirrors = tmp_path / "origin", tmp_path / "mirrors"
    _, sha = committed_repo(origin, WORKFLOW)
    assert_checked_out(
        await run_at(origin, sha, tmp_path / "ws1", mirrors), tmp_path / "ws1", sha, "the commit"
    )
    mirror = mirrors / f"{mirror_key(str(origin))}.git"
    for root, _, files in os.walk(mirror / "objects"):
        for name in files:
            path = Path(root) / name
            path.chmod(0o644)
            path.write_bytes(b"not a git object")
    (mirror / "HEAD").write_text("garbage\n")

    run = await run_at(origin, sha, tmp_path / "ws2", mirrors)
    assert_checked_out(run, tmp_path / "ws2", sha, "the commit")
    assert any("rebuilding the mirror" in line for line in run.log_lines(0)), run.log_text()
    assert git(mirror, "rev-parse", f"{PIN_PREFIX}{sha}") == sha, "the rebuilt mirror serves the next job"
    assert git(mirror, "fsck", "--no-progress") == ""


async def test_a_mirror_path_that_is_not_a_repository_is_replaced(tmp_path: Path) -> None:
    origin, mirrors = tmp_path / "origin", tmp_path / "mirrors"
    _, sha = committed_repo(origin, WORKFLOW)
    mirror = mirrors / f"{mirror_key(str(origin))}.git"
    mirror.mkdir(parents=True)
    (mirror / "stray").write_text("left by something else")
    run = await run_at(origin, sha, tmp_path / "ws", mirrors)
    assert_checked_out(run, tmp_path / "ws", sha, "the commit")
    assert not (mirror / "stray").exists()


async def test_the_clone_token_reaches_git_only_through_its_environment(tmp_path: Path) -> None:
    origin, mirrors = tmp_path / "origin", tmp_path / "mirrors"
    _, sha = committed_repo(origin, WORKFLOW)
    log = tmp_path / "git.log"
    env = runner_env()
    env["PATH"] = f"{git_wrapper(tmp_path / 'bin', log)}:{env['PATH']}"
    workspace = tmp_path / "ws"
    run = await run_at(origin, sha, workspace, mirrors, env=env, auth_header=f"Bearer {TOKEN}")
    assert_checked_out(run, workspace, sha, "the commit")
    records = log.read_text().splitlines()
    fetches = [line for line in records if line.startswith("ARGV") and " fetch " in line]
    assert fetches and not any(TOKEN in line for line in records if line.startswith("ARGV"))
    assert f"ENV 1 http.extraHeader Authorization: Bearer {TOKEN}" in records, "the fetch got it by env"
    assert TOKEN not in run.log_text()
    for root in (mirrors, workspace):
        holders = [path for path in root.rglob("*") if path.is_file() and TOKEN.encode() in path.read_bytes()]
        assert holders == [], f"the clone token was written to {holders}"


async def test_two_concurrent_jobs_on_one_repository_share_the_mirror(tmp_path: Path) -> None:
    origin, mirrors = tmp_path / "origin", tmp_path / "mirrors"
    _, first = committed_repo(origin, WORKFLOW)
    second = new_commit(origin, "the next commit")
    runs = await asyncio.gather(
        run_at(origin, first, tmp_path / "ws1", mirrors),
        run_at(origin, second, tmp_path / "ws2", mirrors),
    )
    assert_checked_out(runs[0], tmp_path / "ws1", first, "the commit")
    assert_checked_out(runs[1], tmp_path / "ws2", second, "the next commit")
    mirror = mirrors / f"{mirror_key(str(origin))}.git"
    assert {git(mirror, "rev-parse", f"{PIN_PREFIX}{sha}") for sha in (first, second)} == {first, second}
    assert [path.name for path in mirrors.iterdir() if path.suffix == ".git"] == [mirror.name]


async def test_mirrors_over_the_size_bound_are_evicted_least_recently_used_first(tmp_path: Path) -> None:
    mirrors = tmp_path / "mirrors"
    _, sha_a = committed_repo(tmp_path / "a", WORKFLOW)
    _, sha_b = committed_repo(tmp_path / "b", WORKFLOW.replace("subject", "SUBJECT"))
    first = await run_at(tmp_path / "a", sha_a, tmp_path / "ws1", mirrors, max_bytes=1)
    assert first.finished["status"] == "success", first.log_text()
    second = await run_at(tmp_path / "b", sha_b, tmp_path / "ws2", mirrors, max_bytes=1)
    assert second.finished["status"] == "success", second.log_text()
    mirror_a = f"{mirror_key(str(tmp_path / 'a'))}.git"
    mirror_b = f"{mirror_key(str(tmp_path / 'b'))}.git"
    assert any(f"evicted the least recently used mirror {mirror_a}" in line for line in second.log_lines(0))
    assert sorted(path.name for path in mirrors.iterdir() if path.suffix == ".git") == [mirror_b]


async def test_a_job_without_checkout_fetches_sparsely_without_the_mirror(tmp_path: Path) -> None:
    origin, mirrors = tmp_path / "origin", tmp_path / "mirrors"
    source = WORKFLOW.replace('runs_on="linux"', 'runs_on="linux", checkout=False').replace(
        'ctx.sh(["git", "status", "--porcelain", "--untracked-files=all"])', ""
    )
    origin.mkdir()
    git(origin, "init", "-q", "-b", "main")
    write_workflow(origin, source)
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "the commit")
    sha = git(origin, "rev-parse", "HEAD")
    run = await run_at(origin, sha, tmp_path / "ws", mirrors)
    assert run.finished["status"] == "success", run.log_text()
    assert not mirrors.exists() or not any(mirrors.iterdir())
