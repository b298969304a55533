"""`container=` and `services=` of a job: the image it runs in and the containers beside it
(docs/design/containers.md §1). Pure validation; nothing here talks to an engine."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from conveyor.sdk.durations import DurationLike, duration_ms
from conveyor.sdk.errors import authoring_error, did_you_mean

# A service name is a DNS label on the job's network, so it is lower case.
SERVICE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# `name[:tag][@digest]` with an optional registry; spaces and control characters are what it must not hold.
IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")
SIZE_RE = re.compile(r"^(\d+)([kmg]?)b?$", re.IGNORECASE)
NETWORK_MODES = ("bridge", "host")
MAX_PORT = 65535


def _check_image(image: object, what: str) -> str:
    if not isinstance(image, str) or not IMAGE_RE.match(image):
        raise authoring_error(
            "E121", f"{what}: {image!r} is not an image reference (for example 'python:3.12')"
        )
    return image


def _check_env(env: Mapping[str, str] | None, what: str) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise authoring_error("E121", f"{what} env= must be a mapping of name to str")
    result: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            raise authoring_error("E115", f"{what} env: invalid variable name {name!r}")
        if name == "PATH" or name.startswith("CONVEYOR_"):
            raise authoring_error("E115", f"{what} env: {name!r} is reserved")
        if not isinstance(value, str):
            raise authoring_error("E115", f"{what} env: value of {name!r} must be a str")
        result[name] = value
    return result


def size_bytes(value: object, what: str) -> int:
    """A size as written (`512m`, `2g`, or bytes as an int) in bytes; E121 when it is not one."""
    if isinstance(value, bool):
        raise authoring_error("E121", f"{what}: a size cannot be a bool")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and (found := SIZE_RE.match(value.strip())):
        number = (
            int(found.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[found.group(2).lower()]
        )
    else:
        raise authoring_error(
            "E121", f"{what}: {value!r} is not a size (bytes as an int, or e.g. '512m', '2g')"
        )
    if number <= 0:
        raise authoring_error("E121", f"{what}: a size must be greater than zero")
    return number


def _user(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise authoring_error("E121", f"{what}: user must be a name or uid[:gid] string, not {value!r}")
    return value


def _network(value: object, what: str) -> str:
    if value not in NETWORK_MODES:
        raise authoring_error(
            "E121", f"{what}: network must be one of {', '.join(NETWORK_MODES)}, not {value!r}"
        )
    return str(value)


def _cpus(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1024:
        raise authoring_error("E121", f"{what}: cpus must be a positive number, not {value!r}")
    return float(value)


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise authoring_error("E121", f"{what}: init must be True or False, not {value!r}")
    return value


# The container options this build applies, each with its check; the lock holds the checked value.
_OPTIONS: dict[str, Any] = {
    "user": _user,
    "network": _network,
    "memory": lambda value, what: size_bytes(value, f"{what}: memory"),
    "cpus": _cpus,
    "shm_size": lambda value, what: size_bytes(value, f"{what}: shm_size"),
    "init": _flag,
}
CONTAINER_OPTIONS = tuple(_OPTIONS)


def check_options(options: Mapping[str, object] | None, what: str) -> dict[str, Any]:
    """The checked `Container(options=)`: known keys only (E120 naming the nearest), each of its type (E121)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise authoring_error("E121", f"{what} options= must be a mapping")
    checked: dict[str, Any] = {}
    for key, value in options.items():
        if key not in _OPTIONS:
            raise authoring_error(
                "E120",
                f"{what}: option {key!r} is not supported (known: {', '.join(CONTAINER_OPTIONS)})"
                f"{did_you_mean(str(key), CONTAINER_OPTIONS)}",
            )
        checked[key] = _OPTIONS[key](value, what)
    return checked


@dataclass(frozen=True, slots=True)
class Container:
    """The image a job's commands run in, its own environment and its engine options."""

    image: str
    env: Mapping[str, str]
    options: Mapping[str, Any]

    def __init__(
        self, image: str, *, env: Mapping[str, str] | None = None, options: Mapping[str, object] | None = None
    ) -> None:
        what = f"Container({image!r})"
        object.__setattr__(self, "image", _check_image(image, "Container(image=)"))
        object.__setattr__(self, "env", _check_env(env, what))
        object.__setattr__(self, "options", check_options(options, what))


def _port(value: object, what: str) -> str:
    """`"HOST:CONTAINER"` or a container port (published on the same host port) as `"HOST:CONTAINER"`."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(text, str):
        parts = text.split(":")
        if len(parts) == 1:
            parts = [parts[0], parts[0]]
        if len(parts) == 2 and all(part.isdigit() and 0 < int(part) <= MAX_PORT for part in parts):
            return f"{int(parts[0])}:{int(parts[1])}"
    raise authoring_error("E121", f"{what}: port {value!r} must be a port number or 'HOST:CONTAINER'")


@dataclass(frozen=True, slots=True)
class Service:
    """A container started beside the job on its network, reachable by its name, waited for until healthy."""

    image: str
    env: Mapping[str, str]
    ports: tuple[str, ...]
    command: tuple[str, ...] | None
    health_cmd: str | None
    health_interval_ms: int
    health_timeout_ms: int

    def __init__(
        self,
        image: str,
        *,
        env: Mapping[str, str] | None = None,
        ports: Iterable[str | int] = (),
        command: str | Iterable[str] | None = None,
        health_cmd: str | None = None,
        health_interval: DurationLike = "1s",
        health_timeout: DurationLike = "60s",
    ) -> None:
        what = f"Service({image!r})"
        object.__setattr__(self, "image", _check_image(image, "Service(image=)"))
        object.__setattr__(self, "env", _check_env(env, what))
        if isinstance(ports, str | int):
            ports = [ports]
        object.__setattr__(self, "ports", tuple(_port(port, what) for port in ports))
        argv: tuple[str, ...] | None
        if command is None:
            argv = None
        elif isinstance(command, str):
            argv = ("sh", "-c", command)
        else:
            argv = tuple(command)
            if not argv or not all(isinstance(part, str) for part in argv):
                raise authoring_error("E121", f"{what}: command must be a str or a non-empty list of str")
        object.__setattr__(self, "command", argv)
        if health_cmd is not None and (not isinstance(health_cmd, str) or not health_cmd.strip()):
            raise authoring_error("E121", f"{what}: health_cmd must be a non-empty shell command string")
        object.__setattr__(self, "health_cmd", health_cmd)
        object.__setattr__(
            self, "health_interval_ms", duration_ms(health_interval, what=f"{what} health_interval")
        )
        object.__setattr__(
            self, "health_timeout_ms", duration_ms(health_timeout, what=f"{what} health_timeout")
        )


def as_container(value: object, what: str) -> Container | None:
    """Normalise `container=`: None, an image string, or `Container(...)`."""
    if value is None or isinstance(value, Container):
        return value
    if isinstance(value, str):
        return Container(value)
    raise authoring_error(
        "E121", f"{what}: container= must be an image string or Container(...), not {value!r}"
    )


def as_services(value: object, what: str, container: Container | None) -> dict[str, Service]:
    """Normalise `services=`: a mapping of DNS-label names to `Service(...)` (or image strings)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise authoring_error("E121", f"{what}: services= must be a mapping of name to Service(...)")
    services: dict[str, Service] = {}
    for name, service in value.items():
        if not isinstance(name, str) or not SERVICE_NAME_RE.match(name):
            raise authoring_error(
                "E121", f"{what}: service name {name!r} must be a DNS label (a-z, 0-9, '-'; at most 63)"
            )
        if isinstance(service, str):
            service = Service(service)
        if not isinstance(service, Service):
            raise authoring_error("E121", f"{what}: service {name!r} must be Service(...) or an image string")
        services[name] = service
    if services and container is not None and container.options.get("network") == "host":
        raise authoring_error(
            "E121", f"{what}: services need the job's own network; drop network='host' from the container"
        )
    return services
