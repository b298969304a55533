"""The registration index narrows completion events by the completed workflow's name (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.events.registrations import Registration, RegistrationIndex, completed_workflow_names
from conveyor.events.router import EventView, route
from conveyor.lockfile import parse_lock
from conveyor.lockfile.models import PatternEntry, WorkflowCompleteTriggerEntry, WorkflowEntry
from conveyor.matching.patterns import CompiledPatterns
from tests.support.repos import make_repo

NOW = datetime(2026, 3, 1, tzinfo=UTC)
NAMES = ["ci", "deploy", "docs", "ci-nightly", "CI"]


def glob(pattern: str, *, negate: bool = False, flags: str = "") -> PatternEntry:
    return PatternEntry(kind="glob", pattern=pattern, flags=flags, negate=negate)  # type: ignore[arg-type]


def trigger(*patterns: PatternEntry) -> WorkflowCompleteTriggerEntry:
    return WorkflowCompleteTriggerEntry(
        type="workflow_complete", workflow=list(patterns), status=["success", "failed"], from_repos=None
    )


AFTER_CI = """
from conveyor import workflow, workflow_complete

after = workflow("after", on=[workflow_complete(workflow="ci")])

@after.job(runs_on=["linux"])
def tell(ctx):
    ctx.sh(["echo", "after"])
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> WorkflowEntry:
    repo = make_repo(tmp_path_factory.mktemp("lock") / "repo", {"after": AFTER_CI})
    found = parse_lock((repo / ".conveyor" / "conveyor.lock.json").read_bytes()).workflow("after")
    assert found is not None
    return found


def entry(base: WorkflowEntry, name: str, *triggers: WorkflowCompleteTriggerEntry) -> WorkflowEntry:
    return base.model_copy(update={"name": name, "triggers": list(triggers)})


def registration(number: int, workflow: WorkflowEntry) -> Registration:
    return Registration(
        id=f"reg-{number:04d}",
        org_id="default",
        routing_key="local:app",
        repo="app",
        workflow_name=workflow.name,
        entry=workflow,
        kinds=frozenset({"workflow_complete"}),
        commit_sha="a" * 40,
        default_branch="main",
        disabled=False,
        updated_at=NOW,
    )


@pytest.mark.parametrize(
    ("patterns", "names"),
    [
        ([glob("ci")], frozenset({"ci"})),
        ([glob("ci"), glob("deploy")], frozenset({"ci", "deploy"})),
        ([glob("ci"), glob("ci-nightly", negate=True)], frozenset({"ci"})),
        ([glob("ci-*")], None),
        ([glob("ci?")], None),
        ([glob("{ci,docs}")], None),
        ([glob("ci", flags="i")], None),
        ([glob("docs", negate=True)], None),
        ([], None),
        ([PatternEntry(kind="regex", pattern="ci", flags="", negate=False)], None),
    ],
)
def test_the_names_a_trigger_can_admit(
    base: WorkflowEntry, patterns: list[PatternEntry], names: frozenset[str] | None
) -> None:
    assert completed_workflow_names(entry(base, "w", trigger(*patterns)), "workflow_complete") == names


def test_one_wildcard_trigger_makes_the_whole_workflow_admit_any_name(base: WorkflowEntry) -> None:
    workflow = entry(base, "w", trigger(glob("ci")), trigger(glob("d*")))
    assert completed_workflow_names(workflow, "workflow_complete") is None


PATTERN = st.builds(
    glob,
    st.sampled_from(["ci", "deploy", "docs", "ci-*", "d*", "CI", "ci-nightly"]),
    negate=st.booleans(),
    flags=st.sampled_from(["", "i"]),
)


@given(
    st.lists(st.lists(st.lists(PATTERN, max_size=3), min_size=1, max_size=2), max_size=12),
    st.sampled_from(NAMES),
)
def test_candidates_hold_every_registration_whose_patterns_admit_the_name(
    base: WorkflowEntry, pattern_lists: list[list[list[PatternEntry]]], name: str
) -> None:
    registrations = [
        registration(number, entry(base, f"w{number}", *(trigger(*patterns) for patterns in triggers)))
        for number, triggers in enumerate(pattern_lists)
    ]
    index = RegistrationIndex.build(registrations)
    found = index.candidates("default", "workflow_complete", workflow=name)
    admitting = {
        r.id
        for r in registrations
        if any(CompiledPatterns(t.workflow).verdict(name)[0] for t in r.entry.triggers)  # type: ignore[attr-defined]
    }
    ids = [r.id for r in found]
    assert admitting <= set(ids)
    assert ids == sorted(set(ids))
    assert set(ids) <= {r.id for r in index.candidates("default", "workflow_complete")}


def test_a_completion_reaches_only_the_workflows_that_name_it(base: WorkflowEntry) -> None:
    named = registration(1, entry(base, "after-ci", trigger(glob("ci"))))
    other = registration(2, entry(base, "after-docs", trigger(glob("docs"))))
    wildcard = registration(3, entry(base, "after-any-c", trigger(glob("c*"))))
    index = RegistrationIndex.build([named, other, wildcard])
    view = EventView(
        id="ev",
        name="__workflow_complete",
        origin="system",
        org_id="default",
        payload={
            "run_id": "r",
            "workflow_name": "ci",
            "repo": "app",
            "routing_key": "local:app",
            "status": "success",
        },
        source_routing_key="local:app",
        source_repo="app",
    )
    decision = route(view, index)
    assert decision.outcome == "matched"
    assert [d.registration.id for d in decision.dispatch] == [named.id, wildcard.id]
