"""Ingest with real `conveyor server` processes: crash recovery and a `local` source's post-receive hook."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.fakes.github import FakeGitHub, push_payload
from tests.support.processes import ServerProcess, run_cli
from tests.support.repos import GIT_ENV_ARGS, PUSH_WORKFLOW, commit_all, git, make_repo, write_workflows
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

SECRET = "hook-secret"
FAST = {"CONVEYOR_SWEEP_INTERVAL_MS": "200", "CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "200"}

OTHER_WORKFLOW = PUSH_WORKFLOW.replace('workflow("ci"', 'workflow("uncommitted"')


def test_a_delivery_stored_before_a_crash_is_processed_once_after_restart(
    database_url: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    home = tmp_path / "home"
    with FakeGitHub(repos={"acme/app": repo}) as github:
        crashing = ServerProcess(
            home, database_url=database_url, env={**FAST, "CONVEYOR_TEST_CRASH_AFTER_DELIVERY_COMMIT": "1"}
        )
        crashing.wait_ready()
        token = crashing.owner_token()
        source_id = crashing.create_source(token, github.source_body("acme/app", SECRET))
        sha = git(repo, "rev-parse", "HEAD")
        from tests.fakes.github import post_webhook

        answer = post_webhook(
            f"{crashing.url}/webhooks/{source_id}",
            SECRET,
            "push",
            push_payload("acme/app", repo, ref="refs/heads/main", before="0" * 40, after=sha),
            "crash-1",
        )
        assert answer.status_code == 202, answer.text
        delivery = answer.json()["delivery"]
        assert crashing.wait_exit() == 137
        crashing.stop()

        restarted = ServerProcess(home, database_url=database_url, env=FAST)
        try:
            restarted.wait_ready()

            row = restarted.wait_delivery_handled(
                token, delivery, "the recovery scan to process the delivery"
            )
            assert row["status"] == "processed"
            assert len(row["runs"]) == 1
            runs = restarted.admin(token, "GET", "/runs").json()["items"]
            assert [r["delivery_id"] for r in runs] == [delivery]
            again = post_webhook(
                f"{restarted.url}/webhooks/{source_id}",
                SECRET,
                "push",
                push_payload("acme/app", repo, ref="refs/heads/main", before="0" * 40, after=sha),
                "crash-1",
            )
            assert again.json()["status"] == "duplicate"
            assert len(restarted.admin(token, "GET", "/runs").json()["items"]) == 1
        finally:
            restarted.stop()


def test_local_push_runs_the_pushed_commits_workflows_not_the_working_tree(
    database_url: str, tmp_path: Path
) -> None:
    served = make_repo(tmp_path / "served")
    git(served, "config", "receive.denyCurrentBranch", "ignore")
    server = ServerProcess(tmp_path / "home", database_url=database_url, env=FAST)
    try:
        server.wait_ready()
        token = server.owner_token()
        env = {"CONVEYOR_URL": server.url, "CONVEYOR_TOKEN": token}
        added = run_cli(
            ["admin", "source", "add", "--type", "local", "--name", "app", "--path", str(served), "--json"],
            env=env,
        )
        assert added.returncode == 0, added.stderr
        hook = run_cli(["admin", "source", "install-hook", "app", "--repo", str(served)], env=env)
        assert hook.returncode == 0, hook.stderr
        refused = run_cli(
            ["admin", "source", "install-hook", "app", "--repo", str(tmp_path / "served")], env=env
        )
        assert refused.returncode == 0  # our own hook may be rewritten

        dev = tmp_path / "dev"
        subprocess.run(["git", "clone", "-q", str(served), str(dev)], check=True)
        (dev / "change.txt").write_text("A\n")
        commit_a = commit_all(dev, "commit A")
        # The served repository's working tree now holds an uncommitted, different lock.
        write_workflows(served, {"uncommitted": OTHER_WORKFLOW})

        push_env = {**os.environ, **env}
        pushed = subprocess.run(
            ["git", *GIT_ENV_ARGS, "-C", str(dev), "push", "-q", "origin", "main"],
            env=push_env,
            capture_output=True,
            text=True,
        )
        assert pushed.returncode == 0, pushed.stderr

        def one_run() -> list[dict[str, object]] | None:
            items = server.admin(token, "GET", "/runs").json()["items"]
            return items or None

        runs = wait_until(one_run, timeout=30, what="the pushed commit's run")
        assert [(r["workflow"], r["sha"]) for r in runs] == [("ci", commit_a)]

        unknown = run_cli(
            [
                "admin",
                "source",
                "trigger-local",
                "app",
                "--repo",
                str(served),
                "--sha",
                "f" * 40,
                "--ref",
                "refs/heads/main",
            ],
            env=env,
        )
        assert unknown.returncode == 2 and "unknown_sha" in unknown.stderr
        listed = json.loads(run_cli(["admin", "--json", "delivery", "list"], env=env).stdout)["items"]
        assert len(listed) == 1
    finally:
        server.stop()


def test_a_delivery_processed_again_after_a_crash_counts_the_runs_the_first_pass_created(
    database_url: str, tmp_path: Path
) -> None:
    # Two workflows match: the first pass commits both runs, then the process dies before the
    # delivery is marked processed. The restarted node's pass creates nothing new and must still
    # count both runs, and must not wait out the dead process's delivery lease to do it.
    repo = make_repo(tmp_path / "repo", {"ci": PUSH_WORKFLOW, "other": OTHER_WORKFLOW})
    home = tmp_path / "home"
    crashing = ServerProcess(
        home, database_url=database_url, env={**FAST, "CONVEYOR_TEST_CRASH_BEFORE_DELIVERY_FINISH": "1"}
    )
    crashing.wait_ready()
    token = crashing.owner_token()
    source_id = crashing.create_source(token, {"kind": "local", "name": "app", "path": str(repo)})
    sha = git(repo, "rev-parse", "HEAD")
    answer = crashing.admin(
        token, "POST", f"/sources/{source_id}/trigger", json={"ref": "refs/heads/main", "sha": sha}
    )
    assert answer.status_code == 202, answer.text
    delivery = answer.json()["delivery"]
    assert crashing.wait_exit() == 137
    crashing.stop()

    restarted = ServerProcess(home, database_url=database_url, env=FAST)
    try:
        restarted.wait_ready()

        row = restarted.wait_delivery_handled(
            token, delivery, "the restarted node to process the delivery again"
        )
        assert row["status"] == "processed"
        runs = restarted.admin(token, "GET", "/runs").json()["items"]
        assert sorted(r["workflow"] for r in runs) == ["ci", "uncommitted"]
        assert row["run_count"] == 2 and len(row["runs"]) == 2
        listed = restarted.admin(token, "GET", "/deliveries").json()["items"]
        assert [(d["id"], d["run_count"]) for d in listed] == [(delivery, 2)]
    finally:
        restarted.stop()
