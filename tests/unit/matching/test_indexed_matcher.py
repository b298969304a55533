"""The indexed matcher decides and explains exactly as the reference matcher does.

The property test generates locks (several workflows, several triggers each, literal and magic globs,
regexes, negations, paths filters) and a sequence of events against the same lock, so the index's
per-signature decisions are reused across events the way the pipeline reuses them; the table tests pin
the cases the index treats specially.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.lockfile.models import Lock, PatternEntry, WorkflowEntry
from conveyor.matching import (
    Decision,
    Event,
    custom_event,
    dispatch_event,
    index_lock,
    lock_digest,
    match_workflows,
    match_workflows_reference,
    pr_event,
    ref_event,
)
from conveyor.matching.index import literal_head, literal_name, name_key
from conveyor.matching.patterns import pattern_matches

SHA, OLD, NULL = "a" * 40, "b" * 40, "0" * 40
SEGMENTS = ["main", "release", "v1.0", "svc1", "svc2", "docs", "a", "b", ".github", "x-y"]
MAGIC = ["*", "**", "v*", "{svc1,svc2}", "[ab]", "?"]


def entry(pattern: str, *, kind: str = "glob", negate: bool = False, flags: str = "") -> dict[str, Any]:
    return {"kind": kind, "pattern": pattern, "flags": flags, "negate": negate}


segment = st.sampled_from(SEGMENTS)
glob_pattern = st.lists(st.one_of(segment, st.sampled_from(MAGIC)), min_size=1, max_size=3).map("/".join)
regex_pattern = st.sampled_from([r"release/\d+", r"svc\d/.*", r"MAIN", r"main|docs/.*", r"v1\.0"])
pattern_entry = st.one_of(
    st.builds(
        entry,
        glob_pattern,
        negate=st.booleans(),
        flags=st.sampled_from(["", "", "", "i"]),
    ),
    st.builds(
        entry, regex_pattern, kind=st.just("regex"), negate=st.booleans(), flags=st.sampled_from(["", "i"])
    ),
)
pattern_list = st.lists(pattern_entry, max_size=4)
# Values wcmatch treats specially: doubled and trailing separators, dot segments, other case.
value = st.one_of(
    st.lists(segment, min_size=1, max_size=3).map("/".join),
    st.sampled_from(["main/", "release//v1.0", "MAIN", "./main", "svc1//x", "", "/main", "release/12"]),
)
files = st.one_of(st.none(), st.lists(value, max_size=4))

trigger = st.one_of(
    st.fixed_dictionaries({"type": st.just("push"), "branches": pattern_list, "paths": pattern_list}),
    st.fixed_dictionaries({"type": st.just("tag"), "patterns": pattern_list}),
    st.fixed_dictionaries(
        {
            "type": st.just("pr"),
            "events": st.lists(st.sampled_from(["opened", "synchronize"]), max_size=2),
            "target": pattern_list,
            "source": pattern_list,
            "paths": pattern_list,
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("dispatch"),
            "types": st.lists(st.sampled_from(["manual", "deploy"])),
            "inputs": st.just({}),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("event"),
            "name": st.sampled_from(["built", "deployed"]),
            "match": st.just({}),
            "not": st.just({}),
            "from_repos": st.none(),
        }
    ),
)


def workflow(name: str, triggers: list[dict[str, Any]]) -> WorkflowEntry:
    return WorkflowEntry.model_validate(
        {
            "name": name,
            "description": None,
            "source": {"file": f".conveyor/workflows/{name}.py", "qualname": name, "line": 1},
            "content_hash": "sha256:0",
            "hashed_files": [],
            "triggers": triggers,
            "rules": [],
            "concurrency": None,
            "timeout_ms": None,
            "hooks_runs_on": None,
            "hooks": {},
            "jobs": [],
        }
    )


locks = st.lists(st.lists(trigger, max_size=3), min_size=1, max_size=6).map(
    lambda workflows: Lock(
        schema_version=1, workflows=[workflow(f"w{i}", triggers) for i, triggers in enumerate(workflows)]
    )
)


def ref_update(ref: str, before: str, sha: str | None, changed: list[str] | None) -> Event:
    return ref_event(repo="acme/app", ref=ref, sha=sha, before=before, changed_files=changed)


events = st.one_of(
    st.builds(
        ref_update,
        value.map(lambda branch: f"refs/heads/{branch}"),
        st.sampled_from([OLD, OLD, NULL]),
        st.sampled_from([SHA, SHA, SHA, None]),
        files,
    ),
    st.builds(
        ref_update,
        value.map(lambda tag: f"refs/tags/{tag}"),
        st.just(OLD),
        st.sampled_from([SHA, None]),
        st.none(),
    ),
    st.builds(
        lambda action, base, head, changed: pr_event(
            repo="acme/app",
            action=action,
            pr_number=1,
            base_branch=base,
            head_branch=head,
            sha=SHA,
            changed_files=changed,
        ),
        st.sampled_from(["opened", "closed"]),
        value,
        value,
        files,
    ),
    st.builds(
        lambda kind, branch: dispatch_event(repo="acme/app", dispatch_type=kind, branch=branch),
        st.sampled_from(["manual", "deploy", "other"]),
        value,
    ),
    st.builds(
        lambda name, repo: custom_event(name=name, repo=repo),
        st.sampled_from(["built", "other"]),
        st.sampled_from(["acme/app", "acme/lib", ""]),
    ),
)


def assert_same(lock: Lock, event: Event, subscriber_repo: str | None = None) -> Decision:
    expected = match_workflows_reference(lock, event, subscriber_repo=subscriber_repo)
    actual = match_workflows(lock, event, subscriber_repo=subscriber_repo)
    assert actual == expected
    assert actual.as_dict() == expected.as_dict()
    return actual


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lock=locks,
    sequence=st.lists(events, min_size=1, max_size=8),
    subscriber_repo=st.sampled_from([None, "acme/app", "acme/lib"]),
)
def test_indexed_matcher_agrees_with_the_reference_on_generated_locks_and_events(
    lock: Lock, sequence: list[Event], subscriber_repo: str | None
) -> None:
    for event in sequence:
        assert_same(lock, event, subscriber_repo)


@settings(max_examples=200, deadline=None)
@given(pattern=glob_pattern, candidate=value)
def test_literal_name_keys_never_miss_a_value_the_glob_matches(pattern: str, candidate: str) -> None:
    # The branch/tag dict is only sound if every value a literal glob matches folds to the glob itself.
    parsed = PatternEntry.model_validate(entry(pattern))
    literal = literal_name(parsed)
    if literal is not None and pattern_matches(parsed, candidate):
        assert name_key(candidate) == literal


@settings(max_examples=200, deadline=None)
@given(pattern=glob_pattern, path=value)
def test_path_heads_never_miss_a_file_the_glob_matches(pattern: str, path: str) -> None:
    parsed = PatternEntry.model_validate(entry(pattern))
    head = literal_head(parsed)
    if head is not None and pattern_matches(parsed, path):
        assert path.split("/", 1)[0] == head


def push_lock(*triggers: dict[str, Any], extra: tuple[list[dict[str, Any]], ...] = ()) -> Lock:
    workflows = [workflow("ci", list(triggers))]
    workflows += [workflow(f"other{i}", list(more)) for i, more in enumerate(extra)]
    return Lock(schema_version=1, workflows=workflows)


def push(
    branches: list[dict[str, Any]] | None = None, paths: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"type": "push", "branches": branches or [], "paths": paths or []}


def to_branch(branch: str, changed: tuple[str, ...] | None = ("src/a.py",)) -> Event:
    return ref_update(f"refs/heads/{branch}", OLD, SHA, None if changed is None else list(changed))


TABLE = [
    (
        "a negated branch wins over the literal",
        [push([entry("main"), entry("main", negate=True)])],
        to_branch("main"),
        False,
    ),
    ("a literal branch matches with a trailing slash", [push([entry("main")])], to_branch("main/"), True),
    ("a literal branch is case-sensitive", [push([entry("main")])], to_branch("Main"), False),
    ("a glob branch is checked per event", [push([entry("release/*")])], to_branch("release/1"), True),
    (
        "a paths exclusion makes the workflow a candidate",
        [push(paths=[entry("src/**"), entry("src/**/*.md", negate=True)])],
        to_branch("main", ("src/a.md",)),
        False,
    ),
    ("a paths include under another head fails", [push(paths=[entry("docs/**")])], to_branch("main"), False),
    ("a magic paths head is checked per event", [push(paths=[entry("**/*.py")])], to_branch("main"), True),
    ("unknown changed files pass paths", [push(paths=[entry("docs/**")])], to_branch("main", None), True),
    ("no changed files fail paths", [push(paths=[entry("docs/**")])], to_branch("main", ()), False),
    (
        "the second push trigger matches",
        [push([entry("dev")]), push([entry("main")], [entry("src/**")])],
        to_branch("main"),
        True,
    ),
    (
        "a tag trigger ignores branch pushes",
        [{"type": "tag", "patterns": [entry("v*")]}],
        to_branch("main"),
        False,
    ),
    (
        "a tag push matches a tag trigger, not a push trigger",
        [push([entry("v1")]), {"type": "tag", "patterns": [entry("v1")]}],
        ref_update("refs/tags/v1", OLD, SHA, None),
        True,
    ),
    (
        "a deleted branch never matches",
        [push([entry("main")])],
        ref_update("refs/heads/main", OLD, None, None),
        False,
    ),
    (
        "dispatch matches its type",
        [push([entry("main")]), {"type": "dispatch", "types": ["deploy"], "inputs": {}}],
        dispatch_event(repo="acme/app", dispatch_type="deploy", branch="main"),
        True,
    ),
    (
        "a custom event matches by name",
        [{"type": "event", "name": "built", "match": {}, "not": {}, "from_repos": None}],
        custom_event(name="built", repo="acme/app"),
        True,
    ),
]


@pytest.mark.parametrize(
    ("triggers", "event", "matched"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_indexed_matcher_table(triggers: list[dict[str, Any]], event: Event, matched: bool) -> None:
    # A workflow without a push trigger rides along so every row also covers the type-mismatch path.
    lock = push_lock(*triggers, extra=([{"type": "dispatch", "types": [], "inputs": {}}], []))
    decision = assert_same(lock, event)
    assert decision.workflows[0].matched is matched
    assert decision.workflows[2].triggers == ()


def test_same_bytes_parsed_twice_share_one_index() -> None:
    raw = push_lock(push([entry("main")])).model_dump_json(by_alias=True).encode()
    first, second = (Lock.model_validate_json(raw) for _ in range(2))
    assert index_lock(first, lock_digest(raw)) is index_lock(second, lock_digest(raw))
    assert index_lock(first) is not index_lock(second)


def test_repeated_signature_reuses_decisions_but_candidates_are_fresh() -> None:
    lock = push_lock(
        push([entry("main")], [entry("svc1/**")]), extra=([push([entry("main")], [entry("svc2/**")])],)
    )
    one = assert_same(lock, to_branch("main", ("svc1/a",)))
    two = assert_same(lock, to_branch("main", ("svc2/a",)))
    assert one.matched == ["ci"]
    assert two.matched == ["other0"]
