"""Acceptance (issue 9) with the fake firecracker: leftover VMs through `conveyor admin scaler orphans`.

A real server whose `scalers.yaml` has a firecracker scaler over a chroot base directory. Another instance's
VMs sit in that directory (fake firecracker processes with their `meta.json` and pid file; no spawn record
here). One is bound to nothing: `orphans list` shows it `untracked` and `orphans stop` ends it. The other's
agent is connected and running a job: it is `tracked` (by `job`), and stopping it is refused naming that.
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
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conveyor.model import protocol as p
from conveyor.scaler.firecracker import tap_name
from conveyor.scaler.registry import BACKENDS
from tests.fakes.firecracker import install_fake_firecracker
from tests.support.dispatch_stage import SINGLE_WORKFLOW, stage
from tests.support.processes import run_cli
from tests.support.protocol_agent import ScriptedAgent
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(
    "firecracker" not in BACKENDS,
    reason="the firecracker backend is not registered in conveyor.scaler.registry",
)

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "firecracker.py"
LEFT = "0190f3a2-0000-7000-8000-0000000e2e01"  # nothing tracks it
BUSY = "0190f3a2-0000-7000-8000-0000000e2e02"  # its agent runs a job


@pytest.fixture
def vm_base() -> Iterator[Path]:
    """A short directory (unix socket paths stay under 108 bytes) for the scaler's VMs."""
    directory = Path(tempfile.mkdtemp(prefix="cvye2e", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def scalers_yaml(tmp_path: Path, base: Path) -> Path:
    (tmp_path / "vmlinux").write_bytes(b"kernel")
    (tmp_path / "rootfs.ext4").write_bytes(b"rootfs")
    firecracker = install_fake_firecracker(tmp_path / "bin", tmp_path / "fc-calls.jsonl")
    config = {
        "version": 1,
        "scalers": [
            {
                "name": "vms",
                "type": "firecracker",
                "max_agents": 2,
                "mandatory_labels": ["isolated"],  # no job of this test asks for it: nothing spawns
                "firecracker_path": str(firecracker),
                "kernel_path": str(tmp_path / "vmlinux"),
                "chroot_base_dir": str(base / "vms"),
                "network": {"bridge": "cvy-br0", "cidr": "10.200.0.0/24", "gateway": "10.200.0.1"},
                "label_sets": [
                    {"labels": ["isolated", "microvm"], "rootfs_path": str(tmp_path / "rootfs.ext4")}
                ],
            }
        ],
    }
    path = tmp_path / "scalers.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def leave_vm(base: Path, vm_id: str) -> subprocess.Popen[bytes]:
    """A booted VM another orchestrator instance (`gone-node`) left behind."""
    vm_dir = base / "vms" / vm_id
    vm_dir.mkdir(parents=True)
    meta = {
        "node": "gone-node",
        "boot": "boot-old",
        "agent_id": vm_id,
        "scaler": "vms",
        "tap": tap_name(vm_id),
    }
    (vm_dir / "meta.json").write_text(json.dumps({**meta, "ip": "10.200.0.40", "started_at": 1.0}))
    process = subprocess.Popen(
        [sys.executable, str(FAKE), "--api-sock", str(vm_dir / "api.sock"), "--id", vm_id],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    (vm_dir / "firecracker.pid").write_text(str(process.pid))
    wait_until(lambda: (vm_dir / "api.sock").exists(), timeout=30, what=f"VM {vm_id}'s API socket")
    with httpx.Client(
        transport=httpx.HTTPTransport(uds=str(vm_dir / "api.sock")), base_url="http://fc"
    ) as api:
        assert api.put("/actions", json={"action_type": "InstanceStart"}).status_code == 204
    return process


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli(["admin", "scaler", "orphans", *args], env=env)


async def test_a_leftover_vm_is_listed_untracked_and_stopped_and_a_busy_one_is_refused(
    database_url: str, tmp_path: Path, vm_base: Path
) -> None:
    config = scalers_yaml(tmp_path, vm_base)
    vms: list[subprocess.Popen[bytes]] = []
    with stage(
        tmp_path, database_url, {"ci": SINGLE_WORKFLOW}, env={"CONVEYOR_SCALER_CONFIG": str(config)}
    ) as s:
        try:
            vms = [leave_vm(vm_base, LEFT), leave_vm(vm_base, BUSY)]
            agent = ScriptedAgent(
                s.ws_url, s.agent_token(["linux"]), agent_id=BUSY, labels=["linux"], heartbeat_s=0.5
            )
            await agent.connect()
            run_id = await asyncio.to_thread(s.push)
            dispatch = await agent.next_of(p.JobDispatch)
            await agent.accept(dispatch)
            # Blocking calls go to threads: the scripted agent's heartbeats must keep flowing meanwhile.
            await asyncio.to_thread(
                wait_until,
                lambda: s.job_status(run_id)["build"] == "running",
                timeout=60,
                what="the job running",
            )
            admin = {"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token}

            listed = await asyncio.to_thread(cli, "list", "--json", env=admin)
            assert listed.returncode == 0, listed.stderr
            items = {item["vm_id"]: item for item in json.loads(listed.stdout)["items"]}
            assert items[LEFT]["state"] == "untracked" and items[LEFT]["tracked_by"] == []
            assert (items[LEFT]["kind"], items[LEFT]["backend"]) == ("vm", "firecracker")
            assert items[BUSY]["state"] == "tracked" and items[BUSY]["tracked_by"] == ["job", "registered"]
            assert items[BUSY]["job_id"] == dispatch.job_id

            stopped = await asyncio.to_thread(cli, "stop", LEFT, BUSY, env=admin)
            assert stopped.returncode == 1, "a refused id makes the command fail"
            assert f"{LEFT}: stopped" in stopped.stdout
            assert (
                f"{BUSY}: tracked" in stopped.stdout
                and "job" in stopped.stdout.split(f"{BUSY}: tracked", 1)[1]
            )
            assert "Traceback" not in stopped.stdout + stopped.stderr

            assert await asyncio.to_thread(vms[0].wait, 30) == 0, "the leftover VM shut down (SendCtrlAltDel)"
            assert not (vm_base / "vms" / LEFT).exists()
            assert vms[1].poll() is None and (vm_base / "vms" / BUSY).exists(), "the busy VM is untouched"
            again = await asyncio.to_thread(cli, "list", "--json", env=admin)
            assert [item["vm_id"] for item in json.loads(again.stdout)["items"]] == [BUSY]
            await agent.close()
        finally:
            for vm in vms:
                if vm.poll() is None:
                    os.killpg(vm.pid, signal.SIGKILL)
                vm.wait(timeout=30)
