"""`container=` and `services=`: validation at declaration, the lock shape, the v1 upgrade and preview's plan
(docs/design/containers.md §1–§2). Pure: nothing here talks to an engine."""

from __future__ import annotations

import json
import textwrap

import pytest

from conveyor import AuthoringError, Container, Service, job
from conveyor.lockfile import compile_repository, parse_lock
from conveyor.lockfile.upgrade import upgrade_lock_json
from conveyor.matching import plan_workflow
from conveyor.matching.event import Event


def _error(declare) -> AuthoringError:
    with pytest.raises(AuthoringError) as excinfo:
        declare()
    return excinfo.value


def test_a_plain_image_string_is_a_container_with_no_env_or_options() -> None:
    declared = job("a", runs_on="linux", container="python:3.12", run=lambda ctx: None)
    assert declared.container == Container("python:3.12")
    assert (declared.container.env, declared.container.options) == ({}, {})
    assert declared.services == {}


def test_container_options_are_checked_and_normalised() -> None:
    container = Container(
        "debian:bookworm",
        env={"LANG": "C.UTF-8"},
        options={
            "user": "1000:1000",
            "network": "host",
            "memory": "512m",
            "cpus": 1.5,
            "shm_size": 2048,
            "init": True,
        },
    )
    assert container.options == {
        "user": "1000:1000",
        "network": "host",
        "memory": 512 << 20,
        "cpus": 1.5,
        "shm_size": 2048,
        "init": True,
    }


def test_an_unknown_container_option_is_refused_naming_the_nearest() -> None:
    error = _error(lambda: Container("alpine", options={"privilegd": True}))
    assert error.code == "E120"
    assert "'privilegd' is not supported" in error.message
    assert "known: user, network, memory, cpus, shm_size, init" in error.message
    error = _error(lambda: Container("alpine", options={"usr": "1000"}))
    assert "did you mean 'user'?" in error.message


@pytest.mark.parametrize(
    ("declare", "fragment"),
    [
        (lambda: Container(""), "is not an image reference"),
        (lambda: Container("has space"), "is not an image reference"),
        (lambda: Container("alpine", options={"network": "none"}), "network must be one of bridge, host"),
        (lambda: Container("alpine", options={"memory": "lots"}), "is not a size"),
        (lambda: Container("alpine", options={"memory": 0}), "greater than zero"),
        (lambda: Container("alpine", options={"cpus": True}), "cpus must be a positive number"),
        (lambda: Container("alpine", options={"user": "a b"}), "user must be"),
        (lambda: Container("alpine", options={"init": "yes"}), "init must be True or False"),
        (lambda: Service("busybox", ports=["80:x"]), "port '80:x'"),
        (lambda: Service("busybox", ports=[70000]), "port 70000"),
        (lambda: Service("busybox", command=[]), "command must be"),
        (lambda: Service("busybox", health_cmd="  "), "health_cmd must be"),
        (lambda: job("a", runs_on="l", container=3), "container= must be an image string"),
        (lambda: job("a", runs_on="l", services={"Web": Service("busybox")}), "must be a DNS label"),
        (lambda: job("a", runs_on="l", services={"web": 3}), "must be Service(...)"),
        (lambda: job("a", runs_on="l", services=["web"]), "services= must be a mapping"),
        (
            lambda: job(
                "a", runs_on="l", container=Container("x", options={"network": "host"}), services={"db": "y"}
            ),
            "services need the job's own network",
        ),
    ],
)
def test_malformed_containers_and_services_are_e121(declare, fragment: str) -> None:
    error = _error(declare)
    assert error.code == "E121", error
    assert fragment in error.message


@pytest.mark.parametrize("name", ["PATH", "CONVEYOR_X", "1A"])
def test_container_and_service_env_names_follow_the_job_env_rules(name: str) -> None:
    assert _error(lambda: Container("alpine", env={name: "x"})).code == "E115"
    assert _error(lambda: Service("alpine", env={name: "x"})).code == "E115"


def test_service_defaults_ports_command_and_durations() -> None:
    service = Service("busybox", ports=[8080, "15432:5432"], command="httpd -f", health_timeout="5s")
    assert service.ports == ("8080:8080", "15432:5432")
    assert service.command == ("sh", "-c", "httpd -f")
    assert (service.health_cmd, service.health_interval_ms, service.health_timeout_ms) == (None, 1000, 5000)
    assert Service("busybox", command=["httpd", "-f"]).command == ("httpd", "-f")
    assert _error(lambda: Service("busybox", health_timeout="soon")).code == "E113"


WORKFLOW = textwrap.dedent(
    """\
    from conveyor import Container, Service, push, workflow

    ci = workflow("ci", on=push(branches=["main"]))

    @ci.job(
        runs_on="docker",
        container=Container("debian:bookworm", env={"A": "1"}, options={"user": "1000"}),
        services={"web": Service("busybox", command=["httpd", "-f"], health_cmd="wget -q -O- localhost")},
    )
    def test(ctx):
        ctx.sh("cat /etc/os-release")

    @ci.job(runs_on="linux")
    def host(ctx):
        ctx.sh("true")
    """
)


def test_the_lock_carries_container_and_services_and_reads_back(repo, write_workflow) -> None:
    write_workflow("ci", WORKFLOW)
    result = compile_repository(repo)
    assert result.ok, result.errors
    document = json.loads(result.lock_bytes)
    test_job, host_job = document["workflows"][0]["jobs"]
    assert test_job["container"] == {
        "image": "debian:bookworm",
        "env": {"A": "1"},
        "options": {"user": "1000"},
    }
    assert test_job["services"] == {
        "web": {
            "image": "busybox",
            "env": {},
            "ports": [],
            "command": ["httpd", "-f"],
            "health_cmd": "wget -q -O- localhost",
            "health_interval_ms": 1000,
            "health_timeout_ms": 60000,
        }
    }
    # Every field is always written: a host job says so with null and {}.
    assert (host_job["container"], host_job["services"]) == (None, {})
    assert parse_lock(result.lock_bytes) == result.lock


def test_preview_plans_name_the_image_and_the_services(repo, write_workflow) -> None:
    write_workflow("ci", WORKFLOW)
    (workflow,) = compile_repository(repo).lock.workflows
    event = Event.model_validate({"type": "push", "repo": "o/r", "branch": "main", "sha": "a" * 40})
    planned = {job.job: job for job in plan_workflow(workflow, event).jobs}
    assert planned["test"].container == "debian:bookworm"
    assert planned["test"].services == (("web", "busybox"),)
    assert (planned["host"].container, planned["host"].services) == (None, ())


def test_a_v1_lock_upgrades_to_jobs_on_the_host() -> None:
    v1 = {"schema_version": 1, "workflows": [{"name": "ci", "jobs": [{"name": "a"}, {"name": "b"}]}]}
    upgraded = upgrade_lock_json(json.loads(json.dumps(v1)), to_version=2)
    assert upgraded["schema_version"] == 2
    assert [(job["container"], job["services"]) for job in upgraded["workflows"][0]["jobs"]] == [
        (None, {})
    ] * 2
    assert v1["workflows"][0]["jobs"][0] == {"name": "a"}  # the input is not modified


def test_preview_text_names_the_image_and_the_services(repo, write_workflow) -> None:
    from conveyor.cli.authoring_render import _plan_json, _plan_lines

    write_workflow("ci", WORKFLOW)
    (workflow,) = compile_repository(repo).lock.workflows
    event = Event.model_validate({"type": "push", "repo": "o/r", "branch": "main", "sha": "a" * 40})
    plan = plan_workflow(workflow, event)
    lines = _plan_lines(plan)
    assert "        test: runs_on docker; container debian:bookworm; services web (busybox)" in lines
    assert "        host: runs_on linux" in lines
    jobs = {job["job"]: job for job in _plan_json(plan)["jobs"]}
    assert (jobs["test"]["container"], jobs["test"]["services"]) == ("debian:bookworm", {"web": "busybox"})
