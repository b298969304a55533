"""Confirmation of destructive verbs: ask on a TTY; `--yes` skips; no TTY and no `--yes` is a usage error."""

from __future__ import annotations

import sys

import typer


def confirm_destructive(question: str, yes: bool) -> None:
    """Return when the user agreed (or passed --yes); exit 2 without a TTY, 1 on "no"."""
    if yes:
        return
    if not sys.stdin.isatty():
        sys.stderr.write("error: this is destructive; pass --yes to confirm without a terminal\n")
        raise typer.Exit(2)
    if not typer.confirm(question, default=False):
        raise typer.Exit(1)
