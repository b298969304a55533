"""The "Run workflow" form's controls and the inputs it posts (pure)."""

from __future__ import annotations

from typing import Any

from conveyor.dashboard.forms import (
    agent_token_body,
    filled,
    input_fields,
    inputs_from_form,
    label_list,
    notification_rule_body,
)


def _spec(kind: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "required": False,
        "default": None,
        "choices": None,
        "min": None,
        "max": None,
        "pattern": None,
        "description": None,
        **fields,
    }


def test_each_input_gets_a_control_in_declaration_order_showing_its_default_and_its_rules() -> None:
    fields = input_fields(
        {
            "target": _spec("string", required=True, pattern=r"[a-z]+", description="where to"),
            "level": _spec("integer", default=3, min=1, max=5),
            "ratio": _spec("number", default=0.5),
            "dry_run": _spec("boolean", default=False),
            "region": _spec("choice", choices=["eu", "us"]),
        }
    )
    assert [(f.name, f.field, f.control, f.value) for f in fields] == [
        ("target", "input.target", "text", ""),
        ("level", "input.level", "text", "3"),
        ("ratio", "input.ratio", "text", "0.5"),
        ("dry_run", "input.dry_run", "select", "false"),
        ("region", "input.region", "select", ""),
    ]
    target, level, ratio, dry_run, region = fields
    assert target.hint == "string · required · matches [a-z]+" and target.description == "where to"
    assert level.hint == "integer · 1–5 · default 3" and level.numeric and ratio.numeric
    assert not target.numeric
    # A select offers "" (the default applies) only when the input has no default.
    assert dry_run.options == ("true", "false")
    assert region.options == ("", "eu", "us")


def test_posted_values_are_shown_again_as_typed() -> None:
    inputs = {"level": _spec("integer", default=3), "dry_run": _spec("boolean", default=True)}
    fields = input_fields(inputs, {"input.level": "abc", "input.dry_run": "false", "csrf_token": "x"})
    assert [f.value for f in fields] == ["abc", "false"]


def test_the_form_posts_each_input_as_typed_and_leaves_empty_ones_to_their_default() -> None:
    form = {"csrf_token": "x", "ref": "main", "input.target": "prod", "input.level": "", "input.b": "true"}
    assert inputs_from_form(form) == {"target": "prod", "b": "true"}


def test_management_forms_send_only_the_fields_filled_in() -> None:
    form = {"label": " ci ", "expires_in_days": "", "labels": "linux, docker  gpu", "mandatory_labels": ""}
    assert agent_token_body(form) == {
        "label": "ci",
        "labels": ["linux", "docker", "gpu"],
        "mandatory_labels": [],
    }
    assert filled({"role": "auditor", "routing_key": "  "}, ("role", "routing_key", "label")) == {
        "role": "auditor"
    }
    assert label_list(None) == []
    rule = {"source": "", "workflow": "ci", "ref": "main", "target_kind": "webhook", "target": "https://x/y"}
    assert notification_rule_body(rule, ["failed", "fixed"]) == {
        "on": ["failed", "fixed"],
        "workflow": "ci",
        "ref": "main",
        "webhook": "https://x/y",
    }
    assert notification_rule_body({"target_kind": "email", "target": "a@b.c"}, []) == {
        "on": [],
        "email": "a@b.c",
    }
