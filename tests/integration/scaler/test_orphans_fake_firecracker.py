"""Orphaned microVMs through a real server and the FAKE firecracker (tests/fakes/firecracker.py, no VM runs).

A VM directory left in the chroot base directory by another instance (no spawn record here) is listed
as untracked and `scaler orphans stop ID` ends it; a VM whose agent holds a running job is refused with
its tracker named, and keeps running.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, insert

from conveyor.db.tables import DEFAULT_ORG, dispatch_queue, jobs, runs
from conveyor.model.ids import new_id, utc_now
from conveyor.scaler.firecracker import tap_name
from tests.fakes.firecracker import install_fake_firecracker, read_calls
from tests.support.dispatch_stage import FAST, SINGLE_WORKFLOW, Stage, stage
from tests.support.processes import run_cli
from tests.support.scaler_backends import process_alive
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="firecracker runs on Linux")


@pytest.fixture
def base_dir() -> Iterator[Path]:
    """A short chroot base directory (the API socket paths must fit a unix socket address)."""
    path = Path(tempfile.mkdtemp(prefix="fc", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class LeftVm:
    """A fake firecracker process with its VM directory, as another orchestrator would have left it."""

    def __init__(self, base: Path, launcher: Path, agent_id: str) -> None:
        self.vm_id = new_id()
        self.directory = base / self.vm_id
        self.directory.mkdir()
        self.process = subprocess.Popen(
            [str(launcher), "--api-sock", str(self.directory / "api.sock"), "--id", self.vm_id],
            cwd=self.directory,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        (self.directory / "firecracker.pid").write_text(str(self.process.pid))
        meta = {
            "node": "another-instance",
            "boot": "its-boot",
            "agent_id": agent_id,
            "tap": tap_name(self.vm_id),
        }
        (self.directory / "meta.json").write_text(json.dumps(meta))
        wait_until(lambda: (self.directory / "api.sock").exists(), timeout=30, what="the fake's API socket")

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()


def bind_running_job(database_url: str, agent_id: str) -> str:
    """A run whose job runs on `agent_id` (a claimed queue row and a running job)."""
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    now = utc_now()
    run_id, job_id = new_id(), new_id()
    runs_on: dict[str, Any] = {
        "labels": [{"kind": "exact", "pattern": "isolated", "flags": ""}],
        "exclude": [],
    }
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(runs).values(
                    id=run_id,
                    org_id=DEFAULT_ORG,
                    number=1,
                    workflow="vm-ci",
                    repo="acme/vm",
                    routing_key="local:vm",
                    event={},
                    status="running",
                    created_at=now,
                )
            )
            conn.execute(
                insert(jobs).values(
                    id=job_id,
                    run_id=run_id,
                    org_id=DEFAULT_ORG,
                    name="build",
                    display_name="build",
                    status="running",
                    agent_id=agent_id,
                    runs_on=runs_on,
                    started_at=now,
                    # As if its agent heartbeats: the leader's dead-agent sweep leaves the job running.
                    last_heartbeat_at=now + timedelta(days=1),
                    created_at=now,
                )
            )
            conn.execute(
                insert(dispatch_queue).values(
                    job_id=job_id,
                    run_id=run_id,
                    org_id=DEFAULT_ORG,
                    state="claimed",
                    exact_labels=["isolated"],
                    runs_on=runs_on,
                    enqueued_at=now,
                    not_before=now,
                    attempts=1,
                    agent_id=agent_id,
                    claimed_at=now,
                )
            )
    finally:
        engine.dispose()
    return job_id


@pytest.fixture
def vms_stage(database_url: str, tmp_path: Path, base_dir: Path) -> Iterator[tuple[Stage, Path]]:
    calls = tmp_path / "calls.jsonl"
    launcher = install_fake_firecracker(tmp_path / "bin", calls)
    (tmp_path / "vmlinux").write_text("fake kernel")
    (tmp_path / "rootfs.ext4").write_text("fake rootfs")
    config = {
        "version": 1,
        "scalers": [
            {
                "name": "vms",
                "type": "firecracker",
                "max_agents": 2,
                "mandatory_labels": ["isolated"],
                "firecracker_path": str(launcher),
                "kernel_path": str(tmp_path / "vmlinux"),
                "chroot_base_dir": str(base_dir),
                "stop_timeout_s": 2,
                "network": {"bridge": "cvy-test-br", "cidr": "10.213.0.0/24", "gateway": "10.213.0.1"},
                "label_sets": [
                    {"labels": ["linux", "isolated"], "rootfs_path": str(tmp_path / "rootfs.ext4")}
                ],
            }
        ],
    }
    (tmp_path / "scalers.yaml").write_text(json.dumps(config))
    env = {**FAST, "CONVEYOR_SCALER_CONFIG": str(tmp_path / "scalers.yaml")}
    with stage(tmp_path, database_url, {"ci": SINGLE_WORKFLOW}, env=env) as s:
        yield s, calls


def test_a_left_vm_is_untracked_and_stopped_and_a_vm_with_a_running_job_is_refused(
    vms_stage: tuple[Stage, Path], base_dir: Path, tmp_path: Path, database_url: str
) -> None:
    s, calls = vms_stage
    launcher = tmp_path / "bin" / "firecracker"
    orphan = LeftVm(base_dir, launcher, agent_id="agent-of-a-gone-instance")
    busy = LeftVm(base_dir, launcher, agent_id="agent-with-a-job")
    try:
        job_id = bind_running_job(database_url, "agent-with-a-job")
        env = {"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token}
        listed = run_cli(["admin", "--json", "scaler", "orphans", "list"], env=env)
        assert listed.returncode == 0, listed.stderr
        items = {item["vm_id"]: item for item in json.loads(listed.stdout)["items"]}
        assert set(items) == {orphan.vm_id, busy.vm_id}
        assert (items[orphan.vm_id]["state"], items[orphan.vm_id]["kind"]) == ("untracked", "vm")
        assert (
            items[orphan.vm_id]["backend"] == "firecracker"
            and items[orphan.vm_id]["pid"] == orphan.process.pid
        )
        assert (items[busy.vm_id]["state"], items[busy.vm_id]["tracked_by"]) == ("tracked", ["job"])
        assert items[busy.vm_id]["job_id"] == job_id
        table = run_cli(["admin", "scaler", "orphans", "list"], env=env)
        assert orphan.vm_id[:8] in table.stdout and "untracked" in table.stdout

        refused = run_cli(["admin", "scaler", "orphans", "stop", busy.vm_id], env=env)
        assert refused.returncode == 1
        assert refused.stdout.strip() == f"{busy.vm_id}: tracked (tracked by job (job {job_id}))"
        assert process_alive(busy.process.pid) and busy.directory.exists()

        stopped = run_cli(["admin", "scaler", "orphans", "stop", orphan.vm_id], env=env)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert stopped.stdout.startswith(f"{orphan.vm_id}: stopped")
        wait_until(lambda: orphan.process.poll() is not None, timeout=30, what="the left VM to end")
        assert not orphan.directory.exists()
        assert {"method": "PUT", "path": "/actions", "body": {"action_type": "SendCtrlAltDel"}} in [
            {k: c.get(k) for k in ("method", "path", "body")} for c in read_calls(calls)
        ]
        remaining = json.loads(run_cli(["admin", "--json", "scaler", "orphans", "list"], env=env).stdout)[
            "items"
        ]
        assert [item["vm_id"] for item in remaining] == [busy.vm_id]
    finally:
        orphan.end()
        busy.end()
