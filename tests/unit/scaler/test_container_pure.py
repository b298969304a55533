"""Pure parts of the container backend: engine lookup, the create body, listed containers, validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conveyor.scaler.backend import Limits
from conveyor.scaler.container import (
    ContainerBackend,
    container_agent_url,
    container_config,
    engine_candidates,
    label_filters,
    live_item,
    runtime_of,
)
from tests.support.scaler_backends import TOKEN, entry, spawn_request


@pytest.mark.parametrize(
    ("url", "network", "expected"),
    [
        ("ws://127.0.0.1:8470/ws", None, "ws://host.docker.internal:8470/ws"),
        ("ws://localhost:8470/ws", "bridge", "ws://host.docker.internal:8470/ws"),
        ("ws://[::1]:8470/ws", None, "ws://host.docker.internal:8470/ws"),
        ("ws://127.0.0.1:8470/ws", "host", "ws://127.0.0.1:8470/ws"),
        ("wss://ci.example.com/ws", None, "wss://ci.example.com/ws"),
        ("ws://10.0.0.5:8470/ws", None, "ws://10.0.0.5:8470/ws"),
    ],
)
def test_loopback_urls_are_rewritten_to_the_host_gateway_unless_on_the_host_network(
    url: str, network: str | None, expected: str
) -> None:
    assert container_agent_url(url, network) == expected


HOME = Path("/home/ci")
ENVIRON = {
    "DOCKER_HOST": "tcp://10.0.0.7:2375",
    "CONTAINER_HOST": "unix:///srv/podman.sock",
    "XDG_RUNTIME_DIR": "/run/user/1000",
}


@pytest.mark.parametrize(
    ("runtime", "environ", "expected"),
    [
        (
            "auto",
            ENVIRON,
            [
                "tcp://10.0.0.7:2375",
                "unix:///var/run/docker.sock",
                "unix:///run/docker.sock",
                "unix:///home/ci/.docker/run/docker.sock",
                "unix:///srv/podman.sock",
                "unix:///run/user/1000/podman/podman.sock",
                "unix:///run/podman/podman.sock",
            ],
        ),
        (
            "docker",
            {},
            [
                "unix:///var/run/docker.sock",
                "unix:///run/docker.sock",
                "unix:///home/ci/.docker/run/docker.sock",
            ],
        ),
        (
            "podman",
            {"XDG_RUNTIME_DIR": "/run/user/7"},
            ["unix:///run/user/7/podman/podman.sock", "unix:///run/podman/podman.sock"],
        ),
    ],
)
def test_engines_are_looked_for_in_the_runtimes_variables_then_its_sockets(
    runtime: str, environ: dict[str, str], expected: list[str]
) -> None:
    assert engine_candidates(runtime, None, environ, HOME) == expected


def test_an_explicit_engine_is_the_only_candidate() -> None:
    assert engine_candidates("auto", "unix:///x.sock", ENVIRON, HOME) == ["unix:///x.sock"]


def test_the_runtime_is_read_from_the_engines_version_components() -> None:
    assert runtime_of({"Components": [{"Name": "Engine"}, {"Name": "containerd"}]}) == "docker"
    assert runtime_of({"Components": [{"Name": "Podman Engine"}]}) == "podman"
    assert runtime_of({}) == "docker"


def test_the_create_body_carries_labels_env_limits_and_the_gateway_host() -> None:
    scaler = entry("docker", "container", {}, {"image": "agent:1", "command": ["conveyor", "agent"]})
    request = spawn_request(scaler, "a1", limits=Limits(cpus=0.5, mem_bytes=1024))

    config = container_config(
        request, node_id="n1", boot_id="b1", options={}, env={"CONVEYOR_AGENT_TOKEN": TOKEN, "A": "1"}
    )

    assert config == {
        "Image": "agent:1",
        "Cmd": ["conveyor", "agent"],
        "Env": ["A=1", f"CONVEYOR_AGENT_TOKEN={TOKEN}"],
        "Labels": {
            "conveyor.managed": "true",
            "conveyor.node": "n1",
            "conveyor.boot": "b1",
            "conveyor.scaler": "docker",
            "conveyor.agent-id": "a1",
            "conveyor.job-id": "job-1",
            "conveyor.run-id": "run-1",
        },
        "HostConfig": {
            "NanoCpus": 500_000_000,
            "Memory": 1024,
            "ExtraHosts": ["host.docker.internal:host-gateway"],
        },
    }


def test_a_warm_spawn_has_no_job_labels_and_options_become_host_config() -> None:
    scaler = entry("docker", "container", {}, {"image": "agent:1"})
    request = spawn_request(scaler, "a1", job_id=None)
    options = {"network": "ci-net", "extra_hosts": ["git.internal:10.0.0.9"], "volumes": ["/cache:/cache:ro"]}

    config = container_config(request, node_id="n1", boot_id="b1", options=options, env={})

    assert not any(label.startswith(("conveyor.job-id", "conveyor.run-id")) for label in config["Labels"])
    assert "Cmd" not in config, "no command: the image's own"
    assert config["HostConfig"] == {
        "ExtraHosts": ["host.docker.internal:host-gateway", "git.internal:10.0.0.9"],
        "Binds": ["/cache:/cache:ro"],
        "NetworkMode": "ci-net",
    }


def test_on_the_host_network_no_gateway_host_is_added() -> None:
    scaler = entry("docker", "container", {}, {"image": "agent:1"})
    config = container_config(
        spawn_request(scaler, "a1"), node_id="n", boot_id="b", options={"network": "host"}, env={}
    )
    assert config["HostConfig"] == {"NetworkMode": "host"}


def test_a_listed_container_is_a_live_item_named_by_its_agent_id_else_its_container_id() -> None:
    labels = {
        "conveyor.managed": "true",
        "conveyor.agent-id": "a1",
        "conveyor.node": "n1",
        "conveyor.boot": "b1",
    }
    item = live_item(
        {"Id": "abc123", "Labels": {**labels, "conveyor.scaler": "docker"}, "Created": 1740830400}
    )
    assert (item.vm_id, item.agent_id, item.node_marker, item.boot_marker, item.scaler) == (
        "a1",
        "a1",
        "n1",
        "b1",
        "docker",
    )
    assert (item.backend_ref, item.started_at, item.kind) == ("abc123", 1740830400.0, "container")
    bare = live_item({"Id": "f00", "Labels": {"conveyor.managed": "true"}})
    assert (bare.vm_id, bare.agent_id, bare.started_at) == ("f00", None, None)


def test_label_filters_are_the_engines_filters_query_value() -> None:
    assert json.loads(label_filters(["a=1", "b=2"])) == {"label": ["a=1", "b=2"]}


def test_validation_names_each_bad_field() -> None:
    scaler = entry(
        "docker",
        "container",
        {"runtime": "lxc", "extra_hosts": ["no-colon"], "network": "", "stop_timeout_s": -1},
        {"image_pull_policy": "sometimes", "command": "conveyor agent"},
    )
    assert ContainerBackend.validate_entry(scaler) == [
        "runtime: must be auto, docker or podman (got 'lxc')",
        "extra_hosts: 'no-colon' must read NAME:IP",
        "network: must be a network name",
        "stop_timeout_s: must be a number of seconds ≥ 0",
        "label_sets[0].image: required for a container scaler",
        "label_sets[0].image_pull_policy: must be always, if-not-present or never (got 'sometimes')",
        "label_sets[0].command: must be a list of strings",
    ]
    good = entry("docker", "container", {"engine": "unix:///run/docker.sock"}, {"image": "agent:1"})
    assert ContainerBackend.validate_entry(good) == []
    bad_engine = entry("docker", "container", {"engine": "/run/docker.sock"}, {"image": "agent:1"})
    assert ContainerBackend.validate_entry(bad_engine) == [
        "engine: must be a unix://, tcp:// or http(s):// address (got '/run/docker.sock')"
    ]


def test_validation_reports_that_no_engine_socket_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("DOCKER_HOST", "CONTAINER_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    scaler = entry("docker", "container", {"runtime": "podman"}, {"image": "agent:1"})
    assert ContainerBackend.validate_entry(scaler) == [
        "runtime: no container engine found (a Docker or Podman API socket); set engine: unix:///path/to/docker.sock"
    ]
    monkeypatch.setenv("CONTAINER_HOST", "tcp://10.0.0.7:8888")  # a TCP engine is only checked when used
    assert ContainerBackend.validate_entry(scaler) == []
