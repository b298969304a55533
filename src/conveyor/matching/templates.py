"""Rendering of `concurrency`, `concurrency_group` and `environment` templates; no user code runs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from conveyor.matching.conditions import _MISSING, payload_value
from conveyor.matching.event import Event
from conveyor.sdk.templates import parse_template

MAX_RENDERED_LENGTH = 256


def _as_text(value: Any) -> str:
    if value is None or value is _MISSING:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=False)
    return str(value)


def render_template(
    template: str,
    *,
    event: Event,
    workflow: str,
    job: str | None = None,
    matrix: Mapping[str, Any] | None = None,
) -> str:
    """Fill placeholders (`{event.branch}`, `{event.payload.x[0]}`, `{workflow}`, `{job}`, `{matrix.k}`).

    Null or missing values render as "", objects and lists as compact JSON; the result is cut to 256 chars.
    """
    pieces: list[str] = []
    for part in parse_template(template):
        pieces.append(part.literal)
        name = part.placeholder
        if name is None:
            continue
        if name == "workflow":
            value: Any = workflow
        elif name == "job":
            value = job
        elif name.startswith("matrix."):
            value = (matrix or {}).get(name.removeprefix("matrix."))
        elif name.startswith("event.payload."):
            value = payload_value(event.payload, name.removeprefix("event.payload."))
        else:
            value = getattr(event, name.removeprefix("event."), None)
        pieces.append(_as_text(value))
    return "".join(pieces)[:MAX_RENDERED_LENGTH]
