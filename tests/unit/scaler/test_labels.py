"""Which label set serves a job (docs/design/scaler.md §5): the dispatcher's label rule, mandatory labels,
smallest set wins."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.scaler.labels import Candidate, auto_labels, label_set_matches, normalise, pick_label_set

AUTO = ("conveyor:arch:x86_64", "conveyor:os:linux")


def runs_on(*labels: str, exclude: tuple[str, ...] = (), kind: str = "exact") -> dict[str, Any]:
    def matcher(text: str) -> dict[str, str]:
        if ":" in text and text.split(":", 1)[0] in ("glob", "regex", "exact"):
            matcher_kind, pattern = text.split(":", 1)
            return {"kind": matcher_kind, "pattern": pattern, "flags": ""}
        return {"kind": kind, "pattern": text, "flags": ""}

    return {"labels": [matcher(x) for x in labels], "exclude": [matcher(x) for x in exclude]}


def candidate(
    *labels: str, scaler: str = "s", index: int = 0, mandatory: tuple[str, ...] = (), retiring: bool = False
) -> Candidate:
    return Candidate(scaler, index, tuple(sorted({*labels, *AUTO})), mandatory, retiring)


# (job runs_on, label set, mandatory labels of its scaler, matches?)
MATCH_TABLE = [
    # every runs_on matcher must match a label of the set
    (runs_on("linux"), ("linux", "small"), (), True),
    (runs_on("linux", "small"), ("linux", "small"), (), True),
    (runs_on("linux", "big"), ("linux", "small"), (), False),
    (runs_on("gpu"), ("linux",), (), False),
    # automatic labels count
    (runs_on("conveyor:os:linux"), ("local",), (), True),
    (runs_on("conveyor:os:windows"), ("local",), (), False),
    (runs_on("conveyor:arch:x86_64", "local"), ("local",), (), True),
    # globs and regexes go through the same matcher
    (runs_on("glob:lin*"), ("linux",), (), True),
    (runs_on("glob:win*"), ("linux",), (), False),
    (runs_on("regex:^py3\\d+$"), ("py312",), (), True),
    (runs_on("regex:^py2"), ("py312",), (), False),
    # empty runs_on matches any untainted set, never a tainted one
    (runs_on(), ("linux",), (), True),
    (runs_on(), ("linux", "gpu"), ("gpu",), False),
    # mandatory labels must be asked for with an exact matcher
    (runs_on("linux"), ("linux", "gpu"), ("gpu",), False),
    (runs_on("linux", "gpu"), ("linux", "gpu"), ("gpu",), True),
    (runs_on("linux", "glob:gp*"), ("linux", "gpu"), ("gpu",), False),
    (runs_on("linux", "gpu"), ("linux", "gpu", "isolated"), ("gpu", "isolated"), False),
    (runs_on("linux", "gpu", "isolated"), ("linux", "gpu", "isolated"), ("gpu", "isolated"), True),
    # excludes
    (runs_on("linux", exclude=("small",)), ("linux", "small"), (), False),
    (runs_on("linux", exclude=("big",)), ("linux", "small"), (), True),
    (runs_on("linux", exclude=("glob:conveyor:os:*",)), ("linux",), (), False),
    (runs_on(exclude=("gpu",)), ("linux",), (), True),
    # a job naming one host never triggers a spawn
    (runs_on("linux", "conveyor:host:build1"), ("linux",), (), False),
    (runs_on("glob:conveyor:host:*"), ("linux",), (), False),
]


@pytest.mark.parametrize(("job", "labels", "mandatory", "expected"), MATCH_TABLE)
def test_label_set_matching_table(
    job: dict[str, Any], labels: tuple[str, ...], mandatory: tuple[str, ...], expected: bool
) -> None:
    assert label_set_matches(job, candidate(*labels, mandatory=mandatory)) is expected


def test_the_smallest_matching_label_set_wins() -> None:
    sets = [
        candidate("linux", "big", scaler="a"),
        candidate("linux", scaler="b"),
        candidate("linux", "x", "y"),
    ]
    chosen = pick_label_set(runs_on("linux"), sets)
    assert chosen is not None and chosen.scaler == "b"
    chosen = pick_label_set(runs_on("linux", "big"), sets)
    assert chosen is not None and chosen.scaler == "a"


def test_ties_go_to_configuration_order() -> None:
    sets = [candidate("linux", "a1", scaler="first"), candidate("linux", "b1", scaler="second")]
    chosen = pick_label_set(runs_on("linux"), sets)
    assert chosen is not None and chosen.scaler == "first"
    chosen = pick_label_set(runs_on("linux"), list(reversed(sets)))
    assert chosen is not None and chosen.scaler == "second"


def test_retiring_scalers_are_skipped() -> None:
    sets = [candidate("linux", scaler="old", retiring=True), candidate("linux", "big", scaler="new")]
    chosen = pick_label_set(runs_on("linux"), sets)
    assert chosen is not None and chosen.scaler == "new"
    assert pick_label_set(runs_on("linux"), sets[:1]) is None


def test_mandatory_scaler_is_only_picked_when_asked_for() -> None:
    gpu = candidate("linux", "gpu", scaler="gpu", mandatory=("gpu",))
    plain = candidate("linux", "big", scaler="plain")
    assert pick_label_set(runs_on("linux"), [gpu, plain]).scaler == "plain"  # type: ignore[union-attr]
    assert pick_label_set(runs_on("linux", "gpu"), [gpu, plain]).scaler == "gpu"  # type: ignore[union-attr]
    assert pick_label_set(runs_on("arm9"), [gpu, plain]) is None


def test_no_match_is_none() -> None:
    assert pick_label_set(runs_on("linux"), []) is None


@pytest.mark.parametrize(
    ("backend", "host_os", "expected"),
    [
        ("bare-metal", "macos", ("conveyor:arch:arm64", "conveyor:os:macos")),
        ("bare-metal", "windows", ("conveyor:arch:arm64", "conveyor:os:windows")),
        ("container", "macos", ("conveyor:arch:arm64", "conveyor:os:linux")),
        ("firecracker", "windows", ("conveyor:arch:arm64", "conveyor:os:linux")),
    ],
)
def test_automatic_labels_by_backend(backend: str, host_os: str, expected: tuple[str, ...]) -> None:
    assert auto_labels(backend, host_os, "arm64") == expected


def test_normalise_strips_lowercases_dedupes_and_sorts() -> None:
    assert normalise([" Linux", "linux", "", "  ", "Big"]) == ("big", "linux")
