"""Facts about the local git repository that the authoring commands use as event defaults
(docs/design/authoring.md §6)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

_REMOTE_RE = re.compile(r"(?:[:/])([^/:]+)/([^/]+?)(?:\.git)?/?$")


def git_output(root: Path, *args: str) -> str | None:
    """stdout of a git command run in `root`, stripped; None when git fails or is missing."""
    try:
        completed = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=False, encoding="utf-8"
        )
    except OSError:
        return None
    return completed.stdout.strip() if completed.returncode == 0 else None


def repository_root(start: Path) -> Path:
    """The git top level containing `start`, else `start` itself."""
    top = git_output(start, "rev-parse", "--show-toplevel")
    return Path(top) if top else start


def repo_name(root: Path) -> str:
    """`owner/name` from the origin URL, else `local/<directory>`."""
    url = git_output(root, "remote", "get-url", "origin")
    if url and (found := _REMOTE_RE.search(url)):
        return f"{found.group(1)}/{found.group(2)}"
    return f"local/{root.resolve().name}"


def current_branch(root: Path) -> str | None:
    """The checked-out branch (also when it has no commits yet); None on a detached HEAD."""
    return git_output(root, "symbolic-ref", "--short", "-q", "HEAD") or None


def commit_sha(root: Path, revision: str) -> str | None:
    """The full sha of a revision, or None."""
    return (
        git_output(root, "rev-parse", "-q", "--verify", "--end-of-options", f"{revision}^{{commit}}") or None
    )


def default_branch(root: Path) -> str:
    """From `origin/HEAD`, else `main`."""
    ref = git_output(root, "symbolic-ref", "--short", "-q", "refs/remotes/origin/HEAD")
    return ref.removeprefix("origin/") if ref else "main"


def user_name(root: Path) -> str | None:
    """`git config user.name`."""
    return git_output(root, "config", "user.name") or None


def _lines(text: str | None) -> set[str]:
    return {line for line in (text or "").splitlines() if line}


def uncommitted_files(root: Path) -> set[str]:
    """Modified, staged, deleted and untracked (not ignored) files."""
    changed = _lines(git_output(root, "diff", "--name-only", "HEAD"))
    untracked = _lines(git_output(root, "ls-files", "--others", "--exclude-standard"))
    return changed | untracked


def push_changed_files(root: Path) -> list[str] | None:
    """The HEAD commit's files ∪ uncommitted changes; None when there is no commit."""
    if commit_sha(root, "HEAD") is None:
        return None
    committed = _lines(git_output(root, "diff-tree", "--no-commit-id", "--name-only", "-r", "--root", "HEAD"))
    return sorted(committed | uncommitted_files(root))


def pr_changed_files(root: Path, base: str) -> list[str] | None:
    """`git diff --name-only base...HEAD` ∪ uncommitted changes; None when the diff cannot be computed."""
    diff = git_output(root, "diff", "--name-only", f"{base}...HEAD")
    if diff is None:
        return None
    return sorted(_lines(diff) | uncommitted_files(root))
