"""Locks are byte-identical across checkouts, hash seeds and working directories; every example compiles.

To refresh the expected lock after an intended change to the examples or the lock format:
`CONVEYOR_TEST_UPDATE_EXPECTED_LOCK=1 pytest tests/integration/cli -k expected`.
"""

import json
import os
from pathlib import Path

import pytest

from .conftest import EXAMPLES, install_examples, make_repo, run_conveyor

EXPECTED_LOCK = Path(__file__).parent / "expected" / "examples.lock.json"


def _compiled_examples(repo: Path, hash_seed: str) -> bytes:
    install_examples(repo)
    result = run_conveyor(repo, "compile", hash_seed=hash_seed)
    assert result.returncode == 0, result.stderr
    return (repo / ".conveyor" / "conveyor.lock.json").read_bytes()


def test_two_checkouts_under_different_hash_seeds_give_the_expected_lock(tmp_path):
    first = _compiled_examples(make_repo(tmp_path / "one" / "checkout"), hash_seed="1")
    second = _compiled_examples(make_repo(tmp_path / "elsewhere" / "deeper" / "copy"), hash_seed="4242")
    assert first == second
    assert str(tmp_path).encode() not in first
    if os.environ.get("CONVEYOR_TEST_UPDATE_EXPECTED_LOCK"):
        EXPECTED_LOCK.write_bytes(first)
    assert first == EXPECTED_LOCK.read_bytes()


def test_compile_from_a_subdirectory_with_dir_gives_the_same_lock(tmp_path):
    repo = make_repo(tmp_path / "repo")
    expected = _compiled_examples(repo, hash_seed="7")
    (repo / "sub").mkdir()
    assert run_conveyor(repo / "sub", "compile", "--check").returncode == 0
    assert run_conveyor(tmp_path, "compile", "--check", "--dir", str(repo)).returncode == 0
    assert (repo / ".conveyor" / "conveyor.lock.json").read_bytes() == expected


@pytest.mark.parametrize("example", sorted(path.name for path in EXAMPLES.glob("*.py")))
def test_each_example_compiles_on_its_own(tmp_path, example):
    repo = make_repo(tmp_path / "repo")
    workflows = repo / ".conveyor" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / example).write_text((EXAMPLES / example).read_text())
    result = run_conveyor(repo, "compile", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], result.stdout
    assert report["workflows"] and not report["warnings"]


def test_examples_preview_as_documented(tmp_path):
    repo = make_repo(tmp_path / "repo")
    _compiled_examples(repo, hash_seed="0")
    trace = json.loads(run_conveyor(repo, "preview", "tag", "--tag", "v2.0.0", "--json").stdout)
    assert [w["workflow"] for w in trace["workflows"] if w["matched"]] == ["deploy"]
    (plan,) = trace["plans"]
    assert [job["job"] for job in plan["jobs"]] == ["ship", "notify", "__hooks__"]
    assert plan["jobs"][0]["environment"] == "production"
    pr_trace = json.loads(
        run_conveyor(repo, "preview", "pr", "--branch", "feat", "--files", "src/pkg/a.py", "--json").stdout
    )
    (ci_plan,) = pr_trace["plans"]
    assert len([job for job in ci_plan["jobs"] if job["job"] == "test"]) == 5
