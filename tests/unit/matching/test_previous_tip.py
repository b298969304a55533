"""`previous_tip`: the `before` preview, run local and trigger-local take when none is given."""

from __future__ import annotations

import itertools

import pytest

from conveyor.matching import previous_tip, ref_event

A, B, C = "a" * 40, "b" * 40, "c" * 40


@pytest.mark.parametrize(
    ("ref_tip", "sha", "parent", "expected"),
    [
        (A, B, C, A),  # the ref has not moved yet: the push replaces its tip
        (B, B, C, C),  # the ref already points at the commit: what the commit replaced
        (B, B, None, None),  # a root commit: nothing was replaced
        (None, B, C, None),  # a ref that does not exist yet is created
        (A, None, C, None),  # no commit at all
    ],
)
def test_previous_tip_is_the_ref_tip_until_the_ref_moves_then_the_parent(
    ref_tip: str | None, sha: str | None, parent: str | None, expected: str | None
) -> None:
    assert previous_tip(ref_tip=ref_tip, sha=sha, parent=parent) == expected


def test_changed_files_are_unknown_exactly_when_there_is_no_previous_tip() -> None:
    for ref_tip, sha, parent in itertools.product((A, B, None), (B, None), (C, None)):
        before = previous_tip(ref_tip=ref_tip, sha=sha, parent=parent)
        event = ref_event(repo="r", ref="refs/heads/main", sha=sha or B, before=before, changed_files=["x"])
        assert (event.changed_files is None) == (before is None), (ref_tip, sha, parent)
