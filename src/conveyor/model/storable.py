"""Which request values the databases can store (pure).

PostgreSQL's `text` and `jsonb` cannot hold a NUL character, and JSON has no NaN or Infinity (Python's
decoder accepts them; PostgreSQL refuses them). A value that holds either is refused where it enters,
with a 400 that says so, rather than failing later in a statement (a 500, or a delivery that cannot
be processed).
"""

from __future__ import annotations

import json
from typing import Any

from conveyor.errors import ConveyorError

NUL = "\x00"
_JSON_NUL = b"\\u0000"
_CONSTANTS = (b"NaN", b"Infinity")


class Unstorable(ConveyorError, ValueError):
    """A value the databases cannot store; the message says what it holds."""


def _refuse_constant(name: str) -> Any:
    raise Unstorable(f"holds {name}, which JSON does not allow")


def nul_problem(document: Any) -> str | None:
    """'holds a NUL character …' when any string or key of a decoded JSON document has one, else None."""
    pending = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            if NUL in value:
                return "holds a NUL character (\\u0000), which cannot be stored"
        elif isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return None


def loads_storable(raw: bytes | str) -> Any:
    """`json.loads` that raises `Unstorable` for NaN, Infinity or a NUL character anywhere in the document.

    Other errors are `json.loads`'s own. The document is walked only when its text has a `\\u0000`
    escape, the only way JSON can carry a NUL, so an ordinary body costs no more than the decode.
    """
    document = json.loads(raw, parse_constant=_refuse_constant)
    marker = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    if _JSON_NUL in marker and (problem := nul_problem(document)) is not None:
        raise Unstorable(problem)
    return document


def json_body_problem(raw: bytes) -> str | None:
    """Why a JSON request body cannot be stored, or None (also None for a body that is not JSON: the route
    answers that itself). Decodes only a body that has a `\\u0000`, `NaN` or `Infinity` in its text."""
    if _JSON_NUL not in raw and not any(constant in raw for constant in _CONSTANTS):
        return None
    try:
        loads_storable(raw)
    except Unstorable as exc:
        return f"the body {exc}"
    except (ValueError, RecursionError):
        return None
    return None
