"""The compiler imports workflow files in isolation and writes a deterministic lock, or coded errors."""

import json
import textwrap

from conveyor.lockfile import compile_repository, lock_drift, parse_lock

SIMPLE = textwrap.dedent(
    """\
    from conveyor import workflow, push

    ci = workflow("ci", on=push(branches=["main"]))
    alias = ci

    @ci.job(runs_on="linux")
    def build(ctx):
        ctx.sh("make")
    """
)


def test_compiles_sources_relative_to_the_repo(repo, write_workflow):
    write_workflow("ci", SIMPLE)
    result = compile_repository(repo)
    assert result.ok, result.errors
    (entry,) = result.lock.workflows
    assert entry.source.file == ".conveyor/workflows/ci.py"
    assert entry.source.qualname == "ci"
    assert entry.source.line == 3
    assert entry.jobs[0].steps[0].source.qualname == "build"
    assert entry.hashed_files == [".conveyor/workflows/ci.py"]
    assert str(repo) not in result.lock_bytes.decode()


def test_lock_bytes_are_formatted_as_specified(repo, write_workflow):
    write_workflow("ci", SIMPLE)
    data = compile_repository(repo).lock_bytes
    assert data.endswith(b"}\n")
    assert b"\r" not in data
    assert data.startswith(b'{\n  "schema_version": 2,\n  "workflows": [')
    assert parse_lock(data) == compile_repository(repo).lock


def test_compiling_twice_gives_identical_bytes(repo, write_workflow):
    write_workflow("ci", SIMPLE)
    assert compile_repository(repo).lock_bytes == compile_repository(repo).lock_bytes


def test_files_starting_with_underscore_are_skipped(repo, write_workflow):
    write_workflow("_shared", "raise RuntimeError('never imported')\n")
    write_workflow("ci", SIMPLE)
    assert compile_repository(repo).ok


def test_workflows_do_not_see_each_others_module_state(repo, write_workflow):
    (repo / ".conveyor" / "counter.py").write_text("COUNT = []\n")
    body = textwrap.dedent(
        """\
        import counter
        from conveyor import workflow, push
        counter.COUNT.append(1)
        assert len(counter.COUNT) == 1, "module state leaked between workflow files"
        wf = workflow("{name}", on=push())
        wf.job("j", runs_on="linux", run=lambda ctx: None)
        """
    )
    write_workflow("a", body.format(name="a"))
    write_workflow("b", body.format(name="b"))
    result = compile_repository(repo)
    assert result.ok, result.errors
    assert [w.hashed_files for w in result.lock.workflows] == [
        [".conveyor/counter.py", ".conveyor/workflows/a.py"],
        [".conveyor/counter.py", ".conveyor/workflows/b.py"],
    ]


def test_editing_an_imported_helper_changes_the_content_hash(repo, write_workflow):
    helper = repo / ".conveyor" / "release"
    helper.mkdir()
    (helper / "__init__.py").write_text("VERSION = '1'\n")
    write_workflow("ci", "import release\n" + SIMPLE)
    before = compile_repository(repo).lock
    (helper / "__init__.py").write_text("VERSION = '2'\n")
    after = compile_repository(repo).lock
    assert before.workflows[0].content_hash != after.workflows[0].content_hash
    assert lock_drift(json.dumps(before.model_dump(mode="json", by_alias=True)).encode(), after).changed == (
        "ci",
    )


def test_crlf_checkouts_hash_like_lf(repo, write_workflow):
    write_workflow("ci", SIMPLE)
    lf = compile_repository(repo).lock.workflows[0].content_hash
    (repo / ".conveyor" / "workflows" / "ci.py").write_bytes(SIMPLE.replace("\n", "\r\n").encode())
    assert compile_repository(repo).lock.workflows[0].content_hash == lf


def _codes(result):
    return [(d.code, d.file, d.line) for d in result.errors]


def test_needs_cycle_is_e107_with_its_path(repo, write_workflow):
    write_workflow(
        "ci",
        textwrap.dedent(
            """\
            from conveyor import workflow, push
            wf = workflow("w", on=push())
            wf.job("a", runs_on="linux", needs=["b"], run=lambda ctx: None)
            wf.job("b", runs_on="linux", needs=["a"], run=lambda ctx: None)
            """
        ),
    )
    result = compile_repository(repo)
    assert _codes(result) == [("E107", ".conveyor/workflows/ci.py", 3)]
    assert "a → b → a" in result.errors[0].message
    assert result.lock_bytes is None


def test_unknown_and_self_needs_are_e106(repo, write_workflow):
    write_workflow(
        "ci",
        textwrap.dedent(
            """\
            from conveyor import workflow, push
            wf = workflow("w", on=push())
            wf.job("a", runs_on="linux", needs=["ghost"], run=lambda ctx: None)
            wf.job("b", runs_on="linux", needs=["b"], run=lambda ctx: None)
            """
        ),
    )
    assert [code for code, _, _ in _codes(compile_repository(repo))] == ["E106", "E106"]


def test_an_unknown_need_suggests_the_nearest_job(repo, write_workflow):
    write_workflow(
        "ci",
        textwrap.dedent(
            """\
            from conveyor import workflow, push
            wf = workflow("w", on=push())
            wf.job("build", runs_on="linux", run=lambda ctx: None)
            wf.job("test", runs_on="linux", needs=["buidl"], run=lambda ctx: None)
            """
        ),
    )
    (error,) = compile_repository(repo).errors
    assert error.code == "E106"
    assert error.message == "job 'test' needs unknown job 'buidl'; did you mean 'build'?"


def test_job_without_steps_is_e108(repo, write_workflow):
    write_workflow(
        "ci", "from conveyor import workflow, push\nwf = workflow('w', on=push())\nwf.job('a', runs_on='x')\n"
    )
    assert _codes(compile_repository(repo)) == [("E108", ".conveyor/workflows/ci.py", 3)]


def test_definition_time_errors_are_located_in_the_workflow_file(repo, write_workflow):
    write_workflow(
        "ci",
        "from conveyor import workflow, push\nwf = workflow('w', on=push())\n"
        "wf.job('a', runs_on='x', matrix={'x': list(range(300))}, run=lambda ctx: None)\n",
    )
    assert _codes(compile_repository(repo)) == [("E109", ".conveyor/workflows/ci.py", 3)]


def test_duplicate_workflow_names_across_files_are_e102(repo, write_workflow):
    write_workflow("a", SIMPLE)
    write_workflow("b", SIMPLE)
    assert [code for code, _, _ in _codes(compile_repository(repo))] == ["E102"]


def test_import_failure_is_e100_at_the_last_user_frame(repo, write_workflow):
    write_workflow("ci", "from conveyor import workflow\n\n\nraise ValueError('boom')\n")
    (error,) = compile_repository(repo).errors
    assert (error.code, error.file, error.line) == ("E100", ".conveyor/workflows/ci.py", 4)
    assert "ValueError: boom" in error.message


def test_syntax_error_is_e100(repo, write_workflow):
    write_workflow("ci", "def broken(:\n")
    (error,) = compile_repository(repo).errors
    assert (error.code, error.line) == ("E100", 1)


def test_workflow_hooks_need_hooks_runs_on_e117(repo, write_workflow):
    write_workflow(
        "ci",
        textwrap.dedent(
            """\
            from conveyor import workflow, push
            wf = workflow("w", on=push())
            wf.job("a", runs_on="linux", run=lambda ctx: None)

            @wf.on_failure
            def notify(ctx):
                pass
            """
        ),
    )
    assert [code for code, _, _ in _codes(compile_repository(repo))] == ["E117"]


def test_workflow_hooks_compile_into_a_hooks_job_needing_every_job_always(repo, write_workflow):
    write_workflow(
        "ci",
        textwrap.dedent(
            """\
            from conveyor import workflow, push
            wf = workflow("w", on=push(), hooks_runs_on="linux")
            wf.job("a", runs_on="linux", run=lambda ctx: None)
            wf.job("b", runs_on="linux", run=lambda ctx: None)

            @wf.cleanup(timeout="1m")
            def tidy(ctx):
                pass
            """
        ),
    )
    entry = compile_repository(repo).lock.workflows[0]
    hooks_job = entry.jobs[-1]
    assert hooks_job.name == "__hooks__"
    assert [n.job for n in hooks_job.needs] == ["a", "b"]
    assert all(len(n.run_on) == 5 for n in hooks_job.needs)
    assert entry.hooks["cleanup"].timeout_ms == 60_000
    assert entry.hooks["cleanup"].source.qualname == "tidy"


def test_no_workflow_files_warns_w202_and_no_triggers_warns_w201(repo, write_workflow):
    assert [w.code for w in compile_repository(repo).warnings] == ["W202"]
    write_workflow(
        "ci",
        "from conveyor import workflow\nwf = workflow('w', on=[])\nwf.job('a', runs_on='x', run=print)\n",
    )
    result = compile_repository(repo)
    assert result.ok
    assert [w.code for w in result.warnings] == ["W201"]


def test_push_with_branches_and_tags_gives_two_entries(repo, write_workflow):
    write_workflow(
        "ci",
        "from conveyor import workflow, push\nwf = workflow('w', on=[push(branches=['main'], tags=['v*']),"
        " push(tags=['r*'])])\nwf.job('a', runs_on='x', run=print)\n",
    )
    entry = compile_repository(repo).lock.workflows[0]
    assert [t.type for t in entry.triggers] == ["push", "tag", "tag"]


def test_hash_files_are_added_to_the_content_hash(repo, write_workflow):
    (repo / "scripts").mkdir()
    (repo / "scripts" / "deploy.sh").write_text("echo v1\n")
    write_workflow(
        "ci",
        "from conveyor import workflow, push\nwf = workflow('w', on=push(), hash_files=['scripts/*.sh'])\n"
        "wf.job('a', runs_on='x', run=print)\n",
    )
    first = compile_repository(repo).lock.workflows[0]
    assert first.hashed_files == [".conveyor/workflows/ci.py", "scripts/deploy.sh"]
    (repo / "scripts" / "deploy.sh").write_text("echo v2\n")
    assert compile_repository(repo).lock.workflows[0].content_hash != first.content_hash


def test_compiling_leaves_no_bytecode_or_modules_behind(repo, write_workflow):
    import sys

    write_workflow("ci", SIMPLE)
    compile_repository(repo)
    assert not list(repo.rglob("__pycache__"))
    assert not [name for name in sys.modules if name.startswith("conveyor_workflows")]
