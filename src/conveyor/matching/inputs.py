"""Dispatch input validation where a run is created (orchestrator, or the CLI for `run local`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from conveyor.errors import ConveyorError
from conveyor.lockfile.models import InputEntry


class InvalidInputs(ConveyorError, ValueError):
    """`invalid_inputs`: one message per offending field."""

    code = "invalid_inputs"

    def __init__(self, problems: Mapping[str, str]) -> None:
        super().__init__("; ".join(f"{name}: {problem}" for name, problem in problems.items()))
        self.problems = dict(problems)


def _coerce(spec: InputEntry, raw: Any) -> Any:
    kind = spec.type
    if kind == "choice":
        for choice in spec.choices or []:
            if raw == choice or (isinstance(raw, str) and raw == str(choice)):
                return choice
        raise ValueError(f"must be one of {spec.choices}")
    if kind == "boolean":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "1", "false", "0"):
            return raw.lower() in ("true", "1")
        raise ValueError("must be a boolean (true, false, 1, 0)")
    if kind == "integer":
        if isinstance(raw, bool):
            raise ValueError("must be an integer")
        value: Any = int(raw) if isinstance(raw, int | str) else None
        if value is None:
            raise ValueError("must be an integer")
    elif kind == "number":
        if isinstance(raw, bool) or not isinstance(raw, int | float | str):
            raise ValueError("must be a number")
        value = float(raw)
    else:
        if not isinstance(raw, str):
            raise ValueError("must be a string")
        if spec.pattern is not None and not re.fullmatch(spec.pattern, raw):
            raise ValueError(f"does not match pattern {spec.pattern!r}")
        return raw
    if spec.min is not None and value < spec.min:
        raise ValueError(f"must be ≥ {spec.min:g}")
    if spec.max is not None and value > spec.max:
        raise ValueError(f"must be ≤ {spec.max:g}")
    return value


def validate_dispatch_inputs(specs: Mapping[str, InputEntry], given: Mapping[str, Any]) -> dict[str, Any]:
    """Coerce and check the given inputs against the trigger's specs and fill defaults; raise `InvalidInputs`."""
    problems: dict[str, str] = {}
    result: dict[str, Any] = {}
    for name in given:
        if name not in specs:
            problems[name] = "unknown input"
    for name, spec in specs.items():
        if name not in given:
            if spec.required and spec.default is None:
                problems[name] = "is required"
            else:
                result[name] = spec.default
            continue
        try:
            result[name] = _coerce(spec, given[name])
        except ValueError as error:
            problems[name] = (
                str(error) if "invalid literal" not in str(error) else f"cannot parse {given[name]!r}"
            )
    if problems:
        raise InvalidInputs(problems)
    return result
