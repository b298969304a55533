"""Committed repositories with a workflow for the agent's checkout tests, a `git` that records how it was called, and a wheel built on the spot."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from pathlib import Path

from conveyor.lockfile.models import Lock
from tests.integration.agent.conftest import git, write_workflow

TOKEN = "ghs-sekrit-clone-token-42"


WORKFLOW = """
import sys
from conveyor import workflow, push
w = workflow("w", on=push())
j = w.job("j", runs_on="linux")
@j.step
def show(ctx):
    ctx.sh(["git", "log", "-1", "--format=%s"])
"""


def committed_repo(path: Path, source: str = WORKFLOW) -> tuple[Lock, str]:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    lock = write_workflow(path, source)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "the commit")
    return lock, git(path, "rev-parse", "HEAD")


def git_wrapper(directory: Path, log: Path) -> Path:
    """A `git` first on PATH that records argv and the GIT_CONFIG_* variables, then runs the real git."""
    real = subprocess.run(["which", "git"], capture_output=True, text=True, check=True).stdout.strip()
    directory.mkdir()
    script = directory / "git"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "ARGV $*" >> {log}\n'
        f'echo "ENV $GIT_CONFIG_COUNT $GIT_CONFIG_KEY_0 $GIT_CONFIG_VALUE_0" >> {log}\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return directory


def build_wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel `tinypkg` (installable with --no-index, no network)."""
    files = {
        "tinypkg/__init__.py": b"VALUE = 42\n",
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("tinypkg-1.0.dist-info/RECORD,,")
    files["tinypkg-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path
