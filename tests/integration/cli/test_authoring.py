"""The authoring loop through the real `conveyor` command: init, compile, preview, fixture."""

import json
import textwrap
from pathlib import Path


def lock_path(repo: Path) -> Path:
    """Where the lock file lives in a repository."""
    return repo / ".conveyor" / "conveyor.lock.json"


PATHS_WORKFLOW = textwrap.dedent(
    """\
    from conveyor import workflow, pr, push

    src = workflow("src-only", on=[pr(target="main", paths=["src/**"]), push(branches=["release/*"])])

    @src.job(runs_on="linux")
    def test(ctx):
        ctx.sh("pytest")
    """
)


def test_init_then_compile_is_byte_identical_and_check_passes(repo, conveyor):
    assert conveyor("init").returncode == 0
    first = lock_path(repo).read_bytes()
    assert (repo / ".conveyor" / ".gitignore").read_text().splitlines()[1] == ".secrets"
    assert conveyor("compile").returncode == 0
    assert lock_path(repo).read_bytes() == first
    assert conveyor("compile", "--check").returncode == 0


def test_init_example_targets_this_hosts_os_label(repo, conveyor):
    conveyor("init")
    lock = json.loads(lock_path(repo).read_text())
    labels = lock["workflows"][0]["jobs"][0]["runs_on"]["labels"]
    assert labels[0]["pattern"].startswith("conveyor:os:")


def test_init_refuses_to_overwrite_without_force(repo, conveyor):
    conveyor("init")
    refused = conveyor("init")
    assert refused.returncode == 1
    assert "--force" in refused.stderr
    assert conveyor("init", "--force").returncode == 0


def test_editing_a_step_body_makes_check_fail_naming_the_workflow(repo, conveyor):
    conveyor("init")
    workflow_file = repo / ".conveyor" / "workflows" / "ci.py"
    before = lock_path(repo).read_bytes()
    workflow_file.write_text(workflow_file.read_text().replace('"--oneline"', '"--oneline", "--no-decorate"'))
    stale = conveyor("compile", "--check")
    assert stale.returncode == 1
    assert "ci" in stale.stderr and "out of date" in stale.stderr
    assert lock_path(repo).read_bytes() == before
    assert conveyor("compile").returncode == 0
    assert conveyor("compile", "--check").returncode == 0


def test_editing_an_imported_conveyor_module_makes_check_fail(repo, conveyor):
    helpers = repo / ".conveyor" / "helpers"
    helpers.mkdir(parents=True)
    (helpers / "__init__.py").write_text("LABEL = 'linux'\n")
    (repo / ".conveyor" / "workflows").mkdir()
    (repo / ".conveyor" / "workflows" / "build.py").write_text(
        "from helpers import LABEL\nfrom conveyor import workflow, push\n"
        "build = workflow('build', on=push())\nbuild.job('make', runs_on=LABEL, run=lambda ctx: None)\n"
    )
    assert conveyor("compile").returncode == 0
    (helpers / "__init__.py").write_text("LABEL = 'linux'  # edited\n")
    stale = conveyor("compile", "--check")
    assert stale.returncode == 1
    assert "build" in stale.stderr


def test_preview_push_names_the_matched_example(repo, conveyor):
    conveyor("init")
    shown = conveyor("preview", "push", "--branch", "main")
    assert shown.returncode == 0
    assert "MATCHED  ci" in shown.stdout


def test_preview_json_says_why_nothing_matched(repo, conveyor):
    conveyor("init")
    shown = conveyor("preview", "push", "--branch", "nomatch-xyz", "--json")
    assert shown.returncode == 0
    trace = json.loads(shown.stdout)
    assert trace["lock"]["status"] == "ok"
    assert all(not w["matched"] for w in trace["workflows"])
    ci = next(w for w in trace["workflows"] if w["workflow"] == "ci")
    assert ci["triggers"][0]["checks"] == [
        {"filter": "branches", "ok": False, "detail": "'nomatch-xyz' matches none of glob 'main'"}
    ]


def test_preview_pr_paths_filter_and_unknown_files(repo, conveyor):
    (repo / ".conveyor" / "workflows").mkdir(parents=True)
    (repo / ".conveyor" / "workflows" / "src.py").write_text(PATHS_WORKFLOW)
    args = ("preview", "pr", "--branch", "feature/x", "--base", "main", "--json")
    docs = json.loads(conveyor(*args, "--files", "docs/a.md").stdout)
    (src,) = docs["workflows"]
    assert not src["matched"]
    assert [(c["filter"], c["ok"]) for c in src["triggers"][0]["checks"]] == [
        ("events", True),
        ("target", True),
        ("paths", False),
    ]
    unknown = json.loads(conveyor(*args, "--no-files").stdout)
    assert unknown["workflows"][0]["matched"]
    paths_check = unknown["workflows"][0]["triggers"][0]["checks"][-1]
    assert paths_check == {"filter": "paths", "ok": True, "detail": "changed files unknown"}


def test_preview_tag_matches_tag_workflow_and_not_push_branches(repo, conveyor):
    conveyor("init")
    trace = json.loads(conveyor("preview", "tag", "--tag", "v1.2.0", "--json").stdout)
    matched = {w["workflow"]: w["matched"] for w in trace["workflows"]}
    assert matched == {"ci": False, "release": True}


def test_cycle_fails_compile_with_one_line_and_no_traceback(repo, conveyor):
    (repo / ".conveyor" / "workflows").mkdir(parents=True)
    (repo / ".conveyor" / "workflows" / "loop.py").write_text(
        "from conveyor import workflow, push\nwf = workflow('loop', on=push())\n"
        "wf.job('a', runs_on='x', needs=['b'], run=print)\nwf.job('b', runs_on='x', needs=['a'], run=print)\n"
    )
    failed = conveyor("compile")
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines() == [
        ".conveyor/workflows/loop.py:3: E107 needs cycle: a → b → a"
    ]
    assert "Traceback" not in failed.stderr
    assert not lock_path(repo).exists()


def test_matrix_of_300_fails_compile_naming_file_and_problem(repo, conveyor):
    (repo / ".conveyor" / "workflows").mkdir(parents=True)
    (repo / ".conveyor" / "workflows" / "big.py").write_text(
        "from conveyor import workflow, push\nwf = workflow('big', on=push())\n"
        "wf.job('t', runs_on='x', matrix={'a': list(range(30)), 'b': list(range(10))}, run=print)\n"
    )
    failed = conveyor("compile")
    assert failed.returncode == 1
    (line,) = failed.stderr.strip().splitlines()
    assert line.startswith(".conveyor/workflows/big.py:3: E109") and "300 combinations" in line


def test_too_new_lock_schema_is_rejected_with_upgrade_advice(repo, conveyor):
    conveyor("init")
    lock = json.loads(lock_path(repo).read_text())
    lock["schema_version"] = 99
    lock_path(repo).write_text(json.dumps(lock))
    refused = conveyor("preview", "push", "--lock")
    assert refused.returncode == 1
    assert "lock_schema_too_new" in refused.stderr and "upgrade" in refused.stderr


def test_bad_event_exits_2_listing_valid_forms(repo, conveyor):
    conveyor("init")
    assert conveyor("preview", "pr:bogus").returncode == 2
    bad = conveyor("preview", "nonsense")
    assert bad.returncode == 2
    assert "generic_webhook:SOURCE[:EVENT]" in bad.stderr


def test_fixture_round_trips_through_preview(repo, conveyor):
    conveyor("init")
    saved = conveyor(
        "fixture",
        "pr:synchronize",
        "--branch",
        "feature/y",
        "--files",
        "src/a.py",
        "--output",
        ".conveyor/fixtures/pr-sync.json",
    )
    assert saved.returncode == 0
    event = json.loads((repo / ".conveyor" / "fixtures" / "pr-sync.json").read_text())
    assert event["type"] == "pr" and event["payload"]["pull_request"]["head"]["ref"] == "feature/y"
    assert conveyor("fixture", "pr", "--output", ".conveyor/fixtures/pr-sync.json").returncode == 1
    trace = json.loads(conveyor("preview", "@pr-sync", "--json").stdout)
    assert trace["event"]["action"] == "synchronize"
    assert trace["workflows"][0]["matched"]


def test_compile_json_report(repo, conveyor):
    conveyor("init")
    report = json.loads(conveyor("compile", "--json").stdout)
    assert report["ok"] is True and report["errors"] == []
    assert [w["name"] for w in report["workflows"]] == ["ci", "release"]


def test_schedule_preview_fires_the_named_workflow(repo, conveyor):
    (repo / ".conveyor" / "workflows").mkdir(parents=True)
    (repo / ".conveyor" / "workflows" / "n.py").write_text(
        "from conveyor import workflow, schedule\nwf = workflow('nightly', on=schedule('0 2 * * *'))\n"
        "wf.job('a', runs_on='x', run=print)\n"
    )
    assert conveyor("preview", "schedule").returncode == 2
    trace = json.loads(conveyor("preview", "schedule", "--workflow", "nightly", "--json").stdout)
    assert trace["workflows"][0]["matched"]
