"""`conveyor admin artifact list|download` and `run show`'s test reports (docs/design/artifacts.md §7)
against a real server whose run's job, on a real agent, uploaded the artifacts and a JUnit report.

The downloads run the CLI as a real process (a progress bar needs a real terminal: a pty here); the
listings run in this process (typer's runner) against the same server.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pty
import sqlite3
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import agent_process
from tests.support.cli import invoke
from tests.support.dispatch_stage import Stage, stage
from tests.support.processes import clean_environ, conveyor_command

pytestmark = pytest.mark.slow

WORKFLOW = """
import os
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    for name, size in (("notes.txt", 3_000_000), ("victim.bin", 200_000), ("short.bin", 300_000)):
        (ctx.workspace / name).write_bytes(os.urandom(size))
    ctx.upload_artifact("notes", "notes.txt")
    ctx.upload_artifact("victim", "victim.bin")
    ctx.upload_artifact("short", "short.bin")
    (ctx.workspace / "tree" / "sub").mkdir(parents=True)
    (ctx.workspace / "tree" / "sub" / "a.txt").write_text("alpha")
    ctx.upload_artifact("tree", "tree")
    (ctx.workspace / "junit.xml").write_text(JUNIT)
    ctx.upload_test_report("junit.xml")

JUNIT = '''<?xml version="1.0"?>
<testsuite name="unit" tests="3">
  <testcase classname="tests.test_math" name="test_adds"/>
  <testcase classname="tests.test_math" name="test_divides"><failure message="ZeroDivisionError: boom">trace</failure></testcase>
  <testcase classname="tests.test_math" name="test_later"><skipped/></testcase>
</testsuite>'''
"""


@dataclass
class Done:
    """The finished run, its artifacts by name, and the CLI's environment."""

    stage: Stage
    run_id: str
    artifacts: dict[str, dict[str, Any]]
    env: dict[str, str]
    home: Path

    def blob(self, name: str) -> Path:
        digest = self.artifacts[name]["sha256"]
        return self.home / "blobs" / "sha256" / digest[:2] / digest


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Done]:
    """One run on SQLite (the CLI reads the API only; the routes' storage is tested on both dialects)."""
    tmp = tmp_path_factory.mktemp("artifact-cli")
    with stage(tmp, "", {"ci": WORKFLOW}) as s:
        with agent_process(s, tmp / "agent-home"):
            run_id = s.push()
            s.wait_run(run_id, "success", timeout=120)
        listing = s.api("GET", f"/runs/{run_id}/artifacts").json()["items"]
        env = {"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token}
        yield Done(s, run_id, {a["name"]: a for a in listing}, env, tmp / "home")


def download(done: Done, cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`conveyor admin artifact download RUN ARGS` as a process in `cwd`, output captured (no terminal)."""
    return subprocess.run(
        conveyor_command("admin", "artifact", "download", done.run_id, *args),
        env=clean_environ(done.env),
        cwd=cwd,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


def test_list_shows_name_size_job_and_created_and_json_is_the_api_body(done: Done) -> None:
    shown = invoke(["admin", "artifact", "list", done.run_id], env=done.env)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["name", "size", "job", "created"]
    notes = next(line for line in lines if line.startswith("notes "))
    assert notes.split()[1:4] == ["2.9", "MiB", "build"]
    assert notes.split()[4] == done.artifacts["notes"]["created_at"]
    assert [line.split()[0] for line in lines[1:]] == ["notes", "victim", "short", "tree", "test-report"]

    as_json = invoke(["admin", "artifact", "list", done.run_id, "--json"], env=done.env)
    body = json.loads(as_json.stdout)
    assert [(a["name"], a["size"], a["job"]) for a in body["items"]][:2] == [
        ("notes", 3_000_000, "build"),
        ("victim", 200_000, "build"),
    ]


def test_download_saves_the_served_file_name_checked_and_prints_where(done: Done, tmp_path: Path) -> None:
    saved = download(done, tmp_path, "notes")
    assert saved.returncode == 0, saved.stderr
    data = (tmp_path / "notes.txt").read_bytes()
    assert hashlib.sha256(data).hexdigest() == done.artifacts["notes"]["sha256"]
    assert (
        saved.stdout.decode().strip()
        == f"saved notes.txt (2.9 MiB, sha256 {done.artifacts['notes']['sha256']})"
    )
    assert saved.stderr == b"", "no progress bar without a terminal"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]

    # A tar artifact is served as <name>.tar; -o DIR saves it there under that name.
    (tmp_path / "into").mkdir()
    assert download(done, tmp_path, "tree", "-o", "into").returncode == 0
    with tarfile.open(tmp_path / "into" / "tree.tar") as archive:
        member = archive.extractfile("tree/sub/a.txt")
        assert member is not None and member.read() == b"alpha"

    # -o PATH names the file; -o - writes the bytes to stdout and nothing else.
    assert download(done, tmp_path, "notes", "-o", "copy.bin").returncode == 0
    assert (tmp_path / "copy.bin").read_bytes() == data
    piped = download(done, tmp_path, "notes", "-o", "-")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == data


def test_a_progress_bar_is_drawn_only_on_a_terminal(done: Done, tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            conveyor_command("admin", "artifact", "download", done.run_id, "notes"),
            env=clean_environ({**done.env, "COLUMNS": "120", "TERM": "xterm"}),
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=follower,
        )
        os.close(follower)
        follower = -1
        drawn = b""
        while True:  # read the terminal until the program closes it (it exits)
            try:
                piece = os.read(leader, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not piece:
                break
            drawn += piece
        stdout, _ = proc.communicate(timeout=60)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert proc.returncode == 0, drawn
    text = drawn.decode("utf-8", "replace")
    assert "notes" in text and "2.9/2.9 MiB" in text, text
    assert b"saved notes.txt" in stdout
    assert (
        hashlib.sha256((tmp_path / "notes.txt").read_bytes()).hexdigest() == done.artifacts["notes"]["sha256"]
    )


def test_bytes_that_do_not_hash_to_the_etag_fail_and_leave_no_file(done: Done, tmp_path: Path) -> None:
    # The stored blob is damaged (same size): the server serves it whole, the CLI's digest differs.
    blob = done.blob("victim")
    damaged = bytearray(blob.read_bytes())
    damaged[1000] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(damaged))
    refused = download(done, tmp_path, "victim")
    assert refused.returncode == 1, refused.stderr
    stderr = refused.stderr.decode()
    expected = done.artifacts["victim"]["sha256"]
    assert stderr.startswith("error: artifact 'victim': the SHA-256 of the 200000 bytes received is ")
    assert f"not the server's {expected}; nothing was kept at victim.bin" in stderr
    assert "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == [], "the partial file is removed"
    assert refused.stdout == b""


def test_a_download_cut_short_fails_and_leaves_no_file(done: Done, tmp_path: Path) -> None:
    blob = done.blob("short")
    blob.chmod(0o644)
    blob.write_bytes(blob.read_bytes()[:100_000])  # the server announces 300000 bytes, then stops
    (tmp_path / "short.bin").write_bytes(b"an older copy")
    refused = download(done, tmp_path, "short")
    assert refused.returncode == 1, refused.stderr
    stderr = refused.stderr.decode()
    assert stderr.startswith("error: the download of 'short' broke after ") and " of 300000 bytes" in stderr
    assert "Traceback" not in stderr
    # What was at the target before stays; no partial file beside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.bin"]
    assert (tmp_path / "short.bin").read_bytes() == b"an older copy"


def test_errors_are_one_line_with_the_documented_exit_codes(done: Done, tmp_path: Path) -> None:
    missing = download(done, tmp_path, "nothing-here")
    assert missing.returncode == 4, missing.stderr
    assert missing.stderr.decode().strip() == (
        f"error: artifact 'nothing-here' of run {done.run_id} not found (not_found, HTTP 404)"
    )
    operator = done.stage.api("POST", "/tokens", json={"role": "operator", "label": "ops"}).json()["token"]
    refused = subprocess.run(
        conveyor_command("admin", "artifact", "list", done.run_id),
        env=clean_environ({**done.env, "CONVEYOR_TOKEN": operator}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 3
    assert "this route needs artifact.read; role operator does not have it" in refused.stderr
    assert "Traceback" not in refused.stderr
    nowhere = download(done, tmp_path, "notes", "-o", str(tmp_path / "no" / "such" / "file"))
    assert nowhere.returncode == 2 and b"no directory" in nowhere.stderr
    assert list(tmp_path.iterdir()) == []


def test_run_show_prints_each_test_reports_counts_and_failing_tests(done: Done) -> None:
    shown = invoke(["admin", "run", "show", done.run_id], env=done.env)
    assert shown.exit_code == 0, shown.output
    section = shown.stdout.split("test reports:\n", 1)[1].splitlines()
    assert section[:2] == [
        "  test-report (job build): 1 passed, 1 failed, 1 skipped",
        "    FAILED tests.test_math.test_divides: ZeroDivisionError: boom",
    ]


def verify_cli(done: Done, name: str) -> subprocess.CompletedProcess[str]:
    """`conveyor admin artifact verify RUN NAME` as a process."""
    return subprocess.run(
        conveyor_command("admin", "artifact", "verify", done.run_id, name),
        env=clean_environ(done.env),
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        timeout=60,
    )


def test_verify_prints_the_provenance_facts_of_an_artifact_the_agent_uploaded(done: Done) -> None:
    checked = verify_cli(done, "notes")
    assert checked.returncode == 0, checked.stderr
    lines = checked.stdout.splitlines()
    fields = {line[:15].strip(): line[15:].strip() for line in lines[:-1]}
    assert fields["subject sha256"] == done.artifacts["notes"]["sha256"]
    assert fields["stored sha256"] == done.artifacts["notes"]["sha256"]
    assert fields["workflow"] == "ci" and fields["job"] == "build"
    assert fields["commit"] and len(fields["commit"]) == 40
    assert fields["build type"] == "urn:conveyor:build-type:job:v1"
    assert lines[-1] == f"verified: artifact notes matches its provenance signed by key {fields['key id']}"


def test_verify_exits_1_naming_the_problem_when_the_stored_bytes_or_the_statement_changed(
    done: Done,
) -> None:
    assert verify_cli(done, "test-report").returncode == 0
    blob = done.blob("test-report")
    blob.chmod(0o644)
    blob.write_bytes(b"<testsuite/>")
    refused = verify_cli(done, "test-report")
    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.startswith(
        f"error: artifact test-report of run {done.run_id} does NOT match its provenance:\n"
        "  the stored bytes hash to sha256:"
    ), refused.stderr
    assert "Traceback" not in refused.stderr

    assert verify_cli(done, "tree").returncode == 0
    with sqlite3.connect(done.home / "conveyor.db") as conn:
        (envelope,) = conn.execute(
            "SELECT envelope FROM provenance_statements WHERE artifact_id = ?",
            (done.artifacts["tree"]["id"],),
        ).fetchone()
        forged = json.loads(envelope)
        statement = json.loads(base64.b64decode(forged["payload"]))
        statement["predicate"]["buildDefinition"]["externalParameters"]["workflow"] = "release"
        forged["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
        conn.execute(
            "UPDATE provenance_statements SET envelope = ? WHERE artifact_id = ?",
            (json.dumps(forged), done.artifacts["tree"]["id"]),
        )
    altered = verify_cli(done, "tree")
    assert altered.returncode == 1
    assert "the statement's signature does not verify" in altered.stderr, altered.stderr
