"""The post-receive hook `conveyor admin source install-hook` writes into a repository."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

HOOK_MARKER = "# conveyor post-receive hook"


class HookExists(Exception):
    """A post-receive hook Conveyor did not write is in the way (use --force)."""


def hook_script(source: str, python: str = sys.executable) -> str:
    """A hook that calls `trigger-local` for each updated branch or tag and never fails the push."""
    return f"""#!/bin/sh
{HOOK_MARKER} (source {source})
# Reads "<old> <new> <ref>" lines; uses CONVEYOR_URL and CONVEYOR_TOKEN like the CLI.
while read old new ref; do
  case "$ref" in refs/heads/*|refs/tags/*) ;; *) continue ;; esac
  case "$new" in 0000000000000000000000000000000000000000) continue ;; esac
  {shlex.quote(python)} -m conveyor admin source trigger-local {shlex.quote(source)} \\
      --repo "$(pwd)" --ref "$ref" --sha "$new" --before "$old" \\
    || echo "conveyor: could not trigger a run for $ref (the push itself succeeded)" >&2
done
exit 0
"""


def git_dir(repo: Path) -> Path:
    """The git directory of a work tree or a bare repository."""
    return repo / ".git" if (repo / ".git").is_dir() else repo


def install_hook(repo: Path, source: str, *, force: bool) -> Path:
    """Write `hooks/post-receive`; refuse to replace a hook Conveyor did not write unless `force`."""
    hooks = git_dir(repo) / "hooks"
    hooks.mkdir(parents=True, exist_ok=True)
    path = hooks / "post-receive"
    if path.exists() and HOOK_MARKER not in path.read_text(errors="replace") and not force:
        raise HookExists(f"{path} exists and was not written by Conveyor; pass --force to replace it")
    path.write_text(hook_script(source))
    path.chmod(0o755)
    return path
