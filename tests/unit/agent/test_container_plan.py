"""The pure half of container jobs: labels, names, create bodies, the exec's argv and environment
(docs/design/containers.md §3–§5)."""

from __future__ import annotations

from pathlib import Path

from conveyor.agent.container_exec import container_environment, exec_argv, signal_argv
from conveyor.agent.container_plan import (
    KEEP_ALIVE,
    dead_local_agents,
    engine_address,
    exec_pid_file,
    image_path,
    job_container_config,
    resource_labels,
    resource_name,
    service_config,
    service_failure,
    signal_commands_argv,
    workspace_binds,
)
from conveyor.lockfile.models import ContainerEntry, ServiceEntry


def test_every_resource_carries_the_sweep_marker_the_job_and_the_agent() -> None:
    assert resource_labels("j1", "a1", "job") == {
        "conveyor.job-resource": "true",
        "conveyor.job": "j1",
        "conveyor.agent": "a1",
        "conveyor.role": "job",
    }
    assert resource_labels("j1", "a1", "service", "db")["conveyor.service"] == "db"


def test_names_keep_to_what_the_engine_accepts() -> None:
    assert resource_name("local-1/ci:a b") == "cvy-job-local-1-ci-a-b"
    assert resource_name("j1", "db") == "cvy-job-j1-db"


def test_the_engine_is_docker_host_else_the_default_socket() -> None:
    assert engine_address({"DOCKER_HOST": "unix:///run/user/1000/podman/podman.sock"}).endswith("podman.sock")
    assert engine_address({}) == "unix:///var/run/docker.sock"


def test_the_image_path_comes_from_its_config() -> None:
    assert image_path({"Config": {"Env": ["A=1", "PATH=/opt/bin:/bin"]}}) == "/opt/bin:/bin"
    assert image_path({"Config": {"Env": None}}).endswith("/usr/bin:/sbin:/bin")


def test_a_service_is_on_the_job_network_under_its_name_with_ports_on_loopback() -> None:
    entry = ServiceEntry(
        image="busybox",
        env={"A": "1"},
        ports=["8080:80"],
        command=["httpd", "-f"],
        health_cmd=None,
        health_interval_ms=1000,
        health_timeout_ms=60000,
    )
    config = service_config("web", entry, {"l": "v"}, "cvy-job-j1")
    assert config["NetworkingConfig"] == {"EndpointsConfig": {"cvy-job-j1": {"Aliases": ["web"]}}}
    assert config["HostConfig"]["PortBindings"] == {"80/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8080"}]}
    assert (config["Cmd"], config["Env"], config["Labels"]) == (["httpd", "-f"], ["A=1"], {"l": "v"})


def test_the_job_container_waits_with_the_workspace_at_its_own_path_and_its_options() -> None:
    entry = ContainerEntry(
        image="debian", env={"B": "2"}, options={"user": "1000", "memory": 1 << 20, "cpus": 0.5, "init": True}
    )
    config = job_container_config(
        entry, binds=["/w:/w"], workdir="/w/src", labels={"l": "v"}, network="cvy-job-j1"
    )
    assert [*config["Entrypoint"], *config["Cmd"]] == KEEP_ALIVE
    assert (config["WorkingDir"], config["User"], config["Env"]) == ("/w/src", "1000", ["B=2"])
    assert config["HostConfig"] == {
        "Binds": ["/w:/w"],
        "NetworkMode": "cvy-job-j1",
        "Memory": 1 << 20,
        "NanoCpus": 500_000_000,
        "Init": True,
    }


def test_a_linked_source_outside_the_workspace_is_mounted_too(tmp_path: Path) -> None:
    workspace, repo = tmp_path / "ws", tmp_path / "repo"
    workspace.mkdir()
    repo.mkdir()
    assert workspace_binds(workspace) == [f"{workspace}:{workspace}"]
    (workspace / "src").symlink_to(repo, target_is_directory=True)
    assert workspace_binds(workspace) == [f"{workspace}:{workspace}", f"{repo}:{repo}"]


def test_a_service_failure_names_it_with_its_last_log_lines() -> None:
    message = service_failure("db", "did not become healthy within 2s", [f"line {n}\n" for n in range(30)])
    first, *tail = message.splitlines()
    assert first == "service 'db' did not become healthy within 2s; its last 20 log line(s):"
    assert tail == [f"line {n}" for n in range(10, 30)]
    assert service_failure("db", "exited with code 1", []) == "service 'db' exited with code 1"


def test_commands_are_wrapped_to_record_their_pid_and_feed_stdin() -> None:
    assert exec_argv(["make", "test"], "/tmp/p", "")[3:] == ["sh", "/tmp/p", "", "argv", "make", "test"]
    wrapped = exec_argv("echo hi | wc -c", "/tmp/p", "/w/tmp/in")
    assert wrapped[:2] == ["sh", "-c"] and wrapped[3:] == [
        "sh",
        "/tmp/p",
        "/w/tmp/in",
        "shell",
        "echo hi | wc -c",
    ]
    assert "bash -e -o pipefail" in wrapped[2] and 'exec < "$in"' in wrapped[2]
    assert (
        signal_argv("/tmp/p", "TERM")[-1] == "/tmp/p" and "kill -TERM -" in signal_argv("/tmp/p", "TERM")[2]
    )


def test_the_container_sees_its_own_path_home_and_user_with_the_jobs_path_additions() -> None:
    step_env = {
        "PATH": "/w/tools:/usr/host/bin:/bin",
        "HOME": "/home/agent",
        "USER": "agent",
        "CI": "true",
        "CONVEYOR_JOB": "test",
    }
    container = {"image_path": "/usr/local/bin:/usr/bin", "host_path": "/usr/host/bin:/bin"}
    assert container_environment(step_env, container) == {
        "PATH": "/w/tools:/usr/local/bin:/usr/bin",
        "CI": "true",
        "CONVEYOR_JOB": "test",
    }
    assert container_environment({"PATH": "/elsewhere"}, container) == {"PATH": "/usr/local/bin:/usr/bin"}


def test_a_steps_commands_are_found_by_the_tag_of_their_pid_files() -> None:
    assert exec_pid_file("3-1", "abc") == "/tmp/.conveyor-exec-3-1-abc.pid"
    assert exec_pid_file(None, "abc") == "/tmp/.conveyor-exec-untagged-abc.pid"
    argv = signal_commands_argv("3-1", "TERM")
    assert argv[-1] == "3-1" and '/tmp/.conveyor-exec-"$1"-*.pid' in argv[2] and "kill -TERM -" in argv[2]


def test_dead_local_agents_are_this_hosts_local_runners_whose_pid_is_gone() -> None:
    alive = {10, 11}.__contains__
    ids = [
        "local-ci-box-7",  # this host, pid gone
        "local-ci-box-10",  # this host, alive
        "local-other-7",  # another host
        "local-ci-box-x7",  # not a pid
        "local-ci-box-0",  # never a runner's pid
        "0190f3a2-0000-7000-8000-000000000001",  # an agent's id: its own sweep's
        "local-ci-box-",
    ]
    assert dead_local_agents(ids, "ci-box", alive) == {"local-ci-box-7"}
    assert dead_local_agents(ids, "other", alive) == {"local-other-7"}
    assert dead_local_agents([], "ci-box", alive) == set()
