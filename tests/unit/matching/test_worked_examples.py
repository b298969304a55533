"""Worked examples of docs/design/authoring.md §5, one row per sentence of the semantics.

Each row: a trigger (as SDK code), an event, whether the workflow matches, and the (filter, ok) checks of
the trigger — the same things the decision trace shows a user.
"""

import re

import pytest

from conveyor import event, generic_webhook, job_complete, pr, push, schedule, tag, workflow_complete
from conveyor.lockfile.compiler import trigger_entries
from conveyor.lockfile.models import (
    Lock,
    PushTriggerEntry,
    SourceRef,
    WorkflowEntry,
    WorkflowsFailedBatchTriggerEntry,
)
from conveyor.matching import (
    Event,
    completion_event,
    custom_event,
    generic_webhook_event,
    match_workflows,
    pr_event,
    ref_event,
)
from conveyor.sdk.triggers import workflows_failed_batch

SHA, OLD = "a" * 40, "b" * 40


def lock_of(*triggers, name="ci"):
    entries = [entry for trigger in triggers for entry in trigger_entries(trigger)]
    workflow = WorkflowEntry(
        name=name,
        description=None,
        source=SourceRef(file=".conveyor/workflows/ci.py", qualname=name, line=1),
        content_hash="sha256:0",
        hashed_files=[],
        triggers=entries,
        rules=[],
        concurrency=None,
        timeout_ms=None,
        hooks_runs_on=None,
        hooks={},
        jobs=[],
    )
    return Lock(schema_version=1, workflows=[workflow])


def push_to(branch, files=("src/a.py",), before=OLD):
    return ref_event(repo="acme/app", ref=f"refs/heads/{branch}", sha=SHA, before=before, changed_files=files)


def tag_push(name, deleted=False):
    return ref_event(repo="acme/app", ref=f"refs/tags/{name}", sha=None if deleted else SHA, before=OLD)


def pull_request(action="opened", base="main", head="feature/x", files=("src/a.py",)):
    return pr_event(
        repo="acme/app",
        action=action,
        pr_number=7,
        base_branch=base,
        head_branch=head,
        sha=SHA,
        changed_files=files,
    )


def checks_of(decision, index):
    trigger = decision.workflows[0].triggers[index]
    return [(check.filter, check.ok) for check in trigger.checks]


BRANCH_OR = [pr(target="main"), push(branches=["main", "release/**", "!release/old/**"])]

EXAMPLES = [
    # docs/design/authoring.md §5 rule 1: any trigger matches (OR); matched_trigger is the lowest matching
    # index.
    (
        "push to release/1/x matches the push trigger",
        BRANCH_OR,
        push_to("release/1/x"),
        True,
        1,
        [("branches", True)],
    ),
    (
        "an exclusion wins over an include",
        BRANCH_OR,
        push_to("release/old/2"),
        False,
        1,
        [("branches", False)],
    ),
    ("a branch no include matches fails", BRANCH_OR, push_to("feature/x"), False, 1, [("branches", False)]),
    (
        "a failed type check is the only check listed",
        [pr(target="main")],
        push_to("main"),
        False,
        0,
        [("type", False)],
    ),
    # docs/design/authoring.md §2.6: regex full match.
    (
        "regex matches the whole branch",
        [push(branches=[re.compile(r"release/\d+")])],
        push_to("release/12"),
        True,
        0,
        [("branches", True)],
    ),
    (
        "regex does not match a prefix",
        [push(branches=[re.compile(r"release/\d+")])],
        push_to("prerelease/12"),
        False,
        0,
        [("branches", False)],
    ),
    (
        "regex does not match a suffix",
        [push(branches=[re.compile(r"release/\d+")])],
        push_to("release/12-rc"),
        False,
        0,
        [("branches", False)],
    ),
    # docs/design/authoring.md §5 rule 5: paths.
    (
        "all changed files excluded",
        [push(paths=["src/**", "!src/**/*.md"])],
        push_to("main", ["src/a.md"]),
        False,
        0,
        [("paths", False)],
    ),
    (
        "a remaining file matches an include",
        [push(paths=["src/**", "!src/**/*.md"])],
        push_to("main", ["src/a.py"]),
        True,
        0,
        [("paths", True)],
    ),
    (
        "unknown changed files pass",
        [push(paths=["src/**"])],
        push_to("new", None, before=None),
        True,
        0,
        [("paths", True)],
    ),
    ("no changed files fails", [push(paths=["src/**"])], push_to("main", []), False, 0, [("paths", False)]),
    (
        "only exclusions: a non-excluded file passes",
        [push(paths=["!docs/**"])],
        push_to("main", ["x.py"]),
        True,
        0,
        [("paths", True)],
    ),
    # docs/design/authoring.md §5 rules 2 and 4: tags, deletions, pr actions.
    (
        "push(tags=) ignores a branch push",
        [push(tags=["v*"])],
        push_to("main"),
        False,
        None,
        [("type", False)],
    ),
    ("push(tags=) matches a tag", [push(tags=["v*"])], tag_push("v1.0"), True, 0, [("patterns", True)]),
    (
        "a tag deletion matches nothing",
        [tag(patterns=["v*"])],
        tag_push("v1.0", deleted=True),
        False,
        0,
        [("action", False)],
    ),
    ("pr() matches opened", [pr()], pull_request("opened"), True, 0, [("events", True)]),
    ("pr() does not match closed", [pr()], pull_request("closed"), False, 0, [("events", False)]),
    (
        "a null head_branch fails a source filter",
        [pr(source="feat/*")],
        pull_request(head=None),
        False,
        0,
        [("events", True), ("source", False)],
    ),
    (
        "pr paths see the PR's files",
        [pr(target="main", paths=["src/**"])],
        pull_request(files=["docs/a.md"]),
        False,
        0,
        [("events", True), ("target", True), ("paths", False)],
    ),
    # docs/design/authoring.md §5 rule 4: events, completions, webhooks.
    (
        "custom event name and match",
        [event("deploy.done", match={"env": "prod"})],
        custom_event(name="deploy.done", repo="acme/app", payload={"env": "prod"}),
        True,
        0,
        [("name", True), ("match", True), ("from_repos", True)],
    ),
    (
        "JSON equality: True is not 1",
        [event("e", match={"flag": True})],
        custom_event(name="e", repo="acme/app", payload={"flag": 1}),
        False,
        0,
        [("name", True), ("match", False), ("from_repos", True)],
    ),
    (
        "not_: a holding condition fails",
        [event("e", not_={"images[0].tag": re.compile("dev-.*")})],
        custom_event(name="e", repo="acme/app", payload={"images": [{"tag": "dev-1"}]}),
        False,
        0,
        [("name", True), ("not", False), ("from_repos", True)],
    ),
    (
        "another repo's event needs from_repos",
        [event("e")],
        custom_event(name="e", repo="other/repo"),
        False,
        0,
        [("name", True), ("from_repos", False)],
    ),
    (
        "from_repos patterns admit other repos",
        [event("e", from_repos=["acme/*"])],
        custom_event(name="e", repo="acme/lib"),
        True,
        0,
        [("name", True), ("from_repos", True)],
    ),
    (
        "workflow_complete status and workflow",
        [workflow_complete(workflow=["build*"], status=["failed"])],
        completion_event(
            kind="workflow_complete",
            payload={"status": "failed", "workflow_name": "build-x", "repo": "acme/app"},
        ),
        True,
        0,
        [("status", True), ("workflow", True), ("from_repos", True)],
    ),
    (
        "job_complete job pattern",
        [job_complete(job=["deploy"], status="success")],
        completion_event(
            kind="job_complete",
            payload={"status": "success", "workflow_name": "ci", "job_name": "test", "repo": "acme/app"},
        ),
        False,
        0,
        [("status", True), ("job", False), ("from_repos", True)],
    ),
    (
        "generic webhook source and events",
        [generic_webhook("sentry", events=["issue.*"])],
        generic_webhook_event(source="sentry", event_name="issue.created", body={}),
        True,
        0,
        [("source", True), ("events", True)],
    ),
]


@pytest.mark.parametrize(
    ("triggers", "event_", "matched", "index", "checks"),
    [example[1:] for example in EXAMPLES],
    ids=[example[0] for example in EXAMPLES],
)
def test_worked_example(triggers, event_, matched, index, checks):
    decision = match_workflows(lock_of(*triggers), event_, subscriber_repo="acme/app")
    assert decision.workflows[0].matched is matched
    inspected = index if index is not None else 0
    assert checks_of(decision, inspected) == checks
    if matched:
        assert decision.workflows[0].matched_trigger == index
        assert decision.matched == ["ci"]


def test_unknown_changed_files_say_so_in_the_trace():
    decision = match_workflows(lock_of(pr(paths=["src/**"])), pull_request(files=None))
    (check,) = [c for c in decision.workflows[0].triggers[0].checks if c.filter == "paths"]
    assert check.ok and check.detail == "changed files unknown"


def test_all_excluded_detail_counts_files():
    decision = match_workflows(lock_of(push(paths=["src/**", "!src/**/*.md"])), push_to("main", ["src/a.md"]))
    assert decision.workflows[0].triggers[0].checks[0].detail == "all 1 changed files excluded"


def test_a_workflow_without_triggers_never_matches():
    decision = match_workflows(lock_of(), push_to("main"))
    assert decision.workflows[0].matched is False
    assert decision.workflows[0].triggers == ()


def test_schedule_matches_only_its_own_workflow_and_cron():
    lock = lock_of(schedule(cron="0 3 * * *", timezone="Europe/Paris"))
    fire = Event(
        type="schedule",
        repo="acme/app",
        payload={"workflow_name": "ci", "cron": "0 3 * * *", "timezone": "Europe/Paris"},
    )
    assert match_workflows(lock, fire).matched == ["ci"]
    other = fire.model_copy(update={"payload": {**fire.payload, "workflow_name": "nightly"}})
    assert checks_of(match_workflows(lock, other), 0) == [("workflow", False), ("cron", True)]


def test_failed_completion_is_buffered_by_a_batch_trigger_not_matched():
    lock = lock_of(workflows_failed_batch(window="5m", workflow=["ci*"]))
    failed = completion_event(
        kind="workflow_complete", payload={"status": "failed", "workflow_name": "ci-x", "repo": "acme/app"}
    )
    decision = match_workflows(lock, failed)
    assert decision.matched == []
    assert decision.workflows[0].buffered
    batch = Event(type="workflows_failed_batch", repo="acme/app", payload={"total": 1, "runs": []})
    assert match_workflows(lock, batch).matched == ["ci"]
    assert isinstance(lock.workflows[0].triggers[0], WorkflowsFailedBatchTriggerEntry)


def test_trace_document_has_the_documented_shape():
    decision = match_workflows(lock_of(*BRANCH_OR), push_to("main"))
    document = decision.as_dict()
    assert document["lock"] == {"status": "ok", "schema_version": 1}
    assert document["event"]["type"] == "push"
    assert document["workflows"][0]["matched_trigger"] == 1
    assert document["workflows"][0]["triggers"][1]["checks"][0] == {
        "filter": "branches",
        "ok": True,
        "detail": "'main' matches glob 'main'",
    }
    assert isinstance(lock_of(push()).workflows[0].triggers[0], PushTriggerEntry)
