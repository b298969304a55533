"""The `firecracker` scaler backend: one agent per microVM (docs/design/scaler.md §6.3).

Spawn: allocate a guest IP, create the TAP `tap_name(vm_id)` on the bridge, make the VM directory
`<chroot_base_dir>/<vm_id>/` (a copy-on-write copy of the rootfs and `meta.json` stamped with this node and
boot), start `firecracker --api-sock <dir>/api.sock --id <vm_id>` as a process-group leader, wait up to the
cluster setting `firecracker_api_socket_wait_ms` for the socket, then configure and boot through the
Firecracker HTTP API on that unix socket. The agent reads its URL, id and single-use token from MMDS (never
from argv or the kernel command line); the host clears MMDS once the agent registered. Any failed step undoes
the earlier ones.

Every VM lives in a directory of the shared base directory, so another orchestrator's leftover VM (or this
node's from an older boot) is visible to `list_live` and can be ended through the orphans API; the dead-item
`sweep` removes what no live VM uses. Host networking goes through `HostNet` so tests run unprivileged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from conveyor.scaler.backend import (
    BackendContext,
    LiveItem,
    LogRing,
    ManagedAgent,
    OnEvent,
    ScalerBackend,
    ScalerEntry,
    ScalerEvent,
    SpawnFailed,
    SpawnRequest,
)
from conveyor.scaler.firecracker_host import (
    IFNAMSIZ,
    META_FILE,
    PID_FILE,
    HostNet,
    HostNetError,
    IpAllocator,
    IpCommandHostNet,
    MemoryIpAllocator,
    api_put,
    copy_rootfs,
    kill_group,
    read_meta,
    read_pid,
    runs_vm,
    stale_taps,
    tap_name,
)
from conveyor.scaler.ip_allocations import DatabaseIpAllocator

log = logging.getLogger(__name__)

SOCKET_WAIT_SETTING = "firecracker_api_socket_wait_ms"
DEFAULT_SOCKET_WAIT_MS = 5000
SOCKET_POLL_S = 0.02
UNIX_PATH_MAX = 107  # sun_path is 108 bytes with the NUL
API_SOCKET = "api.sock"
ROOTFS_FILE = "rootfs.ext4"
GUEST_IFACE = "eth0"
DEFAULT_VCPUS = 2
DEFAULT_MEM_MIB = 512
DEFAULT_STOP_GRACE_S = 5.0
SETUP_GRACE_S = 600.0  # a VM directory without a pid file younger than this may still be setting up
BASE_BOOT_ARGS = "console=ttyS0 reboot=k panic=1 pci=off"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
FIXED_AGENT_ENV = frozenset(
    {
        "CONVEYOR_AGENT_URL",
        "CONVEYOR_AGENT_TOKEN",
        "CONVEYOR_AGENT_ID",
        "CONVEYOR_AGENT_LABELS",
        "CONVEYOR_AGENT_HOME",
    }
)


# --- pure parts -----------------------------------------------------------------------------------------


def guest_mac(vm_id: str) -> str:
    """A stable, locally administered unicast MAC for the VM's `eth0` (06:xx:…)."""
    digest = hashlib.sha256(b"mac:" + vm_id.encode()).digest()
    return ":".join(f"{byte:02x}" for byte in (0x06, *digest[:5]))


def boot_args(ip: str, gateway: str, cidr: str) -> str:
    """Kernel command line: serial console plus the static guest address (`ip=<ip>::<gw>:<mask>::eth0:off`)."""
    mask = ipaddress.ip_network(cidr, strict=False).netmask
    return f"{BASE_BOOT_ARGS} ip={ip}::{gateway}:{mask}::{GUEST_IFACE}:off"


def guest_agent_url(url: str, gateway: str) -> str:
    """The orchestrator URL as the guest dials it: loopback means the host, reached at the bridge gateway."""
    parts = urlsplit(url)
    if parts.hostname is None or parts.hostname not in LOOPBACK_HOSTS:
        return url
    netloc = gateway + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass(frozen=True)
class VmPlan:
    """Everything that decides a VM's configuration (computed before anything is started)."""

    vm_id: str
    kernel_path: str
    rootfs_path: str
    tap: str
    ip: str
    gateway: str
    cidr: str
    vcpu_count: int
    mem_size_mib: int


def configuration_calls(plan: VmPlan, request: SpawnRequest) -> list[tuple[str, dict[str, Any]]]:
    """The Firecracker API PUTs that configure and boot a VM, in order (each must answer 204)."""
    env = {name: value for name, value in request.env.items() if name not in FIXED_AGENT_ENV}
    return [
        ("/machine-config", {"vcpu_count": plan.vcpu_count, "mem_size_mib": plan.mem_size_mib}),
        (
            "/boot-source",
            {"kernel_image_path": plan.kernel_path, "boot_args": boot_args(plan.ip, plan.gateway, plan.cidr)},
        ),
        (
            "/drives/rootfs",
            {
                "drive_id": "rootfs",
                "path_on_host": plan.rootfs_path,
                "is_root_device": True,
                "is_read_only": False,
            },
        ),
        (
            f"/network-interfaces/{GUEST_IFACE}",
            {"iface_id": GUEST_IFACE, "host_dev_name": plan.tap, "guest_mac": guest_mac(plan.vm_id)},
        ),
        ("/mmds/config", {"version": "V2", "network_interfaces": [GUEST_IFACE]}),
        (
            "/mmds",
            {
                "conveyor": {
                    "url": guest_agent_url(request.orchestrator_url, plan.gateway),
                    "agent_id": request.agent_id,
                    "token": request.token,
                    "labels": list(request.labels),
                    "env": env,
                }
            },
        ),
        ("/actions", {"action_type": "InstanceStart"}),
    ]


def sweepable(age_s: float, *, has_pid_file: bool) -> bool:
    """Whether a VM directory whose VM is not live may be removed by the sweep.

    One with a pid file had its firecracker started and it is gone now. One without is either a spawn that
    died during set-up or a spawn still copying its rootfs (perhaps another orchestrator's on this host):
    it is left alone until it is older than `SETUP_GRACE_S`.
    """
    return has_pid_file or age_s >= SETUP_GRACE_S


def vm_dir_age_s(vm_dir: Path, now: float) -> float:
    """Seconds since the VM directory last changed (0 when it vanished meanwhile)."""
    try:
        return max(0.0, now - vm_dir.stat().st_mtime)
    except OSError:
        return 0.0


# --- the backend ---------------------------------------------------------------------------------------


@dataclass
class _Vm:
    agent: ManagedAgent
    on_event: OnEvent
    directory: Path
    tap: str
    ring: LogRing = field(default_factory=LogRing)
    registered: bool = False
    cancel: bool = False
    ip: str | None = None
    tap_created: bool = False
    process: asyncio.subprocess.Process | None = None
    started: bool = False  # InstanceStart accepted
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # spawn returned or raised
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.directory / API_SOCKET


class FirecrackerBackend(ScalerBackend):
    """Agents in Firecracker microVMs (one per agent; single use)."""

    type: ClassVar[str] = "firecracker"
    scaler_keys: ClassVar[frozenset[str]] = frozenset(
        {"firecracker_path", "kernel_path", "chroot_base_dir", "network", "require_sudo", "stop_timeout_s"}
    )
    label_set_keys: ClassVar[frozenset[str]] = frozenset({"rootfs_path", "vcpu_count", "mem_size_mib"})

    def __init__(
        self,
        entry: ScalerEntry,
        context: BackendContext,
        *,
        host_net: HostNet | None = None,
        ip_allocator: IpAllocator | None = None,
    ) -> None:
        super().__init__(entry, context)
        self.host_net: HostNet = host_net or IpCommandHostNet(bool(entry.options.get("require_sudo", False)))
        network = entry.options["network"]
        cidr, gateway = str(network["cidr"]), str(network["gateway"])
        if ip_allocator is None and context.database is not None:  # a coordinator: shared with its peers
            ip_allocator = DatabaseIpAllocator(context.database, context.node_id, cidr, gateway)
        self.ip_allocator: IpAllocator = ip_allocator or MemoryIpAllocator(
            cidr, gateway, held=self._recorded_ips()
        )
        self._vms: dict[str, _Vm] = {}

    # -- configuration --

    @classmethod
    def validate_entry(cls, entry: ScalerEntry) -> list[str]:
        """Type-specific keys as `field: problem` (the loader prefixes the file and the scaler)."""
        options = entry.options
        errors: list[str] = []
        for key in ("firecracker_path", "kernel_path", "chroot_base_dir"):
            value = options.get(key)
            if not isinstance(value, str) or not os.path.isabs(value):
                errors.append(f"{key}: required, an absolute path")
        base = options.get("chroot_base_dir")
        if isinstance(base, str):
            longest = len(os.path.join(base, "0" * 36, API_SOCKET).encode())
            if longest > UNIX_PATH_MAX:
                errors.append(
                    f"chroot_base_dir: too long for the VMs' API sockets ({longest} > {UNIX_PATH_MAX} bytes); "
                    "choose a shorter directory"
                )
        errors += _network_problems(options.get("network"))
        sudo = options.get("require_sudo", False)
        if not isinstance(sudo, bool):
            errors.append("require_sudo: must be true or false")
        grace = options.get("stop_timeout_s", DEFAULT_STOP_GRACE_S)
        if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
            errors.append("stop_timeout_s: must be a number of seconds ≥ 0")
        for index, label_set in enumerate(entry.label_sets):
            at = f"label_sets[{index}]"
            rootfs = label_set.options.get("rootfs_path")
            if not isinstance(rootfs, str) or not os.path.isabs(rootfs):
                errors.append(f"{at}.rootfs_path: required, an absolute path")
            for key, minimum, maximum in (("vcpu_count", 1, 32), ("mem_size_mib", 128, 1024 * 1024)):
                value = label_set.options.get(key)
                if value is not None and (
                    isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum
                ):
                    errors.append(f"{at}.{key}: must be a whole number from {minimum} to {maximum}")
        return errors

    def validate_reload(self, entry: ScalerEntry) -> list[str]:
        errors = type(self).validate_entry(entry)
        for key in ("chroot_base_dir", "network"):
            if entry.options.get(key) != self.entry.options.get(key):
                errors.append(f"{key}: cannot change while the scaler runs; add a new scaler instead")
        return errors

    @property
    def base_dir(self) -> Path:
        return Path(str(self.entry.options["chroot_base_dir"]))

    @property
    def _network(self) -> Mapping[str, Any]:
        network: Mapping[str, Any] = self.entry.options["network"]
        return network

    @property
    def _grace_s(self) -> float:
        return float(self.entry.options.get("stop_timeout_s", DEFAULT_STOP_GRACE_S))

    def _recorded_ips(self) -> dict[str, str]:
        """Addresses written in the VM directories already present (a restart must not reuse them)."""
        held: dict[str, str] = {}
        if self.base_dir.is_dir():
            for vm_dir in self.base_dir.iterdir():
                ip = read_meta(vm_dir).get("ip")
                if isinstance(ip, str):
                    held[vm_dir.name] = ip
        return held

    # -- spawn --

    async def spawn(self, request: SpawnRequest, on_event: OnEvent) -> ManagedAgent:
        """Network, directory, process, API socket, configuration, InstanceStart; undo everything on failure."""
        vm_id = request.agent_id
        vm = _Vm(
            agent=ManagedAgent(agent_id=vm_id, scaler=self.name, label_set=request.labels, backend_ref=vm_id),
            on_event=on_event,
            directory=self.base_dir / vm_id,
            tap=tap_name(vm_id),
        )
        self._vms[vm_id] = vm
        try:
            await self._boot(vm, request)
            if vm.cancel:
                raise SpawnFailed("destroyed while the VM was starting")
        except BaseException as exc:
            self._vms.pop(vm_id, None)
            await asyncio.shield(self._undo(vm))
            vm.settled.set()
            if isinstance(exc, SpawnFailed):
                exc.log_tail = exc.log_tail or vm.ring.lines()
                raise
            if isinstance(exc, Exception):
                raise SpawnFailed(f"firecracker spawn failed: {exc}", vm.ring.lines()) from exc
            raise
        vm.agent.state = "running"
        vm.settled.set()
        vm.tasks.append(asyncio.get_running_loop().create_task(self._watch(vm), name=f"fc-watch-{vm_id}"))
        return vm.agent

    async def _boot(self, vm: _Vm, request: SpawnRequest) -> None:
        network = self._network
        label_set = request.label_set.options
        vm.ip = await self.ip_allocator.allocate(vm.agent.agent_id)
        if vm.ip is None:
            raise SpawnFailed(f"no free guest address in {network['cidr']}")
        self._check_cancel(vm)
        vm.tap_created = True  # set first: a half-made TAP is deleted by the undo too
        try:
            await self.host_net.create_tap(vm.tap, str(network["bridge"]))
        except HostNetError as exc:
            raise SpawnFailed(f"cannot create TAP {vm.tap}: {exc}") from exc
        vm.on_event(
            ScalerEvent(vm.agent.agent_id, "network", f"tap {vm.tap} on {network['bridge']}, guest {vm.ip}")
        )
        self._check_cancel(vm)

        vm.directory.mkdir(parents=True, exist_ok=False)
        rootfs = vm.directory / ROOTFS_FILE
        try:
            await asyncio.to_thread(copy_rootfs, Path(str(label_set["rootfs_path"])), rootfs)
        except OSError as exc:
            raise SpawnFailed(
                f"cannot copy the rootfs {label_set['rootfs_path']}: {exc.strerror or exc}"
            ) from exc
        meta = {
            "node": self.context.node_id,
            "boot": self.context.boot_id,
            "agent_id": vm.agent.agent_id,
            "scaler": self.name,
            "tap": vm.tap,
            "ip": vm.ip,
            "started_at": time.time(),
        }
        (vm.directory / META_FILE).write_text(json.dumps(meta))
        self._check_cancel(vm)

        vm.on_event(ScalerEvent(vm.agent.agent_id, "provisioning", "starting firecracker"))
        try:
            vm.process = await asyncio.create_subprocess_exec(
                str(self.entry.options["firecracker_path"]),
                "--api-sock",
                str(vm.socket),
                "--id",
                vm.agent.agent_id,
                cwd=vm.directory,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                process_group=0,
            )
        except OSError as exc:
            raise SpawnFailed(f"cannot start {self.entry.options['firecracker_path']}: {exc}") from exc
        vm.agent.pid = vm.process.pid
        (vm.directory / PID_FILE).write_text(str(vm.process.pid))
        vm.tasks.append(asyncio.get_running_loop().create_task(self._read_console(vm), name="fc-console"))

        wait_ms = await self.context.cluster_setting(SOCKET_WAIT_SETTING) or DEFAULT_SOCKET_WAIT_MS
        await self._wait_for_socket(vm, wait_ms)
        self._check_cancel(vm)

        plan = VmPlan(
            vm_id=vm.agent.agent_id,
            kernel_path=str(self.entry.options["kernel_path"]),
            rootfs_path=str(rootfs),
            tap=vm.tap,
            ip=vm.ip,
            gateway=str(network["gateway"]),
            cidr=str(network["cidr"]),
            vcpu_count=int(label_set.get("vcpu_count", DEFAULT_VCPUS)),
            mem_size_mib=int(label_set.get("mem_size_mib", DEFAULT_MEM_MIB)),
        )
        for path, body in configuration_calls(plan, request):
            self._check_cancel(vm)
            await api_put(vm.socket, path, body)
        vm.started = True
        vm.on_event(ScalerEvent(vm.agent.agent_id, "ready", "microVM started"))

    @staticmethod
    def _check_cancel(vm: _Vm) -> None:
        if vm.cancel:
            raise SpawnFailed("destroyed while the VM was starting")

    async def _wait_for_socket(self, vm: _Vm, wait_ms: int) -> None:
        """Poll every 20 ms until the API socket accepts a connection; the process exiting ends the wait."""
        assert vm.process is not None
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            self._check_cancel(vm)
            if vm.process.returncode is not None:
                await self._drain_console(vm)
                raise SpawnFailed(
                    f"firecracker exited with code {vm.process.returncode} before its API socket appeared",
                    vm.ring.lines(),
                )
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_unix_connection(str(vm.socket))
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
                return
            if time.monotonic() >= deadline:
                raise SpawnFailed(f"API socket did not appear within {wait_ms} ms", vm.ring.lines())
            await asyncio.sleep(SOCKET_POLL_S)

    async def _read_console(self, vm: _Vm) -> None:
        """The serial console (firecracker's stdout and stderr) into the VM's log ring."""
        assert vm.process is not None and vm.process.stdout is not None
        while line := await vm.process.stdout.readline():
            vm.ring.add(line.decode(errors="replace"))

    async def _drain_console(self, vm: _Vm) -> None:
        """Let the console reader take the last output of an exited process (bounded)."""
        readers = [task for task in vm.tasks if task.get_name() == "fc-console"]
        if readers:
            await asyncio.wait(readers, timeout=2.0)

    async def _watch(self, vm: _Vm) -> None:
        """A VM whose firecracker exits on its own: clean up, then `failed` (unregistered) or `exited`."""
        assert vm.process is not None
        code = await vm.process.wait()
        if self._vms.get(vm.agent.agent_id) is not vm or vm.agent.state == "destroying":
            return  # destroy() owns the teardown and reports nothing
        self._vms.pop(vm.agent.agent_id, None)
        await self._drain_console(vm)
        await self._undo(vm)
        if vm.registered:
            vm.on_event(
                ScalerEvent(
                    vm.agent.agent_id, "exited", f"firecracker exited with code {code}", exit_code=code
                )
            )
        else:
            vm.on_event(
                ScalerEvent(
                    vm.agent.agent_id,
                    "failed",
                    f"firecracker exited with code {code} before the agent registered",
                    exit_code=code,
                    log_tail=tuple(vm.ring.lines()),
                )
            )

    # -- registration --

    def mark_registered(self, agent_id: str) -> None:
        """Later exits are disconnects; and the token leaves MMDS (`PUT /mmds {}`)."""
        vm = self._vms.get(agent_id)
        if vm is None:
            return
        vm.registered = True
        vm.tasks.append(
            asyncio.get_running_loop().create_task(self._clear_mmds(vm), name=f"fc-mmds-{agent_id}")
        )

    async def _clear_mmds(self, vm: _Vm) -> None:
        try:
            await api_put(vm.socket, "/mmds", {})
        except SpawnFailed as exc:
            log.warning("scaler %s: clearing MMDS of %s failed: %s", self.name, vm.agent.agent_id, exc.detail)

    def is_alive(self, agent_id: str) -> bool:
        vm = self._vms.get(agent_id)
        return vm is not None and vm.agent.state != "destroying"

    def managed(self) -> dict[str, ManagedAgent]:
        return {vm_id: vm.agent for vm_id, vm in self._vms.items()}

    def log_tail(self, agent_id: str) -> list[str]:
        vm = self._vms.get(agent_id)
        return vm.ring.lines() if vm is not None else []

    # -- teardown --

    async def destroy(self, agent_id: str, *, reason: str, grace_s: float | None = None) -> None:
        """SendCtrlAltDel, the grace, SIGKILL the group; then TAP, IP and directory. Idempotent."""
        vm = self._vms.get(agent_id)
        if vm is None or vm.agent.state == "destroying":
            return
        log.info("scaler %s: destroying VM %s (%s)", self.name, agent_id, reason)
        if not vm.settled.is_set():
            vm.cancel = True  # spawn undoes what it started and raises; wait for that
            await vm.settled.wait()
            return
        vm.agent.state = "destroying"
        try:
            await self._undo(vm, grace_s=self._grace_s if grace_s is None else grace_s)
        finally:
            if self._vms.get(agent_id) is vm:
                del self._vms[agent_id]

    async def _undo(self, vm: _Vm, *, grace_s: float = 0.0) -> None:
        """End the VM's process and remove its TAP, address and directory (whatever of them exists)."""
        process = vm.process
        if process is not None and process.returncode is None:
            if vm.started and grace_s > 0:
                with contextlib.suppress(SpawnFailed):
                    await api_put(vm.socket, "/actions", {"action_type": "SendCtrlAltDel"}, timeout_s=grace_s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), grace_s)
            if process.returncode is None:
                kill_group(process.pid)
                await process.wait()
        for task in vm.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        await self._release(vm.agent.agent_id, vm.tap if vm.tap_created else None, vm.directory)

    async def _release(self, vm_id: str, tap: str | None, directory: Path) -> None:
        if tap is not None:
            try:
                await self.host_net.delete_tap(tap)
            except HostNetError as exc:
                log.warning("scaler %s: %s (the sweep retries)", self.name, exc)
        await self.ip_allocator.release(vm_id)
        await asyncio.to_thread(shutil.rmtree, directory, True)

    async def shutdown_all(self) -> None:
        results = await asyncio.gather(
            *(self.destroy(vm_id, reason="shutdown") for vm_id in list(self._vms)), return_exceptions=True
        )
        for result in results:
            if isinstance(result, Exception):  # one VM failing to go must not keep the others alive
                log.warning("scaler %s: destroying a VM at shutdown failed: %s", self.name, result)

    # -- what lives on this host --

    async def list_live(self) -> list[LiveItem]:
        """VM directories whose `firecracker.pid` is alive with `--id <vm_id>` (any node, any boot)."""
        return await asyncio.to_thread(self._scan_live)

    def _scan_live(self) -> list[LiveItem]:
        items: list[LiveItem] = []
        if not self.base_dir.is_dir():
            return items
        for vm_dir in sorted(self.base_dir.iterdir()):
            pid = read_pid(vm_dir)
            if pid is None or not runs_vm(pid, vm_dir.name):
                continue
            meta = read_meta(vm_dir)
            started = meta.get("started_at")
            items.append(
                LiveItem(
                    vm_id=vm_dir.name,
                    kind="vm",
                    backend="firecracker",
                    backend_ref=vm_dir.name,
                    agent_id=_text(meta.get("agent_id")),
                    scaler=_text(meta.get("scaler")),
                    node_marker=_text(meta.get("node")),
                    boot_marker=_text(meta.get("boot")),
                    pid=pid,
                    started_at=float(started) if isinstance(started, int | float) else None,
                )
            )
        return items

    async def stop_live(self, item: LiveItem) -> None:
        """End one listed VM (ours through `destroy`; another's by its pid file, re-checked before the kill)."""
        if item.vm_id in self._vms:
            await self.destroy(item.vm_id, reason="stopped through the orphans API")
            return
        vm_dir = self.base_dir / item.vm_id
        pid = read_pid(vm_dir)
        if pid is not None and runs_vm(pid, item.vm_id):
            with contextlib.suppress(SpawnFailed):
                await api_put(
                    vm_dir / API_SOCKET,
                    "/actions",
                    {"action_type": "SendCtrlAltDel"},
                    timeout_s=self._grace_s or 1,
                )
            if not await _vm_gone_within(pid, item.vm_id, self._grace_s):
                kill_group(pid)
        tap = _text(read_meta(vm_dir).get("tap")) or tap_name(item.vm_id)
        await self._release(item.vm_id, tap, vm_dir)

    async def sweep(self) -> SweepReport:
        """Remove what no live VM uses: dead VM directories (their TAP, address, files), then stray TAPs.

        Never stops a live VM. A directory still being set up (no pid file yet, younger than
        `SETUP_GRACE_S`; possibly another orchestrator's spawn on this host) is left alone with its TAP.
        Allocations are re-read after the TAPs were listed, so a VM allocated in between keeps its TAP.
        Run at boot and every 15 minutes by the manager.
        """
        report = SweepReport()
        live = {item.vm_id for item in await self.list_live()}
        keep = live | set(self._vms)
        now = time.time()
        if self.base_dir.is_dir():
            for vm_dir in sorted(self.base_dir.iterdir()):
                vm_id = vm_dir.name
                if vm_id in keep or not vm_dir.is_dir():
                    continue
                if not sweepable(vm_dir_age_s(vm_dir, now), has_pid_file=(vm_dir / PID_FILE).exists()):
                    keep.add(vm_id)
                    continue
                await self._release(vm_id, tap_name(vm_id), vm_dir)
                report.directories.append(vm_id)
        taps = await self.host_net.list_taps()
        keep |= set(await self.ip_allocator.allocations())
        for tap in stale_taps(taps, keep):
            try:
                await self.host_net.delete_tap(tap)
                report.taps.append(tap)
            except HostNetError as exc:
                log.warning("scaler %s: sweep: %s", self.name, exc)
        return report


@dataclass
class SweepReport:
    """What one sweep removed (for logs and `conveyor_scaler_sweep_removed_total`)."""

    directories: list[str] = field(default_factory=list)
    taps: list[str] = field(default_factory=list)


async def _vm_gone_within(pid: int, vm_id: str, timeout_s: float) -> bool:
    """Wait (polling; the process is not our child) until `pid` no longer runs `vm_id`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not runs_vm(pid, vm_id):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _network_problems(network: Any) -> list[str]:
    if not isinstance(network, Mapping):
        return ["network: required, {bridge, cidr, gateway}"]
    problems = [f"network: unknown key {key}" for key in sorted(set(network) - {"bridge", "cidr", "gateway"})]
    bridge = network.get("bridge")
    if not isinstance(bridge, str) or not bridge or len(bridge) >= IFNAMSIZ:
        problems.append("network.bridge: required, an interface name of at most 15 characters")
    try:
        cidr = ipaddress.ip_network(str(network.get("cidr")), strict=False)
    except ValueError:
        return [*problems, "network.cidr: required, an IPv4 network such as 10.200.0.0/24"]
    if cidr.version != 4 or cidr.num_addresses < 4:
        problems.append("network.cidr: must be an IPv4 network of at least /30")
    try:
        gateway = ipaddress.ip_address(str(network.get("gateway")))
    except ValueError:
        return [*problems, "network.gateway: required, an address inside network.cidr"]
    if gateway not in cidr:
        problems.append(f"network.gateway: {gateway} is not inside {cidr}")
    return problems
