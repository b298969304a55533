"""A private PostgreSQL server for one chaos run (`--postgres private`, the default where the server
binaries exist): the run's sessions, its `pg_terminate_backend` faults and its load stay off a server that
other test runs share, whose `max_connections` and CPU they would otherwise compete for."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.support.processes import free_port


def server_binaries() -> Path | None:
    """The newest `…/bin` holding `initdb` and `pg_ctl` (None when PostgreSQL's server is not installed)."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name, reverse=True)
    for directory in [*candidates, Path("/usr/local/bin"), Path("/usr/bin")]:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    return None


@contextlib.contextmanager
def private_server(root: Path) -> Iterator[str]:
    """Start a server in `root/pg` on a free port; yield its maintenance URL; stop and remove it."""
    binaries = server_binaries()
    if binaries is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl); use --postgres shared")
    directory = root / "pg"
    directory.mkdir()
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        if subprocess.run(["id", "postgres"], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True)
        shutil.chown(directory, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    data = directory / "data"
    subprocess.run(
        [*run_as, str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"],
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    subprocess.run(
        [
            *run_as,
            str(binaries / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(directory / "log"),
            "-w",
            "-o",
            options,
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*run_as, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
        )
