"""The container and firecracker keys of `scalers.yaml` through the configuration loader
(docs/design/scaler.md §4)."""

from __future__ import annotations

import pytest
import yaml

from conveyor.scaler.config import Host, ScalerConfigError, parse_config
from conveyor.scaler.container import ContainerBackend
from conveyor.scaler.firecracker import FirecrackerBackend

REGISTRY = {"container": ContainerBackend, "firecracker": FirecrackerBackend}
HOST = Host(os="linux", arch="x86_64", platform="linux")

# The design note's example, less its bare-metal scaler.
EXAMPLE = """
version: 1
scalers:
  - name: docker
    type: container
    max_agents: 8
    runtime: auto
    max_concurrent_spawns: 4
    label_sets:
      - labels: [linux, docker, py312]
        image: ghcr.io/acme/conveyor-agent:py3.12
        image_pull_policy: always
  - name: vms
    type: firecracker
    max_agents: 10
    mandatory_labels: [isolated]
    firecracker_path: /usr/local/bin/firecracker
    kernel_path: /var/lib/conveyor/fc/vmlinux
    chroot_base_dir: /var/lib/conveyor/fc/vms
    network: {bridge: cvy-br0, cidr: 10.200.0.0/24, gateway: 10.200.0.1}
    label_sets:
      - labels: [linux, isolated]
        rootfs_path: /var/lib/conveyor/fc/agent-rootfs.ext4
        vcpu_count: 2
        mem_size_mib: 2048
"""


@pytest.fixture(autouse=True)
def engine_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine address where `runtime: auto` looks: validation only checks that one may answer."""
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")


def parse(text: str) -> list[str]:
    try:
        parse_config([("scalers.yaml", yaml.safe_load(text), True)], host=HOST, registry=REGISTRY)
    except ScalerConfigError as exc:
        return exc.problems
    return []


def test_the_design_notes_example_loads_with_its_type_specific_keys() -> None:
    config = parse_config([("scalers.yaml", yaml.safe_load(EXAMPLE), True)], host=HOST, registry=REGISTRY)
    docker, vms = config.entries
    assert docker.options == {"runtime": "auto"}
    assert docker.label_sets[0].options == {
        "image": "ghcr.io/acme/conveyor-agent:py3.12",
        "image_pull_policy": "always",
    }
    assert vms.options["network"] == {"bridge": "cvy-br0", "cidr": "10.200.0.0/24", "gateway": "10.200.0.1"}
    assert vms.label_sets[0].options["mem_size_mib"] == 2048
    assert "conveyor:os:linux" in vms.label_sets[0].all_labels


def test_backend_problems_name_the_file_the_scaler_and_the_field() -> None:
    broken = EXAMPLE.replace("        image: ghcr.io/acme/conveyor-agent:py3.12\n", "").replace(
        "gateway: 10.200.0.1", "gateway: 10.9.9.1"
    )
    assert parse(broken) == [
        "scalers.yaml: scalers[docker].label_sets[0].image: required for a container scaler",
        "scalers.yaml: scalers[vms].network.gateway: 10.9.9.1 is not inside 10.200.0.0/24",
    ]


def test_keys_of_another_backend_type_are_unknown() -> None:
    problems = parse(EXAMPLE.replace("    runtime: auto\n", "    runtime: auto\n    kernel_path: /k\n"))
    assert problems == ["scalers.yaml: scalers[docker]: unknown key kernel_path"]
