"""Pure parts of the container backend: the agent URL seen from a container and `ps` output of both CLIs."""

from __future__ import annotations

import json

import pytest

from conveyor.scaler.container import (
    CliResult,
    container_agent_url,
    is_no_such_container,
    live_item,
    parse_ps,
    run_arguments,
)
from tests.support.scaler_backends import entry, spawn_request


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


def test_docker_ps_json_lines_are_parsed_with_string_labels() -> None:
    line = {
        "ID": "abc123def456",
        "Names": "cvy-a1",
        "Labels": "conveyor.managed=true,conveyor.agent-id=a1,conveyor.node=n1,conveyor.boot=b1",
        "State": "running",
        "CreatedAt": "2025-03-01 12:00:00 +0000 UTC",
    }
    (entry,) = parse_ps(json.dumps(line) + "\n")
    item = live_item(entry)
    assert (item.vm_id, item.agent_id, item.node_marker, item.boot_marker) == ("a1", "a1", "n1", "b1")
    assert item.backend_ref == "abc123def456" and item.started_at == 1740830400.0


def test_podman_ps_json_array_is_parsed_with_mapping_labels() -> None:
    output = json.dumps(
        [
            {
                "Id": "f00",
                "Names": ["cvy-x"],
                "Labels": {"conveyor.managed": "true"},
                "State": "exited",
                "Created": 17,
            }
        ]
    )
    (entry,) = parse_ps(output)
    assert (entry.container_id, entry.name, entry.state, entry.created) == ("f00", "cvy-x", "exited", 17.0)
    assert live_item(entry).vm_id == "f00", "a container without an agent-id label is named by its id"


def test_empty_ps_output_is_no_containers() -> None:
    assert parse_ps("\n") == []


def test_no_such_container_is_recognised_from_either_cli() -> None:
    assert is_no_such_container(CliResult(1, "", "Error response from daemon: No such container: x"))
    assert is_no_such_container(CliResult(125, "", "Error: no such container x"))
    assert not is_no_such_container(CliResult(1, "", "permission denied"))


def test_a_warm_spawn_has_no_job_labels_and_options_become_run_flags() -> None:
    scaler = entry("docker", "container", {}, {"image": "agent:1", "command": ["conveyor", "agent"]})
    request = spawn_request(scaler, "a1", job_id=None)
    options = {"network": "ci-net", "extra_hosts": ["git.internal:10.0.0.9"], "volumes": ["/cache:/cache:ro"]}

    args = run_arguments(request, node_id="n1", boot_id="b1", options=options, env_names=["X"])

    labels = [args[i + 1] for i, arg in enumerate(args) if arg == "--label"]
    assert not any(label.startswith(("conveyor.job-id", "conveyor.run-id")) for label in labels)
    assert args[args.index("-e") + 1] == "X" and "--cpus" not in args and "--memory" not in args
    hosts = [args[i + 1] for i, arg in enumerate(args) if arg == "--add-host"]
    assert hosts == ["host.docker.internal:host-gateway", "git.internal:10.0.0.9"]
    assert args[args.index("-v") + 1] == "/cache:/cache:ro" and args[args.index("--network") + 1] == "ci-net"
    assert args[-3:] == ["agent:1", "conveyor", "agent"]


def test_on_the_host_network_no_gateway_host_is_added() -> None:
    scaler = entry("docker", "container", {}, {"image": "agent:1"})
    args = run_arguments(
        spawn_request(scaler, "a1"), node_id="n", boot_id="b", options={"network": "host"}, env_names=[]
    )
    assert "--add-host" not in args and args[args.index("--network") + 1] == "host"
