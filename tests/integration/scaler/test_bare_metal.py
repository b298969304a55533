"""The bare-metal backend with real processes: process groups, step groups, events, records
(docs/design/scaler.md §6.1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from conveyor.scaler.backend import (
    BackendContext,
    LabelSetSpec,
    ScalerEntry,
    ScalerEvent,
    SpawnContext,
    SpawnFailed,
    SpawnRequest,
)
from conveyor.scaler.bare_metal import BareMetalBackend, list_records
from tests.support.waiting import async_wait_until, wait_until

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")

# A stand-in for `conveyor agent`: records its environment, starts a grandchild that ignores SIGTERM
# (and, in its own session, a "step" listed in running.json), prints, then waits or exits as told.
LAUNCHER = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    home = os.environ["CONVEYOR_AGENT_HOME"]
    out = os.environ["TEST_OUT"]
    with open(os.path.join(out, "env.json"), "w") as f:
        json.dump({**os.environ, "TEST_CWD": os.getcwd()}, f)
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    grandchild = subprocess.Popen([sys.executable, "-c", stubborn])
    step = subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)
    with open(os.path.join(home, "running.json"), "w") as f:
        json.dump({"pid": os.getpid(), "jobs": {"job-1": [step.pid]}}, f)
    with open(os.path.join(out, "pids.json"), "w") as f:
        json.dump({"agent": os.getpid(), "grandchild": grandchild.pid, "step": step.pid}, f)
    for i in range(5):
        print(f"agent output {i}", flush=True)
    if os.environ.get("TEST_EXIT"):
        sys.exit(int(os.environ["TEST_EXIT"]))
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # makes the teardown wait for the grace, then SIGKILL
    time.sleep(600)
    """
)


async def _setting(name: str) -> int:
    return 5000


def backend(
    tmp_path: Path, *, boot: str = "boot-1", grace: float = 1.0, command: list[str] | None = None
) -> BareMetalBackend:
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    entry = ScalerEntry(
        name="local",
        type="bare-metal",
        max_agents=4,
        label_sets=(LabelSetSpec(labels=("linux",)),),
        options={"command": command or [sys.executable, str(script)], "terminate_grace_s": grace},
    )
    context = BackendContext(home=tmp_path / "home", node_id="node-1", boot_id=boot, cluster_setting=_setting)
    return BareMetalBackend(entry, context)


def request(agent_id: str, out: Path, **env: str) -> SpawnRequest:
    out.mkdir(parents=True, exist_ok=True)
    return SpawnRequest(
        agent_id=agent_id,
        scaler="local",
        label_set=LabelSetSpec(labels=("linux",)),
        orchestrator_url="ws://127.0.0.1:1/ws",
        token="cvy_agent_" + "0" * 64,
        env={"TEST_OUT": str(out), "CONVEYOR_AGENT_TOKEN": "cvy_agent_" + "0" * 64, **env},
        limits=None,
        context=SpawnContext(),
        deadline=time.monotonic() + 60,
    )


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pids(out: Path) -> dict[str, int]:
    path = out / "pids.json"
    wait_until(lambda: path.exists() and path.stat().st_size > 0, timeout=30, what="the launcher's pids")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


async def test_destroy_ends_the_group_and_the_step_groups_within_the_grace(tmp_path: Path) -> None:
    events: list[ScalerEvent] = []
    bare = backend(tmp_path, grace=1.0)
    out = tmp_path / "out"
    managed = await bare.spawn(request("agent-1", out), events.append)
    started = pids(out)
    assert managed.pid == started["agent"] and os.getpgid(started["agent"]) == started["agent"]
    assert os.getpgid(started["grandchild"]) == started["agent"]  # the grandchild is in the agent's group
    assert os.getpgid(started["step"]) != started["agent"]  # the step has its own session
    env = json.loads((out / "env.json").read_text())
    assert env["CONVEYOR_AGENT_HOME"] == str(tmp_path / "home" / "scaler" / "work" / "agent-1")
    assert env["TEST_CWD"] == env["CONVEYOR_AGENT_HOME"]
    began = time.monotonic()
    await bare.destroy("agent-1", reason="test")
    elapsed = time.monotonic() - began
    assert elapsed < 1.0 + 1.0 + 1.5, elapsed  # grace + 1 s (and a little for a loaded machine)
    for name in ("agent", "grandchild", "step"):
        assert not alive(started[name]), name
    assert bare.managed() == {}
    assert not (tmp_path / "home" / "scaler" / "bare-metal" / "agent-1.json").exists()
    assert not (tmp_path / "home" / "scaler" / "work" / "agent-1").exists()
    assert not [e for e in events if e.kind in ("failed", "exited")]
    await bare.destroy("agent-1", reason="again")  # idempotent
    await bare.destroy("unknown", reason="no-op")


async def test_the_environment_is_built_from_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_SECRET", "leak")
    monkeypatch.setenv("CONVEYOR_AGENT_ENV_PIP_INDEX_URL", "https://pypi.internal")
    bare = backend(tmp_path)
    out = tmp_path / "out"
    await bare.spawn(request("agent-env", out, TEST_EXIT="0"), lambda _e: None)
    env = wait_until(lambda: json.loads((out / "env.json").read_text()), timeout=30, what="env.json")
    assert "SOME_SECRET" not in env
    assert env["PIP_INDEX_URL"] == "https://pypi.internal"
    assert env["PATH"] == os.environ["PATH"]
    await bare.destroy("agent-env", reason="test")


async def test_an_exit_before_registration_is_a_failure_with_code_and_tail(tmp_path: Path) -> None:
    events: list[ScalerEvent] = []
    bare = backend(tmp_path)
    await bare.spawn(request("agent-2", tmp_path / "out", TEST_EXIT="7"), events.append)

    async def failed() -> ScalerEvent | None:
        return next((e for e in events if e.kind == "failed"), None)

    event = await async_wait_until(failed, timeout=30, what="a failed event")
    assert event.exit_code == 7
    assert "exited with code 7 before registering" in event.detail
    assert "agent output 4" in event.log_tail
    await bare.destroy("agent-2", reason="cleanup")


async def test_an_exit_after_registration_is_a_disconnect(tmp_path: Path) -> None:
    events: list[ScalerEvent] = []
    bare = backend(tmp_path)
    out = tmp_path / "out"
    gate = tmp_path / "gate"
    script = tmp_path / "late.py"
    script.write_text(
        f"import os, sys, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)\nsys.exit(1)\n"
    )
    bare.entry = ScalerEntry(**{**bare.entry.__dict__, "options": {"command": [sys.executable, str(script)]}})
    await bare.spawn(request("agent-3", out), events.append)
    bare.mark_registered("agent-3")
    gate.write_text("go")

    async def exited() -> ScalerEvent | None:
        return next((e for e in events if e.kind == "exited"), None)

    event = await async_wait_until(exited, timeout=30, what="an exited event")
    assert event.exit_code == 1
    assert not [e for e in events if e.kind == "failed"]
    assert not bare.is_alive("agent-3")
    await bare.destroy("agent-3", reason="cleanup")


async def test_an_exec_error_is_a_failed_spawn(tmp_path: Path) -> None:
    bare = backend(tmp_path, command=[str(tmp_path / "no-such-agent")])
    with pytest.raises(SpawnFailed, match="cannot start .*no-such-agent"):
        await bare.spawn(request("agent-4", tmp_path / "out"), lambda _e: None)
    assert bare.managed() == {}


async def test_records_back_the_listing_and_another_boot_can_stop_them(tmp_path: Path) -> None:
    first = backend(tmp_path, boot="boot-1", grace=0.5)
    out = tmp_path / "out"
    await first.spawn(request("agent-5", out), lambda _e: None)
    started = pids(out)
    (item,) = await first.list_live()
    assert (item.vm_id, item.kind, item.pid, item.node_marker, item.boot_marker) == (
        "agent-5",
        "process",
        started["agent"],
        "node-1",
        "boot-1",
    )
    second = backend(tmp_path, boot="boot-2", grace=0.5)
    (seen,) = await second.list_live()
    await second.stop_live(seen)
    wait_until(lambda: not alive(started["agent"]), timeout=10, what="the agent to end")
    for name in ("grandchild", "step"):
        assert not alive(started[name]), name
    assert await second.list_live() == []
    await first.destroy("agent-5", reason="cleanup")


def test_a_record_with_another_start_time_is_not_live(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = psutil.Process(proc.pid).create_time()
        (records / "good.json").write_text(
            json.dumps({"pid": proc.pid, "start_time": start, "node": "n", "boot": "b"})
        )
        (records / "reused.json").write_text(
            json.dumps({"pid": proc.pid, "start_time": start - 100, "node": "n", "boot": "b"})
        )
        (records / "broken.json").write_text("{")
        assert [i.vm_id for i in list_records(records)] == ["good"]
        assert not (records / "reused.json").exists()  # a stale record is dropped
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert list_records(records) == []
