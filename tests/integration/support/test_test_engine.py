"""The test run's Docker engine (scripts/ensure-docker.sh) runs the suite's offline-built images."""

from __future__ import annotations

import asyncio
import uuid

import aiodocker

from tests.support.docker import DockerEngine
from tests.support.processes import free_port


async def run_to_end(docker: aiodocker.Docker, config: dict) -> tuple[int, str]:
    """Run a container to its end; its exit code and output. The container is removed either way."""
    container = await docker.containers.run(config, name=f"cvy-test-{uuid.uuid4().hex[:12]}")
    try:
        status = await asyncio.wait_for(container.wait(), timeout=60)
        output = "".join(await container.log(stdout=True, stderr=True))
        return int(status["StatusCode"]), output
    finally:
        await container.delete(force=True)


async def test_the_busybox_image_has_its_applets(
    docker: aiodocker.Docker, docker_engine: DockerEngine
) -> None:
    code, output = await run_to_end(
        docker,
        {
            "Image": docker_engine.busybox,
            "Cmd": [
                "sh",
                "-c",
                "for f in /usr/bin/wget /usr/sbin/httpd /usr/bin/nslookup; do readlink $f; done; echo $((6 * 7))",
            ],
        },
    )
    assert code == 0, output
    assert output.split() == ["/bin/busybox"] * 3 + ["42"]


async def test_the_debian_image_has_python_with_its_standard_library_and_git(
    docker: aiodocker.Docker, docker_engine: DockerEngine
) -> None:
    script = "import asyncio, json, ssl, sqlite3, sys; print('python', *sys.version_info[:2])"
    code, output = await run_to_end(
        docker,
        {
            "Image": docker_engine.debian,
            "Cmd": [
                "sh",
                "-c",
                f'python3 -c "{script}" && git --version && grep ^VERSION_CODENAME /etc/os-release',
            ],
        },
    )
    assert code == 0, output
    lines = output.splitlines()
    assert lines[0] == "python 3 11" and lines[1].startswith("git version 2.")
    assert lines[2] == "VERSION_CODENAME=bookworm"


async def test_a_container_on_the_host_network_reaches_a_server_on_loopback(
    docker: aiodocker.Docker, docker_engine: DockerEngine
) -> None:
    """What agent containers rely on: with host networking, 127.0.0.1 is the host's (test servers bind it)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 13\r\n\r\nfrom the host")
        await writer.drain()
        writer.close()

    port = free_port()
    server = await asyncio.start_server(answer, "127.0.0.1", port)
    async with server:
        code, output = await run_to_end(
            docker,
            {
                "Image": docker_engine.busybox,
                "Cmd": ["wget", "-qO-", f"http://127.0.0.1:{port}/"],
                "HostConfig": {"NetworkMode": "host"},
            },
        )
    assert (code, output) == (0, "from the host")
