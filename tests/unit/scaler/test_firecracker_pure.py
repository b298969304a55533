"""Pure parts of the firecracker backend: TAP names, MACs, addresses, boot args, the API plan, sweeps, config."""

from __future__ import annotations

import re

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.scaler.firecracker import (
    FirecrackerBackend,
    VmPlan,
    boot_args,
    configuration_calls,
    guest_agent_url,
    guest_mac,
    sweepable,
)
from conveyor.scaler.firecracker_host import fault_message, parse_tuntap_names, stale_taps, tap_name
from conveyor.scaler.ip_allocations import pick_ip
from tests.support.scaler_backends import TOKEN, entry, spawn_request

VM = "0190f3a2-0000-7000-8000-0000000fc001"


def test_a_tap_name_is_cvy_plus_ten_hex_of_the_vm_ids_sha256() -> None:
    # sha256("0190f3a2-…fc001") is fixed: the same VM always maps to the same TAP.
    assert tap_name(VM) == tap_name(VM)
    assert re.fullmatch(r"cvy-[0-9a-f]{10}", tap_name(VM))
    assert tap_name(VM) != tap_name(VM[:-1] + "2")


@given(st.text(min_size=1, max_size=200))
def test_every_tap_name_fits_ifnamsiz(vm_id: str) -> None:
    name = tap_name(vm_id)
    assert len(name) == 14 and len(name) <= 15 and name.startswith("cvy-")


def test_the_guest_mac_is_stable_locally_administered_and_unicast() -> None:
    mac = guest_mac(VM)
    assert mac == guest_mac(VM) and re.fullmatch(r"06(:[0-9a-f]{2}){5}", mac)
    first = int(mac[:2], 16)
    assert first & 0b10 and not first & 0b1


def test_addresses_skip_the_gateway_and_the_taken_and_run_out() -> None:
    assert pick_ip("10.200.0.0/24", "10.200.0.1", []) == "10.200.0.2"
    assert pick_ip("10.200.0.0/24", "10.200.0.1", ["10.200.0.2", "10.200.0.4"]) == "10.200.0.3"
    assert pick_ip("10.0.0.0/30", "10.0.0.1", ["10.0.0.2"]) is None
    assert pick_ip("10.0.0.0/30", "10.0.0.1", ["not-an-ip"]) == "10.0.0.2"


def test_boot_args_carry_the_static_address() -> None:
    assert boot_args("10.200.0.7", "10.200.0.1", "10.200.0.0/24").endswith(
        "ip=10.200.0.7::10.200.0.1:255.255.255.0::eth0:off"
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ws://127.0.0.1:8470/ws", "ws://10.200.0.1:8470/ws"),
        ("ws://localhost/ws", "ws://10.200.0.1/ws"),
        ("wss://ci.example.com/ws", "wss://ci.example.com/ws"),
    ],
)
def test_the_guest_dials_loopback_urls_at_the_gateway(url: str, expected: str) -> None:
    assert guest_agent_url(url, "10.200.0.1") == expected


def test_the_api_plan_configures_then_starts_and_keeps_the_token_in_mmds_only() -> None:
    scaler = entry("vms", "firecracker", {}, {"rootfs_path": "/r.ext4"})
    plan = VmPlan(
        VM, "/k", "/vms/x/rootfs.ext4", tap_name(VM), "10.200.0.2", "10.200.0.1", "10.200.0.0/24", 2, 512
    )

    calls = configuration_calls(plan, spawn_request(scaler, VM))

    assert [path for path, _ in calls] == [
        "/machine-config",
        "/boot-source",
        "/drives/rootfs",
        "/network-interfaces/eth0",
        "/mmds/config",
        "/mmds",
        "/actions",
    ]
    tokens = [path for path, body in calls if TOKEN in str(body)]
    assert tokens == ["/mmds"]
    assert calls[-1] == ("/actions", {"action_type": "InstanceStart"})


def test_stray_taps_are_our_shaped_taps_of_no_kept_vm_and_never_the_bridge() -> None:
    kept, gone = "vm-live", "vm-gone"
    taps = [tap_name(kept), tap_name(gone), "cvy-br0", "cvy-0000000000", "eth0", "docker0"]
    assert stale_taps(taps, [kept]) == sorted([tap_name(gone), "cvy-0000000000"])


def test_tuntap_output_gives_device_names() -> None:
    output = "cvy-0a1b2c3d4e: tap persist user 1000\ntap0: tap vnet_hdr persist\n"
    assert parse_tuntap_names(output) == ["cvy-0a1b2c3d4e", "tap0"]


def test_a_fault_message_is_taken_from_the_json_body() -> None:
    assert fault_message(httpx.Response(400, json={"fault_message": "bad drive"})) == "bad drive"
    assert fault_message(httpx.Response(500, text="boom")) == "boom"
    assert fault_message(httpx.Response(502)) == "HTTP 502"


GOOD = {
    "firecracker_path": "/usr/local/bin/firecracker",
    "kernel_path": "/var/lib/conveyor/fc/vmlinux",
    "chroot_base_dir": "/var/lib/conveyor/fc/vms",
    "network": {"bridge": "cvy-br0", "cidr": "10.200.0.0/24", "gateway": "10.200.0.1"},
}


def test_the_design_notes_example_is_valid() -> None:
    scaler = entry(
        "vms", "firecracker", GOOD, {"rootfs_path": "/r.ext4", "vcpu_count": 2, "mem_size_mib": 2048}
    )
    assert FirecrackerBackend.validate_entry(scaler) == []


def test_validation_names_each_bad_field() -> None:
    options = {
        "firecracker_path": "firecracker",
        "chroot_base_dir": "/" + "d" * 80,
        "network": {
            "bridge": "a-very-long-bridge-name",
            "cidr": "10.200.0.0/24",
            "gateway": "10.9.0.1",
            "mtu": 1,
        },
        "require_sudo": "yes",
    }
    problems = FirecrackerBackend.validate_entry(
        entry("vms", "firecracker", options, {"vcpu_count": 0, "mem_size_mib": "lots"})
    )
    assert problems == [
        "firecracker_path: required, an absolute path",
        "kernel_path: required, an absolute path",
        "chroot_base_dir: too long for the VMs' API sockets (127 > 107 bytes); choose a shorter directory",
        "network: unknown key mtu",
        "network.bridge: required, an interface name of at most 15 characters",
        "network.gateway: 10.9.0.1 is not inside 10.200.0.0/24",
        "require_sudo: must be true or false",
        "label_sets[0].rootfs_path: required, an absolute path",
        "label_sets[0].vcpu_count: must be a whole number from 1 to 32",
        "label_sets[0].mem_size_mib: must be a whole number from 128 to 1048576",
    ]


def test_a_missing_network_is_reported() -> None:
    options = {key: value for key, value in GOOD.items() if key != "network"}
    problems = FirecrackerBackend.validate_entry(entry("vms", "firecracker", options, {"rootfs_path": "/r"}))
    assert problems == ["network: required, {bridge, cidr, gateway}"]


@pytest.mark.parametrize(
    ("age_s", "has_pid_file", "expected"),
    [(0, True, True), (5, False, False), (599, False, False), (600, False, True), (86_400, False, True)],
)
def test_a_directory_still_setting_up_is_not_swept(age_s: float, has_pid_file: bool, expected: bool) -> None:
    assert sweepable(age_s, has_pid_file=has_pid_file) is expected
