"""Syntax of the string templates the orchestrator renders (`concurrency`, `concurrency_group`, `environment`).

The SDK validates templates here at definition time; `conveyor.matching.templates` renders them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from string import Formatter

from conveyor.errors import ConveyorError

# The scalar fields of the normalised event (docs/design/authoring.md §4) a template may name as
# `event.<field>`.
EVENT_SCALAR_FIELDS = (
    "type",
    "action",
    "repo",
    "source",
    "delivery_id",
    "ref",
    "branch",
    "tag",
    "base_branch",
    "head_branch",
    "pr_number",
    "sha",
    "before",
    "default_branch",
    "sender",
    "is_fork",
)

_PAYLOAD_PATH_RE = re.compile(r"^[A-Za-z0-9_-]+(\[\d+\])*(\.[A-Za-z0-9_-]+(\[\d+\])*)*$")


@dataclass(frozen=True, slots=True)
class TemplatePart:
    """A literal run of text followed by an optional placeholder name."""

    literal: str
    placeholder: str | None


class TemplateSyntaxError(ConveyorError, ValueError):
    """A template that cannot be rendered (E112)."""


def parse_template(template: str) -> tuple[TemplatePart, ...]:
    """Split a template into literal text and placeholder names, refusing format specs and conversions."""
    parts: list[TemplatePart] = []
    try:
        parsed = list(Formatter().parse(template))
    except ValueError as error:
        raise TemplateSyntaxError(f"template {template!r}: {error}") from None
    for literal, field, spec, conversion in parsed:
        if field is None:
            parts.append(TemplatePart(literal, None))
            continue
        if conversion is not None or spec:
            raise TemplateSyntaxError(f"template {template!r}: format specs and conversions are not allowed")
        if not field:
            raise TemplateSyntaxError(f"template {template!r}: empty placeholder '{{}}'")
        parts.append(TemplatePart(literal, field))
    return tuple(parts)


def check_template(template: str, *, matrix_keys: tuple[str, ...] | None = None, job_level: bool) -> None:
    """Raise `TemplateSyntaxError` unless every placeholder names something the orchestrator can render."""
    for part in parse_template(template):
        if part.placeholder is None:
            continue
        name = part.placeholder
        if name == "workflow":
            continue
        if name.startswith("event.payload."):
            if _PAYLOAD_PATH_RE.match(name.removeprefix("event.payload.")):
                continue
        elif name.startswith("event."):
            if name.removeprefix("event.") in EVENT_SCALAR_FIELDS:
                continue
        elif job_level and name == "job":
            continue
        elif job_level and name.startswith("matrix."):
            if matrix_keys is not None and name.removeprefix("matrix.") in matrix_keys:
                continue
        raise TemplateSyntaxError(f"template {template!r}: unknown placeholder {{{name}}}")
