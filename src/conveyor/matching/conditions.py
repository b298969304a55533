"""`match`/`not` conditions on payload paths (`images[0].tag`), with JSON equality (`True ≠ 1`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from conveyor.lockfile.models import EqualsCondition, InCondition, RegexCondition
from conveyor.matching.patterns import compiled_filter

_MISSING = object()
_SEGMENT_RE = re.compile(r"([^.\[\]]+)|\[(\d+)\]")

Condition = EqualsCondition | InCondition | RegexCondition


@lru_cache(maxsize=8192)
def _path_segments(path: str) -> tuple[str | int, ...]:
    return tuple(int(index) if index else key for key, index in _SEGMENT_RE.findall(path))


def payload_value(payload: Mapping[str, Any], path: str) -> Any:
    """The value at a dot/index path, or `MISSING`."""
    value: Any = payload
    for segment in _path_segments(path):
        if isinstance(segment, int):
            if not isinstance(value, list) or segment >= len(value):
                return _MISSING
            value = value[segment]
        else:
            if not isinstance(value, Mapping) or segment not in value:
                return _MISSING
            value = value[segment]
    return value


def json_equal(left: Any, right: Any) -> bool:
    """Equality as JSON sees it: booleans never equal numbers, `1 == 1.0`, containers compared deeply."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(json_equal(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(json_equal(left[key], right[key]) for key in left)
    return type(left) is type(right) and left == right


def condition_holds(condition: Condition, payload: Mapping[str, Any], path: str) -> bool:
    """Whether the payload value at `path` satisfies the condition (a missing value equals only null)."""
    value = payload_value(payload, path)
    if isinstance(condition, EqualsCondition):
        return json_equal(None if value is _MISSING else value, condition.equals)
    if value is _MISSING:
        return False
    if isinstance(condition, InCondition):
        return any(json_equal(value, option) for option in condition.in_)
    return isinstance(value, str) and bool(compiled_filter("regex", condition.regex, condition.flags)(value))


def describe_condition(condition: Condition) -> str:
    """Human form of a condition."""
    if isinstance(condition, EqualsCondition):
        return f"== {condition.equals!r}"
    if isinstance(condition, InCondition):
        return f"in {condition.in_!r}"
    return f"~ regex '{condition.regex}'"
