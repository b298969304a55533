"""The cache rules of docs/design/caches.md §1–§2: keys, the scope a run writes and reads, the choice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.model.caches import (
    MAX_KEY,
    NO_SCOPE,
    Candidate,
    choose_entry,
    key_problem,
    readable_scopes,
    scope_of,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MAIN = "refs/heads/main"


def entry(id: str, scope: str, key: str, minutes: int = 0) -> Candidate:
    return Candidate(id=id, scope=scope, key=key, created_at=T0 + timedelta(minutes=minutes))


def push(branch: str) -> dict[str, object]:
    return {"type": "push", "ref": f"refs/heads/{branch}", "branch": branch, "default_branch": "main"}


def pr(number: int, base: str) -> dict[str, object]:
    return {"type": "pr", "ref": f"refs/pull/{number}/head", "base_branch": base, "default_branch": "main"}


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("deps-abc", True),
        ("a" * MAX_KEY, True),
        ("a" * (MAX_KEY + 1), False),
        ("", False),
        ("with,comma", False),
        ("tab\there", False),
        ("é", False),
        (None, False),
        (3, False),
    ],
)
def test_key_syntax(key: object, ok: bool) -> None:
    assert (key_problem(key) is None) is ok


def test_scopes_of_a_feature_branch_are_its_own_then_the_default() -> None:
    assert scope_of(push("feat")) == "refs/heads/feat"
    assert readable_scopes(push("feat")) == ("refs/heads/feat", MAIN)


def test_the_default_branch_reads_only_itself() -> None:
    assert readable_scopes(push("main")) == (MAIN,)


def test_a_pull_request_reads_its_own_then_its_base_then_the_default() -> None:
    assert scope_of(pr(7, "release")) == "refs/pull/7/head"
    assert readable_scopes(pr(7, "release")) == ("refs/pull/7/head", "refs/heads/release", MAIN)
    assert readable_scopes(pr(7, "main")) == ("refs/pull/7/head", MAIN)


def test_a_base_branch_counts_only_for_a_pull_request() -> None:
    event = {**push("feat"), "base_branch": "other"}
    assert readable_scopes(event) == ("refs/heads/feat", MAIN)


def test_an_event_without_a_ref_writes_the_default_branch_or_no_scope() -> None:
    assert scope_of({"type": "schedule", "default_branch": "main"}) == MAIN
    assert scope_of({"type": "custom"}) == NO_SCOPE
    assert readable_scopes({"type": "custom"}) == (NO_SCOPE,)


def test_a_feature_branch_reads_the_default_but_never_a_sibling() -> None:
    stored = [entry("1", "refs/heads/sibling", "deps-1", 5), entry("2", MAIN, "deps-0", 0)]
    choice = choose_entry(stored, "deps-1", ["deps-"], readable_scopes(push("feat")))
    assert choice.kind == "partial"
    assert choice.entry is not None and choice.entry.id == "2"
    only_sibling = [entry("1", "refs/heads/sibling", "deps-1", 5)]
    assert choose_entry(only_sibling, "deps-1", ["deps-"], readable_scopes(push("feat"))).kind == "miss"


def test_a_pull_request_reads_its_base() -> None:
    stored = [entry("1", "refs/heads/release", "deps-1")]
    choice = choose_entry(stored, "deps-1", [], readable_scopes(pr(3, "release")))
    assert choice.kind == "exact" and choice.entry == stored[0]


def test_exact_beats_any_prefix_even_in_a_farther_scope() -> None:
    stored = [entry("1", "refs/heads/feat", "deps-old", 9), entry("2", MAIN, "deps-new", 0)]
    choice = choose_entry(stored, "deps-new", ["deps-"], ("refs/heads/feat", MAIN))
    assert choice.kind == "exact" and choice.entry is not None and choice.entry.id == "2"


def test_restore_keys_are_tried_in_order() -> None:
    stored = [entry("1", MAIN, "deps-linux-a", 9), entry("2", MAIN, "deps-mac-b", 0)]
    choice = choose_entry(stored, "deps-x", ["deps-mac-", "deps-"], (MAIN,))
    assert choice.kind == "partial" and choice.entry is not None and choice.entry.id == "2"


def test_within_a_scope_the_newest_wins_and_the_nearer_scope_before_it() -> None:
    stored = [
        entry("1", MAIN, "deps-a", 0),
        entry("2", MAIN, "deps-b", 10),
        entry("3", "refs/heads/feat", "deps-c", 5),
    ]
    choice = choose_entry(stored, "none", ["deps-"], ("refs/heads/feat", MAIN))
    assert choice.entry is not None and choice.entry.id == "3"
    choice = choose_entry(stored, "none", ["deps-"], (MAIN,))
    assert choice.entry is not None and choice.entry.id == "2"


def test_a_restore_key_equal_to_a_stored_key_is_partial() -> None:
    stored = [entry("1", MAIN, "deps")]
    assert choose_entry(stored, "other", ["deps"], (MAIN,)).kind == "partial"


def test_nothing_stored_is_a_miss() -> None:
    choice = choose_entry([], "k", ["k"], (MAIN,))
    assert choice.kind == "miss" and choice.entry is None


_scopes = st.sampled_from(["refs/heads/main", "refs/heads/a", "refs/heads/b", "refs/pull/1/head"])
_keys = st.sampled_from(["k", "k-1", "k-2", "k-1-x", "j-1", "j"])
_entries = st.lists(
    st.builds(
        entry,
        id=st.text("0123456789abcdef", min_size=4, max_size=4),
        scope=_scopes,
        key=_keys,
        minutes=st.integers(0, 5),
    ),
    max_size=12,
    unique_by=lambda c: c.id,
)


@given(
    stored=_entries,
    key=_keys,
    restore=st.lists(st.sampled_from(["k", "k-", "k-1", "j", "x"]), max_size=3),
    scopes=st.lists(_scopes, unique=True, min_size=1, max_size=3),
)
def test_the_choice_matches_a_plain_reading_of_the_rule(
    stored: list[Candidate], key: str, restore: list[str], scopes: list[str]
) -> None:
    """Against a second, deliberately naive statement of docs/design/caches.md §2: walk rules, then scopes, then
    entries newest first."""
    expected: tuple[str, Candidate] | None = None
    rules = [("exact", lambda c: c.key == key)] + [
        ("partial", lambda c, p=p: c.key.startswith(p)) for p in restore
    ]
    for kind, matches in rules:
        for scope in scopes:
            in_scope = sorted(
                (c for c in stored if c.scope == scope and matches(c)),
                key=lambda c: (c.created_at, c.id),
                reverse=True,
            )
            if in_scope:
                expected = (kind, in_scope[0])
                break
        if expected:
            break
    choice = choose_entry(stored, key, restore, scopes)
    if expected is None:
        assert choice.kind == "miss" and choice.entry is None
    else:
        assert (choice.kind, choice.entry) == expected
        assert choice.entry is not None and choice.entry.scope in scopes
