"""Scaler configuration and environment for end-to-end tests, and the processes a scaler started."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import psutil

from tests.support.dispatch_stage import FAST

SCALER_ENV = {
    **FAST,
    # Long enough that the backoff window outlasts the checks of a failing scaler on a loaded machine.
    "CONVEYOR_SCALER_PROVISION_BACKOFF_BASE_MS": "30000",
    "CONVEYOR_SCALER_PROVISION_BACKOFF_MAX_MS": "60000",
    "CONVEYOR_KILL_GRACE_MS": "2000",
}


def scalers_yaml(**extra: Any) -> str:
    scaler = {
        "name": "local",
        "type": "bare-metal",
        "max_agents": 2,
        "terminate_grace_s": 5,
        "label_sets": [{"labels": ["linux"]}],
        **extra,
    }
    return json.dumps({"version": 1, "scalers": [scaler]})  # JSON is YAML


def scaler_env(tmp_path: Path) -> dict[str, str]:
    return {**SCALER_ENV, "CONVEYOR_SCALER_CONFIG": str(tmp_path / "scalers.yaml")}


def kill_leftover_agents(tmp_path: Path) -> None:
    """Safety net: end any process still running in this test's scaler work directory."""
    for proc in processes_under(tmp_path):
        try:
            os.killpg(proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            proc.kill()


def processes_under(root: Path) -> list[psutil.Process]:
    """Live (non-zombie) processes whose working directory is inside `root`."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if Path(proc.cwd()).is_relative_to(root):
                found.append(proc)
        except (psutil.Error, OSError, ValueError):
            continue
    return found
