"""A `paths=` filter on a `local` source: the commit hook, `trigger-local` and `preview` decide alike.

Real git repositories and one real `conveyor server` per dialect (no agent: a run started is enough).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.http import HTTP
from tests.support.processes import ServerProcess, clean_environ, run_cli
from tests.support.repos import GIT_ENV_ARGS, commit_all, git, write_workflows
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

SRC_ONLY = """
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"], paths=["src/**"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "building"])
"""


@pytest.fixture(scope="module")
def server(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One server per dialect; each test adds a source of its own."""
    home = tmp_path_factory.mktemp("paths") / "home"
    process = ServerProcess(home, database_url=module_database_url)
    try:
        process.wait_ready()
        yield {"CONVEYOR_URL": process.url, "CONVEYOR_TOKEN": process.owner_token()}
    finally:
        process.stop()


def api(env: dict[str, str], path: str, **params: Any) -> Any:
    answer = HTTP.get(
        f"{env['CONVEYOR_URL']}/api/v1/admin{path}",
        headers={"Authorization": f"Bearer {env['CONVEYOR_TOKEN']}"},
        params=params,
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def new_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    write_workflows(path, {"ci": SRC_ONLY})
    (path / "README.md").write_text("readme\n")
    return path


def add_source(env: dict[str, str], name: str, repo: Path) -> None:
    added = run_cli(
        ["admin", "source", "add", "--type", "local", "--name", name, "--path", str(repo)], env=env
    )
    assert added.returncode == 0, added.stderr


def server_decision(env: dict[str, str], source: str, sha: str) -> dict[str, Any]:
    """The processed delivery of `sha` for `source`: its runs and its paths check."""
    source_id = next(s["id"] for s in api(env, "/sources")["items"] if s["name"] == source)

    def processed() -> dict[str, Any] | None:
        for item in api(env, "/deliveries", source=source_id, limit=100)["items"]:
            body = api(env, f"/deliveries/{item['id']}")
            event = (body.get("decisions") or {}).get("event", {})
            if event.get("sha") == sha and body["status"] == "processed":
                return body
        return None

    body = wait_until(processed, timeout=60, what=f"the delivery of {sha[:12]}")
    return {"started": bool(body["runs"]), "paths": paths_check(body["decisions"])}


def paths_check(decisions: dict[str, Any]) -> tuple[bool, str]:
    """The push trigger's paths check of workflow `ci` in a decision trace."""
    workflow = next(w for w in decisions["workflows"] if w["workflow"] == "ci")
    check = next(c for c in workflow["triggers"][0]["checks"] if c["filter"] == "paths")
    return check["ok"], check["detail"]


def preview_decision(repo: Path) -> dict[str, Any]:
    done = run_cli(["preview", "push", "--json", "--dir", str(repo)])
    assert done.returncode == 0, done.stderr
    decisions = json.loads(done.stdout)
    started = next(w["matched"] for w in decisions["workflows"] if w["workflow"] == "ci")
    return {"started": started, "paths": paths_check(decisions)}


def hooked_commit(repo: Path, env: dict[str, str], message: str) -> str:
    """`git commit` with the environment the post-commit hook needs; the new HEAD."""
    git(repo, "add", "-A")
    done = subprocess.run(
        ["git", *GIT_ENV_ARGS, "-C", str(repo), "commit", "-q", "-m", message],
        env=clean_environ(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "could not trigger" not in done.stderr, done.stderr
    return git(repo, "rev-parse", "HEAD")


def test_the_commit_hook_starts_a_paths_filtered_workflow_only_for_commits_touching_its_paths(
    server: dict[str, str], tmp_path: Path
) -> None:
    repo = new_repo(tmp_path / "repo")
    add_source(server, "hooked", repo)
    hook = run_cli(["admin", "source", "install-hook", "hooked", "--repo", str(repo), "--on", "commit"])
    assert hook.returncode == 0, hook.stderr

    # The first commit has no previous one: its changed files are unknown, so the filter passes.
    root = hooked_commit(repo, server, "first")
    first = server_decision(server, "hooked", root)
    assert first == {"started": True, "paths": (True, "changed files unknown")}
    assert preview_decision(repo) == first

    (repo / "README.md").write_text("readme, edited\n")
    readme = hooked_commit(repo, server, "docs only")
    second = server_decision(server, "hooked", readme)
    assert second == {"started": False, "paths": (False, "none of 1 changed file(s) matches glob 'src/**'")}
    assert preview_decision(repo) == second
    local = run_cli(["run", "local", "push", "--dir", str(repo)], timeout=120)
    assert local.returncode == 1, local.stdout + local.stderr
    assert "none of 1 changed file(s) matches glob 'src/**'" in local.stdout + local.stderr

    (repo / "src").mkdir()
    (repo / "src" / "app.py").write_text("print('app')\n")
    code = hooked_commit(repo, server, "code")
    third = server_decision(server, "hooked", code)
    assert third == {"started": True, "paths": (True, "'src/app.py' matches glob 'src/**'")}
    assert preview_decision(repo) == third


def test_trigger_local_compares_with_the_ref_tip_before_it_moves_else_with_the_parent(
    server: dict[str, str], tmp_path: Path
) -> None:
    repo = new_repo(tmp_path / "repo")
    (repo / "src").mkdir()
    (repo / "src" / "app.py").write_text("print('app')\n")
    tip = commit_all(repo, "first")
    add_source(server, "manual", repo)

    # A README-only commit the ref does not point at yet: compared with the ref's tip.
    git(repo, "checkout", "-q", "--detach")
    (repo / "README.md").write_text("readme, edited\n")
    ahead = commit_all(repo, "docs only")
    git(repo, "checkout", "-q", "main")
    assert git(repo, "rev-parse", "main") == tip
    pushed = run_cli(
        ["admin", "source", "trigger-local", "manual", "--repo", str(repo), "--sha", ahead], env=server
    )
    assert pushed.returncode == 5, pushed.stdout + pushed.stderr
    assert "none of 1 changed file(s) matches glob 'src/**'" in pushed.stdout
    assert server_decision(server, "manual", ahead)["started"] is False

    # The ref already at the commit (a commit made, then triggered): compared with its parent.
    git(repo, "merge", "-q", "--ff-only", ahead)
    (repo / "README.md").write_text("readme, edited twice\n")
    after = commit_all(repo, "docs again")
    triggered = run_cli(["admin", "source", "trigger-local", "manual", "--repo", str(repo)], env=server)
    assert triggered.returncode == 5, triggered.stdout + triggered.stderr
    assert server_decision(server, "manual", after) == {
        "started": False,
        "paths": (False, "none of 1 changed file(s) matches glob 'src/**'"),
    }
    assert preview_decision(repo) == server_decision(server, "manual", after)

    # An explicit all-zero --before is a created ref: changed files unknown, the filter passes.
    created = run_cli(
        ["admin", "source", "trigger-local", "manual", "--repo", str(repo), "--before", "0" * 40], env=server
    )
    assert created.returncode == 0, created.stdout + created.stderr
    assert "started run" in created.stdout
