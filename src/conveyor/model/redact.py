"""Payload redaction for every payload read surface (docs/design/events.md §7): pure, on a deep copy. In `model`
because `execution` (the run page's trigger event) redacts too, and it sits below `events`."""

from __future__ import annotations

from typing import Any

REDACTED = "[redacted]"
_SECRET_PARTS = (
    "secret",
    "token",
    "password",
    "passwd",
    "apikey",
    "privatekey",
    "credential",
    "authorization",
    "cookie",
)


def is_secret_key(key: str) -> bool:
    """A key whose lowercased name without `_`/`-` is `claimcode` or contains a secret-like word."""
    folded = key.lower().replace("_", "").replace("-", "")
    return folded == "claimcode" or any(part in folded for part in _SECRET_PARTS)


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: REDACTED if is_secret_key(str(k)) else _redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(item) for item in value]
    return value


def redact_event_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """A redacted copy of `payload`; the argument is left untouched."""
    result = _redact(payload)
    assert isinstance(result, dict)
    return result
