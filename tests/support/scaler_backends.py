"""Building blocks for scaler backend tests: a node context, spawn requests and an event recorder."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from conveyor.scaler.backend import (
    BackendContext,
    LabelSetSpec,
    Limits,
    ScalerEntry,
    ScalerEvent,
    SpawnContext,
    SpawnRequest,
)

TOKEN = "cvy_agent_" + "ab" * 32


def node_context(
    home: Path, settings: Mapping[str, int] | None = None, node_id: str = "node-a"
) -> BackendContext:
    """A node `node_id` (boot `boot-1`) whose cluster settings are `settings` (others read as their default)."""
    values = dict(settings or {})

    async def cluster_setting(name: str) -> int:
        return values.get(name, {"firecracker_api_socket_wait_ms": 5000}.get(name, 0))

    return BackendContext(home=home, node_id=node_id, boot_id="boot-1", cluster_setting=cluster_setting)


def entry(
    name: str,
    kind: str,
    options: Mapping[str, Any],
    label_set_options: Mapping[str, Any],
    labels: tuple[str, ...] = ("linux", "small"),
) -> ScalerEntry:
    """A validated-looking `scalers.yaml` entry with one label set."""
    label_set = LabelSetSpec(
        labels=labels,
        auto_labels=("conveyor:arch:x86_64", "conveyor:os:linux"),
        options=dict(label_set_options),
    )
    return ScalerEntry(
        name=name,
        type=kind,
        max_agents=4,
        label_sets=(label_set,),
        source="scalers.yaml",
        options=dict(options),
    )


def spawn_request(
    scaler: ScalerEntry,
    agent_id: str,
    *,
    url: str = "ws://127.0.0.1:8470/ws",
    limits: Limits | None = None,
    job_id: str | None = "job-1",
) -> SpawnRequest:
    """A spawn of `agent_id` on the scaler's first label set, bound to `job_id`, with the fixed agent env."""
    label_set = scaler.label_sets[0]
    return SpawnRequest(
        agent_id=agent_id,
        scaler=scaler.name,
        label_set=label_set,
        orchestrator_url=url,
        token=TOKEN,
        env={
            "PIP_INDEX_URL": "https://pypi.internal/simple",
            "CONVEYOR_AGENT_URL": url,
            "CONVEYOR_AGENT_TOKEN": TOKEN,
            "CONVEYOR_AGENT_ID": agent_id,
            "CONVEYOR_AGENT_LABELS": ",".join(label_set.all_labels),
            "CONVEYOR_AGENT_EPHEMERAL": "1",
        },
        limits=limits,
        context=SpawnContext(bound_job_id=job_id, run_id="run-1" if job_id else None, org_id="org-1"),
        deadline=time.monotonic() + 300,
    )


class EventLog:
    """Collects the `ScalerEvent`s a backend reports."""

    def __init__(self) -> None:
        self.events: list[ScalerEvent] = []

    def __call__(self, event: ScalerEvent) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [event.kind for event in self.events]

    def last(self, kind: str) -> ScalerEvent | None:
        return next((event for event in reversed(self.events) if event.kind == kind), None)


# --- leftovers and never-registering agents, for orphan tests against real servers

# A command that starts but never registers: its spawn stays bound to the job it was made for.
NEVER_REGISTERS = [sys.executable, "-c", "import time; time.sleep(600)"]


def never_registering_scalers_yaml(path: Path, *, max_agents: int = 1) -> Path:
    """A `scalers.yaml` with one bare-metal scaler `local` (label `linux`) whose agents never register."""
    scaler = {
        "name": "local",
        "type": "bare-metal",
        "max_agents": max_agents,
        "command": NEVER_REGISTERS,
        "terminate_grace_s": 2,
        "label_sets": [{"labels": ["linux"]}],
    }
    path.write_text(json.dumps({"version": 1, "scalers": [scaler]}))
    return path


@contextmanager
def stray_agent_process(home: Path, agent_id: str = "stray-agent") -> Iterator[int]:
    """A live agent process recorded under `home` by a node that is gone (as a crash leaves it); its pid.

    The process is killed on exit if the test did not stop it.
    """
    proc = subprocess.Popen(NEVER_REGISTERS, start_new_session=True)
    records = home / "scaler" / "bare-metal"
    records.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": proc.pid,
        "start_time": psutil.Process(proc.pid).create_time(),
        "node": "gone-node",
        "boot": "old-boot",
        "agent_id": agent_id,
        "scaler": "local",
    }
    (records / f"{agent_id}.json").write_text(json.dumps(record))
    try:
        yield proc.pid
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()


def process_alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
