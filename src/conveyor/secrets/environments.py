"""Dispatch-time checks of a job's environment (docs/design/admin.md §6.1): pure functions.

The execution layer renders the job's `environment` template, loads the named environment (or
nothing), and calls `check_environment_for_dispatch`; a refusal fails the job with its `code`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from wcmatch import glob

# Branch globs behave like trigger branch filters (docs/design/authoring.md §2.6): `*` stays within a `/`
# segment, `**` spans segments, `{a,b}` alternates, case-sensitive.
BRANCH_GLOB_FLAGS = glob.GLOBSTAR | glob.BRACE | glob.DOTMATCH | glob.CASE | glob.FORCEUNIX


@dataclass(frozen=True)
class Environment:
    """A stored environment: variables and the branches allowed to use it (empty = any)."""

    name: str
    variables: dict[str, str] = field(default_factory=dict)
    allowed_branches: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnvironmentRefusal:
    """Why a job may not run in its environment: `code` fails the job, `detail` says why."""

    code: str
    detail: str


def branch_allowed(branch: str | None, allowed_branches: Sequence[str]) -> bool:
    """Whether `branch` matches one of the globs; an empty list allows every branch (and none)."""
    if not allowed_branches:
        return True
    if branch is None:
        return False
    return any(glob.globmatch(branch, pattern, flags=BRANCH_GLOB_FLAGS) for pattern in allowed_branches)


def check_environment_for_dispatch(
    rendered_name: str | None, environment: Environment | None, branch: str | None
) -> EnvironmentRefusal | None:
    """None when the job may run; else `environment_not_found` or `environment_branch_not_allowed`.

    `rendered_name` is the job's rendered environment (None or "" for no environment),
    `environment` what the store holds under that name (None when there is no such row), and
    `branch` the run's branch (None for tags and events without one).
    """
    if not rendered_name:
        return None
    if environment is None:
        return EnvironmentRefusal(
            "environment_not_found",
            f"environment {rendered_name!r} does not exist; create it with "
            f"`conveyor admin environment set {rendered_name}`",
        )
    if branch_allowed(branch, environment.allowed_branches):
        return None
    globs = ", ".join(environment.allowed_branches)
    shown = f"branch {branch!r}" if branch is not None else "a run without a branch"
    return EnvironmentRefusal(
        "environment_branch_not_allowed",
        f"{shown} may not use environment {environment.name!r}: its allowed branches are {globs}",
    )
