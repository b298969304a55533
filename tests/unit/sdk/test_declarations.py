"""The SDK reports definition-time problems as coded errors located at the author's line."""

import re
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor import (
    AuthoringError,
    Input,
    Need,
    Retry,
    RunsOn,
    dispatch,
    event,
    job,
    pr,
    push,
    rule,
    schedule,
    step,
    workflow,
)
from conveyor.sdk.durations import duration_ms
from conveyor.sdk.matrix import expand_matrix, matrix_display, matrix_key


def _code(excinfo: pytest.ExceptionInfo[AuthoringError]) -> str:
    return excinfo.value.code


def test_error_is_located_at_the_calling_line_of_this_file():
    with pytest.raises(AuthoringError) as excinfo:
        schedule(cron="not a cron")
    assert excinfo.value.code == "E111"
    assert excinfo.value.file == __file__
    assert str(excinfo.value).startswith(f"{__file__}:")


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("1h30m", 5_400_000),
        ("20m", 1_200_000),
        ("2s", 2000),
        ("500ms", 500),
        (90, 90_000),
        (timedelta(minutes=1), 60_000),
    ],
)
def test_durations_convert_to_milliseconds(value, ms):
    assert duration_ms(value, what="t") == ms


@pytest.mark.parametrize("value", ["", "1d", "0s", -1, 8 * 24 * 3600, "1m2h", True])
def test_bad_durations_are_e113(value):
    with pytest.raises(AuthoringError) as excinfo:
        duration_ms(value, what="t")
    assert _code(excinfo) == "E113"


def test_section_2_matrix_gives_four_combinations_in_product_order():
    keys, combinations = expand_matrix(
        {"py": ["3.11", "3.12"], "os": ["linux", "mac"]},
        include=[{"py": "3.13", "os": "linux"}],
        exclude=[{"os": "mac", "py": "3.11"}],
    )
    assert keys == ("py", "os")
    assert combinations == [
        {"py": "3.11", "os": "linux"},
        {"py": "3.12", "os": "linux"},
        {"py": "3.12", "os": "mac"},
        {"py": "3.13", "os": "linux"},
    ]
    assert matrix_key(combinations[0]) == "py=3.11,os=linux"
    assert matrix_display("test", combinations[0]) == "test (3.11, linux)"


def test_list_matrix_is_one_dimension_named_value():
    assert expand_matrix(["a", "b"]) == (("value",), [{"value": "a"}, {"value": "b"}])


@pytest.mark.parametrize(
    "matrix", [{"x": list(range(30)), "y": list(range(10))}, {"x": []}, {"bad key": [1]}, {"x": [None]}]
)
def test_matrix_out_of_range_or_malformed_is_e109(matrix):
    with pytest.raises(AuthoringError) as excinfo:
        expand_matrix(matrix)
    assert _code(excinfo) == "E109"


def test_include_must_have_exactly_the_matrix_keys():
    with pytest.raises(AuthoringError) as excinfo:
        expand_matrix({"a": [1], "b": [2]}, include=[{"a": 3}])
    assert _code(excinfo) == "E109"


matrix_values = st.one_of(st.integers(-5, 5), st.sampled_from(["a", "b", "c"]), st.booleans())


@given(
    dimensions=st.dictionaries(
        st.sampled_from(["py", "os", "db", "arch"]),
        st.lists(matrix_values, min_size=1, max_size=4),
        min_size=1,
    ),
    drop=st.integers(0, 3),
)
def test_matrix_expansion_is_the_product_minus_exclusions(dimensions, drop):
    keys = list(dimensions)
    full = expand_matrix(dimensions)[1]
    total = 1
    for values in dimensions.values():
        total *= len(values)
    assert len(full) == total
    assert all(list(combination) == keys for combination in full)
    excluded = {keys[0]: dimensions[keys[0]][drop % len(dimensions[keys[0]])]}
    try:
        kept = expand_matrix(dimensions, exclude=[excluded])[1]
    except AuthoringError as error:
        assert error.code == "E109"  # everything excluded: zero combinations
        return
    assert all(
        type(c[keys[0]]) is not type(excluded[keys[0]]) or c[keys[0]] != excluded[keys[0]] for c in kept
    )
    assert all(c in full for c in kept)


def test_needs_when_maps_to_upstream_statuses():
    wf = workflow("w", on=push())
    upstream = wf.job("a", runs_on="linux", run=lambda ctx: None)
    assert Need(upstream).run_on == ("success",)
    assert Need(upstream, when="on-skip").run_on == ("success", "skipped")
    assert Need(upstream, when="on-failure").run_on == ("failed", "timed_out")
    assert Need("a", when="always").run_on == ("success", "failed", "cancelled", "skipped", "timed_out")


def test_function_as_job_has_one_step_named_like_the_function():
    wf = workflow("w", on=push())

    @wf.job(runs_on="conveyor:os:linux")
    def lint(ctx):
        return None

    assert lint.name == "lint"
    assert [s.name for s in lint.steps] == ["lint"]
    assert wf.jobs["lint"] is lint


def test_run_lambda_step_takes_the_job_name():
    wf = workflow("w", on=push())
    page = wf.job("page", runs_on="linux", run=lambda ctx: None)
    assert [s.name for s in page.steps] == ["page"]


def test_duplicate_job_step_and_hook_names_are_coded():
    wf = workflow("w", on=push())
    wf.job("a", runs_on="linux")
    with pytest.raises(AuthoringError) as duplicate_job:
        wf.job("a", runs_on="linux")
    assert _code(duplicate_job) == "E103"
    build = wf.job("b", runs_on="linux")

    @build.step
    def one(ctx):
        return None

    with pytest.raises(AuthoringError) as duplicate_step:
        build.step(step(lambda ctx: None, name="one"))
    assert _code(duplicate_step) == "E104"

    @build.on_failure
    def first(ctx):
        return None

    with pytest.raises(AuthoringError) as duplicate_hook:
        build.on_failure(lambda ctx: None)
    assert _code(duplicate_hook) == "E119"


@pytest.mark.parametrize("name", ["", "__hooks__", "has space", "x" * 65, "-lead"])
def test_invalid_names_are_e105(name):
    with pytest.raises(AuthoringError) as excinfo:
        workflow(name, on=push())
    assert _code(excinfo) == "E105"


def test_runs_on_is_required_and_non_empty():
    with pytest.raises(AuthoringError) as missing:
        job("a")
    assert _code(missing) == "E108"
    with pytest.raises(AuthoringError) as empty:
        RunsOn(labels=[])
    assert _code(empty) == "E108"


def test_runs_on_values_become_exact_glob_and_regex_matchers_lowercased():
    runs_on = RunsOn(labels=["Linux", "conveyor:host:*", re.compile("gpu-[0-9]+", re.I)], exclude=["canary"])
    assert [(m.kind, m.pattern, m.flags) for m in runs_on.labels] == [
        ("exact", "linux", ""),
        ("glob", "conveyor:host:*", ""),
        ("regex", "gpu-[0-9]+", "i"),
    ]


@pytest.mark.parametrize(
    "pattern",
    [re.compile("(a+)+"), re.compile("(x*)*y"), re.compile("a", re.MULTILINE), re.compile("a" * 300)],
)
def test_dangerous_or_unsupported_regexes_are_e110(pattern):
    with pytest.raises(AuthoringError) as excinfo:
        push(branches=[pattern])
    assert _code(excinfo) == "E110"


def test_paths_take_globs_only():
    with pytest.raises(AuthoringError) as excinfo:
        pr(paths=[re.compile("src/.*")])
    assert _code(excinfo) == "E110"


@pytest.mark.parametrize(
    ("cron", "zone"), [("0 3 * *", "UTC"), ("61 * * * *", "UTC"), ("0 3 * * *", "Mars/Base")]
)
def test_bad_cron_or_timezone_is_e111(cron, zone):
    with pytest.raises(AuthoringError) as excinfo:
        schedule(cron=cron, timezone=zone)
    assert _code(excinfo) == "E111"


@pytest.mark.parametrize("template", ["{event.nope}", "{event.branch!r}", "{x:>3}", "{job}", "{"])
def test_bad_workflow_templates_are_e112(template):
    with pytest.raises(AuthoringError) as excinfo:
        workflow("w", on=push(), concurrency=template)
    assert _code(excinfo) == "E112"


def test_job_templates_may_name_job_and_matrix_keys():
    wf = workflow("w", on=push())
    deploy = wf.job(
        "deploy",
        runs_on="linux",
        matrix={"region": ["eu", "us"]},
        environment="prod-{matrix.region}",
        concurrency_group="{workflow}-{job}-{event.payload.items[0].id}-{{literal}}",
    )
    assert deploy.environment == "prod-{matrix.region}"
    with pytest.raises(AuthoringError) as excinfo:
        wf.job("other", runs_on="linux", environment="prod-{matrix.region}")
    assert _code(excinfo) == "E112"


@pytest.mark.parametrize("name", ["PATH", "CONVEYOR_RUN_ID", "1BAD"])
def test_reserved_or_invalid_env_names_are_e115(name):
    with pytest.raises(AuthoringError) as excinfo:
        job("a", runs_on="linux", env={name: "x"})
    assert _code(excinfo) == "E115"


def test_unsupported_features_are_e120():
    with pytest.raises(AuthoringError) as excinfo:
        job("a", runs_on="linux", approvals=2)
    assert _code(excinfo) == "E120"
    assert "not supported" in excinfo.value.message


@pytest.mark.parametrize("option", ["cache", "caches"])
def test_cache_options_are_no_longer_a_refused_feature_but_stay_unknown(option):
    """docs/design/caches.md §5: caches are `ctx.cache` in a step, not a job option."""
    with pytest.raises(AuthoringError) as excinfo:
        job("a", runs_on="linux", **{option: ["~/.cache/pip"]})
    assert _code(excinfo) == "E120"
    assert f"{option!r} is not a known option" in excinfo.value.message


def test_input_specs_are_checked_e116():
    with pytest.raises(AuthoringError) as excinfo:
        Input(int, pattern="x")
    assert _code(excinfo) == "E116"
    with pytest.raises(AuthoringError) as default_excinfo:
        Input(str, choices=["a", "b"], default="c")
    assert _code(default_excinfo) == "E116"
    trigger = dispatch(inputs={"version": Input(str, required=True, pattern=r"\d+\.\d+")})
    assert trigger.inputs["version"].required


def test_push_with_tags_only_and_paths_is_e114():
    with pytest.raises(AuthoringError) as excinfo:
        push(tags=["v*"], paths=["src/**"])
    assert _code(excinfo) == "E114"


def test_event_trigger_conditions_and_reserved_names():
    trigger = event(
        "deploy.done", match={"env": "prod", "ok": True, "tag": re.compile(r"v\d+")}, not_={"x": [1, 2]}
    )
    assert {path: c.kind for path, c in trigger.match.items()} == {
        "env": "equals",
        "ok": "equals",
        "tag": "regex",
    }
    with pytest.raises(AuthoringError):
        event("__internal")


def test_retry_int_means_retries():
    made = step(lambda ctx: None, name="s", retry=2)
    assert made.retry is not None and made.retry.max_attempts == 3
    assert Retry(3, delay="2s").delay_ms == 2000


def test_rules_decorators_record_label_and_kind():
    wf = workflow("w", on=push(), rules=[rule("marker")])

    @wf.skip("docs only")
    def docs_only(ctx):
        return False

    assert [(r.label, r.kind) for r in wf.rules] == [("marker", "rule"), ("docs only", "skip")]


@pytest.mark.parametrize(
    ("declare", "typo", "meant"),
    [
        (lambda: job("a", runs_on="linux", matirx={"py": ["3.12"]}), "matirx", "matrix"),
        (lambda: job("a", runs_on="linux", neds=["b"]), "neds", "needs"),
        (lambda: workflow("w", on=push(), descripton="x"), "descripton", "description"),
        (lambda: step(lambda ctx: None, timout="1m"), "timout", "timeout"),
    ],
)
def test_an_unknown_option_suggests_the_nearest_known_one(declare, typo, meant):
    with pytest.raises(AuthoringError) as excinfo:
        declare()
    assert _code(excinfo) == "E120"
    assert f"{typo!r} is not a known option; did you mean {meant!r}?" in excinfo.value.message


def test_an_unknown_option_far_from_every_known_one_suggests_nothing():
    with pytest.raises(AuthoringError) as excinfo:
        job("a", runs_on="linux", zzzzzz=1)
    assert "did you mean" not in excinfo.value.message
