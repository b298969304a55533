"""Every option of `job()`, `Workflow.job`, `step()` and `workflow()` is in the SDK's signature and docstring
(so `help(job)` lists it) and in docs/authoring.md, which also covers step outputs and secrets."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import conveyor
from conveyor.sdk.declarations import Job, Step, Workflow

ROOT = Path(__file__).resolve().parents[3]
AUTHORING = (ROOT / "docs/authoring.md").read_text(encoding="utf-8")


def options_of(declaring: type) -> list[str]:
    """The keyword options a declaration takes (its own, not the private or catch-all ones)."""
    return [
        name
        for name, parameter in inspect.signature(declaring).parameters.items()
        if not name.startswith("_")
        and parameter.kind is not inspect.Parameter.VAR_KEYWORD
        and name not in ("name", "fn")
    ]


JOB_OPTIONS = options_of(Job)
STEP_OPTIONS = options_of(Step)
WORKFLOW_OPTIONS = options_of(Workflow)


def test_the_option_lists_are_the_real_ones() -> None:
    assert {"runs_on", "matrix", "needs", "checkout", "grace_period"} <= set(JOB_OPTIONS)
    assert {"timeout", "retry", "outputs"} <= set(STEP_OPTIONS)
    assert {"on", "concurrency", "hash_files"} <= set(WORKFLOW_OPTIONS)


def test_job_takes_every_job_option_by_name_and_its_docstring_lists_them() -> None:
    parameters = inspect.signature(conveyor.job).parameters
    missing = [option for option in JOB_OPTIONS if option not in parameters]
    assert not missing, f"job() hides these options behind **options: {missing}"
    for documented in (conveyor.job, Workflow.job):
        doc = inspect.getdoc(documented) or ""
        assert not [o for o in JOB_OPTIONS if not re.search(rf"\b{o}\b", doc)], documented


@pytest.mark.parametrize(
    ("what", "options"), [("job", JOB_OPTIONS), ("step", STEP_OPTIONS), ("workflow", WORKFLOW_OPTIONS)]
)
def test_docs_authoring_names_every_option(what: str, options: list[str]) -> None:
    missing = [option for option in options if f"`{option}" not in AUTHORING]
    assert not missing, f"docs/authoring.md does not cover these {what} options: {missing}"


def test_docs_authoring_covers_step_outputs_and_secrets() -> None:
    for phrase in ("ctx.outputs_of", "outputs=", "ctx.secrets.get", "ctx.secrets.expose", "admin secret set"):
        assert phrase in AUTHORING, phrase
