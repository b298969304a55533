"""Real git repositories with compiled Conveyor workflows, made in temp dirs."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from conveyor.lockfile import compile_repository

# Who commits in the tests' repositories made by `git` processes the tests start, and no system config.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Ada",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}
GIT_ENV_ARGS = ["-c", "user.name=Test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false"]

PUSH_WORKFLOW = """
from conveyor import Input, dispatch, push, workflow

ci = workflow("ci", on=[push(branches=["main"]), dispatch(inputs={"target": Input(str, required=True), "level": Input(int, default=3)})])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["echo", "building"])

@ci.job(runs_on=["linux"], needs=[build])
def test(ctx):
    ctx.sh(["echo", "testing"])
"""

DOCS_WORKFLOW = """
from conveyor import push, workflow

docs = workflow("docs", on=[push(branches=["main"], paths=["docs/**"])])

@docs.job(runs_on=["linux"])
def publish(ctx):
    ctx.sh(["echo", "docs"])
"""


def git(repo: Path, *args: str) -> str:
    """Run git in `repo`; return stdout."""
    result = subprocess.run(["git", *GIT_ENV_ARGS, "-C", str(repo), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {result.stderr}")
    return result.stdout.strip()


def write_workflows(repo: Path, workflows: dict[str, str]) -> None:
    """Write `.conveyor/workflows/<name>.py` files (replacing the directory's content) and compile the lock."""
    directory = repo / ".conveyor" / "workflows"
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.py"):
        old.unlink()
    for name, source in workflows.items():
        (directory / f"{name}.py").write_text(textwrap.dedent(source))
    result = compile_repository(repo)
    assert result.ok and result.lock_bytes is not None, [str(e) for e in result.errors]
    (repo / ".conveyor" / "conveyor.lock.json").write_bytes(result.lock_bytes)
    (repo / ".conveyor" / ".gitignore").write_text("__pycache__/\n")


def commit_all(repo: Path, message: str) -> str:
    """Commit everything; return the new SHA."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message, "--allow-empty")
    return git(repo, "rev-parse", "HEAD")


def make_repo(path: Path, workflows: dict[str, str] | None = None) -> Path:
    """A repository on `main` with the given workflows compiled and committed."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    write_workflows(path, workflows if workflows is not None else {"ci": PUSH_WORKFLOW})
    (path / "README.md").write_text("test repository\n")
    commit_all(path, "initial")
    return path
