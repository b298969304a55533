"""Property and example tests for filter patterns, label matchers, templates and dispatch inputs."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from wcmatch import glob

from conveyor.lockfile.models import InputEntry, LabelMatcherEntry, PatternEntry, RunsOnEntry
from conveyor.matching import (
    InvalidInputs,
    explain_labels,
    labels_satisfy,
    ref_event,
    render_template,
    validate_dispatch_inputs,
)
from conveyor.matching.patterns import GLOB_FLAGS, paths_verdict, pattern_list_verdict

segment = st.text(alphabet="abc.-_", min_size=1, max_size=4)
paths = st.lists(segment, min_size=1, max_size=4).map("/".join)
glob_part = st.sampled_from(["a", "b", "*", "**", "a*", "*.c", "{a,b}", "?", "[ab]"])
globs = st.lists(glob_part, min_size=1, max_size=4).map("/".join)


def _glob(pattern, negate=False):
    return PatternEntry(kind="glob", pattern=pattern, flags="", negate=negate)


@given(pattern=globs, value=paths)
def test_compiled_globs_agree_with_wcmatch_globmatch(pattern, value):
    ok, _ = pattern_list_verdict([_glob(pattern)], value)
    assert ok == glob.globmatch(value, pattern, flags=GLOB_FLAGS)


@given(value=paths, includes=st.lists(globs, max_size=3), excludes=st.lists(globs, max_size=3))
def test_pattern_list_semantics(value, includes, excludes):
    entries = [_glob(p) for p in includes] + [_glob(p, negate=True) for p in excludes]
    ok, _ = pattern_list_verdict(entries, value)
    excluded = any(glob.globmatch(value, p, flags=GLOB_FLAGS) for p in excludes)
    included = not includes or any(glob.globmatch(value, p, flags=GLOB_FLAGS) for p in includes)
    assert ok == (not excluded and included)


@given(value=st.text(alphabet="release/0123456789-rc", max_size=16))
def test_regex_filters_full_match(value):
    entry = PatternEntry(kind="regex", pattern=r"release/\d+", flags="", negate=False)
    assert pattern_list_verdict([entry], value)[0] == (re.fullmatch(r"release/\d+", value) is not None)


@given(
    files=st.lists(paths, max_size=6, unique=True),
    includes=st.lists(globs, max_size=2),
    excludes=st.lists(globs, max_size=2),
)
def test_paths_filter_semantics(files, includes, excludes):
    entries = [_glob(p) for p in includes] + [_glob(p, negate=True) for p in excludes]
    ok, _ = paths_verdict(entries, sorted(files))
    remaining = [f for f in files if not any(glob.globmatch(f, p, flags=GLOB_FLAGS) for p in excludes)]
    expected = bool(remaining) and (
        not includes or any(glob.globmatch(f, p, flags=GLOB_FLAGS) for f in remaining for p in includes)
    )
    assert ok == expected


def test_null_value_fails_a_non_empty_list_and_unknown_files_pass():
    assert pattern_list_verdict([_glob("*")], None)[0] is False
    assert paths_verdict([_glob("src/**")], None) == (True, "changed files unknown")


def test_globstar_spans_segments_but_star_does_not():
    assert pattern_list_verdict([_glob("release/**")], "release/1/x")[0]
    assert not pattern_list_verdict([_glob("release/**")], "release")[0]
    assert not pattern_list_verdict([_glob("release/*")], "release/1/x")[0]


def _runs_on(labels, exclude=()):
    def matcher(value):
        if isinstance(value, re.Pattern):
            return LabelMatcherEntry(kind="regex", pattern=value.pattern, flags="")
        kind = "glob" if set("*?[]{}") & set(value) else "exact"
        return LabelMatcherEntry(kind=kind, pattern=value, flags="")

    return RunsOnEntry(labels=[matcher(v) for v in labels], exclude=[matcher(v) for v in exclude])


@pytest.mark.parametrize(
    ("labels", "exclude", "agent", "ok"),
    [
        (["linux"], [], ["Linux", "docker"], True),
        (["linux", "docker"], [], ["linux"], False),
        (["conveyor:os:*"], [], ["conveyor:os:linux"], True),
        (["*"], [], ["conveyor:host:a:b"], True),
        ([re.compile(r"gpu-\d+")], [], ["gpu-12"], True),
        ([re.compile(r"gpu-\d+")], [], ["gpu-12x"], False),
        (["linux"], ["conveyor:host:canary-*"], ["linux", "conveyor:host:canary-1"], False),
        (["linux"], ["conveyor:host:canary-*"], ["linux", "conveyor:host:prod-1"], True),
    ],
)
def test_labels_satisfy(labels, exclude, agent, ok):
    runs_on = _runs_on(labels, exclude)
    assert labels_satisfy(runs_on, agent) is ok
    verdict = explain_labels(runs_on, agent)
    assert verdict.ok is ok
    assert bool(verdict.reasons) is not ok


def test_explain_labels_lists_every_reason():
    verdict = explain_labels(_runs_on(["linux", "gpu"], ["canary"]), ["canary"])
    assert verdict.reasons == (
        "label 'canary' is excluded by exact 'canary'",
        "no label matches exact 'linux'",
        "no label matches exact 'gpu'",
    )


def test_templates_render_event_payload_matrix_and_literal_braces():
    event = ref_event(
        repo="acme/app", ref="refs/heads/main", sha="a" * 40, before="b" * 40, payload={"items": [{"id": 3}]}
    )
    rendered = render_template(
        "{workflow}/{job}-{event.branch}-{matrix.py}-{event.payload.items[0].id}-{event.payload.items}-{event.tag}{{x}}",
        event=event,
        workflow="ci",
        job="test",
        matrix={"py": "3.12"},
    )
    assert rendered == 'ci/test-main-3.12-3-[{"id":3}]-{x}'
    assert len(render_template("{event.sha}" * 10, event=event, workflow="ci")) == 256


def _input(kind, **extra):
    values = {
        "required": False,
        "default": None,
        "choices": None,
        "min": None,
        "max": None,
        "pattern": None,
        "description": None,
    }
    values.update(extra)
    return InputEntry(type=kind, **values)


def test_dispatch_inputs_are_coerced_and_defaults_filled():
    specs = {
        "count": _input("integer", min=1, max=5),
        "dry": _input("boolean", default=False),
        "env": _input("choice", choices=["staging", "prod"], required=True),
        "version": _input("string", pattern=r"\d+\.\d+"),
    }
    assert validate_dispatch_inputs(specs, {"count": "3", "env": "prod", "version": "1.2"}) == {
        "count": 3,
        "dry": False,
        "env": "prod",
        "version": "1.2",
    }
    with pytest.raises(InvalidInputs) as excinfo:
        validate_dispatch_inputs(specs, {"count": "9", "version": "x", "nope": "1"})
    assert set(excinfo.value.problems) == {"count", "env", "version", "nope"}
