"""The container backend against the test run's real Docker engine (tests/support/docker.py).

No registry is reachable here, so "a pull happens" is shown by an image reference whose registry is a closed
port on this machine: a pull of it fails at once, and only a pull can fail that way. Each test stamps its
containers with a node id of its own, so tests running at once on one engine never see each other's.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiodocker
import pytest

from conveyor.scaler.backend import Limits, SpawnFailed
from conveyor.scaler.container import ContainerBackend, label_filters
from tests.support.docker import DockerEngine
from tests.support.scaler_backends import TOKEN, EventLog, entry, node_context, spawn_request
from tests.support.waiting import async_wait_until

# A registry address where nothing listens: pulling from it fails at once (connection refused).
CLOSED_REGISTRY = "127.0.0.1:9"
SLEEP = ["sleep", "300"]


def new_agent_id() -> str:
    return f"0190f3a2-0000-7000-8000-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def node_id() -> str:
    return f"test-node-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def make_backend(
    tmp_path: Path, docker_engine: DockerEngine, docker: aiodocker.Docker, node_id: str
) -> AsyncIterator[Callable[..., ContainerBackend]]:
    """Builds container backends on the test engine; afterwards every container of this test's node is gone."""
    made: list[ContainerBackend] = []

    def build(
        *,
        options: dict | None = None,
        image: str | None = None,
        image_policy: str | None = None,
        command: list[str] | None = SLEEP,
        poll_interval_s: float = 60.0,
        engine: bool = True,
    ) -> ContainerBackend:
        label_set_options: dict = {"image": image or docker_engine.busybox}
        if image_policy is not None:
            label_set_options["image_pull_policy"] = image_policy
        if command is not None:
            label_set_options["command"] = command
        scaler_options = {
            "stop_timeout_s": 1,
            **({"engine": docker_engine.host} if engine else {}),
            **(options or {}),
        }
        scaler = entry("docker", "container", scaler_options, label_set_options)
        backend = ContainerBackend(
            scaler, node_context(tmp_path / "home", node_id=node_id), poll_interval_s=poll_interval_s
        )
        made.append(backend)
        return backend

    yield build
    for backend in made:
        await backend.shutdown_all()
    for container in await docker.containers.list(
        all="1", filters=label_filters([f"conveyor.node={node_id}"])
    ):
        await container.delete(force=True)


async def node_containers(docker: aiodocker.Docker, node_id: str) -> list[dict]:
    """The containers (inspected) stamped with `node_id`."""
    listed = await docker.containers.list(all="1", filters=label_filters([f"conveyor.node={node_id}"]))
    return [await container.show() for container in listed]


async def test_spawn_starts_a_labelled_container_with_the_agent_env_and_limits(
    make_backend: Callable[..., ContainerBackend], docker: aiodocker.Docker, node_id: str
) -> None:
    backend = make_backend()
    agent_id = new_agent_id()
    request = spawn_request(backend.entry, agent_id, limits=Limits(cpus=1.5, mem_bytes=64 * 1024**2))

    agent = await backend.spawn(request, EventLog())

    (shown,) = await node_containers(docker, node_id)
    assert shown["Id"] == agent.backend_ref and shown["Name"] == f"/cvy-{agent_id}"
    assert shown["State"]["Running"] and agent.state == "running" and backend.is_alive(agent_id)
    labels = shown["Config"]["Labels"]
    # (The image's own labels, conveyor.test-*, are inherited by every container of it.)
    assert {key: value for key, value in labels.items() if not key.startswith("conveyor.test-")} == {
        "conveyor.managed": "true",
        "conveyor.node": node_id,
        "conveyor.boot": "boot-1",
        "conveyor.scaler": "docker",
        "conveyor.agent-id": agent_id,
        "conveyor.job-id": "job-1",
        "conveyor.run-id": "run-1",
    }
    host = shown["HostConfig"]
    assert (host["NanoCpus"], host["Memory"]) == (1_500_000_000, 64 * 1024**2)
    assert host["ExtraHosts"] == ["host.docker.internal:host-gateway"]
    env = dict(item.split("=", 1) for item in shown["Config"]["Env"])
    assert env["CONVEYOR_AGENT_TOKEN"] == TOKEN and env["CONVEYOR_AGENT_ID"] == agent_id
    assert env["PIP_INDEX_URL"] == "https://pypi.internal/simple"
    # Loopback inside a container is the container: the agent dials the host gateway name instead.
    assert env["CONVEYOR_AGENT_URL"] == "ws://host.docker.internal:8470/ws"
    assert shown["Config"]["Cmd"] == SLEEP and TOKEN not in " ".join(shown["Args"] + [shown["Path"]])
    assert backend.runtime_name == "docker"


async def test_options_become_the_containers_network_volumes_and_extra_hosts(
    make_backend: Callable[..., ContainerBackend], docker: aiodocker.Docker, node_id: str, tmp_path: Path
) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "hello").write_text("from the host\n")
    backend = make_backend(
        options={
            "network": "host",
            "extra_hosts": ["git.internal:10.0.0.9"],
            "volumes": [f"{tmp_path / 'cache'}:/cache:ro"],
        },
        command=["sh", "-c", "cat /cache/hello; grep git.internal /etc/hosts; sleep 300"],
    )
    agent_id = new_agent_id()
    await backend.spawn(spawn_request(backend.entry, agent_id), EventLog())

    (shown,) = await node_containers(docker, node_id)
    assert shown["HostConfig"]["NetworkMode"] == "host"
    assert shown["HostConfig"]["ExtraHosts"] == ["git.internal:10.0.0.9"], (
        "no gateway name on the host network"
    )
    env = dict(item.split("=", 1) for item in shown["Config"]["Env"])
    assert env["CONVEYOR_AGENT_URL"] == "ws://127.0.0.1:8470/ws"
    await backend.check_exits()  # refreshes the log tail of the unregistered agent
    lines = await async_wait_until(
        lambda: _refreshed_tail(backend, agent_id, 2), timeout=30, what="the container's first output lines"
    )
    assert lines[0] == "from the host" and lines[1].split() == ["10.0.0.9", "git.internal"]


async def _refreshed_tail(backend: ContainerBackend, agent_id: str, lines: int) -> list[str] | None:
    await backend.check_exits()
    tail = backend.log_tail(agent_id)
    return tail if len(tail) >= lines else None


async def test_if_not_present_starts_a_present_image_without_pulling(
    make_backend: Callable[..., ContainerBackend],
) -> None:
    """No registry answers here: a pull would have failed the spawn."""
    backend = make_backend(image_policy="if-not-present")
    agent = await backend.spawn(spawn_request(backend.entry, new_agent_id()), EventLog())
    assert agent.state == "running"


async def test_if_not_present_pulls_a_missing_image_and_a_failed_pull_fails_the_spawn(
    make_backend: Callable[..., ContainerBackend], docker: aiodocker.Docker, node_id: str
) -> None:
    image = f"{CLOSED_REGISTRY}/conveyor-test/absent:1"
    backend = make_backend(image=image, image_policy="if-not-present")

    with pytest.raises(SpawnFailed, match=rf"image pull failed for {image}: .*connection refused"):
        await backend.spawn(spawn_request(backend.entry, new_agent_id()), EventLog())

    assert backend.managed() == {} and await node_containers(docker, node_id) == []


async def test_always_pulls_even_a_present_image(
    make_backend: Callable[..., ContainerBackend], docker: aiodocker.Docker, docker_engine: DockerEngine
) -> None:
    repository = f"{CLOSED_REGISTRY}/conveyor-test/busybox-{uuid.uuid4().hex[:8]}"
    await docker.images.tag(docker_engine.busybox, repository, tag="test")
    try:
        backend = make_backend(image=f"{repository}:test", image_policy="always")
        with pytest.raises(SpawnFailed, match="image pull failed for"):
            await backend.spawn(spawn_request(backend.entry, new_agent_id()), EventLog())
        never = make_backend(image=f"{repository}:test", image_policy="never")
        assert (await never.spawn(spawn_request(never.entry, new_agent_id()), EventLog())).state == "running"
    finally:
        await docker.images.delete(f"{repository}:test")


async def test_never_does_not_pull_and_a_missing_image_fails_the_run(
    make_backend: Callable[..., ContainerBackend], docker: aiodocker.Docker, node_id: str
) -> None:
    image = f"{CLOSED_REGISTRY}/conveyor-test/absent:1"
    backend = make_backend(image=image, image_policy="never")

    with pytest.raises(SpawnFailed, match=r"container run failed: No such image"):
        await backend.spawn(spawn_request(backend.entry, new_agent_id()), EventLog())

    assert backend.managed() == {} and await node_containers(docker, node_id) == []


async def test_a_container_that_cannot_start_is_a_failed_spawn_and_is_removed(
    make_backend: Callable[..., ContainerBackend], docker: aiodocker.Docker, node_id: str
) -> None:
    backend = make_backend(command=["/no/such/agent"])

    with pytest.raises(SpawnFailed, match=r"container run failed: .*/no/such/agent"):
        await backend.spawn(spawn_request(backend.entry, new_agent_id()), EventLog())

    assert backend.managed() == {} and await node_containers(docker, node_id) == []


def refusing_socket(path: Path) -> socket.socket:
    """A unix socket file nobody accepts on: connecting to it is refused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


async def test_an_engine_that_does_not_answer_fails_the_spawn_with_the_reason(
    make_backend: Callable[..., ContainerBackend], tmp_path: Path
) -> None:
    with refusing_socket(tmp_path / "dead.sock"):
        backend = make_backend(options={"engine": f"unix://{tmp_path / 'dead.sock'}"})
        with pytest.raises(SpawnFailed, match=r"no container engine found") as raised:
            await backend.spawn(spawn_request(backend.entry, new_agent_id()), EventLog())

    assert "dead.sock" in raised.value.detail and backend.managed() == {}


async def test_podman_runtime_skips_an_engine_that_does_not_answer_and_takes_the_next(
    make_backend: Callable[..., ContainerBackend],
    docker_engine: DockerEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CONTAINER_HOST first, then $XDG_RUNTIME_DIR/podman/podman.sock (here a link to the test engine)."""
    (tmp_path / "run" / "podman").mkdir(parents=True)
    (tmp_path / "run" / "podman" / "podman.sock").symlink_to(docker_engine.host.removeprefix("unix://"))
    with refusing_socket(tmp_path / "dead.sock"):
        monkeypatch.setenv("CONTAINER_HOST", f"unix://{tmp_path / 'dead.sock'}")
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
        backend = make_backend(options={"runtime": "podman"}, engine=False)
        await backend.spawn(spawn_request(backend.entry, new_agent_id()), EventLog())

    assert backend.engine_address == f"unix://{tmp_path / 'run' / 'podman' / 'podman.sock'}"
    assert backend.runtime_name == "docker", "the engine behind the socket says what it is"


async def test_an_exit_before_registration_is_a_failed_spawn_with_exit_code_and_log_tail(
    make_backend: Callable[..., ContainerBackend], docker: aiodocker.Docker, node_id: str
) -> None:
    backend = make_backend(
        poll_interval_s=0.1, command=["sh", "-c", "echo 'agent: cannot reach orchestrator'; exit 3"]
    )
    events = EventLog()
    await backend.spawn(spawn_request(backend.entry, new_agent_id()), events)

    failed = await async_wait_until(
        lambda: _async(events.last("failed")), timeout=30, what="the failed event from the exit watch"
    )

    assert failed.exit_code == 3 and "before the agent registered" in failed.detail
    assert "agent: cannot reach orchestrator" in failed.log_tail
    assert backend.managed() == {} and await node_containers(docker, node_id) == [], (
        "the exited one is removed"
    )


async def test_an_exit_after_registration_is_a_disconnect_not_a_failure(
    make_backend: Callable[..., ContainerBackend], docker: aiodocker.Docker, node_id: str
) -> None:
    backend = make_backend(command=["sh", "-c", "read line; exit 1"])  # stdin is closed: exits at once
    events = EventLog()
    agent_id = new_agent_id()
    await backend.spawn(spawn_request(backend.entry, agent_id), events)
    backend.mark_registered(agent_id)

    await async_wait_until(
        lambda: _checked(backend, events), timeout=30, what="the exit to be seen after registration"
    )

    assert events.kinds() == ["provisioning", "exited"] and events.events[-1].exit_code == 1
    assert backend.managed() == {} and await node_containers(docker, node_id) == []


async def _checked(backend: ContainerBackend, events: EventLog) -> bool:
    await backend.check_exits()
    return "exited" in events.kinds()


async def test_destroy_stops_with_sigterm_then_removes_and_is_idempotent(
    make_backend: Callable[..., ContainerBackend], docker: aiodocker.Docker, node_id: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    backend = make_backend(
        options={"stop_timeout_s": 30, "volumes": [f"{out}:/out"]},
        command=[
            "sh",
            "-c",
            "trap 'echo term > /out/signal; exit 0' TERM; echo up > /out/up; while :; do sleep 0.1; done",
        ],
    )
    events = EventLog()
    agent_id = new_agent_id()
    await backend.spawn(spawn_request(backend.entry, agent_id), events)
    await async_wait_until(lambda: _async((out / "up").exists()), timeout=30, what="the trap to be set")

    await backend.destroy(agent_id, reason="job finished")
    await backend.destroy(agent_id, reason="again")
    await backend.destroy("never-spawned", reason="unknown")

    assert (out / "signal").read_text() == "term\n", "the container was asked to stop before it was removed"
    assert await node_containers(docker, node_id) == [] and backend.managed() == {}
    assert not backend.is_alive(agent_id) and "failed" not in events.kinds()


async def test_destroying_a_container_someone_already_removed_succeeds(
    make_backend: Callable[..., ContainerBackend], docker: aiodocker.Docker
) -> None:
    backend = make_backend()
    agent_id = new_agent_id()
    agent = await backend.spawn(spawn_request(backend.entry, agent_id), EventLog())
    await docker.containers.container(agent.backend_ref).delete(force=True)

    await backend.destroy(agent_id, reason="gone already")

    assert backend.managed() == {}


async def test_list_live_reports_every_managed_container_with_its_markers(
    make_backend: Callable[..., ContainerBackend],
    docker: aiodocker.Docker,
    docker_engine: DockerEngine,
    node_id: str,
) -> None:
    backend = make_backend()
    mine_id, foreign_id = new_agent_id(), new_agent_id()
    mine = await backend.spawn(spawn_request(backend.entry, mine_id), EventLog())
    foreign_labels = {
        "conveyor.managed": "true",
        "conveyor.node": f"{node_id}-b",
        "conveyor.boot": "boot-9",
        "conveyor.scaler": "docker",
        "conveyor.agent-id": foreign_id,
    }
    made = [
        await docker.containers.run({"Image": docker_engine.busybox, "Cmd": SLEEP, "Labels": labels})
        for labels in (
            foreign_labels,
            {"conveyor.managed": "true", "conveyor.node": node_id},
            {"app": node_id},
        )
    ]
    try:
        foreign, unlabelled, unmanaged = (container.id for container in made)
        items = {item.vm_id: item for item in await backend.list_live()}

        assert {mine_id, foreign_id, unlabelled} <= set(items) and unmanaged not in items
        assert items[mine_id].backend_ref == mine.backend_ref and items[mine_id].node_marker == node_id
        item = items[foreign_id]
        assert (
            item.kind,
            item.backend,
            item.backend_ref,
            item.node_marker,
            item.boot_marker,
            item.scaler,
        ) == (
            "container",
            "container",
            foreign,
            f"{node_id}-b",
            "boot-9",
            "docker",
        )
        assert item.started_at is not None and items[unlabelled].agent_id is None
    finally:
        for container in made:
            await container.delete(force=True)


async def test_stop_live_ends_a_foreign_container_and_leaves_ours(
    make_backend: Callable[..., ContainerBackend],
    docker: aiodocker.Docker,
    docker_engine: DockerEngine,
    node_id: str,
) -> None:
    backend = make_backend()
    mine_id, foreign_id = new_agent_id(), new_agent_id()
    await backend.spawn(spawn_request(backend.entry, mine_id), EventLog())
    await docker.containers.run(
        {
            "Image": docker_engine.busybox,
            "Cmd": SLEEP,
            "Labels": {"conveyor.managed": "true", "conveyor.node": node_id, "conveyor.agent-id": foreign_id},
        },
        name=f"cvy-{foreign_id}",
    )
    (foreign,) = [item for item in await backend.list_live() if item.agent_id == foreign_id]

    await backend.stop_live(foreign)

    assert [shown["Name"] for shown in await node_containers(docker, node_id)] == [f"/cvy-{mine_id}"]
    assert backend.is_alive(mine_id)


async def _async(value: object) -> object:
    await asyncio.sleep(0)
    return value


async def leave_job_resources(docker: aiodocker.Docker, engine: DockerEngine, agent_id: str) -> None:
    """A job container and network as a runner of `agent_id` labels them (what a `kill -9` leaves)."""
    labels = {"conveyor.job-resource": "true", "conveyor.agent": agent_id, "conveyor.job": "j1"}
    network = f"cvy-job-test-{uuid.uuid4().hex[:10]}"
    await docker.networks.create({"Name": network, "Labels": {**labels, "conveyor.role": "network"}})
    await docker.containers.run(
        {
            "Image": engine.busybox,
            "Cmd": SLEEP,
            "Labels": {**labels, "conveyor.role": "job"},
            "HostConfig": {"NetworkMode": network},
        },
        name=f"{network}-job",
    )


async def job_resources(docker: aiodocker.Docker, agent_id: str) -> tuple[list, list]:
    labels = ["conveyor.job-resource=true", f"conveyor.agent={agent_id}"]
    listed = await docker.containers.list(all="1", filters=label_filters(labels))
    return listed, await docker.networks.list(filters={"label": labels})


@pytest.mark.parametrize("end", ["destroy", "exit", "orphan stop"])
async def test_ending_an_agent_removes_the_job_containers_and_networks_it_left(
    make_backend: Callable[..., ContainerBackend],
    docker: aiodocker.Docker,
    docker_engine: DockerEngine,
    node_id: str,
    end: str,
) -> None:
    backend = make_backend()
    agent_id, other_id = new_agent_id(), new_agent_id()
    agent = await backend.spawn(spawn_request(backend.entry, agent_id), EventLog())
    await leave_job_resources(docker, docker_engine, agent_id)
    await leave_job_resources(docker, docker_engine, other_id)  # an agent still running elsewhere
    try:
        assert [len(found) for found in await job_resources(docker, agent_id)] == [1, 1]

        if end == "destroy":
            await backend.destroy(agent_id, reason="job finished")
        elif end == "exit":
            await docker.containers.container(agent.backend_ref).kill()
            await backend.check_exits()
        else:
            backend._agents.clear()  # a container of an older life of the scaler: only the listing knows it
            (item,) = [item for item in await backend.list_live() if item.agent_id == agent_id]
            await backend.stop_live(item)

        assert await job_resources(docker, agent_id) == ([], [])
        assert [len(found) for found in await job_resources(docker, other_id)] == [1, 1]
    finally:
        for leaver in (agent_id, other_id):
            listed, networks = await job_resources(docker, leaver)
            for container in listed:
                await container.delete(force=True)
            for network in networks:
                await aiodocker.networks.DockerNetwork(docker, network["Id"]).delete()
