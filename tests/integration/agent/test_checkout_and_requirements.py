"""Checkout from a real repository with a credential, and the per-job requirements venv."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.agent.process import JobProcess
from conveyor.agent.spec import RepoSpec
from tests.integration.agent.conftest import git, job_spec, run_job, runner_env, write_workflow
from tests.support.agent_repos import TOKEN, build_wheel, committed_repo, git_wrapper


async def test_checkout_passes_the_credential_only_through_git_config_env(tmp_path: Path) -> None:
    lock, sha = committed_repo(tmp_path / "origin")
    log = tmp_path / "git.log"
    wrapper = git_wrapper(tmp_path / "bin", log)
    workspace = tmp_path / "ws"
    repo = RepoSpec(
        clone_url=str(tmp_path / "origin"), ref="refs/heads/main", sha=sha, auth_header=f"Bearer {TOKEN}"
    )
    env = runner_env()
    env["PATH"] = f"{wrapper}:{env['PATH']}"
    run = await run_job(job_spec(lock, repo=repo), workspace, JobProcess(env=env))
    assert run.finished["status"] == "success", run.log_text()
    assert "the commit" in run.log_text()
    records = log.read_text().splitlines()
    assert not any(TOKEN in line for line in records if line.startswith("ARGV"))
    assert any(f"ENV 1 http.extraHeader Authorization: Bearer {TOKEN}" == line for line in records)
    config = (workspace / "src" / ".git" / "config").read_text()
    assert TOKEN not in config
    assert TOKEN not in git(workspace / "src", "remote", "get-url", "origin")
    assert TOKEN not in run.log_text()
    assert git(workspace / "src", "rev-parse", "HEAD") == sha


async def test_a_missing_commit_fails_checkout_failed(tmp_path: Path) -> None:
    lock, _ = committed_repo(tmp_path / "origin")
    repo = RepoSpec(clone_url=str(tmp_path / "origin"), ref="refs/heads/main", sha="1" * 40)
    run = await run_job(job_spec(lock, repo=repo), tmp_path / "ws")
    assert run.finished["status"] == "failed" and run.finished["reason"] == "checkout_failed"


@pytest.mark.parametrize("mirrored", [False, True], ids=["direct", "mirror"])
@pytest.mark.parametrize("field", ["sha", "ref"])
async def test_a_commit_id_or_ref_git_would_read_as_an_option_runs_nothing(
    tmp_path: Path, mirrored: bool, field: str
) -> None:
    lock, _ = committed_repo(tmp_path / "origin")
    marker = tmp_path / "pwned"
    hostile = f"--upload-pack=touch {marker};true"
    values = (
        {"sha": "1" * 40, "ref": hostile} if field == "ref" else {"sha": hostile, "ref": "refs/heads/main"}
    )
    repo = RepoSpec(clone_url=str(tmp_path / "origin"), **values)
    process = JobProcess(env=runner_env(), mirrors_dir=tmp_path / "mirrors" if mirrored else None)
    run = await run_job(job_spec(lock, repo=repo), tmp_path / "ws", process)
    assert run.finished["status"] == "failed" and run.finished["reason"] == "checkout_failed"
    assert not marker.exists()
    assert f"the job's {'commit' if field == 'sha' else 'ref'}" in run.log_text()


async def test_every_git_call_that_takes_the_commit_or_ref_ends_the_options_first(tmp_path: Path) -> None:
    lock, sha = committed_repo(tmp_path / "origin")
    log = tmp_path / "git.log"
    env = runner_env()
    env["PATH"] = f"{git_wrapper(tmp_path / 'bin', log)}:{env['PATH']}"
    repo = RepoSpec(clone_url=str(tmp_path / "origin"), ref="refs/heads/main", sha=sha)
    run = await run_job(job_spec(lock, repo=repo), tmp_path / "ws", JobProcess(env=env))
    assert run.finished["status"] == "success", run.log_text()
    calls = [line.split()[1:] for line in log.read_text().splitlines() if line.startswith("ARGV")]
    with_values = [argv for argv in calls if any(sha in a or a == "origin" for a in argv)]
    assert len(with_values) >= 3, calls  # remote add, fetch, switch
    for argv in with_values:
        first_value = min(i for i, a in enumerate(argv) if sha in a or a == "origin")
        assert "--end-of-options" in argv[:first_value], argv


@pytest.mark.slow
async def test_requirements_get_a_venv_where_conveyor_still_imports(tmp_path: Path, workspace: Path) -> None:
    wheel = build_wheel(tmp_path)
    src = workspace / "src"
    lock = write_workflow(
        src,
        """
        import sys
        from conveyor import workflow, push
        w = workflow("w", on=push())
        j = w.job("j", runs_on="linux")
        @j.step
        def use(ctx):
            import tinypkg, conveyor.sdk
            print("value", tinypkg.VALUE, "prefix", sys.prefix)
        """,
    )
    (src / ".conveyor" / "requirements.txt").write_text(f"# tiny\n--no-index\n{wheel}\n")
    venvs = tmp_path / "venvs"
    run = await run_job(job_spec(lock), workspace, JobProcess(env=runner_env(), venvs_dir=venvs))
    assert run.finished["status"] == "success", run.log_text()
    line = next(text for text in run.log_lines() if text.startswith("value 42"))
    assert line.split("prefix ")[1].startswith(str(venvs))
    assert [p.name for p in venvs.iterdir() if not p.name.startswith(".")]
