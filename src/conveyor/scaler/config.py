"""`scalers.yaml`: reading the files, and validating them into `ScalerConfig` (docs/design/scaler.md §4).

`read_documents` does the file I/O; `parse_config` is pure apart from the backend classes' own
`validate_entry` checks, and collects *every* problem (each naming the file, the scaler and the
field) so a reload can report them all at once and apply nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from conveyor.errors import ConveyorError
from conveyor.scaler.backend import LabelSetSpec, Limits, Resources, ScalerBackend, ScalerEntry
from conveyor.scaler.labels import auto_labels, normalise

NAME_PATTERN = re.compile(r"^[a-z0-9-]{1,40}$")
MEMORY_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgKMG]?)[iI]?[bB]?\s*$")
RESERVED_PREFIX = "conveyor:"
DEFAULT_GLOBAL_MAX_AGENTS = 50
DEFAULT_MAX_CONCURRENT_SPAWNS = 8
DEFAULT_WARM_IDLE_TIMEOUT_S = 300.0
BUILTIN_LOCAL = "local"
BUILTIN_SOURCE = "<built-in local scaler>"
SHARED_MAX_BYTES = 256 * 1024
UNSUPPORTED_TYPES = {
    "kubernetes": "type kubernetes is not supported",
}

TOP_KEYS = frozenset({"version", "global_max_agents", "global_resource_cap", "defaults", "scalers"})
DIR_KEYS = frozenset({"scalers"})
COMMON_SCALER_KEYS = frozenset(
    {
        "name",
        "type",
        "max_agents",
        "mandatory_labels",
        "label_sets",
        "warm_pool",
        "max_concurrent_spawns",
        "orchestrator_url",
        "resource_cap",
    }
)
COMMON_LABEL_SET_KEYS = frozenset({"labels", "resources", "env"})
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ScalerConfigError(ConveyorError):
    """The configuration cannot be used; `problems` lists each (file, scaler, field, message)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class ScalerConfig:
    """A validated configuration: every scaler of this node, in configuration order."""

    global_max_agents: int = DEFAULT_GLOBAL_MAX_AGENTS
    global_resource_cap: Resources | None = None
    default_resources: Resources | None = None
    entries: tuple[ScalerEntry, ...] = ()
    sources: tuple[str, ...] = ()
    # Where it came from (docs/design/scaler.md §11): local | shared | built-in | none.
    origin: str = "none"
    shared_version: int | None = None

    def entry(self, name: str) -> ScalerEntry | None:
        return next((e for e in self.entries if e.name == name), None)


@dataclass(frozen=True)
class Host:
    """Facts about this host that validation and automatic labels need."""

    os: str
    arch: str
    platform: str = field(default_factory=lambda: sys.platform)


BackendRegistry = Mapping[str, type[ScalerBackend]]


# --- reading


def config_paths(home: Path, main: Path | None, directory: Path | None) -> tuple[Path, Path | None]:
    """The main file (the `scaler_config` setting, default `$CONVEYOR_HOME/scalers.yaml`) and the directory
    (`scaler_config_dir`); both come from the server's settings (file < environment < flags)."""
    return (main or home / "scalers.yaml").expanduser(), directory.expanduser() if directory else None


Document = tuple[str, Any, bool]  # (source, parsed YAML, is the main file)


def read_documents(main: Path, directory: Path | None) -> list[Document]:
    """(source, parsed YAML, is_main) of the main file (when it exists) and every `*.yaml` of the directory.

    Raises `ScalerConfigError` for unreadable or malformed YAML (every file is tried first).
    """
    documents: list[Document] = []
    problems: list[str] = []
    paths: list[Path] = []
    if main.exists():
        paths.append(main)
    if directory is not None:
        if not directory.is_dir():
            problems.append(f"{directory}: CONVEYOR_SCALER_CONFIG_DIR is not a directory")
        else:
            paths.extend(sorted(p for p in directory.iterdir() if p.suffix == ".yaml" and p.is_file()))
    for path in paths:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
            documents.append((str(path), data, path == main))
        except OSError as exc:
            problems.append(f"{path}: cannot read: {exc.strerror or exc}")
        except yaml.YAMLError as exc:
            problems.append(f"{path}: not valid YAML: {str(exc).splitlines()[0]}")
    if problems:
        raise ScalerConfigError(problems)
    return documents


# --- values


def parse_memory(value: Any) -> int:
    """`2g` → 2·1024³ bytes; `512m`, `64k`, a plain integer = bytes. ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("must be a size such as 512m or 2g")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    match = MEMORY_PATTERN.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a size such as 512m or 2g")
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[unit])


def _cpus(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError("must be a non-negative number")
    return float(value)


def _pair(value: Any, where: str, problems: list[str]) -> tuple[float, int] | None:
    if not isinstance(value, dict):
        problems.append(f"{where}: must be a mapping with cpus and/or memory")
        return None
    unknown = sorted(set(value) - {"cpus", "memory"}, key=str)
    if unknown:
        problems.append(f"{where}: unknown key {unknown[0]}")
        return None
    try:
        cpus = _cpus(value.get("cpus", 0))
    except ValueError as exc:
        problems.append(f"{where}.cpus: {exc}")
        return None
    try:
        memory = parse_memory(value.get("memory", 0))
    except ValueError as exc:
        problems.append(f"{where}.memory: {exc}")
        return None
    return cpus, memory


def parse_resources(value: Any, where: str, problems: list[str]) -> Resources | None:
    """`{cpus, memory}` or `{requests, limits}`; one side alone is copied to the other."""
    if value is None:
        return None
    if isinstance(value, dict) and set(value) & {"requests", "limits"}:
        unknown = sorted(set(value) - {"requests", "limits"}, key=str)
        if unknown:
            problems.append(f"{where}: unknown key {unknown[0]} (use requests/limits or cpus/memory)")
            return None
        requests = _pair(value["requests"], f"{where}.requests", problems) if "requests" in value else None
        limits = _pair(value["limits"], f"{where}.limits", problems) if "limits" in value else None
        if ("requests" in value and requests is None) or ("limits" in value and limits is None):
            return None
        requests = requests or limits
        limits = limits or requests
        assert requests is not None and limits is not None
    else:
        pair = _pair(value, where, problems)
        if pair is None:
            return None
        requests = limits = pair
    return Resources(
        request_cpus=requests[0],
        request_mem_bytes=requests[1],
        limits=Limits(cpus=limits[0] or None, mem_bytes=limits[1] or None),
    )


def _positive_int(value: Any, where: str, problems: list[str], *, minimum: int = 1) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        problems.append(f"{where}: must be an integer ≥ {minimum}")
        return None
    return value


def _label_list(value: Any, where: str, problems: list[str]) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}: must be a list of strings")
        return None
    labels = normalise(value)
    reserved = [label for label in labels if label.startswith(RESERVED_PREFIX)]
    if reserved:
        problems.append(
            f"{where}: label {reserved[0]} starts with {RESERVED_PREFIX!r} (those are added automatically)"
        )
        return None
    return labels


# --- the whole configuration


def parse_config(
    documents: Sequence[Document],
    *,
    host: Host,
    registry: BackendRegistry,
) -> ScalerConfig:
    """Validate the documents (main file first, then the directory's files); raise with every problem."""
    problems: list[str] = []
    global_max = DEFAULT_GLOBAL_MAX_AGENTS
    global_cap: Resources | None = None
    defaults: Resources | None = None
    raw_scalers: list[tuple[str, Any, int]] = []
    for source, data, is_main in documents:
        if data is None:
            if is_main:
                problems.append(f"{source}: version: required and must be 1")
            continue
        if not isinstance(data, dict):
            problems.append(f"{source}: must be a mapping")
            continue
        allowed = TOP_KEYS if is_main else DIR_KEYS
        for key in sorted(set(data) - allowed, key=str):
            what = "unknown key" if is_main else "a CONVEYOR_SCALER_CONFIG_DIR file holds only `scalers:`;"
            problems.append(f"{source}: {what} {key}")
        if is_main:
            if data.get("version") != 1:
                problems.append(f"{source}: version: required and must be 1")
            if "global_max_agents" in data:
                global_max = (
                    _positive_int(data["global_max_agents"], f"{source}: global_max_agents", problems) or 0
                )
            global_cap = parse_resources(
                data.get("global_resource_cap"), f"{source}: global_resource_cap", problems
            )
            raw_defaults = data.get("defaults")
            if raw_defaults is not None:
                if not isinstance(raw_defaults, dict) or set(raw_defaults) - {"resources"}:
                    problems.append(f"{source}: defaults: only `resources` is allowed")
                else:
                    defaults = parse_resources(
                        raw_defaults.get("resources"), f"{source}: defaults.resources", problems
                    )
        scalers = data.get("scalers", [])
        if scalers is None:
            scalers = []
        if not isinstance(scalers, list):
            problems.append(f"{source}: scalers: must be a list")
            continue
        for index, raw in enumerate(scalers):
            raw_scalers.append((source, raw, index))
    entries: list[ScalerEntry] = []
    seen_names: dict[str, str] = {}
    for source, raw, index in raw_scalers:
        entry = _parse_scaler(source, raw, index, host=host, registry=registry, problems=problems)
        if entry is None:
            continue
        if entry.name in seen_names:
            problems.append(
                f"{source}: scalers[{entry.name}].name: duplicate (also in {seen_names[entry.name]})"
            )
            continue
        seen_names[entry.name] = source
        entries.append(entry)
    problems.extend(overlap_problems(entries))
    if problems:
        raise ScalerConfigError(problems)
    return ScalerConfig(
        global_max_agents=global_max,
        global_resource_cap=global_cap,
        default_resources=defaults,
        entries=tuple(entries),
        sources=tuple(source for source, _, _ in documents),
    )


def overlap_problems(entries: Sequence[ScalerEntry]) -> list[str]:
    """The same normalised label set in two scalers (or twice in one)."""
    owners: dict[tuple[str, ...], str] = {}
    problems: list[str] = []
    for entry in entries:
        for label_set in entry.label_sets:
            key = label_set.all_labels
            if key in owners:
                problems.append(
                    f"{entry.source}: scalers[{entry.name}].label_sets: label set [{', '.join(label_set.labels)}] "
                    f"is also served by scaler {owners[key]}"
                )
            else:
                owners[key] = entry.name
    return problems


def _parse_scaler(
    source: str,
    raw: Any,
    index: int,
    *,
    host: Host,
    registry: BackendRegistry,
    problems: list[str],
) -> ScalerEntry | None:
    if not isinstance(raw, dict):
        problems.append(f"{source}: scalers[{index}]: must be a mapping")
        return None
    name = raw.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        problems.append(f"{source}: scalers[{index}].name: required, [a-z0-9-]{{1,40}}")
        return None
    where = f"{source}: scalers[{name}]"
    before = len(problems)
    kind = raw.get("type")
    if not isinstance(kind, str):
        problems.append(f"{where}.type: required (bare-metal, container, firecracker or event)")
        return None
    if kind in UNSUPPORTED_TYPES:
        problems.append(f"{where}.type: {UNSUPPORTED_TYPES[kind]}")
        return None
    backend = registry.get(kind)
    if backend is None:
        problems.append(f"{where}.type: unknown type {kind!r} (one of {', '.join(sorted(registry))})")
        return None
    for key in sorted(set(raw) - COMMON_SCALER_KEYS - backend.scaler_keys, key=str):
        problems.append(f"{where}: unknown key {key}")
    max_agents = (
        _positive_int(raw.get("max_agents"), f"{where}.max_agents", problems) if "max_agents" in raw else None
    )
    if "max_agents" not in raw:
        problems.append(f"{where}.max_agents: required (≥ 1)")
    mandatory = _label_list(raw.get("mandatory_labels", []), f"{where}.mandatory_labels", problems) or ()
    spawns = DEFAULT_MAX_CONCURRENT_SPAWNS
    if "max_concurrent_spawns" in raw:
        spawns = _positive_int(raw["max_concurrent_spawns"], f"{where}.max_concurrent_spawns", problems) or 1
    url = raw.get("orchestrator_url")
    if url is not None and (not isinstance(url, str) or not url.startswith(("ws://", "wss://"))):
        problems.append(f"{where}.orchestrator_url: must be a ws:// or wss:// URL")
    warm_size, warm_idle = 0, DEFAULT_WARM_IDLE_TIMEOUT_S
    warm = raw.get("warm_pool")
    if warm is not None:
        if not isinstance(warm, dict) or set(warm) - {"size", "idle_timeout_s"}:
            problems.append(f"{where}.warm_pool: only size and idle_timeout_s are allowed")
        else:
            warm_size = (
                _positive_int(warm.get("size", 0), f"{where}.warm_pool.size", problems, minimum=0) or 0
            )
            idle = warm.get("idle_timeout_s", DEFAULT_WARM_IDLE_TIMEOUT_S)
            if isinstance(idle, bool) or not isinstance(idle, int | float) or idle <= 0:
                problems.append(f"{where}.warm_pool.idle_timeout_s: must be a positive number")
            else:
                warm_idle = float(idle)
    cap = parse_resources(raw.get("resource_cap"), f"{where}.resource_cap", problems)
    raw_sets = raw.get("label_sets")
    label_sets: list[LabelSetSpec] = []
    if not isinstance(raw_sets, list) or not raw_sets:
        problems.append(f"{where}.label_sets: required, a non-empty list")
    else:
        automatic = auto_labels(kind, host.os, host.arch)
        for position, raw_set in enumerate(raw_sets):
            spec = _parse_label_set(
                raw_set, f"{where}.label_sets[{position}]", backend, automatic, mandatory, problems
            )
            if spec is not None:
                label_sets.append(spec)
    options = {k: v for k, v in raw.items() if k in backend.scaler_keys}
    if len(problems) > before:
        return None
    assert max_agents is not None
    entry = ScalerEntry(
        name=name,
        type=kind,
        max_agents=max_agents,
        label_sets=tuple(label_sets),
        mandatory_labels=tuple(mandatory),
        max_concurrent_spawns=spawns,
        orchestrator_url=url,
        warm_pool_size=warm_size,
        warm_idle_timeout_s=warm_idle,
        resource_cap=cap,
        source=source,
        options=options,
    )
    for problem in backend.validate_entry(entry):
        problems.append(f"{where}.{problem}" if not problem.startswith(" ") else f"{where}:{problem}")
    if len(problems) > before:
        return None
    return entry


def _parse_label_set(
    raw: Any,
    where: str,
    backend: type[ScalerBackend],
    automatic: tuple[str, ...],
    mandatory: Sequence[str],
    problems: list[str],
) -> LabelSetSpec | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a mapping")
        return None
    before = len(problems)
    for key in sorted(set(raw) - COMMON_LABEL_SET_KEYS - backend.label_set_keys, key=str):
        problems.append(f"{where}: unknown key {key}")
    if "labels" not in raw:
        problems.append(f"{where}.labels: required")
        return None
    labels = _label_list(raw["labels"], f"{where}.labels", problems)
    if labels is None:
        return None
    if not labels:
        problems.append(f"{where}.labels: at least one label")
    missing = [label for label in mandatory if label not in labels]
    if missing:
        problems.append(f"{where}.labels: mandatory label {missing[0]} is missing from this label set")
    resources = parse_resources(raw.get("resources"), f"{where}.resources", problems)
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and ENV_NAME.match(k) for k in env):
        problems.append(f"{where}.env: must map variable names to values")
        env = {}
    if len(problems) > before:
        return None
    return LabelSetSpec(
        labels=labels,
        auto_labels=automatic,
        resources=resources,
        env={k: "" if v is None else str(v) for k, v in env.items()},
        options={k: v for k, v in raw.items() if k in backend.label_set_keys},
    )


def builtin_local_max_agents(cpu_count: int | None) -> int:
    """How many jobs the built-in scaler runs at once: half the CPUs, but at least 2 (matrix cells and
    independent jobs side by side on a 2-core machine) and at most one per CPU (2 when unknown)."""
    cpus = cpu_count or 2
    return max(1, min(cpus, max(2, cpus // 2)))


def builtin_local(host: Host, cpu_count: int | None) -> dict[str, Any]:
    """The `scalers.yaml` document of `conveyor up`'s built-in scaler: bare-metal `local`."""
    return {
        "version": 1,
        "scalers": [
            {
                "name": BUILTIN_LOCAL,
                "type": "bare-metal",
                "max_agents": builtin_local_max_agents(cpu_count),
                "label_sets": [{"labels": [BUILTIN_LOCAL]}],
            }
        ],
    }


def builtin_local_notice(config: ScalerConfig, home: Path) -> str | None:
    """What `conveyor up` prints at start-up when it runs the built-in scaler: its limit and the
    `scalers.yaml` that changes it (None when the node runs a configuration of its own)."""
    if BUILTIN_SOURCE not in config.sources:
        return None
    entry = config.entry(BUILTIN_LOCAL)
    if entry is None:
        return None
    limit = entry.max_agents
    return (
        f"built-in local scaler: at most {limit} job{'s' if limit != 1 else ''} at once on this machine; "
        f"to change it, write {home / 'scalers.yaml'}:\n"
        "  version: 1\n"
        "  scalers:\n"
        f"    - {{name: {BUILTIN_LOCAL}, type: bare-metal, max_agents: {limit * 2}, "
        f"label_sets: [{{labels: [{BUILTIN_LOCAL}]}}]}}\n"
        "(then restart, or send the server SIGHUP; docs/scaler.md)"
    )


@dataclass(frozen=True)
class SharedConfig:
    """The shared `scalers.yaml` as a node received it (docs/design/scaler.md §11)."""

    version: int
    content: str
    sha256: str


def shared_source(version: int) -> str:
    """How problems and `sources` name the shared configuration of `version`."""
    return f"<shared scaler config v{version}>"


def content_sha256(content: str) -> str:
    """The digest a shared configuration is stored and compared by."""
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def shared_document(content: str, source: str) -> Document:
    """A shared configuration's text as the main document; `ScalerConfigError` if it is too big or not YAML."""
    size = len(content.encode("utf-8"))
    if size > SHARED_MAX_BYTES:
        raise ScalerConfigError([f"{source}: {size} bytes, more than the {SHARED_MAX_BYTES} allowed"])
    try:
        return (source, yaml.safe_load(content), True)
    except yaml.YAMLError as exc:
        raise ScalerConfigError([f"{source}: not valid YAML: {str(exc).splitlines()[0]}"]) from None
    except RecursionError:  # nesting deeper than the parser's stack: not a configuration anyone wrote
        raise ScalerConfigError([f"{source}: not valid YAML: nested too deeply"]) from None


def parse_shared(content: str, *, version: int, host: Host, registry: BackendRegistry) -> ScalerConfig:
    """Validate a shared configuration exactly as a main `scalers.yaml` is validated at boot and reload."""
    source = shared_source(version)
    config = parse_config([shared_document(content, source)], host=host, registry=registry)
    return replace(config, origin="shared", shared_version=version)


def has_local_config(home: Path, main: Path | None, directory: Path | None) -> bool:
    """Whether this node runs its own files: the main file (`CONVEYOR_SCALER_CONFIG`, else
    `$CONVEYOR_HOME/scalers.yaml`) exists, or `CONVEYOR_SCALER_CONFIG_DIR` holds a `*.yaml` file (or is
    not a directory, an error the local reading reports). Such a node ignores the shared configuration."""
    main_path, dir_path = config_paths(home, main, directory)
    if main is not None or main_path.exists():
        return True
    if dir_path is None:
        return False
    return not dir_path.is_dir() or any(p.suffix == ".yaml" and p.is_file() for p in dir_path.iterdir())


def load_config(
    home: Path,
    *,
    main: Path | None,
    directory: Path | None,
    builtin: bool,
    host: Host,
    registry: BackendRegistry,
    cpu_count: Callable[[], int | None] = os.cpu_count,
    shared: SharedConfig | None = None,
) -> ScalerConfig:
    """Read and validate: the local files when there are any, else the shared configuration when one is
    stored, else the built-in `local` scaler when `builtin`, else none (docs/design/scaler.md §11)."""
    main_path, dir_path = config_paths(home, main, directory)
    if main is not None and not main_path.exists():
        raise ScalerConfigError([f"{main_path}: CONVEYOR_SCALER_CONFIG names a file that does not exist"])
    documents = read_documents(main_path, dir_path)
    if documents:
        return replace(parse_config(documents, host=host, registry=registry), origin="local")
    if shared is not None:
        return parse_shared(shared.content, version=shared.version, host=host, registry=registry)
    if not builtin:
        return ScalerConfig()
    documents = [(BUILTIN_SOURCE, builtin_local(host, cpu_count()), True)]
    return replace(parse_config(documents, host=host, registry=registry), origin="built-in")


def worker_refusal(config: ScalerConfig) -> str | None:
    """Why a worker node cannot run `config` (None when it can): an `event` scaler needs the database.

    Its claims and events live in the coordinators' database, which a worker does not reach.
    """
    names = [entry.name for entry in config.entries if entry.type == "event"]
    if not names:
        return None
    return (
        f"scaler {', '.join(names)}: type event runs only on a coordinator (its claims and events "
        "live in the database); remove it from this worker's scalers.yaml"
    )
