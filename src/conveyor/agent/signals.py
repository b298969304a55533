"""Signalling process groups: the one helper the agent, its runners and their step processes all share.

A module of its own so the agent program imports it without the step-side `shell` module (and the SDK
that module needs), which keeps `conveyor agent --ephemeral`'s start-up short.
"""

from __future__ import annotations

import os


def signal_group(pgid: int, signum: int) -> None:
    """Send a signal to a process group, ignoring groups that are already gone."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass
