"""A FAKE docker/podman command-line tool for the container backend's tests (no daemon, no containers).

Installed by tests as an executable named `docker` (or `podman`) first on PATH (`install_fake_cli`). It keeps
"containers" as JSON in `$FAKE_DOCKER_STATE/state.json`, appends every invocation to
`$FAKE_DOCKER_STATE/calls.jsonl` (argv plus the values of the `-e NAME` variables it was asked to pass, read from
its own environment the way docker does) and answers like the real CLI for what the backend uses:
`version`, `pull`, `image inspect`, `run -d`, `ps -a --filter label=k=v… --format json`, `inspect`, `logs --tail`,
`stop -t`, `rm -f`.

Knobs (environment of the fake, set by the test): `FAKE_DOCKER_VERSION_FAILS=1` (the daemon is down),
`FAKE_DOCKER_RUN_FAILS=<stderr text>` (every `run` fails with it), `FAKE_DOCKER_PULL_FAILS=<stderr text>`.
Tests change a container's fate with `exit_container` and add a foreign one with `add_container`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATE_ENV = "FAKE_DOCKER_STATE"


def install_fake_cli(
    bin_dir: Path, state_dir: Path, name: str = "docker", env: dict[str, str] | None = None
) -> Path:
    """Write an executable `name` into `bin_dir` that runs this fake with its state in `state_dir`.

    `env` sets knobs for this launcher only (e.g. a `docker` whose daemon is down next to a working `podman`).
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    launcher = bin_dir / name
    assignments = " ".join(
        f"{key}='{value}'" for key, value in {**(env or {}), STATE_ENV: str(state_dir)}.items()
    )
    launcher.write_text(
        f'#!/bin/sh\n{assignments} exec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n'
    )
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return launcher


@contextlib.contextmanager
def _locked_state(state_dir: Path) -> Iterator[dict[str, Any]]:
    """The state document, read and written back under an exclusive lock (concurrent CLI calls)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "state.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = state_dir / "state.json"
        state = json.loads(path.read_text()) if path.exists() else {"containers": {}, "images": []}
        yield state
        path.write_text(json.dumps(state, indent=1))


def read_calls(state_dir: Path) -> list[dict[str, Any]]:
    """Every recorded invocation, oldest first: `{"argv": [...], "env": {NAME: value}}`."""
    path = state_dir / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def containers(state_dir: Path) -> dict[str, dict[str, Any]]:
    """The fake's containers by id."""
    with _locked_state(state_dir) as state:
        return dict(state["containers"])


def add_image(state_dir: Path, image: str) -> None:
    """Make `image` present locally (for `image inspect`)."""
    with _locked_state(state_dir) as state:
        state["images"] = sorted({*state["images"], image})


def add_container(state_dir: Path, name: str, labels: dict[str, str], image: str = "img") -> str:
    """A running container made by someone else (another orchestrator); returns its id."""
    with _locked_state(state_dir) as state:
        return _create(state, name, labels, image, env={})


def exit_container(state_dir: Path, name_or_id: str, code: int, output: str = "") -> None:
    """Make a container exit with `code`, appending `output` to its logs."""
    with _locked_state(state_dir) as state:
        container = _find(state, name_or_id)
        assert container is not None, f"no fake container {name_or_id}"
        container["state"] = "exited"
        container["exit_code"] = code
        container["logs"].extend(output.splitlines())


def _create(state: dict[str, Any], name: str, labels: dict[str, str], image: str, env: dict[str, str]) -> str:
    container_id = secrets.token_hex(32)
    state["containers"][container_id] = {
        "id": container_id,
        "name": name,
        "labels": labels,
        "image": image,
        "env": env,
        "state": "running",
        "exit_code": 0,
        "created": time.time(),
        "logs": [f"fake container {name} started"],
    }
    return container_id


def _find(state: dict[str, Any], name_or_id: str) -> dict[str, Any] | None:
    for container in state["containers"].values():
        if name_or_id in (container["name"], container["id"]) or (
            len(name_or_id) >= 12 and container["id"].startswith(name_or_id)
        ):
            return container  # type: ignore[no-any-return]
    return None


def _no_such(name: str) -> int:
    print(f"Error response from daemon: No such container: {name}", file=sys.stderr)
    return 1


def _options(args: list[str], with_value: set[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Split `args` into options (those in `with_value` take the next arg) and positionals."""
    options: dict[str, list[str]] = {}
    positionals: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg.startswith("-") and not positionals:
            if "=" in arg and arg.split("=", 1)[0] in with_value:
                key, value = arg.split("=", 1)
                options.setdefault(key, []).append(value)
            elif arg in with_value:
                options.setdefault(arg, []).append(args[index + 1])
                index += 1
            else:
                options.setdefault(arg, []).append("")
        else:
            positionals.append(arg)
        index += 1
    return options, positionals


RUN_VALUE_OPTIONS = {
    "--name",
    "--label",
    "-l",
    "-e",
    "--env",
    "--cpus",
    "--memory",
    "--add-host",
    "-v",
    "--volume",
    "--network",
    "--pull",
}


def _run(state_dir: Path, args: list[str]) -> int:
    options, positionals = _options(args, RUN_VALUE_OPTIONS)
    if "-d" not in options:
        print("fake docker only runs detached containers", file=sys.stderr)
        return 2
    failure = os.environ.get("FAKE_DOCKER_RUN_FAILS")
    if failure:
        print(failure, file=sys.stderr)
        return 125
    image, *_command = positionals
    labels = dict(item.split("=", 1) for item in options.get("--label", []))
    env = {name: os.environ.get(name, "") for name in options.get("-e", []) if "=" not in name}
    name = options.get("--name", [secrets.token_hex(4)])[-1]
    with _locked_state(state_dir) as state:
        if _find(state, name) is not None:
            print(
                f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in use.',
                file=sys.stderr,
            )
            return 125
        container_id = _create(state, name, labels, image, env)
    print(container_id)
    return 0


def _ps(state_dir: Path, args: list[str]) -> int:
    options, _ = _options(args, {"--filter", "-f", "--format"})
    filters = [value.split("=", 1)[1] for value in options.get("--filter", []) if value.startswith("label=")]
    wanted = [tuple(item.split("=", 1)) if "=" in item else (item, None) for item in filters]
    with _locked_state(state_dir) as state:
        listed = list(state["containers"].values())
    for container in listed:
        if "-a" not in options and container["state"] != "running":
            continue
        labels = container["labels"]
        if all(key in labels and (value is None or labels[key] == value) for key, value in wanted):
            created = time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(container["created"]))
            print(
                json.dumps(
                    {
                        "ID": container["id"][:12],
                        "Names": container["name"],
                        "Image": container["image"],
                        "Labels": ",".join(f"{key}={value}" for key, value in labels.items()),
                        "State": container["state"],
                        "CreatedAt": created,
                    }
                )
            )
    return 0


def _inspect(state_dir: Path, args: list[str]) -> int:
    _, names = _options(args, {"--format", "-f", "--type"})
    answer = []
    with _locked_state(state_dir) as state:
        for name in names:
            container = _find(state, name)
            if container is None:
                print("[]")
                return _no_such(name)
            answer.append(
                {
                    "Id": container["id"],
                    "Name": "/" + container["name"],
                    "State": {
                        "Status": container["state"],
                        "Running": container["state"] == "running",
                        "ExitCode": container["exit_code"],
                    },
                    "Config": {"Labels": container["labels"], "Image": container["image"]},
                }
            )
    print(json.dumps(answer))
    return 0


def _logs(state_dir: Path, args: list[str]) -> int:
    options, names = _options(args, {"--tail", "-n"})
    with _locked_state(state_dir) as state:
        container = _find(state, names[0])
    if container is None:
        return _no_such(names[0])
    tail = int(options.get("--tail", ["100000"])[-1])
    for line in container["logs"][-tail:]:
        print(line)
    return 0


def _stop(state_dir: Path, args: list[str]) -> int:
    _, names = _options(args, {"-t", "--time"})
    with _locked_state(state_dir) as state:
        for name in names:
            container = _find(state, name)
            if container is None:
                return _no_such(name)
            if container["state"] == "running":
                container["state"] = "exited"
                container["exit_code"] = 143
    print("\n".join(names))
    return 0


def _rm(state_dir: Path, args: list[str]) -> int:
    options, names = _options(args, set())
    with _locked_state(state_dir) as state:
        for name in names:
            container = _find(state, name)
            if container is None:
                return _no_such(name)
            if container["state"] == "running" and "-f" not in options:
                print(
                    f"Error response from daemon: cannot remove container {name}: container is running",
                    file=sys.stderr,
                )
                return 1
            del state["containers"][container["id"]]
    print("\n".join(names))
    return 0


def _image(state_dir: Path, args: list[str]) -> int:
    if args[:1] != ["inspect"]:
        print(f"fake docker: unsupported image command {args}", file=sys.stderr)
        return 2
    with _locked_state(state_dir) as state:
        present = args[-1] in state["images"]
    if not present:
        print(f"Error response from daemon: No such image: {args[-1]}", file=sys.stderr)
        return 1
    print(json.dumps([{"RepoTags": [args[-1]]}]))
    return 0


def _pull(state_dir: Path, args: list[str]) -> int:
    failure = os.environ.get("FAKE_DOCKER_PULL_FAILS")
    if failure:
        print(failure, file=sys.stderr)
        return 1
    add_image(state_dir, args[-1])
    print(f"{args[-1]}: Pulled (fake)")
    return 0


def main(argv: list[str]) -> int:
    state_dir = Path(os.environ[STATE_ENV])
    env_names = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in ("-e", "--env")]
    with open(state_dir / "calls.jsonl", "a") as calls:
        record = {"argv": argv, "env": {name: os.environ.get(name) for name in env_names if "=" not in name}}
        calls.write(json.dumps(record) + "\n")
    if not argv:
        return 2
    command, args = argv[0], argv[1:]
    if command == "version":
        if os.environ.get("FAKE_DOCKER_VERSION_FAILS"):
            print("Cannot connect to the Docker daemon at unix:///var/run/docker.sock.", file=sys.stderr)
            return 1
        print("Client: fake\nServer: fake")
        return 0
    handlers = {
        "run": _run,
        "ps": _ps,
        "inspect": _inspect,
        "logs": _logs,
        "stop": _stop,
        "rm": _rm,
        "image": _image,
        "pull": _pull,
    }
    if command not in handlers:
        print(f"fake docker: unsupported command {command}", file=sys.stderr)
        return 2
    return handlers[command](state_dir, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
