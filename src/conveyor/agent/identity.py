"""Who an agent is (docs/design/execution.md §6–7): its id in the home, its labels and the host facts it
registers with."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable
from pathlib import Path

from conveyor.model.ids import stored_id
from conveyor.model.platforms import arch_name, os_name
from conveyor.model.protocol import HostInfo

AGENT_ID_FILE = "agent_id"
RESERVED_PREFIX = "conveyor:"


def host_name(hostname: str | None = None) -> str:
    """The host name as a label value: lower case (as `conveyor run local` reports it)."""
    value = hostname if hostname is not None else socket.gethostname()
    return value.strip().lower() or "localhost"


def automatic_labels(
    *, system: str | None = None, machine: str | None = None, hostname: str | None = None
) -> list[str]:
    """`conveyor:os:<os>`, `conveyor:arch:<arch>`, `conveyor:host:<hostname>`."""
    return [
        f"conveyor:os:{os_name(system)}",
        f"conveyor:arch:{arch_name(machine)}",
        f"conveyor:host:{host_name(hostname)}",
    ]


def parse_labels(text: str | Iterable[str] | None) -> list[str]:
    """`a,b , c` (or several such values) → `["a", "b", "c"]`, lower-cased, de-duplicated, order kept."""
    if text is None:
        return []
    values = [text] if isinstance(text, str) else list(text)
    labels: list[str] = []
    for value in values:
        for item in value.split(","):
            label = item.strip().lower()
            if label and label not in labels:
                labels.append(label)
    return labels


def agent_labels(configured: Iterable[str], **host: str | None) -> list[str]:
    """The configured labels plus the automatic ones; a configured `conveyor:` label is a ValueError."""
    labels = parse_labels(list(configured))
    reserved = [label for label in labels if label.startswith(RESERVED_PREFIX)]
    if reserved:
        raise ValueError(
            f"labels starting with {RESERVED_PREFIX!r} are set by the agent itself: {', '.join(reserved)}"
        )
    return [*labels, *automatic_labels(**host)]


def load_agent_id(home: Path, configured: str | None = None) -> str:
    """`--agent-id`/`CONVEYOR_AGENT_ID`, else `<home>/agent_id` (created once with a new UUIDv7)."""
    return stored_id(home / AGENT_ID_FILE, configured)


def _memory_mb() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024))
    except (ValueError, OSError, AttributeError):
        return None


def host_info() -> HostInfo:
    """The `host` object of `agent.register`."""
    return HostInfo(
        hostname=socket.gethostname(),
        os=os_name(),
        arch=arch_name(),
        cpus=os.cpu_count(),
        memory_mb=_memory_mb(),
        python=".".join(str(part) for part in sys.version_info[:3]),
    )
