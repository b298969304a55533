"""Which strings may be used as a commit id or a ref name (pure).

Webhook payloads carry commit ids and ref names that end up as arguments of `git` and in the URLs of
forge APIs. A value such as `--upload-pack=touch /tmp/x;true` is neither, and one that is not must be
refused before it reaches either: these checks run where a payload is normalised, where an admin
request names a ref, and in the agent before a checkout.

`ref_problem` follows `git check-ref-format --allow-onelevel` (git-check-ref-format(1)), refusing in
addition a name that starts with `-` (as `--branch` does) and one longer than the columns that store it.
"""

from __future__ import annotations

import re

# The longest ref (and repository name) a run row stores: `runs.ref` and `runs.repo` are 500 characters.
MAX_REF_CHARS = 500
MAX_REPO_CHARS = 500

_COMMIT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# Control characters (below 0x20 and DEL), and what git-check-ref-format forbids anywhere in a name.
_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def is_commit_id(value: object) -> bool:
    """A full object id: 40 (SHA-1) or 64 (SHA-256) lower-case hex digits."""
    return isinstance(value, str) and _COMMIT_ID.fullmatch(value) is not None


def commit_id_problem(value: object) -> str | None:
    """Why `value` is not a full commit id, or None when it is one."""
    if is_commit_id(value):
        return None
    return "is not a commit id (40 or 64 lower-case hex digits)"


def ref_problem(ref: object) -> str | None:
    """Why `ref` is not a valid ref name (`refs/heads/main`, or a one-level `main`), or None."""
    if not isinstance(ref, str):
        return "is not a string"
    if not ref:
        return "is empty"
    if len(ref) > MAX_REF_CHARS:
        return f"is longer than {MAX_REF_CHARS} characters"
    if ref.startswith("-"):
        return "starts with '-'"
    if _FORBIDDEN.search(ref):
        return "contains a control character, a space or one of ~ ^ : ? * [ \\"
    if ref == "@":
        return "is '@'"
    if "@{" in ref:
        return "contains '@{'"
    if ".." in ref:
        return "contains '..'"
    if ref.startswith("/") or ref.endswith("/") or "//" in ref:
        return "has an empty path component"
    if ref.endswith("."):
        return "ends with '.'"
    for component in ref.split("/"):
        if component.startswith("."):
            return "has a path component starting with '.'"
        if component.endswith(".lock"):
            return "has a path component ending with '.lock'"
    return None


def repo_name_problem(name: object) -> str | None:
    """Why `name` cannot be a repository's `owner/name` (it goes into API paths), or None.

    Lenient about the characters forges allow, strict about what could steer a URL: no empty, `.` or `..`
    segment, no control character, space, `?`, `#`, `%` or backslash.
    """
    if not isinstance(name, str):
        return "is not a string"
    if not name:
        return "is empty"
    if len(name) > MAX_REPO_CHARS:
        return f"is longer than {MAX_REPO_CHARS} characters"
    if re.search(r"[\x00-\x20\x7f?#%\\]", name):
        return "contains a control character, a space or one of ? # % \\"
    if any(segment in ("", ".", "..") for segment in name.split("/")):
        return "has an empty, '.' or '..' path segment"
    if name.startswith("-"):
        return "starts with '-'"
    return None
