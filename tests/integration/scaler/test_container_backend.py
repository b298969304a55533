"""The container backend against a fake docker/podman CLI that records its calls (tests/fakes/docker_cli.py).

One test at the end drives a real docker or podman; it runs only where a working runtime and the image exist.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from conveyor.scaler.backend import Limits, SpawnFailed
from conveyor.scaler.container import ContainerBackend
from tests.fakes.docker_cli import (
    add_container,
    add_image,
    containers,
    exit_container,
    install_fake_cli,
    read_calls,
)
from tests.support.scaler_backends import TOKEN, EventLog, entry, node_context, spawn_request
from tests.support.waiting import async_wait_until

IMAGE = "ghcr.io/acme/conveyor-agent:py3.12"
AGENT = "0190f3a2-0000-7000-8000-00000000a001"
OTHER_AGENT = "0190f3a2-0000-7000-8000-00000000b002"


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory put first on PATH for the fake CLIs."""
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")
    return directory


@pytest.fixture
def docker_state(tmp_path: Path, bin_dir: Path) -> Path:
    """A fake `docker` first on PATH; its state (containers, recorded calls) lives in the returned directory."""
    state = tmp_path / "docker-state"
    install_fake_cli(bin_dir, state, "docker")
    return state


@pytest.fixture
async def make_backend(tmp_path: Path) -> AsyncIterator[Callable[..., ContainerBackend]]:
    """Builds container backends on the `docker` scaler; each is shut down (monitor ended) after the test."""
    made: list[ContainerBackend] = []

    def build(
        *, options: dict | None = None, image_policy: str | None = None, poll_interval_s: float = 60.0
    ) -> ContainerBackend:
        label_set_options: dict = {"image": IMAGE}
        if image_policy is not None:
            label_set_options["image_pull_policy"] = image_policy
        scaler = entry("docker", "container", {"runtime": "auto", **(options or {})}, label_set_options)
        backend = ContainerBackend(scaler, node_context(tmp_path / "home"), poll_interval_s=poll_interval_s)
        made.append(backend)
        return backend

    yield build
    for backend in made:
        await backend.shutdown_all()


def commands(state: Path) -> list[list[str]]:
    return [call["argv"] for call in read_calls(state)]


def run_call(state: Path) -> dict:
    return next(call for call in read_calls(state) if call["argv"][:1] == ["run"])


async def test_spawn_runs_a_labelled_detached_container_with_the_env_off_argv(
    make_backend: Callable[..., ContainerBackend], docker_state: Path
) -> None:
    backend = make_backend()
    request = spawn_request(backend.entry, AGENT, limits=Limits(cpus=1.5, mem_bytes=2 * 1024**3))

    agent = await backend.spawn(request, EventLog())

    call = run_call(docker_state)
    argv = call["argv"]
    assert argv[:4] == ["run", "-d", "--name", f"cvy-{AGENT}"]
    labels = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--label"}
    assert labels == {
        "conveyor.managed=true",
        "conveyor.node=node-a",
        "conveyor.boot=boot-1",
        "conveyor.scaler=docker",
        f"conveyor.agent-id={AGENT}",
        "conveyor.job-id=job-1",
        "conveyor.run-id=run-1",
    }
    assert argv[argv.index("--cpus") + 1] == "1.5" and argv[argv.index("--memory") + 1] == str(2 * 1024**3)
    assert "host.docker.internal:host-gateway" in argv and argv[-1] == IMAGE
    assert not any(TOKEN in arg for arg in argv), "the token must never be on argv"
    assert call["env"]["CONVEYOR_AGENT_TOKEN"] == TOKEN
    assert call["env"]["CONVEYOR_AGENT_ID"] == AGENT
    assert call["env"]["PIP_INDEX_URL"] == "https://pypi.internal/simple"
    # Loopback inside a container is the container: the agent dials the host gateway name instead.
    assert call["env"]["CONVEYOR_AGENT_URL"] == "ws://host.docker.internal:8470/ws"
    (container,) = containers(docker_state).values()
    assert agent.backend_ref == container["id"] and agent.state == "running"
    assert backend.is_alive(AGENT) and backend.runtime_name == "docker"


async def test_if_not_present_pulls_only_a_missing_image(
    make_backend: Callable[..., ContainerBackend], docker_state: Path
) -> None:
    backend = make_backend()
    await backend.spawn(spawn_request(backend.entry, AGENT), EventLog())
    await backend.spawn(spawn_request(backend.entry, OTHER_AGENT), EventLog())

    pulls = [argv for argv in commands(docker_state) if argv[0] == "pull"]
    inspects = [argv for argv in commands(docker_state) if argv[:2] == ["image", "inspect"]]
    assert pulls == [["pull", IMAGE]] and len(inspects) == 2


@pytest.mark.parametrize(("policy", "pulls"), [("always", 1), ("never", 0)])
async def test_always_pulls_and_never_does_not(
    make_backend: Callable[..., ContainerBackend], docker_state: Path, policy: str, pulls: int
) -> None:
    add_image(docker_state, IMAGE)
    backend = make_backend(image_policy=policy)
    await backend.spawn(spawn_request(backend.entry, AGENT), EventLog())
    assert sum(argv[0] == "pull" for argv in commands(docker_state)) == pulls
    assert not any(argv[:2] == ["image", "inspect"] for argv in commands(docker_state))


async def test_a_failing_run_is_a_failed_spawn_with_the_cli_error_and_leaves_nothing(
    tmp_path: Path, make_backend: Callable[..., ContainerBackend], bin_dir: Path
) -> None:
    state = tmp_path / "docker-state"
    install_fake_cli(
        bin_dir, state, "docker", env={"FAKE_DOCKER_RUN_FAILS": "docker: invalid reference format."}
    )
    backend = make_backend(image_policy="never")

    with pytest.raises(SpawnFailed, match="container run failed: docker: invalid reference format"):
        await backend.spawn(spawn_request(backend.entry, AGENT), EventLog())

    assert backend.managed() == {} and containers(state) == {}


async def test_a_failing_pull_is_a_failed_spawn_and_nothing_runs(
    tmp_path: Path, make_backend: Callable[..., ContainerBackend], bin_dir: Path
) -> None:
    state = tmp_path / "docker-state"
    install_fake_cli(bin_dir, state, "docker", env={"FAKE_DOCKER_PULL_FAILS": "manifest unknown"})
    backend = make_backend(image_policy="always")

    with pytest.raises(SpawnFailed, match=f"image pull failed for {IMAGE}: manifest unknown"):
        await backend.spawn(spawn_request(backend.entry, AGENT), EventLog())

    assert not any(argv[0] == "run" for argv in commands(state)) and backend.managed() == {}


async def test_auto_skips_a_docker_whose_daemon_is_down_and_picks_podman(
    tmp_path: Path, make_backend: Callable[..., ContainerBackend], bin_dir: Path
) -> None:
    docker_state, podman_state = tmp_path / "docker-state", tmp_path / "podman-state"
    install_fake_cli(bin_dir, docker_state, "docker", env={"FAKE_DOCKER_VERSION_FAILS": "1"})
    install_fake_cli(bin_dir, podman_state, "podman")
    backend = make_backend(image_policy="never")

    await backend.spawn(spawn_request(backend.entry, AGENT), EventLog())

    assert backend.runtime_name == "podman"
    assert commands(docker_state) == [["version"]]
    assert [argv[0] for argv in commands(podman_state)] == ["version", "run"]


async def test_no_working_runtime_fails_the_spawn_with_the_reason(
    tmp_path: Path, make_backend: Callable[..., ContainerBackend], bin_dir: Path
) -> None:
    for name in ("docker", "podman"):
        install_fake_cli(bin_dir, tmp_path / f"{name}-state", name, env={"FAKE_DOCKER_VERSION_FAILS": "1"})
    backend = make_backend()

    with pytest.raises(SpawnFailed, match=r"no container runtime found \(docker or podman\)") as raised:
        await backend.spawn(spawn_request(backend.entry, AGENT), EventLog())

    assert "Cannot connect to the Docker daemon" in raised.value.detail
    assert backend.managed() == {}


async def test_an_exit_before_registration_is_a_failed_spawn_with_exit_code_and_log_tail(
    make_backend: Callable[..., ContainerBackend], docker_state: Path
) -> None:
    backend = make_backend(poll_interval_s=0.1)
    events = EventLog()
    await backend.spawn(spawn_request(backend.entry, AGENT), events)

    exit_container(docker_state, f"cvy-{AGENT}", 3, output="agent: cannot reach orchestrator")
    failed = await async_wait_until(
        lambda: _async(events.last("failed")), timeout=30, what="the failed event from the exit watch"
    )

    assert failed.exit_code == 3 and "before the agent registered" in failed.detail
    assert "agent: cannot reach orchestrator" in failed.log_tail
    assert backend.managed() == {} and containers(docker_state) == {}, "the exited container is removed"


async def test_an_exit_after_registration_is_a_disconnect_not_a_failure(
    make_backend: Callable[..., ContainerBackend], docker_state: Path
) -> None:
    backend = make_backend()
    events = EventLog()
    await backend.spawn(spawn_request(backend.entry, AGENT), events)
    backend.mark_registered(AGENT)

    exit_container(docker_state, f"cvy-{AGENT}", 1)
    await backend.check_exits()

    assert events.kinds() == ["provisioning", "exited"]
    assert events.events[-1].exit_code == 1 and backend.managed() == {}


async def test_the_log_tail_of_an_unregistered_container_is_kept_fresh(
    make_backend: Callable[..., ContainerBackend], docker_state: Path
) -> None:
    backend = make_backend()
    await backend.spawn(spawn_request(backend.entry, AGENT), EventLog())
    assert backend.log_tail(AGENT) == []

    await backend.check_exits()

    assert backend.log_tail(AGENT) == [f"fake container cvy-{AGENT} started"]


async def test_destroy_stops_with_grace_then_removes_and_is_idempotent(
    make_backend: Callable[..., ContainerBackend], docker_state: Path
) -> None:
    backend = make_backend(options={"stop_timeout_s": 7})
    events = EventLog()
    agent = await backend.spawn(spawn_request(backend.entry, AGENT), events)

    await backend.destroy(AGENT, reason="job finished")
    await backend.destroy(AGENT, reason="again")
    await backend.destroy("never-spawned", reason="unknown")

    teardown = [argv for argv in commands(docker_state) if argv[0] in ("stop", "rm")]
    assert teardown == [["stop", "-t", "7", agent.backend_ref], ["rm", "-f", agent.backend_ref]]
    assert containers(docker_state) == {} and backend.managed() == {} and not backend.is_alive(AGENT)
    assert "failed" not in events.kinds()


async def test_destroying_a_container_someone_already_removed_succeeds(
    make_backend: Callable[..., ContainerBackend], docker_state: Path
) -> None:
    backend = make_backend()
    await backend.spawn(spawn_request(backend.entry, AGENT), EventLog())
    (docker_state / "state.json").write_text(json.dumps({"containers": {}, "images": [IMAGE]}))

    await backend.destroy(AGENT, reason="gone already")

    assert [argv[0] for argv in commands(docker_state)][-2:] == ["stop", "rm"]
    assert backend.managed() == {}


async def test_list_live_reports_every_managed_container_with_its_markers(
    make_backend: Callable[..., ContainerBackend], docker_state: Path
) -> None:
    backend = make_backend()
    mine = await backend.spawn(spawn_request(backend.entry, AGENT), EventLog())
    foreign_labels = {
        "conveyor.managed": "true",
        "conveyor.node": "node-b",
        "conveyor.boot": "boot-9",
        "conveyor.scaler": "docker",
        "conveyor.agent-id": OTHER_AGENT,
    }
    add_container(docker_state, f"cvy-{OTHER_AGENT}", foreign_labels)
    unlabelled = add_container(docker_state, "cvy-nolabel", {"conveyor.managed": "true"})
    add_container(docker_state, "someone-elses-db", {"app": "postgres"})

    items = {item.vm_id: item for item in await backend.list_live()}

    assert set(items) == {AGENT, OTHER_AGENT, unlabelled[:12]}
    assert items[AGENT].backend_ref == mine.backend_ref[:12] and items[AGENT].node_marker == "node-a"
    foreign = items[OTHER_AGENT]
    assert (foreign.kind, foreign.backend, foreign.node_marker, foreign.boot_marker, foreign.scaler) == (
        "container",
        "container",
        "node-b",
        "boot-9",
        "docker",
    )
    assert foreign.started_at is not None and items[unlabelled[:12]].agent_id is None


async def test_stop_live_ends_a_foreign_container_and_leaves_ours(
    make_backend: Callable[..., ContainerBackend], docker_state: Path
) -> None:
    backend = make_backend()
    await backend.spawn(spawn_request(backend.entry, AGENT), EventLog())
    add_container(
        docker_state, f"cvy-{OTHER_AGENT}", {"conveyor.managed": "true", "conveyor.agent-id": OTHER_AGENT}
    )
    (foreign,) = [item for item in await backend.list_live() if item.agent_id == OTHER_AGENT]

    await backend.stop_live(foreign)

    assert [c["name"] for c in containers(docker_state).values()] == [f"cvy-{AGENT}"]
    assert backend.is_alive(AGENT)


def test_validation_names_each_bad_field(tmp_path: Path, docker_state: Path) -> None:
    scaler = entry(
        "docker",
        "container",
        {"runtime": "lxc", "extra_hosts": ["no-colon"], "network": ""},
        {"image_pull_policy": "sometimes", "command": "conveyor agent"},
    )
    assert ContainerBackend.validate_entry(scaler) == [
        "runtime: must be auto, docker or podman (got 'lxc')",
        "extra_hosts: 'no-colon' must read NAME:IP",
        "network: must be a network name",
        "label_sets[0].image: required for a container scaler",
        "label_sets[0].image_pull_policy: must be always, if-not-present or never (got 'sometimes')",
        "label_sets[0].command: must be a list of strings",
    ]
    assert ContainerBackend.validate_entry(entry("docker", "container", {}, {"image": IMAGE})) == []


def test_validation_reports_a_missing_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    problems = ContainerBackend.validate_entry(
        entry("docker", "container", {"runtime": "podman"}, {"image": IMAGE})
    )
    assert problems == ["runtime: no container runtime found (docker or podman)"]


async def _async(value: object) -> object:
    return value


# --- a real runtime, when there is one ---------------------------------------------------------------

REAL_IMAGE = os.environ.get("CONVEYOR_TEST_CONTAINER_IMAGE", "busybox:latest")


def _working_runtime() -> str | None:
    for name in ("docker", "podman"):
        path = shutil.which(name)
        if path is None:
            continue
        try:
            version = subprocess.run([path, "version"], capture_output=True, timeout=20, check=False)
            image = subprocess.run(
                [path, "image", "inspect", REAL_IMAGE], capture_output=True, timeout=20, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if version.returncode == 0 and image.returncode == 0:
            return name
    return None


REAL_RUNTIME = _working_runtime()


@pytest.mark.skipif(REAL_RUNTIME is None, reason=f"needs a working docker/podman with {REAL_IMAGE} present")
async def test_a_real_container_is_started_listed_and_destroyed(tmp_path: Path) -> None:
    assert REAL_RUNTIME is not None
    scaler = entry(
        "real",
        "container",
        {"runtime": REAL_RUNTIME, "stop_timeout_s": 1},
        {"image": REAL_IMAGE, "image_pull_policy": "never", "command": ["sleep", "300"]},
    )
    backend = ContainerBackend(
        scaler, node_context(tmp_path, node_id=f"test-{os.getpid()}"), poll_interval_s=0.5
    )
    agent_id = f"0190f3a2-0000-7000-8000-{os.getpid():012d}"
    try:
        agent = await backend.spawn(spawn_request(scaler, agent_id), EventLog())
        listed = [item for item in await backend.list_live() if item.agent_id == agent_id]
        assert len(listed) == 1 and listed[0].node_marker == f"test-{os.getpid()}"
        assert agent.backend_ref.startswith(listed[0].backend_ref)
    finally:
        await backend.destroy(agent_id, reason="test over")
    assert not [item for item in await backend.list_live() if item.agent_id == agent_id]
