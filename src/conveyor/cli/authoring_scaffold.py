"""What `conveyor init` writes: a runnable example workflow targeting this host's OS label."""

from __future__ import annotations

import sys

GITIGNORE = """\
# Local-only secrets for `conveyor run local` (never commit them).
.secrets
__pycache__/
"""

REQUIREMENTS = """\
# Extra pip requirements for step code; agents install them before running steps.
"""

EXAMPLE_WORKFLOW = '''\
"""Example workflows written by `conveyor init`: edit them, then run `conveyor compile`.

Preview what an event would start with `conveyor preview push` or `conveyor preview pr --files src/app.py`.
"""

import sys

from conveyor import dispatch, pr, push, tag, workflow

# Jobs target agent labels; every agent reports `conveyor:os:<os>`, so this runs on a local agent.
HOST = "conveyor:os:{os_label}"

ci = workflow(
    "ci",
    on=[
        push(branches=["{branch}"]),
        pr(target="{branch}", paths=["src/**", "tests/**", "pyproject.toml", ".conveyor/**"]),
        dispatch(),
    ],
    concurrency="ci-{{event.branch}}",
    timeout="30m",
)


@ci.job(runs_on=[HOST], timeout="10m")
def check(ctx):
    """Show what is being built; replace with your lint and test commands."""
    ctx.sh(["git", "log", "-1", "--oneline"])
    ctx.sh([sys.executable, "--version"])


release = workflow("release", on=[tag(patterns=["v*"])])


@release.job(runs_on=[HOST])
def announce(ctx):
    """Runs for tags such as v1.2.0."""
    ctx.sh(["git", "describe", "--tags", "--always"])
'''


def host_os_label() -> str:
    """The `conveyor:os:` value agents on this host report: linux, macos or windows."""
    if sys.platform.startswith("darwin"):
        return "macos"
    if sys.platform.startswith("win"):
        return "windows"
    return "linux"


def example_workflow(branch: str = "main") -> str:
    """The example workflow file, with this host's OS label and the branch it listens on filled in."""
    return EXAMPLE_WORKFLOW.format(os_label=host_os_label(), branch=branch)


def scaffold_branch(current: str | None, default: str) -> str:
    """The branch the example workflow listens on: the checked-out one (a `master` repository gets
    `master`), else the repository's default branch (a detached HEAD)."""
    return current or default


PRE_COMMIT_HOOK = """\
#!/bin/sh
# Installed by `conveyor init --hook`: refuse commits whose lock file is out of date.
exec conveyor compile --check
"""
