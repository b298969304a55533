"""Filter patterns (branches, tags, paths, names) and label matchers as the lock file records them.

This module only validates and describes patterns; matching them against values is `conveyor.matching`'s job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from conveyor.sdk.errors import authoring_error

PatternLike = str | re.Pattern[str]
PatternsLike = PatternLike | Iterable[PatternLike]

GLOB_CHARACTERS = frozenset("*?[]{}")
MAX_REGEX_LENGTH = 256


@dataclass(frozen=True, slots=True)
class PatternSpec:
    """One entry of a filter list: a glob or a full-match regex, possibly negated (`!glob`)."""

    kind: Literal["glob", "regex"]
    pattern: str
    flags: str
    negate: bool


@dataclass(frozen=True, slots=True)
class LabelSpec:
    """One `runs_on` label matcher: exact, glob or regex."""

    kind: Literal["exact", "glob", "regex"]
    pattern: str
    flags: str


def regex_problem(pattern: str, flags: str) -> str | None:
    """Why a lock-file regex is unacceptable (E110), or None when it is fine.

    Nested unbounded quantifiers such as `(a+)+` are refused because they backtrack exponentially and the
    orchestrator evaluates these patterns on untrusted input.
    """
    if flags not in ("", "i"):
        return f"regex flags {flags!r} are not allowed (only re.IGNORECASE)"
    if len(pattern) > MAX_REGEX_LENGTH:
        return f"regex is longer than {MAX_REGEX_LENGTH} characters"
    try:
        re.compile(pattern, re.IGNORECASE if flags == "i" else 0)
        from re import _parser  # type: ignore[attr-defined]

        parsed = _parser.parse(pattern)
    except (re.error, RecursionError) as error:
        return f"regex {pattern!r} does not compile: {error}"
    if _has_nested_unbounded_repeat(parsed, inside_unbounded=False):
        return f"regex {pattern!r} nests unbounded quantifiers (catastrophic backtracking)"
    return None


def _has_nested_unbounded_repeat(items: object, *, inside_unbounded: bool) -> bool:
    from re import _constants  # type: ignore[attr-defined]

    for opcode, argument in items:  # type: ignore[attr-defined]
        if opcode in (_constants.MAX_REPEAT, _constants.MIN_REPEAT, _constants.POSSESSIVE_REPEAT):
            _, maximum, body = argument
            unbounded = maximum == _constants.MAXREPEAT
            if unbounded and inside_unbounded:
                return True
            if _has_nested_unbounded_repeat(body, inside_unbounded=inside_unbounded or unbounded):
                return True
        elif opcode == _constants.SUBPATTERN:
            if _has_nested_unbounded_repeat(argument[-1], inside_unbounded=inside_unbounded):
                return True
        elif opcode == _constants.BRANCH:
            for branch in argument[1]:
                if _has_nested_unbounded_repeat(branch, inside_unbounded=inside_unbounded):
                    return True
        elif opcode in (_constants.ASSERT, _constants.ASSERT_NOT):
            if _has_nested_unbounded_repeat(argument[1], inside_unbounded=inside_unbounded):
                return True
    return False


def _regex_flags(compiled: re.Pattern[str], what: str) -> str:
    # re.UNICODE is implied for str patterns; anything else changes semantics the lock cannot carry.
    extra = compiled.flags & ~(re.UNICODE | re.IGNORECASE)
    if extra:
        raise authoring_error("E110", f"{what}: only re.IGNORECASE is allowed on regex {compiled.pattern!r}")
    return "i" if compiled.flags & re.IGNORECASE else ""


def _as_list(values: PatternsLike | None) -> list[PatternLike]:
    if values is None:
        return []
    if isinstance(values, str | re.Pattern):
        return [values]
    return list(values)


def filter_patterns(
    values: PatternsLike | None, *, what: str, globs_only: bool = False
) -> tuple[PatternSpec, ...]:
    """Validate a filter list: `str` is a glob (leading `!` negates), `re.Pattern` a full-match regex."""
    specs: list[PatternSpec] = []
    for value in _as_list(values):
        if isinstance(value, re.Pattern):
            if globs_only:
                raise authoring_error(
                    "E110", f"{what}: only globs are allowed here, not regex {value.pattern!r}"
                )
            if not isinstance(value.pattern, str):
                raise authoring_error("E110", f"{what}: regex must be a str pattern")
            flags = _regex_flags(value, what)
            problem = regex_problem(value.pattern, flags)
            if problem:
                raise authoring_error("E110", f"{what}: {problem}")
            specs.append(PatternSpec("regex", value.pattern, flags, False))
        elif isinstance(value, str):
            negate = value.startswith("!")
            pattern = value[1:] if negate else value
            if not pattern:
                raise authoring_error("E110", f"{what}: empty pattern {value!r}")
            specs.append(PatternSpec("glob", pattern, "", negate))
        else:
            raise authoring_error("E110", f"{what}: {value!r} is neither a glob string nor a re.Pattern")
    return tuple(specs)


def label_spec(value: PatternLike, *, what: str = "runs_on") -> LabelSpec:
    """Turn one `runs_on` value into a label matcher (labels are lowercase, so exact and glob are lowercased)."""
    if isinstance(value, re.Pattern):
        flags = _regex_flags(value, what)
        problem = regex_problem(value.pattern, flags)
        if problem:
            raise authoring_error("E110", f"{what}: {problem}")
        return LabelSpec("regex", value.pattern, flags)
    if isinstance(value, str):
        if not value.strip():
            raise authoring_error("E108", f"{what}: empty label")
        kind: Literal["exact", "glob"] = "glob" if GLOB_CHARACTERS & set(value) else "exact"
        return LabelSpec(kind, value.lower(), "")
    raise authoring_error("E108", f"{what}: {value!r} is neither a label string nor a re.Pattern")


def label_specs(values: PatternsLike | None, *, what: str = "runs_on") -> tuple[LabelSpec, ...]:
    """`label_spec` over a single value or a list."""
    return tuple(label_spec(value, what=what) for value in _as_list(values))
