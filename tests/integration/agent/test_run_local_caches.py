"""`ctx.cache` under `conveyor run local` (docs/design/caches.md §5, §8 scenario 1): the real CLI, the
real runner, a local cache directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.run_local import add_workflow, cli

pytestmark = pytest.mark.slow

WORKFLOW = """
import os, stat
from pathlib import Path
from conveyor import workflow, push, StepFailed

deps = workflow("deps", on=push())
build = deps.job("build", runs_on="conveyor:os:linux")

@build.step
def restore(ctx):
    key = "deps-" + ctx.hash_files("lock.txt")
    with ctx.cache(key, ["deps", "~/.tool"], restore_keys=["deps-"]) as hit:
        print(f"HIT kind={hit.kind} key={hit.key} bool={bool(hit)}")
        deps_dir = ctx.workspace / "deps"
        if hit:
            assert (deps_dir / "lock.copy").read_text() == (ctx.workspace / "lock.txt").read_text()
            assert os.readlink(deps_dir / "link") == "lock.copy"
            assert stat.S_IMODE((deps_dir / "run.sh").stat().st_mode) == 0o750
            assert (Path.home() / ".tool" / "x").read_text() == "tool"
            print("RESTORED OK")
        else:
            deps_dir.mkdir(exist_ok=True)
            (deps_dir / "lock.copy").write_text((ctx.workspace / "lock.txt").read_text())
            if not (deps_dir / "link").is_symlink():
                (deps_dir / "link").symlink_to("lock.copy")
            (deps_dir / "run.sh").write_text("#!/bin/sh\\n")
            (deps_dir / "run.sh").chmod(0o750)
            (Path.home() / ".tool").mkdir(exist_ok=True)
            (Path.home() / ".tool" / "x").write_text("tool")
    if os.environ.get("FAIL_AFTER_CACHE") == "1":
        raise StepFailed("failed after the cache block")
"""


def run(repo: Path, cache_dir: Path, *args: str) -> str:
    result = cli(repo, "run", "local", "push", "--workflow", "deps", "--cache-dir", str(cache_dir), *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def hit_line(output: str) -> str:
    return next(line for line in output.splitlines() if "HIT kind=" in line).split("HIT ", 1)[1]


def test_a_second_run_hits_exactly_and_a_key_change_hits_partially_then_saves(
    repo: Path,
    tmp_path: Path,
) -> None:
    add_workflow(repo, WORKFLOW)
    (repo / "lock.txt").write_text("v1\n")
    cache_dir = tmp_path / "caches"
    home_tool = repo.parent / ".tool"

    first = run(repo, cache_dir)
    assert hit_line(first) == "kind=miss key=None bool=False"
    assert "saved (" in first
    entries = json.loads((cache_dir / "index.json").read_text())["entries"]
    assert [(e["scope"], e["key"][:5]) for e in entries] == [("refs/heads/main", "deps-")]
    v1_key = entries[0]["key"]

    shutil.rmtree(home_tool)
    second = run(repo, cache_dir)
    assert hit_line(second) == f"kind=exact key={v1_key} bool=True"
    assert "RESTORED OK" in second
    assert "saved (" not in second
    assert len(json.loads((cache_dir / "index.json").read_text())["entries"]) == 1

    (repo / "lock.txt").write_text("v2\n")
    third = run(repo, cache_dir)
    assert hit_line(third) == f"kind=partial key={v1_key} bool=False"
    assert "saved (" in third
    keys = [e["key"] for e in json.loads((cache_dir / "index.json").read_text())["entries"]]
    assert len(keys) == 2 and keys[0] == v1_key

    fourth = run(repo, cache_dir)
    assert hit_line(fourth) == f"kind=exact key={keys[1]} bool=True"
    assert "RESTORED OK" in fourth
    # Nothing partial was ever left in the directory.
    assert not list(cache_dir.glob("*.partial"))


def test_a_failed_step_saves_nothing(repo: Path, tmp_path: Path) -> None:
    add_workflow(repo, WORKFLOW)
    (repo / "lock.txt").write_text("v1\n")
    cache_dir = tmp_path / "caches"
    result = cli(
        repo,
        "run",
        "local",
        "push",
        "--workflow",
        "deps",
        "--cache-dir",
        str(cache_dir),
        "--env",
        "FAIL_AFTER_CACHE=1",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed after the cache block" in result.stdout
    index = cache_dir / "index.json"
    assert not index.exists() or json.loads(index.read_text())["entries"] == []


def test_a_feature_branch_reads_the_default_branch_but_not_a_sibling(
    repo: Path,
    tmp_path: Path,
) -> None:
    add_workflow(repo, WORKFLOW)
    (repo / "lock.txt").write_text("v1\n")
    cache_dir = tmp_path / "caches"
    assert hit_line(run(repo, cache_dir, "--branch", "sibling")) == "kind=miss key=None bool=False"
    assert hit_line(run(repo, cache_dir, "--branch", "feat")).startswith("kind=miss")
    run(repo, cache_dir, "--branch", "main")
    (repo / "lock.txt").write_text("v2\n")
    # The sibling's and feat's own v1 entries exist, but another feature branch sees only main's.
    third = hit_line(run(repo, cache_dir, "--branch", "other"))
    assert third.startswith("kind=partial key=deps-")
    scopes = {(e["scope"], e["key"]) for e in json.loads((cache_dir / "index.json").read_text())["entries"]}
    assert ("refs/heads/sibling", third.split("key=")[1].split()[0]) in scopes
    assert ("refs/heads/main", third.split("key=")[1].split()[0]) in scopes


def test_paths_outside_the_workspace_and_home_are_refused(repo: Path, tmp_path: Path) -> None:
    add_workflow(
        repo,
        """
        from conveyor import workflow, push
        w = workflow("deps", on=push())
        build = w.job("build", runs_on="conveyor:os:linux")

        @build.step
        def outside(ctx):
            with ctx.cache("k", ["/etc"]):
                pass
        """,
    )
    result = cli(repo, "run", "local", "push", "--workflow", "deps", "--cache-dir", str(tmp_path / "c"))
    assert result.returncode == 1
    assert "outside the workspace and the home directory" in result.stdout
    assert not (tmp_path / "c").exists()
