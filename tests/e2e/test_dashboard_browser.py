"""The dashboard in a real browser: Debian's chromium driven by Playwright against a real server process.

A push runs on an agent the local scaler spawns; the signed-in page shows the step's log lines while it
runs and `success` when it ends, without a reload, and a `<script>` log line stays text. A run whose job
uploaded an artifact and a JUnit report shows the failing test, and the page's link downloads the artifact
(docs/design/artifacts.md §8 scenario 6).
Screenshots land in `test-artifacts/dashboard/` (or `$CONVEYOR_TEST_ARTIFACTS/dashboard/`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.support.agents import agent_process
from tests.support.browser import (
    _artifacts,
    _sign_in,
)
from tests.support.dispatch_stage import stage
from tests.support.scaler_e2e import kill_leftover_agents, scaler_env, scalers_yaml

pytestmark = pytest.mark.slow


def _workflow(gate: Path) -> str:
    # The step waits for the test to open the gate, so the page is watched while the step runs. The
    # markers are computed by the shell, so the echoed command line does not contain them.
    script = (
        "echo '<script>alert(1)</script>'; echo started $((40+2)); "
        f"while [ ! -e {gate} ]; do sleep 0.05; done; echo finished $((50+5))"
    )
    return f"""
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    ctx.sh(["sh", "-c", {script!r}])
"""


def test_a_push_shows_live_logs_and_success_without_a_reload(browser: Browser, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    (tmp_path / "scalers.yaml").write_text(scalers_yaml())
    dialogs: list[str] = []
    with stage(tmp_path, "", {"ci": _workflow(gate)}, env=scaler_env(tmp_path)) as s:
        try:
            run_id = s.push()
            context = browser.new_context()
            page = context.new_page()
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            _sign_in(page, s, "/ui/runs")
            row = page.locator(f"tr[data-run-id='{run_id}']")
            expect(row).to_be_visible()
            page.screenshot(path=str(_artifacts() / "runs.png"), full_page=True)

            row.locator("a").first.click()
            expect(page).to_have_url(f"{s.server.url}/ui/runs/{run_id}")
            page.evaluate("window.__sameDocument = true")
            log = page.locator("div.log").filter(has_text="started 42")
            expect(log).to_have_count(1, timeout=60_000)
            expect(page.locator(f"[data-status-of='run:{run_id}']").first).to_have_text("running")
            assert "finished 55" not in log.inner_text()
            # The <script> line is text in the log, not an element, and it never ran.
            expect(log).to_contain_text("<script>alert(1)</script>")
            assert page.locator("div.log script").count() == 0
            page.screenshot(path=str(_artifacts() / "run-running.png"), full_page=True)

            gate.touch()
            expect(log).to_contain_text("finished 55", timeout=60_000)
            expect(page.locator(f"[data-status-of='run:{run_id}']").first).to_have_text(
                "success", timeout=60_000
            )
            assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
            page.screenshot(path=str(_artifacts() / "run-detail.png"), full_page=True)
            assert dialogs == []
            # The session survives a reload, and the token never appears in the page or the URL.
            page.reload()
            assert s.token not in page.content() and s.token not in page.url
            expect(page.locator(f"[data-status-of='run:{run_id}']").first).to_have_text("success")
            context.close()
        finally:
            s.server.stop()
            kill_leftover_agents(tmp_path)


OUTPUTS = '''
import os
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    (ctx.workspace / "dist.bin").write_bytes(os.urandom(1_500_000))
    ctx.upload_artifact("dist", "dist.bin")
    (ctx.workspace / "junit.xml").write_text(JUNIT)
    ctx.upload_test_report("junit.xml")

JUNIT = """<?xml version="1.0"?>
<testsuite name="unit" tests="2">
  <testcase classname="tests.test_math" name="test_adds"/>
  <testcase classname="tests.test_math" name="test_divides"><failure message="ZeroDivisionError: boom"/></testcase>
</testsuite>"""
'''


def test_the_run_page_downloads_an_artifact_and_shows_a_failing_test(
    browser: Browser, tmp_path: Path
) -> None:
    with stage(tmp_path, "", {"ci": OUTPUTS}) as s:
        with agent_process(s, tmp_path / "agent-home"):
            run_id = s.push()
            s.wait_run(run_id, "success", timeout=120)
        [dist] = [a for a in s.api("GET", f"/runs/{run_id}/artifacts").json()["items"] if a["name"] == "dist"]
        context = browser.new_context(accept_downloads=True)
        page = context.new_page()
        _sign_in(page, s, f"/ui/runs/{run_id}")
        report = page.locator("section.report[data-report='test-report']")
        expect(report).to_contain_text("1 passed")
        expect(report).to_contain_text("1 failed")
        expect(report.locator("ul.failures li")).to_have_count(1)
        expect(report.locator("code.test-name")).to_have_text("tests.test_math.test_divides")
        expect(report.locator("ul.failures li")).to_contain_text("ZeroDivisionError: boom")
        row = page.locator("tr[data-artifact='dist']")
        expect(row).to_contain_text("1.4 MiB")
        expect(row).to_contain_text("build")
        page.screenshot(path=str(_artifacts() / "run-outputs.png"), full_page=True)

        with page.expect_download() as started:
            row.locator("a").click()
        download = started.value
        assert download.failure() is None
        assert download.suggested_filename == "dist.bin"
        saved = tmp_path / "downloaded.bin"
        download.save_as(saved)
        assert hashlib.sha256(saved.read_bytes()).hexdigest() == dist["sha256"]
        assert saved.stat().st_size == 1_500_000
        context.close()


PROTECTED = """
from conveyor import push, workflow

ship = workflow("ship", on=[push(branches=["main"])])

@ship.job(runs_on=["linux"], environment="production")
def deploy(ctx):
    ctx.sh(["echo", "deployed"])
"""


def test_the_run_page_approves_a_waiting_job_and_it_runs(browser: Browser, tmp_path: Path) -> None:
    """docs/design/approvals.md §3: the Approve button on the run page releases a held job."""
    with stage(tmp_path, "", {"ship": PROTECTED}) as s:
        assert s.api("PUT", "/environments/production", json={}).status_code == 201
        protected = s.api("PUT", "/environments/production/protection", json={"approvers": ["owner"]})
        assert protected.status_code == 200, protected.text
        with agent_process(s, tmp_path / "agent-home"):
            run_id = s.push()
            context = browser.new_context()
            page = context.new_page()
            _sign_in(page, s, f"/ui/runs/{run_id}")
            form = page.locator("form.approval")
            expect(form).to_have_count(1, timeout=30_000)
            expect(
                page.locator("p.reason").filter(has_text="waiting: approval for environment production")
            ).to_have_count(1)
            page.screenshot(path=str(_artifacts() / "run-waiting-approval.png"), full_page=True)
            form.locator("input[name=comment]").fill("change 42")
            form.locator("button[value=approve]").click()
            expect(page).to_have_url(f"{s.server.url}/ui/runs/{run_id}?notice=approved")
            expect(page.locator(f"[data-status-of='run:{run_id}']").first).to_have_text(
                "success", timeout=120_000
            )
            expect(page.locator("form.approval")).to_have_count(0)
            page.screenshot(path=str(_artifacts() / "run-approved.png"), full_page=True)
            context.close()
        [job] = s.run(run_id)["jobs"]
        assert (job["status"], job["approval"]["decision"], job["approval"]["comment"]) == (
            "success",
            "approved",
            "change 42",
        )
