"""The host side of a Firecracker VM: TAP devices, guest addresses, and the VM directory's files and process.

Kept apart from the backend (`scaler/firecracker.py`) so its pure naming and its host commands can be read
and tested alone; host networking goes through `HostNet`, so tests run unprivileged.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from conveyor.errors import ConveyorError
from conveyor.scaler.backend import SpawnFailed
from conveyor.scaler.ip_allocations import pick_ip

TAP_PREFIX = "cvy-"
TAP_PATTERN = re.compile(r"cvy-[0-9a-f]{10}")
API_TIMEOUT_S = 10.0
IFNAMSIZ = 16  # including the terminating NUL: names have at most 15 characters
PID_FILE = "firecracker.pid"
META_FILE = "meta.json"
FICLONE = 0x40049409  # ioctl: reflink a whole file (btrfs, xfs); falls back to a plain copy


def tap_name(vm_id: str) -> str:
    """The TAP device of a VM: `cvy-` + 10 hex of SHA-256(vm_id), 14 characters (Linux allows 15).

    The one naming function for spawn, destroy and every sweep, so a TAP is always traced to its VM.
    """
    name = TAP_PREFIX + hashlib.sha256(vm_id.encode()).hexdigest()[:10]
    assert len(name) < IFNAMSIZ
    return name


def is_tap_name(name: str) -> bool:
    """Whether `name` has the shape `tap_name` gives (so a bridge such as `cvy-br0` is never taken for one)."""
    return TAP_PATTERN.fullmatch(name) is not None


def stale_taps(taps: Iterable[str], keep_vm_ids: Iterable[str]) -> list[str]:
    """TAPs named like ours that belong to none of `keep_vm_ids` (live VMs, VMs being spawned, allocations)."""
    keep = {tap_name(vm_id) for vm_id in keep_vm_ids}
    return sorted(tap for tap in set(taps) if is_tap_name(tap) and tap not in keep)


def parse_tuntap_names(output: str) -> list[str]:
    """Device names from `ip tuntap show` (`cvy-0a1b2c3d4e: tap persist user 1000` → `cvy-0a1b2c3d4e`)."""
    return [line.split(":", 1)[0].strip() for line in output.splitlines() if ":" in line]


class HostNet(Protocol):
    """Host network changes the backend needs (privileged on a real host; faked in tests)."""

    async def create_tap(self, name: str, bridge: str) -> None: ...

    async def delete_tap(self, name: str) -> None: ...

    async def list_taps(self) -> list[str]: ...


class HostNetError(ConveyorError):
    """A host network command failed."""


@dataclass
class IpCommandHostNet:
    """`HostNet` through iproute2's `ip` (through `sudo -n` when `require_sudo`)."""

    require_sudo: bool = False

    async def _ip(self, *args: str) -> tuple[int, str, str]:
        argv = [*(["sudo", "-n"] if self.require_sudo else []), "ip", *args]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise HostNetError(f"cannot run {' '.join(argv)}: {exc}") from exc
        stdout, stderr = await process.communicate()
        return (
            process.returncode or 0,
            stdout.decode(errors="replace"),
            stderr.decode(errors="replace").strip(),
        )

    async def create_tap(self, name: str, bridge: str) -> None:
        for args in (
            ("tuntap", "add", "dev", name, "mode", "tap", "user", str(os.getuid())),
            ("link", "set", name, "master", bridge),
            ("link", "set", name, "up"),
        ):
            code, _, stderr = await self._ip(*args)
            if code != 0:
                raise HostNetError(f"ip {' '.join(args)}: {stderr or f'exit code {code}'}")

    async def delete_tap(self, name: str) -> None:
        code, _, stderr = await self._ip("link", "del", name)
        if (
            code != 0
            and "cannot find device" not in stderr.lower()
            and "does not exist" not in stderr.lower()
        ):
            raise HostNetError(f"ip link del {name}: {stderr or f'exit code {code}'}")

    async def list_taps(self) -> list[str]:
        code, stdout, stderr = await self._ip("tuntap", "show")
        if code != 0:
            raise HostNetError(f"ip tuntap show: {stderr or f'exit code {code}'}")
        return [name for name in parse_tuntap_names(stdout) if is_tap_name(name)]


class IpAllocator(Protocol):
    """Guest addresses of one network (docs/design/scaler.md §8 `ip_allocations`; in memory on a worker)."""

    async def allocate(self, vm_id: str) -> str | None: ...

    async def release(self, vm_id: str) -> None: ...

    async def allocations(self) -> dict[str, str]: ...


@dataclass
class MemoryIpAllocator:
    """An in-process allocator, seeded with the addresses recorded in existing VM directories."""

    cidr: str
    gateway: str
    held: dict[str, str] = field(default_factory=dict)  # vm_id -> ip

    async def allocate(self, vm_id: str) -> str | None:
        if vm_id in self.held:
            return self.held[vm_id]
        ip = pick_ip(self.cidr, self.gateway, self.held.values())
        if ip is not None:
            self.held[vm_id] = ip
        return ip

    async def release(self, vm_id: str) -> None:
        self.held.pop(vm_id, None)

    async def allocations(self) -> dict[str, str]:
        return dict(self.held)


def read_meta(vm_dir: Path) -> dict[str, Any]:
    """A VM directory's `meta.json` (empty when missing or unreadable)."""
    try:
        meta = json.loads((vm_dir / META_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def runs_vm(pid: int, vm_id: str) -> bool:
    """Whether `pid` is alive and is the firecracker of `vm_id` (its cmdline carries `--id <vm_id>`).

    The cmdline check guards against pid reuse; a zombie has an empty cmdline, so it reads as dead.
    """
    argv = _cmdline(pid)
    return any(arg == "--id" and value == vm_id for arg, value in itertools.pairwise(argv))


def read_pid(vm_dir: Path) -> int | None:
    try:
        return int((vm_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def copy_rootfs(source: Path, target: Path) -> None:
    """A copy-on-write clone of the rootfs where the filesystem supports it, else a full copy.

    Never a hardlink: the guest writes to its root drive and must not change the shared image.
    """
    with open(source, "rb") as src, open(target, "wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
            return
        except OSError:
            pass
        shutil.copyfileobj(src, dst, 1024 * 1024)


def kill_group(pid: int) -> None:
    """SIGKILL the VM's process group (it leads one), or the process alone."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        if exc.errno != errno.EPERM:
            raise


# --- the Firecracker API (HTTP on the VM's unix socket) ---


def fault_message(response: httpx.Response) -> str:
    """Firecracker's `{"fault_message": …}`, else the body, for a non-204 answer."""
    with contextlib.suppress(ValueError, AttributeError):
        message = response.json().get("fault_message")
        if message:
            return str(message)
    return response.text.strip() or f"HTTP {response.status_code}"


async def api_put(
    socket_path: Path, path: str, body: Mapping[str, Any], *, timeout_s: float = API_TIMEOUT_S
) -> None:
    """One PUT on the Firecracker API; anything but 204 raises `SpawnFailed` with the fault message."""
    transport = httpx.AsyncHTTPTransport(uds=str(socket_path))
    async with httpx.AsyncClient(
        transport=transport, base_url="http://localhost", timeout=timeout_s
    ) as client:
        try:
            response = await client.put(path, json=body)
        except httpx.HTTPError as exc:
            raise SpawnFailed(f"firecracker API PUT {path} failed: {exc or type(exc).__name__}") from exc
    if response.status_code != 204:
        raise SpawnFailed(
            f"firecracker API PUT {path} answered {response.status_code}: {fault_message(response)}"
        )
