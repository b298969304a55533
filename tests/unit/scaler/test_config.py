"""`scalers.yaml` validation (docs/design/scaler.md §4): every problem names the file, the scaler and the
field."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from conveyor.scaler.backend import Limits, ScalerBackend, ScalerEntry
from conveyor.scaler.bare_metal import BareMetalBackend
from conveyor.scaler.config import (
    Host,
    ScalerConfigError,
    builtin_local,
    builtin_local_notice,
    load_config,
    parse_config,
    parse_memory,
    read_documents,
)

HOST = Host(os="linux", arch="x86_64", platform="linux")


class StubVm(ScalerBackend):
    """A backend type with its own keys (the real ones check the host, which a pure test must not)."""

    type: ClassVar[str] = "firecracker"
    scaler_keys: ClassVar[frozenset[str]] = frozenset({"kernel_path"})
    label_set_keys: ClassVar[frozenset[str]] = frozenset({"rootfs_path"})

    @classmethod
    def validate_entry(cls, entry: ScalerEntry) -> list[str]:
        return [] if entry.options.get("kernel_path") else ["kernel_path: required"]

    async def spawn(self, request: Any, on_event: Any) -> Any:
        raise NotImplementedError

    async def destroy(self, agent_id: str, *, reason: str, grace_s: float | None = None) -> None:
        return None

    def mark_registered(self, agent_id: str) -> None:
        return None

    def is_alive(self, agent_id: str) -> bool:
        return False

    async def list_live(self) -> list[Any]:
        return []

    async def stop_live(self, item: Any) -> None:
        return None

    def managed(self) -> dict[str, Any]:
        return {}


REGISTRY = {"bare-metal": BareMetalBackend, "firecracker": StubVm}


def parse(text: str, *extra: tuple[str, str]) -> Any:
    documents = [("main.yaml", yaml.safe_load(text), True)]
    documents += [(name, yaml.safe_load(body), False) for name, body in extra]
    return parse_config(documents, host=HOST, registry=REGISTRY)


def problems(text: str, *extra: tuple[str, str]) -> list[str]:
    with pytest.raises(ScalerConfigError) as caught:
        parse(text, *extra)
    return caught.value.problems


VALID = """
version: 1
global_max_agents: 20
global_resource_cap: {cpus: 16, memory: 32g}
defaults: {resources: {cpus: 1, memory: 1g}}
scalers:
  - name: local
    type: bare-metal
    max_agents: 4
    command: [/usr/local/bin/conveyor, agent]
    warm_pool: {size: 1, idle_timeout_s: 300}
    label_sets:
      - labels: [Linux, small]
        resources: {requests: {cpus: 1, memory: 2g}, limits: {cpus: 2, memory: 4g}}
        env: {PIP_INDEX_URL: "https://pypi.internal/simple"}
  - name: vms
    type: firecracker
    max_agents: 10
    mandatory_labels: [isolated]
    kernel_path: /var/lib/vmlinux
    max_concurrent_spawns: 2
    label_sets:
      - labels: [linux, isolated]
        rootfs_path: /var/lib/rootfs.ext4
"""


def test_a_valid_file_gives_every_field() -> None:
    config = parse(VALID)
    assert config.global_max_agents == 20
    assert config.global_resource_cap.request_cpus == 16
    assert config.global_resource_cap.request_mem_bytes == 32 * 1024**3
    assert config.default_resources.request_mem_bytes == 1024**3
    local, vms = config.entries
    assert (local.name, local.type, local.max_agents, local.warm_pool_size) == ("local", "bare-metal", 4, 1)
    assert local.options["command"] == ["/usr/local/bin/conveyor", "agent"]
    label_set = local.label_sets[0]
    assert label_set.labels == ("linux", "small")
    assert label_set.all_labels == ("conveyor:arch:x86_64", "conveyor:os:linux", "linux", "small")
    assert label_set.resources is not None
    assert label_set.resources.request_mem_bytes == 2 * 1024**3
    assert label_set.resources.limits == Limits(cpus=2.0, mem_bytes=4 * 1024**3)
    assert label_set.env == {"PIP_INDEX_URL": "https://pypi.internal/simple"}
    assert vms.mandatory_labels == ("isolated",)
    assert vms.max_concurrent_spawns == 2
    assert vms.label_sets[0].options == {"rootfs_path": "/var/lib/rootfs.ext4"}
    assert vms.options == {"kernel_path": "/var/lib/vmlinux"}


def scaler(body: str, head: str = "version: 1\nscalers:\n") -> str:
    return head + body


BARE = """  - name: local
    type: bare-metal
    max_agents: 2
    label_sets:
      - labels: [linux]
"""

# (file text, a fragment every problem list must contain)
INVALID = [
    ("scalers: []\n", "main.yaml: version: required and must be 1"),
    ("version: 2\nscalers: []\n", "main.yaml: version: required and must be 1"),
    ("version: 1\nscalers: []\nextra: 1\n", "main.yaml: unknown key extra"),
    ("version: 1\nglobal_max_agents: 0\n", "main.yaml: global_max_agents: must be an integer ≥ 1"),
    ("version: 1\nscalers: {}\n", "main.yaml: scalers: must be a list"),
    (scaler(BARE.replace("name: local", "name: Local_1")), "scalers[0].name: required, [a-z0-9-]{1,40}"),
    (scaler(BARE.replace("    max_agents: 2\n", "")), "scalers[local].max_agents: required"),
    (
        scaler(BARE.replace("max_agents: 2", "max_agents: 0")),
        "scalers[local].max_agents: must be an integer ≥ 1",
    ),
    (
        scaler(BARE.replace("type: bare-metal", "type: kubernetes")),
        "scalers[local].type: type kubernetes is not supported",
    ),
    (scaler(BARE.replace("type: bare-metal", "type: lxc")), "scalers[local].type: unknown type 'lxc'"),
    (scaler(BARE + "    image: x\n"), "main.yaml: scalers[local]: unknown key image"),
    (scaler(BARE + "        image: x\n"), "scalers[local].label_sets[0]: unknown key image"),
    (
        scaler(BARE.replace("[linux]", "[linux, conveyor:os:linux]")),
        "label conveyor:os:linux starts with 'conveyor:'",
    ),
    (scaler(BARE + "    mandatory_labels: [gpu]\n"), "label_sets[0].labels: mandatory label gpu is missing"),
    (
        scaler(BARE.replace("      - labels: [linux]\n", "")),
        "scalers[local].label_sets: required, a non-empty list",
    ),
    (scaler(BARE.replace("[linux]", "[]")), "label_sets[0].labels: at least one label"),
    (
        scaler(BARE + "        resources: {cpus: 1, memory: lots}\n"),
        "label_sets[0].resources.memory: 'lots' is not a size",
    ),
    (scaler(BARE + "        resources: {gpus: 1}\n"), "label_sets[0].resources: unknown key gpus"),
    (scaler(BARE + "    warm_pool: {size: -1}\n"), "scalers[local].warm_pool.size: must be an integer ≥ 0"),
    (
        scaler(BARE + "    warm_pool: {size: 1, idle_timeout_s: 0}\n"),
        "warm_pool.idle_timeout_s: must be a positive number",
    ),
    (
        scaler(BARE + "    orchestrator_url: http://x\n"),
        "scalers[local].orchestrator_url: must be a ws:// or wss:// URL",
    ),
    (scaler(BARE + "    command: []\n"), "scalers[local].command: must be a non-empty list"),
    (
        scaler(BARE + "    terminate_grace_s: -1\n"),
        "scalers[local].terminate_grace_s: must be a non-negative number",
    ),
    (scaler(BARE + "        env: {'BAD NAME': x}\n"), "label_sets[0].env: must map variable names to values"),
    (scaler(BARE + BARE), "scalers[local].name: duplicate"),
    (
        scaler(BARE + BARE.replace("name: local", "name: other")),
        "scalers[other].label_sets: label set [linux] is also served by scaler local",
    ),
    (
        scaler(
            BARE.replace("[linux]", "[Linux, small]")
            + BARE.replace("name: local", "name: b").replace("[linux]", "[small, linux]")
        ),
        "label set [linux, small] is also served by scaler local",
    ),
    (
        scaler(BARE.replace("type: bare-metal", "type: firecracker")),
        "main.yaml: scalers[local].kernel_path: required",
    ),
]


@pytest.mark.parametrize(("text", "fragment"), INVALID)
def test_each_invalid_file_names_file_scaler_and_field(text: str, fragment: str) -> None:
    found = problems(text)
    assert any(fragment in problem for problem in found), found
    assert all(problem.startswith("main.yaml") for problem in found), found


@pytest.mark.parametrize(
    ("command", "char"),
    [
        (["C:\\agents\\50%\\run.cmd"], "%"),
        (["C:\\a^b\\run.cmd"], "^"),
        (["C:\\agents\\run.bat", "a&b"], "&"),
        (["C:\\agents\\run.CMD", "k=v"], "="),
    ],
)
def test_unsafe_batch_launcher_tokens_are_refused(command: list[str], char: str) -> None:
    body = BARE + "    command: " + yaml.safe_dump(command, default_flow_style=True)
    found = problems(scaler(body))
    assert any(
        f"cmd.exe would read '{char}' as syntax" in p and "scalers[local].command" in p for p in found
    ), found


def test_a_batch_launcher_with_a_quoted_space_is_accepted() -> None:
    body = BARE + "    command: ['C:\\Conveyor Agents (x86)\\run.cmd', 'agent']\n"
    assert parse(scaler(body)).entries[0].options["command"][0].endswith("run.cmd")


def test_enforce_cgroups_is_refused_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    body = BARE + "    enforce_cgroups: true\n"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert any("enforce_cgroups: only available on Linux" in p for p in problems(scaler(body)))
    monkeypatch.setattr(sys, "platform", "linux")
    assert parse(scaler(body)).entries[0].options["enforce_cgroups"] is True


def test_every_problem_is_reported_at_once() -> None:
    text = scaler(
        BARE.replace("max_agents: 2", "max_agents: 0")
        + BARE.replace("name: local", "name: b").replace("type: bare-metal", "type: kubernetes")
    )
    found = problems(text)
    assert len(found) == 2, found


def test_directory_files_hold_only_scalers_and_merge_in_order() -> None:
    other = BARE.replace("name: local", "name: extra").replace("[linux]", "[arm]")
    config = parse(scaler(BARE), ("a.yaml", "scalers:\n" + other))
    assert [e.name for e in config.entries] == ["local", "extra"]
    assert config.entries[1].source == "a.yaml"
    found = problems(scaler(BARE), ("b.yaml", "version: 1\nscalers: []\n"))
    assert any("b.yaml: a CONVEYOR_SCALER_CONFIG_DIR file holds only `scalers:`; version" in p for p in found)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("512m", 512 * 1024**2),
        ("2g", 2 * 1024**3),
        ("64k", 64 * 1024),
        (1000, 1000),
        ("1.5g", int(1.5 * 1024**3)),
        ("2Gi", 2 * 1024**3),
    ],
)
def test_memory_sizes(value: Any, expected: int) -> None:
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value", ["lots", "-1g", "1t", True, -5])
def test_bad_memory_sizes(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_memory(value)


def test_one_side_of_resources_is_copied_to_the_other() -> None:
    only_limits = parse(scaler(BARE + "        resources: {limits: {cpus: 2, memory: 1g}}\n"))
    resources = only_limits.entries[0].label_sets[0].resources
    assert (resources.request_cpus, resources.request_mem_bytes) == (2.0, 1024**3)
    only_requests = parse(scaler(BARE + "        resources: {requests: {cpus: 3}}\n"))
    resources = only_requests.entries[0].label_sets[0].resources
    assert resources.limits == Limits(cpus=3.0, mem_bytes=None)


def test_builtin_local_scaler() -> None:
    config = parse_config([("built-in", builtin_local(HOST, 8), True)], host=HOST, registry=REGISTRY)
    (entry,) = config.entries
    assert (entry.name, entry.type, entry.max_agents) == ("local", "bare-metal", 4)
    assert entry.label_sets[0].all_labels == ("conveyor:arch:x86_64", "conveyor:os:linux", "local")


@pytest.mark.parametrize(
    ("cpus", "limit"), [(1, 1), (2, 2), (3, 2), (4, 2), (6, 3), (8, 4), (16, 8), (None, 2)]
)
def test_the_builtin_local_scaler_runs_at_least_two_jobs_and_at_most_one_per_cpu(
    cpus: int | None, limit: int
) -> None:
    # A 2-core machine ran matrix cells one after another with max(1, cpus // 2).
    assert builtin_local(HOST, cpus)["scalers"][0]["max_agents"] == limit


def test_the_builtin_local_scaler_notice_says_its_limit_and_how_to_change_it(tmp_path: Path) -> None:
    config = load_config(
        tmp_path, main=None, directory=None, builtin=True, host=HOST, registry=REGISTRY, cpu_count=lambda: 2
    )
    notice = builtin_local_notice(config, tmp_path)
    assert notice is not None
    assert "at most 2 jobs at once" in notice
    assert str(tmp_path / "scalers.yaml") in notice
    # The snippet it prints is a valid scalers.yaml that keeps the built-in scaler's labels.
    snippet = notice.split("\n", 1)[1].split("\n(", 1)[0]
    (tmp_path / "scalers.yaml").write_text(textwrap.dedent(snippet))
    mine = load_config(tmp_path, main=None, directory=None, builtin=True, host=HOST, registry=REGISTRY)
    assert [(e.name, e.max_agents, e.label_sets[0].all_labels) for e in mine.entries] == [
        ("local", 4, config.entries[0].label_sets[0].all_labels)
    ]
    # A node running a scalers.yaml of its own prints nothing.
    assert builtin_local_notice(mine, tmp_path) is None


def test_loading_from_files(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # No file: `conveyor up` runs the built-in scaler, `conveyor server` none.
    assert [
        e.name
        for e in load_config(
            home, main=None, directory=None, builtin=True, host=HOST, registry=REGISTRY
        ).entries
    ] == ["local"]
    assert (
        load_config(home, main=None, directory=None, builtin=False, host=HOST, registry=REGISTRY).entries
        == ()
    )
    (home / "scalers.yaml").write_text(scaler(BARE.replace("name: local", "name: mine")))
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "b.yaml").write_text(
        "scalers:\n" + BARE.replace("name: local", "name: bee").replace("[linux]", "[b]")
    )
    (extra / "a.yaml").write_text(
        "scalers:\n" + BARE.replace("name: local", "name: ay").replace("[linux]", "[a]")
    )
    (extra / "ignored.txt").write_text("not yaml: [")
    config = load_config(home, main=None, directory=extra, builtin=True, host=HOST, registry=REGISTRY)
    assert [e.name for e in config.entries] == ["mine", "ay", "bee"]


def test_unreadable_yaml_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "scalers.yaml"
    path.write_text("version: [1\n")
    with pytest.raises(ScalerConfigError) as caught:
        read_documents(path, tmp_path / "missing")
    assert any("not valid YAML" in p for p in caught.value.problems)
    assert any("is not a directory" in p for p in caught.value.problems)


def test_an_explicit_config_path_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ScalerConfigError) as caught:
        load_config(
            tmp_path,
            main=tmp_path / "missing.yaml",
            directory=None,
            builtin=True,
            host=HOST,
            registry=REGISTRY,
        )
    assert caught.value.problems == [
        f"{tmp_path / 'missing.yaml'}: CONVEYOR_SCALER_CONFIG names a file that does not exist"
    ]
