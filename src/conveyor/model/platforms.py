"""How Conveyor names an operating system and a CPU architecture (the `conveyor:os:` / `conveyor:arch:`
labels, `HostInfo`, a scaler's host). In `model` because the agent program and the orchestrator's scaler
must agree on them and neither may import the other (docs/design/ARCHITECTURE.md §3)."""

from __future__ import annotations

import platform


def os_name(system: str | None = None) -> str:
    """`linux`, `macos` or `windows` (anything else reports as linux)."""
    value = (system if system is not None else platform.system()).lower()
    return {"darwin": "macos", "windows": "windows"}.get(value, "linux")


def arch_name(machine: str | None = None) -> str:
    """`x86_64` or `arm64` (other machines keep their lower-cased name)."""
    value = (machine if machine is not None else platform.machine()).lower()
    return {"amd64": "x86_64", "x64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}.get(value, value)
