"""CI for a Python package: lint, a test matrix, then a build that needs every test combination.

Copy to `.conveyor/workflows/ci.py` and run `conveyor compile`.
"""

import re

from conveyor import Retry, pr, push, workflow

ci = workflow(
    "package-ci",
    on=[
        push(
            branches=["main", re.compile(r"release/\d+\.\d+")], paths=["src/**", "tests/**", "pyproject.toml"]
        ),
        pr(target="main", paths=["src/**", "tests/**", "pyproject.toml", "!**/*.md"]),
    ],
    concurrency="package-ci-{event.branch}",
    timeout="45m",
)


@ci.skip("documentation-only change")
def docs_only(ctx):
    return ctx.changed_files is not None and all(path.endswith(".md") for path in ctx.changed_files)


@ci.job(runs_on="conveyor:os:linux", timeout="5m")
def lint(ctx):
    ctx.sh(["ruff", "check", "."])
    ctx.sh(["ruff", "format", "--check", "."])


test = ci.job(
    "test",
    runs_on=["conveyor:os:*", "python"],
    needs=[lint],
    matrix={"py": ["3.11", "3.12", "3.13"], "os": ["linux", "macos"]},
    exclude=[{"py": "3.11", "os": "macos"}],
    fail_fast=True,
    max_parallel=4,
    timeout="20m",
)


@test.step(retry=Retry(max_attempts=3, delay="5s"))
def install(ctx):
    ctx.sh(["uv", "venv", "--python", ctx.matrix["py"]])
    ctx.sh(["uv", "pip", "install", "-e", ".[test]"])


@test.step(timeout="15m")
def unit(ctx):
    ctx.sh([".venv/bin/pytest", "-q", "--junitxml", f"junit-{ctx.matrix['py']}-{ctx.matrix['os']}.xml"])


build = ci.job("build", runs_on="conveyor:os:linux", needs=[test])


@build.step(outputs={"wheel": str})
def wheel(ctx):
    ctx.sh(["uv", "build", "--wheel"])
    return {"wheel": ctx.sh("ls dist/*.whl").stdout.strip()}
