"""Pure helpers of the dashboard's forms: the "Run workflow" form (one control per declared dispatch input,
and the posted form turned back into the `inputs` of `POST runs`) and the management forms' API bodies.

The form carries no browser-side constraint (no `required`, `pattern`, `min` or `max` attribute): the
API is the one validator, so a bad value is refused with exactly the API's `invalid_inputs` sentence
(`docs/dashboard.md`, "Run a workflow"). The constraints are shown as a hint beside each control.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

INPUT_PREFIX = "input."

Control = Literal["text", "select"]


@dataclass(frozen=True)
class InputField:
    """One control of the form."""

    name: str
    field: str  # the form field's name: INPUT_PREFIX + name
    control: Control
    value: str  # shown: the value posted last, else the default, else empty
    options: tuple[str, ...]  # a select's choices; "" (the default applies) first when it has no default
    numeric: bool  # an integer or number: a numeric keyboard on phones
    hint: str  # "integer · required · 1–10"
    description: str | None


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _hint(spec: Mapping[str, Any]) -> str:
    parts = [str(spec.get("type") or "string")]
    if spec.get("required") and spec.get("default") is None:
        parts.append("required")
    low, high = spec.get("min"), spec.get("max")
    if low is not None or high is not None:
        parts.append(f"{_text(low) or '…'}–{_text(high) or '…'}")
    if spec.get("pattern"):
        parts.append(f"matches {spec['pattern']}")
    if spec.get("default") is not None:
        parts.append(f"default {_text(spec['default'])}")
    return " · ".join(parts)


def input_fields(
    inputs: Mapping[str, Mapping[str, Any]], posted: Mapping[str, Any] | None = None
) -> list[InputField]:
    """The form's controls for a dispatch trigger's `inputs` (the lock's entries, as `GET
    sources/{id}/workflows` answers them), in declaration order, showing `posted` values when given."""
    fields = []
    for name, spec in inputs.items():
        field = INPUT_PREFIX + name
        kind = spec.get("type") or "string"
        default = _text(spec.get("default"))
        shown = posted.get(field) if posted is not None else None
        value = shown if isinstance(shown, str) else default
        options: tuple[str, ...] = ()
        control: Control = "text"
        if kind in ("boolean", "choice"):
            control = "select"
            choices = (
                ("true", "false") if kind == "boolean" else tuple(_text(c) for c in spec.get("choices") or [])
            )
            options = choices if spec.get("default") is not None else ("", *choices)
        fields.append(
            InputField(
                name=name,
                field=field,
                control=control,
                value=value,
                options=options,
                numeric=kind in ("integer", "number"),
                hint=_hint(spec),
                description=spec.get("description"),
            )
        )
    return fields


def inputs_from_form(form: Mapping[str, Any]) -> dict[str, str]:
    """The `inputs` of `POST runs` from a posted form: every `input.<name>` field as the string typed,
    an empty one left out so that the input's default applies (or the API says it is required)."""
    inputs = {}
    for field, value in form.items():
        if field.startswith(INPUT_PREFIX) and isinstance(value, str) and value != "":
            inputs[field.removeprefix(INPUT_PREFIX)] = value
    return inputs


def filled(form: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, str]:
    """The named fields that were filled in (stripped), for an API body whose omitted fields keep their
    defaults; the API validates them."""
    values = {}
    for name in names:
        value = form.get(name)
        if isinstance(value, str) and value.strip():
            values[name] = value.strip()
    return values


def label_list(text: Any) -> list[str]:
    """`linux, docker` → `["linux", "docker"]` (commas or spaces; empty parts dropped)."""
    if not isinstance(text, str):
        return []
    return [part for part in text.replace(",", " ").split() if part]


def agent_token_body(form: Mapping[str, Any]) -> dict[str, Any]:
    """`POST agent-tokens` from the form: the label and expiry when given, the labels as lists."""
    return {
        **filled(form, ("label", "expires_in_days")),
        "labels": label_list(form.get("labels")),
        "mandatory_labels": label_list(form.get("mandatory_labels")),
    }


def notification_rule_body(form: Mapping[str, Any], on: list[str]) -> dict[str, Any]:
    """`POST notification-rules` from the form: the ticked run ends (`on`, the form's repeated field),
    the filters given, and the target as `email` or `webhook` by the chosen kind."""
    body: dict[str, Any] = {"on": on, **filled(form, ("source", "workflow", "ref"))}
    target = filled(form, ("target",)).get("target")
    if target is not None:
        body["webhook" if form.get("target_kind") == "webhook" else "email"] = target
    return body
