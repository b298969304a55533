"""A FAKE of host networking for the firecracker backend (no TAP devices are made; nothing needs root).

Implements `conveyor.scaler.firecracker.HostNet` in memory and records every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.scaler.firecracker_host import HostNetError


@dataclass
class FakeHostNet:
    """TAPs as a dict name -> bridge; `calls` lists `(operation, name)` in order."""

    taps: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail_create: str | None = None  # an error message every create_tap raises

    async def create_tap(self, name: str, bridge: str) -> None:
        self.calls.append(("create", name))
        if self.fail_create:
            raise HostNetError(self.fail_create)
        if name in self.taps:
            raise HostNetError(f"ip tuntap add dev {name}: Device or resource busy")
        self.taps[name] = bridge

    async def delete_tap(self, name: str) -> None:
        self.calls.append(("delete", name))
        self.taps.pop(name, None)

    async def list_taps(self) -> list[str]:
        return sorted(self.taps)
