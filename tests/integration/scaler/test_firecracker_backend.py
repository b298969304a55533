"""The firecracker backend against a fake firecracker that serves the real API on its unix socket.

The fake (tests/fakes/firecracker.py) is a real process: the backend starts it, waits for its socket, configures
it over HTTP and ends it with SendCtrlAltDel or SIGKILL. Host networking is the in-memory FakeHostNet.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from conveyor.scaler.backend import SpawnFailed
from conveyor.scaler.firecracker import FirecrackerBackend
from conveyor.scaler.firecracker_host import MemoryIpAllocator, runs_vm, tap_name
from tests.fakes.firecracker import install_fake_firecracker, read_calls
from tests.fakes.host_net import FakeHostNet
from tests.support.scaler_backends import TOKEN, EventLog, entry, node_context, spawn_request
from tests.support.waiting import async_wait_until, wait_until

VM = "0190f3a2-0000-7000-8000-0000000fc001"
FOREIGN_VM = "0190f3a2-0000-7000-8000-0000000fc0ff"
NETWORK = {"bridge": "cvy-br0", "cidr": "10.200.0.0/24", "gateway": "10.200.0.1"}
FAKE = Path(__file__).resolve().parents[2] / "fakes" / "firecracker.py"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory under /tmp: API socket paths must stay under the 108-byte unix socket limit."""
    directory = Path(tempfile.mkdtemp(prefix="cvyfc", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


class Rig:
    """One scaler `vms`: its paths, the fake's recorded calls, the host network and built backends."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.base = root / "vms"
        self.calls = root / "calls.jsonl"
        self.kernel = root / "vmlinux"
        self.rootfs = root / "agent-rootfs.ext4"
        self.kernel.write_bytes(b"kernel")
        self.rootfs.write_bytes(b"rootfs image " * 64)
        self.net = FakeHostNet()
        self.allocator = MemoryIpAllocator(NETWORK["cidr"], NETWORK["gateway"])
        self.backends: list[FirecrackerBackend] = []

    def backend(
        self, *, wait_ms: int | None = None, grace_s: float = 5.0, **fake: object
    ) -> FirecrackerBackend:
        firecracker = install_fake_firecracker(self.root / "bin", self.calls, **fake)  # type: ignore[arg-type]
        scaler = entry(
            "vms",
            "firecracker",
            {
                "firecracker_path": str(firecracker),
                "kernel_path": str(self.kernel),
                "chroot_base_dir": str(self.base),
                "network": NETWORK,
                "stop_timeout_s": grace_s,
            },
            {"rootfs_path": str(self.rootfs), "vcpu_count": 2, "mem_size_mib": 1024},
            labels=("isolated", "linux"),
        )
        settings = {} if wait_ms is None else {"firecracker_api_socket_wait_ms": wait_ms}
        backend = FirecrackerBackend(
            scaler, node_context(self.root / "home", settings), host_net=self.net, ip_allocator=self.allocator
        )
        self.backends.append(backend)
        return backend

    def calls_made(self) -> list[tuple[str, str]]:
        return [(call["method"], call["path"]) for call in read_calls(self.calls)]


@pytest.fixture
async def rig(short_dir: Path) -> AsyncIterator[Rig]:
    made = Rig(short_dir)
    yield made
    for backend in made.backends:
        await backend.shutdown_all()


def cmdline_of(pid: int) -> str:
    return " ".join(Path(f"/proc/{pid}/cmdline").read_text().split("\0"))


def assert_cleaned_up(rig: Rig, vm_id: str) -> None:
    assert tap_name(vm_id) not in rig.net.taps
    assert not (rig.base / vm_id).exists()


async def test_a_spawn_configures_and_boots_the_vm_through_the_api_in_order(rig: Rig) -> None:
    backend = rig.backend()
    events = EventLog()

    agent = await backend.spawn(spawn_request(backend.entry, VM), events)

    calls = read_calls(rig.calls)
    assert [(c["method"], c["path"]) for c in calls] == [
        ("PUT", "/machine-config"),
        ("PUT", "/boot-source"),
        ("PUT", "/drives/rootfs"),
        ("PUT", "/network-interfaces/eth0"),
        ("PUT", "/mmds/config"),
        ("PUT", "/mmds"),
        ("PUT", "/actions"),
    ]
    bodies = {c["path"]: c["body"] for c in calls}
    assert bodies["/machine-config"] == {"vcpu_count": 2, "mem_size_mib": 1024}
    assert bodies["/boot-source"] == {
        "kernel_image_path": str(rig.kernel),
        "boot_args": "console=ttyS0 reboot=k panic=1 pci=off ip=10.200.0.2::10.200.0.1:255.255.255.0::eth0:off",
    }
    vm_dir = rig.base / VM
    assert bodies["/drives/rootfs"] == {
        "drive_id": "rootfs",
        "path_on_host": str(vm_dir / "rootfs.ext4"),
        "is_root_device": True,
        "is_read_only": False,
    }
    assert bodies["/network-interfaces/eth0"]["host_dev_name"] == tap_name(VM)
    assert bodies["/mmds/config"] == {"version": "V2", "network_interfaces": ["eth0"]}
    mmds = bodies["/mmds"]["conveyor"]
    assert (mmds["agent_id"], mmds["token"]) == (VM, TOKEN)
    # Loopback would be the guest itself: the agent dials the host at the bridge gateway.
    assert mmds["url"] == "ws://10.200.0.1:8470/ws"
    assert mmds["env"] == {"CONVEYOR_AGENT_EPHEMERAL": "1", "PIP_INDEX_URL": "https://pypi.internal/simple"}
    assert "conveyor:os:linux" in mmds["labels"] and "isolated" in mmds["labels"]
    assert bodies["/actions"] == {"action_type": "InstanceStart"}

    assert rig.net.taps == {tap_name(VM): "cvy-br0"}
    assert (vm_dir / "rootfs.ext4").read_bytes() == rig.rootfs.read_bytes()
    meta = json.loads((vm_dir / "meta.json").read_text())
    assert {k: meta[k] for k in ("node", "boot", "agent_id", "tap", "ip")} == {
        "node": "node-a",
        "boot": "boot-1",
        "agent_id": VM,
        "tap": tap_name(VM),
        "ip": "10.200.0.2",
    }
    assert agent.pid is not None and runs_vm(agent.pid, VM)
    assert int((vm_dir / "firecracker.pid").read_text()) == agent.pid
    assert os.getpgid(agent.pid) == agent.pid, "firecracker leads its own process group"
    assert events.kinds() == ["network", "provisioning", "ready"]
    assert TOKEN not in cmdline_of(agent.pid)


async def test_the_serial_console_is_kept_as_the_log_tail(rig: Rig) -> None:
    backend = rig.backend()
    await backend.spawn(spawn_request(backend.entry, VM), EventLog())

    tail = await async_wait_until(
        lambda: _value([line for line in backend.log_tail(VM) if "conveyor agent starting" in line]),
        timeout=30,
        what="the guest's console line",
    )
    assert tail


async def test_no_api_socket_within_the_configured_wait_fails_and_undoes_everything(rig: Rig) -> None:
    backend = rig.backend(wait_ms=300, never_listen=True)

    started = time.monotonic()
    with pytest.raises(SpawnFailed, match="API socket did not appear within 300 ms"):
        await backend.spawn(spawn_request(backend.entry, VM), EventLog())
    elapsed = time.monotonic() - started

    assert elapsed < 0.3 + 15, "the wait is bounded by the setting (plus set-up on a loaded machine)"
    assert elapsed >= 0.3
    assert rig.calls_made() == [], "nothing was configured"
    assert_cleaned_up(rig, VM)
    assert await rig.allocator.allocations() == {}
    assert backend.managed() == {}
    assert [op for op, _ in rig.net.calls] == ["create", "delete"]


async def test_the_default_wait_is_five_seconds_and_a_longer_setting_lets_a_slow_socket_through(
    rig: Rig,
) -> None:
    slow = rig.backend(wait_ms=None, socket_delay_ms=6000, never_listen=False)
    # Bound the default path: the fake opens its socket after 6 s, past the 5 000 ms default.
    with pytest.raises(SpawnFailed, match="API socket did not appear within 5000 ms"):
        await slow.spawn(spawn_request(slow.entry, VM), EventLog())
    assert_cleaned_up(rig, VM)

    patient = rig.backend(wait_ms=20_000, socket_delay_ms=1000)
    await patient.spawn(spawn_request(patient.entry, VM), EventLog())
    assert rig.calls_made()[-1] == ("PUT", "/actions")


async def test_a_refused_configuration_put_fails_with_the_fault_message(rig: Rig) -> None:
    backend = rig.backend(fail_put="/drives/rootfs")

    with pytest.raises(SpawnFailed, match="PUT /drives/rootfs answered 400: fake failure of /drives/rootfs"):
        await backend.spawn(spawn_request(backend.entry, VM), EventLog())

    assert rig.calls_made()[-1] == ("PUT", "/drives/rootfs"), "nothing after the failed step"
    assert_cleaned_up(rig, VM)
    assert await rig.allocator.allocations() == {}


async def test_firecracker_exiting_before_its_socket_fails_fast_with_code_and_output(rig: Rig) -> None:
    backend = rig.backend(exit_early=3)

    with pytest.raises(
        SpawnFailed, match="firecracker exited with code 3 before its API socket appeared"
    ) as raised:
        await backend.spawn(spawn_request(backend.entry, VM), EventLog())

    assert any("exiting early with 3" in line for line in raised.value.log_tail)
    assert_cleaned_up(rig, VM)


async def test_a_failing_tap_creation_fails_the_spawn_and_releases_the_address(rig: Rig) -> None:
    rig.net.fail_create = "Operation not permitted"
    backend = rig.backend()

    with pytest.raises(SpawnFailed, match=f"cannot create TAP {tap_name(VM)}: Operation not permitted"):
        await backend.spawn(spawn_request(backend.entry, VM), EventLog())

    assert await rig.allocator.allocations() == {} and not (rig.base / VM).exists()


async def test_registration_clears_mmds(rig: Rig) -> None:
    backend = rig.backend()
    await backend.spawn(spawn_request(backend.entry, VM), EventLog())

    backend.mark_registered(VM)

    await async_wait_until(
        lambda: _value(read_calls(rig.calls)[-1] == {"method": "PUT", "path": "/mmds", "body": {}}),
        timeout=30,
        what="PUT /mmds {}",
    )


async def test_destroy_sends_ctrl_alt_del_and_removes_tap_address_and_directory(rig: Rig) -> None:
    backend = rig.backend()
    events = EventLog()
    agent = await backend.spawn(spawn_request(backend.entry, VM), events)
    assert agent.pid is not None

    await backend.destroy(VM, reason="job finished")
    await backend.destroy(VM, reason="again")

    assert rig.calls_made()[-1] == ("PUT", "/actions")
    assert read_calls(rig.calls)[-1]["body"] == {"action_type": "SendCtrlAltDel"}
    assert not runs_vm(agent.pid, VM)
    assert_cleaned_up(rig, VM)
    assert await rig.allocator.allocations() == {} and backend.managed() == {}
    assert "failed" not in events.kinds() and "exited" not in events.kinds()


async def test_a_guest_ignoring_ctrl_alt_del_is_killed_after_the_grace(rig: Rig) -> None:
    backend = rig.backend(ignore_ctrl_alt_del=True)
    agent = await backend.spawn(spawn_request(backend.entry, VM), EventLog())
    assert agent.pid is not None

    started = time.monotonic()
    await backend.destroy(VM, reason="job finished", grace_s=0.5)

    assert time.monotonic() - started >= 0.5
    assert not runs_vm(agent.pid, VM)
    assert_cleaned_up(rig, VM)


async def test_a_vm_exiting_before_registration_is_a_failed_spawn_with_its_console(rig: Rig) -> None:
    backend = rig.backend()
    events = EventLog()
    agent = await backend.spawn(spawn_request(backend.entry, VM), events)
    assert agent.pid is not None

    os.killpg(agent.pid, signal.SIGKILL)
    failed = await async_wait_until(
        lambda: _value(events.last("failed")), timeout=30, what="the failed event"
    )

    assert failed.exit_code == -signal.SIGKILL and "before the agent registered" in failed.detail
    assert any("conveyor agent starting" in line for line in failed.log_tail)
    assert_cleaned_up(rig, VM)
    assert backend.managed() == {}


async def test_a_vm_exiting_after_registration_is_a_disconnect(rig: Rig) -> None:
    backend = rig.backend()
    events = EventLog()
    agent = await backend.spawn(spawn_request(backend.entry, VM), events)
    backend.mark_registered(VM)
    assert agent.pid is not None

    os.killpg(agent.pid, signal.SIGKILL)
    exited = await async_wait_until(
        lambda: _value(events.last("exited")), timeout=30, what="the exited event"
    )

    assert exited.exit_code == -signal.SIGKILL and "failed" not in events.kinds()
    assert_cleaned_up(rig, VM)


def exited_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=30)
    return process.pid


def start_foreign_vm(rig: Rig, vm_id: str, node: str) -> subprocess.Popen[bytes]:
    """A VM left by another orchestrator instance: its directory, meta.json, pid file and a running process."""
    vm_dir = rig.base / vm_id
    vm_dir.mkdir(parents=True)
    meta = {"node": node, "boot": "boot-7", "agent_id": vm_id, "scaler": "vms", "tap": tap_name(vm_id)}
    (vm_dir / "meta.json").write_text(json.dumps({**meta, "ip": "10.200.0.99", "started_at": 1.0}))
    process = subprocess.Popen(
        [sys.executable, str(FAKE), "--api-sock", str(vm_dir / "api.sock"), "--id", vm_id],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    (vm_dir / "firecracker.pid").write_text(str(process.pid))
    wait_until(lambda: (vm_dir / "api.sock").exists(), timeout=30, what="the foreign VM's socket")
    transport = httpx.HTTPTransport(uds=str(vm_dir / "api.sock"))
    with httpx.Client(transport=transport, base_url="http://localhost") as client:  # the other node booted it
        assert client.put("/actions", json={"action_type": "InstanceStart"}).status_code == 204
    return process


@pytest.fixture
def foreign(rig: Rig) -> Iterator[Callable[[str, str], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(vm_id: str, node: str) -> subprocess.Popen[bytes]:
        process = start_foreign_vm(rig, vm_id, node)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


async def test_a_vm_left_by_another_instance_is_listed_with_its_markers(
    rig: Rig, foreign: Callable[[str, str], subprocess.Popen[bytes]]
) -> None:
    backend = rig.backend()
    ours = await backend.spawn(spawn_request(backend.entry, VM), EventLog())
    other = foreign(FOREIGN_VM, "node-b")
    (rig.base / "dead-vm").mkdir()  # a directory without a live process is not listed

    items = {item.vm_id: item for item in await backend.list_live()}

    assert set(items) == {VM, FOREIGN_VM}
    left = items[FOREIGN_VM]
    assert (left.kind, left.backend, left.node_marker, left.boot_marker, left.pid, left.agent_id) == (
        "vm",
        "firecracker",
        "node-b",
        "boot-7",
        other.pid,
        FOREIGN_VM,
    )
    assert FOREIGN_VM not in backend.managed(), "the manager's map has no record of it: untracked material"
    assert items[VM].node_marker == "node-a" and items[VM].pid == ours.pid


async def test_stop_live_ends_another_instances_vm_and_removes_its_leftovers(
    rig: Rig, foreign: Callable[[str, str], subprocess.Popen[bytes]]
) -> None:
    backend = rig.backend()
    other = foreign(FOREIGN_VM, "node-b")
    rig.net.taps[tap_name(FOREIGN_VM)] = "cvy-br0"
    (item,) = await backend.list_live()

    await backend.stop_live(item)

    assert other.wait(timeout=30) == 0, "it shut down on SendCtrlAltDel"
    assert_cleaned_up(rig, FOREIGN_VM)
    assert await backend.list_live() == []


async def test_a_pid_file_naming_another_process_is_not_a_live_vm(rig: Rig) -> None:
    backend = rig.backend()
    vm_dir = rig.base / FOREIGN_VM
    vm_dir.mkdir(parents=True)
    (vm_dir / "firecracker.pid").write_text(str(os.getpid()))  # pid reuse: alive, but not this VM

    assert await backend.list_live() == []


async def test_the_sweep_removes_dead_vms_and_stray_taps_but_never_a_live_vm(rig: Rig) -> None:
    backend = rig.backend()
    await backend.spawn(spawn_request(backend.entry, VM), EventLog())
    dead = "0190f3a2-0000-7000-8000-00000000dead"
    (rig.base / dead).mkdir()
    (rig.base / dead / "meta.json").write_text(json.dumps({"ip": "10.200.0.50"}))
    (rig.base / dead / "firecracker.pid").write_text(str(exited_pid()))  # its firecracker is gone
    setting_up = "0190f3a2-0000-7000-8000-0000000000aa"  # no pid file yet: maybe another node's spawn
    (rig.base / setting_up).mkdir()
    rig.net.taps[tap_name(setting_up)] = "cvy-br0"
    await rig.allocator.allocate(dead)
    rig.net.taps.update({tap_name(dead): "cvy-br0", "cvy-0000000000": "cvy-br0", "cvy-br0": "-", "eth0": "-"})

    report = await backend.sweep()

    assert report.directories == [dead] and report.taps == ["cvy-0000000000"]
    assert not (rig.base / dead).exists() and (rig.base / VM).exists() and (rig.base / setting_up).exists()
    assert set(rig.net.taps) == {tap_name(VM), tap_name(setting_up), "cvy-br0", "eth0"}, (
        "the bridge is no TAP"
    )
    assert set(await rig.allocator.allocations()) == {VM}
    assert backend.is_alive(VM)


async def test_a_restarted_backend_does_not_reuse_addresses_recorded_in_vm_directories(rig: Rig) -> None:
    first = rig.backend()
    await first.spawn(spawn_request(first.entry, VM), EventLog())
    scaler = first.entry

    second = FirecrackerBackend(scaler, node_context(rig.root / "home"), host_net=rig.net)
    rig.backends.append(second)
    other = "0190f3a2-0000-7000-8000-0000000fc002"
    await second.spawn(spawn_request(scaler, other), EventLog())

    assert json.loads((rig.base / other / "meta.json").read_text())["ip"] == "10.200.0.3"


async def test_destroy_during_spawn_undoes_the_half_made_vm(rig: Rig) -> None:
    backend = rig.backend(wait_ms=20_000, never_listen=True)

    spawning = asyncio.create_task(backend.spawn(spawn_request(backend.entry, VM), EventLog()))
    await async_wait_until(
        lambda: _value((rig.base / VM / "firecracker.pid").exists()), timeout=30, what="start"
    )

    await backend.destroy(VM, reason="job cancelled")

    with pytest.raises(SpawnFailed, match="destroyed while the VM was starting"):
        await spawning
    assert_cleaned_up(rig, VM)
    assert backend.managed() == {}


async def _value(value: object) -> object:
    return value
