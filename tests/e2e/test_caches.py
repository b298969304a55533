"""Dependency caches end to end (docs/design/caches.md §8 scenario 3): a real agent against a real server
on SQLite and PostgreSQL. A second run restores its key exactly; a changed key restores the old entry
through `restore_keys` and saves a new one, which the next run hits; `conveyor admin cache list` shows
both and `cache delete` removes one, so the next run misses and saves it again. The agent keeps the
entries it saved or restored: until its store is emptied, no hit downloads a byte."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.agents import agent_process
from tests.support.cache_bytes import restored_bytes
from tests.support.dispatch_stage import Stage, stage
from tests.support.processes import run_cli
from tests.support.repos import git

pytestmark = pytest.mark.slow

CACHED = """
import os, stat
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    key = "deps-" + ctx.hash_files("lock.txt")
    deps = ctx.workspace / "deps"
    with ctx.cache(key, ["deps"], restore_keys=["deps-"]) as hit:
        if hit:
            assert os.readlink(deps / "link") == "marker"
            assert stat.S_IMODE((deps / "tool").stat().st_mode) == 0o750
        else:
            deps.mkdir(exist_ok=True)
            if not (deps / "marker").exists():
                (deps / "marker").write_text(ctx.run_id)
                (deps / "link").symlink_to("marker")
                (deps / "tool").write_text("#!/bin/sh\\n")
                (deps / "tool").chmod(0o750)
    return {"kind": hit.kind, "key": hit.key, "wanted": key, "marker": (deps / "marker").read_text()}
"""


def commit(s: Stage, name: str, text: str) -> None:
    (s.repo / name).write_text(text)
    git(s.repo, "add", "-A")
    git(s.repo, "commit", "-q", "-m", f"change {name}")


def run_once(s: Stage) -> tuple[str, dict[str, Any]]:
    run_id = s.push()
    s.wait_run(run_id, "success", timeout=120)
    jobs = s.api("GET", f"/runs/{run_id}/jobs").json()["items"]
    return run_id, jobs[0]["outputs"]["build"]


def job_log(s: Stage, run_id: str) -> str:
    job = s.api("GET", f"/runs/{run_id}/jobs").json()["items"][0]
    return str(s.api("GET", f"/runs/{run_id}/jobs/{job['id']}/logs").json()["text"])


def shown_caches(s: Stage, run_id: str) -> tuple[list[str], list[str]]:
    """What `conveyor admin run show` and the dashboard's run page say the run's caches did."""
    env = {"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token}
    shown = run_cli(["admin", "run", "show", run_id], env=env)
    assert shown.returncode == 0, shown.stderr
    # The indented lines under `caches:`, up to the next section.
    after = shown.stdout.split("\ncaches:\n", 1)[1].split("\n") if "\ncaches:\n" in shown.stdout else []
    cli = [line.strip() for line in itertools.takewhile(lambda line: line.startswith("  "), after)]
    with httpx.Client(base_url=s.server.url, timeout=30) as browser:
        signed = browser.post("/ui/sign-in", data={"token": s.token, "next": "/ui/runs"})
        assert signed.status_code == 303, signed.text
        page = browser.get(f"/ui/runs/{run_id}")
    assert page.status_code == 200, page.text
    html = re.findall(r'<small class="cache[^"]*" data-cache-of="[^"]+">(.*?)</small>', page.text)
    return cli, html


def test_a_second_run_hits_exactly_and_a_key_change_hits_partially_then_saves(
    database_url: str, tmp_path: Path
) -> None:
    with stage(tmp_path, database_url, {"ci": CACHED}) as s:
        commit(s, "lock.txt", "v1\n")
        with agent_process(s, tmp_path / "agent-home"):
            first_run, first = run_once(s)
            assert (first["kind"], first["key"], first["marker"]) == ("miss", None, first_run)
            cli, html = shown_caches(s, first_run)
            assert len(cli) == 1 and cli[0].startswith(f"build / build: {first['wanted']}: miss, saved "), cli
            assert len(html) == 1 and html[0].startswith(f"cache {first['wanted']}: miss, saved "), html

            commit(s, "other.txt", "unrelated\n")
            second_run, second = run_once(s)
            # The marker written by the first run came back from the cache, not from a reused workspace.
            assert (second["kind"], second["key"], second["marker"]) == ("exact", first["wanted"], first_run)
            # The run page and `admin run show` say so, for the step that restored it.
            assert shown_caches(s, second_run) == (
                [f"build / build: {first['wanted']}: exact hit"],
                [f"cache {first['wanted']}: exact hit"],
            )
            # The agent kept what it saved: the hit downloaded nothing, and the step's log says so.
            assert restored_bytes(s) == 0
            assert f"cache {first['wanted']}: restored from this agent's store: extraction " in job_log(
                s, second_run
            )

            commit(s, "lock.txt", "v2\n")
            third_run, third = run_once(s)
            assert third["wanted"] != first["wanted"]
            assert (third["kind"], third["key"], third["marker"]) == ("partial", first["wanted"], first_run)
            cli, _ = shown_caches(s, third_run)
            assert len(cli) == 1 and cli[0].startswith(
                f"build / build: {third['wanted']}: partial hit ({first['wanted']}), saved "
            ), cli

            commit(s, "other.txt", "again\n")
            _, fourth = run_once(s)
            assert (fourth["kind"], fourth["key"]) == ("exact", third["wanted"])

            env = {"CONVEYOR_URL": s.server.url, "CONVEYOR_TOKEN": s.token}
            shown = run_cli(["admin", "cache", "list", "--key-prefix", "deps-"], env=env)
            assert shown.returncode == 0, shown.stderr
            assert first["wanted"] in shown.stdout and third["wanted"] in shown.stdout
            assert "refs/heads/main" in shown.stdout and "2 entries" in shown.stdout
            listed = json.loads(run_cli(["admin", "cache", "list", "--json"], env=env).stdout)["items"]
            newest = next(e for e in listed if e["key"] == third["wanted"])
            gone = run_cli(["admin", "cache", "delete", newest["id"]], env=env)
            assert gone.returncode == 0, gone.stderr
            missing = run_cli(["admin", "cache", "delete", newest["id"]], env=env)
            assert missing.returncode != 0 and "Traceback" not in missing.stderr

            assert restored_bytes(s) == 0
            # An agent without the entry downloads it.
            shutil.rmtree(tmp_path / "agent-home" / "caches")
            commit(s, "other.txt", "once more\n")
            fifth_run, fifth = run_once(s)
            # The deleted key's entry is gone: the old one is restored through restore_keys, then saved.
            assert (fifth["kind"], fifth["key"]) == ("partial", first["wanted"])
            assert restored_bytes(s) > 0
            assert re.search(
                rf"cache {fifth['wanted']}: downloaded and checked in [0-9.]+ s, extraction [0-9.]+ s",
                job_log(s, fifth_run),
            )
        blobs = list((tmp_path / "home" / "blobs" / "sha256").glob("*/*"))
        # Three saves, three blobs (an archive holds mtimes); the deleted entry's waits for the blob sweep.
        assert len(blobs) == 3, blobs
