"""The git hooks `conveyor admin source install-hook` writes into a repository.

`--on push` (the default) writes `post-receive`: every push into the repository triggers the pushed refs.
`--on commit` writes `post-commit`: every commit in this work tree triggers HEAD (a non-bare repository you
commit in directly, where a push into the checked-out branch is refused by git unless
`receive.denyCurrentBranch updateInstead`). Neither hook ever fails the git command that ran it.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Literal

from conveyor.errors import ConveyorError

HOOK_MARKER = "# conveyor post-receive hook"
COMMIT_HOOK_MARKER = "# conveyor post-commit hook"
HookKind = Literal["push", "commit"]
HOOK_FILES: dict[str, str] = {"push": "post-receive", "commit": "post-commit"}
_MARKERS = (HOOK_MARKER, COMMIT_HOOK_MARKER)


class HookExists(ConveyorError):
    """A hook Conveyor did not write is in the way (use --force)."""


def _trigger_line(python: str, source: str, args: str) -> str:
    # Exit 5 is "the delivery started no run": trigger-local printed why; anything else is a failure.
    return f"""  {shlex.quote(python)} -m conveyor admin source trigger-local {shlex.quote(source)} {args}
  code=$?
  if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then
    echo "conveyor: could not trigger a run for $ref (exit $code; the git command itself succeeded)" >&2
  fi"""


def hook_script(source: str, python: str = sys.executable) -> str:
    """A post-receive hook that calls `trigger-local` for each updated branch or tag, never failing a push."""
    line = _trigger_line(python, source, '--repo "$(pwd)" --ref "$ref" --sha "$new" --before "$old"')
    return f"""#!/bin/sh
{HOOK_MARKER} (source {source})
# Reads "<old> <new> <ref>" lines; uses CONVEYOR_URL and CONVEYOR_TOKEN like the CLI.
while read old new ref; do
  case "$ref" in refs/heads/*|refs/tags/*) ;; *) continue ;; esac
  case "$new" in 0000000000000000000000000000000000000000) continue ;; esac
{line}
done
exit 0
"""


def commit_hook_script(source: str, python: str = sys.executable) -> str:
    """A post-commit hook that triggers the new HEAD of the checked-out branch, never failing a commit.

    It passes the commit's parent as `--before`, so a paths filter sees the files the commit changed
    (a root commit passes all zeros: a created ref, whose changed files are unknown).
    """
    line = _trigger_line(python, source, '--repo "$(pwd)" --ref "$ref" --sha "$new" --before "$old"')
    return f"""#!/bin/sh
{COMMIT_HOOK_MARKER} (source {source})
# Triggers HEAD after each commit; uses CONVEYOR_URL and CONVEYOR_TOKEN like the CLI.
ref=$(git symbolic-ref -q HEAD) || exit 0
new=$(git rev-parse HEAD) || exit 0
old=$(git rev-parse -q --verify "$new^") || old={"0" * 40}
{line}
exit 0
"""


def git_dir(repo: Path) -> Path:
    """The git directory of a work tree or a bare repository."""
    return repo / ".git" if (repo / ".git").is_dir() else repo


def install_hook(repo: Path, source: str, *, force: bool, on: HookKind = "push") -> Path:
    """Write `hooks/post-receive` (or `post-commit`); refuse to replace a hook Conveyor did not write
    unless `force`."""
    hooks = git_dir(repo) / "hooks"
    hooks.mkdir(parents=True, exist_ok=True)
    path = hooks / HOOK_FILES[on]
    if path.exists() and not force:
        text = path.read_text(errors="replace")
        if not any(marker in text for marker in _MARKERS):
            raise HookExists(f"{path} exists and was not written by Conveyor; pass --force to replace it")
    path.write_text(hook_script(source) if on == "push" else commit_hook_script(source))
    path.chmod(0o755)
    return path
