"""The shared scaler configuration on a node (docs/design/scaler.md §11): which configuration a node runs,
and that the shared one is validated exactly as a main `scalers.yaml`."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.scaler.bare_metal import BareMetalBackend
from conveyor.scaler.config import (
    SHARED_MAX_BYTES,
    Host,
    ScalerConfigError,
    SharedConfig,
    content_sha256,
    has_local_config,
    load_config,
    parse_shared,
)
from conveyor.scaler.event import EventBackend
from conveyor.scaler.startup import without_event_scalers

HOST = Host(os="linux", arch="x86_64", platform="linux")
REGISTRY = {"bare-metal": BareMetalBackend, "event": EventBackend}

SHARED_YAML = """\
version: 1
scalers:
  - {name: fleet, type: bare-metal, max_agents: 2, label_sets: [{labels: [fleet]}]}
"""
LOCAL_YAML = """\
version: 1
scalers:
  - {name: mine, type: bare-metal, max_agents: 1, label_sets: [{labels: [mine]}]}
"""


def shared(content: str = SHARED_YAML, version: int = 3) -> SharedConfig:
    return SharedConfig(version, content, content_sha256(content))


def load(
    home: Path,
    *,
    builtin: bool = False,
    directory: Path | None = None,
    main: Path | None = None,
    stored: SharedConfig | None = None,
):  # type: ignore[no-untyped-def]
    return load_config(
        home, main=main, directory=directory, builtin=builtin, host=HOST, registry=REGISTRY, shared=stored
    )


def test_a_node_without_a_local_file_runs_the_shared_configuration_and_names_its_version(
    tmp_path: Path,
) -> None:
    config = load(tmp_path, builtin=True, stored=shared())

    assert [e.name for e in config.entries] == ["fleet"]
    assert (config.origin, config.shared_version) == ("shared", 3)
    assert config.sources == ("<shared scaler config v3>",)


def test_the_local_file_wins_over_the_shared_configuration(tmp_path: Path) -> None:
    (tmp_path / "scalers.yaml").write_text(LOCAL_YAML)

    config = load(tmp_path, stored=shared())

    assert [e.name for e in config.entries] == ["mine"]
    assert (config.origin, config.shared_version) == ("local", None)
    assert has_local_config(tmp_path, None, None)


def test_a_yaml_file_in_the_config_directory_wins_too_and_an_empty_directory_does_not(tmp_path: Path) -> None:
    directory = tmp_path / "scalers.d"
    directory.mkdir()
    assert not has_local_config(tmp_path, None, directory)
    assert load(tmp_path, directory=directory, stored=shared()).origin == "shared"

    (directory / "a.yaml").write_text(
        "scalers:\n  - {name: dir, type: bare-metal, max_agents: 1, label_sets: [{labels: [dir]}]}\n"
    )

    assert has_local_config(tmp_path, None, directory)
    assert [e.name for e in load(tmp_path, directory=directory, stored=shared()).entries] == ["dir"]


def test_without_local_or_shared_configuration_the_built_in_scaler_or_none(tmp_path: Path) -> None:
    assert load(tmp_path, builtin=True).origin == "built-in"
    assert load(tmp_path).origin == "none"
    assert load(tmp_path).entries == ()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("version: 1\nscalers: [", "<shared scaler config v2>: not valid YAML"),
        ("version: 2\nscalers: []\n", "<shared scaler config v2>: version: required and must be 1"),
        (
            SHARED_YAML
            + "  - {name: twin, type: bare-metal, max_agents: 1, label_sets: [{labels: [fleet]}]}\n",
            "label set [fleet] is also served by scaler fleet",
        ),
        ("version: 1\nscalers:\n  - {name: x, type: kubernetes}\n", "type kubernetes is not supported"),
        ("version: 1\n" + "#" * SHARED_MAX_BYTES, f"more than the {SHARED_MAX_BYTES} allowed"),
        ("[" * 5000 + "]" * 5000, "not valid YAML: nested too deeply"),
        ("{1: 2, version: 1}", "<shared scaler config v2>: unknown key 1"),
    ],
)
def test_a_shared_configuration_is_refused_as_a_main_file_would_be(content: str, problem: str) -> None:
    with pytest.raises(ScalerConfigError) as refused:
        parse_shared(content, version=2, host=HOST, registry=REGISTRY)

    assert problem in str(refused.value)


def test_a_worker_leaves_out_the_shared_configurations_event_scalers() -> None:
    content = SHARED_YAML + (
        "  - {name: cloud, type: event, max_agents: 1, provisioning_targets: [github:acme/infra],\n"
        "     provisioning_label: provisioner, label_sets: [{labels: [cloud]}]}\n"
    )
    config = parse_shared(content, version=1, host=HOST, registry=REGISTRY)
    assert [e.name for e in config.entries] == ["fleet", "cloud"]

    assert [e.name for e in without_event_scalers(config).entries] == ["fleet"]
