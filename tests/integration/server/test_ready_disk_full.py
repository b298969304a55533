"""`/ready` says so while writes fail for a full disk (issue 35, low).

A real `conveyor server` keeps its SQLite database on a 6 MiB tmpfs of its own (a private mount
namespace, `unshare -m`, so nothing outside the test sees it); the test fills that file system through
`/proc/<pid>/root`, sees a write answer 503 and `/ready` answer 503 naming the full disk, then frees the
space. (SQLite only: PostgreSQL's disk is not this test's to fill; both report a full disk the same way,
through `conveyor.db.engine.is_disk_full`.)
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http import HTTP
from tests.support.processes import TOKEN_PATTERN, clean_environ, conveyor_command, free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def server_on_small_disk(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    if shutil.which("unshare") is None:
        pytest.fail("this test needs unshare(1) (util-linux) and the right to mount a tmpfs (root)")
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    log = tmp_path / "server.log"
    command = " ".join(conveyor_command("server", "--port", str(port)))
    script = f"mount -t tmpfs -o size=6m tmpfs {home} && exec {command}"
    with open(log, "w") as output:
        process = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
            env=clean_environ({"CONVEYOR_HOME": str(home), "CONVEYOR_LOG_FORMAT": "json"}),
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:

            def ready() -> bool:
                assert process.poll() is None, log.read_text()
                return HTTP.get(f"{url}/ready", timeout=5).status_code == 200

            wait_until(ready, timeout=90, what="the server on its small disk to be ready")
            # The server's view of its home: through its own root, in its mount namespace.
            yield process, url, Path(f"/proc/{process.pid}/root") / str(home).lstrip("/")
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)
    (tmp_path / "owner-token").write_text("".join(TOKEN_PATTERN.findall(log.read_text())[:1]))


def test_ready_answers_503_while_writes_fail_for_a_full_disk(
    server_on_small_disk: tuple[subprocess.Popen[bytes], str, Path], tmp_path: Path
) -> None:
    process, url, home = server_on_small_disk
    token = TOKEN_PATTERN.findall((tmp_path / "server.log").read_text())[0]
    headers = {"Authorization": f"Bearer {token}"}
    filler = home / "filler"
    with open(filler, "wb") as handle:  # fill the file system to the last block
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass

    def write_refused() -> bool:
        answer = HTTP.post(
            f"{url}/api/v1/admin/tokens",
            json={"role": "auditor", "label": "x" * 100},
            headers=headers,
            timeout=10,
        )
        assert answer.status_code in (201, 503), answer.text
        return answer.status_code == 503

    wait_until(write_refused, timeout=30, what="a write to fail for the full disk")
    # `/ready` answers from a cache for up to CONVEYOR_READY_CACHE_MS (1 s).
    answer = wait_until(
        lambda: (found := HTTP.get(f"{url}/ready", timeout=10)).status_code == 503 and found,
        timeout=10,
        what="/ready 503",
    )
    assert answer.json()["checks"]["storage"] == {
        "ok": False,
        "detail": "writes are failing: the database's disk is full",
    }
    filler.unlink()
    wait_until(
        lambda: HTTP.get(f"{url}/ready", timeout=10).status_code == 200, timeout=30, what="/ready 200 again"
    )
    assert process.poll() is None


def test_the_drivers_disk_full_errors_are_recognised() -> None:
    import sqlite3

    from conveyor.db.engine import is_disk_full

    full = sqlite3.OperationalError("database or disk is full")
    assert is_disk_full(full)
    assert is_disk_full(OSError(28, "No space left on device"))
    assert not is_disk_full(sqlite3.OperationalError("database is locked"))
    assert not is_disk_full(None)
