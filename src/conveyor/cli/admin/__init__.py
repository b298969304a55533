"""`conveyor admin …`: operations against the admin API (docs/design/admin.md §7).

`admin_app()` builds the group; `conveyor.cli.main` asks only for the subgroups a command line needs.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from typing import Annotated

import typer

from conveyor.cli.admin.client import DEFAULT_URL, AdminOptions

# Group name -> (module under conveyor.cli.admin, attribute), in `conveyor admin --help` order.
GROUPS: dict[str, tuple[str, str]] = {
    "token": ("tokens", "app"),
    "db": ("db", "app"),
    "access-log": ("access_log", "app"),
    "cluster": ("cluster", "app"),
    "peer": ("peers", "app"),
    "cluster-settings": ("cluster_settings", "app"),
    "orchestrator": ("orchestrator", "app"),
    "org-settings": ("org_settings", "app"),
    "secret": ("secrets", "app"),
    "environment": ("environments", "app"),
    "variable": ("variables", "app"),
    "source": ("sources", "app"),
    "delivery": ("deliveries", "app"),
    "run": ("runs", "app"),
    "artifact": ("artifacts", "app"),
    "cache": ("caches", "app"),
    "agent": ("agents", "app"),
    "queue": ("queue", "app"),
    "event": ("events", "app"),
    "dlq": ("dlq", "app"),
    "registration": ("registrations", "app"),
    "trust": ("registrations", "trust_app"),
    "notify": ("notify", "app"),
    "scaler": ("scaler", "app"),
    "support-bundle": ("support_bundle", "app"),
}
# Global options of `conveyor admin` that take a value (the token after them is not a group name).
_VALUE_OPTIONS = frozenset({"--url", "--token", "--timeout"})


def admin_options(
    ctx: typer.Context,
    url: Annotated[str, typer.Option("--url", envvar="CONVEYOR_URL", help="Orchestrator URL.")] = DEFAULT_URL,
    token: Annotated[
        str | None, typer.Option("--token", envvar="CONVEYOR_TOKEN", help="Admin token (cvy_admin_…).")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the API body as is.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for an answer.")] = 30.0,
) -> None:
    """Global options of every admin verb."""
    ctx.find_root().obj = AdminOptions(url=url, token=token, json_output=json_output, timeout=timeout)


def wanted_groups(args: Sequence[str] | None) -> list[str] | None:
    """Which admin groups a command line needs (None: all of them).

    typer turns every registered command into a click command on each call, which is most of the CLI's
    start-up time; `conveyor admin run list` needs only the `run` group, `conveyor init` none of them.
    `admin --help`, an unknown group or no group at all need every group (to list them).
    """
    if args is None:
        return None
    if not args or args[0] != "admin":
        return []
    rest = list(args[1:])
    index = 0
    while index < len(rest):
        item = rest[index]
        if item == "--":
            return None
        if item.startswith("-"):
            index += 2 if item in _VALUE_OPTIONS else 1
            continue
        return [item] if item in GROUPS else None
    return None


def admin_app(only: Iterable[str] | None = None) -> typer.Typer:
    """The `conveyor admin` group with every subgroup, or only those named (imported on demand)."""
    chosen = None if only is None else set(only)
    group = typer.Typer(
        rich_markup_mode=None,
        name="admin",
        help="Operate a running Conveyor through its admin API.",
        no_args_is_help=True,
    )
    group.callback()(admin_options)
    for name, (module, attribute) in GROUPS.items():
        if chosen is None or name in chosen:
            group.add_typer(getattr(importlib.import_module(f"conveyor.cli.admin.{module}"), attribute))
    return group
