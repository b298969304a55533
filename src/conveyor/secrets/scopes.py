"""Names and scopes of secrets, environments and variables (docs/design/admin.md §6, §6.1): pure validation.

A secret lives in one scope: `org` (every job), `env/<environment>` (jobs of that environment; wins
over `org` on a name clash) or `source:<id>` (a source's webhook secrets and clone tokens, never
given to jobs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from conveyor.errors import ConveyorError

ORG_SCOPE = "org"
ENV_SCOPE_PREFIX = "env/"
SOURCE_SCOPE_PREFIX = "source:"
MAX_SECRET_BYTES = 64 * 1024
MAX_VARIABLE_BYTES = 64 * 1024
MAX_ALLOWED_BRANCHES = 100
MAX_BRANCH_GLOB_CHARS = 256

_SCOPE = re.compile(r"^[a-z0-9][a-z0-9/:_-]{0,127}$")
_SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_ENVIRONMENT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_SOURCE_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,119}$")
# Variables become process environment variables of steps.
_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# The runner sets these itself, last, so a variable of that name would silently never apply.
_RESERVED_VARIABLE = re.compile(r"^(PATH|CONVEYOR_.*)$", re.IGNORECASE)

ScopeKind = Literal["org", "env", "source"]


class InvalidName(ConveyorError, ValueError):
    """A scope, secret, environment or variable name (or value) the store refuses.

    `code` is the API error code; the message says what the rule is.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Scope:
    """A parsed scope: its kind and the environment name or source id it names."""

    text: str
    kind: ScopeKind
    target: str | None = None

    @property
    def environment(self) -> str | None:
        """The environment of an `env/<name>` scope."""
        return self.target if self.kind == "env" else None


def parse_scope(text: str) -> Scope:
    """Validate a scope and say what it names; `InvalidName("invalid_scope")` otherwise."""
    rule = "a scope is `org`, `env/<environment>` or `source:<id>`"
    if not _SCOPE.match(text):
        raise InvalidName("invalid_scope", f"scope {text[:140]!r} is not valid: {rule}")
    if text == ORG_SCOPE:
        return Scope(text, "org")
    if text.startswith(ENV_SCOPE_PREFIX):
        environment = text.removeprefix(ENV_SCOPE_PREFIX)
        if _ENVIRONMENT_NAME.match(environment):
            return Scope(text, "env", environment)
    if text.startswith(SOURCE_SCOPE_PREFIX):
        source_id = text.removeprefix(SOURCE_SCOPE_PREFIX)
        if _SOURCE_ID.match(source_id):
            return Scope(text, "source", source_id)
    raise InvalidName("invalid_scope", f"scope {text!r} is not valid: {rule}")


def environment_scope(environment: str) -> str:
    """The scope of an environment's secrets."""
    return ENV_SCOPE_PREFIX + environment


def source_scope(source_id: str) -> str:
    """The scope of a source's webhook secrets and tokens."""
    return SOURCE_SCOPE_PREFIX + source_id


def check_secret_name(name: str) -> str:
    """A secret name matches `[A-Za-z_][A-Za-z0-9_]{0,127}`."""
    if not _SECRET_NAME.match(name):
        raise InvalidName(
            "invalid_secret_name",
            f"secret name {name[:140]!r} is not valid: use letters, digits and `_`, not starting "
            "with a digit, at most 128 characters",
        )
    return name


def check_secret_value(value: str) -> bytes:
    """A value is at most 64 KiB of UTF-8; returns its bytes."""
    encoded = value.encode("utf-8")
    if len(encoded) > MAX_SECRET_BYTES:
        raise InvalidName(
            "secret_too_large",
            f"a secret value is at most {MAX_SECRET_BYTES} bytes, this one is {len(encoded)}",
        )
    return encoded


def check_environment_name(name: str) -> str:
    """An environment name matches `[a-z0-9][a-z0-9_-]{0,63}`."""
    if not _ENVIRONMENT_NAME.match(name):
        raise InvalidName(
            "invalid_environment_name",
            f"environment name {name[:80]!r} is not valid: lowercase letters, digits, `_` and `-`, "
            "starting with a letter or digit, at most 64 characters",
        )
    return name


def check_variable(name: str, value: str) -> None:
    """A variable is an environment-variable name (not PATH or CONVEYOR_*) with a value ≤ 64 KiB."""
    if not _VARIABLE_NAME.match(name):
        raise InvalidName(
            "invalid_variable_name",
            f"variable name {name[:140]!r} is not valid: use letters, digits and `_`, not starting "
            "with a digit, at most 128 characters",
        )
    if _RESERVED_VARIABLE.match(name):
        raise InvalidName(
            "invalid_variable_name",
            f"variable {name} is set by the runner itself (PATH and CONVEYOR_* cannot be overridden)",
        )
    if len(value.encode("utf-8")) > MAX_VARIABLE_BYTES:
        raise InvalidName("variable_too_large", f"variable {name} is longer than {MAX_VARIABLE_BYTES} bytes")
    if "\x00" in value:
        raise InvalidName("invalid_variable_value", f"variable {name} contains a NUL character")


def check_allowed_branches(globs: list[str]) -> list[str]:
    """At most 100 non-empty globs of at most 256 characters each."""
    if len(globs) > MAX_ALLOWED_BRANCHES:
        raise InvalidName(
            "invalid_allowed_branches", f"at most {MAX_ALLOWED_BRANCHES} branch globs, not {len(globs)}"
        )
    for glob in globs:
        if not glob or len(glob) > MAX_BRANCH_GLOB_CHARS or glob != glob.strip():
            raise InvalidName(
                "invalid_allowed_branches",
                f"branch glob {glob[:80]!r} is not valid: non-empty, no surrounding spaces, at most "
                f"{MAX_BRANCH_GLOB_CHARS} characters",
            )
    return globs
